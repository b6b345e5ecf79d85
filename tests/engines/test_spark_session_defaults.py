"""Session defaults for stalled executors (no JVM needed): speculation and timeouts on cluster masters,
never on local[N] (one executor: nowhere to run a second attempt), and the caller's settings win."""
from __future__ import annotations

from datakit.engines.spark_session import STRAGGLER_DEFAULTS, _base_conf


def test_cluster_masters_get_speculation_and_timeouts():
    for master in ("spark://10.0.0.5:7077", "yarn", "k8s://https://api:6443"):
        conf = _base_conf(master, None)
        assert conf["spark.speculation"] == "true"
        assert conf["spark.speculation.minTaskRuntime"] == STRAGGLER_DEFAULTS["spark.speculation.minTaskRuntime"]
        assert conf["spark.network.timeout"] == "120s" and conf["spark.executor.heartbeatInterval"] == "10s"


def test_local_masters_do_not_speculate_and_the_caller_wins():
    assert "spark.speculation" not in _base_conf("local[2]", None)
    assert "spark.speculation" not in _base_conf("local-cluster[2,1,1024]", None)
    conf = _base_conf("spark://h:7077", {"spark.speculation": False, "spark.network.timeout": "45s"})
    assert conf["spark.speculation"] == "false" and conf["spark.network.timeout"] == "45s"


def test_local_driver_jvm_compiles_with_c1_only_clusters_do_not():
    """The local driver (the executor too, one run long) compiles with C1 only; a cluster's driver and
    executors keep the JVM defaults; the caller's own Java options replace ours."""
    from datakit.engines.spark_session import LOCAL_DRIVER_JIT

    local = _base_conf("local[2]", None)["spark.driver.extraJavaOptions"].split()
    assert LOCAL_DRIVER_JIT in local and any(o.startswith("-Dlog4j2.configurationFile=") for o in local)
    for master in ("spark://h:7077", "yarn"):
        conf = _base_conf(master, None)
        assert LOCAL_DRIVER_JIT not in conf["spark.driver.extraJavaOptions"]
        assert LOCAL_DRIVER_JIT not in conf["spark.executor.extraJavaOptions"]
    own = _base_conf("local[2]", {"spark.driver.extraJavaOptions": "-Xss4m"})
    assert own["spark.driver.extraJavaOptions"] == "-Xss4m"


def test_the_shared_local_driver_jvm_runs_with_the_jit_option(spark):
    """Not only in the conf dict: the JVM that runs the local session was started with it."""
    from datakit.engines.spark_session import LOCAL_DRIVER_JIT

    args = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert LOCAL_DRIVER_JIT in args
    # the tests' JAVA_TOOL_OPTIONS carry the same flag (spark_fixtures.TEST_JVM_OPTS): the session's own
    # driver options must hold it too, or the JVM check above could pass without our setting
    assert LOCAL_DRIVER_JIT in spark.sparkContext.getConf().get("spark.driver.extraJavaOptions", "").split()


def test_local_masters_run_our_python_daemon_only_with_this_interpreter(monkeypatch):
    """The daemon module is ours on local masters whose workers run this interpreter (it has
    datakit); never on clusters (an executor's Python may not), nor with another interpreter; a
    caller's own daemon module wins."""
    import sys

    from datakit.engines.spark_session import LOCAL_DAEMON_MODULE

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    key = "spark.python.daemon.module"
    assert _base_conf("local[2]", None)[key] == LOCAL_DAEMON_MODULE
    assert _base_conf("local-cluster[2,1,1024]", None)[key] == LOCAL_DAEMON_MODULE
    assert _base_conf("local[2]", {"spark.pyspark.python": sys.executable})[key] == LOCAL_DAEMON_MODULE
    for master in ("spark://h:7077", "yarn"):
        assert key not in _base_conf(master, None)
    assert key not in _base_conf("local[2]", {"spark.pyspark.python": "./environment/bin/python"})
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/other/python3")
    assert key not in _base_conf("local[2]", None)
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert _base_conf("local[2]", {key: "pyspark.daemon"})[key] == "pyspark.daemon"


def _fake_pyspark_tree(root) -> str:
    """<root>/site/pyspark/{__init__.py, python/lib/pyspark.zip}: the layout of a pip-installed pyspark."""
    pkg = root / "site" / "pyspark"
    (pkg / "python" / "lib").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "python" / "lib" / "pyspark.zip").write_bytes(b"")
    return str(pkg / "python" / "lib" / "pyspark.zip")


