"""`feedback` records: every completion or inline edit shown to a user, with its outcome as a reward.

Why a kind of its own: policy-gradient and KTO-style training learn from every
suggestion the model made, not only from accepted text (`fim`) or from the rare
accepted/rejected pairs at one cursor (`preference`). One record per
`tab_completion` / `inline_edit` event with a suggestion and an outcome:

- segments: `user` (the inline-edit instruction, if any), `selection` (an
  inline edit's replaced text, from its diff: `edit_selection`), `prefix`, `suffix`
  (the FIM context around the cursor, or around the selection; not trained) and
  `completion` (the suggestion shown; trained): prefix + completion + suffix is the
  file the suggestion makes. Segments carry the text so `scrub_pii` scrubs it like any record.
- meta: `outcome`, `reward` (0..1), `label` (`reward >= label_threshold`),
  `latency_ms`, `accepted_chars`, `suggestion_chars`, and with retention on,
  `retained` / `next_event_id` / `retention_gap_ms`.

Rewards: accepted 1, rejected 0; `partial` and `ignored` are configurable:
`drop` (no record, `no_example:partial|ignored`), `negative` (reward 0) or
`fraction` (reward = accepted share of the suggestion's characters; 0 for ignored).

**Retention** (optional): is the accepted text still in the file at the next
event of the same session and file within `window_s`? Found by a self-join in
the plan (identical on every engine): events are keyed by (session, path) and
time bucket of `window_s`; each event with accepted text meets the events of its
bucket and the next (ids and times only); the earliest later one within the
window (ties by event id) wins through `min` over a sortable payload; then that
event's file state is joined and the flag says whether the accepted text occurs
in its `prefix + suffix`. Unknown (no such event) leaves the
reward alone; a deleted acceptance is reported (`use: report`), made negative
(`gate`) or its reward multiplied by `weight` (`weight`).
"""
from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from datakit.plan import DROP, Rel
from datakit.stages.extract.rules import accepted_text

