"""The logical plan: a small DAG of relational nodes that both engines execute.

Why so few node types: every engine must implement every node, and the
conformance contract (byte-identical output on every engine and partitioning)
is only affordable if the surface is tiny. Stages never talk to an engine;
they call the builder methods on `Rel` inside `StageConfig.compile`.

Row-dropping convention (the accounting contract): a `MapBatches` function may
add a string column `_drop` (null = keep; otherwise the drop reason) and an
optional string column `_drop_detail` (e.g. the kept duplicate's doc_id, the
matched eval ids). The engine removes those rows, counts them by reason under
the node's stage, writes them to quarantine (`quarantine=True`, full rows) or to
the drop log (`drop_log_key="doc_id"`, key + reason + detail), and casts the
kept rows to the node's declared schema. A drop-logging function may also add a
string column `_drop_state` (null for most rows): what a *later* run needs to know
about a dropped row (e.g. the LSH band keys of a near duplicate, for dedup against
history). The engine writes those rows (stage, key, detail, state) to the side
output `_dropped_state/`, never to the data.
"""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal

import pyarrow as pa

BatchFn = Callable[[pa.RecordBatch], "pa.RecordBatch | pa.Table"]

DROP = "_drop"
DROP_DETAIL = "_drop_detail"
DROP_STATE = "_drop_state"
# a string column of JSON objects {name: count} a MapBatches fn may add; summed into the stage's `metrics`
METRICS = "_metrics"


def metrics_column(n: int, counts: dict[str, int], row: int = 0) -> pa.Array:
    """A METRICS column for `n` rows: `counts` as one JSON object on `row`, null elsewhere (all null
    when `counts` is empty). One row per batch is enough: the engine sums the column."""
    out: list[str | None] = [None] * n
    if counts and n:
        out[row] = json.dumps(counts, sort_keys=True)
    return pa.array(out, pa.string())

_ids = itertools.count()


@dataclass(eq=False)
class Node:
    """Base of all plan nodes. `stage` names the pipeline stage that owns it (for accounting)."""

    stage: str
    schema: pa.Schema
    id: int = field(default_factory=lambda: next(_ids), init=False)

    @property
    def inputs(self) -> list["Node"]:
        return []

    def describe(self) -> str:
        return type(self).__name__


@dataclass(eq=False)
class Source(Node):
    """Input files. `format` is `jsonl` (plain/.gz/.zst, yields RAW_LINES rows) or `parquet`."""

    paths: list[str] = field(default_factory=list)
    format: str = "jsonl"
    schema_name: str = ""

    def describe(self) -> str:
        return f"Source({self.format}, {len(self.paths)} files, schema={self.schema_name})"


@dataclass(eq=False)
class _OneInput(Node):
    """A node over one input relation (MapBatches, Aggregate, ConnectedComponents)."""

    input: Node | None = None

    @property
    def inputs(self) -> list[Node]:
        return [self.input]


@dataclass(eq=False)
class MapBatches(_OneInput):
    """A pure, row-local function over Arrow batches (may drop via `_drop`, may emit more rows).

    `fn` must be picklable (a module-level function or a class instance) so the
    local engine's process pool and Spark executors can run it.

    A function that only filters, renames or combines columns with SQL-expressible logic and
    drops nothing (no `_drop`) may also define `spark_select(df, F) -> DataFrame`: the same rows
    and columns in Spark SQL (`F` is `pyspark.sql.functions`). The Spark engine then runs it in
    the JVM, with no trip through Python and, when one node reads it, no job of its own (see
    `datakit.engines.spark`); `fn` stays the definition, and tests hold the two equal.
    """

    fn: BatchFn | None = None
    name: str = ""
    quarantine: bool = False
    drop_log_key: str | None = None
    drop_state: bool = False  # its dropped rows may carry `_drop_state` (written to `_dropped_state/`)
    # the only input columns `fn` reads (None: any). A promise that lets an engine hand `fn` just these:
    # the Spark engine then ships a side branch's few columns to Python, not whole events; the local
    # engine reads just these from a materialized node's spill (input files are read whole).
    reads: tuple[str, ...] | None = None
    # where `fn` does its work, for the local engine's choice of processes (`scheduler.workers_for`);
    # never changes output. "python": on the calling thread (more cores need more processes);
    # "native": in a native thread pool that already spans the process's cores (the tokenizer's rayon
    # pool), so more processes only add their start-up; "light": too little to weigh (a profile counter).
    threads: Literal["python", "native", "light"] = "python"

    def describe(self) -> str:
        extra = ", quarantine" if self.quarantine else ""
        return f"MapBatches({self.name}{extra})"


