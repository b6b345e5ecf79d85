"""`datakit contamination-check` against a ~1 GB indexed dataset, timed through the CLI.

    PYTHONPATH=. .venv/bin/python benchmarks/decontam_index_check.py --mb 1024 \\
        --eval humaneval --eval mbpp=/data/sanitized-mbpp.json --keep /tmp/dk-index-1g

What "1 GB" means: bytes of input text (the UTF-8 text of the documents'
segments), not the Parquet files' size and not the index's. The dataset is
synthetic code-like text (`benchmarks/decontam.py: synth_code_corpus`: Zipf
tokens of a 60k-word code vocabulary, so nearly every 13-gram is distinct, the
worst case for index size) written as training records, plus 10 HumanEval items
planted verbatim so the check has something to find.

Steps, each a new process as a user runs them: `datakit build-index DATA`
(writes DATA/_ngram_index), then `datakit contamination-check --data DATA
--eval ...` three times (the folder's index is used by itself). Reported: wall
clock of the whole command (interpreter start, imports, numba cache load, eval
table, reference corpus, index probes) best of 3, CPU of the child, the exit
code and items found; the machine's load average, since the machine is shared.
`--profile` also runs the check in process under cProfile and prints the top
functions. `--keep DIR` keeps (and reuses) the dataset and its index.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests/support/plant.py

import argparse
import importlib.util
import json
import os
import random
import resource
import shutil
import subprocess
import tempfile
import time

import pyarrow.parquet as pq


def _bench_module():
    """benchmarks/decontam.py (the corpus generator and the records writer), loaded by path."""
    spec = importlib.util.spec_from_file_location("_decontam_bench", Path(__file__).with_name("decontam.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def make_dataset(root: Path, mb: float) -> int:
    """The synthetic dataset with 10 planted HumanEval items; returns the input text bytes."""
    from tests.support.plant import plant

    bench = _bench_module()
    root.mkdir(parents=True, exist_ok=True)
    nbytes = bench.synth_code_corpus(root, mb)
    rows = bench.he_rows()
    rng = random.Random(3)
    leaks = [plant(rows[i], "exact", rng) for i in range(0, 164, 17)]
    pq.write_table(bench.records(leaks, "leak"), str(root / "part-leaks.parquet"))
    nbytes += sum(len(x.encode()) for x in leaks)
    (root / "_bench.json").write_text(json.dumps({"text_bytes": nbytes, "planted": len(leaks)}))
    return nbytes


def timed(cmd: list[str]) -> tuple[float, float, int, str]:
    """(wall s, CPU s of the child, exit code, stderr tail) of one command."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return wall, cpu, p.returncode, (p.stderr or "").strip()[-300:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=1024, help="input text size in MB (1e6 bytes)")
    ap.add_argument("--eval", action="append", default=[], help="eval spec(s) as the CLI takes them (default humaneval)")
    ap.add_argument("--keep", default=None, help="folder to build (or reuse) the dataset and its index in")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="also profile the check in process (cProfile)")
    args = ap.parse_args()
    evals = args.eval or ["humaneval"]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dk-index-check-"))
    data = work / "data"
    py = [sys.executable, "-m", "datakit.cli"]
    try:
        meta = data / "_bench.json"
        if meta.exists():
            nbytes = json.loads(meta.read_text())["text_bytes"]
            print(f"reusing {data}: {nbytes / 1e9:.3f} GB of input text")
        else:
            t = time.perf_counter()
            nbytes = make_dataset(data, args.mb)
            print(f"dataset: {nbytes / 1e9:.3f} GB of input text in {data} ({time.perf_counter() - t:.0f} s)")
        if not (data / "_ngram_index" / "index.json").exists():
            wall, cpu, rc, err = timed(py + ["build-index", str(data)])
            print(f"build-index: {wall:.0f} s wall, {cpu:.0f} s CPU of its processes, exit {rc} {err}")
        idx_bytes = sum(f.stat().st_size for f in (data / "_ngram_index").iterdir() if f.is_file())
        print(f"index: {idx_bytes / 1e6:.0f} MB")
        cmd = py + ["contamination-check", "--data", str(data), "--json", str(work / "report.json"), "-q"]
        for e in evals:
            cmd += ["--eval", e]
        runs = [timed(cmd) for _ in range(args.repeat)]
        rep = json.loads((work / "report.json").read_text())
        found = {e["name"]: e["contaminated_items"] for e in rep["evals"]}
        mode = {d["mode"] for d in rep["data"]}
        best = min(runs)
        print(f"contamination-check --eval {' --eval '.join(evals)}: best {best[0]:.2f} s wall "
              f"(runs: {', '.join(f'{w:.2f}' for w, _, _, _ in runs)}), {best[1]:.2f} s CPU, exit {best[2]}, "
              f"mode {'/'.join(sorted(mode))}, contaminated items {found}; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        if args.profile:
            import cProfile
            import pstats

            from datakit.stages.decontaminate.check import check

            prof = cProfile.Profile()
            t = time.perf_counter()
            prof.enable()
            check(str(data), evals)
            prof.disable()
            print(f"in-process check: {time.perf_counter() - t:.2f} s")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
