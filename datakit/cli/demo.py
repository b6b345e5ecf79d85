"""`make demo`: synthesize a small editor-log set and run pipelines/quickstart.yaml on the local engine.

Why a module (not a shell script): the same steps run on every machine with only
the venv's Python, and a researcher can read it as a worked example.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: datakit/cli/demo.py -> repo root


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repositories", type=int, default=40,
                    help="multi-file repository projects on top of --events (for pipelines/longctx.yaml, feedback.yaml)")
    ap.add_argument("--pipeline", default=str(ROOT / "pipelines" / "quickstart.yaml"))
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)

    from datakit import Pipeline, synth
    from datakit.cli import _print_stages

    if not Path(args.pipeline).is_file():  # an installed package has no pipelines/ folder
        print(f"error: no pipeline file {args.pipeline}: the demo runs from a source checkout "
              "(`make demo`); elsewhere pass --pipeline FILE", file=sys.stderr)
        return 2

    logs = ROOT / "demo" / "logs"
    marker = logs / synth.SUMMARY_FILE
    made = json.loads(marker.read_text()) if marker.exists() else {}
    if made.get("ordinary_events", made.get("events")) != args.events or made.get("repositories", 0) != args.repositories:
        t0 = time.perf_counter()
        summary = synth.generate(str(logs), events=args.events, seed=args.seed, repositories=args.repositories)
        print(f"synthesized {summary.get('events', args.events)} editor events into {logs} "
              f"({time.perf_counter() - t0:.1f}s)")
    else:
        print(f"reusing synthetic logs in {logs}")
    pipeline = Pipeline.from_yaml(args.pipeline)
    print(f"running {args.pipeline} on the local engine ...")
    result = pipeline.run(engine="local", workers=args.workers, report=True)
    _print_stages(result.stages)
    m = result.manifest or {}
    print(f"\noutput: {result.output_path}")
    print(f"  format={m.get('format')} shards={len(m.get('shards', []))} rows={m.get('rows')} "
          f"in {result.seconds:.1f}s")
    totals = m.get("totals", {})
    for key in ("seq_len", "sequences", "tokens", "documents", "fill_rate"):
        value = m.get(key, totals.get(key))
        if value is not None:
            print(f"  {key}={value}")
    print(f"  run report: {result.output_path}/_run.json, for people: {result.extra.get('report')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
