"""Shingles: exactly which bytes a document contributes to its MinHash set.

Why a written definition: the signature kernel (`minhash.py`) never builds
Python shingle objects; it walks UTF-8 bytes. For our signatures to be
bit-identical to `datasketch.MinHash(...).update_batch(shingles)` a researcher
must be able to produce the *same* shingle bytes. `shingles()` below is that
reference (pure Python, slow, used by tests and benchmarks) and the kernel
matches it byte for byte.

Definition (after the optional Arrow `utf8_lower` of `normalize_texts`):

* whitespace = the six ASCII bytes ``\\t \\n \\v \\f \\r`` and space (what
  `bytes.split()` splits on). Unicode spaces such as U+00A0 are ordinary
  characters.
* ``shingle="word"``: words = maximal runs of non-whitespace bytes; shingle i =
  words i..i+n-1 joined by one space (``b" ".join(words[i:i+n])``). A document
  with 1 <= words < n has one shingle: all its words joined by one space.
* ``shingle="token"`` (the stage default, for code): like "word" but the words
  are maximal runs of identifier bytes ``[A-Za-z0-9_]`` or any byte >= 0x80
  (so non-ASCII letters stay inside tokens); all other bytes separate.
  Punctuation, quotes and spacing do not matter: ``f('a',b)`` and
  ``f("a", b)`` give the same tokens ``f a b``.
* ``shingle="char"``: the text with every whitespace run replaced by one space
  and leading/trailing whitespace removed; shingle i = the UTF-8 bytes of
  code points i..i+n-1. A document with 1 <= code points < n has one shingle
  (the whole normalized text).
* A document with no word (empty or whitespace only) has no shingles; its
  signature is datasketch's empty value (all ``0xFFFFFFFF``) and the dedup
  stage never puts it in an LSH bucket.
"""
from __future__ import annotations

import re
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datakit.jit import njit

ShingleKind = Literal["token", "word", "char"]
SHINGLE_KINDS = ("token", "word", "char")
_TOKEN_RE = re.compile(rb"[A-Za-z0-9_\x80-\xff]+")


def normalize_texts(texts: pa.Array | pa.ChunkedArray, lowercase: bool) -> pa.Array:
    """The Unicode part of the normalization, done once per batch by Arrow (C++, vectorized).

    Whitespace handling is part of the shingle definition above, not done here.
    Nulls become empty strings (a null text has no shingles).
    """
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    if pa.types.is_large_string(texts.type):
        texts = texts.cast(pa.string())
    texts = pc.fill_null(texts, "")
    if lowercase:
        texts = pc.utf8_lower(texts)
    return texts


def shingles(text: str, ngram: int = 5, shingle: ShingleKind = "word") -> list[bytes]:
    """Reference shingles of one (already `normalize_texts`-normalized) text, in document order.

    Duplicates are kept: MinHash is a min over the set, so repeats do not change it.
    """
    if ngram < 1:
        raise ValueError("ngram must be >= 1")
    if shingle in ("word", "token"):
        raw = text.encode("utf-8")
        words = raw.split() if shingle == "word" else _TOKEN_RE.findall(raw)
        if not words:
            return []
        return [b" ".join(words[i : i + ngram]) for i in range(max(len(words) - ngram + 1, 1))]
    if shingle == "char":
        norm = b" ".join(text.encode("utf-8").split()).decode("utf-8")
        if not norm:
            return []
        return [norm[i : i + ngram].encode("utf-8") for i in range(max(len(norm) - ngram + 1, 1))]
    raise ValueError(f"shingle must be one of {SHINGLE_KINDS}, got {shingle!r}")


def arrow_buffers(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(data uint8, offsets int64[n+1]) views of a string array, honouring its slice offset.

    Offsets are rebased to 0 so the kernel can index `data` directly; nulls must
    already be filled (see `normalize_texts`).
    """
    n = len(texts)
    if n == 0:
        return np.zeros(0, np.uint8), np.zeros(1, np.int64)
    bufs = texts.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=texts.offset + n + 1)[texts.offset :]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return data, offsets.astype(np.int64)


# 1 for the six ASCII whitespace bytes, else 0 (a lookup keeps the byte loop branch-free)
WS_TABLE = np.zeros(256, dtype=np.uint8)
for _c in b" \t\n\r\x0b\x0c":
    WS_TABLE[_c] = 1
WS_TABLE.setflags(write=False)
# 1 for every byte that is not part of a token (see "token" above)
TOKEN_SEP_TABLE = np.ones(256, dtype=np.uint8)
for _c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_":
    TOKEN_SEP_TABLE[_c] = 0
TOKEN_SEP_TABLE[0x80:] = 0
TOKEN_SEP_TABLE.setflags(write=False)


def separator_table(shingle: str) -> np.ndarray:
    """The byte class table `collapse_words` splits on for a shingle kind."""
    return TOKEN_SEP_TABLE if shingle == "token" else WS_TABLE


@njit(cache=True)
def collapse_words(data: np.ndarray, start: int, end: int, buf: np.ndarray, wend: np.ndarray, ws: np.ndarray):
    """Copy data[start:end] into `buf` with whitespace runs -> one space and the ends trimmed.

    Returns (n, words): the normalized length and the word count; word k ends
    at buf index wend[k] (exclusive) and starts after the space ending word
    k-1. Branch-free on purpose: code alternates words and whitespace so often
    that a branchy loop is dominated by mispredictions. `buf` and `wend` need
    end-start+1 slots.
    """
    n = 0
    w = 0
    prev = 1  # "previous byte was whitespace": leading whitespace is dropped
    for i in range(start, end):
        c = data[i]
        s = ws[c]
        buf[n] = 32 if s else c
        wend[w] = n
        w += s & (1 - prev)
        n += 1 - (s & prev)
        prev = s
    if prev == 0:
        wend[w] = n
        w += 1
    elif n > 0:
        n -= 1  # drop the single trailing space
    return n, w


@njit(cache=True)
def char_starts(buf: np.ndarray, n: int, cps: np.ndarray) -> int:
    """Byte index of each UTF-8 code point (lead bytes) of buf[:n] into `cps`; returns the count."""
    k = 0
    for i in range(n):
        cps[k] = i
        k += (buf[i] & 0xC0) != 0x80
    return k


@njit(cache=True, inline="always")
def shingle_count(units: int, ngram: int) -> int:
    if units == 0:
        return 0
    return max(units - ngram + 1, 1)


@njit(cache=True, inline="always")
def word_shingle(wend: np.ndarray, words: int, ngram: int, s: int) -> tuple[int, int]:
    """(start, end) in the normalized buffer of word shingle s."""
    st = 0 if s == 0 else wend[s - 1] + 1
    return st, wend[min(s + ngram - 1, words - 1)]


@njit(cache=True, inline="always")
def char_shingle(cps: np.ndarray, ncp: int, n: int, ngram: int, s: int) -> tuple[int, int]:
    """(start, end) in the normalized buffer of character shingle s."""
    last = s + ngram
    return cps[s], (cps[last] if last < ncp else n)
