"""`datakit warmup` says nothing about a pipeline the user never wrote.

Found in a review of the installed wheel: `datakit warmup` (the documented step after `pip install` and
before `venv-pack`) printed `WARNING datakit.pipeline: warmup: stage 4 (decontaminate): drops records
after stage 3 (dedup) ...; put decontaminate before dedup`, a lint of its own internal pipeline."""
from __future__ import annotations

import logging

from datakit import synth
from datakit.cli.warmup import warmup_pipeline


def test_the_warmup_pipeline_compiles_without_a_warning(tmp_path, caplog):
    synth.generate(str(tmp_path / "logs"), events=30, seed=0)
    pipeline = warmup_pipeline(tmp_path)
    with caplog.at_level(logging.WARNING):
        pipeline.compile()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    # it still declares every stage with kernels (dedup's MinHash/LSH, decontamination) and the index
    kinds = [s.kind for s in pipeline.config.stages]
    assert {"dedup", "decontaminate"} <= set(kinds) and pipeline.config.output.index


CHECK_WITHOUT_INDEX = '''
import json, sys
from numba.core import event
from datakit import Pipeline, synth
from datakit.cli import app
root = sys.argv[1]
synth.generate(root + "/logs", events=60, seed=1)
Pipeline("records", seed=0).input(root + "/logs/dt=*/*.jsonl.zst").add({"kind": "ingest"}).add(
    {"kind": "extract", "kinds": ["code"]}).output(root + "/records", format="parquet").run(engine="local", workers=1)
with event.install_recorder("numba:compile") as rec:
    try:
        app(["contamination-check", "--data", root + "/records", "--eval", "humaneval", "-q"], standalone_mode=False)
    except SystemExit:
        pass
print(json.dumps(sorted({e.data["dispatcher"].py_func.__name__ for _, e in rec.buffer if e.is_start})))
'''


def test_after_warmup_a_check_of_a_dataset_without_an_index_compiles_nothing(tmp_path):
    """Found in a review of the installed wheel: after `datakit warmup`, the first `contamination-check` of a
    dataset without `_ngram_index` still compiled the scan's parallel counting kernel (`_count_hits`, ~3 s)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import datakit

    shutil.copytree(Path(datakit.__file__).parent, tmp_path / "pkg" / "datakit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkg")}
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("DATAKIT_JIT_CACHE", None)
    subprocess.run([sys.executable, "-c", "from datakit.cli.warmup import warm_up; warm_up(events=100)"],
                   env=env, check=True, capture_output=True, timeout=600, cwd=tmp_path)
    out = subprocess.run([sys.executable, "-c", CHECK_WITHOUT_INDEX, str(tmp_path / "job")], env=env,
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", "compiled after warmup: " + out.stdout[-500:]
