"""Secrets split across adjacent string literals: join the literals, scan the joined text, map back.

Why: a key written as

    token = ("ghp_ABCDEFGHIJKLMNOPQR"
             "STUVWXYZ0123456789ab")

or `key = "sk-proj-abc..." + "def..."` is one secret to the compiler but two
short strings to a line-local regex: each fragment alone is too short for its
detector, so it survived scrubbing (only PEM blocks were caught, by their
header). This module reads such *runs* of literals the way the language does:

- a *fragment* is a one-line string literal, `"..."`, `'...'`, `` `...` `` or a
  one-line triple-quoted Python string, with an optional prefix (`r b u f` in
  Python, `L` in C, `@ $` in C#); a backslash-newline inside a `"`/`'`/`` ` ``
  literal continues it on the next line (C and Python drop both characters);
- fragments form a *run* when only *glue* separates them: spaces, tabs, newlines,
  backslash-newline continuations, and at most one concatenation operator, `+`
  (Python, JS/TS, Java, C#, Go), `.` (PHP, Perl) or `..` (Lua). That covers
  Python implicit concatenation, C/C++ adjacent literals and parenthesized
  multi-line runs (the parenthesis is outside the run). A comma, a name, a call
  or a comment ends a run: `["abc",\\n "def"]` is two list items.

The run's contents are joined, with an offset map back to the original text,
and the format-specific secret detectors run on the joined text. A match that
crosses from one fragment into another (only those: a match inside one fragment
is the batch scanner's, found there with the same span) becomes ONE finding
from the secret's first character (in the first fragment) to its last (in the
last fragment). Replacing that span with the placeholder leaves one literal:
`token = ("<GITHUB_TOKEN>")`, so the code stays valid.

Which detectors: every "secret" detector whose pattern is a self-contained token
(GitHub, GitLab, Slack token and webhook, OpenAI, Anthropic, Google, Stripe, AWS
key id, JWT, and URL credentials, whose `scheme://user:pass@host` shape is
self-contained too). The context-bound ones, `secret_assignment`, `high_entropy`
and `aws_secret_key`, mean "the literal value of an assignment"; they run only
when the run *is* such a value (`name = `, `name: `, `name => `, `name := `,
optionally `(`), on `name = "<joined>"`: the batch scanner already replaces the
first fragment of `password = "abc" "def"` and leaves the rest, the joined value
replaces all of it, and the parenthesized form is found at all. PEM blocks are
not joined: their header already catches them.

Cost: Python looks only at rows and lines the Rust gates (polars) point at:
`ROW_GATE` (a closing quote, glue, an opening quote, a token-ish character;
quote-led, ~3 GB/s) picks rows, `GATE` (the same with the whole first literal,
whose last character must be token-ish) finds the hits in them, and `GATE_CONT`
finds backslash-newlines inside literals: ~14 rows per MB of the benchmark
corpus (standard-library code with planted secrets). Python then lexes only the lines around each hit (grown
while a run can continue past a line end), and runs the detectors only on runs
that can hold a secret (`_worth_scanning`: >= 8 characters and a token prefix
in one literal, or an assignment's value).

Exactness: the gated path finds exactly what lexing the whole text finds
(`gated=False`, the reference; tested on the standard library, the hard cases
and by hypothesis), because two literals only join where the characters on both
sides of the split are token-ish (which is what the gates look for), and a run
never leaves the lines its window grows to.

Known limits: a split next to a character outside `BOUNDARY_CHARS` (a space, a
bracket, a comma) is not joined, nor are literals with different quotes
(`"ab" 'cd'`), with no glue character between them (`"ab""cd"`), or with a
comment or a name between them; multi-line (triple-quoted, template) literals
are not lexed across lines; an assignment's value split by a bare line break
counts as one value only inside `name = (...)`; a pseudonym of a split secret
is the HMAC of the original span (quotes and glue included), not of the joined
value.
"""
from __future__ import annotations

import re
from bisect import bisect_right
from typing import Callable, NamedTuple, Sequence

import pyarrow as pa

from datakit.stages.scrub_pii.detectors import DETECTORS, Detector
from datakit.stages.scrub_pii.replace import apply_tokens
from datakit.stages.scrub_pii.scan import Finding, _Rows, candidate_ends, hyperscan_available, resolve_overlaps

