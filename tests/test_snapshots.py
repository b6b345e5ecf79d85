"""Append-mode outputs (issue 17): a dataset of snapshots, dedup against its history, reruns, crashes."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit import Pipeline
from datakit.io.dataset import read_output
from datakit.io.fs import InputError
from datakit.io.snapshots import SnapshotError, derive_id
from tests.stages.test_dedup_stage import rec, words, write_records

NEAR = {"threshold": 0.8, "ngram": 1, "bands": 32, "rows": 4}
DEDUP = {"kind": "dedup", "exact": True, "minhash": NEAR}


def day_pipeline(tmp_path, day: str, rows: list[dict], stages=(DEDUP,), out="ds") -> Pipeline:
    inp = write_records(tmp_path / "logs" / f"dt={day}", rows)
    p = Pipeline("daily").input(inp, format="parquet", schema="training_record.v1")
    for s in stages:
        p.add(dict(s))
    return p.output(str(tmp_path / out), mode="append")


def run_day(tmp_path, day, rows, **kw):
    return day_pipeline(tmp_path, day, rows, **kw).run(workers=1)


def ids(path, **kw) -> list[str]:
    return read_output(str(path), ["doc_id"], **kw).column("doc_id").to_pylist()


def dropped(path, snapshot: str) -> dict[str, tuple[str, str]]:
    d = path / "_snapshots" / snapshot / "_dropped" / "part-00000.parquet"
    return {r["key"]: (r["reason"], r["detail"]) for r in pq.read_table(d).to_pylist()} if d.exists() else {}


def test_derive_snapshot_id():
    assert derive_id(["/logs/dt=2026-11-02/part-0.parquet", "/logs/dt=2026-11-02/part-1.parquet"]) == "dt=2026-11-02"
    assert derive_id(["s3://b/logs/year=2026/dt=2026-11-02/*.jsonl"]) == "dt=2026-11-02"
    with pytest.raises(SnapshotError, match="no partition folder"):
        derive_id(["/logs/today/part-0.parquet"])
    with pytest.raises(SnapshotError, match="span partitions"):
        derive_id(["/logs/dt=1/a.parquet", "/logs/dt=2/b.parquet"])
    # found in review: a pattern over every day was told it had "no partition folder"
    with pytest.raises(SnapshotError, match=r"spans every partition dt=\* matches; pass --snapshot ID"):
        derive_id(["/logs/dt=*/*.jsonl.zst"])


# day 1: four unique documents; day 2: an exact copy of a, a near copy of b (J=0.9), a within-day
# near pair, unique docs; day 3: copies of day-1 and day-2 documents and one more unique doc
DAY1 = [rec("a1", "def f():\n    return 1\n"), rec("b1", words(0, 100)), rec("c1", words(500, 600)),
        rec("d1", "print('unique day 1')\n")]
DAY2 = [rec("a2", "def f():\n    return 1\n"), rec("b2", words(5, 105)), rec("e2", words(1000, 1100)),
        rec("f2", words(1002, 1100)), rec("g2", "print('unique day 2')\n")]
DAY3 = [rec("a3", "def f():\n    return 1\n"), rec("e3", words(1001, 1100)), rec("c3", words(503, 600)),
        rec("h3", "print('unique day 3')\n")]


def test_three_days_drop_cross_day_duplicates(tmp_path):
    out = tmp_path / "ds"
    for day, rows in (("2026-11-01", DAY1), ("2026-11-02", DAY2), ("2026-11-03", DAY3)):
        res = run_day(tmp_path, day, rows)
        assert res.extra["snapshot"] == f"dt={day}"
    top = json.loads((out / "manifest.json").read_text())
    assert [s["id"] for s in top["snapshots"]] == ["dt=2026-11-01", "dt=2026-11-02", "dt=2026-11-03"]
    assert ids(out) == ["a1", "b1", "c1", "d1", "e2", "g2", "h3"]  # union in snapshot order
    assert ids(out, snapshot="dt=2026-11-02") == ["e2", "g2"]
    assert top["rows"] == 7
    d2 = dropped(out, "dt=2026-11-02")
    hist = lambda doc, snap: json.dumps({"doc_id": doc, "snapshot": snap}, sort_keys=True, separators=(",", ":"))  # noqa: E731
    assert d2 == {"a2": ("exact_duplicate_of_history", hist("a1", "dt=2026-11-01")),
                  "b2": ("near_duplicate_of_history", hist("b1", "dt=2026-11-01")),
                  "f2": ("near_duplicate", "e2")}
    d3 = dropped(out, "dt=2026-11-03")
    assert d3 == {"a3": ("exact_duplicate_of_history", hist("a1", "dt=2026-11-01")),
                  "c3": ("near_duplicate_of_history", hist("c1", "dt=2026-11-01")),
                  "e3": ("near_duplicate_of_history", hist("e2", "dt=2026-11-02"))}
    # the dataset card names every snapshot's data files; every file exists
    card = (out / "README.md").read_text()
    for s in top["shards"]:
        for f in s["files"]:
            assert f in card and (out / f).is_file()
    with pytest.raises(InputError, match="no snapshot"):
        read_output(str(out), snapshot="dt=1999-01-01")


def test_rerun_is_byte_identical_and_never_dedups_against_itself(tmp_path):
    out = tmp_path / "ds"
    run_day(tmp_path, "2026-11-01", DAY1)
    run_day(tmp_path, "2026-11-02", DAY2)
    run_day(tmp_path, "2026-11-03", DAY3)
    before = (out / "manifest.json").read_bytes()
    files = {f: (out / f).read_bytes() for s in json.loads(before)["shards"] for f in s["files"]}
    run_day(tmp_path, "2026-11-02", DAY2)  # a retried night, after later ones exist
    assert (out / "manifest.json").read_bytes() == before
    assert {f: (out / f).read_bytes() for f in files} == files
    assert ids(out, snapshot="dt=2026-11-02") == ["e2", "g2"]


def test_crash_mid_snapshot_leaves_previous_dataset_readable(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    run_day(tmp_path, "2026-11-01", DAY1)
    import datakit.stages.dedup.history as h

    real = h.write_state

    def boom(*a, **kw):
        raise RuntimeError("killed")

    monkeypatch.setattr(h, "write_state", boom)
    with pytest.raises(RuntimeError, match="killed"):
        run_day(tmp_path, "2026-11-02", DAY2)
    assert ids(out) == ["a1", "b1", "c1", "d1"]  # the union still is day 1, readable
    # a crashed *rerun* of day 1 withdraws it: readers see no half-rewritten files
    with pytest.raises(RuntimeError, match="killed"):
        run_day(tmp_path, "2026-11-01", DAY1)
    top = json.loads((out / "manifest.json").read_text())
    assert top["rows"] == 0 and top["snapshots"] == [] and top["withdrawn"][0]["id"] == "dt=2026-11-01"
    monkeypatch.setattr(h, "write_state", real)
    run_day(tmp_path, "2026-11-01", DAY1)
    run_day(tmp_path, "2026-11-02", DAY2)
    assert ids(out) == ["a1", "b1", "c1", "d1", "e2", "g2"]


def test_backfill_dedups_against_everything_committed_before(tmp_path):
    """Rule: a snapshot's history is every snapshot first committed before it; a late older day is
    appended after them and deduplicated against all of them."""
    out = tmp_path / "ds"
    run_day(tmp_path, "2026-11-01", DAY1)
    run_day(tmp_path, "2026-11-03", DAY3)
    run_day(tmp_path, "2026-11-02", DAY2)  # arrives late
    top = json.loads((out / "manifest.json").read_text())
    assert [s["id"] for s in top["snapshots"]] == ["dt=2026-11-01", "dt=2026-11-03", "dt=2026-11-02"]
    # e3 (day 3) was kept first, so day 2's e2 and f2 are now near duplicates of history
    assert ids(out) == ["a1", "b1", "c1", "d1", "e3", "h3", "g2"]
    assert dropped(out, "dt=2026-11-02")["e2"][0] == "near_duplicate_of_history"


def test_append_mode_errors_are_one_line(tmp_path):
    p = day_pipeline(tmp_path, "2026-11-01", DAY1)
    with pytest.raises(SnapshotError, match="invalid snapshot id"):
        p.run(workers=1, snapshot="../x")
    inp = write_records(tmp_path / "plain", DAY1)
    q = Pipeline("x").input(inp, format="parquet", schema="training_record.v1").add(DEDUP).output(str(tmp_path / "o"), mode="append")
    with pytest.raises(SnapshotError, match="pass --snapshot"):
        q.run(workers=1)
    from datakit.pipeline import PipelineError

    with pytest.raises(PipelineError, match="needs output mode: append"):
        Pipeline("y").input(inp, format="parquet", schema="training_record.v1").add(
            {**DEDUP, "history": True}).output(str(tmp_path / "o2")).run(workers=1)


def urec(doc_id: str, text: str, user: str) -> dict:
    r = rec(doc_id, text)
    r["source"] = {"event_id": f"e-{doc_id}", "user_id": user, "org_id": "o", "session_id": "s", "timestamp": "t",
                   "repo_id": None, "language": None, "path": None}
    return r


def test_forget_across_snapshots_and_state(tmp_path):
    """A forgotten document goes from every snapshot and from the state: it no longer keeps a later
    duplicate out, and neither a retried night nor a later day brings it back."""
    from datakit.forget_snapshots import forget

    out = tmp_path / "ds"
    t, n = "def shared():\n    return 42\n", words(0, 100)
    run_day(tmp_path, "2026-11-01", [urec("a1", t, "gone"), urec("b1", n, "gone"), urec("c1", "x = 1\n", "u2")])
    run_day(tmp_path, "2026-11-02", [urec("a2", t, "u3"), urec("d2", "y = 2\n", "gone"), urec("e2", "z = 3\n", "u3")])
    assert ids(out) == ["a1", "b1", "c1", "d2", "e2"]
    assert dropped(out, "dt=2026-11-02")["a2"][0] == "exact_duplicate_of_history"
    pq.write_table(pa.table({"user_id": ["gone"]}), tmp_path / "deletions.parquet")
    removed = forget(str(out), str(tmp_path / "deletions.parquet"), workers=1)
    assert removed == {"dt=2026-11-01": 2, "dt=2026-11-02": 1}
    assert ids(out) == ["c1", "e2"]
    top = json.loads((out / "manifest.json").read_text())
    assert top["rows"] == 2 and [s["path"] for s in top["snapshots"]] == [
        "_snapshots/dt=2026-11-01~forget-1", "_snapshots/dt=2026-11-02~forget-1"]
    assert not (out / "_snapshots" / "dt=2026-11-01").exists()  # the forgotten records are gone from disk
    state = pq.read_table(out / "_snapshots" / "dt=2026-11-01~forget-1" / "_dedup_state" / "exact.parquet")
    assert [json.loads(h)["doc_id"] for h in state.column("_dk_hist").to_pylist()] == ["c1"]
    assert "a1" not in str(pq.read_table(out / "_snapshots" / "dt=2026-11-01~forget-1" / "_dedup_state").to_pylist())
    # day 3: another user's copy of a1's text and of b1's text are kept now; the forgotten user's new doc is not
    run_day(tmp_path, "2026-11-03", [urec("a3", t, "u4"), urec("b3", words(3, 100), "u4"), urec("f3", "w = 4\n", "gone")])
    assert ids(out, snapshot="dt=2026-11-03") == ["a3", "b3"]
    assert dropped(out, "dt=2026-11-03") == {"f3": ("opt_out_user", None)}
    # a retried night 1 (from the same logs) does not resurrect the forgotten documents
    run_day(tmp_path, "2026-11-01", [urec("a1", t, "gone"), urec("b1", n, "gone"), urec("c1", "x = 1\n", "u2")])
    assert ids(out) == ["c1", "e2", "a3", "b3"]
    assert not (out / "_snapshots" / "dt=2026-11-01~forget-1").exists()


def test_packed_union_and_history_needs_records(tmp_path):
    """PackedDataset(OUT) reads every snapshot's sequences in order; history dedup refuses a packed output."""
    from datakit.loader import PackedDataset
    from datakit.pipeline import PipelineError
    from tests.stages.test_tokenize import TOKENIZER

    tok = {"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 64}
    sizes = []
    for day, rows in (("2026-11-01", DAY1), ("2026-11-02", DAY2)):
        p = day_pipeline(tmp_path, day, rows, stages=(tok,), out="packed")
        p.config.output.format = "packed"
        p.run(workers=1)
        sizes.append(len(PackedDataset(tmp_path / "packed" / "_snapshots" / f"dt={day}")))
    union = PackedDataset(tmp_path / "packed", verify=True)
    assert len(union) == sum(sizes) and sizes[0] > 0 and sizes[1] > 0
    # the top manifest's totals are the union's, not the last snapshot's
    top = json.loads((tmp_path / "packed" / "manifest.json").read_text())
    days = [json.loads((tmp_path / "packed" / "_snapshots" / f"dt={d}" / "manifest.json").read_text())
            for d in ("2026-11-01", "2026-11-02")]
    for key in ("sequences", "tokens", "documents", "padding_tokens"):
        assert top["totals"][key] == sum(m["totals"][key] for m in days), key
    assert top["totals"]["sequences"] == len(union)
    assert top["totals"]["fill_rate"] == round(top["totals"]["tokens"] / (len(union) * top["seq_len"]), 6)
    first = PackedDataset(tmp_path / "packed" / "_snapshots" / "dt=2026-11-01")
    assert (union[0]["input_ids"] == first[0]["input_ids"]).all()
    # the union's manifest and each snapshot's match the schema they name (found in a trainer-side review:
    # the union's layout "snapshots" and its tokenizer file under _snapshots/ were refused by it)
    import jsonschema

    from datakit.contracts import load_contract

    validator = jsonschema.Draft202012Validator(load_contract("packed_dataset.v1"))
    for m in (top, *days):
        assert m["schema"] == "packed_dataset.v1"
        assert not [e.message for e in validator.iter_errors(m)]
    assert top["layout"] == "snapshots" and top["tokenizer"]["file"] == "_snapshots/dt=2026-11-02/tokenizer.json"
    p = day_pipeline(tmp_path, "2026-11-03", DAY3, stages=(DEDUP, tok), out="packed2")
    p.config.output.format = "packed"
    with pytest.raises(PipelineError, match="needs output format parquet"):
        p.run(workers=1)
    assert not (tmp_path / "packed2" / "manifest.json").exists()


@pytest.mark.parametrize("change", ["seq_len", "tokenizer"])
def test_a_snapshot_with_another_token_layout_is_refused_before_any_work(tmp_path, change):
    """Found in review: a day appended with another tokenizer committed (exit 0) and the union named only the
    new tokenizer, so the earlier days' ids decoded to garbage; another seq_len left every older shard
    unreadable. Now it is one line, exit 2, before the run; the union keeps working and its manifest names
    a tokenizer file that exists (the latest snapshot's)."""
    import shutil

    from datakit.loader import PackedDataset
    from datakit.stages.tokenize.tokenizers import load_tokenizer
    from tests.stages.test_tokenize import TOKENIZER

    tok = {"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 64}
    for day, rows in (("2026-11-01", DAY1), ("2026-11-02", DAY2)):
        p = day_pipeline(tmp_path, day, rows, stages=(tok,), out="packed")
        p.config.output.format = "packed"
        p.run(workers=1)
    before = (tmp_path / "packed" / "manifest.json").read_bytes()
    if change == "seq_len":
        other = {**tok, "seq_len": 32}
    else:  # the same vocabulary size, another file (what a retrained tokenizer looks like to the writer)
        text = json.loads(open(TOKENIZER).read())
        text["model"]["merges"] = text["model"]["merges"][:-1]
        shutil.copy(TOKENIZER, tmp_path / "other.json")
        (tmp_path / "other.json").write_text(json.dumps(text))
        other = {**tok, "tokenizer": str(tmp_path / "other.json")}
    p = day_pipeline(tmp_path, "2026-11-03", DAY3, stages=(other,), out="packed")
    p.config.output.format = "packed"
    with pytest.raises(SnapshotError, match=f"another token layout \\({'seq_len 64 there, 32 here' if change == 'seq_len' else 'tokenizer sha256'}"):
        p.run(workers=1)
    assert (tmp_path / "packed" / "manifest.json").read_bytes() == before
    assert not (tmp_path / "packed" / "_snapshots" / "dt=2026-11-03").exists()
    top = json.loads(before)
    union = PackedDataset(tmp_path / "packed")
    assert len(union) == top["totals"]["sequences"]
    named = tmp_path / "packed" / top["tokenizer"]["file"]
    assert named.is_file() and load_tokenizer(str(named)).sha256 == top["tokenizer"]["sha256"]


@pytest.mark.parametrize("fmt", ["packed", "mds", "megatron", "parquet"])
def test_every_token_format_appends_with_the_same_settings_and_a_reader_survives_the_append(tmp_path, fmt):
    """Found in review of the token-layout check: mds manifests always say int32 and megatron's hold no pad
    id, so a second day with the same settings was refused; and the loader's rewrite check failed a reader
    of the union after a nightly append, which rewrites only the top manifest (the shards it read stay).
    Tokenized Parquet (found in a later review) recorded no token layout at all, so its second day was
    refused as "seq_len None there"; it records the tokenizer and seq_len now, and another tokenizer is
    refused for what it is."""
    from datakit.loader import PackedDataset
    from tests.stages.test_tokenize import TOKENIZER

    tok = {"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 64}
    union = None
    for day, rows in (("2026-11-01", DAY1), ("2026-11-02", DAY2), ("2026-11-03", DAY3)):
        p = day_pipeline(tmp_path, day, rows, stages=(tok,), out="o")
        p.config.output.format = fmt
        if fmt == "megatron":
            p.config.output.allow_unmasked = True
        p.run(workers=1)
        if fmt == "packed" and day == "2026-11-02":
            union = PackedDataset(tmp_path / "o")  # a trainer opens the union of two days
            union[0]
    top = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert [s["id"] for s in top["snapshots"]] == ["dt=2026-11-01", "dt=2026-11-02", "dt=2026-11-03"]
    if fmt == "megatron":  # every snapshot's masks, aligned with its token prefixes and under its folder
        assert len(top["loss_mask_prefixes"]) == len(top["data_prefixes"]) == 3
        for tokens, mask in zip(top["data_prefixes"], top["loss_mask_prefixes"]):
            assert mask is None or (mask.rsplit("/", 2)[0] == tokens.rsplit("/", 2)[0]
                                    and (tmp_path / "o" / f"{mask}.idx").is_file())
    if union is not None:
        last = union[len(union) - 1]  # day 2's last sequence, unchanged on disk by day 3's append
        assert len(last["input_ids"]) == 64
    if fmt == "parquet":
        from datakit.stages.tokenize.tokenizers import load_tokenizer

        assert len(ids(tmp_path / "o")) == len(DAY1) + len(DAY2) + len(DAY3)
        assert top["tokenizer"]["sha256"] == load_tokenizer(TOKENIZER).sha256 and top["seq_len"] == 64
        text = json.loads(open(TOKENIZER).read())
        text["model"]["merges"] = text["model"]["merges"][:-1]
        (tmp_path / "other.json").write_text(json.dumps(text))
        p = day_pipeline(tmp_path, "2026-11-04", DAY3, stages=({**tok, "tokenizer": str(tmp_path / "other.json")},),
                         out="o")
        p.config.output.format = fmt
        with pytest.raises(SnapshotError, match="another token layout \\(tokenizer sha256"):
            p.run(workers=1)


def test_crash_inside_the_engine_then_rerun_completes(tmp_path, monkeypatch):
    """Killed while the engine commits the snapshot's shards: the union is day 1; the rerun finishes."""
    import datakit.io.sinks as sinks

    out = tmp_path / "ds"
    run_day(tmp_path, "2026-11-01", DAY1)
    before = (out / "manifest.json").read_bytes()
    real = sinks.commit

    def killed(*a, **kw):
        raise KeyboardInterrupt  # the process dies here (not an error the engine may handle)

    monkeypatch.setattr(sinks, "commit", killed)
    with pytest.raises(KeyboardInterrupt):
        run_day(tmp_path, "2026-11-02", DAY2)
    assert (out / "manifest.json").read_bytes() == before and ids(out) == ["a1", "b1", "c1", "d1"]
    monkeypatch.setattr(sinks, "commit", real)
    run_day(tmp_path, "2026-11-02", DAY2)
    assert ids(out) == ["a1", "b1", "c1", "d1", "e2", "g2"]


def test_hf_datasets_reads_the_union_through_the_card(tmp_path, monkeypatch):
    """The card names every snapshot's files (HF datasets); a glob over the snapshots' data/ works too."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets
    import duckdb
    run_day(tmp_path, "2026-11-01", DAY1)
    run_day(tmp_path, "2026-11-02", DAY2)
    # a night whose only document was seen before: an empty snapshot (found in review: its 0-row row
    # group made load_dataset refuse the whole dataset)
    run_day(tmp_path, "2026-11-03", [rec("a3", "def f():\n    return 1\n")])
    empty = list((tmp_path / "ds" / "_snapshots" / "dt=2026-11-03" / "data").glob("*.parquet"))
    assert empty and all(pq.ParquetFile(f).metadata.num_row_groups == 0 for f in empty)
    hf = datasets.load_dataset(str(tmp_path / "ds"), split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert hf["doc_id"] == ids(tmp_path / "ds")
    glob = str(tmp_path / "ds" / "_snapshots" / "*" / "data" / "*.parquet")
    assert sorted(r[0] for r in duckdb.sql(f"SELECT doc_id FROM '{glob}'").fetchall()) == sorted(hf["doc_id"])
    # every snippet of the card runs as written (found in review: they pointed at a data/ folder an
    # append-mode dataset does not have)
    card = (tmp_path / "ds" / "README.md").read_text()
    code = card.split("```python\n", 1)[1].split("```", 1)[0].replace("PATH", str(tmp_path / "ds"))
    assert "_snapshots/*/data" in code
    for line in code.splitlines():
        scope: dict = {}
        exec(line, scope)
        rows = {k: v for k, v in scope.items() if k in ("t", "df", "ds")}
        for v in rows.values():
            assert len(v) == len(hf), line


# A chain through a dropped document: B ~ A (dropped on day 2), C ~ B and C ~ A (J = 0.82), but with
# these LSH settings C shares no bucket with A itself, only with B. One run over all days clusters
# A-B-C and drops C (it is similar to the kept A); the history must too.
CHAIN = {"kind": "dedup", "exact": True, "minhash": {"threshold": 0.8, "ngram": 1, "bands": 4, "rows": 8, "seed": 2}}
A_TXT, B_TXT, C_TXT = words(0, 100), words(5, 105), words(10, 110)


def _shared_buckets(*texts: str) -> list[bool]:
    """Premise check with the stage's own functions: do (A, B), (B, C), (A, C) share an LSH bucket?"""
    from datakit.contracts import TRAINING_RECORD_V1
    from datakit.stages.dedup.stage import DedupConfig, _BandFn, _SignatureFn

    m = DedupConfig(**CHAIN).minhash
    batch = pa.Table.from_pylist([rec(f"x{i}", t) for i, t in enumerate(texts)], schema=TRAINING_RECORD_V1).to_batches()[0]
    rows = _BandFn(m.num_perm, *m.band_rows(), "kind")(_SignatureFn(None, m, "kind")(batch)).to_pylist()
    k = {f"x{i}": {(r["_dk_band"], r["_dk_bucket"]) for r in rows if r["doc_id"] == f"x{i}"} for i in range(3)}
    return [bool(k[f"x{i}"] & k[f"x{j}"]) for i, j in ((0, 1), (1, 2), (0, 2))]


def test_chain_through_a_dropped_document_matches_one_run(tmp_path):
    assert _shared_buckets(A_TXT, B_TXT, C_TXT) == [True, True, False]
    days = {"2026-11-01": [urec("a1", A_TXT, "u1"), urec("u1", "x = 1\n", "u1")],
            "2026-11-02": [urec("b2", B_TXT, "u2")], "2026-11-03": [urec("c3", C_TXT, "u3")]}
    for day, rows in days.items():
        run_day(tmp_path, day, rows, stages=(CHAIN,))
    out = tmp_path / "ds"
    hist_a1 = json.dumps({"doc_id": "a1", "snapshot": "dt=2026-11-01"}, sort_keys=True, separators=(",", ":"))
    assert dropped(out, "dt=2026-11-02") == {"b2": ("near_duplicate_of_history", hist_a1)}
    assert dropped(out, "dt=2026-11-03") == {"c3": ("near_duplicate_of_history", hist_a1)}
    one = write_records(tmp_path / "all", [r for rows in days.values() for r in rows])
    Pipeline("one").input(one, format="parquet", schema="training_record.v1").add(dict(CHAIN)).output(
        str(tmp_path / "one")).run(workers=1)
    assert ids(out) == ids(tmp_path / "one") == ["a1", "u1"]
    # the state maps b2's band keys to a1, with b2's lineage (digests only), never b2's id or user
    bands = pq.read_table(out / "_snapshots" / "dt=2026-11-02" / "_dedup_state" / "bands.parquet")
    assert set(bands.column("_dk_hist").to_pylist()) == {hist_a1} and bands.num_rows == 4
    assert "b2" not in str(bands.to_pylist()) and "u2" not in str(bands.to_pylist())


def test_forget_a_dropped_document_removes_its_band_keys(tmp_path):
    """Forgetting B (dropped, not in the data) removes B's keys from the state: C, which reached A only
    through B's buckets, is kept on a later day. Forgetting A removes every row mapped to A."""
    from datakit.forget_snapshots import forget

    run_day(tmp_path, "2026-11-01", [urec("a1", A_TXT, "u1")], stages=(CHAIN,))
    run_day(tmp_path, "2026-11-02", [urec("b2", B_TXT, "gone")], stages=(CHAIN,))
    out = tmp_path / "ds"
    pq.write_table(pa.table({"user_id": ["gone"]}), tmp_path / "del.parquet")
    assert forget(str(out), str(tmp_path / "del.parquet"), workers=1) == {"dt=2026-11-01": 0, "dt=2026-11-02": 0}
    top = json.loads((out / "manifest.json").read_text())
    assert [s["path"] for s in top["snapshots"]] == ["_snapshots/dt=2026-11-01", "_snapshots/dt=2026-11-02~forget-1"]
    assert pq.read_table(out / "_snapshots" / "dt=2026-11-02~forget-1" / "_dedup_state" / "bands.parquet").num_rows == 0
    run_day(tmp_path, "2026-11-03", [urec("c3", C_TXT, "u3")], stages=(CHAIN,))
    assert ids(out) == ["a1", "c3"]
    # forgetting a1: the rows mapped to it go from every snapshot's state (c3 is then kept by no one)
    run_day(tmp_path, "2026-11-04", [urec("b4", B_TXT, "u4")], stages=(CHAIN,))
    assert dropped(out, "dt=2026-11-04")["b4"][0] == "near_duplicate_of_history"
    pq.write_table(pa.table({"user_id": ["u1"]}), tmp_path / "del2.parquet")
    forget(str(out), str(tmp_path / "del2.parquet"), workers=1)
    top = json.loads((out / "manifest.json").read_text())
    for s in top["snapshots"]:
        for f in s.get("dedup_state", {}).get("files", {}).values():
            assert '"a1"' not in str(pq.read_table(out / f, columns=["_dk_hist"]).to_pylist()), f
    assert ids(out) == ["c3"]


def test_state_layouts_old_is_read_newer_is_refused(tmp_path):
    """Layout 1 (before dropped duplicates' keys; no `layout` field) is still read; a newer layout is
    refused in one line saying what to do."""
    from datakit.stages.dedup.history import StateLayoutError

    run_day(tmp_path, "2026-11-01", DAY1)
    out = tmp_path / "ds"
    top_file = out / "manifest.json"
    top = json.loads(top_file.read_text())
    entry = top["snapshots"][0]["dedup_state"]
    bands = out / entry["files"]["bands"]  # as layout 1 wrote it: (band, bucket, hist), one row group
    t = pq.read_table(bands).select(["_dk_band", "_dk_bucket", "_dk_hist"]).sort_by([("_dk_band", "ascending"), ("_dk_bucket", "ascending")])
    pq.write_table(t, bands)
    del entry["layout"]
    top_file.write_text(json.dumps(top))
    run_day(tmp_path, "2026-11-02", DAY2)
    assert dropped(out, "dt=2026-11-02")["b2"][0] == "near_duplicate_of_history"
    top = json.loads(top_file.read_text())
    top["snapshots"][0]["dedup_state"]["layout"] = 99
    top_file.write_text(json.dumps(top))
    with pytest.raises(StateLayoutError, match="upgrade datakit") as e:
        run_day(tmp_path, "2026-11-03", DAY3)
    assert "\n" not in str(e.value)


def test_chain_within_a_day_through_a_document_dropped_against_history(tmp_path):
    """B and C arrive on the same day: B ~ A (history) is dropped, C reaches A only through B. One run
    drops C too (its cluster's kept document is A and C ~ A), so the day's clustering puts history first."""
    days = {"2026-11-01": [urec("a1", A_TXT, "u1")], "2026-11-02": [urec("b2", B_TXT, "u2"), urec("c2", C_TXT, "u3")]}
    for day, rows in days.items():
        run_day(tmp_path, day, rows, stages=(CHAIN,))
    hist_a1 = json.dumps({"doc_id": "a1", "snapshot": "dt=2026-11-01"}, sort_keys=True, separators=(",", ":"))
    assert dropped(tmp_path / "ds", "dt=2026-11-02") == {"b2": ("near_duplicate_of_history", hist_a1),
                                                          "c2": ("near_duplicate_of_history", hist_a1)}
    one = write_records(tmp_path / "all", [r for rows in days.values() for r in rows])
    Pipeline("one").input(one, format="parquet", schema="training_record.v1").add(dict(CHAIN)).output(
        str(tmp_path / "one")).run(workers=1)
    assert ids(tmp_path / "ds") == ids(tmp_path / "one") == ["a1"]


def test_a_redo_that_changes_a_snapshot_withdraws_the_later_ones_until_rerun_in_order(tmp_path):
    """Found in review: day 1 redone with other input left day 2, deduplicated against the old day 1,
    in the union: it held 450 pairs of copies. The later snapshots now leave the union until rerun,
    a run that would skip a withdrawn earlier snapshot is refused, and rerunning them in order gives
    a union without the pair (here z1 in the new day 1 is e2's text)."""
    out = tmp_path / "ds"
    run_day(tmp_path, "2026-11-01", DAY1)
    run_day(tmp_path, "2026-11-02", DAY2)
    run_day(tmp_path, "2026-11-03", DAY3)
    assert "e2" in ids(out)
    redo = run_day(tmp_path, "2026-11-01", DAY1 + [rec("z1", words(1000, 1100))])
    assert redo.extra["withdrawn"] == ["dt=2026-11-02", "dt=2026-11-03"]
    # and the run report a scheduler archives says so (found in an operations review: only a warning did)
    run_report = json.loads((out / "_snapshots" / "dt=2026-11-01" / "_run.json").read_text())
    assert run_report["withdrew"] == ["dt=2026-11-02", "dt=2026-11-03"] and "timing" in run_report
    top = json.loads((out / "manifest.json").read_text())
    assert [s["id"] for s in top["snapshots"]] == ["dt=2026-11-01"]
    assert ids(out) == ["a1", "b1", "c1", "d1", "z1"]  # no stale later snapshot next to z1
    with pytest.raises(SnapshotError, match=r"earlier snapshot\(s\) dt=2026-11-02 are withdrawn"):
        run_day(tmp_path, "2026-11-03", DAY3)
    with pytest.raises(SnapshotError, match="dt=2026-11-02, dt=2026-11-03 are withdrawn"):
        run_day(tmp_path, "2026-11-04", [rec("k4", "print('day 4')\n")])
    run_day(tmp_path, "2026-11-02", DAY2)
    run_day(tmp_path, "2026-11-03", DAY3)
    top = json.loads((out / "manifest.json").read_text())
    assert [s["id"] for s in top["snapshots"]] == ["dt=2026-11-01", "dt=2026-11-02", "dt=2026-11-03"]
    assert ids(out) == ["a1", "b1", "c1", "d1", "z1", "g2", "h3"]
    assert dropped(out, "dt=2026-11-02")["e2"][0] == "exact_duplicate_of_history"
    # an unchanged redo withdraws nothing
    assert "withdrawn" not in run_day(tmp_path, "2026-11-02", DAY2).extra
    assert "withdrew" not in json.loads((out / "_snapshots" / "dt=2026-11-02" / "_run.json").read_text())


def test_a_resumed_snapshot_reuses_no_work_done_against_another_history(tmp_path, monkeypatch):
    """Found in review: day 3 killed after its tasks finished, day 2 committed (holding a copy of a day-3
    document), day 3 rerun: it resumed the tasks that had deduplicated against day 1 only, and the copy
    entered the union twice. The history's state files are part of the run's identity now."""
    import datakit.io.sinks as sinks

    out = tmp_path / "ds"
    run_day(tmp_path, "2026-11-01", DAY1)
    day3 = [rec("x3", words(2000, 2100)), rec("y3", words(3000, 3100))]
    real = sinks.commit

    def killed(*a, **kw):
        raise KeyboardInterrupt  # every task of day 3 finished; the process dies before its commit

    monkeypatch.setattr(sinks, "commit", killed)
    night3 = day_pipeline(tmp_path, "2026-11-03", day3)  # its input written once: the rerun is the same run
    with pytest.raises(KeyboardInterrupt):
        night3.run(workers=1)
    monkeypatch.setattr(sinks, "commit", real)
    run_day(tmp_path, "2026-11-02", [rec("x2", words(2000, 2100))])  # day 3's x3, seen first on day 2
    res = night3.run(workers=1)
    assert res.stage("dedup")["dropped"] == {"exact_duplicate_of_history": 1}
    assert ids(out) == ["a1", "b1", "c1", "d1", "x2", "y3"]


def _quarantine(folder, raws: list[bytes]) -> None:
    """Quarantine rows as ingest writes them (a snapshot of a pipeline that reads events has them)."""
    from datakit.engines.core import QUARANTINE_SCHEMA

    (folder / "_quarantine").mkdir(parents=True, exist_ok=True)
    rows = [{"stage": "ingest", "reason": "bad_json", "detail": None, "source_file": "logs/a.jsonl",
             "source_line": i + 1, "raw": r} for i, r in enumerate(raws)]
    pq.write_table(pa.Table.from_pylist(rows, schema=QUARANTINE_SCHEMA), folder / "_quarantine" / "part-00000.parquet")


def test_forget_keeps_its_list_for_withdrawn_and_future_snapshots_and_cleans_side_outputs(tmp_path):
    """Found in review: a forget while later snapshots were withdrawn (or before a user's first logs)
    changed no committed snapshot, so it kept no list: rerunning the withdrawn days brought back 101 rows
    of the deleted user. A user's quarantined raw lines stayed; a rewritten snapshot lost its quarantine,
    its run's dropped rows and its n-gram index."""
    from datakit.forget_snapshots import forget
    from datakit.stages.decontaminate.check import check

    out = tmp_path / "ds"

    def night(day: str, rows: list[dict]) -> Pipeline:
        inp = write_records(tmp_path / "logs" / f"dt={day}", rows)
        return (Pipeline("daily").input(inp, format="parquet", schema="training_record.v1").add(dict(DEDUP))
                .output(str(out), mode="append", index=True))

    night("2026-11-01", [urec("a1", words(0, 100), "keep"), urec("g1", words(200, 300), "gone")]).run(workers=1)
    night("2026-11-02", [urec("b2", words(400, 500), "keep")]).run(workers=1)
    night3 = night("2026-11-03", [urec("c3", words(600, 700), "gone"), urec("d3", words(800, 900), "keep")])
    night3.run(workers=1)
    snaps = out / "_snapshots"
    _quarantine(snaps / "dt=2026-11-02", [b'{"user_id": "gone", "oops"', b'{"user_id": "keep", "oops"'])
    night("2026-11-02", [urec("b2", words(400, 500), "keep"), urec("e2", words(1000, 1100), "keep")]).run(workers=1)
    assert [w["id"] for w in json.loads((out / "manifest.json").read_text())["withdrawn"]] == ["dt=2026-11-03"]
    _quarantine(snaps / "dt=2026-11-02", [b'{"user_id": "gone", "oops"', b'{"user_id": "keep", "oops"'])

    pq.write_table(pa.table({"user_id": ["gone", "later"]}), tmp_path / "deletions.parquet")
    assert forget(str(out), str(tmp_path / "deletions.parquet"), workers=1) == {"dt=2026-11-01": 1, "dt=2026-11-02": 0}
    top = json.loads((out / "manifest.json").read_text())
    assert top["forget_lists"] == ["_forget/0001-000-deletions.parquet"]
    assert not (snaps / "dt=2026-11-03").exists()  # the withdrawn day's files held c3
    # an untouched snapshot keeps its files, less the listed user's quarantined line
    assert [r["raw"] for r in pq.read_table(snaps / "dt=2026-11-02" / "_quarantine").to_pylist()] == [
        b'{"user_id": "keep", "oops"']
    # the rewritten one keeps its run's side outputs: dropped rows beside forget's, a fresh index
    new1 = snaps / "dt=2026-11-01~forget-1"
    assert {r["reason"] for r in pq.read_table(new1 / "_dropped").to_pylist()} == {"opt_out_user"}
    assert (new1 / "_ngram_index" / "index.json").exists()
    leak = tmp_path / "leak.jsonl"  # an eval holding the forgotten g1's text: the new index must not know it
    leak.write_text(json.dumps({"task_id": "g", "prompt": words(200, 300)}) + "\n")
    res = check(str(out), [str(leak)])
    assert {d["mode"] for d in res.data} == {"index"} and res.evals[0].contaminated == []
    # the withdrawn day rerun, and a later user's first night: the kept list applies to both
    assert night3.run(workers=1).stage("forget")["dropped"] == {"opt_out_user": 1}
    night("2026-11-04", [urec("f4", words(1200, 1300), "later"), urec("h4", words(1400, 1500), "keep")]).run(workers=1)
    assert ids(out) == ["a1", "b2", "e2", "d3", "h4"]


def test_a_forget_killed_after_its_commit_leaves_no_forgotten_rows_behind_its_retry(tmp_path, monkeypatch, caplog):
    """Found in review: a forget killed between its commit and the deletion of the replaced folders
    left them (with the deleted user's rows, which the documented glob read), and its retry found
    nothing to do, exit 0; a relative dataset path put the filtered quarantine in stray folders and
    kept the deleted user's raw line."""
    import logging

    from datakit import forget_snapshots

    out = tmp_path / "ds"
    run_day(tmp_path, "2026-11-01", [urec("a1", words(0, 100), "gone"), urec("b1", words(200, 300), "keep")])
    run_day(tmp_path, "2026-11-02", [urec("c2", words(400, 500), "gone"), urec("d2", words(600, 700), "keep")])
    snaps = out / "_snapshots"
    _quarantine(snaps / "dt=2026-11-01", [b'{"user_id": "gone", "oops"', b'{"user_id": "keep", "oops"'])
    pq.write_table(pa.table({"user_id": ["gone"]}), tmp_path / "deletions.parquet")

    real_commit = forget_snapshots._commit_top

    def commit_then_die(*a, **kw):
        real_commit(*a, **kw)
        raise KeyboardInterrupt  # the process ends here: nothing after the commit runs

    monkeypatch.setattr(forget_snapshots, "_commit_top", commit_then_die)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        forget_snapshots.forget("ds", "deletions.parquet", workers=1)  # relative paths, as typed in a shell
    assert ids(out) == ["b1", "d2"]  # committed
    assert (snaps / "dt=2026-11-01").exists() and (snaps / "dt=2026-11-02").exists()  # the kill left them
    new1 = snaps / "dt=2026-11-01~forget-1"
    assert [r["raw"] for r in pq.read_table(new1 / "_quarantine").to_pylist()] == [b'{"user_id": "keep", "oops"']
    assert not [p for p in new1.rglob("*") if "t=2026" in p.relative_to(new1).as_posix()]  # no stray copies

    monkeypatch.setattr(forget_snapshots, "_commit_top", real_commit)
    with caplog.at_level(logging.WARNING, logger="datakit.forget_snapshots"):
        assert forget_snapshots.forget("ds", "deletions.parquet", workers=1) == {"dt=2026-11-01": 0, "dt=2026-11-02": 0}
    assert sorted(p.name for p in snaps.iterdir()) == ["dt=2026-11-01~forget-1", "dt=2026-11-02~forget-1"]
    assert "removed 2 snapshot version(s) an earlier forget replaced" in caplog.text
    everything = pa.concat_tables([pq.read_table(f) for f in sorted(snaps.glob("*/data/*.parquet"))])
    assert "gone" not in {s["user_id"] for s in everything.column("source").to_pylist()}


def test_the_next_commit_removes_every_replaced_version(tmp_path, monkeypatch):
    """A night's commit sweeps the versions a forget replaced in every snapshot, not only its own."""
    from datakit import forget_snapshots

    out = tmp_path / "ds"
    run_day(tmp_path, "2026-11-01", [urec("a1", words(0, 100), "gone"), urec("b1", words(200, 300), "keep")])
    pq.write_table(pa.table({"user_id": ["gone"]}), tmp_path / "deletions.parquet")
    monkeypatch.setattr(forget_snapshots, "remove_superseded", lambda *a: [])
    monkeypatch.setattr(forget_snapshots, "_rmtree", lambda url: None)  # as if killed after the commit
    forget_snapshots.forget(str(out), str(tmp_path / "deletions.parquet"), workers=1)
    assert (out / "_snapshots" / "dt=2026-11-01").exists()
    run_day(tmp_path, "2026-11-02", [urec("c2", words(400, 500), "keep")])
    assert sorted(p.name for p in (out / "_snapshots").iterdir()) == ["dt=2026-11-01~forget-1", "dt=2026-11-02"]


def test_a_forgotten_snapshot_keeps_its_run_history_and_its_suites(tmp_path):
    """Found in an operations review: the rewritten version's manifest and `_run.json` were the forget
    run's alone (one `forget` stage over files it deletes), so `datakit validate` of the snapshot
    dropped `deduplicated_records` and the day's own counts were gone."""
    from datakit.forget_snapshots import forget
    from datakit.quality.validate import default_suites, validate_path

    out = tmp_path / "ds"
    run_day(tmp_path, "2026-11-01", [urec("a1", "x = 1\n", "gone"), urec("b1", "y = 2\n", "u2"),
                                     urec("c1", "y = 2\n", "u3"), urec("d1", "z = 3\n", "u3")])
    day = out / "_snapshots" / "dt=2026-11-01"
    before_m = json.loads((day / "manifest.json").read_text())
    before_run = json.loads((day / "_run.json").read_text())
    suites = default_suites(before_m)
    assert "deduplicated_records" in suites
    pq.write_table(pa.table({"user_id": ["gone"]}), tmp_path / "deletions.parquet")
    forget(str(out), str(tmp_path / "deletions.parquet"), workers=1)
    pq.write_table(pa.table({"user_id": ["u2"]}), tmp_path / "deletions2.parquet")
    forget(str(out), str(tmp_path / "deletions2.parquet"), workers=1)
    new = out / "_snapshots" / "dt=2026-11-01~forget-2"
    m = json.loads((new / "manifest.json").read_text())
    run = json.loads((new / "_run.json").read_text())
    assert [s["kind"] for s in m["pipeline"]["stages"]] == ["dedup", "forget", "forget"]
    assert m["inputs"] == before_m["inputs"] and m["input_digest"] == before_m["input_digest"]
    assert [f["generation"] for f in m["forgets"]] == [1, 2] and m["rows"] == 1
    assert default_suites(m) == suites
    # the day's stage counts, then each forget's: a chain that reconciles (rows out of one = rows in of the next)
    assert run["stages"][0] == before_run["stages"][0]
    assert [(s["kind"], s["rows_in"], s["rows_out"]) for s in run["stages"]] == [
        ("dedup", 4, 3), ("forget", 3, 2), ("forget", 2, 1)]
    assert [f["generation"] for f in run["forgets"]] == [1, 2] and run["output"]["rows"] == 1
    assert before_m["pipeline_hash"] in (new / "README.md").read_text()  # the card is the new manifest's
    res = validate_path(str(new))  # (these hand-made records' ids are not hex: training_record.v1 fails)
    assert res["suites"] == suites
    assert [r["success"] for r in res["results"] if r["suite"] == "deduplicated_records"] == [True]


@pytest.mark.parametrize("damage", ["page", "truncated", "missing"])
def test_a_damaged_dedup_state_file_is_named(tmp_path, damage):
    """Found in an operations review: a damaged state file failed the night with pyarrow's "Couldn't
    deserialize thrift" under the stage's name and no path. Now one input error names the file, its
    snapshot and the way out."""
    from datakit.stages.dedup.history import DamagedStateError

    run_day(tmp_path, "2026-11-01", DAY1)
    f = tmp_path / "ds" / "_snapshots" / "dt=2026-11-01" / "_dedup_state" / "bands.parquet"
    blob = bytearray(f.read_bytes())
    if damage == "page":
        blob[len(blob) // 2: len(blob) // 2 + 64] = bytes(64)
        f.write_bytes(bytes(blob))
    elif damage == "truncated":
        f.write_bytes(bytes(blob[:100]))
    else:
        f.unlink()
    with pytest.raises(DamagedStateError) as e:
        run_day(tmp_path, "2026-11-02", DAY2)
    msg = str(e.value)
    assert f"dedup state file {f} of snapshot dt=2026-11-01" in msg and "rerun snapshot dt=2026-11-01" in msg
    assert ("is missing" if damage == "missing" else "bytes differ from the sha256") in msg


def test_a_state_file_removed_after_a_run_read_it_is_named_in_the_same_process(tmp_path):
    """The state files' open handles are kept for a process's later lookups; a file removed or replaced
    since was still served from the handle (found when one variant of the test above read the state an
    earlier variant had damaged, at the same path and sha256). A local file's identity is checked."""
    from datakit.stages.dedup.history import DamagedStateError

    run_day(tmp_path, "2026-11-01", DAY1)
    run_day(tmp_path, "2026-11-02", DAY2)  # reads day 1's state in this process (workers=1)
    f = tmp_path / "ds" / "_snapshots" / "dt=2026-11-01" / "_dedup_state" / "bands.parquet"
    f.unlink()
    with pytest.raises(DamagedStateError, match="is missing"):
        run_day(tmp_path, "2026-11-03", DAY3)


@pytest.mark.parametrize("indexed", [False, True])
def test_an_empty_snapshot_does_not_stop_the_check_of_the_dataset(tmp_path, indexed):
    """Found in review: a night whose documents were all dropped (every event private, or all seen before)
    left an empty snapshot, and from then on every contamination check of the dataset exited 2 ("no
    readable document") although the other snapshots held the leak. The rule holds per --data path, and
    the same path given twice is read once."""
    from datakit.stages.decontaminate.check import check

    solution = "def leaked(values):\n    " + " + ".join(f"values[{i}] * {i + 3}" for i in range(20)) + "\n"
    ev = tmp_path / "ev.jsonl"
    ev.write_text(json.dumps({"task_id": "E/0", "prompt": "def leaked(values):\n", "canonical_solution": solution}) + "\n")
    stages = (DEDUP,)

    def night(day, rows):
        p = day_pipeline(tmp_path, day, rows, stages=stages)
        p.config.output.index = indexed
        return p.run(workers=1)

    night("2026-11-01", [rec("a1", solution), rec("b1", "print('x')\n")])
    assert night("2026-11-02", [rec("a2", solution)]).manifest["rows"] == 0  # all seen before: empty night
    res = check([str(tmp_path / "ds")], [f"e={ev}"])
    assert res.evals[0].contaminated_items == 1
    twice = check([str(tmp_path / "ds"), str(tmp_path / "ds") + "/"], [f"e={ev}"])
    assert sum(d["documents"] for d in twice.data) == sum(d["documents"] for d in res.data) == 2


def test_an_append_mode_mds_dataset_lists_each_snapshots_index_and_verifies(tmp_path):
    """Found in review: the top manifest listed the latest snapshot's `data/index.json` at the dataset root,
    where no such file exists, so `datakit validate` and `inspect --verify` of every append-mode MDS dataset
    failed ("data file data/index.json is missing")."""
    from datakit.io.dataset import read_manifest
    from datakit.io.verify import verify_dataset
    from tests.stages.test_tokenize import TOKENIZER

    tok = {"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 64}
    for day, rows in (("2026-11-01", DAY1), ("2026-11-02", DAY2)):
        p = day_pipeline(tmp_path, day, rows, stages=(tok,), out="mds")
        p.config.output.format = "mds"
        p.run(workers=1)
    top = read_manifest(str(tmp_path / "mds"))
    files = top["dataset_files"]["files"]
    assert files == ["_snapshots/dt=2026-11-01/data/index.json", "_snapshots/dt=2026-11-02/data/index.json"]
    assert all((tmp_path / "mds" / f).is_file() for f in files) and set(top["dataset_files"]["sha256"]) == set(files)
    verify_dataset(str(tmp_path / "mds"), top, checksums=True)


def test_megatron_append_lists_each_snapshots_loss_masks_beside_its_token_prefixes(tmp_path):
    """The top manifest's `loss_mask_prefixes` is aligned with `data_prefixes`: a day of code only has no mask
    file (null), a day with a chat record has its mask under its own snapshot folder."""
    from tests.stages.test_tokenize import TOKENIZER, sft_record

    tok = {"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 64}
    chat = [sft_record("s1", [("user", "how do I sort a list?"), ("assistant", "use sorted(xs)\n")])]
    for day, rows in (("2026-11-01", DAY1), ("2026-11-02", chat)):
        p = day_pipeline(tmp_path, day, rows, stages=(tok,), out="o")
        p.config.output.format = "megatron"
        p.config.output.allow_unmasked = True
        p.run(workers=1)
    top = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert top["data_prefixes"] == ["_snapshots/dt=2026-11-01/data/tokens-00000",
                                    "_snapshots/dt=2026-11-02/data/tokens-00000"]
    assert top["loss_mask_prefixes"] == [None, "_snapshots/dt=2026-11-02/data/loss_mask-00000"]
    assert (tmp_path / "o" / "_snapshots" / "dt=2026-11-02" / "data" / "loss_mask-00000.idx").is_file()


def test_report_of_a_dataset_of_snapshots_names_a_snapshot_to_report(tmp_path):
    """Found in a docs review: `datakit report DATASET` of an append-mode dataset said "no _run.json (not a
    datakit output, or the run did not finish)"; each run reports on its own snapshot."""
    from datakit.quality.report import write_report

    run_day(tmp_path, "2026-11-01", DAY1)
    run_day(tmp_path, "2026-11-02", DAY2)
    with pytest.raises(FileNotFoundError, match=r"is a dataset of snapshots: .* datakit report .*/_snapshots/dt=2026-11-02"):
        write_report(str(tmp_path / "ds"))
    assert write_report(str(tmp_path / "ds" / "_snapshots" / "dt=2026-11-02")).endswith("_report.html")


def test_a_redo_that_failed_once_still_withdraws_the_later_snapshots_when_retried(tmp_path, monkeypatch):
    """Found in an operations review: a redo of an old day that changed it, stopped once after its withdraw and
    retried, no longer saw the day's earlier dedup state (a withdrawn entry kept only its id and position):
    the retry withdrew nothing, exit 0, and the union held 159 duplicate documents."""
    import datakit.stages.dedup.history as history

    out = tmp_path / "ds"
    for day, rows in (("2026-11-01", DAY1), ("2026-11-02", DAY2), ("2026-11-03", DAY3)):
        run_day(tmp_path, day, rows)
    changed = DAY1 + [rec("z1", words(1000, 1100))]
    real = history.write_state

    def stopped(*a, **k):
        raise KeyboardInterrupt  # the scheduler's stop, after the snapshot's run and before its commit

    monkeypatch.setattr(history, "write_state", stopped)
    with pytest.raises(KeyboardInterrupt):
        run_day(tmp_path, "2026-11-01", changed)
    monkeypatch.setattr(history, "write_state", real)
    retry = run_day(tmp_path, "2026-11-01", changed)
    assert retry.extra["withdrawn"] == ["dt=2026-11-02", "dt=2026-11-03"]
    assert ids(out) == ["a1", "b1", "c1", "d1", "z1"]


def test_a_derived_id_that_names_another_partition_folder_is_refused(tmp_path):
    """Under year=/month=/day= folders the derived id is the innermost folder: April 29 is `day=29` as March 29
    is, and April's night replaced March's day as a redo (found in an operations review), exit 0."""
    def day(path: str, rows):
        inp = write_records(tmp_path / "logs" / path, rows)
        return Pipeline("daily").input(inp, format="parquet", schema="training_record.v1").add(dict(DEDUP)).output(
            str(tmp_path / "ds"), mode="append")

    day("year=2026/month=03/day=29", DAY1).run(workers=1)
    day("year=2026/month=03/day=30", DAY2).run(workers=1)
    before = (tmp_path / "ds" / "manifest.json").read_bytes()
    with pytest.raises(SnapshotError, match=r"snapshot day=29 was committed from .*month=03/day=29.* this run reads "
                                            r".*month=04/day=29.*--snapshot ID"):
        day("year=2026/month=04/day=29", DAY3).run(workers=1)
    assert (tmp_path / "ds" / "manifest.json").read_bytes() == before
    day("year=2026/month=03/day=29", DAY1).run(workers=1)  # a true redo of the same folder still runs
    day("year=2026/month=04/day=29", DAY3).run(workers=1, snapshot="year=2026_month=04_day=29")
    assert [s["id"] for s in json.loads((tmp_path / "ds" / "manifest.json").read_text())["snapshots"]] == [
        "day=29", "day=30", "year=2026_month=04_day=29"]


def test_a_forgotten_users_quarantined_lines_stay_gone_when_a_night_is_retried_or_a_new_one_runs(tmp_path):
    """Found in an operations review: forget removed a user's quarantined raw line, and a retry of that night
    wrote the whole raw event (user_id included) back into `_quarantine/`; a new night kept theirs too."""
    from datakit.forget_snapshots import forget
    from tests.eventgen import make_event, write_jsonl

    out = tmp_path / "ds"

    def night(day: str) -> Pipeline:
        bad = b'{"user_id": "gone", "event_id": "x-' + day.encode() + b'", "oops"'
        inp = write_jsonl(tmp_path / "logs" / f"dt={day}" / "a.jsonl", [make_event(1), bad, make_event(2)])
        return (Pipeline("daily").input(str(inp)).add({"kind": "ingest"}).add({"kind": "extract", "kinds": ["code"]})
                .output(str(out), mode="append"))

    night("2026-11-01").run(workers=1)
    pq.write_table(pa.table({"user_id": ["gone"]}), tmp_path / "deletions.parquet")
    forget(str(out), str(tmp_path / "deletions.parquet"), workers=1)
    night("2026-11-01").run(workers=1)  # the night retried from the same logs
    night("2026-11-02").run(workers=1)
    raws = [r["raw"] for f in sorted(out.glob("_snapshots/*/_quarantine/*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert not any(b'"gone"' in (r if isinstance(r, bytes) else r.encode()) for r in raws), raws


def test_forget_removes_a_killed_nights_uncommitted_snapshot(tmp_path):
    """Found in an operations review: forget looked only at committed and withdrawn snapshots; a killed night's
    folder kept 138 rows of the deleted user until the night was rerun. It is removed; the rerun applies the list."""
    from datakit.forget_snapshots import forget

    out = tmp_path / "ds"
    run_day(tmp_path, "2026-11-01", [urec("a1", words(0, 100), "keep")])
    killed = out / "_snapshots" / "dt=2026-11-02"
    write_records(killed / "data", [urec("g2", words(200, 300), "gone")])  # what a killed night left on disk
    pq.write_table(pa.table({"user_id": ["gone"]}), tmp_path / "deletions.parquet")
    forget(str(out), str(tmp_path / "deletions.parquet"), workers=1)
    assert not killed.exists() and (out / "_snapshots" / "dt=2026-11-01").exists()
    run_day(tmp_path, "2026-11-02", [urec("g2", words(200, 300), "gone"), urec("h2", words(400, 500), "keep")])
    assert ids(out) == ["a1", "h2"]
