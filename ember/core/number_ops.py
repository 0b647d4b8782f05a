"""Float-representation and membership ops: frexp and nextafter (from the bits), isreal, and isin (membership by
comparing every pair); gcd, lcm and ldexp are binary_math's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.elementwise import where
from ember.core.errors import DTypeError
from ember.core.ops import Op
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

# (integer dtype of the same size, mantissa bits, exponent bias) of each float dtype computed from its bits
_FLOAT_LAYOUT: dict[str, tuple[DType, int, int]] = {
    "float32": (dtypes.int32, 23, 127), "float64": (dtypes.int64, 52, 1023),
}


class NumberOps(TensorBase):
    """Mixin: frexp, nextafter, isreal."""

    __slots__ = ()

    def frexp(self) -> tuple[Tensor, Tensor]:
        """(mantissa, exponent) with self = mantissa * 2 ** exponent, 0.5 <= |mantissa| < 1 and an int32 exponent
        (0 for zeros, infinities and NaN), like torch.frexp; the mantissa's gradient is grad / 2 ** exponent."""
        if not self.dtype.is_float:
            raise DTypeError(f"frexp: only floating point dtypes are supported (as in PyTorch), got {self.dtype.name}")
        wide = self if self.dtype.name in _FLOAT_LAYOUT else self.cast(dtypes.float32)
        integer, mantissa_bits, bias = _FLOAT_LAYOUT[wide.dtype.name]
        exponent = _binary_exponent(wide._detached_copy(), integer, mantissa_bits, bias)
        # the mantissa as self times two exact powers of two (one could overflow for subnormal self), so the
        # gradient 2 ** -exponent comes from the multiplication
        first = exponent._apply(Op.IDIV, exponent._full(exponent.shape, 2, exponent.dtype, exponent.device))
        second = exponent - first
        mantissa = self * _power_of_two(-first, wide.dtype, integer, mantissa_bits, bias).cast(self.dtype) * \
            _power_of_two(-second, wide.dtype, integer, mantissa_bits, bias).cast(self.dtype)
        return mantissa, exponent.cast(dtypes.int32)

    def nextafter(self, other: Any) -> Tensor:
        """The next float after self toward other, elementwise (the float itself when they are equal; NaN when
        either is NaN), from the bits: one step of the integer holding them."""
        left, right = self._operands(other, "nextafter")
        if left.dtype.name not in _FLOAT_LAYOUT:
            raise DTypeError(f"nextafter: only float32 and float64 are supported, got {left.dtype.name}")
        integer = _FLOAT_LAYOUT[left.dtype.name][0]
        bits = left.bitcast(integer)
        one = bits._full(bits.shape, 1, integer, bits.device)
        # away from zero when moving toward the larger magnitude on the same side, else toward it
        step = where((right > left) == (left >= 0), one, -one)
        moved = (bits + step).bitcast(left.dtype)
        smallest = left._full(left.shape, 0, integer, left.device) + one  # the smallest subnormal's bits
        from_zero = smallest.bitcast(left.dtype).where(right > 0, -smallest.bitcast(left.dtype))
        result = from_zero.where(left == 0, moved)
        result = right.where(left == right, result)
        return (left + right).where(left.isnan().logical_or(right.isnan()), result)

    def isreal(self) -> Tensor:
        """True everywhere: ember has no complex dtypes (torch.isreal)."""
        return self._full(self.shape, True, dtypes.bool_, self.device)


def _binary_exponent(value: Tensor, integer: DType, mantissa_bits: int, bias: int) -> Tensor:
    """frexp's exponent of float32/float64 values from their bits (subnormals scaled into the normal range first)."""
    scale_bits = mantissa_bits + 1
    subnormal = value.abs() < 2.0 ** (1 - bias)
    scaled = value.where(subnormal.logical_not(), value * 2.0**scale_bits)
    bits = scaled.bitcast(integer)
    field = (bits >> mantissa_bits) & ((1 << (integer.bits - 1 - mantissa_bits)) - 1)
    exponent = field - (bias - 1) - subnormal.cast(integer) * scale_bits
    special = (value == 0).logical_or(value.isfinite().logical_not())
    return exponent.where(special.logical_not(), exponent._full(exponent.shape, 0, integer, exponent.device))


def _power_of_two(exponent: Tensor, dtype: DType, integer: DType, mantissa_bits: int, bias: int) -> Tensor:
    """2 ** exponent exactly, from the bits, for exponents of normal numbers (1 - bias <= exponent <= bias)."""
    return ((exponent + bias) << mantissa_bits).bitcast(dtype)


def isin(elements: Any, test_elements: Any, *, assume_unique: bool = False, invert: bool = False) -> Tensor:
    """Whether each of elements is in test_elements (either may be a number, not both), as a bool tensor of
    elements' shape (torch.isin; NaN is in nothing)."""
    from ember.core.elementwise import ElementwiseOps

    if not isinstance(elements, ElementwiseOps) and not isinstance(test_elements, ElementwiseOps):
        raise TypeError(f"isin(): expected elements or test_elements to be a Tensor, got "
                        f"{type(elements).__name__} and {type(test_elements).__name__}")
    anchor = elements if isinstance(elements, ElementwiseOps) else test_elements
    if not isinstance(elements, ElementwiseOps):
        elements = anchor._full((), elements, dtypes.scalar_dtype(elements), anchor.device)
    if not isinstance(test_elements, ElementwiseOps):
        test_elements = anchor._full((), test_elements, dtypes.scalar_dtype(test_elements), anchor.device)
    candidates = test_elements.reshape(*([1] * elements.ndim), -1)
    found = (elements.unsqueeze(-1) == candidates).any(-1)
    return found.logical_not() if invert else found
