"""A real cluster the way users deploy to one: standalone master + two workers on 127.0.0.1 whose
executors run only a packed virtualenv (venv-pack, shipped with --archives), input and output on
an S3 API (moto on loopback), the job submitted with spark-submit of examples/spark_driver.py.

Follows docs/deploy.md ("Standalone, YARN: a packed virtualenv") step by step:
examples/pack_venv.sh packs the environment, examples/spark_submit_packed.sh submits.
Then: a killed driver, and its rerun with a stalled executor (SIGSTOP, not dead).

The cluster is the one tests/spark_fixtures.py starts for every cluster test of tests/engines; each
application (spark-submit) unpacks the ~1 GB environment on the driver and on both executors, so the
module keeps to three applications.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.packaging_env import RECORDS, RECORDS_STAGES, ROOT, clean_env, make_venv
from tests.spark_fixtures import kill_group, scratch_env
from tests.test_object_store import s3_endpoint  # noqa: F401  (module fixture: moto on loopback)

# a cluster, a packed env and spark-submit runs: minutes on 2 cores, many more on a loaded machine
pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(2400)]

# The byte-for-byte test runs every stage of the records pipeline (scrub_pii with NER, MinHash dedup,
# decontamination, tokenize) on the executors; tests/test_wheel.py runs the feedback stages too.
FULL = RECORDS.format(logs="s3://logs/raw", optouts="s3://logs/optouts.parquet").replace(
    '"out/records"', '"s3://out/unused"').replace("shards: 2", "shards: 3")
# The killed-driver / stalled-executor test is about recovery, not stage coverage: a shorter pipeline
# keeps its two runs on the cluster within minutes.
SHORT = """\
name: packed-cluster-short
seed: 4
input: {path: "s3://logs/raw/dt=*/*.jsonl.*", format: jsonl, schema: editor_event.v1}
stages:
  - {kind: ingest}
  - {kind: consent, optouts: "s3://logs/optouts.parquet"}
  - {kind: extract, kinds: [code, fim, sft, preference]}
  - {kind: dedup, exact: true}
  - {kind: tokenize, tokenizer: "datakit:demo-bpe", seq_len: 512, packing: best_fit}
output: {path: "s3://out/unused", format: packed, shards: 3}
"""
EXECUTOR_CONF = "--conf spark.executor.cores=1 --conf spark.cores.max=2"
S3_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")
# Disk at the peak: the archive, and per application its copies and unpacked trees on the driver and on each
# executor (~1.6 GB each), a third executor's when the stalled one is replaced. 8.0 GB measured (2026-12-07,
# `df` sampled every 5 s over this module); everything is given back after each test (`_give_back_disk`).
DISK_NEEDED_GB = 9
_SUBMITTED: list[subprocess.Popen] = []  # every spark-submit we started: killed (whole group) at teardown


@pytest.fixture(scope="module")
def deploy(tmp_path_factory, s3_endpoint, wheel_dists, user_venv):  # noqa: F811
    """Everything docs/deploy.md builds: the wheel (shared with tests/test_wheel.py), a driver venv,
    the packed executor env, the data on S3, and the local engine's reference outputs."""
    import s3fs

    from datakit import Pipeline
    from tests.engines.test_spark_conformance import make_logs

    root = tmp_path_factory.mktemp("deploy")
    free_gb = shutil.disk_usage(root).free / 2**30
    if free_gb < DISK_NEEDED_GB:  # one clear line, instead of every later test failing on a full disk
        pytest.fail(f"the packed-cluster tests need ~{DISK_NEEDED_GB} GB free under {root.parent} at their peak; "
                    f"{free_gb:.1f} GB are", pytrace=False)
    wheel, _ = wheel_dists
    driver_py = user_venv  # the submitting machine: datakit from the wheel
    env_dir = root / "datakit-env"
    t0 = time.monotonic()
    make_venv(env_dir, wheel, deps="copy")  # offline stand-in for `pip install datakit-*.whl[s3]` + a spaCy model
    archive = root / "datakit-env.tar.gz"
    res = subprocess.run(["bash", str(ROOT / "examples" / "pack_venv.sh"), str(archive), str(env_dir)],
                         capture_output=True, text=True, timeout=1800,
                         env=clean_env(VENV_PACK=str(Path(sys.executable).parent / "venv-pack"), COMPRESS_LEVEL="1"))
    assert res.returncode == 0, res.stderr[-3000:]
    pack_seconds = time.monotonic() - t0

    logs = make_logs(root, events=100)
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("logs")
    fs.mkdir("out")
    for f in sorted(logs.rglob("*")):
        if f.is_file() and f.name != "_ground_truth.jsonl":
            rel = f.relative_to(logs).as_posix()
            fs.put(str(f), f"logs/{'optouts.parquet' if rel == 'optouts.parquet' else 'raw/' + rel}")
    work = root / "job"
    work.mkdir()
    (work / "full.yaml").write_text(FULL)
    (work / "short.yaml").write_text(SHORT)
    # the references: the local engine (this checkout, in-process) over the same S3 input; a work folder
    # of this fixture's own: under xdist the fixture may run on both workers at once, and the default
    # scratch folder of an object-store output is keyed on the run id alone (the same on both)
    for name in ("full", "short"):
        Pipeline.from_yaml(work / f"{name}.yaml").run(engine="local", workers=1, output=f"s3://out/local-{name}",
                                                      work_dir=str(root / f"local-work-{name}"))
    yield {"root": root, "driver_py": driver_py, "archive": archive, "work": work, "fs": fs,
           "pack_seconds": pack_seconds, "archive_mb": archive.stat().st_size / 1e6}
    # ~1.6 GB (the archive, and the env where it could not be hard-linked): not kept past the module
    shutil.rmtree(env_dir, ignore_errors=True)
    archive.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def packed_cluster(deploy, shared_cluster):
    """The shared standalone cluster (tests/spark_fixtures.py): two 1-core workers whose daemons (and so
    executors) have no PYTHONPATH and no usable default Python."""
    try:
        yield shared_cluster
    finally:
        _end_drivers()


