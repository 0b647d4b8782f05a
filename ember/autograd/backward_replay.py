"""Backward passes replayed: `loss.backward()` on a history shaped like one differentiated before runs the command
program that backward ran, on the new graph's nodes, without building or scheduling the gradients' graph again.

An eager training step builds its gradients' graph anew at every step (each recorded op's rule, or the copy of its
template), then places and keys the forward and backward graphs together to find their program. Which gradients'
graph the rules build is decided by the recorded history (each op, its arg, which sources require grad) and by the
lazy forward graph under it (ops, args, shapes, dtypes, devices, which nodes are realized); what the program
computes, by the two graphs' structure. So a backward pass is a function of its *signature*: the forward graph's key
(schedule.graph_key over the nodes of the history: each tensor's node, its sources' nodes, the tensors its arg
holds, the leaves' existing gradients, the module state its forward updated lazily (core/state_updates.py) and the
value checks' violations) and the history by those nodes' positions. A signature's first eager passes watch their
realize (realize.WATCH) until one runs from the program's launch plan: every slot of that program is either a node of
the forward graph (by its position there: an in-place assign of BatchNorm's running statistics is one, run as the
eager pass runs it) or a node of the gradients' graph, which a replay makes as a fresh stand-in (the executor computes
it, as it does a template's stored values: schedule.with_extra_slots), and each leaf's new gradient is a slot. A
replay computes the signature, fills the slots and runs the program from its plan (realize.run_plan), then does
what the eager pass does after its realize: settles the value checks, sets `.grad`, frees the history and runs the
post-accumulate hooks. A template's stored values are not kept for later copies (a later realize of one computes
them again). Where it can be, a recorded program is bound to buffers at its first replay (bound_backward.py: its
launches run with no executor work per launch, the gradients' graph's intermediates in an arena).

The eager pass stays the reference, and runs (unrecorded) wherever a replay could differ from it: create_graph,
retain_graph, `inputs`, an explicit gradient, several roots, hooks or retain_grad on a tensor of the history, a
history changed in place since it was recorded, an op whose arg is neither plain data nor tensors (a recurrent
layer's deferred weight gradients), a check that failed before, a realize that is not plain (a profile, a capture,
a memory budget, debug output, a trace) and graph-parallel launches; a program whose gradients' graph holds a
realized leaf or an assign is never recorded, and one whose plan the compile cache has since outdated is recorded
again. `EMBER_BACKWARD_REPLAY=0` (settings.backward_replay) turns replays off.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from ember.autograd import bound_backward
from ember.autograd.bound_backward import BoundBackward, bind
from ember.autograd.rules import TEMPLATED_RULES
from ember.context import CONTEXT
from ember.core import checks as value_checks
from ember.core import state_updates
from ember.core.graph import Node
from ember.core.graph_templates import TracedFunction
from ember.core.ops import Op
from ember.scheduler import compile_cache
from ember.scheduler.buffers import DEFERRED_FREES, MAX_DEFERRED_FREES, read_node, release_finished
from ember.scheduler.launch_plan import LaunchPlan
from ember.scheduler.lock import acquire, release
from ember.scheduler.placement import place_graph
from ember.scheduler.program import CommandProgram
from ember.scheduler.realize import PlanRun, run_plan
from ember.scheduler.schedule import graph_key
from ember.settings import CONFIG

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

SIGNATURES_KEPT = 8  # backward signatures with a recorded program, least recently used dropped first
RECORDING_TRIES = 3  # eager passes of a signature that may record it (the first compiles: off the launch plan)


class Recorded(NamedTuple):
    """A backward pass's program by slot: `forward_slots` (slot, position in the forward graph), `fresh_slots`
    (slot, shape, dtype, device) of the gradients' graph, `gradients` (position in the history's order of a leaf,
    the slot of its new .grad), `checks` (positions among the signature's value checks, in the realize's order);
    `binding` holds the program bound to buffers (bound_backward.py) once a replay made it: [None] before the first
    replay, [False] where it cannot be bound."""

    program: CommandProgram
    plan: LaunchPlan
    table_size: int
    forward_slots: tuple[tuple[int, int], ...]
    fresh_slots: tuple[tuple[int, tuple[int, ...], Any, str], ...]
    gradients: tuple[tuple[int, int], ...]
    checks: tuple[int, ...]
    binding: list[BoundBackward | bool | None]


class Pass(NamedTuple):
    """One backward call's signature and what computing it found: the history's tensors in order (sources first,
    the root last), the module state updated lazily (core/state_updates.py) that the pass computes too, the forward
    graph's nodes and their positions by id, and the value checks it carries."""

    signature: tuple[Any, ...]
    order: list[Tensor]
    updates: list[Tensor]
    nodes: list[Node]
    position: dict[int, int]
    checks: list[value_checks.Check]
    realized: list[bool] | None = None  # per forward node, whether it was realized (a pass to record only)


