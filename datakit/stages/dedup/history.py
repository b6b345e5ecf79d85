"""Dedup against a dataset's history (append mode): the state of kept documents, and its plan nodes.

State (per snapshot, written with it under `_snapshots/<ID>/_dedup_state/`, listed in the top manifest,
so it is versioned and rolled back with the snapshot):

    exact.parquet       _dk_key (the exact content key, `text.exact_keys`), _dk_hist
    signatures.parquet  _dk_hist, _dk_hsig (MinHash signature, little-endian uint32 bytes)
    bands.parquet       _dk_band, _dk_bucket (the LSH bucket of each band), _dk_hist

`_dk_hist` is the kept document as `{"doc_id": ..., "snapshot": ...}` (canonical JSON): it is the
drop log's detail of a document dropped as `exact_duplicate_of_history` / `near_duplicate_of_history`.
The state is computed from the snapshot's *committed* records (a pure function of its data), so both
engines produce the same state bytes.

Why plan nodes (a `Source` of the state joined into the dedup stage) and not a lookup in driver code:
both engines then execute it, byte-identical, and the cost of a run is a join of today's documents
(their band keys) with the state's band keys -- proportional to today's input plus a scan of the
state, never a recomputation of the history. Verification against history uses the stored signatures
(estimated Jaccard) with `verify: signature`; with `verify: exact` (the default) the state also keeps
the kept documents' dedup texts (texts.parquet: `_dk_hist`, `_dk_htext`), so a pair across days is
decided by exact Jaccard, as a single run over all days decides it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datakit.plan import DROP, DROP_DETAIL, Rel, source

_HIST, _HSIG, _HMIN = "_dk_hist", "_dk_hsig", "_dk_hist_min"
_KEY, _SIG, _BAND, _BUCKET = "_dk_key", "_dk_sig", "_dk_band", "_dk_bucket"
STATE_FILES = {"exact": "exact.parquet", "signatures": "signatures.parquet", "bands": "bands.parquet",
               "texts": "texts.parquet"}
_HTEXT = "_dk_htext"
TEXT_SCHEMA = pa.schema([(_HIST, pa.string()), (_HTEXT, pa.string())])
EXACT_SCHEMA = pa.schema([(_KEY, pa.string()), (_HIST, pa.string())])
SIG_SCHEMA = pa.schema([(_HIST, pa.string()), (_HSIG, pa.binary())])
BAND_SCHEMA = pa.schema([(_BAND, pa.int32()), (_BUCKET, pa.int64()), (_HIST, pa.string())])


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


def _hist_ids(doc_ids: list[str], snapshot: str) -> pa.Array:
    return pa.array([json.dumps({"doc_id": d, "snapshot": snapshot}, sort_keys=True, separators=(",", ":"))
                     for d in doc_ids], pa.string())


def write_state(snap_path: str, snapshot: str, cfg: Any) -> dict[str, Any]:
    """Compute and write the snapshot's dedup state from its committed records; returns the manifest entry."""
    from datakit.io.atomic import sha256_file
    from datakit.io.dataset import read_output
    from datakit.io.sinks import write_parquet
    from datakit.stages.dedup.stage import _BandFn, _SignatureFn, _sig_matrix
    from datakit.stages.dedup.text import exact_keys
    from datakit.stages.texts import record_texts

    table = read_output(snap_path)
    scope = "kind" if cfg.scope == "kind" and "kind" in table.column_names else None
    root = f"{snap_path.rstrip('/')}/_dedup_state"
    hist = _hist_ids(table.column("doc_id").to_pylist() if table.num_rows else [], snapshot)
    files: dict[str, str] = {}
    if cfg.exact:
        keys = exact_keys(record_texts(table, cfg.text_column), cfg.exact_normalize,
                          table.column(scope).combine_chunks() if scope else None) if table.num_rows else pa.array([], pa.string())
        t = pa.table([keys, hist], schema=EXACT_SCHEMA)
        t = t.take(pc.sort_indices(t, [(_KEY, "ascending"), (_HIST, "ascending")]))
        files["exact"] = STATE_FILES["exact"]
        write_parquet(t, f"{root}/{files['exact']}")
    m = cfg.minhash
    if m is not None:
        bands, rows = m.band_rows()
        batch = table.combine_chunks().to_batches()[0] if table.num_rows else None
        if batch is not None:
            docs = _SignatureFn(cfg.text_column, m, scope)(batch)
            banded = _BandFn(m.num_perm, bands, rows, scope)(docs)
            by_doc = dict(zip(docs.column("doc_id").to_pylist(), hist.to_pylist()))
            sig_t = pa.table([hist, docs.column(_SIG)], schema=SIG_SCHEMA)
            band_t = pa.table([banded.column(_BAND), banded.column(_BUCKET),
                               pa.array([by_doc[d] for d in banded.column("doc_id").to_pylist()], pa.string())],
                              schema=BAND_SCHEMA)
        else:
            sig_t, band_t = SIG_SCHEMA.empty_table(), BAND_SCHEMA.empty_table()
        sig_t = sig_t.take(pc.sort_indices(sig_t, [(_HIST, "ascending")]))
        band_t = band_t.take(pc.sort_indices(band_t, [(_BAND, "ascending"), (_BUCKET, "ascending"), (_HIST, "ascending")]))
        _ = _sig_matrix  # signatures are stored exactly as the stage computes them
        tables = [("signatures", sig_t), ("bands", band_t)]
        if m.verify == "exact":  # exact Jaccard against history needs the kept documents' dedup texts
            texts = record_texts(table, cfg.text_column) if table.num_rows else pa.array([], pa.string())
            text_t = pa.table([hist, texts], schema=TEXT_SCHEMA)
            tables.append(("texts", text_t.take(pc.sort_indices(text_t, [(_HIST, "ascending")]))))
        for name, t in tables:
            files[name] = STATE_FILES[name]
            write_parquet(t, f"{root}/{files[name]}")
    files = {k: f"_dedup_state/{v}" for k, v in files.items()}
    return {"params": state_params(cfg), "files": files,
            "sha256": {k: sha256_file(f"{snap_path.rstrip('/')}/{v}") for k, v in files.items()}}


