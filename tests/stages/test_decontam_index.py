"""The training-set n-gram index: round-trip against a full scan, no false negatives, stated FP rate."""
from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit.contracts import TRAINING_RECORD_V1
from datakit.io.fs import InputError
from datakit.stages.decontaminate.check import check
from datakit.indexing import build_index
from datakit.stages.decontaminate.index import INDEX_DIRNAME, NgramIndex, is_index
from datakit.stages.decontaminate.ngrams import hash_strings
from datakit.stages.decontaminate.normalize import flags_of
from tests.support.plant import idiomatic_code, plant
from tests.stages.test_decontam import he_rows, humaneval, record  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, he_rows):  # noqa: F811
    """Two Parquet shards + one JSONL file: clean idiomatic code, 12 leaks of different kinds."""
    rng = random.Random(5)
    root = tmp_path_factory.mktemp("ds")
    rows = [record(f"c{i:04d}", idiomatic_code(rng, 6)) for i in range(400)]
    kinds = ["exact", "reformatted", "prompt_only", "solution_only"]
    for j, i in enumerate(range(3, 150, 13)):
        rows.append(record(f"leak{i:03d}", idiomatic_code(rng, 2) + plant(he_rows[i], kinds[j % 4], rng)))
    rows.sort(key=lambda r: r["doc_id"])
    t = pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1)
    pq.write_table(t.slice(0, 200), str(root / "part-00000.parquet"))
    pq.write_table(t.slice(200, 150), str(root / "part-00001.parquet"))
    with open(root / "part-00002.jsonl", "w") as f:
        for r in t.slice(350).to_pylist():
            f.write(json.dumps(r) + "\n")
        f.write("{not json\n")
    return root


@pytest.mark.parametrize("min_fraction", [0.0, None])
def test_index_check_equals_full_scan(dataset, tmp_path, humaneval, min_fraction):  # noqa: F811
    idx = tmp_path / "idx"
    info = build_index(str(dataset), str(idx), 13, ["whitespace", "case"])
    assert is_index(str(idx)) and info.documents == 412 and info.meta["fp_rate_per_ngram"] < 1e-8
    # an index holds one view (its normalizations): compare with a single-view scan
    scan = check(str(dataset), [humaneval], use_index=False, min_fraction=min_fraction, robust=False)
    via = check(str(idx), [humaneval], min_fraction=min_fraction, robust=False)
    s_items = {(i.eval_id) for i in scan.evals[0].contaminated}
    v_items = {(i.eval_id) for i in via.evals[0].contaminated}
    assert s_items, "the planted leaks must be found"
    if min_fraction == 0.0:
        # any-n-gram rule: per document and union agree exactly (FP rate ~1e-9 per n-gram: none expected)
        assert v_items == s_items
        u = {i.eval_id: i.ngrams_matched for i in via.evals[0].contaminated}
        assert all(u[k] >= i.ngrams_matched for i in scan.evals[0].contaminated for k in [i.eval_id])
    else:
        # a fraction rule on the union of the data is an upper bound of the per-document answer
        assert s_items <= v_items
    assert all(m.doc_id is None for m in via.evals[0].matches)
    assert via.data[0]["mode"] == "index" and via.data[0]["documents"] == 412
    assert scan.data[0]["skipped_lines"] == 1


