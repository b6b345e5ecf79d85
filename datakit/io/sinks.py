"""Sharded output writers, shared by both engines so their bytes are identical.

The contract: an engine groups the final rows by `shard_ids(key)`, hands each
shard's rows (any order) to `write_shard` (or its spilled parts to `write_shard_parts`), collects
the returned `ShardInfo` dicts, and calls `commit` once. Both sort (`shard_order`) and end in
`write_ordered_shard`, which writes atomically (a Parquet shard one row group at a time, gathered
from the parts in sorted order: `OrderedRows`) and is
resumable: if the final file exists and its sidecar says it was written from
the same content fingerprint *under the same reuse key* (the run's config hash,
which covers the pipeline, library versions and artifact digests, plus the
writer settings: format, shard count, key, options such as packing and
seq_len), it is reused (checksum verified) instead of rewritten. Formats register a `ShardWriter` (parquet here; `packed` and
`megatron` in `datakit.stages.tokenize`).
"""
from __future__ import annotations

import hashlib
import importlib
import json
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from datakit.io.atomic import atomic_path, read_json_object, sha256_file, write_json_atomic
from datakit.io.fs import arrow_filesystem, filesystem
from datakit.io.layout import TOKENIZER_FILE, data_file, manifest_files, prune_data, remove_root_file, write_card
from datakit.io.take import copies_by_row, take_rows, take_rows_of_batches
from datakit.plan import SinkSpec

# 2: data files under data/ (schemas/output_layout.md); a version-1 shard is never reused
FORMAT_VERSION = 2


def shard_ids(keys: pa.Array | pa.ChunkedArray, shards: int, partition: str = "hash") -> np.ndarray:
    """Shard of each key. `partition="hash"`: xxh64(utf-8 key, seed 0) % shards; `"value"`: the key
    *is* the shard (an integer column a stage computed, e.g. the top bits of an n-gram hash).
    Independent of engine and partitioning either way."""
    if partition == "value":
        ids = np.asarray(pa.chunked_array([keys]).combine_chunks().cast(pa.int64()).to_numpy(zero_copy_only=False))
        if len(ids) and (ids.min() < 0 or ids.max() >= shards):
            raise ValueError(f"shard key out of range 0..{shards - 1}: {int(ids.min())}..{int(ids.max())}")
        return ids
    if shards <= 1:
        return np.zeros(len(keys), dtype=np.int64)
    return (key_hashes(keys) % np.uint64(shards)).astype(np.int64)


def key_hashes(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """xxh64 (seed 0) of each key's UTF-8 bytes, as uint64: `partition="hash"` puts a row in shard
    `hash % shards`. Separate so the Spark engine can hash in the chain that already runs in Python
    and take the modulo in the JVM once the shard count is known (see spark.py `shard_of_hash`)."""
    h = xxhash.xxh64_intdigest
    return np.fromiter((h(k.encode()) for k in keys.to_pylist()), dtype=np.uint64, count=len(keys))


# what a null key hashes to in `group_hashes` (all null keys of a column are one group, as in a group-by)
_NULL_HASH = np.uint64(0x6A09E667F3BCC909)
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + _MIX[0]
    z = (z ^ (z >> np.uint64(30))) * _MIX[1]
    z = (z ^ (z >> np.uint64(27))) * _MIX[2]
    return z ^ (z >> np.uint64(31))


def group_hashes(columns: list[pa.Array | pa.ChunkedArray], nulls_by_position: bool = False) -> np.ndarray:
    """One uint64 per row from several key columns, equal for equal key tuples (null keys included, all
    nulls of a column alike): the local engine's bucket aggregates and joins put a key's rows in one
    bucket with `group_hashes(...) % buckets`. Integer and boolean columns are mixed in vectorized
    (splitmix64; an int32 and an int64 column of equal values hash alike), strings by xxh64 of their
    UTF-8 bytes, anything else (dates, floats, ...) by xxh64 of its Python repr. Only ever compared within one run (a
    shuffle that is never resumed), so it need not be stable across versions.

    `nulls_by_position` (joins): a row with a null in any key column matches nothing, so its hash is
    its position and such rows spread over the buckets (a left join's many null keys made one huge)."""
    n = len(columns[0]) if columns else 0
    out = np.zeros(n, dtype=np.uint64)
    any_null = np.zeros(n, dtype=bool)
    h = xxhash.xxh64_intdigest
    with np.errstate(over="ignore"):
        for col in columns:
            arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            t = arr.type
            if pa.types.is_integer(t) or pa.types.is_boolean(t):
                # as uint64 modulo 2**64: -1 is the same value whether it came as int32 or int64
                vals = np.asarray(arr.fill_null(False if pa.types.is_boolean(t) else 0)
                                  .to_numpy(zero_copy_only=False))
                x = _splitmix64(vals.astype(np.uint64))
                if arr.null_count:
                    x[~np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))] = _NULL_HASH
            elif pa.types.is_string(t) or pa.types.is_large_string(t):
                x = np.fromiter((h(k.encode()) if k is not None else _NULL_HASH for k in arr.to_pylist()),
                                dtype=np.uint64, count=n)
            else:
                x = np.fromiter((h(repr(k).encode()) if k is not None else _NULL_HASH for k in arr.to_pylist()),
                                dtype=np.uint64, count=n)
            out = out * _MIX[2] + x
            if nulls_by_position and arr.null_count:
                any_null |= ~np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))
    if nulls_by_position and any_null.any():
        out[any_null] = np.flatnonzero(any_null).astype(np.uint64)
    return out


