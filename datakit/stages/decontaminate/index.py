"""A compact n-gram index of a training set, so a later contamination check takes seconds.

Why: a new eval set shows up after the training data is built; rescanning
terabytes to check it is too slow. The index stores every distinct n-gram of
the dataset once, as a 32-bit (or 16-bit) *fingerprint* in a bucket chosen by the top
`bucket_bits` of its 64-bit hash ("sorted hash shards": bucket offsets +
fingerprints sorted within each bucket). A query reads one bucket: with
memory-mapped files it touches a handful of pages, so checking HumanEval
against a 1 GB-of-text index is dominated by process start-up.

False positives: an absent n-gram is reported present when some stored n-gram
shares its top `bucket_bits + F` hash bits (F = fingerprint bits): probability ~ N / 2^(bucket_bits+F)
per queried n-gram (N = distinct n-grams), written to `index.json` as
`fp_rate_per_ngram` (~1e-9 to 4e-9 by construction). No false negatives.

Layout of an index folder (all little-endian raw arrays)::

    index.json          format, ngram, normalizations, counts, bucket_bits, dtypes, fp rate
    offsets.bin         uint32/uint64[2^bucket_bits + 1]: bucket -> first fingerprint
    fingerprints.bin    uint32[N] (or uint16): hash bits [64-b-F, 64-b), sorted within each bucket

Build: `build_index(dataset_path, out_path, ngram, normalization, workers=N)`
is a map/reduce on the shared spawn pool (`datakit.workers`, also the local engine's; all cores by default):

* map: the input is cut into units (files; Parquet row-group ranges when there
  are fewer files than 4 per worker); each task hashes its units' texts and
  writes one spill file per partition (top 4 bits of the hash: 16 partitions);
* reduce: each partition is sorted and deduplicated by one task (one
  partition's hashes in memory at a time; a partition bigger than
  `max_partition_bytes` is split again by its next bits), which writes its
  fingerprints and per-bucket counts;
* assembly: the per-partition files are concatenated in partition order into
  `fingerprints.bin`; `offsets.bin` is the running sum of the counts.

The result is deterministic: same data and settings, same bytes, for any
number of workers (the index is a sorted set; the counts in index.json are
sums). `index_spark.build_index_spark` runs the same phases on Spark. A failed
task raises (`IndexBuildError` naming its file, or `InputError`) and nothing
is published (locally the folder appears by one rename; remote: index.json is uploaded last).
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Sequence

import numpy as np
from datakit.jit import njit

from datakit.io.fs import InputError, expand, filesystem
from datakit.stages.decontaminate.normalize import DEFAULT_NORMALIZATIONS, flags_of, names_of
from datakit.stages.decontaminate.ngrams import hash_strings

INDEX_FORMAT = "datakit-ngram-index"
INDEX_VERSION = 1
INDEX_DIRNAME = "_ngram_index"  # where a pipeline's sink puts the index beside its output
_PART_BITS = 4  # map-phase partitions (16): each reduce task sorts one
_MAX_SUB_BITS = 8  # part bits + sub-split bits <= 20 <= bucket_bits + 16: no (bucket, fp) pair straddles two
MAX_PARTITION_BYTES = 1 << 30  # hashes a reduce task sorts at once; a bigger partition is split again
_CHUNK = 1 << 22  # uint64 values per streamed read (32 MB)
FP_BITS = 32
log = logging.getLogger("datakit.decontam.index")


@dataclass
class IndexInfo:
    path: str
    ngram: int
    flags: int
    ngrams: int
    bucket_bits: int
    fp_rate_per_ngram: float
    documents: int
    texts: int
    bytes: int
    meta: dict


def _bucket_bits(total: int) -> int:
    """~4-8 hashes per bucket for the pre-dedup count (distinct counts can only be lower)."""
    return int(min(32, max(_PART_BITS, math.ceil(math.log2(max(total, 1))) - 2)))


class IndexBuildError(RuntimeError):
    """A task failed while building an index (a worker died, a file broke mid-read); names the task."""


@dataclass(frozen=True)
class Unit:
    """A slice of the input one map task reads: a whole file, or some row groups of one Parquet file."""

    url: str
    row_groups: tuple[int, ...] | None = None


@dataclass(frozen=True)
class HashSpec:
    """What hashing needs; picklable, because it crosses into spawned workers and Spark executors."""

    ngram: int
    flags: int
    text_fields: tuple[str, ...] | None
    batch_rows: int
    part_bits: int = _PART_BITS


def build_index(dataset_path: str | Sequence[str], out_path: str, ngram: int = 13,
                normalization: Sequence[str] = DEFAULT_NORMALIZATIONS, text_fields: Sequence[str] | None = None,
                batch_rows: int = 8192, fingerprint_bits: int = FP_BITS, workers: int | None = None,
                max_partition_bytes: int | None = None, partition_bits: int | None = None) -> IndexInfo:
    """Index every n-gram of a records dataset (Parquet/JSONL, globs, fsspec URLs) or packed dataset into `out_path`.

    `normalization` is a list of normalization names (see `normalize.py`); the
    check re-uses the index's n and normalizations automatically.
    `fingerprint_bits` 32 (default, ~5 B per n-gram, FP ~1e-9 per n-gram) or 16
    (~3 B per n-gram, FP ~1e-4 per n-gram: harmless under a min-fraction rule,
    which needs many n-grams of one item, but visible with the any-n-gram rule).
    `workers` processes (default: all cores, the shared `datakit.workers` pool);
    the bytes written never depend on it. `max_partition_bytes` bounds the
    hashes one reduce task holds in memory (a bigger partition is split further;
    default: a quarter of the free memory shared by the concurrent tasks, <= 1 GB).
    `partition_bits`: 2^bits reduce partitions (default 16, more above 8 workers; at most 12 bits).
    """
    if fingerprint_bits not in (16, 32):
        raise ValueError("fingerprint_bits must be 16 or 32")
    from datakit.stages.decontaminate.check import _is_packed

    from datakit.workers import usable_cpus

    workers = max(1, workers or usable_cpus())
    paths = [dataset_path] if isinstance(dataset_path, str) else list(dataset_path)
    if any(str(p).startswith("memory://") for p in paths + [out_path]):
        workers = 1  # an in-memory filesystem lives in this process only: spawned workers would not see it
    part_bits = partition_bits or min(8, max(_PART_BITS, math.ceil(math.log2(2 * workers))))  # >= 2 per worker
    if not 1 <= part_bits <= 12:
        raise ValueError("partition_bits must be 1..12")
    max_partition_bytes = max_partition_bytes or _default_partition_bytes(min(workers, 1 << part_bits))
    spec = HashSpec(int(ngram), flags_of(normalization), tuple(text_fields) if text_fields else None, batch_rows,
                    part_bits)
    tmp = Path(tempfile.mkdtemp(prefix="dk-ngram-index-"))
    stage_dir: Path | None = None
    try:
        t0 = time.perf_counter()
        if isinstance(dataset_path, str) and _is_packed(dataset_path):
            units: list[Unit] = []
            tasks = [_MapTask(0, (), dataset_path, spec, str(tmp))]  # decoded in order, in this process
        else:
            units = plan_units(dataset_path, 1 if workers == 1 else 4 * workers)
            tasks = [_MapTask(i, tuple(c), None, spec, str(tmp)) for i, c in enumerate(_chunks(units, 4 * workers))]
        maps = _run_tasks(_map_task, tasks, 1 if tasks and tasks[0].packed else workers, "map")
        stats = sum_stats(maps)
        log.info("n-gram index map: %d units in %d tasks on %d workers: %d documents, %d texts, %d n-grams "
                 "hashed (%.1f s)", len(units), len(tasks), workers, stats["documents"], stats["texts"],
                 stats["hashes"], time.perf_counter() - t0)
        b = _bucket_bits(stats["hashes"])
        t1 = time.perf_counter()
        reduces = [_ReduceTask(p, tuple(m["files"][p] for m in maps if p in m["files"]), spec.part_bits, b,
                               fingerprint_bits, max_partition_bytes, str(tmp)) for p in range(1 << spec.part_bits)]
        parts = _run_tasks(_reduce_task, reduces, workers, "reduce")
        log.info("n-gram index reduce: %d partitions on %d workers: %d entries (%.1f s)", len(parts), workers,
                 sum(r["entries"] for r in parts), time.perf_counter() - t1)
        local_out = _local_target(out_path)  # only now: a missing input must not leave folders behind
        stage_dir = Path(tempfile.mkdtemp(prefix=".tmp-index-", dir=str(local_out.parent) if local_out else None))
        info = finish_index(stage_dir, out_path, local_out, spec, parts, b, fingerprint_bits, stats,
                            lambda path: open(path, "rb"))
        stage_dir = None  # published (moved or uploaded)
        log.info("n-gram index written: %d n-grams, bucket_bits %d (%.1f s in all)", info.ngrams, b,
                 time.perf_counter() - t0)
        return info
    finally:
        if stage_dir is not None:
            shutil.rmtree(stage_dir, ignore_errors=True)  # a failed assembly never leaves a half folder behind
        shutil.rmtree(tmp, ignore_errors=True)


def _default_partition_bytes(concurrent: int) -> int:
    """Hashes one reduce task may sort at once: sorting needs ~2x (the deduplicated copy), and
    `concurrent` tasks run side by side; 64 MB .. 1 GB."""
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not Linux: assume plenty
        return MAX_PARTITION_BYTES
    return int(min(MAX_PARTITION_BYTES, max(64 << 20, free // (4 * max(concurrent, 1)))))


# -- planning ---------------------------------------------------------------------------------

def plan_units(paths: str | Sequence[str], target: int) -> list[Unit]:
    """The input as units of work, in file order: whole files when there are enough of them, else
    Parquet row-group ranges (so 3 big files still keep 8 cores busy). Reads footers only then."""
    from datakit.stages.decontaminate.check import DATA_SUFFIXES

    files = expand(paths, suffixes=DATA_SUFFIXES)
    if len(files) >= target:
        return [Unit(f) for f in files]
    groups = {f: _open_parquet(f).metadata.num_row_groups for f in files if f.endswith(".parquet")}
    per = max(1, math.ceil((sum(groups.values()) + len(files) - len(groups)) / max(target, 1)))
    units: list[Unit] = []
    for f in files:
        n = groups.get(f, 0)
        if n <= per:
            units.append(Unit(f))
        else:
            units.extend(Unit(f, tuple(range(s, min(n, s + per)))) for s in range(0, n, per))
    return units


def _chunks(items: list, n: int) -> list[list]:
    """`items` cut into at most `n` contiguous, near-equal runs (a few per worker: the pool balances them)."""
    n = max(1, min(n, len(items)))
    return [[items[i] for i in c] for c in np.array_split(np.arange(len(items)), n) if len(c)]


def _open_parquet(url: str):
    import pyarrow.parquet as pq

    fs, p = filesystem(url)
    try:
        return pq.ParquetFile(p, filesystem=fs)
    except Exception as e:  # ArrowInvalid for non-Parquet bytes
        raise InputError(f"cannot read Parquet file {url}: {type(e).__name__}") from None


# -- map: texts -> hashes, split by their top bits -----------------------------------------------

def unit_batches(unit: Unit, spec: HashSpec) -> Iterator:
    """The TextBatches of one unit, through the check's readers (same columns, same texts)."""
    from datakit.stages.decontaminate.check import _columns_for, _to_text_batch, iter_text_batches

    if unit.row_groups is None:
        yield from iter_text_batches(unit.url, text_fields=spec.text_fields, batch_rows=spec.batch_rows)
        return
    pf = _open_parquet(unit.url)
    cols = _columns_for(pf.schema_arrow.names, spec.text_fields, unit.url)
    for rb in pf.iter_batches(batch_size=spec.batch_rows, row_groups=list(unit.row_groups), columns=cols):
        yield _to_text_batch(unit.url, rb, 0, spec.text_fields)


