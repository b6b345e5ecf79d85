"""What `_quarantine/` keeps of a rejected input line: scrubbed, hashed or verbatim (`raw:` of ingest).

Why scrubbed by default (issue 18): the quarantine sits next to the dataset and operators read it,
so it must not be a back door for the secrets and personal data the pipeline removes.

Why a decoded view: a quarantined line is JSON text (often not valid JSON: that may be why it was
rejected), and JSON's string escapes hide values from detectors that read text. Every quote inside
a string is `\\"`, so `DB_PASSWORD = \\"s3cr3t\\"` is no assignment; `\\/` cuts `/Users/jane` and a
webhook URL; `\\n` glues its letter to the next word (`nAKIA...`); `\\u0040` or `\\u005A` hide
characters of an address or a key (found in two privacy reviews). The detectors scan the view in
which every escape is decoded (`json_view`), and each finding is mapped back to the span of the line
that writes the same characters, so what is kept is the line as it was, escapes and all, with the
findings replaced by placeholders. The line (escapes split from the next word) is then scanned as
text once more: anything the view's decoding changed the shape of is caught either way.
"""
from __future__ import annotations

import codecs
import hashlib
import logging
import re
from typing import Any, Callable, Literal, NamedTuple

log = logging.getLogger("datakit.stages.ingest")

QuarantineRaw = Literal["scrubbed", "hash", "verbatim"]

_SIMPLE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_JSON_ESCAPE = re.compile(r'\\(?:u([dD][89abAB][0-9a-fA-F]{2})\\u([dD][c-fC-F][0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|(["\\/bfnrt]))')


class JsonView(NamedTuple):
    """`view`: the text with its JSON escapes decoded; `starts[k]`: where view character k begins in the
    text (`starts[len(view)]` is the text's length), so view span (a, b) is text span
    (starts[a], starts[b])."""

    view: str
    starts: list[int]

    def span(self, a: int, b: int) -> tuple[int, int]:
        return self.starts[a], self.starts[b]


def json_view(text: str) -> JsonView | None:
    """The decoded view of `text` (see `JsonView`), or None when it holds no escape. A lone surrogate
    escape (`\\ud800`) stays as written: it is no character a detector could read (nor encode)."""
    if "\\" not in text:
        return None
    parts: list[str] = []
    starts: list[int] = []
    pos = 0
    for m in _JSON_ESCAPE.finditer(text):
        a, b = m.span()
        if a > pos:
            parts.append(text[pos:a])
            starts.extend(range(pos, a))
        hi, lo, code, simple = m.groups()
        if simple is not None:
            ch = _SIMPLE[simple]
        elif hi is not None:
            ch = chr(0x10000 + ((int(hi, 16) - 0xD800) << 10) + (int(lo, 16) - 0xDC00))
        else:
            n = int(code, 16)
            ch = chr(n) if not 0xD800 <= n <= 0xDFFF else None
        if ch is None:  # a lone surrogate: its six characters as they are
            parts.append(text[a:b])
            starts.extend(range(a, b))
        else:
            parts.append(ch)
            starts.append(a)
        pos = b
    if pos == 0 and not parts:
        return None
    parts.append(text[pos:])
    starts.extend(range(pos, len(text) + 1))
    return JsonView("".join(parts), starts)


# For the second scan, of the line as text: a mark after each escape splits it from the next word, and
# the ASCII letters, digits and `@ . _ + -` written as `\u00XX` are decoded; the marks are taken out after.
_SPLIT_MARK = "\uf8ff"  # a private-use character: no detector matches it, no real log line needs it
_ESCAPE = re.compile(r"\\[ntrbf/]")
_ASCII_ESCAPE = re.compile(r"(?<!\\)\\u00(3[0-9]|4[0-9a-fA-F]|5[0-9aA]|6[1-9a-fA-F]|7[0-9aA]|2[bdeBDE]|5[fF])")


def json_escapes_split(text: str) -> str:
    """`text` for the scan as text: escapes split from the next word, plain ASCII escapes decoded."""
    if _SPLIT_MARK in text:
        return text
    text = _ASCII_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)
    return _ESCAPE.sub(lambda m: m.group() + _SPLIT_MARK, text)


