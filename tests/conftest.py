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
