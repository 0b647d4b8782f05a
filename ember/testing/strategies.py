"""Hypothesis strategies for the fuzzer: random programs of Tensor ops over random shapes, dtypes and values.

A program is built one call at a time. Each call is evaluated on the reference tensor as it is drawn, so the
generator knows every value's shape, dtype and contents. Shapes and dims are drawn to fit (operands broadcast with
each other, dims and indices exist, crops stay inside, a maximum is never taken over nothing); dtype combinations a
user would get an error for (sub on bools, mean of integers) are drawn and then skipped, and float-to-integer casts
of values outside the target range (undefined in C) get a clamp. A drawing error is a bug of the fuzzer: the
runner reports it as one (tests/test_fuzz.py generates many seeds to keep it so). Draws are ordered so that
Hypothesis shrinks toward short chains of simple ops on small shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.errors import EmberError
from ember.core.shapes import broadcast_shapes, prod
from ember.testing.large import large_programs
from ember.testing.program import Call, Program, Ref, Source, run_node
from ember.testing.reference import REFERENCE_DEVICE, ReferenceTensor

MAX_ELEMENTS = 256  # per value: keeps reductions short and failures printable
MAX_INPUT_ELEMENTS = 48
USER_ERRORS = (EmberError, TypeError, ValueError, IndexError, NotImplementedError)

FLOAT_VALUES = [0.0, 1.0, -1.0, 0.5, 2.0, -2.5, 3.0, -0.25, 1.5, -3.5, 4.0, 0.75, -1.25, 0.1, -0.3, 7.0, 1e-3, 100.0,
                -0.0, 0.3333333333, -6.0, 12.5]
FLOAT_SPECIALS = [math.nan, math.inf, -math.inf, 1e30, -1e-30, 65504.0, 3e38]
NON_FINITE = [math.nan, math.inf, -math.inf]
INT_VALUES = [0, 1, -1, 2, -2, 3, 5, -7, 8, -8, 4, 6, 9, -3, 100, -100, 31, 17]
SIZES = [1, 2, 3, 4, 5, 1, 2, 3, 7, 0]  # small dims, 1 often, 0 (empty) rarely; shrinks toward 1

FLOAT_UNARY = [
    "__neg__", "abs", "exp", "relu", "sqrt", "log", "exp2", "log2", "sin", "cos", "sigmoid", "tanh", "reciprocal",
    "rsqrt", "trunc", "floor", "ceil", "round", "square", "sign", "isnan", "isinf", "isfinite", "logical_not", "gelu",
    "silu", "softplus", "erf", "frac", "expm1", "log1p", "leaky_relu", "elu", "nan_to_num", "__invert__",
]
BINARY = [
    "__add__", "__mul__", "__sub__", "maximum", "minimum", "__truediv__", "__lt__", "__eq__", "__gt__", "__le__",
    "__ge__", "__ne__", "__floordiv__", "__mod__", "fmod", "__and__", "__or__", "__xor__", "logical_and",
    "logical_or", "logical_xor", "__pow__", "__lshift__", "__rshift__", "__radd__", "__rsub__", "__rmul__",
    "__rtruediv__",
]
INTEGER_DIVISIONS = frozenset({"__floordiv__", "__mod__", "fmod"})
REDUCTIONS = [
    "sum", "amax", "mean", "amin", "prod", "any", "all", "argmax", "argmin", "logsumexp", "var", "std", "cumsum",
    "softmax", "log_softmax", "max", "min",
]
SINGLE_DIM = frozenset({"argmax", "argmin", "cumsum", "softmax", "log_softmax"})
EXTREMES = frozenset({"amax", "amin", "max", "min", "argmax", "argmin"})  # undefined over an empty dim
MOVEMENT = ["reshape", "permute", "expand", "pad", "getitem", "flip", "transpose", "squeeze", "unsqueeze", "flatten",
            "narrow", "contiguous", "realize"]


def scalar_values(dtype: DType) -> list[Any]:
    """Plain values that fit a dtype."""
    if dtype.is_bool:
        return [False, True]
    if dtype.is_float:
        return FLOAT_VALUES
    low, high = dtypes.min_value(dtype), dtypes.max_value(dtype)
    return [value for value in INT_VALUES if low <= value <= high]


def extreme_values(dtype: DType) -> list[Any]:
    """Values at the edges of a dtype (overflow, NaN, infinities)."""
    if dtype.is_bool:
        return []
    if dtype.is_float:
        return FLOAT_SPECIALS
    low, high = int(dtypes.min_value(dtype)), int(dtypes.max_value(dtype))
    return [high, low, high - 1, low + 1]


@st.composite
def shapes(draw: st.DrawFn, max_rank: int = 5, max_elements: int = MAX_INPUT_ELEMENTS) -> tuple[int, ...]:
    """A shape of rank 0 to max_rank with small dims (1 often, 0 rarely) and a bounded element count."""
    rank = draw(st.integers(0, max_rank))
    shape: list[int] = []
    for _ in range(rank):
        size = draw(st.sampled_from(SIZES))
        if prod(shape) * max(size, 1) > max_elements:
            size = 1
        shape.append(size)
    return tuple(shape)


@st.composite
def arrays(draw: st.DrawFn, dtype: DType, shape: tuple[int, ...], nonzero: bool = False) -> np.ndarray:
    """Values for a tensor: mostly plain values; sometimes with the dtype's extremes (NaN, inf, MIN, MAX), and for
    floats sometimes with many NaN and infinities, so that they reach every op on every device. The modes shrink
    toward plain values. `nonzero`: no zeros (an integer divisor)."""
    values = scalar_values(dtype)
    mode = draw(st.integers(0, 9))
    if mode >= 8:
        values = values * 3 + extreme_values(dtype)
    elif mode >= 6 and dtype.is_float:
        values = NON_FINITE + values[:5]  # about half the values: most such tensors hold NaN and an infinity
    if nonzero:
        values = [value for value in values if value != 0]
    holder = np.float32 if dtype == dtypes.bfloat16 else dtype.numpy
    return draw(hnp.arrays(holder, shape, elements=st.sampled_from(values)))


class ProgramBuilder:
    """A program under construction, with the reference value of every node."""

    def __init__(self, allowed_dtypes: tuple[DType, ...]) -> None:
        self.program = Program()
        self.values: list[ReferenceTensor] = []
        self.allowed_dtypes = allowed_dtypes
        self.stopped = False
        self.excluded: frozenset[str] = frozenset()  # methods never to draw
        self.other_devices: tuple[str, ...] = ()  # devices values may be moved to

    def add_source(self, source: Source) -> int:
        self.program.nodes.append(source)
        self.values.append(_run_reference(source, self.values))
        return len(self.values) - 1

    def add_call(self, call: Call) -> int | None:
        """Append `call` if the reference accepts it and return its index.

        None if it is a user error or makes too large a value (not appended), or if the reference crashed on it:
        then the call is kept as the program's last value, so the check reports the crash, and drawing stops."""
        try:
            value = _run_reference(call, self.values)
        except USER_ERRORS:
            return None
        except Exception:  # noqa: BLE001 - a crash of the reference itself: keep the call so the check reports it
            self.program.nodes.append(call)
            self.values.append(None)  # type: ignore[arg-type]
            self.stopped = True
            return None
        if not isinstance(value, ReferenceTensor) or value.numel() > MAX_ELEMENTS:
            return None
        self.program.nodes.append(call)
        self.values.append(value)
        return len(self.values) - 1

    def pick(self, draw: st.DrawFn) -> int:
        """A value to work on: the latest one by default (shrinking makes chains)."""
        return len(self.values) - 1 - draw(st.integers(0, len(self.values) - 1))

    def dtype(self, draw: st.DrawFn, like: DType | None = None) -> DType:
        """A dtype for a new source: the same as `like` by default, else any allowed one."""
        choices = ([like] if like is not None else []) + list(self.allowed_dtypes)
        return draw(st.sampled_from(choices))


