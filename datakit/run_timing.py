"""Where a run's seconds went: the `timing` block of `_run.json`.

Why: the engine's `seconds` covers only the stages. A run also pays for importing and
constructing the engine, compiling the pipeline (some stages do real work there, e.g.
hashing the eval sets' n-grams), committing (side outputs, manifest, work-folder clean-up)
and the steps after the commit (quality checks, index, report). On a cold installation
half of the numba kernel compilation happens at pipeline compile. None of that was in
`_run.json`, so a slow run could not be explained from its own report.

`RunTimer` measures consecutive phases with one wall clock, so the phases plus `other`
(the gaps between them: locks, bookkeeping) add up to `total` exactly, up to rounding.
It also records this process's CPU seconds, its peak RSS and the seconds numba spent
compiling kernels in this process, and (`workers`) what the local engine's pool processes spent:
each pool task measures itself (`task_begin`/`task_end`, called by the scheduler), and the first
task of a process also reports the process's start-up (interpreter, imports, unpickling the task:
everything before its first row) and its RSS at that point.
"""
from __future__ import annotations

import resource
import sys
import time
from typing import Any

PHASES = ("engine_start", "compile", "stages", "commit", "after_commit")
# Phases only a process started for one run has (`one_run_process`): its start-up before the run's
# timer, and stopping its local worker pool once the outputs are written
PROCESS_PHASES = ("process_start", "release")
_ONE_RUN_PROCESS: list[bool] = []


def one_run_process() -> None:
    """Mark this process as started for one run (`datakit run` calls it).

    Why: a process that exists for one run also pays for its own start-up (the interpreter,
    imports, reading the pipeline file: ~0.6 s before `Pipeline.run` at 100k quickstart
    events) and for stopping its local worker pool when it exits (~0.6 s, the workers' own
    teardown, which `workers._exit_without_teardown` now skips). Neither was in `_run.json`.
    Marked, the run reports its start-up as the phase `process_start` (and its CPU seconds
    from the process's start), and stops its pool inside the run (`release`), so what follows
    `_run.json` is only the process's exit (`cli.command`). A Spark session is not stopped
    there: its JVM ends when the process does, and stopping it first would only add its stop to
    the wait. A library user's `Pipeline.run` is not marked: their process was not started for
    it, and its pool is kept for their next run.
    """
    if not _ONE_RUN_PROCESS:
        _ONE_RUN_PROCESS.append(True)