def new_stats() -> dict[str, int]:
    return {"documents": 0, "texts": 0, "bytes": 0, "hashes": 0}


def sum_stats(parts: Sequence[dict]) -> dict[str, int]:
    out = new_stats()
    for s in parts:
        for k in out:
            out[k] += int(s[k])
    return out


def hash_partitions(batches: Iterable, spec: HashSpec, stats: dict[str, int]) -> Iterator[tuple[int, np.ndarray]]:
    """(partition, hashes) pieces of every text's n-gram hashes; partition = top `part_bits` bits.

    Counts documents/texts/bytes/hashes into `stats` (sums: independent of how the input was cut)."""
    pb = spec.part_bits
    for batch in batches:
        stats["documents"] += batch.rows
        for src in batch.sources:
            stats["texts"] += len(src.offsets) - 1
            stats["bytes"] += int(src.offsets[-1] - src.offsets[0]) if len(src.offsets) else 0
            h = hash_strings(src.data, src.offsets, spec.ngram, spec.flags)[0]
            if not len(h):
                continue
            stats["hashes"] += len(h)
            part = (h >> np.uint64(64 - pb)).astype(np.uint16)
            order = np.argsort(part, kind="stable")  # radix sort for small ints: O(n)
            hs, ps = h[order], part[order]
            cuts = np.searchsorted(ps, np.arange((1 << pb) + 1))
            for p in np.flatnonzero(np.diff(cuts)):
                yield int(p), hs[cuts[p]:cuts[p + 1]]


