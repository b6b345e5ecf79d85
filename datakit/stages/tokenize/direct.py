"""Tokenize an in-memory table of training records straight into a dataset folder, no engine.

Why: tests, benchmarks and notebooks need the exact bytes a pipeline run
produces (same encode function, same sink sharding, same writers, same
manifest), without starting an engine. `Pipeline.run` remains the way to
process files; this is the same code path minus the plan executor.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datakit.io.sinks import commit, shard_ids, write_shard
from datakit.io.take import take_rows
from datakit.plan import DROP, DROP_DETAIL, SinkSpec, config_hash
from datakit.stages.base import CompileContext
from datakit.stages.tokenize.encode import ENCODED_SCHEMA, encode_table
from datakit.stages.tokenize.stage import TokenizeConfig


def encode_records(records: pa.Table, config: TokenizeConfig, seed: int = 0,
                   batch_rows: int = 1024) -> tuple[pa.Table, dict[str, int], dict[str, Any]]:
    """(kept encoded rows, drop counts by reason, sink options) for `records`."""
    ctx = CompileContext(seed=seed)
    tok = config.load(ctx)
    from datakit.stages.tokenize.encode import EncodeOptions

    opts = EncodeOptions(seed=seed, fim_rate=config.fim_rate, fim_spm_rate=config.fim_spm_rate,
                         add_bos=config.add_bos, seq_len=config.seq_len, overlong=config.overlong)
    parts, drops = [], {}
    for batch in records.to_batches(max_chunksize=batch_rows):
        out = encode_table(batch, tok, opts)
        reason = out.column(DROP)
        for r in reason.to_pylist():
            if r is not None:
                drops[r] = drops.get(r, 0) + 1
        parts.append(out.filter(pc.is_null(reason)).drop_columns([DROP, DROP_DETAIL]))
    table = pa.concat_tables(parts) if parts else ENCODED_SCHEMA.empty_table()
    return table.cast(ENCODED_SCHEMA), drops, config.sink_options(tok, seed)


def build_dataset(records: pa.Table, out: str, config: TokenizeConfig, shards: int = 1,
                  format: str = "packed", seed: int = 0, batch_rows: int = 1024,
                  writer_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Encode `records`, shard by xxh64(doc_id), write with `format`, commit; returns the manifest.
    `writer_options` add to the sink options (e.g. `mds_size_limit`)."""
    encoded, drops, options = encode_records(records, config, seed, batch_rows)
    spec = SinkSpec(path=out, format=format, shards=shards, options={**options, **(writer_options or {})})
    sid = shard_ids(encoded.column("doc_id"), shards)
    order = np.argsort(sid, kind="stable")
    grouped = take_rows(encoded, order)
    bounds = np.searchsorted(sid[order], np.arange(shards + 1))
    infos = [write_shard(grouped.slice(int(bounds[k]), int(bounds[k + 1] - bounds[k])), k, spec, ENCODED_SCHEMA)
             for k in range(shards)]
    cfg = {"stages": [config.model_dump(mode="json")], "seed": seed}
    return commit(spec, infos, {"config": cfg, "config_hash": config_hash(cfg), "dropped": drops})
