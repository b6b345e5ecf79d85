"""Dedup against a dataset's history (append mode): the state, and the lookups that read it.

State (per snapshot, written with it under `_snapshots/<ID>/_dedup_state/`, listed in the top manifest
with `layout: 2`, so it is versioned and rolled back with the snapshot; schemas/output_layout.md):

    exact.parquet       _dk_key (the exact content key, `text.exact_keys`), _dk_hist     sorted by _dk_key
    bands.parquet       _dk_bucket, _dk_band, _dk_hist, _dk_via                          sorted by _dk_bucket
    signatures.parquet  _dk_hist, _dk_hsig (MinHash signature, little-endian uint32)     sorted by _dk_hist
    texts.parquet       _dk_hist, _dk_htext (dedup text; `verify: exact` only)           sorted by _dk_hist

`_dk_hist` is a kept document as `{"doc_id": ..., "snapshot": ...}` (canonical JSON): the drop log's
detail of a document dropped as `exact_duplicate_of_history` / `near_duplicate_of_history`.

Why the band keys of *dropped* near duplicates too (`_dk_via` set; null on a kept document's own
rows): a single run over all days clusters by connected components, so a document reaches a kept
document through a chain of near duplicates (A kept, B ~ A dropped, C ~ B). With only the kept
documents' keys, C would have to share an LSH bucket with A itself, and the history would miss what
one run finds. So the run that drops B writes B's band keys (`_dropped_state/`, datakit.plan), and
the state maps them to B's kept document A: C meets A through B's buckets, and is then checked
against A itself (verification), as the single run's `similar_to_kept` rule does. `_dk_via` holds
digests of B's lineage (`forget.lineage_digests`), so forgetting B removes B's keys; forgetting A
removes every row mapped to A. The state is a pure function of the snapshot's committed records and
its `_dropped_state/` (both byte-identical on every engine), so both engines write the same bytes.

History first, inside the day too: the near lookup (`HistNearFn`) does not drop; it marks each
record with the history document it is a verified near duplicate of (`_dk_hrep`). The day's own
clustering (stage.py `_mark_clusters`) then gives every cluster that holds a marked record the
smallest marked history document (`_dk_hcomp`): members similar to it are dropped as
`near_duplicate_of_history`, the others are kept; so a document that reaches the history only
through a document of the same day (B ~ A marked, C ~ B) is dropped as one run over all days drops it.

Why lookups (a MapBatches function reading the state) and not a Source of the state joined in:
a join reads every snapshot's state, so day N would cost a scan of the whole history. Each state
file is sorted by its lookup key and written in small row groups; a batch of today's documents reads,
per file, only the row groups whose min/max statistics can hold one of its keys (footers are cached
per process, keyed by the file's sha256 from the manifest). Day N costs its own input plus those
reads. The function is row-local and a pure function of the batch and immutable files, so both
engines run it unchanged, byte-identical, with no shuffle.
"""
from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datakit.io.fs import InputError
from datakit.plan import DROP, DROP_DETAIL, Rel

LAYOUT = 2  # the state layout this version writes; layout 1 (no `layout` field) is read too
_HIST, _HSIG, _HTEXT, _VIA = "_dk_hist", "_dk_hsig", "_dk_htext", "_dk_via"
HREP, HCOMP = "_dk_hrep", "_dk_hcomp"  # a record's history document; its day cluster's smallest one
_KEY, _SIG, _BAND, _BUCKET = "_dk_key", "_dk_sig", "_dk_band", "_dk_bucket"
STATE_FILES = {"exact": "exact.parquet", "signatures": "signatures.parquet", "bands": "bands.parquet",
               "texts": "texts.parquet"}
