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
