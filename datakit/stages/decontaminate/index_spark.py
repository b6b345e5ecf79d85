"""Build the n-gram index with Spark: hashing and sorting on the executors, only concatenation on the driver.

Why: after a TB-scale Spark job, building the index single-process on the
driver would take longer than the job. The work splits as in the local build
(`index.py`), and the bytes are the same (the index is a sorted set, and the
counts in index.json are sums):

1. map (job 1, stage 1): the input's files / Parquet row groups are
   parallelized; each task reads its units with the check's readers, hashes
   every text, and emits `(partition, hashes chunk)` pairs keyed by the top
   `part_bits` bits, plus one stats record (documents, texts, bytes, n-grams)
   that travels as data, so a retried task is counted once.
2. reduce (job 1, stage 2): `partitionBy` puts each partition on one task,
   which spills its chunks to local disk, sorts and deduplicates (splitting a
   big partition again, as locally) and writes the sorted distinct hashes to a
   work folder beside the index.
3. fingerprints (job 2): with the global n-gram count now known (it sets
   `bucket_bits`), each partition's hashes become fingerprints + bucket counts.
4. the driver concatenates the per-partition files in order (`finish_index`).

The work folder (`.tmp-index-spark-*` beside `out_path`) must be visible to the
executors and the driver: a local path with local[*] / one machine, a shared
filesystem or an object-store URL on a cluster. It is removed at the end.
"""
from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from datakit.io.fs import InputError, filesystem
from datakit.stages.decontaminate.index import (FP_BITS, MAX_PARTITION_BYTES, Fingerprinter, HashSpec, IndexBuildError,
                                           IndexInfo, Unit, _bucket_bits, _local_target, _one_line, finish_index,
                                           hash_partitions, new_stats, plan_units, read_u64_chunks,
                                           sorted_unique_chunks, sum_stats, unit_batches)
from datakit.stages.decontaminate.normalize import DEFAULT_NORMALIZATIONS, flags_of

log = logging.getLogger("datakit.decontam.index")

_EMIT_BYTES = 4 << 20  # a map task buffers up to this much per partition before emitting a record
_HOLD_BYTES = 64 << 20  # ... and up to this much in all
_STATS = -1  # key of the stats record (routed to partition 0)


def build_index_spark(spark, dataset_path: str | Sequence[str], out_path: str, ngram: int = 13,
                      normalization: Sequence[str] = DEFAULT_NORMALIZATIONS,
                      text_fields: Sequence[str] | None = None, batch_rows: int = 8192,
                      fingerprint_bits: int = FP_BITS, part_bits: int | None = None,
                      max_partition_bytes: int = MAX_PARTITION_BYTES,
                      work_dir: str | None = None) -> IndexInfo:
    """Index a records dataset (Parquet/JSONL; not a packed one) with `spark`; same bytes as `build_index`.

    `part_bits`: 2^part_bits reduce partitions (default: >= 2x the default
    parallelism, at least 16). `work_dir`: the shared work folder's parent
    (default: beside `out_path`)."""
    from datakit.engines.spark_session import translate_errors

    if fingerprint_bits not in (16, 32):
        raise ValueError("fingerprint_bits must be 16 or 32")
    sc = spark.sparkContext
    if part_bits is None:
        part_bits = min(12, max(4, math.ceil(math.log2(max(2 * sc.defaultParallelism, 1)))))
    if not 1 <= part_bits <= 12:
        raise ValueError("part_bits must be 1..12")
    spec = HashSpec(int(ngram), flags_of(normalization), tuple(text_fields) if text_fields else None, batch_rows,
                    int(part_bits))
    units = plan_units(dataset_path, 4 * sc.defaultParallelism)
    work = f"{(work_dir or _parent(out_path)).rstrip('/')}/.tmp-index-spark-{uuid.uuid4().hex[:12]}"
    wfs, wpath = filesystem(work)
    wfs.makedirs(wpath, exist_ok=True)
    local_out = _local_target(out_path)
    stage_dir: Path | None = None
    try:
        t0 = time.perf_counter()
        n_parts = 1 << spec.part_bits
        with translate_errors("building the n-gram index (map, sort)"):
            pairs = sc.parallelize(units, max(1, len(units))).mapPartitions(_MapFn(spec))
            shuffled = pairs.partitionBy(n_parts, _route)
            job1 = shuffled.mapPartitionsWithIndex(_SortFn(spec.part_bits, max_partition_bytes, work)).collect()
        stats = sum_stats([r["stats"] for r in job1 if r["stats"]])
        b = _bucket_bits(stats["hashes"])
        log.info("n-gram index (spark) map+sort: %d units, %d partitions: %d documents, %d n-grams hashed, "
                 "%d distinct (%.1f s)", len(units), n_parts, stats["documents"], stats["hashes"],
                 sum(r["unique"] for r in job1), time.perf_counter() - t0)
        t1 = time.perf_counter()
        todo = [(r["part"], r["path"]) for r in sorted(job1, key=lambda r: r["part"])]
        with translate_errors("building the n-gram index (fingerprints)"):
            parts = (sc.parallelize(todo, max(1, len(todo)))
                     .map(_FingerprintFn(spec.part_bits, b, fingerprint_bits, work)).collect())
        log.info("n-gram index (spark) fingerprints: %d entries (%.1f s)", sum(r["entries"] for r in parts),
                 time.perf_counter() - t1)
        stage_dir = Path(tempfile.mkdtemp(prefix=".tmp-index-", dir=str(local_out.parent) if local_out else None))
        info = finish_index(stage_dir, out_path, local_out, spec, parts, b, fingerprint_bits, stats,
                            lambda p: filesystem(p)[0].open(filesystem(p)[1], "rb"))
        stage_dir = None
        log.info("n-gram index (spark) written: %d n-grams (%.1f s in all)", info.ngrams, time.perf_counter() - t0)
        return info
    finally:
        if stage_dir is not None:
            shutil.rmtree(stage_dir, ignore_errors=True)
        try:
            wfs.rm(wpath, recursive=True)
        except (OSError, FileNotFoundError):
            pass


