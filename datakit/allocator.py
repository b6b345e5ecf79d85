"""The C allocator datakit's pool workers run with: mimalloc on Linux, the system's when asked.

Why: the tokenizer (Rust `tokenizers`) builds a few small heap objects per token, and
under glibc's malloc about a third of its CPU went to the allocator itself (perf, 32 MB of
<= 2,000-character documents: `_int_malloc`, `_int_free`, `malloc_consolidate`,
`unlink_chunk`, realloc copies). A bare `encode_batch_fast` process on the same input took
20-25% fewer CPU seconds with mimalloc interposed, and so did a whole tokenize `datakit run`.

How: a process's malloc can only be replaced when it starts (`LD_PRELOAD`), so the pool
(datakit/workers.py) starts its workers with `worker_env()` in their environment (each worker
then drops the variables, so processes a task starts keep their own allocator, though with
transparent huge pages still off: that prctl flag is inherited across fork and exec); the process that
owns the pool (a notebook, a script) keeps its own allocator and its environment is left as it
was; the `datakit` command restarts a local `run` once with the same variables, since a small run
does all its work in that process (`datakit/launch.py`). `choice()` is checked when an engine is
built (`engines.get_engine`). The library is the `cmeel-mimalloc` wheel's (a dependency on
Linux). The allocator never changes output (tested byte for byte); the run report names the
workers' allocator (`timing.workers.allocators`) and the command's (`timing.allocator`).

Opting out: `DATAKIT_ALLOCATOR=system`. A user's own `LD_PRELOAD` is kept whole (they chose
their allocator, or a profiler), and then nothing is added.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import Any

ENV_VAR = "DATAKIT_ALLOCATOR"
CHOICES = ("mimalloc", "system")
_DISTRIBUTION = "cmeel-mimalloc"


class AllocatorError(ValueError):
    """DATAKIT_ALLOCATOR names an allocator we do not have."""


def choice() -> str:
    """The allocator asked for: DATAKIT_ALLOCATOR, else mimalloc."""
    value = os.environ.get(ENV_VAR, "mimalloc").strip().lower() or "mimalloc"
    if value not in CHOICES:
        raise AllocatorError(f"{ENV_VAR}={os.environ.get(ENV_VAR)!r}: expected one of {', '.join(CHOICES)}")
    return value


@functools.lru_cache(maxsize=1)
def mimalloc_library() -> str | None:
    """Path of the installed libmimalloc.so.N (the soname with only the major version), or None.

    None off Linux (LD_PRELOAD is a glibc/ld.so mechanism) and when the wheel is not installed."""
    if not sys.platform.startswith("linux"):
        return None
    found = _installed_mimalloc()
    return found[0] if found else None


@functools.lru_cache(maxsize=1)
def _installed_mimalloc() -> tuple[str, str] | None:
    """(libmimalloc.so.N's path, the wheel's version), or None when the wheel is not installed.

    Why the wheel's `RECORD` is read here rather than through `importlib.metadata`: the `datakit`
    command asks before it restarts (`launch.py`), in a process that imports nothing else, and
    importing `importlib.metadata` (email, zipfile, csv) plus its search cost ~40 ms of CPU there,
    again in the restarted command and in every pool worker (`in_use`). A wheel always installs a
    `<name>-<version>.dist-info` folder on sys.path; anything else (an egg, a zip) takes the
    library's path (`_installed_by_metadata`). Tests hold the two to the same answer."""
    prefix = _DISTRIBUTION.replace("-", "_") + "-"
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, a folder that is gone
            continue
        for name in names:
            if not (name.startswith(prefix) and name.endswith(".dist-info")):
                continue
            try:
                with open(os.path.join(entry or ".", name, "RECORD"), encoding="utf-8") as f:
                    files = [line.split(",", 1)[0] for line in f if "/libmimalloc.so." in line]
            except OSError:
                continue
            path = _first_library(files, lambda f, base=entry or ".": os.path.join(base, f))
            if path:
                return path, name[len(prefix):-len(".dist-info")]
    return _installed_by_metadata()


