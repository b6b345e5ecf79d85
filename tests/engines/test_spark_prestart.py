"""A Spark session started in the background while the driver reads and compiles the pipeline
(`spark_session.prestart_session`, `datakit run --engine spark`): the run gets that session, a
failed start is reported to the run that asked for it, and the command's early start asks for
exactly the session the run will ask for."""
from __future__ import annotations

import threading

import pytest

from datakit.engines import spark_session
from tests.spark_fixtures import requires_spark


@pytest.fixture
def fake_start(monkeypatch):
    """`_session` replaced by a slow stand-in that records who called it with what."""
    calls: list[tuple[str, str | None, dict]] = []
    gate = threading.Event()

    def slow(master, conf):
        gate.wait(5)
        calls.append((threading.current_thread().name, master, dict(conf or {})))
        if master == "bad://":
            raise spark_session.SparkSetupError("not a Spark master URL")
        return ("session", master)

    monkeypatch.setattr(spark_session, "_session", slow)
    monkeypatch.setattr(spark_session, "_context_running", lambda: False)  # the tests' real session is not ours here
    monkeypatch.setattr(spark_session, "_active", {})
    monkeypatch.setattr(spark_session, "_pending", {})
    yield calls, gate
    gate.set()
    spark_session.await_prestart()


def test_get_session_waits_for_the_background_start_then_reuses_it(fake_start):
    calls, gate = fake_start
    spark_session.prestart_session("local[2]", {"spark.x": "1"})
    spark_session.prestart_session("local[2]", {"spark.x": "1"})  # a second call while one is pending: no-op
    assert spark_session._pending["start"].thread.is_alive()
    threading.Timer(0.2, gate.set).start()
    assert spark_session.get_session("local[2]", {"spark.x": "1"}) == ("session", "local[2]")
    assert [c[0] for c in calls] == ["datakit-spark-start", "MainThread"]  # started there; here only looked up
    assert spark_session._pending == {}


@pytest.mark.parametrize("finished_first", [True, False])
def test_a_failed_background_start_raises_in_the_caller_that_asked_for_it(fake_start, finished_first):
    """Whether the start failed before the run asked (gate open) or while the run was waiting for it."""
    calls, gate = fake_start
    if finished_first:
        gate.set()
    else:
        threading.Timer(0.3, gate.set).start()
    spark_session.prestart_session("bad://", None)
    with pytest.raises(spark_session.SparkSetupError, match="not a Spark master URL"):
        spark_session.get_session("bad://", None)
    assert calls == [("datakit-spark-start", "bad://", {})]  # reported, not tried a second time
    assert spark_session._pending == {}
    spark_session.prestart_session("local[1]", None)  # the failed start left nothing behind
    assert spark_session.get_session("local[1]", None) == ("session", "local[1]")


def test_waiting_on_the_starts_own_thread_returns_at_once(fake_start, monkeypatch):
    """The start may stop a session itself (another master): that must not wait for the start."""
    calls, gate = fake_start
    gate.set()
    inner = spark_session._session
    waited: list = []

    def start_that_waits(master, conf):
        spark_session.await_prestart()
        waited.append(threading.current_thread().name)
        return inner(master, conf)

    monkeypatch.setattr(spark_session, "_session", start_that_waits)
    spark_session.prestart_session("local[2]", None)
    assert spark_session.get_session("local[2]", None) == ("session", "local[2]")
    assert waited == ["datakit-spark-start", "MainThread"]


def test_a_session_started_off_the_main_thread_is_set_up_when_the_main_thread_first_uses_it(monkeypatch):
    """Even when the start was collected by `settle` (the pipeline failed to compile) and the next
    run reuses the session: Ctrl-C cancels its jobs, and it is the main thread's active session."""
    import signal

    monkeypatch.setattr(spark_session, "_pending", {})
    monkeypatch.setattr(spark_session, "_context_running", lambda: False)
    handlers: list = []
    monkeypatch.setattr(signal, "signal", lambda sig, h: handlers.append((sig, h)))
    cancelled: list = []
    activated: list = []

    class Session:
        sparkContext = type("SC", (), {"cancelAllJobs": lambda self: cancelled.append(1)})()
        _jsparkSession = object()
        _jvm = type("JVM", (), {"SparkSession": type("S", (), {
            "setActiveSession": staticmethod(lambda js: activated.append(js))})})()

    session = Session()

    def start(master, conf):
        if threading.current_thread() is not threading.main_thread():
            spark_session._active.update(key=(master,), session=session, off_main=True)
        return session

    monkeypatch.setattr(spark_session, "_active", {})
    monkeypatch.setattr(spark_session, "_session", start)
    spark_session.prestart_session("local[2]", None)
    spark_session.await_prestart()  # `settle` after a compile error: nothing set up yet
    assert handlers == [] and spark_session._active["off_main"]
    assert spark_session.get_session("local[2]", None) is session
    assert [sig for sig, _ in handlers] == [signal.SIGINT] and activated == [session._jsparkSession]
    with pytest.raises(KeyboardInterrupt):
        handlers[0][1](signal.SIGINT, None)
    assert cancelled == [1] and "off_main" not in spark_session._active
    spark_session.get_session("local[2]", None)  # set up once
    assert len(handlers) == 1


