"""Special functions (erfinv, logit, lgamma, digamma, i0) as compositions of primitives, accurate over the whole domain.

Methods (the code and the fitted coefficients are ember's own):
- erfinv: x p(w) with w = -log(1 - x^2), after Giles ("Approximating the erfinv function", GPU Computing Gems, 2011):
  p is a polynomial in w for w < 5 and in sqrt(w) beyond, fitted here by weighted least squares on Chebyshev nodes,
  reweighted toward the minimax relative error (Lawson's iteration) in 34-digit arithmetic.
- lgamma: the recurrence moves x > -1/2 into [3/2, 5/2), where lgamma(2 + z) = z M(z) with M such a fitted polynomial
  (so the zeros at 1 and 2 keep relative accuracy), or up to 10, where Stirling's series holds; x <= -1/2 uses the
  reflection lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x) with the sine of the exactly reduced x - round(x).
- digamma: the reflection digamma(x) = digamma(1 - x) - pi / tan(pi x) for x < 0, the recurrence
  digamma(y) = digamma(y + 10) - sum 1 / (y + k) below 10, then the asymptotic series in 1 / y^2.
- i0: its power series sum (x^2 / 4)^k / (k!)^2 (positive terms, no cancellation) up to a dtype's limit, and the
  asymptotic series e^x / sqrt(2 pi x) sum prod (2j - 1)^2 / (8j x) beyond, as e^(x/2) (e^(x/2) ...) so that it is
  finite wherever i0 is (torch's float32 i0 overflows from x = 89, where i0 is 2e37).
float16/bfloat16 inputs are computed in float32 and rounded once; integers give the default float, as in torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.core import dtype as dtypes
from ember.core.binary_math import magnitude_and_sign
from ember.core.ops import Op
from ember.core.tensor_base import TensorBase
from ember.core.unary_math import LN_2, _cos, _exp, _in_compute_precision, _log1p, horner

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

FLOAT32, FLOAT64 = dtypes.float32, dtypes.float64

# erfinv(x) / x as a polynomial in t = (w - 5/2) / (5/2) for w = -log(1 - x^2) < 5; relative error 2.3e-9, 3.6e-17
ERFINV_CENTRAL = {
    FLOAT32: (1.5014093535095474, 0.6166007191327306, -0.02610837103408605, -0.019574135940065723,
              0.008526663126685964, -0.00048455944873187866, -0.0008385218252886163, 0.0002843549191206316,
              2.7514911683473253e-05, -3.34642951705259e-05, 3.203133805881863e-06),
    FLOAT64: (1.5014093511107918, 0.616600691860417, -0.02610823577738683, -0.01957356105950621,
              0.00852540095054734, -0.000487898399274145, -0.0008341356381193966, 0.000292190695043466,
              2.0472377146066503e-05, -4.1432127821528534e-05, 8.652895625373388e-06, 2.8518442668383816e-06,
              -1.8543339693149618e-06, 1.3542856026446137e-07, 2.0033444304137956e-07, -7.035885781801578e-08,
              -7.585671878217238e-09, 1.060146986911142e-08, -1.385993155145694e-09, -7.767617591157138e-10,
              2.1288088398394725e-10),
}
# (low, high, coefficients): erfinv(x) / x as a polynomial in u = (q - center) / half_width for q = sqrt(w) in
# [low, high), up to the largest q of the dtype below |x| = 1 (4.0 in float32, 6.0 in float64); relative errors
# 1.5e-9 (float32), TAIL64 (float64)
ERFINV_TAILS = {
    FLOAT32: ((math.sqrt(5.0), 4.1, (
        3.001526807039595, 0.9359706617060239, 0.00556230161810616, -0.0037981953592231654, 0.002476421894516501,
        -0.001553554513416136, 0.0007689564224811621, -0.00021169365432206611, -4.106611326196175e-05,
        5.8847510580037215e-05, -1.4597451582905865e-05)),),
    FLOAT64: ((math.sqrt(5.0), 4.1, (
        3.001526811460733, 0.93597067407609, 0.005562028717738031, -0.003798474973880946, 0.002479177644177827,
        -0.0015520323003127899, 0.0007586963698186523, -0.0002143245433531715, -2.373406384729488e-05,
        5.895408353095384e-05, -2.7948128652200937e-05, 3.362618991374991e-06, 3.4393300286193157e-06,
        -2.3196824527006105e-06, 5.034432181896943e-07, 2.1390727266756156e-07, -1.6653371574720506e-07,
        7.973434864419525e-09, 1.37876326771525e-08)),
              (4.1, 6.1, (
        4.950934853078874, 1.0102665645022915, -0.00019885886862142067, -0.00018651301732053422,
        6.680006837844072e-05, -1.7162632461235804e-05, 3.889938714332372e-06, -8.310758335519238e-07,
        1.7913316207522889e-07, -4.5416224730649694e-08, 1.6548638322486287e-08, -8.18783070990073e-09,
        4.2782309058531725e-09, -1.997607064379839e-09, 8.176028430208663e-10, -3.1421938197611707e-10,
        7.827035287545295e-11, 1.4500779306683066e-11, -1.1538768453474003e-11))),
}
# lgamma(2 + z) / z as a polynomial in z for |z| <= 1/2; relative error 2.4e-9 and 8.8e-17
LGAMMA_COEFFICIENTS = {
    FLOAT32: (0.42278433451094444, 0.3224670188100662, -0.0673522187832361, 0.020581600972359396,
              -0.007387427434003374, 0.002879063664362769, -0.0011778417824540486, 0.0005698065928615637,
              -0.0002698495671314114),
    FLOAT64: (0.42278433509846713, 0.3224670334241122, -0.06735230105318624, 0.0205808084279809,
              -0.007385551029725029, 0.002890510319661035, -0.001192753875735669, 0.0005096698043484059,
              -0.00022315537440523669, 9.945378787514158e-05, -4.492034074560345e-05, 2.0535193041322032e-05,
              -9.472297029747368e-06, 4.256403555791993e-06, -1.93490918625093e-06, 1.2148612431632522e-06,
              -6.205258974177078e-07),
}
ASYMPTOTIC_FROM = 10.0  # lgamma's Stirling series and digamma's asymptotic series start here
# Stirling: lgamma(y) = (y - 1/2) log y - y + log(2 pi) / 2 + sum B_2k / (2k (2k - 1) y^(2k - 1))
STIRLING_COEFFICIENTS = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156)
# digamma(y) = log y - 1 / (2y) - sum B_2k / (2k y^2k)
DIGAMMA_COEFFICIENTS = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12)
SERIES_TERMS = {FLOAT32: 3, FLOAT64: 7}  # the next term is below the dtype's rounding from y = 10 on
LOG_PI = math.log(math.pi)
# i0: the power series up to the limit, with as many terms as it needs there; the asymptotic series beyond
I0_SERIES_LIMIT = {FLOAT32: 12.0, FLOAT64: 25.0}
I0_SERIES = {dtype: tuple(1.0 / math.factorial(k) ** 2 for k in range(terms))
             for dtype, terms in ((FLOAT32, 20), (FLOAT64, 40))}
I0_OVERFLOW = {FLOAT32: 91.9008, FLOAT64: 713.987}  # i0 exceeds the largest finite value beyond these
I0_FOLDED_FROM = {FLOAT32: 85.0, FLOAT64: 700.0}  # where i0 / sqrt(2 pi x) would overflow (see _i0)
I0_ASYMPTOTIC = {dtype: tuple(math.prod((2 * j - 1) ** 2 / (8 * j) for j in range(1, k + 1)) for k in range(terms))
                 for dtype, terms in ((FLOAT32, 12), (FLOAT64, 21))}


class SpecialFunctionOps(TensorBase):
    """Mixin: erfinv, logit, lgamma, digamma, i0. Needs the Tensor primitives and the elementwise methods."""

    __slots__ = ()

    def erfinv(self) -> Tensor:
        """The inverse of erf on [-1, 1] (+-inf at +-1, NaN beyond)."""
        return _in_compute_precision(_erfinv)(self._float_operand())

    def lgamma(self) -> Tensor:
        """log |Gamma(x)| (+inf at the poles 0, -1, -2, ... and at +-inf)."""
        return _in_compute_precision(_lgamma)(self._float_operand())

    def digamma(self) -> Tensor:
        """The logarithmic derivative of Gamma (-inf at +0, +inf at -0, NaN at the negative integers)."""
        return _in_compute_precision(_digamma)(self._float_operand())

    psi = digamma

    def logit(self, eps: float | None = None) -> Tensor:
        """log(x / (1 - x)), the inverse of sigmoid; with eps, x is clamped to [eps, 1 - eps] first (a zero
        gradient outside), as in torch."""
        operand = self._float_operand()
        if eps is not None:
            if not 0 <= eps <= 0.5:
                raise ValueError(f"logit: eps must be in [0, 0.5] (or None), got {eps!r}")
            operand = operand.clamp(eps, 1.0 - eps)
        return _in_compute_precision(_logit)(operand)

    def i0(self) -> Tensor:
        """The modified Bessel function of the first kind of order 0."""
        return _in_compute_precision(_i0)(self._float_operand())


# ---- the float kernels (float32 or float64 operands) ----------------------------------------------------------------


def _natural_log(x: Tensor) -> Tensor:
    return x._apply(Op.LOG2) * LN_2


def _erfinv(x: Tensor) -> Tensor:
    """x p(w). At +-1 the value is x / (1 - |x|) = +-inf, whose gradient is torch's infinite one."""
    magnitude, _ = magnitude_and_sign(x)
    edge = magnitude == 1.0
    inside = magnitude.where(edge.logical_not(), 0.0)  # no log(0) in the backward of the unselected branch
    w = -_natural_log((1.0 - inside) * (inside + 1.0))
    central = w < 5.0
    factor = horner((w.where(central, 2.5) - 2.5) * 0.4, ERFINV_CENTRAL[x.dtype])
    q = w.where(central.logical_not(), 5.0)._apply(Op.SQRT)
    for low, high, coefficients in ERFINV_TAILS[x.dtype]:
        piece = horner((q - (low + high) * 0.5) * (2.0 / (high - low)), coefficients)
        factor = piece.where(central.logical_not().logical_and(q >= low), factor)
    at_edge = x.where(edge, 0.0)
    result = (at_edge / (1.0 - at_edge.abs())).where(edge, x.where(edge.logical_not(), 0.0) * factor)
    return result * x._constant(1.0).where(magnitude <= 1.0, math.nan)  # NaN beyond +-1, and its gradient


