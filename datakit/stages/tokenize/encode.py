"""Training records -> token ids + loss masks, one row per document (before packing).

Why the layout of each kind is fixed here, in one place: the trainer learns the
exact token layout, so FIM sentinels, chat markers and which tokens carry loss
must be identical on every engine and every rerun.

Layouts (`[X]` is a special token, `text` is the encoded text, `^` marks loss):

- code:  `[BOS]? text^ [EOS]^` — documents are EOS-separated when packed.
  With probability `fim_rate` (decided per document from `(seed, doc_id)`) the
  document is FIM-transformed at two character positions drawn uniformly
  (Bavarian et al. 2022), each part encoded on its own:
    PSM: `[fim_prefix] prefix [fim_suffix] suffix [fim_middle] middle [EOS]`
    SPM: `[fim_prefix] [fim_suffix] suffix [fim_middle] prefix middle [EOS]`
  (SPM with probability `fim_spm_rate`, the StarCoder variant). Pretraining
  trains on every token of a code document, sentinels included.
- fim (editor examples, segments prefix/suffix/middle): the same sentinel
  layout; a segment's tokens carry loss iff its `train` flag is set, the EOS
  after the middle follows the middle's flag, sentinels never carry loss.
- sft: per segment `[<|role|>] text [<|end|>]`, then `[EOS]`; loss only on the
  text and the closing `[<|end|>]` of `train=True` (assistant) segments, so the
  model learns to end its turn; role markers and EOS carry none.
- preference: not packed; `prompt` (segments joined), `chosen`, `rejected`
  texts plus their token ids (`[BOS]? prompt`, `chosen [EOS]`, `rejected [EOS]`).
  The prompt ends on a token boundary (`token_boundary`): when the cursor was
  mid-word, the prompt's last partial token moves to the front of both
  completions, so a trainer that tokenizes `prompt` and `prompt + completion`
  (TRL) gets exactly our ids. Empty prompts (`empty_prompt`) and whitespace-only
  completions (`blank_completion`) are dropped with those reasons.
"""
from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from datakit.plan import DROP, DROP_DETAIL
from datakit.stages.tokenize.tokenizers import LoadedTokenizer

IDS = pa.list_(pa.int32())
MASK = pa.list_(pa.int8())

ENCODED_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("kind", pa.string()),
        # xxh64(doc_id, seed) as a signed int64 (Spark has no uint64): the seeded global-shuffle order
        ("shuffle_key", pa.int64()),
        ("n_tokens", pa.int32()),
        ("fim_mode", pa.string()),  # "psm" | "spm" | null
        ("input_ids", IDS),
        ("loss_mask", MASK),
        ("prompt", pa.string()),
        ("chosen", pa.string()),
        ("rejected", pa.string()),
        ("prompt_ids", IDS),
        ("chosen_ids", IDS),
        ("rejected_ids", IDS),
        # the record's source.language (null when unknown): lets the run report count tokens per language
        ("language", pa.string()),
    ]
)

# What a preference row means to a trainer (TRL DPO & co.): the only columns of a preference-only
# Parquet output (`packed`/`megatron` outputs write them to preference-*.parquet)
PREFERENCE_COLUMNS = ("prompt", "chosen", "rejected", "prompt_ids", "chosen_ids", "rejected_ids", "doc_id")
PREFERENCE_SCHEMA = pa.schema([ENCODED_SCHEMA.field(c) for c in PREFERENCE_COLUMNS])


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def token_boundary(tok: LoadedTokenizer, prompt: str, chosen: str, rejected: str
                   ) -> tuple[str, str, str, list[int], list[int], list[int]]:
    """Move the prompt's end to a token boundary that tokenizing `prompt + completion` keeps.

    Returns the (possibly shortened) prompt, both completions with the moved
    tail in front, and the ids: prompt = tok(prompt), completion =
    tok(prompt + completion) after the prompt's ids. This is TRL's rule
    (`DPOTrainer` tokenizes prompt and prompt+completion and splits at their
    common prefix); cutting where they agree makes that prefix the whole prompt,
    so nothing of the prompt is lost and both sides see the same ids.
    """
    rounds = 8  # each round cuts at least one character; real prompts settle in one or two
    for r in range(rounds):
        p, pc, pr = tok.encode_batch([prompt, prompt + chosen, prompt + rejected])
        k = min(_common_prefix(p, pc), _common_prefix(p, pr))
        if k == len(p) or r == rounds - 1 or not prompt:
            return prompt, chosen, rejected, p[:k], pc[k:], pr[k:]  # the last resort is TRL's own split
        head = tok.decode(p[:k]).rstrip("\ufffd")  # a byte-level split can end inside a character
        cut = len(head) if prompt.startswith(head) and len(head) < len(prompt) else len(prompt) - 1
        tail = prompt[cut:]
        prompt, chosen, rejected = prompt[:cut], tail + chosen, tail + rejected
    raise AssertionError("unreachable")


