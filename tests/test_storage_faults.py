"""Object-store faults (issue 18): a proxy on loopback in front of the moto S3 server fails a share of
the requests with HTTP 503/500. Transient faults are retried inside the IO layer; what still fails is
one line naming the path, exit 3 -- never a traceback, never a `can't pickle` hiding the cause; and a
killed run resumes from its work folder and leaves nothing in the system temp directory."""
from __future__ import annotations

import http.client
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import pytest

from datakit import Pipeline
from datakit.io.dataset import read_output
from datakit.io.sinks import output_checksums
from tests.eventgen import make_event, write_jsonl
from tests.test_object_store import s3_endpoint  # noqa: F401 - the moto server fixture

_ERR = b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected fault</Message></Error>'


class _FaultyProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, target: str, rate: float, seed: int = 0, stall: bool = False) -> None:
        u = urlparse(target)
        self.target, self.rate = (u.hostname, u.port), rate
        self.stall = stall  # a fault is an answer that never comes (a hung endpoint), not an HTTP error
        self.release = threading.Event()
        self.rnd, self.lock = random.Random(seed), threading.Lock()
        self.requests = self.faults = 0
        super().__init__(("127.0.0.1", 0), _Handler)

    def decide(self) -> bool:
        with self.lock:
            self.requests += 1
            fail = self.rnd.random() < self.rate
            self.faults += fail
            return fail