TEXT_SCHEMA = pa.schema([(_HIST, pa.string()), (_HTEXT, pa.string())])
EXACT_SCHEMA = pa.schema([(_KEY, pa.string()), (_HIST, pa.string())])
SIG_SCHEMA = pa.schema([(_HIST, pa.string()), (_HSIG, pa.binary())])
BAND_SCHEMA = pa.schema([(_BUCKET, pa.int64()), (_BAND, pa.int32()), (_HIST, pa.string()), (_VIA, pa.string())])
# rows per row group: the unit a lookup reads (small: a day's keys hit few groups of a large state)
ROW_GROUP = {"exact": 1024, "bands": 256, "signatures": 64, "texts": 8}
_SORT = {"exact": [_KEY, _HIST], "bands": [_BUCKET, _BAND, _HIST, _VIA], "signatures": [_HIST], "texts": [_HIST]}


class StateLayoutError(InputError):
    """A snapshot's dedup state has a layout this version cannot read (one line, exit 2)."""


def history_config(stages: list[Any]):
    """The dedup stage whose state an append-mode run keeps (None: no dedup, or `history: false`)."""
    d = next((s for s in stages if s.kind == "dedup"), None)
    return d if d is not None and d.history is not False else None


def state_params(cfg: Any) -> dict[str, Any]:
    """What the state's bytes depend on: a later snapshot refuses a state written under other settings."""
    m = cfg.minhash
    near = None
    if m is not None:
        bands, rows = m.band_rows()
        near = {"num_perm": m.num_perm, "ngram": m.ngram, "shingle": m.shingle, "seed": m.seed,
                "lowercase": m.lowercase, "bands": bands, "rows": rows, "verify": m.verify}
    return {"exact": cfg.exact, "exact_normalize": cfg.exact_normalize, "scope": cfg.scope,
            "text_column": cfg.text_column, "minhash": near}


def hist_id(doc_id: str, snapshot: str) -> str:
    return json.dumps({"doc_id": doc_id, "snapshot": snapshot}, sort_keys=True, separators=(",", ":"))


def _hist_ids(doc_ids: list[str], snapshot: str) -> pa.Array:
    return pa.array([hist_id(d, snapshot) for d in doc_ids], pa.string())


def write_table(t: pa.Table, kind: str, url: str) -> None:
    """A state file: sorted by its lookup key, small row groups, statistics on (same bytes everywhere)."""
    from datakit.io.sinks import write_parquet

    t = t.take(pc.sort_indices(t, [(c, "ascending") for c in _SORT[kind] if c in t.column_names])).combine_chunks()
    write_parquet(t, url, ROW_GROUP[kind])


def _member_rows(snap_path: str, snapshot: str, kept: set[str], bands: int) -> pa.Table:
    """Band rows of the near duplicates this run dropped (`_dropped_state/`), mapped to their kept document."""
    from datakit.io.fs import arrow_filesystem, filesystem

    url = f"{snap_path.rstrip('/')}/_dropped_state/part-00000.parquet"
    fs, p = filesystem(url)
    if not fs.exists(p):
        return BAND_SCHEMA.empty_table()
    log = pq.read_table(p, filesystem=arrow_filesystem(fs), columns=["detail", "state"])
    buckets, band_ix, hists, vias = [], [], [], []
    for detail, state in zip(log.column("detail").to_pylist(), log.column("state").to_pylist()):
        if detail is None or state is None:
            continue
        if detail.startswith("{"):  # dropped as a duplicate of history: detail is the kept document's hist id
            rep = detail
        elif detail in kept:  # dropped in favour of a document of this snapshot (that a later stage kept too)
            rep = hist_id(detail, snapshot)
        else:
            continue
        st = json.loads(state)
        keys = st["keys"]
        if len(keys) != bands:
            raise ValueError(f"snapshot {snapshot}: _dropped_state has {len(keys)} band keys per document, expected {bands}")
        via = " ".join(st.get("via") or [])
        buckets += keys
        band_ix += range(bands)
        hists += [rep] * bands
        vias += [via] * bands
    return pa.table([pa.array(buckets, pa.int64()), pa.array(band_ix, pa.int32()), pa.array(hists, pa.string()),
                     pa.array(vias, pa.string())], schema=BAND_SCHEMA)


