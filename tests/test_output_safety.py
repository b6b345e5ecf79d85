"""Safe output folders (issue #18 item 2): one writer at a time, never a readable mix, no debris.

The kill and concurrency tests use real subprocesses: one is SIGKILLed right after it rewrote
its first shard, the other holds the folder while a second run tries to write it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from datakit import Pipeline
from datakit.cli import app
from datakit.io import publish
from datakit.io.dataset import read_output
from datakit.io.fs import InputError
from datakit.io.sinks import output_checksums
from tests.eventgen import make_event, write_jsonl
from tests.test_object_store import s3_endpoint  # noqa: F401 - the moto server fixture

ROOT = Path(__file__).resolve().parent.parent

# runs a pipeline over argv[1] into argv[2]; DK_TEST_KILL_AFTER_SHARD: SIGKILL itself after that shard
# is written; DK_TEST_HOLD: write a "started" file, then wait for a "go" file before writing shards
SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from datakit import Pipeline
    from datakit.io import sinks

    real = sinks.write_ordered_shard  # what every path that writes a shard calls last
    def write_ordered_shard(table, shard, spec):
        hold = os.environ.get("DK_TEST_HOLD")
        if hold:
            Path(hold, "started").touch()
            while not Path(hold, "go").exists():
                time.sleep(0.05)
        info = real(table, shard, spec)
        if os.environ.get("DK_TEST_KILL_AFTER_SHARD") == str(shard):
            os.kill(os.getpid(), signal.SIGKILL)
        return info
    sinks.write_ordered_shard = write_ordered_shard
    if __name__ == "__main__":
        Pipeline("safe").input(sys.argv[1]).add({"kind": "ingest"}).output(sys.argv[2], shards=3).run(workers=1)
""")


def _logs(folder: Path, start: int, n: int = 30, bad: bool = True) -> Path:
    lines = [make_event(start + i) for i in range(n)] + ([b"{broken"] if bad else [])
    write_jsonl(folder / "part-0.jsonl", lines)
    return folder


def _pipe(logs: Path, out: Path) -> Pipeline:
    return Pipeline("safe").input(str(logs)).add({"kind": "ingest"}).output(str(out), shards=3)


