"""Speed of MinHash signatures (ours vs datasketch vs rensa) and of the whole dedup stage.

Same texts (1 KB windows of real Python source), same shingles (word 5-grams,
`datakit.stages.dedup.shingles`), 128 permutations, one core. Ours goes from
the raw texts (shingling included); the baselines get the shingles ready-made
(their time excludes shingling, which we print separately), so the ratios are
conservative. Bit identity with datasketch (same xxh32 hashfunc) is checked on
the compared documents. rensa's `RMinHash` uses its own hashing and
permutations (not datasketch-compatible); it is here for speed only.

Then the whole stage (exact + MinHash near dedup with verification) on the
local engine, and on Spark local[2] when the Spark engine is installed.

Every timed row gets one untimed warm-up run and the median of --runs timed runs (the same
on both sides); the headline ratio is against datasketch with the same hash (xxh32), not its
slower default SHA-1 (printed for reference only).

    python benchmarks/dedup_speed.py --docs 20000 --baseline-docs 2000 --stage-docs 50000
"""
from __future__ import annotations

import sys
from pathlib import Path

# run as a script, this folder is sys.path[0]; a sibling benchmark named like a stdlib module would shadow it
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import json
import os
import random
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from datakit.stages.dedup import minhash_signatures, shingles

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import comparison, timed, timed_alternated, write  # noqa: E402

PYLIB = f"python{sys.version_info.major}.{sys.version_info.minor}"
STDLIB = Path(sys.base_prefix) / "lib" / PYLIB
SITE = Path(sys.prefix) / "lib" / PYLIB / "site-packages"  # more real code when the stdlib runs out


def windows(n: int, size: int = 1000) -> list[str]:
    """n texts of `size` characters cut from the standard library's sources, then the installed packages'
    (sorted files, fixed order)."""
    out: list[str] = []
    paths = [p for p in sorted(STDLIB.rglob("*.py")) if "site-packages" not in p.parts] + sorted(SITE.rglob("*.py"))
    for p in paths:
        try:
            s = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out += [s[i:i + size] for i in range(0, len(s) - size, size)]
        if len(out) >= n:
            break
    return out[:n]


def rate(n: int, fn, runs: int) -> float:
    """docs per CPU-second from the median of `runs` timed calls after one untimed warm-up."""
    return n / timed(fn, runs=runs, warmup=1, clock=time.process_time)


