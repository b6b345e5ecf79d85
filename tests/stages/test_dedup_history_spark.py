"""Dedup against history on Spark: the same snapshot bytes, drops and counts as the local engine.

Lean: day 1 is written once (local) and copied; only day 2, the one that joins the history state,
runs on both engines (one Spark run)."""
from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from tests.test_snapshots import DAY1, DAY2, day_pipeline

pytestmark = pytest.mark.spark


def test_history_dedup_local_equals_spark(spark, tmp_path):
    day_pipeline(tmp_path, "2026-11-01", DAY1, out="local").run(workers=1)
    shutil.copytree(tmp_path / "local", tmp_path / "spark")
    res = {}
    for engine, opts in (("local", {"workers": 2}), ("spark", {"partitions": 2})):
        res[engine] = day_pipeline(tmp_path, "2026-11-02", DAY2, out=engine).run(engine=engine, **opts)
    snap = "_snapshots/dt=2026-11-02"
    # _dropped_state: the band keys of the dropped near duplicates (b2 of history, f2 within the day)
    for rel in ("data/part-00000.parquet", "_dropped_state/part-00000.parquet", "_dedup_state/exact.parquet",
                "_dedup_state/bands.parquet", "_dedup_state/signatures.parquet", "_dedup_state/texts.parquet"):
        assert (tmp_path / "local" / snap / rel).read_bytes() == (tmp_path / "spark" / snap / rel).read_bytes(), rel
    drops = [sorted(map(str, pq.read_table(tmp_path / e / snap / "_dropped").to_pylist())) for e in ("local", "spark")]
    assert drops[0] == drops[1] and len(drops[0]) == 3
    state = pq.read_table(tmp_path / "spark" / snap / "_dropped_state").to_pylist()
    assert sorted(r["key"] for r in state) == ["b2", "f2"]
    counts = [[(s["name"], s["rows_in"], s["rows_out"], s["dropped"]) for s in res[e].stages] for e in ("local", "spark")]
    assert counts[0] == counts[1]
    assert counts[0][0][3] == {"exact_duplicate_of_history": 1, "near_duplicate_of_history": 1, "near_duplicate": 1}
