"""Packing documents into fixed-length sequences, with every document boundary kept.

Two algorithms, one output layout:

- `concat`: documents in order, one token stream, cut every `seq_len` tokens.
  Fills every sequence but the last; documents routinely span two sequences.
- `best_fit`: best-fit-decreasing bin packing of whole documents ("Fewer
  Truncations Improve Language Modeling", Ding et al. 2024). Documents longer
  than `seq_len` are cut into `seq_len` chunks (each a sequence of its own) plus
  a remainder that is packed like any document; no other document is split.
  Ties (equal lengths) keep input order, and bins are emitted ordered by the
  input rank of the piece that opened them, so the result is a pure function of
  the input order — which the writer makes the seeded shuffle order.

Both produce a list of *pieces* (seq, pos, doc_row, doc_offset, length): piece
`k` copies tokens `[doc_offset, doc_offset+length)` of document `doc_row` to
positions `[pos, pos+length)` of sequence `seq`. `materialize` turns pieces into
the arrays the writer saves; the test suite rebuilds every document from them.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

PACKING_ALGORITHMS = ("concat", "best_fit", "repository")  # repository: see repository.py


@dataclass
class Pieces:
    """Where each piece of each document lands (all int64 arrays of equal length, sorted by seq, pos)."""

    seq: np.ndarray
    pos: np.ndarray
    doc_row: np.ndarray
    doc_offset: np.ndarray
    length: np.ndarray
    n_sequences: int


@dataclass
class Packed:
    """One shard's packed arrays (what `writers.PackedShardWriter` saves).

    tokens/loss_mask: [n, seq_len]. segments: [n_seg, 3] int64 rows
    (start position in its sequence, document row or -1 for padding, token
    offset inside that document). seq_index: [n+1] int64, sequence i's segments
    are `segments[seq_index[i]:seq_index[i+1]]`; its cu_seqlens are their starts
    followed by seq_len.
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    segments: np.ndarray
    seq_index: np.ndarray
    stats: dict[str, int]


