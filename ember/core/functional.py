"""Neural-network Tensor methods (softmax, normalization, convolution, pooling, losses, attention) from primitives."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.core.dtype import to_dtype

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


class FunctionalOps:
    """Mixin: the nn.functional operations that torch also offers as Tensor methods."""

    __slots__ = ()

    def softmax(self: Tensor, dim: int, dtype: Any = None) -> Tensor:
        source = (self.cast(to_dtype(dtype)) if dtype is not None else self)._float_operand()
        shifted = source - source.amax(dim, keepdim=True)
        exponentials = shifted.exp()
        return exponentials / exponentials.sum(dim, keepdim=True)

    def log_softmax(self: Tensor, dim: int, dtype: Any = None) -> Tensor:
        source = (self.cast(to_dtype(dtype)) if dtype is not None else self)._float_operand()
        shifted = source - source.amax(dim, keepdim=True)
        return shifted - shifted.exp().sum(dim, keepdim=True).log()
