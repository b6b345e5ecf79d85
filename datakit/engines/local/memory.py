"""Memory hygiene of long-running worker processes."""
from __future__ import annotations

import pyarrow as pa


def release_free_memory() -> None:
    """Give freed heap pages back to the OS after each batch.

    Parsing a batch creates many short-lived large Python strings; glibc keeps the
    freed pages, so without this the peak RSS of a long stream creeps up with the
    input size even though live memory stays flat (measured: 3k vs 30k events,
    330 MB vs 650 MB peak; with the trim the growth is bounded).
    """
    pa.default_memory_pool().release_unused()  # Arrow's allocator (mimalloc) keeps freed pages too
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _load_libc():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()
