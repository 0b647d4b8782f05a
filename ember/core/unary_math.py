"""Math functions and activations (exp, log, sin, tanh, erf, gelu, rounding, ...) as compositions of primitives.

The primitives give exp2, log2 and sin; the rest is built here with care for accuracy: exp reduces its argument
exactly (Cody-Waite), cos uses 1 - 2 sin(x/2)^2 (no large-argument cancellation), expm1/log1p use Kahan's
corrections, tanh is built on expm1 and erf on a Taylor series near 0 and a Chebyshev fit of erfc beyond.
float16/bfloat16 inputs are computed in float32 and rounded once, as PyTorch does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ember.core import dtype as dtypes
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.ops import Composite, Op
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

LOG2_E = 1.0 / math.log(2.0)
LN_2 = math.log(2.0)
# ln 2 split so that k * high is exact for the k exp meets: 15 significant bits (float32), 32 bits (float64)
LN_2_PARTS = {dtypes.float32: (0.693145751953125, 1.4286068203094172e-06),
              dtypes.float64: (0.6931471803691238, 1.9082149292705877e-10)}
EXP_LIMIT = {dtypes.float32: 105.0, dtypes.float64: 746.0}  # |x| beyond which exp is 0 or inf
TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
# erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1)): enough terms for |x| < 0.5 in each precision
ERF_SERIES_TERMS = {dtypes.float32: 8, dtypes.float64: 13}
# erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), for z >= 0: fractional error below 1.2e-7 (Numerical Recipes)
ERFC_COEFFICIENTS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
                     1.48851587, -0.82215223, 0.17087277)


def _in_compute_precision(function: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Run `function` on float32 for float16/bfloat16 operands (all of one dtype) and round the result back once."""

    def wrapped(*operands: Tensor) -> Tensor:
        dtype = operands[0].dtype
        if dtype in (dtypes.float16, dtypes.bfloat16):
            return function(*(operand.cast(dtypes.float32) for operand in operands)).cast(dtype)
        return function(*operands)

    return wrapped


def _relu_value(x: Tensor) -> Tensor:
    """max(x, 0), keeping -0.0 and NaN (from x * 0); its gradient is Composite.RELU's rule."""
    zero = x._constant(0)
    return zero.where(x < zero, x.where(x > zero, x * 0))


def horner(x: Tensor, coefficients: Sequence[float]) -> Tensor:
    """The polynomial sum(c_k x^k) by Horner's rule; coefficients lowest degree first (at least two)."""
    result = x * coefficients[-1] + coefficients[-2]
    for coefficient in reversed(coefficients[:-2]):
        result = result * x + coefficient
    return result


