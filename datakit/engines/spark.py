"""The Spark engine: the same logical plan as `local`, compiled to PySpark DataFrames.

How each node runs (and why):

* `Source` -- the *file list* is distributed (one slice per task) and executors
  read the files with the very readers the local engine uses
  (`iter_raw_lines`, `iter_parquet`), so .gz/.zst, truncated files and
  provenance columns behave identically. The driver never sees a row.
* `MapBatches` -- `mapInArrow` with the stage's picklable function, shipped
  once per executor as a broadcast. A wrapper casts Spark's Arrow batches back
  to the contract types, runs the function, and emits kept rows plus, for
  dropped rows, only the accounting columns (reason, detail, key or raw line).
  A function that also defines `spark_select` (filters and column renames that drop nothing,
  `plan.MapBatches`) runs as that Spark SQL instead, and like a join it gets no job of its own
  when one node reads it.
* `Join` / `Aggregate` -- Spark's own (`F.broadcast` for small right sides).
* `ConnectedComponents` -- large-star/small-star (`spark_cc`), O(log n) rounds.
* Sink -- a shard id column (`datakit.io.sinks.shard_ids`), rows moved to partition = shard id
  (`one_shard_per_partition`), then a mapInArrow calls `write_shard` *on the executors*; only the
  small per-shard info dicts come back to commit the manifest. When the root is a chain, that chain
  also emits each row's key hash and the JVM takes it modulo the shard count (`shard_of_hash`), so
  the rows do not make a round trip through Python just to get their shard id.

Accounting without double counting: no accumulators (a retried task would add
twice). Every node's output is persisted and counted by an action, and drop
reasons / `_metrics` are summed by an aggregation over the persisted rows; an
action's result is exact however many task attempts it took. Recomputing a
lost cached partition is safe because stage functions are pure.

Determinism: rows reach `write_shard`, which sorts each shard by its key, and
every side output is sorted by all its columns, so neither partitioning nor
task retries change a byte.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datakit import progress
from datakit.accounting import NodeStats, stage_report
from datakit.engines.core import (Engine, RunResult, apply_map, commit_run, conform, remove_if_empty, resolve_sink,
                                  reused_shards, take_setup_seconds, worker_fn, write_side_output)
from datakit.engines.spark_parts import MAX_PART_SHARDS, PartsTarget, ShardPartWriter, WriteShardParts, parts_by_shard
from datakit.engines import EngineOptionError, check_folder, check_mapping, spark_stall
from datakit.engines.spark_partitions import (ONE_TASK_CONF, SHUFFLE_CONF, TARGET_CONF, PartitionPlan,
                                              check_user_conf, one_task_max_edges, plan_partitions,
                                              read_tasks)
from datakit.engines.spark_stall import STALL_CONF, stall_seconds
from datakit.engines.spark_session import (CheckedTask, table_fn, SparkError, SparkJobError, SparkSetupError,
                                           await_prestart, executor_environment, get_session, log_file, prestart_session,
                                           redact_log, straggler_conf, translate_errors, workers_python_differs)
from datakit.io import identity, publish, sinks
from datakit.io.fs import remove_tree
from datakit.io.readers import iter_source
from datakit.interrupts import held_until_done
from datakit.plan import (DROP, DROP_DETAIL, DROP_STATE, Aggregate, ConnectedComponents, Join, MapBatches, Node, Plan,
                          SinkSpec, Source)

log = logging.getLogger("datakit.engine.spark")

SHARD_COL = "_shard"
KEY_HASH = "__sx_key_hash"  # the root chain's rows: xxh64 of the sink key (sinks.key_hashes), as a signed long
# Joins are broadcast from *measured* sizes only. Why: every materialized node is a checkpoint whose
# size estimate Spark inherits from the plan that made it, and our plans start from a file list of
# a few hundred bytes, so the planner took record tables for tiny and broadcast them (at 100k
# events: 226-258 MiB tables collected into the driver and sent to every executor; at cluster scale,
# a driver out of memory). Adaptive execution decides from the shuffle's real
# sizes instead. Joins the plan marks `broadcast=True` are still broadcast. A user setting of either
# key (--conf, the pipeline's spark: block, spark-submit) leaves both to the user.
BROADCAST_CONF = ("spark.sql.autoBroadcastJoinThreshold", "spark.sql.adaptive.autoBroadcastJoinThreshold")
BROADCAST_DEFAULTS = {"spark.sql.autoBroadcastJoinThreshold": "-1",
                      "spark.sql.adaptive.autoBroadcastJoinThreshold": "10MB"}


# --------------------------------------------------------------------------- executor-side functions
# Module-level classes: cloudpickle ships them by reference, executors import this module.

_WORKER_SETUP: list[tuple[str, int, int]] = []  # the log set-up this Python worker installed (once)


def _partition_id() -> int | str:
    """The partition this Python worker's task reads (for error lines), or "?" outside a task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else "?"


def _worker_setup(logcfg: tuple[str, int, int]) -> None:
    """Once in this Spark Python worker: its tokenizer threads (`_worker_threads`), then the
    driver's redacting log set-up -- what the local engine's pool initializer does at worker start.

    Why the logging: a Python worker starts with no logging configuration, so a warning a stage
    logs inside a task went through Python's last-resort handler to the executor's stderr (and
    its log files) unredacted.

    And pyarrow is kept from importing pandas it would not use (datakit/arrow_without_pandas.py),
    unless pyspark's worker has imported pandas already.
    """
    if _WORKER_SETUP != [logcfg]:
        from datakit.arrow_without_pandas import defer_pandas
        from datakit.logs import init_worker

        _worker_threads()
        init_worker(*logcfg)
        defer_pandas()
        _WORKER_SETUP[:] = [logcfg]


def _worker_threads() -> None:
    """Size this Python worker's tokenizer thread pool to its task's cores, as the local engine's pool does.

    Why: the tokenizer (Rust, rayon) starts a pool of one thread per core in every process that
    encodes, so an executor running one Python worker per core ran cores x cores threads on the
    same cores, and idle rayon threads spin (datakit/workers.py: +14% CPU for the same tokens on
    the local engine). Spark gives each Python worker `OMP_NUM_THREADS = spark.task.cpus` unless
    the operator set it (SPARK-42613); rayon reads its own variable, set here from that one before
    anything in this process encodes. A RAYON_NUM_THREADS the operator set (spark.executorEnv.*) wins.
    """
    os.environ.setdefault("RAYON_NUM_THREADS", os.environ.get("OMP_NUM_THREADS") or "1")


def _load_fn(bc, token: str, label: str = "") -> Any:
    """The stage function of a broadcast, unpickled and set up once per Python worker (not per task).

    `token` ("<run>:<random>") is made on the driver: executors do not know a broadcast's id.
    """
    from pyspark import cloudpickle

    return worker_fn(token, lambda: cloudpickle.loads(bc.value), label)


