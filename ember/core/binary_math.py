"""Two- and three-operand math (copysign, hypot, logaddexp, xlogy, gcd, isclose, lerp, addcmul, ...) as compositions.

Operands are promoted and broadcast like torch (`_operands`); float16/bfloat16 are computed in float32 and rounded
once. Where torch's gradient comes from its own backward formula, the composition is written so that autograd gives
the same values at the edge points too (see manuals/architecture.md, "Gradients of compositions follow torch").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

from ember.core import dtype as dtypes
from ember.core.errors import DTypeError
from ember.core.ops import Composite, Op
from ember.core.tensor_base import TensorBase
from ember.core.unary_math import LN_2, _exp, _in_compute_precision, _log1p

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

Number = int | float | bool
SIGNED_INTEGER_OF_SIZE = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}


def sign_bit(x: Tensor) -> Tensor:
    """Whether a float's sign bit is set, read from its bits: True for -0.0 and negative NaNs too."""
    return x._apply(Op.BITCAST, arg=SIGNED_INTEGER_OF_SIZE[x.dtype.itemsize]) < 0


def magnitude_and_sign(x: Tensor) -> tuple[Tensor, Tensor]:
    """(|x|, sign bit of x) with |x| a select on the sign bit: +0.0 for -0.0, and the derivative of the branch taken
    (+-1, also at +-0: odd functions built on it keep their derivative at 0 and map -0.0 to -0.0)."""
    negative = sign_bit(x)
    return (-x).where(negative, x), negative


def with_sign(value: Tensor, negative: Tensor) -> Tensor:
    return (-value).where(negative, value)


def _natural_log(x: Tensor) -> Tensor:
    return x._apply(Op.LOG2) * LN_2


