"""64-bit n-gram hashes over normalized tokens, computed a whole Arrow string array at a time.

Why batch kernels over raw Arrow buffers: the check must scan a training set at
hundreds of MB/s, so text never becomes Python objects. A kernel takes the
UTF-8 data buffer and offsets of a string array, lexes every string
(`normalize.lex`), hashes every window of `n` tokens, and either returns the
hashes (building eval tables and indexes) or probes them in an open-addressing
table of eval hashes (scanning).

Window hash: `h = SEED; for each token v: h = (h ^ v) * P; fmix64(h ^ n)`, never 0.
Under `identifiers`, an identifier token's `v` is a placeholder that says which
earlier token of the *same window* it repeats (distance back), or that it is
new there: the window's hash is then invariant under consistent renaming.
"""
from __future__ import annotations

from typing import Sequence

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import prange

from datakit.jit import njit
from datakit.stages.decontaminate.normalize import (
    _CLS, DEFAULT_NORMALIZATIONS, F_FLAT, F_IDENT, U64, _fmix, flags_of, keyword_hashes, lex,
)


def min_punct(n: int, flags: int) -> int:
    """Punctuation tokens a window needs under `identifiers` + `flat` (0: no requirement).

    Why: `flat` lexes docstring prose as code, and canonical identifiers turn
    prose into word-shape n-grams ("I I I the I") that any English text matches.
    Code has punctuation every few tokens; prose rarely.
    """
    return n // 3 if (flags & F_IDENT) and (flags & F_FLAT) else 0

_SEED = U64(0x9E3779B97F4A7C15)
_P = U64(0x100000001B3)
_ID_NEW = U64(0x5BD1E9955BD1E995)
_ID_REF = U64(0x27D4EB2F165667C5)
_ONE = U64(1)
_ZERO = U64(0)


@njit(cache=True)
def _prev_distance(tok_val, tok_ident, ntok, n, prevd, cval):
    """prevd[i] = distance back to the same identifier within n-1 tokens (0 = none); cval[i] = the
    value token i hashes as under `identifiers` when that earlier copy is inside the window (`_window`).

    Why cval: the hash loop then picks between two precomputed values by one comparison instead
    of branching on the token's kind (an identifiers scan of 31 MB of code: 0.41 -> 0.36 s).
    """
    for i in range(ntok):
        prevd[i] = 0
        cval[i] = tok_val[i]
        if tok_ident[i]:
            cval[i] = _ID_NEW
            for b in range(1, n):
                if i - b < 0:
                    break
                if tok_ident[i - b] and tok_val[i - b] == tok_val[i]:
                    prevd[i] = b
                    cval[i] = _ID_REF + U64(b)
                    break


@njit(cache=True)
def _punct_prefix(data, tok_start, ntok, pp):
    """pp[i] = punctuation tokens among the first i tokens, so a window's count is one subtraction."""
    pp[0] = 0
    for i in range(ntok):
        pp[i + 1] = pp[i] + (1 if _CLS[data[tok_start[i]]] == 0 else 0)


@njit(cache=True, inline="always")
def _punct_ok(pp, s, n, minpunct):
    """Whether the window of `n` tokens from token `s` has `minpunct` punctuation tokens (see `min_punct`)."""
    return pp[s + n] - pp[s] >= minpunct


@njit(cache=True, inline="always")
def _window(tok_val, cval, prevd, s, n, canon):
    """Hash of the window of `n` tokens from token `s` (never 0).

    Under `identifiers` (canon), token t hashes as cval[t] when the earlier copy prevd[t] tokens
    back lies inside the window (always so for tokens that are not identifiers: prevd 0), else
    as a new identifier (see `_prev_distance`).

    Callers test `_punct_ok` apart, and only when `minpunct > 0`: with that test inside this
    function, behind a flag known only at run time, LLVM compiled the hash loop 2-4x slower
    (a 31 MB scan took 0.55 s instead of 0.15 s), even on the path that never takes it.
    """
    h = _SEED
    for j in range(n):
        t = s + j
        if canon:
            v = cval[t] if prevd[t] <= j else _ID_NEW
        else:
            v = tok_val[t]
        h = (h ^ v) * _P
    h = _fmix(h ^ U64(n))
    if h == _ZERO:
        h = _ONE
    return h


@njit(cache=True, inline="always")
def _token_buffers(maxlen, canon, punct):
    """The arrays `lex` fills for one string, sized for the longest; one set is reused for every string.

    (tok_val, tok_start, tok_end, tok_ident, prevd, pp, cval); prevd and cval are used only under
    `identifiers` (canon) and pp only with a punctuation requirement (punct), else they are one slot:
    every full-size array costs 8 bytes per byte of the longest string.
    """
    nc = maxlen + 1 if canon else 1
    return (np.empty(maxlen + 1, np.uint64), np.empty(maxlen + 1, np.int64), np.empty(maxlen + 1, np.int64),
            np.empty(maxlen + 1, np.uint8), np.empty(nc, np.int64), np.empty(maxlen + 2 if punct else 1, np.int64),
            np.empty(nc, np.uint64))


