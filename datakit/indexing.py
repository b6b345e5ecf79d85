"""Build the n-gram index of a dataset by running its plan on an engine, then publish the folder.

Why a module of its own: the plan and its sink format belong to the decontaminate stage, engines
run plans, and neither may import the other (docs/architecture.md). This is the small piece that
picks an engine, like `Pipeline.run` does for a pipeline: the CLI's `build-index --engine`, the
pipeline's `output.index` (on the engine that ran the pipeline) and library users call it.
"""
from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Sequence

from datakit.engines import get_engine
from datakit.io import tempwork
from datakit.io.fs import InputError, remove_tree
from datakit.io.records import refuse_token_only_formats
from datakit.io.verify import verify_if_committed
from datakit.stages.decontaminate.index import (FP_BITS, IndexInfo, index_plan, info_of, publish, refuse_foreign_target,
                                               source_stamps, write_sources)
from datakit.stages.decontaminate.normalize import DEFAULT_NORMALIZATIONS

log = logging.getLogger("datakit.decontam.index")


def build_index(data: str | Sequence[str], out_path: str, ngram: int = 13,
                normalization: Sequence[str] = DEFAULT_NORMALIZATIONS, text_fields: Sequence[str] | None = None,
                batch_rows: int = 8192, fingerprint_bits: int = FP_BITS, *, engine: str = "local",
                workers: int | None = None, partition_bits: int | None = None, allow_empty: bool = False,
                **engine_options: Any) -> IndexInfo:
    """Index every n-gram of a records dataset (Parquet/JSONL, globs, fsspec URLs) or packed dataset into `out_path`.

    `normalization` is a list of normalization names (see `normalize.py`); the
    check re-uses the index's n and normalizations automatically.
    `fingerprint_bits` 32 (default, ~5 B per n-gram, FP ~1e-9 per n-gram) or 16
    (~3 B per n-gram, FP ~1e-4 per n-gram: harmless under a min-fraction rule,
    which needs many n-grams of one item, but visible with the any-n-gram rule).
    `engine` "local" (`workers` processes, default all cores) or "spark" (`master`, `conf`, ...:
    the options of `datakit.engines.get_engine`). The bytes never depend on the engine, the
    worker count or `partition_bits` (2^bits sink partitions; default from the parallelism).
    Nothing is published unless the whole build succeeds. Data with no readable document is an
    InputError unless `allow_empty` (a pipeline's own output, which may be empty; a check refuses such
    an index as it refuses to scan such data).
    """
    from datakit.workers import usable_cpus

    if not isinstance(ngram, int) or ngram < 1:  # found in review: n=0 failed in the workers, blaming a data file
        raise InputError(f"ngram must be >= 1, got {ngram}")
    if fingerprint_bits not in (16, 32):
        raise ValueError("fingerprint_bits must be 16 or 32")
    if partition_bits is not None and not 1 <= partition_bits <= 12:
        raise ValueError("partition_bits must be 1..12")
    paths = [data] if isinstance(data, str) else list(data)
    refuse_foreign_target(out_path)  # before any work: publishing replaces what is there
    for p in paths:
        refuse_token_only_formats(str(p))
        verify_if_committed(str(p))  # an index of a dataset missing a file would answer for rows it never saw
    if engine == "local":
        # explicit: the plan's Source is a list of tiny unit files, which the small-input rule would run in-process
        workers = max(1, workers or usable_cpus())
        if any(str(p).startswith("memory://") for p in paths + [out_path]):
            workers = 1  # an in-memory filesystem lives in this process only: spawned workers would not see it
        runner = get_engine("local", workers=workers, progress=engine_options.pop("progress", False),
                            **engine_options)
        parallelism = workers
    else:
        runner = get_engine(engine, **({"workers": workers} if workers else {}), **engine_options)
        parallelism = _spark_parallelism(runner)
    work = _work_folder(out_path, engine)
    t0 = time.perf_counter()
    # the files it answers for, as they are before the build reads them (a check beside the data compares
    # them with the folder then: stale_reason)
    root = out_path.rstrip("/").rsplit("/", 1)[0] if "/" in out_path.rstrip("/") else "."
    sources = source_stamps(data, root)
    try:
        plan = index_plan(data, work, ngram=ngram, normalization=normalization, text_fields=text_fields,
                          batch_rows=batch_rows, fingerprint_bits=fingerprint_bits, parallelism=parallelism,
                          partition_bits=partition_bits)
        result = runner.execute(plan)
        meta = {k: v for k, v in (result.manifest or {}).items() if k not in ("rows", "path")}
        if not meta.get("documents") and not allow_empty:  # an index of nothing would let a check answer "clean" for data it never read
            skipped = int(meta.get("skipped_lines") or 0)
            raise InputError(f"{', '.join(map(str, paths))}: no readable document"
                             + (f" ({skipped} unreadable line{'s' * (skipped != 1)} skipped)" if skipped else "")
                             + "; nothing was indexed")
        write_sources(f"{work}/index", sources, [str(p) for p in paths], root)
        publish(f"{work}/index", out_path)
    finally:
        remove_tree(work)
    log.info("n-gram index written to %s on the %s engine: %d n-grams (%.1f s)", out_path, engine, meta["ngrams"],
             time.perf_counter() - t0)
    return info_of(out_path, meta)


def _spark_parallelism(runner: Any) -> int:
    from datakit.engines.spark_session import get_session

    return int(get_session(runner.master, runner.conf).sparkContext.defaultParallelism)


def _work_folder(out_path: str, engine: str) -> str:
    """Where the plan's units, partitions and the finished index live until published: beside `out_path`
    (so the publishing rename stays on one filesystem, and Spark executors see it on a shared store);
    a local scratch folder when a local engine writes to an object store -- in this machine's cache folder,
    not the system temp directory, so a killed build's folder is swept by the next run (io/tempwork.py)."""
    name = f".tmp-index-{uuid.uuid4().hex[:12]}"
    remote = "://" in out_path and not out_path.startswith("file://")
    if remote and engine == "local":
        return tempwork.claim(uuid.uuid4().hex)
    parent = out_path.rstrip("/").rsplit("/", 1)[0] if "/" in out_path.rstrip("/") else "."
    return f"{parent}/{name}"  # created by the plan, once the input is known to exist

