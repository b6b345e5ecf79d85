"""Spark `local[2]` vs the local engine on the quickstart pipeline, same input, same machine.

What it measures, the same way for both engines: `datakit run pipelines/quickstart.yaml`
(inputs pointed at synthetic logs from `datakit.synth`) as a user runs it, one process per run:
wall time, CPU seconds and peak summed PSS (proportional set size) of the whole process tree (local: the driver and its
pool workers; Spark: the driver, the JVM and its Python workers), sampled by `_proc.run_measured`.
One warm-up run per engine (numba kernel cache, JVM class data), then --runs runs alternated
local / spark, medians kept. Each run's `_run.json` splits the wall clock: `engine_start` (Spark:
starting the JVM and the session, which a scheduled job pays once per run) and `stages`, so the
ratio is given both for the whole process and for the stages alone. Both outputs are checked to
be byte-identical (output checksums) before anything is written.

Rows/s counts input events (the ingest stage's rows_in). The machine may be shared: the load
average is recorded; read the ratio, not the absolute value.

Usage: .venv/bin/python benchmarks/engines.py [--events 10000] [--workers 2] [--runs 3]
"""
from __future__ import annotations

import os
import sys

# this folder holds a benchmarks/tokenize.py that would shadow the stdlib module
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(1, HERE)

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from _proc import run_measured  # noqa: E402
from _report import comparison, write  # noqa: E402

ROOT = Path(HERE).parent


