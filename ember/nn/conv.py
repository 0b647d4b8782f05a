"""Convolution layers: Conv1d/2d/3d and ConvTranspose1d/2d/3d with torch's arguments, padding modes, parameter
shapes and default initialization (state dicts load both ways)."""

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
    """Shared by the convolutions: weight (out, in / groups, *kernel), or (in, out / groups, *kernel) when transposed,
    an optional bias, padding modes."""

    dims = 0
    transposed = False

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
        output_padding: Any = 0,
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
        if self.transposed and padding_mode != "zeros":
            raise ValueError(f'{name}: only "zeros" padding mode is supported, got {padding_mode!r}')
        if self.transposed and isinstance(padding, str):
            raise ValueError(f"{name}: padding must be an int or a tuple of ints (not {padding!r})")
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
        self.output_padding = _tuple(output_padding, self.dims, "output_padding")
        self._reversed_padding_repeated_twice = self._padding_amounts()
        if self.transposed:
            shape = (in_channels, out_channels // groups, *self.kernel_size)
        else:
            shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.weight = empty_parameter(shape, device, dtype)
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
        convolution = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[self.dims]
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
        if self.output_padding != (0,) * self.dims:
            text += f", output_padding={self.output_padding}"
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


class Conv3d(_ConvNd):
    """3-d convolution over (N, C, D, H, W) or unbatched (C, D, H, W) inputs."""

    dims = 3


class _ConvTransposeNd(_ConvNd):
    """Shared by the transposed convolutions (torch's argument order: output_padding and groups before bias,
    dilation after it)."""

    transposed = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: Any = 1,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
                         device, dtype, output_padding)

    def _output_padding(self, input: Tensor, output_size: Any) -> tuple[int, ...]:  # noqa: A002
        """self.output_padding, or the one that gives output_size (torch's rule: between the smallest output and
        stride - 1 more)."""
        if output_size is None:
            return self.output_padding
        requested = tuple(int(size) for size in output_size)
        leading = input.ndim - self.dims
        if len(requested) == leading + self.dims:
            requested = requested[leading:]
        if len(requested) != self.dims:
            raise ValueError(f"{type(self).__name__}: output_size must have {self.dims} or {leading + self.dims} "
                             f"elements (got {len(requested)})")
        smallest = [(input.shape[leading + d] - 1) * self.stride[d] - 2 * self.padding[d]
                    + self.dilation[d] * (self.kernel_size[d] - 1) + 1 for d in range(self.dims)]
        largest = [size + self.stride[d] - 1 for d, size in enumerate(smallest)]
        for size, low, high in zip(requested, smallest, largest):
            if not low <= size <= high:
                raise ValueError(f"{type(self).__name__}: requested an output size of {list(requested)}, but valid "
                                 f"sizes range from {smallest} to {largest} (for an input of "
                                 f"{list(input.shape[leading:])})")
        return tuple(size - low for size, low in zip(requested, smallest))

    def forward(self, input: Tensor, output_size: Any = None) -> Tensor:  # noqa: A002
        convolution = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[self.dims]
        return convolution(input, self.weight, self.bias, self.stride, self.padding,
                           self._output_padding(input, output_size), self.groups, self.dilation)


class ConvTranspose1d(_ConvTransposeNd):
    """Transposed 1-d convolution over (N, C, L) or (C, L); weight (in_channels, out_channels / groups, k)."""

    dims = 1


class ConvTranspose2d(_ConvTransposeNd):
    """Transposed 2-d convolution over (N, C, H, W) or (C, H, W); weight (in, out / groups, kh, kw)."""

    dims = 2


class ConvTranspose3d(_ConvTransposeNd):
    """Transposed 3-d convolution over (N, C, D, H, W) or (C, D, H, W)."""

    dims = 3
