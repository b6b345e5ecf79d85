"""What every engine must do the same way, in one place.

Why a shared core: byte-identical output across engines used to rest on
hand-synchronised copies (conforming, drop/metrics extraction, the shard count,
the run report). Each copy was one edit away from diverging. An engine file
now holds only what is specific to how it moves data; everything that decides
*what* the bytes and counts are lives here and is called by both.
"""
from __future__ import annotations

import gc
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datakit.accounting import count_drops, sum_metrics
from datakit.contracts import EDITOR_EVENT_V1, TRAINING_RECORD_V1
from datakit.engines.contract import StageOutputError, conform_output, mismatch
from datakit.errors import DatakitError
from datakit.io import identity, publish, sinks
from datakit.io.atomic import write_json_atomic
from datakit.io.fs import filesystem
from datakit.plan import DROP, DROP_DETAIL, DROP_STATE, METRICS, Plan, SinkSpec

__all__ = ["Engine", "worker_fn", "take_setup_seconds", "METRICS", "QUARANTINE_SCHEMA", "DROPLOG_SCHEMA", "DROPSTATE_SCHEMA", "SIDE_OUTPUTS",
           "RunResult", "MapOutput",
           "conform", "apply_map", "shard_count", "resolve_sink", "write_side_output", "commit_run",
           "remove_if_empty", "connected_components_table"]

QUARANTINE_SCHEMA = pa.schema([
    ("stage", pa.string()), ("reason", pa.string()), ("detail", pa.string()),
    ("source_file", pa.string()), ("source_line", pa.int64()), ("raw", pa.binary()),
])
DROPLOG_SCHEMA = pa.schema([("stage", pa.string()), ("key", pa.string()), ("reason", pa.string()),
                            ("detail", pa.string())])
# dropped rows' `_drop_state` (datakit.plan): what a later run needs of them (dedup against history)
DROPSTATE_SCHEMA = pa.schema([("stage", pa.string()), ("key", pa.string()), ("detail", pa.string()),
                              ("state", pa.string())])
# side output -> (folder under the output, schema); rows are sorted by every column in schema order
SIDE_OUTPUTS: dict[str, tuple[str, pa.Schema]] = {
    "quarantine": ("_quarantine", QUARANTINE_SCHEMA),
    "droplog": ("_dropped", DROPLOG_SCHEMA),
    "dropstate": ("_dropped_state", DROPSTATE_SCHEMA),
}
DEFAULT_ROWS_PER_SHARD = 100_000


@dataclass
class RunResult:
    """What `engine.execute` returns: per-stage accounting plus where things went."""

    output_path: str | None
    stages: list[dict[str, Any]]
    manifest: dict[str, Any] | None
    seconds: float
    engine: str = "local"
    extra: dict[str, Any] = field(default_factory=dict)

    def stage(self, name: str) -> dict[str, Any]:
        """The accounting of the stage named `name` (`rows_in`, `rows_out`, `dropped` by reason, ...);
        KeyError if the run has no such stage."""
        for s in self.stages:
            if s["name"] == name:
                return s
        raise KeyError(name)


# token -> a batch function loaded and set up in this process; only the current run's are kept
_READY: dict[str, Any] = {}
# token -> seconds this process spent loading + setting up that function, not yet reported by a task
_SETUP: dict[str, float] = {}


class Engine:
    """The part of `execute` every engine shares: a run that writes holds its output folder's writer
    lock (flock / object-store lease) from before the first byte to after the commit. An engine
    implements `_execute(plan)`; this wrapper is why neither can forget the lock, nor keep the
    batch functions an in-process run set up alive after it."""

    def execute(self, plan: Plan) -> RunResult:
        try:
            if plan.sink is None:
                return self._execute(plan)
            with publish.output_lock(plan.sink.path):  # one writer per folder; preflight of the path
                return self._execute(plan)
        finally:
            _READY.clear()  # what an in-process run set up (worker_fn): free its models and tables
            _SETUP.clear()
            _thaw()

    def _execute(self, plan: Plan) -> RunResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def prestart(self) -> None:
        """Begin whatever start-up the engine can do before it has a plan (in the background);
        `execute` waits for it. No-op unless an engine has such a start-up (Spark: its session)."""

    def settle(self) -> None:
        """Wait for a `prestart` that no `execute` will follow (the pipeline failed to compile)."""


