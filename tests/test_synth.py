"""The synthetic log generator: layout, determinism, contract validity, and that every planted
thing is really where the ground-truth sidecar says it is (other stages' tests rely on it)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jsonschema
import pyarrow.parquet as pq
import pytest
import zstandard

from datakit.contracts import EDITOR_EVENT_V1, load_contract
from datakit.synth import generate, iter_events, jaccard, read_ground_truth
from datakit.synth.plants import humaneval_tasks


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "logs"
    summary = generate(out, events=600, seed=7, days=2, rows_per_part=150)
    return out, summary


def _lines(path: Path) -> list[bytes]:
    with open(path, "rb") as fh:
        data = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read()
    return data.split(b"\n")[:-1]


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout_and_counts(synth):
    out, summary = synth
    parts = sorted(p.relative_to(out).as_posix() for p in out.glob("dt=*/part-*.jsonl.zst"))
    assert parts == summary["files"]
    assert {p.split("/")[0] for p in parts} == {"dt=2026-11-01", "dt=2026-11-02"}
    assert len(parts) > 2  # rotation at rows_per_part
    events = list(iter_events(out))
    assert len(events) == summary["events"] == 600
    assert len({e["event_id"] for e in events}) == 600
    assert set(summary["event_types"]) == {"tab_completion", "inline_edit", "chat_turn", "agent_step"}
    assert (out / "optouts.parquet").exists() and (out / "_synth.json").exists()
    assert json.loads((out / "_synth.json").read_text()) == summary


def test_deterministic_for_a_seed(synth, tmp_path):
    out, _ = synth
    generate(tmp_path / "again", events=600, seed=7, days=2, rows_per_part=150)
    assert _digest(tmp_path / "again") == _digest(out)
    generate(tmp_path / "other", events=600, seed=8, days=2, rows_per_part=150)
    assert _digest(tmp_path / "other") != _digest(out)


def test_events_follow_the_contract(synth):
    out, _ = synth
    schema = load_contract("editor_event.v1")
    validator = jsonschema.Draft202012Validator(schema)
    by_type = schema["x-required-by-type"]
    for e in iter_events(out):
        validator.validate(e)
        missing = [f for f in by_type[e["event_type"]] if e.get(f) is None]
        assert not missing, (e["event_id"], missing)


def test_editor_event_schema_agrees_with_arrow_contract():
    schema = load_contract("editor_event.v1")
    assert set(schema["properties"]) == set(EDITOR_EVENT_V1.names)
    assert set(schema["x-required-by-type"]) == {"tab_completion", "inline_edit", "chat_turn", "agent_step"}
    for fields in schema["x-required-by-type"].values():
        assert set(schema["required"]) <= set(fields) <= set(EDITOR_EVENT_V1.names)


def test_ground_truth_rows_follow_their_schema(synth):
    out, _ = synth
    validator = jsonschema.Draft202012Validator(load_contract("synth_ground_truth.v1"))
    rows = read_ground_truth(out)
    kinds = {r["kind"] for r in rows}
    assert {"pii", "exact_dup", "near_dup", "eval_leak", "malformed", "privacy_user", "optout_user", "optout_org", "preference_pair"} <= kinds
    for r in rows:
        validator.validate(r)


def _by_id(out):
    return {e["event_id"]: e for e in iter_events(out)}


def _code_doc(e: dict) -> str:
    return e["context"]["prefix"] + e["accepted_text"] + e["context"]["suffix"]


def test_every_pii_entity_is_planted_verbatim(synth):
    out, summary = synth
    events = _by_id(out)
    rows = read_ground_truth(out, "pii")
    assert {r["entity"] for r in rows} == {"EMAIL", "IP_ADDRESS", "PHONE", "PERSON", "AWS_ACCESS_KEY", "AWS_SECRET_KEY",
                                           "GITHUB_TOKEN", "SLACK_TOKEN", "OPENAI_KEY", "PRIVATE_KEY", "JWT", "PASSWORD", "HOME_PATH_USER"}
    optout = pq.read_table(out / "optouts.parquet")
    blocked = set(optout.column("user_id").to_pylist()) | set(optout.column("org_id").to_pylist())
    for r in rows:
        e = events[r["event_id"]]
        assert not e["privacy_mode"] and e["user_id"] not in blocked and e["org_id"] not in blocked
        where = e["context"]["prefix"] if r["field"] == "context.prefix" else e["messages"][0]["content"]
        assert r["value"] in where
        assert e["outcome"] in ("accepted", None)
        # the recorded file/line is where the event really is
        line = _lines(out / r["file"])[r["line"] - 1]
        assert json.loads(line)["event_id"] == r["event_id"]


def test_duplicates_are_what_they_claim(synth):
    out, _ = synth
    events = _by_id(out)
    exact = read_ground_truth(out, "exact_dup")
    assert exact
    for r in exact:
        a, b = (events[i] for i in r["event_ids"])
        assert _code_doc(a) == _code_doc(b) and a["user_id"] != b["user_id"]
    near = read_ground_truth(out, "near_dup")
    assert {r["variant"] for r in near} == {"fork", "copy_edit", "reformat"}
    for r in near:
        a, b = _code_doc(events[r["event_id_a"]]), _code_doc(events[r["event_id_b"]])
        assert a != b
        assert jaccard(a, b) == pytest.approx(r["jaccard"], abs=1e-4)
        assert r["jaccard"] >= 0.6


def test_eval_leaks_contain_the_task(synth):
    out, _ = synth
    events = _by_id(out)
    tasks = {t["task_id"]: t for t in humaneval_tasks()}
    rows = read_ground_truth(out, "eval_leak")
    assert {r["where"] for r in rows} == {"chat", "file"} and {r["edited"] for r in rows} == {True, False}
    for r in rows:
        e, t = events[r["event_id"]], tasks[r["task_id"]]
        text = json.dumps(e, ensure_ascii=False) if r["where"] == "chat" else _code_doc(e)
        body = json.loads(json.dumps(text)) if r["where"] == "file" else "\n".join(m["content"] for m in e["messages"])
        # the canonical solution's code lines are there (edits only rename the entry point)
        sol_lines = [ln for ln in t["canonical_solution"].splitlines() if ln.strip() and t["entry_point"] not in ln]
        assert all(ln in body for ln in sol_lines)
        if not r["edited"]:
            assert t["prompt"] in body


def test_malformed_lines_are_malformed(synth):
    out, summary = synth
    rows = read_ground_truth(out, "malformed")
    assert {r["malformed_kind"] for r in rows} == {"bad_json", "bad_utf8", "wrong_type", "missing_field", "unknown_event_type"}
    assert len(rows) == summary["malformed_lines"]
    validator = jsonschema.Draft202012Validator(load_contract("editor_event.v1"))
    for r in rows:
        raw = _lines(out / r["file"])[r["line"] - 1]
        if r["malformed_kind"] == "bad_utf8":
            with pytest.raises(UnicodeDecodeError):
                raw.decode("utf-8")
        elif r["malformed_kind"] == "bad_json":
            with pytest.raises(ValueError):
                json.loads(raw)
        else:
            assert not validator.is_valid(json.loads(raw))


def test_consent_expectations_match_the_events(synth):
    out, summary = synth
    optout = pq.read_table(out / "optouts.parquet").to_pylist()
    users = {r["user_id"] for r in optout if r["user_id"]}
    orgs = {r["org_id"] for r in optout if r["org_id"]}
    assert {r["user_id"] for r in read_ground_truth(out, "optout_user")} <= users
    assert {r["org_id"] for r in read_ground_truth(out, "optout_org")} == orgs
    counts = {"privacy_mode": 0, "opt_out_user": 0, "opt_out_org": 0}
    for e in iter_events(out):
        if e["privacy_mode"]:
            counts["privacy_mode"] += 1
        elif e["user_id"] in users:
            counts["opt_out_user"] += 1
        elif e["org_id"] in orgs:
            counts["opt_out_org"] += 1
    assert counts == summary["expected_consent_drops"]
    assert all(v > 0 for v in counts.values())
    kept = summary["events"] - sum(counts.values())
    assert kept > summary["events"] // 2


def test_preference_pairs_share_their_context(synth):
    out, _ = synth
    events = _by_id(out)
    rows = read_ground_truth(out, "preference_pair")
    assert rows
    for r in rows:
        rej, acc = events[r["rejected_event_id"]], events[r["accepted_event_id"]]
        assert (rej["outcome"], acc["outcome"]) == ("rejected", "accepted")
        assert rej["context"] == acc["context"] and rej["file"] == acc["file"] and rej["session_id"] == acc["session_id"]
        assert rej["suggestion"] != acc["suggestion"]


def test_small_runs_still_plant_everything(tmp_path):
    s = generate(tmp_path / "tiny", events=100, seed=3, days=1)
    assert s["events"] == 100 and s["plants_unplaced"] == 0
    gt = s["ground_truth"]
    assert gt["pii"] >= 13 and gt["exact_dup"] >= 1 and gt["near_dup"] >= 3 and gt["eval_leak"] >= 2 and gt["malformed"] == 5


def test_record_doc_id_finds_the_extracted_records(synth):
    import pyarrow as pa

    from datakit.contracts import EDITOR_EVENT_V1
    from datakit.stages.extract.stage import ExtractFn
    from datakit.synth import record_doc_id

    out, _ = synth
    events = _by_id(out)
    pair = read_ground_truth(out, "exact_dup")[0]
    rows = [{**dict.fromkeys(EDITOR_EVENT_V1.names), **events[i]} for i in pair["event_ids"]]
    batch = pa.Table.from_pylist(rows, schema=EDITOR_EVENT_V1).to_batches()[0]
    recs = ExtractFn(("code",))(batch).to_pylist()
    assert [r["doc_id"] for r in recs] == [record_doc_id(i) for i in pair["event_ids"]]
    assert recs[0]["segments"] == recs[1]["segments"]  # an exact duplicate is an identical code record


def test_tiny_populations_still_place_every_plant(tmp_path):
    s = generate(tmp_path / "few", events=300, seed=1, users=3, orgs=1)
    assert s["plants_unplaced"] == 0 and s["ground_truth"]["exact_dup"] >= 1
    with pytest.raises(ValueError, match="no consenting user"):
        generate(tmp_path / "none", events=50, seed=1, users=2)


def test_code_roots_add_languages_from_this_machine(tmp_path):
    src = tmp_path / "mysvc"
    src.mkdir()
    body = "".join(f"func handler{i}(w http.ResponseWriter, r *http.Request) {{\n\tfmt.Fprintf(w, \"ok {i}\")\n}}\n\n" for i in range(12))
    (src / "server.go").write_text("package main\n\nimport (\n\t\"fmt\"\n\t\"net/http\"\n)\n\n" + body)
    generate(tmp_path / "logs", events=400, seed=2, days=1, other_languages=1.0, code_roots=[str(src)])
    paths = {(e.get("file") or {}).get("path") for e in iter_events(tmp_path / "logs")}
    assert "mysvc/server.go" in paths


def test_regenerating_into_a_folder_leaves_no_stale_parts(tmp_path):
    generate(tmp_path / "logs", events=300, seed=1, days=5, rows_per_part=40)
    (tmp_path / "logs" / "notes.txt").write_text("mine")
    s = generate(tmp_path / "logs", events=200, seed=1, days=2)
    parts = sorted(p.relative_to(tmp_path / "logs").as_posix() for p in (tmp_path / "logs").glob("dt=*/*"))
    assert parts == s["files"] and len(list(iter_events(tmp_path / "logs"))) == 200
    assert (tmp_path / "logs" / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="rows_per_part"):
        generate(tmp_path / "x", events=10, rows_per_part=0)


def test_synth_never_touches_a_folder_it_did_not_write(tmp_path):
    """Found in a hostile-input review: synth into a folder of real logs (the same dt=*/part-* layout)
    deleted every part file, days it does not write included, and replaced the opt-out list. Now such a
    folder is refused before anything is touched; synth's own folder is still cleared (only the files its
    summary lists), and so is one an interrupted synth left with its "incomplete" mark."""
    from datakit.cli import app
    from datakit.synth import SynthArgumentError
    from typer.testing import CliRunner

    real = tmp_path / "real"
    for day, part in (("2026-10-15", "part-00000"), ("2026-11-01", "part-00005")):
        (real / f"dt={day}").mkdir(parents=True)
        (real / f"dt={day}" / f"{part}.jsonl.zst").write_bytes(b"real logs " + day.encode())
    (real / "optouts.parquet").write_bytes(b"the real opt-out list")
    before = {p: p.read_bytes() for p in real.rglob("*") if p.is_file()}
    with pytest.raises(SynthArgumentError, match="part-00000.jsonl.zst but no _synth.json"):
        generate(real, events=50, seed=1, days=1)
    r = CliRunner().invoke(app, ["synth", str(real), "--events", "50", "--days", "1"])
    err = (r.stderr or r.output).strip()
    assert r.exit_code == 2 and len(err.splitlines()) == 1 and "not logs synth wrote" in err, r.output
    assert {p: p.read_bytes() for p in real.rglob("*") if p.is_file()} == before
    only_optouts = tmp_path / "only"
    only_optouts.mkdir()
    (only_optouts / "optouts.parquet").write_bytes(b"mine")
    with pytest.raises(SynthArgumentError, match="optouts.parquet but no _synth.json"):
        generate(only_optouts, events=50, seed=1, days=1)
    assert (only_optouts / "optouts.parquet").read_bytes() == b"mine"

    ours = tmp_path / "ours"
    first = generate(ours, events=300, seed=1, days=3, rows_per_part=40)
    (ours / "dt=2026-11-02" / "part-00099.jsonl.zst").write_bytes(b"a user's own part")  # not synth's: kept
    second = generate(ours, events=100, seed=1, days=1)
    parts = sorted(p.relative_to(ours).as_posix() for p in ours.glob("dt=*/*"))
    assert set(first["files"]) - set(second["files"]) and parts == sorted(second["files"] + ["dt=2026-11-02/part-00099.jsonl.zst"])
    # an interrupted synth: its mark is on the folder, its parts are cleared by the next run
    (ours / "_synth.json").write_text('{"incomplete": true, "files": []}')
    (ours / "dt=2026-11-05").mkdir()
    (ours / "dt=2026-11-05" / "part-00000.jsonl.zst").write_bytes(b"half written")
    third = generate(ours, events=100, seed=1, days=1)
    assert not (ours / "dt=2026-11-05").exists() and third == second
    (ours / "_synth.json").write_text("{not json")
    with pytest.raises(SynthArgumentError, match="is damaged"):
        generate(ours, events=100, seed=1, days=1)


def test_repository_projects_carry_their_ground_truth(tmp_path):
    """generate(repositories=N): multi-file projects whose import edges, final texts and feedback
    retention are what the ground truth says (checked on the events themselves)."""
    out = tmp_path / "repos"
    s = generate(out, events=60, seed=2, days=2, repositories=5)
    validator = jsonschema.Draft202012Validator(load_contract("synth_ground_truth.v1"))
    for row in read_ground_truth(out):
        validator.validate(row)
    events = _by_id(out)
    assert s["events"] == len(events) > 60
    repos = read_ground_truth(out, "repository")
    files = read_ground_truth(out, "repo_file")
    assert len(repos) == 5 and len(files) == sum(len(r["files"]) for r in repos)
    # imports form a DAG inside the repository
    for r in repos:
        deps = {f["path"]: f["imports"] for f in files if f["repo_id"] == r["repo_id"]}
        seen: set[str] = set()
        order: list[str] = []

        def visit(p: str, stack: tuple[str, ...] = ()) -> None:
            assert p not in stack, f"import cycle through {p}"
            if p not in seen:
                for d in deps[p]:
                    assert d in deps
                    visit(d, stack + (p,))
                seen.add(p)
                order.append(p)

        for p in sorted(deps):
            visit(p)
    # the newest accepted completion of each file rebuilds its final text
    newest: dict[tuple[str, str], dict] = {}
    for e in events.values():
        if e["repo"]["repo_id"] in {r["repo_id"] for r in repos} and e["outcome"] == "accepted":
            key = (e["repo"]["repo_id"], e["file"]["path"])
            if key not in newest or e["timestamp"] > newest[key]["timestamp"]:
                newest[key] = e
    for f in files:
        e = newest[(f["repo_id"], f["path"])]
        text = e["context"]["prefix"] + e["accepted_text"] + e["context"]["suffix"]
        assert hashlib.sha256(text.encode()).hexdigest() == f["sha256"]
    # retention: the accepted text is in the next event's file iff the ground truth says it was kept
    fb = read_ground_truth(out, "feedback")
    assert {r["outcome"] for r in fb} == {"accepted", "partial", "rejected", "ignored"}
    assert {r["retained"] for r in fb} == {True, False, None}
    for r in fb:
        e = events[r["event_id"]]
        assert e["outcome"] == r["outcome"] and e["latency_ms"] == r["latency_ms"]
        if r["retained"] is not None:
            nxt = events[r["next_event_id"]]
            assert nxt["session_id"] == e["session_id"] and nxt["file"]["path"] == e["file"]["path"]
            assert (e["accepted_text"] in nxt["context"]["prefix"] + nxt["context"]["suffix"]) == r["retained"]
