"""Samplers (torch.utils.data's): the order in which a DataLoader visits indices, and how it groups them.

Random orders come from an ember.Generator (a Mersenne Twister like torch's CPU generator): given
`ember.Generator().manual_seed(s)`, RandomSampler and SubsetRandomSampler give the same indices as torch's do with
`torch.Generator().manual_seed(s)`. Without a generator, each iteration seeds a fresh one from ember's global random
numbers, so ember.manual_seed makes the order reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any

import numpy as np

from ember.core.generator import Generator
from ember.utils.data.random_source import checked_generator, fresh_generator

RANDINT_CHUNK = 32  # torch's RandomSampler draws indices with replacement 32 at a time


class Sampler:
    """Base class: an iterable of indices (or of lists of indices, for a batch sampler)."""

    def __init__(self, data_source: Sized | None = None) -> None:
        pass

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} should be a positive integer value, but got {name}={value!r}")
    return int(value)


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} should be a boolean value, but got {name}={value!r}")
    return value


class RandomSampler(Sampler):
    """A random permutation of the indices each iteration (num_samples of them: whole permutations, then part of
    one), or, with replacement, num_samples indices drawn uniformly."""

    def __init__(self, data_source: Sized, replacement: bool = False, num_samples: int | None = None,
                 generator: Generator | None = None) -> None:
        self.data_source = data_source
        self.replacement = _bool(replacement, "replacement")
        self._num_samples = num_samples
        self.generator = checked_generator(generator, "RandomSampler")
        _positive_int(self.num_samples, "num_samples")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        count = len(self.data_source)
        generator = fresh_generator(self.generator)
        if self.replacement:
            for size in [RANDINT_CHUNK] * (self.num_samples // RANDINT_CHUNK) + [self.num_samples % RANDINT_CHUNK]:
                yield from (generator.random_words(size) % np.uint64(count)).tolist()
            return
        for _ in range(self.num_samples // count):
            yield from generator.randperm(count)
        yield from generator.randperm(count)[: self.num_samples % count]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order each iteration."""

    def __init__(self, indices: Sequence[int], generator: Generator | None = None) -> None:
        self.indices = indices
        self.generator = checked_generator(generator, "SubsetRandomSampler")

    def __iter__(self) -> Iterator[int]:
        for position in fresh_generator(self.generator).randperm(len(self.indices)):
            yield self.indices[position]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """num_samples indices drawn with probability proportional to weights (non-negative, not all zero), with or
    without replacement."""

    def __init__(self, weights: Sequence[float], num_samples: int, replacement: bool = True,
                 generator: Generator | None = None) -> None:
        self.num_samples = _positive_int(num_samples, "num_samples")
        self.replacement = _bool(replacement, "replacement")
        values = np.asarray(weights.numpy() if hasattr(weights, "numpy") else weights, dtype=np.float64)
        if values.ndim != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape {values.shape}")
        if not np.isfinite(values).all() or (values < 0).any() or values.sum() <= 0:
            raise ValueError("WeightedRandomSampler: weights must be finite, non-negative and not all zero")
        if not replacement and num_samples > np.count_nonzero(values):
            raise ValueError(f"WeightedRandomSampler: cannot draw {num_samples} samples without replacement from "
                             f"{np.count_nonzero(values)} non-zero weights")
        self.weights = values
        self.generator = checked_generator(generator, "WeightedRandomSampler")

    def __iter__(self) -> Iterator[int]:
        generator = fresh_generator(self.generator)
        uniform = ((generator.random64(self.num_samples if self.replacement else len(self.weights))
                    >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
        if self.replacement:  # inverse of the cumulative distribution
            cumulative = np.cumsum(self.weights)
            chosen = np.searchsorted(cumulative, uniform * cumulative[-1], side="right")
            return iter(np.minimum(chosen, len(self.weights) - 1).tolist())
        with np.errstate(divide="ignore"):  # sequential sampling without replacement: the largest log(u) / w
            keys = np.where(self.weights > 0, np.log(uniform) / self.weights, -np.inf)
        return iter(np.argsort(-keys, kind="stable")[: self.num_samples].tolist())

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Lists of batch_size indices from sampler (the last one shorter unless drop_last)."""

    def __init__(self, sampler: Sampler | Iterable[int], batch_size: int, drop_last: bool) -> None:
        self.sampler = sampler
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.drop_last = _bool(drop_last, "drop_last")

    def __iter__(self) -> Iterator[list[int]]:
        indices = iter(self.sampler)
        while batch := [index for _, index in zip(range(self.batch_size), indices)]:
            if self.drop_last and len(batch) < self.batch_size:
                return
            yield batch

    def __len__(self) -> int:
        count = len(self.sampler)  # type: ignore[arg-type]
        return count // self.batch_size if self.drop_last else math.ceil(count / self.batch_size)
