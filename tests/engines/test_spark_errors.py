"""Clear, short errors from the Spark engine: no Java, a wrong master URL, a failing task."""
from __future__ import annotations

import sys
from typing import Literal

import pyarrow as pa
import pytest

from datakit import Pipeline
from datakit.engines.spark_session import SparkJobError, SparkSetupError, check_java, check_master, summarize
from datakit.plan import Rel
from datakit.stages.base import CompileContext, StageConfig, register_stage
from tests.eventgen import make_event, write_jsonl

from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_no_java_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))  # a JDK folder without bin/java
    with pytest.raises(SparkSetupError, match=r"needs Java 17 or newer.*JAVA_HOME.*--engine local"):
        check_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SparkSetupError, match="no `java` on PATH"):
        check_java()


@pytest.mark.parametrize("url, msg", [
    ("spark://127.0.0.1:9", r"cannot reach the Spark master at spark://127.0.0.1:9 .*Is the master running"),
    ("sprak://host:7077", r"not a Spark master URL: 'sprak://host:7077'"),
    ("spark://hostonly", r"expected spark://HOST:PORT"),
    ("local[two]", r"not a Spark master URL"),
])
def test_wrong_master_url_fails_fast_and_short(url, msg):
    import time

    t = time.monotonic()
    with pytest.raises(SparkSetupError, match=msg) as e:
        check_master(url, timeout=2)
    assert time.monotonic() - t < 5  # Spark itself would retry for about a minute
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("master, code", [("bogus://x", 2), ("spark://127.0.0.1:9", 3)])
def test_a_malformed_master_is_a_usage_error_and_an_unreachable_one_a_job_failure(tmp_path, master, code):
    """Found in review: a mistyped --master exited 3, which schedulers retry (docs/scheduling.md);
    a master that is down stays 3. One line each, no JVM started."""
    import subprocess
    import sys

    f = write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(3)])
    (tmp_path / "p.yaml").write_text(f"name: t\ninput: {{path: {f}}}\nstages: [{{kind: ingest}}]\n"
                                     f"output: {{path: {tmp_path / 'out'}}}\n")
    r = subprocess.run([sys.executable, "-m", "datakit.cli", "run", str(tmp_path / "p.yaml"), "--engine", "spark",
                        "--master", master], capture_output=True, text=True, timeout=120)
    assert r.returncode == code, r.stderr
    assert r.stderr.startswith("datakit: error:") and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("conf, needle", [
    ("spark.sql.adaptive.enabled=maybe", "The value 'maybe' in the config \"spark.sql.adaptive.enabled\" is invalid"),
    ("spark.executor.memory=lots", "Spark cannot start with these settings: Size must be specified as bytes"),
    ("spark.network.timeout=5s", "spark.network.timeout=5000ms must be greater than the value of "
                                 "spark.executor.heartbeatInterval"),
    ("spark.datakit.partitionbytes=1m", "unknown datakit Spark setting 'spark.datakit.partitionbytes'"),
    ("spark.sql.execution.arrow.maxRecordsPerBatch=-1", "maxRecordsPerBatch must be a positive number of rows"),
    ("spark.datakit.stallSeconds=soon", "spark.datakit.stallSeconds must be a number of seconds, 0 (off) or more"),
])
def test_a_setting_that_can_never_work_is_a_usage_error_in_one_line(tmp_path, conf, needle):
    """Found in review: a bad runtime SQL setting was a 119-line traceback, exit 1 ("a check failed"); a bad
    core setting exit 3 ("retry") with "An error occurred while calling ...JavaSparkContext"; a misspelled
    spark.datakit.* key was ignored; maxRecordsPerBatch=-1 failed mid-run. Exit 2, one line saying what."""
    import subprocess

    f = write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(3)])
    (tmp_path / "p.yaml").write_text(f"name: t\ninput: {{path: {f}}}\nstages: [{{kind: ingest}}]\n"
                                     f"output: {{path: {tmp_path / 'out'}}}\n")
    r = subprocess.run([sys.executable, "-m", "datakit.cli", "run", str(tmp_path / "p.yaml"), "--engine", "spark",
                        "--conf", conf], capture_output=True, text=True, timeout=180)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.startswith("datakit: error:") and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert needle in r.stderr