@dataclass(frozen=True)
class _MapTask:
    task: int
    units: tuple[Unit, ...]
    packed: str | None  # a packed dataset: decoded by one task, in order
    spec: HashSpec
    tmp: str

    def describe(self) -> str:
        if self.packed:
            return f"map task {self.task} (packed dataset {self.packed})"
        first = self.units[0].url if self.units else "-"
        return f"map task {self.task} ({len(self.units)} units from {first})"


def _map_task(t: _MapTask) -> dict[str, Any]:
    """Hash the task's units into its own spill file per partition (raw uint64, in arrival order)."""
    from datakit.stages.decontaminate.check import _packed_batches

    stats: dict[str, Any] = new_stats()
    reading = [t.packed or ""]

    def batches() -> Iterator:
        if t.packed:
            yield from _packed_batches(t.packed, t.spec.batch_rows)
            return
        for u in t.units:
            reading[0] = u.url if u.row_groups is None else f"{u.url} (row groups {u.row_groups[0]}-{u.row_groups[-1]})"
            yield from unit_batches(u, t.spec)

    files: dict[int, Any] = {}
    try:
        for p, h in hash_partitions(batches(), t.spec, stats):
            f = files.get(p)
            if f is None:  # no mkdir: if the build was abandoned and its folder removed, this fails
                f = files[p] = open(f"{t.tmp}/m{t.task:05d}-p{p:04d}.u64", "wb")
            f.write(h.tobytes())
    except (InputError, IndexBuildError):
        raise
    except Exception as e:  # name the file: "map task 3 failed" alone sends nobody anywhere
        raise IndexBuildError(f"n-gram index build failed in map task {t.task} while reading {reading[0]}: "
                              f"{_one_line(e)}") from None
    finally:
        for f in files.values():
            f.close()
    stats["files"] = {p: f.name for p, f in files.items()}
    return stats


