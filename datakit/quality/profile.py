"""What the run report plots, counted inside the run: documents, lengths and tokens by kind and language.

Why counted during the run and not read back from the output: a packed output
no longer has text or language, and reading a large output again to draw a few
histograms would cost a second pass. A pass-through node after a stage adds
integer counters to the `_metrics` column (summed by both engines, as data on
Spark); `accounting.stage_report` moves them from the stage's `metrics` into its
`profile` entry:

    {"docs": {"code|python": 120, ...},
     "chars": {"code|python": {"9": 40, "10": 80}},   # log2 buckets: 2**(b-1) <= n < 2**b
     "tokens": {"code|python": {...}}, "token_sum": {"code|python": 51234}}

Histograms are log2-bucketed so they merge exactly across batches, partitions
and engines.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datakit.plan import METRICS, Rel, metrics_column

PREFIX = "profile."


# a label a profile names: the shape of a language or kind name (`python`, `objective-c++`, `c#`,
# `visual basic .net`); anything else is counted as UNLISTED
_LABEL = re.compile(r"[A-Za-z0-9+#. _-]{1,40}")
# ...unless it could be a value the PII detectors look for: 7+ digits (a phone number, however
# grouped; an account number) or a 17+ character word (a key or token: `AKIA...` has 20; the longest
# language ids, such as `restructuredtext`, have 16)
_VALUE_SHAPED = re.compile(r"(?:[^0-9]*[0-9]){7}|[A-Za-z0-9_]{17}")
UNLISTED = "unlisted"


def _clean(v: Any) -> str:
    """A label: "unknown" for none; a name of a language's shape as it is (`_LABEL`), anything else
    `UNLISTED`. Why: the profile after each stage counts documents by `file.language`, a field the
    editor sends as free text, and the profile goes into `_run.json` and `--json` output. Found in
    review: an e-mail address and an AWS key sent as the language reached them through the extract
    stage's profile, before scrub_pii ran (a NUL byte there once reached stderr, too)."""
    if v is None:
        return "unknown"
    text = str(v)
    if not text:
        return "unknown"
    return text if _LABEL.fullmatch(text) and not _VALUE_SHAPED.search(text) else UNLISTED


# the languages a profile keeps by name (the most documents first); the rest are summed as "other"
MAX_LANGUAGES = 30


