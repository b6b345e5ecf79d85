"""Local engine vs Spark local[2] on the quickstart pipeline, same input: rows/s of each, side by side.

What it measures: wall time of `Pipeline.run` on synthetic editor logs
(`datakit.synth`), for the local engine (process pool, `--workers`) and for
Spark on `local[2]` (a warm session: start-up is reported separately, since a
cluster job pays it once per run, not per stage). Both outputs are checked to
be byte-identical (manifest checksums) before any number is printed.

Rows/s counts input events (the ingest stage's rows_in). The machine is shared,
so numbers vary run to run; read the ratio, not the absolute value.

Usage: .venv/bin/python benchmarks/engines.py [--events 20000] [--workers 2] [--repeat 1]
"""
from __future__ import annotations

import os
import sys

# this folder holds a benchmarks/tokenize.py that would shadow the stdlib module
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def quickstart(logs: Path, out: Path):
    """The quickstart pipeline (pipelines/quickstart.yaml when present, else its stages inline)."""
    from datakit import Pipeline

    yaml_path = ROOT / "pipelines" / "quickstart.yaml"
    if yaml_path.exists():
        p = Pipeline.from_yaml(yaml_path)
        cfg = p.config
        if cfg.input is not None:
            cfg.input.path = str(logs / "dt=*" / "*.jsonl.zst")
        # consent lists, eval sets etc. resolve relative to the pipeline file; point opt-outs at our data
        stages = []
        for s in cfg.stages:
            if s.kind == "consent" and getattr(s, "optouts", None):
                s = s.model_copy(update={"optouts": str(logs / "optouts.parquet")})
            stages.append(s)
        cfg.stages = stages
        return p, str(out)
    p = (Pipeline("quickstart", seed=0)
         .input(str(logs / "dt=*" / "*.jsonl.zst"))
         .add({"kind": "ingest"})
         .add({"kind": "consent", "optouts": str(logs / "optouts.parquet")})
         .add({"kind": "extract", "kinds": ["code", "fim", "sft", "preference"]})
         .add({"kind": "dedup", "exact": True, "minhash": {"threshold": 0.8}})
         .output(str(out), shards=4))
    return p, str(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="runs per engine (best time kept)")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder")
    args = ap.parse_args()

    from datakit.engines.spark_session import get_session
    from datakit.io.sinks import output_checksums
    from datakit.synth.generator import generate

    tmp = Path(tempfile.mkdtemp(prefix="datakit-bench-engines-"))
    try:
        logs = tmp / "logs"
        generate(logs, events=args.events, seed=0, days=3, rows_per_part=max(1000, args.events // 8))
        results = {}
        for engine, opts in (("local", {"workers": args.workers}), ("spark", {"master": "local[2]"})):
            if engine == "spark":
                t = time.perf_counter()
                get_session("local[2]")
                results["spark_startup_s"] = round(time.perf_counter() - t, 2)
            best = None
            for r in range(args.repeat + (1 if engine == "spark" else 0)):  # spark: one warm-up run
                p, out = quickstart(logs, tmp / f"out-{engine}-{r}")
                t = time.perf_counter()
                res = p.run(engine=engine, output=out, **opts)
                dt = time.perf_counter() - t
                if engine == "spark" and r == 0 and args.repeat > 0:
                    results["spark_first_run_s"] = round(dt, 2)
                    continue
                best = dt if best is None else min(best, dt)
                rows = res.stages[0]["rows_in"]
                results[engine] = {"seconds": round(best, 2), "rows_in": rows, "rows_per_s": round(rows / best),
                                   "checksums": output_checksums(out)}
        same = results["local"]["checksums"] == results["spark"]["checksums"]
        lr, sr = results["local"]["rows_per_s"], results["spark"]["rows_per_s"]
        print(f"quickstart pipeline, {results['local']['rows_in']} input rows, "
              f"{os.cpu_count()} cores (shared machine)")
        print(f"{'engine':<28}{'seconds':>10}{'rows/s':>12}")
        print(f"{'local (workers=%d)' % args.workers:<28}{results['local']['seconds']:>10}{lr:>12}")
        print(f"{'spark local[2] (warm)':<28}{results['spark']['seconds']:>10}{sr:>12}")
        print(f"spark/local throughput ratio: {sr / lr:.2f}x   session start: {results['spark_startup_s']} s, "
              f"first (cold) run: {results.get('spark_first_run_s')} s")
        print(f"outputs byte-identical: {same}")
        summary = {k: ({kk: vv for kk, vv in v.items() if kk != "checksums"} if isinstance(v, dict) else v)
                   for k, v in results.items()}
        summary.update(events=args.events, identical=same)
        out_dir = ROOT / "benchmarks" / "results"
        out_dir.mkdir(exist_ok=True)
        (out_dir / "engines.json").write_text(json.dumps(summary, indent=2) + "\n")
        return 0 if same else 1
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