def signatures(args) -> dict:
    """Every row: one warm-up round, then the median of --runs rounds, one thread, CPU seconds.

    The compared rows (ours and the references on the same `base` documents, from the same shingle
    lists where a row says so) run alternated within each round (`timed_alternated`); ours on all
    --docs windows is a row of its own, for the throughput at size only."""
    os.environ["RAYON_NUM_THREADS"] = "1"  # rensa's bulk call runs on a rayon pool: one thread, like every side
    from datasketch import MinHash

    from datakit.stages.dedup import minhash_signatures_from_shingles

    texts = windows(args.docs)
    base = texts[: args.baseline_docs]
    P, S, R = 128, 1, args.runs
    sh = [shingles(t, 5, "word") for t in base]

    def ds(hashfunc):
        def go():
            for s in sh:
                m = MinHash(num_perm=P, seed=S, hashfunc=hashfunc) if hashfunc else MinHash(num_perm=P, seed=S)
                m.update_batch(s)
        return go

    fns = {
        "ours (texts -> signatures, shingling included)": lambda: minhash_signatures(base, P, S, 5, "word"),
        "ours from ready shingles (list -> Arrow included)": lambda: minhash_signatures_from_shingles(sh, P, S),
        "ours, token shingles (stage default)": lambda: minhash_signatures(base, P, S, 5, "token"),
        "python reference shingling alone": lambda: [shingles(t, 5, "word") for t in base],
        "datasketch MinHash+update_batch (sha1, default)": ds(None),
        "datasketch MinHash+update_batch (xxh32)": ds(xxhash.xxh32_intdigest),
        "datasketch MinHash.bulk (sha1)": lambda: MinHash.bulk(sh, num_perm=P, seed=S),
        "datasketch MinHash.bulk (xxh32)": lambda: MinHash.bulk(sh, num_perm=P, seed=S, hashfunc=xxhash.xxh32_intdigest),
    }
    rensa_key = "rensa RMinHash.digest_matrix_from_token_sets (bulk)"
    try:
        import rensa

        tok = [[x.decode("utf-8") for x in s] for s in sh]

        def rensa_each():
            for t in tok:
                r = rensa.RMinHash(num_perm=P, seed=S)
                r.update(t)
                r.digest()

        fns["rensa RMinHash per doc"] = rensa_each
        fns[rensa_key] = lambda: rensa.RMinHash.digest_matrix_from_token_sets(tok, P, S)
    except ImportError:
        print("rensa not installed: skipped")
    res = {k: len(base) / v for k, v in timed_alternated(fns, runs=R).items()}
    res[f"ours on all {len(texts)} windows (throughput at size)"] = rate(
        len(texts), lambda: minhash_signatures(texts, P, S, 5, "word"), R)
    # bit identity on the compared documents, for both of our functions the rows time
    ref = MinHash.bulk(sh, num_perm=P, seed=S, hashfunc=xxhash.xxh32_intdigest)
    identical = all(np.array_equal(o, m.hashvalues) for o, m in zip(minhash_signatures(base, P, S, 5, "word"), ref))
    from_sh = minhash_signatures_from_shingles(sh, P, S)
    identical_sh = len(from_sh) == len(ref) and all(np.array_equal(np.asarray(o), m.hashvalues) for o, m in zip(from_sh, ref))
    ours_rate = res["ours (texts -> signatures, shingling included)"]
    print(f"\n== signatures: the same {len(base)} docs ({np.mean([len(t.encode()) for t in base]):.0f} B avg) on every "
          f"side; 128 perms, word 5-grams, 1 thread, CPU time, median of {R} alternated rounds after a warm-up round; "
          f"bit-identical to datasketch(xxh32): texts -> signatures {identical}, from shingles {identical_sh}")
    print(f"{'implementation':58s} {'docs/CPU-s':>10s} {'ours / it':>10s}")
    for k, v in res.items():
        print(f"{k:58s} {v:10.0f} {ours_rate / v:9.1f}x")
    cond = (f"{len(base)} documents (the same on both sides), 128 perms, word 5-grams, 1 thread each (RAYON_NUM_THREADS=1), "
            f"CPU time, median of {R} alternated rounds after 1 warm-up round")
    from importlib import metadata

    ds_name = f"datasketch {metadata.version('datasketch')} MinHash.bulk(hashfunc=xxh32)"
    comps = [
        comparison("MinHash signatures vs datasketch (same hash: xxh32)", ours_rate,
                   res["datasketch MinHash.bulk (xxh32)"], "docs/CPU-s", ds_name,
                   f"bit-identical signatures: {identical}", cond + "; ours includes shingling, theirs does not"),
        comparison("MinHash from ready shingles vs datasketch (xxh32)", res["ours from ready shingles (list -> Arrow included)"],
                   res["datasketch MinHash.bulk (xxh32)"], "docs/CPU-s", ds_name,
                   f"bit-identical signatures: {identical_sh}", cond + "; both from the same shingle lists"),
    ]
    if rensa_key in res:
        comps.append(comparison("MinHash from ready shingles vs rensa (bulk)", res["ours from ready shingles (list -> Arrow included)"],
                                res[rensa_key], "docs/CPU-s", f"rensa {metadata.version('rensa')} RMinHash.digest_matrix_from_token_sets",
                                "same shingles; rensa hashes with its own function (not comparable bit for bit)", cond))
    return {"docs_per_s": res, "bit_identical": identical and identical_sh, "comparisons": comps}