# characters a split secret has on both sides of the split (every token-format detector's class,
# plus punctuation that occurs in passwords); a space, bracket, comma or quote there ends a run
BOUNDARY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+/=.:@!#$%&*^~?-")
_B = r"[A-Za-z0-9_+/=.:@!#$%&*^~?-]"
# spaces, newlines and backslash-newline, around at most one concatenation operator; never empty
# (`"a""b"` is legal but unusual, and requiring a glue character keeps `"""` docstrings out of the gate)
_WS = r"(?:[ \t\f]|\\?\r?\n)"
GLUE = r"(?:" + _WS + r"+(?:(?:\+|\.\.?)" + _WS + r"*)?|(?:\+|\.\.?)" + _WS + r"*)"
_PREFIX = r"[rRbBuUfFlL@$]{1,2}"
# The Rust gates (polars). They start with a quote / a backslash, so the regex engine skips to
# those bytes (a token-character class first ran at 0.7 GB/s; GATE runs at ~1.7 GB/s).
# GATE: a whole one-line literal whose last character is token-ish, glue, an opening quote of the
# same kind, a token-ish character. Reading the first literal whole (not just its closing quote)
# keeps prose split at a space (`"the token "\n "must"`, the common case) out: 5x fewer rows.
GATE = "|".join(q + r"(?:[^" + q + r"\n\\]|\\[\s\S])*" + _B + q + GLUE + r"(?:" + _PREFIX + r")?" + q + _B
                for q in "\"'`")
# GATE_CONT: a backslash-newline inside a literal followed by a token-ish character.
GATE_CONT = r"\\\r?\n" + _B
# ROW_GATE: the cheap first pass (~3.4 GB/s): a closing quote, glue, an opening quote of the same
# kind, a token-ish character; GATE then runs only on the ~25% of code rows this lets through.
ROW_GATE = "|".join(q + GLUE + r"(?:" + _PREFIX + r")?" + q + _B for q in "\"'`")

_GLUE_RE = re.compile(GLUE)
# one literal: single-line triple-quoted (never joined, but lexed so its quotes keep the lexer in
# sync), or "..." / '...' / `...` on one line, where a backslash-newline continues it
# (quote-led, so `re` skips to quote characters; the prefix is read backwards by `_prefix_start`)
_FRAG = re.compile(
    r"(?:\"\"\"(?P<t1>(?:[^\\\n]|\\.)*?)\"\"\"|'''(?P<t2>(?:[^\\\n]|\\.)*?)'''"
    r"|\"(?P<dq>(?:[^\"\\\n]|\\\r?\n|\\.)*)\"|'(?P<sq>(?:[^'\\\n]|\\\r?\n|\\.)*)'"
    r"|`(?P<bq>(?:[^`\\\n]|\\\r?\n|\\.)*)`)"
)
_PREFIX_CHARS = frozenset("rRbBuUfFlL@$")
_WORD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_CONT = re.compile(r"\\\r?\n")
# the text before a run that makes the run an assignment's value: `name = `, `"name": `, `name := (`
_ASSIGN = re.compile(
    r"(?<![\w.-])(?P<k>[A-Za-z_][\w.-]{0,60})[\"']?"
    r"(?:[ \t]*:[ \t]*[A-Za-z_][\w.\[\]| ]{0,40}?(?=[ \t]*=))?"  # a type annotation: `token: str = `
    r"[ \t]*(?:(?<![=!<>]):?=(?!=)|=>|:)[ \t]*(?:\((?:[ \t\f]|\\?\r?\n)*)?\Z"
)
_ASSIGN_LOOKBACK = 200
# detectors that mean "the value of an assignment": run on `name = "<joined>"` only
ASSIGNMENT_ENTITIES = frozenset({"secret_assignment", "high_entropy", "aws_secret_key"})
NOT_JOINED = frozenset({"private_key"})  # PEM blocks are caught by their header, split or not
# a token-format secret in a joined run starts with one of these (cheap test before the detectors)
_TOKEN_HINT = re.compile(
    r"gh[pousr]_|github_pat_|gl[a-z]{1,5}-|xox[abposr]-|xapp-|sk-|[sr]k_|whsec_|AIza|eyJ|"
    r"A(?:KIA|SIA|BIA|CCA|3T)|hooks\.slack\.com|://"
)
_MIN_JOINED = 8  # shorter joined runs hold no secret any detector accepts
_MAX_WINDOW_LINES = 64  # a run longer than this many lines is cut (never seen in real code)


