"""Local engine: determinism across workers/shards, the run report, atomic writes, resume, bounded memory."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pytest

from datakit import CompileContext, Pipeline, StageConfig, register_stage
from datakit.contracts import EDITOR_EVENT_V1
from datakit.io.dataset import read_output
from datakit.io.sinks import output_checksums
from tests.conformance import assert_conformant
from tests.eventgen import make_event, write_jsonl

ROOT = Path(__file__).resolve().parent.parent


def _logs(tmp_path, files=4, per=50):
    for f in range(files):
        write_jsonl(tmp_path / "logs" / f"part-{f}.jsonl.zst",
                    [make_event(f * 1000 + i) for i in range(per)] + [b"{broken"])
    return tmp_path / "logs"


def test_identical_output_for_any_worker_count(tmp_path):
    logs = _logs(tmp_path)
    p = Pipeline("t").input(str(logs)).add({"kind": "ingest"}).output(str(tmp_path / "unused"), shards=3)
    sums = assert_conformant(p, tmp_path)
    assert len(sums) == 3


def test_run_report_shape_and_identity(tmp_path):
    logs = _logs(tmp_path, files=2, per=10)
    out = tmp_path / "out"
    Pipeline("t").input(str(logs)).add({"kind": "ingest"}).output(str(out)).run(workers=1)
    run = json.loads((out / "_run.json").read_text())
    assert run["pipeline"]["name"] == "t" and len(run["pipeline_hash"]) == 64
    (st,) = run["stages"]
    assert set(st) >= {"name", "rows_in", "rows_out", "dropped", "seconds"}
    assert st["rows_in"] == 22 and st["rows_out"] == 20 and st["dropped"] == {"bad_json": 2}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["rows"] == 20 and manifest["shards"][0]["sha256"]
    assert (out / "_SUCCESS").exists()
    # nothing left behind but the committed dataset and its side outputs
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "_SUCCESS", "_quarantine", "_run.json", "_shards",
                                                     "data", "manifest.json"]
    assert [p.name for p in (out / "data").iterdir()] == ["part-00000.parquet"]


def test_killed_writer_leaves_no_visible_partial_shard(tmp_path):
    target = tmp_path / "ds" / "part-00000.parquet"
    code = textwrap.dedent(f"""
        import time
        from datakit.io.atomic import atomic_path
        with atomic_path({str(target)!r}) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"PAR1" + b"x" * 100000)
                f.flush()
                print("writing", flush=True)
                time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    names = [p.name for p in target.parent.iterdir()]
    assert target.name not in names
    assert len(names) == 1 and names[0].startswith(".tmp-")  # hidden: globs and readers skip it
    from datakit.io.fs import InputError, expand

    with pytest.raises(InputError):
        expand(str(target.parent))


class _FailOn:
    """Fails on one input file while the env var is set: a job that dies part-way."""

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if os.environ.get("DATAKIT_TEST_FAIL") and any(f.endswith("part-2.jsonl.zst") for f in
                                                         batch.column("_source_file").to_pylist()):
            raise RuntimeError("simulated crash")
        return batch


@register_stage
class FailOn(StageConfig):
    kind: Literal["test_fail_on"] = "test_fail_on"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(_FailOn(), EDITOR_EVENT_V1, name="fail_on")


