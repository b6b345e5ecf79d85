"""One SparkSession per process, started quietly, with short errors for the usual mistakes.

Why a module of its own: starting Spark is where users hit the environment
(no Java, a typo in the master URL, a hostname that resolves to a LAN address,
Python workers that start the wrong interpreter). Each of those becomes one
`SparkSetupError` sentence saying what to do; the JVM's own output goes to a log
file whose path the error names, never to the user's terminal.

Sessions are expensive (~4 s local, ~6 s on a standalone master), so
`get_session` reuses the running one when the master is the same and only
restarts it when the caller asks for a different master.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa

from datakit.errors import DatakitError

__all__ = [
    "SparkError", "SparkSetupError", "SparkJobError", "get_session", "stop_session", "submit_defaults",
    "STRAGGLER_DEFAULTS", "TIMEOUT_DEFAULTS", "check_same_environment", "executor_environment", "straggler_conf",
    "workers_python_differs",
    "log_file", "translate_errors", "check_java", "check_master", "prestart_session", "await_prestart",
    "merged_conf",
]


class SparkError(DatakitError, RuntimeError):
    """Base of the Spark engine's user-facing errors (the CLI prints the message, no traceback)."""


class SparkSetupError(SparkError):
    """Spark could not start: no Java, an unreachable or malformed master URL, a bad setting."""


class SparkMasterURLError(SparkSetupError, ValueError):
    """A master URL that is not one (a usage error: the CLI exits 2, as for any other bad option)."""


class SparkConfError(SparkSetupError, ValueError):
    """A Spark setting that can never work (a value of the wrong type or range, two settings that
    contradict): a usage error, exit 2, so a scheduler does not retry it as a failed job."""


class SparkJobError(SparkError):
    """A Spark job failed (a task failed too often, an executor kept dying, a stage raised)."""


_lock = threading.RLock()
_active: dict[str, Any] = {}  # {"key": (master,), "session": SparkSession, "off_main": made off the main thread}
_pending: dict[str, Any] = {}  # {"start": _Start}: a session being started in the background (`prestart_session`)
_pending_lock = threading.Lock()

DEFAULT_LOCAL_MASTER = "local[2]"
_MASTER_RE = re.compile(
    r"^(local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|spark://[^\s/]+|yarn|k8s://\S+|mesos://\S+)$"
)


def log_file() -> Path:
    """Where the driver JVM's output goes (Spark's log4j lines, Python worker stderr in local mode).

    `DATAKIT_SPARK_LOG_DIR` overrides the folder; one file per driver process.
    """
    base = Path(os.environ.get("DATAKIT_SPARK_LOG_DIR") or Path(tempfile.gettempdir()) / "datakit-spark")
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = base / f"driver-{os.getpid()}.log"
    if not path.exists():  # private: a task's error in it may quote a record (found in review: 0644 in /tmp)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    return path


# driver logs older than this many days are removed when a driver starts (`prune_driver_logs`; 0 keeps all)
LOG_DAYS_ENV = "DATAKIT_SPARK_LOG_DAYS"
DEFAULT_LOG_DAYS = 14.0


def prune_driver_logs(now: float | None = None) -> int:
    """Remove the log folder's driver logs (and their log4j configs) last written more than
    `DATAKIT_SPARK_LOG_DAYS` (default 14) days ago; returns how many files went.

    Why: one file per driver process, never removed: a scheduled job on an edge node or in a
    container whose /tmp is not cleaned kept every run's log (100-300 KB each at 100k events;
    found beside this repo's test runs: hundreds of them). A log still written to is recent; this
    process's own is never touched; a file that cannot be removed is left as it is."""
    import time

    try:
        days = float(os.environ.get(LOG_DAYS_ENV) or DEFAULT_LOG_DAYS)
    except ValueError:
        days = DEFAULT_LOG_DAYS
    if days <= 0:
        return 0
    base = log_file().parent
    cutoff = (now if now is not None else time.time()) - days * 86400
    own = f"driver-{os.getpid()}."
    removed = 0
    for f in base.glob("driver-*"):
        if f.name.startswith(own) or not f.name.endswith((".log", ".log4j2.properties")):
            continue
        try:
            if f.stat().st_mtime < cutoff:
                f.unlink()
                removed += 1
        except OSError:
            pass
    return removed


