"""DataLoader: batches of a dataset in the order of a sampler, in the main process or in worker processes."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

from ember.core.generator import Generator
from ember.utils.data.collate import default_collate, default_convert
from ember.utils.data.dataset import IterableDataset
from ember.utils.data.fetch import IterableFetcher, MapFetcher
from ember.utils.data.random_source import checked_generator, draw_seed
from ember.utils.data.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler
from ember.utils.data.worker import MultiProcessIterator

DEFAULT_PREFETCH_FACTOR = 2


class InfiniteConstantSampler(Sampler):
    """None forever: the tasks of an iterable dataset's workers carry no indices."""

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)


class DataLoader:
    """Batches of dataset (torch.utils.data.DataLoader's arguments and semantics).

    Batches are ember tensors (default_collate). shuffle=True draws a permutation each epoch from generator (an
    ember.Generator: the same order as torch's DataLoader with a torch.Generator of the same seed) or, without one,
    from ember's global random numbers (ember.manual_seed). num_workers > 0 starts that many spawned worker processes
    per epoch (persistent_workers keeps torch's meaning only as a flag: workers are started again each epoch),
    which fetch and collate into numpy arrays; the main process makes them ember tensors. pin_memory is accepted
    and has no effect (ember has no pinned host memory).
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Any = None, batch_sampler: Any = None, num_workers: int = 0,
                 collate_fn: Callable[[Any], Any] | None = None, pin_memory: bool = False, drop_last: bool = False,
                 timeout: float = 0, worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context: Any = None, generator: Generator | None = None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers option should be a non-negative integer; use num_workers=0 to disable "
                             f"multiprocessing, got num_workers={num_workers!r}")
        if timeout < 0:
            raise ValueError(f"timeout option should be non-negative, got timeout={timeout}")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing; let num_workers > 0 "
                             "to enable multiprocessing, otherwise set prefetch_factor to None")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = DEFAULT_PREFETCH_FACTOR
        if prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError(f"prefetch_factor option should be non-negative, got prefetch_factor={prefetch_factor}")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        self.in_order = in_order
        self.generator = checked_generator(generator, "DataLoader")
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            if shuffle not in (None, False):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, but got "
                                 f"shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler option, but got "
                                 f"sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified batch_sampler option, but "
                                 f"got batch_sampler={batch_sampler}")
        shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
                                 "drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if sampler is None:
            if self._iterable:
                sampler = InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=self.generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self._auto_collation else self.sampler

    def __iter__(self) -> Iterator[Any]:
        sampler_iterator = iter(self._index_sampler)
        base_seed = draw_seed(self.generator)  # drawn before the sampler's first draw, as torch's loader does
        if self.num_workers > 0:
            return MultiProcessIterator(self, sampler_iterator, base_seed)
        return self._single_process(sampler_iterator)

    def _single_process(self, sampler_iterator: Iterator[Any]) -> Iterator[Any]:
        fetcher: Any
        if self._iterable:
            fetcher = IterableFetcher(self.dataset, self._auto_collation, self.collate_fn, False, self.batch_size,
                                      self.drop_last)
        else:
            fetcher = MapFetcher(self.dataset, self._auto_collation, self.collate_fn, False)
        for indices in sampler_iterator:
            try:
                batch = fetcher.fetch(indices)
            except StopIteration:
                return
            yield batch

    def __len__(self) -> int:
        if self._iterable:
            length = len(self.dataset)
            if self.batch_size is not None:
                length = length // self.batch_size if self.drop_last else math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)

    def check_worker_number_rationality(self) -> None:
        """torch's warning about more workers than CPUs is not given; present for API parity."""
