"""Schedules cached by graph structure: a graph shaped like one seen before reuses its fusion decisions and
compiled kernels, so a training loop does not re-fuse, re-lower or re-hash kernels every step. A new structure is
rewritten (graph_rewrite.py: exact identities, constant folding, shared subexpressions) before it is kernelized,
its program still by the original graph's positions. A graph holding TEMPLATE nodes (copies of graph templates, kept
collapsed: core/graph_templates.py) is keyed as it is and expanded only for a new structure; a node of a template's
graph that its program stores gets a slot after the graph's (`CommandProgram.extra_slots`), filled with a fresh
stand-in node at each run."""

from __future__ import annotations

from collections.abc import Callable

from ember.settings import CONFIG
from ember.core.graph import Node
from ember.core.graph_templates import Expanded, expand_graph
from ember.core.ops import Op
from ember.scheduler.graph_rewrite import Rewritten, rewrite_graph
from ember.scheduler.kernelize import ScheduleItem, kernelize
from ember.scheduler.placement import place_graph
from ember.scheduler.profile import debug_level, debug_print
from ember.scheduler.program import CommandProgram, Copy, Launch, step_slots

MAX_CACHED_SCHEDULES = 4096
BUFFER, CONST, TEMPLATE = Op.BUFFER, Op.CONST, Op.TEMPLATE
# a slot past the graph's (a stored node of a template's graph): (shape, dtype, device, and for a node of the copy of
# one of the graph's TEMPLATE nodes, (that node's graph position, the node's template position), else None)
ExtraSlot = tuple[tuple[int, ...], object, str, "tuple[int, int] | None"]


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


def _numbered(items: list[ScheduleItem], slot_of: Callable[[Node], int | None]) -> list[Launch | Copy] | None:
    """kernelize's steps with their nodes renumbered to slots (`slot_of`), or None where a node has none."""
    steps: list[Launch | Copy] = []
    for step in items:
        if isinstance(step, Copy):
            output, source = slot_of(step.output), slot_of(step.source)
            if output is None or source is None:
                return None
            steps.append(Copy(output, source))
        else:
            slots = [slot_of(node) for node in (step.output, *step.inputs)]
            if None in slots:
                return None
            steps.append(Launch(slots[0], tuple(slots[1:]), step.kernel))  # type: ignore[arg-type]
    return steps


class _TemplateSlots:
    """Slots of an expanded graph's nodes (schedule.ScheduleCache._template_steps): an original node's position for
    its image, else a new slot after the graph's (a node of a template's graph the program stores), one per node."""

    def __init__(self, nodes: list[Node], expanded: Expanded) -> None:
        self.base = len(nodes)
        image = expanded.image
        self.origin = {id(image[id(node)]): position for position, node in enumerate(nodes)}
        self.entries = expanded.entries
        self.template_positions = {id(node): position for position, node in enumerate(nodes) if node.op is TEMPLATE}
        self.extra: dict[int, int] = {}  # id of a stored node of a template's graph -> its slot
        self.extra_slots: list[ExtraSlot] = []
        self.held: list[Node] = []  # (the nodes numbered by id stay alive while this numbers)

    def __call__(self, node: Node) -> int:
        slot = self.origin.get(id(node))
        if slot is None:
            slot = self.extra.get(id(node))
            if slot is None:
                assert node.device is not None, "the expanded graph is placed"
                slot = self.extra[id(node)] = self.base + len(self.extra_slots)
                entry = self.entries.get(id(node))
                link = None if entry is None else (self.template_positions[id(entry[0])], entry[1])
                self.extra_slots.append((node.shape, node.dtype, node.device, link))
                self.held.append(node)
        return slot


def _read_links(nodes: list[Node], extra_slots: list[ExtraSlot]) -> tuple[ExtraSlot, ...]:
    """The extra slots with a link kept only where the copy's results read the stored value (Template.read_values):
    a value read only by other stored nodes of the copy is not kept for it after the run."""
    positions: dict[int, list[int]] = {}  # graph position of a TEMPLATE node -> the template positions stored
    for *_, link in extra_slots:
        if link is not None:
            positions.setdefault(link[0], []).append(link[1])
    read = {graph_position: nodes[graph_position].arg.template.read_values(tuple(sorted(stored)))
            for graph_position, stored in positions.items()}
    return tuple((shape, dtype, device, link if link is not None and link[1] in read[link[0]] else None)
                 for shape, dtype, device, link in extra_slots)


def with_extra_slots(nodes: list[Node], extra_slots: tuple[ExtraSlot, ...]) -> list[Node]:
    """The table of a program whose template nodes' stored values have slots of their own: `nodes`, then per extra
    slot the node that becomes its buffer at its step: a result of a copy with several results that is alive
    outside this graph (the saved statistics of a normalization whose output is realized: a copy node for node
    stored them in its own nodes, so the backward pass reads them instead of computing them again), else a fresh
    stand-in."""
    table = list(nodes)
    for shape, dtype, device, link in extra_slots:
        node = None
        if link is not None:
            member = nodes[link[0]]
            siblings = member.siblings if member.op is TEMPLATE else None
            reference = None if siblings is None else siblings.get(link[1])
            node = None if reference is None else reference()
            if node is not None and (node.op is not TEMPLATE or node.srcs is not member.srcs):
                node = None  # (realized meanwhile, or its sources moved by placement: not this copy's any more)
            elif node is not None and node.device is None:
                node.device = device  # (not placed yet: its sources, the member's, decide the member's device)
        table.append(node if node is not None else
                     Node(Op.CONTIGUOUS, (), None, shape, dtype, device))  # type: ignore[arg-type]
    return table