class BackwardReplays:
    """Recorded backward passes by signature (None: a signature that is not replayed), and the eager passes of
    signatures not recorded yet."""

    def __init__(self) -> None:
        self.recorded: OrderedDict[tuple[Any, ...], Recorded | None] = OrderedDict()
        self.tries: dict[tuple[Any, ...], int] = {}
        self.replayed = 0  # backward passes done by a replay (tests and benchmarks read it)
        self.bound = 0  # of those, replays of a program bound to buffers (bound_backward.py)
        self.lock = threading.Lock()

    def prepare(self, root: Tensor) -> Pass | None:
        """The signature of `root.backward()` (the caller checked that the call is a plain one: one root, its
        implicit gradient, no create_graph, retain_graph or inputs), or None where the eager pass must run
        unrecorded."""
        if not CONFIG.backward_replay or CONFIG.parallel_kernels:  # (graph-parallel runs gather: never replayed)
            return None
        context = CONTEXT.get()
        if not context.plain or context.trace is not None:
            return None
        found = _signature(root, state_updates.pending_state_updates())
        if found is None:
            return None
        with self.lock:
            known = found.signature in self.recorded
            if known and self.recorded[found.signature] is None:
                return None
        if not known:  # (to record: a node realized by the pass's rules before its realize is no leaf of a replay)
            found = found._replace(realized=[node.op is Op.BUFFER for node in found.nodes])
        return found

    def replay(self, found: Pass) -> bool:
        """Do the backward pass of `found` by its recorded program; False where none is recorded (or its plan is
        outdated: it is recorded again), and nothing was done."""
        with self.lock:
            recorded = self.recorded.get(found.signature)
            if recorded is None:
                return False
            self.recorded.move_to_end(found.signature)
            stamp = (compile_cache.COMPILED, compile_cache.COMPILED.generation)
            if not recorded.plan.holds(stamp):
                del self.recorded[found.signature]
                return False
        self.replayed += 1
        self.bound += _run(recorded, found)  # (raises a failed value check as the eager pass would: a replay nonetheless)
        return True

    def make_room(self, nbytes: int) -> None:
        """Let the bindings of the least recently replayed programs go (bound_backward.py: they bind again at their
        next replay) until `nbytes` more fit within bound_backward.MAX_BOUND_BYTES. The caller holds the scheduler's
        lock (bindings are made and run under it)."""
        with self.lock:
            recordings = [recorded for recorded in self.recorded.values() if recorded is not None]
        held = sum(recorded.binding[0].held_bytes for recorded in recordings
                   if isinstance(recorded.binding[0], BoundBackward))
        for recorded in recordings:
            if held + nbytes <= bound_backward.MAX_BOUND_BYTES:
                return
            binding = recorded.binding[0]
            if isinstance(binding, BoundBackward):
                held -= binding.held_bytes
                recorded.binding[0] = None

    def clear(self) -> None:
        """Forget every recorded pass and let the memory of their bindings go (the next passes record again)."""
        with self.lock:
            self.recorded.clear()
            self.tries.clear()

    def record(self, found: Pass, runs: list[PlanRun | None], gradients: list[tuple[Tensor, Tensor]],
               checks: list[value_checks.Check], updates: list[Tensor]) -> None:
        """After an eager pass of `found`: keep the program its realize ran (`runs`, what realize.WATCH saw), with
        the leaves in `gradients` (their `.grad` now set), the value checks it settled (`checks`, as the realize
        took them) and the state updates it computed (`updates`); or count a try that could not be kept."""
        same_updates = len(updates) == len(found.updates) and all(map(operator.is_, updates, found.updates))
        recorded = _recorded(found, runs, gradients, checks) if same_updates else None
        with self.lock:
            if recorded is not None:
                self.recorded[found.signature] = recorded
                self.tries.pop(found.signature, None)
            else:
                tries = self.tries[found.signature] = self.tries.get(found.signature, 0) + 1
                if tries >= RECORDING_TRIES:  # (never on the plan path, or never alike: the eager pass it is)
                    self.recorded[found.signature] = None
                    self.tries.pop(found.signature, None)
            if len(self.recorded) > SIGNATURES_KEPT:
                self.recorded.popitem(last=False)
            if len(self.tries) > SIGNATURES_KEPT:
                self.tries.pop(next(iter(self.tries)))


