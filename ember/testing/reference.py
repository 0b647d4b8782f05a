"""The numpy reference tensor: every primitive op evaluated eagerly with ember's semantics, for tests and the fuzzer.

`ReferenceTensor` implements the primitive interface of `ember.core.tensor.Tensor` (`_apply`, `_full`,
`_arange_primitive`, `shape`, `dtype`, `device`, ...) and reuses the same op mixins, so any graph written with the
Tensor API runs eagerly in numpy, without the kernelizer, the IR or a backend. Semantics follow `ember/core/ops.py`:
integer division truncates and x // 0 gives 0, MOD is C's remainder and x % 0 gives 0, MAX propagates NaN, CAST
from float to int truncates, ADD/MUL/MAX on bool are or/and/or, and float16/bfloat16 values are computed in float32
and rounded to their type whenever a result is stored (here: after every op). The Tensor methods check indices and
integer divisors before those primitives (core/checks.py): here at once, raising the errors ember's Tensor raises.

`perturbation(scale, seed)` makes float results carry random relative noise of `scale` units in the last place of
their dtype (Monte Carlo arithmetic): comparing several perturbed runs tells which output elements are sensitive to
rounding, so the fuzzer can compare ember exactly where the answer is certain and loosely where it is not.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from ember.core import dtype as dtypes
from ember.core.aliases import numpy_argument_names
from ember.core.in_place import in_place_variants
from ember.core.dtype import DType, to_dtype
from ember.core.elementwise import ElementwiseOps
from ember.core.errors import DTypeError
from ember.core.functional import FunctionalOps
from ember.core.graph import infer
from ember.core.indexing import IndexingOps
from ember.core.linalg import LinalgOps
from ember.core.movement import MovementOps
from ember.core.ops import FLOAT_ONLY_OPS, INT_ONLY_OPS, Op
from ember.core.reductions import ReductionOps
from ember.core.shapes import Shape, prod

REFERENCE_DEVICE = "reference"
HALF_TYPES = (dtypes.float16, dtypes.bfloat16)
UNIT_ROUNDOFF = {dtypes.float16: 2.0**-11, dtypes.bfloat16: 2.0**-8, dtypes.float32: 2.0**-24, dtypes.float64: 2.0**-53}


# ---- value representation --------------------------------------------------------------------------------------


def value_numpy_dtype(dtype: DType) -> np.dtype:
    """The numpy dtype a reference tensor holds its values in (bfloat16 as float32 values on the bfloat16 grid)."""
    return np.dtype(np.float32) if dtype == dtypes.bfloat16 else dtype.numpy


def compute_numpy_dtype(dtype: DType) -> np.dtype:
    """The numpy dtype ops compute in: float32 for the half types, the dtype itself otherwise."""
    return np.dtype(np.float32) if dtype in HALF_TYPES else dtype.numpy


def round_to_bfloat16(array: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even; NaN stays NaN), still held as float32."""
    values = np.asarray(array, dtype=np.float32)
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    result = (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(values), values, result)


class HalfRounding:
    """Whether op results of the half types are rounded to their type (see `halves_unrounded`)."""

    per_op: bool = True


def store(array: np.ndarray, dtype: DType, always: bool = False) -> np.ndarray:
    """A computed array converted to how values of `dtype` are held (rounding the half types)."""
    if dtype in HALF_TYPES and not (HalfRounding.per_op or always):
        return np.asarray(array).astype(np.float32)
    if dtype == dtypes.bfloat16:
        return round_to_bfloat16(np.asarray(array).astype(np.float32))
    with np.errstate(over="ignore"):  # a float too large for the dtype becomes inf, as on the devices
        return np.asarray(array).astype(dtype.numpy, copy=False)


@contextlib.contextmanager
def halves_unrounded() -> Iterator[None]:
    """Within this block, float16/bfloat16 results stay in float32 (inputs are still rounded).

    ember rounds a half value only when a kernel stores it, so where it is rounded depends on fusion; a run with
    every intermediate rounded and one with none bracket what ember may compute."""
    previous = HalfRounding.per_op
    HalfRounding.per_op = False
    try:
        yield
    finally:
        HalfRounding.per_op = previous


