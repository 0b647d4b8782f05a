"""Spatial transformers: affine_grid (sampling positions from affine matrices) and grid_sample (bilinear or nearest
reads of an image at given positions, torch's padding modes and align_corners). A sample is a weighted sum of the
input at up to four pixels: the weights form a sparse (pixels x samples) matrix built as one-hot comparisons, so the
read is one batched matmul and gradients reach both the input and the grid (through the bilinear weights)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.core import dtype as dtypes
from ember.core.elementwise import where
from ember.core.errors import ArgumentError, DTypeError, ShapeError

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

GRID_SAMPLE_MODES = ("bilinear", "nearest")
PADDING_MODES = ("zeros", "border", "reflection")


def _base_coordinates(count: int, align_corners: bool, like: Tensor) -> Tensor:
    """torch's normalized pixel positions in [-1, 1] along an axis of `count` pixels."""
    from ember.core.creation import linspace

    positions = linspace(-1.0, 1.0, count, dtype=like.dtype, device=like.device)
    return positions if align_corners or count <= 1 else positions * ((count - 1) / count)


def affine_grid(theta: Tensor, size: Any, align_corners: bool | None = None) -> Tensor:
    """The sampling grid [N, H, W, 2] (or [N, D, H, W, 3]) of the affine maps theta [N, 2, 3] (or [N, 3, 4])
    applied to the normalized pixel positions of an output of `size` [N, C, H, W] (or [N, C, D, H, W])."""
    if not theta.dtype.is_float:
        raise DTypeError(f"affine_grid: expected theta to be a floating point tensor, got {theta.dtype.name}")
    sizes = tuple(int(value) for value in size)
    spatial = len(sizes) - 2
    if spatial not in (2, 3):
        raise NotImplementedError(f"affine_grid only supports 4D and 5D sizes, for 2D and 3D affine transforms, "
                                  f"respectively. Got size {list(sizes)}.")
    if theta.ndim != 3 or theta.shape != (sizes[0], spatial, spatial + 1):
        raise ShapeError(f"affine_grid: expected a batch of {spatial}D affine matrices of shape "
                         f"{[sizes[0], spatial, spatial + 1]} for size {list(sizes)}, got {list(theta.shape)}")
    if min(sizes[2:]) <= 0:
        raise ValueError(f"Expected non-zero, positive output size. Got {list(sizes)}")
    align = bool(align_corners)
    axes = [_base_coordinates(count, align, theta) for count in reversed(sizes[2:])]  # x (width) first
    grids = []
    for position, axis in enumerate(axes):
        shape = [1] * spatial
        shape[spatial - 1 - position] = axis.shape[0]
        grids.append(axis.reshape(shape).expand(sizes[2:]))
    grids.append(theta._full(sizes[2:], 1, theta.dtype, theta.device))
    from ember.core.movement import stack

    base = stack(grids, -1).reshape(1, -1, spatial + 1)  # [1, points, spatial + 1]
    return (base @ theta.transpose(1, 2)).reshape(sizes[0], *sizes[2:], spatial)


def _unnormalize(coordinate: Tensor, size: int, align_corners: bool) -> Tensor:
    if align_corners:
        return (coordinate + 1) * ((size - 1) / 2)
    return ((coordinate + 1) * size - 1) / 2


def _reflect(coordinate: Tensor, twice_low: int, twice_high: int) -> Tensor:
    """torch's reflect_coordinates: fold the coordinate into [twice_low / 2, twice_high / 2]."""
    if twice_low == twice_high:
        return coordinate * 0
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    distance = (coordinate - low).abs()
    flips = (distance / span).floor()
    extra = distance - flips * span
    even = (flips - (flips / 2).floor() * 2) == 0
    return where(even, extra + low, span - extra + low)


def _source_position(coordinate: Tensor, size: int, padding_mode: str, align_corners: bool) -> Tensor:
    position = _unnormalize(coordinate, size, align_corners)
    if padding_mode == "border":
        return position.clamp(0, size - 1)
    if padding_mode == "reflection":
        reflected = _reflect(position, 0, 2 * (size - 1)) if align_corners else _reflect(position, -1, 2 * size - 1)
        return reflected.clamp(0, size - 1)
    return position


def grid_sample(input: Tensor, grid: Tensor, mode: str = "bilinear", padding_mode: str = "zeros",  # noqa: A002
                align_corners: bool | None = None) -> Tensor:
    """Sample input [N, C, H, W] at the normalized positions grid [N, Ho, Wo, 2] ((x, y) in [-1, 1])."""
    if mode not in GRID_SAMPLE_MODES:
        if mode == "bicubic":
            raise NotImplementedError("grid_sample: mode 'bicubic' is not supported by ember; use 'bilinear' or "
                                      "'nearest'")
        raise ArgumentError(f"nn.functional.grid_sample(): expected mode to be 'bilinear', 'nearest' or 'bicubic', "
                            f"but got: '{mode}'")
    if padding_mode not in PADDING_MODES:
        raise ArgumentError(f"nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or "
                            f"'reflection', but got: '{padding_mode}'")
    if input.ndim == 5:
        raise NotImplementedError("grid_sample: 5-D (volumetric) inputs are not supported by ember")
    if input.ndim != 4 or grid.ndim != 4 or grid.shape[-1] != 2 or grid.shape[0] != input.shape[0]:
        raise ShapeError(f"grid_sample: expected input [N, C, H, W] and grid [N, H_out, W_out, 2] with the same N, "
                         f"got input {list(input.shape)} and grid {list(grid.shape)}")
    if not input.dtype.is_float or grid.dtype != input.dtype:
        raise DTypeError(f"grid_sample: expected input and grid of one floating point dtype, got {input.dtype.name} "
                         f"and {grid.dtype.name}")
    batch, channels, height, width = input.shape
    align = bool(align_corners)
    x = _source_position(grid[..., 0], width, padding_mode, align).reshape(batch, 1, -1)  # [N, 1, P]
    y = _source_position(grid[..., 1], height, padding_mode, align).reshape(batch, 1, -1)
    pixels = input._arange_primitive(height * width, dtypes.int64, input.device).reshape(1, -1, 1)  # [1, HW, 1]
    if mode == "nearest":
        taps = [(x.round(), y.round(), x * 0 + 1)]  # the grid gets torch's zero gradient, not none
    else:
        left, top = x.floor(), y.floor()
        right_weight, bottom_weight = x - left, y - top
        taps = [(left, top, (1 - right_weight) * (1 - bottom_weight)),
                (left + 1, top, right_weight * (1 - bottom_weight)),
                (left, top + 1, (1 - right_weight) * bottom_weight),
                (left + 1, top + 1, right_weight * bottom_weight)]
    weights = None
    for column, row, weight in taps:
        inside = (column >= 0).logical_and(column <= width - 1).logical_and(row >= 0).logical_and(row <= height - 1)
        index = (row._detached_copy().clamp(0, height - 1) * width + column._detached_copy().clamp(0, width - 1)).cast(dtypes.int64)
        hit = (index == pixels).logical_and(inside)  # [N, HW, P]
        term = where(hit, weight, 0.0)
        weights = term if weights is None else weights + term
    assert weights is not None  # four taps (or one)
    samples = input.reshape(batch, channels, height * width) @ weights  # [N, C, P]
    return samples.reshape(batch, channels, *grid.shape[1:3])

