"""The columns an expectation can name: a batch's own columns, nested fields with dots, and derived ones.

Why derived columns: great-expectations checks columns of a table, but some of
the properties we gate on are functions of a row (the dedup content hash, the
number of secret patterns a residual scan still finds). Computing them here and
letting GX check them keeps the suites plain GX expectations (data, reviewable)
while the computation stays the same code the stages use.

Only the columns a suite names are built, so a check reads a batch once and
holds one batch in memory.
"""
from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

# name -> (what it is, function batch -> array); listed in docs/quality.md
DERIVED: dict[str, tuple[str, Callable[[pa.RecordBatch], pa.Array]]] = {}


def _derived(name: str, doc: str):
    def wrap(fn: Callable[[pa.RecordBatch], pa.Array]):
        DERIVED[name] = (doc, fn)
        return fn
    return wrap


def _combined(col: Any) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


@_derived("n_segments", "number of segments of a training record")
def _n_segments(b: pa.RecordBatch) -> pa.Array:
    return pc.fill_null(pc.list_value_length(_combined(b.column("segments"))), 0)


@_derived("text_chars", "characters in a record's text (segments, chosen, rejected)")
def _text_chars(b: pa.RecordBatch) -> pa.Array:
    return pc.utf8_length(_text(b))


@_derived("text", "a record's text: the dedup stage's definition (segments joined, then chosen/rejected)")
def _text(b: pa.RecordBatch) -> pa.Array:
    from datakit.stages.texts import record_texts

    return record_texts(b)


@_derived("content_hash", "the dedup stage's exact content key (whitespace-normalized, scoped by kind)")
def _content_hash(b: pa.RecordBatch) -> pa.Array:
    from datakit.stages.dedup.text import exact_keys
    from datakit.stages.texts import record_texts

    scope = _combined(b.column("kind")) if "kind" in b.schema.names else None
    return exact_keys(record_texts(b), "whitespace", scope)


@_derived("secret_findings", "secret patterns (keys, tokens, passwords) a fresh scan still finds in the text")
def _secret_findings(b: pa.RecordBatch) -> pa.Array:
    from datakit.stages.scrub_pii.detectors import DETECTORS
    from datakit.stages.scrub_pii.scan import scan_batch

    secrets = [d for d in DETECTORS if d.category == "secret"]
    return pa.array([len(f) for f in scan_batch(_text(b), secrets, strategy="auto")], pa.int64())


@_derived("chosen_is_rejected", "a preference pair whose chosen and rejected texts are equal")
def _chosen_is_rejected(b: pa.RecordBatch) -> pa.Array:
    return pc.fill_null(pc.equal(_combined(b.column("chosen")), _combined(b.column("rejected"))), False)


@_derived("max_input_id", "the largest token id of a tokenized document")
def _max_input_id(b: pa.RecordBatch) -> pa.Array:
    col = _combined(b.column("input_ids"))
    flat = pc.list_flatten(col)
    if len(flat) == 0:
        return pa.nulls(len(col), pa.int64())
    t = pa.table({"p": pc.list_parent_indices(col), "v": flat.cast(pa.int64())}).group_by("p").aggregate([("v", "max")])
    out = [None] * len(col)
    for p, v in zip(t.column("p").to_pylist(), t.column("v_max").to_pylist()):
        out[p] = v
    return pa.array(out, pa.int64())


def available(schema: pa.Schema) -> set[str]:
    """Every column name an expectation may use on rows of `schema`."""
    names = set(schema.names)
    for f in schema:
        if pa.types.is_struct(f.type):
            names |= {f"{f.name}.{s.name}" for s in f.type}
        if pa.types.is_list(f.type) or pa.types.is_large_list(f.type):
            names.add(f"n_{f.name}")
    need = {"n_segments": {"segments"}, "text_chars": {"segments"}, "text": {"segments"},
            "content_hash": {"segments"}, "secret_findings": {"segments"},
            "chosen_is_rejected": {"chosen", "rejected"}, "max_input_id": {"input_ids"}}
    names |= {d for d, cols in need.items() if cols <= set(schema.names)}
    return names


def column(batch: pa.RecordBatch, name: str) -> pa.Array:
    """One column of a batch by its expectation name (own, dotted nested field, n_<list>, or derived)."""
    names = batch.schema.names
    if name in names:
        return _combined(batch.column(name))
    if name in DERIVED:
        return DERIVED[name][1](batch)
    if "." in name:
        parent, child = name.split(".", 1)
        if parent in names:
            return pc.struct_field(_combined(batch.column(parent)), child)
    if name.startswith("n_") and name[2:] in names:
        return pc.list_value_length(_combined(batch.column(name[2:])))
    raise KeyError(name)


def frame(batch: pa.RecordBatch, columns: set[str]) -> Any:
    """A pandas DataFrame of just the named columns (what GX validates)."""
    cols = {c: column(batch, c) for c in sorted(columns)}
    if not cols:
        return pa.table({"_rows": pa.nulls(batch.num_rows, pa.int8())}).to_pandas()
    return pa.table(cols).to_pandas()
