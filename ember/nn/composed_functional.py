"""nn.functional functions that torch too writes as compositions of other functional ones: lp_pool1d/2d/3d,
max_pool*_with_indices, local_response_norm, dropout3d, gumbel_softmax and interpolate's older names (upsample,
upsample_nearest, upsample_bilinear); re-exported by ember.nn.functional."""

from __future__ import annotations

import math
from typing import Any

from ember.core.convolution import IntOrInts
from ember.core.interpolation import interpolate
from ember.core.tensor import Tensor


def _lp_pool(input: Tensor, norm_type: float, kernel_size: IntOrInts, stride: IntOrInts | None,  # noqa: A002
             ceil_mode: bool, spatial: int) -> Tensor:
    """torch's rule: (the average of x^p over each window, times its size) ^ (1/p), negatives of x^p kept at 0."""
    kernel = (kernel_size,) * spatial if isinstance(kernel_size, int) else tuple(kernel_size)
    powered = input.pow(norm_type)
    average = {1: powered.avg_pool1d, 2: powered.avg_pool2d, 3: powered.avg_pool3d}[spatial](
        kernel_size, stride, 0, ceil_mode)
    return (average.sign() * average.abs().relu()).mul(math.prod(kernel)).pow(1.0 / norm_type)


def lp_pool1d(input: Tensor, norm_type: float, kernel_size: int, stride: int | None = None,  # noqa: A002
              ceil_mode: bool = False) -> Tensor:
    return _lp_pool(input, norm_type, kernel_size, stride, ceil_mode, 1)


def lp_pool2d(input: Tensor, norm_type: float, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
              ceil_mode: bool = False) -> Tensor:
    return _lp_pool(input, norm_type, kernel_size, stride, ceil_mode, 2)


def lp_pool3d(input: Tensor, norm_type: float, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
              ceil_mode: bool = False) -> Tensor:
    return _lp_pool(input, norm_type, kernel_size, stride, ceil_mode, 3)


def max_pool1d_with_indices(input: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
                            padding: IntOrInts = 0, dilation: IntOrInts = 1, ceil_mode: bool = False,
                            return_indices: bool = True) -> tuple[Tensor, Tensor]:
    return input.max_pool1d(kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool2d_with_indices(input: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
                            padding: IntOrInts = 0, dilation: IntOrInts = 1, ceil_mode: bool = False,
                            return_indices: bool = True) -> tuple[Tensor, Tensor]:
    return input.max_pool2d(kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool3d_with_indices(input: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
                            padding: IntOrInts = 0, dilation: IntOrInts = 1, ceil_mode: bool = False,
                            return_indices: bool = True) -> tuple[Tensor, Tensor]:
    return input.max_pool3d(kernel_size, stride, padding, dilation, ceil_mode, True)


def local_response_norm(input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75,  # noqa: A002
                        k: float = 1.0) -> Tensor:
    """Each element divided by (k + alpha * the mean of the squares of `size` neighbouring channels) ^ beta."""
    if input.ndim < 3:
        raise ValueError(f"Expected 3D or higher dimensionality input (got {input.ndim} dimensions)")
    if input.numel() == 0:
        return input
    squares = input * input
    if input.ndim == 3:
        padded = squares.unsqueeze(1).pad((0, 0, size // 2, (size - 1) // 2))
        window = padded.avg_pool2d((size, 1), stride=1).squeeze(1)
    else:
        shape = input.shape
        padded = squares.reshape(shape[0], 1, shape[1], shape[2], -1).pad((0, 0, 0, 0, size // 2, (size - 1) // 2))
        window = padded.avg_pool3d((size, 1, 1), stride=1).squeeze(1).reshape(shape)
    return input / (window * alpha + k).pow(beta)


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:  # noqa: A002
    """Zero whole channels of [N, C, D, H, W] (or [C, D, H, W]) with probability p."""
    result = input.feature_dropout(p, training, 3, "dropout3d")
    return input.assign(result) if inplace else result


def gumbel_softmax(logits: Tensor, tau: float = 1.0, hard: bool = False, eps: float = 1e-10,
                   dim: int = -1) -> Tensor:
    """A softmax of (logits + Gumbel noise) / tau; `hard` gives the one-hot of its maximum with the soft sample's
    gradient (the straight-through estimator)."""
    from ember.core.random import _gumbel

    gumbels = _gumbel(logits.shape, logits.device, logits.dtype)
    soft = ((logits + gumbels) / tau).softmax(dim)
    if not hard:
        return soft
    index = soft.argmax(dim, keepdim=True)
    positions = soft._arange_primitive(soft.shape[dim], index.dtype, soft.device)
    shape = [1] * soft.ndim
    shape[dim] = soft.shape[dim]
    one_hot = (positions.reshape(shape) == index).cast(soft.dtype)
    return one_hot - soft._detached_copy() + soft


def triplet_margin_with_distance_loss(anchor: Tensor, positive: Tensor, negative: Tensor, *,
                                      distance_function: Any = None, margin: float = 1.0, swap: bool = False,
                                      reduction: str = "mean") -> Tensor:
    """max(0, margin + d(anchor, positive) - d(anchor, negative)) for any distance function (pairwise_distance by
    default); `swap` takes the smaller of d(anchor, negative) and d(positive, negative)."""
    from ember.core.losses import _check_reduction, _reduce

    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    _check_reduction(reduction)
    if margin <= 0:
        raise ValueError(f"triplet_margin_with_distance_loss: margin must be greater than 0, got {margin}")
    if not (anchor.ndim == positive.ndim == negative.ndim):
        raise RuntimeError(f"triplet_margin_with_distance_loss: the anchor, positive and negative tensors must have "
                           f"the same number of dims, got {anchor.ndim}, {positive.ndim} and {negative.ndim}")
    distance = distance_function if distance_function is not None else (lambda x, y: x.pairwise_distance(y))
    positive_distance = distance(anchor, positive)
    negative_distance = distance(anchor, negative)
    if swap:
        negative_distance = negative_distance.minimum(distance(positive, negative))
    return _reduce((margin + positive_distance - negative_distance).clamp_min(0), reduction)


def upsample(input: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",  # noqa: A002
             align_corners: bool | None = None) -> Tensor:
    """torch's deprecated name of interpolate (it warns, as torch does)."""
    _deprecated("upsample")
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input: Tensor, size: Any = None, scale_factor: Any = None) -> Tensor:  # noqa: A002
    _deprecated("upsample_nearest")
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input: Tensor, size: Any = None, scale_factor: Any = None) -> Tensor:  # noqa: A002
    """Bilinear upsampling with align_corners=True (torch's deprecated upsample_bilinear)."""
    _deprecated("upsample_bilinear")
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


def _deprecated(name: str) -> None:
    import warnings

    warnings.warn(f"nn.functional.{name} is deprecated. Use nn.functional.interpolate instead.", UserWarning,
                  stacklevel=3)


__all__ = ["dropout3d", "gumbel_softmax", "interpolate", "local_response_norm", "lp_pool1d", "lp_pool2d", "lp_pool3d",
           "triplet_margin_with_distance_loss",
           "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices", "upsample",
           "upsample_bilinear", "upsample_nearest"]