def json_escapes_restored(text: str | None) -> str | None:
    return None if text is None else text.replace(_SPLIT_MARK, "")


def quarantine_scrubber() -> Any:
    """`scrub_pii`'s detectors (secrets and personal data, placeholder policy, no NER) for quarantined lines."""
    from datakit.stages.scrub_pii.stage import ScrubPiiConfig

    return ScrubPiiConfig(ner="off", default_policy="placeholder").build_fn()


def scrub_lines(fn: Any, texts: list[str]) -> list[str | None]:
    """`texts` (quarantined lines) scrubbed by `fn` (a `ScrubFn`): findings in each line's decoded view
    replaced in the line itself, then the line scanned as text (see the module doc)."""
    from datakit.stages.scrub_pii.replace import apply_tokens
    from datakit.stages.scrub_pii.scan import Finding

    views = [json_view(t) for t in texts]
    found = fn.scan([v.view if v is not None else t for v, t in zip(views, texts)])
    first = []
    for t, v, fs in zip(texts, views, found):
        if v is not None:
            fs = [Finding(*v.span(f.start, f.end), f.entity) for f in fs]
        first.append(apply_tokens(t, fs, fn.replacer.token)[0] if fs else t)
    return [json_escapes_restored(t) for t in fn.scrub([json_escapes_split(t) for t in first])[0]]


def _bytes_as_cp1252(e: UnicodeDecodeError) -> tuple[str, int]:
    """A UTF-8 decoding error handler: each byte that is not UTF-8 as the Windows-1252 / Latin-1 character it
    would be (the usual reason a log line is not UTF-8), never U+FFFD."""
    bad = e.object[e.start:e.end]
    return "".join(bytes([b]).decode("cp1252", "ignore") or chr(b) for b in bad), e.end


_NOT_UTF8 = "datakit.quarantine.cp1252"
codecs.register_error(_NOT_UTF8, _bytes_as_cp1252)


def decoded_for_scrubbing(raw: bytes) -> str:
    """A quarantined line as text: UTF-8, and any byte that is not UTF-8 as its Windows-1252 / Latin-1 character.

    Why not U+FFFD (`errors="replace"`): found in a hostile-input review, an address broken by one Latin-1
    byte (`jose.garc\\xeda@example.com`) was masked only from the replacement character on, keeping
    `jose.garc` in `_quarantine/`: U+FFFD is no letter, so the detectors' match began after it. As the
    character it stands for (`í`), the whole address is one finding, as it is in a UTF-8 line."""
    return raw.decode("utf-8", _NOT_UTF8)


def _fingerprint(raw: bytes, offset: int | None) -> bytes:
    where = f"bytes={offset}-{offset + len(raw)}" if offset is not None else f"length={len(raw)}"
    return f"sha256={hashlib.sha256(raw).hexdigest()};{where}".encode()


def quarantine_raw(raws: list[bytes | None], offsets: list[int | None], mode: QuarantineRaw,
                   scrub: Callable[[list[str]], list[str | None]] | None = None) -> list[bytes | None]:
    """What `_quarantine/` keeps of each rejected line:

    * `scrubbed` (default): the line with `scrub_pii`'s findings replaced by placeholders (`scrub`,
      e.g. `scrub_lines` bound to a scrubber); if the scrubber could not be loaded (None) or fails, the
      line is hashed instead (never kept verbatim);
    * `hash`: `sha256=<hex>;bytes=<start>-<end>` -- enough to find the line in the input;
    * `verbatim`: the line as read (only for inputs known to be clean).
    """
    if mode == "verbatim":
        return raws
    idx = [i for i, r in enumerate(raws) if r is not None]
    out = list(raws)
    if mode == "scrubbed" and idx:
        try:
            if scrub is None:
                raise ImportError("not loaded")
            clean = scrub([decoded_for_scrubbing(raws[i]) for i in idx])
        except (ImportError, OSError) as e:
            log.warning("quarantine: scrubber unavailable (%s); quarantined lines are hashed", type(e).__name__)
            mode = "hash"
        else:
            for i, text in zip(idx, clean):
                out[i] = (text or "").encode("utf-8", "replace")
            return out
    for i in idx:
        out[i] = _fingerprint(raws[i], offsets[i])
    return out
