"""Indexing Tensor methods: __getitem__ (ints, slices with steps, None, Ellipsis) as views."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.core.errors import ShapeError

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


def _normalize_slice(index: slice, size: int) -> tuple[int, int, int]:
    """start, stop, step of a slice over a dim of `size`, clamped like Python sequences (step > 0 only, as torch)."""
    if index.step is not None and int(index.step) <= 0:
        raise ValueError(f"step must be greater than zero, got {index.step} (torch does not allow negative steps)")
    return index.indices(size)


class IndexingOps:
    """Mixin: indexing. Basic indices become movement ops; nothing is copied."""

    __slots__ = ()

    def __getitem__(self: Tensor, indices: Any) -> Tensor:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if any(isinstance(index, IndexingOps) or isinstance(index, (list,)) for index in indices):
            from ember.core.advanced_indexing import advanced_getitem

            return advanced_getitem(self, indices)
        return _basic_getitem(self, indices)


def _basic_getitem(tensor: Tensor, indices: tuple[Any, ...]) -> Tensor:
    """Ints, slices, None and Ellipsis: shrink, then stride by reshaping, then drop int dims and add None dims."""
    consumed = sum(1 for index in indices if index is not None and index is not Ellipsis)
    if sum(1 for index in indices if index is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > tensor.ndim:
        raise IndexError(f"too many indices for a tensor of rank {tensor.ndim}: got {consumed} ({indices})")
    expanded: list[Any] = []
    for index in indices:
        if index is Ellipsis:
            expanded.extend([slice(None)] * (tensor.ndim - consumed))
        else:
            expanded.append(index)
    expanded.extend([slice(None)] * (tensor.ndim - sum(1 for index in expanded if index is not None)))

    bounds, steps, final_shape, dim = [], [], [], 0
    for index in expanded:
        if index is None:
            final_shape.append(1)
            continue
        size = tensor.shape[dim]
        if isinstance(index, slice):
            start, stop, step = _normalize_slice(index, size)
            stop = max(stop, start)
            bounds.append((start, stop))
            steps.append(step)
            final_shape.append(len(range(start, stop, step)))
        else:
            try:
                position = int(index)
            except TypeError:
                raise TypeError(
                    f"invalid index of type {type(index).__name__}; valid: int, slice, None, Ellipsis, bool or "
                    "integer tensors and lists"
                ) from None
            if not -size <= position < size:
                raise IndexError(f"index {position} is out of bounds for dim {dim} with size {size}")
            position %= size
            bounds.append((position, position + 1))
            steps.append(1)
        dim += 1
    result = tensor.shrink(bounds)
    if any(step != 1 for step in steps):
        result = _stride(result, steps)
    return result.reshape(tuple(final_shape))


def _stride(tensor: Tensor, steps: list[int]) -> Tensor:
    """Take every step-th element of each dim: pad each dim to a multiple of its step, split it, keep index 0."""
    amounts = [(0, (-size) % step) for size, step in zip(tensor.shape, steps)]
    padded = tensor._pad_and_shrink(amounts)
    split_shape, keep = [], []
    for size, step in zip(padded.shape, steps):
        split_shape += [size // step, step]
        keep += [None, (0, 1)]
    result = padded.reshape(split_shape).shrink(keep)
    if any(size < 0 for size in result.shape):
        raise ShapeError("internal: negative size after striding")
    return result.reshape(tuple(size // step for size, step in zip(padded.shape, steps)))