def bits_of(values: np.ndarray, dtype: DType) -> np.ndarray:
    """The raw bits of held values as an array of dtype.numpy (bfloat16 as uint16)."""
    if dtype == dtypes.bfloat16:
        return (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.asarray(values).astype(dtype.numpy, copy=False)


def from_bits(bits: np.ndarray, dtype: DType) -> np.ndarray:
    """Held values of `dtype` from raw bits (an array whose itemsize matches the dtype)."""
    if dtype == dtypes.bfloat16:
        return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return bits.view(dtype.numpy)


# ---- the primitive table ---------------------------------------------------------------------------------------


class Output(NamedTuple):
    """What a primitive computes: the result's shape and dtype, and the dtypes of its sources."""

    shape: Shape
    dtype: DType
    source_dtypes: tuple[DType, ...]


Primitive = Callable[[list[np.ndarray], Any, Output], np.ndarray]


def _wrapped(value: Any, dtype: DType) -> Any:
    """An integer constant wrapped into its dtype's range (as C converts it: -1 as uint8 is 255)."""
    if not dtype.is_int:
        return value
    low = int(dtypes.min_value(dtype))
    return (int(value) - low) % (1 << dtype.bits) + low


def _constant(value: Any, output: Output) -> np.ndarray:
    return np.full(output.shape, _wrapped(value, output.dtype), compute_numpy_dtype(output.dtype))


def _integer_division(a: np.ndarray, b: np.ndarray, unsigned: bool) -> np.ndarray:
    """a / b rounded toward zero; x / 0 gives 0; MIN / -1 wraps to MIN (two's complement, as PyTorch)."""
    zero = b == 0
    if unsigned:
        return np.where(zero, 0, a // np.where(zero, 1, b)).astype(a.dtype)
    minus_one = b == -1
    safe = np.where(zero | minus_one, 1, b).astype(a.dtype)
    floored = np.floor_divide(a, safe)
    inexact = (a - floored * safe) != 0
    truncated = np.where(inexact & ((a < 0) != (safe < 0)), floored + 1, floored)
    return np.where(zero, 0, np.where(minus_one, np.negative(a), truncated)).astype(a.dtype)


def _idiv(sources: list[np.ndarray], _: Any, output: Output) -> np.ndarray:
    return _integer_division(sources[0], sources[1], output.dtype.is_unsigned)


def _mod(sources: list[np.ndarray], _: Any, output: Output) -> np.ndarray:
    a, b = sources
    quotient = _integer_division(a, b, output.dtype.is_unsigned)
    return np.where(b == 0, 0, a - quotient * b).astype(a.dtype)


def _bool_or(operation: Callable[..., np.ndarray]) -> Primitive:
    """An arithmetic op that is logical or on bool (True + True is True, as in PyTorch)."""
    return lambda s, _, output: np.logical_or(s[0], s[1]) if output.dtype.is_bool else operation(s[0], s[1])


def _not_bool(name: str, operation: Primitive) -> Primitive:
    def checked(sources: list[np.ndarray], arg: Any, output: Output) -> np.ndarray:
        if output.source_dtypes[0].is_bool:
            raise DTypeError(f"reference: the primitive {name} is not defined on bool")
        return operation(sources, arg, output)

    return checked


def _cast(sources: list[np.ndarray], target: DType, output: Output) -> np.ndarray:
    value, source = sources[0], output.source_dtypes[0]
    if target.is_bool:
        return value != 0
    if target == dtypes.bfloat16:  # through float32, as the C renderer does
        return value.astype(np.float32)
    if source.is_float and target.is_int:
        return np.trunc(value).astype(target.numpy)
    return value.astype(target.numpy if target != dtypes.float16 else np.float16)


def _bitcast(sources: list[np.ndarray], target: DType, output: Output) -> np.ndarray:
    source = output.source_dtypes[0]
    bits = bits_of(store(sources[0], source), source)
    return from_bits(np.ascontiguousarray(bits).view(target.numpy if target != dtypes.bfloat16 else np.uint16), target)


def _pad(sources: list[np.ndarray], arg: Any, output: Output) -> np.ndarray:
    amounts, fill = arg
    return np.pad(sources[0], tuple(tuple(pair) for pair in amounts), mode="constant", constant_values=fill)


def _shrink(sources: list[np.ndarray], arg: Any, _: Output) -> np.ndarray:
    return sources[0][tuple(slice(start, end) for start, end in arg)]


def _reduce_max(sources: list[np.ndarray], axes: Any, output: Output) -> np.ndarray:
    value = sources[0]
    return np.maximum.reduce(value, axis=tuple(axes), keepdims=True, initial=dtypes.min_value(output.dtype))


PRIMITIVES: dict[Op, Primitive] = {
    # sources
    Op.BUFFER: lambda s, arg, output: np.asarray(arg),
    Op.CONST: lambda s, arg, output: _constant(arg, output),
    Op.ARANGE: lambda s, arg, output: np.arange(output.shape[0]).astype(compute_numpy_dtype(output.dtype)),
    Op.COPY: lambda s, arg, output: s[0],
    Op.CONTIGUOUS: lambda s, arg, output: s[0].copy(),
    # unary
    Op.NEG: _not_bool("NEG", lambda s, arg, output: np.negative(s[0])),
    Op.RECIPROCAL: lambda s, arg, output: np.reciprocal(s[0]),
    Op.SQRT: lambda s, arg, output: np.sqrt(s[0]),
    Op.EXP2: lambda s, arg, output: np.exp2(s[0]),
    Op.LOG2: lambda s, arg, output: np.log2(s[0]),
    Op.SIN: lambda s, arg, output: np.sin(s[0]),
    Op.TRUNC: lambda s, arg, output: np.trunc(s[0]),
    Op.NOT: lambda s, arg, output: np.logical_not(s[0]) if output.dtype.is_bool else np.invert(s[0]),
    Op.CAST: _cast,
    Op.BITCAST: _bitcast,
    # binary
    Op.ADD: _bool_or(np.add),
    Op.SUB: _not_bool("SUB", lambda s, arg, output: np.subtract(s[0], s[1])),
    Op.MUL: lambda s, arg, output: np.logical_and(s[0], s[1]) if output.dtype.is_bool else np.multiply(s[0], s[1]),
    Op.DIV: lambda s, arg, output: np.divide(s[0], s[1]),
    Op.IDIV: _idiv,
    Op.MOD: _mod,
    Op.MAX: _bool_or(np.maximum),
    Op.CMPLT: lambda s, arg, output: np.less(s[0], s[1]),
    Op.CMPEQ: lambda s, arg, output: np.equal(s[0], s[1]),
    Op.AND: lambda s, arg, output: np.bitwise_and(s[0], s[1]),
    Op.OR: lambda s, arg, output: np.bitwise_or(s[0], s[1]),
    Op.XOR: lambda s, arg, output: np.bitwise_xor(s[0], s[1]),
    Op.SHL: lambda s, arg, output: np.left_shift(s[0], s[1]),
    Op.SHR: lambda s, arg, output: np.right_shift(s[0], s[1]),
    # ternary
    Op.WHERE: lambda s, arg, output: np.where(s[0], s[1], s[2]),
    # reductions (the reduced axes are kept with size 1; sums of integers wrap in their own dtype)
    Op.SUM: lambda s, axes, output: np.add.reduce(s[0], axis=tuple(axes), keepdims=True, dtype=s[0].dtype),
    Op.PROD: lambda s, axes, output: np.multiply.reduce(s[0], axis=tuple(axes), keepdims=True, dtype=s[0].dtype),
    Op.REDUCE_MAX: _reduce_max,
    # movement
    Op.RESHAPE: lambda s, shape, output: s[0].reshape(shape),
    Op.EXPAND: lambda s, shape, output: np.broadcast_to(s[0], shape),
    Op.PERMUTE: lambda s, order, output: np.transpose(s[0], order),
    Op.PAD: _pad,
    Op.SHRINK: _shrink,
    Op.FLIP: lambda s, axes, output: np.flip(s[0], axis=tuple(axes)),
}

NOISY_OPS = frozenset(
    {Op.CONST, Op.RECIPROCAL, Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN, Op.CAST, Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.SUM,
     Op.PROD}
)


def evaluate(op: Op, sources: Sequence[np.ndarray], arg: Any, output: Output) -> np.ndarray:
    """One primitive on held values; the result is held in output.dtype's representation."""
    if op in FLOAT_ONLY_OPS and not output.source_dtypes[0].is_float:
        raise DTypeError(f"reference: the primitive {op.name} needs float sources, got {output.source_dtypes[0].name}")
    if op in INT_ONLY_OPS and not output.source_dtypes[0].is_int:
        name = output.source_dtypes[0].name
        raise DTypeError(f"reference: the primitive {op.name} needs integer sources, got {name}")
    computed = [
        np.asarray(source).astype(compute_numpy_dtype(dtype), copy=False)
        for source, dtype in zip(sources, output.source_dtypes)
    ]
    with np.errstate(all="ignore"):
        result = np.asarray(PRIMITIVES[op](computed, arg, output))
        noise = Perturbation.current
        if noise is not None and output.dtype.is_float and op in NOISY_OPS:
            result = noise.apply(op, result, computed, arg, output.dtype)
        return store(result, output.dtype)


class Perturbation:
    """Random relative noise on every rounded float result (see `perturbation`)."""

    current: Perturbation | None = None

    def __init__(self, scale: float, seed: int) -> None:
        self.scale = scale
        self.generator = np.random.default_rng(seed)

    def apply(self, op: Op, result: np.ndarray, sources: list[np.ndarray], arg: Any, dtype: DType) -> np.ndarray:
        unit = self.scale * UNIT_ROUNDOFF[dtype]
        noise = self.generator.uniform(-1.0, 1.0, size=result.shape)
        if op is Op.SUM:  # sequential accumulation: an error of about sqrt(n) roundings of the running sum
            count = max(1, prod([sources[0].shape[axis] for axis in arg]))
            magnitude = np.add.reduce(np.abs(sources[0]).astype(np.float64), axis=tuple(arg), keepdims=True)
            return (result + noise * unit * math.sqrt(count) * magnitude).astype(result.dtype)
        if op is Op.PROD:
            unit *= math.sqrt(max(1, prod([sources[0].shape[axis] for axis in arg])))
        return (result * (1.0 + noise * unit)).astype(result.dtype)


@contextlib.contextmanager
def perturbation(scale: float, seed: int) -> Iterator[None]:
    """Within this block, float results of rounding primitives get relative noise of `scale` units in the last place."""
    previous = Perturbation.current
    Perturbation.current = Perturbation(scale, seed)
    try:
        yield
    finally:
        Perturbation.current = previous


# ---- the tensor ------------------------------------------------------------------------------------------------


@numpy_argument_names
@in_place_variants
class ReferenceTensor(ElementwiseOps, ReductionOps, MovementOps, IndexingOps, LinalgOps, FunctionalOps):
    """An eager numpy tensor with the Tensor API: every method is the same composition of primitives as in ember."""

    __slots__ = ("array", "_dtype", "_device", "requires_grad", "grad")
    __array_priority__ = 1000

    def __init__(self, data: Any, dtype: DType | str | None = None, device: str | None = None,
                 requires_grad: bool = False) -> None:
        from ember.core.creation import _numpy_from_data

        target = to_dtype(dtype) if dtype is not None else None
        if isinstance(data, ReferenceTensor):
            array, source = data.array, data.dtype
            target = target or source
            if target != source:
                array = evaluate(Op.CAST, [array], target, Output(data.shape, target, (source,)))
        else:
            array = _numpy_from_data(data, target)
            target = target or dtypes.from_numpy(array.dtype)
            array = store(array.astype(np.float32) if target == dtypes.bfloat16 else array, target, always=True)
        self.array: np.ndarray = np.asarray(array)
        self._dtype = target
        self._device = device if device is not None else REFERENCE_DEVICE
        self.requires_grad = requires_grad
        self.grad: ReferenceTensor | None = None

    @classmethod
    def _from_array(cls, array: np.ndarray, dtype: DType, device: str) -> ReferenceTensor:
        tensor = cls.__new__(cls)
        tensor.array, tensor._dtype, tensor._device = np.asarray(array), dtype, device
        tensor.requires_grad, tensor.grad = False, None
        return tensor

    # ---- the primitive interface the op mixins are written against --------------------------------------------
    # TensorBase declares the primitives and the mixins' methods as returning `Tensor`, meaning "the concrete tensor
    # class"; here that class is ReferenceTensor, which mypy cannot see as a Tensor: hence the ignore[override]s
    # on the primitives and the ignore[assignment]s where a mixin's result is kept as a ReferenceTensor.

    def _apply(self, op: Op, *others: ReferenceTensor, arg: Any = None) -> ReferenceTensor:  # type: ignore[override]  # see the note above
        """Evaluate one primitive op on self and others now."""
        for other in others:
            if not isinstance(other, ReferenceTensor):
                raise TypeError(f"reference: {op.name} got a {type(other).__name__} operand; mix only ReferenceTensors")
        sources = (self, *others)
        shape, result_dtype = infer(op, sources, arg)  # type: ignore[arg-type]  # duck-typed: infer reads .shape and .dtype
        output = Output(shape, result_dtype, tuple(source.dtype for source in sources))
        result = evaluate(op, [source.array for source in sources], arg, output)
        assert result.shape == shape, (op, result.shape, shape)
        return ReferenceTensor._from_array(result, result_dtype, self._device)

    def _checked(self, invalid: ReferenceTensor, describe: Any,  # type: ignore[override]  # see the note above _apply
                 named: ReferenceTensor | None) -> ReferenceTensor:
        """A value check (core/checks.py), evaluated now: raises describe(first invalid position, value there)."""
        bad = np.flatnonzero(invalid.array.reshape(-1))
        if bad.size:
            position = int(bad[0])
            raise describe(position, None if named is None else int(named.array.reshape(-1)[position]))
        return self

    @classmethod
    def _full(cls, shape: Shape, value: Any, dtype: DType, device: str) -> ReferenceTensor:  # type: ignore[override]  # see the note above _apply
        value = bool(value) if dtype.is_bool else int(value) if dtype.is_int else float(value)
        output = Output(tuple(shape), dtype, ())
        return cls._from_array(evaluate(Op.CONST, [], value, output), dtype, device)

    @classmethod
    def _arange_primitive(cls, count: int, dtype: DType, device: str) -> ReferenceTensor:  # type: ignore[override]  # see the note above _apply
        return cls._from_array(evaluate(Op.ARANGE, [], None, Output((count,), dtype, ())), dtype, device)

    # ---- properties and conversion ----------------------------------------------------------------------------

    @property
    def shape(self) -> Shape:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def device(self) -> str:
        return self._device

    @property
    def ndim(self) -> int:
        return self.array.ndim

    def dim(self) -> int:
        return self.array.ndim

    def numel(self) -> int:
        return prod(self.shape)

    def size(self, dim: int | None = None) -> Shape | int:
        from ember.core.shapes import normalize_dim

        return self.shape if dim is None else self.shape[normalize_dim(dim, self.ndim, "size")]

    def element_size(self) -> int:
        return self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __hash__(self) -> int:
        return id(self)

    def realize(self) -> ReferenceTensor:
        return self

    def contiguous(self) -> ReferenceTensor:
        return self._apply(Op.CONTIGUOUS)

    def clone(self) -> ReferenceTensor:  # type: ignore[override]  # see the note above _apply
        return self._apply(Op.CONTIGUOUS)

    def detach(self) -> ReferenceTensor:  # type: ignore[override]  # see the note above _apply
        return ReferenceTensor._from_array(self.array, self.dtype, self.device)

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values, as Tensor.numpy() gives them (bfloat16 as float32)."""
        return np.array(self.array, copy=True)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.numpy()
        return array.astype(dtype) if dtype is not None else array

    def item(self) -> bool | int | float:
        if self.numel() != 1:
            raise ValueError(f"item(): only one-element tensors can be converted to Python scalars, got {self.shape}")
        return self.array.reshape(()).item()

    def tolist(self) -> Any:
        return self.array.tolist()

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"the truth value of a tensor with {self.numel()} elements is ambiguous")
        return bool(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __index__(self) -> int:
        if self.dtype.is_float or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __repr__(self) -> str:
        return f"ReferenceTensor({self.array!r}, dtype={self.dtype.name})"

    def to(self, *args: Any, **kwargs: Any) -> ReferenceTensor:
        """`to(dtype)`; device names are accepted and kept as a label (the reference has one device)."""
        result = self
        for value in (*args, kwargs.get("dtype"), kwargs.get("device")):
            if value is None:
                continue
            try:
                dtype = to_dtype(value)
            except TypeError:
                result = ReferenceTensor._from_array(result.array, result.dtype, str(value))
                continue
            result = result.cast(dtype)  # type: ignore[assignment]  # a ReferenceTensor (see above _apply)
        return result

    def cpu(self) -> ReferenceTensor:
        return self

    def requires_grad_(self, requires_grad: bool = True) -> ReferenceTensor:
        self.requires_grad = requires_grad
        return self

    def assign(self, value: ReferenceTensor) -> ReferenceTensor:  # type: ignore[override]  # see the note above _apply
        """Replace this tensor's values in place (shape and dtype kept), as Tensor.assign does."""
        if value.shape != self.shape:
            value = value.expand(self.shape)  # type: ignore[assignment]  # a ReferenceTensor (see above _apply)
        if value.dtype != self.dtype:
            value = value.cast(self.dtype)  # type: ignore[assignment]  # a ReferenceTensor (see above _apply)
        self.array = value.array
        return self

    def _assign_view(self, value: ReferenceTensor) -> ReferenceTensor:  # type: ignore[override]  # see the note above _apply
        """Rebind to value, a view with another shape (the in-place view ops), as Tensor._assign_view does."""
        self.array = value.array
        return self


def reference_tensor(data: Any, dtype: DType | str | None = None) -> ReferenceTensor:
    """A reference tensor from data, like ember.tensor."""
    return ReferenceTensor(data, dtype=dtype)
