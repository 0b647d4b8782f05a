"""C source of the packed-panel matmul (ir/packed_matmul.py): one library function per micro-kernel tile, whose
sizes and strides are read at run time, so a new matmul shape compiles nothing.

The library function (`library_source`) holds the packing, the register-tiled micro-kernel and GotoBLAS's loops;
its micro-kernel's tile (float32 lanes, rows, vectors of columns) is fixed in its source, and everything a kernel
adds (sizes, strides, offsets, batch dims, cache blocks, threads) is an array of longs (`shape_values`). The c
backend builds each tile's library once (cached on disk like kernels) and launches a packed kernel as a call of it
with the kernel's array (CDevice); `render_packed_matmul` renders a kernel as the library and a function calling it
with its array, a source that builds alone (for the kernel search, debugging, and a renderer's contract)."""

from __future__ import annotations

import functools

from ember.ir.ir import KernelIR
from ember.ir.packed_matmul import PackedMatmul

PARALLEL_PRODUCTS = 1 << 18  # multiply-adds below which a packed matmul runs on one thread
# rows up to which B (columns up to which A) is read in place, not packed: packing costs about a copy of the operand
# for each use, more than the products of a small matmul (one thread: 64 x 512 x 128 60 -> 54 us, 256^3 165 -> 148)
DIRECT_SIDE = 256
# A's floats (its rows padded to whole panels, times k, times its variants: the elements of the batch dims it walks)
# up to which an A that batch elements share is packed once a call for all of them (32 MB)
SHARED_A_FLOATS = 1 << 23
# the places of the values in a packed matmul's array of longs (`shape_values`), then 4 per batch dim (its size,
# A's stride, B's stride, the output's stride), 3 per depth axis (its size, A's stride, B's stride) and 2 per column
# axis (its size, B's stride)
SHAPE_FIELDS = ("rows", "columns", "depth", "a_offset", "a_row_stride", "a_depth_stride", "b_offset",
                "b_depth_stride", "b_column_stride", "output_row_stride", "depth_block", "row_block",
                "column_block", "threads", "batch_dims", "depth_dims", "column_dims")


def packed_products(packed: PackedMatmul) -> int:
    """The multiply-adds of a packed matmul (below PARALLEL_PRODUCTS it runs on one thread)."""
    batches = 1
    for size, *_ in packed.batches:
        batches *= size
    return batches * packed.rows * packed.columns * packed.depth


def library_function(packed: PackedMatmul) -> str:
    """The name of the library function that computes a packed matmul: one per micro-kernel tile."""
    return _function_name(packed.lanes, packed.micro_rows, packed.micro_vectors)


def _function_name(lanes: int, rows: int, vectors: int) -> str:
    return f"ember_packed_matmul_f32x{lanes}_{rows}x{vectors}"


def _at(field: str) -> str:
    """C reading a SHAPE_FIELDS value from the library function's `shape` array."""
    return f"shape[{SHAPE_FIELDS.index(field)}]"


def shape_values(packed: PackedMatmul, threads: int | None) -> list[int]:
    """What the library function reads at run time, in SHAPE_FIELDS's order, then each batch dim's four values,
    each depth axis's three and each column axis's two (`threads`: OpenMP threads, None for all: 0 in the array)."""
    fields = {name: getattr(packed, name) for name in SHAPE_FIELDS if hasattr(packed, name)}
    fields.update(threads=threads or 0, batch_dims=len(packed.batches), depth_dims=len(packed.depth_axes),
                  column_dims=len(packed.column_axes))
    axes = (*packed.batches, *packed.depth_axes, *packed.column_axes)
    return [int(fields[name]) for name in SHAPE_FIELDS] + [int(value) for axis in axes for value in axis]


def render_packed_matmul(kernel: KernelIR, parameters: list[str], threads: int | None) -> str:
    """The C function `kernel.name(parameters)` computing the kernel's packed matmul: the tile's library function
    (guarded, so several kernels build as one source) and a call of it with the kernel's sizes and strides."""
    packed = kernel.packed
    assert packed is not None
    values = ", ".join(f"{value}L" for value in shape_values(packed, threads))
    return "\n".join([
        library_source(packed.lanes, packed.micro_rows, packed.micro_vectors),
        f"void {kernel.name}({', '.join(parameters)}) {{",
        f"  static const long shape[] = {{{values}}};",
        f"  {library_function(packed)}(shape, data0, data{packed.a}, data{packed.b});",
        "}",
    ]) + "\n"


