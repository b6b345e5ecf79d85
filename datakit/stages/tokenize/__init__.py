"""Tokenization into packed sequences (see docs/packed_format.md).

Modules, one job each: `tokenizers` (load a tokenizer.json / tiktoken encoding,
resolve special tokens), `encode` (records -> token ids + loss masks per kind),
`batch` (the picklable batch functions workers run, free of the
stage config), `packing` (concat / best-fit-decreasing), `writers` (`packed` and `megatron`
output formats), `stage` (the `tokenize` stage config), `inspect` (what
`datakit inspect PATH` prints). The trainer-side reader is `datakit.loader`.
"""