# -- reduce: one partition's hashes -> sorted unique -> fingerprints + bucket counts ----------------

def sorted_unique_chunks(files: Sequence[str], part: int, part_bits: int, max_bytes: int,
                         scratch: str) -> Iterator[np.ndarray]:
    """Sorted distinct hashes of one partition, as ascending chunks, holding <= ~max_bytes at once.

    A partition bigger than `max_bytes` is split again by its next bits into
    sub-files first; the chunks still come out in hash order. Deletes `files`."""
    size = sum(os.path.getsize(f) for f in files)
    if size <= max_bytes:
        h = np.concatenate([np.fromfile(f, dtype=np.uint64) for f in files]) if files else np.zeros(0, np.uint64)
        for f in files:
            os.unlink(f)
        yield _sorted_unique(h)
        return
    k = min(_MAX_SUB_BITS, max(1, math.ceil(math.log2(size / max_bytes)) + 1))
    shift, mask = np.uint64(64 - part_bits - k), np.uint64((1 << k) - 1)
    subs: dict[int, Any] = {}
    try:
        for f in files:
            for chunk in read_u64_chunks(f):
                q = ((chunk >> shift) & mask).astype(np.uint16)
                order = np.argsort(q, kind="stable")
                hs, qs = chunk[order], q[order]
                cuts = np.searchsorted(qs, np.arange((1 << k) + 1))
                for s in np.flatnonzero(np.diff(cuts)):
                    out = subs.get(int(s))
                    if out is None:
                        out = subs[int(s)] = open(f"{scratch}/r-p{part:04d}-s{int(s):03d}.u64", "wb")
                    out.write(hs[cuts[s]:cuts[s + 1]].tobytes())
            os.unlink(f)
    finally:
        for out in subs.values():
            out.close()
    log.info("n-gram index reduce: partition %d holds %d MB of hashes: split %d ways", part, size >> 20, 1 << k)
    for s in sorted(subs):
        path = subs[s].name
        h = np.fromfile(path, dtype=np.uint64)
        os.unlink(path)
        yield _sorted_unique(h)


