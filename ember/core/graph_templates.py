"""Graph templates: a composition of primitive ops on leaf inputs recorded once per signature, then instantiated by
copying its nodes (no Tensor methods, shape checks or broadcasting run again): the per-step cost of random draws.

A template is the lazy graph `build(*inputs)` records on stand-in leaves of the inputs' shapes, dtypes and devices.
Instantiating it makes fresh nodes of the same ops, arguments, shapes, dtypes and devices over the real inputs,
so the result is the graph `build` would have recorded on them, node for node (the scheduler caches and fuses it
like any other). What `build` may do: record primitive ops on its inputs and on constants it makes (CONST, ARANGE);
its result must depend on nothing but the signature and the inputs' graphs (no values read, no other tensors). A
build that reaches any other leaf, or whose graph carries value checks, is not templated: it runs every time."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.walk import post_order

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

MAX_TEMPLATES = 256
FREE_LEAVES = (Op.CONST, Op.ARANGE)  # leaves a template makes again at each instantiation

# one entry per node after the inputs, sources first: (op, source positions, arg, shape, dtype, device), positions
# counting the inputs first
Entry = tuple[Op, tuple[int, ...], Any, tuple[int, ...], Any, "str | None"]


class GraphTemplates:
    """Signature -> the recorded entries of `build`'s graph (None: not templatable, `build` runs each time); least
    recently used signatures dropped."""

    def __init__(self) -> None:
        self.entries: OrderedDict[Hashable, tuple[Entry, ...] | None] = OrderedDict()
        self.recorded = 0  # builds recorded as templates
        self.instantiated = 0  # graphs made by copying a template

    def instantiate(self, signature: Hashable, build: Callable[..., Tensor], inputs: tuple[Tensor, ...]) -> Tensor:
        """build(*inputs), from the template of `signature` (recorded by this call when there is none yet).
        `signature` must name everything besides the inputs' shapes, dtypes and devices that `build` depends on."""
        from ember.core.tensor import Tensor

        input_nodes = [tensor.node for tensor in inputs]
        for tensor, node in zip(inputs, input_nodes):
            if node.op is not Op.BUFFER or node.checks is not None or tensor._requires_grad:
                return build(*inputs)  # (a template's inputs are plain leaves)
        key = (signature, *[(node.shape, node.dtype, node.device) for node in input_nodes])
        if key in self.entries:
            template = self.entries[key]
            self.entries.move_to_end(key)
        else:
            template = self.entries[key] = _record(build, input_nodes)
            self.recorded += template is not None
            if len(self.entries) > MAX_TEMPLATES:
                self.entries.popitem(last=False)
        if template is None:
            return build(*inputs)
        self.instantiated += 1
        nodes = input_nodes
        append = nodes.append
        for op, positions, arg, shape, dtype, device in template:
            append(Node(op, tuple([nodes[position] for position in positions]), arg, shape, dtype, device))
        return Tensor._from_node(nodes[-1])


def _record(build: Callable[..., Tensor], input_nodes: list[Node]) -> tuple[Entry, ...] | None:
    """The entries of build's graph on stand-ins of the input nodes, or None where it is not a template's."""
    from ember.core.tensor import Tensor

    stand_ins = [Node(Op.BUFFER, (), None, node.shape, node.dtype, node.device) for node in input_nodes]
    result = build(*[Tensor._from_node(node) for node in stand_ins])
    if result._requires_grad:
        return None
    position = {id(node): index for index, node in enumerate(stand_ins)}
    entries: list[Entry] = []
    for node in post_order([result.node], lambda node: node.srcs):
        if id(node) in position:
            continue
        if node.checks is not None or node.replaces is not None or (not node.srcs and node.op not in FREE_LEAVES):
            return None  # a value check, an in-place assign, or a leaf of its own (a buffer, host data)
        position[id(node)] = len(input_nodes) + len(entries)
        entries.append((node.op, tuple(position[id(source)] for source in node.srcs), node.arg, node.shape,
                        node.dtype, node.device))
    if not entries:  # (build returned an input itself)
        return None
    return tuple(entries)


TEMPLATES = GraphTemplates()
