"""The incremental runner: realize a graph once keeping every value the kernelizer stores, then after edits of
regions of its inputs recompute only the dirty elements that are needed, written into the kept buffers in place."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ember.context import CONTEXT, update
from ember.core import runtime
from ember.core.errors import ArgumentError, ShapeError
from ember.core.creation import tensor as tensor_of
from ember.core.graph import Node
from ember.core.indexing import broadcast_value
from ember.core.ops import Op
from ember.core.tensor import Tensor
from ember.core.graph_templates import expand_in_place
from ember.core.walk import post_order
from ember.incremental import affine, write
from ember.incremental.families import Description, Families, Family, describe, instantiate, over_values
from ember.incremental.position_replay import PositionReplay, certified_interval
from ember.incremental.propagate import Boxes, _narrow, propagate_boxes, union
from ember.incremental.region import Region
from ember.incremental.restrict import restrict, source_boxes
from ember.incremental.static_bounds import is_static
from ember.incremental.write import aligned_box, write_box
from ember.scheduler import profile, shape_classes
from ember.scheduler.buffers import Buffer, buffer_of
from ember.scheduler.kernelize import find_boundaries, kernelize
from ember.scheduler.lock import SCHEDULER_LOCK
from ember.capture.recording import Recorder
from ember.scheduler.executor import BoundLaunch, JoinedLaunches, execute
from ember.scheduler.launch_plan import bind_buffers
from ember.scheduler.program import CommandProgram, Launch, LaunchBinding

LEAF_OPS = (Op.BUFFER, Op.CONST, Op.ARANGE)
MAX_CACHED = 256  # plans and restricted graphs kept (per graph) before the caches start over
RECORDED_POSITIONS = 3  # positions of a family recorded before its replay at any position is made
GRAPH_NUMBERS = itertools.count()
MAX_RECORDED_POSITIONS = 8  # positions recorded at most, while the last three's launches still differ

Plan = tuple[list[tuple[Node, Region]], dict[Node, "Boxes"]]


@dataclass
class Replay:
    """The commands one plan's recompute launched, by buffer slot, to run again while the buffers they wrote and
    read are the same: the kept values' buffers (written in place) must be those recorded; an input's slot takes
    the input's buffer of the moment; the restricted graphs' temporaries are the replay's own."""

    program: CommandProgram
    bindings: list[LaunchBinding | None]  # per command
    buffers: list[Buffer | None]  # by slot; None for an input's slot
    input_slots: list[tuple[Node, int]]  # (input leaf, slot)
    value_buffers: list[Buffer]  # the kept values' buffers when recorded, in `kept` order
    bound: list[BoundLaunch | JoinedLaunches | None]


