"""Graph templates: a composition of primitive ops on leaf inputs recorded once per signature, then instantiated by
copying its nodes (no Tensor methods, shape checks or broadcasting run again): the per-step cost of random draws.

A template is the lazy graph `build(*inputs)` records on stand-ins of the inputs' shapes, dtypes and devices
(the inputs may be any nodes: leaves or recorded ops).
Instantiating it makes fresh nodes of the same ops, arguments, shapes, dtypes and devices over the real inputs,
so the result is the graph `build` would have recorded on them, node for node (the scheduler caches and fuses it
like any other). What `build` may do: record primitive ops on its inputs and on constants it makes (CONST, ARANGE);
its result must depend on nothing but the signature and the inputs' graphs (no values read, no other tensors). A
build that reaches any other leaf, or whose graph carries value checks of its own, is not templated: it runs every
time; so does a call whose inputs require grad while grad mode records (a template has no history). Inputs may carry
value checks (a loss's lazy check of its labels reaches every gradient of the backward pass): a copied node takes its
sources' checks as any node does (graph.Node), so the copies carry exactly the checks build's own nodes would.

A copy is one TEMPLATE node per result (`TEMPLATE_NODES`): the template's graph stays collapsed, one node with the
inputs as sources, through everything the scheduler does at every realize (placement, the schedule key, the cache
lookup), and is expanded into its primitive nodes only where a graph is kernelized or analysed (`expand_graph` for a
new schedule, `expand_in_place` for automatic sharding, incremental graphs and the kernelizer's other callers). A
training step's matmuls, losses, backward rules and random draws are most of its nodes (an MLP step: 313 of 359), so
the per-node work of each realize shrinks with them. A result that is one of the inputs, or a view of one (movement
ops down to an input), is copied node for node instead: what views and in-place assigns see of it stays as build made
it. For copies with several results, what a copy made node for node gave for free is kept: a node of the copy that
a realize stores is read by the copy's results that the realize did not compute (`keep_for_copies`, `keep_stored`:
they become copies of a derived template taking it as an input), and the results of the copy alive outside the
graph (`Node.siblings`) take the values the realize stored for them (a normalization's statistics, realized with its
output, are not computed again by its backward).

`function_signature` names a build function by its code and the values it closes over, so that compositions
recorded for autograd (`Tensor._recorded`: exp, sigmoid, relu, softmax, ...) are templated by the function they
run: a closure over a tensor, or over a value that cannot be hashed, has no signature (it runs every time)."""

from __future__ import annotations

import functools
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ember.context import CONTEXT
from ember.core import runtime
from ember.core.dtype import DType
from ember.core.graph import Node
from ember.core.ops import REDUCE_OPS, Op
from ember.core.shapes import prod
from ember.core.walk import post_order

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

MAX_TEMPLATES = 256
PLAIN_VALUES = (type(None), bool, int, float, complex, str, DType, Op)  # values a signature holds as they are
PLAIN_CLASSES = frozenset(PLAIN_VALUES)
FREE_LEAVES = (Op.CONST, Op.ARANGE)  # leaves a template makes again at each instantiation
BUFFER, TEMPLATE = Op.BUFFER, Op.TEMPLATE

TEMPLATE_NODES = True  # copies as TEMPLATE nodes (collapsed until kernelized); False: node for node
MOVEMENT = frozenset({Op.RESHAPE, Op.EXPAND, Op.PERMUTE, Op.PAD, Op.SHRINK, Op.FLIP})

# one entry per node after the inputs, sources first: (op, source positions, arg, shape, dtype, device), positions
# counting the inputs first
_UNSEEN: Any = object()  # (a signature without an entry yet)
Entry = tuple[Op, tuple[int, ...], Any, tuple[int, ...], Any, "str | None"]


