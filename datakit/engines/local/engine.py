"""The embedded engine: pyarrow + polars, a process pool over input files, spill to Parquet.

How it runs a plan (and why):

* Consecutive row-local nodes (`MapBatches`) are *fused* into one chain and run
  per partition (an input file or a spilled part) in a process pool, streaming
  Arrow batches, so memory is bounded by a batch, not by the data.
* A node whose output is used twice, and every barrier input (`Join`,
  `Aggregate`, `ConnectedComponents`), is *materialized* to Parquet parts in the
  work folder, so no node runs (and counts its drops) twice.
* Barriers run in polars' streaming engine (joins, group-bys) or core's
  connected components (numpy hook-and-jump), over the spilled parts.
* The sink shuffles rows into shard spill files by `shard_ids(key)`; then each
  shard is sorted and written by `datakit.io.sinks.write_shard` — the same
  function the Spark engine calls, which is what makes the bytes identical.
* Resume: every partition task writes `part-N.parquet` and then `part-N.done.json`
  (its counters and an input fingerprint). A rerun reuses finished parts whose
  input fingerprint matches — with their counters, so accounting is the same as
  in a clean run. For an object-store output each finished task is also copied to
  `<out>/_work/<run id>/` (marker last), where a rerun on another host finds it
  (`datakit/io/tempwork.py`).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datakit.accounting import NodeStats, stage_report
from datakit.engines import check_flag, check_folder
from datakit.engines.core import (Engine, RunResult, commit_run, remove_if_empty, resolve_sink, reused_shards,
                                  write_side_output)
from datakit.engines.local import partitioned_join, scheduler
from datakit.engines.local.broadcast import clear_broadcast_cache
from datakit.engines.local.chain import ChainTask, fusible, run_chain, write_one_shard
from datakit.interrupts import held_until_done
from datakit.engines.local.spill import SPILL_COMPRESSION, SPILL_ROW_GROUP, Partition
from datakit.io import identity, publish, storage, tempwork
from datakit.io.atomic import sha256_file
from datakit.plan import Aggregate, ConnectedComponents, Join, MapBatches, Node, Plan, Source
from datakit.workers import drop_pool, expect_code, usable_cpus

if TYPE_CHECKING:  # polars is imported by the first barrier: a plan of row-local stages never needs it
    import polars as pl


def _bucket_files(results: list[dict[str, Any]], buckets: int) -> list[list[str]]:
    """Per bucket, the files a shuffle's tasks wrote for it (a task with no row for a bucket wrote none)."""
    return [[r["shard_files"][str(b)] for r in results if str(b) in r["shard_files"]] for b in range(buckets)]


