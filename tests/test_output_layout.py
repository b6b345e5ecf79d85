"""The output folder opens as it is with the real clients users reach for (schemas/output_layout.md):
HF `datasets` through the dataset card, pyarrow.dataset / polars / duckdb through `data/`. Each must
give exactly the manifest's rows and ids, side outputs (`_dropped`, `_quarantine`, `_run.json`,
manifest) never mixed in."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from datakit import Pipeline, synth
from datakit.io.dataset import read_output

TOKENIZER = str(Path(__file__).parent / "data" / "tokenizer" / "tokenizer.json")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Two real runs over synthetic logs with bad lines and duplicates: records and preference pairs."""
    root = tmp_path_factory.mktemp("layout")
    synth.generate(str(root / "logs"), events=1500, seed=0)
    src = str(root / "logs" / "dt=*" / "*.jsonl.zst")
    rec = (Pipeline("records", seed=0).input(src).add({"kind": "ingest"})
           .add({"kind": "extract", "kinds": ["code", "fim", "sft"]}).add({"kind": "dedup", "exact": True})
           .output(str(root / "records"), shards=3))
    rec.run(engine="local", workers=1)
    pref = (Pipeline("pref", seed=0).input(src).add({"kind": "ingest"})
            .add({"kind": "extract", "kinds": ["preference"]})
            .add({"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 512})
            .output(str(root / "preference"), format="parquet", shards=2))
    pref.run(engine="local", workers=1)
    return root


def _clients(out: Path, cache: Path) -> dict[str, list[str]]:
    """doc_ids as each real client reads them (the way the README tells users to)."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    import datasets
    import duckdb
    import polars as pl
    import pyarrow.dataset as pads

    hf = datasets.load_dataset(str(out), split="train", cache_dir=str(cache))
    return {
        "datasets": hf["doc_id"],
        "pyarrow": pads.dataset(str(out / "data")).to_table(columns=["doc_id"]).column(0).to_pylist(),
        "polars": pl.scan_parquet(str(out / "data")).select("doc_id").collect()["doc_id"].to_list(),
        "duckdb": [r[0] for r in duckdb.sql(f"SELECT doc_id FROM '{out}/data/*.parquet'").fetchall()],
    }


@pytest.mark.parametrize("name", ["records", "preference"])
def test_every_client_reads_exactly_the_manifest_rows(outputs, tmp_path, name):
    out = outputs / name
    manifest = json.loads((out / "manifest.json").read_text())
    ids = read_output(str(out), columns=["doc_id"]).column(0).to_pylist()
    assert len(ids) == manifest["rows"] > 0 and len(set(ids)) == len(ids)
    side = [p for p in ("_dropped", "_quarantine") if (out / p).is_dir()]
    assert "_quarantine" in side and (name != "records" or "_dropped" in side)  # side rows exist to be skipped
    for client, got in _clients(out, tmp_path / "hf").items():
        assert sorted(got) == sorted(ids), client
    # the data prefix holds exactly the manifest's files
    listed = sorted(f for s in manifest["shards"] for f in s["files"])
    assert sorted(str(p.relative_to(out)) for p in (out / "data").rglob("*") if p.is_file()) == listed


def test_rerun_with_fewer_shards_leaves_no_stale_data_file(tmp_path):
    from datakit.io.layout import card_text

    synth.generate(str(tmp_path / "logs"), events=200, seed=1)
    p = (Pipeline("x", seed=0).input(str(tmp_path / "logs" / "dt=*" / "*.jsonl.zst")).add({"kind": "ingest"})
         .add({"kind": "extract", "kinds": ["code"]}))
    p.output(str(tmp_path / "o"), shards=3).run(engine="local", workers=1)
    assert len(list((tmp_path / "o" / "data").iterdir())) == 3
    p.output(str(tmp_path / "o"), shards=2).run(engine="local", workers=1)
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert sorted(x.name for x in (tmp_path / "o" / "data").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    # and no reuse record of the shard that is gone (found in review: _shards/shard-00002.json stayed)
    assert sorted(x.name for x in (tmp_path / "o" / "_shards").iterdir()) == ["shard-00000.json", "shard-00001.json"]
    card = (tmp_path / "o" / "README.md").read_text()
    assert card == card_text(m) and "data/part-00002.parquet" not in card and "data/part-00001.parquet" in card


def test_a_manifest_never_stands_beside_data_files_it_does_not_list(tmp_path, monkeypatch):
    """Found in review (S3): the store failed right after the manifest of a 1-shard rerun was written, before the
    3-shard run's other files were removed: a committed manifest of 2,277 rows beside 3,832 rows in data/."""
    import datakit.io.sinks as sinks

    synth.generate(str(tmp_path / "logs"), events=200, seed=1)
    p = (Pipeline("x", seed=0).input(str(tmp_path / "logs" / "dt=*" / "*.jsonl.zst")).add({"kind": "ingest"})
         .add({"kind": "extract", "kinds": ["code"]}))
    p.output(str(tmp_path / "o"), shards=3).run(engine="local", workers=1)
    real = sinks.write_json_atomic

    def store_gone_after_the_manifest(url, body, *a, **k):
        real(url, body, *a, **k)
        if url.endswith("/manifest.json"):
            raise OSError("the endpoint went away")

    monkeypatch.setattr(sinks, "write_json_atomic", store_gone_after_the_manifest)
    with pytest.raises(Exception):
        p.output(str(tmp_path / "o"), shards=1).run(engine="local", workers=1)
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert sorted(f"data/{x.name}" for x in (tmp_path / "o" / "data").iterdir()) == \
        [f for s in m["shards"] for f in s["files"]] == ["data/part-00000.parquet"]


def test_datasets_reads_a_rerun_and_a_same_named_folder_not_its_cache_of_another(tmp_path):
    """`datasets` caches a folder's rows under the folder's base name and a hash of the card, nothing of
    the files: a rerun into the same folder (and another dataset in a folder of the same name) read the
    first run's rows from that cache (found: 86 rows written, 15,727 old ones returned). The card's config
    names the content, so each content has its own cache entry; the same content shares one."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    import datasets

    synth.generate(str(tmp_path / "logs"), events=300, seed=2)
    src = str(tmp_path / "logs" / "dt=*" / "*.jsonl.zst")
    cache = str(tmp_path / "hf-cache")

    def run(kinds: list[str], out: Path) -> list[str]:
        (Pipeline("x", seed=0).input(src).add({"kind": "ingest"}).add({"kind": "extract", "kinds": kinds})
         .output(str(out), shards=1).run(engine="local", workers=1))
        return sorted(read_output(str(out), columns=["doc_id"]).column(0).to_pylist())

    def hf(out: Path) -> list[str]:
        return sorted(datasets.load_dataset(str(out), split="train", cache_dir=cache)["doc_id"])

    first = run(["code", "fim", "sft"], tmp_path / "a" / "out")
    assert hf(tmp_path / "a" / "out") == first
    second = run(["code"], tmp_path / "a" / "out")  # a rerun into the same folder, other rows
    assert second != first and hf(tmp_path / "a" / "out") == second
    other = run(["fim"], tmp_path / "b" / "out")  # another folder of the same base name
    assert other not in (first, second) and hf(tmp_path / "b" / "out") == other
    # the same content, elsewhere: the same card config, so one cache entry serves both
    again = run(["code"], tmp_path / "c" / "out")
    card = lambda p: (p / "README.md").read_text().split("---")[1]  # noqa: E731
    assert again == second and card(tmp_path / "c" / "out") == card(tmp_path / "a" / "out")
    assert card(tmp_path / "b" / "out") != card(tmp_path / "a" / "out")


# -- the README's "Use the output" section runs as it is ---------------------------------------------

@pytest.fixture(scope="module")
def readme_dir(outputs, tmp_path_factory):
    """A folder whose out/ holds what the README's snippets open: this module's records and preference
    runs, and packed / megatron output written by the tokenize writers (MDS: tests/test_mds.py)."""
    from datakit.stages.tokenize.direct import build_dataset
    from datakit.stages.tokenize.stage import TokenizeConfig
    from tests.stages.test_tokenize import code_records, sft_record, table

    root = tmp_path_factory.mktemp("readme")
    (root / "out").mkdir()
    for name in ("records", "preference"):
        (root / "out" / name).symlink_to(outputs / name)
    records = table(code_records(40, max_chars=1000) + [
        sft_record(f"s{i:03d}", [("user", f"q{i}?"), ("assistant", f"a{i}\n" * 3)]) for i in range(10)])
    cfg = TokenizeConfig(tokenizer=TOKENIZER, seq_len=128)
    build_dataset(records, str(root / "out" / "pretrain"), cfg, shards=2, format="packed")
    build_dataset(table(code_records(30, max_chars=600)), str(root / "out" / "megatron"), cfg, format="megatron")
    return root


def _dpo_names(root: Path) -> dict:
    """The `model` and `tokenizer` the TRL block is given: a tiny random causal LM loaded from a folder, as
    users load theirs (DPOTrainer builds its reference model from that path), and our tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from datakit.stages.tokenize.tokenizers import load_tokenizer

    lt = load_tokenizer(TOKENIZER)
    (root / "tok.json").write_text(lt.to_json())
    tok = PreTrainedTokenizerFast(tokenizer_file=str(root / "tok.json"), eos_token=lt.special_text["eos"],
                                  pad_token=lt.special_text["pad"])
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(root / "tiny-lm")
    return {"model": LlamaForCausalLM.from_pretrained(root / "tiny-lm"), "tokenizer": tok}


def test_use_the_output_has_one_block_per_client():
    from tests.readme import streaming_snippet, use_the_output_snippets

    blocks = use_the_output_snippets()
    for client in ("datasets", "trl", "datakit.loader", "megatron", "streaming"):
        assert any(client in b for b in blocks), client
    assert len(blocks) == 5 and streaming_snippet() in blocks  # the streaming one runs in tests/test_mds.py


@pytest.mark.parametrize("client", ["datasets", "trl", "datakit.loader", "megatron"])
def test_use_the_output_snippet_runs(readme_dir, client, monkeypatch):
    from tests.readme import use_the_output_snippets

    marker = {"datasets": "pads.dataset", "trl": "DPOTrainer", "datakit.loader": "torch_loader",
              "megatron": "IndexedDataset"}[client]
    (block,) = [b for b in use_the_output_snippets() if marker in b]
    monkeypatch.chdir(readme_dir)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", readme_dir / "hf-cache")
    names: dict = {"__name__": "readme_snippet"}
    if client == "trl":
        pytest.importorskip("trl")
        names.update(_dpo_names(readme_dir))
    exec(compile(block, f"README.md ({client} snippet)", "exec"), names)  # noqa: S102 - the README's own code
    # what each block made is the data, not an empty shell
    if client == "datasets":
        rows = json.loads((readme_dir / "out" / "records" / "manifest.json").read_text())["rows"]
        assert len(names["ds"]) == names["t"].num_rows == len(names["df"]) == rows > 0
    elif client == "trl":
        assert len(names["trainer"].train_dataset) > 0
    elif client == "datakit.loader":
        assert names["step"] == len(names["loader"]) - 1 > 0
    else:
        assert len(names["ds"]) == 30


def test_read_output_says_what_it_cannot_read(tmp_path):
    """Found in review: `read_output(path, columns=["nope"])` raised Arrow's error with the whole schema,
    and an MDS dataset was told to use datakit.loader, which refuses MDS too."""
    import json

    import pytest

    from datakit import Pipeline
    from datakit.io.dataset import read_output
    from datakit.io.fs import InputError
    from tests.eventgen import make_event, write_jsonl

    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(3)])
    Pipeline("r").input(str(tmp_path / "logs")).add({"kind": "ingest"}).output(str(tmp_path / "o")).run(workers=1)
    with pytest.raises(InputError, match=r"has no column 'nope' \(columns: event_id"):
        read_output(tmp_path / "o", ["event_id", "nope"])
    assert read_output(tmp_path / "o", ["event_id"]).num_rows == 3
    # one name as a string (found in review: read as the names 'e', 'v', 'e', ...)
    assert read_output(tmp_path / "o", "event_id").column_names == ["event_id"]
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    for fmt, reader in (("mds", "streaming.StreamingDataset"), ("packed", "datakit.loader.PackedDataset")):
        (tmp_path / "o" / "manifest.json").write_text(json.dumps({**m, "format": fmt}))
        with pytest.raises(InputError, match=f"is a '{fmt}' dataset of token ids, not records: read it with {reader}"):
            read_output(tmp_path / "o")