def _read_chunked(f) -> bytes:
    out = b""
    while True:
        size = int(f.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while f.readline() not in (b"\r\n", b"\n", b""):
                pass
            return out
        out += f.read(size)
        f.readline()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _any(self) -> None:
        chunked = self.headers.get("Transfer-Encoding", "").lower() == "chunked"
        n = int(self.headers.get("Content-Length") or 0)
        body = _read_chunked(self.rfile) if chunked else (self.rfile.read(n) if n else b"")
        if self.server.decide():
            if self.server.stall:  # hold the request unanswered until the test ends
                self.server.release.wait(120)
                self.close_connection = True
                return
            status, code = random.choice([(503, b"ServiceUnavailable"), (500, b"InternalError"), (503, b"SlowDown")])
            payload = _ERR % code
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "connection")}
        if chunked:
            headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(*self.server.target, timeout=60)
        conn.request(self.command, self.path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                self.send_header(k, v)
        length = r.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any


@pytest.fixture
def faulty(s3_endpoint, monkeypatch):  # noqa: F811
    """Start a proxy failing `rate` of requests; point every S3 client (and worker) at it."""
    import s3fs

    proxies = []

    def start(rate: float, stall: bool = False) -> _FaultyProxy:
        p = _FaultyProxy(s3_endpoint, rate, stall=stall)
        threading.Thread(target=p.serve_forever, daemon=True).start()
        proxies.append(p)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{p.server_address[1]}")
        s3fs.S3FileSystem.clear_instance_cache()
        return p

    yield start
    for p in proxies:
        p.release.set()
        p.shutdown()
    s3fs.S3FileSystem.clear_instance_cache()


def _bucket_with_logs(s3_endpoint, tmp_path, bucket: str, events: int = 40):  # noqa: F811
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}, skip_instance_cache=True)
    fs.mkdir(bucket)
    for part in range(3):
        local = write_jsonl(tmp_path / f"p{part}.jsonl.zst",
                            [make_event(part * 100 + i) for i in range(events // 3)] + [b"nope"])
        fs.put(str(local), f"{bucket}/raw/p{part}.jsonl.zst")
    return fs


def test_half_the_requests_failing_still_gives_the_right_output(s3_endpoint, faulty, tmp_path):  # noqa: F811
    _bucket_with_logs(s3_endpoint, tmp_path, "half")
    proxy = faulty(0.5)
    p = Pipeline("s3").input("s3://half/raw/*.jsonl.zst").add({"kind": "ingest"}).output("s3://half/out", shards=2)
    res = p.run(workers=2)
    st = res.stage("ingest")
    assert (st["rows_in"], st["rows_out"], st["dropped"]) == (42, 39, {"bad_json": 3})
    assert proxy.faults > 10  # the faults really happened
    assert res.manifest["rows"] == 39


def test_85_percent_faults_fail_in_one_line_naming_the_path(s3_endpoint, faulty, tmp_path):  # noqa: F811
    _bucket_with_logs(s3_endpoint, tmp_path, "worse")
    proxy = faulty(0.85)
    (tmp_path / "p.yaml").write_text("name: s3\ninput: {path: 's3://worse/raw/*.jsonl.zst'}\nstages: [{kind: ingest}]\n"
                                     "output: {path: 's3://worse/out', shards: 2}\n")
    env = dict(os.environ, DATAKIT_STORAGE_RETRIES="3")
    r = subprocess.run([sys.executable, "-m", "datakit.cli", "run", str(tmp_path / "p.yaml"), "--workers", "2"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert proxy.faults > 0
    assert r.returncode == 3, r.stderr[-3000:]
    # stderr holds the log (each retry at INFO: the command logs INFO when stderr is not a terminal)
    # and exactly one error line
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("datakit: error:")]
    assert len(errors) == 1 and errors[0].startswith("datakit: error: storage error: cannot "), r.stderr[-3000:]
    assert "s3://worse/" in errors[0]
    assert "retrying with backoff" in r.stderr
    others = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith(("datakit: error:", "INFO ",
                                                                                      "WARNING "))]
    assert others == [], r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "pickle" not in r.stderr


def _run_cli(tmp_path: Path, bucket: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "p.yaml").write_text(f"name: s3\ninput: {{path: 's3://{bucket}/raw/*.jsonl.zst'}}\n"
                                     f"stages: [{{kind: ingest}}]\noutput: {{path: 's3://{bucket}/out', shards: 2}}\n")
    return subprocess.run([sys.executable, "-m", "datakit.cli", "run", str(tmp_path / "p.yaml"), "--workers", "2"],
                          capture_output=True, text=True, env=dict(os.environ, **env), timeout=600)


def test_requests_a_hung_endpoint_never_answers_time_out_and_are_retried(s3_endpoint, faulty, tmp_path):  # noqa: F811
    """One request in twenty gets no answer at all: each attempt gives up after the storage timeout
    and is retried like a 503, so the run ends with the right output instead of waiting on them."""
    _bucket_with_logs(s3_endpoint, tmp_path, "hung")
    proxy = faulty(0.05, stall=True)
    r = _run_cli(tmp_path, "hung", DATAKIT_STORAGE_TIMEOUT="0.5")
    assert r.returncode == 0, r.stderr[-3000:]
    assert proxy.faults > 0 and "retrying with backoff" in r.stderr
    assert "Timeout" in r.stderr  # the retries name what happened
    assert json.loads(open_s3_json("s3://hung/out/manifest.json"))["rows"] == 39


def test_an_endpoint_that_never_answers_ends_the_run_in_one_line(s3_endpoint, faulty, tmp_path):  # noqa: F811
    """Every request hangs: the run fails after its bounded attempts (botocore's defaults waited
    60 s per attempt, 12 attempts per request, with only watchdog warnings), one line naming the path."""
    _bucket_with_logs(s3_endpoint, tmp_path, "dead")
    faulty(1.0, stall=True)
    t = time.monotonic()
    r = _run_cli(tmp_path, "dead", DATAKIT_STORAGE_TIMEOUT="1", DATAKIT_STORAGE_RETRIES="2")
    took = time.monotonic() - t
    assert r.returncode == 3, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("datakit: error:")]
    assert len(errors) == 1 and errors[0].startswith("datakit: error: storage error: cannot "), r.stderr[-3000:]
    assert "s3://dead/" in errors[0] and "Timeout" in errors[0] and "after up to 2 attempts" in errors[0]
    assert took < 120, took  # bounded by 2 attempts of 1 s (+ start-up), not by 12 of 60 s
    assert "Traceback" not in r.stderr


def open_s3_json(url: str) -> str:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    with fs.open(url, "r") as f:
        return f.read()


# a run over s3://BUCKET/raw/ into argv[1] with argv[2] shards; prints "task ran|reused" per chain task.
# DK_TEST_KILL_AFTER_TASKS=N: SIGKILL itself once N chain tasks are finished (1 worker: tasks run in order).
KILLABLE = textwrap.dedent("""
    import os, signal, sys
    from datakit import Pipeline
    from datakit.engines.local import engine

    real, finished = engine.run_chain, []
    def run_chain(task):
        result = real(task)
        finished.append(result)
        print("task", "reused" if result.get("reused") else "ran", flush=True)
        if os.environ.get("DK_TEST_KILL_AFTER_TASKS") == str(len(finished)):
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    engine.run_chain = run_chain
    if __name__ == "__main__":
        res = (Pipeline("s3").input(f"s3://{sys.argv[1].split('/')[2]}/raw/*.jsonl.zst").add({"kind": "ingest"})
               .add({"kind": "extract"}).output(sys.argv[1], shards=int(sys.argv[2])).run(workers=1))
        print("reused", res.extra["reused_tasks"], res.extra["reused_shards"])
""")


def _empty(folder: Path) -> bool:
    return not folder.exists() or list(folder.iterdir()) == []


def _work_markers(fs, out: str) -> list[str]:
    fs.invalidate_cache()
    return sorted(p for p in fs.find(f"{out}/_work") if p.endswith(".done.json"))


def test_a_killed_s3_run_resumes_on_another_host_from_the_work_folder_under_its_output(s3_endpoint, tmp_path,  # noqa: F811
                                                                                      monkeypatch):
    """Issue 18: an object-store run's work folder was on the local disk of the host that ran it (a fresh
    temp folder before that): a rerun on another host -- a retried batch job on a new machine -- reused
    no finished task. Now each finished task is kept under `<out>/_work/<run id>/` (marker last) until
    the run commits; a rerun from anywhere reuses it, a rerun with another config or input does not."""
    fs = _bucket_with_logs(s3_endpoint, tmp_path, "killed", events=120)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "run.py").write_text(KILLABLE)

    def host(name: str) -> dict:  # another machine: its own home and cache folder, the same bucket
        (tmp_path / name).mkdir()
        return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "TMPDIR": str(tmp),
                "HOME": str(tmp_path / name), "DATAKIT_CACHE_DIR": str(tmp_path / name / "cache")}

    def run(out: str, shards: int, env: dict, kill_after: int | None = None) -> subprocess.CompletedProcess:
        env = {**env, "DK_TEST_KILL_AFTER_TASKS": str(kill_after)} if kill_after else env
        r = subprocess.run([sys.executable, str(tmp_path / "run.py"), out, str(shards)], env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == (-9 if kill_after else 0), r.stderr[-2000:]
        return r

    def tasks(r: subprocess.CompletedProcess) -> list[str]:
        return [ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("task ")]

    a, b, c = host("a"), host("b"), host("c")
    # host a: 11 of the 13 chain tasks finish (ingest's, then one of the sink's: extract > shards), then the
    # process is killed
    assert tasks(run("s3://killed/out", 3, a, kill_after=11)) == ["ran"] * 11
    assert len(_work_markers(fs, "killed/out")) == 11  # finished tasks, under the output prefix
    assert list(tmp.iterdir()) == []  # nothing in the system temp directory, even after SIGKILL
    # another config into the same folder (host c): must not reuse them (killed after its first task)
    assert tasks(run("s3://killed/out", 2, c, kill_after=1)) == ["ran"]
    # host b, same command: reuses the finished tasks (counted in the run report), runs the other two
    rerun = run("s3://killed/out", 3, b)
    assert tasks(rerun) == ["reused"] * 11 + ["ran"] * 2, rerun.stdout + rerun.stderr[-4000:]
    assert rerun.stdout.split()[-3:] == ["reused", "11", "0"]
    assert json.loads(fs.cat_file("killed/out/_run.json"))["resume"]["reused_tasks"] == 11
    assert not [p for p in fs.find("killed/out") if "_work" in p or "/." in p]  # committed: nothing temporary
    assert list(tmp.iterdir()) == [] and _empty(tmp_path / "b" / "cache" / "work")
    # the resumed output is the one an uninterrupted run writes (here, on host a)
    monkeypatch.setenv("DATAKIT_CACHE_DIR", a["DATAKIT_CACHE_DIR"])
    clean = (Pipeline("s3").input("s3://killed/raw/*.jsonl.zst").add({"kind": "ingest"}).add({"kind": "extract"})
             .output("s3://killed/clean", shards=3).run(workers=1))
    assert clean.extra["reused_tasks"] == 0
    assert output_checksums("s3://killed/out") == output_checksums("s3://killed/clean")
    assert _empty(tmp_path / "a" / "cache" / "work")  # host a's scratch of the killed run: swept


def test_a_changed_input_file_reuses_no_finished_task_of_a_killed_s3_run(s3_endpoint, tmp_path, monkeypatch):  # noqa: F811
    """The durable work folder is keyed by the input files' sizes and mtimes too: after a kill, an input
    file that changed means a rerun from scratch (its rows would otherwise mix with the old file's)."""
    fs = _bucket_with_logs(s3_endpoint, tmp_path, "changed", events=60)
    (tmp_path / "run.py").write_text(KILLABLE)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "DATAKIT_CACHE_DIR": str(tmp_path / "cache"), "DK_TEST_KILL_AFTER_TASKS": "2"}
    killed = subprocess.run([sys.executable, str(tmp_path / "run.py"), "s3://changed/out", "2"], env=env,
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert len(_work_markers(fs, "changed/out")) == 2
    local = write_jsonl(tmp_path / "new.jsonl.zst", [make_event(900 + i) for i in range(5)])
    fs.put(str(local), "changed/raw/p0.jsonl.zst")  # the first (already finished) task's file changed
    monkeypatch.setenv("DATAKIT_CACHE_DIR", str(tmp_path / "rerun-cache"))
    res = (Pipeline("s3").input("s3://changed/raw/*.jsonl.zst").add({"kind": "ingest"}).add({"kind": "extract"})
           .output("s3://changed/out", shards=2).run(workers=1))
    assert res.extra["reused_tasks"] == 0
    assert res.stage("ingest")["rows_in"] == 5 + 2 * 21  # the new file read, not the old one's part
    assert _work_markers(fs, "changed/out") == []
    # readers go through the manifest: a work folder left over (say its removal failed) is never read
    fs.put(str(tmp_path / "new.jsonl.zst"), "changed/out/_work/0123456789abcdef/n001/part-00000.parquet")
    assert read_output("s3://changed/out").num_rows == res.manifest["rows"]


def test_a_failed_s3_run_keeps_its_finished_tasks_under_the_output_and_no_local_scratch(s3_endpoint, tmp_path,  # noqa: F811
                                                                                        monkeypatch):
    """A run that fails (not killed) removes its local scratch copy at once; its finished tasks wait under
    the output prefix, and the rerun (here from another cache folder) reuses every one of them."""
    from datakit.io import sinks

    fs = _bucket_with_logs(s3_endpoint, tmp_path, "failed", events=30)
    monkeypatch.setenv("DATAKIT_CACHE_DIR", str(tmp_path / "cache"))
    real = sinks.write_ordered_shard  # what every path that writes a shard calls last

    def disk_full(*args, **kwargs):
        raise RuntimeError("injected: disk full")

    monkeypatch.setattr(sinks, "write_ordered_shard", disk_full)
    pipeline = Pipeline("s3").input("s3://failed/raw/*.jsonl.zst").add({"kind": "ingest"}).output("s3://failed/out",
                                                                                                  shards=2)
    with pytest.raises(RuntimeError, match="injected: disk full"):
        pipeline.run(workers=1)
    assert _empty(tmp_path / "cache" / "work")
    assert len(_work_markers(fs, "failed/out")) == 13  # every chain task finished before the shards
    monkeypatch.setattr(sinks, "write_ordered_shard", real)
    monkeypatch.setenv("DATAKIT_CACHE_DIR", str(tmp_path / "other-cache"))
    res = pipeline.run(workers=1)
    assert res.extra["reused_tasks"] == 13 and res.stage("ingest")["rows_in"] == 33
    assert _work_markers(fs, "failed/out") == [] and _empty(tmp_path / "other-cache" / "work")


class _Unpicklable(Exception):
    """Like aiohttp's errors, which carry a `multidict` of headers: cannot cross a process boundary."""

    def __init__(self) -> None:
        super().__init__("upstream said no")
        self.lock = threading.Lock()


def _raise_unpicklable(item):
    raise _Unpicklable()


def _raise_connection_reset(item):
    raise ConnectionResetError(104, "Connection reset by peer")


def test_worker_errors_reach_the_parent_intact():
    """The pool used to report "cannot pickle ..." instead of the worker's error; a storage error
    is one line naming the task's path."""
    from datakit.engines.local.scheduler import EngineError, _Guarded
    from datakit.io.storage import StorageError
    from datakit.workers import drop_pool, pool

    try:
        with pytest.raises(EngineError, match="_Unpicklable: upstream said no"):
            pool(2).submit(_Guarded(_raise_unpicklable), "x").result()
        with pytest.raises(StorageError, match=r"^storage error: cannot read or write s3://b/k\.jsonl: "
                                               r"ConnectionResetError.*attempts\)$"):
            pool(2).submit(_Guarded(_raise_connection_reset), "s3://b/k.jsonl").result()
    finally:
        drop_pool(2)


def test_a_storage_error_says_it_was_retried_only_when_it_was():
    """A refusal (no credentials, access denied, no such bucket) fails on its first attempt; its line
    said "(after up to 12 attempts)" all the same. Only a transient fault names the attempts."""
    from botocore.exceptions import ClientError, NoCredentialsError

    from datakit.io.storage import describe, retries

    def client_error(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                           "GetObject")

    attempts = f"(after up to {retries()} attempts)"
    for refused in (NoCredentialsError(), client_error("AccessDenied", 403), client_error("NoSuchBucket", 404)):
        line = str(describe(refused, "s3://b/k.jsonl", "read"))
        assert line.startswith("storage error: cannot read s3://b/k.jsonl: ") and "attempts" not in line, line
    for transient in (client_error("ServiceUnavailable", 503), client_error("SlowDown", 503), ConnectionResetError(104, "reset")):
        assert str(describe(transient, "s3://b/k.jsonl", "read")).endswith(attempts)
    wrapped = OSError("read failed")
    wrapped.__cause__ = client_error("InternalError", 500)  # s3fs re-raises the last attempt's error
    assert str(describe(wrapped, "s3://b/k.jsonl")).endswith(attempts)
    assert "attempts" not in str(describe(ConnectionResetError(104, "reset"), "/data/k.jsonl"))  # local: never retried


def test_retries_s3fs_makes_on_its_own_are_logged_and_its_debug_lines_stay_hidden(caplog, monkeypatch):
    """s3fs retries throttling (SlowDown) without asking our handler and logs it only at DEBUG: each
    such retry is logged at INFO like the handler's, and nothing else of s3fs's DEBUG output shows."""
    import asyncio
    import logging

    import s3fs.core
    from botocore.exceptions import ClientError

    from datakit.io import storage

    # this process may have run a `--quiet` command before (datakit's logger at WARNING) or set up s3fs already
    monkeypatch.setattr(logging.getLogger("s3fs"), "level", logging.NOTSET)
    caplog.set_level(logging.INFO, logger="datakit")
    storage.install()
    calls = []

    async def throttled_twice():
        calls.append(1)
        if len(calls) <= 2:
            raise ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
                               "ResponseMetadata": {"HTTPStatusCode": 503}}, "ListObjectsV2")
        return "listed"

    caplog.set_level(logging.INFO)
    assert asyncio.run(s3fs.core._error_wrapper(throttled_twice, retries=3)) == "listed"
    retried = [r for r in caplog.records if "retrying with backoff" in r.getMessage()]
    assert len(retried) == 2 and all(r.name == "datakit.io.storage" for r in retried)
    assert "SlowDown (HTTP 503)" in retried[0].getMessage()
    logging.getLogger("s3fs").debug("CALL: list_objects_v2 - secret-ish detail")
    assert not [r for r in caplog.records if r.name.startswith("s3fs")]  # DEBUG lines stay below the root's level