def check_java() -> str:
    """Path of the `java` Spark will use; a `SparkSetupError` saying how to get one if there is none."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no `java` on PATH"
        raise SparkSetupError(
            f"the Spark engine needs Java 17 or newer ({where}). Install a JDK "
            "(e.g. `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME, "
            "or run with --engine local."
        )
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SparkSetupError(f"cannot run {java} ({type(e).__name__}); check your Java installation") from None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if m:
        major = int(m.group(1)) if m.group(1) != "1" else int(m.group(2) or 0)
        if major < 17:
            raise SparkSetupError(f"Spark 4 needs Java 17 or newer, found Java {major} at {java}; set JAVA_HOME")
    return java


def check_master(master: str, timeout: float = 3.0) -> None:
    """Reject malformed master URLs and unreachable `spark://` masters before starting a JVM.

    Why: Spark itself retries an unreachable master for about a minute and then
    prints pages of stack traces; a TCP connect tells the same in seconds.
    """
    if not _MASTER_RE.match(master):
        raise SparkMasterURLError(
            f"not a Spark master URL: {master!r}. Use local[N], local-cluster[W,C,MB], "
            "spark://HOST:PORT, yarn or k8s://URL."
        )
    if not master.startswith("spark://"):
        return
    hosts = master[len("spark://"):].split(",")
    errors = []
    for hp in hosts:
        host, _, port = hp.rpartition(":")
        if not host or not port.isdigit():
            raise SparkMasterURLError(f"not a Spark master URL: {master!r}; expected spark://HOST:PORT (default port 7077)")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return
        except OSError as e:
            errors.append(f"{hp}: {e.strerror or type(e).__name__}")
    raise SparkSetupError(
        f"cannot reach the Spark master at {master} ({'; '.join(errors)}). "
        "Is the master running, and is the host:port the one in its log (default port 7077)?"
    )


def _log4j_config(level: str) -> Path:
    """A log4j2 config that sends every Spark line to the JVM's stderr (which we redirect to a file)."""
    path = log_file().with_suffix(".log4j2.properties")
    path.write_text(
        "rootLogger.level = {lvl}\n"
        "rootLogger.appenderRef.stderr.ref = console\n"
        "appender.console.type = Console\n"
        "appender.console.name = console\n"
        "appender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex\n"
        "logger.jetty.name = org.sparkproject.jetty\n"
        "logger.jetty.level = warn\n".format(lvl=level)
    )
    return path


# A stalled executor (alive but stuck: a SIGSTOPped JVM, a swapping node, a hung disk) must not hold a
# job forever. Two mechanisms, both safe because our tasks are: a second attempt of a task computes the
# same bytes, shards are committed by atomic per-file renames, counts travel as rows (see docs/deploy.md).
#  * speculation: once 75% of a stage's tasks are done, a task running 4x longer than their median (and
#    at least `minTaskRuntime`) gets a second attempt on another executor; the first to finish wins and
#    the other is killed. minTaskRuntime keeps short tasks on a busy cluster from being copied for nothing.
#  * timeouts: a JVM that stops heartbeating is declared lost after spark.network.timeout and its tasks
#    rerun elsewhere (this also covers a stage where too few tasks finished for speculation to start).
# Not on local[N]: one executor, nowhere to run a second attempt.
STRAGGLER_DEFAULTS: dict[str, str] = {
    "spark.speculation": "true",
    "spark.speculation.interval": "1s",
    "spark.speculation.multiplier": "4",
    "spark.speculation.quantile": "0.75",
    "spark.speculation.minTaskRuntime": "30s",
    # a killed (losing) attempt whose task does not stop is reaped instead of holding the executor's slot
    "spark.task.reaper.enabled": "true",
    "spark.task.reaper.killTimeout": "120s",
    "spark.task.maxFailures": "4",
}
TIMEOUT_DEFAULTS: dict[str, str] = {
    # an executor silent for this long is lost (Spark's default is 120s; heartbeats every 10s)
    "spark.network.timeout": "120s",
    "spark.executor.heartbeatInterval": "10s",
    # a shuffle fetch from a stalled executor: a few retries, then the map output is recomputed
    "spark.shuffle.io.maxRetries": "3",
    "spark.shuffle.io.retryWait": "5s",
}