class Template:
    """A recorded build: its `entries` (one per node after the `inputs` stand-ins, sources first) and the position of
    each result (None for a result that is None). Hashed once (a schedule key holds it in every TEMPLATE node's
    arg), equal to another of the same entries; `collapsible`: whether its copies may be TEMPLATE nodes (no result
    is an input or a view of one)."""

    __slots__ = ("entries", "outputs", "inputs", "collapsible", "_hash", "_derived", "_work")

    def __init__(self, entries: tuple[Entry, ...], outputs: tuple[int | None, ...], inputs: int) -> None:
        self.entries = entries
        self.outputs = outputs
        self.inputs = inputs
        self._hash = hash((entries, outputs, inputs))
        self._derived: dict[tuple[int, ...], tuple[Template, dict[int, int]]] = {}
        self._work: tuple[int, tuple[int, ...], frozenset[DType]] | None = None
        self.collapsible = inputs > 0 and all(position is None or not self._reaches_input(position)
                                              for position in outputs)

    def work(self) -> tuple[int, tuple[int, ...], frozenset[DType]]:
        """What a copy computes, without expanding it (worked out once): the elements its reduces read from its own
        entries, the inputs other reduces read whole (their sizes are the copy's sources'), and its entries'
        dtypes (the sharding decision's estimate of a graph holding copies: sharding/decision.py)."""
        if self._work is None:
            fixed, read_inputs = 0, []
            for op, sources, *_ in self.entries:
                if op in REDUCE_OPS:
                    source = sources[0]
                    if source < self.inputs:
                        read_inputs.append(source)
                    else:
                        fixed += prod(self.entries[source - self.inputs][3])
            self._work = (fixed, tuple(read_inputs), frozenset(entry[4] for entry in self.entries))
        return self._work

    def _reaches_input(self, position: int) -> bool:
        """Whether the node at `position` is an input, or movement ops over one (a view of it)."""
        while position >= self.inputs:
            op, sources, *_ = self.entries[position - self.inputs]
            if op not in MOVEMENT:
                return False
            position = sources[0]
        return True

    def with_inputs(self, positions: tuple[int, ...]) -> tuple[Template, dict[int, int]]:
        """This template with the entries at `positions` (sorted, each past the inputs) made inputs after its own,
        and the entries no result needs then dropped: the derived template (made once) and the new position of each
        old one it keeps (a copy some of whose nodes a realize stored reads them: `keep_stored`)."""
        found = self._derived.get(positions)
        if found is not None:
            return found
        count = self.inputs
        moved = {position: count + index for index, position in enumerate(positions)}
        needed, _ = self._needed(positions)
        new_position = {position: position for position in range(count)}
        new_position.update(moved)
        entries: list[Entry] = []
        for index, (op, sources, arg, shape, dtype, device) in enumerate(self.entries):
            if index + count in needed:
                new_position[index + count] = count + len(positions) + len(entries)
                entries.append((op, tuple(new_position[source] for source in sources), arg, shape, dtype, device))
        outputs = tuple(None if position is None else new_position[position] for position in self.outputs)
        found = self._derived[positions] = (Template(tuple(entries), outputs, count + len(positions)), new_position)
        return found

    def read_values(self, positions: tuple[int, ...]) -> set[int]:
        """Which of the values at `positions` (entries a realize stored) the results still read: those reached from
        the results through entries not stored (the others are read only by stored entries, as a copy made node for
        node dropped them once their readers were stored)."""
        return self._needed(positions)[1]

    def _needed(self, positions: tuple[int, ...]) -> tuple[set[int], set[int]]:
        """The entries the results need when those at `positions` are given, and the given ones they read."""
        count, given = self.inputs, set(positions)
        needed: set[int] = set()
        read: set[int] = set()
        stack = [position for position in self.outputs if position is not None]
        while stack:
            position = stack.pop()
            if position in given:
                read.add(position)
            elif position >= count and position not in needed:
                needed.add(position)
                stack.extend(self.entries[position - count][1])
        return needed, read

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Template) and self._hash == other._hash
                                 and (self.entries, self.outputs, self.inputs) ==
                                 (other.entries, other.outputs, other.inputs))

    def __repr__(self) -> str:
        return f"Template({len(self.entries)} nodes, {self.inputs} inputs)"


_TENSOR: list[type[Tensor]] = []  # the Tensor class, imported at the first instantiation (tensor.py imports this)


