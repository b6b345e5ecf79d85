"""The `datakit` command restarts a local `run` with the workers' allocator (datakit/launch.py): only
then, with its own variables taken out of the environment again, never over a user's choice, and
with the same output bytes as the interpreter's malloc."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from datakit import allocator, launch, synth
from datakit.io.sinks import output_checksums

needs_mimalloc = pytest.mark.skipif(not sys.platform.startswith("linux") or allocator.mimalloc_library() is None,
                                    reason="LD_PRELOAD and the cmeel-mimalloc wheel are Linux-only")

# what the restarted process sees: whether mimalloc is mapped, and the variables the restart added
PROBE = ("import json, os, sys; from datakit import allocator, launch; "
         "launch.restart_with_worker_allocator(sys.argv[1:]); "
         "maps = open('/proc/self/maps').read(); "
         "print(json.dumps({'mapped': 'libmimalloc' in maps, 'in_use': allocator.in_use(), "
         "'like_workers': allocator.runs_like_workers(), "
         "'env': {k: os.environ.get(k) for k in ('LD_PRELOAD', 'MIMALLOC_ALLOW_THP', launch.RESTARTED)}}))")


def _probe(args: list[str], **env: str) -> dict:
    base = {k: v for k, v in os.environ.items()
            if k not in ("LD_PRELOAD", "MIMALLOC_ALLOW_THP", allocator.ENV_VAR, launch.RESTARTED)}
    out = subprocess.run([sys.executable, "-c", PROBE, *args], env={**base, **env}, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_only_a_local_run_restarts():
    assert launch.restarts(["run", "p.yaml"])
    assert launch.restarts(["run", "p.yaml", "--engine", "local", "--workers", "1"])
    assert launch.restarts(["run", "p.yaml", "--engine=local"])
    assert not launch.restarts(["run", "p.yaml", "--engine", "spark"])
    assert not launch.restarts(["run", "--engine=spark", "p.yaml"])
    assert not launch.restarts(["contamination-check", "--data", "x"])
    assert not launch.restarts([])


@needs_mimalloc
def test_a_local_run_restarts_with_mimalloc_and_leaves_the_environment_as_it_was():
    """Restarted by execv, mimalloc mapped and reported, and none of the variables the
    restart added left for what the run starts (a Spark JVM, a tool a stage calls)."""
    seen = _probe(["run", "p.yaml"])
    assert seen["mapped"] and seen["in_use"].startswith("mimalloc 3.")
    assert seen["like_workers"]  # work kept in this process costs what it would in a worker
    assert seen["env"] == {"LD_PRELOAD": None, "MIMALLOC_ALLOW_THP": None, launch.RESTARTED: None}


@needs_mimalloc
def test_no_restart_when_not_asked_for_or_the_user_chose(tmp_path):
    for args in (["run", "p.yaml", "--engine", "spark"], ["inspect", "out"]):
        seen = _probe(args)
        assert not seen["mapped"] and seen["in_use"] == "system" and not seen["like_workers"]
        assert seen["env"] == {"LD_PRELOAD": None, "MIMALLOC_ALLOW_THP": None, launch.RESTARTED: None}
    system = _probe(["run", "p.yaml"], DATAKIT_ALLOCATOR="system")
    assert not system["mapped"] and system["like_workers"]  # workers would keep the system's malloc too
    theirs = tmp_path / "libmimalloc.so"  # a user's own preload: kept whole, nothing added, no restart
    theirs.symlink_to(allocator.mimalloc_library())
    seen = _probe(["run", "p.yaml"], LD_PRELOAD=str(theirs))
    assert seen["in_use"] == "libmimalloc.so" and seen["like_workers"]
    assert seen["env"] == {"LD_PRELOAD": str(theirs), "MIMALLOC_ALLOW_THP": None, launch.RESTARTED: None}


@needs_mimalloc
def test_the_command_runs_in_process_with_mimalloc_and_writes_the_same_bytes(tmp_path):
    """A small input runs in the command's own process: with the restart it runs there with mimalloc
    (`timing.allocator`), and the output is the one the interpreter's malloc gives."""
    synth.generate(str(tmp_path / "logs"), events=300, seed=2)
    tok = Path(__file__).resolve().parent / "data" / "tokenizer" / "tokenizer.json"
    (tmp_path / "p.yaml").write_text(
        "name: a\nseed: 0\ninput: {path: 'logs/dt=*/*.jsonl.zst'}\n"
        f"stages: [{{kind: ingest}}, {{kind: extract}}, {{kind: dedup}}, {{kind: tokenize, tokenizer: '{tok}', seq_len: 128}}]\n"
        "output: {path: out, format: packed, shards: 2}\n")
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator.ENV_VAR, launch.RESTARTED)}
    sums, seen = {}, {}
    for name in ("mimalloc", "system"):
        cmd = [sys.executable, "-c", "from datakit.launch import command; command()",
               "run", "p.yaml", "--output", f"out-{name}", "--quiet", "--no-report"]
        r = subprocess.run(cmd, cwd=tmp_path, env={**base, allocator.ENV_VAR: name}, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        timing = json.loads((tmp_path / f"out-{name}" / "_run.json").read_text())["timing"]
        assert "workers" not in timing  # in-process: the allocator that mattered was the command's own
        seen[name] = timing["allocator"]
        sums[name] = output_checksums(str(tmp_path / f"out-{name}"))
    assert seen["mimalloc"].startswith("mimalloc 3.") and seen["system"] == "system"
    assert sums["mimalloc"] == sums["system"] and sums["system"]
    # `python -m datakit.cli` restarts too (from the top of datakit.cli, before its imports)
    r = subprocess.run([sys.executable, "-m", "datakit.cli", "run", "p.yaml", "--output", "out-m", "--quiet",
                        "--no-report"], cwd=tmp_path, env=base, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "out-m" / "_run.json").read_text())["timing"]["allocator"].startswith("mimalloc 3.")
    assert output_checksums(str(tmp_path / "out-m")) == sums["system"]


def test_module_run_arguments_are_the_ones_after_the_module():
    """`restart_for_module_run` reads the arguments after `-m datakit.cli` (interpreter options before it)."""
    code = ("import json, sys; from datakit import launch; seen = []; "
            "launch.restart_with_worker_allocator = seen.append; launch.restart_for_module_run(); print(json.dumps(seen))")
    out = subprocess.run([sys.executable, "-X", "utf8", "-c", code, "-m", "datakit.cli", "run"], capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout) == []  # `-m` here is an argument of `-c`, not the interpreter's option
    import unittest.mock as mock

    seen: list = []
    argv = [sys.executable, "-X", "utf8", "-B", "-m", "datakit.cli", "run", "p.yaml", "--workers", "1"]
    with mock.patch.object(sys, "orig_argv", argv), mock.patch.object(launch, "restart_with_worker_allocator", seen.append):
        launch.restart_for_module_run()
        argv[5] = "datakit.cli.demo"  # another module of the package: not the command
        launch.restart_for_module_run()
    assert seen == [["run", "p.yaml", "--workers", "1"]]
