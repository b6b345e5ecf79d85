"""The embedded engine: pyarrow + polars, a process pool over input files, spill to Parquet.

How it runs a plan (and why):

* Consecutive row-local nodes (`MapBatches`) are *fused* into one chain and run
  per partition (an input file or a spilled part) in a process pool, streaming
  Arrow batches, so memory is bounded by a batch, not by the data.
* A node whose output is used twice, and every barrier input (`Join`,
  `Aggregate`, `ConnectedComponents`), is *materialized* to Parquet parts in the
  work folder, so no node runs (and counts its drops) twice.
* Barriers run in polars' streaming engine (joins, group-bys) or scipy's
  sparse connected components, over the spilled parts.
* The sink shuffles rows into shard spill files by `shard_ids(key)`; then each
  shard is sorted and written by `datakit.io.sinks.write_shard` — the same
  function the Spark engine calls, which is what makes the bytes identical.
* Resume: every partition task writes `part-N.parquet` and then `part-N.done.json`
  (its counters and an input fingerprint). A rerun reuses finished parts whose
  input fingerprint matches — with their counters, so accounting is the same as
  in a clean run.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datakit.accounting import NodeStats, stage_report
from datakit.engines.core import (RunResult, apply_map, commit_run, conform, droplog_rows, quarantine_rows,
                                  remove_if_empty, resolve_sink, reused_shards, write_side_output)
from datakit.io import sinks
from datakit.io.atomic import sha256_file
from datakit.io.fs import filesystem
from datakit.io.readers import iter_source
from datakit.plan import Aggregate, ConnectedComponents, Join, MapBatches, Node, Plan, Source
from datakit.workers import drop_pool, pool, usable_cpus

log = logging.getLogger("datakit.engine.local")

SPILL_ROW_GROUP = 50_000


class EngineError(RuntimeError):
    """The job failed for a reason that is not the user's input (a worker died); the CLI exits 3."""


# --------------------------------------------------------------------------- partitions

@dataclass(frozen=True)
class Partition:
    """One unit of parallel work: an input file (Source) or a spilled Parquet part."""

    kind: str  # "jsonl" | "parquet" (input file) | "spill" (our own Parquet part)
    url: str
    schema: pa.Schema | None = None
    row_groups: tuple[int, int] | None = None  # a slice of a spilled file's row groups
    digest: str | None = None  # sha256 of a spill file, computed once by whoever wrote it

    def fingerprint(self) -> str:
        fs, p = filesystem(self.url)
        info = fs.info(p)
        if self.kind == "spill":
            return f"{self.digest or sha256_file(self.url)}|{self.row_groups}"
        return f"{self.url}|{info.get('size')}|{info.get('mtime', info.get('LastModified', ''))}"

    def batches(self) -> Iterator[pa.RecordBatch]:
        if self.kind in ("jsonl", "parquet"):
            for b in iter_source(self.url, self.kind, self.schema):
                yield conform(b, self.schema) if self.schema is not None else b
        else:
            pf = pq.ParquetFile(self.url)
            groups = range(*self.row_groups) if self.row_groups else None
            if groups is not None and len(groups) == 0:
                return
            for b in pf.iter_batches(batch_size=8192, row_groups=groups):
                yield conform(b, self.schema) if self.schema is not None else b


# --------------------------------------------------------------------------- chain execution (in workers)

@dataclass
class ChainTask:
    """Run `ops` (fused MapBatches) over one partition and spill the result.

    `stage_of`/`ids` identify nodes for counters; `shards`/`shard_key` make the
    output shuffle into per-shard files (the sink) instead of one part.
    """

    partition: Partition
    ops: list[MapBatches]
    out_dir: str
    part_name: str
    node_ids: list[int]
    shards: int = 0
    shard_key: str = ""
    aux_dir: str = ""
    broadcasts: dict[int, str] = field(default_factory=dict)


