"""Trainer-side reader of packed datasets: numpy memory maps, O(1) access to sequence i.

Why numpy-only at the core: a GPU trainer should be able to read the data with
nothing but numpy (no datakit engine, no Arrow), straight from the page cache;
torch is an optional thin adapter (`torch_iterable`), imported only when called.

    ds = PackedDataset("out/packed")
    len(ds); ds[i]  # input_ids, labels, loss_mask, position_ids, cu_seqlens
    it = ds.iterator(rank=r, world_size=w, seed=0, epoch=e)
    for sample in it: ...; state = it.state_dict()
    it = ds.iterator_from_state(state)  # resumes exactly after the last sample yielded

Data-parallel split: the epoch order is a permutation of all sequence indices
keyed by a splitmix64 hash of (index, seed, epoch) — pure integer arithmetic,
so it is the same on every machine and numpy version — and rank r takes
positions r, r+w, r+2w, ... of it. Ranks are disjoint and together complete
(`drop_last=True` trims the order to a multiple of world_size so every rank
runs the same number of steps).
"""
from __future__ import annotations

import bisect
import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

import numpy as np

IGNORE_INDEX = -100  # the label value PyTorch's cross-entropy ignores
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


class DatasetError(Exception):
    """The folder is not a complete packed dataset (no manifest, wrong layout, missing shard)."""


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer: a bijection on uint64 (so sort keys never tie)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The order in which one epoch visits sequences 0..n-1 (all ranks together)."""
    idx = np.arange(n, dtype=np.uint64)
    if not shuffle:
        return idx.astype(np.int64)
    with np.errstate(over="ignore"):
        salt = splitmix64(np.array([(int(seed) & 0xFFFFFFFF) << 32 | (int(epoch) & 0xFFFFFFFF)], dtype=np.uint64))[0]
        keys = splitmix64(idx ^ salt)
    return np.argsort(keys, kind="stable").astype(np.int64)


class PackedDataset:
    """Random access to a `packed` dataset folder (written by the tokenize stage)."""

    def __init__(self, path: str | Path, verify: bool = False) -> None:
        self.path = Path(path)
        mf = self.path / "manifest.json"
        if not mf.is_file():
            raise DatasetError(f"{self.path}: no manifest.json (not a finished packed dataset)")
        self.manifest: dict[str, Any] = json.loads(mf.read_text())
        if self.manifest.get("format") != "packed":
            raise DatasetError(f"{self.path}: format is {self.manifest.get('format')!r}, expected 'packed'")
        self.seq_len = int(self.manifest["seq_len"])
        self.dtype = np.dtype(self.manifest["dtype"])
        self.shards = sorted(self.manifest["shards"], key=lambda s: s["shard"])
        counts = np.array([int(s.get("sequences", 0)) for s in self.shards], dtype=np.int64)
        self._cum = np.concatenate([[0], np.cumsum(counts)])
        self._cum_list: list[int] = self._cum.tolist()
        self._n = int(self._cum[-1])
        self._arange = np.arange(self.seq_len, dtype=np.int64)
        self._open: dict[int, dict[str, np.ndarray]] = {}
        for s in self.shards:  # always: every file present with its recorded size (one stat each)
            sizes = s.get("bytes") or {}
            for f in s["files"]:
                if not (self.path / f).is_file():
                    raise DatasetError(f"{self.path}: shard file {f} is missing")
                if f in sizes and (self.path / f).stat().st_size != sizes[f]:
                    raise DatasetError(f"{self.path}: shard file {f} has {(self.path / f).stat().st_size} bytes, "
                                       f"the manifest says {sizes[f]} (interrupted rewrite or changed file)")
        if verify:
            self.verify()

    # -- files ------------------------------------------------------------------------
    def verify(self) -> None:
        """Check every data file against the manifest's sha256 (slow: reads everything)."""
        for s in self.shards:
            for f, want in s.get("sha256", {}).items():
                h = hashlib.sha256()
                with open(self.path / f, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 22), b""):
                        h.update(chunk)
                if h.hexdigest() != want:
                    raise DatasetError(f"{self.path}: checksum mismatch in {f}")

    def _arrays(self, k: int) -> dict[str, np.ndarray]:
        a = self._open.get(k)
        if a is None:
            names = self.shards[k]["arrays"]
            # np.asarray drops the np.memmap subclass (same mapped memory): slicing a
            # plain ndarray is several times cheaper, which matters per sample
            a = {key: np.asarray(np.load(self.path / names[key], mmap_mode="r", allow_pickle=False))
                 for key in ("tokens", "loss_mask", "segments", "seq_index")}
            self._open[k] = a
        return a

    @cached_property
    def fingerprint(self) -> str:
        """Identity of the data (its files' checksums): a resume state refuses other data."""
        h = hashlib.sha256()
        for s in self.shards:
            for f in sorted(s.get("sha256", {})):
                h.update(f"{f}={s['sha256'][f]};".encode())
        return h.hexdigest()[:16]

    # -- random access ----------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def locate(self, i: int) -> tuple[int, int]:
        """(shard number, row in shard) of global sequence i."""
        n = self._n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sequence {i} out of range (dataset has {n})")
        k = bisect.bisect_right(self._cum_list, i) - 1
        return k, i - self._cum_list[k]

    def raw(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, loss_mask, segments) of sequence i as read-only views of the mapped files (zero copy)."""
        k, r = self.locate(i)
        a = self._open.get(k) or self._arrays(k)
        lo, hi = a["seq_index"][r : r + 2].tolist()
        return a["tokens"][r], a["loss_mask"][r], a["segments"][lo:hi]

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        """One training sample.

        input_ids int64 [seq_len]; loss_mask uint8 (0 on padding and untrained
        tokens); labels int64 = input_ids, IGNORE_INDEX where loss_mask is 0 and
        at the first token of every segment after the first (HF convention: the
        model shifts labels, so this stops predictions across a document
        boundary); position_ids restart at 0 in every segment; cu_seqlens int32
        = segment starts + [seq_len] (padding is its own final segment).
        """
        tokens, mask, segs = self.raw(i)
        input_ids = tokens.astype(np.int64)
        loss_mask = mask.copy()
        starts = segs[:, 0]
        cu = np.empty(len(starts) + 1, dtype=np.int32)
        cu[:-1] = starts
        cu[-1] = self.seq_len
        labels = np.where(loss_mask, input_ids, IGNORE_INDEX)
        labels[starts[1:]] = IGNORE_INDEX
        position_ids = self._arange - np.repeat(starts, np.diff(cu))
        return {"input_ids": input_ids, "labels": labels, "loss_mask": loss_mask,
                "position_ids": position_ids, "cu_seqlens": cu}

    def get_batch(self, indices: np.ndarray | list[int], raw: bool = False) -> dict[str, np.ndarray]:
        """Many samples at once, vectorized (the fast path for a trainer's collate step).

        raw=True: `tokens` [b, seq_len] in the stored dtype and `loss_mask`
        [b, seq_len] only (one fancy-index read per shard). Otherwise also
        int64 `input_ids`, `labels`, `position_ids` [b, seq_len] as in
        `__getitem__`, and `cu_seqlens` int32 over the *flattened* batch
        (b * seq_len tokens), the form varlen attention kernels take.
        """
        idx = np.asarray(indices, dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= self._n):
            raise IndexError(f"sequence index out of range (dataset has {self._n})")
        shard = np.searchsorted(self._cum, idx, side="right") - 1
        b, L = len(idx), self.seq_len
        tokens = np.empty((b, L), dtype=self.dtype)
        mask = np.empty((b, L), dtype=np.uint8)
        for k in np.unique(shard).tolist():
            sel = np.nonzero(shard == k)[0]
            rows = idx[sel] - self._cum[k]
            a = self._arrays(k)
            tokens[sel] = a["tokens"][rows]
            mask[sel] = a["loss_mask"][rows]
        if raw:
            return {"tokens": tokens, "loss_mask": mask}
        starts = []
        for j, (k, i) in enumerate(zip(shard.tolist(), idx.tolist())):
            a = self._arrays(k)
            r = i - self._cum_list[k]
            lo, hi = a["seq_index"][r : r + 2].tolist()
            starts.append(a["segments"][lo:hi, 0] + j * L)
        flat_starts = np.concatenate(starts) if starts else np.zeros(0, np.int64)
        cu = np.append(flat_starts, b * L).astype(np.int32)
        input_ids = tokens.astype(np.int64)
        labels = np.where(mask, input_ids, IGNORE_INDEX)
        labels.reshape(-1)[flat_starts[flat_starts % L != 0]] = IGNORE_INDEX
        position_ids = (np.arange(b * L, dtype=np.int64) - np.repeat(flat_starts, np.diff(cu))).reshape(b, L)
        return {"input_ids": input_ids, "labels": labels, "loss_mask": mask,
                "position_ids": position_ids, "cu_seqlens": cu}

    @cached_property
    def _docs(self) -> list[list[str]]:
        import pyarrow.parquet as pq

        return [pq.read_table(self.path / s["arrays"]["docs"], columns=["doc_id"]).column(0).to_pylist()
                for s in self.shards]

    def segments(self, i: int) -> list[dict[str, Any]]:
        """Sequence i's segments: start, end, doc_id (None = padding), offset of the piece in its document."""
        k, _ = self.locate(i)
        _, _, segs = self.raw(i)
        ends = list(segs[1:, 0]) + [self.seq_len]
        return [{"start": int(s), "end": int(e), "doc_id": self._docs[k][int(row)] if row >= 0 else None,
                 "doc_offset": int(off)} for (s, row, off), e in zip(segs.tolist(), ends)]

    # -- data-parallel iteration ------------------------------------------------------
    def iterator(self, rank: int = 0, world_size: int = 1, seed: int = 0, epoch: int = 0,
                 shuffle: bool = True, drop_last: bool = False) -> "PackedIterator":
        return PackedIterator(self, rank, world_size, seed, epoch, shuffle, drop_last)

    def iterator_from_state(self, state: dict[str, Any]) -> "PackedIterator":
        """Resume exactly where a `PackedIterator.state_dict()` left off."""
        if state.get("dataset") != self.fingerprint:
            raise DatasetError("resume state belongs to a different dataset (fingerprint differs)")
        it = self.iterator(state["rank"], state["world_size"], state["seed"], state["epoch"],
                           state["shuffle"], state["drop_last"])
        it.position = int(state["position"])
        return it


class PackedIterator:
    """One rank's deterministic slice of one epoch; resumable via `state_dict()`."""

    def __init__(self, ds: PackedDataset, rank: int, world_size: int, seed: int, epoch: int,
                 shuffle: bool = True, drop_last: bool = False) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.ds, self.rank, self.world_size = ds, rank, world_size
        self.seed, self.epoch, self.shuffle, self.drop_last = seed, epoch, shuffle, drop_last
        self.position = 0  # samples of this rank already yielded

    @cached_property
    def indices(self) -> np.ndarray:
        """Global sequence indices this rank visits this epoch, in order."""
        order = epoch_order(len(self.ds), self.seed, self.epoch, self.shuffle)
        if self.drop_last:
            order = order[: len(order) - len(order) % self.world_size]
        return order[self.rank :: self.world_size]

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.position >= len(self.indices):
            raise StopIteration
        i = int(self.indices[self.position])
        self.position += 1
        sample = self.ds[i]
        sample["index"] = np.int64(i)
        return sample

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue after the last yielded sample (JSON-able)."""
        return {"dataset": self.ds.fingerprint, "rank": self.rank, "world_size": self.world_size,
                "seed": self.seed, "epoch": self.epoch, "shuffle": self.shuffle,
                "drop_last": self.drop_last, "position": self.position}


def torch_iterable(ds: PackedDataset, rank: int = 0, world_size: int = 1, seed: int = 0, epoch: int = 0,
                   shuffle: bool = True, drop_last: bool = False):
    """A `torch.utils.data.IterableDataset` over one rank's slice (needs torch; not a dependency).

    With DataLoader workers, worker w of W yields every W-th sample of the
    rank's slice, so the union is still the rank's slice exactly. Resume via
    `.iterator.state_dict()` is exact with `num_workers=0`.
    """
    try:
        import torch
        from torch.utils.data import IterableDataset, get_worker_info
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("torch_iterable needs PyTorch (pip install torch); "
                          "PackedDataset itself works with numpy only") from None

    class _TorchPacked(IterableDataset):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.iterator = ds.iterator(rank, world_size, seed, epoch, shuffle, drop_last)

        def __iter__(self):
            info = get_worker_info()
            wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
            it = self.iterator
            while it.position < len(it.indices):
                take = (it.position % nw) == wid
                if take:
                    sample = next(it)
                    yield {k: torch.from_numpy(np.asarray(v)) for k, v in sample.items()}
                else:
                    it.position += 1

    return _TorchPacked()
