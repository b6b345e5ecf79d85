"""The eval n-gram table and the matching of a batch of documents against it.

Shared by the pipeline stage (per-record decisions) and the check (per-item
decisions over a whole dataset). The table is a small artifact (HumanEval:
~30k hashes, < 1 MB) built once on the driver and shipped with the stage's
function to every worker (the broadcast of the design).

The overlap rule: a text source contaminates an eval item when it shares at
least `min_ngrams` distinct n-grams with it *and* at least `min_fraction` of the
item's distinct n-grams.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datakit.stages.decontaminate.evals import EvalSet
from datakit.stages.decontaminate.normalize import F_IDENT
from datakit.stages.decontaminate.ngrams import arrow_text_buffers, build_table, hash_strings, scan_strings, texts_to_buffers

# Columns scanned in a table that is not a training record (first one present wins unless told).
GENERIC_TEXT_FIELDS = ("text", "content", "code")


def default_min_fraction(flags: int) -> float:
    """The default share of an item's n-grams a document must contain (see docs/decontamination.md).

    Measured (benchmarks/decontam.py): any single 13-gram flags ~6% of clean
    idiomatic code (`key=lambda x: x[1], reverse=True` is in HumanEval/87),
    5% keeps false positives <= 0.01% of documents with 100% recall on exact,
    reformatted and prompt-only leaks. Canonical identifiers make idioms more
    generic, so that mode needs 10%.
    """
    return 0.10 if flags & F_IDENT else 0.05


@dataclass(frozen=True)
class Rule:
    """Minimum overlap for a match: distinct shared n-grams and fraction of the item's n-grams."""

    min_ngrams: int = 1
    min_fraction: float = 0.0

    def passes(self, shared: np.ndarray, total: np.ndarray) -> np.ndarray:
        total = np.maximum(total, 1)
        return (shared >= max(1, self.min_ngrams)) & (shared / total >= self.min_fraction)

    def describe(self) -> str:
        parts = [f">= {self.min_ngrams} n-gram{'s' if self.min_ngrams != 1 else ''}"] \
            if self.min_ngrams > 1 or self.min_fraction <= 0 else []
        if self.min_fraction > 0:
            parts.append(f">= {self.min_fraction:.0%} of the item's n-grams")
        return " and ".join(parts)


