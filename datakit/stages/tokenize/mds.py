"""Output format `mds`: MosaicML Streaming (MDS) shards that Composer / LLM Foundry users open with
`streaming.StreamingDataset(local="OUT/data")`.

Why we write the bytes ourselves instead of calling `streaming.MDSWriter`: no release of
mosaicml-streaming installs beside this project's pins (0.13.0 needs numpy < 2.2, xxhash < 4,
transformers < 5; `import streaming` also loads torchvision, whose PyPI build needs CUDA torch).
The format is small and versioned (index.json `version: 2`); tests/test_mds.py reads our shards
with mosaicml-streaming's own `StreamingDataset` and checks that its `MDSWriter`, given the same
samples, writes byte-identical shard files, in a separate pinned venv (requirements-mds.lock).

The layout (streaming/base/format/mds/writer.py, format version 2):

    data/index.json                     {"version": 2, "shards": [per-file entry, ...]}
    data/shard.SSSSS.PPPP.mds           one datakit shard SSSSS, split in parts of <= size_limit bytes
      u32 sample count n | u32 offsets[n+1] (absolute) | config JSON (sorted keys) | samples

A sample is one packed sequence: its columns, in sorted name order, each with a fixed shape
(`ndarray:DTYPE:SEQ_LEN`, so no per-sample size header and torch's default collate batches them):

    input_ids     int32  token ids (nn.Embedding takes int32)
    labels        int64  = input_ids, -100 where the loss mask is 0 and at every document start
                         after the first (HF convention, unshifted: HF models shift and ignore -100)
    loss_mask     uint8  0 on padding and untrained tokens (SFT prompts, FIM sentinels)
    position_ids  int32  restart at 0 in every document (HF derives varlen boundaries from them)

Packing is the `packed` format's (same `pack`/`materialize`, same seeded shuffle), so sequence k
of shard s holds the same tokens in both formats. Preference pairs go to
`data/preference-NNNNN.parquet` as in `packed`; `data/docs-NNNNN.parquet` names the documents.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from datakit.io.atomic import write_bytes_atomic
from datakit.io.layout import DATA_PREFIX, data_file
from datakit.io.sinks import register_writer
from datakit.plan import SinkSpec
from datakit.stages.tokenize.packing import materialize, pack
from datakit.stages.tokenize.writers import (PackedOptionsError, _manifest_common, _options, _ordered_docs,
                                             _split, _sum, token_dtype, write_side_files)

MDS_VERSION = 2
DEFAULT_SIZE_LIMIT = 1 << 26  # MDSWriter's default: 64 MiB per shard file
IGNORE_INDEX = -100
INDEX = "index.json"


def mds_columns(seq_len: int) -> dict[str, str]:
    """Column name -> MDS encoding (fixed dtype and shape)."""
    return {"input_ids": f"ndarray:int32:{seq_len}", "labels": f"ndarray:int64:{seq_len}",
            "loss_mask": f"ndarray:uint8:{seq_len}", "position_ids": f"ndarray:int32:{seq_len}"}


_ITEMSIZE = {"int32": 4, "int64": 8, "uint8": 1}


def shard_config(seq_len: int, size_limit: int) -> dict[str, Any]:
    """What MDSWriter.get_config() returns for our columns (no compression, no hashes)."""
    cols = mds_columns(seq_len)
    names = sorted(cols)
    return {"version": MDS_VERSION, "format": "mds", "compression": None, "hashes": [], "size_limit": size_limit,
            "column_names": names, "column_encodings": [cols[n] for n in names],
            "column_sizes": [_ITEMSIZE[cols[n].split(":")[1]] * seq_len for n in names]}


def sample_columns(tokens: np.ndarray, loss_mask: np.ndarray, segments: np.ndarray,
                   seq_index: np.ndarray) -> dict[str, np.ndarray]:
    """The sample columns [n, seq_len] of packed sequences (vectorized over the shard)."""
    n, L = tokens.shape
    input_ids = tokens.astype(np.int32)
    seg_seq = np.repeat(np.arange(n, dtype=np.int64), np.diff(seq_index))
    flat_starts = segments[:, 0].astype(np.int64) + seg_seq * L
    labels = np.where(loss_mask.astype(bool), input_ids, IGNORE_INDEX).astype(np.int64)
    labels.reshape(-1)[flat_starts[flat_starts % L != 0]] = IGNORE_INDEX
    seg_len = np.diff(np.append(flat_starts, n * L))
    position_ids = (np.arange(n * L, dtype=np.int64) - np.repeat(flat_starts, seg_len)).reshape(n, L)
    return {"input_ids": input_ids, "labels": labels, "loss_mask": loss_mask.astype(np.uint8),
            "position_ids": position_ids.astype(np.int32)}


def encode_samples(columns: dict[str, np.ndarray]) -> np.ndarray:
    """[n, sample_bytes] uint8: each row is one encoded sample (columns in sorted name order, little-endian)."""
    parts = [np.ascontiguousarray(columns[k].astype(columns[k].dtype.newbyteorder("<"))).view(np.uint8)
             for k in sorted(columns)]
    n = parts[0].shape[0]
    return np.concatenate([p.reshape(n, -1) for p in parts], axis=1)


def shard_file(samples: np.ndarray, config_json: bytes) -> bytes:
    """One .mds file: u32 count | u32 absolute offsets[n+1] | config JSON | samples."""
    n, size = samples.shape
    head = 4 + 4 * (n + 1) + len(config_json)
    offsets = head + np.arange(n + 1, dtype=np.int64) * size
    if offsets[-1] >= 1 << 32:
        raise ValueError("an MDS shard file must stay below 4 GiB (u32 offsets); lower mds_size_limit")
    return np.uint32(n).tobytes() + offsets.astype("<u4").tobytes() + config_json + samples.tobytes()


def samples_per_file(sample_bytes: int, config_json: bytes, size_limit: int) -> int:
    """MDSWriter's rule: a file grows while 8 + len(config) + sum(sample + 4) <= size_limit."""
    return max(1, (size_limit - 8 - len(config_json)) // (sample_bytes + 4))


def read_samples(data_dir: str, n: int) -> list[dict[str, np.ndarray]]:
    """The first `n` samples of an MDS dataset with fixed-shape ndarray columns (what we write), read
    from data_dir/index.json without mosaicml-streaming (for `datakit inspect`)."""
    from pathlib import Path

    root = Path(data_dir)
    out: list[dict[str, np.ndarray]] = []
    from datakit.loader import DatasetError

    for entry in json.loads((root / INDEX).read_text())["shards"]:
        f = root / entry["raw_data"]["basename"]
        data = f.read_bytes()
        try:  # found in review: a damaged shard header was a bare numpy ValueError naming no file
            count = int(np.frombuffer(data, "<u4", 1, 0)[0])
            offsets = np.frombuffer(data, "<u4", count + 1, 4)
            for i in range(min(count, n - len(out))):
                pos, sample = int(offsets[i]), {}
                for name, enc, size in zip(entry["column_names"], entry["column_encodings"], entry["column_sizes"]):
                    _, dtype, shape = enc.split(":")
                    sample[name] = np.frombuffer(data, np.dtype(dtype).newbyteorder("<"), int(shape), pos)
                    pos += size
                out.append(sample)
        except (ValueError, IndexError, TypeError, OverflowError) as e:
            raise DatasetError(f"{f} is damaged: {e}") from None
        if len(out) >= n:
            break
    return out


@register_writer("mds")
class MDSShardWriter:
    """Packed sequences as MDS shard files; `dataset_files` writes data/index.json at commit."""

    name = "mds"
    carries_loss_mask = True  # `labels` (-100) and `loss_mask` travel in every sample

    def write(self, table: pa.Table, shard: int, out_url: str, spec: SinkSpec) -> dict[str, Any]:
        o = _options(spec)
        if o["packing"] == "repository":
            raise PackedOptionsError("packing: repository needs output format 'packed'")
        seq_len, dtype = int(o["seq_len"]), token_dtype(int(o["vocab_size"]))
        size_limit = int(o.get("mds_size_limit") or DEFAULT_SIZE_LIMIT)
        packable, pref = _split(table)
        order, (values, starts, lengths, mvalues, mstarts) = _ordered_docs(packable)
        if len(values) and int(values.max()) >= int(o["vocab_size"]):
            raise ValueError(f"token id {int(values.max())} outside the vocabulary ({o['vocab_size']})")
        packed = materialize(pack(lengths, seq_len, o["packing"]), starts, values, mvalues.view(np.uint8), seq_len,
                             int(o["pad_id"]), dtype, mask_start=mstarts, doc_len=lengths)
        out = out_url.rstrip("/")
        config_json = json.dumps(shard_config(seq_len, size_limit), sort_keys=True).encode()
        files, parts = [], []
        n = packed.tokens.shape[0]
        if n:
            samples = encode_samples(sample_columns(packed.tokens, packed.loss_mask, packed.segments,
                                                    packed.seq_index))
            step = samples_per_file(samples.shape[1], config_json, size_limit)
            for p, lo in enumerate(range(0, n, step)):
                name = f"shard.{shard:05d}.{p:04d}.mds"
                body = shard_file(samples[lo:lo + step], config_json)
                write_bytes_atomic(f"{out}/{data_file(name)}", body)
                files.append(data_file(name))
                parts.append({"basename": name, "samples": int(min(step, n - lo)), "bytes": len(body)})
        files += write_side_files(out, shard, packable, order, pref)
        return {"rows": table.num_rows, **packed.stats, "mds_files": parts,
                "preference_pairs": pref.num_rows, "files": sorted(files)}

    def dataset_files(self, spec: SinkSpec, shards: list[dict[str, Any]], out: str) -> list[str]:
        """Write data/index.json (every shard's MDS files, in shard order) before the manifest."""
        o = _options(spec)
        config = shard_config(int(o["seq_len"]), int(o.get("mds_size_limit") or DEFAULT_SIZE_LIMIT))
        entries = []
        for s in sorted(shards, key=lambda s: s["shard"]):
            for part in s.get("mds_files", []):
                entries.append({**config, "samples": part["samples"], "zip_data": None,
                                "raw_data": {"basename": part["basename"], "bytes": part["bytes"], "hashes": {}}})
        name = f"{DATA_PREFIX}/{INDEX}"
        write_bytes_atomic(f"{out.rstrip('/')}/{name}",
                           json.dumps({"version": MDS_VERSION, "shards": entries}, sort_keys=True).encode())
        return [name]

    def manifest_extra(self, spec: SinkSpec, shards: list[dict[str, Any]]) -> dict[str, Any]:
        o = _options(spec)
        seq_len = int(o["seq_len"])
        seqs, toks = _sum(shards, "sequences"), _sum(shards, "tokens")
        return {
            "layout": "mosaicml.mds.v2",
            "tokenizer": _manifest_common(spec, o, shards),
            "seq_len": seq_len,
            "dtype": "int32",  # input_ids as stored (labels int64, loss_mask uint8, position_ids int32)
            "packing": o["packing"],
            "pad_id": int(o["pad_id"]),
            "mds": {"index": f"{DATA_PREFIX}/{INDEX}", "columns": mds_columns(seq_len),
                    "size_limit": int(o.get("mds_size_limit") or DEFAULT_SIZE_LIMIT)},
            "totals": {"sequences": seqs, "tokens": toks, "padding_tokens": _sum(shards, "padding_tokens"),
                       "loss_tokens": _sum(shards, "loss_tokens"), "documents": _sum(shards, "documents"),
                       "split_documents": _sum(shards, "split_documents"),
                       "long_documents": _sum(shards, "long_documents"),
                       "preference_pairs": _sum(shards, "preference_pairs"),
                       "fill_rate": round(toks / (seqs * seq_len), 6) if seqs else 0.0},
        }
