"""Conformance: the Spark engine writes byte-identical output (and identical accounting) to the local engine.

One synthetic log set (plain .zst parts plus a truncated .zst and a .gz file)
through the pipelines shipped in pipelines/: every node type (MapBatches with
quarantine and drop log, broadcast anti joins, aggregates, joins, connected
components) and both writers (packed, parquet). quickstart runs on Spark with
1, 2 and 7 partitions; the other pipelines (marked slow) with 3.
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


PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"


def shipped(name: str, logs: Path) -> Pipeline:
    """A pipeline from pipelines/ with its opt-out list pointed at our synthetic one (input/output are overridden)."""
    import yaml

    data = yaml.safe_load((PIPELINES / f"{name}.yaml").read_text())
    for st in data.get("stages", []):
        if st.get("kind") == "consent" and "optouts" in st:
            st["optouts"] = str(logs / "optouts.parquet")
    return Pipeline.from_dict(data, f"pipelines/{name}.yaml", base_dir=PIPELINES)


def _inputs(logs: Path) -> list[str]:
    return [str(logs / "dt=*" / "*.jsonl.zst"), str(logs / "dt=*" / "*.jsonl.gz")]


def _sha(p: Path) -> str | None:
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None


def test_shipped_quickstart_pipeline_is_byte_identical_for_1_2_7_partitions(spark, tmp_path):
    """pipelines/quickstart.yaml, every stage (pii, dedup with connected components, decontam, tokenize into
    packed shards), local engine vs Spark with 1, 2 and 7 partitions: same bytes, same counts. With 7, the
    components are found by large/small-star rounds instead of in one task (the graph is small)."""
    from datakit.engines.spark_partitions import ONE_TASK_CONF

    logs = make_logs(tmp_path, events=120)
    p = shipped("quickstart", logs)
    rounds = ("spark", {"partitions": 7, "conf": {ONE_TASK_CONF: 0}})
    sums = assert_conformant(p, tmp_path, variants=[("local", {"workers": 2})] + spark_variants((1, 2)) + [rounds],
                             input=_inputs(logs))
    assert sums
    outs = sorted(tmp_path.glob("conf-*"))
    ref = outs[0]
    run = json.loads((ref / "_run.json").read_text())
    by_name = {s["name"]: s for s in run["stages"]}
    # the input really exercises the accounting paths: quarantine, consent joins, dedup drops
    assert by_name["ingest"]["dropped"].get("truncated_file") == 1
    assert by_name["consent"]["dropped"]
    assert sum(by_name["dedup"]["dropped"].values()) > 0
    for o in outs[1:]:
        spark_run = json.loads((o / "_run.json").read_text())
        assert spark_run["engine"] == "spark"
        assert spark_run["output"]["rows"] == run["output"]["rows"]
        # side outputs are deterministic too: same quarantine and drop log bytes
        for side in ("_quarantine/part-00000.parquet", "_dropped/part-00000.parquet"):
            assert _sha(o / side) == _sha(ref / side), f"{side} of {o.name} differs"
        assert output_checksums(str(o)) == sums


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.stem for p in PIPELINES.glob("*.yaml") if p.stem != "quickstart"))
def test_every_shipped_pipeline_conforms(spark, tmp_path, name):
    logs = make_logs(tmp_path, events=120)
    assert assert_conformant(shipped(name, logs), tmp_path, variants=[("local", {"workers": 1})] + spark_variants((3,)),
                             input=_inputs(logs))


def test_rerun_into_the_same_folder_reuses_finished_shards(spark, tmp_path):
    """A scheduled job that is rerun (after a crash or by mistake) rewrites nothing it already finished."""
    logs = make_logs(tmp_path, events=60)
    p = (Pipeline("rerun").input(_inputs(logs)).add({"kind": "ingest"}).output(str(tmp_path / "out"), shards=3))
    first = p.run(engine="spark", partitions=2)
    before = output_checksums(str(tmp_path / "out"))
    second = p.run(engine="spark", partitions=3)
    assert first.extra["reused_shards"] == 0 and second.extra["reused_shards"] == 3
    assert output_checksums(str(tmp_path / "out")) == before
    assert json.loads((tmp_path / "out" / "_run.json").read_text())["output"]["reused_shards"] == 3


def test_bad_rows_are_quarantined_alike_on_spark(spark, tmp_path):
    """Parquet events with a foreign-schema file, a nested value where a string belongs, a `"false"`
    privacy flag, and JSON Lines with a blank line, a conflicting duplicate key and an event id read
    twice (in two files): Spark keeps,
    counts and quarantines exactly what the local engine does (the readers are shared)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datakit.contracts import EDITOR_EVENT_V1
    from tests.eventgen import make_event, write_jsonl

    names = [f.name for f in EDITOR_EVENT_V1 if not f.name.startswith("_")]
    evs = [make_event(i) for i in range(12)]
    schema = pa.schema([pa.field("privacy_mode", pa.string()) if n == "privacy_mode" else EDITOR_EVENT_V1.field(n)
                        for n in names])
    rows = [{n: (str(e[n]).lower() if n == "privacy_mode" and isinstance(e[n], bool) else e.get(n)) for n in names}
            for e in evs]
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "pq" / "a.parquet")
    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "pq" / "b.parquet")
    p = Pipeline("badpq").input(str(tmp_path / "pq"), format="parquet").add({"kind": "ingest"}).output("x", shards=2)
    variants = [("local", {"workers": 1}), ("spark", {"partitions": 2})]
    write_jsonl(tmp_path / "js" / "a.jsonl", [make_event(1), b"", json.dumps(make_event(2))[:-1] + ', "privacy_mode": true}'])
    write_jsonl(tmp_path / "js" / "b.jsonl", [make_event(3), make_event(1, suggestion="retried copy")])
    pj = Pipeline("badjs").input(str(tmp_path / "js")).add({"kind": "ingest"}).output("x", shards=2)
    for pipe, sub in ((p, "p"), (pj, "j")):
        (tmp_path / sub).mkdir()
        assert_conformant(pipe, tmp_path / sub, variants=variants)
        outs = sorted((tmp_path / sub).glob("conf-*"))
        assert (outs[0] / "_quarantine/part-00000.parquet").exists()
        assert _sha(outs[0] / "_quarantine/part-00000.parquet") == _sha(outs[1] / "_quarantine/part-00000.parquet")
    run = json.loads((sorted((tmp_path / "p").glob("conf-*"))[1] / "_run.json").read_text())
    assert run["stages"][0]["dropped"] == {"wrong_type": 12, "missing_field": 3}
    run = json.loads((sorted((tmp_path / "j").glob("conf-*"))[1] / "_run.json").read_text())
    assert run["stages"][0]["dropped"] == {"blank_line": 1, "duplicate_key": 1, "duplicate_event_id": 1}


