"""The process pool shared by everything that fans work out on this machine.

Why a module of its own: the local engine and post-run jobs such as the
decontamination index build both need worker processes, and spawning them
(and importing pyarrow, polars and numba kernels in each) costs seconds, which
a notebook re-running a pipeline should pay once. Keeping the pool here lets a
stage use it without importing an engine (see docs/architecture.md).

`spawn`, not `fork`: polars and numba hold threads that a fork would copy
mid-lock. Workers see the environment of their birth (credentials!), so a pool
is replaced when the environment changes. Each worker installs the parent's
log handler (datakit/logs.py), so lines logged inside tasks are redacted too, and
keeps pyarrow from importing pandas it would never use (datakit/arrow_without_pandas.py).

Threads: the tokenizer (Rust, rayon) sizes its thread pool to all cores in every process, so
N workers each tokenizing with all cores ran N x cores threads on the same cores, and idle rayon
threads spin: more CPU seconds for the same tokens (one 32 MB run: 20.7 vs 18.2 CPU-s).
Each worker gets `RAYON_NUM_THREADS = cores // workers` unless the user set it, and the same
`OPENBLAS_NUM_THREADS` (numpy's BLAS threads spin at import though no stage calls BLAS: `_thread_env`).

Allocator: workers start with mimalloc interposed (`LD_PRELOAD`, datakit/allocator.py): the
tokenizer spent about a third of its CPU in glibc's malloc; transparent huge pages off (allocator.py).
Only the workers: the pool owner's environment is changed for the instant a worker is started, under
a lock, then restored.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from typing import Iterator

from datakit.process_exit import exit_without_teardown

_POOLS: dict[int, tuple[ProcessPoolExecutor, int]] = {}
# Variables a library sets in os.environ for itself when it is imported, not a user's change:
# polars writes its allocator settings on import, and polars is imported at a run's first barrier,
# so counting it would replace the pool (and re-import everything in new workers) mid-run.
_LIBRARY_ENV = frozenset({"_RJEM_MALLOC_CONF"})


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, as a container or `taskset` sets it), not the host's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


# the code a run expects its workers to have imported: its custom stages' module digests (`expect_code`)
_CODE: list[tuple[tuple[str, str | None], ...]] = [()]


def expect_code(modules: dict[str, str | None] | None) -> None:
    """The run about to use the pool has these custom modules ({module: source digest}, the plan's
    `environment.code.modules`): a pool whose workers imported other versions is replaced.

    Why: the pool outlives a run, and its spawned workers keep the modules they imported. Found in
    review: a notebook that edited its stage module and reloaded it ran the new code on one worker
    (in-process) and the old code on two, under the new code's digest."""
    _CODE[0] = tuple(sorted((modules or {}).items()))


def pool(workers: int) -> ProcessPoolExecutor:
    """A spawn pool of `workers` processes, kept alive across calls (and runs) in this process.

    One pool at a time: asking for another size shuts the other down, so idle
    workers (each holding imported models) do not pile up. The pool is replaced when what its workers
    started from changed: the environment, the log set-up, `sys.path` (a spawned worker copies it when
    it starts: found in review, a folder a notebook added after the first run was missing in the workers,
    which died on the import) or the custom code the run expects (`expect_code`).
    """
    from datakit.logs import worker_config

    logcfg = worker_config()
    with _ENV_LOCK:  # not while a worker start has the allocator's variables in os.environ
        env = hash((frozenset((k, v) for k, v in os.environ.items() if k not in _LIBRARY_ENV), logcfg,
                    tuple(sys.path), _CODE[0]))
    for other in [w for w in _POOLS if w != workers]:
        drop_pool(other)
    existing, born = _POOLS.get(workers, (None, None))
    if existing is None or born != env or getattr(existing, "_broken", False):
        drop_pool(workers)
        threads = worker_threads(workers)
        with _ENV_LOCK:
            child_env = start_env(threads)
        forget = tuple(k for k in child_env if k not in _THREAD_KEYS)  # the allocator's: dropped once started
        existing = _Pool(max_workers=workers, mp_context=get_context("spawn"), initializer=_init_worker,
                         initargs=(threads, *logcfg), child_env=child_env, forget=forget)
        _POOLS[workers] = (existing, env)
    return existing


