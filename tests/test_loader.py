"""The trainer-side loader: samples, rank slicing, exact resume."""
from __future__ import annotations

import json

import numpy as np
import pytest

from datakit.loader import IGNORE_INDEX, DatasetError, PackedDataset, epoch_order, torch_iterable
from datakit.stages.tokenize.direct import build_dataset
from datakit.stages.tokenize.stage import TokenizeConfig
from tests.stages.test_tokenize import TOKENIZER, code_records, sft_record, table


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rows = code_records(150, max_chars=2500) + [
        sft_record(f"s{i:03d}", [("user", f"q{i}"), ("assistant", f"a{i} " * (i + 1))]) for i in range(20)]
    out = tmp_path_factory.mktemp("loader") / "ds"
    build_dataset(table(rows), str(out), TokenizeConfig(tokenizer=TOKENIZER, seq_len=128, packing="best_fit"),
                  shards=3, seed=0)
    return PackedDataset(out)


def test_len_and_sample_fields(dataset):
    m = dataset.manifest
    assert len(dataset) == m["totals"]["sequences"] == sum(s["sequences"] for s in m["shards"]) > 20
    pad = m["pad_id"]
    for i in list(range(len(dataset)))[:: max(1, len(dataset) // 25)] + [-1]:
        s = dataset[i]
        ids, labels, mask, pos, cu = s["input_ids"], s["labels"], s["loss_mask"], s["position_ids"], s["cu_seqlens"]
        assert ids.shape == labels.shape == mask.shape == pos.shape == (128,) and ids.dtype == np.int64
        n = int(s["num_segments"])
        assert cu.shape == (dataset.max_segments + 1,) and int(s["index"]) == i % len(dataset)
        assert (cu[n:] == 128).all()  # fixed length: trailing zero-length segments
        cu = cu[: n + 1]
        assert cu[0] == 0 and cu[-1] == 128 and (np.diff(cu) > 0).all() and cu.dtype == np.int32
        # positions restart in every segment
        for a, b in zip(cu[:-1], cu[1:]):
            assert pos[a:b].tolist() == list(range(b - a))
        # labels: the token where it carries loss, except the first token of every segment after the first
        starts = set(cu[1:-1].tolist())
        for t in range(128):
            want = IGNORE_INDEX if (mask[t] == 0 or t in starts) else ids[t]
            assert labels[t] == want
        segs = dataset.segments(i)
        if segs[-1]["doc_id"] is None:  # padding segment: pad ids, no loss
            assert (ids[segs[-1]["start"]:] == pad).all() and mask[segs[-1]["start"]:].sum() == 0
    with pytest.raises(IndexError):
        dataset[len(dataset)]


def test_get_batch_matches_single_reads(dataset):
    idx = [len(dataset) - 1, 0, 5, 3, 5]
    raw = dataset.get_batch(idx, raw=True)
    b = dataset.get_batch(idx)
    L = dataset.seq_len
    for row, i in enumerate(idx):
        one = dataset[i]
        assert np.array_equal(raw["tokens"][row], one["input_ids"]) and raw["tokens"].dtype == dataset.dtype
        for key in ("input_ids", "labels", "loss_mask", "position_ids"):
            assert np.array_equal(b[key][row], one[key]), key
    # batch cu_seqlens = every sample's cu_seqlens shifted to its place in the flattened batch
    want = np.concatenate([dataset[i]["cu_seqlens"][:int(dataset[i]["num_segments"])] + row * L
                           for row, i in enumerate(idx)] + [[len(idx) * L]])
    assert np.array_equal(b["cu_seqlens"], want) and b["cu_seqlens"].dtype == np.int32
    with pytest.raises(IndexError, match=f"sequence {len(dataset)} out of range"):
        dataset.get_batch([len(dataset)])
    # from the end, as `dataset[-1]` reads (found in review: get_batch([-1]) raised)
    back = dataset.get_batch([-1, -len(dataset)])
    assert np.array_equal(back["input_ids"][0], dataset[-1]["input_ids"])
    assert np.array_equal(back["input_ids"][1], dataset[0]["input_ids"])
    with pytest.raises(IndexError, match=f"sequence {-len(dataset) - 1} out of range"):
        dataset.get_batch([-len(dataset) - 1])


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_ranks_disjoint_and_complete(dataset, world_size):
    n = len(dataset)
    slices = [dataset.iterator(rank=r, world_size=world_size, seed=11, epoch=2).indices for r in range(world_size)]
    flat = np.concatenate(slices)
    assert len(flat) == n and sorted(flat.tolist()) == list(range(n))  # complete, no overlap
    assert max(map(len, slices)) - min(map(len, slices)) <= 1
    # drop_last: equal steps on every rank, still disjoint
    eq = [dataset.iterator(r, world_size, 11, 2, drop_last=True).indices for r in range(world_size)]
    assert len({len(s) for s in eq}) == 1 and len(set(np.concatenate(eq).tolist())) == sum(map(len, eq))
    # the samples yielded are the sequences named by the indices
    it = dataset.iterator(rank=world_size - 1, world_size=world_size, seed=11, epoch=2)
    first = next(it)
    assert first["index"] == slices[-1][0] and np.array_equal(first["input_ids"], dataset[int(slices[-1][0])]["input_ids"])


def test_order_is_deterministic_and_changes_with_epoch_and_seed(dataset):
    n = len(dataset)
    a = dataset.iterator(0, 2, seed=1, epoch=0).indices
    assert np.array_equal(a, dataset.iterator(0, 2, seed=1, epoch=0).indices)
    assert not np.array_equal(a, dataset.iterator(0, 2, seed=1, epoch=1).indices)
    assert not np.array_equal(a, dataset.iterator(0, 2, seed=2, epoch=0).indices)
    assert epoch_order(n, 0, 0, shuffle=False).tolist() == list(range(n))
    # pinned values: the order must never change under a trainer between versions
    assert epoch_order(10, 0, 0).tolist() == [1, 4, 5, 7, 6, 9, 0, 3, 2, 8]
    assert epoch_order(10, 3, 1).tolist() == [1, 4, 8, 7, 2, 0, 6, 3, 9, 5]
    assert sorted(epoch_order(1000, 5, 3).tolist()) == list(range(1000))


def test_resume_mid_epoch_yields_exactly_the_remaining(dataset):
    full = [int(s["index"]) for s in dataset.iterator(rank=1, world_size=3, seed=4, epoch=1)]
    it = dataset.iterator(rank=1, world_size=3, seed=4, epoch=1)
    head = [int(next(it)["index"]) for _ in range(len(full) // 2)]
    state = json.loads(json.dumps(it.state_dict()))  # survives a checkpoint file
    resumed = dataset.iterator_from_state(state)
    tail = [int(s["index"]) for s in resumed]
    assert head + tail == full and len(tail) == len(full) - len(head)
    assert resumed.state_dict()["position"] == len(full)
    # a state from another dataset is refused
    state["dataset"] = "0" * 16
    with pytest.raises(DatasetError, match="different dataset"):
        dataset.iterator_from_state(state)


def test_not_a_dataset_is_a_clear_error(tmp_path, dataset):
    with pytest.raises(DatasetError, match="no manifest.json"):
        PackedDataset(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "parquet"}))
    with pytest.raises(DatasetError, match="expected 'packed'"):
        PackedDataset(tmp_path)
    with pytest.raises(ValueError, match="rank"):
        dataset.iterator(rank=2, world_size=2)


def _tamper(m: dict, what: str) -> dict | str:
    m = json.loads(json.dumps(m))
    if what == "version":
        m["format_version"] = 99
    elif what == "one_more":
        m["shards"][0]["sequences"] += 1
        m["totals"]["sequences"] += 1
    elif what == "one_less":
        m["shards"][0]["sequences"] -= 1
    elif what == "seq_len":
        m["seq_len"] //= 2
    elif what == "no_shards":
        del m["shards"]
    elif what == "no_array":
        del m["shards"][1]["arrays"]["segments"]
    elif what == "shard_dropped":
        del m["shards"][2]
    elif what == "not_json":
        return "{not json"
    elif what == "sequences_text":
        m["shards"][1]["sequences"] = "many"
    elif what == "shard_a_string":
        m["shards"][1] = "data/tokens-00001.npy"
    elif what == "files_null":
        m["shards"][0]["files"] = None
    elif what == "dtype_bogus":
        m["dtype"] = "uint16x"
    elif what == "dtype_narrower":
        m["dtype"] = "uint8"
    elif what == "shard_twice":
        m["shards"][1]["shard"] = 0
    return m


def test_the_loader_reads_the_format_version_the_writers_write(dataset):
    from datakit.io.sinks import FORMAT_VERSION
    from datakit.loader import READS

    assert READS["format_version"] == FORMAT_VERSION == dataset.manifest["format_version"]


@pytest.mark.parametrize("what, message", [
    ("version", "format_version is 99; this datakit reads 2"),
    ("one_more", "holds .* sequences of 128 tokens, the manifest says"),
    ("one_less", "shards hold .* sequences, its totals say"),
    ("seq_len", "sequences of 128 tokens, the manifest says .* of 64"),
    ("no_shards", "manifest has no shards"),
    ("no_array", "shard 1 has no arrays.segments"),
    ("shard_dropped", "shards hold .* sequences, its totals say"),
    ("not_json", "not valid JSON"),
    # hand edits that were a ValueError, AttributeError or TypeError from inside, or silently wrong ids
    ("sequences_text", "manifest shard 1 is malformed"),
    ("shard_a_string", "manifest shard entry 1 is not an object"),
    ("files_null", "manifest shard 0 is malformed"),
    ("dtype_bogus", "manifest dtype is 'uint16x'; token arrays are uint16 or int32"),
    ("dtype_narrower", "manifest dtype is 'uint8'"),
    ("shard_twice", "manifest lists shard 0 twice"),
])
def test_a_manifest_that_does_not_describe_its_files_is_one_clear_error(dataset, tmp_path, what, message):
    """Found in review: an edited or foreign manifest made the loader yield fewer sequences without a
    word, or fail later with a KeyError or a numpy error; `datakit inspect` exited 0 on it."""
    import shutil

    from datakit.cli.inspect import inspect_dataset

    shutil.copytree(dataset.path, tmp_path / "ds")
    m = _tamper(dataset.manifest, what)
    (tmp_path / "ds" / "manifest.json").write_text(m if isinstance(m, str) else json.dumps(m))
    with pytest.raises(DatasetError, match=message):
        ds = PackedDataset(tmp_path / "ds")
        ds[len(ds) - 1], ds[0]  # the shapes are checked when a shard is opened
    with pytest.raises((ValueError, DatasetError)):  # what `datakit inspect` says in one line, exit 2
        inspect_dataset(tmp_path / "ds", sequences=len(dataset))


def test_torch_adapter_is_optional(dataset):
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="numpy only"):
            torch_iterable(dataset)
        return
    ds = torch_iterable(dataset, rank=0, world_size=2, seed=1)  # pragma: no cover - torch not in CI by default
    got = [int(s["index"]) for s in ds]
    assert got == dataset.iterator(0, 2, 1).indices.tolist()


def test_inspect_shows_summary_boundaries_and_masks(dataset):
    from datakit.cli.inspect import NO_LOSS_CLOSE, NO_LOSS_OPEN, inspect_dataset

    text = inspect_dataset(dataset.path, sequences=len(dataset), max_chars=100_000)
    assert f"sequences {len(dataset)}" in text and "packing best_fit" in text and "fill)" in text
    assert text.count("═══ sequence") == len(dataset)
    n_segments = sum(len(dataset.segments(i)) for i in range(len(dataset)))
    assert text.count("\n── [") == n_segments
    # SFT user turns carry no loss, so they are shown inside the no-loss brackets; special tokens in « »
    assert f"{NO_LOSS_OPEN}«<|user|>»q" in text and NO_LOSS_CLOSE in text
    assert "<pad ×" in text or dataset.manifest["totals"]["padding_tokens"] == 0


def test_datakit_inspect_command(dataset, tmp_path):
    from typer.testing import CliRunner

    from datakit.cli import app

    res = CliRunner().invoke(app, ["inspect", str(dataset.path), "-n", "1"])
    assert res.exit_code == 0, res.output
    assert "═══ sequence 0" in res.output and "═══ sequence 1" not in res.output and "tokenizer" in res.output
    res = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    assert res.exit_code == 2 and "no manifest.json" in res.output and "Traceback" not in res.output


def test_a_pickled_dataset_carries_the_manifest_not_the_mapped_arrays(dataset):
    """Spawn/forkserver DataLoader workers get the dataset pickled: after one sample it carried every
    mapped array read so far (1.37 MB for a 1.35 MB dataset, found in review); each worker maps its own."""
    import os
    import pickle

    fresh = pickle.dumps(PackedDataset(dataset.path))
    dataset[0], dataset[-1]
    assert dataset._open  # arrays are mapped in this process
    shipped = pickle.dumps(dataset)
    data = sum(os.path.getsize(dataset.path / f) for s in dataset.shards for f in s["files"] if f.endswith(".npy"))
    assert len(shipped) < len(fresh) + 4096 < data
    clone = pickle.loads(shipped)
    assert clone._open == {} and clone.max_segments == dataset.max_segments
    assert all((clone[i]["input_ids"] == dataset[i]["input_ids"]).all() for i in (0, 5, -1))


def test_the_first_sample_maps_only_its_own_shard(dataset, tmp_path):
    """`max_segments` (the length of every sample's cu_seqlens) comes from the manifest: the first sample
    mapped every shard to find it, 4 open files per shard in each process (300 shards failed under a
    1024-descriptor limit, found in review). A dataset written before the manifest recorded it gets the
    same number from the files, which it does not keep open."""
    import shutil

    fresh = PackedDataset(dataset.path)
    fresh[0]
    assert list(fresh._open) == [0] and len(fresh.shards) == 3
    from_files = max(int(np.diff(np.load(dataset.path / s["arrays"]["seq_index"])).max()) for s in dataset.shards)
    assert fresh.max_segments == max(s["max_segments"] for s in fresh.manifest["shards"]) == from_files
    old = tmp_path / "old"
    shutil.copytree(dataset.path, old)
    m = json.loads((old / "manifest.json").read_text())
    for s in m["shards"]:
        del s["max_segments"]
    (old / "manifest.json").write_text(json.dumps(m))
    before = PackedDataset(old)
    assert before.max_segments == from_files and before._open == {}


def test_a_relative_path_keeps_naming_the_same_folder_after_chdir(dataset, monkeypatch):
    monkeypatch.chdir(dataset.path.parent)
    ds = PackedDataset(dataset.path.name)
    monkeypatch.chdir("/")
    assert (ds[0]["input_ids"] == dataset[0]["input_ids"]).all()


def test_a_dataset_rewritten_while_open_is_an_error_not_a_mix(tmp_path):
    """Found in review: a DataLoader's second epoch after a rerun into the folder read the new run's rows
    under the old manifest and fingerprint (a resume state was still accepted), and one batch mixed shards
    of both runs. A shard first mapped after the rewrite is now a DatasetError; opened again, it reads."""
    rows = code_records(60, max_chars=2500)
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=128, packing="best_fit")
    out = tmp_path / "ds"
    build_dataset(table(rows), str(out), cfg, shards=3, seed=0)
    ds = PackedDataset(out)
    first = ds[0]["input_ids"].copy()
    last = len(ds) - 1
    assert ds.locate(last)[0] == 2
    build_dataset(table(rows), str(out), cfg, shards=3, seed=1)  # a rerun into the same folder
    assert (ds[0]["input_ids"] == first).all()  # shard 0 was mapped before: the old bytes, consistently
    with pytest.raises(DatasetError, match="replaced since the dataset was opened"):
        ds[last]
    with pytest.raises(DatasetError, match="replaced since the dataset was opened"):
        ds.get_batch([0, last])
    again = PackedDataset(out)
    assert len(again[last]["input_ids"]) == 128