def test_rerun_after_crash_reuses_finished_work_and_matches_clean_run(tmp_path, monkeypatch):
    logs = _logs(tmp_path)
    def pipe(out):
        # without the duplicate-id barrier, parse and the failing stage fuse into one task per input file
        return (Pipeline("t").input(str(logs)).add({"kind": "ingest", "drop_duplicate_events": False})
                .add({"kind": "test_fail_on"}).output(str(out), shards=2))
    clean = pipe(tmp_path / "clean").run(workers=1)
    monkeypatch.setenv("DATAKIT_TEST_FAIL", "1")
    with pytest.raises(RuntimeError, match="simulated crash"):
        pipe(tmp_path / "resumed").run(workers=1)
    assert not (tmp_path / "resumed" / "manifest.json").exists()  # nothing committed
    monkeypatch.delenv("DATAKIT_TEST_FAIL")
    resumed = pipe(tmp_path / "resumed").run(workers=1)
    assert resumed.extra["reused_tasks"] == 2  # part-0 and part-1 finished before the crash
    assert output_checksums(str(tmp_path / "resumed")) == output_checksums(str(tmp_path / "clean"))
    assert resumed.stages == [dict(s, seconds=r["seconds"], setup_seconds=r["setup_seconds"])
                              for s, r in zip(clean.stages, resumed.stages)]
    # a third run reuses the finished shards too
    again = pipe(tmp_path / "resumed").run(workers=1)
    assert again.extra["reused_shards"] == 2


def test_a_resume_gathers_only_the_side_output_parts_of_its_own_tasks(tmp_path, monkeypatch):
    """Found in review: side-output parts are named by task, and how many tasks a step has depends on the
    worker count, so a killed run with 2 workers left parts (`aux/droplog-...-part-00003.parquet`) that no
    task of the resumed 1-worker run has; every file in the folder was gathered and `_dropped/` held 553
    rows twice. A stray part of another task count is now left out, and the output equals a clean run."""
    logs = _logs(tmp_path)  # a broken line per file: quarantine rows

    def pipe(out):
        return (Pipeline("t").input(str(logs)).add({"kind": "ingest", "drop_duplicate_events": False})
                .add({"kind": "test_fail_on"}).output(str(out), shards=2))
    pipe(tmp_path / "clean").run(workers=1)
    monkeypatch.setenv("DATAKIT_TEST_FAIL", "1")
    with pytest.raises(RuntimeError, match="simulated crash"):
        pipe(tmp_path / "resumed").run(workers=1)
    monkeypatch.delenv("DATAKIT_TEST_FAIL")
    (aux,) = (tmp_path / "resumed" / "_work").glob("*/aux")
    parts = sorted(aux.glob("quarantine-*.parquet"))
    assert parts, "the failed run wrote its quarantine part"
    stray = aux / parts[0].name.replace("part-00000", "part-00042")  # a task this run's worker count does not have
    stray.write_bytes(parts[0].read_bytes())
    pipe(tmp_path / "resumed").run(workers=1)
    assert output_checksums(str(tmp_path / "resumed")) == output_checksums(str(tmp_path / "clean"))
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "resumed" / "_quarantine").num_rows == 4


MEM_SCRIPT = """
import resource, sys, json
from datakit import Pipeline
res = (Pipeline("m").input(sys.argv[1]).add({"kind": "ingest"})
       .output(sys.argv[2], shards="auto", rows_per_shard=2000).run(workers=1, progress=False))
print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rows": res.manifest["rows"]}))
"""


