"""The engine core: what both engines share (options, conforming, the drop contract, shard count, run report)."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

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


def test_an_in_process_run_leaves_nothing_frozen(tmp_path):
    """`Engine.execute` freezes what exists before the run and thaws it after: a notebook or script
    that runs pipelines keeps its normal garbage collection."""
    import gc

    from datakit import Pipeline
    from tests.eventgen import make_event, write_jsonl

    gc.unfreeze()
    f = write_jsonl(tmp_path / "l.jsonl", [make_event(i) for i in range(20)])
    Pipeline("gc").input(str(f)).add({"kind": "ingest"}).add({"kind": "extract"}).output(
        str(tmp_path / "o")).run(workers=1)
    assert gc.get_freeze_count() == 0
