"""Workgroup-tiled matmuls: on a device with local memory and warps, a matmul-like kernel (one sum over the product of
two broadcast factors) gives each group a BM x BN tile of its output, and the group loops over the reduced axis K in
steps of BK: per step its work items copy the A tile (BM x BK) and the B tile (BK x BN) into local memory together,
wait at a barrier, and each accumulates a TM x TN register tile from local memory (every value a work item reads
there is shared by TM or TN of its outputs, and every value a group loads from global memory by BM or BN outputs);
a work item's rows and columns are BM/TM and BN/TN apart, so neighbouring items read neighbouring tile elements and
store neighbouring outputs.

The factors are whatever the kernel computes before its reduce (an elementwise prologue, a view, a half-precision
load converted to float32): each is computed while its tile is filled, at its (row, k) or (k, column), and stored as
float32. Sizes that are not multiples of the tile: rows and columns past the end are clamped to the last one (they
recompute its value, stored again with the same bits), and k past the end fills both tiles with 0 (0 x 0 adds +0).
The output's other axes (a batch) are a further split of the groups; the epilogue (bias, activation) is lowered at
each output of the register tile with the accumulator as the reduce's value. Only DeviceInfo chooses it (warps,
local memory, the largest group, the compute units), never a backend's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.capabilities import DeviceInfo
from ember.core import dtype as dtypes
from ember.core.ops import REDUCE_OPS, Op
from ember.core.shapes import prod, strides_of
from ember.ir.ir import Builder, IRNode, IROp, KernelIR, topological_nodes
from ember.ir.kernel import Kernel, KernelStep, row_loop
from ember.ir.lower import INT32_LIMIT, Lowerer, Lowering

MINIMUM_SIDE = 16  # the output's rows and columns from which a matmul is tiled in local memory
MINIMUM_DEPTH = 8  # elements summed per output from which it is
TILE_DEPTH = 16  # BK: the reduced elements each step of the group's loop copies to local memory
REGISTER_TILE = 4  # TM = TN: the outputs a work item computes along each of the two axes
GROUP_TILES = (64, 32)  # BM = BN, the largest first: the output tile of a group


@dataclass(frozen=True)
class MatmulTiles:
    """The shape of a workgroup-tiled matmul: the output axes of A's rows and B's columns, the reduced length, and
    the tiles (a group's `block` x `block` outputs, `depth` reduced elements a step, `register` x `register`
    outputs a work item)."""

    row_axis: int
    column_axis: int
    depth_length: int
    block: int
    depth: int = TILE_DEPTH
    register: int = REGISTER_TILE

    @property
    def local_size(self) -> int:
        return (self.block // self.register) ** 2

    @property
    def local_bytes(self) -> int:
        return 2 * self.block * self.depth * 4  # both tiles, float32


class _ReduceReplaced(Lowerer):
    """Lowers a kernel with its one reduce replaced by `result`, recording the value the reduce sums at the reduced
    index `depth_index` (None where the reduce is not one axis, or is reached under a mask; nothing recorded where
    `depth_index` is None: the epilogue)."""

    def __init__(self, kernel: Kernel, builder: Builder, depth_index: IRNode | None, result: IRNode) -> None:
        super().__init__(kernel, builder, dtypes.int32)
        self.depth_index = depth_index
        self.result = result
        self.reduced: list[IRNode | None] = []

    def _lower_reduce(self, position: int, step: KernelStep, index: tuple[IRNode, ...],
                      valid: IRNode | None) -> Lowering:
        if self.depth_index is None:
            return self.result
        source_shape = self.steps[step.srcs[0]].shape
        axes = [axis for axis in step.arg if source_shape[axis] != 1]
        if len(axes) == 1 and valid is None:
            value = yield from self._reduced_value(step, index, {axes[0]: self.depth_index}, valid)
            self.reduced.append(value)
        else:
            self.reduced.append(None)
        return self.result


def _reduced_product(kernel: Kernel, builder: Builder, place: tuple[IRNode, ...], depth: IRNode,
                     result: IRNode) -> tuple[IRNode | None, IRNode]:
    """(the product the kernel's reduce sums at output `place` and reduced index `depth`, or None where it is not one
    product of two float32 factors; the output's value there with the reduce's value `result`)."""
    lowerer = _ReduceReplaced(kernel, builder, depth, result)
    value = lowerer.lower(len(kernel.steps) - 1, place, None)
    product = lowerer.reduced[0] if len(lowerer.reduced) == 1 else None
    if product is None or product.op is not Op.MUL or product.width != 1 or product.dtype != dtypes.float32:
        return None, value
    return product, value


def matmul_tiles(kernel: Kernel, info: DeviceInfo) -> MatmulTiles | None:
    """The tiles to lower `kernel` with as a workgroup-tiled matmul, or None for the ordinary lowering. The kernel
    qualifies when its one reduce is a float32 sum (float16 and bfloat16 inputs are summed in float32) over one axis
    of at least MINIMUM_DEPTH elements of a product whose factors each depend on the reduced index and on an
    output axis the other does not (A's rows, B's columns, each at least MINIMUM_SIDE); the device must have warps,
    local memory for both tiles and groups of the tile's work items. The largest tile that still gives every compute
    unit a group is chosen (else the smallest that fits)."""
    if info.warp_width <= 1 or info.local_memory_bytes <= 0:
        return None
    reduces = [step for step in kernel.steps if step.op in REDUCE_OPS]
    shape = kernel.output.shape
    if (len(reduces) != 1 or reduces[0].op is not Op.SUM or row_loop(kernel) or len(shape) < 2
            or any(not isinstance(size, int) for step in kernel.steps for size in step.shape)):
        return None
    largest = max((prod(shape), *kernel.input_sizes, *(prod(step.shape) for step in kernel.steps)), default=0)
    if largest + 4 * max(GROUP_TILES) > INT32_LIMIT:
        return None
    source_shape = kernel.steps[reduces[0].srcs[0]].shape
    reduced = [source_shape[axis] for axis in reduces[0].arg if source_shape[axis] != 1]
    if len(reduced) != 1 or reduced[0] < MINIMUM_DEPTH:
        return None
    builder = Builder()
    place = tuple(builder.new_range(extent, dtypes.int32) if extent != 1 else builder.const(0, dtypes.int32)
                  for extent in shape)
    depth = builder.new_range(reduced[0], dtypes.int32)
    product, _ = _reduced_product(kernel, builder, place, depth, builder.param(-1, dtypes.float32, False))
    if product is None:
        return None
    first, second = ({id(node) for node in topological_nodes(factor)} for factor in product.srcs)
    if id(depth) not in first or id(depth) not in second:
        return None
    rows = [axis for axis, node in enumerate(place) if id(node) in first and id(node) not in second]
    columns = [axis for axis, node in enumerate(place) if id(node) in second and id(node) not in first]
    if not rows or not columns or shape[rows[-1]] < MINIMUM_SIDE or shape[columns[-1]] < MINIMUM_SIDE:
        return None
    row_axis, column_axis = rows[-1], columns[-1]
    fitting = [block for block in GROUP_TILES
               if (block // REGISTER_TILE) ** 2 <= info.max_local_size
               and 2 * block * TILE_DEPTH * 4 <= info.local_memory_bytes]
    if not fitting:
        return None
    batches = prod(shape) // (shape[row_axis] * shape[column_axis])
    for block in fitting:
        groups = batches * -(-shape[row_axis] // block) * -(-shape[column_axis] // block)
        if groups >= max(1, info.compute_units) or block == fitting[-1]:
            return MatmulTiles(row_axis, column_axis, reduced[0], block)
    return None


def lower_matmul_kernel(kernel: Kernel, name: str, tiles: MatmulTiles, warp_width: int = 1) -> KernelIR | None:
    """The kernel IR of a workgroup-tiled matmul (see the module's docstring), or None where lowering the factors at
    the tiles' places does not give the product `matmul_tiles` found."""
    shape = kernel.output.shape
    block, depth_step, register = tiles.block, tiles.depth, tiles.register
    rows, columns, length = shape[tiles.row_axis], shape[tiles.column_axis], tiles.depth_length
    items_along = block // register
    local_size = items_along * items_along
    builder = Builder()
    index = dtypes.int32
    local_id = builder.local_id(local_size, index)
    row_tiles, column_tiles = -(-rows // block), -(-columns // block)
    batch_axes = [axis for axis, extent in enumerate(shape)
                  if extent != 1 and axis not in (tiles.row_axis, tiles.column_axis)]
    batch_shape = tuple(shape[axis] for axis in batch_axes)
    groups = prod(batch_shape) * row_tiles * column_tiles
    group_id = builder.group_id(groups, index)
    column_origin = builder.mul(builder.mod(group_id, column_tiles), block)
    row_origin = builder.mul(builder.mod(builder.div(group_id, column_tiles), row_tiles), block)
    batch = builder.div(group_id, column_tiles * row_tiles)
    origin: list[IRNode] = [builder.const(0, index)] * len(shape)
    for position, (axis, stride) in enumerate(zip(batch_axes, strides_of(batch_shape))):
        quotient = builder.div(batch, stride)
        origin[axis] = quotient if position == 0 else builder.mod(quotient, shape[axis])

    def placed(row: IRNode, column: IRNode) -> tuple[IRNode, ...]:
        place = list(origin)
        place[tiles.row_axis], place[tiles.column_axis] = row, column
        return tuple(place)

    # the loop over K: a barrier first (the last step's reads are done), the tiles filled, a barrier
    step = builder.new_range(-(-length // depth_step), index)
    depth_origin = builder.mul(step, depth_step)
    a_tile = builder.define_shared(dtypes.float32, block * depth_step)
    b_tile = builder.define_shared(dtypes.float32, depth_step * block)
    free = builder.barrier([step])
    fills = []
    # A's tile: element e (row e // BK, k e % BK); B's: element e (k e // BN, column e % BN); each item copies
    # every local_size-th element from its own on (neighbours read neighbours along the tile's rows)
    for tile, factor, across in ((a_tile, 0, depth_step), (b_tile, 1, block)):
        target = builder.after(tile, [free])
        unused = builder.new_range(columns if factor == 0 else rows, index)  # the other factor's axis
        for number in range(block * depth_step // local_size):
            element = builder.add(local_id, number * local_size)
            quotient, remainder = builder.div(element, across), builder.mod(element, across)
            along, depth = (quotient, remainder) if factor == 0 else (remainder, quotient)
            along_origin = row_origin if factor == 0 else column_origin
            clamped = builder.at_most(builder.add(along_origin, along), (rows if factor == 0 else columns) - 1)
            unclamped = builder.add(depth_origin, depth)
            place = placed(clamped, unused) if factor == 0 else placed(unused, clamped)
            product, _ = _reduced_product(kernel, builder, place, builder.at_most(unclamped, length - 1),
                                          builder.param(-1, dtypes.float32, False))
            if product is None:
                return None
            value = product.srcs[factor]
            if id(unused) in {id(node) for node in topological_nodes(value)}:
                return None
            if length % depth_step:
                value = builder.alu(Op.WHERE, dtypes.float32, builder.less(unclamped, length), value,
                                    builder.const(0.0, dtypes.float32))
            fills.append(builder.store(target, element, value))
    filled = builder.barrier(fills)
    a_ready, b_ready = builder.after(a_tile, [filled]), builder.after(b_tile, [filled])
    inner = builder.new_range(depth_step, index)
    # item (r, c) computes rows r, r + BM/TM, ... and columns c, c + BN/TN, ...: neighbouring items read
    # neighbouring elements of B's tile (no bank conflicts) and store neighbouring outputs (coalesced)
    item_rows = [builder.add(builder.div(local_id, items_along), offset * items_along) for offset in range(register)]
    item_columns = [builder.add(builder.mod(local_id, items_along), offset * items_along)
                    for offset in range(register)]
    a_values = [builder.load(a_ready, builder.add(builder.mul(item_row, depth_step), inner), None)
                for item_row in item_rows]
    b_values = [builder.load(b_ready, builder.add(builder.mul(inner, block), item_column), None)
                for item_column in item_columns]
    stores = []
    for row_offset in range(register):
        for column_offset in range(register):
            product = builder.alu(Op.MUL, dtypes.float32, a_values[row_offset], b_values[column_offset])
            accumulator = builder.reduce(Op.SUM, product, (step, inner))
            row = builder.at_most(builder.add(row_origin, item_rows[row_offset]), rows - 1)
            column = builder.at_most(builder.add(column_origin, item_columns[column_offset]), columns - 1)
            place = placed(row, column)
            # the epilogue: the output's value there, the accumulator as the reduce's value
            lowerer = _ReduceReplaced(kernel, builder, None, accumulator)
            stores.append(lowerer.store_output(place))
    params = lowerer.buffer_params()
    return KernelIR(name=name, params=params, global_size=groups * local_size, sink=builder.sink(stores),
                    index_dtype=index, local_size=local_size,
                    warp_width=warp_width if local_size % max(warp_width, 1) == 0 else 1)


def is_tiled_matmul(kernel: KernelIR) -> bool:
    """Whether a lowered kernel is a workgroup-tiled matmul (it shares tiles in local memory)."""
    return kernel.local_size is not None and any(
        node.op is IROp.DEFINE_SHARED for node in topological_nodes(kernel.sink))