def _disk_full(task):
    raise OSError(28, "No space left on device")


def test_a_full_disk_names_the_folder_written_to_not_the_input():
    """A full disk during a task named the task's *input* file (an operator went looking for a broken
    input; found in review), and polars' ComputeError for it was a traceback: both are one line
    saying the device is full, naming the folder written to."""
    import polars as pl

    from datakit.engines.local.chain import ChainTask
    from datakit.engines.local.scheduler import _Guarded
    from datakit.engines.local.spill import Partition
    from datakit.io import storage

    task = ChainTask(Partition("jsonl", "/data/in/part-0.jsonl.zst"), [], "/out/_work/r1/n001", "part-00000",
                     [], scratch="/out/_work/r1")
    with pytest.raises(storage.StorageError) as e:
        _Guarded(_disk_full)(task)
    assert str(e.value).startswith("storage error: no space left on the device to write under /out/_work/r1: ")
    assert "/data/in" not in str(e.value)
    polars_error = pl.exceptions.ComputeError("parquet: File out of specification: underlying IO error: "
                                              "No space left on device (os error 28)")
    assert storage.is_disk_full(polars_error) and storage.is_storage_error(polars_error)
    assert not storage.is_disk_full(OSError(5, "Input/output error"))


def test_a_full_disk_after_the_commit_keeps_the_run_successful(tmp_path, monkeypatch, caplog):
    """The report page and the run timing are written after the commit; a full disk there made the
    command exit 3 with the dataset already published (found in review), and a scheduler retrying on
    3 first retracted it. Now each is a warning naming what is missing and the data stays published."""
    import logging

    import datakit.quality.report as report
    import datakit.run_timing as run_timing

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    logs = write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(20)])
    monkeypatch.setattr(report, "write_report", full)
    monkeypatch.setattr(run_timing, "record", full)
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="datakit.pipeline"):
        res = Pipeline("p").input(str(logs)).add({"kind": "ingest"}).output(str(out), shards=2).run(workers=1,
                                                                                                     report=True)
    assert res.manifest["rows"] == 20 and (out / "_SUCCESS").exists()
    assert res.extra["report"] is None and res.extra["timing"] is None
    warned = [r.getMessage() for r in caplog.records if "is committed, but" in r.getMessage()]
    assert len(warned) == 2 and any("_report.html" in w for w in warned) and any("_run.json" in w for w in warned)