@functools.cache
def library_source(lanes: int, rows: int, vectors: int) -> str:
    """C source of the library function for a micro-kernel of rows x vectors vectors of `lanes` float32 lanes:
    `void name(const long* shape, float* out, const float* a, const float* b)`. The output is split into tasks (a
    batch element, or a part of one: a range of column panels times a range of row panels), one thread each, so no
    thread waits for another; each task walks GotoBLAS's loops over its part with its own packed panels. An operand
    read through offset tables (a depth of several axes, B's columns of several: PackedMatmul.gathers) is packed
    from the tables, built once a call; an A that batch elements share is packed once a call for all of them."""
    name = _function_name(lanes, rows, vectors)
    columns = lanes * vectors
    vector = f"ember_packed_float32x{lanes}"
    # (the cache blocks and threads are read where the values a task uses are derived from them, the depth and column
    # dims by name_offset)
    reads = "\n".join(f"  const long {field} = {_at(field)};" for field in SHAPE_FIELDS
                      if field not in ("depth_block", "row_block", "column_block", "threads", "depth_dims",
                                       "column_dims"))
    lines = [
        "#include <stdlib.h>",
        "#include <omp.h>",
        f"#ifndef {name.upper()}", f"#define {name.upper()}",
        f"#ifndef {vector.upper()}", f"#define {vector.upper()}",
        f"typedef float {vector} __attribute__((vector_size({4 * lanes})));",
        f"typedef float {vector}_u __attribute__((vector_size({4 * lanes}), aligned(4)));",
        "#endif",
        *_pack_b(name, columns, lanes, vector),
        *_pack_a(name, rows),
        *_gathers(name, rows, columns, lanes, vector),
        *_micro_kernel(name, lanes, rows, vectors, vector),
        *_offset(name),
        *_plain_task(name),
        f"void {name}(const long* restrict shape, float* restrict out, const float* restrict a,"
        " const float* restrict b) {",
        reads,
        f"  const long* batch_shape = shape + {len(SHAPE_FIELDS)};",
        "  long batch_count = 1;",
        "  for (long dim = 0; dim < batch_dims; dim++) batch_count *= batch_shape[4 * dim];",
        f"  const long depth_blocks = (depth + {_at('depth_block')} - 1) / {_at('depth_block')};",
        "  const long depth_block = (depth + depth_blocks - 1) / depth_blocks;  /* (blocks of equal size) */",
        f"  const long row_panels = (rows + {rows - 1}) / {rows}, column_panels = (columns + {columns - 1}) / {columns};",
        f"  const long column_block = {_at('column_block')} < column_panels * {columns} ? {_at('column_block')}"
        f" : column_panels * {columns};",
        f"  const long row_block = {_at('row_block')} < row_panels * {rows} ? {_at('row_block')} : row_panels * {rows};",
        f"  int threads = batch_count * rows * columns * depth >= {PARALLEL_PRODUCTS}L"
        f" ? ({_at('threads')} > 0 ? (int){_at('threads')} : omp_get_max_threads()) : 1;",
        "  if (threads < 1) threads = 1;",
        # parts of one batch element: none where the batch elements share the threads evenly
        "  const long parts = batch_count % threads == 0 ? 1 : threads;",
        # along the longer side first (each column part packs all of A's rows again, each row part all of B's
        # columns: splitting the longer side packs the shorter operand again, the least copying)
        "  long column_parts, row_parts;",
        "  if (columns >= rows) {",
        "    column_parts = parts < column_panels ? parts : column_panels;",
        "    row_parts = parts / column_parts; if (row_parts > row_panels) row_parts = row_panels;",
        "  } else {",
        "    row_parts = parts < row_panels ? parts : row_panels;",
        "    column_parts = parts / row_parts; if (column_parts > column_panels) column_parts = column_panels;",
        "  }",
        "  const long tasks = batch_count * column_parts * row_parts;",
        # an operand read through offset tables (its stride 0): the tables built once for every task
        "  const int a_gather = a_depth_stride == 0, b_gather = b_depth_stride == 0 || b_column_stride == 0;",
        "  long* a_offsets = 0; long* b_offsets = 0; long* column_offsets = 0;",
        "  if (a_gather || b_gather) {",
        "    a_offsets = malloc(sizeof(long) * (2 * depth + columns));",
        "    if (a_offsets != 0) {",
        "      b_offsets = a_offsets + depth; column_offsets = b_offsets + depth;",
        "      for (long k = 0; k < depth; k++) {",
        f"        a_offsets[k] = {name}_offset(shape, k, 0);",
        f"        b_offsets[k] = {name}_offset(shape, k, 1);",
        "      }",
        "      for (long column = 0; column < columns; column++)",
        f"        column_offsets[column] = {name}_offset(shape, column, 2);",
        "    }",
        "  }",
        # an operand read in place instead of packed: A where few column panels read it again (its values are
        # broadcast one at a time, any strides), B where few row panels do and its columns are contiguous (its
        # rows are vector loads); packing costs about a copy of the operand per use, which small matmuls (an RNN
        # step's 64 x 128 x 512) spend more time on than on the products
        f"  const int direct_a = columns <= {DIRECT_SIDE} && !a_gather;",
        f"  const int direct_b = rows <= {DIRECT_SIDE} && b_column_stride == 1 && !b_gather;",
        # A that several batch elements share (batch dims along which its stride is 0: a convolution's filters, its
        # input gradient's flipped ones, a filters' gradient's output gradient for every filter offset) is packed
        # once a call, each of its variants (the batch dims A walks) all of it, in panels of every block of k, and
        # each task reads its panels there
        f"  const long padded_rows = row_panels * {rows}, a_size = padded_rows * depth;",
        "  long a_variants = 1;",
        "  for (long dim = 0; dim < batch_dims; dim++)",
        "    if (batch_shape[4 * dim + 1] != 0) a_variants *= batch_shape[4 * dim];",
        "  const int shared_a = !direct_a && batch_count > a_variants && !(a_gather && a_offsets == 0)"
        f" && a_variants * a_size <= {SHARED_A_FLOATS}L;",
        "  float* a_shared = shared_a ? aligned_alloc(64, (4 * a_variants * a_size + 63) / 64 * 64) : 0;",
        "  if (a_shared != 0) {",
        "    #pragma omp parallel for num_threads(threads) if(threads > 1) schedule(static)",
        "    for (long job = 0; job < a_variants * row_panels; job++) {",
        "      const long variant = job / row_panels, panel = job % row_panels;",
        "      long a_origin = a_offset, rest = variant;",
        "      for (long dim = batch_dims - 1; dim >= 0; dim--) {",
        "        const long* sizes = batch_shape + 4 * dim;",
        "        if (sizes[1] == 0) continue;",
        "        a_origin += rest % sizes[0] * sizes[1]; rest /= sizes[0];",
        "      }",
        "      for (long k = 0; k < depth; k += depth_block) {",
        "        const long depth_count = depth - k < depth_block ? depth - k : depth_block;",
        f"        const long height = rows - panel * {rows} < {rows} ? rows - panel * {rows} : {rows};",
        f"        const float* a_block = a + a_origin + panel * {rows} * a_row_stride + k * a_depth_stride;",
        f"        float* target = a_shared + variant * a_size + k * padded_rows + panel * {rows} * depth_count;",
        f"        if (a_gather) {name}_pack_a_gather(a_block, target, height, depth_count, a_row_stride,"
        " a_offsets + k);",
        f"        else {name}_pack_a(a_block, target, height, depth_count, a_row_stride, a_depth_stride);",
        "      }",
        "    }",
        "  }",
        "  #pragma omp parallel num_threads(threads) if(threads > 1)",
        "  {",
        f"    float* a_pack = aligned_alloc(64, (4 * (direct_a ? {rows} : row_block) * depth_block + 63) / 64 * 64);",
        f"    float* b_pack = aligned_alloc(64, (4 * depth_block * (direct_b ? {columns} : column_block) + 63) / 64 * 64);",
        "    #pragma omp for schedule(static)",
        "    for (long task = 0; task < tasks; task++) {",
        "      const long batch = task / (column_parts * row_parts), part = task % (column_parts * row_parts);",
        "      const long column_part = part % column_parts, row_part = part / column_parts;",
        f"      const long column_start = column_part * column_panels / column_parts * {columns};",
        f"      long column_end = (column_part + 1) * column_panels / column_parts * {columns};",
        "      if (column_end > columns) column_end = columns;",
        f"      const long row_start = row_part * row_panels / row_parts * {rows};",
        f"      long row_end = (row_part + 1) * row_panels / row_parts * {rows};",
        "      if (row_end > rows) row_end = rows;",
        "      long a_origin = a_offset, b_origin = b_offset, out_origin = 0, rest = batch, variant = 0, place = 1;",
        "      for (long dim = batch_dims - 1; dim >= 0; dim--) {",
        "        const long* sizes = batch_shape + 4 * dim;",
        "        const long index = rest % sizes[0]; rest /= sizes[0];",
        "        a_origin += index * sizes[1]; b_origin += index * sizes[2]; out_origin += index * sizes[3];",
        "        if (sizes[1] != 0) { variant += index * place; place *= sizes[0]; }",
        "      }",
        "      if (a_pack == 0 || b_pack == 0 || ((a_gather || b_gather) && a_offsets == 0)) {",
        # (no memory for the panels or the tables: plain loops)
        f"        {name}_plain(shape, a + a_origin, b + b_origin, out + out_origin, row_start, row_end, column_start,"
        " column_end);",
        "        continue;",
        "      }",
        # a task of one block of rows gathering B (a convolution) packs each panel of B just before its products (it
        # stays in L1 for every row panel), not a block of them that the products read back from L2 or memory once
        # (64 filters over 56 x 56 pixels: 2% faster); a plain B transposed packed so ran a 64 x 128 product of an
        # MLP 2.5x slower (45 against 18 us), so it keeps the block
        "      const int panel_b = b_gather && row_end - row_start <= row_block;",
        "      for (long column = column_start; column < column_end; column += column_block) {",
        "        const long column_count = column_end - column < column_block ? column_end - column : column_block;",
        "        for (long k = 0; k < depth; k += depth_block) {",
        "          const long depth_count = depth - k < depth_block ? depth - k : depth_block;",
        "          const float* b_block = b + b_origin + k * b_depth_stride + column * b_column_stride;",
        "          if (panel_b) {}",
        f"          else if (b_gather) {name}_pack_b_gather(b + b_origin, b_pack, depth_count, column_count,"
        " b_offsets + k, column_offsets + column, b_column_stride);",
        f"          else if (!direct_b) {name}_pack_b(b_block, b_pack, depth_count, column_count, b_depth_stride,"
        " b_column_stride);",
        "          for (long row = row_start; row < row_end; row += row_block) {",
        "            const long row_count = row_end - row < row_block ? row_end - row : row_block;",
        "            const float* a_block = a + a_origin + row * a_row_stride + k * a_depth_stride;",
        "            const float* a_panels = a_pack;",
        "            if (a_shared != 0) a_panels = a_shared + variant * a_size + k * padded_rows + row * depth_count;",
        f"            else if (a_gather) {name}_pack_a_gather(a_block, a_pack, row_count, depth_count, a_row_stride,"
        " a_offsets + k);",
        f"            else if (!direct_a) {name}_pack_a(a_block, a_pack, row_count, depth_count, a_row_stride,"
        " a_depth_stride);",
        f"            for (long panel_column = 0; panel_column < column_count; panel_column += {columns}) {{",
        f"              const long width = column_count - panel_column < {columns} ? column_count - panel_column"
        f" : {columns};",
        # B in place: its rows read where they are; the panel at B's edge (narrower than a panel) read in place too,
        # from a panel's width before the edge, its tile stored from its own first column on (the columns before,
        # the previous panel's, computed again and not stored), where B has a panel's width: packing it (with its
        # zeros) cost a copy of B's last panel per task and call (127x255 @ 255x63, A's last rows read alike: 27 ->
        # 15 us, 2 threads)
        "              const float* b_panel = b_pack + panel_column * depth_count;",
        f"              long b_step = {columns}, column_shift = 0;",
        f"              if (direct_b && width == {columns}) {{ b_panel = b_block + panel_column; b_step = b_depth_stride; }}",
        f"              else if (direct_b && column + panel_column + width >= {columns}) {{",
        f"                column_shift = {columns} - width;",
        "                b_panel = b_block + panel_column - column_shift; b_step = b_depth_stride;",
        "              } else if (direct_b) {",
        f"                {name}_pack_b(b_block + panel_column, b_pack, depth_count, width, b_depth_stride, 1);",
        "                b_panel = b_pack;",
        "              } else if (panel_b) {",
        f"                if (b_gather) {name}_pack_b_gather(b + b_origin, b_pack, depth_count, width, b_offsets + k,"
        " column_offsets + column + panel_column, b_column_stride);",
        f"                else {name}_pack_b(b_block + panel_column * b_column_stride, b_pack, depth_count, width,"
        " b_depth_stride, b_column_stride);",
        "                b_panel = b_pack;",
        "              }",
        f"              for (long panel_row = 0; panel_row < row_count; panel_row += {rows}) {{",
        f"                const long height = row_count - panel_row < {rows} ? row_count - panel_row : {rows};",
        "                const float* a_panel = a_panels + panel_row * depth_count;",
        f"                long a_row_step = 1, a_depth_step = {rows}, row_shift = 0;",
        f"                if (direct_a && height == {rows}) {{",
        "                  a_panel = a_block + panel_row * a_row_stride; a_row_step = a_row_stride;"
        " a_depth_step = a_depth_stride;",
        # (A's last rows as B's last columns: from a panel's height before the edge, where A has as many rows)
        f"                }} else if (direct_a && row + panel_row + height >= {rows}) {{",
        f"                  row_shift = {rows} - height;",
        "                  a_panel = a_block + (panel_row - row_shift) * a_row_stride; a_row_step = a_row_stride;"
        " a_depth_step = a_depth_stride;",
        "                } else if (direct_a) {",
        f"                  {name}_pack_a(a_block + panel_row * a_row_stride, a_pack, height, depth_count,"
        " a_row_stride, a_depth_stride);",
        "                  a_panel = a_pack;",
        "                }",
        f"                {name}_micro(depth_count, a_panel, a_row_step, a_depth_step, b_panel, b_step,",
        "                             out + out_origin + (row + panel_row - row_shift) * output_row_stride + column"
        " + panel_column - column_shift,",
        "                             output_row_stride, row_shift, row_shift + height, column_shift,"
        " column_shift + width, k > 0);",
        "              }",
        "            }",
        "          }",
        "        }",
        "      }",
        "    }",
        "    free(a_pack);",
        "    free(b_pack);",
        "  }",
        "  free(a_offsets);",
        "  free(a_shared);",
        "}",
        "#endif",
    ]
    return "\n".join(lines)