class _Pool(ProcessPoolExecutor):
    """A spawn pool whose workers start with `child_env` added to the parent's environment.

    Why a subclass: a spawned process copies the environment of the moment it starts, and the
    executor starts workers lazily (on `submit`, and again if one dies), so the variables are set
    around each start (`_spawn_process`, the one place the executor starts a worker, 3.9+). Should
    a Python version start workers elsewhere, they simply start without them (the run report's
    `timing.workers.allocators` then says `system`).
    """

    def __init__(self, *args, child_env: dict[str, str], forget: tuple[str, ...] = (), **kwargs) -> None:
        # before the executor could start a worker; `forget`: the keys the worker drops once started
        self._child_env = {**child_env, _ADDED_MARK: ",".join(forget)} if forget else dict(child_env)
        super().__init__(*args, **kwargs)

    def _spawn_process(self) -> None:
        before = set(self._processes)  # type: ignore[attr-defined]
        with _environment(self._child_env), _interrupts_ignored_by_children():
            super()._spawn_process()  # type: ignore[misc]
        for pid in set(self._processes) - before:  # type: ignore[attr-defined]
            _REAPER.watch(pid)


# The reaper: argv = the read end of the owner's pipe. Standard library only, started with -I -S (~10 ms, a few
# MB). Reads "pid start_ticks" lines; at end of file (the owner is gone, however it ended) it SIGKILLs every
# listed process that is still the one listed (same start time: a pid reused by another process is left alone).
_REAPER_CODE = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the whole group: the owner decides
fd, listed, buf = int(sys.argv[1]), [], b""
while True:
    chunk = os.read(fd, 4096)
    if not chunk:
        break
    buf += chunk
    *lines, buf = buf.split(b"\n")
    listed += [tuple(int(x) for x in ln.split()) for ln in lines if ln.strip()]
for pid, ticks in listed:
    try:
        with open(f"/proc/{pid}/stat") as f:
            same = int(f.read().rsplit(")", 1)[1].split()[19]) == ticks
        if same:
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass
"""


class _Reaper:
    """Ends this process's pool workers when this process is gone, even those that cannot end themselves.

    Why: a worker ends itself within a second of its owner's death (`_exit_with_owner`), but a *stopped*
    worker (SIGSTOP, a frozen cgroup, a debugger) runs no thread: found in review, with the owner killed by
    SIGKILL (a scheduler's hard limit, the OOM killer) such a worker lived on, re-parented to init with its
    memory, until someone sent it SIGCONT. SIGKILL reaches a stopped process; this small process beside the
    owner sends it when the owner's end of a pipe closes, which the kernel does however the owner ends.
    Linux only (it reads /proc to tell a worker from a process that reused its pid); elsewhere nothing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fd: int | None = None
        self.owner: int | None = None
        # Every reaper this object started (a forked child starts its own, and keeps its parent's entry):
        # kept for the process's life. Found in a Python API review: a discarded Popen of a running process
        # warns "ResourceWarning: subprocess N is still running" when collected, which every workers=2 run
        # printed under pytest, -X dev or warnings.simplefilter("default").
        self.procs: list = []

    def watch(self, pid: int) -> None:
        from datakit.procinfo import start_ticks

        ticks = start_ticks(pid)
        if ticks is None:
            return
        with self.lock:
            if self.owner != os.getpid():  # first worker of this process (a forked child starts its own)
                self.fd, self.owner = self._start(), os.getpid()
            if self.fd is None:
                return
            try:
                os.write(self.fd, f"{pid} {ticks}\n".encode())
            except OSError:  # the reaper is gone: workers still end themselves when they can
                self.fd = None
                if self.procs:
                    self.procs[-1].poll()  # (collects its exit status: no zombie for the owner's life)

    def _start(self) -> int | None:
        import subprocess

        try:
            r, w = os.pipe()
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER_CODE, str(r)], pass_fds=(r,),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True,
                                    start_new_session=True)  # (a signal to the owner's group does not end it first)
            if not self.procs:
                import atexit

                atexit.register(self._outlive)
            self.procs.append(proc)
            os.close(r)
            os.set_inheritable(w, False)
            return w
        except OSError:
            return None

    def _outlive(self) -> None:
        """At exit: the reapers run on by design (each acts when this process is gone), so the interpreter's
        teardown must not collect their Popen objects as processes nobody waited for (the same
        ResourceWarning, "Exception ignored in Popen.__del__", under -X dev). Not a child to wait for any more."""
        for proc in self.procs:
            proc._child_created = False  # (what Popen.__del__ checks first; no signal, no wait)


_REAPER = _Reaper()


