"""Which text of a record is deduplicated, and the exact-duplicate content key.

Why one definition: exact keys, MinHash signatures and verification must all
see the same text, on every engine. The text of a training record is its
segment texts in stored order joined by one newline, followed (newline-joined)
by `chosen` and `rejected` when they are not null (so two preference pairs with
the same prompt but different answers are not duplicates). Null segment texts
count as empty. A stage may name a plain string column instead (`text_column`).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from numba import njit

from datakit.stages.dedup.shingles import WS_TABLE, arrow_buffers, collapse_words, normalize_texts


def record_texts(batch: pa.RecordBatch | pa.Table, text_column: str | None = None) -> pa.Array:
    """The dedup text of each row (a `string` array, never null)."""
    if text_column is not None:
        return normalize_texts(batch.column(text_column), lowercase=False)
    seg = batch.column("segments")
    if isinstance(seg, pa.ChunkedArray):
        seg = seg.combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(seg), 0).to_numpy(zero_copy_only=False).astype(np.int32)
    offsets = np.zeros(len(seg) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = seg.flatten()  # honours slicing; null lists contribute nothing
    texts = pc.fill_null(pc.struct_field(flat, "text"), "") if len(flat) else pa.array([], pa.string())
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), texts), "\n")
    parts = [joined]
    for extra in ("chosen", "rejected"):
        if extra in batch.schema.names:
            col = batch.column(extra)
            parts.append(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    if len(parts) > 1:
        joined = pc.binary_join_element_wise(*parts, "\n", null_handling="skip")
    return normalize_texts(joined, lowercase=False)


@njit(cache=True)
def _collapse_all(data: np.ndarray, offsets: np.ndarray, ws: np.ndarray):
    """Whitespace-collapse every document (same rule as word shingles); returns (bytes, offsets)."""
    n_docs = offsets.shape[0] - 1
    out = np.empty(max(offsets[n_docs] - offsets[0], 1), np.uint8)
    out_off = np.empty(n_docs + 1, np.int64)
    maxlen = 0
    for d in range(n_docs):
        maxlen = max(maxlen, offsets[d + 1] - offsets[d])
    wend = np.empty(maxlen + 2, np.int64)
    pos = 0
    out_off[0] = 0
    for d in range(n_docs):
        n, _w = collapse_words(data, offsets[d], offsets[d + 1], out[pos:], wend, ws)
        pos += n
        out_off[d + 1] = pos
    return out, out_off


def exact_keys(texts: pa.Array, normalize: str = "whitespace", scope: pa.Array | None = None) -> pa.Array:
    """128-bit content key (32 hex chars of XXH3-128) per text, for exact dedup.

    `normalize="whitespace"`: whitespace runs become one space and the ends are
    trimmed before hashing (CRLF vs LF, trailing spaces, re-indentation and
    re-wrapping do not make a copy unique); `"none"`: the raw UTF-8 bytes.
    `scope` (e.g. the `kind` column) is hashed in front of the text, so equal
    texts in different scopes get different keys. 128 bits: a billion documents
    collide with probability ~1e-21.
    """
    texts = normalize_texts(texts, lowercase=False)
    if normalize == "whitespace":
        data, offsets = arrow_buffers(texts)
        raw, off = _collapse_all(data, offsets, WS_TABLE) if len(texts) else (np.zeros(0, np.uint8), np.zeros(1, np.int64))
        blob = raw.tobytes()
        spans = off
    elif normalize == "none":
        data, offsets = arrow_buffers(texts)
        blob = data.tobytes()
        spans = offsets
    else:
        raise ValueError(f"exact normalize must be 'whitespace' or 'none', got {normalize!r}")
    prefixes = [b""] * len(texts)
    if scope is not None:
        prefixes = [(s or "").encode() + b"\x00" for s in scope.to_pylist()]
    h = xxhash.xxh3_128_hexdigest
    sp = spans.tolist()
    keys = [h(p + blob[sp[i] : sp[i + 1]]) for i, p in enumerate(prefixes)]
    return pa.array(keys, type=pa.string())
