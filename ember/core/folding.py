"""Sliding windows and their adjoints: Tensor.unfold, im2col (F.unfold), col2im (F.fold), transposed convolution.

Tensor.unfold and im2col are the strided-view windows of `convolution_forms` (views, never copies). col2im is the
adjoint of those views, built from the inverse movement ops in reverse order: where windows overlap, the copies of a
position are summed by one reduce over the kernel axes. A transposed convolution is the input gradient of the
convolution it transposes (core/convolution_forms.py `transposed_convolve`), recorded for autograd as one step whose
backward is that convolution (strided: no inserted zeros are read) and its filters' gradient.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

from ember.core.convolution import IntOrInts, _check_positive, _ints, _spatial_input
from ember.core.convolution_forms import ConvolutionGeometry, transposed_convolve, window_axis, windows
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.shapes import normalize_dim
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


class FoldingOps(TensorBase):
    """Mixin: Tensor.unfold and conv_transpose1d/2d/3d. Needs the movement, reduction and convolution mixins."""

    __slots__ = ()

    def unfold(self, dimension: int, size: int, step: int) -> Tensor:
        """Every slice of `size` elements along dimension, `step` apart, in a new last dim (a view), like torch."""
        axis = normalize_dim(dimension, self.ndim, "unfold")
        length = self.shape[axis] if self.ndim else 1
        if not isinstance(size, int) or not 0 <= size <= length:
            raise ShapeError(f"unfold: size {size} must be between 0 and the size {length} of dim {dimension} "
                             f"(shape {self.shape})")
        if not isinstance(step, int) or step <= 0:
            raise ArgumentError(f"unfold: step must be a positive integer, got {step}")
        source = self.reshape(1) if self.ndim == 0 else cast("Tensor", self)
        count = (length - size) // step + 1
        if size == 0:  # empty windows: nothing to read
            shape = (0,) if self.ndim == 0 else source.shape[:axis] + (count,) + source.shape[axis + 1:] + (0,)
            return source.reshape(-1).narrow(0, 0, 0).reshape(shape)
        result = window_axis(source, axis, size, step, 1, count).movedim(axis, -1)
        return result.reshape(size) if self.ndim == 0 else result

    def conv_transpose1d(self, weight: Tensor, bias: Tensor | None = None, stride: IntOrInts = 1,
                         padding: IntOrInts = 0, output_padding: IntOrInts = 0, groups: int = 1,
                         dilation: IntOrInts = 1) -> Tensor:
        """torch.nn.functional.conv_transpose1d over [N, C_in, L] (or unbatched [C_in, L]); weight
        [C_in, C_out / groups, k]."""
        return _transposed_convolution(cast("Tensor", self), weight, bias, stride, padding, output_padding, groups,
                                       dilation, 1, "conv_transpose1d")

    def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, stride: IntOrInts = 1,
                         padding: IntOrInts = 0, output_padding: IntOrInts = 0, groups: int = 1,
                         dilation: IntOrInts = 1) -> Tensor:
        """torch.nn.functional.conv_transpose2d over [N, C_in, H, W] (or unbatched); weight [C_in, C_out / groups,
        kh, kw]."""
        return _transposed_convolution(cast("Tensor", self), weight, bias, stride, padding, output_padding, groups,
                                       dilation, 2, "conv_transpose2d")

    def conv_transpose3d(self, weight: Tensor, bias: Tensor | None = None, stride: IntOrInts = 1,
                         padding: IntOrInts = 0, output_padding: IntOrInts = 0, groups: int = 1,
                         dilation: IntOrInts = 1) -> Tensor:
        """torch.nn.functional.conv_transpose3d over [N, C_in, D, H, W] (or unbatched)."""
        return _transposed_convolution(cast("Tensor", self), weight, bias, stride, padding, output_padding, groups,
                                       dilation, 3, "conv_transpose3d")


def _transposed_convolution(source: Tensor, weight: Tensor, bias: Tensor | None, stride: IntOrInts,
                            padding: IntOrInts, output_padding: IntOrInts, groups: int, dilation: IntOrInts,
                            spatial: int, op: str) -> Tensor:
    batched, unbatched = _spatial_input(source, spatial, op)
    if weight.ndim != spatial + 2:
        raise ShapeError(f"{op}: expected {spatial + 2}-d weight [in_channels, out_channels / groups, *kernel], but "
                         f"got weight of shape {list(weight.shape)}")
    if source.dtype != weight.dtype or (bias is not None and bias.dtype != source.dtype):
        names = [source.dtype.name, weight.dtype.name] + ([bias.dtype.name] if bias is not None else [])
        raise DTypeError(f"{op}: input, weight and bias must have one dtype, got {', '.join(names)}")
    if source.dtype.is_bool or weight.dtype.is_bool:
        raise DTypeError(f"{op}: not supported for bool tensors")
    strides = _ints(stride, spatial, "stride", op)
    dilations = _ints(dilation, spatial, "dilation", op)
    pads = _ints(padding, spatial, "padding", op)
    extra = _ints(output_padding, spatial, "output_padding", op)
    _check_positive(strides, "stride", op)
    _check_positive(dilations, "dilation", op)
    if any(value < 0 for value in pads) or any(value < 0 for value in extra):
        raise ValueError(f"{op}: negative padding is not supported, got padding={list(pads)}, "
                         f"output_padding={list(extra)}")
    for value, s, d in zip(extra, strides, dilations):
        if value >= max(s, d):
            raise ValueError(f"{op}: output_padding {list(extra)} must be smaller than either stride {list(strides)} "
                             f"or dilation {list(dilations)}")
    if not isinstance(groups, int) or groups <= 0:
        raise ValueError(f"{op}: non-positive groups is not supported, got groups={groups}")
    channels = batched.shape[1]
    in_channels, group_outputs = weight.shape[:2]
    kernel = weight.shape[2:]
    if in_channels != channels or channels % groups:
        raise ShapeError(
            f"{op}: given groups={groups}, weight of shape {list(weight.shape)}, expected input of shape "
            f"{list(source.shape)} to have {in_channels} channels (divisible by groups), but got {channels} channels"
        )
    out_channels = group_outputs * groups
    if bias is not None and bias.shape != (out_channels,):
        raise ShapeError(f"{op}: given weight of shape {list(weight.shape)}, expected bias to be 1-d with "
                         f"{out_channels} elements, but got bias of shape {list(bias.shape)}")
    sizes = batched.shape[2:]
    outputs = tuple((size - 1) * s - 2 * p + d * (k - 1) + e + 1
                    for size, s, p, d, k, e in zip(sizes, strides, pads, dilations, kernel, extra))
    if any(size == 0 for size in sizes) or any(size < 0 for size in outputs):
        raise ShapeError(f"{op}: given input of shape {list(source.shape)} and weight of shape {list(weight.shape)}, "
                         f"the output size {list(outputs)} is negative (or the input's spatial size is 0)")
    if batched.shape[0] == 0 or any(size == 0 for size in outputs):  # an empty result (torch allows it), made
        # from the operands so that their gradients are zeros rather than missing
        shape = (batched.shape[0], out_channels) + outputs
        empty = None
        for operand in (batched, weight, bias):
            if operand is not None:
                part = operand.reshape(-1).narrow(0, 0, 0).reshape(shape)
                empty = part if empty is None else empty + part
        assert empty is not None  # batched is an operand
        return empty.squeeze(0) if unbatched else empty
    # the input gradient of the convolution of [N, Cout, *outputs] by weight (as [Cout_conv = Cin, Cout / groups,
    # *K]) that gives [N, Cin, *sizes]: padding before, padding - output_padding after (the rows output_padding adds
    # are read by no window of the stride)
    geometry = ConvolutionGeometry(strides, tuple((p, p - e) for p, e in zip(pads, extra)), dilations, groups,
                                   outputs)
    result = transposed_convolve(batched, weight, geometry)
    if bias is not None:
        result = result + bias.reshape((out_channels,) + (1,) * spatial)
    return result.squeeze(0) if unbatched else result


def im2col(input: Tensor, kernel_size: IntOrInts, dilation: IntOrInts = 1, padding: IntOrInts = 0,  # noqa: A002
           stride: IntOrInts = 1) -> Tensor:
    """torch.nn.functional.unfold: the sliding blocks of [N, C, H, W] (or [C, H, W]) as columns
    [N, C * kh * kw, L] (L blocks), a view of the padded input."""
    batched, unbatched = _unfold_input(input, "unfold", 3, 4, "(N, C, H, W) or unbatched (C, H, W)")
    kernel, dilations, pads, strides = _fold_arguments(kernel_size, dilation, padding, stride, "unfold")
    sizes = batched.shape[2:]
    outputs = _block_counts(sizes, kernel, dilations, pads, strides, "unfold")
    padded = batched._pad_and_shrink([(0, 0), (0, 0)] + [(p, p) for p in pads])
    patches = windows(padded, kernel, strides, dilations, outputs)  # [N, C, oh, ow, kh, kw]
    columns = patches.permute(0, 1, 4, 5, 2, 3).reshape(batched.shape[0], -1, math.prod(outputs))
    return columns.squeeze(0) if unbatched else columns


def col2im(input: Tensor, output_size: IntOrInts, kernel_size: IntOrInts, dilation: IntOrInts = 1,  # noqa: A002
           padding: IntOrInts = 0, stride: IntOrInts = 1) -> Tensor:
    """torch.nn.functional.fold: columns [N, C * kh * kw, L] summed back into [N, C, *output_size] (overlapping
    blocks add up): the adjoint of im2col."""
    batched, unbatched = _unfold_input(input, "fold", 2, 3, "(N, C * kh * kw, L) or unbatched (C * kh * kw, L)")
    kernel, dilations, pads, strides = _fold_arguments(kernel_size, dilation, padding, stride, "fold")
    sizes = _ints(output_size, 2, "output_size", "fold")
    _check_positive(sizes, "output_size", "fold")
    block = math.prod(kernel)
    if batched.shape[1] % block:
        raise ShapeError(f"fold: expected size of input's dim 1 ({batched.shape[1]}) to be divisible by the product "
                         f"of kernel_size {list(kernel)} ({block}), input of shape {list(input.shape)}")
    outputs = _block_counts(sizes, kernel, dilations, pads, strides, "fold")
    if batched.shape[2] != math.prod(outputs):
        raise ShapeError(
            f"fold: given output_size={list(sizes)}, kernel_size={list(kernel)}, dilation={list(dilations)}, "
            f"padding={list(pads)}, stride={list(strides)}, expected size of input's dim 2 to be "
            f"{math.prod(outputs)} ({outputs[0]} * {outputs[1]} blocks), but got {batched.shape[2]}"
        )
    count, channels = batched.shape[0], batched.shape[1] // block
    patches = batched.reshape((count, channels) + kernel + outputs).permute(0, 1, 4, 5, 2, 3)
    padded_sizes = tuple(size + 2 * p for size, p in zip(sizes, pads))
    folded = fold_windows(patches, kernel, strides, dilations, outputs, padded_sizes)
    result = folded._pad_and_shrink([(0, 0), (0, 0)] + [(-p, -p) for p in pads])
    return result.squeeze(0) if unbatched else result


def fold_windows(patches: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
                 output: tuple[int, ...], sizes: tuple[int, ...]) -> Tensor:
    """The adjoint of `convolution_forms.windows`: [..., o1..on, k1..kn] summed into [..., L1..Ln] (each window element
    added at the position it was read from)."""
    count = len(kernel)
    lead = patches.ndim - 2 * count
    # back to windows' intermediate order [..., k1, o1, k2, o2, ...]
    order = list(range(lead))
    for index in range(count):
        order += [lead + count + index, lead + index]
    result = patches.permute(order)
    for index in reversed(range(count)):
        result = _window_axis_adjoint(result, lead + 2 * index, kernel[index], stride[index], dilation[index],
                                      output[index], sizes[index])
    copies = tuple(lead + 2 * index for index in range(count))  # the axes holding the copies of each position
    return result.sum(copies, dtype=result.dtype)


def _window_axis_adjoint(tensor: Tensor, axis: int, kernel: int, stride: int, dilation: int, output: int,
                         size: int) -> Tensor:
    """The adjoint of convolution_forms.window_axis: axes (kernel, output) back to (copies, size), where summing the
    copies axis (left to the caller, so several axes share one reduce) gives the axis of length `size`."""
    before, after = tensor.shape[:axis], tensor.shape[axis + 2:]

    def amounts_at(position: int, amount: tuple[int, int], ndim: int) -> list[tuple[int, int]]:
        amounts = [(0, 0)] * ndim
        amounts[position] = amount
        return amounts

    if dilation == 1 and kernel <= stride:
        # forward: fit to output * stride, split (output, stride), keep `kernel` of each stride, swap the two axes
        result = tensor.transpose(axis, axis + 1)
        result = result._pad_and_shrink(amounts_at(axis + 1, (0, stride - kernel), result.ndim))
        result = result.reshape(before + (output * stride,) + after)
        result = result._pad_and_shrink(amounts_at(axis, (0, size - output * stride), result.ndim))
        return result.unsqueeze(axis)
    # forward: `kernel` copies of the axis fitted to `length`, re-read with rows longer by `dilation`, every
    # stride-th start kept; backward, the same views undone in reverse order
    length = (kernel - 1) * dilation + output * stride
    result = tensor
    if stride > 1:
        result = result.reshape(before + (kernel, output, 1) + after)
        result = result._pad_and_shrink(amounts_at(axis + 2, (0, stride - 1), result.ndim))
        result = result.reshape(before + (kernel, output * stride) + after)
    result = result._pad_and_shrink(amounts_at(axis + 1, (0, length + dilation - output * stride), result.ndim))
    result = result.reshape(before + (kernel * (length + dilation),) + after)
    result = result._pad_and_shrink(amounts_at(axis, (0, -kernel * dilation), result.ndim))
    result = result.reshape(before + (kernel, length) + after)
    return result._pad_and_shrink(amounts_at(axis + 1, (0, size - length), result.ndim))


def _unfold_input(tensor: Tensor, op: str, unbatched_dims: int, batched_dims: int, expected: str
                  ) -> tuple[Tensor, bool]:
    if tensor.ndim not in (unbatched_dims, batched_dims):
        raise ShapeError(f"{op}: expected a {batched_dims}-d input {expected}, got shape {list(tensor.shape)}")
    if tensor.ndim == unbatched_dims:
        return tensor.unsqueeze(0), True
    return tensor, False


def _fold_arguments(kernel_size: IntOrInts, dilation: IntOrInts, padding: IntOrInts, stride: IntOrInts, op: str
                    ) -> tuple[tuple[int, ...], ...]:
    kernel = _ints(kernel_size, 2, "kernel_size", op)
    dilations = _ints(dilation, 2, "dilation", op)
    pads = _ints(padding, 2, "padding", op)
    strides = _ints(stride, 2, "stride", op)
    for values, name in ((kernel, "kernel_size"), (dilations, "dilation"), (strides, "stride")):
        _check_positive(values, name, op)
    if any(value < 0 for value in pads):
        raise ValueError(f"{op}: padding must be non-negative, got padding={list(pads)}")
    return kernel, dilations, pads, strides


def _block_counts(sizes: tuple[int, ...], kernel: tuple[int, ...], dilations: tuple[int, ...],
                  pads: tuple[int, ...], strides: tuple[int, ...], op: str) -> tuple[int, ...]:
    """The number of sliding blocks along each spatial dim (torch's formula), or a ShapeError when there are none."""
    counts = tuple((size + 2 * p - d * (k - 1) - 1) // s + 1
                   for size, k, d, p, s in zip(sizes, kernel, dilations, pads, strides))
    if any(count <= 0 for count in counts) or any(size + 2 * p < d * (k - 1) + 1
                                                  for size, k, d, p in zip(sizes, kernel, dilations, pads)):
        raise ShapeError(f"{op}: given spatial size {list(sizes)}, kernel_size={list(kernel)}, dilation="
                         f"{list(dilations)}, padding={list(pads)}, stride={list(strides)}: the calculated number of "
                         f"sliding blocks {list(counts)} is not positive")
    return counts
