"""Your own stage, in a script or named from a pipeline file (no change to datakit needed).

Run:  .venv/bin/python examples/custom_stage.py  (after `make demo` made demo/logs)
or:   PYTHONPATH=examples datakit run examples/custom_stage.yaml  (`kind: custom_stage:DropLongCode`)
"""
from __future__ import annotations

from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from datakit import CompileContext, Pipeline, StageConfig, record_texts, register_stage
from datakit.contracts import TRAINING_RECORD_V1


class _DropLongCode:
    """Row-local and picklable: the same object runs in local worker processes and on Spark executors."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        # a record's text as dedup sees it: segments, then chosen/rejected (datakit.stages.texts)
        too_long = pc.greater(pc.utf8_length(record_texts(batch)), self.max_chars)
        # never filter rows away silently: name the reason, the engine counts it in _run.json
        reason = pc.if_else(too_long, pa.scalar("too_long"), pa.scalar(None, pa.string()))
        return batch.append_column("_drop", reason)


@register_stage
class DropLongCode(StageConfig):
    """Drop training records whose text is longer than `max_chars`."""

    kind: Literal["drop_long"] = "drop_long"
    max_chars: int = 20_000

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(_DropLongCode(self.max_chars), TRAINING_RECORD_V1, name="drop_long",
                               drop_log_key="doc_id")


if __name__ == "__main__":
    result = (Pipeline("custom", seed=0)
              .input("demo/logs/dt=*/part-*.jsonl.zst")
              .add({"kind": "ingest"})
              .add({"kind": "extract", "kinds": ["code"]})
              .add(DropLongCode(max_chars=5_000))
              .output("demo/custom-out", shards=2)
              .run(engine="local", workers=1))
    for stage in result.stages:
        print(stage["name"], stage["rows_in"], "->", stage["rows_out"], stage["dropped"])