@pytest.mark.parametrize("bits", [32, 16])
def test_index_has_no_false_negatives_and_its_stated_fp_rate(tmp_path, bits):
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(5000)]
    texts = [" ".join(words[j] for j in rng.integers(0, 5000, 300)) for _ in range(300)]
    pq.write_table(pa.table({"doc_id": [str(i) for i in range(300)], "text": texts}), str(tmp_path / "t.parquet"))
    info = build_index(str(tmp_path / "t.parquet"), str(tmp_path / "idx"), 5, ["whitespace"], fingerprint_bits=bits)
    idx = NgramIndex(str(tmp_path / "idx"))
    arr = pa.array(texts, pa.large_string())
    from datakit.stages.decontaminate.ngrams import arrow_text_buffers

    data, offs = arrow_text_buffers(arr)
    present = hash_strings(data, offs, 5, flags_of(["whitespace"]))[0]
    assert idx.contains(present).all()
    distinct = len(np.unique(present))
    # entries equal to distinct n-grams, less the few that share bucket + fingerprint (stored once)
    assert distinct * (1 - 1e-3) <= info.ngrams <= distinct and (bits == 16 or info.ngrams == distinct)
    absent = rng.integers(0, 2**63, 200_000, dtype=np.uint64) | np.uint64(1)
    fp = idx.contains(absent).mean()
    # stated per-n-gram rate is N / 2^(bucket_bits + bits); the measured rate agrees with it
    assert fp <= max(2 * info.fp_rate_per_ngram, 2e-5)
    if bits == 16:
        assert 0.3 * info.fp_rate_per_ngram <= fp and (tmp_path / "idx" / "fingerprints.bin").stat().st_size == 2 * info.ngrams


def test_index_is_deterministic_and_settings_are_enforced(dataset, tmp_path, humaneval):  # noqa: F811
    a, b = tmp_path / "a", tmp_path / "b"
    build_index(str(dataset), str(a), 13, ["whitespace", "case"])
    build_index(str(dataset), str(b), 13, ["whitespace", "case"])
    for f in ("index.json", "offsets.bin", "fingerprints.bin"):
        assert (a / f).read_bytes() == (b / f).read_bytes()
    with pytest.raises(InputError, match="index built with ngram=13"):
        check(str(a), [humaneval], ngram=8)
    with pytest.raises(InputError, match="normalizations"):
        check(str(a), [humaneval], normalizations=["whitespace"])
    (a / "fingerprints.bin").write_bytes(b"\0\0")
    with pytest.raises(InputError, match="incomplete or corrupt"):
        check(str(a), [humaneval])


def test_index_beside_a_dataset_is_used_automatically(dataset, tmp_path, humaneval):  # noqa: F811
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    build_index(str(ds), str(ds / INDEX_DIRNAME), 13, ["whitespace", "case"])
    res = check(str(ds), [humaneval])
    assert res.data[0]["mode"] == "index"
    res2 = check(str(ds), [humaneval], use_index=False)
    assert res2.data[0]["mode"] == "scan" and res2.data[0]["documents"] == 412  # the index folder is not data
    res3 = check(str(ds), [humaneval], ngram=10)  # other settings: scan instead
    assert res3.data[0]["mode"] == "scan"


@pytest.mark.parametrize("how", ["added", "changed", "removed"])
def test_an_index_beside_data_that_changed_is_not_used(dataset, tmp_path, humaneval, he_rows, how, caplog):  # noqa: F811
    """Found in review: a shard holding a HumanEval item, added after `build-index`, was never read: the
    index beside the data answered for it and the gate said clean (exit 0). The index records the files
    it was built from (sources.json); a folder that differs is scanned, with a warning naming why."""
    import logging
    import os
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    leak = pa.Table.from_pylist([record("late", he_rows[11]["prompt"] + he_rows[11]["canonical_solution"])],
                                schema=TRAINING_RECORD_V1)
    if how == "removed":
        pq.write_table(leak, str(ds / "part-00003.parquet"))
    build_index(str(ds), str(ds / INDEX_DIRNAME), 13, ["whitespace", "case"])
    before = {i.eval_id for i in check(str(ds), [humaneval]).evals[0].contaminated}
    if how == "added":
        pq.write_table(leak, str(ds / "part-00003.parquet"))
    elif how == "changed":
        old = pq.read_table(str(ds / "part-00001.parquet"))
        pq.write_table(pa.concat_tables([old, leak]), str(ds / "part-00001.parquet"))
    else:
        os.remove(ds / "part-00003.parquet")
    with caplog.at_level(logging.WARNING, logger="datakit.decontam.check"):
        res = check(str(ds), [humaneval])
    assert res.data[0]["mode"] == "scan"
    assert f"the data changed since it was built: 1 {how}" in caplog.text
    found = {i.eval_id for i in res.evals[0].contaminated}
    assert ("HumanEval/11" in found) == (how != "removed") and ("HumanEval/11" in before) == (how == "removed")
    build_index(str(ds), str(ds / INDEX_DIRNAME), 13, ["whitespace", "case"])  # rebuilt: used again
    again = check(str(ds), [humaneval])
    assert again.data[0]["mode"] == "index" and {i.eval_id for i in again.evals[0].contaminated} == found


