"""datakit as a user installs it: the wheel (built from the sdist) in a fresh venv runs every stage,
from a folder outside the checkout, on both engines, with byte-identical output. (`datakit run
--engine spark` of the installed package runs in tests/engines/test_spark_packed_cluster.py.)

Why: a cluster node has the installed package, never the source tree. Before the package
data moved into datakit/, a wheel from main failed at import (schemas/ outside site-packages).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.packaging_env import (FEEDBACK, FEEDBACK_STAGES, RECORDS, RECORDS_STAGES, ROOT, clean_env,
                                  site_packages)

pytestmark = [pytest.mark.slow]


def test_wheel_and_sdist_carry_the_runtime_data(wheel_dists):
    wheel, sdist = wheel_dists
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("datakit/schemas/editor_event.v1.json", "datakit/quality/suites/editor_event.v1.json",
              "datakit/tokenizers/demo-bpe.json", "datakit/pipelines/quickstart.yaml", "datakit/py.typed"):
        assert f in names
    assert not [n for n in names if n.startswith(("schemas/", "quality/", "tests/"))]
    with tarfile.open(sdist) as t:
        members = {m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "datakit/schemas/editor_event.v1.json", "datakit/tokenizers/demo-bpe.json"} <= members


def _run(py: Path, args: list[str], cwd: Path, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    res = subprocess.run([str(py.parent / "datakit"), *args], cwd=cwd, capture_output=True, text=True,
                         env=clean_env(py.parent.parent), timeout=1200)
    assert res.returncode in ok, f"datakit {' '.join(args)} -> {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res


def _checksums(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text())
    return {f: s["sha256"][f] for s in m["shards"] for f in s["files"]}


def _counts(out: Path) -> list:
    return [(s["name"], s["rows_in"], s["rows_out"], s["dropped"])
            for s in json.loads((out / "_run.json").read_text())["stages"]]


@pytest.fixture(scope="module")
def job(user_venv, tmp_path_factory):
    """A folder outside the checkout with synthetic logs and the two pipeline files."""
    work = tmp_path_factory.mktemp("job")
    assert ROOT not in work.parents
    _run(user_venv, ["synth", "logs", "--events", "150", "--seed", "5", "--repositories", "2"], work)
    for name, text in (("records", RECORDS), ("feedback", FEEDBACK)):
        (work / f"{name}.yaml").write_text(text.format(logs="logs", optouts="logs/optouts.parquet"))
    return work


def test_datakit_is_imported_from_the_wheel_not_the_checkout(user_venv, job):
    py = user_venv
    where = subprocess.run([str(py), "-c", "import datakit; print(datakit.__file__)"], cwd=job,
                           capture_output=True, text=True, env=clean_env(py.parent.parent), check=True).stdout.strip()
    assert Path(where).is_relative_to(site_packages(py)), where
    assert not Path(where).is_relative_to(ROOT)


SPARK_RUNS = """\
import sys
from datakit import Pipeline

for name in sys.argv[1:]:  # one JVM for both pipelines
    Pipeline.from_yaml(f"{name}.yaml").run(engine="spark", master="local[2]", partitions=2,
                                           output=f"out/{name}-spark")
"""


def _contamination(py: Path, job: Path, data: str) -> tuple[int, dict]:
    """`datakit contamination-check` of a packed output against HumanEval: (exit code, report minus paths)."""
    rep = f"{data}-contamination.json"
    res = _run(py, ["contamination-check", "--data", data, "--eval", "humaneval", "--json", rep, "--quiet"], job,
               ok=(0, 1))
    report = json.loads((job / rep).read_text())
    return res.returncode, json.loads(json.dumps(report).replace(data, "DATA"))


def _sha(p: Path) -> str | None:
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None


@pytest.mark.timeout(1800)  # a JVM start and two pipelines (NER on) on each engine, on a loaded 2-core machine
def test_installed_wheel_runs_every_stage_on_both_engines_outside_the_checkout(user_venv, job):
    py = user_venv
    expected = {"records": RECORDS_STAGES, "feedback": FEEDBACK_STAGES}
    for name in expected:
        _run(py, ["run", f"{name}.yaml", "--output", f"out/{name}-local", "--no-report"], job)  # the CLI, local
    (job / "spark_runs.py").write_text(SPARK_RUNS)  # the Python API, Spark engine
    res = subprocess.run([str(py), "spark_runs.py", *expected], cwd=job, capture_output=True, text=True,
                         env=clean_env(py.parent.parent), timeout=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    for name, kinds in expected.items():
        local, spark = job / "out" / f"{name}-local", job / "out" / f"{name}-spark"
        assert _checksums(local) == _checksums(spark)
        assert _counts(local) == _counts(spark)
        for side in ("_quarantine/part-00000.parquet", "_dropped/part-00000.parquet"):
            assert _sha(local / side) == _sha(spark / side), side
        assert json.loads((local / "manifest.json").read_text())["rows"] > 0
        assert [s[0] for s in _counts(local)] == kinds
    # NER really ran (not the pattern-only fallback): the run's environment names the spaCy model
    env = json.dumps(json.loads((job / "out" / "records-local" / "manifest.json").read_text())["environment"])
    assert "core_web" in env, env[:2000]
    # the contamination-check CLI of the installed package: same verdict and report on both outputs
    assert _contamination(py, job, "out/records-local") == _contamination(py, job, "out/records-spark")
