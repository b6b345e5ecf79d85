"""The conformance harness: one pipeline, several engines/partitionings, byte-identical output.

Usage in a test::

    assert_conformant(pipeline, tmp_path, variants=LOCAL_VARIANTS + spark_variants(spark))

Each variant runs the pipeline into its own folder; the harness compares the
manifest checksums of every data file and the per-stage accounting.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from datakit import Pipeline
from datakit.io.sinks import output_checksums

LOCAL_VARIANTS: list[tuple[str, dict[str, Any]]] = [("local", {"workers": 1}), ("local", {"workers": 2})]


def spark_variants(partitions=(1, 2, 7)) -> list[tuple[str, dict[str, Any]]]:
    return [("spark", {"partitions": n}) for n in partitions]


def _counts(stages: list[dict]) -> list[tuple]:
    return [(s["name"], s["rows_in"], s["rows_out"], s.get("emitted"), tuple(sorted(s["dropped"].items())))
            for s in stages]


def assert_conformant(pipeline: Pipeline, tmp_path: Path, variants=None, **run_kw) -> dict[str, str]:
    """Run every variant; assert identical checksums and counts; return the common checksums."""
    variants = variants or LOCAL_VARIANTS
    seen: list[tuple[str, dict[str, str], list]] = []
    for i, (engine, opts) in enumerate(variants):
        out = tmp_path / f"conf-{i}-{engine}"
        res = pipeline.run(engine=engine, output=str(out), **opts, **run_kw)
        seen.append((f"{engine}{opts}", output_checksums(str(out)), _counts(res.stages)))
    ref_name, ref_sums, ref_counts = seen[0]
    assert ref_sums, "the pipeline wrote no data files"
    for name, sums, counts in seen[1:]:
        assert sums == ref_sums, f"output of {name} differs from {ref_name}"
        assert counts == ref_counts, f"accounting of {name} differs from {ref_name}: {counts} vs {ref_counts}"
    return ref_sums
