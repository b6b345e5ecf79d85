"""Data-quality checks at stage boundaries, run with great-expectations (suites ship in datakit/quality/suites/; top-level quality/ links there)."""
from datakit.quality.gx import QualityResult, load_suite, validate_output, validate_table

__all__ = ["QualityResult", "load_suite", "validate_output", "validate_table"]
