"""Our detectors as presidio recognizers, presidio engines that never touch the network, presidio's own NER engine.

Why a bridge and not presidio on the hot path: presidio analyzes one document
at a time through every recognizer (measured in benchmarks/pii.py at well under
1 MB/s pattern-only), while our batch scanner does the same regex work over a
whole Arrow column. But presidio is the ecosystem's registry: exposing our
detectors as `EntityRecognizer`s lets a team mix them with their own
recognizers, run them in their presidio services, and check (tests do) that
both paths find the same entities.

Offline facts this module encodes (presidio-analyzer 2.2.366):
- `AnalyzerEngine()` with no NLP engine builds a spaCy engine and tries to
  download `en_core_web_lg`; we always pass an engine: `no_op` (via
  `NlpEngineProvider`) for pattern-only, spaCy only if a model is installed.
- presidio's own predefined recognizers (the baseline benchmarks compare against)
  are built offline by tests/support/presidio_baseline.py, not here: the library
  never runs them.
"""
from __future__ import annotations

import functools
from typing import Iterable, Sequence

from datakit.stages.scrub_pii.lean_import import without_torch

with without_torch():  # presidio imports spaCy -> thinc, and transformers; none of them needs torch here
    from presidio_analyzer import AnalyzerEngine, EntityRecognizer, LocalRecognizer, RecognizerResult
    from presidio_analyzer.nlp_engine import NlpArtifacts, NlpEngineProvider
    from presidio_analyzer.recognizer_registry import RecognizerRegistry

from datakit.stages.scrub_pii.detectors import DETECTORS, Detector
# the scanner the stage runs is in `ner` (no presidio); its names stay importable from here
from datakit.stages.scrub_pii.ner import (PersonNameScanner, installed_spacy_model, model_version,  # noqa: F401
                                          name_paragraphs, person_scanner, person_spans, plausible_name)
from datakit.stages.scrub_pii.scan import Finding, resolve_overlaps


class DatakitRecognizer(LocalRecognizer):
    """A presidio recognizer running one of our detectors (pattern + validator, same spans).

    `recognition_metadata["datakit_entity"]` carries our entity name, since
    several of ours share one presidio entity (ipv4/ipv6 -> IP_ADDRESS).
    """

    def __init__(self, detector: Detector, supported_language: str = "en") -> None:
        self.detector = detector
        super().__init__(
            supported_entities=[detector.presidio_entity],
            supported_language=supported_language,
            name=f"Datakit_{detector.entity}",
        )

    def load(self) -> None:  # patterns are compiled at import
        pass

    def analyze(self, text: str, entities: list[str], nlp_artifacts: NlpArtifacts | None = None
                ) -> list[RecognizerResult]:
        if entities and self.detector.presidio_entity not in entities:
            return []
        out = []
        for m in self.detector.finditer(text):
            a, b = self.detector.span(m)
            if b > a:
                out.append(RecognizerResult(
                    self.detector.presidio_entity, a, b, self.detector.score,
                    recognition_metadata={
                        RecognizerResult.RECOGNIZER_NAME_KEY: self.name,
                        RecognizerResult.RECOGNIZER_IDENTIFIER_KEY: self.id,
                        "datakit_entity": self.detector.entity,
                        "datakit_priority": self.detector.priority,
                    },
                ))
        return out


def datakit_recognizers(detectors: Sequence[Detector] = DETECTORS, language: str = "en"
                        ) -> list[DatakitRecognizer]:
    """One presidio recognizer per datakit detector."""
    return [DatakitRecognizer(d, language) for d in detectors]


def no_op_nlp_engine(language: str = "en"):
    """presidio's model-free NLP engine (pattern recognizers only; nothing is downloaded)."""
    conf = {"nlp_engine_name": "no_op", "models": [{"lang_code": language, "model_name": "no_op"}]}
    return NlpEngineProvider(nlp_configuration=conf).create_engine()


def pattern_only_analyzer(recognizers: Iterable[EntityRecognizer] | None = None, language: str = "en"
                          ) -> AnalyzerEngine:
    """An AnalyzerEngine with the no_op NLP engine and the given recognizers (default: ours)."""
    recs = list(recognizers) if recognizers is not None else datakit_recognizers(language=language)
    registry = RecognizerRegistry(recognizers=recs, supported_languages=[language])
    return AnalyzerEngine(registry=registry, nlp_engine=no_op_nlp_engine(language),
                          supported_languages=[language])


# ---------------------------------------------------------------- person names (NER)

