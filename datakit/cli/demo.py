"""`make demo`: synthesize a small editor-log set and run pipelines/quickstart.yaml on the local engine.

Why a module (not a shell script): the same steps run on every machine with only
the venv's Python, and a researcher can read it as a worked example.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from datakit import Pipeline

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
    from datakit.cli import _print_stages, run_error

    if not Path(args.pipeline).is_file():  # an installed package has no pipelines/ folder
        print(f"error: no pipeline file {args.pipeline}: the demo runs from a source checkout "
              "(`make demo`); elsewhere pass --pipeline FILE (`datakit init NAME` writes a ready one)", file=sys.stderr)
        return 2
    try:
        pipeline = Pipeline.from_yaml(args.pipeline)
        logs = logs_folder(pipeline)
    except Exception as e:  # noqa: BLE001 - a bad pipeline file: one line, as `datakit run` says it
        return _say_error(e, args.pipeline, run_error)

    marker = logs / synth.SUMMARY_FILE
    made = json.loads(marker.read_text()) if marker.exists() else {}
    if made.get("ordinary_events", made.get("events")) != args.events or made.get("repositories", 0) != args.repositories:
        t0 = time.perf_counter()
        summary = synth.generate(str(logs), events=args.events, seed=args.seed, repositories=args.repositories)
        print(f"synthesized {summary.get('events', args.events)} editor events into {logs} "
              f"({time.perf_counter() - t0:.1f}s)")
    else:
        print(f"reusing synthetic logs in {logs}")
    print(f"running {args.pipeline} on the local engine ...")
    try:
        result = pipeline.run(engine="local", workers=args.workers, report=True)
    except Exception as e:  # noqa: BLE001 - a bad input, a missing spaCy model, a failed job: one line
        return _say_error(e, args.pipeline, run_error)
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


def logs_folder(pipeline: Pipeline) -> Path:
    """Where the demo writes its synthetic logs: the folder the pipeline's input glob reads (its
    path up to the first wildcard, resolved as the run resolves it: against the pipeline file's folder).

    Why not a fixed `ROOT/demo/logs`: in an installed package ROOT is site-packages, so
    `python -m datakit.cli.demo --pipeline pipelines/longctx.yaml` (as the README says) wrote the logs
    into site-packages/demo/logs (failing on a read-only install) and the run then read
    `../demo/logs` beside the pipeline file and stopped with a traceback: "no input files match".
    In a checkout the shipped pipelines read ROOT/demo/logs, so `make demo` is unchanged."""
    from datakit.pipeline import PipelineError
    from datakit.stages.base import CompileContext

    paths = pipeline.config.input.path
    first = paths if isinstance(paths, str) else paths[0]
    resolved = CompileContext(base_dir=pipeline.base_dir).resolve(first)
    if "://" in resolved:
        raise PipelineError(f"the demo synthesizes logs into a local folder; this pipeline reads {first}")
    parts = Path(resolved).parts
    fixed = list(itertools.takewhile(lambda part: not any(c in part for c in "*?["), parts))
    if len(fixed) == len(parts):  # no wildcard: one file, which synthetic logs (dt=.../part-*.jsonl.zst) never are
        raise PipelineError(f"the demo needs a pipeline whose input is a glob under the logs folder "
                            f"(e.g. logs/dt=*/*.jsonl.zst); this one reads {first}")
    return Path(*fixed)


def _say_error(e: Exception, where: str, run_error: Callable) -> int:
    """One line and `datakit run`'s exit code for an error of a pipeline or its run (a bug re-raises)."""
    got = run_error(e, where)
    if got is None:
        raise e
    print(f"error: {got[1]}", file=sys.stderr)
    return got[0]


if __name__ == "__main__":
    sys.exit(main())
