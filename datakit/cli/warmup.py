"""`datakit warmup`: compile every numba kernel once, into the installation's own cache.

Why: a kernel compiles the first time a process tree needs it (16-21 s for all of them on a
2-core machine), and a fresh container, Spark executor or CI clone starts with no cache. Run
this once where the package is installed - in the Docker build after `pip install`, in the
venv before `venv-pack`, in `make venv` - and every later process loads the kernels instead
(see datakit/jit.py for where the cache lives when the installation is read-only).

How: the same code paths a real run takes, on a tiny synthetic input, in this process (so
the kernels see the argument types of a real run and nothing is pickled to workers): a
pipeline through every stage with kernels (dedup's MinHash/LSH/verification, decontamination),
the n-gram index build, and a contamination check against that index and one that scans the data
(a dataset without an index: its parallel counting kernel, found missing in a review of the wheel).
"""
from __future__ import annotations

import contextlib
import io
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datakit import Pipeline


def warmup_pipeline(root: Path) -> "Pipeline":
    """The pipeline `warm_up` runs on the logs in `root/logs`: every stage with kernels, in the order the
    shipped pipelines use (decontaminate before dedup: the other order earns a warning about the user's
    pipeline, which the user of `datakit warmup` never wrote; found in a review of the installed wheel)."""
    from datakit import Pipeline

    return (Pipeline("warmup", seed=0)
            .input(str(root / "logs" / "dt=*" / "*.jsonl.zst"))
            .add({"kind": "ingest"})
            .add({"kind": "extract", "kinds": ["code", "fim", "sft"]})
            .add({"kind": "decontaminate", "evals": ["humaneval"], "ngram": 13, "mode": "drop"})
            .add({"kind": "dedup", "exact": True, "minhash": {"threshold": 0.8, "num_perm": 128, "ngram": 5}})
            .output(str(root / "out"), format="parquet", shards=1, index=True))


def warm_up(events: int = 200) -> dict[str, float]:
    """Run the kernel paths once; returns wall seconds and the seconds spent compiling."""
    from datakit import synth
    from datakit.jit import compile_seconds, start_compile_timer

    start_compile_timer()
    t0 = time.perf_counter()
    c0 = compile_seconds()
    with tempfile.TemporaryDirectory(prefix="datakit-warmup-") as tmp:
        root = Path(tmp)
        synth.generate(str(root / "logs"), events=events, seed=0)
        warmup_pipeline(root).run(engine="local", workers=1)
        from datakit.cli import app

        for how in ([], ["--no-index"]):  # through the index, and the scan of a dataset that has none
            with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
                app(["contamination-check", "--data", str(root / "out"), "--eval", "humaneval", *how],
                    standalone_mode=False)
    return {"seconds": round(time.perf_counter() - t0, 2), "compile_seconds": round(compile_seconds() - c0, 2)}
