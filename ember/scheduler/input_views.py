"""Input views: a kernel that reads one contiguous slice of an input buffer reads a view of the buffer at the slice's
start instead, so the slice's offset is a launch argument, not part of the kernel's code. A loop that slices one
tensor at a new offset each step (a recurrent layer's time steps, `x[t]` in a user's own loop) then compiles one
kernel, not one per offset.

`rebased` rewrites a kernel built by kernelize (its `input_offsets`, ir/kernel.py); the compile cache compiles the
kernel's `code` once and launches it as a `ViewedProgram`, which hands the program a view of each offset input
(MemoryPool.view). Only pools that make views rewrite (view_alignment > 0), and only at offsets that are a multiple
of their input_view_alignment (c: any element) or else of their view_alignment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.backends.base import Event, MemoryPool, Program
from ember.core.ops import Op
from ember.core.shapes import prod, strides_of
from ember.ir.kernel import Kernel, KernelStep


def rebased(kernel: Kernel, view_alignment: int) -> Kernel:
    """`kernel` with each input read only through one contiguous slice (every step reading the BUFFER, or the
    reshapes of it that only one step reads, is the same SHRINK) made an input of the slice's shape at an offset
    (`input_offsets`), where the offset's bytes are a multiple of `view_alignment` (a pool's; 0: no views, nothing
    changes) and the slice is not empty (a pool views at least one byte). The rewritten steps read the BUFFER where
    they read the SHRINK (the reshapes between are dropped); a slice that is the kernel's output (a copy of it)
    becomes a SHRINK that keeps the whole view."""
    if view_alignment <= 0:
        return kernel
    steps = kernel.steps
    readers: dict[int, list[int]] = {}
    for position, step in enumerate(steps):
        for source in step.srcs:
            readers.setdefault(source, []).append(position)
    last = len(steps) - 1
    replaced: dict[int, int] = {}  # a SHRINK's position -> the BUFFER's it reads
    sizes, offsets = list(kernel.input_sizes), [0] * len(kernel.input_sizes)
    new_shapes: dict[int, tuple[int, ...]] = {}
    for position, step in enumerate(steps):
        if step.op is not Op.BUFFER:
            continue
        shape, chain, users = step.shape, [], readers.get(position, [])
        while len(users) == 1 and steps[users[0]].op is Op.RESHAPE:  # (a reshape of a contiguous buffer is one)
            chain.append(users[0])
            shape, users = steps[users[0]].shape, readers.get(users[0], [])
        if not users or last in chain or any(steps[user].op is not Op.SHRINK for user in users):
            continue
        bounds = steps[users[0]].arg
        if not _plain((*shape, *(value for pair in bounds for value in pair))) or any(
                steps[user].arg != bounds for user in users):
            continue  # (affine values: position_replay.certified_interval kernelizes them, deciding nothing here)
        offset = contiguous_offset(shape, bounds)
        if offset is None or offset * step.dtype.itemsize % view_alignment:
            continue
        region = tuple(end - start for start, end in bounds)
        if not prod(region):
            continue
        for user in (*chain, *users):
            replaced[user] = position
        new_shapes[position] = region
        sizes[step.arg - 1] = prod(region)
        offsets[step.arg - 1] = offset
    if not replaced:
        return kernel
    new_steps: list[KernelStep] = []
    moved: dict[int, int] = {}
    for position, step in enumerate(steps):
        if position in replaced:
            moved[position] = moved[replaced[position]]
            if position == last:  # a copy of the slice: the whole view, through a SHRINK that keeps all of it
                region = new_shapes[replaced[position]]
                new_steps.append(step._replace(srcs=(moved[position],), arg=tuple((0, extent) for extent in region)))
            continue
        moved[position] = len(new_steps)
        shape = new_shapes.get(position, step.shape)
        new_steps.append(step._replace(srcs=tuple(moved[source] for source in step.srcs), shape=shape))
    return Kernel(tuple(new_steps), tuple(sizes), tuple(offsets) if any(offsets) else ())


def _plain(values: tuple[object, ...]) -> bool:
    """Whether every value is a plain int (not a shape class's SizeVariable or an affine value of incremental/)."""
    return all(type(value) is int for value in values)


def contiguous_offset(shape: tuple[int, ...], bounds: tuple[tuple[int, int], ...]) -> int | None:
    """Where a slice (a SHRINK's bounds) of a contiguous array of `shape` starts, in elements, when its elements are
    one run of the array (every axis after the first one the slice keeps more than one of is whole), else None;
    None also for the whole array (nothing to rebase)."""
    region = [end - start for start, end in bounds]
    if tuple(region) == tuple(shape):
        return None
    wide = next((axis for axis, extent in enumerate(region) if extent > 1), len(region))
    if any(bounds[axis] != (0, shape[axis]) for axis in range(wide + 1, len(shape))):
        return None
    return sum(start * stride for (start, _), stride in zip(bounds, strides_of(shape)))


class ViewedProgram(Program):
    """A kernel's compiled `code` launched for a kernel with input offsets: each offset input's handle replaced by a
    view of its buffer (`views`: per such input, its position among the launch's handles, the view's byte offset
    and byte count) before the program is called or bound."""

    def __init__(self, program: Program, pool: MemoryPool, views: tuple[tuple[int, int, int], ...]) -> None:
        self.program = program
        self.pool = pool
        self.views = views

    def viewed(self, buffers: list[Any]) -> list[Any]:
        handles = list(buffers)
        view = self.pool.view
        for position, offset, nbytes in self.views:
            handles[position] = view(handles[position], offset, nbytes)
        return handles

    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        return self.program(self.viewed(buffers), global_size, wait_for)

    def bind(self, buffers: list[Any], global_size: int) -> Callable[[tuple[Event, ...]], Event]:
        return self.program.bind(self.viewed(buffers), global_size)

    def rebind(self, bound: Any, index: int, handle: Any) -> bool:
        if handle is not None:
            for position, offset, nbytes in self.views:
                if position == index:
                    handle = self.pool.view(handle, offset, nbytes)
        return self.program.rebind(bound, index, handle)


def input_views(kernel: Kernel) -> tuple[tuple[int, int, int], ...]:
    """A kernel's views for ViewedProgram: per input with a nonzero offset, (its handle's position: the parameter
    number, byte offset, byte count)."""
    itemsizes = {step.arg: step.dtype.itemsize for step in kernel.steps if step.op is Op.BUFFER}
    return tuple((parameter, offset * itemsizes[parameter], size * itemsizes[parameter])
                 for parameter, (offset, size) in enumerate(zip(kernel.input_offsets, kernel.input_sizes), start=1)
                 if offset)