def _apply_op(op: MapBatches, batch: pa.RecordBatch, st: NodeStats, aux: "_AuxWriters") -> pa.RecordBatch:
    st.rows_in += batch.num_rows
    t0 = time.perf_counter()
    r = apply_map(op.fn, batch, op.schema)
    st.metrics.update(r.metrics)
    if r.dropped is not None:
        st.dropped.update(r.drops)
        if op.quarantine:
            aux.q.append(quarantine_rows(op.stage, r.dropped))
        elif op.drop_log_key:
            aux.d.append(droplog_rows(op.stage, op.drop_log_key, r.dropped))
    st.rows_out += r.kept.num_rows
    st.seconds += time.perf_counter() - t0
    return r.kept


def _fusible(node: Node) -> bool:
    return isinstance(node, MapBatches) or (isinstance(node, Join) and node.broadcast)


_BROADCAST_CACHE: dict[tuple[str, int, int], pa.Table] = {}


def _broadcast_table(path: str) -> pa.Table:
    """Each worker process reads a broadcast side once per run.

    Keyed by the file's path, size and mtime, not the path alone: a rerun of the
    same pipeline writes the same path (the work folder is named by the config
    hash) with new contents, and a kept worker process (or an in-process run)
    must not join against the previous run's table.
    """
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _BROADCAST_CACHE:
        _BROADCAST_CACHE.clear()
        _BROADCAST_CACHE[key] = pq.read_table(path)
    return _BROADCAST_CACHE[key]


def _apply_broadcast_join(op: Join, batch: pa.RecordBatch, st: NodeStats, right: pa.Table) -> pa.RecordBatch:
    """Join one left batch with the in-memory right side.

    Only keys and row numbers go through Arrow's hash join (its payload columns may
    not be nested types); the rows are then gathered with `take`. Null keys never
    match (as in SQL, polars and Spark).
    """
    t0 = time.perf_counter()
    n = batch.num_rows
    st.rows_in += n
    knames = [f"__k{i}" for i in range(len(op.left_on))]
    left = pa.table([batch.column(c) for c in op.left_on] + [pa.array(np.arange(n, dtype=np.int64))],
                    names=knames + ["__row"])
    rk = pa.table([right.column(c) for c in op.right_on] + [pa.array(np.arange(right.num_rows, dtype=np.int64))],
                  names=knames + ["__rrow"])
    if op.how in ("anti", "semi"):
        hit = left.join(rk.select(knames).group_by(knames).aggregate([]), keys=knames, join_type="left semi")
        matched = np.zeros(n, dtype=bool)
        matched[hit.column("__row").to_numpy()] = True
        out = batch.filter(pa.array(~matched if op.how == "anti" else matched))
        if op.how == "anti":
            st.dropped[op.reason] += n - out.num_rows
    else:
        j = left.join(rk, keys=knames, join_type="inner" if op.how == "inner" else "left outer")
        j = j.sort_by("__row")
        lrows, rrows = j.column("__row"), j.column("__rrow")
        cols = {name: batch.column(name).take(lrows) for name in batch.schema.names}
        for f in op.schema:
            if f.name not in cols and f.name in right.schema.names:
                cols[f.name] = right.column(f.name).take(rrows)
        out = pa.table(cols).combine_chunks()
        out = out.to_batches()[0] if out.num_rows else pa.RecordBatch.from_pylist([], schema=out.schema)
    out = conform(out, op.schema)
    st.rows_out += out.num_rows
    st.seconds += time.perf_counter() - t0
    return out


class _AuxWriters:
    """Quarantine / drop-log rows of one task, written beside its output part."""

    def __init__(self, aux_dir: str, part_name: str) -> None:
        self.aux_dir, self.part_name = aux_dir, part_name
        self.q: list[pa.RecordBatch] = []
        self.d: list[pa.RecordBatch] = []

    def close(self) -> None:
        if self.q:
            pq.write_table(pa.Table.from_batches(self.q), f"{self.aux_dir}/quarantine-{self.part_name}.parquet")
        if self.d:
            pq.write_table(pa.Table.from_batches(self.d), f"{self.aux_dir}/droplog-{self.part_name}.parquet")


