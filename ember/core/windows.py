"""torch's window functions for signal processing: hann, hamming, bartlett, blackman and kaiser windows."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ember.core import dtype as dtypes
from ember.core.dtype import to_dtype
from ember.core.errors import ArgumentError, DTypeError

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


def _positions(name: str, window_length: int, periodic: bool, dtype: Any, device: Any,
               requires_grad: bool) -> tuple[Tensor, float]:
    """(n = 0..length-1 as floats, the denominator N - 1 of the symmetric window), or (a ready result, 0)."""
    from ember.core.creation import arange, ones, zeros

    resolved = to_dtype(dtype) if dtype is not None else dtypes.DEFAULT_FLOAT
    if not resolved.is_float:
        raise DTypeError(f"{name} expects floating point dtypes, got {resolved.name}")
    if isinstance(window_length, bool) or not isinstance(window_length, int):
        raise TypeError(f"{name}(): argument 'window_length' must be int, not {type(window_length).__name__}")
    if window_length < 0:
        raise ArgumentError(f"{name} requires non-negative window_length, got window_length={window_length}")
    if window_length <= 1:
        maker = ones if window_length == 1 else zeros
        return maker(window_length, dtype=resolved, device=device, requires_grad=requires_grad), 0.0
    span = window_length if periodic else window_length - 1
    return arange(window_length, dtype=resolved, device=device), float(span)


def _finish(window: Tensor, requires_grad: bool) -> Tensor:
    window = window._detached_copy()
    return window.requires_grad_() if requires_grad else window


def hann_window(window_length: int, periodic: bool = True, *, dtype: Any = None, device: Any = None,
                requires_grad: bool = False, **options: Any) -> Tensor:
    """0.5 - 0.5 cos(2 pi n / N), N = length (periodic) or length - 1."""
    return hamming_window(window_length, periodic, 0.5, 0.5, dtype=dtype, device=device,
                          requires_grad=requires_grad, _name="hann_window")


def hamming_window(window_length: int, periodic: bool = True, alpha: float = 0.54, beta: float = 0.46, *,
                   dtype: Any = None, device: Any = None, requires_grad: bool = False,
                   _name: str = "hamming_window", **options: Any) -> Tensor:
    """alpha - beta cos(2 pi n / N), N = length (periodic) or length - 1."""
    positions, span = _positions(_name, window_length, periodic, dtype, device, requires_grad)
    if not span:
        return positions
    return _finish(alpha - beta * (positions * (2 * math.pi / span)).cos(), requires_grad)


def bartlett_window(window_length: int, periodic: bool = True, *, dtype: Any = None, device: Any = None,
                    requires_grad: bool = False, **options: Any) -> Tensor:
    """The triangular window 1 - |2 n / N - 1|."""
    positions, span = _positions("bartlett_window", window_length, periodic, dtype, device, requires_grad)
    if not span:
        return positions
    return _finish(1 - (positions * (2 / span) - 1).abs(), requires_grad)


def blackman_window(window_length: int, periodic: bool = True, *, dtype: Any = None, device: Any = None,
                    requires_grad: bool = False, **options: Any) -> Tensor:
    """0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)."""
    positions, span = _positions("blackman_window", window_length, periodic, dtype, device, requires_grad)
    if not span:
        return positions
    angle = positions * (2 * math.pi / span)
    return _finish(0.42 - 0.5 * angle.cos() + 0.08 * (angle * 2).cos(), requires_grad)


def kaiser_window(window_length: int, periodic: bool = True, beta: float = 12.0, *, dtype: Any = None,
                  device: Any = None, requires_grad: bool = False, **options: Any) -> Tensor:
    """I0(beta * sqrt(1 - ((n - N/2) / (N/2))^2)) / I0(beta), N = length (periodic) or length - 1."""
    positions, span = _positions("kaiser_window", window_length, periodic, dtype, device, requires_grad)
    if not span:
        return positions
    half = span / 2
    ratio = (positions - half) / half
    argument = ((1 - ratio * ratio).clamp_min(0)).sqrt() * beta
    return _finish(argument.i0() / positions._full((), beta, positions.dtype, positions.device).i0(), requires_grad)
