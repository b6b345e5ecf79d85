"""Reward summaries of a `kto` output: what a researcher checks before training on feedback.

Written after the run to `_reports/feedback.json` (a side output: the leading
underscore keeps dataset readers away) and linked from `_run.json` as
`reports.feedback`; the schema is `schemas/feedback_report.v1.json`. It is
computed from the committed rows, so both engines give the same bytes.

Groups: `by_language` (source.language), `by_completion_chars` and
`by_latency_ms` (fixed buckets below). Per group: `examples`, `accepted`
(outcome accepted), `acceptance_rate` (accepted / examples), `label_rate`
(label true / examples), `mean_reward`, and `outcomes` (count per outcome).
Outcomes the pipeline dropped (e.g. `ignored` with the default policy) are not
in the output, so they are not in these rates; `_run.json` counts them.
"""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from datakit.io.atomic import read_json, write_json_atomic
from datakit.io.dataset import read_output

REPORT_FILE = "_reports/feedback.json"
REPORT_VERSION = "feedback_report.v1"
# (label, upper bound exclusive); the last bucket is open
CHAR_BUCKETS = (("1-16", 17), ("17-64", 65), ("65-256", 257), ("257-1024", 1025), (">1024", None))
LATENCY_BUCKETS = (("<100", 100), ("100-249", 250), ("250-499", 500), ("500-999", 1000), ("1000-4999", 5000),
                   (">=5000", None))


def bucket(value: int | None, buckets: tuple[tuple[str, int | None], ...]) -> str:
    if value is None:
        return "unknown"
    for name, upper in buckets:
        if upper is None or value < upper:
            return name
    return buckets[-1][0]


def _group(rows: list[dict]) -> dict[str, Any]:
    n = len(rows)
    outcomes: dict[str, int] = defaultdict(int)
    for r in rows:
        outcomes[r["outcome"] or "none"] += 1
    accepted = outcomes.get("accepted", 0)
    return {"examples": n, "accepted": accepted,
            "acceptance_rate": round(accepted / n, 6) if n else 0.0,
            "label_rate": round(sum(1 for r in rows if r["label"]) / n, 6) if n else 0.0,
            "mean_reward": round(sum(r["reward"] for r in rows) / n, 6) if n else 0.0,
            "outcomes": dict(sorted(outcomes.items()))}


def _by(rows: list[dict], key: str, order: list[str] | None = None) -> list[dict[str, Any]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r[key]].append(r)
    names = [b for b in order if b in groups] + sorted(set(groups) - set(order)) if order else sorted(groups)
    return [{key: name, **_group(groups[name])} for name in names]


def summarize(path: str) -> dict[str, Any]:
    """The reward summary of the committed `kto` output at `path`."""
    t = read_output(path, columns=["completion", "label", "reward", "source", "meta"])
    rows = []
    for comp, label, reward, src, meta in zip(*(t.column(c).to_pylist() for c in t.column_names)):
        m = json.loads(meta or "{}")
        rows.append({"outcome": m.get("outcome"), "label": bool(label), "reward": float(reward or 0.0),
                     "language": (src or {}).get("language") or "unknown",
                     "completion_chars": bucket(len(comp or "") or None, CHAR_BUCKETS),
                     "latency_ms": bucket(m.get("latency_ms"), LATENCY_BUCKETS),
                     "retained": m.get("retained")})
    known = [r for r in rows if r["retained"] is not None]
    return {
        "report": REPORT_VERSION,
        "total": _group(rows),
        "by_language": _by(rows, "language"),
        "by_completion_chars": _by(rows, "completion_chars", [b for b, _ in CHAR_BUCKETS] + ["unknown"]),
        "by_latency_ms": _by(rows, "latency_ms", [b for b, _ in LATENCY_BUCKETS] + ["unknown"]),
        "retention": {"known": len(known), "retained": sum(1 for r in known if r["retained"]),
                      "rate": round(sum(1 for r in known if r["retained"]) / len(known), 6) if known else None},
    }


def write_report(path: str) -> dict[str, Any]:
    """Write `_reports/feedback.json` beside the output and link it from `_run.json`; return the summary."""
    out = str(path).rstrip("/")
    summary = summarize(out)
    write_json_atomic(f"{out}/{REPORT_FILE}", summary)
    run = read_json(f"{out}/_run.json")
    if run is not None:
        run.setdefault("reports", {})["feedback"] = REPORT_FILE
        write_json_atomic(f"{out}/_run.json", run)
    return summary
