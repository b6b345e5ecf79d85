"""Exact and MinHash near-duplicate removal (see docs/dedup.md).

Public pieces a researcher can call directly:
`minhash_signatures` (bit-identical to datasketch given xxh32), `shingles`
(the reference shingle bytes), `optimal_param` (datasketch's LSH band/row
choice) and the `dedup` stage config `DedupConfig`.
"""
from datakit.stages.dedup.lsh import band_hashes, optimal_param
from datakit.stages.dedup.minhash import (
    minhash_signatures,
    minhash_signatures_from_shingles,
    permutations,
    shingle_hashes,
)
from datakit.stages.dedup.shingles import normalize_texts, shingles

__all__ = [
    "band_hashes",
    "minhash_signatures",
    "minhash_signatures_from_shingles",
    "normalize_texts",
    "optimal_param",
    "permutations",
    "shingle_hashes",
    "shingles",
]
