"""The local filesystem as `datakit.io.fs.filesystem()` hands it out for plain local paths, without fsspec.

Why a class of our own: every pool worker (and Spark Python worker) imported fsspec only to
open, stat, move and remove its own local files, ~35 ms CPU per process (see `datakit.io.fs`).
This answers the calls datakit makes on local files in a run with `os`, `shutil` and `open`,
with fsspec's `LocalFileSystem` semantics (paths made absolute the same way, `info()` with the
same fields, binary files opened the same way), and hands any other call to a real
`LocalFileSystem`, imported on first use. `tests/test_local_files.py` holds it to fsspec's.
"""
from __future__ import annotations

import os
import shutil
import stat
from typing import Any


def is_plain_local(path: Any) -> bool:
    """A local path with no protocol, no chain and no colon at all (anything with a colon goes to fsspec,
    which knows `file://`, `local:`, `simplecache::` and the rest)."""
    path = os.fspath(path) if isinstance(path, os.PathLike) else path
    return isinstance(path, str) and ":" not in path


def strip_local(path: Any) -> str:
    """fsspec's `LocalFileSystem._strip_protocol` for a plain local path (POSIX): absolute, `~` expanded,
    no trailing slash (the root stays `/`). No normalisation beyond that, exactly as fsspec."""
    path = os.fspath(path)
    if not path.startswith("/"):
        if path.startswith("~"):
            path = os.path.expanduser(path)
        else:
            if path.startswith("./"):
                path = path[2:]
            elif path == ".":
                path = ""
            path = f"{os.getcwd()}/{path}"
    return path.rstrip("/") or "/"


_BINARY_MODES = frozenset({"rb", "wb", "ab", "xb"})


class LocalFiles:
    """The local filesystem with the fsspec `LocalFileSystem` calls datakit makes (see module doc)."""

    protocol = ("file", "local")
    root_marker = "/"
    _fsspec: Any = None

    def _path(self, path: Any) -> str:
        return strip_local(path) if is_plain_local(path) else self._delegate()._strip_protocol(path)

    def _delegate(self):
        if LocalFiles._fsspec is None:
            from fsspec.implementations.local import LocalFileSystem

            LocalFiles._fsspec = LocalFileSystem()
        return LocalFiles._fsspec

    def __getattr__(self, name: str) -> Any:
        # any call not answered here: fsspec's own local filesystem (same paths, same results)
        return getattr(self._delegate(), name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalFiles)

    def __hash__(self) -> int:
        return hash(LocalFiles)

    def __reduce__(self):
        return (_local, ())

    def open(self, path: Any, mode: str = "rb", **kwargs: Any):
        if mode not in _BINARY_MODES or kwargs:
            return self._delegate().open(path, mode, **kwargs)
        return open(self._path(path), mode)

    def exists(self, path: Any, **kwargs: Any) -> bool:
        try:
            self.info(path)
            return True
        except Exception:  # noqa: BLE001 - fsspec's exists(): any failure to stat means "not there"
            return False

    def isfile(self, path: Any) -> bool:
        return os.path.isfile(self._path(path))

    def isdir(self, path: Any) -> bool:
        return os.path.isdir(self._path(path))

    def info(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        if isinstance(path, os.DirEntry):
            return self._delegate().info(path, **kwargs)
        path = self._path(path)
        out = os.stat(path, follow_symlinks=False)
        link = stat.S_ISLNK(out.st_mode)
        if link:
            out = os.stat(path, follow_symlinks=True)
        kind = "directory" if stat.S_ISDIR(out.st_mode) else "file" if stat.S_ISREG(out.st_mode) else "other"
        result = {"name": path, "size": out.st_size, "type": kind,
                  "created": getattr(out, "st_birthtime", out.st_ctime), "islink": link}
        for field in ("mode", "uid", "gid", "mtime", "ino", "nlink"):
            result[field] = getattr(out, f"st_{field}")
        if link:
            result["destination"] = os.readlink(path)
        return result

    def size(self, path: Any) -> int:
        return self.info(path)["size"]

    def cat_file(self, path: Any, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        if start is not None or end is not None or kwargs:
            return self._delegate().cat_file(path, start=start, end=end, **kwargs)
        with open(self._path(path), "rb") as f:
            return f.read()

    def pipe_file(self, path: Any, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        if mode != "overwrite" or kwargs:
            return self._delegate().pipe_file(path, value, mode=mode, **kwargs)
        with open(self._path(path), "wb") as f:
            f.write(value)

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        os.makedirs(self._path(path), exist_ok=exist_ok)

    def mv(self, path1: Any, path2: Any, recursive: bool = True, **kwargs: Any) -> None:
        shutil.move(self._path(path1), self._path(path2))

    def rm_file(self, path: Any) -> None:
        os.remove(self._path(path))

    def invalidate_cache(self, path: Any = None) -> None:
        """Nothing is cached for local files (fsspec's local filesystem keeps no listings either)."""


def _local() -> LocalFiles:
    return LOCAL


LOCAL = LocalFiles()
