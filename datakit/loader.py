"""Trainer-side reader of packed datasets: numpy memory maps, O(1) access to sequence i.

Why numpy-only at the core: a GPU trainer should be able to read the data with
nothing but numpy (no datakit engine, no Arrow), straight from the page cache;
torch is an optional thin adapter (`torch_iterable`), imported only when called.

    ds = PackedDataset("out/packed")
    len(ds); ds[i]  # input_ids, labels, loss_mask, position_ids, cu_seqlens (fixed shapes)
    DataLoader(ds, batch_size=8, num_workers=2, collate_fn=collate)  # + flattened varlen cu_seqlens
    loader = torch_loader(ds, batch_size=8, num_workers=2, rank=r, world_size=w)  # exact resume
    state = loader.state_dict(); ...; loader.load_state_dict(state)
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
import stat
import warnings
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from datakit.io.fs import InputError

IGNORE_INDEX = -100  # the label value PyTorch's cross-entropy ignores


class DatasetError(InputError):
    """The folder is not a complete packed dataset (no manifest, wrong layout, missing shard): an input
    error, so every command says it in one line and exits 2."""


def local_folder(path: str | Path) -> Path:
    """`path` as a local folder; a `DatasetError` for an object-store URL.

    Why: the arrays are memory-mapped, which needs local files, and `Path("s3://b/x")` silently became
    the local path `s3:/b/x` ("no manifest.json", or a traceback in the contamination check; found in
    review)."""
    text = str(path)
    if "://" in text and not text.startswith("file://"):
        raise DatasetError(f"{text}: a packed dataset is read from a local folder (its arrays are memory-mapped); "
                           "copy it first, e.g. `aws s3 sync` or fsspec's `get(..., recursive=True)`")
    # absolute: a dataset opened by a relative path kept reading from it after a chdir (its shards are
    # mapped on first use), which then named the wrong folder (found in review)
    return Path(text[len("file://"):] if text.startswith("file://") else text).absolute()


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


ARRAYS = ("tokens", "loss_mask", "segments", "seq_index")  # each shard's arrays (docs/packed_format.md)
TOKEN_DTYPES = ("uint16", "int32")  # what the writers store token ids as (tokenize.writers.token_dtype)
# what this reader understands (io/sinks.FORMAT_VERSION, not imported: the loader needs numpy only; a test
# holds the two equal)
READS = {"format_version": 2, "schema": "packed_dataset.v1"}
LAYOUTS = ("datakit.packed.v1", "snapshots")  # one run's dataset, or an append-mode dataset's union


def check_manifest(m: Any, path: Path | str) -> None:
    """A `DatasetError` naming what is wrong when `m` is not a packed manifest this reader understands.

    Why here and not only in the writer: a manifest edited by hand, copied from another dataset or
    written by another datakit release made the loader yield fewer sequences without a word, or
    fail later with a KeyError or a numpy error (found in review). The shapes of the arrays are
    checked when a shard is first opened (`PackedDataset._arrays`)."""
    if not isinstance(m, dict):
        raise DatasetError(f"{path}: manifest.json is not a JSON object")
    if m.get("format") != "packed":
        raise DatasetError(f"{path}: format is {m.get('format')!r}, expected 'packed'")
    for key, want in READS.items():
        if m.get(key) != want:
            raise DatasetError(f"{path}: manifest {key} is {m.get(key)!r}; this datakit reads {want!r} "
                               "(a dataset written by another release: read it with that release, or rewrite it)")
    if m.get("layout") not in LAYOUTS:
        raise DatasetError(f"{path}: manifest layout is {m.get('layout')!r}; this datakit reads {', '.join(LAYOUTS)}")
    missing = [k for k in ("seq_len", "dtype", "shards") if k not in m]
    if missing:
        raise DatasetError(f"{path}: manifest has no {', '.join(missing)}")
    if not isinstance(m["seq_len"], int) or m["seq_len"] <= 0 or not isinstance(m["shards"], list):
        raise DatasetError(f"{path}: manifest seq_len must be a positive integer and shards a list")
    if m["dtype"] not in TOKEN_DTYPES:
        raise DatasetError(f"{path}: manifest dtype is {m['dtype']!r}; token arrays are {' or '.join(TOKEN_DTYPES)}")
    for i, sh in enumerate(m["shards"]):
        # a hand edit was a ValueError, AttributeError or TypeError from deep inside (found in review)
        if not isinstance(sh, dict):
            raise DatasetError(f"{path}: manifest shard entry {i} is not an object")
        need = [k for k in ("shard", "files", "arrays", "sequences") if k not in sh]
        need += [f"arrays.{a}" for a in ARRAYS if a not in (sh.get("arrays") or {})]
        if need:
            raise DatasetError(f"{path}: manifest shard {sh.get('shard', '?')} has no {', '.join(need)}")
        if not (isinstance(sh["shard"], int) and isinstance(sh["sequences"], int) and sh["sequences"] >= 0
                and isinstance(sh["files"], list) and all(isinstance(f, str) for f in sh["files"])
                and isinstance(sh["arrays"], dict) and all(isinstance(f, str) for f in sh["arrays"].values())):
            raise DatasetError(f"{path}: manifest shard {sh['shard']!r} is malformed (shard and sequences are "
                               "integers, files a list of names, arrays an object of names)")
    numbers = [sh["shard"] for sh in m["shards"]]
    if len(set(numbers)) != len(numbers):
        raise DatasetError(f"{path}: manifest lists shard {next(n for n in numbers if numbers.count(n) > 1)} twice")
    total = (m.get("totals") or {}).get("sequences")
    counted = sum(int(sh["sequences"]) for sh in m["shards"])
    if total is not None and total != counted:
        raise DatasetError(f"{path}: the manifest's shards hold {counted} sequences, its totals say {total} "
                           "(a shard entry removed or changed)")


class PackedDataset:
    """Random access to a `packed` dataset folder (written by the tokenize stage)."""

    def __init__(self, path: str | Path, verify: bool = False) -> None:
        self.path = local_folder(path)
        mf = self.path / "manifest.json"
        if not mf.is_file():
            raise DatasetError(f"{self.path}: no manifest.json (not a finished packed dataset)")
        try:
            self.manifest: dict[str, Any] = json.loads(mf.read_text())
        except ValueError as e:
            raise DatasetError(f"{self.path}: manifest.json is not valid JSON ({e})") from None
        check_manifest(self.manifest, self.path)
        self.seq_len = int(self.manifest["seq_len"])
        self.dtype = np.dtype(self.manifest["dtype"])
        self.shards = sorted(self.manifest["shards"], key=lambda s: s["shard"])
        counts = np.array([int(s["sequences"]) for s in self.shards], dtype=np.int64)
        self._cum = np.concatenate([[0], np.cumsum(counts)])
        self._cum_list: list[int] = self._cum.tolist()
        self._n = int(self._cum[-1])
        self._arange = np.arange(self.seq_len, dtype=np.int64)
        self._open: dict[int, dict[str, np.ndarray]] = {}
        self._stamps: dict[str, tuple[int, int, int]] = {}  # each file as it was at open (`_check_unchanged`)
        for s in self.shards:  # always: every file present with its recorded size (one stat each)
            sizes = s.get("bytes") or {}
            for f in s["files"]:
                try:
                    st = (self.path / f).stat()
                except OSError:
                    st = None
                if st is None or not stat.S_ISREG(st.st_mode):
                    raise DatasetError(f"{self.path}: shard file {f} is missing")
                if f in sizes and st.st_size != sizes[f]:
                    raise DatasetError(f"{self.path}: shard file {f} has {st.st_size} bytes, "
                                       f"the manifest says {sizes[f]} (interrupted rewrite or changed file)")
                self._stamps[f] = (st.st_ino, st.st_size, st.st_mtime_ns)
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
        from datakit.io.verify import DatasetVerifyError, verify_tokenizer_file

        try:
            verify_tokenizer_file(str(self.path), self.manifest)
        except DatasetVerifyError as e:
            raise DatasetError(str(e)) from None

    def _arrays(self, k: int) -> dict[str, np.ndarray]:
        a = self._open.get(k)
        if a is None:
            names = self.shards[k]["arrays"]
            self._check_unchanged([names[key] for key in ARRAYS])
            # np.asarray drops the np.memmap subclass (same mapped memory): slicing a
            # plain ndarray is several times cheaper, which matters per sample
            a = {}
            for key in ARRAYS:
                try:
                    a[key] = np.asarray(np.load(self.path / names[key], mmap_mode="r", allow_pickle=False))
                except (ValueError, OSError, EOFError) as e:  # a damaged header: not an array file any more
                    raise DatasetError(f"{self.path}: {names[key]} is not a readable array file "
                                       f"({type(e).__name__}: {str(e)[:120]})") from None
            want = (int(self.shards[k]["sequences"]), self.seq_len)
            if a["tokens"].dtype != self.dtype:  # the manifest's dtype sizes get_batch's arrays
                raise DatasetError(f"{self.path}: {names['tokens']} holds {a['tokens'].dtype} ids, the manifest "
                                   f"says {self.dtype} (changed manifest or file)")
            si, segs = a["seq_index"], a["segments"]
            if segs.ndim != 2 or segs.shape[1] != 3 or (len(si) and int(si[-1]) != len(segs)):
                raise DatasetError(f"{self.path}: {names['segments']} holds {segs.shape} entries, its seq_index "
                                   f"says {int(si[-1]) if len(si) else '?'} rows of 3 (changed file)")
            for key in ("tokens", "loss_mask"):
                if a[key].shape != want:
                    raise DatasetError(f"{self.path}: {names[key]} holds {a[key].shape[0]} sequences of "
                                       f"{a[key].shape[1] if a[key].ndim == 2 else '?'} tokens, the manifest says "
                                       f"{want[0]} of {want[1]} (changed manifest or file)")
            if len(a["seq_index"]) != want[0] + 1:
                raise DatasetError(f"{self.path}: {names['seq_index']} indexes {len(a['seq_index']) - 1} sequences, "
                                   f"the manifest says {want[0]}")
            self._open[k] = a
        return a

    def _check_unchanged(self, files: list[str]) -> None:
        """A `DatasetError` when one of `files` was replaced or changed since the dataset was opened.

        Why before a shard is first mapped: shards are mapped when first read, and a rerun into the
        folder replaces them. A DataLoader's second epoch after a rerun read every row of the new run
        under the old manifest and fingerprint (a resume state was still accepted), and one batch mixed
        shards of both runs (found in review). Per file, not the manifest: an append-mode dataset's
        union manifest is rewritten by every nightly append while the shards a reader opened stay
        as they were. A shard mapped before keeps its old bytes (the mapping holds the replaced file),
        so only new mappings need the check: one stat per file."""
        for f in files:
            try:
                st = (self.path / f).stat()
                now = (st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                now = None
            if f in self._stamps and now != self._stamps[f]:
                raise DatasetError(f"{self.path}: {f} was {'removed' if now is None else 'replaced'} since the "
                                   "dataset was opened (a rerun into the folder?); open it again")

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
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"sequence index must be an integer (got {i!r})")
        n = self._n
        given = i
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sequence {given} out of range (dataset has {n})")  # the index asked for (review)
        k = bisect.bisect_right(self._cum_list, i) - 1
        return k, i - self._cum_list[k]

    def raw(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, loss_mask, segments) of sequence i as read-only views of the mapped files (zero copy)."""
        k, r = self.locate(i)
        a = self._open.get(k) or self._arrays(k)
        lo, hi = a["seq_index"][r : r + 2].tolist()
        segs = a["segments"][lo:hi]
        self._check_segments(k, r, lo, hi, len(a["segments"]), segs[:, 0] if len(segs) else segs)
        return a["tokens"][r], a["loss_mask"][r], segs

    def _check_segments(self, k: int, r: int, lo: int, hi: int, total: int, starts: np.ndarray) -> None:
        """One sequence's segment index is possible: its rows exist, its starts lie in the sequence and
        increase. Found in review: same-size edits of `segments`/`seq_index` gave raw numpy errors
        ("negative dimensions are not allowed") and `datakit inspect` printed a segment `[100000:512)`;
        `verify=True` catches them too, but reads every byte."""
        ok = 0 <= lo < hi <= total
        if ok and len(starts):
            ok = bool(starts[0] == 0 and (starts < self.seq_len).all() and (len(starts) == 1 or (np.diff(starts) > 0).all()))
        if not ok:
            raise DatasetError(f"{self.path}: shard {k}, sequence {r}: its segment index is damaged (rows {lo}:{hi} "
                               f"of {total}); the files changed after they were written (`datakit inspect --verify`)")

    @cached_property
    def max_segments(self) -> int:
        """The most segments any sequence of the dataset has (fixes the length of a sample's cu_seqlens).

        From the manifest's per-shard `max_segments`; a dataset written before it was recorded reads
        each shard's `seq_index` once, without keeping it mapped (mapping every shard kept 4 file
        descriptors per shard open in every process: 300 shards failed under a 1024 limit)."""
        recorded = [sh.get("max_segments") for sh in self.shards]
        if all(isinstance(m, int) for m in recorded):
            return max([1, *recorded])
        most = 1
        for k, sh in enumerate(self.shards):
            si = self._open[k]["seq_index"] if k in self._open else \
                np.load(self.path / sh["arrays"]["seq_index"], mmap_mode="r", allow_pickle=False)
            if len(si) > 1:
                most = max(most, int(np.diff(si).max()))
            del si  # an array mapped here is unmapped (its file closed) once no one holds it
        return most

    def __getstate__(self) -> dict[str, Any]:
        """What a DataLoader worker started by spawn or forkserver gets: the manifest, never the mapped
        arrays (pickling them copied every shard read so far into each worker: 1.37 MB for a 1.35 MB
        dataset after one sample, found in review). Each process maps the files itself."""
        state = dict(self.__dict__)
        state["_open"] = {}
        return state

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        """One training sample; every field has the same shape for every i (so torch's default collate
        batches them: `DataLoader(ds, batch_size=B, num_workers=W)` works as it is).

        input_ids int64 [seq_len]; loss_mask uint8 (0 on padding and untrained
        tokens); labels int64 = input_ids, IGNORE_INDEX where loss_mask is 0 and
        at the first token of every segment after the first (HF convention: the
        model shifts labels, so this stops predictions across a document
        boundary); position_ids restart at 0 in every segment (what HF
        transformers derives flash-attention varlen boundaries from; it keeps
        documents apart by them only with the model's KV cache off,
        `use_cache=False`, or flash_attention_2: docs/packed_format.md);
        cu_seqlens int32 [max_segments + 1] = segment starts + [seq_len]
        (padding is its own final segment), then seq_len repeated up to the
        fixed length (zero-length segments, which varlen kernels accept);
        num_segments = the real segment count; index = i. `collate` turns a
        list of samples into one batch with the flattened, exact cu_seqlens.
        """
        tokens, mask, segs = self.raw(i)
        input_ids = tokens.astype(np.int64)
        loss_mask = mask.copy()
        starts = segs[:, 0]
        n = len(starts)
        cu = np.full(self.max_segments + 1, self.seq_len, dtype=np.int32)
        cu[:n] = starts
        labels = np.where(loss_mask, input_ids, IGNORE_INDEX)
        labels[starts[1:]] = IGNORE_INDEX
        position_ids = self._arange - np.repeat(starts, np.diff(cu[: n + 1]))
        return {"input_ids": input_ids, "labels": labels, "loss_mask": loss_mask,
                "position_ids": position_ids, "cu_seqlens": cu, "num_segments": np.int64(n),
                "index": np.int64(i if i >= 0 else i + self._n)}

    def get_batch(self, indices: np.ndarray | list[int], raw: bool = False) -> dict[str, np.ndarray]:
        """Many samples at once, vectorized (the fast path for a trainer's collate step).

        raw=True: `tokens` [b, seq_len] in the stored dtype and `loss_mask`
        [b, seq_len] only (one fancy-index read per shard). Otherwise also
        int64 `input_ids`, `labels`, `position_ids` [b, seq_len] as in
        `__getitem__`, and `cu_seqlens` int32 over the *flattened* batch
        (b * seq_len tokens), the form varlen attention kernels take.
        """
        asked = np.asarray(indices).reshape(-1)
        if asked.size and not (np.issubdtype(asked.dtype, np.integer) and asked.dtype != np.bool_):
            # found in review: [1.5] read row 1 (a float cast down), and booleans read rows 0 and 1
            raise TypeError(f"indices must be integers (got {asked.dtype})")
        given = asked.astype(np.int64)
        idx = np.where(given < 0, given + self._n, given)  # from the end, as `ds[-1]` and numpy (found in review)
        if len(idx) and (idx.min() < 0 or idx.max() >= self._n):
            bad = int(given[(idx < 0) | (idx >= self._n)][0])
            raise IndexError(f"sequence {bad} out of range (dataset has {self._n})")
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
            seg_starts = a["segments"][lo:hi, 0]
            self._check_segments(k, r, lo, hi, len(a["segments"]), seg_starts)
            starts.append(seg_starts + j * L)
        flat_starts = np.concatenate(starts) if starts else np.zeros(0, np.int64)
        cu = np.append(flat_starts, b * L).astype(np.int32)
        input_ids = tokens.astype(np.int64)
        labels = np.where(mask, input_ids, IGNORE_INDEX)
        labels.reshape(-1)[flat_starts[flat_starts % L != 0]] = IGNORE_INDEX
        position_ids = (np.arange(b * L, dtype=np.int64) - np.repeat(flat_starts, np.diff(cu))).reshape(b, L)
        return {"input_ids": input_ids, "labels": labels, "loss_mask": mask,
                "position_ids": position_ids, "cu_seqlens": cu}

    @cached_property
    def _doc_lists(self) -> dict[int, list[str]]:
        return {}

    def _docs(self, k: int) -> list[str]:
        """Shard k's document ids (its `docs` table), read on first use: one damaged shard's table fails
        only that shard's lookups, in one line (found in review: a damaged footer was a pyarrow OSError
        traceback from `datakit inspect`, and broke every shard's segments, all being read at once)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if k not in self._doc_lists:
            name = self.shards[k]["arrays"]["docs"]
            self._check_unchanged([name])
            try:
                self._doc_lists[k] = pq.read_table(self.path / name, columns=["doc_id"]).column(0).to_pylist()
            except (OSError, pa.ArrowException) as e:
                raise DatasetError(f"{self.path}: {name} cannot be read ({type(e).__name__}: "
                                   f"{str(e).splitlines()[0][:160] if str(e) else ''}); the files changed after "
                                   "they were written (`datakit inspect --verify`)") from None
        return self._doc_lists[k]

    def segments(self, i: int) -> list[dict[str, Any]]:
        """Sequence i's segments: start, end, doc_id (None = padding), offset of the piece in its document."""
        k, r = self.locate(i)
        _, _, segs = self.raw(i)
        ends = list(segs[1:, 0]) + [self.seq_len]
        docs = self._docs(k)
        rows = segs[:, 1] if len(segs) else segs
        if len(rows) and int(rows.max()) >= len(docs):  # a same-size edit of the document rows (found in review)
            raise DatasetError(f"{self.path}: shard {k}, sequence {r}: a segment names document row "
                               f"{int(rows.max())} of {len(docs)}: its segment index is damaged; the files changed "
                               "after they were written (`datakit inspect --verify`)")
        return [{"start": int(s), "end": int(e), "doc_id": docs[int(row)] if row >= 0 else None,
                 "doc_offset": int(off)} for (s, row, off), e in zip(segs.tolist(), ends)]

    @cached_property
    def _repo_files(self) -> list[dict[int, list[dict[str, Any]]]]:
        import pyarrow.parquet as pq

        self._check_unchanged([s["arrays"]["repo_files"] for s in self.shards if s["arrays"].get("repo_files")])
        out: list[dict[int, list[dict[str, Any]]]] = []
        for s in self.shards:
            by_seq: dict[int, list[dict[str, Any]]] = {}
            name = s["arrays"].get("repo_files")
            if name:
                cols = ["sequence", "position", "path", "repo", "doc_id", "n_tokens"]
                for f in pq.read_table(self.path / name, columns=cols).to_pylist():
                    by_seq.setdefault(f.pop("sequence"), []).append(f)
            out.append(by_seq)
        return out

    def files(self, i: int) -> list[dict[str, Any]]:
        """Repository packing (`packing: repository`): the files whose `[file_sep]` header starts in
        sequence i, in order: position, path, repo, doc_id, n_tokens. [] for other packings."""
        k, r = self.locate(i)
        return sorted(self._repo_files[k].get(r, []), key=lambda f: f["position"])

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
        for name, value in (("rank", rank), ("world_size", world_size), ("seed", seed), ("epoch", epoch)):
            # found in review: seed=1.5 gave seed 1's order and True that of 1, and the state stored 1.5
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{name} must be an integer (got {value!r})")
        rank, world_size, seed, epoch = int(rank), int(world_size), int(seed), int(epoch)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        for name, value in (("seed", seed), ("epoch", epoch)):
            # the order mixes seed and epoch as 32-bit halves of one word (`epoch_order`): found in review,
            # seed 2**32 gave seed 0's order and -1 that of 2**32 - 1, without a word
            if not 0 <= int(value) < 1 << 32:
                raise ValueError(f"{name} {value} is not in [0, 2**32): reduce it first (e.g. {name} % 2**32)")
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