def process_age() -> float | None:
    """Seconds since this process started (the kernel's start time), None where it cannot be read."""
    import os

    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        try:
            import psutil

            return max(0.0, time.time() - psutil.Process().create_time())
        except Exception:  # noqa: BLE001 - no clock to read: the phase is left out, never guessed
            return None


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB.

    Linux: VmHWM of /proc/self/status, not ru_maxrss: a process started by fork/vfork + exec
    (every pool worker, every subprocess) inherits in ru_maxrss the peak of the process that
    started it (the kernel keeps the pre-exec address space's high-water mark), so a worker of a
    600 MB driver reported >= 600 MB whatever it used. VmHWM belongs to the exec'd image only.
    Elsewhere ru_maxrss (KB on Linux, bytes on macOS).
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024


def _numba_compile_seconds() -> float:
    """Seconds this process spent compiling numba kernels since datakit.jit was imported (0 if it was not)."""
    jit = sys.modules.get("datakit.jit")
    return jit.compile_seconds() if jit is not None else 0.0


def _numba_jit_seconds() -> float:
    """Seconds compiling or loading cached numba kernels since datakit.jit was imported (0 if it was not)."""
    jit = sys.modules.get("datakit.jit")
    return jit.jit_seconds() if jit is not None else 0.0


def rss_mb() -> float:
    """This process's resident set size now, in MB (Linux /proc; else the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / (1 << 20)
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()


_STARTED: list[bool] = []  # set once this process has reported its start-up


def task_begin() -> tuple[float, float, float, dict[str, float] | None]:
    """Called by a pool worker before a task: the counters `task_end` subtracts (and, on the
    process's first task, its start-up: CPU seconds since the interpreter started, RSS now)."""
    startup = None
    if not _STARTED:
        _STARTED.append(True)
        startup = {"cpu_seconds": time.process_time(), "rss_mb": rss_mb()}
    return time.process_time(), _numba_compile_seconds(), _numba_jit_seconds(), startup


def task_end(begin: tuple[float, float, float, dict[str, float] | None]) -> dict[str, Any]:
    """What one pool task cost its process (JSON-able; summed by `workers_block`)."""
    import os

    from datakit import allocator

    cpu0, compile0, jit0, startup = begin
    out: dict[str, Any] = {"pid": os.getpid(), "cpu_seconds": time.process_time() - cpu0,
                           "numba_compile": _numba_compile_seconds() - compile0,
                           "numba_jit": _numba_jit_seconds() - jit0, "peak_rss_mb": peak_rss_mb(),
                           "allocator": allocator.in_use()}
    if startup is not None:
        out["startup"] = startup
    return out


def workers_block(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """The `timing.workers` object: pool processes' CPU, numba and start-up, summed over their tasks."""
    startups = [t["startup"] for t in tasks if "startup" in t]
    compile_s = sum(t["numba_compile"] for t in tasks)
    jit_s = sum(t["numba_jit"] for t in tasks)
    return {
        "processes": len({t["pid"] for t in tasks}),
        "tasks": len(tasks),
        "cpu_seconds": round(sum(t["cpu_seconds"] for t in tasks) + sum(s["cpu_seconds"] for s in startups), 3),
        "numba_compile": round(compile_s, 3),
        "numba_load": round(max(0.0, jit_s - compile_s), 3),
        "started": len(startups),
        "startup_cpu_seconds": round(max((s["cpu_seconds"] for s in startups), default=0.0), 3),
        "startup_rss_mb": round(max((s["rss_mb"] for s in startups), default=0.0), 1),
        "peak_rss_mb": round(max((t["peak_rss_mb"] for t in tasks), default=0.0), 1),
        "allocators": sorted({t["allocator"] for t in tasks if "allocator" in t}),
    }


class RunTimer:
    """Wall seconds per phase of one `Pipeline.run`, plus CPU and numba seconds of this process and its pool."""

    def __init__(self) -> None:
        # numba's compile events are summed from the moment datakit.jit is imported (every kernel
        # module imports it first); a run without kernels never imports numba (0.2 CPU-s, 40 MB)
        self._numba0 = _numba_compile_seconds()
        self._jit0 = _numba_jit_seconds()
        self.worker_tasks: list[dict[str, Any]] = []  # pool tasks' costs (the engine hands them over)
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()
        self.parts: dict[str, float] = {}
        self.one_run_process = bool(_ONE_RUN_PROCESS)  # (see one_run_process)
        age = process_age() if self.one_run_process else None
        if age is not None:
            self._t0 -= age  # the total counts from the process's start
            self._cpu0 = 0.0  # and so does its CPU
            self.parts["process_start"] = age

    def add(self, phase: str, seconds: float) -> None:
        if phase not in PHASES + PROCESS_PHASES:
            raise ValueError(f"unknown run phase {phase!r}")
        self.parts[phase] = self.parts.get(phase, 0.0) + max(0.0, seconds)

    def block(self) -> dict[str, Any]:
        """The `timing` object for `_run.json` (seconds rounded to ms; `other` is what no phase measured;
        `allocator`: this process's, which the `datakit` command chooses, `datakit/launch.py`)."""
        from datakit import allocator

        total = time.perf_counter() - self._t0
        parts = {p: round(self.parts.get(p, 0.0), 3) for p in PHASES}
        parts.update({p: round(self.parts[p], 3) for p in PROCESS_PHASES if p in self.parts})
        parts["other"] = round(max(0.0, total - sum(self.parts.values())), 3)
        compile_s = _numba_compile_seconds() - self._numba0
        out = {"total": round(total, 3), "parts": parts,
               "numba_compile": round(compile_s, 3),
               "numba_load": round(max(0.0, _numba_jit_seconds() - self._jit0 - compile_s), 3),
               "cpu_seconds": round(time.process_time() - self._cpu0, 3),
               "peak_rss_mb": round(peak_rss_mb(), 1), "allocator": allocator.in_use()}
        if self.worker_tasks:
            out["workers"] = workers_block(self.worker_tasks)
        return out


def record(run_json: str, timer: RunTimer) -> dict[str, Any]:
    """Add the `timing` block to an existing `_run.json` (atomically); returns the block."""
    import json

    from datakit.io.atomic import write_json_atomic
    from datakit.io.fs import filesystem

    fs, p = filesystem(run_json)
    run = json.loads(fs.cat_file(p))
    run["timing"] = timer.block()
    write_json_atomic(run_json, run)
    return run["timing"]
