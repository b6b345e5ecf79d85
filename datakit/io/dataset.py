"""Read a committed datakit output folder (Parquet records) through its manifest.

Why through the manifest: a folder may hold a half-finished rerun's temp files or
side outputs (`_quarantine/`, `_dropped/`); the manifest names exactly the shards
that belong to the committed dataset, in shard order.
"""
from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from datakit.io.atomic import read_json_object
from datakit.io.fs import InputError, arrow_filesystem, filesystem


def read_manifest(path: str) -> dict:
    m = read_json_object(f"{str(path).rstrip('/')}/manifest.json")
    if m is None:
        raise InputError(f"no committed dataset at {path} (manifest.json missing: unfinished or not a datakit output)")
    return m


def read_output(path: str, columns: Sequence[str] | str | None = None, verify: bool = False,
                snapshot: str | None = None) -> pa.Table:
    """All rows of a committed Parquet output, shard by shard (each shard sorted by its key).

    `columns`: the columns to read (a list or tuple of names, or one name: found in review, `columns="doc_id"`
    was read as the names 'd', 'o', 'c', ...); `[]` reads no column but keeps the row count.

    An append-mode dataset (schemas/output_layout.md) reads as the union of its snapshots in
    snapshot order; `snapshot=ID` reads that one snapshot only.

    Every listed file is checked against the manifest's size first (a dataset that fails is refused,
    never read as a mix); `verify=True` compares full sha256 checksums too."""
    columns = _column_list(columns)
    from datakit.io import storage

    try:
        return _read_output(str(path), columns, verify, snapshot)
    except Exception as e:  # the store's own errors as one StorageError, a DatakitError (found in review: a
        if storage.is_storage_error(e) and "://" in str(path):  # raw botocore error with the endpoint down)
            raise storage.describe(e, str(path), "read") from None
        raise


def _column_list(columns) -> list[str] | None:
    """`columns` as the list pyarrow takes. Found in a Python API review: a tuple raised pyarrow's ValueError
    ("Expected a list or a dict"), `columns=123` a raw TypeError from deep inside; now a name, a list or tuple
    of names, or None, and anything else one InputError naming the argument."""
    if columns is None:
        return None
    if isinstance(columns, str):
        return [columns]
    if isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns):
        return list(columns)
    if isinstance(columns, (list, tuple)):
        bad = next(c for c in columns if not isinstance(c, str))
        raise InputError(f"read_output: columns must be column names (strings); got {bad!r} "
                         f"({type(bad).__name__}) among them")
    raise InputError(f"read_output: columns must be a column name or a list or tuple of names, "
                     f"not {type(columns).__name__}")


def _read_output(path: str, columns: list[str] | None, verify: bool, snapshot: str | None) -> pa.Table:
    from datakit.io.verify import verify_dataset

    m = read_manifest(path)
    if snapshot is not None:
        from datakit.io.snapshots import LAYOUT, select

        if m.get("layout") != LAYOUT:
            raise InputError(f"{path} is not an append-mode dataset; it has no snapshots")
        m = select(m, snapshot)
    if m.get("format") != "parquet":
        # found in review: "use datakit.loader" for an MDS dataset, which PackedDataset refuses too
        reader = {"packed": "datakit.loader.PackedDataset", "mds": "streaming.StreamingDataset (MosaicML)",
                  "megatron": "Megatron-LM's indexed dataset"}.get(str(m.get("format")), "its own format's reader")
        raise InputError(f"{path} is a {m.get('format')!r} dataset of token ids, not records: read it with {reader} "
                         "(schemas/output_layout.md)")
    verify_dataset(path, m, checksums=verify)
    tables = []
    for shard in m["shards"]:
        for f in shard["files"]:
            fs, p = filesystem(f"{path.rstrip('/')}/{f}")
            if columns is not None and not tables:  # a column the records lack: one line, not Arrow's dump
                names = pq.read_schema(p, filesystem=arrow_filesystem(fs)).names
                missing = [c for c in columns if c not in names]
                if missing:
                    raise InputError(f"{path} has no column {', '.join(map(repr, missing))} (columns: "
                                     f"{', '.join(names)})")
            tables.append(pq.read_table(p, filesystem=arrow_filesystem(fs), columns=columns))
    if columns == []:  # found in a Python API review: concat_tables of zero-column tables drops the row count
        return pa.table({"_": pa.nulls(sum(t.num_rows for t in tables))}).select([])
    return pa.concat_tables(tables) if tables else pa.table({})
