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

import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datakit.stages.decontaminate.continuation import joined_texts
from datakit.stages.decontaminate.evals import EvalSet
from datakit.stages.decontaminate.normalize import F_COMMENTS, F_FLAT, F_IDENT
from datakit.stages.decontaminate.ngrams import arrow_text_buffers, build_table, hash_strings, scan_strings, texts_to_buffers
from datakit.stages.texts import GENERIC_TEXT_FIELDS, text_columns, text_pieces


def default_min_fraction(flags: int) -> float:
    """The default share of an item's n-grams a document must contain (see docs/decontamination.md).

    Measured (benchmarks/decontam_leaks.py): with eval boilerplate, signatures
    and code at large (the reference corpus) removed from the items' n-grams,
    a small share is safe. Canonical identifiers make idioms more generic, so a
    table of only that mode needs 10%.
    """
    return 0.10 if (flags & F_IDENT) and not (flags & F_FLAT) else DEFAULT_MIN_FRACTION


DEFAULT_MIN_FRACTION = 0.03
# an item also matches when a document shares this many of its distinctive n-grams, whatever their share:
# a half-written copy of a long item covers a small fraction but far more than chance (see the docs' table)
DEFAULT_MIN_NGRAMS_ANY = 6
# a renamed copy (evidence only under canonical identifiers) must cover this share of the item
DEFAULT_MIN_FRACTION_LOOSE = 0.12


def default_rule(flags: int, robust: bool, min_ngrams: int = 1, min_fraction: float | None = None,
                 min_ngrams_any: int | None = None, min_fraction_loose: float | None = None) -> "Rule":
    """The rule with every unset part at its default for these normalizations (check and stage alike).

    The absolute count and the separate share for renamed copies only apply to
    robust matching with literal identifiers; a table built with `identifiers`
    asked for is judged by its fraction alone (idioms are generic there).
    """
    literal_ids = not (flags & F_IDENT)
    return Rule(min_ngrams, default_min_fraction(flags) if min_fraction is None else min_fraction,
                (DEFAULT_MIN_NGRAMS_ANY if robust and literal_ids else 0) if min_ngrams_any is None else min_ngrams_any,
                (DEFAULT_MIN_FRACTION_LOOSE if robust and literal_ids else 0.0) if min_fraction_loose is None
                else min_fraction_loose)


def views_of(n: int, flags: int, robust: bool = True) -> tuple[tuple[int, int], ...]:
    """The (n, normalizations) an eval is matched under: the given ones, plus (robust) a comment-free view
    and a comment-free identifier-insensitive ("loose") view, both `flat` (independent of where a
    document starts)."""
    if not robust:
        return ((n, flags),)
    out = [(n, flags), (n, flags | F_COMMENTS | F_FLAT), (n, flags | F_COMMENTS | F_IDENT | F_FLAT)]
    return tuple(dict.fromkeys(out))


def is_loose(flags: int) -> bool:
    """Canonical identifiers make idioms generic (`for I in range(len(I))`): such a view's evidence is weaker.
    (When the given normalizations include `identifiers`, every view is and the user's rule applies to all.)"""
    return bool(flags & F_IDENT)