def stored_template_values(program: CommandProgram, table: list[Node]) -> list[tuple[Node, int, Node]]:
    """Before a run of a program storing nodes of copies (`with_extra_slots`'s table): (TEMPLATE node, template
    position, the node its extra slot computes) for each, for graph_templates.keep_for_copies."""
    base = len(table) - len(program.extra_slots)
    kept = []
    for index, (_, _, _, link) in enumerate(program.extra_slots):
        if link is not None:
            member = table[link[0]]
            if member.op is TEMPLATE:
                kept.append((member, link[1], table[base + index]))
    return kept


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
        self.planned_extra_slots: dict[str, tuple[ExtraSlot, ...]] = {}  # (a plan's programs' slots past the graph)
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
            return cached, (nodes if not cached.extra_slots else with_extra_slots(nodes, cached.extra_slots))
        if self.planned:
            planned = self._from_plan(key, len(nodes))
            if planned is not None:
                return planned, (nodes if not planned.extra_slots else with_extra_slots(nodes, planned.extra_slots))
        self.misses += 1
        for node in nodes:
            if node.op is TEMPLATE:
                program = self._template_steps(key, nodes, roots)
                return program, with_extra_slots(nodes, program.extra_slots)
        steps = self._rewritten_steps(nodes, roots) if CONFIG.rewrites else None
        if steps is None:
            position = {id(node): index for index, node in enumerate(nodes)}
            steps = _numbered(kernelize(roots, kernel_buffer_limit), lambda node: position.get(id(node)))
            assert steps is not None, "every node kernelize stores is in the placed graph"
        return self._enter(key, steps), nodes

    def _template_steps(self, key: tuple, nodes: list[Node], roots: list[Node]) -> CommandProgram:
        """The program of a graph holding TEMPLATE nodes: kernelized (rewritten first, as any graph) with every
        template expanded into its primitive nodes, by the positions of `nodes` and extra slots after them."""
        expanded = expand_graph(nodes, roots)
        expanded_roots = expanded.roots
        graph = place_graph(expanded_roots)  # (places the nodes the templates' graphs made)
        slots = _TemplateSlots(nodes, expanded)
        steps = None
        if CONFIG.rewrites:
            rewritten = rewrite_graph(graph, expanded_roots)
            if rewritten is not None:  # a rewritten node is written into its original's slot, else a slot of its own
                def slot_of(node: Node) -> int:
                    position = rewritten.slots.get(id(node))  # type: ignore[union-attr]
                    return slots(node if position is None else graph[position])

                steps = _numbered(kernelize(rewritten.roots, kernel_buffer_limit), slot_of)
                self._count_rewrites(rewritten)
        if steps is None:
            steps = _numbered(kernelize(expanded_roots, kernel_buffer_limit), slots)
        assert steps is not None, "every node a template graph's program stores has a slot"
        program = self._enter(key, steps)
        program.extra_slots = _read_links(nodes, slots.extra_slots)
        return program

    def _rewritten_steps(self, nodes: list[Node], roots: list[Node]) -> list[Launch | Copy] | None:
        """The steps of the graph rewritten (graph_rewrite.py), by position in `nodes`; None where no rule changes
        it or the rewritten graph would store a node that has no position (then the original graph is kernelized)."""
        rewritten = rewrite_graph(nodes, roots)
        if rewritten is None:
            return None
        steps = _numbered(kernelize(rewritten.roots, kernel_buffer_limit), lambda node: rewritten.slots.get(id(node)))
        if steps is not None:
            self._count_rewrites(rewritten)
        return steps

    def _count_rewrites(self, rewritten: Rewritten) -> None:
        """Count a program made from a rewritten graph and the rules that fired (printed at EMBER_DEBUG=1)."""
        self.rewritten += 1
        for name, count in rewritten.fired.items():
            self.rules_fired[name] = self.rules_fired.get(name, 0) + count
        if debug_level() >= 1:
            fired = "; ".join(f"{name}: {count}" for name, count in rewritten.fired.items())
            debug_print(1, f"graph rewrites: {fired}")

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

    def _from_plan(self, key: tuple, graph_size: int) -> CommandProgram | None:
        """The loaded plan's program of this key (entered in the cache), or None (also where its steps use a slot
        past the graph's and its extra slots: a plan that did not record them)."""
        from ember.plan.kernel_codec import CodecError, signature_digest

        try:
            digest = signature_digest(key)
        except CodecError:
            return None
        items = self.planned.get(digest)
        extra_slots = self.planned_extra_slots.get(digest, ())
        if items is None or any(max(step_slots(item)) >= graph_size + len(extra_slots) for item in items):
            return None
        self.planned_hits += 1
        program = self._enter(key, items)
        program.extra_slots = extra_slots
        return program


SCHEDULES = ScheduleCache()
