"""torch's fused arithmetic forms as compositions: the scaled sums of products (addmv, addr, baddbmm, addbmm, and
addmm's rule), vdot and rsub."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ember.core.errors import ShapeError
from ember.core.shapes import broadcast_shapes
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

Number = int | float | bool


def scaled_sum(input: Tensor, product: Tensor, beta: Number, alpha: Number, op: str) -> Tensor:  # noqa: A002
    """beta * input + alpha * product, torch's rule for addmm and friends: input broadcasts to the product's shape
    (never the other way), and beta = 0 ignores input, so NaN and inf in it do not reach the result."""
    if broadcast_shapes(input.shape, product.shape, op=op) != product.shape:
        raise ShapeError(f"{op}: input of shape {input.shape} does not broadcast to the product's shape "
                         f"{product.shape}")
    scaled = product if alpha == 1 else product * alpha
    if beta == 0:  # a zero of input's dtype and shape keeps torch's dtype promotion without reading input
        return scaled + input._full(input.shape, 0, input.dtype, input.device)
    return scaled + (input if beta == 1 else input * beta)


class ArithmeticFormOps(TensorBase):
    """Mixin: addmv, addr, baddbmm, addbmm, vdot (addcmul and addcdiv are binary_math's)."""

    __slots__ = ()

    def addmv(self, mat: Tensor, vec: Tensor, *, beta: Number = 1, alpha: Number = 1) -> Tensor:
        """beta * self + alpha * (mat @ vec) (torch.addmv)."""
        if mat.ndim != 2 or vec.ndim != 1 or mat.shape[1] != vec.shape[0]:
            raise ShapeError(f"addmv: size mismatch, got input {self.shape}, mat {mat.shape}, vec {vec.shape}; "
                             f"mat must be 2-d (n, m) and vec 1-d (m)")
        return scaled_sum(cast("Tensor", self), mat.mv(vec), beta, alpha, "addmv")

    def addr(self, vec1: Tensor, vec2: Tensor, *, beta: Number = 1, alpha: Number = 1) -> Tensor:
        """beta * self + alpha * outer(vec1, vec2) (torch.addr)."""
        for name, vector in (("vec1", vec1), ("vec2", vec2)):
            if vector.ndim != 1:
                raise ShapeError(f"addr: expected 1-d argument {name}, but got shape {vector.shape}")
        return scaled_sum(cast("Tensor", self), vec1.outer(vec2), beta, alpha, "addr")

    def baddbmm(self, batch1: Tensor, batch2: Tensor, *, beta: Number = 1, alpha: Number = 1) -> Tensor:
        """beta * self + alpha * (batch1 @ batch2) for batches of matrices (torch.baddbmm)."""
        _check_batches(batch1, batch2, "baddbmm")
        return scaled_sum(cast("Tensor", self), batch1.bmm(batch2), beta, alpha, "baddbmm")

    def addbmm(self, batch1: Tensor, batch2: Tensor, *, beta: Number = 1, alpha: Number = 1) -> Tensor:
        """beta * self + alpha * the sum over the batch of batch1[i] @ batch2[i] (torch.addbmm)."""
        _check_batches(batch1, batch2, "addbmm")
        left = batch1.permute(1, 0, 2).reshape(batch1.shape[1], -1)  # (n, batch * k)
        right = batch2.reshape(-1, batch2.shape[2])  # (batch * k, m)
        return scaled_sum(cast("Tensor", self), left.mm(right), beta, alpha, "addbmm")

    def vdot(self, other: Tensor) -> Tensor:
        """The dot product of two 1-d tensors (torch.vdot; ember has no complex dtypes to conjugate)."""
        if self.ndim != 1 or getattr(other, "ndim", None) != 1 or self.shape != other.shape:
            raise ShapeError(f"vdot: expects two 1-d tensors of one size, got shapes {self.shape} and "
                             f"{getattr(other, 'shape', type(other).__name__)}")
        return self.dot(other)


def rsub(input: Tensor, other: Any, *, alpha: Number = 1) -> Tensor:  # noqa: A002 - torch's names
    """other - alpha * input (torch.rsub)."""
    from ember.core.elementwise import ElementwiseOps

    if not isinstance(input, ElementwiseOps):
        raise TypeError(f"rsub(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    scaled = input if alpha == 1 else input * alpha
    if isinstance(other, ElementwiseOps):
        return other - scaled
    return scaled.__rsub__(other)


def _check_batches(batch1: Tensor, batch2: Tensor, op: str) -> None:
    if batch1.ndim != 3 or batch2.ndim != 3:
        raise ShapeError(f"{op}: batch1 and batch2 must be 3-d, got shapes {batch1.shape} and {batch2.shape}")
    if batch2.shape[:2] != (batch1.shape[0], batch1.shape[2]):
        raise ShapeError(f"{op}: expected batch2 to start with ({batch1.shape[0]}, {batch1.shape[2]}) for batch1 of "
                         f"shape {batch1.shape}, but got {batch2.shape}")
