"""Quality gates, the run report, validate and diff: a matched baseline that differs by one dedup setting.

Run:  .venv/bin/python examples/quality_gates.py  (after `make demo` made demo/logs)
Then open demo/out/gates-a/_report.html and demo/out/gates-diff.html in a browser.
"""
from __future__ import annotations

import json
from pathlib import Path

from datakit import Pipeline
from datakit.quality import validate_path
from datakit.quality.diff import diff, summary_lines, to_html
from datakit.quality.expect import QualityGateError

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "demo" / "logs"


def pipeline(out: Path, threshold: float) -> Pipeline:
    return (Pipeline("gates", seed=0)
            .input(str(LOGS / "dt=*" / "*.jsonl.zst"))
            .add({"kind": "ingest"})
            .add({"kind": "consent", "optouts": str(LOGS / "optouts.parquet")})
            .add({"kind": "extract", "kinds": ["code", "fim", "sft"], "expect": [
                # error (default): the run stops before anything is published, naming stage + expectation
                {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "kind", "value_set": ["code", "fim", "sft"]}},
                # warn: recorded in _run.json and the report
                {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "source.language", "mostly": 0.99},
                 "severity": "warn"}]})
            .add({"kind": "scrub_pii", "ner": "off"})
            .add({"kind": "dedup", "minhash": {"threshold": threshold}})
            .output(str(out), format="parquet", shards=2, quality=True))  # + the shipped suites at every boundary


if __name__ == "__main__":
    a, b = ROOT / "demo" / "out" / "gates-a", ROOT / "demo" / "out" / "gates-b"
    try:
        res = pipeline(a, 0.8).run(workers=1, report=True)
        pipeline(b, 0.6).run(workers=1)
    except QualityGateError as e:
        raise SystemExit(f"quality gate: {e}")
    for stage in res.stages:
        for r in stage.get("expectations", []):
            print(f"{stage['name']:>10} {'ok  ' if r['success'] else r['severity']:<5} {r['type']}({r.get('column', '')})")
    print("report:", res.extra["report"])
    print("validate:", json.dumps({k: v for k, v in validate_path(str(a), workers=1).items() if k != "results"}))
    d = diff(str(a), str(b))
    print("\n".join(summary_lines(d)))
    (ROOT / "demo" / "out" / "gates-diff.html").write_text(to_html(d))
