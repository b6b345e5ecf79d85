"""Data-quality checks at stage boundaries (great-expectations), the run report and the data diff.

Suites ship in datakit/quality/suites/ (top-level quality/ links there); docs/quality.md explains the parts.
"""
from datakit.quality.gx import QualityResult, load_suite, validate_table
from datakit.quality.validate import validate_path

__all__ = ["QualityResult", "load_suite", "validate_path", "validate_table"]