class IncrementalGraph:
    """`outputs` computed from `inputs`, recomputed incrementally (internal API).

    The first run realizes every node the kernelizer stores for `outputs` (kernel outputs: the key and value
    projections of an attention are kept, a KV cache nobody wrote) and keeps their buffers. After the caller wrote
    new values into regions of some inputs (`tensor[index] = value`, `assign`), `update({input: region})`
    propagates the dirty boxes through the graph, works out backwards which of them are needed (a causal mask
    needs no later column: those elements stay stale, remembered as invalid and recomputed once needed), and
    recomputes each needed box of each kept value, sources first, by a restricted graph written into that box of
    its buffer. `outputs` then holds the values a full recompute would give. The launches of a plan's second run
    are recorded; later updates with the same plan (the same edited regions: a token rewritten, a row edited
    again) replay them with no graph, schedule or allocation (`replayed` counts those). `last_flops` / `full_flops`
    count the arithmetic of the kernels launched (elementwise ops and reduce inputs, per element) when
    `count_flops`."""

    def __init__(self, outputs: Sequence[Tensor], inputs: Sequence[Tensor], count_flops: bool = False) -> None:
        for tensor in inputs:
            tensor.realize()
        self.count_flops = count_flops
        self.number = next(GRAPH_NUMBERS)  # (its kernels' shape-class scopes: ids are reused once a graph is gone)
        # an output that is already a value (an input itself) is copied, so that it is a value of its own
        roots = [Node(Op.CONTIGUOUS, (tensor.node,), None, tensor.shape, tensor.dtype) if tensor.node.realized
                 else tensor.node for tensor in outputs]
        expand_in_place(roots)  # (regions propagate through primitive ops: templates' copies are expanded)
        self.full_flops = kernel_flops(roots) if count_flops else 0
        self.last_flops = 0
        kept = [node for node in find_boundaries(roots) if not node.realized]
        template: dict[int, Node] = {}
        for node in post_order(roots, lambda node: node.srcs):
            if node.op in LEAF_OPS:
                template[id(node)] = node
            else:
                sources = tuple(template[id(source)] for source in node.srcs)
                template[id(node)] = Node(node.op, sources, node.arg, node.shape, node.dtype,
                                          node.device if node.op is Op.COPY else None)
        runtime.RUNTIME.realize(kept)
        self.roots = [template[id(node)] for node in roots]
        self.values: dict[Node, Tensor] = {template[id(node)]: Tensor._from_node(node) for node in kept}
        self.outputs = [self.values[root] for root in self.roots]
        self.inputs: dict[int, tuple[Node, Tensor]] = {id(tensor): (tensor.node, tensor) for tensor in inputs}
        self.leaf_inputs: dict[Node, Tensor] = {leaf: tensor for leaf, tensor in self.inputs.values()}
        self.order = post_order(self.roots, lambda node: node.srcs)
        self.root_nodes = set(self.roots)
        self.static: dict[Node, bool] = {}
        for node in self.order:
            self.static[node] = is_static(node, [self.static[source] for source in node.srcs])
        self.invalid: dict[Node, Boxes] = {}
        self.kept = [node for node in self.order if node in self.values]
        self.stops: set[Node] = set(self.values) | set(self.leaf_inputs)
        self.plans: dict[Any, Plan] = {}
        self.replays: dict[Any, Replay] = {}
        self.replayed = 0  # updates that ran a recorded recompute
        self.families = Families()
        self.previous: Description | None = None  # the last update's inputs
        self.planned = 0  # updates whose plan was worked out (not one seen before, nor a family's)
        self.from_family = 0  # updates whose plan was a family's, at a new position
        self.restricts = 0  # restricted graphs built (a family's are built once for all its positions)
        self.restricted: dict[tuple[Node, Region], tuple[Node, int | None]] = {}  # (graph, t where affine)
        self.family_at: tuple[Family, int] | None = None  # the family the last new plan came from, and its t
        # per family (by id, with the family held): its replay at any position, the recordings (t, Replay) it is
        # made from, or None where it cannot be made (position_replay.py)
        self.position_replays: dict[int, tuple[Family, PositionReplay | list[tuple[int, Replay]] | None]] = {}
        self.position_replayed = 0  # updates at a new position run by a family's replay (no graph built)

    def write(self, tensor: Tensor, index: Any, value: Any) -> Region:
        """`tensor[index] = value` for one of the inputs, written in place: one kernel stores the value into the
        indexed box of the input's buffer (write.write_box), where setitem's select reads and writes every element
        of it (a decode step's row of a 512 x 512 buffer: 0.06 against 0.5 ms). Returns the box, for `update`. The
        index is basic (ints and slices of step 1); the value broadcasts to the indexed shape, as in setitem."""
        if id(tensor) not in self.inputs:
            raise ArgumentError(f"IncrementalGraph.write: the {tensor.shape} tensor is not one of the inputs given")
        region = Region.from_index(tensor.shape, index)
        if region.is_empty:
            return region
        shape = tuple(end - start for start, end in region.ranges)
        source = value.to(tensor.device) if isinstance(value, Tensor) else tensor_of(value, device=tensor.device)
        indexed = tensor[index].shape  # (the shape setitem would broadcast the value to)
        source = broadcast_value(source.cast(tensor.dtype), indexed).reshape(shape)
        with shape_classes.by_class((self.number, "write")):  # (where the box is a select: its offsets at launch)
            tensor.realize()
            write_box(tensor, region, source.node)
        return region

    def update(self, changed: Mapping[Tensor, Region], needed: Sequence[Region | None] | None = None) -> list[Tensor]:
        """Recompute after the given regions of inputs changed; returns `outputs`. `needed` (one region or None per
        output: the whole) limits what must be right afterwards: the rest of an output may be stale (it is
        recomputed by a later update that needs it)."""
        leaf_changes: dict[Node, Region] = {}
        for tensor, region in changed.items():
            if id(tensor) not in self.inputs:
                raise ArgumentError(f"IncrementalGraph.update: {tensor.shape} tensor is not one of the inputs given")
            leaf, _ = self.inputs[id(tensor)]
            if region.shape != leaf.shape or tensor.shape != leaf.shape or tensor.dtype != leaf.dtype:
                raise ShapeError(f"IncrementalGraph.update: a region of shape {region.shape} for an input of shape "
                                 f"{leaf.shape}; the input must keep its shape and dtype")
            with shape_classes.by_class():  # (the edit, `x[position] = token` not yet realized, by class too)
                tensor.realize()
            leaf_changes[leaf] = region
        if needed is not None and len(needed) != len(self.roots):
            raise ArgumentError(f"IncrementalGraph.update: {len(needed)} needed regions for {len(self.roots)} outputs")
        wanted: list[Region] = []
        for index, root in enumerate(self.roots):
            given = None if needed is None else needed[index]
            wanted.append(Region.whole(root.shape) if given is None else given)
        key = (tuple((id(leaf), region) for leaf, region in leaf_changes.items()), tuple(wanted),
               tuple((index, self.invalid[node]) for index, node in enumerate(self.kept) if self.invalid.get(node)))
        plan = self.plans.get(key)
        seen_before = plan is not None
        if plan is None:
            plan = self._new_plan(leaf_changes, wanted)
            if len(self.plans) >= MAX_CACHED:
                self.plans.clear()
                self.replays.clear()
                self.families.clear()
                self.position_replays.clear()
            self.plans[key] = plan
        recompute, self.invalid = plan
        self.last_flops = sum(kernel_flops([self._restricted(node, box)]) for node, box in recompute) \
            if self.count_flops else 0
        replay = self.replays.get(key)
        if CONTEXT.get().recorder is not None:  # inside an ember.jit capture, whose recorder takes the launches
            self._recompute(recompute)
        elif not seen_before:
            # a plan's first run (a decode step at a new position may never come again): its family's replay at
            # this position, or recorded towards one
            found, self.family_at = self.family_at, None
            if found is None or not self._at_new_position(recompute, *found):
                self._recompute(recompute)
        elif replay is not None and self._run_replay(replay):
            self.replayed += 1
        else:  # a plan that repeats: record it (the replay keeps its temporaries)
            replay = self._record(recompute)
            if replay is None:
                self.replays.pop(key, None)
            else:
                self.replays[key] = replay
        return self.outputs

    def _at_new_position(self, recompute: list[tuple[Node, Region]], family: Family, t: int) -> bool:
        """Run a new position's recompute through its family's replay, or record it towards one (the first
        RECORDED_POSITIONS positions of a family); False (nothing run) where neither applies."""
        entry = self.position_replays.get(id(family))
        if entry is None or entry[0] is not family:  # (an id reused by a family made after another was dropped)
            entry = self.position_replays[id(family)] = (family, [])
        state = entry[1]
        if isinstance(state, PositionReplay):
            if not self._inputs_realized() or self._values_moved(state.value_buffers):
                return False
            if state.run(t, lambda leaf: buffer_of(self.leaf_inputs[leaf].node)):
                self.position_replayed += 1
                return True
            return False
        if state is None:
            return False
        recorded = self._record(recompute)  # (runs it)
        if recorded is None:
            self.position_replays[id(family)] = (family, None)
            return True
        state.append((t, recorded))
        if len(state) < RECORDED_POSITIONS:
            return True
        if family.certified is None:
            family.certified = certified_interval(family.graphs, self.stops, self._current, family.low,
                                                  family.high) or ()
        replay = self._position_replay(family.certified, state[-RECORDED_POSITIONS:])
        if replay is not None or not family.certified or len(state) >= MAX_RECORDED_POSITIONS:
            if replay is None:
                profile.debug_print(1, "  incremental: no replay at new positions (the scheduler's decisions on "
                                       "the family's graphs hold at one position only, or its launches differ)")
            self.position_replays[id(family)] = (family, replay)
        else:  # (a kernel met at the first positions joined a shape class later: record the next ones)
            del state[:-RECORDED_POSITIONS + 1]
        return True

    @staticmethod
    def _position_replay(certified: tuple[int, ...], recordings: list[tuple[int, Replay]]) -> PositionReplay | None:
        """The replay at any position of the family's certified range made from these recordings, or None."""
        if not certified or any(
                any(now is not before for now, before in zip(replay.value_buffers, recordings[0][1].value_buffers))
                for _, replay in recordings):
            return None  # (no certified range, or a kept value moved between the recordings)
        low, high = certified
        replay = PositionReplay.make(recordings, low, high)
        if replay is not None:
            replay.value_buffers = recordings[0][1].value_buffers
        return replay

    def _recompute(self, recompute: list[tuple[Node, Region]]) -> None:
        """Build each box's restricted graph and write it into its kept value (graph, schedule, launches). The
        kernels compile by shape class: a box's offsets, and the length of a causal prefix it reads, are read at
        launch, so the same boxes at another position (the next decode step) launch the kernels compiled before."""
        for node, box in recompute:  # (each kept value's kernels classes of their own)
            with shape_classes.by_class((self.number, id(node))):
                write_box(self.values[node], box, self._restricted(node, box))

    def _record(self, recompute: list[tuple[Node, Region]]) -> Replay | None:
        """Recompute while recording the launches; the replay of them, or None when a later run could not repeat
        them as they are (a value moved to a new buffer, host data was uploaded, an input is not realized)."""
        if not self._inputs_realized():
            self._recompute(recompute)
            return None
        value_buffers = self._value_buffers()
        input_buffers = {id(buffer): leaf for leaf, buffer in self._input_buffers()}
        recorder = Recorder()
        before = update(recorder=recorder)  # (the calling thread's capture: ember/context.py)
        try:
            self._recompute(recompute)
        finally:
            update(recorder=before.recorder)
        program, bindings = recorder.program()
        if recorder.uploads or recorder.rebound or self._values_moved(value_buffers):
            return None
        buffers: list[Buffer | None] = list(recorder.buffers)
        input_slots = []
        for slot, buffer in enumerate(recorder.buffers):
            leaf = input_buffers.get(id(buffer))
            if leaf is not None:
                input_slots.append((leaf, slot))
                buffers[slot] = None
        with SCHEDULER_LOCK:
            bound = bind_buffers(program, bindings, buffers)
        return Replay(program, bindings, buffers, input_slots, value_buffers, bound)

    def _run_replay(self, replay: Replay) -> bool:
        """Run a recorded recompute again; False (nothing run) when a kept value is in another buffer now."""
        if not self._inputs_realized() or self._values_moved(replay.value_buffers):
            return False
        buffers = replay.buffers
        if replay.input_slots:
            buffers = list(buffers)
            for leaf, slot in replay.input_slots:
                buffers[slot] = buffer_of(self.leaf_inputs[leaf].node)
        with SCHEDULER_LOCK:  # (the pools and device queues are shared with other threads)
            execute(replay.program.commands, replay.bindings, buffers, bound=replay.bound)
        return True

    def _inputs_realized(self) -> bool:
        return all(tensor.node.realized for tensor in self.leaf_inputs.values())

    def _value_buffers(self) -> list[Buffer]:
        return [buffer_of(self.values[node].node) for node in self.kept]

    def _values_moved(self, value_buffers: list[Buffer]) -> bool:
        """Whether a kept value is in another buffer than in `value_buffers` (taken by _value_buffers earlier)."""
        return any(now is not before for now, before in zip(self._value_buffers(), value_buffers))

    def _input_buffers(self) -> list[tuple[Node, Buffer]]:
        return [(leaf, buffer_of(tensor.node)) for leaf, tensor in self.leaf_inputs.items()]

    def _new_plan(self, leaf_changes: dict[Node, Region], wanted: list[Region]) -> Plan:
        """The plan of an update not seen before: a family's at these inputs (a decode step at a new position), else
        worked out, over a range of positions where the inputs moved by a step from the last update's. A family's
        plan comes with the restricted graph of each box (entered in `self.restricted` with its t)."""
        self.family_at = None
        inputs = (leaf_changes, wanted, self.invalid)
        description = describe(inputs, self.kept, tuple(self._alignment(node) for node in self.kept))
        previous, self.previous = self.previous, description
        found = self.families.find(description)
        if found is not None:
            self.from_family += 1
        else:
            self.planned += 1
            try:
                found = self.families.make(inputs, description, previous, self.kept, self._plan, self._restrict)
            except Exception as error:  # noqa: BLE001 - a failure of planning over a range: plan this update alone
                profile.debug_print(1, f"  incremental: no plan over a range of positions ({type(error).__name__}: "
                                       f"{error}); planned for these inputs")
                found = None
        if found is None:
            return self._plan(*inputs)
        family, t = found
        self.family_at = found
        plan = instantiate(family.plan, t)
        if len(self.restricted) + len(plan[0]) > MAX_CACHED:
            self.restricted.clear()
        for (node, box), graph in zip(plan[0], family.graphs):
            self.restricted[(node, box)] = (graph, t)
        return plan

    def _plan(self, leaf_changes: dict[Node, Region], wanted: list[Region], invalid_before: dict[Node, Boxes]
              ) -> Plan:
        """The boxes to recompute (kept values in order, sources first) and the invalid boxes afterwards, given the
        invalid boxes before."""
        dirty = propagate_boxes(self.roots, leaf_changes)
        recompute = self._needed(dirty, wanted, invalid_before)
        steps: list[tuple[Node, Region]] = []
        invalid: dict[Node, Boxes] = {}
        for node in self.kept:
            stale = union(dirty.get(node, ()), invalid_before.get(node, ()))
            boxes = recompute.get(node, [])
            steps.extend((node, box) for box in boxes)
            remaining = union((), [piece for part in stale for piece in _subtract(part, boxes)
                                   if not self._unread(node, piece)])
            if remaining:
                invalid[node] = remaining
        return steps, invalid

    def _unread(self, node: Node, box: Region) -> bool:
        """Whether no other kept value (nor output) depends on the elements of `box` of a kept value: every path
        from them ends in a select on a static condition that never picks them (a causal mask's later columns).
        Such stale elements need no recompute ever, and are not kept as invalid (so a decode's invalid boxes
        stay a few boxes moving with the position). An output's elements are read by the caller."""
        if node in self.root_nodes:
            return False
        dirty = propagate_boxes(self.roots, {node: box})
        return not any(dirty.get(other) for other in self.values if other is not node)

    def _restrict(self, node: Node, box: Region) -> Node:
        """restrict(node, box) over the template's nodes, reading the kept values and inputs; a small slice of one
        that a contraction broadcasts (a decode step's row into a matrix product) is stored first (`_stored_rows`)."""
        self.restricts += 1
        graph = restrict(node, box, lambda source: source if source is not node and source in self.stops else None)
        return _stored_rows(graph, self.stops)

    def _restricted(self, node: Node, box: Region) -> Node:
        """restrict(node, box) reading the kept values and inputs as they are now: built once per (node, box) over
        the template's nodes (or a family's, affine in t: `_new_plan`), then copied with those nodes replaced by
        the current values at each use (and the arguments and shapes at t)."""
        key = (node, box)
        entry = self.restricted.get(key)
        if entry is None:
            entry = (self._restrict(node, box), None)
            if len(self.restricted) >= MAX_CACHED:
                self.restricted.clear()
            self.restricted[key] = entry
        graph, t = entry
        return over_values(graph, self.stops, self._current, t)

    def _alignment(self, node: Node) -> int:
        """The element alignment of views of a kept value's buffer (0: none are made)."""
        buffer = self.values[node].node.buffer
        if buffer is None or buffer.size <= write.SMALL_BUFFER or buffer.pool.view_alignment % buffer.dtype.itemsize:
            return 0  # (written by a select over the buffer)
        return buffer.pool.view_alignment // buffer.dtype.itemsize

    def _current(self, node: Node) -> Node:
        value = self.values.get(node)
        return value.node if value is not None else self.leaf_inputs[node].node

    def _needed(self, dirty: dict[Node, Boxes], wanted: list[Region], invalid: dict[Node, Boxes]
                ) -> dict[Node, list[Region]]:
        """The boxes of each kept value to recompute: its dirty or invalid elements that the outputs need, found by
        pushing the boxes to recompute down to the sources they read (a causal select needs no masked element)."""
        demand: dict[Node, Region] = {}
        for root, region in zip(self.roots, wanted):
            if region.shape != root.shape:
                raise ShapeError(f"IncrementalGraph.update: a needed region of shape {region.shape} for an output of "
                                 f"shape {root.shape}")
            demand[root] = region if root not in demand else demand[root].hull(region)
        recompute: dict[Node, list[Region]] = {}
        for node in reversed(self.order):
            needed = demand.get(node)
            if needed is None or needed.is_empty or node.op in LEAF_OPS:
                continue
            if node in self.values:
                stale = union(dirty.get(node, ()), invalid.get(node, ()))
                boxes = [aligned_box(box, self._alignment(node))
                         for box in (part.intersection(needed) for part in stale) if not box.is_empty]
                recompute[node] = boxes
            else:
                boxes = [needed]
            for box in boxes:
                for source, source_box in zip(node.srcs, self._source_demand(node, box)):
                    if source_box is not None and not source_box.is_empty:
                        previous = demand.get(source)
                        demand[source] = source_box if previous is None else previous.hull(source_box)
        return recompute

    def _source_demand(self, node: Node, box: Region) -> list[Region | None]:
        boxes = source_boxes(node, box)
        if node.op is Op.WHERE and self.static[node.srcs[0]]:
            boxes[1] = _narrow(box, node.srcs[0], (0, 0))
            boxes[2] = _narrow(box, node.srcs[0], (1, 1))
        return boxes