def _cast_in(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Spark's batch -> the exact Arrow types the local engine would pass (list field names, nullability)."""
    return batch.select(schema.names).cast(schema) if batch.schema != schema else batch


# chain output: data columns, then these (one schema for kept rows, dropped rows and stats rows)
# (a prefix no stage uses: stages name their own internal columns `_dk_*`)
KIND, OP, SKIND, SNAME, N = "__sx_kind", "__sx_op", "__sx_skind", "__sx_sname", "__sx_n"
QFILE, QLINE, QRAW, DKEY = "__sx_qfile", "__sx_qline", "__sx_qraw", "__sx_key"
DSTATE = "__sx_state"
DATA, DROPPED, STATS, PART = 0, 1, 2, 3
_CHAIN_COLS = [
    pa.field(KIND, pa.int8()), pa.field(OP, pa.int32()), pa.field(DROP, pa.string()), pa.field(DROP_DETAIL, pa.string()),
    pa.field(QFILE, pa.string()), pa.field(QLINE, pa.int64()), pa.field(QRAW, pa.binary()), pa.field(DKEY, pa.string()),
    pa.field(DSTATE, pa.string()),
    pa.field(SKIND, pa.string()), pa.field(SNAME, pa.string()), pa.field(N, pa.int64()),
]


class _ChainFn:
    """mapInArrow body of one fused chain: (read files |) op1 > op2 > ... on each batch, as the local engine.

    Consecutive row-local nodes run in one pass (like the local engine's fused
    chains), so each intermediate relation costs no Spark job. The output
    carries three kinds of rows, told apart by `_dk_kind`:

    * DATA -- kept rows of the last op, conformed to its schema;
    * DROPPED -- one per dropped row of an op that writes quarantine or a drop
      log (accounting columns only, data columns null);
    * STATS -- per task: base rows, rows out / drops by reason / `_metrics` per op;
    * PART -- when the chain is the root and `parts` is given, its kept rows go to per-shard part
      files instead of DATA rows (spark_parts.py): one row per file (shard in `_dk_op`, url, rows).

    Stats travel *as data* and are summed by a Spark aggregation afterwards, so
    a retried task is counted exactly once (accumulators would count it twice).
    """

    def __init__(self, source_format: str | None, source_schema: pa.Schema | None, in_schema: pa.Schema | None,
                 ops: list[dict[str, Any]], data_schema: pa.Schema,
                 out_schema: pa.Schema, hash_key: str | None = None, parts: PartsTarget | None = None,
                 stall_seconds: float = 0.0) -> None:
        self.source_format, self.source_schema = source_format, source_schema
        self.stall_seconds = stall_seconds  # spark_stall.py: a batch stuck this long fails its task
        self.in_schema = in_schema
        self.ops, self.data_schema, self.out_schema = ops, data_schema, out_schema
        self.hash_key = hash_key  # the sink's key, when this chain is the root: DATA rows carry its hash
        self.parts = parts  # the root chain writes its rows to shard part files (spark_parts.py)
        from datakit.logs import worker_config

        self.logcfg = worker_config()  # made on the driver, installed in each Python worker (_worker_setup)

    def _base(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            if self.source_format is None:
                yield _cast_in(b, self.in_schema)
                continue
            for url, listed in zip(b.column("path").to_pylist(), b.column("stamp").to_pylist()):
                identity.check_unchanged(url, listed)  # the file as the run listed it, or one line, exit 2
                for rb in spark_stall.watched(iter_source(url, self.source_format, self.source_schema),
                                              f"reading {url}"):
                    yield rb if self.source_format == "jsonl" else conform(rb, self.source_schema)
                identity.check_unchanged(url, listed)  # and after: not written to while it was read

    def _emit(self, cols: dict[str, pa.Array | None]) -> pa.RecordBatch:
        """`cols` as a batch of `out_schema` (a column absent or None: nulls)."""
        given = {k: c for k, c in cols.items() if c is not None}
        return conform(pa.RecordBatch.from_arrays(list(given.values()), names=list(given)), self.out_schema)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _worker_setup(self.logcfg)
        spark_stall.start(self.stall_seconds)
        fns = [_load_fn(op["bc"], op["token"], f"stage {op['stage']!r} ({op['name']})") for op in self.ops]
        # unpickling + setup() in this Python worker (its first task of the run only), in microseconds
        setup_us = [round(take_setup_seconds(op["token"]) * 1e6) for op in self.ops]
        writer = None
        if self.parts is not None:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            writer = ShardPartWriter(self.parts, self.data_schema, ctx.partitionId(), ctx.taskAttemptId())
        try:
            yield from self._run(batches, fns, setup_us, writer)
        except BaseException:
            if writer is not None:
                writer.abandon()
            raise

    def _run(self, batches: Iterator[pa.RecordBatch], fns: list[Any], setup_us: list[int],
             writer: ShardPartWriter | None) -> Iterator[pa.RecordBatch]:
        base = 0
        outs = [0] * len(self.ops)
        drops = [Counter() for _ in self.ops]
        metrics = [Counter() for _ in self.ops]
        for batch in self._base(batches):
            base += batch.num_rows
            for i, (op, fn) in enumerate(zip(self.ops, fns)):
                with spark_stall.watching(f"stage {op['stage']!r} ({op['name']}) of partition {_partition_id()}"):
                    r = apply_map(fn, batch, op["schema"], op["stage"], op["name"])
                metrics[i].update(r.metrics)
                if r.dropped is not None:
                    drops[i].update(r.drops)
                    side = self._dropped(i, op, r.dropped)
                    if side is not None:
                        yield side
                batch = r.kept
                outs[i] += batch.num_rows
                if batch.num_rows == 0:
                    break
            if batch.num_rows and writer is not None:
                writer.write(batch)
            elif batch.num_rows:
                cols = {f.name: batch.column(f.name) for f in self.data_schema if f.name in batch.schema.names}
                cols[KIND] = pa.array([DATA] * batch.num_rows, pa.int8())
                if self.hash_key is not None:
                    hashes = sinks.key_hashes(batch.column(self.hash_key).cast(pa.string()))
                    cols[KEY_HASH] = pa.array(hashes.view(np.int64), pa.int64())
                yield self._emit(cols)
        if writer is not None:  # files closed before they are listed: a listed part is whole
            files = writer.close()
            if files:
                yield self._emit({
                    KIND: pa.array([PART] * len(files), pa.int8()), OP: pa.array([f[0] for f in files], pa.int32()),
                    SKIND: pa.array(["part"] * len(files), pa.string()), SNAME: pa.array([f[1] for f in files], pa.string()),
                    N: pa.array([f[2] for f in files], pa.int64())})
        stats = [(-1, "base", "", base)]
        for i in range(len(self.ops)):
            stats.append((i, "out", "", outs[i]))
            if setup_us[i]:
                stats.append((i, "setup_us", "", setup_us[i]))
            stats += [(i, "drop", k, v) for k, v in drops[i].items()]
            stats += [(i, "metric", k, v) for k, v in metrics[i].items()]
        yield self._emit({
            KIND: pa.array([STATS] * len(stats), pa.int8()), OP: pa.array([s[0] for s in stats], pa.int32()),
            SKIND: pa.array([s[1] for s in stats], pa.string()), SNAME: pa.array([s[2] for s in stats], pa.string()),
            N: pa.array([s[3] for s in stats], pa.int64())})

    def _dropped(self, i: int, op: dict[str, Any], d: pa.RecordBatch) -> pa.RecordBatch | None:
        """Accounting rows for the quarantine / drop log (same columns the local engine writes)."""
        if not (op["quarantine"] or op["drop_log_key"]):
            return None
        m, names = d.num_rows, d.schema.names

        def col(name: str, typ: pa.DataType) -> pa.Array | None:
            return d.column(name).cast(typ) if name in names else None

        cols: dict[str, Any] = {KIND: pa.array([DROPPED] * m, pa.int8()), OP: pa.array([i] * m, pa.int32()),
                                DROP: col(DROP, pa.string()), DROP_DETAIL: col(DROP_DETAIL, pa.string())}
        if op["quarantine"]:
            cols.update({QFILE: col("_source_file", pa.string()), QLINE: col("_source_line", pa.int64()),
                         QRAW: col("_raw", pa.binary())})
        else:
            cols[DKEY] = col(op["drop_log_key"], pa.string())
            cols[DSTATE] = col(DROP_STATE, pa.string())
        return self._emit(cols)


class _AddShard:
    """mapInArrow: append the shard id of every row (same xxh64 as the local engine). Only for a root that is
    not a chain (a join or aggregate); a chain root emits its key hashes itself (`_Run._sink`)."""

    def __init__(self, key: str, shards: int, partition: str = "hash") -> None:
        self.key, self.shards, self.partition = key, shards, partition

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            key = b.column(self.key)
            ids = sinks.shard_ids(key if self.partition == "value" else key.cast(pa.string()), self.shards,
                                  self.partition)
            yield b.append_column(SHARD_COL, pa.array(ids, pa.int64()))


class _WriteShards:
    """mapInArrow over a partition holding one shard (`one_shard_per_partition`): sort and write it
    with `write_shard` on the executor; return its info row."""

    def __init__(self, spec: SinkSpec, schema: pa.Schema) -> None:
        self.spec, self.schema = spec, schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts = [b for b in batches if b.num_rows]
        if not parts:  # no row hashed to this partition's shard: the driver writes it empty
            return
        table = pa.Table.from_batches(parts)
        del parts
        ids = pc.unique(table.column(SHARD_COL)).to_pylist()
        if len(ids) != 1:  # two shards written as one file would be a wrong dataset, not a slow one
            raise RuntimeError(f"a sink partition holds shards {sorted(ids)[:5]}; expected exactly one")
        info = sinks.write_shard(table.drop_columns([SHARD_COL]), int(ids[0]), self.spec, self.schema)
        yield pa.record_batch({"shard": pa.array([int(ids[0])], pa.int64()),
                               "info": pa.array([json.dumps(info, sort_keys=True)], pa.string())})


class _WriteSide:
    """applyInArrow over one group: write one side output (quarantine / drop log / drop state) as one
    sorted file; the group key `_side` names which."""

    def __init__(self, out: str) -> None:
        self.out = out

    def __call__(self, table: pa.Table) -> pa.Table:
        side = table.column("_side")[0].as_py()
        write_side_output(table, self.out, side)
        return pa.table({"side": pa.array([side], pa.string()), "rows": pa.array([table.num_rows], pa.int64())})


# --------------------------------------------------------------------------- the engine

class SparkEngine(Engine):
    """Execute a `Plan` with PySpark on `master` (default local[2]; `spark://`, `local-cluster[...]`, yarn...).

    `conf` is passed to the session (pipeline file `spark:` block and `--conf`);
    `partitions` sets the number of read slices and shuffle partitions. Inside
    `spark-submit` leave `master` unset to use the submitted application's session.
    """

    name = "spark"

    def __init__(self, master: str | None = None, conf: dict[str, Any] | None = None, partitions: int | None = None,
                 workers: int | None = None, checkpoint_dir: str | None = None) -> None:
        for name, v in (("partitions", partitions), ("workers", workers)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive number (got {v!r})")
        if master is not None and not isinstance(master, str):  # checked before a session starts
            raise EngineOptionError(f"engine option master must be a Spark master URL (str), not "
                                    f"{type(master).__name__} ({master!r})")
        checkpoint_dir = check_folder("checkpoint_dir", checkpoint_dir)
        if master is None and workers:
            master = f"local[{int(workers)}]"
        self.master = master
        self.conf = check_mapping("conf", conf)
        check_user_conf(self.conf)  # a bad setting fails here, not after the session started
        self.partitions = partitions
        self.checkpoint_dir = checkpoint_dir

    def prestart(self) -> None:
        """Start this engine's session in the background (`spark_session.prestart_session`): the JVM
        boots while the driver compiles the plan; `execute` (`get_session`) waits for it."""
        prestart_session(self.master, self.conf)

    def settle(self) -> None:
        await_prestart()

    def _execute(self, plan: Plan) -> RunResult:
        t0 = time.perf_counter()
        spark = get_session(self.master, self.conf)
        remote = not spark.sparkContext.master.startswith("local")
        # the same datakit and libraries on every executor (a local master's too when its workers run
        # another interpreter)
        checked = remote or workers_python_differs(spark)
        executors = executor_environment(spark) if checked else None
        inputs = identity.input_files(plan.input_files())
        user_conf = self._user_conf(spark)
        try:
            parts = plan_partitions(sum(int(f.get("size") or 0) for f in inputs), spark.sparkContext.defaultParallelism,
                                    self.partitions, user_conf)
            cc_edges = one_task_max_edges(user_conf.get(ONE_TASK_CONF))
            stall = stall_seconds(user_conf.get(STALL_CONF))
        except ValueError as e:
            raise SparkSetupError(str(e)) from None
        run = _Run(self, spark, plan, parts, cc_edges)
        run.stall_seconds = stall
        run.inputs = inputs
        run.read_tasks = read_tasks(len(inputs), parts, spark.sparkContext.defaultParallelism)
        # and every task checks its own worker too: an executor may join after the start-up check
        run.expected_env = identity.runtime_versions() if checked else None
        if plan.sink is not None:
            publish.retract(plan.sink.path)  # readers see no dataset until the new one is committed
        try:
            with _runtime_conf(spark, run.runtime_conf(user_conf)):
                stages, manifest, out = run.go()
        finally:
            run.cleanup()
            redact_log()  # a retried task's warning may quote a record too (see there)
        seconds = time.perf_counter() - t0
        if plan.sink is not None:
            with held_until_done("committing the output and removing its work folder"):
                publish.sweep(plan.sink.path)  # temp files of interrupted earlier writes
                manifest = run.commit(stages, seconds)
                if not self.checkpoint_dir:
                    publish.remove_work(plan.sink.path)
        return RunResult(output_path=out, stages=stages, manifest=manifest, seconds=seconds, engine="spark",
                         extra={"master": spark.sparkContext.master, **parts.report(), "read_tasks": run.read_tasks,
                                "reused_shards": reused_shards(run.infos),
                                "log": str(log_file()), **({"executors": executors} if executors else {}),
                                "straggler_conf": straggler_conf(spark)})


    def _user_conf(self, spark) -> dict[str, str]:
        """The partition settings the user gave: `conf` (--conf, the pipeline's spark: block), and the
        operator's spark-submit settings when the session is not one datakit started with its defaults."""
        from datakit.engines.spark_session import _active

        keys = (SHUFFLE_CONF, TARGET_CONF, ONE_TASK_CONF, STALL_CONF, *BROADCAST_CONF)
        out: dict[str, str] = {}
        if _active.get("session") is not spark:  # spark-submit / a notebook's session: its conf is the user's
            given = spark.sparkContext.getConf()
            out.update({k: given.get(k) for k in keys if given.contains(k)})
        out.update({k: str(self.conf[k]) for k in keys if self.conf.get(k) is not None})
        return out


class _runtime_conf:
    """Set runtime SQL settings for one run and restore the session's values afterwards."""

    def __init__(self, spark, conf: dict[str, str]) -> None:
        self.spark, self.conf = spark, conf
        self.old: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for k, v in self.conf.items():
            self.old[k] = self.spark.conf.get(k, None)
            self.spark.conf.set(k, v)

    def __exit__(self, *exc: Any) -> None:
        for k, v in self.old.items():
            if v is None:
                self.spark.conf.unset(k)
            else:
                self.spark.conf.set(k, v)


class _Run:
    """State of one execution: a DataFrame per node, row counts, node stats, side outputs."""

    def __init__(self, engine: SparkEngine, spark, plan: Plan, parts: PartitionPlan, cc_one_task_edges: int = 0) -> None:
        self.engine, self.spark, self.plan = engine, spark, plan
        self.sc = spark.sparkContext
        self.token = uuid.uuid4().hex[:12]  # this run's prefix of batch-function tokens (core.worker_fn)
        self.parts = parts
        self.n = parts.n  # read slices and shuffle partitions (spark_partitions.py: from input size by default)
        self.read_tasks = parts.n  # tasks reading the input files (`spark_partitions.read_tasks`: set by the engine)
        self.expected_env: dict[str, Any] | None = None  # the driver's environment each task checks (CheckedTask)
        self.df: dict[int, Any] = {}
        self.arrow: dict[int, pa.Schema] = {}  # node -> the Arrow schema of its rows in Spark
        self.rows: dict[int, int] = {}
        self.stats: dict[int, NodeStats] = defaultdict(NodeStats)
        self.broadcasts: list[Any] = []
        self.quarantine: list[Any] = []
        self.droplog: list[Any] = []
        self.dropstate: list[Any] = []
        self.infos: list[dict[str, Any]] = []
        self.spec: SinkSpec | None = None
        self.root_hashed: Any = None  # the root's rows with KEY_HASH, when the root is a chain (see _sink)
        self.part_files: list[tuple[int, str, int]] | None = None  # (shard, url, rows): spark_parts.py
        self.parts_folder: str | None = None
        self.current = "starting"
        self._ckpt: str | None = None
        self.inputs: list[dict[str, Any]] = []
        self.join_keys: dict[int, str] = {}  # materialized node -> the key its joins read it by (see _join_key)
        self.cc_one_task_edges = cc_one_task_edges  # graphs up to this many edges: components in one task (spark_cc)
        self.stall_seconds = 0.0  # a Python batch stuck this long fails its task (spark_stall.py; 0: off)

    def runtime_conf(self, user_conf: dict[str, str] | None = None) -> dict[str, str]:
        conf = {"spark.sql.shuffle.partitions": str(self.n), LEAF_PARALLELISM: str(self.n),
                "spark.sql.execution.arrow.pyspark.enabled": "true",
                "spark.sql.execution.arrow.useLargeVarTypes": "false"}
        if self.engine.partitions:  # an explicit number is honoured, not coalesced away
            conf["spark.sql.adaptive.coalescePartitions.enabled"] = "false"
        if not set(BROADCAST_CONF) & set(user_conf or {}):
            conf.update(BROADCAST_DEFAULTS)
        return conf

    # -- driver loop
    def go(self) -> tuple[list[dict[str, Any]], dict | None, str | None]:
        plan = self.plan
        order = plan.nodes()
        consumers: dict[int, list[Node]] = defaultdict(list)
        for n in order:
            for i in n.inputs:
                consumers[i.id].append(n)
        self.shared = {nid for nid, cs in consumers.items() if len(cs) > 1}
        self.join_keys = {nid: k for nid in self.shared if (k := _join_key(nid, consumers[nid])) is not None}
        counted = _counted_nodes(plan)
        with translate_errors_at(self):
            for node in order:
                cs = consumers.get(node.id, [])
                python = isinstance(node, (Source, MapBatches)) and not _native(node)
                fused = python and node is not plan.root and len(cs) == 1 and _python_chain(cs[0])
                if fused:
                    continue  # runs inside its consumer's chain
                # a join/aggregate/native function read by one node only is not materialized (it is
                # computed inside its reader's job): a chain reading it counts its rows; any other
                # reader needs no count of it
                deferred = (not python and node is not plan.root and len(cs) == 1
                            and (_python_chain(cs[0]) or node.id not in counted))
                # a native function of a materialized relation is recomputed by each reader (a JVM
                # projection or filter of cached rows) rather than cached by a job of its own
                deferred = deferred or (_native(node) and node is not plan.root and node.id not in counted
                                        and node.input.id in self.rows)
                self.current = f"stage {node.stage!r} ({node.describe()})"
                t = time.perf_counter()
                chain = self._chain_of(node)[1] if _python_chain(node) else [node]
                stages = list(dict.fromkeys(o.stage for o in chain if ":" not in o.stage and o.stage != "input"))
                with self._progress(", ".join(stages) or node.stage, node):
                    self._run_node(node, deferred)
                # a fused chain's time is shared by its ops, as the local engine reports it
                for op in chain:
                    self.stats[op.id].seconds += (time.perf_counter() - t) / len(chain)
            for node in order:
                # (an anti join and its left side are always counted; other joins may go uncounted)
                if isinstance(node, Join) and (node.how == "anti" or {node.id, node.left.id} <= self.rows.keys()):
                    st = self.stats[node.id]
                    st.rows_in += self.rows[node.left.id]
                    st.rows_out += self.rows[node.id]
                    if node.how == "anti":
                        st.dropped[node.reason] += self.rows[node.left.id] - self.rows[node.id]
            stages = stage_report(plan, self.stats, self.rows)
            if plan.sink is None:
                return stages, None, None
            self.current = "writing the output shards"
            with self._progress("writing the output shards", plan.root):
                self._sink()
            self.current = "writing quarantine and drop log"
            self._side_outputs()
        return stages, {}, plan.sink.path

    @contextmanager
    def _progress(self, label: str, node: Node) -> Iterator[None]:
        """Tasks of this step's Spark jobs (status tracker, polled) and its rows once counted."""
        st = progress.step(label)
        group = f"datakit-{uuid.uuid4().hex[:8]}"
        self.sc.setJobGroup(group, label[:200], False)
        ok = False
        try:
            with progress.SparkPoller(self.sc, group, st):
                yield
            ok = True
        finally:
            self.sc.setJobGroup("datakit", "", False)
            st.finish(rows=self.rows.get(node.id), ok=ok)

    def _run_node(self, node: Node, deferred: bool = False) -> None:
        if isinstance(node, (Source, MapBatches)) and not _native(node):
            self._chain(node)
            return
        from pyspark.sql import functions as F

        if isinstance(node, MapBatches):  # a native function (see `_native`)
            df = node.fn.spark_select(self.df[node.input.id], F)
            if list(df.columns) != node.schema.names:  # a twin off its node's schema would shift columns
                raise ValueError(f"{type(node.fn).__name__}.spark_select gave columns {list(df.columns)}; "
                                 f"the node {node.name!r} declares {node.schema.names}")
        elif isinstance(node, Join):
            known = self._known_rows(node)
            if known is not None:  # an empty side decides the join: no job computes or counts it
                df = (self.df[node.left.id].select(*node.schema.names) if known  # anti, nothing to take away
                      else self._join(node).where(F.lit(False)))
                self.df[node.id], self.arrow[node.id], self.rows[node.id] = df, node.schema, known
                return
            df = self._join(node)
        elif isinstance(node, Aggregate):
            df = self._aggregate(node)
        elif isinstance(node, ConnectedComponents):
            df = self._components(node)
        else:
            raise NotImplementedError(f"the Spark engine cannot run {type(node).__name__}")
        if not deferred:
            df, self.rows[node.id] = self._materialize(df, lambda d: d.count())
            if isinstance(node, MapBatches):
                st = self.stats[node.id]
                st.rows_in, st.rows_out = self.rows.get(node.input.id, 0), self.rows[node.id]
        self.df[node.id] = df
        self.arrow[node.id] = node.schema

    def _known_rows(self, node: Join) -> int | None:
        """The join's row count when an empty side decides it (then its frame needs no job), else None.

        Why: a side branch that finds nothing (the ingest's repeated event ids, usually none) still
        cost a broadcast and a pass over the big side per join. An inner or semi join with an empty
        side is empty; an anti join with an empty right side is its left side, whose count is known
        when the left was materialized.
        """
        left, right = self.rows.get(node.left.id), self.rows.get(node.right.id)
        if left == 0 or (right == 0 and node.how in ("inner", "semi")):
            return 0
        if right == 0 and node.how == "anti" and left is not None:
            return left
        return None

    def _checkpoint_local(self) -> bool:
        return self.sc.master.startswith("local[") or self.sc.master == "local"

    def _persist(self, df):
        """`df` materialized, its lineage cut (see `_materialize`), for a step that reads no result of it."""
        if self._checkpoint_local():
            return df.localCheckpoint(eager=True)  # one job
        return self._materialize(df, lambda d: None)[0]

    def _materialize(self, df, action: Callable[[Any], Any]) -> tuple[Any, Any]:
        """Materialize a node's output (computed once, kept, its lineage cut) and run `action` on it.

        Why cut lineage: the plan is a DAG whose shared parts Spark would
        otherwise re-plan in every consumer, which grows without bound on
        pipelines like dedup. In local mode the driver is the only executor, so
        a local checkpoint (cached blocks) suffices; on a cluster a reliable
        checkpoint (files in the checkpoint dir) survives a lost executor.

        Why `action` is passed in: the action that reads the node's result (its
        row count, a chain's stats rows) is the job that computes it. In local
        mode the checkpoint is lazy, so that one job computes, caches and answers
        (an eager checkpoint is a job of its own, and every Spark job costs
        0.1-0.5 s of scheduling and planning however small its data); a lazy local
        checkpoint keeps every partition the job computed and computes any it
        skipped when the job ends. On a cluster the action runs on the persisted
        frame, then the reliable checkpoint is written from those cached blocks.
        The result is exact either way: one successful job counts every partition
        once, however many task attempts it took.
        """
        from pyspark import StorageLevel

        if self._checkpoint_local():
            out = df.localCheckpoint(eager=False)
            return out, action(out)
        self.sc.setCheckpointDir(self._checkpoint_dir())
        cached = df.persist(StorageLevel.MEMORY_AND_DISK)  # the action computes it once, the checkpoint reads it
        try:
            result = action(cached)
            out = cached.checkpoint(eager=True)
        finally:
            cached.unpersist()
        return out, result

    def _chain_of(self, node: Node) -> tuple[Node, list[MapBatches]]:
        """Fusible MapBatches below `node` (inclusive) and the base they read (Source or a materialized node)."""
        ops: list[MapBatches] = []
        cur = node
        while _python_chain(cur) and (cur is node or cur.id not in self.shared):
            ops.append(cur)
            cur = cur.input
        ops.reverse()
        if isinstance(cur, Source) and cur.id in self.shared and cur is not node:
            pass  # a shared Source was materialized on its own; read it like any node
        return cur, ops

    def _chain(self, node: Node) -> None:
        """Run a Source/MapBatches chain ending at `node` as one mapInArrow; materialize; sum its stats."""
        from pyspark import cloudpickle
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        base, ops = self._chain_of(node) if isinstance(node, MapBatches) else (node, [])
        read_files = isinstance(base, Source) and base.id not in self.df
        if read_files:
            if base.format == "jsonl":
                from datakit.contracts import RAW_LINES

                base_schema = RAW_LINES
            else:
                base_schema = _with_provenance(base.schema)
            files = list(base.paths)
            inp = _file_slices(self.spark, files, identity.listed_stamps(self.inputs))
            in_schema = None
        else:
            in_schema = self.arrow[base.id]
            if ops and ops[0].reads is not None and set(ops[0].reads) <= set(in_schema.names):
                # the first function reads only these columns (its promise): ship just them to Python
                in_schema = pa.schema([in_schema.field(c) for c in ops[0].reads])
            base_schema = in_schema
            inp = self.df[base.id].select(*in_schema.names)
        # a chain's output has exactly its last op's schema: the local engine spills it with that schema,
        # so provenance columns a function carried along never reach the next chain there either
        data_schema = ops[-1].schema if ops else base_schema
        out_schema = pa.schema(list(data_schema) + _CHAIN_COLS)
        sink = self.plan.sink
        parts = self._parts_target(node, data_schema)
        hash_key = (sink.key if sink is not None and node is self.plan.root and sink.partition == "hash"
                    and sink.key in data_schema.names and parts is None else None)
        if hash_key is not None:
            out_schema = out_schema.append(pa.field(KEY_HASH, pa.int64()))
        op_specs = []
        for op in ops:
            bc = self.sc.broadcast(cloudpickle.dumps(op.fn))
            self.broadcasts.append(bc)
            op_specs.append({"bc": bc, "token": f"{self.token}:{uuid.uuid4().hex}", "schema": op.schema,
                             "stage": op.stage, "name": op.name, "quarantine": op.quarantine, "drop_log_key": op.drop_log_key})
        fn = _ChainFn(base.format if read_files else None, base.schema if read_files else None,
                      in_schema, op_specs, data_schema, out_schema, hash_key, parts, self.stall_seconds)
        # stats rows are data, a few per task: the job that materializes the chain collects them (no
        # shuffle) and they are summed here; exact whatever the task retries were (see _materialize).
        # So are the part files of a root chain: one successful job lists exactly one attempt per partition
        mapped = inp.mapInArrow(CheckedTask(fn, self.expected_env), from_arrow_schema(out_schema))
        key = self.join_keys.get(node.id)  # never the root's (no node reads it), so no parts or key hashes here
        # files are read in `read_tasks` tasks of consecutive files (one per file when there are few)
        layout: dict[str, str] = {LEAF_PARALLELISM: str(self.read_tasks)} if read_files else {}
        if key is not None:
            # stored by the key its joins read it by (`_join_key`). Adaptive execution is off for
            # this one query because a checkpoint of an adaptive plan reports no partitioning
            # (Spark 4.0: UnknownPartitioning), and the joins would shuffle it again anyway
            mapped = mapped.repartition(self.n, key).sortWithinPartitions(key)
            layout["spark.sql.adaptive.enabled"] = "false"
        with _runtime_conf(self.spark, layout):
            out, rows = self._materialize(mapped,
                                          lambda d: d.where(F.col(KIND).isin(STATS, PART))
                                          .select(KIND, OP, SKIND, SNAME, N).collect())
        if parts is not None:
            self.part_files = [(int(r[OP]), r[SNAME], int(r[N])) for r in rows if r[KIND] == PART]
            rows = [r for r in rows if r[KIND] == STATS]
        base_rows = 0
        for r in rows:
            i, kind, name, n = int(r[OP]), r[SKIND], r[SNAME], int(r[N])
            if kind == "base":
                base_rows += n
                continue
            st = self.stats[ops[i].id]
            if kind == "out":
                st.rows_out += n
            elif kind == "drop":
                st.dropped[name] += n
            elif kind == "setup_us":
                st.setup_seconds += n / 1e6
            else:
                st.metrics[name] += n
        if base.id not in self.rows:  # files read here, or a deferred join/aggregate
            self.rows[base.id] = base_rows
        prev = self.rows[base.id]
        for op in ops:
            st = self.stats[op.id]
            st.rows_in += prev
            self.rows[op.id] = prev = st.rows_out
            if not st.dropped:
                continue
            i = ops.index(op)
            dropped = out.where((F.col(KIND) == DROPPED) & (F.col(OP) == i))
            if op.quarantine:
                self.quarantine.append(dropped.select(
                    F.lit(op.stage).alias("stage"), F.col(DROP).alias("reason"), F.col(DROP_DETAIL).alias("detail"),
                    F.col(QFILE).alias("source_file"), F.col(QLINE).alias("source_line"), F.col(QRAW).alias("raw")))
            elif op.drop_log_key:
                self.droplog.append(dropped.select(
                    F.lit(op.stage).alias("stage"), F.col(DKEY).alias("key"), F.col(DROP).alias("reason"),
                    F.col(DROP_DETAIL).alias("detail")))
                if op.drop_state:
                    self.dropstate.append(dropped.where(F.col(DSTATE).isNotNull()).select(
                        F.lit(op.stage).alias("stage"), F.col(DKEY).alias("key"), F.col(DROP_DETAIL).alias("detail"),
                        F.col(DSTATE).alias("state")))
        self.arrow[node.id] = data_schema
        if parts is not None:  # the rows are in the part files, none in Spark: nothing may read them there
            return
        data = out.where(F.col(KIND) == DATA)
        self.df[node.id] = data.select(*data_schema.names)
        if hash_key is not None:
            self.root_hashed = data.select(*data_schema.names, KEY_HASH)

    def _parts_target(self, node: Node, data_schema: pa.Schema) -> PartsTarget | None:
        """Where the root chain writes its rows as shard parts (spark_parts.py), or None for the
        general path: the shard count must be known before the rows are (an explicit `shards:`), the
        chain must carry the sink's key, executors must share the output's storage (not `memory://`), and
        the shards must be few enough for one open file each per task (`MAX_PART_SHARDS`)."""
        sink = self.plan.sink
        if (sink is None or node is not self.plan.root or not isinstance(sink.shards, int)
                or not 0 < sink.shards <= MAX_PART_SHARDS
                or sink.key not in data_schema.names or sink.path.startswith("memory://")):
            return None
        self.parts_folder = f"{sink.path.rstrip('/')}/_work/spark-parts-{self.token}"
        return PartsTarget(self.parts_folder, sink.key, sink.shards, sink.partition)

    def _join(self, node: Join):
        from pyspark.sql import functions as F

        windowed = self._join_own_aggregate(node)
        if windowed is not None:
            return windowed
        left = self.df[node.left.id].alias("l")
        right = self.df[node.right.id]
        renamed = node.right_columns()
        if node.how in ("anti", "semi"):
            right = right.select(*node.right_on).distinct()
        else:
            right = right.select(*node.right_on, *(F.col(r).alias(o) for o, r in renamed.items() if o not in node.right_on))
        right = right.alias("r")
        if node.broadcast:
            right = F.broadcast(right)
        pairs = dict(zip(node.left_on, node.right_on))
        cond = [F.col(f"l.{a}") == F.col(f"r.{pairs[a]}") for a in sort_first(node.left_on, node.left.schema)]
        how = {"inner": "inner", "left": "left", "anti": "left_anti", "semi": "left_semi"}[node.how]
        j = left.join(right, cond, how)
        if node.how in ("anti", "semi"):
            cols = [F.col(f"l.{c}").alias(c) for c in node.schema.names]
        else:
            cols = [F.col(f"r.{c}" if c in renamed else f"l.{c}").alias(c) for c in node.schema.names]
        return j.select(*cols)

    def _join_own_aggregate(self, node: Join):
        """`Join(inner, R, Aggregate(R by K), on K)` as window columns over R partitioned by K, or None.

        Why: dedup asks "the smallest doc_id of each key/bucket, on every row" this way (exact keys,
        LSH buckets, component sizes). As a join, R is shuffled and sorted twice (once for the
        aggregate, once for the join; at 100k events the LSH bands are 1M rows); as a window, once.
        Same rows: the inner join drops rows whose key has a null, so the window does too.
        """
        agg = node.right
        if not (node.how == "inner" and node.right_prefix is None and isinstance(agg, Aggregate) and agg.input is node.left
                and list(node.left_on) == list(node.right_on) == list(agg.keys) and agg.keys
                and agg.id not in self.rows and not set(agg.aggs) & set(node.left.schema.names)):
            return None
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        w = Window.partitionBy(*sort_first(agg.keys, node.left.schema))
        df = self.df[node.left.id]
        for k in agg.keys:
            df = df.where(F.col(k).isNotNull())
        return df.select(*(_agg_expr(*agg.aggs[c], w).alias(c) if c in agg.aggs else F.col(c)
                           for c in node.schema.names))

    def _aggregate(self, node: Aggregate):
        exprs = [_agg_expr(op, col).alias(out) for out, (op, col) in node.aggs.items()]
        df = self.df[node.input.id].groupBy(*sort_first(node.keys, node.input.schema)).agg(*exprs)
        return df.select(*node.schema.names)

    def _components(self, node: ConnectedComponents):
        from datakit.engines.spark_cc import components_in_one_task, connected_components

        edges = self.df[node.input.id].select("src", "dst")
        n = self.rows.get(node.input.id)  # known: the input of a CC node is a chain's output
        if n is not None and n <= self.cc_one_task_edges:
            log.info("connected components of %d edges in one task", n)
            return components_in_one_task(edges, self.expected_env)
        out, rounds = connected_components(edges, checkpoint=self._persist)
        log.info("connected components converged in %d rounds", rounds)
        return out

    def _checkpoint_dir(self) -> str:
        if self._ckpt is None:
            base = (self.engine.checkpoint_dir or self.spark.conf.get("spark.checkpoint.dir", None)
                    or (str(Path(self.plan.sink.path) / "_work")
                        if self.plan.sink and "://" not in self.plan.sink.path
                        else tempfile.gettempdir()))
            self._ckpt = f"{base.rstrip('/')}/spark-checkpoints-{uuid.uuid4().hex[:8]}"
        return self._ckpt

    # -- sink
    def _sink(self) -> None:
        from pyspark.sql.pandas.types import from_arrow_schema

        plan = self.plan
        spec = plan.sink
        root = plan.root
        self.spec = resolved = resolve_sink(spec, self.rows[root.id])
        shards = resolved.shards
        schema = self.arrow[root.id]
        if self.part_files is not None:  # the root chain wrote its rows as shard parts
            infos = self._write_shard_parts(resolved, root.schema)
        else:
            if self.root_hashed is not None:  # the root chain hashed the key: the shard id is one JVM expression
                df = self.root_hashed.withColumn(SHARD_COL, shard_of_hash(KEY_HASH, shards)).drop(KEY_HASH)
            else:  # the root is a join or aggregate: its rows go through Python once for their shard id
                with_shard = pa.schema(list(schema) + [pa.field(SHARD_COL, pa.int64())])
                df = self.df[root.id].select(*schema.names).mapInArrow(
                    CheckedTask(_AddShard(spec.key, shards, spec.partition), self.expected_env),
                    from_arrow_schema(with_shard))
            infos = one_shard_per_partition(df, shards).mapInArrow(
                CheckedTask(_WriteShards(resolved, root.schema), self.expected_env), "shard long, info string").collect()
        got = {int(r["shard"]): json.loads(r["info"]) for r in infos}
        for s in range(shards):  # a shard no row hashed to: an empty file, as on the local engine
            if s not in got:
                got[s] = sinks.write_shard(root.schema.empty_table(), s, resolved, root.schema)
        self.infos = [got[s] for s in range(shards)]

    def _write_shard_parts(self, spec: SinkSpec, schema: pa.Schema) -> list[Any]:
        """One task per shard with parts: read them, `write_shard` (spark_parts.WriteShardParts)."""
        by_shard = parts_by_shard(self.part_files or [])
        if not by_shard:
            return []
        ids = sorted(by_shard)
        tasks = local_rows(self.spark, pa.table({"shard": pa.array(ids, pa.int64()),
                                                 "parts": pa.array([json.dumps(by_shard[s]) for s in ids])}))
        with _runtime_conf(self.spark, {LEAF_PARALLELISM: str(max(self.n, len(ids)))}):  # one shard per task
            return tasks.mapInArrow(CheckedTask(WriteShardParts(spec, schema), self.expected_env),
                                    "shard long, info string").collect()

    def _side_outputs(self) -> None:
        """Every side output in one query: their rows, tagged with their side, grouped by it, each group
        written as one file by one task. A side with no rows gets `write_side_output(None)` (an earlier
        run's file removed).

        Why one query: one per side cost two Spark jobs each (the shuffle, then the writing task), ~2.3 s
        of wall for quarantine + drop log at 100k quickstart events, plus an emptiness check for the
        drop state; with a missing column as null, the sides share one union.
        """
        from pyspark.sql import functions as F

        out = self.plan.sink.path.rstrip("/")
        frames = [f.withColumn("_side", F.lit(side)) for fs, side in
                  ((self.quarantine, "quarantine"), (self.droplog, "droplog"), (self.dropstate, "dropstate")) for f in fs]
        written: set[str] = set()
        if frames:
            df = frames[0]
            for f in frames[1:]:
                df = df.unionByName(f, allowMissingColumns=True)
            written = {r["side"] for r in df.groupBy("_side").applyInArrow(
                table_fn(CheckedTask(_WriteSide(out), self.expected_env)), "side string, rows long").collect()}
        for side in ("quarantine", "droplog", "dropstate"):
            if side not in written:  # no rows (only some drop-logging ops carry state): no stale file either
                write_side_output(None, out, side)

    def commit(self, stages: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        return commit_run(self.plan, self.inputs, self.spec, self.infos, stages, seconds, engine="spark", reused_tasks=0,
                          runtime={"master": self.sc.master, **self.parts.report(), "read_tasks": self.read_tasks,
                                   "log": str(log_file())})

    def cleanup(self) -> None:
        # drop our references so Spark's ContextCleaner can free the cached/checkpointed blocks
        self.df.clear()
        for bc in self.broadcasts:
            try:
                bc.destroy()
            except Exception:
                pass
        if self.parts_folder:
            remove_tree(self.parts_folder)
            if "://" not in self.parts_folder:
                remove_if_empty(str(Path(self.parts_folder).parent))
        if self._ckpt and "://" not in self._ckpt:
            shutil.rmtree(self._ckpt, ignore_errors=True)
            remove_if_empty(str(Path(self._ckpt).parent))


class translate_errors_at:
    """`translate_errors` naming the node being run when the failure happened."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self._cm = None

    def __enter__(self) -> None:
        self._cm = translate_errors("running")
        self._cm.__enter__()

    def __exit__(self, et, ev, tb) -> bool:
        if ev is None:
            return self._cm.__exit__(None, None, None)
        try:
            self._cm.__exit__(et, ev, tb)
        except SparkJobError as e:
            raise SparkJobError(str(e).replace("while running", f"while running {self.run.current}", 1)) from None
        except SparkError:
            raise
        return False


def _file_slices(spark, files: list[str], stamps: dict[str, str] | None = None):
    """A (`path`, `stamp`) DataFrame of `files` and their "size|mtime" as listed when the run started
    (`identity.check_unchanged`, before a task reads one), read in min(files, the run's partition
    count) tasks of consecutive files (see `local_rows`)."""
    return local_rows(spark, pa.table({"path": pa.array(files, pa.string()),
                                       "stamp": pa.array([(stamps or {}).get(f) for f in files], pa.string())}))


LEAF_PARALLELISM = "spark.sql.leafNodeDefaultParallelism"


def local_rows(spark, table: pa.Table):
    """`table` as a JVM-side relation: its scan splits the rows into min(rows, `LEAF_PARALLELISM`)
    partitions of consecutive rows, whatever record batches the table had.

    Why not `sc.parallelize(...).toDF()`: that is a Python RDD, so its tasks start a second Python
    worker beside the one that reads the files (seconds in a fresh session); `createDataFrame` of an
    Arrow table involves no Python worker. Why the run sets `LEAF_PARALLELISM` (`_Run.runtime_conf`):
    it defaults to the default parallelism (the cluster's cores), so every input was read in at most
    that many tasks, however many partitions the run planned from its input size; the sink raises it
    to its shard count around its own job (one shard per task).
    """
    return spark.createDataFrame(table)


def _agg_expr(op: str, col: str, window: Any = None):
    """One aggregate as the local engine (polars) computes it: `count` counts rows, `sum` of nothing
    is 0; over `window` when given (a column of every row instead of one row per group)."""
    from pyspark.sql import functions as F

    base = F.count(F.lit(1)) if op == "count" else F.sum(col) if op == "sum" else F.min(col) if op == "min" \
        else F.max(col)
    if window is not None:
        base = base.over(window)
    return F.coalesce(base, F.lit(0)).cast("long") if op == "sum" else base


def shard_of_hash(column: str, shards: int):
    """`sinks.shard_ids`'s rule in the JVM: `unsigned(h) % shards` of a signed 64-bit hash column.

    Spark has no unsigned longs. A negative `h` stands for `h + 2**64`, whose remainder is
    `(h mod shards + 2**64 mod shards) mod shards` with `pmod`'s non-negative mod; every term is
    below 2 x shards, so nothing overflows. Why in the JVM: computing it in Python sent every row
    of the dataset to a Python worker and back (167 + 159 MB of Arrow at 100k quickstart events).
    """
    from pyspark.sql import functions as F

    if shards <= 1:
        return F.lit(0).cast("long")
    h, n = F.col(column), F.lit(shards).cast("long")
    wrap = F.lit((1 << 64) % shards).cast("long")
    return F.when(h >= 0, h % n).otherwise(F.pmod(F.pmod(h, n) + wrap, n)).cast("long")


def one_shard_per_partition(df, shards: int):
    """`df` (with a `SHARD_COL`) repartitioned so that partition i holds exactly the rows of shard i.

    Why not `groupBy(shard)` or `repartition(n, shard)`: hash partitioning (Murmur3 of the id mod
    the partition count) put shards 0 and 1 of 2 into one partition, so one task wrote both while
    the other core idled (9.5 s of a 100k-event quickstart run); range partitioning samples the
    data in a job of its own and still merges ids when one shard outweighs the others.
    """
    from pyspark.sql import functions as F

    return df.repartitionById(shards, F.col(SHARD_COL).cast("int"))


def _native(node: Node) -> bool:
    """A MapBatches whose function also defines `spark_select` (plan.MapBatches): run in the JVM.

    Why: on Spark a Python function is a round trip of its rows through a Python worker; for a
    filter or a column rename that trip is the whole cost (the dedup LSH edges: 1M band rows at
    100k quickstart events). The function stays the definition; tests hold the two equal.
    """
    return (isinstance(node, MapBatches) and callable(getattr(node.fn, "spark_select", None))
            and not node.quarantine and node.drop_log_key is None)  # it drops nothing, so no accounting rows


# Arrow types by how well their first 8 bytes tell rows apart (Spark sorts by a 64-bit prefix of
# the first key, then compares whole rows only among equal prefixes); unlisted types rank last
_PREFIX_RANK = {pa.int64(): 0, pa.uint64(): 0, pa.float64(): 0, pa.string(): 0, pa.large_string(): 0,
                pa.binary(): 0, pa.timestamp("us"): 0, pa.int32(): 1, pa.uint32(): 1, pa.float32(): 1,
                pa.date32(): 1, pa.int16(): 2, pa.uint16(): 2, pa.int8(): 3, pa.uint8(): 3, pa.bool_(): 4}


def sort_first(keys: Sequence[str], schema: pa.Schema) -> list[str]:
    """`keys` reordered so that the widest type comes first (stable otherwise): the order Spark sorts
    a multi-column group, window partition or sort-merge join by.

    Why: the order of grouping or join keys does not change the result, but Spark's sorts compare a
    64-bit prefix of the first key before whole rows. Dedup's LSH buckets are keyed (band, bucket):
    with the band (a handful of values) first, nearly every comparison of ~1M band rows fell through
    to a whole-row compare; with the 64-bit bucket first the prefix decides (same window and edge
    aggregate on 1.05M rows, warm, local[2]: 0.84-1.09 s vs 1.16-1.54 s; first run 1.86 vs 3.75 s).
    """
    return sorted(keys, key=lambda k: _PREFIX_RANK.get(schema.field(k).type, 5) if k in schema.names else 5)


def _join_key(nid: int, consumers: list[Node]) -> str | None:
    """The one column on which two or more shuffled joins read node `nid`, else None.

    Why: a relation that several joins read by the same key (dedup's records: both ends of the
    candidate pairs, both ends of the cluster members, the final marking, each joined by doc_id)
    was shuffled and sorted by that key once per join. Stored hash-partitioned and sorted by it,
    it is shuffled once: a checkpoint keeps its plan's partitioning and ordering, so the joins
    shuffle only their other side.
    """
    keys: Counter[str] = Counter()
    for c in consumers:
        if not isinstance(c, Join) or c.broadcast:
            continue
        for side, on in ((c.left, c.left_on), (c.right, c.right_on)):
            if side.id == nid and len(on) == 1:
                keys[on[0]] += 1
    best = keys.most_common(1)
    return best[0][0] if best and best[0][1] >= 2 else None


def _python_chain(node: Node) -> bool:
    """A node that runs inside a mapInArrow chain (a Python MapBatches)."""
    return isinstance(node, MapBatches) and not _native(node)


def _counted_nodes(plan: Plan) -> set[int]:
    """Nodes whose row count the run report needs: each stage's input and output, the root (the sink
    sizes its shards by it), anti joins and their left sides (their difference is a drop count)."""
    out = {plan.root.id}
    for span in plan.spans:
        out |= {span.input.id, span.output.id}
    for node in plan.nodes():
        if isinstance(node, Join) and node.how == "anti":
            out |= {node.id, node.left.id}
    return out


def _with_provenance(schema: pa.Schema) -> pa.Schema:
    """`schema` plus the provenance columns a batch may carry beyond it (see `core.conform`)."""
    extra = [pa.field(n, t) for n, t in (("_source_file", pa.string()), ("_source_line", pa.int64()))
             if n not in schema.names]
    return pa.schema(list(schema) + extra)