def table_fingerprint(table: pa.Table) -> str:
    """A content hash of a shard's rows (after sorting), used to decide whether a resume may reuse it.

    A column without nulls is hashed without its validity bitmap: Arrow's `take` gives one to some
    columns and not to others depending on the input's layout (and `io/take.py`'s row copies never
    do), and the same rows must hash the same however they arrived.

    Why xxh3-128 and not sha256: the fingerprint decides reuse of our own earlier output (never
    published; the files' sha256 in the manifest is what readers check), and sha256 over every
    token and mask buffer was the sink's largest single cost after packing (56 MB of a 32 MB
    tokenize run: 43 vs 4.6 ms). The name prefix keeps a sidecar written with the old hash from
    ever matching: such a shard is rewritten once."""
    h = xxhash.xxh3_128()
    _hash_rows(h, table)
    h.update(str(table.num_rows).encode())
    return "xxh3_128:" + h.hexdigest()


def _hash_rows(h: Any, table: pa.Table) -> None:
    for batch in table.to_batches():
        for col in batch.columns:
            bufs = col.buffers()
            if col.null_count == 0 and bufs:
                bufs = bufs[1:]  # the top-level validity bitmap (children keep theirs)
            for buf in bufs:
                if buf is not None:
                    h.update(memoryview(buf))


def sort_shard(table: pa.Table, sort_key: str) -> pa.Table:
    """`table` in `shard_order`."""
    if table.num_rows == 0:
        return table
    return take_rows(table, shard_order(table, sort_key))