def _pack_b(name: str, columns: int, lanes: int, vector: str) -> list[str]:
    """B's block (depth_count x column_count from `b`) as panels `columns` wide, k-major, zeros past the edge. A
    transposed B (its k contiguous: a Linear's weight, x @ W^T) is copied `lanes` x `lanes` at a time through a
    transpose in vector registers (`_transpose`): lane by lane, the copy was a third of a 64 x 128 x 512 product."""
    element = "b[k * depth_stride + (panel + column) * column_stride]"
    return [
        *_transpose(name, lanes, vector),
        f"static void {name}_pack_b(const float* restrict b, float* restrict pack, long depth_count,"
        " long column_count, long depth_stride, long column_stride) {",
        f"  for (long panel = 0; panel < column_count; panel += {columns}) {{",
        "    float* restrict target = pack + panel * depth_count;",
        f"    if (column_count - panel >= {columns}) {{",
        "      if (column_stride == 1)",  # (B's rows contiguous, the usual case: gcc copies them in vectors)
        "        for (long k = 0; k < depth_count; k++)",
        f"          for (long column = 0; column < {columns}; column++)"
        f" target[k * {columns} + column] = b[k * depth_stride + panel + column];",
        "      else {",
        "        long k = 0;",
        "        if (depth_stride == 1)",
        f"          for (; k + {lanes} <= depth_count; k += {lanes})",
        f"            for (long column = 0; column < {columns}; column += {lanes})",
        f"              {name}_transpose(b + (panel + column) * column_stride + k, column_stride,"
        f" target + k * {columns} + column, {columns});",
        "        for (; k < depth_count; k++)",
        f"          for (long column = 0; column < {columns}; column++) target[k * {columns} + column] = {element};",
        "      }",
        "    } else {",
        "      const long width = column_count - panel;",
        "      for (long k = 0; k < depth_count; k++)",
        f"        for (long column = 0; column < {columns}; column++)",
        f"          target[k * {columns} + column] = column < width ? {element} : 0.0f;",
        "    }",
        "  }",
        "}",
    ]


