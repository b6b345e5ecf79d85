"""How the Spark engine lays work out on the cluster (issue 21): each output shard is its own task,
and no relation is broadcast on the planner's size guess (checkpoints inherit the file list's)."""
from __future__ import annotations

import pyarrow as pa
import pytest

from datakit.engines import spark as spark_engine

pytestmark = pytest.mark.spark


def test_each_shard_is_one_partition(spark):
    from pyspark.sql import functions as F

    for shards in (2, 5):
        df = spark.range(2000).select((F.col("id") % shards).alias(spark_engine.SHARD_COL), F.col("id"))
        laid = spark_engine.one_shard_per_partition(df, shards).select(
            spark_engine.SHARD_COL, F.spark_partition_id().alias("p")).distinct().collect()
        # every partition holds one shard, shard i in partition i (hash partitioning put 0 and 1 of 2 together)
        assert sorted((r["p"], r[spark_engine.SHARD_COL]) for r in laid) == [(i, i) for i in range(shards)]


def _rows_per_task(df) -> list[int]:
    """Rows of each partition of `df` as its tasks see them (a mapInArrow: `spark_partition_id()` over a
    local relation is evaluated on the driver, in one partition)."""
    return [r["n"] for r in df.mapInArrow(lambda it: iter([pa.record_batch({"n": [sum(b.num_rows for b in it)]})]),
                                          "n long").collect()]


def test_local_rows_are_split_in_the_runs_partition_count(spark):
    """The Source's file list and the sink's shard-part tasks are local relations: Spark scans one in
    min(rows, spark.sql.leafNodeDefaultParallelism) partitions, which defaults to the cores (2 here), so
    a run planned with 7 partitions read its input in 2 tasks. The run sets it to its partition count."""
    files = [f"f{i}" for i in range(20)]
    assert _rows_per_task(spark_engine._file_slices(spark, files)) == [10, 10]  # the default: the cores
    run = spark_engine._Run.__new__(spark_engine._Run)
    run.engine, run.n = type("_Eng", (), {"partitions": 7})(), 7
    with spark_engine._runtime_conf(spark, run.runtime_conf()):
        assert _rows_per_task(spark_engine._file_slices(spark, files)) == [2, 3, 3, 3, 3, 3, 3]
        assert _rows_per_task(spark_engine._file_slices(spark, files[:3])) == [1, 1, 1]
        # the sink's shard-part tasks: one row per shard, the setting raised to the shard count
        with spark_engine._runtime_conf(spark, {spark_engine.LEAF_PARALLELISM: "9"}):
            assert _rows_per_task(spark_engine.local_rows(spark, pa.table({"shard": list(range(9))}))) == [1] * 9


def _big_rows(batches):
    for b in batches:
        for path in b.column("path").to_pylist():
            yield pa.record_batch({"doc_id": [f"{path}-{i}" for i in range(20_000)], "text": ["x" * 500] * 20_000})


def test_materialized_relations_are_not_broadcast_on_a_size_guess(spark):
    """A chain over the file list (a few bytes, as our Source) makes ~20 MB of rows; the planner's
    estimate of its checkpoint is the file list's size, so by default Spark broadcast it."""
    files = spark.createDataFrame(pa.table({"path": ["a", "b"]}))
    big = files.mapInArrow(_big_rows, "doc_id string, text string").localCheckpoint(eager=False)
    small = spark.range(100).selectExpr("concat('a-', cast(id as string)) as src").localCheckpoint(eager=False)
    assert big.count() == 40_000 and small.count() == 100

    def plan(conf: dict[str, str]) -> str:
        with spark_engine._runtime_conf(spark, conf):
            joined = small.join(big, small.src == big.doc_id)
            assert joined.count() == 100
            return joined._jdf.queryExecution().executedPlan().toString()  # the static plan

    default_guess = plan({})
    assert "BuildRight" in default_guess and "BroadcastExchange" in default_guess  # the 20 MB side, broadcast
    ours = plan(dict(spark_engine.BROADCAST_DEFAULTS))
    # nothing broadcast on a guess; adaptive execution may still broadcast a side it measured small
    assert "BroadcastExchange" not in ours and "SortMergeJoin" in ours


