"""Placement, a scheduler pass: the device each recorded op runs on, and the COPY nodes that bring its sources
there. Core records ops with their sources as they are; `device_of` answers `Tensor.device` before a realize and
`placed_sources` moves the sources during the schedule's walk at realize time."""

from __future__ import annotations

from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.walk import compute_bottom_up, post_order
from ember.scheduler.devices import get_default_device, get_device

FREE_SOURCES = (Op.CONST, Op.ARANGE)  # recreated on the target device instead of copied
_computes_here: dict[str, bool] = {}  # device name -> whether ops on it alone run there (False: storage, e.g. disk)


def device_of(node: Node) -> str:
    """The device `node` runs on, deciding it (memoized in node.device) for it and the undecided nodes below it,
    sources first, without recursion: the same answer before and at realize time."""
    if node.device is None:
        if all(source.device is not None for source in node.srcs):
            node.device = _decide(node)
        else:
            compute_bottom_up(node, lambda below: [source for source in below.srcs if source.device is None],
                              _decide_in_place, {})
    return node.device  # type: ignore[return-value]


def _decide_in_place(node: Node) -> str:
    node.device = _decide(node)
    return node.device


def _decide(node: Node) -> str:
    """The rule: the sources' device when they share one that computes, else `choose_device`."""
    first = node.srcs[0].device
    assert first is not None
    if all(source.device == first for source in node.srcs) and _runs_ops(first):
        return first
    return choose_device(node.srcs)


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


def placed_sources(node: Node) -> tuple[Node, ...]:
    """node's sources after placing it: those on another device are replaced (in node.srcs) by a COPY to its
    device or a constant recreated there. The schedule's walk uses this as its children, so placing a graph costs
    no walk of its own; a COPY keeps its source where it is."""
    sources = node.srcs
    if not sources or node.op is Op.COPY:
        return sources
    device = node.device if node.device is not None else device_of(node)
    for source in sources:
        if (source.device if source.device is not None else device_of(source)) != device:
            node.srcs = sources = tuple(move_source(source, device) for source in sources)
            break
    return sources


def place(roots: list[Node]) -> None:
    """Place every node under `roots` (as a realize does; for passes that look at a graph before its schedule)."""
    post_order(roots, placed_sources)