def write_state(snap_path: str, snapshot: str, cfg: Any) -> dict[str, Any]:
    """Compute and write the snapshot's dedup state from its committed records and `_dropped_state/`;
    returns the manifest entry."""
    from datakit.io.atomic import sha256_file
    from datakit.io.dataset import read_output
    from datakit.stages.dedup.stage import _BandFn, _SignatureFn
    from datakit.stages.dedup.text import exact_keys
    from datakit.stages.texts import record_texts

    table = read_output(snap_path)
    scope = "kind" if cfg.scope == "kind" and "kind" in table.column_names else None
    root = f"{snap_path.rstrip('/')}/_dedup_state"
    doc_ids = table.column("doc_id").to_pylist() if table.num_rows else []
    hist = _hist_ids(doc_ids, snapshot)
    tables: list[tuple[str, pa.Table]] = []
    if cfg.exact:
        keys = exact_keys(record_texts(table, cfg.text_column), cfg.exact_normalize,
                          table.column(scope).combine_chunks() if scope else None) if table.num_rows else pa.array([], pa.string())
        tables.append(("exact", pa.table([keys, hist], schema=EXACT_SCHEMA)))
    m = cfg.minhash
    if m is not None:
        bands, rows = m.band_rows()
        batch = table.combine_chunks().to_batches()[0] if table.num_rows else None
        if batch is not None:
            docs = _SignatureFn(cfg.text_column, m, scope)(batch)
            idx, keys = _BandFn(m.num_perm, bands, rows, scope).keys(docs)
            sig_t = pa.table([hist, docs.column(_SIG)], schema=SIG_SCHEMA)
            own = pa.table([pa.array(keys.reshape(-1), pa.int64()), pa.array(np.tile(np.arange(bands, dtype=np.int32), len(idx))),
                            hist.take(pa.array(np.repeat(idx, bands), pa.int64())), pa.nulls(len(idx) * bands, pa.string())],
                           schema=BAND_SCHEMA)
        else:
            sig_t, own = SIG_SCHEMA.empty_table(), BAND_SCHEMA.empty_table()
        members = _member_rows(snap_path, snapshot, set(doc_ids), bands)
        band_t = pa.concat_tables([own, members])
        if members.num_rows:  # one row per (key, kept doc, lineage): a dropped copy adds no repeated rows
            band_t = band_t.group_by(BAND_SCHEMA.names, use_threads=False).aggregate([]).select(BAND_SCHEMA.names)
        tables += [("signatures", sig_t), ("bands", band_t)]
        if m.verify == "exact":  # exact Jaccard against history needs the kept documents' dedup texts
            texts = record_texts(table, cfg.text_column) if table.num_rows else pa.array([], pa.string())
            tables.append(("texts", pa.table([hist, texts], schema=TEXT_SCHEMA)))
    files: dict[str, str] = {}
    for kind, t in tables:
        files[kind] = f"_dedup_state/{STATE_FILES[kind]}"
        write_table(t, kind, f"{root}/{STATE_FILES[kind]}")
    return {"layout": LAYOUT, "params": state_params(cfg), "files": files,
            "sha256": {k: sha256_file(f"{snap_path.rstrip('/')}/{v}") for k, v in files.items()}}


def history_files(history: list[dict[str, Any]], kind: str, cfg: Any) -> tuple[tuple[str, str], ...]:
    """(absolute path, sha256) of the history's state files of one kind, in snapshot order.

    Refuses a state written under other settings, or in a layout newer than this version reads.
    Layout 1 (before the band keys of dropped duplicates) is read as it is: its files have the same
    columns; it only lacks those rows, so chains through its dropped documents are not followed."""
    out = []
    want = state_params(cfg)
    for s in history:
        st = s.get("dedup_state")
        if not st:
            continue
        if int(st.get("layout", 1)) > LAYOUT:
            raise StateLayoutError(
                f"snapshot {s['id']}'s dedup state has layout {st['layout']}, newer than this datakit reads "
                f"(layout {LAYOUT}); upgrade datakit to append to this dataset")
        if st["params"] != want:
            raise ValueError(f"snapshot {s['id']}'s dedup state was written with other dedup settings "
                             f"({st['params']}); history dedup needs the same settings in every snapshot")
        if kind in st["files"]:
            out.append((f"{s['root']}/{st['files'][kind]}", st.get("sha256", {}).get(kind, "")))
    return tuple(out)


