"""Temporary work folders (runs whose output is on an object store) that never outlive their run.

Why: the local engine spills to a local folder; when the output is remote there
is no `<output>/_work` to put it in, so it goes to the system temp directory.
A run that fails removes it itself; a run that was *killed* cannot, so each
folder records its owner (pid + host) and the next run removes folders whose
owner is gone. Nothing in such a folder is reusable (it is fresh per run), so
removing it loses nothing.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import socket
import tempfile

log = logging.getLogger("datakit.io.tempwork")

PREFIX = "datakit-work-"
_OWNER = ".owner.json"


def make() -> str:
    """A fresh temp work folder owned by this process (stale ones of dead runs are removed first)."""
    sweep()
    root = tempfile.mkdtemp(prefix=PREFIX)
    with open(os.path.join(root, _OWNER), "w") as f:
        json.dump({"pid": os.getpid(), "host": socket.gethostname()}, f)
    return root


def discard(root: str | None) -> None:
    """Remove a temp work folder made by `make` (a no-op for anything else)."""
    if root and os.path.basename(root.rstrip("/")).startswith(PREFIX) and os.path.exists(os.path.join(root, _OWNER)):
        shutil.rmtree(root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def sweep() -> int:
    """Remove temp work folders whose owning process (on this host) no longer exists; return how many."""
    removed = 0
    host = socket.gethostname()
    for root in glob.glob(os.path.join(tempfile.gettempdir(), PREFIX + "*")):
        try:
            with open(os.path.join(root, _OWNER)) as f:
                owner = json.load(f)
        except (OSError, ValueError):
            continue  # not ours to judge (no owner record)
        if owner.get("host") == host and not _alive(int(owner.get("pid", 0))):
            shutil.rmtree(root, ignore_errors=True)
            removed += 1
            log.info("removed the temp work folder of a run that was killed: %s", root)
    return removed
