"""numpy-style stacking and splitting with torch's rules: hstack/vstack/dstack/column_stack, atleast_1d/2d/3d,
hsplit/vsplit/dsplit, split_with_sizes, unravel_index; all views plus cat, so gradients come from the primitives."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ember.core import dtype as dtypes
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.movement import cat
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


class StackingOps(TensorBase):
    """Mixin: the Tensor methods among them (hsplit, vsplit, dsplit, split_with_sizes, unsafe_split, ...)."""

    __slots__ = ()

    def split_with_sizes(self, split_sizes: Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        """Pieces of the given sizes along dim; the sizes must sum to its size (torch.split_with_sizes)."""
        if not isinstance(split_sizes, (list, tuple)):
            raise TypeError(f"split_with_sizes(): argument 'split_sizes' must be a sequence of ints, not "
                            f"{type(split_sizes).__name__}")
        return self.split(list(split_sizes), dim)

    def unsafe_split(self, split_size: int, dim: int = 0) -> tuple[Tensor, ...]:
        """split (torch's unsafe_ forms skip view bookkeeping that ember's values do not have)."""
        return self.split(split_size, dim)

    def unsafe_split_with_sizes(self, split_sizes: Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        return self.split_with_sizes(split_sizes, dim)

    def unsafe_chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        return self.chunk(chunks, dim)

    def hsplit(self, indices_or_sections: Any) -> tuple[Tensor, ...]:
        """Split along dim 1 (dim 0 of a 1-d tensor) into equal sections or at indices (torch.hsplit)."""
        return _numpy_split(cast("Tensor", self), indices_or_sections, 1 if self.ndim > 1 else 0, 1, "hsplit")

    def vsplit(self, indices_or_sections: Any) -> tuple[Tensor, ...]:
        """Split along dim 0 of a tensor with at least 2 dims (torch.vsplit)."""
        return _numpy_split(cast("Tensor", self), indices_or_sections, 0, 2, "vsplit")

    def dsplit(self, indices_or_sections: Any) -> tuple[Tensor, ...]:
        """Split along dim 2 of a tensor with at least 3 dims (torch.dsplit)."""
        return _numpy_split(cast("Tensor", self), indices_or_sections, 2, 3, "dsplit")


def _numpy_split(tensor: Tensor, indices_or_sections: Any, dim: int, least: int, op: str) -> tuple[Tensor, ...]:
    if tensor.ndim < least:
        raise ShapeError(f"{op} requires a tensor with at least {least} dimension(s), but got a tensor with "
                         f"{tensor.ndim} dimensions")
    if isinstance(indices_or_sections, (list, tuple)):
        return tensor.tensor_split(indices_or_sections, dim)
    if isinstance(indices_or_sections, bool) or not isinstance(indices_or_sections, int):
        raise TypeError(f"{op}(): argument 'indices_or_sections' must be an int or a sequence of ints, not "
                        f"{type(indices_or_sections).__name__}")
    size = tensor.shape[dim]
    if indices_or_sections <= 0 or size % indices_or_sections != 0:
        raise ArgumentError(f"{op} attempted to split along dimension {dim}, but the size of the dimension {size} "
                            f"is not divisible by the split_size {indices_or_sections}")
    return tensor.tensor_split(indices_or_sections, dim)


def _tensors(arguments: tuple[Any, ...], op: str) -> tuple[list[Tensor], bool]:
    """The tensors of `f(t)`, `f(t1, t2, ...)` or `f([t1, t2])`, and whether one tensor was given alone."""
    from ember.core.tensor import tensor_sequence

    if len(arguments) == 1 and isinstance(arguments[0], (list, tuple)):
        return tensor_sequence(arguments[0]), False
    for value in arguments:
        if not hasattr(value, "shape") or not hasattr(value, "_apply"):
            raise TypeError(f"{op}(): expected Tensors or a sequence of Tensors, got {type(value).__name__}")
    return list(arguments), len(arguments) == 1


def _at_least(arguments: tuple[Any, ...], rank: int, op: str) -> Any:
    tensors, alone = _tensors(arguments, op)
    results = []
    for tensor in tensors:
        if tensor.ndim >= rank:
            results.append(tensor)
        elif rank == 3 and tensor.ndim == 2:  # numpy's rule: a matrix gets a trailing dim
            results.append(tensor.unsqueeze(2))
        elif rank == 3 and tensor.ndim == 1:  # and a vector one on each side
            results.append(tensor.reshape(1, tensor.shape[0], 1))
        else:
            results.append(tensor.reshape((1,) * (rank - tensor.ndim) + tuple(tensor.shape)))
    return results[0] if alone else tuple(results)


def atleast_1d(*tensors: Any) -> Any:
    """Each tensor with at least 1 dim (a 0-d one becomes shape (1,)); a tuple when several are given."""
    return _at_least(tensors, 1, "atleast_1d")


def atleast_2d(*tensors: Any) -> Any:
    """Each tensor with at least 2 dims (a vector of n becomes (1, n)); a tuple when several are given."""
    return _at_least(tensors, 2, "atleast_2d")


def atleast_3d(*tensors: Any) -> Any:
    """Each tensor with at least 3 dims ((n,) -> (1, n, 1), (m, n) -> (m, n, 1)); a tuple when several are given."""
    return _at_least(tensors, 3, "atleast_3d")


def _stack_parts(tensors: Sequence[Tensor], op: str) -> list[Tensor]:
    from ember.core.tensor import tensor_sequence

    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}(): argument 'tensors' must be a sequence of Tensors, not {type(tensors).__name__}")
    parts = tensor_sequence(tensors)
    if not parts:
        raise ArgumentError(f"{op} expects a non-empty sequence of tensors")
    return parts


def hstack(tensors: Sequence[Tensor]) -> Tensor:
    """Join along dim 1, or dim 0 when the tensors are vectors (0-d tensors count as vectors of one)."""
    parts = list(atleast_1d(_stack_parts(tensors, "hstack")))
    return cat(parts, 0 if parts[0].ndim == 1 else 1)


def vstack(tensors: Sequence[Tensor]) -> Tensor:
    """Join along dim 0 after making every tensor at least 2-d (a vector becomes a row)."""
    return cat(list(atleast_2d(_stack_parts(tensors, "vstack"))), 0)


row_stack = vstack


def dstack(tensors: Sequence[Tensor]) -> Tensor:
    """Join along dim 2 after making every tensor at least 3-d."""
    return cat(list(atleast_3d(_stack_parts(tensors, "dstack"))), 2)


def column_stack(tensors: Sequence[Tensor]) -> Tensor:
    """Join along dim 1, vectors (and 0-d tensors) as columns."""
    parts = _stack_parts(tensors, "column_stack")
    return cat([part.reshape(part.numel(), 1) if part.ndim <= 1 else part for part in parts], 1)


def unravel_index(indices: Tensor, shape: int | Sequence[int]) -> tuple[Tensor, ...]:
    """The coordinates in `shape` of flat indices, one int64 tensor per dim (indices wrap like Python's modulo)."""
    if not hasattr(indices, "dtype") or not hasattr(indices, "_apply"):
        raise TypeError(f"unravel_index(): expected 'indices' to be a Tensor, got {type(indices).__name__}")
    if not indices.dtype.is_int:
        raise DTypeError(f"expected 'indices' to be integer dtype, but got {indices.dtype.name}")
    sizes = (shape,) if isinstance(shape, int) else tuple(int(size) for size in shape)
    if any(size < 0 for size in sizes):
        raise ValueError(f"'shape' cannot have negative values, but got {sizes}")
    remaining = indices.cast(dtypes.int64)
    coordinates = []
    for size in reversed(sizes):
        if size == 0:
            raise ArgumentError(f"unravel_index: 'shape' {sizes} has a zero size, so no index is in it")
        coordinates.append(remaining.remainder(size))
        remaining = remaining.floor_divide(size)
    return tuple(reversed(coordinates))
