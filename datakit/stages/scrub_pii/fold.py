"""The folded view: what a text shows a reader, for detectors that read ASCII.

Why: found in review, an invisible character inside a value defeated every detector. A zero-width
space in `jane<U+200B>@x.org` or `AKIA<U+200B>IOSFODNN7EXAMPLE`, a soft hyphen in a card number, a
fullwidth `＠` (U+FF20) or fullwidth digits: the patterns read ASCII (`re.ASCII`), so the address,
key or number was left in clear, while the text a model learns from still holds it (a tokenizer
keeps the invisible character as a token of its own, the value's characters around it unchanged).

The view drops the invisible format characters (`INVISIBLE_RANGES`) and maps the fullwidth forms of
ASCII (U+FF01-U+FF5E) to the ASCII they show. It is not NFKC: NFKC also rewrites ligatures,
superscripts and more, and changes lengths in ways whose offsets are costly to map back; these two
rules are the ones a value can hide behind while it still reads the same. `Folded.span` maps a
finding in the view back to the span of the text that covers the same characters, the invisible
ones inside it included (the replacement removes them with the value).

Only rows holding such a character are folded: the scanner's one hyperscan pass picks them
(`FOLD_GATE_BYTES`; `folded_rows` is the same gate as one Arrow pass, for the other strategies).
That is not rare: Chinese and Japanese prose writes fullwidth punctuation (`？`, `，`), 0.8% of the
texts of the quickstart mix (`？`). Those sentence marks alone do not pick a row (see `_GATE_RANGES`),
and the views go through the batch scanner's own prefilter path, as a batch of their own, not a
whole-text scan by every detector (which made the scan of that mix 55% slower).
"""
from __future__ import annotations

import re
from bisect import bisect_right
from typing import NamedTuple

import pyarrow as pa

# soft hyphen, Arabic letter mark, Mongolian vowel separator, zero-width space/non-joiner/joiner, LRM/RLM,
# bidi embeddings and isolates, word joiner and invisible operators, BOM / zero-width no-break space
INVISIBLE_RANGES = ((0x00AD, 0x00AD), (0x061C, 0x061C), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E),
                    (0x2060, 0x2064), (0x2066, 0x2069), (0xFEFF, 0xFEFF))
FULLWIDTH_ASCII = (0xFF01, 0xFF5E)  # `！` .. `～`: ASCII 0x21..0x7E plus 0xFEE0


def _class(ranges: tuple[tuple[int, int], ...], esc) -> str:
    return "".join(esc(a) if a == b else f"{esc(a)}-{esc(b)}" for a, b in ranges)


# What makes a text worth folding: every folded character but the fullwidth sentence marks `！，；？`
# (U+FF01, U+FF0C, U+FF1B, U+FF1F), the common ones of Chinese and Japanese prose, which fold to ASCII
# marks that no detector's value holds (a quoted secret holding one is found by its assignment anyway).
# Why: `？` alone put 0.8% of the quickstart mix's texts through a second scan.
_GATE_RANGES = INVISIBLE_RANGES + ((0xFF02, 0xFF0B), (0xFF0D, 0xFF1A), (0xFF1C, 0xFF1E), (0xFF20, 0xFF5E))
_INVISIBLE = re.compile(f"[{_class(INVISIBLE_RANGES, chr)}]")
_FOLDED = re.compile(f"[{_class(_GATE_RANGES, chr)}]")
_FOLDED_RE2 = "[" + _class(_GATE_RANGES, "\\x{%04x}".__mod__) + "]"  # the same class for Arrow's RE2


def _utf8_alternation(ranges: tuple[tuple[int, int], ...]) -> str:
    """A byte-wise regex (`\\xHH` escapes) matching the UTF-8 encoding of any code point in `ranges`:
    for hyperscan's one pass over the Arrow buffer, which runs without its UTF-8 mode."""
    by_prefix: dict[bytes, list[int]] = {}
    for a, b in ranges:
        for o in range(a, b + 1):
            enc = chr(o).encode()
            by_prefix.setdefault(enc[:-1], []).append(enc[-1])
    hx = "\\x{:02x}".format
    return "|".join("".join(map(hx, prefix)) + "[" + "".join(map(hx, sorted(last))) + "]"
                    for prefix, last in sorted(by_prefix.items()))


FOLD_GATE_BYTES = _utf8_alternation(_GATE_RANGES)  # picks the rows `folded_rows` picks (tested)
_TABLE = {**{o: o - 0xFEE0 for o in range(FULLWIDTH_ASCII[0], FULLWIDTH_ASCII[1] + 1)},
          **{o: None for a, b in INVISIBLE_RANGES for o in range(a, b + 1)}}


class Folded(NamedTuple):
    """A text's folded view, and where the view's characters sit in the text."""

    view: str
    gaps: list[int]  # for each dropped character, in order: the view index of the character after it

    def span(self, start: int, end: int) -> tuple[int, int]:
        """A view span `[start, end)` (non-empty) as the span of the text covering the same characters."""
        return start + bisect_right(self.gaps, start), end - 1 + bisect_right(self.gaps, end - 1) + 1


def fold_view(text: str) -> Folded | None:
    """The folded view of a text holding an invisible or fullwidth character (but for the sentence marks
    only: `_GATE_RANGES`), else None."""
    if not _FOLDED.search(text):
        return None
    gaps = [m.start() - j for j, m in enumerate(_INVISIBLE.finditer(text))]
    return Folded(text.translate(_TABLE), gaps)


def fold_text(value: str) -> str:
    """The view's characters of `value` (a pseudonym's canonical value: `jane<U+200B>@x.org` is `jane@x.org`)."""
    return value.translate(_TABLE)


def folded_rows(texts: pa.Array) -> list[int]:
    """Indices of the rows holding a folded character: one RE2 pass over the column's non-ASCII rows."""
    if len(texts) == 0:
        return []
    import pyarrow.compute as pc

    wide = pc.indices_nonzero(pc.invert(pc.fill_null(pc.string_is_ascii(texts), True)))
    if len(wide) == 0:
        return []
    hit = pc.fill_null(pc.match_substring_regex(texts.take(wide), _FOLDED_RE2), False)
    return wide.filter(hit).to_pylist()
