"""`_run.json` says where every second of a run went (`timing`): the parts add up to the total."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from datakit import Pipeline
from tests.eventgen import make_event, write_jsonl

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "run_report.v1.json").read_text())


def test_timing_parts_add_up_and_compile_is_attributed(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "l" / "a.jsonl", [make_event(i) for i in range(20)] + [b"x"])
    real_compile = Pipeline.compile

    def slow_compile(self, *a, **kw):  # a known 0.3 s of compile work: it must land in parts.compile
        time.sleep(0.3)
        return real_compile(self, *a, **kw)

    monkeypatch.setattr(Pipeline, "compile", slow_compile)
    p = (Pipeline("t").input(str(tmp_path / "l")).add({"kind": "ingest"}).add({"kind": "extract"})
         .output(str(tmp_path / "o")))
    result = p.run(workers=1, report=True)
    run = json.loads((tmp_path / "o" / "_run.json").read_text())
    jsonschema.validate(run, SCHEMA)
    timing = run["timing"]
    assert result.extra["timing"] == timing
    parts = timing["parts"]
    assert set(parts) == {"engine_start", "compile", "stages", "commit", "after_commit", "other"}
    assert abs(sum(parts.values()) - timing["total"]) <= 0.01  # rounding of six parts to ms
    assert parts["compile"] >= 0.3
    assert parts["stages"] == run["seconds"]  # the engine's own clock is the stages part
    assert parts["after_commit"] > 0  # the report was written after the commit, inside the run
    assert timing["cpu_seconds"] > 0 and timing["peak_rss_mb"] > 0 and timing["numba_compile"] >= 0


def test_stage_setup_seconds_are_reported_apart_from_stage_seconds(tmp_path, monkeypatch):
    """A worker's first-task set-up (setup(): spaCy, a tokenizer, the quarantine scrubber) is each stage's
    `setup_seconds`, not lost between the stages' batch seconds: in a one-process run the stages' batch
    seconds and set-up seconds are disjoint intervals inside the engine's clock (`parts.stages`)."""
    from datakit.stages.ingest import IngestFn

    real_setup = IngestFn.setup

    def slow_setup(self):  # a known 0.3 s of set-up: it must be the ingest stage's setup_seconds
        time.sleep(0.3)
        real_setup(self)

    monkeypatch.setattr(IngestFn, "setup", slow_setup)
    write_jsonl(tmp_path / "l" / "a.jsonl", [make_event(i) for i in range(20)] + [b"x"])
    p = (Pipeline("t").input(str(tmp_path / "l")).add({"kind": "ingest"}).add({"kind": "extract"})
         .output(str(tmp_path / "o")))
    p.run(workers=1)
    run = json.loads((tmp_path / "o" / "_run.json").read_text())
    jsonschema.validate(run, SCHEMA)
    stages = {s["name"]: s for s in run["stages"]}
    assert all("setup_seconds" in s for s in stages.values())
    assert stages["ingest"]["setup_seconds"] >= 0.3
    parts = run["timing"]["parts"]
    spent = sum(s["seconds"] + s["setup_seconds"] for s in stages.values())
    assert spent <= parts["stages"] + 0.001 * 2 * len(stages)  # disjoint parts of it (ms rounding)


def test_pool_workers_seconds_and_numba_are_in_the_timing(tmp_path):
    """A run on the pool: the workers' CPU, start-up and numba kernel time (compile or cache load) are
    in `timing.workers`; before this, _run.json only knew the driver process."""
    from datakit.workers import drop_pool

    drop_pool(2)  # fresh processes, so their start-up belongs to this run
    for part in range(3):
        write_jsonl(tmp_path / "l" / f"p{part}.jsonl", [make_event(part * 100 + i) for i in range(30)])
    p = (Pipeline("t").input(str(tmp_path / "l")).add({"kind": "ingest"}).add({"kind": "extract"})
         .add({"kind": "dedup"}).output(str(tmp_path / "o"), shards=2))
    p.run(workers=2)
    run = json.loads((tmp_path / "o" / "_run.json").read_text())
    jsonschema.validate(run, SCHEMA)
    w = run["timing"]["workers"]
    assert 1 <= w["processes"] <= 2 and w["tasks"] >= 3 + 2  # 3 input files, 2 output shards at least
    assert w["started"] == w["processes"] and w["startup_cpu_seconds"] > 0 and w["startup_rss_mb"] > 0
    assert w["cpu_seconds"] > w["startup_cpu_seconds"]
    assert w["numba_compile"] + w["numba_load"] > 0  # dedup's MinHash kernels ran in the workers
    assert w["peak_rss_mb"] >= w["startup_rss_mb"]
    # fresh processes set up ingest's function (its quarantine scrubber) once each, in their first task
    assert next(s for s in run["stages"] if s["name"] == "ingest")["setup_seconds"] > 0


