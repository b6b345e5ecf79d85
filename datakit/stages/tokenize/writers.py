"""Output formats of tokenized data: `packed` (numpy memmap shards) and `megatron` (.bin/.idx).

Both are `ShardWriter`s (see `datakit.io.sinks`): the engine hands each writer
all encoded documents of one output shard (rows of `encode.ENCODED_SCHEMA`);
the writer orders them by the seeded shuffle key, packs, and writes. Because a
shard's content depends only on which documents hash to it, output bytes are
the same on every engine and for any number of workers or partitions.

The writer needs the tokenize stage's settings; the stage puts them in
`ctx.sink_options` and the pipeline copies them into
`SinkSpec.options` (keys: seq_len, packing, tokenizer, tokenizer_overrides,
tokenizer_roles, tokenizer_sha256, vocab_size, pad_id, special_tokens).
See docs/packed_format.md for the layout.
"""
from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datakit.io.atomic import atomic_path, write_bytes_atomic
from datakit.io.fs import filesystem
from datakit.io.layout import TOKENIZER_FILE, data_file
from datakit.io.sinks import register_writer, write_parquet
from datakit.plan import SinkSpec
from datakit.stages.tokenize.encode import PREFERENCE_COLUMNS
from datakit.stages.tokenize.packing import PACKING_ALGORITHMS, gather, materialize, pack

PACKED_FORMAT = "datakit.packed.v1"


class PackedOptionsError(ValueError):
    """The sink lacks the tokenize settings (no tokenize stage, or options not wired)."""


def _options(spec: SinkSpec) -> dict[str, Any]:
    o = dict(spec.options or {})
    missing = [k for k in ("seq_len", "vocab_size", "pad_id") if k not in o]
    if missing:
        raise PackedOptionsError(
            f"output format {spec.format!r} needs a `tokenize` stage before it (sink options lack {missing})"
        )
    o.setdefault("packing", "best_fit")
    if o["packing"] not in PACKING_ALGORITHMS:
        raise PackedOptionsError(f"unknown packing {o['packing']!r}; choose one of {PACKING_ALGORITHMS}")
    return o


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (halves the bytes a trainer reads), else int32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def max_segments(seq_index: np.ndarray) -> int:
    """The most segments one sequence of a shard has (recorded per shard in the manifest).

    Why recorded: a training sample's `cu_seqlens` has the same length for every sequence of the
    dataset (`PackedDataset.max_segments`), and without this number the loader mapped every shard's
    files to find it at the first sample, keeping 4 file descriptors per shard open in every process
    (300 shards failed under a 1024 limit; found in review)."""
    return int(np.diff(seq_index).max()) if len(seq_index) > 1 else 0


def _save_npy(url: str, arr: np.ndarray) -> None:
    """np.save atomically (fixed header: same array -> same bytes)."""
    with atomic_path(url) as tmp:
        fs, p = filesystem(tmp)
        with fs.open(p, "wb") as f:
            np.save(f, np.ascontiguousarray(arr), allow_pickle=False)


def shuffle_order(table: pa.Table) -> np.ndarray:
    """Row order of the seeded shuffle: by (shuffle_key, doc_id); doc_id breaks hash ties."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    idx = pc.sort_indices(table.select(["shuffle_key", "doc_id"]),
                          sort_keys=[("shuffle_key", "ascending"), ("doc_id", "ascending")])
    return idx.to_numpy().astype(np.int64)


def list_buffers(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, starts, lengths) of a list column without copying its values.

    Row i is `values[starts[i] : starts[i] + lengths[i]]`. Null rows (never
    packed) have length 0.
    """
    if isinstance(col, pa.ChunkedArray):  # (combine_chunks copies even a single chunk)
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    else:
        arr = col
    if len(arr) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)
    lengths = np.diff(offsets)
    if arr.null_count:
        lengths = np.where(arr.is_null().to_numpy(zero_copy_only=False), 0, lengths)
    return values, offsets[:-1], lengths


