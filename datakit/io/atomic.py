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

from datakit.io.fs import InputError, filesystem


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


class DamagedJSONError(InputError, ValueError):
    """A datakit JSON file (a manifest, a run report) that is not JSON any more: one line naming it.

    Why: a truncated top-level manifest made `datakit run` (append mode) and `datakit forget` print an
    84-line traceback and exit 1, which the CLI documents as "a check failed" (found in review). An
    InputError is one line and exit 2 on every command; a ValueError still, for callers that treat a
    damaged file as a missing one (`is_index`)."""


def read_json(url: str) -> Any:
    """The JSON document at `url`; None when there is no such file; `DamagedJSONError` when it is not JSON."""
    fs, p = filesystem(url)
    if not fs.exists(p):
        return None
    try:
        return json.loads(fs.cat_file(p))
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        where = f" ({e.msg} at line {e.lineno} column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        raise DamagedJSONError(f"{url} is damaged: not valid JSON{where}; restore it, or write the dataset "
                               "again into a new folder") from None


def read_json_object(url: str) -> dict[str, Any] | None:
    """`read_json` of a file that must hold one JSON object (a manifest, a run report): None when there is
    no such file; `DamagedJSONError` when it is not JSON or is JSON of another type.

    Why: found in a hostile-input review, a manifest.json holding `[]` (valid JSON, not an object) made
    `inspect`, `validate`, `diff` and `contamination-check` fail with "failed unexpectedly
    (AttributeError) ... this is a bug", exit 3, where invalid JSON was one line, exit 2."""
    fs, p = filesystem(url)
    if not fs.exists(p):
        return None
    body = read_json(url)  # (a file of `null` is damaged, not missing)
    if not isinstance(body, dict):
        raise DamagedJSONError(f"{url} is damaged: {not_an_object(body)}; restore it, or write the dataset "
                               "again into a new folder")
    if url.rstrip("/").endswith("/manifest.json") or url == "manifest.json":
        wrong = manifest_shape_error(body)
        if wrong is not None:
            raise DamagedJSONError(f"{url} is damaged: {wrong}; restore it, or write the dataset again into a new "
                                   "folder")
    return body


# The fields of a manifest (any datakit output: Parquet, packed, an append-mode union, a snapshot) that its
# readers use, by the JSON type each must have when present. Why a table and not schemas/packed_dataset.v1.json:
# a Parquet output's manifest has no schema of its own, and these are exactly the fields whose wrong type made
# readers fail deep inside (below).
_MANIFEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format": str, "format_version": int, "layout": str, "rows": int, "shards": list, "snapshots": list,
    "withdrawn": list, "pipeline": dict, "pipeline_hash": (str, type(None)), "totals": dict, "tokenizer": dict,
    "dataset_files": dict, "inputs": list, "environment": dict, "seq_len": int, "data_prefixes": list,
}
_SHARD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "shard": int, "rows": int, "files": list, "sha256": dict, "bytes": dict, "arrays": dict,
}
_JSON_TYPE = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}


def manifest_shape_error(body: dict[str, Any]) -> str | None:
    """What is wrong with the shape of a manifest's fields its readers use ("shards/0 is a number, not an
    object"), naming the field and never its value; None when they fit.

    Why: found in a hostile-input review, a manifest.json with `"shards": "x"`, `"shards": [1]` or
    `"pipeline": "x"` made `validate`, `diff`, `inspect` and `report` fail with "failed unexpectedly
    (TypeError) ... this is a bug", exit 3, where a manifest that is not JSON is one line, exit 2."""
    def wrong(where: str, value: Any, want: type | tuple[type, ...]) -> str | None:
        wants = want if isinstance(want, tuple) else (want,)
        if isinstance(value, bool) and bool not in wants:  # JSON true is not a number
            return f"{where} is a boolean, not {_JSON_TYPE[wants[0]]}"
        if isinstance(value, wants):
            return None
        return f"{where} is {_JSON_TYPE.get(type(value), 'of another type')}, not {_JSON_TYPE[wants[0]]}"

    for key, want in _MANIFEST_FIELDS.items():
        if key in body and (err := wrong(key, body[key], want)):
            return err
    for group in ("shards", "snapshots", "withdrawn"):
        for i, item in enumerate(body.get(group) or []):
            if not isinstance(item, dict):
                return wrong(f"{group}/{i}", item, dict)
            for key, want in _SHARD_FIELDS.items():
                if key in item and (err := wrong(f"{group}/{i}/{key}", item[key], want)):
                    return err
            if isinstance(item.get("files"), list):
                bad = next((j for j, f in enumerate(item["files"]) if not isinstance(f, str)), None)
                if bad is not None:
                    return wrong(f"{group}/{i}/files/{bad}", item["files"][bad], str)
            if group == "snapshots" and (err := manifest_shape_error({"shards": item.get("shards") or []})):
                return f"{group}/{i}/{err}"
    return None


