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

Build: `build_index(dataset_path, out_path, ngram, normalization)` streams the
dataset's texts, spills hashes into 16 partition files by their top 4 bits (so
memory stays ~ 1/16 of the hashes), then sorts and deduplicates each partition.
The result is deterministic: same data and settings, same bytes.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from numba import njit

from datakit.io.fs import InputError, filesystem
from datakit.stages.decontam.normalize import DEFAULT_NORMALIZATIONS, flags_of, names_of
from datakit.stages.decontam.ngrams import hash_strings

INDEX_FORMAT = "datakit-ngram-index"
INDEX_VERSION = 1
INDEX_DIRNAME = "_ngram_index"  # where a pipeline's sink puts the index beside its output
_PART_BITS = 4
FP_BITS = 32


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


def build_index(dataset_path: str | Sequence[str], out_path: str, ngram: int = 13,
                normalization: Sequence[str] = DEFAULT_NORMALIZATIONS, text_fields: Sequence[str] | None = None,
                batch_rows: int = 8192, fingerprint_bits: int = FP_BITS) -> IndexInfo:
    """Index every n-gram of a records dataset (Parquet/JSONL, globs, fsspec URLs) or packed dataset into `out_path`.

    `normalization` is a list of normalization names (see `normalize.py`); the
    check re-uses the index's n and normalizations automatically.
    `fingerprint_bits` 32 (default, ~5 B per n-gram, FP ~1e-9 per n-gram) or 16
    (~3 B per n-gram, FP ~1e-4 per n-gram: harmless under a min-fraction rule,
    which needs many n-grams of one item, but visible with the any-n-gram rule).
    """
    if fingerprint_bits not in (16, 32):
        raise ValueError("fingerprint_bits must be 16 or 32")
    fp_dtype = "<u2" if fingerprint_bits == 16 else "<u4"
    from datakit.stages.decontam.check import _is_packed, _packed_batches, iter_text_batches  # shared readers

    flags = flags_of(normalization)
    tmp = Path(tempfile.mkdtemp(prefix="dk-ngram-index-"))
    try:
        parts = [open(tmp / f"part-{p:02d}.u64", "wb") for p in range(1 << _PART_BITS)]
        total = docs = texts = nbytes = 0
        try:
            if isinstance(dataset_path, str) and _is_packed(dataset_path):
                batches = _packed_batches(dataset_path, batch_rows)  # decoded with its own tokenizer
            else:
                batches = iter_text_batches(dataset_path, text_fields=text_fields, batch_rows=batch_rows)
            for batch in batches:
                docs += batch.rows
                for src in batch.sources:
                    texts += len(src.offsets) - 1
                    nbytes += int(src.offsets[-1] - src.offsets[0]) if len(src.offsets) else 0
                    h = hash_strings(src.data, src.offsets, ngram, flags)[0]
                    if not len(h):
                        continue
                    total += len(h)
                    part = (h >> np.uint64(64 - _PART_BITS)).astype(np.uint8)
                    order = np.argsort(part, kind="stable")  # radix sort for uint8: O(n)
                    hs, ps = h[order], part[order]
                    cuts = np.searchsorted(ps, np.arange((1 << _PART_BITS) + 1))
                    for p in range(1 << _PART_BITS):
                        if cuts[p + 1] > cuts[p]:
                            parts[p].write(hs[cuts[p]:cuts[p + 1]].tobytes())
        finally:
            for f in parts:
                f.close()
        b = _bucket_bits(total)
        local_out = _local_target(out_path)
        stage_dir = Path(tempfile.mkdtemp(prefix=".tmp-index-", dir=str(local_out.parent) if local_out else None))
        n_unique = 0
        counts = np.zeros(1 << b, dtype=np.int64)
        with open(stage_dir / "fingerprints.bin", "wb") as fp_out:
            for p in range(1 << _PART_BITS):
                h = _sorted_unique(np.fromfile(tmp / f"part-{p:02d}.u64", dtype=np.uint64))
                os.unlink(tmp / f"part-{p:02d}.u64")
                if not len(h):
                    continue
                bucket = (h >> np.uint64(64 - b)).astype(np.int64)
                fps = ((h << np.uint64(b)) >> np.uint64(64 - fingerprint_bits)).astype(fp_dtype)
                # (bucket, fp) pairs can repeat when two distinct hashes share b+32 bits: store once
                keep = np.ones(len(h), bool)
                keep[1:] = (bucket[1:] != bucket[:-1]) | (fps[1:] != fps[:-1])
                bucket, fps = bucket[keep], fps[keep]
                counts += np.bincount(bucket, minlength=1 << b)
                fp_out.write(fps.tobytes())
                n_unique += len(fps)
        off_dtype = "<u4" if n_unique < 2**32 else "<u8"
        offsets = np.zeros((1 << b) + 1, dtype=off_dtype)
        np.cumsum(counts, out=offsets[1:], dtype=offsets.dtype) if len(counts) else None
        offsets.tofile(stage_dir / "offsets.bin")
        fp_rate = n_unique / float(2 ** (b + fingerprint_bits))
        meta = {
            "format": INDEX_FORMAT, "format_version": INDEX_VERSION,
            "ngram": int(ngram), "normalizations": names_of(flags), "hash": "fnv1a-fmix64/window-v1",
            "ngrams": int(n_unique), "bucket_bits": b, "fingerprint_bits": fingerprint_bits,
            "offsets_dtype": off_dtype, "fingerprints_dtype": fp_dtype,
            "fp_rate_per_ngram": fp_rate,
            "documents": int(docs), "texts": int(texts), "bytes": int(nbytes),
            "text_fields": list(text_fields) if text_fields else None,
        }
        (stage_dir / "index.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        _publish(stage_dir, out_path, local_out)
        return IndexInfo(out_path, ngram, flags, n_unique, b, fp_rate, docs, texts, nbytes, meta)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
    """Move the finished folder into place (atomic rename locally; upload for remote URLs)."""
    if local_out is not None:
        if local_out.exists():
            shutil.rmtree(local_out)
        os.replace(stage_dir, local_out)
        return
    fs, p = filesystem(out_path)
    try:
        for name in ("offsets.bin", "fingerprints.bin", "index.json"):  # metadata last
            fs.put(str(stage_dir / name), f"{p.rstrip('/')}/{name}")
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
