"""Linear algebra Tensor methods: matmul with batch broadcasting, dot, outer, einsum."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.core.dtype import promote_types
from ember.core.errors import DTypeError, ShapeError
from ember.core.shapes import broadcast_shapes

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


class LinalgOps:
    """Mixin: matrix products, written as broadcast multiply + sum so they fuse with what comes after."""

    __slots__ = ()

    def matmul(self: Tensor, other: Tensor) -> Tensor:
        if not isinstance(other, LinalgOps):
            raise TypeError(f"matmul: expected a Tensor, got {type(other).__name__}")
        if self.ndim == 0 or other.ndim == 0:
            raise ShapeError(f"matmul: both arguments need at least 1 dim, got shapes {self.shape} and {other.shape}")
        if self.dtype.is_bool or other.dtype.is_bool:
            raise DTypeError(f"matmul: not supported for bool tensors ({self.dtype.name} @ {other.dtype.name})")
        left = self.unsqueeze(0) if self.ndim == 1 else self
        right = other.unsqueeze(-1) if other.ndim == 1 else other
        if left.shape[-1] != right.shape[-2]:
            raise ShapeError(
                f"matmul: shapes {self.shape} and {other.shape} cannot be multiplied "
                f"({left.shape[-2]}x{left.shape[-1]} and {right.shape[-2]}x{right.shape[-1]}): inner dims differ"
            )
        batch = broadcast_shapes(left.shape[:-2], right.shape[:-2], op="matmul (batch dims)")
        dtype = promote_types(self.dtype, other.dtype)
        rows, inner, columns = left.shape[-2], left.shape[-1], right.shape[-1]
        left = left.cast(dtype).expand(batch + (rows, inner)).unsqueeze(-2)  # [..., M, 1, K]
        right = right.cast(dtype).expand(batch + (inner, columns)).mT.unsqueeze(-3)  # [..., 1, N, K]
        product = (left * right).sum(-1, dtype=dtype)  # [..., M, N]
        if self.ndim == 1:
            product = product.squeeze(-2)
        if other.ndim == 1:
            product = product.squeeze(-1)
        return product

    def __matmul__(self: Tensor, other: Tensor) -> Tensor:
        return self.matmul(other)

    def __rmatmul__(self: Tensor, other: Tensor) -> Tensor:
        return other.matmul(self)

    def mm(self: Tensor, other: Tensor) -> Tensor:
        if self.ndim != 2 or other.ndim != 2:
            raise ShapeError(f"mm: both arguments must be 2-d, got shapes {self.shape} and {other.shape}")
        return self.matmul(other)

    def bmm(self: Tensor, other: Tensor) -> Tensor:
        if self.ndim != 3 or other.ndim != 3 or self.shape[0] != other.shape[0]:
            raise ShapeError(f"bmm: both arguments must be 3-d with one batch size, got {self.shape} and {other.shape}")
        return self.matmul(other)

    def dot(self: Tensor, other: Tensor) -> Tensor:
        if self.ndim != 1 or other.ndim != 1 or self.shape != other.shape:
            raise ShapeError(f"dot: expects two 1-d tensors of one size, got shapes {self.shape} and {other.shape}")
        return (self * other).sum()

    def outer(self: Tensor, other: Tensor) -> Tensor:
        if self.ndim != 1 or other.ndim != 1:
            raise ShapeError(f"outer: expects two 1-d tensors, got shapes {self.shape} and {other.shape}")
        return self.unsqueeze(1) * other.unsqueeze(0)
