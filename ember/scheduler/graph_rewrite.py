"""Graph rewrites, a scheduler pass: before a graph whose schedule is not cached is kernelized, its nodes are
rewritten by the exact rules of graph_rules.py (identities, constant folding, the integer distributive law), and the
rewritten graph is what the kernelizer fuses. The pass runs once per graph structure (the schedule cache keeps the
program by the original graph's key), so eager code pays nothing per op for it; EMBER_REWRITES=0 (settings.py) turns
it off.

The original graph is never changed: each node gets an image, itself where nothing below it changed, else a new node
of the same shape, dtype and device holding the same value. A program's slots are positions in the original graph
(what realize binds to the user's nodes), so each image is written into the slot of the first original node it
stands for, and each root's image into the root's slot: a root that would become a realized buffer or another root's
value keeps its own op over the rewritten sources (the user's tensor gets its own buffer). A node that a rule made up
(b + c of a*(b + c)) has no slot; the schedule cache kernelizes the original graph when one would be stored."""

from __future__ import annotations

from typing import Any, NamedTuple

from ember.core.dtype import DType
from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.shapes import Shape
from ember.core.walk import post_order
from ember.scheduler.graph_rules import DISTRIBUTIVE, RULES, RuleTable

BUFFER = Op.BUFFER
MAX_FIRINGS = 64  # rules fired on one node before it is taken as it is (every rule shrinks the graph: a guard)


class Rewriter:
    """Rewrites nodes with a rule table: `make` builds a node and rewrites it; `rebuild` gives every node of a graph
    its image. `readers`: how many nodes (and roots) read each node of the graph being rewritten, for rules that
    pay off only when a value is read once."""

    def __init__(self, rules: RuleTable, readers: dict[Node, int] | None = None, shared: bool = False) -> None:
        self.rules = rules
        self.readers: dict[Node, int] = readers if readers is not None else {}
        self.fired: dict[str, int] = {}  # rule name -> times it fired (for tests and debug output)
        # `shared`: equal nodes (same op, arg, sources, shape, dtype and device) become one, by their key
        self.canonical: dict[tuple, Node] | None = {} if shared else None

    def make(self, op: Op, sources: tuple[Node, ...], arg: Any, shape: Shape, dtype: DType, device: str | None) -> Node:
        """A new node of `op` over rewritten sources, rewritten."""
        return self.normal(Node(op, sources, arg, shape, dtype, device))

    def normal(self, node: Node) -> Node:
        """`node` (its sources rewritten already) with rules fired on it until none does."""
        by_op = self.rules.by_op
        for _ in range(MAX_FIRINGS):
            if node.op not in by_op:
                return node
            fired = self.rules.fire(self, node)
            if fired is None:
                return node
            replacement, rule = fired
            assert replacement.shape == node.shape and replacement.dtype == node.dtype, (rule.name, node, replacement)
            self.fired[rule.name] = self.fired.get(rule.name, 0) + 1
            node = replacement
        return node

    def rebuild(self, order: list[Node]) -> dict[Node, Node]:
        """The image of each node of `order` (sources before their readers): the node itself where neither it nor a
        source changed."""
        image: dict[Node, Node] = {}
        for node in order:
            sources = node.srcs
            if not sources:
                image[node] = node if node.op is BUFFER else self.shared(node)
                continue
            rewritten = tuple(image[source] for source in sources)
            current = node
            for new, old in zip(rewritten, sources):
                if new is not old:
                    current = Node(node.op, rewritten, node.arg, node.shape, node.dtype, node.device)
                    break
            image[node] = self.shared(self.normal(current))
        return image

    def shared(self, node: Node) -> Node:
        """The first node equal to `node` that this rewriter has seen (common subexpressions become one node: the
        same op on the same sources computes the same values), or `node` itself."""
        canonical = self.canonical
        if canonical is None or node.op is BUFFER:
            return node
        try:
            key = (node.op, _arg_key(node.arg), tuple(map(id, node.srcs)), node.shape, node.dtype, node.device)
            return canonical.setdefault(key, node)
        except TypeError:  # an arg that does not hash: left as it is
            return node


def _arg_key(arg: Any) -> Any:
    """An op's arg as a key that tells apart what equality does not (0.0 from -0.0: floats by their hex form)."""
    if isinstance(arg, float):
        return arg.hex()
    if isinstance(arg, (tuple, list)):
        return tuple(map(_arg_key, arg))
    return arg


class Rewritten(NamedTuple):
    """A rewritten graph: its `roots` (one per original root, in order) and `slots`, the slot (position in the
    original graph's node list) of each rewritten node that has one, by id."""

    roots: list[Node]
    slots: dict[int, int]
    fired: dict[str, int]  # rule name -> times it fired
    images: tuple[Node, ...]  # every node with a slot, held while the slots (by id) are in use


def rewrite_graph(nodes: list[Node], roots: list[Node]) -> Rewritten | None:
    """The graph under `roots` rewritten, or None where no rule changes it. `nodes`: the placed graph in
    placement.place_graph's order (sources first, every root among them)."""
    first = Rewriter(RULES, shared=True)
    image = first.rebuild(nodes)
    rewritten_roots = [image[root] for root in roots]
    order = post_order(rewritten_roots, lambda node: node.srcs)
    readers: dict[Node, int] = dict.fromkeys(rewritten_roots, 1)  # (a root is read by its user)
    for node in order:
        for source in node.srcs:
            readers[source] = readers.get(source, 0) + 1
    second = Rewriter(DISTRIBUTIVE, readers)
    again = second.rebuild(order)
    final = {node: again.get(rewritten, rewritten) for node, rewritten in image.items()}
    if all(final[node] is node for node in nodes):
        return None
    slots: dict[int, int] = {}
    position_of: dict[Node, int] = {}
    for position, node in enumerate(nodes):
        position_of[node] = position
        slots.setdefault(id(final[node]), position)
    claimed = {id(root) for root in roots if final[root] is root}  # rewritten nodes written into a root's slot
    new_roots: list[Node] = []
    done: dict[Node, Node] = {}  # (a root listed twice is one root)
    for root in roots:
        target = done.get(root)
        if target is not None:
            new_roots.append(target)
            continue
        target = final[root]
        if target is not root:
            if id(target) in claimed:  # another root's value: a copy of it in a buffer of its own (an LSTM's two
                # bias gradients, equal sums over every time step's gate gradients: one sum and a copy, not two sums)
                target = Node(Op.CONTIGUOUS, (target,), None, root.shape, root.dtype, root.device)
            elif target.realized:  # the user's tensor gets a buffer of its own
                target = Node(root.op, tuple(final[source] for source in root.srcs), root.arg, root.shape,
                              root.dtype, root.device)
            slots[id(target)] = position_of[root]
            claimed.add(id(target))
        done[root] = target
        new_roots.append(target)
    fired = dict(first.fired)
    for name, count in second.fired.items():
        fired[name] = fired.get(name, 0) + count
    return Rewritten(new_roots, slots, fired, (*final.values(), *new_roots))