REPLAYS = BackwardReplays()


def _signature(root: Tensor, updates: list[Tensor]) -> Pass | None:
    """The signature of the backward pass from `root` computing the state `updates` too (see the module's
    docstring), or None where a replay could differ from the eager pass."""
    from ember.autograd.engine import _topological_order
    from ember.core.tensor import Tensor

    if not isinstance(root, Tensor) or root.is_sharded or root._context is None:
        return None
    recorded: dict[int, tuple[Tensor, ...]] = {}
    order = _topological_order([root], recorded)  # (raises for a freed history, as the eager pass does)
    roots: list[Node] = []
    append = roots.append
    held: list[tuple[Any, tuple[Tensor, ...]]] = []  # per tensor with history: (its split arg, the tensors it holds)
    for tensor in order:
        if tensor.is_sharded or tensor._hooks or tensor._retains_grad:  # (a sharded kind: its own backward)
            return None
        append(tensor.node)
        context = tensor._context
        if context is None:
            gradient = tensor.grad
            if gradient is not None:
                if not isinstance(gradient, Tensor) or gradient.is_sharded:
                    return None
                append(gradient.node)
            continue
        op, arg, sources = context
        if recorded[id(tensor)] is not sources:  # (a source changed in place since: its state then)
            return None
        for source in sources:
            if not source._requires_grad:  # (one that does is in `order`: its node is listed there)
                append(source.node)
        split = TEMPLATED_RULES.get(op)
        if split is not None:
            signature, tensors, _ = split(arg)
        elif arg is None:
            signature, tensors = None, ()
        else:
            signature, held_tensors = arg, list[Tensor]()
            if not _collect(arg, held_tensors, Tensor):
                return None
            tensors = tuple(held_tensors)
        for tensor_held in tensors:
            append(tensor_held.node)
        held.append((signature, tensors))
    for update in updates:
        if not isinstance(update, Tensor) or update.is_sharded:
            return None
        append(update.node)
    checks, failed = value_checks.unsettled(roots)
    if failed is not None:
        return None  # (failed before: the eager pass raises it again, at its realize)
    roots.extend(check.violation for check in checks)  # type: ignore[misc]
    nodes = place_graph(roots)
    key = graph_key(nodes, roots)
    position = {id(node): index for index, node in enumerate(nodes)}
    index_of = {id(tensor): index for index, tensor in enumerate(order)}
    history: list[Any] = []
    arguments = iter(held)
    for tensor in order:
        context = tensor._context
        if context is None:
            gradient = tensor.grad
            history.append((position[id(tensor.node)], None if gradient is None else position[id(gradient.node)]))
            continue
        op, arg, sources = context
        signature, tensors = next(arguments)
        frozen = None if signature is None else _frozen_value(signature, position, Tensor)
        if frozen is _REFUSED:
            return None
        history.append((position[id(tensor.node)], op, frozen,
                        tuple([position[id(item.node)] for item in tensors]) if tensors else (),
                        tuple([(position[id(source.node)], index_of.get(id(source), -1)) for source in sources])))
    settings = (CONFIG.rewrites, CONFIG.auto_shard, CONFIG.parallel_kernels)
    return Pass((key, tuple(history), settings), order, updates, nodes, position, checks)