@njit(cache=True)
def _lex_windows(data, a, b, flags, kw, n, minpunct, bufs):
    """Lex data[a:b] into `bufs` (`_token_buffers`) and prepare what its windows need: distances back
    under `identifiers`, punctuation counts when windows need some. Returns the token count (< n: no window)."""
    tok_val, tok_start, tok_end, tok_ident, prevd, pp, cval = bufs
    ntok = lex(data, a, b, flags, kw, tok_val, tok_start, tok_end, tok_ident)
    if ntok >= n:
        if (flags & 8) != 0:
            _prev_distance(tok_val, tok_ident, ntok, n, prevd, cval)
        if minpunct > 0:
            _punct_prefix(data, tok_start, ntok, pp)
    return ntok


@njit(cache=True)
def _hash_strings(data, offsets, n, flags, kw, want_spans, minpunct):
    """All window hashes of every string: (hashes, string index per hash, start byte, end byte)."""
    nstr = offsets.shape[0] - 1
    maxlen = 0
    total = 0
    for s in range(nstr):
        ln = offsets[s + 1] - offsets[s]
        total += ln
        if ln > maxlen:
            maxlen = ln
    canon = (flags & 8) != 0
    bufs = _token_buffers(maxlen, canon, minpunct > 0)
    tok_val, tok_start, tok_end, tok_ident, prevd, pp, cval = bufs
    cap = max(16, total // 3)  # ~1 token per 3-4 bytes of code; grows if needed
    out_h = np.empty(cap, np.uint64)
    out_s = np.empty(cap, np.int64)
    out_a = np.empty(cap if want_spans else 1, np.int64)
    out_b = np.empty(cap if want_spans else 1, np.int64)
    m = 0
    for s in range(nstr):
        a = offsets[s]
        ntok = _lex_windows(data, a, offsets[s + 1], flags, kw, n, minpunct, bufs)
        if ntok < n:
            continue
        nw = ntok - n + 1
        if m + nw > cap:
            cap = max(cap * 2, m + nw)
            out_h = _grow_u64(out_h, cap)
            out_s = _grow_i64(out_s, cap)
            if want_spans:
                out_a = _grow_i64(out_a, cap)
                out_b = _grow_i64(out_b, cap)
        for w in range(nw):
            if minpunct > 0 and not _punct_ok(pp, w, n, minpunct):
                continue
            h = _window(tok_val, cval, prevd, w, n, canon)
            out_h[m] = h
            out_s[m] = s
            if want_spans:
                out_a[m] = tok_start[w] - a
                out_b[m] = tok_end[w + n - 1] - a
            m += 1
    return out_h[:m], out_s[:m], out_a[:m if want_spans else 0], out_b[:m if want_spans else 0]


@njit(cache=True)
def _grow_u64(x, cap):
    y = np.empty(cap, np.uint64)
    y[: x.shape[0]] = x
    return y


@njit(cache=True)
def _grow_i64(x, cap):
    y = np.empty(cap, np.int64)
    y[: x.shape[0]] = x
    return y


@njit(cache=True, inline="always")
def _probe(keys, mask, h):
    """Slot of `h` in the open-addressing table, or -1."""
    slot = h & mask
    while True:
        k = keys[slot]
        if k == _ZERO:
            return -1
        if k == h:
            return np.int64(slot)
        slot = (slot + _ONE) & mask


@njit(cache=True, parallel=True)
def _count_hits(data, offsets, n, flags, kw, keys, nblocks, minpunct):
    """Matching windows per string, strings split into blocks run on all cores (numba threads).

    Matches are rare, so this pass does nearly all the work; `_scan_strings` then
    re-reads only the strings that matched, serially, to collect positions in order.
    """
    nstr = offsets.shape[0] - 1
    counts = np.zeros(nstr, np.int64)
    canon = (flags & 8) != 0
    mask = U64(keys.shape[0] - 1)
    step = (nstr + nblocks - 1) // nblocks
    for blk in prange(nblocks):
        lo = blk * step
        hi = min(nstr, lo + step)
        maxlen = 0
        for s in range(lo, hi):
            ln = offsets[s + 1] - offsets[s]
            if ln > maxlen:
                maxlen = ln
        bufs = _token_buffers(maxlen, canon, minpunct > 0)
        tok_val, tok_start, tok_end, tok_ident, prevd, pp, cval = bufs
        for s in range(lo, hi):
            ntok = _lex_windows(data, offsets[s], offsets[s + 1], flags, kw, n, minpunct, bufs)
            if ntok < n:
                continue
            c = 0
            for w in range(ntok - n + 1):
                if minpunct > 0 and not _punct_ok(pp, w, n, minpunct):
                    continue
                if _probe(keys, mask, _window(tok_val, cval, prevd, w, n, canon)) >= 0:
                    c += 1
            counts[s] = c
    return counts


@njit(cache=True)
def _scan_strings(data, offsets, which, n, flags, kw, keys, vals, minpunct):
    """Probe every window of the strings `which` in the table (keys/vals, open addressing, 0 = empty).

    Returns matches as (string index, table value, start byte, end byte), relative to each string.
    """
    maxlen = 0
    for i in range(which.shape[0]):
        s = which[i]
        ln = offsets[s + 1] - offsets[s]
        if ln > maxlen:
            maxlen = ln
    canon = (flags & 8) != 0
    bufs = _token_buffers(maxlen, canon, minpunct > 0)
    tok_val, tok_start, tok_end, tok_ident, prevd, pp, cval = bufs
    mask = U64(keys.shape[0] - 1)
    cap = 1024
    out_s = np.empty(cap, np.int64)
    out_v = np.empty(cap, np.int64)
    out_a = np.empty(cap, np.int64)
    out_b = np.empty(cap, np.int64)
    m = 0
    for i in range(which.shape[0]):
        s = which[i]
        a = offsets[s]
        ntok = _lex_windows(data, a, offsets[s + 1], flags, kw, n, minpunct, bufs)
        if ntok < n:
            continue
        for w in range(ntok - n + 1):
            if minpunct > 0 and not _punct_ok(pp, w, n, minpunct):
                continue
            slot = _probe(keys, mask, _window(tok_val, cval, prevd, w, n, canon))
            if slot < 0:
                continue
            if m == cap:
                cap *= 2
                out_s = _grow_i64(out_s, cap)
                out_v = _grow_i64(out_v, cap)
                out_a = _grow_i64(out_a, cap)
                out_b = _grow_i64(out_b, cap)
            out_s[m] = s
            out_v[m] = vals[slot]
            out_a[m] = tok_start[w] - a
            out_b[m] = tok_end[w + n - 1] - a
            m += 1
    return out_s[:m], out_v[:m], out_a[:m], out_b[:m]


# ---------------------------------------------------------------------------------------------
# Python-facing helpers
# ---------------------------------------------------------------------------------------------

def arrow_text_buffers(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(UTF-8 bytes as uint8, int64 offsets rebased to 0) of a string array, zero-copy when possible.

    Nulls read as empty strings.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.null_count:
        arr = pc.fill_null(arr, "")
    if pa.types.is_large_string(arr.type):
        otype = np.int64
    elif pa.types.is_string(arr.type):
        otype = np.int32
    else:
        arr = arr.cast(pa.large_string())
        otype = np.int64
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], dtype=otype)[arr.offset: arr.offset + len(arr) + 1].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return data, offs


