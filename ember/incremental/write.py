"""Writing a box of a realized value in place: kernels that compute only the box store into views of its buffer
(one per contiguous run of the box); where the pool makes no views, one select over the whole buffer."""

from __future__ import annotations

from typing import cast

from ember.core import dtype as dtypes
from ember.core import runtime
from ember.core.graph import Node, infer
from ember.core.ops import Op
from ember.core.tensor import Tensor
from ember.incremental.region import Range, Region
from ember.capture.arena import ArenaView, view_node
from ember.scheduler.buffers import Buffer

MAX_RUNS = 64  # a box in more contiguous pieces than this is written by one select over the whole buffer
SMALL_BUFFER = 1 << 16  # elements: a buffer this small is written by the select (one launch, no view)


def write_box(target: Tensor, box: Region, value: Node) -> None:
    """Make `target` (realized) hold `value` (a lazy node of the box's shape) inside `box`, the rest unchanged.

    The value's kernel writes straight into the target's buffer when the box is one contiguous run; a box in a few
    runs is computed once into its own buffer and each run copied into the target by a kernel. Elsewhere (no
    views: wgpu; offsets the pool cannot view) `target[box] = value` (a select over the whole buffer)."""
    if not target.node.realized:
        target.realize()
    buffer = target.node.buffer
    runs = contiguous_runs(box)
    if buffer is None or not _viewable(buffer, box, runs):
        _select_write(target, box, value)
        return
    if len(runs) == 1:
        _compute_into(buffer, [(runs[0][1], value)])
        return
    computed = Tensor._from_node(value).realize().node
    pieces = []
    for run, offset in runs:
        inner = tuple((start - box_start, end - box_start) for (start, end), (box_start, _) in zip(run, box.ranges))
        pieces.append((offset, _make(Op.SHRINK, (computed,), inner)))
    _compute_into(buffer, pieces)


def _select_write(target: Tensor, box: Region, value: Node) -> None:
    """target = where(inside the box, value padded to the target's shape, target): the value's kernel, then one
    elementwise kernel over the whole buffer (in place where the device allows it), the box a mask of constants,
    in one realize."""
    if not value.realized and value.op is not Op.CONTIGUOUS:
        value = _make(Op.CONTIGUOUS, (value,))  # its own kernel (fused, every element would compute it), in the
        # select's realize
    padding = tuple((start, size - end) for (start, end), size in zip(box.ranges, box.shape))
    inside = _make(Op.PAD, (Node(Op.CONST, (), True, value.shape, dtypes.bool_, target.node.device),), (padding, False))
    spread = _make(Op.PAD, (value,), (padding, 0))
    target.assign(Tensor._from_node(_make(Op.WHERE, (inside, spread, target.node))))
    target.realize()


def _compute_into(buffer: Buffer, pieces: list[tuple[int, Node]]) -> None:
    """Run the kernels computing each value with its output a view at its element offset of `buffer` (the in-place
    write of scheduler/in_place.py: the view is the node the value replaces, held by nothing else), in one
    realize. Each waits for the buffer's writer and readers; the last becomes the buffer's writer (the others
    its readers: the devices with views run kernels in order)."""
    values: list[Node] = []
    views: list[ArenaView] = []
    for offset, value in pieces:
        if value.op is not Op.CONTIGUOUS:
            value = _make(Op.CONTIGUOUS, (value,))
        replaced = view_node(buffer, offset, value.shape)
        value.replaces = replaced
        values.append(value)
        views.append(cast(ArenaView, replaced.buffer))
        del replaced
    runtime.RUNTIME.realize(values)
    for value, view in zip(values, views):
        assert value.buffer is view, "write_box: a kernel did not write into its view"
        buffer.add_user(view.event)
    buffer.event = views[-1].event


def aligned_box(box: Region, alignment: int) -> Region:
    """`box` grown towards the start of its first partial axis from the end until each of its contiguous runs
    starts at a multiple of `alignment` elements (where views of the buffer may start), when that is possible
    within a few steps; else `box` (written by the select of `write_box`)."""
    if alignment <= 1 or box.is_empty:
        return box
    for extra in range(alignment):
        ranges = list(box.ranges)
        axis = _split_axis(box)
        start, end = ranges[axis]
        if start - extra < 0:
            break
        ranges[axis] = (start - extra, end)
        grown = Region._of(box.shape, ranges)
        runs = contiguous_runs(grown)
        if len(runs) <= MAX_RUNS and all(offset % alignment == 0 for _, offset in runs):
            return grown
    return box


def _split_axis(box: Region) -> int:
    """The first axis, counted from the end, whose range is not whole (every later axis is): runs split there."""
    for axis in range(len(box.shape) - 1, -1, -1):
        if box.ranges[axis] != (0, box.shape[axis]):
            return axis
    return 0


def _viewable(buffer: Buffer, box: Region, runs: list[tuple[tuple[Range, ...], int]]) -> bool:
    alignment = buffer.pool.view_alignment
    if alignment <= 0 or len(runs) > MAX_RUNS or buffer.size <= SMALL_BUFFER or not buffer.device.info.can_run:
        return False
    return all((offset * buffer.dtype.itemsize) % alignment == 0 for _, offset in runs)


def contiguous_runs(box: Region) -> list[tuple[tuple[Range, ...], int]]:
    """The box as pieces contiguous in row-major memory: each piece's ranges and its first element's offset."""
    shape, ranges = box.shape, box.ranges
    split = _split_axis(box)  # the axes from `split` on form contiguous runs
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    pieces: list[tuple[tuple[Range, ...], int]] = [((), 0)]
    for axis in range(len(shape)):
        start, end = ranges[axis]
        if axis < split:
            pieces = [((*prefix, (index, index + 1)), offset + index * strides[axis])
                      for prefix, offset in pieces for index in range(start, end)]
            if len(pieces) > MAX_RUNS:
                return pieces
        else:
            pieces = [((*prefix, (start, end)), offset + start * strides[axis]) for prefix, offset in pieces]
    return pieces


def _make(op: Op, sources: tuple[Node, ...], arg: object = None) -> Node:
    shape, dtype = infer(op, sources, arg)
    return Node(op, sources, arg, shape, dtype)