class BinaryMathOps(TensorBase):
    """Mixin: math on two or three operands. Needs the Tensor primitives and the elementwise methods."""

    __slots__ = ()

    def _float_operands(self, other: Any, name: str, integers: bool = True) -> tuple[Tensor, Tensor]:
        """self and other promoted (torch.result_type) and broadcast; integer and bool results become the default
        float (torch's float ops), or raise like torch's float-only kernels when `integers` is False."""
        left, right = self._operands(other, name)
        if not left.dtype.is_float:
            if not integers:
                raise DTypeError(f"{name}: not supported for {left.dtype.name} operands (as in PyTorch); cast to a "
                                 f"floating point dtype with .float()")
            left, right = left.cast(dtypes.DEFAULT_FLOAT), right.cast(dtypes.DEFAULT_FLOAT)
        return left, right

    # ---- signs ---------------------------------------------------------------------------------------------------

    def signbit(self) -> Tensor:
        """Whether the sign bit is set (True for -0.0 and negative NaNs; for integers, whether x < 0)."""
        if self.dtype.is_bool or self.dtype.is_unsigned:
            return self._full(self.shape, False, dtypes.bool_, self.device)
        if not self.dtype.is_float:
            return self < 0
        return sign_bit(self.cast(dtypes.float32) if self.dtype.itemsize == 2 else cast("Tensor", self))

    def copysign(self, other: Any) -> Tensor:
        """|self| with the sign (bit) of other; integers give floats. The gradient is torch's: +-1, and 0 at 0."""
        left, right = self._float_operands(other, "copysign")
        return left._recorded(Composite.COPYSIGN, _in_compute_precision(_copysign), (left, right))

    # ---- exponential and logarithmic -------------------------------------------------------------------------------

    def logaddexp(self, other: Any) -> Tensor:
        """log(exp(self) + exp(other)) without overflow or underflow (floats only, as in torch)."""
        left, right = self._float_operands(other, "logaddexp", integers=False)
        return _in_compute_precision(lambda a, b: _log_add(a, b, base_two=False))(left, right)

    def logaddexp2(self, other: Any) -> Tensor:
        """log2(2**self + 2**other) without overflow or underflow (floats only, as in torch)."""
        left, right = self._float_operands(other, "logaddexp2", integers=False)
        return _in_compute_precision(lambda a, b: _log_add(a, b, base_two=True))(left, right)

    def xlogy(self, other: Any) -> Tensor:
        """self * log(other), and 0 where self is 0 (unless other is NaN); integers give floats."""
        left, right = self._float_operands(other, "xlogy")
        return _in_compute_precision(_xlogy)(left, right)

    def hypot(self, other: Any) -> Tensor:
        """sqrt(self**2 + other**2) without overflow or underflow; inf if either is infinite (floats only)."""
        left, right = self._float_operands(other, "hypot", integers=False)
        return _in_compute_precision(_hypot)(left, right)

    def ldexp(self, other: Any) -> Tensor:
        """self * 2**other (torch.ldexp: integer operands give floats)."""
        return self._float_operand() * (2.0 ** other)

    # ---- step, maximum, minimum ----------------------------------------------------------------------------------

    def heaviside(self, values: Any) -> Tensor:
        """0 where self < 0, values where self == 0, 1 where self > 0 (and 0 for NaN, as torch on CPU)."""
        if hasattr(values, "dtype") and values.dtype is not self.dtype:
            raise DTypeError(f"heaviside: the input ({self.dtype.name}) and values ({values.dtype.name}) must have "
                             f"the same dtype (as in PyTorch); cast one of them")
        left, right = self._operands(values, "heaviside")
        positive = left > 0
        step = positive.cast(left.dtype)
        return right.where(left == 0, step)

    def fmax(self, other: Any) -> Tensor:
        """The larger of self and other, ignoring a NaN when the other is a number (torch.fmax); the gradient goes
        to self where self >= other (ties included) or other is NaN, as in torch."""
        left, right = self._operands(other, "fmax")
        if not left.dtype.is_float:
            return left.maximum(right)
        return left.where((left >= right).logical_or(right.isnan()), right)

    def fmin(self, other: Any) -> Tensor:
        """The smaller of self and other, ignoring a NaN when the other is a number (torch.fmin); ties and a NaN
        other give the gradient to self, as in torch."""
        left, right = self._operands(other, "fmin")
        if not left.dtype.is_float:
            return left.minimum(right)
        return left.where((left <= right).logical_or(right.isnan()), right)

    # ---- integer number theory -----------------------------------------------------------------------------------

    def gcd(self, other: Any) -> Tensor:
        """The greatest common divisor (non-negative) of integers, by Euclid's algorithm unrolled for the dtype."""
        left, right = self._integer_operands(other, "gcd")
        return _gcd(left, right)

    def lcm(self, other: Any) -> Tensor:
        """The least common multiple (non-negative) of integers: |a / gcd(a, b) * b|, and 0 where gcd is 0."""
        left, right = self._integer_operands(other, "lcm")
        divisor = _gcd(left, right)
        zero = left._full(left.shape, 0, left.dtype, left.device)
        return zero.where(divisor == zero, (left._apply(Op.IDIV, divisor) * right).abs())  # x // 0 is 0, no trap

    def _integer_operands(self, other: Any, name: str) -> tuple[Tensor, Tensor]:
        left, right = self._operands(other, name)
        if left.dtype.is_float or left.dtype.is_bool:
            raise DTypeError(f"{name}: needs integer operands, got {left.dtype.name} (as in PyTorch)")
        return left, right

    # ---- closeness -----------------------------------------------------------------------------------------------

    def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
        """|self - other| <= atol + rtol * |other| elementwise, or equal (infinities only match themselves); NaNs
        match each other only with equal_nan. self and a tensor other must have the same dtype, as in torch."""
        if hasattr(other, "dtype") and other.dtype is not self.dtype:
            raise DTypeError(f"isclose: {self.dtype.name} and {other.dtype.name} differ; torch needs one dtype "
                             f"(cast one of them)")
        if rtol < 0 or atol < 0:
            raise ValueError(f"isclose: rtol and atol must be non-negative, got rtol={rtol}, atol={atol}")
        left, right = self._operands(other, "isclose")
        close = left == right
        if equal_nan and left.dtype.is_float:
            close = close.logical_or(left.isnan().logical_and(right.isnan()))
        if (rtol == 0 and atol == 0) or left.dtype.is_bool:
            return close
        difference = left - right  # in the operands' dtype, as torch (integers wrap)
        if not left.dtype.is_float:
            right = right.cast(dtypes.DEFAULT_FLOAT)
        allowed = (right * rtol).abs() + atol
        actual = difference.abs()
        return close.logical_or(actual.isfinite().logical_and(actual <= allowed))

    def allclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
        """Whether isclose holds everywhere, as a Python bool (this reads the result)."""
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    # ---- interpolation and fused multiply-add forms --------------------------------------------------------------

    def lerp(self, end: Any, weight: Any) -> Tensor:
        """self + weight * (end - self), computed as torch does: from the end for |weight| >= 0.5 (so weight 1 gives
        end exactly). self, end and a tensor weight must share one float dtype, as in torch."""
        if not self.dtype.is_float:
            raise DTypeError(f"lerp: needs a floating point tensor, got {self.dtype.name} (as in PyTorch)")
        for name, operand in (("end", end), ("weight", weight)):
            if hasattr(operand, "dtype") and operand.dtype is not self.dtype:
                raise DTypeError(f"lerp: expected dtype {self.dtype.name} for `{name}` but got {operand.dtype.name} "
                                 f"(as in PyTorch); cast it")
        from ember.core.elementwise import _align

        return _in_compute_precision(_lerp)(*_align(cast("Tensor", self), (cast("Tensor", self), end, weight), "lerp"))

    def addcmul(self, tensor1: Any, tensor2: Any, value: Number = 1) -> Tensor:
        """self + value * tensor1 * tensor2, promoted and broadcast together (torch.addcmul)."""
        first, second, result = self._fused_operands(tensor1, tensor2, value, "addcmul")
        return result + first * second

    def addcdiv(self, tensor1: Any, tensor2: Any, value: Number = 1) -> Tensor:
        """self + value * tensor1 / tensor2, promoted and broadcast together (torch.addcdiv; not for integers)."""
        if all(hasattr(operand, "dtype") and not operand.dtype.is_float for operand in (tensor1, tensor2)):
            raise DTypeError("addcdiv: integer division of tensor1 by tensor2 is not supported (as in PyTorch); use "
                             "addcmul with the reciprocal or cast to a floating point dtype")
        first, second, result = self._fused_operands(tensor1, tensor2, value, "addcdiv")
        return result + first / second

    def _fused_operands(self, tensor1: Any, tensor2: Any, value: Number, name: str
                        ) -> tuple[Tensor, Tensor, Tensor]:
        """(value * tensor1, tensor2, self), all promoted to their torch.result_type and broadcast to one shape."""
        from ember.core.elementwise import _align

        result, first, second = _align(cast("Tensor", self), (cast("Tensor", self), tensor1, tensor2), name)
        if not result.dtype.is_float and not float(value).is_integer():
            raise DTypeError(f"{name}: value must be an integer for {result.dtype.name} operands, got {value!r}")
        if result.dtype.is_bool:
            raise DTypeError(f"{name}: not supported for bool operands; cast to a number dtype")
        if value != 1:
            first = first * value
        return first, second, result

    # ---- powers ------------------------------------------------------------------------------------------------------

    def float_power(self, exponent: Any) -> Tensor:
        """self ** exponent in float64, whatever the input dtypes (torch.float_power)."""
        if isinstance(exponent, BinaryMathOps):
            return self.double().pow(exponent.double())
        return self.double().pow(float(exponent))


