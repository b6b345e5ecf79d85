"""Pool workers run with mimalloc interposed (datakit/allocator.py): only the workers, never the
owner's environment, a user's own LD_PRELOAD kept whole, an opt-out, and the same output bytes."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from datakit import Pipeline, allocator, synth, workers
from datakit.io.sinks import output_checksums

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or allocator.mimalloc_library() is None,
                                reason="LD_PRELOAD and the cmeel-mimalloc wheel are Linux-only")
TOKENIZER = str(Path(__file__).resolve().parent / "data" / "tokenizer" / "tokenizer.json")


def _worker_view(_: object) -> dict:
    """What a pool worker sees: its allocator, whether libmimalloc is mapped, its LD_PRELOAD."""
    import os

    from datakit import allocator

    with open("/proc/self/maps") as f:
        mapped = "libmimalloc" in f.read()
    return {"in_use": allocator.in_use(), "mapped": mapped, "LD_PRELOAD": os.environ.get("LD_PRELOAD")}


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv(allocator.ENV_VAR, raising=False)
    yield monkeypatch
    workers.drop_all_pools(wait=True)


def test_workers_start_with_mimalloc_and_the_owner_environment_is_unchanged(clean_env):
    before = dict(os.environ)
    view = workers.pool(2).submit(_worker_view, None).result()
    assert view["mapped"] and view["in_use"].startswith("mimalloc 3.")
    assert view["LD_PRELOAD"] == allocator.mimalloc_library()
    assert dict(os.environ) == before  # set only for the instant a worker starts
    assert allocator.in_use() == "system"  # this process keeps its own malloc


def test_system_allocator_when_asked(clean_env):
    clean_env.setenv(allocator.ENV_VAR, "system")
    view = workers.pool(2).submit(_worker_view, None).result()
    assert view == {"in_use": "system", "mapped": False, "LD_PRELOAD": None}


def test_a_users_ld_preload_is_kept_whole(clean_env, tmp_path):
    """The user chose what to preload (an allocator, a profiler): nothing is added to it."""
    theirs = tmp_path / "libmimalloc.so"  # another name for the same library: reported by its file name
    theirs.symlink_to(allocator.mimalloc_library())
    clean_env.setenv("LD_PRELOAD", str(theirs))
    view = workers.pool(2).submit(_worker_view, None).result()
    assert view == {"in_use": "libmimalloc.so", "mapped": True, "LD_PRELOAD": str(theirs)}


def test_an_unknown_allocator_is_a_clear_error(clean_env):
    clean_env.setenv(allocator.ENV_VAR, "jemalloc")
    with pytest.raises(allocator.AllocatorError, match="DATAKIT_ALLOCATOR='jemalloc': expected one of mimalloc, system"):
        workers.pool(2)


def _free_memory_probe(_: object) -> list[float]:
    """RSS of a worker: before, holding ~240 MB of malloc'd blocks, after freeing them, after the trim."""
    from datakit.engines.local.memory import release_free_memory
    from datakit.run_timing import rss_mb

    r0 = rss_mb()
    blocks = [bytes(4000) + bytes([i % 256]) for i in range(60000)]  # > pymalloc's 512 B: malloc's
    r1 = rss_mb()
    del blocks
    r2 = rss_mb()
    release_free_memory()
    return [r0, r1, r2, rss_mb()]


def test_release_free_memory_hands_mimallocs_free_pages_back(clean_env):
    """mimalloc keeps freed pages (glibc's malloc_trim cannot see them): the engine's trim must
    reach them too, or a worker's RSS keeps its largest batch between tasks."""
    r0, r1, r2, r3 = workers.pool(2).submit(_free_memory_probe, None).result()
    assert r1 - r0 > 200
    assert r2 - r0 > 200  # freed, still resident
    assert r3 - r0 < 50


def test_output_is_byte_identical_with_either_allocator(clean_env, tmp_path):
    synth.generate(str(tmp_path / "logs"), events=1200, seed=3)
    sums, report = {}, {}
    for name in ("mimalloc", "system"):
        clean_env.setenv(allocator.ENV_VAR, name)
        out = tmp_path / name
        (Pipeline("alloc", seed=0).input(str(tmp_path / "logs" / "dt=*" / "*.jsonl.zst"))
         .add({"kind": "ingest"}).add({"kind": "extract", "kinds": ["code", "fim", "sft"]})
         .add({"kind": "dedup"})
         .add({"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 256, "fim_rate": 0.5})
         .output(str(out), format="packed", shards=2)).run(engine="local", workers=2)
        sums[name] = output_checksums(str(out))
        report[name] = json.loads((out / "_run.json").read_text())["timing"]["workers"]["allocators"]
    assert sums["mimalloc"] == sums["system"] and sums["system"]
    assert report["mimalloc"][0].startswith("mimalloc 3.") and len(report["mimalloc"]) == 1
    assert report["system"] == ["system"]
