"""The human-readable contracts in schemas/ agree with the Arrow schemas the code runs on."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from datakit import contracts

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


def test_editor_event_json_matches_arrow_schema():
    doc = json.loads((SCHEMAS / "editor_event.v1.json").read_text())
    assert set(doc["properties"]) == set(contracts.EDITOR_EVENT_V1.names)
    assert set(doc["x-required-by-type"]) == set(contracts.EVENT_TYPES)
    assert doc["properties"]["messages"]["items"]["properties"]["role"]["enum"] == list(contracts.MESSAGE_ROLES)
    assert [t for t in doc["properties"]["outcome"].get("enum", []) if t is not None] == list(contracts.OUTCOMES)
    for t, fields in doc["x-required-by-type"].items():
        assert set(fields) == set(contracts.REQUIRED_ALWAYS) | set(contracts.REQUIRED_BY_TYPE[t])


def test_every_schema_file_is_valid_json_schema():
    for f in SCHEMAS.glob("*.json"):
        doc = json.loads(f.read_text())
        jsonschema.Draft202012Validator.check_schema(doc)


def test_run_report_schema_accepts_a_real_report(tmp_path):
    from datakit import Pipeline
    from tests.eventgen import make_event, write_jsonl

    write_jsonl(tmp_path / "l" / "a.jsonl", [make_event(i) for i in range(5)] + [b"x"])
    Pipeline("r").input(str(tmp_path / "l")).add({"kind": "ingest"}).output(str(tmp_path / "o")).run(workers=1)
    report = json.loads((tmp_path / "o" / "_run.json").read_text())
    jsonschema.validate(report, json.loads((SCHEMAS / "run_report.v1.json").read_text()))
