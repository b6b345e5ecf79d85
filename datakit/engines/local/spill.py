"""Spill files: where a partition's rows live between nodes (Parquet parts, Arrow IPC shard streams).

Why two formats: chain outputs are Parquet (compressed, sliceable by row group, so
the next chain can run in parallel over one big file); a sink shuffle holds one
writer per shard open at once, and an Arrow IPC writer keeps no page buffers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from datakit.engines.core import conform
from datakit.io.atomic import sha256_file
from datakit.io.identity import check_unchanged
from datakit.io.readers import iter_source, parquet_batch_rows

# Rows per row group of a barrier's spill file. The next chain's tasks are slices of these row
# groups (`LocalEngine._spill_polars`), so a group must be small enough that a barrier output of a
# few thousand rows still splits into one task per worker: with 50,000 the deduplicated records of
# a 10^4- or 10^5-event quickstart run were one row group, hence one task, which ran in the driver
# (a single task runs in-process) and tokenized everything there in one batch: the driver peaked at
# 1.5 GB while the pool idled. 2,048 rows of records (~3 KB each) are ~6 MB per group.
SPILL_ROW_GROUP = 2_048

# Codec and level of a barrier's spill file (polars' `sink_parquet`). zstd level 1, not polars'
# default level 3: a spill is written once and read once, on local disk, so the level buys little
# disk and costs CPU. perf of a 10^5-event quickstart run: zstd took 6.9 of 65.9 CPU-s (10.4%, the
# input's decompression and the output's level-3 compression included), of which polars' spill
# writer (ZSTD_compressBlock_doubleFast, level 3) was most; level 1 took the codec total to 5.1 s and
# polars' threads 8.5 -> 6.3 CPU-s. lz4 (what Spark spills shuffles with) saved ~0.7 s more but
# makes larger files, and the driver's peak of that run was 827 MB against ~700. Chain spills
# (`pq.ParquetWriter(compression="zstd")`) already use Arrow's zstd default, level 1.
SPILL_COMPRESSION = {"compression": "zstd", "compression_level": 1}


@dataclass(frozen=True)
class Partition:
    """One unit of parallel work: an input file (Source) or a spilled Parquet part."""

    kind: str  # "jsonl" | "parquet" (input file) | "spill" (our own Parquet part)
    url: str
    schema: pa.Schema | None = None
    row_groups: tuple[int, int] | None = None  # a slice of a spilled file's row groups
    digest: str | None = None  # a spill's sha256, computed once by its writer; an input file's listed size|mtime
    columns: tuple[str, ...] | None = None  # a spill read for a function that reads only these (MapBatches.reads)

    def fingerprint(self) -> str:
        """A spill's digest and slice; an input file's path, size and mtime, checked against the
        listing the run started from (`digest` of an input partition: `identity.stamp` then;
        `identity.check_unchanged` says why)."""
        if self.kind == "spill":
            return f"{self.digest or sha256_file(self.url)}|{self.row_groups}|{self.columns}"
        now = check_unchanged(self.url, self.digest)
        return f"{self.url}|{now}"

    def batches(self) -> Iterator[pa.RecordBatch]:
        if self.kind in ("jsonl", "parquet"):
            for b in iter_source(self.url, self.kind, self.schema):
                yield conform(b, self.schema) if self.schema is not None else b
            # and after the read: a file still being written was read past its listed size (found in
            # review: 1,000 lines appended meanwhile were ingested under a manifest naming the old size,
            # and an event cut mid-write was quarantined as bad JSON), exit 0; now one line, exit 2
            check_unchanged(self.url, self.digest)
        else:
            pf = pq.ParquetFile(self.url)
            groups = range(*self.row_groups) if self.row_groups else None
            if groups is not None and len(groups) == 0:
                return
            cols = list(self.columns) if self.columns is not None else None
            for b in pf.iter_batches(batch_size=min(8192, parquet_batch_rows(pf)), row_groups=groups, columns=cols):
                yield conform(b, self.schema) if self.schema is not None else b


class IpcSpill:
    """An Arrow IPC stream file that closes its file handle too.

    `compress`: zstd-compressed buffers, for spills that are also uploaded (an object-store
    output's durable work folder, io/tempwork.py): about a quarter of the bytes to PUT, for CPU
    that a local-disk spill does not need to spend."""

    def __init__(self, path: str, schema: pa.Schema, compress: bool = False) -> None:
        self._file = pa.OSFile(path, "wb")
        options = pa.ipc.IpcWriteOptions(compression="zstd") if compress else None
        self._writer = pa.ipc.new_stream(self._file, schema, options=options)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)

    def close(self) -> None:
        self._writer.close()
        self._file.close()


def read_spill(path: str) -> pa.Table:
    """A spill file's rows. An uncompressed Arrow IPC stream is memory-mapped, not read: its columns
    are the file's pages (the page cache's, which the kernel may drop and read again), not a copy
    on the heap; the sink's shard write gathers each row group from them (`sinks.OrderedRows`). The
    file is closed as soon as it is read, not when the garbage collector gets to it (the mapping lives
    as long as the columns): a shard's task maps one part per upstream task, and a descriptor held
    for each would meet the process's limit on a big run."""
    if path.endswith(".arrows"):
        with pa.memory_map(path) as source:
            return pa.ipc.open_stream(source).read_all()
    return pq.read_table(path)
