"""Expectations at stage boundaries: `expect: [...]` on a stage, checked inside the run, before commit.

Why as plan nodes and not a pass over the output: the data between stages is
never written anywhere, and a whole-table check on the driver does not scale.
Each expectation compiles to a pass-through `MapBatches` under the stage's name
that runs great-expectations on one batch at a time (on the local workers or
inside Spark executors) and reports counts in the `_metrics` column; the engines
already sum those per stage (as data on Spark, so a retried task counts once).
`accounting.stage_report` then folds the counts into each stage's
`expectations` entry and `enforce` fails the run *before* the manifest is
written when an `error` expectation failed.

Families (how a GX expectation is evaluated over batches):

- `map` (GX column-map and column-pair-map expectations: in set, regex, between,
  not null, ...): GX runs per batch; unexpected and total counts are summed, so
  `mostly` is applied to the whole stage output, exactly.
- `unique` (`expect_column_values_to_be_unique`): a per-batch check would miss
  duplicates in different batches, so the key column is aggregated by the
  engine (group by key, count) and groups of more than one row are counted.
- `row_count` (`expect_table_row_count_to_be_between` / `_to_equal`): summed.

The sample in a failure message is the unexpected value with the smallest
xxh64 (so it does not depend on batching or engine), scrubbed by the PII
detectors and clipped: no raw personal data ever reaches a log or a report.
"""
from __future__ import annotations

import json
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from pydantic import BaseModel, ConfigDict, Field

from datakit.errors import DatakitError
from datakit.io.url_secrets import hide_url_secrets
from datakit.plan import METRICS, Rel, metrics_column

_KEY = "_dk_expect_key"
_N = "_dk_expect_n"

UNIQUE = {"expect_column_values_to_be_unique"}
ROW_COUNT = {"expect_table_row_count_to_be_between", "expect_table_row_count_to_equal"}


class QualityGateError(DatakitError, RuntimeError):
    """An `error` expectation failed: the run stops before its output is published."""


