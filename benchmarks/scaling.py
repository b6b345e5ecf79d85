"""Scaling of the local engine: wall time, peak memory and per-stage seconds at 1e4, 1e5 (, 1e6) events.

    .venv/bin/python benchmarks/scaling.py 10000 100000 [1000000] [--workers 2] [--ceiling] [--warm-up 2000]
                                           [--results FILE.jsonl] [--work FOLDER]

`make bench` runs it at 10k, 30k and 100k events with the ceiling and a 2k-event warm-up
(benchmarks/run_all.py), and turns its JSON lines into the README's end-to-end rows.

For each size: synthetic logs (`datakit.synth`), then `datakit run pipelines/quickstart.yaml`
as a subprocess, while a sampler sums the resident memory of the run's whole process tree
(parent + pool workers) every 0.2 s -- the peak of that sum is what a machine must hold -- and
keeps each process's own high-water mark (VmHWM), whose maximum is the per-process peak #21 targets.

The tokenize-only ceiling (`--ceiling`): the same input's text, every string value of every
event except identifiers and labels (ids, timestamps, paths, roles), tokenized alone with the
pipeline's tokenizer (`encode_batch_fast`, one thread, CPU seconds of the encode calls only, after
one warm-up batch), in a process started as the pool workers are (`workers.start_env`: mimalloc on
Linux with its options, BLAS threads). Input JSON MB / those seconds is what a pipeline that did
nothing but tokenize could reach; the run's MB per CPU-s over it is the
share of that ceiling the whole pipeline reaches.
Results are printed as JSON lines and feed docs/scaling.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def _hwm_bytes(pid: int) -> int:
    """A process's own peak resident memory (VmHWM); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tree_rss(pid: int, cpu_seen: dict[int, float], hwm: dict[int, int] | None = None) -> int:
    """Resident memory of the process tree; also records each process's latest CPU seconds.

    Why psutil and not RUSAGE_CHILDREN alone: pool workers that are not waited for by the run
    process (killed at exit) never reach its rusage, so their CPU would be missing.
    """
    try:
        p = psutil.Process(pid)
        procs = [p] + p.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for q in procs:
        try:
            with q.oneshot():
                total += q.memory_info().rss
                t = q.cpu_times()
                cpu_seen[q.pid] = t.user + t.system
            if hwm is not None:
                hwm[q.pid] = max(hwm.get(q.pid, 0), _hwm_bytes(q.pid))
        except psutil.NoSuchProcess:
            pass
    return total