def test_the_driver_log_is_private(tmp_path, monkeypatch):
    """A task's error in the driver log may quote a record (found in review: the log was 0644 in /tmp)."""
    from datakit.engines.spark_session import log_file

    monkeypatch.setenv("DATAKIT_SPARK_LOG_DIR", str(tmp_path / "logs"))
    path = log_file()
    assert path.stat().st_mode & 0o777 == 0o600 and (tmp_path / "logs").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("days, kept", [(None, {"driver-2.log", "driver-2.log4j2.properties", "notes.txt"}),
                                        ("0", None), ("30", None)])
def test_driver_logs_older_than_the_retention_are_removed(tmp_path, monkeypatch, days, kept):
    """One log per driver process was kept forever (hundreds of them beside the test runs' /tmp)."""
    import os

    from datakit.engines.spark_session import log_file, prune_driver_logs

    monkeypatch.setenv("DATAKIT_SPARK_LOG_DIR", str(tmp_path / "logs"))
    if days is None:
        monkeypatch.delenv("DATAKIT_SPARK_LOG_DAYS", raising=False)
    else:
        monkeypatch.setenv("DATAKIT_SPARK_LOG_DAYS", days)
    own = log_file()  # this process's: never removed, however old
    now = 1_800_000_000.0
    old = now - 20 * 86400
    names = ["driver-1.log", "driver-1.log4j2.properties", "driver-2.log", "driver-2.log4j2.properties", "notes.txt"]
    for name in names:
        (tmp_path / "logs" / name).write_text("x")
    for name in ("driver-1.log", "driver-1.log4j2.properties", "notes.txt"):  # 20 days old
        os.utime(tmp_path / "logs" / name, (old, old))
    for name in ("driver-2.log", "driver-2.log4j2.properties"):  # 2 days old
        os.utime(tmp_path / "logs" / name, (now - 2 * 86400, now - 2 * 86400))
    os.utime(own, (old, old))
    removed = prune_driver_logs(now=now)
    left = {p.name for p in (tmp_path / "logs").iterdir()} - {own.name}
    assert own.exists()
    if kept is None:  # retention off, or longer than the files' age
        assert removed == 0 and left == set(names)
    else:  # the default 14 days: the 20-day-old driver files go, another program's file stays
        assert removed == 2 and left == kept


def test_a_nested_spark_setting_is_refused_at_load():
    from datakit.pipeline import PipelineError

    with pytest.raises(PipelineError, match="a Spark setting takes a string, number or boolean"):
        Pipeline.from_yaml_string("name: t\nspark: {spark.executor: {memory: 4g}}\n")


def test_engine_refuses_unreachable_master_before_starting_a_jvm(tmp_path):
    f = write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(3)])
    p = Pipeline("t").input(str(f)).add({"kind": "ingest"}).output(str(tmp_path / "out"))
    with pytest.raises(SparkSetupError, match="cannot reach the Spark master"):
        p.run(engine="spark", master="spark://127.0.0.1:9")


class BoomFn:
    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        raise ValueError("stage bug: column 'x' has an unexpected type")


@register_stage
class BoomConfig(StageConfig):
    kind: Literal["test_boom"] = "test_boom"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        return rel.map_batches(BoomFn(), rel.schema, name="boom")


@pytest.mark.spark
def test_failed_task_is_one_line_with_the_log_path(spark, tmp_path):
    f = write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(5)])
    p = Pipeline("t").input(str(f)).add({"kind": "ingest"}).add(BoomConfig()).output(str(tmp_path / "out"))
    with pytest.raises(SparkJobError) as e:
        p.run(engine="spark", partitions=1)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 600
    assert "ValueError: stage bug: column 'x' has an unexpected type" in msg
    assert "stage 'test_boom'" in msg
    log = msg.rsplit("full log: ", 1)[1].rstrip(")")
    assert "ValueError" in open(log, encoding="utf-8", errors="replace").read()  # the detail went to the log
    assert e.value.__cause__ is None and e.value.__suppress_context__
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.spark
@pytest.mark.parametrize("how,message", [("delete", "disappeared during the run"),
                                         ("rewrite", "changed during the run")])
