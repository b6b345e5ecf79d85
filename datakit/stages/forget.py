"""Forget: apply a deletion or opt-out that arrived after an output was written (see docs/lineage.md).

Why a stage of its own (not a `consent` mode): it runs on training records, not
events, and matches by the lineage the records carry (`source`, `meta.event_ids`),
so a deletion reaches every record an event went into without re-running the
pipeline. The lists are the same files `consent` reads, plus an `event_id` column.
"""
from __future__ import annotations

import json
from typing import ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from datakit.io.fs import InputError, expand
from datakit.plan import DROP, Rel
from datakit.stages.base import CompileContext, StageConfig, register_stage
from datakit.stages.consent import OPTOUT_SUFFIXES, ids_digest, read_id_lists

def _digest(field: str, value: str) -> str:
    import hashlib

    return hashlib.sha256(f"{field}\x00{value}".encode()).hexdigest()[:16]


def lineage_digests(source: dict | None, meta: str | None) -> list[str]:
    """Digests of the ids `ForgetFn` matches a record by (user, org, event ids), sorted.

    Why digests: the dedup state keeps what it needs of *dropped* duplicates (their band keys) for
    later runs; a deletion list must still find them (`list_digests`), without the state holding
    the ids themselves."""
    s = source or {}
    out = set()
    for field, value in (("user_id", s.get("user_id")), ("org_id", s.get("org_id")), ("event_id", s.get("event_id"))):
        if value is not None:
            out.add(_digest(field, str(value)))
    if meta and "event_ids" in meta:
        for e in json.loads(meta).get("event_ids") or []:
            out.add(_digest("event_id", str(e)))
    return sorted(out)


def list_digests(users: tuple[str, ...], orgs: tuple[str, ...], events: tuple[str, ...]) -> set[str]:
    """The `lineage_digests` a deletion list matches."""
    return ({_digest("user_id", u) for u in users} | {_digest("org_id", o) for o in orgs}
            | {_digest("event_id", e) for e in events})


class ForgetFn:
    """Batch function over training records: `_drop` = opt_out_user / opt_out_org / deleted_event by lineage.

    Matches `source.user_id`, `source.org_id`, and the event ids of `source.event_id`
    plus `meta.event_ids` (a preference pair names both of its events there) and `meta.next_event_id`
    (the event a feedback record's retention was judged from).
    """

    def __init__(self, users: tuple[str, ...] = (), orgs: tuple[str, ...] = (), events: tuple[str, ...] = ()) -> None:
        self.users, self.orgs, self.events = tuple(sorted(set(users))), tuple(sorted(set(orgs))), tuple(sorted(set(events)))

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        users, orgs, events = set(self.users), set(self.orgs), set(self.events)
        src = batch.column("source").to_pylist()
        metas = batch.column("meta").to_pylist()
        drops: list[str | None] = []
        for s, m in zip(src, metas, strict=True):
            s = s or {}
            reason = None
            if s.get("user_id") in users:
                reason = "opt_out_user"
            elif s.get("org_id") in orgs:
                reason = "opt_out_org"
            elif events:
                ids = {s.get("event_id")}
                if m and ("event_ids" in m or "next_event_id" in m):
                    mm = json.loads(m)
                    ids.update(mm.get("event_ids") or [])
                    # a feedback record's retention label was read from the next event's file: a deletion of
                    # that event reaches it too (found in review: forget kept the deleted event's id, and the
                    # label made from its content, where consent before extract gave another label)
                    if mm.get("next_event_id") is not None:
                        ids.add(mm["next_event_id"])
                if ids & events:
                    reason = "deleted_event"
            drops.append(reason)
        return batch.append_column(DROP, pa.array(drops, pa.string()))


@register_stage
class ForgetConfig(StageConfig):
    """Apply a later deletion / opt-out to an existing training-record output (see docs/lineage.md).

    `optouts` are the same files as for `consent` (user_id and/or org_id columns),
    plus an optional `event_id` column to delete single events. Matching uses the
    records' lineage (`source`, `meta.event_ids`). Removed doc_ids go to the drop
    log (`_dropped/`), the audit trail of what the deletion touched.
    """

    kind: Literal["forget"] = "forget"
    optouts: str | list[str] = Field(..., description="deletion list path(s)/glob(s): user_id, org_id and/or event_id columns")
    path_fields = ("optouts",)

    consumes = "training_record.v1"
    produces = "training_record.v1"
    reads = ("source", "meta")
    # other outputs that carry the same lineage (`source`, `meta`): filtered the same way, contract unchanged
    passes_through: ClassVar[tuple[str, ...]] = ("kto_example.v1",)

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        paths = [self.optouts] if isinstance(self.optouts, str) else list(self.optouts)
        try:
            files = expand([ctx.resolve(p) for p in paths], suffixes=OPTOUT_SUFFIXES)
        except InputError as e:  # found in a docs review: "input not found: ..." named no stage or field
            raise InputError(f"stage forget: optouts: {e}") from None
        lists = read_id_lists(files)
        ctx.record("optouts", ids_digest(lists["user_id"], lists["org_id"], lists["event_id"]))
        fn = ForgetFn(lists["user_id"], lists["org_id"], lists["event_id"])
        return rel.map_batches(fn, rel.schema, name="forget", drop_log_key="doc_id")
