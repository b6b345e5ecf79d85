"""Compiled hyperscan databases kept on disk (`scrub_pii/hs_cache.py`): a later process loads instead of
compiling, with the same findings; a damaged or unwritable cache only costs the compile it saves."""
from __future__ import annotations

import pytest

hyperscan = pytest.importorskip("hyperscan")

from datakit.stages.scrub_pii import hs_cache, scan  # noqa: E402
from datakit.stages.scrub_pii.scan import scan_batch  # noqa: E402

TEXTS = [
    'password = "Tr0ub4dor&3xyz"\nip = "10.20.30.40"',
    "contact jane.doe@example.org or +44 20 7946 0958",
    'token = "ghp_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij2K" in héllo wörld',
    None,
    "nothing to see here",
]


class _NoCompile:
    """Stands in for `hyperscan.Database` where a test proves nothing is compiled."""

    def __init__(self, *a, **k) -> None:
        pass

    def compile(self, *a, **k):
        raise AssertionError("compiled although the database was cached")


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache folder, and no database compiled in this process yet (as in a new process)."""
    monkeypatch.setenv("DATAKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(scan, "_HS_DATABASES", {})
    return tmp_path / "cache" / "hyperscan"


def test_a_later_process_loads_the_databases_and_finds_the_same(fresh, monkeypatch):
    expected = scan_batch(TEXTS, strategy="python")
    assert scan_batch(TEXTS, strategy="hyperscan") == expected
    files = sorted(fresh.glob("*.db"))
    assert files, "the compiled databases were not stored"
    monkeypatch.setattr(scan, "_HS_DATABASES", {})  # the next process
    monkeypatch.setattr(hyperscan, "Database", _NoCompile)
    assert scan_batch(TEXTS, strategy="hyperscan") == expected
    assert sorted(fresh.glob("*.db")) == files


def test_a_damaged_file_is_compiled_again_and_replaced(fresh, monkeypatch):
    expected = scan_batch(TEXTS, strategy="python")
    scan_batch(TEXTS, strategy="hyperscan")
    for f in fresh.glob("*.db"):
        data = bytearray(f.read_bytes())
        data[-100] ^= 0xFF  # a flipped bit in the database body
        f.write_bytes(bytes(data))
        assert hs_cache.load(f.stem) is None
    monkeypatch.setattr(scan, "_HS_DATABASES", {})
    assert scan_batch(TEXTS, strategy="hyperscan") == expected
    assert all(hs_cache.load(f.stem) is not None for f in fresh.glob("*.db"))


def test_bytes_another_library_would_refuse_are_compiled_instead(fresh):
    patterns, flags = [b"ghp_[A-Za-z0-9]{36}"], [0]
    key = hs_cache.cache_key(patterns, flags, hyperscan.HS_MODE_BLOCK)
    hs_cache.store(key, b"not a hyperscan database")  # intact file, unloadable content
    db = hs_cache.compiled(patterns, flags, hyperscan.HS_MODE_BLOCK)
    hits = []
    db.scan(b"x ghp_" + b"a" * 36, match_event_handler=lambda i, s, e, f, c: hits.append(e))
    assert hits == [42]


def test_an_unwritable_cache_folder_only_means_compiling(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DATAKIT_CACHE_DIR", str(blocker))  # hyperscan/ cannot be made under a file
    monkeypatch.setattr(scan, "_HS_DATABASES", {})
    assert scan_batch(TEXTS, strategy="hyperscan") == scan_batch(TEXTS, strategy="python")


def test_the_key_names_everything_the_database_depends_on():
    block = hyperscan.HS_MODE_BLOCK
    base = hs_cache.cache_key([b"a+", b"b"], [0, 0], block)
    assert base == hs_cache.cache_key([b"a+", b"b"], [0, 0], block)
    assert len({base, hs_cache.cache_key([b"a+", b"c"], [0, 0], block),
                hs_cache.cache_key([b"b", b"a+"], [0, 0], block),
                hs_cache.cache_key([b"a+", b"b"], [hyperscan.HS_FLAG_UTF8, 0], block),
                hs_cache.cache_key([b"a+", b"b"], [0, 0], hyperscan.HS_MODE_STREAM)}) == 5
