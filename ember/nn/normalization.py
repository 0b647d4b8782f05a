"""Normalization layers: BatchNorm1d/2d/3d (running statistics), LayerNorm, RMSNorm, GroupNorm, LocalResponseNorm."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import ember as em
from ember.autograd.grad_mode import no_grad
from ember.core.errors import ShapeError
from ember.core.graph_templates import TEMPLATES
from ember.core.state_updates import note_state_update
from ember.core.tensor import Tensor
from ember.nn import functional as F
from ember.nn import init
from ember.nn.linear import empty_parameter
from ember.nn.module import Module


def register_running_stats(module: Module, num_features: int, track: bool, device: Any, dtype: Any) -> None:
    """torch's running-statistics buffers of a batch or instance norm: running_mean (zeros), running_var (ones) and
    num_batches_tracked, or the three registered as None when statistics are not tracked."""
    if track:
        module.register_buffer("running_mean", em.zeros(num_features, dtype=dtype, device=device))
        module.register_buffer("running_var", em.ones(num_features, dtype=dtype, device=device))
        module.register_buffer("num_batches_tracked", em.tensor(0, dtype=em.int64, device=device))
    else:
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            module.register_buffer(name, None)


def _running_statistics(count: Tensor, running_mean: Tensor, running_var: Tensor, mean: Tensor, variance: Tensor,
                        momentum: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The batches counted, and the running mean and variance moved toward the batch's `mean` and `variance` by
    `momentum` (None: the cumulative average, a factor of 1 / batches counted), as torch updates them."""
    count = count + 1
    factor: Any = 1.0 / count.cast(running_mean.dtype) if momentum is None else momentum
    return (count, running_mean * (1 - factor) + mean.cast(running_mean.dtype) * factor,
            running_var * (1 - factor) + variance.cast(running_var.dtype) * factor)


class _BatchNorm(Module):
    """Normalizes each channel (dim 1) over the batch and spatial dims; keeps running mean and variance."""

    spatial_dims: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats, self.use_bias = affine, track_running_stats, bias
        if affine:
            self.weight = empty_parameter((num_features,), device, dtype)
            if bias:
                self.bias = empty_parameter((num_features,), device, dtype)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        register_running_stats(self, num_features, track_running_stats, device, dtype)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            init.zeros_(self.running_mean)
            init.ones_(self.running_var)
            init.zeros_(self.num_batches_tracked)

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def _check_input(self, input: Tensor) -> None:  # noqa: A002
        raise NotImplementedError

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        self._check_input(input)
        if input.shape[1] != self.num_features:
            raise ShapeError(
                f"{type(self).__name__}({self.num_features}): input of shape {input.shape} has "
                f"{input.shape[1]} channels in dim 1, expected {self.num_features}"
            )
        use_batch_statistics = self.training or self.running_mean is None
        if not use_batch_statistics:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                self.eps)
        count = input.numel() // input.shape[1]
        if count <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.shape}")
        result, mean, variance = input._batch_norm_training(self.weight, self.bias, self.eps)
        if self.training and self.track_running_stats:
            self._update_running_stats(mean, variance * (count / (count - 1)))
        return result

    def _update_running_stats(self, mean: Tensor, variance: Tensor) -> None:
        """running = (1 - momentum) * running + momentum * batch statistic (the batch's mean and unbiased variance,
        the ones the forward normalizes with), lazily."""
        buffers = [self.running_mean, self.running_var, self.num_batches_tracked]
        waiting = [buffer for buffer in buffers if not buffer.node.realized]
        if waiting:  # the previous step's update was never computed: do it now, so updates never chain
            em.realize(*waiting)
        with no_grad():  # (one template's copy: a ResNet step updates the statistics of every BatchNorm layer)
            count, running_mean, running_var = TEMPLATES.instantiate_many(
                ("batch norm running statistics", self.momentum),
                functools.partial(_running_statistics, momentum=self.momentum),
                (self.num_batches_tracked, self.running_mean, self.running_var, mean, variance))
            self.num_batches_tracked.assign(count)
            self.running_mean.assign(running_mean)
            self.running_var.assign(running_var)
        for buffer in buffers:
            note_state_update(buffer)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"bias={self.use_bias}, track_running_stats={self.track_running_stats}"
        )


class BatchNorm1d(_BatchNorm):
    """Batch normalization over (N, C) or (N, C, L) inputs."""

    def _check_input(self, input: Tensor) -> None:  # noqa: A002
        if input.ndim not in (2, 3):
            raise ShapeError(f"BatchNorm1d: expected a 2-d or 3-d input (N, C) or (N, C, L), got shape {input.shape}")


class BatchNorm2d(_BatchNorm):
    """Batch normalization over (N, C, H, W) inputs."""

    def _check_input(self, input: Tensor) -> None:  # noqa: A002
        if input.ndim != 4:
            raise ShapeError(f"BatchNorm2d: expected a 4-d input (N, C, H, W), got shape {input.shape}")


class BatchNorm3d(_BatchNorm):
    """Batch normalization over (N, C, D, H, W) inputs."""

    def _check_input(self, input: Tensor) -> None:  # noqa: A002
        if input.ndim != 5:
            raise ShapeError(f"BatchNorm3d: expected a 5-d input (N, C, D, H, W), got shape {input.shape}")


def _shape_tuple(shape: int | Sequence[int]) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(int(size) for size in shape)


class LayerNorm(Module):
    """Normalizes over the last len(normalized_shape) dims, then scales and shifts elementwise."""

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        if elementwise_affine:
            self.weight = empty_parameter(self.normalized_shape, device, dtype)
            if bias:
                self.bias = empty_parameter(self.normalized_shape, device, dtype)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}"
        )


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) over the last dims, times a weight; eps=None uses the dtype's machine epsilon."""

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        if elementwise_affine:
            self.weight = empty_parameter(self.normalized_shape, device, dtype)
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
    """Normalizes groups of channels of (N, C, *) inputs, then scales and shifts per channel."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        if affine:
            self.weight = empty_parameter((num_channels,), device, dtype)
            if bias:
                self.bias = empty_parameter((num_channels,), device, dtype)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
            f"bias={self.bias is not None}"
        )


class LocalResponseNorm(Module):
    """Each element divided by (k + alpha * the mean square of `size` neighbouring channels) ^ beta."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> None:
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.local_response_norm(input, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"
