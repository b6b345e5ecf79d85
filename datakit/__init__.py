"""datakit: AI-code-editor usage logs -> training data for code models.

Public API: `Pipeline` (build/load/run pipelines), `register_stage`/`StageConfig`
(plug in your own stage), `datakit.loader.PackedDataset` (trainer-side reader).
"""
from datakit.pipeline import Pipeline, PipelineError
from datakit.stages.base import CompileContext, StageConfig, register_stage

__version__ = "0.1.0"
__all__ = ["Pipeline", "PipelineError", "StageConfig", "CompileContext", "register_stage", "__version__"]
