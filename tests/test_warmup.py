"""`datakit warmup` says nothing about a pipeline the user never wrote.

Found in a review of the installed wheel: `datakit warmup` (the documented step after `pip install` and
before `venv-pack`) printed `WARNING datakit.pipeline: warmup: stage 4 (decontaminate): drops records
after stage 3 (dedup) ...; put decontaminate before dedup`, a lint of its own internal pipeline."""
from __future__ import annotations

import logging

from datakit import synth
from datakit.cli.warmup import warmup_pipeline


def test_the_warmup_pipeline_compiles_without_a_warning(tmp_path, caplog):
    synth.generate(str(tmp_path / "logs"), events=30, seed=0)
    pipeline = warmup_pipeline(tmp_path)
    with caplog.at_level(logging.WARNING):
        pipeline.compile()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    # it still declares every stage with kernels (dedup's MinHash/LSH, decontamination) and the index
    kinds = [s.kind for s in pipeline.config.stages]
    assert {"dedup", "decontaminate"} <= set(kinds) and pipeline.config.output.index
