"""Packed-panel matmuls for CPUs: recognizing a plain float32 matmul kernel and describing it as BLAS runs it.

A kernel qualifies when its output is exactly one float32 sum over one axis (or several, below) of the product of
two float32 loads, each from a buffer at an index linear in the output's axes and the reduced one (plain buffers and
views that are strides and an offset: transposes, slices, flips, broadcast batches; no mask, no reshape that divides
an index, no fused prologue or epilogue). Such a kernel is described by sizes and strides (`PackedMatmul`), and a
renderer that has the packed form (DeviceInfo.packed_matmul: the c backend, backends/c_matmul.py) renders the loops
of GotoBLAS and BLIS: the output is split into parts, one a thread; a part walks the columns in blocks of
`column_block` and the reduced axis in blocks of `depth_block`, copying B's block into panels `micro_columns` wide
(k-major, so the micro-kernel reads one vector row a k) and A's rows, `row_block` at a time, into panels
`micro_rows` tall; a register-tiled micro-kernel keeps `micro_rows` x `micro_columns` accumulators in vector
registers and adds a broadcast A value times a B vector (a fused multiply-add) per accumulator and k. Panels past
the matrix's edge are filled with zeros, and only the valid part of an edge tile is stored. The tiles come from
DeviceInfo (its vector width and register count), never from a backend's name. The KernelIR keeps the plain lowering
of the kernel as its sink (what the kernel reads and writes, for every pass that inspects it) and the description in
`KernelIR.packed`.

A convolution is such a matmul too (an implicit GEMM): its sum runs over several axes (input channels, filter rows
and columns) that walk the padded input with strides no one stride gives, and its rows of pixels are too short to
fill panels. Its reduced axes (`PackedMatmul.depth_axes`) and the pixel axes joined into columns
(`PackedMatmul.column_axes`) are read through tables of offsets while packing (`gathers`), where that pays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, cast

from ember.capabilities import DeviceInfo
from ember.core import dtype as dtypes
from ember.core.ops import Op
from ember.core.shapes import prod, strides_of
from ember.ir.group_matmul import ReduceReplaced, output_ranges, reduced_product, sum_axes
from ember.ir.ir import Builder, IRNode, IROp, KernelIR, linear_terms
from ember.ir.kernel import Kernel
from ember.ir.lower import lower_kernel

MINIMUM_SIDE = 16  # the output's rows and columns from which a matmul is packed
MINIMUM_DEPTH = 8  # elements summed per output from which it is
# rows of the micro-kernel's tile at most: with AVX-512's 32 registers, 12 or 14 rows (24 or 28 accumulators) made gcc
# 12 spill accumulators in the k loop (one thread, 1024^2: 52-80 GFLOP/s), 8 rows ran at 97, as fast as 10 and OpenBLAS
MAX_MICRO_ROWS = 8
# the wide tile: 6 rows x 4 vectors (24 accumulators, 29 of AVX-512's 32 registers) loads 0.42 values per
# multiply-add against the 8 x 2 tile's 0.63; on a Sapphire Rapids core pair (2 threads, alternating runs, blocks
# over k of 512 for it, 256 for 8 x 2) it ran 1024^2 2-3% faster, 1000^2 1-4%, 4096x4096x64 3%, 4096^2 13-19%, and
# 64 x 128 x 512 (an RNN step's, rows padded 64 -> 66) 3-4% slower: it is the default from WIDE_TILE_ROWS rows and
# 4 vectors' columns x 4 on, where it fits
WIDE_TILE = (6, 4)
WIDE_TILE_ROWS = 96
# the share of padded outputs the wide tile's edges may add over the narrow tile's: 784 columns are 13 tiles of 64
# (6% padding) or 25 of 32 (2%), and the MLP's 512 x 784 and 256 x 784 products ran 8-13% faster on the 8 x 2 tile
WIDE_EDGE_ALLOWANCE = 0.02
WIDE_DEPTH_BLOCK = 512  # KC for the wide tile (its B panels, 64 columns x KC, live in L2, not L1)
DEPTH_BLOCK = 256  # KC: the reduced elements of one packed block (a B micro-panel, KC x NR floats, stays in L1)
ROW_BLOCK = 168  # MC: A's rows packed at a time (MC x KC floats, ~170 KB: in L2), rounded to the micro-kernel's
# MC where the whole depth is SHORT_DEPTH or less: the output is then written once, a tile at a time down MC rows
# for each panel of columns, and fewer rows written at once ran faster (2 cores, interleaved: 4096x128 @ 128x4096
# 12.6 -> 10.8 ms, 4096x64 @ 64x4096 5.9 -> 5.2, a batch of 8 512x64 @ 64x512 774 -> 726 us, 1024x32 @ 32x1024 234
# -> 229; depth 256 and 512 no faster, 256x512 @ 512x784 14% slower)
SHORT_DEPTH = 128
SHORT_DEPTH_ROW_BLOCK = 24
COLUMN_BLOCK = 4080  # NC: B's columns packed at a time (KC x NC floats, ~4 MB: in L3), rounded likewise
# the share of an output row's columns its last panel may pad before the panels run on across the rows before it
# (a convolution's 56-pixel rows: 14% padding in panels of 32 columns)
COLUMN_PADDING = 0.05
# where a matmul whose operand is read through offset tables (a convolution) is packed: from GATHER_MINIMUM_DEPTH
# products an output, GATHER_MINIMUM_ROWS[1] rows, or GATHER_MINIMUM_ROWS[0] rows and GATHER_WIDE_COLUMNS columns.
# Against the tiled kernels on 2 cores: 16 filters of 144 over 16 x 16 pixels (64 images) ran 2.7x slower packed,
# of 288 over 28 x 28 pixels 5x faster, of 9 (one input channel) 5.6x slower; 32 filters over 8 x 8 pixels 1.1-1.2x
# slower, over 28 x 28 pixels 7x faster; 64 over 8 x 8 1.1x faster; 512 filters of 4608 over 7 x 7 pixels 22x
# faster (12.7 against 285 ms)
GATHER_MINIMUM_DEPTH = 32
GATHER_MINIMUM_ROWS = (16, 64)
GATHER_WIDE_COLUMNS = 512
# B's columns at a stride other than 1 with its k through a table (a filters' gradient: input channels as columns,
# pixels as k) are packed through transposes of `lanes` consecutive k, a run of fewer through a transpose of its lanes
# alone (rows of 56 pixels: 3 transposes and one of 8 lanes; of 14: one of 14), a k alone a value at a time: from
# this many rows, which the copies are spread over. Filters' gradients of 3x3 convolutions against the tiled kernels
# on 2 cores (A shared: see c_matmul): 64 filters over 56 x 56 pixels (batch 8) 8.6 -> 5.7 ms, 128 over 28 x 28
# 69 -> 7.4 ms, 64 over 14 x 14 (batch 32) 19.6 -> 3.4 ms, 512 over 7 x 7 (batch 16) 194 -> 12.5 ms; 32 over 8 x 8
# (batch 64) 0.4 -> 1.5 ms, so not there. With the short runs' transposes (rows of 14, 7 and the tails of 28 and 56
# were packed a value at a time before): 6.3, 6.8, 2.1 and 10.8 ms; 32 over 8 x 8 0.56 against the tiled 0.47
TRANSPOSED_GATHER_ROWS = 64


@dataclass(frozen=True)
class PackedMatmul:
    """A matmul as packed panels: out[batch, row, column] = sum over k of A[row, k] * B[k, column], every element at
    an offset plus its indices times strides (in elements) in its buffer (`a`, `b`: the buffers' parameter
    positions; the output is parameter 0, its columns of stride 1). `batches` lists the other output axes as
    (size, A's stride, B's stride, the output's stride); rows, columns and batches are the output's axes with the
    neighbours that walk all three alike merged (`_coalesced`). The tiles: `lanes` float32 lanes a vector, micro_rows x
    micro_vectors vectors of accumulators, and the cache blocks over k, rows and columns."""

    rows: int
    columns: int
    depth: int
    a: int
    b: int
    a_offset: int
    a_row_stride: int
    a_depth_stride: int
    b_offset: int
    b_depth_stride: int
    b_column_stride: int
    output_row_stride: int
    batches: tuple[tuple[int, int, int, int], ...]
    lanes: int
    micro_rows: int
    micro_vectors: int
    depth_block: int
    row_block: int
    column_block: int
    # the reduced axes (size, A's stride, B's stride), outermost first, where the depth is several axes that do not
    # walk A and B as one (a convolution's channels and filter offsets); an operand whose depth stride is 0 reads
    # its k-th element at the offset these axes give
    depth_axes: tuple[tuple[int, int, int], ...] = ()
    # B's column axes (size, B's stride), outermost first, where the columns are several output axes contiguous in
    # the output but not in B (a convolution's rows and columns of pixels); b_column_stride is then 0
    column_axes: tuple[tuple[int, int], ...] = ()

    @property
    def micro_columns(self) -> int:
        return self.lanes * self.micro_vectors

    def as_tuple(self) -> tuple:
        """The fields in order (what the lowered-kernel cache stores: plain data, no class)."""
        return tuple(getattr(self, name) for name in self.__dataclass_fields__)

    @classmethod
    def from_tuple(cls, fields: tuple) -> PackedMatmul:
        """The description `as_tuple` gave (a TypeError where the fields do not fit)."""
        values = list(fields)
        names = list(cls.__dataclass_fields__)
        for name in ("batches", "depth_axes", "column_axes"):
            position = names.index(name)
            if position < len(values):
                values[position] = tuple(tuple(int(value) for value in entry) for entry in values[position])
        return cls(*values)

    @property
    def gathers(self) -> bool:
        """Whether an operand is read through offset tables (a depth of several axes, or B's columns of several)."""
        return bool(self.depth_axes or self.column_axes)


def tile_fits(info: DeviceInfo, rows: int, vectors: int) -> bool:
    """Whether a micro-kernel of rows x vectors vector accumulators, its B vectors and the broadcast A value fit
    in the device's vector registers."""
    return rows >= 1 and vectors >= 1 and rows * vectors + vectors + 1 <= info.vector_registers


def micro_tile(info: DeviceInfo) -> tuple[int, int] | None:
    """The micro-kernel's (rows, vectors of columns) for a device: two vectors of columns, and as many rows as leave
    registers for the two B vectors and the broadcast A value (6 with AVX2's 16 registers), at most MAX_MICRO_ROWS;
    None where the device has no float32 vectors of 4 lanes or more."""
    if info.preferred_vector_width < 4 or not info.vector_ops:
        return None
    rows = min(MAX_MICRO_ROWS, (info.vector_registers - 3) // 2)
    return (rows, 2) if rows >= 2 else None


def default_tile(info: DeviceInfo, rows: int, columns: int) -> tuple[int, int]:
    """The micro-kernel's tile for a matmul of `rows` x `columns` outputs (on a device with micro_tile): WIDE_TILE
    where it fits the registers, the output has WIDE_TILE_ROWS rows and 4 of its widths of columns, and its edge
    tiles compute at most WIDE_EDGE_ALLOWANCE more (padded) outputs than the narrow tile's; else micro_tile's."""
    narrow = micro_tile(info)
    assert narrow is not None
    lanes = info.preferred_vector_width
    wide = tile_fits(info, *WIDE_TILE) and rows >= WIDE_TILE_ROWS and columns >= 4 * WIDE_TILE[1] * lanes \
        and _padded_outputs(rows, columns, WIDE_TILE, lanes) <= (1 + WIDE_EDGE_ALLOWANCE) * _padded_outputs(
            rows, columns, narrow, lanes)
    return WIDE_TILE if wide else narrow


def _padded_outputs(rows: int, columns: int, tile: tuple[int, int], lanes: int) -> int:
    """The outputs a micro-kernel tile computes over a rows x columns output, its edge tiles' padding included."""
    tile_rows, tile_columns = tile[0], tile[1] * lanes
    return -(-rows // tile_rows) * tile_rows * -(-columns // tile_columns) * tile_columns


Axis = TypeVar("Axis", bound=tuple[int, ...])


def _coalesced(axes: list[Axis]) -> list[Axis]:
    """Axes as (size, then a stride per operand: A's, B's, the output's), outermost first, with each axis merged into
    the next where that walks every operand alike (every stride the next one's times its size: a 1x1 convolution's
    rows and columns of pixels, a batch of rows read from one matrix), so the packed panels span it."""
    merged: list[Axis] = []
    for entry in reversed(axes):
        if merged:
            inner = merged[-1]
            if all(outer == inner_stride * inner[0] for outer, inner_stride in zip(entry[1:], inner[1:])):
                merged[-1] = cast(Axis, (entry[0] * inner[0], *inner[1:]))
                continue
        merged.append(entry)
    return merged[::-1]


def _linear(index: IRNode, known: dict[int, int]) -> tuple[int, dict[int, int]] | None:
    """An index as (constant, {position in `known`'s order: coefficient}) where it is a sum of the loop variables
    `known` lists (by id, their positions) times constants, differences included (a flipped filter's 2 - ky), else
    None."""
    terms, constant = linear_terms(index)
    coefficients: dict[int, int] = {}
    for node, factor in terms:
        position = known.get(id(node))
        if position is not None:
            coefficients[position] = coefficients.get(position, 0) + factor
            continue
        if node.op is not Op.SUB:
            return None
        for side, sign in zip(node.srcs, (factor, -factor)):
            linear = _linear(side, known)
            if linear is None:
                return None
            constant += sign * linear[0]
            for position, coefficient in linear[1].items():
                coefficients[position] = coefficients.get(position, 0) + sign * coefficient
    return constant, coefficients


def packed_matmul(kernel: Kernel, info: DeviceInfo, blocks: tuple[int, int, int] | None = None,
                  tile: tuple[int, int] | None = None) -> PackedMatmul | None:
    """The packed form of `kernel` on a device whose renderer has it (DeviceInfo.packed_matmul), or None: the kernel
    is not a plain float32 matmul (see the module's docstring), or is too small to gain from packing. `blocks` (the
    cache blocks over k, rows and columns) and `tile` (the micro-kernel's rows and vectors of columns) are a kernel
    search's (opt.Plan.packed_blocks, packed_tile); None (a block of 0) takes the defaults (default_tile; DEPTH_BLOCK
    or, for the wide tile, WIDE_DEPTH_BLOCK, ROW_BLOCK or, for a short depth, SHORT_DEPTH_ROW_BLOCK, COLUMN_BLOCK). The
    row and column blocks are rounded down to whole micro-kernel tiles (at least one); a tile that does not fit the
    device's registers is None."""
    narrow = micro_tile(info)
    if not info.packed_matmul or narrow is None or (tile is not None and not tile_fits(info, *tile)):
        return None
    shape = kernel.output.shape
    reduced = sum_axes(kernel, MINIMUM_DEPTH)
    if reduced is None or kernel.output.dtype != dtypes.float32:
        return None
    builder = Builder()
    place = output_ranges(builder, shape)
    depths = tuple(builder.new_range(size, dtypes.int32) for size in reduced)
    known = {id(node): axis for axis, node in enumerate(place) if node.op is IROp.RANGE}
    known.update({id(node): len(shape) + axis for axis, node in enumerate(depths)})
    product = reduced_product(kernel, builder, place, depths)
    if product is None:
        return None
    # the output must be the reduce's value itself, stored where the output's shape puts it
    stand_in = builder.param(-1, dtypes.float32, False)
    store = ReduceReplaced(kernel, builder, None, stand_in).store_output(place)
    if store.srcs[2] is not stand_in:
        return None
    factors = []
    for factor in product.srcs:
        if factor.op is not IROp.LOAD or len(factor.srcs) != 2 or factor.dtype != dtypes.float32 \
                or factor.srcs[0].op is not IROp.PARAM or factor.srcs[0].arg[1]:
            return None
        linear = _linear(factor.srcs[1], known)
        if linear is None:
            return None
        factors.append((factor.srcs[0].arg[0], *linear))
    (a, a_offset, a_strides), (b, b_offset, b_strides) = factors
    # the reduced axes as (size, A's stride, B's stride), those that walk both as one merged, and each operand's one
    # stride over all of them where it has one (else 0: read through a table of offsets)
    depth_axes: list[tuple[int, int, int]] = _coalesced([
        (size, a_strides.get(len(shape) + axis, 0), b_strides.get(len(shape) + axis, 0))
        for axis, size in enumerate(reduced)])
    depth_strides = tuple(_one_stride([(size, strides[operand]) for size, *strides in depth_axes])
                          for operand in range(2))
    if any(all(entry[operand + 1] == 0 for entry in depth_axes) for operand in range(2)):
        return None  # (an operand the sum does not walk: no matmul)
    output_strides = strides_of(shape)
    # per output axis (size, A's stride, B's stride, the output's stride), neighbours that walk all three operands
    # as one axis merged
    axes: list[tuple[int, int, int, int]] = _coalesced([
        (extent, a_strides.get(axis, 0), b_strides.get(axis, 0), output_strides[axis])
        for axis, extent in enumerate(shape) if extent != 1])
    rows = [axis for axis, (_, a_stride, b_stride, _) in enumerate(axes) if a_stride and not b_stride]
    columns = [axis for axis, (_, a_stride, b_stride, _) in enumerate(axes) if b_stride and not a_stride]
    if not rows or not columns:
        return None
    row, column = rows[-1], columns[-1]
    if axes[row][3] == 1:  # the output transposed: compute out^T = B^T A^T
        (a, a_offset), (b, b_offset) = (b, b_offset), (a, a_offset)
        axes = [(extent, b_stride, a_stride, out_stride) for extent, a_stride, b_stride, out_stride in axes]
        depth_axes = [(size, b_stride, a_stride) for size, a_stride, b_stride in depth_axes]
        depth_strides = depth_strides[::-1]
        row, column = column, row
    if axes[column][3] != 1:
        return None
    first = _first_column_axis(axes, row, column, info.preferred_vector_width * narrow[1])
    column_count = prod(entry[0] for entry in axes[first:column + 1])
    if axes[row][0] < MINIMUM_SIDE or column_count < MINIMUM_SIDE:
        return None
    if first < column or not all(depth_strides):
        if axes[column][2] != 1 and (first < column or axes[row][0] < TRANSPOSED_GATHER_ROWS):
            return None
        if prod(reduced) < GATHER_MINIMUM_DEPTH or axes[row][0] < GATHER_MINIMUM_ROWS[0] or (
                axes[row][0] < GATHER_MINIMUM_ROWS[1] and column_count < GATHER_WIDE_COLUMNS):
            return None
    batches = tuple(entry for axis, entry in enumerate(axes) if axis != row and not first <= axis <= column)
    if tile is None:
        tile = default_tile(info, axes[row][0], column_count)
    micro_rows, micro_vectors = tile
    micro_columns = micro_vectors * info.preferred_vector_width
    defaults = (WIDE_DEPTH_BLOCK if tile == WIDE_TILE else DEPTH_BLOCK,
                ROW_BLOCK if prod(reduced) > SHORT_DEPTH else SHORT_DEPTH_ROW_BLOCK, COLUMN_BLOCK)
    depth_block, row_block, column_block = (chosen or default for chosen, default in zip(blocks or (0, 0, 0), defaults))
    return PackedMatmul(
        rows=axes[row][0], columns=column_count, depth=prod(reduced), a=a, b=b, a_offset=a_offset,
        a_row_stride=axes[row][1], a_depth_stride=depth_strides[0], b_offset=b_offset,
        b_depth_stride=depth_strides[1], b_column_stride=axes[column][2] if first == column else 0,
        output_row_stride=axes[row][3], batches=batches, lanes=info.preferred_vector_width,
        micro_rows=micro_rows, micro_vectors=micro_vectors, depth_block=max(1, depth_block),
        row_block=max(micro_rows, row_block // micro_rows * micro_rows),
        column_block=max(micro_columns, column_block // micro_columns * micro_columns),
        depth_axes=tuple(depth_axes) if len(depth_axes) > 1 else (),
        column_axes=tuple((entry[0], entry[2]) for entry in axes[first:column + 1]) if first < column else ())


def _one_stride(axes: list[tuple[int, int]]) -> int:
    """The one stride that walks (size, stride) axes (outermost first) as one, or 0 where none does."""
    merged: list[tuple[int, int]] = _coalesced(axes)
    return merged[0][1] if len(merged) == 1 else 0


def _first_column_axis(axes: list[tuple[int, int, int, int]], row: int, column: int, micro_columns: int) -> int:
    """The outermost output axis the columns span: `column` alone, or, where its length fills the micro-kernel's
    panels badly (more than COLUMN_PADDING of them padding: a 56-pixel row in panels of 32), the axes before it that
    B walks and A does not, contiguous with it in the output (a convolution's rows of pixels), so the panels run on
    across them and B's columns are read through a table of offsets."""
    size = axes[column][0]
    if -(-size // micro_columns) * micro_columns <= (1 + COLUMN_PADDING) * size:
        return column
    first, span = column, size
    while first > 0 and first - 1 != row and axes[first - 1][1] == 0 and axes[first - 1][2] != 0 \
            and axes[first - 1][3] == span:
        first -= 1
        span *= axes[first][0]
    return first


def lower_packed_matmul(kernel: Kernel, name: str, info: DeviceInfo, blocks: tuple[int, int, int] | None = None,
                        tile: tuple[int, int] | None = None) -> KernelIR | None:
    """The kernel as a packed-panel matmul (the plain lowering, with `packed` set), or None where it is not one
    (`blocks`, `tile`: as packed_matmul's)."""
    packed = packed_matmul(kernel, info, blocks, tile)
    if packed is None:
        return None
    plain = lower_kernel(kernel, name)
    if prod(kernel.output.shape) != plain.global_size or len(plain.params) <= max(packed.a, packed.b):
        return None
    return KernelIR(plain.name, plain.params, plain.global_size, plain.sink, plain.index_dtype, packed=packed)