def test_the_daemon_drops_the_zip_only_when_pyspark_then_resolves_to_its_own_package(tmp_path, monkeypatch):
    import importlib.util
    import os

    import pyspark

    from datakit.engines.spark_daemon import prefer_installed_pyspark

    # the installed pyspark's own zip: dropped, pyspark is found in the package beside it
    installed = os.path.dirname(pyspark.__file__)
    own_zip = os.path.join(installed, "python", "lib", "pyspark.zip")
    path = [own_zip, "/elsewhere", os.path.dirname(installed)]
    monkeypatch.setattr("sys.path", path)
    assert prefer_installed_pyspark(path) == [own_zip] and path == ["/elsewhere", os.path.dirname(installed)]

    # a zip laid out the same way but of a package pyspark does not resolve to: left where it was
    other_zip = _fake_pyspark_tree(tmp_path)
    path = [other_zip, os.path.dirname(installed)]
    monkeypatch.setattr("sys.path", path)
    assert prefer_installed_pyspark(path) == [] and path == [other_zip, os.path.dirname(installed)]

    # a cluster's Spark distribution ($SPARK_HOME/python/lib/pyspark.zip, no package around it): untouched
    dist = tmp_path / "spark-4.0.0-bin" / "python" / "lib"
    dist.mkdir(parents=True)
    path = [str(dist / "pyspark.zip"), os.path.dirname(installed)]
    monkeypatch.setattr("sys.path", path)
    assert prefer_installed_pyspark(path) == [] and path[0] == str(dist / "pyspark.zip")
    assert importlib.util.find_spec("pyspark") is not None


def test_local_python_workers_import_pyspark_from_the_installed_package(spark):
    """Spark puts the bundled pyspark.zip (no bytecode) first on its workers' path; our daemon drops it, so
    a worker's pyspark is the installed package's (fails with pyspark's own daemon: `.../pyspark.zip/...`)."""
    import os

    import pyarrow as pa
    import pyspark

    def where(batches):
        import pyspark as worker_pyspark

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"file": [worker_pyspark.__file__]})

    files = {r["file"] for r in spark.range(0, 2, 1, 2).mapInArrow(where, "file string").collect()}
    assert files == {os.path.abspath(pyspark.__file__)}


def test_the_daemon_puts_the_drivers_folder_first_not_the_one_python_m_put(monkeypatch, tmp_path):
    """Found in review: a `concurrent.py` in the folder a `datakit` Spark run started from shadowed the
    standard library in every Python worker (`python -m` puts that folder first); and a custom stage
    module beside a user's script must import there as it does in the driver and the local pool."""
    from datakit.engines.spark_daemon import driver_first

    monkeypatch.chdir(tmp_path)
    for first in ("", str(tmp_path)):
        path = [first, "/site-packages"]
        driver_first(path, "/the/script/folder")
        assert path == ["/the/script/folder", "/site-packages"]
        path = [first, "/site-packages"]
        driver_first(path, None)
        assert path == ["/site-packages"]
    path = ["/from/PYTHONPATH", str(tmp_path)]
    driver_first(path, "/from/PYTHONPATH")
    assert path == ["/from/PYTHONPATH", str(tmp_path)]  # only the entry -m added, in first place


def test_local_python_workers_import_from_the_drivers_folder(spark):
    from datakit.engines.spark_session import driver_import_folder

    import pyarrow as pa

    def first(batches):
        import sys as worker_sys

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"first": [worker_sys.path[0]]})

    rows = spark.range(0, 2, 1, 2).mapInArrow(first, "first string").collect()
    assert [r["first"] for r in rows] == [driver_import_folder()] * 2


def test_local_python_workers_get_the_pool_workers_allocator(monkeypatch):
    """On a local master whose workers run this interpreter, Spark's Python workers start with the
    local engine's worker allocator (spark.executorEnv.LD_PRELOAD); never on a cluster (the library's
    path there is unknown), not with DATAKIT_ALLOCATOR=system, and a caller's own value wins."""
    from datakit import allocator

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv(allocator.ENV_VAR, raising=False)
    key = "spark.executorEnv.LD_PRELOAD"
    lib = allocator.mimalloc_library()
    if lib is None:
        assert key not in _base_conf("local[2]", None)
        return
    assert _base_conf("local[2]", None)[key] == lib
    assert _base_conf("local", None)[key] == lib
    # local-cluster: executorEnv would also reach the executor JVMs
    for master in ("spark://h:7077", "yarn", "local-cluster[2,1,1024]"):
        assert key not in _base_conf(master, None)
    assert key not in _base_conf("local[2]", {"spark.pyspark.python": "./environment/bin/python"})
    assert _base_conf("local[2]", {key: "/opt/libjemalloc.so"})[key] == "/opt/libjemalloc.so"
    monkeypatch.setenv(allocator.ENV_VAR, "system")
    assert key not in _base_conf("local[2]", None)


def test_local_python_workers_get_one_blas_thread(monkeypatch):
    """A local master's Python worker runs one task on one core, like a pool worker: numpy's OpenBLAS gets one
    thread there (its threads spin at import), unless the user chose; never set for a cluster's executors."""
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    key = "spark.executorEnv.OPENBLAS_NUM_THREADS"
    assert _base_conf("local[2]", None)[key] == "1"
    for master in ("spark://h:7077", "yarn", "local-cluster[2,1,1024]"):
        assert key not in _base_conf(master, None)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")  # the user's choice reaches the workers through the environment
    assert key not in _base_conf("local[2]", None)
