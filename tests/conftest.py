"""Shared fixtures. Spark fixtures (one shared local[2] session, a standalone cluster) live in
tests/spark_fixtures.py and are re-exported here when that module exists."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # An xdist worker's __main__ (execnet's) has neither __spec__ nor __file__, which pyspark.sql.connect
    # (imported by great-expectations) takes for "running doctests" and answers with sys.exit(0) at import.
    # A script or `python -m` always has one of them; give the worker's a script that does nothing
    # (spawned pool workers run it as their __mp_main__).
    import sys

    _main = sys.modules["__main__"]
    if getattr(_main, "__spec__", None) is None and not hasattr(_main, "__file__"):
        _main.__file__ = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xdist_main.py")

try:  # the Spark engine's fixtures (session-scoped SparkSession, standalone cluster)
    from tests.spark_fixtures import *  # noqa: F401,F403
except ImportError:  # pragma: no cover - before the Spark engine lands
    pass

from tests.eventgen import make_event, write_jsonl  # noqa: E402,F401
from tests.packaging_env import user_venv, wheel_dists  # noqa: E402,F401  (session: one wheel build per run)


def _free_gb() -> tuple[str, float]:
    import shutil
    import tempfile

    tmp = tempfile.gettempdir()
    return tmp, shutil.disk_usage(tmp).free / 2**30


def pytest_sessionstart(session) -> None:
    session.config._dk_free_at_start = _free_gb()[1]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Free disk where the tests write, at the start and the end, in the summary CI shows: a run that filled
    its disk (2026-12-07) showed it only as dozens of unrelated failures."""
    tmp, now = _free_gb()
    terminalreporter.write_line(f"disk: {getattr(config, '_dk_free_at_start', float('nan')):.1f} GB free in {tmp} "
                                f"at the start, {now:.1f} GB at the end")


@pytest.fixture
def events_file(tmp_path):
    """A small valid JSON Lines file of mixed events."""
    path = tmp_path / "logs" / "part-00000.jsonl"
    write_jsonl(path, [make_event(i) for i in range(20)])
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`), keep the tests that share a JVM together.

    Why: every Spark test shares one local[2] session per process (tests/spark_fixtures.py), and the
    standalone-cluster tests share one cluster (tests/engines/conftest.py). Grouping sends each set to one
    worker, so each JVM starts once, while the other worker runs the tests that need no JVM. Without xdist
    the mark does nothing. tryfirst: xdist reads the marks in its own collection hook (it renames each
    marked test `<nodeid>@<group>`), which would otherwise run before this one and see none
    (tests/test_xdist_groups.py checks that the groups group).
    """
    for item in items:
        if item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.xdist_group("cluster"))
        elif (item.get_closest_marker("spark") or "spark" in getattr(item, "fixturenames", ())
              or "spark" in item.name.lower() or "spark" in item.path.name):
            item.add_marker(pytest.mark.xdist_group("spark"))
    # A test about what a *fresh* pyspark Python worker imports goes first: the session's workers are
    # reused, and once the group shares one session every earlier Spark test's job would have set them up
    items.sort(key=lambda item: item.get_closest_marker("fresh_spark_workers") is None)  # stable


@pytest.fixture(autouse=True)
def _log_setup_as_it_was():
    """Each `datakit` command is its own process; a test that runs one in this process (`--log-format json`,
    `--quiet`) left its log set-up to the next test (found in CI: an error line the next test expected as
    `datakit: error: ...` came out as JSON; and a handler on a closed capture stream printed "--- Logging
    error ---"). Put back the set-up the test started with when it changed it."""
    import logging

    from datakit import logs

    root, dk = logging.getLogger(), logging.getLogger("datakit")
    before = (dict(logs._current), list(root.handlers), root.level, dk.level)
    yield
    if dict(logs._current) != before[0]:
        logs._current.clear()
        logs._current.update(before[0])
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in before[1]:
            root.addHandler(h)
        root.setLevel(before[2])
        dk.setLevel(before[3])
