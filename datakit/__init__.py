"""datakit: AI-code-editor usage logs -> training data for code models.

Public API: `Pipeline` (build/load/run pipelines), `register_stage`/`StageConfig`
(plug in your own stage), `record_texts`/`text_pieces` (the texts of a training record,
as the built-in stages read them: `datakit.stages.texts`), `datakit.loader.PackedDataset`
(trainer-side reader).

Names are imported lazily (PEP 562) so `datakit contamination-check`, which
needs none of the pipeline machinery, starts fast.
"""
from __future__ import annotations

import os
from typing import Any

# polars' own allocator (a jemalloc inside its library) returns freed pages to the OS only after
# 500 ms dirty + 1000 ms "muzzy" (MADV_FREE'd, still counted in RSS) by polars' default, so the
# memory of each barrier query stayed resident through the next one: the dedup stage's peak RSS
# at 20k records was 502-522 MB with polars' defaults, 456-464 MB with 100 ms and no muzzy stage,
# CPU unchanged (3 alternated runs; 0 ms cost +0.3 CPU-s of page faults). It changes no output.
POLARS_ALLOCATOR_CONF = "dirty_decay_ms:100,muzzy_decay_ms:0"
# what polars writes into the variable when it is imported and the user set nothing (polars 1.x-2.x)
_POLARS_OWN_CONF = ("dirty_decay_ms:500,muzzy_decay_ms:1000",
                    "dirty_decay_ms:500,muzzy_decay_ms:1000,thp:always,metadata_thp:always")


def _tune_polars_allocator() -> None:
    """Set `_RJEM_MALLOC_CONF` for polars unless the user set it (any value of theirs wins whole).

    polars appends the variable to its defaults when it is first imported, so this must run
    before that to count in this process. If polars came first (a notebook's `import polars`),
    it has written its bare defaults: ours is appended anyway, for the pool workers and other
    processes started from here (the last value of an option wins in jemalloc).
    """
    import sys

    conf = os.environ.get("_RJEM_MALLOC_CONF")
    if conf is None:
        os.environ["_RJEM_MALLOC_CONF"] = POLARS_ALLOCATOR_CONF
    elif "polars" in sys.modules and conf in _POLARS_OWN_CONF:
        os.environ["_RJEM_MALLOC_CONF"] = f"{conf},{POLARS_ALLOCATOR_CONF}"


_tune_polars_allocator()

__version__ = "0.1.0"
__all__ = ["Pipeline", "PipelineError", "DatakitError", "RunResult", "StageConfig", "CompileContext", "register_stage", "record_texts",
           "text_pieces", "__version__"]

_LAZY = {
    "Pipeline": "datakit.pipeline", "PipelineError": "datakit.pipeline", "RunResult": "datakit.engines.core",
    "DatakitError": "datakit.errors",
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
