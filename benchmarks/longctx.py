"""Repository packing for long context: fill and peak memory at seq_len 8K, 32K and 256K.

What it shows: `packing: repository` writes sequences one at a time, so its
peak resident memory is the shard's encoded tokens plus one sequence, the same
at 8K and at 256K; the reference is `best_fit` packing (documents, not
repositories), which materializes every sequence of a shard at once.

Each (packing, seq_len) runs in a fresh process (peak RSS = that process's
VmHWM, datakit.run_timing.peak_rss_mb: its ru_maxrss would start at this
parent's peak) over the same records: code records extracted once from synthetic
logs with repository projects (`generate(repositories=N)`), read as Parquet,
tokenized with the test tokenizer, one shard, workers=1.

    .venv/bin/python benchmarks/longctx.py [--events 1000] [--repositories 60]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TOKENIZER = str(ROOT / "tests" / "data" / "tokenizer")
SEQ_LENS = (8192, 32768, 262144)


def _rss_now_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def child(records: str, out: str, seq_len: int, packing: str) -> None:
    """One run in this (fresh) process; prints a JSON line with peak RSS and the manifest totals."""
    from datakit import Pipeline
    from datakit.run_timing import peak_rss_mb

    p = (Pipeline("bench", seed=0).input(records, format="parquet", schema="training_record.v1")
         .add({"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": seq_len, "packing": packing})
         .output(out, format="packed", shards=1))
    base = _rss_now_mb()
    t0 = time.perf_counter()
    res = p.run(workers=1)
    secs = time.perf_counter() - t0
    peak = peak_rss_mb()
    t = res.manifest["totals"]
    print(json.dumps({"seq_len": seq_len, "packing": packing, "peak_rss_mb": round(peak, 1),
                      "rss_before_run_mb": round(base, 1), "seconds": round(secs, 2), "sequences": t["sequences"],
                      "tokens": t["tokens"], "fill_rate": t["fill_rate"],
                      "sequence_mb": round(seq_len * 3 / 2**20, 2)}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1000)
    ap.add_argument("--repositories", type=int, default=60)
    ap.add_argument("--child", nargs=4, metavar=("RECORDS", "OUT", "SEQ_LEN", "PACKING"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), args.child[3])
        return 0

    from datakit import Pipeline
    from datakit.synth import generate

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _report import comparison, write

    with tempfile.TemporaryDirectory() as tmp:
        logs, records = Path(tmp) / "logs", Path(tmp) / "records"
        generate(logs, events=args.events, seed=0, days=3, repositories=args.repositories)
        (Pipeline("records", seed=0).input(str(logs / "dt=*" / "*.jsonl.zst")).add({"kind": "ingest"})
         .add({"kind": "extract", "kinds": ["code"]}).output(str(records), format="parquet", shards=1)).run(workers=1)
        m = json.loads((records / "manifest.json").read_text())
        files = [str(records / f) for s in m["shards"] for f in s["files"]]
        rows = []
        for packing in ("repository", "best_fit"):
            for seq_len in SEQ_LENS:
                out = Path(tmp) / f"out-{packing}-{seq_len}"
                cmd = [sys.executable, __file__, "--child", files[0] if len(files) == 1 else str(records / "*.parquet"),
                       str(out), str(seq_len), packing]
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                if proc.returncode != 0:
                    print(proc.stderr[-2000:], file=sys.stderr)
                    return 1
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                r = rows[-1]
                print(f"{packing:>10} seq_len={seq_len:>6}: peak RSS {r['peak_rss_mb']:7.1f} MB "
                      f"(before run {r['rss_before_run_mb']:.1f} MB), fill {r['fill_rate']:.4f}, "
                      f"{r['sequences']} sequences, {r['tokens']:,} tokens, {r['seconds']:.1f}s", flush=True)
    by = {(r["packing"], r["seq_len"]): r for r in rows}
    rep = [by[("repository", s)]["peak_rss_mb"] for s in SEQ_LENS]
    print(f"\nrepository packing: peak RSS 256K - 8K = {rep[-1] - rep[0]:+.1f} MB "
          f"(one 256K sequence of tokens + mask = {262144 * 3 / 2**20:.2f} MB)")
    comps = [comparison(f"longctx peak RSS @{s // 1024}K (repository vs best_fit packing)",
                        by[("repository", s)]["peak_rss_mb"], by[("best_fit", s)]["peak_rss_mb"], "MB",
                        "best_fit packing",
                        f"same input records and tokenizer, one shard; repository packing keeps only the newest "
                        f"version of each file ({by[('repository', s)]['tokens']:,} of {by[('best_fit', s)]['tokens']:,} tokens)",
                        f"{by[('repository', s)]['tokens']:,} tokens, workers=1", higher_is_better=False)
             for s in SEQ_LENS]
    write("longctx", comps, {"runs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
