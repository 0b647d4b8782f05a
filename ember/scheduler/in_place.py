"""In-place writes: a kernel computing an assigned value reuses the buffer of the node the assign replaced, when
nothing else can read that buffer any more and the kernel reads it only at the output's own index."""

from __future__ import annotations

import sys

from ember.backends.base import Device
from ember.core.graph import Node
from ember.core.ops import ELEMENTWISE_OPS
from ember.scheduler.buffers import Buffer


def reusable_buffer(output: Node, inputs: list[Node], held_by_schedule: int, device: Device) -> Buffer | None:
    """The buffer of `output.replaces` when `output`'s kernel may write into it, else None.

    The caller knows that no later command of the schedule reads the replaced node; `held_by_schedule` is how many
    references the realize loop itself holds to it (0 or 1). Any other holder (a tensor, a lazy graph not in this
    schedule) shows in its reference count, so the write is done only when every reference is accounted for: the
    `replaces` slot, the kernel's input list and the sources of the unrealized nodes the kernel computes. A kernel
    reading the buffer it writes needs `DeviceInfo.output_may_alias_input`."""
    old = output.replaces
    if old is None or old.buffer is None or not old.realized:
        return None
    buffer = old.buffer
    if buffer.size != output.size or buffer.dtype != output.dtype or buffer.device_name != output.device:
        return None
    references = _aligned_references(output, old)
    if references is None:
        return None
    read = sum(node is old for node in inputs)
    if read and not device.info.output_may_alias_input:
        return None
    expected = 1 + held_by_schedule + references + read
    # getrefcount counts its own argument and this frame's `old`
    if sys.getrefcount(old) - 2 != expected:
        return None
    return buffer


def _aligned_references(output: Node, old: Node) -> int | None:
    """How many source slots of the unrealized nodes under `output` hold `old`, or None when some path from
    `output` to `old` passes a movement op or a reduce (the kernel would read it at another index)."""
    count = 0
    seen: set[int] = set()
    stack = [(output, True)]
    while stack:
        node, aligned = stack.pop()
        key = id(node) * 2 + aligned
        if key in seen:
            continue
        seen.add(key)
        aligned_below = aligned and node.op in ELEMENTWISE_OPS
        for source in node.srcs:
            if source is old:
                if not aligned_below:
                    return None
                count += 1
            elif not source.realized:
                stack.append((source, aligned_below))
    return count


def schedule_hold(old: Node, live: list[Node | None], last_use: dict[int, int], position: int) -> int | None:
    """How many references the realize loop's `live` table holds to `old` at `position` (0 or 1), or None when a
    later command of the schedule still reads it."""
    held = 0
    for index, node in enumerate(live):
        if node is old:
            if last_use[index] > position:
                return None
            held += 1
    return held