# --------------------------------------------------------------------------- lookups

# (path, sha256) -> (open file, the local file's identity when opened: `_local_identity`)
_FILES: dict[tuple[str, str], tuple[pq.ParquetFile, tuple[int, int, int] | None]] = {}


def _local_identity(path: str) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of a local file; None for one that is not there or not local.

    Why: the cache outlives a run in a long-lived process (a notebook, a kept pool worker), and a
    state file replaced, damaged or removed since was still served from the handle opened before
    (found when a test's state file, removed, was read from a handle an earlier test left: the
    removal went unnoticed). A local file is checked by one `stat` per lookup; an object-store
    file by its manifest sha256 alone (an object rewritten gets another)."""
    if "://" in path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class DamagedStateError(InputError):
    """A dedup state file of the history is missing or no longer the file its snapshot's commit recorded."""


def _damaged(path: str, sha: str, e: BaseException) -> BaseException:
    """The error to raise for a failed read of state file `path`: a `DamagedStateError` naming the file,
    its snapshot and the way out when the file is gone or its bytes differ from the recorded sha256;
    otherwise `e` itself (a storage fault on an intact file stays a storage fault).

    Why: a damaged state file failed the night with only pyarrow's "Couldn't deserialize thrift" or
    "Parquet magic bytes not found" under the stage's name, no path (found in an operations review)."""
    from datakit.io.atomic import sha256_file

    snapshot = path.split("/_snapshots/", 1)[-1].split("/", 1)[0] if "/_snapshots/" in path else "?"
    how = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if isinstance(e, FileNotFoundError):
        state = "is missing"
    else:
        try:
            if not sha or sha256_file(path) == sha:
                return e
        except OSError:
            return e
        state = "is damaged: its bytes differ from the sha256 its snapshot's commit recorded"
    return DamagedStateError(
        f"dedup state file {path} of snapshot {snapshot} {state} ({how[:200]}); restore it, or rerun snapshot "
        f"{snapshot} from its logs to write it again (docs/scheduling.md)")


def _parquet_file(path: str, sha: str) -> pq.ParquetFile:
    """An open state file, its footer parsed once per process while the file stays the same one. Keyed
    by the manifest's sha256 too: a rerun that rewrote the file under the same path is never served the
    old footer; a local file is also checked by `_local_identity`."""
    now = _local_identity(path)
    cached = _FILES.get((path, sha))
    if cached is not None and cached[1] == now:  # (None == None for an object-store file)
        return cached[0]
    from datakit.io.fs import filesystem

    fs, p = filesystem(path)
    try:
        f = pq.ParquetFile(fs.open(p, "rb"))
    except (OSError, pa.ArrowException) as e:
        raise _damaged(path, sha, e) from None
    if len(_FILES) > 4096:
        _FILES.clear()
    _FILES[(path, sha)] = (f, now)
    return f


