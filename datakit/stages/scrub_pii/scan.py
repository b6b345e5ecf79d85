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

import functools
from bisect import bisect_right
from typing import Iterable, Literal, NamedTuple, Sequence

import pyarrow as pa

from datakit.stages.scrub_pii.detectors import DETECTORS, Detector, line_escape_view, prefer_view_spans
from datakit.stages.scrub_pii.fold import FOLD_GATE_BYTES, fold_view, folded_rows

Strategy = Literal["auto", "hyperscan", "polars", "polars_rows", "python"]


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


def _folded_matches(detectors: Sequence[Detector], text: str) -> list[tuple[int, int, int, str]]:
    """Every detector's matches in the folded view of `text` (`fold.py`), as spans of `text` (the reference)."""
    folded = fold_view(text)
    if folded is None:
        return []
    return [(*folded.span(a, b), prio, ent) for det in detectors for a, b, prio, ent in _matches(det, folded.view)]


def _fold_candidates(rows: "_Rows", detectors: Sequence[Detector], strategy: Strategy,
                     per_row: dict[int, list[tuple]], picked: list[int] | None = None) -> None:
    """Add the findings of the folded views of the rows holding an invisible or fullwidth character
    (`picked`, else found by `folded_rows`): the views scanned as a batch of their own by the same
    strategy, their spans mapped back."""
    if picked is None:
        picked = folded_rows(rows.arrow if rows.arrow is not None else pa.array(rows.seq, pa.string()))
    if not picked:
        return
    rows.prefetch(picked)
    folded = {i: f for i in picked if (f := fold_view(rows[i])) is not None}  # type: ignore[arg-type]
    priority = {d.entity: d.priority for d in detectors}
    found = scan_batch([f.view for f in folded.values()], detectors, strategy, fold=False)
    for (i, f), fs in zip(folded.items(), found):
        if fs:
            per_row.setdefault(i, []).extend((*f.span(x.start, x.end), priority[x.entity], x.entity) for x in fs)


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
    if len(cands) == 1:  # the common case: nothing to resolve
        c = cands[0]
        if len(c) > 4 and not c[4][0](c[4][1], c[4][1].string):
            return []
        return [Finding(c[0], c[1], c[3])]
    cands.sort(key=lambda c: (-c[2], c[0], -(c[1] - c[0]), c[3]))
    # kept spans never overlap, so sorted by start they are sorted by end too: an overlap check is
    # two neighbours found by bisection (a linear scan was quadratic on files with many candidates)
    starts: list[int] = []
    ends: list[int] = []
    kept: list[Finding] = []
    for c in cands:
        a, b, ent = c[0], c[1], c[3]
        check = c[4] if len(c) > 4 else None
        i = bisect_right(starts, a)
        left_hit = i > 0 and ends[i - 1] > a and starts[i - 1] < b
        if left_hit or (i < len(starts) and starts[i] < b):
            # a dropped candidate inside one kept span disappears with it; one sticking out may
            # match again once the kept span is replaced, so the caller must scan again
            if suppressed is not None and not (left_hit and b <= ends[i - 1]):
                if check is None or check[0](check[1], check[1].string):
                    suppressed.append(1)
            continue
        if check is not None and not check[0](check[1], check[1].string):
            continue
        starts.insert(i, a)
        ends.insert(i, b)
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
    cands.extend(_folded_matches(detectors, text))
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
        if self.arrow is not None and self.arrow.type not in (pa.string(), pa.large_string()):
            self.arrow = self.arrow.cast(pa.string())  # string_view, dictionary...: `take` needs a plain type
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
            return pl.from_arrow(self.arrow).rename("t")
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


# ---------------------------------------------------------------- hyperscan prefilter (one pass, all detectors)