FIXED_FIELDS = ("input_ids", "labels", "loss_mask", "position_ids")


def collate_numpy(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch from `PackedDataset` samples: fixed fields stacked [B, seq_len], plus the document
    boundaries of the flattened batch (B * seq_len tokens) in the form flash-attention's varlen
    kernels take: `cu_seqlens` int32 (exact: no zero-length segments) and `max_seqlen` int."""
    if not samples:
        raise ValueError("collate needs at least one sample")
    out: dict[str, Any] = {k: np.stack([np.asarray(s[k]) for s in samples]) for k in FIXED_FIELDS}
    L = out["input_ids"].shape[1]
    parts = []
    for j, s in enumerate(samples):
        cu = np.asarray(s["cu_seqlens"])
        n = int(s["num_segments"]) if "num_segments" in s else int(np.searchsorted(cu, L))
        parts.append(cu[:n].astype(np.int64) + j * L)
    cu = np.append(np.concatenate(parts), len(samples) * L).astype(np.int32)
    out["cu_seqlens"] = cu
    out["max_seqlen"] = int(np.diff(cu).max())
    if all("index" in s for s in samples):
        out["index"] = np.array([int(s["index"]) for s in samples], dtype=np.int64)
    return out


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """`collate_numpy` as torch tensors (the `collate_fn` for a torch DataLoader over PackedDataset)."""
    import torch

    return {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in collate_numpy(
        [{k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in s.items()} for s in samples]).items()}


class PackedSampler:
    """The sampler of one rank for a torch DataLoader: the rank's slice of the epoch order
    (the same indices as `PackedDataset.iterator`). Deterministic, so a resumed loader can
    skip what was consumed; `set_epoch(e)` moves to another epoch's order."""

    def __init__(self, ds: PackedDataset, rank: int = 0, world_size: int = 1, seed: int = 0, epoch: int = 0,
                 shuffle: bool = True, drop_last: bool = False) -> None:
        self.ds, self.rank, self.world_size, self.seed = ds, rank, world_size, seed
        self.epoch, self.shuffle, self.drop_last = epoch, shuffle, drop_last
        self._check = PackedIterator(ds, rank, world_size, seed, epoch, shuffle, drop_last)  # validates rank

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self) -> np.ndarray:
        return PackedIterator(self.ds, self.rank, self.world_size, self.seed, self.epoch,
                              self.shuffle, self.drop_last).indices

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return len(self.indices())

    def identity(self) -> dict[str, Any]:
        return {"dataset": self.ds.fingerprint, "rank": self.rank, "world_size": self.world_size,
                "seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last}


def torch_loader(ds: PackedDataset, batch_size: int, num_workers: int = 0, rank: int = 0, world_size: int = 1,
                 seed: int = 0, epoch: int = 0, shuffle: bool = True, drop_last: bool = False, **kwargs: Any):
    """A torchdata `StatefulDataLoader` over one rank's slice, batched with `collate`.

    Why torchdata: with `num_workers > 0` the samples a worker has prefetched
    but the trainer has not consumed must not count as done; StatefulDataLoader
    snapshots the sampler and the workers at the batch the trainer last received,
    so `loader.state_dict()` after k batches resumes at batch k+1 exactly, for any
    number of workers (the same number on resume). The state also names the
    dataset and the rank's slice; loading it into a loader over other data or
    another slice is a `DatasetError`, never a silent repeat. `set_epoch(e)`
    before iterating moves to epoch e (its own order).
    """
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("torch_loader needs torchdata (pip install torchdata): its StatefulDataLoader "
                          "makes resume exact with workers") from None

    class PackedLoader(StatefulDataLoader):  # type: ignore[misc, valid-type]
        def set_epoch(self, e: int) -> None:
            self.sampler.set_epoch(e)

        def state_dict(self) -> dict[str, Any]:
            return {"datakit": {**self.sampler.identity(), "epoch": self.sampler.epoch,
                                "batch_size": self.batch_size, "num_workers": self.num_workers},
                    "loader": super().state_dict()}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            mine = {**self.sampler.identity(), "batch_size": self.batch_size, "num_workers": self.num_workers}
            theirs = dict(state.get("datakit") or {})
            diff = sorted(k for k in mine if theirs.get(k) != mine[k])
            if diff:
                raise DatasetError(f"resume state does not fit this loader (differs in: {', '.join(diff)})")
            self.sampler.set_epoch(int(theirs["epoch"]))
            super().load_state_dict(state["loader"])

    sampler = PackedSampler(ds, rank, world_size, seed, epoch, shuffle, drop_last)
    with warnings.catch_warnings():  # torchdata 0.11 calls a deprecated torch API on every construction
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return PackedLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                            collate_fn=kwargs.pop("collate_fn", collate), **kwargs)


