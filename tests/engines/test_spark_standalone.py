"""A real standalone Spark cluster (master + workers on 127.0.0.1, shared with test_spark_packed_cluster.py):
this process's session on it writes the same output as local, and a dead executor costs a task retry, not
the job, and never a lost or duplicated row."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pytest

from datakit import Pipeline
from datakit.io.sinks import output_checksums
from datakit.plan import Rel
from datakit.stages.base import CompileContext, StageConfig, register_stage
from tests.engines.test_spark_conformance import make_logs

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

# executors cannot import the tests package: ship this module's classes by value
from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

CLUSTER_CONF = {"spark.executor.memory": "512m", "spark.task.maxFailures": "4",
                # the cluster's daemons have no PYTHONPATH (tests/spark_fixtures.py): executors start this
                # process's interpreter, and see the tree under test when it is given by PYTHONPATH
                **({"spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}


class GateFn:
    """Identity on batches, but the first call on an executor blocks while `<dir>/armed` exists and
    `<dir>/release` does not: the test kills the executor while a task sits here."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        d = Path(self.folder)
        if (d / "armed").exists():
            (d / f"started-{os.getpid()}").touch()
            end = time.monotonic() + 120
            while not (d / "release").exists() and time.monotonic() < end:
                time.sleep(0.1)
        return batch


@register_stage
class GateConfig(StageConfig):
    kind: Literal["test_gate"] = "test_gate"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"
    folder: str

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        return rel.map_batches(GateFn(self.folder), rel.schema, name="gate")


class CrashOnceFn:
    """Identity, except that the first attempt of partition 0's task kills its own Python worker on its
    second batch, after the first batch's rows went to the shard part files (engines/spark_parts.py). The
    retry records which part files of partition 0 it found: the dead attempt's must be among them and
    never read."""

    def __init__(self, folder: str, parts_glob: str) -> None:
        self.folder, self.parts_glob = folder, parts_glob
        self.calls = 0

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 0:  # (None: the local engine's reference run)
            self.calls += 1
            if ctx.attemptNumber() == 0 and self.calls == 2:
                os._exit(3)  # a crash: no exception handler runs, the first batch's part file stays behind
            if ctx.attemptNumber() > 0 and self.calls == 1:
                seen = sorted(str(f) for f in Path("/").glob(self.parts_glob.lstrip("/")))
                (Path(self.folder) / "seen.json").write_text(json.dumps(seen))
        return batch


@register_stage
class CrashOnceConfig(StageConfig):
    kind: Literal["test_crash_once"] = "test_crash_once"
    consumes = "training_record.v1"
    produces = "training_record.v1"
    folder: str
    parts_glob: str

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        return rel.map_batches(CrashOnceFn(self.folder, self.parts_glob), rel.schema, name="crash_once")


def pipeline(logs: Path, gate: Path) -> Pipeline:
    return (Pipeline("cluster", seed=2)
            .input(str(logs / "dt=*" / "*.jsonl.*"))
            .add({"kind": "ingest"})
            .add(GateConfig(folder=str(gate)))
            .add({"kind": "consent", "optouts": str(logs / "optouts.parquet")})
            .add({"kind": "extract", "kinds": ["code", "fim", "sft", "preference"]})
            .add({"kind": "dedup", "exact": True})
            .output(str(logs.parent / "unused"), shards=2))


def _counts(run_json: Path) -> list:
    st = json.loads(run_json.read_text())["stages"]
    return [(s["name"], s["rows_in"], s["rows_out"], s["dropped"]) for s in st]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster-data")
    logs = make_logs(root, events=120)
    gate = root / "gate"
    gate.mkdir()
    p = pipeline(logs, gate)
    p.run(engine="local", workers=1, output=str(root / "local"))
    return p, root, gate