def _transpose(name: str, lanes: int, vector: str) -> list[str]:
    """`name_transpose(source, source_stride, target, target_stride)`: target row i, lane j = source row j, lane i
    for a lanes x lanes block, in vector registers: at each scale s (1, 2, 4, ...) the off-diagonal s x s blocks of
    every 2s x 2s block swap, one two-source shuffle per row (log2(lanes) rounds)."""
    mask = f"{name}_lane_mask"
    shuffles = [f"  {vector} low, high;"]
    scale = 1
    while scale < lanes:
        low = ", ".join(str(lane if not lane & scale else lanes + lane - scale) for lane in range(lanes))
        high = ", ".join(str(lane + scale if not lane & scale else lanes + lane) for lane in range(lanes))
        for row in range(lanes):
            if row & scale:
                continue
            other = row + scale
            shuffles.append(f"  low = __builtin_shuffle(r{row}, r{other}, ({mask}){{{low}}}); high = __builtin_shuffle("
                            f"r{row}, r{other}, ({mask}){{{high}}}); r{row} = low; r{other} = high;")
        scale *= 2
    return [
        f"typedef int {mask} __attribute__((vector_size({4 * lanes})));",
        f"static inline void {name}_transpose(const float* restrict source, long source_stride, float* restrict"
        " target, long target_stride) {",
        f"  {vector} " + ", ".join(f"r{row} = *(const {vector}_u*)(source + {row} * source_stride)"
                                   for row in range(lanes)) + ";",
        *shuffles,
        *(f"  *({vector}_u*)(target + {row} * target_stride) = r{row};" for row in range(lanes)),
        "}",
        # the first `count` (< lanes) lanes of each source row (the lanes past them not read: they may lie past the
        # end of the buffer), the first `count` rows of the target
        *_load_lanes(name, lanes, vector),
        f"static inline void {name}_transpose_short(const float* restrict source, long source_stride,"
        " float* restrict target, long target_stride, long count) {",
        f"  {vector} " + ", ".join(f"r{row} = {name}_load_lanes(source + {row} * source_stride, count)"
                                   for row in range(lanes)) + ";",
        *shuffles,
        *(f"  if ({row} < count) *({vector}_u*)(target + {row} * target_stride) = r{row};" for row in range(lanes)),
        "}",
    ]