def _script(tmp_path: Path) -> Path:
    f = tmp_path / "run_safe.py"
    f.write_text(SCRIPT)
    return f


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def test_kill_during_overwrite_never_leaves_a_readable_mix(tmp_path):
    out = tmp_path / "out"
    old_logs, new_logs = _logs(tmp_path / "old", 0), _logs(tmp_path / "new", 500)
    _pipe(old_logs, out).run(workers=1)
    assert read_output(str(out)).num_rows == 30
    proc = subprocess.run([sys.executable, str(_script(tmp_path)), str(new_logs), str(out)],
                          env=_env(DK_TEST_KILL_AFTER_SHARD="0"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr  # killed after rewriting shard 0 of 3
    # the old manifest went before the first new shard: no reader takes new shards for the old dataset
    assert not (out / "manifest.json").exists() and not (out / "_SUCCESS").exists()
    with pytest.raises(InputError, match="no committed dataset"):
        read_output(str(out))
    r = CliRunner().invoke(app, ["inspect", str(out)])
    assert r.exit_code == 2
    # the rerun finishes the job, reusing the shard the killed run completed
    res = _pipe(new_logs, out).run(workers=1)
    assert res.extra["reused_shards"] == 1
    _pipe(new_logs, tmp_path / "fresh").run(workers=1)
    assert output_checksums(str(out)) == output_checksums(str(tmp_path / "fresh"))
    assert sorted(read_output(str(out), verify=True).column("event_id").to_pylist()) == \
        sorted(read_output(str(tmp_path / "fresh")).column("event_id").to_pylist())


def test_second_writer_fails_in_one_line_while_the_first_finishes(tmp_path):
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.mkdir()
    logs = _logs(tmp_path / "logs", 0)
    first = subprocess.Popen([sys.executable, str(_script(tmp_path)), str(logs), str(out)],
                             env=_env(DK_TEST_HOLD=str(hold)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        for _ in range(1200):  # wait (up to a minute) until the first run is inside its shard writes
            if (hold / "started").exists() or first.poll() is not None:
                break
            time.sleep(0.05)
        assert (hold / "started").exists(), first.stderr.read() if first.poll() is not None else "not started"
        (tmp_path / "p.yaml").write_text(
            f"name: safe\ninput: {{path: {_logs(tmp_path / 'other', 900)}}}\nstages: [{{kind: ingest}}]\n"
            f"output: {{path: {out}, shards: 3}}\n")
        r = CliRunner().invoke(app, ["run", str(tmp_path / "p.yaml"), "--workers", "1"])
        assert r.exit_code == 3
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("datakit: error")]
        assert len(errors) == 1 and "being written by another run" in errors[0] and "Traceback" not in r.stderr
    finally:
        (hold / "go").touch()
        _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    # the first run's dataset is whole and only its own
    got = read_output(str(out), verify=True)
    assert sorted(got.column("event_id").to_pylist()) == sorted(make_event(i)["event_id"] for i in range(30))
    assert not (out / publish.LOCK_NAME).exists()


def test_object_store_lease_excludes_a_second_writer_and_expires(s3_endpoint, monkeypatch):
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("lock-bucket")
    url = "s3://lock-bucket/out"
    with publish.output_lock(url):
        held = json.loads(fs.cat_file(f"lock-bucket/out/{publish.LOCK_NAME}"))
        assert held["pid"] == os.getpid()
        with pytest.raises(publish.OutputBusyError, match="being written by another run"):
            publish._Lock(url).acquire_remote()  # another writer (a lock object of its own)
    fs.invalidate_cache()
    assert not fs.exists(f"lock-bucket/out/{publish.LOCK_NAME}")  # released
    # a killed run's lease: taken over once expired, refused while fresh
    fs.pipe_file(f"lock-bucket/out/{publish.LOCK_NAME}",
                 json.dumps({"run": "dead", "pid": 1, "host": "h", "since": "s", "expires": time.time() - 1}).encode())
    lock = publish._Lock(url)
    lock.acquire_remote()
    assert json.loads(fs.cat_file(f"lock-bucket/out/{publish.LOCK_NAME}"))["run"] == lock.owner["run"]
    lock.release_remote()


def test_a_run_taking_over_an_expired_lease_never_deletes_the_lease_another_run_just_took(s3_endpoint, monkeypatch):
    """Found in review: two runs taking over one expired lease at the same moment both held the folder (1 in 10
    trials): the second one's delete removed the lease the first had just created. Here the other run takes the
    lease between this run's judging it expired and its delete: this run must leave it and stop as busy."""
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("race-bucket")
    key = f"race-bucket/out/{publish.LOCK_NAME}"
    expired = json.dumps({"run": "dead", "pid": 1, "host": "h", "since": "s", "expires": time.time() - 1}).encode()
    theirs = json.dumps({"run": "other", "pid": 2, "host": "h2", "since": "s", "expires": time.time() + 100}).encode()
    fs.pipe_file(key, expired)
    real = publish.filesystem
    reads = []

    class OtherRunTakesItNow:
        """The store as this run sees it; right after this run first reads the expired lease, the other run
        (which judged it expired too) deletes it and creates its own."""

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def cat_file(self, path, *a, **k):
            data = self.inner.cat_file(path, *a, **k)
            reads.append(data)
            if len(reads) == 1:
                self.inner.pipe_file(key, theirs)
            return data

    monkeypatch.setattr(publish, "filesystem", lambda url: (OtherRunTakesItNow(real(url)[0]), real(url)[1]))
    monkeypatch.setattr(publish, "TAKEOVER_SETTLE_SECONDS", 0.1, raising=False)
    with pytest.raises(publish.OutputBusyError, match="being written by another run"):
        publish._Lock("s3://race-bucket/out").acquire_remote()
    fs.invalidate_cache()
    assert fs.cat_file(key) == theirs  # left alone


def _cli_run(tmp_path: Path, out: str):
    logs = _logs(tmp_path / "logs", 0)
    (tmp_path / "p.yaml").write_text(f"name: p\ninput: {{path: {logs}}}\nstages: [{{kind: ingest}}]\n"
                                     f"output: {{path: '{out}'}}\n")
    return CliRunner().invoke(app, ["run", str(tmp_path / "p.yaml"), "--workers", "1"])


@pytest.mark.parametrize("where", ["file", "inside_file", "read_only"])
def test_output_path_problems_are_one_line_exit_2(tmp_path, where):
    target = tmp_path / "taken"
    target.write_text("not a folder")
    out = {"file": str(target), "inside_file": str(target / "out"), "read_only": "/sys/datakit-test-out"}[where]
    r = _cli_run(tmp_path, out)
    assert r.exit_code == 2, r.output
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("datakit: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr and str(out).split("/")[-1] in errors[0]
    assert target.read_text() == "not a folder"
    assert not list(tmp_path.glob("**/_work"))


def test_a_run_over_other_input_never_takes_a_crashed_runs_work(tmp_path, monkeypatch):
    """The work folder is keyed by the input files too: a crash over A, then a run over B (same
    pipeline, `input=` override), must not gather A's quarantine rows into B's output."""
    import tests.test_local_engine  # noqa: F401 - registers the test_fail_on stage

    a = tmp_path / "a"
    for f in range(4):
        write_jsonl(a / f"part-{f}.jsonl.zst", [make_event(f * 100 + i) for i in range(10)] + [b"{bad-a"])
    b = _logs(tmp_path / "b", 900)
    p = (Pipeline("t").input(str(a)).add({"kind": "ingest", "drop_duplicate_events": False})
         .add({"kind": "test_fail_on"}).output(str(tmp_path / "out"), shards=2))
    monkeypatch.setenv("DATAKIT_TEST_FAIL", "1")
    with pytest.raises(RuntimeError, match="simulated crash"):
        p.run(workers=1)
    monkeypatch.delenv("DATAKIT_TEST_FAIL")
    res = p.run(workers=1, input=str(b))
    assert res.extra["reused_tasks"] == 0
    q = pq.read_table(tmp_path / "out" / "_quarantine" / "part-00000.parquet")
    assert set(q.column("source_file").to_pylist()) == {str(b / "part-0.jsonl")}
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [i["path"] for i in m["inputs"]] == [str(b / "part-0.jsonl")]  # the files actually read
    assert m["pipeline"]["input"]["path"] == str(b)


def test_finished_dataset_holds_no_debris_or_stale_side_outputs(tmp_path):
    out = tmp_path / "out"
    _pipe(_logs(tmp_path / "a", 0, bad=True), out).run(workers=1)
    assert (out / "_quarantine").exists()
    # what killed runs leave behind: a temp file beside the data, a work folder of another identity
    (out / "data").mkdir(exist_ok=True)
    (out / "data" / ".tmp-loss_mask-00000.npy-deadbeef").write_bytes(b"x")
    (out / ".tmp-manifest.json-0badc0de").write_bytes(b"x")
    (out / "_work" / "0123456789abcdef").mkdir(parents=True)
    # a killed n-gram index build's work folder (found in review: a successful rerun left its 22 files)
    (out / ".tmp-index-27d0128da67a" / "_units").mkdir(parents=True)
    (out / ".tmp-index-27d0128da67a" / "_units" / "u-0.parquet").write_bytes(b"x")
    (out / ".tmp-index-27d0128da67a" / ".datakit-lock").write_bytes(b"")
    _pipe(_logs(tmp_path / "clean", 0, bad=False), out).run(workers=1)
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert not [n for n in left if ".tmp-" in n or n.startswith("_work")], left
    assert not (out / "_quarantine" / "part-00000.parquet").exists()  # the earlier run's rows are not this run's


def test_readers_refuse_a_dataset_that_fails_its_manifest(tmp_path):
    out = tmp_path / "out"
    _pipe(_logs(tmp_path / "a", 0), out).run(workers=1)
    m = json.loads((out / "manifest.json").read_text())
    name = m["shards"][0]["files"][0]
    f = out / name
    data = f.read_bytes()
    f.write_bytes(data[:-7])  # an interrupted copy
    with pytest.raises(InputError, match="bytes, the manifest says"):
        read_output(str(out))
    f.write_bytes(data[:-7] + b"\0" * 7)  # same size, other bytes: only a checksum sees it
    with pytest.raises(InputError, match="sha256"):
        read_output(str(out), verify=True)
    f.unlink()
    with pytest.raises(InputError, match="missing"):
        read_output(str(out))


def test_packed_readers_check_sizes_always_and_checksums_on_request(tmp_path):
    from datakit.loader import DatasetError, PackedDataset
    from datakit.stages.tokenize.direct import build_dataset
    from datakit.stages.tokenize.stage import TokenizeConfig
    from tests.stages.test_tokenize import TOKENIZER, code_records, table

    out = tmp_path / "packed"
    m = build_dataset(table(code_records(12, max_chars=500)), str(out), TokenizeConfig(tokenizer=TOKENIZER, seq_len=64))
    f = out / m["shards"][0]["arrays"]["tokens"]
    data = f.read_bytes()
    f.write_bytes(data[:-2])
    with pytest.raises(DatasetError, match="bytes, the manifest says"):
        PackedDataset(out)
    r = CliRunner().invoke(app, ["inspect", str(out)])
    assert r.exit_code == 2 and "the manifest says" in r.stderr and "Traceback" not in r.output
    f.write_bytes(data[:-2] + bytes([data[-2] ^ 1, data[-1]]))  # same size, one bit changed
    PackedDataset(out)  # sizes match: the cheap check passes...
    with pytest.raises(DatasetError, match="checksum"):
        PackedDataset(out, verify=True)  # ...the full one does not
    r = CliRunner().invoke(app, ["inspect", str(out), "--verify"])
    assert r.exit_code == 2 and "sha256" in r.stderr


def test_lock_is_reentrant_in_a_thread_and_exclusive_across_threads(tmp_path):
    import threading

    out = str(tmp_path / "out")
    seen: list[BaseException] = []
    with publish.output_lock(out), publish.output_lock(out):  # Pipeline.run, then the engine
        t = threading.Thread(target=lambda: _try_lock(out, seen))
        t.start()
        t.join()
    assert len(seen) == 1 and isinstance(seen[0], publish.OutputBusyError)
    with publish.output_lock(out):  # released: free again
        pass


def _try_lock(out: str, seen: list) -> None:
    try:
        with publish.output_lock(out):
            pass
    except publish.OutputBusyError as e:
        seen.append(e)


def test_a_script_that_runs_at_import_gets_one_line_per_worker_not_a_lock_traceback(tmp_path):
    """Found in a docs review: the README's snippet without `if __name__ == "__main__":` and `workers=2`
    printed 107 lines: each spawned worker re-ran the script, took the output lock first and failed with an
    OutputBusyError traceback naming the wrong cause. A worker importing the script now ends with one line
    naming the fix, before it touches the output; the owner's error says the same."""
    for k in range(4):
        write_jsonl(tmp_path / "logs" / f"{k}.jsonl", [make_event(i) for i in range(k * 40, k * 40 + 40)])
    script = tmp_path / "noguard.py"
    script.write_text("from datakit import Pipeline\n"
                      "p = Pipeline('ng').input('logs').add({'kind': 'ingest'}).output('out')\n"
                      "p.run(engine='local', workers=2)\n")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0
    assert "OutputBusyError" not in r.stderr and r.stderr.count("Traceback") == 1  # the owner's own, in the script
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("datakit: error: a worker process imported your script")]
    assert lines and "if __name__ == \"__main__\":" in lines[0]
    assert "a local worker process died" in r.stderr and not (tmp_path / "out" / "_SUCCESS").exists()