@contextmanager
def _interrupts_ignored_by_children() -> Iterator[None]:
    """SIGINT ignored while a worker is started, so it starts ignoring it (an ignored signal stays
    ignored across exec, and Python then installs no KeyboardInterrupt handler).

    Why: Ctrl-C in a terminal interrupts the whole process group. Each worker printed its own
    KeyboardInterrupt traceback (two of ~20 lines with two idle workers) under the command's exit,
    and a worker still importing printed its spawn bootstrap's. The pool's owner decides what an
    interrupt stops (`stopped_on_interrupt`). `_init_worker` ignores it too, for a worker started
    from a thread other than the main one (only the main thread may change a signal's handler).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def stopped_on_interrupt(workers: int) -> Iterator[None]:
    """Around waiting for a pool's tasks: on Ctrl-C (KeyboardInterrupt) its workers are killed at once.

    Why: workers ignore SIGINT (see `_interrupts_ignored_by_children`), and at exit the interpreter
    waits for a pool's running tasks to finish (tokenizing a shard: tens of seconds).
    """
    try:
        yield
    except KeyboardInterrupt:
        kill_pool(workers)
        raise


def kill_pool(workers: int) -> None:
    """Kill every process of the kept pool of `workers` (mid-task or not), wait for them, forget the pool."""
    existing, _ = _POOLS.pop(workers, (None, None))
    if existing is None:
        return
    kill_workers(existing)
    manager = getattr(existing, "_executor_manager_thread", None)
    existing.shutdown(wait=False, cancel_futures=True)
    if manager is not None:
        # its clean-up of the dead pool ends at once; waited for so that it is not still releasing the pool's
        # queues while this process ends (found in an operations review: a SIGTERM's exit raced it, and
        # multiprocessing's resource tracker reported "1 leaked semaphore objects")
        manager.join(timeout=10)


def kill_all_pools() -> None:
    """Kill every kept pool's processes (mid-task or not) and forget the pools: a process stopping now."""
    for workers in list(_POOLS):
        kill_pool(workers)


def kill_workers(ex: ProcessPoolExecutor) -> None:
    """Kill every worker process of `ex` and wait for them (the executor's own clean-up is asynchronous)."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    for p in procs:
        try:
            p.kill()
        except (OSError, ValueError, AttributeError):
            pass
    for p in procs:
        try:
            p.join(timeout=10)
        except (OSError, ValueError, AssertionError, AttributeError):
            pass


_ENV_LOCK = threading.Lock()
# set with the allocator's variables when the pool adds them (value: their names), so a worker can tell
# ours from a user's LD_PRELOAD
_ADDED_MARK = "DATAKIT_WORKER_PRELOAD"


def start_env(threads: int) -> dict[str, str]:
    """The variables a worker whose share of the cores is `threads` (`worker_threads`) starts with on top
    of the owner's environment: its BLAS threads and its allocator (benchmarks start their references
    with the same; a local Spark master's Python workers too)."""
    from datakit import allocator

    return {**_thread_env(threads), **allocator.worker_env()}


# thread variables the owning process set for itself (`one_blas_thread_here`), not a user's choice:
# its workers still get their share
_OWNER_SET: set[str] = set()
_BLAS = "OPENBLAS_NUM_THREADS"
_THREAD_KEYS = (_BLAS,)  # what `_thread_env` may set; every other start variable is the allocator's


def one_blas_thread_here() -> None:
    """Give this process one OpenBLAS thread unless the user chose (OPENBLAS_NUM_THREADS); for the
    `datakit` command, before anything imports numpy.

    Why: see `_thread_env`; the command's own process calls no BLAS either (0.10-0.12 CPU-s of every
    `datakit` command on 2 cores). Only the command: a notebook or script that imports datakit keeps
    numpy's threads for its own work. The value is recorded as the owner's, not the user's, so a pool
    started from here still gives each worker its share; other processes the command starts (a local
    Spark master's JVM and Python workers) inherit the 1.
    """
    if _BLAS not in os.environ:
        os.environ[_BLAS] = "1"
        _OWNER_SET.add(_BLAS)


def _thread_env(threads: int) -> dict[str, str]:
    """Thread settings a worker must have before its first import, unless the user set them.

    OPENBLAS_NUM_THREADS: numpy's OpenBLAS starts one thread per core when numpy is imported, and
    each spins for ~0.1 s waiting for work before it sleeps, though datakit's stages never call BLAS
    (its kernels use no np.dot or linalg, see jit.py; spaCy's models multiply with blis):
    0.10-0.12 CPU-s per process on 2 cores (`python -c "import numpy"`: 0.16 vs 0.05 user s), and
    (cores - 1) x that on a bigger machine, in every worker. The pool gives it the worker's share of
    the cores, as it gives the tokenizer (RAYON_NUM_THREADS, set in `_init_worker`: rayon reads it at
    first use). Here, not in the initializer: spawn re-imports a script's `__main__` (and whatever
    numpy it imports) before the initializer runs. A value the user set is passed on unchanged; the
    `datakit` command's own 1 (`one_blas_thread_here`) is not the user's.
    """
    return {} if _BLAS in os.environ and _BLAS not in _OWNER_SET else {_BLAS: str(threads)}


