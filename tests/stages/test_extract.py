"""Extract: each rule on hand-written events (odd ones included), the batch contract, preference
pairing through the engine, and lineage from an output row back to its events."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit.contracts import EDITOR_EVENT_V1, TRAINING_RECORD_V1
from datakit.plan import DROP, DROP_DETAIL
from datakit.stages.extract.stage import ExtractConfig, ExtractFn
from datakit.stages.extract.rules import (DiffError, apply_unified_diff, doc_id, extract_event, lines_keepends,
                                          preference_candidate)
from datakit.synth.events import unified_diff


def ev(i: int | str, event_type: str = "tab_completion", **kw) -> dict:
    base = {"event_id": f"e{i}", "event_type": event_type, "timestamp": "2026-11-01T10:00:00.000Z",
            "user_id": "u1", "org_id": "o1", "session_id": "s1", "client_version": "1.0", "privacy_mode": False,
            "repo": {"repo_id": "o1/api", "commit": "c0ffee"}, "file": {"path": "src/app.py", "language": "python"},
            "context": None, "suggestion": None, "outcome": None, "accepted_text": None, "messages": None,
            "diff": None, "latency_ms": 10, "_source_file": "logs/part-0.jsonl", "_source_line": 1}
    base.update(kw)
    return base


def tab(i, prefix, suggestion, suffix, outcome="accepted", accepted_text=None, **kw):
    if accepted_text is None and outcome == "accepted":
        accepted_text = suggestion
    return ev(i, context={"prefix": prefix, "suffix": suffix}, suggestion=suggestion, outcome=outcome,
              accepted_text=accepted_text, **kw)


def by_kind(records):
    return {r["kind"]: r for r in records}


def seg(r, role):
    return [s for s in r["segments"] if s["role"] == role]


# ------------------------------------------------------------------ diffs

def test_diff_round_trips_on_real_text():
    text = Path(random.__file__).read_text()
    rng = random.Random(0)
    lines = lines_keepends(text)[:400]
    base = "".join(lines)
    for _ in range(20):
        new = list(lines)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(new))
            op = rng.randrange(3)
            if op == 0:
                del new[i]
            elif op == 1:
                new.insert(i, "# inserted ünïcode ✓\n")
            else:
                new[i] = new[i].replace("self", "me")
        after = "".join(new)
        if after == base:
            continue
        assert apply_unified_diff(base, unified_diff("random.py", base, after)) == after


@pytest.mark.parametrize("before,after", [
    ("a\nb\nc", "a\nb\nc\nd\n"),          # no newline at end of the old file
    ("a\nb\n", "a\nb"),                   # ... of the new file
    ("", "x = 1\n"),                       # insert into an empty file
    ("x = 1\n", ""),                       # delete everything
    ("a\n\x0cb\n", "a\n\x0cB\n"),          # form feed stays inside its line
])
def test_diff_edge_cases(before, after):
    assert apply_unified_diff(before, unified_diff("f.py", before, after)) == after


def test_diff_that_does_not_match_is_refused():
    d = unified_diff("f.py", "a\nb\nc\n", "a\nB\nc\n")
    with pytest.raises(DiffError):
        apply_unified_diff("a\nx\nc\n", d)
    with pytest.raises(DiffError):
        apply_unified_diff("a\n", "no hunks here\n")
    assert apply_unified_diff("a\n", "") == "a\n"


# ------------------------------------------------------------------ tab completions

def test_accepted_completion_gives_code_and_fim():
    e = tab(1, "def add(a, b):\n", "    return a + b\n", "\n\nprint(add(1, 2))\n")
    recs, why = extract_event(e, ("code", "fim", "sft", "preference"))
    assert why is None
    r = by_kind(recs)
    assert set(r) == {"code", "fim"}
    assert r["code"]["segments"] == [{"text": "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n", "train": True, "role": "code"}]
    fim = r["fim"]["segments"]
    assert [s["role"] for s in fim] == ["prefix", "suffix", "middle"]
    assert [s["train"] for s in fim] == [False, False, True]
    assert seg(r["fim"], "middle")[0]["text"] == "    return a + b\n"
    meta = json.loads(r["fim"]["meta"])
    assert meta["language"] == "python" and meta["path"] == "src/app.py" and meta["partial"] is False
    assert r["fim"]["doc_id"] == doc_id("e1", "fim") != r["code"]["doc_id"]
    assert r["fim"]["source"] == {"event_id": "e1", "user_id": "u1", "org_id": "o1", "session_id": "s1",
                                  "timestamp": "2026-11-01T10:00:00.000Z", "repo_id": "o1/api",
                                  "language": "python", "path": "src/app.py"}


def test_empty_prefix():
    recs, _ = extract_event(tab(2, "", "import os\n", "print(os.sep)\n"), ("code", "fim"))
    r = by_kind(recs)
    assert seg(r["fim"], "prefix")[0]["text"] == ""
    assert r["code"]["segments"][0]["text"] == "import os\nprint(os.sep)\n"


def test_suggestion_at_end_of_file():
    recs, _ = extract_event(tab(3, "x = 1\n", "y = 2\n", ""), ("code", "fim"))
    r = by_kind(recs)
    assert seg(r["fim"], "suffix")[0]["text"] == "" and seg(r["fim"], "middle")[0]["text"] == "y = 2\n"
    assert r["code"]["segments"][0]["text"] == "x = 1\ny = 2\n"


def test_partial_acceptance_keeps_only_the_accepted_part():
    e = tab(4, "total = ", "compute(items, tax=0.2)\n", "\nreturn total\n", outcome="partial", accepted_text="compute(items")
    r = by_kind(extract_event(e, ("code", "fim"))[0])
    assert seg(r["fim"], "middle")[0]["text"] == "compute(items"
    assert json.loads(r["fim"]["meta"])["partial"] is True
    assert "code" not in r  # a half-typed file is no pretraining document
    assert extract_event(e, ("code",)) == ([], "no_example:partial")


def test_accepted_without_accepted_text_uses_the_suggestion():
    e = tab(5, "a = ", "1\n", "", accepted_text=None)
    e["accepted_text"] = None
    assert seg(by_kind(extract_event(e, ("fim",))[0])["fim"], "middle")[0]["text"] == "1\n"


@pytest.mark.parametrize("outcome", ["rejected", "ignored"])
def test_not_accepted_yields_nothing(outcome):
    recs, why = extract_event(tab(6, "a", "b", "c", outcome=outcome), ("code", "fim", "sft"))
    assert recs == [] and why == f"no_example:{outcome}"


def test_empty_accepted_text_is_no_fim():
    recs, why = extract_event(tab(7, "a = 1\n", "b = 2\n", "", outcome="partial", accepted_text=""), ("fim",))
    assert recs == [] and why == "no_example:empty"


def test_unicode_survives_exactly():
    prefix, middle, suffix = "# café ☕ 日本語\nname = '", "Zoë 👩‍💻", "'\n# e\u0301\n"
    r = by_kind(extract_event(tab(8, prefix, middle, suffix), ("code", "fim"))[0])
    assert r["code"]["segments"][0]["text"] == prefix + middle + suffix
    assert seg(r["fim"], "middle")[0]["text"] == middle


# ------------------------------------------------------------------ inline edits

def test_accepted_inline_edit_gives_post_edit_file():
    before = "def f(x):\n    return x\n\n\ndef g(y):\n    return y * 2\n"
    after = "def f(x):\n    return x\n\n\ndef g(y):\n    # double it\n    return y * 2\n"
    cut = before.index("def g")
    e = ev(9, "inline_edit", context={"prefix": before[:cut], "suffix": before[cut:]},
           suggestion="def g(y):\n    # double it\n    return y * 2\n", outcome="accepted",
           diff=unified_diff("src/app.py", before, after))
    recs, why = extract_event(e, ("code", "fim", "sft"))
    assert why is None and [r["kind"] for r in recs] == ["code"]
    assert recs[0]["segments"][0]["text"] == after


def test_inline_edit_with_a_stale_diff_is_reported():
    e = ev(10, "inline_edit", context={"prefix": "a = 1\n", "suffix": ""}, suggestion="a = 2\n", outcome="accepted",
           diff="--- a/f\n+++ b/f\n@@ -1 +1 @@\n-b = 1\n+a = 2\n")
    assert extract_event(e, ("code",)) == ([], "no_example:diff_does_not_apply")
    e["outcome"] = "rejected"
    assert extract_event(e, ("code",)) == ([], "no_example:rejected")


# ------------------------------------------------------------------ chat and agent traces

def _agent(i, outcome="accepted", trailing_tool=False):
    msgs = [
        {"role": "system", "content": "You are a coding agent.", "tool_name": None},
        {"role": "user", "content": "Fix the failing test", "tool_name": None},
        {"role": "assistant", "content": '{"path": "src/app.py"}', "tool_name": "read_file"},
        {"role": "tool", "content": "def f():\n    return 1\n", "tool_name": "read_file"},
        {"role": "assistant", "content": "not json at all", "tool_name": "run_command"},
        {"role": "tool", "content": "1 passed", "tool_name": "run_command"},
        {"role": "assistant", "content": "Fixed: f now returns 1.", "tool_name": None},
    ]
    if trailing_tool:
        msgs.append({"role": "tool", "content": "late output", "tool_name": "run_command"})
    return ev(i, "agent_step", messages=msgs, outcome=outcome)


def test_agent_step_with_tool_calls():
    recs, why = extract_event(_agent(11, trailing_tool=True), ("code", "fim", "sft"))
    assert why is None and [r["kind"] for r in recs] == ["sft"]
    segs = recs[0]["segments"]
    assert [s["role"] for s in segs] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [s["train"] for s in segs] == [False, False, True, False, True, False, True]
    assert json.loads(segs[2]["text"]) == {"name": "read_file", "arguments": {"path": "src/app.py"}}
    assert json.loads(segs[4]["text"]) == {"name": "run_command", "arguments": "not json at all"}
    assert segs[3]["text"] == "def f():\n    return 1\n"
    meta = json.loads(recs[0]["meta"])
    assert meta["tool_names"] == [None, None, "read_file", "read_file", "run_command", "run_command", None]
    assert meta["turns"] == 3


def test_tool_arguments_that_cannot_be_written_back_are_kept_as_their_text():
    """Found in review: tool-call arguments holding `\\ud800` (a lone surrogate escape) or nested 5,000
    deep failed the extract stage, and the run, with UnicodeEncodeError / RecursionError (exit 3 on both
    engines). Such arguments are kept as the text they came as."""
    surrogate = '{"path": "a.py", "text": "\\ud800"}'
    deep = "[" * 5000 + "]" * 5000
    for content in (surrogate, deep):
        e = _agent(16)
        e["messages"][2] = {"role": "assistant", "content": content, "tool_name": "edit_file"}
        (r,), why = extract_event(e, ("sft",))
        assert why is None
        text = r["segments"][2]["text"]
        text.encode("utf-8")
        assert json.loads(text) == {"name": "edit_file", "arguments": content}


def test_rejected_agent_step_and_chat_without_answer():
    assert extract_event(_agent(12, outcome="rejected"), ("sft",)) == ([], "no_example:rejected")
    chat = ev(13, "chat_turn", messages=[{"role": "user", "content": "hello?", "tool_name": None}])
    assert extract_event(chat, ("sft",)) == ([], "no_example:no_assistant_turn")


def test_chat_turn_unicode_and_roles():
    chat = ev(14, "chat_turn", messages=[
        {"role": "user", "content": "¿Qué hace `zip`? 🤔", "tool_name": None},
        {"role": "assistant", "content": "Empareja elementos — 例えば zip([1], ['a'])", "tool_name": None}])
    (r,), _ = extract_event(chat, ("sft", "code"))
    assert [(s["role"], s["train"], s["text"]) for s in r["segments"]] == [
        ("user", False, "¿Qué hace `zip`? 🤔"), ("assistant", True, "Empareja elementos — 例えば zip([1], ['a'])")]


def test_kind_selection_reason():
    chat = ev(15, "chat_turn", messages=[{"role": "assistant", "content": "hi", "tool_name": None}])
    assert extract_event(chat, ("fim",)) == ([], "no_example:not_completion")


# ------------------------------------------------------------------ the batch contract

def _batch(events: list[dict]) -> pa.RecordBatch:
    return pa.Table.from_pylist(events, schema=EDITOR_EVENT_V1).to_batches()[0]


def test_fn_returns_records_plus_one_placeholder_per_empty_event():
    events = [tab(20, "a = ", "1\n", ""), tab(21, "b", "c", "d", outcome="rejected"), _agent(22),
              ev(23, "chat_turn", messages=[{"role": "user", "content": "?", "tool_name": None}])]
    out = ExtractFn(("code", "fim", "sft"))(_batch(events))
    assert out.schema.names == TRAINING_RECORD_V1.names + [DROP, DROP_DETAIL]
    rows = out.to_pylist()
    kept = [r for r in rows if r[DROP] is None]
    dropped = [r for r in rows if r[DROP] is not None]
    assert sorted(r["kind"] for r in kept) == ["code", "fim", "sft"]
    assert [(r[DROP], r[DROP_DETAIL]) for r in dropped] == [("no_example:rejected", "e21"), ("no_example:no_assistant_turn", "e23")]
    assert all(r["doc_id"] is None for r in dropped)
    # the kept rows conform to the contract
    pa.Table.from_pylist([{k: r[k] for k in TRAINING_RECORD_V1.names} for r in kept], schema=TRAINING_RECORD_V1)


def test_config_kinds_are_canonical():
    assert ExtractConfig(kinds=["sft", "code", "sft"]).kinds == ["code", "sft"]
    assert ExtractConfig.emits == "records" and ExtractConfig.consumes == "editor_event.v1"
    with pytest.raises(ValueError):
        ExtractConfig(kinds=[])
    with pytest.raises(ValueError):
        ExtractConfig(kinds=["pretrain"])


def test_preference_candidates():
    key_a, acc, rej = preference_candidate(tab(30, "p", "good", "s"))
    key_r, acc2, rej2 = preference_candidate(tab(31, "p", "bad", "s", outcome="rejected"))
    assert key_a == key_r and acc == "e30\x1fgood" and rej is None and acc2 is None and rej2 == "e31\x1fbad"
    other_session = tab(32, "p", "bad", "s", outcome="rejected", session_id="s2")
    assert preference_candidate(other_session)[0] != key_a
    assert preference_candidate(tab(33, "p", "x", "s", outcome="ignored")) == (None, None, None)


# ------------------------------------------------------------------ through the engine

def _write_events(path: Path, events: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({k: v for k, v in e.items() if not k.startswith("_")}) + "\n" for e in events))


def _run(inp: str, out: Path, kinds: list[str], workers: int = 1, optouts: str | None = None):
    from datakit import Pipeline

    p = Pipeline("extract-test", seed=0).input(inp).add({"kind": "ingest"})
    if optouts:
        p = p.add({"kind": "consent", "optouts": optouts})
    p = p.add({"kind": "extract", "kinds": kinds}).output(str(out), shards=2)
    res = p.run(engine="local", workers=workers)
    files = sorted(out.glob("data/part-*.parquet"))
    return res, pq.read_table(files).to_pylist(), [f.read_bytes() for f in files]


def test_preference_pairs_across_files_are_deterministic(tmp_path):
    # the same cursor in one session: two rejected (in two files) and two accepted suggestions
    a = [tab("b-acc", "def f():\n", "    return 1\n", "\n"), tab("z-rej", "def f():\n", "    pass\n", "\n", outcome="rejected")]
    b = [tab("a-rej", "def f():\n", "    return None\n", "\n", outcome="rejected"),
         tab("c-acc", "def f():\n", "    return 2\n", "\n"),
         tab("lonely", "x = ", "1\n", "\n", outcome="rejected", session_id="s9")]
    _write_events(tmp_path / "in" / "a.jsonl", a)
    _write_events(tmp_path / "in" / "b.jsonl", b)
    res, rows, _ = _run(str(tmp_path / "in" / "*.jsonl"), tmp_path / "out", ["preference"])
    (pair,) = [r for r in rows if r["kind"] == "preference"]
    assert pair["source"]["event_id"] == "eb-acc"  # smallest accepted id
    assert (pair["chosen"], pair["rejected"]) == ("    return 1\n", "    return None\n")  # smallest rejected id
    assert pair["segments"] == [{"text": "def f():\n", "train": False, "role": "prompt"}]
    assert json.loads(pair["meta"])["event_ids"] == ["ea-rej", "eb-acc"]
    st = res.stage("extract")
    assert st["rows_in"] == 5 and st["rows_out"] == 1 and st["emitted"] == 1
    assert st["dropped"] == {"no_example:context_already_paired": 1, "no_example:rejected": 3}


@pytest.fixture(scope="module")
def synth_run(tmp_path_factory):
    from datakit.synth import generate

    root = tmp_path_factory.mktemp("extract")
    summary = generate(root / "logs", events=500, seed=5, days=2)
    res, rows, blobs = _run(str(root / "logs" / "dt=*" / "*.jsonl.zst"), root / "out",
                            ["code", "fim", "sft", "preference"], workers=2, optouts=str(root / "logs" / "optouts.parquet"))
    return root, summary, res, rows, blobs


def test_end_to_end_accounting_and_ground_truth(synth_run):
    from datakit.synth import read_ground_truth

    root, summary, res, rows, _ = synth_run
    st = res.stage("extract")
    consented = summary["events"] - sum(summary["expected_consent_drops"].values())
    assert st["rows_in"] == consented == st["rows_out"] + sum(st["dropped"].values())
    assert st["emitted"] == len(rows) and {r["kind"] for r in rows} == {"code", "fim", "sft", "preference"}
    assert all(k.startswith("no_example:") for k in st["dropped"])
    assert len({r["doc_id"] for r in rows}) == len(rows)
    pairs = {(json.loads(r["meta"])["rejected_event_id"], r["source"]["event_id"]) for r in rows if r["kind"] == "preference"}
    expected = {(g["rejected_event_id"], g["accepted_event_id"]) for g in read_ground_truth(root / "logs", "preference_pair") if g["consented"]}
    assert pairs == expected
    # planted PII reaches exactly the record kinds the ground truth promises (scrubbing comes later)
    for g in read_ground_truth(root / "logs", "pii"):
        kinds = {r["kind"] for r in rows if r["source"]["event_id"] == g["event_id"]
                 and any(g["value"] in s["text"] for s in r["segments"])}
        assert kinds == set(g["record_kinds"]), g["entity"]


def test_lineage_from_output_rows_back_to_events(synth_run):
    from datakit.synth import iter_events

    root, _, _, rows, _ = synth_run
    events = {e["event_id"]: e for e in iter_events(root / "logs")}
    for r in rows:
        ids = json.loads(r["meta"]).get("event_ids", [r["source"]["event_id"]])
        for eid in ids:
            e = events[eid]
            assert (e["user_id"], e["org_id"], e["session_id"]) == (r["source"]["user_id"], r["source"]["org_id"], r["source"]["session_id"])
        e = events[r["source"]["event_id"]]
        assert r["source"]["timestamp"] == e["timestamp"] and r["source"]["repo_id"] == e["repo"]["repo_id"]
        assert r["doc_id"] == doc_id(e["event_id"], r["kind"], *([json.loads(r["meta"])["rejected_event_id"]] if r["kind"] == "preference" else []))
        if r["kind"] == "fim":
            assert seg(r, "prefix")[0]["text"] == e["context"]["prefix"]
        if r["kind"] == "code" and e["event_type"] == "tab_completion":
            assert r["segments"][0]["text"] == e["context"]["prefix"] + e["accepted_text"] + e["context"]["suffix"]
    # a deletion request for one user finds every record made from that user's events
    victim = rows[0]["source"]["user_id"]
    touched = {r["doc_id"] for r in rows if r["source"]["user_id"] == victim}
    from_events = {r["doc_id"] for r in rows if any(events[i]["user_id"] == victim for i in json.loads(r["meta"]).get("event_ids", [r["source"]["event_id"]]))}
    assert touched == from_events and touched


def test_end_to_end_is_deterministic_across_workers(synth_run, tmp_path):
    root, _, _, _, blobs = synth_run
    _, _, again = _run(str(root / "logs" / "dt=*" / "*.jsonl.zst"), tmp_path / "again",
                       ["code", "fim", "sft", "preference"], workers=1, optouts=str(root / "logs" / "optouts.parquet"))
    assert again == blobs


def test_output_rows_follow_the_training_record_contract(synth_run):
    import jsonschema

    from datakit.contracts import load_contract

    validator = jsonschema.Draft202012Validator(load_contract("training_record.v1"))
    _, _, _, rows, _ = synth_run
    for r in rows:
        validator.validate(r)
        assert json.loads(r["meta"]) is not None and r["meta"] == json.dumps(json.loads(r["meta"]), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.spark
def test_spark_engine_gives_identical_records(spark, tmp_path):
    """Consent as anti joins + preference pairing (aggregate, left join) on Spark = the local engine, byte for byte."""
    from datakit import Pipeline
    from datakit.synth import generate
    from tests.conformance import LOCAL_VARIANTS, assert_conformant, spark_variants

    generate(tmp_path / "logs", events=300, seed=4, days=2)
    sums = {}
    for mode in ("join", "broadcast"):
        p = (Pipeline("conf", seed=0).input(str(tmp_path / "logs" / "dt=*" / "*.jsonl.zst")).add({"kind": "ingest"})
             .add({"kind": "consent", "optouts": str(tmp_path / "logs" / "optouts.parquet"), "mode": mode})
             .add({"kind": "extract", "kinds": ["code", "fim", "sft", "preference"]}).output(str(tmp_path / "x"), shards=2))
        variants = LOCAL_VARIANTS[:1] + spark_variants((3,) if mode == "join" else (2,))
        sums[mode] = assert_conformant(p, tmp_path / mode, variants=variants)
    assert sums["join"] == sums["broadcast"]


@pytest.mark.parametrize("name,kinds", [("code", ["code"]), ("fim", ["fim"]), ("sft", ["sft"]), ("preference", ["preference"])])
def test_ready_pipelines_compile(name, kinds, tmp_path):
    """pipelines/<kind>.yaml: valid, consent before extract, extract selects the kind, compiles to a plan."""
    from datakit import Pipeline
    from datakit.synth import generate

    root = Path(__file__).resolve().parents[2]
    logs = tmp_path / "logs"
    generate(logs, events=100, seed=0, days=1)
    text = (root / "pipelines" / f"{name}.yaml").read_text()
    text = text.replace("../demo/logs", str(logs)).replace("../demo/out", str(tmp_path / "out")).replace("../tests", str(root / "tests"))
    (tmp_path / f"{name}.yaml").write_text(text)
    p = Pipeline.from_yaml(tmp_path / f"{name}.yaml")
    stages = p.config.stages
    order = [s.kind for s in stages]
    assert order[:3] == ["ingest", "consent", "extract"] and stages[2].kinds == kinds
    assert "scrub_pii" in order and "decontaminate" in order
    plan = p.compile()
    assert [s.kind for s in plan.spans] == order


@pytest.mark.skipif(__import__("shutil").which("patch") is None, reason="GNU patch not installed")
def test_diff_apply_agrees_with_gnu_patch(tmp_path):
    """The reference: GNU patch gives the same file for the synthetic logs' inline-edit diffs."""
    import subprocess

    from datakit.synth import generate, iter_events

    generate(tmp_path / "logs", events=300, seed=9, days=1)
    edits = [e for e in iter_events(tmp_path / "logs") if e["event_type"] == "inline_edit"][:15]
    assert edits
    for e in edits:
        base = e["context"]["prefix"] + e["context"]["suffix"]
        f = tmp_path / "f.txt"
        f.write_text(base)
        (tmp_path / "d.diff").write_text(e["diff"])
        subprocess.run(["patch", "-s", "-p1", "--no-backup-if-mismatch", str(f), str(tmp_path / "d.diff")], check=True, capture_output=True)
        assert apply_unified_diff(base, e["diff"]) == f.read_text()


