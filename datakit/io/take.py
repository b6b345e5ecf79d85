"""Rows of a table in a given order (`Table.take`), with long list columns copied row by row.

Why not `Table.take` alone: for a list column Arrow's take builds an index of every *value* (8 bytes
per token of a tokenized document) and gathers through it. The sink reorders whole shards of token
lists twice (grouping a task's rows by shard, sorting a shard before it is written), and there that
index cost more than the copy itself: a 2.8M-token batch of documents of ~330 tokens took 0.017 s
warm (0.047 s in a fresh process) through Arrow and 0.008 s (0.018 s) as one slice per row. Below
`ROW_COPY_MIN_MEAN` values per row the slices cost more than the index, and Arrow's take is used.

Only list (and large_list) columns of fixed-width values without nulls take the row-by-row path;
every other column goes through Arrow. The result equals `Table.take`'s (tested against it).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

# mean values per row from which a list column is copied one row slice at a time (~0.5 us a row,
# against ~10 ns a value for Arrow's per-value index)
ROW_COPY_MIN_MEAN = 48


def _row_copyable(arr: pa.Array) -> bool:
    t = arr.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    vt = t.value_type
    if not (pa.types.is_integer(vt) or pa.types.is_floating(vt)):
        return False
    if len(arr) == 0:
        return False
    # decided from the rows' own values (`arr.values` also holds what lies outside a slice), so the same
    # rows take the same path, and give the same buffers, however they are sliced or chunked
    offsets = arr.offsets
    first, last = offsets[0].as_py(), offsets[len(arr)].as_py()
    return last - first >= ROW_COPY_MIN_MEAN * len(arr) and arr.values.slice(first, last - first).null_count == 0


def _take_list(arr: pa.Array, idx: np.ndarray) -> pa.Array:
    """`arr.take(idx)` for a list of fixed-width values: each row's value slice copied in order."""
    offsets = arr.offsets.to_numpy()  # into arr.values (which ignores the array's slice offset)
    first = int(offsets[0])
    # only the rows' own values (the buffer may hold nulls outside them); no nulls here (`_row_copyable`)
    values = arr.values.slice(first, int(offsets[-1]) - first).to_numpy()
    offsets = offsets - first
    starts, ends = offsets[:-1][idx], offsets[1:][idx]
    valid = None
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)[idx]
        ends = np.where(valid, ends, starts)  # a null row holds no values (as Arrow's take makes it)
    new_offsets = np.zeros(len(idx) + 1, dtype=offsets.dtype)
    np.cumsum(ends - starts, out=new_offsets[1:])
    parts = [values[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
    new_values = np.concatenate(parts) if parts else values[:0]
    return type(arr).from_arrays(pa.array(new_offsets), pa.array(new_values, arr.type.value_type), type=arr.type,
                                 mask=None if valid is None else pa.array(~valid))


def take_rows(data: pa.Table | pa.RecordBatch, indices: np.ndarray | pa.Array) -> pa.Table | pa.RecordBatch:
    """`data.take(indices)`: a record batch for a record batch, else a table of one-chunk columns."""
    batch = isinstance(data, pa.RecordBatch)
    if batch:
        data = pa.Table.from_batches([data])
    idx = indices.to_numpy(zero_copy_only=False) if isinstance(indices, (pa.Array, pa.ChunkedArray)) \
        else np.asarray(indices)
    idx = idx.astype(np.int64, copy=False)
    if len(idx) and (idx.min() < 0 or idx.max() >= data.num_rows):
        raise IndexError(f"row index out of range 0..{data.num_rows - 1}")
    arrow_idx = None
    columns = []
    for col in data.columns:
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        if _row_copyable(arr):
            columns.append(_take_list(arr, idx))
        else:
            if arrow_idx is None:
                arrow_idx = pa.array(idx)
            columns.append(arr.take(arrow_idx))
    if batch:
        return pa.RecordBatch.from_arrays(columns, schema=data.schema)
    return pa.Table.from_arrays(columns, schema=data.schema)
