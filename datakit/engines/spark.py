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
* `Join` / `Aggregate` -- Spark's own (`F.broadcast` for small right sides).
* `ConnectedComponents` -- large-star/small-star (`spark_cc`), O(log n) rounds.
* Sink -- a shard id column (`datakit.io.sinks.shard_ids`), then
  `groupBy(shard).applyInArrow` calls `write_shard` *on the executors*; only the
  small per-shard info dicts come back to commit the manifest.

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
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from datakit.accounting import NodeStats, count_drops, stage_report, sum_metrics
from datakit.engines.local import DROPLOG_SCHEMA, METRICS, QUARANTINE_SCHEMA, RunResult, _conform
from datakit.engines.spark_session import (SparkError, SparkJobError, get_session, log_file,
                                           translate_errors)
from datakit.io import sinks
from datakit.io.readers import iter_parquet, iter_raw_lines
from datakit.plan import (DROP, DROP_DETAIL, Aggregate, ConnectedComponents, Join, MapBatches, Node, Plan,
                          SinkSpec, Source)

log = logging.getLogger("datakit.engine.spark")

PROVENANCE = ("_source_file", "_source_line")
SHARD_COL = "_shard"
_DROPKEY = "_dropkey"
_RAW = "_raw"


# --------------------------------------------------------------------------- executor-side functions
# Module-level classes: cloudpickle ships them by reference, executors import this module.

_FN_CACHE: dict[str, Any] = {}


def _load_fn(bc, token: str) -> Any:
    """The stage function of a broadcast, unpickled once per Python worker (not per task).

    `token` is a random id made on the driver: executors do not know a broadcast's id.
    """
    fn = _FN_CACHE.get(token)
    if fn is None:
        from pyspark import cloudpickle

        fn = _FN_CACHE[token] = cloudpickle.loads(bc.value)
    return fn


def _cast_in(batch: pa.RecordBatch, schema: pa.Schema, optional: tuple[str, ...]) -> pa.RecordBatch:
    """Spark's batch -> the exact Arrow types the local engine would pass (list field names, nullability).

    `optional` provenance columns that are null in the whole batch were absent
    upstream (a function that does not carry them): drop them so the stage
    function sees the same columns as on the local engine.
    """
    batch = batch.select(schema.names).cast(schema) if batch.schema != schema else batch
    for name in optional:
        if name in batch.schema.names and batch.column(name).null_count == batch.num_rows:
            batch = batch.drop_columns([name])
    return batch


class _ReadFiles:
    """mapInArrow over a DataFrame of file URLs: read each with the local engine's reader."""

    def __init__(self, fmt: str, schema: pa.Schema, out_schema: pa.Schema) -> None:
        self.fmt, self.schema, self.out_schema = fmt, schema, out_schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for url in b.column("path").to_pylist():
                if self.fmt == "jsonl":
                    yield from iter_raw_lines(url)
                else:
                    for rb in iter_parquet(url):
                        yield _conform(rb, self.schema).select(self.out_schema.names).cast(self.out_schema)