def _logit(x: Tensor) -> Tensor:
    """log x - log1p(-x) below 1/4 (no cancellation: the result is below -1); 2 atanh(2x - 1) from 1/4 on, where
    2x - 1 is exact, so there is no cancellation near x = 1/2 (where torch's log(x / (1 - x)) loses digits) or near
    1. Both differentiate to torch's 1 / (x (1 - x)); outside [0, 1] value and gradient are NaN, as in torch."""
    from ember.core.trigonometry import _atanh

    low = x < 0.25
    below_input = x.where(low, 0.125)
    below = _natural_log(below_input) - _log1p(-below_input)
    above = _atanh(x.where(low.logical_not(), 0.5) * 2.0 - 1.0) * 2.0
    result = below.where(low, above)
    return result * x._constant(1.0).where((x >= 0).logical_and(x <= 1), math.nan)


def _reduced_half_turns(x: Tensor) -> Tensor:
    """x - round(x) in [-1/2, 1/2], exactly, for x <= 0: sin(pi x) and tan(pi x) of it need no large argument."""
    fraction = x - x._apply(Op.TRUNC)  # in (-1, 0]
    return (fraction + 1.0).where(fraction < -0.5, fraction)


def _lgamma_above_minus_half(y: Tensor) -> Tensor:
    """lgamma(y) for y > -1/2 (and +inf, NaN)."""
    stirling = y >= ASYMPTOTIC_FROM
    near = y.where(stirling.logical_not(), 2.0)
    # near in [3/2, 10): divide out (near - 1) ... (near - k) to reach [3/2, 5/2); each difference is exact
    reduced, product = near, near._constant(1.0)
    for step in range(1, int(ASYMPTOTIC_FROM) - 1):
        lowered = near - float(step)
        used = lowered >= 1.5
        product = product * lowered.where(used, 1.0)
        reduced = lowered.where(used, reduced)
    # below 3/2: lgamma(near) = lgamma(near + 1) - log(near), below 1/2 also - log(near + 1) (z is near - 1, near)
    z = (reduced - 2.0).where(near >= 1.5, (near - 1.0).where(near >= 0.5, near))
    result = z * horner(z, LGAMMA_COEFFICIENTS[y.dtype]) + _natural_log(product)
    below_three_halves = near < 1.5
    result = result - _log1p(z).where(below_three_halves, 0.0)  # z >= -1/2
    below_half = near < 0.5
    magnitude = (-near).where(near < 0, near)  # |near|: the derivative of log|y| at -0.0 is +inf, as torch's
    result = result - _natural_log(magnitude.where(below_half, 1.0)).where(below_half, 0.0)
    # Stirling as (y - 1/2)(log y - 1) + (log(2 pi) - 1) / 2 + series(1/y)
    large = y.where(stirling.logical_and(y != math.inf), ASYMPTOTIC_FROM)
    inverse = large._apply(Op.RECIPROCAL)
    series = inverse * horner(inverse * inverse, STIRLING_COEFFICIENTS[: SERIES_TERMS[y.dtype]])
    asymptotic = (large - 0.5) * (_natural_log(large) - 1.0) + ((math.log(2 * math.pi) - 1.0) * 0.5) + series
    result = asymptotic.where(stirling, result)
    return (y * y).where(y == math.inf, result)  # +inf, with torch's gradient digamma(inf) = inf


