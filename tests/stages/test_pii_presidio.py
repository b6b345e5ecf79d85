"""Our detectors as presidio recognizers: they run inside a pattern-only AnalyzerEngine, offline."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from datakit.stages.scrub_pii.detectors import DETECTORS
from datakit.stages.scrub_pii.presidio_bridge import (
    DatakitRecognizer,
    pattern_only_analyzer,
)
from datakit.stages.scrub_pii.scan import scan_batch
from tests.support.presidio_baseline import analyze_findings, offline_tldextract, presidio_default_analyzer

HARD = Path(__file__).resolve().parents[1] / "data" / "pii_hard_cases.jsonl"


@pytest.fixture(scope="module")
def analyzer():
    return pattern_only_analyzer()


def test_registry_holds_one_recognizer_per_detector(analyzer) -> None:
    recs = [r for r in analyzer.registry.recognizers if isinstance(r, DatakitRecognizer)]
    assert sorted(r.detector.entity for r in recs) == sorted(d.entity for d in DETECTORS)
    assert type(analyzer.nlp_engine).__name__ == "NoOpNlpEngine"  # no spaCy model, no download


def test_presidio_path_finds_the_same_entities_as_the_batch_scanner(analyzer) -> None:
    texts = [json.loads(line)["text"] for line in HARD.read_text().splitlines() if line.strip()]
    ours = scan_batch(texts)
    assert sum(map(len, ours)) >= 35
    for text, expected in zip(texts, ours):
        assert analyze_findings(analyzer, text) == expected


def test_a_team_can_add_its_own_recognizer_the_presidio_way() -> None:
    from presidio_analyzer import Pattern, PatternRecognizer

    employee = PatternRecognizer(supported_entity="EMPLOYEE_ID", patterns=[Pattern("emp", r"\bEMP-\d{6}\b", 0.9)])
    analyzer = pattern_only_analyzer(list(pattern_only_analyzer().registry.recognizers) + [employee])
    types = {r.entity_type for r in analyzer.analyze("EMP-123456 mailed ann@acme.com", language="en")}
    assert types == {"EMPLOYEE_ID", "EMAIL_ADDRESS"}


def test_presidio_defaults_run_offline() -> None:
    assert offline_tldextract().suffix_list_urls == ()
    res = presidio_default_analyzer(regex_phone=True).analyze("mail ann@acme.com", language="en")
    assert any(r.entity_type == "EMAIL_ADDRESS" for r in res)


EXTRA_YAML = """
supported_languages: [en]
recognizers:
  - name: "Employee id"
    supported_language: "en"
    supported_entity: "EMPLOYEE_ID"
    type: custom
    patterns:
      - {name: emp, regex: "\\\\bEMP-\\\\d{6}\\\\b", score: 0.9}
"""


def test_stage_runs_a_teams_presidio_recognizer_file(tmp_path) -> None:
    from datakit.stages.scrub_pii.stage import ScrubPiiConfig

    (tmp_path / "recs.yaml").write_text(EXTRA_YAML)
    cfg = ScrubPiiConfig(ner="off", extra_recognizers="recs.yaml", policy={"employee_id": "placeholder"})
    fn = cfg.build_fn(str(tmp_path))
    (out,), _ = fn.scrub(["owner EMP-123456, mail ann@acme.com"])
    assert out == "owner <EMPLOYEE_ID>, mail <EMAIL>"
    with pytest.raises(ValueError, match="unknown entities"):
        ScrubPiiConfig(ner="off", extra_recognizers="recs.yaml", policy={"employe_id": "drop"}).build_fn(str(tmp_path))
    with pytest.raises(ValueError, match="cannot load extra_recognizers"):
        ScrubPiiConfig(ner="off", extra_recognizers="missing.yaml").build_fn(str(tmp_path))
    # found in review: without `supported_languages` presidio said "argument of type 'NoneType' is not iterable"
    (tmp_path / "nolang.yaml").write_text(EXTRA_YAML.replace("supported_languages: [en]\n", ""))
    with pytest.raises(ValueError, match=r"nolang.yaml': needs a top-level `supported_languages: \[en\]`"):
        ScrubPiiConfig(ner="off", extra_recognizers="nolang.yaml").build_fn(str(tmp_path))
    (tmp_path / "empty.yaml").write_text("supported_languages: [en]\n")
    with pytest.raises(ValueError, match="needs a top-level `recognizers:` list"):
        ScrubPiiConfig(ner="off", extra_recognizers="empty.yaml").build_fn(str(tmp_path))
