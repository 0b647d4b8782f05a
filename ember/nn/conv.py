"""Convolution layers: Conv1d and Conv2d with torch's arguments, padding modes and default initialization."""

from __future__ import annotations

import math
from typing import Any

from ember.core.tensor import Tensor
from ember.nn import functional as F
from ember.nn import init
from ember.nn.linear import empty_parameter
from ember.nn.module import Module

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _tuple(value: Any, count: int, name: str) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * count
    result = tuple(int(item) for item in value)
    if len(result) != count:
        raise ValueError(f"{name} must be an int or a tuple of {count} ints, got {value}")
    return result


class _ConvNd(Module):
    """Shared by Conv1d and Conv2d: weight (out, in / groups, *kernel), optional bias, padding modes."""

    dims = 0

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if groups <= 0:
            raise ValueError(f"{name}: groups must be a positive integer, got {groups}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"{name}: in_channels ({in_channels}) and out_channels ({out_channels}) must both be "
                f"divisible by groups ({groups})"
            )
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"{name}: padding_mode must be one of {PADDING_MODES}, got {padding_mode!r}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _tuple(kernel_size, self.dims, "kernel_size")
        self.stride = _tuple(stride, self.dims, "stride")
        self.dilation = _tuple(dilation, self.dims, "dilation")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"{name}: padding must be 'same', 'valid', an int or a tuple, got {padding!r}")
            if padding == "same" and any(step != 1 for step in self.stride):
                raise ValueError(f"{name}: padding='same' is not supported for strided convolutions")
            self.padding: Any = padding
        else:
            self.padding = _tuple(padding, self.dims, "padding")
        self.padding_mode = padding_mode
        self.output_padding = (0,) * self.dims
        self.transposed = False
        self._reversed_padding_repeated_twice = self._padding_amounts()
        self.weight = empty_parameter((out_channels, in_channels // groups, *self.kernel_size), device, dtype)
        if bias:
            self.bias = empty_parameter((out_channels,), device, dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def _padding_amounts(self) -> list[int]:
        """F.pad amounts (last dim first) that realize self.padding, for the non-zero padding modes."""
        amounts: list[int] = []
        for dim in reversed(range(self.dims)):
            if self.padding == "valid":
                before = after = 0
            elif self.padding == "same":
                total = self.dilation[dim] * (self.kernel_size[dim] - 1)
                before = total // 2
                after = total - before
            else:
                before = after = self.padding[dim]
            amounts += [before, after]
        return amounts

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def _convolve(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # noqa: A002
        convolution = F.conv1d if self.dims == 1 else F.conv2d
        if self.padding_mode != "zeros":
            padded = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return convolution(padded, weight, bias, self.stride, 0, self.dilation, self.groups)
        return convolution(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return self._convolve(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if isinstance(self.padding, str) or self.padding != (0,) * self.dims:
            text += f", padding={self.padding}"
        if self.dilation != (1,) * self.dims:
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        if self.padding_mode != "zeros":
            text += f", padding_mode={self.padding_mode}"
        return text


class Conv1d(_ConvNd):
    """1-d convolution over (N, C, L) or unbatched (C, L) inputs."""

    dims = 1


class Conv2d(_ConvNd):
    """2-d convolution over (N, C, H, W) or unbatched (C, H, W) inputs."""

    dims = 2
