"""The texts of a record: one public definition that dedup, decontamination, PII and custom stages share.

Why one module: "which text does this training record hold?" was answered in private helpers
(dedup's key text, decontamination's scanned strings, the check's column choice, PII's scan
units and write-back); each answer was one edit away from drifting. A training record's text
lives in its `segments` (each segment's `text`), `chosen` and `rejected` (RECORD_TEXT_COLUMNS).

One enumeration, `text_piece`/`text_pieces`: every text of a column with the row it belongs to
and each row's range (segments in stored order; a null list or a null segment holds no text).
Everything else here is built on it, in the shape a stage needs (the difference is the function
you call, not a flag):
- `record_texts`: ONE string per record -- segment texts in stored order joined by "\\n", then
  `chosen` and `rejected` appended ("\\n"-joined) when not null; a null segment text counts as
  empty. Dedup keys and signatures, quality's `text`/`text_chars` columns. Two preference pairs
  with one prompt but different answers stay different.
- `text_pieces`: EVERY text separately (nulls kept). Decontamination scans each piece on its own
  so an n-gram never spans the seam between two segments.
- `record_documents`: each record's segments read as ONE document, in document order: a FIM
  record is one file cut in three, read prefix, middle, suffix and joined with nothing (so a
  secret split around the cursor is whole again); other records' segments in stored order, a
  blank line between turns. PII scans these, then maps a finding back to the segments it
  touches through `RecordDocuments.parts`. (Not `record_texts`: that is dedup's hashed bytes,
  stored order with "\\n", and cannot change without changing every dedup key.)
- `with_texts`: the batch with some texts replaced, by their index in `text_piece` -- the way
  back for a stage that rewrites text (PII), in the training record's types.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datakit.contracts import SEGMENT

RECORD_TEXT_COLUMNS = ("segments", "chosen", "rejected")
# a preference output (`format: parquet` of pairs, a packed dataset's preference-*.parquet) holds its text here
PREFERENCE_TEXT_COLUMNS = ("prompt", "chosen", "rejected")
# a plain table (not training records) names its text one of these (first present wins)
GENERIC_TEXT_FIELDS = ("text", "content", "code")
# a FIM record's segments by role, in document order (one file: prefix, middle, suffix)
FIM_ROLES = ("prefix", "middle", "suffix")

__all__ = ["RECORD_TEXT_COLUMNS", "PREFERENCE_TEXT_COLUMNS", "GENERIC_TEXT_FIELDS", "FIM_ROLES", "TextPiece",
           "RecordDocuments", "as_text", "text_columns", "text_piece", "text_pieces", "record_texts",
           "record_documents", "with_texts"]

# (note: any pa.array call, of a list or of a numpy array, imports pandas on its first use in a process,
# 0.3 CPU-s, to check for pandas types; every datakit process makes such calls, so it is not avoided here)
_FIM_ROLES_ORDERED = pa.array(np.array(FIM_ROLES), pa.string())
# a feedback record's `completion` is what was shown at the cursor: between prefix and suffix, as a FIM
# middle (found in review: read after the suffix, a key cut by the cursor, `"ghp_aB3...` | `mN1p..."`, was
# never one string, and scrub_pii kept it in every feedback record while the FIM record of the event lost it)
_DOCUMENT_ROLES = pa.array(np.array([*FIM_ROLES, "selection", "completion"]), pa.string())
# prefix, middle, suffix, an inline edit's selection and completion (both where the middle is), any other role
_DOCUMENT_RANK = np.array([0, 1, 2, 1, 1, 3])


def text_columns(names: Sequence[str], text_fields: Sequence[str] | None = None,
                 every_generic: bool = False) -> list[str]:
    """The columns holding the text: `text_fields` if given (KeyError naming a missing one), else a
    training record's RECORD_TEXT_COLUMNS that are present, else a preference output's
    PREFERENCE_TEXT_COLUMNS, else the first GENERIC_TEXT_FIELDS column (`every_generic`: each one
    present); [] when there is none.

    `every_generic` is the contamination check's reading: a row of MBPP's shape holds the instruction
    under `text` and the solution under `code`, and the check read only `text` (found in review: 10
    HumanEval solutions under `code` checked clean). The stages keep the first column: which text a
    dedup or tokenize stage reads decides its output, and it is the document's text, not any text."""
    if text_fields:
        missing = [f for f in text_fields if f not in names]
        if missing:
            raise KeyError(f"no column {', '.join(missing)} (columns: {', '.join(names)})")
        return list(text_fields)
    if "segments" in names:
        return [c for c in RECORD_TEXT_COLUMNS if c in names]
    if all(c in names for c in PREFERENCE_TEXT_COLUMNS):
        return list(PREFERENCE_TEXT_COLUMNS)
    present = [c for c in GENERIC_TEXT_FIELDS if c in names]
    return present if every_generic else present[:1]


