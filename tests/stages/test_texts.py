"""The public "texts of a record" helper (datakit.stages.texts): both shapes, on one batch."""
from __future__ import annotations

import pyarrow as pa
import pytest

from datakit import record_texts, text_pieces
from datakit.contracts import TRAINING_RECORD_V1
from datakit.stages.texts import record_documents, text_columns, text_piece, with_texts


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


def test_documents_read_fim_in_file_order_and_write_back_by_piece_index():
    rows = [{"doc_id": "f", "segments": [{"text": "S", "role": "suffix"}, {"text": "P", "role": "prefix"},
                                         {"text": "M", "role": "middle"}]},
            {"doc_id": "t", "segments": [{"text": "q", "role": "user"}, None, {"text": "a", "role": "assistant"}]},
            {"doc_id": "e", "segments": []}]
    b = pa.RecordBatch.from_pylist(rows, TRAINING_RECORD_V1)
    seg = text_piece("segments", b.column("segments"))
    assert seg.texts.to_pylist() == ["S", "P", "M", "q", None, "a"]  # a null segment holds no text
    assert seg.offsets.tolist() == [0, 3, 6, 6] and seg.rows.tolist() == [0, 0, 0, 1, 1, 1]
    docs = record_documents(seg)
    assert docs.texts.to_pylist() == ["PMS", "q\n\n\n\na", None]  # FIM joined with nothing, turns by a blank line
    assert [docs.parts(r) for r in range(3)] == [[1, 2, 0], [3, 4, 5], []]
    assert docs.seps == ["", "\n\n", "\n\n"]  # per row: the FIM record's parts touch
    one = record_documents(text_piece("segments", b.slice(1, 1).column("segments")))
    assert one.order is not None  # three segments: joined, not the fast path
    out = with_texts(b, {"segments": {1: "<P>", 5: "<A>"}, "chosen": {2: "c"}})
    assert [[s and s["text"] for s in r] for r in out.column("segments").to_pylist()] == \
        [["S", "<P>", "M"], ["q", None, "<A>"], []]
    assert out.column("segments").to_pylist()[1][1] is None  # the null segment stays null
    assert out.column("chosen").to_pylist() == [None, None, "c"]
    assert with_texts(b, {"segments": {}}) is b  # nothing to replace, already the contract type: as is


def test_a_null_list_holds_no_text_even_over_values():
    values = pa.StructArray.from_arrays([pa.array(["hidden", "hidden", "seen"])], names=["text"])
    col = pa.ListArray.from_arrays(pa.array([0, 2, 3], pa.int32()), values, mask=pa.array([True, False]))
    piece = text_piece("segments", col)
    assert piece.texts.to_pylist() == ["seen"] and piece.rows.tolist() == [1] and piece.offsets.tolist() == [0, 0, 1]


def test_text_of_chat_messages_structs_and_scalars() -> None:
    """`as_text` (the check's `--text-field` on any Parquet column): found in review, chat messages
    (`list<struct<role, content>>`) failed with "text" and a struct column crashed the check."""
    import pyarrow as pa

    from datakit.stages.texts import as_text, text_piece

    msgs = pa.array([[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "def f(): pass"}], None, []],
                    pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))
    piece = text_piece("messages", msgs)
    assert piece.texts.to_pylist() == ["hi", "def f(): pass"] and piece.roles.to_pylist() == ["user", "assistant"]
    assert piece.offsets.tolist() == [0, 2, 2, 2]
    body = pa.array([{"a": "x = 1", "b": None, "n": 3}, None], pa.struct([("a", pa.string()), ("b", pa.string()),
                                                                         ("n", pa.int64())]))
    assert as_text(body).to_pylist() == ["x = 1\n3", None]
    parts = pa.array([[{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]],
                     pa.list_(pa.struct([("type", pa.string()), ("text", pa.string())])))
    nested = pa.StructArray.from_arrays([parts], names=["content"])  # OpenAI-style multi-part content
    assert as_text(nested).to_pylist() == ["one\ntwo"]
    assert as_text(pa.array([1, None])).to_pylist() == ["1", None]
    assert as_text(pa.array([{"a": None, "b": None}, {"a": "y", "b": None}, {"a": None, "b": None}],
                            pa.struct([("a", pa.string()), ("b", pa.string())]))).to_pylist() == [None, "y", None]
    with pytest.raises(TypeError, match="'tags'"):
        as_text(pa.array([{"k": 1}], pa.map_(pa.string(), pa.int64())), "tags")