def _run_reference(node: Any, values: list[ReferenceTensor]) -> ReferenceTensor:
    return run_node(node, values, ReferenceMaker())


class ReferenceMaker:
    """Sources as reference tensors."""

    def tensor(self, values: np.ndarray, dtype: DType, requires_grad: bool = False) -> ReferenceTensor:
        return ReferenceTensor(values, dtype=dtype)

    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> ReferenceTensor:
        return ReferenceTensor._full(shape, value, dtype, REFERENCE_DEVICE)

    def arange(self, count: int, dtype: DType) -> ReferenceTensor:
        return ReferenceTensor._arange_primitive(count, dtype, REFERENCE_DEVICE)


# ---- sources -----------------------------------------------------------------------------------------------------


def draw_source(draw: st.DrawFn, builder: ProgramBuilder, dtype: DType, shape: tuple[int, ...]) -> int:
    """A new source of a dtype and shape: data mostly, sometimes a constant or a range."""
    kind = draw(st.sampled_from(["tensor", "tensor", "tensor", "full", "arange"]))
    if kind == "arange" and len(shape) != 1:
        kind = "tensor"
    if kind == "full":
        fill = draw(st.sampled_from(scalar_values(dtype)))
        return builder.add_source(Source("full", dtype, shape, fill=fill))
    if kind == "arange":
        return builder.add_source(Source("arange", dtype, shape))
    return builder.add_source(Source("tensor", dtype, shape, values=draw(arrays(dtype, shape))))


