"""The `datakit` command: exit codes, help, run/explain on a real pipeline file (as a subprocess)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.eventgen import make_event, write_jsonl

DATAKIT = [sys.executable, "-m", "datakit.cli"]


def _cli(*args, cwd=None):
    return subprocess.run(DATAKIT + [str(a) for a in args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture
def pipeline_file(tmp_path):
    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(12)] + [b"oops"])
    f = tmp_path / "p.yaml"
    f.write_text("name: cli\ninput: {path: logs/*.jsonl}\nstages: [{kind: ingest}]\noutput: {path: out, shards: 2}\n")
    return f


def test_run_prints_counts_and_writes_report(pipeline_file, tmp_path):
    r = _cli("run", pipeline_file, "--workers", "1", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["stages"][0]["rows_in"] == 13 and report["stages"][0]["dropped"] == {"bad_json": 1}
    assert (tmp_path / "out" / "_run.json").exists()


def test_a_pipeline_without_output_says_so(pipeline_file, tmp_path):
    """Found in review: it printed `output: None  (0 rows, ...)` though its last stage made 12 rows."""
    f = tmp_path / "nooutput.yaml"
    f.write_text("name: cli\ninput: {path: logs/*.jsonl}\nstages: [{kind: ingest}]\n")
    r = _cli("run", f, "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "no output: the pipeline has no `output:` (nothing written; its last stage made 12 rows;" in r.stdout
    assert "output: None" not in r.stdout


def test_input_and_output_overrides(pipeline_file, tmp_path):
    write_jsonl(tmp_path / "other" / "b.jsonl", [make_event(i) for i in range(3)])
    r = _cli("run", pipeline_file, "--input", tmp_path / "other" / "*.jsonl", "--output", tmp_path / "o2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stages"][0]["rows_out"] == 3
    assert (tmp_path / "o2" / "manifest.json").exists()


def test_relative_override_paths_are_relative_to_the_current_folder(pipeline_file, tmp_path):
    """Found in review: `--output out/x` wrote beside the pipeline file, not where the shell was; the
    file's own paths stay relative to the file."""
    here = tmp_path / "elsewhere"
    here.mkdir()
    write_jsonl(here / "in" / "b.jsonl", [make_event(i) for i in range(3)])
    r = _cli("run", pipeline_file, "--workers", "1", "--input", "in/*.jsonl", "--output", "rel-out", "--json", cwd=here)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stages"][0]["rows_out"] == 3
    assert (here / "rel-out" / "manifest.json").exists() and not (tmp_path / "rel-out").exists()
    r = _cli("run", pipeline_file, "--workers", "1", "--json", cwd=here)  # the file's paths: beside the file
    assert r.returncode == 0, r.stderr and (tmp_path / "out" / "manifest.json").exists()


def test_python_api_overrides_are_relative_to_the_current_folder(pipeline_file, tmp_path, monkeypatch):
    """Found in review: examples/spark_driver.py passes `--output out` to `Pipeline.run`, which put it
    beside the pipeline file; a path a program passes means what `open()` would."""
    from datakit import Pipeline

    here = tmp_path / "elsewhere"
    here.mkdir()
    write_jsonl(here / "in" / "b.jsonl", [make_event(i) for i in range(3)])
    monkeypatch.chdir(here)
    p = Pipeline.from_yaml(pipeline_file)
    assert p.compile(input_override="in/*.jsonl").config["input"]["path"] == str(here / "in" / "*.jsonl")
    res = p.run(input="in/*.jsonl", output="rel-out", workers=1)
    assert res.output_path == str(here / "rel-out") and res.stages[0]["rows_out"] == 3
    assert (here / "rel-out" / "manifest.json").exists() and not (tmp_path / "rel-out").exists()


