"""`make test` keeps the tests that share a JVM on one pytest-xdist worker: check that the groups group.

Why a test: grouping is two moving parts that broke silently once. tests/conftest.py marks the tests
(`xdist_group`), and xdist renames each marked test `<nodeid>@<group>` in its own collection hook, which
its scheduler reads. Our hook ran after xdist's (so the marks came too late), and pytest 9.2 stores node
ids where xdist 3.8 cannot rename them; either way every Spark test could land on either worker: two
local[2] sessions, two standalone clusters, the packed environment built twice. The suite still passed.

(No "spark" in this file's or this test's name: tests/conftest.py would put it in the Spark group.)
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RECORD = '''
import os
from pathlib import Path

import pytest


def _record(name):
    """Note which worker ran the test, and in which order tests ran on that worker."""
    out = Path(os.environ["GROUP_PROBE_OUT"])
    worker = os.environ.get("PYTEST_XDIST_WORKER", "none")
    (out / f"{name}.txt").write_text(worker)
    with open(out / f"order-{worker}.log", "a") as f:
        f.write(name + "\\n")
'''

# every rule of tests/conftest.py's hook: by test name, by mark, by the `spark` fixture (a local stand-in
# here, so no JVM starts), by file name (the second probe file), the cluster mark; plus ungrouped tests
PROBE = _RECORD + '''

@pytest.fixture
def spark():
    return None


@pytest.mark.parametrize("i", range(4))
def test_spark_by_name(i):
    _record(f"spark-{i}")


@pytest.mark.spark
@pytest.mark.parametrize("i", range(2))
def test_by_marker(i):
    _record(f"marked-{i}")


def test_by_fixture(spark):
    _record("fixture-0")


@pytest.mark.cluster
@pytest.mark.parametrize("i", range(3))
def test_cluster(i):
    _record(f"cluster-{i}")


@pytest.mark.parametrize("i", range(4))
def test_plain(i):
    _record(f"plain-{i}")


@pytest.mark.spark
@pytest.mark.fresh_spark_workers
def test_wants_fresh_workers():
    _record("fresh-0")
'''

BY_PATH = _RECORD + '''

@pytest.mark.parametrize("i", range(2))
def test_by_path(i):
    _record(f"path-{i}")
'''

# variables of the outer pytest that would change how the inner one starts or which plugins it loads
_OUTER_PYTEST_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_XDIST_WORKER",
                     "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID", "PYTEST_CURRENT_TEST")


def test_jvm_groups_each_run_on_one_xdist_worker(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "test_spark_named_file.py").write_text(BY_PATH)
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in _OUTER_PYTEST_ENV}
    # tests/conftest.py as a plugin (-p): registered as early as the real conftest, so its hook order is the same
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "tests.conftest", "-p",
         "no:cacheprovider", "-o", "addopts=", "-v", "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "tmp"),
         str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**env, "GROUP_PROBE_OUT": str(out), "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    worker = {f.stem: f.read_text() for f in out.glob("*.txt")}
    assert len(worker) == 17, worker
    assert set(worker.values()) <= {"gw0", "gw1"}, worker
    spark = {w for k, w in worker.items() if k.startswith(("spark-", "marked-", "fixture-", "path-", "fresh-"))}
    cluster = {w for k, w in worker.items() if k.startswith("cluster-")}
    assert len(spark) == 1, worker  # every Spark test, whichever rule makes it one, on one worker
    assert len(cluster) == 1, worker
    assert "test_spark_by_name[0]@spark" in res.stdout and "test_cluster[0]@cluster" in res.stdout
    assert "test_plain[0]@" not in res.stdout  # ungrouped tests stay free to go to either worker
    # the test about fresh pyspark Python workers runs before every other test of the Spark group
    (spark_worker,) = spark
    ran = (out / f"order-{spark_worker}.log").read_text().split()
    first_spark = next(name for name in ran if not name.startswith(("plain-", "cluster-")))
    assert first_spark == "fresh-0", ran
