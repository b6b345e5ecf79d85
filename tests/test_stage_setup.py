"""The per-worker `setup()` hook (issue #13 item 3): both engines call a batch function's `setup()`
once per worker process and run, before its first batch -- not once per task, never zero times."""
from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pytest

from datakit import CompileContext, Pipeline, StageConfig, register_stage
from datakit.contracts import TRAINING_RECORD_V1
from tests.eventgen import make_event, write_jsonl

SETUP_SLEEP = 0.02


class _NeedsSetup:
    """Refuses to run unless set up; every setup() leaves a file named by its process id."""

    def __init__(self, marks: str) -> None:
        self.marks = marks
        self.ready = False

    def setup(self) -> None:
        time.sleep(SETUP_SLEEP)  # a known set-up cost per process: the stage's `setup_seconds` in _run.json
        self.ready = True
        Path(self.marks, f"{os.getpid()}-{uuid.uuid4().hex}").touch()

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        assert self.ready, "the engine did not call setup() before the first batch"
        return batch


@register_stage
class NeedsSetup(StageConfig):
    kind: Literal["test_needs_setup"] = "test_needs_setup"
    marks: str

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(_NeedsSetup(self.marks), TRAINING_RECORD_V1, name="test_needs_setup")


def _run(tmp_path: Path, **run) -> Counter:
    marks = tmp_path / "marks"
    marks.mkdir()
    files = [write_jsonl(tmp_path / "logs" / f"{i}.jsonl", [make_event(10 * i + j) for j in range(10)])
             for i in range(6)]  # six input files: more tasks than workers
    (Pipeline("setup").input([str(f) for f in files]).add({"kind": "ingest"}).add({"kind": "extract"})
     .add({"kind": "test_needs_setup", "marks": str(marks)}).output(str(tmp_path / "out")).run(**run))
    per_pid = Counter(p.name.split("-")[0] for p in marks.iterdir())
    run_json = json.loads((tmp_path / "out" / "_run.json").read_text())
    stage = next(s for s in run_json["stages"] if s["name"] == "test_needs_setup")
    # every process's set-up is reported, once, apart from the batch seconds (rounded to ms)
    assert stage["setup_seconds"] >= SETUP_SLEEP * len(per_pid) - 0.001, (stage, per_pid)
    return per_pid


def test_local_pool_sets_up_once_per_worker(tmp_path):
    per_pid = _run(tmp_path, workers=2)
    assert per_pid and set(per_pid.values()) == {1} and len(per_pid) <= 2, per_pid


def test_in_process_run_sets_up_once_and_lets_go(tmp_path):
    from datakit.engines import core

    per_pid = _run(tmp_path, workers=1)
    assert per_pid == Counter({str(os.getpid()): 1})
    assert not core._READY  # the driver keeps no set-up functions (models, eval tables) after the run


@pytest.mark.spark
def test_spark_sets_up_once_per_python_worker(spark, tmp_path):
    per_pid = _run(tmp_path, engine="spark", partitions=6)
    assert per_pid and set(per_pid.values()) == {1}, per_pid
