"""Device-tuned transforms chosen per kernel: output tiles (register tiling), the order of work items, and
vectorization; EMBER_NOOPT=1 skips them all.

Tiling parameterizes lowering rather than rewriting IR afterwards: `lower_kernel` is told how many outputs each work
item computes along each output dim, and hash-consing then shares the loads the tile's outputs have in common (the
row of A and the column of B in a matmul). On devices with vector types (DeviceInfo.vector_ops) the tile's last
dim is a whole number of vectors, vectorize.py packs it, and work items walk down the rows first, so consecutive
work items of a thread reuse the same columns of B from cache."""

from __future__ import annotations

import math

import os
from dataclasses import dataclass, replace

from ember.capabilities import DeviceInfo
from ember.collection_pause import collection_paused
from ember.core.ops import REDUCE_OPS, Op
from ember.ir import lowered_cache
from ember.ir.flash_attention import attention_parts, lower_attention_kernel
from ember.ir.group_matmul import lower_matmul_kernel, matmul_tiles
from ember.ir.group_reduce import choose_local_size, lower_group_kernel
from ember.ir.ir import IROp, KernelIR
from ember.ir.kernel import Kernel, row_loop
from ember.ir.linearize import Step, linearize
from ember.ir.packed_matmul import lower_packed_matmul
from ember.ir.lower import TileLowering, compute_dtype, lower_kernel
from ember.ir.stage import stage_loads
from ember.ir.vectorize import gathers, gathers_in_loops, lanes_for, vectorize
from ember.ir.wide_products import widened_products

MAX_TILE_OUTPUTS = 32  # accumulators per work item; more spill registers on common CPUs
MAX_ROW_OUTPUTS = 256  # outputs of a whole row per work item of an elementwise kernel on a CPU (code size)
MAX_TILE_VECTORS = 12  # vector accumulators per work item: 12 of 16 AVX2 registers, the rest hold the operands
WIDE_TILE_VECTORS = 16  # of 32 registers (AVX-512, DeviceInfo.vector_registers), for tiles sharing loads two ways
MINIMUM_STAGED_TILES = 4  # tiles a work item loops over before staging the panel they share pays for its copy
MAX_STAGED_BYTES = 256 * 1024  # scratch per work item (on the stack of the C thread running it), within L2
MAX_LOWERED_STEPS = 6_000  # kernel steps x lanes per tile a plan may lower: each lane is lowered (in Python)
# separately, so a long fused expression tiled wide takes seconds to lower; such a kernel is compute-bound anyway
# kernel steps x lanes of an elementwise kernel's scalar tile (no vectors: every lane a copy of the steps in the
# source). The C compiler's time grows with it, a row loop's does not: nanoGPT's join of its q, k and v gradients (17
# steps x a row of 192, one part transposed, so no vector plan) took 0.28 s of gcc as a tile, 0.04 s as a loop over
# the row, and ran as fast (0.42 against 0.47 ms); its causal mask (14 int64 steps x 64) 0.18 s, on the cold step's
# critical path. Lavapipe's shader compiler pays for every copy too, and wgpu has no vector plans: char_lstm's cold
# first step on wgpu (Mesa's shader cache off) went from 709 to 12.5 s, its steps as fast
MAX_SCALAR_TILE_STEPS = 800
EXPANDED_FUNCTION_STEPS = 40  # what one exp2, log2 or sin may cost a scalar tile's source: a renderer without an
# accurate one of its own writes a polynomial of ~40 ops (ir/libm.py; WGSL, PTX) in every lane (a GRU's gates unrolled
# over a row of 256 made a 12,800-line shader that lavapipe compiled for 2.7 s)
EXPANDED_FUNCTIONS = frozenset({Op.EXP2, Op.LOG2, Op.SIN})
STREAMED_OPERAND_BYTES = 8 << 20  # a matmul operand past this (beyond a CPU's L2) is read once (`_streaming_order`)
WORK_TOLERANCE = 0.05  # tile plans within this much of the least work count as equal (the earlier one wins)
# a kernel reducing fewer elements than this in all (4 MB of float32) runs in tens of microseconds on a CPU core: its
# reduce-vector plan computes one output per work item, not a register tile. A tile there saves at most the loads its
# outputs share (a few microseconds) and costs its outputs' code over again: nanoGPT's layer norm and attention
# statistics (rows of 64, 64 x 64 outputs) tiled 4 x 3 were 20-28 KB of C and 22-48 ms of lowering each against 3 KB
# and 8-30 ms untiled, running as fast either way (0.02-0.15 ms); with the packed library's -O2, nanoGPT's cold first
# step 4.4 -> 3.0-3.1 s
SMALL_REDUCE_ELEMENTS = 1 << 20


def optimizations_enabled() -> bool:
    return os.environ.get("EMBER_NOOPT", "0") in ("", "0")


def choose_upcast(kernel: Kernel, info: DeviceInfo) -> tuple[int, ...] | None:
    """Tile factors for the output dims of a reduce kernel: the last dim by the vector width, the one before by 4,
    while enough work items remain to keep every compute unit busy."""
    reduces = [step for step in kernel.steps if step.op in REDUCE_OPS]
    if len(reduces) != 1 or not any(step.op is Op.EXPAND for step in kernel.steps) or row_loop(kernel):
        return None  # tiles pay off where outputs share loads: one reduce over broadcast inputs (a matmul)
    reduce_input = kernel.steps[reduces[0].srcs[0]].shape
    if _product([reduce_input[axis] for axis in reduces[0].arg]) < 8:
        return None
    shape = kernel.output.shape
    if not shape:
        return None
    factors = [1] * len(shape)
    remaining_items = 1
    for size in shape:
        remaining_items *= size
    minimum_items = 4 * max(1, info.compute_units)
    candidates = [(len(shape) - 1, max(2, info.preferred_vector_width))]
    if len(shape) >= 2:
        candidates.append((len(shape) - 2, 4))
    for axis, wanted in candidates:
        factor = wanted
        while factor > 1 and (shape[axis] % factor != 0 or remaining_items // factor < minimum_items
                              or factor * _product(factors) > MAX_TILE_OUTPUTS):
            factor //= 2
        factors[axis] = factor
        remaining_items //= factor
    return tuple(factors) if any(factor > 1 for factor in factors) else None


