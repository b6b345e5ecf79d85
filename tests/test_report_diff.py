"""_report.html rendered by headless Chromium with every section, and `datakit diff` on matched runs."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from datakit import Pipeline
from datakit.quality.diff import diff
from datakit.quality.report import SECTIONS

TOKENIZER = Path(__file__).resolve().parent / "data" / "tokenizer" / "tokenizer.json"


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    from datakit.synth.generator import generate

    root = tmp_path_factory.mktemp("logs")
    generate(root, events=400, seed=5, days=1, rows_per_part=200)
    return root


def quickstart(logs: Path, out: Path, threshold: float = 0.8) -> Pipeline:
    return (Pipeline("report-test").input(str(logs / "dt=*" / "*.jsonl.zst"))
            .add({"kind": "ingest"})
            .add({"kind": "consent", "optouts": str(logs / "optouts.parquet")})
            .add({"kind": "extract", "kinds": ["code", "fim", "sft"],
                  "expect": [{"type": "expect_column_values_to_be_in_set", "severity": "warn",
                              "kwargs": {"column": "kind", "value_set": ["code", "fim"]}}]})
            .add({"kind": "scrub_pii", "ner": "off"})
            .add({"kind": "dedup", "minhash": {"threshold": threshold}})
            .add({"kind": "decontaminate", "evals": ["humaneval"]})
            .add({"kind": "tokenize", "tokenizer": str(TOKENIZER), "seq_len": 512})
            .output(str(out), format="packed", shards=2))


@pytest.fixture(scope="module")
def run_a(logs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("a") / "out"
    res = quickstart(logs, out).run(workers=1, report=True)
    assert res.extra["report"].endswith("_report.html")
    return out


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (Debian package `chromium`; `make test` installs it when run as root)")
    return exe


def test_report_renders_in_headless_chromium_with_every_section(run_a, tmp_path):
    from PIL import Image

    exe = _chromium()
    page = run_a / "_report.html"
    text = page.read_text()
    assert "http://" not in text and "https://" not in text and "<script" not in text  # self-contained
    args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "shot.png"
    subprocess.run(args + ["--window-size=1200,4000", f"--screenshot={shot}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    dom = subprocess.run(args + ["--dump-dom", page.as_uri()], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    for key, title in SECTIONS:
        assert f'id="{key}"' in dom and title in dom, title
    assert dom.count("data:image/png;base64,") >= 7  # funnel, 4 length plots, PII, contamination, packing, tokens
    for word in ("ingest", "near_duplicate", "humaneval", "fill_rate", "expect_column_values_to_be_in_set"):
        assert word in dom
    img = Image.open(shot).convert("L")
    hist = img.histogram()
    non_white = sum(hist[:250]) / (img.width * img.height)
    assert non_white > 0.02, f"screenshot looks blank ({non_white:.3%} non-white pixels)"
    assert sum(1 for n in hist if n) > 20  # plots and text, not a flat page


def test_report_shows_no_text_of_the_data(run_a):
    """Counts and names only: no document text (the planted PII and secrets in particular)."""
    import pyarrow.parquet as pq

    page = (run_a / "_report.html").read_text()

    m = json.loads((run_a / "manifest.json").read_text())
    ids = pq.read_table(run_a / m["shards"][0]["arrays"]["docs"]).column("doc_id").to_pylist()
    assert ids and not any(i in page for i in ids)
    assert "@" not in page.replace("@media", "")


def test_diff_of_runs_differing_by_one_stage_option(logs, run_a, tmp_path):
    from typer.testing import CliRunner

    from datakit.cli import app

    b = tmp_path / "b"
    quickstart(logs, b, threshold=0.4).run(workers=1)
    d = diff(str(run_a), str(b))
    assert [(c["path"], c["change"], c["a"], c["b"]) for c in d["config"]] == \
        [("stages[dedup].minhash.threshold", "changed", 0.8, 0.4)]
    moved = {s["stage"] for s in d["stages"] if s["rows_out"]["delta"]}
    assert "dedup" in moved and "ingest" not in moved
    assert d["verdict"] == "data differs" and d["documents"]["removed"] > 0
    assert d["documents"]["removed"] == -d["stages"][4]["rows_out"]["delta"] + d["documents"]["added"]
    assert d["tokens"]["unit"] == "tokens" and d["tokens"]["total"]["delta"] < 0

    r = CliRunner().invoke(app, ["diff", str(run_a), str(b), "--json", str(tmp_path / "d.json"),
                                 "--html", str(tmp_path / "d.html")])
    assert r.exit_code == 1 and r.output.splitlines()[0] == "verdict: data differs"
    assert "stages[dedup].minhash.threshold: 0.8 -> 0.4" in r.output
    assert json.loads((tmp_path / "d.json").read_text())["config"] == d["config"]
    assert "stages[dedup].minhash.threshold" in (tmp_path / "d.html").read_text()


def test_diff_of_identical_runs_says_same_data(logs, run_a, tmp_path, caplog):
    c = tmp_path / "c"
    quickstart(logs, c).run(workers=1)
    from datakit import progress

    progress.configure("log")
    try:
        with caplog.at_level("INFO", logger="datakit.progress"):
            d = diff(str(run_a), str(c))
    finally:
        progress.configure("auto")
    assert d["verdict"] == "same data" and d["config"] == []
    # the hash pass that backs "same data" reads both outputs: it says so, with the rows it covered
    rows = sum(json.loads((p / "manifest.json").read_text())["rows"] for p in (run_a, c))
    done = [r.progress for r in caplog.records if getattr(r, "progress", {}).get("done")]
    assert [(f["step"], f["rows"], f["tasks"]) for f in done] == [
        ("diff: hashing both outputs' data files (tasks: files)", rows, d["files"]["a"] + d["files"]["b"])]
    assert d["documents"]["added"] == d["documents"]["removed"] == 0
    # one flipped byte in one data file: counts agree, the verdict does not
    m = json.loads((c / "manifest.json").read_text())
    rel = m["shards"][0]["arrays"]["tokens"]
    f = c / rel
    blob = bytearray(f.read_bytes())
    blob[-1] ^= 1
    f.write_bytes(bytes(blob))
    m["shards"][0]["sha256"][rel] = __import__("hashlib").sha256(bytes(blob)).hexdigest()
    (c / "manifest.json").write_text(json.dumps(m))
    d = diff(str(run_a), str(c))
    assert d["verdict"] == "data differs" and d["files"]["differing"] == [rel]


def test_diff_of_event_outputs_compares_event_ids(tmp_path):
    from tests.eventgen import make_event, write_jsonl

    for name, n in (("a", 20), ("b", 18)):
        write_jsonl(tmp_path / f"logs-{name}" / "a.jsonl", [make_event(i) for i in range(n)])
        (Pipeline("events").input(str(tmp_path / f"logs-{name}")).add({"kind": "ingest"})
         .output(str(tmp_path / name), shards=2).run(workers=1))
    d = diff(str(tmp_path / "a"), str(tmp_path / "b"))
    assert d["documents"]["key"] == "event_id"
    assert (d["documents"]["removed"], d["documents"]["added"], d["documents"]["common"]) == (2, 0, 18)
    assert d["documents"]["removed_ids"] == ["ev-000018", "ev-000019"]
    assert [c["path"] for c in d["config"]] == ["input.path"]


@pytest.mark.parametrize("fmt", ["packed", "megatron"])
def test_report_of_each_token_format_renders_its_packing_section(tmp_path, fmt):
    """A megatron output stores documents unpadded (its shards have no padding count): the report
    shows its totals and no fill-rate plot instead of failing after the data was published."""
    from datakit.quality.report import render
    from datakit.stages.tokenize.direct import build_dataset
    from datakit.stages.tokenize.stage import TokenizeConfig
    from tests.stages.test_tokenize import code_records, table

    m = build_dataset(table(code_records(20, max_chars=400)), str(tmp_path / "out"),
                      TokenizeConfig(tokenizer=str(TOKENIZER), seq_len=64), shards=2, format=fmt)
    section = render({"stages": []}, m).split('<section id="packing">')[1].split("</section>")[0]
    assert "seq_len" in section and f"{m['totals']['tokens']:,}" in section
    assert ("<img" in section) == (fmt == "packed")  # the fill-rate plot


def test_a_null_setting_given_fields_is_listed_by_its_fields_only():
    """Found in review: A without minhash and B with one said `stages[dedup].minhash: removed (null)` before
    listing B's minhash fields as added."""
    from datakit.quality.diff import config_diff

    a = {"stages": [{"kind": "dedup", "minhash": None, "exact": True}]}
    b = {"stages": [{"kind": "dedup", "minhash": {"threshold": 0.8, "bands": 9}, "exact": True}]}
    assert [(d["path"], d["change"]) for d in config_diff(a, b)] == [
        ("stages[dedup].minhash.bands", "added"), ("stages[dedup].minhash.threshold", "added")]
    assert {d["change"] for d in config_diff(b, a)} == {"removed"} and len(config_diff(b, a)) == 2
    assert config_diff({"x": None}, {"x": 1}) == [{"path": "x", "change": "changed", "a": None, "b": 1}]
