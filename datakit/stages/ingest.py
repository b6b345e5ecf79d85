"""Ingest: parse and validate editor events; every bad line goes to quarantine with a reason.

Why per-line validation here (and not `pyarrow.json`): one malformed line must
cost one quarantine row, never the batch or the job, and the reason must be
precise enough for an operator to fix the producer (`bad_json`, `missing_field`
with the field's *name* — never its value, which may be personal data).

Reasons: `bad_utf8`, `bad_json`, `not_an_object`, `unknown_event_type`,
`missing_field`, `wrong_type`, `bad_value`, `duplicate_key`, `bad_timestamp`,
`line_too_long`, `truncated_file`, `damaged_row_group`, `unreadable_file`, `blank_line`, and the
safety net `unconvertible` (a value Arrow refused that no rule above caught).

The strict rule (README, "Input rules"): no coercion -- a field has its JSON
type or the line is quarantined; a key repeated with different values is
`duplicate_key` (so a conflicting `privacy_mode` can never mean "off"); Parquet
rows are checked by the very same code (the reader hands them over as JSON).
"""
from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone
from typing import Any, Callable, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from datakit.contracts import (EDITOR_EVENT_V1, EVENT_TYPES, MESSAGE_ROLES, OUTCOMES, REQUIRED_ALWAYS,
                               REQUIRED_BY_TYPE)
from datakit.plan import DROP, DROP_DETAIL, METRICS, Rel, metrics_column
from datakit.stages.base import CompileContext, StageConfig, register_stage
from datakit.stages.json_depth import json_too_deep
from datakit.stages.quarantine import QuarantineRaw, quarantine_raw, quarantine_scrubber, scrub_lines

log = logging.getLogger(__name__)

# reasons for input that could not be read at all (a file cut short, not a file of its format, a row group
# that does not decode): the run goes on without that data, and says so (pipeline.py's warning)
DAMAGED_INPUT_REASONS = frozenset(("truncated_file", "unreadable_file", "damaged_row_group"))

_STR = (str,)
_FIELD_TYPES: dict[str, Any] = {
    "event_id": _STR, "event_type": _STR, "timestamp": _STR, "user_id": _STR, "org_id": _STR,
    "session_id": _STR, "client_version": _STR, "privacy_mode": (bool,), "suggestion": _STR,
    "outcome": _STR, "accepted_text": _STR, "diff": _STR, "latency_ms": (int,),
}
_STRUCTS = {"repo": ("repo_id", "commit"), "file": ("path", "language"), "context": ("prefix", "suffix")}
_OUT_FIELDS = [f.name for f in EDITOR_EVENT_V1 if not f.name.startswith("_")]


class InvalidEvent(ValueError):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


_INT64_MAX = 2**63 - 1
_IDS = ("event_id", "user_id", "org_id", "session_id")
_KNOWN_KEYS = frozenset(_FIELD_TYPES) | frozenset(_STRUCTS) | {k for ks in _STRUCTS.values() for k in ks} | {
    "messages", "role", "content", "tool_name"}
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# ids hold no control character: NUL cut ids in tools that treat them as C strings, and the unit separator
# \x1f is what datakit's own keys join parts with (found in review: it made events of different sessions pair)
# and none of Unicode's other invisible controls: C1 controls (U+0080-U+009F, U+0085 a line break to some
# tools), format characters (zero-width spaces and joiners, bidirectional overrides that display an id
# reversed, the byte-order mark, tag characters) and the line / paragraph separators (found in a
# hostile-input review: all were accepted although this rule says "no control character")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"
                      "\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
                      "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
                      "\U000e0001\U000e0020-\U000e007f]")


def _strict_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads` object hook: a key given twice with *different* values makes the line invalid.

    Python's json keeps the last value silently, so `{"privacy_mode": true, ...,
    "privacy_mode": false}` would turn privacy off. The rule is the same for every
    field (equal repeats are harmless and accepted): a conflict is `duplicate_key`.
    The detail names the key only if it is a contract field (a key is input text).
    """
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: dict[str, Any] = {}
        for k, v in pairs:
            # compared as JSON: Python says 0 == False and 5 == 5.0, so `"privacy_mode": 0, "privacy_mode":
            # false` was an equal repeat and kept false, while `true, 1` was rejected (found in review)
            if k in seen and _as_json(seen[k]) != _as_json(v):
                raise InvalidEvent("duplicate_key", k if k in _KNOWN_KEYS else "")
            seen[k] = v
    return d