def test_peak_rss_is_the_process_own_not_its_parents():
    """A subprocess of a big process reports its own peak: ru_maxrss of a (v)fork + exec child
    starts at its parent's peak, so every pool worker of a large driver looked as large as it."""
    import subprocess
    import sys

    ballast = bytearray(400 << 20)
    ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page: resident
    out = subprocess.run([sys.executable, "-c", "from datakit.run_timing import peak_rss_mb; print(peak_rss_mb())"],
                         capture_output=True, text=True, check=True).stdout
    del ballast
    assert 0 < float(out) < 200, out  # an interpreter importing one small module, not the 400+ MB parent


BASE_PARTS = {"engine_start", "compile", "stages", "commit", "after_commit", "other"}


def _pool_pipeline(tmp_path: Path) -> Path:
    for part in range(3):
        write_jsonl(tmp_path / "l" / f"p{part}.jsonl", [make_event(part * 100 + i) for i in range(30)])
    f = tmp_path / "p.yaml"
    f.write_text("name: t\ninput: {path: l/*.jsonl}\nstages: [{kind: ingest}, {kind: extract}, {kind: dedup}]\n"
                 "output: {path: o, shards: 2}\n")
    return f


def test_a_datakit_run_process_times_its_start_up_and_stops_its_workers_inside_the_run(tmp_path):
    """`datakit run` is a process started for one run: its start-up before `Pipeline.run` (interpreter,
    imports, reading the YAML) is the part `process_start`, and its pool workers stop inside the run
    (`release`), so `total` is the process's life up to `_run.json` and nothing heavy follows it (before:
    ~0.6 s of start-up and ~1.2 s of worker and interpreter teardown at 100k quickstart events were in
    no report)."""
    import subprocess
    import sys

    f = _pool_pipeline(tmp_path)
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "datakit.cli", "run", str(f), "--workers", "2", "--json"],
                       capture_output=True, text=True, cwd=tmp_path)
    wall = time.time() - t0
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stages"][0]["rows_in"] == 90  # everything printed reached the pipe
    run = json.loads((tmp_path / "o" / "_run.json").read_text())
    jsonschema.validate(run, SCHEMA)
    timing = run["timing"]
    parts = timing["parts"]
    assert set(parts) == BASE_PARTS | {"process_start", "release"}
    assert parts["process_start"] > 0
    assert abs(sum(parts.values()) - timing["total"]) <= 0.01
    assert timing["total"] <= wall  # counted from the process's start: never longer than its life
    assert timing["cpu_seconds"] > 0 and timing["workers"]["processes"] >= 1  # the pool ran this run's tasks


def test_a_script_that_calls_main_gets_control_back_after_a_run(tmp_path):
    """Only the `datakit` command itself (`cli.command`) ends without the teardown; a script that calls
    `datakit.cli.main` (the spark-submit wrapper, the benchmarks) gets its SystemExit and goes on."""
    import subprocess
    import sys

    f = _pool_pipeline(tmp_path)
    code = ("import sys; from datakit.cli import main; sys.argv = ['datakit', 'run', sys.argv[1], '--quiet']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('after main', e.code)")
    r = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "after main 0"
    assert "process_start" in json.loads((tmp_path / "o" / "_run.json").read_text())["timing"]["parts"]


def test_a_run_inside_a_longer_process_keeps_its_pool_and_has_no_start_up_part(tmp_path):
    """The same command invoked inside another process (a test's CliRunner, a library user's script) is
    not a process started for the run: no `process_start` (that process's age is not the run's), and the
    pool stays up for the next run."""
    from typer.testing import CliRunner

    from datakit import run_timing, workers
    from datakit.cli import app

    f = _pool_pipeline(tmp_path)
    r = CliRunner().invoke(app, ["run", str(f), "--workers", "2", "--quiet"])
    assert r.exit_code == 0, r.output
    assert not run_timing._ONE_RUN_PROCESS
    assert set(json.loads((tmp_path / "o" / "_run.json").read_text())["timing"]["parts"]) == BASE_PARTS
    assert 2 in workers._POOLS  # kept for the next run of this process


