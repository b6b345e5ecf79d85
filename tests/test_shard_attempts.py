"""Two attempts of one shard write (Spark speculation, a retried task, a stalled executor waking up)
never leave a mix: each file is one attempt's whole bytes, and the manifest's checksums hold.

Spark runs a straggler's speculative copy while the original may still be writing; the loser is
killed at any point. datakit's shard writes are safe for that because an attempt's bytes are a
function of the shard's rows only, and every file is written under a temporary name and renamed
into place (tests/engines/test_spark_packed_cluster.py does it for real with a SIGSTOPped executor).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pyarrow as pa

from datakit.io.atomic import sha256_file
from datakit.io.sinks import write_shard
from datakit.plan import SinkSpec

ROWS = 20_000


def _table(rows: int = ROWS) -> pa.Table:
    ids = [f"doc-{(i * 7919) % rows:06d}" for i in range(rows)]  # not in key order: the write sorts
    return pa.table({"doc_id": ids, "text": [f"def f{i}(x):\n    return x * {i}\n" * 3 for i in range(rows)]})


def _attempt(path: str, barrier, result: str) -> None:
    table = _table()
    barrier.wait()  # both attempts start writing the same shard at the same moment
    info = write_shard(table, 0, SinkSpec(path=path, format="parquet", shards=1))
    Path(result).write_text(json.dumps(info))


def _spec(path: Path) -> SinkSpec:
    return SinkSpec(path=str(path), format="parquet", shards=1)


def test_two_concurrent_attempts_of_one_shard_end_as_one_whole_shard(tmp_path):
    ctx = mp.get_context("spawn")
    out = tmp_path / "out"
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_attempt, args=(str(out), barrier, str(tmp_path / f"a{i}.json"))) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    a, b = (json.loads((tmp_path / f"a{i}.json").read_text()) for i in range(2))
    assert a["sha256"] == b["sha256"] and a["fingerprint"] == b["fingerprint"]
    on_disk = {f: sha256_file(str(out / f)) for f in a["files"]}
    assert on_disk == a["sha256"]  # whichever attempt's rename came last, the file is whole and the same
    sidecar = json.loads((out / "_shards" / "shard-00000.json").read_text())
    assert sidecar["sha256"] == on_disk
    assert not [p.name for p in out.rglob(".tmp-*")]
    # and the same as one attempt alone
    alone = write_shard(_table(), 0, _spec(tmp_path / "alone"))
    assert alone["sha256"] == a["sha256"]


def _slow_attempt(path: str) -> None:
    import datakit.io.sinks as sinks

    class Slow(sinks.pq.ParquetWriter):
        def write_table(self, table, *args, **kw):  # the loser is killed while its temporary file is being written
            super().write_table(table, *args, **kw)
            time.sleep(60)

    sinks.pq.ParquetWriter = Slow
    write_shard(_table(), 0, SinkSpec(path=path, format="parquet", shards=1))


def test_a_stuck_attempt_killed_mid_write_leaves_the_winners_shard_intact(tmp_path):
    """The original attempt is stuck inside its write; a speculative copy commits the shard; the original
    is then killed. The committed shard is the winner's, whole; a later retry reuses it."""
    out = tmp_path / "out"
    ctx = mp.get_context("spawn")
    loser = ctx.Process(target=_slow_attempt, args=(str(out),))
    loser.start()
    try:
        end = time.monotonic() + 120
        while not list(out.rglob(".tmp-part-*")) and time.monotonic() < end:
            time.sleep(0.05)
        assert list(out.rglob(".tmp-part-*")), "the stuck attempt never started writing"
        winner = write_shard(_table(), 0, _spec(out))
        assert not winner["reused"]
    finally:
        os.kill(loser.pid, signal.SIGKILL)
        loser.join(timeout=30)
    assert {f: sha256_file(str(out / f)) for f in winner["files"]} == winner["sha256"]
    assert json.loads((out / "_shards" / "shard-00000.json").read_text())["sha256"] == winner["sha256"]
    again = write_shard(_table(), 0, _spec(out))  # the retry after the kill: reuses the committed shard
    assert again["reused"] and again["sha256"] == winner["sha256"]