def test_diff_round_trip_property():
    """Any two texts (unicode, CR, form feeds, missing final newline): apply(diff(a, b), a) == b."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    line = st.text(alphabet=st.sampled_from(list("ab \t\r\x0cé日🙂#(")), max_size=6)
    doc = st.lists(line, max_size=12).map("\n".join)

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(doc, doc)
    def check(before, after):
        assert apply_unified_diff(before, unified_diff("f.py", before, after)) == after

    check()


def test_yaml_round_trip_of_consent_and_extract():
    import yaml

    from datakit import Pipeline

    p = (Pipeline("t").input("x/*.jsonl").add({"kind": "ingest"})
         .add({"kind": "consent", "optouts": ["a.parquet", "b/*.jsonl"], "mode": "join"})
         .add({"kind": "extract", "kinds": ["sft", "preference", "code"]}).output("o"))
    assert Pipeline.from_dict(yaml.safe_load(p.to_yaml())).config == p.config


def test_agent_step_with_file_context_also_gives_the_edited_file():
    before = "def f():\n    return 0\n"
    after = "def f():\n    return 1\n"
    e = _agent(40)
    e.update(context={"prefix": "", "suffix": before}, diff=unified_diff("src/app.py", before, after))
    r = by_kind(extract_event(e, ("code", "sft"))[0])
    assert r["code"]["segments"][0]["text"] == after and "sft" in r
    assert json.loads(r["code"]["meta"])["event_type"] == "agent_step"
    e["context"] = None
    assert extract_event(e, ("code",)) == ([], "no_example:no_file_context")


def test_a_unit_separator_in_a_path_or_text_does_not_make_two_cursors_one():
    """Found in review: the cursor key joined session, path, prefix and suffix with \\x1f, so a path or a
    file's text holding it made events of different sessions or files pair."""
    from datakit.stages.extract.rules import context_key

    assert context_key("sA", "p.py\x1fq", "x", "") != context_key("sA\x1fp.py", "q", "x", "")
    assert context_key("s", "y.py", "s = 'a\x1fb'\nx = ", "") != context_key("s", "y.py\x1fs = 'a", "b'\nx = ", "")
    assert context_key("s", "y.py", "a", "b") == context_key("s", "y.py", "a", "b")


