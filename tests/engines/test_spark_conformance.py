"""Conformance: the Spark engine writes byte-identical output (and identical accounting) to the local engine.

One synthetic log set (plain .zst parts plus a truncated .zst and a .gz file),
the quickstart-shaped pipeline with every node type (MapBatches with
quarantine and drop log, broadcast anti joins, aggregates, joins, connected
components), local engine vs Spark with 1, 2 and 7 partitions.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from datakit import Pipeline
from datakit.io.sinks import output_checksums
from tests.conformance import assert_conformant, spark_variants

pytestmark = pytest.mark.spark


def make_logs(root: Path, events: int = 160, seed: int = 3) -> Path:
    """Synthetic logs + an opt-out list, plus a truncated .zst part and a .gz part (same reader as local)."""
    import zstandard

    from datakit.synth.generator import generate

    logs = root / "logs"
    generate(logs, events=events, seed=seed, days=2, rows_per_part=50)
    more = root / "more"  # other events (unique ids) for the .gz and truncated parts
    generate(more, events=60, seed=seed + 1, days=1, rows_per_part=30)
    parts = sorted(more.glob("dt=*/*.jsonl.zst"))
    (logs / "dt=extra").mkdir()
    data = zstandard.ZstdDecompressor().decompressobj().decompress(parts[0].read_bytes())
    (logs / "dt=extra" / "more.jsonl.gz").write_bytes(gzip.compress(data, mtime=0))
    blob = parts[-1].read_bytes()
    (logs / "dt=extra" / "cut.jsonl.zst").write_bytes(blob[: len(blob) * 2 // 3])  # ends inside a frame
    return logs


def quickstart(logs: Path, out: Path) -> Pipeline:
    return (Pipeline("conformance", seed=5)
            .input([str(logs / "dt=*" / "*.jsonl.zst"), str(logs / "dt=*" / "*.jsonl.gz")])
            .add({"kind": "ingest"})
            .add({"kind": "consent", "optouts": str(logs / "optouts.parquet")})
            .add({"kind": "extract", "kinds": ["code", "fim", "sft", "preference"]})
            .add({"kind": "dedup", "exact": True, "minhash": {"threshold": 0.7, "num_perm": 32}})
            .output(str(out), shards=3))


def _sha(p: Path) -> str | None:
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None


def test_spark_output_is_byte_identical_to_local_for_1_2_7_partitions(spark, tmp_path):
    logs = make_logs(tmp_path)
    p = quickstart(logs, tmp_path / "out")
    sums = assert_conformant(p, tmp_path, variants=[("local", {"workers": 1})] + spark_variants((1, 2, 7)))
    assert len(sums) == 3
    outs = sorted(tmp_path.glob("conf-*"))
    ref = outs[0]
    run = json.loads((ref / "_run.json").read_text())
    by_name = {s["name"]: s for s in run["stages"]}
    # the input really exercises every accounting path
    assert by_name["ingest"]["dropped"].get("truncated_file") == 1
    assert by_name["dedup"]["dropped"].get("exact_duplicate", 0) > 0
    assert by_name["consent"]["dropped"]
    for o in outs[1:]:
        spark_run = json.loads((o / "_run.json").read_text())
        assert spark_run["engine"] == "spark"
        assert spark_run["output"]["rows"] == run["output"]["rows"]
        # side outputs are deterministic too: same quarantine and drop log bytes
        for side in ("_quarantine/part-00000.parquet", "_dropped/part-00000.parquet"):
            assert _sha(o / side) == _sha(ref / side), f"{side} of {o.name} differs"
        assert output_checksums(str(o)) == sums
