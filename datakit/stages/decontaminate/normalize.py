"""Code-aware tokenization with switchable normalizations, as a numba kernel.

Why our own lexer: contamination matching runs over every byte of a training set,
so it must be language-agnostic (code, prose, chat), never fail on invalid code
(Python's `tokenize` does), and run at hundreds of MB/s. It works on UTF-8
*bytes*: identifiers are runs of `[A-Za-z_0-9\\x80-\\xff]` starting with a
non-digit, numbers are a digit followed by `[A-Za-z0-9_.]`, whitespace runs
(ASCII whitespace and the Unicode spaces U+00A0, U+2000-U+200A, U+202F, U+205F, U+3000),
and every other byte is a one-byte punctuation token (so `a==b` and `a == b`
lex alike). It tracks just enough syntax to know what is code: string literals
(`'..'`, `".."`, triple-quoted, backslash escapes) and comments (`#`, `//` to end
of line, `/* */`).

Normalizations (a bit mask, see `NORMALIZATIONS`):

- `whitespace`: drop whitespace tokens (layout, indentation, line breaks are ignored).
  Off: every whitespace run is a token, so only byte-identical layout matches.
- `case`: ASCII lower-casing of every token.
- `comments`: drop comment tokens (`#...`, `//...`, `/*...*/`). Python's `//`
  operator is read as a comment too; that loses a few tokens on *both* sides and
  never creates a false match. Docstrings are strings and are kept.
- `identifiers`: every identifier in code (not in strings or comments, not a
  keyword or builtin) becomes a placeholder that only remembers *which earlier
  identifier of the same n-gram it equals*. Consistent renaming (`numbers` ->
  `xs`) then yields the same n-gram hashes. The canonicalization itself happens
  per n-gram window in `ngrams.py`; the lexer only flags identifier tokens.
- `flat`: triple quotes are plain quotes, so no lexer state outlives a line
  (single-quoted strings end at the line's end anyway). Why: a training document
  cut from a file can start inside a docstring; tracked triple quotes then invert
  "string" and "code" for the whole document, and `identifiers`/`comments` would
  normalize the wrong parts (measured: renamed-leak recall 71% -> see
  docs/decontamination.md). With `flat` both sides lex every line alike wherever
  the text starts. With `identifiers`, a `flat` window needs a third of its
  tokens to be punctuation to count (`ngrams.py`): docstring prose, now lexed as
  code, would otherwise canonicalize into word-shape n-grams any prose matches.

`tokenize_ref` (tests/support/decontam_ref.py) is an independent regex implementation
of the same semantics, the tests' reference for the numba kernel.
"""
from __future__ import annotations

import builtins
import keyword
from typing import Iterable, Literal

import numpy as np
from datakit.jit import njit

Normalization = Literal["whitespace", "case", "comments", "identifiers", "flat"]
NORMALIZATIONS: dict[str, int] = {"whitespace": 1, "case": 2, "comments": 4, "identifiers": 8, "flat": 16}
DEFAULT_NORMALIZATIONS: tuple[str, ...] = ("whitespace", "case")

F_WS, F_CASE, F_COMMENTS, F_IDENT, F_FLAT = 1, 2, 4, 8, 16

# Words that stay literal under `identifiers`: renaming a variable never renames `range`. Python's
# keywords and builtins, plus syntax words of C-family/JS/Go/Rust that are rarely Python names.
# Type-ish words (`string`, `char`, `map`, `log`, `new`, `default`) are deliberately *not* here:
# they are common Python variable names, and a leak that renames them must still match
# (measured: renamed-leak recall 97.0% -> 98.2% at the default rule, clean-code FP unchanged).
_OTHER_KEYWORDS = """
function var let const void struct typedef namespace public private protected static extern unsigned
sizeof instanceof typeof func fn impl mut pub null nil undefined true false this throw throws catch
switch goto extends implements
""".split()
KEYWORDS: tuple[str, ...] = tuple(
    sorted(set(keyword.kwlist) | set(getattr(keyword, "softkwlist", [])) | set(dir(builtins)) | set(_OTHER_KEYWORDS)
           | {"self", "cls"})
)

U64 = np.uint64
_FNV_OFFSET = U64(0xCBF29CE484222325)
_FNV_PRIME = U64(0x100000001B3)
_M1 = U64(0xFF51AFD7ED558CCD)
_M2 = U64(0xC4CEB9FE1A85EC53)
_S33 = U64(33)
MASK64 = (1 << 64) - 1


