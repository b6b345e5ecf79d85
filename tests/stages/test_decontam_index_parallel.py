"""The n-gram index build (a plan on the engines): same bytes for any worker count, on Spark too,
and failures leave nothing.

The reference is a frozen copy of the single-process `build_index` as it was
before the build went parallel (commit 31f07a4): every new path is compared
byte for byte against it (and test_decontam_index_golden.py pins the digests).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit.contracts import TRAINING_RECORD_V1
from datakit.io.fs import InputError
from datakit.stages.decontaminate.check import check
from datakit.indexing import build_index
from datakit.stages.decontaminate.index import (FP_BITS, INDEX_FORMAT, INDEX_VERSION, IndexBuildError, IndexInfo,
                                                _bucket_bits, _local_target, publish)
from datakit.stages.decontaminate.ngrams import hash_strings
from datakit.stages.decontaminate.normalize import DEFAULT_NORMALIZATIONS, flags_of, names_of
from tests.support.plant import idiomatic_code, plant
from tests.stages.test_decontam import he_rows, humaneval, record  # noqa: F401  (fixtures)

FILES = ("index.json", "offsets.bin", "fingerprints.bin")


# -- the pre-parallel implementation, frozen --------------------------------------------------------

def reference_build_index(dataset_path: str | Sequence[str], out_path: str, ngram: int = 13,
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
    from datakit.stages.decontaminate.check import iter_text_batches, packed_batches  # shared readers
    from datakit.io.records import is_packed

    flags = flags_of(normalization)
    tmp = Path(tempfile.mkdtemp(prefix="dk-ngram-index-"))
    try:
        parts = [open(tmp / f"part-{p:02d}.u64", "wb") for p in range(1 << 4)]
        total = docs = texts = nbytes = 0
        try:
            if isinstance(dataset_path, str) and is_packed(dataset_path):
                batches = packed_batches(dataset_path, batch_rows)  # decoded with its own tokenizer
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
                    part = (h >> np.uint64(64 - 4)).astype(np.uint8)
                    order = np.argsort(part, kind="stable")  # radix sort for uint8: O(n)
                    hs, ps = h[order], part[order]
                    cuts = np.searchsorted(ps, np.arange((1 << 4) + 1))
                    for p in range(1 << 4):
                        if cuts[p + 1] > cuts[p]:
                            parts[p].write(hs[cuts[p]:cuts[p + 1]].tobytes())
        finally:
            for f in parts:
                f.close()
        b = _bucket_bits(total)
        local_out = _local_target(out_path)
        local_out.parent.mkdir(parents=True, exist_ok=True)
        stage_dir = Path(tempfile.mkdtemp(prefix=".tmp-index-", dir=str(local_out.parent) if local_out else None))
        n_unique = 0
        counts = np.zeros(1 << b, dtype=np.int64)
        with open(stage_dir / "fingerprints.bin", "wb") as fp_out:
            for p in range(1 << 4):
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
            "ngram": int(ngram), "normalizations": names_of(flags), "hash": "fnv1a-fmix64/window-v1", "lexer": 2, "json_lists": "elements", "generic_text": "every",
            "ngrams": int(n_unique), "bucket_bits": b, "fingerprint_bits": fingerprint_bits,
            "offsets_dtype": off_dtype, "fingerprints_dtype": fp_dtype,
            "fp_rate_per_ngram": fp_rate,
            "documents": int(docs), "texts": int(texts), "bytes": int(nbytes),
            "text_fields": list(text_fields) if text_fields else None,
        }
        (stage_dir / "index.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        publish(str(stage_dir), out_path)
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




# -- fixtures -----------------------------------------------------------------------------------

def _bytes(path: Path) -> dict[str, bytes]:
    return {f: (path / f).read_bytes() for f in FILES}


def _corrupt_pages(path: Path) -> None:
    """Flip bytes in the middle of a Parquet file's data: the footer stays readable, a page does not."""
    import struct

    b = bytearray(path.read_bytes())
    data_end = len(b) - 8 - struct.unpack("<i", b[-8:-4])[0]
    for i in range(data_end // 2, data_end // 2 + 256):
        b[i] ^= 0xFF
    path.write_bytes(bytes(b))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, he_rows):  # noqa: F811
    """Three Parquet files of small row groups (so 2-3 workers split them by row group) + one JSONL file;
    idiomatic code with 8 planted HumanEval leaks."""
    rng = random.Random(7)
    root = tmp_path_factory.mktemp("pcorpus")
    rows = [record(f"c{i:04d}", idiomatic_code(rng, 5)) for i in range(300)]
    for j, i in enumerate(range(5, 160, 20)):
        rows.append(record(f"leak{i:03d}", idiomatic_code(rng, 2) + plant(he_rows[i], ("exact", "reformatted")[j % 2], rng)))
    rows.sort(key=lambda r: r["doc_id"])
    t = pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1)
    for k, (a, n) in enumerate([(0, 120), (120, 100), (220, 50)]):
        pq.write_table(t.slice(a, n), str(root / f"part-{k:05d}.parquet"), row_group_size=16)
    with open(root / "part-00003.jsonl", "w") as f:
        for r in t.slice(270).to_pylist():
            f.write(json.dumps(r) + "\n")
    return root


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    """The index as the pre-parallel implementation wrote it."""
    out = tmp_path_factory.mktemp("ref") / "idx"
    reference_build_index(str(corpus), str(out), 13, ["whitespace", "case"])
    return out


