"""Compiled hyperscan databases of the scanner's prefilters, kept on disk between processes.

Why: every process that scans (the driver's log redaction, each local pool worker, each Spark
Python worker) compiled the same three pattern sets before its first batch: 0.36 CPU-s per
process (0.22 + 0.13 + 0.01 s for the 27-, 24- and 2-pattern sets of a quickstart run), against
~0.1 ms to load a serialized database. The first process on a machine compiles and stores the
bytes; later ones load them.

What the bytes depend on, all in the file's key: the patterns, their flags and the mode, the
hyperscan binding's version (it bundles the library), and the CPU (machine type and the kernel's
CPU flags: the library compiles for the host's instruction set and refuses a database built for
features the host lacks). The file holds a SHA-256 of the database after a magic header; a file
that fails that check, does not load, or cannot be read or written is ignored and the set is
compiled as before -- the cache can make a scan faster, never different: a database's matches
are a function of its patterns alone.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
from typing import Any, Sequence

from datakit.io import cache

log = logging.getLogger("datakit.scrub_pii")

MAGIC = b"datakit-hs-db-1\n"


@functools.lru_cache(maxsize=1)
def _host() -> dict[str, str]:
    """What a database depends on besides its patterns: the library version, the machine type and
    the kernel's list of the CPU's features (Linux; empty elsewhere). Read once per process."""
    from datakit.io.identity import library_version

    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((line.split(":", 1)[1].strip() for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return {"hyperscan": library_version("hyperscan"), "machine": platform.machine(),
            "cpu": hashlib.sha256(flags.encode()).hexdigest()}


def cache_key(patterns: Sequence[bytes], flags: Sequence[int], mode: int) -> str:
    what = {"patterns": [p.decode("utf-8", "surrogateescape") for p in patterns], "flags": list(flags), "mode": mode,
            **_host()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def path_of(key: str) -> str:
    return os.path.join(cache.root(), "hyperscan", f"{key}.db")


def load(key: str) -> bytes | None:
    """The serialized database stored under `key`, when present and intact."""
    try:
        with open(path_of(key), "rb") as f:
            data = f.read()
    except OSError:
        return None
    head, digest, body = data[:len(MAGIC)], data[len(MAGIC):len(MAGIC) + 32], data[len(MAGIC) + 32:]
    if head != MAGIC or hashlib.sha256(body).digest() != digest:
        log.debug("ignoring a damaged hyperscan database in the cache (%s)", path_of(key))
        return None
    return body


def store(key: str, body: bytes) -> None:
    """Write `body` under `key` atomically (a reader sees the old file, the new one or none); a cache
    folder that cannot be written is skipped."""
    from datakit.io.atomic import write_bytes_atomic

    try:
        write_bytes_atomic(path_of(key), MAGIC + hashlib.sha256(body).digest() + body)
    except OSError as e:
        log.debug("hyperscan database not cached (%s)", type(e).__name__)


def compiled(patterns: Sequence[bytes], flags: Sequence[int], mode: int) -> Any:
    """A hyperscan database of `patterns` ready to scan: loaded from the cache, else compiled (and stored)."""
    import hyperscan

    key = cache_key(patterns, flags, mode)
    body = load(key)
    if body is not None:
        try:
            db = hyperscan.loadb(body, mode)
            db.scratch = hyperscan.Scratch(db)  # a loaded database has none; a compiled one makes its own
            return db
        except Exception as e:  # built for another CPU or library: compile as if nothing were cached
            log.debug("cached hyperscan database not loaded (%s); compiling", type(e).__name__)
    db = hyperscan.Database(mode=mode)
    db.compile(expressions=list(patterns), ids=list(range(len(patterns))), elements=len(patterns), flags=list(flags))
    try:
        store(key, hyperscan.dumpb(db))
    except Exception as e:  # the scan does not depend on the cache
        log.debug("hyperscan database not serialized (%s)", type(e).__name__)
    return db
