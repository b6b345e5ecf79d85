"""Rows of a table in a given order (`Table.take`), with long list columns copied row by row.

Why not `Table.take` alone: for a list column Arrow's take builds an index of every *value* (8 bytes
per token of a tokenized document) and gathers through it. The sink reorders whole shards of token
lists twice (grouping a task's rows by shard, sorting a shard before it is written), and there that
index cost more than the copy itself: a 2.8M-token batch of documents of ~330 tokens took 0.017 s
warm (0.047 s in a fresh process) through Arrow and 0.008 s (0.018 s) as one slice per row. Below
`ROW_COPY_MIN_MEAN` values per row the slices cost more than the index, and Arrow's take is used.

Only list (and large_list) columns of fixed-width values without nulls take the row-by-row path;
every other column goes through Arrow. The result equals `Table.take`'s (tested against it). Such a
column is read chunk by chunk, not concatenated first: the sink hands a shard's spilled parts over as
chunks, and concatenating them was one more copy of every token (a column Arrow takes is made one
chunk first).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

# mean values per row from which a list column is copied one row slice at a time (~0.5 us a row,
# against ~10 ns a value for Arrow's per-value index)
ROW_COPY_MIN_MEAN = 48
# values one output column may hold: what its offsets can address (int32 for list, int64 for large_list)
LIST_MAX_VALUES = (1 << 31) - 1
LARGE_LIST_MAX_VALUES = (1 << 63) - 1


def _own_values(arr: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(offsets from 0, the values those offsets index): only the rows' own values, since `arr.values`
    also holds what lies outside a slice."""
    offsets = arr.offsets.to_numpy().astype(np.int64)
    first = int(offsets[0])
    return offsets - first, arr.values.slice(first, int(offsets[-1]) - first)


def copies_by_row(col: pa.ChunkedArray) -> bool:
    """A list of integers or floats, no null values inside its rows, long rows on average. Decided from
    the rows' own values, so the same rows take the same path (and give the same buffers) however they
    are sliced or chunked."""
    t = col.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    vt = t.value_type
    if not (pa.types.is_integer(vt) or pa.types.is_floating(vt)) or len(col) == 0:
        return False
    n_values = 0
    for arr in col.chunks:
        if len(arr):
            _, values = _own_values(arr)
            if values.null_count:
                return False
            n_values += len(values)
    return n_values >= ROW_COPY_MIN_MEAN * len(col)


def _take_list(col: pa.ChunkedArray, idx: np.ndarray) -> pa.Array:
    """`col.take(idx)` for a list of fixed-width values: each row's value slice copied in order, read from
    whichever chunk holds it (the chunks are never concatenated first)."""
    values, starts, ends, chunk_of, valid = [], [], [], [], []
    for k, arr in enumerate(c for c in col.chunks if len(c)):
        offsets, own = _own_values(arr)
        values.append(own.to_numpy())
        s, e = offsets[:-1], offsets[1:]
        if arr.null_count:
            ok = arr.is_valid().to_numpy(zero_copy_only=False)
            e = np.where(ok, e, s)  # a null row holds no values (as Arrow's take makes it)
            valid.append(ok)
        else:
            valid.append(np.ones(len(arr), dtype=bool))
        starts.append(s)
        ends.append(e)
        chunk_of.append(np.full(len(arr), k, dtype=np.int64))
    starts_i = np.concatenate(starts)[idx]
    ends_i = np.concatenate(ends)[idx]
    lengths = ends_i - starts_i
    large = pa.types.is_large_list(col.type)
    offset_type = np.int64 if large else np.int32
    total = int(lengths.sum())
    if total > (LARGE_LIST_MAX_VALUES if large else LIST_MAX_VALUES):
        raise OverflowError(f"{total} values in one {col.type} column: more than its offsets can address"
                            + ("" if large else " (a large_list type addresses more)"))
    new_offsets = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    if len(values) == 1:
        one = values[0]
        parts = [one[a:b] for a, b in zip(starts_i.tolist(), ends_i.tolist())]
    else:
        chunks_i = np.concatenate(chunk_of)[idx]
        parts = [values[c][a:b] for c, a, b in zip(chunks_i.tolist(), starts_i.tolist(), ends_i.tolist())]
    new_values = np.concatenate(parts) if parts else np.zeros(0, dtype=col.type.value_type.to_pandas_dtype())
    ok_i = np.concatenate(valid)[idx]
    cls = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(pa.array(new_offsets.astype(offset_type)), pa.array(new_values, col.type.value_type),
                           type=col.type, mask=None if ok_i.all() else pa.array(~ok_i))


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
        if copies_by_row(col):
            columns.append(_take_list(col, idx))
        else:
            if arrow_idx is None:
                arrow_idx = pa.array(idx)
            arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            columns.append(arr.take(arrow_idx))
    if batch:
        return pa.RecordBatch.from_arrays(columns, schema=data.schema)
    return pa.Table.from_arrays(columns, schema=data.schema)


def take_rows_of_batches(batches: list[pa.RecordBatch], indices: np.ndarray, schema: pa.Schema) -> pa.Table:
    """`take_rows` of the rows `batches` hold one after another, without concatenating them first.

    Why: a shard's spilled parts are read as many batches, and Arrow's take of a chunked column
    concatenates it inside the take (measured: a take of 1/8 of a 31 MB two-part shard's
    `segments` column grew Arrow's pool by 38 MB for 3.8 MB of result). The sink writes a shard in
    row-group slices of its sorted order, so each slice gathers its rows from the batches that hold
    them: one take per batch touched, then one take back into the asked order. Every copy is the
    size of the slice, never of the shard."""
    idx = np.asarray(indices, dtype=np.int64)
    sizes = np.array([b.num_rows for b in batches], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    if len(idx) and (idx.min() < 0 or idx.max() >= starts[-1]):
        raise IndexError(f"row index out of range 0..{int(starts[-1]) - 1}")
    if len(idx) == 0:
        return schema.empty_table()
    which = np.searchsorted(starts, idx, side="right") - 1
    if (which == which[0]).all():
        return take_rows(pa.Table.from_batches([batches[int(which[0])]], schema=schema), idx - starts[which[0]])
    order = np.argsort(which, kind="stable")  # the rows grouped by the batch holding them
    grouped = which[order]
    cuts = np.flatnonzero(np.diff(grouped)) + 1
    pieces = [take_rows(batches[int(grouped[a])], idx[order[a:b]] - starts[grouped[a]])
              for a, b in zip([0, *cuts], [*cuts, len(idx)])]
    back = np.empty(len(idx), dtype=np.int64)
    back[order] = np.arange(len(idx), dtype=np.int64)  # row j of the answer is row back[j] of the pieces
    gathered = pa.Table.from_batches(pieces, schema=schema).combine_chunks()
    del pieces  # (combined: one copy of the slice, not two, while it is put in order)
    return take_rows(gathered, back)