def _split(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    is_pref = pc.fill_null(pc.equal(table.column("kind"), "preference"), False)
    if not pc.any(is_pref).as_py():
        return table, table.slice(0, 0)
    return table.filter(pc.invert(is_pref)), table.filter(is_pref)


def _ordered_docs(packable: pa.Table) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Shuffle order + (values, starts, lengths, mask values, mask starts) in that order (no token copy)."""
    order = shuffle_order(packable)
    values, starts, lengths = list_buffers(packable.column("input_ids"))
    mvalues, mstarts, mlengths = list_buffers(packable.column("loss_mask"))
    if not np.array_equal(lengths, mlengths):
        raise ValueError("input_ids and loss_mask lengths differ (corrupt encoded rows)")
    return order, (values, starts[order], lengths[order], mvalues, mstarts[order])


def _preference_table(pref: pa.Table) -> pa.Table:
    """The columns preference trainers (TRL DPO & co.) expect, plus token ids and doc_id."""
    return pref.select(list(PREFERENCE_COLUMNS))


def _manifest_common(spec: SinkSpec, o: dict[str, Any], shards: list[dict[str, Any]]) -> dict[str, Any]:
    """Tokenizer identity (and the effective tokenizer.json written beside the data)."""
    tokenizer: dict[str, Any] = {
        "name": o.get("tokenizer"),
        "sha256": o.get("tokenizer_sha256"),
        "vocab_size": o["vocab_size"],
        "special_tokens": o.get("special_tokens", {}),
        "added_tokens": o.get("added_tokens", []),
    }
    if o.get("tokenizer"):
        from datakit.stages.tokenize.tokenizers import load_tokenizer

        tok = load_tokenizer(o["tokenizer"], o.get("tokenizer_overrides"), roles=o.get("tokenizer_roles", True))
        if o.get("tokenizer_sha256") and tok.sha256 != o["tokenizer_sha256"]:
            raise RuntimeError(f"tokenizer {o['tokenizer']!r} changed while the pipeline ran (sha256 differs)")
        text = tok.to_json()
        if text is not None:
            write_bytes_atomic(f"{spec.path.rstrip('/')}/{TOKENIZER_FILE}", text.encode())
            tokenizer["file"] = TOKENIZER_FILE
    return tokenizer


def tokenized_parquet_manifest(spec: SinkSpec, shards: list[dict[str, Any]]) -> dict[str, Any]:
    """What a `format: parquet` manifest of tokenized records says of its tokens, as the token formats do:
    the tokenizer (name, sha256, vocabulary, special and added tokens; its effective `tokenizer.json`
    written beside the data) and the `seq_len` the stage encoded for.

    Why: found in review, tokenized Parquet named no tokenizer at all, while its `input_ids` held the
    chat markers the stage adds (ids at and above the base vocabulary: 5,766 of them in one small run),
    which the tokenizer a trainer would load decodes as nothing; and an append-mode dataset refused its
    second day, since the committed snapshot recorded no token layout to compare with."""
    o = _options(spec)
    return {"seq_len": int(o["seq_len"]), "tokenizer": _manifest_common(spec, o, shards)}


def _sum(shards: list[dict[str, Any]], key: str) -> int:
    return int(sum(s.get(key, 0) for s in shards))


@register_writer("packed")
class PackedShardWriter:
    """Fixed-length packed sequences as .npy files that `numpy.load(mmap_mode="r")` opens."""

    name = "packed"

    def write(self, table: pa.Table, shard: int, out_url: str, spec: SinkSpec) -> dict[str, Any]:
        o = _options(spec)
        seq_len, dtype = int(o["seq_len"]), token_dtype(int(o["vocab_size"]))
        if o["packing"] == "repository":
            from datakit.stages.tokenize.repository import write_repository_shard

            return write_repository_shard(table, shard, out_url.rstrip("/"), o, dtype, _split)
        packable, pref = _split(table)
        order, (values, starts, lengths, mvalues, mstarts) = _ordered_docs(packable)
        if len(values) and int(values.max()) >= int(o["vocab_size"]):
            raise ValueError(f"token id {int(values.max())} outside the vocabulary ({o['vocab_size']})")
        pieces = pack(lengths, seq_len, o["packing"])
        packed = materialize(pieces, starts, values, mvalues.view(np.uint8), seq_len, int(o["pad_id"]), dtype,
                             mask_start=mstarts, doc_len=lengths)

        out = out_url.rstrip("/")
        names = {
            "tokens": data_file(f"tokens-{shard:05d}.npy"),
            "loss_mask": data_file(f"loss_mask-{shard:05d}.npy"),
            "segments": data_file(f"segments-{shard:05d}.npy"),
            "seq_index": data_file(f"seq_index-{shard:05d}.npy"),
            "docs": data_file(f"docs-{shard:05d}.parquet"),
        }
        _save_npy(f"{out}/{names['tokens']}", packed.tokens)
        _save_npy(f"{out}/{names['loss_mask']}", packed.loss_mask)
        _save_npy(f"{out}/{names['segments']}", packed.segments)
        _save_npy(f"{out}/{names['seq_index']}", packed.seq_index)
        docs = packable.select(["doc_id", "kind", "n_tokens", "fim_mode"]).take(pa.array(order))
        write_parquet(docs, f"{out}/{names['docs']}")
        info: dict[str, Any] = {"rows": table.num_rows, **packed.stats, "max_segments": max_segments(packed.seq_index),
                                "arrays": names}
        if pref.num_rows:
            names_pref = data_file(f"preference-{shard:05d}.parquet")
            write_parquet(_preference_table(pref.take(pa.array(shuffle_order(pref)))), f"{out}/{names_pref}")
            info["preference_file"] = names_pref
        info["preference_pairs"] = pref.num_rows
        info["files"] = sorted(list(names.values()) + ([info["preference_file"]] if pref.num_rows else []))
        return info

    def manifest_extra(self, spec: SinkSpec, shards: list[dict[str, Any]]) -> dict[str, Any]:
        o = _options(spec)
        seq_len = int(o["seq_len"])
        seqs, toks = _sum(shards, "sequences"), _sum(shards, "tokens")
        docs = _sum(shards, "documents")
        return {
            "layout": PACKED_FORMAT,
            "schema": "packed_dataset.v1",
            "tokenizer": _manifest_common(spec, o, shards),
            "seq_len": seq_len,
            "dtype": token_dtype(int(o["vocab_size"])).name,
            "packing": o["packing"],
            "pad_id": int(o["pad_id"]),
            "shuffle": o.get("shuffle", {"method": "xxh64(doc_id, seed) order within shard", "seed": o.get("seed", 0)}),
            "totals": {
                "sequences": seqs,
                "tokens": toks,
                "padding_tokens": _sum(shards, "padding_tokens"),
                "loss_tokens": _sum(shards, "loss_tokens"),
                "documents": docs,
                "split_documents": _sum(shards, "split_documents"),
                "long_documents": _sum(shards, "long_documents"),
                "preference_pairs": _sum(shards, "preference_pairs"),
                "fill_rate": round(toks / (seqs * seq_len), 6) if seqs else 0.0,
                **({k: _sum(shards, k) for k in ("repositories", "repository_files", "split_repositories")}
                   if o["packing"] == "repository" else {}),
            },
        }


def write_side_files(out: str, shard: int, packable: pa.Table, order: Any, pref: pa.Table) -> list[str]:
    """A token shard's Parquet side files, shared by the megatron and MDS writers: the documents in
    packing order (`docs-N`) and, when there are any, the preference pairs in shuffle order
    (`preference-N`). Returns their paths relative to the output."""
    docs_name = data_file(f"docs-{shard:05d}.parquet")
    write_parquet(packable.select(["doc_id", "kind", "n_tokens", "fim_mode"]).take(pa.array(order)),
                  f"{out}/{docs_name}")
    names = [docs_name]
    if pref.num_rows:
        name = data_file(f"preference-{shard:05d}.parquet")
        write_parquet(_preference_table(pref.take(pa.array(shuffle_order(pref)))), f"{out}/{name}")
        names.append(name)
    return names


# --- Megatron-LM indexed dataset (MMIDIDX) -------------------------------------------------------

MMIDIDX_MAGIC = b"MMIDIDX\x00\x00"
MMIDIDX_VERSION = 1
# numpy dtype -> Megatron DType code (megatron/core/datasets/indexed_dataset.py)
MMIDIDX_DTYPE_CODES = {np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3,
                       np.dtype(np.int32): 4, np.dtype(np.int64): 5, np.dtype(np.float64): 6,
                       np.dtype(np.float32): 7, np.dtype(np.uint16): 8}


def megatron_dtype(vocab_size: int) -> np.dtype:
    """Megatron's own choice (DType.optimal_dtype): uint16 below 65500 ids, else int32."""
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def write_mmidx(prefix_url: str, values: np.ndarray, starts: np.ndarray, dtype: np.dtype) -> list[str]:
    """Write `<prefix>.bin` and `<prefix>.idx`, one sequence per document (one document each).

    .bin: every sequence's elements, concatenated, in `dtype`.
    .idx: magic(9) | version u64 | dtype code u8 | sequence count u64 |
    document count u64 (= documents + 1) | lengths int32[S] | byte pointers
    int64[S] | document indices int64[D] (0, 1, ..., S). Little-endian.
    """
    lengths = np.diff(starts).astype(np.int32)
    pointers = (np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)[:-1]]) * dtype.itemsize).astype(np.int64) \
        if len(lengths) else np.zeros(0, np.int64)
    doc_idx = np.arange(len(lengths) + 1, dtype=np.int64)
    header = MMIDIDX_MAGIC + struct.pack("<Q", MMIDIDX_VERSION) + struct.pack("<B", MMIDIDX_DTYPE_CODES[dtype]) \
        + struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(doc_idx))
    idx = header + lengths.astype("<i4").tobytes() + pointers.astype("<i8").tobytes() + doc_idx.astype("<i8").tobytes()
    write_bytes_atomic(f"{prefix_url}.bin", values.astype(dtype.newbyteorder("<")).tobytes())
    write_bytes_atomic(f"{prefix_url}.idx", idx)
    return [f"{prefix_url.rsplit('/', 1)[-1]}.bin", f"{prefix_url.rsplit('/', 1)[-1]}.idx"]