def run_chain(task: ChainTask) -> dict[str, Any]:
    """Worker entry point: stream one partition through the fused ops, spill, report counters."""
    done_path = f"{task.out_dir}/{task.part_name}.done.json"
    fp = task.partition.fingerprint()
    if os.path.exists(done_path):
        try:
            done = json.loads(Path(done_path).read_text())
            if done.get("fingerprint") == fp and all(os.path.exists(f) for f in done["files"]):
                done["reused"] = True
                return done
        except (OSError, ValueError, KeyError):
            pass
    stats = {i: NodeStats() for i in task.node_ids}
    base_rows = 0
    aux = _AuxWriters(task.aux_dir, f"{Path(task.out_dir).name}-{task.part_name}")  # unique per chain and part
    writers: dict[int, pq.ParquetWriter] = {}
    files: dict[int, str] = {}
    out_schema = task.ops[-1].schema if task.ops else task.partition.schema
    try:
        for batch in task.partition.batches():
            base_rows += batch.num_rows
            for op in task.ops:
                if isinstance(op, Join):
                    batch = _apply_broadcast_join(op, batch, stats[op.id], _broadcast_table(task.broadcasts[op.id]))
                else:
                    batch = _apply_op(op, batch, stats[op.id], aux)
            _release_free_memory()
            if batch.num_rows == 0:
                continue
            if task.shards:
                ids = sinks.shard_ids(batch.column(task.shard_key), task.shards)
                for s in np.unique(ids):
                    sub = batch.filter(pa.array(ids == s))
                    _writer(writers, files, int(s), task, out_schema).write_batch(sub)
            else:
                _writer(writers, files, 0, task, out_schema).write_batch(batch)
    finally:
        for w in writers.values():
            w.close()
    aux.close()
    result = {
        "fingerprint": fp,
        "files": sorted(files.values()),
        "digests": {f: sha256_file(f) for f in files.values() if not task.shards},
        "shard_files": {str(k): v for k, v in files.items()},
        "base_rows": base_rows,
        "stats": {str(k): v.to_json() for k, v in stats.items()},
        "reused": False,
    }
    tmp = done_path + ".tmp"
    Path(tmp).write_text(json.dumps(result))
    os.replace(tmp, done_path)
    return result


def _writer(writers, files, key: int, task: ChainTask, schema: pa.Schema):
    """Spill writer for one output of a task. Shard shuffles write Arrow IPC streams: a task
    may hold one writer per shard open, and an IPC writer keeps no page buffers or compression
    contexts (a Parquet writer each holds megabytes, so memory would grow with the shard count)."""
    if key not in writers:
        sub = f"{task.out_dir}/shard={key:05d}" if task.shards else task.out_dir
        os.makedirs(sub, exist_ok=True)
        if task.shards:
            path = f"{sub}/{task.part_name}.arrows"
            writers[key] = _IpcSpill(path, schema)
        else:
            path = f"{sub}/{task.part_name}.parquet"
            writers[key] = pq.ParquetWriter(path, schema, compression="zstd")
        files[key] = path
    return writers[key]


class _IpcSpill:
    """An Arrow IPC stream file that closes its file handle too."""

    def __init__(self, path: str, schema: pa.Schema) -> None:
        self._file = pa.OSFile(path, "wb")
        self._writer = pa.ipc.new_stream(self._file, schema)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)

    def close(self) -> None:
        self._writer.close()
        self._file.close()


def _read_spill(path: str) -> pa.Table:
    if path.endswith(".arrows"):
        with pa.OSFile(path, "rb") as f:
            return pa.ipc.open_stream(f).read_all()
    return pq.read_table(path)


def _release_free_memory() -> None:
    """Give freed heap pages back to the OS after each batch.

    Parsing a batch creates many short-lived large Python strings; glibc keeps the
    freed pages, so without this the peak RSS of a long stream creeps up with the
    input size even though live memory stays flat (measured: 3k vs 30k events,
    330 MB vs 650 MB peak; with the trim the growth is bounded).
    """
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _load_libc():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()


def write_one_shard(args: tuple[list[str], int, Any, pa.Schema]) -> dict[str, Any]:
    """Worker entry point for the sink: read one shard's spill parts and write it."""
    paths, shard, spec, schema = args
    _release_free_memory()
    tables = [_read_spill(p) for p in paths]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return sinks.write_shard(table, shard, spec, schema)