def test_an_index_is_stale_after_an_edit_that_keeps_size_and_modification_time(dataset, tmp_path, humaneval,  # noqa: F811
                                                                                he_rows, caplog):
    """Found in review: a file replaced by one of the same size with its modification time restored
    (`cp -p`, `touch -r`) kept the index's stamps, and the check answered clean from the index (exit 0)
    while a scan found the leak. The index records each file's change token too (a local file's
    status-change time, an object's ETag), which no copy can set back."""
    import os
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    target = ds / "part-00001.parquet"
    clean_text = "x" * len(he_rows[11]["prompt"] + he_rows[11]["canonical_solution"])
    leak_text = he_rows[11]["prompt"] + he_rows[11]["canonical_solution"]
    pq.write_table(pa.Table.from_pylist([record("d", clean_text)], schema=TRAINING_RECORD_V1), str(target),
                   compression="none")
    build_index(str(ds), str(ds / INDEX_DIRNAME), 13, ["whitespace", "case"])
    assert check(str(ds), [humaneval]).data[0]["mode"] == "index"
    st = os.stat(target)
    edited = tmp_path / "edited.parquet"
    pq.write_table(pa.Table.from_pylist([record("d", leak_text)], schema=TRAINING_RECORD_V1), str(edited),
                   compression="none")
    assert edited.stat().st_size == st.st_size  # the same size: only the change token tells them apart
    shutil.copyfile(edited, target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    import logging

    with caplog.at_level(logging.WARNING, logger="datakit.decontam.check"):
        res = check(str(ds), [humaneval])
    assert res.data[0]["mode"] == "scan" and "HumanEval/11" in {i.eval_id for i in res.evals[0].contaminated}
    assert "1 rewritten or copied with their times kept (first: part-00001.parquet)" in caplog.text


def test_packed_token_dataset_is_decoded_and_checked(tmp_path, he_rows, humaneval):  # noqa: F811
    """A packed dataset (datakit.loader) is read back through its own tokenizer and scanned."""
    from datakit.stages.tokenize.direct import build_dataset
    from datakit.stages.tokenize.stage import TokenizeConfig
    from tests.stages.test_tokenize import TOKENIZER

    rng = random.Random(9)
    rows = [record(f"c{i:03d}", idiomatic_code(rng, 4)) for i in range(30)]
    rows.append(record("leak", he_rows[21]["prompt"] + he_rows[21]["canonical_solution"]))
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=256, packing="concat")
    build_dataset(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1), str(tmp_path / "pk"), cfg, shards=2)
    res = check(str(tmp_path / "pk"), [humaneval])
    assert res.data[0]["mode"] == "packed"
    assert [i.eval_id for i in res.evals[0].contaminated] == ["HumanEval/21"]
    assert {m.doc_id for m in res.evals[0].matches} == {"leak"}


