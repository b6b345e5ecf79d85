"""The local engine's work folder for runs whose output is on an object store: named by the run
identity, kept across a crash, found again by the rerun, removed when the run is done.

Why not under the output prefix itself: the work folder holds the engine's spills (Parquet
parts, Arrow IPC shard shuffles, polars scans over them, memory-mapped reads). On an object
store every spilled byte would become a PUT and a GET -- several times the input -- and
polars/pyarrow would need the store's credentials in every worker. So the spills stay on
local disk, but not in a fresh temp folder (which a rerun could never find, and which a
SIGKILL leaked into the system temp directory): in `<cache>/work/<run id>` where `<cache>`
is `$DATAKIT_CACHE_DIR`, else `~/.cache/datakit`. The run id
(`io/identity.run_id`: config hash + input files with sizes and mtimes + the output URL) is
the same for a rerun of the same command, so a rerun after a kill reuses every finished
task; any other run gets another folder. What survives on other hosts is the committed
shards, whose sidecars live under the output prefix (`_shards/`), as on a local output.

Lifetime: a finished run removes its folder. A failed or killed run leaves it for its rerun;
a folder whose owner is gone and that nobody touched for `STALE_SECONDS` (a day) is removed
by the next run on this host. Nothing of it is ever inside the dataset.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time

log = logging.getLogger("datakit.io.tempwork")

_OWNER = ".owner.json"
STALE_SECONDS = 24 * 3600.0  # a killed run's folder waits this long for its rerun


def base() -> str:
    """The folder that holds the work folders of object-store runs on this machine."""
    root = os.environ.get("DATAKIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "datakit")
    return os.path.join(root, "work")  # (the same cache folder as decontamination's reference index)


def claim(run_id: str) -> str:
    """The work folder of run `run_id` (created, or an earlier attempt's found again), owned by this process."""
    sweep(keep=run_id[:16])
    path = os.path.join(base(), run_id[:16])
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, _OWNER), "w") as f:
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id}, f)
    return path


def discard(path: str | None) -> None:
    """Remove a work folder made by `claim` (a no-op for anything else)."""
    if path and os.path.exists(os.path.join(path, _OWNER)) and os.path.dirname(path.rstrip("/")) == base():
        shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _last_touched(path: str) -> float:
    """Newest mtime in the folder (a resumed run's new parts count as a touch)."""
    newest = os.path.getmtime(path)
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                newest = max(newest, os.path.getmtime(os.path.join(dirpath, f)))
            except OSError:
                continue
    return newest


def sweep(keep: str | None = None, stale_seconds: float = STALE_SECONDS) -> int:
    """Remove work folders of this host's dead runs untouched for `stale_seconds` (never `keep`); how many."""
    removed = 0
    host = socket.gethostname()
    root = base()
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    now = time.time()
    for name in names:
        path = os.path.join(root, name)
        if name == keep:
            continue
        try:
            with open(os.path.join(path, _OWNER)) as f:
                owner = json.load(f)
        except (OSError, ValueError):
            continue  # not ours to judge (no owner record)
        if owner.get("host") != host or _alive(int(owner.get("pid", 0))):
            continue
        if now - _last_touched(path) < stale_seconds:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
        log.info("removed the work folder of a run killed over %.0f h ago: %s", stale_seconds / 3600, path)
    return removed
