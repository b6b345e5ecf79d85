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


# --- datakit diff: a side whose data files do not match its manifest is "cannot compare" ----------------

def _tokens_file(d: Path) -> Path:
    m = json.loads((d / "manifest.json").read_text())
    return d / m["shards"][1]["arrays"]["tokens"]


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[:100])


def _flip_last_byte(f: Path) -> None:
    blob = bytearray(f.read_bytes())
    blob[-1] ^= 1
    f.write_bytes(bytes(blob))


@pytest.mark.parametrize("damage, said", [
    (lambda f: f.unlink(), "is missing"),
    (_truncate, "has 100 bytes, the manifest says"),
    (_flip_last_byte, "fails its sha256 check"),  # same size: only hashing sees it
])
def test_diff_refuses_a_side_whose_data_file_is_missing_truncated_or_changed(outputs, tmp_path, damage, said):
    a = outputs["packed"]
    assert _invoke("diff", a, _copy(a, tmp_path / "same")).exit_code == 0  # an intact copy: same data
    b = _copy(a, tmp_path / "b")
    f = _tokens_file(b)
    damage(f)
    rel = f.relative_to(b).as_posix()
    for args in ((a, b), (b, a)):
        r = _invoke("diff", *args)
        assert r.exit_code == 2, (args, r.output, r.exception)
        line = _one_error_line(r)
        assert line.startswith(f"datakit: error: cannot compare {args[0]} and {args[1]}: {b}: data file {rel} {said}")
        assert "verdict" not in r.stdout


def test_diff_of_a_parquet_output_missing_a_data_file_is_one_line(outputs, tmp_path):
    """Found in review: `diff failed unexpectedly (AttributeError)`: the FileNotFoundError's first argument
    was its errno, which the error line could not print."""
    b = _copy(outputs["parquet"], tmp_path / "b")
    gone = sorted((b / "data").glob("*.parquet"))[-1]
    gone.unlink()
    r = _invoke("diff", outputs["parquet"], b)
    assert r.exit_code == 2, (r.output, r.exception)
    assert f"data file data/{gone.name} is missing" in _one_error_line(r)


def test_an_os_error_with_an_errno_is_one_line_naming_its_file_in_diff_and_report(monkeypatch, tmp_path):
    """The commands' own handlers, for an OSError raised where nothing named the path in words."""
    import datakit.quality.diff as diff_mod
    import datakit.quality.report as report_mod

    def gone(*_a, **_k):
        raise FileNotFoundError(2, "No such file or directory", "/x/data/part-00001.parquet")

    monkeypatch.setattr(diff_mod, "diff", gone)
    monkeypatch.setattr(report_mod, "write_report", gone)
    for args in (["diff", tmp_path / "a", tmp_path / "b"], ["report", tmp_path / "a"]):
        r = _invoke(*args)
        assert r.exit_code == 2, (args, r.output, r.exception)
        assert _one_error_line(r) == "datakit: error: /x/data/part-00001.parquet: No such file or directory"


def test_diff_refuses_json_and_html_both_to_standard_output(outputs):
    """Found in review: JSON then HTML on one stream, exit 0; as contamination-check does, refused."""
    r = _invoke("diff", outputs["packed"], outputs["packed"], "--json", "-", "--html", "-")
    assert r.exit_code == 2 and r.stdout == ""
    assert _one_error_line(r) == ("datakit: error: --json - and --html - both write to standard output; "
                                  "give one of them a file")
    r = _invoke("diff", outputs["packed"], outputs["packed"], "--json", "-")  # one of them: still fine
    assert r.exit_code == 0 and json.loads(r.stdout)["verdict"] == "same data"


# --- datakit validate: a truncated or unreadable array is an input error naming the file ----------------

def test_validate_of_a_truncated_array_names_the_file_and_its_size_exit_2(outputs, tmp_path):
    """Found in review: `datakit: error: EOF: reading array header, expected 118 bytes got 90`, no file named.
    (A whole array of another shape is still the packed suite's failed check: tests/test_quality_packed.py.)"""
    d = _copy(outputs["packed"], tmp_path / "d")
    f = _tokens_file(d)
    recorded = f.stat().st_size
    _truncate(f)
    r = _invoke("validate", d, "--workers", "1")
    assert r.exit_code == 2, (r.output, r.exception)
    assert _one_error_line(r) == (f"datakit: error: {d}: data file {f.relative_to(d).as_posix()} has 100 bytes, the "
                                  f"manifest says {recorded} (interrupted rewrite or changed file; rerun the pipeline)")


def test_validate_of_an_array_whose_header_was_overwritten_names_the_file_exit_2(outputs, tmp_path):
    d = _copy(outputs["packed"], tmp_path / "d")
    f = _tokens_file(d)
    blob = bytearray(f.read_bytes())
    blob[:6] = b"XXXXXX"  # same size, no longer a .npy file
    f.write_bytes(bytes(blob))
    r = _invoke("validate", d, "--workers", "1")
    assert r.exit_code == 2, (r.output, r.exception)
    assert f"data file {f.relative_to(d).as_posix()} is not a readable array" in _one_error_line(r)


def test_inspect_refuses_negative_counts(outputs):
    """Found in review: `--max-chars -5` clipped with a negative slice and `-n -1` showed nothing, exit 0."""
    for args, said in ((["--max-chars", "-5"], "--max-chars must be 0 or more (got -5)"),
                       (["-n", "-1"], "--sequences must be 0 or more (got -1)")):
        r = _invoke("inspect", outputs["packed"], *args)
        assert r.exit_code == 2 and r.stdout == "", (args, r.output)
        assert _one_error_line(r) == f"datakit: error: {said}"
    r = _invoke("inspect", outputs["packed"], "-n", "0", "--max-chars", "0")  # zero is allowed: summary only
    assert r.exit_code == 0 and "tokens" in r.stdout
