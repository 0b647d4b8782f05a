"""nn.functional's embedding_bag (sums, means or maxima of bags of embeddings) and max_unpool1d/2d/3d (the inverse of
max pooling: each value written back at its index), as compositions of one-hot selects."""

from __future__ import annotations

from typing import Any

from ember.core import dtype as dtypes
from ember.core.convolution import IntOrInts
from ember.core.elementwise import where
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.tensor import Tensor

EMBEDDING_BAG_MODES = ("sum", "mean", "max")


def _max_unpool(input: Tensor, indices: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None,  # noqa: A002
                padding: IntOrInts, output_size: Any, spatial: int, op: str) -> Tensor:
    def ints(value: Any) -> tuple[int, ...]:
        return (value,) * spatial if isinstance(value, int) else tuple(value)

    if input.ndim not in (spatial + 1, spatial + 2):
        raise ShapeError(f"{op}: expected a {spatial + 1}-d or {spatial + 2}-d input, got shape {list(input.shape)}")
    if indices.shape != input.shape or not indices.dtype.is_int:
        raise ShapeError(f"{op}: expected integer indices of the input's shape {list(input.shape)}, got "
                         f"{indices.dtype.name} of shape {list(indices.shape)}")
    kernel = ints(kernel_size)
    strides = kernel if stride is None else ints(stride)
    pads = ints(padding)
    sizes = input.shape[-spatial:]
    if output_size is None:
        outputs = tuple((size - 1) * step - 2 * pad + length
                        for size, step, pad, length in zip(sizes, strides, pads, kernel))
    else:
        outputs = tuple(output_size)[-spatial:]
        if len(outputs) != spatial:
            raise ArgumentError(f"{op}: output_size must have {spatial} spatial sizes, got {output_size}")
    lead = input.shape[:-spatial]
    count = 1
    for size in outputs:
        count *= size
    values = input.reshape(*lead, -1)
    flat = indices.cast(dtypes.int64).reshape(*lead, -1)
    zeros = input._full((*lead, count), 0, input.dtype, input.device)
    return zeros.scatter(values.ndim - 1, flat, values).reshape(*lead, *outputs)


def max_unpool1d(input: Tensor, indices: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
                 padding: IntOrInts = 0, output_size: Any = None) -> Tensor:
    return _max_unpool(input, indices, kernel_size, stride, padding, output_size, 1, "max_unpool1d")


def max_unpool2d(input: Tensor, indices: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
                 padding: IntOrInts = 0, output_size: Any = None) -> Tensor:
    return _max_unpool(input, indices, kernel_size, stride, padding, output_size, 2, "max_unpool2d")


def max_unpool3d(input: Tensor, indices: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
                 padding: IntOrInts = 0, output_size: Any = None) -> Tensor:
    return _max_unpool(input, indices, kernel_size, stride, padding, output_size, 3, "max_unpool3d")


def embedding_bag(input: Tensor, weight: Tensor, offsets: Tensor | None = None,  # noqa: A002
                  max_norm: float | None = None, norm_type: float = 2, scale_grad_by_freq: bool = False,
                  mode: str = "mean", sparse: bool = False, per_sample_weights: Tensor | None = None,
                  include_last_offset: bool = False, padding_idx: int | None = None) -> Tensor:
    """Reduce bags of rows of weight: input [B, N] holds B bags of N indices, or a 1-d input is cut into bags at
    `offsets`; an empty bag gives zeros, padding_idx entries are left out (and not counted by 'mean')."""
    if mode not in EMBEDDING_BAG_MODES:
        raise ArgumentError(f"embedding_bag: mode has to be one of sum, mean or max, got {mode!r}")
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise NotImplementedError("embedding_bag: max_norm, scale_grad_by_freq and sparse are not supported")
    if not input.dtype.is_int:
        raise DTypeError(f"embedding_bag: expected integer indices, got {input.dtype.name}")
    if per_sample_weights is not None:
        if mode != "sum":
            raise NotImplementedError(f"embedding_bag: per_sample_weights was not None; per_sample_weights is only "
                                      f"supported for mode='sum' (got mode='{mode}')")
        if per_sample_weights.shape != input.shape:
            raise ShapeError(f"embedding_bag: per_sample_weights of shape {list(per_sample_weights.shape)} must have "
                             f"the input's shape {list(input.shape)}")
    if input.ndim == 2:
        if offsets is not None:
            raise ValueError("if input is 2D, then offsets has to be None, as input is treated is a mini-batch of "
                             "fixed length sequences")
        bags, length = input.shape
        flat = input.reshape(-1)
        member = flat._arange_primitive(bags, dtypes.int64, flat.device).reshape(bags, 1) == (
            flat._arange_primitive(bags * length, dtypes.int64, flat.device) // max(length, 1)).reshape(1, -1)
    elif input.ndim == 1:
        if offsets is None or offsets.ndim != 1:
            raise ValueError("offsets has to be a 1D Tensor but got None" if offsets is None else
                             f"offsets has to be a 1D Tensor, got shape {list(offsets.shape)}")
        flat = input
        starts = offsets.cast(dtypes.int64)
        ends = starts[1:].cat([starts._full((1,), flat.shape[0], dtypes.int64, flat.device)])
        if include_last_offset:
            starts, ends = starts[:-1], starts[1:]
        position = flat._arange_primitive(flat.shape[0], dtypes.int64, flat.device).reshape(1, -1)
        member = (position >= starts.reshape(-1, 1)).logical_and(position < ends.reshape(-1, 1))  # [B, L]
    else:
        raise ShapeError(f"embedding_bag: input has to be 1D or 2D Tensor, but got Tensor of dimension {input.ndim}")
    if padding_idx is not None:
        member = member.logical_and((flat != padding_idx).reshape(1, -1))
    rows = flat.embedding(weight)  # [L, D]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1).cast(rows.dtype)
    if mode == "max":
        chosen = where(member.unsqueeze(2), rows.unsqueeze(0), float("-inf")).amax(1)
        return where(member.any(1, keepdim=True), chosen, 0.0)
    total = where(member.unsqueeze(2), rows.unsqueeze(0), 0.0).sum(1)
    if mode == "sum":
        return total
    counts = member.sum(1, keepdim=True).cast(rows.dtype)
    return total / counts.clamp_min(1)