# -- local -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 2, 3])
def test_same_bytes_for_any_worker_count_and_as_before(corpus, reference, tmp_path, workers):
    from datakit.stages.decontaminate.index import plan_units

    info = build_index(str(corpus), str(tmp_path / "idx"), 13, ["whitespace", "case"], workers=workers)
    assert _bytes(tmp_path / "idx") == _bytes(reference)
    assert info.documents == 308 and info.ngrams > 10_000
    units = plan_units(str(corpus), 4 * workers)
    if workers > 1:  # the input really was cut below file level, so tasks saw row-group slices
        assert any(first >= 0 for _, first, _, _ in units) and len(units) > 4
    else:
        assert [first for _, first, _, _ in units] == [-1] * 4


def test_16_bit_fingerprints_keep_the_bytes(corpus, tmp_path):
    ref = tmp_path / "ref16"
    reference_build_index(str(corpus), str(ref), 8, ["whitespace"], fingerprint_bits=16)
    build_index(str(corpus), str(tmp_path / "idx"), 8, ["whitespace"], fingerprint_bits=16, workers=2)
    assert _bytes(tmp_path / "idx") == _bytes(ref)
    other = tmp_path / "other"  # a different setting must give different bytes (the comparison can fail)
    build_index(str(corpus), str(other), 8, ["whitespace", "case"], fingerprint_bits=16, workers=1)
    assert _bytes(other)["fingerprints.bin"] != _bytes(ref)["fingerprints.bin"]


@pytest.mark.parametrize("bits", [1, 8])
def test_other_partition_counts_keep_the_bytes(corpus, reference, tmp_path, bits):
    build_index(str(corpus), str(tmp_path / "idx"), 13, ["whitespace", "case"], workers=2, partition_bits=bits)
    assert _bytes(tmp_path / "idx") == _bytes(reference)


def test_big_files_cut_by_row_groups_and_many_rows_per_partition_keep_the_bytes(corpus, reference, tmp_path,
                                                                               monkeypatch):
    """A file over UNIT_BYTES is cut by row groups even with few tasks; a partition's hashes split over
    many rows: still the reference bytes."""
    from datakit.stages.decontaminate import index

    monkeypatch.setattr(index, "UNIT_BYTES", 4096)
    monkeypatch.setattr(index, "ROW_HASHES", 100)
    units = index.plan_units(str(corpus), 1)
    assert sum(1 for u in units if u[1] >= 0) > 6 and any(u[1] < 0 for u in units)  # the JSONL file stays whole
    build_index(str(corpus), str(tmp_path / "idx"), 13, ["whitespace", "case"], workers=1)
    assert _bytes(tmp_path / "idx") == _bytes(reference)


def test_partitions_narrower_than_a_bucket_tiny_data(tmp_path):
    """A handful of n-grams: bucket_bits is 4, below 6 partition bits, so partitions share buckets."""
    pq.write_table(pa.table({"text": ["a b c d e f", "g h i j", "", "a b c x y z"]}), str(tmp_path / "t.parquet"))
    reference_build_index(str(tmp_path / "t.parquet"), str(tmp_path / "ref"), 3, ["whitespace"])
    info = build_index(str(tmp_path / "t.parquet"), str(tmp_path / "idx"), 3, ["whitespace"], workers=1,
                       partition_bits=6)
    assert info.bucket_bits == 4 and info.ngrams == 9 and info.texts == 4  # "a b c" twice: stored once
    assert _bytes(tmp_path / "idx") == _bytes(tmp_path / "ref")
    with pytest.raises(ValueError, match="partition_bits"):
        build_index(str(tmp_path / "t.parquet"), str(tmp_path / "bad"), 3, ["whitespace"], partition_bits=13)


