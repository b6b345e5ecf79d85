"""Inspect what dedup removed: clusters from a run's drop log.

Why from the drop log: every removed record is logged with the `doc_id` it was
removed in favour of (`_drop_detail`), so a cluster is "kept doc + the docs
naming it" — no need to keep the LSH graph around after the run.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from datakit.io.fs import arrow_filesystem, filesystem


def clusters(output_path: str, reason: str = "near_duplicate", stage: str | None = None) -> pa.Table:
    """(kept, size) per cluster, largest first (ties by kept id); size counts the kept doc."""
    import pyarrow.parquet as pq

    url = f"{str(output_path).rstrip('/')}/_dropped"
    fs, p = filesystem(url)
    if not fs.exists(p):
        return pa.table({"kept": pa.array([], pa.string()), "size": pa.array([], pa.int64())})
    log = pq.read_table(p, filesystem=arrow_filesystem(fs))
    mask = pc.equal(log.column("reason"), reason)
    if stage is not None:
        mask = pc.and_(mask, pc.equal(log.column("stage"), stage))
    log = log.filter(mask)
    counts = log.group_by("detail").aggregate([("key", "count")])
    table = pa.table({"kept": counts.column("detail"), "size": pc.add(counts.column("key_count"), 1)})
    return table.sort_by([("size", "descending"), ("kept", "ascending")])