def quickstart_yaml(logs: Path, dest: Path) -> Path:
    """pipelines/quickstart.yaml with its input and opt-out list pointed at `logs` (all else as shipped)."""
    import yaml

    cfg = yaml.safe_load((ROOT / "pipelines" / "quickstart.yaml").read_text())
    cfg["input"]["path"] = str(logs / "dt=*" / "*.jsonl.zst")
    for s in cfg["stages"]:
        if s["kind"] == "consent" and s.get("optouts"):
            s["optouts"] = str(logs / "optouts.parquet")
    # the rest names no file (eval sets from the registry, the built-in tokenizer): the copy can live anywhere
    dest.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=2, help="local engine workers (Spark runs local[2])")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per engine (median), after --warmup each")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per engine first (kernel caches, JVM)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the temp folder")
    args = ap.parse_args()

    from datakit.io.sinks import output_checksums
    from datakit.synth.generator import generate

    tmp = Path(tempfile.mkdtemp(prefix="datakit-bench-engines-"))
    try:
        logs = tmp / "logs"
        generate(logs, events=args.events, seed=0, days=3, rows_per_part=max(1000, args.events // 8))
        pipe = quickstart_yaml(logs, tmp / "quickstart.yaml")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmds = {"local": ["--workers", str(args.workers)],
                "spark": ["--engine", "spark", "--master", "local[2]",
                          "--conf", f"spark.local.dir={tmp / 'spark-local'}"]}
        runs: dict[str, list[dict]] = {"local": [], "spark": []}
        checksums: dict[str, dict] = {}

        def once(engine: str, n: int) -> dict:
            out = tmp / f"out-{engine}-{n}"
            r, m = run_measured([sys.executable, "-m", "datakit.cli", "run", str(pipe), "--output", str(out),
                                 "--no-report", "--quiet", *cmds[engine]], env=env, cwd=str(ROOT))
            if r.returncode:
                raise SystemExit(f"{engine} run failed: {r.stderr[-3000:]}")
            run = json.loads((out / "_run.json").read_text())
            checksums[engine] = output_checksums(str(out))
            shutil.rmtree(out, ignore_errors=True)
            print(f"  {engine} run {n}: wall {m['wall_seconds']:.1f}s, CPU {m['cpu_seconds']:.1f}s, tree peak "
                  f"{m['tree_peak_mb']:.0f} MB; parts {run['timing']['parts']}", flush=True)
            return {**m, "rows_in": run["stages"][0]["rows_in"], "parts": run["timing"]["parts"],
                    "stage_seconds": {s["name"]: s["seconds"] for s in run["stages"]},
                    "setup_seconds": {s["name"]: s.get("setup_seconds", 0.0) for s in run["stages"]}}

        load_start = os.getloadavg()[0]
        for w in range(args.warmup):
            for engine in runs:
                once(engine, -1 - w)  # warm-up
        from datakit.engines import spark_cds

        spark_cds.wait_for_dump()  # the warm-up's driver JVM may still be writing its class-data archive
        for i in range(args.runs):  # alternated: load on the shared machine hits both alike
            for engine in runs:
                runs[engine].append(once(engine, i + 1))
        load = f"{load_start:.1f}-{os.getloadavg()[0]:.1f}"
        same = checksums["local"] == checksums["spark"]
        if not same:
            print("outputs differ between the engines: no numbers written")
            return 1
        rows = runs["local"][0]["rows_in"]

        def med(engine: str, key) -> float:
            return statistics.median(key(r) for r in runs[engine])

        wall = {e: med(e, lambda r: r["wall_seconds"]) for e in runs}
        cpu = {e: med(e, lambda r: r["cpu_seconds"]) for e in runs}
        stages = {e: med(e, lambda r: r["parts"]["stages"]) for e in runs}
        start = {e: med(e, lambda r: r["parts"]["engine_start"]) for e in runs}
        peak = {e: max(r["tree_peak_mb"] for r in runs[e]) for e in runs}
        ref = f"datakit local engine ({args.workers} workers)"
        work = "byte-identical output (checksums of every file)"
        cond = (f"quickstart pipeline (NER on), {args.events:,} synthetic events, `datakit run` per run, "
                f"median of {args.runs} alternated runs after {args.warmup} warm-up each, load average {load}")
        comps = [
            comparison("Spark local[2] vs local engine, quickstart (wall, whole process)", rows / wall["spark"],
                       rows / wall["local"], "events/s", ref, work,
                       f"{cond}; Spark's includes starting the JVM and session ({start['spark']:.1f}s)"),
            comparison("Spark local[2] vs local engine, quickstart (wall, stages only)", rows / stages["spark"],
                       rows / stages["local"], "events/s", ref, work, f"{cond}; `timing.parts.stages` of _run.json"),
            comparison("Spark local[2] vs local engine, quickstart (CPU, process tree)", rows / cpu["spark"],
                       rows / cpu["local"], "events/CPU-s", ref, work,
                       f"{cond}; CPU seconds of driver + workers (Spark: + JVM)"),
        ]
        print(f"quickstart, {rows} input events, {os.cpu_count()} cores, load average {load}")
        for e in runs:
            print(f"  {e:6s} wall {wall[e]:7.1f}s  stages {stages[e]:7.1f}s  engine start {start[e]:5.1f}s  "
                  f"CPU {cpu[e]:7.1f}s  tree peak {peak[e]:6.0f} MB")
        print(f"  spark/local: wall {wall['spark'] / wall['local']:.2f}x, stages {stages['spark'] / stages['local']:.2f}x, "
              f"CPU {cpu['spark'] / cpu['local']:.2f}x (slower when > 1); outputs byte-identical: {same}")
        for e in runs:
            st = {k: round(statistics.median(r["stage_seconds"][k] for r in runs[e]), 2) for k in runs[e][0]["stage_seconds"]}
            print(f"  {e} stage seconds (median): {st}")
        write("engines", comps, {"events": args.events, "rows_in": rows, "load_average": load,
                                 "wall_seconds": wall, "stages_seconds": stages, "engine_start_seconds": start,
                                 "cpu_seconds": cpu, "tree_peak_mb": peak,
                                 "spark_over_local": {"wall": round(wall["spark"] / wall["local"], 2),
                                                      "stages": round(stages["spark"] / stages["local"], 2),
                                                      "cpu": round(cpu["spark"] / cpu["local"], 2)},
                                 "runs": runs}, args.json)
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
