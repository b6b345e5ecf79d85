"""Pool workers run with mimalloc interposed (datakit/allocator.py): only the workers, never the
owner's environment, a user's own LD_PRELOAD kept whole, an opt-out, and the same output bytes."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from datakit import Pipeline, allocator, synth, workers
from datakit.io.sinks import output_checksums

needs_mimalloc = pytest.mark.skipif(not sys.platform.startswith("linux") or allocator.mimalloc_library() is None,
                                    reason="LD_PRELOAD and the cmeel-mimalloc wheel are Linux-only")
TOKENIZER = str(Path(__file__).resolve().parent / "data" / "tokenizer" / "tokenizer.json")


def _worker_view(_: object) -> dict:
    """What a pool worker sees: its allocator, whether libmimalloc is mapped, its LD_PRELOAD, and
    what a process it starts runs with."""
    import os
    import subprocess
    import sys

    from datakit import allocator

    with open("/proc/self/maps") as f:
        mapped = "libmimalloc" in f.read()
    child = subprocess.run([sys.executable, "-c", "from datakit import allocator; print(allocator.in_use())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    return {"in_use": allocator.in_use(), "mapped": mapped, "LD_PRELOAD": os.environ.get("LD_PRELOAD"),
            "child": child}


def _worker_settings(_: object) -> dict:
    """A worker's transparent-huge-page flag (the kernel's view), and the settings in its environment."""
    import os

    with open("/proc/self/status") as f:
        thp = next((line.split()[1] for line in f if line.startswith("THP_enabled:")), None)
    return {"THP_enabled": thp, **{k: os.environ.get(k) for k in ("MIMALLOC_ALLOW_THP", "OPENBLAS_NUM_THREADS")}}


def _kernel_reports_thp() -> bool:
    with open("/proc/self/status") as f:
        return any(line.startswith("THP_enabled:") for line in f)


@pytest.fixture
def clean_env(monkeypatch):
    for key in ("LD_PRELOAD", allocator.ENV_VAR, "MIMALLOC_ALLOW_THP", "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(key, raising=False)
    yield monkeypatch
    workers.drop_all_pools(wait=True)


@needs_mimalloc
def test_workers_start_with_mimalloc_and_the_owner_environment_is_unchanged(clean_env):
    before = dict(os.environ)
    view = workers.pool(2).submit(_worker_view, None).result()
    assert view["mapped"] and view["in_use"].startswith("mimalloc 3.")
    # the worker forgets the variable once started: a process a task starts keeps its own malloc
    assert view["LD_PRELOAD"] is None and view["child"] == "system"
    assert dict(os.environ) == before  # set only for the instant a worker starts
    assert allocator.in_use() == "system"  # this process keeps its own malloc
    assert workers.pool(2) is workers.pool(2)  # the owner's environment key did not move: the pool is kept


@needs_mimalloc
def test_workers_run_without_transparent_huge_pages_unless_the_user_asks(clean_env):
    """mimalloc's allow_thp=0 turns THP off in the worker (each fresh 2 MB was zeroed in one fault: 12% of a
    tokenize run's CPU); the option is forgotten once the worker has started, and a user's setting wins."""
    if not _kernel_reports_thp():
        pytest.skip("this kernel does not report THP_enabled in /proc/<pid>/status")
    clean_env.delenv("MIMALLOC_ALLOW_THP", raising=False)
    assert workers.pool(2).submit(_worker_settings, None).result()["THP_enabled"] == "0"
    assert workers.pool(2).submit(_worker_settings, None).result()["MIMALLOC_ALLOW_THP"] is None
    workers.drop_all_pools(wait=True)
    clean_env.setenv("MIMALLOC_ALLOW_THP", "1")
    view = workers.pool(2).submit(_worker_settings, None).result()
    assert view["THP_enabled"] == "1" and view["MIMALLOC_ALLOW_THP"] == "1"


def test_workers_get_their_share_of_blas_threads(clean_env):
    """numpy's OpenBLAS threads spin at import: a worker gets its share of the cores (as the tokenizer
    does), set before its first import; the `datakit` command's own 1 is not a user's choice (its
    workers still get their share); a user's setting is passed on unchanged."""
    clean_env.setattr(workers, "usable_cpus", lambda: 8)  # 2 workers on 8 cores: a share of 4, not 1
    clean_env.setattr(workers, "_OWNER_SET", set())
    assert workers.pool(2).submit(_worker_settings, None).result()["OPENBLAS_NUM_THREADS"] == "4"
    assert "OPENBLAS_NUM_THREADS" not in os.environ  # the owner's environment is untouched
    workers.one_blas_thread_here()  # what `datakit` does first: this process gets 1 ...
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    assert workers.pool(2).submit(_worker_settings, None).result()["OPENBLAS_NUM_THREADS"] == "4"  # ... not its workers
    clean_env.setenv("OPENBLAS_NUM_THREADS", "7")
    clean_env.setattr(workers, "_OWNER_SET", set())
    workers.one_blas_thread_here()  # a user's value is kept, here and in the workers
    assert os.environ["OPENBLAS_NUM_THREADS"] == "7"
    assert workers.pool(2).submit(_worker_settings, None).result()["OPENBLAS_NUM_THREADS"] == "7"


