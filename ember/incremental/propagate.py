"""Dirty-region propagation: which region of each node of a lazy graph may change when regions of some nodes
change, by one forward walk with one rule per primitive op family (a sound box for each node)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ember.core.errors import ShapeError
from ember.core.graph import Node
from ember.core.ops import ELEMENTWISE_OPS, REDUCE_OPS, Op
from ember.core.shapes import Shape, prod
from ember.core.walk import post_order
from ember.incremental.region import Range, Region


def propagate(roots: Sequence[Node], changed: Mapping[Node, Region]) -> dict[Node, Region]:
    """The dirty region of every node reachable from `roots`: elements whose value may differ from the last run
    when only the `changed` regions of their nodes differ (every other element surely has its last value).

    `changed` usually names source nodes (BUFFER leaves); a region given for an inner node is added to what its
    sources make dirty. Nodes not above a changed node get the empty region."""
    for node, region in changed.items():
        if region.shape != node.shape:
            raise ShapeError(f"propagate: a changed region of shape {region.shape} for {node}; need {node.shape}")
    dirty: dict[Node, Region] = {}
    for node in post_order(roots, lambda node: node.srcs):
        sources = [dirty[source] for source in node.srcs]
        if any(not region.is_empty for region in sources) and prod(node.shape) > 0:
            region = _RULES[node.op](node, sources) if node.op in _RULES else _elementwise(node, sources)
        else:
            region = Region.empty(node.shape)
        given = changed.get(node)
        dirty[node] = region if given is None else region.hull(given)
    return dirty


def _elementwise(node: Node, sources: list[Region]) -> Region:
    """Elementwise ops (and COPY, CONTIGUOUS): each output element reads its own index of every source."""
    assert node.op in ELEMENTWISE_OPS or node.op in (Op.COPY, Op.CONTIGUOUS), node
    region = Region.empty(node.shape)
    for source in sources:
        region = region.hull(source)
    return region


def _reduce(node: Node, sources: list[Region]) -> Region:
    """A reduce keeps its reduced axes with size 1: a dirty slice of a reduced axis dirties that whole output."""
    (source,) = sources
    return Region(node.shape, [(0, 1) if axis in node.arg else bounds for axis, bounds in enumerate(source.ranges)])


def _expand(node: Node, sources: list[Region]) -> Region:
    """An axis broadcast from size 1 is dirty wholly (every copy reads the one dirty element)."""
    (source,) = sources
    return Region(node.shape, [
        (0, size) if size != old_size else bounds
        for bounds, size, old_size in zip(source.ranges, node.shape, node.srcs[0].shape)
    ])


def _permute(node: Node, sources: list[Region]) -> Region:
    (source,) = sources
    return Region(node.shape, [source.ranges[axis] for axis in node.arg])


def _pad(node: Node, sources: list[Region]) -> Region:
    """Padding shifts the box by the amounts before it; the padding itself is a constant, never dirty."""
    (source,) = sources
    return Region(node.shape, [(start + before, end + before)
                               for (start, end), (before, _) in zip(source.ranges, node.arg[0])])


def _shrink(node: Node, sources: list[Region]) -> Region:
    """A slice keeps the part of the box inside it, shifted to its start."""
    (source,) = sources
    ranges = [(max(start, low) - low, min(end, high) - low) for (start, end), (low, high) in zip(source.ranges, node.arg)]
    if any(start >= end for start, end in ranges):
        return Region.empty(node.shape)
    return Region(node.shape, ranges)


def _flip(node: Node, sources: list[Region]) -> Region:
    (source,) = sources
    return Region(node.shape, [(size - end, size - start) if axis in node.arg else (start, end)
                               for axis, ((start, end), size) in enumerate(zip(source.ranges, node.shape))])


def _reshape(node: Node, sources: list[Region]) -> Region:
    """Exact where each group of axes that reshape splits or merges keeps the box a box; otherwise the smallest box
    that covers the group's elements (see `_reshape_group`)."""
    (source,) = sources
    ranges: list[Range] = []
    for old_axes, new_axes in reshape_groups(node.srcs[0].shape, node.shape):
        old_sizes = [node.srcs[0].shape[axis] for axis in old_axes]
        new_sizes = [node.shape[axis] for axis in new_axes]
        ranges.extend(_reshape_group([source.ranges[axis] for axis in old_axes], old_sizes, new_sizes))
    return Region(node.shape, ranges)


def reshape_groups(old: Shape, new: Shape) -> list[tuple[range, range]]:
    """The shortest runs of axes (old axes, new axes) with equal products, in order: a reshape maps each run of
    old axes onto its run of new axes independently (a run may have no axes on one side: size-1 axes)."""
    groups: list[tuple[range, range]] = []
    old_index = new_index = old_start = new_start = 0
    old_product = new_product = 1
    while old_index < len(old) or new_index < len(new):
        if new_index == len(new) or (old_index < len(old) and old_product <= new_product):
            old_product *= old[old_index]
            old_index += 1
        else:
            new_product *= new[new_index]
            new_index += 1
        if old_product == new_product:
            groups.append((range(old_start, old_index), range(new_start, new_index)))
            old_start, new_start = old_index, new_index
    return groups


def _reshape_group(ranges: list[Range], old_sizes: list[int], new_sizes: list[int]) -> list[Range]:
    """One group: the box's elements lie between its first and last element in row-major order, so the flat range
    [first, last] covers them; that range as a box of the new axes is exact when it is one, else its smallest
    covering box (an axis spanning several positions of the axis outside it becomes whole)."""
    first = last = 0
    for (start, end), size in zip(ranges, old_sizes):
        first, last = first * size + start, last * size + end - 1
    result: list[Range] = []
    inner = prod(new_sizes)
    spread = False  # an outer axis spans several positions: this one and all inner ones are whole
    for size in new_sizes:
        inner //= size
        if spread:
            result.append((0, size))
            continue
        low, high = first // inner, last // inner
        result.append((low, high + 1))
        first, last = first - low * inner, last - low * inner
        spread = low != high
    return result


_RULES: dict[Op, Callable[[Node, list[Region]], Region]] = {
    **{op: _reduce for op in REDUCE_OPS},
    Op.EXPAND: _expand,
    Op.PERMUTE: _permute,
    Op.PAD: _pad,
    Op.SHRINK: _shrink,
    Op.FLIP: _flip,
    Op.RESHAPE: _reshape,
}