def texts_to_buffers(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    return arrow_text_buffers(pa.array(list(texts), pa.large_string()))


def hash_strings(data: np.ndarray, offsets: np.ndarray, n: int, flags: int,
                 spans: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Window hashes of every string of a buffer pair (see `arrow_text_buffers`)."""
    if n < 1:
        raise ValueError("ngram must be >= 1")
    return _hash_strings(data, offsets, n, flags, keyword_hashes(flags), spans, min_punct(n, flags))


def ngram_hashes(text: str, n: int = 13, normalizations: Sequence[str] = DEFAULT_NORMALIZATIONS) -> np.ndarray:
    """The window hashes of one text, in order (uint64)."""
    data, offs = texts_to_buffers([text])
    return hash_strings(data, offs, n, flags_of(normalizations))[0]


def build_table(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Open-addressing table (keys, vals) for sorted unique `hashes`; val = index in `hashes`.

    Load factor <= 0.5, so a probe for an absent key ends after ~1.5 slots on average.
    """
    size = 1 << max(4, int(np.ceil(np.log2(max(1, len(hashes)) * 2))))
    return _fill_table(hashes.astype(np.uint64), size)


@njit(cache=True)
def _fill_table(hashes, size):
    keys = np.zeros(size, np.uint64)
    vals = np.full(size, -1, np.int64)
    mask = U64(size - 1)
    for i in range(hashes.shape[0]):
        h = hashes[i]
        slot = h & mask
        while keys[slot] != _ZERO and keys[slot] != h:
            slot = (slot + _ONE) & mask
        keys[slot] = h
        vals[slot] = i
    return keys, vals


def scan_strings(data: np.ndarray, offsets: np.ndarray, n: int, flags: int, keys: np.ndarray,
                 vals: np.ndarray, parallel: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Matches of every window against a table from `build_table` (see `_scan_strings`).

    `parallel=True` counts matches on all cores first and collects positions only for
    the strings that matched (same result). The pipeline stage keeps it off: its
    engine already runs one task per core.
    """
    kw = keyword_hashes(flags)
    nstr = len(offsets) - 1
    if parallel and nstr > 1:
        counts = _count_hits(data, offsets, n, flags, kw, keys, max(1, min(nstr, 4 * numba.get_num_threads())),
                             min_punct(n, flags))
        which = np.nonzero(counts)[0].astype(np.int64)
    else:
        which = np.arange(nstr, dtype=np.int64)
    return _scan_strings(data, offsets, which, n, flags, kw, keys, vals, min_punct(n, flags))
