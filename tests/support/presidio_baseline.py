"""presidio's predefined recognizers, offline: the baseline tests and benchmarks compare our detectors with.

Why here and not in the library: datakit never runs presidio's own recognizers; only
tests (tests/stages/test_pii_presidio.py) and benchmarks (benchmarks/pii.py,
pii_heldout.py) need "the plain way" as a reference point.

Offline fact this module encodes (presidio-analyzer 2.2.366): `EmailRecognizer.validate_result`
calls `tldextract.extract`, which fetches the public-suffix list over the network; we replace it
with a `TLDExtract(suffix_list_urls=())` that uses the bundled snapshot.
"""
from __future__ import annotations

import functools

from datakit.stages.scrub_pii.presidio_bridge import AnalyzerEngine, RecognizerRegistry, no_op_nlp_engine
from datakit.stages.scrub_pii.scan import Finding, resolve_overlaps


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
    """Run an analyzer with our recognizers (`presidio_bridge.datakit_recognizers`) and turn its results
    into our `Finding`s (same overlap rule): what the tests compare with our own scan."""
    res = analyzer.analyze(text=text, language=language)
    cands = [(r.start, r.end, int(r.recognition_metadata.get("datakit_priority", 0)),
              r.recognition_metadata.get("datakit_entity", r.entity_type)) for r in res]
    return resolve_overlaps(cands)