def run_once(events: int, workers: int, work: Path) -> dict:
    from datakit.synth.generator import generate

    logs = work / f"logs-{events}"
    t0 = time.perf_counter()
    if not logs.exists():
        generate(logs, events=events, seed=1, days=3, rows_per_part=max(5_000, events // 16))
    gen_s = time.perf_counter() - t0
    out = work / f"out-{events}"
    shutil.rmtree(out, ignore_errors=True)  # a run into a finished output reuses its shards: every run starts empty
    cmd = [sys.executable, "-m", "datakit.cli", "run", str(ROOT / "pipelines" / "quickstart.yaml"),
           "--input", str(logs / "dt=*" / "*.jsonl.zst"), "--output", str(out), "--workers", str(workers), "--json"]
    # the consent stage's opt-out list is the one of the synthetic logs
    pipe = (ROOT / "pipelines" / "quickstart.yaml").read_text().replace("../demo/logs/optouts.parquet",
                                                                        str(logs / "optouts.parquet"))
    pfile = work / "quickstart.yaml"
    pfile.write_text(pipe)
    cmd[4] = str(pfile)
    peak = 0
    cpu_seen: dict[int, float] = {}
    hwm: dict[int, int] = {}
    load0 = os.getloadavg()[0]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _tree_rss(proc.pid, cpu_seen, hwm))
            time.sleep(0.2)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the whole run tree (the pool workers are reaped by the run, so they count):
    # on a shared machine this is the number to compare across sizes, not the wall time
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    stop.set()
    th.join()
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {stderr[-2000:]}")
    stages = json.loads(stdout)["stages"]
    timing = json.loads((out / "_run.json").read_text())["timing"]
    workers_timing = timing.get("workers", {})
    in_bytes = sum(f.stat().st_size for f in logs.glob("dt=*/*.jsonl.zst"))
    return {"events": events, "workers": workers, "input_mb": round(in_bytes / 2**20, 1),
            "generate_s": round(gen_s, 1), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "cpu_s_sampled": round(sum(cpu_seen.values()), 1),
            "load_avg_start_end": [round(load0, 1), round(os.getloadavg()[0], 1)], "peak_rss_mb": round(peak / 2**20),
            "process_peak_rss_mb": round(max(hwm.values(), default=0) / 2**20), "processes": len(hwm),
            "stages": {s["name"]: round(s["seconds"], 2) for s in stages},
            "rows_in": stages[0]["rows_in"], "rows_out_last": stages[-1]["rows_out"],
            "worker_allocators": workers_timing.get("allocators", []),
            # issue 21's cold-start target, as the run itself reports it (_run.json's `timing`): kernels compiled
            # in the command's process and in the pool (summed over its workers), each worker's start-up before
            # any data (the largest), and the seconds of the run no phase names (`parts.other`)
            "cold_start": {"numba_compile_s": timing.get("numba_compile"),
                           "workers_numba_compile_s": workers_timing.get("numba_compile"),
                           "worker_startup_cpu_s": workers_timing.get("startup_cpu_seconds"),
                           "worker_startup_rss_mb": workers_timing.get("startup_rss_mb"),
                           "total_s": timing.get("total"), "unnamed_s": (timing.get("parts") or {}).get("other")}}


# identifiers and labels, not text a model trains on (the ceiling tokenizes only the text)
_NOT_TEXT = {"event_id", "event_type", "timestamp", "user_id", "org_id", "session_id", "client_version", "repo",
             "file", "role", "tool_name", "privacy_mode", "outcome", "latency_ms", "language", "path"}


def _event_strings(obj, out: list[str]) -> None:
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if k not in _NOT_TEXT:
                _event_strings(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _event_strings(v, out)


def tokenize_ceiling(events: int, work: Path, workers: int) -> dict:
    """The ceiling measured in a fresh process started as a pool worker is (`workers.start_env`: the
    allocator and its options, BLAS threads), as their tokenizer runs (like for like: the allocator
    alone moves encode CPU by 20-25%)."""
    from datakit.workers import start_env, worker_threads

    env = {**os.environ, **start_env(worker_threads(workers)), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, "--ceiling-child", str(events), "--work", str(work)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ceiling_here(events: int, work: Path, tokenizer: str = "datakit:demo-bpe") -> dict:
    """Input JSON MB per CPU-second of tokenizing the input's text alone (see the module docstring)."""
    from datakit import allocator

    os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its pool: one thread, like one worker
    import zstandard

    from datakit.stages.tokenize.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer).impl
    texts: list[str] = []
    json_bytes = 0
    for f in sorted((work / f"logs-{events}").glob("dt=*/*.jsonl.zst")):
        with f.open("rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as r:
            data = r.read()
        json_bytes += len(data)
        for line in data.splitlines():
            try:
                _event_strings(json.loads(line), texts)
            except ValueError:  # the synthetic logs' planted malformed lines (quarantined by the run)
                continue
    tok.encode_batch_fast(texts[:1000], add_special_tokens=False)  # warm-up
    cpu = 0.0
    for i in range(0, len(texts), 10_000):
        batch = texts[i:i + 10_000]
        c0 = time.process_time()
        tok.encode_batch_fast(batch, add_special_tokens=False)
        cpu += time.process_time() - c0
    return {"json_mb": round(json_bytes / 1e6, 1), "encode_cpu_s": round(cpu, 2),
            "ceiling_mb_per_cpu_s": round(json_bytes / 1e6 / cpu, 2), "strings": len(texts),
            "allocator": allocator.in_use()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sizes", nargs="*", type=int)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ceiling", action="store_true", help="also measure the tokenize-only ceiling per size")
    ap.add_argument("--work", default=None, help="folder for logs and outputs (default: a temp folder, removed "
                    "at the end)")
    ap.add_argument("--warm-up", type=int, default=0, metavar="EVENTS",
                    help="one untimed run of this many events first (kernels loaded or compiled, files cached), "
                         "so the first measured size pays no more one-time cost than the others")
    ap.add_argument("--results", type=Path, default=None, help="also write the JSON lines to this file (replaced)")
    ap.add_argument("--ceiling-child", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ceiling_child:
        print(json.dumps(_ceiling_here(a.ceiling_child, Path(a.work))))
        return
    work = Path(a.work or tempfile.mkdtemp(prefix="datakit-scaling-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []
    try:
        if a.warm_up:
            run_once(a.warm_up, a.workers, work)
        for n in a.sizes:
            row = run_once(n, a.workers, work)
            if a.ceiling:
                row["tokenize_ceiling"] = tokenize_ceiling(n, work, a.workers)
            rows.append(json.dumps(row))
            print(rows[-1], flush=True)
    finally:
        if a.work is None:  # 100k events leave ~60 MB of logs and ~400 MB of outputs
            shutil.rmtree(work, ignore_errors=True)
    if a.results is not None:
        a.results.parent.mkdir(parents=True, exist_ok=True)
        a.results.write_text("".join(r + "\n" for r in rows))


if __name__ == "__main__":
    main()
