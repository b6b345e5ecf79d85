"""Data-quality checks at stage boundaries, run with great-expectations (suites live in top-level quality/)."""
from datakit.quality.gx import QualityResult, load_suite, validate_output, validate_table

__all__ = ["QualityResult", "load_suite", "validate_output", "validate_table"]