class UnaryMathOps(TensorBase):
    """Mixin: math functions and activations. Needs `_apply`, `_full`, `shape`, `dtype`, `device`."""

    __slots__ = ()

    def _floating_only(self, name: str) -> Tensor:
        """self, if it is a float tensor; integer and bool inputs raise like torch's float-only kernels."""
        if not self.dtype.is_float:
            raise DTypeError(f"{name}: needs a floating point tensor, got {self.dtype.name} (as in PyTorch); cast it "
                             f"with .float()")
        return cast("Tensor", self)

    def _constant(self, value: float) -> Tensor:
        return self._full(self.shape, value, self.dtype, self.device)

    def _recorded(self, composite: Composite, compute: Callable[..., Tensor], sources: tuple[Tensor, ...],
                  arg: Any = None) -> Tensor:
        """compute(*sources), which autograd sees as one `composite` step (its rule in autograd/rules.py) rather
        than the primitives it is made of. Here, for tensors without autograd, just the value; Tensor overrides."""
        return compute(*sources)

    # ---- exponentials and logarithms (integer inputs give float32) --------------------------------------------

    def exp2(self) -> Tensor:
        return self._float_operand()._apply(Op.EXP2)

    def exp(self) -> Tensor:
        operand = self._float_operand()
        return operand._recorded(Composite.EXP, _in_compute_precision(_exp), (operand,))

    def expm1(self) -> Tensor:
        """exp(x) - 1, accurate for small x too (Kahan: (u - 1) * x / log(u) with u = exp(x))."""
        return _in_compute_precision(_expm1)(self._float_operand())

    def log2(self) -> Tensor:
        return self._float_operand()._apply(Op.LOG2)

    def log(self) -> Tensor:
        return _in_compute_precision(lambda x: x._apply(Op.LOG2) * LN_2)(self._float_operand())

    def log10(self) -> Tensor:
        return _in_compute_precision(lambda x: x._apply(Op.LOG2) * (LN_2 / math.log(10.0)))(self._float_operand())

    def log1p(self) -> Tensor:
        """log(1 + x), accurate for small x too (Kahan: log(u) * x / (u - 1) with u = 1 + x)."""
        return _in_compute_precision(_log1p)(self._float_operand())

    def sqrt(self) -> Tensor:
        return self._float_operand()._apply(Op.SQRT)

    def rsqrt(self) -> Tensor:
        return self.sqrt()._apply(Op.RECIPROCAL)

    # ---- trigonometry -------------------------------------------------------------------------------------------

    def sin(self) -> Tensor:
        return self._float_operand()._apply(Op.SIN)

    def cos(self) -> Tensor:
        return _in_compute_precision(_cos)(self._float_operand())

    def tan(self) -> Tensor:
        return _in_compute_precision(lambda x: x._apply(Op.SIN) / _cos(x))(self._float_operand())

    def tanh(self) -> Tensor:
        operand = self._float_operand()
        return operand._recorded(Composite.TANH, _in_compute_precision(_tanh), (operand,))

    def sigmoid(self) -> Tensor:
        operand = self._float_operand()
        return operand._recorded(Composite.SIGMOID, _in_compute_precision(_sigmoid), (operand,))

    def erf(self) -> Tensor:
        return _in_compute_precision(_erf)(self._float_operand())

    def erfc(self) -> Tensor:
        return _in_compute_precision(_erfc)(self._float_operand())

    # ---- activations --------------------------------------------------------------------------------------------

    def relu(self) -> Tensor:
        """max(x, 0) for numbers (NaN stays NaN); bool tensors raise as in torch."""
        if self.dtype.is_bool:
            raise DTypeError("relu: bool inputs are not supported (as in PyTorch)")
        return self._recorded(Composite.RELU, _relu_value, (cast("Tensor", self),))

    def relu6(self) -> Tensor:
        return self.hardtanh(0, 6)

    def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        """x clamped to [min_val, max_val], keeping x's dtype (torch.nn.functional.hardtanh)."""
        if self.dtype.is_bool:
            raise DTypeError("hardtanh: bool inputs are not supported (as in PyTorch)")
        if min_val > max_val:
            raise ArgumentError(f"hardtanh: min_val {min_val} cannot be greater than max_val {max_val} (as in PyTorch)")
        lower, upper = self._constant(min_val), self._constant(max_val)
        # torch's gradient is 0 at both bounds (clamp passes it there instead); NaN passes through
        return upper.where(self >= upper, lower.where(self <= lower, self))

    def leaky_relu(self, negative_slope: float = 0.01) -> Tensor:
        self._floating_only("leaky_relu")
        return self.where(self > 0, self * negative_slope)

    def elu(self, alpha: float = 1.0) -> Tensor:
        self._floating_only("elu")
        positive = self > 0
        return self.where(positive, self._constant(0.0).where(positive, self).expm1() * alpha)  # no inf * 0 backward

    def selu(self) -> Tensor:
        self._floating_only("selu")
        alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
        return self.elu(alpha) * scale

    def celu(self, alpha: float = 1.0) -> Tensor:
        self._floating_only("celu")
        positive = self > 0
        return self.where(positive, (self._constant(0.0).where(positive, self) * (1.0 / alpha)).expm1() * alpha)

    def gelu(self, approximate: str = "none") -> Tensor:
        """x * Phi(x) (the normal CDF), or its tanh approximation; as 0.5 x erfc(-x / sqrt 2), accurate for x < 0."""
        self._floating_only("gelu")
        if approximate == "tanh":
            # 0.5 (1 + tanh(u)) = sigmoid(2 u): one exponential (the tanh composite, exact near 0 through expm1,
            # rendered as a chain of selects, a log and divisions, kept the kernels off vectors: 256 x 2048 values
            # in 36 ms instead of 0.4 ms on c)
            inner = (self + self * self * self * 0.044715) * (2.0 * math.sqrt(2.0 / math.pi))
            return self * inner.sigmoid()
        if approximate != "none":
            raise ArgumentError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        return self._recorded(Composite.GELU, _in_compute_precision(_gelu), (cast("Tensor", self),))

    def silu(self) -> Tensor:
        self._floating_only("silu")
        return self * self.sigmoid()

    def mish(self) -> Tensor:
        self._floating_only("mish")
        return self * self.softplus().tanh()

    def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (torch's linear region)."""
        self._floating_only("softplus")
        scaled = self * beta
        nonnegative = scaled >= 0
        negative_magnitude = (-scaled).where(nonnegative, scaled)  # -|x| differentiated like its branch: 0.5 at 0
        soft = (scaled.where(nonnegative, 0.0) + negative_magnitude.exp().log1p()) * (1.0 / beta)
        return self.where(scaled > threshold, soft)

    def hardsigmoid(self) -> Tensor:
        self._floating_only("hardsigmoid")
        return (self + 3.0).hardtanh(0.0, 6.0) / 6.0

    def hardswish(self) -> Tensor:
        self._floating_only("hardswish")
        return self * (self + 3.0).hardtanh(0.0, 6.0) / 6.0

    def softsign(self) -> Tensor:
        return self / (self.abs() + 1)

    def logsigmoid(self) -> Tensor:
        self._floating_only("logsigmoid")
        return -((-self).softplus())

    def prelu(self, weight: Tensor) -> Tensor:
        """self where it is positive, else weight * self; weight has one element or one per channel (dim 1)."""
        self._floating_only("prelu")
        channels = self.shape[1] if self.ndim >= 2 else 1
        count = weight.numel() if hasattr(weight, "numel") else -1
        if count != 1 and count != channels or getattr(weight, "ndim", 2) > 1:
            raise ShapeError(f"prelu: weight must have 1 element or one per channel ({channels} for an input of "
                             f"shape {self.shape}), got {getattr(weight, 'shape', type(weight).__name__)}")
        if weight.ndim == 1 and count > 1:
            weight = weight.reshape((count,) + (1,) * (self.ndim - 2))
        elif weight.ndim == 1:
            weight = weight.reshape(())
        return self.where(self > 0, self * weight)

    def rrelu(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False) -> Tensor:
        """Leaky ReLU whose negative slope is drawn uniformly from [lower, upper] per element when training, and
        is their mean otherwise (torch.nn.functional.rrelu)."""
        self._floating_only("rrelu")
        if lower > upper:
            raise ArgumentError(f"rrelu: lower bound {lower} should be less than or equal to upper bound {upper}")
        if not training:
            return self.leaky_relu((lower + upper) / 2)
        from ember.core.creation import rand

        slope = rand(*self.shape, dtype=self.dtype, device=self.device) * (upper - lower) + lower
        return self.where(self >= 0, self * slope)

    def threshold(self, threshold: float, value: float) -> Tensor:
        """value where self <= threshold, else self (NaN stays NaN), in self's dtype (torch.threshold)."""
        if self.dtype.is_bool:
            raise DTypeError("threshold: bool inputs are not supported (as in PyTorch)")
        return self._constant(value).where(self <= threshold, self)

    def hardshrink(self, lambd: float = 0.5) -> Tensor:
        """self where |self| > lambd, else 0 (NaN stays NaN)."""
        self._floating_only("hardshrink")
        return self._constant(0).where((self >= -lambd).logical_and(self <= lambd), self)

    def softshrink(self, lambd: float = 0.5) -> Tensor:
        """self - lambd above lambd, self + lambd below -lambd, 0 between (torch.nn.functional.softshrink)."""
        self._floating_only("softshrink")
        if not lambd >= 0:
            raise ArgumentError(f"softshrink: lambda must be non-negative (as in PyTorch), got {lambd}")
        return (self - lambd).where(self > lambd, (self + lambd).where(self < -lambd, self * 0))

    def tanhshrink(self) -> Tensor:
        """self - tanh(self)."""
        operand = self._float_operand()
        return operand - operand.tanh()

    # ---- rounding (integers are returned unchanged; bool raises as in torch) --------------------------------------

    def _rounding_operand(self, name: str) -> bool:
        if self.dtype.is_bool:
            raise DTypeError(f"{name}: bool inputs are not supported (as in PyTorch)")
        return self.dtype.is_float

    def trunc(self) -> Tensor:
        return self._apply(Op.TRUNC) if self._rounding_operand("trunc") else cast("Tensor", self)

    fix = trunc

    def positive(self) -> Tensor:
        """self itself (torch.positive; bool raises as in torch)."""
        if self.dtype.is_bool:
            raise DTypeError("positive: bool inputs are not supported (as in PyTorch)")
        return cast("Tensor", self)

    def floor(self) -> Tensor:
        if not self._rounding_operand("floor"):
            return cast("Tensor", self)
        truncated = self._apply(Op.TRUNC)
        return (truncated - 1).where(self < truncated, truncated)

    def ceil(self) -> Tensor:
        if not self._rounding_operand("ceil"):
            return cast("Tensor", self)
        truncated = self._apply(Op.TRUNC)
        return (truncated + 1).where(self > truncated, truncated)

    def round(self, decimals: int = 0) -> Tensor:
        """Round half to even, like torch.round; `decimals` scales by 10**decimals first (as torch does)."""
        if not self._rounding_operand("round"):
            return cast("Tensor", self)
        if decimals > 0:
            scale = 10.0**decimals
            return (self * scale).round() / scale
        if decimals < 0:
            scale = 10.0**-decimals
            return (self / scale).round() * scale
        floored = self.floor()
        difference = self - floored
        floored_is_even = (floored * 0.5).floor() * 2 == floored
        round_up = (difference > 0.5).logical_or((difference == 0.5).logical_and(floored_is_even.logical_not()))
        return (floored + 1).where(round_up, floored)

    def frac(self) -> Tensor:
        self._floating_only("frac")
        return self - self.trunc()


# ---- the float kernels of the functions above (operands are float32 or float64) --------------------------------


def _exp(x: Tensor) -> Tensor:
    """exp(x) = exp2(r / ln 2) * 2^k with k = trunc(x / ln 2) and r = x - k ln 2 computed exactly (Cody-Waite).
    2^k is exact down to the smallest denormal, and k reaches the overflow exponent exactly where exp(x) does.
    k comes from x clamped to the limit (k of +-inf would make r NaN), r from x itself: beyond the limit r alone
    overflows or underflows exp2, and the gradient is still exp(x) (inf, or 0), as in torch."""
    limit = EXP_LIMIT[x.dtype]
    clamped = x._apply(Op.MAX, x._constant(-limit))
    clamped = x._constant(limit).where(clamped > limit, clamped)  # keeps NaN
    return _exp_reduced(x, (clamped * LOG2_E)._apply(Op.TRUNC))


def _exp_reduced(x: Tensor, k: Tensor) -> Tensor:
    """exp2(r / ln 2) * 2^k, r = x - k ln 2 computed exactly (Cody-Waite: ln 2 in two parts): exp(x) for the
    k = trunc(x / ln 2) of _exp and _exp_of_shifted."""
    high, low = LN_2_PARTS[x.dtype]
    reduced = (x - k * high) - k * low
    return (reduced * LOG2_E)._apply(Op.EXP2) * k._apply(Op.EXP2)


def exp_of_shifted(x: Tensor) -> Tensor:
    """exp(x) for x <= 0 or NaN (floating x), as a softmax takes it (see _exp_of_shifted)."""
    return _in_compute_precision(_exp_of_shifted)(x)


def _exp_of_shifted(x: Tensor) -> Tensor:
    """exp(x) for x <= 0 or NaN (a softmax's x - max, -inf where masked): below the lower limit a selected 0, those
    lanes computing exp(0). _exp's underflowing arithmetic there (a denormal product, exp2 of -inf) takes slow paths
    on CPUs (microcode assists, libmvec's scalar fallback): a masked softmax, half such lanes, ran 10x slower."""
    zero = x._constant(0.0)
    vanishing = x < -EXP_LIMIT[x.dtype]  # exp(-limit) rounds to 0 as well
    safe = zero.where(vanishing, x)  # keeps NaN
    return zero.where(vanishing, _exp_reduced(safe, (safe * LOG2_E)._apply(Op.TRUNC)))


def _expm1(x: Tensor) -> Tensor:
    """Kahan's (u - 1) * x / log u where it is defined; x near 0, -1 far below 0, u = inf above. The correction
    gets safe inputs where it is not selected, so its backward never sends 0 * inf (NaN) to x."""
    u = _exp(x)
    one = x._constant(1.0)
    u_minus_one = u - one
    kahan = (u != one).logical_and(u_minus_one != -1.0).logical_and(u != math.inf)
    safe_u, safe_x = u.where(kahan, math.e), x.where(kahan, 1.0)
    corrected = (safe_u - one) * (safe_x / (safe_u._apply(Op.LOG2) * LN_2))  # x / log u first: no overflow
    special = x.where(u == one, x._constant(-1.0).where(u_minus_one == -1.0, u))
    return corrected.where(kahan, special)


def _log1p(x: Tensor) -> Tensor:
    """Kahan's log(u) * x / (u - 1) with u = 1 + x where it is defined (with safe inputs elsewhere, as in expm1)."""
    one = x._constant(1.0)
    u = x + one
    kahan = (u != one).logical_and(u != math.inf)
    safe_u, safe_x = u.where(kahan, 2.0), x.where(kahan, 1.0)
    corrected = (safe_u._apply(Op.LOG2) * LN_2) * (safe_x / (safe_u - one))
    return corrected.where(kahan, x.where(u == one, u))


def _cos(x: Tensor) -> Tensor:
    """cos x = 1 - 2 sin^2(x / 2): halving is exact, so sin's own exact reduction serves any |x|."""
    half_sine = (x * 0.5)._apply(Op.SIN)
    return x._constant(1.0) - half_sine * half_sine * 2.0


# float32 tanh near 0 (|x| < TANH_SERIES_BOUND): x (1 + z P(z)), z = x^2, P the minimax polynomial of Cephes'
# tanhf (relative error ~1.3e-7 there); beyond, 1 - 2 / (exp(2|x|) + 1), whose cancellation is at most a factor 2
TANH_SERIES_BOUND = 0.625
TANH_COEFFICIENTS = (-3.33332819422e-1, 1.33314422036e-1, -5.37397155531e-2, 2.06390887954e-2, -5.70498872745e-3)


def _tanh(x: Tensor) -> Tensor:
    """tanh x: for float32, an odd polynomial near 0 and 1 - 2 / (exp(2|x|) + 1) beyond (one exp and one division,
    no log as the expm1 form below needs: 1M floats on c 1.13 -> 0.63 ms; within 1.4 ulp of float64), saturating to
    +-1 without overflow; for float64, tanh |x| = -m / (2 + m) with m = expm1(-2|x|)."""
    if x.dtype == dtypes.float32:
        negative = x < 0
        magnitude = (-x).where(negative, x)
        square = x * x
        near_zero = x * (horner(square, TANH_COEFFICIENTS) * square + 1.0)  # (x times, not x plus: tanh(-0.0) stays -0.0)
        far = 1.0 - 2.0 / (_exp(magnitude * 2.0) + 1.0)
        return near_zero.where(magnitude < TANH_SERIES_BOUND, (-far).where(negative, far))
    negative = x < 0
    magnitude = (-x).where(negative, x)  # |x| with the derivative of its branch (abs'(0) = 0 would lose tanh'(0))
    m = _expm1(magnitude * -2.0)
    result = -m / (m + 2.0)
    return (-result).where(negative, result)


def _sigmoid(x: Tensor) -> Tensor:
    """1 / (1 + e) and e / (1 + e) with e = exp(-|x|): never overflows, keeps tiny values for large -x."""
    nonnegative = x >= 0
    exp_negative_abs = _exp((-x).where(nonnegative, x))  # -|x| differentiated like the branch that uses it
    positive = (exp_negative_abs + 1.0)._apply(Op.RECIPROCAL)
    return positive.where(nonnegative, exp_negative_abs * positive)


def _erfc_nonnegative(z: Tensor) -> Tensor:
    """erfc(z) for z >= 0 with a fractional error below 1.2e-7."""
    t = (z * 0.5 + 1.0)._apply(Op.RECIPROCAL)
    polynomial = t * ERFC_COEFFICIENTS[-1]
    for coefficient in reversed(ERFC_COEFFICIENTS[1:-1]):
        polynomial = (polynomial + coefficient) * t
    polynomial = polynomial + ERFC_COEFFICIENTS[0]
    return t * _exp(polynomial - z * z)


def _erf_series(x: Tensor) -> Tensor:
    """The Taylor series of erf at 0, in Horner form over x^2 (used for |x| < 0.5)."""
    square = x * x
    terms = ERF_SERIES_TERMS[x.dtype]
    coefficients = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(terms)]
    total = square * coefficients[-1]
    for coefficient in reversed(coefficients[1:-1]):
        total = (total + coefficient) * square
    return (total + coefficients[0]) * x * TWO_OVER_SQRT_PI


