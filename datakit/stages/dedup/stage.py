"""The `dedup` stage: exact duplicates, then MinHash-LSH near duplicates, as plan nodes only.

    {kind: dedup, exact: true, minhash: {threshold: 0.8, num_perm: 128, ngram: 5}}

Why plan nodes and no engine code: the same stage must give byte-identical
output on the local engine and on Spark, for any partitioning. Every decision
is a pure function of content and `doc_id`:

exact   text -> 128-bit content key (`text.exact_keys`) -> Aggregate min(doc_id)
        per key -> Join back -> rows whose doc_id is not the minimum are dropped
        with `_drop="exact_duplicate"`, `_drop_detail=<kept doc_id>`. With minhash
        on, the key comes from the signature pass (`_KeySigFn`) and the final near
        pass drops exact duplicates before any near verdict: the records are
        marked in one pass, not two.
near    text -> signature (`minhash.minhash_signatures`) -> one row per LSH band
        (band, bucket = `lsh.band_hashes`, doc_id) -> Aggregate min(doc_id) per
        bucket -> Join back -> candidate edges (doc, bucket minimum) -> distinct ->
        both ends joined (`right_prefix`) -> verification (signature or exact
        Jaccard >= threshold) ->
        ConnectedComponents (component = smallest doc_id) -> Join back -> every
        member other than the component's smallest doc_id is dropped with
        `_drop="near_duplicate"`, `_drop_detail=<kept doc_id>`.

Chains: components are the transitive closure of verified edges. A~B and B~C
put A, B, C in one cluster even if A and C are far apart; the cluster keeps the
smallest id only. Verification guarantees each link of such a chain is a real
near-duplicate pair; it does not bound the chain's length (see docs/dedup.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, model_validator

from datakit.plan import DROP, DROP_DETAIL, DROP_STATE, METRICS, Rel, metrics_column
from datakit.stages.base import CompileContext, StageConfig, register_stage
from datakit.stages.dedup.lsh import band_hashes, optimal_param
from datakit.stages.dedup.minhash import MAX_HASH, minhash_signatures
from datakit.stages.dedup.text import exact_keys
from datakit.stages.texts import record_texts, text_columns
from datakit.stages.dedup.verify import exact_jaccard, signature_jaccard

# internal column names (prefixed so they never clash with a record field)
_KEY, _KEEP, _SIG, _BAND, _BUCKET, _MIN = "_dk_key", "_dk_keep", "_dk_sig", "_dk_band", "_dk_bucket", "_dk_min"
_XKEEP = "_dk_xkeep"  # the exact duplicate group's kept doc_id, when exact and near are marked in one pass
_SRC, _DST = "_dk_src__", "_dk_dst__"  # prefixes of a verified pair's two ends (Join.right_prefix)
_XK = "_dk_xk__"  # prefix of the exact keeper's own near-duplicate decision (Join.right_prefix)
_SIZE = "_dk_size"
_ROWS = "_dk_rows"  # records carrying a doc_id (the contracts say one)


class MinHashConfig(BaseModel):
    """Near-duplicate settings. `bands`/`rows` override datasketch's choice for `threshold`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(0.8, gt=0.0, le=1.0, description="Jaccard similarity at or above which docs are duplicates")
    num_perm: int = Field(128, ge=2, le=1024)
    ngram: int = Field(5, ge=1, le=64, description="shingle size in words or characters")
    shingle: Literal["token", "word", "char"] = Field(
        "token", description="token: identifier runs (code); word: whitespace-separated; char: code points")
    seed: int = Field(1, ge=0, lt=2**32, description="permutation seed (datasketch's MinHash seed)")
    lowercase: bool = False
    bands: int | None = Field(None, ge=1)
    rows: int | None = Field(None, ge=1)
    weights: tuple[float, float] | None = Field(
        None, description="(false positive, false negative) weights of the band/row choice; "
                          "default (0.05, 0.95) when pairs are verified, else datasketch's (0.5, 0.5)")
    verify: Literal["none", "signature", "exact"] = Field(
        "exact", description="check candidate pairs before clustering: none, estimated or exact Jaccard")
    drop_rule: Literal["similar_to_kept", "component"] = Field(
        "similar_to_kept",
        description="drop a cluster member only if it is itself similar to the kept doc, or drop every non-kept member")

    @model_validator(mode="after")
    def _check_bands(self) -> "MinHashConfig":
        if (self.bands is None) != (self.rows is None):
            raise ValueError("set both bands and rows, or neither")
        if self.bands is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands*rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        if self.drop_rule == "similar_to_kept" and self.verify == "none":
            raise ValueError("drop_rule similar_to_kept needs verify: signature or exact (or use drop_rule: component)")
        if self.weights is not None and (abs(sum(self.weights) - 1.0) > 1e-9 or min(self.weights) < 0):
            raise ValueError("weights (false positive, false negative) must be >= 0 and sum to 1")
        return self

    def band_rows(self) -> tuple[int, int]:
        """(bands, rows): the override, or datasketch `MinHashLSH`'s optimum for the threshold."""
        if self.bands is not None:
            return self.bands, self.rows
        return optimal_param(self.threshold, self.num_perm, *self.effective_weights())

    def effective_weights(self) -> tuple[float, float]:
        """Why recall-heavy by default: a verified false positive costs one Jaccard check, a false
        negative is a duplicate left in the data (see docs/dedup.md for the measured trade-off)."""
        if self.weights is not None:
            return tuple(self.weights)
        return (0.5, 0.5) if self.verify == "none" else (0.05, 0.95)