# The driver JVM of a local master is the executor too, and it lives for one run. Its JIT is a large
# part of what Spark costs there: at 100k quickstart events the C2 compiler thread took ~20 of the
# JVM's ~56 CPU-s (per-thread CPU from /proc, 2026-12-04; Java Flight Recorder earlier: ~22,000
# compilations, most of them Spark's own planning, Janino, serialization and each query's generated
# classes, compiled again in every run). C1 only (-XX:TieredStopAtLevel=1) skips that: alternated
# pairs at 100k events, 4 pairs: wall -5.4/-6.3/-11.0/-8.8 s, CPU -14.2/-14.9/-21.9/-18.9 s against
# the 3x thresholds used before (-XX:CompileThresholdScaling=3); at 300k events, 2 pairs: wall
# -6.5/-31.4 s, CPU -18.3/-52.0 s. The task threads' steady state is slower under C1 (a warm
# mapInArrow pass 1.6x, measured 2026-12-02), which a much longer local run would pay per row; up to
# 300k events the saved compilation is worth more. Thresholds 10x/30x/100x measured in between or
# worse. Clusters' executors keep the JVM's defaults; a caller's spark.driver.extraJavaOptions
# replaces ours (e.g. to get C2 back for a very long local run).
LOCAL_DRIVER_JIT = "-XX:TieredStopAtLevel=1"

def driver_import_folder() -> str:
    """The first entry of this interpreter's path as a folder ('' is the current one)."""
    return os.path.abspath(sys.path[0] or os.getcwd()) if sys.path else os.getcwd()


# pyspark's Python daemon, importing pyspark from the installed package instead of the zip in it (see there)
LOCAL_DAEMON_MODULE = "datakit.engines.spark_daemon"


def _base_conf(master: str, conf: dict[str, Any] | None) -> dict[str, str]:
    """Our defaults (loopback driver, Arrow on, no console progress bar, straggler handling), then the caller's."""
    cores = os.cpu_count() or 2
    out: dict[str, str] = {
        "spark.app.name": "datakit",
        "spark.master": master,
        "spark.driver.host": "127.0.0.1" if master.startswith(("local", "spark://127.", "spark://localhost")) else "",
        "spark.driver.bindAddress": "127.0.0.1" if master.startswith("local") else "",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.useLargeVarTypes": "false",
        "spark.sql.shuffle.partitions": str(max(2, cores)),
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
        # a Python worker that dies (a crash, or the stall guard ending it: spark_stall.py) leaves its last
        # words in the task's error instead of only "Python worker exited unexpectedly (crashed)"
        "spark.python.worker.faulthandler.enabled": "true",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{_log4j_config('WARN')}",
        "spark.executor.extraJavaOptions": "-Dlog4j2.level=warn",
    }
    if master.startswith("local"):
        out["spark.driver.memory"] = "2g"  # the driver is the executor too; 1g is tight for joins
        out["spark.driver.extraJavaOptions"] += f" {LOCAL_DRIVER_JIT}"
        workers_python = (conf or {}).get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") or sys.executable
        if workers_python == sys.executable:  # its workers run this interpreter, which has datakit
            out["spark.python.daemon.module"] = LOCAL_DAEMON_MODULE
            # and what the local engine's workers start with (datakit/workers.py `start_env`): the malloc (a
            # library on this machine, at this path) and one OpenBLAS thread (a Python worker runs one task on one
            # core); not on local-cluster masters, where executorEnv also reaches the executor JVMs
            if master == "local" or master.startswith("local["):
                from datakit.workers import environment_lock, start_env

                with environment_lock():
                    out.update({f"spark.executorEnv.{k}": v for k, v in start_env(1).items()})
            # the folder this driver imports its own modules from (a script's, or the current one for a
            # notebook), first on the workers' path too, as the local engine's spawned workers get it
            from datakit.engines.spark_daemon import DRIVER_PATH_ENV

            out[f"spark.executorEnv.{DRIVER_PATH_ENV}"] = driver_import_folder()
    else:
        out.update(STRAGGLER_DEFAULTS)
    out.update(TIMEOUT_DEFAULTS)
    out = {k: v for k, v in out.items() if v}
    for k, v in (conf or {}).items():
        out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def submit_defaults() -> dict[str, str]:
    """Inside spark-submit, before the application's context exists: our defaults for the settings the
    operator did not pass (--conf, spark-defaults.conf), e.g. speculation and timeouts on a cluster."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connect to spark-submit's JVM first: a SparkConf made before
    given = SparkConf()  # that sees none of spark-submit's settings (they are the JVM's system properties)
    master = given.get("spark.master", DEFAULT_LOCAL_MASTER)
    wanted = {"spark.sql.execution.arrow.pyspark.enabled": "true",
              "spark.python.worker.faulthandler.enabled": "true",
              "spark.sql.execution.arrow.useLargeVarTypes": "false",
              "spark.sql.session.timeZone": "UTC",
              **({} if master.startswith("local") else STRAGGLER_DEFAULTS), **TIMEOUT_DEFAULTS}
    return {k: v for k, v in wanted.items() if not given.contains(k)}


def _prepare_env(master: str, conf: dict[str, str]) -> None:
    """Environment every Spark process inherits: the interpreter for Python workers, loopback binding.

    `spark.pyspark.python` (e.g. `./environment/bin/python` inside a packed env shipped with
    `spark.archives`) wins, as it does under spark-submit; else PYSPARK_PYTHON; else our own interpreter.
    """
    if conf.get("spark.pyspark.python"):
        os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith(("local", "spark://127.", "spark://localhost")):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def _start_gateway(conf_pairs: dict[str, str], java: str | None = None) -> None:
    """Launch the driver JVM with stdout/stderr going to `log_file()` instead of the terminal.

    `java`: the JVM binary, when the driver's Java options are ours (the user set none): then
    the JVM also gets its class-data archive option (`spark_cds`)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    from datakit.engines import spark_cds

    if SparkContext._gateway is not None:
        return
    jvm_conf = SparkConf(loadDefaults=False)
    for k in ("spark.driver.extraJavaOptions", "spark.driver.memory", "spark.driver.extraClassPath",
              "spark.jars", "spark.jars.packages"):
        if k in conf_pairs:
            jvm_conf.set(k, conf_pairs[k])
    cds = spark_cds.jvm_option(java, conf_pairs) if java else ""
    if cds:
        jvm_conf.set("spark.driver.extraJavaOptions", f"{conf_pairs.get('spark.driver.extraJavaOptions', '')} {cds}".strip())
    prune_driver_logs()
    log = open(log_file(), "ab")  # kept open for the JVM's lifetime
    try:
        gw = launch_gateway(jvm_conf, popen_kwargs={"stdout": log, "stderr": log})
    except Exception as e:
        raise SparkSetupError(f"the Spark driver JVM did not start ({type(e).__name__}); details in {log_file()}") from None
    SparkContext._ensure_initialized(gateway=gw)


