"""Memory hygiene of long-running worker processes."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pyarrow as pa

from datakit import allocator

# Input bytes (Arrow size of the batches read) between two trims: see `release_free_memory_every`
TRIM_EVERY_BYTES = 256 << 20
_since_trim = [0]
# > 0 while this process runs a step's tasks one after another (`tasks_in_sequence`)
_in_sequence = [0]


def release_free_memory() -> None:
    """Give freed heap pages back to the OS now.

    Parsing a batch creates many short-lived large Python strings; glibc keeps the
    freed pages, so without this the peak RSS of a long stream creeps up with the
    input size even though live memory stays flat (measured: 3k vs 30k events,
    330 MB vs 650 MB peak; with the trim the growth is bounded).

    Between two tasks of one step run in this process (`tasks_in_sequence`), only the pages
    free for longer than mimalloc's purge delay go back: see `tasks_in_sequence`.
    """
    if _in_sequence[0]:
        allocator.release_free(force=False)
    else:
        _trim()


def release_free_memory_every(nbytes: int) -> None:
    """Count `nbytes` of input processed; trim once TRIM_EVERY_BYTES have gone by since the last trim.

    Why not after every batch: a trim walks the whole heap and hands every free page back, so
    the next batch faults the same pages in again (kernel time); on a tokenize run of 32 MB
    in 8 batches the per-batch trims cost ~0.6 CPU-s, 4% of the run. Trimming every few hundred
    MB still bounds the creep the trim exists for; tasks also trim when they end (chain.py).
    This trim is a full one even between tasks in sequence: it bounds a long step's creep.
    """
    _since_trim[0] += int(nbytes)
    if _since_trim[0] >= TRIM_EVERY_BYTES:
        _trim()


@contextlib.contextmanager
def tasks_in_sequence() -> Iterator[None]:
    """Around a step's tasks run one after another in this process: the trim at each task's end
    (chain.py) keeps the freed pages for the next task, and one full trim follows the last.

    Why: the next task of the same step allocates what the last one freed; a full trim between them
    handed ~130 MB back only for the next task to fault it in again (32 MB of short documents
    tokenized in the command's own process, 4 tasks, 3 alternated runs each way: minor faults
    198-206k -> 117-144k, system CPU 0.61-0.65 -> 0.31-0.43 s; peak RSS 305-309 -> 313-337 MB, as the
    pages are kept). A pool worker still trims fully after each
    task: it may then wait, holding those pages, while this process runs a barrier.
    """
    _in_sequence[0] += 1
    try:
        yield
    finally:
        _in_sequence[0] -= 1
        if not _in_sequence[0]:
            release_free_memory()


def _trim() -> None:
    """Hand every free page of each allocator back to the OS."""
    _since_trim[0] = 0
    pa.default_memory_pool().release_unused()  # Arrow's allocator (mimalloc) keeps freed pages too
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    allocator.release_free()  # a pool worker's malloc is mimalloc (datakit/allocator.py): its free pages too


def _load_libc():
    """The C library this process already runs with (the program's own symbols), if it has `malloc_trim`.

    Why not `ctypes.util.find_library("c")`: it runs `ldconfig -p` in a child process (measured
    7 ms of CPU, and a fork of a process that has imported pyarrow), once in every process that
    imports this module: the driver and each pool worker."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim  # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()
