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


def _pipeline_files() -> list[Path]:
    root = Path(__file__).resolve().parents[1]
    return sorted(root.glob("pipelines/*.yaml")) + sorted(root.glob("examples/*.yaml"))


def test_pipeline_schema_accepts_every_shipped_pipeline_and_what_to_yaml_writes(tmp_path, monkeypatch):
    """`schemas/pipeline.v1.json` is the contract `datakit run --help` points to; it refused the shipped
    feedback pipeline (`kto`), the custom-stage example (`module:Class`) and every file `to_yaml`
    writes (`key: null`) -- found in review."""
    import yaml

    from datakit.pipeline import Pipeline

    schema = json.loads((SCHEMAS / "pipeline.v1.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    files = _pipeline_files()
    assert any(f.name == "feedback.yaml" for f in files) and any(f.name == "custom_stage.yaml" for f in files)
    monkeypatch.syspath_prepend(str(files[-1].parent))  # examples/: the custom stage's module
    for f in files:
        assert not [e.message for e in validator.iter_errors(yaml.safe_load(f.read_text()))], f
        saved = tmp_path / f.name
        Pipeline.from_yaml(f).to_yaml(saved)
        assert not [e.message for e in validator.iter_errors(yaml.safe_load(saved.read_text()))], saved


def test_pipeline_schema_names_every_built_in_stage_kind():
    from datakit.stages.base import BUILTIN_STAGE_MODULES

    schema = json.loads((SCHEMAS / "pipeline.v1.json").read_text())
    kind = schema["properties"]["stages"]["items"]["properties"]["kind"]
    assert sorted(kind["anyOf"][0]["enum"]) == sorted(BUILTIN_STAGE_MODULES)
    validator = jsonschema.Draft202012Validator(schema)
    base = {"input": {"path": "x"}}
    for ok in ("dedup", "my_pkg.stages:DropLong", "registered_kind"):
        assert validator.is_valid({**base, "stages": [{"kind": ok}]}), ok
    for bad in ("", "two words", "mod:Class:extra", 3):
        assert not validator.is_valid({**base, "stages": [{"kind": bad}]}), bad


def test_pipeline_schema_takes_every_input_contract_the_library_reads():
    """Found in a docs review: docs/lineage.md's forget run over a kto output (`schema: kto_example.v1`)
    runs, but the pipeline schema refused it."""
    from datakit.contracts import SCHEMAS as CONTRACTS

    schema = json.loads((SCHEMAS / "pipeline.v1.json").read_text())
    assert sorted(schema["properties"]["input"]["properties"]["schema"]["enum"]) == sorted(CONTRACTS)


def test_pipeline_schema_names_every_field_the_pipeline_models_take():
    """Found in a docs review: docs/packed_format.md tells users to set `output: {mds_size_limit: BYTES}`,
    which the library reads, but the schema's output object (additionalProperties: false) refused it. Every
    field of the pipeline's models is a property of the schema, and the schema has no field they lack."""
    from datakit.pipeline import InputConfig, OutputConfig, PipelineConfig

    schema = json.loads((SCHEMAS / "pipeline.v1.json").read_text())
    for model, props in ((PipelineConfig, schema["properties"]),
                         (InputConfig, schema["properties"]["input"]["properties"]),
                         (OutputConfig, schema["properties"]["output"]["properties"])):
        fields = {f.alias or name for name, f in model.model_fields.items()}
        assert fields == set(props), (model.__name__, sorted(fields ^ set(props)))
    validator = jsonschema.Draft202012Validator(schema)
    ok = {"input": {"path": "x"}, "stages": [{"kind": "ingest"}],
          "output": {"path": "o", "format": "mds", "mds_size_limit": 1 << 20}}
    assert validator.is_valid(ok)
    assert not validator.is_valid({**ok, "output": {**ok["output"], "mds_size_limit": 4 << 30}})
