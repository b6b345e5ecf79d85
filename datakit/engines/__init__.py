"""Engines execute a `Plan`. `local` needs no JVM; `spark` is imported only when asked for.

Both engines call `engines/core.py` for everything that decides output bytes and counts.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from datakit.errors import DatakitError

# engine -> the options its constructor takes (an unknown option is an error, not silently ignored:
# `wokers=2` would otherwise run with the default worker count)
ENGINE_OPTIONS: dict[str, tuple[str, ...]] = {
    "local": ("workers", "work_dir", "progress", "keep_work"),
    "spark": ("master", "conf", "partitions", "workers", "checkpoint_dir"),
}


class EngineOptionError(DatakitError, ValueError):
    """An engine name or option the engine does not know (a usage error: the CLI exits 2)."""


def check_flag(name: str, value: Any, *, none_ok: bool = False) -> None:
    """A yes/no engine option is a bool (or None where None means "decide for me"), else one line.

    Found in a Python API review: `keep_work="no"` was accepted and, being truthy, kept the run's raw
    spill (text before scrub_pii) under the published dataset's `_work/`; `progress="sure"` too."""
    if isinstance(value, bool) or (none_ok and value is None):
        return
    raise EngineOptionError(f"engine option {name} must be True or False{' or None' if none_ok else ''}, "
                            f"not {type(value).__name__} ({value!r})")


def check_folder(name: str, value: Any) -> str | None:
    """A folder option as a str (a str or os.PathLike; None: unset), else one line (found in a Python API
    review: `work_dir=123` was accepted and failed deep in the run)."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if isinstance(path, str):
            return path
    raise EngineOptionError(f"engine option {name} must be a folder path (str or os.PathLike), "
                            f"not {type(value).__name__} ({value!r})")


def check_mapping(name: str, value: Any) -> dict[str, Any]:
    """A settings option (Spark's `conf`) as a dict with string keys (None: empty), else one line."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise EngineOptionError(f"engine option {name} must be a dict of settings, not {type(value).__name__}")
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise EngineOptionError(f"engine option {name}: setting names must be strings, not "
                                f"{type(bad[0]).__name__} ({bad[0]!r})")
    return dict(value)


def get_engine(name: str = "local", **options: Any):
    """An engine instance by name: `local` (options: workers, work_dir, progress, keep_work) or `spark`
    (options: master, conf, partitions, workers, checkpoint_dir)."""
    if name not in ENGINE_OPTIONS:
        raise EngineOptionError(f"unknown engine {name!r}; choose 'local' or 'spark'")
    unknown = sorted(set(options) - set(ENGINE_OPTIONS[name]))
    if unknown:
        raise EngineOptionError(f"engine {name!r} has no option {', '.join(map(repr, unknown))}; "
                                f"it takes: {', '.join(ENGINE_OPTIONS[name])}")
    if name == "local":
        from datakit.engines.local import LocalEngine as engine_cls
    else:
        from datakit.engines.spark_session import require_pyspark

        require_pyspark()  # before the pipeline compiles: one line, not an ImportError at the first job
        from datakit.engines.spark import SparkEngine as engine_cls  # type: ignore[assignment]
    try:
        from datakit import allocator

        allocator.choice()  # DATAKIT_ALLOCATOR checked before any work, not when the first pool starts
        return engine_cls(**options)
    except EngineOptionError:
        raise
    except ValueError as e:  # a bad option value (partitions 0, a malformed partition setting): one line, exit 2
        raise EngineOptionError(str(e)) from None
