"""torch.* functions that are not the function form of a Tensor method (function_forms.py makes those): fill,
constant_pad_nd, bilinear, chain_matmul, feature_alpha_dropout, max_pool1d_with_indices, adaptive_max_pool1d (which
returns indices too), is_storage, and `dtype`, the class of ember's dtypes (Size and device: core/torch_types.py)."""

from __future__ import annotations

import warnings
from typing import Any

from ember.core.dtype import DType
from ember.core.errors import ShapeError
from ember.core.tensor import Tensor
from ember.core.torch_types import Size, device  # noqa: F401 - torch.Size and torch.device, exported by ember

dtype = DType  # torch.dtype: isinstance(x.dtype, ember.dtype)


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
