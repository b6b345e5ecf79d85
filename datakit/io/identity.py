"""What a run's output bytes depend on, as hashes: the determinism contract made checkable.

Why one module: every reuse of earlier work (a finished shard, a finished task of a
crashed run, a work folder) and every manifest must agree on what "the same run" is.
Three parts:

* the **config hash** (`Plan.config_hash`): the pipeline config plus its *environment*
  (library versions that shape bytes, digests of every artifact a stage loads, choices
  that depend on the machine such as the spaCy model or the PII scan strategy, and the
  code: `code_digests`, datakit's own files and the modules of custom stages);
* the **input digest**: every file the plan reads, with its size and modification time;
* the **run id**: both, plus each input's change token (`_change_token`) and the output
  path -- names the work folder, so a rerun over other or edited input (`--input`) never
  picks up another run's parts or quarantine rows.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator

from datakit.io.fs import InputError, filesystem
from datakit.io.local_files import LOCAL
from datakit.io.url_secrets import hide_url_secrets

log = logging.getLogger("datakit.identity")

# Libraries whose versions can change output bytes on every pipeline (Parquet writer and its
# `created_by` footer, polars joins, hashing, MinHash). Stage-specific ones (tokenizers, spaCy,
# presidio, hyperscan) are recorded by the stage that uses them.
CORE_LIBRARIES = ("pyarrow", "polars", "numpy", "xxhash", "datasketch", "numba")


def library_version(name: str) -> str | None:
    """The installed distribution version of `name`, or None when it is not installed.

    (importlib.metadata is imported here, not at the top: a pool worker imports this module and
    never asks for a version, and the import costs ~5 ms CPU per process with the email package.)"""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def base_environment() -> dict[str, Any]:
    """The environment every pipeline's bytes depend on (stages add their own sections)."""
    from datakit import __version__

    return {"datakit": __version__,
            "python": ".".join(platform.python_version_tuple()[:2]),  # unicodedata, str hashing of sorts
            "libraries": {n: library_version(n) for n in CORE_LIBRARIES},
            "code": {"datakit": package_digest()}}


