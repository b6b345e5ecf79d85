"""`packing: repository` — a repository's files together, each after the files it imports (long context).

Why: mid-training for long context (up to 256K tokens) learns nothing about
long-range use from unrelated snippets packed side by side; what it learns
from is a repository's files together, definitions before their uses.

Plan (beside the ordinary tokenize map, which stays as it is):

    records -> map(keys) -> aggregate(newest version per (repo_id, commit, path)) ─┐
            └───────────────────────────────────────────── left join ─────────────┴-> map(encode)

- A `code` record with a `source.repo_id` and `source.path` is a repository
  file; its group is `repo_id@commit` (commit from the record's meta). Of
  several versions of one path the newest (timestamp, then doc_id) is kept;
  the others are dropped as `older_version` (detail: the kept doc_id).
- A file is encoded as `[file_sep] path "\\n" text` (the header tells the model
  where a file starts and what it is; `[file_sep]` is the tokenizer's own
  `<file_sep>` / `<|file_sep|>`, added if missing), all tokens with loss, no
  EOS; its imports are read where the text is (`imports.import_specs`).
  Every other record (other kinds, no repository) is encoded as usual and
  forms a group of its own.
- The sink shards by group, so a repository sits in one shard whole.

Writer (`write_repository_shard`), per shard:

1. groups in seeded shuffle order (`xxh64(group, seed')`, the documents' rule);
2. a repository's files in dependency order (`imports.dependency_order`), EOS
   after the last file, and BOS (loss 0) before the first with `add_bos`;
3. *units*: the files cut at file boundaries into runs of at most `seq_len`
   tokens (a single file longer than `seq_len` is a unit of its own); the EOS
   stays in the unit of the last file and the BOS in the unit of the first
   (found in review: a last file that filled its unit left the EOS a unit of
   its own, packed into another repository's sequence, and `add_bos` was ignored);
4. units are best-fit packed like documents (`packing.pack_best_fit`: a unit
   is never split unless it is longer than `seq_len`);
5. sequences are written one at a time into the `.npy` files, so memory is
   the shard's encoded tokens plus one sequence, whatever `seq_len` is.

The packed layout is the ordinary one with *units* as its documents: a
trainer's `cu_seqlens` (attention) boundaries are unit boundaries, so the
files of a repository attend to each other and never to another repository.
`repo_files-NNNNN.parquet` lists every file: its record `doc_id`, `path`,
`repo`, the unit (`doc_row`) and token `offset` in it, `n_tokens`, and the
`sequence`/`position` where its header starts.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datakit.io.atomic import atomic_path
from datakit.io.fs import filesystem
from datakit.io.layout import data_file
from datakit.io.sinks import write_parquet
from datakit.plan import DROP, DROP_DETAIL, Rel
from datakit.stages.tokenize.encode import ENCODED_SCHEMA, EncodeOptions, encode_table, shuffle_keys
from datakit.stages.tokenize.imports import Resolver, dependency_order, import_specs
from datakit.stages.tokenize.packing import pack_best_fit
from datakit.stages.tokenize.tokenizers import LoadedTokenizer

SEP = "\x1f"
GROUP, PATH, IMPORTS = "repo_group", "repo_path", "repo_imports"
_RP_PATH, _RP_VER, _RP_NEWEST = "_rp_path", "_rp_ver", "_rp_newest"
REPO_ENCODED_SCHEMA = pa.schema(list(ENCODED_SCHEMA) + [(GROUP, pa.string()), (PATH, pa.string()),
                                                        (IMPORTS, pa.list_(pa.string()))])
_OUT = pa.schema(list(REPO_ENCODED_SCHEMA) + [(DROP, pa.string()), (DROP_DETAIL, pa.string())])


def _repo_file(kind: str | None, source: dict | None, meta: str | None) -> tuple[str, str] | None:
    """(group, path) of a record that is a repository file, else None."""
    src = source or {}
    if kind != "code" or not src.get("repo_id") or not src.get("path"):
        return None
    try:
        commit = json.loads(meta or "{}").get("commit")
    except ValueError:
        commit = None
    return f"{src['repo_id']}@{commit or ''}", src["path"]


class RepoKeysFn:
    """Records + (`_rp_path`: identity of a repository path, or of the record; `_rp_ver`: sortable version)."""

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        keys, vers = [], []
        for d, kind, src, meta in zip(*(batch.column(c).to_pylist() for c in ("doc_id", "kind", "source", "meta"))):
            rf = _repo_file(kind, src, meta)
            keys.append(f"{rf[0]}{SEP}{rf[1]}" if rf else f"doc{SEP}{d}")
            # ingest made timestamps canonical (fixed-width UTC), so string order is time order
            vers.append(f"{(src or {}).get('timestamp') or ''}{SEP}{d}")
        batch = batch.append_column(_RP_PATH, pa.array(keys, pa.string()))
        return batch.append_column(_RP_VER, pa.array(vers, pa.string()))


def encode_repository(batch: pa.RecordBatch, tok: LoadedTokenizer, o: EncodeOptions) -> pa.Table:
    """Encode a batch for repository packing: repository files with a path header, others as usual."""
    n = batch.num_rows
    cols = {c: batch.column(c).to_pylist() for c in ("doc_id", "kind", "segments", "source", "meta")}
    ver = batch.column(_RP_VER).to_pylist() if _RP_VER in batch.schema.names else [None] * n
    newest = batch.column(_RP_NEWEST).to_pylist() if _RP_NEWEST in batch.schema.names else ver
    files, others, older = [], [], []
    for i in range(n):
        if ver[i] != newest[i]:
            older.append(i)
        elif _repo_file(cols["kind"][i], cols["source"][i], cols["meta"][i]):
            files.append(i)
        else:
            others.append(i)
    parts: list[pa.Table] = []
    if others:
        enc = encode_table(batch.take(pa.array(others)), tok, o)
        docs = enc.column("doc_id")
        enc = enc.append_column(GROUP, docs).append_column(PATH, pa.nulls(len(docs), pa.string())) \
            .append_column(IMPORTS, pa.nulls(len(docs), pa.list_(pa.string())))
        parts.append(enc.select(_OUT.names).cast(_OUT))
    if files or older:
        parts.append(_encode_files(cols, files, older, newest, tok, o))
    if not parts:
        return _OUT.empty_table()
    return pa.concat_tables(parts)


def _encode_files(cols: dict[str, list], files: list[int], older: list[int], newest: list[str | None],
                  tok: LoadedTokenizer, o: EncodeOptions) -> pa.Table:
    texts, heads, groups, paths, specs = [], [], [], [], []
    for i in files:
        group, path = _repo_file(cols["kind"][i], cols["source"][i], cols["meta"][i])  # type: ignore[misc]
        text = "".join((s or {}).get("text") or "" for s in cols["segments"][i] or [])
        texts.append(text)
        heads.append(path + "\n")
        groups.append(group)
        paths.append(path)
        specs.append(import_specs(path, text))
    enc = tok.encode_batch([t for pair in zip(heads, texts) for t in pair]) if files else []
    sep = tok.special["file_sep"]
    rows: dict[str, list] = {c: [] for c in _OUT.names}

    def add(i: int, ids: list[int] | None, group: str | None, path: str | None, spec: list[str] | None,
            drop: str | None, detail: str | None) -> None:
        d = cols["doc_id"][i]
        row = {"doc_id": d, "kind": cols["kind"][i], "shuffle_key": 0, "n_tokens": len(ids) if ids else 0,
               "input_ids": ids, "loss_mask": [1] * len(ids) if ids else None,
               "language": (cols["source"][i] or {}).get("language"),
               GROUP: group or d, PATH: path, IMPORTS: spec, DROP: drop, DROP_DETAIL: detail}
        for k in rows:  # every other column of the encoded schema (preference ids, ...) is null here
            rows[k].append(row.get(k))

    for j, i in enumerate(files):
        if not texts[j].strip():
            add(i, None, groups[j], paths[j], None, "empty_document", None)
            continue
        ids = [sep] + enc[2 * j] + enc[2 * j + 1]
        if o.overlong == "drop" and len(ids) > o.seq_len:
            add(i, None, groups[j], paths[j], None, "too_long", None)
            continue
        add(i, ids, groups[j], paths[j], specs[j], None, None)
    for i in older:
        add(i, None, None, None, None, "older_version", (newest[i] or "").rpartition(SEP)[2] or None)
    table = pa.table({c: pa.array(v, _OUT.field(c).type) for c, v in rows.items()})
    keys = shuffle_keys(table.column("doc_id").to_pylist(), o.seed)
    return table.set_column(table.schema.get_field_index("shuffle_key"), "shuffle_key", pa.array(keys))


def compile_repository(rel: Rel, encode_fn: Any) -> Rel:
    """The plan of repository packing (module docstring); `encode_fn` calls `encode_repository`."""
    keyed_schema = pa.schema(list(rel.schema) + [(_RP_PATH, pa.string()), (_RP_VER, pa.string())])
    keyed = rel.map_batches(RepoKeysFn(), keyed_schema, name="repository_keys")
    side = Rel(keyed.node, f"{rel.stage}:side")
    newest = side.aggregate([_RP_PATH], {_RP_NEWEST: ("max", _RP_VER)})
    joined = keyed.join(Rel(newest.node, rel.stage), _RP_PATH, how="left")
    return joined.map_batches(encode_fn, REPO_ENCODED_SCHEMA, name="tokenize", drop_log_key="doc_id")


# ------------------------------------------------------------------ the writer

def _npy_stream(url: str, shape: tuple[int, int], dtype: np.dtype):
    """Context manager: an open .npy file (header written) that rows are appended to, committed atomically."""
    from contextlib import contextmanager

    @contextmanager
    def cm():
        with atomic_path(url) as tmp:
            fs, p = filesystem(tmp)
            with fs.open(p, "wb") as f:
                np.lib.format.write_array_header_1_0(
                    f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape})
                yield f
    return cm()


def _group_order(groups: list[str], seed: int) -> list[str]:
    keys = shuffle_keys(groups, seed)
    return [g for _, g in sorted(zip(keys.tolist(), groups))]


EOS_ROW, BOS_ROW = -1, -2  # the entries of a unit that are one special token, not a file row


def plan_units(table: pa.Table, seq_len: int, seed: int, bos: bool = False
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(units, files) of one shard: units are lists of entries (row, or EOS_ROW / BOS_ROW), in packing
    input order."""
    grp = table.column(GROUP).to_pylist()
    paths = table.column(PATH).to_pylist()
    specs = table.column(IMPORTS).to_pylist()
    lengths = table.column("n_tokens").to_numpy().astype(np.int64)
    members: dict[str, list[int]] = defaultdict(list)
    for r, g in enumerate(grp):
        members[g].append(r)
    units: list[dict[str, Any]] = []
    files: list[dict[str, Any]] = []
    for g in _group_order(list(members), seed):
        rows = members[g]
        if paths[rows[0]] is None:  # a record outside any repository: a unit of its own
            units.append({"group": g, "entries": [(rows[0], int(lengths[rows[0]]))], "files": 0})
            continue
        by_path = {paths[r]: r for r in rows}
        resolver = Resolver(list(by_path))
        deps = {p: resolver.resolve(p, specs[r]) for p, r in by_path.items()}
        order = dependency_order(sorted(by_path), deps)
        entries = ([(BOS_ROW, 1)] if bos else []) + [(by_path[p], int(lengths[by_path[p]])) for p in order] \
            + [(EOS_ROW, 1)]  # EOS ends the repository
        cur: list[tuple[int, int]] = []
        size = 0
        for k, e in enumerate(entries):
            if e[0] >= 0:  # a file: a new unit when it does not fit (with the EOS, when it is the last file)
                need = e[1] + (1 if entries[k + 1][0] == EOS_ROW else 0)
                if any(x[0] >= 0 for x in cur) and size + need > seq_len:
                    units.append({"group": g, "entries": cur, "files": sum(1 for x in cur if x[0] >= 0)})
                    cur, size = [], 0
            cur.append(e)
            size += e[1]
        units.append({"group": g, "entries": cur, "files": sum(1 for x in cur if x[0] >= 0)})
    for u, unit in enumerate(units):
        off = 0
        for row, n in unit["entries"]:
            if row >= 0 and paths[row] is not None:
                files.append({"row": row, "unit": u, "offset": off, "n_tokens": n})
            off += n
        unit["n_tokens"] = off
    return units, files