def _lgamma(x: Tensor) -> Tensor:
    """Reflection below -1/2, with log |sin| as log(s^2) / 2: its gradient at the poles is NaN (torch's digamma
    there), not +-inf."""
    reflect = x <= -0.5
    main = _lgamma_above_minus_half((1.0 - x).where(reflect, x))
    sine = (_reduced_half_turns(x.where(reflect, -0.5)) * math.pi)._apply(Op.SIN)
    reflected = LOG_PI - _natural_log(sine * sine) * 0.5 - main
    return x._constant(math.inf).where(x == -math.inf, reflected.where(reflect, main))


def _digamma(x: Tensor) -> Tensor:
    reflect = x < 0
    y = (1.0 - x).where(reflect, x)
    shifted = y < ASYMPTOTIC_FROM
    recurrence = y._apply(Op.RECIPROCAL)  # 1 / y itself (y + 0 would turn -0.0 into +0.0: digamma(-0.0) is +inf)
    for step in range(1, int(ASYMPTOTIC_FROM)):
        recurrence = recurrence + (y + float(step))._apply(Op.RECIPROCAL)
    large = (y + ASYMPTOTIC_FROM).where(shifted, y)
    inverse = large._apply(Op.RECIPROCAL)
    inverse_square = inverse * inverse  # not 1 / large^2: its backward at +inf would be 0 * inf
    series = inverse_square * horner(inverse_square, DIGAMMA_COEFFICIENTS[: SERIES_TERMS[x.dtype]])
    value = _natural_log(large) - inverse * 0.5 - series
    value = (value - recurrence).where(shifted, value)
    turns = _reduced_half_turns(x.where(reflect, -0.25)) * math.pi
    reflected = value - _cos(turns) / turns._apply(Op.SIN) * math.pi
    pole = reflect.logical_and(x == x._apply(Op.TRUNC))  # the negative integers and -inf
    return x._constant(math.nan).where(pole, reflected.where(reflect, value))