@functools.lru_cache(maxsize=None)
def ner_analyzer(model: str) -> AnalyzerEngine:
    """A presidio AnalyzerEngine for PERSON over an installed spaCy pipeline (presidio loads the model
    itself); built once per process.

    The stage does not run it: `ner.person_spans` reads spaCy's entities directly (same spans, no
    presidio analysis per text). This is the presidio side of the same model, for teams that mix it
    with their own recognizers, and the reference the NER tests compare with. Like
    `ner.ner_pipeline`, it keeps only the `ner` pipe of a CNN pipeline.
    """
    import spacy.util
    from presidio_analyzer.predefined_recognizers import SpacyRecognizer

    if not spacy.util.is_package(model):  # presidio would try `spacy download` otherwise
        raise ValueError(f"scrub_pii: spaCy model {model!r} is not installed (it is never downloaded)")
    conf = {"nlp_engine_name": "spacy", "models": [{"lang_code": "en", "model_name": model}]}
    engine = NlpEngineProvider(nlp_configuration=conf).create_engine()
    nlp = engine.nlp["en"]
    arch = str(nlp.config["components"].get("ner", {}).get("model", {}).get("tok2vec", {}).get("@architectures", ""))
    if "ner" in nlp.pipe_names and "Listener" not in arch:
        nlp.select_pipes(enable=["ner"])
    # only PERSON is asked for; every other label of the model is dropped before presidio maps it,
    # which also silences its per-entity "Entity CARDINAL is not mapped" warning (hundreds per run)
    mapping = engine.ner_model_configuration.model_to_presidio_entity_mapping
    labels = nlp.get_pipe("ner").labels if "ner" in nlp.pipe_names else ()
    engine.ner_model_configuration.labels_to_ignore = sorted(l for l in labels if mapping.get(l) != "PERSON")
    registry = RecognizerRegistry(recognizers=[SpacyRecognizer(supported_language="en", supported_entities=["PERSON"])],
                                  supported_languages=["en"])
    return AnalyzerEngine(registry=registry, nlp_engine=engine, supported_languages=["en"])


# ---------------------------------------------------------------- a team's own recognizers

def _check_recognizer_file(conf_file: str) -> None:
    """The shape presidio's recognizer YAML must have, said in our words before presidio reads it.

    Why: presidio reports a file without `supported_languages` as "argument of type 'NoneType' is not
    iterable" (found in review); the format is in docs/pii.md."""
    import yaml

    try:
        doc = yaml.safe_load(open(conf_file, encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"scrub_pii: cannot load extra_recognizers {conf_file!r}: not YAML "
                         f"({type(e).__name__})") from None
    where = f"scrub_pii: extra_recognizers {conf_file!r}"
    if not isinstance(doc, dict) or not isinstance(doc.get("recognizers"), list) or not doc["recognizers"]:
        raise ValueError(f"{where}: needs a top-level `recognizers:` list (presidio's recognizer file; see docs/pii.md)")
    if not isinstance(doc.get("supported_languages"), list) or "en" not in doc["supported_languages"]:
        raise ValueError(f"{where}: needs a top-level `supported_languages: [en]` (the stage analyzes in English; "
                         "see docs/pii.md)")


class ExtraRecognizers:
    """Recognizers a team declares in presidio's own YAML format, run beside our detectors.

    Why: teams already write presidio recognizers (employee ids, internal hostnames);
    `scrub_pii` takes the same file (`extra_recognizers: path.yaml`). They run per
    document through a pattern-only AnalyzerEngine, so they cost presidio speed:
    that is the price of the generic path, paid only by teams that opt in. Findings
    are named by the recognizer's entity in lower case (`EMPLOYEE_ID` -> `employee_id`).
    """

    PRIORITY = 45  # below our specific detectors, above generic high-entropy

    def __init__(self, conf_file: str) -> None:
        self.conf_file = conf_file
        self._analyzer: AnalyzerEngine | None = None

    def __getstate__(self) -> dict:
        return {"conf_file": self.conf_file, "_analyzer": None}  # rebuilt on the worker

    def setup(self) -> None:
        """Build the analyzer from the recognizer file, once per worker process."""
        from pathlib import Path

        from presidio_analyzer.recognizer_registry import RecognizerRegistryProvider

        # presidio silently loads its *default* recognizers when the file does not exist
        if not Path(self.conf_file).is_file():
            raise ValueError(f"scrub_pii: cannot load extra_recognizers {self.conf_file!r}: no such file")
        _check_recognizer_file(self.conf_file)
        try:
            registry = RecognizerRegistryProvider(conf_file=self.conf_file).create_recognizer_registry()
        except Exception as e:  # presidio raises many types for a bad file; name the file, not a traceback
            raise ValueError(f"scrub_pii: cannot load extra_recognizers {self.conf_file!r}: {e}") from None
        self._analyzer = pattern_only_analyzer(registry.recognizers)

    def analyzer(self) -> AnalyzerEngine:
        if self._analyzer is None:  # a direct call, not through an engine
            self.setup()
        return self._analyzer  # type: ignore[return-value]

    def entities(self) -> list[str]:
        return sorted({e.lower() for r in self.analyzer().registry.recognizers for e in r.supported_entities})

    def add(self, texts: Sequence[str | None], found: list[list[Finding]]) -> list[list[Finding]]:
        out = []
        for t, fs in zip(texts, found):
            if t:
                res = self.analyzer().analyze(text=t, language="en")
                if res:
                    cands = [(f.start, f.end, 1000, f.entity) for f in fs]  # ours win overlaps
                    cands += [(r.start, r.end, self.PRIORITY, r.entity_type.lower()) for r in res]
                    fs = resolve_overlaps(cands)
            out.append(fs)
        return out