@pytest.mark.parametrize("damage, message", [
    ("header", "tokens-00001.npy is not a readable array file"),
    ("segments_short", "segments-00001.npy holds .* entries, its seq_index says"),
    ("segment_start", "shard 1, sequence 0: its segment index is damaged"),
    ("seq_index_order", "shard 1, sequence 0: its segment index is damaged"),
])
def test_a_damaged_array_file_of_the_same_size_is_one_clear_error(dataset, tmp_path, damage, message):
    """Damage the size check cannot see: a header overwritten in place was numpy's "pickled data" ValueError;
    a segments file shorter than its seq_index says was a broadcast error (found in review)."""
    import shutil

    shutil.copytree(dataset.path, tmp_path / "ds")
    data = tmp_path / "ds" / "data"
    if damage == "header":
        raw = bytearray((data / "tokens-00001.npy").read_bytes())
        raw[:6] = b"XXXXXX"
        (data / "tokens-00001.npy").write_bytes(bytes(raw))
    elif damage == "segments_short":
        segs = np.load(data / "segments-00001.npy")
        np.save(data / "segments-00001.npy", segs[:-3])
        m = json.loads((tmp_path / "ds" / "manifest.json").read_text())
        m["shards"][1]["bytes"]["data/segments-00001.npy"] = (data / "segments-00001.npy").stat().st_size
        (tmp_path / "ds" / "manifest.json").write_text(json.dumps(m))
    else:  # a value edited in place, same size (found in review: raw numpy errors, impossible boundaries)
        name = "segments-00001.npy" if damage == "segment_start" else "seq_index-00001.npy"
        arr = np.load(data / name)
        if damage == "segment_start":
            arr[0, 0] = 100000
        else:
            arr[1] = arr[2] + 5
        np.save(data / name, arr)
    ds = PackedDataset(tmp_path / "ds")
    with pytest.raises(DatasetError, match=message):
        ds.get_batch(list(range(len(ds))))
    if damage in ("segment_start", "seq_index_order"):
        first = int(ds._cum[1])  # the damaged shard's first sequence
        with pytest.raises(DatasetError, match=message):
            ds[first]
        with pytest.raises(DatasetError, match=message):
            ds.segments(first)


