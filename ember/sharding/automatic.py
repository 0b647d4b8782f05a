"""Automatic sharding (config `sharding.auto` / EMBER_AUTO_SHARD=1): a large kernel output is split along its
first dim; every compute device computes its rows from copies of the inputs, and the rows are joined where the
output lives."""

from __future__ import annotations

from typing import cast

from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.shapes import prod
from ember.core.walk import compute_bottom_up
from ember.scheduler.devices import get_device

MINIMUM_ELEMENTS = 1 << 20  # outputs smaller than this are not worth the copies


def compute_devices() -> list[str]:
    """Every available device that runs kernels (dummy and storage devices excluded)."""
    from ember.backends.registry import REGISTRY

    names: list[str] = []
    for backend, devices in REGISTRY.available().items():
        if backend in ("dummy", "disk"):
            continue
        names.extend(device.name for device in devices if device.info.can_run)
    return names


def _clone(root: Node, device: str, memo: dict[int, Node]) -> Node:
    """root's graph rebuilt on `device`: realized leaves arrive by COPY, constants are recreated."""

    def sources(node: Node) -> tuple[Node, ...]:
        return () if node.realized or node.op in (Op.CONST, Op.ARANGE) else node.srcs

    def clone(node: Node) -> Node:
        if node.realized:
            return node if node.device == device else Node(Op.COPY, (node,), device, node.shape, node.dtype, device)
        if node.op in (Op.CONST, Op.ARANGE):
            return Node(node.op, (), node.arg, node.shape, node.dtype, device)
        if node.op is Op.COPY:
            return memo[id(node.srcs[0])]
        return Node(node.op, tuple(memo[id(source)] for source in node.srcs), node.arg, node.shape, node.dtype,
                    device)

    return compute_bottom_up(root, sources, clone, memo)


def shard_plan(root: Node, devices: list[str]) -> Node | None:
    """A node computing root's value with its first dim split across devices, or None if it is not worth it."""
    if root.op in (Op.COPY, Op.BUFFER) or not root.shape or prod(root.shape) < MINIMUM_ELEMENTS:
        return None
    if len(devices) < 2 or root.shape[0] < len(devices) or not get_device(cast(str, root.device)).info.can_run:
        return None
    rows = root.shape[0]
    base, extra = divmod(rows, len(devices))
    joined, start = None, 0
    for index, device in enumerate(devices):
        length = base + (1 if index < extra else 0)
        bounds = ((start, start + length),) + tuple((0, size) for size in root.shape[1:])
        part = Node(Op.SHRINK, (_clone(root, device, {}),), bounds, (length, *root.shape[1:]), root.dtype, device)
        if device != root.device:
            part = Node(Op.COPY, (part,), root.device, part.shape, part.dtype, root.device)
        padding = ((start, rows - start - length),) + ((0, 0),) * (len(root.shape) - 1)
        fill = False if root.dtype.is_bool else 0
        placed = Node(Op.PAD, (part,), (padding, fill), root.shape, root.dtype, root.device)
        if joined is None:
            joined = placed
        else:
            combine = Op.OR if root.dtype.is_bool else Op.ADD
            joined = Node(combine, (joined, placed), None, root.shape, root.dtype, root.device)
        start += length
    return joined
