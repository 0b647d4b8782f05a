"""Elementwise Tensor methods: casting, dtype promotion, arithmetic, comparisons, selection, as primitives."""

from __future__ import annotations

import builtins
import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast, overload

import numpy as np

from ember.core import dtype as dtypes
from ember.core.arithmetic import (
    float_floor_divide,
    integer_floor_divide,
    float_fmod,
    float_pow,
    integer_pow,
    pow_scalar_exponent,
    signs_differ,
)
from ember.core.binary_math import BinaryMathOps
from ember.core.checks import check_divisor
from ember.core.dtype import PYTHON_SCALARS, DType, can_cast, combine_result_types, to_dtype
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.logic import LogicOps
from ember.core.ops import Composite, Op
from ember.core.shapes import broadcast_shapes
from ember.core.special_functions import SpecialFunctionOps
from ember.core.trigonometry import TrigonometryOps
from ember.core.unary_math import UnaryMathOps

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

Number = int | float | bool


class ElementwiseOps(UnaryMathOps, TrigonometryOps, SpecialFunctionOps, BinaryMathOps, LogicOps):
    """Mixin: every elementwise method. Needs `_apply`, `_full`, `shape`, `dtype`, `device` from the class."""

    __slots__ = ()

    # ---- operands: PyTorch's type promotion and broadcasting ------------------------------------------------------

    def _scalar_like(self, value: Number, dtype: DType) -> Tensor:
        return self._full((), value, dtype, self.device)

    def _operands(self, other: Any, op_name: str, reverse: bool = False) -> tuple[Tensor, Tensor]:
        """self and other (a Tensor, a Python number or array-like data) promoted to their torch.result_type and
        broadcast to one shape; swapped when `reverse` (for the reflected operators)."""
        # (no typing.cast calls on the per-op path: annotations and type: ignore instead)
        if isinstance(other, ElementwiseOps) and other.dtype is self.dtype:
            # two tensors of one dtype (torch's result type is that dtype): only a broadcast, if the shapes differ
            left: Tensor = self  # type: ignore[assignment]
            right: Tensor = other  # type: ignore[assignment]
            if other.shape != self.shape:
                shape = broadcast_shapes(self.shape, other.shape, op=op_name)
                left, right = left._broadcast(shape), right._broadcast(shape)
        elif (type(other) is float or type(other) is int) and self.dtype.is_float or (
            type(other) is int and self.dtype.is_int
        ):
            # the common `x + 1`: what _align decides for a float tensor and a Python number, or an integer tensor
            # and a Python int (the tensor's dtype, as torch), without its lists
            left = self  # type: ignore[assignment]
            right = left._full(left.shape, other, left.dtype, left.device)
        else:
            left, right = _align(cast("Tensor", self), (cast("Tensor", self), other), op_name)
        return (right, left) if reverse else (left, right)

    def _binary(self, op: Op, other: Any, op_name: str, reverse: bool = False) -> Tensor:
        left, right = self._operands(other, op_name, reverse)
        return left._apply(op, right)

    def _float_operand(self) -> Tensor:
        """self cast to the default float dtype when it is an integer or bool (like torch's unary float ops)."""
        return cast("Tensor", self) if self.dtype.is_float else self.cast(dtypes.DEFAULT_FLOAT)

    # ---- casting ----------------------------------------------------------------------------------------------

    def cast(self, dtype: DType | str) -> Tensor:
        """The values converted to dtype (floats to integers truncate toward zero; anything nonzero is True)."""
        dtype = to_dtype(dtype)
        if dtype is self.dtype:
            return cast("Tensor", self)
        if dtype.is_bool:
            return self != 0
        if self.dtype.is_bool:
            one, zero = self._full(self.shape, 1, dtype, self.device), self._full(self.shape, 0, dtype, self.device)
            return where(cast("Tensor", self), one, zero)
        return self._apply(Op.CAST, arg=dtype)

    def type(self, dtype: DType | str) -> Tensor:
        return self.cast(dtype)

    def float(self) -> Tensor:
        return self.cast(dtypes.float32)

    def double(self) -> Tensor:
        return self.cast(dtypes.float64)

    def half(self) -> Tensor:
        return self.cast(dtypes.float16)

    def bfloat16(self) -> Tensor:
        return self.cast(dtypes.bfloat16)

    def int(self) -> Tensor:
        return self.cast(dtypes.int32)

    def long(self) -> Tensor:
        return self.cast(dtypes.int64)

    def short(self) -> Tensor:
        return self.cast(dtypes.int16)

    def char(self) -> Tensor:
        return self.cast(dtypes.int8)

    def byte(self) -> Tensor:
        return self.cast(dtypes.uint8)

    def bool(self) -> Tensor:
        return self.cast(dtypes.bool_)

    def bitcast(self, dtype: DType | str) -> Tensor:
        """The same bits read as another dtype of the same size (torch's Tensor.view(dtype))."""
        dtype = to_dtype(dtype)
        if dtype.itemsize != self.dtype.itemsize:
            raise DTypeError(
                f"bitcast: {self.dtype.name} ({self.dtype.itemsize} bytes) and {dtype.name} ({dtype.itemsize} bytes) "
                f"differ in size; only same-size bitcasts are supported"
            )
        return cast("Tensor", self) if dtype is self.dtype else self._apply(Op.BITCAST, arg=dtype)

    view_as_dtype = bitcast

    # ---- arithmetic -------------------------------------------------------------------------------------------

    def add(self, other: Any, alpha: Number = 1) -> Tensor:
        """self + alpha * other; on bool tensors addition is logical or (like torch)."""
        if alpha != 1:
            other = other * alpha
        left, right = self._operands(other, "add")
        return left._apply(Op.OR if left.dtype.is_bool else Op.ADD, right)

    def sub(self, other: Any, alpha: Number = 1) -> Tensor:
        """self - alpha * other; bool operands raise (use logical_xor or ~, as torch says)."""
        _check_no_bool_subtraction(cast("Tensor", self), other)
        return self._binary(Op.SUB, other if alpha == 1 else other * alpha, "sub")

    subtract = sub

    def mul(self, other: Any) -> Tensor:
        """self * other; on bool tensors multiplication is logical and (like torch)."""
        left, right = self._operands(other, "mul")
        return left._apply(Op.AND if left.dtype.is_bool else Op.MUL, right)

    multiply = mul

    def div(self, other: Any, rounding_mode: str | None = None, reverse: builtins.bool = False) -> Tensor:
        """True division (integers give floats), or rounded with rounding_mode 'trunc' or 'floor' (torch.div)."""
        if rounding_mode == "floor":
            return self.floor_divide(other, reverse)
        if rounding_mode not in (None, "trunc"):
            raise ArgumentError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        left, right = self._operands(other, "div", reverse)
        if rounding_mode is None:
            return left._float_operand()._apply(Op.DIV, right._float_operand())
        if left.dtype.is_bool:
            raise DTypeError("div: rounding_mode='trunc' is not supported for bool tensors (as in PyTorch)")
        if left.dtype.is_float:
            return left._apply(Op.DIV, right).trunc()
        return left._apply(Op.IDIV, check_divisor(right, "div (rounding_mode='trunc')"))

    true_divide = divide = div

    def floor_divide(self, other: Any, reverse: builtins.bool = False) -> Tensor:
        """Division rounded toward negative infinity, like Python's // (an integer divisor of 0 raises
        IntegerDivisionByZeroError, as torch)."""
        left, right = self._operands(other, "floor_divide", reverse)
        if left.dtype.is_bool:
            raise DTypeError("floor_divide: not supported for bool tensors (as in PyTorch); cast to an integer dtype")
        if left.dtype.is_float:
            return float_floor_divide(left, right)
        return integer_floor_divide(left, check_divisor(right, "floor_divide"))

    def remainder(self, other: Any, reverse: builtins.bool = False) -> Tensor:
        """Python's modulo: the result has the sign of the divisor (torch.remainder; x % 0 is NaN for floats and
        raises IntegerDivisionByZeroError for integers, as torch)."""
        left, right = self._operands(other, "remainder", reverse)
        if left.dtype.is_bool:
            raise DTypeError("remainder: not supported for bool tensors (as in PyTorch); cast to an integer dtype")
        if left.dtype.is_float:
            remainder = float_fmod(left, right)
        else:
            right = check_divisor(right, "remainder")
            remainder = left._apply(Op.MOD, right)
        if left.dtype.is_unsigned:
            return remainder
        return where(signs_differ(remainder, right), remainder + right, remainder)

    def fmod(self, other: Any) -> Tensor:
        """C's fmod: the remainder of truncated division, with the sign of the dividend (torch.fmod)."""
        left, right = self._operands(other, "fmod")
        if left.dtype.is_bool:
            raise DTypeError("fmod: not supported for bool tensors (as in PyTorch); cast to an integer dtype")
        return float_fmod(left, right) if left.dtype.is_float else left._apply(Op.MOD, check_divisor(right, "fmod"))

    def neg(self) -> Tensor:
        if self.dtype.is_bool:
            raise DTypeError("neg: negation of a bool tensor is not supported (as in PyTorch); use ~ or logical_not()")
        return self._apply(Op.NEG)

    negative = neg

    def reciprocal(self) -> Tensor:
        return self._float_operand()._apply(Op.RECIPROCAL)

    def pow(self, exponent: Any, reverse: builtins.bool = False) -> Tensor:
        """self ** exponent (or exponent ** self when `reverse`), with torch's dtypes and C pow's special values."""
        if not reverse and isinstance(exponent, PYTHON_SCALARS) and not isinstance(exponent, (bool, np.bool_)):
            return pow_scalar_exponent(cast("Tensor", self), cast(Number, exponent))  # numpy scalars act as numbers
        base, power = self._operands(exponent, "pow", reverse)
        if base.dtype.is_bool:
            raise DTypeError("pow: bool ** bool is not supported (as in PyTorch); cast one operand to a number dtype")
        if base.dtype.is_float:
            return base._recorded(Composite.POW, float_pow, (base, power))
        return integer_pow(base, power)

    def square(self) -> Tensor:
        return self.pow(2)

    def abs(self) -> Tensor:
        if self.dtype.is_bool:
            raise DTypeError("abs: not supported for bool tensors (as in PyTorch)")
        if self.dtype.is_unsigned:
            return cast("Tensor", self)
        zero = self._full(self.shape, 0, self.dtype, self.device)
        # |-0.0| is +0.0; a zero constant at 0 gives torch's abs'(0) = 0 (and keeps 0 * inf out of the backward)
        return where(self < zero, zero - self, where(self == zero, zero, self))

    absolute = abs

    def sign(self) -> Tensor:
        """-1, 0 or 1 in self's dtype (NaN gives 0, as in torch)."""
        if self.dtype.is_bool:
            return cast("Tensor", self)
        zero = self._full(self.shape, 0, self.dtype, self.device)
        if self.dtype.is_unsigned:
            return (self > zero).cast(self.dtype)
        result = (self > zero).cast(self.dtype) - (self < zero).cast(self.dtype)
        if not self.dtype.is_float:
            return result
        # the zeros come from 0 - trunc(x) (+0.0 at +-0.0): the result has torch's zero gradient, not none
        return where(self != zero, result, zero - self._apply(Op.TRUNC))

    sgn = sign

    # ---- comparison -----------------------------------------------------------------------------------------

    def __lt__(self, other: Any) -> Tensor:
        return self._binary(Op.CMPLT, other, "lt")

    def __gt__(self, other: Any) -> Tensor:
        return self._binary(Op.CMPLT, other, "gt", reverse=True)

    def __le__(self, other: Any) -> Tensor:
        left, right = self._operands(other, "le")
        return left._apply(Op.CMPLT, right).logical_or(left._apply(Op.CMPEQ, right))

    def __ge__(self, other: Any) -> Tensor:
        left, right = self._operands(other, "ge")
        return right._apply(Op.CMPLT, left).logical_or(left._apply(Op.CMPEQ, right))

    def __eq__(self, other: object) -> Tensor:  # type: ignore[override]
        return self._binary(Op.CMPEQ, other, "eq")

    def __ne__(self, other: object) -> Tensor:  # type: ignore[override]
        return self._binary(Op.CMPEQ, other, "ne")._apply(Op.NOT)

    def eq(self, other: Any) -> Tensor:
        return self == other

    def ne(self, other: Any) -> Tensor:
        return self != other

    def lt(self, other: Any) -> Tensor:
        return self < other

    def le(self, other: Any) -> Tensor:
        return self <= other

    def gt(self, other: Any) -> Tensor:
        return self > other

    def ge(self, other: Any) -> Tensor:
        return self >= other

    less, less_equal, greater, greater_equal, not_equal = lt, le, gt, ge, ne

    def isnan(self) -> Tensor:
        if not self.dtype.is_float:
            return self._full(self.shape, False, dtypes.bool_, self.device)
        return self._apply(Op.CMPEQ, self)._apply(Op.NOT)

    def isinf(self) -> Tensor:
        if not self.dtype.is_float:
            return self._full(self.shape, False, dtypes.bool_, self.device)
        return (self == math.inf).logical_or(self == -math.inf)

    def isposinf(self) -> Tensor:
        return self == math.inf if self.dtype.is_float else self._full(self.shape, False, dtypes.bool_, self.device)

    def isneginf(self) -> Tensor:
        return self == -math.inf if self.dtype.is_float else self._full(self.shape, False, dtypes.bool_, self.device)

    def isfinite(self) -> Tensor:
        if not self.dtype.is_float:
            return self._full(self.shape, True, dtypes.bool_, self.device)
        return (self - self) == 0  # inf - inf and NaN - NaN are NaN

    def nan_to_num(self, nan: builtins.float = 0.0, posinf: builtins.float | None = None,
                   neginf: builtins.float | None = None) -> Tensor:
        if not self.dtype.is_float:
            return cast("Tensor", self)
        finfo = np.finfo(np.float32 if self.dtype is dtypes.bfloat16 else self.dtype.numpy)
        largest = 3.3895313892515355e38 if self.dtype is dtypes.bfloat16 else float(finfo.max)
        result = where(self.isnan(), self._full(self.shape, nan, self.dtype, self.device), self)
        result = where(self == math.inf, self._full(self.shape, largest if posinf is None else posinf, self.dtype,
                                                     self.device), result)
        return where(self == -math.inf, self._full(self.shape, -largest if neginf is None else neginf, self.dtype,
                                                    self.device), result)

    # ---- minimum, maximum, clamp, where -----------------------------------------------------------------------

    def maximum(self, other: Any) -> Tensor:
        """The larger of self and other elementwise; NaN wins (torch.maximum)."""
        left, right = self._operands(other, "maximum")
        return _maximum(left, right)

    def minimum(self, other: Any) -> Tensor:
        """The smaller of self and other elementwise; NaN wins (torch.minimum)."""
        left, right = self._operands(other, "minimum")
        return _minimum(left, right)

    def clamp(self, min: Any = None, max: Any = None) -> Tensor:
        """min(max(self, min), max): bounds are numbers or tensors; the dtype is torch.result_type of all three."""
        if min is None and max is None:
            raise ArgumentError("clamp: at least one of min and max must be given")
        if (self.dtype.is_float and type(min) in _NUMBER_BOUNDS and type(max) in _NUMBER_BOUNDS
                and hasattr(self, "_traced")):
            # a float tensor between numbers (its dtype, as torch's result type): one traced step copied from a
            # template from the second call of a shape on (~20 primitives op by op: 59 us a call)
            from ember.core.graph_templates import traced_call  # (graph_templates imports the tensor module)

            return traced_call(functools.partial(_clamped_by_numbers, low=min, high=max), (cast("Tensor", self),))
        bounds = [bound for bound in (min, max) if bound is not None]
        aligned = _align(cast("Tensor", self), (cast("Tensor", self), *bounds), "clamp")
        if aligned[0].dtype.is_bool:
            raise DTypeError("clamp: not supported for bool tensors with bool bounds; cast to an integer dtype")
        return _clamped(aligned[0], aligned[1] if min is not None else None, aligned[-1] if max is not None else None)

    clip = clamp

    def clamp_min(self, min: Any) -> Tensor:
        return self.clamp(min=min)

    def clamp_max(self, max: Any) -> Tensor:
        return self.clamp(max=max)

    def where(self, condition: Tensor, other: Any) -> Tensor:
        """torch's `x.where(condition, y)`: self where the bool condition is True, else other (ember.where(condition,
        self, other); a select: the branch not taken never leaks)."""
        return where(condition, self, other)

    def masked_fill(self, mask: Tensor, value: Any) -> Tensor:
        """self with value where the bool mask (broadcast to self's shape) is True."""
        if not isinstance(mask, ElementwiseOps) or not mask.dtype.is_bool:
            raise DTypeError(
                f"masked_fill: mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}"
            )
        if broadcast_shapes(self.shape, mask.shape, op="masked_fill") != self.shape:
            raise ShapeError(
                f"masked_fill: mask of shape {mask.shape} must broadcast to the tensor's shape {self.shape}"
            )
        if isinstance(value, ElementwiseOps):
            if value.ndim != 0:
                raise ShapeError(f"masked_fill: value must be a number or a 0-d tensor, got shape {value.shape}")
            fill = value.cast(self.dtype)._broadcast(self.shape)
        else:
            fill = self._full(self.shape, value, self.dtype, self.device)
        return mask._broadcast(self.shape)._apply(Op.WHERE, fill, cast("Tensor", self))

    # ---- operators -----------------------------------------------------------------------------------------

    def __add__(self, other: Any) -> Tensor:
        return self.add(other)

    def __radd__(self, other: Any) -> Tensor:
        return self.add(other)

    def __sub__(self, other: Any) -> Tensor:
        return self.sub(other)

    def __rsub__(self, other: Any) -> Tensor:
        _check_no_bool_subtraction(cast("Tensor", self), other)
        return self._binary(Op.SUB, other, "sub", reverse=True)

    def __mul__(self, other: Any) -> Tensor:
        return self.mul(other)

    def __rmul__(self, other: Any) -> Tensor:
        return self.mul(other)

    def __truediv__(self, other: Any) -> Tensor:
        return self.div(other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return self.div(other, reverse=True)

    def __floordiv__(self, other: Any) -> Tensor:
        return self.floor_divide(other)

    def __rfloordiv__(self, other: Any) -> Tensor:
        return self.floor_divide(other, reverse=True)

    def __mod__(self, other: Any) -> Tensor:
        return self.remainder(other)

    def __rmod__(self, other: Any) -> Tensor:
        return self.remainder(other, reverse=True)

    def __pow__(self, other: Any) -> Tensor:
        return self.pow(other)

    def __rpow__(self, other: Any) -> Tensor:
        return self.pow(other, reverse=True)

    def __neg__(self) -> Tensor:
        return self.neg()

    def __pos__(self) -> Tensor:
        return cast("Tensor", self)

    def __abs__(self) -> Tensor:
        return self.abs()

    # ---- in-place forms: rebind this tensor to the new value; the result must cast to self's dtype (as in torch) --

    def _assign_in_place(self, value: Tensor, op_name: str) -> Tensor:
        if not can_cast(value.dtype, self.dtype):
            raise DTypeError(
                f"{op_name}: the result type {value.dtype.name} can't be cast to the dtype {self.dtype.name} of the "
                f"tensor changed in place; use the out-of-place form or cast first"
            )
        if value.shape != self.shape:
            raise ShapeError(
                f"{op_name}: the result of shape {value.shape} does not fit the tensor of shape {self.shape} changed "
                f"in place (in-place ops cannot broadcast self)"
            )
        return self.assign(value)

    def __iadd__(self, other: Any) -> Tensor:
        return self._assign_in_place(self + other, "add_")

    def __isub__(self, other: Any) -> Tensor:
        return self._assign_in_place(self - other, "sub_")

    def __imul__(self, other: Any) -> Tensor:
        return self._assign_in_place(self * other, "mul_")

    def __itruediv__(self, other: Any) -> Tensor:
        return self._assign_in_place(self / other, "div_")

    def __ifloordiv__(self, other: Any) -> Tensor:
        return self._assign_in_place(self // other, "floor_divide_")

    def __imod__(self, other: Any) -> Tensor:
        return self._assign_in_place(self % other, "remainder_")

    def __ipow__(self, other: Any) -> Tensor:
        return self._assign_in_place(self**other, "pow_")

    def add_(self, other: Any, alpha: Number = 1) -> Tensor:
        return self._assign_in_place(self.add(other, alpha), "add_")

    def sub_(self, other: Any, alpha: Number = 1) -> Tensor:
        return self._assign_in_place(self.sub(other, alpha), "sub_")

    def mul_(self, other: Any) -> Tensor:
        return self._assign_in_place(self * other, "mul_")

    def div_(self, other: Any, rounding_mode: str | None = None) -> Tensor:
        return self._assign_in_place(self.div(other, rounding_mode), "div_")

    def pow_(self, exponent: Any) -> Tensor:
        return self._assign_in_place(self.pow(exponent), "pow_")

    def neg_(self) -> Tensor:
        return self._assign_in_place(self.neg(), "neg_")

    def abs_(self) -> Tensor:
        return self._assign_in_place(self.abs(), "abs_")

    def clamp_(self, min: Any = None, max: Any = None) -> Tensor:
        return self._assign_in_place(self.clamp(min, max), "clamp_")

    def zero_(self) -> Tensor:
        return self.assign(self._full(self.shape, 0, self.dtype, self.device))

    def fill_(self, value: Any) -> Tensor:
        if isinstance(value, ElementwiseOps):
            if value.ndim != 0:
                raise ShapeError(f"fill_: value must be a number or a 0-d tensor, got shape {value.shape}")
            return self.assign(value.cast(self.dtype).expand(self.shape))
        return self.assign(self._full(self.shape, value, self.dtype, self.device))

    def masked_fill_(self, mask: Tensor, value: Any) -> Tensor:
        return self.assign(self.masked_fill(mask, value))


# ---- selection ---------------------------------------------------------------------------------------------------


@overload
def where(condition: Tensor) -> tuple[Tensor, ...]: ...


@overload
def where(condition: Tensor, input: Any, other: Any) -> Tensor: ...  # noqa: A002


def where(condition: Tensor, input: Any = None, other: Any = None) -> Tensor | tuple[Tensor, ...]:  # noqa: A002
    """torch.where(condition, input, other): input where the bool condition is True, else other, broadcast together
    and promoted like torch (either may be a Python number); a select: the branch not taken never leaks.
    torch.where(condition) alone is condition.nonzero(as_tuple=True): the indices of its nonzero elements per dim."""
    if input is None and other is None:
        if not isinstance(condition, ElementwiseOps):
            raise TypeError(f"where(condition): condition must be a Tensor, got {type(condition).__name__}")
        return cast("Tensor", condition).nonzero(as_tuple=True)
    if input is None or other is None:
        raise TypeError("where() takes a condition alone (the indices of its nonzero elements) or a condition, input "
                        f"and other; got input={'None' if input is None else 'given'}, "
                        f"other={'None' if other is None else 'given'}")
    if not isinstance(condition, ElementwiseOps) or not condition.dtype.is_bool:
        kind = condition.dtype.name if isinstance(condition, ElementwiseOps) else type(condition).__name__
        raise DTypeError(
            f"where: the condition must be a bool tensor, got {kind} (torch's order: where(condition, input, other) "
            f"or input.where(condition, other))"
        )
    first, second = _align(condition, (input, other), "where", extra_shapes=(condition.shape,))
    shape = first.shape
    condition = condition._broadcast(shape)
    return condition._apply(Op.WHERE, first, second)


# ---- helpers -----------------------------------------------------------------------------------------------------


def _align(anchor: Tensor, values: Sequence[Any], op_name: str, extra_shapes: Sequence[tuple[int, ...]] = ()
           ) -> list[Tensor]:
    """Tensors and Python numbers as tensors of their torch.result_type, broadcast to one shape (numbers become
    constants of that shape; array-like data becomes a tensor on anchor's device)."""
    tensors: list[Any] = []
    dimensioned: list[DType] = []
    zero_dim: list[DType] = []
    scalars: list[DType] = []
    for value in values:
        if isinstance(value, ElementwiseOps):
            tensors.append(value)
            (dimensioned if value.ndim else zero_dim).append(value.dtype)
        elif isinstance(value, PYTHON_SCALARS):
            tensors.append(value)
            scalars.append(dtypes.scalar_dtype(value))
        elif hasattr(value, "shape") and hasattr(value, "dtype") and tuple(value.shape) == ():  # numpy/torch scalar
            number = value.item()
            tensors.append(number)
            scalars.append(dtypes.scalar_dtype(number))
        elif isinstance(value, (list, tuple, np.ndarray)) or hasattr(value, "__array__"):
            converted = _tensor_from(value, anchor.device)
            tensors.append(converted)
            (dimensioned if converted.ndim else zero_dim).append(converted.dtype)
        else:
            raise TypeError(
                f"{op_name}: unsupported operand type {type(value).__name__} (expected a Tensor, a number or "
                f"array data)"
            )
    dtype = combine_result_types(dimensioned, zero_dim, scalars)
    shapes = [value.shape for value in tensors if isinstance(value, ElementwiseOps)]
    shape = broadcast_shapes(*shapes, *extra_shapes, op=op_name) if len(shapes) + len(extra_shapes) > 1 else (
        shapes[0] if shapes else tuple(extra_shapes[0]) if extra_shapes else ()
    )
    result = []
    for value in tensors:
        if isinstance(value, ElementwiseOps):
            value = value.cast(dtype)
            result.append(value._broadcast(shape))
        else:
            result.append(anchor._full(shape, value, dtype, anchor.device))
    return result


def _tensor_from(data: Any, device: str) -> Tensor:
    """A plain Tensor from a list or array operand (never a subclass such as nn.Parameter)."""
    from ember.core.creation import node_from_data
    from ember.core.tensor import Tensor

    return Tensor._from_node(node_from_data(data, None, device))


def _check_no_bool_subtraction(tensor: Tensor, other: Any) -> None:
    other_is_bool = isinstance(other, (bool, np.bool_)) or (isinstance(other, ElementwiseOps) and other.dtype.is_bool)
    if tensor.dtype.is_bool or other_is_bool:
        raise DTypeError(
            "sub: subtraction with a bool operand is not supported (as in PyTorch); to invert a mask use ~ or "
            "logical_not(), to compare masks use logical_xor()"
        )


_NUMBER_BOUNDS = frozenset({int, float, type(None)})  # bound types of clamp's traced path (bool is not among them)


def _clamped(value: Tensor, low: Tensor | None, high: Tensor | None) -> Tensor:
    """value clamped to [low, high] (each None for no bound), all of one dtype and shape. torch's gradient
    convention: value gets it where low <= value <= high (both bounds included), a bound where it is the result;
    where a NaN makes both comparisons false the result is NaN (the maximum/minimum of the two, NaN winning) and
    nothing gets a gradient (torch's clamp_backward: a NaN input's gradient is 0)."""
    result = value
    if low is not None:
        nan = _maximum(_without_gradient(result), _without_gradient(low))
        result = where(result >= low, result, where(result < low, low, nan))
    if high is not None:
        nan = _minimum(_without_gradient(result), _without_gradient(high))
        result = where(result <= high, result, where(result > high, high, nan))
    return result


def _without_gradient(tensor: Tensor) -> Tensor:
    """tensor's value without its history (the numpy reference tensor: its detach)."""
    detached = getattr(tensor, "_detached_copy", None)
    return detached() if detached is not None else tensor.detach()


def _clamped_by_numbers(value: Tensor, low: float | None, high: float | None) -> Tensor:
    """A float tensor clamped to number bounds (in its dtype, as torch's result type)."""
    def bound(number: float | None) -> Tensor | None:
        return None if number is None else value._full(value.shape, number, value.dtype, value.device)

    return _clamped(value, bound(low), bound(high))


def _maximum(left: Tensor, right: Tensor) -> Tensor:
    if left.dtype.is_bool:
        return left._apply(Op.OR, right)
    return left._apply(Op.MAX, right)


def _minimum(left: Tensor, right: Tensor) -> Tensor:
    """min(a, b) = -max(-a, -b) for floats (NaN still wins) and ~max(~a, ~b) for integers (no overflow)."""
    if left.dtype.is_bool:
        return left._apply(Op.AND, right)
    flip = Op.NEG if left.dtype.is_float else Op.NOT
    return left._apply(flip)._apply(Op.MAX, right._apply(flip))._apply(flip)
