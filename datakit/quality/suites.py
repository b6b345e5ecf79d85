"""Which suite checks which stage boundary.

A suite file (`quality/NAME.json`) is data: a name, a description, `after`
(the stage kinds whose output rows it checks), optional `requires` (stage kinds that
must have run by then: `scrubbed_records` says nothing about rows no scrub_pii read)
and GX expectations, each with an optional `severity` (default `error`). `output: {quality: true}` attaches, after
every stage, the suites whose `after` names that stage's kind; `quality: NAME`
attaches that one suite after the last stage. An expectation whose column a
stage's rows do not have is skipped there (one records suite serves extract,
scrub_pii, dedup and decontaminate alike).
"""
from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

from datakit.quality.columns import available
from datakit.quality.expect import Expectation
from datakit.quality.gx import list_suites, load_suite


def boundary_suites(kind: str, quality: bool | str, last: bool, ran: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The suites to check after a stage of `kind`; `ran`: the kinds of the stages up to this one."""
    if isinstance(quality, str):
        return [load_suite(quality)] if last else []
    if not quality:
        return []
    return [s for s in (load_suite(n) for n in list_suites()) if applies_after(s, kind, ran or (kind,))]


def applies_after(suite: dict[str, Any], kind: str | None, ran: Sequence[str]) -> bool:
    """Whether `suite` checks the rows after a stage of `kind`, the stages of kinds `ran` having run.

    Found in review: the README's own pipeline (ingest, consent, extract, dedup: no scrub_pii) failed
    `datakit validate` on `scrubbed_records`, whose `after` names dedup because it checks scrubbed
    rows *still* hold no secret after later stages, not that dedup scrubs."""
    return kind in suite.get("after", []) and all(r in ran for r in suite.get("requires", []))


def expectations(suite: dict[str, Any], schema: pa.Schema) -> list[Expectation]:
    """The suite's expectations that apply to rows of `schema` (custom `packed` checks never do)."""
    cols = available(schema)
    out = []
    for e in suite.get("expectations", []):
        exp = Expectation(**e)
        if all(c in cols for c in exp.columns()):
            out.append(exp)
    return out
