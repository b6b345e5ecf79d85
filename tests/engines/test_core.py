"""The engine core: what both engines share (options, conforming, the drop contract, shard count, run report)."""
from __future__ import annotations

import json
import weakref
from typing import Literal

import pyarrow as pa
import pytest

from datakit import CompileContext, StageConfig, register_stage
from datakit.contracts import TRAINING_RECORD_V1
from datakit.engines import EngineOptionError, get_engine
from datakit.engines import core
from datakit.plan import DROP, METRICS, SinkSpec


def test_unknown_engine_option_is_one_clear_error():
    with pytest.raises(EngineOptionError) as e:
        get_engine("local", wokers=2)
    msg = str(e.value)
    assert "\n" not in msg and "'wokers'" in msg and "workers" in msg
    with pytest.raises(EngineOptionError, match="no option 'partitions'"):
        get_engine("local", partitions=3)  # a Spark option given to the local engine
    with pytest.raises(EngineOptionError, match="no option 'wrokers'"):
        get_engine("spark", wrokers=2)  # raised before pyspark is even imported
    with pytest.raises(EngineOptionError, match="unknown engine 'quantum'"):
        get_engine("quantum")
    assert get_engine("local", workers=1).workers == 1


@pytest.mark.parametrize("engine, options, needle", [
    ("local", {"keep_work": "no"}, "keep_work must be True or False, not str"),
    ("local", {"keep_work": 1}, "keep_work must be True or False, not int"),
    ("local", {"progress": "sure"}, "progress must be True or False or None, not str"),
    ("local", {"work_dir": 123}, "work_dir must be a folder path (str or os.PathLike), not int"),
    ("local", {"work_dir": b"w"}, "work_dir must be a folder path (str or os.PathLike), not bytes"),
    ("spark", {"master": 4}, "master must be a Spark master URL (str), not int"),
    ("spark", {"conf": "spark.x=1"}, "conf must be a dict of settings, not str"),
    ("spark", {"conf": {1: "x"}}, "conf: setting names must be strings, not int"),
    ("spark", {"checkpoint_dir": 5}, "checkpoint_dir must be a folder path (str or os.PathLike), not int"),
])
def test_engine_option_of_the_wrong_type_is_one_clear_error(engine, options, needle):
    """Found in a Python API review: the local engine checked `workers` but took `keep_work="no"` (truthy:
    the raw spill before scrub_pii stayed under the published dataset's _work/), `progress="sure"` and
    `work_dir=123`. Each is refused when the engine is built, before any work (Spark: before a session)."""
    import sys

    spark_loaded = "pyspark" in sys.modules
    with pytest.raises(EngineOptionError) as e:
        get_engine(engine, **options)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert spark_loaded or "pyspark" not in sys.modules  # no session, not even pyspark's import


def test_engine_folder_and_flag_options_take_their_types(tmp_path):
    eng = get_engine("local", workers=1, work_dir=tmp_path / "w", progress=None, keep_work=True)
    assert (eng.work_dir, eng.progress, eng.keep_work) == (str(tmp_path / "w"), None, True)
    assert get_engine("spark", checkpoint_dir=tmp_path / "c", conf={"spark.ui.enabled": "false"}).checkpoint_dir \
        == str(tmp_path / "c")


def test_cli_run_with_unknown_engine_exits_2(tmp_path):
    from typer.testing import CliRunner

    from datakit.cli import app

    pf = tmp_path / "p.yaml"
    pf.write_text("input: {path: nothing}\n")
    r = CliRunner().invoke(app, ["run", str(pf), "--engine", "quantum"])
    assert r.exit_code == 2 and "unknown engine" in r.output


def test_apply_map_splits_drops_metrics_and_conforms():
    schema = pa.schema([("doc_id", pa.string()), ("n", pa.int64())])

    def fn(b):
        return b.append_column(DROP, pa.array([None, "too_long", None], pa.string())).append_column(
            METRICS, pa.array(['{"x": 1}', None, '{"x": 2}'], pa.string()))

    batch = pa.RecordBatch.from_pydict({"doc_id": ["a", "b", "c"], "n": pa.array([1, 2, 3], pa.int32()),
                                        "extra": [1, 2, 3]})
    r = core.apply_map(fn, batch, schema, "s", "op")
    assert r.kept.schema == schema and r.kept.column("doc_id").to_pylist() == ["a", "c"]
    assert r.dropped.column("doc_id").to_pylist() == ["b"]
    assert r.drops == {"too_long": 1} and r.metrics == {"x": 3}
    keep_all = core.apply_map(lambda b: b, batch, schema, "s", "op")
    assert keep_all.dropped is None and keep_all.kept.num_rows == 3 and not keep_all.drops


