"""Barriers over spilled parts: polars queries for joins and aggregates; connected components by
`core.connected_components_table` (numpy hook-and-jump), which the Spark engine uses for graphs that fit one task.

Each function builds a query (or a table) only; the engine streams it to a spill file.

Every query keeps its input's row order (`maintain_order`), so a barrier's spill has the same bytes
on every run of the same input. Why: the next chain's tasks are row-group slices of that spill,
and a task's resume fingerprint is the spill's sha256 plus the slice. Polars' parallel hash
group-by and join emit rows in an order that varies with thread timing; a rerun after a kill
then saw a different spill and ran again tasks it had finished (the final output was right, the
shards sort rows, but resume was lost, mostly on a loaded machine). Measured on 200k rows, the
ordered group-by costs 66 ms against 52 ms and the ordered join 57 ms against 53 ms.
"""
from __future__ import annotations

from typing import Callable

import polars as pl

from datakit.engines.core import connected_components_table
from datakit.plan import Aggregate, ConnectedComponents, Join, Node


def barrier_query(node: Node, lazy: Callable[[Node], pl.LazyFrame], right_larger: bool = False,
                  columns: list[str] | None = None) -> pl.LazyFrame:
    """The polars query of a barrier node; `lazy(n)` scans the materialized output of input `n`.

    `right_larger`: the right side's spill is larger than the left's (the engine knows their
    sizes). Then an inner or left join first keeps only the right rows whose key the left side
    has (a semi join on the left's keys, which polars does not do by itself). Why: polars holds
    the whole right side in memory to build the join, and dedup's verification joins ~40k
    candidate pairs to every record by doc_id, twice per verification pass; at 100k quickstart
    events the driver peaked at 985-1007 MB in those joins. The first of them alone, measured
    apart (2 runs each): 590-599 MB -> 445 MB, 0.49-0.55 -> 0.43-0.44 s, the same rows in the
    same order (right rows without a match never reach the output, and the filter keeps the
    right side's order).

    `columns`: only these output columns (the engine's `_columns_used`: what the consumers read);
    an input that was itself spilled with only the columns this node needs may lack the others.
    """
    if isinstance(node, Join):
        left, right = lazy(node.left), lazy(node.right)
        how = {"inner": "inner", "left": "left", "anti": "anti", "semi": "semi"}[node.how]
        if node.how in ("anti", "semi"):
            right = right.select([pl.col(c) for c in node.right_on]).unique()
            order = "left"  # (only left rows come out)
        else:
            cols = {o: r for o, r in node.right_columns().items() if columns is None or o in columns}
            if right_larger:
                keys = left.select([pl.col(lk).alias(rk) for lk, rk in zip(node.left_on, node.right_on)]).unique()
                right = right.join(keys, on=list(node.right_on), how="semi", nulls_equal=False, maintain_order="left")
            right = right.select([pl.col(c) for c in node.right_on] + [pl.col(r).alias(o) for o, r in cols.items()])
            order = "left_right"  # left rows in order; a left row's matches in the right side's order
        lf = left.join(right, left_on=node.left_on, right_on=node.right_on, how=how, nulls_equal=False,
                       coalesce=True, maintain_order=order)
        return lf.select(columns or node.schema.names)
    if isinstance(node, Aggregate):
        exprs = []
        for out, (op, col) in node.aggs.items():
            e = {"min": pl.col(col).min(), "max": pl.col(col).max(), "count": pl.len(),
                 "sum": pl.col(col).sum()}[op]
            exprs.append(e.alias(out))
        lf = lazy(node.input).group_by(node.keys, maintain_order=True).agg(exprs)  # first-seen key order
        return lf.select(columns) if columns else lf
    if isinstance(node, ConnectedComponents):
        edges = lazy(node.input).select(["src", "dst"]).collect(engine="streaming")
        table = connected_components_table(edges["src"].to_arrow(), edges["dst"].to_arrow())
        lf = pl.from_arrow(table).lazy()
        return lf.select(columns) if columns else lf
    raise NotImplementedError(f"local engine cannot run {type(node).__name__}")
