"""Watch the local engine's worker processes: a stalled task is re-dispatched once, then the run fails.

Why: a worker that is alive but stuck (stopped, swapping, blocked on a dead
mount) never breaks the process pool, so waiting on its future hangs the run
forever without a word. Each task therefore leaves a *heartbeat file*: the
worker writes its pid and start time when the task begins, and the task touches
the file as it makes progress (`beat()`, between batches, at most once a
second). The parent waits with a timeout and checks the files:

* a task whose heartbeat is older than the **stall threshold** --
  `max(DATAKIT_STALL_SECONDS (default 300), 3 x the longest task finished so
  far)`, i.e. derived from observed task times once there are some -- is
  stalled: its worker is killed (SIGKILL works on a stopped process too), the
  pool is replaced and every unfinished task is dispatched again (finished
  tasks are not rerun; a task's partial output is rewritten from scratch, and
  the killed attempt can no longer write, so two attempts never mix);
* the same task stalling twice fails the run with one line naming the task.

A task silent for `min(threshold / 2, max(60 s, 3 x the longest task))` is
logged once as a warning, so a long stall is never silent even when it ends by
itself.

Tasks queued but not started have no heartbeat yet and are not judged one by one;
but when nothing at all (no task finishing, no heartbeat) happened for the
threshold while tasks are pending, the pool is treated as stalled the same way
(a worker stopped after taking a task from the queue, before announcing it).
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

from datakit.workers import drop_pool, kill_workers, pool, stopped_on_interrupt

log = logging.getLogger("datakit.watchdog")

FACTOR = 3.0
DEFAULT_FLOOR = 300.0
POLL_SECONDS = 0.5
# A poll that came this much later than POLL_SECONDS means this process itself did not run meanwhile:
# Ctrl-Z then `fg` (the terminal stops the whole process group), a suspended laptop, a frozen VM. Its
# workers did not run either, so heartbeats are judged from that moment, not from before it. Found in an
# operations review: after Ctrl-Z and `fg` past the stall floor, a healthy worker was killed as stalled.
SUSPENDED_AFTER = 3.0

_BEAT: str | None = None
_LAST = 0.0


class TaskStalled(RuntimeError):
    """A task made no progress twice in a row; the engine turns it into its one-line error."""


def floor_seconds() -> float:
    try:
        return max(0.5, float(os.environ.get("DATAKIT_STALL_SECONDS", DEFAULT_FLOOR)))
    except ValueError:
        return DEFAULT_FLOOR


def beat() -> None:
    """Record progress of the task running in this process (cheap; at most one touch a second)."""
    global _LAST
    if _GUARDS:
        me, now = threading.get_ident(), time.monotonic()
        for guard in list(_GUARDS):
            if guard.ident == me:
                guard.last = now
    if _BEAT is None:
        return
    now = time.monotonic()
    if now - _LAST >= 1.0:
        _LAST = now
        try:
            os.utime(_BEAT)
        except OSError:
            pass


class Watched:
    """Picklable task wrapper (runs in the worker): announce pid + start time, then run with heartbeats."""

    def __init__(self, fn: Callable, beat_path: str) -> None:
        self.fn, self.beat_path = fn, beat_path

    def __call__(self, item: Any) -> Any:
        global _BEAT, _LAST
        with open(self.beat_path, "w") as f:
            f.write(f"{os.getpid()} {time.time()}")
        _BEAT, _LAST = self.beat_path, time.monotonic()
        try:
            return self.fn(item)
        finally:
            _BEAT = None


def _redact_remote_traceback(e: BaseException) -> None:
    """Redact the worker's formatted traceback that `concurrent.futures` chains to a task's error.

    Why: that text (`_RemoteTraceback`, printed under "The above exception was the direct cause") holds
    every message of the worker's exception chain; found in a Python API review, it printed a stage's
    raw ValueError (an e-mail, a token) under the redacted `StageError`. `engines/core` chains only
    redacted text now; this keeps any other exception a task raises from doing the same."""
    cause = e.__cause__
    text = getattr(cause, "tb", None)
    if type(cause).__name__ == "_RemoteTraceback" and isinstance(text, str):
        from datakit.quality.expect import redact_text

        cause.tb = redact_text(text)


def _read_beat(path: str) -> tuple[int, float, float] | None:
    """(pid, started, last beat) of a running task, or None if it has not started."""
    try:
        st = os.stat(path)
        with open(path) as f:
            pid, started = f.read().split()
        return int(pid), float(started), st.st_mtime
    except (OSError, ValueError):
        return None


def map_watched(fn: Callable, items: list, workers: int, beat_dir: str, what: str,
                label: Callable[[Any], str], on_done: Callable[[Any], None] | None = None) -> list:
    """`[fn(i) for i in items]` on the shared pool, watched for stalled tasks (see module doc).
    `on_done(result)` runs in this thread as each task finishes (progress reporting). Ctrl-C kills
    the pool's workers (`workers.stopped_on_interrupt`)."""
    with stopped_on_interrupt(workers):
        return _map_watched(fn, items, workers, beat_dir, what, label, on_done)


