"""numba kernels compile once per installation, not once per process tree.

Why this module: numba caches a compiled kernel in `__pycache__` beside its source when that
folder is writable, and otherwise in `~/.cache/numba` under a hash of the source's absolute
path. So a wheel in a read-only site-packages (a container image run as a user), a packed venv
unpacked at a new path on every Spark executor, or a fresh CI clone paid 16-21 s of kernel
compilation in every new process tree before reading any data.

What changes:
- `datakit warmup` (`warm_up()`) compiles every kernel once - at image build, before
  `venv-pack`, in `make venv` - into the package's own `__pycache__` folders, which travel
  with the installed files;
- when the package folder is read-only, a kernel's cache files are copied from there into a
  writable per-user folder (`$DATAKIT_JIT_CACHE`, else `jit/` in `$DATAKIT_CACHE_DIR`, else
  `~/.cache/datakit/jit/<datakit>-<numba>`),
  keyed by the module's path inside the package, not by where the package happens to be
  unpacked, and loaded from there; a missing entry is compiled and saved there;
- when neither can be written (a read-only image run as a user whose home is read-only or
  absent, `$DATAKIT_JIT_CACHE` unset), kernels compile in each process without a cache, with one
  warning, instead of numba's "cannot cache function ...: no locator available" failing the run.

Nothing here can change output: numba keys every entry on the source file's content hash, the
numba and Python versions and the CPU, and recompiles whatever does not match; datakit's entries
are also keyed on the content of every kernel module (`kernel_sources_digest`), since a kernel
compiles in the kernels of other modules that it calls.
Every kernel module imports `njit` from here (not from numba), so the locator is registered
before its first kernel is declared.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import numba
from numba.core.caching import CacheImpl, InTreeCacheLocator

log = logging.getLogger("datakit.jit")

PACKAGE_ROOT = Path(__file__).resolve().parent


def user_cache_root() -> Path:
    """Where kernels of a read-only installation are cached (one folder per datakit + numba version):
    `$DATAKIT_JIT_CACHE`, else `jit/` in datakit's per-user cache folder when `$DATAKIT_CACHE_DIR` moves
    it (io/cache.py: "a user who moves it (a read-only home, ...) moves all of them with one variable";
    found in a review of the installed wheel: the kernels stayed behind in the read-only home), else
    `$XDG_CACHE_HOME/datakit/jit` or `~/.cache/datakit/jit`."""
    from datakit import __version__

    if os.environ.get("DATAKIT_JIT_CACHE"):
        base = Path(os.environ["DATAKIT_JIT_CACHE"])
    elif os.environ.get("DATAKIT_CACHE_DIR"):
        base = Path(os.environ["DATAKIT_CACHE_DIR"]) / "jit"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "datakit" / "jit"
    return base / f"{__version__}-numba{numba.__version__}"


def _inside_package(py_file: str) -> Path | None:
    try:
        return Path(py_file).resolve().relative_to(PACKAGE_ROOT)
    except ValueError:
        return None


@functools.lru_cache(maxsize=1)
def kernel_sources_digest() -> str:
    """sha256 of every datakit module that declares kernels (imports `datakit.jit`), by path and content.

    Why: numba stamps a cache entry with its own source file only, while a kernel compiles in the
    kernels it calls from other modules (`ngrams.py`'s window kernels inline `normalize.py`'s lexer).
    Found when the lexer changed: the n-gram kernels kept loading the old lexer from their cache, so
    `ngram_hashes` disagreed with `lex` until the cache was deleted; a git checkout that changes one
    kernel module would silently give such stale hashes. Each entry is stamped with this digest too,
    so a change to any kernel module recompiles them all (~4 ms to compute, once per process)."""
    h = hashlib.sha256()
    for f in sorted(PACKAGE_ROOT.rglob("*.py")):
        body = f.read_bytes()
        if b"datakit.jit import" in body:
            h.update(f.relative_to(PACKAGE_ROOT).as_posix().encode() + b"\0" + body + b"\0")
    return h.hexdigest()


class _KernelDependencies:
    """Stamps a cache entry with its source file and every kernel module it may call (`kernel_sources_digest`)."""

    def get_source_stamp(self) -> Any:
        return (super().get_source_stamp(), kernel_sources_digest())  # type: ignore[misc]


class _SeededUserLocator(_KernelDependencies, InTreeCacheLocator):
    """A writable per-user cache folder for one module, first filled from the read-only in-tree one."""

    def __init__(self, py_func: Any, py_file: str, rel: Path) -> None:
        super().__init__(py_func, py_file)
        self._seed_from = self._cache_path  # the package's own __pycache__ (read-only here)
        self._cache_path = str(user_cache_root() / rel.parent)

    def seed(self) -> None:
        """Copy the module's prebuilt cache files (index .nbi, data .nbc) that the user folder lacks."""
        src = Path(self._seed_from)
        if not src.is_dir():
            return
        stem = Path(self._py_file).stem + "."
        for f in src.iterdir():
            dst = Path(self._cache_path) / f.name
            if f.name.startswith(stem) and f.suffix in (".nbi", ".nbc") and not dst.exists():
                tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
                shutil.copyfile(f, tmp)
                os.replace(tmp, dst)  # another process may seed the same file: last whole copy wins