def _crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


@pytest.mark.parametrize("before,after", [
    ("def f():\n    return 1\n\nx = 2\n", "def f():\n    return 2\n\nx = 2\n"),  # a changed line
    ("a\nb\n", "top\na\nb\n"),                                             # a pure insertion
    ("a\nb\nc", "a\nB\nc"),                                                # no line end at the end
])
def test_an_editor_diff_without_cr_applies_to_a_crlf_file_and_keeps_crlf(before, after):
    """Found in a hostile-input review: an editor joins a diff's lines with "\\n" while the file on a
    Windows checkout ends each line in CRLF; every such edit was `diff_does_not_apply`."""
    d = unified_diff("f.py", before, after)
    assert "\r" not in d
    assert apply_unified_diff(_crlf(before), d) == _crlf(after)
    # a diff taken of the CRLF file itself (CRs inside its lines) applies as before
    assert apply_unified_diff(_crlf(before), unified_diff("f.py", _crlf(before), _crlf(after))) == _crlf(after)


def test_a_file_of_mixed_line_ends_must_match_the_diff_byte_for_byte():
    with pytest.raises(DiffError):
        apply_unified_diff("a\r\nb\nc\r\n", unified_diff("f.py", "a\nb\nc\n", "a\nB\nc\n"))


@pytest.mark.parametrize("diff", ["", "--- a/f.py\n+++ b/f.py\n@@ -1,1 +1,1 @@\n a\n"])
def test_an_accepted_edit_that_changes_nothing_gives_no_code_record(diff):
    """An empty diff was called `no_file_context`, and a hunk of context only gave the file before the
    edit as if it were the edited file (found in a hostile-input review)."""
    e = _agent(41)
    e.update(context={"prefix": "a\n", "suffix": "b\n"}, diff=diff)
    assert extract_event(e, ("code",)) == ([], "no_example:diff_changes_nothing")


