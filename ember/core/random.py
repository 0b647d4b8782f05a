"""Sampling from given distributions: bernoulli, multinomial, the in-place fills (uniform_, normal_, random_,
exponential_, cauchy_, log_normal_, geometric_) and the generator state (get_rng_state, set_rng_state).

Every draw comes from the counter-based random bits of `creation.py`, computed in kernels (the same bits on every
device for a seed). Checks that torch makes on the values (probabilities in [0, 1], non-negative finite weights)
read those values back, which costs one synchronization per call, as torch's own checks do on the CPU.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ember.core import dtype as dtypes
from ember.core.creation import _normal, _random_bits, _uniform, kept
from ember.core.elementwise import where
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

WITHOUT_REPLACEMENT_BY_ARGMAX = 16  # up to this many samples: one argmax each; beyond: top-k of the keys


def _require_float(tensor: Tensor, op: str) -> None:
    if not tensor.dtype.is_float:
        raise DTypeError(f"{op}: needs a floating point tensor, got {tensor.dtype.name} (as in PyTorch); cast it with "
                         f".float()")


def _check_probabilities(probabilities: Tensor, op: str) -> None:
    """Raise unless every value is in [0, 1] (NaN is not); reads one bool back."""
    outside = (probabilities < 0).logical_or(probabilities > 1).logical_or(probabilities.isnan()).any()
    if outside.item():
        low, high = probabilities.amin().item(), probabilities.amax().item()
        raise ArgumentError(f"{op}: probabilities must be in [0, 1], got values from {low} to {high}")


def _open_uniform(shape: tuple[int, ...], device: str, dtype: dtypes.DType) -> Tensor:
    """Uniform floats in (0, 1), never 0 (so the logarithms of the Gumbel trick stay finite)."""
    count = math.prod(shape)
    values = ((_random_bits(count, device) >> 8).cast(dtypes.float32) + 0.5) * 2.0**-24
    return values.cast(dtype).reshape(shape)


# ---- bernoulli ---------------------------------------------------------------------------------------------------


def bernoulli(input: Tensor, p: float | None = None, *, generator: Any = None) -> Tensor:  # noqa: A002 - torch's name
    """0 or 1 in input's (float) dtype, 1 with probability input (or p, when given) for each element."""
    _require_float(input, "bernoulli")
    if p is not None:
        if not 0.0 <= p <= 1.0:
            raise ArgumentError(f"bernoulli: p must be in [0, 1], got {p}")
        probabilities: Any = p
    else:
        _check_probabilities(input, "bernoulli")
        probabilities = input._detached_copy()
    draw = _uniform(input.shape, dtypes.float64 if input.dtype is dtypes.float64 else dtypes.float32, input.device)
    return kept((draw < probabilities).cast(input.dtype))


def bernoulli_(tensor: Tensor, p: Any = 0.5) -> Tensor:
    """Fill tensor in place with 0/1 draws, 1 with probability p (a number, or a tensor broadcast to its shape)."""
    from ember.core.elementwise import ElementwiseOps

    if isinstance(p, ElementwiseOps):
        p = cast("Tensor", p)
        _require_float(p, "bernoulli_")
        if p.shape != tensor.shape:
            p = p.expand(tensor.shape)  # raises like torch when p does not broadcast to the tensor
        _check_probabilities(p, "bernoulli_")
        p = p._detached_copy()
    elif not 0.0 <= float(p) <= 1.0:
        raise ArgumentError(f"bernoulli_: expects p to be in [0, 1], got p={p}")
    draw = _uniform(tensor.shape, dtypes.float32, tensor.device)
    return tensor.assign(kept((draw < p).cast(tensor.dtype)))


# ---- multinomial ---------------------------------------------------------------------------------------------


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *,  # noqa: A002 - torch's name
                generator: Any = None) -> Tensor:
    """Indices (int64) drawn from the categories of each row of input (1-d or 2-d, non-negative weights that need
    not sum to 1), like torch.multinomial. Each draw is a Gumbel-max: the category whose log weight plus Gumbel
    noise is largest; without replacement the first num_samples of that order (Gumbel-top-k), which is sequential
    sampling without replacement."""
    if input.ndim not in (1, 2):
        raise ShapeError(f"multinomial: the input must be 1-d or 2-d (prob_dist), got shape {input.shape}")
    if not input.dtype.is_float:
        raise DTypeError(f"multinomial: only floating point inputs are supported (as in PyTorch), got "
                         f"{input.dtype.name}")
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
        raise ArgumentError(f"multinomial: cannot sample num_samples={num_samples!r}; it must be a positive int")
    categories = input.shape[-1]
    if not replacement and num_samples > categories:
        raise ArgumentError(f"multinomial: cannot sample {num_samples} samples without replacement from "
                            f"{categories} categories")
    rows = input.reshape(-1, categories)
    if rows.shape[0] == 0:
        return input._full(input.shape[:-1] + (num_samples,), 0, dtypes.int64, input.device)
    _check_weights(rows)
    compute = dtypes.float64 if input.dtype is dtypes.float64 else dtypes.float32
    # a zero weight gets the lowest finite key: never chosen while others remain, then (without replacement) in
    # index order, as torch does; -inf marks the categories already taken
    weights = rows._detached_copy().cast(compute)
    log_weights = where(weights == 0, -float(np.finfo(compute.numpy).max), weights.log())
    # the keys are stored once (contiguous): every comparison below must see the same values, and a fused kernel
    # recomputing the logarithms could round them differently from another (vectorized or not)
    if replacement or num_samples == 1:
        noise = _gumbel((rows.shape[0], num_samples, categories), input.device, compute)
        samples = (log_weights.unsqueeze(1) + noise).contiguous().argmax(-1)
    else:
        samples = _largest_first((log_weights + _gumbel(rows.shape, input.device, compute)).contiguous(), num_samples)
    return kept(samples.reshape(input.shape[:-1] + (num_samples,)))