# Independent streams of per-document randomness: the shuffle order and the FIM
# draws must not be correlated, so each hashes under its own salt.
_SHUFFLE_SALT = 0x5EED_0001
_FIM_SALT = 0x5EED_0002
_U32 = float(1 << 32)
CHAT_ROLES = ("system", "user", "assistant", "tool")


def shuffle_keys(doc_ids: list[str], seed: int) -> np.ndarray:
    """The seeded global-shuffle order key of each document: xxh64(utf-8 doc_id, seed'), as int64.

    The 64 hash bits are reinterpreted as a signed integer (two's complement)
    because Spark has no unsigned types; the order is just as random.
    """
    s = (int(seed) * 0x9E3779B97F4A7C15 + _SHUFFLE_SALT) & 0xFFFFFFFFFFFFFFFF
    h = xxhash.xxh64_intdigest
    return np.fromiter((h(d.encode(), s) for d in doc_ids), dtype=np.uint64, count=len(doc_ids)).view(np.int64)


def fim_draws(doc_id: str, seed: int) -> tuple[float, float, float, float]:
    """Four uniforms in [0,1) for one document: (apply FIM?, SPM?, split a, split b).

    Drawn from xxh128 of the doc_id so they depend on (seed, doc_id) only —
    never on batch, partition or worker.
    """
    s = (int(seed) * 0x9E3779B97F4A7C15 + _FIM_SALT) & 0xFFFFFFFFFFFFFFFF
    h = xxhash.xxh128_intdigest(doc_id.encode(), s)
    return tuple(((h >> (32 * i)) & 0xFFFFFFFF) / _U32 for i in range(4))  # type: ignore[return-value]


@dataclass(frozen=True)
class EncodeOptions:
    """What shapes one document's tokens (a subset of the stage config)."""

    seed: int = 0
    fim_rate: float = 0.0
    fim_spm_rate: float = 0.5
    add_bos: bool = False
    seq_len: int = 2048
    overlong: str = "split"  # "split" | "drop": documents longer than seq_len


# A document is built as a list of parts: ("t", text, loss) for text to encode,
# ("s", token_id, loss) for one special token. All texts of a batch are then
# encoded in one `encode_batch` call (the tokenizer's Rust thread pool).
Part = tuple[str, Any, int]


def _seg_list(segs: Any) -> list[dict]:
    return [s for s in (segs or []) if s is not None]


def _code_parts(doc_id: str, segs: list[dict], tok: LoadedTokenizer, o: EncodeOptions) -> tuple[list[Part], str | None]:
    sp = tok.special
    parts: list[Part] = [("s", sp["bos"], 0)] if o.add_bos and "bos" in sp else []
    if o.fim_rate > 0:
        u_fim, u_spm, u_a, u_b = fim_draws(doc_id, o.seed)
        if u_fim < o.fim_rate:
            text = "".join(s.get("text") or "" for s in segs)
            n = len(text)
            a, b = sorted((min(int(u_a * (n + 1)), n), min(int(u_b * (n + 1)), n)))
            pre, mid, suf = text[:a], text[a:b], text[b:]
            if u_spm < o.fim_spm_rate:
                parts += [("s", sp["fim_prefix"], 1), ("s", sp["fim_suffix"], 1), ("t", suf, 1),
                          ("s", sp["fim_middle"], 1), ("t", pre, 1), ("t", mid, 1), ("s", sp["eos"], 1)]
                return parts, "spm"
            parts += [("s", sp["fim_prefix"], 1), ("t", pre, 1), ("s", sp["fim_suffix"], 1), ("t", suf, 1),
                      ("s", sp["fim_middle"], 1), ("t", mid, 1), ("s", sp["eos"], 1)]
            return parts, "psm"
    parts += [("t", s.get("text") or "", int(bool(s.get("train", True)))) for s in segs]
    parts.append(("s", sp["eos"], 1))
    return parts, None


