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


# -- batching and exact resume with workers (torch DataLoader / torchdata StatefulDataLoader) ---------

def test_plain_dataloader_batches_packed_dataset_with_workers(dataset):  # noqa: F811
    from torch.utils.data import DataLoader

    batches = list(DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="fork"))
    L = dataset.seq_len
    assert batches[0]["input_ids"].shape == (4, L) and batches[0]["cu_seqlens"].shape == (4, dataset.max_segments + 1)
    assert sorted(int(i) for b in batches for i in b["index"]) == list(range(len(dataset)))


def test_collate_gives_varlen_boundaries_of_the_flattened_batch(dataset):  # noqa: F811
    from torch.utils.data import DataLoader

    from datakit.loader import collate

    idx = [3, 0, len(dataset) - 1, 7]
    (b,) = list(DataLoader(dataset, batch_size=4, sampler=idx, collate_fn=collate))
    want = dataset.get_batch(idx)
    assert b["cu_seqlens"].dtype == torch.int32 and b["input_ids"].shape == (4, dataset.seq_len)
    assert np.array_equal(b["cu_seqlens"].numpy(), want["cu_seqlens"])  # exact: no zero-length segments
    assert (np.diff(b["cu_seqlens"].numpy()) > 0).all()
    assert b["max_seqlen"] == int(np.diff(want["cu_seqlens"]).max())
    for key in ("input_ids", "labels", "loss_mask", "position_ids"):
        assert np.array_equal(b[key].numpy(), want[key]), key
    # each cu_seqlens segment restarts position_ids: what varlen kernels and position_ids-based models agree on
    flat_pos = b["position_ids"].reshape(-1).numpy()
    assert (flat_pos[b["cu_seqlens"][:-1].numpy()] == 0).all()


@pytest.mark.parametrize("world_size,workers", [(1, 0), (1, 2), (2, 2), (3, 1)])
def test_mid_epoch_save_restore_sees_every_sequence_once(dataset, world_size, workers):  # noqa: F811
    import pickle

    from datakit.loader import torch_loader

    seen: list[int] = []
    for rank in range(world_size):
        def make():
            return torch_loader(dataset, batch_size=3, num_workers=workers, rank=rank, world_size=world_size,
                                seed=5, epoch=0, multiprocessing_context="fork" if workers else None)

        loader = make()
        loader.set_epoch(1)
        it = iter(loader)
        for _ in range(4):  # mid-epoch: workers have prefetched beyond what was consumed
            seen += next(it)["index"].tolist()
        state = pickle.loads(pickle.dumps(loader.state_dict()))  # a checkpoint, as a trainer writes it
        del it, loader
        resumed = make()  # a new process would build the same loader, then load the state
        resumed.load_state_dict(state)
        seen += [i for b in resumed for i in b["index"].tolist()]
    assert sorted(seen) == list(range(len(dataset)))  # every sequence exactly once in the epoch
    # and the order is epoch 1's, not epoch 0's
    assert seen[:12] == [int(i) for i in dataset.iterator(0, world_size, 5, 1).indices[:12]]


def test_resume_state_from_another_slice_is_refused(dataset):  # noqa: F811
    from datakit.loader import DatasetError, torch_loader

    a = torch_loader(dataset, batch_size=2, rank=0, world_size=2)
    next(iter(a))
    with pytest.raises(DatasetError, match="rank"):
        torch_loader(dataset, batch_size=2, rank=1, world_size=2).load_state_dict(a.state_dict())


def test_torch_iterable_resumes_exactly_with_workers_under_statefuldataloader(dataset):  # noqa: F811
    import pickle

    from torchdata.stateful_dataloader import StatefulDataLoader

    def make():
        return StatefulDataLoader(torch_iterable(dataset, rank=0, world_size=1, seed=3), batch_size=None,
                                  num_workers=2, multiprocessing_context="fork")

    loader = make()
    it = iter(loader)
    seen = [int(next(it)["index"]) for _ in range(9)]  # odd: the two workers stand at different positions
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    # each worker's copy saved its own position (restored directly, not by re-reading what it had yielded)
    positions = [w["dataset_state"]["position"] for w in state["_snapshot"]["_worker_snapshots"].values()]
    assert sorted(positions) == [8, 9] and all(
        w["dataset_state"]["dataset"] == dataset.fingerprint for w in state["_snapshot"]["_worker_snapshots"].values())
    del it, loader
    resumed = make()
    resumed.load_state_dict(state)
    seen += [int(s["index"]) for s in resumed]
    assert sorted(seen) == list(range(len(dataset)))


@pytest.mark.parametrize("workers", [0, 2])
def test_every_pass_over_torch_iterable_visits_the_slice(dataset, workers):  # noqa: F811
    """Found in review: with num_workers=0 the second epoch was empty (the one shared iterator stayed at
    its end), with workers it was complete. Every pass is complete now; set_epoch picks the next order."""
    from torch.utils.data import DataLoader

    tds = torch_iterable(dataset, rank=0, world_size=2, seed=3, epoch=0)
    kw = {"multiprocessing_context": "fork"} if workers else {}
    loader = DataLoader(tds, batch_size=None, num_workers=workers, **kw)
    first = [int(s["index"]) for s in loader]
    again = [int(s["index"]) for s in loader]
    assert sorted(first) == sorted(again) == sorted(_expected(dataset, 0, 2, 3, 0))
    tds.set_epoch(1)
    third = [int(s["index"]) for s in loader]
    assert sorted(third) == sorted(_expected(dataset, 0, 2, 3, 1)) and third != first


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_set_epoch_reaches_persistent_workers(dataset, context):  # noqa: F811
    """Found in review: with persistent_workers=True each worker kept the copy it started with, so
    set_epoch(1) was never seen there and epoch 1 repeated epoch 0's order without a word."""
    from torch.utils.data import DataLoader

    def order(tds, persistent):
        return DataLoader(tds, batch_size=None, num_workers=2, multiprocessing_context=context,
                          persistent_workers=persistent)

    fresh1 = torch_iterable(dataset, rank=0, world_size=2, seed=3, epoch=1)
    want1 = [int(s["index"]) for s in order(fresh1, False)]
    tds = torch_iterable(dataset, rank=0, world_size=2, seed=3, epoch=0)
    loader = order(tds, True)
    first = [int(s["index"]) for s in loader]
    tds.set_epoch(1)
    second = [int(s["index"]) for s in loader]
    assert second == want1 and second != first
    tds.set_epoch(0)
    assert [int(s["index"]) for s in loader] == first