def test_side_rows_have_the_side_output_schemas():
    rows = pa.RecordBatch.from_pydict({"doc_id": ["d1"], DROP: ["r"], "_source_line": pa.array([7], pa.int32())})
    q = core.quarantine_rows("ingest", rows)
    assert q.schema == core.QUARANTINE_SCHEMA and q.to_pylist()[0]["source_line"] == 7
    d = core.droplog_rows("dedup", "doc_id", rows)
    assert d.schema == core.DROPLOG_SCHEMA and d.to_pylist() == [
        {"stage": "dedup", "key": "d1", "reason": "r", "detail": None}]


@pytest.mark.parametrize("shards,rows,want", [(3, 10**9, 3), (0, 0, 1), (0, 10, 1), (0, 250_001, 3)])
def test_shard_count(shards, rows, want):
    spec = SinkSpec(path="x", shards=shards, key="doc_id", options={"rows_per_shard": 100_000})
    assert core.shard_count(spec, rows) == want
    assert core.resolve_sink(spec, rows).shards == want


def test_run_report_has_the_common_shape(tmp_path):
    """Both engines write `_run.json` through `core.commit_run`: the keys are the same, engine facts go in
    `runtime` (the Spark side is covered by the conformance test reading the Spark report)."""
    from datakit import Pipeline
    from tests.eventgen import make_event, write_jsonl

    write_jsonl(tmp_path / "logs" / "a.jsonl.zst", [make_event(i) for i in range(5)])
    Pipeline("t").input(str(tmp_path / "logs")).add({"kind": "ingest"}).output(str(tmp_path / "o")).run(workers=1)
    run = json.loads((tmp_path / "o" / "_run.json").read_text())
    assert set(run) == {"run_report_version", "engine", "pipeline", "pipeline_hash", "stages", "output",
                        "resume", "runtime", "seconds", "timing"}
    assert run["runtime"] == {"workers": 1} and run["resume"] == {"reused_tasks": 0}


class _CyclicStageFn:
    """A set-up stage function holding a reference cycle (spaCy's pipeline objects do)."""

    def setup(self) -> None:
        self.me = self

    def __call__(self, batch):
        return batch


def test_set_up_functions_are_frozen_out_of_collections_and_a_new_run_gets_their_cycles_freed():
    """`worker_fn` freezes what a stage set up (full collections stop walking a worker's models); the
    next run's first function hands the old run's objects back and collects them, so a kept pool
    worker does not keep an old run's cycles forever."""
    import gc
    import weakref

    core._READY.clear()
    gc.unfreeze()
    first = _CyclicStageFn()
    alive = weakref.ref(first)
    assert core.worker_fn("run-a:op", lambda: first) is first
    assert gc.get_freeze_count() > 0
    del first
    gc.collect()
    assert alive() is not None  # held by _READY (and frozen)
    core.worker_fn("run-b:op", _CyclicStageFn)
    assert alive() is None  # dropped with its run, thawed and collected although it was a cycle
    core._READY.clear()
    core._thaw()


class _CyclicModel:
    """What a stage's `setup()` loads, holding a reference cycle, counted alive through `_MODELS`."""

    def __init__(self) -> None:
        self.me = self
        _MODELS.append(weakref.ref(self))


_MODELS: list = []


class _StageWithCyclicModel:
    def setup(self) -> None:
        self.model = _CyclicModel()

    def __call__(self, batch):
        return batch


@register_stage
class _CyclicModelStage(StageConfig):
    kind: Literal["test_cyclic_model"] = "test_cyclic_model"

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(_StageWithCyclicModel(), TRAINING_RECORD_V1, name="test_cyclic_model")


def _in_process_run(tmp_path, name: str) -> None:
    from datakit import Pipeline
    from tests.eventgen import make_event, write_jsonl

    f = write_jsonl(tmp_path / f"{name}.jsonl", [make_event(i) for i in range(20)])
    (Pipeline(name).input(str(f)).add({"kind": "ingest"}).add({"kind": "extract"})
     .add({"kind": "test_cyclic_model"}).output(str(tmp_path / name)).run(workers=1))


def test_in_process_runs_leave_nothing_frozen_and_free_each_others_models(tmp_path):
    """A notebook or script that runs pipelines one after another: after each run nothing of ours is
    frozen, and an old run's model (a reference cycle) is collected by the next run at the latest,
    never frozen with it (which kept every run's model alive: RSS grew by one model per run)."""
    import gc

    gc.unfreeze()
    _MODELS.clear()
    for k in range(3):
        _in_process_run(tmp_path, f"run{k}")
        assert gc.get_freeze_count() == 0
    assert sum(ref() is not None for ref in _MODELS) <= 1, "earlier runs' models are still alive"


def test_a_process_that_froze_its_own_objects_keeps_them_frozen(tmp_path):
    """gc.freeze is not counted: a pre-fork server's own freeze must survive a pipeline run in it."""
    import gc

    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        _in_process_run(tmp_path, "app")
        assert gc.get_freeze_count() > 0.9 * frozen  # (a few of its objects were freed by reference counting)
    finally:
        gc.unfreeze()
