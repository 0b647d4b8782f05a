"""Logical and bitwise Tensor methods (and, or, xor, not, shifts) and their operators, as primitives."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.core import dtype as dtypes
from ember.core.dtype import PYTHON_SCALARS, DType
from ember.core.errors import DTypeError
from ember.core.ops import Op
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


class LogicOps(TensorBase):
    """Mixin: logic and bits. Needs `_apply`, `_full`, `_operands`, `_assign_in_place`, `cast` from the class."""

    __slots__ = ()

    # ---- logic ---------------------------------------------------------------------------------------------------

    def logical_not(self) -> Tensor:
        return self.cast(dtypes.bool_)._apply(Op.NOT)

    def logical_and(self, other: Any) -> Tensor:
        left, right = _as_bool(self)._operands(_as_bool(other), "logical_and")
        return left._apply(Op.AND, right)

    def logical_or(self, other: Any) -> Tensor:
        left, right = _as_bool(self)._operands(_as_bool(other), "logical_or")
        return left._apply(Op.OR, right)

    def logical_xor(self, other: Any) -> Tensor:
        left, right = _as_bool(self)._operands(_as_bool(other), "logical_xor")
        return left._apply(Op.XOR, right)

    def _bitwise(self, op: Op, other: Any, name: str, reverse: bool = False) -> Tensor:
        left, right = self._operands(other, name, reverse)
        if left.dtype.is_float:
            raise DTypeError(f"{name}: bitwise ops need integer or bool tensors, got {left.dtype.name}")
        return left._apply(op, right)

    def bitwise_and(self, other: Any) -> Tensor:
        return self._bitwise(Op.AND, other, "bitwise_and")

    def bitwise_or(self, other: Any) -> Tensor:
        return self._bitwise(Op.OR, other, "bitwise_or")

    def bitwise_xor(self, other: Any) -> Tensor:
        return self._bitwise(Op.XOR, other, "bitwise_xor")

    def bitwise_not(self) -> Tensor:
        if self.dtype.is_float:
            raise DTypeError(f"bitwise_not: needs an integer or bool tensor, got {self.dtype.name}")
        return self._apply(Op.NOT)

    def bitwise_left_shift(self, other: Any, reverse: bool = False) -> Tensor:
        """self << other; shifting by a negative amount or by the bit width or more gives 0 (like torch)."""
        value, amount = self._operands(other, "bitwise_left_shift", reverse)
        _check_shift_dtype(value.dtype, "bitwise_left_shift")
        zero = value._full(value.shape, 0, value.dtype, value.device)
        in_range = _shift_in_range(amount)
        return value._apply(Op.SHL, amount.where(in_range, zero)).where(in_range, zero)

    def bitwise_right_shift(self, other: Any, reverse: bool = False) -> Tensor:
        """self >> other (arithmetic for signed types); an amount out of [0, bits) shifts every bit out."""
        value, amount = self._operands(other, "bitwise_right_shift", reverse)
        _check_shift_dtype(value.dtype, "bitwise_right_shift")
        zero = value._full(value.shape, 0, value.dtype, value.device)
        in_range = _shift_in_range(amount)
        shifted = value._apply(Op.SHR, amount.where(in_range, zero))
        if value.dtype.is_unsigned:
            return shifted.where(in_range, zero)
        sign_fill = value._apply(Op.SHR, value._full(value.shape, value.dtype.bits - 1, value.dtype, value.device))
        return shifted.where(in_range, sign_fill)

    # ---- operators ---------------------------------------------------------------------------------------------

    def __invert__(self) -> Tensor:
        if self.dtype.is_float:
            raise DTypeError(f"~ (bitwise not) needs an integer or bool tensor, got {self.dtype.name}")
        return self._apply(Op.NOT)

    def __and__(self, other: Any) -> Tensor:
        return self.bitwise_and(other)

    def __rand__(self, other: Any) -> Tensor:
        return self.bitwise_and(other)

    def __or__(self, other: Any) -> Tensor:
        return self.bitwise_or(other)

    def __ror__(self, other: Any) -> Tensor:
        return self.bitwise_or(other)

    def __xor__(self, other: Any) -> Tensor:
        return self.bitwise_xor(other)

    def __rxor__(self, other: Any) -> Tensor:
        return self.bitwise_xor(other)

    def __lshift__(self, other: Any) -> Tensor:
        return self.bitwise_left_shift(other)

    def __rlshift__(self, other: Any) -> Tensor:
        return self.bitwise_left_shift(other, reverse=True)

    def __rshift__(self, other: Any) -> Tensor:
        return self.bitwise_right_shift(other)

    def __rrshift__(self, other: Any) -> Tensor:
        return self.bitwise_right_shift(other, reverse=True)

    # ---- in-place forms --------------------------------------------------------------------------------------------

    def __iand__(self, other: Any) -> Tensor:
        return self._assign_in_place(self & other, "bitwise_and_")

    def __ior__(self, other: Any) -> Tensor:
        return self._assign_in_place(self | other, "bitwise_or_")

    def __ixor__(self, other: Any) -> Tensor:
        return self._assign_in_place(self ^ other, "bitwise_xor_")

    def __ilshift__(self, other: Any) -> Tensor:
        return self._assign_in_place(self << other, "bitwise_left_shift_")

    def __irshift__(self, other: Any) -> Tensor:
        return self._assign_in_place(self >> other, "bitwise_right_shift_")


def _as_bool(value: Any) -> Any:
    if isinstance(value, LogicOps):
        return value.cast(dtypes.bool_)
    if isinstance(value, PYTHON_SCALARS):
        return bool(value)
    return value


def _check_shift_dtype(dtype: DType, name: str) -> None:
    if not dtype.is_int:
        raise DTypeError(f"{name}: shifts need integer tensors, got {dtype.name} (as in PyTorch)")


def _shift_in_range(amount: Tensor) -> Tensor:
    """amount in [0, bits): where a shift is defined on every device (C and OpenCL differ outside)."""
    bits = amount._full(amount.shape, amount.dtype.bits, amount.dtype, amount.device)
    in_range = amount < bits
    if not amount.dtype.is_unsigned:
        in_range = in_range.logical_and(amount >= 0)
    return in_range