def _erf(x: Tensor) -> Tensor:
    magnitude = x.abs()
    outer = x._constant(1.0) - _erfc_nonnegative(magnitude)
    outer = (-outer).where(x < 0, outer)
    near_zero = magnitude < 0.5
    return _erf_series(x.where(near_zero, 0.0)).where(near_zero, outer)  # no inf * 0 from x^2 in that backward


def _erfc(x: Tensor) -> Tensor:
    tail = _erfc_nonnegative(x.abs())
    outer = (x._constant(2.0) - tail).where(x < 0, tail)
    near_zero = x.abs() < 0.5
    return (x._constant(1.0) - _erf_series(x.where(near_zero, 0.0))).where(near_zero, outer)


def gelu_derivative(x: Tensor) -> Tensor:
    """Phi(x) + x phi(x), the derivative of gelu (torch's gelu_backward: NaN at +-inf and NaN)."""
    return _in_compute_precision(_gelu_derivative)(x)


def _gelu_derivative(x: Tensor) -> Tensor:
    tail = _erfc_nonnegative(x.abs() * (1.0 / math.sqrt(2.0)))  # Phi(x) = 1 - tail / 2 for x >= 0, tail / 2 below
    half_tail = tail * 0.5
    cumulative = (x._constant(1.0) - half_tail).where(x >= 0, half_tail)
    density = _exp(x * x * -0.5) * (1.0 / math.sqrt(2.0 * math.pi))
    return cumulative + x * density


def _gelu(x: Tensor) -> Tensor:
    """x Phi(x) = 0.5 x erfc(-x / sqrt 2): with h = 0.5 x erfc(|x| / sqrt 2), x - h for x >= 0 and h for x < 0."""
    tail = _erfc_nonnegative(x.abs() * (1.0 / math.sqrt(2.0)))
    half_tail = x * 0.5 * tail
    positive = x - tail.where(tail == 0, half_tail)  # gelu(inf) = inf, not inf - inf * 0; gelu(-inf) is NaN in torch
    return positive.where(x >= 0, half_tail)
