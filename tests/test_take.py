"""`datakit.io.take.take_rows` against Arrow's own `take`: same rows, same types, for every column kind."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datakit.io import take
from datakit.io.take import take_rows


def _lists(rng: np.random.Generator, n: int, max_len: int, value_type: pa.DataType, large: bool = False,
           null_every: int = 0) -> pa.Array:
    lengths = rng.integers(0, max_len + 1, n)
    offsets = np.zeros(n + 1, dtype=np.int64 if large else np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(rng.integers(-100, 100, int(offsets[-1])).astype(value_type.to_pandas_dtype()), value_type)
    mask = pa.array(np.arange(n) % null_every == 1) if null_every else None
    cls = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(pa.array(offsets), values, mask=mask)


def _table(seed: int, n: int, max_len: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "doc_id": pa.array([f"d{i}" if i % 5 else None for i in range(n)]),
        "ids": _lists(rng, n, max_len, pa.int32()),
        "mask": _lists(rng, n, max_len, pa.int8(), null_every=4),
        "big": _lists(rng, n, max_len, pa.int64(), large=True, null_every=3),
        "floats": _lists(rng, n, max_len, pa.float32()),
        "texts": pa.array([[f"t{i}"] * (i % 3) for i in range(n)], pa.list_(pa.string())),  # not fixed-width
        "segments": pa.array([[{"text": "x", "train": True}]] * n),  # nested: Arrow's take
        "n": pa.array(np.arange(n, dtype=np.int32)),
        # null values inside the lists: Arrow's take (numpy has no nulls)
        "holes": pa.array([[None if (i + j) % 7 == 0 else j for j in range(max_len)] for i in range(n)],
                          pa.list_(pa.int32())),
    })


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(0, 120), max_len=st.sampled_from([0, 2, 60, 400]),
       chunks=st.integers(1, 5), with_offset=st.booleans(), repeats=st.booleans())
def test_take_rows_equals_arrow_take(seed, n, max_len, chunks, with_offset, repeats):
    table = _table(seed, n + 3, max_len)
    if with_offset:  # a sliced table: its list columns start inside their values buffers
        table = table.slice(3)
    else:
        table = table.slice(0, n)
    if chunks > 1 and table.num_rows:  # uneven chunks, an empty one among them
        cuts = sorted(np.random.default_rng(seed).integers(0, table.num_rows + 1, chunks - 1).tolist())
        bounds = [0, *cuts, table.num_rows]
        table = pa.concat_tables([table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])] + [table.slice(0, 0)])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, table.num_rows, table.num_rows * 2) if repeats and table.num_rows else \
        rng.permutation(table.num_rows)
    want = table.take(pa.array(idx, pa.int64()))
    for threshold in (0, take.ROW_COPY_MIN_MEAN):  # every list row by row, and the default choice
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(take, "ROW_COPY_MIN_MEAN", threshold)
            got = take_rows(table, idx)
        assert got.schema == table.schema
        assert got.equals(want), (threshold, got.to_pylist()[:3], want.to_pylist()[:3])
        assert all(c.num_chunks == 1 for c in got.columns)
        for name in ("ids", "mask", "big", "floats"):  # physically too: a null row holds no values
            g, w = got.column(name).chunk(0), want.column(name).combine_chunks()
            assert g.offsets.equals(w.offsets) and g.values.equals(w.values), name


def test_take_rows_of_a_record_batch_is_a_record_batch():
    batch = _table(1, 50, 300).to_batches()[0]
    got = take_rows(batch, np.arange(49, -1, -1))
    assert isinstance(got, pa.RecordBatch)
    assert got.equals(batch.take(pa.array(np.arange(49, -1, -1))))


def test_take_rows_uses_row_copies_only_for_long_fixed_width_lists(monkeypatch):
    """The path choice itself: a column of long int lists is copied row by row, short ones and other
    types go through Arrow (whose per-value index is cheaper there)."""
    used = []
    real = take._take_list
    monkeypatch.setattr(take, "_take_list", lambda arr, idx: used.append(str(arr.type)) or real(arr, idx))
    take_rows(_table(2, 40, 400), np.arange(40))
    assert sorted(used) == ["large_list<item: int64>", "list<item: float>", "list<item: int32>", "list<item: int8>"]
    used.clear()
    take_rows(_table(2, 40, 2), np.arange(40))
    assert used == []


def test_take_rows_rejects_an_index_out_of_range():
    with pytest.raises(IndexError):
        take_rows(_table(3, 10, 100), np.array([0, 10]))
    with pytest.raises(IndexError):
        take_rows(_table(3, 10, 100), np.array([-1]))


def test_the_path_depends_on_the_rows_own_values_not_on_their_buffer(monkeypatch):
    """A slice's list column shares its values buffer with rows outside the slice; a long row there must
    not switch the slice's rows to row copies (the same rows would then give other buffers than when
    compacted, and a shard's resume fingerprint would depend on its neighbours)."""
    used = []
    real = take._take_list
    monkeypatch.setattr(take, "_take_list", lambda arr, idx: used.append(len(arr)) or real(arr, idx))
    lengths = np.array([5] * 100 + [100_000])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.arange(offsets[-1], dtype=np.int32)))
    sliced = pa.table({"ids": ids}).slice(0, 100)
    take_rows(sliced, np.arange(100)[::-1])
    take_rows(pa.table({"ids": ids}).slice(100), np.array([0]))  # the long row alone: row copies
    assert used == [1]


