"""The tokenize stage's batch functions: what its worker processes unpickle and run.

Why apart from `stage.py`: a worker needs only these, and `stage.py` holds the stage's
configuration (a pydantic model, with the rest of the stage registry behind it). Kept here,
unpickling a task imports the encoder and the tokenizer loader, not pydantic: ~0.1 CPU-s less in
every pool worker's start-up.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from datakit.stages.tokenize.encode import EncodeOptions, encode_table
from datakit.stages.tokenize.tokenizers import LoadedTokenizer, load_tokenizer


class EncodeFn:
    """Picklable batch function: the tokenizer is loaded by `setup()`, once per worker process.

    Only the path and options travel to workers/executors (a tokenizer object
    would be re-serialized for every task); the engines call `setup()` once per
    worker and run (`engines/core.py: worker_fn`), a direct call loads it on first use.
    """

    def __init__(self, tokenizer: str, overrides: dict[str, str], roles: bool, opts: EncodeOptions,
                 expected_sha256: str) -> None:
        self.tokenizer = tokenizer
        self.overrides = overrides
        self.roles = roles
        self.opts = opts
        self.expected_sha256 = expected_sha256
        self._tok: LoadedTokenizer | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_tok"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._tok = None

    def setup(self) -> None:
        """Load the tokenizer and check it is the one the driver compiled with (same sha256)."""
        tok = load_tokenizer(self.tokenizer, self.overrides, roles=self.roles)
        if tok.sha256 != self.expected_sha256:
            raise RuntimeError(f"tokenizer {self.tokenizer!r} differs on this worker (sha256 mismatch)")
        self._tok = tok

    def tok(self) -> LoadedTokenizer:
        if self._tok is None:
            self.setup()
        return self._tok  # type: ignore[return-value]

    def __call__(self, batch: pa.RecordBatch) -> pa.Table:
        return encode_table(batch, self.tok(), self.opts)


class SelectColumns:
    """Picklable batch function: keep `names` (a projection; drops nothing)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = list(names)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.select(self.names)


class RepoEncodeFn(EncodeFn):
    """EncodeFn for `packing: repository` (path headers, import specs, older versions dropped)."""

    def __call__(self, batch: pa.RecordBatch) -> pa.Table:
        from datakit.stages.tokenize.repository import encode_repository

        return encode_repository(batch, self.tok(), self.opts)