# masked loads of a vector's first lanes where the compiler has the builtins and targets the ISA: (lanes, ISA macro,
# the builtins, C loading `count` lanes from `source`)
MASKED_LOADS = {
    16: ("__AVX512F__", ("__builtin_ia32_loadups512_mask",), [
        "  return __builtin_ia32_loadups512_mask(source, ({vector}){{0}}, (unsigned short)((1u << count) - 1u));",
    ]),
    8: ("__AVX__", ("__builtin_ia32_maskloadps256",), [
        "  typedef int lanes_mask __attribute__((vector_size(32)));",
        "  lanes_mask mask;",
        "  for (int lane = 0; lane < 8; lane++) mask[lane] = lane < count ? -1 : 0;",
        "  return __builtin_ia32_maskloadps256((const {vector}*)source, mask);",
    ]),
}


def _load_lanes(name: str, lanes: int, vector: str) -> list[str]:
    """`name_load_lanes(source, count)`: a vector of the `count` floats at `source`, zeros past them, by one masked
    load where MASKED_LOADS has the ISA, else lane by lane."""
    header = f"static inline {vector} {name}_load_lanes(const float* restrict source, long count) {{"
    loop = [header, f"  {vector} value = {{0}};", "  for (long lane = 0; lane < count; lane++) value[lane] = source[lane];",
            "  return value;", "}"]
    return _with_builtins(MASKED_LOADS.get(lanes), header, loop, vector)


def _with_builtins(builtins: tuple[str, tuple[str, ...], list[str]] | None, header: str, loop: list[str],
                   vector: str) -> list[str]:
    """A helper function as `builtins` (its ISA macro, the compiler builtins it calls, its body) writes it where the
    compiler targets the ISA and has the builtins, else as `loop` (its whole function, lane by lane)."""
    if builtins is None:
        return loop
    isa, names, body = builtins
    test = " && ".join([f"defined({isa})", *(f"__has_builtin({builtin})" for builtin in names)])
    return ["#if !defined(__has_builtin)", "#define __has_builtin(name) 0", "#endif", f"#if {test}", header,
            *(line.format(vector=vector) for line in body), "}", "#else", *loop, "#endif"]


