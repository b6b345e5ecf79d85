"""How much of what `datakit synth` planted does the whole pipeline catch? (accuracy, never fails)

Runs ingest > consent > extract > scrub_pii > dedup > decontaminate on synthetic
logs and scores every stage against the ground-truth sidecar:

- ingest: planted malformed lines quarantined (same file and line), per kind;
- consent: drops by reason vs the generator's expected counts;
- scrub_pii: planted values that still appear in any output record, per entity;
- dedup: planted exact / near-duplicate pairs of which one copy was dropped as a
  duplicate (near pairs by their exact word-5-gram Jaccard);
- decontaminate: planted HumanEval leaks whose records were dropped.

Usage: .venv/bin/python benchmarks/synth_ground_truth.py [--events 5000] [--workers 2]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()

    import pyarrow.parquet as pq

    from datakit import Pipeline
    from datakit.synth import generate, read_ground_truth, record_doc_id

    tmp = Path(tempfile.mkdtemp(prefix="bench-synth-gt-"))
    try:
        logs, out = tmp / "logs", tmp / "out"
        summary = generate(logs, events=args.events, seed=args.seed)
        p = (Pipeline("gt", seed=0).input(str(logs / "dt=*" / "*.jsonl.zst")).add({"kind": "ingest"})
             .add({"kind": "consent", "optouts": str(logs / "optouts.parquet")})
             .add({"kind": "extract", "kinds": ["code", "fim", "sft", "preference"]})
             .add({"kind": "scrub_pii"}).add({"kind": "dedup", "exact": True, "minhash": {"threshold": 0.8}})
             .add({"kind": "decontaminate", "evals": ["humaneval"]}).output(str(out), shards=2))
        t = time.perf_counter()
        res = p.run(engine="local", workers=args.workers)
        print(f"{args.events} events, pipeline {time.perf_counter() - t:.1f}s")
        for st in res.stages:
            print(f"  {st['name']:14s} in {st['rows_in']:6d} out {st['rows_out']:6d} dropped {st['dropped']}")

        gt = defaultdict(list)
        for row in read_ground_truth(logs):
            gt[row["kind"]].append(row)
        drops = defaultdict(dict)  # stage -> key -> reason
        for f in sorted((out / "_dropped").rglob("*.parquet")):
            for r in pq.read_table(f).to_pylist():
                drops[r["stage"]][r["key"]] = r["reason"]
        quarantine = {}
        for f in sorted((out / "_quarantine").rglob("*.parquet")):
            for r in pq.read_table(f).to_pylist():
                quarantine[(Path(r["source_file"]).relative_to(logs).as_posix(), r["source_line"])] = r["reason"]
        rows = pq.read_table(sorted(out.glob("data/part-*.parquet"))).to_pylist()

        print("\n## ingest: planted malformed lines quarantined with the planted reason")
        by_kind: Counter = Counter()
        hit: Counter = Counter()
        for g in gt["malformed"]:
            by_kind[g["malformed_kind"]] += 1
            hit[g["malformed_kind"]] += quarantine.get((g["file"], g["line"])) == g["malformed_kind"]
        for k in sorted(by_kind):
            print(f"  {k:20s} {hit[k]}/{by_kind[k]}")
        print(f"  quarantined lines in total: {len(quarantine)} (planted: {len(gt['malformed'])})")

        print("\n## consent: drops vs expected")
        st = res.stage("consent")
        for k, v in summary["expected_consent_drops"].items():
            print(f"  {k:14s} dropped {st['dropped'].get(k, 0):6d} expected {v:6d}")

        print("\n## scrub_pii: planted values still present in an output record (lower is better)")
        texts_by_event = defaultdict(list)
        for r in rows:
            ids = json.loads(r["meta"]).get("event_ids", [r["source"]["event_id"]])
            text = "\n".join([s["text"] or "" for s in r["segments"]] + [r["chosen"] or "", r["rejected"] or ""])
            for i in ids:
                texts_by_event[i].append(text)
        planted: Counter = Counter()
        survived: Counter = Counter()
        for g in gt["pii"]:
            planted[g["entity"]] += 1
            survived[g["entity"]] += any(g["value"] in t for t in texts_by_event.get(g["event_id"], []))
        for k in sorted(planted):
            print(f"  {k:16s} survived {survived[k]}/{planted[k]}")
        print(f"  total: {sum(survived.values())}/{sum(planted.values())} survived")

        print("\n## dedup: planted duplicate pairs with one copy dropped as a duplicate")
        dd = drops.get("dedup", {})
        ex = [g for g in gt["exact_dup"]]
        ex_hit = sum(any(dd.get(record_doc_id(i)) for i in g["event_ids"]) for g in ex)
        print(f"  exact_dup           {ex_hit}/{len(ex)}")
        buckets: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for g in gt["near_dup"]:
            b = f"{g['variant']:9s} J>=0.8" if g["jaccard"] >= 0.8 else f"{g['variant']:9s} J<0.8 "
            buckets[b][1] += 1
            buckets[b][0] += any(dd.get(record_doc_id(i)) for i in (g["event_id_a"], g["event_id_b"]))
        for b in sorted(buckets):
            print(f"  near_dup {b}  {buckets[b][0]}/{buckets[b][1]}")
        print(f"  all dedup drops: {Counter(dd.values())}")

        print("\n## decontaminate: planted HumanEval leaks whose records were dropped")
        dc = drops.get("decontaminate", {})
        for where in ("chat", "file"):
            for edited in (False, True):
                sel = [g for g in gt["eval_leak"] if g["where"] == where and g["edited"] == edited]
                caught = sum(all(dc.get(record_doc_id(g["event_id"], k)) for k in g["record_kinds"]) for g in sel)
                print(f"  {where:4s} edited={str(edited):5s} {caught}/{len(sel)}")
        print(f"  all decontamination drops: {len(dc)}")
    finally:
        if args.keep:
            print(f"\nkept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
