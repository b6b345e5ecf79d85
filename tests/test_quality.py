"""great-expectations suites at stage boundaries: they pass on good data and name what fails on bad data."""
from __future__ import annotations

import json

import pyarrow as pa

from datakit import Pipeline
from datakit.quality import validate_table
from tests.eventgen import make_event, write_jsonl


def test_event_suite_flags_duplicates_and_privacy_mode():
    good = pa.table({"event_id": ["a", "b"], "event_type": ["chat_turn", "agent_step"], "user_id": ["u", "v"],
                     "timestamp": ["2026-11-01T10:00:00.000Z"] * 2, "outcome": [None, "accepted"],
                     "privacy_mode": [False, False]})
    assert validate_table(good, "editor_event.v1").success
    assert validate_table(good, "consented_events").success
    bad = pa.table({"event_id": ["a", "a"], "event_type": ["chat_turn", "dance"], "user_id": ["u", "v"],
                    "timestamp": ["2026-11-01T10:00:00.000Z", "yesterday"], "outcome": [None, None],
                    "privacy_mode": [False, True]})
    r = validate_table(bad, "editor_event.v1")
    assert not r.success
    assert {(f["expectation"], f["column"]) for f in r.failed} == {
        ("expect_column_values_to_be_unique", "event_id"),
        ("expect_column_values_to_be_in_set", "event_type"),
        ("expect_column_values_to_match_regex", "timestamp")}
    assert not validate_table(bad, "consented_events").success


def test_pipeline_output_validation_is_recorded(tmp_path):
    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(10)])
    out = tmp_path / "out"
    res = (Pipeline("q").input(str(tmp_path / "logs")).add({"kind": "ingest"})
           .output(str(out), shards=2, quality=True).run(workers=1))
    assert res.extra["quality"]["success"] is True and res.extra["quality"]["rows"] == 10
    run = json.loads((out / "_run.json").read_text())
    assert run["quality"]["suite"] == "editor_event.v1" and run["quality"]["success"]
