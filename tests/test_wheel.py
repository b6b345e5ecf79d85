"""datakit as a user installs it: the wheel (built from the sdist) in a fresh venv runs every stage,
from a folder outside the checkout, on both engines, with byte-identical output. (`datakit run
--engine spark` of the installed package runs in tests/engines/test_spark_packed_cluster.py.)

Why: a cluster node has the installed package, never the source tree. Before the package
data moved into datakit/, a wheel from main failed at import (schemas/ outside site-packages).
"""
from __future__ import annotations

import json
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.packaging_env import ROOT, build_dists, clean_env, make_venv, site_packages

pytestmark = [pytest.mark.slow]

# every stage kind, in two pipelines (the second consumes feedback records, which the first does not make)
RECORDS = """\
name: wheel-records
seed: 3
input: {path: "logs/dt=*/*.jsonl.zst", format: jsonl, schema: editor_event.v1}
stages:
  - {kind: ingest}
  - {kind: consent, optouts: "logs/optouts.parquet"}
  - {kind: extract, kinds: [code, fim, sft, preference]}
  - {kind: scrub_pii, ner: "off"}   # the NER model load per Spark worker is slow; the regex/hyperscan scan runs
  - {kind: dedup, exact: true, minhash: {threshold: 0.8, num_perm: 64, ngram: 5}}
  - {kind: decontaminate, evals: [humaneval], ngram: 13, mode: drop}
  - {kind: tokenize, tokenizer: "datakit:demo-bpe", seq_len: 512, packing: best_fit, fim_rate: 0.5}
output: {path: "out/records", format: packed, shards: 2}
"""
FEEDBACK = """\
name: wheel-feedback
seed: 3
input: {path: "logs/dt=*/*.jsonl.zst", format: jsonl, schema: editor_event.v1}
stages:
  - {kind: ingest}
  - {kind: extract, kinds: [feedback], feedback: {ignored: negative}}
  - {kind: forget, optouts: "logs/optouts.parquet"}
  - {kind: kto}
output: {path: "out/feedback", format: parquet, shards: 2}
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, wheel, sdist) of a fresh venv that has datakit only from the wheel."""
    root = tmp_path_factory.mktemp("wheel")
    wheel, sdist = build_dists(root)
    py = make_venv(root / "venv", wheel, deps="link")
    return py, wheel, sdist


def test_wheel_and_sdist_carry_the_runtime_data(installed):
    _, wheel, sdist = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("datakit/schemas/editor_event.v1.json", "datakit/quality/suites/editor_event.v1.json",
              "datakit/tokenizers/demo-bpe.json", "datakit/py.typed"):
        assert f in names
    assert not [n for n in names if n.startswith(("schemas/", "quality/", "tests/"))]
    with tarfile.open(sdist) as t:
        members = {m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "datakit/schemas/editor_event.v1.json", "datakit/tokenizers/demo-bpe.json"} <= members


def _run(py: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    res = subprocess.run([str(py.parent / "datakit"), *args], cwd=cwd, capture_output=True, text=True,
                         env=clean_env(py.parent.parent), timeout=1200)
    assert res.returncode == 0, f"datakit {' '.join(args)} -> {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res


def _checksums(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text())
    return {f: s["sha256"][f] for s in m["shards"] for f in s["files"]}


def _counts(out: Path) -> list:
    return [(s["name"], s["rows_in"], s["rows_out"], s["dropped"])
            for s in json.loads((out / "_run.json").read_text())["stages"]]


@pytest.fixture(scope="module")
def job(installed, tmp_path_factory):
    """A folder outside the checkout with synthetic logs and the two pipeline files."""
    py, _, _ = installed
    work = tmp_path_factory.mktemp("job")
    assert ROOT not in work.parents
    _run(py, ["synth", "logs", "--events", "150", "--seed", "5", "--repositories", "2"], work)
    (work / "records.yaml").write_text(RECORDS)
    (work / "feedback.yaml").write_text(FEEDBACK)
    return work


def test_datakit_is_imported_from_the_wheel_not_the_checkout(installed, job):
    py, _, _ = installed
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


@pytest.mark.timeout(1800)  # a JVM start and two pipelines on each engine, on a loaded 2-core machine
def test_installed_wheel_runs_every_stage_on_both_engines_outside_the_checkout(installed, job):
    py, _, _ = installed
    expected = {"records": {"ingest", "consent", "extract", "scrub_pii", "dedup", "decontaminate", "tokenize"},
                "feedback": {"ingest", "extract", "forget", "kto"}}
    for name in expected:
        _run(py, ["run", f"{name}.yaml", "--output", f"out/{name}-local"], job)  # the CLI, local engine
    (job / "spark_runs.py").write_text(SPARK_RUNS)  # the Python API, Spark engine
    res = subprocess.run([str(py), "spark_runs.py", *expected], cwd=job, capture_output=True, text=True,
                         env=clean_env(py.parent.parent), timeout=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    for name, kinds in expected.items():
        local, spark = job / "out" / f"{name}-local", job / "out" / f"{name}-spark"
        assert _checksums(local) == _checksums(spark)
        assert _counts(local) == _counts(spark)
        assert json.loads((local / "manifest.json").read_text())["rows"] > 0
        assert {s[0] for s in _counts(local)} == kinds
