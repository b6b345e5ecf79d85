"""Typed stage I/O (issue #13 item 3): a stage declares the columns it reads and writes; the compiler
checks reads against what the source and earlier stages write, and writes against the stage's output."""
from __future__ import annotations

from typing import Literal

import pyarrow as pa
import pytest

from datakit import CompileContext, Pipeline, StageConfig, register_stage
from datakit.contracts import TRAINING_RECORD_V1
from datakit.pipeline import PipelineError
from datakit.stages.base import stage_class

SCORED = pa.schema(list(TRAINING_RECORD_V1) + [("score", pa.float64())])


class _Score:
    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.append_column("score", pa.array([1.0] * batch.num_rows))


@register_stage
class AddScore(StageConfig):
    kind: Literal["test_add_score"] = "test_add_score"
    writes = ("score",)
    lie: bool = False  # declare `score` but do not add it

    def compile(self, rel, ctx: CompileContext):
        if self.lie:
            return rel
        return rel.map_batches(_Score(), SCORED, name="test_add_score")


@register_stage
class KeepScored(StageConfig):
    kind: Literal["test_keep_scored"] = "test_keep_scored"
    reads = ("score",)

    def compile(self, rel, ctx: CompileContext):
        return rel


def _pipe(tmp_path, *stages) -> Pipeline:
    p = Pipeline("cols").input(str(tmp_path / "none.jsonl")).add({"kind": "ingest"}).add({"kind": "extract"})
    for s in stages:
        p.add(s)
    return p


@pytest.fixture
def empty_input(tmp_path):
    (tmp_path / "none.jsonl").write_text("")


def test_reading_a_column_nobody_writes_fails_compile_in_one_line(tmp_path, empty_input):
    with pytest.raises(PipelineError) as e:
        _pipe(tmp_path, {"kind": "test_keep_scored"}).compile()
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("cols: stage 3 (test_keep_scored): reads column 'score', but nothing before it writes")


def test_a_column_written_upstream_satisfies_the_read(tmp_path, empty_input):
    plan = _pipe(tmp_path, {"kind": "test_add_score"}, {"kind": "test_keep_scored"}).compile()
    assert "score" in plan.root.schema.names


def test_a_declared_write_the_output_lacks_fails(tmp_path, empty_input):
    with pytest.raises(PipelineError, match=r"stage 3 \(test_add_score\): declares it writes column 'score', "
                                            r"but its output has no such column"):
        _pipe(tmp_path, {"kind": "test_add_score", "lie": True}).compile()


def test_a_field_that_names_a_column_is_a_read(tmp_path, empty_input):
    with pytest.raises(PipelineError, match=r"stage 3 \(dedup\): reads column 'body'"):
        _pipe(tmp_path, {"kind": "dedup", "text_column": "body"}).compile()


@pytest.mark.parametrize("kind", ["ingest", "consent", "forget", "extract", "scrub_pii", "dedup", "decontaminate",
                                  "tokenize", "kto"])
def test_built_in_stages_declare_their_columns(kind):
    cls = stage_class(kind)
    assert cls.reads, f"{kind} declares no columns it reads"