def pack_concat(lengths: np.ndarray, seq_len: int) -> Pieces:
    """Concatenate documents in order and chunk every `seq_len` tokens."""
    lengths = np.asarray(lengths, dtype=np.int64)
    doc_start = np.concatenate([[0], np.cumsum(lengths)])
    total = int(doc_start[-1])
    n_seq = -(-total // seq_len)
    # piece boundaries: every document start and every sequence start
    cuts = np.union1d(doc_start[:-1][lengths > 0], np.arange(0, total, seq_len, dtype=np.int64))
    ends = np.append(cuts[1:], total)
    doc_row = np.searchsorted(doc_start, cuts, side="right") - 1
    return Pieces(
        seq=cuts // seq_len, pos=cuts % seq_len, doc_row=doc_row.astype(np.int64),
        doc_offset=cuts - doc_start[doc_row], length=ends - cuts, n_sequences=int(n_seq),
    )


def pack_best_fit(lengths: np.ndarray, seq_len: int) -> Pieces:
    """Best-fit-decreasing packing; only documents longer than `seq_len` are split."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n_docs = len(lengths)
    rows = np.arange(n_docs, dtype=np.int64)
    # documents > seq_len: full chunks become sequences of their own, the remainder is packed
    n_full = np.where(lengths > seq_len, lengths // seq_len, 0)
    rem = np.where(lengths > seq_len, lengths % seq_len, lengths)
    full_rows = np.repeat(rows, n_full)
    full_off = (np.arange(len(full_rows)) - np.repeat(np.cumsum(n_full) - n_full, n_full)) * seq_len
    item_rows = rows[rem > 0]
    item_len = rem[rem > 0]
    item_off = (n_full * seq_len)[rem > 0]
    # decreasing length, ties in input order (a stable sort of -length)
    order = np.argsort(-item_len, kind="stable")

    # bin state: remaining capacity per bin; bins_at[c] = stack of bins with capacity c;
    # caps = sorted list of capacities that have at least one bin (bisect finds best fit)
    bin_cap: list[int] = []
    bin_opener: list[int] = []  # index of the item that opened the bin (for output order)
    bins_at: dict[int, list[int]] = {}
    caps: list[int] = []
    item_bin = np.empty(len(item_len), dtype=np.int64)
    item_pos = np.empty(len(item_len), dtype=np.int64)
    lens_list = item_len.tolist()
    for it in order.tolist():
        L = lens_list[it]
        j = bisect.bisect_left(caps, L)
        if j < len(caps):
            c = caps[j]
            stack = bins_at[c]
            b = stack.pop()
            if not stack:
                del bins_at[c]
                caps.pop(j)
            item_pos[it] = seq_len - c
        else:
            b = len(bin_cap)
            bin_cap.append(seq_len)
            bin_opener.append(it)
            c = seq_len
            item_pos[it] = 0
        item_bin[it] = b
        nc = c - L
        bin_cap[b] = nc
        if nc > 0:
            stack = bins_at.get(nc)
            if stack is None:
                bins_at[nc] = [b]
                bisect.insort(caps, nc)
            else:
                stack.append(b)

    # order sequences by the input position of what opened them: full chunks by
    # (doc row, chunk offset), packed bins by their opener's (doc row, offset)
    n_bins = len(bin_cap)
    opener = np.asarray(bin_opener, dtype=np.int64)
    seq_key_row = np.concatenate([full_rows, item_rows[opener] if n_bins else np.empty(0, np.int64)])
    seq_key_off = np.concatenate([full_off, item_off[opener] if n_bins else np.empty(0, np.int64)])
    seq_order = np.lexsort((seq_key_off, seq_key_row))
    seq_of = np.empty(len(seq_order), dtype=np.int64)
    seq_of[seq_order] = np.arange(len(seq_order))

    seq = np.concatenate([seq_of[: len(full_rows)], seq_of[len(full_rows) + item_bin] if len(item_bin) else np.empty(0, np.int64)])
    pos = np.concatenate([np.zeros(len(full_rows), np.int64), item_pos])
    doc_row = np.concatenate([full_rows, item_rows])
    doc_off = np.concatenate([full_off, item_off])
    length = np.concatenate([np.full(len(full_rows), seq_len, np.int64), item_len])
    o = np.lexsort((pos, seq))
    return Pieces(seq=seq[o], pos=pos[o], doc_row=doc_row[o], doc_offset=doc_off[o], length=length[o],
                  n_sequences=len(seq_order))


def pack(lengths: np.ndarray, seq_len: int, algorithm: str) -> Pieces:
    if algorithm == "concat":
        return pack_concat(lengths, seq_len)
    if algorithm == "best_fit":
        return pack_best_fit(lengths, seq_len)
    raise ValueError(f"unknown packing {algorithm!r}; choose one of {PACKING_ALGORITHMS}")


# Tokens per step of `chunks`: the int64 index arrays of one step are 8 bytes a token (~8 MB each here).
# Why steps at all: a shard's whole index is 8 bytes per token per array, several arrays at once
# (a 15M-token shard of the 10^5-event quickstart: ~0.5 GB of indexes for ~45 MB of output), which
# set the peak memory of the process writing it; per step the work is the same.
GATHER_STEP_TOKENS = 1 << 20


def gather_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of `arange(s, s+l)` for every (s, l), vectorized.

    Built as the running sum of steps (1 inside a piece, a jump where the next piece
    starts): one fresh array and one pass, where `repeat(...) + arange(...)` filled two
    token-sized arrays and added them (the gather is per token, so this is the cost that
    grows with the data: 2.4x less CPU on 6M tokens in 30k pieces)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    keep = lengths > 0
    if not keep.all():
        starts, lengths = starts[keep], lengths[keep]
    if len(lengths) == 0:
        return np.empty(0, np.int64)
    steps = np.ones(int(lengths.sum()), dtype=np.int64)
    first = np.cumsum(lengths) - lengths  # where each piece begins in the output
    steps[0] = starts[0]
    steps[first[1:]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    return np.cumsum(steps, out=steps)


def chunks(lengths: np.ndarray, step: int | None = None) -> list[slice]:
    """Consecutive slices of `lengths` of at most `step` (default GATHER_STEP_TOKENS) tokens each; an item
    longer than that is a slice of its own."""
    step = step or GATHER_STEP_TOKENS
    ends = np.cumsum(lengths)
    out, start, n = [], 0, len(lengths)
    while start < n:
        stop = int(np.searchsorted(ends, ends[start] - lengths[start] + step, side="right"))
        stop = max(stop, start + 1)
        out.append(slice(start, stop))
        start = stop
    return out


def gather(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """`values[gather_index(starts, lengths)]`, built in steps (`chunks`) so the index never spans the shard."""
    out = np.empty(int(lengths.sum()), dtype=values.dtype)
    at = 0
    for sl in chunks(lengths):
        part = values[gather_index(starts[sl], lengths[sl])]
        out[at:at + len(part)] = part
        at += len(part)
    return out


# Mean tokens per piece from which `materialize` copies piece by piece (a slice assignment each) instead
# of through per-token index arrays. Measured on one shard (2.7M tokens): pieces of ~330 tokens copy in
# 0.008 s by slices vs 0.037 s by index (0.054 in a fresh worker, whose index arrays are fresh pages);
# a slice costs ~1 us, an indexed token ~14 ns, so below ~70 tokens a piece the index arrays win.
SLICE_COPY_MIN_MEAN = 64


def _copy_by_slices(tokens: np.ndarray, mask: np.ndarray, pieces: Pieces, doc_start: np.ndarray, values: np.ndarray,
                    mask_start: np.ndarray, mask_values: np.ndarray, seq_len: int) -> None:
    """Each piece's tokens and mask copied as one slice: no per-token memory beyond the output."""
    dst = (pieces.seq * seq_len + pieces.pos).tolist()
    src = np.asarray(doc_start, dtype=np.int64)[pieces.doc_row] + pieces.doc_offset
    msrc = np.asarray(mask_start, dtype=np.int64)[pieces.doc_row] + pieces.doc_offset
    # a slice past the end is shorter than its piece (numpy would broadcast one of length 1 silently)
    if len(src) and (int((src + pieces.length).max()) > len(values) or int((msrc + pieces.length).max()) > len(mask_values)
                     or int(min(src.min(), msrc.min())) < 0):
        raise IndexError("a document's tokens lie outside the token buffer (corrupt encoded rows)")
    for d, s, m, ln in zip(dst, src.tolist(), msrc.tolist(), pieces.length.tolist()):
        tokens[d:d + ln] = values[s:s + ln]
        mask[d:d + ln] = mask_values[m:m + ln]


def _copy_by_index(tokens: np.ndarray, mask: np.ndarray, pieces: Pieces, doc_start: np.ndarray, values: np.ndarray,
                   mask_start: np.ndarray, mask_values: np.ndarray, seq_len: int) -> None:
    """Tokens and masks copied through per-token index arrays, built in steps (`chunks`): cheaper than a
    Python slice per piece when pieces are short."""
    same_offsets = mask_start is doc_start or np.array_equal(mask_start, doc_start)
    for sl in chunks(pieces.length):  # pieces never overlap: steps give the same arrays as one pass
        ln, row, off = pieces.length[sl], pieces.doc_row[sl], pieces.doc_offset[sl]
        dst = gather_index(pieces.seq[sl] * seq_len + pieces.pos[sl], ln)
        src = gather_index(doc_start[row] + off, ln)
        tokens[dst] = values[src]
        mask[dst] = mask_values[src if same_offsets else gather_index(mask_start[row] + off, ln)]


def materialize(pieces: Pieces, doc_start: np.ndarray, values: np.ndarray, mask_values: np.ndarray,
                seq_len: int, pad_id: int, dtype: np.dtype, mask_start: np.ndarray | None = None,
                doc_len: np.ndarray | None = None) -> Packed:
    """Copy tokens and masks into `[n, seq_len]` arrays and build the segment index.

    Document `r` is `values[doc_start[r] : doc_start[r] + doc_len[r]]` (its mask
    at `mask_start[r]` in `mask_values`); with `doc_len` omitted, `doc_start` is
    cumulative (n+1 entries). Starts need not be increasing, so the writer can
    pack in shuffle order without first copying the token buffer into it.

    Padding (the tail of a sequence no piece covers) gets `pad_id`, loss 0 and a
    segment of its own with document row -1, so `cu_seqlens` always ends at
    `seq_len` and a trainer never attends from a real token into padding.
    """
    if doc_len is None:
        doc_len = np.diff(doc_start)
        doc_start = doc_start[:-1]
    if mask_start is None:
        mask_start = doc_start
    n = pieces.n_sequences
    tokens = np.full(n * seq_len, pad_id, dtype=dtype)
    mask = np.zeros(n * seq_len, dtype=np.uint8)
    if len(pieces.length) and pieces.length.sum() >= SLICE_COPY_MIN_MEAN * len(pieces.length):
        _copy_by_slices(tokens, mask, pieces, doc_start, values, mask_start, mask_values, seq_len)
    else:
        _copy_by_index(tokens, mask, pieces, doc_start, values, mask_start, mask_values, seq_len)

    # padding segments: where a sequence's last piece ends before seq_len
    used = np.zeros(n, dtype=np.int64)
    np.add.at(used, pieces.seq, pieces.length)
    pad_seq = np.nonzero(used < seq_len)[0]
    seg_seq = np.concatenate([pieces.seq, pad_seq])
    seg_start = np.concatenate([pieces.pos, used[pad_seq]])
    seg_row = np.concatenate([pieces.doc_row, np.full(len(pad_seq), -1, np.int64)])
    seg_off = np.concatenate([pieces.doc_offset, np.zeros(len(pad_seq), np.int64)])
    o = np.lexsort((seg_start, seg_seq))
    segments = np.stack([seg_start[o], seg_row[o], seg_off[o]], axis=1).astype(np.int64) if len(o) else np.zeros((0, 3), np.int64)
    seq_index = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(seg_seq, minlength=n), out=seq_index[1:])

    lengths = doc_len
    pieces_per_doc = np.bincount(pieces.doc_row, minlength=len(lengths)) if len(lengths) else np.zeros(0, np.int64)
    stats = {
        "sequences": int(n),
        "tokens": int(pieces.length.sum()),
        "padding_tokens": int(n * seq_len - pieces.length.sum()),
        "loss_tokens": int(mask.sum()),
        "documents": int((lengths > 0).sum()),
        "split_documents": int(((pieces_per_doc > 1) & (lengths <= seq_len)).sum()),
        "long_documents": int((lengths > seq_len).sum()),
    }
    return Packed(tokens.reshape(n, seq_len), mask.reshape(n, seq_len), segments, seq_index, stats)
