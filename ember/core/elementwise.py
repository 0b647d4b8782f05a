"""Elementwise Tensor methods (arithmetic, math functions, comparisons, logic) as compositions of primitives."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ember.core import dtype as dtypes
from ember.core.dtype import DType, promote_types, result_type, to_dtype
from ember.core.errors import DTypeError
from ember.core.ops import Op
from ember.core.shapes import broadcast_shapes

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

Number = int | float | bool
LOG2_E = 1.0 / math.log(2.0)
LN_2 = math.log(2.0)


class ElementwiseOps:
    """Mixin: every elementwise method. Needs `_apply`, `_full`, `shape`, `dtype`, `device` from the class."""

    __slots__ = ()

    # ---- helpers shared by binary ops ------------------------------------------------------------------------

    def _scalar_like(self: Tensor, value: Number, dtype: DType) -> Tensor:
        return self._full((), value, dtype, self.device)

    def _operands(self: Tensor, other: Any, op_name: str, reverse: bool = False) -> tuple[Tensor, Tensor]:
        """Promote and broadcast self and other (a Tensor or a Python number) to a common dtype and shape."""
        if isinstance(other, ElementwiseOps):
            dtype = promote_types(self.dtype, other.dtype) if other.ndim > 0 or self.ndim == 0 else (
                _promote_with_zero_dim(self.dtype, other.dtype)
            )
            if self.ndim == 0 and other.ndim > 0:
                dtype = _promote_with_zero_dim(other.dtype, self.dtype)
            other_tensor = other
        elif isinstance(other, (int, float, bool)) or hasattr(other, "dtype") and not hasattr(other, "node"):
            if hasattr(other, "shape") and getattr(other, "shape", ()) != ():
                other_tensor = _tensor_from(other, self.device)
                dtype = promote_types(self.dtype, other_tensor.dtype)
            else:
                value = other.item() if hasattr(other, "item") else other
                dtype = result_type(self.dtype, value)
                other_tensor = self._full(self.shape, value, dtype, self.device)  # no expand needed
        elif isinstance(other, (list, tuple)):
            other_tensor = _tensor_from(other, self.device)
            dtype = promote_types(self.dtype, other_tensor.dtype)
        else:
            raise TypeError(f"{op_name}: unsupported operand type {type(other).__name__} (expected a Tensor or a number)")
        shape = broadcast_shapes(self.shape, other_tensor.shape, op=op_name)
        left = self.cast(dtype).expand(shape)
        right = other_tensor.cast(dtype).expand(shape)
        return (right, left) if reverse else (left, right)

    def _binary(self: Tensor, op: Op, other: Any, op_name: str, reverse: bool = False) -> Tensor:
        left, right = self._operands(other, op_name, reverse)
        return left._apply(op, right)

    def _float_operand(self: Tensor) -> Tensor:
        """self cast to the default float dtype when it is an integer or bool (like torch's unary float ops)."""
        return self if self.dtype.is_float else self.cast(dtypes.DEFAULT_FLOAT)

    # ---- casting ----------------------------------------------------------------------------------------------

    def cast(self: Tensor, dtype: DType | str) -> Tensor:
        dtype = to_dtype(dtype)
        if dtype == self.dtype:
            return self
        if dtype.is_bool:
            return self != 0
        if self.dtype.is_bool:
            return self.where(self._scalar_like(1, dtype).expand(self.shape), self._scalar_like(0, dtype).expand(self.shape))
        return self._apply(Op.CAST, arg=dtype)

    def type(self: Tensor, dtype: DType | str) -> Tensor:
        return self.cast(dtype)

    def float(self: Tensor) -> Tensor:
        return self.cast(dtypes.float32)

    def double(self: Tensor) -> Tensor:
        return self.cast(dtypes.float64)

    def half(self: Tensor) -> Tensor:
        return self.cast(dtypes.float16)

    def bfloat16(self: Tensor) -> Tensor:
        return self.cast(dtypes.bfloat16)

    def int(self: Tensor) -> Tensor:
        return self.cast(dtypes.int32)

    def long(self: Tensor) -> Tensor:
        return self.cast(dtypes.int64)

    def bool(self: Tensor) -> Tensor:
        return self.cast(dtypes.bool_)

    def bitcast(self: Tensor, dtype: DType | str) -> Tensor:
        dtype = to_dtype(dtype)
        if dtype.itemsize != self.dtype.itemsize:
            raise DTypeError(f"bitcast: {self.dtype.name} and {dtype.name} differ in size; only same-size bitcasts")
        return self if dtype == self.dtype else self._apply(Op.BITCAST, arg=dtype)

    view_as_dtype = bitcast

    # ---- arithmetic -------------------------------------------------------------------------------------------

    def add(self: Tensor, other: Any, alpha: Number = 1) -> Tensor:
        return self._binary(Op.ADD, other if alpha == 1 else other * alpha, "add")

    def sub(self: Tensor, other: Any, alpha: Number = 1) -> Tensor:
        if self.dtype.is_bool and (isinstance(other, bool) or getattr(other, "dtype", None) == dtypes.bool_):
            raise DTypeError("sub: subtraction of bool tensors is not supported; use logical_xor or ~")
        return self._binary(Op.SUB, other if alpha == 1 else other * alpha, "sub")

    def mul(self: Tensor, other: Any) -> Tensor:
        if self.dtype.is_bool and getattr(other, "dtype", dtypes.bool_ if isinstance(other, bool) else None) == dtypes.bool_:
            return self.logical_and(other)
        return self._binary(Op.MUL, other, "mul")

    def div(self: Tensor, other: Any, rounding_mode: str | None = None) -> Tensor:
        if rounding_mode is None:
            left, right = self._operands(other, "div")
            left, right = left._float_operand(), right._float_operand()
            return left._apply(Op.DIV, right)
        if rounding_mode == "trunc":
            left, right = self._operands(other, "div")
            if left.dtype.is_float:
                return left._apply(Op.DIV, right).trunc()
            return left._apply(Op.IDIV, right)
        if rounding_mode == "floor":
            return self.floor_divide(other)
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")

    true_divide = divide = div

    def floor_divide(self: Tensor, other: Any, reverse: bool = False) -> Tensor:
        left, right = self._operands(other, "floor_divide", reverse)
        if left.dtype.is_float:
            return left._apply(Op.DIV, right).floor()
        if left.dtype.is_bool:
            raise DTypeError("floor_divide: not supported for bool tensors")
        quotient = left._apply(Op.IDIV, right)
        if left.dtype.is_unsigned:
            return quotient
        remainder = left._apply(Op.MOD, right)
        zero = left._full(left.shape, 0, left.dtype, left.device)
        needs_fix = (remainder != zero).logical_and((remainder < zero) != (right < zero))
        return needs_fix.where(quotient - 1, quotient)

    def remainder(self: Tensor, other: Any, reverse: bool = False) -> Tensor:
        """Python's modulo: the result has the sign of the divisor (torch.remainder)."""
        left, right = self._operands(other, "remainder", reverse)
        if left.dtype.is_bool:
            raise DTypeError("remainder: not supported for bool tensors")
        if left.dtype.is_float:
            return left - (left / right).floor() * right
        remainder = left._apply(Op.MOD, right)
        if left.dtype.is_unsigned:
            return remainder
        zero = left._full(left.shape, 0, left.dtype, left.device)
        needs_fix = (remainder != zero).logical_and((remainder < zero) != (right < zero))
        return needs_fix.where(remainder + right, remainder)

    def fmod(self: Tensor, other: Any) -> Tensor:
        left, right = self._operands(other, "fmod")
        if left.dtype.is_float:
            return left - (left / right).trunc() * right
        return left._apply(Op.MOD, right)

    def neg(self: Tensor) -> Tensor:
        if self.dtype.is_bool:
            raise DTypeError("neg: negation of a bool tensor is not supported; use ~ or logical_not()")
        return self._apply(Op.NEG)

    negative = neg

    def reciprocal(self: Tensor) -> Tensor:
        return self._float_operand()._apply(Op.RECIPROCAL)

    def pow(self: Tensor, exponent: Any, reverse: bool = False) -> Tensor:
        base, power = self._operands(exponent, "pow", reverse)
        if isinstance(exponent, (int, float)) and not reverse and not base.dtype.is_float and exponent < 0:
            raise DTypeError("pow: integers to negative integer powers are not allowed (as in PyTorch)")
        if isinstance(exponent, (int, float)) and not reverse and float(exponent) == int(exponent) and 0 <= exponent <= 4:
            result = base._full(base.shape, 1, base.dtype, base.device)
            for _ in range(int(exponent)):
                result = result * base
            return result
        if not base.dtype.is_float:
            return _integer_pow(base, power)
        magnitude = (power * base.abs().log2()).exp2()
        power_is_integer = power == power.trunc()
        power_is_odd = power_is_integer.logical_and((power * 0.5) != (power * 0.5).trunc())
        negative_base = base < 0
        signed = (negative_base.logical_and(power_is_odd)).where(-magnitude, magnitude)
        nan = base._full(base.shape, math.nan, base.dtype, base.device)
        result = (negative_base.logical_and(power_is_integer.logical_not())).where(nan, signed)
        one = base._full(base.shape, 1, base.dtype, base.device)
        return (power == 0).logical_or(base == 1).where(one, result)

    def square(self: Tensor) -> Tensor:
        return self * self

    def abs(self: Tensor) -> Tensor:
        if self.dtype.is_bool or self.dtype.is_unsigned:
            return self
        return (self < 0).where(-self, self)

    absolute = abs

    def sign(self: Tensor) -> Tensor:
        if self.dtype.is_bool:
            return self
        one = self._full(self.shape, 1, self.dtype, self.device)
        zero = self._full(self.shape, 0, self.dtype, self.device)
        result = (self > 0).where(one, (self < 0).where(-one if not self.dtype.is_unsigned else zero, zero))
        return self.isnan().where(self, result) if self.dtype.is_float else result

    sgn = sign

    # ---- exponentials and logarithms (float results) ---------------------------------------------------------

    def exp2(self: Tensor) -> Tensor:
        return self._float_operand()._apply(Op.EXP2)

    def exp(self: Tensor) -> Tensor:
        return (self._float_operand() * LOG2_E)._apply(Op.EXP2)

    def expm1(self: Tensor) -> Tensor:
        return self.exp() - 1

    def log2(self: Tensor) -> Tensor:
        return self._float_operand()._apply(Op.LOG2)

    def log(self: Tensor) -> Tensor:
        return self.log2() * LN_2

    def log10(self: Tensor) -> Tensor:
        return self.log2() * (LN_2 / math.log(10.0))

    def log1p(self: Tensor) -> Tensor:
        return (self._float_operand() + 1).log()

    def sqrt(self: Tensor) -> Tensor:
        return self._float_operand()._apply(Op.SQRT)

    def rsqrt(self: Tensor) -> Tensor:
        return self.sqrt().reciprocal()

    # ---- trigonometry -----------------------------------------------------------------------------------------

    def sin(self: Tensor) -> Tensor:
        return self._float_operand()._apply(Op.SIN)

    def cos(self: Tensor) -> Tensor:
        operand = self._float_operand()
        return (operand + math.pi / 2)._apply(Op.SIN) if operand.dtype != dtypes.float64 else (
            (math.pi / 2 - operand)._apply(Op.SIN)
        )

    def tan(self: Tensor) -> Tensor:
        return self.sin() / self.cos()

    def tanh(self: Tensor) -> Tensor:
        operand = self._float_operand()
        return 2.0 * (2.0 * operand).sigmoid() - 1.0

    def sigmoid(self: Tensor) -> Tensor:
        operand = self._float_operand()
        # exp of a non-positive number only: no overflow for large |x|
        exp_negative_abs = (-operand.abs()).exp()
        positive = 1.0 / (1.0 + exp_negative_abs)
        return (operand >= 0).where(positive, exp_negative_abs * positive)

    # ---- activations -------------------------------------------------------------------------------------------

    def relu(self: Tensor) -> Tensor:
        return (self > 0).where(self, self._full(self.shape, 0, self.dtype, self.device))

    def relu6(self: Tensor) -> Tensor:
        return self.clamp(0, 6)

    def leaky_relu(self: Tensor, negative_slope: float = 0.01) -> Tensor:
        return (self > 0).where(self, self * negative_slope)

    def elu(self: Tensor, alpha: float = 1.0) -> Tensor:
        return (self > 0).where(self, alpha * self.expm1())

    def selu(self: Tensor) -> Tensor:
        alpha, scale = 1.6732632423543772, 1.0507009873554805
        return scale * self.elu(alpha)

    def celu(self: Tensor, alpha: float = 1.0) -> Tensor:
        return self.relu() + (-(self.relu() - self) / alpha).exp().sub(1).mul(alpha).minimum(0)

    def gelu(self: Tensor, approximate: str = "none") -> Tensor:
        if approximate == "tanh":
            return 0.5 * self * (1 + (math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).tanh())
        if approximate != "none":
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        return 0.5 * self * (1 + (self * (1 / math.sqrt(2))).erf())

    def erf(self: Tensor) -> Tensor:
        """The error function (Abramowitz-Stegun 7.1.26 refined to float32 accuracy)."""
        operand = self._float_operand()
        magnitude = operand.abs()
        t = 1.0 / (1.0 + 0.5 * magnitude)
        polynomial = (
            -1.26551223
            + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (
                -1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
        )
        result = 1.0 - t * (polynomial - magnitude * magnitude).exp()
        return (operand < 0).where(-result, result)

    def silu(self: Tensor) -> Tensor:
        return self * self.sigmoid()

    def mish(self: Tensor) -> Tensor:
        return self * self.softplus().tanh()

    def softplus(self: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        scaled = self * beta
        soft = (scaled.maximum(0) + (-scaled.abs()).exp().log1p()) / beta
        return (scaled > threshold).where(self, soft)

    def hardtanh(self: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        return self.clamp(min_val, max_val)

    def hardsigmoid(self: Tensor) -> Tensor:
        return (self / 6 + 0.5).clamp(0, 1)

    def hardswish(self: Tensor) -> Tensor:
        return self * self.hardsigmoid()

    def softsign(self: Tensor) -> Tensor:
        return self / (1 + self.abs())

    def logsigmoid(self: Tensor) -> Tensor:
        return -(-self).softplus()

    # ---- rounding ----------------------------------------------------------------------------------------------

    def trunc(self: Tensor) -> Tensor:
        return self._apply(Op.TRUNC) if self.dtype.is_float else self

    def floor(self: Tensor) -> Tensor:
        if not self.dtype.is_float:
            return self
        truncated = self.trunc()
        return (self < truncated).where(truncated - 1, truncated)

    def ceil(self: Tensor) -> Tensor:
        if not self.dtype.is_float:
            return self
        truncated = self.trunc()
        return (self > truncated).where(truncated + 1, truncated)

    def round(self: Tensor, decimals: int = 0) -> Tensor:
        """Round half to even, like torch.round."""
        if not self.dtype.is_float:
            return self
        if decimals != 0:
            scale = 10.0**decimals
            return (self * scale).round() / scale
        floored = self.floor()
        difference = self - floored
        floored_is_even = (floored * 0.5).floor() * 2 == floored
        round_up = (difference > 0.5).logical_or((difference == 0.5).logical_and(floored_is_even.logical_not()))
        return round_up.where(floored + 1, floored)

    def frac(self: Tensor) -> Tensor:
        return self - self.trunc()

    # ---- comparison -----------------------------------------------------------------------------------------

    def __lt__(self: Tensor, other: Any) -> Tensor:
        return self._binary(Op.CMPLT, other, "lt")

    def __gt__(self: Tensor, other: Any) -> Tensor:
        return self._binary(Op.CMPLT, other, "gt", reverse=True)

    def __le__(self: Tensor, other: Any) -> Tensor:
        return (self > other).logical_not_nan_aware(self, other, "le")

    def __ge__(self: Tensor, other: Any) -> Tensor:
        return (self < other).logical_not_nan_aware(self, other, "ge")

    def logical_not_nan_aware(self: Tensor, left: Tensor, right: Any, op_name: str) -> Tensor:
        """not(self) where neither operand is NaN; False where one is (so that NaN <= x is False)."""
        a, b = left._operands(right, op_name)
        result = self.logical_not()
        if a.dtype.is_float:
            result = result.logical_and(a.isnan().logical_or(b.isnan()).logical_not())
        return result

    def __eq__(self: Tensor, other: Any) -> Tensor:  # type: ignore[override]
        return self._binary(Op.CMPEQ, other, "eq")

    def __ne__(self: Tensor, other: Any) -> Tensor:  # type: ignore[override]
        return self._binary(Op.CMPEQ, other, "ne").logical_not()

    def eq(self: Tensor, other: Any) -> Tensor:
        return self == other

    def ne(self: Tensor, other: Any) -> Tensor:
        return self != other

    def lt(self: Tensor, other: Any) -> Tensor:
        return self < other

    def le(self: Tensor, other: Any) -> Tensor:
        return self <= other

    def gt(self: Tensor, other: Any) -> Tensor:
        return self > other

    def ge(self: Tensor, other: Any) -> Tensor:
        return self >= other

    less, less_equal, greater, greater_equal, not_equal = lt, le, gt, ge, ne

    def isnan(self: Tensor) -> Tensor:
        if not self.dtype.is_float:
            return self._full(self.shape, False, dtypes.bool_, self.device)
        return self._apply(Op.CMPEQ, self).logical_not()

    def isinf(self: Tensor) -> Tensor:
        if not self.dtype.is_float:
            return self._full(self.shape, False, dtypes.bool_, self.device)
        return (self == math.inf).logical_or(self == -math.inf)

    def isposinf(self: Tensor) -> Tensor:
        return self.isinf().logical_and(self > 0)

    def isneginf(self: Tensor) -> Tensor:
        return self.isinf().logical_and(self < 0)

    def isfinite(self: Tensor) -> Tensor:
        return self.isnan().logical_or(self.isinf()).logical_not()

    def nan_to_num(self: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
        if not self.dtype.is_float:
            return self
        import numpy as np

        finfo = np.finfo(self.dtype.numpy) if self.dtype != dtypes.bfloat16 else np.finfo(np.float32)
        posinf = float(finfo.max) if posinf is None else posinf
        neginf = float(finfo.min) if neginf is None else neginf
        result = self.isnan().where(self._full(self.shape, nan, self.dtype, self.device), self)
        result = (self == math.inf).where(self._full(self.shape, posinf, self.dtype, self.device), result)
        return (self == -math.inf).where(self._full(self.shape, neginf, self.dtype, self.device), result)

    def maximum(self: Tensor, other: Any) -> Tensor:
        left, right = self._operands(other, "maximum")
        if left.dtype.is_bool:
            return left.logical_or(right)
        return left._apply(Op.MAX, right)

    def minimum(self: Tensor, other: Any) -> Tensor:
        left, right = self._operands(other, "minimum")
        if left.dtype.is_bool:
            return left.logical_and(right)
        if left.dtype.is_unsigned:
            return (left < right).where(left, right)
        return -((-left)._apply(Op.MAX, -right))

    fmax, fmin = maximum, minimum

    def clamp(self: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 - torch's names
        if min is None and max is None:
            raise ValueError("clamp: at least one of min and max must be given")
        result = self
        if min is not None:
            result = result.maximum(min)
        if max is not None:
            result = result.minimum(max)
        return result

    clip = clamp

    def clamp_min(self: Tensor, min: Any) -> Tensor:  # noqa: A002
        return self.clamp(min=min)

    def clamp_max(self: Tensor, max: Any) -> Tensor:  # noqa: A002
        return self.clamp(max=max)

    # ---- selection ---------------------------------------------------------------------------------------------

    def where(self: Tensor, input: Any, other: Any) -> Tensor:  # noqa: A002 - torch's names
        """`condition.where(x, y)`: x where self is True, else y (ember.where(condition, x, y) is the same)."""
        condition = self if self.dtype.is_bool else self != 0
        first = input if isinstance(input, ElementwiseOps) else None
        second = other if isinstance(other, ElementwiseOps) else None
        if first is None and second is None:
            dtype = result_type(result_type(dtypes.bool_, input), other)
            if isinstance(input, float) or isinstance(other, float):
                dtype = dtypes.DEFAULT_FLOAT
            first = self._full((), input, dtype, self.device)
            second = self._full((), other, dtype, self.device)
        elif first is None:
            first = second._scalar_like(input, result_type(second.dtype, input))
        elif second is None:
            second = first._scalar_like(other, result_type(first.dtype, other))
        if first.ndim == 0 and second.ndim > 0 and isinstance(input, ElementwiseOps) is False:
            pass
        dtype = promote_types(first.dtype, second.dtype)
        shape = broadcast_shapes(condition.shape, first.shape, second.shape, op="where")
        return condition.expand(shape)._apply(
            Op.WHERE, first.cast(dtype).expand(shape), second.cast(dtype).expand(shape)
        )

    def masked_fill(self: Tensor, mask: Tensor, value: Any) -> Tensor:
        if not isinstance(mask, ElementwiseOps) or mask.dtype != dtypes.bool_:
            raise DTypeError(f"masked_fill: mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
        broadcast_shapes(self.shape, mask.shape, op="masked_fill")
        if isinstance(value, ElementwiseOps):
            value = value.cast(self.dtype)
        else:
            value = self._scalar_like(value, self.dtype)
        return mask.expand(broadcast_shapes(self.shape, mask.shape)).where(value, self).expand(self.shape) if (
            broadcast_shapes(self.shape, mask.shape) == self.shape
        ) else _raise_masked_fill(self, mask)

    def lerp(self: Tensor, end: Any, weight: Any) -> Tensor:
        return self + (end - self) * weight

    # ---- logic and bits ----------------------------------------------------------------------------------------

    def logical_not(self: Tensor) -> Tensor:
        return self.cast(dtypes.bool_)._apply(Op.NOT)

    def logical_and(self: Tensor, other: Any) -> Tensor:
        left, right = self.cast(dtypes.bool_)._operands(_as_bool(self, other), "logical_and")
        return left._apply(Op.AND, right)

    def logical_or(self: Tensor, other: Any) -> Tensor:
        left, right = self.cast(dtypes.bool_)._operands(_as_bool(self, other), "logical_or")
        return left._apply(Op.OR, right)

    def logical_xor(self: Tensor, other: Any) -> Tensor:
        left, right = self.cast(dtypes.bool_)._operands(_as_bool(self, other), "logical_xor")
        return left._apply(Op.XOR, right)

    def _bitwise(self: Tensor, op: Op, other: Any, name: str, reverse: bool = False) -> Tensor:
        left, right = self._operands(other, name, reverse)
        if left.dtype.is_float:
            raise DTypeError(f"{name}: bitwise ops need integer or bool tensors, got {left.dtype.name}")
        return left._apply(op, right)

    def bitwise_and(self: Tensor, other: Any) -> Tensor:
        return self._bitwise(Op.AND, other, "bitwise_and")

    def bitwise_or(self: Tensor, other: Any) -> Tensor:
        return self._bitwise(Op.OR, other, "bitwise_or")

    def bitwise_xor(self: Tensor, other: Any) -> Tensor:
        return self._bitwise(Op.XOR, other, "bitwise_xor")

    def bitwise_not(self: Tensor) -> Tensor:
        if self.dtype.is_float:
            raise DTypeError(f"bitwise_not: needs an integer or bool tensor, got {self.dtype.name}")
        return self._apply(Op.NOT)

    def bitwise_left_shift(self: Tensor, other: Any, reverse: bool = False) -> Tensor:
        return self._bitwise(Op.SHL, other, "bitwise_left_shift", reverse)

    def bitwise_right_shift(self: Tensor, other: Any, reverse: bool = False) -> Tensor:
        return self._bitwise(Op.SHR, other, "bitwise_right_shift", reverse)

    # ---- operators -----------------------------------------------------------------------------------------

    def __add__(self: Tensor, other: Any) -> Tensor:
        return self.add(other)

    def __radd__(self: Tensor, other: Any) -> Tensor:
        return self._binary(Op.ADD, other, "add", reverse=True)

    def __sub__(self: Tensor, other: Any) -> Tensor:
        return self.sub(other)

    def __rsub__(self: Tensor, other: Any) -> Tensor:
        return self._binary(Op.SUB, other, "sub", reverse=True)

    def __mul__(self: Tensor, other: Any) -> Tensor:
        return self.mul(other)

    def __rmul__(self: Tensor, other: Any) -> Tensor:
        return self.mul(other)

    def __truediv__(self: Tensor, other: Any) -> Tensor:
        return self.div(other)

    def __rtruediv__(self: Tensor, other: Any) -> Tensor:
        left, right = self._operands(other, "div", reverse=True)
        return left._float_operand()._apply(Op.DIV, right._float_operand())

    def __floordiv__(self: Tensor, other: Any) -> Tensor:
        return self.floor_divide(other)

    def __rfloordiv__(self: Tensor, other: Any) -> Tensor:
        return self.floor_divide(other, reverse=True)

    def __mod__(self: Tensor, other: Any) -> Tensor:
        return self.remainder(other)

    def __rmod__(self: Tensor, other: Any) -> Tensor:
        return self.remainder(other, reverse=True)

    def __pow__(self: Tensor, other: Any) -> Tensor:
        return self.pow(other)

    def __rpow__(self: Tensor, other: Any) -> Tensor:
        return self.pow(other, reverse=True)

    def __neg__(self: Tensor) -> Tensor:
        return self.neg()

    def __pos__(self: Tensor) -> Tensor:
        return self

    def __abs__(self: Tensor) -> Tensor:
        return self.abs()

    def __invert__(self: Tensor) -> Tensor:
        return self.logical_not() if self.dtype.is_bool else self.bitwise_not()

    def __and__(self: Tensor, other: Any) -> Tensor:
        return self.bitwise_and(other)

    def __rand__(self: Tensor, other: Any) -> Tensor:
        return self.bitwise_and(other)

    def __or__(self: Tensor, other: Any) -> Tensor:
        return self.bitwise_or(other)

    def __ror__(self: Tensor, other: Any) -> Tensor:
        return self.bitwise_or(other)

    def __xor__(self: Tensor, other: Any) -> Tensor:
        return self.bitwise_xor(other)

    def __rxor__(self: Tensor, other: Any) -> Tensor:
        return self.bitwise_xor(other)

    def __lshift__(self: Tensor, other: Any) -> Tensor:
        return self.bitwise_left_shift(other)

    def __rshift__(self: Tensor, other: Any) -> Tensor:
        return self.bitwise_right_shift(other)

    # in-place forms rebind this tensor to the new value (shape and dtype kept, as in torch)
    def __iadd__(self: Tensor, other: Any) -> Tensor:
        return self.assign(self + other)

    def __isub__(self: Tensor, other: Any) -> Tensor:
        return self.assign(self - other)

    def __imul__(self: Tensor, other: Any) -> Tensor:
        return self.assign(self * other)

    def __itruediv__(self: Tensor, other: Any) -> Tensor:
        return self.assign(self / other)

    def __ifloordiv__(self: Tensor, other: Any) -> Tensor:
        return self.assign(self // other)

    def __imod__(self: Tensor, other: Any) -> Tensor:
        return self.assign(self % other)

    def __ipow__(self: Tensor, other: Any) -> Tensor:
        return self.assign(self**other)

    def __iand__(self: Tensor, other: Any) -> Tensor:
        return self.assign(self & other)

    def __ior__(self: Tensor, other: Any) -> Tensor:
        return self.assign(self | other)

    def __ixor__(self: Tensor, other: Any) -> Tensor:
        return self.assign(self ^ other)

    def add_(self: Tensor, other: Any, alpha: Number = 1) -> Tensor:
        return self.assign(self.add(other, alpha))

    def sub_(self: Tensor, other: Any, alpha: Number = 1) -> Tensor:
        return self.assign(self.sub(other, alpha))

    def mul_(self: Tensor, other: Any) -> Tensor:
        return self.assign(self * other)

    def div_(self: Tensor, other: Any) -> Tensor:
        return self.assign(self / other)

    def clamp_(self: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
        return self.assign(self.clamp(min, max))

    def zero_(self: Tensor) -> Tensor:
        return self.assign(self._full(self.shape, 0, self.dtype, self.device))

    def fill_(self: Tensor, value: Any) -> Tensor:
        return self.assign(self._full(self.shape, value, self.dtype, self.device))

    def masked_fill_(self: Tensor, mask: Tensor, value: Any) -> Tensor:
        return self.assign(self.masked_fill(mask, value))


def _promote_with_zero_dim(tensor_dtype: DType, zero_dim_dtype: DType) -> DType:
    """torch: a 0-d tensor only lifts the category of a dimensioned tensor, like a Python scalar does."""
    kind_rank = {"b": 0, "u": 1, "i": 1, "f": 2}
    if kind_rank[zero_dim_dtype.kind] > kind_rank[tensor_dtype.kind]:
        return zero_dim_dtype
    return tensor_dtype


def _as_bool(tensor: Tensor, other: Any) -> Any:
    return other.cast(dtypes.bool_) if isinstance(other, ElementwiseOps) else bool(other)


def _integer_pow(base: Tensor, power: Tensor) -> Tensor:
    """Integer power by repeated squaring over the bits of a non-negative integer exponent (up to 2**62)."""
    result = base._full(base.shape, 1, base.dtype, base.device)
    square = base
    remaining = power
    for _ in range(base.dtype.bits - 1):
        odd = (remaining % 2) == 1
        result = odd.where(result * square, result)
        square = square * square
        remaining = remaining // 2
    return result


def _raise_masked_fill(tensor: Tensor, mask: Tensor) -> Tensor:
    from ember.core.errors import ShapeError

    raise ShapeError(f"masked_fill: mask of shape {mask.shape} must broadcast to the tensor's shape {tensor.shape}")


def _tensor_from(data: Any, device: str) -> Tensor:
    """A plain Tensor from a list or array operand (never a subclass such as nn.Parameter)."""
    from ember.core.tensor import Tensor

    return Tensor(data, device=device)
