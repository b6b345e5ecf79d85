"""Tokenize + pack + write throughput vs bare `tokenizers`, packing quality, loader read speed.

    .venv/bin/python benchmarks/tokenize_bench.py [--mb 8] [--threads 1 2] [--tokenizer PATH] [--cli-only]
                                                [--no-datatrove]

Printed side by side (never asserted; see README targets):

0. the CLI path: `datakit run` of a tokenize-only pipeline (CLI defaults: workers, threads)
   vs a bare `encode_batch_fast` process on the same Parquet files, both whole fresh
   processes with the same thread setting, in tokens per CPU-second of the process tree
   (`benchmarks/results/tokenize_bench.json` for run_all.py); and (unless --no-datatrove) vs
   datatrove's DocumentTokenizer on the same texts as JSON Lines, in datatrove's own venv
   (benchmarks/_datatrove.py), same processes and threads, token counts compared (see
   `cli_vs_bare`), by CPU seconds and wall time. Sections 1-3 follow.

1. throughput: tokens/s of datakit's end-to-end `build_dataset` (encode every
   record, shard, pack best_fit, write .npy + Parquet, checksums, manifest) vs
   the bare `tokenizers` reference on the same texts, same batch size, same
   thread count (RAYON_NUM_THREADS; each setting runs in a fresh process because
   the Rust thread pool is sized once). Ratio = ours / reference (target >= 0.8
   vs `encode_batch`). Also the full engine path, `Pipeline.run(engine="local",
   workers=threads)` from Parquet files (timed including engine start-up,
   spills and accounting).
2. packing: fill rate (real tokens / slots) and truncation rate (documents
   <= seq_len that were split) of `concat` and `best_fit` at seq_len 2048 and
   8192, on real code (the CPython standard library, one file = one document).
3. loader: random-access read speed from the page cache — `ds[i]` (a full
   training sample), `raw` views copied, and `get_batch` of 64 — in GB/s of
   stored token + mask bytes.
"""
from __future__ import annotations

import sys

# This file is named like the stdlib `tokenize` module; running it as a script puts
# benchmarks/ first on sys.path, which would shadow the stdlib module for `inspect`.
if sys.path and sys.path[0] == __import__("os").path.dirname(__import__("os").path.abspath(__file__)):
    sys.path.pop(0)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "data" / "tokenizer" / "tokenizer.json"

# runs in datatrove's venv (`-c`: its forkserver workers re-import no main module): argv = JSONL dir, work dir,
# tokenizer, tasks, workers, batch; prints the tokens and documents its DocumentTokenizer wrote
DATATROVE_TOKENIZE_JOB = """
import glob, json, os, sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer
src, work, tok, tasks, workers, batch = sys.argv[1:7]
LocalPipelineExecutor(pipeline=[
    JsonlReader(src, glob_pattern="in-*.jsonl"),
    DocumentTokenizer(output_folder=f"{work}/out", local_working_dir=f"{work}/tmp", tokenizer_name_or_path=tok,
                      eos_token="<|endoftext|>", batch_size=int(batch), seed=0)],
    tasks=int(tasks), workers=int(workers), logging_dir=f"{work}/logs", skip_completed=False).run()
tokens = sum(int(open(f).read().splitlines()[1]) for f in glob.glob(f"{work}/out/*.metadata"))
docs = sum(os.path.getsize(f) // 8 for f in glob.glob(f"{work}/out/*.index"))
print(json.dumps({"tokens": tokens, "docs": docs}))
"""