ROW_BROADCAST = 8  # an expand this many times a slice's size or more makes a slice of a kept value stored


def _stored_rows(graph: Node, stops: set[Node]) -> Node:
    """The restricted graph with the operand of each broadcast by ROW_BROADCAST times or more (through reshapes
    and permutes: a decode step's row into a matrix product) read through a CONTIGUOUS, where it is computed or a
    slice of a kept value: stored as a small buffer of its own, the product kernel reading it has no offset that
    moves with the position, so it compiles for its sizes (tiled and vectorized, once for every position) instead
    of as a shape class's member (untiled); only the operand's kernel is a member."""
    broadcast: set[Node] = set()
    slices: set[Node] = set()
    nodes = post_order([graph], lambda current: () if current in stops else current.srcs)
    for node in nodes:  # (sizes at t = 0 of a family's graph, unrecorded: a store changes no value, only kernels)
        if node.op is Op.EXPAND and _elements(node) >= ROW_BROADCAST * _elements(node.srcs[0]):
            source = node.srcs[0]
            while source.op in (Op.RESHAPE, Op.PERMUTE) and source not in stops:
                source = source.srcs[0]
            if source not in stops and source.srcs and source.op is not Op.CONTIGUOUS:
                broadcast.add(source)
        elif node.op is Op.SHRINK and node.srcs[0] in stops and all(
                end - start == 1 or (start, end) == (0, size) for (start, end), size in
                zip(affine.parts_of(node.arg), affine.parts_of(node.srcs[0].shape))):
            slices.add(node)  # (a row of a kept value: one index on each axis it slices, a decode step's position)
    if not broadcast:
        return graph
    broadcast |= slices  # (also the rows a product's epilogue adds: a residual stream's)
    copies: dict[Node, Node] = {}
    for node in nodes:
        if node in stops or not node.srcs:
            copies[node] = node
            continue
        sources = tuple(copies[source] for source in node.srcs)
        made = node if sources == node.srcs else Node(node.op, sources, node.arg, node.shape, node.dtype,
                                                      node.device if node.op is Op.COPY else None)
        copies[node] = Node(Op.CONTIGUOUS, (made,), None, made.shape, made.dtype) if node in broadcast else made
    return copies[graph]


def _elements(node: Node) -> int:
    """A node's element count, at t = 0 where its shape is affine in a position (affine.py), recording nothing."""
    count = 1
    for size in affine.parts_of(node.shape):
        count *= size
    return count


def kernel_flops(roots: Sequence[Node]) -> int:
    """The arithmetic of the kernels that would compute `roots`: per element, one for each elementwise op and one
    for each element a reduce reads (a matmul's multiply and add: 2 * M * N * K)."""
    return sum(item.kernel.flops for item in kernelize(list(roots)) if isinstance(item, Launch))


def _subtract(box: Region, removed: list[Region]) -> list[Region]:
    pieces = [box]
    for other in removed:
        pieces = [piece for part in pieces for piece in part.difference(other)]
    return pieces
