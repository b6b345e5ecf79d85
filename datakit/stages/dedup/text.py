"""The exact-duplicate content key of a record's text.

Why one definition: exact keys, MinHash signatures and verification must all
see the same text, on every engine: `datakit.stages.texts.record_texts` (segment
texts, then `chosen`/`rejected`, newline-joined; or a plain `text_column`).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash
from datakit.jit import njit

from datakit.stages.dedup.shingles import WS_TABLE, arrow_buffers, normalize_texts


@njit(cache=True)
def _collapse_all(data: np.ndarray, offsets: np.ndarray, ws: np.ndarray):
    """Whitespace-collapse every document (same rule as word shingles); returns (bytes, offsets).

    Branch-free like `shingles.collapse_words`, without its word bookkeeping.
    """
    n_docs = offsets.shape[0] - 1
    out = np.empty(max(offsets[n_docs] - offsets[0], 1), np.uint8)
    out_off = np.empty(n_docs + 1, np.int64)
    pos = 0
    out_off[0] = 0
    for d in range(n_docs):
        start = pos
        prev = 1
        for i in range(offsets[d], offsets[d + 1]):
            c = data[i]
            sp = ws[c]
            out[pos] = 32 if sp else c
            pos += 1 - (sp & prev)
            prev = sp
        if prev == 1 and pos > start:
            pos -= 1  # the single trailing space
        out_off[d + 1] = pos
    return out, out_off


def exact_keys(texts: pa.Array, normalize: str = "whitespace", scope: pa.Array | None = None) -> pa.Array:
    """128-bit content key (32 hex chars of XXH3-128) per text, for exact dedup.

    `normalize="whitespace"`: whitespace runs become one space and the ends are
    trimmed before hashing (CRLF vs LF, trailing spaces, re-indentation and
    re-wrapping do not make a copy unique); `"none"`: the raw UTF-8 bytes.
    `scope` (e.g. the `kind` column) picks the hash seed (its XXH64), so equal
    texts in different scopes get different keys; no scope = seed 0. 128 bits: a
    billion documents collide with probability ~1e-21.
    """
    texts = normalize_texts(texts, lowercase=False)
    if normalize == "whitespace":
        data, offsets = arrow_buffers(texts)
        raw, spans = _collapse_all(data, offsets, WS_TABLE) if len(texts) else (np.zeros(0, np.uint8), np.zeros(1, np.int64))
    elif normalize == "none":
        raw, spans = arrow_buffers(texts)
    else:
        raise ValueError(f"exact normalize must be 'whitespace' or 'none', got {normalize!r}")
    seeds = [0] * len(texts)
    if scope is not None:
        seed_of: dict[str | None, int] = {}
        seeds = [seed_of.setdefault(s, xxhash.xxh64_intdigest((s or "").encode())) for s in scope.to_pylist()]
    mv = memoryview(raw)  # zero-copy slices: no per-document bytes objects
    h = xxhash.xxh3_128_hexdigest
    sp = spans.tolist()
    return pa.array([h(mv[sp[i] : sp[i + 1]], seeds[i]) for i in range(len(texts))], type=pa.string())
