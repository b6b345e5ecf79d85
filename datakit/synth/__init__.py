"""Synthetic editor logs with planted ground truth (`datakit synth OUT_DIR --events N --seed S`).

See `datakit.synth.generator.generate` and `schemas/synth_ground_truth.v1.json`.
Helpers for tests: `read_ground_truth(out_dir)` and `iter_events(out_dir)`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from datakit.synth.generator import GROUND_TRUTH_FILE, OPTOUTS_FILE, SUMMARY_FILE, SynthArgumentError, generate
from datakit.synth.plants import jaccard

__all__ = ["generate", "read_ground_truth", "iter_events", "record_doc_id", "jaccard", "GROUND_TRUTH_FILE",
           "OPTOUTS_FILE", "SUMMARY_FILE", "SynthArgumentError"]


def record_doc_id(event_id: str, kind: str = "code") -> str:
    """The `doc_id` extract gives the `kind` record of an event: maps ground-truth event ids to records.

    (Preference records also depend on the rejected event: see `datakit.contracts.doc_id`, the rule extract uses.)
    """
    from datakit.contracts import doc_id

    return doc_id(event_id, kind)


def read_ground_truth(out_dir: str | os.PathLike, kind: str | None = None) -> list[dict]:
    """The ground-truth rows of a generated folder, optionally only one `kind` (e.g. "pii")."""
    rows = []
    with open(Path(out_dir) / GROUND_TRUTH_FILE, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if kind is None or row["kind"] == kind:
                rows.append(row)
    return rows


def iter_events(out_dir: str | os.PathLike, include_malformed: bool = False) -> Iterator[dict]:
    """Parsed valid events of a generated folder in file order.

    The planted malformed lines (listed in the ground truth) are skipped unless
    `include_malformed`, in which case they come as `{"_malformed": raw_bytes}`.
    """
    import io

    import zstandard

    root = Path(out_dir)
    bad = {(r["file"], r["line"]) for r in read_ground_truth(root, "malformed")}
    for path in sorted(root.glob("dt=*/part-*.jsonl.zst")):
        rel = path.relative_to(root).as_posix()
        with open(path, "rb") as fh:
            stream = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True), 1 << 20)
            for i, line in enumerate(stream, start=1):  # streams: a part may be hundreds of MB
                line = line.rstrip(b"\n")
                if (rel, i) in bad:
                    if include_malformed:
                        yield {"_malformed": line}
                    continue
                yield json.loads(line.decode("utf-8"))