@register_stage
class DedupConfig(StageConfig):
    """Remove exact and near-duplicate records, keeping the smallest `doc_id` of each group."""

    kind: Literal["dedup"] = "dedup"
    exact: bool = True
    exact_normalize: Literal["whitespace", "none"] = "whitespace"
    minhash: MinHashConfig | None = None
    scope: Literal["kind", "all"] = Field("kind", description="compare records of the same kind only, or all")
    text_column: str | None = Field(None, description="dedup this string column instead of the record text")
    history: bool | None = Field(None, description="append mode: also drop duplicates of documents kept in earlier "
                                                   "snapshots (default there: true; docs/scheduling.md)")

    reads = ("segments", "doc_id")  # the text and the kept record's key

    @model_validator(mode="after")
    def _does_something(self) -> "DedupConfig":
        """`exact: false` and no `minhash` removed nothing without a word (found in review)."""
        if not self.exact and self.minhash is None:
            raise ValueError("exact: false and no minhash block: this stage would remove nothing; set exact: true "
                             "or add minhash: {threshold: 0.8}")
        return self

    def columns_read(self) -> tuple[str, ...]:
        """A named `text_column` is read instead of the record's segments."""
        return (self.text_column or "segments", "doc_id")

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        schema = rel.schema
        scope = "kind" if self.scope == "kind" and "kind" in schema.names else None
        if self.history and ctx.history is None:
            raise ValueError("history: true needs output mode: append (a dataset of snapshots)")
        keeps_state = ctx.history is not None and self.history is not False  # append mode: a state for later runs
        check = None
        if ctx.history and self.history is not False:
            rel, check = self._compile_history(rel, ctx, scope)
        if self.minhash is None:
            return _compile_exact(rel, self.text_column, self.exact_normalize, scope) if self.exact else rel
        exact = (self.exact_normalize, scope) if self.exact else None
        return _compile_near(rel, self.text_column, self.minhash, scope, keeps_state, check, exact)

    def _compile_history(self, rel: Rel, ctx: CompileContext, scope: str | None):
        """Drop duplicates of the history's kept documents first (datakit.stages.dedup.history)."""
        from datakit.stages.dedup import history as h

        read: dict[str, list[str]] = {}  # the state files this run's decisions depend on, by content
        if self.exact:
            files = h.history_files(ctx.history, "exact", self)
            read["exact"] = [sha or path for path, sha in files]
            if files:
                rel = h.compile_exact_history(rel, files, _ExactKeyFn(self.text_column, self.exact_normalize, scope))
        m, check = self.minhash, None
        if m is not None:
            verify = "exact" if m.verify == "exact" else "signature"
            bands_f = h.history_files(ctx.history, "bands", self)
            side = h.history_files(ctx.history, "texts" if verify == "exact" else "signatures", self)
            read["bands"], read["side"] = [sha or p for p, sha in bands_f], [sha or p for p, sha in side]
            if bands_f and side:
                bands, rows = m.band_rows()
                sig_fn = _SignatureFn(self.text_column, m, scope)
                check = h.HistVerify(sig_fn, m.num_perm, side, verify, m.threshold)
                rel = h.compile_near_history(rel, bands_f, sig_fn, _BandFn(m.num_perm, bands, rows, scope), check)
        # in the config hash, so the resume of a killed run (its work folder, its finished shards) is refused
        # once the history changed under it: found in review, a day killed mid-run, then another day
        # committed, then the first resumed, reused tasks deduplicated against the old history and put 293
        # duplicate pairs in the union
        ctx.record("history", read)
        return rel, check


