"""The local engine's work folder for runs whose output is on an object store: a durable copy of
every finished task under the output prefix, and a local scratch copy that never outlives the run.

Why two places. The work folder holds the engine's spills (Parquet parts, Arrow IPC shard
shuffles, polars scans over them, memory-mapped reads). Reading those back from an object store
many times would turn every spilled byte into several GETs and need the store's credentials in
polars/pyarrow, so the engine works on a **local scratch** copy. But what a rerun needs -- the
finished tasks -- must live where a rerun on *any* host finds it (a retried batch job lands on a
new machine; the first host's disk is gone). So each finished task is also written, once, to
the **durable work folder** `<output>/_work/<run id>/`:

* `save_task` uploads the task's files (its spilled part or shard shuffle files, its quarantine /
  drop-log rows), then its `done.json` marker **last**: an object store has no rename, so the
  marker is the commit; a task without one does not exist for a rerun (a run killed mid-upload
  leaves objects nobody reads).
* `restore_task` is a rerun's look-up before it runs a task: a marker whose partition
  fingerprint matches, whose files are all there with the sizes it lists, is downloaded into the
  scratch folder and reused with its counters (so accounting is the same as in a clean run).
* The run id (`io/identity.run_id`: config hash + input files with sizes and mtimes + the
  output URL) names the folder, so a changed input file or config never finds another run's tasks.
* The run that commits removes `<output>/_work/` (`io/publish.remove_work`): nothing temporary is
  left in a finished dataset. Readers and `datakit inspect` go through the manifest and never
  look at `_work/`. An abandoned one (a killed run nobody reruns) can be deleted at any time:
  `aws s3 rm --recursive s3://bucket/out/_work/`.

The local scratch is `<cache>/work/<run id>` (`<cache>` = `$DATAKIT_CACHE_DIR`, else
`~/.cache/datakit`), never the system temp directory: a SIGKILL cannot clean up after itself, and
a folder there would leak. The engine removes it at the end of every run, finished or failed
(the durable copy holds everything worth keeping); after a SIGKILL the next run on this host
removes it once its owner process is gone -- or reuses it directly when it is the same run.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from typing import Any, Callable

from datakit.io import cache
from datakit.io.fs import filesystem

log = logging.getLogger("datakit.io.tempwork")

_OWNER = ".owner.json"
WORK = "_work"


def base() -> str:
    """The folder that holds the local scratch folders of object-store runs on this machine."""
    return os.path.join(cache.root(), "work")  # (the same cache folder as decontamination's reference index)


def claim(run_id: str) -> str:
    """The scratch folder of run `run_id` (created, or a killed attempt's on this host found again)."""
    sweep(keep=run_id[:16])
    path = os.path.join(base(), run_id[:16])
    os.makedirs(path, exist_ok=True, mode=0o700)  # raw text before scrubbing: this user's only
    with open(os.path.join(path, _OWNER), "w") as f:
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id}, f)
    return path


def discard(path: str | None) -> None:
    """Remove a scratch folder made by `claim` (a no-op for anything else)."""
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


def sweep(keep: str | None = None) -> int:
    """Remove scratch folders of this host's dead runs (never `keep`); how many.

    Nothing in them is needed any more: their finished tasks are in the durable work folder under
    their output prefix, so they go as soon as their owner process is gone."""
    removed = 0
    host = socket.gethostname()
    root = base()
    try:
        names = os.listdir(root)
    except OSError:
        return 0
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
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
        log.info("removed the scratch folder of a killed run: %s", path)
    return removed


# -- the durable work folder under the output prefix

def durable_root(output: str, run_id: str) -> str | None:
    """`<output>/_work/<run id>` for an object-store output; None where nothing outlives the process
    (`memory://`) or the output is a local folder (its `_work/` is the work folder itself)."""
    if "://" not in output or output.startswith(("file://", "memory://")):
        return None
    return f"{output.rstrip('/')}/{WORK}/{run_id[:16]}"


def _rel(path: str, root: str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def _rebase(result: dict[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
    """`result` with every file path in it mapped through `fn` (relative <-> this host's scratch)."""
    out = dict(result)
    out["files"] = [fn(f) for f in result.get("files", [])]
    out["digests"] = {fn(f): d for f, d in (result.get("digests") or {}).items()}
    out["shard_files"] = {k: fn(f) for k, f in (result.get("shard_files") or {}).items()}
    out["aux_files"] = [fn(f) for f in result.get("aux_files", [])]
    return out


def save_task(durable: str, scratch: str, done_path: str, result: dict[str, Any],
              beat: Callable[[], None] = lambda: None) -> None:
    """Copy a finished task (its files, then its `done.json` marker, last) to the durable folder.

    Paths in the marker are relative to the scratch folder, so a rerun on another host (another
    scratch path) maps them onto its own. `beat` is called between files (the local engine's
    heartbeat: an upload is progress, not a stall)."""
    fs, root = filesystem(durable)
    files = list(dict.fromkeys([*result.get("files", []), *result.get("aux_files", [])]))
    sizes = {}
    for f in files:
        rel = _rel(f, scratch)
        fs.put_file(f, f"{root}/{rel}")
        sizes[rel] = os.path.getsize(f)
        beat()
    marker = {**_rebase(result, lambda f: _rel(f, scratch)), "sizes": sizes}
    fs.pipe_file(f"{root}/{_rel(done_path, scratch)}", json.dumps(marker).encode())


def restore_task(durable: str, scratch: str, done_path: str, fingerprint: str,
                 beat: Callable[[], None] = lambda: None) -> dict[str, Any] | None:
    """A finished task of an earlier attempt of this run (any host), downloaded into `scratch`; None
    when there is none, it was for another partition, or any of its files is missing or resized."""
    fs, root = filesystem(durable)
    try:
        marker = json.loads(fs.cat_file(f"{root}/{_rel(done_path, scratch)}"))
    except FileNotFoundError:
        return None
    except ValueError:  # (a marker is written in one PUT; unreadable means not ours)
        return None
    if marker.get("fingerprint") != fingerprint:
        return None
    sizes: dict[str, int] = marker.get("sizes") or {}
    try:
        for rel, size in sizes.items():
            local = os.path.join(scratch, rel)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            fs.get_file(f"{root}/{rel}", local)
            if os.path.getsize(local) != size:
                log.warning("work folder %s: %s has %d bytes, its marker says %d; running the task again",
                            durable, rel, os.path.getsize(local), size)
                return None
            beat()
    except FileNotFoundError:
        return None
    result = _rebase(marker, lambda f: os.path.join(scratch, f))
    result.pop("sizes", None)
    return result
