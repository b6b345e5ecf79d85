"""The pure-Python reference for the decontamination kernel: `tokenize_ref`, `ngram_hashes_ref`
(and `tokenize`, the kernel's tokens of one text in the same shape, to compare with).

Why here and not in the library: nothing in datakit runs it. It is an independent, slow,
obviously-correct regex implementation of the numba lexer and window hash
(`datakit/stages/decontaminate/normalize.py`, `ngrams.py`), the oracle tests/stages/test_decontam.py
compares the kernel with (hypothesis property test). It shares only the token and final hash
functions (`token_hash_ref`, `fmix_ref`) with the library.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from datakit.stages.decontaminate.ngrams import min_punct
from datakit.stages.decontaminate.normalize import (
    DEFAULT_NORMALIZATIONS, F_CASE, F_COMMENTS, F_FLAT, F_IDENT, F_WS, KEYWORDS, MASK64, flags_of, fmix_ref,
    keyword_hashes, lex, token_hash_ref,
)


def tokenize(text: str | bytes, normalizations: Sequence[str] = DEFAULT_NORMALIZATIONS) -> list[tuple[int, int, int, bool]]:
    """Tokens of one text as (hash, start byte, end byte, is_identifier), via the numba kernel."""
    flags = flags_of(normalizations)
    data = np.frombuffer(text.encode() if isinstance(text, str) else text, dtype=np.uint8)
    n = len(data)
    val = np.empty(n, np.uint64); st = np.empty(n, np.int64); en = np.empty(n, np.int64); idf = np.empty(n, np.uint8)
    k = lex(data, 0, n, flags, keyword_hashes(flags), val, st, en, idf)
    return [(int(val[i]), int(st[i]), int(en[i]), bool(idf[i])) for i in range(k)]

# the Unicode spaces (UTF-8) the lexer reads as whitespace: U+00A0, U+2000-U+200A, U+202F, U+205F, U+3000
_USP = rb"\xc2\xa0|\xe2\x80[\x80-\x8a\xaf]|\xe2\x81\x9f|\xe3\x80\x80"
_NOT_USP = rb"(?!" + _USP + rb")"
_ID = rb"(?:" + _NOT_USP + rb"[A-Za-z_\x80-\xff])(?:" + _NOT_USP + rb"[A-Za-z0-9_\x80-\xff])*"
_NUM = rb"[0-9](?:" + _NOT_USP + rb"[A-Za-z0-9_\x80-\xff.])*"
_WS = rb"(?:[ \t\n\r\f\v]|" + _USP + rb")+"
_CODE_RE = re.compile(rb"(?P<c>#[^\n]*|//[^\n]*|/\*.*?(?:\*/|\Z))|(?P<q3>\"\"\"|''')|(?P<q1>[\"'])|(?P<ws>" + _WS
                      + rb")|(?P<id>" + _ID + rb")|(?P<num>" + _NUM + rb")|(?P<p>.)", re.S)
_FLAT_RE = re.compile(rb"(?P<c>#[^\n]*|//[^\n]*|/\*.*?(?:\*/|\Z))|(?P<q1>[\"'])|(?P<ws>" + _WS
                      + rb")|(?P<id>" + _ID + rb")|(?P<num>" + _NUM + rb")|(?P<p>.)", re.S)
_LIT_RE = re.compile(rb"(?P<ws>" + _WS + rb")|(?P<id>" + _ID + rb")|(?P<num>" + _NUM + rb")|(?P<p>.)", re.S)
_STR1_RE = re.compile(rb"(?P<ws>(?:[ \t\r\f\v]|" + _USP + rb")+)|(?P<id>" + _ID + rb")|(?P<num>" + _NUM + rb")|(?P<esc>\\.?)|(?P<p>.)", re.S)


def tokenize_ref(text: str | bytes, normalizations: Sequence[str] = DEFAULT_NORMALIZATIONS) -> list[tuple[int, int, int, bool]]:
    """Reference tokenizer (slow, obviously-correct regexes) with the same output as `tokenize`."""
    flags = flags_of(normalizations)
    data = text.encode() if isinstance(text, str) else text
    fold = bool(flags & F_CASE)
    kw = {w.lower() if fold else w for w in KEYWORDS}
    out: list[tuple[int, int, int, bool]] = []

    def emit(a: int, b: int, kind: str, code: bool) -> None:
        if kind == "ws" and flags & F_WS:
            return
        tok = data[a:b]
        ident = kind == "id" and code and bool(flags & F_IDENT) and (tok.lower() if fold else tok).decode("utf-8", "replace") not in kw
        out.append((token_hash_ref(tok, fold), a, b, ident))

    def literal(a: int, b: int, rx: re.Pattern) -> None:
        for m in rx.finditer(data, a, b):
            kind = m.lastgroup or "p"
            emit(m.start(), m.end(), "esc" if kind == "esc" else kind, False)

    i, n = 0, len(data)
    code_re = _FLAT_RE if flags & F_FLAT else _CODE_RE
    while i < n:
        m = code_re.match(data, i)
        kind = m.lastgroup
        if kind == "c":
            if not flags & F_COMMENTS:
                literal(m.start(), m.end(), _LIT_RE)
            i = m.end()
        elif kind in ("q1", "q3"):
            q = data[i:i + 1]
            delim = q * (3 if kind == "q3" else 1)
            for t in range(len(delim)):
                emit(i + t, i + t + 1, "q", False)
            j = i + len(delim)
            if kind == "q3":
                end = _find_close3(data, j, q)
                literal_str3(data, j, end, emit)
                if end < n:
                    for t in range(3):
                        emit(end + t, end + t + 1, "q", False)
                    i = end + 3
                else:
                    i = n
            else:
                k = j
                while k < n and data[k:k + 1] not in (q, b"\n"):
                    k += 2 if data[k:k + 1] == b"\\" and k + 1 < n else 1
                literal(j, k, _STR1_RE)
                if k < n and data[k:k + 1] == q:
                    emit(k, k + 1, "q", False)
                    k += 1
                i = k
        else:
            emit(m.start(), m.end(), kind, True)
            i = m.end()
    return out


def _find_close3(data: bytes, j: int, q: bytes) -> int:
    """Index of the closing triple quote (escapes skip one byte), or len(data)."""
    n = len(data)
    k = j
    while k < n:
        if data[k:k + 1] == b"\\":
            k += 2
            continue
        if data[k:k + 3] == q * 3:
            return k
        k += 1
    return n


def literal_str3(data: bytes, a: int, b: int, emit) -> None:
    """Tokens inside a triple-quoted string: like code runs but escapes are two-byte tokens."""
    rx = re.compile(rb"(?P<ws>" + _WS + rb")|(?P<id>" + _ID + rb")|(?P<num>" + _NUM + rb")|(?P<esc>\\.?)|(?P<p>.)", re.S)
    for m in rx.finditer(data, a, b):
        emit(m.start(), m.end(), m.lastgroup or "p", False)


def ngram_hashes_ref(text: str, n: int = 13, normalizations: Sequence[str] = DEFAULT_NORMALIZATIONS) -> list[int]:
    """Reference window hashes in pure Python (from `tokenize_ref`), the same as `ngrams.ngram_hashes`."""
    flags = flags_of(normalizations)
    toks = tokenize_ref(text, normalizations)
    canon = bool(flags & F_IDENT)
    need = min_punct(n, flags)
    raw = text.encode()
    out = []
    for s in range(len(toks) - n + 1):
        win = toks[s:s + n]
        if need and sum(1 for _v, a, _b, _i in win if not re.match(rb"[\sA-Za-z0-9_\x80-\xff]", raw[a:a + 1])) < need:
            continue
        h = 0x9E3779B97F4A7C15
        for j, (val, _a, _b, ident) in enumerate(win):
            if canon and ident:
                d = 0
                for back in range(1, min(j, n - 1) + 1):
                    if win[j - back][3] and win[j - back][0] == val:
                        d = back
                        break
                v = (0x27D4EB2F165667C5 + d) & MASK64 if d else 0x5BD1E9955BD1E995
            else:
                v = val
            h = ((h ^ v) * 0x100000001B3) & MASK64
        h = fmix_ref(h ^ n) or 1
        out.append(h)
    return out