def _pack_a(name: str, rows: int) -> list[str]:
    """A's block (row_count x depth_count from `a`) as panels `rows` tall, k-major, zeros past the edge. A panel is
    read a k at a time across its rows: its rows' streams are read together, not one after another (one thread,
    4096^2: 4% faster, its A from memory)."""
    element = "a[(panel + row) * row_stride + k * depth_stride]"
    return [
        f"static void {name}_pack_a(const float* restrict a, float* restrict pack, long row_count,"
        " long depth_count, long row_stride, long depth_stride) {",
        f"  for (long panel = 0; panel < row_count; panel += {rows}) {{",
        "    float* restrict target = pack + panel * depth_count;",
        f"    const long height = row_count - panel < {rows} ? row_count - panel : {rows};",
        f"    if (height == {rows})",
        "      for (long k = 0; k < depth_count; k++)",
        f"        for (long row = 0; row < {rows}; row++) target[k * {rows} + row] = {element};",
        "    else",
        "      for (long k = 0; k < depth_count; k++)",
        f"        for (long row = 0; row < {rows}; row++) target[k * {rows} + row] = row < height ? {element} : 0.0f;",
        "  }",
        "}",
    ]


def _micro_kernel(name: str, lanes: int, rows: int, vectors: int, vector: str) -> list[str]:
    """The micro-kernel: rows x vectors vectors of accumulators, each k adding a broadcast A value times a B vector
    (gcc contracts it to a fused multiply-add); then the tile is stored (or added, after the first block of k), only
    its rows `row_first` to `row_end` and columns `column_first` to `column_end` where it crosses an edge (a panel
    read from before the edge, or one of zeros past it): whole vectors where they are inside, the vector across the
    edge lane by lane (`name_store_lanes`)."""
    columns = lanes * vectors
    accumulators = [[f"c{row}_{column}" for column in range(vectors)] for row in range(rows)]
    lines = [
        *_store_lanes(name, lanes, vector),
        f"static inline void {name}_micro(long depth_count, const float* restrict a, long a_row_step,"
        " long a_depth_step, const float* restrict b, long b_step, float* restrict out, long stride, long row_first,"
        " long row_end, long column_first, long column_end, int accumulate) {",
        # the tile's rows of the output asked for now, so they arrive while the products run (a row a cache line;
        # without, a 4096^2 matmul waited on them after every tile: 100 against 130 GFLOP/s on one thread)
        *(f"  __builtin_prefetch(out + {row} * stride + {line}, 1, 3);"
          for row in range(rows) for line in range(0, columns, 16)),
        *(f"  {vector} {', '.join(f'{accumulator} = {{0}}' for accumulator in row)};" for row in accumulators),
        # A packed (its steps known: each A value at a constant offset, no register a row) or read in place
        f"  if (a_row_step == 1 && a_depth_step == {rows}) {{",
        *_products(accumulators, vector, lanes, "1", str(rows)),
        "  } else {",
        *_products(accumulators, vector, lanes, "a_row_step", "a_depth_step"),
        "  }",
    ]
    lines += [f"  if (row_first == 0 && row_end == {rows} && column_first == 0 && column_end == {columns}) {{",
              "    if (accumulate) {"]
    for row in range(rows):
        for column in range(vectors):
            lines.append(f"      *({vector}_u*)(out + {row} * stride + {column * lanes}) += {accumulators[row][column]};")
    lines.append("    } else {")
    for row in range(rows):
        for column in range(vectors):
            lines.append(f"      *({vector}_u*)(out + {row} * stride + {column * lanes}) = {accumulators[row][column]};")
    lines += ["    }", "  } else {", f"    {vector} tile[{rows * vectors}];"]
    for row in range(rows):
        for column in range(vectors):
            lines.append(f"    tile[{row * vectors + column}] = {accumulators[row][column]};")
    lines += [
        "    for (long row = row_first; row < row_end; row++)",
        f"      for (long start = 0; start < {columns}; start += {lanes}) {{",
        "        float* target = out + row * stride + start;",
        f"        const {vector} value = tile[row * {vectors} + start / {lanes}];",
        f"        if (start >= column_first && start + {lanes} <= column_end) {{",
        f"          if (accumulate) *({vector}_u*)target += value; else *({vector}_u*)target = value;",
        f"        }} else if (start + {lanes} > column_first && start < column_end)",
        f"          {name}_store_lanes(target, value, column_first > start ? column_first - start : 0,"
        f" column_end - start < {lanes} ? column_end - start : {lanes}, accumulate);",
        "      }",
        "  }",
        "}",
    ]
    return lines


# masked stores (and loads) of a vector's lanes, where the compiler has the builtins (what <immintrin.h>'s
# _mm512_mask_storeu_ps and _mm256_maskstore_ps expand to, without the header's compile time) and targets the ISA:
# (lanes, ISA macro, the builtins; C storing `value`'s lanes first to end at `target`, `mask` their bits or lanes)
MASKED_STORES = {
    16: ("__AVX512F__", ("__builtin_ia32_storeups512_mask", "__builtin_ia32_loadups512_mask"), [
        "  const unsigned short mask = (unsigned short)(((1u << end) - 1u) & ~((1u << first) - 1u));",
        "  if (accumulate) value += __builtin_ia32_loadups512_mask(target, ({vector}){{0}}, mask);",
        "  __builtin_ia32_storeups512_mask(target, value, mask);",
    ]),
    8: ("__AVX__", ("__builtin_ia32_maskstoreps256", "__builtin_ia32_maskloadps256"), [
        "  typedef int lanes_mask __attribute__((vector_size(32)));",
        "  lanes_mask mask;",
        "  for (int lane = 0; lane < 8; lane++) mask[lane] = lane >= first && lane < end ? -1 : 0;",
        "  if (accumulate) value += __builtin_ia32_maskloadps256(({vector}*)target, mask);",
        "  __builtin_ia32_maskstoreps256(({vector}*)target, mask, value);",
    ]),
}


