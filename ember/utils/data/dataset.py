"""Datasets (torch.utils.data's): Dataset, IterableDataset, TensorDataset, ConcatDataset, ChainDataset, Subset and
random_split."""

from __future__ import annotations

import bisect
import itertools
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ember.core.generator import Generator
from ember.core.tensor import Tensor
from ember.utils.data.random_source import checked_generator, fresh_generator


class Dataset:
    """A map-style dataset: samples by index (`__getitem__`), usually with `__len__`."""

    def __getitem__(self, index: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__ (a map-style Dataset)")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """An iterable-style dataset: samples by iteration (`__iter__`); each DataLoader worker iterates its own copy
    (use get_worker_info() to split the work)."""

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__ (an IterableDataset)")

    def __add__(self, other: Dataset) -> ChainDataset:  # type: ignore[override]
        return ChainDataset([self, other])


def _first_size(tensor: Any) -> int:
    shape = getattr(tensor, "shape", None)
    if shape is None or len(shape) == 0:
        raise TypeError(f"TensorDataset: every tensor needs a first dimension to index samples by, got "
                        f"{type(tensor).__name__} of shape {tuple(shape) if shape is not None else None}")
    return int(shape[0])


class TensorDataset(Dataset):
    """Samples are the rows of tensors (ember tensors or numpy arrays) of the same first size: sample i is
    tuple(tensor[i] for tensor in tensors).

    A worker process receives the tensors as numpy arrays (ember device buffers cannot be pickled), so rows fetched
    there are numpy; the DataLoader makes its batches ember tensors in the main process either way."""

    def __init__(self, *tensors: Any) -> None:
        sizes = [_first_size(tensor) for tensor in tensors]
        if len(set(sizes)) > 1:
            raise ValueError(f"TensorDataset: size mismatch between tensors: their first dimensions are {sizes}")
        self.tensors = tuple(tensors)

    def __getitem__(self, index: Any) -> tuple[Any, ...]:
        return tuple(tensor[index] for tensor in self.tensors)

    def __len__(self) -> int:
        return _first_size(self.tensors[0]) if self.tensors else 0

    def _batch(self, indices: Sequence[int]) -> list[Any]:
        """default_collate([self[i] for i in indices]) in one gather per tensor (the DataLoader's fast path)."""
        from ember.core.creation import from_numpy

        positions = np.asarray(indices, dtype=np.int64)
        batch: list[Any] = []
        for position, tensor in enumerate(self.tensors):
            if isinstance(tensor, Tensor) and tensor.requires_grad:  # keeps the gradient's path to the tensor
                batch.append(tensor[from_numpy(positions).to(tensor.device)])
            elif isinstance(tensor, Tensor):
                rows = np.ascontiguousarray(self._host_copy(position, tensor)[positions])
                batch.append(from_numpy(rows).to(tensor.device))
            else:
                batch.append(from_numpy(np.ascontiguousarray(np.asarray(tensor)[positions])))
        return batch

    def _host_copy(self, position: int, tensor: Tensor) -> np.ndarray:
        """The values of an ember tensor read once (again after an in-place change): gathering a batch's rows on
        the host and uploading them costs the batch's size, where a gather on the device is a one-hot reduction
        over every row of the dataset."""
        key = (id(tensor.node), tensor._version)
        copies = self.__dict__.setdefault("_host_copies", {})
        if position not in copies or copies[position][0] != key:
            copies[position] = (key, tensor.numpy())
        return copies[position][1]

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (for a worker process) with ember tensors as numpy arrays."""
        return {"tensors": tuple(tensor.numpy() if isinstance(tensor, Tensor) else tensor for tensor in self.tensors)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.tensors = state["tensors"]


class ConcatDataset(Dataset):
    """The samples of several map-style datasets, one after another."""

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: datasets should not be an empty iterable")
        for dataset in self.datasets:
            if isinstance(dataset, IterableDataset):
                raise TypeError("ConcatDataset does not support IterableDataset (use ChainDataset)")
        sizes: list[int] = [len(dataset) for dataset in self.datasets]  # type: ignore[arg-type]
        self.cumulative_sizes = list(itertools.accumulate(sizes))

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, index: int) -> Any:
        if index < 0:
            if -index > len(self):
                raise ValueError(f"ConcatDataset: absolute value of index {index} should not exceed dataset length "
                                 f"{len(self)}")
            index = len(self) + index
        dataset_index = bisect.bisect_right(self.cumulative_sizes, index)
        sample_index = index if dataset_index == 0 else index - self.cumulative_sizes[dataset_index - 1]
        return self.datasets[dataset_index][sample_index]


class ChainDataset(IterableDataset):
    """The samples of several iterable datasets, one after another."""

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)

    def __iter__(self) -> Iterator[Any]:
        for dataset in self.datasets:
            if not isinstance(dataset, IterableDataset):
                raise TypeError(f"ChainDataset only supports IterableDataset, got {type(dataset).__name__}")
            yield from dataset

    def __len__(self) -> int:
        return sum(len(dataset) for dataset in self.datasets)  # type: ignore[arg-type, misc]


class Subset(Dataset):
    """The samples of dataset at the given indices, in that order."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, list):
            return self.dataset[[self.indices[position] for position in index]]
        return self.dataset[self.indices[index]]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """The samples at several indices (torch's batched fetch)."""
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.dataset.__getitems__([self.indices[index] for index in indices])  # type: ignore[attr-defined]
        return [self.dataset[self.indices[index]] for index in indices]

    def __len__(self) -> int:
        return len(self.indices)

    def _batch(self, indices: Sequence[int]) -> Any:
        """The parent's collated batch at these indices, where the parent has that fast path."""
        return self.dataset._batch([self.indices[index] for index in indices])  # type: ignore[attr-defined]


def _lengths_from_fractions(fractions: Sequence[float], total: int) -> list[int]:
    """torch's split of total by fractions summing to 1: floors, then the remainder one each round-robin."""
    lengths = []
    for position, fraction in enumerate(fractions):
        if fraction < 0 or fraction > 1:
            raise ValueError(f"random_split: fraction at index {position} is not between 0 and 1, got {fraction}")
        lengths.append(int(math.floor(total * fraction)))
    for position in range(total - sum(lengths)):
        lengths[position % len(lengths)] += 1
    for position, length in enumerate(lengths):
        if length == 0:
            warnings.warn(f"random_split: length of split at index {position} is 0; this might result in an empty "
                          f"dataset", stacklevel=3)
    return lengths


def random_split(dataset: Dataset, lengths: Sequence[int | float], generator: Generator | None = None) -> list[Subset]:
    """Split dataset at random into non-overlapping Subsets of the given lengths, or of fractions summing to 1
    (torch's rounding); generator (an ember.Generator) makes the split reproducible, and gives torch's split for
    the same seed."""
    generator = checked_generator(generator, "random_split")
    total = len(dataset)  # type: ignore[arg-type]
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        lengths = _lengths_from_fractions(lengths, total)
    if sum(lengths) != total:
        raise ValueError(f"random_split: sum of input lengths ({sum(lengths)}) does not equal the length of the input "
                         f"dataset ({total})")
    indices = fresh_generator(generator).randperm(total)
    offsets = itertools.accumulate(int(length) for length in lengths)
    return [Subset(dataset, indices[offset - int(length):offset]) for offset, length in zip(offsets, lengths)]
