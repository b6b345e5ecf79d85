"""The dedup stage vs HuggingFace datatrove's MinHash pipeline: same records, same LSH, one core each.

Like for like:
- the same records (1-4 KB windows of real Python source, ~20% exact or lightly edited copies,
  benchmarks/dedup_speed.records), as Parquet for us and JSON Lines for datatrove;
- the same MinHash/LSH shape: 14 bands x 8 rows = 112 permutations, word 5-grams split on
  whitespace (datatrove gets a whitespace word tokenizer instead of its NLTK one, which would
  download a model), threshold 0.8 for our verification;
- the same hash: 32-bit xxhash on both sides (datatrove's `HashConfig(precision=32, hash_fc="xxhash")`;
  its default 64-bit precision doubles its signature and bucket data, which favoured ours);
- one process each: ours through the command's own entry (`datakit run --workers 1`: the allocator
  restart, one BLAS thread and the end without teardown, as the console script), datatrove's four steps
  (signatures, buckets, cluster, filter) with `LocalPipelineExecutor(tasks=1, workers=1)`;
- per process, measured the same way by this script for both sides: wall time from start to exit
  and CPU seconds (user + system of the process tree, from getrusage of the waited child, so a
  loaded shared machine slows the wall clock but not the CPU count), median of --runs after one
  warm-up each, alternated; and peak memory of the whole process tree, imports included: the
  larger of the job's own VmHWM (with any exited child's, see PEAK) and the tree's summed PSS
  sampled every 20 ms (`_proc.py`). Ours runs in one process; datatrove forks step processes
  beside its main one (~47 MB RSS each, nearly all pages shared with the parent: by PSS the
  tree's sum stays below the main process's own peak, so its VmHWM is the number); and, as a
  row of its own, the peak of the tree's summed anonymous PSS (heap, arenas, stacks: the memory a
  process owns, without the mapped library files that RSS also counts and whose resident count
  moves with the page cache), sampled the same way for both sides;
- the same steps: ours runs with `--no-report` (datatrove draws no HTML report);
- the same work: the removed sets are compared (overlap, and how many each removes).

datatrove lives in its own venv that this script creates on first use (pip install
datatrove==0.10.1 "xxhash<4" (datatrove 0.10.1 passes str, which xxhash 4 refuses) regex tokenizers orjson), so it never touches the project's pinned environment.

Usage: .venv/bin/python benchmarks/dedup_vs_datatrove.py [--records 20000] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))
sys.path.insert(1, str(HERE))

from _datatrove import DATATROVE, datatrove_python  # noqa: E402
from _proc import run_measured  # noqa: E402
from _report import comparison, write  # noqa: E402

BANDS, ROWS, NGRAM = 14, 8, 5
FIXED_RECORDS = 100  # ours on this many records: the peak a run pays whatever its size

# peak RSS of a job process in KB: VmHWM (this exec'd image), not ru_maxrss, which a child started by
# (v)fork + exec inherits from its parent: every job reported at least this script's own RSS (~440 MB
# at 20k records, so datatrove's 67 MB read as 440); plus the job's own children, if any
PEAK = ("peak = max(int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1]), "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")

# runs inside datatrove's venv: argv = jsonl dir, work dir; prints seconds, peak RSS and removed ids
DATATROVE_JOB = textwrap.dedent('''
    import json, resource, sys, time
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                   MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Whitespace(WordTokenizer):
        def word_tokenize(self, text): return text.split()
        def sent_tokenize(self, text): return [text]
        def span_tokenize(self, text): return [(0, len(text))]

    src, work = sys.argv[1], sys.argv[2]
    cfg = MinhashConfig(n_grams=%(ngram)d, num_buckets=%(bands)d, hashes_per_bucket=%(rows)d, seed=1,
                        hash_config=HashConfig(precision=32, hash_fc="xxhash"))
    t0 = time.perf_counter()
    steps = [
        [JsonlReader(src), MinhashDedupSignature(output_folder=f"{work}/sigs", config=cfg, language=Whitespace())],
        [MinhashDedupBuckets(input_folder=f"{work}/sigs", output_folder=f"{work}/buckets", config=cfg)],
        [MinhashDedupCluster(input_folder=f"{work}/buckets", output_folder=f"{work}/remove", config=cfg,
                             save_cluster_id=True)],
        [JsonlReader(src), MinhashDedupFilter(input_folder=f"{work}/remove", load_cluster_ids=True,
                                              exclusion_writer=JsonlWriter(f"{work}/removed", compression=None)),
         JsonlWriter(f"{work}/kept", compression=None)],
    ]
    for i, pipe in enumerate(steps):
        n = %(bands)d if i == 1 else 1
        LocalPipelineExecutor(pipeline=pipe, tasks=n, workers=1, logging_dir=f"{work}/logs{i}",
                              skip_completed=False).run()
    secs = time.perf_counter() - t0
    import glob
    removed = sorted(json.loads(l)["id"] for f in glob.glob(f"{work}/removed/*") for l in open(f))
    in_clusters = sorted(d["id"] for f in glob.glob(f"{work}/removed/*") + glob.glob(f"{work}/kept/*")
                         for d in map(json.loads, open(f)) if d["metadata"].get("minhash_cluster_id", -1) != -1)
    %(peak)s
    print(json.dumps({"seconds": secs, "peak_rss_mb": peak / 1024, "removed": removed, "in_clusters": in_clusters}))
''') % {"ngram": NGRAM, "bands": BANDS, "rows": ROWS, "peak": PEAK}

# runs the `datakit` command's own entry (`datakit.launch.command`: the allocator restart, one BLAS thread,
# the CLI, the end without teardown) in a fresh interpreter, and prints its seconds and peak RSS from an exit
# handler: the command ends through `atexit` handlers and then the process (`cli._exit_after_command`), so a
# line after `command()` would never run. The restart (execv of this same command line) runs this job again
# in the new image, where the clock starts.
OURS_JOB = textwrap.dedent('''
    import atexit, json, resource, sys, time
    t0 = time.perf_counter()

    def report():
        secs = time.perf_counter() - t0
        %(peak)s
        print(json.dumps({"seconds": secs, "peak_rss_mb": peak / 1024}), flush=True)

    atexit.register(report)
    sys.argv = ["datakit"] + sys.argv[1:]
    from datakit.launch import command
    command()
''') % {"peak": PEAK}


# runs in a fresh interpreter of ours: the RSS (MB) the dedup process holds before any data, step by step in
# the order a run loads them, so the fixed part of the peak is split by library: what a target in MB has to
# take out (the 2x-datatrove target is below the sum of the first two lines: the libraries, not the data)
FLOOR_JOB = textwrap.dedent('''
    import json
    def rss():
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS:")).split()[1]) / 1024
    steps = [["interpreter", rss()]]
    import numpy, pyarrow, pyarrow.compute, pyarrow.parquet
    steps.append(["numpy + pyarrow", rss()])
    import polars as pl
    pl.from_arrow(pyarrow.table({"a": [1, 2, 2]})).lazy().group_by("a").agg(pl.len()).collect()
    steps.append(["+ polars (import, a first query)", rss()])
    import numba
    steps.append(["+ numba (import)", rss()])
    from datakit.stages.dedup.minhash import minhash_signatures
    minhash_signatures(pyarrow.array(["a b c d e f g h"] * 3), num_perm=112, ngram=5)
    steps.append(["+ dedup kernels (loaded from the cache)", rss()])
    print(json.dumps(steps))
''')


def peaks(run: dict) -> dict:
    """`peak_rss_mb`: the larger of the job's own VmHWM (with its exited children's) and the sampled tree PSS."""
    run["vmhwm_mb"] = run["peak_rss_mb"]
    run["peak_rss_mb"] = max(run["vmhwm_mb"], run["tree_peak_mb"])
    return run


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def measured(cmd: list[str], **kw) -> tuple[subprocess.CompletedProcess, float, float, float, float]:
    """Run one side's process: its wall seconds, the CPU seconds, and the peak summed PSS of its process
    tree, all of it and its anonymous part (`_proc.run_measured`, the same for both sides).

    Why from here and not inside each job: both sides are then timed by one clock over the same
    span (interpreter start to exit, imports included), and CPU time still compares runs made
    while other work shares the cores.
    """
    r, m = run_measured(cmd, **kw)
    return r, m["wall_seconds"], m["cpu_seconds"], m["tree_peak_mb"], m["tree_peak_anon_mb"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per side (median), after one warm-up each")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from dedup_speed import records
    from datakit.contracts import TRAINING_RECORD_V1

    dt_py = datatrove_python()
    rows = records(args.records)
    with tempfile.TemporaryDirectory(prefix="datakit-bench-dt-") as tmp:
        t = Path(tmp)
        (t / "parquet").mkdir()
        (t / "jsonl").mkdir()
        pq.write_table(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1), t / "parquet" / "part-0.parquet")
        with open(t / "jsonl" / "part-0.jsonl", "w") as fh:
            for r in rows:
                fh.write(json.dumps({"id": r["doc_id"], "text": r["segments"][0]["text"]}) + "\n")
        pipeline = {"name": "bench-dedup", "seed": 0,
                    "input": {"path": str(t / "parquet"), "format": "parquet", "schema": "training_record.v1"},
                    "stages": [{"kind": "dedup", "exact": True,
                                "minhash": {"threshold": 0.8, "num_perm": BANDS * ROWS, "bands": BANDS, "rows": ROWS,
                                            "ngram": NGRAM, "shingle": "word"}}],
                    "output": {"path": str(t / "out"), "format": "parquet", "shards": 1}}
        (t / "p.yaml").write_text(yaml.safe_dump(pipeline))
        env = {**os.environ, "PYTHONPATH": str(HERE.parent)}

        def ours() -> dict:
            import shutil
            shutil.rmtree(t / "out", ignore_errors=True)
            # --no-report: datatrove draws no plots either (the HTML report is a step after the commit)
            r, wall, cpu, tree, anon = measured([sys.executable, "-c", OURS_JOB, "run", str(t / "p.yaml"),
                                                 "--workers", "1", "--no-report"], env=env)
            if r.returncode:
                raise SystemExit(f"datakit run failed: {r.stderr[-3000:]}")
            return peaks({**last_json(r.stdout), "wall_seconds": wall, "cpu_seconds": cpu, "tree_peak_mb": tree,
                          "anon_peak_mb": anon})

        def theirs() -> dict:
            import shutil
            shutil.rmtree(t / "dt", ignore_errors=True)
            r, wall, cpu, tree, anon = measured([str(dt_py), "-c", DATATROVE_JOB, str(t / "jsonl"), str(t / "dt")])
            if r.returncode:
                raise SystemExit(f"datatrove failed: {r.stderr[-3000:]}")
            return peaks({**last_json(r.stdout), "wall_seconds": wall, "cpu_seconds": cpu, "tree_peak_mb": tree,
                          "anon_peak_mb": anon})

        import statistics
        res = {"ours": [], "datatrove": []}
        load_start = os.getloadavg()[0]
        for side, fn in (("ours", ours), ("datatrove", theirs)):
            fn()  # warm-up (kernel cache, page cache)
        for _ in range(args.runs):  # alternated, so load on the shared machine hits both alike
            res["ours"].append(ours())
            res["datatrove"].append(theirs())
        load = f"{load_start:.1f}-{os.getloadavg()[0]:.1f}"  # wall time is only comparable at a similar load
        dt_removed = set(res["datatrove"][-1]["removed"])
        dt_grouped = set(res["datatrove"][-1]["in_clusters"])
        from datakit.io.dataset import read_output  # noqa: E402

        kept = set(read_output(str(t / "out"))["doc_id"].to_pylist())
        our_removed = {r["doc_id"] for r in rows} - kept
        # the documents each side put in a duplicate group: removed ones plus the copy kept for them
        drop_logs = [f for f in (t / "out").rglob("*.parquet") if "dropped" in str(f.relative_to(t / "out"))]
        detail = {r["key"]: r["detail"] for f in drop_logs for r in pq.read_table(f).to_pylist()}
        our_grouped = our_removed | {v for k, v in detail.items() if k in our_removed and v}
        for x in res.values():
            for r in x:
                r.pop("removed", None), r.pop("in_clusters", None)
        # ours' fixed cost: the same job on FIXED_RECORDS records (imports, kernels loaded from the cache,
        # polars for the barriers), so the peak splits into what any run pays and what the data adds
        (t / "parquet").joinpath("part-0.parquet").unlink()
        pq.write_table(pa.Table.from_pylist(rows[:FIXED_RECORDS], schema=TRAINING_RECORD_V1),
                       t / "parquet" / "part-0.parquet")
        fixed_run = ours()
        fixed, fixed_anon = fixed_run["peak_rss_mb"], fixed_run["anon_peak_mb"]
    floor_run = subprocess.run([sys.executable, "-c", FLOOR_JOB], env=env, capture_output=True, text=True, check=True)
    floors = last_json(floor_run.stdout)
    floor_text = ", ".join(f"{k} {v:.0f}" for k, v in floors)  # [[step, MB], ...] in load order
    sec = {k: statistics.median(x["wall_seconds"] for x in v) for k, v in res.items()}
    cpu = {k: statistics.median(x["cpu_seconds"] for x in v) for k, v in res.items()}
    rss = {k: max(x["peak_rss_mb"] for x in v) for k, v in res.items()}
    anon = {k: max(x["anon_peak_mb"] for x in v) for k, v in res.items()}
    both = len(our_grouped & dt_grouped)
    same = (f"removed: ours {len(our_removed)}, datatrove {len(dt_removed)}; documents in a duplicate group: "
            f"ours {len(our_grouped)}, datatrove {len(dt_grouped)}, both {both} "
            f"(Jaccard {both / max(1, len(our_grouped | dt_grouped)):.3f}); ours verifies Jaccard >= 0.8 on raw "
            f"text, datatrove keeps every LSH candidate pair and normalizes text first")
    runs = f"median of {args.runs} alternated runs after 1 warm-up each"
    cond = (f"{len(rows)} records, {BANDS}x{ROWS} LSH, 32-bit xxhash, word {NGRAM}-grams, 1 process each; ours with "
            "mimalloc (as the command restarts itself), datatrove with the interpreter's malloc; ours reads Parquet "
            "once and also drops exact duplicates first, datatrove parses the JSON Lines twice (signatures, filter)")
    comps = [comparison("dedup stage vs datatrove MinHash pipeline (speed, CPU)", len(rows) / cpu["ours"],
                        len(rows) / cpu["datatrove"], "records/CPU-s", DATATROVE, same,
                        f"{cond}, CPU seconds of the whole process tree, {runs}"),
             comparison("dedup stage vs datatrove MinHash pipeline (speed, wall)", len(rows) / sec["ours"],
                        len(rows) / sec["datatrove"], "records/s", DATATROVE, same,
                        f"{cond}, wall time of the whole process, {runs}; load average {load}"),
             comparison("dedup stage vs datatrove MinHash pipeline (peak RSS)", rss["ours"], rss["datatrove"], "MB",
                        DATATROVE, same, f"{cond}, largest of {args.runs} runs; ours on {FIXED_RECORDS} records "
                        f"(imports and kernels, almost no data): {fixed:.0f} MB; RSS of ours' libraries before any data "
                        f"(a fresh interpreter, MB, cumulative): {floor_text}", higher_is_better=False),
             comparison("dedup stage vs datatrove MinHash pipeline (peak private memory)", anon["ours"],
                        anon["datatrove"], "MB", DATATROVE, same,
                        f"{cond}, largest of {args.runs} runs of the process tree's summed anonymous PSS (heap, "
                        f"arenas, stacks; not the mapped library files that RSS also counts), sampled from /proc the "
                        f"same way on both sides, so a peak between two samples can be missed; ours on "
                        f"{FIXED_RECORDS} records: {fixed_anon:.0f} MB", higher_is_better=False)]
    print(f"records: {len(rows)}; {cond}")
    for k in ("ours", "datatrove"):
        print(f"  {k:9s} {cpu[k]:7.2f} CPU s  {sec[k]:7.2f} s wall  peak RSS {rss[k]:7.0f} MB  "
              f"private (anonymous) {anon[k]:7.0f} MB")
    print(f"  speed ratio {cpu['datatrove'] / cpu['ours']:.2f}x by CPU, {sec['datatrove'] / sec['ours']:.2f}x by wall "
          f"(load average {load}); memory ratio (theirs/ours) {rss['datatrove'] / rss['ours']:.2f}x")
    print(f"  ours on {FIXED_RECORDS} records (fixed cost: imports, kernels): peak RSS {fixed:.0f} MB")
    print(f"  ours' libraries before any data (RSS, MB, cumulative): {floor_text}")
    print(f"  {same}")
    write("dedup_vs_datatrove", comps, {"wall_seconds": sec, "cpu_seconds": cpu, "peak_rss_mb": rss,
                                        "anon_peak_mb": anon, "fixed_anon_peak_mb": fixed_anon,
                                        "fixed_peak_rss_mb": {"records": FIXED_RECORDS, "ours": fixed},
                                        "library_rss_mb": floors,
                                        "load_average": load, "runs": res}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
