"""Pytest fixtures for the Spark engine: one shared local[2] session, and a real standalone cluster.

Why shared: a SparkSession costs ~4 s to start (a standalone one ~6 s) on a
2-core machine, so every Spark test in the run reuses the same one. The
cluster fixture starts a standalone master and worker from the pyspark
installation through `bin/spark-class` (pip's pyspark has no sbin/ scripts),
on 127.0.0.1 and free ports, and always stops both, also when a test fails.

Import into conftest.py with `from tests.spark_fixtures import *`.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

# `shared_cluster` and `spark_cluster` are not re-exported to tests/conftest.py: tests/engines/conftest.py
# imports them, so the cluster's package scope is tests/engines (torn down after its last test).
__all__ = ["spark", "SparkCluster", "start_cluster", "requires_spark", "spark_temp_dirs", "kill_group", "scratch_env"]


def _spark_available() -> str | None:
    """None when pyspark and java are present, else why Spark tests are skipped."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "no java on PATH"
    return None


_SKIP = _spark_available()
requires_spark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


@pytest.fixture
def spark():
    """The process-wide local[2] SparkSession: started once, reused by every test and by the engine.

    Function-scoped on purpose: it is only a lookup of the running session
    (`get_session` caches it), so a test that ran on the standalone cluster
    before cannot leave a stopped session object behind for later tests.
    """
    if _SKIP:
        pytest.skip(_SKIP)
    from datakit.engines.spark_session import get_session

    return get_session("local[2]")