def environment_lock() -> threading.Lock:
    """Held while a worker start has its extra variables in os.environ: hold it to copy the environment
    for another process (Spark's JVM start does), so that copy never catches them."""
    return _ENV_LOCK


@contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    """`extra` in os.environ for the duration of the block, then exactly the old values back.

    A thread that reads os.environ meanwhile without `environment_lock()` can see them (a user's
    thread starting a subprocess in those milliseconds would pass LD_PRELOAD on); datakit's own
    readers (the pool's environment key, Spark's JVM start) take the lock."""
    if not extra:
        yield
        return
    with _ENV_LOCK:
        old = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)
        try:
            yield
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def worker_threads(workers: int) -> int:
    """Threads a pool worker's multi-threaded libraries get: this machine's cores shared by the pool."""
    return max(1, usable_cpus() // max(1, workers))


def _init_worker(threads: int, *logcfg) -> None:
    """Pool initializer: share the cores (see module doc), then the parent's log set-up."""
    from datakit.arrow_without_pandas import defer_pandas
    from datakit.logs import init_worker

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner handles Ctrl-C (`stopped_on_interrupt`)
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    _forget_preload()
    init_worker(*logcfg)
    defer_pandas()
    atexit.register(_exit_without_teardown)
    _exit_with_owner(_owner_pid())


def _owner_pid() -> int:
    """The process that started this worker, as recorded when it spawned us, not `os.getppid()` now.

    Why: found in an operations review, a `datakit run` killed while its workers were still starting
    left them re-parented to init before this ran; `getppid()` then said 1, the watch took init for
    the owner and the workers (~170 MB each) lived on forever."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None and parent.pid else os.getppid()


PARENT_CHECK_SECONDS = 1.0


def _exit_with_owner(owner: int) -> None:
    """End this worker as soon as the process that started it is gone (a daemon thread polls).

    Why: an idle worker waits for its next task on a pipe whose write end it holds itself, so it
    never sees end-of-file. When the pool's owner died without shutting the pool down (SIGKILL,
    the OOM killer, a CI job's time limit), its workers stayed forever, each with its imported
    models and kernels (two idle workers were found 16 minutes after their `datakit run` was
    killed). Polling the parent id, not `PR_SET_PDEATHSIG`: that signal follows the thread that
    started the worker, and a pool may be started from a thread that ends before the pool does.
    A task that was running is lost with its owner anyway; its work folder lets a rerun resume.
    """
    import time

    def watch() -> None:
        while os.getppid() == owner:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(70)  # EX_SOFTWARE; nobody reads it: the owner is gone

    threading.Thread(target=watch, name="datakit-exit-with-owner", daemon=True).start()


def _forget_preload() -> None:
    """Take the LD_PRELOAD the pool added out of this worker's environment (after noting what this
    process runs with): processes a task starts keep their own allocator, as the owner's do."""
    from datakit import allocator

    allocator.in_use()  # cached: read while LD_PRELOAD still names what was loaded (a user's too)
    allocator.forget_added(_ADDED_MARK)


def _exit_without_teardown() -> None:
    """A pool worker's last exit handler: flush the logs and standard streams, then end the process
    without the interpreter's teardown.

    Why: a spawn worker ends with `sys.exit`, so the interpreter then frees every module and object
    it holds (spaCy's pipeline, the tokenizer, numba's kernels): 0.40-0.62 s of wall per pool at the
    end of every `datakit run` (measured at 10k quickstart events, 4 runs; 0.03 s without it), which
    the driver waits for. Nothing in that teardown is output: the tasks closed their files, and
    multiprocessing ran its own finalizers (queues, logging to the parent) before `sys.exit`.
    Handlers registered after this one (libraries imported by tasks) run before it (atexit is
    last-in first-out); the ones registered before it are the standard library's, of which only
    logging's flush matters, done here. Exit status 0: the pool never reads a worker's status (it
    notices a dead worker by its sentinel while work is pending).
    """
    exit_without_teardown(0)


def drop_pool(workers: int, wait: bool = False) -> None:
    """Shut a pool down (after a failure its workers may be mid-task): the next `pool()` starts fresh.

    `wait=True` lets tasks already running finish (queued ones are cancelled), so
    nothing writes into a work folder after the caller has moved on.
    """
    existing, _ = _POOLS.pop(workers, (None, None))
    if existing is not None:
        existing.shutdown(wait=wait, cancel_futures=True)


def drop_all_pools(wait: bool = False) -> None:
    """Shut every kept pool down; `wait=True` returns once the worker processes have exited."""
    for w in list(_POOLS):
        drop_pool(w, wait=wait)


atexit.register(drop_all_pools)


__all__ = ["pool", "drop_pool", "drop_all_pools", "one_blas_thread_here", "start_env", "usable_cpus", "worker_threads"]
