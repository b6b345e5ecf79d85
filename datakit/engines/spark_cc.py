"""Connected components on Spark DataFrames: alternating large-star / small-star.

Why this algorithm: it needs only joins and group-by-min (Spark's strengths),
converges in O(log n) rounds (Kiveris et al., "Connected Components in
MapReduce and Beyond", SoCC 2014), and ends with every node pointing at the
smallest id of its component -- the unique answer the plan asks for, so the
result does not depend on partitioning or round order.

Edges are kept as directed pairs (u, v) with v < u ("u points at a smaller
node"). Each round:

* large-star: for every node u with neighbourhood N(u), link each larger
  neighbour v > u to m(u) = min(N(u) + u);
* small-star: for every node u, link u and each smaller neighbour to
  m = min(smaller neighbours + u).

The graph is done when it is a set of stars centred on their minimum: every
node has exactly one out-edge and no edge points at a node that itself points
further. Lineage is cut by checkpointing the edge set each round, so the plan
does not grow with the number of rounds.

A graph of at most `spark_partitions.ONE_TASK_MAX_EDGES` edges (`spark.datakit.componentsOneTaskMaxEdges`)
is solved in one task instead (`components_in_one_task`): the array hook-and-jump
(`core.connected_components_table`) the local engine uses, on an executor. Why: each round above is several shuffles and a
convergence job, ~1-2 s of scheduling however few the edges, so the rounds cost
seconds where one task takes milliseconds (a 1M-edge graph is ~100 MB in one
Python worker). Both give the unique answer, so the output bytes do not depend on
which one ran.
"""
from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa
from pyspark.sql import DataFrame, functions as F

Checkpoint = Callable[[DataFrame], DataFrame]

MAX_ROUNDS = 64  # 2**64 nodes would be needed to get close; more means a bug, not a big graph


def _components_of_table(table: pa.Table) -> pa.Table:
    """applyInArrow body: the whole edge list (`a`, `b`) -> (node, component) by `core.connected_components_table`.

    Same node set as `connected_components`: a null end names no node, an edge with one
    null end keeps its other end (a node of its own, as a self-loop does).
    """
    from datakit.engines.core import connected_components_table

    return connected_components_table(table.column("a"), table.column("b"))


def components_in_one_task(edges: DataFrame, expected_env: dict[str, Any] | None = None) -> DataFrame:
    """`edges(src, dst)` -> `(node, component)` like `connected_components`, computed by one task.

    `expected_env`: the driver's environment, which the task's Python worker checks first
    (`spark_session.CheckedTask`), as every other Python task of a run does."""
    from datakit.engines.spark_session import CheckedTask, table_fn

    clean = edges.select(F.col("src").cast("string").alias("a"), F.col("dst").cast("string").alias("b"))
    fn = table_fn(CheckedTask(_components_of_table, expected_env)) if expected_env is not None else _components_of_table
    return clean.withColumn("_g", F.lit(0)).groupBy("_g").applyInArrow(fn, "node string, component string")


def _both_directions(e: DataFrame) -> DataFrame:
    return e.select("u", "v").unionByName(e.select(F.col("v").alias("u"), F.col("u").alias("v")))


def large_star(e: DataFrame) -> DataFrame:
    """(v, m(u)) for every edge u-v with v > u, where m(u) = min of u's closed neighbourhood."""
    sym = _both_directions(e)
    m = sym.groupBy("u").agg(F.min("v").alias("mv")).select("u", F.least("u", "mv").alias("m"))
    return (
        sym.where(F.col("v") > F.col("u")).join(m, "u")
        .select(F.col("v").alias("u"), F.col("m").alias("v"))
        .where(F.col("u") != F.col("v")).distinct()
    )


def small_star(e: DataFrame) -> DataFrame:
    """(x, m) for u and every smaller neighbour x of u, where m = min(smaller neighbours + u)."""
    down = _both_directions(e).where(F.col("v") < F.col("u"))
    m = down.groupBy("u").agg(F.min("v").alias("m"))
    j = down.join(m, "u")
    out = j.select(F.col("v").alias("u"), "m").unionByName(m.select("u", "m"))
    return out.where(F.col("u") != F.col("m")).select("u", F.col("m").alias("v")).distinct()


def _converged(e: DataFrame) -> bool:
    """True when the edges form stars centred on their minimum (each node one out-edge, depth 1).

    One Spark job: the nodes that break the star shape (an edge pointing at a
    node that points further, or a node with two out-edges), limited to one row.
    """
    targets = e.select(F.col("v").alias("t")).distinct()
    deep = e.join(targets, F.col("u") == F.col("t"), "left_semi").select("u")
    multi = e.groupBy("u").count().where(F.col("count") > 1).select("u")
    return deep.unionByName(multi).isEmpty()


def connected_components(edges: DataFrame, checkpoint: Checkpoint | None = None,
                         max_rounds: int = MAX_ROUNDS) -> tuple[DataFrame, int]:
    """`edges(src, dst)` (strings) -> (`(node, component)` for every node in an edge, rounds used).

    Null ends are ignored (they name no node); self-loops keep their node.
    `checkpoint` cuts lineage each round (reliable checkpoint, so a lost
    executor costs a recomputation of one round at most).
    """
    cp = checkpoint or (lambda df: df.localCheckpoint(eager=True))
    clean = edges.select(F.col("src").cast("string").alias("a"), F.col("dst").cast("string").alias("b"))
    nodes = (
        clean.select(F.col("a").alias("node")).unionByName(clean.select(F.col("b").alias("node")))
        .where(F.col("node").isNotNull()).distinct()
    )
    e = (
        clean.where(F.col("a").isNotNull() & F.col("b").isNotNull() & (F.col("a") != F.col("b")))
        .select(F.greatest("a", "b").alias("u"), F.least("a", "b").alias("v")).distinct()
    )
    e = cp(e)
    rounds = 0
    while True:
        rounds += 1
        if rounds > max_rounds:
            raise RuntimeError(f"connected components did not converge in {max_rounds} rounds")
        e = cp(small_star(large_star(e)))
        if _converged(e):
            break
    comp = e.select(F.col("u").alias("node"), F.col("v").alias("component"))
    out = nodes.join(comp, "node", "left").select("node", F.coalesce("component", "node").alias("component"))
    return out, rounds