def test_process_age_counts_from_the_process_start():
    import subprocess
    import sys

    code = "import time; time.sleep(0.3); from datakit.run_timing import process_age; print(process_age())"
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.3 <= age < 60


class _MarksTeardown:
    """Writes a file when it is freed: held by a module global, that happens in the interpreter's teardown."""

    def __init__(self, path: str) -> None:
        import os

        self.path, self.open, self.write, self.close = path, os.open, os.write, os.close  # outlive module clearing

    def __del__(self) -> None:
        fd = self.open(self.path, 0o101)  # O_WRONLY | O_CREAT
        self.write(fd, b"freed")
        self.close(fd)


def _leave_probes(folder: str) -> int:
    """In a pool worker: an exit handler registered after the pool's own, and an object only the teardown frees."""
    import atexit
    import os

    from datakit import workers

    workers._teardown_probe = _MarksTeardown(f"{folder}/teardown")
    atexit.register(lambda: Path(f"{folder}/atexit-{os.getpid()}").write_text("ran"))
    return os.getpid()


def test_a_pool_worker_exits_without_the_interpreter_teardown(tmp_path):
    """Pool workers end after their exit handlers but skip the interpreter's teardown (freeing every module
    and object: 0.40-0.62 s per pool at the end of a run), with exit status 0."""
    from datakit import workers

    workers.drop_pool(2)
    ex = workers.pool(2)
    pid = ex.submit(_leave_probes, str(tmp_path)).result()
    procs = list(ex._processes.values())
    workers.drop_pool(2, wait=True)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert (tmp_path / f"atexit-{pid}").read_text() == "ran"  # handlers registered by tasks still run
    assert not (tmp_path / "teardown").exists()  # the teardown did not


def test_the_teardown_probe_marks_a_normal_exit(tmp_path):
    """The probe above can fail: in a process that exits normally, the teardown frees it and it writes."""
    import subprocess
    import sys

    code = f"from tests.test_run_timing import _leave_probes; _leave_probes({str(tmp_path)!r})"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
    assert (tmp_path / "teardown").read_text() == "freed"