def _product(values: list[int]) -> int:
    result = 1
    for value in values:
        result *= value
    return result


def choose_vector_tile(kernel: Kernel, info: DeviceInfo) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(factors, work item order) of a vector tile for a matmul-like kernel: the last output dim of size > 1 by
    two vectors (or one), the one before by as many rows as the accumulators allow (any number: the last tile is
    clamped), work items along the rows fastest; a convolution's by 4 (or 2) output channels too (`_channel_factor`:
    conv 3x3 of 16 channels on 16 x 16 at batch 64, 1.1 ms -> 0.46 ms forward on one AVX-512 core). None where the
    last dim is not a whole number of vectors."""
    if not _shares_loads(kernel):
        return None
    shape = kernel.output.shape
    lanes = lanes_for(kernel.output.dtype, 4 * info.preferred_vector_width)
    axes = [axis for axis, size in enumerate(shape) if size > 1]
    if len(axes) < 2 or lanes <= 1 or shape[axes[-1]] % lanes != 0:
        return None
    row_axis, column_axis = axes[-2:]
    vectors = 2 if shape[column_axis] % (2 * lanes) == 0 else 1
    # a convolution's output channels (an axis before the rows along which the windows are broadcast): a tile of
    # channels x rows loads each window row once for all its channels and each filter value once for all its rows
    channels = _channel_factor(kernel, axes[-3]) if len(axes) >= 3 else 1
    budget = _tile_vector_budget(info) if channels > 1 else MAX_TILE_VECTORS
    rows = min(budget // (vectors * channels), shape[row_axis])
    if channels > 1:  # as many rows as lowering affords (each lane of the tile is lowered in Python)
        rows = min(rows, MAX_LOWERED_STEPS // (len(kernel.steps) * vectors * lanes * channels))
        if rows < 1:
            channels, rows = 1, min(MAX_TILE_VECTORS // vectors, shape[row_axis])
    items = _product(list(shape)) // (vectors * lanes * channels)
    minimum_items = 4 * max(1, info.compute_units)
    while rows > 1 and -(-items // rows) < minimum_items:
        rows -= 1
    factors = tuple(rows if axis == row_axis else vectors * lanes if axis == column_axis
                    else channels if len(axes) >= 3 and axis == axes[-3] else 1 for axis in range(len(shape)))
    order = tuple(column_axis if axis == row_axis else row_axis if axis == column_axis else axis
                  for axis in range(len(shape)))
    return factors, order


def _tile_vector_budget(info: DeviceInfo) -> int:
    """Vector accumulators a work item may hold: more where the device has 32 vector registers (AVX-512)."""
    return WIDE_TILE_VECTORS if info.vector_registers >= 32 else MAX_TILE_VECTORS


def _broadcast_axes(kernel: Kernel) -> set[int] | None:
    """The output axes (of size > 1, counted as in the output's shape) along which some input of the kernel's one
    reduce is broadcast (an EXPAND to the reduce's input shape from size 1): a tile along such an axis loads that
    input once for all its outputs. None where the output's axes do not map onto the reduce's."""
    positions = [position for position, step in enumerate(kernel.steps) if step.op in REDUCE_OPS]
    if len(positions) != 1 or any(step.op is Op.PERMUTE for step in kernel.steps[positions[0]:]):
        return None
    reduce = kernel.steps[positions[0]]
    reduced_shape = reduce.shape
    source_shape = kernel.steps[reduce.srcs[0]].shape
    kept = [axis for axis, size in enumerate(reduced_shape) if size > 1]
    if [reduced_shape[axis] for axis in kept] != [size for size in kernel.output.shape if size > 1]:
        return None
    broadcast: set[int] = set()
    for step in kernel.steps:
        if step.op is Op.EXPAND and step.shape == source_shape:
            before = kernel.steps[step.srcs[0]].shape
            broadcast.update(position for position, axis in enumerate(kept) if before[axis] == 1)
    output_axes = [axis for axis, size in enumerate(kernel.output.shape) if size > 1]
    return {output_axes[position] for position in broadcast}


def _channel_factor(kernel: Kernel, axis: int) -> int:
    """Outputs a vector tile takes along `axis` (an axis before its rows): 4 or 2 where some input is broadcast
    along it and the factor divides it, else 1."""
    broadcast = _broadcast_axes(kernel)
    if broadcast is None or axis not in broadcast:
        return 1
    size = kernel.output.shape[axis]
    return next((factor for factor in (4, 2) if size % factor == 0), 1)


def _shares_loads(kernel: Kernel) -> bool:
    """One reduce over broadcast inputs (a matmul): the outputs of a tile share loads."""
    reduces = [step for step in kernel.steps if step.op in REDUCE_OPS]
    if len(reduces) != 1 or not any(step.op is Op.EXPAND for step in kernel.steps):
        return False
    reduce_input = kernel.steps[reduces[0].srcs[0]].shape
    return _product([reduce_input[axis] for axis in reduces[0].arg]) >= 8


@dataclass(frozen=True)
class Plan:
    """How to lower a kernel: outputs per work item along each dim, the work item order, the reduce split."""

    upcast: tuple[int, ...] | None = None
    order: tuple[int, ...] | None = None
    reduce_lanes: int = 1
    loop: tuple[int, int] | None = None  # (dim, tiles): a work item loops over this many tiles along dim
    stage: bool = False  # copy what the loop's tiles all read into a scratch array first (ir/stage.py)
    vector_width: int = 0  # float32 lanes of the vectors the lowered kernel is packed into (0: not vectorized)
    group: bool = False  # a workgroup kernel (ir/group_reduce.py), whose local size DeviceInfo decides
    packed: bool = False  # a plain float32 matmul as packed panels (ir/packed_matmul.py), its tiles DeviceInfo's
    # a packed plan's cache blocks (over k, rows, columns) and micro-kernel tile (rows, vectors of columns), where a
    # search chose them (None, or a block of 0: packed_matmul's defaults)
    packed_blocks: tuple[int, int, int] | None = None
    packed_tile: tuple[int, int] | None = None


GROUP_PLAN = Plan(group=True)
PACKED_PLAN = Plan(packed=True)


def vector_plans(kernel: Kernel, info: DeviceInfo) -> list[Plan]:
    """The vector plans worth trying for a kernel, best first: vectors along the output's last dim (a matmul's
    6x16 tile), then vectors along the reduced axis (a row reduction, a matmul whose B is transposed)."""
    vector_bytes = 4 * info.preferred_vector_width
    shape = kernel.output.shape
    reduces = [step for step in kernel.steps if step.op in REDUCE_OPS]
    reduce_dtypes = {compute_dtype(step.dtype) for step in reduces}
    if not shape:  # a scalar: vectors along its reduces only (a loss over a batch: its exp and log in vectors)
        reduce_lanes = lanes_for(reduce_dtypes.pop(), vector_bytes) if len(reduce_dtypes) == 1 else 1
        return [Plan((), reduce_lanes=reduce_lanes)] if reduce_lanes > 1 else []
    minimum_items = 4 * max(1, info.compute_units)
    output_lanes = lanes_for(kernel.output.dtype, vector_bytes)
    if row_loop(kernel):  # whole rows per work item: vectors along the row, in the loop and in the row's reduces
        reduce_lanes = lanes_for(reduce_dtypes.pop(), vector_bytes) if len(reduce_dtypes) == 1 else 1
        vectors = output_lanes > 1 and shape[-1] % output_lanes == 0
        return [Plan((1,) * (len(shape) - 1) + (output_lanes,) if vectors else None, reduce_lanes=reduce_lanes)]
    plans = []
    tile = choose_vector_tile(kernel, info)
    if tile is not None:
        factors, order = tile
        tiles = _product([-(-size // factor) for size, factor in zip(shape, factors)])
        # a work item loops down the rows of its column panel (B's panel staged), or along the columns of its
        # rows (A's rows staged: pays where A is computed, e.g. a gradient through an activation)
        for loop_axis in [axis for axis, size in enumerate(shape) if size > 1][-2:]:
            along = -(-shape[loop_axis] // factors[loop_axis])
            loop_tiles = -(-along // max(1, -(-minimum_items // (tiles // along))))
            if loop_tiles >= MINIMUM_STAGED_TILES:
                plans.append(Plan(factors, order, loop=(loop_axis, loop_tiles), stage=True))
        plans.append(Plan(factors, order))
    elif output_lanes > 1 and (not _shares_loads(kernel) or len([size for size in shape if size > 1]) == 1):
        # (also a reduce over broadcast inputs with one output axis, no matmul tile: a layer norm's weight gradient,
        # columns summed over rows, in vectors along its columns)
        # (an elementwise kernel on a device without warps, a CPU, may take longer rows while items stay plenty)
        longest = MAX_ROW_OUTPUTS if not reduces and info.warp_width == 1 else MAX_TILE_OUTPUTS
        vector_tile = _rows_vector_tile(shape, output_lanes)
        widened = _strided_reduce_tile(kernel, vector_tile, output_lanes, info) if reduces else None
        if widened is not None:
            plans.append(Plan(widened))
        joined = None if vector_tile is not None else _joined_rows_tile(shape, output_lanes, longest, minimum_items)
        if joined is not None:
            plans.append(Plan(joined))
        vector_tile = vector_tile or _padded_row_tile(shape, output_lanes, longest, minimum_items)
        if vector_tile is not None:
            plans.append(Plan(vector_tile))
    if len(reduce_dtypes) == 1:
        reduce_lanes = lanes_for(reduce_dtypes.pop(), vector_bytes)
        # the last two output dims of size > 1: rows x columns of outputs (columns only where tiles share loads);
        # none in a small kernel (SMALL_REDUCE_ELEMENTS)
        axes = [axis for axis, size in enumerate(shape) if size > 1][-2 if _shares_loads(kernel) else -1:]
        if kernel.reduced_elements < SMALL_REDUCE_ELEMENTS:
            axes = []
        reduce_factors = [1] * len(shape)
        items = _product(list(shape))
        for axis, wanted in zip(axes, (4, 3) if len(axes) == 2 else (4,)):
            factor = min(wanted, shape[axis])
            while factor > 1 and -(-items // factor) < minimum_items:
                factor -= 1
            reduce_factors[axis] = factor
            items = -(-items // factor)
        if reduce_lanes > 1 and len(axes) == 2:
            reduce_factors = list(_offset_tile(kernel, info, reduce_factors, axes, reduce_lanes, minimum_items))
        if reduce_lanes > 1:
            streaming = _streaming_order(kernel, axes) if len(axes) == 2 and _shares_loads(kernel) else None
            plans.append(Plan(tuple(reduce_factors), streaming, reduce_lanes=reduce_lanes))
    return plans


def _streaming_order(kernel: Kernel, axes: list[int]) -> tuple[int, ...] | None:
    """The work item order of a matmul tile with vectors along the reduce (B transposed) whose columns' operand is
    too large for a cache and larger than its rows' (a language model's output layer: H [1024, 256] @ W.T over a
    vocabulary of 50,257, W 51 MB): rows fastest, so the few rows of A stay in cache while each column panel of B is
    read from memory once, where columns fastest read all of B again for every tile of rows (that product: 1.23 s
    -> 0.51 s on two shared cores). None (columns fastest) elsewhere."""
    row_axis, column_axis = axes
    shape = kernel.output.shape
    reduce = next(step for step in kernel.steps if step.op in REDUCE_OPS)
    reduce_input = kernel.steps[reduce.srcs[0]].shape
    reduced = _product([reduce_input[axis] for axis in reduce.arg])
    column_operand_bytes = shape[column_axis] * reduced * kernel.output.dtype.itemsize
    if shape[row_axis] >= shape[column_axis] or column_operand_bytes <= STREAMED_OPERAND_BYTES:
        return None
    return tuple(column_axis if axis == row_axis else row_axis if axis == column_axis else axis
                 for axis in range(len(shape)))


def _offset_tile(kernel: Kernel, info: DeviceInfo, factors: list[int], axes: list[int], reduce_lanes: int,
                 minimum_items: int) -> tuple[int, ...]:
    """A tile with vectors along the reduce, widened by a short axis (at most 4) before its rows and columns along
    which an input is broadcast, taken whole: a convolution filters' gradient [G, *K, Og, Cg] tiles the last kernel
    offset by 4 output channels by 1 or 2 input channels, the output's gradient loaded once for the offsets and the
    input's row once for the output channels (its offsets' loads overlap in cache). 12 accumulators, 24 where the
    device has 32 vector registers, fewer where lowering would not afford them; else `factors` unchanged. One
    AVX-512 core, batch 64: 3x3 of 16 channels on 16 x 16 (16 lanes, 3 x 4 x 1) 1.4 -> 1.0 ms, of 32 channels on
    8 x 8 (8 lanes, 3 x 4 x 2) 0.96 -> 0.70 ms."""
    shape = kernel.output.shape
    before = [axis for axis, size in enumerate(shape) if size > 1 and axis < axes[0]]
    broadcast = _broadcast_axes(kernel)
    if not before or broadcast is None or before[-1] not in broadcast or shape[before[-1]] > 4:
        return tuple(factors)
    offset = before[-1]
    budget = 2 * MAX_TILE_VECTORS if info.vector_registers >= 32 else MAX_TILE_VECTORS
    rows = min(4, shape[axes[0]])
    items = _product(list(shape)) // (shape[offset] * rows)
    for columns in range(min(budget // (shape[offset] * rows), shape[axes[1]]), 0, -1):
        tile = [1] * len(shape)
        tile[offset], tile[axes[0]], tile[axes[1]] = shape[offset], rows, columns
        if -(-items // columns) >= minimum_items and _affordable(kernel, tuple(tile), reduce_lanes):
            return tuple(tile)
    return tuple(factors)


# vectors of a row a work item of a reduce over other axes sums at once, the most first: any count dividing the row
# (a row of 1000 under 8 lanes, 125 vectors: 5 at once, where 8, 4 and 2 left one vector a work item)
STRIDED_REDUCE_VECTORS = (8, 7, 6, 5, 4, 3, 2)


def _strided_reduce_tile(kernel: Kernel, tile: tuple[int, ...] | None, lanes: int,
                         info: DeviceInfo) -> tuple[int, ...] | None:
    """For a reduce over axes before its output's row (a bias's gradient: columns summed over rows), whose vector
    tile (`tile`, from _rows_vector_tile) is one vector of the row: several vectors of the row instead (the most of
    STRIDED_REDUCE_VECTORS dividing the row, within the device's vector registers, a work item left for every core),
    or None. One vector a work item read a 64-byte piece of every row of the reduce (a stride of the row's length: no
    prefetcher follows strides of 4 KiB, and one accumulator's additions wait on each other); 8 read 512 consecutive
    bytes of each row into 8 accumulators: 2048 x 512 summed over its rows 202 -> 93 us, 8192 x 1024 2.4 -> 0.83 ms
    (2 AVX-512 cores); a row of 1000 under 8 lanes, 5 vectors: 4096 x 1000 1.83 -> 0.46 ms.
    Not for a reduce that shares loads (a matrix-vector product's vectors would gather its rows)."""
    if tile is None or _shares_loads(kernel):
        return None
    shape = kernel.output.shape
    axis = _last_axis(shape)
    if tile[axis] != lanes or any(factor != 1 for number, factor in enumerate(tile) if number != axis):
        return None
    for vectors in STRIDED_REDUCE_VECTORS:
        width = lanes * vectors
        if vectors <= _tile_vector_budget(info) and shape[axis] % width == 0 and \
                _product(list(shape)) // width >= max(1, info.compute_units):
            return tuple(width if number == axis else 1 for number in range(len(shape)))
    return None


def _rows_vector_tile(shape: tuple[int, ...], lanes: int) -> tuple[int, ...] | None:
    """Tile factors whose outputs are one vector of consecutive elements: `lanes` along the last axis of size > 1
    (after a keepdim reduce's trailing 1s), or whole rows shorter than a vector, as many as fill one (rows of 4 in
    pairs), or None."""
    axis = _last_axis(shape)
    factors = [1] * len(shape)
    if shape[axis] % lanes == 0:
        factors[axis] = lanes
        return tuple(factors)
    earlier = [number for number in range(axis) if shape[number] != 1]
    if lanes % shape[axis] or not earlier or shape[earlier[-1]] % (lanes // shape[axis]):
        return None
    factors[axis], factors[earlier[-1]] = shape[axis], lanes // shape[axis]
    return tuple(factors)


def _joined_rows_tile(shape: tuple[int, ...], lanes: int, longest: int, minimum_items: int) -> tuple[int, ...] | None:
    """Consecutive whole rows per work item where a row is not a whole number of vectors but a few rows are (rows of
    28 pixels in fours: 7 vectors of 16; a bias and activation over a convolution's output ran 6x faster than a
    vector and 12 scalars a row), up to `longest` outputs and where `minimum_items` work items remain; None where
    the axis before the rows is not a multiple of that many rows (or the rows are a whole number of vectors, or
    longer than `longest`). A tile whose vectors would gather (a padded copy's rows) is refused by lowering."""
    axis = _last_axis(shape)
    earlier = [number for number in range(axis) if shape[number] != 1]
    if not earlier or shape[axis] % lanes == 0 or shape[axis] >= longest:
        return None
    rows = lanes // math.gcd(shape[axis], lanes)
    before = earlier[-1]
    if shape[before] % rows or rows * shape[axis] > longest or _product(list(shape)) // (
            rows * shape[axis]) < minimum_items:
        return None
    return tuple(shape[axis] if number == axis else rows if number == before else 1 for number in range(len(shape)))


def _padded_row_tile(shape: tuple[int, ...], lanes: int, longest: int = MAX_TILE_OUTPUTS, minimum_items: int = 1
                     ) -> tuple[int, ...] | None:
    """A whole row per work item where rows are longer than a vector but not a whole number of them (a padded
    copy's rows of 10: vectorize.py packs the 8 interior outputs, the border stays scalar), or None. Rows longer
    than MAX_TILE_OUTPUTS (accumulators in registers) only up to `longest` and where `minimum_items` rows remain:
    an elementwise kernel's rows up to MAX_ROW_OUTPUTS on a CPU (a padded copy's rows of 34 or 129 had each output
    its own work item, a division and remainder per axis and scalar loads: ~20x slower)."""
    axis = _last_axis(shape)
    if shape[axis] > MAX_TILE_OUTPUTS and _product(list(shape)) // shape[axis] < minimum_items:
        return None
    if not lanes < shape[axis] <= longest:
        return None
    return tuple(shape[axis] if number == axis else 1 for number in range(len(shape)))


SHORT_AXIS = 4  # the longest axis before a padded row that short_axis_plans takes whole


def short_axis_plans(kernel: Kernel, info: DeviceInfo) -> list[Plan]:
    """For an elementwise kernel whose padded row's tile (`_padded_row_tile`) packs no vectors without gathering,
    that tile with one short axis before the row's (2 to SHORT_AXIS long) taken whole, for each such axis, where the
    outputs stay within MAX_ROW_OUTPUTS and enough work items remain: the short axis's index is then a constant in
    each lane, and so are the lane's guards that read it (a strided convolution's phase split [N, C, 2, 58, 29]:
    which phase's first or last column is padding; 2x faster than the row alone, whose vectors gathered, and 5.6x
    at [64, 16, 2, 18, 9]). Tried after `vector_plans`' tiles, only where none of them fits."""
    shape = kernel.output.shape
    lanes = lanes_for(kernel.output.dtype, 4 * info.preferred_vector_width)
    if not shape or kernel.has_reduce or info.warp_width != 1 or lanes <= 1 or row_loop(kernel):
        return []
    minimum_items = 4 * max(1, info.compute_units)
    if _rows_vector_tile(shape, lanes) is not None:
        return []
    row = _padded_row_tile(shape, lanes, MAX_ROW_OUTPUTS, minimum_items)
    if row is None:
        return []
    axis = _last_axis(shape)
    plans = []
    for short in range(axis - 1):  # (not the axis right before the row: _joined_rows_tile's)
        if 2 <= shape[short] <= SHORT_AXIS and row[axis] * shape[short] <= MAX_ROW_OUTPUTS and (
                _product(list(shape)) // (row[axis] * shape[short]) >= minimum_items):
            plans.append(Plan(tuple(shape[short] if number == short else factor for number, factor in enumerate(row))))
    return plans


def _last_axis(shape: tuple[int, ...]) -> int:
    """The last axis of size > 1 (the last axis where there is none): the one whose elements are consecutive."""
    return max((axis for axis, size in enumerate(shape) if size != 1), default=len(shape) - 1)


def _affordable(kernel: Kernel, upcast: tuple[int, ...] | None, reduce_lanes: int = 1) -> bool:
    """Whether lowering a kernel with this tile stays within MAX_LOWERED_STEPS."""
    return len(kernel.steps) * _product(list(upcast or ())) * reduce_lanes <= MAX_LOWERED_STEPS


def _renderable(kernel: Kernel, upcast: tuple[int, ...] | None) -> bool:
    """Whether a scalar tile's source stays within MAX_SCALAR_TILE_STEPS (an elementwise kernel's: its row is
    walked by a loop instead) or MAX_LOWERED_STEPS (a reduce's tile: a loop over its outputs would multiply its
    reduce's iterations per work item, past what wgpu on llvmpipe runs), each exp2, log2 and sin counted as the
    polynomial a renderer may write for it (EXPANDED_FUNCTION_STEPS): every lane of the tile is a copy."""
    steps = sum(EXPANDED_FUNCTION_STEPS if step.op in EXPANDED_FUNCTIONS else 1 for step in kernel.steps)
    return steps * _product(list(upcast or ())) <= (MAX_LOWERED_STEPS if kernel.has_reduce else MAX_SCALAR_TILE_STEPS)


def build_kernel_ir(kernel: Kernel, name: str, info: DeviceInfo) -> KernelIR:
    """Lower a kernel with the transforms that suit the device (none when EMBER_NOOPT=1), from the disk cache of
    lowered kernels when an earlier process lowered it already. (The scheduler passes narrower capabilities, from
    `narrower_capabilities`, for a kernel the device failed to build.)"""
    optimize = optimizations_enabled()
    path = lowered_cache.entry_path(kernel, name, info, optimize)
    cached = lowered_cache.load(path, kernel, name)
    if cached is not None:
        return cached
    with collection_paused():
        # (a fused attention has one lowering, the flash kernel, with optimizations off too: ir/flash_attention.py)
        lowered = (choose_plan(kernel, name, info)[1] if optimize or attention_parts(kernel) is not None
                   else lower_kernel(widened_products(kernel, info), name))
    lowered_cache.store(path, lowered)
    return lowered


def build_planned_ir(kernel: Kernel, name: str, info: DeviceInfo, plan: Plan) -> KernelIR | None:
    """The kernel lowered by one plan (a kernel search's winner), from the disk cache of lowered kernels where an
    earlier process lowered it already; None where the plan does not apply to the kernel (lower_plan)."""
    path = lowered_cache.entry_path(kernel, name, info, True, variant=repr(plan))
    cached = lowered_cache.load(path, kernel, name)
    if cached is not None:
        return cached
    with collection_paused():
        lowered = lower_plan(kernel, name, info, plan)
    if lowered is not None:
        lowered_cache.store(path, lowered)
    return lowered


def choose_plan(kernel: Kernel, name: str, info: DeviceInfo) -> tuple[Plan, KernelIR]:
    """The heuristic's plan and the kernel lowered by it: the first vector plan whose vectors need no gathering
    (tile plans compared by estimated work), at the preferred vector width or, for a kernel needing an op only a
    narrower width has, at that width; else the first whose vectors read a few nearby runs of memory each
    (vectorize.nearby_loads: a strided convolution's gradient interleaving its phases, 10x faster than scalar);
    else scalar tiles (a whole short row per work item where no other tile fits); a loop over each row where that
    row's tile would take too long to lower (`row_loop_plan`); untiled where tiling would take too long to lower. A
    matmul, or a kernel of long row reductions, on a device with local memory and warps is a workgroup kernel
    instead (ir/group_matmul.py, ir/group_reduce.py; its plan is `GROUP_PLAN`, which the kernel search leaves
    alone); a plain float32 matmul on a device whose renderer packs panels (DeviceInfo.packed_matmul) is a packed
    matmul (ir/packed_matmul.py; `PACKED_PLAN`, which the search compares with the tiled plans)."""
    kernel = widened_products(kernel, info)
    packed = lower_packed_matmul(kernel, name, info)
    if packed is not None:
        return PACKED_PLAN, packed
    grouped = group_lowering(kernel, name, info)
    if grouped is not None:
        return GROUP_PLAN, grouped
    lowered_tiles: dict[tuple, TileLowering] = {}  # kept from one width for the next (a row of 87 either way)
    for nearby in (False, True):  # vectors reading one run of memory at any width first, then a few nearby runs
        for capabilities in _vector_widths_for(kernel, info):
            vectorized = _vector_lowering(kernel, name, capabilities, lowered_tiles, nearby)
            if vectorized is not None:
                return vectorized
    upcast = choose_upcast(kernel, info) or row_tile(kernel, info)
    if upcast is None:
        plan = Plan(None, loop=long_row_loop(kernel, info))
    elif _affordable(kernel, upcast) and _renderable(kernel, upcast):
        plan = Plan(upcast)
    else:
        plan = Plan(None, loop=row_loop_plan(kernel, upcast))
    return plan, lower_kernel(kernel, name, plan.upcast, loop=plan.loop)


def group_lowering(kernel: Kernel, name: str, info: DeviceInfo) -> KernelIR | None:
    """The workgroup kernel DeviceInfo asks for, or None: a fused attention (ir/flash_attention.py), a matmul tiled
    in local memory (ir/group_matmul.py), or long rows reduced by groups (ir/group_reduce.py)."""
    attention = lower_attention_kernel(kernel, name, info)
    if attention is not None:
        return attention
    tiles = matmul_tiles(kernel, info)
    if tiles is not None:
        tiled = lower_matmul_kernel(kernel, name, tiles, info.warp_width)
        if tiled is not None:
            return tiled
    local_size = choose_local_size(kernel, info)
    return None if local_size is None else lower_group_kernel(kernel, name, local_size, info.warp_width)


def lower_plan(kernel: Kernel, name: str, info: DeviceInfo, plan: Plan) -> KernelIR | None:
    """The kernel lowered by `plan` (the same IR `choose_plan` gives for its own plan), or None where the plan does
    not apply: vectors the kernel cannot be packed into, or that need gathering, or a tile too long to lower."""
    kernel = widened_products(kernel, info)
    if plan.group or attention_parts(kernel) is not None:  # (a fused attention: the flash kernel or nothing)
        return group_lowering(kernel, name, info)
    if plan.packed:
        return lower_packed_matmul(kernel, name, info, plan.packed_blocks, plan.packed_tile)
    if not _affordable(kernel, plan.upcast, plan.reduce_lanes):
        return None
    lowered = lower_kernel(kernel, name, plan.upcast, plan.order, plan.reduce_lanes, plan.loop)
    if plan.vector_width:
        operations = vector_ops_at(info, plan.vector_width)
        if operations is None:
            return None
        vectorized = vectorize(lowered, 4 * plan.vector_width, operations)
        if vectorized is lowered:
            return None
        if plan.stage:
            vectorized = stage_loads(vectorized, MAX_STAGED_BYTES)
        return None if gathers(vectorized, nearby=True) else vectorized
    return stage_loads(lowered, MAX_STAGED_BYTES) if plan.stage else lowered


def vector_ops_at(info: DeviceInfo, width: int) -> frozenset | None:
    """The IR ops a device applies to vectors of `width` float32 lanes, or None where it has no such vectors."""
    if info.vector_ops and width == info.preferred_vector_width:
        return info.vector_ops
    return next((operations for fallback, operations in info.fallback_vector_widths if fallback == width), None)


def row_tile(kernel: Kernel, info: DeviceInfo) -> tuple[int, ...] | None:
    """Scalar tile factors for a kernel that no vector plan fits (a padded copy's rows of 10 or 18, a max pool's
    windows written into the next convolution's padding): a whole short row per work item, so its index arithmetic
    (a division and remainder per axis) is done once per row, not once per output (and small reduces share their
    loop), while enough work items remain to keep every compute unit busy."""
    shape = kernel.output.shape
    if not shape or row_loop(kernel):
        return None
    axis = _last_axis(shape)
    rows = _product(list(shape)) // shape[axis]
    elementwise = info.warp_width == 1 and not kernel.has_reduce
    if not 2 <= shape[axis] <= (MAX_ROW_OUTPUTS if elementwise else MAX_TILE_OUTPUTS):
        return None
    if rows < 4 * max(1, info.compute_units):
        return None
    return tuple(shape[axis] if number == axis else 1 for number in range(len(shape)))


def row_loop_plan(kernel: Kernel, refused: tuple[int, ...] | None) -> tuple[int, int] | None:
    """For a kernel whose whole-row tile (`row_tile`) is too long to lower or render (a softmax gradient's row of 87
    classes, each element two exp2 calls: 87 copies of the chain), a loop over the row instead, as a Plan's `loop`
    (the last axis, its length): each work item walks one row, its index arithmetic (a division and a remainder)
    done once per row, not once per element, and the loop is one the C compiler vectorizes (a row of 87 in vectors
    of 16 and a remainder, exp2 included: nanoGPT's softmax gradient 0.94 -> under 0.15 ms). None for any other
    refused tile."""
    shape = kernel.output.shape
    if refused is None or not shape:
        return None
    axis = _last_axis(shape)
    if refused[axis] != shape[axis] or any(factor != 1 for number, factor in enumerate(refused) if number != axis):
        return None
    return (axis, shape[axis])


def long_row_loop(kernel: Kernel, info: DeviceInfo) -> tuple[int, int] | None:
    """For an elementwise kernel on a device without warps (a CPU) that no vector or row tile fits, because its rows
    are longer than MAX_ROW_OUTPUTS and not a whole number of vectors (logits over a vocabulary of 50,257, rows of
    1,001), a loop over each row as a Plan's `loop` (the last axis, its length): a work item per row, its index
    arithmetic (a division and a remainder per axis) done once per row, and a loop the C compiler vectorizes with a
    remainder. One work item per element ran scalar, a division and a remainder each (2 AVX-512 cores: exp of
    512 x 1,001 2.8 -> 0.28 ms, of 512 x 50,257 89 -> 19 ms; PoCL 1.2-3x). None for a kernel of one row (its flat
    index is the row's already), a reduce, a device with warps (a GPU wants an item per element), or rows longer than
    the loops a device runs (DeviceInfo.max_loop_iterations)."""
    shape = kernel.output.shape
    if not shape or info.warp_width != 1 or kernel.has_reduce or row_loop(kernel):
        return None
    axis = _last_axis(shape)
    limit = info.max_loop_iterations
    if shape[axis] <= MAX_ROW_OUTPUTS or _product(list(shape)) == shape[axis] or (
            limit is not None and shape[axis] > limit):
        return None
    return (axis, shape[axis])


def _vector_widths_for(kernel: Kernel, info: DeviceInfo) -> list[DeviceInfo]:
    """The capabilities to try vector plans with: the preferred width, then each fallback width that has an op the
    kernel uses and the wider ones lack, or the preferred width's ops (DeviceInfo.fallback_vector_widths)."""
    choices = [info] if info.vector_ops else []
    used = {step.op for step in kernel.steps} | {IROp.LOAD} | (
        {IROp.REDUCE} if kernel.has_reduce else set())
    covered = set(info.vector_ops)
    for width, ops in info.fallback_vector_widths:
        # a narrower width with the same ops still fits dims the wider vectors do not divide (24 columns in 16s)
        if (ops - covered) & used or ops == info.vector_ops:
            choices.append(replace(info, preferred_vector_width=width, vector_ops=ops, fallback_vector_widths=()))
        covered |= ops
    return choices


def narrower_capabilities(info: DeviceInfo, width: int) -> list[DeviceInfo]:
    """What to lower a kernel with after the device failed to build or launch it with vectors of `width` float32
    lanes: each narrower fallback width, then no vectors (scalar tiles)."""
    choices = [replace(info, preferred_vector_width=narrower, vector_ops=ops, fallback_vector_widths=())
               for narrower, ops in info.fallback_vector_widths if narrower < width]
    if width > 1:
        choices.append(replace(info, vector_ops=frozenset(), fallback_vector_widths=()))
    return choices


def _vector_lowering(kernel: Kernel, name: str, info: DeviceInfo, tiles_lowered: dict[tuple, TileLowering],
                     nearby: bool = False) -> tuple[Plan, KernelIR] | None:
    """The first vector plan that packs vectors without gathering them (but from a few nearby runs of memory, with
    `nearby`: vectorize.gathers), with the kernel lowered by it, or None. `tiles_lowered` keeps each tile's scalar
    lowering by its plan (vectorizing rebuilds it, never changes it), for the narrower widths tried after this one
    and the second rule: a tile of the same plan there is not lowered again."""
    # tile plans (upcast, no reduce split) are compared by their estimated work, the others taken in order
    tiles: list[tuple[float, Plan, KernelIR]] = []
    failed: set[tuple] = set()
    fallbacks = short_axis_plans(kernel, info)
    for plan in [*vector_plans(kernel, info), *fallbacks]:
        if tiles and (plan.reduce_lanes > 1 or plan in fallbacks):
            break
        if not _affordable(kernel, plan.upcast, plan.reduce_lanes):
            continue
        # a plan differing from one that did not vectorize only in its loop or staging has the same lanes and
        # fails the same way (same plans chosen for all 615 kernels of the seven programs; ~25% less lowering)
        lanes = (plan.upcast, plan.order, plan.reduce_lanes)
        if lanes in failed:
            continue
        key = (plan.upcast, plan.order, plan.reduce_lanes, plan.loop)
        tile = tiles_lowered.get(key)
        if tile is None:
            tile = tiles_lowered[key] = TileLowering(kernel, name, plan.upcast, plan.order, plan.reduce_lanes,
                                                     plan.loop)
        if _first_row_gathers(kernel, tile, plan, info, nearby):
            failed.add(lanes)
            continue
        lowered = tile.whole()  # (the first row's lowering, if any, goes on to the whole tile)
        vectorized = vectorize(lowered, 4 * info.preferred_vector_width, info.vector_ops)
        if vectorized is lowered:
            failed.add(lanes)
            continue
        if plan.stage:
            vectorized = stage_loads(vectorized, MAX_STAGED_BYTES)
        if gathers(vectorized, nearby):
            failed.add(lanes)
            continue
        plan = replace(plan, vector_width=info.preferred_vector_width)
        if plan.reduce_lanes > 1 or plan.upcast is None:
            return plan, vectorized
        tiles.append((estimated_work(vectorized), plan, vectorized))
    if tiles:
        least = min(work for work, _, _ in tiles)
        return next((plan, ir) for work, plan, ir in tiles if work <= least * (1 + WORK_TOLERANCE))
    return None


def _first_row_gathers(kernel: Kernel, tile: TileLowering, plan: Plan, info: DeviceInfo, nearby: bool) -> bool:
    """Whether a vector plan of a kernel with reduces gathers, as its tile's first row shows (lowered alone; the
    whole tile's lowering then goes on from it): a tile of several rows whose row is a whole number of vectors.
    That row's nodes are the whole tile's first-row nodes, packed into the same vectors (its stores' runs are whole
    vectors from the row's start, in the row alone as in the tile), so a vector it builds inside a reduce's loop
    from computed scalars is one the whole tile builds too (vectorize.gathers_in_loops); a row that does not gather
    says nothing of the others. A matmul whose B is transposed has its 6x32 tile of output vectors gather along B's
    columns: the first row finds it in a sixth of the tile's lowering (on the nanoGPT step such tiles were half of
    all lowering)."""
    factors = plan.upcast
    if factors is None or sum(1 for factor in factors if factor > 1) < 2:
        return False
    if not kernel.has_reduce:
        return False
    row_axis = max(axis for axis, factor in enumerate(factors) if factor > 1)
    lanes = lanes_for(kernel.output.dtype, 4 * info.preferred_vector_width)
    if lanes <= 1 or factors[row_axis] % lanes or row_axis != _last_axis(kernel.output.shape):
        return False
    # the row's first vector alone first, by the same argument: its stores are one run packed as in the row (each
    # run is packed by itself), so it gathers where the row's first vector does (rows of 32 outputs of nanoGPT's
    # statistics gather at their first 16, in half the lowering)
    if lanes < factors[row_axis] and _gathers_in_loops(tile.first_outputs(lanes), plan, info, nearby):
        return True
    return _gathers_in_loops(tile.first_row(), plan, info, nearby)


def _gathers_in_loops(lowered: KernelIR, plan: Plan, info: DeviceInfo, nearby: bool) -> bool:
    """Whether `lowered` (part of a tile), vectorized and staged as `plan` says, builds a vector inside a reduce's
    loop from computed scalars (not where it packs no vectors at all; `nearby` as for vectorize.gathers)."""
    vectorized = vectorize(lowered, 4 * info.preferred_vector_width, info.vector_ops)
    if vectorized is lowered:
        return False
    if plan.stage:
        vectorized = stage_loads(vectorized, MAX_STAGED_BYTES)
    return gathers_in_loops(vectorized, nearby)


def estimated_work(kernel: KernelIR) -> float:
    """Instructions a kernel executes: each rendered instruction times the trip counts of the loops around it."""
    trips, work = [kernel.global_size], 0.0
    for instruction in linearize(kernel.sink):
        if instruction.kind is Step.LOOP:
            trips.append(trips[-1] * instruction.node.arg[1])
        elif instruction.kind is Step.END_LOOP:
            trips.pop()
        elif instruction.kind in (Step.VALUE, Step.STORE, Step.UPDATE_ACC):
            work += trips[-1]
    return work