class _Piece(NamedTuple):
    """A stretch of joined content copied from `text[orig:orig + length]`."""

    joined: int
    orig: int
    length: int


class Run(NamedTuple):
    """Adjacent literals read as one: their joined content and where each piece came from."""

    start: int  # offset of the first fragment (prefix included) in the original text
    content: str
    pieces: list[_Piece]
    # some split is a bare line break (no operator, no backslash): a concatenation only inside
    # brackets, so it is not trusted as one assignment value unless that opens a parenthesis
    bare_newline: bool = False

    def orig(self, j: int) -> int:
        """Original offset of joined character `j`."""
        k = bisect_right([p.joined for p in self.pieces], j) - 1
        p = self.pieces[k]
        return p.orig + (j - p.joined)

    def piece_of(self, j: int) -> int:
        return bisect_right([p.joined for p in self.pieces], j) - 1


# ---------------------------------------------------------------- lexing


def _content_pieces(text: str, a: int, b: int) -> list[tuple[int, int]]:
    """(start, end) stretches of a literal's content `text[a:b]` without its backslash-newlines."""
    if b == a:
        return []
    if text.find("\n", a, b) < 0:  # the common case: a one-line literal is one piece
        return [(a, b)]
    out, pos = [], a
    for m in _CONT.finditer(text, a, b):
        if m.start() > pos:
            out.append((pos, m.start()))
        pos = m.end()
    if b > pos:
        out.append((pos, b))
    return out


def _prefix_start(text: str, q: int, lo: int) -> int:
    """Where a literal whose quote is at `q` starts: before a 1-2 character prefix (`r`, `b`, `L`, `@`,
    `$@`...) that does not continue a word (`isr"x"` has none). Not before `lo` (the previous literal's end)."""
    if q - 2 >= lo and text[q - 2] in _PREFIX_CHARS and text[q - 1] in _PREFIX_CHARS and (
            q < 3 or text[q - 3] not in _WORD_CHARS):
        return q - 2
    if q - 1 >= lo and text[q - 1] in _PREFIX_CHARS and (q < 2 or text[q - 2] not in _WORD_CHARS):
        return q - 1
    return q


def lex_runs(text: str, pos: int = 0, endpos: int | None = None) -> list[Run]:
    """Runs of >= 2 content pieces in `text[pos:endpos]` (lexed left to right from `pos`).

    `pos` must be a line start outside any literal (true at 0, and at the start
    of every window `_windows` builds). Two literals join only where the
    characters on both sides of the split (the last one inside the first
    literal, the first one inside the second) are in BOUNDARY_CHARS; empty and
    triple-quoted literals are never joined.
    """
    end = len(text) if endpos is None else endpos
    runs: list[Run] = []
    cur: list[tuple[int, list[tuple[int, int]]]] = []  # (fragment start, content pieces)
    prev_end = prev_last = -1  # end of the previous literal, offset of its last content character
    prev_quote: str | None = None
    last_end = pos  # end of the previous literal, joinable or not (a prefix never reaches into it)
    bare = False

    def flush() -> None:
        nonlocal bare
        if cur and sum(len(p) for _, p in cur) >= 2:
            runs.append(_make_run(text, cur, bare))
        cur.clear()
        bare = False

    for m in _FRAG.finditer(text, pos, end):
        group = m.lastgroup
        start = _prefix_start(text, m.start(), last_end)
        last_end = m.end()
        ca, cb = m.span(group)
        pieces = _content_pieces(text, ca, cb) if group not in ("t1", "t2") else []
        if not pieces:
            flush()
            prev_end = -1
            continue
        # same quote only: `"abc"\n 'def'` is two items far more often than one split value, and
        # one placeholder span from `"` to `'` would leave unbalanced quotes
        glued = (start > prev_end >= 0 and group == prev_quote and text[prev_last] in BOUNDARY_CHARS
                 and text[ca] in BOUNDARY_CHARS and _GLUE_RE.fullmatch(text, prev_end, start) is not None)
        if not glued:
            flush()
        else:
            gap = text[prev_end:start]
            if "\n" in gap and "+" not in gap and "." not in gap and "\\" not in gap:
                bare = True
        cur.append((start, pieces))
        prev_end, prev_last, prev_quote = m.end(), cb - 1, group
    flush()
    return [r for r in runs if _has_visible_split(text, r)]


