"""Safe output folders: one writer at a time, a reader sees the old dataset or the new one, never a mix.

Why here (not in an engine): both engines and the steps after a run (quality report, n-gram
index) write into the same folder, and all of them must obey the same rules:

* **Lock.** `output_lock(path)` makes a run the only writer of a folder. On a local disk it is
  an `flock` on `<out>/.datakit-lock` (the kernel drops it when the process dies, so a killed
  run never leaves a stale lock). On object stores (no locks) it is a *lease* object created
  with a conditional put (`If-None-Match: *`), refreshed by a heartbeat thread and taken over
  only once it has expired. The second run fails at once with one line (`OutputBusyError`).
  Re-entrant within a thread (`Pipeline.run` holds it across the engine run and the index build).
* **Retract before overwrite.** `retract(path)` deletes `_SUCCESS` and `manifest.json` of a
  finished dataset *before* the first shard is rewritten: readers go through the manifest, so
  during a rerun (or after one that was killed) they see "no dataset", never new shards under
  the old manifest. Side outputs with their own commit, the run record (`_run.json`) and the views
  rendered from it (`_report.html`, `_reports/feedback.json`) go with it, so none describes the old data.
* **Preflight.** An output path that is a file, or a folder that cannot be written, is one line
  (`OutputPathError`, an `InputError`: exit 2) before any work; so is a folder that already holds
  files no datakit run wrote (`refuse_foreign_folder`), because a run owns its output folder.
* **Finish clean.** `sweep(path)` removes temp files (`.tmp-*`) that killed runs left behind, and
  the engine removes its `_work/` folder, so a finished dataset holds only what it lists.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

from datakit.errors import DatakitError
from datakit.io.fs import InputError, filesystem, remove_tree
from datakit.procinfo import start_ticks

log = logging.getLogger("datakit.publish")

LOCK_NAME = ".datakit-lock"
LEASE_SECONDS = 120.0  # an object-store lease not refreshed for this long belongs to a dead run
# after taking over an expired lease: how long to wait before checking it is still ours (another run taking over
# the same lease a moment later deletes ours; `_Lock.acquire_remote`)
TAKEOVER_SETTLE_SECONDS = 2.0


class OutputPathError(InputError):
    """The output path cannot hold a dataset (it is a file, or not writable). Exit 2."""


class OutputBusyError(DatakitError, RuntimeError):
    """Another run holds the output folder's lock. Exit 3 (the job could not run now)."""


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def preflight(path: str) -> None:
    """Fail early, in one line, when `path` cannot be an output folder."""
    path = path.rstrip("/")
    if _is_local(path):
        p = _local(path)
        if os.path.exists(p) and not os.path.isdir(p):
            raise OutputPathError(f"output path {path} is a file, not a folder")
        try:
            os.makedirs(p, exist_ok=True)
        except (NotADirectoryError, FileExistsError):
            raise OutputPathError(f"output path {path} is inside a file, not a folder") from None
        except OSError as e:
            raise OutputPathError(f"cannot create output folder {path}: {e.strerror or e}") from None
        if not os.access(p, os.W_OK | os.X_OK):
            raise OutputPathError(f"output folder {path} is not writable")
        return
    fs, p = filesystem(path)
    try:
        if fs.isfile(p):
            raise OutputPathError(f"output path {path} is a file, not a folder")
    except OutputPathError:
        raise
    except OSError as e:
        raise OutputPathError(f"cannot reach output folder {path}: {e}") from None


# what only a datakit output folder holds (besides data/ and README.md, which user folders have too)
OUTPUT_MARKERS = ("_SUCCESS", "manifest.json", "_run.json", "_work", "_shards", "_snapshots",
                  "_units")  # (the last: the n-gram index build's work folder, stages/decontaminate/index.py)
_IGNORED = (LOCK_NAME, ".DS_Store")


