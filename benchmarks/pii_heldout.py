"""PII/secret recall on the held-out corpus (tests/data/pii_heldout/corpus.jsonl), ours vs presidio.

The corpus holds values from sources the detectors were not written against (published processor
test cards, the IBAN registry's samples, libphonenumber's example numbers, Faker, provider-documented
key formats) in human-style chat, log and config carriers: see benchmarks/pii_heldout_build.py.
This number is reported separately from benchmarks/pii.py's synthetic recall, which overstates it.

Scoring: a label is found when a detection of the same class overlaps it (every secret entity of
ours counts as class "secret"; presidio has no secret recognizers). False positives: detections that
overlap no label (the corpus' negatives are the IBAN registry's mangled numbers and every carrier's
own text).

Usage: .venv/bin/python benchmarks/pii_heldout.py [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPUS = ROOT / "tests" / "data" / "pii_heldout" / "corpus.jsonl"

PII = {"email", "ipv4", "ipv6", "phone", "credit_card", "iban", "us_ssn", "home_dir_user", "person"}
PRESIDIO_CLASS = {"EMAIL_ADDRESS": "email", "IP_ADDRESS": "ip", "PHONE_NUMBER": "phone",
                  "CREDIT_CARD": "credit_card", "IBAN_CODE": "iban", "US_SSN": "us_ssn"}


def klass(entity: str) -> str:
    if entity in ("ipv4", "ipv6"):
        return "ip"
    return entity if entity in PII else "secret"


def load() -> list[dict]:
    return [json.loads(x) for x in CORPUS.read_text().splitlines()]


def ours(texts: list[str]) -> list[list[tuple[int, int, str]]]:
    import pyarrow as pa

    from datakit.stages.scrub_pii.stage import ScrubPiiConfig
    found = ScrubPiiConfig(ner="off").build_fn().scan(pa.array(texts, pa.string()))
    return [[(f.start, f.end, klass(f.entity)) for f in fs] for fs in found]


def presidio(texts: list[str]) -> list[list[tuple[int, int, str]]]:
    from tests.support.presidio_baseline import presidio_default_analyzer
    logging.getLogger("presidio-analyzer").setLevel(logging.ERROR)
    an = presidio_default_analyzer(regex_phone=False)  # predefined recognizers, offline, no spaCy
    out = []
    for t in texts:
        res = an.analyze(text=t, language="en")
        out.append([(x.start, x.end, PRESIDIO_CLASS.get(x.entity_type, "other")) for x in res])
    return out


def score(docs: list[dict], found: list[list[tuple[int, int, str]]]) -> dict:
    """Per class tp/fn and per source group recall; false positives = detections overlapping no label."""
    by_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_source: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    fp = 0
    missed: list[str] = []
    for d, fs in zip(docs, found):
        for a, b, c in d["labels"]:
            hit = any(fc == c and fa < b and a < fb for fa, fb, fc in fs)
            by_class[c][0 if hit else 1] += 1
            group = ":".join(d["source"].split(":")[:2])
            by_source[group][0 if hit else 1] += 1
            if not hit:
                missed.append(d["source"])
        for fa, fb, fc in fs:
            if fc != "other" and not any(fa < b and a < fb for a, b, _ in d["labels"]):
                fp += 1
    rec = {c: round(tp / (tp + fn), 3) for c, (tp, fn) in sorted(by_class.items())}
    src = {s: [tp, tp + fn] for s, (tp, fn) in sorted(by_source.items())}
    return {"recall": rec, "by_source": src, "false_positives": fp, "missed": sorted(set(missed))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the scores here")
    ap.add_argument("--no-presidio", action="store_true")
    args = ap.parse_args()
    docs = load()
    texts = [d["text"] for d in docs]
    result = {"documents": len(docs), "ours": score(docs, ours(texts))}
    if not args.no_presidio:
        result["presidio"] = score(docs, presidio(texts))
    print(f"held-out corpus: {len(docs)} documents ({CORPUS.relative_to(ROOT)})")
    systems = [s for s in ("ours", "presidio") if s in result]
    classes = sorted({c for s in systems for c in result[s]["recall"]})
    print(f"{'class':<14}" + "".join(f"{s:>12}" for s in systems))
    for c in classes:
        print(f"{c:<14}" + "".join(f"{result[s]['recall'].get(c, 0.0):>12.3f}" for s in systems))
    print(f"{'false pos.':<14}" + "".join(f"{result[s]['false_positives']:>12}" for s in systems))
    print("ours, recall by source:")
    for s, (tp, n) in result["ours"]["by_source"].items():
        print(f"  {s:<34} {tp:>4}/{n:<4}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