def _fim_parts(doc_id: str, segs: list[dict], tok: LoadedTokenizer, o: EncodeOptions) -> tuple[list[Part], str | None]:
    sp = tok.special
    by_role: dict[str, tuple[str, int]] = {}
    for s in segs:
        role = s.get("role") or ""
        text, train = by_role.get(role, ("", 0))
        by_role[role] = (text + (s.get("text") or ""), int(train or bool(s.get("train"))))
    pre, pre_t = by_role.get("prefix", ("", 0))
    suf, suf_t = by_role.get("suffix", ("", 0))
    mid, mid_t = by_role.get("middle", ("", 1))
    parts: list[Part] = [("s", sp["bos"], 0)] if o.add_bos and "bos" in sp else []
    spm = o.fim_spm_rate > 0 and fim_draws(doc_id, o.seed)[1] < o.fim_spm_rate
    if spm:
        parts += [("s", sp["fim_prefix"], 0), ("s", sp["fim_suffix"], 0), ("t", suf, suf_t),
                  ("s", sp["fim_middle"], 0), ("t", pre, pre_t), ("t", mid, mid_t), ("s", sp["eos"], mid_t)]
    else:
        parts += [("s", sp["fim_prefix"], 0), ("t", pre, pre_t), ("s", sp["fim_suffix"], 0), ("t", suf, suf_t),
                  ("s", sp["fim_middle"], 0), ("t", mid, mid_t), ("s", sp["eos"], mid_t)]
    return parts, "spm" if spm else "psm"


def _sft_parts(segs: list[dict], tok: LoadedTokenizer, o: EncodeOptions) -> list[Part]:
    sp = tok.special
    parts: list[Part] = [("s", sp["bos"], 0)] if o.add_bos and "bos" in sp else []
    for s in segs:
        role = s.get("role") or "user"
        if role not in CHAT_ROLES or role not in sp:
            raise KeyError(role)
        train = int(bool(s.get("train")))
        parts += [("s", sp[role], 0), ("t", s.get("text") or "", train), ("s", sp["end_turn"], train)]
    parts.append(("s", sp["eos"], 0))
    return parts


def _interleave(text_tokens: np.ndarray, piece_len: np.ndarray, piece_special: np.ndarray) -> np.ndarray:
    """The ids of pieces laid end to end: encoded texts in order, special tokens where `piece_special >= 0`.

    Why not a gather (`source[gather_index(starts, lengths)]`): the texts are consumed in order, so
    only the special tokens' positions need computing. Writing the texts through a mask that skips
    those positions makes no per-token index array: 0.03 vs 0.28-0.48 CPU-s for 11M tokens in 33k
    documents."""
    out = np.empty(int(piece_len.sum()), dtype=np.int32)
    special = piece_special >= 0
    at = (np.cumsum(piece_len) - piece_len)[special]  # a special piece is one token
    is_text = np.ones(len(out), dtype=bool)
    is_text[at] = False
    out[is_text] = text_tokens
    out[at] = piece_special[special]
    return out


class _Pieces(NamedTuple):
    """A batch's documents as pieces (an encoded text, or one special token) in output order, and what
    `encode_table` needs of them to build the ids and masks; what both ways of making them return."""

    text_values: np.ndarray  # every encoded text's ids, concatenated
    text_lens: np.ndarray  # token count of each encoded text
    text_kept: np.ndarray  # whether each encoded text belongs to a kept document
    piece_len: Any  # per piece: its token count
    piece_loss: Any  # per piece: 1 if its tokens carry loss
    piece_special: Any  # per piece: the special token, -1 for an encoded text
    doc_len: np.ndarray  # tokens of each document (0 when it is not kept)
    valid: np.ndarray  # whether each document is kept
    drop: list  # each document's drop reason (None: kept)