def _tensor_class() -> type[Tensor]:
    """core.tensor's Tensor (an import at every instantiation cost 0.5-1 us)."""
    from ember.core.tensor import Tensor

    _TENSOR.append(Tensor)
    return Tensor


class TemplateResult(NamedTuple):
    """The arg of a TEMPLATE node: its template and the position of the result it stands for."""

    template: Template
    position: int


class GraphTemplates:
    """Signature -> the recorded entries of `build`'s graph (None: not templatable, `build` runs each time); least
    recently used signatures dropped."""

    def __init__(self) -> None:
        self.entries: OrderedDict[Hashable, Template | None] = OrderedDict()
        self.recorded = 0  # builds recorded as templates
        self.instantiated = 0  # graphs made by copying a template

    def instantiate(self, signature: Hashable, build: Callable[..., Tensor], inputs: tuple[Tensor, ...]) -> Tensor:
        """build(*inputs), from the template of `signature` (recorded by this call when there is none yet).
        `signature` must name everything besides the inputs' shapes, dtypes and devices that `build` depends on."""
        result = self._instantiate(signature, build, inputs, False)
        assert result is not None
        return result

    def instantiate_many(self, signature: Hashable, build: Callable[..., tuple[Tensor | None, ...]],
                         inputs: tuple[Tensor, ...]) -> tuple[Tensor | None, ...]:
        """`instantiate` for a build of several results (a backward rule's gradients; None where one is not
        wanted): one template holds the graphs of them all, sharing the nodes they share."""
        return self._instantiate(signature, build, inputs, True)

    def _instantiate(self, signature: Hashable, build: Callable[..., Any], inputs: tuple[Tensor, ...],
                     many: bool) -> Any:
        tensor_class = _TENSOR[0] if _TENSOR else _tensor_class()
        input_nodes = [tensor.node for tensor in inputs]
        recording = CONTEXT.get().grad_enabled
        for tensor in inputs:
            if tensor.is_sharded or (recording and tensor._requires_grad):
                return build(*inputs)  # (a template records no history)
        key = (signature, many, *[(node.shape, node.dtype, node.device or runtime.RUNTIME.device_of(node),
                                   node.op is BUFFER) for node in input_nodes])
        template = self.entries.get(key, _UNSEEN)
        if template is not _UNSEEN:
            try:
                self.entries.move_to_end(key)
            except KeyError:  # (dropped by another thread meanwhile: the template is still good)
                pass
        else:
            template = self.entries[key] = _record(build, input_nodes, many)
            self.recorded += template is not None
            if len(self.entries) > MAX_TEMPLATES:
                self.entries.popitem(last=False)
        if template is None or template is _UNSEEN:
            return build(*inputs)
        self.instantiated += 1
        if TEMPLATE_NODES and template.collapsible:  # one node per result, expanded when kernelized
            sources = tuple(input_nodes)  # (shared by the results: expand_graph copies one call's graph once)
            entries, count = template.entries, template.inputs
            made: dict[int, Node] = {}
            results: list[Tensor | None] = []
            siblings: dict[int, weakref.ref[Node]] = {}
            for position in template.outputs:
                if position is None:
                    results.append(None)
                    continue
                node = made.get(position)
                if node is None:
                    _, _, _, shape, dtype, device = entries[position - count]
                    node = made[position] = Node(TEMPLATE, sources, TemplateResult(template, position), shape, dtype,
                                                 device)
                    if many:
                        node.siblings = siblings
                        siblings[position] = weakref.ref(node)
                results.append(tensor_class._from_node(node))
            return tuple(results) if many else results[0]
        nodes = copy_entries(template, input_nodes)
        if not many:
            return tensor_class._from_node(nodes[-1])
        return tuple(None if position is None else tensor_class._from_node(nodes[position])
                     for position in template.outputs)


