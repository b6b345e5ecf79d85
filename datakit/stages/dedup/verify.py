"""Verification of LSH candidate pairs: estimated (signature) or exact (shingle-set) Jaccard.

Why verify: an LSH bucket only says two signatures agree on one band; at
threshold 0.8 with 128 permutations a pair at Jaccard 0.6 still collides in
some band a few percent of the time, and every false edge can merge two
unrelated clusters in the connected components. Checking each candidate edge
cuts those false edges before the closure.

* `signature_jaccard` is `datasketch.MinHash.jaccard` (fraction of equal
  signature values) for many pairs at once.
* `exact_jaccard` is |A & B| / |A | B| of the two documents' shingle sets,
  with shingles represented by their xxh32 (two distinct shingles of the pair
  collide with probability ~|A||B| / 2^32, negligible for documents).
"""
from __future__ import annotations

import numpy as np
from datakit.jit import njit

from datakit.stages.dedup.minhash import shingle_hashes
from datakit.stages.dedup.shingles import ShingleKind


def signature_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    """Row-wise estimated Jaccard of two [n, num_perm] uint32 signature arrays."""
    if sig_a.shape != sig_b.shape:
        raise ValueError("signature arrays must have the same shape")
    if sig_a.shape[0] == 0:
        return np.zeros(0, dtype=np.float64)
    return np.count_nonzero(sig_a == sig_b, axis=1) / float(sig_a.shape[1])


@njit(cache=True, inline="always")
def _table_size(n):
    """The smallest power of two, at least 16, with room for `n` values at load <= 0.5."""
    size = 16
    while size < 2 * n:
        size *= 2
    return size


@njit(cache=True, inline="always")
def _claim(keys, stamp, g, mask, h):
    """(slot of `h` among pair g's slots, whether it was new there; a new value is stored)."""
    slot = np.int64(h) & mask
    while stamp[slot] == g and keys[slot] != h:
        slot = (slot + 1) & mask
    if stamp[slot] == g:
        return slot, False
    stamp[slot] = g
    keys[slot] = h
    return slot, True


@njit(cache=True)
def _pair_jaccard(ha, oa, hb, ob, out):
    """out[i] = |A & B| / |A | B| of the distinct values of ha[oa[i]:oa[i+1]] and hb[ob[i]:ob[i+1]].

    Why a hash table and not sorted sets: sorting both ends of every pair was 9 of every 10
    seconds here; one open-addressing table, sized per pair and never cleared (a slot belongs to
    pair i only while its stamp says so), counts both sets and their overlap in one pass over each
    (10x faster on 20,000 pairs of 1-4 KB code, results identical: the counts are the same
    integers). Values are 32-bit hashes, so their low bits spread over the slots.
    """
    most = 1
    for i in range(out.shape[0]):
        most = max(most, oa[i + 1] - oa[i] + ob[i + 1] - ob[i])
    size = _table_size(most)
    keys = np.zeros(size, ha.dtype)
    stamp = np.zeros(size, np.int64)  # 1 + the index of the pair that wrote the slot (never wraps: 0 = free)
    side = np.zeros(size, np.uint8)    # 1: in A only, 2: in B only, 3: in both
    for i in range(out.shape[0]):
        g = np.int64(i + 1)
        mask = _table_size(oa[i + 1] - oa[i] + ob[i + 1] - ob[i]) - 1
        na = 0
        for x in range(oa[i], oa[i + 1]):
            slot, new = _claim(keys, stamp, g, mask, ha[x])
            if new:
                side[slot] = 1
                na += 1
        nb = 0
        inter = 0
        for y in range(ob[i], ob[i + 1]):
            slot, new = _claim(keys, stamp, g, mask, hb[y])
            if new:
                side[slot] = 2
                nb += 1
            elif side[slot] == 1:  # first time in B of a value of A (2, 3: repeated in B)
                side[slot] = 3
                nb += 1
                inter += 1
        if na == 0 and nb == 0:
            out[i] = 0.0
        else:
            out[i] = inter / (na + nb - inter)


def exact_jaccard(texts_a, texts_b, ngram: int = 5, shingle: ShingleKind = "word", lowercase: bool = False) -> np.ndarray:
    """Row-wise Jaccard of the shingle sets of texts_a[i] and texts_b[i] (same shingles as the signatures)."""
    ha, oa = shingle_hashes(texts_a, ngram, shingle, lowercase)
    hb, ob = shingle_hashes(texts_b, ngram, shingle, lowercase)
    if len(oa) != len(ob):
        raise ValueError("texts_a and texts_b must have the same length")
    out = np.empty(len(oa) - 1, dtype=np.float64)
    if len(out):
        _pair_jaccard(ha, oa, hb, ob, out)
    return out
