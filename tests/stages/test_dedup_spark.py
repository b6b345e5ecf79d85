"""The dedup stage on Spark: byte-identical output and accounting to the local engine (conformance).

One pipeline holds every hand-made graph shape (chain, star, cycle, exact copies,
unique docs), so one Spark run covers them all (a Spark run costs tens of seconds
on the shared 2-core machine).
"""
from __future__ import annotations

import json

import pytest

from datakit import Pipeline
from datakit.io.dataset import read_output
from tests.conformance import LOCAL_VARIANTS, assert_conformant, spark_variants
from tests.stages.test_dedup_stage import NEAR, rec, words, write_records

pytestmark = pytest.mark.spark


def graph_rows() -> list[dict]:
    return [
        rec("c1", words(0, 100)), rec("c2", words(10, 110)), rec("c3", words(20, 120)),  # chain
        rec("z", words(300, 400)),
        *[rec(f"s{i}", words(300, 400) + " " + " ".join(f"u{i}_{k}" for k in range(20))) for i in range(4)],  # star
        rec("y1", words(500, 600)), rec("y2", words(505, 605)), rec("y3", words(500, 595) + " " + words(601, 606)),
        rec("e1", words(700, 750)), rec("e0", words(700, 750) + "\n"),  # exact copies
        rec("q", words(1000, 1100)), rec("r", words(2000, 2100), kind="sft"),
        # doc_ids two records share (contract violations): t1's both near t0, u2's one unique
        rec("t0", words(3000, 3050)), rec("t1", words(3000, 3050) + " a"), rec("t1", words(3000, 3050) + " b"),
        rec("u1", words(5000, 5050)), rec("u2", words(5000, 5050) + " c"), rec("u2", words(9000, 9050)),
        # an exact group whose keeper (k1) is a near duplicate of k0: k2 names k0, the document that stays
        rec("k0", words(800, 900)), rec("k1", words(800, 899) + " zz"), rec("k2", words(800, 899) + " zz"),
    ]


@pytest.mark.parametrize("drop_rule", ["similar_to_kept", "component"])
def test_dedup_conformant_on_spark(spark, tmp_path, drop_rule):
    inp = write_records(tmp_path / "in", graph_rows(), files=3)
    p = (Pipeline("t").input(inp, format="parquet", schema="training_record.v1")
         .add({"kind": "dedup", "exact": True, "minhash": {**NEAR, "drop_rule": drop_rule}})
         .output(str(tmp_path / "unused"), shards=2))
    assert_conformant(p, tmp_path, variants=LOCAL_VARIANTS[:1] + spark_variants((2,)))
    kept = sorted(read_output(str(tmp_path / "conf-1-spark"), ["doc_id"]).column("doc_id").to_pylist())
    expected = ["c1", "c3", "e0", "k0", "q", "r", "s0", "s1", "s2", "s3", "t0", "u1", "u2", "u2", "y1"] \
        if drop_rule == "similar_to_kept" else ["c1", "e0", "k0", "q", "r", "s0", "t0", "u1", "y1"]
    assert kept == expected
    import pyarrow.parquet as pq

    dropped = {d["key"]: (d["reason"], d["detail"]) for d in pq.read_table(tmp_path / "conf-1-spark" / "_dropped").to_pylist()}
    assert dropped["k1"] == ("near_duplicate", "k0") and dropped["k2"] == ("exact_duplicate", "k0")
    # the counters (candidate pairs, cluster size histogram) agree too
    metrics = [json.loads((tmp_path / d / "_run.json").read_text())["stages"][0]["metrics"] for d in ("conf-0-local", "conf-1-spark")]
    assert metrics[0] == metrics[1] and metrics[0]["near_clusters"] == 6


def test_signature_verification_and_scope_all_conformant_on_spark(spark, tmp_path):
    """The other side relation: with `verify: signature` both ends of a pair are joined from the
    signature rows (which carry the exact key too), and `scope: all` salts no bucket."""
    inp = write_records(tmp_path / "in", graph_rows(), files=2)
    p = (Pipeline("t").input(inp, format="parquet", schema="training_record.v1")
         .add({"kind": "dedup", "exact": True, "scope": "all", "minhash": {**NEAR, "verify": "signature"}})
         .output(str(tmp_path / "unused"), shards=2))
    assert_conformant(p, tmp_path, variants=LOCAL_VARIANTS[:1] + spark_variants((2,)))
    st = json.loads((tmp_path / "conf-1-spark" / "_run.json").read_text())["stages"][0]
    assert st["dropped"]["exact_duplicate"] == 2 and st["dropped"]["near_duplicate"] >= 5
    assert st["metrics"]["verified_pairs"] < st["metrics"]["candidate_pairs"]