def read_u64_chunks(f: str | BinaryIO, chunk: int = _CHUNK) -> Iterator[np.ndarray]:
    """A raw uint64 file (path or open binary file) in chunks of `chunk` values."""
    fh = open(f, "rb") if isinstance(f, str) else f
    try:
        while True:
            buf = fh.read(chunk * 8)
            if not buf:
                return
            yield np.frombuffer(buf, dtype=np.uint64).copy()
    finally:
        if isinstance(f, str):
            fh.close()


def bucket_range(part: int, part_bits: int, b: int) -> tuple[int, int]:
    """(first bucket, number of buckets) a partition's hashes can fall in."""
    if b >= part_bits:
        return part << (b - part_bits), 1 << (b - part_bits)
    return part >> (part_bits - b), 1


class Fingerprinter:
    """Turns ascending distinct hashes of one partition into stored fingerprints and per-bucket counts.

    Fed in chunks: the last (bucket, fp) of a chunk is carried, so a pair split
    across chunks is still stored once, exactly as one big array would be."""

    def __init__(self, part: int, part_bits: int, b: int, fingerprint_bits: int) -> None:
        self.b, self.fp_bits = b, fingerprint_bits
        self.fp_dtype = "<u2" if fingerprint_bits == 16 else "<u4"
        self.lo, n = bucket_range(part, part_bits, b)
        self.counts = np.zeros(n, dtype=np.int64)
        self.last: tuple[int, int] | None = None
        self.entries = 0

    def add(self, h: np.ndarray) -> np.ndarray:
        if not len(h):
            return np.zeros(0, self.fp_dtype)
        b = self.b
        bucket = (h >> np.uint64(64 - b)).astype(np.int64)
        fps = ((h << np.uint64(b)) >> np.uint64(64 - self.fp_bits)).astype(self.fp_dtype)
        # (bucket, fp) pairs can repeat when two distinct hashes share b+F bits: store once
        keep = np.ones(len(h), bool)
        keep[1:] = (bucket[1:] != bucket[:-1]) | (fps[1:] != fps[:-1])
        if self.last is not None:
            keep[0] = (int(bucket[0]), int(fps[0])) != self.last
        bucket, fps = bucket[keep], fps[keep]
        if len(fps):
            self.last = (int(bucket[-1]), int(fps[-1]))
            self.counts += np.bincount(bucket - self.lo, minlength=len(self.counts))
            self.entries += len(fps)
        return fps


@dataclass(frozen=True)
class _ReduceTask:
    part: int
    files: tuple[str, ...]
    part_bits: int
    bucket_bits: int
    fingerprint_bits: int
    max_bytes: int
    tmp: str

    def describe(self) -> str:
        return f"reduce task of partition {self.part} ({len(self.files)} spill files)"