def merged_conf(pipeline_block: dict[str, Any] | None, given: dict[str, Any] | None) -> dict[str, Any]:
    """A run's Spark settings: the pipeline file's `spark:` block, under the caller's (--conf, `conf=`).
    A `conf=` that is not a dict is one EngineOptionError (found in a Python API review: a raw TypeError)."""
    from datakit.engines import check_mapping

    return {**(pipeline_block or {}), **check_mapping("conf", given)}


def prestart_session(master: str | None = None, conf: dict[str, Any] | None = None) -> None:
    """Start `get_session(master, conf)` on a background thread and return at once.

    Why: a session costs ~3.5 s of wall time before the first job (at 100k quickstart events: the
    JVM's boot ~1.2 s, the context ~2 s), nearly all of it spent in the JVM, while the driver's
    Python has ~1 s of its own to do first (importing the stages, reading and compiling the
    pipeline). Started before that work the two overlap. `get_session` waits for a pending start,
    then reuses its session (same master and conf) or replaces it (another master, or a setting
    only a new session takes); a start that failed raises its error there, in the caller's thread,
    when the caller asked for the same session. No-op while a start is pending or any Spark context
    runs (ours, a notebook's, spark-submit's: replacing one is `get_session`'s call, not a guess here).
    """
    if master is None and "PYSPARK_GATEWAY_PORT" in os.environ:
        return  # inside spark-submit: its application's context is made where the run asks for it
    with _pending_lock:
        if _pending or _active.get("session") is not None or _context_running():
            return
        # datakit's own modules the start needs are imported here, so the thread imports only pyspark's
        # and never waits on a datakit import lock the main thread holds mid-import (or the reverse)
        from datakit.engines import spark_cds  # noqa: F401

        start = _Start((master, dict(conf or {})))
        _pending["start"] = start
        start.thread.start()


