"""Credentials inside URLs: the query parameters of a presigned or token URL, hidden wherever a URL is shown.

Why: an input may be an `https://` URL signed for reading (S3 and GCS presigned URLs, an Azure SAS, a
CloudFront signed URL, a `?token=` link). Its signature is a credential until it expires, and it was
recorded verbatim in the manifest, in `_run.json`'s pipeline, in quarantined rows' `source_file`, and
in log and error lines (found in review). The redaction keeps the URL's shape and every other
parameter (a `versionId` still tells two objects apart) and replaces only the secret values, so the
same object read through two signings of it is recorded the same way.
"""
from __future__ import annotations

import re

# Parameter names whose value grants access (matched without regard to case): AWS SigV4/V2 presigning,
# GCS V4/V2 signed URLs, Azure SAS, CloudFront signed URLs, and the generic token/key parameters.
SECRET_PARAMETERS = (
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "awsaccesskeyid", "signature",
    "x-goog-signature", "x-goog-credential", "googleaccessid",
    "sig",
    "key-pair-id", "policy",
    "token", "access_token", "id_token", "refresh_token", "api_key", "apikey", "api-key", "key",
    "password", "passwd", "secret", "client_secret", "auth", "authorization", "credential", "credentials",
)
HIDDEN = "..."  # (the log scrubber takes "...", unlike "<hidden>", for an elided value, not a secret)
_PATTERN = re.compile(r"([?&](?:" + "|".join(re.escape(p) for p in SECRET_PARAMETERS) + r")=)[^&#\s\"'<>]+",
                      re.IGNORECASE)


def hide_url_secrets(text: str) -> str:
    """`text` (a URL, or a line that holds some) with the value of every secret query parameter hidden."""
    if "=" not in text:
        return text
    return _PATTERN.sub(lambda m: m.group(1) + HIDDEN, text)


_HIDDEN_VALUE = re.compile(r"[?&](?:" + "|".join(re.escape(p) for p in SECRET_PARAMETERS) + r")="
                           + re.escape(HIDDEN) + r"(?:[&#]|$)", re.IGNORECASE)


def has_hidden_secret(url: str) -> bool:
    """Whether `url` is one `hide_url_secrets` shortened: a record of a signed URL, which no longer reads
    anything (an index built from it cannot be compared with its data later: the link is not kept)."""
    return bool(_HIDDEN_VALUE.search(url))
