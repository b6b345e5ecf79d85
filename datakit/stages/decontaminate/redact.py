"""Redaction of report excerpts: PII and secrets never leave a contamination report unredacted.

Why redact whole lines first and clip afterwards: a clip cut through a secret
(`AKIAIOSFODNN7EXAMPLE` -> `IOSFODNN7EXAMPLE…`) leaves a string no detector
recognizes but that shows most of it. So an excerpt is widened to whole lines
(or, in a very long line, to word boundaries: detectors match whole words),
redacted, and only then clipped.

The redactor is the `scrub_pii` stage's scrubber, with person-name NER over the
checked data's excerpts (as the stage runs it over chat turns; `ner: auto`: the
installed spaCy model, recorded as `redaction.names`), not over the eval side,
which is public benchmark text. When the scrubber cannot be loaded (its optional
dependencies are missing), a small regex set stands in; that fallback is logged
and recorded in the report (`redaction.method`), never silent.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

SNIPPET_CHARS = 240
# widest excerpt redacted around an overlap (bytes each side of it, and of the overlap itself)
EXCERPT_BYTES = 2048

_FALLBACK_PII = [
    (re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+"), "<EMAIL>"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "<AWS_ACCESS_KEY>"),
    (re.compile(r"\b(?:ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{20,}\b"), "<GITHUB_TOKEN>"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}\b"), "<API_KEY>"),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"), "<SLACK_TOKEN>"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)"), "<PRIVATE_KEY>"),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b"), "<IP_ADDRESS>"),
]


@dataclass
class Redaction:
    """How the excerpts of one report were redacted (recorded in the report)."""

    method: str = "scrub_pii"       # "scrub_pii" | "regex_fallback"
    reason: str | None = None       # why the fallback was used
    names: str | None = None        # person names in the data's excerpts: "ner" | "rules" (no spaCy model)

    def to_dict(self) -> dict:
        return ({"method": self.method} | ({"reason": self.reason} if self.reason else {})
                | ({"names": self.names} if self.names else {}))


def redact(texts: list[str], info: Redaction | None = None, prose: list[bool] | None = None) -> list[str]:
    """Redact `texts` with the pii stage's scrubber; the regex fallback only when it cannot be loaded.

    `prose[i]` (when given) marks the texts whose person names NER looks for too (found in review:
    a chat turn's "this is Margaret Thompson" reached the report, which the stage would have scrubbed).
    `info` (when given) records which method ran. Only an unavailable scrubber
    (ImportError: optional dependency missing; OSError: a model file missing)
    falls back; any other error is a bug and propagates.
    """
    info = info if info is not None else Redaction()
    if not texts:
        return texts
    try:
        from datakit.stages.scrub_pii.stage import ScrubPiiConfig

        names = bool(prose) and any(prose)
        fn = ScrubPiiConfig(ner="auto" if names else "off").build_fn()
        if names:
            info.names = "ner" if fn.person is not None else "rules"
        return [t if t is not None else "" for t in fn.scrub(list(texts), prose)[0]]
    except (ImportError, OSError) as e:
        info.method, info.reason = "regex_fallback", f"PII scrubber unavailable: {type(e).__name__}: {e}"
        log.warning("contamination report: %s; snippets redacted by the regex fallback", info.reason)
        return [regex_redact(t) for t in texts]


def regex_redact(text: str) -> str:
    for rx, rep in _FALLBACK_PII:
        text = rx.sub(rep, text)
    return text


def excerpt(text: str, a: int, b: int, limit: int = EXCERPT_BYTES) -> tuple[str, int, int, int]:
    """The whole lines around byte span [a, b) of `text`, bounded, never starting or ending mid-word.

    Returns (excerpt, start byte, end byte, 1-based line number of its first line).
    """
    raw = text.encode()
    b = min(b, len(raw), a + limit)
    lo = raw.rfind(b"\n", 0, a) + 1
    hi = raw.find(b"\n", b)
    hi = len(raw) if hi < 0 else hi
    if a - lo > limit:  # a very long line: start at a word boundary near the overlap
        lo = _word_start(raw, a - limit, a)
    if hi - b > limit:
        hi = _word_end(raw, b, b + limit)
    line = raw.count(b"\n", 0, lo) + 1
    return raw[lo:hi].decode("utf-8", "replace"), lo, hi, line


def _word_start(raw: bytes, lo: int, a: int) -> int:
    m = re.compile(rb"\s").search(raw, lo, a)
    return m.end() if m else a


def _word_end(raw: bytes, b: int, hi: int) -> int:
    ws = [m.start() for m in re.compile(rb"\s").finditer(raw, b, hi)]
    return ws[-1] if ws else b


def clip(s: str, limit: int = SNIPPET_CHARS) -> str:
    """Clip an already redacted text for display."""
    return s if len(s) <= limit else s[:limit] + "…"