@dataclass
class EvalTable:
    """Distinct eval n-gram hashes (sorted), which items own each, and a probe table for the kernel."""

    n: int
    flags: int
    eval_names: list[str]
    eval_sources: list[str]
    eval_fields: list[list[str]]
    item_eval: np.ndarray          # int32, global item -> eval index
    item_ids: list[str]
    item_texts: list[dict[str, str]]
    item_ngrams: np.ndarray        # int64, distinct n-grams per item
    hashes: np.ndarray             # uint64 sorted unique
    h_ptr: np.ndarray              # int64 CSR offsets: hash index -> items
    h_items: np.ndarray            # int32
    keys: np.ndarray = field(repr=False, default=None)  # type: ignore[assignment]
    ignored_common: int = 0        # n-grams dropped as shared by too many items
    vals: np.ndarray = field(repr=False, default=None)  # type: ignore[assignment]

    @classmethod
    def build(cls, evalsets: Sequence[EvalSet], n: int, flags: int, max_items_per_ngram: int = 1) -> "EvalTable":
        """Hash every item's fields (n-grams never cross fields).

        `max_items_per_ngram`: an n-gram owned by more items than this is
        boilerplate of the eval itself (`: str) -> List[str]:` + a docstring opening is in dozens of
        HumanEval prompts) and proves nothing about any one item: it is ignored.
        0 keeps every n-gram.
        """
        texts: list[str] = []
        text_item: list[int] = []
        item_eval: list[int] = []
        item_ids: list[str] = []
        item_texts: list[dict[str, str]] = []
        for e_no, es in enumerate(evalsets):
            for it in es.items:
                g = len(item_ids)
                item_ids.append(it.id)
                item_eval.append(e_no)
                item_texts.append(dict(it.fields))
                for txt in it.fields.values():
                    texts.append(txt)
                    text_item.append(g)
        data, offs = texts_to_buffers(texts)
        h, s, _, _ = hash_strings(data, offs, n, flags)
        owner = np.asarray(text_item, dtype=np.int64)[s] if len(s) else np.zeros(0, np.int64)
        pairs = np.unique(np.stack([h, owner.astype(np.uint64)], axis=1), axis=0) if len(h) else np.zeros((0, 2), np.uint64)
        ph, pi = pairs[:, 0], pairs[:, 1].astype(np.int32)
        ignored = 0
        if max_items_per_ngram > 0 and len(ph):
            uh, inv, cnt = np.unique(ph, return_inverse=True, return_counts=True)
            keep = cnt[inv] <= max_items_per_ngram
            # never let the filter blind us to an item: one whose n-grams are *all* shared (a duplicate
            # item in the eval) keeps them
            before = np.bincount(pi, minlength=len(item_ids))
            after = np.bincount(pi[keep], minlength=len(item_ids))
            blind = (after == 0) & (before > 0)
            keep |= blind[pi]
            ignored = int(len(np.unique(ph[~keep])))
            ph, pi = ph[keep], pi[keep]
        hashes, first = np.unique(ph, return_index=True)
        h_ptr = np.append(first, len(ph)).astype(np.int64)
        item_ngrams = np.bincount(pi, minlength=len(item_ids)).astype(np.int64)
        keys, vals = build_table(hashes)
        return cls(n=n, flags=flags, eval_names=[e.name for e in evalsets], eval_sources=[e.source for e in evalsets],
                   eval_fields=[list(e.fields) for e in evalsets], item_eval=np.asarray(item_eval, np.int32),
                   item_ids=item_ids, item_texts=item_texts, item_ngrams=item_ngrams, hashes=hashes, h_ptr=h_ptr,
                   h_items=pi, keys=keys, vals=vals, ignored_common=ignored)

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    def expand(self, hidx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For hash indices, (position in `hidx`, item) for every item owning the hash."""
        lo = self.h_ptr[hidx]
        cnt = self.h_ptr[hidx + 1] - lo
        pos = np.repeat(np.arange(len(hidx)), cnt)
        start = np.repeat(np.cumsum(cnt) - cnt, cnt)
        items = self.h_items[np.repeat(lo, cnt) + (np.arange(int(cnt.sum())) - start)]
        return pos, items

    def eval_spans(self, item: int, matched: np.ndarray) -> list[tuple[str, int, int]]:
        """Byte spans (field, start, end) of an item's texts whose window hash is in `matched` (sorted)."""
        out = []
        for fname, txt in self.item_texts[item].items():
            data, offs = texts_to_buffers([txt])
            h, _, a, b = hash_strings(data, offs, self.n, self.flags, spans=True)
            hit = np.isin(h, matched)
            out.extend((fname, int(x), int(y)) for x, y in zip(a[hit], b[hit]))
        return out


@dataclass
class TextSource:
    """One string column of a batch, flattened: the kernel's buffers and which row each string is from."""

    name: str            # "segments", "chosen", "rejected" or a column name
    data: np.ndarray
    offsets: np.ndarray
    row_of: np.ndarray   # int64, string -> row in the batch
    strings: pa.Array    # for snippets and masking


def text_sources(batch: pa.RecordBatch | pa.Table, text_fields: Sequence[str] | None = None) -> list[TextSource]:
    """The texts of a training-record batch (segments, chosen, rejected) or of generic text columns."""
    names = batch.schema.names
    cols: list[tuple[str, pa.Array, np.ndarray]] = []

    def column(name: str) -> pa.Array:
        c = batch.column(name)
        return c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c

    if text_fields:
        missing = [f for f in text_fields if f not in names]
        if missing:
            raise KeyError(f"text field(s) {', '.join(missing)} not in the data (columns: {', '.join(names)})")
        wanted = list(text_fields)
    elif "segments" in names:
        wanted = ["segments"] + [c for c in ("chosen", "rejected") if c in names]
    else:
        wanted = [c for c in GENERIC_TEXT_FIELDS if c in names][:1]
        if not wanted:
            raise KeyError(f"no text to scan: expected training records (segments) or one of "
                           f"{', '.join(GENERIC_TEXT_FIELDS)} (columns: {', '.join(names)})")
    for name in wanted:
        col = column(name)
        if name == "segments" or pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            flat = pc.list_flatten(col)
            if pa.types.is_struct(flat.type):
                flat = flat.field("text")
            rows = np.asarray(pc.list_parent_indices(col), dtype=np.int64)
            cols.append((name, flat, rows))
        else:
            cols.append((name, col, np.arange(len(col), dtype=np.int64)))
    out = []
    for name, arr, rows in cols:
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            arr = arr.cast(pa.string())
        data, offs = arrow_text_buffers(arr)
        out.append(TextSource(name, data, offs, rows, arr))
    return out


@dataclass
class BatchMatches:
    """Matches of one batch: distinct (row, item) pairs with shared-n-gram counts, and raw hits."""

    rows: np.ndarray        # int64, per (row, item) pair
    items: np.ndarray       # int32
    shared: np.ndarray      # int64, distinct n-grams shared
    hit_row: np.ndarray     # per raw hit (window x owning item)
    hit_item: np.ndarray
    hit_hidx: np.ndarray
    hit_source: np.ndarray  # index into the sources list
    hit_string: np.ndarray  # string index within its source
    hit_a: np.ndarray
    hit_b: np.ndarray


def match_batch(table: EvalTable, sources: list[TextSource], parallel: bool = False) -> BatchMatches:
    parts = []
    for si, src in enumerate(sources):
        s, v, a, b = scan_strings(src.data, src.offsets, table.n, table.flags, table.keys, table.vals, parallel)
        if not len(s):
            continue
        pos, items = table.expand(v)
        parts.append((src.row_of[s[pos]], items, v[pos], np.full(len(pos), si, np.int64), s[pos], a[pos], b[pos]))
    if not parts:
        z = np.zeros(0, np.int64)
        return BatchMatches(z, z.astype(np.int32), z, z, z.astype(np.int32), z, z, z, z, z)
    hr, hi, hh, hs, hst, ha, hb = (np.concatenate(x) for x in zip(*parts))
    triples = np.unique(np.stack([hr, hi.astype(np.int64), hh], axis=1), axis=0)
    pairs, shared = np.unique(triples[:, :2], axis=0, return_counts=True)
    return BatchMatches(pairs[:, 0], pairs[:, 1].astype(np.int32), shared.astype(np.int64),
                        hr, hi.astype(np.int32), hh, hs, hst, ha, hb)


def merge_spans(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of byte intervals, sorted."""
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]
