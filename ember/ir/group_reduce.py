"""Workgroup reductions: a kernel whose reduces are long rows, with few rows, gives each row to one workgroup.

One work item per output reducing its row alone leaves a GPU mostly idle when there are few rows (a 4096 x 4096
softmax has 4096 work items) and reads memory with a stride of a row between neighbouring items. Here each output
row is one group of `local_size` work items: item l reduces elements l, l + L, l + 2L, ... (neighbours read
neighbouring elements), then the group combines the items' partial results in local memory (GROUP_REDUCE: a tree
between barriers). A kernel fused by rows (softmax, log_softmax, layer and rms norm: ir/kernel.row_loop) computes its
row reduces that way once per group and then writes the row, item l the same columns l, l + L, ... The choice reads
only DeviceInfo (warps, local memory, the largest group, the compute units), never a backend's name: a device
without warps or local memory (the c backend, lavapipe, the dummy devices) never gets these kernels.
"""

from __future__ import annotations

from ember.capabilities import DeviceInfo
from ember.core import dtype as dtypes
from ember.core.ops import REDUCE_OPS, Op
from ember.core.shapes import prod, strides_of
from ember.ir.ir import Builder, IRNode, IROp, KernelIR, topological_nodes
from ember.ir.kernel import Kernel, KernelStep, nested_reduce, row_loop
from ember.ir.lower import INT32_LIMIT, UNROLLED_ROW_STEPS, Lowerer, compute_dtype

MINIMUM_ROW = 256  # reduced elements per output from which a row is given to a whole group
MAXIMUM_LOCAL_SIZE = 256  # work items per group at most (a power of two)
MINIMUM_LOCAL_SIZE = 32  # a device whose groups are smaller gets no group kernels
# what each group reduce keeps in local memory: one value per work item, 8 bytes at most
GROUP_DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.uint32, dtypes.uint64})
GROUPS_PER_COMPUTE_UNIT = 4  # first-stage groups of a long full reduce per compute unit (at least)
ITEM_ELEMENTS = 64  # elements a work item of a first-stage group reduces serially (at most)
TILE_SHARING = 8  # outputs an operand's load feeds from which a kernel is a matmul's (register tiles, no groups)
# a matmul's shape keeps its register tiles from this many outputs per compute unit; with fewer, tiles of several
# outputs each leave most units idle and a group per output reduces its row instead (a layer norm's weight gradient:
# 64 outputs, each a sum over the batch and sequence of the output's gradient times the normalized input, whose
# per-row mean and deviation every output reads, took 2 ms on an H100 as one serial loop per output)
TILED_OUTPUTS_PER_UNIT = 4


def reduces_by_groups(info: DeviceInfo) -> bool:
    """Whether a device gets workgroup reductions at all: warps, local memory, and groups of MINIMUM_LOCAL_SIZE."""
    return info.warp_width > 1 and info.local_memory_bytes > 0 and info.max_local_size >= MINIMUM_LOCAL_SIZE


def largest_local_size(info: DeviceInfo) -> int:
    """The largest power-of-two group size up to MAXIMUM_LOCAL_SIZE the device runs."""
    return 1 << (min(info.max_local_size, MAXIMUM_LOCAL_SIZE).bit_length() - 1)