def test_an_index_of_a_packed_dataset_named_in_a_list_answers_its_check(tmp_path, he_rows, humaneval):  # noqa: F811
    """Found in review: `build_index(["pk"], "pk/_ngram_index")` (the Python API's list form) stamped every
    shard file, while a check of `pk` compares the packed dataset's manifest, so the index was refused as
    changed and the data decoded and scanned again. Each path is stamped as the check reads it now."""
    from datakit.stages.decontaminate.index import stale_reason
    from datakit.stages.tokenize.direct import build_dataset
    from datakit.stages.tokenize.stage import TokenizeConfig
    from tests.stages.test_tokenize import TOKENIZER

    rng = random.Random(3)
    rows = [record(f"c{i:03d}", idiomatic_code(rng, 4)) for i in range(12)]
    rows.append(record("leak", he_rows[21]["prompt"] + he_rows[21]["canonical_solution"]))
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=256, packing="concat")
    pk = str(tmp_path / "pk")
    build_dataset(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1), pk, cfg, shards=2)
    build_index([pk], f"{pk}/{INDEX_DIRNAME}", 13, ["whitespace", "case"], workers=1)
    assert stale_reason(f"{pk}/{INDEX_DIRNAME}", pk) is None
    res = check(pk, [humaneval])
    assert res.data[0]["mode"] == "index"
    assert [i.eval_id for i in res.evals[0].contaminated] == ["HumanEval/21"]


