"""One measured run of a benchmark's process: wall, CPU and peak RSS of its whole process tree.

Why a shared helper: a side that starts children (a local process pool; Spark's JVM and its
Python workers) must be measured the same way as one that does not. getrusage(RUSAGE_CHILDREN)
counts only children that were waited for (a JVM the driver leaves to exit on its own is not)
and reports the largest single peak, never the tree's sum. So the tree is also sampled from
/proc (CPU every 20 ms; memory as often as that costs <= 5% of one core): the summed proportional
set sizes (PSS: pages a forked child shares with its parent count once), and the summed CPU
seconds of every live process (with what each has reaped of its own children); a run reports the
larger CPU figure, and callers compare the sampled tree peak with the job's own VmHWM (a peak
between two samples).
Linux only (elsewhere the samples are 0 and getrusage alone counts).
"""
from __future__ import annotations

import functools
import os
import resource
import subprocess
import threading
import time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = resource.getpagesize()


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants. Every thread's `children` file is read: Linux lists a child under the
    thread that started it, and a JVM starts processes from other threads than its main one (Spark's
    pyspark.daemon, parent of every Python worker, hangs off a JVM worker thread), so reading only the
    main thread's file lost the whole Python side of a Spark run."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            threads = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in threads:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                continue
    return out


def _pss_kb(pid: int) -> tuple[int, int]:
    """Proportional set size in KB, and its anonymous part: a page shared by n processes counts 1/n in
    each, so a forked child's copy-on-write pages are not counted twice in the tree's sum (its RSS
    would be). The anonymous part (heap, arenas, stacks: `Pss_Anon`) leaves out the pages of mapped
    library files, which the page cache shares with every process that maps them and whose resident
    count moves with the page cache's state (the same run measured 209-268 MB of them)."""
    pss = anon = None
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
            elif line.startswith("Pss_Anon:"):
                anon = int(line.split()[1])
    if pss is None:
        raise ValueError("no Pss")
    return pss, anon if anon is not None else pss


def tree_sample(pid: int, memory: bool = True) -> tuple[float, float, float]:
    """(memory MB, CPU seconds incl. reaped children, anonymous memory MB) summed over `pid` and its
    descendants now; memory is the proportional set size (resident set where /proc has no smaps_rollup,
    then also as the anonymous figure); 0 when `memory` is False."""
    kb = cpu = anon = 0
    for p in _tree(pid):
        try:
            if memory:
                try:
                    pss, pss_anon = _pss_kb(p)
                    kb, anon = kb + pss, anon + pss_anon
                except (OSError, ValueError):
                    with open(f"/proc/{p}/statm") as f:
                        rss = int(f.read().split()[1]) * _PAGE // 1024
                    kb, anon = kb + rss, anon + rss
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except (OSError, ValueError, IndexError):
            continue
    return kb / 1024, cpu / _TICK, anon / 1024


@functools.cache
def ensure_bytecode() -> None:
    """Compile datakit's sources to `__pycache__` once, before anything is timed.

    Why: an installed wheel has its bytecode (pip compiles at install), and so do the reference
    libraries on the other side of every comparison. A checkout run with PYTHONDONTWRITEBYTECODE
    set (some shells and CI images set it) has none, and every process of our side -- the CLI
    and each pool worker -- then compiles datakit from source on import: measured ~0.4 CPU-s per
    process, charged to our side only. `compileall` writes the files whatever that variable says."""
    import compileall
    from pathlib import Path

    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "datakit"), quiet=1)


def run_measured(cmd: list[str], **kw) -> tuple[subprocess.CompletedProcess, dict[str, float]]:
    """Run `cmd` to completion; its output and {wall_seconds, cpu_seconds, tree_peak_mb, tree_peak_anon_mb}
    of its process tree (both memory peaks sampled, see `tree_sample`)."""
    ensure_bytecode()
    c0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    out: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=n, s=s: out.__setitem__(n, s.read()))
               for n, s in (("out", proc.stdout), ("err", proc.stderr))]
    for th in readers:
        th.start()
    peak = peak_anon = cpu_seen = 0.0
    next_pss = 0.0
    while proc.poll() is None:
        t = time.perf_counter()
        if t >= next_pss:
            rss, cpu, anon = tree_sample(proc.pid)
            peak, peak_anon = max(peak, rss), max(peak_anon, anon)
            # smaps_rollup walks every page of a process: 40 ms for a JVM plus Python workers on 2 cores,
            # so sampling PSS every 20 ms took a fifth of a core from the run it measures (more from the
            # side with bigger processes); PSS is sampled with <= 5% of a core, CPU every 20 ms
            next_pss = time.perf_counter() + 19 * (time.perf_counter() - t)
        else:
            _, cpu, _ = tree_sample(proc.pid, memory=False)
        cpu_seen = max(cpu_seen, cpu)
        time.sleep(0.02)
    for th in readers:
        th.join()
    wall, c1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    waited = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    r = subprocess.CompletedProcess(cmd, proc.returncode, out.get("out", ""), out.get("err", ""))
    return r, {"wall_seconds": wall, "cpu_seconds": max(waited, cpu_seen), "tree_peak_mb": peak,
               "tree_peak_anon_mb": peak_anon}
