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


def test_local_driver_jvm_gets_raised_jit_thresholds_clusters_do_not():
    """The local driver (the executor too, one run long) compiles only what runs hot; a cluster's
    driver and executors keep the JVM defaults; the caller's own Java options replace ours."""
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