class DatakitCacheLocator(_KernelDependencies, InTreeCacheLocator):
    """numba cache locator for datakit's own kernels (see the module docstring)."""

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> InTreeCacheLocator | None:
        rel = _inside_package(py_file)
        if rel is None:
            return None  # not ours: numba's own locators decide
        in_tree = cls(py_func, py_file)
        try:
            in_tree.ensure_cache_path()
            if os.access(in_tree.get_cache_path(), os.W_OK):
                return in_tree
        except OSError:
            pass
        user = _SeededUserLocator(py_func, py_file, rel)
        try:
            user.ensure_cache_path()
            user.seed()
        except OSError:
            return None  # not here: numba's own locators decide; if none can write either, `njit` goes uncached
        return user


if DatakitCacheLocator not in CacheImpl._locator_classes:
    CacheImpl._locator_classes.insert(0, DatakitCacheLocator)


def _load_cpu_target_without_blas_probe() -> None:
    """Import `numba.np.arraymath` with its BLAS probe answering "none", unless scipy.linalg is loaded.

    Why: numba imports `numba.np.arraymath` when a process loads its first kernel, and that module
    probes for BLAS by importing `scipy.linalg` (its `cython_blas`): measured 0.27-0.35 CPU-s and
    15 MB in every process that loads a datakit kernel (pool workers, Spark Python workers, the
    driver), for a BLAS no datakit kernel calls (none uses np.dot, linalg or np.correlate). Done
    here, when `datakit.jit` is imported (the first kernel module's import), not at the first
    kernel load: arraymath itself costs ~0.05 CPU-s and ~5 MB, which a process that imports kernel
    modules but never runs one now pays. Like any import-time `sys.modules` entry, it must not race
    another thread's `import scipy.linalg` (imports run before a process's tasks). The
    probe only decides how numba's `np.correlate`/`np.convolve` of floats compute their inner
    products (BLAS or a loop); `np.dot` and `np.linalg` import scipy themselves when compiled, and
    still work. Not done when scipy.linalg is already imported (the probe is then free) or with
    `DATAKIT_NUMBA_BLAS=1` (a process whose own numba code convolves floats and wants BLAS's sums).
    """
    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules \
            or os.environ.get("DATAKIT_NUMBA_BLAS") == "1":
        return
    sys.modules["scipy.linalg.cython_blas"] = None  # its import raises ImportError: "no BLAS"
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if sys.modules.get("scipy.linalg.cython_blas", 0) is None:
            del sys.modules["scipy.linalg.cython_blas"]


_load_cpu_target_without_blas_probe()


def njit(*args: Any, **kwargs: Any) -> Callable:
    """`numba.njit` with `cache=True` by default (every datakit kernel is cached where it can be).

    A kernel with nowhere writable to cache it compiles without a cache (numba's `cache=True` would
    raise at its declaration, which is the import of its stage). Found in a review of the installed
    wheel: a read-only site-packages with a home folder that cannot be written failed every run
    with "run failed unexpectedly (RuntimeError); this is a bug", exit 3."""
    kwargs.setdefault("cache", True)
    if len(args) == 1 and callable(args[0]):  # `@njit` without parentheses
        return njit(**kwargs)(args[0])
    declare = numba.njit(*args, **kwargs)
    if not kwargs["cache"]:
        return declare

    def declare_or_uncached(func: Callable) -> Any:
        try:
            return declare(func)
        except RuntimeError as e:
            if "no locator available" not in str(e):
                raise
            _say_uncached()
            return numba.njit(*args, **{**kwargs, "cache": False})(func)

    return declare_or_uncached


@functools.lru_cache(maxsize=1)
def _say_uncached() -> None:
    log.warning("numba kernels cannot be cached: neither the package folder (%s) nor %s can be written, so they "
                "compile in every process (seconds each); set DATAKIT_CACHE_DIR or DATAKIT_JIT_CACHE to a writable folder (kernels that "
                "`datakit warmup` compiled into the package are then copied there and loaded)",
                PACKAGE_ROOT, user_cache_root())


@functools.lru_cache(maxsize=1)
def _compile_timer() -> "dict[str, float]":
    """Process-wide listeners summing numba seconds (for run reports and warm-up output).

    `compile`: compiling kernels (numba's `numba:compile` event). `jit`: all time under numba's
    compiler lock, i.e. compiling plus loading cached kernels from disk and typing them, which is
    what a warm process still pays on a kernel's first call (a cache hit fires no compile event).
    """
    from numba.core import event

    total = {"compile": 0.0, "jit": 0.0}

    class _Timer(event.Listener):
        def __init__(self, key: str) -> None:
            self._key = key
            self._depth = 0
            self._t0 = 0.0

        def on_start(self, ev: Any) -> None:
            import time

            if self._depth == 0:
                self._t0 = time.perf_counter()
            self._depth += 1

        def on_end(self, ev: Any) -> None:
            import time

            self._depth -= 1
            if self._depth == 0:
                total[self._key] += time.perf_counter() - self._t0

    event.register("numba:compile", _Timer("compile"))
    event.register("numba:compiler_lock", _Timer("jit"))
    return total


def compile_seconds() -> float:
    """Seconds this process has spent compiling numba kernels since the timer was first asked for."""
    return _compile_timer()["compile"]


def jit_seconds() -> float:
    """Seconds this process has spent compiling or loading (from the cache) numba kernels."""
    return _compile_timer()["jit"]


def start_compile_timer() -> None:
    _compile_timer()


start_compile_timer()  # from the first import on: kernels are declared (and may compile) right after
