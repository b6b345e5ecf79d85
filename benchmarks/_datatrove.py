"""HuggingFace datatrove, the reference several benchmarks compare against, in a venv of its own.

Why a separate venv: datatrove pins its own dependency versions, and installing it into the
project's environment would change what the library is tested with. The venv is created once
under ~/.cache/datakit/bench-venvs/ and reused by every benchmark that imports this module
(dedup_vs_datatrove.py: MinHash pipeline; tokenize_bench.py: DocumentTokenizer).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DATATROVE = "datatrove==0.10.1"
# xxhash<4: datatrove 0.10.1 passes str, which xxhash 4 refuses; tokenizers pinned to the project's
# version so both sides of the tokenize comparison run the same Rust tokenizer
PACKAGES = [DATATROVE, "xxhash<4", "regex", "tokenizers==0.23.3", "orjson"]


def datatrove_python() -> Path:
    """The interpreter of datatrove's own venv (created once, outside the project's environment)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "datakit" / "bench-venvs"
    venv = base / DATATROVE.replace("==", "-")
    py = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        print(f"creating {venv} ({DATATROVE}) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *PACKAGES], check=True)
        (venv / ".installed").touch()
    return py