def history_files(history: list[dict[str, Any]], kind: str, cfg: Any) -> list[str]:
    """Absolute paths of the history's state files of one kind; refuses a state written under other settings."""
    out = []
    want = state_params(cfg)
    for s in history:
        st = s.get("dedup_state")
        if not st:
            continue
        if st["params"] != want:
            raise ValueError(f"snapshot {s['id']}'s dedup state was written with other dedup settings "
                             f"({st['params']}); history dedup needs the same settings in every snapshot")
        if kind in st["files"]:
            out.append(f"{s['root']}/{st['files'][kind]}")
    return out


# --------------------------------------------------------------------------- batch functions (picklable)

@dataclass(frozen=True)
class _Project:
    """Keep only the declared columns (a Parquet source appends provenance columns)."""

    names: tuple[str, ...]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([batch.column(n) for n in self.names], names=list(self.names))


@dataclass(frozen=True)
class _HistMarkFn:
    """Drop rows that matched a kept document of the history: reason, detail = that document."""

    reason: str
    names: tuple[str, ...]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        hit = batch.column(_HMIN)
        drop = pc.if_else(pc.is_valid(hit), pa.scalar(self.reason, pa.string()), pa.scalar(None, pa.string()))
        cols = [batch.column(n) for n in self.names] + [drop, hit.cast(pa.string())]
        return pa.RecordBatch.from_arrays(cols, names=list(self.names) + [DROP, DROP_DETAIL])


@dataclass(frozen=True)
class _PairFn:
    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([batch.column("doc_id"), batch.column(_HIST)], names=["doc_id", _HIST])


@dataclass(frozen=True)
class _HistVerifyFn:
    """Candidate (doc, history doc) pairs -> only those whose estimated Jaccard reaches the threshold."""

    num_perm: int
    threshold: float

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        from datakit.stages.dedup.stage import _sig_matrix
        from datakit.stages.dedup.verify import signature_jaccard

        if batch.num_rows == 0:
            return pa.RecordBatch.from_arrays([batch.column("doc_id"), batch.column(_HIST)], names=["doc_id", _HIST])
        sim = signature_jaccard(_sig_matrix(batch.column(_SIG), self.num_perm), _sig_matrix(batch.column(_HSIG), self.num_perm))
        ok = pa.array(sim >= self.threshold)
        return pa.RecordBatch.from_arrays([batch.column("doc_id").filter(ok), batch.column(_HIST).filter(ok)],
                                          names=["doc_id", _HIST])


# --------------------------------------------------------------------------- compilation

def _state_source(files: list[str], schema: pa.Schema, rel: Rel, name: str) -> Rel:
    src = source(files, "parquet", schema, "dedup_state", stage=rel.stage)
    return src.map_batches(_Project(tuple(schema.names)), schema, name=name)


