"""DistributedSampler: each of num_replicas processes gets its own share of the indices, torch's partition."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from ember.core.generator import Generator
from ember.utils.data.sampler import Sampler


class DistributedSampler(Sampler):
    """Rank `rank`'s indices of a dataset split among num_replicas processes: the (shuffled, when shuffle) indices
    padded by repetition to a multiple of num_replicas (or cut to one, when drop_last), then every num_replicas-th
    from position rank. The shuffle is torch's (a permutation from a generator seeded with seed + epoch), so every
    rank, and torch's DistributedSampler, sees the same order; call set_epoch(epoch) for a new order each epoch.
    num_replicas and rank default to the world size and rank of ember.distributed's process group."""

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None or rank is None:
            from ember import distributed

            if not distributed.is_initialized():
                raise RuntimeError(f"DistributedSampler: no process group to read the world size and rank from; call "
                                   f"ember.distributed.init_process_group('mpi') first, or pass num_replicas= (the "
                                   f"number of processes) and rank= (this process's index in [0, num_replicas)), got "
                                   f"num_replicas={num_replicas}, rank={rank}")
            num_replicas = distributed.get_world_size() if num_replicas is None else num_replicas
            rank = distributed.get_rank() if rank is None else rank
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas <= 0:
            raise ValueError(f"DistributedSampler: num_replicas must be a positive int, got {num_replicas!r}")
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        if drop_last and len(dataset) % num_replicas != 0:
            self.num_samples = math.ceil((len(dataset) - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(len(dataset) / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            indices = Generator().manual_seed(self.seed + self.epoch).randperm(len(self.dataset))
        else:
            indices = list(range(len(self.dataset)))
        if not self.drop_last:
            padding = self.total_size - len(indices)
            if padding <= len(indices):
                indices += indices[:padding]
            else:
                indices += (indices * math.ceil(padding / len(indices)))[:padding]
        else:
            indices = indices[: self.total_size]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch: with shuffle, each epoch has its own order (the same on every rank)."""
        self.epoch = epoch