@dataclass
class TextPiece:
    """One text column of a batch, flattened: its strings, the row each belongs to, each row's range."""

    column: str          # "segments", "chosen", "rejected" or a generic column name
    texts: pa.Array      # string or large_string; a null text stays null
    rows: np.ndarray     # int64, text -> row in the batch
    offsets: np.ndarray  # int64, num_rows + 1: row r's texts are texts[offsets[r]:offsets[r + 1]]
    roles: pa.Array | None = None  # segments: each text's role (string, null where none); else None


def text_piece(column: str, values: pa.Array | pa.ChunkedArray) -> TextPiece:
    """Every text of one column. A list column (segments) contributes each element (a struct's
    `text` field; a null list or a null segment holds no text); a string column one string per row."""
    col = _combined(values)
    n = len(col)
    roles = None
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        texts, offsets = _flat(col)
        if pa.types.is_struct(texts.type):
            roles = _fields(texts).get("role")
            if roles is not None and not pa.types.is_string(roles.type):
                roles = roles.cast(pa.string())
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
    else:
        texts, rows, offsets = col, np.arange(n, dtype=np.int64), np.arange(n + 1, dtype=np.int64)
    return TextPiece(column, as_text(texts, column), rows, offsets, roles)


def as_text(values: pa.Array, column: str = "") -> pa.Array:
    """One string per value: a string as it is; a struct's `text`, else its `content` (a chat message),
    else its string fields joined by "\n"; a list's elements' texts joined by "\n"; numbers and other
    scalars cast. Why: found in review, a Parquet column of chat messages (`list<struct<role, content>>`)
    given as `--text-field` failed with "text", and a struct column crashed the check (exit 3), while the
    same data as JSON Lines was read. TypeError naming the column for a type that holds no text."""
    t = values.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return values
    if pa.types.is_null(t):
        return pa.nulls(len(values), pa.string())
    if pa.types.is_struct(t):
        fields = _fields(values)
        for name in ("text", "content"):
            if name in fields:
                return _masked(as_text(fields[name], column), values)
        texts = []
        for f in fields.values():
            try:
                texts.append(as_text(f, column))
            except TypeError:
                continue  # a field with no text (a binary blob) is left out, not the whole struct
        if not texts:
            raise TypeError(f"column {column!r} ({t}) holds no text field")
        return _masked(texts[0] if len(texts) == 1 else _join_present(texts), values)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner, offsets = _flat(values)
        lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pc.fill_null(as_text(inner, column), ""),
                                         mask=values.is_null() if values.null_count else None)
        return pc.binary_join(lists, "\n")
    try:
        return values.cast(pa.string())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        raise TypeError(f"column {column!r} ({t}) holds no text") from None