def lookup(files: tuple[tuple[str, str], ...], key: str, keys: pa.Array, columns: list[str],
           stats: dict[str, int] | None = None) -> pa.Table:
    """Rows of `files` whose `key` column is in `keys`, reading only the row groups whose min/max
    statistics can hold one of them. `columns` must include `key`. `stats` (optional) counts the
    row groups and rows read and present (benchmarks/incremental.py reports them)."""
    uniq = pc.unique(keys.filter(pc.is_valid(keys)))
    parts = []
    if len(uniq):
        srt = uniq.take(pc.sort_indices(uniq)).to_pylist()
        for path, sha in files:
            pf = _parquet_file(path, sha)
            md = pf.metadata
            j = pf.schema_arrow.get_field_index(key)
            groups = []
            for g in range(md.num_row_groups):
                st = md.row_group(g).column(j).statistics
                if md.row_group(g).num_rows == 0:
                    continue
                if st is None or not st.has_min_max:
                    groups.append(g)
                    continue
                lo = bisect.bisect_left(srt, st.min)
                if lo < len(srt) and srt[lo] <= st.max:
                    groups.append(g)
            if stats is not None:
                for name, n in (("groups_total", md.num_row_groups), ("groups_read", len(groups)),
                                ("rows_total", md.num_rows), ("rows_read", sum(md.row_group(g).num_rows for g in groups))):
                    stats[name] = stats.get(name, 0) + n
            if groups:
                try:
                    t = pf.read_row_groups(groups, columns=columns, use_threads=False)
                except (OSError, pa.ArrowException) as e:  # a page damaged behind an intact footer
                    raise _damaged(path, sha, e) from None
                parts.append(t.filter(pc.is_in(t.column(key), value_set=uniq)))
    if not parts:
        return pa.schema([pa.field(c, _TYPES[c]) for c in columns]).empty_table()
    return pa.concat_tables([p.select(columns).cast(pa.schema([pa.field(c, _TYPES[c]) for c in columns])) for p in parts])


_TYPES = {_KEY: pa.string(), _HIST: pa.string(), _HSIG: pa.binary(), _HTEXT: pa.string(), _BUCKET: pa.int64(),
          _BAND: pa.int32(), _VIA: pa.string()}


# --------------------------------------------------------------------------- batch functions (picklable)

@dataclass(frozen=True)
class DropState:
    """The `_drop_state` of near duplicates dropped in an append-mode run: their band keys and lineage
    digests, so the snapshot's state can map them to the document they were dropped for."""

    sig_fn: Any  # stage._SignatureFn
    band_fn: Any  # stage._BandFn

    def __call__(self, batch: pa.RecordBatch, loser: pa.Array) -> pa.Array:
        from datakit.stages.forget import lineage_digests

        out: list[str | None] = [None] * batch.num_rows
        rows = np.nonzero(pc.fill_null(loser, False).to_numpy(zero_copy_only=False))[0]
        if len(rows) == 0:
            return pa.array(out, pa.string())
        sub = batch.take(pa.array(rows, pa.int64()))
        idx, keys = self.band_fn.keys(self.sig_fn(sub))
        names = sub.schema.names
        src = sub.column("source").to_pylist() if "source" in names else [None] * len(rows)
        meta = sub.column("meta").to_pylist() if "meta" in names else [None] * len(rows)
        for i, k in zip(idx.tolist(), keys.tolist()):
            via = lineage_digests(src[i] if isinstance(src[i], dict) else None, meta[i] if isinstance(meta[i], str) else None)
            out[int(rows[i])] = json.dumps({"keys": k, "via": via}, separators=(",", ":"))
        return pa.array(out, pa.string())


def _marked(batch: pa.RecordBatch, names: tuple[str, ...], reason: str, hit: pa.Array) -> pa.RecordBatch:
    if isinstance(hit, pa.ChunkedArray):
        hit = hit.combine_chunks()
    drop = pc.if_else(pc.is_valid(hit), pa.scalar(reason, pa.string()), pa.scalar(None, pa.string()))
    cols = [batch.column(n) for n in names] + [drop, hit.cast(pa.string())]
    return pa.RecordBatch.from_arrays(cols, names=list(names) + [DROP, DROP_DETAIL])


def _min_per_row(n: int, rows: np.ndarray, hists: list[str]) -> pa.Array:
    best: list[str | None] = [None] * n
    for r, h in zip(rows.tolist(), hists):
        if best[r] is None or h < best[r]:
            best[r] = h
    return pa.array(best, pa.string())


