"""Checks of a packed token dataset that GX cannot express (arrays, cross-file counts), one shard at a time.

Why custom: GX validates tables; a packed shard is `.npy` matrices whose
invariants relate arrays to each other and to the manifest. Each check reads one
shard memory-mapped, in slices of sequences, so memory is bounded by the slice
whatever the shard size; on Spark each shard is checked inside an executor and
only the counters come back.

Checks (names used in `quality/packed.json`, one family each in the tests):

- `ids_below_vocab`: every token id < the manifest's `tokenizer.vocab_size`
- `sequence_length`: tokens and loss_mask are `[n, seq_len]`
- `mask_binary`: loss_mask values in {0, 1}
- `boundaries_monotonic`: seq_index starts at 0, never decreases, ends at the
  segment count; inside a sequence segment starts begin at 0, strictly increase
  and stay below seq_len
- `counts_match_manifest`: sequences, documents and tokens of the shard equal the
  manifest's numbers (and the docs table's row count)
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

CHECKS = ["ids_below_vocab", "sequence_length", "mask_binary", "boundaries_monotonic", "counts_match_manifest"]
SLICE = 4096  # sequences read at a time


def _load(base: str, name: str):
    from datakit.io.fs import filesystem

    fs, p = filesystem(f"{base}/{name}")
    try:
        if "://" not in base or base.startswith("file://"):
            return np.load(p, mmap_mode="r")
        with fs.open(p, "rb") as f:  # object stores: no memory map
            return np.load(f)
    except (ValueError, EOFError) as e:  # not an array any more (a changed header): name the file, exit 2
        from datakit.io.verify import DatasetVerifyError

        raise DatasetVerifyError(f"{base}: data file {name} is not a readable array "
                                 f"({str(e).splitlines()[0][:120]}; rerun the pipeline)") from None


def check_shard(task: tuple[str, dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    """Counters for one shard: per check `n` (items looked at), `bad`, and the first bad position."""
    base, shard, meta = task
    arrays = shard.get("arrays") or {}
    c: Counter = Counter()
    first: dict[str, str] = {}

    def bad(check: str, n: int, where: str) -> None:
        c[f"{check}.bad"] += n
        first.setdefault(check, f"shard {shard['shard']}: {where}")

    tokens = _load(base, arrays["tokens"])
    mask = _load(base, arrays["loss_mask"])
    segments = _load(base, arrays["segments"])
    seq_index = _load(base, arrays["seq_index"])
    seq_len, vocab = int(meta["seq_len"]), int(meta["vocab_size"])
    n = tokens.shape[0] if tokens.ndim == 2 else 0

    c["sequence_length.n"] += 2
    if tokens.ndim != 2 or tokens.shape[1] != seq_len:
        bad("sequence_length", 1, f"tokens shape {tuple(tokens.shape)}, seq_len {seq_len}")
    if mask.shape != tokens.shape:
        bad("sequence_length", 1, f"loss_mask shape {tuple(mask.shape)} != tokens {tuple(tokens.shape)}")
    for lo in range(0, n, SLICE):
        t = np.asarray(tokens[lo:lo + SLICE])
        c["ids_below_vocab.n"] += t.size
        over = int((t.astype(np.int64) >= vocab).sum())
        if over:
            row = lo + int(np.argmax((t.astype(np.int64) >= vocab).any(axis=1)))
            bad("ids_below_vocab", over, f"sequence {row} has an id >= vocab size {vocab}")
        if mask.shape == tokens.shape:
            m = np.asarray(mask[lo:lo + SLICE])
            c["mask_binary.n"] += m.size
            wrong = int((m > 1).sum())
            if wrong:
                row = lo + int(np.argmax((m > 1).any(axis=1)))
                bad("mask_binary", wrong, f"sequence {row} has a loss_mask value other than 0/1")

    idx = np.asarray(seq_index, dtype=np.int64)
    c["boundaries_monotonic.n"] += max(len(idx), 1)
    if len(idx) != n + 1 or (len(idx) and (idx[0] != 0 or idx[-1] != len(segments))):
        bad("boundaries_monotonic", 1, f"seq_index has {len(idx)} entries for {n} sequences / {len(segments)} segments")
    elif len(idx) > 1:
        steps = np.diff(idx)
        if (steps < 0).any():
            bad("boundaries_monotonic", int((steps < 0).sum()), f"seq_index decreases at {int(np.argmax(steps < 0))}")
        starts = np.asarray(segments[:, 0], dtype=np.int64) if len(segments) else np.zeros(0, np.int64)
        if len(starts):
            seq_of = np.repeat(np.arange(n), np.maximum(steps, 0))
            first_in_seq = np.zeros(len(starts), bool)
            first_in_seq[idx[:-1][steps > 0]] = True
            prev = np.concatenate([[-1], starts[:-1]])
            wrong = (first_in_seq & (starts != 0)) | (~first_in_seq & (starts <= prev)) | (starts >= seq_len) | (starts < 0)
            if wrong.any():
                k = int(np.argmax(wrong))
                bad("boundaries_monotonic", int(wrong.sum()), f"sequence {int(seq_of[k]) if k < len(seq_of) else '?'}: "
                    "segment starts must begin at 0, increase and stay below seq_len")

    docs_rows = None
    if arrays.get("docs"):
        import pyarrow.parquet as pq

        from datakit.io.fs import arrow_filesystem, filesystem

        fs, p = filesystem(f"{base}/{arrays['docs']}")
        docs_rows = pq.ParquetFile(p, filesystem=arrow_filesystem(fs)).metadata.num_rows
    c["counts_match_manifest.n"] += 1
    mismatches = []
    if "sequences" in shard and shard["sequences"] != n:
        mismatches.append(f"sequences {n} != manifest {shard['sequences']}")
    if "tokens" in shard and shard["tokens"] + shard.get("padding_tokens", 0) != n * seq_len:
        mismatches.append(f"token slots {n * seq_len} != manifest tokens + padding "
                          f"{shard['tokens'] + shard.get('padding_tokens', 0)}")
    if docs_rows is not None and "documents" in shard and shard["documents"] != docs_rows:
        mismatches.append(f"documents {docs_rows} != manifest {shard['documents']}")
    if mismatches:
        bad("counts_match_manifest", 1, "; ".join(mismatches))
    return {"counters": dict(c), "first": first, "sequences": n}


def check_packed(path: str, manifest: dict[str, Any], checks: list[str] | None = None, engine: str = "local",
                 **engine_options: Any) -> list[dict[str, Any]]:
    """Run the packed checks over every shard (local pool or Spark executors); one result per check."""
    base = path.rstrip("/")
    meta = {"seq_len": manifest["seq_len"], "vocab_size": manifest["tokenizer"]["vocab_size"]}
    tasks = [(base, s, meta) for s in manifest["shards"]]
    if engine == "spark":
        from datakit.engines.spark_session import get_session, translate_errors

        spark = get_session(engine_options.get("master"), engine_options.get("conf") or {})
        with translate_errors("checking packed shards"):
            outs = spark.sparkContext.parallelize(tasks, max(1, len(tasks))).map(check_shard).collect()
    else:
        workers = int(engine_options.get("workers") or 1)
        if workers > 1 and len(tasks) > 1:
            from datakit.workers import pool, stopped_on_interrupt

            with stopped_on_interrupt(workers):
                outs = list(pool(workers).map(check_shard, tasks))
        else:
            outs = [check_shard(t) for t in tasks]
    total: Counter = Counter()
    first: dict[str, str] = {}
    for o in outs:  # shard order: the first failure named is the lowest shard's
        total.update(o["counters"])
        for k, v in o["first"].items():
            first.setdefault(k, v)
    seqs = sum(o["sequences"] for o in outs)
    results = []
    for name in checks or CHECKS:
        if name not in CHECKS:
            raise ValueError(f"unknown packed check {name!r}; known: {CHECKS}")
        n, nbad = total.get(f"{name}.n", 0), total.get(f"{name}.bad", 0)
        if name == "counts_match_manifest" and "totals" in manifest:
            t = manifest["totals"]
            if t.get("sequences") is not None and t["sequences"] != seqs:
                nbad += 1
                first.setdefault(name, f"totals: sequences {seqs} != manifest {t['sequences']}")
            if sum(s.get("rows", 0) for s in manifest["shards"]) != manifest.get("rows", 0):
                nbad += 1
                first.setdefault(name, "shard rows do not add up to the manifest's rows")
        r = {"type": f"packed.{name}", "severity": "error", "success": nbad == 0, "rows": n, "unexpected": nbad}
        if nbad:
            r["sample"] = first.get(name, "")
        results.append(r)
    return results