class _Start:
    """One background start: its thread, what it was asked for, and the error it ended with (if any)."""

    def __init__(self, args: tuple[str | None, dict[str, Any]]) -> None:
        self.args = args
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="datakit-spark-start", daemon=True)

    def _run(self) -> None:
        try:
            _session(*self.args)
        except BaseException as e:  # handed to the thread that needs the session (await_prestart)
            self.error = e


def _context_running() -> bool:
    """A SparkContext exists in this process (without importing pyspark when nothing could have made one)."""
    context = sys.modules.get("pyspark.core.context") or sys.modules.get("pyspark.context")
    sc_class = getattr(context, "SparkContext", None)
    return sc_class is not None and sc_class._active_spark_context is not None


def await_prestart(master: str | None = None, conf: dict[str, Any] | None = None, *, check: bool = False) -> None:
    """Wait for a pending `prestart_session`. With `check`, re-raise its error if it was starting the
    session (master, conf) asks for; a failed start of another session is forgotten (the caller's own
    start reports what is wrong with its settings). Never waits while holding `_lock` (the start
    needs it) and is a no-op on the start's own thread."""
    with _pending_lock:
        start = _pending.get("start")
        if start is None or start.thread is threading.current_thread():
            return
        del _pending["start"]
    start.thread.join()
    if check and start.error is not None and start.args == (master, dict(conf or {})):
        raise start.error


def _take_over_on_main_thread(session: Any) -> None:
    """What pyspark does for a context made on the main thread, done for one made by `prestart_session`'s
    thread once the main thread uses it: Ctrl-C cancels the running jobs, then raises KeyboardInterrupt
    (signal handlers can only be set from the main thread; without it a notebook's Ctrl-C would leave its
    jobs running), and the session is this thread's active one (the JVM keeps one per thread)."""
    if not _active.get("off_main") or _active.get("session") is not session \
            or threading.current_thread() is not threading.main_thread():
        return
    sc = session.sparkContext

    def handler(signum: int, frame: Any) -> None:
        try:
            sc.cancelAllJobs()
        finally:
            raise KeyboardInterrupt()

    signal.signal(signal.SIGINT, handler)
    session._jvm.SparkSession.setActiveSession(session._jsparkSession)
    _active.pop("off_main", None)


def require_pyspark() -> None:
    """Refuse the Spark engine in one line where pyspark is not installed (`datakit[spark]`).

    Why: found in a review of the installed wheel (pyspark is an extra): `datakit validate --engine spark`
    and `datakit build-index --engine spark` said "failed unexpectedly (ModuleNotFoundError); this is a bug",
    exit 3, and `datakit run --engine spark` pointed at `make venv`, which an installed package has not."""
    import importlib.util

    from datakit.engines import EngineOptionError

    try:
        missing = importlib.util.find_spec("pyspark") is None
    except ValueError:  # imported already, without a spec (a stub some test harnesses install)
        missing = False
    if missing:
        raise EngineOptionError("the spark engine needs pyspark (Spark 4.1 or newer), which is not installed "
                                "here: pip install 'datakit[spark]'")


def get_session(master: str | None = None, conf: dict[str, Any] | None = None):
    """The process's SparkSession for `master` (default local[2]), started or reused.

    Inside `spark-submit` (a SparkContext already exists and no master is asked
    for) the running session is used as it is: the operator's settings win.
    """
    require_pyspark()
    await_prestart(master, conf, check=True)
    session = _session(master, conf)
    _take_over_on_main_thread(session)
    return session


