"""`DatakitError`: the one base of every error datakit raises about a run rather than about its own code.

Why one base: a notebook or a scheduler wants `except datakit.DatakitError` to catch what a user can fix
(a bad pipeline file, a missing input, a tokenizer that does not load, a storage fault, a quality gate,
a failed stage) and let a datakit bug through. The classes keep their own bases too (`PipelineError` is a
`ValueError`, `StorageError` a `RuntimeError`), so existing `except` clauses catch what they caught.
Found in review: `except PipelineError` missed a missing input (`InputError`), a bad tokenizer and an
output path that is a file, which derived from `Exception` alone.
"""
from __future__ import annotations


class DatakitError(Exception):
    """Base of the errors datakit raises about a run (see the module doc)."""


__all__ = ["DatakitError"]