@dataclass(frozen=True)
class HistExactFn:
    """Drop records whose exact key a kept document of the history has (`exact_duplicate_of_history`,
    detail: the smallest such document)."""

    key_fn: Any  # stage._ExactKeyFn
    files: tuple[tuple[str, str], ...]
    names: tuple[str, ...]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        keys = self.key_fn(batch).column(_KEY)
        found = lookup(self.files, _KEY, keys, [_KEY, _HIST])
        best = found.group_by(_KEY, use_threads=False).aggregate([(_HIST, "min")])
        idx = pc.index_in(keys, value_set=best.column(_KEY))
        hit = pc.take(best.column(f"{_HIST}_min"), idx)
        return _marked(batch, self.names, "exact_duplicate_of_history", hit)


@dataclass(frozen=True)
class HistVerify:
    """Is a record similar (>= threshold) to a kept document of the history? Exact Jaccard against the
    kept document's text (`verify: exact`, as one run over all days decides) or the signatures' estimate."""

    sig_fn: Any  # stage._SignatureFn
    num_perm: int
    side_files: tuple[tuple[str, str], ...]  # texts (verify exact) or signatures
    verify: str
    threshold: float

    def similar(self, batch: pa.RecordBatch, rows: np.ndarray, hists: pa.Array,
                docs: pa.RecordBatch | None = None) -> np.ndarray:
        """For each (record `rows[i]`, history document `hists[i]`) pair: similar? (bool array)."""
        from datakit.stages.dedup.stage import _sig_matrix
        from datakit.stages.dedup.verify import exact_jaccard, signature_jaccard
        from datakit.stages.texts import record_texts

        if len(rows) == 0:
            return np.zeros(0, dtype=bool)
        hists = hists.combine_chunks() if isinstance(hists, pa.ChunkedArray) else hists
        take = pa.array(rows, pa.int64())
        if self.verify == "exact":
            side = lookup(self.side_files, _HIST, hists, [_HIST, _HTEXT])
            where = pc.index_in(hists, value_set=side.column(_HIST))
            theirs = pc.fill_null(pc.take(side.column(_HTEXT), where), "")
            c = self.sig_fn.cfg
            sim = exact_jaccard(theirs.combine_chunks() if isinstance(theirs, pa.ChunkedArray) else theirs,
                                record_texts(batch, self.sig_fn.text_column).take(take), c.ngram, c.shingle, c.lowercase)
        else:
            side = lookup(self.side_files, _HIST, hists, [_HIST, _HSIG])
            where = pc.index_in(hists, value_set=side.column(_HIST))
            if not side.num_rows:
                return np.zeros(len(rows), dtype=bool)
            theirs = pc.take(side.column(_HSIG), pc.fill_null(where, 0))
            docs = docs if docs is not None else self.sig_fn(batch)
            sim = signature_jaccard(_sig_matrix(docs.column(_SIG).take(take), self.num_perm),
                                    _sig_matrix(theirs.combine_chunks() if isinstance(theirs, pa.ChunkedArray) else theirs,
                                                self.num_perm))
        return pc.is_valid(where).to_numpy(zero_copy_only=False) & (sim >= self.threshold)


@dataclass(frozen=True)
class HistNearFn:
    """Annotate each record with `_dk_hrep`: the smallest kept document of the history it is similar to
    (verified) among those sharing an LSH bucket with it, directly or through a near duplicate dropped
    in their favour; null if none. The within-day clustering then drops it (`near_duplicate_of_history`)
    together with the day's documents that reach it through it (dedup/stage.py `_mark_clusters`)."""

    sig_fn: Any  # stage._SignatureFn
    band_fn: Any  # stage._BandFn
    band_files: tuple[tuple[str, str], ...]
    check: HistVerify
    names: tuple[str, ...]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        docs = self.sig_fn(batch)
        idx, keys = self.band_fn.keys(docs)
        bands = self.band_fn.bands
        mine = pa.table({"_r": pa.array(np.repeat(idx, bands), pa.int64()), _BUCKET: pa.array(keys.reshape(-1), pa.int64()),
                         _BAND: pa.array(np.tile(np.arange(bands, dtype=np.int32), len(idx)))})
        found = lookup(self.band_files, _BUCKET, mine.column(_BUCKET), [_BUCKET, _BAND, _HIST])
        hit = pa.nulls(n, pa.string())
        if found.num_rows:
            pairs = mine.join(found, [_BUCKET, _BAND], join_type="inner", use_threads=False)
            pairs = pairs.group_by(["_r", _HIST], use_threads=False).aggregate([])
            pairs = pairs.take(pc.sort_indices(pairs, [("_r", "ascending"), (_HIST, "ascending")]))
            rows = pairs.column("_r").to_numpy()
            hists = pairs.column(_HIST)
            ok = self.check.similar(batch, rows, hists, docs)
            hit = _min_per_row(n, rows[ok], [h for h, k in zip(hists.to_pylist(), ok.tolist()) if k])
        return pa.RecordBatch.from_arrays([batch.column(c) for c in self.names] + [hit], names=list(self.names) + [HREP])