def shard_order(table: pa.Table, sort_key: str) -> np.ndarray:
    """Stable order inside a shard, as row numbers of `table`: by the sort key; rows that tie on it
    (duplicate keys, which the contracts forbid but real data may still bring) are ordered by a hash
    of their content, so the bytes never depend on arrival order, engine or partitioning."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    keys = table.column(sort_key).combine_chunks()  # (a Table's sort reads every column's pages: +40 MB)
    order = pc.sort_indices(keys).to_numpy().astype(np.int64)
    keys = keys.take(pa.array(order))
    if table.num_rows > 1:
        same_as_next = pc.equal(keys.slice(0, len(keys) - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
        if same_as_next.any():
            tie = np.zeros(table.num_rows, dtype=np.uint64)
            dup = np.zeros(table.num_rows, dtype=bool)
            dup[:-1] |= same_as_next
            dup[1:] |= same_as_next
            for i in np.flatnonzero(dup):
                row = json.dumps(table.slice(int(order[i]), 1).to_pylist()[0], sort_keys=True, default=str)
                tie[i] = xxhash.xxh64_intdigest(row.encode())
            by_tie = pa.table({"k": keys, "t": pa.array(tie)})
            order = order[pc.sort_indices(by_tie, sort_keys=[("k", "ascending"), ("t", "ascending")]).to_numpy()]
    return order


class OrderedRows:
    """A shard's rows in the order they are written, gathered a slice at a time from the batches that
    hold them (`take_rows_of_batches`), so a writer that writes row group by row group never holds a
    sorted copy of the whole shard. Why: sorting a shard (a take of every row, one more copy of it) and
    then writing it held the shard two to four times at once: a 31 MB shard of code records raised the
    writing process by 153 MB; the sink's shard write was a dedup run's peak."""

    def __init__(self, table: pa.Table, order: np.ndarray) -> None:
        self.schema = table.schema
        self.num_rows = table.num_rows
        self._batches = [b for b in table.to_batches() if b.num_rows]
        self._order = order  # row numbers of `table`, in written order (`shard_order`)

    def slices(self, rows: int) -> Iterator[pa.Table]:
        """The rows in order, `rows` at a time (the last slice may be shorter); each a fresh table of
        one-chunk columns, so its buffers depend on its rows only, not on how the parts were cut."""
        for a in range(0, self.num_rows, rows):
            piece = take_rows_of_batches(self._batches, self._order[a:a + rows], self.schema)
            yield piece
            del piece  # before the next slice is gathered

    def table(self) -> pa.Table:
        """All rows in order, as one table (for writers that need the whole shard at once). Columns
        `io/take.py` copies row by row are read from the parts' chunks; every other column is first made
        one chunk, one column at a time (Arrow's take would concatenate a chunked list column inside
        the take, beside the parts and its result)."""
        table = pa.Table.from_batches(self._batches, schema=self.schema)
        self._batches = []  # handed over: let go of once sorted
        for i in range(table.num_columns):
            if table.column(i).num_chunks > 1 and not copies_by_row(table.column(i)):
                table = table.set_column(i, table.field(i), table.column(i).combine_chunks())
        return take_rows(table, self._order)

    def hashed_slices(self, rows: int, h: Any) -> Iterator[pa.Table]:
        """`slices(rows)`, each hashed into `h` as it goes by (`table_fingerprint`'s hash of a table's
        buffers); `slices_fingerprint(h)` once they are all through."""
        for piece in self.slices(rows):
            _hash_rows(h, piece)
            yield piece
            del piece  # before the next slice is gathered

    def slices_fingerprint(self, h: Any) -> str:
        """The resume fingerprint of the rows `hashed_slices` hashed into `h`. Why another name than
        `table_fingerprint`'s: the same rows hash otherwise cut in slices than as one table."""
        h.update(str(self.num_rows).encode())
        return "xxh3_128s:" + h.hexdigest()

    def fingerprint(self, rows: int) -> str:
        """The resume fingerprint of the rows in order, hashed `rows` at a time (no writing)."""
        h = xxhash.xxh3_128()
        for _ in self.hashed_slices(rows, h):
            pass
        return self.slices_fingerprint(h)


class ShardWriter(Protocol):
    """A format plug-in. `write` writes one shard's files under `out_url`, returns name -> rows stats.

    A writer that is not a sharded dataset (the n-gram index) sets `owns_order = True` and has a
    `commit(spec, shards, manifest, metrics)`: it gets each shard's rows unsorted and without the
    resume sidecar, and builds its own output from the shards at commit instead of a manifest."""

    name: str

    def write(self, table: pa.Table, shard: int, out_url: str, spec: SinkSpec) -> dict[str, Any]: ...

    def manifest_extra(self, spec: SinkSpec, shards: list[dict[str, Any]]) -> dict[str, Any]: ...

    # optional: `dataset_files(spec, shards, out) -> [paths]` writes files that describe the whole
    # dataset (MDS's data/index.json) at commit, before the manifest, which lists them under
    # `dataset_files` with sha256 and size like a shard's files


_WRITERS: dict[str, Callable[[], ShardWriter]] = {}
_LAZY = {"packed": "datakit.stages.tokenize.writers", "megatron": "datakit.stages.tokenize.writers",
         "mds": "datakit.stages.tokenize.mds", "ngram_index": "datakit.stages.decontaminate.index"}


def register_writer(name: str):
    def deco(factory):
        _WRITERS[name] = factory
        return factory
    return deco


# writers that only datakit's own plans use (the n-gram index: `output.index`, `datakit build-index`), not a
# pipeline's `output.format`: found in review, `format: ngram_index` ran every stage, then crashed in the writer
INTERNAL_FORMATS = frozenset({"ngram_index"})