@dataclass(eq=False)
class Join(Node):
    """Relational join. `how="anti"` drops matching left rows and counts them under `reason`.

    `broadcast=True` says the right side is small (an opt-out list, a dedup
    loser set): engines may ship it to every worker instead of shuffling.

    Right-side columns: without `right_prefix`, those not named like a left column or a right key
    (a clash keeps the left one). With `right_prefix`, every non-key right column, renamed
    `right_prefix + name`: so one relation can be joined twice (both ends of a pair) without a
    pass in between that copies the first end's columns aside.
    """

    left: Node | None = None
    right: Node | None = None
    left_on: list[str] = field(default_factory=list)
    right_on: list[str] = field(default_factory=list)
    how: Literal["inner", "left", "anti", "semi"] = "inner"
    reason: str | None = None
    broadcast: bool = False
    right_prefix: str | None = None

    @property
    def inputs(self) -> list[Node]:
        return [self.left, self.right]

    def right_columns(self) -> dict[str, str]:
        """Output column -> the right-side column it comes from (not the keys; none for anti/semi)."""
        if self.how in ("anti", "semi"):
            return {}
        left = set(self.left.schema.names)
        return {(self.right_prefix or "") + c: c for c in self.right.schema.names
                if c not in self.right_on and (self.right_prefix or c not in left)}

    def describe(self) -> str:
        extra = (", broadcast" if self.broadcast else "") + (f", right_prefix={self.right_prefix!r}" if self.right_prefix else "")
        return f"Join({self.how}, {self.left_on}={self.right_on}{extra})"


AggOp = Literal["min", "max", "count", "sum"]


@dataclass(eq=False)
class Aggregate(_OneInput):
    """Group by `keys`; `aggs` maps output column -> (op, input column). Output order is unspecified."""

    keys: list[str] = field(default_factory=list)
    aggs: dict[str, tuple[str, str]] = field(default_factory=dict)

    def describe(self) -> str:
        return f"Aggregate(by {self.keys}: {self.aggs})"


@dataclass(eq=False)
class ConnectedComponents(_OneInput):
    """Edges (`src`, `dst`: string ids) -> rows (`node`, `component`) with component = smallest id.

    Only nodes that appear in at least one edge are returned. The smallest-id
    representative makes the answer unique, so engines agree exactly.
    """


@dataclass
class SinkSpec:
    """Where and how the final relation is written (see `datakit.io.sinks`)."""

    path: str
    format: str = "parquet"
    shards: int = 1
    key: str = "doc_id"  # rows go to shard xxh64(key) % shards and are sorted by `sort_key` in a shard
    partition: str = "hash"  # "hash": xxh64(key) % shards; "value": the integer `key` column is the shard
    sort_key: str | None = None  # default: `key`; a seeded shuffle uses a hash column
    options: dict[str, Any] = field(default_factory=dict)  # format-specific (tokenizer, seq_len, ...)
    # the run's config hash (pipeline + environment): a finished shard is reused only when it was
    # written under the same identity and writer settings (see `datakit.io.sinks.shard_reuse_key`)
    identity: str = ""


@dataclass
class StageSpan:
    """Which part of the plan one pipeline stage compiled to (for per-stage accounting)."""

    name: str
    kind: str
    input: Node
    output: Node
    emits: str = "rows"  # the unit of its output rows when it differs from its input ("records", ...)