def _session(master: str | None, conf: dict[str, Any] | None):
    """`get_session` without waiting for a background start (what that start runs)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    with _lock:
        running = SparkContext._active_spark_context
        if master is None and (running is not None or "PYSPARK_GATEWAY_PORT" in os.environ):
            # inside spark-submit (or a notebook's session): the operator's settings win; a session
            # we start here gets our defaults only for what the operator left unset
            with translate_errors("starting Spark"):
                builder = SparkSession.builder
                if running is None:
                    for k, v in submit_defaults().items():
                        builder = builder.config(k, v)
                session = builder.getOrCreate()
            _apply_runtime_conf(session, {"spark.sql.execution.arrow.pyspark.enabled": "true", **(conf or {})})
            return session
        master = master or os.environ.get("DATAKIT_SPARK_MASTER") or DEFAULT_LOCAL_MASTER
        key = (master,)
        if _active.get("key") == key and running is not None:
            session = _active["session"]
            if _apply_runtime_conf(session, conf):
                return session
        check_master(master)
        if running is not None:
            _stop_locked()
        java = check_java()
        pairs = _base_conf(master, conf)
        _prepare_env(master, pairs)
        with translate_errors("starting Spark"):
            from datakit.workers import environment_lock

            with environment_lock():  # the JVM copies os.environ: never mid-way through a pool worker's start
                _start_gateway(pairs, None if "spark.driver.extraJavaOptions" in (conf or {}) else java)
            builder = SparkSession.builder
            for k, v in pairs.items():
                builder = builder.config(k, v)
            session = builder.getOrCreate()
        session.sparkContext.setLogLevel("WARN")
        _active.clear()
        _active.update(key=key, session=session)
        if threading.current_thread() is not threading.main_thread():
            _active["off_main"] = True  # `_take_over_on_main_thread` finishes its set-up
        return session


def straggler_conf(session) -> dict[str, str | None]:
    """The speculation/timeout settings the running application actually has (for the run report:
    inside spark-submit they come from the operator, else from our defaults)."""
    conf = session.sparkContext.getConf()
    return {k: conf.get(k, None) for k in (*STRAGGLER_DEFAULTS, *TIMEOUT_DEFAULTS)}


def _probe_environment(_: int) -> tuple:
    """Runs on an executor: which interpreter, datakit (version, location) and library versions its
    Python workers use."""
    import datakit
    from datakit.io.identity import runtime_versions

    return (sys.executable, datakit.__version__, datakit.__file__, tuple(sorted(runtime_versions().items())))


def executor_environment(session) -> list[dict[str, Any]]:
    """The distinct Python environments of the executors (interpreter, datakit version and location).

    Why: the classic cluster failure is an executor running another environment than the
    driver (a stale wheel on a node, a packed env that was not shipped), which shows up
    much later as a confusing task error or, worse, as different output. One tiny job
    tells: datakit code (a digest of its files, not the version string, which stays the same across
    commits) or a library that shapes bytes differing from the driver's is a one-line
    `SparkSetupError`. Found in review: executors with another pyarrow wrote every Parquet file with
    other bytes under a manifest recording the driver's pyarrow, and a later rerun reused those shards.
    """
    from datakit.io.identity import runtime_versions

    sc = session.sparkContext
    n = max(2, sc.defaultParallelism)
    with translate_errors("checking the executors' Python environment"):
        rows = sorted(set(sc.parallelize(range(n), n).map(_probe_environment).collect()))
    found = [{"python": py, "datakit": ver, "datakit_path": path, "versions": dict(versions)}
             for py, ver, path, versions in rows]
    check_same_environment(runtime_versions(), [f["versions"] for f in found])
    return found


def _differences(driver: dict[str, Any], executors: list[dict[str, Any]]) -> list[str]:
    diffs = []
    for name, mine in driver.items():
        theirs = sorted({str(e.get(name)) for e in executors} - {str(mine)})
        if theirs:
            if name == "datakit code":
                diffs.append("datakit's code (its files differ from this driver's)")
            else:
                diffs.append(f"{name} {', '.join(theirs)} on executors, {mine} here")
    return diffs


_SHIP_HINT = ": ship the same environment to the executors (spark.archives + spark.pyspark.python, see docs/deploy.md)"


def check_same_environment(driver: dict[str, Any], executors: list[dict[str, Any]]) -> None:
    """A `SparkSetupError` naming every difference between the driver's `runtime_versions` and the executors'."""
    diffs = _differences(driver, executors)
    if diffs:
        raise SparkSetupError("the executors' Python environment differs from the driver's: " + "; ".join(diffs)
                              + _SHIP_HINT)


class ExecutorEnvironmentError(RuntimeError):
    """A task ran in a Python worker whose environment is not the driver's (`check_this_worker`)."""


_WORKER_CHECKED: list[dict[str, Any]] = []  # the driver environment this Python worker was found to match