def _mask_prefix(shard: dict[str, Any]) -> str | None:
    """The `loss_mask-NNNNN` prefix of a Megatron shard that wrote one, else None."""
    name = data_file(f"loss_mask-{shard['shard']:05d}")
    return name if f"{name}.idx" in shard.get("files", ()) else None


@register_writer("megatron")
class MegatronShardWriter:
    """Megatron-LM indexed dataset per shard: `tokens-NNNNN.bin/.idx` (+ `loss_mask-NNNNN` when not all 1).

    Megatron packs documents itself at training time, so documents are written
    whole, in the seeded shuffle order; `seq_len`/`packing` only go to the
    manifest. Loss masks have no place in the format: when some token carries
    no loss (SFT, editor FIM) a parallel uint8 indexed dataset holds them.
    """

    name = "megatron"
    carries_loss_mask = False  # Megatron's GPTDataset reads only the token files (pipeline checks at compile)

    def write(self, table: pa.Table, shard: int, out_url: str, spec: SinkSpec) -> dict[str, Any]:
        o = _options(spec)
        if o["packing"] == "repository":
            raise PackedOptionsError("packing: repository needs output format 'packed' (Megatron packs by itself)")
        packable, pref = _split(table)
        order, (values, starts, lengths, mvalues, mstarts) = _ordered_docs(packable)
        seq_values = gather(values, starts, lengths)
        seq_mask = gather(mvalues, mstarts, lengths).view(np.uint8)
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        out = out_url.rstrip("/")
        files = [data_file(f) for f in write_mmidx(f"{out}/{data_file(f'tokens-{shard:05d}')}", seq_values, bounds,
                                                   megatron_dtype(int(o["vocab_size"])))]
        if len(seq_mask) and not bool((seq_mask == 1).all()):
            files += [data_file(f) for f in write_mmidx(f"{out}/{data_file(f'loss_mask-{shard:05d}')}", seq_mask,
                                                        bounds, np.dtype(np.uint8))]
        files += write_side_files(out, shard, packable, order, pref)
        return {"rows": table.num_rows, "documents": packable.num_rows, "tokens": int(len(seq_values)),
                "loss_tokens": int(seq_mask.sum()) if len(seq_mask) else 0,
                "preference_pairs": pref.num_rows, "files": sorted(files)}

    def manifest_extra(self, spec: SinkSpec, shards: list[dict[str, Any]]) -> dict[str, Any]:
        o = _options(spec)
        # a shard without documents is not a prefix: its 0-byte .bin is what megatron-core's IndexedDataset
        # cannot map ("cannot mmap an empty file", found in review: 40 events over 8 shards), so the manifest's
        # list, passed to --data-path as the docs say, failed at start-up
        with_docs = [s for s in sorted(shards, key=lambda s: s["shard"]) if s.get("documents", 1)]
        return {
            "layout": "megatron.mmidx.v1",
            "tokenizer": _manifest_common(spec, o, shards),
            "dtype": megatron_dtype(int(o["vocab_size"])).name,
            "seq_len": int(o["seq_len"]),
            "data_prefixes": [data_file(f"tokens-{s['shard']:05d}") for s in with_docs],
            # aligned with data_prefixes: the shard's mask dataset, or null where every token carries loss
            # (found in review: a mask was written only for shards with an untrained token, and a reader
            # pairing masks with token files had no list to tell which shards have one)
            "loss_mask_prefixes": [_mask_prefix(s) for s in with_docs],
            "totals": {"documents": _sum(shards, "documents"), "tokens": _sum(shards, "tokens"),
                       "loss_tokens": _sum(shards, "loss_tokens"),
                       "preference_pairs": _sum(shards, "preference_pairs")},
        }