def copy_entries(template: Template, input_nodes: list[Node]) -> list[Node]:
    """The input nodes followed by a fresh node per template entry over them (TEMPLATE nodes among the entries, a
    build that itself copied a template, stay so)."""
    nodes = input_nodes
    append = nodes.append
    for op, positions, arg, shape, dtype, device in template.entries:
        count = len(positions)  # (one or two sources without a list: most nodes)
        sources = ((nodes[positions[0]],) if count == 1 else (nodes[positions[0]], nodes[positions[1]])
                   if count == 2 else tuple([nodes[position] for position in positions]))
        append(Node(op, sources, arg, shape, dtype, device))
    return nodes


class Expanded(NamedTuple):
    """expand_graph's result: the roots' images; by id of each original node, its image; by id of each node a copy
    made for one of the graph's TEMPLATE nodes (not those of templates nested in it), that TEMPLATE node and the
    node's template position (a node of a copy that a realize stores is kept for the copy's results: `keep_stored`,
    and a stored result is its other results' value: Node.siblings)."""

    roots: list[Node]
    image: dict[int, Node]
    entries: dict[int, tuple[Node, int]]


def expand_graph(nodes: list[Node], roots: list[Node]) -> Expanded:
    """The graph of `nodes` (sources first, as placement lists them) with every TEMPLATE node replaced by the
    primitive nodes of its template (nested ones too), for kernelizing. Nodes over no TEMPLATE node are their own
    images; the others are fresh copies (the originals are left as they are: the program runs on them)."""
    image: dict[int, Node] = {}
    expanded: Expansions = {}
    entries: dict[int, tuple[Node, int]] = {}
    for node in nodes:
        sources = node.srcs
        if not sources:
            image[id(node)] = node
            continue
        images = tuple([image[id(source)] for source in sources])
        if node.op is TEMPLATE:
            image[id(node)] = _expanded(node, images, expanded)
            copy = expanded[id(node.srcs)][1]
            for position in range(node.arg.template.inputs, len(copy)):
                entries.setdefault(id(copy[position]), (node, position))
        elif any(new is not old for new, old in zip(images, sources)):
            image[id(node)] = Node(node.op, images, node.arg, node.shape, node.dtype, node.device)
        else:
            image[id(node)] = node
    return Expanded([image[id(root)] for root in roots], image, entries)


# a copy made by expansion, by the id of the TEMPLATE nodes' sources tuple (one per instantiation, shared by its
# results; held in the value, so the id stays its own): the tuple and the copied nodes
Expansions = dict[int, tuple[tuple[Node, ...], list[Node]]]


def _expanded(node: Node, sources: tuple[Node, ...], expanded: Expansions) -> Node:
    """The primitive node computing TEMPLATE `node`'s result over `sources` (its sources' images): the results of
    one instantiation share one copy of the template's graph; two instantiations are two copies, as before."""
    template, position = node.arg
    found = expanded.get(id(node.srcs))
    if found is None:
        copy = list(sources)
        for op, positions, arg, shape, dtype, device in template.entries:
            inner = tuple([copy[index] for index in positions])
            made = Node(op, inner, arg, shape, dtype, device)
            copy.append(_expanded(made, inner, expanded) if op is TEMPLATE else made)
        expanded[id(node.srcs)] = (node.srcs, copy)
    else:
        copy = found[1]
    result = copy[position]
    if node.device is not None and result.device is None:
        result.device = node.device  # (placement decided the TEMPLATE node's device: its result runs there too)
    return result


