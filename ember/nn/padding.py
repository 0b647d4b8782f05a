"""Padding modules: ConstantPad, ZeroPad, ReflectionPad, ReplicationPad and CircularPad in 1, 2 and 3 dims, each
F.pad with its mode and torch's argument forms (one int for every side, or a tuple of 2 per padded dim)."""

from __future__ import annotations

from typing import Any

from ember.core.tensor import Tensor
from ember.nn import functional as F
from ember.nn.module import Module


class _PadNd(Module):
    mode = "constant"
    dims = 1

    def __init__(self, padding: Any, value: float = 0.0) -> None:
        super().__init__()
        self.padding = (padding,) * (2 * self.dims) if isinstance(padding, int) else tuple(padding)
        self.value = value

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.pad(input, self.padding, self.mode, self.value if self.mode == "constant" else None)

    def extra_repr(self) -> str:
        if isinstance(self, ConstantPad1d):
            return f"padding={self.padding}, value={self.value}"
        return f"{self.padding}"


class ConstantPad1d(_PadNd):
    def __init__(self, padding: Any, value: float) -> None:
        super().__init__(padding, value)


class ConstantPad2d(ConstantPad1d):
    dims = 2


class ConstantPad3d(ConstantPad1d):
    dims = 3


class ZeroPad1d(_PadNd):
    def __init__(self, padding: Any) -> None:
        super().__init__(padding, 0.0)


class ZeroPad2d(ZeroPad1d):
    dims = 2


class ZeroPad3d(ZeroPad1d):
    dims = 3


class ReflectionPad1d(_PadNd):
    mode = "reflect"

    def __init__(self, padding: Any) -> None:
        super().__init__(padding)


class ReflectionPad2d(ReflectionPad1d):
    dims = 2


class ReflectionPad3d(ReflectionPad1d):
    dims = 3


class ReplicationPad1d(ReflectionPad1d):
    mode = "replicate"


class ReplicationPad2d(ReplicationPad1d):
    dims = 2


class ReplicationPad3d(ReplicationPad1d):
    dims = 3


class CircularPad1d(ReflectionPad1d):
    mode = "circular"


class CircularPad2d(CircularPad1d):
    dims = 2


class CircularPad3d(CircularPad1d):
    dims = 3
