"""The batch scanner: find every detector's validated matches in a column of texts.

Why batch and two tiers: Python `re` is ~10x slower than Rust's regex crate on
the same pattern, and most text segments contain nothing sensitive. So the
scanner first asks polars (Rust regex, one vectorized pass per detector over
the whole Arrow column) which rows *could* hold each entity, and what text
there matched, using each detector's `prefilter` (a superset of its matches).
Only the lines holding those matches run the full Python pattern + validator,
which needs lookarounds, backreferences and checksums that Rust regex lacks
(every pattern but PEM blocks is line-local, so this equals scanning the whole
text; PEM blocks are scanned whole behind their prefilter). `benchmarks/pii.py`
measures this against running every Python detector on every row
(`strategy="python"`, also the reference the tests compare with) and against
presidio; see docs/pii.md for the numbers.

Overlaps are resolved deterministically: higher detector priority wins, then
the earlier start, then the longer span, so `api_key = "AKIA..."` is an AWS key
and not a generic assignment.
"""
from __future__ import annotations

from typing import Iterable, Literal, NamedTuple, Sequence

import pyarrow as pa

from datakit.stages.pii.detectors import DETECTORS, Detector

Strategy = Literal["polars", "polars_rows", "python"]


class Finding(NamedTuple):
    """A sensitive span `text[start:end]` of entity type `entity` (a detector's name)."""

    start: int
    end: int
    entity: str


def _matches(det: Detector, text: str) -> list[tuple[int, int, int, str]]:
    out = []
    for m in det.finditer(text):
        a, b = det.span(m)
        if b > a:
            out.append((a, b, det.priority, det.entity))
    return out


def resolve_overlaps(cands: list[tuple], suppressed: list[int] | None = None) -> list[Finding]:
    """Keep a non-overlapping subset: priority first, then earlier start, then longer span.

    `suppressed` (optional) gets one entry per candidate dropped for overlapping a
    kept span without lying inside it: only then can a second scrub round find
    something new (see ScrubFn.scrub_units).

    A candidate is `(start, end, priority, entity)`, or with a fifth element
    `(validator, match)` whose check is deferred to here: a candidate swallowed by
    a higher-priority kept span is never validated (the costly entropy check of a
    value that is already an AWS key, say). The result is the same as validating
    first, because an invalid candidate is never kept and so never blocks another.
    """
    if not cands:
        return []
    cands.sort(key=lambda c: (-c[2], c[0], -(c[1] - c[0]), c[3]))
    taken: list[tuple[int, int]] = []
    kept: list[Finding] = []
    for c in cands:
        a, b, ent = c[0], c[1], c[3]
        check = c[4] if len(c) > 4 else None
        if any(a < tb and ta < b for ta, tb in taken):
            # a dropped candidate inside one kept span disappears with it; one sticking out may
            # match again once the kept span is replaced, so the caller must scan again
            if suppressed is not None and not any(ta <= a and b <= tb for ta, tb in taken):
                if check is None or check[0](check[1], check[1].string):
                    suppressed.append(1)
            continue
        if check is not None and not check[0](check[1], check[1].string):
            continue
        taken.append((a, b))
        kept.append(Finding(a, b, ent))
    kept.sort()
    return kept


def scan_text(text: str | None, detectors: Sequence[Detector] = DETECTORS) -> list[Finding]:
    """All findings in one text, every detector run in Python (the reference path)."""
    if not text:
        return []
    cands: list[tuple[int, int, int, str]] = []
    for det in detectors:
        cands.extend(_matches(det, text))
    return resolve_overlaps(cands)


def _as_list(texts: pa.Array | pa.ChunkedArray | Sequence[str | None]) -> list[str | None]:
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        return texts.to_pylist()
    return list(texts)


