"""Pipeline stages: one module or folder per capability (see docs/architecture.md).

The stage API (`StageConfig`, `CompileContext`, `register_stage`, `stage_class`) lives in
`datakit.stages.base` and is reached from here lazily: a pool worker that unpickles a stage's
batch function (e.g. `tokenize/batch.py`) imports this package, and the stage configurations
behind `base` (pydantic models) are the driver's business, not the worker's.
"""
from __future__ import annotations

from typing import Any

__all__ = ["CompileContext", "StageConfig", "register_stage", "stage_class"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from datakit.stages import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
