"""Extract: editor events -> training records (code, fim, sft, preference, feedback).

The rules live in `datakit.stages.extract.rules`; this module is the stage:
config, the batch function, and the plan for preference pairing.

Accounting of an expanding stage: the batch function returns the records of a
batch *plus*, for every event that yielded none, one placeholder row whose
`_drop` says why (`no_example:<why>`, `_drop_detail` = the event id). The engine
counts and removes the placeholders, so the stage reports rows_in = events,
dropped = events without a record, rows_out = events with at least one record,
and `emitted` = records (`emits = "records"`).

Preference pairs need events that may sit in different batches, files or
partitions, so they are formed by the engine, not in a batch:

    events -> map(candidate key + payloads) -> aggregate(min per context) ─┐
           └──────────────────────────────────────── left join on context ┴-> map(extract)

`min` over payloads that start with the event id picks the same pair on every
engine and partitioning. The pair record is emitted by the accepted event.

`feedback` records (rules and the retention self-join: `extract_feedback`) take
one more join when retention is on: each event gets the payload of the next
event on its file (`_rt_next`) before the extract function runs.
"""
from __future__ import annotations

from typing import Literal

import pyarrow as pa
from pydantic import Field, field_validator

from datakit.contracts import EDITOR_EVENT_V1, RECORD_KINDS, TRAINING_RECORD_V1
from datakit.plan import DROP, DROP_DETAIL, Rel
from datakit.stages.base import CompileContext, StageConfig, register_stage
from datakit.stages.extract.feedback import RT_NEXT, FeedbackOptions, feedback_records, with_retention
from datakit.stages.extract.rules import _record, extract_event, preference_candidate

PREF_CTX, PREF_ACC, PREF_REJ = "_pref_ctx", "_pref_acc", "_pref_rej"
PAIR_ACC, PAIR_REJ = "_pair_acc", "_pair_rej"
_OUT_SCHEMA = pa.schema(list(TRAINING_RECORD_V1) + [(DROP, pa.string()), (DROP_DETAIL, pa.string())])


class PreferenceKeysFn:
    """Add the preference candidate columns (context key, accepted / rejected payload) to events."""

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        keys, acc, rej = [], [], []
        for e in batch.to_pylist():
            k, a, r = preference_candidate(e)
            keys.append(k); acc.append(a); rej.append(r)
        for name, col in ((PREF_CTX, keys), (PREF_ACC, acc), (PREF_REJ, rej)):
            batch = batch.append_column(name, pa.array(col, pa.string()))
        return batch


class ExtractFn:
    """Batch of events -> batch of training records (+ one `_drop` placeholder per event without any)."""

    def __init__(self, kinds: tuple[str, ...], feedback: FeedbackOptions | None = None) -> None:
        self.kinds = tuple(k for k in kinds if k != "feedback")
        self.feedback = feedback if "feedback" in kinds else None

    def __call__(self, batch: pa.RecordBatch) -> pa.Table:
        names = batch.schema.names
        pair_acc = batch.column(PAIR_ACC).to_pylist() if PAIR_ACC in names else None
        pair_rej = batch.column(PAIR_REJ).to_pylist() if PAIR_REJ in names else None
        nxt = batch.column(RT_NEXT).to_pylist() if RT_NEXT in names else None
        rows: list[dict] = []
        for i, e in enumerate(batch.to_pylist()):
            records, why = extract_event(e, self.kinds, pair_acc[i] if pair_acc else None,
                                         pair_rej[i] if pair_rej else None) if self.kinds else ([], None)
            if self.feedback is not None:
                fb, fb_why = feedback_records(e, self.feedback, nxt[i] if nxt else None, _record)
                records = records + fb
                # the other kinds' reason, unless it only says "not my event type" (then feedback's says more)
                if why is None or why.startswith("no_example:not_"):
                    why = fb_why or why
            if records:
                rows.extend(records)
            else:
                rows.append({DROP: why, DROP_DETAIL: e.get("event_id")})
        return pa.Table.from_pylist(rows, schema=_OUT_SCHEMA)


@register_stage
class ExtractConfig(StageConfig):
    """Turn editor events into training records of the selected kinds (see extract_rules for the rules)."""

    kind: Literal["extract"] = "extract"
    kinds: list[Literal["code", "fim", "sft", "preference", "feedback"]] = Field(
        default_factory=lambda: ["code", "fim", "sft"],
        description="record kinds to emit: code, fim, sft, preference, feedback")
    feedback: FeedbackOptions = Field(
        default_factory=FeedbackOptions,
        description="feedback kind: rewards of partial/ignored outcomes, label threshold, retention signal")

    consumes = "editor_event.v1"
    produces = "training_record.v1"
    emits = "records"
    reads = tuple(n for n in EDITOR_EVENT_V1.names if not n.startswith("_"))
    writes = tuple(TRAINING_RECORD_V1.names)

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError(f"select at least one of {list(RECORD_KINDS)}")
        # canonical order and no repeats: the config (and its hash) means the same whatever the spelling
        return [k for k in RECORD_KINDS if k in v]

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        from datakit.stages.consent import ConsentFn

        kinds = tuple(self.kinds)
        fn = ExtractFn(kinds, self.feedback)
        # privacy-mode events never become records, with or without a consent stage before (found in review:
        # ingest then extract trained on them, and records carry no flag a later stage could catch); with
        # consent first there are none left here. Before pairing and retention, which read other events too
        rel = rel.map_batches(ConsentFn(), rel.schema, name="extract_privacy_mode")
        if "feedback" in kinds and self.feedback.retention is not None:
            rel = with_retention(rel, self.feedback.retention.window_s)
        if "preference" not in kinds:
            return rel.map_batches(fn, TRAINING_RECORD_V1, name="extract")
        keyed_schema = pa.schema(list(rel.schema) + [(PREF_CTX, pa.string()), (PREF_ACC, pa.string()), (PREF_REJ, pa.string())])
        keyed = rel.map_batches(PreferenceKeysFn(), keyed_schema, name="preference_keys")
        best = keyed.aggregate([PREF_CTX], {PAIR_ACC: ("min", PREF_ACC), PAIR_REJ: ("min", PREF_REJ)})
        joined = keyed.join(best, PREF_CTX, PREF_CTX, how="left")
        return joined.map_batches(fn, TRAINING_RECORD_V1, name="extract")
