"""Automatic sharding: a large kernel output that a rule of decision.py splits is computed in boxes along one axis,
each on its device from the slices of the inputs it reads (slicing.py), and the boxes are joined where the output
lives. EMBER_AUTO_SHARD=0 turns it off, =1 splits every large output evenly by rows; unset, the rules decide."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import cast

from ember.core.graph import Node
from ember.core.ops import Op
from ember.sharding.decision import MINIMUM_ELEMENTS, Decision, decide, sharing_devices
from ember.sharding.slicing import SlicedGraph, box

__all__ = ["MINIMUM_ELEMENTS", "RECENT", "compute_devices", "shard_plan", "split_plan"]

RECENT: deque[Decision] = deque(maxlen=16)  # the last splits decided (EMBER_DEBUG prints each; tests read them)


class _Found:
    devices: list[str] | None = None
    probed = -1  # how many backends had devices when they were listed


def compute_devices() -> list[str]:
    """Every available device that runs kernels for speed: dummy and storage devices excluded, and devices that only
    simulate another to check its kernels (`DeviceInfo.extra["simulates"]`, the tests' PTX simulator). Probes every
    backend the first time; listed again only when a backend was probed since."""
    from ember.backends.registry import REGISTRY

    listed = _listed()
    if listed is not None:
        return listed
    names: list[str] = []
    for backend, devices in REGISTRY.available().items():
        if backend in ("dummy", "disk"):
            continue
        names.extend(device.name for device in devices
                     if device.info.can_run and "simulates" not in device.info.extra)
    _Found.devices, _Found.probed = names, len(REGISTRY.devices)
    return names


def _may_share(home: str) -> bool:
    """Whether decision.py's rules could split work of `home` across the listed devices: home is one of them and
    another is not on home's cores where home's are the host's (its candidates); True while the devices are not
    listed (the rules then list them only where they need to). An output past MINIMUM_ELEMENTS on a machine of host
    devices alone (the c backend, PoCL, lavapipe) then skips the rules' walk of its graph (a batched matmul realized
    each time: ~35 us of its 1 ms)."""
    names = _listed()
    if names is None:
        return True
    return len(sharing_devices(home, names, set())) >= 2  # (before the dtypes: the rules check those)


def _listed() -> list[str] | None:
    """compute_devices' listing where no backend was probed since it was made, else None (list them again)."""
    from ember.backends.registry import REGISTRY

    return _Found.devices if _Found.probed == len(REGISTRY.devices) else None


def split_plan(root: Node, decision: Decision) -> Node:
    """A node computing root's value as the decision's boxes, each on its device, joined on root's device."""
    home = cast(str, root.device)
    joined: Node | None = None
    start = 0
    size = root.shape[decision.axis]
    fill = False if root.dtype.is_bool else 0
    for device, length in zip(decision.devices, decision.lengths):
        bounds = tuple((start, start + length) if axis == decision.axis else (0, extent)
                       for axis, extent in enumerate(root.shape))
        part = box(root, bounds, SlicedGraph(device))
        if device != home:
            part = Node(Op.COPY, (part,), home, part.shape, part.dtype, home)
        else:  # its own kernel: computed inside the join, behind the padding's test, a matmul ran 3x slower on c
            part = Node(Op.CONTIGUOUS, (part,), None, part.shape, part.dtype, home)
        padding = tuple((start, size - start - length) if axis == decision.axis else (0, 0)
                        for axis in range(len(root.shape)))
        if any(amount != (0, 0) for amount in padding):
            part = Node(Op.PAD, (part,), (padding, fill), root.shape, root.dtype, home)
        if joined is None:
            joined = part
        else:
            combine = Op.OR if root.dtype.is_bool else Op.ADD
            joined = Node(combine, (joined, part), None, root.shape, root.dtype, home)
        start += length
    return cast(Node, joined)


def shard_plan(root: Node, devices: list[str] | Callable[[], list[str]], forced: bool | None = True) -> Node | None:
    """A node computing root's value split across devices as decided (forced=True: evenly by rows, today's
    EMBER_AUTO_SHARD=1), or None to compute it where it is."""
    if forced is None and devices is compute_devices and not _may_share(cast(str, root.device)):
        return None
    decision = decide(root, forced, devices)
    if decision is None or (decision.devices == [root.device] and decision.lengths == [root.shape[decision.axis]]):
        return None
    RECENT.append(decision)
    return split_plan(root, decision)