def write_repository_shard(table: pa.Table, shard: int, out: str, o: dict[str, Any], dtype: np.dtype,
                           split) -> dict[str, Any]:
    """Write one shard with repository packing (module docstring); returns the shard info."""
    seq_len, pad = int(o["seq_len"]), int(o["pad_id"])
    eos = int(o["special_tokens"]["eos"]["id"])
    bos = int(o["special_tokens"]["bos"]["id"]) if o.get("add_bos") else None
    seed = int((o.get("shuffle") or {}).get("seed", 0))
    packable, pref = split(table)
    order = pc.sort_indices(packable, sort_keys=[("doc_id", "ascending")])
    packable = packable.take(order).combine_chunks()
    if packable.num_rows:
        ids_col, mask_col = packable.column("input_ids").chunk(0), packable.column("loss_mask").chunk(0)
        values, mvalues = ids_col.values.to_numpy(zero_copy_only=False), mask_col.values.to_numpy(zero_copy_only=False).view(np.uint8)
        starts, mstarts = ids_col.offsets.to_numpy()[:-1].astype(np.int64), mask_col.offsets.to_numpy()[:-1].astype(np.int64)
    else:
        values, mvalues = np.zeros(0, np.int32), np.zeros(0, np.uint8)
        starts = mstarts = np.zeros(0, np.int64)
    if len(values) and int(values.max()) >= int(o["vocab_size"]):
        raise ValueError(f"token id {int(values.max())} outside the vocabulary ({o['vocab_size']})")

    units, files = plan_units(packable, seq_len, seed, bos=bos is not None)
    ulen = np.array([u["n_tokens"] for u in units], dtype=np.int64)
    pieces = pack_best_fit(ulen, seq_len)
    n_seq = pieces.n_sequences
    # entry offsets inside each unit, for copying a piece [off, off+len) of a unit
    uoff = [np.cumsum([0] + [n for _, n in u["entries"]]) for u in units]
    names = {k: data_file(f"{k}-{shard:05d}.{ext}") for k, ext in (
        ("tokens", "npy"), ("loss_mask", "npy"), ("segments", "npy"), ("seq_index", "npy"), ("docs", "parquet"),
        ("repo_files", "parquet"))}
    seg_rows: list[tuple[int, int, int]] = []
    seq_index = np.zeros(n_seq + 1, dtype=np.int64)
    bounds = np.searchsorted(pieces.seq, np.arange(n_seq + 1))
    piece_at: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)  # unit -> (doc_offset, length, seq, pos)
    loss_tokens = 0
    with _npy_stream(f"{out}/{names['tokens']}", (n_seq, seq_len), dtype) as ftok, \
            _npy_stream(f"{out}/{names['loss_mask']}", (n_seq, seq_len), np.uint8) as fmask:
        row_t = np.empty(seq_len, dtype=dtype)
        row_m = np.empty(seq_len, dtype=np.uint8)
        for s in range(n_seq):
            row_t.fill(pad)
            row_m.fill(0)
            end = 0
            for k in range(bounds[s], bounds[s + 1]):
                u, pos, off, length = int(pieces.doc_row[k]), int(pieces.pos[k]), int(pieces.doc_offset[k]), int(pieces.length[k])
                piece_at[u].append((off, length, s, pos))
                seg_rows.append((pos, u, off))
                offs, entries = uoff[u], units[u]["entries"]
                e = int(np.searchsorted(offs, off, side="right")) - 1
                cur = off
                while cur < off + length:
                    row, n = entries[e]
                    a, b = cur - int(offs[e]), min(n, off + length - int(offs[e]))
                    dst = pos + (cur - off)
                    if row == EOS_ROW:
                        row_t[dst], row_m[dst] = eos, 1
                    elif row == BOS_ROW:
                        row_t[dst], row_m[dst] = bos, 0
                    else:
                        row_t[dst:dst + b - a] = values[starts[row] + a: starts[row] + b]
                        row_m[dst:dst + b - a] = mvalues[mstarts[row] + a: mstarts[row] + b]
                    cur += b - a
                    e += 1
                end = max(end, pos + length)
            if end < seq_len:
                seg_rows.append((end, -1, 0))
            seq_index[s + 1] = len(seg_rows)
            loss_tokens += int(row_m.sum())
            ftok.write(row_t.tobytes())
            fmask.write(row_m.tobytes())
    segments = np.asarray(seg_rows, dtype=np.int64).reshape(-1, 3)
    from datakit.stages.tokenize.writers import _save_npy, max_segments

    _save_npy(f"{out}/{names['segments']}", segments)
    _save_npy(f"{out}/{names['seq_index']}", seq_index)

    doc_ids = packable.column("doc_id").to_pylist()
    kinds = packable.column("kind").to_pylist()
    fim = packable.column("fim_mode").to_pylist()
    unit_ids, unit_kinds, unit_fim = [], [], []
    for u, unit in enumerate(units):
        if unit["files"] or unit["entries"][0][0] < 0:
            unit_ids.append(hashlib.sha256(f"{unit['group']}{SEP}{u}".encode()).hexdigest())
            unit_kinds.append("repository")
            unit_fim.append(None)
        else:
            r = unit["entries"][0][0]
            unit_ids.append(doc_ids[r]); unit_kinds.append(kinds[r]); unit_fim.append(fim[r])
    write_parquet(pa.table({"doc_id": pa.array(unit_ids, pa.string()), "kind": pa.array(unit_kinds, pa.string()),
                            "n_tokens": pa.array(ulen.astype(np.int32)), "fim_mode": pa.array(unit_fim, pa.string()),
                            "repo": pa.array([u["group"] if u["files"] else None for u in units], pa.string()),
                            "files": pa.array([u["files"] for u in units], pa.int32())}),
                  f"{out}/{names['docs']}")
    paths = packable.column(PATH).to_pylist()
    grp = packable.column(GROUP).to_pylist()
    seqpos = []
    for f in files:
        hit = next(((s, pos + f["offset"] - off) for off, length, s, pos in piece_at[f["unit"]]
                    if off <= f["offset"] < off + length), (-1, -1))
        seqpos.append(hit)
    write_parquet(pa.table({
        "doc_id": pa.array([doc_ids[f["row"]] for f in files], pa.string()),
        "repo": pa.array([grp[f["row"]] for f in files], pa.string()),
        "path": pa.array([paths[f["row"]] for f in files], pa.string()),
        "doc_row": pa.array([f["unit"] for f in files], pa.int64()),
        "offset": pa.array([f["offset"] for f in files], pa.int64()),
        "n_tokens": pa.array([f["n_tokens"] for f in files], pa.int64()),
        "sequence": pa.array([s for s, _ in seqpos], pa.int64()),
        "position": pa.array([p for _, p in seqpos], pa.int64()),
    }), f"{out}/{names['repo_files']}")

    per_unit = np.bincount(pieces.doc_row, minlength=len(units)) if len(units) else np.zeros(0, np.int64)
    tokens = int(pieces.length.sum())
    repos = {u["group"] for u in units if u["files"]}
    info: dict[str, Any] = {
        "rows": table.num_rows, "sequences": int(n_seq), "tokens": tokens, "padding_tokens": int(n_seq * seq_len - tokens),
        "loss_tokens": loss_tokens, "documents": len(units),
        "split_documents": int(((per_unit > 1) & (ulen <= seq_len)).sum()),
        "long_documents": int((ulen > seq_len).sum()), "repositories": len(repos), "repository_files": len(files),
        "split_repositories": sum(1 for c in Counter(u["group"] for u in units if u["files"]).values() if c > 1),
        "preference_pairs": 0, "max_segments": max_segments(seq_index), "arrays": names,
    }
    if pref.num_rows:  # preference pairs are not packed: the same Parquet file as with the other packings
        from datakit.stages.tokenize.writers import _preference_table, shuffle_order

        names_pref = data_file(f"preference-{shard:05d}.parquet")
        write_parquet(_preference_table(pref.take(pa.array(shuffle_order(pref)))), f"{out}/{names_pref}")
        info["preference_file"], info["preference_pairs"] = names_pref, pref.num_rows
    info["files"] = sorted(list(names.values()) + ([info["preference_file"]] if pref.num_rows else []))
    return info