# what a reader of a run report may raise on a value of the wrong shape (a list where an object belongs)
SHAPE_ERRORS = (TypeError, KeyError, AttributeError, ValueError, IndexError)


def damaged_run_report(url: str, run: Any) -> DamagedJSONError | None:
    """The error for a run report (`_run.json`) that is a JSON object but breaks schemas/run_report.v1.json,
    naming the first field that does (never its value); None when it fits (or jsonschema is not installed).

    Why: found in a hostile-input review, `"stages": "x"` or `"dropped": null` in a `_run.json` made
    `datakit report` and `datakit diff` fail with "failed unexpectedly (TypeError) ... this is a bug",
    exit 3, where a `_run.json` that is not JSON, or not an object, is one line, exit 2. The readers call
    this when rendering fails, so a report an older datakit wrote is read as before while it renders."""
    try:
        import jsonschema
    except ImportError:
        return None
    from datakit.resources import schema_document

    errors = jsonschema.Draft202012Validator(schema_document("run_report.v1")).iter_errors(run)
    first = min(errors, key=lambda e: [str(p) for p in e.absolute_path], default=None)
    if first is None:
        return None
    where = "/".join(str(p) for p in first.absolute_path) or "(the top level)"
    rule = json.dumps(first.validator_value, default=str)
    rule = rule if len(rule) <= 40 else rule[:39] + "…"
    return DamagedJSONError(f"{url} is damaged: {where} breaks run_report.v1 ({first.validator}: {rule}); restore "
                            "it, or write the dataset again into a new folder")


def not_an_object(body: Any) -> str:
    """What a JSON document that should be an object is instead ("not a JSON object (an array)")."""
    kind = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(body), type(body).__name__)
    return f"not a JSON object ({kind})"


def write_json_atomic(url: str, obj) -> None:
    write_bytes_atomic(url, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def write_user_file(path: str, data: bytes) -> None:
    """Write a report to a path the user named on the command line (`--json`, `--html`).

    Why not always `write_bytes_atomic`: its rename replaces whatever is at the path. A CI job
    that passes `--json /dev/stdout`, a FIFO, or a symbolic link to where reports are collected
    got the link or device replaced by a regular file (as root, `/dev/stdout` itself) and the
    report never reached the reader. So: `-` is standard output; a path that is a device, FIFO or
    socket (after following links) is written through; a symbolic link to a file keeps the link
    and the file it points to is replaced atomically; a folder is an error naming it; anything
    else (a new or regular file, an object-store URL) is written atomically as before.
    """
    import stat
    import sys

    if path == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    local = path[len("file://"):] if path.startswith("file://") else None if "://" in path else path
    if local is None:
        write_bytes_atomic(path, data)
        return
    try:
        st = os.stat(local)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"{path} is a folder; give a file name for the report")
    try:
        if st is not None and not stat.S_ISREG(st.st_mode):  # a device, FIFO or socket: written through
            with open(local, "wb") as f:
                f.write(data)
            return
        write_bytes_atomic(os.path.realpath(local) if os.path.islink(local) else local, data)
    except OSError as e:
        if e.errno is None:
            raise
        # the error names the path the user gave, not the temp file beside it
        raise type(e)(e.errno, e.strerror, path) from None
