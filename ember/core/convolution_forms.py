"""Convolution and max pooling as direct reduces over window views, each recorded for autograd as one step whose
backward is written as convolutions and window sums again (core/ops.py Composite.CONVOLUTION, Composite.MAX_POOL),
not differentiated through the window views (whose adjoint is a sum over `kernel` copies of each padded axis).

Kernels. A convolution is one reduce over [N, G, Og, Cg, *O, *K] -> [N, Cout, *O]: its inputs are broadcast, so
ir/opt.py register-tiles it as a matmul (rows and columns of the output's last two dims, vectors along the last, the
filter value broadcast to the whole tile). An input padded along its last axis is first copied padded (one
memory-bound kernel), and one strided along it is copied split into the stride's phases (the copy is what the step
records: the filters' gradient reads it again), so that the reduce loads whole vectors with no mask per lane. The
gradient of the input is the transposed convolution (the output's gradient spread by the stride, padded, convolved
with the flipped filters of swapped channels): a copy and one reduce; for a strided convolution it is computed by
phase group instead (sub-pixel: the input positions of a phase receive only the taps that reach them; each group of
phases with as many taps a convolution of stride 1, one reduce, no inserted zeros and no tap padded to the stride).
The gradient of the filters is one reduce over the batch and output positions (two where they are too many for
one) laid out [G, *K, Og, Cg], vectorized along the positions it sums, then copied as [Cout, Cg, *K]. A transposed
convolution (conv_transpose) is recorded as its own step (Composite.TRANSPOSED_CONVOLUTION) computed as torch's
scatter (each input times each tap, then the taps' columns spread, shifted and summed: no product with a padded
zero, so inf filters give inf as torch's), whose backward is the strided convolution again, reading no inserted
zeros."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, NamedTuple

from ember.core import dtype as dtypes
from ember.core.dtype import min_value
from ember.core.elementwise import where
from ember.core.ops import Composite
from ember.core.read_alike import read_alike
from ember.core.staged_reduce import STAGE_THRESHOLD
from ember.core.views import intermediates

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


class ConvolutionGeometry(NamedTuple):
    """How a convolution reads its input: per spatial axis the stride, the (before, after) padding (negative: a
    crop), the dilation; the channel groups; the input's spatial sizes."""

    strides: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    dilations: tuple[int, ...]
    groups: int
    sizes: tuple[int, ...]
    phased: bool = False  # the step's input is the padded input copied split into the last axis' stride phases

    def outputs(self, kernel: tuple[int, ...]) -> tuple[int, ...]:
        """The output's spatial sizes for a kernel of these sizes."""
        return tuple((size + before + after - d * (k - 1) - 1) // s + 1 for size, (before, after), k, s, d in zip(
            self.sizes, self.pads, kernel, self.strides, self.dilations))


class PoolGeometry(NamedTuple):
    """How a max pool reads its input: kernel, stride and dilation per spatial axis, the output sizes, the
    (before, after) padding with -inf of each spatial axis."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    outputs: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]


@intermediates
def window_axis(tensor: Tensor, axis: int, kernel: int, stride: int, dilation: int, output: int) -> Tensor:
    """Replace `axis` (length L) by two axes (kernel, output) with element [j, i] = x[i * stride + j * dilation]."""
    before, after = tensor.shape[:axis], tensor.shape[axis + 1:]
    untouched = [(0, 0)] * tensor.ndim
    if dilation == 1 and kernel <= stride:
        # windows do not overlap: split the axis into (output, stride) and keep the first `kernel` of each stride
        amounts = list(untouched)
        amounts[axis] = (0, output * stride - tensor.shape[axis])
        split = tensor._pad_and_shrink(amounts).reshape(before + (output, stride) + after)
        kept = split.shrink([None] * (axis + 1) + [(0, kernel)])
        return kept.transpose(axis, axis + 1)
    # overlapping windows: `kernel` copies of the axis laid end to end, re-read with a row length longer by
    # `dilation`, start copy j at j * dilation; then keep every stride-th start (the index simplifier reduces the
    # re-read position (j * (L + d) + i) mod L to j * d + i: the loads are plain strided reads)
    length = (kernel - 1) * dilation + output * stride
    amounts = list(untouched)
    amounts[axis] = (0, length - tensor.shape[axis])
    fitted = tensor._pad_and_shrink(amounts)
    copies = fitted.reshape(before + (1, length) + after).expand(before + (kernel, length) + after)
    flat = copies.reshape(before + (kernel * length,) + after)
    amounts = [(0, 0)] * flat.ndim
    amounts[axis] = (0, kernel * dilation)
    rows = flat._pad_and_shrink(amounts).reshape(before + (kernel, length + dilation) + after)
    starts = rows.shrink([None] * (axis + 1) + [(0, output * stride)])
    if stride == 1:
        return starts
    split = starts.reshape(before + (kernel, output, stride) + after)
    return split.shrink([None] * (axis + 2) + [(0, 1)]).reshape(before + (kernel, output) + after)


@intermediates
def windows(tensor: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
            output: tuple[int, ...]) -> Tensor:
    """From [..., L1..Ln] (padded already) the view [..., o1..on, k1..kn] of every window: a view, never a copy."""
    count = len(kernel)
    lead = tensor.ndim - count
    result = tensor
    for index in range(count):
        result = window_axis(result, lead + 2 * index, kernel[index], stride[index], dilation[index], output[index])
    # axes are now [..., k1, o1, k2, o2, ...]: move the outputs before the kernel offsets
    order = list(range(lead)) + [lead + 2 * i + 1 for i in range(count)] + [lead + 2 * i for i in range(count)]
    return result.permute(order)


def _padded(source: Tensor, geometry: ConvolutionGeometry) -> Tensor:
    """[N, C, *S] padded with zeros (cropped where negative) on the spatial axes: copied where the last axis is
    padded and read with stride 1, so that the reduce loads whole vectors along it with no mask per lane (padding
    of the other axes masks whole vectors; a strided last axis is not read as vectors)."""
    padded = source._pad_and_shrink([(0, 0), (0, 0), *geometry.pads])
    copy = geometry.pads[-1] != (0, 0) and geometry.strides[-1] == 1
    return padded.contiguous() if copy else padded


@intermediates
def convolve(source: Tensor, weight: Tensor, geometry: ConvolutionGeometry) -> Tensor:
    """The convolution (no bias) of batched [N, C, *S] with [Cout, C / groups, *K]: [N, Cout, *O], recorded for
    autograd as one step (its rule is `convolution_gradients`)."""

    # the padded input (a copy where it is one) is what the step records: the filters' gradient reads the same copy
    return _convolve_recorded(_padded(source, geometry), weight, geometry)


def _convolve_recorded(padded: Tensor, weight: Tensor, geometry: ConvolutionGeometry) -> Tensor:
    """The convolution of the input padded already, recorded for autograd as one step; an input strided along its
    last axis (no dilation) is first copied split into its phases (`phase_split`), and the step records that copy,
    which the filters' gradient reads again."""
    if geometry.strides[-1] > 1 and geometry.dilations[-1] == 1:
        return _phased_recorded(phase_split(padded, tuple(weight.shape[2:]), geometry), weight, geometry)

    def compute(x: Tensor, w: Tensor) -> Tensor:
        return _convolve(x, w, geometry)

    return padded._recorded(Composite.CONVOLUTION, compute, (padded, weight), geometry)