def flags_of(normalizations: Iterable[str]) -> int:
    """Bit mask for a list of normalization names; unknown names are a clear error."""
    f = 0
    for name in normalizations:
        try:
            f |= NORMALIZATIONS[name]
        except KeyError:
            raise ValueError(f"unknown normalization {name!r}; known: {', '.join(NORMALIZATIONS)}") from None
    return f


def names_of(flags: int) -> list[str]:
    """Normalization names of a bit mask, in canonical order (for reports and index metadata)."""
    return [n for n, b in NORMALIZATIONS.items() if flags & b]


# ---------------------------------------------------------------------------------------------
# numba kernel
# ---------------------------------------------------------------------------------------------

@njit(cache=True, inline="always")
def _fmix(h):
    h ^= h >> _S33
    h *= _M1
    h ^= h >> _S33
    h *= _M2
    h ^= h >> _S33
    return h


# byte classes (1 whitespace, 2 identifier start, 4 digit; 6 = identifier continuation) and the
# case-folding table: one array lookup per byte instead of a chain of comparisons
_CLS = np.zeros(256, np.uint8)
for _b in b" \t\n\r\f\v":
    _CLS[_b] = 1
for _b in list(range(65, 91)) + list(range(97, 123)) + [95] + list(range(128, 256)):
    _CLS[_b] = 2
for _b in range(48, 58):
    _CLS[_b] = 4
_FOLD = np.arange(256, dtype=np.uint8)
_FOLD[65:91] += 32
_SAME = np.arange(256, dtype=np.uint8)

# What the lexer's tokens are, as a number an n-gram index records (`index.py`): an index whose lexer
# differs hashed other n-grams than a check computes now. 2: Unicode spaces are whitespace.
LEXER_VERSION = 2


@njit(cache=True, inline="always")
def _uspace(data, i, end):
    """Byte length of a Unicode space at `data[i]` (U+00A0, U+2000-U+200A, U+202F, U+205F, U+3000), else 0.

    Why: found in review, indentation copied from a web page is no-break spaces (C2 A0), which the
    byte classes read as identifier bytes: `<NBSP><NBSP>return` lexed as one word, so 38 of 40 HumanEval
    items re-indented that way were missed under the `whitespace` normalization. They are whitespace now."""
    c = data[i]
    if c == 0xC2:
        return 2 if i + 1 < end and data[i + 1] == 0xA0 else 0
    if i + 2 >= end:
        return 0
    if c == 0xE2:
        d = data[i + 1]
        e = data[i + 2]
        if d == 0x80 and ((0x80 <= e <= 0x8A) or e == 0xAF):
            return 3
        return 3 if d == 0x81 and e == 0x9F else 0
    if c == 0xE3:
        return 3 if data[i + 1] == 0x80 and data[i + 2] == 0x80 else 0
    return 0


@njit(cache=True, inline="always")
def _hash_bytes(data, a, b, fold):
    tab = _FOLD if fold else _SAME
    h = _FNV_OFFSET
    for i in range(a, b):
        h = (h ^ U64(tab[data[i]])) * _FNV_PRIME
    return _fmix(h)


@njit(cache=True, inline="always")
def _quote3(data, i, tok_val, tok_start, tok_end, tok_ident, k):
    """Emit a triple-quote delimiter at `i` as three one-byte tokens (opening and closing alike); returns the new k."""
    for t in range(3):
        tok_val[k] = _hash_bytes(data, i + t, i + t + 1, False)
        tok_start[k] = i + t
        tok_end[k] = i + t + 1
        tok_ident[k] = 0
        k += 1
    return k


@njit(cache=True)
def _is_keyword(kw, h):
    lo = 0
    hi = kw.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if kw[mid] < h:
            lo = mid + 1
        else:
            hi = mid
    return lo < kw.shape[0] and kw[lo] == h


