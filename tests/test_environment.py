"""Output that depends on the machine is pinned, recorded, or an error (issue #12 item 4).

`ner` (a spaCy model installed or not), the PII scan strategy (hyperscan or polars), library
versions and artifacts a stage loads are recorded in the plan's environment, which the
manifest carries and the config hash folds in; a fallback that changes output (no spaCy model)
is an error unless the pipeline says `ner: auto`.
"""
from __future__ import annotations

import json

import pytest

from datakit import Pipeline, PipelineError
from datakit.stages.scrub_pii import ner as ner_module
from datakit.stages.scrub_pii import scan as pii_scan
from tests.eventgen import make_event, write_jsonl

MODEL = ner_module.installed_spacy_model()
needs_model = pytest.mark.skipif(MODEL is None, reason="no spaCy model installed")


@pytest.fixture
def logs(tmp_path):
    return write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(12)])


def _pipe(logs, tmp_path, **scrub) -> Pipeline:
    return (Pipeline("env").input(str(logs)).add({"kind": "ingest"}).add({"kind": "extract"})
            .add({"kind": "scrub_pii", **scrub}).output(str(tmp_path / "out")))


def test_default_ner_without_a_model_is_an_error(logs, tmp_path, monkeypatch):
    monkeypatch.setattr(ner_module, "installed_spacy_model", lambda: None)
    with pytest.raises(PipelineError, match=r"needs an installed English spaCy model.*ner: auto") as e:
        _pipe(logs, tmp_path).compile()
    assert "\n" not in str(e.value)
    with pytest.raises(PipelineError, match="ner_model"):
        _pipe(logs, tmp_path, ner_model="xx_not_a_model").compile()


@needs_model
def test_ner_model_is_recorded_and_its_absence_changes_the_hash(logs, tmp_path, monkeypatch):
    with_model = _pipe(logs, tmp_path, ner="auto").compile()
    ner = with_model.environment["stages"]["scrub_pii"]["ner"]
    assert ner["model"] == MODEL and ner["model_version"] and ner["spacy"]
    monkeypatch.setattr(ner_module, "installed_spacy_model", lambda: None)
    without = _pipe(logs, tmp_path, ner="auto").compile()  # allowed: the pipeline said so
    assert without.environment["stages"]["scrub_pii"]["ner"] is None
    assert without.config_hash != with_model.config_hash
    # what NER reads (tool calls, never-name words...) is versioned: a change there changes the hash
    monkeypatch.setattr(ner_module, "installed_spacy_model", lambda: MODEL)
    monkeypatch.setattr(ner_module.PersonNameScanner, "READS", ner["reads"] + 1)
    assert _pipe(logs, tmp_path, ner="auto").compile().config_hash != with_model.config_hash


@needs_model
def test_manifest_records_what_ran(logs, tmp_path):
    res = _pipe(logs, tmp_path).run(workers=1)
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    env = m["environment"]["stages"]["scrub_pii"]
    assert env["ner"]["model"] == MODEL and env["strategy"] in ("hyperscan", "polars")
    assert m["pipeline_hash"] == res.manifest["pipeline_hash"] and m["inputs"][0]["path"] == str(logs)


def test_scan_strategy_is_resolved_recorded_and_hashed(logs, tmp_path, monkeypatch):
    monkeypatch.setattr(pii_scan, "hyperscan_available", lambda: True)
    a = _pipe(logs, tmp_path, ner="off").compile()
    monkeypatch.setattr(pii_scan, "hyperscan_available", lambda: False)
    b = _pipe(logs, tmp_path, ner="off").compile()
    assert a.environment["stages"]["scrub_pii"]["strategy"] == "hyperscan"
    assert b.environment["stages"]["scrub_pii"]["strategy"] == "polars"
    assert a.config_hash != b.config_hash
    # the function carries the resolved strategy: a worker never re-decides it from what it has installed
    fn = next(n for n in b.nodes() if getattr(n, "name", "") == "scrub_pii").fn
    assert fn.strategy == "polars"


def test_pseudonym_key_is_recorded_as_a_fingerprint_only(logs, tmp_path, monkeypatch):
    monkeypatch.setenv("DK_TEST_KEY", "k" * 32)
    a = _pipe(logs, tmp_path, ner="off", default_policy="pseudonym", key_env="DK_TEST_KEY").compile()
    monkeypatch.setenv("DK_TEST_KEY", "j" * 32)
    b = _pipe(logs, tmp_path, ner="off", default_policy="pseudonym", key_env="DK_TEST_KEY").compile()
    fa = a.environment["stages"]["scrub_pii"]["pseudonym_key"]
    assert fa != b.environment["stages"]["scrub_pii"]["pseudonym_key"] and a.config_hash != b.config_hash
    assert "k" * 8 not in json.dumps(a.environment)


def test_artifacts_loaded_at_compile_are_digested(tmp_path, logs):
    """An opt-out list changed in place (same path, same config) changes the config hash."""
    optouts = tmp_path / "optouts.jsonl"
    optouts.write_text('{"user_id": "u1"}\n')
    p = (Pipeline("c").input(str(logs)).add({"kind": "ingest"})
         .add({"kind": "consent", "optouts": str(optouts)}).output(str(tmp_path / "o")))
    first = p.compile()
    optouts.write_text('{"user_id": "u2"}\n')
    assert p.compile().config_hash != first.config_hash