def worker_fn(token: str, load: Callable[[], Any], label: str = "") -> Any:
    """The batch function named `token` ("<run>:<op>"), ready in this worker process.

    Why here: a stage function that needs a model, tokenizer or analyzer defines `setup()` (load
    it into the instance; never pickled) and both engines call this, so `setup()` runs once per
    worker process per run (local pool worker or in-process run, Spark Python worker), not once
    per task, and a stage keeps no module-level cache of its own. Another run's functions are
    dropped when a new run's first one arrives (a kept pool must not hold old eval tables).

    The seconds of loading (unpickling: a broadcast's tables) and `setup()` (spaCy, a tokenizer) are
    kept for the task that paid them (`take_setup_seconds`), so the run report shows them apart from
    the stage's batch time instead of losing them (local) or hiding them in it (Spark).
    """
    fn = _READY.get(token)
    if fn is None:
        run = token.partition(":")[0]
        stale = [k for k in _READY if k.partition(":")[0] != run]
        for old in stale:
            del _READY[old]
            _SETUP.pop(old, None)
        if stale:
            _thaw()  # the old run's cycles are collected before anything is frozen again (`_freeze`)
        t0 = time.perf_counter()
        fn = load()
        setup = getattr(fn, "setup", None)
        if callable(setup):
            failed: Exception | None = None
            try:
                setup()
            except KeyboardInterrupt:
                raise
            except Exception as e:  # found in review: a bare ValueError, or an OSError blamed on a work file
                if (type(e).__module__ or "").startswith("datakit"):
                    raise
                failed = e
            if failed is not None:  # raised here, not in the handler: its __context__ would be the raw exception
                raise StageError(f"{label or type(fn).__name__}: its setup() failed: {type(failed).__name__}: "
                                 f"{_first_line(failed)}{_where(failed)}") from _redacted(failed)
            from datakit.watchdog import beat

            # a finished set-up is progress (found in review: a task retried on a fresh worker loaded spaCy, then
            # ran its first batch, and the two together were judged one silence: "stalled" a second time)
            beat()
        _freeze()
        _SETUP[token] = time.perf_counter() - t0
        _READY[token] = fn
    return fn


_FROZEN_BY_US: list[bool] = []  # set while objects this module froze are out of the collector's reach


def _freeze() -> None:
    """After a function's set-up: collect, then move every object alive out of the collector's reach.

    Why: a worker's long-lived objects (imported modules, a spaCy model, an eval table) were
    otherwise walked by every full collection, which the batches' short-lived dicts and lists
    trigger: at 100k quickstart events the two pool workers spent 1.86 CPU-s in 29 full
    collections (`gc.callbacks`); 6 of ~77 ms each in a 10k run in-process. Frozen objects are
    still freed by reference counting; only their reference cycles wait for `_thaw`.

    Why collect first: whatever garbage exists at that moment (an earlier run's model, cycles a
    batch or the set-up itself left) would otherwise be frozen too and outlive the run; after the
    first freeze a collection only walks what was made since, so each costs little (an in-process
    run inside a notebook holding 3M objects: one walk, 0.29 s per run, a reviewer's probe). A process
    that froze objects itself (a pre-fork server) is left alone: gc.freeze is not counted, and
    our `_thaw` would undo its freeze."""
    if not _FROZEN_BY_US and gc.get_freeze_count():  # (counting walks the frozen objects: ~19 ms once we froze)
        return
    gc.collect()
    _FROZEN_BY_US[:] = [True]  # before the freeze: a Ctrl-C between the two must not leave an unflagged freeze
    gc.freeze()


