"""Spark partitions from input size (issue 14): derived from the bytes read with a documented target,
overridable by the user, applied to the session while the run lasts, and never visible in the output."""
from __future__ import annotations

import math

import pytest

from datakit import Pipeline
from datakit.engines import spark as spark_engine
from datakit.engines.spark_partitions import (SHUFFLE_CONF, TARGET_CONF, TARGET_PARTITION_BYTES, parse_bytes,
                                              plan_partitions)
from datakit.io.sinks import output_checksums


def test_count_follows_input_size_with_the_cluster_as_floor():
    assert plan_partitions(10 << 20, parallelism=8).n == 8  # small input: one slice per core
    tb = 10 << 40  # 10 TiB of .zst logs
    p = plan_partitions(tb, parallelism=400)
    assert (p.n, p.source) == (math.ceil(tb / TARGET_PARTITION_BYTES), "input size") == (163840, "input size")
    assert plan_partitions(1 << 30, 2, user_conf={TARGET_CONF: "256m"}).n == 4


def test_what_the_user_says_wins():
    assert plan_partitions(1 << 40, 2, explicit=7).report()["partitions"] == 7
    p = plan_partitions(1 << 40, 2, user_conf={SHUFFLE_CONF: "12"})
    assert (p.n, p.source) == (12, SHUFFLE_CONF)
    assert plan_partitions(1 << 40, 2, explicit=3, user_conf={SHUFFLE_CONF: "12"}).source == "--partitions"
    for bad in ({SHUFFLE_CONF: "0"}, {SHUFFLE_CONF: "many"}, {TARGET_CONF: "-1m"}, {TARGET_CONF: "lots"}):
        with pytest.raises(ValueError, match="spark\\."):
            plan_partitions(1, 2, user_conf=bad)
    assert parse_bytes("64MiB") == parse_bytes("64m") == 64 << 20 and parse_bytes("1g") == 1 << 30


def test_components_one_task_setting_is_checked_before_any_session():
    from datakit.engines.spark import SparkEngine
    from datakit.engines.spark_partitions import ONE_TASK_CONF, ONE_TASK_MAX_EDGES, one_task_max_edges

    assert (one_task_max_edges(None), one_task_max_edges("0"), one_task_max_edges(5)) == (ONE_TASK_MAX_EDGES, 0, 5)
    for bad in ("-1", "lots"):
        with pytest.raises(ValueError, match=ONE_TASK_CONF):
            SparkEngine(conf={ONE_TASK_CONF: bad})


PIPELINE = {"name": "parts", "seed": 1,
            "stages": [{"kind": "ingest"}, {"kind": "extract", "kinds": ["code", "sft"]},
                       {"kind": "dedup", "exact": True},
                       {"kind": "tokenize", "tokenizer": "datakit:demo-bpe", "seq_len": 256, "packing": "best_fit"}],
            "output": {"path": "out", "format": "packed", "shards": 2}}


@pytest.mark.spark
def test_derived_count_is_applied_and_output_does_not_depend_on_it(spark, tmp_path, monkeypatch):
    from tests.engines.test_spark_conformance import make_logs

    logs = make_logs(tmp_path, events=40)
    files = sorted(logs.glob("dt=*/*.jsonl.zst"))
    size = sum(f.stat().st_size for f in files)
    target = size // 3 + 1  # three partitions' worth: more than the two cores, few tasks (lean)
    seen: list[str] = []
    enter = spark_engine._runtime_conf.__enter__

    def spy(self):  # what the session really had while the run's jobs ran (the sink nests one more)
        enter(self)
        seen.append((self.spark.conf.get(SHUFFLE_CONF), self.spark.conf.get(spark_engine.LEAF_PARALLELISM)))

    monkeypatch.setattr(spark_engine._runtime_conf, "__enter__", spy)
    before = spark.conf.get(SHUFFLE_CONF)
    p = Pipeline.from_dict({**PIPELINE, "input": {"path": [str(f) for f in files]}}, "parts.yaml", base_dir=tmp_path)
    try:
        by_size = p.run(engine="spark", conf={TARGET_CONF: str(target)}, output=str(tmp_path / "by-size"))
    finally:
        spark.conf.set(SHUFFLE_CONF, before)
        spark.conf.unset(TARGET_CONF)
    want = math.ceil(size / target)
    assert want > spark.sparkContext.defaultParallelism  # the input size, not the core count, decided
    assert (by_size.extra["partitions"], by_size.extra["partitions_from"]) == (want, "input size")
    # shuffles and the input's read tasks (a local relation's scan) both follow the derived count
    assert seen[0] == (str(want), str(want)) and {sh for sh, _ in seen} == {str(want)}
    # the files themselves: one task each when there are more of them than partitions (up to 4 per core)
    reads = max(want, min(len(files), 4 * spark.sparkContext.defaultParallelism))
    assert by_size.extra["read_tasks"] == reads and (str(want), str(reads)) in seen
    assert by_size.extra["input_bytes"] == size
    # the bytes are the local engine's (which has no partitions at all); 1, 2 and 7 partitions:
    # test_spark_conformance.py
    p.run(engine="local", workers=1, output=str(tmp_path / "local"))
    assert output_checksums(str(tmp_path / "by-size")) == output_checksums(str(tmp_path / "local"))
    assert by_size.manifest["rows"] > 0


@pytest.mark.spark
def test_user_settings_are_read_from_conf_and_not_from_our_session_defaults(spark, events_file, tmp_path):
    from datakit.engines.spark import SparkEngine

    assert spark.conf.get(SHUFFLE_CONF)  # our session sets a default: it must not count as the user's
    assert SparkEngine()._user_conf(spark) == {}
    assert SparkEngine(conf={SHUFFLE_CONF: 1, TARGET_CONF: "8m"})._user_conf(spark) == {SHUFFLE_CONF: "1",
                                                                                         TARGET_CONF: "8m"}
    with pytest.raises(ValueError, match=SHUFFLE_CONF):  # before the session is touched
        Pipeline.from_dict({**PIPELINE, "input": {"path": str(events_file)}}, "p.yaml").run(
            engine="spark", conf={SHUFFLE_CONF: "zero"}, output=str(tmp_path / "never"))
    assert not (tmp_path / "never" / "manifest.json").exists()
    assert spark.conf.get(SHUFFLE_CONF) != "zero"


def test_few_files_are_read_one_per_task_up_to_four_per_core():
    from datakit.engines.spark_partitions import read_tasks

    small = plan_partitions(60 << 20, parallelism=2)  # n = 2
    assert read_tasks(3, small, 2) == 3  # three files: one task each, not 1 + 2 consecutive files
    assert read_tasks(1, small, 2) == 2 and read_tasks(1000, small, 2) == 8  # floor n; at most 4 per core
    big = plan_partitions(10 << 40, parallelism=400)
    assert read_tasks(50, big, 400) == big.n  # the size-derived count already exceeds the files
    assert read_tasks(3, plan_partitions(60 << 20, 2, explicit=2), 2) == 2  # --partitions is exact
