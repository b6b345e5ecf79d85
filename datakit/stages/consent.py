"""Consent: never train on an event whose user said no.

Drops, counted by reason (in this order, so each event has exactly one reason):

- `privacy_mode`  the event was logged with `privacy_mode = true` (a null is treated
                  as true: when in doubt, do not train);
- `opt_out_user`  its `user_id` is in an opt-out / deletion list;
- `opt_out_org`   its `org_id` is in an opt-out / deletion list;
- `deleted_event` its `event_id` is in a deletion list (single events deleted).

Opt-out lists (`optouts:` a path, glob or list of them; any fsspec URL) are
Parquet or JSON Lines files with a `user_id`, `org_id` and/or `event_id` column: the same
files `forget` applies to an output (docs/lineage.md), so consent-then-extract and
extract-then-forget keep the same records (found in review: consent ignored `event_id`).

How the lists are applied (`mode`):

- `broadcast` reads the lists once at compile time into two id sets that the
  batch function closes over (Spark ships them to executors as part of the
  function). Streaming, no shuffle: right for lists up to millions of ids.
- `join` compiles each list to an anti join (`Rel.join(how="anti", broadcast=True)`)
  so the engine does the matching; right for lists too big to hold in memory,
  at the cost of a barrier (the events are materialised once).
- `auto` (default) picks `broadcast` when the list files total at most
  `broadcast_max_bytes`, else `join`.

Consent drops are counted, never drop-logged: the output folder keeps nothing
(not even event ids) about people who said no.

Both modes give identical output and identical counts (tested). A deletion that
arrives after an output was written is applied with the lineage in `source`
(see docs/lineage.md).
"""
from __future__ import annotations

from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field, field_validator

from datakit.contracts import RAW_LINES
from datakit.io.fs import InputError, arrow_filesystem, expand, filesystem
from datakit.plan import DROP, Rel, source
from datakit.stages.base import CompileContext, StageConfig, register_stage

# each list column and the drop reason of an event it names, in the order reasons are given
DROP_REASONS = (("user_id", "opt_out_user"), ("org_id", "opt_out_org"), ("event_id", "deleted_event"))
ID_COLUMNS = tuple(column for column, _ in DROP_REASONS)
OPTOUT_SCHEMA = pa.schema([(column, pa.string()) for column in ID_COLUMNS])
# what a Parquet source of opt-out files yields (readers add provenance columns)
OPTOUT_SOURCE_SCHEMA = pa.schema(list(OPTOUT_SCHEMA) + [("_source_file", pa.string()), ("_source_line", pa.int64())])
OPTOUT_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".ndjson")


class ConsentFn:
    """Batch function: add `_drop` = privacy_mode / opt_out_user / opt_out_org (null = keep).

    The id sets travel with the function (to every worker process or Spark
    executor) as sorted Arrow string arrays: they pickle as raw buffers, about
    16 bytes per id, in milliseconds (a tuple of a million strings takes seconds).
    """

    def __init__(self, users: tuple[str, ...] = (), orgs: tuple[str, ...] = (), events: tuple[str, ...] = ()) -> None:
        self._sets = tuple(pa.array(sorted(set(ids)), pa.string()) for ids in (users, orgs, events))

    @property
    def users(self) -> tuple[str, ...]:
        return tuple(self._sets[0].to_pylist())

    @property
    def orgs(self) -> tuple[str, ...]:
        return tuple(self._sets[1].to_pylist())

    def __getstate__(self) -> dict:
        return {"users": self._sets[0], "orgs": self._sets[1], "events": self._sets[2]}

    def __setstate__(self, state: dict) -> None:
        self._sets = (state["users"], state["orgs"], state["events"])

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        private = pc.fill_null(batch.column("privacy_mode"), True)
        drop = pc.if_else(private, pa.scalar("privacy_mode"), pa.nulls(n, pa.string()))
        for (column, reason), ids in zip(DROP_REASONS, self._sets, strict=True):
            if len(ids):
                hit = pc.fill_null(pc.is_in(batch.column(column), value_set=ids), False)
                drop = pc.if_else(pc.and_(pc.is_null(drop), hit), pa.scalar(reason), drop)
        return batch.append_column(DROP, drop.cast(pa.string()))


