"""Shard assignment and in-shard order: independent of arrival order, even when keys tie."""
from __future__ import annotations

import random

import pyarrow as pa

from datakit.io.sinks import shard_ids, sort_shard


def test_ties_on_the_key_do_not_depend_on_arrival_order():
    rows = [{"doc_id": f"d{i % 5}", "v": i, "s": f"x{i}"} for i in range(40)]
    orders = []
    for seed in range(5):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        orders.append(sort_shard(pa.Table.from_pylist(shuffled), "doc_id").to_pylist())
    assert all(o == orders[0] for o in orders)
    assert [r["doc_id"] for r in orders[0]] == sorted(r["doc_id"] for r in rows)


def test_shard_of_a_key_is_stable_and_in_range():
    keys = pa.array([f"k{i}" for i in range(1000)])
    a, b = shard_ids(keys, 7), shard_ids(keys.take(pa.array(range(999, -1, -1))), 7)
    assert (a[::-1] == b).all() and set(a.tolist()) == set(range(7))
