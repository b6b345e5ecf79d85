"""`format: mds` (MosaicML Streaming): the same packed sequences as `format: packed`, in shards that
mosaicml-streaming's own `StreamingDataset` reads and that its own `MDSWriter` writes byte for byte.

It also runs the README's streaming snippet. mosaicml-streaming cannot live in the project's venv (0.13.0 pins numpy < 2.2, xxhash < 4,
transformers < 5), so the real client runs in its own venv built from requirements-mds.lock
(`make venv-mds`, part of `make test`); tests/mds_client.py is what runs there. Without that venv
the client test is skipped locally and fails under CI. The spec-reader test needs nothing extra.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from datakit.loader import PackedDataset
from datakit.stages.tokenize.direct import build_dataset
from datakit.stages.tokenize.mds import mds_columns
from datakit.stages.tokenize.stage import TokenizeConfig
from tests.readme import streaming_snippet
from tests.stages.test_tokenize import TOKENIZER, code_records, fim_record, sft_record, table

ROOT = Path(__file__).resolve().parents[1]
SEQ_LEN, SIZE_LIMIT = 128, 20_000  # small files: every datakit shard is split into several .mds parts
DTYPES = {"input_ids": np.int32, "labels": np.int64, "loss_mask": np.uint8, "position_ids": np.int32}


def mds_python() -> Path | None:
    """The mosaicml-streaming venv's interpreter (DATAKIT_MDS_PYTHON, else the checkout's .venv-mds)."""
    p = Path(os.environ.get("DATAKIT_MDS_PYTHON") or ROOT / ".venv-mds" / "bin" / "python")
    return p if p.exists() else None


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The same records and settings written as `mds` and as `packed` (2 shards)."""
    root = tmp_path_factory.mktemp("mds")
    rows = code_records(60, max_chars=1500)
    rows += [sft_record(f"s{i:03d}", [("user", f"question {i}?"), ("assistant", f"answer {i}\n" * (i % 4 + 1))])
             for i in range(20)]
    rows += [fim_record(f"f{i:03d}", f"x{i} = (", f"{i} + 1", ")\n") for i in range(10)]
    rows += [{"doc_id": f"p{i:03d}", "kind": "preference",
              "segments": [{"text": f"prompt {i} ", "train": False, "role": "prompt"}],
              "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(6)]
    records = table(rows)
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=SEQ_LEN, fim_rate=0.3)
    mds = build_dataset(records, str(root / "mds"), cfg, shards=2, format="mds",
                        writer_options={"mds_size_limit": SIZE_LIMIT})
    packed = build_dataset(records, str(root / "packed"), cfg, shards=2, format="packed")
    return root, mds, packed


def expected_samples(root: Path, packed: dict) -> dict[str, dict[str, np.ndarray]]:
    """Per datakit shard, the MDS columns of each sequence as datakit.loader gives them for `packed`."""
    ds = PackedDataset(root / "packed")
    out, start = {}, 0
    for s in sorted(packed["shards"], key=lambda s: s["shard"]):
        items = [ds[i] for i in range(start, start + s["sequences"])]
        start += s["sequences"]
        out[f"{s['shard']:05d}"] = {k: np.stack([it[k] for it in items]).astype(t) for k, t in DTYPES.items()}
    return out


def read_mds_file(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """An MDS shard file read from the format spec (not with our writer's code): u32 count n,
    u32 offsets[n+1], config JSON, then per sample each column's fixed-size bytes in name order."""
    data = path.read_bytes()
    (n,) = struct.unpack_from("<I", data, 0)
    offsets = np.frombuffer(data, "<u4", n + 1, 4)
    config = json.loads(data[4 + 4 * (n + 1):offsets[0]])
    assert offsets[-1] == len(data)
    cols: dict[str, list] = {name: [] for name in config["column_names"]}
    for i in range(n):
        pos = int(offsets[i])
        for name, enc, size in zip(config["column_names"], config["column_encodings"], config["column_sizes"]):
            _, dtype, shape = enc.split(":")
            cols[name].append(np.frombuffer(data, dtype, int(shape), pos))
            pos += size
        assert pos == offsets[i + 1]
    return config, {k: np.stack(v) for k, v in cols.items()}


def test_mds_holds_the_packed_sequences_with_masks_and_boundaries(outputs):
    root, mds, packed = outputs
    index = json.loads((root / "mds" / "data" / "index.json").read_text())
    assert index["version"] == 2 and mds["layout"] == "mosaicml.mds.v2"
    assert sum(e["samples"] for e in index["shards"]) == mds["totals"]["sequences"] == packed["totals"]["sequences"]
    assert len(index["shards"]) > 2 * 2  # the size limit split each datakit shard into several files
    want = expected_samples(root, packed)
    for shard, cols in want.items():
        files = [e for e in index["shards"] if e["raw_data"]["basename"].startswith(f"shard.{shard}.")]
        parts = [read_mds_file(root / "mds" / "data" / e["raw_data"]["basename"]) for e in files]
        assert all(p[0]["size_limit"] == SIZE_LIMIT and p[0]["column_names"] == sorted(DTYPES) for p in parts)
        for name in DTYPES:
            got = np.concatenate([p[1][name] for p in parts])
            assert np.array_equal(got, cols[name]), (shard, name)
    # masks really travel: SFT prompts and padding carry no loss, labels say -100 there
    mask = np.concatenate([c["loss_mask"] for c in want.values()])
    labels = np.concatenate([c["labels"] for c in want.values()])
    assert 0 < int(mask.sum()) < mask.size and ((labels == -100) >= (mask == 0)).all()
    # preference pairs are not packed: Parquet beside the shards, named by the card for HF datasets
    pref = [f for s in mds["shards"] for f in s["files"] if "preference-" in f]
    assert sum(pq.read_metadata(root / "mds" / f).num_rows for f in pref) == 6
    assert "preference-" in (root / "mds" / "README.md").read_text()
    assert "data/index.json" in mds["dataset_files"]["files"]


def test_pipeline_writes_identical_mds_on_one_or_two_workers(outputs, tmp_path):
    """Through a pipeline file (compile checks, sink options, engine, commit): same bytes for any
    worker count, and the same data files as the direct writer above."""
    from datakit import Pipeline
    from tests.conformance import LOCAL_VARIANTS, assert_conformant

    root, mds, _ = outputs
    (tmp_path / "in").mkdir()
    pq.write_table(table(code_records(40, max_chars=800)), tmp_path / "in" / "a.parquet")
    p = (Pipeline(name="mds", seed=0)
         .input(str(tmp_path / "in" / "*.parquet"), format="parquet", schema="training_record.v1")
         .add({"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": SEQ_LEN})
         .output(str(tmp_path / "out"), format="mds", shards=2, mds_size_limit=SIZE_LIMIT))
    sums = assert_conformant(p, tmp_path, variants=LOCAL_VARIANTS)
    assert "data/index.json" in sums and sum(f.endswith(".mds") for f in sums) >= 2
    out = next(tmp_path.glob("conf-0-*"))
    m = json.loads((out / "manifest.json").read_text())
    index = json.loads((out / "data" / "index.json").read_text())
    assert sum(e["samples"] for e in index["shards"]) == m["totals"]["sequences"] > 0
    # the output option reaches the writer (found in review: documented, but no pipeline field took it)
    assert {e["size_limit"] for e in index["shards"]} == {SIZE_LIMIT} == {m["mds"]["size_limit"]}
    assert "StreamingDataset" in (out / "README.md").read_text()


def test_streaming_reads_our_shards_and_its_writer_writes_the_same_bytes(outputs, tmp_path):
    py = mds_python()
    if py is None:
        if os.environ.get("CI"):
            pytest.fail("the mosaicml-streaming venv is missing: `make test` builds it (make venv-mds)")
        pytest.skip("no mosaicml-streaming venv (make venv-mds, or DATAKIT_MDS_PYTHON)")
    root, mds, packed = outputs
    want = expected_samples(root, packed)
    np.savez(tmp_path / "expect.npz", **{f"{s}/{k}": v for s, cols in want.items() for k, v in cols.items()})
    req = {"dataset": str(root / "mds" / "data"), "expect": str(tmp_path / "expect.npz"),
           "columns": mds_columns(SEQ_LEN), "size_limit": SIZE_LIMIT, "work": str(tmp_path / "theirs"),
           "result": str(tmp_path / "result.npz"), "snippet": streaming_snippet(), "snippet_cwd": str(tmp_path)}
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mds").symlink_to(root / "mds")  # the README's path
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    r = subprocess.run([str(py), str(ROOT / "tests" / "mds_client.py"), json.dumps(req)], capture_output=True,
                       text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = np.load(tmp_path / "result.npz")
    # 1. StreamingDataset gives every sequence, in index order, with our values
    for name in DTYPES:
        assert np.array_equal(res[f"read/{name}"], np.concatenate([c[name] for c in want.values()])), name
    assert res["batch_shapes"].tolist() == [[4, SEQ_LEN]] * 4 and bool(res["batch_labels_is_int64"])
    # the README's snippet: a batch of 8 fixed-shape samples, labels ready for a HF model's loss
    assert np.array_equal(res["snippet_input_ids"], res["read/input_ids"][:8])
    assert str(res["snippet_labels_dtype"]) == "torch.int64"
    # 2. MDSWriter given the same samples writes the same bytes and the same index entries
    ours = json.loads((root / "mds" / "data" / "index.json").read_text())["shards"]
    theirs = json.loads(str(res["index"]))
    for shard, entries in theirs.items():
        mine = [e for e in ours if e["raw_data"]["basename"].startswith(f"shard.{shard}.")]
        strip = [{**e, "raw_data": {**e["raw_data"], "basename": None}} for e in mine]
        assert strip == [{**e, "raw_data": {**e["raw_data"], "basename": None}} for e in entries], shard
        assert [hashlib.sha256((root / "mds" / "data" / e["raw_data"]["basename"]).read_bytes()).hexdigest()
                for e in mine] == res[f"sha256/{shard}"].tolist(), shard


def test_masked_data_to_mds_compiles_and_needs_a_tokenize_stage(tmp_path):
    """MDS samples carry the masks (labels/loss_mask), so SFT data is no compile error there (it is for
    megatron); without a tokenize stage the format is refused before any work."""
    from datakit import Pipeline
    from datakit.pipeline import PipelineError

    pq.write_table(table(code_records(2)), tmp_path / "in.parquet")  # records input: kinds unknown, masks assumed
    src = Pipeline("m").input(str(tmp_path / "in.parquet"), format="parquet", schema="training_record.v1")
    src.add({"kind": "tokenize", "tokenizer": TOKENIZER}).output(str(tmp_path / "o"), format="mds").compile()
    with pytest.raises(PipelineError, match="cannot carry loss masks"):
        src.output(str(tmp_path / "o"), format="megatron").compile()
    with pytest.raises(PipelineError, match="needs a tokenize stage"):
        Pipeline("n").input(str(tmp_path / "in.parquet"), format="parquet", schema="training_record.v1").output(
            str(tmp_path / "o"), format="mds").compile()
    with pytest.raises(PipelineError, match="mds_size_limit is for format mds"):
        src.output(str(tmp_path / "o"), format="packed", mds_size_limit=1 << 20).compile()


def test_inspect_shows_mds_sequences(outputs):
    """`datakit inspect` decodes MDS samples (read from the files, no mosaicml-streaming needed)."""
    from datakit.cli.inspect import inspect_dataset
    from datakit.stages.tokenize.tokenizers import load_tokenizer

    root, mds, packed = outputs
    text = inspect_dataset(root / "mds", sequences=2, max_chars=100_000)
    want = expected_samples(root, packed)["00000"]
    ids = want["input_ids"][0]
    starts = np.flatnonzero(want["position_ids"][0] == 0).tolist() + [len(ids)]
    first_doc_end = starts[1]
    assert f"sequences {mds['totals']['sequences']}" in text and "═══ sequence 1:" in text
    # found in review: the MDS manifest had no long_documents, and inspect printed 0 for it
    assert packed["totals"]["long_documents"] > 0
    assert f"{packed['totals']['long_documents']} longer than seq_len" in text
    assert load_tokenizer(TOKENIZER).decode(ids[:first_doc_end].tolist())[:40] in text


def test_inspect_names_a_damaged_mds_shard(outputs, tmp_path):
    """Found in review: a damaged MDS shard header was a bare numpy ValueError naming no file."""
    import shutil

    from datakit.cli.inspect import inspect_dataset
    from datakit.loader import DatasetError

    root, _, _ = outputs
    copy = tmp_path / "mds"
    shutil.copytree(root / "mds", copy)
    shard = sorted((copy / "data").glob("shard.*.mds"))[0]
    shard.write_bytes(b"\xff\xff\xff\x7f" + shard.read_bytes()[4:])  # same size: the manifest check passes
    with pytest.raises(DatasetError, match=rf"{shard.name} is damaged"):
        inspect_dataset(copy, sequences=2)