# --------------------------------------------------------------------------- batch functions (picklable)

_PROVENANCE = ("_source_file", "_source_line")


def _with_columns(batch: pa.RecordBatch, names: list[str], cols: list[pa.Array]) -> pa.RecordBatch:
    """`batch` plus columns, minus the engine's input provenance columns.

    Why drop provenance: a record's identity is its doc_id; the local engine's
    Parquet source appends `_source_file`/`_source_line`, which the declared
    schema does not have (and which would make its spill writer fail).
    """
    keep = [i for i, n in enumerate(batch.schema.names) if n not in _PROVENANCE]
    arrays = [batch.column(i) for i in keep] + cols
    return pa.RecordBatch.from_arrays(arrays, names=[batch.schema.names[i] for i in keep] + names)


@dataclass(frozen=True)
class _ExactKeyFn:
    text_column: str | None
    normalize: str
    scope: str | None

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        keys = self.keys(batch, record_texts(batch, self.text_column))
        return pa.RecordBatch.from_arrays([batch.column("doc_id"), keys], names=["doc_id", _KEY])

    def keys(self, batch: pa.RecordBatch, texts: pa.Array) -> pa.Array:
        """The key column of `batch`, whose record texts are `texts`."""
        return exact_keys(texts, self.normalize, batch.column(self.scope) if self.scope else None)


@dataclass(frozen=True)
class _MarkFn:
    """Drop rows whose `keep_col` names another doc: reason `reason`, detail = the kept doc_id."""

    keep_col: str
    reason: str
    size_col: str | None = None  # cluster size, set on the kept doc of each cluster only
    state: object | None = None  # append mode: history.DropState, the dropped rows' `_drop_state`
    history: object | None = None  # append mode with history: history.HistVerify (history first)
    exact_col: str | None = None  # exact duplicates' kept doc: they are dropped first, as exact_duplicate
    # the exact keeper's own near decision: an exact duplicate names the document that stays (found in
    # review: c named its group's keeper b, which was itself dropped as a near duplicate of a)
    exact_keep_col: str | None = None

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        doc = batch.column("doc_id")
        drop, detail, loser = _loser_marks(doc, batch.column(self.keep_col), self.reason)
        if self.history is not None:
            from datakit.stages.dedup.history import history_decision

            drop, detail = history_decision(batch, drop, detail, self.history)
            loser = pc.is_valid(drop)
        if self.exact_col is not None:  # an exact duplicate was never clustered: its exact verdict stands
            x_drop, x_detail, x_loser = _loser_marks(doc, batch.column(self.exact_col), "exact_duplicate")
            if self.exact_keep_col is not None:  # named: what its keeper stays as (itself, or the doc it went to)
                final = pc.coalesce(batch.column(self.exact_keep_col), batch.column(self.exact_col)).cast(pa.string())
                x_detail = pc.if_else(x_loser, final, pa.scalar(None, pa.string()))
            drop, detail = pc.if_else(x_loser, x_drop, drop), pc.if_else(x_loser, x_detail, detail)
            loser = pc.and_(pc.invert(x_loser), pc.fill_null(loser, False))
        names, cols = [DROP, DROP_DETAIL], [drop, detail]
        counts = _size_counts(batch.column(self.size_col)) if self.size_col is not None else {}
        if _ROWS in batch.schema.names:  # found in review: a re-delivered file's identical rows both stayed
            shared = pc.sum(pc.cast(pc.greater(pc.fill_null(batch.column(_ROWS), 1), 1), pa.int64())).as_py() or 0
            if shared:
                counts["records_sharing_a_doc_id"] = int(shared)
        if self.size_col is not None or _ROWS in batch.schema.names:
            names.append(METRICS)
            cols.append(metrics_column(batch.num_rows, counts))
        if self.state is not None:
            names.append(DROP_STATE)
            cols.append(self.state(batch, loser))
        return _with_columns(batch, names, cols)


