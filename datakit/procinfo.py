"""Facts about other processes that tell one process from another that reused its pid."""
from __future__ import annotations


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat field 22); None when unknown
    (no such process, or no /proc). A pid is reused once its process is gone; the pair (pid, start) is not,
    so only a known, different start proves the process one recorded is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
