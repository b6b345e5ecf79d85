"""Batch functions with a Spark SQL twin (`spark_select`, plan.MapBatches): the twin gives the
function's rows on the same input, nulls included, and the Spark engine runs it with no Python pass."""
from __future__ import annotations

import pyarrow as pa
import pytest

from datakit.stages.dedup.history import Project
from datakit.stages.dedup.stage import _SIZE, _DecisionFn, _PairsFn
from datakit.stages.ingest import EventLocations, RepeatedCopies, RepeatedIds

pytestmark = pytest.mark.spark

_STR = pa.string()


def _same_rows(spark, fn, batch: pa.RecordBatch) -> None:
    from pyspark.sql import functions as F

    want = pa.Table.from_batches([fn(batch)])
    got = fn.spark_select(spark.createDataFrame(pa.Table.from_batches([batch])), F).toArrow()
    assert got.schema.names == want.schema.names
    key = lambda t: sorted(t.to_pylist(), key=repr)  # noqa: E731 (Spark does not promise the row order)
    assert key(got.cast(want.schema)) == key(want)
    for f in want.schema:
        assert got.schema.field(f.name).type == f.type, f.name


def test_pairs(spark):
    b = pa.record_batch({"doc_id": pa.array(["a", "b", None, "c", "d"], _STR),
                         "_dk_min": pa.array(["a", "a", "a", None, "b"], _STR)})
    _same_rows(spark, _PairsFn("doc_id", "_dk_min"), b)
    assert _PairsFn("doc_id", "_dk_min")(b).num_rows == 2  # the equal pair and both nulls are left out


@pytest.mark.parametrize("rule", ["similar_to_kept", "component"])
def test_cluster_decision(spark, rule):
    b = pa.record_batch({"node": pa.array(["a", "b", "c", "d", "e"], _STR),
                         "component": pa.array(["a", "a", "a", "d", "e"], _STR),
                         _SIZE: pa.array([3, 3, 3, 1, None], pa.int64()),
                         "dst": pa.array([None, "a", "c", None, None], _STR),
                         "_dk_hcomp": pa.array(["h1", None, "h1", None, None], _STR)})
    _same_rows(spark, _DecisionFn(rule), b)
    _same_rows(spark, _DecisionFn(rule, ("_dk_hcomp",)), b)


def test_project_and_event_locations(spark):
    b = pa.record_batch({"event_id": pa.array(["e1", "e2", None], _STR),
                         "_source_file": pa.array(["s3://b/x.jsonl", None, "f"], _STR),
                         "_source_line": pa.array([7, 3, 123456789012], pa.int64()),
                         "_dk_hrep": pa.array([None, "h", "h"], _STR),
                         "privacy_mode": pa.array([True, None, False], pa.bool_())})
    _same_rows(spark, Project(("event_id", "_dk_hrep")), b)
    _same_rows(spark, EventLocations(), b)
    # a copy in privacy mode sorts first ("0..."), whatever its file and line
    assert EventLocations()(b).column("_loc").to_pylist() == ["0s3://b/x.jsonl\x00000000000007", None,
                                                             "1f\x00123456789012"]


def test_the_ingests_repeated_id_filters(spark):
    ids = pa.record_batch({"event_id": pa.array(["e1", "e2", "e3"], _STR), "_first": pa.array(["a\x00001", "b", "c"], _STR),
                           "_copies": pa.array([1, 3, 2], pa.int64())})
    _same_rows(spark, RepeatedIds(), ids)
    assert RepeatedIds()(ids).column("event_id").to_pylist() == ["e2", "e3"]
    copies = pa.record_batch({"_source_file": pa.array(["f", "f", "g", None], _STR), "_source_line": pa.array([1, 2, 3, 4], pa.int64()),
                              "_loc": pa.array(["f1", "f2", "g3", None], _STR), "_first": pa.array(["f1", "f1", "f1", "f1"], _STR)})
    _same_rows(spark, RepeatedCopies(), copies)
    assert RepeatedCopies()(copies).column("_source_line").to_pylist() == [2, 3]  # the first copy and a null stay out