class _MapFn:
    """mapInArrow wrapper of one MapBatches node.

    Output rows are either kept rows (data columns conformed to the node schema,
    `_drop` null) or dropped rows (data columns null; `_drop`, `_drop_detail`,
    and `_raw` for quarantine or `_dropkey` for the drop log). `_metrics` is
    passed through for the stats aggregation.
    """

    def __init__(self, bc, in_schema: pa.Schema, in_optional: tuple[str, ...], node_schema: pa.Schema,
                 data_schema: pa.Schema, out_schema: pa.Schema, quarantine: bool, drop_log_key: str | None) -> None:
        self.bc, self.in_schema, self.in_optional = bc, in_schema, in_optional
        self.node_schema, self.data_schema, self.out_schema = node_schema, data_schema, out_schema
        self.quarantine, self.drop_log_key = quarantine, drop_log_key
        self.token = uuid.uuid4().hex

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = _load_fn(self.bc, self.token)
        for batch in batches:
            batch = _cast_in(batch, self.in_schema, self.in_optional)
            out = fn(batch)
            if isinstance(out, pa.Table):
                out = out.combine_chunks().to_batches()[0] if out.num_rows else \
                    pa.RecordBatch.from_pylist([], schema=out.schema)
            if out.num_rows == 0:
                continue
            yield self._split(out)

    def _split(self, out: pa.RecordBatch) -> pa.RecordBatch:
        n = out.num_rows
        names = out.schema.names
        drop = out.column(DROP).cast(pa.string()) if DROP in names else pa.nulls(n, pa.string())
        keep = pc.is_null(drop)
        any_dropped = drop.null_count != n
        kept = out.filter(keep) if any_dropped else out
        kept_c = _conform(kept, self.node_schema)
        # data columns: kept rows conformed (provenance may be absent -> nulls), dropped rows null
        cols = []
        for f in self.data_schema:
            if f.name in kept_c.schema.names:
                c = kept_c.column(f.name)
                c = c if c.type == f.type else c.cast(f.type)
            else:
                c = pa.nulls(kept_c.num_rows, f.type)
            cols.append(c)
        k = kept_c.num_rows
        parts = [pa.RecordBatch.from_arrays(
            cols + [pa.nulls(k, pa.string()), pa.nulls(k, pa.string()), pa.nulls(k, self.out_schema.field(-2).type),
                    kept.column(METRICS).cast(pa.string()) if METRICS in names else pa.nulls(k, pa.string())],
            schema=self.out_schema)]
        if any_dropped:
            d = out.filter(pc.invert(keep))
            m = d.num_rows
            dn = d.schema.names

            def col(name: str, typ: pa.DataType) -> pa.Array:
                return d.column(name).cast(typ) if name in dn else pa.nulls(m, typ)

            data = [col(f.name, f.type) if f.name in PROVENANCE and self.quarantine else pa.nulls(m, f.type)
                    for f in self.data_schema]
            if self.quarantine:
                aux = col(_RAW, pa.binary())
            elif self.drop_log_key:
                aux = col(self.drop_log_key, pa.string())
            else:
                aux = pa.nulls(m, self.out_schema.field(-2).type)
            parts.append(pa.RecordBatch.from_arrays(
                data + [col(DROP, pa.string()), col(DROP_DETAIL, pa.string()), aux, col(METRICS, pa.string())],
                schema=self.out_schema))
        return pa.Table.from_batches(parts, schema=self.out_schema).combine_chunks().to_batches()[0] \
            if len(parts) > 1 else parts[0]


_STATS_SCHEMA = pa.schema([("k", pa.string()), ("name", pa.string()), ("n", pa.int64())])