def test_an_input_file_changed_after_listing_is_one_input_error(spark, tmp_path, monkeypatch, how, message):
    """The run's identity and manifest name the files as listed when it started. On Spark a file replaced
    after the listing was read as it is now under a manifest naming the old one, exit 0, and a deleted one
    was a SparkJobError (exit 3, which schedulers retry); now each read checks the file against the listing
    (`identity.check_unchanged`, as the local engine's tasks do) and the driver raises the InputError."""
    import os

    from datakit.io import identity
    from datakit.io.fs import InputError

    files = [write_jsonl(tmp_path / "logs" / f"p{k}.jsonl", [make_event(10 * k + i) for i in range(5)])
             for k in range(3)]
    listed = identity.input_files

    def list_then_change(paths):
        out = listed(paths)  # the listing the run starts from; then the file changes under the run
        if how == "delete":
            os.remove(files[1])
        else:
            write_jsonl(files[1], [make_event(900 + i) for i in range(7)])
        return out

    monkeypatch.setattr(identity, "input_files", list_then_change)
    p = Pipeline("t").input(str(tmp_path / "logs")).add({"kind": "ingest"}).output(str(tmp_path / "out"))
    with pytest.raises(InputError, match=message) as e:
        p.run(engine="spark", partitions=3)
    assert "p1.jsonl" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_summarize_picks_the_python_error_out_of_a_jvm_trace():
    trace = ("An error occurred while calling o1.count.\n: org.apache.spark.SparkException: Job aborted due to "
             "stage failure: Task 0 failed 4 times\n  File \"x.py\", line 3, in f\n    raise KeyError('k')\n"
             "KeyError: 'k'\n\tat org.apache.spark.api.python.BasePythonRunner...\n")
    assert summarize(Exception(trace)) == "KeyError: 'k'"
    assert summarize(Exception("Job aborted due to stage failure: Lost executor 1 on 127.0.0.1\n\tat x")) \
        == "Lost executor 1 on 127.0.0.1"


LOG_EMAIL, LOG_SECRET = "jane.roe@example.org", "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


class LogInWorkerFn:
    """Logs a line quoting personal data in the Spark Python worker; what the worker's root handlers
    print is appended to `path` (local[2]: the executor shares this file system)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        import io
        import logging

        buf = io.StringIO()
        handlers = logging.getLogger().handlers
        old = [h.setStream(buf) for h in handlers]  # no handler at all: Python's last resort, raw to stderr
        try:
            logging.getLogger("datakit.stage").warning("cannot parse a field of %s (token %s)", LOG_EMAIL, LOG_SECRET)
        finally:
            for h, s in zip(handlers, old):
                h.setStream(s)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(buf.getvalue())
        return batch


@register_stage
class LogInWorkerConfig(StageConfig):
    kind: Literal["test_log_in_worker"] = "test_log_in_worker"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"
    path: str

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        return rel.map_batches(LogInWorkerFn(self.path), rel.schema, name="log_in_worker")


@pytest.mark.spark
def test_log_lines_inside_spark_python_workers_are_redacted(spark, tmp_path):
    """A Spark Python worker started with no log set-up: a stage's warning went out unredacted."""
    f = write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(4)])
    seen = tmp_path / "worker-log.txt"
    p = (Pipeline("t").input(str(f)).add({"kind": "ingest"}).add(LogInWorkerConfig(path=str(seen)))
         .output(str(tmp_path / "out")))
    p.run(engine="spark", partitions=2)
    text = seen.read_text(encoding="utf-8")
    assert "cannot parse a field" in text  # the line went through the worker's redacting handler
    assert LOG_EMAIL not in text and LOG_SECRET not in text
    assert "<EMAIL>" in text and "<GITHUB_TOKEN>" in text


def test_executors_with_other_libraries_or_code_are_a_setup_error():
    """Found in review: executors with another pyarrow wrote every Parquet file with other bytes under a
    manifest recording the driver's pyarrow (and a rerun reused those shards); only the datakit version
    string was compared, which stays the same across commits."""
    from datakit.engines.spark_session import check_same_environment
    from datakit.io.identity import runtime_versions

    mine = runtime_versions()
    assert set(mine) >= {"datakit code", "pyarrow", "polars", "tokenizers", "spacy"}
    check_same_environment(mine, [dict(mine), dict(mine)])  # the same everywhere: fine
    other = {**mine, "pyarrow": "25.0.0"}
    with pytest.raises(SparkSetupError, match=rf"pyarrow 25\.0\.0 on executors, {mine['pyarrow']} here.*spark\.archives"):
        check_same_environment(mine, [dict(mine), other])
    with pytest.raises(SparkSetupError, match=r"datakit's code \(its files differ"):
        check_same_environment(mine, [{**mine, "datakit code": "0" * 64}])


def test_the_executor_probe_reports_the_workers_libraries(spark):
    """The probe runs in Spark's real Python workers and reports what they import."""
    from datakit.engines.spark_session import executor_environment, workers_python_differs
    from datakit.io.identity import runtime_versions

    found = executor_environment(spark)
    assert found and all(f["versions"] == runtime_versions() for f in found)
    assert not workers_python_differs(spark)  # the tests' workers run this interpreter: no probe per run


