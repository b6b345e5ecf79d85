"""Packing and output formats: nothing lost or doubled, boundaries kept, byte-identical output."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datakit.io.sinks import output_checksums
from datakit.loader import PackedDataset
from datakit.stages.tokenize.direct import build_dataset, encode_records
from datakit.stages.tokenize import packing
from datakit.stages.tokenize.packing import chunks, gather, gather_index, materialize, pack
from datakit.stages.tokenize.stage import TokenizeConfig
from datakit.stages.tokenize.tokenizers import load_tokenizer
from tests.stages.test_tokenize import TOKENIZER, code_records, fim_record, sft_record, table


# -- packing algorithms (property tests on lengths alone) -----------------------------------------

def rebuild(packed, seq_len: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """doc row -> (tokens, mask), reassembled from the segment index only."""
    pieces: dict[int, list] = {}
    for s in range(packed.tokens.shape[0]):
        segs = packed.segments[packed.seq_index[s]:packed.seq_index[s + 1]]
        ends = list(segs[1:, 0]) + [seq_len]
        assert segs[0, 0] == 0 and list(segs[:, 0]) == sorted(segs[:, 0])
        for (start, row, off), end in zip(segs.tolist(), ends):
            if row < 0:
                assert end == seq_len, "padding is only ever the tail of a sequence"
                assert (packed.loss_mask[s, start:end] == 0).all()
                continue
            pieces.setdefault(row, []).append((off, packed.tokens[s, start:end], packed.loss_mask[s, start:end]))
    out = {}
    for row, ps in pieces.items():
        ps.sort(key=lambda p: p[0])
        offs = np.cumsum([0] + [len(p[1]) for p in ps[:-1]])
        assert [p[0] for p in ps] == offs.tolist(), "pieces overlap or leave a gap"
        out[row] = (np.concatenate([p[1] for p in ps]), np.concatenate([p[2] for p in ps]))
    return out


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), max_size=60), seq_len=st.integers(8, 128),
       algorithm=st.sampled_from(["concat", "best_fit"]))
def test_pack_reconstructs_every_document(lengths, seq_len, algorithm):
    lengths = np.array(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = (np.arange(starts[-1]) * 7919 % 60000 + 5).astype(np.int64)
    masks = (np.arange(starts[-1]) % 3 != 0).astype(np.uint8)
    packed = materialize(pack(lengths, seq_len, algorithm), starts, values, masks, seq_len, 1, np.uint16)
    docs = rebuild(packed, seq_len)
    assert sorted(docs) == list(range(len(lengths)))
    for row, (toks, m) in docs.items():
        assert np.array_equal(toks, values[starts[row]:starts[row + 1]])
        assert np.array_equal(m, masks[starts[row]:starts[row + 1]])
    st_ = packed.stats
    assert st_["tokens"] == lengths.sum() and st_["tokens"] + st_["padding_tokens"] == packed.tokens.size
    if algorithm == "best_fit":
        assert st_["split_documents"] == 0
        # a document <= seq_len is always one piece
        for row, ln in enumerate(lengths):
            if ln <= seq_len:
                assert (packed.segments[:, 1] == row).sum() == 1
    else:
        assert packed.tokens.shape[0] == -(-int(lengths.sum()) // seq_len)  # concat wastes only the tail


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 40)), max_size=60))
def test_gather_index_is_the_concatenation_of_ranges(pieces):
    """Every piece's range in order, empty pieces contributing nothing (starts may repeat or go backwards)."""
    starts = np.array([s for s, _ in pieces], dtype=np.int64)
    lengths = np.array([n for _, n in pieces], dtype=np.int64)
    want = np.concatenate([np.arange(s, s + n) for s, n in pieces] + [np.zeros(0, np.int64)]).astype(np.int64)
    got = gather_index(starts, lengths)
    assert got.dtype == np.int64
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("algorithm", ["concat", "best_fit"])
def test_materialize_in_small_steps_gives_the_same_arrays(monkeypatch, algorithm):
    """The writer gathers tokens a bounded number at a time (memory); every step size gives the same bytes."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 400, 300).astype(np.int64)
    lengths[::37] = 0  # null rows have no tokens
    starts = rng.permutation(np.concatenate([[0], np.cumsum(lengths)[:-1]]))  # shuffled, like the writer's
    values = rng.integers(0, 60000, int(lengths.sum()) + 1000).astype(np.int32)
    masks = rng.integers(0, 2, len(values)).astype(np.uint8)
    whole = materialize(pack(lengths, 128, algorithm), starts, values, masks, 128, 1, np.uint16, doc_len=lengths)
    for step in (1, 7, 500, 3000):
        monkeypatch.setattr(packing, "GATHER_STEP_TOKENS", step)
        parts = chunks(lengths)
        assert parts[0].start == 0 and parts[-1].stop == len(lengths)
        assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))
        assert all(lengths[p].sum() <= step or p.stop - p.start == 1 for p in parts)
        stepped = materialize(pack(lengths, 128, algorithm), starts, values, masks, 128, 1, np.uint16, doc_len=lengths)
        assert np.array_equal(stepped.tokens, whole.tokens) and np.array_equal(stepped.loss_mask, whole.loss_mask)
        assert np.array_equal(stepped.segments, whole.segments) and stepped.stats == whole.stats
        assert np.array_equal(gather(values, starts, lengths), values[gather_index(starts, lengths)])
    assert gather(values, starts[:0], lengths[:0]).dtype == values.dtype


@pytest.mark.parametrize("algorithm", ["concat", "best_fit"])
@pytest.mark.parametrize("max_len", [3, 60, 400, 5000])
def test_materialize_by_slices_and_by_index_give_the_same_arrays(monkeypatch, algorithm, max_len):
    """The two copy paths (a slice per piece for long pieces, index arrays for short ones) write the same
    bytes, also when masks sit at other offsets than tokens (the writer's shuffled list columns)."""
    rng = np.random.default_rng(max_len)
    lengths = rng.integers(0, max_len, 300).astype(np.int64)
    lengths[::37] = 0
    perm = rng.permutation(len(lengths))  # documents laid out in another order than their rows (shuffled)
    starts = np.empty_like(lengths)
    starts[perm] = np.cumsum(lengths[perm]) - lengths[perm]
    mask_starts = starts + 7  # masks at other offsets than their tokens
    values = rng.integers(0, 60000, int(lengths.sum()) + 1000).astype(np.int32)
    masks = rng.integers(0, 2, len(values) + 7).astype(np.uint8)
    results = []
    for threshold in (0, 1 << 40):  # every piece by slices / every piece by index
        monkeypatch.setattr(packing, "SLICE_COPY_MIN_MEAN", threshold)
        results.append(materialize(pack(lengths, 128, algorithm), starts, values, masks, 128, 1, np.uint16,
                                   mask_start=mask_starts, doc_len=lengths))
    by_slices, by_index = results
    assert np.array_equal(by_slices.tokens, by_index.tokens) and np.array_equal(by_slices.loss_mask, by_index.loss_mask)
    assert np.array_equal(by_slices.segments, by_index.segments) and by_slices.stats == by_index.stats
    docs = rebuild(by_slices, 128)
    for row, (toks, m) in docs.items():
        assert np.array_equal(toks, values[starts[row]:starts[row] + lengths[row]])
        assert np.array_equal(m, masks[mask_starts[row]:mask_starts[row] + lengths[row]])


@pytest.mark.parametrize("start_dtype", [np.int64, np.int32, np.uint32, np.uint64])
def test_materialize_takes_starts_of_any_integer_type(monkeypatch, start_dtype):
    """uint64 + int64 is float64 in numpy: the slice path casts starts first (a review found a TypeError)."""
    lengths = np.array([300, 0, 90, 500], dtype=np.int64)
    starts = np.array([0, 300, 300, 390], dtype=start_dtype)
    values = np.arange(890, dtype=np.int32)
    masks = (np.arange(890) % 2).astype(np.uint8)
    got = []
    for threshold in (0, 1 << 40):
        monkeypatch.setattr(packing, "SLICE_COPY_MIN_MEAN", threshold)
        got.append(materialize(pack(lengths, 128, "best_fit"), starts, values, masks, 128, 1, np.uint16, doc_len=lengths))
    assert np.array_equal(got[0].tokens, got[1].tokens) and np.array_equal(got[0].loss_mask, got[1].loss_mask)


def test_materialize_by_slices_rejects_rows_outside_the_buffer(monkeypatch):
    """A piece whose source runs past the token buffer is an error on both paths (a slice of length 1
    would otherwise be broadcast over the whole piece)."""
    monkeypatch.setattr(packing, "SLICE_COPY_MIN_MEAN", 0)
    lengths = np.array([100], dtype=np.int64)
    with pytest.raises(IndexError):
        materialize(pack(lengths, 128, "best_fit"), np.array([99]), np.arange(100, dtype=np.int32),
                    np.ones(200, np.uint8), 128, 1, np.uint16, doc_len=lengths)


def test_best_fit_packs_tighter_than_first_fit_bound_and_never_splits():
    rng = np.random.default_rng(1)
    lengths = np.minimum(rng.lognormal(5.0, 1.0, 3000).astype(np.int64) + 1, 5000)
    p = pack(lengths, 512, "best_fit")
    real = lengths.sum()
    assert real / (p.n_sequences * 512) > 0.99
    c = pack(lengths, 512, "concat")
    assert c.n_sequences == -(-real // 512)


# -- the packed writer, end to end -----------------------------------------------------------------

@pytest.fixture(scope="module")
def mixed_records() -> pa.Table:
    rows = code_records(120, max_chars=3000)
    rows += [sft_record(f"s{i:03d}", [("user", f"question {i}?"), ("assistant", f"answer {i}\n" * (i % 5 + 1))])
             for i in range(30)]
    rows += [fim_record(f"f{i:03d}", f"x{i} = (", f"{i} + 1", ")\nprint(x)\n") for i in range(30)]
    rows += [{"doc_id": f"p{i:03d}", "kind": "preference",
              "segments": [{"text": f"prompt {i}", "train": False, "role": "prompt"}],
              "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(10)]
    return table(rows)


@pytest.mark.parametrize("packing", ["concat", "best_fit"])
def test_decode_of_packed_dataset_reconstructs_every_document(tmp_path, mixed_records, packing):
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=256, packing=packing, fim_rate=0.3)
    encoded, drops, _ = encode_records(mixed_records, cfg, seed=5)
    assert drops == {}
    manifest = build_dataset(mixed_records, str(tmp_path / "out"), cfg, shards=3, seed=5)
    ds = PackedDataset(tmp_path / "out", verify=True)
    tok = load_tokenizer(str(tmp_path / "out" / "tokenizer.json"), roles=False)

    # every document, reassembled from the sequences via segment -> doc_id, is exactly its encoding
    got: dict[str, list] = {}
    for i in range(len(ds)):
        tokens, mask, _ = ds.raw(i)
        for s in ds.segments(i):
            if s["doc_id"] is not None:
                got.setdefault(s["doc_id"], []).append(
                    (s["doc_offset"], np.asarray(tokens[s["start"]:s["end"]]), np.asarray(mask[s["start"]:s["end"]])))
    expect = {r["doc_id"]: r for r in encoded.to_pylist() if r["kind"] != "preference"}
    assert set(got) == set(expect)
    for doc_id, parts in got.items():
        parts.sort(key=lambda p: p[0])
        ids = np.concatenate([p[1] for p in parts]).tolist()
        assert ids == expect[doc_id]["input_ids"], doc_id
        assert np.concatenate([p[2] for p in parts]).tolist() == expect[doc_id]["loss_mask"]
    # and the text comes back: a code document decodes to its source + EOS (FIM ones reorder it)
    texts = {r["doc_id"]: r["segments"][0]["text"] for r in mixed_records.to_pylist() if r["kind"] == "code"}
    for doc_id, text in texts.items():
        if expect[doc_id]["fim_mode"] is None:
            ids = np.concatenate([p[1] for p in sorted(got[doc_id], key=lambda p: p[0])]).tolist()
            assert tok.decode(ids) == text + "<|endoftext|>"

    t = manifest["totals"]
    assert t["documents"] == len(expect) and t["preference_pairs"] == 10
    assert t["tokens"] == sum(len(r["input_ids"]) for r in expect.values())
    assert t["sequences"] == len(ds) and t["tokens"] + t["padding_tokens"] == len(ds) * 256
    if packing == "best_fit":
        assert t["split_documents"] == 0
    assert manifest["tokenizer"]["sha256"] == load_tokenizer(TOKENIZER).sha256
    assert manifest["tokenizer"]["special_tokens"]["eos"]["id"] == 0
    assert manifest["dtype"] == "uint16" and manifest["seq_len"] == 256 and manifest["packing"] == packing
    # the tokenizer saved beside the data is the effective one (same hash, added tokens included)
    assert load_tokenizer(str(tmp_path / "out"), roles=True).sha256 == manifest["tokenizer"]["sha256"]

    # preference pairs: Parquet with the columns DPO trainers expect
    prefs = pa.concat_tables([pq.read_table(tmp_path / "out" / s["preference_file"])
                              for s in manifest["shards"] if s.get("preference_file")])
    assert prefs.num_rows == 10 and {"prompt", "chosen", "rejected", "chosen_ids"} <= set(prefs.column_names)


def test_shards_open_with_plain_numpy_mmap(tmp_path, mixed_records):
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=128)
    m = build_dataset(mixed_records, str(tmp_path / "out"), cfg, shards=2)
    s = m["shards"][0]
    tokens = np.load(tmp_path / "out" / s["arrays"]["tokens"], mmap_mode="r")
    mask = np.load(tmp_path / "out" / s["arrays"]["loss_mask"], mmap_mode="r")
    segs = np.load(tmp_path / "out" / s["arrays"]["segments"], mmap_mode="r")
    index = np.load(tmp_path / "out" / s["arrays"]["seq_index"], mmap_mode="r")
    assert isinstance(tokens, np.memmap) and tokens.shape == (s["sequences"], 128) and tokens.dtype == np.uint16
    assert mask.shape == tokens.shape and index.shape == (s["sequences"] + 1,) and segs.shape[1] == 3
    assert int(np.asarray(mask).sum()) == s["loss_tokens"]


def test_output_is_byte_identical_whatever_the_input_order(tmp_path, mixed_records):
    """Row order/chunking differ per engine and worker count; the bytes must not."""
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=200, packing="best_fit", fim_rate=0.5)
    a = build_dataset(mixed_records, str(tmp_path / "a"), cfg, shards=3, seed=1, batch_rows=1000)
    perm = np.random.default_rng(0).permutation(mixed_records.num_rows)
    b = build_dataset(mixed_records.take(perm), str(tmp_path / "b"), cfg, shards=3, seed=1, batch_rows=17)
    assert output_checksums(str(tmp_path / "a")) == output_checksums(str(tmp_path / "b"))
    assert a["totals"] == b["totals"]
    # a different seed changes the shuffle (and FIM choices), so the bytes differ
    build_dataset(mixed_records, str(tmp_path / "c"), cfg, shards=3, seed=2)
    assert output_checksums(str(tmp_path / "c")) != output_checksums(str(tmp_path / "a"))


def test_packed_output_without_tokenize_stage_is_a_clear_error(tmp_path):
    from datakit.io.sinks import write_shard
    from datakit.plan import SinkSpec
    from datakit.stages.tokenize.encode import ENCODED_SCHEMA
    from datakit.stages.tokenize.writers import PackedOptionsError

    with pytest.raises(PackedOptionsError, match="needs a `tokenize` stage"):
        write_shard(ENCODED_SCHEMA.empty_table(), 0, SinkSpec(path=str(tmp_path), format="packed"), ENCODED_SCHEMA)


# -- Megatron export, read back with a reader written from the format spec -------------------------

def read_megatron(prefix: Path) -> tuple[np.dtype, list[np.ndarray], np.ndarray]:
    """An independent MMIDIDX reader, written from Megatron-LM's indexed_dataset spec.

    .idx = b"MMIDIDX\\x00\\x00" | <Q version=1 | <B dtype code | <Q sequence count S |
    <Q document count D | int32[S] sequence lengths | int64[S] byte pointers | int64[D] document indices.
    .bin = the token values; sequence k is `lengths[k]` items at byte `pointers[k]`.
    """
    codes = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
    with open(f"{prefix}.idx", "rb") as f:
        assert f.read(9) == b"MMIDIDX\x00\x00"
        (version,) = struct.unpack("<Q", f.read(8))
        assert version == 1
        (code,) = struct.unpack("<B", f.read(1))
        (n_seq,) = struct.unpack("<Q", f.read(8))
        (n_doc,) = struct.unpack("<Q", f.read(8))
        lengths = np.frombuffer(f.read(4 * n_seq), dtype="<i4")
        pointers = np.frombuffer(f.read(8 * n_seq), dtype="<i8")
        doc_idx = np.frombuffer(f.read(8 * n_doc), dtype="<i8")
        assert f.read() == b""
    dtype = np.dtype(codes[code])
    data = Path(f"{prefix}.bin").read_bytes()
    seqs = [np.frombuffer(data, dtype=dtype, count=int(n), offset=int(p)) for n, p in zip(lengths, pointers)]
    assert sum(len(s) for s in seqs) * dtype.itemsize == len(data)
    return dtype, seqs, doc_idx


def test_megatron_export_reads_back_with_independent_reader(tmp_path, mixed_records):
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=256, fim_rate=0.2)
    encoded, _, _ = encode_records(mixed_records, cfg, seed=0)
    m = build_dataset(mixed_records, str(tmp_path / "meg"), cfg, shards=2, format="megatron")
    assert m["layout"] == "megatron.mmidx.v1" and m["dtype"] == "uint16"
    expect = {r["doc_id"]: r for r in encoded.to_pylist() if r["kind"] != "preference"}
    seen = 0
    for s in m["shards"]:
        prefix = tmp_path / "meg" / "data" / f"tokens-{s['shard']:05d}"
        dtype, seqs, doc_idx = read_megatron(prefix)
        assert dtype == np.uint16
        assert doc_idx.tolist() == list(range(len(seqs) + 1))  # one sequence per document
        docs = pq.read_table(tmp_path / "meg" / "data" / f"docs-{s['shard']:05d}.parquet").column("doc_id").to_pylist()
        _, masks, _ = read_megatron(tmp_path / "meg" / "data" / f"loss_mask-{s['shard']:05d}")  # SFT/FIM masks kept
        for doc_id, ids, mask in zip(docs, seqs, masks, strict=True):
            assert ids.tolist() == expect[doc_id]["input_ids"]
            assert mask.tolist() == expect[doc_id]["loss_mask"]
        seen += len(seqs)
    assert seen == len(expect) == m["totals"]["documents"]
    assert m["loss_mask_prefixes"] == ["data/loss_mask-00000", "data/loss_mask-00001"]
    # a shard whose every token carries loss writes no mask: null in the list aligned with data_prefixes
    # (found in review: nothing told a reader which shards had a mask)
    import pyarrow.compute as pc

    code = mixed_records.filter(pc.equal(mixed_records.column("kind"), "code"))
    plain = build_dataset(code, str(tmp_path / "meg_code"), TokenizeConfig(tokenizer=TOKENIZER, seq_len=256),
                          shards=2, format="megatron")
    assert plain["loss_mask_prefixes"] == [None, None] and len(plain["data_prefixes"]) == 2
    assert not list((tmp_path / "meg_code" / "data").glob("loss_mask-*"))
    # the packed layout and megatron see the same documents in the same shuffle order
    p = build_dataset(mixed_records, str(tmp_path / "pk"), cfg, shards=2, format="packed")
    for s_meg, s_pk in zip(m["shards"], p["shards"]):
        a = pq.read_table(tmp_path / "meg" / "data" / f"docs-{s_meg['shard']:05d}.parquet").column("doc_id")
        b = pq.read_table(tmp_path / "pk" / s_pk["arrays"]["docs"]).column("doc_id")
        assert a.equals(b)