# --------------------------------------------------------------------------- compilation

def compile_exact_history(rel: Rel, files: tuple[tuple[str, str], ...], key_fn: Any) -> Rel:
    """Drop documents whose exact key a kept document of the history has (`exact_duplicate_of_history`)."""
    return rel.map_batches(HistExactFn(key_fn, files, tuple(rel.schema.names)), rel.schema,
                           name="dedup_history_exact", drop_log_key="doc_id")


def compile_near_history(rel: Rel, band_files: tuple[tuple[str, str], ...], sig_fn: Any, band_fn: Any,
                         check: HistVerify) -> Rel:
    """`rel` plus `_dk_hrep` (the history document each record is a near duplicate of, or null); the
    within-day clustering drops those records and the day's documents that reach them through them."""
    fn = HistNearFn(sig_fn, band_fn, band_files, check, tuple(rel.schema.names))
    return rel.map_batches(fn, pa.schema(list(rel.schema) + [pa.field(HREP, pa.string())]), name="dedup_history_near")


@dataclass(frozen=True)
class Project:
    """Keep only the named columns (a narrow relation to shuffle)."""

    names: tuple[str, ...]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([batch.column(n) for n in self.names], names=list(self.names))

    def spark_select(self, df, F):
        return df.select(*self.names)


def history_decision(batch: pa.RecordBatch, drop: pa.Array, detail: pa.Array, check: HistVerify
                     ) -> tuple[pa.Array, pa.Array]:
    """The within-day near decision (`drop`, `detail`) with the history first, as one run over all days
    decides: a record similar to a history document (`_dk_hrep`) is dropped in its favour; a record in
    a cluster that reaches the history (`_dk_hcomp`, the smallest history document of the cluster) is
    checked against that document and dropped if similar, else kept (the cluster's kept document is
    the history's, so the day's own decision does not apply)."""
    own = batch.column(HREP)
    comp = batch.column(HCOMP) if HCOMP in batch.schema.names else pa.nulls(batch.num_rows, pa.string())
    own_ok = pc.is_valid(own).to_numpy(zero_copy_only=False)
    in_comp = pc.is_valid(comp).to_numpy(zero_copy_only=False)
    need = np.nonzero(~own_ok & in_comp)[0]
    sim = check.similar(batch, need, comp.take(pa.array(need, pa.int64())))
    hit: list[str | None] = [None] * batch.num_rows
    for i, v in enumerate(own.to_pylist()):
        if v is not None:
            hit[i] = v
    comp_v = comp.to_pylist()
    for i, ok in zip(need.tolist(), sim.tolist()):
        if ok:
            hit[i] = comp_v[i]
    hit_a = pa.array(hit, pa.string())
    ours = pa.array(own_ok | in_comp)
    reason = pa.scalar("near_duplicate_of_history", pa.string())
    new_drop = pc.if_else(pc.is_valid(hit_a), reason, pc.if_else(ours, pa.scalar(None, pa.string()), drop))
    new_detail = pc.if_else(pc.is_valid(hit_a), hit_a, pc.if_else(ours, pa.scalar(None, pa.string()), detail))
    return new_drop, new_detail
