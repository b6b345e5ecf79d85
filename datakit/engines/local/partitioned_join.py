"""A join or aggregate too large for one process, as many small ones: the input(s) hash-partitioned by
the key into buckets (pool tasks, the sink's shuffle), then each bucket joined or grouped by a pool task.

Why: polars holds a join's right side in memory, in the driver (about ten times its spilled
size). Dedup's verification joins every candidate pair with the texts of both ends' records; on
the synthetic corpus at 10^6 events that was 0.4 M documents' texts and a driver peak of 3.6 GB
(docs/scaling.md), growing with the data. Split, a task holds one bucket of the right side. It
costs time (both sides go through the disk once more), so only a join over the memory budget is
split (`buckets_for`).

Rows with equal keys meet in one bucket because both sides go through the same
`sinks.group_hashes` of their key columns, hashed together (equal key tuples hash alike, an int32
key like an int64 one; dedup's LSH buckets are keyed by band number first, which has only as many
values as there are bands, so no single column would spread them). In a join a row with a null
key matches nothing (SQL), so it is spread by position (a left join still keeps it); in an
aggregate a null key is a group of its own, as in the single group-by, so those rows meet too.

Aggregates are split for the same reason: the LSH bucket aggregate grouped 8.8 M band rows in the
driver at 10^6 quickstart events, 2.1-2.2 GB, the driver's peak once the verification joins were
split (docs/scaling.md); polars held ~23x the input's spilled bytes there (10^5 events: 12.8 MB
of band rows spilled; the process grew by 293 MB over its resident size before the group-by, VmHWM
after /proc/self/clear_refs). The join of those bands back to their buckets' smallest ids has
integer keys (band, bucket), which the first version of this module (string keys only) left whole.
Each bucket's rows keep their partitions' order, and buckets are read in order, so the spill has
the same bytes on every run of the same input with the same bucket count (budget and workers;
resume fingerprints read them), though not the row order of the single-process join. The
shuffle is never resumed (a rerun may pick another bucket count): it runs again. No output depends on that: the sink
sorts every shard, and tests hold the dataset's bytes equal either way.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

from datakit import watchdog
from datakit.engines.local.spill import SPILL_COMPRESSION, SPILL_ROW_GROUP, read_spill
from datakit.io.atomic import sha256_file
from datakit.plan import Aggregate, Join, Source

# What polars held per byte of a join's right-side spill (zstd Parquet), measured: dedup's first
# verification join at 10^6 quickstart events, ~360 MB of record texts spilled, peaked at 3.6 GB
MEMORY_PER_SPILL_BYTE = 10
# The share of the machine's memory one single-process join may take before it is split
MEMORY_SHARE = 0.25
# What polars held per byte of an aggregate's input spill, measured (see module doc) on the quickstart's
# group-bys at 10^5 events: 1-35x, the large ones 23x (LSH buckets, 12.8 MB spilled, +293 MB) and 35x
# (ingest's event ids, 2.6 MB, +92 MB); the joins measured the same way took 4-12x their right side's
# spill, which MEMORY_PER_SPILL_BYTE covers
AGGREGATE_MEMORY_PER_SPILL_BYTE = 20
# What one bucket may take (estimated as above): a worker holds one bucket at a time
BUCKET_MEMORY = 256 << 20
MEMORY_ENV = "DATAKIT_JOIN_MEMORY_MB"


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit when lower (a container)."""
    import os

    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(f) as fh:
                value = fh.read().strip()
        except OSError:
            continue
        if value.isdigit() and 0 < int(value) < (total or 1 << 62):
            total = int(value)
    return total or 16 << 30


def join_memory_budget() -> int:
    """Bytes a join or group-by may hold in one process: DATAKIT_JOIN_MEMORY_MB (the name is older than
    the group-by split), else a quarter of `machine_memory()`."""
    import os

    raw = os.environ.get(MEMORY_ENV, "").strip()
    if raw:
        try:
            return int(float(raw) * (1 << 20))
        except ValueError:
            raise ValueError(f"{MEMORY_ENV}={raw!r}: expected a number of megabytes") from None
    return int(machine_memory() * MEMORY_SHARE)


