"""Convolution and pooling Tensor methods: argument checks and torch's output sizes; the reduces over window views
and their backward are in convolution_forms.py."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ember.core import dtype as dtypes
from ember.core.convolution_forms import (
    ConvolutionGeometry,
    PoolGeometry,
    chosen_offset,
    convolve,
    max_pool,
    pool_windows,
    windows,
)
from ember.core.dtype import min_value
from ember.core.elementwise import where
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.graph_templates import traced_call
from ember.core.read_alike import read_alike
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

IntOrInts = int | Sequence[int]


def _ints(value: IntOrInts, count: int, name: str, op: str) -> tuple[int, ...]:
    """An int or a sequence of 1 or `count` ints as `count` ints (torch's _pair/_single arguments)."""
    values = (int(value),) if isinstance(value, int) else tuple(int(item) for item in value)
    if len(values) == 1:
        values = values * count
    if len(values) != count:
        raise ArgumentError(
            f"{op}: expected {name} to be a single int or a list of {count} ints to match the {count} spatial dims, "
            f"but got {name}={list(values)}"
        )
    return values


def _spatial_input(tensor: Tensor, spatial: int, op: str) -> tuple[Tensor, bool]:
    """The input as [N, C, *spatial], and whether it was unbatched [C, *spatial]."""
    if tensor.ndim not in (spatial + 1, spatial + 2):
        raise ShapeError(
            f"{op}: expected {spatial + 1}-d (unbatched) or {spatial + 2}-d (batched) input, but got input of shape "
            f"{list(tensor.shape)}"
        )
    return (tensor.unsqueeze(0), True) if tensor.ndim == spatial + 1 else (tensor, False)


def _check_positive(values: tuple[int, ...], name: str, op: str) -> None:
    if any(value <= 0 for value in values):
        raise ArgumentError(f"{op}: non-positive {name} is not supported, got {name}={list(values)}")


def _pool_geometry(
    sizes: tuple[int, ...], kernel: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
    dilation: tuple[int, ...], ceil_mode: bool, op: str,
) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """Output sizes and (before, after) padding of each spatial axis, with torch's ceil_mode rule."""
    outputs, pads = [], []
    for size, k, s, p, d in zip(sizes, kernel, stride, padding, dilation):
        span = d * (k - 1) + 1
        if p < 0:
            raise ArgumentError(f"{op}: negative padding is not supported, got padding={list(padding)}")
        if 2 * p > span:
            raise ArgumentError(
                f"{op}: pad should be at most half of effective kernel size, but got pad={p}, kernel_size={k} and "
                f"dilation={d}"
            )
        numerator = size + 2 * p - span
        output = (numerator + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (output - 1) * s >= size + p:
            output -= 1
        if output < 1 or numerator < 0:
            raise ShapeError(
                f"{op}: given input spatial size {list(sizes)} (padding {list(padding)}), the calculated output size "
                f"is {output} for kernel {list(kernel)}: output size is too small"
            )
        outputs.append(output)
        pads.append((p, (output - 1) * s + span - size - p))
    return tuple(outputs), pads


class ConvolutionOps(TensorBase):
    """Mixin: conv1d/conv2d/conv3d, max and average pooling (plain and adaptive)."""

    __slots__ = ()

    def _convolution(
        self, weight: Tensor, bias: Tensor | None, stride: IntOrInts, padding: IntOrInts | str,
        dilation: IntOrInts, groups: int, spatial: int, op: str,
    ) -> Tensor:
        source, unbatched = _spatial_input(cast("Tensor", self), spatial, op)
        if weight.ndim != spatial + 2:
            raise ShapeError(
                f"{op}: expected {spatial + 2}-d weight [out_channels, in_channels / groups, *kernel], but got weight "
                f"of shape {list(weight.shape)}"
            )
        if source.dtype != weight.dtype or (bias is not None and bias.dtype != source.dtype):
            names = [source.dtype.name, weight.dtype.name] + ([bias.dtype.name] if bias is not None else [])
            raise DTypeError(f"{op}: input, weight and bias must have one dtype, got {', '.join(names)}")
        if source.dtype.is_bool:
            raise DTypeError(f"{op}: not supported for bool tensors")
        strides = _ints(stride, spatial, "stride", op)
        dilations = _ints(dilation, spatial, "dilation", op)
        _check_positive(strides, "stride", op)
        _check_positive(dilations, "dilation", op)
        batch, channels = source.shape[:2]
        out_channels, group_channels = weight.shape[:2]
        kernel = weight.shape[2:]
        if groups <= 0:
            raise ArgumentError(f"{op}: non-positive groups is not supported, got groups={groups}")
        if out_channels % groups != 0:
            raise ShapeError(
                f"{op}: given groups={groups}, expected weight to be divisible by {groups} at dim 0, but got weight "
                f"of shape {list(weight.shape)}"
            )
        if channels != group_channels * groups:
            raise ShapeError(
                f"{op}: given groups={groups}, weight of shape {list(weight.shape)}, expected input of shape "
                f"{list(self.shape)} to have {group_channels * groups} channels, but got {channels} channels instead"
            )
        if bias is not None and bias.shape != (out_channels,):
            raise ShapeError(
                f"{op}: given weight of shape {list(weight.shape)}, expected bias to be 1-d with {out_channels} "
                f"elements, but got bias of shape {list(bias.shape)}"
            )
        if isinstance(padding, str):
            if padding == "valid":
                pads = [(0, 0)] * spatial
            elif padding == "same":
                if any(value != 1 for value in strides):
                    raise ArgumentError(f"{op}: padding='same' is not supported for strided convolutions")
                totals = [d * (k - 1) for k, d in zip(kernel, dilations)]
                pads = [(total // 2, total - total // 2) for total in totals]
            else:
                raise ArgumentError(f"{op}: invalid padding string {padding!r}, should be one of 'valid', 'same'")
        else:
            amounts = _ints(padding, spatial, "padding", op)
            if any(value < 0 for value in amounts):
                raise ArgumentError(f"{op}: negative padding is not supported, got padding={list(amounts)}")
            pads = [(value, value) for value in amounts]
        sizes = source.shape[2:]
        padded_sizes = tuple(size + before + after for size, (before, after) in zip(sizes, pads))
        spans = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilations))
        if any(padded < span for padded, span in zip(padded_sizes, spans)):
            raise ShapeError(
                f"{op}: calculated padded input size per channel: {list(padded_sizes)}; (dilated) kernel size: "
                f"{list(spans)}; the kernel size can't be greater than the actual input size (input "
                f"{list(self.shape)}, weight {list(weight.shape)})"
            )
        geometry = ConvolutionGeometry(strides, tuple(pads), dilations, groups, tuple(sizes))
        result = convolve(source, weight, geometry)
        if bias is not None:
            result = result + bias._reshaped((out_channels,) + (1,) * spatial)
        return result.squeeze(0) if unbatched else result

    def conv1d(self, weight: Tensor, bias: Tensor | None = None, stride: IntOrInts = 1,
               padding: IntOrInts | str = 0, dilation: IntOrInts = 1, groups: int = 1) -> Tensor:
        """torch.nn.functional.conv1d over [N, C, L] (or unbatched [C, L]): a reduce over window views."""
        return self._convolution(weight, bias, stride, padding, dilation, groups, 1, "conv1d")

    def conv2d(self, weight: Tensor, bias: Tensor | None = None, stride: IntOrInts = 1,
               padding: IntOrInts | str = 0, dilation: IntOrInts = 1, groups: int = 1) -> Tensor:
        """torch.nn.functional.conv2d over [N, C, H, W] (or unbatched [C, H, W]): a reduce over window views."""
        return self._convolution(weight, bias, stride, padding, dilation, groups, 2, "conv2d")

    def conv3d(self, weight: Tensor, bias: Tensor | None = None, stride: IntOrInts = 1,
               padding: IntOrInts | str = 0, dilation: IntOrInts = 1, groups: int = 1) -> Tensor:
        """torch.nn.functional.conv3d over [N, C, D, H, W] (or unbatched): a reduce over window views."""
        return self._convolution(weight, bias, stride, padding, dilation, groups, 3, "conv3d")

    # ---- pooling ----------------------------------------------------------------------------------------------

    def _max_pool(self, kernel_size: IntOrInts, stride: IntOrInts | None, padding: IntOrInts,
                  dilation: IntOrInts, ceil_mode: bool, return_indices: bool, spatial: int, op: str) -> Any:
        source, unbatched = _spatial_input(cast("Tensor", self), spatial, op)
        if source.dtype.is_bool:
            raise DTypeError(f"{op}: not supported for bool tensors")
        kernel = _ints(kernel_size, spatial, "kernel_size", op)
        strides = kernel if stride is None or stride == [] or stride == () else _ints(stride, spatial, "stride", op)
        dilations = _ints(dilation, spatial, "dilation", op)
        for numbers, name in ((kernel, "kernel_size"), (strides, "stride"), (dilations, "dilation")):
            _check_positive(numbers, name, op)
        pads = _ints(padding, spatial, "padding", op)
        sizes = source.shape[2:]
        outputs, amounts = _pool_geometry(sizes, kernel, strides, pads, dilations, ceil_mode, op)
        geometry = PoolGeometry(kernel, strides, dilations, outputs, tuple(amounts))
        if return_indices:  # (the values and their positions from one stored copy of a lazy input: read_alike.py)
            source = read_alike(source)
        values = max_pool(source, geometry)
        if return_indices:
            patches = pool_windows(source, geometry)  # [N, C, *outputs, *kernel]
            flat = patches.reshape(patches.shape[:2 + spatial] + (math.prod(kernel),))
            chosen = chosen_offset(flat) == source._arange_primitive(flat.shape[-1], dtypes.int64, source.device)
        if not return_indices:
            return values.squeeze(0) if unbatched else values
        indices = _max_indices(source, chosen, kernel, strides, dilations, outputs, amounts)
        return (values.squeeze(0), indices.squeeze(0)) if unbatched else (values, indices)

    def max_pool1d(self, kernel_size: IntOrInts, stride: IntOrInts | None = None, padding: IntOrInts = 0,
                   dilation: IntOrInts = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
        return self._max_pool(kernel_size, stride, padding, dilation, ceil_mode, return_indices, 1, "max_pool1d")

    def max_pool2d(self, kernel_size: IntOrInts, stride: IntOrInts | None = None, padding: IntOrInts = 0,
                   dilation: IntOrInts = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
        """torch.nn.functional.max_pool2d (padding counts as -inf); with return_indices also (values, indices)."""
        return self._max_pool(kernel_size, stride, padding, dilation, ceil_mode, return_indices, 2, "max_pool2d")

    def max_pool3d(self, kernel_size: IntOrInts, stride: IntOrInts | None = None, padding: IntOrInts = 0,
                   dilation: IntOrInts = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
        return self._max_pool(kernel_size, stride, padding, dilation, ceil_mode, return_indices, 3, "max_pool3d")

    def _avg_pool(self, kernel_size: IntOrInts, stride: IntOrInts | None, padding: IntOrInts,
                  ceil_mode: bool, count_include_pad: bool, divisor_override: int | None, spatial: int,
                  op: str) -> Tensor:
        source, unbatched = _spatial_input(cast("Tensor", self), spatial, op)
        if source.dtype.is_bool:
            raise DTypeError(f"{op}: not supported for bool tensors")
        kernel = _ints(kernel_size, spatial, "kernel_size", op)
        strides = kernel if stride is None or stride == [] or stride == () else _ints(stride, spatial, "stride", op)
        _check_positive(kernel, "kernel_size", op)
        _check_positive(strides, "stride", op)
        if divisor_override is not None and divisor_override == 0:
            raise ArgumentError(f"{op}: divisor must be not zero")
        pads = _ints(padding, spatial, "padding", op)
        ones = (1,) * spatial
        sizes = source.shape[2:]
        outputs, amounts = _pool_geometry(sizes, kernel, strides, pads, ones, ceil_mode, op)
        # one traced step whose graph is copied from a template from the second call of a shape on (the windows, the
        # sum and torch's divisors: ~30 primitives, 157 us a call op by op)
        compute = functools.partial(_average_pooled, kernel=kernel, strides=strides, pads=pads, outputs=outputs,
                                    amounts=tuple(amounts), count_include_pad=count_include_pad,
                                    divisor_override=divisor_override)
        result = traced_call(compute, (source,))
        return result.squeeze(0) if unbatched else result

    def avg_pool1d(self, kernel_size: IntOrInts, stride: IntOrInts | None = None, padding: IntOrInts = 0,
                   ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
        return self._avg_pool(kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1, "avg_pool1d")

    def avg_pool2d(self, kernel_size: IntOrInts, stride: IntOrInts | None = None, padding: IntOrInts = 0,
                   ceil_mode: bool = False, count_include_pad: bool = True,
                   divisor_override: int | None = None) -> Tensor:
        """torch.nn.functional.avg_pool2d with torch's divisor rules (count_include_pad, ceil_mode, override)."""
        return self._avg_pool(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2,
                              "avg_pool2d")

    def avg_pool3d(self, kernel_size: IntOrInts, stride: IntOrInts | None = None, padding: IntOrInts = 0,
                   ceil_mode: bool = False, count_include_pad: bool = True,
                   divisor_override: int | None = None) -> Tensor:
        return self._avg_pool(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3,
                              "avg_pool3d")

    def _adaptive_pool(self, output_size: IntOrInts | None, spatial: int, maximum: bool, op: str,
                       return_indices: bool = False) -> Any:
        """Output cell i of an axis of length L covers [floor(i*L/o), ceil((i+1)*L/o)): a masked reduce (one kernel);
        an average over cells of one size (o divides every L) is a mean over the axes split into cells."""
        source, unbatched = _spatial_input(cast("Tensor", self), spatial, op)
        if not maximum and not source.dtype.is_float:
            raise DTypeError(f"{op}: expected a floating point input, got {source.dtype.name}")
        sizes = source.shape[2:]
        requested = (output_size,) * spatial if isinstance(output_size, int) or output_size is None else tuple(
            output_size
        )
        if len(requested) != spatial:
            raise ArgumentError(f"{op}: output_size must be an int or {spatial} ints, got {output_size}")
        outputs = tuple(size if wanted is None else int(wanted) for size, wanted in zip(sizes, requested))
        if any(size == 0 for size in sizes) or any(count <= 0 for count in outputs):
            raise ShapeError(f"{op}: expected non-empty spatial dims and positive output_size, got input "
                             f"{list(self.shape)} and output_size {list(outputs)}")
        if not maximum and all(size % count == 0 for size, count in zip(sizes, outputs)):
            # equal disjoint cells (global average pooling among them): each axis split as (count, cell), a plain
            # mean over the cells' axes, no mask (the masked reduce read every position once per output cell)
            split = source.reshape(source.shape[:2] + tuple(
                item for size, count in zip(sizes, outputs) for item in (count, size // count)))
            cell_axes = tuple(3 + 2 * axis for axis in range(spatial))
            cell_count = math.prod(size // count for size, count in zip(sizes, outputs))
            result = split.sum(cell_axes, dtype=source.dtype) / cell_count
            return result.squeeze(0) if unbatched else result
        mask, cells = None, None
        for axis, (size, count) in enumerate(zip(sizes, outputs)):
            cell = self._arange_primitive(count, dtypes.int64, self.device).reshape(count, 1)
            position = self._arange_primitive(size, dtypes.int64, self.device).reshape(1, size)
            start = (cell * size) // count
            end = ((cell + 1) * size + count - 1) // count
            inside = (position >= start).logical_and(position < end)  # [o, L]
            shape = [1] * (2 * spatial)
            shape[axis], shape[spatial + axis] = count, size
            inside = inside.reshape(shape)
            mask = inside if mask is None else mask.logical_and(inside)
            cell_size = (end - start).reshape([count if index == axis else 1 for index in range(spatial)])
            cells = cell_size if cells is None else cells * cell_size
        assert mask is not None and cells is not None  # spatial >= 1 axes were visited
        expanded = source.reshape(source.shape[:2] + (1,) * spatial + sizes)
        reduced_axes = tuple(range(2 + spatial, 2 + 2 * spatial))
        if maximum and (return_indices or getattr(source, "requires_grad", False)):
            # the first position of each cell's maximum (NaN counts as the maximum): the index torch returns, and
            # where the gradient goes
            count = math.prod(sizes)
            flat_shape = source.shape[:2] + tuple(outputs) + (count,)
            alike = read_alike(source).reshape(expanded.shape)  # (compared with its own maximum: read_alike.py)
            values = where(mask, alike, min_value(source.dtype)).reshape(flat_shape)
            inside = mask.reshape(tuple(outputs) + (count,))
            largest = values.amax(-1, keepdim=True)
            hit = inside.logical_and((values == largest).logical_or(values.isnan().logical_and(largest.isnan())))
            positions = source._arange_primitive(count, dtypes.int64, source.device)
            indices = where(hit, positions, count).amin(-1)
            chosen = indices.unsqueeze(-1) == positions
            result = where(chosen, values, 0).sum(-1, dtype=source.dtype)
            if return_indices:
                return (result.squeeze(0), indices.squeeze(0)) if unbatched else (result, indices)
        elif maximum:
            result = where(mask, expanded, min_value(source.dtype)).amax(reduced_axes)
        else:
            total = where(mask, expanded, 0).sum(reduced_axes, dtype=source.dtype)
            result = total / cells.cast(source.dtype)
        return result.squeeze(0) if unbatched else result

    def adaptive_avg_pool1d(self, output_size: IntOrInts) -> Tensor:
        return self._adaptive_pool(output_size, 1, False, "adaptive_avg_pool1d")

    def adaptive_avg_pool2d(self, output_size: IntOrInts) -> Tensor:
        """torch.nn.functional.adaptive_avg_pool2d (None keeps an input size)."""
        return self._adaptive_pool(output_size, 2, False, "adaptive_avg_pool2d")

    def adaptive_avg_pool3d(self, output_size: IntOrInts) -> Tensor:
        return self._adaptive_pool(output_size, 3, False, "adaptive_avg_pool3d")

    def adaptive_max_pool1d(self, output_size: IntOrInts, return_indices: bool = False) -> Any:
        return self._adaptive_pool(output_size, 1, True, "adaptive_max_pool1d", return_indices)

    def adaptive_max_pool2d(self, output_size: IntOrInts, return_indices: bool = False) -> Any:
        return self._adaptive_pool(output_size, 2, True, "adaptive_max_pool2d", return_indices)

    def adaptive_max_pool3d(self, output_size: IntOrInts, return_indices: bool = False) -> Any:
        return self._adaptive_pool(output_size, 3, True, "adaptive_max_pool3d", return_indices)


def _max_indices(source: Tensor, chosen: Tensor, kernel: tuple[int, ...], strides: tuple[int, ...],
                 dilations: tuple[int, ...], outputs: tuple[int, ...], amounts: list[tuple[int, int]]) -> Tensor:
    """torch's max-pool indices: the flat input position of the chosen element of each window (a bool mask)."""
    spatial = len(kernel)
    sizes = source.shape[2:]
    position = None
    for axis, size in enumerate(sizes):
        shape = [1] * spatial
        shape[axis] = size
        stride = math.prod(sizes[axis + 1:])
        term = (source._arange_primitive(size, dtypes.int64, source.device) * stride).reshape(shape)
        position = term if position is None else position + term
    assert position is not None  # spatial >= 1
    position = position.expand(sizes)._pad_and_shrink(amounts, value=-1)
    position_windows = windows(position, kernel, strides, dilations, outputs).reshape(outputs + (-1,))
    return where(chosen, position_windows, 0).sum(-1)


def _average_pooled(source: Tensor, kernel: tuple[int, ...], strides: tuple[int, ...], pads: tuple[int, ...],
                    outputs: tuple[int, ...], amounts: tuple[tuple[int, int], ...], count_include_pad: bool,
                    divisor_override: int | None) -> Tensor:
    """avg_pool of [N, C, *spatial] (checked, its geometry computed): each window's sum over torch's divisor."""
    spatial = len(kernel)
    ones = (1,) * spatial
    sizes = source.shape[2:]
    padded = source._pad_and_shrink([(0, 0), (0, 0), *amounts])
    patches = windows(padded, kernel, strides, ones, outputs)
    total = patches.sum(tuple(range(2 + spatial, 2 + 2 * spatial)), dtype=source.dtype)
    if divisor_override is not None:
        divisor: Any = divisor_override
    else:
        # torch's divisor: the window clipped to the padded input (count_include_pad) or to the input itself
        divisor = None
        for axis, (size, k, s, p, count) in enumerate(zip(sizes, kernel, strides, pads, outputs)):
            start = source._arange_primitive(count, dtypes.int64, source.device) * s - p
            end = (start + k).minimum(size + p)
            if count_include_pad:
                length = end - start
            else:
                length = end.minimum(size) - start.maximum(0)
            shape = [1] * spatial
            shape[axis] = count
            length = length.reshape(shape)
            divisor = length if divisor is None else divisor * length
    if source.dtype.is_float:
        return total / (divisor.cast(source.dtype) if not isinstance(divisor, int) else divisor)
    return total.div(divisor, rounding_mode="trunc").cast(source.dtype)
