"""torch.* functions that are not the function form of a Tensor method (function_forms.py makes those): fill,
constant_pad_nd, bilinear, chain_matmul, feature_alpha_dropout, max_pool1d_with_indices, adaptive_max_pool1d (which
returns indices too), is_storage, and `dtype`, the class of ember's dtypes."""

from __future__ import annotations

import warnings
from typing import Any

from ember.core.dtype import DType
from ember.core.errors import DeviceError, ShapeError
from ember.core.tensor import Tensor

dtype = DType  # torch.dtype: isinstance(x.dtype, ember.dtype)


class device(str):  # noqa: N801 - torch's name
    """torch.device: a device name ('cuda', 'cuda:1', 'cpu', 'opencl:0'), so it goes wherever ember takes a
    device; `.type` is the backend and `.index` the number (None if not given). 'cpu' is ember's c device."""

    def __new__(cls, type_or_name: Any, index: int | None = None) -> device:
        text = str(type_or_name)
        if index is not None:
            if ":" in text:
                raise DeviceError(f"device: type {text!r} already names an index; give ember.device('cuda', 1) or "
                                  f"ember.device('cuda:1')")
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise DeviceError(f"device: the index must be a non-negative int, got {index!r}")
            text = f"{text}:{index}"
        kind, colon, number = text.partition(":")
        if not kind.isidentifier() or (colon and not number.isdigit()):
            raise DeviceError(f"Invalid device string: {text!r} (expected a backend name with an optional ':index', "
                              f"e.g. 'cuda', 'cuda:1', 'cpu', 'opencl:0')")
        return super().__new__(cls, text)

    @property
    def type(self) -> str:
        return self.partition(":")[0]

    @property  # torch.device.index, the device number (str.index is not used on a device name)
    def index(self) -> int | None:  # type: ignore[override]
        number = self.partition(":")[2]
        return int(number) if number else None

    def __repr__(self) -> str:
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"


def fill(input: Tensor, value: Any) -> Tensor:  # noqa: A002 - torch's names
    """A tensor of input's shape, dtype and device filled with value (out of place, torch.fill)."""
    from ember.core.creation import full_like

    if hasattr(value, "_apply"):
        if value.ndim != 0:
            raise ShapeError(f"fill only supports 0-dimension value tensor but got tensor with {value.ndim} "
                             f"dimensions")
        return value.cast(input.dtype).expand(input.shape)
    return full_like(input, value)


def constant_pad_nd(input: Tensor, pad: Any, value: float = 0) -> Tensor:  # noqa: A002
    """F.pad in mode 'constant' (torch.constant_pad_nd)."""
    return input.pad(pad, "constant", value)


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    from ember.nn.functional import bilinear as functional_bilinear

    return functional_bilinear(input1, input2, weight, bias)


def chain_matmul(*matrices: Tensor) -> Tensor:
    """The product of the matrices (deprecated in torch, which warns: use ember.linalg.multi_dot)."""
    warnings.warn("torch.chain_matmul is deprecated and will be removed in a future PyTorch release. Use "
                  "torch.linalg.multi_dot instead, which accepts a list of two or more tensors rather than multiple "
                  "parameters.", UserWarning, stacklevel=2)
    if len(matrices) == 1:
        return matrices[0].clone()
    from ember.linalg import multi_dot

    return multi_dot(list(matrices))


def feature_alpha_dropout(input: Tensor, p: float, train: bool) -> Tensor:  # noqa: A002
    return input.alpha_dropout(p, train, feature=True)


def max_pool1d_with_indices(input: Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0,  # noqa: A002
                            dilation: Any = 1, ceil_mode: bool = False) -> tuple[Tensor, Tensor]:
    return input.max_pool1d(kernel_size, stride or None, padding, dilation, ceil_mode, True)


def adaptive_max_pool1d(input: Tensor, output_size: Any) -> tuple[Tensor, Tensor]:  # noqa: A002
    """torch.adaptive_max_pool1d: (values, indices), unlike nn.functional's, which returns the values alone."""
    return input.adaptive_max_pool1d(output_size, True)


def is_storage(obj: Any) -> bool:
    """False: ember has no storage objects (a tensor's values are not shared memory)."""
    return False
