"""Distances and similarities between vectors: cosine_similarity, pairwise_distance and pdist (torch's formulas)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ember.core import dtype as dtypes
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.half_precision import computed_in_float32
from ember.core.norms import p_norm
from ember.core.shapes import broadcast_shapes, normalize_dim
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


def _float_pair(x1: Tensor, x2: Tensor, op: str) -> None:
    if not hasattr(x2, "shape") or not hasattr(x2, "_apply"):
        raise TypeError(f"{op}(): argument 'x2' (position 2) must be Tensor, not {type(x2).__name__}")
    if not x1.dtype.is_float or not x2.dtype.is_float:
        raise DTypeError(f"{op}: expected floating point inputs, got {x1.dtype.name} and {x2.dtype.name}")


class DistanceOps(TensorBase):
    """Mixin: cosine_similarity, pairwise_distance, pdist."""

    __slots__ = ()

    @computed_in_float32
    def cosine_similarity(self, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
        """The cosine of the angle between self and x2 along dim, each norm at least eps (broadcast together)."""
        _float_pair(cast("Tensor", self), x2, "cosine_similarity")
        shape = broadcast_shapes(self.shape, x2.shape, op="cosine_similarity")
        first, second = self.expand(shape), x2.expand(shape)
        axis = normalize_dim(dim, len(shape), "cosine_similarity")
        # torch's order: each input divided by its norm (clamped to eps), then the dot product
        first_norm = p_norm(first, 2, (axis,), True).clamp_min(eps)
        second_norm = p_norm(second, 2, (axis,), True).clamp_min(eps)
        return ((first / first_norm) * (second / second_norm)).sum(axis)

    def pairwise_distance(self, x2: Tensor, p: float = 2.0, eps: float = 1e-6,
                          keepdim: bool = False) -> Tensor:
        """The p-norm of self - x2 + eps over the last dim (torch.pairwise_distance)."""
        _float_pair(cast("Tensor", self), x2, "pairwise_distance")
        difference = self - x2 + eps
        if difference.ndim == 0:
            return difference.abs()
        return p_norm(difference, float(p), (difference.ndim - 1,), keepdim)

    def pdist(self, p: float = 2.0) -> Tensor:
        """The p-norm distances between each pair of rows i < j of an [N, M] tensor, in row-major pair order."""
        if self.ndim != 2:
            raise ShapeError(f"pdist only supports 2-d tensors, got shape {self.shape}")
        if not self.dtype.is_float:
            raise DTypeError(f"pdist only supports floating point dtypes, got {self.dtype.name}")
        if p < 0:
            raise ArgumentError(f"pdist only supports non-negative p values, got {p}")
        from ember.core.matrix_structure import triu_indices

        count = self.shape[0]
        if count < 2:
            return self._full((0,), 0, self.dtype, self.device)
        pairs = triu_indices(count, count, 1, device=self.device, dtype=dtypes.int64)
        difference = self._index_select(0, pairs[0], checked=False) - self._index_select(0, pairs[1], checked=False)
        return p_norm(difference, float(p), (1,), False)