# ---- the float kernels (operands of one float32 or float64 dtype and one shape) -----------------------------------


def _copysign(magnitude: Tensor, sign: Tensor) -> Tensor:
    """A zero self takes a constant signed zero: torch's gradient result / self is masked to 0 there. A NaN self has
    torch's NaN gradient (NaN / NaN); an infinite one +-1 (torch: inf / inf = NaN)."""
    flipped = sign_bit(magnitude) != sign_bit(sign)
    signed_zero = magnitude._constant(-0.0).where(sign_bit(sign), 0.0)
    result = signed_zero.where(magnitude == 0, (-magnitude).where(flipped, magnitude))
    return result * magnitude._constant(1.0).where(magnitude.isnan().logical_not(), math.nan)


def _log_add(a: Tensor, b: Tensor, base_two: bool) -> Tensor:
    """max(a, b) + log1p(b^-|a - b|) for base e or 2. At a == b the max splits the gradient in halves and |a - b|
    passes none: torch's 1 / (1 + exp(0)). Equal infinities give themselves (inf - inf would be NaN)."""
    larger = a._apply(Op.MAX, b)
    distance = (a - b).abs()
    if base_two:
        result = larger + _log1p((-distance)._apply(Op.EXP2)) * (1.0 / LN_2)
    else:
        result = larger + _log1p(_exp(-distance))
    return a.where(a.isinf().logical_and(a == b), result)


