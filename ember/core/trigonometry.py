"""Inverse trigonometric and hyperbolic functions, atan2, sinc and angle conversions, as compositions of primitives.

atan and asin are polynomials fitted here after the classic range reductions (Cody and Waite, "Software Manual for
the Elementary Functions", 1980): atan(a) = pi/2 - atan(1/a) for a > 1, then atan(u) = pi/4 + atan((u-1)/(u+1)) for
u > tan(pi/8); asin(a) = pi/2 - 2 asin(sqrt((1-a)/2)) for a > 1/2. The kernels (atan(v) - v) / v^3 and
(asin(s) - s) / s^3 are polynomials in v^2 (s^2) fitted by weighted least squares on Chebyshev nodes, reweighted
toward the minimax relative error (Lawson's iteration), in 34-digit arithmetic; their relative errors are below the
rounding of each dtype. The hyperbolic functions are built on expm1/log1p (relative accuracy near 0) and switch to
exp/log forms where e^x or x^2 would overflow. Odd functions take the sign from the sign bit, so -0.0 gives -0.0.
float16/bfloat16 inputs are computed in float32 and rounded once; integers give the default float, as in torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ember.core import dtype as dtypes
from ember.core.binary_math import magnitude_and_sign, with_sign
from ember.core.ops import Op
from ember.core.tensor_base import TensorBase
from ember.core.unary_math import LN_2, _exp, _expm1, _in_compute_precision, _log1p, horner

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

HALF_PI = math.pi / 2
TAN_PI_8 = math.tan(math.pi / 8)
# (atan(v) - v) / v^3 as a polynomial in z = v^2 for |v| <= tan(pi/8); relative error 4.6e-8 and 9.3e-17
ATAN_COEFFICIENTS = {
    dtypes.float32: (-0.3333333179171644, 0.199995460782207, -0.14264116894399248, 0.10745225005496288,
                     -0.06456258669302241),
    dtypes.float64: (-0.3333333333333333, 0.19999999999995607, -0.14285714284683157, 0.11111111016489132,
                     -0.09090904624615172, 0.07692184198526011, -0.06664524751018448, 0.05858257659457289,
                     -0.05085987095978886, 0.03924636312535543, -0.019193993228717097),
}
# (asin(s) - s) / s^3 as a polynomial in z = s^2 for 0 <= s <= 1/2; relative error 2.1e-8 and 1.2e-15
ASIN_COEFFICIENTS = {
    dtypes.float32: (0.1666666631827437, 0.0750009844806792, 0.044598135808965794, 0.03111497180565014,
                     0.017083362805181437, 0.033796829640045684),
    dtypes.float64: (0.16666666666666646, 0.07500000000021995, 0.044642857101439684, 0.030381947491719814,
                     0.022372043621021007, 0.017355335195962905, 0.013928773546341576, 0.011882090856065126,
                     0.007771177098058088, 0.01613050153324859, -0.010909474984811263, 0.028286185341751122),
}
# sin(p) / p = sum (-p^2)^k / (2k + 1)!: the terms for |p| < 1 down to each dtype's rounding
SINC_SERIES = {dtype: tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(terms))
               for dtype, terms in ((dtypes.float32, 7), (dtypes.float64, 11))}
HUGE = 2.0**28  # asinh/acosh: beyond this sqrt(x^2 + 1) is |x| to rounding, so the result is log(2|x|)
EXP_HALF_SQUARED_FROM = 20.0  # beyond this e^-|x| is below the rounding of e^|x|: sinh and cosh are e^|x| / 2


class TrigonometryOps(TensorBase):
    """Mixin: inverse trigonometric and hyperbolic functions. Needs the Tensor primitives and elementwise methods."""

    __slots__ = ()

    def asin(self) -> Tensor:
        return _in_compute_precision(_asin)(self._float_operand())

    def acos(self) -> Tensor:
        return _in_compute_precision(_acos)(self._float_operand())

    def atan(self) -> Tensor:
        return _in_compute_precision(_atan)(self._float_operand())

    def atan2(self, other: Any) -> Tensor:
        """The angle of the point (other, self) in (-pi, pi], with C's values at zeros and infinities."""
        left, right = self._float_operands(other, "atan2")
        return _in_compute_precision(_atan2)(left, right)

    def sinh(self) -> Tensor:
        return _in_compute_precision(_sinh)(self._float_operand())

    def cosh(self) -> Tensor:
        return _in_compute_precision(_cosh)(self._float_operand())

    def asinh(self) -> Tensor:
        return _in_compute_precision(_asinh)(self._float_operand())

    def acosh(self) -> Tensor:
        return _in_compute_precision(_acosh)(self._float_operand())

    def atanh(self) -> Tensor:
        return _in_compute_precision(_atanh)(self._float_operand())

    arcsin, arccos, arctan, arctan2 = asin, acos, atan, atan2
    arcsinh, arccosh, arctanh = asinh, acosh, atanh

    def sinc(self) -> Tensor:
        """sin(pi x) / (pi x), and 1 at 0 (with torch's zero gradient there)."""
        return _in_compute_precision(_sinc)(self._float_operand())

    def deg2rad(self) -> Tensor:
        return self._float_operand() * (math.pi / 180.0)

    def rad2deg(self) -> Tensor:
        return self._float_operand() * (180.0 / math.pi)