def keep_for_copies(stored: list[tuple[Node, int, Node]]) -> list[weakref.ref[Node]]:
    """Before a realize that stores nodes of copies: (a TEMPLATE node of the graph, template position, the node that
    will hold that position's value) for each. Every TEMPLATE node of that copy (the one given and its results alive
    outside the graph: Node.siblings) holds the nodes in `kept`, so they live as long as a result still to compute
    does (as a copy made node for node held them). Returns weak references to those TEMPLATE nodes, for
    `keep_stored` after the run. Only copies with several results keep them (a normalization's statistics and its
    output: the statistics are held for the backward pass and the running averages): holding the stored nodes of
    every copy (a matmul's sum before its bias) until its result is dropped raised a deep MLP's training peak by
    a quarter, since a copy's TEMPLATE node, unlike the node-for-node copy's nodes, keeps all of its sources until
    it is dropped; a single result that outlives the realize computes them again."""
    by_copy: dict[int, tuple[Node, dict[int, Node]]] = {}  # (by the id of the copy's sources tuple)
    for node, position, value in stored:
        if node.siblings is not None:  # (see the docstring)
            by_copy.setdefault(id(node.srcs), (node, {}))[1][position] = value
    members: list[weakref.ref[Node]] = []
    for node, kept in by_copy.values():
        sources = node.srcs
        for member in [node, *[reference() for reference in (node.siblings or {}).values()]]:
            if member is not None and member.op is TEMPLATE and member.srcs is sources and member.kept is not kept:
                member.kept = kept
                members.append(weakref.ref(member))
    return members


def keep_stored(members: list[weakref.ref[Node]]) -> None:
    """After a realize, for `keep_for_copies`'s TEMPLATE nodes: where the run computed nodes of a copy and left a
    TEMPLATE node of it as it was, that node becomes a copy of a derived template taking those values as inputs
    (Template.with_inputs), so a later realize reads them instead of computing them again (a normalization's
    statistics, realized with its output, read by its backward); a result the run stored becomes that buffer."""
    new_sources: dict[int, tuple[tuple[int, ...], tuple[Node, ...]]] = {}  # by id of the kept map: one per copy
    for reference in members:
        node = reference()
        if node is None or node.kept is None:
            continue
        kept, node.kept = node.kept, None
        if node.op is not TEMPLATE:
            continue
        template, position = node.arg
        value = kept.get(position)
        if value is not None and value.op is BUFFER:  # a result the run stored: its value
            node.become_buffer(value.buffer)
            continue
        found = new_sources.get(id(kept))
        if found is None:
            positions = tuple(sorted(index for index, value in kept.items() if value.op is BUFFER))
            found = new_sources[id(kept)] = (positions, node.srcs + tuple(kept[index] for index in positions))
        positions, sources = found
        if positions:
            derived, new_position = template.with_inputs(positions)
            node.srcs, node.arg = sources, TemplateResult(derived, new_position[position])


def expand_in_place(roots: list[Node]) -> None:
    """Replace every TEMPLATE node under `roots` by its template's graph, in place: the node takes its result's op,
    sources and arg over fresh nodes (for passes that analyse a graph before it is scheduled: automatic sharding,
    incremental graphs, the kernelizer called on a graph directly); the copy's results alive outside the graph
    (Node.siblings) are expanded with the same copy. The values are unchanged."""
    expanded: Expansions = {}
    for node in post_order(roots, lambda node: node.srcs):  # (sources first: a TEMPLATE node's are expanded)
        if node.op is TEMPLATE:
            sources = node.srcs
            members = [node] + [sibling for sibling in (reference() for reference in (node.siblings or {}).values())
                                if sibling is not None and sibling is not node and sibling.op is TEMPLATE
                                and sibling.srcs is sources]  # (results alive outside the graph share the copy)
            for member in members:
                result = _expanded(member, sources, expanded)
                member.op, member.srcs, member.arg = result.op, result.srcs, result.arg


