"""Synthetic logs, consent and extract: throughput, and agreement with the reference tools.

Side by side:
- consent: broadcast mode (id sets closed over by a pyarrow `is_in` batch function)
  vs join mode (the engine's anti join, polars on the local engine); outputs must be identical.
- extract's diff application vs GNU `patch` (the reference) on the inline-edit
  diffs of the synthetic logs: identical results, and time per diff.
- synth generation rate, extract records per second.

Usage: .venv/bin/python benchmarks/consent_extract.py [--events 20000] [--workers 2]
Prints numbers; never fails on them.
"""
from __future__ import annotations

import sys
from pathlib import Path

# this folder has a `tokenize.py` benchmark that would shadow the stdlib module of that name
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402


def _run(pipeline, out: Path, workers: int):
    from datakit.io.sinks import output_checksums

    t = time.perf_counter()
    res = pipeline.run(engine="local", output=str(out), workers=workers)
    return time.perf_counter() - t, res, output_checksums(str(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--patch-sample", type=int, default=200)
    args = ap.parse_args()

    from datakit import Pipeline
    from datakit.stages.extract.stage import ExtractFn
    from datakit.stages.extract.rules import apply_unified_diff
    from datakit.synth import generate, iter_events

    tmp = Path(tempfile.mkdtemp(prefix="bench-consent-extract-"))
    try:
        t = time.perf_counter()
        summary = generate(tmp / "logs", events=args.events, seed=0, days=3)
        gen = time.perf_counter() - t
        size = sum(p.stat().st_size for p in (tmp / "logs").rglob("*.zst"))
        print(f"synth: {args.events} events in {gen:.1f}s = {args.events / gen:,.0f} events/s, "
              f"{size / 1e6:.1f} MB zstd")

        src = str(tmp / "logs" / "dt=*" / "*.jsonl.zst")
        optouts = str(tmp / "logs" / "optouts.parquet")
        times = {}
        sums = {}
        for mode in ("broadcast", "join"):
            p = (Pipeline("bench", seed=0).input(src).add({"kind": "ingest"})
                 .add({"kind": "consent", "optouts": optouts, "mode": mode}))
            dt, res, sums[mode] = _run(p, tmp / f"consent-{mode}", args.workers)
            times[mode] = dt
            st = res.stage("consent")
            print(f"consent {mode:9s}: {dt:6.2f}s end to end (ingest included), dropped {st['dropped']}")
        print(f"consent join / broadcast time: {times['join'] / times['broadcast']:.2f}x; "
              f"outputs identical: {sums['join'] == sums['broadcast']}")

        # extract alone on already-parsed events (what the stage's batch function costs)
        import pyarrow.parquet as pq

        events = pq.read_table(sorted((tmp / "consent-broadcast").glob("data/part-*.parquet")))
        batches = events.to_batches(max_chunksize=4096)
        fn = ExtractFn(("code", "fim", "sft"))
        t = time.perf_counter()
        n_out = sum(int(b.num_rows) for b in (fn(x) for x in batches))
        dt = time.perf_counter() - t
        print(f"extract fn: {events.num_rows} events -> {n_out} rows (records + drop placeholders) "
              f"in {dt:.2f}s = {events.num_rows / dt:,.0f} events/s")
        p = (Pipeline("bench", seed=0).input(src).add({"kind": "ingest"}).add({"kind": "consent", "optouts": optouts})
             .add({"kind": "extract", "kinds": ["code", "fim", "sft", "preference"]}))
        dt, res, _ = _run(p, tmp / "extract", args.workers)
        st = res.stage("extract")
        print(f"pipeline ingest>consent>extract(all kinds): {dt:.2f}s, {st['emitted']} records "
              f"({st['rows_out']} of {st['rows_in']} events yield one)")

        # our diff applier vs GNU patch
        if shutil.which("patch"):
            edits = [e for e in iter_events(tmp / "logs") if e["event_type"] == "inline_edit"][: args.patch_sample]
            ours = ref = 0.0
            same = 0
            work = tmp / "patch"
            work.mkdir()
            for e in edits:
                base = e["context"]["prefix"] + e["context"]["suffix"]
                t = time.perf_counter()
                mine = apply_unified_diff(base, e["diff"])
                ours += time.perf_counter() - t
                f = work / "f.txt"
                f.write_text(base)
                (work / "d.diff").write_text(e["diff"])
                t = time.perf_counter()
                subprocess.run(["patch", "-s", "-p1", "--no-backup-if-mismatch", str(f), str(work / "d.diff")],
                               check=True, capture_output=True)
                ref += time.perf_counter() - t
                same += f.read_text() == mine
            print(f"diff apply vs GNU patch: {same}/{len(edits)} identical; "
                  f"ours {ours / len(edits) * 1e6:.0f} us/diff, patch {ref / len(edits) * 1e6:.0f} us/diff "
                  f"(incl. process start) = {ref / ours:.0f}x")
        print(f"summary expected consent drops: {summary['expected_consent_drops']}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