def test_fingerprinter_fed_in_chunks_equals_one_array():
    """Two distinct hashes sharing bucket + fingerprint bits across a chunk boundary are stored once."""
    from datakit.stages.decontaminate.index import Fingerprinter

    rng = np.random.default_rng(1)
    b = 10
    h = np.unique(rng.integers(0, 2**60, 5000, dtype=np.uint64))  # partition 0 of 4 bits: top 4 bits zero
    twin = np.uint64(h[2500] | np.uint64(1))  # same top b+32 bits as h[2500], differs only at the bottom
    h = np.unique(np.concatenate([h, [twin]]))
    cut = int(np.searchsorted(h, twin))  # the pair straddles the chunk boundary
    whole = Fingerprinter(0, 4, b, 32)
    one = whole.add(h)
    parts = Fingerprinter(0, 4, b, 32)
    pieces = np.concatenate([parts.add(h[:cut]), parts.add(h[cut:cut]), parts.add(h[cut:])])
    assert np.array_equal(one, pieces) and np.array_equal(whole.counts, parts.counts)
    assert whole.entries == parts.entries == len(h) - 1  # the twin pair counted once
    assert whole.counts.sum() == whole.entries and len(whole.counts) == 1 << (b - 4)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_task_is_a_clear_error_and_publishes_nothing(corpus, tmp_path, workers):
    ds = tmp_path / "ds"
    shutil.copytree(corpus, ds)
    out = tmp_path / "idx"
    build_index(str(ds), str(out), 13, ["whitespace", "case"], workers=1)
    before = _bytes(out)
    pq.write_table(pa.table({"doc_id": [str(i) for i in range(60)], "text": [f"x{i} " * 400 for i in range(60)]}),
                   str(ds / "part-00009.parquet"), compression="zstd")
    _corrupt_pages(ds / "part-00009.parquet")
    with pytest.raises(IndexBuildError, match=r"failed while reading .*part-00009\.parquet.*OSError"):
        build_index(str(ds), str(out), 13, ["whitespace", "case"], workers=workers)
    assert _bytes(out) == before  # the previous index is untouched, not half replaced
    with pytest.raises(IndexBuildError):
        build_index(str(ds), str(tmp_path / "fresh"), 13, ["whitespace", "case"], workers=workers)
    assert not (tmp_path / "fresh").exists()
    assert not list(tmp_path.glob(".tmp-index-*"))
    (ds / "part-00009.parquet").unlink()
    with pytest.raises(InputError, match="no column nope"):  # raised inside a task: still the usage error
        build_index(str(ds), str(tmp_path / "fresh"), 13, ["whitespace", "case"], text_fields=["nope"],
                    workers=workers)
    (ds / "part-00009.parquet").write_bytes(b"not parquet at all")  # unreadable input stays a usage error
    with pytest.raises(InputError, match="cannot read Parquet file"):
        build_index(str(ds), str(tmp_path / "fresh"), 13, ["whitespace", "case"], workers=workers)
    assert not (tmp_path / "fresh").exists()


def test_contamination_check_results_unchanged(corpus, reference, tmp_path, humaneval):  # noqa: F811
    build_index(str(corpus), str(tmp_path / "idx"), 13, ["whitespace", "case"], workers=2)
    for rule in (0.0, None):
        new = check(str(tmp_path / "idx"), [humaneval], min_fraction=rule).evals[0]
        old = check(str(reference), [humaneval], min_fraction=rule).evals[0]
        assert [(i.eval_id, i.ngrams_matched) for i in new.contaminated] == \
            [(i.eval_id, i.ngrams_matched) for i in old.contaminated]
    scan = check(str(corpus), [humaneval], use_index=False, min_fraction=0.0).evals[0]
    found = {i.eval_id for i in check(str(tmp_path / "idx"), [humaneval], min_fraction=0.0).evals[0].contaminated}
    assert found == {i.eval_id for i in scan.contaminated} and len(found) >= 6  # the planted leaks


def test_cli_workers_option(corpus, reference, tmp_path):
    import typer
    from typer.testing import CliRunner

    from datakit.cli.contamination import build_index_command

    app = typer.Typer()
    app.command()(build_index_command)
    runner = CliRunner()
    r = runner.invoke(app, [str(corpus), "--out", str(tmp_path / "idx"), "--workers", "2"])
    assert r.exit_code == 0, r.output
    assert "indexed 308 documents" in r.output and _bytes(tmp_path / "idx") == _bytes(reference)
    r = runner.invoke(app, [str(corpus), "--out", str(tmp_path / "idx2"), "--workers", "0"])
    assert r.exit_code == 2 and not (tmp_path / "idx2").exists()
    r = runner.invoke(app, [str(corpus), "--out", str(tmp_path / "idx2"), "--engine", "flink"])
    assert r.exit_code == 2 and "unknown engine 'flink'" in (r.stderr or r.output) and not (tmp_path / "idx2").exists()
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"text": [f"y{i} " * 300 for i in range(50)]}), str(bad / "a.parquet"), compression="zstd")
    _corrupt_pages(bad / "a.parquet")
    r = runner.invoke(app, [str(bad), "--out", str(tmp_path / "idx3"), "--workers", "1"])
    assert r.exit_code == 3 and not (tmp_path / "idx3").exists()
    err = (r.stderr or r.output).strip()
    assert err.startswith("datakit: error: n-gram index build failed while reading") and "\n" not in err