def _losers(doc: pa.Array, keep: pa.Array) -> pa.Array:
    """The rows whose kept doc is another doc_id (a null keeps the row)."""
    return pc.fill_null(pc.and_(pc.is_valid(doc), pc.not_equal(doc, keep)), False)


def _loser_marks(doc: pa.Array, keep: pa.Array, reason: str) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(`_drop`, `_drop_detail`, mask) of `_losers`: reason `reason`, detail = the kept doc_id."""
    loser = _losers(doc, keep)
    drop = pc.if_else(loser, pa.scalar(reason, pa.string()), pa.scalar(None, pa.string()))
    detail = pc.if_else(loser, keep.cast(pa.string()), pa.scalar(None, pa.string()))
    return drop, detail, loser


_SIZE_BUCKETS = ((2, 2, "2"), (3, 9, "3_9"), (10, 99, "10_99"), (100, 999, "100_999"), (1000, 2**62, "1000_plus"))


def _size_counts(sizes: pa.Array) -> dict[str, int]:
    """Counts of clusters by size bucket (sums stay right across batches/engines).

    Why buckets and not the largest size: engine metrics are summed counters; a
    count in `near_cluster_size_1000_plus` is the alarm for a runaway cluster, and
    `report.clusters()` names the largest ones exactly from the drop log.
    """
    v = pc.fill_null(sizes, 0).to_numpy(zero_copy_only=False)
    counts = {f"near_cluster_size_{name}": int(np.count_nonzero((v >= lo) & (v <= hi))) for lo, hi, name in _SIZE_BUCKETS}
    counts = {k: n for k, n in counts.items() if n}
    if counts:
        counts["near_clusters"] = sum(counts.values())
    return counts


@dataclass(frozen=True)
class _DecisionFn:
    """Per cluster node: (src=node, kept doc, cluster size on the kept doc's row only).

    `verdict` (similar_to_kept) is the verified member->kept pair: null for the
    kept doc itself, dst == src when the member was not similar (kept).
    """

    rule: str
    carry: tuple[str, ...] = ()  # columns passed through (the cluster's history document)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        node, comp, size = batch.column("node"), batch.column("component"), batch.column(_SIZE)
        is_rep = pc.equal(node, comp)
        keep = comp if self.rule == "component" else pc.coalesce(batch.column("dst"), node)
        rep_size = pc.if_else(pc.and_(is_rep, pc.greater(size, 1)), size, pa.scalar(None, pa.int64()))
        return pa.RecordBatch.from_arrays([node, keep, rep_size] + [batch.column(c) for c in self.carry],
                                          names=["src", _KEEP, _SIZE, *self.carry])

    def spark_select(self, df, F):
        """The same in Spark SQL (`MapBatches`): a null in the condition gives a null size, as above."""
        keep = F.col("component") if self.rule == "component" else F.coalesce(F.col("dst"), F.col("node"))
        size = F.when((F.col("node") == F.col("component")) & (F.col(_SIZE) > 1), F.col(_SIZE))
        return df.select(F.col("node").alias("src"), keep.alias(_KEEP), size.alias(_SIZE), *self.carry)


@dataclass(frozen=True)
class _SignatureFn:
    """(doc_id, scope, signature as little-endian bytes) per record."""

    text_column: str | None
    cfg: MinHashConfig
    scope: str | None

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return self.with_signatures(batch, record_texts(batch, self.text_column))

    def with_signatures(self, batch: pa.RecordBatch, texts: pa.Array) -> pa.RecordBatch:
        """(doc_id, [scope], signature) of `batch`, whose record texts are `texts`."""
        c = self.cfg
        sig = minhash_signatures(texts, c.num_perm, c.seed, c.ngram, c.shingle, c.lowercase)
        width = sig.shape[1] * 4
        blob = pa.py_buffer(np.ascontiguousarray(sig, dtype="<u4").tobytes())
        offsets = pa.py_buffer((np.arange(len(sig) + 1, dtype=np.int32) * width).tobytes())
        sig_col = pa.Array.from_buffers(pa.binary(), len(sig), [None, offsets, blob])
        names, cols = ["doc_id", _SIG], [batch.column("doc_id"), sig_col]
        if self.scope:
            names.insert(1, self.scope)
            cols.insert(1, batch.column(self.scope))
        return pa.RecordBatch.from_arrays(cols, names=names)


def _sig_matrix(col: pa.Array | pa.ChunkedArray, num_perm: int) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if len(col) == 0:
        return np.zeros((0, num_perm), dtype=np.uint32)
    bufs = col.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int32, count=col.offset + len(col) + 1)[col.offset:]
    data = np.frombuffer(bufs[2], dtype="<u4", count=(int(offs[-1])) // 4)
    start = int(offs[0]) // 4
    return data[start : start + len(col) * num_perm].reshape(len(col), num_perm)


@dataclass(frozen=True)
class _BandFn:
    """One row per (document, band): the LSH buckets as a relation. Empty documents get none."""

    num_perm: int
    bands: int
    rows: int
    scope: str | None
    exact_col: str | None = None  # exact duplicates (kept doc is another doc_id) get no bands either

    def keys(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        """(row indices of the non-empty documents, their (n, bands) int64 bucket keys)."""
        sig = _sig_matrix(batch.column(_SIG), self.num_perm)
        banded = ~np.all(sig == MAX_HASH, axis=1)
        if self.exact_col is not None:
            banded &= ~_losers(batch.column("doc_id"), batch.column(self.exact_col)).to_numpy(zero_copy_only=False)
        idx = np.nonzero(banded)[0]
        keys = band_hashes(sig[idx], self.bands, self.rows)
        if self.scope:  # fold the scope into the bucket so different kinds never share one
            import xxhash

            salt = np.array([xxhash.xxh64_intdigest((s or "").encode()) for s in batch.column(self.scope).take(pa.array(idx, pa.int64())).to_pylist()],
                            dtype=np.uint64).view(np.int64)
            keys = keys ^ salt[:, None]
        return idx, keys

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        idx, keys = self.keys(batch)
        doc = batch.column("doc_id").take(pa.array(np.repeat(idx, self.bands)))
        band = pa.array(np.tile(np.arange(self.bands, dtype=np.int32), len(idx)))
        return pa.RecordBatch.from_arrays([doc, band, pa.array(keys.reshape(-1))], names=["doc_id", _BAND, _BUCKET])


@dataclass(frozen=True)
class _PairsFn:
    """(src, dst) = (column `a`, column `b`), rows where they are equal left out (a derived relation, not
    records): LSH edges (doc, bucket minimum) and component members (member, kept doc)."""

    a: str
    b: str

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        a, b = batch.column(self.a), batch.column(self.b)
        keep = pc.fill_null(pc.not_equal(a, b), False)
        return pa.RecordBatch.from_arrays([a.filter(keep), b.filter(keep)], names=["src", "dst"])

    def spark_select(self, df, F):
        """The same in Spark SQL (`MapBatches`): `where` drops a null comparison, as fill_null(False) does.
        Why: the LSH edges are the band rows (1M at 100k quickstart events) filtered; through Python
        they crossed to a worker and back for a comparison."""
        return df.where(F.col(self.a) != F.col(self.b)).select(F.col(self.a).alias("src"), F.col(self.b).alias("dst"))


def _end(batch: pa.RecordBatch, prefix: str) -> pa.RecordBatch:
    """One end of a joined pair: the columns `prefix + name`, named `name` again."""
    idx = [i for i, n in enumerate(batch.schema.names) if n.startswith(prefix)]
    return pa.RecordBatch.from_arrays([batch.column(i) for i in idx],
                                      names=[batch.schema.names[i][len(prefix):] for i in idx])


@dataclass(frozen=True)
class _VerifyFn:
    """Pairs (src, dst) with both ends' records (exact) or signatures joined: Jaccard >= threshold?

    Each end arrives under its own column prefix (`_SRC`, `_DST`; `Join.right_prefix`), so one
    relation is joined to both ends with no pass in between. A rejected pair is emitted as the
    self loop (src, src) instead of vanishing: the node then is its own singleton component
    (kept), and every batch keeps a row to carry the counters.
    """

    cfg: MinHashConfig
    text_column: str | None
    counters: tuple[str, str] = ("candidate_pairs", "verified_pairs")

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        c = self.cfg
        a, b = _end(batch, _SRC), _end(batch, _DST)
        if c.verify == "signature":
            sim = signature_jaccard(_sig_matrix(a.column(_SIG), c.num_perm), _sig_matrix(b.column(_SIG), c.num_perm))
        else:
            sim = exact_jaccard(record_texts(a, self.text_column), record_texts(b, self.text_column),
                                c.ngram, c.shingle, c.lowercase)
        ok = sim >= c.threshold
        src = batch.column("src")
        dst = pc.if_else(pa.array(ok), batch.column("dst"), src)
        total, passed = self.counters
        metrics = metrics_column(batch.num_rows, {total: batch.num_rows, passed: int(np.count_nonzero(ok))})
        return pa.RecordBatch.from_arrays([src, dst, metrics], names=["src", "dst", METRICS])


# --------------------------------------------------------------------------- compilation

def _compile_exact(rel: Rel, text_column: str | None, normalize: str, scope: str | None) -> Rel:
    """Exact duplicates: every record's key (its normalized text); the smallest doc_id per key is kept.

    Why the keys are a narrow (doc_id, key) table joined back, not a column appended to the records:
    on Spark a function that returns whole records ships every record to Python and back and
    persists the copy. Measured at 100k quickstart events, `local[2]`: the key step took 12.4 s
    that way and 2.0-2.4 s this way (it reads only the text columns, `reads=`); the marking step
    that joins the keys back went from 5.05 s to 4.9-7.4 s. On the local engine the key step reads
    only those columns of the spill; the extra pass cost the local dedup stage ~0.9 s of ~15 s.

    Records that share a doc_id (the contracts forbid it; user Parquet may still bring it) are
    judged together, so the join back by doc_id cannot multiply them: they are dropped only if
    every one of them duplicates a smaller doc_id (`max` of their keeps). A unique text is never
    dropped because of its twin; a twin that is a copy then stays for near dedup to judge.
    """
    keys = rel.map_batches(_ExactKeyFn(text_column, normalize, scope),
                           pa.schema([rel.schema.field("doc_id"), pa.field(_KEY, pa.string())]), name="dedup_exact_key",
                           reads=_text_reads(rel.schema, text_column, scope))
    joined = rel.join(_kept_of_keys(keys), "doc_id", how="left")
    return joined.map_batches(_MarkFn(_XKEEP, "exact_duplicate"), rel.schema, name="dedup_exact", drop_log_key="doc_id")


def _texts_read(schema: pa.Schema, text_column: str | None) -> list[str]:
    """The columns `record_texts(batch, text_column)` reads."""
    return text_columns(schema.names, [text_column] if text_column else None)


def _text_reads(schema: pa.Schema, text_column: str | None, scope: str | None) -> tuple[str, ...]:
    """The columns a key or signature pass reads: doc_id, the texts, the scope."""
    return ("doc_id", *_texts_read(schema, text_column), *((scope,) if scope else ()))


def _kept_of_keys(keys: Rel) -> Rel:
    """(doc_id, _XKEEP): the smallest doc_id of each record's exact key (the max over a doc_id's twins)."""
    groups = keys.aggregate([_KEY], {_XKEEP: ("min", "doc_id")})
    # and how many records carry each doc_id: more than one is counted (`records_sharing_a_doc_id`)
    return keys.join(groups, _KEY, how="inner").aggregate(["doc_id"], {_XKEEP: ("max", _XKEEP),
                                                                      _ROWS: ("count", "doc_id")})


@dataclass(frozen=True)
class _KeySigFn:
    """Exact key and MinHash signature in one pass over the texts: (doc_id, key, [scope], signature)."""

    key: _ExactKeyFn
    sig: _SignatureFn

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        texts = record_texts(batch, self.sig.text_column)  # built once for both
        g = self.sig.with_signatures(batch, texts)
        return pa.RecordBatch.from_arrays([g.column(0), self.key.keys(batch, texts), *g.columns[1:]],
                                          names=["doc_id", _KEY, *g.schema.names[1:]])


def _compile_near(rel: Rel, text_column: str | None, cfg: MinHashConfig, scope: str | None,
                  keeps_state: bool = False, history: object | None = None,
                  exact: tuple[str, str | None] | None = None) -> Rel:
    """Near duplicates; with `exact` ((normalize, scope) of the exact keys), exact duplicates too.

    Why exact and near are marked in one final pass: a pass of its own over the records (join the
    exact verdicts, drop, materialize) was the dedup stage's second most expensive step on Spark
    (5.1-7.3 s at 100k quickstart events). Now the exact key and the signature come from one pass
    over the texts, an exact duplicate gets no LSH bands (so it is never clustered, as when it was
    dropped first), and the final pass drops it as `exact_duplicate` before any near verdict.
    """
    schema = rel.schema
    bands, rows = cfg.band_rows()
    sig_fn = _SignatureFn(text_column, cfg, scope)
    doc_fields = [schema.field("doc_id")] + ([schema.field(scope)] if scope else []) + [pa.field(_SIG, pa.binary())]
    band_schema = pa.schema([schema.field("doc_id"), pa.field(_BAND, pa.int32()), pa.field(_BUCKET, pa.int64())])
    kept = None
    if exact is None:
        docs = rel.map_batches(sig_fn, pa.schema(doc_fields), name="dedup_minhash")
        banded = docs.map_batches(_BandFn(cfg.num_perm, bands, rows, scope), band_schema, name="dedup_lsh_bands")
    else:
        key_fn = _ExactKeyFn(text_column, exact[0], exact[1])
        docs = rel.map_batches(_KeySigFn(key_fn, sig_fn), pa.schema(doc_fields[:1] + [pa.field(_KEY, pa.string())] + doc_fields[1:]),
                               name="dedup_keys", reads=_text_reads(schema, text_column, scope))
        kept = _kept_of_keys(docs)
        banded = docs.join(kept, "doc_id", how="left").map_batches(
            _BandFn(cfg.num_perm, bands, rows, scope, _XKEEP), band_schema, name="dedup_lsh_bands")
    buckets = banded.aggregate([_BAND, _BUCKET], {_MIN: ("min", "doc_id")})
    cand = banded.join(buckets, [_BAND, _BUCKET], how="inner")
    edge_schema = pa.schema([pa.field("src", pa.string()), pa.field("dst", pa.string())])
    edges = cand.map_batches(_PairsFn("doc_id", _MIN), edge_schema, name="dedup_lsh_edges")
    edges = edges.aggregate(["src", "dst"], {"_dk_n": ("count", "src")})  # one row per distinct pair
    state = None
    if keeps_state:  # the dropped duplicates' band keys, for the next snapshots' state (dedup/history.py)
        from datakit.stages.dedup.history import DropState

        state = DropState(_SignatureFn(text_column, cfg, scope), _BandFn(cfg.num_perm, bands, rows, scope))
    if cfg.verify == "none":
        return _mark_clusters(rel, edges.connected_components(), None, state, history, kept)
    side = rel if cfg.verify == "exact" else docs  # where a doc's text (its record) or signature comes from
    # what _VerifyFn reads of each end: the text columns (record_texts) or the signature
    side_cols = _texts_read(schema, text_column) if cfg.verify == "exact" else [_SIG]
    reads = ("src", "dst", *(p + c for p in (_SRC, _DST) for c in side_cols))

    def verified(pairs: Rel, name: str, counters: tuple[str, str]) -> Rel:
        """Why both ends are joined with a prefix and read in one pass: on Spark every pass over the
        joined pairs is a job, a Python round trip and a checkpoint; a first pass that only set the
        src end's text aside (so the dst join would not drop it as a clashing column) cost 3.8 s and
        1.9 s of the dedup stage at 100k quickstart events."""
        pairs = pairs.join(side, "src", "doc_id", how="inner", right_prefix=_SRC)
        pairs = pairs.join(side, "dst", "doc_id", how="inner", right_prefix=_DST)
        return pairs.map_batches(_VerifyFn(cfg, text_column, counters), edge_schema, name=name, reads=reads)

    comps = verified(edges, "dedup_verify", ("candidate_pairs", "verified_pairs")).connected_components()
    verdict = None
    if cfg.drop_rule == "similar_to_kept":
        # a member is dropped only if it is itself similar to the kept (smallest) doc of its component;
        # the others stay (chain ends). Rejected pairs come back as (src, src), i.e. "keep".
        members = comps.map_batches(_PairsFn("node", "component"), edge_schema, name="dedup_members")
        verdict = verified(members, "dedup_verify_kept", ("cluster_members", "members_similar_to_kept"))
        # one verdict per node. Records that share a doc_id (the contracts forbid it; user Parquet may
        # still bring it) are each joined to the member pair, so the node had one verdict per record,
        # and the joins below multiplied its rows (an AccountingError). `max` keeps the node if any of
        # them is not similar to the kept doc (dst == src > the component's smallest id), so a unique
        # text is never dropped because of its twin. Without twins this is one row per node already.
        verdict = verdict.aggregate(["src"], {"dst": ("max", "dst")})
    return _mark_clusters(rel, comps, verdict, state, history, kept)


def _mark_clusters(rel: Rel, comps: Rel, verdict: Rel | None, state: object | None = None,
                   history: object | None = None, exact: Rel | None = None) -> Rel:
    """Drop cluster members: all but the component's smallest id, or (with `verdict`) those similar to it;
    with `exact` ((doc_id, _XKEEP) of every record), exact duplicates first.

    Cluster sizes ride along to the final marking, which counts them once per kept doc.
    """
    carry: tuple[str, ...] = ()
    out_schema = rel.schema
    if history is None:
        sizes = comps.aggregate(["component"], {_SIZE: ("count", "node")})
    else:  # with each cluster's smallest history document (of its members' `_dk_hrep`), in the same pass
        from datakit.stages.dedup.history import HCOMP, HREP, Project

        out_schema = pa.schema([f for f in rel.schema if f.name != HREP])
        reps = rel.map_batches(Project(("doc_id", HREP)), pa.schema([rel.schema.field("doc_id"), rel.schema.field(HREP)]),
                               name="dedup_history_reps")
        sizes = comps.join(reps, "node", "doc_id", how="inner").aggregate(
            ["component"], {_SIZE: ("count", "node"), HCOMP: ("min", HREP)})
        carry = (HCOMP,)
    nodes = comps.join(sizes, "component", how="inner")
    if verdict is not None:
        nodes = nodes.join(verdict, "node", "src", how="left")
    decision_schema = pa.schema([pa.field("src", pa.string()), pa.field(_KEEP, pa.string()), pa.field(_SIZE, pa.int64())]
                                + [pa.field(c, pa.string()) for c in carry])
    rule = "component" if verdict is None else "similar_to_kept"
    decided = nodes.map_batches(_DecisionFn(rule, carry), decision_schema, name="dedup_decided")
    if exact is None:
        marked = rel.join(decided, "doc_id", "src", how="left")
    else:  # both verdicts joined to each other first (narrow), so the records are joined once
        verdicts = exact.join(decided, "doc_id", "src", how="left")
        if history is None:  # (with history, a keeper's verdict against the history is made in the final pass)
            verdicts = verdicts.join(decided, _XKEEP, "src", how="left", right_prefix=_XK)
        marked = rel.join(verdicts, "doc_id", how="left")
    fn = _MarkFn(_KEEP, "near_duplicate", _SIZE, state, history, _XKEEP if exact is not None else None,
                 _XK + _KEEP if exact is not None and history is None else None)
    return marked.map_batches(fn, out_schema, name="dedup_near", drop_log_key="doc_id", drop_state=state is not None)