class ParseOptOutLines:
    """RAW_LINES of an opt-out JSON Lines file -> OPTOUT_SCHEMA rows (join mode).

    A line that is not a JSON object is an error naming file and line: silently
    skipping an opt-out would mean training on someone who said no.
    """

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        users, orgs, events = [], [], []
        raws = batch.column("_raw").to_pylist()
        files = batch.column("_source_file").to_pylist()
        lines = batch.column("_source_line").to_pylist()
        errors = batch.column("_read_error").to_pylist()
        for raw, f, ln, err in zip(raws, files, lines, errors, strict=True):
            obj = _line_object(raw, f, ln, err)
            if obj is None:  # a blank line: an all-null row matches nobody (null keys never join)
                users.append(None)
                orgs.append(None)
                events.append(None)
                continue
            if not any(obj.get(c) is not None and obj[c] != "" for c in ID_COLUMNS):
                # (as `read_id_lists`: a row whose ids are null or empty names no one and must not pass silently)
                raise InputError(f"opt-out list {f}:{ln}: has no user_id, org_id or event_id")
            users.append(_id(obj.get("user_id")))
            orgs.append(_id(obj.get("org_id")))
            events.append(_id(obj.get("event_id")))
        return pa.RecordBatch.from_arrays([pa.array(v, pa.string()) for v in (users, orgs, events)], schema=OPTOUT_SCHEMA)


def _line_object(raw: bytes | None, url: str, line: int, err: str | None) -> dict | None:
    """One RAW_LINES row of an opt-out JSON Lines file as a JSON object; None for a blank line.
    Anything else (a read error, a line that is not a JSON object) is an `InputError` naming the file and line."""
    import json

    if err == "blank_line":
        return None
    if err is not None:
        raise InputError(f"opt-out list {url}: {err}")
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested past the parser's depth
        obj = None
    if not isinstance(obj, dict):
        raise InputError(f"opt-out list {url}:{line}: not a JSON object")
    return obj


def _id(v: object) -> str | None:
    return None if v is None else str(v)


def _either(columns: tuple[str, ...]) -> str:
    """`a or b`, `a, b or c`: the id columns a list may use, as its errors name them."""
    return " or ".join(columns) if len(columns) < 3 else f"{', '.join(columns[:-1])} or {columns[-1]}"


def _names_no_one(url: str, rows: int, columns: tuple[str, ...], names: list[str]) -> InputError:
    """The error for a Parquet list whose `rows` name no one in `columns`, with the columns it does have.

    Why an error: rows naming a repository in a `repo_id` column, their user_id null, were taken as
    nothing (found in review); an opt-out that names no one must not pass silently. One message for
    broadcast mode (`read_id_lists`) and join mode (`_check_parquet_lists`)."""
    others = [c for c in names if c not in columns]
    return InputError(f"opt-out list {url}: {rows} row(s) hold no {_either(columns)}"
                      + (f" (other columns, not read: {', '.join(others[:5])})" if others else ""))