def _make_run(text: str, frags: list[tuple[int, list[tuple[int, int]]]], bare_newline: bool) -> Run:
    pieces: list[_Piece] = []
    chunks: list[str] = []
    j = 0
    for _, ps in frags:
        for a, b in ps:
            pieces.append(_Piece(j, a, b - a))
            chunks.append(text[a:b])
            j += b - a
    return Run(frags[0][0], "".join(chunks), pieces, bare_newline)


def _has_visible_split(text: str, run: Run) -> bool:
    """True when some piece boundary has BOUNDARY_CHARS on both sides (what the Rust gate sees).

    Fragment boundaries of a run always do; a lone literal continued by a
    backslash-newline counts only if its continuation does too.
    """
    ps = run.pieces
    return any(text[p.orig + p.length - 1] in BOUNDARY_CHARS and text[q.orig] in BOUNDARY_CHARS
               for p, q in zip(ps, ps[1:]))


# ---------------------------------------------------------------- detection on a run


def _worth_scanning(run: Run, assign: bool) -> bool:
    """Cheap filter: long enough, and a token prefix in it (or it is an assignment's value).

    The prefix is looked for in the joined text, so a cut inside it (`"gh" "p_..."`) still counts.
    """
    return len(run.content) >= _MIN_JOINED and (assign or _TOKEN_HINT.search(run.content) is not None)


def _crosses(run: Run, a: int, b: int) -> bool:
    """Does joined span [a, b) touch two pieces? (Else the batch scanner finds it in one literal.)"""
    return b > a and run.piece_of(a) != run.piece_of(b - 1)


def _to_original(run: Run, a: int, b: int) -> tuple[int, int]:
    """The one original span from joined char a (first fragment) to joined char b - 1 (last one)."""
    return run.orig(a), run.orig(b - 1) + 1


def _assignment(text: str, start: int) -> re.Match[str] | None:
    """The `name = ` (`"name": `, `name := (`...) right before `start`, or None.

    A backwards character check first: most runs are call arguments or list
    items, and the regex would otherwise try every position of the lookback.
    """
    j = start - 1
    while j >= 0 and text[j] in " \t\f\r\n\\":
        j -= 1
    if j >= 0 and text[j] == "(":
        j -= 1
        while j >= 0 and text[j] in " \t\f":
            j -= 1
    if j < 0 or text[j] not in "=:>":
        return None
    lo = max(text.rfind("\n", 0, j) + 1, j - _ASSIGN_LOOKBACK)
    return _ASSIGN.search(text, lo, start)


def run_candidates(text: str, run: Run, token_dets: Sequence[Detector], assign_dets: Sequence[Detector]
                   ) -> list[tuple[int, int, int, str]]:
    """Validated (start, end, priority, entity) findings of one run that cross a split."""
    if len(run.content) < _MIN_JOINED:
        return []
    ctx = _assignment(text, run.start) if assign_dets else None
    if ctx is not None and run.bare_newline and not ctx.group().rstrip().endswith("("):
        ctx = None  # `password = "abc"` then a line `"def"`: two statements (or list items), not one value
    if not _worth_scanning(run, ctx is not None):
        return []
    out: list[tuple[int, int, int, str]] = []
    content = run.content
    for det in token_dets:
        if det.compiled.search(content) is None:  # the common case, without a generator per detector
            continue
        for m in det.finditer(content):
            if not _crosses(run, *m.span()):
                continue
            a, b = det.span(m)
            if b > a:
                out.append((*_to_original(run, a, b), det.priority, det.entity))
    if ctx is not None:
        head = f'{ctx.group("k")} = "'
        synthetic = f'{head}{content}"'
        for det in assign_dets:
            if det.compiled.search(synthetic) is None:
                continue
            for m in det.finditer(synthetic):
                a, b = det.span(m)
                if det.entity == "high_entropy" and _has_alphabet_run(synthetic[a:b]):
                    continue  # an alphabet constant spelled over lines ('ABC...Z' 'abc...z' '0..9')
                a, b = max(a - len(head), 0), min(b - len(head), len(content))
                if b > a and _crosses(run, a, b):
                    out.append((*_to_original(run, a, b), det.priority, det.entity))
    return out


