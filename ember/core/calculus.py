"""Numerical calculus along a dim with torch's signatures: trapezoid (trapz), cumulative_trapezoid and gradient."""

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


def gradient(input: Tensor, *, spacing: Any = 1, dim: Any = None,  # noqa: A002 - torch's names
             edge_order: int = 1) -> tuple[Tensor, ...]:
    """torch.gradient: the derivative along each dim by central differences inside and one-sided ones (of
    `edge_order` 1 or 2) at the ends; spacing is a number, one number per dim, or one coordinate tensor per dim."""
    if not hasattr(input, "_apply"):
        raise TypeError(f"gradient(): argument 'input' must be Tensor, not {type(input).__name__}")
    if edge_order not in (1, 2):
        raise ArgumentError(f"torch.gradient only supports edge_order=1 and edge_order=2, got {edge_order}")
    dims = list(range(input.ndim)) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    axes = [normalize_dim(axis, input.ndim, "gradient") for axis in dims]
    if isinstance(spacing, (list, tuple)):
        if len(spacing) != len(axes):
            raise ArgumentError(f"torch.gradient expected spacing to be unspecified, a scalar or a list of length "
                                f"{len(axes)} (one per dim), but got a list of length {len(spacing)}")
        spacings = list(spacing)
    else:
        spacings = [spacing] * len(axes)
    values = input._float_operand()
    results = []
    for axis, step in zip(axes, spacings):
        count = values.shape[axis]
        if count < edge_order + 1:
            raise ArgumentError(f"torch.gradient expected each dimension size to be at least edge_order+1, got size "
                                f"{count} along dim {axis}")
        results.append(_derivative(values, axis, step, edge_order))
    return tuple(results)


def _derivative(values: Tensor, axis: int, step: Any, edge_order: int) -> Tensor:
    count = values.shape[axis]

    def part(start: int, length: int) -> Tensor:
        return values.narrow(axis, start, length)

    if hasattr(step, "_apply"):  # coordinates of the samples along this dim
        if step.ndim != 1 or step.shape[0] != count:
            raise ShapeError(f"torch.gradient expected the coordinates along dim {axis} to be a 1-d tensor of "
                             f"{count} values, got shape {list(step.shape)}")
        if edge_order != 1:
            raise NotImplementedError("gradient: edge_order=2 with coordinate spacing is not supported by ember")
        shape = [1] * values.ndim
        shape[axis] = count - 1
        widths = (step.narrow(0, 1, count - 1) - step.narrow(0, 0, count - 1)).cast(values.dtype).reshape(shape)
        first = (part(1, 1) - part(0, 1)) / widths.narrow(axis, 0, 1)
        last = (part(count - 1, 1) - part(count - 2, 1)) / widths.narrow(axis, count - 2, 1)
        if count == 2:
            return first.cat([last], axis)
        left, right = widths.narrow(axis, 0, count - 2), widths.narrow(axis, 1, count - 2)
        inner = (left * left * part(2, count - 2) - right * right * part(0, count - 2)
                 + (right * right - left * left) * part(1, count - 2)) / (left * right * (left + right))
        return first.cat([inner, last], axis)
    width = float(step)
    if edge_order == 1:
        first = (part(1, 1) - part(0, 1)) / width
        last = (part(count - 1, 1) - part(count - 2, 1)) / width
    else:
        first = (part(0, 1) * -3 + part(1, 1) * 4 - part(2, 1)) / (2 * width)
        last = (part(count - 1, 1) * 3 - part(count - 2, 1) * 4 + part(count - 3, 1)) / (2 * width)
    if count == 2:
        return first.cat([last], axis)
    inner = (part(2, count - 2) - part(0, count - 2)) / (2 * width)
    return first.cat([inner, last], axis)
