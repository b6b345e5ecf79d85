"""fsspec helpers: one place that turns a path or glob into files on any storage.

Why: a researcher passes `logs/**/*.jsonl.zst`, an operator passes
`s3://bucket/logs/dt=2026-11-*/`; both must mean the same thing to every stage.

A plain local path (no `:` in it) gets `LOCAL` (`local_files.py`): the calls a run's processes
make on their own files, done with `os` and `open`, and anything else handed to fsspec's own
local filesystem. Why: importing fsspec (with asyncio, importlib.metadata and its compression
registry) cost every process ~35 ms CPU (measured after numpy and pyarrow were loaded), and a
pool worker or Spark Python worker that only reads and writes local files needs none of it.
Everything else (object stores, `file://` and chained URLs, globs) goes through fsspec as before.
"""
from __future__ import annotations

import functools
import os
import posixpath
import shutil
from typing import Any, Iterable

from datakit.io import storage
from datakit.io.local_files import LOCAL, LocalFiles, is_plain_local, strip_local


class InputError(Exception):
    """An input path is missing or unreadable. The CLI turns it into exit code 2."""


def filesystem(path: str):
    """(filesystem, path-without-protocol) for any fsspec URL or local path (see the module doc)."""
    if is_plain_local(path):
        return LOCAL, strip_local(path)
    return _fsspec_filesystem(path)


@functools.cache
def _configure_storage() -> None:
    """Once per process, before its first fsspec filesystem: bounded, logged retries of transient
    object-store faults (datakit/io/storage.py)."""
    storage.configure()


def _fsspec_filesystem(path: str):
    from fsspec.core import url_to_fs

    _configure_storage()
    return url_to_fs(path)


def arrow_filesystem(fs) -> Any:
    """What to pass pyarrow as `filesystem=` for a path `filesystem()` returned with `fs`: None for a
    local path (pyarrow's own local filesystem, which is also what it makes of fsspec's), else `fs`."""
    return None if isinstance(fs, LocalFiles) else fs


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
                matched = fs.glob(p)
                _refuse_broken_links(fs, matched)
                found = [f for f in matched if fs.isfile(f)]
            elif fs.isdir(p):
                found = [f for f in fs.find(p) if not _hidden(f, p)]
            elif fs.exists(p):
                found = [p]
            else:
                raise InputError(f"input not found: {raw}")
        except InputError:
            raise
        except FileNotFoundError as e:  # an object store's missing bucket (a missing key is "no match" above)
            why = str(e).splitlines()[0][:200] if str(e) else "not found"
            raise InputError(f"input not found: {raw} ({why})") from None
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


def _refuse_broken_links(fs: Any, matched: list[str]) -> None:
    """A matched local symbolic link whose target is gone is an `InputError` naming it.

    Why: the glob's file filter dropped it like a folder, so a day of logs linked from another disk
    that was not mounted went missing from the run without a word (found in review).
    """
    if fs is not LOCAL:
        return
    broken = [f for f in matched if os.path.islink(f) and not os.path.exists(f)]
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        raise InputError(f"input {broken[0]} is a symbolic link to a missing file ({os.readlink(broken[0])}){more}")


def _hidden(path: str, root: str) -> bool:
    rel = posixpath.relpath(path, root) if path.startswith(root) else path
    return any(part.startswith((".", "_")) for part in rel.split("/"))


def open_file(url: str, mode: str = "rb"):
    """Open a file on any storage (no transparent decompression: readers decide)."""
    if is_plain_local(url):
        return LOCAL.open(strip_local(url), mode)
    import fsspec

    _configure_storage()
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
