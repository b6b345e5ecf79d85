"""The `scrub_pii` stage: scrub every text of a training record, count what was found, drop on policy.

Pipeline file::

    - kind: scrub_pii
      policy: {email: pseudonym, ipv4: placeholder, private_key: drop}   # per entity (optional)
      default_policy: placeholder     # for entities not listed (optional; else each detector's default)
      key_file: /run/secrets/pii_key  # only for pseudonym; else the env var named by key_env
      ner: auto                       # presidio NER for person names if a spaCy model is installed

What is scrubbed: the `text` of every segment, plus `chosen` and `rejected`
(preference pairs). The schema stays `training_record.v1`.

Accounting: records whose findings include a drop-policy entity get
`_drop = "pii:<entity>"` (the engine counts and logs them by doc_id). Per-entity
finding counts go out in the `_metrics` column (a JSON object
`{"pii.<entity>": n}` on one row per batch, null elsewhere), which the engine
sums into the stage's `metrics` in `_run.json`. Only counts leave this stage:
never a matched value, in metrics, drop details, logs or errors.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Literal

import pyarrow as pa
from pydantic import Field, field_validator

from datakit.contracts import SEGMENT, TRAINING_RECORD_V1
from datakit.plan import DROP, DROP_DETAIL, Rel
from datakit.stages.base import CompileContext, StageConfig, register_stage
from datakit.stages.pii.detectors import BY_ENTITY, DETECTORS, Detector, Policy
from datakit.stages.pii.replace import DEFAULT_KEY_ENV, Replacer, load_key
from datakit.stages.pii.scan import Finding, Strategy, scan_batch

log = logging.getLogger("datakit.pii")

METRICS = "_metrics"
METRIC_PREFIX = "pii."
# segment roles that hold natural language (person-name NER runs only there, when available)
PROSE_ROLES = frozenset({"user", "assistant", "system", "prompt", "tool"})


@register_stage
class ScrubPiiConfig(StageConfig):
    """Config of the PII/secret scrubber (see module docstring for the YAML form)."""

    kind: Literal["scrub_pii"] = "scrub_pii"
    entities: list[str] | None = Field(default=None, description="detector names to run; default: all")
    policy: dict[str, Policy] = Field(default_factory=dict, description="per-entity policy overrides")
    default_policy: Policy | None = Field(default=None, description="policy for entities not in `policy`")
    key_env: str = Field(default=DEFAULT_KEY_ENV, description="env var holding the pseudonym HMAC key")
    key_file: str | None = Field(default=None, description="path to a file holding the pseudonym key")
    ner: Literal["auto", "off"] = "auto"
    strategy: Strategy = "polars"

    @field_validator("entities")
    @classmethod
    def _known_entities(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            bad = sorted(set(v) - set(BY_ENTITY))
            if bad:
                raise ValueError(f"unknown entities {bad}; known: {sorted(BY_ENTITY)}")
        return v

    @field_validator("policy")
    @classmethod
    def _known_policy_entities(cls, v: dict[str, Policy]) -> dict[str, Policy]:
        bad = sorted(set(v) - set(BY_ENTITY) - {"person"})
        if bad:
            raise ValueError(f"policy names unknown entities {bad}; known: {sorted(BY_ENTITY)}")
        return v

    def detectors(self) -> tuple[Detector, ...]:
        wanted = set(self.entities) if self.entities is not None else None
        return tuple(d for d in DETECTORS if wanted is None or d.entity in wanted)

    def policies(self) -> dict[str, Policy]:
        """The effective policy of every entity (explicit > default_policy > detector default)."""
        out: dict[str, Policy] = {}
        for d in DETECTORS:
            out[d.entity] = self.policy.get(d.entity, self.default_policy or d.default_policy)
        out["person"] = self.policy.get("person", self.default_policy or "placeholder")
        return out

    def build_fn(self, base_dir: str | None = None) -> "ScrubFn":
        """The picklable batch function (loads the pseudonym key here, so a missing key fails at compile)."""
        pol = self.policies()
        key = None
        if "pseudonym" in pol.values():
            key_file = self.key_file
            if key_file and base_dir is not None and not key_file.startswith(("/", "~")):
                key_file = CompileContext(base_dir=Path(base_dir)).resolve(key_file)
            key = load_key(self.key_env, key_file)
        person = None
        if self.ner == "auto":
            from datakit.stages.pii.presidio_bridge import person_scanner

            person = person_scanner()
        return ScrubFn(self.detectors(), Replacer(pol, key), self.strategy, person)

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        fn = self.build_fn(str(ctx.base_dir))
        return rel.map_batches(fn, TRAINING_RECORD_V1, name="scrub_pii", drop_log_key="doc_id")


class ScrubFn:
    """RecordBatch -> RecordBatch (+ `_drop`, `_drop_detail`, `_metrics`). Pure and deterministic."""

    def __init__(self, detectors: tuple[Detector, ...], replacer: Replacer, strategy: Strategy = "polars",
                 person=None) -> None:
        self.detectors = detectors
        self.replacer = replacer
        self.strategy = strategy
        self.person = person  # a presidio NER scanner (person names) or None

    def __repr__(self) -> str:  # never show the key
        return f"ScrubFn({len(self.detectors)} detectors, strategy={self.strategy})"

    def scan(self, texts: list[str | None], prose: list[bool] | None = None) -> list[list[Finding]]:
        found = scan_batch(texts, self.detectors, self.strategy)
        if self.person is not None and prose is not None:
            found = self.person.add_names(texts, prose, found)
        return found

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        names = batch.schema.names
        seg = batch.column("segments") if "segments" in names else None
        seg_values = seg.values if seg is not None else None
        seg_offsets = seg.offsets.to_numpy() if seg is not None else None
        if seg is not None:
            start, stop = int(seg_offsets[0]), int(seg_offsets[-1])
            seg_values = seg_values.slice(start, stop - start)
            seg_offsets = seg_offsets - start
        seg_fields = dict(zip([f.name for f in SEGMENT], seg_values.flatten())) if seg is not None else {}
        seg_texts: list[str | None] = seg_fields["text"].to_pylist() if seg is not None else []
        seg_roles: list[str | None] = seg_fields["role"].to_pylist() if seg is not None else []
        chosen = batch.column("chosen").to_pylist() if "chosen" in names else [None] * n
        rejected = batch.column("rejected").to_pylist() if "rejected" in names else [None] * n

        # one scan over every text of the batch: segments, then chosen, then rejected
        texts = seg_texts + chosen + rejected
        prose = [r in PROSE_ROLES for r in seg_roles] + [True] * (2 * n)
        found = self.scan(texts, prose)

        owner: list[int] = []
        if seg is not None:
            for row in range(n):
                owner.extend([row] * int(seg_offsets[row + 1] - seg_offsets[row]))
        owner.extend(range(n))
        owner.extend(range(n))

        per_row: list[list[Finding]] = [[] for _ in range(n)]
        counts: dict[str, int] = {}
        new_texts: list[str | None] = []
        for t, fs, row in zip(texts, found, owner):
            if fs:
                per_row[row].extend(fs)
                for f in fs:
                    counts[f.entity] = counts.get(f.entity, 0) + 1
                new_texts.append(self.replacer.apply(t, fs))  # type: ignore[arg-type]
            else:
                new_texts.append(t)

        drop = [self.replacer.drop_reason(fs) for fs in per_row]
        detail = [
            json.dumps({e: sum(1 for f in fs if f.entity == e) for e in sorted({f.entity for f in fs})})
            if d else None
            for d, fs in zip(drop, per_row)
        ]
        k = len(seg_texts)
        cols: dict[str, pa.Array] = {}
        if seg is not None:
            values = pa.StructArray.from_arrays(
                [pa.array(new_texts[:k], pa.string()), seg_fields["train"], seg_fields["role"]],
                fields=list(SEGMENT),
                mask=seg_values.is_null() if seg_values.null_count else None,
            )
            cols["segments"] = pa.ListArray.from_arrays(
                pa.array(seg_offsets, pa.int32()), values, mask=seg.is_null() if seg.null_count else None
            )
        if "chosen" in names:
            cols["chosen"] = pa.array(new_texts[k : k + n], pa.string())
        if "rejected" in names:
            cols["rejected"] = pa.array(new_texts[k + n :], pa.string())

        arrays = [cols.get(name, batch.column(i)) for i, name in enumerate(names)]
        fields = [batch.schema.field(i) if name not in cols else pa.field(name, cols[name].type)
                  for i, name in enumerate(names)]
        metrics: list[str | None] = [None] * n
        if counts and n:
            kept = next((i for i, d in enumerate(drop) if d is None), 0)
            metrics[kept] = json.dumps({METRIC_PREFIX + e: c for e, c in sorted(counts.items())},
                                       separators=(",", ":"))
        arrays += [pa.array(drop, pa.string()), pa.array(detail, pa.string()), pa.array(metrics, pa.string())]
        fields += [pa.field(DROP, pa.string()), pa.field(DROP_DETAIL, pa.string()), pa.field(METRICS, pa.string())]
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def scrub_texts(texts: list[str | None], config: ScrubPiiConfig | None = None) -> list[str | None]:
    """Convenience: scrub plain strings with a config's detectors and policy (drop acts like placeholder)."""
    cfg = config or ScrubPiiConfig(ner="off")
    fn = cfg.build_fn()
    found = fn.scan(texts)
    return [fn.replacer.apply(t, fs) if fs else t for t, fs in zip(texts, found)]  # type: ignore[arg-type]


__all__ = ["ScrubPiiConfig", "ScrubFn", "scrub_texts", "METRICS"]
