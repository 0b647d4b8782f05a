"""Tensor creation: from data, constants, ranges, identity, and counter-based random numbers (same on every device)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.core import dtype as dtypes
from ember.core.dtype import DType, to_dtype
from ember.core.graph import Node
from ember.core.movement import _shape_argument

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


def _device(device: Any) -> str:
    from ember.scheduler.devices import resolve_device

    return resolve_device(device)


def _numpy_from_data(data: Any, dtype: DType | None) -> np.ndarray:
    """Data as a numpy array with torch's dtype inference: Python floats are float32, ints int64."""
    from ember.core.tensor import Tensor

    if isinstance(data, Tensor):
        return data.numpy()
    if hasattr(data, "detach") and hasattr(data, "cpu") and hasattr(data, "numpy"):  # a torch tensor
        data = data.detach().cpu()
        if str(data.dtype) == "torch.bfloat16":
            data = data.float()
        data = data.numpy()
    if isinstance(data, np.ndarray) or isinstance(data, np.generic):
        array = np.asarray(data)
    else:
        try:
            array = np.array(data)
        except ValueError as error:
            raise ValueError(f"tensor(): could not make a tensor from ragged or mixed data: {error}") from None
        if array.dtype == np.float64 and dtype is None:
            array = array.astype(np.float32)
        elif array.dtype.kind == "i" and dtype is None:
            array = array.astype(np.int64)
        elif array.dtype == object or array.dtype.kind in "USO":
            raise TypeError(f"tensor(): could not make a tensor from data of type {type(data).__name__}")
    if array.dtype.kind == "c":
        raise TypeError("tensor(): complex numbers are not supported")
    return array


def node_from_data(data: Any, dtype: Any, device: Any) -> Node:
    """A realized BUFFER node holding a copy of data on a device."""
    from ember.scheduler.realize import buffer_node

    target = to_dtype(dtype) if dtype is not None else None
    array = _numpy_from_data(data, target)
    if target is None:
        target = dtypes.from_numpy(array.dtype)
    if target == dtypes.bfloat16:
        as_float = array.astype(np.float32)
        rounded = as_float.view(np.uint32) + 0x7FFF + ((as_float.view(np.uint32) >> 16) & 1)
        array = (rounded >> 16).astype(np.uint16)
    else:
        array = array.astype(target.numpy, copy=False)
    return buffer_node(np.ascontiguousarray(array).reshape(array.shape), target, _device(device))


