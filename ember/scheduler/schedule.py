"""Schedules cached by graph structure: a graph shaped like one seen before reuses its fusion decisions and
compiled kernels, so a training loop does not re-fuse, re-lower or re-hash kernels every step."""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.walk import post_order
from ember.ir.kernel import Kernel
from ember.scheduler.kernelize import CopyItem, kernelize
from ember.scheduler.placement import place_node

MAX_CACHED_SCHEDULES = 4096


class CachedKernel(NamedTuple):
    """Run the kernel for node `output` with the buffers of nodes `inputs` (positions in the signature's list)."""

    output: int
    inputs: tuple[int, ...]
    kernel: Kernel


class CachedCopy(NamedTuple):
    output: int
    source: int


def signature(roots: list[Node]) -> tuple[tuple, list[Node]]:
    """A hashable description of the graph under `roots` (structure, not data) and its nodes in that order, after
    placing every node on its device (the placement pass runs in this walk: `placement.place_node`, sources first).

    Realized nodes are leaves described by shape, dtype and device only; a node used twice appears once, so
    sharing is part of the structure."""
    index_of: dict[int, int] = {}
    nodes: list[Node] = []
    entries: list[tuple] = []

    def add(node: Node) -> None:
        index_of[id(node)] = len(nodes)
        nodes.append(node)
        if node.op is Op.BUFFER:
            entries.append((node.shape, node.dtype, node.device))
            return
        arg = node.arg.hex() if node.op is Op.CONST and isinstance(node.arg, float) else node.arg
        entries.append((node.op, arg, node.shape, node.dtype, node.device,
                        tuple(index_of[id(source)] for source in node.srcs)))

    for node in post_order(roots, lambda node: node.srcs):  # a realized node (a BUFFER) has no sources
        if node.srcs:
            for moved in place_node(node):  # COPY nodes (or constants made again) bringing sources to its device
                add(moved)
        add(node)
    key = (tuple(entries), tuple(index_of[id(root)] for root in roots))
    return key, nodes


def kernel_buffer_limit(device: str) -> int:
    """The most buffers one kernel on `device` may bind (its DeviceInfo.max_kernel_buffers)."""
    from ember.backends.registry import REGISTRY

    return REGISTRY.device(device).info.max_kernel_buffers


class ScheduleCache:
    """Signature -> schedule (kernels and copies by node position), least recently used entries dropped."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple, list[CachedKernel | CachedCopy]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def schedule(self, roots: list[Node]) -> tuple[list[CachedKernel | CachedCopy], list[Node]]:
        key, nodes = signature(roots)
        cached = self.entries.get(key)
        if cached is not None:
            self.hits += 1
            self.entries.move_to_end(key)
            return cached, nodes
        self.misses += 1
        position = {id(node): index for index, node in enumerate(nodes)}
        items: list[CachedKernel | CachedCopy] = []
        for item in kernelize(roots, kernel_buffer_limit):
            if isinstance(item, CopyItem):
                items.append(CachedCopy(position[id(item.output)], position[id(item.source)]))
            else:
                items.append(CachedKernel(position[id(item.output)], tuple(position[id(n)] for n in item.inputs),
                                          item.kernel))
        self.entries[key] = items
        if len(self.entries) > MAX_CACHED_SCHEDULES:
            self.entries.popitem(last=False)
        return items, nodes


SCHEDULES = ScheduleCache()
