"""Schedules cached by graph structure: a graph shaped like one seen before reuses its fusion decisions and
compiled kernels, so a training loop does not re-fuse, re-lower or re-hash kernels every step."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

from ember.core.graph import Node
from ember.core.ops import Op
from ember.ir.kernel import Kernel
from ember.scheduler.kernelize import CopyItem, kernelize
from ember.scheduler.placement import place_graph

MAX_CACHED_SCHEDULES = 4096
BUFFER, CONST = Op.BUFFER, Op.CONST


class CachedKernel(NamedTuple):
    """Run the kernel for node `output` with the buffers of nodes `inputs` (positions in the placed graph's nodes)."""

    output: int
    inputs: tuple[int, ...]
    kernel: Kernel


class CachedCopy(NamedTuple):
    output: int
    source: int


class Schedule(list):  # list[CachedKernel | CachedCopy]
    """A cached schedule: its items in order, and what every realize of it would otherwise work out again: the node
    positions the items use (`used`), the item of each one's last use (`last_use`), the positions whose last use is
    each item (`releases`), the stamp of the compile cache its kernels were compiled ahead for (`compiled_stamp`,
    set by realize), the devices its items write (`device_names`, set by realize at the first run) and its launch
    plan (`launch_plan`, launch_plan.py, made by realize once its kernels are compiled)."""

    def __init__(self, items: list[CachedKernel | CachedCopy]) -> None:
        super().__init__(items)
        last_use: dict[int, int] = {}
        for position, item in enumerate(items):
            for index in (item.output, item.source) if isinstance(item, CachedCopy) else (item.output, *item.inputs):
                last_use[index] = position
        self.used = tuple(last_use)
        self.last_use = last_use
        releases: list[list[int]] = [[] for _ in items]
        for index, position in last_use.items():
            releases[position].append(index)
        self.releases = [tuple(indices) for indices in releases]
        self.compiled_stamp: tuple[object, int] | None = None
        self.device_names: tuple[str | None, ...] | None = None  # the devices of the outputs, set by realize
        self.launch_plan: Any = None  # a launch_plan.LaunchPlan, set by realize
        self.budget_layout: Any = None  # memory_budget.py's view of the positions and its plans (set under a budget)


def graph_key(nodes: list[Node], roots: list[Node]) -> tuple:
    """A hashable description (structure, not data) of a placed graph: `nodes` in placement.place_graph's order,
    sources before their readers, and its `roots`. Reads the nodes and changes none of them.

    One entry per node, in order, written here only: a realized node is a leaf described by (shape, dtype, device);
    any other by (op, arg, shape, dtype, device, its sources' positions), a float constant's arg by its bits where
    equality is not (0.0 and -0.0 compare equal, NaN unequal). A node used twice appears once, so sharing is part of
    the structure. A node not placed, or read before it is listed, is refused (ValueError)."""
    index_of: dict[Node, int] = {}  # (nodes hash by identity)
    position_of = index_of.__getitem__
    entries: list[tuple] = []
    append = entries.append
    try:
        for node in nodes:
            index_of[node] = len(entries)
            op = node.op
            if op is BUFFER:
                append((node.shape, node.dtype, node.device))
                continue
            device = node.device
            if device is None:
                raise ValueError(f"graph_key: {node} is not placed (placement.place_graph places a graph)")
            arg = node.arg
            if op is CONST and isinstance(arg, float) and (arg != arg or arg == 0.0):
                arg = arg.hex()
            append((op, arg, node.shape, node.dtype, device, tuple(map(position_of, node.srcs))))
        if len(roots) == 1:  # (the per-op path)
            return (tuple(entries), (index_of[roots[0]],))
        return (tuple(entries), tuple(map(position_of, roots)))
    except KeyError as error:
        raise ValueError(f"graph_key: {error.args[0]} is read before it is listed (the nodes must be in "
                         "placement.place_graph's order, every root among them)") from None


def kernel_buffer_limit(device: str) -> int:
    """The most buffers one kernel on `device` may bind (its DeviceInfo.max_kernel_buffers)."""
    from ember.backends.registry import REGISTRY

    return REGISTRY.device(device).info.max_kernel_buffers


class ScheduleCache:
    """Signature -> schedule (kernels and copies by node position), least recently used entries dropped."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple, Schedule] = OrderedDict()
        self.hits = 0
        self.misses = 0  # kernelize calls
        # schedules of a loaded plan (plan/planner.py) by signature digest, consulted before kernelizing
        self.planned: dict[str, list[CachedKernel | CachedCopy]] = {}
        self.planned_hits = 0
        self.last_key: tuple | None = None  # the signature of the last graph scheduled (for traces)
        self.plans_stamp: tuple[object, int] | None = None  # the compile cache stamp the launch plans were made at

    def schedule(self, roots: list[Node]) -> tuple[Schedule, list[Node]]:
        """The schedule of the graph under `roots` and the graph's nodes (the positions its items name): the
        placement pass places the graph, then its key (pure) finds a cached schedule, a loaded plan's, or a new one."""
        nodes = place_graph(roots)
        key = graph_key(nodes, roots)
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
        items: list[CachedKernel | CachedCopy] = []
        for item in kernelize(roots, kernel_buffer_limit):
            if isinstance(item, CopyItem):
                items.append(CachedCopy(position[id(item.output)], position[id(item.source)]))
            else:
                items.append(CachedKernel(position[id(item.output)], tuple(position[id(n)] for n in item.inputs),
                                          item.kernel))
        return self._enter(key, items), nodes

    def drop_stale_plans(self, stamp: tuple[object, int]) -> None:
        """Forget every schedule's launch plan once the compile cache's stamp has changed (a program left it or
        was replaced): a plan holds its programs, which would otherwise outlive their eviction."""
        if stamp != self.plans_stamp:
            for cached in self.entries.values():
                cached.launch_plan = None
            self.plans_stamp = stamp

    def _enter(self, key: tuple, items: list[CachedKernel | CachedCopy]) -> Schedule:
        schedule = self.entries[key] = Schedule(items)
        if len(self.entries) > MAX_CACHED_SCHEDULES:
            self.entries.popitem(last=False)
        return schedule

    def _from_plan(self, key: tuple) -> Schedule | None:
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
