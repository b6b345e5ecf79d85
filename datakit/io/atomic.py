"""Atomic file commit on any fsspec storage: write under a temp name, then rename.

Why: a trainer (or a resumed job) must never see a half-written shard. On a local
disk the rename is atomic; on object stores a put of the finished object is.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

from datakit.io.fs import filesystem


def sha256_file(url: str, chunk: int = 1 << 22) -> str:
    fs, p = filesystem(url)
    h = hashlib.sha256()
    with fs.open(p, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


@contextmanager
def atomic_path(url: str) -> Iterator[str]:
    """Yield a temp URL beside `url`; on success rename it to `url`, on error delete it."""
    fs, p = filesystem(url)
    parent, name = p.rsplit("/", 1) if "/" in p else ("", p)
    tmp = f"{parent}/.tmp-{name}-{uuid.uuid4().hex[:8]}" if parent else f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    if parent:
        fs.makedirs(parent, exist_ok=True)
    proto = url.split("://", 1)[0] + "://" if "://" in url else ""
    try:
        yield proto + tmp
        if proto in ("", "file://"):
            os.replace(tmp, p)
        else:
            fs.mv(tmp, p)
    except BaseException:
        try:
            if fs.exists(tmp):
                fs.rm(tmp)
        finally:
            raise


def write_bytes_atomic(url: str, data: bytes) -> None:
    with atomic_path(url) as tmp:
        fs, p = filesystem(tmp)
        with fs.open(p, "wb") as f:
            f.write(data)


def read_json(url: str) -> Any:
    """The JSON document at `url`; None when there is no such file."""
    fs, p = filesystem(url)
    return json.loads(fs.cat_file(p)) if fs.exists(p) else None


def write_json_atomic(url: str, obj) -> None:
    write_bytes_atomic(url, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())
