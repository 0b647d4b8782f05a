"""Graph walks without recursion (a graph can be as deep as a chain of 100,000 ops): post-order, and nested
evaluation of computations that need other computations' values, all on explicit stacks: the only hand-written
graph walks of ember's IR and backends."""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable, Iterable
from typing import Any, TypeVar

Request = TypeVar("Request")
Value = TypeVar("Value")
Node = TypeVar("Node")
Computation = Generator[Request, Value, Value]  # yields the requests it needs, is sent their values, returns its own


def post_order(starts: Iterable[Node], children: Callable[[Node], Iterable[Node]]) -> list[Node]:
    """Every node reachable from `starts` through `children` (compared by identity), once, each after its
    children: the one topological walk of graphs, IR DAGs and autograd histories. Starts are visited in order and
    a node's children from last to first (pass them reversed to visit the first child first)."""
    ordered: list[Node] = []
    placed: set[int] = set()
    stack = [(start, False) for start in reversed(list(starts))]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            ordered.append(node)
            continue
        if id(node) in placed:
            continue
        placed.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in children(node) if id(child) not in placed)
    return ordered


def pre_order(starts: Iterable[Node], children: Callable[[Node], Iterable[Node]]) -> list[Node]:
    """Every node reachable from `starts` through `children` (compared by identity), once, in the order a
    depth-first search first reaches it (a node before its children; children from last to first, as in
    `post_order`). `children` is called once per node, in this order, so it may also decide where the search
    stops (return no children)."""
    ordered: list[Node] = []
    placed: set[int] = set()
    stack = list(starts)[::-1]
    pop, extend, place, append = stack.pop, stack.extend, placed.add, ordered.append
    while stack:
        node = pop()
        if id(node) in placed:  # (a child reached before is pushed anyway and skipped here: the same order)
            continue
        place(id(node))
        append(node)
        extend(children(node))
    return ordered


def compute_bottom_up(root: Node, sources: Callable[[Node], Iterable[Node]], compute: Callable[[Node], Value],
                      memo: dict[int, Value]) -> Value:
    """The value of `root`: `compute(node)` is called for each node not yet in `memo` (keyed by id), after the
    nodes of `sources(node)`, and may read their values from `memo`."""
    if id(root) in memo:
        return memo[id(root)]
    for source in sources(root):
        if id(source) not in memo:
            break
    else:  # every source known (the common case): no walk to set up
        value = memo[id(root)] = compute(root)
        return value
    for node in post_order([root], lambda node: [source for source in sources(node) if id(source) not in memo]):
        memo[id(node)] = compute(node)
    return memo[id(root)]


def evaluate(request: Request, key_of: Callable[[Request], Hashable] | None,
             computation: Callable[[Request], Computation], memo: dict[Any, Value]) -> Value:
    """The value of `request`, memoized in `memo` by `key_of(request)` (key_of None: by the request itself, for
    requests that hash and compare as keys do: tuples of ints and of objects compared by identity).

    `computation(request)` is a generator that yields each request whose value it needs (it is sent that value)
    and returns its own value. The suspended generators wait on an explicit stack, so nesting as deep as a graph
    (a chain of 100,000 ops) takes memory, not Python frames, and everything runs in the order a recursive
    evaluation would run it: code that builds hash-consed nodes builds the same nodes in the same order."""
    key = request if key_of is None else key_of(request)
    if key in memo:
        return memo[key]
    stack = [(key, computation(request))]
    value: Any = None
    while stack:
        key, running = stack[-1]
        try:
            needed = running.send(value)
        except StopIteration as finished:
            stack.pop()
            value = memo[key] = finished.value
            continue
        needed_key = needed if key_of is None else key_of(needed)
        if needed_key in memo:
            value = memo[needed_key]
        else:
            stack.append((needed_key, computation(needed)))
            value = None
    return value