class _Rows:
    """Row access that materializes Python strings only for the rows asked for.

    Why: converting a whole Arrow column to Python strings costs as much as the
    Rust prefilters; most rows are never looked at by Python.
    """

    def __init__(self, texts: pa.Array | pa.ChunkedArray | Sequence[str | None]) -> None:
        self.arrow = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else None
        self.seq = None if self.arrow is not None else list(texts)  # type: ignore[arg-type]
        if isinstance(self.arrow, pa.ChunkedArray):
            self.arrow = self.arrow.combine_chunks()
        self.cache: dict[int, str | None] = {}

    def __len__(self) -> int:
        return len(self.arrow) if self.arrow is not None else len(self.seq)  # type: ignore[arg-type]

    def prefetch(self, idx: Iterable[int]) -> None:
        """Materialize many rows in one Arrow `take` (per-element scalars cost ~1 us each)."""
        if self.arrow is None:
            return
        want = sorted(set(idx) - self.cache.keys())
        if want:
            self.cache.update(zip(want, self.arrow.take(pa.array(want, pa.int64())).to_pylist()))

    def __getitem__(self, i: int) -> str | None:
        if self.seq is not None:
            return self.seq[i]
        if i not in self.cache:
            self.cache[i] = self.arrow[i].as_py()  # type: ignore[index]
        return self.cache[i]

    def series(self):
        import polars as pl

        if self.arrow is not None:
            arr = self.arrow if self.arrow.type in (pa.string(), pa.large_string()) else self.arrow.cast(pa.string())
            return pl.from_arrow(arr).rename("t")
        return pl.Series("t", self.seq, dtype=pl.String)


def candidate_rows(texts: "_Rows | Sequence[str | None]", detectors: Sequence[Detector]) -> list[list[int]]:
    """For each detector, the row indices its Rust prefilter matches (one polars pass each)."""
    import polars as pl

    rows = texts if isinstance(texts, _Rows) else _Rows(texts)
    df = pl.DataFrame({"t": rows.series()}).select(
        *[pl.col("t").str.contains(d.rust_prefilter).fill_null(False).alias(f"d{i}") for i, d in enumerate(detectors)]
    )
    out: list[list[int]] = []
    for i in range(len(detectors)):
        col = df.get_column(f"d{i}")
        out.append(col.arg_true().to_list() if col.any() else [])
    return out


def candidate_hits(texts: "_Rows | Sequence[str | None]", detectors: Sequence[Detector]) -> list[dict[int, list[str]]]:
    """For each detector: row -> the substrings its Rust prefilter matched (one polars pass each).

    Why substrings: polars has no "all match offsets", but the matched text is
    enough to find the candidate lines with `str.find` (C speed).
    """
    import polars as pl

    import numpy as np
    import pyarrow.compute as pc

    rows = texts if isinstance(texts, _Rows) else _Rows(texts)
    # one polars select runs every prefilter; the result goes to Arrow once, because each further
    # polars Series op costs ~0.1 ms of planning, which dominated small batches (the recheck windows)
    table = pl.DataFrame({"t": rows.series()}).select(
        *[pl.col("t").str.extract_all(d.rust_prefilter).alias(f"d{i}") for i, d in enumerate(detectors)]
    ).to_arrow()
    out: list[dict[int, list[str]]] = []
    for i in range(len(detectors)):
        col = table.column(i)
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        lens = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
        hit = np.flatnonzero(lens)
        if not hit.size:
            out.append({})
            continue
        out.append(dict(zip(hit.tolist(), col.take(pa.array(hit)).to_pylist())))
    return out