_REFUSED = object()  # an arg with a value a signature cannot stand for
INTEGERS = "ints"  # the kind of a tuple of ints alone, frozen as it is (ints are equal exactly when their values are)
PLAIN_TYPES = (bool, int, str, type(None))


def _collect(value: Any, found: list[Tensor], tensor_class: type) -> bool:
    """Append the tensors (of `tensor_class`) in an arg of plain data and tuples of it to `found`; False for a value
    of another kind."""
    kind = value.__class__
    if kind in PLAIN_TYPES or kind is float:  # (most items: a pad's amounts, a geometry's sizes)
        return True
    if isinstance(value, tensor_class):
        if value.is_sharded:  # type: ignore[attr-defined]
            return False
        found.append(value)  # type: ignore[arg-type]
        return True
    if isinstance(value, tuple):
        return all(item.__class__ in PLAIN_TYPES or _collect(item, found, tensor_class) for item in value)
    return isinstance(value, (float, Enum, TracedFunction))


def _frozen(value: Any, position: dict[int, int]) -> Any:
    """A hashable stand-in for an arg's signature, equal exactly when the values are (a float by its bits, a tensor
    by its node's position in the forward graph), or _REFUSED."""
    from ember.core.tensor import Tensor

    return _frozen_value(value, position, Tensor)


def _frozen_value(value: Any, position: dict[int, int], tensor_class: type) -> Any:
    """_frozen with the Tensor class given (the signature's loop imports it once)."""
    kind = value.__class__
    if kind in PLAIN_TYPES:
        return (kind, value)
    if kind is float:
        return (float, value.hex())
    if isinstance(value, tuple):
        if all(item.__class__ is int for item in value):  # (a convolution's strides, its padding, a Size)
            return (INTEGERS, value) if kind is tuple else (kind, INTEGERS, value)
        items = tuple([(item.__class__, item) if item.__class__ in PLAIN_TYPES else
                       _frozen_value(item, position, tensor_class) for item in value])
        return _REFUSED if _REFUSED in items else (kind, items)
    if isinstance(value, tensor_class):
        return (tensor_class, position[id(value.node)])  # type: ignore[attr-defined]
    if isinstance(value, (Enum, TracedFunction)):  # (a TracedFunction equals another of its signature)
        return (kind, value)
    try:
        hash(value)
    except TypeError:
        return _REFUSED
    return _REFUSED if kind.__eq__ is object.__eq__ else (kind, value)


def _recorded(found: Pass, runs: list[PlanRun | None], gradients: list[tuple[Tensor, Tensor]],
              checks: list[value_checks.Check]) -> Recorded | None:
    """The replayable form of an eager pass whose realize ran `runs`, or None where it cannot be replayed."""
    if len(runs) != 1 or runs[0] is None:
        return None
    program, plan, gather, slots = runs[0]
    if gather:
        return None
    position = found.position
    forward_slots: list[tuple[int, int]] = []
    fresh_slots: list[tuple[int, tuple[int, ...], Any, str]] = []
    slot_of: dict[int, int] = {}  # (ids of nodes alive since before the run: the forward graph's, the gradients')
    for slot in program.used:
        noted = slots[slot]
        if noted is None:
            return None
        slot_of[noted.identity] = slot
        at = position.get(noted.identity)
        if at is not None:
            if found.realized is None or noted.realized != found.realized[at]:
                return None  # (realized since the signature was taken: by a rule, not by the program)
            forward_slots.append((slot, at))
        elif noted.realized or noted.assign or noted.device is None:
            return None  # (a leaf or an assign the gradients' graph made: not a stand-in's value)
        else:
            fresh_slots.append((slot, noted.shape, noted.dtype, noted.device))
    index_of = {id(tensor): index for index, tensor in enumerate(found.order)}
    leaves = []
    for tensor, _ in gradients:
        gradient = tensor.grad
        if gradient is None or id(tensor) not in index_of or not gradient.node.realized:
            return None
        gradient_slot = slot_of.get(id(gradient.node))
        if gradient_slot is None:
            return None
        leaves.append((index_of[id(tensor)], gradient_slot))
    check_index = {id(check): index for index, check in enumerate(found.checks)}
    if any(id(check) not in check_index for check in checks):
        return None
    for tensor in (found.order[-1], *found.updates):  # (the loss and the state: realized by the program's steps)
        if id(tensor.node) not in slot_of or not tensor.node.realized:
            return None
    return Recorded(program, plan, len(slots), tuple(forward_slots), tuple(fresh_slots), tuple(leaves),
                    tuple(check_index[id(check)] for check in checks), [None])


