"""Accuracy of the dedup stage's near-duplicate removal against exact Jaccard ground truth.

Corpus: real source files (the Python standard library of this interpreter),
plus planted near-duplicates made by controlled edits (k identifier tokens
replaced by fresh ones, k chosen for a target Jaccard), plus exact copies. The
ground truth is the *exact* Jaccard of every pair of documents (all pairs, via a
sparse shingle-incidence product, so natural near-duplicates in the stdlib
count too), with the stage's own shingle definition.

Metrics (at the stage's threshold t):
* recall: of all pairs with exact J >= t, the fraction where at least one side
  was removed (no duplicate pair survives in the output);
* precision: of all removed docs, the fraction that have some other doc with
  exact J >= t (a removed doc was really a duplicate);
* strict precision: of all removed docs, the fraction whose exact J with the
  kept doc named in the drop log is >= t;
* per planted similarity band: fraction of planted pairs resolved;
* the largest cluster (kept doc + the docs dropped in its favour).

    python benchmarks/dedup_accuracy.py --originals 1500 --per-level 60
"""
from __future__ import annotations

import sys
from pathlib import Path

# run as a script, this folder is sys.path[0]; a sibling benchmark named like a stdlib module
# (benchmarks/tokenize.py) would shadow it, so keep only the repository root importable
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import json
import random
import re
import tempfile
import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.sparse import csr_matrix

from datakit import Pipeline
from datakit.contracts import TRAINING_RECORD_V1
from datakit.io.dataset import read_output
from datakit.stages.dedup import shingle_hashes, shingles

STDLIB = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
TOKEN = re.compile(r"[A-Za-z0-9_\x80-\U0010ffff]+")
LEVELS = (0.5, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)


def source_files(limit: int) -> list[tuple[str, str]]:
    out = []
    for p in sorted(STDLIB.rglob("*.py")):
        if "site-packages" in p.parts:
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if 1500 <= len(text) <= 60_000:
            out.append((str(p.relative_to(STDLIB)), text))
    random.Random(0).shuffle(out)
    # drop exact copies already present in the stdlib: planted truth should be the only exact pairs
    seen, uniq = set(), []
    for name, text in out:
        if text not in seen:
            seen.add(text)
            uniq.append((name, text))
    return uniq[:limit]


def plant(rng: random.Random, text: str, target: float, ngram: int) -> str:
    """Replace k tokens so that about (S - ngram*k) / (S + ngram*k) of the shingles survive."""
    if target >= 1.0:
        return text
    spans = [m.span() for m in TOKEN.finditer(text)]
    s = max(1, len(spans) - ngram + 1)
    k = max(1, round(s * (1 - target) / (ngram * (1 + target))))
    chosen = sorted(rng.sample(range(len(spans)), min(k, len(spans))))
    parts, last = [], 0
    for i in chosen:
        a, b = spans[i]
        parts.append(text[last:a])
        parts.append(f"zq{rng.getrandbits(40):x}")
        last = b
    parts.append(text[last:])
    return "".join(parts)


def all_pairs_jaccard(texts: list[str], ngram: int, threshold_floor: float) -> dict[tuple[int, int], float]:
    """Exact Jaccard of every pair of docs sharing a shingle (returned only if >= threshold_floor)."""
    h, off = shingle_hashes(texts, ngram=ngram, shingle="token")
    rows, cols = [], []
    for i in range(len(texts)):
        u = np.unique(h[off[i]:off[i + 1]])
        rows.append(np.full(len(u), i, dtype=np.int64))
        cols.append(u)
    rows_a, cols_a = np.concatenate(rows), np.concatenate(cols)
    _, col_ids = np.unique(cols_a, return_inverse=True)
    m = csr_matrix((np.ones(len(rows_a), dtype=np.int32), (rows_a, col_ids)), shape=(len(texts), col_ids.max() + 1))
    sizes = np.asarray(m.sum(axis=1)).ravel()
    inter = (m @ m.T).tocoo()
    out = {}
    for i, j, x in zip(inter.row, inter.col, inter.data):
        if i < j:
            jac = x / (sizes[i] + sizes[j] - x)
            if jac >= threshold_floor:
                out[(int(i), int(j))] = float(jac)
    return out