def _has_alphabet_run(value: str, n: int = 8) -> bool:
    """`n` characters in code-point order (`ABCDEFGH`, `0123456789`): an alphabet constant, not a key.

    Why only here: an alphabet spelled over several literals (`'ABC...Z' 'abc...z'
    '0123456789'`) joins into a value the entropy check accepts; the chance that a
    random key holds 8 consecutive characters in order is ~1e-12 per position.
    """
    run = 1
    for x, y in zip(value, value[1:]):
        run = run + 1 if ord(y) == ord(x) + 1 else 1
        if run >= n:
            return True
    return False


def _split_dets(detectors: Sequence[Detector]) -> tuple[list[Detector], list[Detector]]:
    secret = [d for d in detectors if d.category == "secret" and d.entity not in NOT_JOINED]
    return ([d for d in secret if d.entity not in ASSIGNMENT_ENTITIES],
            [d for d in secret if d.entity in ASSIGNMENT_ENTITIES])


def scan_text_split(text: str | None, detectors: Sequence[Detector] = DETECTORS,
                    windows: list[tuple[int, int]] | None = None,
                    split_dets: tuple[list[Detector], list[Detector]] | None = None
                    ) -> list[tuple[int, int, int, str]]:
    """Split-secret candidates of one text: lex it whole (the reference) or only `windows`."""
    if not text:
        return []
    token_dets, assign_dets = split_dets if split_dets is not None else _split_dets(detectors)
    if not token_dets and not assign_dets:
        return []
    out: list[tuple[int, int, int, str]] = []
    for a, b in windows if windows is not None else [(0, len(text))]:
        for run in lex_runs(text, a, b):
            out.extend(run_candidates(text, run, token_dets, assign_dets))
    return out


# ---------------------------------------------------------------- the gated batch path


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Windows sorted, with overlapping ones merged into one (so no run is lexed twice)."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _windows(text: str, hits: list[str], cont_hits: list[str]) -> list[tuple[int, int]]:
    """Line ranges to lex around each gate hit, grown while a run could continue past an edge.

    A GATE_CONT hit counts only if the character before its backslash is in
    BOUNDARY_CHARS (the Rust gate cannot look behind). A run crosses
    from line k-1 into line k only if line k-1 ends with a closing quote (maybe
    followed by an operator), holds only glue (blanks, one operator) or ends with
    a backslash, because everything between two literals of a run is glue; growing
    over such lines keeps every run that touches a hit whole.
    """
    spans: list[tuple[int, int]] = []
    for hs, look_behind in ((hits, False), (cont_hits, True)):
        pos = 0
        last_capped = True
        for h in hs:
            at = text.find(h, pos)
            if at < 0:  # cannot happen for the gate's own output; stay correct if it does
                at = text.find(h)
                if at < 0:
                    continue
            pos = at + len(h)
            if look_behind and (at == 0 or text[at - 1] not in BOUNDARY_CHARS):
                continue
            if spans and not last_capped and spans[-1][0] <= at and pos <= spans[-1][1]:
                continue  # inside the last window (see `_windows_at`)
            spans.append(_grow(text, at, pos))
            last_capped = _capped(text, spans[-1])
    return _merge(spans)


def _ends_in_glue(line: str) -> bool:
    """Can a run go on past the end of this line? (A closing quote or glue-only tail, or a backslash.)

    String methods, not a regex: this runs on every line a window grows over.
    """
    s = line.rstrip(" \t\f\r")
    if not s or s[-1] in "\"'`\\":
        return True
    if s[-1] not in "+.":
        return False
    s = s[:-2] if s.endswith("..") else s[:-1]
    s = s.rstrip(" \t\f")
    return not s or s[-1] in "\"'`"


def _grow(text: str, at: int, end: int) -> tuple[int, int]:
    a = text.rfind("\n", 0, at) + 1
    for _ in range(_MAX_WINDOW_LINES):
        if a == 0:
            break
        pa_ = text.rfind("\n", 0, a - 1) + 1
        if not _ends_in_glue(text[pa_ : a - 1]):
            break
        a = pa_
    b = text.find("\n", max(end - 1, a))
    for _ in range(_MAX_WINDOW_LINES):
        if b < 0:
            break
        la = text.rfind("\n", 0, b) + 1
        if not _ends_in_glue(text[la:b]):
            break
        b = text.find("\n", b + 1)
    return a, len(text) if b < 0 else b