@pytest.fixture(autouse=True)
def _give_back_disk(packed_cluster):
    """After each test: its drivers' scratch and the ended applications' unpacked environments go (each
    application unpacks ~1.2 GB per executor and on the driver; see SparkCluster.sweep)."""
    yield
    _end_drivers()
    packed_cluster.sweep()


def _end_drivers() -> None:
    """Kill what is left of every driver started here (its JVM, its Python), then delete its scratch folder."""
    while _SUBMITTED:
        proc = _SUBMITTED.pop()
        kill_group(proc)
        shutil.rmtree(proc.scratch, ignore_errors=True)  # type: ignore[attr-defined]


def _driver_env(deploy, scratch: Path) -> dict[str, str]:
    """The driver's log folder inside the test's folder, and its temp folders in `scratch`, a folder of its
    own that `_end_drivers` deletes: a killed driver cannot remove its checkpoint folder (`spark-checkpoints-*`
    in the temp dir for an object-store output), and spark-submit's JVM leaves a copy of the archive (~400 MB)
    in java.io.tmpdir and, in client mode, the archive unpacked (~1.2 GB) under SPARK_LOCAL_DIRS."""
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    env = scratch_env({"JAVA_TOOL_OPTIONS": os.environ.get("JAVA_TOOL_OPTIONS", "")}, scratch)
    return {**env, "DATAKIT_SPARK_LOG_DIR": str(deploy["root"] / "driver-logs"), "TMPDIR": str(scratch / "tmp")}


def _scratch(deploy) -> Path:
    return deploy["root"] / f"driver-{time.monotonic_ns()}"


def _s3_conf() -> list[str]:
    """The S3 endpoint and credentials (moto's, from the environment) for the executors, as the application's
    settings: the shared cluster's daemons started before the S3 server, so executors do not inherit them."""
    return [f"spark.executorEnv.{k}={os.environ[k]}" for k in S3_ENV if os.environ.get(k)]


def _submit(deploy, cluster, output: str, extra_conf: str = "", pipeline: str = "short.yaml",
            **popen) -> subprocess.Popen:
    conf = " ".join([EXECUTOR_CONF, *(f"--conf {c}" for c in _s3_conf()), extra_conf]).strip()
    scratch = _scratch(deploy)
    env = clean_env(PYSPARK_DRIVER_PYTHON=str(deploy["driver_py"]), EXECUTOR_MEMORY="512m",
                    SPARK_CONF_EXTRA=conf, **_driver_env(deploy, scratch))
    # Spark's log goes to a file: a pipe nobody reads while the test polls would fill up and block the driver
    err = open(deploy["root"] / f"submit-{output.rsplit('/', 1)[-1]}-{time.monotonic_ns()}.log", "w+")
    proc = subprocess.Popen(["bash", str(ROOT / "examples" / "spark_submit_packed.sh"), str(deploy["archive"]),
                             cluster.master_url, pipeline, "--output", output, "--partitions", "4"],
                            cwd=deploy["work"], env=env, stdout=subprocess.PIPE, stderr=err,
                            text=True, start_new_session=True, **popen)
    proc.err_file = err  # type: ignore[attr-defined]
    proc.scratch = scratch  # type: ignore[attr-defined]
    _SUBMITTED.append(proc)
    return proc


