"""Tensor creation: from data, constants, ranges, identity, and counter-based random numbers (same on every device)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.core import dtype as dtypes
from ember.context import CONTEXT
from ember.core import runtime
from ember.core.dtype import DType, to_dtype
from ember.core.elementwise import where
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.graph import Node
from ember.core.graph_templates import TEMPLATES
from ember.core.movement import _shape_argument
from ember.core.ops import Op

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


def _device(device: Any) -> str:
    return runtime.RUNTIME.resolve_device(device)


def _checked_shape(size: Any, name: str) -> tuple[int, ...]:
    """A size given as f(2, 3), f((2, 3)) or f([2, 3]) as a tuple, or a ShapeError for a negative size."""
    shape = _shape_argument(size if isinstance(size, tuple) else (size,))
    if any(extent < 0 for extent in shape):
        raise ShapeError(f"{name}: negative dimension in size {shape}; sizes must be >= 0")
    return shape


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
    if isinstance(data, (np.ndarray, np.generic)):
        array = np.asarray(data)
    else:
        try:
            array = np.array(data)
        except ValueError as error:
            raise ValueError(f"tensor(): could not make a tensor from ragged or mixed data: {error}") from None
        if array.dtype == np.float64 and dtype is None and dtypes.DEFAULT_FLOAT is not dtypes.float64:
            array = array.astype(np.float32)  # then the default dtype (set_default_dtype), in node_from_data
        elif array.dtype.kind == "i" and dtype is None:
            array = array.astype(np.int64)
        elif array.dtype == object or array.dtype.kind in "USO":
            raise TypeError(f"tensor(): could not make a tensor from data of type {type(data).__name__}")
    if array.dtype.kind == "c":
        raise DTypeError("tensor(): complex numbers are not supported")
    return array


def _to_bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """float values rounded to bfloat16 (to nearest, ties to even; NaN stays NaN) as uint16 bits."""
    as_float = np.asarray(array, dtype=np.float32)
    bits = as_float.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(as_float), np.uint16(0x7FC0), rounded).astype(np.uint16)


def node_from_data(data: Any, dtype: Any, device: Any) -> Node:
    """A BUFFER leaf holding a private, read-only copy of data on the host; the scheduler allocates its device
    memory and uploads it when a kernel or a copy first uses it (creating a tensor allocates nothing)."""
    target = to_dtype(dtype) if dtype is not None else None
    source = _numpy_from_data(data, target)
    array = source
    if target is None:
        target = dtypes.from_numpy(array.dtype)
        if target.is_float and not isinstance(data, (np.ndarray, np.generic)) and not hasattr(data, "dtype"):
            target = dtypes.DEFAULT_FLOAT  # Python floats (torch.tensor([1.5]) has the default dtype)
    if target is dtypes.bfloat16:
        array = _to_bfloat16_bits(array)
    else:
        with np.errstate(over="ignore", invalid="ignore"):  # out-of-range values become inf, as in torch
            array = array.astype(target.numpy, copy=False)
    array = np.ascontiguousarray(array).reshape(array.shape)
    if np.may_share_memory(array, source):  # the caller's memory (a numpy array, a torch tensor) may change later
        array = array.copy()
    array.flags.writeable = False
    return Node(Op.BUFFER, (), array, tuple(array.shape), target, _device(device))


def tensor(data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Copy data (nested lists, numbers, numpy arrays, torch tensors) into a new tensor, like torch.tensor."""
    from ember.core.tensor import Tensor

    result = Tensor._from_node(node_from_data(data, dtype, device))
    return result.requires_grad_() if requires_grad else result


def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    from ember.core.tensor import Tensor

    if isinstance(data, Tensor):
        return data.to(device=device, dtype=dtype) if (device or dtype) else data
    return tensor(data, dtype, device)


from_numpy = as_tensor


def full(size: Sequence[int], fill_value: Any, dtype: Any = None, device: Any = None,
         requires_grad: bool = False) -> Tensor:
    """A tensor of `size` filled with fill_value; the dtype defaults to fill_value's (bool, int64 or float32)."""
    from ember.core.tensor import Tensor

    shape = _checked_shape(size, "full")
    if hasattr(fill_value, "item") and not isinstance(fill_value, (int, float, bool)):
        fill_value = fill_value.item()
    resolved = to_dtype(dtype) if dtype is not None else dtypes.scalar_dtype(fill_value)
    result = Tensor._full(shape, fill_value, resolved, _device(device))
    return result.requires_grad_() if requires_grad else result


