"""`scrub_pii` with person-name NER on the pipeline's own mix: MB per CPU-second, and what NER finds.

Why this and not `pii.py --ner-mb`: that one times NER on chat text made of stdlib docstrings
(every paragraph prose, dense with capitals), the worst case. A user runs the quickstart: code,
FIM, chats and agent steps, where NER reads only the prose turns. So the mix here is the
training records `extract` makes from synthetic editor logs (`datakit.synth`, quickstart's
ingest -> consent -> extract), scrubbed by the stage function in 4096-row batches (the local
engine's batch size) in this one process.

Timing: CPU seconds of this process (`time.process_time`) on one core (`POLARS_MAX_THREADS=1`),
`ner: spacy` and `ner: off` alternated run by run, median of --runs after one warm-up each; the
model is loaded before (what a worker does once in `setup`), and the NER cache is emptied before
every run (a fresh worker's state), so no run profits from an earlier one. MB = UTF-8 bytes of
every text the stage scans (segments, chosen, rejected).

Quality: on `pii.py`'s chat corpus (266 two-turn chats of stdlib docstrings with 264 planted
names), planted-name recall; precision counts as correct the planted names plus the real names
the docstrings hold (reviewed by hand: REVIEWED_NAMES); every other PERSON finding is a false one.

Usage: .venv/bin/python benchmarks/pii_ner.py [--events 30000] [--runs 3] [--work DIR] [--json PATH]
"""
from __future__ import annotations

import os
import sys

sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
os.environ.setdefault("POLARS_MAX_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write  # noqa: E402

# the real person names in the docstrings of pii.py's chat corpus (seed 0, 0.3 MB), found by any
# version of the stage and reviewed by hand (2026-12-01); "J. Reynolds" is one no version finds
REVIEWED_NAMES = ("Armin Ronacher", "J. Postel", "Ratcliff", "Obershelp")


def pipeline_mix(events: int, work: Path) -> Path:
    """Training records of the quickstart's first stages (ingest, consent, extract) on synthetic logs."""
    from datakit import Pipeline
    from datakit.synth.generator import generate

    logs = work / f"logs-{events}"
    if not logs.exists():
        generate(logs, events=events, seed=1, days=3, rows_per_part=max(5_000, events // 4))
    out = work / f"records-{events}"
    if not (out / "_SUCCESS").exists():
        (Pipeline(name="pii-ner-mix", seed=0)
         .input(str(logs / "dt=*" / "*.jsonl.zst"), format="jsonl", schema="editor_event.v1")
         .add({"kind": "ingest"})
         .add({"kind": "consent", "optouts": str(logs / "optouts.parquet")})
         .add({"kind": "extract", "kinds": ["code", "fim", "sft"]})
         .output(str(out), format="parquet", shards=1)).run(engine="local", workers=1)
    return out


def text_bytes(table) -> int:
    n = sum(len(s["text"].encode()) for segs in table.column("segments").to_pylist() for s in segs or [])
    for c in ("chosen", "rejected"):
        n += sum(len(v.encode()) for v in table.column(c).to_pylist() if v)
    return n


def timings(batches, runs: int) -> dict[str, list[float]]:
    """CPU seconds per run of the stage fn, `ner: spacy` and `ner: off` alternated."""
    from datakit.stages.scrub_pii import ner as pb
    from datakit.stages.scrub_pii.stage import ScrubPiiConfig

    fns = {"spacy": ScrubPiiConfig(ner="spacy").build_fn(), "off": ScrubPiiConfig(ner="off").build_fn()}
    fns["spacy"].setup()  # the model loads once per worker, before any data
    cache = getattr(pb, "_SPANS_CACHE", {})
    out: dict[str, list[float]] = {k: [] for k in fns}
    for k in range(runs + 1):  # run 0 is the warm-up of each side
        for name, fn in fns.items():
            cache.clear()
            t0 = time.process_time()
            for b in batches:
                fn(b)
            if k:
                out[name].append(time.process_time() - t0)
    return out


def quality() -> dict:
    """Planted-name recall and precision on pii.py's chat corpus (see module doc)."""
    import pyarrow as pa

    from datakit.contracts import TRAINING_RECORD_V1
    from datakit.stages.scrub_pii.stage import ScrubPiiConfig
    from pii import chat_corpus

    recs, names = chat_corpus(300_000, 0)
    fn = ScrubPiiConfig(ner="spacy").build_fn()
    found = planted_hit = reviewed = 0
    for rec, ns in zip(recs, names):
        turns = [s["text"] for s in rec["segments"]]
        joined = "\n\n".join(turns)  # as the stage joins a record's turns
        spans, pos = [], 0
        for t in turns:
            spans.append((pos, pos + len(t)))
            pos += len(t) + 2
        for f in fn.scan([joined], [spans])[0]:
            if f.entity == "person":
                v = joined[f.start:f.end]
                found += 1
                planted_hit += any(v in n or n in v for n in ns)
                reviewed += not any(v in n or n in v for n in ns) and any(v in r or r in v for r in REVIEWED_NAMES)
    # recall exactly as pii.py's run_ner counts it: the planted name is gone from the stage's output
    rows = [r for i in range(0, len(recs), 500)
            for r in fn(pa.RecordBatch.from_pylist(recs[i:i + 500], schema=TRAINING_RECORD_V1)).to_pylist()]
    replaced = sum(1 for rec, ns in zip(rows, names) for n in ns
                   if n not in "\n".join(s["text"] for s in rec["segments"]))
    planted = sum(map(len, names))
    return {"planted": planted, "replaced": replaced, "findings": found, "correct": planted_hit + reviewed,
            "precision": round((planted_hit + reviewed) / max(1, found), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=30_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", type=Path, default=None, help="keep logs and records here (default: a temp dir)")
    ap.add_argument("--json", default=None, help="where to write the result (default benchmarks/results/)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    import pyarrow.parquet as pq

    from datakit.stages.scrub_pii.ner import installed_spacy_model, model_version

    model = installed_spacy_model()
    if model is None:
        print("no spaCy English pipeline installed: nothing to measure")
        return 0
    with tempfile.TemporaryDirectory(prefix="pii-ner-") as tmp:
        work = args.work or Path(tmp)
        table = pq.read_table(pipeline_mix(args.events, work) / "data")
        mb = text_bytes(table) / 1e6
        t = timings(table.to_batches(max_chunksize=4096), args.runs)
    on, off = statistics.median(t["spacy"]), statistics.median(t["off"])
    q = quality()
    print(f"scrub_pii on the quickstart mix ({args.events} events -> {table.num_rows} records, {mb:.1f} MB of text), "
          f"{model} {model_version(model)}, CPU s per run: ner spacy {t['spacy']}, ner off {t['off']}")
    print(f"  ner: spacy  {mb / on:7.2f} MB per CPU-s   (NER's own share {on - off:.2f} of {on:.2f} s)")
    print(f"  ner: off    {mb / off:7.2f} MB per CPU-s")
    print(f"  chat corpus: planted names replaced {q['replaced']}/{q['planted']}; PERSON findings {q['findings']}, "
          f"{q['correct']} of them names (precision {q['precision']})")
    row = {"name": "scrub_pii with NER on the quickstart mix (stage fn, 1 core)",
           "value": f"{mb / on:.1f} MB per CPU-s",
           "conditions": f"{mb:.1f} MB of text in {table.num_rows} records ({args.events} synthetic events through "
                         f"ingest/consent/extract), 4096-row batches, {model} {model_version(model)}, median of "
                         f"{args.runs} runs alternated with ner: off after 1 warm-up each",
           "detail": f"ner: off {mb / off:.1f} MB per CPU-s on the same batches; planted-name recall "
                     f"{q['replaced']}/{q['planted']} and precision {q['precision']} on pii.py's docstring chats"}
    row["numbers"] = {"mb_per_cpu_s": round(mb / on, 2), "names_replaced": q["replaced"], "names_planted": q["planted"]}
    write("pii_ner", [], {"mb": mb, "records": table.num_rows, "cpu_s": t, "quality": q, "model": model},
          path=args.json, measurements=[row])
    return 0


if __name__ == "__main__":
    sys.exit(main())