@pytest.mark.parametrize("args, needle", [
    (["run", "missing.yaml"], "not found"),
    (["run", "{pf}", "--input", "/nonexistent/*.jsonl"], "no input files match"),
    (["run", "{pf}", "--engine", "quantum"], "unknown engine"),
    (["explain", "{bad}"], "unknown stage kind"),
    (["run", "{tok}", "--workers", "1"], "tokenizer not found"),  # found in review: was a traceback, exit 1
    (["synth", "{pf}", "--events", "100"], "is a file"),  # found in review: was a traceback, exit 1
    (["run", "{pf}", "--engine", "spark", "--conf", "spark.executor.memory"], "expected KEY=VALUE"),  # (review)
    # found in review: tracebacks with exit 1 ("a check failed"), a data file blamed, options dropped silently
    (["synth", "{tmp}/s1", "--days", "0"], "days must be >= 1"),
    (["synth", "{tmp}/s2", "--start-date", "2026-13-01"], "'2026-13-01' is not a date"),
    (["build-index", "{tmp}", "--out", "{tmp}/ix", "--ngram", "0"], "ngram must be >= 1"),
    (["run", "{pf}", "--partitions", "4", "--conf", "a=b"], "--partitions, --conf apply to --engine spark only"),
    (["run", "{pf}", "--engine", "spark", "--workers", "2"], "--workers applies to --engine local only"),
    # an empty path (an unset variable) was read as the current folder (found in review)
    (["run", "{pf}", "--input", ""], "an empty path names no file or folder"),
    (["validate", ""], "an empty path names no file or folder"),
    (["inspect", " "], "an empty path names no file or folder"),
    (["diff", "", "{tmp}"], "an empty path names no file or folder"),
    (["report", ""], "an empty path names no file or folder"),
    (["forget", "{tmp}", "--optouts", ""], "an empty path names no file or folder"),
    (["contamination-check", "--data", "", "--eval", "humaneval"], "an empty path names no file or folder"),
])
def test_usage_and_input_errors_exit_2_with_one_line(pipeline_file, tmp_path, args, needle):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ninput: {path: logs/*.jsonl}\nstages: [{kind: nope}]\n")
    tok = tmp_path / "tok.yaml"
    tok.write_text("name: x\ninput: {path: logs/*.jsonl}\nstages: [{kind: ingest}, {kind: extract}, "
                   "{kind: tokenize, tokenizer: ./missing/tokenizer.json}]\noutput: {path: out-tok, format: packed}\n")
    args = [a.format(pf=pipeline_file, bad=bad, tok=tok, tmp=tmp_path) for a in args]
    r = _cli(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_explain_prints_plan(pipeline_file):
    r = _cli("explain", pipeline_file)
    assert r.returncode == 0 and "MapBatches(parse_validate" in r.stdout
    dot = _cli("explain", pipeline_file, "--format", "dot")
    assert dot.returncode == 0 and dot.stdout.startswith("digraph plan {")
    bad = _cli("explain", pipeline_file, "--format", "svg")
    assert bad.returncode == 2 and "unknown --format" in bad.stderr


@pytest.mark.parametrize("cmd", ["run", "explain", "synth"])
def test_help_for_every_command(cmd):
    r = _cli(cmd, "--help")
    assert r.returncode == 0 and "Usage" in r.stdout


def test_append_mode_snapshot_and_forget_cli(tmp_path):
    write_jsonl(tmp_path / "logs" / "dt=2026-11-02" / "a.jsonl", [make_event(i) for i in range(5)])
    f = tmp_path / "daily.yaml"
    f.write_text("name: daily\ninput: {path: logs/dt=2026-11-02/*.jsonl}\nstages: [{kind: ingest}]\n"
                 "output: {path: ds, mode: append}\n")
    r = _cli("run", f, "--workers", "1", "--json", cwd=tmp_path)  # snapshot id from the partition folder
    assert r.returncode == 0, r.stderr
    top = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert [s["id"] for s in top["snapshots"]] == ["dt=2026-11-02"] and top["rows"] == 5
    r = _cli("run", f, "--workers", "1", "--json", "--snapshot", "manual-1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [s["id"] for s in json.loads((tmp_path / "ds" / "manifest.json").read_text())["snapshots"]] == [
        "dt=2026-11-02", "manual-1"]
    assert json.loads(r.stdout)["withdrawn"] == []
    plain = tmp_path / "plain.yaml"  # an overwrite-mode dataset: forget says what to do with it (found in review)
    plain.write_text("name: plain\ninput: {path: logs/dt=2026-11-02/*.jsonl}\nstages: [{kind: ingest}]\n"
                     "output: {path: plain-out}\n")
    assert _cli("run", plain, "--workers", "1", cwd=tmp_path).returncode == 0
    for args, needle in ((["run", f, "--snapshot", "a/b"], "invalid snapshot id"),
                         (["forget", tmp_path / "nothing", "--optouts", tmp_path / "x.parquet"], "no append-mode dataset"),
                         (["forget", "plain-out", "--optouts", "x.parquet"],
                          "plain-out is an overwrite-mode dataset; `datakit forget` rewrites the snapshots of an "
                          "append-mode dataset (output mode: append). For this one, run a pipeline whose input is this output")):
        r = _cli(*args, cwd=tmp_path)
        assert r.returncode == 2 and needle in r.stderr, (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "nothing").exists()


def test_forget_cli_speaks_to_schedulers(tmp_path):
    """Found in an operations review: `datakit forget` had no --log-format, --json or --quiet, and a
    deletion job on a cluster could not name its Spark master."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    events = [make_event(i) for i in range(6)]
    write_jsonl(tmp_path / "logs" / "dt=2026-11-02" / "a.jsonl", events)
    f = tmp_path / "daily.yaml"
    f.write_text("name: daily\ninput: {path: logs/dt=2026-11-02/*.jsonl}\n"
                 "stages: [{kind: ingest}, {kind: extract, kinds: [sft, fim, code]}]\noutput: {path: ds, mode: append}\n")
    assert _cli("run", f, "--workers", "1", cwd=tmp_path).returncode == 0
    from datakit.io.dataset import read_output

    rows = json.loads((tmp_path / "ds" / "manifest.json").read_text())["rows"]
    ids = sorted({s["event_id"] for s in read_output(str(tmp_path / "ds"), ["source"]).column("source").to_pylist()})
    assert len(ids) >= 2
    pq.write_table(pa.table({"event_id": [ids[0]]}), tmp_path / "del.parquet")
    r = _cli("forget", "ds", "--optouts", "del.parquet", "--json", "--workers", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    removed = json.loads(r.stdout)["removed"]
    assert list(removed) == ["dt=2026-11-02"] and removed["dt=2026-11-02"] >= 1
    assert json.loads((tmp_path / "ds" / "manifest.json").read_text())["rows"] == rows - removed["dt=2026-11-02"]
    pq.write_table(pa.table({"event_id": [ids[1]]}), tmp_path / "del2.parquet")
    r = _cli("forget", "ds", "--optouts", "del2.parquet", "--log-format", "json", "--workers", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(ln) for ln in r.stderr.strip().splitlines()]  # every log line is JSON
    assert [ln["progress"]["removed"] for ln in lines if ln["msg"].startswith("forget finished")] == [{"dt=2026-11-02": 1}]
    assert _cli("forget", "ds", "--optouts", "del2.parquet", "--quiet", cwd=tmp_path).stdout == ""
    r = _cli("forget", "ds", "--optouts", "del2.parquet", "--master", "local[2]", cwd=tmp_path)
    assert r.returncode == 2 and "--master applies to --engine spark only" in r.stderr


_POOL_THEN_EXIT = """
def square(x):
    return x * x

if __name__ == "__main__":
    from datakit.cli import _exit_after_command
    from datakit.workers import pool

    assert sum(pool(2).map(square, range(8))) == 140
    _exit_after_command(0)
"""


def test_a_finished_command_ends_with_its_pool_still_alive(tmp_path):
    """Found in a docs review: `datakit forget DATASET --optouts FILE` (its index builds ran in the kept
    pool, which only `run` stops inside the command) printed its counts and never ended: the command's end
    ran the exit handlers, the pool's only asked for a shutdown without waiting, and multiprocessing's then
    closed the queue before the stop reached the idle workers and joined them forever."""
    script = tmp_path / "pool_then_exit.py"
    script.write_text(_POOL_THEN_EXIT)
    root = str(Path(__file__).resolve().parents[1])  # this checkout's datakit, as `-m datakit.cli` from here
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_folder_holding_files_no_run_wrote_is_refused_as_output(pipeline_file, tmp_path):
    """`--output .` from a project's root deleted the project's data/raw/events.csv and a notes/.tmp-*
    file and overwrote its README, exit 0 (found in review): a run owns its output folder, so a
    non-empty folder with no sign of a datakit run is refused before any work, and nothing changes."""
    proj = tmp_path / "proj"
    (proj / "data" / "raw").mkdir(parents=True)
    (proj / "data" / "raw" / "events.csv").write_text("a\n")
    (proj / "notes").mkdir()
    (proj / "notes" / ".tmp-draft.md").write_text("d\n")
    (proj / "README.md").write_text("mine\n")
    before = sorted(p.relative_to(proj) for p in proj.rglob("*"))
    r = _cli("run", str(pipeline_file), "--output", ".", cwd=proj)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "already holds files no datakit run wrote (README.md, data, notes)" in r.stderr
    assert sorted(p.relative_to(proj) for p in proj.rglob("*")) == before
    assert (proj / "README.md").read_text() == "mine\n"
    # an earlier run's folder is rewritten as before, and an empty folder is fine
    (tmp_path / "empty").mkdir()
    assert _cli("run", str(pipeline_file), "--output", str(tmp_path / "empty"), cwd=tmp_path).returncode == 0
    assert _cli("run", str(pipeline_file), "--output", str(tmp_path / "empty"), cwd=tmp_path).returncode == 0


def test_a_broken_symbolic_link_among_the_inputs_is_an_input_error(pipeline_file, tmp_path):
    """A day of logs linked from a disk that was not mounted was dropped by the glob like a folder, and
    the run went on without it (found in review): now one line naming the link, exit 2."""
    (tmp_path / "logs" / "b.jsonl").symlink_to(tmp_path / "unmounted" / "b.jsonl")
    r = _cli("run", str(pipeline_file), "--output", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "logs/b.jsonl is a symbolic link to a missing file" in r.stderr and "Traceback" not in r.stderr


def test_damaged_datasets_are_one_line_errors_never_a_verdict(pipeline_file, tmp_path):
    """Found in review: `datakit diff` with a damaged shard printed a traceback and exited 1 ("data
    differs"), and a truncated manifest of an append-mode dataset made the next run a traceback, exit 1
    ("a check failed"). Both are "cannot do it" errors: one line, exit 2, naming what is damaged."""
    import shutil

    assert _cli("run", pipeline_file, "--workers", "1").returncode == 0
    shutil.copytree(tmp_path / "out", tmp_path / "copy")
    shard = sorted((tmp_path / "copy" / "data").glob("*.parquet"))[0]
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2: len(blob) // 2 + 64] = bytes(64)  # a damaged page, same size
    shard.write_bytes(bytes(blob))
    r = _cli("diff", tmp_path / "out", tmp_path / "copy")
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "cannot compare" in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1

    daily = tmp_path / "daily.yaml"
    daily.write_text("name: daily\ninput: {path: logs/*.jsonl}\nstages: [{kind: ingest}]\n"
                     "output: {path: ds, mode: append}\n")
    assert _cli("run", daily, "--workers", "1", "--snapshot", "d1", cwd=tmp_path).returncode == 0
    top = tmp_path / "ds" / "manifest.json"
    top.write_bytes(top.read_bytes()[:100])  # truncated
    for args in (["run", daily, "--workers", "1", "--snapshot", "d2"], ["forget", "ds", "--optouts", "x.parquet"]):
        r = _cli(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert "manifest.json is damaged: not valid JSON" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_nanosecond_parquet_timestamp_is_the_same_event_in_every_process(tmp_path):
    """Found in review: Arrow gives a nanosecond timestamp out only as a pandas Timestamp, so the event
    was kept by a script that had imported pandas and quarantined (`bad_value`) by the `datakit`
    command, which keeps pandas out. Both now read it truncated to microseconds; ingest keeps ms."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datakit import Pipeline

    event = make_event(1)
    table = pa.Table.from_pylist([{k: v for k, v in event.items() if k != "timestamp"}])
    table = table.append_column("timestamp", pa.array([1_700_000_000_123_456_789], pa.timestamp("ns", tz="UTC")))
    pq.write_table(table, tmp_path / "ev.parquet")
    (tmp_path / "p.yaml").write_text("name: ns\ninput: {path: ev.parquet, format: parquet}\nstages: [{kind: ingest}]\n"
                                     "output: {path: cli, format: parquet}\n")
    r = _cli("run", tmp_path / "p.yaml", "--json", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stages"][0]["rows_out"] == 1
    Pipeline.from_yaml(tmp_path / "p.yaml").run(output=str(tmp_path / "lib"), workers=1)
    stamps = [pq.read_table(sorted((tmp_path / o / "data").glob("*.parquet"))[0]).column("timestamp").to_pylist()
              for o in ("cli", "lib")]
    assert stamps == [["2023-11-14T22:13:20.123Z"]] * 2


def test_an_input_inside_the_output_folder_is_refused_before_the_output_is_touched(pipeline_file, tmp_path):
    """Found in review: `--input 'in/**' --output in/o3` run twice read the first run's files, withdrew
    the published dataset, then failed ("input file ... disappeared"): the earlier output was lost."""
    assert _cli("run", pipeline_file, "--workers", "1").returncode == 0
    before = (tmp_path / "out" / "manifest.json").read_bytes()
    r = _cli("run", pipeline_file, "--workers", "1", "--input", "**/*.jsonl", "--input", "out/**/*.parquet",
             cwd=tmp_path)
    assert r.returncode == 2 and "is inside the output folder" in r.stderr, r.stderr
    assert (tmp_path / "out" / "manifest.json").read_bytes() == before and (tmp_path / "out" / "_SUCCESS").exists()