def check_this_worker(expected: dict[str, Any] | None) -> None:
    """In a Spark Python worker, before its first task of a run: `ExecutorEnvironmentError` unless this
    worker's `runtime_versions` are the driver's (`expected`; None: not checked, a local master whose
    workers run the driver's interpreter). Checked once per worker process (~65 ms).

    Why here and not only at start-up: `executor_environment` checks the executors registered when the
    session starts. Found in review: an executor that joined later (a replacement, dynamic allocation,
    YARN/Kubernetes executors arriving after the start) ran another datakit's code, and the run exited 0
    with output that differed from the local engine's. A task on such a worker now fails with this line
    (Spark may retry it on another executor; if every attempt fails, so does the run)."""
    if expected is None or _WORKER_CHECKED == [expected]:
        return
    import socket

    from datakit.io.identity import runtime_versions

    diffs = _differences(expected, [runtime_versions()])
    if diffs:
        raise ExecutorEnvironmentError(f"the Python environment of an executor on {socket.gethostname()} differs "
                                       "from the driver's: " + "; ".join(diffs) + _SHIP_HINT)
    _WORKER_CHECKED[:] = [expected]


class CheckedTask:
    """A task function (`mapInArrow` over an iterator, or `applyInArrow` over a table) that first checks
    its Python worker runs the driver's environment (`check_this_worker`)."""

    def __init__(self, fn: Any, expected: dict[str, Any] | None) -> None:
        self.fn, self.expected = fn, expected

    def __call__(self, arg: Any) -> Any:
        check_this_worker(self.expected)
        return self.fn(arg)


def table_fn(obj: Any) -> Callable[[pa.Table], pa.Table]:
    """A plain annotated function around a callable object (pyspark infers applyInArrow's type from hints)."""

    def apply(table: pa.Table) -> pa.Table:
        return obj(table)

    return apply


def workers_python_differs(session) -> bool:
    """Whether Spark's Python workers run another interpreter than this driver (`spark.pyspark.python`,
    PYSPARK_PYTHON): a local master's workers then have their own libraries too."""
    exe = getattr(session.sparkContext, "pythonExec", None) or sys.executable
    return os.path.realpath(shutil.which(exe) or exe) != os.path.realpath(sys.executable)


def _apply_runtime_conf(session, conf: dict[str, Any] | None) -> bool:
    """Set `conf` on a running session; False when a setting can only take effect on a new one.

    A value Spark refuses (`spark.sql.adaptive.enabled=maybe`) is a `SparkConfError` naming the setting:
    found in review, it was a 119-line traceback and exit 1 ("a check failed")."""
    for k, v in (conf or {}).items():
        v = str(v).lower() if isinstance(v, bool) else str(v)
        try:
            if session.conf.get(str(k), None) == v:
                continue
            session.conf.set(str(k), v)
        except Exception as e:  # a static or core setting (memory, cores): needs a restart
            cause = _conf_cause(str(e))
            if cause is not None:  # the message names the setting (it may not be `k`: a get fails on any bad one)
                raise SparkConfError(f"a Spark setting cannot be used: {cause}") from None
            return False
    return True


# what the JVM says of a setting it cannot take: an invalid value, or two settings that contradict
_CONF_CAUSE = re.compile(r"(?:\[(?:INVALID_CONF_VALUE|INVALID_SPARK_CONFIG)[^\]\n]*\]\s*|"
                         r"java\.lang\.NumberFormatException:\s*|"
                         r"java\.lang\.IllegalArgumentException:\s*(?:requirement failed:\s*)?)([^\n]+)")


def _conf_cause(text: str) -> str | None:
    """The JVM's one-line reason when `text` (a Py4J error) is about a setting's value, else None."""
    m = _CONF_CAUSE.search(text)
    return m.group(1).strip()[:300] if m else None


def stop_session() -> None:
    """Stop the running SparkSession (the JVM gateway stays up for the next session)."""
    await_prestart()  # a session still starting in the background would outlive this stop
    _stop_locked()


