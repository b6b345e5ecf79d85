"""Scheduling: how many processes a run uses and how tasks are mapped over them."""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, NamedTuple

from datakit import progress, watchdog
from datakit.engines.local import memory
from datakit.errors import DatakitError
from datakit.io import storage
from datakit.plan import MapBatches, Plan, Source

log = logging.getLogger("datakit.engine.local")

class EngineError(DatakitError, RuntimeError):
    """The job failed for a reason that is not the user's input (a worker died); the CLI exits 3."""


# Below this much input (compressed files and Parquet counted at ~5x their size on disk) a 2-core run
# stays in this process unless `workers` is given: spawning a pool and importing pyarrow/polars/numba/
# spaCy in each worker costs ~3 s, more than a second core saves on it (measured on the quickstart
# pipeline, 2 cores: 3k events (2 MB .zst) 7.9 s in-process vs 11.5 s with 2 workers; 6k (3.6 MB)
# 9.9 vs 10.8 s; 20k (13 MB) 24.6 vs 21.9 s). With more cores the pool pays off sooner: the
# threshold is divided by (workers - 1).
SMALL_INPUT_BYTES = 32 << 20
_COMPRESSED = (".zst", ".gz", ".gzip", ".zstd", ".bz2", ".xz", ".parquet", ".pq")  # (compared lower-cased)


def _input_bytes(plan: Plan) -> int | None:
    """Uncompressed-equivalent size of the plan's local input files; None if any is remote or missing."""
    total = 0
    for node in plan.nodes():
        if isinstance(node, Source):
            for path in node.paths:
                local = path[len("file://"):] if path.startswith("file://") else path
                if "://" in local or not os.path.exists(local):
                    return None
                total += os.path.getsize(local) * (5 if local.lower().endswith(_COMPRESSED) else 1)
    return total


# Below this much input (counted as for SMALL_INPUT_BYTES) a natively threaded plan
# (`_natively_threaded`) runs in this process, its tokenizer on every core: the pool's workers only add
# their start-up (interpreter, imports, tokenizer load), while one process with two tokenizer threads
# was measured to pay a little more per token than two single-threaded workers (why is not known; the
# tokenizer's threads idling during the Python steps between encode calls is a guess). Measured on
# 2 cores through `datakit run`, CPU of the process tree, alternated runs: 32 MB of text (10.5 MB of
# Parquet, 53 MB counted) in-process 7.83 vs pool 8.19 CPU-s (whole files), 6.26 vs 6.69 (documents
# <= 2,000 characters); 128 MB of text (210 MB counted) 29.58 vs 29.27. The two-size fits put the
# crossover near 80 MB of text (~130 MB counted). With more cores the pool pays off sooner, as for
# SMALL_INPUT_BYTES: the threshold is divided by (workers - 1). Since `encode_flat` reads one chunk's
# ids while the next is encoded (089b0a1), 128 MB of text measured in-process 27.51 vs pool 27.81
# CPU-s (2 alternated runs), so the guess above fits and the limit could rise; not re-measured enough
# (wall time included) to move it yet.
NATIVE_SMALL_INPUT_BYTES = 128 << 20


def _natively_threaded(plan: Plan) -> bool:
    """Whether all of the plan's work runs in native thread pools that span a process's cores: maps
    marked `threads="native"` (at least one) or "light", and nothing else but its input (no join,
    group-by or Python-threaded map, which need processes to use more than one core)."""
    nodes = [n for n in plan.nodes() if not isinstance(n, Source)]
    return (any(isinstance(n, MapBatches) and n.threads == "native" for n in nodes)
            and all(isinstance(n, MapBatches) and n.threads in ("native", "light") for n in nodes))


def workers_for(plan: Plan, workers: int) -> int:
    """Worker count when none was given: `workers` (all cores), or 1 for a small local input
    (SMALL_INPUT_BYTES; NATIVE_SMALL_INPUT_BYTES for a natively threaded plan).

    A natively threaded plan runs in this process only if it has the allocator the workers would
    get (the `datakit` command restarts with it, `datakit/launch.py`): the tokenizer costs 20-25%
    more CPU under glibc's malloc (`datakit/allocator.py`), more than the pool's start-up."""
    if workers > 1:
        size = _input_bytes(plan)
        if size is not None and size < SMALL_INPUT_BYTES // (workers - 1):
            log.info("small input (%d MB): running in-process (pass workers=N to use a pool)", size >> 20)
            return 1
        if size is not None and size < NATIVE_SMALL_INPUT_BYTES // (workers - 1) and _natively_threaded(plan):
            from datakit import allocator

            if allocator.runs_like_workers():
                log.info("natively threaded plan, %d MB of input: running in-process, its threads on every "
                         "core (pass workers=N to use a pool)", size >> 20)
                return 1
    return workers


