"""The worker side: run one fused chain of row-local ops over one partition, spill, report counters.

Everything here runs inside pool workers (or in-process with workers=1), so it is
module-level and picklable; the driver side is `engine.py`.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datakit import watchdog
from datakit.accounting import NodeStats
from datakit.engines.core import (apply_map, conform, droplog_rows, dropstate_rows, quarantine_rows, take_setup_seconds,
                                  worker_fn)
from datakit.engines.local.broadcast import broadcast_table
from datakit.engines.local.memory import release_free_memory, release_free_memory_every
from datakit.engines.local.spill import IpcSpill, Partition, read_spill
from datakit.io import sinks, tempwork
from datakit.io.atomic import sha256_file
from datakit.io.take import take_rows
from datakit.plan import Join, MapBatches, Node


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
    shard_by: str = "hash"  # `SinkSpec.partition`
    run_token: str = ""  # names this run's batch functions: each is set up once per worker (core.worker_fn)
    scratch: str = ""  # the work folder all of the task's paths are under (io/tempwork.py)
    durable: str = ""  # an object-store output's durable work folder, `<out>/_work/<run id>` (io/tempwork.py)
    group_keys: tuple[str, ...] = ()  # a bucketed barrier's keys, hashed together (sinks.group_hashes; "join": nulls spread)


def _apply_op(op: MapBatches, fn: Any, batch: pa.RecordBatch, st: NodeStats, aux: "_AuxWriters") -> pa.RecordBatch:
    st.rows_in += batch.num_rows
    t0 = time.perf_counter()
    r = apply_map(fn, batch, op.schema, op.stage, op.name)
    st.metrics.update(r.metrics)
    if r.dropped is not None:
        st.dropped.update(r.drops)
        if op.quarantine:
            aux.q.append(quarantine_rows(op.stage, r.dropped))
        elif op.drop_log_key:
            aux.d.append(droplog_rows(op.stage, op.drop_log_key, r.dropped))
            state = dropstate_rows(op.stage, op.drop_log_key, r.dropped) if op.drop_state else None
            if state is not None:
                aux.s.append(state)
    st.rows_out += r.kept.num_rows
    st.seconds += time.perf_counter() - t0
    return r.kept


def fusible(node: Node) -> bool:
    return isinstance(node, MapBatches) or (isinstance(node, Join) and node.broadcast)


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
        for out_name, name in op.right_columns().items():
            cols[out_name] = right.column(name).take(rrows)
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
        self.s: list[pa.RecordBatch] = []

    def close(self) -> list[str]:
        """Write the rows gathered; the files written."""
        out = []
        for side, rows in (("quarantine", self.q), ("droplog", self.d), ("dropstate", self.s)):
            if rows:
                out.append(f"{self.aux_dir}/{side}-{self.part_name}.parquet")
                pq.write_table(pa.Table.from_batches(rows), out[-1])
        return out


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
    if task.durable:  # finished by an earlier attempt of this run, maybe on another host
        done = tempwork.restore_task(task.durable, task.scratch, done_path, fp, watchdog.beat)
        if done is not None:
            done["reused"] = True
            return done
    stats = {i: NodeStats() for i in task.node_ids}
    base_rows = 0
    aux = _AuxWriters(task.aux_dir, f"{Path(task.out_dir).name}-{task.part_name}")  # unique per chain and part
    writers: dict[int, pq.ParquetWriter] = {}
    files: dict[int, str] = {}
    out_schema = task.ops[-1].schema if task.ops else task.partition.schema
    fns = {op.id: worker_fn(f"{task.run_token}:{op.id}", lambda op=op: op.fn, f"stage {op.stage!r} ({op.name})")
           for op in task.ops if not isinstance(op, Join)}
    for op_id in fns:  # paid by this process's first task of the run: apart from the batch time
        stats[op_id].setup_seconds += take_setup_seconds(f"{task.run_token}:{op_id}")
    try:
        for batch in task.partition.batches():
            base_rows += batch.num_rows
            nbytes = batch.nbytes
            for op in task.ops:
                if isinstance(op, Join):
                    batch = _apply_broadcast_join(op, batch, stats[op.id], broadcast_table(task.broadcasts[op.id]))
                else:
                    batch = _apply_op(op, fns[op.id], batch, stats[op.id], aux)
            release_free_memory_every(nbytes)
            watchdog.beat()
            if batch.num_rows == 0:
                continue
            if task.shards:
                if task.group_keys:  # a bucketed barrier's shuffle (engine._shuffle_tasks)
                    ids = (sinks.group_hashes([batch.column(k) for k in task.group_keys],
                                              nulls_by_position=task.shard_by == "join")
                           % np.uint64(task.shards)).astype(np.int64)
                else:
                    ids = sinks.shard_ids(batch.column(task.shard_key), task.shards, task.shard_by)
                # group by shard with one stable sort (radix for small ids), unless a stage already did, then
                # slice (a filter per shard would pass over the batch once per shard)
                if len(ids) > 1 and (ids[1:] < ids[:-1]).any():
                    order = np.argsort(ids.astype(np.uint16) if task.shards <= 1 << 16 else ids, kind="stable")
                    ids, batch = ids[order], take_rows(batch, order)
                cuts = np.flatnonzero(np.diff(ids)) + 1
                for a, b in zip([0, *cuts], [*cuts, len(ids)]):
                    _writer(writers, files, int(ids[a]), task, out_schema).write_batch(batch.slice(a, b - a))
            else:
                _writer(writers, files, 0, task, out_schema).write_batch(batch)
    finally:
        for w in writers.values():
            w.close()
        release_free_memory()  # what the task freed goes back before the next task (see memory.py)
    aux_files = aux.close()
    result = {
        "fingerprint": fp,
        "files": sorted(files.values()),
        "digests": {f: sha256_file(f) for f in files.values() if not task.shards},
        "shard_files": {str(k): v for k, v in files.items()},
        "base_rows": base_rows,
        "stats": {str(k): v.to_json() for k, v in stats.items()},
        "aux_files": aux_files,
        "reused": False,
    }
    if task.durable:  # before the local marker: a local `done.json` means the durable copy is complete
        tempwork.save_task(task.durable, task.scratch, done_path, result, watchdog.beat)
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
            writers[key] = IpcSpill(path, schema, compress=bool(task.durable))
        else:
            path = f"{sub}/{task.part_name}.parquet"
            writers[key] = pq.ParquetWriter(path, schema, compression="zstd")
        files[key] = path
    return writers[key]


def write_one_shard(args: tuple[list[str], int, Any, pa.Schema]) -> dict[str, Any]:
    """Worker entry point for the sink: read one shard's spill parts and write it."""
    paths, shard, spec, schema = args
    release_free_memory()
    tables = []
    for p in paths:
        tables.append(read_spill(p))
        watchdog.beat()
    # the parts are handed over (`write_shard_parts`): a Parquet shard is gathered from them one row group
    # at a time; a writer that needs the whole shard sorted gets it once they are let go of
    return sinks.write_shard_parts(tables, shard, spec, schema)
