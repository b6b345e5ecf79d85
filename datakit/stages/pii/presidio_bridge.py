"""Our detectors as presidio recognizers, presidio engines that never touch the network, and NER names.

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
- `EmailRecognizer.validate_result` calls `tldextract.extract`, which fetches
  the public-suffix list over the network; we replace it with a
  `TLDExtract(suffix_list_urls=())` that uses the bundled snapshot.
"""
from __future__ import annotations

import functools
import logging
from typing import Iterable, Sequence

from presidio_analyzer import AnalyzerEngine, EntityRecognizer, LocalRecognizer, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts, NlpEngineProvider
from presidio_analyzer.recognizer_registry import RecognizerRegistry

from datakit.stages.pii.detectors import DETECTORS, Detector
from datakit.stages.pii.scan import Finding, resolve_overlaps

log = logging.getLogger("datakit.pii")


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


@functools.lru_cache(maxsize=1)
def offline_tldextract():
    """A tldextract that uses only its bundled public-suffix snapshot (no fetch, no cache writes)."""
    import tldextract

    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


def presidio_default_analyzer(language: str = "en", regex_phone: bool = False) -> AnalyzerEngine:
    """presidio's predefined recognizers, pattern-only and offline ("the plain way", minus the network).

    `regex_phone=True` swaps the libphonenumber-based PhoneRecognizer (which
    dominates presidio's runtime) for a regex pattern recognizer: the "tuned"
    configuration the issue measured.
    """
    from presidio_analyzer import Pattern, PatternRecognizer
    from presidio_analyzer.predefined_recognizers import EmailRecognizer, PhoneRecognizer

    extractor = offline_tldextract()

    class OfflineEmailRecognizer(EmailRecognizer):
        def validate_result(self, pattern_text: str):  # noqa: D102 - same rule, offline suffix list
            return extractor(pattern_text).fqdn != ""

    registry = RecognizerRegistry(supported_languages=[language])
    registry.load_predefined_recognizers(languages=[language], nlp_engine=no_op_nlp_engine(language))
    recs = []
    for r in registry.recognizers:
        if isinstance(r, EmailRecognizer):
            recs.append(OfflineEmailRecognizer(supported_language=language))
        elif isinstance(r, PhoneRecognizer) and regex_phone:
            recs.append(PatternRecognizer(
                supported_entity="PHONE_NUMBER", supported_language=language, name="RegexPhone",
                patterns=[Pattern("phone", r"(?<![\w.+-])(?:\+\d{1,3}[ .-]?)?\(?\d{3}\)?[ .-]\d{3}[ .-]\d{4}\b", 0.5)],
            ))
        else:
            recs.append(r)
    registry.recognizers = recs
    return AnalyzerEngine(registry=registry, nlp_engine=no_op_nlp_engine(language), supported_languages=[language])


def analyze_findings(analyzer: AnalyzerEngine, text: str, language: str = "en") -> list[Finding]:
    """Run an analyzer with our recognizers and turn its results into our `Finding`s (same overlap rule)."""
    res = analyzer.analyze(text=text, language=language)
    cands = [(r.start, r.end, int(r.recognition_metadata.get("datakit_priority", 0)),
              r.recognition_metadata.get("datakit_entity", r.entity_type)) for r in res]
    return resolve_overlaps(cands)


# ---------------------------------------------------------------- person names (NER)

_ner_warned = False


def installed_spacy_model() -> str | None:
    """The name of an installed English spaCy pipeline, or None (we never download one)."""
    try:
        import spacy.util
    except ImportError:
        return None
    models = sorted(m for m in spacy.util.get_installed_models() if m.startswith("en_"))
    for pref in ("en_core_web_lg", "en_core_web_md", "en_core_web_trf", "en_core_web_sm"):
        if pref in models:
            return pref
    return models[0] if models else None


class PersonNameScanner:
    """Person names in natural-language texts via presidio's spaCy NER (prose segments only)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._analyzer: AnalyzerEngine | None = None

    def __getstate__(self) -> dict:
        return {"model": self.model, "_analyzer": None}  # rebuild on the worker, do not pickle spaCy

    def analyzer(self) -> AnalyzerEngine:
        if self._analyzer is None:
            conf = {"nlp_engine_name": "spacy", "models": [{"lang_code": "en", "model_name": self.model}]}
            self._analyzer = AnalyzerEngine(nlp_engine=NlpEngineProvider(nlp_configuration=conf).create_engine())
        return self._analyzer

    def add_names(self, texts: Sequence[str | None], prose: Sequence[bool],
                  found: list[list[Finding]]) -> list[list[Finding]]:
        out = []
        for t, is_prose, fs in zip(texts, prose, found):
            if t and is_prose:
                res = self.analyzer().analyze(text=t, language="en", entities=["PERSON"])
                cands = [(f.start, f.end, 1000, f.entity) for f in fs]  # pattern findings win overlaps
                cands += [(r.start, r.end, 10, "person") for r in res if r.score >= 0.5]
                fs = resolve_overlaps(cands)
            out.append(fs)
        return out


def person_scanner() -> PersonNameScanner | None:
    """A NER scanner if a spaCy model is installed; otherwise None and one log line per process."""
    global _ner_warned
    model = installed_spacy_model()
    if model is None:
        if not _ner_warned:
            log.warning("scrub_pii: no spaCy model installed; person names are not detected "
                        "(pattern detectors only)")
            _ner_warned = True
        return None
    return PersonNameScanner(model)


# ---------------------------------------------------------------- a team's own recognizers

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

    def analyzer(self) -> AnalyzerEngine:
        if self._analyzer is None:
            from pathlib import Path

            from presidio_analyzer.recognizer_registry import RecognizerRegistryProvider

            # presidio silently loads its *default* recognizers when the file does not exist
            if not Path(self.conf_file).is_file():
                raise ValueError(f"scrub_pii: cannot load extra_recognizers {self.conf_file!r}: no such file")
            try:
                registry = RecognizerRegistryProvider(conf_file=self.conf_file).create_recognizer_registry()
            except Exception as e:  # presidio raises many types for a bad file; name the file, not a traceback
                raise ValueError(f"scrub_pii: cannot load extra_recognizers {self.conf_file!r}: {e}") from None
            self._analyzer = pattern_only_analyzer(registry.recognizers)
        return self._analyzer

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
