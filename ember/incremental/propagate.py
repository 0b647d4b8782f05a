"""Dirty-region propagation: which elements of each node of a lazy graph may change when regions of some nodes
change, by one forward walk with one rule per primitive op family (a few disjoint boxes per node)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

from ember.core.errors import ShapeError
from ember.core.graph import Node
from ember.core.graph_templates import expand_in_place
from ember.core.ops import ELEMENTWISE_OPS, REDUCE_OPS, Op
from ember.core.shapes import prod
from ember.core.walk import post_order
from ember.incremental import affine
from ember.incremental.region import Region
from ember.incremental.static_bounds import bounds_over, is_static

MAX_BOXES = 8  # a node's dirty boxes beyond this many become their hull (one box)

Boxes = tuple[Region, ...]  # disjoint, non-empty boxes of one shape


def propagate(roots: Sequence[Node], changed: Mapping[Node, Region]) -> dict[Node, Region]:
    """The dirty region of every node reachable from `roots`: a box holding every element whose value may differ
    from the last run when only the `changed` regions of their nodes differ (every element outside it surely has
    its last value). The hull of `propagate_boxes`."""
    dirty: dict[Node, Region] = {}
    for node, boxes in propagate_boxes(roots, changed).items():
        region = Region.empty(node.shape)
        for box in boxes:
            region = region.hull(box)
        dirty[node] = region
    return dirty


def propagate_boxes(roots: Sequence[Node], changed: Mapping[Node, Region]) -> dict[Node, Boxes]:
    """The dirty elements of every node reachable from `roots` as disjoint boxes (none: nothing changed).

    `changed` usually names source nodes (BUFFER leaves); a region given for an inner node is added to what its
    sources make dirty."""
    for node, region in changed.items():
        if region.shape != node.shape:
            raise ShapeError(f"propagate: a changed region of shape {region.shape} for {node}; need {node.shape}")
    expand_in_place(list(roots))  # (regions move through primitive ops: templates' copies are expanded)
    dirty: dict[Node, Boxes] = {}
    static: dict[Node, bool] = {}
    for node in post_order(roots, lambda node: node.srcs):
        static[node] = is_static(node, [static[source] for source in node.srcs])
        sources = [dirty[source] for source in node.srcs]
        boxes: Boxes = ()
        if any(sources) and prod(node.shape) > 0:
            if node.op is Op.WHERE:
                boxes = _where(node, sources, static[node.srcs[0]])
            elif node.op in _RULES:
                rule = _RULES[node.op]
                boxes = union((), [rule(node, box) for box in sources[0]])
            else:
                assert node.op in ELEMENTWISE_OPS or node.op in (Op.COPY, Op.CONTIGUOUS), node
                boxes = union((), [box for source in sources for box in source])
        given = changed.get(node)
        dirty[node] = boxes if given is None else union(boxes, [given])
    return dirty


def union(boxes: Boxes, new: Sequence[Region]) -> Boxes:
    """`boxes` with the elements of `new` added, as disjoint boxes (two that are one box joined: a row appended
    next to the rows before it stays one box); more than MAX_BOXES become their hull."""
    result = list(boxes)
    for box in new:
        if box.is_empty or box in result:
            continue
        pieces = [box]
        for existing in result:
            pieces = [piece for part in pieces for piece in part.difference(existing)]
        result.extend(pieces)
    if len(result) > 1:
        result = _joined(result)
    if len(result) > MAX_BOXES:
        hull = result[0]
        for box in result[1:]:
            hull = hull.hull(box)
        return (hull,)
    return tuple(result)


def _joined(boxes: list[Region]) -> list[Region]:
    """Disjoint boxes with each two that form one box (equal on every axis but one, adjacent on it) joined."""
    index = 0
    while index < len(boxes):
        for other in range(index + 1, len(boxes)):
            joined = _join(boxes[index], boxes[other])
            if joined is not None:
                boxes[index] = joined
                del boxes[other]
                break
        else:
            index += 1
    return boxes


def _join(first: Region, second: Region) -> Region | None:
    """The one box that two disjoint boxes form, or None."""
    differing = -1
    for axis, (bounds, other) in enumerate(zip(first.ranges, second.ranges)):
        if bounds != other:
            if differing >= 0:
                return None
            differing = axis
    (start, end), (other_start, other_end) = first.ranges[differing], second.ranges[differing]
    if end == other_start:
        ranges = list(first.ranges)
        ranges[differing] = (start, other_end)
    elif other_end == start:
        ranges = list(first.ranges)
        ranges[differing] = (other_start, end)
    else:
        return None
    return Region._of(first.shape, ranges)


def _where(node: Node, sources: list[Boxes], static_condition: bool) -> Boxes:
    """A select: a dirty branch matters only where the condition may pick it. A condition that depends on no buffer
    (a causal mask) is bounded over each dirty box, which is narrowed to the part where the branch may be picked."""
    condition_boxes, true_boxes, false_boxes = sources
    kept: list[Region] = list(condition_boxes)
    for boxes, excluded in ((true_boxes, (0, 0)), (false_boxes, (1, 1))):
        for box in boxes:
            narrowed = _narrow(box, node.srcs[0], excluded) if static_condition else box
            if narrowed is not None:
                kept.append(narrowed)
    return union((), kept)


def _narrow(box: Region, condition: Node, excluded: tuple[int, int]) -> Region | None:
    """The smallest box inside `box` outside which the static condition surely has the `excluded` value: each axis
    loses its longest prefix and suffix of slabs where it does (found by bisection: a slab inside an excluded slab
    is excluded), or None when the whole box is excluded. Over a box of affine bounds (affine.tracing(): a plan
    for a range of positions) the lengths found are affine too, checked at their ends for the range."""
    def is_excluded(candidate: Region) -> bool:
        return bounds_over(condition, candidate) == excluded

    if is_excluded(box):
        return None
    ranges = list(box.ranges)

    def slab_excluded(axis: int, low: int, high: int) -> bool:
        return is_excluded(Region._of(box.shape, [*ranges[:axis], (low, high), *ranges[axis + 1:]]))

    slopes = sorted({slope for bounds in box.ranges for bound in bounds
                     for slope in (affine.parts(bound)[1], -affine.parts(bound)[1])})
    for axis in range(box.rank):
        start, end = ranges[axis]
        start += _longest_affine(end - start, partial(_prefix_excluded, slab_excluded, axis, start), slopes)
        end -= _longest_affine(end - start, partial(_suffix_excluded, slab_excluded, axis, end), slopes)
        ranges[axis] = (start, end)
    return Region._of(box.shape, ranges)


def _prefix_excluded(slab_excluded: Callable[[int, int, int], bool], axis: int, start: int, length: int) -> bool:
    return slab_excluded(axis, start, start + length)


def _suffix_excluded(slab_excluded: Callable[[int, int, int], bool], axis: int, end: int, length: int) -> bool:
    return slab_excluded(axis, end - length, end)


def _longest_affine(limit: int, holds: Callable[[int], bool], slopes: list[int]) -> int:
    """`_longest`, also where `limit` or what `holds` reads is affine in a parameter (inside affine.tracing()): the
    length is searched at the parameter's value (decisions of the search not recorded), then taken with each slope
    of `slopes` (those of the box's bounds and their negatives, 0 among them), whichever holds over the widest
    range, checked at its two ends (the largest length that holds and the next that does not: `holds` is
    monotone)."""
    interval = affine.TRACE.get()
    if interval is None:
        return _longest(limit, holds)
    limit_value, _ = affine.parts(limit)
    with affine.tracing():  # (the search's own decisions: only the result is checked)
        length = _longest(limit_value, holds)
    candidates = [affine.affine(length, slope) for slope in slopes]
    best: tuple[int, affine.Interval] | None = None
    for candidate in candidates:
        with affine.tracing() as checked:
            # (each decision is recorded into `checked`; at the parameter's value all come out as searched)
            found = 0 <= candidate < limit and (not candidate > 0 or holds(candidate)) and \
                (not candidate + 1 < limit or not holds(candidate + 1))
        if not found:
            raise AssertionError(f"_longest_affine: length {length} found for limit {limit_value} does not hold")
        if best is None or _width(checked) > _width(best[1]):
            best = (candidate, checked)
    assert best is not None
    chosen, checked = best
    interval.low, interval.high = max(interval.low, checked.low), min(interval.high, checked.high)
    return chosen


def _longest(limit: int, holds: Callable[[int], bool]) -> int:
    """The largest length in [0, limit) for which `holds` (true for all shorter lengths once true for one)."""
    low, high = 0, limit - 1
    while low < high:
        middle = (low + high + 1) // 2
        if holds(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _width(interval: affine.Interval) -> int:
    return min(interval.high, 1 << 30) - max(interval.low, -(1 << 30))


def _reduce(node: Node, box: Region) -> Region:
    """A reduce keeps its reduced axes with size 1: a dirty slice of a reduced axis dirties that whole output."""
    return Region._of(node.shape, [(0, 1) if axis in node.arg else bounds for axis, bounds in enumerate(box.ranges)])


def _expand(node: Node, box: Region) -> Region:
    """An axis broadcast from size 1 is dirty wholly (every copy reads the one dirty element)."""
    return Region._of(node.shape, [
        (0, size) if size != old_size else bounds
        for bounds, size, old_size in zip(box.ranges, node.shape, node.srcs[0].shape)
    ])


def _permute(node: Node, box: Region) -> Region:
    return Region._of(node.shape, [box.ranges[axis] for axis in node.arg])


def _pad(node: Node, box: Region) -> Region:
    """Padding shifts the box by the amounts before it; the padding itself is a constant, never dirty."""
    return Region._of(node.shape, [(start + before, end + before) for (start, end), (before, _) in zip(box.ranges, node.arg[0])])


def _shrink(node: Node, box: Region) -> Region:
    """A slice keeps the part of the box inside it, shifted to its start."""
    ranges = [(max(start, low) - low, min(end, high) - low) for (start, end), (low, high) in zip(box.ranges, node.arg)]
    return Region._of(node.shape, ranges)


def _flip(node: Node, box: Region) -> Region:
    return Region._of(node.shape, [(size - end, size - start) if axis in node.arg else (start, end)
                               for axis, ((start, end), size) in enumerate(zip(box.ranges, node.shape))])


def _reshape(node: Node, box: Region) -> Region:
    return box.reshaped(node.shape)


_RULES: dict[Op, Callable[[Node, Region], Region]] = {
    **{op: _reduce for op in REDUCE_OPS},
    Op.EXPAND: _expand,
    Op.PERMUTE: _permute,
    Op.PAD: _pad,
    Op.SHRINK: _shrink,
    Op.FLIP: _flip,
    Op.RESHAPE: _reshape,
}
