"""A stalled local worker (SIGSTOP: alive, stuck) no longer hangs the run (issue 18): its task is
re-dispatched and the run finishes with the right counts; the same task stalling again fails the run
with one line naming it. Bounded by the pytest timeout below, never by luck."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from datakit import Pipeline
from datakit.engines.local import EngineError
from tests.eventgen import make_event, write_jsonl


def _logs(root: Path, files: int = 6, per: int = 1500) -> Path:
    for f in range(files):
        write_jsonl(root / "logs" / f"part-{f}.jsonl", [make_event(f * per + i) for i in range(per)])
    return root / "logs"


def _beats(out: Path) -> list[Path]:
    return sorted(out.glob("_work/*/_beats/task-*.beat"))


def _stop_running_task(out: Path, skip: set[int], deadline: float) -> tuple[int, Path] | None:
    """SIGSTOP the worker of the first task that has announced itself (and is not a pid in `skip`)."""
    while time.time() < deadline:
        for b in _beats(out):
            try:
                pid = int(b.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            if pid not in skip:
                os.kill(pid, signal.SIGSTOP)
                return pid, b
        time.sleep(0.02)
    return None


def _cleanup(pids: list[int]) -> None:
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _run_in_thread(p: Pipeline) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def go() -> None:
        try:
            box["result"] = p.run(workers=2)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            box["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, box


@pytest.mark.timeout(400)
def test_stopped_worker_task_is_redispatched_and_the_run_finishes(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAKIT_STALL_SECONDS", "20")
    logs = _logs(tmp_path)
    out = tmp_path / "out"
    p = Pipeline("stall").input(str(logs)).add({"kind": "ingest"}).output(str(out), shards=2)
    t, box = _run_in_thread(p)
    stopped = _stop_running_task(out, set(), time.time() + 240)
    try:
        assert stopped is not None, "no task started"
        t.join(300)
        assert not t.is_alive(), "the run hung on a stopped worker"
    finally:
        _cleanup([stopped[0]] if stopped else [])
    assert "error" not in box, box.get("error")
    st = box["result"].stage("ingest")
    assert (st["rows_in"], st["rows_out"]) == (9000, 9000)


@pytest.mark.timeout(400)
def test_a_task_stalling_twice_fails_in_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAKIT_STALL_SECONDS", "20")
    logs = _logs(tmp_path, files=3)
    out = tmp_path / "out"
    p = Pipeline("stall2").input(str(logs)).add({"kind": "ingest"}).output(str(out), shards=2)
    t, box = _run_in_thread(p)
    pids: list[int] = []
    try:
        first = _stop_running_task(out, set(), time.time() + 240)
        assert first is not None, "no task started"
        pids.append(first[0])
        # the watchdog kills it and dispatches the task again: stop the new attempt of that same task
        deadline = time.time() + 240
        while time.time() < deadline:
            try:
                pid = int(first[1].read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pid = first[0]
            if pid != first[0]:
                os.kill(pid, signal.SIGSTOP)
                pids.append(pid)
                break
            time.sleep(0.02)
        assert len(pids) == 2, "the stalled task was not dispatched again"
        t.join(300)
        assert not t.is_alive(), "the run hung on a stopped worker"
    finally:
        _cleanup(pids)
    err = box.get("error")
    assert isinstance(err, EngineError), err
    msg = str(err)
    assert "\n" not in msg and "made no progress" in msg and "part-" in msg and "twice" in msg