def test_read_output_columns_as_a_sequence_or_none_at_all(tmp_path):
    """Found in a Python API review: `columns=[]` gave 0 rows for a dataset of many (concat_tables of
    zero-column tables drops the row count), a tuple raised pyarrow's ValueError and `columns=123` a raw
    TypeError. Now `[]` keeps the row count, a tuple reads as a list, anything else is one InputError."""
    import pytest

    from datakit import DatakitError, Pipeline
    from datakit.io.dataset import read_output
    from datakit.io.fs import InputError
    from tests.eventgen import make_event, write_jsonl

    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(7)])
    (Pipeline("r").input(str(tmp_path / "logs")).add({"kind": "ingest"})
     .output(str(tmp_path / "o"), shards=3).run(workers=1))
    out = tmp_path / "o"
    none = read_output(out, columns=[])
    assert (none.num_rows, none.column_names) == (7, [])
    assert read_output(out, columns=()).num_rows == 7
    assert read_output(out, columns=("event_id",)).column_names == ["event_id"]
    assert read_output(out, columns=("event_id",)).num_rows == 7
    for bad, says in ((123, "not int"), ({"event_id"}, "not set"), (b"event_id", "not bytes"),
                      (["event_id", 5], "got 5 \\(int\\)")):
        with pytest.raises(InputError, match=f"read_output: columns must .*{says}") as e:
            read_output(out, columns=bad)
        assert isinstance(e.value, DatakitError)
    with pytest.raises(InputError, match=r"has no column 'nope' \(columns: event_id"):
        read_output(out, columns=("nope",))
