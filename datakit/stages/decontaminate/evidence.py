"""Side-by-side evidence for a match: the eval item's text and the document's, with shared spans marked.

Why spans are recomputed on the final (redacted, clipped) texts: offsets taken
before redaction would point into text that changed; re-hashing each excerpt's
windows under the table's views and marking those whose hash is among the
n-grams the two sides share gives spans that are true of exactly what is shown
(a redacted secret simply stops matching).
"""
from __future__ import annotations

import numpy as np

from datakit.stages.decontaminate.matcher import EvalTable, merge_spans
from datakit.stages.decontaminate.ngrams import hash_strings, texts_to_buffers
from datakit.stages.decontaminate.redact import excerpt

EXCERPT_CHARS = 2000


def shared_spans(text: str, table: EvalTable, hashes: np.ndarray) -> list[list[int]]:
    """Character spans of `text` covered by a window (any view) whose hash is in `hashes` (sorted)."""
    if not text or not len(hashes):
        return []
    data, offs = texts_to_buffers([text])
    spans = []
    for vn, vf in table.views or ((table.n, table.flags),):
        h, _, a, b = hash_strings(data, offs, vn, vf, spans=True)
        hit = np.isin(h, hashes)
        spans += list(zip(a[hit].tolist(), b[hit].tolist()))
    raw = text.encode()
    return [[len(raw[:x].decode("utf-8", "replace")), len(raw[:y].decode("utf-8", "replace"))]
            for x, y in merge_spans(spans)]


def eval_excerpt(table: EvalTable, item: int, hashes: np.ndarray) -> tuple[str | None, int | None, str | None]:
    """(field, first line, text): the lines of the item's field that holds most of the shared n-grams."""
    spans = table.eval_spans(item, hashes)
    if not spans:
        return None, None, None
    fields = [f for f, _, _ in spans]
    best = max(dict.fromkeys(fields), key=fields.count)
    mine = [(a, b) for f, a, b in spans if f == best]
    lo, hi = min(a for a, _ in mine), max(b for _, b in mine)
    text, _, _, line = excerpt(table.item_text(item, best), lo, hi, limit=4 * EXCERPT_CHARS)
    return best, line, text


def item_hashes(table: EvalTable, hidx: np.ndarray) -> np.ndarray:
    return np.unique(table.hashes[np.asarray(hidx, np.int64)]) if len(hidx) else np.zeros(0, np.uint64)
