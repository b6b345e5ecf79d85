"""The process pool shared by everything that fans work out on this machine.

Why a module of its own: the local engine and post-run jobs such as the
decontamination index build both need worker processes, and spawning them
(and importing pyarrow, polars and numba kernels in each) costs seconds, which
a notebook re-running a pipeline should pay once. Keeping the pool here lets a
stage use it without importing an engine (see docs/architecture.md).

`spawn`, not `fork`: polars and numba hold threads that a fork would copy
mid-lock. Workers see the environment of their birth (credentials!), so a pool
is replaced when the environment changes. Each worker installs the parent's
log handler (datakit/logs.py), so lines logged inside tasks are redacted too.
"""
from __future__ import annotations

import atexit
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

_POOLS: dict[int, tuple[ProcessPoolExecutor, int]] = {}
# Variables a library sets in os.environ for itself when it is imported, not a user's change:
# polars writes its allocator settings on import, and polars is imported at a run's first barrier,
# so counting it would replace the pool (and re-import everything in new workers) mid-run.
_LIBRARY_ENV = frozenset({"_RJEM_MALLOC_CONF"})


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, as a container or `taskset` sets it), not the host's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def pool(workers: int) -> ProcessPoolExecutor:
    """A spawn pool of `workers` processes, kept alive across calls (and runs) in this process.

    One pool at a time: asking for another size shuts the other down, so idle
    workers (each holding imported models) do not pile up.
    """
    from datakit.logs import init_worker, worker_config

    logcfg = worker_config()
    env = hash((frozenset((k, v) for k, v in os.environ.items() if k not in _LIBRARY_ENV), logcfg))
    for other in [w for w in _POOLS if w != workers]:
        drop_pool(other)
    existing, born = _POOLS.get(workers, (None, None))
    if existing is None or born != env or getattr(existing, "_broken", False):
        drop_pool(workers)
        existing = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                                       initializer=init_worker, initargs=logcfg)
        _POOLS[workers] = (existing, env)
    return existing


def drop_pool(workers: int, wait: bool = False) -> None:
    """Shut a pool down (after a failure its workers may be mid-task): the next `pool()` starts fresh.

    `wait=True` lets tasks already running finish (queued ones are cancelled), so
    nothing writes into a work folder after the caller has moved on.
    """
    existing, _ = _POOLS.pop(workers, (None, None))
    if existing is not None:
        existing.shutdown(wait=wait, cancel_futures=True)


@atexit.register
def _shutdown_pools() -> None:
    for w in list(_POOLS):
        drop_pool(w)


__all__ = ["pool", "drop_pool", "usable_cpus"]