def _finish(proc: subprocess.Popen, timeout: float) -> dict:
    out, _ = proc.communicate(timeout=timeout)
    proc.err_file.seek(0)  # type: ignore[attr-defined]
    err = proc.stderr_text = proc.err_file.read()  # type: ignore[attr-defined]
    assert proc.returncode == 0, f"spark-submit exited {proc.returncode}\n{out[-2000:]}\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


def _checksums(fs, path: str) -> dict:
    fs.invalidate_cache()
    m = json.loads(fs.cat_file(f"{path}/manifest.json"))
    return {f: s["sha256"][f] for s in m["shards"] for f in s["files"]}


def _counts(fs, path: str) -> list:
    return [(s["name"], s["rows_in"], s["rows_out"], s["dropped"])
            for s in json.loads(fs.cat_file(f"{path}/_run.json"))["stages"]]


def test_packed_env_on_a_standalone_cluster_matches_local_byte_for_byte(deploy, packed_cluster):
    t0 = time.monotonic()
    info = _finish(_submit(deploy, packed_cluster, "s3://out/cluster", pipeline="full.yaml"), timeout=1800)
    print(f"\npacked env: {deploy['archive_mb']:.0f} MB, made and packed in {deploy['pack_seconds']:.0f}s; "
          f"full pipeline on the cluster {time.monotonic() - t0:.0f}s")
    fs = deploy["fs"]
    assert _checksums(fs, "out/cluster") == _checksums(fs, "out/local-full")
    assert _counts(fs, "out/cluster") == _counts(fs, "out/local-full")
    assert [c[0] for c in _counts(fs, "out/cluster")] == RECORDS_STAGES  # every records stage, NER on
    for side in ("_quarantine/part-00000.parquet", "_dropped/part-00000.parquet"):
        a, b = f"out/cluster/{side}", f"out/local-full/{side}"
        assert fs.exists(a) == fs.exists(b) and (not fs.exists(a) or fs.cat_file(a) == fs.cat_file(b)), side
    env = json.dumps(json.loads(fs.cat_file("out/cluster/manifest.json"))["environment"])
    assert "core_web" in env  # scrub_pii's NER model, loaded on the executors from the packed env
    # inside spark-submit the session got datakit's straggler defaults for what the operator left unset
    assert info["straggler_conf"]["spark.speculation"] == "true"
    assert info["straggler_conf"]["spark.speculation.minTaskRuntime"] == "30s"
    # every executor's Python came from the unpacked archive, and datakit from the wheel inside it
    envs = info["executors"]
    assert envs, info
    for e in envs:
        assert "/environment/" in e["python"] or "/environment/" in e["datakit_path"], e
        assert "/site-packages/datakit/" in e["datakit_path"], e
        assert not Path(e["datakit_path"]).is_relative_to(ROOT), e
        assert "/.venv/" not in e["datakit_path"], e
    # ... on both workers (each unpacked its own copy)
    unpacked = list(packed_cluster.workdir.glob("work-*/app-*/*/environment/pyvenv.cfg"))
    assert {p.parts[-5] for p in unpacked} == {"work-0", "work-1"}, unpacked


def _tree(pid: int) -> list:
    import psutil

    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def _runs_python(pid: int) -> bool:
    import psutil

    for c in _tree(pid)[1:]:
        try:
            if "python" in " ".join(c.cmdline()):
                return True
        except psutil.Error:
            continue
    return False


def _stall_one_busy_executor(cluster, proc: subprocess.Popen, stopped: list, stale: set) -> int:
    """Once both executors of `proc`'s application are up (pids in `stale` belong to an earlier one) and one has
    started Python work, SIGSTOP that executor JVM and its Python workers (a stuck node: alive, silent) for the
    rest of the job; returns its pid."""
    end = time.monotonic() + 600
    while time.monotonic() < end and proc.poll() is None:
        pids = [p for p in cluster.executor_pids() if p not in stale]
        busy = [p for p in pids if _runs_python(p)]
        if len(pids) == 2 and busy:
            for p in _tree(busy[0]):
                p.send_signal(signal.SIGSTOP)
                stopped.append(p)
            return busy[0]
        time.sleep(0.3)
    raise AssertionError("no executor started Python work")