@needs_mimalloc
def test_the_environment_key_never_sees_a_worker_start(clean_env):
    """Workers start while another thread reads the environment under the lock (as `pool()` and
    Spark's JVM start do): it never sees the worker-only variables."""
    import threading

    seen, stop = [], threading.Event()

    added = ("LD_PRELOAD", "MIMALLOC_ALLOW_THP", "OPENBLAS_NUM_THREADS", "DATAKIT_WORKER_PRELOAD")

    def reader() -> None:
        while not stop.is_set():
            with workers.environment_lock():
                seen.append(any(k in os.environ for k in added))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for _ in range(3):
            workers.drop_all_pools(wait=True)
            workers.pool(2).submit(_worker_view, None).result()
    finally:
        stop.set()
        t.join()
    assert seen and not any(seen)


def test_system_allocator_when_asked(clean_env):
    clean_env.setenv(allocator.ENV_VAR, "system")
    view = workers.pool(2).submit(_worker_view, None).result()
    assert view == {"in_use": "system", "mapped": False, "LD_PRELOAD": None, "child": "system"}


@needs_mimalloc
def test_a_users_ld_preload_is_kept_whole(clean_env, tmp_path):
    """The user chose what to preload (an allocator, a profiler): nothing is added to it, and it
    stays in the workers' environment for the processes they start."""
    theirs = tmp_path / "libmimalloc.so"  # another name for the same library: reported by its file name
    theirs.symlink_to(allocator.mimalloc_library())
    clean_env.setenv("LD_PRELOAD", str(theirs))
    view = workers.pool(2).submit(_worker_view, None).result()
    assert view == {"in_use": "libmimalloc.so", "mapped": True, "LD_PRELOAD": str(theirs),
                    "child": "libmimalloc.so"}