def known_formats() -> list[str]:
    """Output formats a pipeline may name: registered writers and the built-in lazy ones."""
    return sorted((set(_WRITERS) | set(_LAZY)) - INTERNAL_FORMATS)


def writer_for(fmt: str) -> ShardWriter:
    if fmt not in _WRITERS and fmt in _LAZY:
        importlib.import_module(_LAZY[fmt])
    try:
        return _WRITERS[fmt]()
    except KeyError:
        raise ValueError(f"unknown output format {fmt!r}; known: {sorted(set(_WRITERS) | set(_LAZY))}") from None


PARQUET_WRITE_OPTIONS = dict(compression="zstd", compression_level=3, row_group_size=8192,
                             use_dictionary=True, write_statistics=True, store_schema=False)
# what `pq.ParquetWriter` takes of them (the row group size is an argument of each write)
_WRITER_OPTIONS = {k: v for k, v in PARQUET_WRITE_OPTIONS.items() if k != "row_group_size"}


def write_parquet(table: pa.Table, url: str, row_group_size: int = PARQUET_WRITE_OPTIONS["row_group_size"]) -> None:
    """Write a Parquet file with fixed settings (same bytes for the same table, on every engine).

    An empty table is written with no row group at all: `write_table` gave it one row group of 0
    rows, which Hugging Face `datasets` refuses ("BatchSize must be greater than 0"), so one empty
    shard (an append-mode night whose documents were all seen before) stopped `load_dataset` from
    reading the whole dataset (found in review)."""
    with atomic_path(url) as tmp:
        fs, p = filesystem(tmp)
        if table.num_rows == 0:
            pq.ParquetWriter(p, table.schema, filesystem=arrow_filesystem(fs), **_WRITER_OPTIONS).close()
            return
        pq.write_table(table, p, filesystem=arrow_filesystem(fs), **{**PARQUET_WRITE_OPTIONS, "row_group_size": row_group_size})


def write_parquet_slices(slices: Iterator[pa.Table], schema: pa.Schema, url: str) -> int:
    """`write_parquet` of the rows `slices` give, each slice one row group of
    PARQUET_WRITE_OPTIONS["row_group_size"] rows (the last may be shorter): the bytes `write_parquet`
    writes for the same rows as one table (tested), with one slice in memory at a time. Returns
    the rows written."""
    size = PARQUET_WRITE_OPTIONS["row_group_size"]
    rows = 0
    with atomic_path(url) as tmp:
        fs, p = filesystem(tmp)
        with pq.ParquetWriter(p, schema, filesystem=arrow_filesystem(fs), **_WRITER_OPTIONS) as writer:
            for piece in slices:
                if piece.num_rows > size:
                    raise ValueError(f"a slice of {piece.num_rows} rows is more than one row group ({size})")
                if piece.num_rows:
                    writer.write_table(piece, row_group_size=size)
                    rows += piece.num_rows
    return rows


@register_writer("parquet")
class ParquetShardWriter:
    name = "parquet"

    # rows per slice `write_slices` takes: one row group each
    slice_rows = PARQUET_WRITE_OPTIONS["row_group_size"]

    def write(self, table: pa.Table, shard: int, out_url: str, spec: SinkSpec) -> dict[str, Any]:
        fname = data_file(f"part-{shard:05d}.parquet")
        write_parquet(table, f"{out_url.rstrip('/')}/{fname}")
        return {"files": [fname], "rows": table.num_rows}

    def write_slices(self, slices: Iterator[pa.Table], schema: pa.Schema, shard: int, out_url: str,
                     spec: SinkSpec) -> dict[str, Any]:
        """`write` of the rows `slices` give, `slice_rows` at a time (a writer with this method gets a
        shard's rows as `OrderedRows`, never as one sorted table)."""
        fname = data_file(f"part-{shard:05d}.parquet")
        rows = write_parquet_slices(slices, schema, f"{out_url.rstrip('/')}/{fname}")
        return {"files": [fname], "rows": rows}

    def manifest_extra(self, spec: SinkSpec, shards: list[dict[str, Any]]) -> dict[str, Any]:
        if "vocab_size" not in (spec.options or {}):
            return {}
        # tokenized records: the tokenizer and seq_len, from the tokenize writers (loaded by name, as
        # `writer_for` loads them: io never imports a stage)
        return importlib.import_module(_LAZY["packed"]).tokenized_parquet_manifest(spec, shards)