def _as_json(v: Any) -> str:
    return json.dumps(v, sort_keys=True, ensure_ascii=True)


def _has_lone_surrogate(v: Any) -> bool:
    """A `\\ud800`-style escape decodes to a str that cannot be encoded as UTF-8 (Arrow would raise)."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(v, dict):
        return any(_has_lone_surrogate(x) for x in v.values())
    if isinstance(v, list):
        return any(_has_lone_surrogate(x) for x in v)
    return False


def _same_lines(text: str) -> str:
    """`text` without its line ends' kind and trailing blanks (what an editor's accept may change)."""
    return "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").split("\n")).rstrip()


def normalize_timestamp(value: str) -> str:
    """ISO-8601 -> canonical UTC `YYYY-MM-DDTHH:MM:SS.mmmZ` (naive times are taken as UTC).

    Raises ValueError for text that is not ISO-8601 *and* for a valid time whose
    UTC value falls outside years 1..9999 (`0001-01-01T00:00:00+01:00`).
    """
    dt = datetime.fromisoformat(value)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    try:
        return dt.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except OverflowError:
        raise ValueError("timestamp out of range in UTC") from None


def validate_event(obj: Any) -> dict[str, Any]:
    """Return the event as a dict of the contract's fields, or raise `InvalidEvent`.

    Types are strict, with no coercion: a string field takes a JSON string, a
    boolean a JSON `true`/`false` (never `"false"` or `0`), an integer a JSON
    integer within int64 (`latency_ms` also >= 0, as the contract says). Ids are
    non-empty (contract: minLength 1) and hold no control character (NUL: tools that
    treat ids as C strings cut them there, so two different ids would collide; `\x1f`:
    datakit's keys join parts with it).
    """
    if not isinstance(obj, dict):
        raise InvalidEvent("not_an_object")
    et = obj.get("event_type")
    if et is not None and not isinstance(et, str):
        raise InvalidEvent("wrong_type", "event_type")
    if et is not None and et not in EVENT_TYPES:
        raise InvalidEvent("unknown_event_type", "event_type")
    for name in REQUIRED_ALWAYS + (REQUIRED_BY_TYPE.get(et, ()) if et else ()):
        if obj.get(name) is None:
            raise InvalidEvent("missing_field", name)
    out: dict[str, Any] = {}
    for name in _OUT_FIELDS:
        v = obj.get(name)
        if v is None:
            out[name] = None
            continue
        if name in _FIELD_TYPES:
            types = _FIELD_TYPES[name]
            if not isinstance(v, types) or (types == (int,) and isinstance(v, bool)):
                raise InvalidEvent("wrong_type", name)
            out[name] = v
        elif name in _STRUCTS:
            if not isinstance(v, dict):
                raise InvalidEvent("wrong_type", name)
            sub = {}
            for k in _STRUCTS[name]:
                x = v.get(k)
                if x is not None and not isinstance(x, str):
                    raise InvalidEvent("wrong_type", f"{name}.{k}")
                sub[k] = x
            out[name] = sub
        elif name == "messages":
            if not isinstance(v, list):
                raise InvalidEvent("wrong_type", "messages")
            msgs = []
            for m in v:
                if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                    raise InvalidEvent("wrong_type", "messages.role")
                if m["role"] not in MESSAGE_ROLES:  # the value goes into the records' segments unscrubbed
                    raise InvalidEvent("bad_value", "messages.role")
                c, t = m.get("content"), m.get("tool_name")
                if (c is not None and not isinstance(c, str)) or (t is not None and not isinstance(t, str)):
                    raise InvalidEvent("wrong_type", "messages.content")
                msgs.append({"role": m["role"], "content": c, "tool_name": t})
            out[name] = msgs
    if out["outcome"] is not None and out["outcome"] not in OUTCOMES:
        raise InvalidEvent("bad_value", "outcome")
    # the contract: a partial acceptance keeps a prefix of the suggestion. Another text would be trained
    # as the model's completion of a context it was never suggested for (found in review)
    if out["outcome"] == "partial" and out.get("accepted_text") is not None and out.get("suggestion") is not None \
            and not out["suggestion"].startswith(out["accepted_text"]):
        raise InvalidEvent("bad_value", "accepted_text")
    # and an acceptance keeps the suggestion (line ends and trailing blanks aside, which editors adjust): found
    # in review, `accepted` with another text became FIM middles, `chosen` sides and reward-1 feedback of text
    # the model never suggested
    if out["outcome"] == "accepted" and out.get("accepted_text") is not None and out.get("suggestion") is not None \
            and _same_lines(out["accepted_text"]) != _same_lines(out["suggestion"]):
        raise InvalidEvent("bad_value", "accepted_text")
    lat = out["latency_ms"]
    if lat is not None and not 0 <= lat <= _INT64_MAX:
        raise InvalidEvent("bad_value", "latency_ms")
    for name in _IDS:
        if not out[name] or _CONTROL.search(out[name]):
            raise InvalidEvent("bad_value", name)
    try:
        out["timestamp"] = normalize_timestamp(out["timestamp"])
    except ValueError:
        raise InvalidEvent("bad_timestamp", "timestamp") from None
    repo = out.get("repo")
    if repo and repo.get("repo_id") and _URL_CREDENTIALS.match(repo["repo_id"]):
        repo["repo_id"] = _URL_CREDENTIALS.sub(r"\1", repo["repo_id"], count=1)
    return out


# A repo id given as a clone URL may carry its credentials (`https://x-access-token:ghp_...@github.com/o/r`):
# the id is kept without them. Why here: the repo id is lineage (`source.repo_id`), which scrub_pii does not
# read, so a token there reached every record of the repository (found in a privacy review).
# A password may hold `/` or `@` as pasted (`deploy:wJalr/XUtn...@github.com`, `u:p@ssw0rd@github.com`; found in
# review: the first kept `wJalr/` and more, the second `ssw0rd@`): a `user:password@` runs to the last `@`
# that a dotted host follows; a bare `user@` (`ssh://git@host`) has neither `/` nor `@`.
_URL_CREDENTIALS = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)"
                              r"(?:[^/@\s:]*:\S*@(?=[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+(?::\d+)?(?:/|$))|[^/@\s]+@)")


def unknown_fields(obj: dict[str, Any]) -> bool:
    """Whether a valid event holds a field the contract does not name (top level, in `repo`/`file`/
    `context`, or in a message). Such fields are not read: a newer client's fields never cost the
    event, and nothing unread can reach the output. They are counted (`events_with_unknown_fields` in
    the ingest stage's metrics) so a producer's drift is seen, where it was silent (found in review)."""
    if any(k not in _KNOWN_TOP for k in obj):
        return True
    for name, keys in _STRUCTS.items():
        v = obj.get(name)
        if isinstance(v, dict) and any(k not in keys for k in v):
            return True
    return any(isinstance(m, dict) and any(k not in _MESSAGE_KEYS for k in m) for m in obj.get("messages") or ())


_KNOWN_TOP = frozenset(_OUT_FIELDS)
_MESSAGE_KEYS = frozenset(("role", "content", "tool_name"))


def _huge_int(digits: str) -> int | float:
    limit = sys.get_int_max_str_digits()  # what int() refuses beyond (0: no limit)
    if not limit or len(digits.lstrip("-")) <= limit:
        return int(digits)
    return float("-inf") if digits.startswith("-") else float("inf")


def _loads_huge_ints(text: str) -> Any:
    """`json.loads` of a line holding an integer of more digits than Python makes an int of (4,300), which
    becomes an infinity: no field of the contract takes one (such a field's value is then a `wrong_type`),
    and a field it does not name is not read. Found in a hostile-input review: a 5,000-digit number in an
    unknown field made the whole line `bad_json`, although a field the contract does not name never costs
    its event. Only lines that fail so take this slower path (a Python call per integer)."""
    try:
        return json.loads(text, object_pairs_hook=_strict_object, parse_int=_huge_int)
    except InvalidEvent:
        raise
    except (ValueError, RecursionError):
        raise InvalidEvent("bad_json") from None


def parse_line(raw: bytes, unknown: list[bool] | None = None) -> dict[str, Any]:
    """One raw line -> a valid event dict, or `InvalidEvent` (never any other exception). `unknown`,
    when given, gets whether the event held fields the contract does not name (`unknown_fields`)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidEvent("bad_utf8") from None
    # by the text, not by the parser's RecursionError, whose depth depends on the caller's stack (so on
    # the engine: found in review, a line nested ~960 deep was kept on Spark and quarantined locally)
    if json_too_deep(text):
        raise InvalidEvent("bad_json", "nesting too deep")
    try:
        obj = json.loads(text, object_pairs_hook=_strict_object)
    except InvalidEvent:
        raise
    except RecursionError:
        raise InvalidEvent("bad_json", "nesting too deep") from None
    except ValueError as e:
        if "digits" not in str(e):  # not JSON
            raise InvalidEvent("bad_json") from None
        obj = _loads_huge_ints(text)
    event = validate_event(obj)
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(event):
        raise InvalidEvent("bad_utf8", "lone surrogate escape")
    if unknown is not None:
        unknown.append(unknown_fields(obj))
    return event


def _to_arrow(rows: list[dict[str, Any]], drops: list, details: list, raws: list, kept_raw: list) -> pa.Table:
    """Rows -> EDITOR_EVENT_V1 table. The validator should have caught every value Arrow
    refuses; if one slips through anyway, *that row* is quarantined (`unconvertible`,
    detail = the error class), found by converting rows one at a time -- never the job."""
    try:
        return pa.Table.from_pylist(rows, schema=EDITOR_EVENT_V1)
    except (pa.ArrowException, OverflowError, ValueError, TypeError, UnicodeError):
        pass
    for i, row in enumerate(rows):
        if drops[i] is not None:
            continue
        try:
            pa.Table.from_pylist([row], schema=EDITOR_EVENT_V1)
        except (pa.ArrowException, OverflowError, ValueError, TypeError, UnicodeError) as e:
            empty = dict.fromkeys(_OUT_FIELDS)
            empty["_source_file"], empty["_source_line"] = row["_source_file"], row["_source_line"]
            rows[i] = empty
            drops[i], details[i], raws[i] = "unconvertible", type(e).__name__, kept_raw[i]
    return pa.Table.from_pylist(rows, schema=EDITOR_EVENT_V1)


class IngestFn:
    """Picklable batch function: RAW_LINES (JSON Lines, or Parquet rows as JSON) -> EDITOR_EVENT_V1 (+ `_drop`)."""

    def __init__(self, raw_mode: QuarantineRaw = "scrubbed") -> None:
        self.raw_mode = raw_mode
        self._scrub: Callable[[list[str]], list[str | None]] | None = None
        self._ready = False

    def __getstate__(self) -> dict[str, Any]:
        return {"raw_mode": self.raw_mode}  # the scrubber is built per worker by setup(), never pickled

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["raw_mode"])  # type: ignore[misc]

    def setup(self) -> None:
        """Build the quarantine scrubber (`raw_mode: scrubbed`) once per worker process; when it cannot
        be loaded, quarantined lines are hashed (quarantine_raw)."""
        if self.raw_mode == "scrubbed":
            try:
                self._scrub = lambda texts, fn=quarantine_scrubber(): scrub_lines(fn, texts)
            except (ImportError, OSError):
                self._scrub = None
        self._ready = True

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if not self._ready:  # a direct call, not through an engine (which calls setup once per worker)
            self.setup()
        files = batch.column("_source_file").to_pylist()
        lines = batch.column("_source_line").to_pylist()
        raw_col = batch.column("_raw").to_pylist()
        errs = batch.column("_read_error").to_pylist()
        rows: list[dict[str, Any]] = []
        drops: list[str | None] = []
        details: list[str | None] = []
        raws: list[bytes | None] = []
        unknown: list[bool] = []
        for i, (raw, err) in enumerate(zip(raw_col, errs)):
            reason = detail = None
            event = None
            if err is not None:
                reason = err.split(":", 1)[0]
                detail = err.split(":", 1)[1].strip() if ":" in err else None
            else:
                try:
                    event = parse_line(raw, unknown)
                except InvalidEvent as e:
                    reason, detail = e.reason, e.detail or None
            if event is None:
                event = dict.fromkeys(_OUT_FIELDS)
                raws.append(raw)
            else:
                raws.append(None)
            event["_source_file"], event["_source_line"] = files[i], lines[i]
            rows.append(event)
            drops.append(reason)
            details.append(detail)
        out = _to_arrow(rows, drops, details, raws, raw_col)
        offsets = (batch.column("_offset").to_pylist() if "_offset" in batch.schema.names
                   else [None] * batch.num_rows)
        out = out.append_column(DROP, pa.array(drops, pa.string()))
        out = out.append_column(DROP_DETAIL, pa.array(details, pa.string()))
        out = out.append_column("_raw", pa.array(quarantine_raw(raws, offsets, self.raw_mode, self._scrub), pa.binary()))
        n_unknown = sum(unknown)
        kept = next((i for i, d in enumerate(drops) if d is None), 0)
        out = out.append_column(METRICS, metrics_column(out.num_rows, {"events_with_unknown_fields": n_unknown}
                                                        if n_unknown else {}, kept))
        return out.combine_chunks().to_batches()[0] if out.num_rows else pa.RecordBatch.from_pylist([], schema=out.schema)


_LOC_SCHEMA = pa.schema([("event_id", pa.string()), ("_source_file", pa.string()), ("_source_line", pa.int64()),
                        ("_loc", pa.string())])
_REPEAT_SCHEMA = pa.schema([("_source_file", pa.string()), ("_source_line", pa.int64())])


def _location(batch: pa.RecordBatch) -> pa.Array:
    """`P file\0line`: P is "0" for a copy in privacy mode, else "1", and the line is zero-padded, so
    the smallest is the first copy read among the most private ones (see `EventLocations`)."""
    lines = pc.utf8_lpad(pc.cast(batch.column("_source_line"), pa.string()), 12, "0")
    private = pc.if_else(pc.fill_null(batch.column("privacy_mode"), False), "0", "1")
    where = pc.binary_join_element_wise(batch.column("_source_file"), lines, "\x00")
    return pc.binary_join_element_wise(private, where, "")


class EventLocations:
    """event_id -> where this copy of it was read (for choosing the copy of a duplicated id that stays).

    The copy kept is the first one read, unless another copy is in privacy mode: then the first of
    those. Found in review: two copies of one event, one with `privacy_mode: true`, kept whichever file
    sorted first, so the event was trained on when the private copy came second; a conflicting
    privacy flag never means off (the rule `duplicate_key` follows inside one line), so the kept copy
    is the private one, which consent then drops."""

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([batch.column("event_id"), batch.column("_source_file"),
                                           batch.column("_source_line"), _location(batch)], schema=_LOC_SCHEMA)

    def spark_select(self, df, F):
        """The same in Spark SQL (`MapBatches`), so the JVM feeds the id count with no Python pass.
        (Spark's lpad would cut a longer number to 12 characters; a line number has fewer digits.)"""
        line = F.lpad(F.col("_source_line").cast("string"), 12, "0")
        private = F.when(F.coalesce(F.col("privacy_mode"), F.lit(False)), F.lit("0")).otherwise(F.lit("1"))
        return df.select("event_id", "_source_file", "_source_line",
                         F.concat(private, F.col("_source_file"), F.lit("\x00"), line).alias("_loc"))


_REPEATED_IDS_SCHEMA = pa.schema([("event_id", pa.string()), ("_first", pa.string())])


class RepeatedIds:
    """Side relation: the event ids read more than once, with the location of their first copy.

    A filter, not a `_drop` mark: the side branch belongs to no stage's accounting, so nothing
    would count those drops, and a filter has a Spark SQL twin (`spark_select`).
    """

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        repeated = pc.fill_null(pc.greater(batch.column("_copies"), 1), False)
        return pa.RecordBatch.from_arrays([batch.column("event_id").filter(repeated), batch.column("_first").filter(repeated)],
                                          schema=_REPEATED_IDS_SCHEMA)

    def spark_select(self, df, F):
        """The same in Spark SQL (`MapBatches`). Why: at 100k events the id count and this Python
        pass over every distinct id (a job of their own on Spark) took 2.4 s to keep none of them."""
        return df.where(F.col("_copies") > 1).select("event_id", "_first")


class RepeatedCopies:
    """Side relation: the locations of every copy of an event id but the first one read.

    A filter with a Spark SQL twin, like `RepeatedIds`: the anti join below is the real drop.
    """

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        later = pc.fill_null(pc.not_equal(batch.column("_loc"), batch.column("_first")), False)
        return pa.RecordBatch.from_arrays([batch.column("_source_file").filter(later), batch.column("_source_line").filter(later)],
                                          schema=_REPEAT_SCHEMA)

    def spark_select(self, df, F):
        """The same in Spark SQL: the whole side branch then runs in the JVM, inside the broadcast
        that feeds the anti join, with no Python pass and no job of its own."""
        return df.where(F.col("_loc") != F.col("_first")).select("_source_file", "_source_line")


class QuarantineOptions(BaseModel):
    """`quarantine: {raw: scrubbed | hash | verbatim}` -- what `_quarantine/` keeps of a rejected line."""

    model_config = ConfigDict(extra="forbid")
    raw: QuarantineRaw = "scrubbed"


@register_stage
class IngestConfig(StageConfig):
    """Parse + validate editor events (JSON Lines or Parquet) against editor_event.v1.

    `drop_duplicate_events` (default on): log shippers retry, so the same event can
    arrive twice; later copies of an `event_id` are dropped (`duplicate_event_id`),
    keeping the first one read (the first one in privacy mode, if any copy is). Without this, every record derived from the event
    would be duplicated downstream under the same `doc_id`.
    """

    kind: Literal["ingest"] = "ingest"
    drop_duplicate_events: bool = True
    quarantine: QuarantineOptions = Field(default_factory=lambda: QuarantineOptions())
    consumes = "raw"
    produces = "editor_event.v1"
    reads = ("_raw", "_source_file", "_source_line", "_read_error", "_offset")
    writes = tuple(EDITOR_EVENT_V1.names)

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        events = rel.map_batches(IngestFn(self.quarantine.raw), EDITOR_EVENT_V1, name="parse_validate", quarantine=True)
        if not self.drop_duplicate_events:
            return events
        # A side branch finds the (usually few) repeated copies; the events then stream past
        # them in a broadcast anti join, so the big relation is never shuffled or joined whole.
        # One aggregation is the only shuffle: it also counts the copies, so only ids read more
        # than once (small) are joined back -- broadcast -- to their locations (docs/scaling.md).
        side = Rel(events.node, f"{rel.stage}:side")
        locs = side.map_batches(EventLocations(), _LOC_SCHEMA, name="event_locations",
                                reads=("event_id", "_source_file", "_source_line", "privacy_mode"))
        firsts = locs.aggregate(["event_id"], {"_first": ("min", "_loc"), "_copies": ("count", "_loc")})
        repeated = firsts.map_batches(RepeatedIds(), _REPEATED_IDS_SCHEMA, name="repeated_ids")
        repeats = (locs.join(repeated, "event_id", broadcast=True)
                   .map_batches(RepeatedCopies(), _REPEAT_SCHEMA, name="repeated_copies"))
        return events.join(Rel(repeats.node, rel.stage), ["_source_file", "_source_line"], how="anti",
                           reason="duplicate_event_id", broadcast=True)
