"""`make test` keeps the tests that share a JVM on one pytest-xdist worker: check that the groups group.

Why a test: grouping is two moving parts that broke silently once. tests/conftest.py marks the tests
(`xdist_group`), and xdist renames each marked test `<nodeid>@<group>` in its own collection hook, which
its scheduler reads. Our hook ran after xdist's (so the marks came too late), and pytest 9.2 stores node
ids where xdist 3.8 cannot rename them; either way every Spark test could land on either worker: two
local[2] sessions, two standalone clusters, the packed environment built twice. The suite still passed.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = '''
import os
from pathlib import Path

import pytest


def _record(name):
    with open(Path(os.environ["GROUP_PROBE_OUT"]) / f"{name}.txt", "w") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "none"))


@pytest.mark.parametrize("i", range(4))
def test_spark_by_name(i):
    _record(f"spark-{i}")


@pytest.mark.spark
@pytest.mark.parametrize("i", range(2))
def test_by_marker(i):
    _record(f"marked-{i}")


@pytest.mark.cluster
@pytest.mark.parametrize("i", range(3))
def test_cluster(i):
    _record(f"cluster-{i}")


@pytest.mark.parametrize("i", range(4))
def test_plain(i):
    _record(f"plain-{i}")
'''


def test_spark_and_cluster_tests_each_run_on_one_xdist_worker(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    # tests/conftest.py as a plugin (-p): registered as early as the real conftest, so its hook order is the same
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "tests.conftest", "-p",
         "no:cacheprovider", "-o", "addopts=", "-v", "--rootdir", str(tmp_path), str(probe)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "GROUP_PROBE_OUT": str(out), "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    worker = {f.stem: f.read_text() for f in out.glob("*.txt")}
    assert len(worker) == 13, worker
    assert set(worker.values()) <= {"gw0", "gw1"}, worker
    spark = {w for k, w in worker.items() if k.startswith(("spark-", "marked-"))}
    cluster = {w for k, w in worker.items() if k.startswith("cluster-")}
    assert len(spark) == 1, worker  # every Spark test (by name or by mark) on one worker
    assert len(cluster) == 1, worker
    assert "test_spark_by_name[0]@spark" in res.stdout and "test_cluster[0]@cluster" in res.stdout
    assert "test_plain[0]@" not in res.stdout  # ungrouped tests stay free to go to either worker