def refuse_foreign_folder(path: str) -> None:
    """Refuse an existing, non-empty output folder that shows no sign of a datakit run.

    Why: a run owns its output folder. It replaces `data/` with the shards it lists, writes its
    dataset card as `README.md` and sweeps temp files (`.tmp-*`) anywhere below it, so `--output .`
    from a project's root deleted the project's `data/raw/events.csv` and `notes/.tmp-draft.md` and
    overwrote its README, exit 0 (found in review). A folder with a datakit marker (a manifest, a
    run record, shard sidecars, a work folder of a killed run, snapshots) is an earlier run's and
    may be rewritten; an empty or new folder is fine.
    """
    out = path.rstrip("/")
    fs, p = filesystem(out)
    try:
        if not fs.isdir(p):
            return
        # (the folder's own marker object, `out/` on an object store, lists as an entry: it is no file of anyone's;
        # found in review, an output folder made with a console's "Create folder" was refused as foreign)
        names = sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(p, detail=False)
                        if e.rstrip("/") != p.rstrip("/")} - set(_IGNORED))
    except (FileNotFoundError, NotADirectoryError):
        return
    if not names or any(n in OUTPUT_MARKERS for n in names):
        return
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    where = os.path.normpath(_local(out)) if _is_local(out) else out
    raise OutputPathError(f"output folder {where} already holds files no datakit run wrote ({shown}); a run "
                          "replaces data/ and README.md there and removes temp files below it, so write to "
                          "a new or empty folder")


# ------------------------------------------------------------------------------------------ the lock

