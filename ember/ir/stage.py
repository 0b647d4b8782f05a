"""Staging: inputs a work item reads again for each tile of its loop are first copied into a contiguous scratch array.

A matmul work item that loops down the rows of its column panel reads the same panel of B (K rows of 16 floats,
N floats apart) for every tile. Read from B itself, the panel's rows fall into the same few cache sets when N is a
power of two and keep evicting each other; copied once into a scratch array (K x 16 floats, contiguous) they stay
in cache for every tile after the first. This is the packing step of BLAS libraries, done per work item.
"""

from __future__ import annotations

from ember.core.walk import compute_bottom_up, pre_order
from ember.ir.ir import Builder, IRNode, IROp, KernelIR
from ember.ir.linearize import LoopVariables


class _ReadsMemory:
    """Whether a node's value depends on a load from a kernel parameter (memoized across calls)."""

    def __init__(self) -> None:
        self.memo: dict[int, bool] = {}

    def __call__(self, root: IRNode) -> bool:
        return compute_bottom_up(root, lambda node: node.srcs, self._own, self.memo)

    def _own(self, node: IRNode) -> bool:
        return (node.op is IROp.LOAD and node.srcs[0].op is IROp.PARAM) or any(self.memo[id(src)] for src in node.srcs)


def _values_to_stage(reduce: IRNode, ranges_of: LoopVariables, reads_memory: _ReadsMemory) -> list[IRNode]:
    """The largest float values under a reduce's value that depend on the reduce's loop only and read memory (not
    under nested reduces; through broadcasts to their scalar), in a deterministic order (first reached first)."""
    loop = frozenset({id(reduce.srcs[1])})
    found: list[IRNode] = []

    def search_below(node: IRNode) -> tuple[IRNode, ...]:
        if node.op is IROp.REDUCE:
            return ()
        broadcast = node.op is IROp.VECTORIZE and all(lane is node.srcs[0] for lane in node.srcs)
        if not broadcast and node.dtype.is_float and ranges_of(node) == loop and reads_memory(node):
            found.append(node)
            return ()
        return node.srcs[::-1]

    pre_order([reduce.srcs[0]], search_below)
    return found


def stage_loads(kernel: KernelIR, max_bytes: int) -> KernelIR:
    """The kernel with the values of its tile loop's reduces that do not change from tile to tile (they depend on
    the reduce's loop only: loads, gathered vectors, computed operands) read from a scratch array filled once per
    work item, if that array fits in `max_bytes`. What the copy computes (a gather, an operand's elementwise
    prologue) then runs once per work item instead of once per tile."""
    if len(kernel.sink.srcs) != 1 or kernel.sink.srcs[0].op is not IROp.LOOP:
        return kernel
    ranges_of, reads_memory = LoopVariables(), _ReadsMemory()
    nodes = pre_order([kernel.sink], lambda node: node.srcs)
    reduces = [node for node in nodes if node.op is IROp.REDUCE and len(node.srcs) == 2]
    staged: dict[int, tuple[IRNode, list[IRNode]]] = {}  # reduce range id -> (range, loads)
    for reduce in reduces:
        loop = reduce.srcs[1]
        for value in _values_to_stage(reduce, ranges_of, reads_memory):
            if value not in staged.get(id(loop), (None, []))[1]:
                staged.setdefault(id(loop), (loop, []))[1].append(value)
    plans = []
    for loop, loads in staged.values():
        if len({load.dtype for load in loads}) != 1:
            continue
        stride = sum(load.width for load in loads)
        if loop.arg[1] * stride * loads[0].dtype.itemsize <= max_bytes:
            plans.append((loop, loads, stride))
    if not plans:
        return kernel
    builder = Builder()
    builder.loop_count = max(node.arg[0] for node in nodes if node.op is IROp.RANGE)
    memo: dict[int, IRNode] = {}
    for loop, loads, stride in plans:
        local = builder.define_local(loads[0].dtype, loop.arg[1] * stride)
        fill_range = builder.new_range(loop.arg[1], kernel.index_dtype)
        fill_memo = {id(loop): fill_range}
        fills, offsets, offset = [], [], 0
        for load in loads:
            value = _rebuild(builder, load, fill_memo)
            index = builder.add(builder.mul(fill_range, stride), offset)
            fills.append(builder.store(local, index, value))
            offsets.append(offset)
            offset += load.width
        ready = builder.after(local, [builder.loop(fills, (fill_range,))])
        new_loop = _rebuild(builder, loop, memo)
        for load, load_offset in zip(loads, offsets):
            index = builder.add(builder.mul(new_loop, stride), load_offset)
            memo[id(load)] = (builder.vector_load(ready, index, None, load.width) if load.width > 1
                              else builder.load(ready, index, None))
    sink = _rebuild(builder, kernel.sink, memo)
    return KernelIR(kernel.name, kernel.params, kernel.global_size, sink, kernel.index_dtype)


def _rebuild(builder: Builder, root: IRNode, memo: dict[int, IRNode]) -> IRNode:
    """root rebuilt with `builder`, nodes already in memo replaced by their entries."""
    return compute_bottom_up(root, lambda node: node.srcs,
                             lambda node: builder.rebuild(node, [memo[id(src)] for src in node.srcs]), memo)