def _python_chains(monkeypatch) -> list[str]:
    """The names of the functions the Spark engine runs in Python chains (mapInArrow), filled as it runs."""
    from datakit.engines import spark as spark_engine

    chained: list[str] = []
    real = spark_engine._Run._chain

    def record(self, node):
        chained.extend(op.name for op in self._chain_of(node)[1] if isinstance(node, spark_engine.MapBatches))
        return real(self, node)

    monkeypatch.setattr(spark_engine._Run, "_chain", record)
    return chained


def test_the_engine_runs_them_without_a_python_pass(spark, tmp_path, monkeypatch):
    """Dedup's LSH edges, members and cluster decisions run as Spark SQL: no mapInArrow chain holds them,
    and the output is the local engine's (conformance)."""
    from tests.conformance import LOCAL_VARIANTS, assert_conformant, spark_variants
    from tests.stages.test_dedup_stage import NEAR, pipeline, rec, words, write_records

    chained = _python_chains(monkeypatch)
    rows = [rec(f"d{i}", words(0, 100) if i % 3 else words(1000 * i, 1000 * i + 50)) for i in range(12)]
    rows += [rec("x0", words(0, 99) + " tail"), rec("x1", words(0, 100))]
    p = pipeline(write_records(tmp_path / "in", rows), tmp_path / "o", {"exact": True, "minhash": NEAR}, shards=2)
    assert_conformant(p, tmp_path, variants=LOCAL_VARIANTS[:1] + spark_variants((2,)))
    assert "dedup_keys" in chained and "dedup_near" in chained
    assert not {"dedup_lsh_edges", "dedup_members", "dedup_decided"} & set(chained)


def test_the_ingests_duplicate_event_branch_runs_in_the_jvm(spark, tmp_path, monkeypatch):
    """Only the parse runs in Python; the repeated ids and their copies are Spark SQL, and a retried
    event is still dropped as on the local engine."""
    from datakit import Pipeline
    from tests.conformance import LOCAL_VARIANTS, assert_conformant, spark_variants
    from tests.eventgen import make_event, write_jsonl

    chained = _python_chains(monkeypatch)
    write_jsonl(tmp_path / "in" / "a.jsonl", [make_event(i) for i in range(6)])
    # a later copy in privacy mode is the one that stays, on both engines (EventLocations' Spark twin)
    write_jsonl(tmp_path / "in" / "b.jsonl", [make_event(2, suggestion="retried"), make_event(7),
                                              make_event(4, privacy_mode=True)])
    p = Pipeline("dups").input(str(tmp_path / "in")).add({"kind": "ingest"}).output("x", shards=2)
    assert_conformant(p, tmp_path, variants=LOCAL_VARIANTS[:1] + spark_variants((2,)))
    assert chained == ["parse_validate"]
    import json

    run = json.loads((tmp_path / "conf-1-spark" / "_run.json").read_text())
    assert (run["stages"][0]["rows_out"], run["stages"][0]["dropped"]) == (7, {"duplicate_event_id": 2})


class _WrongTwin(_PairsFn):
    def spark_select(self, df, F):
        return df.select(F.col(self.b).alias("dst"), F.col(self.a).alias("src"))  # columns swapped


def test_a_twin_off_its_nodes_schema_fails_the_run_with_its_name(spark, tmp_path, monkeypatch):
    from datakit.stages.dedup import stage as dedup_stage
    from tests.stages.test_dedup_stage import NEAR, pipeline, rec, words, write_records

    monkeypatch.setattr(dedup_stage, "_PairsFn", _WrongTwin)
    inp = write_records(tmp_path / "in", [rec("a", words(0, 100)), rec("b", words(0, 99) + " x")])
    with pytest.raises(ValueError, match=r"_WrongTwin.spark_select gave columns \['dst', 'src'\]; the node "
                                         r"'dedup_lsh_edges' declares \['src', 'dst'\]"):
        pipeline(inp, tmp_path / "o", {"exact": True, "minhash": NEAR}).run(engine="spark", master="local[2]")