# ------------------------------------------------------------------ found in the data scientist's review (session 45)

def test_inline_edit_feedback_is_the_file_around_the_selection_it_replaces():
    """Every accepted inline-edit feedback record kept the replaced lines in its suffix (153 of 153 in 2,000
    synthetic events): a KTO example taught writing `return sum(xs)` in front of the loop it replaced. The
    record's prefix + completion + suffix is now the edited file, and the replaced selection is context."""
    from datakit.stages.extract.feedback import FeedbackOptions, feedback_records
    from datakit.stages.extract.rules import _record
    from datakit.stages.kto.stage import render_prompt

    before = "def total(xs):\n    s = 0\n    for x in xs:\n        s += x\n    return s\n"
    after = "def total(xs):\n    return sum(xs)\n"
    cut = before.index("    s = 0")
    for outcome in ("accepted", "rejected"):
        e = ev(40, "inline_edit", context={"prefix": before[:cut], "suffix": before[cut:]},
               suggestion="    return sum(xs)\n", outcome=outcome, diff=unified_diff("t.py", before, after),
               accepted_text="    return sum(xs)\n" if outcome == "accepted" else None,
               messages=[{"role": "user", "content": "simplify this", "tool_name": None}])
        (r,), why = feedback_records(e, FeedbackOptions(), None, _record)
        assert why is None
        assert seg(r, "prefix")[0]["text"] + seg(r, "completion")[0]["text"] + seg(r, "suffix")[0]["text"] == after
        assert seg(r, "selection")[0]["text"] == before[cut:]
        prompt, completion = render_prompt(r["segments"], "fim", {"prefix": "<P>", "suffix": "<S>", "middle": "<M>"})
        assert prompt == "simplify this\n" + before[cut:] + "<P>def total(xs):\n<S><M>" and completion == after[cut:]
    # a diff that does not fit the suggestion: no example rather than a wrong one
    e["diff"] = unified_diff("t.py", before, before.replace("return s", "return s  # x"))
    assert feedback_records(e, FeedbackOptions(), None, _record) == ([], "no_example:edit_selection_unknown")


