"""Schedules cached by graph structure: a graph shaped like one seen before reuses its fusion decisions and
compiled kernels, so a training loop does not re-fuse, re-lower or re-hash kernels every step."""

from __future__ import annotations

from collections import OrderedDict

from ember.core.graph import Node
from ember.core.ops import Op
from ember.scheduler.kernelize import CopyItem, kernelize
from ember.scheduler.placement import place_node
from ember.scheduler.program import CommandProgram, Copy, Launch

MAX_CACHED_SCHEDULES = 4096


def signature(roots: list[Node]) -> tuple[tuple, list[Node]]:
    """A hashable description of the graph under `roots` (structure, not data) and its nodes in that order, after
    placing every node on its device (the placement pass runs in this walk: `placement.place_node`, sources first).

    Realized nodes are leaves described by shape, dtype and device only; a node used twice appears once, so
    sharing is part of the structure."""
    if len(roots) == 1:
        single = _single_op_signature(roots[0])
        if single is not None:
            return single
    return _walked_signature(roots)


def _single_op_signature(root: Node) -> tuple[tuple, list[Node]] | None:
    """The signature of one op whose sources are leaves on its device (the per-op path: an op on realized tensors
    and constants), the same as the walk's, without the walk; None for any other graph (after placing the op)."""
    sources = root.srcs
    if not sources:
        return None
    for source in sources:
        if source.srcs:
            return None
    if place_node(root):  # sources brought from other devices: the walk indexes the new nodes
        return None
    index_of: dict[Node, int] = {}
    nodes: list[Node] = []
    entries: list[tuple] = []
    for source in sources[::-1]:  # (the walk's stack takes the last source first)
        if source not in index_of:
            index_of[source] = len(nodes)
            nodes.append(source)
            if source.op is Op.BUFFER:
                entries.append((source.shape, source.dtype, source.device))
            else:
                entries.append(_entry(source, index_of))
    nodes.append(root)
    # (a node with sources is no constant: its arg is as the walk writes it)
    entries.append((root.op, root.arg, root.shape, root.dtype, root.device, tuple(map(index_of.__getitem__, sources))))
    return (tuple(entries), (len(entries) - 1,)), nodes


def _walked_signature(roots: list[Node]) -> tuple[tuple, list[Node]]:
    """`signature` of any graph, by a walk from the roots."""
    index_of: dict[Node, int] = {}  # (nodes hash by identity)
    nodes: list[Node] = []
    entries: list[tuple] = []
    buffer_op, const_op = Op.BUFFER, Op.CONST
    position_of = index_of.__getitem__

    # a post-order walk written out (this runs at every realize): a node stays on the stack until its sources are
    # indexed, then is placed and indexed itself (a realized node has no sources)
    stack = roots[::-1]
    while stack:
        node = stack[-1]
        if node in index_of:
            stack.pop()
            continue
        sources = node.srcs
        if sources:
            waiting = False
            for source in sources:
                if source not in index_of:
                    stack.append(source)
                    waiting = True
            if waiting:
                continue
            moved = place_node(node)  # COPY nodes (or constants made again) bringing sources to its device
            if moved:
                for extra in moved:  # a leaf recreated on the device, or a COPY of an indexed source
                    index_of[extra] = len(nodes)
                    nodes.append(extra)
                    entries.append(_entry(extra, index_of))
                sources = node.srcs
        stack.pop()
        index_of[node] = len(nodes)
        nodes.append(node)
        op = node.op
        if op is buffer_op:
            entries.append((node.shape, node.dtype, node.device))
            continue
        arg = node.arg
        if op is const_op and isinstance(arg, float) and (arg != arg or arg == 0.0):
            arg = arg.hex()  # (see _entry)
        entries.append((op, arg, node.shape, node.dtype, node.device, tuple(map(position_of, sources))))
    key = (tuple(entries), tuple(map(position_of, roots)))
    return key, nodes


def _entry(node: Node, index_of: dict[Node, int]) -> tuple:
    """The signature's entry of one node whose sources are indexed (what the walk in `signature` writes inline)."""
    if node.op is Op.BUFFER:
        return (node.shape, node.dtype, node.device)
    arg = node.arg
    if node.op is Op.CONST and isinstance(arg, float) and (arg != arg or arg == 0.0):
        arg = arg.hex()  # a constant by its bits where equality is not (0.0 and -0.0 compare equal, NaN unequal)
    return (node.op, arg, node.shape, node.dtype, node.device, tuple(map(index_of.__getitem__, node.srcs)))


def kernel_buffer_limit(device: str) -> int:
    """The most buffers one kernel on `device` may bind (its DeviceInfo.max_kernel_buffers)."""
    from ember.backends.registry import REGISTRY

    return REGISTRY.device(device).info.max_kernel_buffers


class ScheduleCache:
    """Signature -> command program (kernel and copy steps by node position), least recently used entries
    dropped."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple, CommandProgram] = OrderedDict()
        self.hits = 0
        self.misses = 0  # kernelize calls
        # schedules of a loaded plan (plan/planner.py) by signature digest, consulted before kernelizing
        self.planned: dict[str, list[Launch | Copy]] = {}
        self.planned_hits = 0
        self.last_key: tuple | None = None  # the signature of the last graph scheduled (for traces)
        self.plans_stamp: tuple[object, int] | None = None  # the compile cache stamp the launch plans were made at

    def schedule(self, roots: list[Node]) -> tuple[CommandProgram, list[Node]]:
        """The command program of the graph under `roots` (cached by its signature) and the graph's nodes, whose
        positions are the program's slots."""
        key, nodes = signature(roots)
        self.last_key = key
        cached = self.entries.get(key)
        if cached is not None:
            self.hits += 1
            self.entries.move_to_end(key)
            return cached, nodes
        if self.planned:
            planned = self._from_plan(key)
            if planned is not None:
                return planned, nodes
        self.misses += 1
        position = {id(node): index for index, node in enumerate(nodes)}
        items: list[Launch | Copy] = []
        for item in kernelize(roots, kernel_buffer_limit):
            if isinstance(item, CopyItem):
                items.append(Copy(position[id(item.output)], position[id(item.source)]))
            else:
                items.append(Launch(position[id(item.output)], tuple(position[id(n)] for n in item.inputs),
                                        item.kernel))
        return self._enter(key, items), nodes

    def drop_stale_plans(self, stamp: tuple[object, int]) -> None:
        """Forget every schedule's launch plan once the compile cache's stamp has changed (a program left it or
        was replaced): a plan holds its programs, which would otherwise outlive their eviction."""
        if stamp != self.plans_stamp:
            for cached in self.entries.values():
                cached.launch_plan = None
            self.plans_stamp = stamp

    def _enter(self, key: tuple, items: list[Launch | Copy]) -> CommandProgram:
        schedule = self.entries[key] = CommandProgram(items)
        if len(self.entries) > MAX_CACHED_SCHEDULES:
            self.entries.popitem(last=False)
        return schedule

    def _from_plan(self, key: tuple) -> CommandProgram | None:
        """The loaded plan's schedule of this signature (entered in the cache), or None."""
        from ember.plan.kernel_codec import CodecError, signature_digest

        try:
            items = self.planned.get(signature_digest(key))
        except CodecError:
            return None
        if items is None:
            return None
        self.planned_hits += 1
        return self._enter(key, items)


SCHEDULES = ScheduleCache()
