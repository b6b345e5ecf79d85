"""What happens to a finding: typed placeholder, keyed pseudonym, or dropping the whole record.

Why these three and these shapes:
- A placeholder replaces only the sensitive span, so code stays valid:
  `password = "hunter2"` becomes `password = "<SECRET>"` (the quotes were not
  part of the span), `/Users/jane/` becomes `/Users/<USER>/`.
- A pseudonym is `<EMAIL_3f9a0c1d2e4b>`: HMAC-SHA256(key, entity, value), so the
  same address maps to the same token across records and shards (a model still
  sees "the same person wrote both"), but the value cannot be recovered
  without the key. It keeps the `<...>` shape so a second scrub never detects
  it again (idempotence). The key comes from an environment variable or a
  secret file, never from the pipeline file, and is never printed.
- Drop removes the record (the default for private keys: a key block cannot be
  made safe by masking a few characters of it), counted as `pii:<entity>`.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from datakit.errors import DatakitError
from datakit.stages.scrub_pii.detectors import BY_ENTITY, Policy
from datakit.stages.scrub_pii.fold import fold_text
from datakit.stages.scrub_pii.scan import Finding

DEFAULT_KEY_ENV = "DATAKIT_PII_KEY"


class PiiKeyError(DatakitError, ValueError):
    """The pseudonym policy was asked for but no key is available (message never contains the key)."""


def load_key(key_env: str = DEFAULT_KEY_ENV, key_file: str | None = None) -> bytes:
    """The HMAC key: the secret file if given, else the environment variable. Clear error otherwise."""
    if key_file:
        p = Path(key_file).expanduser()
        try:
            raw = p.read_bytes().strip()
        except OSError as e:
            raise PiiKeyError(f"scrub_pii: cannot read pseudonym key file {str(p)!r}: {e.strerror}") from None
        if not raw:
            raise PiiKeyError(f"scrub_pii: pseudonym key file {str(p)!r} is empty")
        return raw
    raw_env = os.environ.get(key_env, "")
    if not raw_env.strip():
        raise PiiKeyError(
            f"scrub_pii: the 'pseudonym' policy needs a secret key; set the environment variable "
            f"{key_env} or give `key_file:` (a path to a file holding the key). The key is never "
            f"read from the pipeline file."
        )
    return raw_env.strip().encode()


_DIGITS_OF = {"phone": True, "credit_card": True, "iban": True, "us_ssn": True}


def canonical(entity: str, value: str) -> str:
    """The value a pseudonym is made of: one spelling per address, number or name.

    Why: found in review, `jane.doe@x`, `JANE.DOE@x` and `Jane.Doe@x` got three pseudonyms, as did one
    phone number or card written with spaces, dashes or neither; the same person then looked like
    several. E-mails and names compare case-insensitively (and names by their words); numbers by their
    digits and letters (a leading `+` kept: `+1 415...` and `(415)...` stay apart, as their country
    is not known from the second). Invisible characters and fullwidth forms are read as the view the
    detectors read shows them (`fold.py`): `jane<U+200B>@x.org` is `jane@x.org`."""
    value = fold_text(value)
    if entity == "email":
        return value.strip().lower()
    if entity == "person":
        return " ".join(value.split()).casefold()
    if entity in _DIGITS_OF:
        v = value.strip()
        return ("+" if v.startswith("+") else "") + "".join(c for c in v if c.isalnum()).upper()
    return value


@dataclass(frozen=True)
class Replacer:
    """Applies the per-entity policy to one text's findings. Picklable (ships to workers)."""

    policies: Mapping[str, Policy]
    key: bytes | None = field(default=None, repr=False)  # never in repr/logs

    def __post_init__(self) -> None:
        if self.key is None and "pseudonym" in self.policies.values():
            raise PiiKeyError("scrub_pii: the 'pseudonym' policy needs a key (see load_key)")

    def policy(self, entity: str) -> Policy:
        return self.policies.get(entity, BY_ENTITY[entity].default_policy if entity in BY_ENTITY else "placeholder")

    def token(self, entity: str, value: str) -> str:
        """The replacement text for one span under its entity's policy (drop is handled by the caller)."""
        ph = BY_ENTITY[entity].placeholder if entity in BY_ENTITY else f"<{entity.upper()}>"
        if self.policy(entity) != "pseudonym":
            return ph
        assert self.key is not None
        digest = hmac.new(self.key, f"{entity}\0{canonical(entity, value)}".encode(), hashlib.sha256).hexdigest()[:12]
        return f"{ph[:-1]}_{digest}>"

    def drop_reason(self, findings: Sequence[Finding]) -> str | None:
        """`pii:<entity>` for the first finding whose policy is drop (stable order), else None."""
        drops = sorted({f.entity for f in findings if self.policy(f.entity) == "drop"})
        return f"pii:{drops[0]}" if drops else None

    def apply(self, text: str, findings: Sequence[Finding]) -> str:
        """`text` with every finding replaced (findings are non-overlapping and sorted)."""
        return self.apply_spans(text, findings)[0]

    def apply_spans(self, text: str, findings: Sequence[Finding]) -> tuple[str, list[tuple[int, int]]]:
        """Like `apply`, plus where each replacement token sits in the new text."""
        return apply_tokens(text, findings, self.token)


def apply_tokens(text: str, findings: Sequence[Finding], token: Callable[[str, str], str]
                 ) -> tuple[str, list[tuple[int, int]]]:
    """`text` with every finding (non-overlapping, sorted) replaced by `token(entity, value)`, and where
    each token sits in the new text."""
    if not findings:
        return text, []
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    pos = out = 0
    for f in findings:
        keep = text[pos : f.start]
        tok = token(f.entity, text[f.start : f.end])
        parts += [keep, tok]
        out += len(keep)
        spans.append((out, out + len(tok)))
        out += len(tok)
        pos = f.end
    parts.append(text[pos:])
    return "".join(parts), spans