class LocalEngine(Engine):
    """Execute a `Plan` on this machine. `workers=1` runs in-process (handy in notebooks/tests).

    `workers=None` (the default): all cores, except for small local inputs
    (< SMALL_INPUT_BYTES, or NATIVE_SMALL_INPUT_BYTES for a plan whose maps all run on native
    threads, e.g. tokenize-only), which run in-process: the pool would cost more than it saves
    (`scheduler.workers_for`).
    """

    name = "local"

    def __init__(self, workers: int | None = None, work_dir: str | None = None, progress: bool | None = None,
                 keep_work: bool = False) -> None:
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive number (got {workers!r}); leave it unset for all cores")
        check_flag("progress", progress, none_ok=True)  # before any work: keep_work="no" is truthy
        check_flag("keep_work", keep_work)
        work_dir = check_folder("work_dir", work_dir)
        self.workers = max(1, workers or usable_cpus())
        self._auto_workers = workers is None
        self._all_workers = self.workers
        self.work_dir = work_dir
        self.progress = progress
        self.keep_work = keep_work

    # -- public
    def execute(self, plan: Plan) -> RunResult:
        refuse_run_at_worker_import()
        return super().execute(plan)

    def _execute(self, plan: Plan) -> RunResult:
        t0 = time.perf_counter()
        expect_code((plan.environment.get("code") or {}).get("modules"))  # a kept pool with other code is replaced
        self.workers = self._all_workers
        clear_broadcast_cache()
        if self._auto_workers:
            self.workers = scheduler.workers_for(plan, self.workers)
        self._token = uuid.uuid4().hex[:12]  # this run's prefix of batch-function tokens (core.worker_fn)
        self._stats: dict[int, NodeStats] = defaultdict(NodeStats)
        self._rows: dict[int, int] = {}
        self._materialized: dict[int, list[Partition]] = {}
        order = plan.nodes()
        self._index = {n.id: i for i, n in enumerate(order)}
        consumers: Counter = Counter(i.id for n in order for i in n.inputs)
        self._shared = {nid for nid, c in consumers.items() if c > 1}
        self._consumers: dict[int, list[Node]] = defaultdict(list)
        for n in order:
            for i in dict.fromkeys(n.inputs):
                self._consumers[i.id].append(n)
        self._root_id = plan.root.id
        self._used: dict[int, list[str] | None] = {}
        self._inputs = identity.input_files(plan.input_files())
        if plan.sink is not None:
            publish.retract(plan.sink.path)  # readers see no dataset until the new one is committed
        work = self._work_root(plan)
        self._work = work
        self._aux = f"{work}/aux"
        os.makedirs(self._aux, exist_ok=True)
        self._reused = 0
        self._aux_files: set[str] = set()
        self._worker_tasks: list[dict[str, Any]] = []  # pool tasks' costs, for _run.json's timing
        self._sink_parts = None
        where = plan.sink.path if plan.sink is not None else "the input"
        try:
            if plan.sink is None:
                self._materialize(plan.root)
                out = None
            else:
                out = self._sink(plan)
            manifest = None
        except Exception as e:
            # a failed task may leave workers mid-job: start fresh next time, and let tasks that are
            # still running finish first, so a rerun (resume) never races them in the work folder
            drop_pool(self.workers, wait=True)  # (the work folder stays: a rerun resumes from it)
            if plan.sink is None or not self.keep_work:  # a scratch copy: the durable one is under the output
                tempwork.discard(self._temp_root)
            if storage.is_storage_error(e):
                raise storage.describe(e, where, "read or write under") from None
            raise
        except BaseException:  # Ctrl-C: the workers got it too; do not wait on them
            drop_pool(self.workers)
            if plan.sink is None or not self.keep_work:
                tempwork.discard(self._temp_root)
            raise
        stages = stage_report(plan, self._stats, self._rows)
        seconds = time.perf_counter() - t0
        with held_until_done("committing the output and removing its work folder"):
            if plan.sink is not None:
                try:
                    self._write_aux_outputs(plan.sink.path)
                    publish.sweep(plan.sink.path)  # temp files of interrupted earlier writes
                    manifest = self._commit(plan, stages, seconds)
                except Exception as e:
                    if storage.is_storage_error(e):
                        raise storage.describe(e, where, "write the outputs under") from None
                    raise
            if not self.keep_work:  # (a run without a sink used a temp folder: nothing in it is kept either)
                shutil.rmtree(work, ignore_errors=True)
                remove_if_empty(str(Path(work).parent))
                tempwork.discard(self._temp_root)
                if plan.sink is not None and not self.work_dir:
                    publish.remove_work(plan.sink.path)  # work folders of earlier runs with another identity
        return RunResult(output_path=out, stages=stages, manifest=manifest, seconds=seconds,
                         extra={"reused_tasks": self._reused, "workers": self.workers,
                                "worker_tasks": self._worker_tasks,
                                "reused_shards": reused_shards(getattr(self, "_sink_infos", []))})

    # -- work folder
    def _work_root(self, plan: Plan) -> str:
        """The work folder, named by the full run identity (config hash + input files with sizes and
        mtimes + output), so a rerun of the same run finds its finished tasks and a run over other
        input never picks up another run's parts or quarantine rows.

        Where: `<out>/_work/<run id>` for a local output, kept when a run fails, removed when it is
        done. For an object-store output the same durable folder is `<out>/_work/<run id>` on the
        store, holding each finished task (uploaded once, `done.json` last), so a rerun on any host
        reuses it; the engine spills to a local scratch copy under the same run id in this
        machine's cache folder, removed at the end of every run (io/tempwork.py)."""
        rid = identity.run_id(plan.config_hash, self._inputs, plan.sink.path if plan.sink else None)
        self._temp_root = None
        self._durable = ""
        if self.work_dir:
            root = self.work_dir
        elif plan.sink is not None and "://" not in plan.sink.path:
            root = str(Path(plan.sink.path) / "_work")
        else:  # object store: a scratch copy here; no sink: a folder of this run alone (no output lock)
            self._durable = (tempwork.durable_root(plan.sink.path, rid) or "") if plan.sink is not None else ""
            path = self._temp_root = tempwork.claim(rid if plan.sink is not None else uuid.uuid4().hex)
            return path
        # the scratch folders object-store runs killed on this host left (found in an operations review: the
        # README says the next run removes them, but only the next object-store run did)
        tempwork.sweep()
        path = f"{root}/{rid[:16]}"
        os.makedirs(path, exist_ok=True)
        # private: a task's spill before scrub_pii holds raw text, kept after a failure for the resume
        # (found in review: a failed run left every planted secret readable in _work/)
        for folder in (root, path):
            try:
                os.chmod(folder, 0o700)
            except OSError:
                pass
        return path

    # -- scheduling
    def _map(self, fn: Callable, items: list, what: str, label: str | None = None, guard_here: bool = True) -> list:
        results = scheduler.run_tasks(fn, items, what, self.workers, self.progress, f"{self._work}/_beats", label,
                                      costs=self._worker_tasks, guard_here=guard_here)
        # the side-output parts this run's tasks wrote or reused (see _write_aux_outputs)
        self._aux_files.update(f for r in results if isinstance(r, dict) for f in r.get("aux_files", ()))
        return results

    def _chain_of(self, node: Node) -> tuple[Node, list[Node]]:
        """Walk down fusible nodes (MapBatches, broadcast joins) to the base node (a Source,
        barrier or shared node). A broadcast join streams its big (left) side through the chain
        against the small right side held in memory, so the big side is never shuffled or spilled."""
        ops: list[Node] = []
        cur = node
        while fusible(cur) and (cur is node or cur.id not in self._shared):
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
            listed = identity.listed_stamps(self._inputs)  # each task checks its file against the listing
            return [Partition(kind, u, base.schema if kind == "parquet" else None, digest=listed.get(u))
                    for u in base.paths]
        return self._materialize(base)

    def _run_chain(self, node: Node, shards: int = 0, shard_key: str = "", name: str | None = None,
                   shard_by: str = "hash") -> list[dict[str, Any]]:
        base, ops = self._chain_of(node)
        parts = self._partitions(base)
        first = ops[0] if ops else None
        if (isinstance(first, MapBatches) and first.reads is not None and parts
                and all(p.kind == "spill" and p.schema is not None and set(first.reads) <= set(p.schema.names)
                        for p in parts)):
            # the first function reads only these columns (its promise): read just them from the spill, as
            # the Spark engine ships just them to Python; a function that breaks its promise then fails
            # on both engines alike instead of only on Spark
            parts = [dataclasses.replace(p, schema=pa.schema([p.schema.field(c) for c in first.reads]),
                                         columns=tuple(first.reads)) for p in parts]
        seg = name or f"n{self._index[node.id]:03d}"
        out_dir = f"{self._work}/{seg}"
        os.makedirs(out_dir, exist_ok=True)
        bcast = self._broadcast_tables(ops)
        tasks = [ChainTask(p, ops, out_dir, f"part-{i:05d}", [o.id for o in ops], shards, shard_key, self._aux, bcast,
                           shard_by, self._token, self._work, self._durable) for i, p in enumerate(parts)]
        stages = list(dict.fromkeys(o.stage for o in ops if ":" not in o.stage and o.stage != "input")) or [node.stage]
        results = self._map(run_chain, tasks, f"{seg}: {' > '.join(getattr(o, 'name', 'join') for o in ops) or 'read'}",
                            label=f"{', '.join(stages)}{' -> shards' if shards else ''}")
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
        if isinstance(node, (MapBatches, Source)) or fusible(node):
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

    # -- barriers (polars / core.connected_components_table over spilled parts)
    def _lazy(self, node: Node) -> pl.LazyFrame:
        import polars as pl

        parts = self._materialize(node)
        files = list(dict.fromkeys(p.url for p in parts))
        if not files:
            return pl.from_arrow(node.schema.empty_table()).lazy()
        return pl.scan_parquet(files)

    def _spill_polars(self, lf: pl.LazyFrame, node: Node, schema: pa.Schema) -> list[Partition]:
        """Stream a polars query to one Parquet file, then split it into row-group partitions
        so the next fused chain runs in parallel without the result ever being in memory whole."""
        out_dir = f"{self._work}/n{self._index[node.id]:03d}"
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir)
        os.makedirs(out_dir, exist_ok=True)
        path = f"{out_dir}/result.parquet"
        lf.sink_parquet(path, row_group_size=SPILL_ROW_GROUP, **SPILL_COMPRESSION)
        meta = pq.ParquetFile(path).metadata
        self._rows[node.id] = meta.num_rows
        groups = meta.num_row_groups
        n_parts = max(1, min(self.workers * 2, groups))
        bounds = np.linspace(0, groups, n_parts + 1).astype(int)
        digest = sha256_file(path)  # once here, not once per row-group partition in every task
        return [Partition("spill", path, schema, (int(a), int(b)), digest)
                for a, b in zip(bounds[:-1], bounds[1:]) if b > a] or [Partition("spill", path, schema, (0, 0), digest)]

    def _spill_bytes(self, node: Node) -> int:
        """Bytes on disk of a materialized node's spill files (0 where a size cannot be read)."""
        total = 0
        for url in dict.fromkeys(p.url for p in self._materialize(node)):
            try:
                total += os.path.getsize(url)
            except OSError:
                pass
        return total

    def _columns_used(self, node: Node) -> list[str] | None:
        """The columns of `node` that its consumers read, in schema order; None: all of them (or unknown).

        Why: a barrier's spill is what the next barrier scans and polars builds joins from. Dedup's
        verification joins every candidate pair with both ends' records, and only their texts are
        read after (`MapBatches.reads`); spilling whole records made the driver hold them in the
        join's build side and the spill carry them twice per pair. A consumer that says which
        columns it reads (a function's `reads`, an aggregate's keys and inputs, the graph's edges,
        a shuffled join's keys and what its own consumers read) lets the barrier keep only those;
        anything else (a function without `reads`, a broadcast join's chain, the sink) needs all.
        """
        if node.id in self._used:
            return self._used[node.id]
        names = node.schema.names
        need: set[str] | None = set()
        if node.id == self._root_id or not self._consumers.get(node.id):
            need = None
        for c in self._consumers.get(node.id, []):
            if need is None:
                break
            if isinstance(c, MapBatches):
                need = need | set(c.reads) if c.reads is not None else None
            elif isinstance(c, Aggregate):
                need |= set(c.keys) | {col for _, col in c.aggs.values()}
            elif isinstance(c, ConnectedComponents):
                need |= {"src", "dst"}
            elif isinstance(c, Join) and not fusible(c):
                used = self._columns_used(c)
                if c.left is node:
                    need |= set(c.left_on) | (set(names) if used is None else set(used) & set(names))
                if c.right is node and c.how in ("anti", "semi"):
                    need |= set(c.right_on)
                elif c.right is node:
                    cols = c.right_columns()
                    need |= set(c.right_on) | {r for o, r in cols.items() if used is None or o in used}
            else:
                need = None
        # (nothing read at all: keep every column rather than a spill of no columns, whose rows would be lost)
        out = None if not need or set(names) <= need else [n for n in names if n in need]
        self._used[node.id] = out
        return out

    @staticmethod
    def _kept_schema(node: Node, keep: list[str] | None) -> pa.Schema:
        """The schema of `node`'s spill: the columns `_columns_used` kept, or all of them."""
        return pa.schema([node.schema.field(c) for c in keep]) if keep is not None else node.schema

    def _barrier(self, node: Node) -> list[Partition]:
        from datakit.engines.local.barriers import barrier_query

        keep = self._columns_used(node)  # only what the consumers read (polars then reads no more of its inputs)
        left_bytes = right_bytes = buckets = 0
        if isinstance(node, Join):
            left_bytes, right_bytes = self._spill_bytes(node.left), self._spill_bytes(node.right)
            if node.how in ("inner", "left"):
                buckets = partitioned_join.buckets_for(right_bytes, self.workers, left_bytes)
        elif isinstance(node, Aggregate) and node.keys:
            buckets = partitioned_join.aggregate_buckets_for(self._spill_bytes(node.input), self.workers)
        if buckets and isinstance(node, Aggregate):
            parts = self._partitioned_aggregate(node, keep, buckets)
        elif buckets:
            parts = self._partitioned_join(node, keep, buckets)
        else:
            query = barrier_query(node, self._lazy, right_bytes > left_bytes, keep)
            parts = self._spill_polars(query, node, self._kept_schema(node, keep))
        if isinstance(node, Join):
            rows_in = self._rows[node.left.id]
            st = self._stats[node.id]
            st.rows_in += rows_in
            st.rows_out += self._rows[node.id]
            if node.how == "anti":
                st.dropped[node.reason] += rows_in - self._rows[node.id]
        return parts

    def _partitioned_join(self, node: Join, keep: list[str] | None, buckets: int) -> list[Partition]:
        """`node` as `buckets` joins in the pool (`partitioned_join.py`): both sides shuffled into buckets by
        their key columns (only the columns the output needs), then one task per bucket."""
        out_names = set(keep or node.schema.names)
        right_cols = [r for o, r in node.right_columns().items() if o in out_names]
        needs = {"left": list(dict.fromkeys([*node.left_on, *(c for c in node.left.schema.names if c in out_names)])),
                 "right": list(dict.fromkeys([*node.right_on, *right_cols]))}
        seg, base = self._bucket_folder(node)
        left_schema, left_tasks = self._shuffle_tasks(node.left, needs["left"], f"{base}/left", buckets, "join",
                                                      tuple(node.left_on))
        right_schema, right_tasks = self._shuffle_tasks(node.right, needs["right"], f"{base}/right", buckets, "join",
                                                        tuple(node.right_on))
        results = self._map(run_chain, left_tasks + right_tasks,  # both sides' tasks in one go
                            f"{seg}: {node.describe()}: {buckets} buckets")
        left = _bucket_files(results[:len(left_tasks)], buckets)
        right = _bucket_files(results[len(left_tasks):], buckets)
        stub = partitioned_join.stub_join(node, left_schema, right_schema)
        jobs = [(stub, left[b], right[b], f"{base}/part-{b:05d}.parquet", keep) for b in range(buckets) if left[b]]
        outs = self._map(partitioned_join.join_bucket, jobs, f"{seg}: join", label=node.stage)
        return self._bucket_parts(node, keep, base, outs, ("left", "right"))

    def _partitioned_aggregate(self, node: Aggregate, keep: list[str] | None, buckets: int) -> list[Partition]:
        """`node` as `buckets` group-bys in the pool: its input shuffled into buckets by all of its keys
        (`sinks.group_hashes`, null keys together; only the keys and the aggregated columns), then one
        task per bucket (`partitioned_join.aggregate_bucket`)."""
        needs = list(dict.fromkeys([*node.keys, *(col for _, col in node.aggs.values())]))
        seg, base = self._bucket_folder(node)
        schema, tasks = self._shuffle_tasks(node.input, needs, f"{base}/in", buckets, "group", tuple(node.keys))
        files = _bucket_files(self._map(run_chain, tasks, f"{seg}: {node.describe()}: {buckets} buckets"), buckets)
        stub = partitioned_join.stub_aggregate(node, schema)
        jobs = [(stub, files[b], f"{base}/part-{b:05d}.parquet", keep) for b in range(buckets) if files[b]]
        outs = self._map(partitioned_join.aggregate_bucket, jobs, f"{seg}: aggregate", label=node.stage)
        return self._bucket_parts(node, keep, base, outs, ("in",))

    def _bucket_folder(self, node: Node) -> tuple[str, str]:
        """A bucketed barrier's name and folder, emptied: its shuffle is never resumed (see partitioned_join.py)."""
        seg = f"n{self._index[node.id]:03d}"
        base = f"{self._work}/{seg}"
        if os.path.isdir(base):
            shutil.rmtree(base)
        return seg, base

    def _shuffle_tasks(self, child: Node, columns: list[str], out_dir: str, buckets: int, shard_by: str,
                       keys: tuple[str, ...]) -> tuple[pa.Schema, list[ChainTask]]:
        """Tasks that write `child`'s rows (just `columns`) into `buckets` files each by their `keys` hashed
        together (`sinks.group_hashes`; `shard_by="join"` spreads rows with a null key, `"group"` keeps
        them together); and the schema of those files."""
        parts = self._materialize(child)
        schema = pa.schema([(parts[0].schema or child.schema).field(c) if parts else child.schema.field(c)
                            for c in columns])
        os.makedirs(out_dir, exist_ok=True)
        return schema, [ChainTask(dataclasses.replace(p, schema=schema, columns=tuple(columns)), [], out_dir,
                                  f"part-{i:05d}", [], shards=buckets, aux_dir=self._aux,
                                  shard_by=shard_by, run_token=self._token, scratch=self._work,
                                  group_keys=keys)  # not durable: never resumed (partitioned_join.py)
                        for i, p in enumerate(parts)]

    def _bucket_parts(self, node: Node, keep: list[str] | None, base: str, outs: list[dict[str, Any]],
                      shuffles: tuple[str, ...]) -> list[Partition]:
        """The bucket tasks' parts as the barrier's partitions (one empty part if no bucket had rows); the
        shuffle files removed."""
        for d in shuffles:
            shutil.rmtree(f"{base}/{d}", ignore_errors=True)
        schema = self._kept_schema(node, keep)
        self._rows[node.id] = sum(o["rows"] for o in outs)
        parts = [Partition("spill", o["file"], schema, None, o["digest"]) for o in outs if o["rows"]]
        if not parts:
            path = f"{base}/part-empty.parquet"
            pq.write_table(schema.empty_table(), path)
            parts = [Partition("spill", path, schema, None, sha256_file(path))]
        return parts

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
            tasks = [ChainTask(p, [], f"{self._work}/sink", f"part-{i:05d}", [], shards, key, self._aux,
                               shard_by=spec.partition, scratch=self._work, durable=self._durable)
                     for i, p in enumerate(self._sink_parts)]
            os.makedirs(f"{self._work}/sink", exist_ok=True)
            results = self._map(run_chain, tasks, "shuffle")
            self._reused += sum(1 for r in results if r.get("reused"))
        else:
            results = self._run_chain(plan.root, shards=shards, shard_key=key, name="sink", shard_by=spec.partition)
        by_shard: dict[int, list[str]] = defaultdict(list)
        for r in results:
            for s, f in r["shard_files"].items():
                by_shard[int(s)].append(f)
        # (guard_here=False: a shard write is datakit's own native sort and write, long calls without heartbeats
        # for a big shard, never a stage function looping on a record; found in review)
        infos = self._map(write_one_shard, [(sorted(by_shard.get(s, [])), s, resolved, plan.root.schema)
                                            for s in range(shards)], "write shards", guard_here=False)
        self._sink_infos = infos
        self._resolved_spec = resolved
        return spec.path

    def _write_aux_outputs(self, out: str) -> None:
        """Gather the tasks' quarantine, drop-log and drop-state parts into `_quarantine/`, `_dropped/`
        and `_dropped_state/`: the parts this run's tasks name (written or reused), not every file in the
        folder. Why: the parts are named by task, and how many tasks a step has depends on the worker
        count, so a killed run's parts that no task of the resumed run has (another worker count) were
        gathered too, and `_dropped/` held rows twice (found in review)."""
        for side in ("quarantine", "droplog", "dropstate"):
            files = sorted(Path(f) for f in self._aux_files if Path(f).name.startswith(f"{side}-"))
            write_side_output(pa.concat_tables([pq.read_table(f) for f in files]) if files else None, out, side)

    def _commit(self, plan: Plan, stages: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        return commit_run(plan, self._inputs, self._resolved_spec, self._sink_infos, stages, seconds,
                          engine=self.name, reused_tasks=self._reused, runtime={"workers": self.workers})


def refuse_run_at_worker_import() -> None:
    """End a spawned worker that is importing the user's script when the script starts a run at top level.

    Why SystemExit with one line, and before anything else: the worker's run took the output lock first,
    so each worker printed an OutputBusyError traceback that named the wrong cause, 107 lines in all
    (found in a docs review); the owner's error names the fix (`worker died ... if __name__`)."""
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise SystemExit("datakit: error: a worker process imported your script and it started a pipeline; put the "
                         "run under `if __name__ == \"__main__\":` (worker processes are spawned)")
