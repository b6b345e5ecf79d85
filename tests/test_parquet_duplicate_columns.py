"""Two Parquet columns of one name are judged like a JSON key given twice: by their values *as JSON*.

Found in review: the reader compared the cells with Python's `!=`, for which `0 == False` and
`5 == 5.0`, so a row with an int64 `privacy_mode` column 0 then a bool `privacy_mode` false was a kept
event (and in the other column order `wrong_type`), while the same JSON Lines line is `duplicate_key`,
as the README promises for both formats.
"""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit.io.readers import iter_parquet_rows
from datakit.stages.ingest import InvalidEvent, parse_line

EVENT = {"event_id": "e1", "event_type": "tab_completion", "timestamp": "2026-11-01T12:00:00Z", "user_id": "u1",
         "org_id": "o1", "session_id": "s1", "file": {"path": "a.py", "language": "python"},
         "context": {"prefix": "def f():\n", "suffix": "\n"}, "suggestion": "    return 1", "outcome": "rejected"}


def _json_reason(name, first, second) -> str | None:
    text = json.dumps({**EVENT, name: first})[:-1] + f', "{name}": {json.dumps(second)}}}'
    try:
        parse_line(text.encode())
    except InvalidEvent as e:
        return e.reason
    return None


def _parquet_error(tmp_path, name, first: pa.Array, second: pa.Array) -> str | None:
    base = pa.Table.from_pylist([{k: v for k, v in EVENT.items()}])
    if name != "privacy_mode":
        base = base.append_column("privacy_mode", pa.array([False]))
    t = base.append_column(name, first).append_column(name, second)
    path = tmp_path / "events.parquet"
    pq.write_table(t, path)
    (batch,) = list(iter_parquet_rows(str(path)))
    return batch.column("_read_error")[0].as_py()


@pytest.mark.parametrize("name,first,second,equal", [
    ("privacy_mode", pa.array([0], pa.int64()), pa.array([False]), False),
    ("privacy_mode", pa.array([False]), pa.array([0], pa.int64()), False),
    ("privacy_mode", pa.array([1], pa.int64()), pa.array([True]), False),
    ("latency_ms", pa.array([5.0]), pa.array([5], pa.int64()), False),
    ("latency_ms", pa.array([5], pa.int64()), pa.array([5], pa.int32()), True),  # the same JSON: harmless
    ("privacy_mode", pa.array([False]), pa.array([False]), True),
])
def test_two_columns_of_one_name_are_compared_as_json(tmp_path, name, first, second, equal):
    err = _parquet_error(tmp_path, name, first, second)
    json_reason = _json_reason(name, first[0].as_py(), second[0].as_py())
    if equal:
        assert err is None
    else:
        assert err == f"duplicate_key: {name}"
        assert json_reason == "duplicate_key"  # the JSON Lines rule it now agrees with