# --------------------------------------------------------------------------- the engine

# Below this much input (compressed files and Parquet counted at ~5x their size on disk) a 2-core run
# stays in this process unless `workers` is given: spawning a pool and importing pyarrow/polars/numba/
# spaCy in each worker costs ~3 s, more than a second core saves on it (measured on the quickstart
# pipeline, 2 cores: 3k events (2 MB .zst) 7.9 s in-process vs 11.5 s with 2 workers; 6k (3.6 MB)
# 9.9 vs 10.8 s; 20k (13 MB) 24.6 vs 21.9 s). With more cores the pool pays off sooner: the
# threshold is divided by (workers - 1).
SMALL_INPUT_BYTES = 32 << 20
_COMPRESSED = (".zst", ".gz", ".zstd", ".bz2", ".xz", ".parquet", ".pq")


def _input_bytes(plan: Plan) -> int | None:
    """Uncompressed-equivalent size of the plan's local input files; None if any is remote or missing."""
    total = 0
    for node in plan.nodes():
        if isinstance(node, Source):
            for path in node.paths:
                local = path[len("file://"):] if path.startswith("file://") else path
                if "://" in local or not os.path.exists(local):
                    return None
                total += os.path.getsize(local) * (5 if local.endswith(_COMPRESSED) else 1)
    return total


