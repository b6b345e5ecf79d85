"""Commands given a damaged output (found in a hostile-input review): one line naming what is wrong, exit 2.

Never "failed unexpectedly ... this is a bug" (exit 3), and never a verdict about data that was not there.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from datakit import Pipeline
from datakit.cli import app
from tests.eventgen import make_event, write_jsonl

TOKENIZER = Path(__file__).resolve().parent / "data" / "tokenizer" / "tokenizer.json"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """A small packed output and a small Parquet output of the same events."""
    root = tmp_path_factory.mktemp("outputs")
    write_jsonl(root / "logs" / "a.jsonl", [make_event(i) for i in range(40)])
    out = {}
    for fmt in ("packed", "parquet"):
        p = Pipeline("p").input(str(root / "logs")).add({"kind": "ingest"}).add(
            {"kind": "extract", "kinds": ["code", "fim", "sft"]})
        if fmt == "packed":
            p = p.add({"kind": "tokenize", "tokenizer": str(TOKENIZER), "seq_len": 64, "packing": "best_fit"})
        out[fmt] = root / fmt
        p.output(str(out[fmt]), format=fmt, shards=2).run(workers=1)
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def _one_error_line(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("datakit: error:")]
    assert len(lines) == 1, r.stderr
    assert "unexpectedly" not in lines[0] and "this is a bug" not in lines[0]
    return lines[0]


# --- manifest.json (or _run.json) that is not a JSON object, or not JSON -------------------------------

@pytest.mark.parametrize("body", ["[]", "3", '"x"', "null"])
def test_a_manifest_that_is_not_an_object_is_one_line_on_every_command(outputs, tmp_path, body):
    bad = _copy(outputs["packed"], tmp_path / "bad")
    (bad / "manifest.json").write_text(body)
    for args in (["inspect", bad], ["validate", bad], ["diff", outputs["packed"], bad], ["diff", bad, outputs["packed"]],
                 ["contamination-check", "--data", bad, "--eval", "humaneval", "--no-index"], ["report", bad]):
        r = _invoke(*args)
        assert r.exit_code == 2, (args, r.output, r.exception)
        line = _one_error_line(r)
        assert "manifest.json is damaged: not a JSON object" in line, (args, line)


def test_report_on_a_damaged_run_report_or_manifest_is_one_line_exit_2(outputs, tmp_path):
    for name, body, said in (("_run.json", "{bad", "not valid JSON"), ("_run.json", "[1]", "not a JSON object"),
                             ("manifest.json", "{bad", "not valid JSON")):
        d = _copy(outputs["packed"], tmp_path / f"{name}-{len(body)}")
        (d / name).write_text(body)
        r = _invoke("report", d)
        assert r.exit_code == 2, (name, body, r.output, r.exception)
        assert f"{name} is damaged: {said}" in _one_error_line(r)


def test_contamination_check_refuses_a_datakit_output_whose_manifest_is_not_json(outputs, tmp_path):
    """A folder with datakit's `_SUCCESS` marker is a datakit output: a damaged manifest is refused rather
    than reading the folder as someone else's files."""
    d = _copy(outputs["parquet"], tmp_path / "d")
    (d / "manifest.json").write_text("{bad")
    r = _invoke("contamination-check", "--data", d, "--eval", "humaneval", "--no-index")
    assert r.exit_code == 2 and "manifest.json is damaged: not valid JSON" in _one_error_line(r)


def test_someone_elses_folder_with_a_manifest_of_its_own_is_still_read_as_its_files(outputs, tmp_path):
    d = tmp_path / "theirs"
    d.mkdir()
    shutil.copy(next((outputs["parquet"] / "data").glob("*.parquet")), d / "part.parquet")
    (d / "manifest.json").write_text('["part.parquet"]')  # their own manifest, not datakit's (no _SUCCESS)
    r = _invoke("contamination-check", "--data", d, "--eval", "humaneval", "--no-index")
    assert r.exit_code in (0, 1), (r.output, r.exception)
    assert "damaged" not in r.output