def _join_present(texts: list[pa.Array]) -> pa.Array:
    """Row-wise "\n"-join of the non-null texts; null where all are null.

    Why not `binary_join_element_wise(..., null_handling="skip")` alone: pyarrow 26.0.1 drops the rows
    where every input is null from its result (a shorter array, measured). Those rows are left out of
    the join and put back as nulls. (`record_texts` joins a never-null first part, so it is unaffected.)"""
    present = texts[0].is_valid()
    for t in texts[1:]:
        present = pc.or_(present, t.is_valid())
    if pc.all(present).as_py():
        return pc.binary_join_element_wise(*texts, "\n", null_handling="skip")
    idx = pc.indices_nonzero(present)
    joined = pc.binary_join_element_wise(*[t.take(idx) for t in texts], "\n", null_handling="skip")
    return pc.replace_with_mask(pa.nulls(len(present), pa.string()), present, joined.cast(pa.string()))


def _masked(texts: pa.Array, like: pa.Array) -> pa.Array:
    """`texts` with nulls where `like` (a struct array) is null."""
    if not like.null_count:
        return texts
    return pc.if_else(like.is_null(), pa.nulls(len(like), texts.type), texts)


def text_pieces(batch: pa.RecordBatch | pa.Table, columns: Sequence[str] | None = None) -> list[TextPiece]:
    """Every text of every row, one `TextPiece` per column (default: `text_columns(batch)`)."""
    return [text_piece(name, batch.column(name))
            for name in (columns if columns is not None else text_columns(batch.schema.names))]


def record_texts(batch: pa.RecordBatch | pa.Table, text_column: str | None = None) -> pa.Array:
    """The text of each record as one string (a `string` array, never null); see the module doc.

    `text_column` names a plain string column to use instead (dedup's `text_column`)."""
    if text_column is not None:
        return _strings(batch.column(text_column))
    seg = text_piece("segments", batch.column("segments"))
    texts = pc.fill_null(seg.texts, "") if len(seg.texts) else pa.array([], pa.string())
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(seg.offsets, pa.int32()), texts), "\n")
    parts = [joined] + [_combined(batch.column(c)) for c in RECORD_TEXT_COLUMNS[1:] if c in batch.schema.names]
    if len(parts) > 1:  # `joined` is never null, so no row is all null (see `_join_present`)
        joined = pc.binary_join_element_wise(*parts, "\n", null_handling="skip")
    return _strings(joined)


def _document_order(piece: TextPiece) -> tuple[np.ndarray, np.ndarray]:
    """(order, fim): `order` lists the piece's texts with each row's in document order (row r's are
    `order[offsets[r]:offsets[r + 1]]`): a FIM record -- `fim[r]`, a row with a prefix, middle or
    suffix segment -- reads prefix, middle (or a feedback record's completion), suffix, then its other
    segments; other rows as stored."""
    m, n = len(piece.texts), len(piece.offsets) - 1
    if piece.roles is None or not m:
        return np.arange(m), np.zeros(n, dtype=bool)
    is_fim = pc.fill_null(pc.is_in(piece.roles, _FIM_ROLES_ORDERED), False).to_numpy(zero_copy_only=False)
    if not is_fim.any():
        return np.arange(m), np.zeros(n, dtype=bool)
    row_fim = np.bincount(piece.rows, weights=is_fim, minlength=n) > 0
    role = pc.fill_null(pc.index_in(piece.roles, value_set=_DOCUMENT_ROLES), 5).to_numpy(zero_copy_only=False)
    rank = np.where(row_fim[piece.rows], _DOCUMENT_RANK[role], 0)
    return np.lexsort((np.arange(m), rank, piece.rows)), row_fim


@dataclass
class RecordDocuments:
    """Each row's segments as one document (`record_documents`), and the way back to the segments."""

    texts: pa.Array            # one per row; null for a row with no segment
    piece: TextPiece           # the segments they were built from
    order: np.ndarray | None   # see `_document_order`; None: one segment per row, `texts` IS `piece.texts`
    seps: list[str]            # per row: what joins its parts ([] when `order` is None)

    def parts(self, row: int) -> list[int]:
        """Indices (into `piece.texts`) of a row's segments, in document order."""
        if self.order is None:
            return [row]
        return self.order[self.piece.offsets[row]:self.piece.offsets[row + 1]].tolist()


