"""Reduces over many elements recorded as stages of short reduces (partial results, then partials of those).

One reduce primitive is lowered to one loop per output element: a full sum of 2*10^7 float32 values would then be
one sequential float32 accumulator on one core (it stops growing at 2^24, and its rounding error grows with the
length). A reduce of more than STAGE_THRESHOLD elements per output is recorded instead as reduces of
FIRST_STAGE_CHUNK elements (more where the outputs are many, so the partials stay within PARTIALS_LIMIT values),
whose work items run in parallel over the chunks, then of LATER_STAGE_CHUNK partials, until one value per output
is left. Every stage combines few values, like the levels of pairwise summation, so the rounding error stays near
torch's; the sum of n float32 ones is exact while n is representable. The stages are recorded as one reduce for
autograd (its rule sees the whole reduce: a maximum's gradient is shared by all its ties, as torch.amax does), and
the kernelizer stores each stage's partials (a reduce read by another reduce is stored). Reduces of up to
STAGE_THRESHOLD elements are one primitive, as before. The partials of a float16 or bfloat16 sum (or product) are
float32 (a kernel computes half values in float32 and rounds what it stores; 16-bit partials of a long sum overflow
65,504 or lose its low bits), rounded to the half type once, after the last stage, as torch accumulates them. On a device that reduces rows by workgroups (a GPU: the
runtime's `reduce_stages`, ir/group_reduce.py) the stages are instead rows long enough for a group each, enough of
them to fill the device, then one group per output for the partials: a full reduction in two kernels. There a
shorter reduce (from PARALLEL_STAGE_MINIMUM elements) with fewer outputs than the device runs work items at once is
staged too (the runtime's `parallel_stages`): its reduced axes flattened last, a group per output, or for a
contraction chunks of the inner dim, parts first (one work item per output left a GPU idle: a layer norm's weight
gradient over the batch and sequence took 2 ms on an H100, a conv's weight gradient 2.9 ms).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.context import CONTEXT
from ember.core import dtype as dtypes
from ember.core.half_precision import HALF_TYPES
from ember.core.one_hot import one_hot_selection
from ember.core.ops import REDUCE_COMBINE, Op, reduce_identity
from ember.core import runtime
from ember.core.shapes import prod

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

STAGE_THRESHOLD = 1 << 14  # reduced elements per output above which a reduce runs in stages
FIRST_STAGE_CHUNK = 64  # elements a work item of the first stage reduces (at most), unless there are many outputs:
# first-stage partials (all outputs together, 32 MB of float32) past which its chunks grow, up to
PARTIALS_LIMIT = 1 << 23  # MAX_FIRST_STAGE_CHUNK (a matmul of many outputs with a long inner dim: partials stay
MAX_FIRST_STAGE_CHUNK = 4096  # within 8M values). At 4M, a language model's output layer gradient (1024 x 50,257
# @ 50,257 x 256) took chunks of 3,142, whose panels of B (400 KB a work item) were past what a tile stages
# (ir/opt.py MAX_STAGED_BYTES): 0.99 s; chunks of 1,571: 0.37 s (torch 0.17 s), and 512 x 40,000 @ 40,000 x 512
# 0.50 s -> 0.17 s.
LATER_STAGE_CHUNK = 16  # partials a work item of a later stage combines (at most)
# an exact reduce (a maximum, an integer sum: no rounding to keep near pairwise summation's) takes chunks of
# MAX_FIRST_STAGE_CHUNK, then of EXACT_LATER_CHUNK partials: the argmax of a 262,144-token vocabulary was 8 kernels
# of 64 or 16 values an item (each item's lanes combined one by one: 300 us on 2 cores), now 4 of 4,096 and 64
EXACT_LATER_CHUNK = 1024
# reduced elements per output from which a shorter reduce may still go to stages on a GPU (the runtime's
# `parallel_stages`, ir/group_reduce.stages_for_parallelism: 2 * its MINIMUM_ROW); below it, no device is asked
PARALLEL_STAGE_MINIMUM = 512


def reduce_axes(tensor: Tensor, op: Op, axes: tuple[int, ...], threshold: int = STAGE_THRESHOLD,
                later_chunk: int = LATER_STAGE_CHUNK) -> Tensor:
    """The reduce primitive `op` of tensor over `axes` (kept as size-1 dims), in stages when it reduces more than
    `threshold` elements per output (normalization statistics ask for a lower one: their rounding is the output's)
    or, from PARALLEL_STAGE_MINIMUM, where the runtime says the device's workgroups want them (few outputs on a
    GPU), the stages after the first combining up to `later_chunk` partials each."""
    if not axes:
        return tensor
    if not hasattr(tensor, "node"):  # the numpy reference tensor (ember/testing/reference.py): no graph, no device
        return tensor._apply(op, arg=axes)  # whose stages it would follow; numpy sums the axes as one primitive
    extent = prod([tensor.shape[axis] for axis in axes])
    if op is Op.SUM and len(axes) == 1 and one_hot_selection(tensor.node, axes[0]) is not None:
        return tensor._apply(op, arg=axes)  # exact in any order, and left whole for the rule that makes it a select
    parallel = extent <= threshold  # (staged only for a GPU's parallelism, if at all)
    # (a reduce of the last axis alone gets its groups as it is, and keeps the row fusion of softmax and the norms;
    # a contraction's inner dim is split all the same)
    if parallel and (extent < PARALLEL_STAGE_MINIMUM or (axes == (tensor.ndim - 1,) and not _contraction(
            tensor, axes)) or not runtime.RUNTIME.parallel_stages(tensor.node, extent, tensor.node.size // extent)):
        return tensor._apply(op, arg=axes)
    from ember.core.tensor import Tensor

    context = CONTEXT.get()
    if not (context.grad_enabled and tensor._requires_grad):
        return _staged(tensor, op, axes, later_chunk, parallel)
    token = CONTEXT.set(context.with_grad(False))
    try:
        result = _staged(tensor, op, axes, later_chunk, parallel)
    finally:
        CONTEXT.reset(token)
    if not result.dtype.is_float:
        return result
    output = Tensor._from_node(result.node)
    output._requires_grad = True
    output._context = (op, axes, (tensor,))  # backward sees one reduce primitive (autograd/rules.py)
    return output


def stage_extents(extent: int, outputs: int = 1, later_chunk: int = LATER_STAGE_CHUNK,
                  exact: bool = False) -> list[int]:
    """The number of elements each stage reduces per output, for a reduce of `extent` elements per output (each
    stage's chunks are equal: the extent is padded with the reduce's identity to chunks times chunk). Short chunks
    keep the rounding error of a sum near pairwise summation's (a sum of equal values, rounded the same way at every
    step of a long chunk, drifts by the chunk's length in ulps); an `exact` reduce (no rounding) takes long ones."""
    extents = []
    chunk_limit = min(MAX_FIRST_STAGE_CHUNK, max(FIRST_STAGE_CHUNK, -(-outputs * extent // PARTIALS_LIMIT)))
    if exact:
        chunk_limit, later_chunk = MAX_FIRST_STAGE_CHUNK, max(later_chunk, EXACT_LATER_CHUNK)
    while extent > 1:
        parts = -(-extent // chunk_limit)
        extents.append(-(-extent // parts))
        extent = parts
        chunk_limit = later_chunk
    return extents


def _staged(tensor: Tensor, op: Op, axes: tuple[int, ...], later_chunk: int = LATER_STAGE_CHUNK,
            parallel: bool = False) -> Tensor:
    """The stages of a long reduce: each run of adjacent reduced axes merged into one (`merged_reduced_runs`), the
    reduced axes moved last and flattened into one, then reduced chunk by chunk
    (padded with the identity to whole chunks) until one value per output is left; each stage's partials laid out
    parts first where `_parts_first` says so. `parallel`: a reduce staged only for a GPU's parallelism, which takes
    the group stages (a group per output row) unless it is a contraction (a matmul's shape, which keeps register
    tiles: its inner dim is split into chunks, parts first, so that the chunks' products run in parallel)."""
    shape = tensor.shape
    merged_shape, merged_axes = merged_reduced_runs(shape, axes)
    if merged_axes != axes and not _contraction(tensor, axes):
        merged = _staged(tensor._apply(Op.RESHAPE, arg=merged_shape), op, merged_axes, later_chunk, parallel)
        return merged._apply(Op.RESHAPE, arg=tuple(1 if axis in axes else size for axis, size in enumerate(shape)))
    kept = tuple(axis for axis in range(len(shape)) if axis not in axes)
    order = kept + tuple(sorted(axes))
    current = tensor if order == tuple(range(len(shape))) else tensor._apply(Op.PERMUTE, arg=order)
    kept_shape = tuple(shape[axis] for axis in kept)
    extent = prod([shape[axis] for axis in axes])
    current = current._apply(Op.RESHAPE, arg=kept_shape + (extent,))
    identity = reduce_identity(op, tensor.dtype)
    outputs = prod(list(kept_shape))
    group_stages = None if parallel and _contraction(tensor, axes) else \
        runtime.RUNTIME.reduce_stages(current.node, extent, outputs)
    parts_first = not group_stages and _parts_first(tensor, axes)  # (group stages reduce rows: parts last)
    half = tensor.dtype if tensor.dtype in HALF_TYPES and op in (Op.SUM, Op.PROD) else None
    if half is not None:  # float32 partials, rounded to the half type once at the end
        current = current._apply(Op.CAST, arg=dtypes.float32)
    exact = op is Op.REDUCE_MAX or not tensor.dtype.is_float  # (a half sum is not: its partials are float32)
    extents = group_stages or stage_extents(extent, outputs, later_chunk, exact)
    for stage, chunk in enumerate(extents):
        parts = -(-extent // chunk)
        if parts * chunk > extent and stage == 0 and not group_stages:
            current = _chunks_and_tail(current, op, kept_shape, extent, chunk, parts_first)
        else:
            if parts * chunk > extent:
                padding = ((0, 0),) * len(kept_shape) + ((0, parts * chunk - extent),)
                current = current._apply(Op.PAD, arg=(padding, identity))
            current = _chunks(current, op, kept_shape, parts, chunk, parts_first)
        extent = parts
    if half is not None:
        current = current._apply(Op.CAST, arg=half)
    return current._apply(Op.RESHAPE, arg=tuple(1 if axis in axes else size for axis, size in enumerate(shape)))


def merged_reduced_runs(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`shape` with each run of adjacent reduced axes merged into one axis, and the reduced axes of that shape (as
    they were where no two reduced axes are adjacent). The reduced elements of a run are one run of the tensor's
    memory where its trailing axes are (a batch norm's H x W plane of [N, C, H, W]): merged, a stage's chunk of
    them is read as consecutive elements, where split into H and W every chunk's index went through a division and
    a remainder by W and its loads were gathered (the statistics over 8 x 128 x 28 x 28 took 250 us, torch's 30)."""
    reduced = set(axes)
    merged: list[int] = []
    merged_axes: list[int] = []
    for axis, size in enumerate(shape):
        if axis in reduced and axis - 1 in reduced:
            merged[-1] *= size
            continue
        if axis in reduced:
            merged_axes.append(len(merged))
        merged.append(size)
    return tuple(merged), tuple(merged_axes)


def _chunks(current: Tensor, op: Op, kept_shape: tuple[int, ...], parts: int, chunk: int,
            parts_first: bool) -> Tensor:
    """[kept..., parts * chunk] reduced chunk by chunk: [kept..., parts] (computed parts first where asked)."""
    rank = len(kept_shape)
    current = current._apply(Op.RESHAPE, arg=kept_shape + (parts, chunk))
    if not parts_first:
        return current._apply(op, arg=(rank + 1,))._apply(Op.RESHAPE, arg=kept_shape + (parts,))
    current = current._apply(Op.PERMUTE, arg=(rank,) + tuple(range(rank)) + (rank + 1,))
    current = current._apply(op, arg=(rank + 1,))._apply(Op.RESHAPE, arg=(parts,) + kept_shape)
    return current._apply(Op.PERMUTE, arg=tuple(range(1, rank + 1)) + (0,))


def _chunks_and_tail(current: Tensor, op: Op, kept_shape: tuple[int, ...], extent: int, chunk: int,
                     parts_first: bool) -> Tensor:
    """A first stage whose extent is not a whole number of chunks: the whole chunks reduced as they are, the elements
    after them as one short chunk of their own, its partial placed after theirs ([kept..., parts], as padding the
    extent with the identity gives, with the same values). Padded, every load of the first stage, the long one,
    was masked (is it inside the row?), which a CPU's kernel could not load as vectors: a softmax over a vocabulary
    of 50,257 summed its exponentials one element at a time (73 ms of 110 for 512 rows on 2 cores). The partials
    are joined with the identity's pads and the reduce's own op, which changes no value (an added pad is -0.0:
    x + -0.0 is x, -0.0 included)."""
    rank = len(kept_shape)
    whole = extent // chunk
    kept = tuple((0, size) for size in kept_shape)
    main = _chunks(current._apply(Op.SHRINK, arg=kept + ((0, whole * chunk),)), op, kept_shape, whole, chunk,
                   parts_first)
    tail = current._apply(Op.SHRINK, arg=kept + ((whole * chunk, extent),))._apply(op, arg=(rank,))
    identity = reduce_identity(op, current.dtype)
    if op is Op.SUM and current.dtype.is_float:
        identity = -0.0
    main = main._apply(Op.PAD, arg=(((0, 0),) * rank + ((0, 1),), identity))
    tail = tail._apply(Op.PAD, arg=(((0, 0),) * rank + ((whole, 0),), identity))
    return main._apply(REDUCE_COMBINE[op], tail)


def _parts_first(tensor: Tensor, axes: tuple[int, ...]) -> bool:
    """Whether a long reduce's first stage puts its parts before the kept dims ([parts, kept...], reducing the
    chunk), instead of after them: where the reduced elements are not the last dim's (a sum over rows: the kept
    last dim is contiguous) or the reduce is a contraction (a product of operands broadcast along kept dims, as
    a matmul's [M, N, K]). There the kernel's work items run along the kept last dim, whose loads are contiguous
    (and the matmul tile plan takes it); parts last made each item stride through its chunk: a matmul with an inner
    dim past STAGE_THRESHOLD ran at 0.2 GFLOP/s (256 x 50,257 @ 50,257 x 256: 33 s, 0.1 s parts first). A sum
    over the last dim of a plain tensor keeps its parts last: each item reads a contiguous chunk."""
    return tensor.ndim - 1 not in axes or _contraction(tensor, axes)


def _contraction(tensor: Tensor, axes: tuple[int, ...]) -> bool:
    """Whether the reduced value is a product of operands broadcast along kept dims (a matmul's [M, N, K])."""
    node = tensor.node
    kept = [axis for axis in range(tensor.ndim) if axis not in axes]
    return node.op is Op.MUL and any(
        source.op is Op.EXPAND and any(source.srcs[0].shape[axis] == 1 < node.shape[axis] for axis in kept)
        for source in node.srcs)
