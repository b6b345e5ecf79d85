"""Engines execute a `Plan`. `local` needs no JVM; `spark` is imported only when asked for.

Both engines call `engines/core.py` for everything that decides output bytes and counts.
"""
from __future__ import annotations

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
        from datakit.engines.spark import SparkEngine as engine_cls  # type: ignore[assignment]
    try:
        from datakit import allocator

        allocator.choice()  # DATAKIT_ALLOCATOR checked before any work, not when the first pool starts
        return engine_cls(**options)
    except EngineOptionError:
        raise
    except ValueError as e:  # a bad option value (partitions 0, a malformed partition setting): one line, exit 2
        raise EngineOptionError(str(e)) from None
