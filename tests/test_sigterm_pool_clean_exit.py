"""The `datakit` command stopped by SIGTERM with its worker pool alive: its own line is the last one.

Found in an operations review (quickstart, 5k events, `--workers 2`, SIGTERM from a scheduler mid-run):
after `datakit: stopped (SIGTERM)` multiprocessing's resource tracker printed

    .../multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear to be 5
    leaked semaphore objects to clean up at shutdown

in 3 of 4 tries (a Ctrl-C never did). `_end_by_sigterm` ended the process by the signal's default action,
which skips the exit handlers a Ctrl-C's normal exit runs, so the pool's queues (still referenced, from
the interrupted run's frames) never released their named semaphores. Plain text after the final status
line, also under `--log-format json`, where a scheduler parses every line.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

_STOPPED_WITH_A_TASK_UNDER_WAY = """
import os, sys, time
from datakit import workers
ex = workers.pool(2)                     # the kept pool, as a run makes it
futures = [ex.submit(time.sleep, 60) for _ in range(2)]  # tasks under way when the signal comes
deadline = time.monotonic() + 60
while (len(ex._processes) < 2 or not all(p.is_alive() for p in ex._processes.values())) and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(1.0)
print(" ".join(str(pid) for pid in ex._processes), flush=True)
from datakit.cli import _end_by_sigterm
_end_by_sigterm()
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_sigterm_with_a_busy_pool_ends_at_once_with_the_commands_own_line():
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", _STOPPED_WITH_A_TASK_UNDER_WAY], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONWARNINGS": "default"})
    took = time.monotonic() - t0
    assert r.returncode == -signal.SIGTERM, r.stderr
    assert "leaked semaphore" not in r.stderr and "resource_tracker" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == ["datakit: stopped (SIGTERM)"], r.stderr
    assert took < 40, f"waited {took:.0f} s for the task under way"  # killed, as a Ctrl-C kills it
    pids = [int(p) for p in r.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
