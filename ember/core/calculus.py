"""Numerical integration along a dim with torch's signatures: trapezoid (trapz) and cumulative_trapezoid."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.core.errors import ArgumentError, ShapeError
from ember.core.shapes import normalize_dim

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


def _later(tensor: Tensor, axis: int) -> Tensor:
    """Every sample along axis but the first."""
    count = tensor.shape[axis]
    return tensor.narrow(axis, min(1, count), max(count - 1, 0))


def _earlier(tensor: Tensor, axis: int) -> Tensor:
    """Every sample along axis but the last."""
    return tensor.narrow(axis, 0, max(tensor.shape[axis] - 1, 0))


def _areas(y: Tensor, x: Any, dx: Any, dim: int, op: str) -> tuple[Tensor, int]:
    """The area of each trapezoid between neighbouring samples along dim (and that dim, made non-negative)."""
    if not hasattr(y, "_apply"):
        raise TypeError(f"{op}(): argument 'y' must be Tensor, not {type(y).__name__}")
    if x is not None and dx is not None:
        raise ArgumentError(f"{op}: give either x or dx, not both")
    axis = normalize_dim(dim, y.ndim, op)
    count = y.shape[axis]
    values = y._float_operand()
    heights = _later(values, axis) + _earlier(values, axis)
    if x is None:
        return heights * (0.5 * (1.0 if dx is None else float(dx))), axis
    if not hasattr(x, "_apply"):  # a number is torch's dx given by position
        return heights * (0.5 * float(x)), axis
    if x.ndim == 1:
        if x.shape[0] != count:
            raise ShapeError(f"{op}: there must be one `x` value for each sample point (x has {x.shape[0]}, y has "
                             f"{count} along dim {dim})")
        shape = [1] * y.ndim
        shape[axis] = max(count - 1, 0)
        widths = (_later(x, 0) - _earlier(x, 0)).reshape(shape)
    else:
        x_axis = normalize_dim(dim, x.ndim, op)
        widths = _later(x, x_axis) - _earlier(x, x_axis)
    return heights * widths * 0.5, axis


def trapezoid(y: Tensor, x: Any = None, *, dx: Any = None, dim: int = -1) -> Tensor:
    """The trapezoidal rule along dim: samples y at points x (a 1-d tensor, or one like y) or spaced dx (1)."""
    areas, axis = _areas(y, x, dx, dim, "trapezoid")
    return areas.sum(axis)


def trapz(y: Tensor, x: Any = None, *, dx: Any = None, dim: int = -1) -> Tensor:
    """torch.trapz: trapezoid's older name."""
    areas, axis = _areas(y, x, dx, dim, "trapz")
    return areas.sum(axis)


def cumulative_trapezoid(y: Tensor, x: Any = None, *, dx: Any = None, dim: int = -1) -> Tensor:
    """The running trapezoidal integral along dim (one element fewer than y there)."""
    areas, axis = _areas(y, x, dx, dim, "cumulative_trapezoid")
    return areas.cumsum(axis)