def _installed_by_metadata() -> tuple[str, str] | None:
    from importlib import metadata

    try:
        dist = metadata.distribution(_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    path = _first_library([str(f) for f in dist.files or () if "/libmimalloc.so." in str(f)],
                          lambda f: str(dist.locate_file(f)))
    return (path, dist.version) if path else None


def _first_library(files: list[str], locate: Any) -> str | None:
    """The shortest soname of `files` that exists (libmimalloc.so.3 before libmimalloc.so.3.4)."""
    for name in sorted(files, key=len):
        path = os.path.normpath(locate(name))
        if os.path.isfile(path):
            return path
    return None


# mimalloc options a worker starts with, unless the user set them. MIMALLOC_ALLOW_THP=0: mimalloc then
# turns transparent huge pages off for the process (prctl PR_SET_THP_DISABLE). Why: with them, every
# 2 MB of fresh or purged arena memory a worker touches is zeroed whole in one page fault, and the
# workers' allocation churn (tokenizer objects, Arrow buffers freed and re-faulted between tasks) made
# that kernel time 12% of a tokenize run's CPU (perf: clear_page_erms under do_huge_pmd_anonymous_page
# from mi_page_free_list_extend). Measured with THP off: system CPU 1.44 -> 0.73 s and the run
# 7.64 -> 7.08 CPU-s (32 MB of short documents, 4 alternated runs); see docs/deploy.md for the
# quickstart's numbers.
_MIMALLOC_OPTIONS = {"MIMALLOC_ALLOW_THP": "0"}


def worker_env() -> dict[str, str]:
    """Environment variables a pool worker is started with for its allocator (empty: start it as the
    parent is). The local pool's workers take every key here out of their environment once started
    (a local Spark master's Python workers, given them as `spark.executorEnv.*`, keep them)."""
    if os.environ.get("LD_PRELOAD") or choice() == "system":
        return {}
    lib = mimalloc_library()
    if not lib:
        return {}
    return {"LD_PRELOAD": lib, **{k: v for k, v in _MIMALLOC_OPTIONS.items() if k not in os.environ}}


def runs_like_workers() -> bool:
    """Whether this process runs with the allocator a pool worker would be started with: the
    `datakit` command restarted with it, a user's own LD_PRELOAD (workers keep it too), or
    DATAKIT_ALLOCATOR=system. Work moved from the pool into this process then costs what it did there."""
    added = worker_env()
    if not added:
        return True
    return added["LD_PRELOAD"] in _preloaded()


def forget_added(mark: str) -> bool:
    """In a process started with `worker_env()`'s variables and `mark` naming them (comma-separated):
    note the allocator in use (`in_use`, while LD_PRELOAD still names what was loaded), then take
    those variables and the mark out of the environment, so processes it starts keep their own
    allocator. False when `mark` is not set: nothing was added (a user's LD_PRELOAD carries no mark).
    Used by pool workers (`workers.py`) and by the restarted `datakit` command (`launch.py`)."""
    added = os.environ.pop(mark, None)
    if added is None:
        return False
    in_use()
    for key in filter(None, added.split(",")):
        os.environ.pop(key, None)
    return True


@functools.lru_cache(maxsize=1)
def _preloaded() -> tuple[str, ...]:
    """The LD_PRELOAD libraries this process really loaded (mapped), by path."""
    wanted = [p for p in os.environ.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    if not wanted:
        return ()
    try:
        with open("/proc/self/maps") as f:
            mapped = {line.split(None, 5)[5].strip() for line in f if line.count(" ") >= 5 and "/" in line}
    except OSError:
        return ()
    real = {os.path.realpath(p) for p in mapped}
    names = {os.path.basename(p) for p in mapped}
    # a path names one file; a bare name (`libjemalloc.so.2`) is found by ld.so on its search path
    return tuple(p for p in wanted if (os.path.realpath(p) in real if "/" in p else p in names))


@functools.lru_cache(maxsize=1)
def in_use() -> str:
    """This process's allocator as the run report names it: `mimalloc 3.4.3`, a preloaded
    library's file name, or `system`."""
    preloaded = _preloaded()
    if not preloaded:
        return "system"
    names = []
    for p in preloaded:
        if p == mimalloc_library():
            names.append(f"mimalloc {_installed_mimalloc()[1]}")  # type: ignore[index]
        else:
            names.append(os.path.basename(p))
    return "+".join(names)


@functools.lru_cache(maxsize=1)
def _mi_collect() -> Any:
    lib = mimalloc_library()
    if lib is None or lib not in _preloaded():
        return None
    fn = ctypes.CDLL(lib).mi_collect  # the copy already loaded: dlopen returns its handle
    fn.argtypes = [ctypes.c_bool]
    fn.restype = None
    return fn


def release_free(force: bool = True) -> None:
    """Hand mimalloc's free pages back to the OS now (what `malloc_trim` does for glibc's heap);
    nothing when mimalloc is not this process's allocator. `force=False`: only the pages free for
    longer than mimalloc's purge delay (MIMALLOC_PURGE_DELAY, 1 s by default) go back; the rest stay
    ready for the next allocations, which then take no page faults."""
    collect = _mi_collect()
    if collect is not None:
        collect(force)


__all__ = ["AllocatorError", "ENV_VAR", "choice", "in_use", "mimalloc_library", "release_free", "runs_like_workers",
           "worker_env"]