def test_fsspec_urls_for_data_and_index(dataset, humaneval):  # noqa: F811
    """Data and index on any fsspec storage (memory:// here; s3:// and gs:// go the same way)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    for f in sorted(dataset.glob("*.parquet")):
        fs.pipe(f"/dk-decontam/data/{f.name}", f.read_bytes())
    scan = check("memory://dk-decontam/data/*.parquet", [humaneval], min_fraction=0.0)
    local = check(str(dataset / "*.parquet"), [humaneval], min_fraction=0.0)
    assert [i.eval_id for i in scan.evals[0].contaminated] == [i.eval_id for i in local.evals[0].contaminated]
    build_index("memory://dk-decontam/data/*.parquet", "memory://dk-decontam/idx", 13, ["whitespace", "case"])
    assert is_index("memory://dk-decontam/idx")
    via = check("memory://dk-decontam/idx", [humaneval], min_fraction=0.0)
    assert [i.eval_id for i in via.evals[0].contaminated] == [i.eval_id for i in scan.evals[0].contaminated]
    fs.rm("/dk-decontam", recursive=True)


def test_a_packed_dataset_without_its_tokenizer_file(tmp_path, he_rows, humaneval, caplog):  # noqa: F811
    """Found in review: a packed dataset copied without its tokenizer.json said only "cannot load tokenizer
    'datakit:demo-bpe': Exception". The tokenizer the manifest names is loaded instead when it is the same
    one (its sha256), with a warning; else one line says the file is missing."""
    import json
    import logging

    from datakit.io.fs import InputError
    from datakit.stages.tokenize.direct import build_dataset
    from datakit.stages.tokenize.stage import TokenizeConfig

    rows = [record("leak", he_rows[21]["prompt"] + he_rows[21]["canonical_solution"]), record("x", "x = 1\n")]
    cfg = TokenizeConfig(tokenizer="datakit:demo-bpe", seq_len=256, packing="concat")
    build_dataset(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1), str(tmp_path / "pk"), cfg, shards=1)
    (tmp_path / "pk" / "tokenizer.json").unlink()
    with caplog.at_level(logging.WARNING, logger="datakit"):
        res = check(str(tmp_path / "pk"), [humaneval])
    assert [i.eval_id for i in res.evals[0].contaminated] == ["HumanEval/21"]
    assert "tokenizer.json is missing; decoding with 'datakit:demo-bpe', the same tokenizer" in caplog.text
    mf = tmp_path / "pk" / "manifest.json"
    m = json.loads(mf.read_text())
    m["tokenizer"]["sha256"] = "0" * 64
    mf.write_text(json.dumps(m))
    with pytest.raises(InputError, match="tokenizer.json is missing, and 'datakit:demo-bpe' as loaded here is another "
                                         "tokenizer"):
        check(str(tmp_path / "pk"), [humaneval])
    del m["tokenizer"]["sha256"]  # nothing recorded to compare with: not decoded by whatever the name loads
    mf.write_text(json.dumps(m))
    with pytest.raises(InputError, match="tokenizer.json is missing, and the manifest records no sha256"):
        check(str(tmp_path / "pk"), [humaneval])
    m["tokenizer"]["name"] = str(tmp_path / "gone" / "tokenizer.json")
    mf.write_text(json.dumps(m))
    with pytest.raises(InputError, match=r"tokenizer.json is missing, and '.*gone/tokenizer.json' could not be loaded"):
        check(str(tmp_path / "pk"), [humaneval])


def _pref(doc_id: str, prompt: str, chosen: str, rejected: str) -> dict:
    return {"doc_id": doc_id, "kind": "preference", "segments": [{"text": prompt, "train": False, "role": "prompt"}],
            "chosen": chosen, "rejected": rejected, "source": None, "meta": "{}"}


def test_the_preference_pairs_of_a_packed_dataset_are_checked_by_a_scan_and_an_index(tmp_path, he_rows,
                                                                                    humaneval, monkeypatch):  # noqa: F811
    """Found in review: a packed dataset keeps its preference pairs in `preference-*.parquet` beside the
    token arrays; the check decoded the arrays only and said clean (exit 0) over verbatim HumanEval items
    in `chosen`. The pairs are read as records now, by a scan and into an index; an index built before
    they were read is stale for such a dataset. The index is built from a relative path (also found in
    review: its manifest was stamped relative, so the check never used it)."""
    from datakit.stages.decontaminate.index import stale_reason
    from datakit.stages.tokenize.direct import build_dataset
    from datakit.stages.tokenize.stage import TokenizeConfig
    from tests.stages.test_tokenize import TOKENIZER

    rng = random.Random(4)
    rows = [record(f"c{i:03d}", idiomatic_code(rng, 4)) for i in range(12)]
    leak = he_rows[31]["prompt"] + he_rows[31]["canonical_solution"]
    rows += [_pref("pair-ok", "write a sorter", "def s(x):\n    return sorted(x)\n", "no"),
             _pref("pair-leak", "implement it", leak, "pass")]
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=256, packing="best_fit")
    build_dataset(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1), str(tmp_path / "pk"), cfg, shards=2)
    res = check(str(tmp_path / "pk"), [humaneval])
    assert [i.eval_id for i in res.evals[0].contaminated] == ["HumanEval/31"]
    assert {m.doc_id for m in res.evals[0].matches} == {"pair-leak"}
    assert sum(d["documents"] for d in res.data) == 14  # 12 packed documents + 2 pairs
    monkeypatch.chdir(tmp_path)
    build_index("pk", f"pk/{INDEX_DIRNAME}", 13, ["whitespace", "case"], workers=1)
    assert stale_reason(str(tmp_path / "pk" / INDEX_DIRNAME), str(tmp_path / "pk")) is None
    via = check("pk", [humaneval])
    assert via.data[0]["mode"] == "index" and via.data[0]["documents"] == 14
    assert [i.eval_id for i in via.evals[0].contaminated] == ["HumanEval/31"]


def test_a_preference_output_is_read_by_its_prompt_chosen_and_rejected(tmp_path, he_rows, humaneval):  # noqa: F811
    """The preference pipeline's Parquet output (prompt/chosen/rejected and their ids) was refused with
    "no text to scan" unless --text-field was given."""
    leak = he_rows[40]["prompt"] + he_rows[40]["canonical_solution"]
    pq.write_table(pa.table({"doc_id": ["a", "b"], "prompt": ["fix this", "and this"], "chosen": ["x = 1\n", leak],
                             "rejected": ["y = 2\n", "pass"], "prompt_ids": [[1], [2]]}), str(tmp_path / "p.parquet"))
    res = check(str(tmp_path / "p.parquet"), [humaneval])
    assert [i.eval_id for i in res.evals[0].contaminated] == ["HumanEval/40"] and res.data[0]["texts"] == 6
