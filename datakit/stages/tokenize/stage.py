"""The `tokenize` stage: training records -> encoded documents, packed by the output writer.

Why packing is not a plan node: packing must see *all* documents of an output
shard in one deterministic order to be byte-identical on every engine and
partitioning. The sink already gives a writer exactly that (a shard's rows,
sorted), so this stage only encodes (a row-local `map_batches`, the expensive
part, parallel on both engines) and hands its settings to the `packed` /
`megatron` writer through `ctx.sink_options` (the pipeline copies
them into `SinkSpec.options`).

Global shuffle (documented in docs/packed_format.md): a document's shard is
`xxh64(doc_id) % shards` (the sink's rule); inside a shard documents are
ordered by `shuffle_key = xxh64(doc_id, f(seed))`, ties by doc_id. Packing keeps
that order (concat) or derives from it (best_fit). The loader adds a seeded
per-epoch permutation of sequences on top.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from datakit.plan import Rel
from datakit.resources import BUILTIN_TOKENIZER_PREFIX
from datakit.stages.base import CompileContext, StageConfig, register_stage
from datakit.stages.tokenize.batch import EncodeFn, RepoEncodeFn, SelectColumns
from datakit.stages.tokenize.encode import ENCODED_SCHEMA, PREFERENCE_COLUMNS, PREFERENCE_SCHEMA, EncodeOptions
from datakit.stages.tokenize.tokenizers import (HUB_PREFIX, LoadedTokenizer, file_sep_text, load_tokenizer,
                                               reads_as_hub_id)


def preference_only(rel: Rel) -> Rel:
    """Tokenized preference pairs as trainers read them: only PREFERENCE_COLUMNS.

    Why: a preference-only Parquet output would otherwise carry the packing
    columns (`input_ids`, `loss_mask`, `n_tokens`, ...) null or zero in every row.
    A side node (not counted as a stage): it only projects.
    """
    side = Rel(rel.node, f"{rel.stage}:side")
    return side.map_batches(SelectColumns(PREFERENCE_COLUMNS), PREFERENCE_SCHEMA, name="preference_columns")


@register_stage
class TokenizeConfig(StageConfig):
    """Tokenize training records for the `packed`, `megatron` (or `parquet`) output formats.

    YAML: `{kind: tokenize, tokenizer: PATH, seq_len: 2048, packing: best_fit, fim_rate: 0.5}`.
    """

    kind: Literal["tokenize"] = "tokenize"
    tokenizer: str = Field(description="tokenizer.json (or its folder), datakit:NAME (shipped with datakit, "
                                       "e.g. datakit:demo-bpe), or tiktoken:ENCODING (offline files)")
    seq_len: int = Field(2048, ge=8, le=1 << 20)
    packing: Literal["concat", "best_fit", "repository"] = Field(
        "best_fit", description="concat, best_fit, or repository (a repository's files together, in import "
                                "order, for long context: see tokenize/repository.py)")
    fim_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of code documents FIM-transformed")
    fim_spm_rate: float = Field(0.5, ge=0.0, le=1.0, description="share of FIM examples in SPM (else PSM) order")
    add_bos: bool = False
    overlong: Literal["split", "drop"] = Field(
        "split", description="documents longer than seq_len: split into chunks, or drop (reason too_long)")
    special_tokens: dict[str, str] = Field(
        default_factory=dict, description="pin special token texts, e.g. {eos: '</s>', pad: '<pad>'}")
    chat_roles: bool = Field(True, description="add chat role markers (<|user|>...) when the tokenizer lacks them")

    produces = "tokenized_record.v1"
    path_fields = ("tokenizer",)
    reads = ("doc_id", "kind", "segments", "chosen", "rejected", "source")
    writes = ("input_ids", "loss_mask")

    @field_validator("special_tokens")
    @classmethod
    def _known_roles(cls, v: dict[str, str]) -> dict[str, str]:
        known = {"bos", "eos", "pad", "fim_prefix", "fim_middle", "fim_suffix",
                 "system", "user", "assistant", "tool", "end_turn", "file_sep"}
        bad = sorted(set(v) - known)
        if bad:
            raise ValueError(f"unknown special token roles {bad}; known: {sorted(known)}")
        return v

    def load(self, ctx: CompileContext | None = None) -> LoadedTokenizer:
        named = self.tokenizer.startswith(("tiktoken:", BUILTIN_TOKENIZER_PREFIX))  # names, not paths
        path = ctx.resolve(self.tokenizer) if ctx is not None and not named else self.tokenizer
        if path != self.tokenizer and reads_as_hub_id(self.tokenizer) and not Path(path).exists():
            # `Org/Name` is a Hub model id, not a path below the pipeline's folder, whatever the current
            # folder holds (found in review: a folder `acme/coder` in the current folder made the run fail)
            path = self.tokenizer if self.tokenizer.startswith(HUB_PREFIX) else HUB_PREFIX + self.tokenizer
        tok = load_tokenizer(path, self.overrides(path), roles=self.chat_roles)
        if self.add_bos and "bos" not in tok.special:  # found in review: ignored without a word
            raise ValueError(f"add_bos: the tokenizer {self.tokenizer} has no BOS token; name one with "
                             "special_tokens: {bos: '<s>'} (added to its vocabulary if it has no such token), or set add_bos: false")
        return tok

    def overrides(self, path: str) -> dict[str, str]:
        """Pinned special-token texts; repository packing adds the file separator (the tokenizer's own if any)."""
        o = dict(self.special_tokens)
        if self.packing == "repository" and "file_sep" not in o:
            o["file_sep"] = file_sep_text(path)
        return o

    def sink_options(self, tok: LoadedTokenizer, seed: int) -> dict[str, Any]:
        """What the packed/megatron writers need (JSON-able; goes into SinkSpec.options)."""
        return {
            "seq_len": self.seq_len,
            "packing": self.packing,
            "tokenizer": tok.name,
            "tokenizer_overrides": self.overrides(tok.name),
            "tokenizer_roles": self.chat_roles,
            "tokenizer_sha256": tok.sha256,
            "vocab_size": tok.vocab_size,
            "pad_id": tok.pad_id,
            "special_tokens": tok.manifest_fields()["special_tokens"],
            "added_tokens": list(tok.added),
            "shuffle": {"method": "xxh64(doc_id, seed) order within shard", "seed": seed},
            # the repository writer puts the BOS of a repository's first unit (other records have theirs
            # from the encoder); only then, so other outputs' options are what they were
            **({"add_bos": True} if self.add_bos and self.packing == "repository" else {}),
        }

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        tok = self.load(ctx)  # fail at compile time, with a clear message, if the tokenizer is missing
        opts = EncodeOptions(seed=ctx.seed, fim_rate=self.fim_rate, fim_spm_rate=self.fim_spm_rate,
                             add_bos=self.add_bos, seq_len=self.seq_len, overlong=self.overlong)
        ctx.sink_options.update(self.sink_options(tok, ctx.seed))
        # the encoding depends on the tokenizer file and on the library that runs it
        from datakit.io.identity import library_version

        ctx.record("tokenizer_sha256", tok.sha256)
        ctx.record("tokenizers", library_version("tokenizers"))
        if self.packing == "repository":
            from datakit.stages.tokenize.repository import GROUP, compile_repository

            # a repository goes to one shard whole: shard by its group, sort by doc_id inside
            ctx.sink_key, ctx.sink_sort_key = GROUP, "doc_id"
            return compile_repository(rel, RepoEncodeFn(tok.name, self.overrides(tok.name), self.chat_roles, opts, tok.sha256))
        fn = EncodeFn(tok.name, dict(self.special_tokens), self.chat_roles, opts, tok.sha256)
        # the tokenizer encodes each batch on its own thread pool across the process's cores
        return rel.map_batches(fn, ENCODED_SCHEMA, name="tokenize", drop_log_key="doc_id", threads="native")