def _store_lanes(name: str, lanes: int, vector: str) -> list[str]:
    """`name_store_lanes(target, value, first, end, accumulate)`: `value`'s lanes `first` to `end` stored (or added)
    at `target` (the vector across an edge of the output), one masked store where MASKED_STORES has the ISA, else
    lane by lane."""
    header = (f"static inline void {name}_store_lanes(float* restrict target, {vector} value, long first, long end,"
              " int accumulate) {")
    loop = [header, "  for (long lane = first; lane < end; lane++)",
            "    target[lane] = (accumulate ? target[lane] : 0.0f) + value[lane];", "}"]
    return _with_builtins(MASKED_STORES.get(lanes), header, loop, vector)


def _products(accumulators: list[list[str]], vector: str, lanes: int, row_step: str, depth_step: str) -> list[str]:
    """The micro-kernel's loop over k: each k, the B vectors loaded once and each row's A value broadcast over
    them."""
    lines = [
        "    #pragma GCC unroll 4",
        "    for (long k = 0; k < depth_count; k++) {",
        *(f"      const {vector} b{column} = *(const {vector}_u*)(b + k * b_step + {column * lanes});"
          for column in range(len(accumulators[0]))),
    ]
    for row, names in enumerate(accumulators):
        updates = " ".join(f"{accumulator} += value * b{column};" for column, accumulator in enumerate(names))
        lines.append(f"      {{ const float value = a[k * {depth_step} + {row} * {row_step}]; {updates} }}")
    return [*lines, "    }"]


def _plain_task(name: str) -> list[str]:
    """A task's part of the output by plain loops (where the panels' or the tables' memory could not be
    allocated)."""
    return [
        f"static void {name}_plain(const long* restrict shape, const float* restrict a, const float* restrict b,"
        " float* restrict out, long row_start, long row_end, long column_start, long column_end) {",
        "  for (long row = row_start; row < row_end; row++)",
        "    for (long column = column_start; column < column_end; column++) {",
        "      float sum = 0.0f;",
        f"      for (long k = 0; k < {_at('depth')}; k++)",
        f"        sum += a[row * {_at('a_row_stride')} + {name}_offset(shape, k, 0)]"
        f" * b[{name}_offset(shape, k, 1) + {name}_offset(shape, column, 2)];",
        f"      out[row * {_at('output_row_stride')} + column] = sum;",
        "    }",
        "}",
    ]


def _offset(name: str) -> list[str]:
    """`name_offset(shape, index, which)`: the offset of A's k-th reduced element (which 0), B's (1), or B's
    `index`-th column (2): the index times the stride, or, where that stride is 0, summed over the depth or column
    axes after the batch dims in `shape`."""
    batch_dims, depth_dims, column_dims = (_at(field) for field in ("batch_dims", "depth_dims", "column_dims"))
    return [
        f"static long {name}_offset(const long* restrict shape, long index, int which) {{",
        f"  const long stride = which == 0 ? {_at('a_depth_stride')} : which == 1 ? {_at('b_depth_stride')}"
        f" : {_at('b_column_stride')};",
        "  if (stride != 0) return index * stride;",
        f"  const long* depth_axes = shape + {len(SHAPE_FIELDS)} + 4 * {batch_dims};",
        f"  const long* axes = which == 2 ? depth_axes + 3 * {depth_dims} : depth_axes;",
        "  const long width = which == 2 ? 2 : 3, field = which == 2 ? 1 : which + 1;",
        "  long offset = 0;",
        f"  for (long dim = (which == 2 ? {column_dims} : {depth_dims}) - 1; dim >= 0; dim--) {{",
        "    offset += index % axes[width * dim] * axes[width * dim + field];",
        "    index /= axes[width * dim];",
        "  }",
        "  return offset;",
        "}",
    ]


