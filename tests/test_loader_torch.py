"""The PyTorch adapter over PackedDataset (torch 2.13.0 CPU is in the lock, so this runs in CI)."""
from __future__ import annotations

import numpy as np
import pytest

from datakit.loader import torch_iterable
from tests.test_loader import dataset  # noqa: F401  (module-scoped packed dataset fixture)

torch = pytest.importorskip("torch")


def _expected(ds, rank, world, seed, epoch):
    it = ds.iterator(rank, world, seed, epoch)
    return [int(i) for i in it.indices]


def _key(sample) -> bytes:
    return np.asarray(sample["input_ids"]).tobytes()


def test_dataloader_yields_the_ranks_slice_as_tensors(dataset):  # noqa: F811
    from torch.utils.data import DataLoader

    want = [_key(dataset[i]) for i in _expected(dataset, 1, 3, 7, 2)]
    got = list(DataLoader(torch_iterable(dataset, rank=1, world_size=3, seed=7, epoch=2), batch_size=None))
    assert got and all(isinstance(s["input_ids"], torch.Tensor) and s["input_ids"].dtype == torch.int64 for s in got)
    assert [_key({"input_ids": s["input_ids"].numpy()}) for s in got] == want
    s0 = got[0]
    assert set(s0) >= {"input_ids", "labels", "position_ids", "cu_seqlens"}


def test_dataloader_workers_split_the_slice_without_loss_or_overlap(dataset):  # noqa: F811
    from torch.utils.data import DataLoader

    want = sorted(_key(dataset[i]) for i in _expected(dataset, 0, 2, 0, 0))
    loader = DataLoader(torch_iterable(dataset, rank=0, world_size=2, seed=0, epoch=0), batch_size=None,
                        num_workers=2, multiprocessing_context="fork")
    got = sorted(_key({"input_ids": s["input_ids"].numpy()}) for s in loader)
    assert got == want