# At most this many buckets: each shuffle task keeps one file open per bucket (the default limit is 1024)
MAX_BUCKETS = 256


def buckets_for(right_bytes: int, workers: int, left_bytes: int = 0) -> int:
    """How many buckets a join whose right side spilled `right_bytes` is split into; 0: run it as one join.

    Why by memory and not always: splitting shuffles both sides through the disk once more and
    writes the output in pieces. At 10^6 quickstart events, with every large join split, the run
    took 247 s instead of 190 s; one process joining is faster whenever it fits. So a join is
    split only when its estimated memory would pass the budget (`join_memory_budget`). The count
    covers both sides (`left_bytes`): polars streams the left side of one join, but a bucket task
    holds its share of both."""
    need = right_bytes * MEMORY_PER_SPILL_BYTE
    if need <= join_memory_budget():
        return 0
    both = (right_bytes + left_bytes) * MEMORY_PER_SPILL_BYTE
    return min(MAX_BUCKETS, max(2 * workers, -(-both // BUCKET_MEMORY)))


def aggregate_buckets_for(input_bytes: int, workers: int) -> int:
    """How many buckets an aggregate whose input spilled `input_bytes` is split into; 0: one group-by
    (the rule of `buckets_for`, with the aggregate's own memory per spilled byte)."""
    need = input_bytes * AGGREGATE_MEMORY_PER_SPILL_BYTE
    if need <= join_memory_budget():
        return 0
    return min(MAX_BUCKETS, max(2 * workers, -(-need // BUCKET_MEMORY)))


def stub_join(node: Join, left: pa.Schema, right: pa.Schema) -> Join:
    """`node` over two placeholder inputs with these schemas: what a task needs of the plan (pickling
    the node itself would ship every node upstream of it)."""
    return dataclasses.replace(node, left=Source(node.stage, left), right=Source(node.stage, right))


def stub_aggregate(node: Aggregate, schema: pa.Schema) -> Aggregate:
    """`node` over a placeholder input with this schema (see `stub_join`)."""
    return dataclasses.replace(node, input=Source(node.stage, schema))


def _read_bucket(files: list[str], schema: pa.Schema) -> pa.Table:
    tables = []
    for f in files:
        tables.append(read_spill(f))
        watchdog.beat()
    return (pa.concat_tables(tables) if tables else schema.empty_table()).select(schema.names)


def aggregate_bucket(args: tuple[Aggregate, list[str], str, list[str] | None]) -> dict[str, Any]:
    """Pool task: group one bucket's rows with the single-process query, write one part."""
    import polars as pl
    import pyarrow.parquet as pq

    from datakit.engines.local.barriers import barrier_query

    node, files, out, columns = args
    rows = _read_bucket(files, node.input.schema)
    frame = pl.from_arrow(rows).lazy()
    barrier_query(node, lambda n: frame, columns=columns).sink_parquet(
        out, row_group_size=SPILL_ROW_GROUP, **SPILL_COMPRESSION)
    watchdog.beat()
    return {"file": out, "rows": pq.ParquetFile(out).metadata.num_rows, "digest": sha256_file(out),
            "base_rows": rows.num_rows}


def join_bucket(args: tuple[Join, list[str], list[str], str, list[str] | None]) -> dict[str, Any]:
    """Pool task: join one bucket's left and right spill files with the single-process query, write one part."""
    import polars as pl

    from datakit.engines.local.barriers import barrier_query

    node, left_files, right_files, out, columns = args
    left = _read_bucket(left_files, node.left.schema)
    frames = {id(node.left): pl.from_arrow(left).lazy(),
              id(node.right): pl.from_arrow(_read_bucket(right_files, node.right.schema)).lazy()}
    query = barrier_query(node, lambda n: frames[id(n)], right_larger=True, columns=columns)
    query.sink_parquet(out, row_group_size=SPILL_ROW_GROUP, **SPILL_COMPRESSION)
    watchdog.beat()
    import pyarrow.parquet as pq

    return {"file": out, "rows": pq.ParquetFile(out).metadata.num_rows, "digest": sha256_file(out),
            "base_rows": left.num_rows}