def run_stage(texts: list[str], ids: list[str], minhash: dict, workers: int) -> tuple[set[str], dict[str, str], float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        rows = [{"doc_id": d, "kind": "code", "segments": [{"text": t, "train": True, "role": "code"}],
                 "chosen": None, "rejected": None, "source": None, "meta": "{}"} for d, t in zip(ids, texts)]
        (Path(tmp) / "in").mkdir()
        for f in range(4):
            pq.write_table(pa.Table.from_pylist(rows[f::4], schema=TRAINING_RECORD_V1), f"{tmp}/in/part-{f}.parquet")
        p = (Pipeline("acc").input(f"{tmp}/in", format="parquet", schema="training_record.v1")
             .add({"kind": "dedup", "exact": False, "minhash": minhash}).output(f"{tmp}/out"))
        t0 = time.perf_counter()
        res = p.run(workers=workers)
        secs = time.perf_counter() - t0
        kept = set(read_output(f"{tmp}/out", ["doc_id"]).column("doc_id").to_pylist())
        log = Path(tmp) / "out" / "_dropped" / "part-00000.parquet"
        detail = {r["key"]: r["detail"] for r in pq.read_table(log).to_pylist()} if log.exists() else {}
        return set(ids) - kept, detail, secs, res.stage("dedup")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--originals", type=int, default=1500)
    ap.add_argument("--per-level", type=int, default=60, help="planted copies per target similarity level")
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--num-perm", type=int, default=128)
    ap.add_argument("--ngram", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--variants", default="default,weights_0.1_0.9,signature",
                    help="comma list: default, signature, weights_FP_FN, none")
    args = ap.parse_args()
    rng = random.Random(42)
    files = source_files(args.originals)
    texts, ids, planted = [t for _, t in files], [f"o{i:05d}" for i in range(len(files))], []
    for level in LEVELS:
        for _ in range(args.per_level):
            src = rng.randrange(len(files))
            texts.append(plant(rng, texts[src], level, args.ngram))
            ids.append(f"p{len(ids):05d}")
            planted.append((src, len(ids) - 1, level))
    t0 = time.perf_counter()
    truth = all_pairs_jaccard(texts, args.ngram, 0.3)
    # spot check the sparse ground truth against the pure-Python reference shingles
    for (i, j), jac in list(truth.items())[:50]:
        a, b = set(shingles(texts[i], args.ngram, "token")), set(shingles(texts[j], args.ngram, "token"))
        assert abs(len(a & b) / len(a | b) - jac) < 1e-3, "ground truth disagrees with reference shingles"
    t = args.threshold
    dup_pairs = {p for p, j in truth.items() if j >= t}
    partners: dict[int, set[int]] = {}
    for i, j in dup_pairs:
        partners.setdefault(i, set()).add(j)
        partners.setdefault(j, set()).add(i)
    print(f"corpus: {len(files)} stdlib files + {len(planted)} planted copies = {len(texts)} docs, "
          f"{sum(len(x) for x in texts) / len(texts) / 1000:.1f} KB avg; pairs with exact J >= {t}: {len(dup_pairs)} "
          f"(ground truth {time.perf_counter() - t0:.1f}s)")
    index = {d: i for i, d in enumerate(ids)}
    results = {}
    for variant in args.variants.split(","):
        mh = {"threshold": t, "num_perm": args.num_perm, "ngram": args.ngram}
        if variant == "signature":
            mh["verify"] = "signature"
        elif variant == "none":
            mh.update(verify="none", drop_rule="component")
        elif variant.startswith("weights_"):
            _, fp, fn = variant.split("_")
            mh["weights"] = (float(fp), float(fn))
        removed, detail, secs, stage = run_stage(texts, ids, mh, args.workers)
        rem = {index[d] for d in removed}
        resolved = sum(1 for i, j in dup_pairs if i in rem or j in rem)
        recall = resolved / len(dup_pairs) if dup_pairs else 1.0
        precision = sum(1 for i in rem if i in partners) / len(rem) if rem else 1.0

        def jac(i: int, j: int) -> float:
            return truth.get((min(i, j), max(i, j)), 0.0)

        strict = sum(1 for d in removed if d in detail and jac(index[d], index[detail[d]]) >= t) / len(rem) if rem else 1.0
        by_level = {}
        for level in LEVELS:
            ps = [(a, b) for a, b, lv in planted if lv == level]
            truly = [jac(a, b) for a, b in ps]
            res = sum(1 for a, b in ps if a in rem or b in rem)
            by_level[level] = (res / len(ps), float(np.mean(truly)))
        clusters = Counter(detail.values())
        largest = max(clusters.values()) + 1 if clusters else 1
        bands = stage.get("metrics", {})
        results[variant] = {"recall": recall, "precision": precision, "strict_precision": strict, "removed": len(rem),
                            "largest_cluster": largest, "seconds": secs, "metrics": bands,
                            "by_level": {str(k): v for k, v in by_level.items()}}
        print(f"\n[{variant}] minhash={json.dumps(mh)}")
        print(f"  removed {len(rem)}  recall {recall:.4f}  precision {precision:.4f}  strict precision {strict:.4f}  "
              f"largest cluster {largest}  stage {secs:.1f}s  {bands}")
        print("  planted level -> resolved (mean exact J of the planted pairs): " +
              ", ".join(f"{k}: {v[0]:.2f} ({v[1]:.3f})" for k, v in by_level.items()))
    Path("benchmarks/results").mkdir(parents=True, exist_ok=True)
    Path("benchmarks/results/dedup_accuracy.json").write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
