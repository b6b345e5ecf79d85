"""MinHash signatures over Arrow string buffers, bit-identical to datasketch 2.0.0 `affine32`.

Why our own kernel: datasketch hashes every shingle in Python (~6k docs/s for
1 KB documents); this numba kernel walks the UTF-8 bytes of a whole Arrow
string array (no Python object per shingle or per document) and is what the
dedup stage runs. It computes exactly what datasketch computes:

    m = datasketch.MinHash(num_perm=P, seed=S, hashfunc=H)   # scheme="affine32"
    m.update_batch(shingles(text, ngram, shingle))
    m.hashvalues

with H = `xxh32` (seed 0, == `xxhash.xxh32_intdigest`), i.e. per shingle
``h = fmix32(H(bytes))`` (the MurmurHash3 finalizer), then per permutation k
``a_k * h + b_k mod 2**32`` and the min over shingles; a document with no
shingles keeps datasketch's initial value ``0xFFFFFFFF``. ``a``/``b`` come from
``np.random.RandomState(seed)`` in datasketch's order (`permutations`).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from datakit.jit import njit
from datakit.stages.dedup.shingles import (
    SHINGLE_KINDS,
    ShingleKind,
    arrow_buffers,
    char_shingle,
    char_starts,
    collapse_words,
    normalize_texts,
    separator_table,
    shingle_count,
    word_shingle,
)

MAX_HASH = np.uint32(0xFFFFFFFF)

_P1 = 2654435761
_P2 = 2246822519
_P3 = 3266489917
_P4 = 668265263
_P5 = 374761393
_M32 = 0xFFFFFFFF


@lru_cache(maxsize=32)
def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) uint32 arrays exactly as `datasketch.MinHash._init_permutations` draws them for affine32."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    a.setflags(write=False)
    b.setflags(write=False)
    return a, b


@njit(cache=True, inline="always")
def _rotl32(x: np.uint64, r: np.uint64) -> np.uint64:
    return ((x << r) | (x >> (np.uint64(32) - r))) & np.uint64(0xFFFFFFFF)


@intrinsic
def _read32(typingctx, arr, idx):
    """Unaligned little-endian 32-bit load of arr[idx:idx+4] (x86/ARM64 are little-endian).

    One load instead of four byte loads and shifts: the hash of short shingles
    is dominated by these reads.
    """
    sig = types.uint64(arr, idx)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        v = builder.load(builder.bitcast(ptr, ir.IntType(32).as_pointer()), align=1)
        return builder.zext(v, ir.IntType(64))

    return sig, codegen


@njit(cache=True, inline="always")
def xxh32(buf: np.ndarray, start: int, end: int, seed: int) -> np.uint64:
    """XXH32 of buf[start:end] (the reference algorithm, arithmetic in uint64 masked to 32 bits)."""
    n = end - start
    i = start
    s = np.uint64(seed) & np.uint64(_M32)
    M = np.uint64(_M32)
    P1 = np.uint64(_P1)
    P2 = np.uint64(_P2)
    P3 = np.uint64(_P3)
    P4 = np.uint64(_P4)
    P5 = np.uint64(_P5)
    if n >= 16:
        v1 = (s + P1 + P2) & M
        v2 = (s + P2) & M
        v3 = s
        v4 = (s - P1) & M
        limit = end - 16
        while i <= limit:
            v1 = (_rotl32((v1 + _read32(buf, i) * P2) & M, np.uint64(13)) * P1) & M
            v2 = (_rotl32((v2 + _read32(buf, i + 4) * P2) & M, np.uint64(13)) * P1) & M
            v3 = (_rotl32((v3 + _read32(buf, i + 8) * P2) & M, np.uint64(13)) * P1) & M
            v4 = (_rotl32((v4 + _read32(buf, i + 12) * P2) & M, np.uint64(13)) * P1) & M
            i += 16
        h = (
            _rotl32(v1, np.uint64(1)) + _rotl32(v2, np.uint64(7)) + _rotl32(v3, np.uint64(12)) + _rotl32(v4, np.uint64(18))
        ) & M
    else:
        h = (s + P5) & M
    h = (h + np.uint64(n)) & M
    while i + 4 <= end:
        h = (_rotl32((h + _read32(buf, i) * P3) & M, np.uint64(17)) * P4) & M
        i += 4
    while i < end:
        h = (_rotl32((h + np.uint64(buf[i]) * P5) & M, np.uint64(11)) * P1) & M
        i += 1
    h ^= h >> np.uint64(15)
    h = (h * P2) & M
    h ^= h >> np.uint64(13)
    h = (h * P3) & M
    h ^= h >> np.uint64(16)
    return h


@njit(cache=True, inline="always")
def fmix32(h: np.uint64) -> np.uint64:
    """MurmurHash3's 32-bit finalizer (datasketch `_fmix(..., 32)`)."""
    M = np.uint64(_M32)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & M
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & M
    h ^= h >> np.uint64(16)
    return h


