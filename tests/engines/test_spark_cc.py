"""Connected components on Spark (large-star/small-star) agree with union-find on hand-made graphs."""
from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.spark


def union_find(edges: list[tuple[str, str]]) -> dict[str, str]:
    """Reference: node -> smallest id (string order) of its component."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {n: find(n) for n in list(parent)}


def _graphs() -> dict[str, list[tuple[str, str]]]:
    rnd = random.Random(7)
    chain = [(f"n{i:03d}", f"n{i + 1:03d}") for i in range(40)]
    rev_chain = [(f"c{i + 1:03d}", f"c{i:03d}") for i in range(25)]
    zigzag = [(f"z{(i * 37) % 50:02d}", f"z{(i * 37 + 37) % 50:02d}") for i in range(49)]  # a path in scrambled id order
    star = [("hub", f"leaf{i}") for i in range(20)] + [(f"s{i}", "s-hub") for i in range(10)]
    cycle = [(f"y{i}", f"y{(i + 1) % 12}") for i in range(12)]
    disjoint = [("a", "b"), ("c", "d"), ("e", "e"), ("b", "a"), ("x", "y"), ("y", "z"), ("q", "x")]
    rand = [(f"r{rnd.randrange(60)}", f"r{rnd.randrange(60)}") for _ in range(45)]
    unicode_ids = [("é", "e"), ("z", "é"), ("日本", "z"), ("Z", "a")]
    return {"chain": chain, "rev_chain": rev_chain, "zigzag": zigzag, "star": star, "cycle": cycle,
            "disjoint": disjoint, "random": rand, "unicode": unicode_ids}


def test_components_match_union_find_on_hand_made_graphs(spark):
    """All graphs in one run (ids prefixed per graph, so they stay disjoint): one Spark job chain.
    Both ways the engine finds components (rounds of large/small-star; one task for a small graph)."""
    from datakit.engines.spark_cc import components_in_one_task, connected_components

    n = 256  # a path over scrambled ids: the worst case for naive label propagation (n rounds)
    perm = list(range(n))
    random.Random(1).shuffle(perm)
    graphs = _graphs()
    graphs["long_path"] = [(f"p{perm[i]:04d}", f"p{perm[i + 1]:04d}") for i in range(n - 1)]
    edges = [(f"{g}:{a}", f"{g}:{b}") for g, es in graphs.items() for a, b in es]
    odd = [("odd:b", "odd:b"), ("odd:a", None), (None, None), ("odd:c", "odd:d"), ("odd:d", "odd:c")]
    df = spark.createDataFrame(edges + odd, "src string, dst string")
    out, rounds = connected_components(df)
    got = {r["node"]: r["component"] for r in out.collect()}
    want = union_find(edges + [("odd:b", "odd:b"), ("odd:a", "odd:a"), ("odd:c", "odd:d")])
    assert got == want
    assert got["long_path:p0100"] == "long_path:p0000"
    assert got["unicode:日本"] == "unicode:e"  # string (code point) order, as union-find
    assert rounds <= 2 * 8 + 2, rounds  # O(log n) rounds, not O(n)
    one = {r["node"]: r["component"] for r in components_in_one_task(df).collect()}
    assert one == want


def test_the_one_task_components_check_their_worker_environment(spark):
    """The one-task components ran on any Python worker (found in review: the only Python task of a run
    that did not check its worker against the driver's environment). With the driver's environment it
    gives the components; with another (here a changed code digest) the task fails naming the check."""
    from datakit.engines.spark_cc import components_in_one_task
    from datakit.io import identity

    df = spark.createDataFrame([("b", "a"), ("c", "b"), ("e", "d")], "src string, dst string")
    env = identity.runtime_versions()
    got = {r["node"]: r["component"] for r in components_in_one_task(df, env).collect()}
    assert got == {"a": "a", "b": "a", "c": "a", "d": "d", "e": "d"}
    with pytest.raises(Exception, match="ExecutorEnvironmentError"):
        components_in_one_task(df, {**env, "datakit code": "0" * 64}).collect()
