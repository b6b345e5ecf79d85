"""Kernels compile once per installation: a second process, or a read-only installation run by
another user, loads them from the cache instead of compiling (datakit/jit.py)."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import datakit
from tests.support.fresh import fresh_python

PROBE = '''
from datakit.jit import njit

@njit
def add_one(x):
    return x + 1
'''
# runs in a fresh interpreter: calls the probe kernel, prints how many numba compiles happened
RUN = '''
import json, sys
from numba.core import event
import datakit._jit_probe as probe
with event.install_recorder("numba:compile") as rec:
    assert probe.add_one(41) == 42
starts = [e for _, e in rec.buffer if e.is_start]
from datakit.jit import PACKAGE_ROOT
print(json.dumps({"compiles": len(starts), "root": str(PACKAGE_ROOT),
                  "cache": probe.add_one._cache._cache_path}))
'''


def _run(root: Path, env_extra: dict[str, str], read_only: bool = False, script: str = RUN) -> dict:
    """`script` (RUN) in a fresh interpreter; `read_only`: with the package copy mounted read-only (EROFS even
    for root: a private mount namespace, `unshare -m`, and a read-only bind mount of it)."""
    env = {**os.environ, "PYTHONPATH": str(root), **env_extra}
    env.pop("NUMBA_CACHE_DIR", None)
    for var in ("DATAKIT_JIT_CACHE", "DATAKIT_CACHE_DIR"):
        if var not in env_extra:
            env.pop(var, None)
    cmd = [sys.executable, "-c", script]
    if read_only:
        pkg = shlex.quote(str(root / "datakit"))
        cmd = ["unshare", "-m", "sh", "-c", f"mount --bind {pkg} {pkg} && mount -o remount,bind,ro {pkg} && "
               f"exec {shlex.quote(sys.executable)} -c {shlex.quote(script)}"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=str(root))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _can_mount_read_only() -> bool:
    if shutil.which("unshare") is None:
        return False
    d = tempfile.mkdtemp()
    try:
        r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {d} {d} && mount -o remount,bind,ro {d}"],
                           capture_output=True, timeout=30)
        return r.returncode == 0
    finally:
        os.rmdir(d)


@pytest.fixture()
def package_copy():
    """A copy of the datakit package (sources only) with a one-kernel probe module."""
    tmp = Path(tempfile.mkdtemp(prefix="datakit-jit-"))
    src = Path(datakit.__file__).parent
    shutil.copytree(src, tmp / "datakit", ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    (tmp / "datakit" / "_jit_probe.py").write_text(PROBE)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def test_second_process_loads_the_kernel_instead_of_compiling(package_copy: Path) -> None:
    first = _run(package_copy, {})
    assert first["compiles"] == 1 and first["root"] == str(package_copy / "datakit")
    assert first["cache"] == str(package_copy / "datakit" / "__pycache__")  # in-tree when writable
    assert _run(package_copy, {})["compiles"] == 0


@pytest.mark.skipif(not _can_mount_read_only(), reason="needs `unshare -m` + bind mounts (root) to make a read-only installation")
def test_read_only_installation_seeds_a_user_cache_and_does_not_compile(package_copy: Path) -> None:
    """An image built with a warm-up into the package, then run from a read-only file system."""
    assert _run(package_copy, {})["compiles"] == 1  # the warm-up, at image build
    user_cache = Path(tempfile.mkdtemp(prefix="datakit-jit-user-"))
    try:
        env = {"DATAKIT_JIT_CACHE": str(user_cache)}
        got = _run(package_copy, env, read_only=True)
        assert got["compiles"] == 0, "the read-only installation's prebuilt kernel was compiled again"
        assert got["cache"].startswith(str(user_cache))
        assert any(p.suffix == ".nbi" for p in user_cache.rglob("*"))
        # with no prebuilt kernel, the user cache still works: compile once, then load
        shutil.rmtree(user_cache)
        for p in (package_copy / "datakit" / "__pycache__").glob("_jit_probe*.nb*"):
            p.unlink()
        assert _run(package_copy, env, read_only=True)["compiles"] == 1
        assert _run(package_copy, env, read_only=True)["compiles"] == 0
    finally:
        shutil.rmtree(user_cache, ignore_errors=True)


# the probe kernel and a stage's kernel module, where no cache folder can be written: one warning, no failure
UNCACHED_RUN = '''
import io, json, logging
buf = io.StringIO()
logging.basicConfig(stream=buf, level=logging.WARNING)
import datakit._jit_probe as probe
assert probe.add_one(41) == 42
import datakit.stages.dedup.lsh  # its kernels are declared with cache=True at import
print(json.dumps({"cached": hasattr(probe.add_one._cache, "_cache_path"), "log": buf.getvalue()}))
'''


@pytest.mark.skipif(not _can_mount_read_only(), reason="needs `unshare -m` + bind mounts (root) to make a read-only installation")
def test_read_only_installation_without_a_writable_cache_folder_compiles_uncached(package_copy: Path,
                                                                                   tmp_path: Path) -> None:
    """A read-only image run by a user whose home cannot be written (no DATAKIT_JIT_CACHE).

    Found in a review of the installed wheel: numba's `cache=True` raised "cannot cache function
    '_fmix': no locator available" at the import of the decontaminate stage, so every `datakit run`
    ended "run failed unexpectedly (RuntimeError); this is a bug", exit 3."""
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    # datakit's user cache and numba's own user-wide cache both live under XDG_CACHE_HOME: a path below a
    # regular file cannot be created, even by root
    env = {"XDG_CACHE_HOME": str(not_a_folder / "cache"), "HOME": str(not_a_folder / "home")}
    got = _run(package_copy, env, read_only=True, script=UNCACHED_RUN)
    assert got["cached"] is False
    assert got["log"].count("numba kernels cannot be cached") == 1, got["log"]
    assert "DATAKIT_JIT_CACHE" in got["log"]


@pytest.mark.skipif(not _can_mount_read_only(), reason="needs `unshare -m` + bind mounts (root) to make a read-only installation")
def test_read_only_installation_caches_kernels_where_datakit_cache_dir_says(package_copy: Path, tmp_path: Path) -> None:
    """`DATAKIT_CACHE_DIR` moves every per-user cache of datakit (io/cache.py), the kernels' too.

    Found in a review of the installed wheel: with a read-only home and `DATAKIT_CACHE_DIR` set, the
    reference index went there but the kernels looked for `~/.cache/datakit/jit` only (and the run
    failed on numba's "no locator available"; now it would compile them in every process)."""
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    moved = tmp_path / "datakit-cache"
    env = {"XDG_CACHE_HOME": str(not_a_folder / "cache"), "HOME": str(not_a_folder / "home"),
           "DATAKIT_CACHE_DIR": str(moved)}
    first = _run(package_copy, env, read_only=True)
    assert first["compiles"] == 1 and first["cache"].startswith(str(moved / "jit"))
    assert _run(package_copy, env, read_only=True)["compiles"] == 0


_BLAS_PROBE = """
import json, sys
import numpy as np
from datakit.stages.dedup.lsh import band_hashes
band_hashes(np.zeros((2, 128), np.uint32), 16, 8)  # loads a datakit kernel: numba's CPU target is set up
before = "scipy.linalg" in sys.modules
import numba
from numba.np import arraymath

@numba.njit
def dot(a, b):
    return np.dot(a, b)

got = float(dot(np.arange(3.0), np.arange(3.0)))  # np.dot compiles with BLAS: scipy.linalg imports now
import scipy.linalg
print(json.dumps({"before": before, "have_blas": arraymath._HAVE_BLAS, "dot": got,
                  "det": float(scipy.linalg.det(np.eye(2)))}))
"""


@pytest.mark.parametrize("opt_out", [False, True])
def test_loading_a_kernel_skips_numbas_blas_probe_and_blas_still_works(opt_out: bool) -> None:
    """A worker loading datakit kernels does not import scipy.linalg for numba's BLAS probe; np.dot in
    a user's own numba code and scipy.linalg itself still work afterwards; DATAKIT_NUMBA_BLAS=1 keeps it."""
    env = {k: v for k, v in os.environ.items() if k != "DATAKIT_NUMBA_BLAS"}
    if opt_out:
        env["DATAKIT_NUMBA_BLAS"] = "1"
    got = json.loads(fresh_python(_BLAS_PROBE, env).splitlines()[-1])
    assert got["dot"] == 5.0 and got["det"] == 1.0
    assert got["before"] is opt_out and got["have_blas"] is opt_out


DEP = '''
from datakit.jit import njit

@njit
def step(x):
    return x + STEP
'''
CALLER = '''
from datakit.jit import njit
from datakit._jit_dep import step

@njit
def add_step(x):
    return step(x)
'''
RUN_CALLER = '''
import json
from numba.core import event
import datakit._jit_caller as caller
with event.install_recorder("numba:compile") as rec:
    got = int(caller.add_step(40))
print(json.dumps({"got": got, "compiles": len([e for _, e in rec.buffer if e.is_start])}))
'''


def test_a_kernel_is_compiled_again_when_a_kernel_it_calls_changes(package_copy: Path) -> None:
    """numba stamps a cache entry with its own source file only, while a kernel compiles in the kernels it
    calls from other modules: found when the lexer changed, the n-gram kernels kept the old lexer from
    their cache. Entries are stamped with every kernel module's content too (`kernel_sources_digest`)."""
    pkg = package_copy / "datakit"
    (pkg / "_jit_caller.py").write_text(CALLER)
    env = {**os.environ, "PYTHONPATH": str(package_copy)}
    env.pop("NUMBA_CACHE_DIR", None)

    def run(step: int) -> dict:
        (pkg / "_jit_dep.py").write_text(DEP.replace("STEP", str(step)))
        out = subprocess.run([sys.executable, "-c", RUN_CALLER], env=env, capture_output=True, text=True,
                             timeout=300, cwd=str(package_copy))
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert run(2) == {"got": 42, "compiles": 2}
    assert run(2) == {"got": 42, "compiles": 0}  # cached
    assert run(3)["got"] == 43  # the callee changed: the caller is compiled again, not loaded stale