@njit(cache=True)
def _doc_shingle_hashes(data, lo, hi, ngram, char, buf, units, hs, ws) -> int:
    """fmix-free xxh32 of each shingle of data[lo:hi] into hs; returns the shingle count."""
    n, words = collapse_words(data, lo, hi, buf, units, ws)
    if char:
        ncp = char_starts(buf, n, units)
        count = shingle_count(ncp, ngram)
        for s in range(count):
            st, en = char_shingle(units, ncp, n, ngram, s)
            hs[s] = xxh32(buf, st, en, 0)
    else:
        count = shingle_count(words, ngram)
        for s in range(count):
            st, en = word_shingle(units, words, ngram, s)
            hs[s] = xxh32(buf, st, en, 0)
    return count


@njit(cache=True, inline="always")
def _min_into(sig, hs, count, a, b) -> None:
    """sig[k] = min(sig[k], min_s(a[k] * fmix32(hs[s]) + b[k] mod 2^32)), four shingles per pass."""
    num_perm = a.shape[0]
    for s in range(count):
        hs[s] = np.uint32(fmix32(np.uint64(hs[s])))
    # four shingles per pass over the permutations: a quarter of the loads/stores of `sig`
    # (the k loop compiles to 16-lane AVX-512 / 8-lane AVX2 32-bit multiply-add-min)
    s = 0
    while s + 4 <= count:
        h0 = hs[s]
        h1 = hs[s + 1]
        h2 = hs[s + 2]
        h3 = hs[s + 3]
        for k in range(num_perm):
            ak = a[k]
            bk = b[k]
            v0 = np.uint32(ak * h0 + bk)
            v1 = np.uint32(ak * h1 + bk)
            v2 = np.uint32(ak * h2 + bk)
            v3 = np.uint32(ak * h3 + bk)
            sig[k] = min(sig[k], min(min(v0, v1), min(v2, v3)))
        s += 4
    while s < count:
        h0 = hs[s]
        for k in range(num_perm):
            sig[k] = min(sig[k], np.uint32(a[k] * h0 + b[k]))
        s += 1


@njit(cache=True)
def _signatures_from_shingles_kernel(data, offsets, list_offsets, a, b, out) -> None:
    """Signatures of documents given as lists of shingle byte strings (flat data/offsets + list offsets)."""
    n_docs = list_offsets.shape[0] - 1
    maxn = 1
    for d in range(n_docs):
        maxn = max(maxn, list_offsets[d + 1] - list_offsets[d])
    hs = np.empty(maxn, np.uint32)
    sig = np.empty(a.shape[0], np.uint32)
    for d in range(n_docs):
        sig[:] = 0xFFFFFFFF
        first = list_offsets[d]
        count = list_offsets[d + 1] - first
        for s in range(count):
            hs[s] = xxh32(data, offsets[first + s], offsets[first + s + 1], 0)
        _min_into(sig, hs, count, a, b)
        out[d, :] = sig


@njit(cache=True)
def _signatures_kernel(data, offsets, ngram, char, a, b, ws, out) -> None:
    n_docs = offsets.shape[0] - 1
    num_perm = a.shape[0]
    maxlen = 0
    for d in range(n_docs):
        maxlen = max(maxlen, offsets[d + 1] - offsets[d])
    buf = np.empty(maxlen + 8, np.uint8)
    units = np.empty(maxlen + 2, np.int64)
    hs = np.empty(maxlen + 8, np.uint32)
    sig = np.empty(num_perm, np.uint32)
    for d in range(n_docs):
        sig[:] = 0xFFFFFFFF
        count = _doc_shingle_hashes(data, offsets[d], offsets[d + 1], ngram, char, buf, units, hs, ws)
        _min_into(sig, hs, count, a, b)
        out[d, :] = sig


