"""A box of a lazy node's value computed on another device: the crop is pushed down the graph to its leaves, so a
device computes only its box and receives only the slices of the inputs that box reads (automatic sharding)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ember.core.graph import Node
from ember.core.ops import ELEMENTWISE_OPS, REDUCE_OPS, Op
from ember.core.shapes import prod
from ember.scheduler.devices import get_device

Bounds = tuple[tuple[int, int], ...]  # a (start, end) per axis, as SHRINK's arg

MAXIMUM_DEPTH = 200  # ops below the box's root through which the crop is pushed; deeper, the source is computed
# whole and cropped (keeps the walk's recursion shallow on long chains)


@dataclass
class SlicedGraph:
    """What computing a box on one device needs: the inputs that arrive there (host uploads and copies from other
    devices, as the original leaf and the bytes of its slice) and the nodes built, by (original node, box)."""

    device: str
    estimate_only: bool = False  # True: the nodes are only counted (no host data is sliced), never realized
    arriving: list[tuple[Node, int]] = field(default_factory=list)
    memo: dict[tuple[int, Bounds], Node] = field(default_factory=dict)

    @property
    def arriving_bytes(self) -> int:
        return sum(nbytes for _, nbytes in self.arriving)


def full_bounds(shape: tuple[int, ...]) -> Bounds:
    return tuple((0, size) for size in shape)


def box(node: Node, bounds: Bounds, graph: SlicedGraph, depth: int = 0) -> Node:
    """A node computing node's value inside `bounds`, on graph.device, from the smallest slices of its inputs."""
    key = (id(node), bounds)
    found = graph.memo.get(key)
    if found is None:
        found = graph.memo[key] = _box(node, bounds, graph, depth)
    return found


def _shape(bounds: Bounds) -> tuple[int, ...]:
    return tuple(end - start for start, end in bounds)


def _crop(node: Node, bounds: Bounds, device: str) -> Node:
    """SHRINK of node to bounds on device (node itself when the bounds are whole)."""
    if bounds == full_bounds(node.shape):
        return node
    return Node(Op.SHRINK, (node,), bounds, _shape(bounds), node.dtype, device)


def _box(node: Node, bounds: Bounds, graph: SlicedGraph, depth: int) -> Node:
    device, op = graph.device, node.op
    shape = _shape(bounds)
    if op is Op.BUFFER:
        return _leaf(node, bounds, graph)
    if op is Op.CONST:
        return Node(Op.CONST, (), node.arg, shape, node.dtype, device)
    if op is Op.ARANGE:
        return _crop(Node(Op.ARANGE, (), node.arg, node.shape, node.dtype, device), bounds, device)
    if depth > MAXIMUM_DEPTH:
        return _crop(_clone_whole(node, graph), bounds, device)
    below = depth + 1
    if op is Op.COPY:  # computed here instead: only the box moves, if anything
        return box(node.srcs[0], bounds, graph, below)
    if op is Op.CONTIGUOUS or op in ELEMENTWISE_OPS:
        sources = tuple(box(source, bounds, graph, below) for source in node.srcs)
        return Node(op, sources, node.arg, shape, node.dtype, device)
    source = node.srcs[0]
    if op in REDUCE_OPS:
        inner = tuple((0, size) if axis in node.arg else bounds[axis] for axis, size in enumerate(source.shape))
        return Node(op, (box(source, inner, graph, below),), node.arg, shape, node.dtype, device)
    if op is Op.EXPAND:
        inner = tuple((0, 1) if size == 1 and wide != 1 else bound
                      for size, wide, bound in zip(source.shape, node.shape, bounds))
        return Node(op, (box(source, inner, graph, below),), shape, shape, node.dtype, device)
    if op is Op.PERMUTE:
        inner_list = [(0, 0)] * len(bounds)
        for position, axis in enumerate(node.arg):
            inner_list[axis] = bounds[position]
        return Node(op, (box(source, tuple(inner_list), graph, below),), node.arg, shape, node.dtype, device)
    if op is Op.SHRINK:
        inner = tuple((offset + start, offset + end) for (offset, _), (start, end) in zip(node.arg, bounds))
        return box(source, inner, graph, below)
    if op is Op.FLIP:
        inner = tuple((size - end, size - start) if axis in node.arg else (start, end)
                      for axis, (size, (start, end)) in enumerate(zip(source.shape, bounds)))
        return Node(op, (box(source, inner, graph, below),), node.arg, shape, node.dtype, device)
    if op is Op.PAD:
        return _pad(node, bounds, graph, below)
    if op is Op.RESHAPE:
        inner_bounds = reshape_bounds(source.shape, node.shape, bounds)
        if inner_bounds is not None:
            return Node(op, (box(source, inner_bounds, graph, below),), shape, shape, node.dtype, device)
    return _crop(_clone_whole(node, graph), bounds, device)


def _pad(node: Node, bounds: Bounds, graph: SlicedGraph, depth: int) -> Node:
    source, (amounts, fill) = node.srcs[0], node.arg
    inner, new_amounts = [], []
    for size, (before, _), (start, end) in zip(source.shape, amounts, bounds):
        first, last = max(start - before, 0), min(end - before, size)
        if last <= first:  # the box lies wholly in the padding
            return Node(Op.CONST, (), fill, _shape(bounds), node.dtype, graph.device)
        inner.append((first, last))
        new_amounts.append((first + before - start, end - (last + before)))
    padded = box(source, tuple(inner), graph, depth)
    if all(amount == (0, 0) for amount in new_amounts):
        return padded
    return Node(Op.PAD, (padded,), (tuple(new_amounts), fill), _shape(bounds), node.dtype, graph.device)


