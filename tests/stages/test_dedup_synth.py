"""End to end on synthetic editor logs: every planted exact and near duplicate is removed, nothing else is.

The synth generator plants exact copies and near copies (forks, copy-edits,
reformats) of code files and records each pair in its ground truth; extract turns
the accepted tab completions into `code` records (doc ids via `record_doc_id`).
"""
from __future__ import annotations

import pyarrow.parquet as pq

from datakit import Pipeline
from datakit.io.dataset import read_output
from datakit.synth import generate, read_ground_truth, record_doc_id


def test_planted_duplicates_removed_and_nothing_else(tmp_path):
    generate(tmp_path / "logs", events=3000, seed=1, plant_scale=10)
    p = (Pipeline("s").input(str(tmp_path / "logs")).add({"kind": "ingest"}).add({"kind": "extract", "kinds": ["code"]})
         .add({"kind": "dedup", "exact": True, "minhash": {"threshold": 0.8}}).output(str(tmp_path / "out")))
    res = p.run(workers=1)
    kept = set(read_output(str(tmp_path / "out"), ["doc_id"]).column("doc_id").to_pylist())
    log = pq.read_table(tmp_path / "out" / "_dropped" / "part-00000.parquet").to_pylist()
    removed = {r["key"] for r in log if r["stage"] == "dedup"}
    st = res.stage("dedup")
    assert st["rows_in"] == st["rows_out"] + sum(st["dropped"].values())
    assert len(removed) == sum(st["dropped"].values())  # the drop log names every removed record

    pairs = []
    for r in read_ground_truth(tmp_path / "logs"):
        if r["kind"] == "exact_dup":
            pairs.append(tuple(record_doc_id(e, "code") for e in r["event_ids"]) + (1.0,))
        elif r["kind"] == "near_dup":
            pairs.append((record_doc_id(r["event_id_a"], "code"), record_doc_id(r["event_id_b"], "code"), r["jaccard"]))
    assert len(pairs) > 100
    planted = set()
    for a, b, jac in pairs:
        assert {a, b} <= kept | removed  # both records made it to the dedup stage
        planted |= {a, b}
        if jac >= 0.8:  # the ground truth's own (\w+ 5-gram) Jaccard
            assert (a in removed) != (b in removed), (a, b, jac)
            assert max(a, b) in removed  # the smallest doc_id is the one kept
    assert removed <= planted  # no unique document was removed
