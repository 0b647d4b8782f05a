"""Placement: where an op on tensors from several devices runs, and the copies that bring its inputs there."""

from __future__ import annotations

from ember.core.graph import Node
from ember.core.ops import Op
from ember.scheduler.devices import get_device

FREE_SOURCES = (Op.CONST, Op.ARANGE)  # recreated on the target device instead of copied


def choose_device(nodes: tuple[Node, ...]) -> str:
    """The device an op on these nodes runs on: where most of its input bytes live, among devices that can run
    kernels and support the dtypes; ties go to the first source's device."""
    weight: dict[str, int] = {}
    for node in nodes:
        if node.op in FREE_SOURCES:
            continue
        weight[node.device] = weight.get(node.device, 0) + node.size * node.dtype.itemsize
    if not weight:
        return compute_device(nodes[0].device)
    dtypes_used = {node.dtype for node in nodes}
    order = list(weight)
    candidates = [
        name for name in order
        if get_device(name).info.can_run and not get_device(name).info.unsupported(dtypes_used)
    ]
    if not candidates:  # every input is in storage (e.g. a file on disk): compute on the default device
        from ember.scheduler.devices import get_default_device

        return get_default_device()
    return max(candidates, key=lambda name: (weight[name], -order.index(name)))


def compute_device(device: str) -> str:
    """`device`, or the default device when `device` only stores data (disk)."""
    if get_device(device).info.can_run or device.startswith("dummy"):
        return device
    from ember.scheduler.devices import get_default_device

    return get_default_device()


def move_source(node: Node, device: str) -> Node:
    """`node` as seen from `device`: itself, a constant recreated there, or a COPY scheduled to bring it over."""
    if node.device == device:
        return node
    if node.op in FREE_SOURCES:
        return Node(node.op, (), node.arg, node.shape, node.dtype, device)
    return Node(Op.COPY, (node,), device, node.shape, node.dtype, device)
