"""Progress of long runs: per step (a fused chain of stages, a Spark job), rows, rate and ETA.

Why one reporter for both engines: an operator watching a terminal and a
scheduler collecting log lines want the same facts whichever engine runs.
Engines only say "this step has N tasks" and "a task finished with R rows"
(the local engine per partition task; Spark from its status tracker, rows when
the step's counts are known). The reporter decides how to show it:

- `bar`: rich progress bars on stderr (the default when stderr is a terminal);
- `log`: a log line per finished step and at most one per `interval` seconds
  while it runs (`logging` logger `datakit.progress`; with `--log-format json`
  each is one JSON object with `step`, `tasks_done`, `tasks`, `rows`,
  `rows_per_s`, `eta_s`);
- `off`: nothing (`--quiet`, and library use unless configured).

Lines carry stage names and counts only, never data.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Literal

Mode = Literal["auto", "bar", "log", "off"]
log = logging.getLogger("datakit.progress")

_mode: Mode = "auto"


def configure(mode: Mode = "auto") -> None:
    """Set how engines report progress in this process (the CLI calls this from --quiet/--log-format)."""
    global _mode
    _mode = mode


def resolved_mode(engine_flag: bool | None = None) -> str:
    """`engine_flag` is an engine's own `progress=` option (False: off, True: bar)."""
    if engine_flag is False:
        return "off"
    if engine_flag is True:
        return "bar"
    if _mode == "auto":
        return "bar" if sys.stderr.isatty() else "off"
    return _mode


class Step:
    """One step's counters; `advance` from the engine's driver thread (or a poller)."""

    def __init__(self, label: str, total: int | None, mode: str, interval: float = 10.0) -> None:
        self.label, self.total, self.mode, self.interval = label, total, mode, interval
        self.done = 0
        self.rows = 0
        self.t0 = time.monotonic()
        self._last_log = self.t0
        self._lock = threading.Lock()
        self._bar: Any = None
        self._task: Any = None
        if mode == "bar":
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rows]} rows · {task.fields[rate]}/s"),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(label, total=total, rows="0", rate="-")

    def _rate(self) -> float:
        dt = time.monotonic() - self.t0
        return self.rows / dt if dt > 0 else 0.0

    def _eta(self) -> float | None:
        if not self.total or not self.done:
            return None
        dt = time.monotonic() - self.t0
        return max(0.0, dt / self.done * (self.total - self.done))

    def fields(self) -> dict[str, Any]:
        eta = self._eta()
        return {"step": self.label, "tasks_done": self.done, "tasks": self.total, "rows": self.rows,
                "rows_per_s": round(self._rate(), 1), "eta_s": None if eta is None else round(eta, 1),
                "seconds": round(time.monotonic() - self.t0, 3)}

    def advance(self, tasks: int = 1, rows: int = 0, total: int | None = None) -> None:
        with self._lock:
            self.done += tasks
            self.rows += rows
            if total is not None:
                self.total = total
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done, total=self.total,
                                 rows=f"{self.rows:,}", rate=f"{self._rate():,.0f}")
            elif self.mode == "log" and time.monotonic() - self._last_log >= self.interval:
                self._last_log = time.monotonic()
                f = self.fields()
                eta = "?" if f["eta_s"] is None else f"{f['eta_s']:.0f}s"
                log.info("%s: %s/%s tasks, %s rows, %s rows/s, ETA %s", self.label, f["tasks_done"],
                         f["tasks"] or "?", f["rows"], f["rows_per_s"], eta, extra={"progress": f})

    def finish(self, rows: int | None = None, ok: bool = True) -> None:
        """Close the bar; on success log the step's totals (a failed step is reported by its error)."""
        with self._lock:
            if rows is not None:
                self.rows = rows
            if self._bar is not None:
                self._bar.stop()
                self._bar = None
            if ok and self.total:
                # every task the step needed ran: a Spark stage skipped for a reused shuffle still counts its
                # tasks in the total (found in review: a finished step said 9 of 14 tasks done)
                self.done = max(self.done, self.total)
            if ok and self.mode in ("log", "bar"):
                f = self.fields()
                f["eta_s"] = 0.0
                log.info("%s: done, %s rows in %.2fs (%s rows/s)", self.label, f["rows"], f["seconds"],
                         f["rows_per_s"], extra={"progress": {**f, "done": True}})


def step(label: str, total: int | None = None, engine_flag: bool | None = None, interval: float = 10.0) -> Step:
    return Step(label, total, resolved_mode(engine_flag), interval)


class SparkPoller:
    """Feeds a `Step` from Spark's status tracker (tasks of the jobs of one job group) every `period` s."""

    def __init__(self, sc: Any, group: str, st: Step, period: float = 0.5) -> None:
        self.sc, self.group, self.st, self.period = sc, group, st, period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "SparkPoller":
        if self.st.mode != "off":
            self._thread = threading.Thread(target=self._run, daemon=True, name="datakit-progress")
            self._thread.start()
        return self

    def _run(self) -> None:
        tracker = self.sc.statusTracker()
        while not self._stop.wait(self.period):
            try:
                done = total = 0
                for job in tracker.getJobIdsForGroup(self.group) or []:
                    info = tracker.getJobInfo(job)
                    for sid in (info.stageIds if info else []):
                        s = tracker.getStageInfo(sid)
                        if s is not None:
                            done += s.numCompletedTasks
                            total += s.numTasks
                self.st.advance(tasks=done - self.st.done, total=total or None)
            except Exception:  # the poller must never break a run
                pass

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
