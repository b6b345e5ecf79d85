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
