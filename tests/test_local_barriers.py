"""Local engine barrier nodes (Join, Aggregate, ConnectedComponents) through a user stage on records input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import datakit
from datakit import CompileContext, Pipeline, StageConfig, register_stage
from datakit.contracts import TRAINING_RECORD_V1
from datakit.engines.local.barriers import connected_components_table
from datakit.io.dataset import read_output
from tests.conformance import assert_conformant


def _records(n: int) -> pa.Table:
    rows = []
    for i in range(n):
        rows.append({"doc_id": f"{i:04d}", "kind": "code",
                     "segments": [{"text": f"text-{i % 7}", "train": True, "role": None}],
                     "chosen": None, "rejected": None,
                     "source": {"event_id": f"e{i}", "user_id": f"u{i % 3}", "org_id": "o", "session_id": "s",
                                "timestamp": "2026-11-01T00:00:00.000Z", "repo_id": None, "language": "python",
                                "path": None},
                     "meta": json.dumps({})})
    return pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1)


class _WithText:
    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        texts = [s[0]["text"] for s in b.column("segments").to_pylist()]
        return pa.RecordBatch.from_arrays([b.column("doc_id"), pa.array(texts)], names=["doc_id", "text"])


class _MarkLosers:
    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        keep = b.column("keep")
        loser = pc.not_equal(b.column("doc_id"), keep)
        drop = pc.if_else(loser, pa.scalar("exact_text"), pa.scalar(None, pa.string()))
        return b.append_column("_drop", drop).append_column("_drop_detail", keep)


@register_stage
class ExactText(StageConfig):
    """Keep the smallest doc_id per text: aggregate + join back + drop, the dedup pattern in miniature."""

    kind: Literal["test_exact_text"] = "test_exact_text"

    def compile(self, rel, ctx: CompileContext):
        keyed = rel.map_batches(_WithText(), pa.schema([("doc_id", pa.string()), ("text", pa.string())]), name="text")
        winners = keyed.aggregate(["text"], {"keep": ("min", "doc_id")})
        pairs = keyed.join(winners, "text").map_batches(
            _Select(), pa.schema([("doc_id", pa.string()), ("keep", pa.string())]), name="pairs")
        joined = rel.join(pairs, "doc_id", how="inner")
        return joined.map_batches(_MarkLosers(), TRAINING_RECORD_V1, name="mark", drop_log_key="doc_id")


class _Select:
    def __call__(self, b):
        return pa.RecordBatch.from_arrays([b.column("doc_id"), b.column("keep")], names=["doc_id", "keep"])


def test_aggregate_join_drop_on_records_input(tmp_path):
    src = tmp_path / "in" / "records.parquet"
    src.parent.mkdir()
    pq.write_table(_records(50), src)
    p = (Pipeline("b").input(str(src), format="parquet", schema="training_record.v1")
         .add({"kind": "test_exact_text"}).output(str(tmp_path / "o"), shards=3))
    assert_conformant(p, tmp_path)
    res = p.run(workers=1, output=str(tmp_path / "o"))
    st = res.stage("test_exact_text")
    assert st["rows_in"] == 50 and st["rows_out"] == 7 and st["dropped"] == {"exact_text": 43}
    kept = sorted(read_output(str(tmp_path / "o")).column("doc_id").to_pylist())
    assert kept == [f"{i:04d}" for i in range(7)]
    log = pq.read_table(tmp_path / "o" / "_dropped" / "part-00000.parquet").to_pylist()
    assert len(log) == 43 and {"stage": "test_exact_text", "key": "0010", "reason": "exact_text", "detail": "0003"} in log


def test_connected_components_smallest_id_is_representative():
    src = pa.array(["b", "c", "x", "e", "q"])
    dst = pa.array(["a", "b", "y", "d", "q"])
    t = connected_components_table(src, dst)
    comp = dict(zip(t.column("node").to_pylist(), t.column("component").to_pylist()))
    assert comp == {"a": "a", "b": "a", "c": "a", "x": "x", "y": "x", "d": "d", "e": "d", "q": "q"}


def test_a_null_end_names_no_node_as_on_spark():
    """tests/engines/test_spark_cc.py's odd edges: the same answer as Spark's rounds and one-task path
    (before, the local engine made null a node and joined "a" and "b" through it)."""
    src = pa.array(["odd:b", "odd:a", None, "odd:c", "odd:d", "x", None])
    dst = pa.array(["odd:b", None, None, "odd:d", "odd:c", None, "y"])
    t = connected_components_table(src, dst)
    assert dict(zip(t.column("node").to_pylist(), t.column("component").to_pylist())) == {
        "odd:a": "odd:a", "odd:b": "odd:b", "odd:c": "odd:c", "odd:d": "odd:c", "x": "x", "y": "y"}


def _scipy_smallest_member(si, di, n):
    """The reference (what connected_components_table ran before): scipy's weak components, then
    the smallest node index per component label."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    g = coo_matrix((np.ones(len(si), dtype=np.int8), (si, di)), shape=(n, n))
    _, labels = connected_components(g, directed=True, connection="weak")
    first = np.full(labels.max() + 1, n, dtype=np.int64)
    np.minimum.at(first, labels, np.arange(n))
    return first[labels]


