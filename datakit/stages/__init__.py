"""Pipeline stages: one module or folder per capability (see docs/architecture.md)."""
from datakit.stages.base import CompileContext, StageConfig, register_stage, stage_class

__all__ = ["CompileContext", "StageConfig", "register_stage", "stage_class"]
