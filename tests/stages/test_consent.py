"""Consent stage: privacy mode and opt-out lists, counted by reason; broadcast and join modes agree."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit.contracts import EDITOR_EVENT_V1
from datakit.io.fs import InputError
from datakit.plan import DROP
from datakit.stages.base import CompileContext
from datakit.stages.consent import ConsentConfig, ConsentFn, ParseOptOutLines, load_optouts


def _events(rows: list[dict]) -> pa.RecordBatch:
    full = [{**dict.fromkeys(EDITOR_EVENT_V1.names), **r} for r in rows]
    return pa.Table.from_pylist(full, schema=EDITOR_EVENT_V1).to_batches()[0]


def test_fn_reasons_and_precedence():
    batch = _events([
        {"event_id": "keep", "user_id": "u1", "org_id": "o1", "privacy_mode": False},
        {"event_id": "private", "user_id": "u1", "org_id": "o1", "privacy_mode": True},
        {"event_id": "private_and_out", "user_id": "u9", "org_id": "o9", "privacy_mode": True},
        {"event_id": "unknown_privacy", "user_id": "u1", "org_id": "o1", "privacy_mode": None},
        {"event_id": "user_out", "user_id": "u9", "org_id": "o1", "privacy_mode": False},
        {"event_id": "user_and_org_out", "user_id": "u9", "org_id": "o9", "privacy_mode": False},
        {"event_id": "org_out", "user_id": "u2", "org_id": "o9", "privacy_mode": False},
    ])
    out = ConsentFn(("u9",), ("o9",))(batch)
    got = dict(zip(out.column("event_id").to_pylist(), out.column(DROP).to_pylist()))
    assert got == {"keep": None, "private": "privacy_mode", "private_and_out": "privacy_mode",
                   "unknown_privacy": "privacy_mode", "user_out": "opt_out_user",
                   "user_and_org_out": "opt_out_user", "org_out": "opt_out_org"}
    # no lists: only privacy mode drops
    assert ConsentFn()(batch).column(DROP).to_pylist().count(None) == 4


def test_fn_survives_pickling():
    import pickle

    fn = pickle.loads(pickle.dumps(ConsentFn(("b", "a", "a"), ("o",))))
    assert fn.users == ("a", "b")
    out = fn(_events([{"event_id": "x", "user_id": "a", "org_id": "z", "privacy_mode": False}]))
    assert out.column(DROP).to_pylist() == ["opt_out_user"]


def test_load_optouts_parquet_and_jsonl(tmp_path):
    pq.write_table(pa.table({"user_id": ["u1", None, "u2"], "org_id": [None, "o1", None]}), tmp_path / "a.parquet")
    (tmp_path / "b.jsonl").write_text('{"user_id": 42}\n\n{"org_id": "o2"}\n{"user_id": "u3", "org_id": null}\n')
    pq.write_table(pa.table({"org_id": ["o3"]}), tmp_path / "orgs_only.parquet")
    users, orgs, events = load_optouts([str(tmp_path / n) for n in ("a.parquet", "b.jsonl", "orgs_only.parquet")])
    assert users == ("42", "u1", "u2", "u3") and orgs == ("o1", "o2", "o3") and events == ()
    pq.write_table(pa.table({"email": ["x@y.z"]}), tmp_path / "bad.parquet")
    with pytest.raises(InputError, match="no user_id, org_id or event_id"):
        load_optouts([str(tmp_path / "bad.parquet")])


def test_missing_optout_list_is_an_error_not_a_silent_pass(tmp_path):
    cfg = ConsentConfig(optouts=str(tmp_path / "nope.parquet"))
    with pytest.raises(InputError):
        cfg.optout_files(CompileContext(base_dir=tmp_path))


def test_bad_optout_line_names_file_and_line():
    raw = pa.RecordBatch.from_pydict({"_raw": [b'{"user_id": "a"}', b"not json"], "_source_file": ["l.jsonl"] * 2,
                                      "_source_line": [1, 2], "_read_error": [None, None]})
    with pytest.raises(InputError, match="l.jsonl:2"):
        ParseOptOutLines()(raw)


def test_auto_mode_chooses_by_size(tmp_path):
    pq.write_table(pa.table({"user_id": ["u1"] * 100}), tmp_path / "o.parquet")
    files = [str(tmp_path / "o.parquet")]
    assert ConsentConfig(optouts=files[0]).resolved_mode(files) == "broadcast"
    assert ConsentConfig(optouts=files[0], broadcast_max_bytes=10).resolved_mode(files) == "join"


# ------------------------------------------------------------------ end to end on synthetic logs

@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    from datakit.synth import generate

    root = tmp_path_factory.mktemp("consent")
    summary = generate(root / "logs", events=400, seed=11, days=2)
    return root, summary


def _run(root: Path, name: str, stage: dict):
    from datakit import Pipeline

    p = (Pipeline(name, seed=0).input(str(root / "logs" / "dt=*" / "*.jsonl.zst"))
         .add({"kind": "ingest"}).add(stage).output(str(root / name), shards=2))
    res = p.run(engine="local", workers=1)
    st = next(s for s in res.stages if s["name"] == "consent")
    files = sorted((root / name).glob("data/part-*.parquet"))
    return st, [f.read_bytes() for f in files], pq.read_table(files).to_pylist() if files else []


def test_end_to_end_counts_match_ground_truth_in_both_modes(logs):
    root, summary = logs
    optouts = str(root / "logs" / "optouts.parquet")
    st_b, bytes_b, rows = _run(root, "bcast", {"kind": "consent", "optouts": optouts, "mode": "broadcast"})
    st_j, bytes_j, _ = _run(root, "join", {"kind": "consent", "optouts": optouts, "mode": "join"})
    expected = {k: v for k, v in summary["expected_consent_drops"].items() if v}
    assert st_b["dropped"] == expected == st_j["dropped"]
    assert st_b["rows_in"] == summary["events"] == st_b["rows_out"] + sum(expected.values())
    assert bytes_b == bytes_j  # identical output whichever way the lists are applied
    table = pq.read_table(optouts).to_pylist()
    blocked_users = {r["user_id"] for r in table if r["user_id"]}
    blocked_orgs = {r["org_id"] for r in table if r["org_id"]}
    assert rows and not any(r["privacy_mode"] or r["user_id"] in blocked_users or r["org_id"] in blocked_orgs for r in rows)


def test_jsonl_lists_and_globs_in_join_mode(logs, tmp_path):
    root, summary = logs
    table = pq.read_table(root / "logs" / "optouts.parquet").to_pylist()
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "users.jsonl").write_text("\n" + "".join(json.dumps({"user_id": r["user_id"]}) + "\n" for r in table if r["user_id"]))
    (lists / "orgs.jsonl").write_text("".join(json.dumps({"org_id": r["org_id"]}) + "\n" for r in table if r["org_id"]))
    st, _, _ = _run(root, "jsonl_join", {"kind": "consent", "optouts": [str(lists / "*.jsonl")], "mode": "join"})
    assert st["dropped"] == {k: v for k, v in summary["expected_consent_drops"].items() if v}


@pytest.mark.parametrize("mode", ["broadcast", "join"])
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_event_deletions_in_the_list_are_applied_as_forget_applies_them(logs, tmp_path, mode, fmt):
    """Found in review: forget deleted the events a list names by event_id, consent ignored that column
    (Parquet) or refused the line (JSON Lines), so consent-then-extract kept records extract-then-forget
    removed (docs/lineage.md: both ways are exact)."""
    root, _ = logs
    base = _run(root, f"nodel-{mode}-{fmt}", {"kind": "consent", "mode": mode})[2]
    gone = sorted(r["event_id"] for r in base)[:3]
    path = tmp_path / f"deletions.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table({"user_id": ["nobody"] + [None] * 3, "event_id": [None] + gone}), path)
    else:
        path.write_text('{"user_id": "nobody"}\n' + "".join(json.dumps({"event_id": e}) + "\n" for e in gone))
    st, _, rows = _run(root, f"del-{mode}-{fmt}", {"kind": "consent", "optouts": str(path), "mode": mode})
    assert st["dropped"].get("deleted_event") == 3
    assert {r["event_id"] for r in rows} == {r["event_id"] for r in base} - set(gone)


def test_jsonl_line_without_ids_is_an_error(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"user_id": "a"}\n{"email": "someone"}\n')
    with pytest.raises(InputError, match="x.jsonl:2"):
        load_optouts([str(tmp_path / "x.jsonl")])


# ------------------------------------------------------------------ a deletion applied later (forget)

def test_forget_fn_uses_lineage():
    from datakit.contracts import TRAINING_RECORD_V1
    from datakit.stages.forget import ForgetFn

    def rec(doc, user, org, event, meta="{}"):
        return {"doc_id": doc, "kind": "fim", "segments": [], "chosen": None, "rejected": None, "meta": meta,
                "source": {"event_id": event, "user_id": user, "org_id": org, "session_id": "s", "timestamp": "t",
                           "repo_id": None, "language": None, "path": None}}
    batch = pa.Table.from_pylist([
        rec("d1", "u1", "o1", "e1"), rec("d2", "u9", "o1", "e2"), rec("d3", "u2", "o9", "e3"),
        rec("d4", "u2", "o1", "e4", json.dumps({"event_ids": ["e4", "e-gone"]})), rec("d5", "u2", "o1", "e-gone")],
        schema=TRAINING_RECORD_V1).to_batches()[0]
    out = ForgetFn(("u9",), ("o9",), ("e-gone",))(batch)
    assert out.column(DROP).to_pylist() == [None, "opt_out_user", "opt_out_org", "deleted_event", "deleted_event"]
    # a feedback record whose retention label was judged from the deleted event's file (found in review: kept,
    # with the deleted event's id and a label made from its content)
    fb = pa.Table.from_pylist([rec("d6", "u2", "o1", "e6", json.dumps({"next_event_id": "e-gone", "retained": True})),
                               rec("d7", "u2", "o1", "e7", json.dumps({"next_event_id": "e8"}))],
                              schema=TRAINING_RECORD_V1).to_batches()[0]
    assert ForgetFn((), (), ("e-gone",))(fb).column(DROP).to_pylist() == ["deleted_event", None]


def test_an_opt_out_row_that_names_no_one_is_an_error_not_nothing(tmp_path):
    """Rows naming a repository in a `repo_id` column (user_id null) were read as nothing, without a word."""
    from datakit.io.fs import InputError
    from datakit.stages.consent import read_id_lists

    pq.write_table(pa.table({"user_id": ["u1", None], "repo_id": [None, "o1/r"]}), str(tmp_path / "o.parquet"))
    with pytest.raises(InputError, match="1 row\\(s\\) hold no user_id, org_id or event_id .*not read: repo_id"):
        read_id_lists([str(tmp_path / "o.parquet")])
    (tmp_path / "o.jsonl").write_text('{"user_id": "u1"}\n{"user_id": null, "repo_id": "o1/r"}\n')
    with pytest.raises(InputError, match="o.jsonl:2: has no"):
        read_id_lists([str(tmp_path / "o.jsonl")])


def test_forget_on_an_existing_output_equals_a_fresh_run(logs, tmp_path):
    """Extract without the opt-out list, then apply it later: same records as filtering up front."""
    import datakit.stages.consent  # noqa: F401  registers "forget" until it is in BUILTIN_STAGE_MODULES
    from datakit import Pipeline

    root, summary = logs
    src = str(root / "logs" / "dt=*" / "*.jsonl.zst")
    optouts = str(root / "logs" / "optouts.parquet")

    def extract(out, consent):
        (Pipeline("x", seed=0).input(src).add({"kind": "ingest"}).add({"kind": "consent", **consent})
         .add({"kind": "extract", "kinds": ["code", "fim", "sft", "preference"]}).output(str(out), shards=2)
         .run(engine="local", workers=1))
        return pq.read_table(sorted(Path(out).glob("data/part-*.parquet")))

    before = extract(tmp_path / "before", {})  # privacy mode only: the deletion has not arrived yet
    fresh = extract(tmp_path / "fresh", {"optouts": optouts})
    res = (Pipeline("forget", seed=0).input(str(tmp_path / "before"), format="parquet", schema="training_record.v1")
           .add({"kind": "forget", "optouts": optouts}).output(str(tmp_path / "after"), shards=2).run(engine="local", workers=1))
    after = pq.read_table(sorted((tmp_path / "after").glob("data/part-*.parquet")))
    assert after.sort_by("doc_id").to_pylist() == fresh.sort_by("doc_id").to_pylist()
    st = res.stage("forget")
    assert sum(st["dropped"].values()) == before.num_rows - fresh.num_rows > 0
    assert set(st["dropped"]) <= {"opt_out_user", "opt_out_org"}
    logged = pq.read_table(sorted((tmp_path / "after" / "_dropped").rglob("*.parquet"))).column("key").to_pylist()
    assert set(logged) == set(before.column("doc_id").to_pylist()) - set(fresh.column("doc_id").to_pylist())


def test_join_mode_checks_list_columns_at_compile_time(tmp_path):
    from datakit import Pipeline
    from tests.eventgen import make_event, write_jsonl

    write_jsonl(tmp_path / "l" / "a.jsonl", [make_event(i) for i in range(4)])
    pq.write_table(pa.table({"userid": ["user-1"]}), tmp_path / "typo.parquet")
    p = (Pipeline("x").input(str(tmp_path / "l")).add({"kind": "ingest"})
         .add({"kind": "consent", "optouts": str(tmp_path / "typo.parquet"), "mode": "join"}).output(str(tmp_path / "o")))
    with pytest.raises(InputError, match="no user_id, org_id or event_id"):
        p.compile()


def test_ingest_quarantines_exactly_the_planted_malformed_lines(logs):
    """The synth ground truth for malformed lines agrees with what ingest quarantines (file, line, reason)."""
    from datakit.synth import read_ground_truth

    root, _ = logs
    _run(root, "quarantine_check", {"kind": "consent"})
    got = {}
    for f in sorted((root / "quarantine_check" / "_quarantine").rglob("*.parquet")):
        for r in pq.read_table(f).to_pylist():
            got[(Path(r["source_file"]).relative_to(root / "logs").as_posix(), r["source_line"])] = r["reason"]
    want = {(g["file"], g["line"]): g["malformed_kind"] for g in read_ground_truth(root / "logs", "malformed")}
    assert got == want and len(want) >= 5


def test_join_mode_refuses_opt_out_rows_that_name_no_one(tmp_path):
    """Join mode reads the lists in the engine: a row whose ids were null (a repository named in another
    column) or a JSON line `{"user_id": null}` joined as nobody without a word, while broadcast mode refused
    the same list (found in review)."""
    from datakit import Pipeline
    from tests.eventgen import make_event, write_jsonl

    write_jsonl(tmp_path / "l" / "a.jsonl", [make_event(i) for i in range(4)])

    def compile_with(optouts):
        return (Pipeline("x").input(str(tmp_path / "l")).add({"kind": "ingest"})
                .add({"kind": "consent", "optouts": str(optouts), "mode": "join"}).output(str(tmp_path / "o")).compile())

    # two row groups: the first has no null user_id (skipped by its statistics), the second one row naming no one
    good = pa.table({"user_id": ["u1", "u2"], "repo_id": ["a/b", "c/d"]})
    bad = pa.table({"user_id": ["u3", None], "repo_id": ["e/f", "o1/r"]})
    with pq.ParquetWriter(str(tmp_path / "o.parquet"), good.schema) as w:
        w.write_table(good)
        w.write_table(bad)
    with pytest.raises(InputError, match="1 row\\(s\\) hold no user_id, org_id or event_id .*not read: repo_id"):
        compile_with(tmp_path / "o.parquet")
    pq.write_table(pa.table({"user_id": ["u1", ""], "org_id": [None, None]}), str(tmp_path / "e.parquet"))
    with pytest.raises(InputError, match="1 row\\(s\\) hold no"):
        compile_with(tmp_path / "e.parquet")
    pq.write_table(pa.table({"user_id": ["u1", None], "org_id": [None, "o2"]}), str(tmp_path / "ok.parquet"))
    compile_with(tmp_path / "ok.parquet")  # every row names someone

    (tmp_path / "n.jsonl").write_text('{"user_id": "user-1"}\n{"user_id": null, "repo_id": "o1/r"}\n')
    with pytest.raises(Exception, match="n.jsonl:2: has no user_id, org_id or event_id"):
        (Pipeline("x").input(str(tmp_path / "l")).add({"kind": "ingest"})
         .add({"kind": "consent", "optouts": str(tmp_path / "n.jsonl"), "mode": "join"})
         .output(str(tmp_path / "o2")).run(engine="local", workers=1))