def record_documents(piece: TextPiece, fim_sep: str = "", turn_sep: str = "\n\n") -> RecordDocuments:
    """Each row's segments read as one document (module doc): parts in `_document_order`, a FIM
    record's joined by `fim_sep`, other records' by `turn_sep`; a null text counts as empty.

    The common case costs nothing: when every row has exactly one segment and no row is FIM, the
    documents are the segment texts themselves (no copy, no per-row Python)."""
    n = len(piece.offsets) - 1
    lens = np.diff(piece.offsets)
    order, fim = _document_order(piece)
    if n and bool((lens == 1).all()) and not fim.any():
        return RecordDocuments(piece.texts, piece, None, [])
    seps = [fim_sep if f else turn_sep for f in fim.tolist()]
    ordered = pc.fill_null(piece.texts.cast(pa.string()).take(pa.array(order)), "")
    lists = pa.ListArray.from_arrays(pa.array(piece.offsets, pa.int32()), ordered)
    texts = pc.if_else(pa.array(lens > 0), pc.binary_join(lists, pa.array(seps, pa.string())),
                       pa.nulls(n, pa.string()))
    return RecordDocuments(texts, piece, order, seps)


def with_texts(batch: pa.RecordBatch, new: Mapping[str, Mapping[int, str | None]]) -> pa.RecordBatch:
    """`batch` with texts replaced: `new[column][i]` replaces text i of `text_piece(column)`.

    Each column named in `new` comes back in the training record's type (string texts; segments
    as `list<SEGMENT>`), so a stage that rewrites text outputs the contract; a column already in
    that type with nothing to replace is returned as it is. Other columns are untouched."""
    cols: dict[str, pa.Array] = {}
    for name, repl in new.items():
        col = _combined(batch.column(name))
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            if not repl and col.type == _SEGMENTS_TYPE:
                continue
            flat, offsets = _flat(col)
            field = _fields(flat)
            values = pa.StructArray.from_arrays(
                [_replace(field["text"], repl), field["train"].cast(pa.bool_()), field["role"].cast(pa.string())],
                fields=list(SEGMENT), mask=flat.is_null() if flat.null_count else None)
            cols[name] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values,
                                                  mask=col.is_null() if col.null_count else None)
        else:
            cols[name] = _replace(col, repl)
    if not cols:
        return batch
    names = batch.schema.names
    return pa.RecordBatch.from_arrays(
        [cols.get(name, batch.column(i)) for i, name in enumerate(names)],
        schema=pa.schema([batch.schema.field(i) if name not in cols else pa.field(name, cols[name].type)
                          for i, name in enumerate(names)]))


_SEGMENTS_TYPE = pa.list_(SEGMENT)


def _replace(arr: pa.Array, new: Mapping[int, str | None]) -> pa.Array:
    """`arr` (as string) with the elements at `new`'s indices replaced."""
    arr = arr.cast(pa.string())
    if not new:
        return arr
    idx = sorted(new)
    mask = np.zeros(len(arr), dtype=bool)
    mask[idx] = True
    return pc.replace_with_mask(arr, pa.array(mask), pa.array([new[i] for i in idx], pa.string()))


def _flat(col: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A list column's elements (slicing honoured; a null list has none) and each row's range in them:
    the one enumeration `text_piece` and `with_texts` share, so an index means the same text in both."""
    if not col.null_count:  # the common case: the column's own offsets and values, no copy
        offsets = col.offsets.to_numpy().astype(np.int64)
        return col.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])), offsets - offsets[0]
    lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.zeros(len(col) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pc.list_flatten(col), offsets


def _fields(structs: pa.StructArray) -> dict[str, pa.Array]:
    """A struct array's fields by name; a null struct's fields are null (`StructArray.flatten`)."""
    return dict(zip([f.name for f in structs.type], structs.flatten()))


def _combined(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _strings(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`string` (not large_string), nulls as "": the bytes every consumer of `record_texts` hashes."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    if pa.types.is_large_string(texts.type):
        texts = texts.cast(pa.string())
    return pc.fill_null(texts, "")
