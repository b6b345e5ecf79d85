"""What a run's output bytes depend on, as hashes: the determinism contract made checkable.

Why one module: every reuse of earlier work (a finished shard, a finished task of a
crashed run, a work folder) and every manifest must agree on what "the same run" is.
Three parts:

* the **config hash** (`Plan.config_hash`): the pipeline config plus its *environment*
  (library versions that shape bytes, digests of every artifact a stage loads, choices
  that depend on the machine such as the spaCy model or the PII scan strategy);
* the **input digest**: every file the plan reads, with its size and modification time;
* the **run id**: both, plus the output path -- names the work folder, so a rerun over
  other input (`--input`) never picks up another run's parts or quarantine rows.
"""
from __future__ import annotations

import hashlib
import json
import platform
from typing import Any

from datakit.io.fs import filesystem

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
            "libraries": {n: library_version(n) for n in CORE_LIBRARIES}}


def input_files(paths: list[str]) -> list[dict[str, Any]]:
    """[{path, size, mtime}] of the files a run reads (what the manifest records as its input)."""
    out = []
    for url in sorted(set(paths)):
        fs, p = filesystem(url)
        info = fs.info(p)
        mtime = info.get("mtime", info.get("LastModified", info.get("created", "")))
        out.append({"path": url, "size": info.get("size"), "mtime": str(mtime)})
    return out


def digest(obj: Any) -> str:
    """sha256 of the canonical JSON of `obj`."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def run_id(config_hash: str, inputs: list[dict[str, Any]], output: str | None) -> str:
    """The full identity of a run: config hash + input files (sizes, mtimes) + output path."""
    return digest({"config": config_hash, "inputs": inputs, "output": output})


def manifest_fields(plan: Any, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """What every manifest records about the run's identity (both engines write the same)."""
    return {"pipeline": plan.config, "pipeline_hash": plan.config_hash, "seed": plan.seed,
            "environment": plan.environment, "inputs": inputs, "input_digest": digest(inputs)}