def shard_reuse_key(spec: SinkSpec) -> str:
    """Everything besides a shard's rows that determines its bytes: the run's identity (config hash:
    pipeline, library versions, artifact digests) and the writer settings, plus the format version."""
    from datakit import __version__

    blob = json.dumps({"identity": spec.identity, "format": spec.format, "format_version": FORMAT_VERSION,
                       "datakit": __version__, "shards": spec.shards, "key": spec.key, "sort_key": spec.sort_key,
                       "options": spec.options}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def owns_order(spec: SinkSpec) -> bool:
    """Whether the spec's writer takes a shard's rows as they came (no sort, no resume sidecar)."""
    return bool(getattr(writer_for(spec.format), "owns_order", False))


def write_shard(table: pa.Table, shard: int, spec: SinkSpec, schema: pa.Schema | None = None) -> dict[str, Any]:
    """Sort one shard, write it with the spec's format (or reuse a finished identical one), return its info."""
    return write_shard_parts([table], shard, spec, schema)


def write_shard_parts(parts: list[pa.Table], shard: int, spec: SinkSpec, schema: pa.Schema | None) -> dict[str, Any]:
    """`write_shard` of the concatenation of `parts` (a shard's spilled pieces), which the caller hands
    over: the list is emptied, so nothing but the shard's writing holds the parts.

    A writer that writes row group by row group (`write_slices`: Parquet) gets the rows as
    `OrderedRows`: the sorted order as row numbers, each row group gathered from the parts when it is
    written, so the shard is never held sorted as a whole. Any other writer gets one sorted table
    (`OrderedRows.table`); one that owns the order gets the parts' chunks as they came."""
    table = pa.concat_tables(parts) if parts else (schema or pa.schema([])).empty_table()
    parts.clear()
    if schema is not None:
        table = table.select(schema.names).cast(schema)
    if owns_order(spec):
        return write_ordered_shard(table, shard, spec)
    return write_ordered_shard(OrderedRows(table, shard_order(table, spec.sort_key or spec.key)), shard, spec)


def write_ordered_shard(rows: pa.Table | OrderedRows, shard: int, spec: SinkSpec) -> dict[str, Any]:
    """Write one shard's rows in the order given (or reuse a finished identical shard).

    Reuse needs the same rows (content fingerprint) *and* the same reuse key: a rerun with another
    packing, seq_len, tokenizer, shard count or stage option rewrites the shard. A writer that takes
    slices hashes each slice as it writes it; a sidecar from an earlier attempt is checked first by a
    pass that only gathers and hashes."""
    out = spec.path.rstrip("/")
    writer = writer_for(spec.format)
    slice_rows = getattr(writer, "slice_rows", 0) if hasattr(writer, "write_slices") else 0
    if isinstance(rows, OrderedRows) and not slice_rows:  # (a writer that owns the order never gets one)
        rows = rows.table()
    if owns_order(spec):
        return {**writer.write(rows, shard, out, spec), "shard": shard, "reused": False}
    reuse_key = shard_reuse_key(spec)
    sidecar = f"{out}/_shards/shard-{shard:05d}.json"
    fs, sp = filesystem(sidecar)
    fingerprint = None
    if fs.exists(sp):
        fingerprint = rows.fingerprint(slice_rows) if isinstance(rows, OrderedRows) else table_fingerprint(rows)
        try:
            info = json.loads(fs.cat_file(sp))
            if info.get("fingerprint") == fingerprint and info.get("reuse_key") == reuse_key and all(
                sha256_file(f"{out}/{f}") == info["sha256"][f] for f in info["files"]
            ):
                info["bytes"] = _sizes(out, info["files"])
                info["reused"] = True
                return info
        except (OSError, ValueError, KeyError):
            pass  # stale or partial sidecar: rewrite the shard
        fs.rm(sp)  # from here on the old shard is not reusable, even if this write is interrupted
    if isinstance(rows, OrderedRows):
        h = xxhash.xxh3_128()
        info = writer.write_slices(rows.hashed_slices(slice_rows, h), rows.schema, shard, out, spec)
        fingerprint = rows.slices_fingerprint(h)
    else:
        fingerprint = fingerprint or table_fingerprint(rows)
        info = writer.write(rows, shard, out, spec)
    info["shard"] = shard
    info["fingerprint"] = fingerprint
    info["reuse_key"] = reuse_key  # covers FORMAT_VERSION too
    info["format_version"] = FORMAT_VERSION
    info["sha256"] = {f: sha256_file(f"{out}/{f}") for f in info["files"]}
    info["bytes"] = _sizes(out, info["files"])
    write_json_atomic(sidecar, info)
    info["reused"] = False
    return info


def _sizes(out: str, files: list[str]) -> dict[str, int]:
    """File name -> size in bytes (the manifest records them; readers check them on every open)."""
    fs, _ = filesystem(out)
    return {f: int(fs.size(filesystem(f"{out}/{f}")[1])) for f in files}


def _prune_sidecars(out: str, shards: set[int]) -> None:
    """Remove `_shards/shard-N.json` of shards the committed manifest does not have (a rerun with fewer
    shards left them: found in review), as `prune_data` removes their data files."""
    fs, root = filesystem(f"{out}/_shards")
    try:
        names = fs.ls(root, detail=False) if fs.exists(root) else []
    except FileNotFoundError:
        return
    for f in names:
        name = f.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith("shard-") and name.endswith(".json") and name[6:-5].isdigit() \
                and int(name[6:-5]) not in shards:
            fs.rm(f)


def commit(spec: SinkSpec, shards: list[dict[str, Any]], manifest: dict[str, Any],
           metrics: dict[str, int] | None = None) -> dict[str, Any]:
    """Drop data files the manifest does not list, write the dataset card, manifest.json (atomically,
    after every data file), then `_SUCCESS`. Returns the manifest. A writer with its own
    `commit` (see `ShardWriter`) does its own, with the run's summed stage `metrics`."""
    out = spec.path.rstrip("/")
    from datakit.io.publish import check_still_held

    check_still_held(out)  # a run paused past its lease commits nothing over another run's (publish.py)
    shards = sorted(shards, key=lambda s: s["shard"])
    writer = writer_for(spec.format)
    if hasattr(writer, "commit"):
        return writer.commit(spec, shards, manifest, dict(metrics or {}))
    dataset_files = getattr(writer, "dataset_files", None)
    extra_files = dataset_files(spec, shards, out) if dataset_files is not None else []
    body = {
        "format": spec.format,
        "format_version": FORMAT_VERSION,
        "shards": [{k: v for k, v in s.items() if k not in ("reused", "fingerprint", "format_version", "reuse_key")}
                   for s in shards],
        "rows": int(sum(s["rows"] for s in shards)),
        **manifest,
        **writer.manifest_extra(spec, shards),
    }
    if extra_files:
        body["dataset_files"] = {"files": extra_files, "sha256": {f: sha256_file(f"{out}/{f}") for f in extra_files},
                                 "bytes": _sizes(out, extra_files)}
    if (body.get("tokenizer") or {}).get("file") != TOKENIZER_FILE:
        remove_root_file(out, TOKENIZER_FILE)  # an earlier run's, beside ids it did not make (found in review)
    # data/ holds only the new manifest's files before the manifest says so: the old manifest was retracted
    # before the run rewrote anything (publish.retract), so no reader needs the old files any more (found in
    # review: the store failed right after a manifest of 1 shard was written, and data/ kept 3 shards, 1,555
    # rows more than the manifest, for every reader of OUT/data)
    prune_data(out, manifest_files(body))
    _prune_sidecars(out, {int(s["shard"]) for s in shards})
    write_card(out, body)
    write_json_atomic(f"{out}/manifest.json", body)
    fs, p = filesystem(f"{out}/_SUCCESS")
    with fs.open(p, "wb") as f:
        f.write(b"")
    return body


def output_checksums(path: str) -> dict[str, str]:
    """file name -> sha256 of a committed dataset's data files (what conformance compares)."""
    m = read_json_object(f"{path.rstrip('/')}/manifest.json")
    if m is None:
        raise FileNotFoundError(f"{path.rstrip('/')}: no manifest.json (not a committed datakit output)")
    return manifest_checksums(m)


def manifest_checksums(m: dict[str, Any]) -> dict[str, str]:
    """file name -> sha256 of the data files a manifest lists (as recorded: nothing is read)."""
    return {f: s["sha256"][f] for s in m["shards"] + [m.get("dataset_files") or {"files": []}] for f in s["files"]}
