"""The result model of a contamination check and its JSON form (schemas/contamination_report.v1.json).

Why a module of its own: the check computes, this says what was found, and
`render.py` shows it (table, HTML). Scripts read the JSON, so its existing keys
stay; new keys are only ever added.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from datakit.stages.decontaminate.matcher import Rule
from datakit.stages.decontaminate.redact import Redaction

REPORT_SCHEMA = "contamination_report.v1"


@dataclass
class ItemResult:
    eval_id: str
    ngrams: int
    ngrams_matched: int
    overlap: float
    documents: int | None


@dataclass
class Match:
    """One (item, document) match. `snippet` is the short form; the `doc_*`/`eval_*` fields are the
    side-by-side evidence: both texts (redacted, then clipped), the 1-based line each excerpt starts at,
    and the character spans of each excerpt that the other side shares (recomputed on the redacted text,
    so a redacted secret is never marked)."""

    eval_id: str
    doc_id: str | None
    data: str
    overlap: float
    ngrams_matched: int
    snippet: str
    doc_line: int | None = None
    doc_excerpt: str | None = None
    doc_spans: list[list[int]] = field(default_factory=list)
    eval_field: str | None = None
    eval_line: int | None = None
    eval_excerpt: str | None = None
    eval_spans: list[list[int]] = field(default_factory=list)


@dataclass
class NearItem:
    """An item that shared n-grams with some document but stayed under the rule (listed, not counted)."""

    eval_id: str
    ngrams: int
    ngrams_matched: int
    overlap: float
    doc_id: str | None


@dataclass
class EvalResult:
    name: str
    source: str
    fields: list[str]
    items: int
    items_without_ngrams: int
    contaminated: list[ItemResult] = field(default_factory=list)
    matches: list[Match] = field(default_factory=list)
    near_threshold: list[NearItem] = field(default_factory=list)

    @property
    def contaminated_items(self) -> int:
        return len(self.contaminated)

    @property
    def rate(self) -> float:
        return self.contaminated_items / self.items if self.items else 0.0


@dataclass
class CheckResult:
    ngram: int
    normalizations: list[str]
    rule: Rule
    threshold: float
    data: list[dict[str, Any]]
    evals: list[EvalResult]
    max_items_per_ngram: int = 1
    ignored_common: int = 0
    seconds: float = 0.0
    redaction: Redaction = field(default_factory=Redaction)
    robust: bool = False
    views: list[str] = field(default_factory=list)
    reference: dict | None = None
    ignored_reference: int = 0

    @property
    def contaminated(self) -> bool:
        return any(e.rate > self.threshold for e in self.evals)

    @property
    def exit_code(self) -> int:
        return 1 if self.contaminated else 0

    @property
    def skipped_lines(self) -> int:
        return sum(int(d.get("skipped_lines") or 0) for d in self.data)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (schemas/contamination_report.v1.json). No timings: same input, same bytes."""
        return {
            "schema": REPORT_SCHEMA,
            "settings": {"ngram": self.ngram, "normalizations": self.normalizations,
                         "min_ngrams": self.rule.min_ngrams, "min_fraction": self.rule.min_fraction,
                         "threshold": self.threshold, "max_items_per_ngram": self.max_items_per_ngram,
                         "min_ngrams_any": self.rule.min_ngrams_any,
                         "min_fraction_loose": self.rule.min_fraction_loose, "robust": self.robust, "views": self.views,
                         "reference": self.reference},
            "eval_ngrams_ignored_common": self.ignored_common,
            "eval_ngrams_ignored_reference": self.ignored_reference,
            "contaminated": self.contaminated,
            "skipped_lines": self.skipped_lines,
            "redaction": self.redaction.to_dict(),
            "data": self.data,
            "evals": [{
                "name": e.name, "source": e.source, "fields": e.fields, "items": e.items,
                "items_without_ngrams": e.items_without_ngrams, "contaminated_items": e.contaminated_items,
                "rate": round(e.rate, 6), "contaminated": [asdict(i) for i in e.contaminated],
                "matches": [asdict(m) for m in e.matches],
                "near_threshold": [asdict(x) for x in e.near_threshold],
            } for e in self.evals],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def write_json(self, path: str) -> None:
        from datakit.io.atomic import write_user_file

        write_user_file(path, self.to_json().encode())

    def write_html(self, path: str) -> None:
        from datakit.io.atomic import write_user_file
        from datakit.stages.decontaminate.render import render_html

        write_user_file(path, render_html(self).encode())

    def print_table(self, console=None, examples: int = 3) -> None:
        from datakit.stages.decontaminate.render import print_table

        print_table(self, console, examples)
