"""Train the small byte-level BPE tokenizer the tokenize tests and benchmarks use.

Why we ship our own: tests must never download a model's tokenizer at run time,
yet should exercise a real `tokenizer.json` of the kind open models publish
(byte-level BPE, special tokens). It ships inside the package as the
built-in `datakit:demo-bpe`, so `make demo` and the example pipelines run from an
installed wheel too. It is trained on real code: the top-level
modules of the CPython standard library, read in sorted order so a rerun with
the same Python gives the same file.

    python tests/data/tokenizer/train_tokenizer.py [STDLIB_DIR]

Special tokens baked in: <|endoftext|> (EOS), <|pad|>, and the FIM sentinels.
Chat role markers are deliberately *not* in the vocabulary, so the tests also
cover the path where datakit adds missing special tokens explicitly.
"""
from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>"]
HERE = Path(__file__).resolve().parent
# Shipped in the package as the built-in `datakit:demo-bpe` (the demo pipelines use it on any node);
# tests/data/tokenizer/tokenizer.json is a symlink to it.
OUT = HERE.parents[2] / "datakit" / "tokenizers" / "demo-bpe.json"


def stdlib_files(root: Path) -> list[str]:
    """Top-level stdlib .py files, sorted (deterministic corpus)."""
    return [str(p) for p in sorted(root.glob("*.py"))]


def train(root: Path, out: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(stdlib_files(root), trainer)
    tok.save(str(out), pretty=False)
    return tok


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(sysconfig.get_paths()["stdlib"])
    tok = train(root, OUT)
    print(f"vocab={tok.get_vocab_size()} size={OUT.stat().st_size} bytes")