def _record(build: Callable[..., Any], input_nodes: list[Node], many: bool) -> Template | None:
    """The entries of build's graph on stand-ins of the input nodes and the positions of its results (None for a
    result that is None), or None where it is not a template's."""
    from ember.core.tensor import Tensor

    stand_ins = [_stand_in(node) for node in input_nodes]
    built = build(*[Tensor._from_node(node) for node in stand_ins])
    results: tuple[Tensor | None, ...] = tuple(built) if many else (built,)
    if any(result is not None and result._requires_grad for result in results):
        return None
    position = {id(node): index for index, node in enumerate(stand_ins)}
    entries: list[Entry] = []
    result_ids = {id(result.node) for result in results if result is not None}
    leaves: dict[tuple, int] = {}  # a constant's (or arange's) description -> the position of its first entry
    for node in post_order([result.node for result in results if result is not None],
                           lambda node: () if id(node) in position else node.srcs):  # (stand-ins end the walk)
        if id(node) in position:
            continue
        if node.checks is not None or node.replaces is not None or (not node.srcs and node.op not in FREE_LEAVES):
            return None  # a value check, an in-place assign, or a leaf of its own (a buffer, host data)
        if not node.srcs and id(node) not in result_ids:  # equal constants are one node in the copies
            arg = node.arg
            leaf = (node.op, type(arg), arg.hex() if isinstance(arg, float) else arg, node.shape, node.dtype,
                    node.device)
            if leaf in leaves:
                position[id(node)] = leaves[leaf]
                continue
            leaves[leaf] = len(input_nodes) + len(entries)
        position[id(node)] = len(input_nodes) + len(entries)
        entries.append((node.op, tuple(position[id(source)] for source in node.srcs), node.arg, node.shape,
                        node.dtype, node.device))
    if not entries:  # (build returned inputs themselves)
        return None
    return Template(tuple(entries), tuple(None if result is None else position[id(result.node)] for result in results),
                    len(input_nodes))


def _stand_in(node: Node) -> Node:
    """A leaf of `node`'s shape, dtype and device for a build to record on; for a node not realized, an op over such
    a leaf, so that the build sees a value still to compute as the real input is (Tensor.contiguous stores one and
    leaves a realized one as it is: a stand-in that looked realized dropped a rule's store of its gradient)."""
    device = node.device or runtime.RUNTIME.device_of(node)
    leaf = Node(Op.BUFFER, (), None, node.shape, node.dtype, device)
    return leaf if node.op is BUFFER else Node(Op.CONTIGUOUS, (leaf,), None, node.shape, node.dtype, device)


@dataclass(frozen=True)
class TracedFunction:
    """The arg of a Composite.TRACED step: the pure function it computed, equal to (and hashed as) another by its
    signature alone (`function_signature`): two steps of one signature compute the same graph on their inputs."""

    signature: Hashable
    compute: Callable[..., Any] = field(compare=False, hash=False)


def traced_call(compute: Callable[..., Tensor], operands: tuple[Tensor, ...]) -> Tensor:
    """compute(*operands), a pure function of them checked by the caller, as one traced step (Tensor._traced,
    Composite.TRACED) where every operand is an ember tensor; as it is for other kinds (sharded, reference)."""
    if all(hasattr(operand, "_traced") for operand in operands):
        return operands[0]._traced(compute, operands)
    return compute(*operands)


def function_signature(function: Any) -> Hashable | None:
    """A hashable name of what `function` computes: its code, defaults and closed-over values (functions among them
    by their own signature; functools.partial by its function and arguments), or None where one of those values is
    a tensor or cannot be hashed."""
    if isinstance(function, functools.partial):
        inner = function_signature(function.func)
        names = tuple(sorted(function.keywords))
        values = _value_signatures((*function.args, *[function.keywords[name] for name in names]))
        return None if inner is None or values is None else (inner, names, values)
    if isinstance(function, types.FunctionType):
        values = _value_signatures((*(function.__defaults__ or ()),
                                    *[cell.cell_contents for cell in function.__closure__ or ()]))
        return None if values is None else (function.__code__, values)
    return None


def _value_signatures(values: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The values a function closes over or is given as a hashable tuple (functions by their signature), or None
    where one is not a plain immutable value (a number, string, dtype, op or a tuple of them): an object compared
    by identity could change between calls without changing the signature."""
    signatures = []
    for value in values:
        if value.__class__ in PLAIN_CLASSES:  # (most values: one set lookup instead of three isinstance calls)
            signatures.append(value)
            continue
        if isinstance(value, (types.FunctionType, functools.partial)):
            value = function_signature(value)
            if value is None:
                return None
        elif isinstance(value, tuple):
            value = _value_signatures(value)
            if value is None:
                return None
        elif not isinstance(value, PLAIN_VALUES):
            return None
        signatures.append(value)
    return tuple(signatures)


TEMPLATES = GraphTemplates()