_HS_DATABASES: dict[tuple[int, tuple[str, ...]], object] = {}
# What is fast differs per regex engine: Rust's multi-literal search likes the IBAN country codes
# spelled out, hyperscan scans the generic shape 3x faster (and `sk-ant-[a-z]` 9x slower than the
# bare literal); the e-mail prefilter's leading class made the whole combined database ~30% slower
# (22 -> 16 ms per 8 MB without it, 0.4% more matches). Each spelling here matches wherever the
# detector's prefilter matches, ending on the same line (tested with hyperscan itself).
HS_PREFILTERS: dict[str, str] = {
    "iban": r"[A-Z]{2} ?\d{2}[ -]?[A-Z0-9]{4}[ -]?[A-Z0-9]{4}",
    "anthropic_key": r"sk-ant-",
    "email": r"@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2}",
}


@functools.lru_cache(maxsize=None)
def hyperscan_available() -> bool:
    """True when the `hyperscan` package (Intel's multi-pattern regex engine) imports on this machine."""
    try:
        import hyperscan  # noqa: F401
    except ImportError:
        return False
    return True


def _hs_database(prefilters: tuple[str, ...]):
    """The compiled multi-pattern database of `prefilters`, one per thread (a scan's scratch is per thread).

    Compiling takes 0.01-0.22 s per set, so it happens once per process and pattern set, never per
    batch, and its result is kept on disk for the next process (`hs_cache`); the database is not
    pickled with the stage function.
    """
    import threading

    key = (threading.get_ident(), prefilters)
    db = _HS_DATABASES.get(key)
    if db is None:
        import hyperscan

        from datakit.stages.scrub_pii import hs_cache

        # UTF-8 mode only where a class could match part of a multi-byte character (a negated class):
        # there a byte-wise repeat bound ({1,64}) would count bytes, not characters, and miss matches
        flags = [hyperscan.HS_FLAG_UTF8 if "[^" in p else 0 for p in prefilters]
        db = hs_cache.compiled([p.encode() for p in prefilters], flags, hyperscan.HS_MODE_BLOCK)
        _HS_DATABASES[key] = db
    return db