def choose_local_size(kernel: Kernel, info: DeviceInfo) -> int | None:
    """The local size to lower `kernel` with as a workgroup kernel, or None for the ordinary lowering. A kernel
    qualifies when every reduce in it reduces the last axis of its source, one axis of at least MINIMUM_ROW
    elements (the same length for all), in a dtype of GROUP_DTYPES, and it either stores one value per row or is
    fused by rows; a matmul-like kernel (one reduce over broadcast inputs) keeps its tiles. The device must have
    warps (DeviceInfo.warp_width > 1: a GPU; on lavapipe, a CPU of 2 cores, group kernels for 64 to 4096 rows of
    4096 took 0.9-1.05x the time of softmax, 2.5-3.6x of a sum and 1.4-1.7x of layer norm, its barriers being
    costly), local memory for the
    reduces' values and groups of MINIMUM_LOCAL_SIZE work items or more, and fewer rows than it runs work items at
    once (compute units x largest group): with more, one work item per row already fills it."""
    if not reduces_by_groups(info):
        return None
    reduces = [step for step in kernel.steps if step.op in REDUCE_OPS]
    if not reduces or nested_reduce(kernel):  # (a reduce in another's loop: the group's barriers are never in one)
        return None
    lengths = set()
    for step in reduces:
        source_shape = kernel.steps[step.srcs[0]].shape
        if (not source_shape or step.arg != (len(source_shape) - 1,) or compute_dtype(step.dtype) not in GROUP_DTYPES
                or any(not isinstance(size, int) for size in source_shape)):
            return None
        lengths.add(source_shape[-1])
    if len(lengths) != 1 or min(lengths) < MINIMUM_ROW:
        return None
    whole_rows = row_loop(kernel)
    shape = kernel.output.shape
    if (not whole_rows and len(reduces) == 1 and prod(shape) >= max(1, info.compute_units) * TILED_OUTPUTS_PER_UNIT
            and _shares_loads_between_outputs(kernel, reduces[0])):
        return None  # a matmul: its outputs share loads, which register tiles use (enough of them to fill the device)
    groups = prod(shape[:-1]) if whole_rows else prod(shape)
    if groups < 1 or groups >= max(1, info.compute_units) * info.max_local_size:
        return None  # rows enough to fill the device with one work item each (a CPU's few cores: always)
    local_size = largest_local_size(info)
    while local_size >= MINIMUM_LOCAL_SIZE and len(reduces) * local_size * 8 > info.local_memory_bytes:
        local_size //= 2
    if local_size < MINIMUM_LOCAL_SIZE or groups * local_size > info.max_global_size:
        return None
    return local_size


def _shares_loads_between_outputs(kernel: Kernel, reduce: KernelStep) -> bool:
    """Whether the kernel is a matmul's shape, whose register tiles pay: a load that changes along the reduced
    elements and is the same for TILE_SHARING or more outputs (an output dim its index does not depend on), so that
    each load feeds several outputs. A value constant along each row (a variance's mean) or an operand read for two
    outputs only (a sum and a sum of squares stacked) shares nothing a tile would keep: the kernel's rows go to
    groups like any other's (a variance over 784 or 12,544 elements per row was one serial float32 loop per
    output). Found by lowering the reduce's value at symbolic output and reduced indices (as ir/group_matmul.py
    does); a kernel that cannot be lowered so counts as a matmul's."""
    from ember.ir.group_matmul import ReduceReplaced, output_and_depth_ranges

    shape = kernel.output.shape
    source_shape = kernel.steps[reduce.srcs[0]].shape
    builder = Builder()
    place, depth = output_and_depth_ranges(builder, shape, source_shape[-1])
    lowerer = ReduceReplaced(kernel, builder, depth, builder.param(-1, dtypes.float32, False))
    lowerer.lower(len(kernel.steps) - 1, place, None)
    if len(lowerer.reduced) != 1 or lowerer.reduced[0] is None:
        return True
    for node in topological_nodes(lowerer.reduced[0]):
        if node.op is not IROp.LOAD:
            continue
        depends = {id(index) for index in node.srcs[1:] for index in topological_nodes(index)}
        if id(depth) in depends:
            shared = prod([extent for axis, extent in enumerate(shape) if id(place[axis]) not in depends])
            if shared >= TILE_SHARING:
                return True
    return False


def stages_for_parallelism(extent: int, outputs: int, dtype: dtypes.DType, info: DeviceInfo) -> bool:
    """Whether a reduce short enough to be one primitive on a CPU (core/staged_reduce.STAGE_THRESHOLD elements per
    output or fewer) is still recorded in stages on this device, for its workgroups: the device reduces rows by
    groups, the reduce is at least 2 * MINIMUM_ROW elements per output, and its outputs are fewer than the work
    items the device runs at once, so one work item per output reducing its elements alone would leave it mostly
    idle. On an H100 a layer norm's weight gradient (64 outputs of 4,096 elements, over the batch and sequence
    axes) took 2 ms so, and a sum of squares of 16,384 values (one output) 0.27 ms."""
    return (reduces_by_groups(info) and extent >= 2 * MINIMUM_ROW and compute_dtype(dtype) in GROUP_DTYPES
            and outputs < max(1, info.compute_units) * info.max_local_size)