def _holder_is_dead(held: dict) -> bool:
    """A lease taken by a process of *this* host that no longer exists (a killed driver being rerun).

    Why: without this, rerunning a job whose driver was killed waits out the whole lease
    (LEASE_SECONDS) on an object store. Only a same-host, provably gone pid counts; a lease
    from another host is trusted until it expires.
    """
    if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int):
        return False
    # the same pid started at another moment is another process: a container restarted in the same pod
    # gets its old pid back (found in an operations review: refused as "being written by another run
    # (pid <its own>)" until the lease ran out), and a pid can be reused by an unrelated process
    started = held.get("started")
    if isinstance(started, int) and start_ticks(held["pid"]) not in (None, started):
        return True
    if held["pid"] == os.getpid():
        return False
    try:
        os.kill(held["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False




_HELD: dict[tuple[str, int], "_Lock"] = {}
_HELD_GUARD = threading.Lock()


class _Lock:
    """One acquired lock on a folder (local flock or object-store lease) with a re-entry count."""

    def __init__(self, path: str) -> None:
        self.path = path.rstrip("/")
        self.count = 0
        self.owner = {"run": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
                      "started": start_ticks(os.getpid()),
                      "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self._fd: int | None = None
        self.lost: str | None = None  # who took the lease over while this run held it (`check_held`)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # -- local disk
    def acquire_local(self) -> None:
        import fcntl

        lock = f"{_local(self.path)}/{LOCK_NAME}"
        while True:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise OutputPathError(f"cannot write in output folder {self.path}: {e.strerror or e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise OutputBusyError(f"output folder {self.path} is being written by another run{holder}; "
                                      "wait for it to finish (two runs must not write one folder)") from None
            # the holder before us may have unlinked the file between our open and our flock
            try:
                same = os.fstat(fd).st_ino == os.stat(lock).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(self.owner).encode())
        self._fd = fd

    def release_local(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(f"{_local(self.path)}/{LOCK_NAME}")  # unlink while locked: see the inode check above
        except OSError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None

    # -- object stores
    def _lease(self) -> bytes:
        return json.dumps({**self.owner, "expires": time.time() + LEASE_SECONDS}).encode()

    def acquire_remote(self) -> None:
        fs, p = filesystem(f"{self.path}/{LOCK_NAME}")
        took_over = False
        for _attempt in range(3):
            try:
                fs.pipe_file(p, self._lease(), mode="create")  # conditional put: only if absent
                break
            except FileNotFoundError as e:  # the bucket does not exist (found in review: a traceback, exit 1)
                raise OutputPathError(f"output {self.path}: cannot create the output there "
                                      f"({str(e).splitlines()[0][:200] if str(e) else 'no such bucket'})") from None
            except FileExistsError:
                try:
                    held = json.loads(fs.cat_file(p))
                except (OSError, ValueError):
                    held = {}
                if held.get("expires", 0) > time.time() and not _holder_is_dead(held):
                    raise OutputBusyError(
                        f"output folder {self.path} is being written by another run (pid {held.get('pid')} on "
                        f"{held.get('host')} since {held.get('since')}); wait for it to finish") from None
                # delete only the lease judged expired: read it again first. Found in review: two runs taking
                # over one expired lease at once both held it (1 in 10 trials), the second one's delete having
                # removed the lease the first had just created. The store has no conditional delete, so the
                # window left is this read to the delete; `TAKEOVER_SETTLE_SECONDS` below closes the rest
                fs.invalidate_cache()
                try:
                    again = json.loads(fs.cat_file(p))
                except FileNotFoundError:
                    again = None
                except (OSError, ValueError):
                    again = {}
                if again is not None and again != held:
                    continue  # another run's lease now: the next attempt finds it fresh (busy)
                # why it is free, as judged above (found in an operations review: a SIGKILLed run's lease, still
                # within its time, was called "expired")
                why = "expired" if held.get("expires", 0) <= time.time() else "its run's process is gone"
                log.warning("taking over the lock of %s (run %s): %s", self.path, held.get("run"), why)
                took_over = True
                try:
                    fs.rm(p)
                except FileNotFoundError:
                    pass
        else:
            raise OutputBusyError(f"output folder {self.path}: another run took its lock at the same time")
        if took_over:  # a run that took over the same lease a moment later deleted ours: see who holds it now
            time.sleep(TAKEOVER_SETTLE_SECONDS)
        fs.invalidate_cache()
        try:
            mine = json.loads(fs.cat_file(p)).get("run") == self.owner["run"]
        except (OSError, ValueError):
            mine = False
        if not mine:  # a store without conditional puts: the last writer won, and it was not us
            raise OutputBusyError(f"output folder {self.path}: another run took its lock at the same time")
        self._beat = threading.Thread(target=self._heartbeat, name="datakit-lease", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(LEASE_SECONDS / 4):
            if not self._beat_once():
                return

    def _beat_once(self) -> bool:
        """Refresh the lease if it is still this run's; False (and `lost` set) when another run holds it."""
        fs, p = filesystem(f"{self.path}/{LOCK_NAME}")
        try:
            lost = self._taken_by()
            if lost is not None:  # never write over another run's lease (it would be two writers again)
                self.lost = lost
                log.error("lost the lock of %s to another run (%s): this run will not commit", self.path, lost)
                return False
            fs.pipe_file(p, self._lease())
        except Exception as e:  # a missed beat is survivable; the next one retries
            log.warning("could not refresh the lock of %s: %s", self.path, e)
        return True

    def _taken_by(self) -> str | None:
        """Who holds the lease now if it is not this run (None: it is still ours, or cannot be read)."""
        fs, p = filesystem(f"{self.path}/{LOCK_NAME}")
        fs.invalidate_cache()
        try:
            held = json.loads(fs.cat_file(p))
        except FileNotFoundError:
            return "the lease is gone"
        except (OSError, ValueError):
            return None
        if held.get("run") == self.owner["run"]:
            return None
        return f"pid {held.get('pid')} on {held.get('host')} since {held.get('since')}"

    def check_held(self) -> None:
        """Raise `OutputBusyError` when this run's lease is no longer its own (before a commit).

        Why: a lease expires by the clock, so a writer paused past it (a stopped container, a long GC, a
        host whose clock runs ahead of the others') finds another run holding the folder. Found in an
        operations review: the paused run resumed, committed its top manifest over the other's, and a
        day it had committed was gone from the dataset, both exit 0. Checked right before each commit
        (and by every heartbeat, which no longer writes over another run's lease); a store without
        conditional writes leaves a window between this check and the write, which this narrows to
        milliseconds but cannot close."""
        lost = self.lost or (None if _is_local(self.path) else self._taken_by())
        if lost is not None:
            raise OutputBusyError(f"output folder {self.path}: this run lost its lock to another run ({lost}) "
                                  "while it was paused past the lease; nothing more is committed: rerun it")

    def release_remote(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        fs, p = filesystem(f"{self.path}/{LOCK_NAME}")
        try:
            fs.invalidate_cache()
            if json.loads(fs.cat_file(p)).get("run") == self.owner["run"]:
                fs.rm(p)
        except (OSError, ValueError):
            pass


def _read_holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, 0)
        held = json.loads(os.read(fd, 4096) or b"{}")
        return f" (pid {held['pid']} on {held['host']} since {held['since']})"
    except (OSError, ValueError, KeyError):
        return ""


def check_still_held(path: str) -> None:
    """`_Lock.check_held` for the lock this process holds on `path` (nothing when it holds none)."""
    key = path.rstrip("/")
    with _HELD_GUARD:
        locks = [lock for (p, _t), lock in _HELD.items() if p == key]
    for lock in locks:
        lock.check_held()


@contextmanager
def output_lock(path: str) -> Iterator[None]:
    """Hold the folder's writer lock for the block (re-entrant in one process); preflight first."""
    key = path.rstrip("/")
    held = (key, threading.get_ident())  # re-entrant in one thread; another thread is another writer
    with _HELD_GUARD:
        lock = _HELD.get(held)
        if lock is not None:
            lock.count += 1
    if lock is None:
        preflight(key)
        refuse_foreign_folder(key)
        lock = _Lock(key)
        if _is_local(key):
            lock.acquire_local()
        else:
            lock.acquire_remote()
        lock.count = 1
        with _HELD_GUARD:
            _HELD[held] = lock
    try:
        yield
    finally:
        with _HELD_GUARD:
            lock.count -= 1
            last = lock.count == 0
            if last:
                _HELD.pop(held, None)
        if last:
            lock.release_local() if _is_local(key) else lock.release_remote()


# ------------------------------------------------------------------------------------------ publish

# Side outputs that describe the data and have their own commit marker: retracted with the dataset,
# so a rerun that does not rebuild them leaves none describing the old data (the n-gram index beside
# a dataset: `datakit.stages.decontaminate.index.INDEX_DIRNAME`, whose index.json is written last).
SIDE_COMMITS = ("_ngram_index/index.json",)
# The run record of a finished run and the views rendered from it after its commit: retracted with it
# too, so a rerun that fails or is interrupted leaves no record of the previous run's counts beside a
# retracted dataset, and one that does not render a view (`--no-report`, a pipeline no longer ending
# in kto) leaves no page describing other data (`datakit report OUT` renders it again)
VIEWS = ("_run.json", "_report.html", "_reports/feedback.json")


def retract(path: str) -> bool:
    """Withdraw a finished dataset before it is rewritten (`_SUCCESS`, then `manifest.json`, then the
    commit markers of side outputs derived from the data).

    Returns True when there was one. Readers open a dataset through its manifest, so from here
    until the new commit they see no dataset rather than new shards under the old manifest."""
    out = path.rstrip("/")
    found = False
    for name in ("_SUCCESS", "manifest.json", *SIDE_COMMITS, *VIEWS):
        fs, p = filesystem(f"{out}/{name}")
        try:
            if fs.exists(p):
                fs.rm(p)
                found = found or name not in VIEWS
        except FileNotFoundError:
            pass
    if found:
        _retract_card(out)
        log.info("retracted the finished dataset at %s before rewriting it", out)
    return found


def _retract_card(out: str) -> None:
    """Replace datakit's dataset card by `RETRACTED_CARD`. Why: found in review, a rerun killed after it had
    replaced some data files left the old card, which listed the old files, so `load_dataset` read the
    new shards under the old card's row count; readers through the manifest saw no dataset, as documented,
    but the card is a reader's way in too. Only a card datakit wrote is replaced (tagged `datakit`)."""
    from datakit.io.atomic import write_bytes_atomic
    from datakit.io.layout import CARD, RETRACTED_CARD

    fs, p = filesystem(f"{out}/{CARD}")
    try:
        head = fs.cat_file(p)[:2048].decode("utf-8", "replace") if fs.exists(p) else ""
    except (OSError, FileNotFoundError):
        return
    if head.startswith("---") and "\n- datakit\n" in head.split("\n---", 1)[0] + "\n":
        write_bytes_atomic(f"{out}/{CARD}", RETRACTED_CARD.encode())


def sweep(path: str) -> list[str]:
    """Remove temp files and folders (`.tmp-*`) that interrupted writes left in the folder; returns what went.

    Folders too: a killed n-gram index build leaves its `.tmp-index-*` work folder (units, partitions, a
    lock file), which a rerun never reused (found in review: 22 files left after a successful rerun)."""
    out = path.rstrip("/")
    fs, p = filesystem(out)
    try:
        fs.invalidate_cache()
        inside = p.rstrip("/") + "/"  # never the folder itself: an index build's own work folder is `.tmp-index-*`
        found = sorted(f for f in fs.find(p, withdirs=True)
                       if f.startswith(inside) and f[len(inside):].rstrip("/").rsplit("/", 1)[-1].startswith(".tmp-"))
    except (OSError, FileNotFoundError):
        return []
    gone: list[str] = []
    for f in found:
        if any(f.startswith(g.rstrip("/") + "/") for g in gone):
            continue  # inside a temp folder already removed
        try:
            fs.rm(f, recursive=True)
            gone.append(f)
        except FileNotFoundError:
            pass
    return gone


def remove_work(path: str) -> None:
    """Remove `<out>/_work` (a finished run needs none of it; a later rerun starts its own)."""
    remove_tree(f"{path.rstrip('/')}/_work")