def test_a_users_broadcast_setting_is_left_alone():
    class _Eng:
        partitions = None

    run = spark_engine._Run.__new__(spark_engine._Run)
    run.engine, run.n = _Eng(), 4
    assert run.runtime_conf()["spark.sql.autoBroadcastJoinThreshold"] == "-1"
    for key in spark_engine.BROADCAST_CONF:
        conf = run.runtime_conf({key: "50MB"})
        assert not set(spark_engine.BROADCAST_CONF) & set(conf)


def _records_pipeline(tmp_path, kind: str, records: int = 20, shards: int = 1, **options):
    """A pipeline of one user stage `kind` over `records` training records in a Parquet file."""
    import pyarrow.parquet as pq

    from datakit import Pipeline
    from tests.test_local_barriers import _records

    src = tmp_path / "in" / "records.parquet"
    src.parent.mkdir()
    pq.write_table(_records(records), src)
    return (Pipeline(kind).input(str(src), format="parquet", schema="training_record.v1")
            .add({"kind": kind, **options}).output(str(tmp_path / "o"), shards=shards))


class _Keyed:
    """doc_id, a key that is null on every 5th record, and a number: the input of the group statistics."""

    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        ids = b.column("doc_id").to_pylist()
        keys = [None if int(d) % 5 == 0 else f"k{int(d) % 4}" for d in ids]
        return pa.RecordBatch.from_arrays([b.column("doc_id"), pa.array(keys, pa.string()),
                                           pa.array([int(d) for d in ids], pa.int64())], names=["doc_id", "key", "n"])


class _Meta:
    """The group statistics of each record, as its `meta` JSON (records without a match are gone)."""

    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        import json

        meta = [json.dumps(r, sort_keys=True) for r in b.select(["key", "cnt", "tot", "lo", "hi"]).to_pylist()]
        return pa.RecordBatch.from_arrays([b.column("doc_id"), pa.array(meta)], names=["doc_id", "stats"])


class _SetMeta:
    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        import pyarrow.compute as pc

        meta = pc.coalesce(b.column("stats"), b.column("meta"))  # no statistics: the record's own meta
        return b.set_column(b.schema.get_field_index("meta"), "meta", meta).drop_columns(["stats"])


def test_a_join_with_its_own_aggregate_runs_as_one_window_with_the_same_rows(spark, tmp_path, monkeypatch):
    """Join(inner, R, Aggregate(R by K), on K) -- dedup's "smallest id per key on every row" -- is one
    window on Spark; nulls in K drop the row as the join does; every aggregate op gives the local value."""
    from typing import Literal


    from datakit import CompileContext, StageConfig, register_stage
    from datakit.contracts import TRAINING_RECORD_V1
    from tests.conformance import LOCAL_VARIANTS, assert_conformant, spark_variants

    @register_stage
    class GroupStats(StageConfig):
        kind: Literal["test_group_stats"] = "test_group_stats"

        def compile(self, rel, ctx: CompileContext):
            keyed = rel.map_batches(_Keyed(), pa.schema([("doc_id", pa.string()), ("key", pa.string()),
                                                         ("n", pa.int64())]), name="keyed")
            stats = keyed.aggregate(["key"], {"cnt": ("count", "doc_id"), "tot": ("sum", "n"),
                                              "lo": ("min", "doc_id"), "hi": ("max", "doc_id")})
            per_row = keyed.join(stats, "key").map_batches(
                _Meta(), pa.schema([("doc_id", pa.string()), ("stats", pa.string())]), name="meta")
            return rel.join(per_row, "doc_id", how="left").map_batches(_SetMeta(), TRAINING_RECORD_V1, name="set_meta")

    windows = []
    real = spark_engine._Run._join_own_aggregate
    monkeypatch.setattr(spark_engine._Run, "_join_own_aggregate",
                        lambda self, node: windows.append(node.id) or real(self, node))
    p = _records_pipeline(tmp_path, "test_group_stats", records=40, shards=2)
    assert_conformant(p, tmp_path, variants=LOCAL_VARIANTS[:1] + spark_variants((2,)))
    assert windows  # the Spark run took the window path
    import json

    from datakit.io.dataset import read_output

    rows = [json.loads(r["meta"]) for r in read_output(str(tmp_path / "conf-0-local")).select(["meta"]).to_pylist()]
    assert sum("key" in r for r in rows) == 32  # the 8 records with a null key matched no group
    k1 = [r for r in rows if r.get("key") == "k1"]
    ids = [i for i in range(40) if i % 5 and i % 4 == 1]
    assert k1[0] == {"key": "k1", "cnt": len(ids), "tot": sum(ids), "lo": f"{min(ids):04d}", "hi": f"{max(ids):04d}"}


