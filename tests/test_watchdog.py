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
    monkeypatch.setenv("DATAKIT_STALL_SECONDS", "10")
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
    monkeypatch.setenv("DATAKIT_STALL_SECONDS", "10")
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


# a stage whose tasks take ~6 s and beat every second (a healthy, busy worker)
_BUSY_STAGE = '''
import os, time
from typing import Literal
from datakit import StageConfig
from datakit.contracts import EDITOR_EVENT_V1
from datakit.watchdog import beat

class _Busy:
    def __call__(self, batch):
        open(os.path.join(os.environ["DK_TEST_MARKS"], f"task-{os.getpid()}"), "w").close()
        for _ in range(12):
            time.sleep(0.5)
            beat()
        return batch

class Busy(StageConfig):
    kind: Literal["dk_test_busy"] = "dk_test_busy"
    consumes = produces = "editor_event.v1"

    def compile(self, rel, ctx):
        return rel.map_batches(_Busy(), EDITOR_EVENT_V1, name="busy")
'''


@pytest.mark.timeout(300)
def test_ctrl_z_then_fg_is_not_a_stall(tmp_path):
    """Found in an operations review: Ctrl-Z stops the whole process group; after `fg` past the stall floor,
    the watchdog judged the workers' heartbeats from before the stop and killed a healthy worker as stalled.
    Now a poll that comes late (this process did not run either) restarts the clock."""
    import subprocess
    import sys

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "dk_busy_stage.py").write_text(_BUSY_STAGE)
    marks = tmp_path / "marks"
    marks.mkdir()
    logs = _logs(tmp_path, files=2, per=50)
    (tmp_path / "p.yaml").write_text(
        f"name: busy\ninput: {{path: '{logs}'}}\nstages: [{{kind: ingest}}, {{kind: 'dk_busy_stage:Busy'}}]\n"
        f"output: {{path: '{tmp_path / 'out'}', shards: 2}}\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               DK_TEST_MARKS=str(marks), DATAKIT_STALL_SECONDS="8")
    proc = subprocess.Popen([sys.executable, "-m", "datakit.cli", "run", str(tmp_path / "p.yaml"), "--workers", "2",
                             "--no-report"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert len(list(marks.iterdir())) == 2, proc.stderr.read() if proc.poll() is not None else "no tasks started"
        os.killpg(proc.pid, signal.SIGSTOP)  # what Ctrl-Z does to the foreground group
        time.sleep(16)  # twice the stall floor
        os.killpg(proc.pid, signal.SIGCONT)  # `fg`
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    # no worker killed as stalled (a slow-task warning under a loaded machine is not the defect)
    assert "its worker was killed" not in err and "made no progress for" not in err.replace("has made no progress", ""), \
        err[-3000:]


_HANG_STAGE = '''
import os, time
from typing import Literal
from datakit import StageConfig
from datakit.contracts import EDITOR_EVENT_V1

class _Hang:
    def __init__(self, how):
        self.how = how

    def __call__(self, batch):
        if self.how == "python":
            while True:  # a record that makes the function loop
                pass
        if self.how == "swallow":
            try:
                while True:
                    pass
            except BaseException:  # a catch-all stage: the stall is not its verdict
                return batch
        time.sleep(3600)  # native code: the exception cannot surface
        return batch

class Hang(StageConfig):
    kind: Literal["dk_test_hang"] = "dk_test_hang"
    consumes = produces = "editor_event.v1"
    how: str = "python"

    def compile(self, rel, ctx):
        return rel.map_batches(_Hang(self.how), EDITOR_EVENT_V1, name="hang")
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["python", "swallow", "native"])
def test_a_task_stalled_in_this_process_fails_the_run_in_one_line(tmp_path, how):
    """Found in review: tasks run in the command's own process (one worker, a one-file input, any small input)
    had no watchdog: a stage function looping on one record hung the run forever, without a word."""
    import subprocess
    import sys

    (tmp_path / "hangstage.py").write_text(_HANG_STAGE)
    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(20)])
    (tmp_path / "p.yaml").write_text(f"name: h\ninput: {{path: logs}}\nstages: [{{kind: ingest}}, "
                                     f"{{kind: 'hangstage:Hang', how: {how}}}]\noutput: {{path: out}}\n")
    env = {**os.environ, "DATAKIT_STALL_SECONDS": "2", "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    began = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "datakit.cli", "run", "p.yaml", "--workers", "1"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=100)
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert r.returncode == 3 and len(errors) == 1, r.stderr
    assert "made no progress for 2 s in this process" in errors[0] and "> hang'" in errors[0], errors
    if how == "native":
        assert "the task did not stop (native code), so this process ends" in errors[0]
    else:  # the exception surfaced: the engine's own line
        assert "native code" not in errors[0]
    assert time.monotonic() - began < 60
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_finished_setup_is_progress(tmp_path, monkeypatch):
    """Found in review: a task retried on a fresh worker loaded its model, then ran its first batch, and the two
    were judged as one silence (stalled "twice"); a finished setup() now touches the task's heartbeat."""
    from datakit import watchdog
    from datakit.engines.core import worker_fn

    beat_file = tmp_path / "task.beat"
    beat_file.write_text("1 0")
    os.utime(beat_file, (0, 0))
    monkeypatch.setattr(watchdog, "_BEAT", str(beat_file))
    monkeypatch.setattr(watchdog, "_LAST", 0.0)

    class Slow:
        def setup(self):
            pass

        def __call__(self, batch):
            return batch

    worker_fn("test-setup-beat", Slow, "slow")
    assert beat_file.stat().st_mtime > 1_000_000


@pytest.mark.timeout(120)
def test_under_a_host_program_a_task_stuck_in_c_is_said_not_ended(tmp_path, monkeypatch, caplog):
    """Found in review: the guard's last resort (ending the process) would kill a notebook's kernel or a
    scheduler's worker: only the `datakit` command's own process is ended; a library caller gets the error in
    its log, and the run fails once the native call returns."""
    import importlib
    import logging
    import sys

    (tmp_path / "hangstage_c.py").write_text(_HANG_STAGE.replace("time.sleep(3600)", "time.sleep(15)"))
    monkeypatch.syspath_prepend(str(tmp_path))
    Hang = importlib.import_module("hangstage_c").Hang
    # 3 s, not 1: on a loaded CI machine ingest's own first batch (its kernels loaded from the cache) once
    # went 1 s without a beat, and the stall was judged there instead of in the hanging stage
    monkeypatch.setenv("DATAKIT_STALL_SECONDS", "3")
    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(5)])
    p = (Pipeline("h").input(str(tmp_path / "logs")).add({"kind": "ingest"}).add(Hang(how="native"))
         .output(str(tmp_path / "out")))
    with caplog.at_level(logging.ERROR, logger="datakit.watchdog"), pytest.raises(EngineError) as e:
        p.run(workers=1)
    assert "made no progress for 3 s in this process" in str(e.value) and "hang'" in str(e.value), str(e.value)
    assert any("is not datakit's own to end" in r.getMessage() for r in caplog.records)
    sys.modules.pop("hangstage_c", None)


def test_shard_writes_in_this_process_are_not_judged_and_nested_guards_see_beats(tmp_path, monkeypatch):
    """Found in review: a one-shard write runs in this process with long native calls and no heartbeat; it is
    datakit's own work, never a stage looping on a record, so it is not judged (a big shard failed at the floor).
    And a guard inside another one's task: beats reach both."""
    from datakit import watchdog
    from datakit.engines.local.scheduler import run_tasks

    monkeypatch.setenv("DATAKIT_STALL_SECONDS", "1")

    def slow_write(item):
        time.sleep(3)
        return {"rows": 1}

    assert run_tasks(slow_write, [0], "write shards", 1, False, str(tmp_path), guard_here=False) == [{"rows": 1}]

    def beating_inner(item):
        def step(_):
            for _ in range(6):
                time.sleep(0.5)
                watchdog.beat()
            return {"rows": 1}
        return run_tasks(step, [0], "inner", 1, False, str(tmp_path))[0]

    assert run_tasks(beating_inner, [0], "outer", 1, False, str(tmp_path)) == [{"rows": 1}]