def test_smallest_member_labels_match_scipy_on_random_and_adversarial_graphs():
    from datakit.engines.core import smallest_member_labels

    rng = np.random.default_rng(3)
    cases = []
    for n, e in [(1, 0), (1, 1), (2, 1), (10, 3), (50, 40), (200, 150), (2000, 1000), (2000, 4000), (30000, 25000)]:
        cases.append((rng.integers(0, n, e), rng.integers(0, n, e), n))
    perm = rng.permutation(5000)  # a path over scrambled ids: n rounds for plain label propagation
    cases.append((perm[:-1], perm[1:], 5000))
    cases.append((np.arange(1, 3000), np.zeros(2999, dtype=np.int64), 3000))  # a star on the smallest node
    cases.append((np.full(2999, 2999), np.arange(2999), 3000))  # a star on the largest node
    ladder = np.arange(0, 4000, 2)  # 0-2-4-... joined to 1-3-5-..., each edge twice, both ways
    cases.append((np.concatenate([ladder, ladder + 1, ladder[1:]]), np.concatenate([ladder + 1, ladder, ladder[:-1] + 1]),
                  4000))
    for si, di, n in cases:
        si, di = np.asarray(si, dtype=np.int64), np.asarray(di, dtype=np.int64)
        got = smallest_member_labels(si, di, n)
        assert np.array_equal(got, _scipy_smallest_member(si, di, n)), (n, len(si))
    assert len(np.unique(smallest_member_labels(perm[:-1], perm[1:], 5000))) == 1


def _scanned_sources(tmp_path, left_t: pa.Table, right_t: pa.Table, row_group_size: int):
    """Two Parquet sources written from tables, and the `lazy` scan barrier_query reads them through."""
    import polars as pl

    from datakit.plan import Source

    nodes = []
    scans = {}
    for name, t in (("left", left_t), ("right", right_t)):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(t, path, row_group_size=row_group_size)
        nodes.append(Source("t", t.schema, paths=[str(path)], format="parquet"))
        scans[nodes[-1].id] = path
    return nodes[0], nodes[1], lambda node: pl.scan_parquet(scans[node.id])


def test_barrier_queries_keep_their_inputs_row_order(tmp_path):
    """A barrier's spill must have the same bytes on every run of the same input: the next chain's
    tasks are row-group slices of it, fingerprinted by its sha256, so a spill whose rows came out in
    another order made a resumed run redo tasks it had finished (a flaky S3 resume test, 1 in ~40
    runs under load). Polars' unordered hash group-by and join do not keep first-seen order on
    this many keys; the queries must."""
    from datakit.engines.local.barriers import barrier_query
    from datakit.plan import Aggregate, Join

    rng = np.random.default_rng(7)
    n = 120_000
    keys = [f"k{x}" for x in rng.integers(0, 90_000, n)]
    left_t = pa.table({"key": keys, "row": np.arange(n)})
    right_t = pa.table({"key": [f"k{x}" for x in rng.permutation(90_000)[:40_000]], "tag": np.arange(40_000)})
    left, right, lazy = _scanned_sources(tmp_path, left_t, right_t, 2048)
    agg = Aggregate("t", pa.schema([("key", pa.string()), ("first", pa.int64())]), input=left, keys=["key"],
                    aggs={"first": ("min", "row")})
    got = barrier_query(agg, lazy).collect(engine="streaming")
    assert got["key"].to_list() == list(dict.fromkeys(keys))  # first-seen order
    assert got["first"].is_sorted()

    right_of = dict(zip(right_t.column("key").to_pylist(), right_t.column("tag").to_pylist()))
    for how in ("inner", "left", "anti", "semi"):
        cols = [("key", pa.string()), ("row", pa.int64())] + ([("tag", pa.int64())] if how in ("inner", "left") else [])
        join = Join("t", pa.schema(cols), left=left, right=right, left_on=["key"], right_on=["key"], how=how)
        got = barrier_query(join, lazy).collect(engine="streaming")
        want = [r for r, k in enumerate(keys) if how == "left" or (k in right_of) == (how in ("inner", "semi"))]
        assert got["row"].to_list() == want, how  # the left side's order, row for row
        if how in ("inner", "left"):
            assert got["tag"].to_list() == [right_of.get(keys[r]) for r in want]


def test_a_join_whose_right_side_is_larger_gives_the_same_rows_after_the_semi_filter(tmp_path):
    """`right_larger` keeps only the right rows whose key the left has before the join (polars holds the
    whole right side in memory to build it). Inner and left joins, two-column keys, null keys, several
    matches per key, right rows no left row matches: the same rows in the same order as without it."""
    import polars as pl

    from datakit.engines.local.barriers import barrier_query
    from datakit.plan import Join

    left_t = pa.table({"a": ["x", "y", None, "x", "z", "w"], "b": [1, 1, 1, 2, 3, 1], "row": list(range(6))})
    right_t = pa.table({"a": ["x", "x", "q", None, "y", "x", "z", "r"] * 50, "b": [1, 1, 5, 1, 1, 2, 4, 1] * 50,
                        "tag": list(range(400))})
    left, right, lazy = _scanned_sources(tmp_path, left_t, right_t, 64)
    for how in ("inner", "left"):
        join = Join("t", pa.schema([("a", pa.string()), ("b", pa.int64()), ("row", pa.int64()), ("tag", pa.int64())]),
                    left=left, right=right, left_on=["a", "b"], right_on=["a", "b"], how=how)
        plain = barrier_query(join, lazy).collect(engine="streaming")
        filtered = barrier_query(join, lazy, right_larger=True).collect(engine="streaming")
        assert filtered.equals(plain), how
        # (x,1) matches 100 right rows, (y,1) and (x,2) 50 each; (None,1), (z,3), (w,1) none (kept by a left join)
        assert plain.height == (200 if how == "inner" else 203)
        assert plain.filter(pl.col("row") == 0)["tag"].to_list() == [t for t in range(400) if t % 8 in (0, 1)]


