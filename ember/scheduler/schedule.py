"""Schedules cached by graph structure: a graph shaped like one seen before reuses its fusion decisions and
compiled kernels, so a training loop does not re-fuse, re-lower or re-hash kernels every step. A new structure is
rewritten (graph_rewrite.py: exact identities, constant folding, shared subexpressions) before it is kernelized,
its program still by the original graph's positions."""

from __future__ import annotations

from ember.settings import CONFIG
from ember.core.graph import Node
from ember.core.ops import Op
from ember.scheduler.graph_rewrite import rewrite_graph
from ember.scheduler.kernelize import ScheduleItem, kernelize
from ember.scheduler.placement import place_graph
from ember.scheduler.profile import debug_level, debug_print
from ember.scheduler.program import CommandProgram, Copy, Launch

MAX_CACHED_SCHEDULES = 4096
BUFFER, CONST = Op.BUFFER, Op.CONST


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
            sources = node.srcs
            count = len(sources)  # (one or two sources without map's iterator: most nodes)
            positions = (() if count == 0 else (index_of[sources[0]],) if count == 1 else
                         (index_of[sources[0]], index_of[sources[1]]) if count == 2 else
                         tuple(map(position_of, sources)))
            append((op, arg, node.shape, node.dtype, device, positions))
        if len(roots) == 1:  # (the per-op path)
            return (tuple(entries), (index_of[roots[0]],))
        return (tuple(entries), tuple(map(position_of, roots)))
    except KeyError as error:
        raise ValueError(f"graph_key: {error.args[0]} is read before it is listed (the nodes must be in "
                         "placement.place_graph's order, every root among them)") from None


def _numbered(items: list[ScheduleItem], slots: dict[int, int]) -> list[Launch | Copy] | None:
    """kernelize's steps with their nodes renumbered to slots (by node id), or None where a node has none."""
    steps: list[Launch | Copy] = []
    try:
        for step in items:
            if isinstance(step, Copy):
                steps.append(Copy(slots[id(step.output)], slots[id(step.source)]))
            else:
                inputs = tuple(slots[id(node)] for node in step.inputs)
                steps.append(Launch(slots[id(step.output)], inputs, step.kernel))
    except KeyError:
        return None
    return steps


def kernel_buffer_limit(device: str) -> int:
    """The most buffers one kernel on `device` may bind (its DeviceInfo.max_kernel_buffers)."""
    from ember.backends.registry import REGISTRY

    return REGISTRY.device(device).info.max_kernel_buffers


class ScheduleCache:
    """Graph key -> command program (kernel and copy steps by node position), the least recently used eighth of
    the entries dropped when there are too many. A hit looks the key up once: a key is a tuple of one entry per
    node, which Python hashes and compares anew at every lookup (a 6,000-node LSTM step's: ~0.3 ms each), so
    recency is a counter stamped on the program (`last_used`), not an OrderedDict's move_to_end (a second lookup)."""

    def __init__(self) -> None:
        self.entries: dict[tuple, CommandProgram] = {}
        self.clock = 0  # lookups so far: the recency stamped on the program found
        self.hits = 0
        self.misses = 0  # kernelize calls
        # programs of a loaded plan (plan/planner.py) by key digest, consulted before kernelizing
        self.planned: dict[str, list[Launch | Copy]] = {}
        self.planned_hits = 0
        self.last_key: tuple | None = None  # the key of the last graph scheduled (for traces)
        self.plans_stamp: tuple[object, int] | None = None  # the compile cache stamp the launch plans were made at
        self.rewrites = CONFIG.rewrites  # whether the cached programs were made from rewritten graphs
        self.rewritten = 0  # misses whose program was made from a rewritten graph (graph_rewrite.py)
        self.rules_fired: dict[str, int] = {}  # graph rule name -> times it fired in those

    def schedule(self, roots: list[Node]) -> tuple[CommandProgram, list[Node]]:
        """The command program of the graph under `roots` and the graph's nodes, whose positions are the program's
        slots: the placement pass places the graph, then its key (pure) finds a cached program, a loaded plan's, or a
        new one."""
        if CONFIG.rewrites is not self.rewrites:  # (turned on or off: programs made the other way are dropped)
            self.entries.clear()
            self.rewrites = CONFIG.rewrites
        nodes = place_graph(roots)
        key = graph_key(nodes, roots)
        self.last_key = key
        cached = self.entries.get(key)
        if cached is not None:
            self.hits += 1
            self.clock += 1
            cached.last_used = self.clock
            return cached, nodes
        if self.planned:
            planned = self._from_plan(key)
            if planned is not None:
                return planned, nodes
        self.misses += 1
        steps = self._rewritten_steps(nodes, roots) if CONFIG.rewrites else None
        if steps is None:
            position = {id(node): index for index, node in enumerate(nodes)}
            steps = _numbered(kernelize(roots, kernel_buffer_limit), position)
            assert steps is not None, "every node kernelize stores is in the placed graph"
        return self._enter(key, steps), nodes

    def _rewritten_steps(self, nodes: list[Node], roots: list[Node]) -> list[Launch | Copy] | None:
        """The steps of the graph rewritten (graph_rewrite.py), by position in `nodes`; None where no rule changes
        it or the rewritten graph would store a node that has no position (then the original graph is kernelized)."""
        rewritten = rewrite_graph(nodes, roots)
        if rewritten is None:
            return None
        steps = _numbered(kernelize(rewritten.roots, kernel_buffer_limit), rewritten.slots)
        if steps is not None:
            self.rewritten += 1
            for name, count in rewritten.fired.items():
                self.rules_fired[name] = self.rules_fired.get(name, 0) + count
            if debug_level() >= 1:
                fired = "; ".join(f"{name}: {count}" for name, count in rewritten.fired.items())
                debug_print(1, f"graph rewrites: {fired}")
        return steps

    def drop_stale_plans(self, stamp: tuple[object, int]) -> None:
        """Forget every schedule's launch plan once the compile cache's stamp has changed (a program left it or
        was replaced): a plan holds its programs, which would otherwise outlive their eviction."""
        if stamp != self.plans_stamp:
            for cached in self.entries.values():
                cached.launch_plan = None
                if cached.parallel is not None:  # (its graph-parallel form's plan, parallel.py)
                    cached.parallel[0].launch_plan = None
            self.plans_stamp = stamp

    def _enter(self, key: tuple, items: list[Launch | Copy]) -> CommandProgram:
        schedule = self.entries[key] = CommandProgram(items)
        self.clock += 1
        schedule.last_used = self.clock
        if len(self.entries) > MAX_CACHED_SCHEDULES:
            by_use = sorted(self.entries.items(), key=lambda item: item[1].last_used)
            for old_key, _ in by_use[:MAX_CACHED_SCHEDULES // 8]:
                del self.entries[old_key]
        return schedule

    def _from_plan(self, key: tuple) -> CommandProgram | None:
        """The loaded plan's program of this key (entered in the cache), or None."""
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