@njit(cache=True)
def lex(data, start, end, flags, kw, tok_val, tok_start, tok_end, tok_ident):
    """Tokenize `data[start:end]` into the given arrays (from index 0); return the token count.

    `tok_ident[k]` is 1 for a code identifier that `identifiers` may canonicalize.
    """
    keep_ws = (flags & 1) == 0
    fold = (flags & 2) != 0
    strip_comments = (flags & 4) != 0
    canon = (flags & 8) != 0
    flat = (flags & 16) != 0
    CODE = 0
    STR1 = 1
    STR3 = 2
    state = CODE
    quote = 0
    lit_end = -1  # inside a kept comment: tokens up to here are literal
    k = 0
    i = start
    while i < end:
        c = data[i]
        in_comment = i < lit_end
        if state == CODE and not in_comment:
            if c == 35 or (c == 47 and i + 1 < end and (data[i + 1] == 47 or data[i + 1] == 42)):
                j = i + 1
                if c == 47 and data[i + 1] == 42:  # /* ... */
                    j = i + 2
                    while j < end and not (data[j] == 42 and j + 1 < end and data[j + 1] == 47):
                        j += 1
                    j = min(j + 2, end)
                else:
                    while j < end and data[j] != 10:
                        j += 1
                if strip_comments:
                    i = j
                    continue
                lit_end = j
                in_comment = True
            elif c == 34 or c == 39:
                if not flat and i + 2 < end and data[i + 1] == c and data[i + 2] == c:
                    k = _quote3(data, i, tok_val, tok_start, tok_end, tok_ident, k)
                    state = STR3
                    quote = c
                    i += 3
                    continue
                tok_val[k] = _hash_bytes(data, i, i + 1, False)
                tok_start[k] = i
                tok_end[k] = i + 1
                tok_ident[k] = 0
                k += 1
                state = STR1
                quote = c
                i += 1
                continue
        elif state == STR1:
            if c == 10:
                state = CODE
                continue
            if c == quote:
                state = CODE
        elif state == STR3:
            if c == quote and i + 2 < end and data[i + 1] == c and data[i + 2] == c:
                k = _quote3(data, i, tok_val, tok_start, tok_end, tok_ident, k)
                state = CODE
                i += 3
                continue
        lim = lit_end if in_comment else end
        ident = False
        is_ws = False
        j = i + 1
        cc = _CLS[c]
        us = _uspace(data, i, lim) if c >= 0xC2 else 0
        if cc == 1 or us > 0:
            is_ws = True
            j = i + max(us, 1)
            in_str1 = state == STR1
            while j < lim:  # ASCII whitespace and Unicode spaces; a line break ends a run in a '...' string
                d = data[j]
                if _CLS[d] == 1:
                    if in_str1 and d == 10:
                        break
                    j += 1
                elif d >= 0xC2:
                    u = _uspace(data, j, lim)
                    if u == 0:
                        break
                    j += u
                else:
                    break
        elif cc == 2:
            while j < lim and _CLS[data[j]] & 6 and (data[j] < 0xC2 or _uspace(data, j, lim) == 0):
                j += 1
            ident = canon and state == CODE and not in_comment
        elif cc == 4:
            while j < lim and (_CLS[data[j]] & 6 or data[j] == 46) and (data[j] < 0xC2 or _uspace(data, j, lim) == 0):
                j += 1
        elif c == 92 and state != CODE and j < lim:
            j += 1  # an escape: backslash and the next byte
        if is_ws and not keep_ws:
            i = j
            continue
        h = _hash_bytes(data, i, j, fold)
        if ident and _is_keyword(kw, h):
            ident = False
        tok_val[k] = h
        tok_start[k] = i
        tok_end[k] = j
        tok_ident[k] = 1 if ident else 0
        k += 1
        i = j
    return k


_KW_CACHE: dict[bool, np.ndarray] = {}


def keyword_hashes(flags: int) -> np.ndarray:
    """Sorted token hashes of `KEYWORDS` under the case setting of `flags` (input of `lex`)."""
    fold = bool(flags & F_CASE)
    if fold not in _KW_CACHE:
        words = sorted({w.lower() if fold else w for w in KEYWORDS})
        _KW_CACHE[fold] = np.unique(np.array([token_hash_ref(w.encode(), False) for w in words], dtype=np.uint64))
    return _KW_CACHE[fold]


# ---------------------------------------------------------------------------------------------
# pure-Python hashes: `keyword_hashes` builds its table with them, and the tests' independent regex
# tokenizer (tests/support/decontam_ref.py) hashes with them to check the kernel
# ---------------------------------------------------------------------------------------------

def fmix_ref(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & MASK64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & MASK64
    h ^= h >> 33
    return h


def token_hash_ref(tok: bytes, fold: bool) -> int:
    h = 0xCBF29CE484222325
    for c in (tok.lower() if fold else tok):
        h = ((h ^ c) * 0x100000001B3) & MASK64
    return fmix_ref(h)
