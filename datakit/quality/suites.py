"""Which suite checks which stage boundary.

A suite file (`quality/NAME.json`) is data: a name, a description, `after`
(the stage kinds whose output rows it checks) and GX expectations, each with an
optional `severity` (default `error`). `output: {quality: true}` attaches, after
every stage, the suites whose `after` names that stage's kind; `quality: NAME`
attaches that one suite after the last stage. An expectation whose column a
stage's rows do not have is skipped there (one records suite serves extract,
scrub_pii, dedup and decontaminate alike).
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from datakit.quality.columns import available
from datakit.quality.expect import Expectation
from datakit.quality.gx import list_suites, load_suite


def boundary_suites(kind: str, quality: bool | str, last: bool) -> list[dict[str, Any]]:
    """The suites to check after a stage of `kind`."""
    if isinstance(quality, str):
        return [load_suite(quality)] if last else []
    if not quality:
        return []
    return [s for s in (load_suite(n) for n in list_suites()) if kind in s.get("after", [])]


def expectations(suite: dict[str, Any], schema: pa.Schema) -> list[Expectation]:
    """The suite's expectations that apply to rows of `schema` (custom `packed` checks never do)."""
    cols = available(schema)
    out = []
    for e in suite.get("expectations", []):
        exp = Expectation(**e)
        if all(c in cols for c in exp.columns()):
            out.append(exp)
    return out
