"""Linear layers and shape helpers: Identity, Linear, Bilinear, Flatten, Unflatten."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import ember as em
from ember.core.errors import ShapeError
from ember.core.tensor import Tensor
from ember.nn import functional as F
from ember.nn import init
from ember.nn.module import Module
from ember.nn.parameter import Parameter


def empty_parameter(shape: Sequence[int], device: Any = None, dtype: Any = None) -> Parameter:
    """A parameter of a shape whose value an init function sets next (a lazy zero constant until then)."""
    return Parameter(em.zeros(*shape, dtype=dtype, device=device))


class Identity(Module):
    """Returns its input; accepts and ignores any constructor arguments, like torch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input


class Linear(Module):
    """y = x @ weight.T + bias, weight of shape (out_features, in_features) initialized as torch does."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = empty_parameter((out_features, in_features), device, dtype)
        if bias:
            self.bias = empty_parameter((out_features,), device, dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.in_features
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Bilinear(Module):
    """y[..., k] = x1 @ weight[k] @ x2 + bias[k]."""

    def __init__(
        self,
        in1_features: int,
        in2_features: int,
        out_features: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        self.weight = empty_parameter((out_features, in1_features, in2_features), device, dtype)
        if bias:
            self.bias = empty_parameter((out_features,), device, dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.weight.shape[1])
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1: Tensor, input2: Tensor) -> Tensor:
        if input1.shape[-1] != self.in1_features or input2.shape[-1] != self.in2_features:
            raise ShapeError(
                f"Bilinear: inputs of shapes {input1.shape} and {input2.shape} need last dims "
                f"{self.in1_features} and {self.in2_features}"
            )
        # [..., 1, in1, 1] * [out, in1, in2] * [..., 1, 1, in2] summed over in1 and in2
        left = input1.unsqueeze(-2).unsqueeze(-1)
        right = input2.unsqueeze(-2).unsqueeze(-2)
        output = (left * self.weight * right).sum((-2, -1))
        return output + self.bias if self.bias is not None else output

    def extra_repr(self) -> str:
        return (
            f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    def __init__(self, dim: int, unflattened_size: Sequence[int]) -> None:
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
