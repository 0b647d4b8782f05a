"""Lowering: a Kernel (primitive steps) to kernel IR. Views become index math, padding becomes validity masks."""

from __future__ import annotations

import itertools
import math
from collections.abc import Generator
from typing import Any

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.ops import (
    COMPARISON_OPS,
    ELEMENTWISE_OPS,
    MOVEMENT_OPS,
    REDUCE_COMBINE,
    REDUCE_OPS,
    Op,
    reduce_identity,
)
from ember.core.shapes import prod, strides_of
from ember.core.walk import evaluate
from ember.ir.ir import BufferParam, Builder, IRNode, IROp, KernelIR, topological_nodes
from ember.ir.kernel import Kernel, KernelStep, row_loop
from ember.ir.shape_class import SizeVariable

HALF_TYPES = (dtypes.float16, dtypes.bfloat16)
INT32_LIMIT = 2**31 - 1
# a workgroup kernel's rows of at most this many elements per work item are unrolled (ir/group_reduce.py): each
# element one load shared by every pass over the row (softmax's max, sum and output), kept in registers
UNROLLED_ROW_STEPS = 16
TAILED_LANES = 16  # vectors a reduce's axis holds at least before lanes take it with a tail (_lower_reduce): a
# short reduce (a normalization statistic's staged chunks of 66) keeps its one sequential loop, and its rounding
RUNTIME_SIZE_ESTIMATE = 64  # what loop-work estimates take a loop over a size known only at launch to run
# lowering one step: yields (source position, index, valid) for each source value it needs, returns its IR value
Lowering = Generator[tuple[int, tuple[IRNode, ...], IRNode | None], IRNode, IRNode]


def compute_dtype(dtype: DType) -> DType:
    """Half-precision values are computed in float32 and only stored as halves."""
    return dtypes.float32 if dtype in HALF_TYPES else dtype



def size_range(builder: Builder, size: int | IRNode, dtype: DType) -> IRNode:
    """A loop over `size` elements: a constant, or a size known only at launch (a shape class's variable, whose
    loop-work estimates take RUNTIME_SIZE_ESTIMATE)."""
    if isinstance(size, IRNode):
        return builder.new_range(RUNTIME_SIZE_ESTIMATE, dtype, size)
    return builder.new_range(size, dtype)