@dataclass(frozen=True)
class Rule:
    """When a document matches an item, counted in distinct places (positions) of the item's distinctive
    n-grams. Literal evidence (views with identifiers as written): at least `min_ngrams` and
    `min_fraction` of the item's places, or at least `min_ngrams_any` places whatever their share (0 =
    off). Evidence that needs canonical identifiers (a renamed copy) counts only as a share of at least
    `min_fraction_loose` (0 = such evidence counts like literal evidence).
    """

    min_ngrams: int = 1
    min_fraction: float = 0.0
    min_ngrams_any: int = 0
    min_fraction_loose: float = 0.0

    def passes(self, shared: np.ndarray, total: np.ndarray, loose: np.ndarray | None = None) -> np.ndarray:
        """`shared`: literal places shared; `loose`: places shared in any view (default: `shared`)."""
        total = np.maximum(total, 1)
        loose = shared if loose is None else loose
        literal = shared if self.min_fraction_loose > 0 else loose
        ok = (literal >= max(1, self.min_ngrams)) & (literal / total >= self.min_fraction)
        if self.min_ngrams_any > 0:
            ok |= literal >= self.min_ngrams_any
        if self.min_fraction_loose > 0:
            ok |= (loose >= max(1, self.min_ngrams)) & (loose / total >= self.min_fraction_loose)
        return ok

    def near(self, shared: np.ndarray, total: np.ndarray, loose: np.ndarray | None = None) -> np.ndarray:
        """Pairs that reach half of some part of the rule (listed as near-threshold when they do not pass)."""
        half = Rule(max(1, (self.min_ngrams + 1) // 2), self.min_fraction / 2, (self.min_ngrams_any + 1) // 2,
                    self.min_fraction_loose / 2)
        if self.min_fraction <= 0 and self.min_ngrams <= 1:
            return np.zeros(len(shared), bool)  # the any-n-gram rule: nothing is "close" to one n-gram
        return half.passes(shared, total, loose)

    def describe(self) -> str:
        parts = [f">= {self.min_ngrams} n-gram{'s' if self.min_ngrams != 1 else ''}"] \
            if self.min_ngrams > 1 or self.min_fraction <= 0 else []
        if self.min_fraction > 0:
            parts.append(f">= {self.min_fraction:.0%} of the item's n-grams")
        text = " and ".join(parts)
        if self.min_ngrams_any > 0:
            text += f", or >= {self.min_ngrams_any} of them"
        if self.min_fraction_loose > 0:
            text += f", or >= {self.min_fraction_loose:.0%} with identifiers renamed"
        return text


# lines that a different solution to the same task shares with this one: imports, signatures, decorators
_SIGNATURE_LINE = re.compile(
    rb"^[ \t]*(?:(?:pub(?:\([a-z]+\))?|async|export|static|public|private|protected|unsafe|extern)\s+)*"
    rb"(?:def|fn|func|function|class|import|from\s+\S+\s+import|use|package|#include|@)[^\n]*$|^[ \t]*$",
    re.M)


# a docstring's opening quotes at the start of a line (what the line after a signature begins with)
_DOC_OPENER = re.compile(rb'^[ \t]*[rRuUbB]?(?:"""|\'\'\')', re.M)

# a name outside string literals (numbers, strings and punctuation are data)
_NAME_OR_STRING = re.compile(rb"'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"|(?<![\w.])([A-Za-z_][A-Za-z0-9_]*)")


class WeakWindows:
    """Which windows of a text are never evidence; the text is read once for any number of window sets."""

    def __init__(self, text: bytes) -> None:
        self.size = len(text)
        self.starts = np.concatenate([[0], np.nonzero(np.frombuffer(text, np.uint8) == 10)[0] + 1])
        weak_line = np.zeros(len(self.starts), bool)
        for m in _SIGNATURE_LINE.finditer(text):
            weak_line[np.searchsorted(self.starts, m.start(), "right") - 1] = True
        self.strong_before = np.concatenate([[0], np.cumsum(~weak_line)])
        # where a line's leading docstring quotes end (0: the line has none)
        self.opener_end = np.zeros(len(self.starts), np.int64)
        for m in _DOC_OPENER.finditer(text):
            self.opener_end[np.searchsorted(self.starts, m.start(), "right") - 1] = m.end()
        self._names: np.ndarray | None = None
        self._text = text

    def signature(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """True for windows [a, b) lying entirely within import/signature/blank lines, or running
        from them only into the opening quotes of the next line's docstring.

        Why: two different solutions of one task share those lines (a near-miss, not
        a leak), and a different solution with a docstring of its own shares its opening
        quotes too; only n-grams that reach into the body or the problem statement are
        evidence.
        """
        if not len(a):
            return np.zeros(0, bool)
        la = np.searchsorted(self.starts, a, "right") - 1
        lb = np.searchsorted(self.starts, np.maximum(b - 1, a), "right") - 1
        inside = (self.strong_before[lb + 1] - self.strong_before[la]) == 0
        into_quotes = (lb > la) & (b <= self.opener_end[lb]) & ((self.strong_before[lb] - self.strong_before[la]) == 0)
        return inside | into_quotes

    def data_only(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """True for windows [a, b) holding no name outside string literals: only numbers, strings and
        punctuation (`[(1, 2), (2, 3), ...]`, `['a', 'b', 'c', ...]`).

        Why: literal tables (an eval's test cases, a docstring's matrix) are what code at
        large shares with an item by accident; measured on ~200k chunks of installed
        packages, they were most of the real-code documents the rule flagged.
        """
        if not len(a):
            return np.zeros(0, bool)
        if self._names is None:
            name = np.zeros(self.size + 1, np.int64)
            at = [m.start(1) for m in _NAME_OR_STRING.finditer(self._text) if m.start(1) >= 0]
            name[np.asarray(at, np.int64) + 1] = 1
            self._names = np.cumsum(name)  # names starting before byte i
        return (self._names[np.minimum(b, self.size)] - self._names[a]) == 0


def unique_rows(*cols: np.ndarray) -> np.ndarray:
    """Indices of the distinct rows of the columns, in lexicographic order (first column first).

    `np.unique(axis=0)` sorts void views and is ~10x slower on the sizes here.
    """
    if not len(cols[0]):
        return np.zeros(0, np.int64)
    order = np.lexsort(cols[::-1])
    change = np.zeros(len(order), bool)
    change[0] = True
    for c in cols:
        sc = c[order]
        change[1:] |= sc[1:] != sc[:-1]
    return order[change]


def _same_text_items(item_texts: list[dict[str, str]], item_eval: list[int]) -> np.ndarray:
    """Item -> the first item of its eval with the same fields and texts (itself when none): duplicates
    of one item are one item when counting how many items own an n-gram."""
    first: dict[tuple, int] = {}
    out = np.empty(len(item_texts), np.int64)
    for g, (fields, e_no) in enumerate(zip(item_texts, item_eval)):
        out[g] = first.setdefault((e_no, tuple(sorted(fields.items()))), g)
    return out


@dataclass
class EvalTable:
    """Distinct eval n-gram hashes (sorted), which (item, position) owns each, and a probe table.

    A position is (text, byte where the window starts): the same place of an item
    seen under several views counts once, so `item_ngrams` and shared counts
    mean "distinct places of the item", whatever the number of views.
    """

    n: int
    flags: int
    eval_names: list[str]
    eval_sources: list[str]
    eval_fields: list[list[str]]
    item_eval: np.ndarray          # int32, global item -> eval index
    item_ids: list[str]
    item_texts: list[dict[str, str]]
    item_ngrams: np.ndarray        # int64, distinct strong positions per item
    hashes: np.ndarray             # uint64 sorted unique
    h_ptr: np.ndarray              # int64 CSR offsets: hash index -> entries
    h_items: np.ndarray            # int32, entry -> item
    keys: np.ndarray = field(repr=False, default=None)  # type: ignore[assignment]
    ignored_common: int = 0        # n-grams dropped as shared by too many items of one eval
    vals: np.ndarray = field(repr=False, default=None)  # type: ignore[assignment]
    h_pos: np.ndarray = field(repr=False, default=None)  # type: ignore[assignment]  # entry -> position id
    h_weak: np.ndarray = field(repr=False, default=None)  # type: ignore[assignment]  # entry in a signature line
    views: tuple[tuple[int, int], ...] = ()  # (n, flags) of every view
    ignored_reference: int = 0     # n-grams dropped as common in the reference corpus
    reference: dict | None = None  # what the reference corpus was (for the report)

    @classmethod
    def build(cls, evalsets: Sequence[EvalSet], n: int, flags: int, max_items_per_ngram: int = 1,
              robust: bool = False, reference: str | None = None) -> "EvalTable":
        """Hash every item's fields (n-grams never cross fields) under every view.

        `max_items_per_ngram`: an n-gram owned by more items *of one eval* than
        this is that eval's boilerplate (`: str) -> List[str]:` + a docstring
        opening is in dozens of HumanEval prompts): ignored for it. Overlaps
        *between* evals are not boilerplate (HumanEval and HumanEval+ share their
        items). 0 keeps every n-gram. `robust`: also the comment-free and
        identifier-insensitive views (`views_of`). `reference`: "stdlib" drops
        n-grams found in code at large (`reference.py`). Windows inside
        import/signature lines never count, nor (robust) windows of only
        literals (`WeakWindows`). Robust tables also hash prompt +
        solution as one program (`continuation.py`).
        """
        views = views_of(n, flags, robust)
        texts: list[str] = []
        text_item: list[int] = []
        place_text: list[tuple[int, int, int]] = []  # per text: (field text, solution text, seam byte)
        item_eval: list[int] = []
        item_ids: list[str] = []
        item_texts: list[dict[str, str]] = []
        for e_no, es in enumerate(evalsets):
            for it in es.items:
                g = len(item_ids)
                item_ids.append(it.id)
                item_eval.append(e_no)
                item_texts.append(dict(it.fields))
                first = len(texts)
                for txt in it.fields.values():
                    texts.append(txt)
                    text_item.append(g)
                    place_text.append((len(texts) - 1, len(texts) - 1, 1 << 31))
                for j in (joined_texts(it.fields) if robust else []):
                    # a window of prompt + solution counts at the place (field, byte) where it starts
                    names = list(it.fields)
                    texts.append(j.text)
                    text_item.append(g)
                    place_text.append((first + names.index(j.prompt_field), first + names.index(j.solution_field),
                                       j.cut))
        data, offs = texts_to_buffers(texts)
        t_item = np.asarray(text_item, dtype=np.int64)
        pt = np.asarray(place_text, np.int64).reshape(-1, 3)
        hs, items, pos, weaks = [], [], [], []
        # every text once, a newline between texts (so lines never run across two): the weak windows of
        # all views are found with one pass of each regex over it
        joined = WeakWindows(b"\n".join(bytes(data[offs[t]:offs[t + 1]]) for t in range(len(texts))))
        base = np.asarray(offs[:-1], np.int64) - int(offs[0]) + np.arange(len(texts), dtype=np.int64)
        for vn, vf in views:
            h, s, a, b = hash_strings(data, offs, vn, vf, spans=True)
            ga = base[s.astype(np.int64)] + a.astype(np.int64) if len(s) else np.zeros(0, np.int64)
            gb = ga - a.astype(np.int64) + b.astype(np.int64) if len(s) else ga
            weak = joined.signature(ga, gb)
            if robust:  # literal tables (see WeakWindows.data_only)
                weak |= joined.data_only(ga, gb)
            hs.append(h)
            items.append(t_item[s] if len(s) else np.zeros(0, np.int64))
            a64, s64 = a.astype(np.int64), s.astype(np.int64)
            after = a64 >= pt[s64, 2]  # in a joined text: past the seam, a place of the solution field
            pos.append(np.where(after, (pt[s64, 1] << 32) | (a64 - pt[s64, 2]), (pt[s64, 0] << 32) | a64))
            weaks.append(weak)
        H = np.concatenate(hs) if hs else np.zeros(0, np.uint64)
        I = np.concatenate(items).astype(np.int64) if items else np.zeros(0, np.int64)
        P = np.concatenate(pos) if pos else np.zeros(0, np.int64)
        W = np.concatenate(weaks) if weaks else np.zeros(0, bool)
        ev = np.asarray(item_eval, np.int64)
        ignored = 0
        if max_items_per_ngram > 0 and len(H):
            # distinct items per (eval, hash); an item whose n-grams would *all* go stays visible. Items
            # with the same text count once (`_same_text_items`): found in review, an eval file holding
            # HumanEval/20 twice (or a glob over two copies of one eval) made every n-gram of it "shared",
            # the guard kept all of them, boilerplate included, and data holding only HumanEval/0 was
            # reported as leaking HumanEval/20 too
            E = ev[I]
            t = unique_rows(E, H, _same_text_items(item_texts, item_eval)[I])
            pair = unique_rows(E[t], H[t])  # first row of each (eval, hash) among the distinct triples
            cnt = np.diff(np.append(pair, len(t)))
            bad = pair[cnt > max_items_per_ngram]
            if len(bad):
                be, bh = E[t][bad], H[t][bad]
                drop = np.zeros(len(H), bool)
                for e_no in np.unique(be).tolist():  # per eval: its own boilerplate only
                    sel = E == e_no
                    drop[sel] = np.isin(H[sel], bh[be == e_no])
                before = np.bincount(I[~W], minlength=len(item_ids))
                after = np.bincount(I[~drop & ~W], minlength=len(item_ids))
                blind = (after == 0) & (before > 0)
                drop &= ~blind[I]
                ignored = int(len(np.unique(H[drop])))
                H, I, P, W = H[~drop], I[~drop], P[~drop], W[~drop]
        ignored_ref = 0
        ref_info = None
        if reference and len(H):
            from datakit.stages.decontaminate.reference import common_hashes

            common_h, ref_info = common_hashes(np.unique(H), views, reference)
            drop = np.isin(H, common_h)
            ignored_ref = int(len(np.unique(H[drop])))
            H, I, P, W = H[~drop], I[~drop], P[~drop], W[~drop]
        ent = unique_rows(H, I, P)
        ph, pi, pp, pw = H[ent], I[ent].astype(np.int32), P[ent].astype(np.int64), W[ent]
        hashes, first = np.unique(ph, return_index=True)
        h_ptr = np.append(first, len(ph)).astype(np.int64)
        strong = ~pw
        ip = unique_rows(pi[strong].astype(np.int64), pp[strong])
        item_ngrams = np.bincount(pi[strong][ip].astype(np.int64), minlength=len(item_ids)).astype(np.int64)
        keys, vals = build_table(hashes)
        return cls(n=n, flags=flags, eval_names=[e.name for e in evalsets], eval_sources=[e.source for e in evalsets],
                   eval_fields=[list(e.fields) for e in evalsets], item_eval=np.asarray(item_eval, np.int32),
                   item_ids=item_ids, item_texts=item_texts, item_ngrams=item_ngrams, hashes=hashes, h_ptr=h_ptr,
                   h_items=pi, keys=keys, vals=vals, ignored_common=ignored, h_pos=pp, h_weak=pw, views=views,
                   ignored_reference=ignored_ref, reference=ref_info)

    def item_text(self, item: int, name: str) -> str:
        """The text of an item's field, or of one of its joined texts (`eval_spans` names them)."""
        if name in self.item_texts[item]:
            return self.item_texts[item][name]
        return next(j.text for j in joined_texts(self.item_texts[item]) if j.name == name)

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    def expand(self, hidx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For hash indices, (position in `hidx`, item, item position, weak) for every entry of the hash.

        Weak entries (windows inside import/signature lines) are never evidence, but
        mask mode masks them and snippets show them."""
        lo = self.h_ptr[hidx]
        cnt = self.h_ptr[hidx + 1] - lo
        pos = np.repeat(np.arange(len(hidx)), cnt)
        start = np.repeat(np.cumsum(cnt) - cnt, cnt)
        ent = np.repeat(lo, cnt) + (np.arange(int(cnt.sum())) - start)
        return pos, self.h_items[ent], self.h_pos[ent], self.h_weak[ent]

    def eval_spans(self, item: int, matched: np.ndarray) -> list[tuple[str, int, int]]:
        """Byte spans (field, start, end) of an item's texts whose window hash (any view) is in `matched` (sorted).

        A window across the prompt/solution seam is a span of the joined text, named
        `Joined.name` (`item_text` gives its text)."""
        out = []
        for fname, txt in self.item_texts[item].items():
            data, offs = texts_to_buffers([txt])
            for vn, vf in self.views or ((self.n, self.flags),):
                h, _, a, b = hash_strings(data, offs, vn, vf, spans=True)
                hit = np.isin(h, matched)
                out.extend((fname, int(x), int(y)) for x, y in zip(a[hit], b[hit]))
        if len(self.views) > 1:  # robust: windows across the prompt/solution seam, on the joined text
            for j in joined_texts(self.item_texts[item]):
                data, offs = texts_to_buffers([j.text])
                for vn, vf in self.views:
                    h, _, a, b = hash_strings(data, offs, vn, vf, spans=True)
                    hit = np.isin(h, matched) & (a < j.cut) & (b > j.cut)  # the others are in the fields' own
                    out.extend((j.name, int(x), int(y)) for x, y in zip(a[hit], b[hit]))
        return sorted(set(out))


@dataclass
class TextSource:
    """One string column of a batch, flattened: the kernel's buffers and which row each string is from."""

    name: str            # "segments", "chosen", "rejected" or a column name
    data: np.ndarray
    offsets: np.ndarray
    row_of: np.ndarray   # int64, string -> row in the batch
    strings: pa.Array    # for snippets and masking
    # a decoded copy (`decoded_sources`): (index of the source it decodes, that source's string of each of
    # its strings); its byte spans are not the original's, so masking masks that whole original string
    origin: tuple[int, np.ndarray] | None = None


_ESCAPES = [("\\\\", "\x00"), ("\\n", "\n"), ("\\t", "\t"), ("\\r", "\r"), ('\\"', '"'), ("\\'", "'"),
            ("\\/", "/"), ("\x00", "\\")]


# Line prefixes a text can put before every line of the code it shows (agent traces above all), each as
# (the pattern that says the text has them, the prefix to remove): a unified diff's `+`/`-`/` ` (the text
# holds a hunk header), and a line-number gutter as `cat -n` (`     1\t`) and editors' and agents' file
# views (`     1→`) print it.
_LINE_PREFIXES = [(r"(?m)^@@ -[0-9]+(?:,[0-9]+)? \+[0-9]+(?:,[0-9]+)? @@", r"(?m)^[-+ ]"),
                  (r"(?m)^ *[0-9]+\t", r"(?m)^ *[0-9]+\t"),
                  (r"(?m)^ *[0-9]+→", r"(?m)^ *[0-9]+→")]
_ANY_LINE_PREFIX = "|".join(f"(?:{has.removeprefix('(?m)')})" for has, _ in _LINE_PREFIXES).join(("(?m)", ""))


def _holding(arr: pa.Array, literal: str) -> np.ndarray:
    """Indices of the strings of `arr` that hold `literal`."""
    return np.nonzero(np.asarray(pc.fill_null(pc.match_substring(arr, literal), False)))[0]


def _line_prefix_candidates(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Indices of the strings (given as `arrow_text_buffers`) that could hold a line prefix: a tab, 0x92
    (the last byte of `→`, also in a few other characters) or `@@`.

    Why this way: Arrow's substring search ran at ~0.5 GB/s, and one per prefix kind over every text
    (and again over the escape-decoded copies) made `decoded_sources` 3.5x slower on code without any
    prefix (11 MB of stdlib code: 0.04 -> 0.14 CPU-s). A one-byte `bytes.find` is memchr, run once per
    string that holds the byte (a tab-indented language pays once per string, the others ~nothing);
    `@` is too common in code (decorators) for that, and a two-byte search runs at ~1 GB/s, so `@@`
    is found as the `@` bytes numpy sees followed by another. ~0.3 ms per MB in all."""
    import bisect

    lo, hi = int(offsets[0]), int(offsets[-1])
    if hi <= lo:
        return np.zeros(0, np.int64)
    buf = data[lo:hi]
    raw = buf.tobytes()
    starts = (offsets - lo).tolist()
    found: set[int] = set()
    for byte in (b"\t", b"\x92"):
        i = raw.find(byte)
        while i >= 0:
            k = bisect.bisect_right(starts, i) - 1
            found.add(k)
            i = raw.find(byte, starts[k + 1])
    at = np.flatnonzero(buf[:-1] == 0x40)
    at = at[buf[at + 1] == 0x40]
    found.update((np.searchsorted(offsets, at + lo, side="right") - 1).tolist())
    return np.array(sorted(found), dtype=np.int64)


def decoded_sources(sources: list[TextSource]) -> list[TextSource]:
    """Extra sources: the texts that hold escaped newlines (`\\n`), with JSON/string escapes decoded; and
    the texts (as written or so decoded) that show code as a unified diff or with a line-number gutter,
    without those line prefixes.

    Why: an eval file checked into a repo (a JSON line per item) or code kept in
    a string literal has every newline as `\\n` and every quote as `\\"`: no
    n-gram of the item survives that. Only texts containing `\\n` are copied.
    Likewise an agent's diff (`+    return len(string)`) or file view (`    12\treturn ...`): every
    n-gram across a line break holds the prefix (found in review: a verbatim HumanEval item inside a
    diff came out at a median 17% overlap, and 7 of the 164 were not found). Only texts with a hunk
    header, or lines opening with a number and a tab or `→`, are copied.
    """
    out = []
    for k, src in enumerate(sources):
        if not len(src.strings):
            continue
        strings = src.strings
        if not (pa.types.is_string(strings.type) or pa.types.is_large_string(strings.type)):
            strings = strings.cast(pa.string())
        bases = [(np.arange(len(strings)), strings)]
        which = _holding(strings, "\\n")
        if len(which):
            arr = strings.take(pa.array(which))
            for a, b in _ESCAPES:
                arr = pc.replace_substring(arr, a, b)
            out.append(_copy(src, k, which, arr))  # spans are not the row's
            bases.append((which, arr))
        for base_which, base in bases:
            cand = _line_prefix_candidates(*arrow_text_buffers(base))
            if not len(cand):
                continue
            sub = base.take(pa.array(cand))
            any_kind = np.asarray(pc.fill_null(pc.match_substring_regex(sub, _ANY_LINE_PREFIX), False))
            if not any_kind.any():  # (one pass over the candidates; code with tabs is rarely numbered)
                continue
            cand, sub = cand[any_kind], sub.filter(pa.array(any_kind))
            for has, prefix in _LINE_PREFIXES:
                hit = np.asarray(pc.fill_null(pc.match_substring_regex(sub, has), False))
                if hit.any():
                    out.append(_copy(src, k, base_which[cand[hit]],
                                     pc.replace_substring_regex(sub.filter(pa.array(hit)), prefix, "")))
    return out


def _copy(src: TextSource, k: int, which: np.ndarray, arr: pa.Array) -> TextSource:
    """A derived copy of strings `which` of source `k` (its byte spans are not the original's)."""
    data, offs = arrow_text_buffers(arr)
    return TextSource(src.name, data, offs, src.row_of[which], arr, (k, which))


def text_sources(batch: pa.RecordBatch | pa.Table, text_fields: Sequence[str] | None = None,
                 every_generic: bool = False) -> list[TextSource]:
    """The texts of a training-record batch (segments, chosen, rejected: each piece on its own, see
    `datakit.stages.texts`) or of generic text columns (`every_generic`: each of text/content/code
    present, as the contamination check reads them), as kernel buffers."""
    names = batch.schema.names
    wanted = text_columns(names, text_fields, every_generic)
    if not wanted:
        raise KeyError(f"no text to scan: expected training records (segments) or one of "
                       f"{', '.join(GENERIC_TEXT_FIELDS)} (columns: {', '.join(names)})")
    out = []
    for piece in text_pieces(batch, wanted):
        data, offs = arrow_text_buffers(piece.texts)
        out.append(TextSource(piece.column, data, offs, piece.rows, piece.texts))
    return out


@dataclass
class BatchMatches:
    """Matches of one batch: distinct (row, item) pairs with shared-n-gram counts, and raw hits."""

    rows: np.ndarray        # int64, per (row, item) pair
    items: np.ndarray       # int32
    shared: np.ndarray      # int64, distinct item places shared with literal identifiers
    hit_row: np.ndarray     # per raw hit (window x owning item)
    hit_item: np.ndarray
    hit_hidx: np.ndarray
    hit_source: np.ndarray  # index into the sources list
    hit_string: np.ndarray  # string index within its source
    hit_a: np.ndarray
    hit_b: np.ndarray
    sources: list[TextSource] = field(default_factory=list)  # the scanned sources (decoded ones appended)
    loose: np.ndarray = None  # type: ignore[assignment]  # per pair: places shared in any view (>= shared)


def match_batch(table: EvalTable, sources: list[TextSource], parallel: bool = False,
                decode: bool | None = None) -> BatchMatches:
    """Scan every source under every view of the table; shared = distinct item positions per (row, item).

    `decode` (default: when the table is robust) also scans `decoded_sources`;
    their hits carry source indices past `len(sources)` (see `BatchMatches.sources`).
    """
    if decode is None:
        decode = len(table.views) > 1
    all_src = list(sources) + (decoded_sources(sources) if decode else [])
    parts = []
    for si, src in enumerate(all_src):
        for vn, vf in table.views or ((table.n, table.flags),):
            s, v, a, b = scan_strings(src.data, src.offsets, vn, vf, table.keys, table.vals, parallel)
            if not len(s):
                continue
            pos, items, ipos, weak = table.expand(v)
            parts.append((src.row_of[s[pos]], items, v[pos], np.full(len(pos), si, np.int64), s[pos], a[pos], b[pos],
                          ipos, np.full(len(pos), is_loose(vf) and not is_loose(table.flags)), weak))
    if not parts:
        z = np.zeros(0, np.int64)
        return BatchMatches(z, z.astype(np.int32), z, z, z.astype(np.int32), z, z, z, z, z, all_src, z)
    hr, hi, hh, hs, hst, ha, hb, hp, hl, hw = (np.concatenate(x) for x in zip(*parts))
    hi64 = hi.astype(np.int64)
    ev = ~hw  # evidence: not inside a signature line
    t = np.nonzero(ev)[0][unique_rows(hr[ev], hi64[ev], hp[ev])]
    first = unique_rows(hr[t], hi64[t])  # distinct (row, item) among the distinct (row, item, position)
    loose = np.diff(np.append(first, len(t)))
    lit = ~hl & ev
    if not hl.any():
        literal = loose
    else:
        tl = unique_rows(hr[lit], hi64[lit], hp[lit])
        r_l, i_l = hr[lit][tl], hi64[lit][tl]
        # literal places per (row, item), aligned with the pairs above (a pair may have none)
        key_pairs = hr[t][first] * np.int64(table.n_items + 1) + hi64[t][first]
        key_l = r_l * np.int64(table.n_items + 1) + i_l
        uk, cnt = np.unique(key_l, return_counts=True)
        at = np.searchsorted(uk, key_pairs)
        at[at >= len(uk)] = 0
        literal = np.where((len(uk) > 0) & (uk[at] == key_pairs) if len(uk) else np.zeros(len(key_pairs), bool),
                           cnt[at] if len(uk) else 0, 0)
    return BatchMatches(hr[t][first], hi64[t][first].astype(np.int32), np.asarray(literal, np.int64),
                        hr, hi.astype(np.int32), hh, hs, hst, ha, hb, all_src, loose.astype(np.int64))


def merge_spans(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of byte intervals, sorted."""
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]