def _check_weights(rows: Tensor) -> None:
    """torch's checks, read back at once: finite non-negative weights, and a positive sum in every row."""
    from ember.core.tensor import realize

    invalid = (rows < 0).logical_or(rows.isfinite().logical_not()).any()
    smallest_sum = rows._detached_copy().cast(dtypes.float64).sum(-1).amin()
    realize(invalid, smallest_sum)
    if invalid.item():
        raise ArgumentError("multinomial: the probability tensor contains inf, nan or an element < 0")
    if smallest_sum.item() <= 0:
        raise ArgumentError("multinomial: invalid distribution: a row's sum of probabilities is <= 0")


def _gumbel(shape: tuple[int, ...], device: str, dtype: dtypes.DType) -> Tensor:
    """Standard Gumbel noise -log(-log(u)), u uniform in (0, 1)."""
    return -(-_open_uniform(shape, device, dtype).log()).log()


def _largest_first(keys: Tensor, count: int) -> Tensor:
    """The column indices of the `count` largest (finite) keys of each row, largest first (ties: the lower index
    first)."""
    rows, width = keys.shape
    if count <= WITHOUT_REPLACEMENT_BY_ARGMAX:
        positions = keys._arange_primitive(width, dtypes.int64, keys.device)
        chosen = []
        for _ in range(count):
            index = keys.argmax(-1, keepdim=True)
            chosen.append(index)
            keys = where(positions == index, -math.inf, keys)
        from ember.core.movement import cat

        return cat(chosen, 1)
    # beyond: the sort network's top-k (ties: the lower index first, as here); ranking every key against every
    # other was O(width^2) per row (a vocabulary of 262,144 would compare 7 * 10^10 pairs)
    return keys.topk(count, -1)[1]


# ---- in-place fills ----------------------------------------------------------------------------------------------


def uniform_(tensor: Tensor, low: float, high: float) -> Tensor:
    """Fill tensor in place with uniform values in [low, high)."""
    _require_float(tensor, "uniform_")
    if not low <= high:
        raise ArgumentError(f"uniform_: expects a [from, to) range, got from={low} > to={high}")
    draw = _uniform(tensor.shape, tensor.dtype, tensor.device)
    return tensor.assign(kept(draw * (high - low) + low if (low, high) != (0.0, 1.0) else draw))


def normal_(tensor: Tensor, mean: float, std: float) -> Tensor:
    """Fill tensor in place with normal values of mean and std (std >= 0)."""
    _require_float(tensor, "normal_")
    if not std >= 0:
        raise ArgumentError(f"normal_: expects std >= 0.0, got std={std}")
    draw = _normal(tensor.shape, tensor.dtype, tensor.device)
    return tensor.assign(kept(draw * std + mean if (mean, std) != (0.0, 1.0) else draw))



def random_(tensor: Tensor, low: Any = None, high: Any = None) -> Tensor:
    """Fill with integers uniform in [low, high): random_(to) is [0, to), random_() [0, 2^mantissa bits] for floats
    and the dtype's non-negative range for integers (torch.Tensor.random_)."""
    from ember.core.creation import MANTISSA_BITS, randint

    if low is not None and high is None:
        low, high = 0, low
    if low is None:
        low = 0
        if tensor.dtype.is_bool:
            high = 2
        elif tensor.dtype.is_float:
            high = 2 ** (53 if tensor.dtype is dtypes.float64 else MANTISSA_BITS[tensor.dtype]) + 1
        else:
            high = int(np.iinfo(tensor.dtype.numpy).max) + (1 if tensor.dtype.bits < 64 else 0)
    if not int(low) < int(high):
        raise ArgumentError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    return tensor.assign(randint(int(low), int(high), tensor.shape, device=tensor.device).cast(tensor.dtype))


def exponential_(tensor: Tensor, lambd: float = 1.0) -> Tensor:
    """Fill with exponential values of rate lambd: -log(1 - U) / lambd."""
    _require_float(tensor, "exponential_")
    if not lambd > 0:
        raise ArgumentError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    draw = _uniform(tensor.shape, tensor.dtype, tensor.device)
    return tensor.assign(kept(-(1 - draw).log() / lambd))


