"""The `kto` stage: `feedback` records -> TRL's unpaired-preference rows (`prompt`, `completion`, `label`).

Why a stage at the end and not columns written by extract: the texts must be
the *scrubbed* ones, so the prompt is rendered from the record's segments after
`scrub_pii` (and dedup/decontamination) ran. The output (contract
`kto_example.v1`) is what TRL's `KTOTrainer` loads as a
dataset: string `prompt`, string `completion`, bool `label`; `reward` (0..1,
for policy-gradient trainers), `doc_id`, `source` (lineage) and `meta` ride along.

Prompt rendering (`prompt_format`):
- `fim` (default): `{fim_prefix}{prefix}{fim_suffix}{suffix}{fim_middle}` with
  the sentinel texts of `fim_tokens` (StarCoder spelling by default; set the
  model's, e.g. Qwen2.5-Coder's `<|fim_prefix|>`...). An inline-edit
  instruction comes first, followed by a newline.
- `prefix`: the text before the cursor only (instruction first, as above).

Records of other kinds are dropped with reason `not_feedback` (counted).
"""
from __future__ import annotations

import json
from typing import Literal

import pyarrow as pa
from pydantic import Field

from datakit.contracts import KTO_EXAMPLE_V1
from datakit.plan import DROP, DROP_DETAIL, Rel
from datakit.stages.base import CompileContext, StageConfig, register_stage

_OUT = pa.schema(list(KTO_EXAMPLE_V1) + [(DROP, pa.string()), (DROP_DETAIL, pa.string())])
DEFAULT_FIM = {"prefix": "<fim_prefix>", "suffix": "<fim_suffix>", "middle": "<fim_middle>"}


def render_prompt(segments: list[dict], fmt: str, fim: dict[str, str]) -> tuple[str, str | None]:
    """(prompt, completion) of a feedback record's segments."""
    text: dict[str, str] = {}
    for s in segments or []:
        if s:
            text[s.get("role") or ""] = text.get(s.get("role") or "", "") + (s.get("text") or "")
    head = text["user"] + "\n" if text.get("user") else ""
    if text.get("selection"):  # an inline edit: the code its suggestion replaces, after the instruction
        head += text["selection"] + ("" if text["selection"].endswith("\n") else "\n")
    if fmt == "prefix":
        prompt = head + text.get("prefix", "")
    else:
        prompt = f"{head}{fim['prefix']}{text.get('prefix', '')}{fim['suffix']}{text.get('suffix', '')}{fim['middle']}"
    return prompt, text.get("completion")


class KtoFn:
    """Batch of training records -> KTO rows (+ `_drop` for records that are not feedback)."""

    def __init__(self, fmt: str, fim: dict[str, str]) -> None:
        self.fmt, self.fim = fmt, dict(fim)

    def __call__(self, batch: pa.RecordBatch) -> pa.Table:
        cols = {k: [] for k in _OUT.names}
        for r in batch.select(["doc_id", "kind", "segments", "source", "meta"]).to_pylist():
            prompt = completion = label = reward = None
            drop = None
            if r["kind"] != "feedback":
                drop = "not_feedback"
            else:
                prompt, completion = render_prompt(r["segments"], self.fmt, self.fim)
                meta = json.loads(r["meta"] or "{}")
                label, reward = meta.get("label"), meta.get("reward")
                if completion is None or label is None:
                    drop = "empty_document"
            for k, v in (("prompt", prompt), ("completion", completion), ("label", label), ("reward", reward),
                         ("doc_id", r["doc_id"]), ("source", r["source"]), ("meta", r["meta"]),
                         (DROP, drop), (DROP_DETAIL, None)):
                cols[k].append(v)
        return pa.table({k: pa.array(v, _OUT.field(k).type) for k, v in cols.items()})


@register_stage
class KtoConfig(StageConfig):
    """Feedback records as TRL unpaired-preference rows. YAML: `{kind: kto, prompt_format: fim}`."""

    kind: Literal["kto"] = "kto"
    prompt_format: Literal["fim", "prefix"] = "fim"
    fim_tokens: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_FIM),
                                       description="sentinel texts: prefix, suffix, middle")

    consumes = "training_record.v1"
    produces = "kto_example.v1"
    reads = ("doc_id", "kind", "segments", "source", "meta")
    writes = ("prompt", "completion", "label", "reward")

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        missing = sorted(set(DEFAULT_FIM) - set(self.fim_tokens))
        if missing:
            raise ValueError(f"fim_tokens lacks {missing}")
        return rel.map_batches(KtoFn(self.prompt_format, self.fim_tokens), KTO_EXAMPLE_V1, name="kto",
                               drop_log_key="doc_id")