def test_memory_stays_bounded_on_ten_times_the_input(tmp_path):
    pad = "# " + "x" * 2000 + "\n"
    def make(n, name):
        d = tmp_path / name
        for f in range(2):
            write_jsonl(d / f"part-{f}.jsonl.zst",
                        [make_event(f * n + i, context={"prefix": pad * 2, "suffix": ""}) for i in range(n // 2)])
        return d
    small, big = make(3000, "small"), make(30000, "big")
    def peak(inp, out):
        r = subprocess.run([sys.executable, "-c", MEM_SCRIPT, str(inp), str(tmp_path / out)],
                           capture_output=True, text=True, check=True)
        return json.loads(r.stdout.strip().splitlines()[-1])
    a, b = peak(small, "o1"), peak(big, "o2")
    assert a["rows"] == 3000 and b["rows"] == 30000
    # the big input holds ~130 MB of text; a run that kept it in memory would add that (and several
    # times more as Python objects) to its peak. Measured here: ~250 MB vs ~420 MB (1.6-1.7x for 10x).
    assert b["rss_mb"] < a["rss_mb"] * 2.0, (a, b)


def test_small_input_runs_in_process_unless_workers_are_given(tmp_path, monkeypatch):
    """Without `workers`, a small local input skips the process pool (it costs more than it saves)."""
    from datakit.engines.local import LocalEngine, scheduler

    logs = _logs(tmp_path, files=2, per=10)
    plan = Pipeline("t").input(str(logs)).add({"kind": "ingest"}).output(str(tmp_path / "a")).compile()
    auto = LocalEngine()
    auto.execute(plan)
    assert auto.workers == 1
    given = LocalEngine(workers=2)
    given.execute(Pipeline("t").input(str(logs)).add({"kind": "ingest"}).output(str(tmp_path / "b")).compile())
    assert given.workers == 2
    monkeypatch.setattr(scheduler, "SMALL_INPUT_BYTES", 0)  # "big" input: all cores again, on the same engine
    auto.execute(Pipeline("t").input(str(logs)).add({"kind": "ingest"}).output(str(tmp_path / "c")).compile())
    from datakit.workers import usable_cpus

    assert auto.workers == usable_cpus()
    assert output_checksums(str(tmp_path / "a")) == output_checksums(str(tmp_path / "b")) \
        == output_checksums(str(tmp_path / "c"))


def test_a_natively_threaded_plan_runs_in_process_up_to_a_larger_input(tmp_path, monkeypatch):
    """A plan whose only work is the tokenizer's (its own threads span the process's cores) runs in this
    process below NATIVE_SMALL_INPUT_BYTES, where the small-input rule of other plans would already
    use the pool, and only if this process has the workers' allocator; with any other stage, or above
    the threshold, the pool. Same bytes either way."""
    import pyarrow.parquet as pq

    from datakit import allocator
    from datakit.engines.local import LocalEngine, scheduler
    from tests.stages.test_tokenize import TOKENIZER, code_records, table

    pq.write_table(table(code_records(40)), tmp_path / "in.parquet")

    def pipeline(out: str, *stages: dict) -> Pipeline:
        p = Pipeline("t").input(str(tmp_path / "in.parquet"), format="parquet", schema="training_record.v1")
        for stage in stages:
            p = p.add(stage)
        return p.output(str(tmp_path / out), format="packed", shards=2)

    tokenize = {"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 256}
    plan = pipeline("a", tokenize).compile()
    monkeypatch.setattr(scheduler, "SMALL_INPUT_BYTES", 0)  # not small for other plans
    monkeypatch.setattr(allocator, "runs_like_workers", lambda: True)
    assert [scheduler.workers_for(plan, n) for n in (1, 2, 4)] == [1, 1, 1]
    assert scheduler.workers_for(pipeline("b", {"kind": "dedup"}, tokenize).compile(), 2) == 2
    auto = LocalEngine()
    auto.execute(plan)
    assert auto.workers == 1
    LocalEngine(workers=2).execute(pipeline("b", tokenize).compile())
    assert output_checksums(str(tmp_path / "a")) == output_checksums(str(tmp_path / "b"))
    # without the workers' allocator here (a notebook's interpreter malloc), the pool is cheaper
    monkeypatch.setattr(allocator, "runs_like_workers", lambda: False)
    assert scheduler.workers_for(plan, 2) == 2
    monkeypatch.setattr(allocator, "runs_like_workers", lambda: True)
    size = scheduler._input_bytes(plan)
    monkeypatch.setattr(scheduler, "NATIVE_SMALL_INPUT_BYTES", size)  # this input is no longer below it
    assert scheduler.workers_for(plan, 2) == 2
    monkeypatch.setattr(scheduler, "NATIVE_SMALL_INPUT_BYTES", 3 * size + 3)  # divided by (workers - 1)
    assert [scheduler.workers_for(plan, n) for n in (2, 4, 5)] == [1, 1, 5]


@pytest.mark.parametrize("workers", [1, 2])
def test_rerun_after_the_input_changed_does_not_reuse_the_old_broadcast_side(tmp_path, workers):
    """Found in review: the broadcast side (ingest's repeated event ids) was cached by file path, and a
    rerun of the same pipeline writes the same path, so the second run joined against the first's table."""
    e0, e1, e2 = make_event(0), make_event(1), make_event(2)
    f = tmp_path / "logs" / "a.jsonl"
    p = Pipeline("t").input(str(tmp_path / "logs")).add({"kind": "ingest"}).output(str(tmp_path / "out"))
    write_jsonl(f, [e0, e0, e1])
    first = p.run(workers=workers).stages[0]
    assert (first["rows_out"], first["dropped"]) == (2, {"duplicate_event_id": 1})
    write_jsonl(f, [e0, e2, e1])  # no repeat any more; same path, same pipeline, same process
    second = p.run(workers=workers).stages[0]
    assert (second["rows_out"], second["dropped"]) == (3, {})


def test_a_run_without_output_leaves_no_temp_folder(tmp_path, monkeypatch):
    """Found in review: a plan without a sink spilled into a mkdtemp folder that nobody removed."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    logs = _logs(tmp_path, files=2, per=5)
    res = Pipeline("t").input(str(logs)).add({"kind": "ingest"}).run(workers=1)
    assert res.stages[0]["rows_out"] == 10
    assert list((tmp_path / "tmp").iterdir()) == []


def test_one_kept_pool_at_a_time():
    from datakit import workers

    a = workers.pool(2)
    b = workers.pool(3)
    assert list(workers._POOLS) == [3] and a is not b
    workers.drop_pool(3)
    assert workers.usable_cpus() >= 1


# starts a pool of 2, prints its workers' pids once both answered, then waits to be killed
_POOL_OWNER = textwrap.dedent("""
    import os, sys, time
    from datakit.workers import pool
    ex = pool(2)
    pids = set()
    while len(pids) < 2:
        pids |= {f.result() for f in [ex.submit(os.getpid) for _ in range(4)]}
    print(" ".join(map(str, sorted(pids))), flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _workers_left_after_killing_their_owner(tmp_path, stop_one: bool = False) -> list[int]:
    """Start a pool owner, optionally SIGSTOP one of its two workers, SIGKILL the owner; the workers still alive
    30 s later (killed then, so no orphan outlives a failing test)."""
    owner = subprocess.Popen([sys.executable, "-c", _POOL_OWNER], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        if stop_one:
            os.kill(pids[0], signal.SIGSTOP)
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [p for p in pids if _alive(p)]
    for p in survivors:
        os.kill(p, signal.SIGCONT)
        os.kill(p, signal.SIGKILL)
    return survivors


def test_pool_workers_end_when_their_owner_is_killed(tmp_path):
    """An owner killed with SIGKILL cannot shut its pool down; its idle workers used to wait for a
    next task forever (found 16 minutes after the run was killed). They now end within seconds."""
    assert not _workers_left_after_killing_their_owner(tmp_path), "pool workers outlived their killed owner"


def test_a_stopped_pool_worker_ends_when_its_owner_is_killed(tmp_path):
    """Found in review: a worker stopped (SIGSTOP: a frozen cgroup, a debugger) runs no thread, so it cannot see
    its owner die; with the owner killed by SIGKILL it lived on, re-parented to init, until someone sent SIGCONT.
    The reaper beside the owner SIGKILLs it when the owner's end of its pipe closes."""
    assert not _workers_left_after_killing_their_owner(tmp_path, stop_one=True), \
        "a stopped pool worker outlived its killed owner"


def test_a_pool_run_leaves_no_resource_warning_about_the_reaper(tmp_path):
    """Found in a Python API review: the reaper's Popen was discarded while it ran, so every workers=2 run
    warned "ResourceWarning: subprocess N is still running" (pytest, -X dev, simplefilter("default")); kept
    for the process's life, and not reported at the interpreter's exit either. A fresh process: this one
    may have started its reaper in an earlier test."""
    logs = _logs(tmp_path)
    (tmp_path / "run.py").write_text(textwrap.dedent(f"""\
        import warnings
        from datakit import Pipeline
        if __name__ == "__main__":
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                Pipeline("p").input("{logs}/*.jsonl.zst").add({{"kind": "ingest"}}).output("out").run(workers=2)
                import gc; gc.collect()
            print("RECORDED", [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)])
            from datakit.workers import _REAPER
            print("REAPERS", len(_REAPER.procs))
    """))
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-X", "dev", "-W", "error::ResourceWarning", "run.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RECORDED []" in r.stdout and "REAPERS 1" in r.stdout, r.stdout + r.stderr[-3000:]
    assert "ResourceWarning" not in r.stderr and "still running" not in r.stderr, r.stderr[-3000:]


_SLOW_STAGE = textwrap.dedent("""
    import os, time
    from typing import Literal
    from datakit import StageConfig
    from datakit.contracts import EDITOR_EVENT_V1

    class _Sleep:
        def __call__(self, batch):
            open(os.path.join(os.environ["DK_TEST_MARKS"], f"task-{os.getpid()}"), "w").close()
            time.sleep(120)
            return batch

    class Sleep(StageConfig):
        kind: Literal["dk_test_sleep"] = "dk_test_sleep"
        consumes = produces = "editor_event.v1"

        def compile(self, rel, ctx):
            return rel.map_batches(_Sleep(), EDITOR_EVENT_V1, name="sleep")
""")


def test_ctrl_c_stops_a_pool_run_at_once_with_no_worker_tracebacks(tmp_path):
    """Ctrl-C in a terminal interrupts the whole process group: each worker printed its own
    KeyboardInterrupt traceback under the command's exit. Now the workers ignore it, the command
    kills them (mid-task: no wait for a 120 s task) and exits 130, leaving no process behind."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "dk_slow_stage.py").write_text(_SLOW_STAGE)
    marks = tmp_path / "marks"
    marks.mkdir()
    logs = _logs(tmp_path)
    (tmp_path / "p.yaml").write_text(textwrap.dedent(f"""\
        name: slow
        input: {{path: '{logs}'}}
        stages: [{{kind: ingest, drop_duplicate_events: false}}, {{kind: "dk_slow_stage:Sleep"}}]
        output: {{path: '{tmp_path / "out"}', shards: 2}}
    """))
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               DK_TEST_MARKS=str(marks))
    proc = subprocess.Popen([sys.executable, "-m", "datakit.cli", "run", str(tmp_path / "p.yaml"), "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal starts it
    try:
        deadline = time.monotonic() + 120
        while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        pids = [int(m.name.split("-")[1]) for m in marks.iterdir()]
        assert len(pids) == 2, proc.stderr.read() if proc.poll() is not None else "tasks did not start"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does
        t = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert took < 30, took  # the 120 s tasks were not waited for
    time.sleep(0.5)
    assert not [p for p in pids if _alive(p)]


# runs `datakit run` with a Ctrl-C (SIGINT to the process) sent the moment the commit returns: the window
# between publishing the dataset and removing its work folder
_CTRL_C_AFTER_COMMIT = """
import os, signal, sys
import datakit.engines.local.engine as engine

commit = engine.commit_run

def commit_then_ctrl_c(*args, **kwargs):
    out = commit(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)
    return out

engine.commit_run = commit_then_ctrl_c
from datakit.cli import main
sys.argv = ["datakit", *sys.argv[1:]]
main()
"""


def test_ctrl_c_after_the_commit_still_leaves_a_clean_dataset(tmp_path):
    """Found in an operations review: a Ctrl-C between the commit and the clean-up exited 130 with the
    dataset published and its `_work/` folder (~70 MB at 10k events) left inside it. Now the commit window
    holds the first Ctrl-C until the clean-up is done, then exits 130 as usual."""
    logs = _logs(tmp_path)
    out = tmp_path / "out"
    (tmp_path / "p.yaml").write_text(f"name: t\ninput: {{path: '{logs}'}}\nstages: [{{kind: ingest}}]\n"
                                     f"output: {{path: '{out}', shards: 2}}\n")
    r = subprocess.run([sys.executable, "-c", _CTRL_C_AFTER_COMMIT, "run", str(tmp_path / "p.yaml"), "--workers", "1",
                        "--no-report"],
                       capture_output=True, text=True, timeout=300,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == 130, r.stderr[-3000:]
    assert (out / "_SUCCESS").exists() and (out / "manifest.json").exists()
    assert not (out / "_work").exists(), sorted(p.name for p in out.iterdir())
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def _rayon_threads(_: object) -> str | None:
    import os

    return os.environ.get("RAYON_NUM_THREADS")


def test_pool_workers_share_the_cores(monkeypatch):
    """Each of N workers tokenizes with cores // N threads (not N x all-cores threads on the same
    cores); a RAYON_NUM_THREADS the user set wins."""
    from datakit.workers import drop_pool, pool, worker_threads

    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    assert pool(2).submit(_rayon_threads, None).result() == str(worker_threads(2))
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")  # another environment: a new pool
    assert pool(2).submit(_rayon_threads, None).result() == "3"
    drop_pool(2)


class _Mutate:
    """On its first batch, deletes or rewrites the input file named by DK_TEST_MUTATE: an input that
    changes while the run is going (logs of today still being written)."""

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        target = os.environ.get("DK_TEST_MUTATE")
        if target and os.path.exists(target):
            how = os.environ.get("DK_TEST_MUTATE_HOW")
            if how == "delete":
                os.remove(target)
            elif how == "append":  # a log still being written: lines added while it is read
                with open(target, "ab") as f:
                    f.write(b"".join(json.dumps(make_event(9000 + i)).encode() + b"\n" for i in range(1000)))
                os.environ["DK_TEST_MUTATE"] = ""  # once
            else:
                write_jsonl(Path(target), [make_event(9000 + i) for i in range(7)])
        return batch


@register_stage
class Mutate(StageConfig):
    kind: Literal["test_mutate_input"] = "test_mutate_input"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(_Mutate(), EDITOR_EVENT_V1, name="mutate")


@pytest.mark.parametrize("how,message", [("delete", "disappeared during the run"),
                                         ("rewrite", "changed during the run")])
def test_an_input_file_changed_during_the_run_is_one_input_error(tmp_path, monkeypatch, how, message):
    """The manifest names the files as listed when the run started; a file replaced meanwhile was read as
    it is now under a manifest naming the old one, a deleted one was a traceback (found in review)."""
    from datakit.io.fs import InputError

    logs = _logs(tmp_path)
    monkeypatch.setenv("DK_TEST_MUTATE", str(logs / "part-3.jsonl.zst"))
    monkeypatch.setenv("DK_TEST_MUTATE_HOW", how)
    p = (Pipeline("t").input(str(logs)).add({"kind": "ingest", "drop_duplicate_events": False})
         .add({"kind": "test_mutate_input"}).output(str(tmp_path / "out"), shards=2))
    with pytest.raises(InputError, match=message) as e:
        p.run(workers=1)
    assert "part-3.jsonl.zst" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_an_input_file_written_to_while_it_is_read_is_one_input_error(tmp_path, monkeypatch):
    """Found in review: a log still being written when the run read it was read past its listed size,
    1,000 appended lines ingested under a manifest naming the old size (and an event cut mid-write
    quarantined as bad JSON), exit 0. The file is checked after its read too."""
    from datakit.io.fs import InputError

    log = write_jsonl(tmp_path / "logs" / "today.jsonl", [make_event(i) for i in range(9000)])  # 3 batches
    monkeypatch.setenv("DK_TEST_MUTATE", str(log))
    monkeypatch.setenv("DK_TEST_MUTATE_HOW", "append")
    p = (Pipeline("t").input(str(log)).add({"kind": "ingest", "drop_duplicate_events": False})
         .add({"kind": "test_mutate_input"}).output(str(tmp_path / "out"), shards=2))
    with pytest.raises(InputError, match="today.jsonl changed during the run"):
        p.run(workers=1)
    assert not (tmp_path / "out" / "manifest.json").exists()


_STAGE_MODULE = textwrap.dedent('''
    from typing import Literal
    import pyarrow as pa
    from datakit import StageConfig, register_stage
    from datakit.plan import DROP

    LIMIT = {limit}

    class KeepFirstFn:
        def __call__(self, batch):
            drop = [None if i < LIMIT else "over_limit" for i in range(batch.num_rows)]
            return batch.append_column(DROP, pa.array(drop, pa.string()))

    @register_stage
    class KeepFirst(StageConfig):
        kind: Literal["keep_first_test"] = "keep_first_test"
        consumes = "editor_event.v1"
        produces = "editor_event.v1"

        def compile(self, rel, ctx):
            return rel.map_batches(KeepFirstFn(), rel.schema, name="keep_first")
''')

# a notebook's session: a first run starts the kept pool; then a folder joins sys.path, a stage module is
# imported from it, run, edited, reloaded and run again, each time with the kept pool of 2 workers
_NOTEBOOK = textwrap.dedent('''
    import importlib, json, sys
    from datakit import Pipeline

    logs, proj, out = sys.argv[1:4]
    def run(stage, name):
        p = Pipeline("nb").input(logs + "/*.jsonl.zst").add({{"kind": "ingest"}})
        if stage is not None:
            p.add(stage)
        return p.output(out + "/" + name).run(workers=2).manifest["rows"]

    rows = [run(None, "a")]
    sys.path.append(proj)
    import mystage
    rows.append(run(mystage.KeepFirst(), "b"))
    with open(proj + "/mystage.py") as f:
        text = f.read()
    with open(proj + "/mystage.py", "w") as f:
        f.write(text.replace("LIMIT = {limit}", "LIMIT = 5"))
    importlib.reload(mystage)
    rows.append(run(mystage.KeepFirst(), "c"))
    print(json.dumps(rows))
''')


def test_the_kept_pool_follows_a_notebooks_sys_path_and_reloaded_code(tmp_path):
    """Found in review: the pool kept across runs did not see a folder added to sys.path after it started
    (its workers died importing the stage: 'a worker process died'), and after an edited stage module was
    reloaded its workers ran the old code under the new code's digest."""
    logs = _logs(tmp_path, files=2, per=30)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "mystage.py").write_text(_STAGE_MODULE.format(limit=20))
    r = subprocess.run([sys.executable, "-c", _NOTEBOOK.format(limit=20), str(logs), str(tmp_path / "proj"),
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    # 2 files of 30 valid events (one batch each): all, then the first 20 of each, then the first 5 of each
    assert rows == [60, 40, 10], rows


_EARLY_OWNER = textwrap.dedent("""
    import multiprocessing, os, sys, time

    def child(path):
        time.sleep(1.5)  # the owner is gone by now: this process was re-parented before its start-up watch
        from datakit.workers import _owner_pid
        open(path, "w").write(f"{_owner_pid()} {os.getppid()}")

    if __name__ == "__main__":
        p = multiprocessing.get_context("spawn").Process(target=child, args=(sys.argv[1],))
        p.start()
        print(os.getpid(), flush=True)
        os._exit(0)  # killed while its worker starts: nothing waits for it
""")


def test_a_worker_whose_owner_died_while_it_started_still_knows_its_owner(tmp_path):
    """Found in an operations review: a run killed while its workers were starting left them re-parented before
    their watch began; it read the owner from `getppid()`, took init for it, and the workers lived on."""
    (tmp_path / "owner.py").write_text(_EARLY_OWNER)
    out = subprocess.run([sys.executable, str(tmp_path / "owner.py"), str(tmp_path / "seen")], capture_output=True,
                         text=True, cwd=tmp_path, timeout=60)
    owner = int(out.stdout.split()[0])
    deadline = time.monotonic() + 30
    while not (tmp_path / "seen").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)
    recorded, now = map(int, (tmp_path / "seen").read_text().split())
    assert recorded == owner and now != owner  # the dead owner, not whoever adopted the worker