class _Same:
    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        return b


class _CountColumns:
    """doc_id and how many columns this function was handed (it promises to read only doc_id)."""

    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([b.column("doc_id"), pa.array([b.num_columns] * b.num_rows, pa.int64())],
                                          names=["doc_id", "ncols"])


class _ColumnsAsMeta:
    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        import pyarrow.compute as pc

        meta = pc.cast(b.column("ncols"), pa.string())
        return b.set_column(b.schema.get_field_index("meta"), "meta", meta).drop_columns(["ncols"])


def _records_and_their_column_counts(rel):
    """(the records, materialized because two nodes read them; (doc_id, how many columns the counting
    function was given) of each, from a function that promises to read doc_id only)."""
    from datakit.contracts import TRAINING_RECORD_V1

    base = rel.map_batches(_Same(), TRAINING_RECORD_V1, name="same")
    counted = base.map_batches(_CountColumns(), pa.schema([("doc_id", pa.string()), ("ncols", pa.int64())]),
                               name="count_columns", reads=("doc_id",))
    return base, counted


def test_a_function_that_reads_few_columns_is_handed_only_those(spark, tmp_path):
    """MapBatches(reads=...) on a materialized relation: Spark ships just those columns to Python, the local
    engine reads just those from its spill
    (ingest's duplicate-id side branch reads 3 columns of whole events: 1.75-2.0 s -> 0.86 s at 100k)."""
    from typing import Literal


    from datakit import CompileContext, StageConfig, register_stage
    from datakit.contracts import TRAINING_RECORD_V1
    from datakit.io.dataset import read_output

    @register_stage
    class CountColumns(StageConfig):
        kind: Literal["test_count_columns"] = "test_count_columns"

        def compile(self, rel, ctx: CompileContext):
            base, counted = _records_and_their_column_counts(rel)
            return base.join(counted, "doc_id", how="left").map_batches(_ColumnsAsMeta(), TRAINING_RECORD_V1,
                                                                        name="as_meta")

    p = _records_pipeline(tmp_path, "test_count_columns")
    p.run(engine="spark", partitions=2, output=str(tmp_path / "spark"))
    assert set(read_output(str(tmp_path / "spark")).column("meta").to_pylist()) == {"1"}
    # the local engine reads just those columns of the materialized relation's spill files too
    p.run(engine="local", workers=1, output=str(tmp_path / "local"))
    assert set(read_output(str(tmp_path / "local")).column("meta").to_pylist()) == {"1"}


class _WorkerFactAsMeta:
    """Each record's meta: a fact of the Python worker that ran it (`fact` names it)."""

    def __init__(self, fact: str) -> None:
        self.fact = fact

    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        import os

        from datakit import allocator

        seen = (allocator.in_use() if self.fact == "allocator"
                else f"{os.environ.get('RAYON_NUM_THREADS')}/{os.environ.get('OMP_NUM_THREADS')}")
        return b.set_column(b.schema.get_field_index("meta"), "meta", pa.array([seen] * b.num_rows, pa.string()))


def _worker_facts(tmp_path, fact: str) -> set[str]:
    """The `fact` of every Spark Python worker that ran a record of a small pipeline."""
    from typing import Literal

    from datakit import CompileContext, StageConfig, register_stage
    from datakit.contracts import TRAINING_RECORD_V1
    from datakit.io.dataset import read_output

    kind = f"test_worker_{fact}"

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(_WorkerFactAsMeta(fact), TRAINING_RECORD_V1, name=fact)

    # a real Literal object (a string annotation could not see `kind`)
    register_stage(type(f"Worker_{fact}", (StageConfig,),
                        {"__annotations__": {"kind": Literal[kind]}, "kind": kind, "compile": compile}))
    p = _records_pipeline(tmp_path, kind)
    p.run(engine="spark", partitions=2, output=str(tmp_path / "spark"))
    return set(read_output(str(tmp_path / "spark")).column("meta").to_pylist())


