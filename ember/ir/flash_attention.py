"""Flash attention: on a device with local memory and warps, `scaled_dot_product_attention` is one kernel per block of
query rows that walks the keys in blocks with an online softmax, so the [L, S] score matrix never reaches memory.

core's scaled_dot_product_attention asks the runtime first (`attention_tiles`, from DeviceInfo only) and, where the
tiles fit, writes the attention as one fused graph: scores = sum_e(q k) * scale (masked), m = max over the keys
(0 where every key is masked), p = exp(scores - m) (0 where masked), out = sum_k(p v) / sum_k(p) (0 where the sum
is 0), marked FUSED_ATTENTION (core/ops.py) so the kernelizer keeps its nested reduces in one kernel. Here that
kernel is recognized by its four reduces (`attention_parts`) and lowered (`lower_attention_kernel`) as:

- a group of ROWS x ITEMS_PER_ROW work items per block of ROWS query rows (of one batch index): item (r, t) owns
  row r; the Q tile [ROWS, E] is filled once;
- a loop over key blocks of KEYS: the items fill the K tile [KEYS, E] and the V tile [KEYS, Ev] (barrier); item
  (r, t) computes the scores of keys t, t + T, ... of its row from the tiles, masked by the kernel's own expression
  (barrier); each item reads its row's scores for the block maximum, m_new = max(m, block maximum), and stores the
  weights p of its keys, the kernel's own expression with m_new as the maximum (barrier); then rescales its running
  sum and its output columns t, t + T, ... by alpha = exp(m - m_new) and adds the block's weights and weighted
  values. The running maximum, sum and outputs are each item's own (in local memory, side by side: PTX has no
  scratch arrays), so no work item waits on another's;
- the epilogue, the kernel's own (out = sum / total, 0 where the total is 0), at each owned output.

Rows, keys and columns past the end are clamped to the last (recomputed and stored with the same bits); keys past the
end of the last block score -inf and weigh 0. Each block's weights are taken relative to the running maximum, and
the later alphas rescale them to exp(s - m) for the row's final maximum m in real arithmetic, so results agree with
the composite within float rounding; a row whose keys are all masked gives 0, as the composite and torch. Only the forward pass: a graph that
records gradients keeps the composite (its backward reads the stored weights).
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass

from ember.capabilities import DeviceInfo
from ember.core import dtype as dtypes
from ember.core.errors import CompileError
from ember.core.ops import REDUCE_OPS, Op
from ember.core.shapes import prod, strides_of
from ember.ir.ir import Builder, IRNode, KernelIR, topological_nodes
from ember.ir.kernel import Kernel, KernelStep
from ember.ir.lower import INT32_LIMIT, Lowerer, compute_dtype, index_extent

ITEMS_PER_ROW = 4  # T: the work items sharing a query row (each owns every T-th key of a block and output column)
# (ROWS, KEYS) a group, the largest first whose tiles fit the device's local memory: the Q tile ROWS x E, the K and V
# tiles KEYS x E and KEYS x Ev, the block's scores and weights ROWS x KEYS, all float32
TILE_CHOICES = ((32, 32), (16, 32), (16, 16), (8, 16))
MINIMUM_ROWS = 16  # query rows from which attention is fused (fewer, a decode step: the composite's kernels)
MINIMUM_KEYS = 16  # keys from which it is
MAXIMUM_HEAD = 256  # E and Ev at most (each item keeps Ev / T running outputs)
ATTENTION_DTYPES = frozenset({dtypes.float32, dtypes.float16, dtypes.bfloat16})
LOG2_E = math.log2(math.e)


@dataclass(frozen=True)
class AttentionTiles:
    """A fused attention's group: `rows` query rows, `keys` keys a step of its loop, `items_per_row` work items a row."""

    rows: int
    keys: int
    items_per_row: int = ITEMS_PER_ROW

    @property
    def local_size(self) -> int:
        return self.rows * self.items_per_row

    def state_slots(self, value_head: int) -> int:
        """The running values each work item keeps: the maximum, the total and its output columns."""
        return 2 + -(-value_head // self.items_per_row)


def attention_tiles(batches: int, length: int, source_length: int, head: int, value_head: int, dtype: dtypes.DType,
                    info: DeviceInfo) -> AttentionTiles | None:
    """The tiles of a fused attention of `batches` x [length, head] queries over `source_length` keys (values of
    `value_head`) on a device, or None where it keeps the composite: no warps or local memory (CPUs), a dtype other
    than float32/float16/bfloat16, fewer than MINIMUM_ROWS queries or MINIMUM_KEYS keys, heads past MAXIMUM_HEAD,
    or no tile choice within the device's local memory, group size and global size."""
    if info.warp_width <= 1 or info.local_memory_bytes <= 0 or dtype not in ATTENTION_DTYPES:
        return None
    if length < MINIMUM_ROWS or source_length < MINIMUM_KEYS or not 1 <= head <= MAXIMUM_HEAD \
            or not 1 <= value_head <= MAXIMUM_HEAD:
        return None
    for rows, keys in TILE_CHOICES:
        tiles = AttentionTiles(rows, keys)
        floats = (rows * padded(head) + keys * padded(head) + keys * padded(value_head) + 2 * rows * padded(keys)
                  + tiles.state_slots(value_head) * tiles.local_size)
        groups = batches * -(-length // rows)
        if (tiles.local_size <= info.max_local_size and 4 * floats <= info.local_memory_bytes
                and groups * tiles.local_size <= info.max_global_size):
            return tiles
    return None


def padded(width: int) -> int:
    """The distance between a tile's rows in local memory: one more than the row where it is even, so that the
    items reading one column of several rows (the rows of a warp's queries, the keys of a row's items) read different
    banks instead of the same one (32 banks of 4 bytes: rows of 64 apart all fall in one)."""
    return width + 1 if width % 2 == 0 else width


@dataclass(frozen=True)
class AttentionParts:
    """The step positions of a fused attention kernel's parts: its four reduces (the scores' dot product over E, the
    maximum over the keys, the weights' total, the weighted values' sum) and the scores and weights [.., L, S]."""

    dot: int
    maximum: int
    total: int
    numerator: int
    scores: int
    weights: int


def attention_parts(kernel: Kernel) -> AttentionParts | None:
    """The parts of a kernel written as core's fused attention (see the module's docstring), or None."""
    steps, output = kernel.steps, kernel.output
    rank = len(output.shape)
    if rank < 2 or any(not isinstance(size, int) for step in steps for size in step.shape):
        return None
    reduces = [(position, step) for position, step in enumerate(steps) if step.op in REDUCE_OPS]
    if len(reduces) != 4:
        return None
    found: dict[str, int] = {}
    for position, step in reduces:
        source = steps[step.srcs[0]].shape
        if step.op is Op.REDUCE_MAX and len(source) == rank and step.arg == (rank - 1,):
            found["maximum"] = position
        elif step.op is Op.SUM and len(source) == rank and step.arg == (rank - 1,):
            found["total"] = position
        elif step.op is Op.SUM and len(source) == rank + 1 and step.arg == (rank,):
            found["dot"] = position
        elif step.op is Op.SUM and len(source) == rank + 1 and step.arg == (rank - 1,):
            found["numerator"] = position
    if len(found) != 4:
        return None
    scores, weights = steps[found["maximum"]].srcs[0], steps[found["total"]].srcs[0]
    batch_rows = output.shape[:-1]
    source_length = steps[scores].shape[-1]
    if (steps[scores].shape != (*batch_rows, source_length) or steps[weights].shape != steps[scores].shape
            or steps[steps[found["dot"]].srcs[0]].shape[:-1] != (*batch_rows, source_length)
            or steps[steps[found["numerator"]].srcs[0]].shape != (*batch_rows, source_length, output.shape[-1])):
        return None
    return AttentionParts(found["dot"], found["maximum"], found["total"], found["numerator"], scores, weights)


class Replaced(Lowerer):
    """Lowers a kernel's steps with its reduces replaced by given values (by step position); `missing` is set where
    a reduce without one was reached (then the kernel is not of the form the caller expected)."""

    def __init__(self, kernel: Kernel, builder: Builder, values: dict[int, IRNode]) -> None:
        super().__init__(kernel, builder, dtypes.int32)
        self.values = values
        self.missing = False

    def _lower_reduce(self, position: int, step: KernelStep, index: tuple[IRNode, ...],
                      valid: IRNode | None) -> Generator[tuple[int, tuple[IRNode, ...], IRNode | None], IRNode,
                                                         IRNode]:
        value = self.values.get(position)
        if value is None:
            self.missing = True
            value = self.builder.const(0.0, compute_dtype(step.dtype))
        return value
        yield  # (a generator, as Lowerer's)


def _reaches(value: IRNode, nodes: list[IRNode]) -> bool:
    """Whether `value` is computed from any of `nodes`."""
    below = {id(node) for node in topological_nodes(value)}
    return any(id(node) in below for node in nodes)


class _AttentionLowering:
    """The builder, the group's place (batch index, first query row, the item's row and column), and the kernel's
    expressions lowered at given places with given values for its reduces."""

    def __init__(self, kernel: Kernel, parts: AttentionParts, tiles: AttentionTiles) -> None:
        self.kernel, self.parts, self.tiles = kernel, parts, tiles
        steps, shape = kernel.steps, kernel.output.shape
        self.length, self.value_head = shape[-2], shape[-1]
        self.source_length = steps[parts.scores].shape[-1]
        self.head = steps[steps[parts.dot].srcs[0]].shape[-1]
        builder = self.builder = Builder()
        index = self.index = dtypes.int32
        batch_shape = shape[:-2]
        self.row_blocks = -(-self.length // tiles.rows)
        self.groups = prod(batch_shape) * self.row_blocks
        self.local_id = builder.local_id(tiles.local_size, index)
        group_id = builder.group_id(self.groups, index)
        self.row_origin = builder.mul(builder.mod(group_id, self.row_blocks), tiles.rows)
        batch = builder.div(group_id, self.row_blocks)
        self.batch: list[IRNode] = []
        for position, (extent, stride) in enumerate(zip(batch_shape, strides_of(batch_shape))):
            quotient = builder.div(batch, stride)
            self.batch.append(quotient if position == 0 else builder.mod(quotient, extent))
        self.row = builder.div(self.local_id, tiles.items_per_row)  # r: the item's row in the group
        self.lane = builder.mod(self.local_id, tiles.items_per_row)  # t: its first key and column
        self.query = builder.at_most(builder.add(self.row_origin, self.row), self.length - 1)
        # stand-ins for the reduces' values, to tell a product's factors apart (parameters no kernel has)
        self.stand_ins = [builder.param(-1 - number, dtypes.float32, False) for number in range(2)]

    def value(self, position: int, index: tuple[IRNode, ...], values: dict[int, IRNode]) -> IRNode | None:
        """Step `position` at `index` with the reduces replaced by `values`; None where another reduce is reached."""
        lowerer = Replaced(self.kernel, self.builder, values)
        result = lowerer.lower(position, index, None)
        return None if lowerer.missing else result

    def factor(self, position: int, index: tuple[IRNode, ...], hole: IRNode) -> IRNode | None:
        """The one factor of the product at step `position` (a reduce's source) that reaches neither `hole` (a
        placeholder index the factor must not read) nor the stand-ins; None where there is no such one factor."""
        parts = self.parts
        product = self.value(position, index, {parts.dot: self.stand_ins[0], parts.maximum: self.stand_ins[1]})
        if product is None or product.op is not Op.MUL or product.width != 1:
            return None
        kept = [factor for factor in product.srcs if not _reaches(factor, [hole, *self.stand_ins])]
        return kept[0] if len(kept) == 1 else None

    def fill(self, tile: IRNode, rows: int, origin: IRNode, limit: int, width: int, position: int,
             hole: IRNode, query_side: bool) -> list[IRNode] | None:
        """Stores of the `rows` x `width` tile's elements (each item every local_size-th from its own on, clamped to
        the last; row i the query or key origin + i, clamped to `limit`; rows padded(width) apart) of the factor of
        step `position` that does not read `hole`, as float32; None where the factor is not found."""
        builder, local_size = self.builder, self.tiles.local_size
        count = rows * width
        stores = []
        for number in range(-(-count // local_size)):
            element = builder.at_most(builder.add(self.local_id, number * local_size), count - 1)
            along = builder.at_most(builder.add(origin, builder.div(element, width)), limit)
            column = builder.mod(element, width)
            place = (*self.batch, along, hole, column) if query_side else (*self.batch, hole, along, column)
            value = self.factor(position, place, hole)
            if value is None:
                return None
            if value.dtype != dtypes.float32:
                value = builder.alu(Op.CAST, dtypes.float32, value)
            row, column = builder.div(element, width), builder.mod(element, width)
            stores.append(builder.store(tile, builder.add(builder.mul(row, padded(width)), column), value))
        return stores


def lower_attention_kernel(kernel: Kernel, name: str, info: DeviceInfo) -> KernelIR | None:
    """The kernel IR of a fused attention (see the module's docstring), or None where the kernel is not one. A fused
    attention has no other lowering (the generic lowering of its nested float reduces is not rendered correctly):
    where its tiles do not fit the device or its parts do not lower as core writes them, a CompileError says so."""
    parts = attention_parts(kernel)
    if parts is None:
        return None
    lowered = _lower_attention(kernel, parts, name, info)
    if lowered is None:
        raise CompileError(
            f"{name}: a fused attention (scaled_dot_product_attention as one kernel) is lowered only as a flash "
            f"attention kernel, which needs warps and local memory for its tiles; this DeviceInfo has warp_width "
            f"{info.warp_width}, local_memory_bytes {info.local_memory_bytes}, max_local_size {info.max_local_size} "
            f"(core writes the fused graph only for a device whose DeviceInfo fits it)")
    return lowered


def _lower_attention(kernel: Kernel, parts: AttentionParts, name: str, info: DeviceInfo) -> KernelIR | None:
    """lower_attention_kernel's IR, or None where the tiles do not fit or a part does not lower as expected."""
    steps, shape = kernel.steps, kernel.output.shape
    source_length, head = steps[parts.scores].shape[-1], steps[steps[parts.dot].srcs[0]].shape[-1]
    input_dtypes = {step.dtype for step in steps if step.op is Op.BUFFER and step.dtype.is_float}
    dtype = next(iter(input_dtypes)) if len(input_dtypes) == 1 else kernel.output.dtype
    tiles = attention_tiles(prod(shape[:-2]), shape[-2], source_length, head, shape[-1], dtype, info)
    if tiles is None or index_extent(kernel) + 4 * tiles.local_size > INT32_LIMIT:
        return None
    lowering = _AttentionLowering(kernel, parts, tiles)
    builder, index, float32 = lowering.builder, lowering.index, dtypes.float32
    rows, keys, items = tiles.rows, tiles.keys, tiles.items_per_row
    length, value_head = lowering.length, lowering.value_head
    query_hole = builder.new_range(length, index)
    key_hole = builder.new_range(source_length, index)
    dot_source, numerator_source = steps[parts.dot].srcs[0], steps[parts.numerator].srcs[0]

    # the Q tile, once
    query_tile = builder.define_shared(float32, rows * padded(head))
    query_fills = lowering.fill(query_tile, rows, lowering.row_origin, length - 1, head, dot_source, key_hole, True)
    if query_fills is None:
        return None
    queries_ready = builder.barrier(query_fills)
    queries = builder.after(query_tile, [queries_ready])
    # each item's running maximum, total and output columns: slot s of item l at s * local_size + l (local memory:
    # PTX has no scratch arrays; the items' own elements, side by side)
    state = builder.define_shared(float32, tiles.state_slots(value_head) * tiles.local_size)

    def slot(number: int) -> IRNode:
        return builder.add(lowering.local_id, number * tiles.local_size)

    columns = [builder.at_most(builder.add(lowering.lane, items * number), value_head - 1)
               for number in range(-(-value_head // items))]
    starts = [builder.const(-math.inf, float32), builder.const(0.0, float32)] + [builder.const(0.0, float32)] * len(
        columns)
    initial = [builder.store(state, slot(number), start) for number, start in enumerate(starts)]

    # the loop over key blocks
    block = builder.new_range(-(-source_length // keys), index)
    free = builder.barrier([block])  # (the last block's reads of the tiles are done)
    key_origin = builder.mul(block, keys)
    key_tile = builder.define_shared(float32, keys * padded(head))
    value_tile = builder.define_shared(float32, keys * padded(value_head))
    key_fills = lowering.fill(builder.after(key_tile, [free]), keys, key_origin, source_length - 1, head, dot_source,
                              query_hole, False)
    value_fills = lowering.fill(builder.after(value_tile, [free]), keys, key_origin, source_length - 1, value_head,
                                numerator_source, query_hole, False)
    if key_fills is None or value_fills is None:
        return None
    filled = builder.barrier(key_fills + value_fills)
    key_values, value_values = builder.after(key_tile, [filled]), builder.after(value_tile, [filled])

    # scores of the item's keys t, t + T, ...
    score_tile = builder.define_shared(float32, rows * padded(keys))
    weight_tile = builder.define_shared(float32, rows * padded(keys))
    depth = builder.new_range(head, index)
    query_value = builder.load(queries, builder.add(builder.mul(lowering.row, padded(head)), depth), None)
    owned = [builder.add(lowering.lane, items * number) for number in range(keys // items)]
    dots, score_stores = [], []
    for local_key in owned:
        key_value = builder.load(key_values, builder.add(builder.mul(local_key, padded(head)), depth), None)
        dot = builder.reduce(Op.SUM, builder.alu(Op.MUL, float32, query_value, key_value), (depth,))
        key = builder.add(key_origin, local_key)
        place = (*lowering.batch, lowering.query, builder.at_most(key, source_length - 1))
        score = lowering.value(parts.scores, place, {parts.dot: dot})
        if score is None or score.dtype != float32:
            return None
        if source_length % keys:
            score = builder.alu(Op.WHERE, float32, builder.less(key, source_length), score,
                                builder.const(-math.inf, float32))
        dots.append((dot, key, place))
        score_stores.append(builder.store(builder.after(score_tile, [free]),
                                          builder.add(builder.mul(lowering.row, padded(keys)), local_key), score))
    scored = builder.barrier(score_stores)

    # the running maximum, and the weights of the item's keys relative to it
    current = builder.after(state, [*initial, free])
    maximum, total = builder.load(current, slot(0), None), builder.load(current, slot(1), None)
    along = builder.new_range(keys, index)
    row_start = builder.mul(lowering.row, padded(keys))
    block_maximum = builder.reduce(Op.REDUCE_MAX, builder.load(builder.after(score_tile, [scored]),
                                                               builder.add(row_start, along), None), (along,))
    new_maximum = builder.alu(Op.MAX, float32, maximum, block_maximum)
    weight_stores = []
    for (dot, key, place), local_key in zip(dots, owned):
        weight = lowering.value(parts.weights, place, {parts.dot: dot, parts.maximum: new_maximum})
        if weight is None or weight.dtype != float32:
            return None
        if source_length % keys:
            weight = builder.alu(Op.WHERE, float32, builder.less(key, source_length), weight,
                                 builder.const(0.0, float32))
        weight_stores.append(builder.store(builder.after(weight_tile, [free]), builder.add(row_start, local_key),
                                           weight))
    weighed = builder.barrier(weight_stores)

    # rescale the running total and outputs, add the block's
    inner = builder.new_range(keys, index)
    weight_value = builder.load(builder.after(weight_tile, [weighed]), builder.add(row_start, inner), None)
    shift = builder.alu(Op.MUL, float32, builder.alu(Op.SUB, float32, maximum, new_maximum),
                        builder.const(LOG2_E, float32))
    alpha = builder.alu(Op.WHERE, float32, builder.alu(Op.CMPEQ, dtypes.bool_, maximum,
                                                       builder.const(-math.inf, float32)),
                        builder.const(0.0, float32), builder.alu(Op.EXP2, float32, shift))
    new_total = builder.alu(Op.ADD, float32, builder.alu(Op.MUL, float32, total, alpha),
                            builder.reduce(Op.SUM, weight_value, (inner,)))
    updates = [builder.store(state, slot(0), new_maximum), builder.store(state, slot(1), new_total)]
    for number, column in enumerate(columns, start=2):
        value_value = builder.load(value_values, builder.add(builder.mul(inner, padded(value_head)), column), None)
        weighted = builder.reduce(Op.SUM, builder.alu(Op.MUL, float32, weight_value, value_value), (inner,))
        running = builder.load(current, slot(number), None)
        updates.append(builder.store(state, slot(number), builder.alu(
            Op.ADD, float32, builder.alu(Op.MUL, float32, running, alpha), weighted)))
    loop = builder.loop(updates, (block,))

    # the epilogue at the item's output columns
    final = builder.after(state, [loop])
    final_total = builder.load(final, slot(1), None)
    output_stores = []
    for number, column in enumerate(columns, start=2):
        values = {parts.numerator: builder.load(final, slot(number), None), parts.total: final_total}
        lowerer = Replaced(kernel, builder, values)
        output_stores.append(lowerer.store_output((*lowering.batch, lowering.query, column)))
        if lowerer.missing:
            return None
    if any(_reaches(store, [query_hole, key_hole, *lowering.stand_ins]) for store in output_stores + updates):
        return None
    sink = builder.sink([*query_fills, queries_ready, *initial, loop, *output_stores])
    warp_width = info.warp_width if tiles.local_size % max(info.warp_width, 1) == 0 else 1
    return KernelIR(name=name, params=Replaced(kernel, builder, {}).buffer_params(),
                    global_size=lowering.groups * tiles.local_size, sink=sink, index_dtype=index,
                    local_size=tiles.local_size, warp_width=warp_width)
