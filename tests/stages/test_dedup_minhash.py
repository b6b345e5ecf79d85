"""The signature kernel against its references: xxhash's XXH32 and datasketch 2.0.0's MinHash."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import xxhash
from datasketch import MinHash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datakit.stages.dedup import (
    minhash_signatures,
    minhash_signatures_from_shingles,
    normalize_texts,
    permutations,
    shingle_hashes,
    shingles,
)
from datakit.stages.dedup.minhash import xxh32
from datakit.stages.dedup.text import exact_keys
from datakit.stages.texts import record_texts
from datakit.stages.dedup.verify import exact_jaccard, signature_jaccard

# whitespace-heavy text with multi-byte code points and the six ASCII whitespace bytes
ALPHABET = st.sampled_from(list("abcxyzAÉ_0(),.'\"") + ["é", "ß", "日", "本", "🙂", "\u00a0", " ", " ", "\t", "\n", "\r", "\x0b", "\x0c"])
TEXT = st.text(alphabet=ALPHABET, max_size=80)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def datasketch_sig(text: str, num_perm: int, seed: int, ngram: int, shingle: str) -> np.ndarray:
    m = MinHash(num_perm=num_perm, seed=seed, hashfunc=xxhash.xxh32_intdigest)
    m.update_batch(shingles(text, ngram, shingle))
    return m.hashvalues


@FAST
@given(st.binary(max_size=100))
def test_xxh32_equals_xxhash(data):
    buf = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(0, np.uint8)
    assert int(xxh32(buf, 0, len(data), 0)) == xxhash.xxh32_intdigest(data)


def test_xxh32_seed_and_offsets():
    rng = np.random.default_rng(0)
    buf = rng.integers(0, 256, 300, dtype=np.uint8)
    for start, end in [(0, 300), (3, 19), (7, 7), (1, 17), (250, 300)]:
        for seed in (0, 1, 2**32 - 1):
            assert int(xxh32(buf, start, end, seed)) == xxhash.xxh32_intdigest(buf[start:end].tobytes(), seed=seed)


@pytest.mark.parametrize("num_perm,seed", [(1, 0), (64, 1), (128, 42), (256, 2**31)])
def test_permutations_equal_datasketch(num_perm, seed):
    a, b = permutations(num_perm, seed)
    ref = MinHash(num_perm=num_perm, seed=seed).permutations
    assert a.dtype == np.uint32 and np.array_equal(a, ref[0]) and np.array_equal(b, ref[1])


@FAST
@given(st.lists(TEXT, min_size=1, max_size=6), st.integers(1, 6), st.sampled_from(["token", "word", "char"]),
       st.sampled_from([1, 16, 128]), st.integers(0, 2**32 - 1))
def test_signatures_bit_identical_to_datasketch(texts, ngram, shingle, num_perm, seed):
    sig = minhash_signatures(texts, num_perm=num_perm, seed=seed, ngram=ngram, shingle=shingle)
    assert sig.dtype == np.uint32 and sig.shape == (len(texts), num_perm)
    for text, row in zip(texts, sig):
        assert np.array_equal(row, datasketch_sig(text, num_perm, seed, ngram, shingle))


@FAST
@given(st.lists(st.lists(st.binary(max_size=40), max_size=12), min_size=1, max_size=5), st.sampled_from([1, 64]),
       st.integers(0, 2**32 - 1))
def test_signatures_from_shingles_bit_identical(docs, num_perm, seed):
    sig = minhash_signatures_from_shingles(docs, num_perm=num_perm, seed=seed)
    for doc, row in zip(docs, sig):
        m = MinHash(num_perm=num_perm, seed=seed, hashfunc=xxhash.xxh32_intdigest)
        m.update_batch(doc)
        assert np.array_equal(row, m.hashvalues)


def test_signatures_from_shingles_agree_with_text_kernel():
    texts = ["def f(x):\n    return x + 1\n", "", "a b c d e f g"]
    assert np.array_equal(minhash_signatures_from_shingles([shingles(t, 3, "token") for t in texts]),
                          minhash_signatures(texts, ngram=3, shingle="token"))


@FAST
@given(st.lists(TEXT, min_size=1, max_size=4), st.sampled_from(["token", "word", "char"]))
def test_lowercase_uses_the_arrow_normalization(texts, shingle):
    sig = minhash_signatures(texts, num_perm=32, seed=3, ngram=2, shingle=shingle, lowercase=True)
    lowered = normalize_texts(pa.array(texts), lowercase=True).to_pylist()
    for text, row in zip(lowered, sig):
        assert np.array_equal(row, datasketch_sig(text, 32, 3, 2, shingle))


def test_shingle_definition():
    assert shingles("a  b\tc\n d", 2) == [b"a b", b"b c", b"c d"]
    assert shingles("  one two  ", 5) == [b"one two"]  # fewer words than n: one shingle
    assert shingles(" \t\n", 3) == [] and shingles("", 3, "char") == []
    assert shingles("ab  cd", 3, "char") == [b"ab ", b"b c", b" cd"]
    assert shingles("日本 語", 2, "char") == ["日本".encode(), "本 ".encode(), " 語".encode()]
    assert shingles("a\u00a0b c", 1) == ["a\u00a0b".encode(), b"c"]  # NBSP is not a separator
    assert shingles("f('a',b_1)\n  x.y", 2, "token") == [b"f a", b"a b_1", b"b_1 x", b"x y"]
    assert shingles("f('é')", 5, "token") == ["f é".encode()]


def test_empty_null_and_sliced_inputs():
    texts = pa.array(["x y z w v u", None, "", "   ", "p q r s t u v"])
    sig = minhash_signatures(texts, num_perm=8)
    assert (sig[1:4] == 0xFFFFFFFF).all()  # datasketch's value for a MinHash never updated
    assert np.array_equal(minhash_signatures(texts.slice(3, 2), num_perm=8), sig[3:5])
    assert np.array_equal(minhash_signatures(pa.chunked_array([texts.slice(0, 2), texts.slice(2)]), num_perm=8), sig)
    assert minhash_signatures([], num_perm=8).shape == (0, 8)
    with pytest.raises(ValueError, match="shingle"):
        minhash_signatures(["a"], shingle="sentence")


def test_shingle_hashes_are_xxh32_of_reference_shingles():
    texts = ["a b c d e f", "", "x  y"]
    hashes, offsets = shingle_hashes(texts, ngram=2)
    for i, t in enumerate(texts):
        assert hashes[offsets[i]:offsets[i + 1]].tolist() == [xxhash.xxh32_intdigest(s) for s in shingles(t, 2)]


def test_jaccard_helpers_match_references():
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(60)]
    a_texts, b_texts = [], []
    for _ in range(20):
        a_texts.append(" ".join(rng.choice(words, 40)))
        b_texts.append(" ".join(rng.choice(words, 40)))
    sa, sb = minhash_signatures(a_texts, 64), minhash_signatures(b_texts, 64)
    est = signature_jaccard(sa, sb)
    for i in range(20):
        ma = MinHash(64, hashfunc=xxhash.xxh32_intdigest, hashvalues=sa[i], scheme="affine32")
        mb = MinHash(64, hashfunc=xxhash.xxh32_intdigest, hashvalues=sb[i], scheme="affine32")
        assert est[i] == ma.jaccard(mb)
    exact = exact_jaccard(a_texts, b_texts, ngram=1)
    for i in range(20):
        x, y = set(shingles(a_texts[i], 1)), set(shingles(b_texts[i], 1))
        assert exact[i] == pytest.approx(len(x & y) / len(x | y))


def test_pair_jaccard_kernel_matches_python_sets():
    """The hash-table kernel against set arithmetic, on the inputs that could trip a table: values
    that share their low bits (same slot, different value), repeats on either side, empty sides,
    and pairs of very different sizes in one batch (the table is sized for the largest, used per pair)."""
    from datakit.stages.dedup.verify import _pair_jaccard

    import numba

    rng = np.random.default_rng(7)
    sides_a, sides_b = [], []
    for k in range(300):
        # the first pair is not empty (a stamp that starts at 0 would then read the fresh table as its own)
        na, nb = (0, 0) if k == 10 else (0, 5) if k == 11 else (int(rng.integers(1, 40)), int(rng.integers(1, 40)))
        if k == 13:  # random values: probes spread over the whole part of the table
            na, nb = 3000, 7
        pool = (rng.integers(0, 64, 80).astype(np.uint32) << np.uint32(20)) | np.uint32(5)  # one slot for all
        pool = pool if k % 3 == 0 else rng.integers(0, 2**32, 80, dtype=np.uint64).astype(np.uint32)
        sides_a.append(rng.choice(pool, na))
        sides_b.append(rng.choice(pool, nb))
    ha, hb = np.concatenate(sides_a).astype(np.uint32), np.concatenate(sides_b).astype(np.uint32)
    oa = np.concatenate([[0], np.cumsum([len(x) for x in sides_a])]).astype(np.int64)
    ob = np.concatenate([[0], np.cumsum([len(x) for x in sides_b])]).astype(np.int64)
    # first the same source with bounds checks (numba checks none by default): a table sized too small,
    # or a probe past its pair's part of the table, is an IndexError here instead of reads out of bounds
    checked = np.empty(len(sides_a))
    numba.njit(boundscheck=True)(_pair_jaccard.py_func)(ha, oa, hb, ob, checked)
    out = np.empty(len(sides_a))
    _pair_jaccard(ha, oa, hb, ob, out)
    assert np.array_equal(checked, out)
    for i, (a, b) in enumerate(zip(sides_a, sides_b)):
        x, y = set(a.tolist()), set(b.tolist())
        assert out[i] == (len(x & y) / len(x | y) if x | y else 0.0), i


def test_record_text_and_exact_keys():
    seg = pa.struct([("text", pa.string()), ("train", pa.bool_()), ("role", pa.string())])
    batch = pa.RecordBatch.from_pydict({
        "segments": pa.array([[{"text": "a", "train": True, "role": "user"}, {"text": None, "train": False, "role": "x"}],
                              [{"text": "p", "train": False, "role": "prompt"}], None], pa.list_(seg)),
        "chosen": pa.array([None, "c", None]), "rejected": pa.array([None, "r", None]),
    })
    assert record_texts(batch).to_pylist() == ["a\n", "p\nc\nr", ""]
    assert record_texts(batch.slice(1)).to_pylist() == ["p\nc\nr", ""]
    keys = exact_keys(pa.array(["a  b\r\n", " a b", "a b c", "a\u00a0b"])).to_pylist()
    assert keys[0] == keys[1] != keys[2] != keys[3] and len(keys[0]) == 32
    raw = exact_keys(pa.array(["a  b", "a b"]), normalize="none").to_pylist()
    assert raw[0] != raw[1] and raw[1] == xxhash.xxh3_128_hexdigest(b"a b")
    scoped = exact_keys(pa.array(["t", "t", "t"]), scope=pa.array(["code", "sft", "code"])).to_pylist()
    assert scoped[0] != scoped[1] and scoped[0] == scoped[2] == xxhash.xxh3_128_hexdigest(b"t", xxhash.xxh64_intdigest(b"code"))
    assert exact_keys(pa.array(["x y", "ab"]).slice(1), normalize="none").to_pylist() == [xxhash.xxh3_128_hexdigest(b"ab")]


@FAST
@given(st.lists(TEXT, min_size=1, max_size=6))
def test_exact_key_is_xxh3_of_whitespace_collapsed_text(texts):
    keys = exact_keys(pa.array(texts)).to_pylist()
    assert keys == [xxhash.xxh3_128_hexdigest(b" ".join(t.encode().split())) for t in texts]