def _gathers(name: str, rows: int, columns: int, lanes: int, vector: str) -> list[str]:
    """Packing through offset tables: A's block (row_count x depth_count) with its k-th value of a row at
    `depth_offsets[k]`, B's (depth_count x column_count) with its value (k, column) at depth_offsets[k] +
    column_offsets[column], both as _pack_a's and _pack_b's panels. B's panel is copied a run of contiguous columns at
    a time (a convolution's panel of 32 pixels: one run within a row of pixels, two across rows), each run by vectors
    (the last one overlapping the one before) or, below a vector, by halves and quarters of one."""
    widths = [width for width in (lanes, lanes // 2, lanes // 4) if width >= 4]
    copies = []
    for width in widths:
        kind = f"{vector}_u" if width == lanes else f"{name}_float32x{width}_u"
        if width != lanes:
            copies.append(f"typedef float {kind} __attribute__((vector_size({4 * width}), aligned(4)));")
    body = []
    for width in widths:
        kind = f"{vector}_u" if width == lanes else f"{name}_float32x{width}_u"
        body += [
            f"  if (count >= {width}) {{",
            "    long column = 0;",
            f"    for (; column + {width} <= count; column += {width})"
            f" *({kind}*)(target + column) = *(const {kind}*)(source + column);",
            f"    if (column < count)"
            f" *({kind}*)(target + count - {width}) = *(const {kind}*)(source + count - {width});",
            "    return;",
            "  }",
        ]
    return [
        *copies,
        # B's columns at a constant stride, its k contiguous in runs (a filters' gradient: channels apart, pixels
        # along a row): lanes x lanes blocks through the transposes in vector registers where `lanes` k are
        # consecutive, a run of fewer (a row's last 12 of 28 pixels, a row of 14) through the transpose of its
        # lanes alone, else (a k alone) a value at a time. A value at a time, the last 12 pixels of each row of 28
        # made a 128-filter gradient 233 GFLOP/s against 300 for the products around it
        f"static void {name}_pack_b_gather_transposed(const float* restrict b, float* restrict pack,"
        " long depth_count, long column_count, const long* restrict depth_offsets,"
        " const long* restrict column_offsets, long column_stride) {",
        f"  for (long panel = 0; panel < column_count; panel += {columns}) {{",
        "    float* restrict target = pack + panel * depth_count;",
        f"    const long width = column_count - panel < {columns} ? column_count - panel : {columns};",
        "    for (long k = 0; k < depth_count;) {",
        "      long run = 1;",  # (the k consecutive from k on, up to `lanes`)
        f"      if (width == {columns})",
        f"        while (run < {lanes} && k + run < depth_count && depth_offsets[k + run] == depth_offsets[k] + run)"
        " run++;",
        f"      if (run == {lanes}) {{",
        f"        for (long column = 0; column < {columns}; column += {lanes})",
        f"          {name}_transpose(b + depth_offsets[k] + column_offsets[panel + column], column_stride,"
        f" target + k * {columns} + column, {columns});",
        "      } else if (run > 1) {",
        f"        for (long column = 0; column < {columns}; column += {lanes})",
        f"          {name}_transpose_short(b + depth_offsets[k] + column_offsets[panel + column], column_stride,"
        f" target + k * {columns} + column, {columns}, run);",
        "      } else {",
        f"        for (long column = 0; column < {columns}; column++)",
        f"          target[k * {columns} + column] = column < width"
        " ? b[depth_offsets[k] + column_offsets[panel + column]] : 0.0f;",
        "      }",
        "      k += run;",
        "    }",
        "  }",
        "}",
        f"static inline void {name}_copy(float* restrict target, const float* restrict source, long count) {{",
        *body,
        "  for (long column = 0; column < count; column++) target[column] = source[column];",
        "}",
        f"static void {name}_pack_b_gather(const float* restrict b, float* restrict pack, long depth_count,"
        " long column_count, const long* restrict depth_offsets, const long* restrict column_offsets,"
        " long column_stride) {",
        f"  if (column_stride != 0 && column_stride != 1) {{ {name}_pack_b_gather_transposed(b, pack, depth_count,"
        " column_count, depth_offsets, column_offsets, column_stride); return; }",
        f"  long starts[{columns}], sources[{columns}], lengths[{columns}];",
        f"  for (long panel = 0; panel < column_count; panel += {columns}) {{",
        "    float* restrict target = pack + panel * depth_count;",
        f"    const long width = column_count - panel < {columns} ? column_count - panel : {columns};",
        "    long runs = 0;",
        "    for (long column = 0; column < width; column++) {",
        "      const long source = column_offsets[panel + column];",
        "      if (runs > 0 && source == sources[runs - 1] + lengths[runs - 1]) { lengths[runs - 1]++; continue; }",
        "      starts[runs] = column; sources[runs] = source; lengths[runs] = 1; runs++;",
        "    }",
        # a run at a time down every k: each run's copies take one branch of the copy (its length) k after k,
        # where alternating runs of different lengths mispredicted it
        "    for (long run = 0; run < runs; run++)",
        "      for (long k = 0; k < depth_count; k++)",
        f"        {name}_copy(target + k * {columns} + starts[run], b + depth_offsets[k] + sources[run],"
        " lengths[run]);",
        f"    if (width < {columns})",
        "      for (long k = 0; k < depth_count; k++)",
        f"        for (long column = width; column < {columns}; column++) target[k * {columns} + column] = 0.0f;",
        "  }",
        "}",
        f"static void {name}_pack_a_gather(const float* restrict a, float* restrict pack, long row_count,"
        " long depth_count, long row_stride, const long* restrict depth_offsets) {",
        f"  for (long panel = 0; panel < row_count; panel += {rows}) {{",
        "    float* restrict target = pack + panel * depth_count;",
        f"    const long height = row_count - panel < {rows} ? row_count - panel : {rows};",
        "    for (long k = 0; k < depth_count; k++)",
        f"      for (long row = 0; row < {rows}; row++)",
        f"        target[k * {rows} + row] = row < height ? a[(panel + row) * row_stride + depth_offsets[k]] : 0.0f;",
        "  }",
        "}",
    ]
