"""`tokenizer:` by Hugging Face Hub name, resolved through huggingface_hub's cache (a fixture laid out
exactly like a Hub cache folder; never the network), and a vocabulary above 65,535 ids (built here)
going through the real pipeline into every format with a wide enough dtype."""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from datakit import Pipeline
from datakit.loader import PackedDataset
from datakit.stages.tokenize.tokenizers import TokenizerError, load_tokenizer
from tests.stages.test_tokenize import table

COMMIT = "0123456789abcdef0123456789abcdef01234567"
VOCAB = 70_000  # > 65,535: uint16 cannot hold the ids


def _big_vocab_tokenizer_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok.to_str()


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """HF_HUB_CACHE/models--acme--big-vocab/{refs/main, snapshots/<commit>/tokenizer.json -> blobs/<sha256>}."""
    root = tmp_path_factory.mktemp("hub")
    repo = root / "models--acme--big-vocab"
    data = _big_vocab_tokenizer_json().encode()
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    os.symlink(os.path.relpath(blob, snap), snap / "tokenizer.json")
    return root


@pytest.fixture
def offline_hub(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a cache miss must never reach for the network
    return hub_cache


def test_hub_name_resolves_through_the_cache_offline(offline_hub):
    tok = load_tokenizer("acme/big-vocab")
    assert tok.name == f"acme/big-vocab@{COMMIT}"  # pinned to the snapshot the cache holds
    assert tok.vocab_size > VOCAB and tok.encode_batch(["w69999 w3"])[0] == [69999, 3]
    assert load_tokenizer(f"acme/big-vocab@{COMMIT}").sha256 == tok.sha256
    with pytest.raises(TokenizerError, match="not in the Hugging Face cache and HF_HUB_OFFLINE"):
        load_tokenizer("acme/not-downloaded")


@pytest.mark.parametrize("fmt", ["packed", "megatron", "parquet"])
def test_large_vocab_hub_tokenizer_through_the_pipeline(offline_hub, tmp_path, fmt):
    words = [f"w{i}" for i in (69_999, 65_536, 12, 65_535, 68_000, 7)]
    rows = [{"doc_id": f"d{i:03d}", "kind": "code",
             "segments": [{"text": " ".join(words[j % 6] for j in range(i, i + 30)), "train": True, "role": None}]}
            for i in range(40)]
    pq.write_table(table(rows), tmp_path / "in.parquet")
    # `acme/big-vocab` is not a path below the pipeline's folder: it is the Hub id
    (tmp_path / "p.yaml").write_text(
        "name: big\ninput: {path: in.parquet, format: parquet, schema: training_record.v1}\n"
        "stages:\n  - {kind: tokenize, tokenizer: acme/big-vocab, seq_len: 64}\n"
        f"output: {{path: out, format: {fmt}, shards: 2, allow_unmasked: true}}\n")
    Pipeline.from_yaml(str(tmp_path / "p.yaml")).run(engine="local", workers=1)
    out = tmp_path / "out"
    m = json.loads((out / "manifest.json").read_text())
    want = {69_999, 65_536, 68_000}
    if fmt == "packed":
        assert m["dtype"] == "int32" and m["tokenizer"]["name"] == f"acme/big-vocab@{COMMIT}"
        ds = PackedDataset(out)
        seen = set(np.concatenate([ds[i]["input_ids"] for i in range(len(ds))]).tolist())
    elif fmt == "megatron":
        assert m["dtype"] == "int32"
        seen = set()
        for prefix in m["data_prefixes"]:
            idx = (out / f"{prefix}.idx").read_bytes()
            assert idx[17] == 4  # Megatron's dtype code for int32
            seen |= set(np.fromfile(out / f"{prefix}.bin", dtype="<i4").tolist())
    else:
        seen = {i for s in m["shards"] for f in s["files"]
                for ids in pq.read_table(out / f, columns=["input_ids"]).column(0).to_pylist() for i in ids}
    assert want <= seen


def test_a_hub_id_in_a_pipeline_ignores_a_folder_of_that_name_in_the_current_folder(offline_hub, tmp_path,
                                                                                   monkeypatch):
    """Found in review: run from a folder holding `acme/big-vocab/tokenizer.json`, a pipeline naming the Hub
    model `acme/big-vocab` failed ("tokenizer not found: <pipeline folder>/acme/big-vocab"); paths in a
    pipeline are relative to its file, so the current folder must not matter: the Hub model is used."""
    from tests.stages.test_tokenize import TOKENIZER

    rows = [{"doc_id": "d0", "kind": "code", "segments": [{"text": "w5 w69999", "train": True, "role": None}]}]
    (tmp_path / "p").mkdir()
    pq.write_table(table(rows), tmp_path / "p" / "in.parquet")
    (tmp_path / "p" / "p.yaml").write_text(
        "name: big\ninput: {path: in.parquet, format: parquet, schema: training_record.v1}\n"
        "stages:\n  - {kind: tokenize, tokenizer: acme/big-vocab, seq_len: 64}\n"
        "output: {path: out, format: packed, shards: 1, allow_unmasked: true}\n")
    other = tmp_path / "cwd" / "acme" / "big-vocab"
    other.mkdir(parents=True)
    (other / "tokenizer.json").write_bytes(open(TOKENIZER, "rb").read())  # another tokenizer, same name
    monkeypatch.chdir(tmp_path / "cwd")
    Pipeline.from_yaml(str(tmp_path / "p" / "p.yaml")).run(engine="local", workers=1)
    m = json.loads((tmp_path / "p" / "out" / "manifest.json").read_text())
    assert m["tokenizer"]["name"] == f"acme/big-vocab@{COMMIT}"
    assert PackedDataset(tmp_path / "p" / "out")[0]["input_ids"][:2].tolist() == [5, 69999]


def test_repository_packing_uses_a_hub_tokenizers_own_file_separator(hub_cache, monkeypatch):
    """A Hub tokenizer with its own `<|file_sep|>` (Qwen2.5-Coder's) keeps it for repository packing:
    only local files were read for the separator, so a Hub id got `<file_sep>` added as a new token."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from datakit.stages.tokenize.tokenizers import file_sep_text

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|file_sep|>"])
    data = tok.to_str().encode()
    repo = hub_cache / "models--acme--with-sep"
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True, exist_ok=True)
    if not (snap / "tokenizer.json").exists():
        os.symlink(os.path.relpath(blob, snap), snap / "tokenizer.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert file_sep_text("acme/with-sep") == "<|file_sep|>"
    assert file_sep_text("hf:acme/with-sep") == "<|file_sep|>"
    assert file_sep_text("acme/big-vocab") == "<file_sep>"  # none of its own: the added one
    loaded = load_tokenizer("hf:acme/with-sep", {"file_sep": file_sep_text("acme/with-sep")})
    assert loaded.special["file_sep"] == 2  # its own id, no token added