def _plain_code_pieces(table: pa.Table, tok: LoadedTokenizer, o: EncodeOptions) -> _Pieces | None:
    """`encode_table`'s pieces for a batch of only `code` records without FIM, in vectorized passes; None
    for any other batch (the general path then runs).

    Why: on editor-sized documents the general path's per-document Python (a dict per segment, a
    tuple per part, a list append per piece) was ~4% of a tokenize-only run (32 MB of <= 2,000-
    character documents: ~0.26 of 6.15 CPU-s in one process), the largest cost after the tokenizer
    and the id lists. The layout is the same `[BOS]? text^ [EOS]^` per document, and tests hold
    the two paths to the same output on batches with null and empty segments, BOS and overlong drops.
    """
    n = table.num_rows
    if o.fim_rate > 0 or n == 0 or "segments" not in table.column_names or "kind" not in table.column_names:
        return None
    kinds = table.column("kind")
    if kinds.null_count or not pc.all(pc.equal(kinds, "code")).as_py():
        return None
    segs = table.column("segments").combine_chunks()
    st = segs.type.value_type if pa.types.is_list(segs.type) else None
    if st is None or not pa.types.is_struct(st) or st.get_field_index("text") < 0 \
            or not pa.types.is_string(st.field("text").type) \
            or (st.get_field_index("train") >= 0 and not pa.types.is_boolean(st.field("train").type)):
        return None
    lengths = pc.fill_null(pc.list_value_length(segs), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = segs.flatten()  # the segments of the non-null lists, in order
    seg_row = np.repeat(np.arange(n), lengths)
    seg_valid = flat.is_valid().to_numpy(zero_copy_only=False)  # a null segment is skipped (`_seg_list`)
    text = flat.field("text")
    nonempty = seg_valid & (pc.fill_null(pc.utf8_length(text), 0).to_numpy(zero_copy_only=False) > 0)
    train = (pc.fill_null(flat.field("train"), False).to_numpy(zero_copy_only=False).astype(np.int8)
             if st.get_field_index("train") >= 0 else np.ones(len(flat), np.int8))  # bool(None) is False
    has_text = np.bincount(seg_row[nonempty], minlength=n) > 0
    enc = seg_valid & has_text[seg_row]  # every segment of a document that is encoded, empty ones too
    text_values, text_lens = tok.encode_flat(pc.fill_null(text.filter(pa.array(enc)), "").to_pylist())
    enc_row = seg_row[enc]
    bos = 1 if o.add_bos and "bos" in tok.special else 0
    length = bos + np.bincount(enc_row, weights=text_lens, minlength=n).astype(np.int64) + 1
    too_long = has_text & (length > o.seq_len) if o.overlong == "drop" else np.zeros(n, dtype=bool)
    valid = has_text & ~too_long
    drop: list[str | None] = [None] * n
    for i in np.flatnonzero(~has_text).tolist():
        drop[i] = "empty_document"
    for i in np.flatnonzero(too_long).tolist():
        drop[i] = "too_long"
    text_kept = valid[enc_row]
    per = bos + np.bincount(enc_row[text_kept], minlength=n)[valid] + 1  # pieces of each document kept
    start = np.cumsum(per) - per
    piece_len = np.empty(int(per.sum()), dtype=np.int64)
    piece_loss = np.empty(len(piece_len), dtype=np.int8)
    piece_special = np.full(len(piece_len), -1, dtype=np.int64)
    last = start + per - 1
    piece_len[last], piece_loss[last], piece_special[last] = 1, 1, tok.special["eos"]
    if bos:
        piece_len[start], piece_loss[start], piece_special[start] = 1, 0, tok.special["bos"]
    is_text = piece_special < 0
    piece_len[is_text] = text_lens[text_kept]
    piece_loss[is_text] = train[enc][text_kept]
    doc_len = np.where(valid, length, 0)
    return _Pieces(text_values, text_lens, text_kept, piece_len, piece_loss, piece_special, doc_len, valid, drop)


def encode_table(table: pa.Table | pa.RecordBatch, tok: LoadedTokenizer, o: EncodeOptions) -> pa.Table:
    """Encode training records into `ENCODED_SCHEMA` rows (+ `_drop`, `_drop_detail`).

    Rows that cannot be encoded are *marked*, never filtered, so the engine
    counts them: `empty_document`, `unknown_kind`, `unknown_role`, and
    `too_long` (only with `overlong="drop"`).
    """
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if "source" in table.column_names and pa.types.is_struct(table.schema.field("source").type) \
            and table.schema.field("source").type.get_field_index("language") >= 0:
        language = pc.struct_field(table.column("source"), "language")
    else:
        language = pa.nulls(table.num_rows, pa.string())
    n = table.num_rows
    fim_mode: list[str | None] = [None] * n
    detail: list[str | None] = [None] * n
    pref: dict[int, tuple[str, str, str]] = {}
    pieces = _plain_code_pieces(table, tok, o)
    if pieces is not None:
        doc_ids: list[str] = table.column("doc_id").to_pylist()
        kinds: list[str] = table.column("kind").to_pylist()
    else:
        doc_ids, kinds, pieces = _general_pieces(table, tok, o, fim_mode, detail, pref)
    return _encoded(tok, o, doc_ids, kinds, language, fim_mode, detail, pref, pieces)


def _general_pieces(table: pa.Table, tok: LoadedTokenizer, o: EncodeOptions, fim_mode: list, detail: list,
                    pref: dict) -> tuple[list[str], list[str], _Pieces]:
    """Every kind of record: the documents' parts one by one (fills `fim_mode`, `detail`, `pref`)."""
    # only what encoding reads: `source`/`meta` may be large and are never needed here
    cols = table.select([c for c in ("doc_id", "kind", "segments", "chosen", "rejected")
                         if c in table.column_names]).to_pydict()
    doc_ids: list[str] = cols["doc_id"]
    kinds: list[str] = cols["kind"]
    segments: list[Any] = cols.get("segments") or [None] * len(doc_ids)
    chosen_col: list[Any] = cols.get("chosen") or [None] * len(doc_ids)
    rejected_col: list[Any] = cols.get("rejected") or [None] * len(doc_ids)
    n = len(doc_ids)

    doc_parts: list[list[Part] | None] = [None] * n
    drop: list[str | None] = [None] * n
    for i in range(n):
        kind, segs = kinds[i], _seg_list(segments[i])
        try:
            if kind == "code":
                if not any(s.get("text") for s in segs):
                    drop[i] = "empty_document"
                    continue
                doc_parts[i], fim_mode[i] = _code_parts(doc_ids[i], segs, tok, o)
            elif kind == "fim":
                if not any(s.get("text") for s in segs):
                    drop[i] = "empty_document"
                    continue
                doc_parts[i], fim_mode[i] = _fim_parts(doc_ids[i], segs, tok, o)
            elif kind == "sft":
                if not segs:
                    drop[i] = "empty_document"
                    continue
                doc_parts[i] = _sft_parts(segs, tok, o)
            elif kind == "preference":
                prompt = "".join(s.get("text") or "" for s in segs)
                if chosen_col[i] is None or rejected_col[i] is None:
                    drop[i] = "empty_document"
                    detail[i] = "preference pair without chosen/rejected"
                    continue
                if not prompt.strip():
                    drop[i] = "empty_prompt"
                    continue
                if not chosen_col[i].strip() or not rejected_col[i].strip():
                    drop[i] = "blank_completion"
                    continue
                pref[i] = (prompt, chosen_col[i], rejected_col[i])
            else:
                drop[i] = "unknown_kind"
                detail[i] = _shown_name(kind)
        except KeyError as e:
            drop[i] = "unknown_role"
            detail[i] = _shown_name(e.args[0])

    # one batched encode for every text piece of the batch, straight into one flat id array
    texts: list[str] = []
    for parts in doc_parts:
        if parts:
            texts.extend(p[1] for p in parts if p[0] == "t")
    text_values, text_lens = tok.encode_flat(texts)
    for i, (prompt, ch, rej) in list(pref.items()):
        pref[i] = token_boundary(tok, prompt, ch, rej)
        if not pref[i][0].strip():  # the whole prompt was one partial word
            drop[i] = "empty_prompt"
            del pref[i]

    # the documents' pieces in output order, as lengths (and the token of each special piece); ids and
    # masks are then built in vectorized passes (per piece, never per token: a Python list of every
    # token was the stage's largest cost after the tokenizer itself)
    text_len = text_lens.tolist()
    text_kept = np.ones(len(texts), dtype=bool)
    piece_len: list[int] = []
    piece_loss: list[int] = []
    piece_special: list[int] = []  # the token of a special piece, -1 for an encoded text
    doc_len = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    k = 0
    for i, parts in enumerate(doc_parts):
        if parts is not None:
            first, first_text, length = len(piece_len), k, 0
            for typ, val, loss in parts:
                if typ == "t":
                    size, special = text_len[k], -1
                    k += 1
                else:
                    size, special = 1, val
                piece_len.append(size)
                piece_loss.append(loss)
                piece_special.append(special)
                length += size
            if o.overlong == "drop" and length > o.seq_len:
                del piece_len[first:], piece_loss[first:], piece_special[first:]
                text_kept[first_text:k] = False
                drop[i] = "too_long"
            else:
                valid[i] = True
                doc_len[i] = length
    return doc_ids, kinds, _Pieces(text_values, text_lens, text_kept, piece_len, piece_loss, piece_special, doc_len,
                                   valid, drop)


def _encoded(tok: LoadedTokenizer, o: EncodeOptions, doc_ids: list, kinds: list, language: Any, fim_mode: list,
             detail: list, pref: dict, pieces: _Pieces) -> pa.Table:
    """The `ENCODED_SCHEMA` rows from the documents' pieces: ids and masks in vectorized passes."""
    text_values, text_lens, text_kept, piece_len, piece_loss, piece_special, doc_len, valid, drop = pieces
    n = len(doc_ids)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(doc_len, out=offsets[1:])
    lens = np.asarray(piece_len, dtype=np.int64)
    ids = _interleave(text_values if text_kept.all() else text_values[np.repeat(text_kept, text_lens)],
                      lens, np.asarray(piece_special, dtype=np.int64))
    mask = np.repeat(np.asarray(piece_loss, dtype=np.int8), lens)

    eos = [tok.eos_id]
    bos = [tok.special["bos"]] if o.add_bos and "bos" in tok.special else []
    p_ids: list[list[int] | None] = [None] * n
    c_ids: list[list[int] | None] = [None] * n
    r_ids: list[list[int] | None] = [None] * n
    for i, (_, _, _, pi, ci, ri) in pref.items():
        p_ids[i] = bos + pi
        c_ids[i] = ci + eos
        r_ids[i] = ri + eos

    values = pa.array(ids)
    mvalues = pa.array(mask)
    null_mask = pa.array(~valid)
    input_ids = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values, mask=null_mask)
    loss_mask = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), mvalues, mask=null_mask)
    n_tokens = np.diff(offsets).astype(np.int32)
    out = pa.table(
        {
            "doc_id": pa.array(doc_ids, pa.string()),
            "kind": pa.array(kinds, pa.string()),
            "shuffle_key": pa.array(shuffle_keys(doc_ids, o.seed)),
            "n_tokens": pa.array(np.where(valid, n_tokens, 0).astype(np.int32)),
            "fim_mode": pa.array(fim_mode, pa.string()),
            "input_ids": input_ids,
            "loss_mask": loss_mask,
            "prompt": pa.array([pref[i][0] if i in pref else None for i in range(n)], pa.string()),
            "chosen": pa.array([pref[i][1] if i in pref else None for i in range(n)], pa.string()),
            "rejected": pa.array([pref[i][2] if i in pref else None for i in range(n)], pa.string()),
            "prompt_ids": pa.array(p_ids, IDS),
            "chosen_ids": pa.array(c_ids, IDS),
            "rejected_ids": pa.array(r_ids, IDS),
            "language": language,
            DROP: pa.array(drop, pa.string()),
            DROP_DETAIL: pa.array(detail, pa.string()),
        }
    )
    return out


_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,31}")


def _shown_name(value: object) -> str:
    """An unknown kind or role as the drop log shows it: the name when it reads as one, else only
    its length. Why: the value comes from the data (a records input may carry any string there),
    and the drop log must never hold an email or a key that was put where a name belongs."""
    text = str(value)
    return text if _NAME.fullmatch(text) else f"<not a name: {len(text)} chars>"
