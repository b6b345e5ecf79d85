"""The `decontaminate` stage: drop (or mask) training records that overlap an eval set.

Pipeline file::

    - kind: decontaminate
      evals: [humaneval, path/to/eval.jsonl, {name: mbpp, path: mbpp.parquet, fields: [text, code]}]
      ngram: 13
      mode: drop                       # or mask
      normalizations: [whitespace, case]   # + comments, identifiers
      min_ngrams: 1                    # a record matches an item if it shares >= this many n-grams
      min_fraction: 0.03               # ... and >= this fraction of its n-grams (default 0.03; 0.10 with identifiers)
      max_items_per_ngram: 1           # eval n-grams shared by more items are boilerplate: ignored

What is scanned: the `text` of every segment (all roles: a leaked prompt in
context is a leak too), plus `chosen` and `rejected`. N-grams do not cross
segment boundaries.

Drop mode: a contaminated record gets `_drop = "contaminated:<eval name>"` (the
first eval, in config order, that it matches) and `_drop_detail` = a JSON
object `{eval name: [matched item ids]}`; the engine counts and logs it.
Mask mode: the byte spans of every matching n-gram are replaced by `mask_with`
and the record is kept; counts go to the stage metrics (`decontam.masked`,
`decontam.masked:<eval>`).

The eval table (hashes of every eval n-gram) is built once at compile time and
travels inside the batch function (the broadcast: < 1 MB for HumanEval).
"""
from __future__ import annotations

import json
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from datakit.plan import DROP, DROP_DETAIL, METRICS, Rel, metrics_column
from datakit.stages.base import CompileContext, StageConfig, register_stage
from datakit.stages.texts import RECORD_TEXT_COLUMNS, with_texts
from datakit.stages.decontaminate.evals import EvalSet, file_name, load_eval, split_spec
from datakit.stages.decontaminate.matcher import (BatchMatches, EvalTable, Rule, default_rule, match_batch, merge_spans,
                                             text_sources)
from datakit.stages.decontaminate.normalize import DEFAULT_NORMALIZATIONS, NORMALIZATIONS, flags_of