def scalar_tensor(value: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A 0-d tensor holding a number, in the default float dtype unless dtype is given (torch.scalar_tensor)."""
    if hasattr(value, "item") and not isinstance(value, (int, float, bool)):
        value = value.item()
    if not isinstance(value, (int, float, bool, np.number, np.bool_)):
        raise TypeError(f"scalar_tensor(): argument 's' must be Number, not {type(value).__name__}")
    return full((), value, dtype if dtype is not None else dtypes.DEFAULT_FLOAT, device, requires_grad)


def zeros(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full(_checked_shape(size, "zeros"), 0, dtype or dtypes.DEFAULT_FLOAT, device, requires_grad)


def ones(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full(_checked_shape(size, "ones"), 1, dtype or dtypes.DEFAULT_FLOAT, device, requires_grad)


def empty(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Like torch.empty; ember's empty tensors hold zeros (a lazy constant costs no memory until used)."""
    return full(_checked_shape(size, "empty"), 0, dtype or dtypes.DEFAULT_FLOAT, device, requires_grad)


def empty_strided(size: Any, stride: Any, *, dtype: Any = None, device: Any = None,
                  requires_grad: bool = False, **options: Any) -> Tensor:
    """torch.empty_strided: an empty tensor of `size`; the strides must fit it but are not kept (ember's tensors
    are row-major values)."""
    shape = _checked_shape(tuple(size), "empty_strided")
    if len(tuple(stride)) != len(shape):
        raise ShapeError(f"empty_strided: mismatch in length of strides and shape ({len(tuple(stride))} strides "
                         f"for shape {shape})")
    return empty(shape, dtype=dtype, device=device, requires_grad=requires_grad)


def asarray(obj: Any, *, dtype: Any = None, device: Any = None, copy: bool | None = None,
            requires_grad: bool = False) -> Tensor:
    """torch.asarray: obj as a tensor (a tensor is returned as it is unless copy=True or a conversion is asked)."""
    from ember.core.tensor import Tensor

    if isinstance(obj, Tensor):
        result = obj.to(device=device, dtype=dtype) if (device or dtype) else obj
        result = result.clone() if copy and result is obj else result
    else:
        result = tensor(obj, dtype, device)
    return result.requires_grad_() if requires_grad and not result.requires_grad else result


def frombuffer(buffer: Any, *, dtype: Any, count: int = -1, offset: int = 0, requires_grad: bool = False) -> Tensor:
    """torch.frombuffer: a 1-d tensor of `count` elements of dtype read from an object with the buffer protocol,
    starting `offset` bytes in (copied: ember's tensors do not share memory with Python objects)."""
    resolved = to_dtype(dtype)
    view = memoryview(buffer).cast("B")
    if offset < 0 or offset > len(view):
        raise ValueError(f"frombuffer: offset {offset} must be between 0 and the buffer's {len(view)} bytes")
    available = (len(view) - offset) // resolved.itemsize
    count = available if count == -1 else count
    if count <= 0 or count > available:
        raise ValueError(f"frombuffer: asked for {count} elements of {resolved.name} from offset {offset}, but the "
                         f"buffer of {len(view)} bytes holds {available}")
    raw = np.frombuffer(view, dtype=np.uint8, count=count * resolved.itemsize, offset=offset)
    values = raw.view(resolved.numpy).copy()
    if resolved is dtypes.bfloat16:  # bfloat16's bits: widened to float32, which holds every such value exactly
        values = (values.astype(np.uint32) << 16).view(np.float32)
    result = tensor(values, dtype=resolved)
    return result.requires_grad_() if requires_grad else result


def full_like(other: Tensor, fill_value: Any, dtype: Any = None, device: Any = None,
              requires_grad: bool = False) -> Tensor:
    return full(other.shape, fill_value, dtype or other.dtype, device or other.device, requires_grad)


def zeros_like(other: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full_like(other, 0, dtype, device, requires_grad)


def ones_like(other: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full_like(other, 1, dtype, device, requires_grad)


def empty_like(other: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return full_like(other, 0, dtype, device, requires_grad)


def arange(start: Any, end: Any = None, step: Any = 1, dtype: Any = None, device: Any = None,
           requires_grad: bool = False) -> Tensor:
    """start, start + step, ... up to end (excluded), like torch.arange: ceil((end - start) / step) values,
    int64 unless an argument is a float (then float32)."""
    from ember.core.tensor import Tensor

    if end is None:
        start, end = 0, start
    start, end, step = (value.item() if hasattr(value, "item") else value for value in (start, end, step))
    if not all(math.isfinite(value) for value in (start, end, step)):
        raise ArgumentError(f"arange: start, end and step must be finite, got {start}, {end}, {step}")
    is_float = any(isinstance(value, float) for value in (start, end, step))
    resolved = to_dtype(dtype) if dtype is not None else (dtypes.DEFAULT_FLOAT if is_float else dtypes.DEFAULT_INT)
    if not resolved.is_float:  # torch converts the arguments to the integer dtype first
        start, end, step = int(start), int(end), int(step)
        is_float = False
    if step == 0:
        raise ArgumentError("arange: step must be nonzero")
    if (end - start) * step < 0:
        raise ArgumentError(f"arange: the range from {start} to {end} and the step {step} have opposite signs")
    count = max(0, math.ceil((end - start) / step))
    target = _device(device)
    if not is_float:
        index = Tensor._arange_primitive(count, dtypes.int64, target)
        values = index * int(step) + int(start) if (step != 1 or start != 0) else index
    else:
        compute = dtypes.float64 if resolved is dtypes.float64 else dtypes.float32
        index = Tensor._arange_primitive(count, compute, target)
        values = index * float(step) + float(start)
    result = values.cast(resolved)
    return result.requires_grad_() if requires_grad else result


def linspace(start: float, end: float, steps: int, dtype: Any = None, device: Any = None,
             requires_grad: bool = False) -> Tensor:
    """`steps` values evenly spaced from start to end (both included), computed symmetrically like torch."""
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool):
        raise TypeError(f"linspace: steps must be an int, got {type(steps).__name__}")
    if steps < 0:
        raise ArgumentError(f"linspace: number of steps must be non-negative, got {steps}")
    resolved = to_dtype(dtype) if dtype is not None else dtypes.DEFAULT_FLOAT
    compute = dtypes.float64 if resolved is dtypes.float64 else dtypes.float32
    if steps <= 1:
        result = full((steps,), start, compute, device).cast(resolved)
        return result.requires_grad_() if requires_grad else result
    index = arange(steps, dtype=compute, device=device)
    step = (end - start) / (steps - 1)
    halfway = steps // 2
    values = where(index < halfway, index * step + start, (steps - 1 - index) * -step + end)
    result = values.cast(resolved)
    return result.requires_grad_() if requires_grad else result


def logspace(start: float, end: float, steps: int, base: float = 10.0, dtype: Any = None,
             device: Any = None) -> Tensor:
    resolved = to_dtype(dtype) if dtype is not None else dtypes.DEFAULT_FLOAT
    exponents = linspace(start, end, steps, dtypes.float64 if resolved is dtypes.float64 else None, device)
    return (exponents * math.log2(base)).exp2().cast(resolved)


def eye(rows: int, columns: int | None = None, dtype: Any = None, device: Any = None,
        requires_grad: bool = False) -> Tensor:
    """The rows x columns identity matrix (ones on the main diagonal)."""
    columns = rows if columns is None else columns
    if rows < 0 or columns < 0:
        raise ShapeError(f"eye: sizes must be non-negative, got {rows} x {columns}")
    row_index = arange(rows, device=device).reshape(rows, 1)
    column_index = arange(columns, device=device).reshape(1, columns)
    result = (row_index == column_index).cast(to_dtype(dtype) if dtype is not None else dtypes.DEFAULT_FLOAT)
    return result.requires_grad_() if requires_grad else result


def parse_to_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str | None, DType | None]:
    """The (device, dtype) of a Tensor.to(...) call."""
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    for value in args:
        if isinstance(value, DType) or (
            not isinstance(value, str) and value is not None and "dtype" in type(value).__name__.lower()
        ):
            dtype = value
        elif isinstance(value, str):
            if value.replace("torch.", "").replace("ember.", "") in dtypes.DTYPES_BY_NAME:
                dtype = value
            else:
                device = value
        elif hasattr(value, "device") and hasattr(value, "dtype"):
            device, dtype = value.device, value.dtype
    return (_device(device) if device is not None else None), (to_dtype(dtype) if dtype is not None else None)


# ---- random numbers ------------------------------------------------------------------------------------------
#
# Counter-based: the n-th number drawn since manual_seed is a hash of (seed, n), computed with 32-bit integer ops
# only, so every device gives the same bits; floats are made from the bits exactly (an integer times a power of 2).

MANTISSA_BITS = {dtypes.float16: 11, dtypes.bfloat16: 8, dtypes.float32: 24}


class RandomState:
    """The global seed and a counter of numbers drawn, so every call draws new numbers deterministically."""

    seed: int = 0
    counter: int = 0


def manual_seed(seed: int) -> None:
    """Seed ember's random numbers; the same seed gives the same numbers on every device."""
    RandomState.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    RandomState.counter = 0


def initial_seed() -> int:
    """The seed the random numbers were last seeded with (torch.initial_seed)."""
    return RandomState.seed


def seed() -> int:
    """Seed the random numbers from the operating system's entropy and return the seed (torch.seed)."""
    import os

    value = int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
    manual_seed(value)
    return value


def _hash32(value: int) -> int:
    """A 32-bit integer hash with good avalanche (xor-shift-multiply), the same as _hash_tensor."""
    value &= 0xFFFFFFFF
    value ^= value >> 16
    value = (value * 0x7FEB352D) & 0xFFFFFFFF
    value ^= value >> 15
    value = (value * 0x846CA68B) & 0xFFFFFFFF
    return value ^ (value >> 16)


def _shift_right(state: Tensor, amount: int) -> Tensor:
    """uint32 state >> amount (0 < amount < 32): the primitive alone, without `>>`'s handling of amounts out of
    range (the per-op cost of random draws)."""
    return state._apply(Op.SHR, state._full(state.shape, amount, state.dtype, state.device))


def _hash_tensor(state: Tensor) -> Tensor:
    state = state ^ _shift_right(state, 16)
    state = state * 0x7FEB352D
    state = state ^ _shift_right(state, 15)
    state = state * 0x846CA68B
    return state ^ _shift_right(state, 16)


def random_key(seed: int, counter: int) -> np.ndarray:
    """The key of a draw whose first number is number `counter` of `seed`: (low 32 bits of the counter, two keys
    hashed from the seed and the counter's high bits), as uint32."""
    first_key = _hash32(seed ^ _hash32((seed >> 32) ^ 0x5BD1E995 ^ _hash32(counter >> 32)))
    second_key = _hash32(first_key ^ 0x27D4EB2F)
    return np.array([counter & 0xFFFFFFFF, first_key, second_key], dtype=np.uint32)


def _random_key(count: int, device: str) -> Tensor:
    """The key of the next draw of `count` numbers (a small host tensor, see random_key); the draw counter moves on
    and, under ember.jit, the recorder notes the draw (a replay writes the key of its own)."""
    from ember.core.tensor import Tensor

    counter = RandomState.counter
    RandomState.counter += count
    array = random_key(RandomState.seed, counter)  # (a fresh array of its own: no conversion, no copy)
    array.flags.writeable = False
    key = Tensor._from_node(Node(Op.BUFFER, (), array, (3,), dtypes.uint32, _device(device)))
    recorder = CONTEXT.get().recorder
    if recorder is not None:  # ember.jit: a replay writes the key of its own draw (recording.py)
        recorder.random_draw(key.node.arg, counter, count)
    return key


def _bits_of_key(key: Tensor, count: int) -> Tensor:
    """`count` pseudo-random uint32 values from a draw's key: a double hash of (draw counter + position) keyed by
    the seed."""
    from ember.core.tensor import Tensor

    device = key.node.device
    assert device is not None, "a draw's key is a leaf on its device"
    offset, first, second = (key._apply(Op.SHRINK, arg=((index, index + 1),))._broadcast((count,))
                             for index in range(3))
    position = Tensor._arange_primitive(count, dtypes.uint32, device) + offset
    return _hash_tensor(_hash_tensor(position ^ first) + second)


def _random_bits(count: int, device: str) -> Tensor:
    """`count` pseudo-random uint32 values (the graph of a draw of that size copied from its template)."""
    return TEMPLATES.instantiate(("random bits", count), lambda key: _bits_of_key(key, count),
                                 (_random_key(count, device),))


def _uniform(shape: tuple[int, ...], dtype: DType, device: str) -> Tensor:
    """Uniform floats in [0, 1): as many random bits as the dtype's mantissa holds, scaled exactly."""
    keys = _uniform_keys(math.prod(shape), dtype, device)
    return TEMPLATES.instantiate(("uniform", shape, dtype), lambda *keys: _uniform_of_keys(keys, shape, dtype), keys)


def _uniform_keys(count: int, dtype: DType, device: str) -> tuple[Tensor, ...]:
    """The keys of a uniform draw of `count` numbers of `dtype`: two for float64 (53 bits), one otherwise."""
    if dtype is dtypes.float64:
        return (_random_key(count, device), _random_key(count, device))
    return (_random_key(count, device),)


def dropout_mask(shape: tuple[int, ...], dtype: DType, p: float, device: str) -> Tensor:
    """What dropout multiplies by: 0 where an element is dropped (the uniform number `rand(shape)` draws is below
    p), 1 / (1 - p) elsewhere, in `dtype`; the same draw as rand's, copied as one template (a draw, a compare, a
    cast and a scale recorded op by op cost dropout two thirds of its time)."""
    draw = dtypes.DEFAULT_FLOAT
    keys = _uniform_keys(math.prod(shape), draw, device)
    return TEMPLATES.instantiate(("dropout mask", shape, draw, dtype, p),
                                 lambda *keys: (_uniform_of_keys(keys, shape, draw) >= p).cast(dtype) * (1.0 / (1.0 - p)),
                                 keys)


def _uniform_of_keys(keys: tuple[Tensor, ...], shape: tuple[int, ...], dtype: DType) -> Tensor:
    """_uniform's values from its draws' keys (two for float64, one otherwise)."""
    count = math.prod(shape)
    if dtype is dtypes.float64:
        high = _shift_right(_bits_of_key(keys[0], count), 6).cast(dtypes.float64)  # 26 bits
        low = _shift_right(_bits_of_key(keys[1], count), 5).cast(dtypes.float64)  # 27 bits
        return ((high * float(1 << 27) + low) * 2.0**-53)._reshaped(shape)
    bits = MANTISSA_BITS[dtype]
    values = _shift_right(_bits_of_key(keys[0], count), 32 - bits).cast(dtypes.float32) * 2.0**-bits
    return values._reshaped(shape).cast(dtype)


def _float_dtype(dtype: Any, name: str) -> DType:
    resolved = to_dtype(dtype) if dtype is not None else dtypes.DEFAULT_FLOAT
    if not resolved.is_float:
        raise DTypeError(f"{name}: random floats need a floating point dtype, got {resolved.name}")
    return resolved


def kept(draw: Tensor) -> Tensor:
    """A draw the user holds, as torch's: its values made once, by a kernel of their own the first time a realize
    needs them, and read from memory after (a CONTIGUOUS boundary, which the realize leaves stored as the tensor's
    buffer). Left lazy, a draw is computed again wherever it is read: a 64 x 784 randn input to a matmul of 512
    columns took 716 ms a realize (its normals recomputed for each column tile), stored 2 ms; a randperm, O(n^2), at
    every realize that read it. Draws the framework makes for one use (dropout's mask) stay fused."""
    return draw._apply(Op.CONTIGUOUS)


def rand(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Uniform random numbers in [0, 1), the same on every device for the same seed."""
    result = kept(_uniform(_checked_shape(size, "rand"), _float_dtype(dtype, "rand"), _device(device)))
    return result.requires_grad_() if requires_grad else result


def randn(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Standard normal random numbers, the same bits on every device for the same seed (see _standard_normal)."""
    shape = _checked_shape(size, "randn")
    resolved = _float_dtype(dtype, "randn")
    result = kept(_normal(shape, resolved, _device(device)))
    return result.requires_grad_() if requires_grad else result


def _normal(shape: tuple[int, ...], dtype: DType, device: str) -> Tensor:
    """Standard normal numbers of `shape`, lazy (randn keeps them; an in-place fill keeps what it makes of them)."""
    return _standard_normal(math.prod(shape), device, dtype)._reshaped(shape)


# fixed-point constants (Q30: value * 2**30) for _standard_normal
Q = 30
ONE = 1 << Q
LN_2_Q = round(math.log(2.0) * ONE)
SQRT_2_Q = round(math.sqrt(2.0) * ONE)
HALF_PI_Q = round(math.pi / 2 * ONE)


def _fixed(value: Tensor, constant: int) -> Tensor:
    return value._full(value.shape, constant, dtypes.int64, value.device)


def _fixed_multiply(first: Tensor, second: Tensor) -> Tensor:
    """The product of two Q30 numbers (both below 2**31.5 in magnitude, so the int64 product cannot overflow)."""
    return (first * second)._apply(Op.SHR, _fixed(first, Q))


def _standard_normal(count: int, device: str, dtype: DType) -> Tensor:
    """Box-Muller, z = sqrt(-2 ln u) * cos(2 pi v), in int64 fixed point: integer operations give the same bits on
    every device (float libm functions differ in the last place between C and OpenCL). The result is a multiple
    of 2**-24 converted exactly; cos(2 pi v) is drawn as +-cos(pi/2 w), which has the same distribution."""
    keys = (_random_key(count, device), _random_key(count, device))  # (drawn in this order: u's first)
    return TEMPLATES.instantiate(("standard normal", count, dtype),
                                 lambda first, second: _normal_of_keys(first, second, count, dtype), keys)


def _normal_of_keys(first_key: Tensor, second_key: Tensor, count: int, dtype: DType) -> Tensor:
    """_standard_normal's values from its two draws' keys."""
    first = _bits_of_key(first_key, count).cast(dtypes.int64) + 1  # u = first / 2**32 in (0, 1]
    second = _bits_of_key(second_key, count).cast(dtypes.int64)
    # ln u = ln(m) + (e - 32) ln 2 with first = m * 2**e, m in [1/sqrt 2, sqrt 2)
    exponent = _fixed(first, 0)
    for step in (32, 16, 8, 4, 2, 1):
        above = _fixed(first, 0) < first._apply(Op.SHR, exponent + step)
        exponent = where(above, exponent + step, exponent)
    mantissa = (first._apply(Op.SHL, _fixed(first, Q)))._apply(Op.SHR, exponent)  # Q30, in [1, 2)
    large = _fixed(first, SQRT_2_Q) < mantissa
    mantissa = where(large, mantissa._apply(Op.SHR, _fixed(first, 1)), mantissa)
    exponent = where(large, exponent + 1, exponent)
    # ln m = 2 atanh(s), s = (m - 1) / (m + 1) in (-0.172, 0.172): 6 odd terms reach 1e-10
    x = mantissa - ONE
    ratio = x._apply(Op.SHL, _fixed(x, Q))._apply(Op.IDIV, x + 2 * ONE)
    ratio_squared = _fixed_multiply(ratio, ratio)
    term, series = ratio, ratio
    for odd in (3, 5, 7, 9, 11):
        term = _fixed_multiply(term, ratio_squared)
        series = series + term._apply(Op.IDIV, _fixed(term, odd))
    radius_squared = series * -4 + (32 - exponent) * (2 * LN_2_Q)  # -2 ln u in Q30, in [0, 44.4]
    # radius = floor(sqrt(radius_squared * 2**18)) in Q24: a float estimate, a Newton step, then exact +-1 fixes
    target = radius_squared._apply(Op.SHL, _fixed(radius_squared, 18))
    radius = target.cast(dtypes.float32).sqrt().cast(dtypes.int64) + 1  # devices may differ here, not below
    radius = (radius + target._apply(Op.IDIV, radius))._apply(Op.SHR, _fixed(radius, 1))
    radius = where(target < radius * radius, radius - 1, radius)
    radius = where((radius + 1) * (radius + 1) <= target, radius + 1, radius)
    # cos(pi/2 w) for w in [0, 1) from 30 bits, sign from another bit: Horner on 1 - t/2 (1 - t/12 (1 - ...))
    angle = _fixed_multiply(second._apply(Op.AND, _fixed(second, ONE - 1)), _fixed(second, HALF_PI_Q))
    angle_squared = _fixed_multiply(angle, angle)
    cosine = _fixed(second, ONE)
    for denominator in (18 * 17, 16 * 15, 14 * 13, 12 * 11, 10 * 9, 8 * 7, 6 * 5, 4 * 3, 2 * 1):
        cosine = ONE - _fixed_multiply(angle_squared, cosine)._apply(Op.IDIV, _fixed(cosine, denominator))
    negative = _fixed(second, 0) < second._apply(Op.AND, _fixed(second, ONE))
    cosine = where(negative, -cosine, cosine)
    normal = (radius * cosine)._apply(Op.SHR, _fixed(radius, Q))  # Q24
    result = normal.cast(dtypes.float64 if dtype is dtypes.float64 else dtypes.float32) * 2.0**-24
    return result.cast(dtype)


def randint(low: int, high: Any = None, size: Any = None, dtype: Any = None, device: Any = None,
            requires_grad: bool = False) -> Tensor:
    """Random integers in [low, high), uniform, like torch.randint(high, size) or randint(low, high, size)."""
    if size is None:
        if not isinstance(high, (tuple, list)):
            raise TypeError("randint: expected randint(high, size) or randint(low, high, size) with size a tuple")
        low, high, size = 0, low, high
    elif high is None:
        low, high = 0, low
    low, high = int(low), int(high)
    if high <= low:
        raise ArgumentError(f"randint: high ({high}) must be greater than low ({low})")
    shape = _checked_shape(tuple(size) if isinstance(size, (tuple, list)) else (size,), "randint")
    resolved = to_dtype(dtype) if dtype is not None else dtypes.DEFAULT_INT
    if requires_grad:
        raise DTypeError("randint: only floating point tensors can require gradients")
    target = _device(device)
    span = high - low
    count = math.prod(shape)
    if span <= 1 << 32:  # multiply-shift: floor(bits * span / 2^32), exact in 64-bit integers
        bits = _random_bits(count, target).cast(dtypes.uint64)
        offsets = (bits * span) >> 32
    else:  # 64 random bits modulo the span (bias below span / 2^64)
        high_bits = _random_bits(count, target).cast(dtypes.uint64) << 32
        offsets = (high_bits | _random_bits(count, target).cast(dtypes.uint64)) % span
    values = offsets.cast(dtypes.int64) + low
    return kept(values.reshape(shape).cast(resolved))


def rand_like(other: Tensor, dtype: Any = None, device: Any = None) -> Tensor:
    return rand(other.shape, dtype=dtype or other.dtype, device=device or other.device)


def randn_like(other: Tensor, dtype: Any = None, device: Any = None) -> Tensor:
    return randn(other.shape, dtype=dtype or other.dtype, device=device or other.device)


def randint_like(other: Tensor, low: int, high: int | None = None, dtype: Any = None, device: Any = None) -> Tensor:
    if high is None:
        low, high = 0, low
    return randint(low, high, other.shape, dtype=dtype or other.dtype, device=device or other.device)


def randperm(count: int, dtype: Any = None, device: Any = None) -> Tensor:
    """A random permutation of 0..count-1 (one O(count^2) kernel, fine up to a few thousand)."""
    if count < 0:
        raise ShapeError(f"randperm: count must be non-negative, got {count}")
    permutation = _permutation_from_keys(_random_bits(count, _device(device)))
    return kept(permutation.cast(to_dtype(dtype)) if dtype is not None else permutation)


def _permutation_from_keys(keys: Tensor) -> Tensor:
    """Each position's rank among the 1-d keys, ties broken by position: always a permutation of 0..n-1."""
    from ember.core.tensor import Tensor

    count = keys.shape[0]
    row, column = keys.reshape(count, 1), keys.reshape(1, count)
    position = Tensor._arange_primitive(count, dtypes.int64, keys.device)
    earlier = position.reshape(1, count) < position.reshape(count, 1)
    before = (column < row).logical_or((column == row).logical_and(earlier))
    return before.sum(1)


def normal(mean: float, std: float, size: Sequence[int], device: Any = None) -> Tensor:
    return randn(*size, device=device) * std + mean


def uniform(low: float, high: float, size: Sequence[int], device: Any = None) -> Tensor:
    return rand(*size, device=device) * (high - low) + low