def test_python_workers_tokenize_with_their_tasks_cores(spark, tmp_path):
    """A Python worker's tokenizer pool is sized to its task's cores (Spark's OMP_NUM_THREADS =
    spark.task.cpus), not to every core of the machine in every worker (cores x cores spinning threads)."""
    import os

    if "RAYON_NUM_THREADS" in os.environ:
        pytest.skip("RAYON_NUM_THREADS is set for the whole test run: the operator's setting wins")
    assert _worker_facts(tmp_path, "threads") == {"1/1"}  # local[2]: 1 core a task


def test_local_python_workers_have_the_local_engines_allocator(spark, tmp_path):
    """A local master's Python workers run this interpreter on this machine: they get the pool
    workers' mimalloc too (spark.executorEnv.LD_PRELOAD), so the engines tokenize at the same cost."""
    import os
    import sys

    from datakit import allocator

    if not sys.platform.startswith("linux") or allocator.mimalloc_library() is None:
        pytest.skip("LD_PRELOAD and the cmeel-mimalloc wheel are Linux-only")
    if os.environ.get("LD_PRELOAD") or os.environ.get(allocator.ENV_VAR) == "system":
        pytest.skip("the test run chose its own allocator")
    (seen,) = _worker_facts(tmp_path, "allocator")
    assert seen.startswith("mimalloc 3.")


def test_shard_of_a_key_hash_in_the_jvm_is_the_sinks_rule(spark):
    """`shard_of_hash` (the JVM's modulo of the root chain's signed key hash) gives `sinks.shard_ids`'s
    shard for every key: negative and non-negative hashes, shard counts that divide 2**64 and that don't."""
    import numpy as np
    from pyspark.sql import functions as F

    from datakit.io import sinks

    keys = pa.array([f"doc-{i:05d}" for i in range(2000)] + ["", "é", "x" * 1000])
    hashes = sinks.key_hashes(keys).view(np.int64)
    assert (hashes < 0).any() and (hashes >= 0).any()
    df = spark.createDataFrame([(i, int(h)) for i, h in enumerate(hashes)], "i long, h long")
    for shards in (1, 2, 3, 7, 1000, 2**31 - 1):
        got = [r["s"] for r in df.select("i", spark_engine.shard_of_hash("h", shards).alias("s")).orderBy(F.col("i")).collect()]
        assert got == sinks.shard_ids(keys, shards).tolist(), shards


class _NotInDriver:
    def __init__(self, *a, **k):
        raise AssertionError("the sink sent the root's rows through Python for their shard ids")


def test_a_chain_root_gets_its_shard_ids_in_the_jvm_and_a_join_root_in_python(spark, tmp_path, monkeypatch):
    """The sink's shard ids: from the root chain's key hashes when the root is a chain (no Python round trip
    of the whole dataset), through `_AddShard` when it is a join; the same files as the local engine either way."""
    from typing import Literal

    from datakit import CompileContext, StageConfig, register_stage
    from datakit.contracts import TRAINING_RECORD_V1
    from datakit.io.sinks import output_checksums

    @register_stage
    class ChainRoot(StageConfig):
        kind: Literal["test_chain_root"] = "test_chain_root"

        def compile(self, rel, ctx: CompileContext):
            return rel.map_batches(_Same(), TRAINING_RECORD_V1, name="same")

    @register_stage
    class JoinRoot(StageConfig):
        kind: Literal["test_join_root"] = "test_join_root"

        def compile(self, rel, ctx: CompileContext):
            base, counted = _records_and_their_column_counts(rel)
            return base.join(counted, "doc_id", how="semi")

    for kind, python_ids in (("test_chain_root", False), ("test_join_root", True)):
        d = tmp_path / kind
        d.mkdir()
        p = _records_pipeline(d, kind, records=60, shards=3)
        p.run(engine="local", workers=1, output=str(d / "local"))
        with monkeypatch.context() as m:
            if not python_ids:
                m.setattr(spark_engine, "_AddShard", _NotInDriver)
            p.run(engine="spark", partitions=2, output=str(d / "spark"))
        local, spark_out = output_checksums(str(d / "local")), output_checksums(str(d / "spark"))
        assert local == spark_out and len(local) >= 3, kind  # three shards, byte-identical


class _Pairs:
    """(src, dst) pairs of record ids: each record to the one 3 after it, the last 3 to ids no record has."""

    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        ids = b.column("doc_id").to_pylist()
        return pa.RecordBatch.from_arrays([pa.array(ids), pa.array([f"{int(d) + 3:04d}" for d in ids])],
                                          names=["src", "dst"])