def _command_with_probes(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`cli.command` (the `datakit` console script) with the two probes of `_leave_probes` planted first."""
    import sys

    code = (f"import sys; from tests.test_run_timing import _leave_probes; _leave_probes({str(folder)!r})\n"
            f"sys.argv = ['datakit', *sys.argv[1:]]\nfrom datakit.cli import command\ncommand()")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=300)


@pytest.mark.parametrize("dirty", [True, False])
def test_a_finished_contamination_check_ends_without_the_teardown_and_keeps_its_status(tmp_path, dirty):
    """The check runs before every eval; its teardown was ~0.2 s of a small check's ~1.1 s. It ends once its
    report is written, after the exit handlers, with its own status: 1 = contaminated, 0 = clean."""
    data = tmp_path / "data.jsonl"
    text = "def add(a, b):\n    return a + b\n" * 3 if not dirty else \
        "def has_close_elements(numbers, threshold):\n    for idx, elem in enumerate(numbers):\n" \
        "        for idx2, elem2 in enumerate(numbers):\n            if idx != idx2:\n" \
        "                distance = abs(elem - elem2)\n                if distance < threshold:\n" \
        "                    return True\n\n    return False\n"
    data.write_text(json.dumps({"id": "d1", "text": text}) + "\n")
    r = _command_with_probes(tmp_path, "contamination-check", "--data", str(data), "--eval", "humaneval",
                             "--json", str(tmp_path / "r.json"), "-q")
    assert r.returncode == (1 if dirty else 0), r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())  # the report is complete
    assert bool(rep["evals"][0]["matches"]) is dirty
    assert list(tmp_path.glob("atexit-*"))  # exit handlers ran
    assert not (tmp_path / "teardown").exists()  # the teardown did not


def test_a_failed_contamination_check_exits_normally(tmp_path):
    """Only a finished check takes the short exit: an input error ends the usual way, status 2."""
    r = _command_with_probes(tmp_path, "contamination-check", "--data", str(tmp_path / "nope"), "--eval", "humaneval")
    assert r.returncode == 2 and "input not found" in r.stderr
    assert (tmp_path / "teardown").read_text() == "freed"


def test_pool_workers_of_the_datakit_command_do_not_rerun_its_console_script(tmp_path):
    """A spawn worker re-runs the parent's `__main__` first; for the `datakit` console script that only
    imported the CLI (typer, click, rich) into every worker, 0.13 s of each worker's start-up. The
    command marks its wrapper as `datakit.cli.__main__` (which it is), so only the driver imports
    the CLI. Counted with `-X importtime`, which every process of the run (workers included) prints."""
    import re
    import sys

    exe = Path(sys.executable).with_name("datakit")
    assert exe.exists(), "the venv's `datakit` console script (make venv installs the package)"
    f = _pool_pipeline(tmp_path)
    r = subprocess.run([str(exe), "run", str(f), "--workers", "2", "--quiet", "--no-report"], capture_output=True,
                       text=True, cwd=tmp_path, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    interpreters = sum(1 for line in lines if re.search(r"\| encodings$", line))  # one per process
    cli = sum(1 for line in lines if re.search(r"\|\s+datakit\.cli$", line))
    assert json.loads((tmp_path / "o" / "_run.json").read_text())["timing"]["workers"]["processes"] == 2
    assert interpreters >= 3  # the command and its two pool workers (the probe saw the workers)
    assert cli == 1  # the command's own process only


def test_a_script_named_like_the_command_that_defines_more_keeps_its_main_for_the_workers(monkeypatch):
    """Only the installer's wrapper (nothing but `command`, `sys`, `re`) is treated as the command: a
    user's script that also defines functions must still be re-run by the workers that unpickle them."""
    import sys
    import types

    from datakit import cli

    wrapper = types.ModuleType("__main__")
    wrapper.__dict__.update(sys=sys, command=cli.command, __file__="/venv/bin/datakit")
    monkeypatch.setitem(sys.modules, "__main__", wrapper)
    cli._skip_entry_script_in_workers()
    assert wrapper.__spec__.name == "datakit.cli.__main__"
    from datakit import launch  # what the console script calls now (a local run restarts first)

    wrapper = types.ModuleType("__main__")
    wrapper.__dict__.update(sys=sys, command=launch.command, __file__="/venv/bin/datakit")
    monkeypatch.setitem(sys.modules, "__main__", wrapper)
    cli._skip_entry_script_in_workers()
    assert wrapper.__spec__.name == "datakit.cli.__main__"

    script = types.ModuleType("__main__")
    script.__dict__.update(command=cli.command, my_stage=lambda b: b, __file__="/home/u/run.py")
    monkeypatch.setitem(sys.modules, "__main__", script)
    cli._skip_entry_script_in_workers()
    assert script.__spec__ is None


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc (Linux)")
def test_the_command_gives_numpy_one_blas_thread_before_anything_imports_it():
    """OpenBLAS starts a thread per core when numpy is imported and each spins ~0.1 s: `command()` (the
    console script's and `python -m datakit.cli`'s entry) sets OPENBLAS_NUM_THREADS=1 before anything
    imports numpy (importing the CLI must not), and a user's value is kept."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    # the command itself (`--help` imports no numpy), then numpy in the same process: no BLAS thread pool
    probe = ("import os, sys; sys.argv = ['datakit', '--help']; from datakit import cli; "
             "before = 'numpy' in sys.modules\n"
             "try:\n    cli.command()\nexcept SystemExit:\n    pass\n"
             "threads = len(os.listdir('/proc/self/task')); import numpy; "
             "print(before, os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')) - threads)")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-3:] == ["False", "1", "0"], out.stdout + out.stderr  # numpy started no thread
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "OPENBLAS_NUM_THREADS": "2"}, capture_output=True,
                         text=True, check=True)
    assert out.stdout.split()[-3:-1] == ["False", "2"]
    # `python -m datakit.cli`: the package and its entry import no numpy before `command()` runs
    mods = subprocess.run([sys.executable, "-X", "importtime", "-m", "datakit.cli", "--help"], env=env,
                          capture_output=True, text=True, check=True).stderr
    assert not [line for line in mods.splitlines() if line.rstrip().endswith("| numpy")]