def corpus(mb: float, doc_chars: int = 0) -> list[str]:
    """Real code: stdlib .py files (sorted, repeated if needed) up to `mb` megabytes of text.

    doc_chars > 0 cuts files into editor-log-sized documents of 1..doc_chars
    characters (seeded), which stresses per-document overhead.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    texts, size, k = [], 0, 0
    limit = int(mb * 1e6)
    while size < limit:
        t = files[k % len(files)].read_text(encoding="utf-8", errors="replace")
        k += 1
        if t:
            texts.append(t)
            size += len(t)
    if doc_chars > 0:
        import random

        rnd, cut = random.Random(0), []
        for t in texts:
            i = 0
            while i < len(t):
                n = rnd.randint(1, doc_chars)
                cut.append(t[i:i + n])
                i += n
        texts = cut
    return texts


def records(texts: list[str]):
    import pyarrow as pa

    from datakit.contracts import TRAINING_RECORD_V1

    return pa.Table.from_pylist(
        [{"doc_id": f"d{i:07d}", "kind": "code", "segments": [{"text": t, "train": True, "role": None}]}
         for i, t in enumerate(texts)], schema=TRAINING_RECORD_V1)


def child_throughput(mb: float, batch: int, tokenizer: str, doc_chars: int, reps: int) -> dict:
    """Runs inside a process whose RAYON_NUM_THREADS is already set."""
    from tokenizers import Tokenizer

    from datakit.stages.tokenize.direct import build_dataset
    from datakit.stages.tokenize.stage import TokenizeConfig

    texts = corpus(mb, doc_chars)
    table = records(texts)
    ref = Tokenizer.from_file(tokenizer)
    out: dict = {"docs": len(texts), "chars": sum(map(len, texts))}
    ref.encode_batch(texts[:64], add_special_tokens=False)  # warm the thread pool
    cfg = TokenizeConfig(tokenizer=tokenizer, seq_len=2048, packing="best_fit")
    # interleaved repeats, best time per method: the machine is shared, so a
    # single pass would compare one method's quiet second with another's busy one
    for rep in range(reps):
        for name in ("encode_batch", "encode_batch_fast"):
            fn = getattr(ref, name)
            t0 = time.perf_counter()
            n = 0
            for i in range(0, len(texts), batch):
                n += sum(len(e.ids) for e in fn(texts[i:i + batch], add_special_tokens=False))
            dt = time.perf_counter() - t0
            if name not in out or dt < out[name]["seconds"]:
                out[name] = {"seconds": dt, "tokens": n}
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            m = build_dataset(table, f"{d}/out", cfg, shards=4, batch_rows=batch)
            dt = time.perf_counter() - t0
        if "datakit" not in out or dt < out["datakit"]["seconds"]:
            out["datakit"] = {"seconds": dt, "tokens": m["totals"]["tokens"], "fill": m["totals"]["fill_rate"]}
    return out


def child_pipeline(mb: float, tokenizer: str, doc_chars: int, workers: int) -> dict:
    """The same work through `Pipeline.run(engine="local")` (Parquet in, packed out, accounting)."""
    import pyarrow.parquet as pq

    from datakit import Pipeline

    texts = corpus(mb, doc_chars)
    with tempfile.TemporaryDirectory() as d:
        table = records(texts)
        n = 4
        for k in range(n):  # several input files, as a real run has
            pq.write_table(table.slice(k * table.num_rows // n, (k + 1) * table.num_rows // n - k * table.num_rows // n),
                           f"{d}/in-{k}.parquet")
        p = (Pipeline(name="bench", seed=0).input(f"{d}/in-*.parquet", format="parquet", schema="training_record.v1")
             .add({"kind": "tokenize", "tokenizer": tokenizer, "seq_len": 2048, "packing": "best_fit"})
             .output(f"{d}/out", format="packed", shards=4))
        t0 = time.perf_counter()
        p.run(engine="local", workers=workers)
        dt = time.perf_counter() - t0
        m = json.loads(Path(f"{d}/out/manifest.json").read_text())
    return {"pipeline": {"seconds": dt, "tokens": m["totals"]["tokens"]}}


def child_bare(folder: str, tokenizer: str, batch: int) -> dict:
    """The reference process: read the same Parquet files, `encode_batch_fast` every text, count tokens."""
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    texts = [seg["text"] for f in sorted(Path(folder).glob("in-*.parquet"))
             for segs in pq.read_table(f, columns=["segments"]).column("segments").to_pylist() for seg in segs]
    tok = Tokenizer.from_file(tokenizer)
    n = 0
    for i in range(0, len(texts), batch):
        n += sum(len(e.ids) for e in tok.encode_batch_fast(texts[i:i + batch], add_special_tokens=False))
    return {"tokens": n, "docs": len(texts)}


def cli_vs_bare(mb: float, doc_chars: int, tokenizer: str, batch: int, runs: int, datatrove: bool = False,
                strict_only: bool = False) -> dict:
    """`datakit run` (tokenize stage, CLI defaults) vs a bare `encode_batch_fast` process, same input files;
    with `datatrove`, also datatrove's DocumentTokenizer under LocalPipelineExecutor.

    Like for like: both are whole fresh processes (interpreter start, imports, reading the same
    Parquet files), both with the same thread setting (RAYON_NUM_THREADS as inherited: unset =
    the library default, all cores, which is what `datakit run` gets too), one untimed warm-up
    each, then `runs` alternated timed runs, median kept. Measured as CPU seconds of the whole
    process tree (getrusage of children: pool workers included), so the number means something on
    a shared machine where wall-clock time does not; wall seconds are reported beside. Every side is
    measured by `_proc.run_measured` (waited children plus the sampled /proc tree: datatrove's pool
    workers hang off a forkserver that getrusage alone would not count).

    Allocator: the `datakit` command (restarted with it, datakit/launch.py) and its pool workers run
    with mimalloc interposed (datakit/allocator.py), which alone takes 20-25% off the tokenizer's
    CPU; a tokenize-only run on a small input (`scheduler.NATIVE_SMALL_INPUT_BYTES`) runs in the
    command's own process, a larger one on the pool. "bare" is the reference as users run it (the
    interpreter's malloc); "bare_alloc" is the same bare process started as the workers are
    (`workers.start_env()`: the allocator and its options, BLAS threads; only where the allocator
    is interposed), the strict like for like
    of everything else ours does. Each run of ours starts from an empty output folder (a rerun
    would reuse the finished shards and skip packing and writing).

    datatrove like for like: the same texts as JSON Lines (`text` field; one file per Parquet file),
    the same tokenizer.json by local path, EOS `<|endoftext|>` after every document (as ours appends;
    no BOS on either side: the tokenizer has no post-processor), the same number of processes as
    `datakit run` used (its `_run.json`, read after its warm-up), one task per input file, and each
    process with the same share of the cores as tokenizer threads (inherited, else cores //
    processes). Its
    defaults otherwise: documents shuffled within each output file (ours packs best_fit, which
    also reorders), uint16 token files with a document index. Its batch size = --batch.

    `strict_only`: only ours and the strict reference (bare_alloc where the allocator is interposed,
    else bare), for the larger steady-state run (`--steady-mb`), whose runs take ~30 s each.
    """
    import statistics

    from benchmarks._proc import run_measured

    import pyarrow.parquet as pq

    from importlib import metadata

    texts = corpus(mb, doc_chars)
    table = records(texts)
    from datakit.workers import start_env, usable_cpus, worker_threads

    # `datakit run`'s default pool (one worker per usable core): its allocator and BLAS threads
    worker_start = start_env(worker_threads(usable_cpus()))
    interposed = "LD_PRELOAD" in worker_start  # the workers run with mimalloc
    sides = ("ours", "bare") + (("bare_alloc",) if interposed else ()) + (("datatrove",) if datatrove else ())
    if strict_only:
        sides = ("ours", "bare_alloc" if interposed else "bare")
    res: dict = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as d:
        n = 4
        for k in range(n):
            a, b = k * table.num_rows // n, (k + 1) * table.num_rows // n
            pq.write_table(table.slice(a, b - a), f"{d}/in-{k}.parquet")
            if datatrove:
                Path(f"{d}/jsonl").mkdir(exist_ok=True)
                with open(f"{d}/jsonl/in-{k}.jsonl", "w") as fh:
                    for i in range(a, b):
                        fh.write(json.dumps({"id": f"d{i:07d}", "text": texts[i]}) + "\n")
        Path(f"{d}/p.yaml").write_text(
            "name: tokbench\nseed: 0\ninput: {path: 'in-*.parquet', format: parquet, schema: training_record.v1}\n"
            f"stages: [{{kind: tokenize, tokenizer: '{tokenizer}', seq_len: 2048, packing: best_fit}}]\n"
            "output: {path: out, format: packed, shards: 4}\n")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        # the `datakit` command as installed beside this interpreter (what users type), else `-m datakit.cli`;
        # --no-report: the HTML report is a view written after the run, not part of the stage
        exe = Path(sys.executable).with_name("datakit")
        cli = [str(exe)] if exe.exists() else [sys.executable, "-m", "datakit.cli"]
        cmds = {"ours": [*cli, "run", f"{d}/p.yaml", "--quiet", "--no-report"],
                "bare": [sys.executable, __file__, "--child-bare", d, "--tokenizer", tokenizer, "--batch", str(batch)]}
        envs = {"ours": env, "bare": env}
        if interposed:
            cmds["bare_alloc"], envs["bare_alloc"] = cmds["bare"], {**env, **worker_start}
        layout: dict = {}

        def like_ours() -> None:
            """datatrove's command, with as many processes as `datakit run` used (read from its `_run.json`
            after ours' warm-up: a pool's workers, else 1, the command's own) and each process's share of
            the cores as its tokenizer threads (RAYON_NUM_THREADS as inherited, else cores // processes)."""
            from benchmarks._datatrove import datatrove_python
            from datakit.workers import usable_cpus

            workers = layout["processes"]
            threads = os.environ.get("RAYON_NUM_THREADS") or str(max(1, usable_cpus() // workers))
            cmds["datatrove"] = [str(datatrove_python()), "-c", DATATROVE_TOKENIZE_JOB, f"{d}/jsonl", f"{d}/dt",
                                 tokenizer, str(n), str(workers), str(batch)]
            envs["datatrove"] = {**os.environ, "RAYON_NUM_THREADS": threads}
            layout["datatrove"] = {"workers": workers, "tasks": n, "RAYON_NUM_THREADS": threads}

        def one(side: str) -> dict:
            import shutil

            shutil.rmtree(f"{d}/dt", ignore_errors=True)
            shutil.rmtree(f"{d}/out", ignore_errors=True)  # a rerun would reuse the shards: no packing, no writing
            out, m = run_measured(cmds[side], env=envs[side], cwd=d)
            if out.returncode:
                raise SystemExit(f"{side} failed: {out.stderr[-3000:]}")
            if side == "ours":
                tokens = int(json.loads(Path(f"{d}/out/manifest.json").read_text())["totals"]["tokens"])
                docs = len(texts)
                pool = json.loads(Path(f"{d}/out/_run.json").read_text())["timing"].get("workers")
                layout["processes"] = pool["processes"] if pool else 1
                layout["ours"] = (f"{pool['processes']} pool workers beside the command's process" if pool
                                  else "in the command's own process")
            else:
                last = json.loads(out.stdout.strip().splitlines()[-1])
                tokens, docs = last["tokens"], last["docs"]
            return {"cpu": m["cpu_seconds"], "wall": m["wall_seconds"], "tokens": tokens, "docs": docs}

        for side in sides:  # warm-up: page cache, numba/jit caches
            if side == "datatrove":
                like_ours()  # after ours' warm-up, which says how many processes `datakit run` used
            one(side)
        for _ in range(runs):
            for side in sides:
                res[side].append(one(side))
    out = {side: {"cpu_seconds": statistics.median(x["cpu"] for x in rs),
                  "wall_seconds": statistics.median(x["wall"] for x in rs), "tokens": rs[0]["tokens"],
                  "docs": rs[0]["docs"]}
           for side, rs in res.items()}
    out["docs"] = len(texts)
    out["chars"] = sum(map(len, texts))
    out["threads"] = os.environ.get("RAYON_NUM_THREADS", f"default ({os.cpu_count()} cores)")
    out["worker_allocator"] = (f"mimalloc {metadata.version('cmeel-mimalloc')} (LD_PRELOAD)" if interposed
                               else "the interpreter's malloc")
    out["worker_start_env"] = {k: v for k, v in worker_start.items() if k != "LD_PRELOAD"}
    out["ours_layout"] = layout["ours"]
    if datatrove:
        out["datatrove_setup"] = layout["datatrove"]
    return out


def packing_quality(texts: list[str], tokenizer: str) -> list[dict]:
    import numpy as np

    from datakit.stages.tokenize.packing import materialize, pack
    from datakit.stages.tokenize.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer)
    lengths = np.array([len(ids) + 1 for ids in tok.encode_batch(texts)], dtype=np.int64)  # + EOS
    starts = np.concatenate([[0], np.cumsum(lengths)])
    vals = np.zeros(int(starts[-1]), dtype=np.int64)
    rows = []
    for seq_len in (2048, 8192):
        for alg in ("concat", "best_fit"):
            t0 = time.perf_counter()
            p = materialize(pack(lengths, seq_len, alg), starts, vals, vals.astype(np.uint8), seq_len, 0, np.uint16)
            s = p.stats
            short = int((lengths <= seq_len).sum())
            rows.append({"seq_len": seq_len, "algorithm": alg, "fill": s["tokens"] / (s["sequences"] * seq_len),
                         "truncation": s["split_documents"] / max(1, short), "sequences": s["sequences"],
                         "docs": len(lengths), "docs_le_seq_len": short, "seconds": time.perf_counter() - t0})
    return rows


def loader_speed(texts: list[str], tokenizer: str, seconds: float = 2.0) -> list[dict]:
    import numpy as np

    from datakit.loader import PackedDataset
    from datakit.stages.tokenize.direct import build_dataset
    from datakit.stages.tokenize.stage import TokenizeConfig

    out = []
    with tempfile.TemporaryDirectory() as d:
        for seq_len in (2048, 8192):
            build_dataset(records(texts), f"{d}/{seq_len}", TokenizeConfig(tokenizer=tokenizer, seq_len=seq_len),
                          shards=4)
            ds = PackedDataset(f"{d}/{seq_len}")
            per_seq = seq_len * (ds.dtype.itemsize + 1)  # token + mask bytes
            for i in range(len(ds)):  # warm the page cache
                ds.raw(i)[0].sum()
            rng = np.random.default_rng(0)
            for mode in ("ds[i]", "raw copy", "get_batch(64)", "get_batch(64,raw)"):
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < seconds:
                    if mode == "ds[i]":
                        for i in rng.integers(0, len(ds), 256):
                            ds[int(i)]
                        n += 256
                    elif mode == "raw copy":
                        for i in rng.integers(0, len(ds), 256):
                            t, m, _ = ds.raw(int(i))
                            np.array(t), np.array(m)
                        n += 256
                    else:
                        ds.get_batch(rng.integers(0, len(ds), 64), raw=mode.endswith("raw)"))
                        n += 64
                dt = time.perf_counter() - t0
                # bytes handed to the trainer: raw = stored dtypes; full = int64 ids/labels/positions + mask
                out_bytes = per_seq if ("raw" in mode) else seq_len * (8 * 3 + 1)
                out.append({"seq_len": seq_len, "mode": mode, "sequences": len(ds), "seq_per_s": n / dt,
                            "GB_s": n * per_seq / dt / 1e9, "out_GB_s": n * out_bytes / dt / 1e9})
    return out


def bare_row(a: argparse.Namespace, r: dict, label: str, side: str, title: str, reference: str, allocators: str,
             mb: float | None = None, runs: int | None = None, note: str = "") -> dict:
    """One `datakit run` vs bare `encode_batch_fast` row (tokens per CPU-second of the process trees)."""
    from benchmarks import _report

    ours, bare = r["ours"], r[side]
    text_tokens = ours["tokens"] - r["docs"]  # ours appends one EOS per document, which bare does not make
    if text_tokens != bare["tokens"]:
        raise SystemExit(f"not the same work ({label}): ours encoded {text_tokens} tokens of text, bare {bare['tokens']}")
    pool = "pool" in r["ours_layout"]
    return _report.comparison(
        f"tokenize stage via `datakit run` vs bare encode_batch_fast{title} ({label})",
        text_tokens / ours["cpu_seconds"], bare["tokens"] / bare["cpu_seconds"], "tokens/CPU-s", reference,
        f"same Parquet input, the same {bare['tokens']} tokens of text on both sides (checked; ours also appends "
        f"{r['docs']} EOS, not counted); {allocators}",
        f"{mb or a.mb} MB, {r['docs']} docs, whole fresh processes, same threads ({r['threads']}; ours "
        f"{r['ours_layout']}" + (", each with its share of the cores as tokenizer threads" if pool else "")
        + ", bare one process), CPU time of the process tree, "
        f"median of {runs or a.runs}{note}")


def steady_state_row(a: argparse.Namespace, by_size: dict[float, dict]) -> dict:
    """The whole-files comparison at `--steady-mb`, and ours' extra CPU split into fixed and per-token parts.

    Why: ours starts the `datakit` command (interpreter, restart with the workers' allocator, CLI
    imports, plan, commit) and any pool workers, bare only its script. That start-up is paid once
    per run, whatever the input size, so
    the ratio at one small size mixes it with the per-token cost a long run pays. Two sizes,
    same machine, same sitting: ours - reference = fixed + k * reference, solved for fixed (CPU-s)
    and k (extra CPU per CPU-s of the reference's work).
    """
    r = cli_vs_bare(a.steady_mb, 0, a.tokenizer, a.batch, a.steady_runs, strict_only=True)
    side = "bare_alloc" if "bare_alloc" in r else "bare"
    ours, ref = r["ours"]["cpu_seconds"], r[side]["cpu_seconds"]
    print(f"{'whole files':>18}, {a.steady_mb} MB: datakit run {ours:.2f} CPU s | {side} {ref:.2f} CPU s "
          f"(median of {a.steady_runs})")
    note = ""
    small = by_size.get(a.mb)
    if small is not None and side in small and small.get("ours_layout") != r.get("ours_layout"):
        print(f"{'':>18}  no per-run/per-token split: ours ran {small.get('ours_layout')} at {a.mb} MB and "
              f"{r.get('ours_layout')} at {a.steady_mb} MB")
        note = f"; ours ran {r.get('ours_layout')} here, {small.get('ours_layout')} at {a.mb} MB"
    elif small is not None and side in small:
        o1, r1 = small["ours"]["cpu_seconds"], small[side]["cpu_seconds"]
        k = ((ours - ref) - (o1 - r1)) / (ref - r1) if ref != r1 else float("nan")
        fixed = (o1 - r1) - k * r1
        print(f"{'':>18}  ours' extra CPU = {fixed:.2f} s per run (start-up) + {100 * k:.1f}% of the reference's "
              f"(two-point fit: {a.mb} MB and {a.steady_mb} MB)")
        note = (f"; ours' extra CPU over both sizes ({a.mb} and {a.steady_mb} MB, this sitting): {fixed:.2f} s "
                f"per run + {100 * k:.1f}% per token")
    allocators = (f"both with {r['worker_allocator']} and " + " ".join(f"{k}={v}" for k, v in r["worker_start_env"].items())
                  if side == "bare_alloc" else f"ours ({r['ours_layout']}) with {r['worker_allocator']}")
    return bare_row(a, r, f"whole files, {a.steady_mb:g} MB", side, " with the same allocator" if side == "bare_alloc" else "",
                    "tokenizers encode_batch_fast, whole process" + (" started like datakit's workers"
                                                                     if side == "bare_alloc" else ""),
                    allocators, mb=a.steady_mb, runs=a.steady_runs, note=note)


def datatrove_rows(a: argparse.Namespace, r: dict, label: str, load0: tuple[float, ...]) -> list[dict]:
    """Print and return the `datakit run` vs datatrove DocumentTokenizer rows (CPU and wall) of one corpus."""
    from benchmarks import _report
    from benchmarks._datatrove import DATATROVE

    ours, dt, setup = r["ours"], r["datatrove"], r["datatrove_setup"]
    load = f"{load0[0]:.1f}-{os.getloadavg()[0]:.1f}"
    same = (f"same texts (Parquet for ours, JSON Lines for datatrove), same tokenizer.json, EOS after every document "
            f"on both sides, no BOS: ours {ours['tokens']} tokens ({ours['docs']} docs), datatrove {dt['tokens']} "
            f"tokens ({dt['docs']} docs)" + ("" if ours["tokens"] == dt["tokens"] else
                                            f", DIFFERENT by {ours['tokens'] - dt['tokens']}")
            + "; ours packs best_fit into 2048-token rows + writes Parquet/.npy, datatrove shuffles documents "
            f"within each token file; ours ({r['ours_layout']}) with {r['worker_allocator']}, datatrove's with the "
            "interpreter's malloc")
    cond = (f"{a.mb} MB, {r['docs']} docs, whole fresh processes, {setup['workers']} "
            f"process{'es' if setup['workers'] > 1 else ''} each (datatrove "
            f"LocalPipelineExecutor workers={setup['workers']}, tasks={setup['tasks']} = input files), "
            f"RAYON_NUM_THREADS={setup['RAYON_NUM_THREADS']} per process on both sides, median of {a.runs} "
            f"alternated runs after 1 warm-up")
    print(f"{label:>18}: datakit run {ours['cpu_seconds']:.2f} CPU s (wall {ours['wall_seconds']:.1f}s) | datatrove "
          f"DocumentTokenizer {dt['cpu_seconds']:.2f} CPU s ({dt['tokens']} tokens, {dt['docs']} docs, wall "
          f"{dt['wall_seconds']:.1f}s) | load average {load}")
    name = f"tokenize stage via `datakit run` vs datatrove DocumentTokenizer ({label}"
    return [_report.comparison(f"{name}, CPU)", ours["tokens"] / ours["cpu_seconds"], dt["tokens"] / dt["cpu_seconds"],
                               "tokens/CPU-s", f"{DATATROVE} DocumentTokenizer, whole process", same,
                               f"{cond}, CPU time of the process tree"),
            _report.comparison(f"{name}, wall)", ours["tokens"] / ours["wall_seconds"],
                               dt["tokens"] / dt["wall_seconds"], "tokens/s", f"{DATATROVE} DocumentTokenizer, "
                               "whole process", same, f"{cond}, wall time; load average {load}")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=8.0, help="MB of code text for the throughput run")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=1024, help="documents per encode batch (both sides)")
    ap.add_argument("--tokenizer", default=str(TOKENIZER))
    ap.add_argument("--pack-mb", type=float, default=34.0, help="MB of code for the packing-quality run")
    ap.add_argument("--doc-chars", type=int, nargs="+", default=[0, 2000],
                    help="throughput corpora: 0 = whole files, N = documents of 1..N chars")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repeats; the best time of each counts")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per side of the CLI comparison (median)")
    ap.add_argument("--cli-only", action="store_true", help="only the `datakit run` vs bare comparison")
    ap.add_argument("--steady-mb", type=float, default=0.0,
                    help="also run the whole-files comparison at this size (ours vs the strict reference only) and "
                         "split ours' extra CPU into a fixed start-up part and a per-token part (two-point fit)")
    ap.add_argument("--steady-runs", type=int, default=2, help="timed runs per side of the --steady-mb run")
    ap.add_argument("--datatrove", action=argparse.BooleanOptionalAction, default=True,
                    help="also compare with datatrove's DocumentTokenizer (its own venv, created on first use)")
    ap.add_argument("--child-bare", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-pipeline", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child_pipeline:
        print(json.dumps(child_pipeline(a.mb, a.tokenizer, a.doc_chars[0], a.child_pipeline)))
        return
    if a.child:
        print(json.dumps(child_throughput(a.mb, a.batch, a.tokenizer, a.doc_chars[0], a.reps)))
        return
    if a.child_bare:
        print(json.dumps(child_bare(a.child_bare, a.tokenizer, a.batch)))
        return

    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # `benchmarks` as a package (this folder itself is off the path, see above)
    from benchmarks import _report

    load = os.getloadavg()
    print(f"== tokenize through the CLI vs bare encode_batch_fast: {a.mb} MB of stdlib code, whole processes, "
          f"CPU seconds (median of {a.runs} alternated runs after one warm-up each)")
    rows = []
    by_size: dict[float, dict] = {}  # whole-files results by MB, for the --steady-mb fit
    for dc in a.doc_chars:
        r = cli_vs_bare(a.mb, dc, a.tokenizer, a.batch, a.runs, a.datatrove)
        if dc == 0:
            by_size[a.mb] = r
        label = "whole files" if dc == 0 else f"docs <= {dc} chars"
        ours, bare = r["ours"], r["bare"]
        print(f"{label:>18}: datakit run {ours['cpu_seconds']:.2f} CPU s ({ours['tokens']} tokens incl. EOS, "
              f"wall {ours['wall_seconds']:.1f}s) | bare {bare['cpu_seconds']:.2f} CPU s ({bare['tokens']} tokens, "
              f"wall {bare['wall_seconds']:.1f}s) | threads {r['threads']}")
        rows.append(bare_row(a, r, label, "bare", "", "tokenizers encode_batch_fast, whole process",
                             f"ours ({r['ours_layout']}) with {r['worker_allocator']}, bare with the interpreter's malloc"))
        if "bare_alloc" in r:
            ba = r["bare_alloc"]
            print(f"{label:>18}: bare with the workers' allocator {ba['cpu_seconds']:.2f} CPU s "
                  f"(wall {ba['wall_seconds']:.1f}s)")
            rows.append(bare_row(a, r, label, "bare_alloc", " with the same allocator",
                                 "tokenizers encode_batch_fast, whole process started like datakit's workers",
                                 f"both with {r['worker_allocator']} and "
                                 + " ".join(f"{k}={v}" for k, v in r["worker_start_env"].items())))
        if a.datatrove:
            rows += datatrove_rows(a, r, label, load)
    if a.steady_mb:
        rows.append(steady_state_row(a, by_size))
    _report.write("tokenize_bench", rows)
    if a.cli_only:
        return

    print(f"== throughput: {a.mb} MB of stdlib code, batch {a.batch} docs, tokenizer {Path(a.tokenizer).name}")
    print(f"{'docs':>13} {'threads':>7} {'encode_batch':>14} {'encode_batch_fast':>18} {'datakit e2e':>13} "
          f"{'ratio/eb':>9} {'ratio/ebf':>10} {'pipeline':>10} {'ratio/eb':>9}")

    def child(extra: list[str], th: int, dc: int) -> dict:
        env = {**os.environ, "RAYON_NUM_THREADS": str(th), "TOKENIZERS_PARALLELISM": "true"}
        res = subprocess.run([sys.executable, __file__, "--mb", str(a.mb), "--batch", str(a.batch), "--reps", str(a.reps),
                              "--tokenizer", a.tokenizer, "--doc-chars", str(dc), *extra],
                             env=env, capture_output=True, text=True, check=True)
        return json.loads(res.stdout.strip().splitlines()[-1])

    for dc in a.doc_chars:
        for th in a.threads:
            r = child(["--child"], th, dc)
            # the engine path, in its own process (a forked pool must not inherit a used Rust pool);
            # `th` workers, each tokenizing with one thread (RAYON_NUM_THREADS=1): the same cores
            r.update(child(["--child-pipeline", str(th)], 1, dc))
            tps = {k: r[k]["tokens"] / r[k]["seconds"]
                   for k in ("encode_batch", "encode_batch_fast", "datakit", "pipeline")}
            label = "whole files" if dc == 0 else f"<= {dc} chars"
            print(f"{label:>13} {th:>7} {tps['encode_batch'] / 1e6:>11.2f}M/s {tps['encode_batch_fast'] / 1e6:>15.2f}M/s "
                  f"{tps['datakit'] / 1e6:>10.2f}M/s {tps['datakit'] / tps['encode_batch']:>9.2f} "
                  f"{tps['datakit'] / tps['encode_batch_fast']:>10.2f} {tps['pipeline'] / 1e6:>7.2f}M/s "
                  f"{tps['pipeline'] / tps['encode_batch']:>9.2f}")

    texts = corpus(a.pack_mb)
    print(f"\n== packing quality: {len(texts)} real code documents ({a.pack_mb} MB)")
    print(f"{'seq_len':>7} {'algorithm':>9} {'fill':>8} {'truncation':>11} {'sequences':>10} {'docs<=L':>8} {'seconds':>8}")
    for r in packing_quality(texts, a.tokenizer):
        print(f"{r['seq_len']:>7} {r['algorithm']:>9} {100 * r['fill']:>7.2f}% {100 * r['truncation']:>10.2f}% "
              f"{r['sequences']:>10} {r['docs_le_seq_len']:>8} {r['seconds']:>8.2f}")

    print("\n== loader random reads from page cache (GB/s of stored token+mask bytes; out = bytes produced)")
    print(f"{'seq_len':>7} {'mode':>18} {'sequences':>10} {'seq/s':>10} {'GB/s':>7} {'out GB/s':>9}")
    for r in loader_speed(corpus(min(a.mb, 16.0)), a.tokenizer):
        print(f"{r['seq_len']:>7} {r['mode']:>18} {r['sequences']:>10} {r['seq_per_s']:>10.0f} {r['GB_s']:>7.2f} "
              f"{r['out_GB_s']:>9.2f}")


if __name__ == "__main__":
    main()