class _BothEnds:
    """Each pair's two ends, read from their prefixed columns, as one record's meta (keyed by src)."""

    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        import json

        a = [s[0]["text"] for s in b.column("_a_segments").to_pylist()]
        z = [None if s is None else s[0]["text"] for s in b.column("_z_segments").to_pylist()]
        meta = [json.dumps({"dst": d, "src_text": x, "dst_text": y, "dst_kind": k})
                for d, x, y, k in zip(b.column("dst").to_pylist(), a, z, b.column("_z_kind").to_pylist())]
        return pa.RecordBatch.from_arrays([b.column("src"), pa.array(meta)], names=["doc_id", "ends"])


def _both_ends_stage():
    """The stage `test_both_ends`: the records joined to both ends of each pair (two joins by doc_id,
    `right_prefix`), then back to each record (a third join by doc_id): dedup's verification."""
    from typing import Literal

    from datakit import CompileContext, StageConfig, register_stage
    from datakit.contracts import TRAINING_RECORD_V1

    @register_stage  # (again: registering a kind twice keeps the last class)
    class BothEnds(StageConfig):
        kind: Literal["test_both_ends"] = "test_both_ends"
        broadcast: bool = False

        def compile(self, rel, ctx: CompileContext):
            pairs = rel.map_batches(_Pairs(), pa.schema([("src", pa.string()), ("dst", pa.string())]), name="pairs")
            ends = (pairs.join(rel, "src", "doc_id", right_prefix="_a_", broadcast=self.broadcast)
                    .join(rel, "dst", "doc_id", how="left", right_prefix="_z_", broadcast=self.broadcast))
            assert "_a_doc_id" not in ends.schema.names and "_z_meta" in ends.schema.names  # keys are not repeated
            both = ends.map_batches(_BothEnds(), pa.schema([("doc_id", pa.string()), ("ends", pa.string())]),
                                    name="both_ends")
            return rel.join(both, "doc_id", how="left").map_batches(_SetEnds(), TRAINING_RECORD_V1, name="set_ends")


def test_a_relation_joined_to_both_ends_of_a_pair_with_right_prefix(spark, tmp_path):
    """`right_prefix` keeps every right column under a new name, so the records join both ends of a
    pair in two joins with no pass between (dedup's verification); shuffled and broadcast joins, inner
    and left (a missing end gives nulls), give the local engine's bytes on Spark."""
    import json

    from datakit.io.dataset import read_output
    from tests.conformance import LOCAL_VARIANTS, assert_conformant, spark_variants

    _both_ends_stage()
    for broadcast in (False, True):
        out = tmp_path / f"b{int(broadcast)}"
        out.mkdir()
        p = _records_pipeline(out, "test_both_ends", records=12, shards=2, broadcast=broadcast)
        assert_conformant(p, out, variants=LOCAL_VARIANTS[:1] + spark_variants((2,)))
        rows = {r["doc_id"]: json.loads(r["meta"]) for r in
                read_output(str(out / "conf-0-local")).select(["doc_id", "meta"]).to_pylist()}
        assert rows["0004"] == {"dst": "0007", "src_text": "text-4", "dst_text": "text-0", "dst_kind": "code"}
        assert rows["0011"] == {"dst": "0014", "src_text": "text-4", "dst_text": None, "dst_kind": None}


def _records_side_shuffles(spark, tmp_path, monkeypatch, name: str) -> list[int]:
    """Run `test_both_ends` on Spark (2 partitions); per join that reads the records by doc_id and
    its other side by another key, how many shuffles by doc_id its plan has (the records' own)."""
    import re

    plans = []
    real = spark_engine._Run._join

    def spy(self, node):
        df = real(self, node)
        if list(node.right_on) == ["doc_id"] and list(node.left_on) != ["doc_id"]:
            plans.append(df._jdf.queryExecution().executedPlan().toString())
        return df

    monkeypatch.setattr(spark_engine._Run, "_join", spy)
    out = tmp_path / name
    out.mkdir()
    _records_pipeline(out, "test_both_ends", records=12, shards=2).run(engine="spark", partitions=2,
                                                                       output=str(out / "spark"))
    assert len(plans) == 2  # the pair's two ends
    return [len(re.findall(r"Exchange hashpartitioning\(doc_id#", p)) for p in plans]


