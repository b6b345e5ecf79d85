"""PII and secret scrubbing (the `scrub_pii` stage).

Modules, one job each: `detectors` (patterns + validators), `scan` (batch
scanner over an Arrow column), `replace` (placeholder / pseudonym / drop),
`presidio_bridge` (our detectors as presidio recognizers; NER for person
names), `stage` (the pipeline stage config). Importing this package is cheap:
presidio loads only when the bridge is used.
"""
from datakit.stages.scrub_pii.detectors import DETECTORS, ENTITIES, Detector
from datakit.stages.scrub_pii.scan import Finding, scan_batch, scan_text

__all__ = ["DETECTORS", "ENTITIES", "Detector", "Finding", "scan_batch", "scan_text"]
