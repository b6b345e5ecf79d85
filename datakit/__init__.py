"""datakit: AI-code-editor usage logs -> training data for code models.

Public API: `Pipeline` (build/load/run pipelines), `register_stage`/`StageConfig`
(plug in your own stage), `record_texts`/`text_pieces` (the texts of a training record,
as the built-in stages read them: `datakit.stages.texts`), `datakit.loader.PackedDataset`
(trainer-side reader).

Names are imported lazily (PEP 562) so `datakit contamination-check`, which
needs none of the pipeline machinery, starts fast.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Pipeline", "PipelineError", "StageConfig", "CompileContext", "register_stage", "record_texts",
           "text_pieces", "__version__"]

_LAZY = {
    "Pipeline": "datakit.pipeline", "PipelineError": "datakit.pipeline",
    "StageConfig": "datakit.stages.base", "CompileContext": "datakit.stages.base",
    "register_stage": "datakit.stages.base",
    "record_texts": "datakit.stages.texts", "text_pieces": "datakit.stages.texts",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'datakit' has no attribute {name!r}")