def _stop_locked() -> None:
    """`stop_session` without waiting for a background start (what `_session` calls, holding `_lock`)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    with _lock:
        sess = _active.pop("session", None) or SparkSession.getActiveSession()
        _active.clear()
        if sess is not None:
            sess.stop()
        elif SparkContext._active_spark_context is not None:
            SparkContext._active_spark_context.stop()
    redact_log()


_PY_ERR = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))(?::\s?(.*))?$")


def _python_error(m: re.Match[str]) -> str:
    """"Name: message" of a `_PY_ERR` match (the class without its module), the message clipped."""
    name, msg = m.group(1).rsplit(".", 1)[-1], (m.group(2) or "").strip()
    return f"{name}: {msg[:300]}" if msg else name


def summarize(exc: BaseException) -> str:
    """One line for a Spark failure: the innermost Python error if a task raised, else the JVM cause."""
    text = str(exc)
    lines = text.splitlines()
    # a Python exception inside a task: the last "SomethingError: msg" line of the embedded traceback
    for line in reversed(lines):
        m = _PY_ERR.match(line)
        if m and not m.group(1).startswith(("org.", "java.", "py4j.", "scala.")):
            return _python_error(m)
    # a Python worker that died with last words in its fault-handler file (spark_stall.py ends a stuck
    # one so): Spark puts them after "(crashed):" on the line of the job's failure
    crashed = re.search(r"Python worker exited unexpectedly \(crashed\):\s*([^\n]+)", text)
    if crashed and _PY_ERR.match(crashed.group(1)):
        return _python_error(_PY_ERR.match(crashed.group(1)))
    for pat in (r"Job aborted due to stage failure: ([^\n]*)", r"(Could not parse Master URL[^\n]*)",
                r"(All masters are unresponsive[^\n]*)", r"(Lost executor[^\n]*)"):
        m = re.search(pat, text)
        if m:
            return m.group(1)[:300]
    first = next((ln.strip() for ln in lines if ln.strip()), type(exc).__name__)
    return first[:300]


def _append_log(what: str, exc: BaseException) -> None:
    try:
        with open(log_file(), "a", encoding="utf-8", errors="replace") as f:
            f.write(f"\n===== datakit: {what} failed: {type(exc).__name__}\n{exc}\n")
    except OSError:
        pass
    redact_log()


def redact_log() -> None:
    """Rewrite the driver log with personal data and secrets replaced, as every log line is.

    Why: found in review, a stage that failed on a chat record left 4 copies of the customer's email in
    the log the error line points to (Spark's task-failure lines quote the Python exception, which may
    quote a record), where stderr showed `<EMAIL>`. The JVM writes the file through our stdout/stderr
    redirect, which datakit cannot filter line by line, so the file is redacted after a failure (the
    moment a person is sent to read it) and when the session stops. In place: the JVM appends to it
    (O_APPEND), so its next line lands after the redacted text."""
    from datakit.quality.expect import redact_text

    path = log_file()
    try:
        with open(path, "r+b") as f:
            start = _redacted_upto.get(str(path), 0)  # what an earlier call already rewrote
            f.seek(start)
            raw = f.read()
            text = raw.decode("utf-8", errors="replace")
            clean = redact_text(text) if text else text
            if clean != text:
                f.seek(start)
                f.write(clean.encode("utf-8"))
                f.truncate()
            _redacted_upto[str(path)] = f.tell()
    except OSError:
        pass


_redacted_upto: dict[str, int] = {}  # log file -> bytes from its start already redacted


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Turn Py4J/PySpark exceptions raised while `what` into a one-line `SparkJobError`.

    The full JVM/Python trace is appended to `log_file()`; the message says where.
    """
    try:
        yield
    except SparkError:
        raise
    except Exception as e:
        mod = type(e).__module__ or ""
        if not (mod.startswith(("py4j", "pyspark")) or type(e).__name__ in ("Py4JJavaError", "Py4JError")):
            raise
        _append_log(what, e)
        cls = SparkSetupError if what.startswith("starting") else SparkJobError
        cause = _conf_cause(str(e)) if what.startswith("starting") else None
        if cause is not None:  # a setting that can never work: fix it, not retry (found in review: exit 3
            # with "An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext")
            raise SparkConfError(f"Spark cannot start with these settings: {cause} (full log: {log_file()})") from None
        why = summarize(e)
        if why.startswith("InputError: "):  # the input as listed is gone or changed (identity.check_unchanged)
            from datakit.io.fs import InputError

            raise InputError(why[len("InputError: "):]) from None
        if why.startswith("StageError: "):  # the stage that raised names itself (the chain's last one may not be it)
            raise cls(f"Spark failed: {why[len('StageError: '):]} (full log: {log_file()})") from None
        raise cls(f"Spark failed while {what}: {why} (full log: {log_file()})") from None