def test_on_a_standalone_cluster_a_killed_executor_costs_a_retry_not_rows(spark_cluster, reference):
    """This process's session on the cluster: every executor is killed while a task sits in the gate; the
    job still ends with the local engine's bytes and counts. (It replaces a separate clean cluster run,
    which proved the same thing on the same path without the fault.)"""
    p, root, gate = reference
    from datakit.engines.spark_session import log_file

    out = root / "fault"
    log_start = log_file().stat().st_size if log_file().exists() else 0
    (gate / "armed").touch()
    result: dict = {}

    def run() -> None:
        try:
            result["res"] = p.run(engine="spark", master=spark_cluster.master_url, conf=CLUSTER_CONF, output=str(out))
        except BaseException as e:  # surfaced in the main thread
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        end = time.monotonic() + 180
        while not list(gate.glob("started-*")) and time.monotonic() < end and t.is_alive():
            time.sleep(0.2)
        assert list(gate.glob("started-*")), f"no task reached the gate: {result.get('error')}"
        victims = spark_cluster.executor_pids()
        assert victims, "no executor JVM found under the worker"
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        time.sleep(1.0)
    finally:
        (gate / "release").touch()
        (gate / "armed").unlink(missing_ok=True)
    t.join(timeout=300)
    assert not t.is_alive(), "the job did not finish after the executor was killed"
    if "error" in result:
        raise result["error"]
    assert result["res"].extra["master"] == spark_cluster.master_url  # it really ran on the cluster
    # Spark saw the executor die and retried its task on a new executor (the worker relaunched one) ...
    with open(log_file(), "rb") as f:
        f.seek(log_start)
        assert b"Lost executor" in f.read()
    assert set(spark_cluster.executor_pids()).isdisjoint(victims)
    # ... and nothing was lost or duplicated
    assert output_checksums(str(out)) == output_checksums(str(root / "local"))
    assert _counts(out / "_run.json") == _counts(root / "local" / "_run.json")


def test_a_crashed_root_chain_task_leaves_a_part_file_that_is_never_read(spark_cluster, tmp_path):
    """The root chain writes its rows as shard part files (engines/spark_parts.py). A Python worker that
    dies after writing one batch leaves a part file nobody closed; Spark retries the task (a new attempt id,
    so a new file) and the driver reads only the files the successful attempts listed: the output is the
    local engine's, byte for byte, with the same counts, and no part folder is left."""
    import pyarrow.parquet as pq

    from tests.test_local_barriers import _records

    src = tmp_path / "in"
    src.mkdir()
    records = _records(60)
    for i in range(6):  # files are read inside the root chain: 3 per task, a batch each
        pq.write_table(records.slice(i * 10, 10), src / f"part-{i}.parquet")
    gate = tmp_path / "gate"
    gate.mkdir()

    def crash_pipeline(out: Path) -> Pipeline:
        parts = f"{out}/_work/spark-parts-*/shard-*/part-00000-*.arrows"
        return (Pipeline("crash", seed=2).input(str(src), format="parquet", schema="training_record.v1")
                .add(CrashOnceConfig(folder=str(gate), parts_glob=parts)).output(str(out), shards=2))

    crash_pipeline(tmp_path / "local").run(engine="local", workers=1, output=str(tmp_path / "local"))
    res = crash_pipeline(tmp_path / "spark").run(engine="spark", master=spark_cluster.master_url,
                                                  conf=CLUSTER_CONF, partitions=2, output=str(tmp_path / "spark"))
    assert res.extra["master"] == spark_cluster.master_url
    # the retry found partition 0's part file of the crashed attempt (its own opens after its first batch)
    seen = json.loads((gate / "seen.json").read_text())
    assert len(seen) >= 1, seen
    assert output_checksums(str(tmp_path / "spark")) == output_checksums(str(tmp_path / "local"))
    assert _counts(tmp_path / "spark" / "_run.json") == _counts(tmp_path / "local" / "_run.json")
    assert not (tmp_path / "spark" / "_work").exists()