def cauchy_(tensor: Tensor, median: float = 0.0, sigma: float = 1.0) -> Tensor:
    """Fill with Cauchy values: median + sigma * tan(pi * (U - 1/2))."""
    _require_float(tensor, "cauchy_")
    if not sigma > 0:
        raise ArgumentError(f"cauchy_ expects sigma > 0.0, but found sigma={sigma}")
    draw = _open_uniform(tensor.shape, tensor.device, tensor.dtype)
    return tensor.assign(kept(((draw - 0.5) * math.pi).tan() * sigma + median))


def log_normal_(tensor: Tensor, mean: float = 1.0, std: float = 2.0) -> Tensor:
    """Fill with exp of normal values of mean and std."""
    _require_float(tensor, "log_normal_")
    if not std > 0:
        raise ArgumentError(f"log_normal_ expects std > 0.0, but found std={std}")
    draw = _normal(tensor.shape, tensor.dtype, tensor.device)
    return tensor.assign(kept((draw * std + mean).exp()))


def geometric_(tensor: Tensor, p: float) -> Tensor:
    """Fill with the number of Bernoulli(p) trials up to the first success: ceil(log(U) / log(1 - p))."""
    if not 0 < p < 1:
        raise ArgumentError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    draw = _open_uniform(tensor.shape, tensor.device, dtypes.float32)
    trials = (draw.log() / math.log1p(-p)).ceil().clamp_min(1)
    return tensor.assign(kept(trials.cast(tensor.dtype)))


def get_rng_state() -> Tensor:
    """The random state (the seed and the count of numbers drawn) as a uint8 tensor for set_rng_state."""
    from ember.core.creation import RandomState, tensor

    raw = np.array([RandomState.seed, RandomState.counter], dtype=np.uint64).view(np.uint8)
    return tensor(raw.copy())


def set_rng_state(new_state: Tensor) -> None:
    """Restore a state from get_rng_state: the numbers drawn next repeat those drawn after it was taken."""
    from ember.core.creation import RandomState

    if not hasattr(new_state, "dtype") or new_state.dtype is not dtypes.uint8 or tuple(new_state.shape) != (16,):
        raise TypeError(f"set_rng_state: expected the uint8 tensor of 16 bytes get_rng_state returns, got "
                        f"{getattr(new_state, 'dtype', type(new_state).__name__)} of shape "
                        f"{tuple(getattr(new_state, 'shape', ()))}")
    seed, counter = np.asarray(new_state.numpy(), dtype=np.uint8).view(np.uint64).tolist()
    RandomState.seed, RandomState.counter = int(seed), int(counter)


class RandomOps(TensorBase):
    """Mixin: the Tensor methods that draw random numbers (bernoulli, multinomial and the in-place fills)."""

    __slots__ = ()

    def uniform_(self, from_: float = 0.0, to: float = 1.0, *, generator: Any = None,
                 **bounds: float) -> Tensor:
        """Fill with uniform values in [from, to) (`from` may be given by name too, as in torch)."""
        return uniform_(cast("Tensor", self), float(bounds.pop("from", from_)), float(to))

    def normal_(self, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> Tensor:
        return normal_(cast("Tensor", self), float(mean), float(std))

    def random_(self, from_: Any = None, to: Any = None, *, generator: Any = None, **bounds: Any) -> Tensor:
        """Fill with random integers in [from, to) (see random.random_ for the defaults)."""
        return random_(cast("Tensor", self), bounds.pop("from", from_), to)

    def exponential_(self, lambd: float = 1.0, *, generator: Any = None) -> Tensor:
        return exponential_(cast("Tensor", self), float(lambd))

    def cauchy_(self, median: float = 0.0, sigma: float = 1.0, *, generator: Any = None) -> Tensor:
        return cauchy_(cast("Tensor", self), float(median), float(sigma))

    def log_normal_(self, mean: float = 1.0, std: float = 2.0, *, generator: Any = None) -> Tensor:
        return log_normal_(cast("Tensor", self), float(mean), float(std))

    def geometric_(self, p: float, *, generator: Any = None) -> Tensor:
        return geometric_(cast("Tensor", self), float(p))

    def bernoulli(self, p: float | None = None, *, generator: Any = None) -> Tensor:
        """0/1 draws, 1 with probability self (or p), in self's float dtype (torch.bernoulli)."""
        return bernoulli(cast("Tensor", self), p)

    def bernoulli_(self, p: Any = 0.5, *, generator: Any = None) -> Tensor:
        return bernoulli_(cast("Tensor", self), p)

    def multinomial(self, num_samples: int, replacement: bool = False, *, generator: Any = None) -> Tensor:
        """Category indices drawn from the weights of each row (torch.multinomial)."""
        return multinomial(cast("Tensor", self), num_samples, replacement)
