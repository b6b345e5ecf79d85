"""Preference output as TRL reads it: TRL's own DPO dataset preparation (tokenize prompt and
prompt + completion, split at their common prefix) gives exactly our ids, because prompts end on a
token boundary; empty prompts and whitespace-only completions are dropped with a reason."""
from __future__ import annotations

import json
import types

import pytest

from datakit import Pipeline, synth
from datakit.stages.tokenize.encode import PREFERENCE_COLUMNS, token_boundary
from datakit.stages.tokenize.tokenizers import load_tokenizer
from tests.stages.test_tokenize import TOKENIZER


@pytest.fixture(scope="module")
def pref_out(tmp_path_factory):
    root = tmp_path_factory.mktemp("pref")
    synth.generate(str(root / "logs"), events=2500, seed=0)
    res = (Pipeline("pref", seed=0).input(str(root / "logs" / "dt=*" / "*.jsonl.zst")).add({"kind": "ingest"})
           .add({"kind": "extract", "kinds": ["preference"]})
           .add({"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 1024})
           .output(str(root / "out"), format="parquet", shards=2)).run(engine="local", workers=1)
    return root / "out", res


def test_no_always_null_columns_and_hygiene(pref_out):
    from datakit.io.dataset import read_output

    out, res = pref_out
    t = read_output(str(out))
    assert tuple(t.column_names) == PREFERENCE_COLUMNS and t.num_rows > 20
    for name in t.column_names:
        assert t.column(name).null_count == 0, name
    rows = t.to_pylist()
    assert all(r["prompt"].strip() and r["chosen"].strip() and r["rejected"].strip() for r in rows)
    ex = res.stage("extract")
    assert ex["rows_in"] == ex["rows_out"] + sum(ex["dropped"].values())


def test_trl_dpo_preparation_gives_our_ids(pref_out, tmp_path):
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast
    from trl import DPOConfig
    from trl.trainer.dpo_trainer import DPOTrainer

    out, _ = pref_out
    m = json.loads((out / "manifest.json").read_text())
    ds = Dataset.from_parquet([str(out / f) for s in m["shards"] for f in s["files"]])
    lt = load_tokenizer(TOKENIZER)
    (tmp_path / "tokenizer.json").write_text(lt.to_json())
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), eos_token=lt.special_text["eos"])
    args = DPOConfig(output_dir=str(tmp_path / "trl"), max_length=None, report_to=[], use_cpu=True, bf16=False,
                     disable_tqdm=True)
    prepared = DPOTrainer._prepare_dataset(types.SimpleNamespace(_tokenizer=tok), ds, tok, args, "train")
    assert len(prepared) == len(ds)
    for ours, theirs in zip(ds, prepared):
        for col in ("prompt_ids", "chosen_ids", "rejected_ids"):
            assert theirs[col] == ours[col], (col, ours["doc_id"])


def test_prompt_ending_mid_word_moves_the_partial_word_to_both_completions():
    tok = load_tokenizer(TOKENIZER)
    prompt, chosen, rejected = "def compute_tot", "al(items):\n    return sum(items)\n", "al_price(x):\n    pass\n"
    p, c, r, pi, ci, ri = token_boundary(tok, prompt, chosen, rejected)
    assert p + c == prompt + chosen and p + r == prompt + rejected  # no text lost or added
    assert len(p) < len(prompt) and prompt.startswith(p) and c.endswith(chosen) and r.endswith(rejected)
    assert tok.encode_batch([p])[0] == pi and tok.encode_batch([p + c])[0] == pi + ci
    assert tok.encode_batch([p + r])[0] == pi + ri
    # a prompt already on a boundary is left alone
    assert token_boundary(tok, "x = 1\n", "y = 2\n", "z = 3\n")[:3] == ("x = 1\n", "y = 2\n", "z = 3\n")