def tensor(data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Copy data (nested lists, numbers, numpy arrays, torch tensors) into a new tensor, like torch.tensor."""
    from ember.core.tensor import Tensor

    return Tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)


def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    from ember.core.tensor import Tensor

    if isinstance(data, Tensor):
        return data.to(device=device, dtype=dtype) if (device or dtype) else data
    return tensor(data, dtype, device)


from_numpy = as_tensor


def full(size: Sequence[int], fill_value: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    from ember.core.tensor import Tensor

    shape = _shape_argument((size,)) if not isinstance(size, int) else (size,)
    if any(dim < 0 for dim in shape):
        raise ValueError(f"full: negative dimension in size {shape}")
    resolved = to_dtype(dtype) if dtype is not None else dtypes.scalar_dtype(fill_value)
    result = Tensor._full(shape, fill_value, resolved, _device(device))
    return result.requires_grad_() if requires_grad else result


def zeros(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full(_shape_argument(size), 0.0, dtype or dtypes.DEFAULT_FLOAT, device, requires_grad)


def ones(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full(_shape_argument(size), 1.0, dtype or dtypes.DEFAULT_FLOAT, device, requires_grad)


def empty(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return zeros(*size, dtype=dtype, device=device, requires_grad=requires_grad)


def full_like(other: Tensor, fill_value: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full(other.shape, fill_value, dtype or other.dtype, device or other.device, requires_grad)


def zeros_like(other: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full_like(other, 0, dtype, device, requires_grad)


def ones_like(other: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full_like(other, 1, dtype, device, requires_grad)


def empty_like(other: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full_like(other, 0, dtype, device, requires_grad)


def arange(start: Any, end: Any = None, step: Any = 1, dtype: Any = None, device: Any = None,
           requires_grad: bool = False) -> Tensor:
    """Values from start (inclusive) to end (exclusive) by step, like torch.arange."""
    from ember.core.tensor import Tensor

    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    is_float = any(isinstance(value, float) for value in (start, end, step))
    resolved = to_dtype(dtype) if dtype is not None else (dtypes.DEFAULT_FLOAT if is_float else dtypes.DEFAULT_INT)
    count = max(0, math.ceil((end - start) / step))
    index = Tensor._arange_primitive(count, dtypes.int64 if not resolved.is_float else resolved, _device(device))
    if not resolved.is_float:
        values = index * int(step) + int(start) if (step != 1 or start != 0) else index
    else:
        values = index * float(step) + float(start)
    result = values.cast(resolved)
    return result.requires_grad_() if requires_grad else result


def linspace(start: float, end: float, steps: int, dtype: Any = None, device: Any = None) -> Tensor:
    if steps < 0:
        raise ValueError(f"linspace: number of steps must be non-negative, got {steps}")
    resolved = to_dtype(dtype) if dtype is not None else dtypes.DEFAULT_FLOAT
    if steps == 1:
        return full((1,), start, resolved, device)
    index = arange(steps, dtype=dtypes.float64 if resolved == dtypes.float64 else dtypes.float32, device=device)
    step = (end - start) / (steps - 1)
    # torch computes the second half from the end for symmetry
    halfway = steps // 2
    values = (index < halfway).where(start + step * index, end - step * (steps - 1 - index))
    return values.cast(resolved)


def logspace(start: float, end: float, steps: int, base: float = 10.0, dtype: Any = None, device: Any = None) -> Tensor:
    return (linspace(start, end, steps, dtypes.float64 if dtype == dtypes.float64 else None, device) * math.log2(base)).exp2().cast(
        to_dtype(dtype) if dtype is not None else dtypes.DEFAULT_FLOAT
    )


def eye(rows: int, columns: int | None = None, dtype: Any = None, device: Any = None) -> Tensor:
    columns = rows if columns is None else columns
    if rows < 0 or columns < 0:
        raise ValueError(f"eye: sizes must be non-negative, got {rows} x {columns}")
    row_index = arange(rows, device=device).reshape(rows, 1)
    column_index = arange(columns, device=device).reshape(1, columns)
    return (row_index == column_index).cast(to_dtype(dtype) if dtype is not None else dtypes.DEFAULT_FLOAT)


def parse_to_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str | None, DType | None]:
    """The (device, dtype) of a Tensor.to(...) call."""
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    for value in args:
        if isinstance(value, DType) or (not isinstance(value, str) and value is not None and "dtype" in type(value).__name__.lower()):
            dtype = value
        elif isinstance(value, str):
            try:
                dtype = to_dtype(value) if value in dtypes.DTYPES_BY_NAME else None
            except TypeError:
                dtype = None
            if dtype is None:
                device = value
        elif hasattr(value, "device") and hasattr(value, "dtype"):
            device, dtype = value.device, value.dtype
    return (_device(device) if device is not None else None), (to_dtype(dtype) if dtype is not None else None)


# ---- random numbers ------------------------------------------------------------------------------------------


class RandomState:
    """The global seed and a counter of numbers drawn, so every call draws new numbers deterministically."""

    seed: int = 0
    counter: int = 0


def manual_seed(seed: int) -> None:
    """Seed ember's random numbers; the same seed gives the same numbers on every device."""
    RandomState.seed = int(seed) & 0xFFFFFFFF
    RandomState.counter = 0


def _random_bits(count: int, device: str) -> Tensor:
    """`count` pseudo-random uint32 values from a counter-based hash of (seed, draw counter, position)."""
    from ember.core.tensor import Tensor

    key = Tensor(np.array([RandomState.seed, RandomState.counter & 0xFFFFFFFF], dtype=np.uint32), device=device)
    RandomState.counter += count
    position = Tensor._arange_primitive(count, dtypes.uint32, device)
    seed, offset = key[0].expand(count), key[1].expand(count)
    state = (position + offset) * 0x9E3779B1 ^ seed
    for multiplier in (0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F):
        state = (state ^ (state >> 16)) * multiplier
        state = state ^ (seed * 0x165667B1)
    return state ^ (state >> 15)


def _uniform_unit(shape: tuple[int, ...], dtype: DType, device: str) -> Tensor:
    """Uniform floats in [0, 1) with 24 random bits."""
    count = math.prod(shape)
    bits = _random_bits(count, device)
    return ((bits >> 8).cast(dtypes.float32) * (1.0 / (1 << 24))).reshape(shape).cast(dtype)


def rand(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    shape = _shape_argument(size)
    resolved = to_dtype(dtype) if dtype is not None else dtypes.DEFAULT_FLOAT
    result = _uniform_unit(shape, resolved, _device(device))
    return result.requires_grad_() if requires_grad else result


def randn(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Standard normal numbers by the Box-Muller transform of two uniform draws."""
    shape = _shape_argument(size)
    resolved = to_dtype(dtype) if dtype is not None else dtypes.DEFAULT_FLOAT
    target = _device(device)
    first = _uniform_unit(shape, dtypes.float32, target)
    second = _uniform_unit(shape, dtypes.float32, target)
    radius = (-2.0 * (1.0 - first).log()).sqrt()
    result = (radius * (2 * math.pi * second).cos()).cast(resolved)
    return result.requires_grad_() if requires_grad else result


def randint(low: int, high: int | None = None, size: Sequence[int] = (), dtype: Any = None, device: Any = None) -> Tensor:
    if high is None:
        low, high = 0, low
    if high <= low:
        raise ValueError(f"randint: high ({high}) must be greater than low ({low})")
    shape = _shape_argument((size,)) if not isinstance(size, int) else (size,)
    uniform = _uniform_unit(shape, dtypes.float64 if high - low > (1 << 24) else dtypes.float32, _device(device))
    values = (uniform * (high - low)).floor().cast(dtypes.int64) + low
    return values.cast(to_dtype(dtype) if dtype is not None else dtypes.DEFAULT_INT)


def rand_like(other: Tensor, dtype: Any = None, device: Any = None) -> Tensor:
    return rand(other.shape, dtype=dtype or other.dtype, device=device or other.device)


def randn_like(other: Tensor, dtype: Any = None, device: Any = None) -> Tensor:
    return randn(other.shape, dtype=dtype or other.dtype, device=device or other.device)


def randperm(count: int, device: Any = None) -> Tensor:
    """A random permutation of 0..count-1 (rank of random keys; O(count^2) work, fine for moderate sizes)."""
    keys = rand(count, device=device)
    return (keys.unsqueeze(0) < keys.unsqueeze(1)).sum(1)


def normal(mean: float, std: float, size: Sequence[int], device: Any = None) -> Tensor:
    return randn(*size, device=device) * std + mean


def uniform(low: float, high: float, size: Sequence[int], device: Any = None) -> Tensor:
    return rand(*size, device=device) * (high - low) + low