def candidate_ends(rows: _Rows, detectors: Sequence[Detector], gates: Sequence[str] = ()
                   ) -> list[dict[int, list[int]]]:
    """For each detector: row -> end offsets (in characters) of its prefilter's matches, from ONE scan.

    Why: polars runs one regex pass per detector over the column (23 passes);
    hyperscan runs every prefilter in a single pass over the Arrow string
    buffer itself (no copy, no Python strings) and reports *every* match end,
    overlapping ones included, so the lines found are a superset of what the
    per-detector passes find. A match that starts in one row and ends in the
    next (the buffer is the rows back to back) only adds a candidate line.
    `gates` are further patterns run in the same pass (another step's row gate);
    their results follow the detectors'.
    """
    import numpy as np

    arr = rows.arrow if rows.arrow is not None else pa.array(rows.seq, pa.string())  # _Rows made it string
    n = len(arr)
    out: list[dict[int, list[int]]] = [{} for _ in range(len(detectors) + len(gates))]
    if n == 0 or not out:  # hyperscan refuses an empty pattern set (`entities: [private_key]` rechecks)
        return out
    odt = np.int64 if arr.type == pa.large_string() else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=odt)[arr.offset : arr.offset + n + 1].astype(np.int64)
    data = arr.buffers()[2]
    lo, hi = int(offsets[0]), int(offsets[-1])
    if data is None or hi <= lo:
        return out
    ids: list[int] = []
    ends: list[int] = []
    id_app, end_app = ids.append, ends.append

    def on_match(i: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
        id_app(i)
        end_app(end)

    # the prefilters as written: hyperscan's \d \w \s are ASCII already (no UCP flag), and the
    # Rust spelling nests classes (`[[A-Za-z0-9_].-]`), which hyperscan would read differently
    patterns = tuple(HS_PREFILTERS.get(d.entity, d.prefilter) for d in detectors) + tuple(gates)
    _hs_database(patterns).scan(memoryview(data)[lo:hi], match_event_handler=on_match)
    if not ends:
        return out
    ends_a = np.asarray(ends, dtype=np.int64) + lo
    ids_a = np.asarray(ids, dtype=np.int64)
    row_a = np.searchsorted(offsets, ends_a - 1, side="right") - 1
    if arr.null_count:  # Arrow lets a null slot span arbitrary bytes: its matches are not text
        keep = arr.is_valid().to_numpy(zero_copy_only=False)[row_a]
        ends_a, ids_a, row_a = ends_a[keep], ids_a[keep], row_a[keep]
        if not row_a.size:
            return out
    pos_a = ends_a - offsets[row_a]
    # rows with multi-byte characters: byte offsets -> character offsets (a prefilter match ends in
    # an ASCII byte, so every end is a character boundary): the number of UTF-8 lead bytes before it
    raw_all = np.frombuffer(data, dtype=np.uint8)
    non_ascii = np.flatnonzero(raw_all[lo:hi] > 0x7F)
    if non_ascii.size:
        wide = np.intersect1d(np.unique(np.searchsorted(offsets, non_ascii + lo, side="right") - 1), row_a)
        for r in wide.tolist():
            sel = np.flatnonzero(row_a == r)
            lead = np.cumsum((raw_all[offsets[r] : offsets[r + 1]] & 0xC0) != 0x80)
            pos_a[sel] = lead[pos_a[sel] - 1]
    order = np.lexsort((pos_a, row_a, ids_a))
    ids_o, row_o = ids_a[order], row_a[order]
    pos_s = pos_a[order].tolist()
    # one slice per (pattern, row) group, found with numpy (not a Python step per match)
    starts = np.flatnonzero(np.r_[True, (ids_o[1:] != ids_o[:-1]) | (row_o[1:] != row_o[:-1])])
    bounds = np.r_[starts, len(pos_s)].tolist()
    for k, (i, r) in enumerate(zip(ids_o[starts].tolist(), row_o[starts].tolist())):
        out[i][r] = pos_s[bounds[k] : bounds[k + 1]]
    return out


def _quoted_hit(text: str, end: int) -> str:
    """The quoted token a prefilter match ending at `end` closes (`"TOKEN"`), as a hit filter reads it.

    Only for quote-closed prefilters (high_entropy): the token class excludes
    quotes, so the opening quote is the last one before the closing one.
    """
    lo = max(0, end - 130)
    if text[end - 1] not in "\"'`":  # not quote-closed: the window before the end (a superset)
        return text[lo:end]
    q = max(text.rfind('"', lo, end - 1), text.rfind("'", lo, end - 1), text.rfind("`", lo, end - 1))
    return text[max(q, lo) : end]


def _lines_at(text: str, ends: list[int]) -> list[tuple[int, int]]:
    """(start, end) of every line holding a match that ends at one of `ends` (sorted, distinct)."""
    spans: list[tuple[int, int]] = []
    for e in ends:
        if spans and e <= spans[-1][1]:
            continue  # same line as the previous end (ends are sorted)
        a = text.rfind("\n", 0, e - 1) + 1
        b = text.find("\n", e - 1)
        spans.append((a, len(text) if b < 0 else b))
    return spans


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
        found = [(m.span(), m) for m in det.compiled.finditer(text, a, b)]
        view = line_escape_view(text[a:b])  # per candidate line, not cached: a line is asked for once per detector
        if view is not None:  # validation is deferred: only a valid match of the view hides the text's
            in_view = [((m.start() + a, m.end() + a), m) for m in det.compiled.finditer(view)
                       if val is None or val(m, m.string)]
            found = prefer_view_spans(in_view, found)
        for _, m in found:
            x, y = span(m)
            if m.string is not text:  # a match of the line's view: its offsets are the line's
                x, y = x + a, y + a
            if y > x:
                out.append((x, y, prio, ent) if val is None else (x, y, prio, ent, (val, m)))
    return out


def scan_batch(
    texts: pa.Array | pa.ChunkedArray | Sequence[str | None],
    detectors: Sequence[Detector] = DETECTORS,
    strategy: Strategy = "auto",
    suppressed: set[int] | None = None,
    gates: Sequence[str] = (),
    gate_ends: list[dict[int, list[int]]] | None = None,
    texts_out: dict[int, str | None] | None = None,
    fold: bool = True,
) -> list[list[Finding]]:
    """Findings per row of a string column. All strategies return identical results (tested).

    `suppressed` (optional) receives the rows where an overlapping lower-priority
    candidate was dropped. `gates` (optional, hyperscan only): further patterns run
    in the same single pass; for each, `{row: [end offsets]}` of its matches is
    appended to `gate_ends` (every match end, overlapping ones included; a match
    may start in the row before). Under the other strategies `gate_ends` stays
    empty and the caller runs its own pass. `texts_out` (optional) receives the
    rows that became Python strings here (row -> text), so a caller need not
    convert them again. `fold` (default True): rows holding an invisible or fullwidth character are
    also scanned in their folded view (`fold.py`), whose findings cover the hidden characters.

    - "python": every Python detector on every whole text (the reference).
    - "polars_rows": Rust prefilter per detector picks rows; Python scans those whole rows.
    - "polars": Rust prefilter per detector picks rows *and* the matched substrings;
      Python scans only the lines holding them (patterns are line-local, except
      PEM blocks, which are scanned whole: their pattern starts with a literal
      and runs at GB/s in Python anyway).
    - "hyperscan": the same line-level scan, but every prefilter runs in ONE
      hyperscan pass over the Arrow buffer, which reports match end offsets
      (no substrings to search back for).
    - "auto" (default): "hyperscan" when the package is installed, else "polars".
    """
    if strategy == "python":
        out = []
        for i, t in enumerate(_as_list(texts)):
            cands: list[tuple[int, int, int, str]] = []
            for det in detectors:
                cands.extend(_matches(det, t) if t else [])
            cands.extend(_folded_matches(detectors, t) if t else [])
            sup: list[int] = []
            out.append(resolve_overlaps(cands, sup))
            if sup and suppressed is not None:
                suppressed.add(i)
        return out
    rows = _Rows(texts)
    strategy = resolve_strategy(strategy)
    per_row: dict[int, list[tuple]] = {}
    fold_picked: list[int] | None = None
    if strategy == "hyperscan":
        # the fold's row gate rides in the same pass (the separate Arrow pass cost 8% of the scan)
        all_ends = candidate_ends(rows, detectors, (*gates, FOLD_GATE_BYTES) if fold else gates)
        if fold:
            fold_picked = sorted(all_ends.pop())
        if gates:
            if gate_ends is not None:
                gate_ends.extend(all_ends[len(detectors):])
            all_ends = all_ends[: len(detectors)]
        rows.prefetch(i for ends in all_ends for i in ends)
        for det, ends in zip(detectors, all_ends):
            for i, es in ends.items():
                text = rows[i]
                assert text is not None
                if det.hit_filter is not None:
                    es = [e for e in es if det.hit_filter(_quoted_hit(text, e))]
                    if not es:
                        continue
                found = _matches(det, text) if det.multiline else _line_matches(det, text, _lines_at(text, es))
                if found:
                    per_row.setdefault(i, []).extend(found)
    elif strategy == "polars_rows":
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
    if fold:
        _fold_candidates(rows, detectors, strategy, per_row, fold_picked)
    if texts_out is not None:
        texts_out.update(rows.cache)
    result: list[list[Finding]] = [[] for _ in rows]
    for i, cands in per_row.items():
        sup: list[int] = []
        result[i] = resolve_overlaps(cands, sup)
        if sup and suppressed is not None:
            suppressed.add(i)
    return result


def resolve_strategy(strategy: Strategy) -> Strategy:
    """`auto` -> `hyperscan` where it is installed, else `polars` (same findings, tested); checks the name."""
    if strategy == "auto":
        return "hyperscan" if hyperscan_available() else "polars"
    if strategy not in ("hyperscan", "polars", "polars_rows", "python"):
        raise ValueError(f"unknown scan strategy {strategy!r}; use 'auto', 'hyperscan', 'polars', 'polars_rows' or 'python'")
    if strategy == "hyperscan" and not hyperscan_available():
        raise ValueError("scan strategy 'hyperscan' needs the `hyperscan` package (pip install hyperscan); "
                         "'auto' falls back to 'polars'")
    return strategy
