"""torch.nn.functional.interpolate: resampling the spatial dims of [N, C, *] by nearest, nearest-exact, (bi/tri)linear,
bicubic or area rules, one dim at a time. Nearest modes pick source indices (index_select, any dtype); the others
multiply by a constant (output x input) weight matrix per dim built from torch's source-index formulas, so values
and gradients follow from matmul."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ember.core.errors import DTypeError

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

MODES = ("nearest", "linear", "bilinear", "bicubic", "trilinear", "area", "nearest-exact")
SPATIAL_DIMS = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}
CUBIC_A = -0.75  # torch's (and OpenCV's) cubic convolution coefficient


def _float32(value: float) -> float:
    """value rounded to float32, as torch's kernels compute source positions in float for float inputs."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _scale(input_size: int, output_size: int, scale_factor: float | None, align_corners: bool) -> float:
    """torch's area_pixel_compute_scale: input/output per output step."""
    if align_corners:
        return (input_size - 1) / (output_size - 1) if output_size > 1 else 0.0
    if scale_factor is not None and scale_factor > 0:
        return 1.0 / scale_factor
    return input_size / output_size


def _nearest_indices(input_size: int, output_size: int, scale_factor: float | None, exact: bool) -> list[int]:
    scale = _float32(1.0 / scale_factor if scale_factor is not None and scale_factor > 0 else input_size / output_size)
    indices = []
    for index in range(output_size):
        if not exact and output_size == input_size:
            source = index
        elif not exact and output_size == 2 * input_size:
            source = index >> 1
        else:
            source = math.floor(_float32((index + 0.5 if exact else index) * scale))
        indices.append(min(source, input_size - 1))
    return indices


def _linear_weights(input_size: int, output_size: int, scale_factor: float | None, align_corners: bool,
                    cubic: bool) -> list[list[float]]:
    """The (output x input) matrix of linear or cubic interpolation weights, from torch's source positions."""
    scale = _float32(_scale(input_size, output_size, scale_factor, align_corners))
    matrix = [[0.0] * input_size for _ in range(output_size)]
    for index in range(output_size):
        source = _float32(scale * index) if align_corners else _float32(_float32(scale * (index + 0.5)) - 0.5)
        if not cubic:
            source = max(source, 0.0)
            low = int(source)
            high = low + (1 if low < input_size - 1 else 0)
            weight = min(max(_float32(source - low), 0.0), 1.0)
            matrix[index][low] += 1.0 - weight
            matrix[index][high] += weight
            continue
        low = math.floor(source)
        t = _float32(source - low)
        for tap, weight in zip(range(low - 1, low + 3), _cubic_coefficients(t)):
            matrix[index][min(max(tap, 0), input_size - 1)] += weight
    return matrix


def _cubic_coefficients(t: float) -> tuple[float, float, float, float]:
    def near(x: float) -> float:  # |x| <= 1
        return ((CUBIC_A + 2) * x - (CUBIC_A + 3)) * x * x + 1

    def far(x: float) -> float:  # 1 < |x| < 2
        return ((CUBIC_A * x - 5 * CUBIC_A) * x + 8 * CUBIC_A) * x - 4 * CUBIC_A

    return far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)


def _spatial_list(value: Any, count: int, name: str, shape: Sequence[int]) -> list[Any]:
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"interpolate: input and {name} must have the same number of spatial dimensions, but got "
                             f"input with spatial dimensions of {list(shape[2:])} and {name} {list(value)}")
        return list(value)
    return [value] * count


def interpolate(input: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",  # noqa: A002
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """torch.nn.functional.interpolate (see the module docstring); antialias is not supported."""
    if mode not in MODES:
        raise NotImplementedError(f"interpolate: unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ValueError("align_corners option can only be set with the interpolating modes: linear | bilinear | "
                             "bicubic | trilinear")
    elif align_corners is None:
        align_corners = False
    if input.ndim not in (3, 4, 5):
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) for "
                                  f"the modes: {' | '.join(MODES)} (got {mode})")
    spatial = input.ndim - 2
    if mode in SPATIAL_DIMS and SPATIAL_DIMS[mode] != spatial:
        raise NotImplementedError(f"Got {input.ndim}D input, but {mode} mode needs {SPATIAL_DIMS[mode] + 2}D input")
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is None and scale_factor is None:
        raise ValueError("either size or scale_factor should be defined")
    if recompute_scale_factor and size is not None:
        raise ValueError("recompute_scale_factor is not meaningful with an explicit size.")
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported by ember")
    sizes = input.shape[2:]
    if size is not None:
        outputs = [int(value) for value in _spatial_list(size, spatial, "output size", input.shape)]
        scales: list[float | None] = [None] * spatial
    else:
        factors = [float(value) for value in _spatial_list(scale_factor, spatial, "scale_factor", input.shape)]
        outputs = [math.floor(length * factor) for length, factor in zip(sizes, factors)]
        scales = [None] * spatial if recompute_scale_factor or mode == "area" else list(factors)
    if any(count <= 0 for count in outputs):
        raise ValueError(f"interpolate: the output sizes {outputs} must be positive (input spatial sizes "
                         f"{list(sizes)})")
    if mode == "area":
        return {1: input.adaptive_avg_pool1d, 2: input.adaptive_avg_pool2d, 3: input.adaptive_avg_pool3d}[spatial](
            outputs)
    if mode not in ("nearest", "nearest-exact") and not input.dtype.is_float:
        raise DTypeError(f"interpolate: mode {mode!r} needs a floating point input, got {input.dtype.name}")
    from ember.core.creation import tensor as new_tensor

    result = input
    for offset, (length, count, factor) in enumerate(zip(sizes, outputs, scales)):
        axis = 2 + offset
        if mode in ("nearest", "nearest-exact"):
            if count == length and factor in (None, 1.0):
                continue
            indices = _nearest_indices(length, count, factor, mode == "nearest-exact")
            result = result.index_select(axis, new_tensor(indices, device=input.device))
            continue
        weights = _linear_weights(length, count, factor, bool(align_corners), mode == "bicubic")
        matrix = new_tensor(weights, dtype=input.dtype, device=input.device)  # [count, length]
        result = (result.movedim(axis, -1) @ matrix.transpose(0, 1)).movedim(-1, axis)
    return result