class _SharedEpoch:
    """An epoch number shared with the worker processes a DataLoader starts from this object (shared
    memory, inherited by fork or passed while spawning); pickled any other way it becomes a plain copy."""

    def __init__(self, epoch: int) -> None:
        import multiprocessing

        self._value: Any = multiprocessing.RawValue("q", int(epoch))

    def get(self) -> int:
        return int(self._value.value)

    def set(self, epoch: int) -> None:
        self._value.value = int(epoch)

    def __getstate__(self) -> dict[str, Any]:
        from multiprocessing import context

        if context.get_spawning_popen() is not None:  # a worker process being started: share the memory
            return {"_value": self._value}
        return {"_value": None, "_copy": self.get()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state.get("_value") is not None:
            self._value = state["_value"]
        else:
            self.__init__(state["_copy"])  # type: ignore[misc]


def torch_iterable(ds: PackedDataset, rank: int = 0, world_size: int = 1, seed: int = 0, epoch: int = 0,
                   shuffle: bool = True, drop_last: bool = False):
    """A `torch.utils.data.IterableDataset` over one rank's slice (needs torch; not a dependency).

    With DataLoader workers, worker w of W yields every W-th sample of the
    rank's slice, so the union is still the rank's slice exactly. Resume via
    `.iterator.state_dict()` is exact only with `num_workers=0` (workers hold
    copies: the main process's iterator never moves). With workers, wrap it in
    torchdata's `StatefulDataLoader` (the dataset is `Stateful`: each worker's
    copy saves and restores its own position), or batch with `torch_loader`.
    Every pass over the DataLoader visits the rank's whole slice; `set_epoch(e)` before a pass
    gives it epoch e's order (the same order every pass otherwise), persistent workers included.
    Works with every start method of the workers (fork, spawn, forkserver).
    """
    return _torch_packed_class()(ds, rank, world_size, seed, epoch, shuffle, drop_last)


_TORCH_PACKED: Any = None


def _torch_packed_class() -> Any:
    """The IterableDataset class behind `torch_iterable`, made once torch is imported.

    Why a module attribute (see `__getattr__`), not a class local to `torch_iterable`: DataLoader
    workers started with spawn or forkserver (Python 3.14's default on Linux) unpickle the dataset,
    and a local class cannot be pickled (found in review: "Can't pickle local object")."""
    global _TORCH_PACKED
    if _TORCH_PACKED is not None:
        return _TORCH_PACKED
    try:
        import torch
        from torch.utils.data import IterableDataset, get_worker_info
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("torch_iterable needs PyTorch (pip install torch); "
                          "PackedDataset itself works with numpy only") from None

    class _TorchPacked(IterableDataset):  # type: ignore[misc, valid-type]
        def __init__(self, ds: PackedDataset, rank: int, world_size: int, seed: int, epoch: int, shuffle: bool,
                     drop_last: bool) -> None:
            self.ds, self.rank, self.world_size, self.seed = ds, rank, world_size, seed
            self.shuffle, self.drop_last = shuffle, drop_last
            self.iterator = ds.iterator(rank, world_size, seed, epoch, shuffle, drop_last)
            # the epoch the next pass visits, in memory shared with the DataLoader's worker processes:
            # found in review, with persistent_workers=True each worker kept the copy it started with,
            # so set_epoch(1) in the trainer was never seen and epoch 1 repeated epoch 0's order
            self._epoch = _SharedEpoch(epoch)

        def _iterator(self, epoch: int) -> "PackedIterator":
            return self.ds.iterator(self.rank, self.world_size, self.seed, epoch, self.shuffle, self.drop_last)

        # torchdata's Stateful protocol: StatefulDataLoader calls these in every worker on that
        # worker's copy, so resume is exact with workers too (each copy knows its own position)
        def state_dict(self) -> dict[str, Any]:
            return self.iterator.state_dict()

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.iterator = self.ds.iterator_from_state(state)
            self._epoch.set(self.iterator.epoch)

        def set_epoch(self, e: int) -> None:
            """The next pass visits epoch `e`'s order (as `PackedSampler.set_epoch`), in persistent
            workers too."""
            self.iterator = self._iterator(e)
            self._epoch.set(e)

        def __iter__(self):
            info = get_worker_info()
            wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
            if self._epoch.get() != self.iterator.epoch:  # set_epoch was called in the trainer's process
                self.iterator = self._iterator(self._epoch.get())
            it = self.iterator
            if it.position >= len(it.indices):
                # a finished pass: the next one visits the rank's slice again, as with workers (each of
                # which starts from the main process's copy); without this, num_workers=0 gave an empty
                # second epoch (found in review). A resumed position is kept: only a finished pass restarts.
                it.position = 0
            while it.position < len(it.indices):
                take = (it.position % nw) == wid
                if take:
                    sample = next(it)
                    yield {k: torch.from_numpy(np.asarray(v)) for k, v in sample.items()}
                else:
                    it.position += 1

    _TorchPacked.__module__, _TorchPacked.__qualname__ = __name__, "_TorchPacked"
    _TORCH_PACKED = _TorchPacked
    return _TORCH_PACKED


def __getattr__(name: str) -> Any:
    if name == "_TorchPacked":  # how a worker process unpickles a torch_iterable (see _torch_packed_class)
        return _torch_packed_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
