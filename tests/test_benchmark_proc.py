"""benchmarks/_proc.py measures a whole process tree: these check it finds every process in it.

Why a test for a benchmark helper: README's like-for-like ratios are only as true as this
measurement. It once read only each process's main-thread `children` file, and a JVM starts
pyspark.daemon (parent of every Spark Python worker) from another thread, so Spark runs were
measured without their Python side (README quoted Spark at 1.22x less CPU; it uses 1.8x more).
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _proc  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux /proc")

# a parent that starts its child from a non-main thread that stays alive (as a JVM starts pyspark.daemon;
# when the starting thread exits, Linux hands its children to the main thread and any reading finds them)
PARENT = """
import subprocess, sys, threading, time
def start():
    subprocess.Popen([sys.executable, "-c", "import time; t = time.process_time()\\nwhile time.process_time() - t < 1.5: pass\\ntime.sleep(30)"])
    time.sleep(30)
threading.Thread(target=start, daemon=True).start()
time.sleep(30)
"""


def test_tree_follows_children_started_by_any_thread_and_counts_their_cpu():
    parent = subprocess.Popen([sys.executable, "-c", PARENT])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            tree = _proc._tree(parent.pid)
            _, cpu, _ = _proc.tree_sample(parent.pid, memory=False)
            if len(tree) == 2 and cpu >= 1.5:
                break
            time.sleep(0.1)
        assert len(tree) == 2, tree  # the parent and the child its second thread started
        assert cpu >= 1.5, cpu  # the child's busy loop is counted while it is alive and not yet reaped
    finally:
        for p in _proc._tree(parent.pid)[::-1]:
            subprocess.run(["kill", "-9", str(p)], check=False)
        parent.wait()


# holds ~100 MB of heap, then ~300 MB of a mapped file's pages (read, so resident), for 1 s each
HEAP_THEN_FILE = """
import mmap, sys, time
heap = bytearray(100 << 20)
time.sleep(1.0)
del heap
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    total = sum(m[i] for i in range(0, len(m), 4096))  # touch every page
    time.sleep(1.0)
"""


def test_private_memory_counts_the_heap_and_not_mapped_files(tmp_path):
    """The anonymous part of the tree's PSS (dedup_vs_datatrove's private-memory row) sees memory a
    process allocates, and not the pages of files it maps, which PSS/RSS count too."""
    big = tmp_path / "mapped.bin"
    big.write_bytes(b"x" * (300 << 20))
    _, m = _proc.run_measured([sys.executable, "-c", HEAP_THEN_FILE, str(big)])
    assert m["tree_peak_anon_mb"] >= 95, m  # the heap
    assert m["tree_peak_mb"] >= 290, m  # the file's pages are in PSS ...
    assert m["tree_peak_anon_mb"] < 200, m  # ... and not in the private part
