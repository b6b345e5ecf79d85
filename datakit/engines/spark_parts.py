"""The Spark sink's direct path: the root chain writes its rows as per-shard Arrow part files, and one
task per shard turns its parts into the shard (`write_shard_parts`), without the rows ever entering the JVM.

Why: the root chain (usually tokenize) is the last Python pass over the whole dataset. On the
general path its rows go from the Python worker into the JVM (Arrow -> rows), are cached, shuffled
by shard and converted back to Arrow for the Python task that writes each shard. At 100k
quickstart events that round trip cost ~6 s of wall and ~6 JVM CPU-s (docs/spark.md) to move bytes
that both ends hold as Arrow. When the shard count is known before the rows are (an explicit
`shards:`), each task can instead route its rows to their shards itself:

* A root-chain task appends each kept batch's rows to `<parts>/shard-<k>/part-<partition>-<attempt>.arrows`
  (one Arrow IPC stream per shard it has rows for) and, once they are closed, emits one PART row per
  file beside its stats rows (spark.py `_ChainFn`). `<attempt>` is Spark's task attempt id, unique in the
  application, so a retried or speculative attempt never writes into another attempt's file.
* The driver takes the file list from the one successful job that materializes the chain (the
  same job that returns its stats), so it holds exactly one attempt per partition: files of failed,
  killed or losing speculative attempts are never listed, never read, and go with the folder.
* `WriteShardParts`: one task per shard reads its parts and calls `write_shard_parts`, which sorts the
  rows; the order of parts (and of partitions) cannot change a byte.

The general path stays for an automatic shard count (it depends on the row count, known only after
the chain), for more than `MAX_PART_SHARDS` shards, and for a root that is a join or aggregate (no
Python pass to route its rows).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from datakit.engines.core import conform
from datakit.io import sinks
from datakit.io.fs import filesystem
from datakit.io.sinks import SinkSpec
from datakit.io.take import take_rows

__all__ = ["MAX_PART_SHARDS", "PartsTarget", "ShardPartWriter", "WriteShardParts", "parts_by_shard", "read_part_tables"]

# Above this many shards the general path is used: a task holds one open file per shard it has rows
# for (file descriptors), and the folder holds up to partitions x shards files (object-store requests).
MAX_PART_SHARDS = 256


@dataclass(frozen=True)
class PartsTarget:
    """Where and how a root chain routes its rows: the parts folder and the sink's shard rule."""

    folder: str  # <output>/_work/spark-parts-<run token>
    key: str
    shards: int
    partition: str  # "hash" | "value" (sinks.shard_ids)

    @property
    def local(self) -> bool:
        return "://" not in self.folder or self.folder.startswith("file://")