# The tests' JVMs run tiny jobs for seconds on 2 cores, where the C2 JIT compiler's background threads
# and the parallel GC's threads take CPU from the work itself: C1 only and the serial collector make
# the Spark tests ~1.8x faster (test_spark_cc.py, alternated pairs on the 2-core machine: 82/92 s vs
# 162/150 s). Speed only: neither changes what a job computes. C1 only is also the product default on
# local masters (spark_session.LOCAL_DRIVER_JIT); the serial collector is the tests' own.
TEST_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session", autouse=True)
def spark_temp_dirs(tmp_path_factory) -> Iterator[Path]:
    """Every JVM the tests start keeps its scratch under pytest's temp folder, never in /tmp.

    Why: a Spark driver or executor killed with SIGKILL (the killed-driver and stalled-executor
    tests do it on purpose; a timeout does it by accident) cannot run its shutdown hooks, and
    its `spark-*`, `blockmgr-*` and `artifacts-*` folders (up to ~1 GB; an executor's copy of a
    fetched archive is ~400 MB) stayed in /tmp for good. Set before any session starts, so all of
    them inherit it: SPARK_LOCAL_DIRS (overrides spark.local.dir for drivers, standalone workers
    and their executors) and java.io.tmpdir through JAVA_TOOL_OPTIONS, which every JVM reads: the
    local session's, spark-submit's, the standalone daemons' and their executors' (which get no
    SPARK_*_OPTS). A standalone cluster's daemons keep theirs in the cluster's folder instead
    (`start_cluster`, `SparkCluster.sweep`). pytest removes a passed test's folder as it ends and keeps
    only its last run's (pyproject.toml: tmp_path_retention_*), so nothing piles up.

    JAVA_TOOL_OPTIONS also carries TEST_JVM_OPTS, for speed only (see there).
    """
    root = tmp_path_factory.mktemp("spark-scratch")
    saved = {k: os.environ.get(k) for k in ("SPARK_LOCAL_DIRS", "JAVA_TOOL_OPTIONS")}
    os.environ.update(scratch_env({"JAVA_TOOL_OPTIONS": f"{saved['JAVA_TOOL_OPTIONS'] or ''} {TEST_JVM_OPTS}"}, root))
    try:
        yield root
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def kill_group(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGKILL a child started with `start_new_session=True` together with everything it started
    (spark-submit's JVM, the driver's Python, its Python workers), then reap it."""
    import signal

    try:  # also when the leader has exited: its group may still hold a JVM or Python workers
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"Spark daemon exited with {proc.returncode}; see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"Spark daemon did not open port {port} in {timeout:.0f}s; see {log}")


@dataclass
class SparkCluster:
    """A running standalone master + workers on 127.0.0.1 (all processes started by this fixture)."""

    master_url: str
    web_port: int
    workdir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    worker_procs: list[subprocess.Popen] = field(default_factory=list)

    def state(self) -> dict:
        """The master's JSON status (workers, apps)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/json/", timeout=5) as r:
            return json.loads(r.read())

    def wait_workers(self, n: int, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                alive = [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
                if len(alive) >= n:
                    return
            except (OSError, ValueError):
                # OSError: the UI is not listening yet; ValueError: it answered /json/ with an HTML page,
                # seen once in CI right after 'MasterUI' bound its port on a loaded machine (its handlers
                # were not all attached yet): both mean "not ready", so poll again
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{n} Spark worker(s) did not register in {timeout:.0f}s; logs in {self.workdir}")

    def executor_pids(self) -> list[int]:
        """PIDs of executor JVMs running under our workers (children of processes we started)."""
        import psutil

        pids = []
        for w in self.worker_procs:
            try:
                for c in psutil.Process(w.pid).children(recursive=True):
                    try:
                        if any("CoarseGrainedExecutorBackend" in a for a in c.cmdline()):
                            pids.append(c.pid)
                    except psutil.Error:
                        continue
            except psutil.Error:
                continue
        return sorted(pids)

    def sweep(self, stopped: bool = False) -> None:
        """Give back the disk of applications that have ended.

        Why: every application of the packed-environment tests unpacks its ~1.2 GB environment once per
        executor, into the worker's folder for that application, which a standalone worker keeps after the
        application ends (its own clean-up, spark.worker.cleanup.*, runs every 30 minutes and is off by
        default). Kept for the whole run, with pytest keeping its last runs' folders, they filled CI's disk
        (2026-12-07: 45 tests failed with 'No space left on device'). An ended application's folders lose
        everything but the executors' logs (stdout, stderr: what a failing test points to); once no
        application runs, the executors' scratch (`local`, `java-tmp`: fetched archives, block files) goes
        too. `stopped`: the daemons are down, so nothing runs; otherwise the master says which
        applications still run, and without its answer nothing is touched.
        """
        if stopped:
            active: set[str] = set()
        else:
            try:
                active = {a.get("id") for a in self.state().get("activeapps", [])}
            except (OSError, ValueError):
                return
        for app in self.workdir.glob("work-*/app-*"):
            if app.name not in active:
                for item in app.glob("*/*"):  # <app>/<executor id>/<file or folder>
                    if item.name not in ("stdout", "stderr"):
                        _remove(item)
        if not active:
            for item in [*self.workdir.glob("local/*"), *self.workdir.glob("java-tmp/*")]:
                _remove(item)

    def stop(self) -> None:
        """Stop workers first (they take their executors along), then the master; SIGKILL stragglers."""
        import psutil

        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    kids = psutil.Process(p.pid).children(recursive=True)
                except psutil.Error:
                    kids = []
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
                for k in kids:
                    try:
                        k.kill()
                    except psutil.Error:
                        pass
        for p in self.procs:  # each daemon leads its own process group (start_new_session): its executors,
            kill_group(p)  # their Python workers, anything reparented away from the tree above


def _remove(path: Path) -> None:
    """Delete a file or a folder tree (what cannot be deleted stays)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def scratch_env(env: dict[str, str], folder: Path) -> dict[str, str]:
    """`env` with every JVM started from it keeping its scratch in `folder` (`local`: SPARK_LOCAL_DIRS;
    `java-tmp`: java.io.tmpdir through JAVA_TOOL_OPTIONS, replacing one set before), both created."""
    local, jtmp = folder / "local", folder / "java-tmp"
    local.mkdir(parents=True, exist_ok=True)
    jtmp.mkdir(parents=True, exist_ok=True)
    opts = [o for o in env.get("JAVA_TOOL_OPTIONS", "").split() if not o.startswith("-Djava.io.tmpdir=")]
    return {**env, "SPARK_LOCAL_DIRS": str(local), "JAVA_TOOL_OPTIONS": " ".join([*opts, f"-Djava.io.tmpdir={jtmp}"])}


def start_cluster(workers: int = 1, cores: int = 1, memory: str = "1g", workdir: Path | None = None,
                  base_env: dict[str, str] | None = None) -> SparkCluster:
    """Start a standalone master and `workers` workers; the caller must call `.stop()`.

    `base_env` replaces os.environ as the daemons' environment (executors inherit it): the
    packed-environment test passes one without PYTHONPATH, so no executor can see the checkout.
    """
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    spark_class = home / "bin" / "spark-class"
    workdir = Path(workdir or tempfile.mkdtemp(prefix="datakit-spark-cluster-"))
    # the daemons' and executors' scratch in the cluster's own folder, where `SparkCluster.sweep` finds it
    env = dict(scratch_env(dict(os.environ if base_env is None else base_env), workdir), SPARK_HOME=str(home),
               SPARK_LOCAL_IP="127.0.0.1", SPARK_WORKER_DIR=str(workdir / "work"), SPARK_NO_DAEMONIZE="1")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    port, web = _free_port(), _free_port()
    cluster = SparkCluster(master_url=f"spark://127.0.0.1:{port}", web_port=web, workdir=workdir)
    try:
        log = workdir / "master.log"
        m = subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(web)],
            env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        cluster.procs.append(m)
        _wait_port(port, m, 60, log)
        for i in range(workers):
            wlog = workdir / f"worker-{i}.log"
            w = subprocess.Popen(
                [str(spark_class), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--cores", str(cores), "--memory", memory, "--webui-port", str(_free_port()),
                 "--work-dir", str(workdir / f"work-{i}"), cluster.master_url],
                env=env, stdout=open(wlog, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
            )
            cluster.procs.append(w)
            cluster.worker_procs.append(w)
        cluster.wait_workers(workers)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _daemon_env() -> dict[str, str]:
    """The standalone daemons' environment: nothing that puts the checkout or the test venv on an executor's
    path, and no usable default Python: an application must say which interpreter its executors start
    (spark-submit: spark.pyspark.python, e.g. a packed env; an in-process driver: its own PYSPARK_PYTHON)."""
    from tests.packaging_env import clean_env

    return clean_env(PYSPARK_PYTHON="/nonexistent/python")


@pytest.fixture(scope="package")
def shared_cluster(tmp_path_factory) -> Iterator[SparkCluster]:
    """One standalone master + two 1-core workers for every cluster test of tests/engines; always torn down.

    Why one: each start costs master + worker JVMs (~10 s quiet, far more on a loaded CI machine), and the
    packed-env tests (spark-submit of a shipped archive) and the in-process tests (this process's session
    on the cluster) need the same thing: a real cluster whose daemons know nothing about this checkout.
    Package scope (tests/engines/conftest.py): the daemons stop after the last test there, not at the end
    of the whole run. Each test module stops its own application (see `spark_cluster`).
    """
    if _SKIP:
        pytest.skip(_SKIP)
    cluster = start_cluster(workers=2, cores=1, memory="1g", workdir=tmp_path_factory.mktemp("spark-cluster"),
                            base_env=_daemon_env())
    try:
        yield cluster
    finally:
        cluster.stop()
        cluster.sweep(stopped=True)


@pytest.fixture(scope="module")
def spark_cluster(shared_cluster) -> Iterator[SparkCluster]:
    """The shared standalone cluster for one module whose tests run this process's session on it.

    At the end of the module the session on the cluster is stopped, so later tests get the local[2]
    session again (one SparkContext per process).
    """
    from datakit.engines.spark_session import _active, stop_session

    try:
        yield shared_cluster
    finally:
        key = _active.get("key")
        if key and key[0] == shared_cluster.master_url:
            stop_session()  # release the app before its master goes away
        shared_cluster.sweep()