class Expectation(BaseModel):
    """One GX expectation with a severity: `{type: expect_..., kwargs: {...}, severity: error|warn}`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: str = Field(description="a great-expectations 1.x expectation type, e.g. expect_column_values_to_be_in_set")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    severity: Literal["error", "warn"] = "error"
    meta: dict[str, Any] = Field(default_factory=dict, description="free text for people (why this check)")

    @property
    def column(self) -> str | None:
        return self.kwargs.get("column")

    def columns(self) -> list[str]:
        k = self.kwargs
        return [c for c in (k.get("column"), k.get("column_A"), k.get("column_B")) if c]

    def frame_columns(self, available: set[str]) -> set[str]:
        """The columns GX needs to see: the named ones and those a `row_condition` mentions."""
        import re

        cond = str(self.kwargs.get("row_condition") or "")
        return set(self.columns()) | (set(re.findall(r"[A-Za-z_][\w.]*", cond)) & available)

    def label(self) -> str:
        """`type(column=...)` for messages (never a value from the data)."""
        cols = ", ".join(f"{k}={self.kwargs[k]}" for k in ("column", "column_A", "column_B") if k in self.kwargs)
        return f"{self.type}({cols})"


def _gx_class(type_: str):
    from datakit.quality.gx import import_gx

    gx = import_gx()

    return getattr(gx.expectations, "".join(p.capitalize() for p in type_.split("_")), None)


def family(e: Expectation) -> str:
    """map | unique | row_count; a ValueError (naming what is supported) for anything else."""
    if e.type in UNIQUE:
        return "unique"
    if e.type in ROW_COUNT:
        return "row_count"
    cls = _gx_class(e.type)  # (imports great_expectations safely first: `gx.import_gx`)
    if cls is None:
        raise ValueError(f"unknown expectation type {e.type!r} (great-expectations 1.x names, e.g. "
                         "expect_column_values_to_be_in_set)")
    from great_expectations.expectations.expectation import ColumnMapExpectation, ColumnPairMapExpectation

    if issubclass(cls, (ColumnMapExpectation, ColumnPairMapExpectation)):
        return "map"
    raise ValueError(f"{e.type} needs the whole table at once; at a stage boundary use a column-map expectation, "
                     f"{sorted(UNIQUE | ROW_COUNT)}, or `datakit validate` on the output")


def check_spec(e: Expectation, schema: pa.Schema) -> str:
    """Validate type, kwargs (with GX's own model) and columns at compile time; returns the family."""
    from datakit.quality.columns import available

    fam = family(e)
    missing = [c for c in e.columns() if c not in available(schema)]
    if missing:
        raise ValueError(f"{e.label()}: no column {missing[0]!r} here; columns: {sorted(available(schema))}")
    cls = _gx_class(e.type)
    if cls is not None:  # every family (found in review: a uniqueness or row-count typo was not caught here)
        try:
            cls(**e.kwargs)
        except Exception as err:  # pydantic ValidationError from GX: the error and the field it names
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
            raise ValueError(f"{e.label()}: bad kwargs: {'; '.join(lines[:3])}") from None
    if e.type == "expect_table_row_count_to_be_between" and not ({"min_value", "max_value"} & set(e.kwargs)):
        raise ValueError(f"{e.type} needs min_value and/or max_value")
    if e.type == "expect_table_row_count_to_equal" and "value" not in e.kwargs:
        raise ValueError(f"{e.type} needs value")
    return fam


# --------------------------------------------------------------------------- redaction

_SCRUB = None


def redact(value: Any, limit: int = 60) -> str:
    """A value fit for a log line: PII/secret spans replaced by placeholders, one line, clipped."""
    global _SCRUB
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = hide_url_secrets(text)  # a presigned URL's signature (the scrubber's rules are for data)
    if _SCRUB is None:
        try:
            from datakit.stages.scrub_pii.stage import ScrubPiiConfig

            # the reference strategy: the same findings as the stage's, and on a log line (short, few
            # per run) it costs nothing, where compiling the hyperscan database costs ~0.2 CPU-s per process
            _SCRUB = ScrubPiiConfig(ner="off", strategy="python").build_fn()
        except (ImportError, OSError):
            # the scrubber cannot load (an optional dependency or a model file missing): the regex
            # redaction the contamination report falls back to. Raising here instead failed the very
            # log line that reports the fallback, and with it the command (`datakit.logs` redacts every
            # line through this function). Not cached: the next line tries the scrubber again.
            from datakit.stages.decontaminate.redact import regex_redact

            text = regex_redact(text)
    if _SCRUB is not None:
        text = _SCRUB.scrub([text])[0][0] or ""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def redact_text(text: str) -> str:
    """`text` with PII/secret spans replaced, lines and length kept (`redact`'s rules, for a log file)."""
    redact("")  # loads the scrubber (or leaves the regex fallback)
    text = hide_url_secrets(text)
    if _SCRUB is None:
        from datakit.stages.decontaminate.redact import regex_redact

        return regex_redact(text)
    return _SCRUB.scrub([text])[0][0] or ""


def _sample_key(i: int, values: list[Any]) -> dict[str, int]:
    """The unexpected value with the smallest hash (batching-independent), redacted."""
    if not values:
        return {}
    best = min(values, key=lambda v: (xxhash.xxh64_intdigest(repr(v).encode()), repr(v)))
    h = xxhash.xxh64_hexdigest(repr(best).encode())
    return {f"expect.{i}.sample:{h}:{redact(best)}": 1}


# --------------------------------------------------------------------------- per-batch functions (workers)

_GX: dict[str, Any] = {}


def _gx_batch(df: Any):
    """A GX batch over a pandas frame; the ephemeral context is made once per process."""
    if "bd" not in _GX:
        import logging

        from datakit.quality.gx import import_gx

        gx = import_gx()
        logging.getLogger("great_expectations").setLevel(logging.WARNING)  # no INFO chatter in job logs
        from great_expectations.data_context.types.base import ProgressBarsConfig

        ctx = gx.get_context(mode="ephemeral")
        # GX's per-metric progress bars would flood a job's log (one set per batch)
        ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
        _GX["bd"] = (ctx.data_sources.add_pandas("datakit").add_dataframe_asset("batch")
                     .add_batch_definition_whole_dataframe("all"))
    return _GX["bd"].get_batch(batch_parameters={"dataframe": df})


def _with_metrics(batch: pa.RecordBatch, metrics: dict[str, int]) -> pa.RecordBatch:
    if batch.num_rows == 0:
        return batch
    return pa.RecordBatch.from_arrays(list(batch.columns) + [metrics_column(batch.num_rows, metrics)],
                                      names=batch.schema.names + [METRICS])


class CheckFn:
    """Pass-through batch function: map and row-count expectations on one batch -> `_metrics` counts."""

    def __init__(self, specs: list[tuple[int, dict[str, Any]]]) -> None:
        self.specs = specs  # (index in the plan's checks, Expectation as a dict): plain data for pickling

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        from datakit.quality.columns import frame

        if batch.num_rows == 0:
            return batch
        metrics: dict[str, int] = {}
        exps = [(i, Expectation(**d)) for i, d in self.specs]
        maps = [(i, e) for i, e in exps if e.type not in ROW_COUNT]
        for i, e in exps:
            if e.type in ROW_COUNT:
                metrics[f"expect.{i}.n"] = batch.num_rows
        if maps:
            from datakit.quality.columns import available

            avail = available(batch.schema)
            df = frame(batch, {c for _, e in maps for c in e.frame_columns(avail)})
            gx_batch = _gx_batch(df)
            for i, e in maps:
                kwargs = {k: v for k, v in e.kwargs.items() if k != "mostly"}  # applied to the whole stage
                res = gx_batch.validate(_gx_class(e.type)(**kwargs), result_format={"result_format": "COMPLETE"})
                why = _gx_error(res.exception_info)
                if why is not None:  # found in review: a check GX could not run (a row_condition on a missing
                    # column, `between` on strings) was counted 0 of 0 and passed, even at severity error
                    raise ValueError(f"{e.label()} could not run: {why}")
                r = res.result or {}
                total = int(r.get("element_count") or 0)
                if e.type != "expect_column_values_to_not_be_null":
                    total -= int(r.get("missing_count") or 0)
                bad = int(r.get("unexpected_count") or 0)
                metrics[f"expect.{i}.n"] = total
                metrics[f"expect.{i}.bad"] = bad
                if bad:
                    metrics.update(_sample_key(i, list(r.get("unexpected_list") or [])))
        return _with_metrics(batch, metrics)


def _gx_error(info: Any) -> str | None:
    """The first error GX caught while validating (its `exception_info` is flat, or keyed by metric), or None."""
    if not isinstance(info, dict):
        return None
    entries = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    for entry in entries:
        if entry.get("raised_exception"):
            lines = str(entry.get("exception_message") or "").strip().splitlines()
            return lines[0][:200] if lines else "great_expectations raised an error"
    return None


class KeyFn:
    """The key column of a uniqueness expectation, for the engine's group-by."""

    def __init__(self, column: str) -> None:
        self.column = column

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        from datakit.quality.columns import column

        key = column(batch, self.column).cast(pa.string())
        return pa.RecordBatch.from_arrays([key], names=[_KEY])


class DuplicateCountFn:
    """Over (key, count) groups: how many rows share a key with another row (nulls are not counted)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if batch.num_rows == 0:
            return batch
        keys, counts = batch.column(_KEY), batch.column(_N)
        valid = pc.is_valid(keys)
        total = int(pc.sum(pc.filter(counts, valid)).as_py() or 0)
        dup = pc.and_(valid, pc.greater(counts, 1))
        bad = int(pc.sum(pc.filter(counts, dup)).as_py() or 0)
        metrics = {f"expect.{self.index}.n": total, f"expect.{self.index}.bad": bad}
        if bad:
            metrics.update(_sample_key(self.index, pc.filter(keys, dup).to_pylist()))
        return _with_metrics(batch, metrics)


class DropColumnsFn:
    """Back to the stage's own schema after the uniqueness join added the count column."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.select(self.names)


# --------------------------------------------------------------------------- compile

def attach(rel: Rel, expectations: list[Expectation], checks: list[dict[str, Any]]) -> Rel:
    """Add the check nodes of `expectations` after `rel` (under its stage name); `checks` (the plan's
    list) gets one entry per expectation, whose index names its counters."""
    maps: list[tuple[int, dict[str, Any]]] = []
    uniques: list[tuple[int, Expectation]] = []
    for e in expectations:
        fam = check_spec(e, rel.schema)
        i = len(checks)
        checks.append({"stage": rel.stage, "index": i, "family": fam, **e.model_dump(mode="json")})
        if fam == "unique":
            uniques.append((i, e))
        else:
            maps.append((i, e.model_dump(mode="json")))
    if maps:
        rel = rel.map_batches(CheckFn(maps), rel.schema, name="expect")
    for i, e in uniques:
        names = list(rel.schema.names)
        key_schema = pa.schema([pa.field(_KEY, pa.string())])
        keys = rel.map_batches(KeyFn(e.column), key_schema, name="expect_key")
        groups = keys.aggregate([_KEY], {_N: ("count", _KEY)})
        counted = groups.map_batches(DuplicateCountFn(i), groups.schema, name="expect_unique")
        if e.column in names:
            joined = rel.join(counted, e.column, _KEY, how="left")
        else:  # a derived key (content_hash): computed on the main side too, to join on
            keyed_schema = pa.schema(list(rel.schema) + [pa.field(_KEY, pa.string())])
            keyed = rel.map_batches(_AddKeyFn(e.column), keyed_schema, name="expect_key")
            joined = keyed.join(counted, _KEY, how="left")
        rel = joined.map_batches(DropColumnsFn(names), rel.schema, name="expect_done")
    return rel


class _AddKeyFn:
    def __init__(self, column: str) -> None:
        self.column = column

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        key = KeyFn(self.column)(batch).column(0)
        return pa.RecordBatch.from_arrays(list(batch.columns) + [key], names=batch.schema.names + [_KEY])


# --------------------------------------------------------------------------- after the run (driver)

def fold(checks: list[dict[str, Any]], stage: str, metrics: dict[str, int]) -> tuple[dict[str, int], list[dict]]:
    """Split a stage's metrics into its own counters and the results of its expectations."""
    own = {k: v for k, v in metrics.items() if not k.startswith("expect.")}
    results = []
    for c in checks:
        if c["stage"] != stage:
            continue
        i = c["index"]
        n, bad = metrics.get(f"expect.{i}.n", 0), metrics.get(f"expect.{i}.bad", 0)
        prefix = f"expect.{i}.sample:"
        samples = sorted(k[len(prefix):] for k in metrics if k.startswith(prefix))
        k = c["kwargs"]
        if c["family"] == "row_count":
            lo = k.get("value", k.get("min_value"))
            hi = k.get("value", k.get("max_value"))
            ok = (lo is None or (n > lo if k.get("strict_min") else n >= lo)) and \
                 (hi is None or (n < hi if k.get("strict_max") else n <= hi))  # GX's strict bounds too
            bad = 0 if ok else 1
        else:
            mostly = k.get("mostly")
            ok = bad == 0 if mostly is None else (n == 0 or (n - bad) / n >= float(mostly))
        r = {"type": c["type"], "severity": c["severity"], "success": bool(ok), "rows": n, "unexpected": bad}
        for key in ("column", "column_A", "column_B"):
            if key in k:
                r[key] = k[key]
        if c.get("suite"):
            r["suite"] = c["suite"]
        if samples and not ok:
            r["sample"] = samples[0].split(":", 1)[1]  # drop the ordering hash
        results.append(r)
    return own, results


def failure_line(stage: str, r: dict[str, Any]) -> str:
    cols = ", ".join(f"{k}={r[k]}" for k in ("column", "column_A", "column_B") if k in r)
    what = f"{r['unexpected']} of {r['rows']} rows unexpected" if r["type"] not in ROW_COUNT else f"{r['rows']} rows"
    sample = f"; sample: {r['sample']!r}" if r.get("sample") is not None else ""
    return f"quality gate failed at stage {stage!r}: {r['type']}({cols}): {what}{sample}"


def enforce(stages: list[dict[str, Any]]) -> None:
    """Raise `QualityGateError` (one line: stage, expectation, redacted sample) for the first failed error."""
    for s in stages:
        for r in s.get("expectations", []):
            if not r["success"] and r["severity"] == "error":
                raise QualityGateError(failure_line(s["name"], r))