def test_with_log_format_json_the_error_line_is_json_too(pipeline_file, tmp_path):
    """Found in an operations review: a scheduler parsing `--log-format json` got plain text for every
    failure (`datakit: error: no input files match: ...`)."""
    r = _cli("run", pipeline_file, "--log-format", "json", "--input", "nowhere/*.jsonl", cwd=tmp_path)
    assert r.returncode == 2
    lines = [json.loads(line) for line in r.stderr.strip().splitlines()]  # every line parses
    assert lines[-1]["level"] == "error" and lines[-1]["msg"].startswith("no input files match")
    assert _cli("run", pipeline_file, "--input", "nowhere/*.jsonl", cwd=tmp_path).stderr.startswith("datakit: error: ")


def test_the_write_shards_step_reports_the_rows_it_wrote(pipeline_file, tmp_path):
    """Found in review: every run logged `write shards: done, 0 rows`, which a scheduler collecting
    throughput recorded as zero."""
    r = _cli("run", pipeline_file, "--workers", "1", "--log-format", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    steps = [json.loads(line) for line in r.stderr.splitlines() if '"write shards: done' in line]
    assert steps and steps[-1]["msg"].startswith("write shards: done, 12 rows")


def test_run_json_names_the_snapshots_a_redo_withdrew(tmp_path):
    """Found in an operations review: a redo of an earlier day that withdrew the later ones exited 0 with
    a plain --json result; the withdrawal was only a warning line."""
    from tests.stages.test_dedup_stage import rec, words, write_records

    f = tmp_path / "daily.yaml"
    f.write_text("name: daily\ninput: {path: in/*.parquet, format: parquet, schema: training_record.v1}\n"
                 "stages: [{kind: dedup, exact: true}]\noutput: {path: ds, mode: append}\n")
    write_records(tmp_path / "in", [rec("a", words(0, 100))])
    assert _cli("run", f, "--workers", "1", "--snapshot", "d1", cwd=tmp_path).returncode == 0
    assert _cli("run", f, "--workers", "1", "--snapshot", "d2", cwd=tmp_path).returncode == 0
    write_records(tmp_path / "in", [rec("a", words(0, 100)), rec("b", words(200, 300))])  # d1 redone, changed
    r = _cli("run", f, "--workers", "1", "--snapshot", "d1", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["withdrawn"] == ["d2"]


def _command_script(tmp_path, script: str):
    """Run `script` (which calls the `datakit` command in-process) with its private files under `tmp_path`."""
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "TMPDIR": str(tmp_path)})


