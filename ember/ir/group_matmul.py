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

On a device whose matrix units (DeviceInfo.matrix_dtypes: tensor cores) multiply the inputs' half dtype, and whose
factors are those halves as loaded, the group is four warps of mma.m16n8k16 steps instead (`_lower_matrix_kernel`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.capabilities import DeviceInfo
from ember.core import dtype as dtypes
from ember.core.ops import REDUCE_OPS, Op
from ember.core.shapes import prod, strides_of
from ember.ir.ir import Builder, IRNode, IROp, KernelIR, topological_nodes
from ember.ir.kernel import Kernel, KernelStep, row_loop
from ember.ir.lower import INT32_LIMIT, Lowerer, Lowering, index_extent

MINIMUM_SIDE = 16  # the output's rows and columns from which a matmul is tiled in local memory
MINIMUM_DEPTH = 8  # elements summed per output from which it is
TILE_DEPTH = 16  # BK: the reduced elements each step of the group's loop copies to local memory
REGISTER_TILE = 4  # TM = TN: the outputs a work item computes along each of the two axes
# a product too small to give the device this many work items per compute unit with REGISTER_TILE takes register
# tiles of SMALL_REGISTER_TILE, four times the work items (char_lstm's 64 x 512 gate matmul on an H100: 2,048 work
# items of 16 outputs for 132 SMs, 25 us a step; each item's loop is latency-bound, not bound by its loads)
WORK_ITEMS_PER_UNIT = 256
SMALL_REGISTER_TILE = 2
GROUP_TILES = (128, 64, 32)  # BM = BN, the largest first: the output tile of a group
# TM = TN of a block where it is not REGISTER_TILE: a 128x128 tile's items compute 8x8 outputs (256 items, as 64x64's
# with 4x4), reading 16 values of the tiles for 64 multiply-adds a k instead of 8 for 16 (a 4096^2 float32 matmul on
# an H100 ran at 19 TFLOP/s in 64x64 tiles, cuBLAS 51)
BLOCK_REGISTER_TILES = {128: 8}
# on matrix units (DeviceInfo.matrix_dtypes): a group of 4 warps computes 64x64 outputs, each warp 32x32 as 2 x 4
# steps of mma.m16n8k16 (A 16x16, B 16x8) a K step of 16; the tiles hold the half values
MATRIX_BLOCK = 64
MATRIX_WARPS = 4
WARP = 32
HALF_TYPES = (dtypes.float16, dtypes.bfloat16)


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
    matrix: dtypes.DType | None = None  # the half inputs' dtype where the device's matrix units multiply them

    @property
    def local_size(self) -> int:
        return MATRIX_WARPS * WARP if self.matrix is not None else (self.block // self.register) ** 2


class ReduceReplaced(Lowerer):
    """Lowers a kernel with its one reduce replaced by `result`, recording the value the reduce sums at the reduced
    index `depth_index` (a tuple: one index per reduced axis of more than one element, in the axes' order; None
    recorded where the reduce's axes do not match, or it is reached under a mask; nothing recorded where
    `depth_index` is None: the epilogue)."""

    def __init__(self, kernel: Kernel, builder: Builder, depth_index: IRNode | tuple[IRNode, ...] | None,
                 result: IRNode) -> None:
        super().__init__(kernel, builder, dtypes.int32)
        self.depth_index = (depth_index,) if isinstance(depth_index, IRNode) else depth_index
        self.result = result
        self.reduced: list[IRNode | None] = []

    def _lower_reduce(self, position: int, step: KernelStep, index: tuple[IRNode, ...],
                      valid: IRNode | None) -> Lowering:
        if self.depth_index is None:
            return self.result
        source_shape = self.steps[step.srcs[0]].shape
        axes = [axis for axis in sorted(step.arg) if source_shape[axis] != 1]
        if len(axes) == len(self.depth_index) and valid is None:
            value = yield from self._reduced_value(step, index, dict(zip(axes, self.depth_index)), valid)
            self.reduced.append(value)
        else:
            self.reduced.append(None)
        return self.result


def one_sum_axis(kernel: Kernel, minimum_depth: int) -> int | None:
    """The length of the one axis the kernel's one reduce sums, for a kernel of at least two output axes, sizes
    known at compile time and no row loop whose reduce is a SUM over one axis (others of length 1) of at least
    `minimum_depth` elements; None for any other kernel (what a matmul-like kernel must be, here and in
    ir/packed_matmul.py)."""
    reduced = sum_axes(kernel, minimum_depth)
    return reduced[0] if reduced is not None and len(reduced) == 1 else None


def sum_axes(kernel: Kernel, minimum_depth: int) -> tuple[int, ...] | None:
    """The lengths of the axes (of more than one element, in order) the kernel's one reduce sums, for a kernel as
    one_sum_axis asks for whose reduce is a SUM over one axis or several (a convolution's channels and filter
    offsets) of at least `minimum_depth` elements in all; None for any other kernel."""
    reduces = [step for step in kernel.steps if step.op in REDUCE_OPS]
    if (len(reduces) != 1 or reduces[0].op is not Op.SUM or row_loop(kernel) or len(kernel.output.shape) < 2
            or any(not isinstance(size, int) for step in kernel.steps for size in step.shape)):
        return None
    source_shape = kernel.steps[reduces[0].srcs[0]].shape
    reduced = tuple(source_shape[axis] for axis in sorted(reduces[0].arg) if source_shape[axis] != 1)
    return reduced if reduced and prod(reduced) >= minimum_depth else None


def output_ranges(builder: Builder, shape: tuple[int, ...]) -> tuple[IRNode, ...]:
    """A range per output axis (a constant 0 for an axis of one element)."""
    return tuple(builder.new_range(extent, dtypes.int32) if extent != 1 else builder.const(0, dtypes.int32)
                 for extent in shape)


def output_and_depth_ranges(builder: Builder, shape: tuple[int, ...], depth: int) -> tuple[tuple[IRNode, ...], IRNode]:
    """A range per output axis (a constant 0 for an axis of one element) and one for the reduced axis."""
    return output_ranges(builder, shape), builder.new_range(depth, dtypes.int32)


def reduced_product(kernel: Kernel, builder: Builder, place: tuple[IRNode, ...],
                    depth: IRNode | tuple[IRNode, ...]) -> IRNode | None:
    """The product the kernel's reduce sums at output `place` and reduced index `depth` (an index per reduced axis
    where it sums several), or None where it is not one
    product of two float32 factors (the kernel's output is lowered with a stand-in for the reduce's value, a
    parameter no kernel has, only to reach the reduce as the output reaches it)."""
    lowerer = ReduceReplaced(kernel, builder, depth, builder.param(-1, dtypes.float32, False))
    lowerer.lower(len(kernel.steps) - 1, place, None)
    product = lowerer.reduced[0] if len(lowerer.reduced) == 1 else None
    if product is None or product.op is not Op.MUL or product.width != 1 or product.dtype != dtypes.float32:
        return None
    return product


def matmul_tiles(kernel: Kernel, info: DeviceInfo) -> MatmulTiles | None:
    """The tiles to lower `kernel` with as a workgroup-tiled matmul, or None for the ordinary lowering. The kernel
    qualifies when its one reduce is a float32 sum (float16 and bfloat16 inputs are summed in float32) over one axis
    of at least MINIMUM_DEPTH elements of a product whose factors each depend on the reduced index and on an
    output axis the other does not (A's rows, B's columns, each at least MINIMUM_SIDE); the device must have warps,
    local memory for both tiles and groups of the tile's work items. The largest tile that still gives every compute
    unit a group is chosen (else the smallest that fits), with register tiles of SMALL_REGISTER_TILE where those of
    REGISTER_TILE give fewer than WORK_ITEMS_PER_UNIT work items per compute unit; where both factors are float16
    (or bfloat16) values as loaded and DeviceInfo.matrix_dtypes lists that dtype, with warps of 32, the tiles of the
    matrix units."""
    if info.warp_width <= 1 or info.local_memory_bytes <= 0:
        return None
    shape = kernel.output.shape
    reduced = one_sum_axis(kernel, MINIMUM_DEPTH)
    if reduced is None:
        return None
    # (the indices the tiles compute: the operands' and output's, never the [M, N, K] product's, which no tile
    # linearizes; counting it refused every matmul from M N K = 2**31, 4096 x 4096 x 4096 among them, to
    # one-work-item tiles at a quarter of torch's speed on an H100)
    if index_extent(kernel) + 4 * max(GROUP_TILES) > INT32_LIMIT:
        return None
    builder = Builder()
    place, depth = output_and_depth_ranges(builder, shape, reduced)
    product = reduced_product(kernel, builder, place, depth)
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
    matrix = {_half_load(factor) for factor in product.srcs}
    (half,) = matrix if len(matrix) == 1 else (None,)
    batches = prod(shape) // (shape[row_axis] * shape[column_axis])

    def groups(block: int) -> int:
        return batches * -(-shape[row_axis] // block) * -(-shape[column_axis] // block)

    if (half is not None and half in info.matrix_dtypes and info.warp_width == WARP
            and info.max_local_size >= MATRIX_WARPS * WARP
            and 2 * MATRIX_BLOCK * TILE_DEPTH * half.itemsize <= info.local_memory_bytes
            and groups(MATRIX_BLOCK) * MATRIX_WARPS * WARP <= info.max_global_size):
        return MatmulTiles(row_axis, column_axis, reduced, MATRIX_BLOCK, matrix=half)

    def items(block: int, register: int) -> int:
        return (block // register) ** 2

    fitting = [block for block in GROUP_TILES
               if items(block, _register_tile(block)) <= info.max_local_size
               and 2 * block * TILE_DEPTH * 4 <= info.local_memory_bytes
               and groups(block) * items(block, _register_tile(block)) <= info.max_global_size]
    for block in fitting:
        if groups(block) >= max(1, info.compute_units) or block == fitting[-1]:
            register = _register_tile(block)
            if (groups(block) * items(block, register) < max(1, info.compute_units) * WORK_ITEMS_PER_UNIT
                    and items(block, SMALL_REGISTER_TILE) <= info.max_local_size
                    and groups(block) * items(block, SMALL_REGISTER_TILE) <= info.max_global_size):
                register = SMALL_REGISTER_TILE
            return MatmulTiles(row_axis, column_axis, reduced, block, register=register)
    return None


def _register_tile(block: int) -> int:
    """TM = TN of a work item in a group's `block` x `block` tile (BLOCK_REGISTER_TILES, else REGISTER_TILE)."""
    return BLOCK_REGISTER_TILES.get(block, REGISTER_TILE)


def _half_load(factor: IRNode) -> dtypes.DType | None:
    """The dtype of a factor that is a half value loaded as it is (float16 or bfloat16 converted to float32, which
    matrix units take exactly), or None."""
    if factor.op is Op.CAST and factor.srcs[0].op is IROp.LOAD and len(factor.srcs[0].srcs) == 2 \
            and factor.srcs[0].dtype in HALF_TYPES:
        return factor.srcs[0].dtype
    return None


class _GroupTiles:
    """What both kinds of tiled matmul share: a builder, the group's place in the output (its batch index and the
    origins of its rows and columns), the loop over K in steps of the tile depth, filling the two tiles in local
    memory between barriers, and the epilogue's clamped stores."""

    def __init__(self, kernel: Kernel, tiles: MatmulTiles) -> None:
        self.kernel, self.tiles = kernel, tiles
        shape = kernel.output.shape
        self.rows, self.columns = shape[tiles.row_axis], shape[tiles.column_axis]
        builder = self.builder = Builder()
        index = self.index = dtypes.int32
        self.local_id = builder.local_id(tiles.local_size, index)
        block = tiles.block
        row_tiles, column_tiles = -(-self.rows // block), -(-self.columns // block)
        batch_axes = [axis for axis, extent in enumerate(shape)
                      if extent != 1 and axis not in (tiles.row_axis, tiles.column_axis)]
        batch_shape = tuple(shape[axis] for axis in batch_axes)
        self.groups = prod(batch_shape) * row_tiles * column_tiles
        group_id = builder.group_id(self.groups, index)
        self.column_origin = builder.mul(builder.mod(group_id, column_tiles), block)
        self.row_origin = builder.mul(builder.mod(builder.div(group_id, column_tiles), row_tiles), block)
        batch = builder.div(group_id, column_tiles * row_tiles)
        self.origin: list[IRNode] = [builder.const(0, index)] * len(shape)
        for position, (axis, stride) in enumerate(zip(batch_axes, strides_of(batch_shape))):
            quotient = builder.div(batch, stride)
            self.origin[axis] = quotient if position == 0 else builder.mod(quotient, shape[axis])
        self.step = builder.new_range(-(-tiles.depth_length // tiles.depth), index)  # the loop over K
        self.lowerer: Lowerer | None = None

    def placed(self, row: IRNode, column: IRNode) -> tuple[IRNode, ...]:
        """The output index of (row, column) in this group's batch."""
        place = list(self.origin)
        place[self.tiles.row_axis], place[self.tiles.column_axis] = row, column
        return tuple(place)

    def fill(self, dtype: dtypes.DType, b_transposed: bool) -> tuple[IRNode, IRNode] | None:
        """The two tiles (A's BM x BK row-major; B's BK x BN, or BN x BK where `b_transposed`) in local memory as
        the loads after the step's fill may read them: a barrier (the last step's reads are done), each work item
        copying every local_size-th element from its own on (neighbours read neighbours along the tile's rows of
        global memory: A's k, B's columns), a barrier. None where a factor does not lower as matmul_tiles found."""
        builder, tiles, local_size = self.builder, self.tiles, self.tiles.local_size
        block, depth_step, length = tiles.block, tiles.depth, tiles.depth_length
        depth_origin = builder.mul(self.step, depth_step)
        a_tile = builder.define_shared(dtype, block * depth_step)
        b_tile = builder.define_shared(dtype, depth_step * block)
        free = builder.barrier([self.step])
        fills = []
        for tile, factor, across in ((a_tile, 0, depth_step), (b_tile, 1, block)):
            target = builder.after(tile, [free])
            unused = builder.new_range(self.columns if factor == 0 else self.rows, self.index)  # the other's axis
            for number in range(block * depth_step // local_size):
                element = builder.add(self.local_id, number * local_size)
                quotient, remainder = builder.div(element, across), builder.mod(element, across)
                along, depth = (quotient, remainder) if factor == 0 else (remainder, quotient)
                along_origin = self.row_origin if factor == 0 else self.column_origin
                clamped = builder.at_most(builder.add(along_origin, along),
                                          (self.rows if factor == 0 else self.columns) - 1)
                unclamped = builder.add(depth_origin, depth)
                place = self.placed(clamped, unused) if factor == 0 else self.placed(unused, clamped)
                product = reduced_product(self.kernel, builder, place, builder.at_most(unclamped, length - 1))
                if product is None:
                    return None
                value = product.srcs[factor]
                if id(unused) in {id(node) for node in topological_nodes(value)}:
                    return None
                if length % depth_step:
                    value = builder.alu(Op.WHERE, dtypes.float32, builder.less(unclamped, length), value,
                                        builder.const(0.0, dtypes.float32))
                if dtype != value.dtype:
                    value = builder.alu(Op.CAST, dtype, value)  # (a half value: exact)
                where = builder.add(builder.mul(along, depth_step), depth) if factor == 1 and b_transposed else element
                fills.append(builder.store(target, where, value))
        filled = builder.barrier(fills)
        return builder.after(a_tile, [filled]), builder.after(b_tile, [filled])

    def store(self, value: IRNode, row: IRNode, column: IRNode) -> IRNode:
        """The epilogue at (row, column) of the group's tile, clamped to the last row and column: the output's value
        there with `value` as the reduce's."""
        builder = self.builder
        row = builder.at_most(builder.add(self.row_origin, row), self.rows - 1)
        column = builder.at_most(builder.add(self.column_origin, column), self.columns - 1)
        self.lowerer = ReduceReplaced(self.kernel, builder, None, value)
        return self.lowerer.store_output(self.placed(row, column))

    def kernel_ir(self, name: str, stores: list[IRNode], warp_width: int) -> KernelIR:
        assert self.lowerer is not None
        local_size = self.tiles.local_size
        return KernelIR(name=name, params=self.lowerer.buffer_params(), global_size=self.groups * local_size,
                        sink=self.builder.sink(stores), index_dtype=self.index, local_size=local_size,
                        warp_width=warp_width if local_size % max(warp_width, 1) == 0 else 1)


def lower_matmul_kernel(kernel: Kernel, name: str, tiles: MatmulTiles, warp_width: int = 1) -> KernelIR | None:
    """The kernel IR of a workgroup-tiled matmul (see the module's docstring), or None where lowering the factors at
    the tiles' places does not give the product `matmul_tiles` found."""
    if tiles.matrix is not None:
        return _lower_matrix_kernel(kernel, name, tiles, warp_width)
    group = _GroupTiles(kernel, tiles)
    builder, block, register = group.builder, tiles.block, tiles.register
    ready = group.fill(dtypes.float32, False)
    if ready is None:
        return None
    a_ready, b_ready = ready
    items_along = block // register
    inner = builder.new_range(tiles.depth, group.index)
    # item (r, c) computes rows r, r + BM/TM, ... and columns c, c + BN/TN, ...: neighbouring items read
    # neighbouring elements of B's tile (no bank conflicts) and store neighbouring outputs (coalesced)
    local_id = group.local_id
    item_rows = [builder.add(builder.div(local_id, items_along), offset * items_along) for offset in range(register)]
    item_columns = [builder.add(builder.mod(local_id, items_along), offset * items_along)
                    for offset in range(register)]
    a_values = [builder.load(a_ready, builder.add(builder.mul(item_row, tiles.depth), inner), None)
                for item_row in item_rows]
    b_values = [builder.load(b_ready, builder.add(builder.mul(inner, block), item_column), None)
                for item_column in item_columns]
    stores = []
    for row_offset in range(register):
        for column_offset in range(register):
            product = builder.alu(Op.MUL, dtypes.float32, a_values[row_offset], b_values[column_offset])
            accumulator = builder.reduce(Op.SUM, product, (group.step, inner))
            stores.append(group.store(accumulator, item_rows[row_offset], item_columns[column_offset]))
    return group.kernel_ir(name, stores, warp_width)


def _lower_matrix_kernel(kernel: Kernel, name: str, tiles: MatmulTiles, warp_width: int) -> KernelIR | None:
    """A tiled matmul on matrix units: the tiles hold half values (B's transposed, k fastest, so each register of
    an mma fragment, two halves along k, is one 32-bit word), warp w computes rows 32 (w // 2) .. + 31 and columns
    32 (w % 2) .. + 31 of the group's tile by 2 x 4 mma.m16n8k16 a K step. In a warp, lane l (group g = l // 4,
    t = l % 4) holds A's rows g and g + 8 at k 2t, 2t + 1 and 2t + 8, 2t + 9; B's column g at the same k; and the
    outputs (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1) of each 16x8 product (the PTX ISA's fragments)."""
    group = _GroupTiles(kernel, tiles)
    builder, depth = group.builder, tiles.depth
    half = tiles.matrix
    assert half is not None and depth == 16
    ready = group.fill(half, True)
    if ready is None:
        return None
    a_ready, b_ready = ready
    local_id = group.local_id
    warp, lane = builder.div(local_id, WARP), builder.mod(local_id, WARP)
    lane_group, lane_pair = builder.div(lane, 4), builder.mul(builder.mod(lane, 4), 2)
    warp_row = builder.mul(builder.div(warp, 2), 32)
    warp_column = builder.mul(builder.mod(warp, 2), 32)

    def word(tile: IRNode, major: IRNode, offset: int) -> IRNode:
        """Two halves, k = 2t + offset and the next, of row (A) or column (B) `major` of a tile."""
        start = builder.add(builder.add(builder.mul(major, depth), lane_pair), offset)
        return builder.vector_load(tile, start, None, 2)

    a_words = []
    for row_step in range(2):
        first = builder.add(warp_row, builder.add(lane_group, 16 * row_step))
        second = builder.add(first, 8)
        a_words.append([word(a_ready, first, 0), word(a_ready, second, 0), word(a_ready, first, 8),
                        word(a_ready, second, 8)])
    b_words = []
    for column_step in range(4):
        column = builder.add(warp_column, builder.add(lane_group, 8 * column_step))
        b_words.append([word(b_ready, column, 0), word(b_ready, column, 8)])
    stores = []
    for row_step in range(2):
        for column_step in range(4):
            accumulator = builder.reduce(Op.SUM, builder.mma(a_words[row_step], b_words[column_step], half),
                                         (group.step,))
            for output in range(4):
                row = builder.add(warp_row, builder.add(lane_group, 16 * row_step + 8 * (output // 2)))
                column = builder.add(warp_column, builder.add(lane_pair, 8 * column_step + output % 2))
                stores.append(group.store(builder.gep(accumulator, output), row, column))
    return group.kernel_ir(name, stores, warp_width)


def is_tiled_matmul(kernel: KernelIR) -> bool:
    """Whether a lowered kernel is a workgroup-tiled matmul (it shares tiles in local memory)."""
    return kernel.local_size is not None and any(
        node.op is IROp.DEFINE_SHARED for node in topological_nodes(kernel.sink))