def _partial_stats(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Per partition: kept rows, drops by reason, summed `_metrics` (summed again by Spark)."""
    kept = 0
    drops: Counter = Counter()
    metrics: Counter = Counter()
    for b in batches:
        drop = b.column(DROP)
        kept += drop.null_count
        if drop.null_count != b.num_rows:
            drops.update(count_drops(b))
        if b.column(METRICS).null_count != b.num_rows:
            metrics.update(sum_metrics(b.column(METRICS)))
    rows = [("out", "", kept)] + [("drop", k, v) for k, v in drops.items()] + [("metric", k, v) for k, v in metrics.items()]
    yield pa.RecordBatch.from_pylist([dict(k=a, name=b, n=c) for a, b, c in rows], schema=_STATS_SCHEMA)


class _AddShard:
    """mapInArrow: append the shard id of every row (same xxh64 as the local engine)."""

    def __init__(self, key: str, shards: int) -> None:
        self.key, self.shards = key, shards

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            ids = sinks.shard_ids(b.column(self.key).cast(pa.string()), self.shards)
            yield b.append_column(SHARD_COL, pa.array(ids, pa.int64()))


class _WriteShard:
    """applyInArrow per shard: sort and write it with `write_shard` on the executor; return its info."""

    def __init__(self, spec: SinkSpec, schema: pa.Schema) -> None:
        self.spec, self.schema = spec, schema

    def __call__(self, table: pa.Table) -> pa.Table:
        shard = int(table.column(SHARD_COL)[0].as_py())
        info = sinks.write_shard(table.drop_columns([SHARD_COL]), shard, self.spec, self.schema)
        return pa.table({"shard": pa.array([shard], pa.int64()),
                         "info": pa.array([json.dumps(info, sort_keys=True)], pa.string())})


class _WriteSide:
    """applyInArrow over one group: write a side output (quarantine / drop log) as one sorted file."""

    def __init__(self, url: str, schema: pa.Schema) -> None:
        self.url, self.schema = url, schema

    def __call__(self, table: pa.Table) -> pa.Table:
        table = table.select(self.schema.names).cast(self.schema)
        # every column in the sort: ties cannot depend on arrival order
        idx = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in self.schema.names])
        sinks.write_parquet(table.take(idx).combine_chunks(), self.url)
        return pa.table({"rows": pa.array([table.num_rows], pa.int64())})


def _table_fn(obj: Any):
    """A plain annotated function around a callable object (pyspark infers applyInArrow's type from hints)."""

    def apply(table: pa.Table) -> pa.Table:
        return obj(table)

    return apply


# --------------------------------------------------------------------------- the engine

class SparkEngine:
    """Execute a `Plan` with PySpark on `master` (default local[2]; `spark://`, `local-cluster[...]`, yarn...).

    `conf` is passed to the session (pipeline file `spark:` block and `--conf`);
    `partitions` sets the number of read slices and shuffle partitions. Inside
    `spark-submit` leave `master` unset to use the submitted application's session.
    """

    name = "spark"

    def __init__(self, master: str | None = None, conf: dict[str, Any] | None = None, partitions: int | None = None,
                 workers: int | None = None, checkpoint_dir: str | None = None, **_ignored: Any) -> None:
        if master is None and workers:
            master = f"local[{int(workers)}]"
        self.master = master
        self.conf = dict(conf or {})
        self.partitions = partitions
        self.checkpoint_dir = checkpoint_dir

    def execute(self, plan: Plan) -> RunResult:
        t0 = time.perf_counter()
        spark = get_session(self.master, self.conf)
        run = _Run(self, spark, plan)
        try:
            with _runtime_conf(spark, run.runtime_conf()):
                stages, manifest, out = run.go()
        finally:
            run.cleanup()
        seconds = time.perf_counter() - t0
        if plan.sink is not None:
            manifest = run.commit(stages, seconds)
        return RunResult(output_path=out, stages=stages, manifest=manifest, seconds=seconds, engine="spark",
                         extra={"master": spark.sparkContext.master, "partitions": run.n,
                                "reused_shards": sum(1 for i in run.infos if i.get("reused")),
                                "log": str(log_file())})


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

    def __init__(self, engine: SparkEngine, spark, plan: Plan) -> None:
        self.engine, self.spark, self.plan = engine, spark, plan
        self.sc = spark.sparkContext
        self.n = max(1, engine.partitions or self.sc.defaultParallelism)
        self.df: dict[int, Any] = {}
        self.arrow: dict[int, tuple[pa.Schema, tuple[str, ...]]] = {}  # node -> (schema in Spark, optional cols)
        self.rows: dict[int, int] = {}
        self.stats: dict[int, NodeStats] = defaultdict(NodeStats)
        self.persisted: list[Any] = []
        self.broadcasts: list[Any] = []
        self.quarantine: list[Any] = []
        self.droplog: list[Any] = []
        self.infos: list[dict[str, Any]] = []
        self.spec: SinkSpec | None = None
        self.current = "starting"
        self._ckpt: str | None = None

    def runtime_conf(self) -> dict[str, str]:
        conf = {"spark.sql.shuffle.partitions": str(self.n),
                "spark.sql.execution.arrow.pyspark.enabled": "true",
                "spark.sql.execution.arrow.useLargeVarTypes": "false"}
        if self.engine.partitions:  # an explicit number is honoured, not coalesced away
            conf["spark.sql.adaptive.coalescePartitions.enabled"] = "false"
        return conf

    # -- driver loop
    def go(self) -> tuple[list[dict[str, Any]], dict | None, str | None]:
        plan = self.plan
        with translate_errors_at(self):
            for node in plan.nodes():
                self.current = f"stage {node.stage!r} ({node.describe()})"
                t = time.perf_counter()
                self._run_node(node)
                self.stats[node.id].seconds += time.perf_counter() - t
            stages = stage_report(plan, self.stats, self.rows)
            if plan.sink is None:
                return stages, None, None
            self.current = "writing the output shards"
            self._sink()
            self.current = "writing quarantine and drop log"
            self._side_outputs()
        return stages, {}, plan.sink.path

    def _run_node(self, node: Node) -> None:
        if isinstance(node, Source):
            df, schema, optional = self._source(node)
        elif isinstance(node, MapBatches):
            df, schema, optional = self._map(node)
        elif isinstance(node, Join):
            df, schema, optional = self._join(node)
        elif isinstance(node, Aggregate):
            df, schema, optional = self._aggregate(node)
        elif isinstance(node, ConnectedComponents):
            df, schema, optional = self._components(node)
        else:
            raise NotImplementedError(f"the Spark engine cannot run {type(node).__name__}")
        self.arrow[node.id] = (schema, optional)
        if node.id not in self.rows:
            df = self._persist(df)
            self.rows[node.id] = df.count()
        self.df[node.id] = df
        if isinstance(node, Join):
            st = self.stats[node.id]
            st.rows_in += self.rows[node.left.id]
            st.rows_out += self.rows[node.id]
            if node.how == "anti":
                st.dropped[node.reason] += self.rows[node.left.id] - self.rows[node.id]

    def _persist(self, df):
        from pyspark import StorageLevel

        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        self.persisted.append(df)
        return df

    # -- nodes
    def _source(self, node: Source):
        from pyspark.sql.pandas.types import from_arrow_schema

        if node.format == "jsonl":
            from datakit.contracts import RAW_LINES

            schema = RAW_LINES
        else:
            schema = pa.schema(list(node.schema) + [pa.field(n, t) for n, t in
                                                   (("_source_file", pa.string()), ("_source_line", pa.int64()))
                                                   if n not in node.schema.names])
        files = list(node.paths)
        slices = max(1, min(len(files), self.n))
        paths = self.sc.parallelize([(f,) for f in files], slices).toDF("path string")
        df = paths.mapInArrow(_ReadFiles(node.format, node.schema, schema), from_arrow_schema(schema))
        if len(files) < self.n:
            # few big files: spread their rows (Spark sorts before a round-robin repartition, so a
            # retried task gets the same rows)
            df = df.repartition(self.n)
        return df, schema, ()

    def _map(self, node: MapBatches):
        from pyspark import cloudpickle
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        in_schema, in_optional = self.arrow[node.input.id]
        extras = [pa.field(n, t) for n, t in (("_source_file", pa.string()), ("_source_line", pa.int64()))
                  if n not in node.schema.names]
        data_schema = pa.schema(list(node.schema) + extras)
        aux_type = pa.binary() if node.quarantine else pa.string()
        out_schema = pa.schema(list(data_schema) + [
            pa.field(DROP, pa.string()), pa.field(DROP_DETAIL, pa.string()),
            pa.field(_RAW if node.quarantine else _DROPKEY, aux_type), pa.field(METRICS, pa.string())])
        bc = self.sc.broadcast(cloudpickle.dumps(node.fn))
        self.broadcasts.append(bc)
        wrapper = _MapFn(bc, in_schema, in_optional, node.schema, data_schema, out_schema, node.quarantine,
                         node.drop_log_key)
        src = self.df[node.input.id].select(*in_schema.names)
        allrows = self._persist(src.mapInArrow(wrapper, from_arrow_schema(out_schema)))
        # one aggregation over the persisted rows: exact under task retries (no accumulators)
        agg = (allrows.select(DROP, METRICS).mapInArrow(_partial_stats, "k string, name string, n long")
               .groupBy("k", "name").agg(F.sum("n").alias("n")).collect())
        st = self.stats[node.id]
        st.rows_in += self.rows[node.input.id]
        for r in agg:
            if r["k"] == "out":
                st.rows_out += int(r["n"])
            elif r["k"] == "drop":
                st.dropped[r["name"]] += int(r["n"])
            else:
                st.metrics[r["name"]] += int(r["n"])
        self.rows[node.id] = st.rows_out
        if st.dropped:
            dropped = allrows.where(F.col(DROP).isNotNull())
            if node.quarantine:
                self.quarantine.append(dropped.select(
                    F.lit(node.stage).alias("stage"), F.col(DROP).alias("reason"), F.col(DROP_DETAIL).alias("detail"),
                    F.col("_source_file").alias("source_file"), F.col("_source_line").alias("source_line"),
                    F.col(_RAW).alias("raw")))
            elif node.drop_log_key:
                self.droplog.append(dropped.select(
                    F.lit(node.stage).alias("stage"), F.col(_DROPKEY).alias("key"), F.col(DROP).alias("reason"),
                    F.col(DROP_DETAIL).alias("detail")))
        kept = allrows.where(F.col(DROP).isNull()).select(*data_schema.names)
        optional = tuple(f.name for f in extras)
        return kept, data_schema, optional

    def _join(self, node: Join):
        from pyspark.sql import functions as F

        left = self.df[node.left.id].alias("l")
        right = self.df[node.right.id]
        if node.how in ("anti", "semi"):
            right = right.select(*node.right_on).distinct()
        else:
            extra = [c for c in node.schema.names if c not in node.left.schema.names]
            right = right.select(*dict.fromkeys(list(node.right_on) + extra))
        right = right.alias("r")
        if node.broadcast:
            right = F.broadcast(right)
        cond = [F.col(f"l.{a}") == F.col(f"r.{b}") for a, b in zip(node.left_on, node.right_on)]
        how = {"inner": "inner", "left": "left", "anti": "left_anti", "semi": "left_semi"}[node.how]
        j = left.join(right, cond, how)
        if node.how in ("anti", "semi"):
            cols = [F.col(f"l.{c}").alias(c) for c in node.schema.names]
        else:
            lnames = set(node.left.schema.names)
            cols = [F.col(f"l.{c}" if c in lnames else f"r.{c}").alias(c) for c in node.schema.names]
        return j.select(*cols), node.schema, ()

    def _aggregate(self, node: Aggregate):
        from pyspark.sql import functions as F

        exprs = []
        for out, (op, col) in node.aggs.items():
            if op == "count":
                e = F.count(F.lit(1))
            elif op == "sum":
                e = F.coalesce(F.sum(col), F.lit(0)).cast("long")
            elif op == "min":
                e = F.min(col)
            else:
                e = F.max(col)
            exprs.append(e.alias(out))
        df = self.df[node.input.id].groupBy(*node.keys).agg(*exprs)
        return df.select(*node.schema.names), node.schema, ()

    def _components(self, node: ConnectedComponents):
        from datakit.engines.spark_cc import connected_components

        self.sc.setCheckpointDir(self._checkpoint_dir())
        edges = self.df[node.input.id].select("src", "dst")
        out, rounds = connected_components(edges, checkpoint=lambda d: d.checkpoint(eager=True))
        log.info("connected components converged in %d rounds", rounds)
        return out, node.schema, ()

    def _checkpoint_dir(self) -> str:
        if self._ckpt is None:
            base = (self.engine.checkpoint_dir or self.spark.conf.get("spark.checkpoint.dir", None)
                    or (str(Path(self.plan.sink.path) / "_work") if self.plan.sink and "://" not in self.plan.sink.path
                        else tempfile.gettempdir()))
            self._ckpt = f"{base.rstrip('/')}/spark-checkpoints-{uuid.uuid4().hex[:8]}"
        return self._ckpt

    # -- sink
    def _sink(self) -> None:
        from pyspark.sql.pandas.types import from_arrow_schema

        plan = self.plan
        spec = plan.sink
        root = plan.root
        shards = spec.shards if isinstance(spec.shards, int) and spec.shards > 0 else \
            max(1, -(-self.rows[root.id] // int(spec.options.get("rows_per_shard", 100_000))))
        self.spec = resolved = SinkSpec(**{**spec.__dict__, "shards": shards})
        schema, _ = self.arrow[root.id]
        with_shard = pa.schema(list(schema) + [pa.field(SHARD_COL, pa.int64())])
        df = self.df[root.id].select(*schema.names).mapInArrow(_AddShard(spec.key, shards),
                                                                from_arrow_schema(with_shard))
        infos = (df.groupBy(SHARD_COL).applyInArrow(_table_fn(_WriteShard(resolved, root.schema)), "shard long, info string")
                 .collect())
        got = {int(r["shard"]): json.loads(r["info"]) for r in infos}
        for s in range(shards):  # a shard no row hashed to: an empty file, as on the local engine
            if s not in got:
                got[s] = sinks.write_shard(root.schema.empty_table(), s, resolved, root.schema)
        self.infos = [got[s] for s in range(shards)]

    def _side_outputs(self) -> None:
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema  # noqa: F401

        out = self.plan.sink.path.rstrip("/")
        for frames, folder, schema in ((self.quarantine, "_quarantine", QUARANTINE_SCHEMA),
                                       (self.droplog, "_dropped", DROPLOG_SCHEMA)):
            if not frames:
                continue
            df = frames[0]
            for f in frames[1:]:
                df = df.unionByName(f)
            (df.withColumn("_g", F.lit(0)).groupBy("_g")
             .applyInArrow(_table_fn(_WriteSide(f"{out}/{folder}/part-00000.parquet", schema)), "rows long").collect())

    def commit(self, stages: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        from datakit.io.atomic import write_json_atomic

        plan, spec = self.plan, self.spec
        manifest = sinks.commit(spec, self.infos, {
            "pipeline": plan.config, "pipeline_hash": plan.config_hash, "seed": plan.seed,
        })
        run = {
            "run_report_version": 1,
            "engine": "spark",
            "pipeline": plan.config,
            "pipeline_hash": plan.config_hash,
            "stages": stages,
            "output": {"path": spec.path, "format": spec.format, "shards": spec.shards, "rows": manifest["rows"],
                       "reused_shards": sum(1 for i in self.infos if i.get("reused"))},
            "spark": {"master": self.sc.master, "partitions": self.n, "log": str(log_file())},
            "seconds": round(seconds, 3),
        }
        write_json_atomic(f"{spec.path.rstrip('/')}/_run.json", run)
        return manifest

    def cleanup(self) -> None:
        for df in self.persisted:
            try:
                df.unpersist()
            except Exception:  # the session may be gone after a failure
                pass
        for bc in self.broadcasts:
            try:
                bc.destroy()
            except Exception:
                pass
        if self._ckpt and "://" not in self._ckpt:
            shutil.rmtree(self._ckpt, ignore_errors=True)
            _remove_if_empty(str(Path(self._ckpt).parent))


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


def _remove_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