def group_stage_extents(extent: int, outputs: int, dtype: dtypes.DType, info: DeviceInfo) -> list[int] | None:
    """The elements each stage of a long reduce (`extent` elements for each of `outputs` outputs) reduces per row on
    a device that reduces rows by workgroups: a full reduction in two steps, partials per group (rows of at most
    ITEM_ELEMENTS per work item, enough groups to give every compute unit GROUPS_PER_COMPUTE_UNIT), then one group
    per output for the partials (a third step only past local size x ITEM_ELEMENTS partials). None where the device
    has no workgroup reductions (`choose_local_size`'s conditions) or the first stage's rows would be too many for
    them: the caller keeps its short stages (core/staged_reduce.py)."""
    if not reduces_by_groups(info) or compute_dtype(dtype) not in GROUP_DTYPES or extent < 2 * MINIMUM_ROW:
        return None
    row_limit = largest_local_size(info) * ITEM_ELEMENTS
    groups = max(1, GROUPS_PER_COMPUTE_UNIT * max(1, info.compute_units) // max(1, outputs))
    extents = []
    while extent > row_limit:
        # rows of MINIMUM_ROW elements or more (the group kernels' own condition), as many as fill the device
        parts = min(max(groups, -(-extent // row_limit)), extent // MINIMUM_ROW)
        if parts * outputs >= max(1, info.compute_units) * info.max_local_size:
            return None  # rows enough for one work item each: choose_local_size would not group them
        chunk = -(-extent // parts)
        extents.append(chunk)
        extent = -(-extent // chunk)
        groups = 1
    extents.append(extent)
    return extents


def lower_group_kernel(kernel: Kernel, name: str, local_size: int, warp_width: int = 1) -> KernelIR:
    """The kernel IR of a workgroup kernel (see the module's docstring): one group of `local_size` work items per
    output, or per output row of a kernel fused by rows, whose work items store the row's columns l, l + L, ...
    (the last step's columns past the row's end clamped to its last column, stored again with the same value).
    Rows of at most UNROLLED_ROW_STEPS elements per item are unrolled: the row's reduces and its stores read the
    same loads, each element read from memory once and kept in registers."""
    shape = kernel.output.shape
    largest = max((prod(shape), *kernel.input_sizes, *(prod(step.shape) for step in kernel.steps)), default=0)
    index_dtype = dtypes.int32 if largest + local_size <= INT32_LIMIT else dtypes.int64  # (items past a row's end)
    builder = Builder()
    local_id = builder.local_id(local_size, index_dtype)
    lowerer = Lowerer(kernel, builder, index_dtype, group=(local_id, local_size))
    whole_rows = row_loop(kernel)
    group_shape = shape[:-1] + (1,) if whole_rows else shape
    groups = max(prod(group_shape), 1)
    group_id = builder.group_id(groups, index_dtype)
    origin: list[IRNode] = [builder.const(0, index_dtype)] * len(shape)
    first = True
    for axis, (extent, stride) in enumerate(zip(group_shape, strides_of(group_shape))):
        if extent != 1:
            quotient = builder.div(group_id, stride)
            origin[axis] = quotient if first else builder.mod(quotient, extent)
            first = False
    loop_ranges: tuple[IRNode, ...] = ()
    origins = [origin]
    if whole_rows:
        length = shape[-1]
        steps = -(-length // local_size)
        if steps <= UNROLLED_ROW_STEPS:  # the columns one by one: the loads the row's reduces made, reused
            origins = [[*origin[:-1], builder.at_most(builder.add(local_id, number * local_size), length - 1)]
                       for number in range(steps)]
        else:
            column_range = builder.new_range(steps, index_dtype)
            origin[-1] = builder.at_most(builder.add(builder.mul(column_range, local_size), local_id), length - 1)
            loop_ranges = (column_range,)
    stores = [lowerer.store_output(tuple(place)) for place in origins]
    sink = builder.sink([builder.loop(stores, loop_ranges)] if loop_ranges else stores)
    return KernelIR(name=name, params=lowerer.buffer_params(), global_size=groups * local_size, sink=sink,
                    index_dtype=index_dtype, local_size=local_size,
                    warp_width=warp_width if local_size % warp_width == 0 else 1)


def group_reduce_count(kernel: KernelIR) -> int:
    """How many GROUP_REDUCE nodes a kernel has (each one local array and its barriers)."""
    return sum(1 for node in topological_nodes(kernel.sink) if node.op is IROp.GROUP_REDUCE)

