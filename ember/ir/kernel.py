"""What the scheduler hands to lowering: a kernel as a flat, hashable list of primitive steps."""

from __future__ import annotations

from typing import Any, NamedTuple

from ember.core.dtype import DType
from ember.core.ops import ELEMENTWISE_OPS, REDUCE_OPS, Op
from ember.core.shapes import prod


class KernelStep(NamedTuple):
    """One primitive op inside a kernel. `srcs` are positions of earlier steps; a BUFFER's arg is its parameter.

    A float CONST holds its value as `float.hex()` text, so that -0.0 and NaN are told apart in cache keys."""

    op: Op
    srcs: tuple[int, ...]
    arg: Any
    shape: tuple[int, ...]
    dtype: DType


class Kernel(NamedTuple):
    """The steps of one kernel (the last one is stored to parameter 0) and the sizes of its input parameters.

    `input_offsets`, where not empty, says where in its buffer each input parameter starts (in elements; 0: at the
    start): a launch passes a view of the buffer at that offset (scheduler/input_views.py). The steps never depend
    on it, so kernels alike but for it share their `code`, compiled once."""

    steps: tuple[KernelStep, ...]
    input_sizes: tuple[int, ...]  # element counts of parameters 1..n
    input_offsets: tuple[int, ...] = ()  # per parameter 1..n, where its view starts; () for none

    @property
    def code(self) -> Kernel:
        """The kernel without its input offsets: what is lowered and compiled."""
        return Kernel(self.steps, self.input_sizes) if self.input_offsets else self

    @property
    def output(self) -> KernelStep:
        return self.steps[-1]

    @property
    def flops(self) -> int:
        """Its arithmetic: per element, one for each elementwise op and one for each element a reduce reads (a
        matmul's multiply and add: 2 * M * N * K)."""
        return sum(prod(step.shape) for step in self.steps if step.op in ELEMENTWISE_OPS) + self.reduced_elements

    @property
    def has_reduce(self) -> bool:
        """Whether any of its steps is a reduce."""
        return any(step.op in REDUCE_OPS for step in self.steps)

    @property
    def reduced_elements(self) -> int:
        """The elements its reduces read, in all (each reduce's input size, summed)."""
        return sum(prod(self.steps[step.srcs[0]].shape) for step in self.steps if step.op in REDUCE_OPS)


# Row fusion. A reduce of the last axis whose result is read back along that axis (softmax's max and sum,
# layer_norm's mean and variance) is fused into the kernel reading it when one work item evaluates that kernel along
# whole rows: a reduce of the same axis, or an output whose rows lowering loops over (`row_loop`). The reduce is
# then computed once per row, before the loops that read it, instead of by a kernel of its own.
NO_ROW, SPAN, REDUCED = 0, 1, 2  # SPAN: evaluated along a whole row; REDUCED: one value per row, read along it
ROW_SPANNING_OPS = ELEMENTWISE_OPS | {Op.CONTIGUOUS}


def row_state_below(op: Op, arg: Any, shape: tuple[int, ...], source_shape: tuple[int, ...], row: int,
                    row_length: int) -> int:
    """The row state of the sources of an op in state `row`, rows being `row_length` long. Elementwise ops keep the
    state; an EXPAND of the last axis from 1 to row_length turns SPAN into REDUCED; a reduce of exactly the last
    axis of a source whose rows are row_length long turns REDUCED into SPAN (it is fused, once per row); anything
    else ends the row (NO_ROW)."""
    if row == NO_ROW:
        return NO_ROW
    if op in ELEMENTWISE_OPS:
        return row
    if op is Op.EXPAND and row == SPAN:
        if shape[-1] == row_length and source_shape[-1] == 1 and source_shape[:-1] == shape[:-1]:
            return REDUCED
    elif op in REDUCE_OPS and row == REDUCED:
        if arg == (len(source_shape) - 1,) and source_shape[-1] == row_length and source_shape[:-1] == shape[:-1]:
            return SPAN
    return NO_ROW


def row_loop(kernel: Kernel) -> bool:
    """Whether the kernel's output has a reduce fused by rows under it: then each work item must compute whole rows
    of the output (lowering loops over the last axis), so that the reduce is computed once per row."""
    steps = kernel.steps
    output = steps[-1]
    if output.op not in ROW_SPANNING_OPS or not output.shape or output.shape[-1] < 2:
        return False
    row_length = output.shape[-1]
    stack, seen = [(len(steps) - 1, SPAN)], set()
    while stack:
        position, row = stack.pop()
        if (position, row) in seen:
            continue
        seen.add((position, row))
        step = steps[position]
        source_shape = steps[step.srcs[0]].shape if step.srcs else ()
        below = row_state_below(step.op, step.arg, step.shape, source_shape, row, row_length)
        if step.op in REDUCE_OPS and below == SPAN:
            return True
        if below != NO_ROW:
            stack.extend((source, below) for source in step.srcs)
    return False


def nested_reduce(kernel: Kernel) -> bool:
    """Whether a reduce reads another reduce without an EXPAND between them (an integer sum inside a sum, which the
    kernelizer fuses: lowered as a loop inside the outer reduce's loop); a row-fused reduce is read through one."""
    steps = kernel.steps
    for step in steps:
        if step.op in REDUCE_OPS:
            stack, seen = list(step.srcs), set()
            while stack:
                position = stack.pop()
                if position in seen:
                    continue
                seen.add(position)
                source = steps[position]
                if source.op in REDUCE_OPS:
                    return True
                if source.op is not Op.EXPAND:
                    stack.extend(source.srcs)
    return False