def test_the_engine_filters_the_larger_right_side_of_a_join(tmp_path, monkeypatch):
    """The engine passes `right_larger` from the spills' sizes: dedup's verification joins the candidate
    pairs (small, left) to every record (large, right) by doc_id."""
    from datakit.engines.local import barriers

    seen = []
    real = barriers.barrier_query

    def spy(node, lazy, right_larger=False, columns=None):
        from datakit.plan import Join

        if isinstance(node, Join) and node.right_prefix in ("_dk_src__", "_dk_dst__"):  # pairs to records
            seen.append(right_larger)
        return real(node, lazy, right_larger, columns)

    monkeypatch.setattr(barriers, "barrier_query", spy)
    texts = ["def f(x):\n    return x + 1\n" * 20, "class A:\n    pass\n" * 20]
    records = _records(40).to_pylist()
    for i, r in enumerate(records):
        r["segments"] = [{"text": texts[i % 2] + ("" if i < 30 else f"# {i}\n" * 40), "train": True, "role": None}]
    pq.write_table(pa.Table.from_pylist(records, schema=TRAINING_RECORD_V1), tmp_path / "r.parquet")
    p = (Pipeline("t").input(str(tmp_path / "r.parquet"), format="parquet", schema="training_record.v1")
         .add({"kind": "dedup", "minhash": {"threshold": 0.5}}).output(str(tmp_path / "o")))
    p.run(workers=1)
    assert seen and all(seen)  # every join of pairs to records filtered the records first


_POLARS_FREE_PROBE = """
import os, sys, time
def anon():
    return int(next(l for l in open('/proc/self/status') if l.startswith('RssAnon:')).split()[1]) // 1024
import datakit  # noqa: F401 - before polars, as every datakit process imports it
import polars as pl
base = anon()
df = pl.DataFrame({"a": pl.arange(0, 8_000_000, eager=True)}).with_columns((pl.col("a") * 3).alias("b"))
df.select(pl.col("b").sort(descending=True)).height
peak = anon()
del df
time.sleep(0.4)  # polars' jemalloc purges from a background thread once the decay time has passed
print(base, peak, anon(), os.environ["_RJEM_MALLOC_CONF"])
"""


