"""Fetching one batch from a dataset: by indices (map-style) or by iteration (iterable), then collating.

The same fetchers run in the main process (collating into ember tensors) and in worker processes (`host=True`:
collating into numpy arrays marked HostArray, which the main process makes ember tensors).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from ember.utils.data.collate import default_collate, default_convert, host_collate, host_convert, to_host


def worker_collate(collate_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The form of collate_fn a worker runs: the host forms of the defaults, or a custom collate_fn whose ember
    tensors are sent as numpy."""
    if collate_fn is default_collate:
        return host_collate
    if collate_fn is default_convert:
        return host_convert
    return lambda batch: to_host(collate_fn(batch))


class MapFetcher:
    """Samples of a map-style dataset at given indices (a list of them when batching), collated."""

    def __init__(self, dataset: Any, auto_collation: bool, collate_fn: Callable[[Any], Any], host: bool) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = worker_collate(collate_fn) if host else collate_fn
        # a TensorDataset (or a Subset of one) gathers a whole batch at once: one kernel per tensor
        self.gather = (not host and collate_fn is default_collate and auto_collation
                       and callable(getattr(dataset, "_batch", None)) and _batches_all_the_way(dataset))

    def fetch(self, indices: Any) -> Any:
        if not self.auto_collation:
            return self.collate_fn(self.dataset[indices])
        if self.gather:
            return self.dataset._batch(indices)
        if callable(getattr(self.dataset, "__getitems__", None)):
            samples = self.dataset.__getitems__(indices)
        else:
            samples = [self.dataset[index] for index in indices]
        return self.collate_fn(samples)


def _batches_all_the_way(dataset: Any) -> bool:
    """Whether dataset's _batch reaches a TensorDataset (a Subset's _batch only forwards)."""
    from ember.utils.data.dataset import Subset, TensorDataset

    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return isinstance(dataset, TensorDataset) and type(dataset).__getitem__ is TensorDataset.__getitem__


class IterableFetcher:
    """The next batch_size samples of an iterable dataset (the next sample, without batching), collated; raises
    StopIteration at the end (before a short last batch, with drop_last)."""

    def __init__(self, dataset: Any, auto_collation: bool, collate_fn: Callable[[Any], Any], host: bool,
                 batch_size: int | None, drop_last: bool) -> None:
        self.iterator: Iterator[Any] = iter(dataset)
        self.auto_collation = auto_collation
        self.collate_fn = worker_collate(collate_fn) if host else collate_fn
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.ended = False

    def fetch(self, indices: Any) -> Any:
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            return self.collate_fn(next(self.iterator))
        assert self.batch_size is not None
        samples = list(itertools.islice(self.iterator, self.batch_size))
        if not samples or (self.drop_last and len(samples) < self.batch_size):
            self.ended = True
            raise StopIteration
        return self.collate_fn(samples)