def _gate_hits(texts: pa.Array | Sequence[str | None], candidate_rows: Sequence[int] | None = None
               ) -> dict[int, tuple[list[str], list[str]]]:
    """Row -> (GATE matches, GATE_CONT matches). Rows without any are never Python strings.

    Two polars passes: ROW_GATE/GATE_CONT as booleans over the whole column, then
    the slower GATE (it reads the first literal whole) and GATE_CONT as matched
    substrings on the rows that passed (every GATE match is a ROW_GATE match).
    `candidate_rows` (optional) replaces the first pass: the rows where a scanner's
    own single pass found ROW_GATE or GATE_CONT.
    """
    import polars as pl

    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    if isinstance(texts, pa.Array):
        arr = texts if texts.type in (pa.string(), pa.large_string()) else texts.cast(pa.string())
        series = pl.from_arrow(arr)
    else:
        series = pl.Series("t", list(texts), dtype=pl.String)
    t = pl.col("t")
    if candidate_rows is None:
        mask = pl.DataFrame({"t": series}).select(
            (t.str.contains(ROW_GATE) | t.str.contains(GATE_CONT)).fill_null(False).alias("m")).to_series()
        idx = mask.arg_true()
    else:
        idx = pl.Series("i", sorted(set(candidate_rows)), dtype=pl.UInt32)
    if idx.len() == 0:
        return {}
    sub = pl.DataFrame({"t": series.gather(idx)}).select(
        t.str.extract_all(GATE).alias("g"), t.str.extract_all(GATE_CONT).alias("c"))
    return {i: (g, c) for i, g, c in zip(idx.to_list(), sub.get_column("g").to_list(), sub.get_column("c").to_list())
            if g or c}


def find_split_secrets(texts: pa.Array | pa.ChunkedArray | Sequence[str | None],
                       detectors: Sequence[Detector] = DETECTORS, gated: bool = True,
                       candidate_rows: Sequence[int] | None = None,
                       gate_ends: tuple[dict[int, list[int]], dict[int, list[int]]] | None = None,
                       ) -> dict[int, list[tuple[int, int, int, str]]]:
    """Row -> split-secret candidates `(start, end, priority, entity)`, for rows that have any.

    `gated=False` lexes every row whole (the reference the gated path must equal).
    `candidate_rows`: the rows a scanner's single pass found `ROW_GATE` or `GATE_CONT`
    in (a superset is fine), so the first Rust pass here can be skipped; the
    hyperscan database of the scanner takes both patterns for ~1 ms per 4 MB.
    `gate_ends`: better, the end offsets of every GATE and GATE_CONT match per row
    (what the scanner's hyperscan pass reports): no polars pass at all here.
    """
    dets = _split_dets(detectors)
    if not dets[0] and not dets[1]:
        return {}
    out: dict[int, list[tuple[int, int, int, str]]] = {}
    if not gated:
        rows = texts.to_pylist() if isinstance(texts, (pa.Array, pa.ChunkedArray)) else list(texts)
        for i, t in enumerate(rows):
            found = scan_text_split(t, detectors)
            if found:
                out[i] = found
        return out
    if gate_ends is None and candidate_rows is not None and hyperscan_available():
        gate_ends = _gate_ends_hyperscan(texts, candidate_rows)
    if gate_ends is not None:
        return _find_at_ends(texts, detectors, dets, gate_ends)
    hits = _gate_hits(texts, candidate_rows)
    if not hits:
        return out
    idx = sorted(hits)
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        got = texts.take(pa.array(idx, pa.int64())).to_pylist()
    else:
        got = [texts[i] for i in idx]
    for i, t in zip(idx, got):
        found = scan_text_split(t, detectors, _windows(t, hits[i][0] or [], hits[i][1] or []), dets) if t else []
        if found:
            out[i] = found
    return out


def _gate_ends_hyperscan(texts: pa.Array | pa.ChunkedArray | Sequence[str | None], rows: Sequence[int]
                         ) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """GATE / GATE_CONT match ends in `rows` only, by one hyperscan pass over just those rows.

    Why: GATE reads a whole literal, so over every row it costs ~4x ROW_GATE; the
    scanner's pass runs the cheap ROW_GATE over everything (~20% of code rows
    match) and GATE runs here on those rows alone (4 ms vs 8.5 ms per 8 MB for
    the polars passes, measured in one run).
    """
    idx = sorted(set(rows))
    if not idx:
        return {}, {}
    arr = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(list(texts), pa.string())
    sub = arr.take(pa.array(idx, pa.int64()))
    g, c = candidate_ends(_Rows(sub), (), (GATE, GATE_CONT))
    return {idx[k]: v for k, v in g.items()}, {idx[k]: v for k, v in c.items()}


