"""LSH banding: choosing (bands, rows) from a threshold, and hashing each band of a signature.

Why these choices: `optimal_param` is datasketch's `MinHashLSH` rule (minimize
``fp_weight * P(false positive) + fn_weight * P(false negative)`` integrated
over the Jaccard range, by `scipy.integrate.quad`) re-stated here so the stage
does not depend on a private datasketch function; tests check equality with
`datasketch.lsh._optimal_param` on a grid and for every precomputed `KNOWN_PARAMS` entry. `band_hashes` turns band j of a
signature (values ``sig[j*r:(j+1)*r]``) into one int64 bucket key, so that LSH
buckets become a plain group-by on both engines. A 64-bit key can collide for
different band contents (~2^-64 per pair); a collision only adds a candidate
edge, which verification removes.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from datakit.jit import njit


def _false_positive_probability(threshold: float, b: int, r: int) -> float:
    from scipy.integrate import quad  # lazily, and only for settings KNOWN_PARAMS lacks (see there)

    a, _err = quad(lambda s: 1 - (1 - s ** float(r)) ** float(b), 0.0, threshold)
    return a


def _false_negative_probability(threshold: float, b: int, r: int) -> float:
    from scipy.integrate import quad

    a, _err = quad(lambda s: 1 - (1 - (1 - s ** float(r)) ** float(b)), threshold, 1.0)
    return a


# `optimal_param` of the settings people use, computed by `_search` (tests check them against datasketch):
# the search itself takes ~15 ms, but `scipy.integrate` costs ~0.6 CPU-s and ~19 MB RSS to import, in
# every driver that compiles a MinHash dedup (measured in fresh processes on 2 cores). Keys: (threshold,
# num_perm, false positive weight, false negative weight); weights (0.5, 0.5) are datasketch's
# default, (0.05, 0.95) the stage's default with verification. Anything else is searched.
KNOWN_PARAMS: dict[tuple[float, int, float, float], tuple[int, int]] = {
    (0.5, 64, 0.5, 0.5): (14, 4),
    (0.55, 64, 0.5, 0.5): (12, 5),
    (0.6, 64, 0.5, 0.5): (10, 6),
    (0.65, 64, 0.5, 0.5): (9, 7),
    (0.7, 64, 0.5, 0.5): (8, 8),
    (0.75, 64, 0.5, 0.5): (7, 9),
    (0.8, 64, 0.5, 0.5): (5, 11),
    (0.85, 64, 0.5, 0.5): (4, 15),
    (0.9, 64, 0.5, 0.5): (3, 21),
    (0.95, 64, 0.5, 0.5): (2, 32),
    (0.5, 128, 0.5, 0.5): (25, 5),
    (0.55, 128, 0.5, 0.5): (21, 6),
    (0.6, 128, 0.5, 0.5): (18, 7),
    (0.65, 128, 0.5, 0.5): (16, 8),
    (0.7, 128, 0.5, 0.5): (14, 9),
    (0.75, 128, 0.5, 0.5): (11, 11),
    (0.8, 128, 0.5, 0.5): (9, 13),
    (0.85, 128, 0.5, 0.5): (8, 16),
    (0.9, 128, 0.5, 0.5): (5, 25),
    (0.95, 128, 0.5, 0.5): (3, 42),
    (0.5, 256, 0.5, 0.5): (42, 6),
    (0.55, 256, 0.5, 0.5): (36, 7),
    (0.6, 256, 0.5, 0.5): (32, 8),
    (0.65, 256, 0.5, 0.5): (28, 9),
    (0.7, 256, 0.5, 0.5): (25, 10),
    (0.75, 256, 0.5, 0.5): (21, 12),
    (0.8, 256, 0.5, 0.5): (17, 15),
    (0.85, 256, 0.5, 0.5): (13, 19),
    (0.9, 256, 0.5, 0.5): (9, 28),
    (0.95, 256, 0.5, 0.5): (5, 51),
    (0.5, 64, 0.05, 0.95): (21, 3),
    (0.55, 64, 0.05, 0.95): (19, 3),
    (0.6, 64, 0.05, 0.95): (16, 4),
    (0.65, 64, 0.05, 0.95): (16, 4),
    (0.7, 64, 0.05, 0.95): (12, 5),
    (0.75, 64, 0.05, 0.95): (12, 5),
    (0.8, 64, 0.05, 0.95): (10, 6),
    (0.85, 64, 0.05, 0.95): (8, 8),
    (0.9, 64, 0.05, 0.95): (6, 10),
    (0.95, 64, 0.05, 0.95): (4, 16),
    (0.5, 128, 0.05, 0.95): (26, 3),
    (0.55, 128, 0.05, 0.95): (32, 4),
    (0.6, 128, 0.05, 0.95): (24, 4),
    (0.65, 128, 0.05, 0.95): (25, 5),
    (0.7, 128, 0.05, 0.95): (21, 6),
    (0.75, 128, 0.05, 0.95): (18, 7),
    (0.8, 128, 0.05, 0.95): (16, 8),
    (0.85, 128, 0.05, 0.95): (12, 10),
    (0.9, 128, 0.05, 0.95): (9, 14),
    (0.95, 128, 0.05, 0.95): (6, 21),
    (0.5, 256, 0.05, 0.95): (53, 4),
    (0.55, 256, 0.05, 0.95): (51, 5),
    (0.6, 256, 0.05, 0.95): (41, 5),
    (0.65, 256, 0.05, 0.95): (42, 6),
    (0.7, 256, 0.05, 0.95): (36, 7),
    (0.75, 256, 0.05, 0.95): (30, 8),
    (0.8, 256, 0.05, 0.95): (25, 10),
    (0.85, 256, 0.05, 0.95): (19, 13),
    (0.9, 256, 0.05, 0.95): (15, 17),
    (0.95, 256, 0.05, 0.95): (9, 28),
}


@lru_cache(maxsize=64)
def optimal_param(
    threshold: float, num_perm: int, false_positive_weight: float = 0.5, false_negative_weight: float = 0.5
) -> tuple[int, int]:
    """(bands, rows) minimizing the weighted false positive + false negative probability
    (`KNOWN_PARAMS` when listed there, else `_search`)."""
    known = KNOWN_PARAMS.get((threshold, num_perm, false_positive_weight, false_negative_weight))
    if known is not None:
        return known
    return _search(threshold, num_perm, false_positive_weight, false_negative_weight)


def _search(threshold: float, num_perm: int, false_positive_weight: float, false_negative_weight: float
            ) -> tuple[int, int]:
    """datasketch's search: same loop order and strict `<` tie rule, so ties resolve alike."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    if num_perm < 2:
        raise ValueError("num_perm must be >= 2 for LSH")
    min_error = float("inf")
    opt = (0, 0)
    for b in range(1, num_perm + 1):
        max_r = int(num_perm / b)
        for r in range(1, max_r + 1):
            fp = _false_positive_probability(threshold, b, r)
            fn = _false_negative_probability(threshold, b, r)
            error = fp * false_positive_weight + fn * false_negative_weight
            if error < min_error:
                min_error = error
                opt = (b, r)
    return opt


@njit(cache=True, inline="always")
def _fmix64(h: np.uint64) -> np.uint64:
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


@njit(cache=True)
def _band_kernel(sig: np.ndarray, bands: int, rows: int, out: np.ndarray) -> None:
    for d in range(sig.shape[0]):
        for j in range(bands):
            h = _fmix64(np.uint64(j + 1) * np.uint64(0x9E3779B97F4A7C15))
            for k in range(j * rows, (j + 1) * rows):
                h = _fmix64(h ^ np.uint64(sig[d, k]))
            out[d, j] = h


def band_hashes(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """int64 [n_docs, bands] bucket keys: a chained 64-bit MurmurHash3 finalizer over each band's values.

    Deterministic and engine-independent (pure function of the signature), so
    Spark and the local engine group identical keys.
    """
    sig = np.ascontiguousarray(signatures, dtype=np.uint32)
    if bands * rows > sig.shape[1]:
        raise ValueError(f"bands*rows = {bands}*{rows} exceeds num_perm = {sig.shape[1]}")
    out = np.empty((sig.shape[0], bands), dtype=np.uint64)
    if sig.shape[0]:
        _band_kernel(sig, bands, rows, out)
    return out.view(np.int64)
