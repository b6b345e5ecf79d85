"""A `_run.json` that is a JSON object with a field of the wrong shape: one line naming the field, exit 2.

Found in a hostile-input review: `"stages": "x"` or a stage's `"dropped": null` made `datakit report`
and `datakit diff` fail with "report failed unexpectedly (TypeError); this is a bug", exit 3, where a
`_run.json` that is not JSON or not an object was already one line, exit 2.
"""
from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from datakit import Pipeline
from datakit.cli import app
from tests.eventgen import make_event, write_jsonl


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    root = tmp_path_factory.mktemp("out")
    write_jsonl(root / "logs" / "a.jsonl", [make_event(i) for i in range(20)])
    (Pipeline("p").input(str(root / "logs")).add({"kind": "ingest"}).add({"kind": "extract", "kinds": ["code"]})
     .output(str(root / "o"), format="parquet", shards=1).run(workers=1))
    return root / "o"


def _damaged(output, tmp_path, change) -> str:
    bad = tmp_path / "bad"
    shutil.copytree(output, bad)
    run = json.loads((bad / "_run.json").read_text())
    change(run)
    (bad / "_run.json").write_text(json.dumps(run))
    return str(bad)


def _set(path, value):
    def change(run):
        node = run
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return change


@pytest.mark.parametrize("path,value,named", [
    (["stages"], "x", "stages"),
    (["stages", 0, "dropped"], None, "stages/0/dropped"),
    (["stages", 1], ["not", "a", "stage"], "stages/1"),
])
def test_report_and_diff_name_the_field_exit_2(output, tmp_path, path, value, named):
    bad = _damaged(output, tmp_path, _set(path, value))
    for args in (["report", bad], ["diff", str(output), bad], ["diff", bad, str(output)]):
        r = CliRunner().invoke(app, args)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("datakit: error:")]
        assert r.exit_code == 2 and len(lines) == 1, (args, r.exit_code, r.stderr)
        assert "this is a bug" not in lines[0] and f"_run.json is damaged: {named} breaks run_report.v1" in lines[0]


def test_an_intact_run_report_still_renders_and_diffs(output):
    assert CliRunner().invoke(app, ["report", str(output)]).exit_code == 0
    assert CliRunner().invoke(app, ["diff", str(output), str(output)]).exit_code == 0
