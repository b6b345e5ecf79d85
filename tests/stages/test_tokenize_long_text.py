"""One very long text is encoded piece by piece (`tokenize/long_text.py`) to the same ids as whole.

The reference is the library's own whole-text encoding, on tokenizers of each kind a user brings:
byte-level BPE (GPT-2, StarCoder: the shipped demo tokenizer; Qwen2's NFC + split regex + byte-level
over the same vocabulary), SentencePiece-style
Metaspace BPE and Unigram (Llama 2, T5), and WordPiece behind a normalizer (BERT). Small windows make
the texts short; the production sizes only change how often a cut happens.
"""
from __future__ import annotations

import glob
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from datakit.stages.tokenize import long_text
from datakit.stages.tokenize.long_text import encode_long

DEMO = str(Path(__file__).resolve().parents[2] / "datakit" / "tokenizers" / "demo-bpe.json")
SMALL = {"piece": 3000, "probe": 300}


def _corpus() -> str:
    files = sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py"))[:40]
    return "".join(Path(f).read_text(encoding="utf-8", errors="replace") for f in files)


CODE = _corpus()[:60_000]
PROSE = ("The parser reads the config once. Anna fixed the cache last week; the tests pass again.\n\n" * 400)
MIXED = ("日本語のテキストと English words, émojis 🙂🚀 and    wide   spaces\t\t\n" * 700)
SPECIAL = ("x = '<|endoftext|>'  # special-token text in data is plain text\n" * 900)


def _trained(kind: str) -> Tokenizer:
    corpus = [CODE[i:i + 2000] for i in range(0, 40_000, 2000)] + [PROSE[:5000], MIXED[:5000]]
    if kind == "metaspace-bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=["<unk>"])
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(vocab_size=600, special_tokens=["<unk>"], unk_token="<unk>")
    else:  # wordpiece behind a normalizer
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=800, special_tokens=["[UNK]"])
    tok.train_from_iterator(corpus, trainer)
    return tok


# Qwen2 / Qwen2.5-Coder's tokenizer.json: NFC, then its split regex, then byte-level without a regex
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")


def _tokenizer(kind: str) -> Tokenizer:
    if kind == "qwen-style":
        from tokenizers import Regex

        tok = Tokenizer.from_file(DEMO)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        return tok
    if kind == "byte-level-bpe":
        tok = Tokenizer.from_file(DEMO)
        tok.add_special_tokens(["<|endoftext|>"])
        tok.encode_special_tokens = True  # as datakit loads every tokenizer
        return tok
    return _trained(kind)


@pytest.mark.parametrize("kind", ["byte-level-bpe", "qwen-style", "metaspace-bpe", "unigram", "wordpiece"])
@pytest.mark.parametrize("text", [CODE, PROSE, MIXED, SPECIAL], ids=["code", "prose", "mixed", "special"])
def test_windows_give_the_whole_texts_ids(kind, text, monkeypatch) -> None:
    tok = _tokenizer(kind)
    whole = np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)
    calls: list[int] = []
    real = long_text._encode
    monkeypatch.setattr(long_text, "_encode", lambda t, s: calls.append(len(s)) or real(t, s))
    ids = encode_long(tok, text, **SMALL)
    assert ids.dtype == np.int32 and np.array_equal(ids, whole)
    # cut into pieces (four small probes per cut), never encoded whole
    assert max(calls) <= 3 * SMALL["probe"] and len(calls) == 4 * len(range(3000, len(text) - 1500, 3000))


def test_a_piece_longer_than_the_overlap_falls_back_to_the_whole_text(monkeypatch) -> None:
    """One pre-token (a 20,000-character word) covers the first cut's probes: no pre-token starts there,
    so the text is encoded whole, as the library would."""
    tok = _tokenizer("byte-level-bpe")
    text = "start = 1\n" + "a" * 20_000 + "\nend = 2\n"
    calls: list[int] = []
    real = long_text._encode
    monkeypatch.setattr(long_text, "_encode", lambda t, s: calls.append(len(s)) or real(t, s))
    ids = encode_long(tok, text, **SMALL)
    assert np.array_equal(ids, np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int32))
    assert calls[-1] == len(text)


def test_encode_flat_encodes_a_text_over_the_chunk_limit_in_windows(monkeypatch) -> None:
    """The tokenize stage's path: a text over ENCODE_CHUNK_CHARS alone goes through `encode_long`, and
    every text keeps its own ids and count."""
    from datakit.stages.tokenize import tokenizers as toks

    tok = toks.load_tokenizer("datakit:demo-bpe")
    monkeypatch.setattr(toks, "ENCODE_CHUNK_CHARS", 20_000)
    for name, value in SMALL.items():
        monkeypatch.setattr(long_text, name.upper(), value)
    seen: list[int] = []
    real = long_text.encode_long
    monkeypatch.setattr(long_text, "encode_long", lambda t, s: seen.append(len(s)) or real(t, s))
    texts = ["def f():\n    return 1\n", CODE[:50_000], "x = 2\n", CODE[:15_000], CODE[:15_000]]
    ids, lengths = tok.encode_flat(texts)
    whole = [tok.impl.encode(t, add_special_tokens=False).ids for t in texts]
    assert lengths.tolist() == [len(w) for w in whole]
    assert ids.tolist() == [i for w in whole for i in w]
    assert seen == [50_000]  # only the long text alone; two texts that together pass the limit are one batch
