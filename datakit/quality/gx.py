"""Glue to great-expectations 1.x: suite files, and a whole-table check of one small in-memory table.

Outputs and stage boundaries are checked batch by batch inside the engines
(`expect.py`, `validate.py`); `validate_table` is for a table already in
memory (a notebook, a test).

Why GX and not hand-written asserts: the suites are data, reviewable by people
who do not read our code, and GX's result documents say exactly which
expectation failed on how many rows. Why our own JSON files: GX 1.x suites are
plain `{type, kwargs}` lists, so we ship them inside the package (the repo's
top-level `quality/` is a symlink to `datakit/quality/suites/`) and build the GX
objects at run time in an ephemeral context (no GX project folder to manage).

Nested columns are flattened with dots (`source.user_id`), and two derived
columns help record suites: `n_segments` and `text_chars`.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datakit.quality.columns import DERIVED


def import_gx() -> Any:
    """`great_expectations`, imported so that pyspark cannot end the process while it loads.

    Why: GX imports `pyspark.sql.connect` when pyspark is installed, and pyspark 4.3 takes a process
    whose `__main__` has neither a spec nor a file (and no `sys.ps1`) for a doctest run: without grpc
    it prints "Skipping doctests" and calls `sys.exit(0)`. Local pool workers (spawned by the `datakit`
    command) and `python -c` look like that, so a run with quality suites on a pool published nothing
    and exited 0 (found in review). `sys.ps1` is set only for the import, and only in such a process."""
    import sys

    if "great_expectations" in sys.modules:
        if not _GX_QUIET:
            _quiet_gx_loggers()
        return sys.modules["great_expectations"]
    main = sys.modules.get("__main__")
    looks_like_doctests = (main is not None and getattr(main, "__spec__", None) is None
                           and not hasattr(main, "__file__") and not hasattr(sys, "ps1"))
    if looks_like_doctests:
        sys.ps1 = ""  # type: ignore[attr-defined]
    try:
        import great_expectations
    finally:
        if looks_like_doctests:
            del sys.ps1  # type: ignore[attr-defined]
    # its INFO lines ("Created temporary directory ... for ephemeral docs site") are GX's housekeeping, not
    # ours: they led `datakit validate`'s output (found in a docs review); its warnings still show
    _quiet_gx_loggers()
    return great_expectations


_GX_QUIET = False


def _quiet_gx_loggers() -> None:
    """GX's loggers at WARNING (it sets one of its own to INFO at import, so the parent's level alone does
    not hold it); once per process."""
    global _GX_QUIET
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if (name == "great_expectations" or name.startswith("great_expectations.")) \
                and isinstance(lg, logging.Logger) and lg.level in (logging.NOTSET, logging.INFO, logging.DEBUG):
            lg.setLevel(logging.WARNING)
    _GX_QUIET = True
from datakit.resources import suite_document, suite_names

log = logging.getLogger("datakit.quality")


@dataclass
class QualityResult:
    suite: str
    success: bool
    rows: int
    failed: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"suite": self.suite, "success": self.success, "rows": self.rows, "failed": self.failed}


def list_suites() -> list[str]:
    """Names of the suites shipped in datakit/quality/suites/."""
    return suite_names()


def load_suite(name_or_path: str) -> dict[str, Any]:
    """A suite by name (shipped: datakit/quality/suites/NAME.json) or by path to a .json file."""
    p = Path(name_or_path)
    if p.suffix != ".json":
        doc = suite_document(name_or_path)
        if doc is None:
            raise FileNotFoundError(f"no quality suite {name_or_path!r}; known: {suite_names()}")
        return doc
    if not p.exists():
        raise FileNotFoundError(f"no quality suite file {name_or_path!r}; known suites: {suite_names()}")
    return json.loads(p.read_text())


def _flatten(table: pa.Table) -> "Any":
    """Arrow -> pandas with dotted nested columns and the derived record columns."""
    cols: dict[str, Any] = {}
    for f in table.schema:
        col = table.column(f.name)
        if pa.types.is_struct(f.type):
            for sub in f.type:
                cols[f"{f.name}.{sub.name}"] = pc.struct_field(col, sub.name)
        elif pa.types.is_list(f.type):
            cols[f"n_{f.name}"] = pc.list_value_length(col)
            if f.name == "segments":  # the same definition as a pipeline's checks (quality/columns.py)
                cols["text_chars"] = DERIVED["text_chars"][1](table)
        else:
            cols[f.name] = col
    return pa.table(cols).to_pandas()


def validate_table(table: pa.Table, suite: str | dict[str, Any]) -> QualityResult:
    """Validate one table against a suite; returns which expectations failed and on how many rows."""
    gx = import_gx()

    spec = load_suite(suite) if isinstance(suite, str) else suite
    df = _flatten(table)
    ctx = gx.get_context(mode="ephemeral")
    bd = ctx.data_sources.add_pandas("datakit").add_dataframe_asset("table").add_batch_definition_whole_dataframe("all")
    gx_suite = gx.ExpectationSuite(name=spec["name"])
    for e in spec["expectations"]:
        if "column" in e["kwargs"] and e["kwargs"]["column"] not in df.columns:
            continue  # a column this dataset does not have (e.g. privacy_mode after extract)
        cls = "".join(part.capitalize() for part in e["type"].split("_"))
        gx_suite.add_expectation(getattr(gx.expectations, cls)(**e["kwargs"]))
    gx_suite = ctx.suites.add(gx_suite)
    import os

    old = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"  # GX's per-metric progress bars would flood a job's log
    try:
        res = bd.get_batch(batch_parameters={"dataframe": df}).validate(gx_suite, result_format="SUMMARY")
    finally:
        if old is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = old
    failed = []
    for r in res.results:
        if not r.success:
            failed.append({"expectation": r.expectation_config.type,
                           "column": r.expectation_config.kwargs.get("column"),
                           "unexpected_count": (r.result or {}).get("unexpected_count")})
    return QualityResult(suite=spec["name"], success=bool(res.success), rows=table.num_rows, failed=failed)