class EvalSpec(BaseModel):
    """An eval set in a pipeline file: a registered name or a file, with optional fields and id column."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str | None = None
    path: str | None = None
    fields: list[str] | None = None
    id_field: str | None = None

    def load(self, ctx: CompileContext | None = None) -> EvalSet:
        target = self.path or self.name
        if not target:
            raise ValueError("an eval needs a name or a path")
        if self.path:
            path = ctx.resolve(self.path) if ctx else self.path
            spec = f"{self.name}={path}" if self.name else path
        else:
            spec = target
        return load_eval(spec, self.fields, self.id_field)


def load_evals(specs: list[str | EvalSpec], ctx: CompileContext | None = None,
               fields: list[str] | dict[str | None, list[str]] | None = None,
               id_fields: dict[str | None, str] | None = None) -> list[EvalSet]:
    """Load every eval of a config; names must be unique (they become drop reasons).

    `fields`: the text fields of every eval, or {eval name: fields} with None for the others (the CLI's
    `--eval-field NAME=a,b`). Why per eval: HumanEval has no `solution` and a private benchmark no
    `canonical_solution`, so one list for both could not work (the docs' own example failed, found in
    review). A name is the `NAME=` given, a registered eval's name or an eval file's name.
    `id_fields`: the id column the same way (the CLI's `--eval-id-field [NAME=]FIELD`), for eval files;
    a registered eval keeps its own ids, so naming one there is an error."""
    scoped = fields if isinstance(fields, dict) else {None: fields} if fields else {}
    scoped_ids = id_fields or {}
    used: set[str] = set()
    used_ids: set[str] = set()
    out: list[EvalSet] = []
    for s in specs:
        if isinstance(s, str):
            name, target = split_spec(s, str(ctx.base_dir) if ctx is not None else None)
            is_file = any(c in target for c in "/\\") or target.endswith((".jsonl", ".parquet", ".json", ".gz", ".zst"))
            keys = [k for k in (name, None if is_file else target, file_name(target) if is_file else None) if k]
            key = next((k for k in keys if k in scoped), None)
            if key is not None:
                used.add(key)
            f = scoped.get(key, scoped.get(None))
            id_key = next((k for k in keys if k in scoped_ids), None)
            if id_key is not None and not is_file:
                raise ValueError(f"--eval-id-field {id_key}=...: {target} is a registered eval, which has its own ids")
            if id_key is not None:
                used_ids.add(id_key)
            id_field = scoped_ids.get(id_key, scoped_ids.get(None))
            s = EvalSpec(name=name, path=target, fields=f, id_field=id_field) if is_file \
                else EvalSpec(name=target, fields=f)
        out.append(s.load(ctx))
    unknown = sorted(k for k in scoped if k is not None and k not in used and k not in {e.name for e in out})
    if unknown:
        raise ValueError(f"--eval-field names no eval {', '.join(unknown)} (evals: {', '.join(e.name for e in out)})")
    unknown = sorted(k for k in scoped_ids if k is not None and k not in used_ids)
    if unknown:
        raise ValueError(f"--eval-id-field names no eval file {', '.join(unknown)} "
                         f"(evals: {', '.join(e.name for e in out)})")
    names = [e.name for e in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"eval names must be unique; repeated: {', '.join(dup)} (use name=path)")
    return out


@register_stage
class DecontaminateConfig(StageConfig):
    """Config of the decontamination stage (see module docstring for the YAML form)."""

    kind: Literal["decontaminate"] = "decontaminate"
    reads = RECORD_TEXT_COLUMNS
    writes = RECORD_TEXT_COLUMNS  # mode: mask rewrites every text of a record (segments, chosen, rejected)
    evals: list[str | EvalSpec] = Field(min_length=1, description="eval names or files")
    path_fields = ("evals",)
    ngram: int = Field(13, ge=1, le=256)
    mode: Literal["drop", "mask"] = "drop"
    normalizations: list[str] = Field(default_factory=lambda: list(DEFAULT_NORMALIZATIONS))
    min_ngrams: int = Field(1, ge=1)
    min_fraction: float | None = Field(None, ge=0.0, le=1.0,
                                       description="default 0.03 (matcher.DEFAULT_MIN_FRACTION), 0.10 with identifiers")
    max_items_per_ngram: int = Field(1, ge=0, description="ignore eval n-grams shared by more items of one eval "
                                                          "(0 = keep all)")
    robust: bool = Field(True, description="also match comment-free and identifier-insensitive views and decoded "
                                           "string escapes")
    min_ngrams_any: int | None = Field(None, ge=0, description="match on this many distinctive n-grams whatever "
                                                               "their share (default 6 when robust, 0 = off)")
    reference: Literal["stdlib"] | None = Field("stdlib", description="drop eval n-grams common in code at large")
    eval_fields: list[str] | None = Field(None, description="text fields of the eval items (default per eval)")
    mask_with: str = ""

    @field_validator("normalizations")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if x not in NORMALIZATIONS]
        if bad:
            raise ValueError(f"unknown normalizations {bad}; known: {list(NORMALIZATIONS)}")
        return v

    def drops_by_content(self) -> bool:
        return self.mode == "drop"

    def rule(self) -> Rule:
        return default_rule(flags_of(self.normalizations), self.robust, self.min_ngrams, self.min_fraction,
                            self.min_ngrams_any)

    def build_table(self, ctx: CompileContext | None = None) -> EvalTable:
        return EvalTable.build(load_evals(list(self.evals), ctx, self.eval_fields), self.ngram,
                               flags_of(self.normalizations), self.max_items_per_ngram, robust=self.robust,
                               reference=self.reference)

    def build_fn(self, ctx: CompileContext | None = None) -> "DecontamFn":
        return DecontamFn(self.build_table(ctx), self.rule(), self.mode, self.mask_with)

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        evals = load_evals(list(self.evals), ctx, self.eval_fields)
        # the eval items themselves (a file or a package's bundled data may change under the same name)
        from datakit.io.identity import digest

        ctx.record("evals", {e.name: digest([(it.id, it.fields) for it in e.items]) for e in evals})
        table = EvalTable.build(evals, self.ngram, flags_of(self.normalizations), self.max_items_per_ngram,
                                robust=self.robust, reference=self.reference)
        if table.reference:  # code at large (the driver's stdlib): its digest pins what counted as boilerplate
            ctx.record("reference", table.reference)
        fn = DecontamFn(table, self.rule(), self.mode, self.mask_with)
        return rel.map_batches(fn, rel.schema, name="decontaminate", drop_log_key="doc_id")


class DecontamFn:
    """The picklable batch function; carries the eval table (the broadcast artifact)."""

    def __init__(self, table: EvalTable, rule: Rule, mode: str, mask_with: str = "") -> None:
        self.table, self.rule, self.mode, self.mask_with = table, rule, mode, mask_with

    def hits(self, m: BatchMatches) -> tuple[np.ndarray, dict[int, dict[int, list[str]]]]:
        """(pairs passing the rule, row -> {eval index -> sorted matched item ids})."""
        ok = self.rule.passes(m.shared, self.table.item_ngrams[m.items], m.loose)
        hits: dict[int, dict[int, list[str]]] = {}
        for row, item in zip(m.rows[ok].tolist(), m.items[ok].tolist()):
            hits.setdefault(row, {}).setdefault(int(self.table.item_eval[item]), []).append(self.table.item_ids[item])
        for per in hits.values():
            for k in per:
                per[k] = sorted(set(per[k]))
        return ok, hits

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        sources = text_sources(batch)
        m = match_batch(self.table, sources)
        ok, hits = self.hits(m)
        n = batch.num_rows
        if self.mode == "drop":
            reason: list[str | None] = [None] * n
            detail: list[str | None] = [None] * n
            for row, per in hits.items():
                first = min(per)
                reason[row] = f"contaminated:{self.table.eval_names[first]}"
                detail[row] = json.dumps({self.table.eval_names[e]: ids for e, ids in sorted(per.items())},
                                         sort_keys=True, separators=(",", ":"))
            return _append(batch, [(DROP, pa.array(reason, pa.string())), (DROP_DETAIL, pa.array(detail, pa.string()))])
        return self._mask(batch, sources, m, ok, hits)

    def _mask(self, batch: pa.RecordBatch, sources, m, ok, hits) -> pa.RecordBatch:
        if not hits:
            return _append(batch, [(METRICS, metrics_column(batch.num_rows, {}))])
        good = set(zip(m.rows[ok].tolist(), m.items[ok].tolist()))
        spans: dict[tuple[int, int], list[tuple[int, int]]] = {}
        whole: set[tuple[int, int]] = set()  # strings whose match was found in their decoded copy
        scanned = m.sources or sources
        for r, it, si, st, a, b in zip(m.hit_row.tolist(), m.hit_item.tolist(), m.hit_source.tolist(),
                                       m.hit_string.tolist(), m.hit_a.tolist(), m.hit_b.tolist()):
            if (r, it) not in good:
                continue
            if si < len(sources):
                spans.setdefault((si, st), []).append((a, b))
            elif si < len(scanned) and scanned[si].origin is not None:
                # found in review: a leak written as escaped JSON was matched in its decoded copy, whose byte
                # spans are not the text's, and left in place; the whole string holding it is masked
                k, which = scanned[si].origin
                whole.add((k, int(which[st])))
        new: dict[str, dict[int, str | None]] = {}  # column -> piece index -> masked text (`with_texts`)
        for (si, st), sp in spans.items():
            if (si, st) not in whole and sources[si].strings[st].is_valid:
                new.setdefault(sources[si].name, {})[st] = _mask_text(sources[si].strings[st].as_py(), sp,
                                                                      self.mask_with)
        for si, st in whole:
            if sources[si].strings[st].is_valid:
                new.setdefault(sources[si].name, {})[st] = self.mask_with
        counts: dict[str, int] = {"decontam.masked": len(hits)}
        for per in hits.values():
            for e in per:
                key = f"decontam.masked:{self.table.eval_names[e]}"
                counts[key] = counts.get(key, 0) + 1
        return _append(with_texts(batch, new), [(METRICS, metrics_column(batch.num_rows, counts))])


def _mask_text(text: str, spans: list[tuple[int, int]], mask_with: str) -> str:
    """Replace byte spans (token-aligned, so UTF-8-safe) of `text` by `mask_with`."""
    raw = text.encode()
    rep = mask_with.encode()
    out, pos = [], 0
    for a, b in merge_spans(spans):
        out.append(raw[pos:a])
        out.append(rep)
        pos = b
    out.append(raw[pos:])
    return b"".join(out).decode()


def _append(batch: pa.RecordBatch, cols: list[tuple[str, pa.Array]]) -> pa.RecordBatch:
    arrays = list(batch.columns) + [c for _, c in cols]
    fields = list(batch.schema) + [pa.field(name, pa.string()) for name, _ in cols]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


__all__ = ["DecontaminateConfig", "DecontamFn", "EvalSpec", "load_evals"]
