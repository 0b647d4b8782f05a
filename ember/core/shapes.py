"""Shape arithmetic and the checks that raise user-facing errors: broadcasting, dims, reshape sizes."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ember.core.errors import ArgumentError, AxisError, ShapeError

Shape = tuple[int, ...]


def prod(values: Iterable[int]) -> int:
    """The product of a sequence of ints (1 for an empty one)."""
    return math.prod(values)


def normalize_dim(dim: int, ndim: int, op: str = "op") -> int:
    """A dim in [-ndim, ndim) made non-negative, or an AxisError naming the valid range."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    low, high = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
    if not low <= dim <= high:
        raise AxisError(f"{op}: dim {dim} is out of range for a tensor of rank {ndim} (valid: {low} to {high})")
    return dim % ndim if ndim > 0 else 0


def normalize_dims(dims: int | Sequence[int] | None, ndim: int, op: str = "op") -> tuple[int, ...]:
    """Dims (None meaning all) as sorted non-negative ints; repeated dims raise."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    result = tuple(normalize_dim(dim, ndim, op) for dim in dims)
    if len(set(result)) != len(result):
        raise ArgumentError(f"{op}: dim {tuple(dims)} repeats an axis; give each dim once")
    return tuple(sorted(result)) if ndim > 0 else ()


def broadcast_shapes(*shapes: Shape | int, op: str = "broadcast_shapes") -> Shape:
    """PyTorch's broadcast of several shapes (an int is a 1-d shape, as in torch.broadcast_shapes), or a ShapeError
    naming all of them."""
    if len(shapes) == 2:  # (the per-op path: two tensor shapes, compared dim by dim from the end)
        first, second = shapes
        if not isinstance(first, int) and not isinstance(second, int):
            if len(first) < len(second):
                first, second = second, first
            lead = len(first) - len(second)
            combined = list(first)
            for axis, size in enumerate(second):
                own = first[lead + axis]
                if own != size:
                    if own == 1:
                        combined[lead + axis] = size
                    elif size != 1:
                        break
            else:
                return tuple(combined)
    normalized = tuple((shape,) if isinstance(shape, int) else tuple(shape) for shape in shapes)
    ndim = max((len(shape) for shape in normalized), default=0)
    result = []
    for axis in range(ndim):
        sizes = {shape[axis - ndim + len(shape)] for shape in normalized if axis - ndim + len(shape) >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            listed = ", ".join(str(shape) for shape in normalized)
            raise ShapeError(
                f"{op}: shapes {listed} cannot be broadcast: at dim {axis - ndim} sizes {sorted(sizes)} differ and "
                f"none is 1"
            )
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def resolve_reshape(old: Shape, new: Sequence[int], op: str = "reshape") -> Shape:
    """A reshape target with at most one -1 filled in, or a ShapeError naming both shapes."""
    new = tuple(int(size) for size in new)
    if sum(1 for size in new if size == -1) > 1:
        raise ShapeError(f"{op}: only one dimension can be -1, got {new}")
    if any(size < -1 for size in new):
        raise ShapeError(f"{op}: invalid size in shape {new}; sizes must be non-negative or -1")
    total = prod(old)
    if -1 in new:
        known = prod([size for size in new if size != -1])
        if known == 0 or total % known != 0:
            raise ShapeError(f"{op}: shape {new} is invalid for a tensor of shape {old} ({total} elements)")
        new = tuple(total // known if size == -1 else size for size in new)
    if prod(new) != total:
        raise ShapeError(f"{op}: shape {new} is invalid for a tensor of shape {old} ({total} elements)")
    return new


def strides_of(shape: Shape) -> tuple[int, ...]:
    """Contiguous (row-major) element strides of a shape."""
    strides = []
    running = 1
    for size in reversed(shape):
        strides.append(running)
        running *= size
    return tuple(reversed(strides))