def _xlogy(x: Tensor, y: Tensor) -> Tensor:
    """x log y, and +0 where x is 0 and y is no NaN. The gradients are torch's: d/dx = log y, at x = 0 only where
    y > 0 (else 0; at y = +inf 0, where torch's is inf), and d/dy = x / y from the log's own backward, so 0 / 0 = NaN
    at x = y = 0. Each branch gets a finite log where it is not selected, so no 0 * inf reaches x."""
    logarithm = _natural_log(y)
    at_zero = (x == 0).logical_and(y.isnan().logical_not())
    finite_positive = (y > 0).logical_and(y != math.inf)
    zero_branch = x.where(at_zero, 0.0) * logarithm.where(finite_positive, 0.0) + 0.0  # +0.0 for x = -0.0 too
    return zero_branch.where(at_zero, x * logarithm.where(at_zero.logical_not(), 1.0))


def _hypot(x: Tensor, y: Tensor) -> Tensor:
    """m sqrt(1 + (n / m)^2) with m, n the larger and smaller magnitude: no overflow of x^2. inf where either is
    infinite (also with a NaN), with the gradient +-1 to the infinite one (torch's x / hypot is inf / inf = NaN
    there). At (0, 0) the unselected branch's 0 / 0 reaches both gradients as NaN, torch's x / hypot = 0 / 0."""
    x_magnitude, _ = magnitude_and_sign(x)
    y_magnitude, _ = magnitude_and_sign(y)
    infinite = x.isinf().logical_or(y.isinf())
    x_finite, y_finite = x_magnitude.where(infinite.logical_not(), 1.0), y_magnitude.where(infinite.logical_not(), 1.0)
    swap = y_finite > x_finite
    larger = y_finite.where(swap, x_finite)
    smaller = x_finite.where(swap, y_finite)
    ratio = smaller / larger
    result = larger * (ratio * ratio + 1.0)._apply(Op.SQRT)
    result = x._constant(0.0).where((x_magnitude == 0).logical_and(y_magnitude == 0), result)
    return x_magnitude.where(x.isinf(), y_magnitude).where(infinite, result)


def _lerp(start: Tensor, end: Tensor, weight: Tensor) -> Tensor:
    difference = end - start
    from_start = start + weight * difference
    from_end = end - difference * (1.0 - weight)
    return from_start.where(weight.abs() < 0.5, from_end)


def _gcd(a: Tensor, b: Tensor) -> Tensor:
    """torch's loop `while a != 0: a, b = b % a, a` unrolled for as many steps as Euclid can take in the dtype: two
    consecutive Fibonacci numbers are the slowest pair, so the steps are the Fibonacci numbers up to the maximum."""
    a, b = a.abs(), b.abs()
    zero = a._full(a.shape, 0, a.dtype, a.device)
    for _ in range(_euclid_steps(a.dtype)):
        a, b = b._apply(Op.MOD, a), a.where(a != zero, b)  # b % 0 is 0 (no trap): a finished pair stays (0, gcd)
    return b


def _euclid_steps(dtype: dtypes.DType) -> int:
    """The most steps Euclid's algorithm takes on values of dtype (one more for a first swap when a > b)."""
    largest = dtypes.max_value(dtype)
    previous, current, steps = 1, 1, 1
    while current <= largest:
        previous, current, steps = current, previous + current, steps + 1
    return steps + 1