# ---- the float kernels (float32 or float64 operands) ----------------------------------------------------------------


def _natural_log(x: Tensor) -> Tensor:
    return x._apply(Op.LOG2) * LN_2


def _atan_unit(u: Tensor) -> Tensor:
    """atan(u) for 0 <= u <= 1 (or NaN): the kernel on v = u, or on v = (u - 1) / (u + 1) plus pi/4."""
    shifted = u > TAN_PI_8
    v = ((u - 1.0) / (u + 1.0)).where(shifted, u)
    square = v * v
    result = v + v * square * horner(square, ATAN_COEFFICIENTS[u.dtype])
    return (result + math.pi / 4).where(shifted, result)


def _atan(x: Tensor) -> Tensor:
    magnitude, negative = magnitude_and_sign(x)
    inverted = magnitude > 1
    unit = magnitude.where(inverted, 1.0)._apply(Op.RECIPROCAL).where(inverted, magnitude)  # 1/|x| only where used
    result = _atan_unit(unit)
    return with_sign((HALF_PI - result).where(inverted, result), negative)


def _atan2(y: Tensor, x: Tensor) -> Tensor:
    """atan of min(|x|, |y|) / max(|x|, |y|), moved to its quadrant. At (0, 0) and (+-inf, +-inf) the value is a
    constant and the ratio gets safe operands (no 0 / 0 in its backward): the gradient is 0 there, as torch's (which
    masks x / (x^2 + y^2) where the reciprocal is infinite)."""
    y_magnitude, y_negative = magnitude_and_sign(y)
    x_magnitude, x_negative = magnitude_and_sign(x)
    both_zero = (y_magnitude == 0).logical_and(x_magnitude == 0)
    both_infinite = (y_magnitude == math.inf).logical_and(x_magnitude == math.inf)
    constant = both_zero.logical_or(both_infinite)
    y_magnitude, x_magnitude = y_magnitude.where(constant.logical_not(), 1.0), x_magnitude.where(constant.logical_not(), 1.0)
    swap = y_magnitude > x_magnitude
    result = _atan_unit(x_magnitude.where(swap, y_magnitude) / y_magnitude.where(swap, x_magnitude))
    result = (HALF_PI - result).where(swap, result)
    result = x._constant(0.0).where(both_zero, result)
    result = x._constant(math.pi / 4).where(both_infinite, result)
    return with_sign((math.pi - result).where(x_negative, result), y_negative)


