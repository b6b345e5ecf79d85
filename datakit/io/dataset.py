"""Read a committed datakit output folder (Parquet records) through its manifest.

Why through the manifest: a folder may hold a half-finished rerun's temp files or
side outputs (`_quarantine/`, `_dropped/`); the manifest names exactly the shards
that belong to the committed dataset, in shard order.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from datakit.io.atomic import read_json
from datakit.io.fs import InputError, arrow_filesystem, filesystem


def read_manifest(path: str) -> dict:
    m = read_json(f"{str(path).rstrip('/')}/manifest.json")
    if m is None:
        raise InputError(f"no committed dataset at {path} (manifest.json missing: unfinished or not a datakit output)")
    return m


def read_output(path: str, columns: list[str] | None = None, verify: bool = False,
                snapshot: str | None = None) -> pa.Table:
    """All rows of a committed Parquet output, shard by shard (each shard sorted by its key).

    An append-mode dataset (schemas/output_layout.md) reads as the union of its snapshots in
    snapshot order; `snapshot=ID` reads that one snapshot only.

    Every listed file is checked against the manifest's size first (a dataset that fails is refused,
    never read as a mix); `verify=True` compares full sha256 checksums too."""
    from datakit.io.verify import verify_dataset

    path = str(path)
    m = read_manifest(path)
    if snapshot is not None:
        from datakit.io.snapshots import LAYOUT, select

        if m.get("layout") != LAYOUT:
            raise InputError(f"{path} is not an append-mode dataset; it has no snapshots")
        m = select(m, snapshot)
    if m.get("format") != "parquet":
        raise InputError(f"{path} is a {m.get('format')!r} dataset; use datakit.loader for packed data")
    verify_dataset(path, m, checksums=verify)
    tables = []
    for shard in m["shards"]:
        for f in shard["files"]:
            fs, p = filesystem(f"{path.rstrip('/')}/{f}")
            tables.append(pq.read_table(p, filesystem=arrow_filesystem(fs), columns=columns))
    return pa.concat_tables(tables) if tables else pa.table({})
