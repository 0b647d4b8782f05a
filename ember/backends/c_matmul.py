"""C source of a packed-panel matmul (ir/packed_matmul.py): packing, the register-tiled micro-kernel and the loops."""

from __future__ import annotations

from ember.ir.ir import KernelIR
from ember.ir.packed_matmul import PackedMatmul

PARALLEL_PRODUCTS = 1 << 18  # multiply-adds below which a packed matmul runs on one thread


def packed_products(packed: PackedMatmul) -> int:
    """The multiply-adds of a packed matmul (below PARALLEL_PRODUCTS it runs on one thread)."""
    batches = 1
    for size, *_ in packed.batches:
        batches *= size
    return batches * packed.rows * packed.columns * packed.depth


def render_packed_matmul(kernel: KernelIR, parameters: list[str], threads: int | None) -> str:
    """The C function `kernel.name(parameters)` computing the kernel's packed matmul (`threads`: OpenMP threads,
    None for all). The output is split into tasks (a batch element, or a part of one: a range of column panels
    times a range of row panels), one thread each, so no thread waits for another; each task walks GotoBLAS's
    loops over its part with its own packed panels."""
    packed = kernel.packed
    assert packed is not None
    name, lanes = kernel.name, packed.lanes
    rows, columns, depth = packed.micro_rows, packed.micro_columns, packed.depth
    vector = f"ember_packed_float32x{lanes}"
    batch_count = packed_products(packed) // (packed.rows * packed.columns * depth)
    depth_blocks = -(-depth // packed.depth_block)
    depth_block = -(-depth // depth_blocks)  # (blocks of equal size)
    row_panels = -(-packed.rows // rows)
    column_panels = -(-packed.columns // columns)
    column_block = min(packed.column_block, column_panels * columns)
    row_block = min(packed.row_block, row_panels * rows)
    products = packed_products(packed)
    wanted = str(threads) if threads else "omp_get_max_threads()"
    lines = [
        "#include <stdlib.h>",
        "#include <omp.h>",
        f"#ifndef {vector.upper()}", f"#define {vector.upper()}",
        f"typedef float {vector} __attribute__((vector_size({4 * lanes})));",
        f"typedef float {vector}_u __attribute__((vector_size({4 * lanes}), aligned(4)));",
        "#endif",
        *_pack_b(name, packed, columns),
        *_pack_a(name, packed, rows),
        *_micro_kernel(name, packed, vector),
        *_plain_task(name, packed),
        f"void {name}({', '.join(parameters)}) {{",
        f"  const float* restrict a = data{packed.a};",
        f"  const float* restrict b = data{packed.b};",
        "  float* restrict out = data0;",
        f"  int threads = {products} >= {PARALLEL_PRODUCTS} ? {wanted} : 1;",
        "  if (threads < 1) threads = 1;",
        # parts of one batch element: none where the batch elements share the threads evenly
        f"  const long parts = {batch_count} % threads == 0 ? 1 : threads;",
        *_split(packed, column_panels, row_panels),
        "  const long tasks = " + f"{batch_count} * column_parts * row_parts;",
        "  #pragma omp parallel num_threads(threads) if(threads > 1)",
        "  {",
        f"    float* a_pack = aligned_alloc(64, {_round_bytes(row_block * depth_block)});",
        f"    float* b_pack = aligned_alloc(64, {_round_bytes(depth_block * column_block)});",
        "    #pragma omp for schedule(static)",
        "    for (long task = 0; task < tasks; task++) {",
        "      const long batch = task / (column_parts * row_parts), part = task % (column_parts * row_parts);",
        "      const long column_part = part % column_parts, row_part = part / column_parts;",
        f"      const long column_start = column_part * {column_panels} / column_parts * {columns};",
        f"      long column_end = (column_part + 1) * {column_panels} / column_parts * {columns};",
        f"      if (column_end > {packed.columns}) column_end = {packed.columns};",
        f"      const long row_start = row_part * {row_panels} / row_parts * {rows};",
        f"      long row_end = (row_part + 1) * {row_panels} / row_parts * {rows};",
        f"      if (row_end > {packed.rows}) row_end = {packed.rows};",
        *_batch_origins(packed),
        "      if (a_pack == 0 || b_pack == 0) {  /* no memory for the panels: plain loops */",
        f"        {name}_plain(a + a_origin, b + b_origin, out + out_origin, row_start, row_end, column_start, column_end);",
        "        continue;",
        "      }",
        f"      for (long column = column_start; column < column_end; column += {column_block}) {{",
        f"        const long column_count = column_end - column < {column_block} ? column_end - column"
        f" : {column_block};",
        f"        for (long k = 0; k < {depth}; k += {depth_block}) {{",
        f"          const long depth_count = {depth} - k < {depth_block} ? {depth} - k : {depth_block};",
        f"          {name}_pack_b(b + b_origin + k * {packed.b_depth_stride}L + column * {packed.b_column_stride}L,"
        " b_pack, depth_count, column_count);",
        f"          for (long row = row_start; row < row_end; row += {row_block}) {{",
        f"            const long row_count = row_end - row < {row_block} ? row_end - row : {row_block};",
        f"            {name}_pack_a(a + a_origin + row * {packed.a_row_stride}L + k * {packed.a_depth_stride}L,"
        " a_pack, row_count, depth_count);",
        f"            for (long panel_column = 0; panel_column < column_count; panel_column += {columns})",
        f"              for (long panel_row = 0; panel_row < row_count; panel_row += {rows})",
        f"                {name}_micro(depth_count, a_pack + panel_row * depth_count,"
        " b_pack + panel_column * depth_count,",
        f"                             out + out_origin + (row + panel_row) * {packed.output_row_stride}L + column"
        " + panel_column,",
        f"                             row_count - panel_row < {rows} ? row_count - panel_row : {rows},",
        f"                             column_count - panel_column < {columns} ? column_count - panel_column"
        f" : {columns}, k > 0);",
        "          }",
        "        }",
        "      }",
        "    }",
        "    free(a_pack);",
        "    free(b_pack);",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _split(packed: PackedMatmul, column_panels: int, row_panels: int) -> list[str]:
    """C declaring column_parts and row_parts, the split of a batch element's output into `parts`: along the longer
    side first (each column part packs all of A's rows again, each row part all of B's columns: splitting the
    longer side packs the shorter operand again, the least copying)."""
    first, second = ("column", "row") if packed.columns >= packed.rows else ("row", "column")
    panels = {"column": column_panels, "row": row_panels}
    return [f"  const long {first}_parts = parts < {panels[first]} ? parts : {panels[first]};",
            f"  long {second}_parts = parts / {first}_parts; if ({second}_parts > {panels[second]}) {second}_parts ="
            f" {panels[second]};"]


def _round_bytes(elements: int) -> int:
    """Bytes of `elements` floats rounded up to a multiple of 64 (aligned_alloc's rule)."""
    return -(-4 * elements // 64) * 64


def _batch_origins(packed: PackedMatmul) -> list[str]:
    """C declaring a_origin, b_origin and out_origin: the offsets of batch element `batch` in each buffer."""
    lines = [f"      long a_origin = {packed.a_offset}L, b_origin = {packed.b_offset}L, out_origin = 0;",
             "      long rest = batch;"]
    for size, a_stride, b_stride, out_stride in reversed(packed.batches):
        lines.append(f"      {{ const long index = rest % {size}; rest /= {size}; a_origin += index * {a_stride}L;"
                     f" b_origin += index * {b_stride}L; out_origin += index * {out_stride}L; }}")
    return lines


def _pack_b(name: str, packed: PackedMatmul, columns: int) -> list[str]:
    """B's block (depth_count x column_count from `b`) as panels `columns` wide, k-major, zeros past the edge."""
    element = f"b[k * {packed.b_depth_stride}L + (panel + column) * {packed.b_column_stride}L]"
    return [
        f"static void {name}_pack_b(const float* restrict b, float* restrict pack, long depth_count,"
        " long column_count) {",
        f"  for (long panel = 0; panel < column_count; panel += {columns}) {{",
        "    float* restrict target = pack + panel * depth_count;",
        f"    if (column_count - panel >= {columns}) {{",
        "      for (long k = 0; k < depth_count; k++)",
        f"        for (long column = 0; column < {columns}; column++) target[k * {columns} + column] = {element};",
        "    } else {",
        "      const long width = column_count - panel;",
        "      for (long k = 0; k < depth_count; k++)",
        f"        for (long column = 0; column < {columns}; column++)",
        f"          target[k * {columns} + column] = column < width ? {element} : 0.0f;",
        "    }",
        "  }",
        "}",
    ]


def _pack_a(name: str, packed: PackedMatmul, rows: int) -> list[str]:
    """A's block (row_count x depth_count from `a`) as panels `rows` tall, k-major, zeros past the edge."""
    element = f"a[(panel + row) * {packed.a_row_stride}L + k * {packed.a_depth_stride}L]"
    return [
        f"static void {name}_pack_a(const float* restrict a, float* restrict pack, long row_count,"
        " long depth_count) {",
        f"  for (long panel = 0; panel < row_count; panel += {rows}) {{",
        "    float* restrict target = pack + panel * depth_count;",
        f"    const long height = row_count - panel < {rows} ? row_count - panel : {rows};",
        f"    for (long row = 0; row < {rows}; row++)",
        "      if (row < height)",
        f"        for (long k = 0; k < depth_count; k++) target[k * {rows} + row] = {element};",
        "      else",
        f"        for (long k = 0; k < depth_count; k++) target[k * {rows} + row] = 0.0f;",
        "  }",
        "}",
    ]


def _micro_kernel(name: str, packed: PackedMatmul, vector: str) -> list[str]:
    """The micro-kernel: micro_rows x micro_vectors accumulators (vectors of `lanes`), each k adding a broadcast A
    value times a B vector (gcc contracts it to a fused multiply-add); then the tile is stored (or added, after the
    first block of k), only its first `row_count` x `column_count` where it crosses the edge."""
    rows, vectors, lanes, columns = packed.micro_rows, packed.micro_vectors, packed.lanes, packed.micro_columns
    stride = packed.output_row_stride
    accumulators = [[f"c{row}_{column}" for column in range(vectors)] for row in range(rows)]
    lines = [
        f"static inline void {name}_micro(long depth_count, const float* restrict a, const float* restrict b,"
        " float* restrict out, long row_count, long column_count, int accumulate) {",
        *(f"  {vector} {', '.join(f'{accumulator} = {{0}}' for accumulator in row)};" for row in accumulators),
        "  #pragma GCC unroll 4",
        "  for (long k = 0; k < depth_count; k++) {",
        *(f"    const {vector} b{column} = *(const {vector}*)(b + k * {columns} + {column * lanes});"
          for column in range(vectors)),
    ]
    for row in range(rows):
        updates = " ".join(f"{accumulators[row][column]} += value * b{column};" for column in range(vectors))
        lines.append(f"    {{ const float value = a[k * {rows} + {row}]; {updates} }}")
    lines += ["  }", f"  if (row_count == {rows} && column_count == {columns}) {{", "    if (accumulate) {"]
    for row in range(rows):
        for column in range(vectors):
            place = f"*({vector}_u*)(out + {row * stride}L + {column * lanes})"
            lines.append(f"      {place} += {accumulators[row][column]};")
    lines.append("    } else {")
    for row in range(rows):
        for column in range(vectors):
            place = f"*({vector}_u*)(out + {row * stride}L + {column * lanes})"
            lines.append(f"      {place} = {accumulators[row][column]};")
    lines += ["    }", "  } else {", f"    {vector} tile[{rows * vectors}];"]
    for row in range(rows):
        for column in range(vectors):
            lines.append(f"    tile[{row * vectors + column}] = {accumulators[row][column]};")
    lines += [
        "    const float* values = (const float*)tile;",
        "    for (long row = 0; row < row_count; row++)",
        "      for (long column = 0; column < column_count; column++) {",
        f"        float* target = out + row * {stride}L + column;",
        f"        *target = (accumulate ? *target : 0.0f) + values[row * {columns} + column];",
        "      }",
        "  }",
        "}",
    ]
    return lines


def _plain_task(name: str, packed: PackedMatmul) -> list[str]:
    """A task's part of the output by plain loops (where the panels' memory could not be allocated)."""
    return [
        f"static void {name}_plain(const float* restrict a, const float* restrict b, float* restrict out, long row_start,"
        " long row_end, long column_start, long column_end) {",
        "  for (long row = row_start; row < row_end; row++)",
        "    for (long column = column_start; column < column_end; column++) {",
        "      float sum = 0.0f;",
        f"      for (long k = 0; k < {packed.depth}; k++)",
        f"        sum += a[row * {packed.a_row_stride}L + k * {packed.a_depth_stride}L]"
        f" * b[k * {packed.b_depth_stride}L + column * {packed.b_column_stride}L];",
        f"      out[row * {packed.output_row_stride}L + column] = sum;",
        "    }",
        "}",
    ]
