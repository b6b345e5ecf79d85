"""The local scratch folder a killed object-store run left on this host goes at the next run of any kind.

Found in an operations review: README says "after a SIGKILL the next run on that host removes it", but
only the next run with an object-store output swept them; a SIGKILLed S3 run's 5 MB scratch folder
survived a following local-output run.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys

from datakit import Pipeline
from datakit.io import tempwork
from tests.eventgen import make_event, write_jsonl


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)


def test_a_local_output_run_sweeps_a_killed_runs_scratch(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAKIT_CACHE_DIR", str(tmp_path / "cache"))
    killed = tmp_path / "cache" / "work" / "0123456789abcdef"
    (killed / "part").mkdir(parents=True)
    (killed / "part" / "spill.arrows").write_bytes(b"x" * 1000)
    (killed / ".owner.json").write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname(),
                                                    "run_id": "0123456789abcdef"}))
    alive = tmp_path / "cache" / "work" / "fedcba9876543210"  # a run still going (this process): kept
    alive.mkdir()
    (alive / ".owner.json").write_text(json.dumps({"pid": tempwork.os.getpid(), "host": socket.gethostname()}))
    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(10)])
    (Pipeline("p").input(str(tmp_path / "logs")).add({"kind": "ingest"})
     .output(str(tmp_path / "out"), format="parquet", shards=1).run(workers=1))
    assert (tmp_path / "out" / "_SUCCESS").exists()
    assert not killed.exists() and alive.exists()