def test_a_blank_or_identical_side_never_makes_or_blocks_a_preference_pair():
    """A blank rejected suggestion with the smallest id was the pair's candidate and lost the pair with a real
    one; a suggestion accepted once and rejected once made a pair with chosen == rejected."""
    assert preference_candidate(tab(50, "p", "   \n", "s", outcome="rejected")) == (None, None, None)
    same = [tab(51, "def f():\n", "    return 1\n", "\n"), tab(52, "def f():\n", "    return 1\n", "\n", outcome="rejected")]
    key, acc, _ = preference_candidate(same[0])
    from datakit.stages.extract.rules import preference_records

    assert preference_records(same[0], acc, preference_candidate(same[1])[2]) == ([], "no_example:same_completion")


def test_an_empty_tool_output_is_kept_beside_its_call():
    """`mkdir` then `ls` of an empty folder: both tool outputs were dropped as blank, and the model was trained
    to chain calls and answer as if no result came back."""
    msgs = [{"role": "user", "content": "create the output dir", "tool_name": None},
            {"role": "assistant", "content": '{"cmd": "mkdir -p out"}', "tool_name": "run_command"},
            {"role": "tool", "content": "", "tool_name": "run_command"},
            {"role": "assistant", "content": "Done.", "tool_name": None},
            {"role": "assistant", "content": "   ", "tool_name": None}]
    (r,), why = extract_event(ev(53, "agent_step", messages=msgs, outcome="accepted"), ("sft",))
    assert why is None and [s["role"] for s in r["segments"]] == ["user", "assistant", "tool", "assistant"]


def test_a_completion_in_a_crlf_file_gets_the_files_line_ends():
    (code,), _ = extract_event(tab(54, "import os\r\n\r\n", "def f():\n    pass\n", "main()\r\n"), ("code",))
    assert code["segments"][0]["text"] == "import os\r\n\r\ndef f():\r\n    pass\r\nmain()\r\n"


def test_privacy_mode_events_make_no_record_even_without_a_consent_stage(tmp_path):
    """ingest then extract trained on privacy-mode events, and records carry no flag a later stage could see."""
    events = [tab(60, "def f():\n", "    return 1\n", "\n", privacy_mode=True), tab(61, "def g():\n", "    return 2\n", "\n")]
    _write_events(tmp_path / "in" / "a.jsonl", events)
    res, rows, _ = _run(str(tmp_path / "in" / "a.jsonl"), tmp_path / "out", ["code", "fim"])
    assert {r["source"]["event_id"] for r in rows} == {"e61"}
    assert res.stage("extract")["dropped"]["privacy_mode"] == 1
