"""The Spark Python workers' stall guard (engines/spark_stall.py), in this process: no Spark needed.

The end-to-end cases (a stage hanging in Python, in C, or swallowing the exception, on local[2]) are in
test_spark_errors.py; this checks the guard's own rules."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from datakit.engines import spark_stall
from datakit.engines.spark_stall import StalledBatchError, stall_seconds


@pytest.fixture(autouse=True)
def guard_off_after_each_test():
    """The guard of this (test) process is turned off after each test, its watcher process with it."""
    yield
    spark_stall.start(0)


def test_the_limit_comes_from_the_setting_then_the_environment(monkeypatch):
    monkeypatch.delenv("DATAKIT_STALL_SECONDS", raising=False)
    assert stall_seconds() == 300.0 and stall_seconds("") == 300.0
    monkeypatch.setenv("DATAKIT_STALL_SECONDS", "42")
    assert stall_seconds() == 42.0 and stall_seconds("7.5") == 7.5 and stall_seconds("0") == 0.0
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(ValueError, match="must be a number of seconds"):
            stall_seconds(bad)
    monkeypatch.setenv("DATAKIT_STALL_SECONDS", "later")
    with pytest.raises(ValueError, match="DATAKIT_STALL_SECONDS must be a number of seconds"):
        stall_seconds()


def test_a_span_over_the_limit_raises_in_its_thread_and_one_within_it_does_not():
    spark_stall.start(0.5)
    with spark_stall.watching("quick work"):
        time.sleep(0.1)
    t = time.monotonic()
    with pytest.raises(StalledBatchError, match=r"stuck work made no progress for \d+ s on one batch"):
        with spark_stall.watching("stuck work"):
            while time.monotonic() - t < 30:
                sum(range(100))
    assert time.monotonic() - t < 10
    with spark_stall.watching("after a stall, the guard still lets quick work through"):
        time.sleep(0.1)


def test_watched_times_each_wait_for_the_next_item():
    spark_stall.start(0.5)

    def slow():
        yield 1
        t = time.monotonic()
        while time.monotonic() - t < 30:  # a read that never returns
            sum(range(100))
        yield 2

    got = []
    with pytest.raises(StalledBatchError, match="reading f.jsonl made no progress"):
        for x in spark_stall.watched(slow(), "reading f.jsonl"):
            got.append(x)
            time.sleep(0.8)  # the consumer's own time between items is not the reader's
    assert got == [1]


def test_a_span_that_swallowed_the_exception_still_fails():
    """Found in review: a stage that catches every exception swallowed the guard's, finished its batch and
    the task succeeded, its output depending on when the limit fell. The span fails when it closes."""
    spark_stall.start(0.3)
    t = time.monotonic()
    with pytest.raises(StalledBatchError, match="catching work made no progress"):
        with spark_stall.watching("catching work"):
            caught = 0
            while time.monotonic() - t < 2 and not caught:
                try:
                    sum(range(100))
                except Exception:  # noqa: BLE001 - what such a stage does
                    caught += 1
    with spark_stall.watching("the next span is not failed for the last one's stall"):
        pass


_STOPPING = """
import os, signal, sys, time
from datakit.engines import spark_stall
spark_stall.start(1)  # the limit: 1 s; the watcher ends a worker with no beat for 1 + 5 s (the grace)
time.sleep(float(sys.argv[1]))  # a worker idle between tasks still beats
if sys.argv[2] == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)  # no thread of this process runs any more
    time.sleep(60)
print("done")
"""


@pytest.mark.parametrize("how", ["idle", "stop"])
def test_a_stopped_worker_is_ended_by_its_watcher_and_an_idle_one_is_not(tmp_path, how):
    """Found in review: a Python worker stopped with SIGSTOP held its task (and the job) for 9 minutes with
    spark.datakit.stallSeconds=20: the guard thread stopped with it. A watcher process beside the worker
    ends it when its heartbeat stops, and writes why to pyspark's fault-handler file."""
    import os
    import subprocess
    import sys

    fh = tmp_path / "fh"
    fh.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PYTHON_FAULTHANDLER_DIR": str(fh)}
    p = subprocess.run([sys.executable, "-c", _STOPPING, "8" if how == "idle" else "0.5", how], env=env,
                       capture_output=True, text=True, timeout=60)
    if how == "idle":
        assert p.returncode == 0 and p.stdout.strip() == "done", p.stderr
        assert list(fh.iterdir()) == []
        return
    assert p.returncode == -9, (p.returncode, p.stderr)
    [report] = list(fh.iterdir())
    assert "StalledBatchError: this Python worker made no progress at all for 6 s" in report.read_text()