@functools.cache
def package_digest() -> str:
    """sha256 over the installed datakit package: every file's path and bytes (compiled caches aside).

    Why not the version string: it said 0.1.0 for hundreds of commits, so a run killed under one
    checkout (or release) resumed under the next with the old code's finished tasks and shards
    (found in review: a changed stage reused 33 tasks of the killed run). 9 ms for the ~150 files.
    """
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        # code and the data files it reads (schemas, suites, tokenizers): what a wheel ships, so a
        # checkout and the wheel built from it agree, and a stray file in a checkout changes nothing
        if "__pycache__" in path.parts or path.suffix not in (".py", ".json") or not path.is_file():
            continue
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def code_digests(objects: Iterable[Any]) -> dict[str, str | None]:
    """{module: sha256 of its source} for the modules outside datakit that define `objects` (custom
    stage configs and their batch functions): what a custom stage computes is part of the run's
    identity, so an edited stage never resumes from the work of the code before it.

    The module's file when it has one; else the class's source (a notebook cell); else the pickled
    class (cloudpickle), whose bytes may differ between processes, which only costs a resume.
    """
    out: dict[str, str | None] = {}
    for obj in objects:
        cls = obj if isinstance(obj, type) or inspect.isroutine(obj) else type(obj)
        name = getattr(cls, "__module__", None) or ""
        if name == "datakit" or name.startswith("datakit.") or name in out or name.split(".")[0] in _STDLIB:
            continue
        out[name] = _source_digest(sys.modules.get(name), cls)
    for name, path in _project_modules(out).items():
        if name not in out:
            with open(path, "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return dict(sorted(out.items()))


# the interpreter's own folders (stdlib, site-packages): code found there is installed, not a project's
INSTALLED_PREFIXES = tuple({os.path.abspath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})


def _project_modules(defining: Iterable[str]) -> dict[str, str]:
    """{module: file} of the project modules the `defining` modules use: the modules their source
    imports and their globals lead to (a function or class imported from one), transitively, when the module's
    file lies in the project folder of a defining module (the folder holding its top-level package or
    file) and is not installed code.

    Why: found in review, a custom stage calling `helper.factor()` from a `helper.py` beside it was
    digested without `helper.py`: after a killed run and an edit of the helper, the rerun reused the
    finished tasks and committed one dataset made by both versions (304 rows of the old factor, 856 of
    the new), and the pipeline hash did not change. Imports are read from each module's source (also those inside a
    function body, and `from helper import LIMIT`, whose value no global leads back to); a module that
    is neither loaded nor a top-level module on the path is not looked for.
    """
    roots: set[str] = set()
    for name in defining:
        path = getattr(sys.modules.get(name), "__file__", None)
        if not path or not os.path.isfile(path):
            continue
        top = os.path.dirname(os.path.abspath(path))
        for _ in range(name.count(".") + (os.path.basename(path) == "__init__.py")):
            top = os.path.dirname(top)  # the folder holding the top-level package
        roots.add(top + os.sep)
    if not roots:
        return {}
    installed = INSTALLED_PREFIXES

    def project_file(name: str) -> str | None:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path is None and name and "." not in name:  # not loaded yet: a top-level module, found without import
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            path = spec.origin if spec is not None and spec.has_location else None
        if not path or not path.endswith(".py") or name == "datakit" or name.startswith("datakit."):
            return None
        path = os.path.abspath(path)
        ok = path.startswith(tuple(roots)) and not path.startswith(installed) and os.path.isfile(path)
        return path if ok else None

    found: dict[str, str] = {}
    todo = list(defining)
    seen = set(todo)
    while todo:
        name = todo.pop()
        module = sys.modules.get(name)
        uses = set(_imported_names(name, found.get(name) or getattr(module, "__file__", None)))
        for value in list(vars(module).values()) if module is not None else []:
            if isinstance(value, type(sys)):
                uses.add(value.__name__)
            elif isinstance(value, type) or inspect.isroutine(value):
                uses.add(getattr(value, "__module__", None) or "")
        for used in sorted(uses):
            if used in seen:
                continue
            seen.add(used)
            path = project_file(used)
            if path is not None:
                found[used] = path
                todo.append(used)
    return found


def _imported_names(module: str, path: str | None) -> Iterator[str]:
    """The module names `path`'s source imports anywhere (relative imports resolved against `module`)."""
    if not path or not path.endswith(".py") or not os.path.isfile(path):
        return
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read())
    except (SyntaxError, ValueError, OSError):
        return
    package = module if os.path.basename(path) == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts):
                    continue
                base = ".".join(parts[:len(parts) - (node.level - 1)] + ([base] if base else []))
            if base:
                yield base
            yield from (f"{base}.{a.name}" if base else a.name for a in node.names if a.name != "*")


_STDLIB = frozenset(sys.stdlib_module_names) | {"builtins"}


def _source_digest(module: Any, cls: Any) -> str | None:
    path = getattr(module, "__file__", None)
    if path and os.path.isfile(path):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    try:
        return hashlib.sha256(inspect.getsource(cls).encode()).hexdigest()
    except (OSError, TypeError):
        pass
    try:
        import cloudpickle

        return hashlib.sha256(cloudpickle.dumps(cls)).hexdigest()
    except Exception:  # noqa: BLE001 - then the run cannot tell an edit of this code
        log.warning("the code of %s.%s cannot be read: a resumed run would not notice an edit of it",
                    cls.__module__, cls.__qualname__)
        return None


# what `executor_environment` compares between the driver and Spark's Python workers: the core
# libraries and those of the stages that shape bytes (tokenizer, NER, PII scan)
PROBED_LIBRARIES = CORE_LIBRARIES + ("tokenizers", "spacy", "hyperscan")


def runtime_versions() -> dict[str, str | None]:
    """This process's datakit version and code digest, and the versions of `PROBED_LIBRARIES`."""
    from datakit import __version__

    return {"datakit": __version__, "datakit code": package_digest(),
            **{n: library_version(n) for n in PROBED_LIBRARIES}}


def input_files(paths: list[str]) -> list[dict[str, Any]]:
    """[{path, size, mtime, changed}] of the files a run reads: the manifest records all but `changed`
    (`manifest_fields`), the run id all of it."""
    out = []
    for url in sorted(set(paths)):
        fs, p = filesystem(url)
        info = fs.info(p)
        out.append({"path": url, "size": info.get("size"), "mtime": _mtime(info), "changed": _change_token(fs, p, info)})
    return out


