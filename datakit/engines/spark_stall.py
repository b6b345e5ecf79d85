"""The stall guard of Spark's Python workers: a batch that makes no progress fails its task.

Why: a stage function that loops on one record (a pathological regex, a custom stage's bug), or a
read blocked on a dead mount, leaves a healthy executor that keeps heartbeating: no Spark timeout
fires, a speculative copy hangs the same way, and the job ran until the scheduler's own timeout
(docs/spark.md, found in review). The local engine has its heartbeat watchdog (`watchdog.py`);
this is the same promise inside a Spark task, where the driver cannot see Python's progress.

How: each Python worker process runs one daemon thread. The chain marks the span of work it owns
-- one stage function on one batch, one batch read from an input file (never the time the JVM
takes to hand a batch over or to take one) -- with `watching(what)`. When one span lasts longer
than the limit (`spark.datakit.stallSeconds`, else `DATAKIT_STALL_SECONDS`, default 300 s, as the
local engine's floor; 0 turns it off):

1. the thread raises `StalledBatchError` in the worker's thread (CPython's asynchronous exception),
   which fails the task with one line naming the stage, the op, the partition and the limit;
   Spark retries it as any failed task, and a record that hangs every attempt fails the job;
2. code that never returns to the interpreter (a C loop) or that swallows the exception keeps the
   span open: after a grace period the thread writes the same line and the worker's stack to
   stderr (the executor's log) and to pyspark's fault-handler file (the session turns Spark's
   `spark.python.worker.faulthandler.enabled` on), which Spark appends to its "Python worker exited
   unexpectedly" error, and ends the worker process;
3. a worker whose threads cannot run at all -- the process stopped (SIGSTOP, a frozen container) or
   native code holding the interpreter's lock -- cannot end itself: a small watcher process beside
   it (`_WATCHER`, started with the thread) gets a heartbeat byte from the thread at every tick and,
   when none comes for the limit plus the grace, writes that line to the fault-handler file and
   kills the worker (found in review: a SIGSTOPped worker held its task, and the job, for as long as
   it stayed stopped, the thread stopped with it).
"""
from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import logging
import os
import sys
import threading
import time
from typing import Iterator

log = logging.getLogger("datakit.spark")

STALL_CONF = "spark.datakit.stallSeconds"
DEFAULT_SECONDS = 300.0
EXIT_CODE = 75  # the worker ended by this guard (EX_TEMPFAIL)


class StalledBatchError(RuntimeError):
    """A stage function (or an input read) made no progress on one batch for the limit.

    Raised asynchronously with no arguments, so the message is the one the guard set just before."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or (_GUARD.message,)))


def stall_seconds(value: object = None) -> float:
    """The limit in seconds: the Spark setting `value` if given, else `DATAKIT_STALL_SECONDS`, else 300.
    0 turns the guard off. ValueError (one line) for anything else that is not a number >= 0."""
    where = STALL_CONF
    if value is None or value == "":
        value, where = os.environ.get("DATAKIT_STALL_SECONDS"), "DATAKIT_STALL_SECONDS"
        if value is None or value == "":
            return DEFAULT_SECONDS
    try:
        s = float(str(value))
    except ValueError:
        s = -1.0
    if not s >= 0:
        raise ValueError(f"{where} must be a number of seconds, 0 (off) or more (got {value!r})")
    return s


class _Guard:
    """This process's watcher: one open span at a time (a Python worker runs one task at a time)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.limit = 0.0
        self.span: tuple[int, float, str, int] | None = None  # (token, started, what, thread id)
        self.token = 0
        self.delivered = 0  # the span the exception was raised into (0: none)
        self.message = "a batch made no progress"
        self.thread: threading.Thread | None = None
        self.beat: int | None = None  # the pipe to the watcher process (`_start_watcher`): one byte per tick
        self.watched_limit = 0.0  # the limit the watcher was started for

    def start(self, limit: float) -> None:
        self.limit = limit
        if limit != self.watched_limit:  # a new limit (a worker reused by a run with another one): a new watcher
            beat = _start_watcher(limit + _grace(limit)) if limit > 0 else None
            with self.lock:  # never closed while the thread writes to it (the number could be reused at once)
                old, self.beat, self.watched_limit = self.beat, beat, limit
                if old is not None:
                    os.close(old)  # the old watcher reads the end of its pipe and exits
        if limit > 0 and (self.thread is None or not self.thread.is_alive()):
            self.thread = threading.Thread(target=self._watch, name="datakit-stall-guard", daemon=True)
            self.thread.start()

    @contextlib.contextmanager
    def watching(self, what: str) -> Iterator[None]:
        if self.limit <= 0:
            yield
            return
        with self.lock:
            self.token += 1
            token = self.token
            self.span = (token, time.monotonic(), what, threading.get_ident())
        try:
            yield
        except BaseException:
            self._close(token)
            raise
        if self._close(token):
            # the exception was raised into this span and swallowed by the code in it (a stage that catches
            # everything): the batch's result then depends on when the limit fell (found in review: a record
            # stuck past it was dropped by the stage's own handler, kept under a longer limit). Fail it anyway.
            raise StalledBatchError(self.message)

    def _close(self, token: int) -> bool:
        """End span `token` (no exception is delivered for it after this); True if one was delivered."""
        with self.lock:
            if self.span is not None and self.span[0] == token:
                self.span = None
            delivered = self.delivered == token
            self.delivered = 0
            return delivered

    def _watch(self) -> None:
        raised: int | None = None  # the span the exception was raised in
        raised_at = 0.0
        while True:
            time.sleep(min(1.0, max(0.05, self.limit / 20)))
            with self.lock:
                if self.beat is not None:
                    try:
                        os.write(self.beat, b".")
                    except BlockingIOError:  # the pipe is full: the watcher has unread beats, so it is not waiting
                        pass
                    except OSError:  # the watcher is gone: this thread still guards what it can
                        pass
            delivered = False
            with self.lock:  # delivered only while the span is still open (its end takes this lock)
                span = self.span
                if span is None:
                    continue
                token, started, what, ident = span
                now = time.monotonic()
                if raised != token and now - started > self.limit:
                    self.message = (f"{what} made no progress for {now - started:.0f} s on one batch "
                                    f"({STALL_CONF} / DATAKIT_STALL_SECONDS = {self.limit:g} s): a record that makes "
                                    "the function loop, or a read that never returns")
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(StalledBatchError))
                    raised, raised_at, delivered = token, now, True
                    self.delivered = token
                elif raised == token and now - raised_at > _grace(self.limit):
                    _end_worker(self.message)
            if delivered:
                log.error("%s; failing the task", self.message)


