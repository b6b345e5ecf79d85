"""The texts of a record: one public definition that dedup, decontamination and custom stages share.

Why one module: "which text does this training record hold?" was answered three times in
private helpers (dedup's key text, decontamination's scanned strings, the check's column
choice); each answer was one edit away from drifting. A training record's text lives in its
`segments` (each segment's `text`), `chosen` and `rejected` (RECORD_TEXT_COLUMNS).

Two shapes, because stages truly need two (the difference is the function you call, not a flag):
- `record_texts`: ONE string per record -- segment texts in stored order joined by "\\n", then
  `chosen` and `rejected` appended ("\\n"-joined) when not null; a null segment text counts as
  empty. Dedup keys and signatures, quality's `text`/`text_chars` columns. Two preference pairs
  with one prompt but different answers stay different.
- `text_pieces`: EVERY text separately, with the row it belongs to (nulls kept). Decontamination
  scans each piece on its own so an n-gram never spans the seam between two segments.

PII scrubbing reads the same three columns but builds its own scan units (segments in FIM
order, prefix-middle-suffix, joined with no separator so a secret split around the cursor is
found; chat turns with a blank line; `chosen`/`rejected` as units of their own), with offsets
it maps findings back through -- see `scrub_pii/stage.py`; it is not a different text, only a
different reading order for detection.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

RECORD_TEXT_COLUMNS = ("segments", "chosen", "rejected")
# a plain table (not training records) names its text one of these (first present wins)
GENERIC_TEXT_FIELDS = ("text", "content", "code")

__all__ = ["RECORD_TEXT_COLUMNS", "GENERIC_TEXT_FIELDS", "TextPiece", "text_columns", "text_pieces", "record_texts"]


def text_columns(names: Sequence[str], text_fields: Sequence[str] | None = None) -> list[str]:
    """The columns holding the text: `text_fields` if given (KeyError naming a missing one), else a
    training record's RECORD_TEXT_COLUMNS that are present, else the first GENERIC_TEXT_FIELDS column;
    [] when there is none."""
    if text_fields:
        missing = [f for f in text_fields if f not in names]
        if missing:
            raise KeyError(f"no column {', '.join(missing)} (columns: {', '.join(names)})")
        return list(text_fields)
    if "segments" in names:
        return [c for c in RECORD_TEXT_COLUMNS if c in names]
    return [c for c in GENERIC_TEXT_FIELDS if c in names][:1]


@dataclass
class TextPiece:
    """One text column of a batch, flattened: its strings and the row each one belongs to."""

    column: str        # "segments", "chosen", "rejected" or a generic column name
    texts: pa.Array    # string (never large_string); a null text stays null
    rows: np.ndarray   # int64, string -> row in the batch


def text_pieces(batch: pa.RecordBatch | pa.Table, columns: Sequence[str] | None = None) -> list[TextPiece]:
    """Every text of every row, one `TextPiece` per column (default: `text_columns(batch)`).

    A list column (segments) contributes each element (a struct's `text` field); a string
    column one string per row."""
    out = []
    for name in (columns if columns is not None else text_columns(batch.schema.names)):
        col = _combined(batch.column(name))
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            flat = pc.list_flatten(col)
            if pa.types.is_struct(flat.type):
                flat = flat.field("text")
            piece = TextPiece(name, flat, np.asarray(pc.list_parent_indices(col), dtype=np.int64))
        else:
            piece = TextPiece(name, col, np.arange(len(col), dtype=np.int64))
        if not (pa.types.is_string(piece.texts.type) or pa.types.is_large_string(piece.texts.type)):
            piece.texts = piece.texts.cast(pa.string())
        out.append(piece)
    return out


def record_texts(batch: pa.RecordBatch | pa.Table, text_column: str | None = None) -> pa.Array:
    """The text of each record as one string (a `string` array, never null); see the module doc.

    `text_column` names a plain string column to use instead (dedup's `text_column`)."""
    if text_column is not None:
        return _strings(batch.column(text_column))
    seg = _combined(batch.column("segments"))
    lengths = pc.fill_null(pc.list_value_length(seg), 0).to_numpy(zero_copy_only=False).astype(np.int32)
    offsets = np.zeros(len(seg) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = seg.flatten()  # honours slicing; null lists contribute nothing
    texts = pc.fill_null(pc.struct_field(flat, "text"), "") if len(flat) else pa.array([], pa.string())
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), texts), "\n")
    parts = [joined] + [_combined(batch.column(c)) for c in RECORD_TEXT_COLUMNS[1:] if c in batch.schema.names]
    if len(parts) > 1:
        joined = pc.binary_join_element_wise(*parts, "\n", null_handling="skip")
    return _strings(joined)


def _combined(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _strings(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`string` (not large_string), nulls as "": the bytes every consumer of `record_texts` hashes."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    if pa.types.is_large_string(texts.type):
        texts = texts.cast(pa.string())
    return pc.fill_null(texts, "")
