"""Division, remainder and power: the compositions behind //, %, fmod and ** for float and integer dtypes."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from ember.core.errors import DTypeError
from ember.core.ops import Composite, Op

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

Number = int | float | bool


def signs_differ(remainder: Tensor, divisor: Tensor) -> Tensor:
    """Where a truncated remainder needs the floor correction: nonzero and of the other sign than the divisor."""
    zero = remainder._full(remainder.shape, 0, remainder.dtype, remainder.device)
    return (remainder != zero).logical_and((remainder < zero) != (divisor < zero))


def float_fmod(dividend: Tensor, divisor: Tensor) -> Tensor:
    """C's fmod for floats: a - trunc(a / b) * b, and a itself for a finite a and an infinite b."""
    remainder = dividend - (dividend / divisor).trunc() * divisor
    return dividend.where(divisor.isinf().logical_and(dividend.isfinite()), remainder)


def float_floor_divide(dividend: Tensor, divisor: Tensor) -> Tensor:
    """torch's floor division of floats: (a - fmod(a, b)) / b corrected toward -inf and rounded to an integer;
    a division by zero gives a / 0 (inf or NaN)."""
    remainder = float_fmod(dividend, divisor)
    quotient = (dividend - remainder) / divisor
    quotient = (quotient - 1).where(signs_differ(remainder, divisor), quotient)
    floored = quotient.floor()
    floored = (floored + 1).where(quotient - floored > 0.5, floored)
    exact = dividend / divisor
    floored = (exact * 0).where(quotient == 0, floored)  # a zero keeps the sign of a / b
    return exact.where(divisor == 0, floored)


def integer_floor_divide(dividend: Tensor, divisor: Tensor) -> Tensor:
    """Floor division of integers (the divisor checked by the caller: IDIV of 0 gives 0, no trap)."""
    quotient = dividend._apply(Op.IDIV, divisor)
    if dividend.dtype.is_unsigned:
        return quotient
    remainder = dividend._apply(Op.MOD, divisor)
    return (quotient - 1).where(signs_differ(remainder, divisor), quotient)


def pow_scalar_exponent(base: Tensor, exponent: Number) -> Tensor:
    """base ** a Python number: small integer exponents multiply (exact for integers, accurate for floats). For
    floats autograd records one POW_SCALAR step: torch's gradient, exponent * base ** (exponent - 1), and 0 for
    an exponent of 0 (the value 1 then still depends on base, as in torch)."""
    left, power = base._operands(exponent, "pow")
    if left.dtype.is_float:
        return left._recorded(Composite.POW_SCALAR, functools.partial(float_pow_scalar, exponent=exponent), (left,),
                              arg=exponent)
    if exponent < 0:
        raise DTypeError(
            f"pow: integers to negative integer powers are not allowed (as in PyTorch), got a {base.dtype.name} "
            f"tensor ** {exponent}; use a float tensor"
        )
    if abs(exponent) <= 64:
        return power_by_squaring(left, int(exponent))
    return integer_pow(left, power)


def float_pow_scalar(base: Tensor, exponent: Number) -> Tensor:
    """A float base ** a Python number, with the special cases torch's pow kernel has (sqrt, rsqrt, products)."""
    if float(exponent).is_integer() and abs(exponent) <= 64:
        result = power_by_squaring(base, int(abs(exponent)))
        return result.reciprocal() if exponent < 0 else result
    if exponent == 0.5:
        return base.sqrt()
    if exponent == -0.5:
        return base.rsqrt()
    return float_pow(base, base._full(base.shape, exponent, base.dtype, base.device))


def power_by_squaring(base: Tensor, exponent: int) -> Tensor:
    """base ** exponent for a non-negative Python int: about 2 * log2(exponent) multiplications."""
    if exponent == 0:
        return base._full(base.shape, 1, base.dtype, base.device)
    result: Tensor | None = None
    square = base
    while True:
        if exponent & 1:
            result = square if result is None else result * square
        exponent >>= 1
        if not exponent:
            assert result is not None  # exponent > 0: its lowest set bit set result
            return result
        square = square * square


def float_pow(base: Tensor, power: Tensor) -> Tensor:
    """Float pow with C's special values: x ** 0 = 1 ** y = 1, (-1) ** ±inf = 1, a negative finite base to a
    non-integer power is NaN, and the sign of a negative (or -0.0) base survives odd integer powers."""
    magnitude = (power * base.abs()._apply(Op.LOG2))._apply(Op.EXP2)
    power_is_integer = power == power.trunc()
    half = power * 0.5
    power_is_odd = power_is_integer.logical_and(half != half.trunc())
    zero = base._full(base.shape, 0, base.dtype, base.device)
    sign_bit = (base < zero).logical_or((base == zero).logical_and(base.reciprocal() < zero))  # includes -0.0
    result = (-magnitude).where(sign_bit.logical_and(power_is_odd), magnitude)
    negative_finite = (base < zero).logical_and(base.isfinite())
    nan = base._full(base.shape, math.nan, base.dtype, base.device)
    result = nan.where(negative_finite.logical_and(power_is_integer.logical_not()), result)
    one = base._full(base.shape, 1, base.dtype, base.device)
    is_one = (power == zero).logical_or(base == one).logical_or((base == -1.0).logical_and(power.isinf()))
    # only where the exp2/log2 form is not already 1 (so d(x ** p)/dx at x == 1 is p, not 0)
    return one.where(is_one.logical_and(result != one), result)


def integer_pow(base: Tensor, power: Tensor) -> Tensor:
    """Integer power with wraparound (like torch) for an integer exponent tensor, by the exponent's bits.

    For bits >= width - 2 no squaring is needed: an odd base's square is then 1 modulo 2**width (the unit group
    of Z/2**width has exponent 2**(width - 2)) and an even base's is 0. Negative exponents give 1 for a base of 1,
    +-1 for -1 and 0 otherwise (torch's integer rule)."""
    dtype = base.dtype
    width = dtype.bits
    one = base._full(base.shape, 1, dtype, base.device)
    zero = base._full(base.shape, 0, dtype, base.device)
    factors = []
    square = base
    for bit in range(width - 2):
        mask = base._full(base.shape, 1 << bit, dtype, base.device)
        factors.append(square.where(zero._apply(Op.CMPLT, power._apply(Op.AND, mask)), one))  # bit < width - 1: >= 0
        if bit < width - 3:
            square = square * square
    while len(factors) > 1:  # a balanced product keeps the graph shallow
        paired = [factors[index] * factors[index + 1] for index in range(0, len(factors) - 1, 2)]
        factors = paired + ([factors[-1]] if len(factors) % 2 else [])
    result = factors[0]
    high_bits = power._apply(Op.SHR, base._full(base.shape, width - 2, dtype, base.device)) != zero
    base_is_even = base._apply(Op.AND, one) == zero
    result = zero.where(high_bits.logical_and(base_is_even), result)
    if dtype.is_unsigned:
        return result
    negative_power = power < zero
    odd_power = power._apply(Op.AND, one) != zero
    minus_one = base == -1
    negative_result = one.where(base == one, base.where(odd_power, one).where(minus_one, zero))
    return negative_result.where(negative_power, result)