def test_a_relation_several_joins_read_by_one_key_is_shuffled_once(spark, tmp_path, monkeypatch):
    """The records that three joins read by doc_id (dedup's: both ends of each candidate pair, then the
    final marking) are stored hash-partitioned and sorted by doc_id when they are materialized, so no
    join shuffles them again (at 100k quickstart events: three shuffles of 77-111 MB each). Spark keeps
    a checkpoint's partitioning only when its plan was not adaptive; the run plans that one query so."""
    _both_ends_stage()
    assert _records_side_shuffles(spark, tmp_path, monkeypatch, "stored") == [0, 0]
    # the same run without the layout: each join shuffles the records again (the second end's plan
    # holds the first end's join, which no job materialized)
    monkeypatch.setattr(spark_engine, "_join_key", lambda nid, consumers: None)
    assert _records_side_shuffles(spark, tmp_path, monkeypatch, "plain") == [1, 2]


def test_the_join_key_of_a_relation_is_the_one_two_shuffled_joins_share():
    from datakit.contracts import TRAINING_RECORD_V1
    from datakit.plan import source

    rel = source(["x.parquet"], "parquet", TRAINING_RECORD_V1, "training_record.v1")
    pairs = rel.map_batches(_Pairs(), pa.schema([("src", pa.string()), ("dst", pa.string())]), name="pairs")
    a = pairs.join(rel, "src", "doc_id", right_prefix="a_")
    b = a.join(rel, "dst", "doc_id", right_prefix="b_")
    by_kind = pairs.join(rel, "src", "kind", right_prefix="k_")
    tiny = pairs.join(rel, "src", "doc_id", right_prefix="t_", broadcast=True)
    key = spark_engine._join_key
    assert key(rel.node.id, [pairs.node, a.node, b.node]) == "doc_id"  # a MapBatches reader does not count
    assert key(rel.node.id, [a.node, by_kind.node]) is None  # one join per key: nothing to share
    assert key(rel.node.id, [a.node, tiny.node]) is None  # a broadcast join shuffles nothing of it
    assert key(pairs.node.id, [a.node, by_kind.node]) == "src"  # the left side counts too


class _SetEnds:
    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        return b.set_column(b.schema.get_field_index("meta"), "meta", b.column("ends")).drop_columns(["ends"])


def test_right_prefix_is_checked_when_the_plan_is_built():
    from datakit.contracts import TRAINING_RECORD_V1
    from datakit.plan import source

    rel = source(["x.parquet"], "parquet", TRAINING_RECORD_V1, "training_record.v1")
    pairs = rel.map_batches(_Pairs(), pa.schema([("src", pa.string()), ("dst", pa.string())]), name="pairs")
    joined = pairs.join(rel, "src", "doc_id", right_prefix="a_")
    assert joined.schema.names == ["src", "dst", *("a_" + c for c in TRAINING_RECORD_V1.names if c != "doc_id")]
    assert joined.node.right_columns() == {"a_" + c: c for c in TRAINING_RECORD_V1.names if c != "doc_id"}
    with pytest.raises(ValueError, match="the left side has: a_kind"):
        joined.join(rel, "dst", "doc_id", right_prefix="a_")  # the second end needs its own prefix
    for how in ("anti", "semi"):
        with pytest.raises(ValueError, match="inner or left join"):
            pairs.join(rel, "src", "doc_id", how=how, reason="r", right_prefix="a_")
    # without a prefix a clashing right column is not taken (the left one stays): the old rule
    assert pairs.join(rel, "src", "doc_id").join(rel, "dst", "doc_id").schema == pairs.join(rel, "src", "doc_id").schema


class _NoneOf:
    """No row of the batch (the side branch that finds nothing, like the ingest's repeated event ids)."""

    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([b.column("doc_id").slice(0, 0)], names=["doc_id"])