def _reduce_task(t: _ReduceTask) -> dict[str, Any]:
    """Sort/dedup one partition; write its fingerprints and bucket counts beside the spills."""
    fpr = Fingerprinter(t.part, t.part_bits, t.bucket_bits, t.fingerprint_bits)
    fps_path, counts_path = f"{t.tmp}/fp-p{t.part:04d}.bin", f"{t.tmp}/cnt-p{t.part:04d}.i64"
    with open(fps_path, "wb") as out:
        for h in sorted_unique_chunks(t.files, t.part, t.part_bits, t.max_bytes, t.tmp):
            out.write(fpr.add(h).tobytes())
    fpr.counts.tofile(counts_path)
    return {"part": t.part, "fps": fps_path, "counts": counts_path, "lo": fpr.lo, "entries": fpr.entries}


# -- assembly ------------------------------------------------------------------------------------

def finish_index(stage_dir: Path, out_path: str, local_out: Path | None, spec: HashSpec, parts: Sequence[dict],
                 b: int, fingerprint_bits: int, stats: dict[str, int],
                 open_part: Callable[[str], BinaryIO]) -> IndexInfo:
    """Concatenate the per-partition results in partition order, write the metadata, publish.

    `parts`: {"part", "fps", "counts", "lo", "entries"} per partition (files
    opened with `open_part`: local paths, or fsspec for Spark's results)."""
    parts = sorted(parts, key=lambda r: r["part"])
    fp_dtype = "<u2" if fingerprint_bits == 16 else "<u4"
    n_unique = int(sum(r["entries"] for r in parts))
    off_dtype = "<u4" if n_unique < 2**32 else "<u8"
    with open(stage_dir / "fingerprints.bin", "wb") as out:
        for r in parts:
            with open_part(r["fps"]) as f:
                shutil.copyfileobj(f, out, 1 << 22)
    _write_offsets(stage_dir / "offsets.bin", parts, b, off_dtype, open_part)
    fp_rate = n_unique / float(2 ** (b + fingerprint_bits))
    meta = {
        "format": INDEX_FORMAT, "format_version": INDEX_VERSION,
        "ngram": int(spec.ngram), "normalizations": names_of(spec.flags), "hash": "fnv1a-fmix64/window-v1",
        "ngrams": n_unique, "bucket_bits": b, "fingerprint_bits": fingerprint_bits,
        "offsets_dtype": off_dtype, "fingerprints_dtype": fp_dtype,
        "fp_rate_per_ngram": fp_rate,
        "documents": int(stats["documents"]), "texts": int(stats["texts"]), "bytes": int(stats["bytes"]),
        "text_fields": list(spec.text_fields) if spec.text_fields else None,
    }
    (stage_dir / "index.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    _publish(stage_dir, out_path, local_out)
    return IndexInfo(out_path, spec.ngram, spec.flags, n_unique, b, fp_rate, int(stats["documents"]),
                     int(stats["texts"]), int(stats["bytes"]), meta)


def _write_offsets(path: Path, parts: Sequence[dict], b: int, off_dtype: str,
                   open_part: Callable[[str], BinaryIO]) -> None:
    """offsets = 0 followed by the running sum of bucket counts. Streamed partition by partition when
    the partitions tile the buckets in order (the usual case), so the driver never holds 2^b counts twice."""
    def counts_of(r: dict) -> np.ndarray:
        with open_part(r["counts"]) as f:
            return np.frombuffer(f.read(), dtype=np.int64)

    with open(path, "wb") as out:
        out.write(np.zeros(1, dtype=off_dtype).tobytes())
        carry = expect = 0
        for r in parts:
            if int(r["lo"]) != expect:
                break
            c = counts_of(r)
            cs = np.cumsum(c, dtype=np.int64) + carry
            if len(cs):
                carry = int(cs[-1])
            out.write(cs.astype(off_dtype).tobytes())
            expect += len(c)
        else:
            if expect == 1 << b:
                return
    counts = np.zeros(1 << b, dtype=np.int64)  # partitions narrower than a bucket (tiny data): add them up
    for r in parts:
        c = counts_of(r)
        counts[int(r["lo"]):int(r["lo"]) + len(c)] += c
    offsets = np.zeros((1 << b) + 1, dtype=off_dtype)
    np.cumsum(counts, out=offsets[1:], dtype=offsets.dtype)
    offsets.tofile(path)


def _one_line(e: BaseException) -> str:
    """`Type: message` on one line (Arrow's messages carry newlines; the CLI prints one line)."""
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


# -- running tasks ---------------------------------------------------------------------------------

def _run_tasks(fn: Callable, tasks: Sequence, workers: int, what: str) -> list:
    """Run `fn` over `tasks` in this process (workers=1) or on the shared spawn pool (`datakit.workers`).

    A failure names its task; the others are cancelled (or waited for, if running) before the
    caller removes the temporary folder they write into. InputError passes through unchanged."""
    if workers == 1 or len(tasks) <= 1:
        out = []
        for t in tasks:
            try:
                out.append(fn(t))
            except (InputError, IndexBuildError):
                raise
            except Exception as e:
                raise IndexBuildError(f"n-gram index build failed in {t.describe()}: {_one_line(e)}") from e
        return out
    from concurrent.futures import wait
    from concurrent.futures.process import BrokenProcessPool

    from datakit.workers import drop_pool, pool

    futures = [pool(workers).submit(fn, t) for t in tasks]
    results = []
    try:
        for t, f in zip(tasks, futures):
            try:
                results.append(f.result())
            except BrokenProcessPool:
                drop_pool(workers)
                raise IndexBuildError(f"a worker process died during the n-gram index {what} phase ({t.describe()}): "
                                      "killed, out of memory, or a script that builds at import time (spawned "
                                      "workers import it: use `if __name__ == \"__main__\":`)") from None
            except (InputError, IndexBuildError):
                raise
            except Exception as e:
                raise IndexBuildError(f"n-gram index build failed in {t.describe()}: {_one_line(e)}") from e
    except Exception:
        for f in futures:
            f.cancel()
        wait(futures)  # running tasks finish before their folder is removed
        raise
    except BaseException:  # Ctrl-C: do not wait for long tasks
        drop_pool(workers)
        raise
    return results


def _sorted_unique(h: np.ndarray) -> np.ndarray:
    """Sort in place and drop repeats (numpy 2.x `np.unique` hashes first: ~10x slower here)."""
    h.sort()
    if len(h) < 2:
        return h
    keep = np.empty(len(h), bool)
    keep[0] = True
    np.not_equal(h[1:], h[:-1], out=keep[1:])
    return h[keep]


def _local_target(out_path: str) -> Path | None:
    if "://" in out_path and not out_path.startswith("file://"):
        return None
    p = Path(out_path.removeprefix("file://")).resolve()
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def _publish(stage_dir: Path, out_path: str, local_out: Path | None) -> None:
    """Move the finished folder into place.

    Locally: the old index is renamed aside, the new one renamed in, then the old
    one removed, so there is always a whole index at `out_path` (the old or the
    new) and never a mix. Object stores have no rename: the old `index.json` is
    deleted first, so if an upload then fails a reader finds "not an index"
    (never old data files under new metadata or the reverse); `index.json` is
    uploaded last.
    """
    if local_out is not None:
        old = None
        if local_out.exists():
            old = local_out.with_name(f".{local_out.name}.old-{os.getpid()}")
            os.replace(local_out, old)
        try:
            os.replace(stage_dir, local_out)
        except BaseException:
            if old is not None:
                os.replace(old, local_out)  # put the old index back
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return
    fs, p = filesystem(out_path)
    base = p.rstrip("/")
    try:
        if fs.exists(f"{base}/index.json"):
            fs.rm(f"{base}/index.json")
        for name in ("offsets.bin", "fingerprints.bin", "index.json"):  # metadata last
            fs.put(str(stage_dir / name), f"{base}/{name}")
    finally:
        shutil.rmtree(stage_dir, ignore_errors=True)


def is_index(path: str) -> bool:
    """True if `path` is an index folder (has an index.json of our format)."""
    try:
        fs, p = filesystem(path)
        meta_path = f"{p.rstrip('/')}/index.json"
        if not fs.exists(meta_path):
            return False
        return json.loads(fs.cat_file(meta_path)).get("format") == INDEX_FORMAT
    except (OSError, ValueError):
        return False


class NgramIndex:
    """A loaded index (memory-mapped when local). `contains(hashes)` -> bool per hash."""

    def __init__(self, path: str) -> None:
        fs, p = filesystem(path)
        base = p.rstrip("/")
        try:
            self.meta = json.loads(fs.cat_file(f"{base}/index.json"))
        except FileNotFoundError:
            raise InputError(f"not an n-gram index (no index.json): {path}") from None
        except ValueError:
            raise InputError(f"corrupt index.json in {path}") from None
        if self.meta.get("format") != INDEX_FORMAT:
            raise InputError(f"not an n-gram index: {path}")
        if self.meta.get("format_version") != INDEX_VERSION:
            raise InputError(f"index {path} has format version {self.meta.get('format_version')}, expected {INDEX_VERSION}")
        self.path = path
        self.ngram = int(self.meta["ngram"])
        self.flags = flags_of(self.meta["normalizations"])
        self.bucket_bits = int(self.meta["bucket_bits"])
        self.fp_rate = float(self.meta["fp_rate_per_ngram"])
        self.fp_bits = int(self.meta.get("fingerprint_bits", FP_BITS))
        self.fp_dtype = self.meta.get("fingerprints_dtype", "<u4")
        if self.fp_bits not in (16, 32) or self.fp_dtype not in ("<u2", "<u4"):
            raise InputError(f"index {path}: unsupported fingerprint width {self.fp_bits}")
        local = "://" not in path or path.startswith("file://")
        corrupt = f"index {path} is incomplete or corrupt (sizes do not match index.json)"
        try:
            if local:
                base = base.removeprefix("file://")
                self.offsets = np.memmap(f"{base}/offsets.bin", dtype=self.meta["offsets_dtype"], mode="r")
                n = int(self.meta["ngrams"])
                self.fps = (np.memmap(f"{base}/fingerprints.bin", dtype=self.fp_dtype, mode="r") if n
                            else np.zeros(0, self.fp_dtype))
            else:
                self.offsets = np.frombuffer(fs.cat_file(f"{base}/offsets.bin"), dtype=self.meta["offsets_dtype"])
                self.fps = np.frombuffer(fs.cat_file(f"{base}/fingerprints.bin"), dtype=self.fp_dtype)
        except FileNotFoundError:
            raise InputError(corrupt) from None
        except ValueError:  # a file whose size is not a whole number of entries
            raise InputError(corrupt) from None
        expect = (1 << self.bucket_bits) + 1
        if len(self.offsets) != expect or int(self.offsets[-1]) != len(self.fps) or len(self.fps) != int(self.meta["ngrams"]):
            raise InputError(corrupt)

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        # queries in hash order walk the memory-mapped files front to back (readahead helps a cold cache)
        order = np.argsort(np.asarray(hashes, dtype=np.uint64), kind="stable")
        h = np.asarray(hashes, dtype=np.uint64)[order]
        b = self.bucket_bits
        bucket = (h >> np.uint64(64 - b)).astype(np.int64)
        fp = ((h << np.uint64(b)) >> np.uint64(64 - self.fp_bits)).astype(self.fp_dtype)
        found = np.empty(len(h), np.bool_)
        found[order] = _lookup(np.asarray(self.offsets), np.asarray(self.fps), bucket, fp)
        return found


@njit(cache=True)
def _lookup(offsets, fps, bucket, fp):
    out = np.zeros(bucket.shape[0], np.bool_)
    for i in range(bucket.shape[0]):
        lo = np.int64(offsets[bucket[i]])
        hi = np.int64(offsets[bucket[i] + 1])
        q = fp[i]
        while lo < hi:
            mid = (lo + hi) >> 1
            if fps[mid] < q:
                lo = mid + 1
            else:
                hi = mid
        out[i] = lo < np.int64(offsets[bucket[i] + 1]) and fps[lo] == q
    return out


def iter_index_sizes(path: str) -> Iterator[tuple[str, int]]:
    """(file, bytes) of an index folder, for reports."""
    fs, p = filesystem(path)
    for name in ("index.json", "offsets.bin", "fingerprints.bin"):
        yield name, int(fs.size(f"{p.rstrip('/')}/{name}"))
