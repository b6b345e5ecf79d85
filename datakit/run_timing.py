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
compiling kernels in this process (pool workers compile their own; not counted here).
"""
from __future__ import annotations

import resource
import sys
import time
from typing import Any

PHASES = ("engine_start", "compile", "stages", "commit", "after_commit")


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (ru_maxrss is KB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024


def _numba_compile_seconds() -> float:
    """Seconds this process spent compiling numba kernels since datakit.jit was imported (0 if it was not)."""
    jit = sys.modules.get("datakit.jit")
    return jit.compile_seconds() if jit is not None else 0.0


class RunTimer:
    """Wall seconds per phase of one `Pipeline.run`, plus process CPU seconds and numba compile seconds."""

    def __init__(self) -> None:
        # numba's compile events are summed from the moment datakit.jit is imported (every kernel
        # module imports it first); a run without kernels never imports numba (0.2 CPU-s, 40 MB)
        self._numba0 = _numba_compile_seconds()
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()
        self.parts: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown run phase {phase!r}")
        self.parts[phase] = self.parts.get(phase, 0.0) + max(0.0, seconds)

    def block(self) -> dict[str, Any]:
        """The `timing` object for `_run.json` (seconds rounded to ms; `other` is what no phase measured)."""
        total = time.perf_counter() - self._t0
        parts = {p: round(self.parts.get(p, 0.0), 3) for p in PHASES}
        parts["other"] = round(max(0.0, total - sum(self.parts.values())), 3)
        return {"total": round(total, 3), "parts": parts,
                "numba_compile": round(_numba_compile_seconds() - self._numba0, 3),
                "cpu_seconds": round(time.process_time() - self._cpu0, 3),
                "peak_rss_mb": round(peak_rss_mb(), 1)}


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