def _thaw() -> None:
    """Hand what `_freeze` froze back to the collector (a run ended, or a new run replaced its functions)."""
    if _FROZEN_BY_US:
        gc.unfreeze()
        _FROZEN_BY_US.clear()


def take_setup_seconds(token: str) -> float:
    """Seconds `worker_fn` spent loading and setting up `token`'s function in this process, once:
    the task that paid them reports them (`setup_seconds` of its stage); later tasks get 0."""
    return _SETUP.pop(token, 0.0)


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Select and cast a batch to `schema` (polars/Spark hand back large_string etc.; we want the contract types).

    Columns not in the schema are dropped (a Parquet input may carry extra fields);
    missing nullable columns become nulls.
    """
    cols = []
    for f in schema:
        if f.name in batch.schema.names:
            col = batch.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(batch.num_rows, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=pa.schema(list(schema)))


@dataclass
class MapOutput:
    """One `MapBatches` call, split: kept rows (conformed), dropped rows (as the fn returned them), counts."""

    kept: pa.RecordBatch
    dropped: pa.RecordBatch | None
    drops: Counter
    metrics: Counter


def apply_map(fn: Callable, batch: pa.RecordBatch, schema: pa.Schema, stage: str, op: str) -> MapOutput:
    """Run a stage function and apply the accounting contract of `datakit.plan` (`_drop`, `_metrics`).

    The kept rows must match the declared `schema` (`engines/contract.py`): a batch off it is a
    stage bug and fails the run naming `stage` and `op`, instead of being filled with nulls."""
    failed: Exception | None = None
    try:
        out = fn(batch)
    except KeyboardInterrupt:
        raise
    except OSError as e:  # storage faults keep their own handling (retries, exit 3)
        if not _raised_in_user_code(e):
            raise
        # found in review: a stage's own missing vocab file was a bare FileNotFoundError (a traceback,
        # exit 1, from the command) naming no stage
        failed = e
    except Exception as e:
        if (type(e).__module__ or "").startswith("datakit"):  # our own typed errors already say what happened
            raise
        failed = e
    if failed is not None:  # raised here, not in the handler: its __context__ would be the raw exception
        raise StageError(f"stage {stage!r} ({op}) failed: {type(failed).__name__}: {_first_line(failed)}"
                         f"{_where(failed)}") from _redacted(failed)
    if isinstance(out, pa.Table):
        out = out.combine_chunks().to_batches()[0] if out.num_rows else pa.RecordBatch.from_pylist([], schema=out.schema)
    if not isinstance(out, pa.RecordBatch):
        raise StageOutputError(f"stage {stage!r} ({op}) returned {type(out).__name__}, not a pyarrow RecordBatch "
                               "or Table (a stage bug); nothing was committed")
    names = out.schema.names
    metrics = sum_metrics(out.column(METRICS)) if METRICS in names else Counter()
    dropped, drops = None, Counter()
    if DROP in names:
        drop_col = out.column(DROP)
        if mismatch(drop_col.type, pa.string(), DROP):
            raise StageOutputError(f"stage {stage!r} ({op}) returned a {DROP} column of {drop_col.type}; it holds "
                                   "reasons, a string per dropped row (a stage bug); nothing was committed")
        if drop_col.null_count != len(drop_col):
            empty = pc.sum(pc.cast(pc.equal(drop_col.cast(pa.string()), ""), pa.int64())).as_py() or 0
            if empty:  # found in review: '' (meant as "keep") dropped every row under the reason ''
                raise StageOutputError(f"stage {stage!r} ({op}) returned {empty} empty {DROP} reason(s); a dropped "
                                       "row needs a reason, a kept row null (a stage bug); nothing was committed")
            keep = pc.is_null(drop_col)
            dropped = out.filter(pc.invert(keep))
            drops = count_drops(dropped)
            out = out.filter(keep)
    declared = set(schema.names)
    for key, contract in IDENTITY_COLUMNS:
        if contract <= declared and key in out.schema.names and out.column(key).null_count:
            raise StageOutputError(
                f"stage {stage!r} ({op}) kept {out.column(key).null_count} row(s) of a batch with no {key} (every row needs "
                f"its identity: drop such a row with a {DROP} reason instead); nothing was committed")
    return MapOutput(conform_output(out, schema, stage, op), dropped, drops, metrics)


class StageError(DatakitError, RuntimeError):
    """A stage's batch function raised: one line naming the stage, the op, the error and where it was
    raised (found in review: the local engine named no stage, Spark the last stage of the fused chain)."""


class RedactedError(Exception):
    """Stands in for an exception a stage's own code raised, as the cause of the `StageError` that reports it:
    "ValueError: <its message, redacted>", with the original's traceback, so a printed traceback still shows
    the stage's frames (file, line, function) but not the message, which may quote a record (`_redacted`)."""


