"""The process pool shared by everything that fans work out on this machine.

Why a module of its own: the local engine and post-run jobs such as the
decontamination index build both need worker processes, and spawning them
(and importing pyarrow, polars and numba kernels in each) costs seconds, which
a notebook re-running a pipeline should pay once. Keeping the pool here lets a
stage use it without importing an engine (see docs/architecture.md).

`spawn`, not `fork`: polars and numba hold threads that a fork would copy
mid-lock. Workers see the environment of their birth (credentials!), so a pool
is replaced when the environment changes.
"""
from __future__ import annotations

import atexit
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

_POOLS: dict[int, tuple[ProcessPoolExecutor, int]] = {}


def pool(workers: int) -> ProcessPoolExecutor:
    """A spawn pool of `workers` processes, kept alive across calls (and runs) in this process."""
    env = hash(frozenset(os.environ.items()))
    existing, born = _POOLS.get(workers, (None, None))
    if existing is None or born != env or getattr(existing, "_broken", False):
        drop_pool(workers)
        existing = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))
        _POOLS[workers] = (existing, env)
    return existing


def drop_pool(workers: int) -> None:
    """Shut a pool down (after a failure its workers may be mid-task): the next `pool()` starts fresh."""
    existing, _ = _POOLS.pop(workers, (None, None))
    if existing is not None:
        existing.shutdown(wait=False, cancel_futures=True)


@atexit.register
def _shutdown_pools() -> None:
    for w in list(_POOLS):
        drop_pool(w)


__all__ = ["pool", "drop_pool"]