class LocalEngine:
    """Execute a `Plan` on this machine. `workers=1` runs in-process (handy in notebooks/tests).

    `workers=None` (the default): all cores, except for small local inputs
    (< SMALL_INPUT_BYTES), which run in-process: the pool would cost more than it saves.
    """

    name = "local"

    def __init__(self, workers: int | None = None, work_dir: str | None = None, progress: bool | None = None,
                 keep_work: bool = False) -> None:
        self.workers = max(1, workers or usable_cpus())
        self._auto_workers = workers is None
        self._all_workers = self.workers
        self.work_dir = work_dir
        self.progress = progress
        self.keep_work = keep_work

    # -- public
    def execute(self, plan: Plan) -> RunResult:
        import multiprocessing

        if getattr(multiprocessing.current_process(), "_inheriting", False):
            # a spawned worker is importing the user's script, which runs the pipeline at top level
            raise RuntimeError("datakit: a worker process imported your script and it started a pipeline; "
                               "put the run under `if __name__ == \"__main__\":` (worker processes are spawned)")
        t0 = time.perf_counter()
        self.workers = self._all_workers
        _BROADCAST_CACHE.clear()  # this process's copy (pool workers check size and mtime of the file)
        if self._auto_workers and self.workers > 1:
            size = _input_bytes(plan)
            if size is not None and size < SMALL_INPUT_BYTES // (self.workers - 1):
                log.info("small input (%d MB): running in-process (pass workers=N to use a pool)", size >> 20)
                self.workers = 1
        self._plan = plan
        self._stats: dict[int, NodeStats] = defaultdict(NodeStats)
        self._rows: dict[int, int] = {}
        self._materialized: dict[int, list[Partition]] = {}
        order = plan.nodes()
        self._index = {n.id: i for i, n in enumerate(order)}
        consumers: Counter = Counter(i.id for n in order for i in n.inputs)
        self._shared = {nid for nid, c in consumers.items() if c > 1}
        work = self._work_root(plan)
        self._work = work
        self._aux = f"{work}/aux"
        os.makedirs(self._aux, exist_ok=True)
        self._reused = 0
        self._sink_parts = None
        try:
            if plan.sink is None:
                self._materialize(plan.root)
                out = None
            else:
                out = self._sink(plan)
            manifest = None
        except Exception:
            # a failed task may leave workers mid-job: start fresh next time, and let tasks that are
            # still running finish first, so a rerun (resume) never races them in the work folder
            drop_pool(self.workers, wait=True)
            raise
        except BaseException:  # Ctrl-C: the workers got it too; do not wait on them
            drop_pool(self.workers)
            raise
        stages = stage_report(plan, self._stats, self._rows)
        seconds = time.perf_counter() - t0
        if plan.sink is not None:
            self._write_aux_outputs(plan.sink.path)
            manifest = self._commit(plan, stages, seconds)
        if not self.keep_work:  # (a run without a sink used a temp folder: nothing in it is kept either)
            shutil.rmtree(work, ignore_errors=True)
            remove_if_empty(str(Path(work).parent))
        return RunResult(output_path=out, stages=stages, manifest=manifest, seconds=seconds,
                         extra={"reused_tasks": self._reused, "workers": self.workers,
                                "reused_shards": reused_shards(getattr(self, "_sink_infos", []))})

    # -- work folder
    def _work_root(self, plan: Plan) -> str:
        if self.work_dir:
            root = self.work_dir
        elif plan.sink is not None and "://" not in plan.sink.path:
            root = str(Path(plan.sink.path) / "_work")
        else:
            root = tempfile.mkdtemp(prefix="datakit-work-")
        path = f"{root}/{plan.config_hash[:16]}"
        os.makedirs(path, exist_ok=True)
        return path

    # -- scheduling
    def _map(self, fn: Callable, items: list, what: str) -> list:
        if not items:
            return []
        if self.workers == 1 or len(items) == 1:
            return [fn(i) for i in _progress(items, what, self.progress)]
        futures = [pool(self.workers).submit(fn, i) for i in items]
        try:
            return [f.result() for f in _progress(futures, what, self.progress)]
        except BrokenProcessPool:
            raise EngineError(
                f"a local worker process died during '{what}' (killed, out of memory, or a script that runs its "
                "pipeline at import time: use `if __name__ == \"__main__\":`); rerun to resume finished work") from None

    def _chain_of(self, node: Node) -> tuple[Node, list[Node]]:
        """Walk down fusible nodes (MapBatches, broadcast joins) to the base node (a Source,
        barrier or shared node). A broadcast join streams its big (left) side through the chain
        against the small right side held in memory, so the big side is never shuffled or spilled."""
        ops: list[Node] = []
        cur = node
        while _fusible(cur) and (cur is node or cur.id not in self._shared):
            ops.append(cur)
            cur = cur.input if isinstance(cur, MapBatches) else cur.left
        ops.reverse()
        return cur, ops

    def _broadcast_tables(self, ops: list[Node]) -> dict[int, str]:
        """Materialize each broadcast join's right side into one Parquet file the workers load once."""
        out = {}
        for op in ops:
            if isinstance(op, Join):
                parts = self._materialize(op.right)
                path = f"{self._work}/broadcast-n{self._index[op.id]:03d}.parquet"
                files = list(dict.fromkeys(p.url for p in parts))
                table = (pa.concat_tables([pq.read_table(f) for f in files]) if files
                         else op.right.schema.empty_table())
                pq.write_table(table, path)
                out[op.id] = path
        return out

    def _partitions(self, base: Node) -> list[Partition]:
        if isinstance(base, Source):
            if base.id not in self._rows:
                self._rows[base.id] = 0  # filled by chain results (counted while streaming)
            kind = "jsonl" if base.format == "jsonl" else "parquet"
            return [Partition(kind, u, base.schema if kind == "parquet" else None) for u in base.paths]
        return self._materialize(base)

    def _run_chain(self, node: Node, shards: int = 0, shard_key: str = "", name: str | None = None) -> list[dict[str, Any]]:
        base, ops = self._chain_of(node)
        parts = self._partitions(base)
        seg = name or f"n{self._index[node.id]:03d}"
        out_dir = f"{self._work}/{seg}"
        os.makedirs(out_dir, exist_ok=True)
        bcast = self._broadcast_tables(ops)
        tasks = [ChainTask(p, ops, out_dir, f"part-{i:05d}", [o.id for o in ops], shards, shard_key, self._aux, bcast)
                 for i, p in enumerate(parts)]
        results = self._map(run_chain, tasks, f"{seg}: {' > '.join(getattr(o, 'name', 'join') for o in ops) or 'read'}")
        self._reused += sum(1 for r in results if r.get("reused"))
        if isinstance(base, Source):
            self._rows[base.id] = sum(r["base_rows"] for r in results)
        for r in results:
            for k, v in r["stats"].items():
                self._stats[int(k)].merge(NodeStats.from_json(v))
        for op in ops:
            self._rows[op.id] = self._stats[op.id].rows_out
        if not ops:
            self._rows[node.id] = sum(r["base_rows"] for r in results)
        return results

    def _materialize(self, node: Node) -> list[Partition]:
        if node.id in self._materialized:
            return self._materialized[node.id]
        if isinstance(node, (MapBatches, Source)) or _fusible(node):
            results = self._run_chain(node)
            parts = [Partition("spill", f, node.schema, digest=r.get("digests", {}).get(f))
                     for r in results for f in r["files"]]
        else:
            for i in node.inputs:  # inputs first, so the barrier's seconds are its own work only
                self._materialize(i)
            t0 = time.perf_counter()
            parts = self._barrier(node)
            self._stats[node.id].seconds += time.perf_counter() - t0
        self._materialized[node.id] = parts
        return parts

    # -- barriers (polars / scipy over spilled parts)
    def _lazy(self, node: Node) -> pl.LazyFrame:
        parts = self._materialize(node)
        files = list(dict.fromkeys(p.url for p in parts))
        if not files:
            return pl.from_arrow(node.schema.empty_table()).lazy()
        return pl.scan_parquet(files)

    def _spill_polars(self, lf: pl.LazyFrame, node: Node) -> list[Partition]:
        """Stream a polars query to one Parquet file, then split it into row-group partitions
        so the next fused chain runs in parallel without the result ever being in memory whole."""
        out_dir = f"{self._work}/n{self._index[node.id]:03d}"
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir)
        os.makedirs(out_dir, exist_ok=True)
        path = f"{out_dir}/result.parquet"
        lf.sink_parquet(path, row_group_size=SPILL_ROW_GROUP, compression="zstd")
        meta = pq.ParquetFile(path).metadata
        self._rows[node.id] = meta.num_rows
        groups = meta.num_row_groups
        n_parts = max(1, min(self.workers * 2, groups))
        bounds = np.linspace(0, groups, n_parts + 1).astype(int)
        digest = sha256_file(path)  # once here, not once per row-group partition in every task
        return [Partition("spill", path, node.schema, (int(a), int(b)), digest)
                for a, b in zip(bounds[:-1], bounds[1:]) if b > a] or [Partition("spill", path, node.schema, (0, 0), digest)]

    def _barrier(self, node: Node) -> list[Partition]:
        if isinstance(node, Join):
            left, right = self._lazy(node.left), self._lazy(node.right)
            how = {"inner": "inner", "left": "left", "anti": "anti", "semi": "semi"}[node.how]
            if node.how in ("anti", "semi"):
                right = right.select([pl.col(c) for c in node.right_on]).unique()
            else:
                keep = [c for c in node.right.schema.names if c in node.schema.names or c in node.right_on]
                right = right.select(keep)
            lf = left.join(right, left_on=node.left_on, right_on=node.right_on, how=how, nulls_equal=False,
                           coalesce=True)
            parts = self._spill_polars(lf.select(node.schema.names), node)
            rows_in = self._rows[node.left.id]
            st = self._stats[node.id]
            st.rows_in += rows_in
            st.rows_out += self._rows[node.id]
            if node.how == "anti":
                st.dropped[node.reason] += rows_in - self._rows[node.id]
            return parts
        if isinstance(node, Aggregate):
            exprs = []
            for out, (op, col) in node.aggs.items():
                e = {"min": pl.col(col).min(), "max": pl.col(col).max(), "count": pl.len(),
                     "sum": pl.col(col).sum()}[op]
                exprs.append(e.alias(out))
            lf = self._lazy(node.input).group_by(node.keys).agg(exprs)
            return self._spill_polars(lf, node)
        if isinstance(node, ConnectedComponents):
            edges = self._lazy(node.input).select(["src", "dst"]).collect(engine="streaming")
            table = connected_components_table(edges["src"].to_arrow(), edges["dst"].to_arrow())
            return self._spill_polars(pl.from_arrow(table).lazy(), node)
        raise NotImplementedError(f"local engine cannot run {type(node).__name__}")

    # -- sink and commit
    def _sink(self, plan: Plan) -> str:
        spec = plan.sink
        rows = 0
        if not (isinstance(spec.shards, int) and spec.shards > 0):
            # "auto": from the row count of the final relation, so materialize it first
            self._sink_parts = self._materialize(plan.root)
            rows = self._rows[plan.root.id]
        resolved = resolve_sink(spec, rows)
        shards, key = resolved.shards, spec.key
        if self._sink_parts is not None:
            # already materialized for the row count: shuffle the spilled parts into shards
            tasks = [ChainTask(p, [], f"{self._work}/sink", f"part-{i:05d}", [], shards, key, self._aux)
                     for i, p in enumerate(self._sink_parts)]
            os.makedirs(f"{self._work}/sink", exist_ok=True)
            results = self._map(run_chain, tasks, "shuffle")
            self._reused += sum(1 for r in results if r.get("reused"))
        else:
            results = self._run_chain(plan.root, shards=shards, shard_key=key, name="sink")
        by_shard: dict[int, list[str]] = defaultdict(list)
        for r in results:
            for s, f in r["shard_files"].items():
                by_shard[int(s)].append(f)
        infos = self._map(write_one_shard, [(sorted(by_shard.get(s, [])), s, resolved, plan.root.schema)
                                            for s in range(shards)], "write shards")
        self._sink_infos = infos
        self._resolved_spec = resolved
        return spec.path

    def _write_aux_outputs(self, out: str) -> None:
        """Gather the tasks' quarantine and drop-log parts into `_quarantine/` and `_dropped/`."""
        for side in ("quarantine", "droplog"):
            files = sorted(Path(self._aux).glob(f"{side}-*.parquet"))
            if files:
                write_side_output(pa.concat_tables([pq.read_table(f) for f in files]), out, side)

    def _commit(self, plan: Plan, stages: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        return commit_run(plan, self._resolved_spec, self._sink_infos, stages, seconds, engine=self.name,
                          reused_tasks=self._reused, runtime={"workers": self.workers})


def connected_components_table(src: pa.Array, dst: pa.Array) -> pa.Table:
    """Union-find by sparse graph: (node, component = smallest node id in its component).

    scipy's C implementation runs in O(V + E) with ~40 bytes per edge, far from
    the Python-dict union-find that made single-node dedup take days elsewhere.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    src = pc.cast(src, pa.string()) if not isinstance(src, pa.ChunkedArray) else src.cast(pa.string())
    dst = pc.cast(dst, pa.string()) if not isinstance(dst, pa.ChunkedArray) else dst.cast(pa.string())
    all_nodes = pa.concat_arrays([_chunk(src), _chunk(dst)])
    if len(all_nodes) == 0:
        return pa.table({"node": pa.array([], pa.string()), "component": pa.array([], pa.string())})
    uniq = pc.unique(all_nodes)
    uniq = uniq.take(pc.sort_indices(uniq))  # sorted ids: index order == string order
    si = pc.index_in(_chunk(src), value_set=uniq).to_numpy()
    di = pc.index_in(_chunk(dst), value_set=uniq).to_numpy()
    n = len(uniq)
    g = coo_matrix((np.ones(len(si), dtype=np.int8), (si, di)), shape=(n, n))
    _, labels = connected_components(g, directed=True, connection="weak")
    # smallest member per label: nodes are sorted, so the first index seen per label is the min
    first = np.full(labels.max() + 1, n, dtype=np.int64)
    np.minimum.at(first, labels, np.arange(n))
    comp = uniq.take(pa.array(first[labels]))
    return pa.table({"node": uniq, "component": comp})


def _chunk(a):
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


def _progress(items, what: str, enabled: bool | None):
    """A rich progress bar over items when stderr is a terminal (or forced on)."""
    import sys

    if enabled is False or (enabled is None and not sys.stderr.isatty()) or len(items) < 2:
        return items
    from rich.progress import track

    if items and hasattr(items[0], "result"):
        from concurrent.futures import as_completed

        list(track(as_completed(items), total=len(items), description=what, transient=True))
        return items
    return track(items, description=what, transient=True)