def test_an_error_nothing_expected_exits_3_with_its_traceback_in_a_private_file(tmp_path):
    """Found in an operations review: a `forget` that failed on an unexpected error exited 1 with a traceback,
    which the command documents as "a check failed"; a scheduler took it for a verdict."""
    r = _command_script(tmp_path, "import sys; sys.argv = ['datakit', 'forget', 'ds', '--optouts', 'x.parquet']\n"
                                  "import datakit.forget_snapshots as fs\n"
                                  "def boom(*a, **k): raise ZeroDivisionError('a record: jane@example.com')\n"
                                  "fs.forget = boom\n"
                                  "from datakit.cli import command\ncommand()\n")
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "forget failed unexpectedly (ZeroDivisionError)" in r.stderr and "jane@" not in r.stderr
    (report,) = tmp_path.glob("datakit-error-*.txt")
    assert "ZeroDivisionError" in report.read_text() and oct(report.stat().st_mode & 0o777) == "0o600"


def test_a_storage_failure_nobody_named_a_path_for_is_not_called_a_bug(tmp_path):
    """Found in review (S3, endpoint down): `build-index` and `report` said "failed unexpectedly
    (EndpointConnectionError); this is a bug": the store's failure is a job failure, exit 3, said as one."""
    r = _command_script(tmp_path, "import sys; sys.argv = ['datakit', 'report', 's3://bucket/ds']\n"
                                  "import datakit.cli as cli\n"
                                  "from botocore.exceptions import EndpointConnectionError\n"
                                  "def down(*a, **k): raise EndpointConnectionError(endpoint_url='http://127.0.0.1:1/b')\n"
                                  "cli.main = down\n"
                                  "cli.command()\n")
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "storage error: report failed: EndpointConnectionError: Could not connect" in r.stderr
    assert "bug" not in r.stderr and len(list(tmp_path.glob("datakit-error-*.txt"))) == 1


def test_forget_filters_a_quarantine_file_that_an_earlier_forget_emptied(tmp_path):
    """Found in an operations review: once a forget had removed a snapshot's only quarantined line, every later
    forget failed on the empty file (`or` of a null-typed list of no False), exit 1, nothing deleted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datakit.forget_snapshots import _filter_quarantine

    (tmp_path / "_quarantine").mkdir()
    pq.write_table(pa.table({"raw": pa.array([], pa.string())}), str(tmp_path / "_quarantine" / "part-0.parquet"))
    pq.write_table(pa.table({"raw": ['{"user_id": "u1"}', '{"user_id": "u2"}']}),
                   str(tmp_path / "_quarantine" / "part-1.parquet"))
    _filter_quarantine(str(tmp_path), str(tmp_path), ["u1"])
    assert pq.read_table(tmp_path / "_quarantine" / "part-1.parquet").column("raw").to_pylist() == ['{"user_id": "u2"}']
    assert pq.read_table(tmp_path / "_quarantine" / "part-0.parquet").num_rows == 0
