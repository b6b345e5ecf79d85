"""Decontamination against eval sets: n-gram matching, a pipeline stage, a training-set index, a CLI check.

Modules (one job each): `evals` (eval-set registry and loaders), `normalize`
(code-aware tokenization + normalizations), `ngrams` (64-bit n-gram hash
kernels), `matcher` (the eval table and batch matching), `index` (training-set
n-gram index), `check` (the contamination check and its reports), `stage` (the
`decontaminate` pipeline stage), `cli` (`datakit contamination-check`).

Kept import-light: `datakit.cli` imports the command at start-up.
"""