def _find_at_ends(texts: pa.Array | pa.ChunkedArray | Sequence[str | None], detectors: Sequence[Detector],
                  dets: tuple[list[Detector], list[Detector]],
                  gate_ends: tuple[dict[int, list[int]], dict[int, list[int]]]
                  ) -> dict[int, list[tuple[int, int, int, str]]]:
    """`find_split_secrets` on the rows and windows given by GATE / GATE_CONT match ends."""
    g_ends, c_ends = gate_ends
    idx = sorted(set(g_ends) | set(c_ends))
    out: dict[int, list[tuple[int, int, int, str]]] = {}
    if not idx:
        return out
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        got = texts.take(pa.array(idx, pa.int64())).to_pylist()
    else:
        got = [texts[i] for i in idx]
    for i, t in zip(idx, got):
        if not t:
            continue
        found = scan_text_split(t, detectors, _windows_at(t, g_ends.get(i, []), c_ends.get(i, [])), dets)
        if found:
            out[i] = found
    return out


def _capped(text: str, span: tuple[int, int]) -> bool:
    """Did `_grow` stop at its line limit (so a window grown from a later line could reach further)?"""
    return text.count("\n", span[0], span[1]) >= _MAX_WINDOW_LINES - 1


def _windows_at(text: str, gate_ends: Sequence[int], cont_ends: Sequence[int]) -> list[tuple[int, int]]:
    """`_windows` from match *end* offsets (hyperscan reports ends, not starts).

    A GATE match may span lines, but every line it covers before its last one
    ends in glue (a closing quote, an operator, a backslash, or blanks), so
    growing back from the end's line (`_grow`) reaches the line it starts on and
    goes on exactly as from there. A GATE_CONT match is a backslash, `\r?\n`,
    one character: its backslash sits 3 (or 4) characters before the end.
    """
    spans: list[tuple[int, int]] = []
    n = len(text)
    last_capped = True
    for e in gate_ends:  # sorted
        if not 0 < e <= n:
            continue
        if spans and not last_capped and spans[-1][0] <= e - 1 < spans[-1][1]:
            # inside the last window: growing from here gives a part of it (a minified line with
            # thousands of gate ends would otherwise re-grow the same window each time)
            continue
        spans.append(_grow(text, text.rfind("\n", 0, e - 1) + 1, e))
        last_capped = _capped(text, spans[-1])
    for e in cont_ends:
        if not 3 <= e <= n:
            continue
        at = e - 3 if text[e - 3] == "\\" else e - 4
        if at < 0 or text[at] != "\\" or at == 0 or text[at - 1] not in BOUNDARY_CHARS:
            continue
        spans.append(_grow(text, at, e))
    return _merge(spans)


def merge_findings(found: list[list[Finding]], split: dict[int, list[tuple[int, int, int, str]]],
                   priority: dict[str, int], suppressed: set[int] | None = None) -> list[list[Finding]]:
    """The batch scanner's findings with the split candidates, overlaps resolved as the scanner does.

    The split span carries its detector's priority, so a GitHub token joined from
    two literals beats the generic `secret_assignment`/`high_entropy` finding on
    its first fragment; between equals the earlier start, then the longer span
    wins (the joined token over the batch scanner's hit on its first fragment).
    A finding dropped while sticking out of a kept span marks its row in
    `suppressed`, as in the scanner, so the stage rechecks it after replacement.
    """
    if not split:
        return found
    out = list(found)
    for i, cands in split.items():
        allc = [(f.start, f.end, priority.get(f.entity, 0), f.entity) for f in out[i]] + list(cands)
        sup: list[int] = []
        out[i] = resolve_overlaps(allc, sup)
        if sup and suppressed is not None:
            suppressed.add(i)
    return out


# ---------------------------------------------------------------- idempotence across line merges

_MAX_SETTLE = 4


def _replaced_to_original(x: int, spans: list[tuple[int, int]], found: list[Finding], end: bool) -> int:
    """Offset `x` of the replaced text in the original text (inside a token: that finding's edge)."""
    shift = 0
    for (ts, te), f in zip(spans, found):
        if x < ts or (end and x == ts):
            break
        if x < te or (end and x == te):
            return f.end if end else f.start
        shift = f.end - te
    return x + shift


