"""fsspec helpers: one place that turns a path or glob into files on any storage.

Why: a researcher passes `logs/**/*.jsonl.zst`, an operator passes
`s3://bucket/logs/dt=2026-11-*/`; both must mean the same thing to every stage.
"""
from __future__ import annotations

import posixpath
import shutil
from typing import Iterable

import fsspec
from fsspec.core import url_to_fs

from datakit.io import storage

storage.configure()  # bounded, logged retries of transient object-store faults (datakit/io/storage.py)


class InputError(Exception):
    """An input path is missing or unreadable. The CLI turns it into exit code 2."""


def filesystem(path: str):
    """(filesystem, path-without-protocol) for any fsspec URL or local path."""
    fs, p = url_to_fs(path)
    return fs, p


def full_url(fs, path: str) -> str:
    """Turn a protocol-less path back into a URL for `fs` (local paths stay plain)."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        return path
    return f"{protocol}://{path}"


_GLOB_CHARS = set("*?[")


def expand(paths: str | Iterable[str], suffixes: tuple[str, ...] = ()) -> list[str]:
    """Expand paths/globs/folders into a sorted, de-duplicated list of file URLs.

    A folder means every file below it (hidden and `_`-prefixed files such as
    `_SUCCESS` skipped). A pattern that matches nothing is an `InputError`
    naming it: an empty input is almost always a typo, never a silent success.
    """
    if isinstance(paths, str):
        paths = [paths]
    out: set[str] = set()
    for raw in paths:
        fs, p = filesystem(raw)
        try:
            if any(c in p for c in _GLOB_CHARS):
                found = [f for f in fs.glob(p) if fs.isfile(f)]
            elif fs.isdir(p):
                found = [f for f in fs.find(p) if not _hidden(f, p)]
            elif fs.exists(p):
                found = [p]
            else:
                raise InputError(f"input not found: {raw}")
        except InputError:
            raise
        except Exception as e:
            if storage.is_storage_error(e):
                raise storage.describe(e, raw, "list") from None
            raise
        if suffixes:
            found = [f for f in found if f.endswith(suffixes)]
        if not found:
            raise InputError(f"no input files match: {raw}")
        out.update(full_url(fs, f) for f in found)
    return sorted(out)


def _hidden(path: str, root: str) -> bool:
    rel = posixpath.relpath(path, root) if path.startswith(root) else path
    return any(part.startswith((".", "_")) for part in rel.split("/"))


def open_file(url: str, mode: str = "rb"):
    """Open a file on any storage (no transparent decompression: readers decide)."""
    return fsspec.open(url, mode).open()


def remove_tree(url: str) -> None:
    """Remove a folder and everything in it, locally or on an object store; quietly (a missing or
    unremovable folder is left as it is: callers clean up scratch space, whose loss breaks nothing)."""
    if "://" not in url or url.startswith("file://"):
        shutil.rmtree(url.removeprefix("file://"), ignore_errors=True)
        return
    fs, p = filesystem(url)
    try:
        if fs.exists(p):
            fs.rm(p, recursive=True)
    except (OSError, FileNotFoundError):
        pass