def test_killed_driver_then_a_stalled_executor_rerun_resumes_with_identical_output(deploy, packed_cluster):
    """Two faults of the short pipeline on one cluster, in one test (it used to be two, each with a full
    clean run of its own: test_stalled_executor_is_overtaken_and_output_is_identical and
    test_rerun_after_a_killed_driver_resumes_from_committed_shards; every assertion of both is here).

    1. `datakit run --engine spark` with the archive as settings (the other documented way to submit) is
       killed (its Python and its JVM) once executors have committed a shard but before the manifest.
    2. The rerun with spark-submit: once both executors run, one is SIGSTOPped (alive, silent) for the rest
       of the job. The session defaults (speculation, heartbeat timeout) must finish the job on the other
       executor; the stalled attempts' shards can never mix with the winners' (same bytes, atomic per-file
       commit); the committed shards of the killed run are reused; the output is the local engine's, byte
       for byte. spark.network.timeout is lowered to 30s only to keep CI time down (default 120s).
    """
    fs = deploy["fs"]
    archive = deploy["archive"]
    args = [str(deploy["driver_py"].parent / "datakit"), "run", "short.yaml", "--engine", "spark",
            "--master", packed_cluster.master_url, "--partitions", "4", "--output", "s3://out/resume",
            "--conf", f"spark.archives={archive}#environment", "--conf", "spark.pyspark.python=./environment/bin/python",
            "--conf", "spark.executor.memory=512m", *[a for c in EXECUTOR_CONF.split("--conf ")[1:] for a in ("--conf", c.strip())],
            *[a for c in _s3_conf() for a in ("--conf", c)]]
    first_log = open(deploy["root"] / f"run-killed-{time.monotonic_ns()}.log", "w+")
    scratch = _scratch(deploy)
    first = subprocess.Popen(args, cwd=deploy["work"], stdout=first_log, stderr=subprocess.STDOUT, text=True,
                             env=clean_env(deploy["driver_py"].parent.parent, **_driver_env(deploy, scratch)),
                             start_new_session=True)
    first.scratch = scratch  # type: ignore[attr-defined]
    _SUBMITTED.append(first)
    killed_with = None
    try:
        end = time.monotonic() + 1800
        while time.monotonic() < end and first.poll() is None:
            fs.invalidate_cache()
            done = fs.glob("out/resume/_shards/shard-*.json")
            if done:
                killed_with = len(done)
                os.killpg(first.pid, signal.SIGKILL)
                break
            time.sleep(0.2)
    finally:
        kill_group(first)
    first_log.seek(0)
    assert killed_with, f"no shard was committed before the driver finished\n{first_log.read()[-3000:]}"
    fs.invalidate_cache()
    interrupted = not fs.exists("out/resume/manifest.json")  # else the driver committed before the kill landed
    # the killed driver's executors outlive it until the master notices: the executor stalled below must be
    # one of the rerun's (a first version of this test stalled a leftover one and saw no stall at all)
    end = time.monotonic() + 180
    while packed_cluster.executor_pids() and time.monotonic() < end:
        time.sleep(0.5)
    stale = set(packed_cluster.executor_pids())
    _end_drivers()  # the killed driver's scratch, and its application's unpacked environments, before the rerun
    packed_cluster.sweep()

    proc = _submit(deploy, packed_cluster, "s3://out/resume",
                   extra_conf="--conf spark.network.timeout=30s --conf spark.network.timeoutInterval=10s "
                              "--conf spark.executor.heartbeatInterval=5s")
    stopped: list = []
    try:
        victim = _stall_one_busy_executor(packed_cluster, proc, stopped, stale)
        info = _finish(proc, timeout=1800)
    finally:
        for p in stopped:
            try:
                p.send_signal(signal.SIGCONT)
            except Exception:
                pass
        kill_group(proc)
    assert info["rows"] > 0
    log = proc.stderr_text if hasattr(proc, "stderr_text") else ""
    print(f"\nkilled driver after {killed_with} committed shard(s); stalled executor {victim} in the rerun: job done; "
          f"driver log: {log.count('as speculatable')} tasks speculated, {log.count('Lost executor')} lost-executor lines")
    assert info["straggler_conf"]["spark.network.timeout"] == "30s"  # the operator's --conf wins
    # the stall was felt: a task on the stalled executor was speculated, or the executor was declared lost
    assert log.count("as speculatable") + log.count("Lost executor") > 0, log[-3000:]
    assert _checksums(fs, "out/resume") == _checksums(fs, "out/local-short")
    assert _counts(fs, "out/resume") == _counts(fs, "out/local-short")
    fs.invalidate_cache()
    assert info["reused_shards"] >= killed_with
    assert json.loads(fs.cat_file("out/resume/_run.json"))["output"]["reused_shards"] >= killed_with
    if not interrupted:
        pytest.skip("the killed driver had committed its manifest before the kill landed (too fast to interrupt): "
                    "the stalled-executor rerun passed, resuming an unfinished run was not exercised")