@pytest.mark.parametrize("how", ["anti", "semi", "inner"])
def test_a_join_with_an_empty_side_is_decided_without_a_job(spark, tmp_path, monkeypatch, how):
    """A side relation counted empty decides its joins: an anti join is its left side, an inner or
    semi join is empty. No job computes or counts them, and the output is the local engine's."""
    from typing import Literal

    from datakit import CompileContext, StageConfig, register_stage
    from tests.conformance import LOCAL_VARIANTS, assert_conformant, spark_variants

    @register_stage
    class EmptySide(StageConfig):
        kind: Literal["test_empty_side"] = "test_empty_side"
        how: str = "anti"

        def compile(self, rel, ctx: CompileContext):
            none = rel.map_batches(_NoneOf(), pa.schema([rel.schema.field("doc_id")]), name="none")
            if self.how != "anti":  # found nothing: the anti join below then takes nothing away either
                none = rel.join(none, "doc_id", how=self.how)
            return rel.join(none, "doc_id", how="anti", reason="listed")

    decided: list[tuple[str, int | None]] = []
    real = spark_engine._Run._known_rows

    def spy(self, node):
        n = real(self, node)
        decided.append((node.how, n))
        return n

    monkeypatch.setattr(spark_engine._Run, "_known_rows", spy)
    p = _records_pipeline(tmp_path, "test_empty_side", records=12, shards=2, how=how)
    assert_conformant(p, tmp_path, variants=LOCAL_VARIANTS[:1] + spark_variants((2,)))
    assert decided == ([] if how == "anti" else [(how, 0)]) + [("anti", 12)]
    import json

    run = json.loads((tmp_path / "conf-1-spark" / "_run.json").read_text())
    assert (run["stages"][0]["rows_in"], run["stages"][0]["rows_out"], run["stages"][0]["dropped"]) == (12, 12, {})


def test_keys_are_ordered_widest_type_first():
    schema = pa.schema([("doc_id", pa.string()), ("_dk_band", pa.int32()), ("_dk_bucket", pa.int64()),
                        ("flag", pa.bool_()), ("other", pa.list_(pa.int64()))])
    assert spark_engine.sort_first(["_dk_band", "_dk_bucket"], schema) == ["_dk_bucket", "_dk_band"]
    assert spark_engine.sort_first(["flag", "doc_id", "_dk_band"], schema) == ["doc_id", "_dk_band", "flag"]
    assert spark_engine.sort_first(["_dk_bucket", "doc_id"], schema) == ["_dk_bucket", "doc_id"]  # ties keep order
    assert spark_engine.sort_first(["other", "_dk_band"], schema) == ["_dk_band", "other"]  # unranked types last


def test_lsh_buckets_are_sorted_by_the_bucket_before_the_band(spark):
    """Dedup's (band, bucket) groups: the band has a handful of values, so a Spark sort by it first compares
    whole rows for nearly every pair of band rows; the window, the aggregate and the join sort by the
    64-bit bucket first. Same rows whichever order (the keys are a set)."""
    import re

    from datakit import plan as P

    band_schema = pa.schema([("doc_id", pa.string()), ("_dk_band", pa.int32()), ("_dk_bucket", pa.int64())])
    banded = P.source(["x"], "parquet", band_schema, "bands")
    buckets = banded.aggregate(["_dk_band", "_dk_bucket"], {"_dk_min": ("min", "doc_id")})
    windowed = banded.join(buckets, ["_dk_band", "_dk_bucket"])
    other = P.source(["y"], "parquet", band_schema, "bands")
    joined = banded.join(other, ["_dk_band", "_dk_bucket"], right_prefix="o_")
    rows = pa.table({"doc_id": ["a", "b", "c", "d"], "_dk_band": pa.array([0, 0, 1, 1], pa.int32()),
                     "_dk_bucket": pa.array([7, 7, 7, 9], pa.int64())})
    run = spark_engine._Run.__new__(spark_engine._Run)
    run.rows, run.df = {}, {banded.node.id: spark.createDataFrame(rows), other.node.id: spark.createDataFrame(rows)}
    # the static plan, no broadcast: the sorts a run's shuffled joins and groups make
    with spark_engine._runtime_conf(spark, {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "-1"}):
        for df in (run._join(windowed.node), run._aggregate(buckets.node), run._join(joined.node)):
            plan = df._jdf.queryExecution().executedPlan().toString()
            firsts = re.findall(r"(?:Sort \[|hashpartitioning\(|Join \[)(\w+)#", plan)
            assert firsts and set(firsts) == {"_dk_bucket"}, plan
        got = run._join(windowed.node).orderBy("doc_id").collect()
    assert [(r["doc_id"], r["_dk_min"]) for r in got] == [("a", "a"), ("b", "a"), ("c", "c"), ("d", "d")]