_GATE_PY = re.compile(GATE)
_GATE_CONT_PY = re.compile(GATE_CONT)


def _scan_few(text: str, detectors: Sequence[Detector]) -> list[tuple[int, int, int, str]]:
    """`find_split_secrets` for one text with the gates run by Python's `re` (~100 MB/s, no polars call)."""
    hits, cont = _GATE_PY.findall(text), _GATE_CONT_PY.findall(text)
    return scan_text_split(text, detectors, _windows(text, hits, cont)) if hits or cont else []


def _scan_around(text: str, spans: list[tuple[int, int]], detectors: Sequence[Detector]
                 ) -> list[tuple[int, int, int, str]]:
    """Split-secret candidates of the runs touching the lines of `spans` (grown like `_windows`)."""
    merged = _merge([_grow(text, a, b) for a, b in spans])
    return scan_text_split(text, detectors, merged) if merged else []


# entities whose matched value can hold a quote (`O'Brien`; a backtick in URL credentials): replacing
# it changes how the rest of its line pairs quotes, like a replacement that joins lines
QUOTE_SPAN_ENTITIES = frozenset({"person", "url_credentials"})
_RELEX_CHARS = frozenset("\n\"'`")


def relexes(value: str) -> bool:
    """Does replacing `value` change how literals lex around it? (It joins lines or removes a quote.)"""
    return not _RELEX_CHARS.isdisjoint(value)


def settle_line_merges(texts: dict[int, str], found: list[list[Finding]], detectors: Sequence[Detector],
                       priority: dict[str, int], token: Callable[[str, str], str],
                       suppressed: set[int] | None = None, whole_text: bool = False) -> None:
    """In place: add to `found[i]` the split secrets that replacing `found[i]` in `texts[i]` would expose.

    Why: replacing a span that crosses a line break (a split secret over two lines,
    a PEM block) joins those lines, so a quote the lexer saw unterminated on the
    first line may now close on the joined line, the literals after it lex
    differently, and a split secret appears that the first scan could not see.
    Replacing a value that holds a quote (`# Author: Pat O'Brien 'ghp_..' '..'`)
    does the same on its own line.
    The stage's later rounds recheck only the token lines with the line scanner,
    so that would break idempotence. The replacement is simulated here instead
    (with the replacer's own tokens; lexing only sees that they hold no quote)
    until nothing new appears, and what appears is mapped back to the original.
    `whole_text=True` rescans the whole replaced text (the reference the windowed
    rescan around the joined lines must equal; tested by hypothesis).
    Only rows with a finding that spans a line break can change this way (on one
    line, removing quotes from inside a run cannot make an earlier quote close).
    """
    pending = {i: t for i, t in texts.items() if any(relexes(t[f.start : f.end]) for f in found[i])}
    for _ in range(_MAX_SETTLE):
        if not pending:
            return
        nxt: dict[int, str] = {}
        for i in sorted(pending):
            # simulate only the replacements that re-pair quotes: the others put a quote-free token where
            # quote-free text was (no change to lexing), and replacing them here would cut the very
            # fragment a newly visible split secret starts in (`key='<SECRET>' 'rest-of-token'`)
            relexing = [f for f in found[i] if relexes(pending[i][f.start : f.end])]
            new_text, spans = apply_tokens(pending[i], relexing, token)
            # lexing is line-local (continuations and glue lines aside, which `_grow` follows), so
            # only the runs around the changed lines can change: scan there, not the whole text
            cands = _scan_few(new_text, detectors) if whole_text else _scan_around(new_text, spans, detectors)
            if not cands:
                continue
            back = _replaced_to_original
            mapped = [(back(a, spans, relexing, False), back(b, spans, relexing, True), p, e) for a, b, p, e in cands]
            sup: list[int] = []
            new = resolve_overlaps([(f.start, f.end, priority.get(f.entity, 0), f.entity) for f in found[i]]
                                   + [c for c in mapped if c[1] > c[0]], sup)
            if sup and suppressed is not None:
                suppressed.add(i)
            if new != found[i]:
                found[i] = new
                nxt[i] = pending[i]
        pending = nxt


__all__ = ["GATE", "GATE_CONT", "ROW_GATE", "GLUE", "BOUNDARY_CHARS", "Run", "lex_runs", "scan_text_split",
           "find_split_secrets", "merge_findings", "settle_line_merges"]
