"""Token ids of one very long text in bounded memory, equal to encoding it whole.

Why: the `tokenizers` library builds a whole `Encoding` (ids, tokens, offsets, masks) of a text before
returning it, ~100-150 bytes per character: one 8 MB document (a pasted minified bundle, a generated
file) peaked at 1.1 GB in a bare process and ~1.85 GB in a pool worker. Two workers meeting two such
documents could be killed by the kernel's out-of-memory killer.

How: the text is encoded in windows of `WINDOW` characters, each starting `OVERLAP` characters before
the previous one ends. Inside the overlap the two encodings are compared; at the first character
offset where both start a new pre-token (the library's `word_ids`) and agree on every token (id and
offsets) from there to `MARGIN` characters short of the earlier window's end, the earlier window's
tokens stop and the later one's take over. A window's own edges (a word cut at its end, a prefix space or a `▁` added at its
start) never reach output: the cut is at least `MARGIN` characters from both.

Equal to the whole-text encoding because a pre-tokenizer splits text into pieces that are encoded
on their own (BPE, WordPiece and Unigram models never look across a piece), and where a piece starts
depends on a few characters around it: a piece boundary that two windows with thousands of characters
of context on each side agree on is the whole text's. Where no such offset exists in an overlap (one
piece longer than the overlap, or a tokenizer with no pre-tokenizer, such as Llama 2's, whose whole
text is one piece), the text is encoded whole, as before. Tests compare both ways on several
tokenizer types.
"""
from __future__ import annotations

from typing import Any

import numpy as np

WINDOW = 1 << 19  # characters per window: ~75 MB of Encoding each, two alive at a comparison
OVERLAP = 1 << 14  # characters the next window re-reads before the previous window's end
MARGIN = OVERLAP // 4  # the cut stays this far from either window's edge


def encode_long(tokenizer: Any, text: str, window: int | None = None, overlap: int | None = None,
                margin: int | None = None) -> np.ndarray:
    """int32 ids of `text` with a `tokenizers.Tokenizer` (its own settings, e.g. special-token text as plain
    text), window by window; the same ids as `tokenizer.encode(text, add_special_tokens=False).ids`.
    `window`/`overlap`/`margin` default to the module's constants (read at call time)."""
    window, overlap = window or WINDOW, overlap or OVERLAP
    margin = margin or MARGIN
    if not 0 < 2 * margin < overlap < window:
        raise ValueError("encode_long needs 0 < 2 * margin < overlap < window")
    n = len(text)
    if n <= window:
        return np.asarray(_encode(tokenizer, text).ids, dtype=np.int32)
    pieces: list[np.ndarray] = []
    start, enc, emit = 0, _encode(tokenizer, text[:window]), 0  # current window: its start, encoding, first kept token
    while start + window < n:
        nxt_start = start + window - overlap
        nxt = _encode(tokenizer, text[nxt_start: nxt_start + window])
        cut = _sync(enc, start, nxt, nxt_start, lo=nxt_start + margin, hi=start + window - margin, first=emit)
        if cut is None:  # no agreement in this overlap: the whole text, as the library does it
            return np.asarray(_encode(tokenizer, text).ids, dtype=np.int32)
        i_cur, i_nxt = cut
        pieces.append(np.asarray(enc.ids[emit:i_cur], dtype=np.int32))
        start, enc, emit = nxt_start, nxt, i_nxt
    pieces.append(np.asarray(enc.ids[emit:], dtype=np.int32))
    return np.concatenate(pieces)


def _encode(tokenizer: Any, text: str) -> Any:
    return tokenizer.encode(text, add_special_tokens=False)


def _sync(a: Any, a_start: int, b: Any, b_start: int, lo: int, hi: int, first: int) -> tuple[int, int] | None:
    """(index in a, index in b) of the first token both start at the same absolute offset x in [lo, hi)
    after which they agree on every token ending by `hi`; None if there is none. Only tokens of `a`
    from `first` on are candidates (earlier ones are already written)."""
    a_ids, a_off, a_words = a.ids, a.offsets, a.word_ids
    b_ids, b_off, b_words = b.ids, b.offsets, b.word_ids
    b_at: dict[int, int] = {}
    for j in range(len(b_off)):
        x = b_start + b_off[j][0]
        if x >= hi:
            break
        if x >= lo and _clean_start(b_off, b_words, j) and x not in b_at:
            b_at[x] = j
    i0 = len(a_off)  # the stretch lies near a's end: walk back to its first token, not over the whole window
    while i0 > first and a_start + a_off[i0 - 1][0] >= lo:
        i0 -= 1
    for i in range(i0, len(a_off)):
        x = a_start + a_off[i][0]
        if x >= hi:
            return None
        if x < lo or not _clean_start(a_off, a_words, i) or x not in b_at:
            continue
        j = b_at[x]
        if _agree(a_ids, a_off, a_start, i, b_ids, b_off, b_start, j, hi):
            return i, j
    return None


def _clean_start(off: list[tuple[int, int]], words: list[int | None], i: int) -> bool:
    """Token i starts a new pre-token (its word id differs from the token before it) at a new character
    (the token before it ends by its start: a character split into several byte-level tokens gives them
    all the same offsets). Why pre-tokens: the model encodes each on its own, so a cut between two is a
    cut the whole text's encoding has too; inside one (a BPE word), merges may depend on its far end."""
    if i == 0 or words[i] is None or words[i - 1] is None or words[i] == words[i - 1]:
        return False
    return off[i][1] > off[i][0] and off[i - 1][1] <= off[i][0]


def _agree(a_ids, a_off, a_start, i, b_ids, b_off, b_start, j, hi) -> bool:
    """Tokens a[i:] and b[j:] are equal (ids and absolute offsets) for every token of a ending by `hi`,
    and that stretch is not empty."""
    k = 0
    while i + k < len(a_ids) and a_start + a_off[i + k][1] <= hi:
        if j + k >= len(b_ids) or a_ids[i + k] != b_ids[j + k] or \
                a_start + a_off[i + k][0] != b_start + b_off[j + k][0] or \
                a_start + a_off[i + k][1] != b_start + b_off[j + k][1]:
            return False
        k += 1
    return k > 0
