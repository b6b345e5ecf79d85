"""Per-node and per-stage counters, and the `_run.json` report.

Why counters per *node*: the engines execute nodes, pipelines are judged per
*stage*; a stage may compile to several nodes (dedup: map, aggregate, join).
Engines fill `NodeStats`; `stage_report` folds them into the stable `_run.json`
shape documented in `schemas/run_report.v1.json`, and checks the identity
`rows_in == rows_out + sum(dropped)` for every stage before anything is written.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datakit.errors import DatakitError
from datakit.plan import DROP, Plan


class AccountingError(DatakitError, RuntimeError):
    """Counts do not reconcile: a bug in an engine or a stage, never the user's fault."""


@dataclass
class NodeStats:
    rows_in: int = 0
    rows_out: int = 0
    dropped: Counter = field(default_factory=Counter)
    metrics: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    setup_seconds: float = 0.0  # loading + setup() of the op's function in worker processes (core.worker_fn)

    def merge(self, other: "NodeStats") -> None:
        self.rows_in += other.rows_in
        self.rows_out += other.rows_out
        self.dropped.update(other.dropped)
        self.metrics.update(other.metrics)
        self.seconds += other.seconds
        self.setup_seconds += other.setup_seconds

    def to_json(self) -> dict[str, Any]:
        return {"rows_in": self.rows_in, "rows_out": self.rows_out, "dropped": dict(self.dropped),
                "metrics": dict(self.metrics), "seconds": self.seconds, "setup_seconds": self.setup_seconds}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "NodeStats":
        return cls(d["rows_in"], d["rows_out"], Counter(d["dropped"]), Counter(d.get("metrics", {})), d.get("seconds", 0.0),
                   d.get("setup_seconds", 0.0))


def count_drops(batch: pa.RecordBatch | pa.Table) -> Counter:
    """Reasons of the `_drop` column, counted (nulls are kept rows)."""
    col = batch.column(DROP)
    c: Counter = Counter()
    for item in pc.value_counts(col.drop_null() if hasattr(col, "drop_null") else pc.drop_null(col)).to_pylist():
        c[item["values"]] += item["counts"]
    return c


def sum_metrics(col: pa.Array | pa.ChunkedArray) -> Counter:
    """Sum a `_metrics` column of JSON objects of integer counts."""
    c: Counter = Counter()
    for s in pc.drop_null(col).to_pylist():
        if s:
            c.update({k: int(v) for k, v in json.loads(s).items()})
    return c


def stage_report(plan: Plan, stats: dict[int, NodeStats], rows: dict[int, int]) -> list[dict[str, Any]]:
    """Fold node counters into one entry per stage span; raise if any stage does not reconcile.

    `rows[node.id]` is the number of rows a node output (engines know it for every
    node they ran). A stage's rows_in is its input node's row count, rows_out its
    output node's; `dropped` and `metrics` sum over the nodes that belong to it.
    """
    # imported here, by the driver: pool workers import this module for NodeStats, and expectations are pydantic models
    from datakit.quality import expect as quality_expect
    from datakit.quality import profile as quality_profile

    out = []
    for span in plan.spans:
        dropped: Counter = Counter()
        metrics: Counter = Counter()
        seconds = setup = 0.0
        for n in plan.nodes():
            if n.stage == span.name and n.id in stats:
                dropped.update(stats[n.id].dropped)
                metrics.update(stats[n.id].metrics)
                seconds += stats[n.id].seconds
                setup += stats[n.id].setup_seconds
        rows_in = rows[span.input.id]
        emitted = rows[span.output.id]
        entry: dict[str, Any] = {"name": span.name, "kind": span.kind, "rows_in": rows_in}
        if span.emits != "rows":
            # an expanding stage: rows_out counts input rows that yielded output
            entry["rows_out"] = rows_in - sum(dropped.values())
            entry["emitted"] = emitted
            entry["emits"] = span.emits
        else:
            entry["rows_out"] = emitted
        entry["dropped"] = dict(sorted((k, v) for k, v in dropped.items() if v))  # no zero entries
        # counters of the quality nodes (profile, expectations) get their own entries
        own, profile = quality_profile.fold(dict(metrics))
        own, expectations = quality_expect.fold(plan.checks, span.name, own)
        if own:
            entry["metrics"] = dict(sorted(own.items()))
        if profile:
            entry["profile"] = profile
        if expectations:
            entry["expectations"] = expectations
        entry["seconds"] = round(seconds, 3)
        entry["setup_seconds"] = round(setup, 3)
        if entry["rows_in"] != entry["rows_out"] + sum(dropped.values()):
            raise AccountingError(
                f"stage {span.name!r}: rows_in {entry['rows_in']} != rows_out {entry['rows_out']} + dropped "
                f"{sum(dropped.values())}; nothing was committed (a stage function must keep every row it is "
                f"given or mark it with a `{DROP}` reason: see Accounting in docs/architecture.md)")
        out.append(entry)
    if plan.gate:
        quality_expect.enforce(out)  # before anything is committed: a failed `error` expectation stops the run
    return out