def _parent(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0] if "/" in path.rstrip("/") else "."


def _route(key: int) -> int:
    """partitionBy's function: the key is the partition (stats go to partition 0)."""
    return max(int(key), 0)


class _MapFn:
    """Executor side of the map: units -> (partition, raw uint64 bytes) records + one stats record."""

    def __init__(self, spec: HashSpec) -> None:
        self.spec = spec

    def __call__(self, units: Iterator[Unit]) -> Iterator[tuple[int, Any]]:
        stats = new_stats()
        buf: dict[int, list[np.ndarray]] = {}
        size: dict[int, int] = {}
        reading = [""]

        def batches() -> Iterator:
            for u in units:
                reading[0] = u.url
                yield from unit_batches(u, self.spec)

        try:
            held = 0
            for p, h in hash_partitions(batches(), self.spec, stats):
                buf.setdefault(p, []).append(h)
                size[p] = size.get(p, 0) + h.nbytes
                held += h.nbytes
                if size[p] >= _EMIT_BYTES:
                    held -= size[p]
                    yield p, np.concatenate(buf.pop(p)).tobytes()
                    size[p] = 0
                elif held >= _HOLD_BYTES:  # many partitions: bound the task's buffer, not just each one
                    for q in sorted(buf):
                        yield q, np.concatenate(buf[q]).tobytes()
                    buf, size, held = {}, {}, 0
        except (InputError, IndexBuildError):
            raise
        except Exception as e:  # the driver's one-line SparkJobError then names the file
            raise IndexBuildError(f"n-gram index map failed while reading {reading[0]}: {_one_line(e)}") from None
        for p in sorted(buf):
            yield p, np.concatenate(buf[p]).tobytes()
        yield _STATS, stats


class _SortFn:
    """Executor side of the reduce: one partition's chunks -> sorted distinct hashes in the work folder."""

    def __init__(self, part_bits: int, max_bytes: int, work: str) -> None:
        self.part_bits, self.max_bytes, self.work = part_bits, max_bytes, work

    def __call__(self, part: int, records: Iterator[tuple[int, Any]]) -> Iterator[dict[str, Any]]:
        stats = None
        scratch = tempfile.mkdtemp(prefix="dk-index-reduce-")
        try:
            spill = f"{scratch}/in.u64"
            with open(spill, "wb") as f:
                for key, value in records:
                    if key == _STATS:
                        stats = value if stats is None else sum_stats([stats, value])
                    else:
                        f.write(value)
            path = f"{self.work}/u-p{part:04d}.u64"
            fs, p = filesystem(path)
            unique = 0
            with fs.open(p, "wb") as out:
                for h in sorted_unique_chunks([spill], part, self.part_bits, self.max_bytes, scratch):
                    out.write(h.tobytes())
                    unique += len(h)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        yield {"part": part, "path": path, "unique": unique, "stats": stats}


class _FingerprintFn:
    """Executor side of job 2: a partition's sorted distinct hashes -> fingerprints + bucket counts files."""

    def __init__(self, part_bits: int, b: int, fingerprint_bits: int, work: str) -> None:
        self.part_bits, self.b, self.fp_bits, self.work = part_bits, b, fingerprint_bits, work

    def __call__(self, item: tuple[int, str]) -> dict[str, Any]:
        part, src = item
        fpr = Fingerprinter(part, self.part_bits, self.b, self.fp_bits)
        fps_path, counts_path = f"{self.work}/fp-p{part:04d}.bin", f"{self.work}/cnt-p{part:04d}.i64"
        sfs, sp = filesystem(src)
        ofs, op = filesystem(fps_path)
        with sfs.open(sp, "rb") as f, ofs.open(op, "wb") as out:
            for h in read_u64_chunks(f):
                out.write(fpr.add(h).tobytes())
        cfs, cp = filesystem(counts_path)
        with cfs.open(cp, "wb") as out:
            out.write(fpr.counts.tobytes())
        try:
            sfs.rm(sp)
        except OSError:
            pass
        return {"part": part, "fps": fps_path, "counts": counts_path, "lo": fpr.lo, "entries": fpr.entries}


def active_session():
    """The running SparkSession (the one the engine just used), or None."""
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    if SparkContext._active_spark_context is None:
        return None
    return SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()


__all__ = ["build_index_spark", "active_session"]
