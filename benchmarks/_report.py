"""What every benchmark hands to `run_all.py`: like-for-like comparisons as ratios, in one JSON shape.

Why one shape: `make bench` prints a single table of every comparison and regenerates README's
Performance section from it, so a number in the README is always one a script printed, with the
conditions it was measured under beside it.

A comparison is like for like when both sides get the same input, the same warm-up (one untimed
run each), the same number of timed runs (the median is kept), the same threads, and are checked
to do the same work (`same_work`: bit-identical signatures, equal token ids, overlapping removed
sets...). `timed()` is the one timing loop all benchmarks use.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

RESULTS = Path(__file__).resolve().parent / "results"


def timed(fn: Callable[[], Any], runs: int = 3, warmup: int = 1, clock: Callable[[], float] = time.perf_counter
          ) -> float:
    """Median seconds of `runs` timed calls after `warmup` untimed ones (the same for both sides)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def timed_alternated(fns: dict[str, Callable[[], Any]], runs: int = 3, warmup: int = 1,
                     clock: Callable[[], float] = time.process_time) -> dict[str, float]:
    """Median seconds of each function over `runs` rounds, the functions alternated within a round, after
    `warmup` untimed rounds: a load that comes and goes on a shared machine hits every side alike
    (`timed` runs one side's runs back to back). CPU time by default: the sides run in this process,
    one thread each."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            t0 = clock()
            fn()
            times[k].append(clock() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def comparison(name: str, ours: float, reference: float, unit: str, reference_name: str,
               same_work: str, conditions: str, higher_is_better: bool = True) -> dict[str, Any]:
    """One row: `ratio` > 1 means ours is better (faster, or smaller when not higher_is_better)."""
    ratio = ours / reference if higher_is_better else reference / ours
    return {"name": name, "ours": round(ours, 4), "reference": round(reference, 4), "unit": unit,
            "reference_name": reference_name, "ratio": round(ratio, 2), "same_work": same_work,
            "conditions": conditions}


def write(bench: str, comparisons: list[dict[str, Any]], extra: dict[str, Any] | None = None,
          path: str | None = None, measurements: list[dict[str, Any]] | None = None) -> Path:
    """Save this benchmark's comparisons (and any detail) for run_all.py.

    `measured_at` (Unix seconds) lets run_all.py keep only what the run it started wrote: a
    benchmark that crashed must not leave last week's numbers in today's table."""
    out = Path(path) if path else RESULTS / f"{bench}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": bench, "cpus": len(os.sched_getaffinity(0)), "comparisons": comparisons,
           "detail": extra or {}, "measured_at": round(time.time(), 1)}
    if measurements:
        doc["measurements"] = measurements
    out.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    return out