@st.composite
def broadcast_shape(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with `shape`: each dim kept or 1, then leading dims dropped or one new one added.

    A new leading dim goes in front of all of `shape`'s dims (only when none were dropped), so it never lines up
    with one of them."""
    result = [draw(st.sampled_from([size, 1])) for size in shape]
    change = draw(st.sampled_from(["none", "none", "none", "drop", "none", "add"]))  # shrinks to "none"
    if change == "drop":
        result = result[draw(st.integers(0, len(result))):]
    elif change == "add" and len(result) < 5:
        result = [draw(st.sampled_from([2, 1, 3]))] + result
    return tuple(result)


def draw_operand(draw: st.DrawFn, builder: ProgramBuilder, target: int, want_dtype: DType | None = None,
                 broadcast_with: tuple[int, ...] | None = None) -> Any:
    """A second operand for a binary op on values[target]: an existing value, a new source, or a Python scalar.

    A tensor operand broadcasts with `broadcast_with` (default: the target's shape)."""
    value = builder.values[target]
    shape = value.shape if broadcast_with is None else broadcast_with
    kind = draw(st.sampled_from(["source", "scalar", "existing"]))
    if kind == "scalar":
        dtype = want_dtype or draw(st.sampled_from([value.dtype, dtypes.float32, dtypes.int64, dtypes.bool_]))
        scalar = draw(st.sampled_from(scalar_values(dtype) + extreme_values(dtype)[:3]))
        return scalar
    if kind == "existing":
        compatible = [
            index for index, other in enumerate(builder.values)
            if other is not None and broadcastable(other.shape, shape)
        ]
        if compatible:
            return Ref(draw(st.sampled_from(compatible[::-1])))
    new_shape = draw(broadcast_shape(shape))
    dtype = want_dtype or builder.dtype(draw, like=value.dtype)
    return Ref(draw_source(draw, builder, dtype, new_shape))


def broadcastable(first: tuple[int, ...], second: tuple[int, ...]) -> bool:
    """Whether two shapes broadcast together (each trailing pair of dims equal or one of them 1)."""
    return all(a == b or a == 1 or b == 1 for a, b in zip(reversed(first), reversed(second)))


# ---- calls by kind ---------------------------------------------------------------------------------------------------


def unary(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    method = draw(st.sampled_from(FLOAT_UNARY))
    builder.add_call(Call(target, method))


def binary(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    value = builder.values[target]
    method = draw(st.sampled_from(BINARY))
    if method in ("__lshift__", "__rshift__"):
        if value.dtype.is_float:
            return
        bits = 64 if value.dtype.is_bool else value.dtype.bits
        builder.add_call(Call(target, method, (draw(st.integers(0, bits - 1)),)))
        return
    if method == "__pow__" and not value.dtype.is_float:
        builder.add_call(Call(target, method, (draw(st.integers(0, 4)),)))
        return
    if method in INTEGER_DIVISIONS and not value.dtype.is_float:
        # an integer divisor holding 0 raises (torch's ZeroDivisionError), and such a call is dropped as a user
        # error: draw a divisor without zeros half the time, so that integer //, % and fmod keep being tested
        if draw(st.booleans()):
            shape = draw(broadcast_shape(value.shape))
            values = draw(arrays(value.dtype, shape, nonzero=True))
            divisor = builder.add_source(Source("tensor", value.dtype, shape, values=values))
            builder.add_call(Call(target, method, (Ref(divisor),)))
            return
    operand = draw_operand(draw, builder, target)
    if method == "__pow__" and isinstance(operand, Ref) and not builder.values[operand.index].dtype.is_float:
        return
    if method.startswith("__r") and isinstance(operand, Ref):
        method = "__" + method[3:]
    builder.add_call(Call(target, method, (operand,)))


def where(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    """torch's `input.where(condition, other)`: target is the condition (when bool) or the input."""
    value = builder.values[target]
    if value.dtype.is_bool and draw(st.booleans()):
        condition = target
        selected = draw_source(draw, builder, draw(st.sampled_from(builder.allowed_dtypes)),
                               draw(broadcast_shape(value.shape)))
    else:
        condition = draw_source(draw, builder, dtypes.bool_, draw(broadcast_shape(value.shape)))
        selected = target
    both = broadcast_shapes(builder.values[condition].shape, builder.values[selected].shape)
    other = draw_operand(draw, builder, selected, broadcast_with=both)  # broadcasts with the condition too
    if isinstance(other, Ref) and draw(st.booleans()):
        selected, other = other.index, Ref(selected)
    builder.add_call(Call(selected, "where", (Ref(condition), other)))


def cast(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    value = builder.values[target]
    dtype = draw(st.sampled_from(builder.allowed_dtypes))
    if value.dtype.is_float and dtype.is_int and not _safe_to_truncate(value.numpy(), dtype):
        low, high = _safe_range(dtype)
        clamped = builder.add_call(Call(target, "clamp", (low, high)))
        if clamped is None:
            return
        finite = builder.add_call(Call(clamped, "nan_to_num", (0.0,)))
        if finite is None:
            return
        target = finite
    method = draw(st.sampled_from(["to", "cast"]))
    builder.add_call(Call(target, method, (dtype,)))


def _safe_range(dtype: DType) -> tuple[float, float]:
    if dtype.itemsize >= 4:
        bound = 2.0**20
        return (0.0 if dtype.is_unsigned else -bound, bound)
    return float(dtypes.min_value(dtype)), float(dtypes.max_value(dtype))


def _safe_to_truncate(array: np.ndarray, dtype: DType) -> bool:
    values = array.astype(np.float64)
    if not np.all(np.isfinite(values)):
        return False
    low, high = _safe_range(dtype)
    margin = 0.01 * max(1.0, high - low)
    return bool(values.size == 0 or (values.min() > low - 1 + margin and values.max() < high - margin))


def reshape(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    shape = list(builder.values[target].shape)
    for _ in range(draw(st.integers(1, 3))):
        edit = draw(st.sampled_from(["merge", "split", "insert", "remove"]))
        if edit == "merge" and len(shape) >= 2:
            at = draw(st.integers(0, len(shape) - 2))
            shape[at: at + 2] = [shape[at] * shape[at + 1]]
        elif edit == "split" and shape:
            at = draw(st.integers(0, len(shape) - 1))
            divisors = [d for d in range(1, shape[at] + 1) if shape[at] % d == 0] or [1]
            first = draw(st.sampled_from(divisors))
            shape[at: at + 1] = [first, shape[at] // first if first else 0]
        elif edit == "insert" and len(shape) < 6:
            shape.insert(draw(st.integers(0, len(shape))), 1)
        elif edit == "remove" and 1 in shape:
            shape.remove(1)
    if shape and draw(st.integers(0, 4)) == 4 and 0 not in shape:
        shape[draw(st.integers(0, len(shape) - 1))] = -1
    builder.add_call(Call(target, "reshape", (tuple(shape),)))


def movement(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    value = builder.values[target]
    shape, rank = value.shape, value.ndim
    method = draw(st.sampled_from(MOVEMENT))
    if method == "reshape":
        reshape(draw, builder, target)
    elif method == "permute":
        builder.add_call(Call(target, "permute", (tuple(draw(st.permutations(range(rank)))),)))
    elif method == "expand":
        new = [draw(st.sampled_from([1, 2, 3, 4])) if size == 1 else size for size in shape]
        lead = [draw(st.sampled_from([2, 1, 3])) for _ in range(draw(st.integers(0, 2)))]
        builder.add_call(Call(target, "expand", (tuple(lead + new),)))
    elif method == "pad" and rank:
        pad(draw, builder, target)
    elif method == "getitem" and rank:
        getitem(draw, builder, target)
    elif method == "flip" and rank:
        axes = draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank))
        builder.add_call(Call(target, "flip", (tuple(axes),)))
    elif method == "transpose" and rank:
        first, second = draw(st.integers(-rank, rank - 1)), draw(st.integers(-rank, rank - 1))
        builder.add_call(Call(target, "transpose", (first, second)))
    elif method == "squeeze":
        dims = [axis for axis, size in enumerate(shape) if size == 1]
        args: tuple[int, ...] = ()
        if len(dims) > 0 and draw(st.booleans()):
            args = (draw(st.sampled_from(dims)),)
        builder.add_call(Call(target, "squeeze", args))
    elif method == "unsqueeze":
        builder.add_call(Call(target, "unsqueeze", (draw(st.integers(-rank - 1, rank)),)))
    elif method == "flatten" and rank:
        start = draw(st.integers(0, rank - 1))
        builder.add_call(Call(target, "flatten", (start, draw(st.integers(start, rank - 1)))))
    elif method == "narrow" and rank:
        axis = draw(st.integers(0, rank - 1))
        start = draw(st.integers(0, shape[axis]))
        builder.add_call(Call(target, "narrow", (axis, start, draw(st.integers(0, shape[axis] - start)))))
    elif method in ("contiguous", "realize"):
        builder.add_call(Call(target, method))


def pad(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    """torch-style pad of the last k dims, with negative (cropping) amounts."""
    value = builder.values[target]
    dims = draw(st.integers(1, value.ndim))
    amounts: list[int] = []
    for axis in range(value.ndim - 1, value.ndim - 1 - dims, -1):
        size = value.shape[axis]
        before = draw(st.integers(-size, 3))
        after = draw(st.integers(-(size - max(0, -before)), 3))
        amounts += [before, after]
    fill = draw(st.sampled_from([0, *scalar_values(value.dtype)[1:4]]))
    builder.add_call(Call(target, "pad", (tuple(amounts),), (("value", fill),) if fill != 0 else ()))


def getitem(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    """Basic indexing: ints, slices with positive steps, None and Ellipsis (then the parts index the last dims)."""
    value = builder.values[target]
    count = draw(st.integers(1, value.ndim))
    ellipsis = draw(st.integers(0, 4)) == 4 and count < value.ndim
    parts: list[Any] = [Ellipsis] if ellipsis else []
    for size in (value.shape[value.ndim - count:] if ellipsis else value.shape[:count]):
        kind = draw(st.sampled_from(["slice", "slice", "int", "none", "all"]))
        if kind == "int" and size:
            parts.append(draw(st.integers(-size, size - 1)))
        elif kind == "none":
            parts.append(None)
            parts.append(slice(None))
        elif kind == "all":
            parts.append(slice(None))
        else:
            start = draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
            stop = draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
            step = draw(st.sampled_from([None, 1, 2, 3]))
            parts.append(slice(start, stop, step))
    builder.add_call(Call(target, "__getitem__", (tuple(parts),)))


def reduction(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    value = builder.values[target]
    method = draw(st.sampled_from(REDUCTIONS))
    rank = value.ndim
    keepdim = draw(st.booleans())
    # a maximum or minimum of nothing (or its index) is an error: those reduce only dims that are not empty
    axes = nonempty_axes(value.shape) if method in EXTREMES else list(range(rank))
    dims_allowed = [*axes, *(axis - rank for axis in axes)] if rank else [0, -1]
    whole_allowed = method not in EXTREMES or value.numel() > 0
    if method in SINGLE_DIM:
        if method in ("argmax", "argmin") and draw(st.integers(0, 3)) == 3 and whole_allowed:
            builder.add_call(Call(target, method, (), (("keepdim", keepdim),)))
            return
        if not dims_allowed:
            return
        dim: Any = draw(st.sampled_from(dims_allowed))
        kwargs = (("keepdim", keepdim),) if method in ("argmax", "argmin") else ()
        builder.add_call(Call(target, method, (dim,), kwargs))
        return
    if method in ("max", "min"):
        if whole_allowed:
            builder.add_call(Call(target, method))
        return
    if (draw(st.integers(0, 4)) == 4 or rank == 0) and whole_allowed:
        if method == "logsumexp":  # it has no form without dims: name them all
            builder.add_call(Call(target, method, (tuple(range(rank)) if rank else 0,), (("keepdim", keepdim),)))
        else:
            builder.add_call(Call(target, method, (), (("keepdim", keepdim),)))
        return
    if not rank or not axes:
        return
    dims = draw(st.lists(st.sampled_from(dims_allowed), min_size=1, max_size=len(axes), unique_by=lambda a: a % rank))
    dim = dims[0] if len(dims) == 1 and draw(st.booleans()) else tuple(dims)
    if method == "prod":
        dim = dims[0]
    builder.add_call(Call(target, method, (dim,), (("keepdim", keepdim),)))


def nonempty_axes(shape: tuple[int, ...]) -> list[int]:
    """The axes of a shape whose size is not 0 (the ones a maximum or minimum may reduce)."""
    return [axis for axis, size in enumerate(shape) if size]


def matmul_operand_shape(draw: st.DrawFn, shape: tuple[int, ...], columns: int) -> tuple[int, ...]:
    """A right operand's shape for `a @ b` with `a` of `shape` (rank 1 or more): a matrix, a vector, or a batch of
    matrices whose batch dim broadcasts with `a`'s."""
    inner = shape[-1]
    form = draw(st.sampled_from(["matrix", "vector", "batched"]))
    if form == "vector":
        return (inner,)
    if form == "matrix":
        return (inner, columns)
    batch = draw(st.sampled_from([shape[-3], 1])) if len(shape) >= 3 else 2
    return (batch, inner, columns)


def matmul(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    value = builder.values[target]
    if value.ndim == 0 or value.dtype.is_bool:  # matmul takes two numbers of one dtype
        return
    shape = matmul_operand_shape(draw, value.shape, draw(st.sampled_from([1, 3, 2, 5, 0])))
    other = draw_source(draw, builder, value.dtype, shape)
    builder.add_call(Call(target, "__matmul__", (Ref(other),)))


def combination(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    """The combinations the kernelizer must get right: a view of a reduce, and views of padded views."""
    value = builder.values[target]
    rank = value.ndim
    if rank == 0:
        return
    method = draw(st.sampled_from(["sum", "amax", "mean", "amin"]))
    allowed = nonempty_axes(value.shape) if method in EXTREMES else list(range(rank))
    if not allowed:
        method, allowed = "sum", list(range(rank))
    axes = tuple(sorted(set(draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=rank)))))
    form = draw(st.sampled_from(["pad", "expand", "reshape", "permute_padded", "broadcast_back"]))
    if form == "permute_padded":
        amounts: list[int] = []
        for size in reversed(value.shape):  # torch's order: the last dim's (before, after) first
            before = draw(st.integers(-min(1, size), 2))
            amounts += [before, draw(st.integers(-min(1, size + min(0, before)), 2))]  # crops stay inside the dim
        padded = builder.add_call(Call(target, "pad", (tuple(amounts),)))
        if padded is not None:
            builder.add_call(Call(padded, "permute", (tuple(draw(st.permutations(range(rank)))),)))
        return
    reduced = builder.add_call(Call(target, method, (axes,), (("keepdim", form != "reshape"),)))
    if reduced is None:
        return
    if form == "pad":
        pad(draw, builder, reduced)
    elif form == "expand":
        builder.add_call(Call(reduced, "expand", (value.shape,)))
    elif form == "reshape":
        reshape(draw, builder, reduced)
    else:  # the reduce result used with the original's view, like softmax
        builder.add_call(Call(target, draw(st.sampled_from(["__sub__", "__add__", "__mul__"])), (Ref(reduced),)))


def join(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    """cat along an existing dim (parts of other sizes there) or stack along a new one."""
    value = builder.values[target]
    rank = value.ndim
    others = []
    for _ in range(draw(st.integers(1, 2))):
        if draw(st.booleans()) or rank == 0:
            others.append(Ref(target))
        else:
            shape = list(value.shape)
            shape[draw(st.integers(0, rank - 1))] = draw(st.sampled_from([1, 2, 0, 3]))
            others.append(Ref(draw_source(draw, builder, builder.dtype(draw, like=value.dtype), tuple(shape))))
    if draw(st.booleans()) and rank:
        axes = [axis for axis in range(rank) if all(
            builder.values[other.index].shape[:axis] + builder.values[other.index].shape[axis + 1:]
            == value.shape[:axis] + value.shape[axis + 1:] for other in others)]
        if axes:
            builder.add_call(Call(target, "cat", (others, draw(st.sampled_from(axes)))))
        return
    same = [other for other in others if builder.values[other.index].shape == value.shape]
    builder.add_call(Call(target, "stack", (same, draw(st.integers(-rank - 1, rank)))))


KINDS: dict[str, Callable[[st.DrawFn, ProgramBuilder, int], None]] = {
    "unary": unary,
    "binary": binary,
    "movement": movement,
    "reduction": reduction,
    "combination": combination,
    "where": where,
    "cast": cast,
    "matmul": matmul,
    "join": join,
}


@st.composite
def programs(draw: st.DrawFn, allowed_dtypes: tuple[DType, ...], max_calls: int = 8,
             extra_outputs: bool = True, other_devices: tuple[str, ...] = ()) -> Program:
    """A random program: sources of allowed dtypes and up to max_calls calls of any kind in any order.

    The last value is an output, and unless extra_outputs is False (a switch for working around a known bug) up to
    two other values are too, realized in the same call. With other_devices, calls also move values to those
    devices (and ops then mix devices)."""
    builder = ProgramBuilder(allowed_dtypes)
    builder.other_devices = other_devices
    first_dtype = draw(st.sampled_from(allowed_dtypes))
    draw_source(draw, builder, first_dtype, draw(shapes()))
    for _ in range(draw(st.integers(1, max_calls))):
        if builder.stopped:
            break
        kind = draw(st.sampled_from(list(KINDS) + (["transfer"] if other_devices else [])))
        if kind == "transfer":
            builder.add_call(Call(builder.pick(draw), "to", (draw(st.sampled_from(other_devices)),)))
        else:
            KINDS[kind](draw, builder, builder.pick(draw))
    last = len(builder.values) - 1
    extra = draw(st.lists(st.integers(0, last), max_size=2, unique=True)) if extra_outputs else []
    outputs = tuple(dict.fromkeys([last, *extra]))
    builder.program.outputs = outputs
    return builder.program


@st.composite
def fuzz_examples(draw: st.DrawFn, allowed_dtypes: tuple[DType, ...], max_calls: int = 8, extra_outputs: bool = True,
                  other_devices: tuple[str, ...] = (), large_percent: int = 0) -> Program:
    """What the fuzzer checks: a large program (large.py) for `large_percent` of the examples, else a small one.

    The choice is drawn first and shrinks toward 0 (a small program). Large programs are float32, which every
    device runs."""
    if large_percent and dtypes.float32 in allowed_dtypes and draw(st.integers(0, 99)) >= 100 - large_percent:
        return draw(large_programs())
    return draw(programs(allowed_dtypes, max_calls, extra_outputs, other_devices))
