"""How many partitions a Spark run uses: from the input's size unless the user said otherwise.

Why: Spark's default shuffle partition count (`spark.sql.shuffle.partitions`, which our session
sets to the core count) is right for a laptop and far too few for terabytes -- every stage
function is a Python worker holding a batch of a partition, so a partition of tens of GB
spills or gets the container killed, and a straggler on it is a long task to redo. So the
engine derives the count from the bytes it reads, with a documented target per partition:

    n = max(parallelism, ceil(input_bytes / target))     target = 64 MiB of (compressed) input

What the user says wins, in this order: `--partitions N` (the engine option), then
`spark.sql.shuffle.partitions` given with `--conf` / the pipeline's `spark:` block or to
spark-submit; `spark.datakit.partitionBytes` changes the target. Output bytes never
depend on the count (shards are assigned by key hash and sorted before writing).

The other `spark.datakit.*` settings are parsed and checked here too, so every user setting fails
before a session starts: `spark.datakit.componentsOneTaskMaxEdges` (spark_cc.py),
`spark.datakit.stallSeconds` (spark_stall.py).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["TARGET_PARTITION_BYTES", "TARGET_CONF", "ONE_TASK_CONF", "ONE_TASK_MAX_EDGES", "PartitionPlan",
           "plan_partitions", "parse_bytes", "one_task_max_edges", "check_user_conf", "read_tasks"]

TARGET_PARTITION_BYTES = 64 << 20  # ~0.5 GB of events as .zst JSONL: a batch-sized share per Python worker
TARGET_CONF = "spark.datakit.partitionBytes"
SHUFFLE_CONF = "spark.sql.shuffle.partitions"
# connected components of graphs up to this many edges are found in one task (see spark_cc.py)
ONE_TASK_MAX_EDGES = 1_000_000
ONE_TASK_CONF = "spark.datakit.componentsOneTaskMaxEdges"

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_bytes(value: Any) -> int:
    """`67108864`, `64m`, `64MiB`, `1g` -> bytes (Spark's size suffixes, binary)."""
    m = _SIZE.match(str(value))
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"{TARGET_CONF} must be a positive size such as 64m or 1g (got {value!r})")
    return int(m.group(1)) << (10 * " kmgt".index(m.group(2).lower() or " "))


@dataclass(frozen=True)
class PartitionPlan:
    """The partition count of one run and where it came from (recorded in the run report)."""

    n: int
    source: str  # "--partitions" | SHUFFLE_CONF | "input size"
    input_bytes: int
    target_bytes: int

    def report(self) -> dict[str, Any]:
        return {"partitions": self.n, "partitions_from": self.source, "input_bytes": self.input_bytes,
                "partition_target_bytes": self.target_bytes}


# Up to this many tasks per core read the input files when there are more files than planned partitions.
# Why: a file is read by one task (a .zst or .gz stream cannot be split), and `n` tasks of consecutive
# files put unequal shares on the cores: the 100k-event quickstart's three files (9, 27 and 27 MB of
# .zst) were read in two tasks of 9 and 54 MB, and the first chain's tasks took 5.1 and 11.6 s (15k
# against 85k events) while one of the two cores idled. One file per task lets the scheduler hand the
# next file to whichever core is free, as the local engine's pool does.
READ_TASKS_PER_CORE = 4


def read_tasks(files: int, plan: PartitionPlan, parallelism: int) -> int:
    """How many tasks read `files` input files: the planned count, or one per file (up to
    READ_TASKS_PER_CORE per core) when that is more; exactly the count the user gave with `--partitions`."""
    if plan.source == "--partitions":
        return plan.n
    return max(plan.n, min(files, READ_TASKS_PER_CORE * max(1, parallelism)))


def one_task_max_edges(value: object = None) -> int:
    """The edge count up to which components are found in one task (`value`: the user's setting)."""
    if value is None or value == "":
        return ONE_TASK_MAX_EDGES
    try:
        n = int(str(value))
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{ONE_TASK_CONF} must be a number of edges, 0 or more (got {value!r})")
    return n


ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"


def check_user_conf(conf: dict[str, Any]) -> None:
    """ValueError (one line) for a datakit Spark setting that can never work, before any session exists.

    Found in review: a misspelled `spark.datakit.partitionbytes=1m` was ignored without a word (the run
    used the default), and `maxRecordsPerBatch=-1` (Spark's "no limit") failed mid-run, after the
    output was retracted, with a traceback from pyspark's `createDataFrame`."""
    from datakit.engines.spark_stall import STALL_CONF, stall_seconds

    known = (TARGET_CONF, ONE_TASK_CONF, STALL_CONF)
    unknown = sorted(k for k in conf if str(k).startswith("spark.datakit.") and k not in known)
    if unknown:
        raise ValueError(f"unknown datakit Spark setting {unknown[0]!r}; known: {', '.join(known)}")
    plan_partitions(0, 1, None, conf)
    one_task_max_edges(conf.get(ONE_TASK_CONF))
    stall_seconds(conf.get(STALL_CONF))
    if conf.get(ARROW_BATCH_CONF) not in (None, ""):
        try:
            rows = int(str(conf[ARROW_BATCH_CONF]))
        except ValueError:
            rows = 0
        if rows < 1:
            raise ValueError(f"{ARROW_BATCH_CONF} must be a positive number of rows for datakit "
                             f"(got {conf[ARROW_BATCH_CONF]!r})")


def plan_partitions(input_bytes: int, parallelism: int, explicit: int | None = None,
                    user_conf: dict[str, Any] | None = None) -> PartitionPlan:
    """The partition count for a run reading `input_bytes` on a cluster of `parallelism` cores.

    `explicit`: the engine's `partitions` option. `user_conf`: the settings the *user* gave
    (never our own session defaults), where `spark.sql.shuffle.partitions` and
    `spark.datakit.partitionBytes` are looked up.
    """
    conf = user_conf or {}
    target = parse_bytes(conf[TARGET_CONF]) if conf.get(TARGET_CONF) else TARGET_PARTITION_BYTES
    if explicit:
        return PartitionPlan(int(explicit), "--partitions", input_bytes, target)
    if conf.get(SHUFFLE_CONF):
        try:
            n = int(str(conf[SHUFFLE_CONF]))
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{SHUFFLE_CONF} must be a positive number (got {conf[SHUFFLE_CONF]!r})")
        return PartitionPlan(n, SHUFFLE_CONF, input_bytes, target)
    n = max(1, parallelism, math.ceil(max(0, input_bytes) / target))
    return PartitionPlan(n, "input size", input_bytes, target)
