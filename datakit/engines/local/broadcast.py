"""The per-process cache of broadcast-join right sides (read once per worker, not once per task)."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

_BROADCAST_CACHE: dict[tuple[str, int, int], pa.Table] = {}


def broadcast_table(path: str) -> pa.Table:
    """Each worker process reads a broadcast side once per run.

    Keyed by the file's path, size and mtime, not the path alone: a rerun of the
    same pipeline writes the same path (the work folder is named by the config
    hash) with new contents, and a kept worker process (or an in-process run)
    must not join against the previous run's table.
    """
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _BROADCAST_CACHE:
        _BROADCAST_CACHE.clear()
        _BROADCAST_CACHE[key] = pq.read_table(path)
    return _BROADCAST_CACHE[key]


def clear_broadcast_cache() -> None:
    """Forget this process's table (a run starts; pool workers check the file's size and mtime themselves)."""
    _BROADCAST_CACHE.clear()
