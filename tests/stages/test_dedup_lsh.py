"""LSH parameters and buckets against datasketch's MinHashLSH."""
from __future__ import annotations

import numpy as np
import pytest
import xxhash
from datasketch import MinHash, MinHashLSH
from datasketch.lsh import _optimal_param

from datakit.stages.dedup import band_hashes, minhash_signatures, optimal_param
from datakit.stages.dedup.stage import MinHashConfig
from tests.support.fresh import fresh_python


@pytest.mark.parametrize("num_perm", [16, 128, 256])
@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95])
def test_optimal_param_equals_datasketch(threshold, num_perm):
    assert optimal_param(threshold, num_perm) == _optimal_param(threshold, num_perm, 0.5, 0.5)


def test_every_precomputed_param_is_datasketchs_and_the_search_agrees():
    """The table that spares a run importing scipy.integrate holds datasketch's own answers."""
    from datakit.stages.dedup.lsh import KNOWN_PARAMS, _search

    assert len(KNOWN_PARAMS) == 60
    for (threshold, num_perm, fp_w, fn_w), got in KNOWN_PARAMS.items():
        assert got == _optimal_param(threshold, num_perm, fp_w, fn_w), (threshold, num_perm, fp_w, fn_w)
    assert _search(0.8, 128, 0.05, 0.95) == KNOWN_PARAMS[(0.8, 128, 0.05, 0.95)]
    assert optimal_param(0.83, 128, 0.05, 0.95) == _optimal_param(0.83, 128, 0.05, 0.95)  # not listed: searched


def test_a_listed_setting_compiles_without_importing_scipy_integrate():
    code = ("import sys; from datakit.stages.dedup.stage import MinHashConfig; "
            "assert MinHashConfig(threshold=0.8).band_rows() == (16, 8); "
            "assert MinHashConfig(threshold=0.85, num_perm=256, verify='none', drop_rule='component').band_rows(); "
            "print('scipy.integrate' in sys.modules)")
    assert fresh_python(code) == "False"


@pytest.mark.parametrize("weights", [(0.2, 0.8), (0.9, 0.1)])
def test_weighted_optimal_param_equals_datasketch(weights):
    lsh = MinHashLSH(threshold=0.8, num_perm=128, weights=weights)
    assert optimal_param(0.8, 128, *weights) == (lsh.b, lsh.r)


def test_config_band_rows_default_and_override():
    assert MinHashConfig(threshold=0.8, num_perm=128, weights=(0.5, 0.5)).band_rows() == (9, 13)
    assert MinHashConfig(threshold=0.8, verify="none", drop_rule="component").band_rows() == (9, 13)
    # verified candidates: datasketch's rule with recall-heavy weights
    assert MinHashConfig(threshold=0.8).band_rows() == _optimal_param(0.8, 128, 0.05, 0.95) == (16, 8)
    assert MinHashConfig(bands=32, rows=4).band_rows() == (32, 4)
    with pytest.raises(ValueError, match="both bands and rows"):
        MinHashConfig(bands=32)
    with pytest.raises(ValueError, match="exceeds num_perm"):
        MinHashConfig(num_perm=64, bands=9, rows=8)


def test_buckets_give_datasketch_candidates():
    """Docs sharing a band key are exactly the pairs datasketch's MinHashLSH returns for a query."""
    rng = np.random.default_rng(7)
    base = [f"t{i}" for i in range(300)]
    texts = []
    for _ in range(30):  # families of near copies plus unrelated documents
        words = list(rng.choice(base, 60))
        texts.append(" ".join(words))
        for _ in range(2):
            w = list(words)
            for j in rng.choice(60, 4, replace=False):
                w[j] = str(rng.choice(base))
            texts.append(" ".join(w))
    sig = minhash_signatures(texts, num_perm=128, ngram=1)
    b, r = 16, 8
    keys = band_hashes(sig, b, r)
    assert keys.shape == (len(texts), b) and keys.dtype == np.int64
    lsh = MinHashLSH(num_perm=128, params=(b, r))
    for i, s in enumerate(sig):
        lsh.insert(i, MinHash(128, hashfunc=xxhash.xxh32_intdigest, hashvalues=s, scheme="affine32"))
    for i, s in enumerate(sig):
        ours = {j for j in range(len(texts)) if np.any(keys[j] == keys[i])}
        theirs = set(lsh.query(MinHash(128, hashfunc=xxhash.xxh32_intdigest, hashvalues=s, scheme="affine32")))
        assert ours == theirs


def test_band_keys_depend_on_band_index():
    sig = np.zeros((1, 8), dtype=np.uint32)  # identical values in every band
    keys = band_hashes(sig, 4, 2)
    assert len(set(keys[0].tolist())) == 4
    with pytest.raises(ValueError):
        band_hashes(sig, 4, 3)