def _labels(col: pa.Array) -> tuple[np.ndarray, list[str]]:
    """(per row, an index into the names; the cleaned names): each distinct value cleaned once, not each row.
    Distinct values may clean to one name (None and "", long values cut at 40 characters): the counts
    are summed by name afterwards."""
    enc = pc.dictionary_encode(col)
    names = [_clean(v) for v in enc.dictionary.to_pylist()] + [_clean(None)]  # the last: null rows
    codes = pc.fill_null(enc.indices, len(names) - 1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, names


def _groups(batch: pa.RecordBatch) -> tuple[np.ndarray, list[str]]:
    """(per row, an index into the group names; the names, "kind|language").

    Why codes and not a string per row: a profile follows every stage, and building, hashing and
    counting one string per row was most of its cost (8,300 tokenized rows: 7.3 ms, 0.51 ms counted
    by code; best of 20). tests/test_profile.py holds the counts to the per-row loop's."""
    names = batch.schema.names
    n = batch.num_rows
    none = (np.zeros(n, np.int64), [_clean(None)])
    kinds = _labels(batch.column("kind")) if "kind" in names else none
    if "language" in names:
        langs = _labels(batch.column("language"))
    elif "source" in names and pa.types.is_struct(batch.schema.field("source").type) \
            and batch.schema.field("source").type.get_field_index("language") >= 0:
        langs = _labels(pc.struct_field(batch.column("source"), "language"))
    else:
        langs = none
    width = len(langs[1])
    combined = kinds[0] * width + langs[0]
    return combined, [f"{k}|{lang}" for k in kinds[1] for lang in langs[1]]


def _count(counter: Counter, key: str, codes: np.ndarray, names: list[str], weights: np.ndarray | None = None) -> None:
    """counter[f"{key}{names[c]}"] += the rows with code c (or the sum of their `weights`, 0 included),
    for every code c some row has."""
    rows = np.bincount(codes, minlength=len(names))
    # float64 sums are exact: a batch holds far fewer than 2**53 tokens
    sums = rows if weights is None else np.bincount(codes, weights=weights.astype(np.float64), minlength=len(names))
    for c in np.flatnonzero(rows).tolist():
        counter[f"{key}{names[c]}"] += int(sums[c])


def _buckets(values: np.ndarray) -> np.ndarray:
    """log2 bucket per value: 0 -> 0, 1 -> 1, 2..3 -> 2, 4..7 -> 3, ..."""
    v = np.asarray(values, dtype=np.int64)
    out = np.zeros(len(v), dtype=np.int64)
    pos = v > 0
    out[pos] = np.floor(np.log2(v[pos])).astype(np.int64) + 1
    return out


def _token_counts(batch: pa.RecordBatch) -> np.ndarray:
    n = batch.column("n_tokens").to_numpy(zero_copy_only=False).astype(np.int64)
    for extra in ("prompt_ids", "chosen_ids", "rejected_ids"):  # preference pairs carry no n_tokens
        if extra in batch.schema.names:
            n = n + pc.fill_null(pc.list_value_length(batch.column(extra)), 0).to_numpy(zero_copy_only=False)
    return n


def _histogram(counter: Counter, key: str, groups: np.ndarray, names: list[str], buckets: np.ndarray) -> None:
    """counter[f"{key}{group}|{bucket}"] += rows, per (group, log2 bucket) present."""
    width = int(buckets.max()) + 1 if len(buckets) else 1
    cells = groups * width + buckets
    labels = [f"{g}|{b}" for g in names for b in range(width)]
    _count(counter, key, cells, labels)


class ProfileFn:
    """Pass-through: counters of documents (and with `lengths`, length histograms) per kind|language."""

    def __init__(self, lengths: bool) -> None:
        self.lengths = lengths

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if batch.num_rows == 0:
            return batch
        groups, names = _groups(batch)
        c: Counter = Counter()
        _count(c, f"{PREFIX}docs|", groups, names)
        if self.lengths:
            columns = batch.schema.names
            if "n_tokens" in columns:
                toks = _token_counts(batch)
                _histogram(c, f"{PREFIX}tokens|", groups, names, _buckets(toks))
                _count(c, f"{PREFIX}token_sum|", groups, names, toks)
            elif "segments" in columns:
                from datakit.quality.columns import column

                chars = column(batch, "text_chars").to_numpy(zero_copy_only=False)
                _histogram(c, f"{PREFIX}chars|", groups, names, _buckets(chars))
        return pa.RecordBatch.from_arrays(list(batch.columns) + [metrics_column(batch.num_rows, dict(c))],
                                          names=batch.schema.names + [METRICS])


def attach(rel: Rel, lengths: bool) -> Rel:
    """Profile the rows `rel` hands on (records or tokenized documents; events are not profiled)."""
    if "kind" not in rel.schema.names:
        return rel
    return rel.map_batches(ProfileFn(lengths), rel.schema, name="profile", threads="light")


def fold(metrics: dict[str, int]) -> tuple[dict[str, int], dict[str, Any]]:
    """Split `profile.*` counters off a stage's metrics into the nested `profile` entry."""
    own: dict[str, int] = {}
    prof: dict[str, Any] = {}
    for k, v in metrics.items():
        if not k.startswith(PREFIX):
            own[k] = v
            continue
        parts = k[len(PREFIX):].split("|")
        what, group = parts[0], f"{parts[1]}|{parts[2]}"
        if what in ("chars", "tokens"):
            prof.setdefault(what, {}).setdefault(group, {})[parts[3]] = v
        else:
            prof.setdefault(what, {})[group] = v
    return own, _few_languages(prof)


def _few_languages(prof: dict[str, Any]) -> dict[str, Any]:
    """`prof` with at most MAX_LANGUAGES language names: the others' counts summed as "<kind>|other".

    Why: a language is whatever the editor sent; 3,000 distinct values in 1.6 MB of events made
    `_run.json` 1.8 MB and the report 23 MB, and drawing its legends took 142 s of a 147 s run (found
    in review). Which names stay depends only on the summed counts (ties by name), so both engines
    write the same profile."""
    totals: Counter = Counter()
    for group, v in prof.get("docs", {}).items():
        totals[group.split("|", 1)[1]] += v
    if len(totals) <= MAX_LANGUAGES:
        return prof
    keep = {lang for lang, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_LANGUAGES - 1]}

    def regroup(group: str) -> str:
        kind, lang = group.split("|", 1)
        return group if lang in keep else f"{kind}|other"

    out: dict[str, Any] = {}
    for what, groups in prof.items():
        merged: dict[str, Any] = {}
        for group, v in groups.items():
            g = regroup(group)
            if isinstance(v, dict):  # a histogram: buckets -> counts
                into = merged.setdefault(g, {})
                for bucket, c in v.items():
                    into[bucket] = into.get(bucket, 0) + c
            else:
                merged[g] = merged.get(g, 0) + v
        out[what] = merged
    return out
