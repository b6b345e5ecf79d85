"""The Spark sink's part files (engines/spark_parts.py), without Spark: rows land in the shard the local
engine's rule gives them, a finished task's files are whole and listed, a failed one's are gone, and an
object-store target is staged locally and uploaded at close (moto S3 on loopback)."""
from __future__ import annotations

import os

import pyarrow as pa

from datakit.engines.spark_parts import PartsTarget, ShardPartWriter, parts_by_shard, read_part_tables
from datakit.io import sinks
from tests.test_object_store import s3_endpoint  # noqa: F401  (module fixture: moto on loopback)

SCHEMA = pa.schema([pa.field("doc_id", pa.string()), pa.field("n", pa.int64())])


def _batch(lo: int, hi: int) -> pa.RecordBatch:
    return pa.record_batch({"doc_id": [f"d{i}" for i in range(lo, hi)], "n": list(range(lo, hi))}, schema=SCHEMA)


def _write(target: PartsTarget, attempt: int) -> list[tuple[int, str, int]]:
    w = ShardPartWriter(target, SCHEMA, partition_id=0, attempt_id=attempt)
    w.write(_batch(0, 40))
    w.write(_batch(40, 100))
    return w.close()


def _check_routing(files: list[tuple[int, str, int]], shards: int) -> None:
    by_shard = parts_by_shard(files)
    seen = []
    for shard, urls in by_shard.items():
        table = pa.concat_tables(read_part_tables(urls))
        want = sinks.shard_ids(table.column("doc_id"), shards, "hash")
        assert set(want.tolist()) == {shard}  # every row is in the shard the local engine puts it in
        assert table.num_rows == sum(n for s, _, n in files if s == shard)
        seen += table.column("n").to_pylist()
    assert sorted(seen) == list(range(100))  # each row exactly once


def test_rows_go_to_their_shards_and_a_failed_attempt_leaves_nothing(tmp_path):
    target = PartsTarget(str(tmp_path / "parts"), "doc_id", 4, "hash")
    files = _write(target, attempt=7)
    assert {s for s, _, _ in files} == {0, 1, 2, 3} and all(url.endswith("part-00000-7.arrows") for _, url, _ in files)
    _check_routing(files, 4)
    failed = ShardPartWriter(target, SCHEMA, partition_id=1, attempt_id=8)
    failed.write(_batch(0, 50))
    failed.abandon()
    assert not list((tmp_path / "parts").glob("shard-*/part-00001-*"))


def test_an_object_store_target_is_staged_locally_and_uploaded_at_close(s3_endpoint, tmp_path, monkeypatch):  # noqa: F811
    import s3fs

    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}).mkdir("parts-bucket")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    target = PartsTarget("s3://parts-bucket/out/_work/spark-parts-x", "doc_id", 3, "hash")
    files = _write(target, attempt=1)
    assert all(url.startswith("s3://parts-bucket/out/_work/spark-parts-x/shard-") for _, url, _ in files)
    _check_routing(files, 3)
    assert not os.listdir(tmp_path / "tmp")  # the staging folder went with close()
    failed = ShardPartWriter(target, SCHEMA, partition_id=1, attempt_id=2)
    failed.write(_batch(0, 50))
    failed.abandon()  # nothing was uploaded, and the staging folder is gone
    assert not os.listdir(tmp_path / "tmp")
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    assert not [p for p in fs.find("parts-bucket/out") if "part-00001" in p]


def test_which_sinks_take_the_part_file_path():
    """Only a root chain with a known, modest shard count on shared storage: `shards: auto` needs the row
    count first, too many shards would mean too many open files per task, `memory://` is per process."""
    from types import SimpleNamespace

    from datakit.engines.spark import _Run
    from datakit.engines.spark_parts import MAX_PART_SHARDS

    root, other = SimpleNamespace(), SimpleNamespace()

    def target(shards, path="/data/out", node=root, key="doc_id"):
        run = _Run.__new__(_Run)
        run.token = "t0"
        run.plan = SimpleNamespace(root=root, sink=SimpleNamespace(shards=shards, key="doc_id", path=path,
                                                                   partition="hash"))
        return run._parts_target(node, pa.schema([pa.field(key, pa.string())]))

    assert target(4) == PartsTarget("/data/out/_work/spark-parts-t0", "doc_id", 4, "hash")
    assert target(MAX_PART_SHARDS) is not None
    for refused in (target(0), target("auto"), target(MAX_PART_SHARDS + 1), target(4, path="memory://out"),
                    target(4, node=other), target(4, key="other")):
        assert refused is None