@dataclass
class Plan:
    """The compiled pipeline: a DAG ending in `root`, plus the sink and per-stage spans."""

    root: Node
    sink: SinkSpec | None
    spans: list[StageSpan]
    config: dict[str, Any]
    seed: int = 0
    # what else the bytes depend on, resolved at compile: library versions, artifact digests,
    # environment-dependent choices (spaCy model, scan strategy). Folded into `config_hash`.
    environment: dict[str, Any] = field(default_factory=dict)
    # expectations checked inside the run (datakit.quality.expect): one dict per check node's counters
    checks: list[dict[str, Any]] = field(default_factory=list)
    gate: bool = True  # a failed `error` check stops the run before commit (validate only reports)

    def __post_init__(self) -> None:
        # Stable node ids (topological position): a resumed run recognises the counters
        # of work finished by an earlier process, whose global id counter differed.
        for i, n in enumerate(self.nodes()):
            n.id = i
        if self.sink is not None and not self.sink.identity:
            self.sink.identity = self.config_hash

    @property
    def config_hash(self) -> str:
        """sha256 of the pipeline config and the environment it resolved to (the determinism contract)."""
        if not self.environment:
            return config_hash(self.config)
        return config_hash({"pipeline": self.config, "environment": self.environment})

    def input_files(self) -> list[str]:
        """Every file the plan reads (its Source nodes: the input and side inputs such as opt-out lists)."""
        return sorted({p for n in self.nodes() if isinstance(n, Source) for p in n.paths})

    def nodes(self) -> list[Node]:
        """All nodes in dependency order (inputs before users)."""
        seen: dict[int, Node] = {}

        def visit(n: Node) -> None:
            if n.id in seen:
                return
            for i in n.inputs:
                visit(i)
            seen[n.id] = n

        visit(self.root)
        return list(seen.values())

    def explain(self, format: str = "text") -> str:
        """The plan as a DAG, every node once (`#k` = its position in dependency order).

        `text`: one line per node with its inputs by id, so a node several stages
        read (the one Source, a shared dedup relation) is printed once and referenced.
        `dot`: the same graph for Graphviz (`datakit explain p.yaml --format dot | dot -Tsvg`),
        nodes grouped by stage.
        """
        order = self.nodes()
        ref = {n.id: f"#{k}" for k, n in enumerate(order)}
        if format == "dot":
            return self._dot(order, ref)
        if format != "text":
            raise ValueError(f"unknown explain format {format!r}; choose text or dot")
        idw = len(f"#{len(order) - 1}")
        width = max((len(f"{ref[n.id]:<{idw}}  {n.describe()}") for n in order), default=0)
        lines = []
        for n in order:
            head = f"{ref[n.id]:<{idw}}  {n.describe()}"
            inputs = f" <- {', '.join(ref[i.id] for i in n.inputs)}" if n.inputs else ""
            lines.append(f"{head:<{width}}  [{n.stage}]{inputs}")
        if self.sink:
            s = self.sink
            lines.append(f"Sink({s.format}, {s.path}, shards={s.shards}, key={s.key}) <- {ref[self.root.id]}")
        return "\n".join(lines)

    def _dot(self, order: list[Node], ref: dict[int, str]) -> str:
        def q(text: str) -> str:
            return json.dumps(text)  # a JSON string is a valid DOT quoted string

        out = ["digraph plan {", "  rankdir=TB;", "  node [shape=box, fontname=monospace];"]
        stages: dict[str, list[Node]] = {}
        for n in order:
            stages.setdefault(n.stage, []).append(n)
        for k, (stage, nodes) in enumerate(stages.items()):
            out.append(f"  subgraph cluster_{k} {{ label={q(stage)};")
            out += [f"    n{n.id} [label={q(f'{ref[n.id]} {n.describe()}')}];" for n in nodes]
            out.append("  }")
        out += [f"  n{i.id} -> n{n.id};" for n in order for i in n.inputs]
        if self.sink:
            s = self.sink
            out.append(f"  sink [shape=cylinder, label={q(f'Sink({s.format}, {s.path}, shards={s.shards})')}];")
            out.append(f"  n{self.root.id} -> sink;")
        out.append("}")
        return "\n".join(out)


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a pipeline config (paths included: they define the run)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