def _candidate_lines(text: str, hits: list[str]) -> list[tuple[int, int]]:
    """(start, end) of every line holding one of `hits` (the prefilter's matches, in text order).

    One forward pass: each hit is searched from where the previous one ended.
    That finds its true position, because the Rust prefilter (no look-arounds)
    reports leftmost non-overlapping matches: an earlier copy of the same text
    after the previous match would itself have been reported first.
    """
    spans: list[tuple[int, int]] = []
    pos = 0
    for h in hits:
        at = text.find(h, pos)
        if at < 0:  # cannot happen for prefilter output; stay correct if it does
            at = text.find(h)
            if at < 0:
                continue
        pos = at + len(h)
        if spans and spans[-1][0] <= at < spans[-1][1] + 1:
            continue  # same line as the previous hit
        a = text.rfind("\n", 0, at) + 1
        b = text.find("\n", pos)
        spans.append((a, len(text) if b < 0 else b))
    return sorted(set(spans))


def _line_matches(det: Detector, text: str, lines: list[tuple[int, int]]) -> list[tuple]:
    """Candidates of `det` on `lines`, validation deferred to `resolve_overlaps` (same findings)."""
    out: list[tuple] = []
    span, val, prio, ent = det.span, det.validate, det.priority, det.entity
    for a, b in lines:
        for m in det.compiled.finditer(text, a, b):
            x, y = span(m)
            if y > x:
                out.append((x, y, prio, ent) if val is None else (x, y, prio, ent, (val, m)))
    return out


def scan_batch(
    texts: pa.Array | pa.ChunkedArray | Sequence[str | None],
    detectors: Sequence[Detector] = DETECTORS,
    strategy: Strategy = "polars",
    suppressed: set[int] | None = None,
) -> list[list[Finding]]:
    """Findings per row of a string column. All strategies return identical results (tested).

    `suppressed` (optional) receives the rows where an overlapping lower-priority
    candidate was dropped.

    - "python": every Python detector on every whole text (the reference).
    - "polars_rows": Rust prefilter per detector picks rows; Python scans those whole rows.
    - "polars" (default): Rust prefilter picks rows *and* the matched substrings;
      Python scans only the lines holding them (patterns are line-local, except
      PEM blocks, which are scanned whole: their pattern starts with a literal
      and runs at GB/s in Python anyway).
    """
    if strategy == "python":
        out = []
        for i, t in enumerate(_as_list(texts)):
            cands: list[tuple[int, int, int, str]] = []
            for det in detectors:
                cands.extend(_matches(det, t) if t else [])
            sup: list[int] = []
            out.append(resolve_overlaps(cands, sup))
            if sup and suppressed is not None:
                suppressed.add(i)
        return out
    rows = _Rows(texts)
    if strategy not in ("polars", "polars_rows"):
        raise ValueError(f"unknown scan strategy {strategy!r}; use 'polars', 'polars_rows' or 'python'")
    per_row: dict[int, list[tuple]] = {}
    if strategy == "polars_rows":
        for det, idx in zip(detectors, candidate_rows(rows, detectors)):
            for i in idx:
                found = _matches(det, rows[i])  # type: ignore[arg-type]
                if found:
                    per_row.setdefault(i, []).extend(found)
    else:
        all_hits = candidate_hits(rows, detectors)
        rows.prefetch(i for hits in all_hits for i in hits)
        for det, hits in zip(detectors, all_hits):
            for i, h in hits.items():
                if det.hit_filter is not None:
                    h = [x for x in h if det.hit_filter(x)]
                    if not h:
                        continue
                text = rows[i]
                assert text is not None
                found = _matches(det, text) if det.multiline else _line_matches(det, text, _candidate_lines(text, h))
                if found:
                    per_row.setdefault(i, []).extend(found)
    result: list[list[Finding]] = [[] for _ in rows]
    for i, cands in per_row.items():
        sup: list[int] = []
        result[i] = resolve_overlaps(cands, sup)
        if sup and suppressed is not None:
            suppressed.add(i)
    return result


def count_entities(findings: Iterable[list[Finding]]) -> dict[str, int]:
    """Per-entity totals over many rows (sorted keys for stable JSON)."""
    counts: dict[str, int] = {}
    for fs in findings:
        for f in fs:
            counts[f.entity] = counts.get(f.entity, 0) + 1
    return dict(sorted(counts.items()))
