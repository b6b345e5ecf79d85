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

from datakit.errors import DatakitError
from datakit.io import storage
from datakit.io.local_files import LOCAL, LocalFiles, is_plain_local, strip_local


class InputError(DatakitError):
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
    """Turn a protocol-less path back into a URL for `fs` (local paths stay plain). A path that is a URL
    already stays as it is: HTTP's filesystem keeps the whole URL as its path (found in review: every
    http(s):// input became `http://http://...` and the run crashed)."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local") or "://" in path:
        return path
    return f"{protocol}://{path}"


_GLOB_CHARS = set("*?[")


def url_path(path: str) -> str:
    """The part of `path` whose end is its file name (what a suffix is read from): an http(s) URL
    without its query and fragment, any other path as it is (a local file name may hold a `?`).

    Why: a presigned URL (`.../d.parquet?X-Amz-Signature=...`) ends in its signature, so it matched
    no data suffix, and its `?` made it a glob pattern: `datakit contamination-check --data <presigned
    URL>` said "no input files match" (found in review)."""
    if path[:8].lower().startswith(("http://", "https://")):
        return path.split("#", 1)[0].split("?", 1)[0]
    return path


def names_one_object(path: str) -> bool:
    """Whether `path` is an http(s) URL with a query (a presigned or tokened link): it names one object,
    never a folder, so nothing is looked for under it (`<url>/manifest.json` would land in its query)."""
    return url_path(path) != path.split("#", 1)[0]


def is_glob(path: str) -> bool:
    """Whether `path` is a pattern: `*`, `?` or `[` in it, for an http(s) URL before its query."""
    return any(c in url_path(path) for c in _GLOB_CHARS)


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
        refuse_empty_path(raw)
        fs, p = filesystem(raw)
        try:
            other: list[str] = []  # files there that are not of the kinds asked for (`suffixes`)
            if is_glob(p):
                every = _local_glob(p) if fs is LOCAL else fs.glob(p)
                matched = [f for f in every if _wanted(f, suffixes)]
                if not matched:  # (a glob matches folders too: only files count as "there")
                    other = [f for f in every if fs.isfile(f)]
                _refuse_broken_links(fs, matched)  # (only among the files the input would read)
                found = [f for f in matched if fs.isfile(f)]
            elif fs.isdir(p):
                # (a key ending in "/" is an object store's folder marker, the empty object a console's
                # "Create folder" makes: no data file; found in review, it was recorded as an input read)
                every = [f for f in (_local_find(p) if fs is LOCAL else fs.find(p))
                         if not _hidden(f, p) and not f.endswith("/")]
                found = [f for f in every if _wanted(f, suffixes)]
                other = [] if found else every
                _refuse_broken_links(fs, found)
            elif fs.exists(p):
                found = [p]
                _refuse_broken_links(fs, found)  # a FIFO named on its own blocked forever (found in review)
                if suffixes and not url_path(p).endswith(suffixes):  # named, but not a kind of file read here
                    raise InputError(f"{raw}: not a file type read here (expected "
                                     f"{', '.join(sorted(set(suffixes)))})")
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
            found = [f for f in found if _wanted(f, suffixes)]
        if not found and other:  # found in a hostile-input review: "no input files match" when files did
            raise InputError(f"{raw}: {len(other)} file{'s' * (len(other) != 1)} there, none of a type read here "
                             f"(expected {', '.join(sorted(set(suffixes)))}; first: {url_path(sorted(other)[0])})")
        if not found:
            raise InputError(f"no input files match: {raw}")
        out.update(full_url(fs, f) for f in found)
    return sorted(out)


def _wanted(path: str, suffixes: tuple[str, ...]) -> bool:
    return not suffixes or url_path(path).endswith(suffixes)


def _local_find(root: str, depth: int | None = None) -> list[str]:
    """Every file below the local folder `root` (at most `depth` folders down), through symbolic links to
    folders, each real folder once (a link back up the tree is not followed again).

    Why not fsspec's `find`: it does not enter a linked folder, so `logs/dt=2026-11-02 -> /mnt/disk2/...`
    was left out of a run, and of a contamination check that then said clean, without a word (found in
    review); its glob did not match below one either."""
    out: list[str] = []
    seen: set[str] = set()
    root = root.rstrip("/") or "/"
    inside = os.path.realpath(root).rstrip("/") + "/"
    for folder, subfolders, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            subfolders[:] = []
            continue
        seen.add(real)
        out.extend(f"{folder}/{f}" for f in files)
        if depth is not None and folder[len(root):].count("/") >= depth - 1:
            subfolders[:] = []
            continue
        # a link to a folder of this tree (data/latest -> dt=2026-11-02, a loop back up) is an alias: the
        # folder is listed under its own name only, whichever the walk would meet first (a file's name is
        # part of the run's identity and its locators); sorted, so the walk is the same on every filesystem
        subfolders[:] = sorted(d for d in subfolders if not (os.path.islink(f"{folder}/{d}") and
                                                             (os.path.realpath(f"{folder}/{d}") + "/").startswith(inside)))
    return out


def _local_glob(pattern: str) -> list[str]:
    """The local files `pattern` matches, through symbolic links to folders (see `_local_find`). fsspec's
    rules: `*`, `?` and `[...]` within one path part (dot files included), `**` any number of parts."""
    import fnmatch

    parts = pattern.split("/")
    fixed = next(i for i, part in enumerate(parts) if any(c in part for c in _GLOB_CHARS))
    base = "/".join(parts[:fixed]) or "/"
    pats = parts[fixed:]
    if not os.path.isdir(base):
        return []

    def match(names: list[str], pats: list[str]) -> bool:
        if not pats:
            return not names
        if pats[0] == "**":
            return match(names, pats[1:]) or (bool(names) and match(names[1:], pats))
        return bool(names) and fnmatch.fnmatchcase(names[0], pats[0]) and match(names[1:], pats[1:])

    depth = None if "**" in pats else len(pats)
    prefix = len(base.rstrip("/")) + 1
    return [f for f in _local_find(base, depth) if match(f[prefix:].split("/"), pats)]


def _loops(path: str) -> bool:
    """Whether resolving the link `path` goes round in a loop (ELOOP) rather than ending at nothing
    (found in review: `self.jsonl -> self.jsonl` was "a symbolic link to a missing file")."""
    import errno

    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def _refuse_broken_links(fs: Any, matched: list[str]) -> None:
    """A matched local symbolic link whose target is gone, or a matched device, FIFO or socket, is an
    `InputError` naming it.

    Why: the glob's file filter dropped it like a folder, so a day of logs linked from another disk
    that was not mounted went missing from the run without a word (found in review).
    """
    if fs is not LOCAL:
        return
    broken = [f for f in matched if os.path.islink(f) and not os.path.exists(f)]
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        why = "a loop of symbolic links" if _loops(broken[0]) else "a missing file"
        raise InputError(f"input {broken[0]} is a symbolic link to {why} ({os.readlink(broken[0])}){more}")
    # a device, FIFO or socket (or a link to one): found in review, a link to /dev/zero in an input folder
    # read forever (one endless line), and a FIFO in a glob was left out without a word
    special = [f for f in matched if os.path.exists(f) and not os.path.isfile(f) and not os.path.isdir(f)]
    if special:
        more = f" (and {len(special) - 1} more)" if len(special) > 1 else ""
        raise InputError(f"input {special[0]} is not a regular file (a device, FIFO or socket){more}")


def _hidden(path: str, root: str) -> bool:
    rel = posixpath.relpath(path, root) if path.startswith(root) else path
    return any(part.startswith((".", "_")) for part in rel.split("/"))


def from_cwd(path: str) -> str:
    """A path given by a program or a command line, as its caller means it: a relative local path joined
    to the current folder (a URL and an absolute path unchanged). Paths inside a pipeline file are
    resolved against the file's folder instead (`CompileContext.resolve`).

    Normalized (`.`, `..`, repeated and trailing slashes): found in review, `--output ../out/E` from a
    subfolder and `--output ./out/E/` recorded other paths in the manifest than `--output out/E`, so the
    same run got another pipeline hash and its finished shards and tasks were not reused."""
    refuse_empty_path(path)
    if "://" in path:
        return path
    path = os.path.expanduser(path)
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(os.getcwd(), path))


def refuse_empty_path(path: str) -> None:
    """InputError for an empty path. Why: found in a hostile-input review, `--input ""` (an unset shell
    variable) joined to the current folder read its whole tree (scripts, logs, other datasets), exit 0."""
    if not str(path).strip():
        raise InputError(EMPTY_PATH)


EMPTY_PATH = "an empty path names no file or folder (an unset variable?)"  # (also the pipeline models' word)


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
