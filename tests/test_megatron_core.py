"""Megatron-core's own readers open our `format: megatron` output and see exactly our token ids.

`tests/stages/test_tokenize_packing.py` reads the files with a reader written from the format
spec; this test uses the real client: megatron-core 0.16.1 (the newest release that installs on
Python 3.11; it runs on the CPU torch of requirements.lock), its `IndexedDataset` (what
`--data-path` prefixes open) and its `GPTDataset` (what Megatron trains from: it concatenates the
documents in its own shuffled order and cuts samples of `sequence_length + 1` tokens).
"""
from __future__ import annotations

import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest

from datakit.stages.tokenize.direct import build_dataset, encode_records
from datakit.stages.tokenize.stage import TokenizeConfig
from tests.stages.test_tokenize import TOKENIZER, code_records, table

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": irrelevant to the readers
    warnings.simplefilter("ignore")
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    gpt = pytest.importorskip("megatron.core.datasets.gpt_dataset")
    from megatron.core.datasets.utils import Split


class _Tokenizer:
    """What GPTDataset asks of a tokenizer when the samples are already token ids."""

    def __init__(self, vocab_size: int, eod: int, pad: int) -> None:
        self.vocab_size, self.eod, self.pad = vocab_size, eod, pad
        self.unique_identifiers = {"class": "datakit-test-tokenizer"}


def test_indexed_and_gpt_dataset_read_our_ids(tmp_path):
    records = table(code_records(60, max_chars=900))
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=64)
    encoded, _, _ = encode_records(records, cfg)
    want = {r["doc_id"]: r["input_ids"] for r in encoded.to_pylist()}
    m = build_dataset(records, str(tmp_path / "meg"), cfg, shards=2, format="megatron")
    assert len(m["data_prefixes"]) == 2

    seen = 0
    for s, prefix in zip(sorted(m["shards"], key=lambda s: s["shard"]), m["data_prefixes"]):
        ds = indexed.IndexedDataset(str(tmp_path / "meg" / prefix))
        doc_ids = pq.read_table(tmp_path / "meg" / "data" / f"docs-{s['shard']:05d}.parquet").column("doc_id")
        assert len(ds) == len(doc_ids) and ds.index.dtype == np.uint16
        for k, doc_id in enumerate(doc_ids.to_pylist()):
            assert ds[k].tolist() == want[doc_id], doc_id
        seen += len(ds)
    assert seen == len(want) == m["totals"]["documents"]

    # GPTDataset over shard 0: every sample is seq_len+1 consecutive tokens of its shuffled document stream
    prefix = str(tmp_path / "meg" / m["data_prefixes"][0])
    ds = indexed.IndexedDataset(prefix)
    special = m["tokenizer"]["special_tokens"]
    config = gpt.GPTDatasetConfig(
        random_seed=1, sequence_length=64, split="1,0,0", path_to_cache=None,
        tokenizer=_Tokenizer(m["tokenizer"]["vocab_size"], special["eos"]["id"], special["pad"]["id"]),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    g = gpt.GPTDataset(ds, prefix, np.arange(len(ds)), None, Split.train, config)
    assert sorted(set(g.document_index.tolist())) == list(range(len(ds)))  # every document, once per epoch
    stream = np.concatenate([ds[int(d)] for d in g.document_index]).astype(np.int64)
    full = 0
    for i in range(len(g)):
        sample = g[i]
        text = np.concatenate([sample["tokens"].numpy()[:1], sample["labels"].numpy()])
        lo = int(g.shuffle_index[i]) * 64  # GPTDataset also shuffles the order of its samples
        if lo + 65 <= len(stream):
            assert np.array_equal(text, stream[lo:lo + 65]), i
            full += 1
    assert full >= len(g) - 1 > 10


def test_a_shard_without_documents_is_no_data_prefix(tmp_path):
    """Found in review: 40 events over 8 shards left shard 6 empty; its 0-byte .bin was still listed in
    `data_prefixes`, and megatron-core's IndexedDataset ("cannot mmap an empty file") stopped a trainer given
    the manifest's list, as the docs say to pass it. Every listed prefix opens now; masks stay aligned."""
    records = table(code_records(5, max_chars=300))
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=64)
    m = build_dataset(records, str(tmp_path / "meg"), cfg, shards=8, format="megatron")
    empty = [s["shard"] for s in m["shards"] if s["documents"] == 0]
    assert empty and len(m["data_prefixes"]) == 8 - len(empty) == len(m["loss_mask_prefixes"])
    assert not any(f"tokens-{s:05d}" in p for s in empty for p in m["data_prefixes"])
    assert sum(len(indexed.IndexedDataset(str(tmp_path / "meg" / p))) for p in m["data_prefixes"]) == 5
