"""A stage's batches must match the schema it declared: a mismatch is a stage bug and fails the run.

Why not fill and cast: a stage whose batches lose a declared column (say `doc_id`) used to get it
filled with nulls, and a column of another kind (a number where a string was declared) cast to the
declared type; the run committed data that no longer said what it meant. Both engines call
`check_stage_output` on every map function's output before conforming it, so the rule is one rule.

What is allowed: the declared type, or a representation of the same kind that casts without
changing meaning -- `large_string`/`string_view` for `string` (polars writes those), wider or
narrower integers (a failing cast, i.e. overflow, is an error too), a dictionary-encoded column,
an all-null column (`pa.array([None] * n)` has the null type), and list/struct columns whose
children follow the same rule. Extra columns are dropped (helper columns such as `_source_file`).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.types as pat

from datakit.errors import DatakitError


class StageOutputError(DatakitError, RuntimeError):
    """A stage returned a batch that does not match its declared schema. The CLI exits 3."""


def _kind(t: pa.DataType) -> str:
    if pat.is_string(t) or pat.is_large_string(t) or pat.is_string_view(t):
        return "string"
    if pat.is_binary(t) or pat.is_large_binary(t) or pat.is_binary_view(t) or pat.is_fixed_size_binary(t):
        return "binary"
    if pat.is_integer(t):
        return "integer"
    if pat.is_floating(t):
        return "float"
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_list_view(t) or pat.is_large_list_view(t) \
            or pat.is_fixed_size_list(t):
        return "list"
    return str(t)


def mismatch(got: pa.DataType, want: pa.DataType, path: str) -> str | None:
    """Why a column of type `got` cannot stand for a declared `want` (None when it can)."""
    if got == want or pat.is_null(got):
        return None
    if pat.is_dictionary(got):
        return mismatch(got.value_type, want, path)
    if pat.is_struct(want):
        if not pat.is_struct(got):
            return f"column {path!r} is {got}, declared {want}"
        have = {got.field(i).name: got.field(i).type for i in range(got.num_fields)}
        for i in range(want.num_fields):
            f = want.field(i)
            if f.name not in have:
                return f"column {path + '.' + f.name!r} of the declared schema is missing"
            why = mismatch(have[f.name], f.type, f"{path}.{f.name}")
            if why:
                return why
        return None
    if _kind(got) != _kind(want):
        return f"column {path!r} is {got}, declared {want}"
    if _kind(want) == "list":
        return mismatch(got.value_type, want.value_type, f"{path}[]")
    return None


def check_stage_output(batch: pa.RecordBatch, schema: pa.Schema, stage: str, op: str) -> None:
    """Raise `StageOutputError` (one line naming the stage and the column) unless every column of
    `schema` is in `batch` with a type that stands for the declared one."""
    names = set(batch.schema.names)
    for f in schema:
        if f.name not in names:
            raise StageOutputError(f"stage {stage!r} ({op}) returned a batch without column {f.name!r} of its "
                                   "declared schema (a stage bug); nothing was committed")
        why = mismatch(batch.schema.field(f.name).type, f.type, f.name)
        if why:
            raise StageOutputError(f"stage {stage!r} ({op}) returned a batch that does not match its declared "
                                   f"schema: {why} (a stage bug); nothing was committed")


def conform_output(batch: pa.RecordBatch, schema: pa.Schema, stage: str, op: str) -> pa.RecordBatch:
    """A map function's output as exactly `schema` (columns selected and cast), after
    `check_stage_output`; a cast that still fails (an integer overflow, ...) names stage and column."""
    check_stage_output(batch, schema, stage, op)
    cols = []
    for f in schema:
        col = batch.column(f.name)
        if col.type != f.type:
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise StageOutputError(f"stage {stage!r} ({op}): column {f.name!r} cannot be cast to its declared "
                                       f"{f.type}: {str(e).splitlines()[0][:200]}; nothing was committed") from None
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, schema=schema)
