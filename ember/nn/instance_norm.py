"""InstanceNorm1d/2d/3d: each channel of each sample normalized over its spatial dims (optional running stats)."""

from __future__ import annotations

from typing import Any

from ember.core.errors import ShapeError
from ember.core.tensor import Tensor
from ember.nn import functional as F
from ember.nn import init
from ember.nn.linear import empty_parameter
from ember.nn.module import Module
from ember.nn.normalization import register_running_stats


class _InstanceNorm(Module):
    """torch's _InstanceNorm: no affine parameters and no running stats unless asked for."""

    spatial = 1

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
                 track_running_stats: bool = False, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        if affine:
            self.weight = empty_parameter((num_features,), device, dtype)
            self.bias = empty_parameter((num_features,), device, dtype)
            init.ones_(self.weight)
            init.zeros_(self.bias)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        register_running_stats(self, num_features, track_running_stats, device, dtype)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        batched = self.spatial + 2
        if input.ndim not in (batched - 1, batched):
            raise ValueError(f"{type(self).__name__}: expected {batched - 1}D or {batched}D input (got "
                             f"{input.ndim}D input)")
        unbatched = input.ndim == batched - 1
        source = input.unsqueeze(0) if unbatched else input
        if source.shape[1] != self.num_features and self.affine:
            raise ShapeError(f"{type(self).__name__}({self.num_features}): expected input's size at dim "
                             f"{1 - unbatched} to match num_features ({self.num_features}), but got input of shape "
                             f"{list(input.shape)}")
        use_input_stats = self.training or not self.track_running_stats
        result = F.instance_norm(source, self.running_mean, self.running_var, self.weight, self.bias,
                                 use_input_stats, self.momentum if self.momentum is not None else 0.0, self.eps)
        return result.squeeze(0) if unbatched else result

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class InstanceNorm1d(_InstanceNorm):
    spatial = 1


class InstanceNorm2d(_InstanceNorm):
    spatial = 2


class InstanceNorm3d(_InstanceNorm):
    spatial = 3