def _i0(x: Tensor) -> Tensor:
    """Beyond the overflow point the value is e^|x| = inf, whose gradient is torch's i1(x) = +-inf there."""
    magnitude, _ = magnitude_and_sign(x)
    limit = I0_SERIES_LIMIT[x.dtype]
    near_zero = magnitude <= limit
    near = x.where(near_zero, 0.0)
    series = horner(near * near * 0.25, I0_SERIES[x.dtype])
    overflow = magnitude > I0_OVERFLOW[x.dtype]
    far = magnitude.where(near_zero.logical_not().logical_and(overflow.logical_not()), 2.0 * limit)
    inverse = far._apply(Op.RECIPROCAL)
    series_far = horner(inverse, I0_ASYMPTOTIC[x.dtype])
    half = _exp(far * 0.5)  # exact argument: e^x / sqrt(2 pi x) as e^(x/2) (e^(x/2) (2 pi x)^(-1/2))
    asymptotic = half * (half * series_far * (far * (2.0 * math.pi))._apply(Op.SQRT)._apply(Op.RECIPROCAL))
    # near the overflow point the gradient of that small last factor (i0 / factor) overflows: there the factor
    # goes into the exponent (a few units of rounding less accurate, where torch's float32 i0 is already inf)
    folded = half * (_exp(far * 0.5 - _natural_log(far * (2.0 * math.pi)) * 0.5) * series_far)
    asymptotic = folded.where(magnitude > I0_FOLDED_FROM[x.dtype], asymptotic)
    result = series.where(near_zero, asymptotic)
    return _exp(magnitude.where(overflow, 0.0)).where(overflow, result)