def _map_watched(fn: Callable, items: list, workers: int, beat_dir: str, what: str,
                 label: Callable[[Any], str], on_done: Callable[[Any], None] | None) -> list:
    os.makedirs(beat_dir, exist_ok=True)
    n = len(items)
    results: list[Any] = [None] * n
    done: set[int] = set()
    stalls: dict[int, int] = {}
    warned: set[int] = set()
    longest = 0.0
    while len(done) < n:
        ex = pool(workers)
        futures = {}
        for i in range(n):
            if i in done:
                continue
            path = os.path.join(beat_dir, f"task-{i:05d}.beat")
            if os.path.exists(path):
                os.remove(path)
            futures[ex.submit(Watched(fn, path), items[i])] = (i, path)
        stalled: tuple[int, float] | None = None
        pending = set(futures)
        last_progress = last_poll = time.time()
        resumed = 0.0  # when this process last ran again after being stopped (see SUSPENDED_AFTER)
        try:
            while pending and stalled is None:
                finished, pending = wait(pending, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
                now = time.time()
                if now - last_poll > SUSPENDED_AFTER:
                    resumed = now  # silence before now is the whole machine's or group's, not a worker's
                last_poll = now
                last_progress = max(last_progress, resumed)
                for f in finished:
                    i, path = futures[f]
                    try:
                        results[i] = f.result()  # a task's own error propagates as it is
                    except Exception as e:
                        _redact_remote_traceback(e)
                        raise
                    done.add(i)
                    last_progress = now
                    if on_done is not None:
                        on_done(results[i])
                    b = _read_beat(path)
                    if b is not None:
                        longest = max(longest, now - b[1])
                threshold = max(floor_seconds(), FACTOR * longest)
                warn_after = min(threshold / 2, max(60.0, FACTOR * longest))
                for f in pending:
                    i, path = futures[f]
                    b = _read_beat(path)
                    if b is None:
                        continue
                    last_progress = max(last_progress, b[2])
                    silent = now - max(b[2], resumed)
                    if silent > warn_after and i not in warned:
                        warned.add(i)  # a slow task is said once, long before it counts as stalled
                        log.warning("task %s of '%s' has made no progress for %.0f s (stalled after %.0f s)",
                                    label(items[i]), what, silent, threshold)
                    if silent > threshold:
                        stalled = (i, threshold)
                        _kill(b[0])
                        break
                if stalled is None and pending and now - last_progress > threshold:
                    # nothing finished or beat at all: a worker stopped between taking a task and
                    # announcing it; charge the first unfinished task
                    stalled = (min(futures[f][0] for f in pending), threshold)
        except BrokenProcessPool:
            if stalled is None:
                died = _dead_worker(ex, [(i, path) for i, path in futures.values() if i not in done], items, label)
                if died:
                    raise WorkerDied(f"{died} during '{what}'") from None
                raise
        if stalled is None:
            continue
        # collect what finished before the pool went down, then start over with the rest
        for f, (i, _) in futures.items():
            if i not in done and f.done() and not f.cancelled() and f.exception() is None:
                results[i], done = f.result(), done | {i}
        kill_workers(ex)  # the old attempts must be gone before new ones write the same parts
        drop_pool(workers)
        i, threshold = stalled
        stalls[i] = stalls.get(i, 0) + 1
        if stalls[i] > 1:
            raise TaskStalled(f"task {label(items[i])} of '{what}' made no progress for {threshold:.0f} s, "
                              "twice (its worker was stalled and killed each time); rerun to resume finished work (a stage whose "
                              "batches take longer than that sets DATAKIT_STALL_SECONDS higher)")
        log.warning("task %s of '%s' made no progress for %.0f s: its worker was killed, unfinished tasks "
                    "are dispatched again", label(items[i]), what, threshold)
    return results


class StalledHere(BaseException):
    """Raised (asynchronously) into the thread running an in-process task that made no progress.

    A BaseException, as KeyboardInterrupt is: the stage code it lands in may catch `Exception` (a custom
    stage's catch-all), and must not turn it into a dropped record or a stage error; `run_tasks` turns it
    into the engine's one-line error. Raised with no arguments, so the message is the guard's."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or (_HERE_MESSAGE[0],)))


# the guards open in this process, each watching the thread that opened it (a task may run tasks of its own, and
# two pipelines may run in two threads of one host program): `beat()` reaches those of its own thread
_GUARDS: list["_InProcessGuard"] = []
_HERE_LOCK = threading.Lock()
_HERE_MESSAGE = ["a task made no progress"]
# set by the `datakit` command (cli.command): a task stuck in native code past the grace may end the process
# then, because the process is the command's; under a host program (a notebook, a scheduler's worker, a test
# runner) it is said in the log instead, never ended from inside (found in review)
END_PROCESS_WHEN_STUCK = [False]


class _InProcessGuard:
    """The watchdog of tasks run in the command's own process (one worker, one task, a small input).

    Why: found in review, those tasks had none, and they are the common case (a one-file nightly day, any
    input under ~32 MB, `workers=1` in a notebook): a stage function looping on one record hung the run
    forever, without a word. A pool worker that stalls is killed and its task dispatched again; this
    process cannot kill its own thread, so a stall here fails the run: a thread raises `StalledHere` into
    the task's thread (CPython's asynchronous exception), and code that never returns to the interpreter (a
    C loop) ends the process after a grace period with the same line, exit 3. The threshold is the pool's:
    `max(DATAKIT_STALL_SECONDS, 3 x the longest task finished so far)`, silence counted between `beat()`s."""

    def __init__(self, what: str) -> None:
        self.what, self.label = what, ""
        self.ident = threading.get_ident()
        self.last = time.monotonic()
        self.started = self.last
        self.longest = 0.0
        self.active = False
        self.raised = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="datakit-stall-guard", daemon=True)

    def task(self, label: str) -> None:
        self.label, self.started, self.last, self.active = label, time.monotonic(), time.monotonic(), True

    def done(self) -> None:
        self.active = False
        self.longest = max(self.longest, time.monotonic() - self.started)

    def _watch(self) -> None:
        warned = ""
        raised_at = 0.0
        prev = time.monotonic()
        while not self.stop.wait(POLL_SECONDS):
            now = time.monotonic()
            if now - prev > SUSPENDED_AFTER:  # this process did not run (Ctrl-Z, a suspended laptop): not silence
                self.last = max(self.last, now)
            prev = now
            if not self.active:
                continue
            threshold = max(floor_seconds(), FACTOR * self.longest)
            silent = now - self.last
            if silent > min(threshold / 2, max(60.0, FACTOR * self.longest)) and warned != self.label:
                warned = self.label
                log.warning("task %s of '%s' has made no progress for %.0f s (stalled after %.0f s)",
                            self.label, self.what, silent, threshold)
            if not self.raised and silent > threshold:
                _HERE_MESSAGE[0] = (f"task {self.label} of '{self.what}' made no progress for {threshold:.0f} s in this "
                                    "process (a record that makes a stage function loop, or a read that never "
                                    "returns); the run stops: rerun to resume finished work (a stage whose batches "
                                    "take longer than that sets DATAKIT_STALL_SECONDS higher)")
                self.raised, raised_at = True, now
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.ident), ctypes.py_object(StalledHere))
            elif self.raised and raised_at and now - raised_at > max(5.0, min(60.0, threshold)):
                raised_at = 0.0  # said once
                if not END_PROCESS_WHEN_STUCK[0]:  # a library's host (a notebook's kernel, a scheduler's worker):
                    log.error("%s; the task does not stop (native code), and this process is not datakit's own "
                              "to end: interrupt or restart it", _HERE_MESSAGE[0])
                    continue
                from datakit.logs import error_line

                sys.stderr.write(error_line(f"{_HERE_MESSAGE[0]}; the task did not stop (native code), so this "
                                            "process ends") + "\n")
                sys.stderr.flush()
                os._exit(3)

    enabled = True

    def __enter__(self) -> "_InProcessGuard":
        if self.enabled:
            with _HERE_LOCK:
                _GUARDS.append(self)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        try:
            self.stop.set()
            self.thread.join()
        finally:
            with _HERE_LOCK:
                _GUARDS.remove(self)
        if self.raised:  # one raised as the last task ended may still be pending: never deliver it later
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.ident), None)
        if self.raised and exc[0] is None:
            # the exception was raised into the task and swallowed by the code in it: its result depends on
            # when the limit fell; fail the run anyway (as spark_stall does)
            raise StalledHere()


def in_process(what: str, enabled: bool = True) -> _InProcessGuard:
    """Guard the tasks run in this process (`_InProcessGuard`); `enabled=False`: a guard that watches nothing."""
    guard = _InProcessGuard(what)
    guard.enabled = enabled
    return guard


class WorkerDied(BrokenProcessPool):
    """A pool worker ended while it ran a task: the message names the task and how the worker ended."""


def _dead_worker(ex: Any, running: list[tuple[int, str]], items: list, label: Callable[[Any], str]) -> str | None:
    """"task X's worker (pid P) was killed by SIGKILL (...)" for a task whose worker ended, else None.

    Why: the pool only says that "a process terminated abruptly". Which task it ran and how it ended
    (SIGKILL is, on Linux, almost always the kernel's out-of-memory killer) are what an operator needs
    to choose between more memory, fewer workers and a bug report. The pool terminates its other
    workers itself (SIGTERM) once one is gone, so a worker that ended another way is the one to name.
    """
    procs = dict(getattr(ex, "_processes", None) or {})
    ended: list[tuple[int, int, int]] = []  # (task, pid, exit code)
    for i, path in running:
        b = _read_beat(path)
        p = procs.get(b[0]) if b is not None else None
        if p is None:
            continue
        p.join(timeout=2)
        if p.exitcode is not None:
            ended.append((i, b[0], p.exitcode))
    if not ended:
        return None
    i, pid, code = next((e for e in ended if e[2] != -signal.SIGTERM), ended[0])
    if code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
        if -code == signal.SIGKILL:
            how += (" (on Linux most often the kernel's out-of-memory killer: see `dmesg` or the container's "
                    "memory limit; fewer workers or a lower DATAKIT_JOIN_MEMORY_MB lower the peak)")
    else:
        how = f"exited with status {code}"
    return f"the local worker process (pid {pid}) running task {label(items[i])} {how}"


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
