"""Region restriction: the lazy graph computing only the elements of a node inside a box, built by pushing the box
down through the ops to the nodes read from buffers (whose boxes are SHRINK views), so its work scales with the box."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

from ember.core.errors import ArgumentError, ShapeError
from ember.core.graph import Node, infer
from ember.core.graph_templates import expand_in_place
from ember.core.ops import ELEMENTWISE_OPS, FUSED_ATTENTION, REDUCE_OPS, Op, reduce_identity
from ember.core.walk import post_order
from ember.incremental.propagate import _narrow
from ember.incremental.region import Range, Region, reshape_groups
from ember.incremental.static_bounds import is_static

Reader = Callable[[Node], "Node | None"]  # a node to read from a buffer instead (a kept value), or None: compute it


def restrict(node: Node, region: Region, read: Reader | None = None) -> Node:
    """A lazy node of the box's shape whose values are `node`'s values inside `region`.

    The box is pushed down through every op: elementwise ops restrict each source to the box; EXPAND restricts its
    source on the axes it does not broadcast; PERMUTE, FLIP, SHRINK and PAD map the box onto their source (a box
    wholly inside padding is a constant); a reduce restricts the kept axes and reads its reduced axes whole;
    RESHAPE maps each group of axes it splits or merges that keeps the box a box, and reads other groups whole
    and slices after. A node for which `read` gives a node (a kept, realized value) is read from that node
    through a SHRINK, and so are BUFFER leaves; CONST and ARANGE are made again for the box."""
    expand_in_place([node])  # (the box moves through primitive ops: templates' copies are expanded)
    if region.is_empty:
        raise ArgumentError(f"restrict: an empty region of {node}")
    if region.shape != node.shape:
        raise ShapeError(f"restrict: a region of shape {region.shape} for {node} of shape {node.shape}")
    return _Restriction(read or (lambda _: None)).of(node, region)


class _Restriction:
    """One restriction: results memoized per (node, box), so a value read by several consumers over one box is one
    node of the result (the kernelizer then fuses or stores it as it would in the full graph)."""

    def __init__(self, read: Reader) -> None:
        self.read = read
        self.memo: dict[tuple[int, tuple[Range, ...]], Node] = {}
        self.keep_alive: list[Node] = []  # the memo's keys are ids of these nodes

    def of(self, node: Node, box: Region) -> Node:
        # an explicit stack: graphs may be deep
        pending: list[tuple[Node, Region, bool]] = [(node, box, False)]
        while pending:
            current, current_box, expanded = pending.pop()
            key = (id(current), current_box.ranges)
            if key in self.memo:
                continue
            stored = self.read(current)
            if stored is not None or current.op in (Op.BUFFER, Op.CONST, Op.ARANGE):
                self._remember(current, current_box, self._leaf(current, current_box, stored))
                continue
            source_boxes = _source_boxes(current, current_box)
            if not expanded:
                pending.append((current, current_box, True))
                for source, source_box in zip(current.srcs, source_boxes):
                    if source_box is not None and (id(source), source_box.ranges) not in self.memo:
                        pending.append((source, source_box, False))
                continue
            sources = [None if source_box is None else self.memo[(id(source), source_box.ranges)]
                       for source, source_box in zip(current.srcs, source_boxes)]
            self._remember(current, current_box, self._build(current, current_box, sources))
        return self.memo[(id(node), box.ranges)]

    def _remember(self, node: Node, box: Region, result: Node) -> None:
        self.memo[(id(node), box.ranges)] = result
        self.keep_alive.append(node)

    def _leaf(self, node: Node, box: Region, stored: Node | None) -> Node:
        if node.op is Op.CONST and stored is None:
            return Node(Op.CONST, (), node.arg, _box_shape(box), node.dtype, node.device)
        if node.op is Op.ARANGE and stored is None:
            start, end = box.ranges[0]
            values = Node(Op.ARANGE, (), None, (end - start,), node.dtype, node.device)
            if start == 0:
                return values
            offset = Node(Op.CONST, (), start, (end - start,), node.dtype, node.device)
            return _make(Op.ADD, (values, offset), None)
        return _shrink(node if stored is None else stored, box)

    def _build(self, node: Node, box: Region, sources: list[Node | None]) -> Node:
        op = node.op
        if op is Op.CONTIGUOUS and node.arg == FUSED_ATTENTION:
            # a box of a fused attention (core's flash attention graph) is computed by the primitive ops it is made
            # of, in the kernels any graph of them gets: a decode step's row is below the flash kernel's rows, and
            # its restricted parts (a causal prefix of keys, rows stored apart) are not the fused form
            return _make(op, tuple(_present(sources)), None)
        if op in ELEMENTWISE_OPS or op in (Op.CONTIGUOUS, Op.COPY):
            return _make(op, tuple(_present(sources)), node.arg, node.device if op is Op.COPY else None)
        if op in REDUCE_OPS:
            return _make(op, (_present(sources)[0],), node.arg)
        if op is Op.EXPAND:
            return _make(op, (_present(sources)[0],), _box_shape(box))
        if op in (Op.PERMUTE, Op.FLIP):
            return _make(op, (_present(sources)[0],), node.arg)
        if op is Op.SHRINK:
            return _present(sources)[0]
        if op is Op.PAD:
            return self._pad(node, box, sources[0])
        if op is Op.RESHAPE:
            return self._reshape(node, box, _present(sources)[0])
        raise AssertionError(f"restrict: no rule for {op}")

    def _pad(self, node: Node, box: Region, source: Node | None) -> Node:
        padding, fill = node.arg
        if source is None:  # the box lies wholly in the padding
            return Node(Op.CONST, (), fill, _box_shape(box), node.dtype, _device_below(node))
        amounts = []
        for (start, end), (before, _), size in zip(box.ranges, padding, node.srcs[0].shape):
            inner_start, inner_end = max(start, before), min(end, before + size)
            amounts.append((inner_start - start, end - inner_end))
        if all(amount == (0, 0) for amount in amounts):
            return source
        return _make(Op.PAD, (source,), (tuple(amounts), fill))

    def _reshape(self, node: Node, box: Region, source: Node) -> Node:
        covering = _reshape_covering(node, box)
        reshaped = _make(Op.RESHAPE, (source,), _box_shape(covering))
        if covering == box:
            return reshaped
        inner = [(start - outer_start, end - outer_start)
                 for (start, end), (outer_start, _) in zip(box.ranges, covering.ranges)]
        return _make(Op.SHRINK, (reshaped,), tuple(inner))


def source_boxes(node: Node, box: Region) -> list[Region | None]:
    """The box of each source that computing `node` over `box` reads (None: none of it), as `restrict` reads it."""
    return _source_boxes(node, box)


def _source_boxes(node: Node, box: Region) -> list[Region | None]:
    op = node.op
    if op in ELEMENTWISE_OPS or op in (Op.CONTIGUOUS, Op.COPY):
        return [box for _ in node.srcs]
    source_shape = node.srcs[0].shape
    if op in REDUCE_OPS:
        return [_reduced_box(node, box)]
    if op is Op.EXPAND:
        return [Region._of(source_shape, [(0, 1) if size == 1 else bounds
                                          for bounds, size in zip(box.ranges, source_shape)])]
    if op is Op.PERMUTE:
        ranges: list[Range] = [(0, 0)] * len(node.arg)
        for position, axis in enumerate(node.arg):
            ranges[axis] = box.ranges[position]
        return [Region._of(source_shape, ranges)]
    if op is Op.FLIP:
        return [Region._of(source_shape, [(size - end, size - start) if axis in node.arg else (start, end)
                                          for axis, ((start, end), size) in enumerate(zip(box.ranges, node.shape))])]
    if op is Op.SHRINK:
        return [Region._of(source_shape, [(start + low, end + low)
                                          for (start, end), (low, _) in zip(box.ranges, node.arg)])]
    if op is Op.PAD:
        inner = [(max(start - before, 0), min(end - before, size))
                 for (start, end), (before, _), size in zip(box.ranges, node.arg[0], source_shape)]
        return [None if any(start >= end for start, end in inner) else Region._of(source_shape, inner)]
    if op is Op.RESHAPE:
        return [_reshape_covering(node, box).reshaped(source_shape)]
    raise AssertionError(f"restrict: no rule for {op}")


def _reduced_box(node: Node, box: Region) -> Region:
    """The box of its source a reduce reads over `box`: its reduced axes whole, except where the source selects
    the reduce's identity (0 for a sum, -inf for a max) on a static condition (a causal mask): the reduced axes
    then keep only the slabs where the condition may pick the other branch (a causal row's keys up to its
    position), the others adding exactly the identity."""
    source = node.srcs[0]
    ranges = [(0, size) if axis in node.arg else bounds
              for axis, (bounds, size) in enumerate(zip(box.ranges, source.shape))]
    whole = Region._of(source.shape, ranges)
    if source.op is not Op.WHERE or not _is_constant(source.srcs[2], reduce_identity(node.op, source.dtype)) \
            or not _static(source.srcs[0]):
        return whole
    narrowed = _narrow(whole, source.srcs[0], (0, 0))
    if narrowed is None:  # (the identity everywhere: read as is)
        return whole
    return Region._of(source.shape, [narrowed.ranges[axis] if axis in node.arg else bounds
                                     for axis, bounds in enumerate(ranges)])


def _is_constant(node: Node, value: Any) -> bool:
    """Whether every element of `node` is the constant `value` (a CONST through movement ops without padding)."""
    while node.op in (Op.EXPAND, Op.RESHAPE, Op.PERMUTE, Op.SHRINK, Op.FLIP):
        node = node.srcs[0]
    return node.op is Op.CONST and isinstance(node.arg, (int, float)) and node.arg == value


STATIC: WeakKeyDictionary[Node, bool] = WeakKeyDictionary()  # whether a node's value depends on no buffer


def _static(node: Node) -> bool:
    known = STATIC.get(node)
    if known is None:
        for current in post_order([node], lambda current: current.srcs):
            if current not in STATIC:
                STATIC[current] = is_static(current, [STATIC[source] for source in current.srcs])
        known = STATIC[node]
    return known


def _reshape_covering(node: Node, box: Region) -> Region:
    """The smallest box holding `box` that a reshape maps exactly from a box of its source: per group of axes the
    reshape splits or merges, the box's ranges where they come from one source box of the same size, else whole."""
    source_shape = node.srcs[0].shape
    ranges: list[Range] = []
    for source_axes, axes in reshape_groups(source_shape, node.shape):
        group_shape = tuple(node.shape[axis] for axis in axes)
        group = Region._of(group_shape, [box.ranges[axis] for axis in axes])
        back = group.reshaped(tuple(source_shape[axis] for axis in source_axes))
        exact = back.size == group.size and back.reshaped(group_shape) == group
        ranges.extend(group.ranges if exact else [(0, size) for size in group_shape])
    return Region._of(node.shape, ranges)


def _device_below(node: Node) -> str | None:
    """The device of the first source down the first-source chain that has one (a constant made for a box lies
    where the values it stands for would be computed)."""
    while node.device is None and node.srcs:
        node = node.srcs[0]
    return node.device


def _box_shape(box: Region) -> tuple[int, ...]:
    return tuple(end - start for start, end in box.ranges)


def _shrink(node: Node, box: Region) -> Node:
    if box.is_whole:
        return node
    return _make(Op.SHRINK, (node,), box.ranges)


def _make(op: Op, sources: tuple[Node, ...], arg: Any, device: str | None = None) -> Node:
    shape, dtype = infer(op, sources, arg)
    return Node(op, sources, arg, shape, dtype, device)


def _present(sources: list[Node | None]) -> list[Node]:
    assert all(source is not None for source in sources), sources
    return [source for source in sources if source is not None]