def _phased_recorded(phased: Tensor, weight: Tensor, geometry: ConvolutionGeometry) -> Tensor:
    """The convolution of the input split into its phases already, recorded for autograd as one step."""
    phased_geometry = geometry._replace(phased=True)

    def compute(x: Tensor, w: Tensor) -> Tensor:
        return _phased_convolve(x, w, phased_geometry)

    return phased._recorded(Composite.CONVOLUTION, compute, (phased, weight), phased_geometry)


def _convolve(padded: Tensor, weight: Tensor, geometry: ConvolutionGeometry) -> Tensor:
    """The convolution of the input padded already by geometry.pads (not strided along its last axis)."""
    spatial = len(geometry.strides)
    batch = padded.shape[0]
    out_channels, group_channels = weight.shape[:2]
    kernel = tuple(weight.shape[2:])
    groups = geometry.groups
    outputs = geometry.outputs(kernel)
    patches = windows(padded, kernel, geometry.strides, geometry.dilations, outputs)  # [N, C, *O, *K]
    patches = patches.reshape((batch, groups, 1, group_channels) + outputs + kernel)
    filters = weight.reshape((1, groups, out_channels // groups, group_channels) + (1,) * spatial + kernel)
    reduced = (3,) + tuple(range(4 + spatial, 4 + 2 * spatial))
    result = (patches * filters).sum(reduced, dtype=padded.dtype)
    return result.reshape((batch, out_channels) + outputs)


class PhaseLayout(NamedTuple):
    """How a convolution strided along its last axis (stride s) reads its input split into phases: the filter's last
    axis as `shifts` (Q) shifts of the stride, the phases a filter offset reads (min(s, K)), the phases' length M =
    O + Q - 1, the padded input's spatial sizes."""

    shifts: int
    phases: int
    length: int
    padded_sizes: tuple[int, ...]


def _phase_layout(geometry: ConvolutionGeometry, kernel: tuple[int, ...]) -> PhaseLayout:
    """The phase layout of a convolution strided along its last axis with a kernel of these sizes."""
    shifts = -(-kernel[-1] // geometry.strides[-1])
    padded_sizes = tuple(size + before + after for size, (before, after) in zip(geometry.sizes, geometry.pads))
    return PhaseLayout(shifts, min(geometry.strides[-1], kernel[-1]), geometry.outputs(kernel)[-1] + shifts - 1,
                       padded_sizes)


def phase_split(padded: Tensor, kernel: tuple[int, ...], geometry: ConvolutionGeometry) -> Tensor:
    """The padded input [N, C, *S] of a convolution strided along its last axis (stride s) copied as [N, C, s, ...,
    M] with x[..., p, m] = padded[..., m * s + p] (cut or zero-padded to M * s), only the phases a filter offset
    reads (the first K of a kernel K < s): the windows of stride 1 that `_phased_convolve` and the filters' gradient
    read as whole vectors."""
    return _phase_view(padded, kernel, geometry).contiguous()


def _phase_view(tensor: Tensor, kernel: tuple[int, ...], geometry: ConvolutionGeometry) -> Tensor:
    """[N, C, *S'] (S' the padded sizes) viewed as `phase_split`'s layout [N, C, s', ..., M]."""
    spatial = len(geometry.strides)
    batch, channels = tensor.shape[:2]
    stride = geometry.strides[-1]
    layout = _phase_layout(geometry, kernel)
    sizes = tuple(tensor.shape[2:])
    fitted = tensor._pad_and_shrink([(0, 0)] * (1 + spatial) + [(0, layout.length * stride - sizes[-1])])
    split = fitted.reshape((batch, channels) + sizes[:-1] + (layout.length, stride))
    split = split.shrink([None] * (2 + spatial) + [(0, layout.phases)])
    return split.permute((0, 1, 2 + spatial) + tuple(range(2, 1 + spatial)) + (1 + spatial,))


def _phased_convolve(phased: Tensor, weight: Tensor, geometry: ConvolutionGeometry) -> Tensor:
    """A convolution strided along its last axis (stride s, no dilation) as a sum over the s phases of that axis of
    the input split into them (`phase_split`: [N, C, s', ..., M], s' = min(s, K)), the filters' last axis
    zero-padded to Q * s and split as (q, p), so that out[o] = sum over p, q of x[p, o + q] * w[q, p]: windows of stride 1 along the last
    axis (whole vectors), at the cost of the filters' padding (K rounded up to s)."""
    spatial = len(geometry.strides)
    batch = phased.shape[0]
    out_channels, group_channels = weight.shape[:2]
    kernel = tuple(weight.shape[2:])
    groups, stride = geometry.groups, geometry.strides[-1]
    outputs = geometry.outputs(kernel)
    shifts, phases, _, _ = _phase_layout(geometry, kernel)
    window_kernel = kernel[:-1] + (shifts,)
    strides = geometry.strides[:-1] + (1,)
    patches = windows(phased, window_kernel, strides, geometry.dilations, outputs)  # [N, C, s', *O, *K']
    patches = patches.reshape((batch, groups, 1, group_channels, phases) + outputs + window_kernel)
    filters = weight._pad_and_shrink([(0, 0)] * (1 + spatial) + [(0, shifts * stride - kernel[-1])])
    filters = filters.reshape((out_channels, group_channels) + kernel[:-1] + (shifts, stride))
    filters = filters.shrink([None] * (2 + spatial) + [(0, phases)])
    if shifts * phases > kernel[-1]:
        # taps past the kernel are read (3 taps at stride 2: q, p in {0, 1}): the zero-padded filters are copied once
        # (a small buffer), so the convolution reads plain values, not the pad's mask at every product, and is a
        # matmul the packed form takes (64 -> 128 filters over 56 x 56 pixels, stride 2, batch 8: 53 -> 4.2 ms on 2
        # cores, torch 4.1)
        filters = filters.contiguous()
    filters = filters.permute((0, 1, 2 + spatial) + tuple(range(2, 2 + spatial)))  # [Cout, Cg, s', *K']
    filters = filters.reshape((1, groups, out_channels // groups, group_channels, phases) + (1,) * spatial
                              + window_kernel)
    reduced = (3, 4) + tuple(range(5 + spatial, 5 + 2 * spatial))
    result = (patches * filters).sum(reduced, dtype=phased.dtype)
    return result.reshape((batch, out_channels) + outputs)


def _spread(tensor: Tensor, axis: int, stride: int) -> Tensor:
    """Axis of length O as length (O - 1) * stride + 1 with stride - 1 zeros between neighbours."""
    if stride == 1:
        return tensor
    shape = tensor.shape
    count = shape[axis]
    split = tensor.reshape(shape[:axis] + (count, 1) + shape[axis + 1:])
    amounts = [(0, 0)] * split.ndim
    amounts[axis + 1] = (0, stride - 1)
    spread = split._pad_and_shrink(amounts).reshape(shape[:axis] + (count * stride,) + shape[axis + 1:])
    amounts = [(0, 0)] * spread.ndim
    amounts[axis] = (0, 1 - stride)
    return spread._pad_and_shrink(amounts)


def _placed_at_offset(part: Tensor, offsets: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...],
                      padded_sizes: tuple[int, ...]) -> Tensor:
    """`part` ([N, C, *O]: one kernel offset's value per window) spread by the strides and shifted to that offset
    (times the dilation) inside the padded input's sizes: that offset's share of a sum over the kernel's offsets (a
    transposed convolution's scatter, a max pool's gradient)."""
    for axis, stride in enumerate(strides):
        part = _spread(part, 2 + axis, stride)
    amounts = [(0, 0), (0, 0)]
    for offset, dilation, spread_size, padded_size in zip(offsets, dilations, part.shape[2:], padded_sizes):
        amounts.append((offset * dilation, padded_size - offset * dilation - spread_size))
    return part._pad_and_shrink(amounts)


def _spread_and_padded(tensor: Tensor, strides: tuple[int, ...], pads: list[tuple[int, int]]) -> Tensor:
    """[N, C, *O] with each spatial axis spread by its stride (stride - 1 zeros between neighbours, length
    (O - 1) * stride + 1) and padded by its (before, after) (negative: cropped), built so that no reshape reads a
    negative offset: every axis is first padded by whole strides (a = ceil(before / stride) elements), then spread,
    then read from offset a * stride - before (in [0, stride)). The index simplifier then splits each load's index
    per axis (a negative offset under a padding's mask keeps the flat index's division chain of the reshapes)."""
    spatial = len(strides)
    lengths = [(count - 1) * stride + 1 + before + after
               for count, stride, (before, after) in zip(tensor.shape[2:], strides, pads)]
    wholes = [-(-before // stride) for stride, (before, _) in zip(strides, pads)]
    offsets = [whole * stride - before for whole, stride, (before, _) in zip(wholes, strides, pads)]
    counts = [-(-(offset + length) // stride) for offset, length, stride in zip(offsets, lengths, strides)]
    fitted = tensor._pad_and_shrink([(0, 0), (0, 0)] + [(whole, count - size - whole) for whole, count, size in zip(
        wholes, counts, tensor.shape[2:])])
    for axis, (stride, count) in enumerate(zip(strides, counts)):
        if stride == 1:
            continue
        shape = fitted.shape
        split = fitted.reshape(shape[:2 + axis] + (count, 1) + shape[3 + axis:])
        amounts = [(0, 0)] * split.ndim
        amounts[3 + axis] = (0, stride - 1)
        fitted = split._pad_and_shrink(amounts).reshape(shape[:2 + axis] + (count * stride,) + shape[3 + axis:])
    return fitted._pad_and_shrink([(0, 0), (0, 0)] + [(-offset, offset + length - size) for offset, length, size in zip(
        offsets, lengths, fitted.shape[2:])])


def input_gradient(grad: Tensor, weight: Tensor, geometry: ConvolutionGeometry) -> Tensor:
    """d convolution / d input: the transposed convolution of grad [N, Cout, *O] with the flipped filters, their
    channels swapped within each group: a convolution again (stride 1, the forward's dilation) of grad spread by the
    stride and padded (copied where the last axis is spread or padded, as `_padded`). `convolution_gradients` uses it
    where no axis is strided, `phase_input_gradient` (no inserted zeros) otherwise."""
    spatial = len(geometry.strides)
    kernel = tuple(weight.shape[2:])
    groups = geometry.groups
    out_channels, group_channels = weight.shape[:2]
    pads = []
    for size, count, stride, k, d, (before, _) in zip(geometry.sizes, grad.shape[2:], geometry.strides, kernel,
                                                       geometry.dilations, geometry.pads):
        left = (k - 1) * d - before
        pads.append((left, size + (k - 1) * d - left - ((count - 1) * stride + 1)))
    spread = _spread_and_padded(grad, geometry.strides, pads)
    last_left = (kernel[-1] - 1) * geometry.dilations[-1] - geometry.pads[-1][0]
    last_spread = (grad.shape[-1] - 1) * geometry.strides[-1] + 1
    if geometry.strides[-1] > 1 or last_left != 0 or spread.shape[-1] != last_spread:
        spread = spread.contiguous()
    swapped = weight.reshape((groups, out_channels // groups, group_channels) + kernel).transpose(1, 2)
    filters = swapped.reshape((groups * group_channels, out_channels // groups) + kernel)
    filters = filters.flip(tuple(range(2, 2 + spatial)))
    ones = (1,) * spatial
    unpadded = ((0, 0),) * spatial
    return _convolve_recorded(spread, filters, ConvolutionGeometry(ones, unpadded, geometry.dilations, groups,
                                                                   tuple(spread.shape[2:])))


PHASES_INNER = 8  # a phase group's reduce is laid out [.., M, P] (phases innermost) from this many phases on


class PhaseGroup(NamedTuple):
    """Consecutive phases [phase, phase + phases) of one axis of a strided convolution's padded input (positions
    j = m * s + p, computed for m in [low, high)) that filter taps reach in one pattern: phase phase + i receives the
    taps k = tap + i + t * step (t < taps), tap t reading the output's gradient at m - shift - t * spacing."""

    phase: int
    phases: int
    low: int
    high: int
    tap: int
    step: int
    taps: int
    shift: int
    spacing: int


def _phase_groups(size: int, outputs: int, stride: int, kernel: int, dilation: int, before: int) -> list[PhaseGroup]:
    """The phases of one axis (stride s, dilation d) whose input positions some filter tap reaches, runs of
    neighbours with the same taps merged (with d = 1 at most two runs: ceil(K / s) taps, then one fewer). Tap k
    reaches phase p where k * d = p (mod s): every s / gcd(s, d)-th tap, whose readings of the gradient step by
    d / gcd(s, d). Only the positions of the input that some window reads are computed (the others' gradient is 0)."""
    step, spacing = stride // math.gcd(stride, dilation), dilation // math.gcd(stride, dilation)
    reach = (outputs - 1) * stride + (kernel - 1) * dilation + 1  # the padded positions the windows read
    first, last = max(0, before), min(before + size, reach)
    groups: list[PhaseGroup] = []
    for phase in range(stride):
        taps = [k for k in range(kernel) if (k * dilation - phase) % stride == 0]
        low, high = -(-(first - phase) // stride), -(-(last - phase) // stride)
        if not taps or high <= low:
            continue
        group = PhaseGroup(phase, 1, low, high, taps[0], step, len(taps), (taps[0] * dilation - phase) // stride,
                           spacing)
        previous = groups[-1] if groups else None
        if (previous is not None and previous.phase + previous.phases == phase
                and previous.tap + previous.phases == group.tap and previous.phases < step
                and (previous.taps, previous.shift) == (group.taps, group.shift)):
            groups[-1] = previous._replace(phases=previous.phases + 1, low=min(previous.low, low),
                                           high=max(previous.high, high))
        else:
            groups.append(group)
    return groups


def _phase_taps(weight: Tensor, axes: list[list[PhaseGroup]], groups: int) -> Tensor:
    """The filters [Cout, Cg, *K] as [G, Cg, Og, *R, *Q] by views, read by every phase group (`_phase_group_reduce`):
    each axis zero-padded to Q * step (Q = ceil(K / step), step the axis' groups' tap step) and split as (Q, step),
    Q flipped, so that a group's phase i, tap t (k = tap + i + (T - 1 - t) * step, tap < step) is R = tap + i,
    Q = Q - T + t: a group's taps are one box."""
    spatial = len(axes)
    out_channels, group_channels = weight.shape[:2]
    kernel = tuple(weight.shape[2:])
    steps = [axis[0].step for axis in axes]
    shifts = [-(-size // step) for size, step in zip(kernel, steps)]
    taps = weight._pad_and_shrink([(0, 0), (0, 0)] + [(0, count * step - size) for count, step, size in zip(
        shifts, steps, kernel)])
    taps = taps.reshape((groups, out_channels // groups, group_channels) + tuple(
        item for count, step in zip(shifts, steps) for item in (count, step)))  # [G, Og, Cg, Q1, step1, Q2, ..]
    if any(count * step > size > 1 for count, step, size in zip(shifts, steps, kernel)):
        # (an axis of several taps padded: the zero-padded filters copied once, a small buffer; read through the pad,
        # every product of the input's gradient took its mask, as lowering cannot tell which groups' taps stay
        # inside the kernel, and no packed form applied: 64 -> 128 filters over 56 x 56 pixels, stride 2, batch 8,
        # its four products 41 -> 3.6 ms on 2 cores. A 1x1 kernel's one tap reads no pad)
        taps = taps.contiguous()
    flipped = tuple(3 + 2 * axis for axis, count in enumerate(shifts) if count > 1)
    if flipped:
        taps = taps.flip(flipped)
    return taps.permute((0, 2, 1) + tuple(4 + 2 * axis for axis in range(spatial)) + tuple(
        3 + 2 * axis for axis in range(spatial)))


def _phase_group_reduce(patches: Tensor, filters: Tensor, chosen: list[PhaseGroup], groups: int) -> Tensor:
    """One combination of phase groups' share of the input's gradient, [N, Cin, M1, P1, M2, P2, ..] (positions, then
    the group's phases, per axis: the interleaved order): the windows of stride 1 of the padded gradient
    ([N, Cout, *M, *T]) times the group's flipped taps ([G, Cg, Og, *P, *T]) summed over the output channels and
    taps, one reduce, stored (read through the interleaving's pads, it would be recomputed per element). Stored in
    that order where the last axis' group has PHASES_INNER phases or more (a patch embedding's stride-16 taps: the
    tile's vectors along the phases, and groups of all s phases need only a reshape), else as [N, Cin, *P, *M] (the
    tile's vectors along the positions; a tile along a handful of phases runs ~4x slower) and read through a
    permute."""
    spatial = len(chosen)
    batch, out_channels = patches.shape[:2]
    positions = tuple(patches.shape[2:2 + spatial])
    group_channels = filters.shape[1]
    taps = tuple(group.taps for group in chosen)
    phases = tuple(group.phases for group in chosen)
    lead = (groups, group_channels, out_channels // groups)
    reduced = (3,) + tuple(range(4 + 2 * spatial, 4 + 3 * spatial))
    if phases[-1] >= PHASES_INNER:
        interleaved = tuple(item for count in positions for item in (count, 1))
        patches = patches.reshape((batch, groups, 1, out_channels // groups) + interleaved + taps)
        filters = filters.reshape((1,) + lead + tuple(item for count in phases for item in (1, count)) + taps)
        result = (patches * filters).sum(reduced, dtype=patches.dtype)  # [N, G, Cg, M1, P1, M2, P2, ..]
        return result.reshape((batch, groups * group_channels) + tuple(
            item for count, phase_count in zip(positions, phases) for item in (count, phase_count))).contiguous()
    patches = patches.reshape((batch, groups, 1, out_channels // groups) + (1,) * spatial + positions + taps)
    filters = filters.reshape((1,) + lead + phases + (1,) * spatial + taps)
    result = (patches * filters).sum(reduced, dtype=patches.dtype).contiguous()  # [N, G, Cg, P1, P2, .., M1, M2, ..]
    result = result.reshape((batch, groups * group_channels) + phases + positions)
    return result.permute((0, 1) + tuple(item for axis in range(spatial) for item in (2 + spatial + axis, 2 + axis)))


def phase_input_gradient(grad: Tensor, weight: Tensor, geometry: ConvolutionGeometry) -> Tensor:
    """d convolution / d input [N, Cin, *S] of a strided convolution by phase (sub-pixel): along an axis of stride
    s the padded positions j = m * s + p of phase p receive only the taps k with k * d = p (mod s), each reading the
    output's gradient at m - (k * d - p) / s: a convolution of stride 1 of the gradient with those taps, flipped.
    Each combination of the axes' phase groups (`_phase_groups`: phases with as many taps, at most 2 per axis where
    d = 1) is one such convolution, its phases extra output channels: exactly the products the gradient needs (no
    inserted zero of the spread gradient, the transposed convolution's s - 1 of every s per axis; no tap padded to a
    multiple of the stride), each stored in its own layout (a reduce read through the interleaving's pads would be
    recomputed per element), then interleaved into [N, Cin, *S] by views (each phase spread by the stride and
    shifted to its position, summed: fused into the kernel that reads the gradient). One padded copy of the gradient
    (where some window reaches past its last axis' ends) serves every group."""
    spatial = len(geometry.strides)
    batch = grad.shape[0]
    out_channels, group_channels = weight.shape[:2]
    kernel = tuple(weight.shape[2:])
    groups = geometry.groups
    outputs = tuple(grad.shape[2:])
    axes = [_phase_groups(size, count, s, k, d, before) for size, count, s, k, d, (before, _) in zip(
        geometry.sizes, outputs, geometry.strides, kernel, geometry.dilations, geometry.pads)]
    if not all(axes):  # no window reads an input position (they read padding only): the gradient is 0
        return grad._full((batch, groups * group_channels) + tuple(geometry.sizes), 0.0, grad.dtype, grad.device)
    # the windows of stride 1 of the gradient, as many taps as an axis' groups have most, over the positions some
    # group reads ([start, start + M) each; the gradient padded with zeros past its ends, one copy where its last
    # axis is padded, as `_padded`), read by every group: its positions and its taps are one box of them
    longest = [max(group.taps for group in axis) for axis in axes]
    spacings = tuple(axis[0].spacing for axis in axes)
    starts = [[group.low - group.shift - (group.taps - 1) * group.spacing for group in axis] for axis in axes]
    lows = [min(axis_starts) for axis_starts in starts]
    highs = [max(start + group.high - group.low for start, group in zip(axis_starts, axis))
             for axis_starts, axis in zip(starts, axes)]
    amounts = [(max(0, -low), max(0, high + (count - 1) * spacing - size)) for low, high, count, spacing, size in zip(
        lows, highs, longest, spacings, outputs)]
    padded = grad._pad_and_shrink([(0, 0), (0, 0), *amounts])
    padded = padded.shrink([None, None] + [(low + before, high + before + (count - 1) * spacing) for low, high, count,
                                           spacing, (before, _) in zip(lows, highs, longest, spacings, amounts)])
    if amounts[-1] != (0, 0):
        padded = padded.contiguous()
    if all(count == 1 for count in longest):
        patches = padded.reshape(padded.shape + (1,) * spatial)
    else:
        patches = windows(padded, tuple(longest), (1,) * spatial, spacings, tuple(
            high - low for low, high in zip(lows, highs)))  # [N, Cout, *U, *Q]
    taps = _phase_taps(weight, axes, groups)  # [G, Cg, Og, *R, *Q]
    first, last = [min(group.low for group in axis) for axis in axes], [max(group.high for group in axis) for axis in axes]
    total: Tensor | None = None
    for choice in itertools.product(*(range(len(axis)) for axis in axes)):
        chosen = [axis[index] for axis, index in zip(axes, choice)]
        part = _phase_group_reduce(
            patches.shrink([None, None] + [(start[index] - low, start[index] - low + group.high - group.low)
                                           for start, index, low, group in zip(starts, choice, lows, chosen)]
                           + [(0, group.taps) for group in chosen]),
            taps.shrink([None] * 3 + [(group.tap, group.tap + group.phases) for group in chosen]
                        + [(count - group.taps, count) for count, group in zip(
                            [taps.shape[3 + spatial + axis] for axis in range(spatial)], chosen)]),
            chosen, groups)  # [N, Cin, M1, P1, M2, P2, ..]
        # (M, P) -> padded positions m * s + p for m in [low, high) of every group (zeros where this one has none)
        part = part._pad_and_shrink([(0, 0), (0, 0)] + [
            amount for group, stride, low, high in zip(chosen, geometry.strides, first, last)
            for amount in ((group.low - low, high - group.high), (group.phase, stride - group.phase - group.phases))])
        total = part if total is None else total + part
    assert total is not None  # every axis has a group
    total = total.reshape((batch, groups * group_channels) + tuple(
        (high - low) * stride for low, high, stride in zip(first, last, geometry.strides)))
    # padded positions [low * s, high * s) -> the input's [0, S)
    return total._pad_and_shrink([(0, 0), (0, 0)] + [
        (low * stride - before, size - (high * stride - before))
        for low, high, stride, size, (before, _) in zip(first, last, geometry.strides, geometry.sizes, geometry.pads)])


def weight_gradient(grad: Tensor, padded: Tensor, weight_shape: tuple[int, ...],
                    geometry: ConvolutionGeometry) -> Tensor:
    """d convolution / d weight from the padded input: the sum over the batch and output positions of grad times the
    input's windows, one reduce (positions first, then the batch, where there are too many for one). The reduce's
    output is laid out [G, *K, Og, Cg] (then viewed as [Cout, Cg, *K]): output channels by input channels are the
    tile a work item computes, with vectors along the output positions it sums. A step whose input is split into
    its stride's phases (geometry.phased) reads that copy (`_phased_weight_gradient`)."""
    if geometry.phased:
        return _phased_weight_gradient(grad, padded, weight_shape, geometry)
    spatial = len(geometry.strides)
    batch = padded.shape[0]
    out_channels, group_channels = weight_shape[:2]
    kernel = tuple(weight_shape[2:])
    groups = geometry.groups
    outputs = tuple(grad.shape[2:])
    patches = windows(padded, kernel, geometry.strides, geometry.dilations, outputs)  # [N, C, *O, *K]
    patches = patches.reshape((batch, groups, 1, group_channels) + outputs + kernel)
    kernel_axes = tuple(range(4 + spatial, 4 + 2 * spatial))
    position_axes = tuple(range(4, 4 + spatial))
    patches = patches.permute((0, 1) + kernel_axes + (2, 3) + position_axes)  # [N, G, *K, 1, Cg, *O]
    spread = grad.reshape((batch, groups) + (1,) * spatial + (out_channels // groups, 1) + outputs)
    product = patches * spread  # [N, G, *K, Og, Cg, *O]
    positions = tuple(range(4 + spatial, 4 + 2 * spatial))
    total = _positions_sum(product, positions, batch * math.prod(outputs), padded.dtype)
    # stored in its own layout (the tile's), then read as [Cout, Cg, *K] through a view (a 1x1 kernel's layouts
    # are one)
    total = total.reshape((groups,) + kernel + (out_channels // groups, group_channels))
    if math.prod(kernel) > 1:
        total = total.contiguous()
    order = (0, 1 + spatial, 2 + spatial) + tuple(range(1, 1 + spatial))
    return total.permute(order).reshape(weight_shape)


def _positions_sum(product: Tensor, positions: tuple[int, ...], batch_and_positions: int, dtype: dtypes.DType
                   ) -> Tensor:
    """The sum of product over its batch (axis 0) and output positions: one reduce, or the positions then the batch
    where there are more than one reduce sums (staged_reduce.STAGE_THRESHOLD)."""
    if batch_and_positions <= STAGE_THRESHOLD:
        return product.sum((0,) + positions, dtype=dtype)
    return product.sum(positions, dtype=dtype, keepdim=True).sum(0, dtype=dtype)


def _phased_weight_gradient(grad: Tensor, phased: Tensor, weight_shape: tuple[int, ...],
                            geometry: ConvolutionGeometry) -> Tensor:
    """The filters' gradient of a convolution strided along its last axis (stride s, no dilation) from its input
    split into the stride's phases (`phase_split`, the copy the forward read): filter offset k = q * s + p reads
    phase p at position o + q, a window of stride 1 (whole vectors along the positions summed; the strided read of
    the padded input was a scalar loop). The reduce is laid out [G, *K', s', Og, Cg] (K' the last kernel axis as its
    Q shifts, s' = min(s, K) the phases a filter offset reads), the offsets past K (the filters' padding to Q * s)
    dropped by the copy as [G, *K, Og, Cg]."""
    spatial = len(geometry.strides)
    batch = phased.shape[0]
    out_channels, group_channels = weight_shape[:2]
    kernel = tuple(weight_shape[2:])
    groups, stride = geometry.groups, geometry.strides[-1]
    outputs = tuple(grad.shape[2:])
    shifts, phases, _, _ = _phase_layout(geometry, kernel)
    window_kernel = kernel[:-1] + (shifts,)
    strides = geometry.strides[:-1] + (1,)
    patches = windows(phased, window_kernel, strides, geometry.dilations, outputs)  # [N, C, s', *O, *K']
    patches = patches.reshape((batch, groups, 1, group_channels, phases) + outputs + window_kernel)
    kernel_axes = tuple(range(5 + spatial, 5 + 2 * spatial))
    position_axes = tuple(range(5, 5 + spatial))
    patches = patches.permute((0, 1) + kernel_axes + (4, 2, 3) + position_axes)  # [N, G, *K', s', 1, Cg, *O]
    spread = grad.reshape((batch, groups) + (1,) * (spatial + 1) + (out_channels // groups, 1) + outputs)
    product = patches * spread  # [N, G, *K', s', Og, Cg, *O]
    positions = tuple(range(5 + spatial, 5 + 2 * spatial))
    total = _positions_sum(product, positions, batch * math.prod(outputs), phased.dtype)  # [G, *K', s', Og, Cg]
    if shifts * phases > kernel[-1]:
        # (stored as the reduce lays it out: the offsets past K dropped by a reshape and shrink fused into it would
        # make its output's index a division, which keeps the product from the packed form; 64 -> 128 filters
        # over 56 x 56 pixels, stride 2, batch 8: 38 -> 5.3 ms on 2 cores)
        total = total.contiguous()
    joined = total.reshape((groups,) + kernel[:-1] + (shifts * phases, out_channels // groups, group_channels))
    joined = joined.shrink([None] * spatial + [(0, kernel[-1])])  # [G, *K, Og, Cg]
    if math.prod(kernel) > 1:  # (a 1x1 kernel's layouts are one)
        joined = joined.contiguous()
    order = (0, 1 + spatial, 2 + spatial) + tuple(range(1, 1 + spatial))
    return joined.permute(order).reshape(weight_shape)


@intermediates
def convolution_gradients(grad: Tensor, padded: Tensor, weight: Tensor,
                          geometry: ConvolutionGeometry) -> tuple[Tensor, Tensor]:
    """(d padded input, d weight) of a convolution given the gradient of its output (autograd/rules.py). The padded
    input's gradient is the input's, padded with zeros: the padding is constant (its gradient is dropped by the pad's
    own rule), so the transposed convolution computes only the input's positions. A step whose input is split into
    the stride's phases (geometry.phased) gets that gradient in the same layout (a view)."""
    strided = any(stride > 1 for stride in geometry.strides)
    source_gradient = (phase_input_gradient if strided else input_gradient)(grad, weight, geometry)
    source_gradient = source_gradient._pad_and_shrink([(0, 0), (0, 0), *geometry.pads])
    if geometry.phased:
        source_gradient = _phase_view(source_gradient, tuple(weight.shape[2:]), geometry)
    return source_gradient, weight_gradient(grad, padded, tuple(weight.shape), geometry)


# ---- transposed convolution ----------------------------------------------------------------------------------


@intermediates
def transposed_convolve(source: Tensor, weight: Tensor, geometry: ConvolutionGeometry) -> Tensor:
    """The transposed convolution (no bias) of batched [N, Cin, *I] with [Cin, Cout / groups, *K]: the input's
    gradient of the convolution that `geometry` describes (input [N, Cout, *geometry.sizes], filters `weight`, output
    [N, Cin, *I]), recorded for autograd as one step: its gradients (`transposed_convolution_gradients`) are that
    convolution of the output's gradient and the filters' gradient of it, neither of which reads inserted zeros."""

    def compute(x: Tensor, w: Tensor) -> Tensor:
        return _column_transposed_convolve(x, w, geometry)

    return source._recorded(Composite.TRANSPOSED_CONVOLUTION, compute, (source, weight), geometry)


def _column_transposed_convolve(source: Tensor, weight: Tensor, geometry: ConvolutionGeometry) -> Tensor:
    """The transposed convolution as torch's scatter computes it: each input element times each filter tap (one
    reduce over the input channels, the columns [N, G, Cout / G, *K, *I], no product with a padded or inserted zero,
    so an inf filter gives inf, not the NaN of 0 * inf), then each tap's columns spread by the stride, shifted by its
    offset and summed (one elementwise kernel; the sums add zeros only) and cropped by the convolution's padding."""
    spatial = len(geometry.strides)
    batch, in_channels = source.shape[:2]
    group_out = weight.shape[1]
    kernel = tuple(weight.shape[2:])
    groups = geometry.groups
    inputs = tuple(source.shape[2:])
    group_in = in_channels // groups
    values = source.reshape((batch, groups, 1, group_in) + (1,) * spatial + inputs)
    taps = weight.reshape((groups, group_in, group_out) + kernel).transpose(1, 2)  # [G, Cout/G, Cin/G, *K]
    taps = taps.reshape((1, groups, group_out, group_in) + kernel + (1,) * spatial)
    columns = (values * taps).sum(3, dtype=source.dtype)  # [N, G, Cout/G, *K, *I]
    columns = columns.reshape((batch, groups * group_out) + kernel + inputs).contiguous()  # (not one reduce per tap)
    padded_sizes = tuple(size + before + after for size, (before, after) in zip(geometry.sizes, geometry.pads))
    total: Tensor | None = None
    for offsets in itertools.product(*(range(k) for k in kernel)):
        part = columns.shrink([None, None] + [(offset, offset + 1) for offset in offsets])
        part = part.reshape((batch, groups * group_out) + inputs)
        placed = _placed_at_offset(part, offsets, geometry.strides, geometry.dilations, padded_sizes)
        total = placed if total is None else total + placed
    assert total is not None  # a kernel has at least one tap
    return total._pad_and_shrink([(0, 0), (0, 0)] + [(-before, -after) for before, after in geometry.pads])


@intermediates
def transposed_convolution_gradients(grad: Tensor, source: Tensor, weight: Tensor,
                                     geometry: ConvolutionGeometry) -> tuple[Tensor, Tensor]:
    """(d input, d weight) of `transposed_convolve` given the gradient of its output (autograd/rules.py): the input's
    is the (strided) convolution of grad with the filters, the filters' is the windows of the padded grad times the
    input summed, as in a convolution's backward with the input's role played by grad. Both read one padded grad."""
    padded = _padded(grad, geometry)
    if geometry.strides[-1] > 1 and geometry.dilations[-1] == 1:  # one copy split into the phases read by both
        phased = phase_split(padded, tuple(weight.shape[2:]), geometry)
        return (_phased_recorded(phased, weight, geometry),
                _phased_weight_gradient(source, phased, tuple(weight.shape), geometry._replace(phased=True)))
    return _convolve_recorded(padded, weight, geometry), weight_gradient(source, padded, tuple(weight.shape), geometry)


# ---- max pooling ----------------------------------------------------------------------------------------------


@intermediates
def max_pool(source: Tensor, geometry: PoolGeometry) -> Tensor:
    """The maximum of each window of batched [N, C, *S] (padding counts as -inf), recorded for autograd as one step
    whose gradient goes to the first maximum of each window, as torch's (`max_pool_gradient`)."""

    def compute(x: Tensor) -> Tensor:
        patches = pool_windows(x, geometry)
        spatial = len(geometry.kernel)
        return patches.amax(tuple(range(2 + spatial, 2 + 2 * spatial)))

    return source._recorded(Composite.MAX_POOL, compute, (source,), geometry)


@intermediates
def pool_windows(source: Tensor, geometry: PoolGeometry) -> Tensor:
    """[N, C, *O, *K]: the windows of the -inf padded input."""
    padded = source._pad_and_shrink([(0, 0), (0, 0), *geometry.pads], value=min_value(source.dtype))
    return windows(padded, geometry.kernel, geometry.strides, geometry.dilations, geometry.outputs)


@intermediates
def chosen_offset(flat: Tensor, dtype: dtypes.DType = dtypes.int64) -> Tensor:
    """The offset in each window (the last axis of flat) of its first maximum, or of its last NaN (torch's), as
    `dtype` (a float type holds the small offsets and scores exactly)."""
    count = flat.shape[-1]
    offset = flat._arange_primitive(count, dtype, flat.device)
    is_max = flat == flat.amax(-1, keepdim=True)
    score = where(is_max, count - 1 - offset, -1)
    if flat.dtype.is_float:
        score = where(flat == flat, score, count + offset)  # (NaN != NaN; no negation: vector lanes compare)
    best = score.amax(-1, keepdim=True)
    return where(best >= count, best - count, count - 1 - best)


@intermediates
def max_pool_gradient(grad: Tensor, source: Tensor, geometry: PoolGeometry) -> Tensor:
    """d max_pool / d input: each window's gradient to its chosen element (the offsets: one reduce), then, for each
    kernel offset, the windows' gradients spread by the stride and shifted to that offset, summed (one elementwise
    kernel, no scatter)."""
    spatial = len(geometry.kernel)
    patches = pool_windows(read_alike(source), geometry)  # (compared with its windows' maxima: read_alike.py)
    flat = patches.reshape(patches.shape[:2 + spatial] + (math.prod(geometry.kernel),))
    # the offsets as float32 (exact: a window has far fewer than 2^24 elements): the gradient's kernel then compares
    # and selects float lanes only, which vectorize.py packs
    chosen = chosen_offset(flat, dtypes.float32).reshape(grad.shape)
    padded_sizes = tuple(size + before + after for size, (before, after) in zip(source.shape[2:], geometry.pads))
    crop = [(0, 0), (0, 0)] + [(-before, -after) for before, after in geometry.pads]
    if all(d == 1 and k <= s for k, s, d in zip(geometry.kernel, geometry.strides, geometry.dilations)):
        return _disjoint_pool_gradient(grad, chosen, geometry, padded_sizes)._pad_and_shrink(crop)
    chosen = chosen.contiguous()  # read once per kernel offset below: stored, not recomputed by each read
    total: Tensor | None = None
    for position, offsets in enumerate(itertools.product(*(range(k) for k in geometry.kernel))):
        part = where(chosen == position, grad, 0)
        placed = _placed_at_offset(part, offsets, geometry.strides, geometry.dilations, padded_sizes)
        total = placed if total is None else total + placed
    assert total is not None  # a kernel has at least one offset
    return total._pad_and_shrink(crop)


def _upsampled(tensor: Tensor, strides: tuple[int, ...], sizes: tuple[int, ...]) -> Tensor:
    """[N, C, *O] with each element repeated stride times along its axis, cut or zero-padded to `sizes`."""
    outputs = tuple(tensor.shape[2:])
    lead = tuple(tensor.shape[:2])
    split = tensor.reshape(lead + tuple(item for count in outputs for item in (count, 1)))
    repeated = split.expand(lead + tuple(item for count, s in zip(outputs, strides) for item in (count, s)))
    joined = repeated.reshape(lead + tuple(count * s for count, s in zip(outputs, strides)))
    return joined._pad_and_shrink([(0, 0), (0, 0)] + [(0, size - count * s) for size, count, s in zip(
        sizes, outputs, strides)])


def _disjoint_pool_gradient(grad: Tensor, chosen: Tensor, geometry: PoolGeometry,
                            padded_sizes: tuple[int, ...]) -> Tensor:
    """Windows that do not overlap (kernel <= stride, no dilation): each padded input position is in at most one
    window, at offset i mod stride: the window's gradient where its chosen offset is that one (one elementwise
    kernel reading each window's gradient and offset once per position)."""
    spatial = len(geometry.kernel)
    offset: Tensor | None = None
    inside: Tensor | None = None
    for axis, (k, s, count, size) in enumerate(zip(geometry.kernel, geometry.strides, geometry.outputs,
                                                   padded_sizes)):
        along = grad._arange_primitive(s, chosen.dtype, grad.device).reshape(1, s).expand(count, s)
        along = along.reshape(count * s)._pad_and_shrink([(0, size - count * s)], value=k)  # k: in no window
        shape = [1] * spatial
        shape[axis] = size
        along = along.reshape(shape)
        weighted = along * math.prod(geometry.kernel[axis + 1:])
        offset = weighted if offset is None else offset + weighted
        within = along < k
        inside = within if inside is None else inside.logical_and(within)
    assert offset is not None and inside is not None  # spatial >= 1
    upsampled_grad = _upsampled(grad, geometry.strides, padded_sizes)
    upsampled_chosen = _upsampled(chosen, geometry.strides, padded_sizes)
    return where(inside.logical_and(upsampled_chosen == offset), upsampled_grad, 0)