def test_polars_gives_freed_memory_back_soon_after_a_barrier_query():
    """A barrier's polars memory leaves RSS before the next one. With polars' own allocator
    settings (500 ms + 1000 ms MADV_FREE) this probe stayed at its peak (measured: base 26 MB,
    peak 209 MB, 209 MB after; 26 MB after with ours) and each dedup barrier stacked on the last."""
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    out = subprocess.run([sys.executable, "-c", _POLARS_FREE_PROBE], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    base, peak, after = map(int, out[:3])
    assert peak - base > 100, out  # the probe did allocate
    assert after - base < (peak - base) / 4, out
    assert out[3].endswith(datakit.POLARS_ALLOCATOR_CONF)


def test_a_users_own_polars_allocator_setting_is_kept():
    env = {**os.environ, "_RJEM_MALLOC_CONF": "dirty_decay_ms:7000"}
    for order in ("datakit, polars", "polars, datakit"):
        out = subprocess.run([sys.executable, "-c", f"import os, {order}; print(os.environ['_RJEM_MALLOC_CONF'])"],
                             env=env, capture_output=True, text=True, check=True).stdout.strip()
        assert out.endswith(",dirty_decay_ms:7000") and datakit.POLARS_ALLOCATOR_CONF not in out, (order, out)


_POLARS_FIRST_PROBE = """
import os
import polars  # noqa: F401 - a notebook's order: polars has written its own defaults already
import datakit
from datakit.workers import drop_all_pools, pool
try:
    print(pool(1).submit(os.getenv, "_RJEM_MALLOC_CONF").result())
finally:
    drop_all_pools(wait=True)
"""


def test_pool_workers_get_the_polars_setting_when_polars_was_imported_first():
    """Too late for the importing process itself (its allocator is set up), not for the workers it starts."""
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    out = subprocess.run([sys.executable, "-c", _POLARS_FIRST_PROBE], env=env, capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out.endswith("," + datakit.POLARS_ALLOCATOR_CONF), out


def test_a_barrier_spills_only_the_columns_its_consumers_read(tmp_path, monkeypatch):
    """Dedup's verification joins each candidate pair with both ends' records, and the function after
    reads only their texts (`reads`): the joins keep just those (polars then never loads the rest of
    the records into the join). The output is the same bytes as with every column spilled."""
    from datakit.engines.local import barriers
    from datakit.engines.local.engine import LocalEngine
    from datakit.io.sinks import output_checksums

    texts = ["def f(x):\n    return x + 1\n" * 20, "class A:\n    pass\n" * 20]
    records = _records(40).to_pylist()
    for i, r in enumerate(records):
        r["segments"] = [{"text": texts[i % 2] + ("" if i < 30 else f"# {i}\n" * 40), "train": True, "role": None}]
    pq.write_table(pa.Table.from_pylist(records, schema=TRAINING_RECORD_V1), tmp_path / "r.parquet")

    def run(out: str, prune: bool) -> list:
        seen = []
        real = barriers.barrier_query

        def spy(node, lazy, right_larger=False, columns=None):
            seen.append((node, columns))
            return real(node, lazy, right_larger, columns)

        monkeypatch.setattr(barriers, "barrier_query", spy)
        if not prune:
            monkeypatch.setattr(LocalEngine, "_columns_used", lambda self, node: None)
        p = (Pipeline("t").input(str(tmp_path / "r.parquet"), format="parquet", schema="training_record.v1")
             .add({"kind": "dedup", "minhash": {"threshold": 0.5, "verify": "exact"}}).output(out))
        res = p.run(workers=1)
        monkeypatch.undo()
        assert res.stage("dedup")["dropped"]  # the pairs were verified and some dropped
        return seen

    pruned = run(str(tmp_path / "a"), True)
    whole = run(str(tmp_path / "b"), False)
    assert output_checksums(str(tmp_path / "a")) == output_checksums(str(tmp_path / "b"))
    from datakit.plan import Join

    ends = [(n, c) for n, c in pruned if isinstance(n, Join) and n.right_prefix]
    assert len(ends) >= 2
    first, second = ends[0][1], ends[1][1]
    # the first end's join keeps the pair, the other end's key and the first end's texts; the second adds its texts
    assert first is not None and set(first) == {"src", "dst", "_dk_src__segments", "_dk_src__chosen", "_dk_src__rejected"}
    assert second is not None and set(second) == set(first) | {c.replace("_src_", "_dst_") for c in first if "_src_" in c}
    assert all(c is None for _, c in whole)
    assert not any(c.endswith(("__source", "__meta")) for _, cols in pruned if cols for c in cols)


def _forced_buckets(monkeypatch, on: bool) -> list:
    """Make every string-keyed inner/left join and every keyed aggregate a partitioned one (or none);
    returns the joins and aggregates split."""
    from datakit.engines.local import partitioned_join
    from datakit.engines.local.engine import LocalEngine

    seen: list = []
    real_join, real_aggregate = LocalEngine._partitioned_join, LocalEngine._partitioned_aggregate

    def spy_join(self, node, keep, buckets):
        seen.append((node.describe(), buckets))
        return real_join(self, node, keep, buckets)

    def spy_aggregate(self, node, keep, buckets):
        seen.append((node.describe(), buckets))
        return real_aggregate(self, node, keep, buckets)

    monkeypatch.setattr(LocalEngine, "_partitioned_join", spy_join)
    monkeypatch.setattr(LocalEngine, "_partitioned_aggregate", spy_aggregate)
    monkeypatch.setenv(partitioned_join.MEMORY_ENV, "0" if on else "1e12")  # every join over budget, or none
    return seen


def test_a_partitioned_join_gives_the_output_and_counts_of_the_single_process_join(tmp_path, monkeypatch):
    """Dedup (exact + near, verified by exact Jaccard, similar_to_kept) with every join split into buckets
    joined in the pool: the same dataset bytes and the same accounting as with polars' one join."""
    from datakit.io.sinks import output_checksums

    texts = [f"def f{k}(x):\n" + "\n".join(f"    y{j} = x * {j} + {k}" for j in range(60)) for k in range(3)]
    records = _records(60).to_pylist()
    for i, r in enumerate(records):
        tail = "" if i < 30 else f"\n# note {i}"  # >= 30: near copies of each other, < 30: exact ones
        r["segments"] = [{"text": texts[i % 3] + tail, "train": True, "role": None}]
    pq.write_table(pa.Table.from_pylist(records, schema=TRAINING_RECORD_V1), tmp_path / "r.parquet")
    runs = {}
    for on in (False, True):
        seen = _forced_buckets(monkeypatch, on)
        p = (Pipeline("t").input(str(tmp_path / "r.parquet"), format="parquet", schema="training_record.v1")
             .add({"kind": "dedup", "exact": True,
                   "minhash": {"threshold": 0.7, "verify": "exact", "drop_rule": "similar_to_kept"}})
             .output(str(tmp_path / f"o{on}"), shards=2))
        res = p.run(workers=2)
        if on:
            assert {d.split("(")[0] for d, _ in seen} == {"Join", "Aggregate"}, seen
        runs[on] = (output_checksums(str(tmp_path / f"o{on}")), res.stage("dedup"), len(seen))
        monkeypatch.undo()
    (plain, plain_stage, none), (split, split_stage, jobs) = runs[False], runs[True]
    assert none == 0 and jobs >= 8  # the verification joins, the marking joins, the LSH bucket aggregate, ...
    assert plain_stage["dropped"].get("near_duplicate") and plain_stage["dropped"].get("exact_duplicate")
    assert split == plain
    assert {k: split_stage[k] for k in ("rows_in", "rows_out", "dropped")} == \
        {k: plain_stage[k] for k in ("rows_in", "rows_out", "dropped")}


def _exact_text_input(tmp_path) -> str:
    """50 records for test_exact_text (7 kept, 43 exact duplicates) as one Parquet file."""
    src = tmp_path / "in" / "records.parquet"
    src.parent.mkdir()
    pq.write_table(_records(50), src)
    return str(src)


def _exact_text(src: str, out: str) -> Pipeline:
    return (Pipeline("b").input(src, format="parquet", schema="training_record.v1")
            .add({"kind": "test_exact_text"}).output(out, shards=3))


def _assert_like_unbroken(tmp_path, rerun: dict, clean: dict) -> None:
    """The rerun into `o` wrote the bytes and counts of the unbroken run into `clean`."""
    from datakit.io.sinks import output_checksums

    assert output_checksums(str(tmp_path / "o")) == output_checksums(str(tmp_path / "clean"))
    assert (rerun["rows_out"], rerun["dropped"]) == (clean["rows_out"], clean["dropped"]) == (7, {"exact_text": 43})


# a script run in its own process: argv = records file, output folder, workers, then the test's own arguments;
# `BODY` (between the two) replaces partitioned_join.join_bucket, also in the pool workers (spawn re-imports it)
_SCRIPT_HEAD = """
import os, signal, sys
import tests.test_local_barriers  # registers test_exact_text
from tests.test_local_barriers import _exact_text
from datakit.engines.local import partitioned_join
real = partitioned_join.join_bucket
"""
_SCRIPT_TAIL = """
partitioned_join.join_bucket = join_bucket
if __name__ == "__main__":
    _exact_text(sys.argv[1], sys.argv[2]).run(workers=int(sys.argv[3]))
"""


def _run_script(tmp_path, body: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(_SCRIPT_HEAD + body + _SCRIPT_TAIL)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": root}, cwd=tmp_path, timeout=300)


def test_a_partitioned_join_on_a_user_stage_in_process(tmp_path, monkeypatch):
    """The aggregate + join back + drop pattern (test_exact_text) with workers=1: bucket tasks run in-process."""
    from datakit.io.sinks import output_checksums

    src = _exact_text_input(tmp_path)
    out = {}
    for on in (False, True):
        seen = _forced_buckets(monkeypatch, on)
        st = _exact_text(src, str(tmp_path / f"o{on}")).run(workers=1).stage("test_exact_text")
        out[on] = (output_checksums(str(tmp_path / f"o{on}")), st["rows_out"], st["dropped"], len(seen))
        monkeypatch.undo()
    assert out[True][:3] == out[False][:3] and out[False][1:3] == (7, {"exact_text": 43})
    assert out[True][3] > 0 and out[False][3] == 0


def test_a_run_that_fails_during_its_bucket_joins_reruns_to_the_bytes_of_an_unbroken_one(tmp_path, monkeypatch):
    """A run dies while a split join's buckets are being joined (the second bucket task raises, with the
    shuffle written and the first bucket's part on disk); the rerun into the same folder, told nothing,
    clears that join's leftovers, shuffles again and writes the bytes and counts of a run that never
    failed (the shuffle is never resumed: see partitioned_join.py)."""
    from datakit.engines.local import partitioned_join

    src = _exact_text_input(tmp_path)
    monkeypatch.setenv(partitioned_join.MEMORY_ENV, "0")  # every join is split
    clean = _exact_text(src, str(tmp_path / "clean")).run(workers=1).stage("test_exact_text")
    real, calls = partitioned_join.join_bucket, []

    def dies_on_the_second_bucket(args):
        calls.append(args[3])
        if len(calls) == 2:
            raise RuntimeError("simulated crash in a bucket join")
        return real(args)

    monkeypatch.setattr(partitioned_join, "join_bucket", dies_on_the_second_bucket)
    with __import__("pytest").raises(Exception, match="simulated crash"):
        _exact_text(src, str(tmp_path / "o")).run(workers=1)
    assert len(calls) == 2 and os.path.exists(calls[0])  # it died between two buckets, one part written
    monkeypatch.setattr(partitioned_join, "join_bucket", real)
    _assert_like_unbroken(tmp_path, _exact_text(src, str(tmp_path / "o")).run(workers=1).stage("test_exact_text"),
                          clean)


def test_join_buckets_put_equal_keys_together_and_spread_null_keys():
    """A bucket join's shuffle (`group_hashes(..., nulls_by_position=True)`): equal key tuples meet, an
    int32 key meets the equal int64 key of the other side, and rows with a null key (which match
    nothing) spread over every bucket instead of piling up in one."""
    from datakit.io.sinks import group_hashes

    name = pa.array(["a", None, "b", "a", "c", "a"] * 50)
    band = pa.array([1, 2, None, 1, 3, 1] * 50, pa.int32())
    ids = (group_hashes([name, band], nulls_by_position=True) % np.uint64(7)).astype(np.int64)
    by_key: dict = {}
    for k, b in zip(zip(name.to_pylist(), band.to_pylist()), ids.tolist()):
        by_key.setdefault(k, set()).add(b)
    assert all(len(v) == 1 for k, v in by_key.items() if None not in k)
    assert by_key[(None, 2)] == by_key[("b", None)] == set(range(7))  # spread, not piled in one bucket
    other_side = group_hashes([pa.array(["a", "c"]), pa.array([1, 3], pa.int64())], nulls_by_position=True)
    assert (other_side % np.uint64(7)).tolist() == [ids[0], ids[4]]
    grouped = group_hashes([name, band])  # an aggregate's shuffle: a null key is a group, its rows meet
    assert len(set(grouped[np.asarray(band.is_null())].tolist())) == 1


def test_a_join_is_split_only_when_it_would_pass_the_memory_budget(monkeypatch):
    from datakit.engines.local import partitioned_join as pj

    monkeypatch.setenv(pj.MEMORY_ENV, "1000")  # 1000 MB for one join
    assert pj.buckets_for(50 << 20, 2) == 0  # ~500 MB estimated: one join
    assert pj.buckets_for(200 << 20, 2) == -(-(200 << 20) * pj.MEMORY_PER_SPILL_BYTE // pj.BUCKET_MEMORY)
    assert pj.buckets_for(101 << 20, 8) == 16  # at least two buckets per worker
    # the count covers both sides (a bucket task holds its share of the left one too), up to MAX_BUCKETS
    assert pj.buckets_for(200 << 20, 2, 1000 << 20) == -(-(1200 << 20) * pj.MEMORY_PER_SPILL_BYTE // pj.BUCKET_MEMORY)
    assert pj.buckets_for(200 << 20, 2, 1 << 40) == pj.MAX_BUCKETS
    monkeypatch.delenv(pj.MEMORY_ENV)
    assert pj.join_memory_budget() == int(pj.machine_memory() * pj.MEMORY_SHARE) > 0
    monkeypatch.setenv(pj.MEMORY_ENV, "lots")
    with __import__("pytest").raises(ValueError, match="megabytes"):
        pj.join_memory_budget()


# SIGKILLs its own process when the second bucket task starts (workers=1: the bucket tasks run in this
# process), so nothing of the run's own cleanup runs: lock, shuffle files, parts
KILLED_IN_A_BUCKET = """
calls = []
def join_bucket(args):
    calls.append(args[3])
    if len(calls) == 2:
        print("killing", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(args)
"""


def test_a_run_killed_during_its_bucket_joins_reruns_to_the_bytes_of_an_unbroken_one(tmp_path, monkeypatch):
    """SIGKILL in the middle of a split join (after one bucket's part, before the next): no cleanup runs, the
    output folder's lock names a dead process and the shuffle and part files stay. A rerun into the same
    folder takes the folder over, redoes the split and writes the bytes and counts of an unbroken run."""
    import signal

    from datakit.engines.local import partitioned_join
    from datakit.io.publish import LOCK_NAME

    src = _exact_text_input(tmp_path)
    monkeypatch.setenv(partitioned_join.MEMORY_ENV, "0")  # every join and group-by is split
    killed = _run_script(tmp_path, KILLED_IN_A_BUCKET, src, str(tmp_path / "o"), "1")
    assert killed.returncode == -signal.SIGKILL and "killing" in killed.stdout, killed.stderr[-2000:]
    assert not (tmp_path / "o" / "_SUCCESS").exists()
    assert (tmp_path / "o" / LOCK_NAME).exists()  # held by a process that is gone
    assert list((tmp_path / "o" / "_work").glob("*/n*/left")), "the split join's shuffle is left behind"
    rerun = _exact_text(src, str(tmp_path / "o")).run(workers=2).stage("test_exact_text")
    clean = _exact_text(src, str(tmp_path / "clean")).run(workers=2).stage("test_exact_text")
    _assert_like_unbroken(tmp_path, rerun, clean)


# argv[4]: a marker file; the first bucket task to start (in a pool worker: workers=2) SIGKILLs its own
# worker process; the driver then fails the run in one line
WORKER_KILLED_IN_A_BUCKET = """
def join_bucket(args):
    try:
        os.close(os.open(sys.argv[4], os.O_CREAT | os.O_EXCL))  # only the first task to get here
    except FileExistsError:
        return real(args)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_pool_worker_killed_in_a_bucket_join_fails_the_run_in_one_line_and_the_rerun_resumes(tmp_path,
                                                                                             monkeypatch):
    """A pool worker dies (SIGKILL) while joining a bucket: the run stops with one line naming the task, the
    signal and the step, and a rerun into the same folder writes the bytes and counts of an unbroken run."""
    from datakit.engines.local import partitioned_join

    src = _exact_text_input(tmp_path)
    monkeypatch.setenv(partitioned_join.MEMORY_ENV, "0")  # every join and group-by is split
    failed = _run_script(tmp_path, WORKER_KILLED_IN_A_BUCKET, src, str(tmp_path / "o"), "2", str(tmp_path / "marker"))
    assert failed.returncode != 0 and (tmp_path / "marker").exists()
    err = failed.stderr
    # one line naming the task, how its worker ended and the step (the pool itself only says "terminated abruptly")
    assert "running task " in err and "(a bucket of " in err and ": join'" in err, err[-3000:]
    assert "was killed by SIGKILL (on Linux most often the kernel's out-of-memory killer" in err, err[-3000:]
    assert "EngineError: the local worker process (pid " in err, err[-3000:]
    rerun = _exact_text(src, str(tmp_path / "o")).run(workers=2).stage("test_exact_text")
    clean = _exact_text(src, str(tmp_path / "clean")).run(workers=2).stage("test_exact_text")
    _assert_like_unbroken(tmp_path, rerun, clean)


def test_a_bucket_task_is_named_by_its_part_in_errors():
    """What a storage error in a bucket task names (scheduler._task_path): the part it was writing."""
    from datakit.engines.local.partitioned_join import stub_aggregate, stub_join
    from datakit.engines.local.scheduler import _task_path
    from datakit.plan import Aggregate, Join, Source

    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    src = Source("t", schema)
    join = stub_join(Join("t", schema, left=src, right=src, left_on=["k"], right_on=["k"]), schema, schema)
    agg = stub_aggregate(Aggregate("t", schema, input=src, keys=["k"], aggs={"v": ("max", "v")}), schema)
    assert _task_path((join, ["l"], ["r"], "/w/n003/part-00002.parquet", None)) == \
        "/w/n003/part-00002.parquet (a bucket of Join(inner, ['k']=['k']))"
    assert _task_path((agg, ["f"], "/w/n004/part-00001.parquet", None)).startswith("/w/n004/part-00001.parquet (a bucket")


def test_group_hashes_put_equal_key_tuples_together_nulls_included():
    from datakit.io.sinks import group_hashes

    n = 4000
    rng = np.random.default_rng(3)
    band = pa.array([None if i % 29 == 0 else int(x) for i, x in enumerate(rng.integers(0, 4, n))], pa.int32())
    bucket = pa.chunked_array([pa.array(rng.integers(-5, 50, n // 2)), pa.array(rng.integers(-5, 50, n - n // 2))])
    name = pa.array([None if i % 31 == 0 else f"d{x}" for i, x in enumerate(rng.integers(0, 20, n))])
    flag = pa.array([None if i % 37 == 0 else bool(x) for i, x in enumerate(rng.integers(0, 2, n))])
    when = pa.array(rng.integers(0, 3, n) * 86_400_000_000, pa.timestamp("us", "UTC"))
    frac = pa.array(rng.integers(0, 3, n) / 2)  # anything else: by its repr
    big = pa.array([2**64 - 1 - int(x) for x in rng.integers(0, 3, n)], pa.uint64())  # past int64's range
    cols = [band, bucket, name, flag, when, frac, big]
    h = group_hashes(cols)
    assert h.dtype == np.uint64 and len(h) == n
    keys = list(zip(*(c.to_pylist() for c in cols)))
    by_key: dict = {}
    for k, v in zip(keys, h.tolist()):
        by_key.setdefault(k, set()).add(v)
    assert all(len(v) == 1 for v in by_key.values())  # equal tuples (with their nulls) hash alike
    assert len(set(h.tolist())) == len(by_key)  # and different tuples did not collide here
    # a null is not the value 0 / "" / False, and the order of the key columns matters
    assert group_hashes([pa.array([None, 0], pa.int64())]).tolist()[0] != group_hashes([pa.array([0], pa.int64())]).tolist()[0]
    assert group_hashes([pa.array([None, ""])])[0] != group_hashes([pa.array([""])])[0]
    assert group_hashes([pa.array([1]), pa.array([2])])[0] != group_hashes([pa.array([2]), pa.array([1])])[0]
    assert group_hashes([pa.array([-1, 7], pa.int32())]).tolist() == group_hashes([pa.array([-1, 7], pa.int64())]).tolist()
    counts = np.bincount((group_hashes([pa.array(np.arange(20_000))]) % np.uint64(8)).astype(np.int64), minlength=8)
    assert counts.min() > 2200  # consecutive integers (band numbers, bucket ids) spread evenly over buckets


def test_an_aggregate_is_split_only_when_it_would_pass_the_memory_budget(monkeypatch):
    from datakit.engines.local import partitioned_join as pj

    monkeypatch.setenv(pj.MEMORY_ENV, "1000")
    assert pj.aggregate_buckets_for(40 << 20, 2) == 0  # ~800 MB estimated: one group-by
    assert pj.aggregate_buckets_for(100 << 20, 2) == -(-(100 << 20) * pj.AGGREGATE_MEMORY_PER_SPILL_BYTE
                                                        // pj.BUCKET_MEMORY)
    assert pj.aggregate_buckets_for(51 << 20, 8) == 16
    assert pj.aggregate_buckets_for(1 << 40, 2) == pj.MAX_BUCKETS


def test_bucket_aggregates_give_the_single_group_by_rows_with_null_keys(tmp_path):
    """The aggregate machinery alone: the input split with `group_hashes` on both keys, each bucket grouped
    by `aggregate_bucket`, against `barrier_query` over the whole input: min, max, count and sum, a key
    column with nulls (a group of its own), a first key with few values (the LSH band), a bucket with no
    rows at all."""
    import polars as pl

    from datakit.engines.local.barriers import barrier_query
    from datakit.engines.local.partitioned_join import aggregate_bucket, stub_aggregate
    from datakit.io.sinks import group_hashes
    from datakit.plan import Aggregate

    rng = np.random.default_rng(11)
    n = 5000
    band = pa.array(rng.integers(0, 3, n), pa.int32())
    bucket = pa.array([None if i % 13 == 0 else int(x) for i, x in enumerate(rng.integers(0, 700, n))], pa.int64())
    t = pa.table({"band": band, "bucket": bucket, "doc": [f"d{x:05d}" for x in rng.integers(0, 90000, n)],
                  "w": rng.integers(1, 9, n)})
    src, _, lazy = _scanned_sources(tmp_path, t, t, 512)
    agg = Aggregate("t", pa.schema([("band", pa.int32()), ("bucket", pa.int64()), ("first", pa.string()),
                                    ("last", pa.string()), ("n", pa.uint32()), ("total", pa.int64())]),
                    input=src, keys=["band", "bucket"],
                    aggs={"first": ("min", "doc"), "last": ("max", "doc"), "n": ("count", "doc"), "total": ("sum", "w")})
    whole = barrier_query(agg, lazy).collect(engine="streaming")
    buckets = 9
    ids = (group_hashes([t.column("band"), t.column("bucket")]) % np.uint64(buckets)).astype(np.int64)
    kept = ids != 4  # bucket 4 left empty
    files = _spill_buckets(t.filter(pa.array(kept)), ids[kept], buckets, tmp_path / "agg", 300)
    stub = stub_aggregate(agg, t.schema)
    outs = [aggregate_bucket((stub, files.get(b, []), str(tmp_path / f"agg-out-{b}.parquet"), None))
            for b in range(buckets)]
    split = pl.concat([pl.read_parquet(o["file"]) for o in outs])
    expected = barrier_query(agg, lambda _: pl.from_arrow(t.filter(pa.array(ids != 4))).lazy()).collect()
    keys = ["band", "bucket"]
    assert split.sort(keys, nulls_last=True).equals(expected.sort(keys, nulls_last=True))
    assert whole["bucket"].null_count() > 0 and split["bucket"].null_count() == 3  # one null group per band
    assert outs[4]["rows"] == 0 and sum(o["rows"] for o in outs) == split.height
    assert sum(o["base_rows"] for o in outs) == int((ids != 4).sum())


def _spill_buckets(t: pa.Table, ids: np.ndarray, buckets: int, prefix, chunk: int) -> dict[int, list[str]]:
    """The rows of each bucket `ids` gives them, spilled as the engine's shuffle writes them
    (`{prefix}-{bucket}.arrows`, batches of `chunk` rows); buckets with no row get no file."""
    from datakit.engines.local.spill import IpcSpill

    files: dict[int, list[str]] = {}
    for b in range(buckets):
        part = t.filter(pa.array(ids == b))
        if part.num_rows:
            path = f"{prefix}-{b}.arrows"
            w = IpcSpill(path, t.schema)
            for batch in part.to_batches(max_chunksize=chunk):
                w.write_batch(batch)
            w.close()
            files[b] = [path]
    return files


def _join_buckets(t: pa.Table, buckets: int) -> np.ndarray:
    from datakit.io.sinks import group_hashes

    return (group_hashes([t.column("a"), t.column("b")], nulls_by_position=True) % np.uint64(buckets)).astype(np.int64)


def test_bucket_joins_give_the_single_join_rows_with_null_and_repeated_keys(tmp_path):
    """The bucket machinery alone: both sides split as the engine splits them (`group_hashes` of the keys),
    each bucket joined by `join_bucket`, against `barrier_query` over the whole sides. Left and inner joins,
    two-column keys, null keys (kept by the left join, matched by nothing), keys repeated on both sides,
    left keys with no right row, and buckets with no right rows at all."""
    import polars as pl

    from datakit.engines.local.barriers import barrier_query
    from datakit.engines.local.partitioned_join import join_bucket, stub_join
    from datakit.plan import Join

    rng = np.random.default_rng(5)
    n = 3000
    lk = [None if i % 17 == 0 else f"k{x}" for i, x in enumerate(rng.integers(0, 400, n))]
    left_t = pa.table({"a": lk, "b": rng.integers(0, 3, n), "row": np.arange(n)})
    rk = [None if i % 23 == 0 else f"k{x}" for i, x in enumerate(rng.integers(0, 300, 900))]  # k300..k399: no match
    right_all = pa.table({"a": rk, "b": rng.integers(0, 3, 900), "tag": np.arange(900)})
    buckets = 7
    right_ids = _join_buckets(right_all, buckets)
    right_t = right_all.filter(pa.array(right_ids != 3))  # bucket 3: left rows, no right rows
    right_ids = right_ids[right_ids != 3]  # (the buckets the rows kept were given)
    left, right, lazy = _scanned_sources(tmp_path, left_t, right_t, 256)
    for how in ("inner", "left"):
        join = Join("t", pa.schema([("a", pa.string()), ("b", pa.int64()), ("row", pa.int64()), ("tag", pa.int64())]),
                    left=left, right=right, left_on=["a", "b"], right_on=["a", "b"], how=how)
        whole = barrier_query(join, lazy).collect(engine="streaming")
        files = {"left": _spill_buckets(left_t, _join_buckets(left_t, buckets), buckets, tmp_path / f"{how}-left", 100),
                 "right": _spill_buckets(right_t, right_ids, buckets, tmp_path / f"{how}-right", 100)}
        assert 3 in files["left"] and 3 not in files["right"]
        stub = stub_join(join, left_t.schema, right_t.schema)
        outs = [join_bucket((stub, files["left"].get(b, []), files["right"].get(b, []),
                             str(tmp_path / f"{how}-out-{b}.parquet"), None)) for b in range(buckets)]
        split = pl.concat([pl.read_parquet(o["file"]) for o in outs])
        order = ["row", "tag"]
        assert split.sort(order, nulls_last=True).equals(whole.sort(order, nulls_last=True)), how
        assert whole.height > 0 and whole["tag"].null_count() == (whole.height - split.filter(pl.col("tag").is_not_null()).height)
        assert sum(o["rows"] for o in outs) == split.height
        if how == "left":
            assert split.filter(pl.col("a").is_null()).height == sum(k is None for k in lk)  # null keys kept


def test_a_spill_is_read_memory_mapped_and_holds_no_file_open(tmp_path):
    """`read_spill` of an IPC spill maps the file and closes it: the rows are the file's pages, not a heap
    copy (Arrow's pool does not grow), they stay readable after the file is closed and removed, and
    reading 300 parts (a shard's task maps one per upstream task) leaves no descriptor open."""
    import os

    from datakit.engines.local.spill import IpcSpill, read_spill

    t = pa.table({"doc_id": [f"d{i}" for i in range(2_000)], "text": ["x" * 500] * 2_000})
    paths = []
    for i in range(300):
        paths.append(str(tmp_path / f"part-{i}.arrows"))
        w = IpcSpill(paths[-1], t.schema)
        for batch in t.slice(0, 10 if i else 2_000).to_batches(max_chunksize=500):
            w.write_batch(batch)
        w.close()
    fds = len(os.listdir("/proc/self/fd"))
    pool = pa.default_memory_pool().bytes_allocated()
    tables = [read_spill(p) for p in paths]
    assert len(os.listdir("/proc/self/fd")) == fds
    assert pa.default_memory_pool().bytes_allocated() - pool < t.nbytes // 4  # (the first part alone: ~1 MB)
    for p in paths:
        os.remove(p)
    assert tables[0].equals(t) and tables[1].equals(t.slice(0, 10))