# -- through the real pipeline and engine -----------------------------------------------------------

def test_pipeline_local_engine_is_byte_identical_across_workers(tmp_path, mixed_records):
    from tests.conformance import assert_conformant
    from datakit import Pipeline

    pq.write_table(mixed_records.slice(0, 90), tmp_path / "a.parquet")
    pq.write_table(mixed_records.slice(90), tmp_path / "b.parquet")
    p = (Pipeline(name="tok", seed=3)
         .input(str(tmp_path / "*.parquet"), format="parquet", schema="training_record.v1")
         .add({"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 256, "packing": "best_fit", "fim_rate": 0.5})
         .output(str(tmp_path / "out"), format="packed", shards=2))
    sums = assert_conformant(p, tmp_path)
    assert any(f.startswith("data/tokens-") for f in sums)
    out = next(tmp_path.glob("conf-0-*"))
    manifest = json.loads((out / "manifest.json").read_text())
    run = json.loads((out / "_run.json").read_text())
    tok_stage = next(s for s in run["stages"] if s["name"] == "tokenize")
    assert tok_stage["rows_in"] == mixed_records.num_rows == tok_stage["rows_out"] + sum(tok_stage["dropped"].values())
    assert manifest["totals"]["documents"] + manifest["totals"]["preference_pairs"] == tok_stage["rows_out"]
    assert len(PackedDataset(out)) == manifest["totals"]["sequences"]


def test_manifest_matches_its_contract(tmp_path, mixed_records):
    import jsonschema

    from datakit.contracts import load_contract

    m = build_dataset(mixed_records, str(tmp_path / "out"), TokenizeConfig(tokenizer=TOKENIZER, seq_len=128), shards=2)
    jsonschema.validate(m, load_contract("packed_dataset.v1"))
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk == json.loads(json.dumps(m))
    assert sum(s["rows"] for s in m["shards"]) == m["rows"] == mixed_records.num_rows


def test_repository_packed_manifest_matches_its_contract(tmp_path):
    """`packing: repository` (pipelines/longctx.yaml) writes a manifest the contract accepts, with its
    repository keys; the contract's packing names are the stage's. (The enum once lacked `repository`:
    found in a docs review.)"""
    import copy

    import jsonschema

    from datakit import Pipeline
    from datakit.contracts import load_contract
    from datakit.synth import generate

    contract = load_contract("packed_dataset.v1")
    assert contract["properties"]["packing"]["enum"] == list(packing.PACKING_ALGORITHMS)
    logs = tmp_path / "logs"
    generate(logs, events=10, seed=4, days=1, repositories=2)
    out = tmp_path / "out"
    (Pipeline("longctx", seed=0).input(str(logs / "dt=*" / "*.jsonl.zst")).add({"kind": "ingest"})
     .add({"kind": "extract", "kinds": ["code", "fim", "preference"]})
     .add({"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 2048, "packing": "repository"})
     .output(str(out), format="packed", shards=2)).run(workers=1)
    m = json.loads((out / "manifest.json").read_text())
    assert m["packing"] == "repository" and m["totals"]["repositories"] > 0
    jsonschema.validate(m, contract)
    # the repository keys are required with packing: repository, and only then
    broken = copy.deepcopy(m)
    del broken["shards"][0]["arrays"]["repo_files"]
    with pytest.raises(jsonschema.ValidationError, match="repo_files"):
        jsonschema.validate(broken, contract)
    broken = copy.deepcopy(m)
    del broken["totals"]["split_repositories"]
    with pytest.raises(jsonschema.ValidationError, match="split_repositories"):
        jsonschema.validate(broken, contract)


def test_tokenize_stage_from_yaml_with_relative_tokenizer(tmp_path, mixed_records):
    import shutil

    from datakit import Pipeline

    (tmp_path / "tok").mkdir()
    shutil.copy(TOKENIZER, tmp_path / "tok" / "tokenizer.json")
    pq.write_table(mixed_records.slice(0, 40), tmp_path / "in.parquet")
    (tmp_path / "p.yaml").write_text(
        "name: t\nseed: 2\ninput: {path: in.parquet, format: parquet, schema: training_record.v1}\n"
        "stages:\n  - {kind: tokenize, tokenizer: tok, seq_len: 64, packing: concat, fim_rate: 0.5}\n"
        "output: {path: out, format: megatron, shards: 1, allow_unmasked: true}\n")
    p = Pipeline.from_yaml(str(tmp_path / "p.yaml"))
    res = p.run(engine="local", workers=1)
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["layout"] == "megatron.mmidx.v1" and m["seq_len"] == 64
    assert m["tokenizer"]["sha256"] == load_tokenizer(TOKENIZER).sha256
    _, seqs, _ = read_megatron(tmp_path / "out" / "data" / "tokens-00000")
    assert len(seqs) == m["totals"]["documents"] == res.stages[0]["rows_out"] - m["totals"]["preference_pairs"]
    from datakit.cli.inspect import inspect_dataset

    shown = inspect_dataset(tmp_path / "out", sequences=2, max_chars=10_000)
    tok = load_tokenizer(TOKENIZER)
    # (the EOS that ends the document is shown as a special token: « »)
    assert "data/tokens-00000 document 1:" in shown and tok.decode(seqs[1][:-1].tolist()) + "«<|endoftext|>»" in shown
    # a damaged header is one error naming the file (found in review: an IndexError/StopIteration line)
    from datakit.loader import DatasetError

    idx = tmp_path / "out" / "data" / "tokens-00000.idx"
    good = idx.read_bytes()
    # (same sizes: a changed size is caught before, by the manifest check)
    count = int.from_bytes(good[18:26], "little")
    for bad in (b"NOTANIDX" + good[8:], good[:17] + b"\x63" + good[18:], good[:18] + b"\xff" * 8 + good[26:]):
        idx.write_bytes(bad)
        with pytest.raises(DatasetError, match=r"tokens-00000\.idx is damaged"):
            inspect_dataset(tmp_path / "out", sequences=2)
    first_pointer = 34 + 4 * count
    idx.write_bytes(good[:first_pointer] + (1 << 40).to_bytes(8, "little") + good[first_pointer + 8:])
    with pytest.raises(DatasetError, match=r"tokens-00000\.bin is shorter than"):
        inspect_dataset(tmp_path / "out", sequences=2)


def test_large_vocab_uses_int32_and_loader_reads_it(tmp_path, mixed_records):
    from datakit.io.sinks import commit, write_shard
    from datakit.plan import SinkSpec
    from datakit.stages.tokenize.encode import ENCODED_SCHEMA

    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=64)
    encoded, _, options = encode_records(mixed_records, cfg)
    big = [70_000 + i for i in range(10)]  # ids beyond uint16, as a 128k-vocab model has
    rows = encoded.slice(0, 3).to_pylist()
    rows[0]["input_ids"] = rows[0]["input_ids"] + big
    rows[0]["loss_mask"] = rows[0]["loss_mask"] + [1] * len(big)
    spec = SinkSpec(path=str(tmp_path / "o"), format="packed", options={**options, "vocab_size": 128_256})
    info = write_shard(pa.Table.from_pylist(rows, schema=ENCODED_SCHEMA), 0, spec, ENCODED_SCHEMA)
    m = commit(spec, [info], {})
    assert m["dtype"] == "int32"
    ds = PackedDataset(tmp_path / "o")
    seen = np.concatenate([ds[i]["input_ids"] for i in range(len(ds))])
    assert set(big) <= set(seen.tolist())
    spec_small = SinkSpec(path=str(tmp_path / "bad"), format="packed", options={**options, "vocab_size": 4101})
    with pytest.raises(ValueError, match="outside the vocabulary"):
        write_shard(pa.Table.from_pylist(rows, schema=ENCODED_SCHEMA), 0, spec_small, ENCODED_SCHEMA)


def test_rerun_reuses_finished_shards(tmp_path, mixed_records):
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=128)
    a = build_dataset(mixed_records, str(tmp_path / "o"), cfg, shards=2)
    before = output_checksums(str(tmp_path / "o"))
    tokens = tmp_path / "o" / a["shards"][0]["arrays"]["tokens"]
    mtime = tokens.stat().st_mtime_ns
    b = build_dataset(mixed_records, str(tmp_path / "o"), cfg, shards=2)
    assert tokens.stat().st_mtime_ns == mtime  # reused, not rewritten
    assert output_checksums(str(tmp_path / "o")) == before and a["totals"] == b["totals"]


@pytest.mark.spark
def test_spark_engine_writes_the_same_bytes(tmp_path, spark):
    """Editor logs -> records -> tokens on both engines and several Spark partitionings: identical bytes."""
    from tests.conformance import LOCAL_VARIANTS, assert_conformant, spark_variants
    from datakit import Pipeline, synth

    synth.generate(str(tmp_path / "logs"), events=150, seed=0)
    for fmt in ("packed", "megatron", "mds"):
        p = (Pipeline(name="tok", seed=1)
             .input(str(tmp_path / "logs" / "**" / "*.jsonl.zst"), format="jsonl", schema="editor_event.v1")
             .add({"kind": "ingest"}).add({"kind": "extract", "kinds": ["code", "fim", "sft"]})
             .add({"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 256, "packing": "best_fit", "fim_rate": 0.5})
             .output(str(tmp_path / "out"), format=fmt, shards=2, allow_unmasked=fmt == "megatron"))
        # mds packs exactly as packed (same pack/materialize): one Spark partitioning is enough for it
        parts = (3,) if fmt == "mds" else (1, 3)
        sums = assert_conformant(p, tmp_path / fmt, variants=LOCAL_VARIANTS[:1] + spark_variants(parts))
        assert any(f.startswith("data/tokens-") or f.endswith(".mds") for f in sums)


@pytest.mark.parametrize("kinds,fails", [(["code", "sft"], True), (["code"], False), (None, True)])
def test_masked_data_to_megatron_is_a_compile_error_unless_opted_out(tmp_path, kinds, fails):
    from datakit import Pipeline
    from datakit.pipeline import PipelineError

    def pipe(**kw):
        p = Pipeline("m").input(str(tmp_path / "logs"))
        if kinds is None:  # records as input: kinds unknown, masks assumed
            p = Pipeline("m").input(str(tmp_path / "in.parquet"), format="parquet", schema="training_record.v1")
        else:
            p = p.add({"kind": "ingest"}).add({"kind": "extract", "kinds": kinds})
        return p.add({"kind": "tokenize", "tokenizer": TOKENIZER}).output(str(tmp_path / "o"), format="megatron", **kw)

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.jsonl").write_text("{}\n")
    pq.write_table(pa.table({"doc_id": ["x"]}), tmp_path / "in.parquet")
    if fails:
        with pytest.raises(PipelineError, match="cannot carry loss masks.*allow_unmasked"):
            pipe().compile()
    else:
        pipe().compile()
    pipe(allow_unmasked=True).compile()  # the opt-out
    Pipeline("m").input(str(tmp_path / "in.parquet"), format="parquet", schema="training_record.v1").add(
        {"kind": "tokenize", "tokenizer": TOKENIZER}).output(str(tmp_path / "o"), format="packed").compile()


def test_packed_output_without_tokenize_stage_fails_at_compile(tmp_path):
    """The pipeline says so before running any stage (not when the sink writes, after all the work)."""
    from datakit import Pipeline
    from datakit.pipeline import PipelineError

    (tmp_path / "a.jsonl").write_text("{}\n")
    p = (Pipeline("no-tokenize").input(str(tmp_path / "*.jsonl")).add({"kind": "ingest"})
         .output(str(tmp_path / "out"), format="packed"))
    with pytest.raises(PipelineError, match="needs a tokenize stage"):
        p.compile()


def test_tokenized_parquet_names_and_ships_its_tokenizer_and_a_rerun_leaves_no_other(tmp_path):
    """Found in review: `format: parquet` after tokenize wrote no tokenizer.json and no manifest record, while its
    ids held the chat markers the stage adds (ids at and above the base vocabulary, which the configured
    tokenizer decodes as nothing); and a rerun into a folder that held another run's tokenizer.json kept it
    beside the new rows. Now the manifest names the tokenizer and seq_len, the effective tokenizer.json decodes
    every id, and a commit whose manifest names no tokenizer file removes the old one."""
    from tokenizers import Tokenizer

    from datakit.io.sinks import SinkSpec, commit, write_shard

    rows = [sft_record("s0", [("user", "fix the bug in parse()"), ("assistant", "def parse(s):\n    return s")])]
    rows += code_records(3, max_chars=400)
    out = tmp_path / "tp"
    m = build_dataset(table(rows), str(out), TokenizeConfig(tokenizer=TOKENIZER, seq_len=256), format="parquet")
    assert m["seq_len"] == 256 and m["tokenizer"]["file"] == "tokenizer.json"
    assert m["tokenizer"]["sha256"] == load_tokenizer(TOKENIZER).sha256
    base = Tokenizer.from_file(TOKENIZER).get_vocab_size(with_added_tokens=True)
    shipped = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = [i for r in pq.read_table(out / "data" / "part-00000.parquet").column("input_ids").to_pylist() for i in r]
    assert max(ids) >= base  # the chat markers: outside the configured file, inside the shipped one
    assert all(shipped.id_to_token(i) is not None for i in ids)
    assert "<|user|>" in shipped.decode(ids, skip_special_tokens=False)

    plain = SinkSpec(path=str(out), format="parquet", shards=1, options={})
    commit(plain, [write_shard(table(code_records(2, max_chars=200)), 0, plain)], {})
    assert not (out / "tokenizer.json").exists() and "tokenizer" not in json.loads((out / "manifest.json").read_text())
