"""`datakit run --log-format json / --quiet`: one JSON object per line with per-step progress, no PII anywhere."""
from __future__ import annotations

import json
import logging

import pytest
import yaml
from typer.testing import CliRunner

from datakit import progress
from datakit.cli import app
from datakit.logs import JsonFormatter, RedactingFilter
from tests.eventgen import make_event, write_jsonl

EMAIL = "jane.doe@example.org"


def _pipeline(tmp_path, expect: bool = False) -> str:
    events = [make_event(i) for i in range(30)]
    events[2]["messages"] = [{"role": "user", "content": f"mail {EMAIL} please"},
                             {"role": "assistant", "content": "ok"}]
    write_jsonl(tmp_path / "logs" / "a.jsonl", events[:15])
    write_jsonl(tmp_path / "logs" / "b.jsonl", events[15:])
    spec = {"name": "logs", "input": {"path": str(tmp_path / "logs")},
            "stages": [{"kind": "ingest"}, {"kind": "extract", "kinds": ["code", "sft"]}, {"kind": "scrub_pii", "ner": "off"}],
            "output": {"path": str(tmp_path / "out"), "shards": 2}}
    if expect:  # great_expectations sets one of its loggers to INFO when it is imported
        spec["stages"][1]["expect"] = [{"type": "expect_column_values_to_not_be_null", "severity": "warn",
                                        "kwargs": {"column": "doc_id"}}]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.fixture(autouse=True)
def _restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("datakit").setLevel(logging.NOTSET)
    progress.configure("auto")


@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=pytest.mark.spark)])
def test_json_logs_carry_progress_and_no_pii(request, tmp_path, engine):
    args = ["run", _pipeline(tmp_path), "--log-format", "json", "--no-report", "--engine", engine]
    if engine == "spark":
        request.getfixturevalue("spark")
        args += ["--master", "local[2]"]
    else:
        args += ["--workers", "2"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    objs = [json.loads(ln) for ln in lines]  # every line is one JSON object
    steps = [o["progress"] for o in objs if "progress" in o]
    done = [s for s in steps if s.get("done") and s["step"] != "run"]
    assert done and all({"rows", "rows_per_s", "eta_s", "seconds"} <= set(s) for s in done)
    # a finished step has done all its tasks (found in review: Spark's said 9 of 14, skipped stages counted)
    assert all(s["tasks_done"] == s["tasks"] for s in done if s.get("tasks")), done
    assert any(s["rows"] > 0 for s in done)
    assert any("extract" in s["step"] for s in done)
    assert objs[-1]["progress"]["step"] == "run"
    assert EMAIL not in r.stderr and EMAIL not in r.stdout


def test_quiet_prints_nothing(tmp_path):
    r = CliRunner().invoke(app, ["run", _pipeline(tmp_path), "--quiet", "--no-report", "--workers", "1"])
    assert r.exit_code == 0 and r.stdout == "" and r.stderr == ""
    assert (tmp_path / "out" / "manifest.json").exists()


def test_quiet_command_prints_nothing_on_a_pipe(tmp_path):
    """The installed command as CI runs it (stderr not a terminal, so INFO lines are on until
    --quiet): it said "small input ... running in-process" on stderr despite --quiet, and (found in
    review) great_expectations' INFO line about its temporary docs folder."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "datakit.cli", "run", _pipeline(tmp_path, expect=True), "--quiet", "--no-report"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stderr[-2000:]


def test_every_log_line_is_redacted():
    rec = logging.LogRecord("datakit.x", logging.WARNING, __file__, 1, "cannot read %s for %s",
                            ("/home/jane/key.txt", EMAIL), None)
    assert RedactingFilter().filter(rec)
    line = JsonFormatter().format(rec)
    obj = json.loads(line)
    assert EMAIL not in line and obj["level"] == "warning" and obj["msg"].startswith("cannot read")


def test_log_lines_are_redacted_when_the_scrubber_cannot_load(monkeypatch):
    """presidio or a model file missing: the line is redacted by the regex fallback, not lost with an
    ImportError (which failed the contamination check's own warning about that fallback, and the check)."""
    import builtins

    from datakit.quality import expect

    real_import = builtins.__import__

    def no_scrubber(name, *a, **k):
        if name == "datakit.stages.scrub_pii.stage":
            raise ImportError("presidio missing (simulated)")
        return real_import(name, *a, **k)

    monkeypatch.setattr(expect, "_SCRUB", None)
    monkeypatch.setattr(builtins, "__import__", no_scrubber)
    rec = logging.LogRecord("datakit.x", logging.WARNING, __file__, 1, "mail %s token %s", (EMAIL, SECRET), None)
    assert RedactingFilter().filter(rec)
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert rec.getMessage() == "mail <EMAIL> token <GITHUB_TOKEN>"
    assert expect._SCRUB is None  # not cached: the next line tries the scrubber again


def test_step_rate_and_eta():
    st = progress.Step("extract", total=4, mode="log", interval=0)
    st.advance(rows=100)
    st.advance(rows=100)
    f = st.fields()
    assert (f["tasks_done"], f["tasks"], f["rows"]) == (2, 4, 200)
    assert f["eta_s"] is not None and f["eta_s"] >= 0 and f["rows_per_s"] > 0
    st.finish(ok=True)
    assert st.fields()["tasks_done"] == 4


SECRET = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


def _log_in_worker(email: str) -> int:
    """Runs in a spawned pool worker: a log line quoting personal data and a secret."""
    import os

    logging.getLogger("datakit.engine.local").warning("cannot parse a line of %s (token %s)", email, SECRET)
    return os.getpid()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_log_lines_inside_pool_workers_are_redacted(capfd, fmt):
    """Spawned workers used to log through Python's last-resort handler: raw to stderr, no filter."""
    import os

    from datakit.logs import configure
    from datakit.workers import drop_pool, pool

    configure(fmt)
    try:
        pid = pool(2).submit(_log_in_worker, EMAIL).result(timeout=300)
    finally:
        drop_pool(2, wait=True)
    assert pid != os.getpid()  # it really ran in another process
    err = capfd.readouterr().err
    line = next(ln for ln in err.splitlines() if "cannot parse" in ln)
    assert EMAIL not in err and SECRET not in err
    assert "<EMAIL>" in line and "<GITHUB_TOKEN>" in line
    if fmt == "json":
        assert json.loads(line)["logger"] == "datakit.engine.local"
