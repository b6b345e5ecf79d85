"""Barriers over spilled parts: polars queries for joins and aggregates; connected components by
`core.connected_components_table` (scipy), which the Spark engine uses for graphs that fit one task.

Each function builds a query (or a table) only; the engine streams it to a spill file.
"""
from __future__ import annotations

from typing import Callable

import polars as pl

from datakit.engines.core import connected_components_table
from datakit.plan import Aggregate, ConnectedComponents, Join, Node


def barrier_query(node: Node, lazy: Callable[[Node], pl.LazyFrame]) -> pl.LazyFrame:
    """The polars query of a barrier node; `lazy(n)` scans the materialized output of input `n`."""
    if isinstance(node, Join):
        left, right = lazy(node.left), lazy(node.right)
        how = {"inner": "inner", "left": "left", "anti": "anti", "semi": "semi"}[node.how]
        if node.how in ("anti", "semi"):
            right = right.select([pl.col(c) for c in node.right_on]).unique()
        else:
            keep = [c for c in node.right.schema.names if c in node.schema.names or c in node.right_on]
            right = right.select(keep)
        lf = left.join(right, left_on=node.left_on, right_on=node.right_on, how=how, nulls_equal=False,
                       coalesce=True)
        return lf.select(node.schema.names)
    if isinstance(node, Aggregate):
        exprs = []
        for out, (op, col) in node.aggs.items():
            e = {"min": pl.col(col).min(), "max": pl.col(col).max(), "count": pl.len(),
                 "sum": pl.col(col).sum()}[op]
            exprs.append(e.alias(out))
        return lazy(node.input).group_by(node.keys).agg(exprs)
    if isinstance(node, ConnectedComponents):
        edges = lazy(node.input).select(["src", "dst"]).collect(engine="streaming")
        table = connected_components_table(edges["src"].to_arrow(), edges["dst"].to_arrow())
        return pl.from_arrow(table).lazy()
    raise NotImplementedError(f"local engine cannot run {type(node).__name__}")