class ShardPartWriter:
    """One task's part files, one Arrow IPC stream per shard it has rows for (opened on first use).

    Local disk: written in place, uncompressed (the reader is one task on the same disk). Object
    store: written to a local staging folder with zstd buffers (a quarter of the bytes to PUT) and
    uploaded when the task closes its files. Why staged: an open object-store file buffers a block
    in memory (s3fs: 50 MB) until it uploads it, per shard, in a Python worker that also runs the
    chain. The object appears only when its upload completes, and is listed only after that."""

    def __init__(self, target: PartsTarget, schema: pa.Schema, partition_id: int, attempt_id: int) -> None:
        self.target, self.schema = target, schema
        self.name = f"part-{partition_id:05d}-{attempt_id}.arrows"
        self._open: dict[int, tuple[object, pa.ipc.RecordBatchStreamWriter, str]] = {}
        self._staging = None if target.local else tempfile.mkdtemp(prefix="datakit-parts-")
        self.rows: dict[int, int] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        """Route `batch`'s rows to their shards (the local engine's `shard_ids`, so the same rows land in
        the same shard on every engine)."""
        batch = conform(batch, self.schema)
        key = batch.column(self.target.key)
        ids = sinks.shard_ids(key if self.target.partition == "value" else key.cast(pa.string()),
                              self.target.shards, self.target.partition)
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        cuts = np.flatnonzero(np.diff(sorted_ids)) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(ids)]):
            shard = int(sorted_ids[lo])
            whole = lo == 0 and hi == len(ids)  # one shard (always so for `shards: 1`): no take
            self._writer(shard).write_batch(batch if whole else take_rows(batch, order[lo:hi]))
            self.rows[shard] = self.rows.get(shard, 0) + int(hi - lo)

    def _writer(self, shard: int) -> pa.ipc.RecordBatchStreamWriter:
        got = self._open.get(shard)
        if got is None:
            url = f"{self.target.folder.rstrip('/')}/shard-{shard:05d}/{self.name}"
            path = self._local_path(shard, url)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            sink = pa.OSFile(path, "wb")
            options = None if self.target.local else pa.ipc.IpcWriteOptions(compression="zstd")
            got = self._open[shard] = (sink, pa.ipc.new_stream(sink, self.schema, options=options), url)
        return got[1]

    def _local_path(self, shard: int, url: str) -> str:
        """Where this task writes shard `shard`'s part: in place, or in the staging folder."""
        if self._staging is None:
            return url.removeprefix("file://")
        return os.path.join(self._staging, f"shard-{shard:05d}", self.name)

    def close(self) -> list[tuple[int, str, int]]:
        """Finish every file; (shard, url, rows) of each, to be listed by the driver."""
        out = []
        for shard, (sink, writer, url) in sorted(self._open.items()):
            writer.close()
            sink.close()
            if self._staging is not None:
                fs, path = filesystem(url)
                fs.put_file(self._local_path(shard, url), path)
            out.append((shard, url, self.rows[shard]))
        self._open.clear()
        self._drop_staging()
        return out

    def _drop_staging(self) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None

    def abandon(self) -> None:
        """A failing task: close and delete what it wrote (best effort: a killed task cannot, and its
        unlisted files are removed with the folder)."""
        for shard, (sink, writer, url) in self._open.items():
            try:
                writer.close()
                sink.close()
                if self._staging is None:
                    os.remove(self._local_path(shard, url))
            except Exception:
                pass
        self._open.clear()
        self._drop_staging()


def parts_by_shard(files: list[tuple[int, str, int]]) -> dict[int, list[str]]:
    """The listed (shard, url, rows) as shard -> urls, in a fixed order (sorted; not needed for the
    bytes, which `write_shard_parts`'s sort fixes, but it makes a run's reads repeatable)."""
    out: dict[int, list[str]] = {}
    for shard, url, _ in sorted(files):
        out.setdefault(shard, []).append(url)
    return out


def read_part_tables(urls: list[str]) -> list[pa.Table]:
    """The rows of each of a shard's part files."""
    tables = []
    for url in urls:
        local = "://" not in url or url.startswith("file://")
        fs, path = (None, url.removeprefix("file://")) if local else filesystem(url)
        with (pa.OSFile(path, "rb") if local else fs.open(path, "rb")) as f:
            tables.append(pa.ipc.open_stream(f).read_all())
    return tables


class WriteShardParts:
    """mapInArrow over (`shard`, `parts` as a JSON list): read each shard's parts, `write_shard_parts` them,
    return its info row (the same row `_WriteShards` returns on the general path)."""

    def __init__(self, spec: SinkSpec, schema: pa.Schema) -> None:
        self.spec, self.schema = spec, schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for shard, parts in zip(b.column("shard").to_pylist(), b.column("parts").to_pylist()):
                # handed over: the parts are let go of once the shard is sorted (`write_shard_parts`)
                info = sinks.write_shard_parts(read_part_tables(json.loads(parts)), int(shard), self.spec, self.schema)
                yield pa.record_batch({"shard": pa.array([int(shard)], pa.int64()),
                                       "info": pa.array([json.dumps(info, sort_keys=True)], pa.string())})
