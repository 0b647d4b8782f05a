"""Placement, a scheduler pass: the device each recorded op runs on, and the COPY nodes that bring its sources
there. Core records ops with their sources as they are; `device_of` answers `Tensor.device` before a realize and
`place_graph`, the placement pass of a realize's schedule, places the graph (`place_node` for each op, sources first):
the one place where nodes are placed and their sources rewritten."""

from __future__ import annotations

from ember.core.graph import Node
from ember.core.ops import Op
from ember.scheduler.devices import get_default_device, get_device

FREE_SOURCES = (Op.CONST, Op.ARANGE)  # recreated on the target device instead of copied
_computes_here: dict[str, bool] = {}  # device name -> whether ops on it alone run there (False: storage, e.g. disk)


def device_of(node: Node) -> str:
    """The device `node` runs on, deciding it (memoized in node.device) for it and the undecided nodes below it,
    sources first, on an explicit stack (a graph may be a chain of 100,000 ops): the same answer before and at
    realize time."""
    if node.device is None:
        stack = [node]
        while stack:
            top = stack[-1]
            for source in top.srcs:
                if source.device is None:
                    stack.append(source)
                    break
            else:
                stack.pop()
                if top.device is None:  # a node shared by two pending ones is decided once
                    top.device = _decide(top)
    return node.device  # type: ignore[return-value]


def _decide(node: Node) -> str:
    """The rule, for a node whose sources are placed: their device when they share one that runs ops, else
    `choose_device`."""
    sources = node.srcs
    first: str = sources[0].device  # type: ignore[assignment]
    for source in sources:
        if source.device != first:
            return choose_device(sources)
    runs_ops = _computes_here.get(first)
    if runs_ops is None:
        runs_ops = _runs_ops(first)
    return first if runs_ops else choose_device(sources)


def _runs_ops(device: str) -> bool:
    """Whether an op on sources that all live on `device` runs there (not for a storage device such as disk)."""
    answer = _computes_here.get(device)
    if answer is None:
        answer = _computes_here[device] = get_device(device).info.can_run or device.startswith("dummy")
    return answer


def choose_device(nodes: tuple[Node, ...]) -> str:
    """The device an op on these nodes runs on: where most of its input bytes live, among devices that can run
    kernels and support the dtypes; ties go to the first source's device."""
    weight: dict[str, int] = {}
    for node in nodes:
        if node.op in FREE_SOURCES:
            continue
        device = device_of(node)
        weight[device] = weight.get(device, 0) + node.size * node.dtype.itemsize
    if not weight:
        return compute_device(device_of(nodes[0]))
    dtypes_used = {node.dtype for node in nodes}
    order = list(weight)
    candidates = [
        name for name in order
        if get_device(name).info.can_run and not get_device(name).info.unsupported(dtypes_used)
    ]
    if not candidates:  # every input is in storage (e.g. a file on disk): compute on the default device
        return get_default_device()
    return max(candidates, key=lambda name: (weight[name], -order.index(name)))


def compute_device(device: str) -> str:
    """`device`, or the default device when `device` only stores data (disk)."""
    return device if _runs_ops(device) else get_default_device()


def move_source(node: Node, device: str) -> Node:
    """`node` as seen from `device`: itself, a constant recreated there, or a COPY scheduled to bring it over."""
    if node.device == device:
        return node
    if node.op in FREE_SOURCES:
        return Node(node.op, (), node.arg, node.shape, node.dtype, device)
    return Node(Op.COPY, (node,), device, node.shape, node.dtype, device)


def place_node(node: Node) -> tuple[Node, ...]:
    """Place a node whose sources are placed: decide its device if the query has not, and replace (in node.srcs)
    each source on another device by a COPY to it or a constant recreated there. Returns those new nodes (usually
    none). `place_graph` calls this for every node, sources first, so placing costs no walk of its own."""
    device = node.device
    if device is None:
        device = node.device = _decide(node)
    elif node.op is Op.COPY:  # a copy's source stays where it is
        return ()
    sources = node.srcs
    for source in sources:
        if source.device != device:
            break
    else:
        return ()
    node.srcs = tuple(move_source(source, device) for source in sources)
    return tuple(new for new, old in zip(node.srcs, sources) if new is not old)


def place_graph(roots: list[Node]) -> list[Node]:
    """The placement pass: place every node under `roots`, sources first, and return the graph's nodes in that order
    (a node used twice once; a COPY or a constant made again on a device just before the node reading it). The
    schedule's key (schedule.graph_key) is computed from this list and changes nothing; a placed graph placed again
    is left as it is."""
    if len(roots) == 1:  # one op on leaves (the per-op path): the walk's order without the walk
        root = roots[0]
        sources = root.srcs
        if sources:
            for source in sources:
                if source.srcs:
                    break
            else:
                if not place_node(root):  # (else the walk takes the new COPY nodes in its order)
                    count = len(sources)
                    if count == 1:
                        return [sources[0], root]
                    if count == 2:
                        first, second = sources
                        return [first, root] if first is second else [second, first, root]
                    nodes: list[Node] = []
                    for source in sources[::-1]:  # (the walk's stack takes the last source first)
                        if source not in nodes:
                            nodes.append(source)
                    nodes.append(root)
                    return nodes
    return _placing_walk(roots)


def _placing_walk(roots: list[Node]) -> list[Node]:
    """`place_graph` of any graph, by a walk from the roots."""
    placed: set[Node] = set()  # (nodes hash by identity)
    nodes: list[Node] = []
    # a post-order walk written out (this runs at every realize): a node stays on the stack until its sources are
    # placed and listed, then is placed and listed itself (a realized node has no sources)
    stack = roots[::-1]
    while stack:
        node = stack[-1]
        if node in placed:
            stack.pop()
            continue
        sources = node.srcs
        if sources:
            waiting = False
            for source in sources:
                if source not in placed:
                    stack.append(source)
                    waiting = True
            if waiting:
                continue
            moved = place_node(node)  # COPY nodes (or constants made again) bringing sources to its device
            if moved:
                for extra in moved:  # a leaf recreated on the device, or a COPY of a listed source
                    placed.add(extra)
                    nodes.append(extra)
        stack.pop()
        placed.add(node)
        nodes.append(node)
    return nodes
