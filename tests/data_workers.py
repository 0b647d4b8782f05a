"""Datasets and hooks for tests/test_data.py's worker-process tests (a module without torch, so spawned workers
start quickly)."""

from __future__ import annotations

import os

import numpy as np

from ember.utils.data import Dataset, IterableDataset, get_worker_info


class SquaresDataset(Dataset):
    """Sample i is (i as float32 features, i*i, {"name": str(i)}), with the worker id it was fetched in."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple:
        info = get_worker_info()
        return (np.full(3, index, dtype=np.float32), index * index,
                {"name": str(index), "worker": -1 if info is None else info.id})


class FailingDataset(Dataset):
    """Raises a ValueError for sample 5."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> np.ndarray:
        if index == 5:
            raise ValueError("sample 5 is corrupt")
        return np.zeros(2, dtype=np.float32)


class DyingDataset(Dataset):
    """The worker process exits abruptly at sample 3."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> np.ndarray:
        if index == 3:
            os._exit(7)
        return np.zeros(2, dtype=np.float32)


class RangeStream(IterableDataset):
    """0..count-1, split between workers by get_worker_info()."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(np.arange(start, self.count, step, dtype=np.int64).tolist())


def record_worker(worker_id: int) -> None:
    """worker_init_fn: checks get_worker_info agrees with the id it is given."""
    info = get_worker_info()
    assert info is not None and info.id == worker_id