def _redacted(e: BaseException, depth: int = 0) -> RedactedError:
    """`e` as a `RedactedError`, and its chain (`__cause__`, or an unsuppressed `__context__`) the same way,
    for `raise StageError(...) from _redacted(e)`.

    Why: found in a Python API review, the StageError's line was redacted but `from e` chained the raw
    exception, and every default traceback printed its message (an e-mail, a token): a script's, the text
    a pool worker sends back (`_RemoteTraceback`), a Spark worker's. Only the text is replaced: the stand-in
    carries `e.__traceback__`, the frames that make a custom stage debuggable."""
    from datakit.logs import _redact

    text = str(e)
    stand_in = RedactedError(f"{type(e).__name__}: {_redact(text)}" if text else type(e).__name__)
    stand_in = stand_in.with_traceback(e.__traceback__)
    if depth < 8:  # (a chain is short; the bound also ends a cyclic one)
        if e.__cause__ is not None:
            stand_in.__cause__ = _redacted(e.__cause__, depth + 1)
        elif e.__context__ is not None and not e.__suppress_context__:
            stand_in.__context__ = _redacted(e.__context__, depth + 1)
    return stand_in


_DATAKIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _raised_in_user_code(e: BaseException) -> bool:
    """True when the innermost frame of `e` is in a stage's own code: not datakit's, not an installed
    library's (fsspec, s3fs, pyarrow: a storage fault, retried and reported as one) nor the stdlib's."""
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return not path.startswith(identity.INSTALLED_PREFIXES + (_DATAKIT,)) and not path.startswith("<frozen")


def _first_line(e: BaseException) -> str:
    """The first line of `e`'s message, redacted and then clipped to 300 characters (clipped first, a
    secret cut in two escaped the patterns that know its whole shape: found in review)."""
    from datakit.logs import _redact

    text = str(e).splitlines()[0] if str(e) else ""
    return _redact(text)[:300]


def _where(e: BaseException) -> str:
    """" (at FILE:LINE in FUNCTION)" of the innermost frame of `e`'s traceback, or ""."""
    tb = e.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f" (at {code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno} in {code.co_name})"


# A kept row's identity: the key the sink shards and sorts by and the joins match on (found in review:
# a stage that kept rows with a null doc_id committed them with one shard, and failed inside the sink's
# key hash, naming no stage, with two)
# (only for rows of a contract: a relation of the stage's own, such as an opt-out list, may have none)
IDENTITY_COLUMNS = (("doc_id", frozenset(TRAINING_RECORD_V1.names)), ("event_id", frozenset(EDITOR_EVENT_V1.names)))


def quarantine_rows(stage: str, rows: pa.RecordBatch) -> pa.RecordBatch:
    """Dropped rows of a quarantining op as QUARANTINE_SCHEMA rows."""
    return _side_rows(rows, QUARANTINE_SCHEMA, stage, {"reason": DROP, "detail": DROP_DETAIL,
                                                         "source_file": "_source_file",
                                                         "source_line": "_source_line", "raw": "_raw"})


def droplog_rows(stage: str, key: str, rows: pa.RecordBatch) -> pa.RecordBatch:
    """Dropped rows of a drop-logging op as DROPLOG_SCHEMA rows (`key` is the row's id column)."""
    return _side_rows(rows, DROPLOG_SCHEMA, stage, {"key": key, "reason": DROP, "detail": DROP_DETAIL})