def records(n: int, dup_rate: float = 0.2) -> list[dict]:
    """n code records of ~1-4 KB; about dup_rate of them are exact or lightly edited copies."""
    rng = random.Random(0)
    texts = windows(n * 2, 2000)
    rows, originals = [], []
    for i in range(n):
        if originals and rng.random() < dup_rate:
            src = rng.choice(originals)
            t = src if rng.random() < 0.5 else src.replace("self", "this", 1) + "\n# patched\n"
        else:
            t = texts[len(originals) % len(texts)]
            originals.append(t)
        rows.append({"doc_id": f"d{xxhash.xxh64_hexdigest(str(i).encode())}", "kind": "code",
                     "segments": [{"text": t, "train": True, "role": "code"}], "chosen": None, "rejected": None,
                     "source": None, "meta": "{}"})
    return rows


def stage(args) -> dict:
    from datakit import Pipeline
    from datakit.contracts import TRAINING_RECORD_V1

    rows = records(args.stage_docs)
    out = {}
    worker_peaks: list[dict] = []  # timing.workers of the pool runs (each worker's own peak)
    with tempfile.TemporaryDirectory() as tmp:
        files = max(2, args.stage_docs // 10_000)
        os.makedirs(f"{tmp}/in")
        for f in range(files):
            pq.write_table(pa.Table.from_pylist(rows[f::files], schema=TRAINING_RECORD_V1), f"{tmp}/in/part-{f}.parquet")
        print(f"\n== whole stage: {len(rows)} records in {files} files, exact + minhash(0.8, 128, token 5-grams, exact verify)")
        runs = [("local", {"workers": 1}), ("local", {"workers": 2})] if "local" in args.engines else []
        if "spark" in args.engines:
            try:
                import datakit.engines.spark  # noqa: F401

                runs.append(("spark", {"master": "local[2]"}))
            except ImportError:
                print("spark engine not available: skipped")
        for engine, opts in runs:
            p = (Pipeline("bench").input(f"{tmp}/in", format="parquet", schema="training_record.v1")
                 .add({"kind": "dedup", "exact": True, "minhash": {"threshold": 0.8}})
                 .output(f"{tmp}/out-{engine}-{len(out)}"))
            t0 = time.perf_counter()
            res = p.run(engine=engine, **opts)
            secs = time.perf_counter() - t0
            st = res.stage("dedup")
            worker_peaks += [w for w in [res.extra.get("timing", {}).get("workers")] if w]
            key = f"{engine} {opts}"
            out[key] = {"docs_per_s": len(rows) / secs, "seconds": secs, "dropped": st["dropped"], "metrics": st.get("metrics", {})}
            print(f"{key:32s} {len(rows) / secs:10.0f} docs/s  {secs:6.1f}s  dropped {st['dropped']}  {st.get('metrics', {})}")
    # each process's own VmHWM (run_timing.peak_rss_mb): RUSAGE_CHILDREN's ru_maxrss counted only exited
    # children (the kept pool's workers never exit here) and a (v)fork+exec child's starts at its parent's peak
    from datakit.run_timing import peak_rss_mb

    workers = [w["peak_rss_mb"] for w in worker_peaks] or [0.0]
    print(f"peak RSS (VmHWM): driver {peak_rss_mb():.0f} MB, largest pool worker {max(workers):.0f} MB")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--baseline-docs", type=int, default=2000)
    ap.add_argument("--stage-docs", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per row (median kept), after one warm-up")
    ap.add_argument("--skip-stage", action="store_true")
    ap.add_argument("--skip-signatures", action="store_true")
    ap.add_argument("--engines", default="local,spark", help="stage engines: local, spark")
    ap.add_argument("--json", default=None, help="where to write the comparisons (default benchmarks/results/)")
    args = ap.parse_args()
    result = {} if args.skip_signatures else {"signatures": signatures(args)}
    if not args.skip_stage:
        result["stage"] = stage(args)
    comps = result.get("signatures", {}).pop("comparisons", [])
    write("dedup_speed", comps, result, args.json)


if __name__ == "__main__":
    main()