def read_id_lists(paths: list[str], columns: tuple[str, ...] = ID_COLUMNS) -> dict[str, tuple[str, ...]]:
    """Sorted id sets per column from opt-out / deletion files (Parquet or JSON Lines).

    Every file (Parquet) or line (JSON Lines) must carry at least one of
    `columns`, else an `InputError` names it. Ids of any JSON type become strings.
    """
    from datakit.io.readers import iter_raw_lines

    found: dict[str, set[str]] = {c: set() for c in columns}
    want = _either(columns)
    for url in paths:
        if url.endswith(".parquet"):
            fs, p = filesystem(url)
            try:
                t = pq.read_table(p, filesystem=arrow_filesystem(fs))
                present = [c for c in columns if c in t.schema.names]
                if not present and t.num_rows:
                    raise InputError(f"opt-out list {url} has no {want} column")
                values = {c: t.column(c).cast(pa.string()).to_pylist() for c in present}
            except (pa.ArrowException, KeyError, ValueError, OSError) as e:
                if isinstance(e, InputError):
                    raise
                from datakit.io import storage

                if isinstance(e, FileNotFoundError) or storage.is_store_refusal(e):
                    raise  # the store's own error: reported as storage, not as the list's content
                # a file that is not Parquet, invalid UTF-8 in an id column, an id column given twice: one line
                # naming the file (found in a hostile-input review: pyarrow's own text, without the file, or
                # the whole schema for a repeated column)
                raise InputError(f"cannot read opt-out list {url}: {_list_problem(e)}") from None
            empty = sum(1 for row in zip(*values.values()) if not any(row))
            if empty:
                raise _names_no_one(url, empty, columns, t.schema.names)
            for c in present:
                found[c].update(v for v in values[c] if v)
            continue
        for b in iter_raw_lines(url):
            for raw, ln, err in zip(b.column("_raw").to_pylist(), b.column("_source_line").to_pylist(),
                                    b.column("_read_error").to_pylist()):
                obj = _line_object(raw, url, ln, err)
                if obj is None:
                    continue
                if not any(obj.get(c) is not None and obj[c] != "" for c in columns):
                    raise InputError(f"opt-out list {url}:{ln}: has no {want}")
                for c in columns:
                    if obj.get(c) is not None and obj[c] != "":
                        found[c].add(str(obj[c]))
    return {c: tuple(sorted(v)) for c, v in found.items()}


def _list_problem(e: BaseException) -> str:
    """What is wrong with an opt-out file, in a few words (never its ids: the first line of the error, cut)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    low = text.lower()
    if isinstance(e, KeyError) or "multiple matches" in low or "duplicate" in low:
        return "an id column appears more than once"
    if "magic bytes" in low or "parquet file size is 0" in low:
        return "not a Parquet file (or a truncated one)"
    if "invalid utf8" in low or "invalid utf-8" in low:
        return "an id column holds bytes that are not UTF-8"
    return f"{type(e).__name__} ({text[:120]})" if text else type(e).__name__


def load_optouts(paths: list[str]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(user ids, org ids, event ids) from opt-out / deletion files (see `read_id_lists`)."""
    lists = read_id_lists(paths)
    return lists["user_id"], lists["org_id"], lists["event_id"]


def _check_parquet_lists(files: list[str]) -> None:
    """Join mode reads the lists in the engine; check at compile time that each has an id column and
    that every row names someone, as `read_id_lists` does for broadcast mode.

    Without this, a list with a misspelt column would join as all-null and silently drop nobody; and a
    row naming a repository in another column, its ids null, was taken as nothing in join mode only
    (found in review). The row check reads only the id columns, a row group at a time, and only row
    groups whose statistics allow a row without ids, so a large list costs one streamed pass at most."""
    for url in files:
        fs, p = filesystem(url)
        try:
            f = pq.ParquetFile(p, filesystem=arrow_filesystem(fs))
            names = f.schema_arrow.names
        except Exception as e:  # not Parquet, unreadable
            raise InputError(f"cannot read opt-out list {url}: {e.__class__.__name__}") from None
        present = [c for c in ID_COLUMNS if c in names]
        if not present:
            raise InputError(f"opt-out list {url} has no {_either(ID_COLUMNS)} column")
        empty = sum(_rows_naming_no_one(f, i, present) for i in range(f.metadata.num_row_groups))
        if empty:
            raise _names_no_one(url, empty, ID_COLUMNS, names)