def compile_exact_history(rel: Rel, files: list[str], key_fn: Any) -> Rel:
    """Drop documents whose exact key a kept document of the history has (`exact_duplicate_of_history`)."""
    schema = rel.schema
    keyed = rel.map_batches(key_fn, pa.schema(list(schema) + [pa.field(_KEY, pa.string())]), name="dedup_history_key")
    hist = _state_source(files, EXACT_SCHEMA, rel, "dedup_history_exact_state")
    hist = hist.aggregate([_KEY], {_HMIN: ("min", _HIST)})
    joined = keyed.join(hist, _KEY, how="left")
    return joined.map_batches(_HistMarkFn("exact_duplicate_of_history", tuple(schema.names)), schema,
                              name="dedup_history_exact", drop_log_key="doc_id")


@dataclass(frozen=True)
class _HistExactVerifyFn:
    """Candidate pairs with the history doc's text and today's record: exact Jaccard >= threshold?"""

    text_column: str | None
    ngram: int
    shingle: str
    lowercase: bool
    threshold: float

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        from datakit.stages.texts import record_texts
        from datakit.stages.dedup.verify import exact_jaccard

        if batch.num_rows == 0:
            return pa.RecordBatch.from_arrays([batch.column("doc_id"), batch.column(_HIST)], names=["doc_id", _HIST])
        sim = exact_jaccard(batch.column(_HTEXT), record_texts(batch, self.text_column), self.ngram, self.shingle,
                            self.lowercase)
        ok = pa.array(sim >= self.threshold)
        return pa.RecordBatch.from_arrays([batch.column("doc_id").filter(ok), batch.column(_HIST).filter(ok)],
                                          names=["doc_id", _HIST])


def compile_near_history(rel: Rel, sig_files: list[str], band_files: list[str], sig_fn: Any, band_fn: Any,
                         num_perm: int, threshold: float, text_files: list[str] | None = None) -> Rel:
    """Drop documents whose signature is similar (>= threshold) to a kept document of the history that
    shares an LSH bucket with it (`near_duplicate_of_history`)."""
    schema = rel.schema
    doc_fields = [schema.field("doc_id")] + ([schema.field(sig_fn.scope)] if sig_fn.scope else []) + [pa.field(_SIG, pa.binary())]
    docs = rel.map_batches(sig_fn, pa.schema(doc_fields), name="dedup_history_minhash")
    band_schema = pa.schema([schema.field("doc_id"), pa.field(_BAND, pa.int32()), pa.field(_BUCKET, pa.int64())])
    banded = docs.map_batches(band_fn, band_schema, name="dedup_history_bands")
    hbands = _state_source(band_files, BAND_SCHEMA, rel, "dedup_history_band_state")
    cand = banded.join(hbands, [_BAND, _BUCKET], how="inner")
    pair_schema = pa.schema([schema.field("doc_id"), pa.field(_HIST, pa.string())])
    pairs = cand.map_batches(_PairFn(), pair_schema, name="dedup_history_candidates")
    pairs = pairs.aggregate(["doc_id", _HIST], {"_dk_n": ("count", "doc_id")})  # distinct pairs
    if text_files:  # verify: exact -- the same decision a single run over all days makes
        htexts = _state_source(text_files, TEXT_SCHEMA, rel, "dedup_history_text_state")
        pairs = pairs.join(htexts, _HIST, how="inner").join(rel, "doc_id", how="inner")
        c = sig_fn.cfg
        verified = pairs.map_batches(_HistExactVerifyFn(sig_fn.text_column, c.ngram, c.shingle, c.lowercase, threshold),
                                     pair_schema, name="dedup_history_verify")
    else:
        hsigs = _state_source(sig_files, SIG_SCHEMA, rel, "dedup_history_signature_state")
        pairs = pairs.join(hsigs, _HIST, how="inner").join(docs, "doc_id", how="inner")
        verified = pairs.map_batches(_HistVerifyFn(num_perm, threshold), pair_schema, name="dedup_history_verify")
    best = verified.aggregate(["doc_id"], {_HMIN: ("min", _HIST)})
    marked = rel.join(best, "doc_id", how="left")
    return marked.map_batches(_HistMarkFn("near_duplicate_of_history", tuple(schema.names)), schema,
                              name="dedup_history_near", drop_log_key="doc_id")
