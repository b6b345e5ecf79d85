"""Shared fixtures. Spark fixtures (one shared local[2] session, a standalone cluster) live in
tests/spark_fixtures.py and are re-exported here when that module exists."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

try:  # the Spark engine's fixtures (session-scoped SparkSession, standalone cluster)
    from tests.spark_fixtures import *  # noqa: F401,F403
except ImportError:  # pragma: no cover - before the Spark engine lands
    pass

from tests.eventgen import make_event, write_jsonl  # noqa: E402,F401
from tests.packaging_env import user_venv, wheel_dists  # noqa: E402,F401  (session: one wheel build per run)


@pytest.fixture
def events_file(tmp_path):
    """A small valid JSON Lines file of mixed events."""
    path = tmp_path / "logs" / "part-00000.jsonl"
    write_jsonl(path, [make_event(i) for i in range(20)])
    return path