@requires_spark
def test_no_background_start_beside_a_context_datakit_did_not_start(spark, monkeypatch):
    """A notebook's own session (or spark-submit's): replacing it is `get_session`'s decision."""
    monkeypatch.setattr(spark_session, "_active", {})
    monkeypatch.setattr(spark_session, "_pending", {})
    spark_session.prestart_session("local[1]", None)
    assert spark_session._pending == {}
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    monkeypatch.setattr(spark_session, "_context_running", lambda: False)
    spark_session.prestart_session(None, None)  # inside spark-submit
    assert spark_session._pending == {}


def test_a_failed_start_of_another_session_is_not_the_callers_error(fake_start):
    calls, gate = fake_start
    gate.set()
    spark_session.prestart_session("bad://", None)
    assert spark_session.get_session("local[1]", None) == ("session", "local[1]")
    assert [c[1] for c in calls] == ["bad://", "local[1]"]


def test_stop_session_waits_for_a_start_in_progress(fake_start, monkeypatch):
    """A session still starting would otherwise come up after the stop and outlive it."""
    calls, gate = fake_start
    stopped: list = []
    monkeypatch.setattr(spark_session, "_stop_locked", lambda: stopped.append(len(calls)))
    spark_session.prestart_session("local[2]", None)
    threading.Timer(0.2, gate.set).start()
    spark_session.stop_session()
    assert calls == [("datakit-spark-start", "local[2]", {})] and spark_session._pending == {}
    assert stopped == [1]  # the stop came after the start had finished


def test_the_commands_early_start_asks_for_the_session_the_run_asks_for(tmp_path, monkeypatch):
    """`datakit run --engine spark`: the file's `spark:` block under --conf, as `Pipeline.run` merges
    them; the run's engine then asks `get_session` for the same (master, conf), so the session
    started early is reused, not replaced."""
    from datakit import cli
    from datakit.engines.spark import SparkEngine
    from datakit.pipeline import Pipeline

    spec = tmp_path / "p.yaml"
    spec.write_text("name: t\nseed: 0\ninput: {path: 'in/*.jsonl', format: jsonl, schema: editor_event.v1}\n"
                    "spark: {spark.sql.shuffle.partitions: 4, spark.driver.memory: 1g}\n"
                    "stages: [{kind: ingest}]\noutput: {path: out, format: parquet}\n")
    early: list = []
    monkeypatch.setattr(spark_session, "prestart_session", lambda m, c: early.append((m, c)))
    cli._start_spark_early(spec, "local[1]", ["spark.driver.memory=2g", "spark.foo=x=y"])
    assert early == [("local[1]", {"spark.sql.shuffle.partitions": 4, "spark.driver.memory": "2g",
                                   "spark.foo": "x=y"})]

    class Asked(Exception):
        pass

    def record(self):
        raise Asked((self.master, self.conf))

    monkeypatch.setattr(SparkEngine, "prestart", record)
    with pytest.raises(Asked) as got:
        Pipeline.from_yaml(spec).run(engine="spark", master="local[1]",
                                     conf={"spark.driver.memory": "2g", "spark.foo": "x=y"})
    assert got.value.args[0] == early[0]


def test_the_early_start_leaves_a_broken_file_or_setting_to_the_run(tmp_path, monkeypatch):
    from datakit import cli

    early: list = []
    monkeypatch.setattr(spark_session, "prestart_session", lambda m, c: early.append((m, c)))
    cli._start_spark_early(tmp_path / "missing.yaml", None, [])
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    cli._start_spark_early(bad, None, [])
    ok = tmp_path / "ok.yaml"
    ok.write_text("name: t\n")
    cli._start_spark_early(ok, None, ["no-equals-sign"])
    cli._start_spark_early(ok, None, ["spark.sql.shuffle.partitions=0"])  # check_user_conf rejects it
    assert early == []


@requires_spark
def test_a_real_session_started_in_the_background_is_the_one_the_run_gets(spark, monkeypatch):
    """With a real JVM: the session comes up on the background thread and `get_session` returns it
    without stopping or starting another."""
    import signal

    spark_session.stop_session()
    monkeypatch.setattr(signal, "signal", lambda sig, handler: handlers.append((sig, handler)))
    handlers: list = []
    stops: list = []
    real_stop = spark_session._stop_locked
    monkeypatch.setattr(spark_session, "_stop_locked", lambda: (stops.append(1), real_stop())[1])
    spark_session.prestart_session("local[2]", None)
    thread = spark_session._pending["start"].thread
    session = spark_session.get_session("local[2]", None)
    assert not thread.is_alive() and spark_session._pending == {}
    assert session is spark_session._active["session"] and session.sparkContext.master == "local[2]"
    assert stops == []
    assert session.range(3).count() == 3
    # pyspark sets its Ctrl-C handler (cancel the jobs) only for a context made on the main thread;
    # this one was made on the background thread, so get_session set it
    assert [sig for sig, _ in handlers] == [signal.SIGINT]
    from pyspark.sql import SparkSession

    assert SparkSession.getActiveSession() is not None  # the JVM keeps an active session per thread
    assert SparkSession.getActiveSession()._jsparkSession.equals(session._jsparkSession)
    cancelled: list = []
    monkeypatch.setattr(type(session.sparkContext), "cancelAllJobs", lambda self: cancelled.append(1))
    with pytest.raises(KeyboardInterrupt):
        handlers[0][1](signal.SIGINT, None)
    assert cancelled == [1]
