"""Incremental dedup (append mode): 10 consecutive days, run time per day, state size, accuracy vs one run.

Corpus and ground truth: those of benchmarks/dedup_accuracy.py (real stdlib source files, planted
near-duplicates at controlled Jaccard levels, exact all-pairs Jaccard as the truth). The documents
are spread over `--days` days of equal size; from day 2 on, each day's planted copies are edits of
documents of *earlier* days (cross-day duplicates), so only dedup against history can find them.

Each day runs as one append-mode snapshot (`output: {mode: append}`, dedup `history` on). Printed per
day: run seconds, rows in/out, drops by reason, dedup-state bytes. Then recall/precision of the whole
dataset (the union of the snapshots) against the ground truth, beside a single run over all days'
documents with the same settings. The cost claim is checked as day N seconds / day 1 seconds.

    python benchmarks/incremental.py --days 10 --per-day 100 --planted 30
"""
from __future__ import annotations

import sys
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import json
import random
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.dedup_accuracy import LEVELS, all_pairs_jaccard, plant, source_files
from datakit import Pipeline
from datakit.contracts import TRAINING_RECORD_V1
from datakit.io.dataset import read_output


def _rows(ids: list[str], texts: list[str]) -> pa.Table:
    return pa.Table.from_pylist([{"doc_id": d, "kind": "code", "segments": [{"text": t, "train": True, "role": "code"}],
                                  "chosen": None, "rejected": None, "source": None, "meta": "{}"}
                                 for d, t in zip(ids, texts)], schema=TRAINING_RECORD_V1)


def build_days(days: int, per_day: int, planted: int, ngram: int, seed: int = 42):
    """(day -> [(id, text)]): `per_day` originals + `planted` copies per day; copies of day d >= 2 edit
    originals of days < d; day 1's copies edit day-1 originals (so every day has the same input size)."""
    rng = random.Random(seed)
    files = source_files(days * per_day)
    if len(files) < days * per_day:
        raise SystemExit(f"only {len(files)} stdlib files; lower --per-day")
    out: dict[int, list[tuple[str, str]]] = {}
    for d in range(days):
        docs = [(f"d{d:02d}-o{i:04d}", files[d * per_day + i][1]) for i in range(per_day)]
        pool = range(0, per_day) if d == 0 else range(0, d * per_day)
        for k in range(planted):
            src = rng.choice(pool)
            level = LEVELS[k % len(LEVELS)]
            text = plant(rng, files[src][1], level, ngram)
            docs.append((f"d{d:02d}-p{k:04d}", text))
        out[d] = docs
    return out


def accuracy(kept: set[str], ids: list[str], texts: list[str], truth: dict, t: float) -> tuple[float, float]:
    index = {d: i for i, d in enumerate(ids)}
    rem = {index[d] for d in ids if d not in kept}
    dup = [p for p, j in truth.items() if j >= t]
    partners = {i for p in dup for i in p}
    recall = sum(1 for i, j in dup if i in rem or j in rem) / len(dup) if dup else 1.0
    precision = sum(1 for i in rem if i in partners) / len(rem) if rem else 1.0
    return recall, precision


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=int, default=10)
    ap.add_argument("--per-day", type=int, default=100, help="original documents per day")
    ap.add_argument("--planted", type=int, default=30, help="planted near/exact copies per day")
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--num-perm", type=int, default=128)
    ap.add_argument("--ngram", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--json", dest="json_out", default=None, help="write the numbers here too")
    args = ap.parse_args()
    days = build_days(args.days, args.per_day, args.planted, args.ngram)
    minhash = {"threshold": args.threshold, "num_perm": args.num_perm, "ngram": args.ngram}
    stage = {"kind": "dedup", "exact": True, "minhash": minhash}
    per_day = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out = root / "dataset"
        # warm-up (imports, JIT-compiled kernels, worker start) outside the timed days: day 1 would
        # otherwise pay it and flatter every later day
        warm = root / "warm" / "dt=0"
        warm.mkdir(parents=True)
        pq.write_table(_rows(["w0", "w1"], [days[0][0][1], days[0][1][1]]), warm / "part-0.parquet")
        for _ in range(2):
            (Pipeline("warm").input(str(warm), format="parquet", schema="training_record.v1")
             .add(stage).output(str(root / "warm-out"), mode="append").run(workers=args.workers))
        for d, docs in days.items():
            folder = root / "logs" / f"dt=2026-11-{d + 1:02d}"
            folder.mkdir(parents=True)
            pq.write_table(_rows([i for i, _ in docs], [t for _, t in docs]), folder / "part-0.parquet")
            p = (Pipeline("nightly").input(str(folder), format="parquet", schema="training_record.v1")
                 .add(stage).output(str(out), mode="append"))
            t0 = time.perf_counter()
            res = p.run(workers=args.workers)
            secs = time.perf_counter() - t0
            st = res.stage("dedup")
            state = _bytes(out / "_snapshots" / res.extra["snapshot"] / "_dedup_state")
            per_day.append({"day": d + 1, "seconds": round(secs, 2), "rows_in": st["rows_in"], "rows_out": st["rows_out"],
                            "dropped": st["dropped"], "state_bytes_day": state})
            total_state = sum(x["state_bytes_day"] for x in per_day)
            print(f"day {d + 1:2d}: {secs:6.2f}s  in {st['rows_in']:4d} out {st['rows_out']:4d}  "
                  f"state +{state / 1024:.0f} KiB (total {total_state / 1024:.0f} KiB)  {json.dumps(st['dropped'], sort_keys=True)}",
                  flush=True)
        kept_inc = set(read_output(str(out), ["doc_id"]).column("doc_id").to_pylist())
        all_docs = [x for d in days.values() for x in d]
        ids, texts = [i for i, _ in all_docs], [t for _, t in all_docs]
        (root / "all").mkdir()
        pq.write_table(_rows(ids, texts), root / "all" / "part-0.parquet")
        t0 = time.perf_counter()
        (Pipeline("single").input(str(root / "all"), format="parquet", schema="training_record.v1")
         .add(stage).output(str(root / "single")).run(workers=args.workers))
        single_secs = time.perf_counter() - t0
        kept_one = set(read_output(str(root / "single"), ["doc_id"]).column("doc_id").to_pylist())
    truth = all_pairs_jaccard(texts, args.ngram, 0.3)
    r_inc, p_inc = accuracy(kept_inc, ids, texts, truth, args.threshold)
    r_one, p_one = accuracy(kept_one, ids, texts, truth, args.threshold)
    ratio = per_day[-1]["seconds"] / per_day[0]["seconds"]
    summary = {"days": per_day, "dayN_over_day1": round(ratio, 3), "single_run_seconds": round(single_secs, 2),
               "incremental": {"recall": round(r_inc, 4), "precision": round(p_inc, 4), "kept": len(kept_inc)},
               "single_run": {"recall": round(r_one, 4), "precision": round(p_one, 4), "kept": len(kept_one)},
               "docs": len(ids), "settings": {**minhash, "per_day": args.per_day, "planted": args.planted}}
    print(f"day {args.days} / day 1 run time: {ratio:.2f}x (claim: <= 1.3x)")
    print(f"incremental: recall {r_inc:.4f} precision {p_inc:.4f} kept {len(kept_inc)} | single run over all days: "
          f"recall {r_one:.4f} precision {p_one:.4f} kept {len(kept_one)} ({single_secs:.1f}s)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