class Rel:
    """A handle on one node while a stage compiles; its methods add nodes.

    Example (a stage that keeps short documents)::

        def compile(self, rel, ctx):
            return rel.map_batches(KeepShort(self.max_chars), rel.schema, name="keep_short")
    """

    def __init__(self, node: Node, stage: str) -> None:
        self.node = node
        self.stage = stage

    @property
    def schema(self) -> pa.Schema:
        return self.node.schema

    def _wrap(self, node: Node) -> "Rel":
        return Rel(node, self.stage)

    def map_batches(
        self,
        fn: BatchFn,
        schema: pa.Schema,
        *,
        name: str,
        quarantine: bool = False,
        drop_log_key: str | None = None,
        drop_state: bool = False,
        reads: tuple[str, ...] | None = None,
        threads: Literal["python", "native", "light"] = "python",
    ) -> "Rel":
        return self._wrap(
            MapBatches(
                stage=self.stage, schema=schema, input=self.node, fn=by_value_if_main(fn), name=name,
                quarantine=quarantine, drop_log_key=drop_log_key, drop_state=drop_state,
                reads=tuple(reads) if reads is not None else None, threads=threads,
            )
        )

    def join(
        self,
        right: "Rel",
        left_on: str | list[str],
        right_on: str | list[str] | None = None,
        *,
        how: Literal["inner", "left", "anti", "semi"] = "inner",
        reason: str | None = None,
        broadcast: bool = False,
        right_prefix: str | None = None,
    ) -> "Rel":
        lo = [left_on] if isinstance(left_on, str) else list(left_on)
        ro = lo if right_on is None else ([right_on] if isinstance(right_on, str) else list(right_on))
        if how == "anti" and not reason:
            raise ValueError("an anti join drops rows, so it needs a reason for the accounting")
        if right_prefix is not None and (how in ("anti", "semi") or not right_prefix):
            raise ValueError("right_prefix renames the right side's columns: an inner or left join, a non-empty prefix")
        if how in ("anti", "semi"):
            schema = self.schema
        elif right_prefix:
            extra = [f.with_name(right_prefix + f.name) for f in right.schema if f.name not in ro]
            clash = [f.name for f in extra if f.name in self.schema.names]
            if clash:
                raise ValueError(f"right_prefix {right_prefix!r} gives column(s) the left side has: {', '.join(clash)}")
            schema = pa.schema(list(self.schema) + extra)
        else:
            extra = [f for f in right.schema if f.name not in ro and f.name not in self.schema.names]
            schema = pa.schema(list(self.schema) + extra)
        return self._wrap(
            Join(stage=self.stage, schema=schema, left=self.node, right=right.node, left_on=lo,
                 right_on=ro, how=how, reason=reason, broadcast=broadcast, right_prefix=right_prefix)
        )

    def aggregate(self, keys: list[str], aggs: dict[str, tuple[str, str]]) -> "Rel":
        fields = [self.schema.field(k) for k in keys]
        for out, (op, col) in aggs.items():
            if op == "count":
                fields.append(pa.field(out, pa.int64()))
            elif op in ("min", "max"):
                fields.append(pa.field(out, self.schema.field(col).type))
            elif op == "sum":
                fields.append(pa.field(out, pa.int64()))
            else:
                raise ValueError(f"unsupported aggregate {op!r}")
        return self._wrap(Aggregate(stage=self.stage, schema=pa.schema(fields), input=self.node, keys=list(keys), aggs=dict(aggs)))

    def connected_components(self) -> "Rel":
        if not {"src", "dst"} <= set(self.schema.names):
            raise ValueError("connected_components needs columns src and dst")
        schema = pa.schema([("node", pa.string()), ("component", pa.string())])
        return self._wrap(ConnectedComponents(stage=self.stage, schema=schema, input=self.node))


def source(paths: Iterable[str], format: str, schema: pa.Schema, schema_name: str, stage: str = "input") -> Rel:
    """A `Rel` over input files (used by the pipeline compiler and by stages reading side inputs)."""
    return Rel(Source(stage=stage, schema=schema, paths=list(paths), format=format, schema_name=schema_name), stage)


def by_value_if_main(fn: Any) -> Any:
    """`fn` itself, or wrapped in `ByValue` when its class (or it, a plain function) was defined in
    `__main__`.

    Why: pool workers are spawned processes that unpickle a stage function by reference, and a class
    defined in a notebook cell (or any `__main__` without a file) has no module they can import: every
    worker died, reported as "out of memory, or a script that runs its pipeline at import time", while
    the same pipeline ran in-process on a small input and on Spark, which ships functions by value
    (found in review)."""
    if isinstance(fn, ByValue) or getattr(fn, "__module__", None) != "__main__":  # (an instance: its class's)
        return fn
    return ByValue(fn)


def _from_value(blob: bytes) -> "ByValue":
    import cloudpickle

    return ByValue(cloudpickle.loads(blob))


class ByValue:
    """A batch function pickled by value (cloudpickle: its class and what it refers to travel with it);
    every other attribute (`setup`, `spark_select`, `reads`, ...) is the wrapped function's."""

    def __init__(self, fn: Any) -> None:
        self.__dict__["fn"] = fn

    def __call__(self, batch: Any) -> Any:
        return self.__dict__["fn"](batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["fn"], name)

    def __reduce__(self) -> tuple:
        import cloudpickle

        return _from_value, (cloudpickle.dumps(self.__dict__["fn"]),)

    def __repr__(self) -> str:
        return f"ByValue({self.__dict__['fn']!r})"