def _grace(limit: float) -> float:
    """How long the exception may take to surface before the worker is ended: code in C does not see it."""
    return max(5.0, min(60.0, limit))


def _end_worker(message: str) -> None:
    """Say why and show where the worker is stuck, then end it (the task fails; Spark retries it)."""
    from datakit.logs import _redact

    # shaped as a Python error line: the driver's one-line summary picks it out of Spark's crash report;
    # redacted like a log line (the span names an input file: a presigned URL carries a token)
    line = (f"{StalledBatchError.__module__}.StalledBatchError: {_redact(message)}; the exception did not surface, "
            "so this Python worker was ended\n")
    targets = [sys.stderr]
    fh_dir = os.environ.get("PYTHON_FAULTHANDLER_DIR")
    if fh_dir:  # pyspark's fault-handler file: the JVM appends it to the task's error when the worker dies
        try:
            targets.append(open(os.path.join(fh_dir, str(os.getpid())), "a", encoding="utf-8"))
        except OSError:
            pass
    for f in targets:
        try:
            f.write(line)
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(EXIT_CODE)


# The watcher: argv = heartbeat pipe fd, the worker's pid, seconds without a beat, fault-handler dir, message.
# Standard library only, started with -I -S (~10 ms, a few MB): ends when the pipe closes (the worker is gone).
_WATCHER = r"""
import os, select, signal, sys
fd, pid, limit, fh_dir, message = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
while True:
    ready, _, _ = select.select([fd], [], [], limit)
    if ready:
        if not os.read(fd, 4096):
            sys.exit(0)
        continue
    line = (message % limit) + "\n"
    for path in ([os.path.join(fh_dir, str(pid))] if fh_dir else []) + ["/dev/stderr"]:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line)
        except OSError:
            pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    sys.exit(0)
"""


def _start_watcher(seconds: float) -> int | None:
    """Start the watcher process of this worker; the write end of its heartbeat pipe, or None if it could
    not start (the thread then guards alone, as before)."""
    import subprocess

    try:
        r, w = os.pipe()
        message = (f"{StalledBatchError.__module__}.StalledBatchError: this Python worker made no progress at all "
                   f"for %.0f s (stopped, or native code holding the interpreter; {STALL_CONF} / "
                   "DATAKIT_STALL_SECONDS plus a grace), so it was ended")
        subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHER, str(r), str(os.getpid()), f"{seconds:g}",
                          os.environ.get("PYTHON_FAULTHANDLER_DIR", ""), message],
                         pass_fds=(r,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)
        os.close(r)
        os.set_blocking(w, False)  # a full pipe (a watcher that stopped reading) never blocks the guard
        return w
    except OSError:
        return None


_GUARD = _Guard()


def start(limit: float) -> None:
    """Watch this Python worker's spans with `limit` seconds (0: off). Idempotent."""
    _GUARD.start(limit)


def watching(what: str) -> contextlib.AbstractContextManager[None]:
    """The span of one unit of work this worker owns (`what` names it in the error)."""
    return _GUARD.watching(what)


def watched(items: Iterator, what: str) -> Iterator:
    """`items`, with the wait for each next item watched as one span."""
    it = iter(items)
    while True:
        with watching(what):
            try:
                item = next(it)
            except StopIteration:
                return
        yield item