class Lowerer:
    """Lowers the steps of one kernel at symbolic indices, memoizing (step, index, validity)."""

    def __init__(self, kernel: Kernel, builder: Builder, index_dtype: DType, reduce_lanes: int = 1,
                 group: tuple[IRNode, int] | None = None) -> None:
        self.kernel = kernel
        self.steps = kernel.steps
        self.builder = builder
        self.index_dtype = index_dtype
        self.params: dict[int, IRNode] = {}
        self.memo: dict[tuple, IRNode] = {}
        # one loop variable per (reduce step, axis): every output a work item computes shares the same loops
        self.ranges: dict[tuple[int, int], IRNode] = {}
        self.reduce_lanes = reduce_lanes
        self.lane_groups: list[tuple[IRNode, ...]] = []
        # a workgroup kernel's (LOCAL_ID node, local size): each reduce is shared by the work items of a group
        self.group = group

    def param(self, position: int, dtype: DType, is_output: bool) -> IRNode:
        if position not in self.params:
            self.params[position] = self.builder.param(position, dtype, is_output)
        return self.params[position]

    def lower(self, position: int, index: tuple[IRNode, ...], valid: IRNode | None) -> IRNode:
        """The value of step `position` at `index` (where `valid`). Steps are lowered by generators that yield the
        (source position, index, valid) they need, so a chain of any length lowers without recursion (walk.py)."""
        # (a request is its own memo key: IR nodes are hash-consed, so identity is structure, and they hash and
        # compare by identity)
        return evaluate((position, index, valid), None, self._start, self.memo)

    def _start(self, request: tuple[int, tuple[IRNode, ...], IRNode | None]) -> Lowering:
        position, index, valid = request
        return self._lower(position, self.steps[position], index, valid)

    def _lower(self, position: int, step: KernelStep, index: tuple[IRNode, ...], valid: IRNode | None) -> Lowering:
        """Lower one step (a generator: see `lower`)."""
        b = self.builder
        op = step.op
        if op is Op.BUFFER:
            param = self.param(step.arg, step.dtype, False)
            linear = b.const(0, self.index_dtype)
            for axis_index, stride, size in zip(index, self.strides(step.shape), step.shape):
                if size != 1:
                    linear = b.add(b.mul(axis_index, stride), linear)
            loaded = b.load(param, linear, valid)
            return b.alu(Op.CAST, dtypes.float32, loaded) if step.dtype in HALF_TYPES else loaded
        if op is Op.CONST:
            if isinstance(step.arg, IRNode):  # an integer known at launch (a shape class's, lower_shape_class)
                return step.arg if step.dtype is step.arg.dtype else b.alu(Op.CAST, step.dtype, step.arg)
            value = float.fromhex(step.arg) if isinstance(step.arg, str) else step.arg
            return b.const(value, compute_dtype(step.dtype))
        if op is Op.ARANGE:
            return b.alu(Op.CAST, compute_dtype(step.dtype), index[0])
        if op is Op.CONTIGUOUS:
            return (yield step.srcs[0], index, valid)
        if op in ELEMENTWISE_OPS:
            return (yield from self._lower_elementwise(step, index, valid))
        if op in MOVEMENT_OPS:
            return (yield from self._lower_movement(step, index, valid))
        if op in REDUCE_OPS:
            return (yield from self._lower_reduce(position, step, index, valid))
        raise AssertionError(f"lowering: {op} cannot appear inside a kernel")

    def store_output(self, index: tuple[IRNode, ...]) -> IRNode:
        """The store of the kernel's value at output `index` (cast to the output dtype) into the output buffer."""
        output = self.kernel.output
        builder = self.builder
        value = self.lower(len(self.kernel.steps) - 1, index, None)
        if value.dtype != output.dtype:
            value = builder.alu(Op.CAST, output.dtype, value)
        linear = builder.const(0, self.index_dtype)
        for axis_index, stride, extent in zip(index, strides_of(output.shape), output.shape):
            if extent != 1:
                linear = builder.add(builder.mul(axis_index, stride), linear)
        return builder.store(self.param(0, output.dtype, True), linear, value)

    def buffer_params(self) -> list[BufferParam]:
        """The kernel's buffer parameters: the output, then each input (its dtype and element count)."""
        kernel = self.kernel
        params = [BufferParam(0, kernel.output.dtype, prod(kernel.output.shape), True)]
        input_dtypes = {step.arg: step.dtype for step in kernel.steps if step.op is Op.BUFFER}
        return params + [BufferParam(position, input_dtypes[position], kernel.input_sizes[position - 1], False)
                         for position in range(1, len(kernel.input_sizes) + 1)]

    def strides(self, shape: tuple[int, ...]) -> tuple[int | IRNode, ...]:
        """Row-major strides of a shape; where sizes known only at launch (nodes) enter, nodes."""
        if not any(isinstance(size, IRNode) for size in shape):
            return strides_of(shape)
        return symbolic_strides(self.builder, shape)

    def plus(self, first: int | IRNode, second: int | IRNode) -> int | IRNode:
        """first + second, sizes that may be nodes (known at launch)."""
        if isinstance(first, IRNode):
            return self.builder.add(first, second)
        if isinstance(second, IRNode):
            return self.builder.add(second, first)
        return first + second

    def last_index(self, size: int | IRNode) -> IRNode:
        """size - 1 as an index value."""
        if isinstance(size, IRNode):
            return self.builder.add(size, -1)
        return self.builder.const(size - 1, self.index_dtype)

    def _rounded(self, dtype: DType, value: IRNode) -> IRNode:
        """A half-type value (computed in float32) rounded to its type."""
        if dtype not in HALF_TYPES:
            return value
        return self.builder.alu(Op.CAST, dtypes.float32, self.builder.alu(Op.CAST, dtype, value))

    def _lower_reduce(self, position: int, step: KernelStep, index: tuple[IRNode, ...],
                      valid: IRNode | None) -> Lowering:
        b, op = self.builder, step.op
        source_shape = self.steps[step.srcs[0]].shape
        if 0 in source_shape:  # (a size known at launch, a node, is never 0: ir/shape_class.py)
            return b.const(reduce_identity(op, step.dtype), compute_dtype(step.dtype))
        picked = yield from self._one_hot_pick(position, step, index, valid)
        if picked is not None:
            return picked
        if self.group is not None:
            return (yield from self._lower_group_reduce(position, step, index, valid))
        lanes = self.reduce_lanes
        # an axis that `lanes` divides, else one of TAILED_LANES * lanes elements or more, whose last size % lanes
        # elements are then a short reduce of their own (a row of 1,001 summed in 16 lanes and a tail of 9: 256 rows
        # on 2 cores 104 -> 13 us; a row of 17 stays one scalar loop)
        split = [axis for axis in step.arg if source_shape[axis] % lanes == 0 and source_shape[axis] >= lanes
                 ] if lanes > 1 else []
        split = split or [axis for axis in step.arg if lanes > 1 and isinstance(source_shape[axis], int)
                          and source_shape[axis] >= TAILED_LANES * lanes]  # (an axis lanes divide first)
        split_axis = split[-1] if split else None
        tail = source_shape[split_axis] % lanes if split_axis is not None and isinstance(
            source_shape[split_axis], int) else 0
        ranges = {}
        for axis in step.arg:
            if source_shape[axis] != 1:
                if (position, axis) not in self.ranges:
                    size = source_shape[axis] // lanes if axis == split_axis else source_shape[axis]
                    self.ranges[(position, axis)] = size_range(b, size, self.index_dtype)
                ranges[axis] = self.ranges[(position, axis)]
        if split_axis is None:
            reduced = yield from self._reduced_value(step, index, ranges, valid)
            return b.reduce(op, reduced, tuple(ranges.values()))
        # split: `lanes` accumulators, lane l summing elements lanes*i + l of the axis, combined at the end
        outer = ranges[split_axis]
        group = []
        for lane in range(lanes):
            lane_ranges = {**ranges, split_axis: b.add(b.mul(outer, lanes), lane)}
            reduced = yield from self._reduced_value(step, index, lane_ranges, valid)
            group.append(b.reduce(op, reduced, tuple(ranges.values())))
        self.lane_groups.append(tuple(group))
        combine = REDUCE_COMBINE[op]
        while len(group) > 1:
            group = [b.alu(combine, group[0].dtype, *group[number:number + 2]) if number + 1 < len(group)
                     else group[number] for number in range(0, len(group), 2)]
        if not tail:
            return group[0]
        # the tail's loops are its own, the other reduced axes' too: values computed from the main loops' variables
        # (a row's offset) belong to that loop nest (with them shared, a sum of 2 rows of 1,000 rendered an offset
        # outside its loop, which the C and OpenCL compilers rejected)
        others = {axis: size_range(b, source_shape[axis], self.index_dtype) for axis in ranges if axis != split_axis}
        rest = b.new_range(tail, self.index_dtype)
        start = source_shape[split_axis] - tail
        tail_ranges = {**others, split_axis: b.add(rest, start)}
        reduced = yield from self._reduced_value(step, index, tail_ranges, valid)
        return b.alu(combine, group[0].dtype, group[0], b.reduce(op, reduced, (*others.values(), rest)))

    def _one_hot_pick(self, position: int, step: KernelStep, index: tuple[IRNode, ...],
                      valid: IRNode | None) -> Generator[tuple[int, tuple[IRNode, ...], IRNode | None], IRNode,
                                                         IRNode | None]:
        """A sum over one axis of `where(i == k, v, 0)`, k the position along the axis and i not depending on it
        (a gather written without a gather primitive: core/advanced_indexing.take_last, embedding, index_select,
        the binary search of nonzero), as the one element it picks: v at k = i where 0 <= i < size, else 0. One
        load instead of a loop over the axis (a gather of m values from n was O(m n)). None where the reduce is not
        of that form."""
        b = self.builder
        source = self.steps[step.srcs[0]]
        if step.op is not Op.SUM or len(step.arg) != 1 or source.op is not Op.WHERE:
            return None
        axis = step.arg[0]
        size = self.steps[step.srcs[0]].shape[axis]
        if not isinstance(size, int) or size < 2 or self._computes_a_reduce(step.srcs[0]):
            return None  # (lowering a reduce inside the test would leave its loop and lane groups behind)
        # a range of its own for the test (not the reduce's: a lane split gives that one another size)
        along = b.new_range(size, self.index_dtype)
        zero = b.const(0, self.index_dtype)
        probe = tuple(along if number == axis else zero if number in step.arg else axis_index
                      for number, axis_index in enumerate(index))
        otherwise = yield source.srcs[2], probe, valid
        if not (otherwise.is_const and otherwise.arg == 0):
            return None
        condition = yield source.srcs[0], probe, valid  # (views of the comparison are index math: gone here)
        if condition.op is not Op.CMPEQ or not condition.srcs[0].dtype.is_int:
            return None
        left, right = condition.srcs
        for position_side, picked_side in ((left, right), (right, left)):
            if position_side is along or (position_side.op is Op.CAST and position_side.srcs[0] is along):
                if not _has_loop(picked_side):
                    break
        else:
            return None
        inside = b.alu(Op.AND, dtypes.bool_, b.less(b.const(-1, picked_side.dtype), picked_side),
                       b.less(picked_side, b.const(size, picked_side.dtype)))
        chosen = b.alu(Op.CAST, self.index_dtype, b.alu(Op.WHERE, picked_side.dtype, inside, picked_side,
                                                        b.const(0, picked_side.dtype)))
        at = tuple(chosen if number == axis else axis_index for number, axis_index in enumerate(probe))
        value = yield source.srcs[1], at, inside if valid is None else b.alu(Op.AND, dtypes.bool_, valid, inside)
        if _has_loop(value):  # (a value computed by loops of its own keeps the plain reduce)
            return None
        if value.dtype.is_float:  # (the sum starts from +0.0: a -0.0 picked sums to +0.0, as torch's index_add)
            value = b.alu(Op.ADD, value.dtype, value, b.const(0.0, value.dtype))
        nothing = b.const(0, value.dtype)
        return b.alu(Op.WHERE, value.dtype, inside, value, nothing)

    def _computes_a_reduce(self, position: int) -> bool:
        """Whether step `position` or a step it is computed from is a reduce."""
        pending, seen = [position], set()
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            if self.steps[current].op in REDUCE_OPS:
                return True
            pending.extend(self.steps[current].srcs)
        return False

    def _lower_group_reduce(self, position: int, step: KernelStep, index: tuple[IRNode, ...],
                            valid: IRNode | None) -> Lowering:
        """A reduce of one axis by the work items of a group (ir/group_reduce.py): work item l reduces elements l,
        l + L, l + 2L, ... of the axis (L the local size; the identity past its end), then the group combines the
        items' partial results (GROUP_REDUCE)."""
        b, op = self.builder, step.op
        local_id, local_size = self.group  # type: ignore[misc]  # (only called in group mode)
        source_shape = self.steps[step.srcs[0]].shape
        axis = next(axis for axis in step.arg if source_shape[axis] != 1)
        length = source_shape[axis]
        steps = -(-length // local_size)
        if steps <= UNROLLED_ROW_STEPS:  # the item's elements one by one (a sum from +0.0, as Builder.reduce's)
            partial = b.const(0.0 if op is Op.SUM else reduce_identity(op, step.dtype), compute_dtype(step.dtype))
            for number in range(steps):
                element = b.add(local_id, number * local_size)
                value = yield from self._reduced_value(step, index, {axis: b.at_most(element, length - 1)}, valid)
                if element.maximum > length - 1:
                    identity = b.const(reduce_identity(op, step.dtype), value.dtype)
                    value = b.alu(Op.WHERE, value.dtype, b.less(element, length), value, identity)
                first = number == 0 and op is not Op.SUM  # (the identity combined with a value is the value)
                partial = value if first else b.alu(REDUCE_COMBINE[op], partial.dtype, partial, value)
            return b.group_reduce(op, partial)
        if (position, axis) not in self.ranges:
            self.ranges[(position, axis)] = b.new_range(-(-length // local_size), self.index_dtype)
        step_range = self.ranges[(position, axis)]
        element = b.add(b.mul(step_range, local_size), local_id)
        inside = None if length % local_size == 0 else b.less(element, length)
        # past the end the last element is read (clamped, not masked: a mask would reach the reduces this one reads
        # through a broadcast, softmax's max, and make them depend on this reduce's loop) and the identity used
        clamped = b.at_most(element, length - 1)
        value = yield from self._reduced_value(step, index, {axis: clamped}, valid)
        if inside is not None:
            identity = b.const(reduce_identity(op, step.dtype), value.dtype)
            value = b.alu(Op.WHERE, value.dtype, inside, value, identity)
        return b.group_reduce(op, b.reduce(op, value, (step_range,)))

    def _reduced_value(self, step: KernelStep, index: tuple[IRNode, ...], ranges: dict[int, IRNode],
                       valid: IRNode | None) -> Lowering:
        """The value a reduce step reduces, at the output `index` and the reduced axes' `ranges`."""
        zero = self.builder.const(0, self.index_dtype)
        source_index = tuple(
            ranges.get(axis, zero) if axis in step.arg else axis_index for axis, axis_index in enumerate(index)
        )
        return (yield step.srcs[0], source_index, valid)

    def _lower_elementwise(self, step: KernelStep, index: tuple[IRNode, ...], valid: IRNode | None) -> Lowering:
        b = self.builder
        sources = []
        for src in step.srcs:
            sources.append((yield src, index, valid))
        source_dtype = self.steps[step.srcs[0]].dtype
        if step.op is Op.CAST:
            if step.dtype in HALF_TYPES:  # round through the half type, keep computing in float32
                return b.alu(Op.CAST, dtypes.float32, b.alu(Op.CAST, step.dtype, sources[0]))
            result = b.alu(Op.CAST, step.dtype, sources[0])
            source = sources[0]
            if step.dtype.is_float and source.op is Op.CAST and source.dtype.is_int and source.srcs[0].dtype.is_float:
                # compilers turn (float)(int)x into trunc(x), which keeps the sign of -0.0 (gcc with SSE4.1 and
                # -fno-trapping-math, Mesa): an int has no -0.0, and adding +0.0 gives it back its +0.0
                result = b.alu(Op.ADD, result.dtype, result, b.const(0.0, result.dtype))
            return result
        if step.op is Op.BITCAST:
            value = sources[0]
            if source_dtype in HALF_TYPES:
                value = b.alu(Op.CAST, source_dtype, value)
            result = b.alu(Op.BITCAST, step.dtype, value)
            return b.alu(Op.CAST, dtypes.float32, result) if step.dtype in HALF_TYPES else result
        if step.op in COMPARISON_OPS and source_dtype in HALF_TYPES:
            # half values are computed in float32 inside a kernel and rounded when stored: compare them rounded, so
            # a value equals its stored maximum (argmax) as the rounded values torch compares do
            sources = [self._rounded(source_dtype, source) for source in sources]
        return b.alu(step.op, compute_dtype(step.dtype), *sources)

    def _lower_movement(self, step: KernelStep, index: tuple[IRNode, ...], valid: IRNode | None) -> Lowering:
        b = self.builder
        source = self.steps[step.srcs[0]]
        op, arg = step.op, step.arg
        zero = b.const(0, self.index_dtype)
        if op is Op.PERMUTE:
            permuted = [zero] * len(arg)
            for output_axis, source_axis in enumerate(arg):
                permuted[source_axis] = index[output_axis]
            return (yield step.srcs[0], tuple(permuted), valid)
        if op is Op.EXPAND:
            source_index = tuple(
                zero if source_size == 1 else axis_index for axis_index, source_size in zip(index, source.shape)
            )
            return (yield step.srcs[0], source_index, valid)
        if op is Op.SHRINK:
            source_index = tuple(b.add(axis_index, start) for axis_index, (start, _) in zip(index, arg))
            return (yield step.srcs[0], source_index, valid)
        if op is Op.FLIP:
            source_index = tuple(
                b.alu(Op.SUB, self.index_dtype, self.last_index(size), axis_index) if axis in arg
                else axis_index
                for axis, (axis_index, size) in enumerate(zip(index, step.shape))
            )
            return (yield step.srcs[0], source_index, valid)
        if op is Op.RESHAPE:
            return (yield step.srcs[0], self._reshape_index(index, step.shape, source.shape), valid)
        if op is Op.PAD:
            amounts, fill = arg
            padded: list[IRNode] = []
            inside: IRNode | None = None
            for axis_index, (before, after), size in zip(index, amounts, source.shape):
                if before or after:  # (an amount known at launch, a node, is never 0)
                    if before:
                        inside = b.both(inside, b.alu(Op.CMPLT, dtypes.bool_, self.last_index(before), axis_index))
                    if after:
                        inside = b.both(inside, b.less(axis_index, self.plus(size, before)))
                    if before:
                        axis_index = (b.alu(Op.SUB, self.index_dtype, axis_index, before)
                                      if isinstance(before, IRNode) else b.add(axis_index, -before))
                padded.append(axis_index)
            value = yield step.srcs[0], tuple(padded), b.both(valid, inside)
            if inside is None:
                return value
            fill_value = b.const(fill, compute_dtype(step.dtype))
            positive_zero = fill == 0 and math.copysign(1.0, fill) > 0  # -0.0 must be selected, not loaded as 0
            if value.op is IROp.LOAD and positive_zero and step.dtype not in HALF_TYPES:
                return value  # a guarded load already gives 0 outside
            return b.alu(Op.WHERE, value.dtype, inside, value, fill_value)
        raise AssertionError(op)

    def _reshape_index(self, index: tuple[IRNode, ...], shape: tuple[int, ...],
                       source_shape: tuple[int, ...]) -> tuple[IRNode, ...]:
        b = self.builder
        zero = b.const(0, self.index_dtype)
        if [s for s in shape if s != 1] == [s for s in source_shape if s != 1]:
            kept = iter(axis_index for axis_index, size in zip(index, shape) if size != 1)
            return tuple(zero if size == 1 else next(kept) for size in source_shape)
        result: list[IRNode] = []
        symbolic = any(isinstance(size, IRNode) for size in shape + source_shape)
        groups = [((0, len(shape)), (0, len(source_shape)))] if symbolic else _reshape_groups(shape, source_shape)
        for (start, end), (source_start, source_end) in groups:
            # each run of axes whose sizes multiply to a run of the source's is reshaped on its own: the index
            # of one run never enters another's division (an offset that may be negative outside a padding's
            # mask, in one run, would keep every run's division and remainder); sizes known only at launch (a
            # shape class) are reshaped as one run
            group_shape, group_source = shape[start:end], source_shape[source_start:source_end]
            linear = zero
            for axis_index, stride, size in zip(index[start:end], self.strides(group_shape), group_shape):
                if size != 1:
                    linear = b.add(b.mul(axis_index, stride), linear)
            for axis, (stride, size) in enumerate(zip(self.strides(group_source), group_source)):
                if size == 1:
                    result.append(zero)
                    continue
                value = b.div(linear, stride)
                result.append(value if axis == 0 else b.mod(value, size))
        return tuple(result)


def _reshape_groups(shape: tuple[int, ...], source_shape: tuple[int, ...]
                    ) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The reshape as runs of axes ((start, end) in shape, (start, end) in source_shape) whose sizes have equal
    products, cut wherever the running products of both shapes agree (one run for an empty shape)."""
    if 0 in shape or 0 in source_shape:
        return [((0, len(shape)), (0, len(source_shape)))]
    groups = []
    start = source_start = 0
    end = source_end = 0
    product = source_product = 1
    while end < len(shape) or source_end < len(source_shape):
        if source_end == len(source_shape) or (end < len(shape) and product <= source_product):
            product *= shape[end]
            end += 1
        else:
            source_product *= source_shape[source_end]
            source_end += 1
        if product == source_product and end > start and source_end > source_start:
            groups.append(((start, end), (source_start, source_end)))
            start, source_start = end, source_end
    if start < len(shape) or source_start < len(source_shape):  # trailing size-1 axes
        groups.append(((start, len(shape)), (source_start, len(source_shape))))
    return groups


def index_extent(kernel: Kernel) -> int:
    """A bound on every index the kernel computes: the element counts of its output, its inputs and its reshapes
    (the only steps whose index is linearized), and every axis's size (loop counters and the other views' per-axis
    indices). An expanded or compared [M, N] shape is never linearized: a one-hot pick of M values from N needs
    no 64-bit index for M * N past 2**31."""
    counts = [prod(kernel.output.shape), *kernel.input_sizes]
    for step in kernel.steps:
        if step.op is Op.RESHAPE:
            counts.append(prod(step.shape))
        counts.extend(size for size in step.shape if isinstance(size, int))
    return max(counts, default=0)


def _has_loop(node: IRNode) -> bool:
    """Whether a loop variable or a reduce is among the nodes `node` is computed from (the one-hot pick takes
    only values computed without loops: its index, and the value it picks)."""
    return any(item.op in (IROp.RANGE, IROp.REDUCE) for item in topological_nodes(node))


def lower_kernel(kernel: Kernel, name: str, upcast: tuple[int, ...] | None = None,
                 order: tuple[int, ...] | None = None, reduce_lanes: int = 1,
                 loop: tuple[int, int] | None = None) -> KernelIR:
    """The kernel IR of one kernel. Each work item computes a tile of outputs: `upcast[d]` consecutive elements
    along output dim d (None: one output per work item). A factor that does not divide its dim is allowed: the
    last tile's extra indices are clamped to the dim's last index, so they recompute and store that element's value
    again (the same value, by the same work item). `order` lists the output dims from the slowest-varying to the
    fastest-varying in the work item number (default: row-major, the last dim fastest). With `reduce_lanes` > 1
    each reduce's last reduced axis that this many lanes divide is reduced by that many accumulators, lane l taking
    every lanes-th element from l on, combined at the end (KernelIR.lane_groups lists them, for vectorize.py).
    `loop` = (dim, tiles): each work item computes `tiles` consecutive tiles along that dim in a loop (a LOOP
    statement around the stores; the last work item's extra tiles are clamped to the dim's last tile). A kernel
    with a reduce fused by rows (kernel.row_loop) always loops over whole rows: the reduce, which does not depend
    on the loop, is computed once before it."""
    return TileLowering(kernel, name, upcast, order, reduce_lanes, loop).whole()


class TileLowering:
    """A kernel lowered by one tile plan (lower_kernel's arguments) in two parts: the tile's first row (offset 0
    along every tiled dim but the last, where a plan is first judged: ir/opt.py), then the rest. The first row's
    outputs come first in the tile's order, so lowering the rest after them builds the nodes, in the order, that
    lowering the whole tile at once builds: the whole tile's IR is the same either way."""

    def __init__(self, kernel: Kernel, name: str, upcast: tuple[int, ...] | None = None,
                 order: tuple[int, ...] | None = None, reduce_lanes: int = 1,
                 loop: tuple[int, int] | None = None) -> None:
        shape = kernel.output.shape
        factors = upcast if upcast is not None else (1,) * len(shape)
        largest = index_extent(kernel)
        index_dtype = dtypes.int32 if largest <= INT32_LIMIT else dtypes.int64
        self.name, self.index_dtype, self.shape, self.factors = name, index_dtype, shape, factors
        self.builder = builder = Builder()
        self.lowerer = Lowerer(kernel, builder, index_dtype, reduce_lanes)
        tile_counts = tuple(-(-extent // factor) for extent, factor in zip(shape, factors))
        if row_loop(kernel):
            loop = (len(shape) - 1, tile_counts[-1])
        loop_axis, loop_tiles = loop if loop is not None and loop[1] > 1 else (None, 1)
        global_shape = tuple(-(-count // loop_tiles) if axis == loop_axis else count
                             for axis, count in enumerate(tile_counts))
        self.global_size = prod(global_shape)
        global_id = builder.global_id(max(self.global_size, 1), index_dtype)
        axis_order = order if order is not None else tuple(range(len(shape)))
        ordered_strides = strides_of(tuple(global_shape[axis] for axis in axis_order))
        tile_origin = [builder.const(0, index_dtype)] * len(shape)
        for position, (axis, stride) in enumerate(zip(axis_order, ordered_strides)):
            extent = global_shape[axis]
            if extent != 1:
                quotient = builder.div(global_id, stride)
                tile_origin[axis] = quotient if position == 0 else builder.mod(quotient, extent)
        self.loop_ranges: tuple[IRNode, ...] = ()
        if loop_axis is not None:
            loop_range = builder.new_range(loop_tiles, index_dtype)
            tile = builder.add(builder.mul(tile_origin[loop_axis], loop_tiles), loop_range)
            tile_origin[loop_axis] = builder.at_most(tile, tile_counts[loop_axis] - 1)
            self.loop_ranges = (loop_range,)
        self.tile_origin = tile_origin
        tiled = [factor for factor in factors if factor > 1]
        self.row_length = tiled[-1] if tiled else 1  # the outputs of a row: the last tiled dim's factor
        self.offsets = itertools.product(*(range(factor) for factor in factors))  # the tile's order
        self.stores: list[IRNode] = []

    def first_row(self) -> KernelIR:
        """The kernel IR of the tile's first row alone (the same nodes as those outputs of the whole tile)."""
        return self.first_outputs(self.row_length)

    def first_outputs(self, count: int) -> KernelIR:
        """The kernel IR of the tile's first `count` outputs alone (the same nodes as those outputs of the whole
        tile; lowering goes on from them)."""
        self._lower(count - len(self.stores))
        return self._kernel_ir(self.stores[:count])

    def whole(self) -> KernelIR:
        """The kernel IR of the whole tile."""
        self._lower(None)
        return self._kernel_ir(self.stores)

    def _lower(self, count: int | None) -> None:
        """Lower the next `count` outputs of the tile (None: all that are left)."""
        builder, factors, shape = self.builder, self.factors, self.shape
        for offsets in itertools.islice(self.offsets, count if count is None else max(count, 0)):
            index = tuple(
                builder.at_most(builder.add(builder.mul(origin, factor), offset), extent - 1) if factor > 1
                else origin for origin, factor, offset, extent in zip(self.tile_origin, factors, offsets, shape)
            )
            self.stores.append(self.lowerer.store_output(index))

    def _kernel_ir(self, stores: list[IRNode]) -> KernelIR:
        builder = self.builder
        sink = builder.sink([builder.loop(stores, self.loop_ranges)] if self.loop_ranges else stores)
        return KernelIR(name=self.name, params=self.lowerer.buffer_params(), global_size=self.global_size,
                        sink=sink, index_dtype=self.index_dtype, lane_groups=tuple(self.lowerer.lane_groups))


def symbolic_strides(builder: Builder, shape: tuple[int | IRNode, ...]) -> tuple[int | IRNode, ...]:
    """Row-major strides of a shape whose sizes may be nodes (sizes known at launch): ints while every later size
    is one, then nodes."""
    strides: list[int | IRNode] = []
    stride: int | IRNode = 1
    for size in reversed(shape):
        strides.append(stride)
        if isinstance(size, IRNode):
            stride = builder.mul(size, stride) if isinstance(stride, IRNode) or stride != 1 else size
        elif isinstance(stride, IRNode):
            stride = builder.mul(stride, size) if size != 1 else stride
        else:
            stride = stride * size
    return tuple(reversed(strides))


def lower_shape_class(kernel: Kernel, name: str, variables: int) -> KernelIR:
    """The kernel IR of a shape class (ir/shape_class.py): `kernel`'s sizes known only at launch are SizeVariable
    values (ints no real size equals, so lowering's decisions by comparing sizes hold for every size of the class;
    arithmetic on them raises). They become loads from one more parameter, after the inputs: the int32 sizes (element
    0 the global size, element k + 1 variable k), which also bound the work items. Every work item computes one
    output (a whole row where a reduce is fused by rows: kernel.row_loop); indices are int32."""
    builder = Builder()
    index_dtype = dtypes.int32
    sizes_position = len(kernel.input_sizes) + 1
    sizes = builder.param(sizes_position, index_dtype, False)
    nodes = [builder.load(sizes, builder.const(number + 1, index_dtype), None) for number in range(variables)]

    def value(size: int) -> int | IRNode:
        return nodes[size.number] if isinstance(size, SizeVariable) else size

    def values(sizes: tuple[int, ...]) -> tuple[Any, ...]:
        return tuple(value(size) for size in sizes)

    def arguments(step: KernelStep) -> Any:
        if step.op in (Op.RESHAPE, Op.EXPAND):
            return values(step.arg)
        if step.op is Op.SHRINK:
            return tuple(values(pair) for pair in step.arg)
        if step.op is Op.PAD:
            return tuple(values(pair) for pair in step.arg[0]), step.arg[1]
        if step.op is Op.CONST and isinstance(step.arg, SizeVariable):
            return value(step.arg)
        return step.arg

    steps = tuple(step._replace(shape=values(step.shape), arg=arguments(step)) for step in kernel.steps)
    symbolic = Kernel(steps, kernel.input_sizes)
    lowerer = Lowerer(symbolic, builder, index_dtype)
    shape = symbolic.output.shape
    whole_rows = row_loop(kernel)  # (decided on the SizeVariable sizes, which compare)
    global_shape = shape[:-1] + (1,) if whole_rows else shape
    global_id = builder.global_id(RUNTIME_SIZE_ESTIMATE, index_dtype, bounded=False)
    origin: list[IRNode] = [builder.const(0, index_dtype)] * len(shape)
    first = True
    for axis, (extent, stride) in enumerate(zip(global_shape, symbolic_strides(builder, global_shape))):
        if extent != 1:
            quotient = builder.div(global_id, stride)
            origin[axis] = quotient if first else builder.mod(quotient, extent)
            first = False
    loop_ranges: tuple[IRNode, ...] = ()
    if whole_rows:
        row: int | IRNode = shape[-1]
        origin[-1] = size_range(builder, row, index_dtype)
        loop_ranges = (origin[-1],)
    output = symbolic.output
    output_param = lowerer.param(0, output.dtype, True)
    index = tuple(origin)
    result = lowerer.lower(len(steps) - 1, index, None)
    if result.dtype != output.dtype:
        result = builder.alu(Op.CAST, output.dtype, result)
    linear = builder.const(0, index_dtype)
    for axis_index, stride, extent in zip(index, symbolic_strides(builder, shape), shape):
        if extent != 1:
            linear = builder.add(builder.mul(axis_index, stride), linear)
    stores = [builder.store(output_param, linear, result)]
    sink = builder.sink([builder.loop(stores, loop_ranges)] if loop_ranges else stores)
    input_dtypes = {step.arg: step.dtype for step in kernel.steps if step.op is Op.BUFFER}
    params = [BufferParam(0, output.dtype, 0, True)]  # (element counts differ from launch to launch)
    params += [BufferParam(position, input_dtypes[position], 0, False)
               for position in range(1, len(kernel.input_sizes) + 1)]
    params.append(BufferParam(sizes_position, index_dtype, variables + 1, False))
    return KernelIR(name=name, params=params, global_size=RUNTIME_SIZE_ESTIMATE, sink=sink, index_dtype=index_dtype,
                    size_parameter=sizes_position)
