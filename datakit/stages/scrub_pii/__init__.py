"""PII and secret scrubbing (the `scrub_pii` stage).

Modules, one job each: `detectors` (patterns + validators), `scan` (batch
scanner over an Arrow column), `replace` (placeholder / pseudonym / drop),
`ner` (person names: spaCy NER, no presidio import), `presidio_bridge` (our
detectors as presidio recognizers, presidio's own NER engine, a team's YAML
recognizers), `stage` (the pipeline stage config). Importing this package is
cheap: presidio loads only when the bridge is used, spaCy only where NER runs.
"""
from datakit.stages.scrub_pii.detectors import DETECTORS, ENTITIES, Detector
from datakit.stages.scrub_pii.scan import Finding, scan_batch, scan_text

__all__ = ["DETECTORS", "ENTITIES", "Detector", "Finding", "scan_batch", "scan_text"]
