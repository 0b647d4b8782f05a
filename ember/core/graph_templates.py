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

`function_signature` names a build function by its code and the values it closes over, so that compositions
recorded for autograd (`Tensor._recorded`: exp, sigmoid, relu, softmax, ...) are templated by the function they
run: a closure over a tensor, or over a value that cannot be hashed, has no signature (it runs every time)."""

from __future__ import annotations

import functools
import types
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ember.context import CONTEXT
from ember.core import runtime
from ember.core.dtype import DType
from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.walk import post_order

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

MAX_TEMPLATES = 256
PLAIN_VALUES = (type(None), bool, int, float, complex, str, DType, Op)  # values a signature holds as they are
FREE_LEAVES = (Op.CONST, Op.ARANGE)  # leaves a template makes again at each instantiation
BUFFER = Op.BUFFER

# one entry per node after the inputs, sources first: (op, source positions, arg, shape, dtype, device), positions
# counting the inputs first
_UNSEEN: Any = object()  # (a signature without an entry yet)
Entry = tuple[Op, tuple[int, ...], Any, tuple[int, ...], Any, "str | None"]
Template = tuple[tuple[Entry, ...], tuple["int | None", ...]]  # the entries, and the results' positions


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
        from ember.core.tensor import Tensor

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
        entries, outputs = template
        nodes = input_nodes
        append = nodes.append
        for op, positions, arg, shape, dtype, device in entries:
            count = len(positions)  # (one or two sources without a list: most nodes)
            sources = ((nodes[positions[0]],) if count == 1 else (nodes[positions[0]], nodes[positions[1]])
                       if count == 2 else tuple([nodes[position] for position in positions]))
            append(Node(op, sources, arg, shape, dtype, device))
        if not many:
            return Tensor._from_node(nodes[-1])
        return tuple(None if position is None else Tensor._from_node(nodes[position]) for position in outputs)


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
    return tuple(entries), tuple(None if result is None else position[id(result.node)] for result in results)


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