def _asin_parts(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(k, near_zero, negative): k = asin(|x|) where |x| <= 1/2, else k = asin(sqrt((1 - |x|) / 2)) (NaN beyond 1;
    at |x| = 1 the sqrt's derivative gives the infinite slope of asin and acos there)."""
    magnitude, negative = magnitude_and_sign(x)
    near_zero = magnitude <= 0.5
    far_square = (1.0 - magnitude) * 0.5  # at least 1/4 where unselected: no sqrt'(0) in that backward
    square = (magnitude * magnitude).where(near_zero, far_square)
    root = magnitude.where(near_zero, far_square._apply(Op.SQRT))
    kernel = root + root * square * horner(square, ASIN_COEFFICIENTS[x.dtype])
    return kernel, near_zero, negative


def _asin(x: Tensor) -> Tensor:
    kernel, near_zero, negative = _asin_parts(x)
    return with_sign(kernel.where(near_zero, HALF_PI - kernel * 2.0), negative)


def _acos(x: Tensor) -> Tensor:
    """pi/2 - asin(x) near 0; 2 asin(sqrt((1 - x) / 2)) near 1 and pi - 2 asin(sqrt((1 + x) / 2)) near -1, which keep
    the relative accuracy of small results."""
    kernel, near_zero, negative = _asin_parts(x)
    far = (math.pi - kernel * 2.0).where(negative, kernel * 2.0)
    return (HALF_PI - with_sign(kernel, negative)).where(near_zero, far)


def _exp_half_squared(magnitude: Tensor, large: Tensor) -> Tensor:
    """e^|x| / 2 as (e^(|x|/2) / 2) e^(|x|/2): finite wherever the result is (e^|x| alone overflows first)."""
    half = _exp(magnitude.where(large, 0.0) * 0.5)
    return half * 0.5 * half


def _sinh_moderate(magnitude: Tensor) -> Tensor:
    """sinh |x| = (m + m / (m + 1)) / 2 with m = expm1(|x|): no cancellation near 0."""
    m = _expm1(magnitude)
    return (m + m / (m + 1.0)) * 0.5


def _sinh(x: Tensor) -> Tensor:
    magnitude, negative = magnitude_and_sign(x)
    large = magnitude > EXP_HALF_SQUARED_FROM
    moderate = _sinh_moderate(magnitude.where(large.logical_not(), 0.0))
    return with_sign(_exp_half_squared(magnitude, large).where(large, moderate), negative)


def _cosh(x: Tensor) -> Tensor:
    """cosh x = 1 + 2 sinh(x/2)^2: its derivative 2 sinh(x/2) cosh(x/2) is sinh x, accurate near 0."""
    magnitude, _ = magnitude_and_sign(x)
    large = magnitude > EXP_HALF_SQUARED_FROM
    half_sinh = _sinh_moderate(magnitude.where(large.logical_not(), 0.0) * 0.5)
    return _exp_half_squared(magnitude, large).where(large, half_sinh * half_sinh * 2.0 + 1.0)


def _asinh(x: Tensor) -> Tensor:
    """log1p(|x| + x^2 / (1 + sqrt(1 + x^2))) (accurate near 0), log|x| + log 2 beyond HUGE (no overflow of x^2)."""
    magnitude, negative = magnitude_and_sign(x)
    huge = magnitude > HUGE
    moderate_input = magnitude.where(huge.logical_not(), 1.0)
    square = moderate_input * moderate_input
    moderate = _log1p(moderate_input + square / ((square + 1.0)._apply(Op.SQRT) + 1.0))
    large = _natural_log(magnitude.where(huge, 1.0)) + LN_2
    return with_sign(large.where(huge, moderate), negative)


def _acosh(x: Tensor) -> Tensor:
    """log1p(t + sqrt(t (t + 2))) with t = x - 1 (exact near 1), log x + log 2 beyond HUGE. Below 1 the value is NaN
    and the gradient torch's 1 / sqrt(x^2 - 1): that of NaN - acosh(|x|) (finite below -1, NaN in (-1, 1))."""
    magnitude, _ = magnitude_and_sign(x)
    huge = magnitude > HUGE
    t = magnitude.where(huge.logical_not(), 2.0) - 1.0
    moderate = _log1p(t + t._apply(Op.SQRT) * (t + 2.0)._apply(Op.SQRT))  # sqrt(t) alone: inf slope at 1, no inf * 0
    result = (_natural_log(magnitude.where(huge, 2.0)) + LN_2).where(huge, moderate)
    return result.where(x >= 1.0, math.nan - result)


def _atanh(x: Tensor) -> Tensor:
    """log1p(2a / (1 - a)) / 2 for a = |x| < 1/2; (log(1 + a) - log(1 - a)) / 2 from 1/2 on, whose log poles give
    torch's gradient 1 / (1 - x^2) at +-1 (inf) and beyond (finite, where the value is NaN)."""
    magnitude, negative = magnitude_and_sign(x)
    small = magnitude < 0.5
    near_zero = magnitude.where(small, 0.0)
    inner = _log1p(near_zero * 2.0 / (1.0 - near_zero)) * 0.5
    outer_input = magnitude.where(small.logical_not(), 0.75)
    outer = (_natural_log(outer_input + 1.0) - _natural_log(1.0 - outer_input)) * 0.5
    return with_sign(inner.where(small, outer), negative)


def _sinc(x: Tensor) -> Tensor:
    """sin(p) / p with p = pi x, and its Taylor series sum (-p^2)^k / (2k + 1)! for |p| < 1: 1 at 0 with torch's
    zero gradient there, and a gradient without the cancellation of cos(p) / p - sin(p) / p^2 near 0 (torch's float32
    sinc' is percents off at |x| ~ 1e-3)."""
    product = x * math.pi
    small = product.abs() < 1.0
    near_zero = product.where(small, 0.0)  # no inf * 0 from the unselected series' backward at huge x
    series = horner(near_zero * near_zero, SINC_SERIES[x.dtype])
    safe = product.where(small.logical_not(), 1.0)
    return series.where(small, safe._apply(Op.SIN) / safe)