# -- Spark (the shared local[2] session) --------------------------------------------------------------

def test_spark_build_equals_local_bytes(spark, corpus, reference, tmp_path):
    """The same plan on the Spark engine (32 partitions): the same bytes; a broken file is one error."""
    from datakit.engines.spark_session import SparkJobError

    info = build_index(str(corpus), str(tmp_path / "idx"), 13, ["whitespace", "case"], engine="spark",
                       partition_bits=5)
    assert _bytes(tmp_path / "idx") == _bytes(reference) and info.documents == 308
    assert not list(tmp_path.glob(".tmp-index*"))  # the shared work folder is gone
    bad = tmp_path / "bad"
    shutil.copytree(corpus, bad)
    pq.write_table(pa.table({"text": [f"y{i} " * 300 for i in range(50)]}), str(bad / "part-00009.parquet"),
                   compression="zstd")
    _corrupt_pages(bad / "part-00009.parquet")
    with pytest.raises(SparkJobError, match=r"part-00009\.parquet"):
        build_index(str(bad), str(tmp_path / "idx"), 13, ["whitespace", "case"], engine="spark")
    assert _bytes(tmp_path / "idx") == _bytes(reference)  # the earlier index is untouched
    assert not list(tmp_path.glob(".tmp-index*"))


def test_a_spark_pipeline_builds_its_index_on_spark(spark, tmp_path):
    """`output.index` after a Spark run: the index plan runs on Spark, with the local run's bytes."""
    from datakit import Pipeline
    from tests.stages.test_decontam import record

    rng = random.Random(5)
    src = tmp_path / "r.parquet"
    pq.write_table(pa.Table.from_pylist([record(f"d{i}", idiomatic_code(rng, 2)) for i in range(20)],
                                        schema=TRAINING_RECORD_V1), src)
    runs = {}
    for engine in ("spark", "local"):
        out = tmp_path / engine
        res = (Pipeline("idx").input(str(src), format="parquet", schema="training_record.v1")
               .output(str(out), index=True).run(engine=engine, **({"workers": 1} if engine == "local" else {})))
        assert res.extra["index"]["engine"] == engine
        runs[engine] = _bytes(out / "_ngram_index")
    assert runs["spark"] == runs["local"] and json.loads(runs["spark"]["index.json"])["documents"] == 20


def test_a_failed_upload_to_an_object_store_leaves_no_mix_of_old_and_new(tmp_path, monkeypatch):
    """Found in review: the upload overwrote the old data files first, so a failure left old metadata over
    new data. Now the old metadata goes first: a reader sees "not an index", never a corrupt mix."""
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datakit.io.fs import InputError
    from datakit.stages.decontaminate.index import NgramIndex

    texts = [f"def f{i}(x):\n    return x * {i} + some_other_name_{i} - yet_another thing {i}" for i in range(50)]
    pq.write_table(pa.table({"doc_id": [str(i) for i in range(50)], "text": texts}), tmp_path / "a.parquet")
    url = f"memory://idx-{tmp_path.name}"
    build_index(str(tmp_path / "a.parquet"), url, 5, ["whitespace"], text_fields=["text"], workers=1)
    assert NgramIndex(url).meta["ngram"] == 5
    fs = fsspec.filesystem("memory")
    real_put, calls = type(fs).put, [0]

    def failing_put(self, *a, **k):
        calls[0] += 1
        if calls[0] == 2:
            raise OSError("network down")
        return real_put(self, *a, **k)

    monkeypatch.setattr(type(fs), "put", failing_put)
    with pytest.raises(OSError):
        build_index(str(tmp_path / "a.parquet"), url, 8, ["whitespace"], text_fields=["text"], workers=1)
    monkeypatch.setattr(type(fs), "put", real_put)
    with pytest.raises(InputError, match="not an n-gram index"):
        NgramIndex(url)
    build_index(str(tmp_path / "a.parquet"), url, 8, ["whitespace"], text_fields=["text"], workers=1)
    assert NgramIndex(url).meta["ngram"] == 8
