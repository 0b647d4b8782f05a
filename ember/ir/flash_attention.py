"""Flash attention: on a device with local memory and warps, `scaled_dot_product_attention` is one kernel per block of
query rows that walks the keys in blocks, so the [L, S] score matrix never reaches memory.

core's scaled_dot_product_attention asks the runtime first (`attention_tiles`, from DeviceInfo only) and, where the
tiles fit, writes the attention as one fused graph: scores = sum_e(q k) * scale (masked), m = max over the keys
(0 where every key is masked), p = exp(scores - m) (0 where masked), out = sum_k(p v) / sum_k(p) (0 where the sum
is 0), marked FUSED_ATTENTION (core/ops.py) so the kernelizer keeps its nested reduces in one kernel. Here that
kernel is recognized by its four reduces (`attention_parts`) and lowered (`lower_attention_kernel`) as a group of
work items per block of query rows (of one batch index), its Q tile filled once, then two passes over the key
blocks, each block's K (and V) tile filled between barriers:

- pass 1, the maxima: each item computes the scores of its rows and keys (a register tile: every value it reads from
  the tiles serves several multiply-adds, see TILE_CHOICES) and keeps the largest of each row; the items of a row
  leave their partial maxima in local memory and each reads the row's maximum from them;
- pass 2, the sums: each item computes its scores again and stores their weights, the kernel's own expression with
  the row's maximum, in a weight tile (barrier); then it sums, over every key of every block, the weights of its
  rows (the totals) and the weights times the values at its output columns (the numerators), in registers;
- the epilogue, the kernel's own (out = numerator / total, 0 where the total is 0), at each of its outputs.

The maximum is the row's exact one before any weight is taken, so each weight is exp(s - m) as the composite's and
no running sum is rescaled; the price is computing the scores twice. A causal attention (torch's is_causal, the mask
core writes: key j seen by query i where j <= i) walks only the key blocks its last query sees, and its blocks
wholly before the group's first query are summed in a loop of their own, without the mask. Rows, keys and columns
past the end are clamped to the last (recomputed and stored with the same bits); keys past the end of the last block
score -inf and weigh 0; a row whose keys are all masked gives 0, as the composite and torch. Only the forward pass:
a graph that records gradients keeps the composite (its backward reads the stored weights).
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

# (rows, keys, local size, rows of an item) of a group, the first whose tiles fit the device's local memory (the Q
# tile rows x E, the K and V tiles keys x E and keys x Ev, the block's weights rows x keys and the rows' partial
# maxima, all float32) and whose rows are no more than the queries: item (a, b) of a group computes the scores of rows
# a, a + R, ... (R = rows / its rows) and keys b, b + K, ... (K = local size / R) of a block, and the outputs of the
# same rows at columns b, b + K, ...: each value it reads from a tile serves several of its multiply-adds (a 64 x 32
# block's item: 8 values read for 16 of them; one row an item read 9 for 8, and the L1 bandwidth bound the kernel on an
# H100)
TILE_CHOICES = ((64, 32, 128, 4), (32, 32, 128, 2), (32, 16, 64, 2), (16, 16, 64, 2), (8, 16, 32, 2))
MINIMUM_ROWS = 16  # query rows from which attention is fused (fewer, a decode step: the composite's kernels)
MINIMUM_KEYS = 16  # keys from which it is
MAXIMUM_HEAD = 256  # E and Ev at most
ATTENTION_DTYPES = frozenset({dtypes.float32, dtypes.float16, dtypes.bfloat16})


@dataclass(frozen=True)
class AttentionTiles:
    """A fused attention's group: `rows` query rows, `keys` keys a step of its loops, `local_size` work items, each
    computing `item_rows` of the rows (see TILE_CHOICES)."""

    rows: int
    keys: int
    local_size: int
    item_rows: int

    @property
    def row_items(self) -> int:
        """R: the items along the rows (an item's rows are R apart)."""
        return self.rows // self.item_rows

    @property
    def key_items(self) -> int:
        """K: the items sharing a row (an item's keys and output columns are K apart)."""
        return self.local_size // self.row_items

    def local_floats(self, head: int, value_head: int) -> int:
        """The float32 elements of the group's local memory: the Q, K, V and weight tiles and the partial maxima."""
        return (self.rows * padded(head) + self.keys * padded(head) + self.keys * padded(value_head)
                + self.rows * padded(self.keys) + self.rows * self.key_items)


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
    for rows, keys, local_size, item_rows in TILE_CHOICES:
        tiles = AttentionTiles(rows, keys, local_size, item_rows)
        groups = batches * -(-length // rows)
        if (rows <= length and local_size <= info.max_local_size and local_size % info.warp_width == 0
                and 4 * tiles.local_floats(head, value_head) <= info.local_memory_bytes
                and groups * local_size <= info.max_global_size):
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


def _selects_zero(node: IRNode) -> bool:
    """Whether a value is where(condition, x, 0)."""
    return node.op is Op.WHERE and node.srcs[2].is_const and node.srcs[2].arg == 0


def _reaches(value: IRNode, nodes: list[IRNode]) -> bool:
    """Whether `value` is computed from any of `nodes`."""
    below = {id(node) for node in topological_nodes(value)}
    return any(id(node) in below for node in nodes)


class _AttentionLowering:
    """The builder, the group's place (batch index, first query row; the item's rows, their queries and its keys in
    a block), and the kernel's expressions lowered at given places with given values for its reduces."""

    def __init__(self, kernel: Kernel, parts: AttentionParts, tiles: AttentionTiles) -> None:
        self.kernel, self.parts, self.tiles = kernel, parts, tiles
        shape = kernel.output.shape
        self.length, self.value_head = shape[-2], shape[-1]
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
        item_row, item_key = builder.div(self.local_id, tiles.key_items), builder.mod(self.local_id, tiles.key_items)
        # the item's rows in the group and their queries (clamped to the last), its keys in a block
        self.local_rows = [builder.add(item_row, number * tiles.row_items) for number in range(tiles.item_rows)]
        self.queries = [builder.at_most(builder.add(self.row_origin, row), self.length - 1) for row in self.local_rows]
        self.local_keys = [builder.add(item_key, number * tiles.key_items)
                           for number in range(tiles.keys // tiles.key_items)]
        self.item_key = item_key
        # stand-ins for the reduces' values, to tell a product's factors apart (parameters no kernel has)
        self.stand_ins = [builder.param(-1 - number, dtypes.float32, False) for number in range(2)]

    def value(self, position: int, index: tuple[IRNode, ...], values: dict[int, IRNode]) -> IRNode | None:
        """Step `position` at `index` with the reduces replaced by `values`; None where another reduce is reached."""
        lowerer = Replaced(self.kernel, self.builder, values)
        result = lowerer.lower(position, index, None)
        return None if lowerer.missing else result

    def product(self, position: int, index: tuple[IRNode, ...]) -> IRNode | None:
        """Step `position` (a reduce's source) at `index`, the dot product and the maximum replaced by stand-ins."""
        return self.value(position, index, {self.parts.dot: self.stand_ins[0], self.parts.maximum: self.stand_ins[1]})

    def selection(self, position: int, index: tuple[IRNode, ...]) -> IRNode | None:
        """The condition selecting the products of step `position` at `index` (a causal attention's numerator sums
        where(mask, weight * value, 0): a masked key adds an exact 0, whatever its value), or None where none does."""
        product = self.product(position, index)
        return product.srcs[0] if product is not None and _selects_zero(product) else None

    def is_causal(self, query: IRNode, key: IRNode) -> bool:
        """Whether the kernel's scores at (query, key) are where(key < query + 1, score, -inf): torch's is_causal mask
        as core writes it (functional._causal_mask, in float32 indices), so a key past a query is never seen."""
        builder, float32 = self.builder, dtypes.float32
        score = self.value(self.parts.scores, (*self.batch, query, key), {self.parts.dot: self.stand_ins[0]})
        visible = builder.alu(Op.CMPLT, dtypes.bool_, builder.alu(Op.CAST, float32, key), builder.alu(
            Op.ADD, float32, builder.alu(Op.CAST, float32, query), builder.const(1.0, float32)))
        return (score is not None and score.op is Op.WHERE and score.srcs[0] is visible
                and score.srcs[2] is builder.const(-math.inf, float32))

    def factor(self, position: int, index: tuple[IRNode, ...], hole: IRNode) -> IRNode | None:
        """The one factor of the product at step `position` (a reduce's source) that reaches neither `hole` (a
        placeholder index the factor must not read) nor the stand-ins; None where there is no such one factor."""
        product = self.product(position, index)
        if product is not None and _selects_zero(product):
            product = product.srcs[1]  # (a causal attention's product, selected by its mask)
        if product is None or product.op is not Op.MUL or product.width != 1:
            return None
        kept = [factor for factor in product.srcs if not _reaches(factor, [hole, *self.stand_ins])]
        return kept[0] if len(kept) == 1 else None

    def fill(self, tile: IRNode, rows: int, origin: IRNode, limit: int, width: int, position: int,
             hole: IRNode, query_side: bool, zero_past: bool = False) -> list[IRNode] | None:
        """Stores of the `rows` x `width` tile's elements (each item every local_size-th from its own on, clamped to
        the last; row i the query or key origin + i, clamped to `limit`, or with `zero_past` 0 past it; rows
        padded(width) apart) of the factor of step `position` that does not read `hole`, as float32; None where the
        factor is not found."""
        builder, local_size = self.builder, self.tiles.local_size
        count = rows * width
        stores = []
        for number in range(-(-count // local_size)):
            element = builder.at_most(builder.add(self.local_id, number * local_size), count - 1)
            row, column = builder.div(element, width), builder.mod(element, width)
            unclamped = builder.add(origin, row)
            along = builder.at_most(unclamped, limit)
            place = (*self.batch, along, hole, column) if query_side else (*self.batch, hole, along, column)
            value = self.factor(position, place, hole)
            if value is None:
                return None
            if value.dtype != dtypes.float32:
                value = builder.alu(Op.CAST, dtypes.float32, value)
            if zero_past:
                value = builder.alu(Op.WHERE, dtypes.float32, builder.less(unclamped, limit + 1), value,
                                    builder.const(0.0, dtypes.float32))
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
    rows, keys = tiles.rows, tiles.keys
    length, value_head = lowering.length, lowering.value_head
    query_hole = builder.new_range(length, index)
    key_hole = builder.new_range(source_length, index)
    dot_source, numerator_source = steps[parts.dot].srcs[0], steps[parts.numerator].srcs[0]
    blocks = -(-source_length // keys)

    # the Q tile, once
    query_tile = builder.define_shared(float32, rows * padded(head))
    query_fills = lowering.fill(query_tile, rows, lowering.row_origin, length - 1, head, dot_source, key_hole, True)
    if query_fills is None:
        return None
    queries_ready = builder.barrier(query_fills)
    queries = builder.after(query_tile, [queries_ready])
    key_tile = builder.define_shared(float32, keys * padded(head))
    value_tile = builder.define_shared(float32, keys * padded(value_head))
    weight_tile = builder.define_shared(float32, rows * padded(keys))

    # a causal attention (torch's is_causal: key j seen by query i where j <= i) walks only the key blocks its last
    # query sees; blocks wholly before its first query need no mask
    causal = lowering.is_causal(query_hole, key_hole)
    count: IRNode | None = None
    if causal:
        last_query = builder.at_most(builder.add(lowering.row_origin, rows - 1), length - 1)
        count = builder.at_most(builder.add(builder.div(last_query, keys), 1), blocks)

    def fill_keys(block: IRNode, free: IRNode, values: bool) -> list[IRNode] | None:
        origin = builder.mul(block, keys)
        fills = lowering.fill(builder.after(key_tile, [free]), keys, origin, source_length - 1, head, dot_source,
                              query_hole, False)
        if values and fills is not None:
            # (keys past the end: values 0, which their weights of 0 multiply to 0 whatever the last key's value)
            value_fills = lowering.fill(builder.after(value_tile, [free]), keys, origin, source_length - 1,
                                        value_head, numerator_source, query_hole, False, source_length % keys != 0)
            fills = None if value_fills is None else fills + value_fills
        return fills

    def scores(block: IRNode, key_values: IRNode) -> list[list[tuple[IRNode, IRNode, tuple[IRNode, ...], IRNode]]] | None:
        """The item's scores of a block (its rows x its keys), each with its dot product, its place and its key."""
        depth = builder.new_range(head, index)
        query_values = [builder.load(queries, builder.add(builder.mul(row, padded(head)), depth), None)
                        for row in lowering.local_rows]
        key_values_at = [builder.load(key_values, builder.add(builder.mul(key, padded(head)), depth), None)
                         for key in lowering.local_keys]
        result = []
        for query, query_value in zip(lowering.queries, query_values):
            row = []
            for local_key, key_value in zip(lowering.local_keys, key_values_at):
                dot = builder.reduce(Op.SUM, builder.alu(Op.MUL, float32, query_value, key_value), (depth,))
                key = builder.add(builder.mul(block, keys), local_key)
                place = (*lowering.batch, query, builder.at_most(key, source_length - 1))
                score = lowering.value(parts.scores, place, {parts.dot: dot})
                if score is None or score.dtype != float32:
                    return None
                if source_length % keys:
                    score = builder.alu(Op.WHERE, float32, builder.less(key, source_length), score,
                                        builder.const(-math.inf, float32))
                row.append((score, dot, place, key))
            result.append(row)
        return result

    # pass 1: each row's maximum score (the item's keys of every block, then the row's items' partial maxima)
    block = builder.new_range(blocks, index, count)
    free = builder.barrier([block, queries_ready])
    key_fills = fill_keys(block, free, False)
    if key_fills is None:
        return None
    block_scores = scores(block, builder.after(key_tile, [builder.barrier(key_fills)]))
    if block_scores is None:
        return None
    partial_tile = builder.define_shared(float32, rows * tiles.key_items)
    partial_stores = []
    for local_row, row_scores in zip(lowering.local_rows, block_scores):
        largest = row_scores[0][0]
        for score, _, _, _ in row_scores[1:]:
            largest = builder.alu(Op.MAX, float32, largest, score)
        partial_stores.append(builder.store(
            partial_tile, builder.add(builder.mul(local_row, tiles.key_items), lowering.item_key),
            builder.reduce(Op.REDUCE_MAX, largest, (block,))))
    partials_ready = builder.barrier(partial_stores)
    partials = builder.after(partial_tile, [partials_ready])
    other = builder.new_range(tiles.key_items, index)
    maxima = [builder.reduce(Op.REDUCE_MAX, builder.load(partials, builder.add(
        builder.mul(local_row, tiles.key_items), other), None), (other,)) for local_row in lowering.local_rows]

    # pass 2: the weights of each block (exp of the scores less the row's maximum) through local memory, and the
    # item's outputs and totals summed over the blocks; a causal attention's blocks before its first query unmasked
    columns = [builder.at_most(builder.add(lowering.item_key, tiles.key_items * number), value_head - 1)
               for number in range(-(-value_head // tiles.key_items))]

    def weighted_sums(start: IRNode | None, size: IRNode | None, masked: bool) -> list[list[IRNode]] | None:
        """Per row of the item: its total and its outputs' numerators over the blocks start, start + 1, ..."""
        counter = builder.new_range(blocks, index, size)
        block = counter if start is None else builder.add(start, counter)
        free = builder.barrier([counter, partials_ready])
        fills = fill_keys(block, free, True)
        if fills is None:
            return None
        filled = builder.barrier(fills)
        block_scores = scores(block, builder.after(key_tile, [filled]))
        if block_scores is None:
            return None
        weight_stores = []
        for local_row, maximum, row_scores in zip(lowering.local_rows, maxima, block_scores):
            for local_key, (_, dot, place, key) in zip(lowering.local_keys, row_scores):
                weight = lowering.value(parts.weights, place, {parts.dot: dot, parts.maximum: maximum})
                if weight is None or weight.dtype != float32:
                    return None
                if source_length % keys:
                    weight = builder.alu(Op.WHERE, float32, builder.less(key, source_length), weight,
                                         builder.const(0.0, float32))
                weight_stores.append(builder.store(builder.after(weight_tile, [free]), builder.add(
                    builder.mul(local_row, padded(keys)), local_key), weight))
        weights = builder.after(weight_tile, [builder.barrier(weight_stores)])
        values = builder.after(value_tile, [filled])
        inner = builder.new_range(keys, index)
        key = builder.at_most(builder.add(builder.mul(block, keys), inner), source_length - 1)
        value_loads = [builder.load(values, builder.add(builder.mul(inner, padded(value_head)), column), None)
                       for column in columns]
        sums = []
        for local_row, query in zip(lowering.local_rows, lowering.queries):
            weight = builder.load(weights, builder.add(builder.mul(local_row, padded(keys)), inner), None)
            row = [builder.reduce(Op.SUM, weight, (counter, inner))]
            for column, value_value in zip(columns, value_loads):
                product = builder.alu(Op.MUL, float32, weight, value_value)
                selected = lowering.selection(numerator_source, (*lowering.batch, query, key, column)) if masked \
                    else None
                if selected is not None:  # (the kernel's own mask, as its products are selected)
                    product = builder.alu(Op.WHERE, float32, selected, product, builder.const(0.0, float32))
                row.append(builder.reduce(Op.SUM, product, (counter, inner)))
            sums.append(row)
        return sums

    if causal:
        assert count is not None
        first_masked = builder.at_most(builder.div(lowering.row_origin, keys), blocks - 1)
        unmasked = weighted_sums(None, first_masked, False)
        masked = weighted_sums(first_masked, builder.add(count, builder.mul(first_masked, -1)), True)
        if unmasked is None or masked is None:
            return None
        sums = [[builder.alu(Op.ADD, float32, a, b) for a, b in zip(row_a, row_b)]
                for row_a, row_b in zip(unmasked, masked)]
    else:
        found = weighted_sums(None, None, True)
        if found is None:
            return None
        sums = found

    # the epilogue at the item's outputs
    output_stores = []
    for query, (total, *numerators) in zip(lowering.queries, sums):
        for column, numerator in zip(columns, numerators):
            lowerer = Replaced(kernel, builder, {parts.numerator: numerator, parts.total: total})
            output_stores.append(lowerer.store_output((*lowering.batch, query, column)))
            if lowerer.missing:
                return None
    if any(_reaches(store, [query_hole, key_hole, *lowering.stand_ins]) for store in output_stores):
        return None
    sink = builder.sink([*query_fills, queries_ready, *output_stores])
    return KernelIR(name=name, params=Replaced(kernel, builder, {}).buffer_params(),
                    global_size=lowering.groups * tiles.local_size, sink=sink, index_dtype=index,
                    local_size=tiles.local_size, warp_width=info.warp_width)