def _rows_naming_no_one(f: pq.ParquetFile, group: int, columns: list[str]) -> int:
    """Rows of one row group of an opt-out Parquet file whose id columns are all null or empty; 0 without
    reading it when some id column's statistics say it has no null in that group (empty strings aside:
    a string column's minimum above "" proves none)."""
    meta = f.metadata.row_group(group)
    chunks = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    for c in columns:
        st = chunks[c].statistics if c in chunks else None
        if st is not None and st.has_null_count and st.null_count == 0 and st.has_min_max and st.min not in ("", b""):
            return 0
    t = f.read_row_group(group, columns=columns)
    named = None
    for c in columns:
        v = t.column(c).cast(pa.string())
        has = pc.and_(pc.is_valid(v), pc.not_equal(pc.fill_null(v, ""), ""))
        named = has if named is None else pc.or_(named, has)
    return int(t.num_rows - pc.sum(pc.cast(pc.fill_null(named, False), pa.int64())).as_py()) if named is not None else 0


@register_stage
class ConsentConfig(StageConfig):
    """Drop privacy-mode events and events of users/orgs on an opt-out or deletion list."""

    kind: Literal["consent"] = "consent"
    optouts: str | list[str] | None = Field(None, description="opt-out list path(s)/glob(s): Parquet or JSON Lines with user_id and/or org_id")
    path_fields = ("optouts",)
    mode: Literal["auto", "broadcast", "join"] = "auto"
    broadcast_max_bytes: int = Field(
        8 * 1024 * 1024, gt=0,
        description="auto mode: lists up to this total file size are broadcast (8 MiB of Parquet is about 1.4 million "
                    "ids, ~22 MB shipped with every task); bigger lists become anti joins")

    consumes = "editor_event.v1"
    produces = "editor_event.v1"
    reads = ("user_id", "org_id", "event_id", "privacy_mode")

    @field_validator("optouts")
    @classmethod
    def _non_empty(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and not v:
            return None
        return v

    def optout_files(self, ctx: CompileContext) -> list[str]:
        if self.optouts is None:
            return []
        paths = [self.optouts] if isinstance(self.optouts, str) else list(self.optouts)
        try:
            return expand([ctx.resolve(p) for p in paths], suffixes=OPTOUT_SUFFIXES)
        except InputError as e:  # found in a docs review: "input not found: ..." named no stage or field
            raise InputError(f"stage consent: optouts: {e}") from None

    def resolved_mode(self, files: list[str]) -> str:
        if self.mode != "auto" or not files:
            return self.mode if files else "broadcast"
        total = 0
        for url in files:
            fs, p = filesystem(url)
            total += fs.size(p) or 0
        return "broadcast" if total <= self.broadcast_max_bytes else "join"

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        files = self.optout_files(ctx)
        if self.resolved_mode(files) == "broadcast":
            users, orgs, events = load_optouts(files)
            # loaded now, not read as plan input: their content is part of the run's identity (the event
            # list only when there is one: a run without it keeps its identity)
            ctx.record("optouts", ids_digest(users, orgs, *([events] if events else [])))
            return rel.map_batches(ConsentFn(users, orgs, events), rel.schema, name="consent")
        out = rel.map_batches(ConsentFn(), rel.schema, name="privacy_mode")
        parquet = [f for f in files if f.endswith(".parquet")]
        _check_parquet_lists(parquet)
        jsonl = [f for f in files if not f.endswith(".parquet")]
        lists: list[Rel] = []
        if parquet:
            lists.append(source(parquet, "parquet", OPTOUT_SOURCE_SCHEMA, "optout", stage=rel.stage))
        if jsonl:
            raw = source(jsonl, "jsonl", RAW_LINES, "optout", stage=rel.stage)
            lists.append(raw.map_batches(ParseOptOutLines(), OPTOUT_SCHEMA, name="parse_optouts"))
        # users first, then orgs: the same precedence as broadcast mode, so counts agree
        for column, reason in DROP_REASONS:
            for right in lists:
                out = out.join(right, column, column, how="anti", reason=reason, broadcast=True)
        return out


def ids_digest(*id_sets) -> str:
    """sha256 of id lists loaded at compile (order-free): what a consent/forget run's output depends on."""
    from datakit.io.identity import digest

    return digest([sorted(set(ids)) for ids in id_sets])
