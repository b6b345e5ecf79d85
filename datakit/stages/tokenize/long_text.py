"""Token ids of one very long text in bounded memory, equal to encoding it whole.

Why: the `tokenizers` library builds a whole `Encoding` (ids, tokens, offsets, masks) of a text before
returning it, ~100-150 bytes per character: one 8 MB document (a pasted minified bundle, a generated
file) peaked at 1.1 GB in a bare process and ~1.85 GB in a pool worker. Two workers meeting two such
documents could be killed by the kernel's out-of-memory killer.

How: the text is cut into pieces of about `PIECE` characters, each cut at the start of a pre-token
(the unit a BPE, WordPiece or Unigram model encodes on its own, the library's `word_ids`), and the
pieces are encoded by the library's batch encoder, two at a time (one per thread). A cut x near each
target offset is accepted only if small encodings ("probes", with offsets) show it changes nothing:

- two probes that hold x with `PROBE` and 2 x `PROBE` characters of context on either side both start
  a pre-token at x and agree on every token within `PROBE` / 2 characters of it;
- a probe that ends at x (as the piece before it does) and one that starts at x (as the piece after
  it does) give the same tokens there as those probes: a window's own edge (a `▁` or space a
  SentencePiece-style pre-tokenizer adds at a text's start, a word cut short at its end) would show.

Where no offset near a target passes (one piece of the pre-tokenizer longer than the probes, or a
tokenizer with no pre-tokenizer, such as Llama 2's, whose whole text is one piece), the text is
encoded whole, as before. Tests compare both ways on several tokenizer types.
"""
from __future__ import annotations

from typing import Any

import numpy as np

PIECE = 1 << 19  # characters per piece: two pieces' Encodings (one per encoder thread) are alive at once
PROBE = 1 << 12  # characters of context a cut is checked with on each side


def encode_long(tokenizer: Any, text: str, piece: int | None = None, probe: int | None = None) -> np.ndarray:
    """int32 ids of `text` with a `tokenizers.Tokenizer` (its own settings, e.g. special-token text as plain
    text), piece by piece; the same ids as `tokenizer.encode(text, add_special_tokens=False).ids`.
    `piece`/`probe` default to the module's constants (read at call time)."""
    piece, probe = piece or PIECE, probe or PROBE
    if not 0 < 4 * probe < piece:
        raise ValueError("encode_long needs 0 < 4 * probe < piece")
    n = len(text)
    cuts = [0]
    for target in range(piece, n - piece // 2, piece):
        x = _cut_near(tokenizer, text, target, probe)
        if x is None or x <= cuts[-1]:
            return _whole(tokenizer, text)
        cuts.append(x)
    cuts.append(n)
    out: list[np.ndarray] = []
    spans = list(zip(cuts, cuts[1:]))
    for k in range(0, len(spans), 2):
        encs = _batch(tokenizer)([text[a:b] for a, b in spans[k:k + 2]], add_special_tokens=False)
        out.extend(np.asarray(e.ids, dtype=np.int32) for e in encs)
        del encs
    return np.concatenate(out) if out else np.zeros(0, np.int32)


def _batch(tokenizer: Any) -> Any:
    """The library's batch encoder without offsets where it has one (as `LoadedTokenizer._hf_encodings`)."""
    return getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch


def _whole(tokenizer: Any, text: str) -> np.ndarray:
    return np.asarray(_encode(tokenizer, text).ids, dtype=np.int32)


def _encode(tokenizer: Any, text: str) -> Any:
    return tokenizer.encode(text, add_special_tokens=False)


def _cut_near(tokenizer: Any, text: str, t: int, m: int) -> int | None:
    """A cut offset within m/2 of `t` that the probes (module docstring) show changes no token, or None."""
    lo, hi = t - m // 2, t + m // 2
    left_start, right_start = t - 2 * m, t - m
    left = _encode(tokenizer, text[left_start: t + m])
    right = _encode(tokenizer, text[right_start: t + 2 * m])
    x = _sync(left, left_start, right, right_start, lo, hi)
    if x is None:
        return None
    ends_at = _encode(tokenizer, text[x - m: x])  # as the piece before the cut ends
    starts_at = _encode(tokenizer, text[x: x + m])  # as the piece after it starts
    if _tokens(ends_at, x - m, x - m // 2, x) != _tokens(left, left_start, x - m // 2, x):
        return None
    if _tokens(starts_at, x, x, x + m // 2) != _tokens(right, right_start, x, x + m // 2):
        return None
    return x


def _tokens(enc: Any, start: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(id, absolute start, absolute end) of the tokens of `enc` (of a text starting at `start`) that lie
    within [lo, hi)."""
    return [(i, start + a, start + b) for i, (a, b) in zip(enc.ids, enc.offsets)
            if start + a >= lo and start + b <= hi]


def _sync(a: Any, a_start: int, b: Any, b_start: int, lo: int, hi: int) -> int | None:
    """The first absolute offset x in [lo, hi) where encodings a and b both start a new pre-token and
    agree on every token from there to `hi`; None if there is none."""
    a_ids, a_off, a_words = a.ids, a.offsets, a.word_ids
    b_ids, b_off, b_words = b.ids, b.offsets, b.word_ids
    b_at: dict[int, int] = {}
    for j in range(len(b_off)):
        x = b_start + b_off[j][0]
        if x >= hi:
            break
        if x >= lo and _clean_start(b_off, b_words, j) and x not in b_at:
            b_at[x] = j
    for i in range(len(a_off)):
        x = a_start + a_off[i][0]
        if x >= hi:
            return None
        if x < lo or not _clean_start(a_off, a_words, i) or x not in b_at:
            continue
        if _agree(a_ids, a_off, a_start, i, b_ids, b_off, b_start, b_at[x], hi):
            return x
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