def _leaf(node: Node, bounds: Bounds, graph: SlicedGraph) -> Node:
    """A realized leaf's box on graph.device: a view where it lives, else its slice uploaded or copied there."""
    device, shape = graph.device, _shape(bounds)
    if node.buffer is None and node.arg is not None:  # host data not uploaded yet: upload only the box, there
        if node.device == device and bounds == full_bounds(node.shape):
            graph.arriving.append((node, node.size * node.dtype.itemsize))
            return node
        graph.arriving.append((node, prod(shape) * node.dtype.itemsize))
        if graph.estimate_only:
            return Node(Op.BUFFER, (), None, shape, node.dtype, device)
        array = np.asarray(node.arg).reshape(node.shape)[tuple(slice(start, end) for start, end in bounds)]
        return Node(Op.BUFFER, (), np.ascontiguousarray(array), shape, node.dtype, device)
    if node.device == device:
        return _crop(node, bounds, device)
    graph.arriving.append((node, prod(shape) * node.dtype.itemsize))
    home = node.device
    if home is not None and get_device(home).info.can_run:  # crop where it lives, then move only the box
        part = _crop(node, bounds, home)
        return Node(Op.COPY, (part,), device, shape, node.dtype, device)
    moved = Node(Op.COPY, (node,), device, node.shape, node.dtype, device)
    return _crop(moved, bounds, device)


def _clone_whole(node: Node, graph: SlicedGraph) -> Node:
    """node's graph rebuilt on graph.device; realized leaves arrive whole (by upload or COPY)."""
    from ember.core.walk import compute_bottom_up

    device = graph.device
    memo: dict[int, Node] = {}

    def sources(current: Node) -> tuple[Node, ...]:
        return () if current.realized or current.op in (Op.CONST, Op.ARANGE) else current.srcs

    def clone(current: Node) -> Node:
        if current.realized:
            return _leaf(current, full_bounds(current.shape), graph)
        if current.op in (Op.CONST, Op.ARANGE):
            return Node(current.op, (), current.arg, current.shape, current.dtype, device)
        if current.op is Op.COPY:
            return memo[id(current.srcs[0])]
        return Node(current.op, tuple(memo[id(source)] for source in current.srcs), current.arg, current.shape,
                    current.dtype, device)

    return compute_bottom_up(node, sources, clone, memo)


def reshape_bounds(source_shape: tuple[int, ...], shape: tuple[int, ...], bounds: Bounds) -> Bounds | None:
    """The box of a reshape's source holding exactly the box `bounds` of its result, or None when the box is not a
    box there (a crop across merged axes that does not fall on whole rows of the inner axes)."""
    result: list[tuple[int, int]] = []
    source_axis, axis = 0, 0
    while source_axis < len(source_shape) or axis < len(shape):
        # one group: the fewest leading axes of each side with equal element counts (size-1 axes join the group)
        group_source, group = [source_axis], [axis]
        source_count = source_shape[source_axis] if source_axis < len(source_shape) else 1
        count = shape[axis] if axis < len(shape) else 1
        source_axis, axis = source_axis + 1, axis + 1
        while source_count != count:
            if source_count < count:
                if source_axis >= len(source_shape):
                    return None
                group_source.append(source_axis)
                source_count *= source_shape[source_axis]
                source_axis += 1
            else:
                if axis >= len(shape):
                    return None
                group.append(axis)
                count *= shape[axis]
                axis += 1
        group_source = [index for index in group_source if index < len(source_shape)]
        group = [index for index in group if index < len(shape)]
        mapped = _group_bounds([source_shape[index] for index in group_source], [shape[index] for index in group],
                               [bounds[index] for index in group])
        if mapped is None:
            return None
        result.extend(mapped)
    return tuple(result)


def _group_bounds(source_sizes: list[int], sizes: list[int], bounds: list[tuple[int, int]]
                  ) -> list[tuple[int, int]] | None:
    """A group of a reshape (equal element counts): the source's box for the result's box, when it is one."""
    if all(bound == (0, size) for bound, size in zip(bounds, sizes)):
        return [(0, size) for size in source_sizes]
    # the result's box as one flat range: only its first non-trivial axis may be cropped
    outer = [index for index, size in enumerate(sizes) if size != 1]
    if not outer or any(bounds[index] != (0, sizes[index]) for index in outer[1:]):
        return None
    first = outer[0]
    inner_count = prod(tuple(sizes[first + 1:]))
    start, end = bounds[first][0] * inner_count, bounds[first][1] * inner_count
    # the same flat range as a box of the source: its first non-trivial axis cropped at whole inner rows
    source_outer = [index for index, size in enumerate(source_sizes) if size != 1]
    source_first = source_outer[0]
    source_inner = prod(tuple(source_sizes[source_first + 1:]))
    if start % source_inner or end % source_inner:
        return None
    return [(start // source_inner, end // source_inner) if index == source_first else (0, size)
            for index, size in enumerate(source_sizes)]
