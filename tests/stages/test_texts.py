"""The public "texts of a record" helper (datakit.stages.texts): both shapes, on one batch."""
from __future__ import annotations

import pyarrow as pa
import pytest

from datakit import record_texts, text_pieces
from datakit.contracts import TRAINING_RECORD_V1
from datakit.stages.texts import text_columns


def _batch() -> pa.RecordBatch:
    rows = [{"doc_id": "a", "segments": [{"text": "x"}, {"text": None}, {"text": "y"}], "chosen": None},
            {"doc_id": "b", "segments": None, "chosen": "c", "rejected": "r"},
            {"doc_id": "c", "segments": [{"text": "z"}]}]
    return pa.RecordBatch.from_pylist(rows, TRAINING_RECORD_V1)


def test_joined_per_record_and_pieces_per_text():
    b = _batch()
    assert record_texts(b).to_pylist() == ["x\n\ny", "\nc\nr", "z"]  # a null segment text counts as empty
    pieces = {p.column: (p.texts.to_pylist(), p.rows.tolist()) for p in text_pieces(b)}
    assert pieces == {"segments": (["x", None, "y", "z"], [0, 0, 0, 2]),
                      "chosen": ([None, "c", None], [0, 1, 2]), "rejected": ([None, "r", None], [0, 1, 2])}
    assert [p.texts.to_pylist() for p in text_pieces(b.slice(1))][0] == ["z"]  # slicing honoured


def test_which_columns():
    assert text_columns(TRAINING_RECORD_V1.names) == ["segments", "chosen", "rejected"]
    assert text_columns(["id", "content", "text"]) == ["text"]  # generic tables: first of text/content/code
    assert text_columns(["id"]) == []
    with pytest.raises(KeyError, match="no column body"):
        text_columns(["id"], ["body"])
