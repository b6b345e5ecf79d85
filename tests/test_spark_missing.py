"""The Spark engine where pyspark is not installed (it is the `spark` extra of the wheel): one line, exit 2.

Found in a review of the installed wheel (`pip install datakit-*.whl`, no `[spark]`): `datakit validate
--engine spark` and `datakit build-index --engine spark` ended "failed unexpectedly (ModuleNotFoundError);
this is a bug", exit 3, with a traceback file; `datakit run --engine spark` said "`make venv` installs
everything", which an installed package has no Makefile for."""
from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from datakit import DatakitError, Pipeline, synth
from datakit.cli import app

HINT = "pip install 'datakit[spark]'"


@pytest.fixture()
def records(tmp_path):
    synth.generate(str(tmp_path / "logs"), events=20, seed=0)
    pipeline = (Pipeline("records", seed=0).input(str(tmp_path / "logs" / "dt=*" / "*.jsonl.zst"))
                .add({"kind": "ingest"}).add({"kind": "extract", "kinds": ["code"]})
                .output(str(tmp_path / "out"), format="parquet"))
    pipeline.run(engine="local", workers=1)
    pipeline.to_yaml(str(tmp_path / "records.yaml"))
    return tmp_path


@pytest.fixture()
def no_pyspark(monkeypatch):
    for name in [m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyspark", None)  # `import pyspark` raises ImportError, find_spec says None


@pytest.mark.parametrize("args", [
    ["validate", "{d}/out", "--engine", "spark"],
    ["build-index", "{d}/out", "--engine", "spark"],
    ["run", "{d}/records.yaml", "--engine", "spark", "--master", "local[2]", "--output", "{d}/spark-out"],
])
def test_the_command_says_pyspark_is_missing_in_one_line(records, no_pyspark, args):
    r = CliRunner().invoke(app, [a.format(d=records) for a in args])
    assert r.exit_code == 2, r.output
    assert HINT in r.output and "this is a bug" not in r.output and "make venv" not in r.output


def test_the_python_api_raises_a_datakit_error(records, no_pyspark):
    with pytest.raises(DatakitError, match=r"datakit\[spark\]"):
        Pipeline.from_yaml(str(records / "records.yaml")).run(engine="spark", output=str(records / "spark-out"))