def dropstate_rows(stage: str, key: str, rows: pa.RecordBatch) -> pa.RecordBatch | None:
    """Dropped rows that carry a `_drop_state` as DROPSTATE_SCHEMA rows (None: no such row)."""
    if DROP_STATE not in rows.schema.names or rows.column(DROP_STATE).null_count == rows.num_rows:
        return None
    rows = rows.filter(pc.is_valid(rows.column(DROP_STATE)))
    return _side_rows(rows, DROPSTATE_SCHEMA, stage, {"key": key, "detail": DROP_DETAIL, "state": DROP_STATE})


def _side_rows(rows: pa.RecordBatch, schema: pa.Schema, stage: str, source: dict[str, str]) -> pa.RecordBatch:
    n, names = rows.num_rows, rows.schema.names
    cols = [pa.array([stage] * n, pa.string())]
    for f in list(schema)[1:]:
        name = source[f.name]
        cols.append(rows.column(name).cast(f.type) if name in names else pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def write_side_output(table: pa.Table | None, out: str, side: str) -> None:
    """Write one side output (`quarantine` / `droplog`) as one file, sorted by all its columns.

    Sorting by every column makes ties impossible, so neither arrival order nor
    partitioning can change a byte. No rows (`None`): an earlier run's file is
    removed, so it cannot pass for this run's.
    """
    folder, schema = SIDE_OUTPUTS[side]
    if table is None:
        _remove_stale(f"{out.rstrip('/')}/{folder}/part-00000.parquet")
        return
    table = table.select(schema.names).cast(schema)
    idx = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in schema.names])
    sinks.write_parquet(table.take(idx).combine_chunks(), f"{out.rstrip('/')}/{folder}/part-00000.parquet")