class HangFn:
    """Loops on the batch holding event 3: in Python (`spin`, the interpreter sees the guard's exception)
    or in C (`sleep`: only ending the worker stops it)."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        import time

        if "ev-000003" in str(batch.column("event_id").to_pylist()):
            while True:
                if self.how == "spin":
                    try:
                        sum(range(1000))
                    except ZeroDivisionError:
                        pass
                elif self.how == "swallow":  # a stage that catches everything keeps looping
                    try:
                        sum(range(1000))
                    except Exception:  # noqa: BLE001
                        pass
                elif self.how == "stop":  # the whole worker stops (SIGSTOP): no thread of it can run
                    import os
                    import signal

                    os.kill(os.getpid(), signal.SIGSTOP)
                else:
                    time.sleep(3600)
        return batch


@register_stage
class HangConfig(StageConfig):
    kind: Literal["test_hang"] = "test_hang"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"
    how: str = "spin"

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        return rel.map_batches(HangFn(self.how), rel.schema, name="hang")


@pytest.mark.spark
@pytest.mark.parametrize("how", ["spin", "swallow", "sleep", "stop"])
def test_a_stage_that_hangs_on_a_record_fails_its_task_on_spark(spark, tmp_path, how):
    """Found in review: a stage function that looped on one record kept its healthy executor heartbeating,
    so the Spark job ran until the scheduler's timeout (the local engine has its watchdog). Now a batch
    stuck for spark.datakit.stallSeconds fails its task with one line naming the stage; code that never
    returns to the interpreter, or swallows the exception, has its Python worker ended after a grace."""
    import time

    events = [make_event(i) for i in range(6)]
    assert "ev-000003" in str([e["event_id"] for e in events]), [e["event_id"] for e in events]
    f = write_jsonl(tmp_path / "logs" / "a.jsonl", events)
    p = Pipeline("t").input(str(f)).add({"kind": "ingest"}).add(HangConfig(how=how)).output(str(tmp_path / "out"))
    t = time.monotonic()
    with pytest.raises(SparkJobError) as e:
        p.run(engine="spark", partitions=1, conf={"spark.datakit.stallSeconds": "2"})
    took = time.monotonic() - t
    msg = str(e.value)
    assert "\n" not in msg, msg
    if how == "stop":  # found in review: a stopped worker's own guard stopped with it; its watcher ends it
        assert "StalledBatchError: this Python worker made no progress at all for 7 s" in msg, msg
        assert took < 120, took
        assert not (tmp_path / "out" / "manifest.json").exists()
        return
    assert "StalledBatchError: stage 'test_hang' (hang) of partition 0 made no progress for" in msg, msg
    assert "spark.datakit.stallSeconds / DATAKIT_STALL_SECONDS = 2 s" in msg
    if how != "spin":  # the worker was ended: Spark's crash report carried the guard's line
        assert "the exception did not surface, so this Python worker was ended" in msg
    assert took < 120, took  # not a hang (the limit is 2 s, the grace 5 s)
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.spark
def test_a_task_on_a_worker_with_another_environment_fails_even_after_the_start_up_check(spark, tmp_path,
                                                                                       monkeypatch):
    """Found in review: the environment check ran once, at session start, so an executor that joined later
    with another datakit's code ran tasks and the run exited 0 with other output. Every task now checks its
    own Python worker against the driver's environment (here the driver's is made to differ, and the
    start-up check is skipped as for an executor that registers after it)."""
    from datakit.engines import spark as spark_engine
    from datakit.io import identity

    real = identity.runtime_versions()
    monkeypatch.setattr(spark_engine, "workers_python_differs", lambda s: True)
    monkeypatch.setattr(spark_engine, "executor_environment", lambda s: [])
    monkeypatch.setattr(identity, "runtime_versions", lambda: {**real, "datakit code": "0" * 64})
    f = write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(4)])
    p = Pipeline("t").input(str(f)).add({"kind": "ingest"}).output(str(tmp_path / "out"))
    with pytest.raises(SparkJobError) as e:
        p.run(engine="spark", partitions=1)
    msg = str(e.value)
    assert "\n" not in msg and "ExecutorEnvironmentError" in msg, msg
    assert "differs from the driver's: datakit's code (its files differ from this driver's)" in msg, msg
    assert not (tmp_path / "out" / "manifest.json").exists()