def run_tasks(fn: Callable, items: list, what: str, workers: int, progress_enabled: bool | None, beat_dir: str,
              label: str | None = None, costs: list | None = None, guard_here: bool = True) -> list:
    """`fn` over `items`, in this process (one worker or one item) or on the kept pool, results in order.

    Pool tasks are watched (`datakit.watchdog`): a task whose heartbeat in `beat_dir` stops is
    reported as stalled instead of hanging the run. Progress is reported per finished task.
    Each pool task's cost (CPU, numba, and its process's start-up: `run_timing.task_end`) is
    appended to `costs`, so the run report can account for the workers' seconds too. `guard_here`: watch
    the tasks this process runs itself (`watchdog.in_process`); off for tasks that run no stage function."""
    if not items:
        return []
    st = progress.step(label or what, len(items), progress_enabled)
    ok = False
    try:
        if workers == 1 or len(items) == 1:
            fn = _Guarded(fn)
            out = []
            try:
                sequence = memory.tasks_in_sequence() if len(items) > 1 else contextlib.nullcontext()
                with watchdog.in_process(what, enabled=guard_here) as guard, sequence:  # a stall fails the run
                    for i in items:
                        guard.task(_task_path(i))
                        out.append(fn(i))
                        guard.done()
                        st.advance(rows=_task_rows(out[-1]))
            except watchdog.StalledHere as e:
                raise EngineError(str(e)) from None
            ok = True
            return out
        fn = _Guarded(fn, timed=True)
        try:
            out = watchdog.map_watched(fn, items, workers, beat_dir, what, _task_path,
                                       lambda r: st.advance(rows=_task_rows(r.result)))
        except watchdog.TaskStalled as e:
            raise EngineError(str(e)) from None
        except watchdog.WorkerDied as e:  # which task, and how its worker ended
            raise EngineError(f"{e}; rerun to resume finished work") from None
        except BrokenProcessPool:
            raise EngineError(
                f"a local worker process died during '{what}' (killed, out of memory, a script that runs its "
                "pipeline at import time: use `if __name__ == \"__main__\":`, or a main program the workers cannot "
                "start again, such as `python - < script.py`: see the workers' error above); rerun to resume "
                "finished work") from None
        ok = True
        if costs is not None:
            costs.extend(r.cost for r in out)
        return [r.result for r in out]
    finally:
        st.finish(ok=ok)


def _task_rows(result: Any) -> int:
    """Rows a finished task read (chain tasks report `base_rows`) or wrote (a shard writer's `rows`:
    "write shards: done, 0 rows" was logged for every run, found in review)."""
    if not isinstance(result, dict):
        return 0
    return int(result.get("base_rows", result.get("rows", 0)) or 0)


class _Guarded:
    """A worker entry point whose failure reaches the parent as what it was, in one line.

    A storage failure (after the IO layer's retries) becomes a `StorageError` naming
    the task's file; an exception that cannot be pickled back to the parent
    (aiohttp's carry a `multidict`) becomes its text, instead of the pool's
    unrelated "can't pickle" error hiding it.
    """

    def __init__(self, fn: Callable, timed: bool = False) -> None:
        self.fn = fn
        self.timed = timed  # a pool task: the result goes back with what it cost (`_Costed`)

    def __call__(self, item: Any) -> Any:
        try:
            if not self.timed:
                return self.fn(item)
            from datakit import run_timing

            begin = run_timing.task_begin()
            result = self.fn(item)
            return _Costed(result, run_timing.task_end(begin))
        except SystemExit as e:
            # a library's sys.exit inside a task (pyspark's doctest check did, through great_expectations'
            # import): sent back to the parent it ended the command with that status, often 0, having
            # published nothing (found in review). A task never decides the process's exit.
            raise EngineError(f"a task of {_task_path(item)} called sys.exit({e.code!r}) (a library that "
                              "exits inside datakit's work); nothing was published") from None
        except Exception as e:
            if storage.is_disk_full(e):  # the folder written to, not the task's input (found in review)
                raise storage.describe(e, _task_output(item), "write under") from None
            if storage.is_storage_error(e):
                raise storage.describe(e, _task_path(item), "read or write") from None
            try:
                pickle.loads(pickle.dumps(e))
            except Exception:  # noqa: BLE001 - any pickling failure: send the text
                raise EngineError(f"{type(e).__name__}: {e}") from None
            raise


class _Costed(NamedTuple):
    """A pool task's result and its cost (`run_timing.task_end`)."""

    result: Any
    cost: dict


def _task_output(item: Any) -> str:
    """The folder a task writes to (its work folder's part of the run), for a full disk's message."""
    from datakit.engines.local.chain import ChainTask

    if isinstance(item, ChainTask):
        return item.scratch or item.out_dir
    if isinstance(item, tuple) and len(item) == 4 and hasattr(item[2], "path"):  # write_one_shard
        return item[2].path.rstrip("/")
    return _task_path(item)


def _task_path(item: Any) -> str:
    from datakit.engines.local.chain import ChainTask
    from datakit.plan import Aggregate, Join

    if isinstance(item, ChainTask):
        return item.partition.url
    if isinstance(item, tuple) and item and isinstance(item[0], (Join, Aggregate)):  # a bucket join or group-by
        return f"{item[-2]} (a bucket of {item[0].describe()})"
    if isinstance(item, tuple) and len(item) == 4 and hasattr(item[2], "path"):  # write_one_shard
        return f"{item[2].path.rstrip('/')} (shard {item[1]})"
    return str(item)[:200]