@needs_mimalloc
def test_a_preloaded_library_named_without_a_path_is_recognised(clean_env, tmp_path):
    """ld.so finds a bare name on its search path; the report must still name it."""
    import subprocess

    lib = Path(allocator.mimalloc_library())
    env = {**os.environ, "LD_PRELOAD": lib.name, "LD_LIBRARY_PATH": str(lib.parent)}
    out = subprocess.run([sys.executable, "-c", "from datakit import allocator; print(allocator.in_use())"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == lib.name


def test_an_unknown_allocator_is_a_clear_error_before_any_work(clean_env, tmp_path):
    """Checked when the engine is built: one line, exit 2, and the published output is untouched
    (a failure at the first pool would come after the run had retracted it)."""
    import subprocess

    clean_env.setenv(allocator.ENV_VAR, "jemalloc")
    with pytest.raises(allocator.AllocatorError, match="DATAKIT_ALLOCATOR='jemalloc': expected one of mimalloc, system"):
        workers.pool(2)
    synth.generate(str(tmp_path / "logs"), events=200, seed=1)
    (tmp_path / "p.yaml").write_text("name: a\ninput: {path: 'logs/dt=*/*.jsonl.zst'}\nstages: [{kind: ingest}]\n"
                                     "output: {path: out}\n")
    cli = [sys.executable, "-m", "datakit.cli", "run", "p.yaml", "--quiet", "--no-report"]
    env = {k: v for k, v in os.environ.items() if k != allocator.ENV_VAR}
    assert subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True).returncode == 0
    before = output_checksums(str(tmp_path / "out"))
    r = subprocess.run(cli, cwd=tmp_path, env={**env, allocator.ENV_VAR: "jemalloc"}, capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "DATAKIT_ALLOCATOR='jemalloc': expected one of mimalloc, system" in r.stderr
    assert output_checksums(str(tmp_path / "out")) == before and (tmp_path / "out" / "_SUCCESS").exists()


def _free_memory_probe(_: object) -> list[float]:
    """RSS of a worker: before, holding ~240 MB of malloc'd blocks, after freeing them, after the trim."""
    from datakit.engines.local.memory import release_free_memory
    from datakit.run_timing import rss_mb

    r0 = rss_mb()
    blocks = [bytes(4000) + bytes([i % 256]) for i in range(60000)]  # > pymalloc's 512 B: malloc's
    r1 = rss_mb()
    del blocks
    r2 = rss_mb()
    release_free_memory()
    return [r0, r1, r2, rss_mb()]


@needs_mimalloc
def test_release_free_memory_hands_mimallocs_free_pages_back(clean_env):
    """mimalloc keeps freed pages (glibc's malloc_trim cannot see them): the engine's trim must
    reach them too, or a worker's RSS keeps its largest batch between tasks."""
    r0, r1, r2, r3 = workers.pool(2).submit(_free_memory_probe, None).result()
    assert r1 - r0 > 200
    assert r2 - r0 > 200  # freed, still resident
    assert r3 - r0 < 50


def _sequence_probe(_: object) -> list[float]:
    """RSS of a worker around ~240 MB of malloc'd blocks freed between two tasks of one step run in
    sequence: after the task-end trim inside the sequence, and after the sequence ends."""
    from datakit.engines.local import memory
    from datakit.run_timing import rss_mb

    r0 = rss_mb()
    with memory.tasks_in_sequence():
        blocks = [bytes(4000) + bytes([i % 256]) for i in range(60000)]
        del blocks
        memory.release_free_memory()  # what chain.py calls when a task ends
        r1 = rss_mb()
    return [r0, r1, rss_mb()]


@needs_mimalloc
def test_tasks_in_sequence_keep_freed_pages_for_the_next_task_and_trim_after_the_last(clean_env):
    """Between two tasks of one step in this process the freed pages stay (the next task would fault
    them in again); the sequence's end hands them back, as a lone task's end does."""
    r0, r1, r2 = workers.pool(2).submit(_sequence_probe, None).result()
    assert r1 - r0 > 200
    assert r2 - r0 < 50


def test_the_in_process_scheduler_trims_fully_only_after_a_steps_last_task(monkeypatch, tmp_path):
    """The wiring: `run_tasks` in this process over several tasks defers the full trim to the end;
    over one task, the task's own trim is the full one."""
    from datakit.engines.local import memory, scheduler

    calls: list[bool] = []
    monkeypatch.setattr(allocator, "release_free", lambda force=True: calls.append(force))

    def task(i: int) -> int:
        memory.release_free_memory()
        return i

    assert scheduler.run_tasks(task, [1, 2, 3], "probe", 1, False, str(tmp_path)) == [1, 2, 3]
    assert calls == [False, False, False, True]
    calls.clear()
    assert scheduler.run_tasks(task, [1], "probe", 1, False, str(tmp_path)) == [1]
    assert calls == [True]


@needs_mimalloc
def test_output_is_byte_identical_with_either_allocator(clean_env, tmp_path):
    synth.generate(str(tmp_path / "logs"), events=1200, seed=3)
    sums, report = {}, {}
    for name in ("mimalloc", "system"):
        clean_env.setenv(allocator.ENV_VAR, name)
        out = tmp_path / name
        (Pipeline("alloc", seed=0).input(str(tmp_path / "logs" / "dt=*" / "*.jsonl.zst"))
         .add({"kind": "ingest"}).add({"kind": "extract", "kinds": ["code", "fim", "sft"]})
         .add({"kind": "dedup"})
         .add({"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 256, "fim_rate": 0.5})
         .output(str(out), format="packed", shards=2)).run(engine="local", workers=2)
        sums[name] = output_checksums(str(out))
        report[name] = json.loads((out / "_run.json").read_text())["timing"]["workers"]["allocators"]
    assert sums["mimalloc"] == sums["system"] and sums["system"]
    assert report["mimalloc"][0].startswith("mimalloc 3.") and len(report["mimalloc"]) == 1
    assert report["system"] == ["system"]


@needs_mimalloc
def test_the_library_found_from_the_wheels_record_is_importlib_metadatas(tmp_path, monkeypatch):
    """`_installed_mimalloc` reads the wheel's RECORD instead of importing importlib.metadata (~40 ms per
    process): the same path and version as the library's answer; a copy of the dist-info folder whose
    library file is missing is skipped for the next one on sys.path, and no wheel at all falls back to the
    library."""
    ours = allocator._installed_mimalloc()
    assert ours == allocator._installed_by_metadata()
    assert ours[0].endswith("/libmimalloc.so.3") or "/libmimalloc.so." in ours[0]
    assert ours[1] and ours[1][0].isdigit()
    # a site folder earlier on sys.path holding the dist-info but not the library: not taken
    site = Path(ours[0]).parents[2]
    dist_info = next(site.glob("cmeel_mimalloc-*.dist-info"))
    fake = tmp_path / "site"
    (fake / dist_info.name).mkdir(parents=True)
    (fake / dist_info.name / "RECORD").write_text((dist_info / "RECORD").read_text())
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(fake), *sys.path])
    allocator._installed_mimalloc.cache_clear()
    try:
        assert allocator._installed_mimalloc() == ours
    finally:
        allocator._installed_mimalloc.cache_clear()
