"""Dedup against history on Spark: the same snapshot bytes, drops and counts as the local engine.

Lean: day 1 is written once (local) and copied; only day 2, the one that looks up the history state,
runs on both engines (one Spark run). Day 2 holds every kind of drop: an exact copy of a day-1
document, a near copy (B ~ A), a document that reaches A only through B on the same day (C), and a
within-day near pair; the settings (CHAIN) make C share no LSH bucket with A."""
from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from tests.stages.test_dedup_stage import words
from tests.test_snapshots import A_TXT, B_TXT, C_TXT, CHAIN, day_pipeline, urec

pytestmark = pytest.mark.spark

DAY1 = [urec("a1", A_TXT, "u1"), urec("x1", "def f():\n    return 1\n", "u1")]
DAY2 = [urec("b2", B_TXT, "u2"), urec("c2", C_TXT, "u3"), urec("x2", "def f():\n    return 1\n", "u2"),
        urec("e2", words(1000, 1100), "u4"), urec("f2", words(1001, 1100), "u4")]


def test_history_dedup_local_equals_spark(spark, tmp_path):
    day_pipeline(tmp_path, "2026-11-01", DAY1, stages=(CHAIN,), out="local").run(workers=1)
    shutil.copytree(tmp_path / "local", tmp_path / "spark")
    res = {}
    for engine, opts in (("local", {"workers": 2}), ("spark", {"partitions": 2})):
        res[engine] = day_pipeline(tmp_path, "2026-11-02", DAY2, stages=(CHAIN,), out=engine).run(engine=engine, **opts)
    snap = "_snapshots/dt=2026-11-02"
    # _dropped_state: the band keys of the dropped near duplicates (b2, c2 of history; f2 within the day)
    for rel in ("data/part-00000.parquet", "_dropped_state/part-00000.parquet", "_dedup_state/exact.parquet",
                "_dedup_state/bands.parquet", "_dedup_state/signatures.parquet", "_dedup_state/texts.parquet"):
        assert (tmp_path / "local" / snap / rel).read_bytes() == (tmp_path / "spark" / snap / rel).read_bytes(), rel
    drops = [sorted(map(str, pq.read_table(tmp_path / e / snap / "_dropped").to_pylist())) for e in ("local", "spark")]
    assert drops[0] == drops[1] and len(drops[0]) == 4
    state = pq.read_table(tmp_path / "spark" / snap / "_dropped_state").to_pylist()
    assert sorted(r["key"] for r in state) == ["b2", "c2", "f2"]
    counts = [[(s["name"], s["rows_in"], s["rows_out"], s["dropped"]) for s in res[e].stages] for e in ("local", "spark")]
    assert counts[0] == counts[1]
    assert counts[0][0][3] == {"exact_duplicate_of_history": 1, "near_duplicate_of_history": 2, "near_duplicate": 1}