def _run(recorded: Recorded, found: Pass) -> bool:
    """The backward pass of `found` by `recorded`'s program: its realize, `.grad` of each leaf, the value checks
    settled, the history freed and the leaves' post-accumulate hooks run (as engine.backward does after its
    realize); whether the program ran bound to buffers."""
    from ember.autograd.engine import free_history
    from ember.core.tensor import Tensor

    nodes = found.nodes
    root = found.order[-1]
    acquire()
    try:
        if DEFERRED_FREES:
            release_finished(wait=len(DEFERRED_FREES) > MAX_DEFERRED_FREES)
        bound = recorded.binding[0] if bound_backward.BIND_REPLAYS else False
        if bound is None:  # (bound at the first replay, to its forward graph's buffers)
            bound = recorded.binding[0] = bind(recorded, nodes, REPLAYS.make_room) or False
        outputs = _run_bound(bound, recorded, nodes) if isinstance(bound, BoundBackward) else \
            _run_nodes(recorded, nodes)
    finally:
        release()
    state_updates.take_state_updates()  # (computed: `found.updates`)
    checks = [found.checks[index] for index in recorded.checks]
    order = found.order
    try:
        if checks:
            value_checks.settle(checks, [root.node, *[update.node for update in found.updates]], read_node)
    finally:  # (the eager pass sets .grad before its realize raises a failed check)
        failed = tuple(check for check in checks if check.failure is not None) or None
        for (index, _), node in zip(recorded.gradients, outputs):
            if failed is not None:  # (computed from wrong values: reading them raises the failure again)
                node.checks = failed
            order[index].grad = Tensor._from_node(node, False)
    free_history(order)
    for index, _ in recorded.gradients:  # leaves' post-accumulate hooks, in the order the eager pass runs them
        tensor = order[index]
        if tensor._post_accumulate_hooks:
            for hook in list(tensor._post_accumulate_hooks):
                hook(tensor)
    return isinstance(bound, BoundBackward)


def _run_nodes(recorded: Recorded, nodes: list[Node]) -> list[Node]:
    """Run the program over nodes (the forward graph's, by position, and fresh stand-ins for the gradients' graph),
    through the per-op path's executor; the leaves' new gradients (nodes), in `recorded.gradients`' order."""
    table: list[Node | None] = [None] * recorded.table_size
    for slot, at in recorded.forward_slots:
        table[slot] = nodes[at]
    for slot, shape, dtype, device in recorded.fresh_slots:
        table[slot] = Node(Op.CONTIGUOUS, (), None, shape, dtype, device)
    nodes.clear()  # (the table holds the nodes the run needs: an assign may write in place where nothing else does)
    outputs = [cast(Node, table[slot]) for _, slot in recorded.gradients]  # (the run empties its table as it goes)
    run_plan(recorded.program, recorded.plan, table)
    return outputs


def _run_bound(bound: BoundBackward, recorded: Recorded, nodes: list[Node]) -> list[Node]:
    """Run the program bound to buffers (bound_backward.py): the forward nodes it computes become their buffers, as
    the eager pass's do; the leaves' new gradients (nodes holding their buffers), in `recorded.gradients`' order."""
    made = bound.run(recorded, nodes)
    gradients: dict[int, Node] = {}
    for (slot, position, *_), buffer in zip(bound.made, made):
        if position >= 0:
            nodes[position].become_buffer(buffer)
        else:
            node = gradients[slot] = Node(Op.CONTIGUOUS, (), None, *bound.gradient_nodes[slot])
            node.become_buffer(buffer)
    nodes.clear()
    return [gradients[slot] for _, slot in recorded.gradients]
