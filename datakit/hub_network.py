"""Whether the Hugging Face Hub's host can be reached at all, asked before a download.

Why: huggingface_hub retries a failed request five times with backoff (1+2+4+8+8 s), so on a
machine without network (an air-gapped cluster, a CI job) `datakit evals pull` and a Hub tokenizer
on first use waited 23 s (measured) for an error that a name lookup gives at once. Only the host's
name is looked up, nothing is sent to it: a lookup that fails means no request can succeed, while a
host that resolves may still refuse, which the library's own retries then handle as before. Behind a
proxy (`HTTPS_PROXY`, `ALL_PROXY`, ... set) the proxy resolves names, so nothing is checked here.
"""
from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy")


def hub_endpoint() -> str:
    """The Hub endpoint huggingface_hub uses (`HF_ENDPOINT`, read at its import), else the public one."""
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except ImportError:  # pragma: no cover - huggingface_hub comes with tokenizers
        return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def hub_unreachable() -> str | None:
    """Why no request to the Hub can succeed from here (its host name does not resolve), else None."""
    if any(os.environ.get(v) for v in _PROXY_VARIABLES):
        return None
    url = urlparse(hub_endpoint())
    host = url.hostname
    if not host:
        return None
    try:
        socket.getaddrinfo(host, url.port or (443 if url.scheme == "https" else 80), type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return f"the Hub's host {host} does not resolve: {e.strerror or e}"
    except OSError:  # anything else: let the library try and report
        return None
    return None
