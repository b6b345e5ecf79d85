"""Engines execute a `Plan`. `local` needs no JVM; `spark` is imported only when asked for."""
from __future__ import annotations

from typing import Any


def get_engine(name: str = "local", **options: Any):
    """An engine instance by name: `local` (options: workers, work_dir, progress) or `spark`
    (options: master, conf, partitions)."""
    if name == "local":
        from datakit.engines.local import LocalEngine

        allowed = {"workers", "work_dir", "progress", "keep_work"}
        return LocalEngine(**{k: v for k, v in options.items() if k in allowed})
    if name == "spark":
        from datakit.engines.spark import SparkEngine

        return SparkEngine(**options)
    raise ValueError(f"unknown engine {name!r}; choose 'local' or 'spark'")