def _mtime(info: dict[str, Any]) -> str:
    return str(info.get("mtime", info.get("LastModified", info.get("created", ""))))


def stamp(info: dict[str, Any]) -> str:
    """"size|mtime" of a file's `fs.info`: what a task compares with the listing (`listed_stamps`)."""
    return f"{info.get('size')}|{_mtime(info)}"


def content_stamp(fs: Any, path: str, info: dict[str, Any]) -> str:
    """"size|mtime|change token" (`_change_token`: a local file's status-change time, an object's ETag):
    a stamp an edit that keeps the size and restores the modification time still changes."""
    return f"{stamp(info)}|{_change_token(fs, path, info) or ''}"


def same_stamp(then: str, now: str) -> bool:
    """Whether two stamps (`stamp` or `content_stamp`) name the same file version: size and mtime equal,
    and the change tokens too where both have one (an older record has none)."""
    a, b = then.split("|"), now.split("|")
    if a[:2] != b[:2]:
        return False
    return len(a) < 3 or len(b) < 3 or not a[2] or not b[2] or a[2] == b[2]


def listed_stamps(inputs: list[dict[str, Any]]) -> dict[str, str]:
    """{path: "size|mtime"} of `input_files`' listing, for the tasks that read those files."""
    return {i["path"]: stamp(i) for i in inputs}


def check_unchanged(url: str, listed: str | None) -> str:
    """`url`'s "size|mtime" now; an `InputError` if it is gone or differs from `listed` (its stamp in the
    listing the run started from; None: not listed, nothing to compare).

    Why every engine calls this before it reads an input file: the run's identity and manifest name
    the files as listed. A file replaced while the run was going (today's partition still being
    written) was read as it was then, under a manifest naming the old size (found in review: 26443
    rows read, the manifest said the 30090-row file); one deleted meanwhile was a 286-line traceback,
    exit 1. Both are one line, exit 2: rerun to read the input as it is now.
    """
    fs, p = filesystem(url)
    try:
        info = fs.info(p)
    except FileNotFoundError:
        raise InputError(f"input file {url} disappeared during the run (it was there when the run "
                         "started); rerun to read the input as it is now") from None
    now = stamp(info)
    if listed is not None and now != listed:
        raise InputError(f"input file {url} changed during the run (size|mtime {listed} when the "
                         f"run started, {now} now); rerun to read the input as it is now")
    return now


def _change_token(fs: Any, path: str, info: dict[str, Any]) -> str | None:
    """What changes whenever a file's bytes do, beyond size and modification time: a local file's
    status-change time (which `touch -r` or a copy with preserved times cannot set back), an object's
    ETag (its content hash on S3; `LastModified` has one-second resolution).

    Why: a finished task of a killed run is reused by input identity; an input edited to the same
    size with its mtime restored was resumed with the old bytes' results (found in review).
    """
    if fs is LOCAL:
        return str(os.stat(path).st_ctime_ns)
    tag = info.get("ETag") or info.get("etag") or info.get("md5") or info.get("crc32c")
    return str(tag) if tag else None


def _recorded(inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The inputs as the manifest records them: without the change token, which differs between
    copies of the same files (a manifest describes what was read, the same on every machine), and
    with a presigned URL's signature hidden (`url_secrets`)."""
    return [{k: hide_url_secrets(v) if k == "path" and isinstance(v, str) else v for k, v in i.items() if k != "changed"}
            for i in inputs]


def digest(obj: Any) -> str:
    """sha256 of the canonical JSON of `obj`."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def run_id(config_hash: str, inputs: list[dict[str, Any]], output: str | None) -> str:
    """The full identity of a run: config hash + input files (sizes, mtimes) + output path."""
    return digest({"config": config_hash, "inputs": inputs, "output": output})


def manifest_fields(plan: Any, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """What every manifest records about the run's identity (both engines write the same)."""
    recorded = _recorded(inputs)
    return {"pipeline": plan.config, "pipeline_hash": plan.config_hash, "seed": plan.seed,
            "environment": plan.environment, "inputs": recorded, "input_digest": digest(recorded)}