def test_take_rows_reads_chunks_without_concatenating_them(monkeypatch):
    """A shard's spilled parts arrive as chunks; rows are copied from the chunk that holds them."""
    t = _table(5, 90, 400)
    chunked = pa.concat_tables([t.slice(0, 30), t.slice(30, 1), t.slice(31, 0), t.slice(31)])
    assert chunked.column("ids").num_chunks > 1
    seen = []
    real = take._take_list
    monkeypatch.setattr(take, "_take_list", lambda col, idx: seen.append(col.num_chunks) or real(col, idx))
    got = take_rows(chunked.select(["ids", "big"]), np.arange(89, -1, -1))
    assert got.equals(t.select(["ids", "big"]).take(pa.array(np.arange(89, -1, -1))))
    assert seen == [4, 4]  # handed the chunks, not a concatenation


def test_take_rows_refuses_more_values_than_list_offsets_address(monkeypatch):
    """int32 offsets would wrap past 2^31 - 1 values (silently corrupt); a clear error instead."""
    monkeypatch.setattr(take, "LIST_MAX_VALUES", 1000)
    t = _table(6, 40, 400).select(["ids"])
    with pytest.raises(OverflowError, match="large_list"):
        take_rows(t, np.arange(40))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 120), max_len=st.sampled_from([0, 2, 60, 400]),
       batches=st.integers(1, 6), repeats=st.booleans(), part=st.sampled_from([1, 7, 1000]))
def test_take_rows_of_batches_equals_take_rows_of_the_whole(seed, n, max_len, batches, repeats, part):
    """The sink's slice gather: rows from several batches (uneven, empty ones among them, a slice of a
    larger batch) in any order, `part` indices at a time, equal `take_rows` of the batches as one table."""
    from datakit.io.take import take_rows_of_batches

    table = _table(seed, n + 2, max_len).slice(2)
    rng = np.random.default_rng(seed)
    cuts = sorted(rng.integers(0, n + 1, batches - 1).tolist())
    bounds = [0, *cuts, n]
    parts = [b for a, z in zip(bounds, bounds[1:]) for b in table.slice(a, z - a).to_batches()]
    parts.insert(len(parts) // 2, pa.RecordBatch.from_pylist([], schema=table.schema))  # an empty one
    idx = rng.integers(0, n, n * 2) if repeats else rng.permutation(n)
    whole = pa.Table.from_batches(parts, schema=table.schema).combine_chunks()
    for a in range(0, len(idx), part):
        got = take_rows_of_batches(parts, idx[a:a + part], table.schema)
        want = take_rows(whole, idx[a:a + part])
        assert got.schema == table.schema and got.equals(want)
        assert all(c.num_chunks == 1 for c in got.columns)
    assert take_rows_of_batches(parts, np.zeros(0, dtype=np.int64), table.schema).num_rows == 0
    with pytest.raises(IndexError):
        take_rows_of_batches(parts, np.array([n]), table.schema)


def test_take_rows_of_batches_never_concatenates_the_batches(monkeypatch):
    """Each slice is gathered from the batches holding its rows: every take it makes is of one batch or
    of the slice's own rows, never of the batches concatenated (Arrow's take of a chunked nested
    column concatenates it first: 38 MB of pool for 3.8 MB of result on a 31 MB shard)."""
    from datakit.io.take import take_rows_of_batches

    rows = 2_000
    t = pa.table({"doc_id": [f"d{i:05d}" for i in range(rows)],
                  "segments": pa.array([[{"text": f"x{i}", "train": True}] for i in range(rows)])})
    batches = t.to_batches(max_chunksize=200)
    assert len(batches) == 10
    seen = []
    real = take.take_rows
    monkeypatch.setattr(take, "take_rows", lambda data, idx: seen.append(data.num_rows) or real(data, idx))
    idx = np.random.default_rng(0).permutation(rows)[:50]  # rows from (nearly) every batch
    got = take_rows_of_batches(batches, idx, t.schema)
    assert got.equals(real(t, idx))
    assert len(seen) > 2 and max(seen) <= 200  # one batch, or the 50 gathered rows