@njit(cache=True)
def _shingle_hashes_kernel(data, offsets, ngram, char, ws, out_offsets):
    """xxh32 of every shingle of every document (flat, with per-document offsets)."""
    n_docs = offsets.shape[0] - 1
    maxlen = 0
    total = 0
    for d in range(n_docs):
        L = offsets[d + 1] - offsets[d]
        total += L + 1
        maxlen = max(maxlen, L)
    buf = np.empty(maxlen + 8, np.uint8)
    units = np.empty(maxlen + 2, np.int64)
    out = np.empty(total, np.uint32)
    pos = 0
    for d in range(n_docs):
        out_offsets[d] = pos
        pos += _doc_shingle_hashes(data, offsets[d], offsets[d + 1], ngram, char, buf, units, out[pos:], ws)
    out_offsets[n_docs] = pos
    return out[:pos]


def _check(num_perm: int, ngram: int, shingle: str) -> None:
    if not 1 <= num_perm <= 1 << 16:
        raise ValueError(f"num_perm must be in [1, 65536], got {num_perm}")
    if ngram < 1:
        raise ValueError(f"ngram must be >= 1, got {ngram}")
    if shingle not in SHINGLE_KINDS:
        raise ValueError(f"shingle must be one of {SHINGLE_KINDS}, got {shingle!r}")


def _as_arrow(texts) -> pa.Array:
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        return texts
    return pa.array(list(texts), type=pa.string())


def minhash_signatures(
    texts,
    num_perm: int = 128,
    seed: int = 1,
    ngram: int = 5,
    shingle: ShingleKind = "word",
    lowercase: bool = False,
) -> np.ndarray:
    """MinHash signatures (uint32 array of shape [len(texts), num_perm]) of a list/Arrow array of texts.

    Row i equals ``datasketch.MinHash(num_perm, seed, hashfunc=xxhash.xxh32_intdigest)
    .update_batch(shingles(t_i, ngram, shingle)).hashvalues`` where ``t_i`` is the
    text after `normalize_texts` (see `datakit.stages.dedup.shingles` for the
    exact shingle bytes). Null texts count as empty.
    """
    _check(num_perm, ngram, shingle)
    arr = normalize_texts(_as_arrow(texts), lowercase)
    data, offsets = arrow_buffers(arr)
    a, b = permutations(num_perm, seed)
    out = np.empty((len(arr), num_perm), dtype=np.uint32)
    if len(arr):
        _signatures_kernel(data, offsets, ngram, shingle == "char", a, b, separator_table(shingle), out)
    return out


def minhash_signatures_from_shingles(docs, num_perm: int = 128, seed: int = 1) -> np.ndarray:
    """Signatures of documents given as their shingles (bytes), e.g. from your own tokenizer.

    `docs` is a list of lists of bytes (or an Arrow `list<binary>` array). Row i
    equals ``datasketch.MinHash(num_perm, seed, hashfunc=xxhash.xxh32_intdigest)
    .update_batch(docs[i]).hashvalues``.
    """
    _check(num_perm, 1, "word")
    if not isinstance(docs, (pa.Array, pa.ChunkedArray)):
        docs = pa.array(docs, type=pa.list_(pa.binary()))
    if isinstance(docs, pa.ChunkedArray):
        docs = docs.combine_chunks()
    if pa.types.is_large_list(docs.type):
        docs = docs.cast(pa.list_(pa.binary()))
    lengths = pc.fill_null(pc.list_value_length(docs), 0).to_numpy(zero_copy_only=False)
    list_offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=list_offsets[1:])
    flat = docs.flatten()
    if not pa.types.is_binary(flat.type):
        flat = flat.cast(pa.binary())
    flat = pc.fill_null(flat, b"")
    data, offsets = arrow_buffers(flat)
    a, b = permutations(num_perm, seed)
    out = np.empty((len(docs), num_perm), dtype=np.uint32)
    if len(docs):
        _signatures_from_shingles_kernel(data, offsets, list_offsets, a, b, out)
    return out


def shingle_hashes(texts, ngram: int = 5, shingle: ShingleKind = "word", lowercase: bool = False):
    """(hashes uint32, offsets int64[n+1]): the xxh32 of each document's shingles, flat.

    Used for exact-Jaccard verification and the accuracy benchmark (Jaccard of
    the hashed shingle sets; 32-bit collisions are negligible at document sizes).
    """
    _check(1, ngram, shingle)
    arr = normalize_texts(_as_arrow(texts), lowercase)
    data, offsets = arrow_buffers(arr)
    out_offsets = np.empty(len(arr) + 1, dtype=np.int64)
    if not len(arr):
        return np.zeros(0, np.uint32), np.zeros(1, np.int64)
    hashes = _shingle_hashes_kernel(data, offsets, ngram, shingle == "char", separator_table(shingle), out_offsets)
    return hashes, out_offsets