def shard_count(spec: SinkSpec, rows: int) -> int:
    """The sink's shard count: the configured number, or for "auto" (0) one per `rows_per_shard` rows."""
    if isinstance(spec.shards, int) and spec.shards > 0:
        return spec.shards
    per = int(spec.options.get("rows_per_shard", DEFAULT_ROWS_PER_SHARD))
    return max(1, -(-rows // per))


def resolve_sink(spec: SinkSpec, rows: int) -> SinkSpec:
    """`spec` with its shard count fixed (what writers and the manifest see)."""
    return SinkSpec(**{**spec.__dict__, "shards": shard_count(spec, rows)})


def commit_run(plan: Plan, inputs: list[dict[str, Any]], spec: SinkSpec, infos: list[dict[str, Any]], stages: list[dict[str, Any]],
               seconds: float, engine: str, reused_tasks: int, runtime: dict[str, Any]) -> dict[str, Any]:
    """Commit the manifest and write `_run.json`; the same shape on every engine.

    `inputs` are the run's input files (`io.identity.input_files`), recorded in the manifest;
    `runtime` holds what only that engine knows (local: workers; Spark: master,
    partitions, log file); every other key is common. Returns the manifest.
    """
    metrics: Counter = Counter()
    for st in stages:
        metrics.update(st.get("metrics", {}))
    manifest = sinks.commit(spec, infos, identity.manifest_fields(plan, inputs), metrics)
    run = {
        "run_report_version": 1,
        "engine": engine,
        "pipeline": plan.config,
        "pipeline_hash": plan.config_hash,
        "stages": stages,
        "output": {"path": spec.path, "format": spec.format, "shards": spec.shards, "rows": manifest["rows"],
                   "reused_shards": reused_shards(infos)},
        "resume": {"reused_tasks": reused_tasks},
        "runtime": runtime,
        "seconds": round(seconds, 3),
    }
    write_json_atomic(f"{spec.path.rstrip('/')}/_run.json", run)
    return manifest


def reused_shards(infos: list[dict[str, Any]]) -> int:
    return sum(1 for i in infos if i.get("reused"))


def remove_if_empty(path: str) -> None:
    """Remove a folder we may have created (work or checkpoint root) if nothing else is in it."""
    try:
        os.rmdir(path)
    except OSError:
        pass


def _remove_stale(url: str) -> None:
    fs, p = filesystem(url)
    try:
        if fs.exists(p):
            fs.rm(p)
    except FileNotFoundError:
        pass


def connected_components_table(src: pa.Array, dst: pa.Array) -> pa.Table:
    """Edges -> (node, component = smallest node id in its component), by `smallest_member_labels`.
    A null end names no node (see below), as on Spark.

    O(V + E) per round on numpy arrays, a few rounds (see there); tested against scipy's
    `csgraph.connected_components`, which this replaced: importing scipy.sparse.csgraph cost the
    process that runs the barriers 0.22 CPU-s and ~32 MB RSS, a third of the dedup stage's own
    barrier work at 20k records, where the rounds take milliseconds.
    """
    src = pc.cast(src, pa.string()) if not isinstance(src, pa.ChunkedArray) else src.cast(pa.string())
    dst = pc.cast(dst, pa.string()) if not isinstance(dst, pa.ChunkedArray) else dst.cast(pa.string())
    # a null end names no node; an edge with one null end keeps its other end (a node of its own, as a
    # self-loop does): what Spark's large-star/small-star rounds do. Before, a null was a node here and
    # joined every edge that had one into one component, so the engines disagreed on such input.
    src, dst = pc.coalesce(src, dst), pc.coalesce(dst, src)
    named = pc.is_valid(src)
    src, dst = _chunk(src.filter(named)), _chunk(dst.filter(named))  # one chunk each, made once
    all_nodes = pa.concat_arrays([src, dst])
    if len(all_nodes) == 0:
        return pa.table({"node": pa.array([], pa.string()), "component": pa.array([], pa.string())})
    uniq = pc.unique(all_nodes)
    uniq = uniq.take(pc.sort_indices(uniq))  # sorted ids: index order == string order
    si = pc.index_in(src, value_set=uniq).to_numpy()
    di = pc.index_in(dst, value_set=uniq).to_numpy()
    labels = smallest_member_labels(si, di, len(uniq))
    return pa.table({"node": uniq, "component": uniq.take(pa.array(labels))})


def smallest_member_labels(si: np.ndarray, di: np.ndarray, n: int) -> np.ndarray:
    """Node i of edges (si[k], di[k]) over nodes 0..n-1 -> the smallest node of i's component.

    Hook-and-jump on whole arrays: every node points at a root (initially itself); each round,
    for every edge between two trees the larger root is hooked under the smaller one (parent
    only ever decreases, so no cycles), then pointers jump (parent = parent[parent]) until every
    node points at its root again, and edges inside one tree leave the list. A root that has a
    smaller neighbouring root is always hooked, so each round merges trees and the roots that are
    left are the components' minima; the roots at least halve every two rounds, so there are at
    most ~2 log2(n) rounds. Measured: a path over bit-reversed ids of 2^17 nodes 17, a scrambled
    200k-node path 11, random sparse graphs 4; paths and trees of 8-64 nodes never above log2(n),
    a reviewer's 8-node graph 4. Why not a Python union-find: a dict per node made dedup of
    a single node take days elsewhere; these are a few numpy passes per round.
    """
    # peak (tracemalloc, 1M edges): 33 B per edge with as many nodes, 41 with two nodes per edge (dedup's
    # many separate pairs); 61-plus with int64
    index = np.int32 if n < 2**31 else np.int64
    si, di = si.astype(index, copy=False), di.astype(index, copy=False)
    parent = np.arange(n, dtype=index)
    while len(si):
        a, b = parent[si], parent[di]
        between = a != b
        if not between.any():
            break
        si, di, a, b = si[between], di[between], a[between], b[between]
        np.minimum.at(parent, np.maximum(a, b), np.minimum(a, b))
        while True:
            jumped = parent[parent]
            if np.array_equal(jumped, parent):
                break
            parent = jumped
    return parent


def _chunk(a):
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
