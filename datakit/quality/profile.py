"""What the run report plots, counted inside the run: documents, lengths and tokens by kind and language.

Why counted during the run and not read back from the output: a packed output
no longer has text or language, and reading a large output again to draw a few
histograms would cost a second pass. A pass-through node after a stage adds
integer counters to the `_metrics` column (summed by both engines, as data on
Spark); `accounting.stage_report` moves them from the stage's `metrics` into its
`profile` entry:

    {"docs": {"code|python": 120, ...},
     "chars": {"code|python": {"9": 40, "10": 80}},   # log2 buckets: 2**(b-1) <= n < 2**b
     "tokens": {"code|python": {...}}, "token_sum": {"code|python": 51234}}

Histograms are log2-bucketed so they merge exactly across batches, partitions
and engines.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datakit.plan import METRICS, Rel, metrics_column

PREFIX = "profile."


def _clean(v: Any) -> str:
    return (str(v) if v is not None else "unknown").replace("|", "/")[:40] or "unknown"


def _groups(batch: pa.RecordBatch) -> list[str]:
    names = batch.schema.names
    kinds = batch.column("kind").to_pylist() if "kind" in names else [None] * batch.num_rows
    if "language" in names:
        langs = batch.column("language").to_pylist()
    elif "source" in names and pa.types.is_struct(batch.schema.field("source").type) \
            and batch.schema.field("source").type.get_field_index("language") >= 0:
        langs = pc.struct_field(batch.column("source"), "language").to_pylist()
    else:
        langs = [None] * batch.num_rows
    return [f"{_clean(k)}|{_clean(lang)}" for k, lang in zip(kinds, langs)]


def _buckets(values: np.ndarray) -> np.ndarray:
    """log2 bucket per value: 0 -> 0, 1 -> 1, 2..3 -> 2, 4..7 -> 3, ..."""
    v = np.asarray(values, dtype=np.int64)
    out = np.zeros(len(v), dtype=np.int64)
    pos = v > 0
    out[pos] = np.floor(np.log2(v[pos])).astype(np.int64) + 1
    return out


def _token_counts(batch: pa.RecordBatch) -> np.ndarray:
    n = batch.column("n_tokens").to_numpy(zero_copy_only=False).astype(np.int64)
    for extra in ("prompt_ids", "chosen_ids", "rejected_ids"):  # preference pairs carry no n_tokens
        if extra in batch.schema.names:
            n = n + pc.fill_null(pc.list_value_length(batch.column(extra)), 0).to_numpy(zero_copy_only=False)
    return n


class ProfileFn:
    """Pass-through: counters of documents (and with `lengths`, length histograms) per kind|language."""

    def __init__(self, lengths: bool) -> None:
        self.lengths = lengths

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if batch.num_rows == 0:
            return batch
        groups = _groups(batch)
        c: Counter = Counter(f"{PREFIX}docs|{g}" for g in groups)
        if self.lengths:
            names = batch.schema.names
            if "n_tokens" in names:
                toks = _token_counts(batch)
                for g, t, b in zip(groups, toks.tolist(), _buckets(toks).tolist()):
                    c[f"{PREFIX}tokens|{g}|{b}"] += 1
                    c[f"{PREFIX}token_sum|{g}"] += t
            elif "segments" in names:
                from datakit.quality.columns import column

                chars = column(batch, "text_chars").to_numpy(zero_copy_only=False)
                for g, b in zip(groups, _buckets(chars).tolist()):
                    c[f"{PREFIX}chars|{g}|{b}"] += 1
        return pa.RecordBatch.from_arrays(list(batch.columns) + [metrics_column(batch.num_rows, dict(c))],
                                          names=batch.schema.names + [METRICS])


def attach(rel: Rel, lengths: bool) -> Rel:
    """Profile the rows `rel` hands on (records or tokenized documents; events are not profiled)."""
    if "kind" not in rel.schema.names:
        return rel
    return rel.map_batches(ProfileFn(lengths), rel.schema, name="profile")


def fold(metrics: dict[str, int]) -> tuple[dict[str, int], dict[str, Any]]:
    """Split `profile.*` counters off a stage's metrics into the nested `profile` entry."""
    own: dict[str, int] = {}
    prof: dict[str, Any] = {}
    for k, v in metrics.items():
        if not k.startswith(PREFIX):
            own[k] = v
            continue
        parts = k[len(PREFIX):].split("|")
        what, group = parts[0], f"{parts[1]}|{parts[2]}"
        if what in ("chars", "tokens"):
            prof.setdefault(what, {}).setdefault(group, {})[parts[3]] = v
        else:
            prof.setdefault(what, {})[group] = v
    return own, prof