SEP = "\x1f"
RT_NEXT = "_rt_next"  # the column the extract function reads: "<ms>\x1f<event id>\x1f<0|1>" or null
_KEY, _MS, _TEXT, _JKEY, _ID = "_rt_key", "_rt_ms", "_rt_text", "_rt_jkey", "_rt_id"
_NMS, _NID, _NCTX, _PAY = "_rt_next_ms", "_rt_next_id", "_rt_next_ctx", "_rt_payload"
FEEDBACK_EVENT_TYPES = ("tab_completion", "inline_edit")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class RetentionOptions(BaseModel):
    """Whether an accepted suggestion survives until the next event on the same file."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    window_s: float = Field(600.0, gt=0, description="the next event must come within this many seconds")
    use: Literal["report", "gate", "weight"] = Field(
        "report", description="report: only meta.retained; gate: deleted acceptances become negative; "
                              "weight: their reward is multiplied by `weight`")
    weight: float = Field(0.5, ge=0.0, le=1.0)


class FeedbackOptions(BaseModel):
    """How outcomes become rewards and labels (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    partial: Literal["drop", "negative", "fraction"] = "fraction"
    ignored: Literal["drop", "negative", "fraction"] = "drop"
    label_threshold: float = Field(0.5, gt=0.0, le=1.0, description="label = reward >= this")
    retention: RetentionOptions | None = None


def epoch_ms(ts: str | None) -> int | None:
    """Milliseconds since the epoch of an ISO-8601 UTC timestamp (ingest validated it), or None."""
    if not ts:
        return None
    try:
        t = dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return (t - _EPOCH) // dt.timedelta(milliseconds=1)  # integer arithmetic: no float rounding


def parse_next(payload: str | None) -> tuple[bool | None, str | None, int | None]:
    """(retained, next event id, its time in ms) from the retention join's payload."""
    if not payload:
        return None, None, None
    ms, eid, flag = payload.split(SEP)
    return flag == "1", eid, int(ms)


def reward_of(e: dict, opts: FeedbackOptions, retained: bool | None) -> tuple[float | None, str | None]:
    """(reward in [0, 1], None) for the event, or (None, "no_example:<why>") when the policy drops it."""
    outcome, suggestion = e.get("outcome"), e.get("suggestion") or ""
    if outcome == "accepted":
        reward = 1.0
    elif outcome == "rejected":
        reward = 0.0
    elif outcome in ("partial", "ignored"):
        policy = opts.partial if outcome == "partial" else opts.ignored
        if policy == "drop":
            return None, f"no_example:{outcome}"
        kept = accepted_text(e) or ""
        reward = 0.0 if policy == "negative" or not suggestion else min(1.0, len(kept) / len(suggestion))
    else:
        return None, f"no_example:{outcome or 'no_outcome'}"
    r = opts.retention
    if r is not None and retained is False and reward > 0:
        reward = 0.0 if r.use == "gate" else (reward * r.weight if r.use == "weight" else reward)
    return round(reward, 6), None


def edit_selection(prefix: str, suffix: str, suggestion: str, diff: str | None) -> tuple[str, str, str] | None:
    """(selection, suffix after it, replacement) of an inline edit, from its diff; None when they do not fit.

    An inline edit's `context.suffix` starts with the selection its suggestion replaces (the cursor is
    at the selection's start); which text that is, only the diff says. The record's prefix + replacement
    + the suffix after the selection is then the edited file. Why: found in review, every accepted
    inline-edit feedback record (153 of 153 in 2,000 synthetic events) kept the replaced lines in its
    suffix, so a KTO example taught writing the new code in front of the old (`return sum(xs)` above
    the loop it replaced). The replacement is the suggestion, with the file's CRLF line ends when the
    diff gave them (`rules.apply_unified_diff`)."""
    from datakit.stages.extract.rules import DiffError, apply_unified_diff

    if not diff:
        return None
    try:
        edited = apply_unified_diff(prefix + suffix, diff)
    except DiffError:
        return None
    for new in dict.fromkeys((suggestion, suggestion.replace("\r\n", "\n").replace("\n", "\r\n"))):
        if edited.startswith(prefix) and edited.startswith(new, len(prefix)):
            after = edited[len(prefix) + len(new):]
            if suffix.endswith(after):
                return suffix[:len(suffix) - len(after)], after, new
    return None


def feedback_records(e: dict, opts: FeedbackOptions, next_payload: str | None,
                     make_record: Any) -> tuple[list[dict], str | None]:
    """The feedback record of one event (`make_record` is extract_rules' record builder)."""
    et = e.get("event_type")
    if et not in FEEDBACK_EVENT_TYPES:
        return [], "no_example:not_feedback"
    suggestion = e.get("suggestion")
    if not suggestion:
        return [], "no_example:no_suggestion"
    retained, next_id, next_ms = parse_next(next_payload) if opts.retention is not None else (None, None, None)
    if accepted_text(e) is None:
        retained = None
    reward, why = reward_of(e, opts, retained)
    if why:
        return [], why
    c = e.get("context") or {}
    segs = []
    prefix, suffix = c.get("prefix") or "", c.get("suffix") or ""
    instr = next((m.get("content") for m in (e.get("messages") or []) if m and m.get("role") == "user"), None)
    if et == "inline_edit":
        around = edit_selection(prefix, suffix, suggestion, e.get("diff"))
        if around is None:
            return [], "no_example:edit_selection_unknown"
        selection, suffix, suggestion = around
        if instr:
            segs.append({"text": instr, "train": False, "role": "user"})
        segs.append({"text": selection, "train": False, "role": "selection"})
    segs += [{"text": prefix, "train": False, "role": "prefix"},
             {"text": suffix, "train": False, "role": "suffix"},
             {"text": suggestion, "train": True, "role": "completion"}]
    file = e.get("file") or {}
    kept = accepted_text(e)
    meta: dict[str, Any] = {"event_type": et, "outcome": e.get("outcome"), "reward": reward,
                            "label": reward >= opts.label_threshold, "latency_ms": e.get("latency_ms"),
                            "language": file.get("language"), "path": file.get("path"),
                            "suggestion_chars": len(suggestion), "accepted_chars": len(kept) if kept is not None else 0}
    if opts.retention is not None:
        meta["retained"] = retained
        if next_id is not None and retained is not None:
            meta["next_event_id"] = next_id
            start = epoch_ms(e.get("timestamp"))
            meta["retention_gap_ms"] = next_ms - start if start is not None else None
    return [make_record(e, "feedback", segs, meta)], None


# ------------------------------------------------------------------ the retention self-join

def _key(session: str | None, path: str | None) -> str | None:
    if not session or not path:
        return None
    return hashlib.sha256(f"{session}{SEP}{path}".encode()).hexdigest()


class RetentionKeysFn:
    """Side relation rows: `left` = events with accepted text (twice: time bucket b and b+1, with the
    text), `right` = every event with a file context (light: key, id, time), `context` = the file
    state (prefix + suffix) of every event with a context, by event id."""

    def __init__(self, window_ms: int, side: Literal["left", "right", "context"]) -> None:
        self.window_ms, self.side = window_ms, side

    def __call__(self, batch: pa.RecordBatch) -> pa.Table:
        cols: dict[str, list] = {n: [] for n in _SCHEMAS[self.side].names}
        W = self.window_ms
        for e in batch.select(["event_id", "event_type", "timestamp", "session_id", "file", "context", "outcome",
                               "suggestion", "accepted_text"]).to_pylist():
            key, ms = _key(e["session_id"], (e["file"] or {}).get("path")), epoch_ms(e["timestamp"])
            if key is None or ms is None or e["context"] is None:
                continue
            if self.side == "left":
                text = accepted_text(e) if e["event_type"] in FEEDBACK_EVENT_TYPES else None
                if not text:
                    continue
                for b in (ms // W, ms // W + 1):  # any event within (ms, ms + W] sits in one of these buckets
                    for k, v in ((_JKEY, f"{key}:{b}"), (_ID, e["event_id"]), (_MS, ms), (_TEXT, text)):
                        cols[k].append(v)
            elif self.side == "right":
                for k, v in ((_JKEY, f"{key}:{ms // W}"), (_NID, e["event_id"]), (_NMS, ms)):
                    cols[k].append(v)
            else:
                c = e["context"]
                cols[_NID].append(e["event_id"])
                cols[_NCTX].append((c.get("prefix") or "") + (c.get("suffix") or ""))
        return pa.table({k: pa.array(v, _SCHEMAS[self.side].field(k).type) for k, v in cols.items()})


class RetentionPairFn:
    """(event, candidate) pairs -> sortable payload `ms \x1f id` of the candidates that follow within the window."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms

    def __call__(self, batch: pa.RecordBatch) -> pa.Table:
        ids, pays, texts, drops = [], [], [], []
        for r in batch.select([_ID, _MS, _TEXT, _NID, _NMS]).to_pylist():
            ok = (r[_NMS], r[_NID]) > (r[_MS], r[_ID]) and r[_NMS] - r[_MS] <= self.window_ms
            ids.append(r[_ID])
            texts.append(r[_TEXT])
            pays.append(f"{r[_NMS]:015d}{SEP}{r[_NID]}" if ok else None)
            drops.append(None if ok else "not_next")
        return pa.table({_ID: pa.array(ids, pa.string()), _PAY: pa.array(pays, pa.string()),
                         _TEXT: pa.array(texts, pa.string()), DROP: pa.array(drops, pa.string())})


class RetentionNextIdFn:
    """The chosen next event's id, split out of the payload (to fetch its file state)."""

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        nid = [p.split(SEP)[1] for p in batch.column(_PAY).to_pylist()]
        return batch.append_column(_NID, pa.array(nid, pa.string()))


class RetentionFlagFn:
    """`_rt_next` = payload + whether the accepted text occurs in the next event's file state."""

    def __call__(self, batch: pa.RecordBatch) -> pa.Table:
        rows = batch.select([_ID, _PAY, _TEXT, _NCTX]).to_pylist()
        return pa.table({_ID: pa.array([r[_ID] for r in rows], pa.string()),
                         RT_NEXT: pa.array([f"{r[_PAY]}{SEP}{int(r[_TEXT] in (r[_NCTX] or ''))}" for r in rows],
                                           pa.string())})


_SCHEMAS = {
    "left": pa.schema([(_JKEY, pa.string()), (_ID, pa.string()), (_MS, pa.int64()), (_TEXT, pa.string())]),
    "right": pa.schema([(_JKEY, pa.string()), (_NID, pa.string()), (_NMS, pa.int64())]),
    "context": pa.schema([(_NID, pa.string()), (_NCTX, pa.string())]),
}
_PAIRS = pa.schema([(_ID, pa.string()), (_PAY, pa.string()), (_TEXT, pa.string())])
_NEXT_IDS = pa.schema([(_ID, pa.string()), (_PAY, pa.string()), (_TEXT, pa.string()), (_NID, pa.string())])
_FLAGS = pa.schema([(_ID, pa.string()), (RT_NEXT, pa.string())])


def with_retention(events: Rel, window_s: float) -> Rel:
    """`events` plus column `_rt_next` (see module docstring); the side work is not counted as drops.

    The pair join carries only keys, times and the (short) accepted text; the file
    state (often a whole file) is joined once per accepted event, for the chosen
    next event only, so a busy file costs pairs of ids, not pairs of files.
    """
    W = max(1, int(round(window_s * 1000)))
    side = Rel(events.node, f"{events.stage}:side")
    left = side.map_batches(RetentionKeysFn(W, "left"), _SCHEMAS["left"], name="retention_accepted")
    right = side.map_batches(RetentionKeysFn(W, "right"), _SCHEMAS["right"], name="retention_followers")
    states = side.map_batches(RetentionKeysFn(W, "context"), _SCHEMAS["context"], name="retention_file_states")
    pairs = left.join(right, _JKEY).map_batches(RetentionPairFn(W), _PAIRS, name="retention_pairs")
    # every pair of one accepted event carries the same text, so `min` of it is that text
    nxt = pairs.aggregate([_ID], {_PAY: ("min", _PAY), _TEXT: ("min", _TEXT)})
    nxt = nxt.map_batches(RetentionNextIdFn(), _NEXT_IDS, name="retention_next_ids")
    flags = nxt.join(states, _NID).map_batches(RetentionFlagFn(), _FLAGS, name="retention_flags")
    return events.join(Rel(flags.node, events.stage), "event_id", _ID, how="left")