def test_verify_checks_the_tokenizer_the_tokens_were_made_with(dataset, tmp_path):
    """Found in review: a copy whose tokenizer.json was replaced by another tokenizer passed verify=True
    and `inspect --verify`, and inspect decoded its tokens with the foreign tokenizer; without the file,
    inspect printed raw ids without saying why."""
    import shutil

    from typer.testing import CliRunner

    from datakit.cli import app

    copy = tmp_path / "ds"
    shutil.copytree(dataset.path, copy)
    PackedDataset(copy, verify=True)  # the copy as written passes
    tok = json.loads((copy / "tokenizer.json").read_text())
    tok.setdefault("added_tokens", []).append({**tok["added_tokens"][0], "id": 99999, "content": "<|other|>"})
    (copy / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(DatasetError, match="is not the tokenizer the tokens were made with"):
        PackedDataset(copy, verify=True)
    res = CliRunner().invoke(app, ["inspect", str(copy), "--verify"])
    assert res.exit_code == 2 and "is not the tokenizer" in res.output and "Traceback" not in res.output
    (copy / "tokenizer.json").unlink()
    with pytest.raises(DatasetError, match="tokenizer file tokenizer.json is missing"):
        PackedDataset(copy, verify=True)
    res = CliRunner().invoke(app, ["inspect", str(copy), "-n", "1"])
    assert res.exit_code == 0 and "token ids shown instead of text" in res.output, res.output


@pytest.mark.parametrize("kw", [{"seed": 1 << 32}, {"seed": -1}, {"epoch": 1 << 32}])
def test_seeds_and_epochs_beyond_32_bits_are_refused_not_aliased(dataset, kw):
    """Found in review: seed 2**32 gave seed 0's order (the two are mixed as 32-bit halves)."""
    with pytest.raises(ValueError, match=r"is not in \[0, 2\*\*32\)"):
        dataset.iterator(**kw)
    dataset.iterator(seed=(1 << 32) - 1, epoch=(1 << 32) - 1)


@pytest.mark.parametrize("kw", [{"seed": 1.5}, {"seed": True}, {"epoch": 0.5}, {"rank": 0.0}, {"world_size": "2"}])
def test_a_seed_epoch_or_rank_that_is_not_an_integer_is_refused(dataset, kw):
    """Found in review: seed=1.5 gave seed 1's order (and True that of 1), and the state stored 1.5."""
    with pytest.raises(ValueError, match="must be an integer"):
        dataset.iterator(**kw)
    assert dataset.iterator(seed=np.int64(3)).state_dict()["seed"] == 3


def test_an_index_that_is_not_an_integer_is_refused_and_a_bad_one_named_as_given(dataset):
    """Found in review: `get_batch([1.5])` read row 1, and `ds[-n - 1]` said "sequence -1 out of range"."""
    n = len(dataset)
    for bad in ([1.5], [True], np.array([0.0])):
        with pytest.raises(TypeError, match="integers"):
            dataset.get_batch(bad)
    with pytest.raises(TypeError, match="integer"):
        dataset[1.5]
    with pytest.raises(IndexError, match=f"sequence {-n - 1} out of range"):
        dataset[-n - 1]
    assert dataset.get_batch(np.array([0, -1], np.int32))["input_ids"].shape[0] == 2


def test_inspect_shows_control_characters_of_the_data_instead_of_sending_them_to_the_terminal(monkeypatch):
    """Found in review: an OSC sequence in training text (`ESC ] 0;PWNED BEL`) reached the terminal raw
    and retitled it; OSC 52 can write the clipboard."""
    from typer.testing import CliRunner

    from datakit.cli import app
    from datakit.cli import inspect as inspect_cli

    monkeypatch.setattr(inspect_cli, "inspect_dataset", lambda *a, **k: "x = 1\x1b]0;PWNED\x07\n\tdef f(): pass\x9b2J")
    res = CliRunner().invoke(app, ["inspect", "anywhere"])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\x07" not in res.output and "\x9b" not in res.output
    assert "x = 1\\x1b]0;PWNED\\x07\n\tdef f(): pass\\x9b2J" in res.output


@pytest.mark.parametrize("damage", ["doc_row", "docs_footer"])
def test_damaged_document_rows_or_docs_table_are_one_clear_error(dataset, tmp_path, damage):
    """Found in review: a same-size edit of a segment's document row was an IndexError from `segments`
    and a damaged `docs-*.parquet` footer a pyarrow OSError, both tracebacks (exit 1) from `datakit
    inspect`; and the damaged table broke every shard's segments. One line, exit 2, that shard only."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(dataset.path, tmp_path / "ds")
    data = tmp_path / "ds" / "data"
    if damage == "doc_row":
        arr = np.load(data / "segments-00001.npy")
        arr[0, 1] = 10 ** 6
        np.save(data / "segments-00001.npy", arr)
        message = "shard 1, sequence 0: a segment names document row 1000000 of"
    else:
        raw = bytearray((data / "docs-00001.parquet").read_bytes())
        raw[-10] ^= 0xFF  # inside the footer's length or its magic: same size
        (data / "docs-00001.parquet").write_bytes(bytes(raw))
        message = "docs-00001.parquet cannot be read"
    ds = PackedDataset(tmp_path / "ds")
    first = int(ds._cum[1])  # the damaged shard's first sequence
    with pytest.raises(DatasetError, match=message):
        ds.segments(first)
    assert ds.segments(0)  # the other shards are read as before
    r = subprocess.run([sys.executable, "-m", "datakit.cli", "inspect", str(tmp_path / "ds"), "-n", str(first + 1)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and message.split(":")[0] in r.stderr, r.stderr[-2000:]


def test_inspect_tells_a_special_token_from_its_text_and_shows_megatron_masks(tmp_path):
    """Found in review: `x = '<|endoftext|>'` and the real EOS after it printed alike; and a Megatron output's
    untrained tokens were shown as trained (its loss_mask dataset was never read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datakit import Pipeline
    from datakit.cli.inspect import NO_LOSS_OPEN, inspect_dataset
    from datakit.contracts import TRAINING_RECORD_V1

    recs = [{"doc_id": "c1", "kind": "code", "segments": [{"text": "x = '<|endoftext|>'\nprint(x)\n", "train": True,
                                                           "role": "code"}], "chosen": None, "rejected": None,
             "source": None, "meta": "{}"},
            {"doc_id": "s1", "kind": "sft", "segments": [{"text": "hello there", "train": False, "role": "user"},
                                                         {"text": "general kenobi", "train": True, "role": "assistant"}],
             "chosen": None, "rejected": None, "source": None, "meta": "{}"}]
    pq.write_table(pa.Table.from_pylist(recs, schema=TRAINING_RECORD_V1), tmp_path / "r.parquet")
    for fmt in ("packed", "megatron"):
        out = tmp_path / fmt
        (Pipeline("i").input(str(tmp_path / "r.parquet"), format="parquet", schema="training_record.v1")
         .add({"kind": "tokenize", "tokenizer": "datakit:demo-bpe", "seq_len": 64})
         .output(str(out), format=fmt, shards=1, allow_unmasked=True)).run(workers=1)
        text = inspect_dataset(str(out), sequences=4, max_chars=10_000)
        assert "x = '<|endoftext|>'\nprint(x)\n«<|endoftext|>»" in text, text
        assert f"{NO_LOSS_OPEN}«<|user|>»hello there" in text, text