def test_side_outputs_of_a_clean_rerun_leave_no_stale_file_on_spark(spark, tmp_path):
    """The side outputs are written by one query grouped by side; a side without rows in this run
    (a rerun over clean input into the same folder) removes the earlier run's file."""
    from tests.eventgen import make_event, write_jsonl

    write_jsonl(tmp_path / "bad" / "a.jsonl", [make_event(1), b"{broken", make_event(2)])
    write_jsonl(tmp_path / "clean" / "a.jsonl", [make_event(1), make_event(2)])
    out = tmp_path / "out"
    Pipeline("side").input(str(tmp_path / "bad")).add({"kind": "ingest"}).output(str(out), shards=2).run(
        engine="spark", partitions=2)
    assert (out / "_quarantine" / "part-00000.parquet").exists()
    Pipeline("side").input(str(tmp_path / "clean")).add({"kind": "ingest"}).output(str(out), shards=2).run(
        engine="spark", partitions=2)
    assert not (out / "_quarantine" / "part-00000.parquet").exists()
    assert json.loads((out / "_run.json").read_text())["stages"][0]["dropped"] == {}


@pytest.mark.parametrize("shards", [3, "auto"])
def test_a_root_chain_writes_known_shards_from_part_files(spark, tmp_path, monkeypatch, shards):
    """With an explicit shard count the root chain (here extract) routes its rows to per-shard part files
    and one task per shard writes each from them (engines/spark_parts.py), so the rows never enter the
    JVM; with "auto" the count needs the row total first and the rows take the general path (a shuffle by
    shard). Both: the local engine's bytes and counts, and no part folder left behind."""
    from datakit.engines import spark as spark_engine

    logs = make_logs(tmp_path, events=80)
    p = (Pipeline("parts").input(_inputs(logs)).add({"kind": "ingest"})
         .add({"kind": "extract", "kinds": ["code", "fim", "sft", "preference"]})
         .output(str(tmp_path / "unused"), shards=shards))
    paths = {"direct": 0, "shuffle": 0}
    listed: set[int] = set()
    real_parts, real_shuffle = spark_engine._Run._write_shard_parts, spark_engine.one_shard_per_partition

    def parts(run, *a):
        paths["direct"] += 1
        assert all("/_work/spark-parts-" in url for _, url, _ in run.part_files)
        listed.update(shard for shard, _, _ in run.part_files)
        return real_parts(run, *a)

    def shuffle(*a):
        paths["shuffle"] += 1
        return real_shuffle(*a)

    monkeypatch.setattr(spark_engine._Run, "_write_shard_parts", parts)
    monkeypatch.setattr(spark_engine, "one_shard_per_partition", shuffle)
    assert_conformant(p, tmp_path, variants=[("local", {"workers": 1})] + spark_variants((2,)))
    assert paths == ({"direct": 1, "shuffle": 0} if shards == 3 else {"direct": 0, "shuffle": 1})
    spark_out = sorted(tmp_path.glob("conf-*-spark"))[0]
    assert not (spark_out / "_work").exists()
    assert listed == ({0, 1, 2} if shards == 3 else set())  # every shard had rows: each was written from parts
