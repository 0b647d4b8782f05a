"""In-place writes: a kernel computing an assigned value reuses the buffer of the node the assign replaced, when
nothing else can read that buffer any more and the kernel reads it only at the output's own index."""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from ember.backends.base import Device
from ember.core import views
from ember.core.graph import Node
from ember.core.ops import ELEMENTWISE_OPS, MOVEMENT_OPS, Op
from ember.core.shapes import prod
from ember.core.walk import post_order
from ember.scheduler.buffers import Buffer


SMALL_ASSIGN_BYTES = 1 << 16  # an assigned value this small may get a new buffer without the in-place analysis


def new_buffer_will_do(output: Node) -> bool:
    """Whether `output`, an assigned value of at most SMALL_ASSIGN_BYTES, may be computed into a new buffer without
    asking reusable_buffer: the node it replaces holds a buffer of its own (not a view: an incremental write goes
    into its view) that nothing else refers to (no capture's bindings), so nothing can tell the new buffer from the
    old one. reusable_buffer walks the graph under `output` and counts references (a batch norm's running
    statistics: ~30 us of Python per assign, 18 per ResNet step); a small buffer comes from the pool in ~1 us."""
    old = output.replaces
    buffer = None if old is None else old.buffer
    # getrefcount counts its argument, this frame's `buffer` and `old.buffer`
    return buffer.__class__ is Buffer and buffer.nbytes <= SMALL_ASSIGN_BYTES and sys.getrefcount(buffer) == 3


def reusable_buffer(output: Node, inputs: list[Node], held_by_schedule: int, device: Device) -> Buffer | None:
    """The buffer of `output.replaces` when `output`'s kernel may write into it, else None.

    The caller knows that no later command of the schedule reads the replaced node; `held_by_schedule` is how many
    references the executor's table itself holds to it (0 or 1). Any other holder (a tensor, a lazy graph not in this
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
    if references is None or _fused_reader_held_elsewhere(output, old):
        return None
    read = sum(node is old for node in inputs)
    if read and not device.info.output_may_alias_input:
        return None
    expected = 1 + held_by_schedule + references + read
    # getrefcount counts its own argument and this frame's `old`
    if sys.getrefcount(old) - 2 != expected:
        if not views.ORPHANED:
            return None
        views.compact_orphans()  # a storage left over from a view of a tensor that is gone may hold it
        if sys.getrefcount(old) - 2 != expected:
            return None
    return buffer


def _aligned_references(output: Node, old: Node) -> int | None:
    """How many source slots of the unrealized nodes under `output` hold `old`, or None when the kernel could read
    `old` at another index than the one it writes: some path from `output` to `old` passes a reduce, or movement ops
    that together move elements (a write through a view crops, pads and permutes, but back to where it read)."""
    slots: set[tuple[int, int]] = set()
    seen: set[tuple[int, tuple[int, ...] | None]] = set()
    moved: dict[tuple[int, ...], bool] = {}  # by chain of movement ops: whether it reads elsewhere
    stack: list[tuple[Node, tuple[Node, ...] | None]] = [(output, ())]  # None: not aligned any more
    while stack:
        node, chain = stack.pop()
        key = (id(node), None if chain is None else tuple(map(id, chain)))
        if key in seen:
            continue
        seen.add(key)
        if len(seen) > MAX_PATHS:
            return None
        op = node.op
        below = chain if op in ELEMENTWISE_OPS or chain is None else (*chain, node) if op in MOVEMENT_OPS else None
        for slot, source in enumerate(node.srcs):
            if source is old:
                if below is None:
                    return None
                if below:
                    ids = tuple(map(id, below))
                    if ids not in moved:
                        moved[ids] = _moves_elements(below, old)
                    if moved[ids]:
                        return None
                slots.add((id(node), slot))
            elif not source.realized:
                stack.append((source, below))
    return len(slots)


def _fused_reader_held_elsewhere(output: Node, old: Node) -> bool:
    """Whether a node that output's kernel computes inline on the way to reading `old` (an unrealized node between
    them) is also held by something the kernel does not compute: a tensor, or a lazy graph realized later, would
    then read `old`'s buffer after the kernel overwrote it (`d = g + p; p -= d; p.realize(); d` must read the old p).
    Such a node's references must all be source slots of the nodes between output and `old`."""
    readers = _readers_between(output, old)
    slots = _reader_slots(output, readers)
    # getrefcount counts its argument and the list `readers` (the walk's own references went with its frame)
    return any(sys.getrefcount(readers[position]) - 2 != slots[position] for position in range(len(readers)))


def _readers_between(output: Node, old: Node) -> list[Node]:
    """The unrealized nodes under output that read `old` (through unrealized nodes), each after its sources, output
    itself left out."""
    order = post_order((output,), lambda node: [source for source in node.srcs
                                                if source is not old and not source.realized])
    reading: set[int] = set()
    for node in order:
        if any(source is old or id(source) in reading for source in node.srcs):
            reading.add(id(node))
    return [node for node in order[:-1] if id(node) in reading]  # (output comes last)


def _reader_slots(output: Node, readers: list[Node]) -> list[int]:
    """For each of `readers`, how many source slots of output and of the readers hold it."""
    position = {id(node): index for index, node in enumerate(readers)}
    slots = [0] * len(readers)
    for node in (output, *readers):
        for source in node.srcs:
            if id(source) in position:
                slots[position[id(source)]] += 1
    return slots


MAX_PATHS = 256  # (node, movement chain) pairs the walk visits before it gives up on writing in place


def _moves_elements(chain: tuple[Node, ...], old: Node) -> bool:
    """Whether the movement ops of `chain` (outermost first, the last one reading `old`) read some element of `old`
    at another position than the one they give it (padded positions read nothing)."""
    steps = tuple((node.op, node.arg[0] if node.op is Op.PAD else node.arg) for node in reversed(chain))
    return _moves(old.shape, steps)


@functools.lru_cache(maxsize=1024)
def _moves(shape: tuple[int, ...], steps: tuple[tuple[Op, Any], ...]) -> bool:
    """_moves_elements by the shape of `old` and the movement steps from it (first first), answered by moving the
    positions of its elements (once per such chain: a training loop writes through the same views every step)."""
    positions = np.arange(prod(shape), dtype=np.int64).reshape(shape)
    for op, arg in steps:
        if op is Op.RESHAPE:
            positions = positions.reshape(arg)
        elif op is Op.PERMUTE:
            positions = positions.transpose(arg)
        elif op is Op.EXPAND:
            positions = np.broadcast_to(positions, arg)
        elif op is Op.SHRINK:
            positions = positions[tuple(slice(start, end) for start, end in arg)]
        elif op is Op.PAD:
            positions = np.pad(positions, arg, constant_values=-1)
        else:  # FLIP
            positions = np.flip(positions, arg)
    flat = positions.reshape(-1)
    return bool(((flat != np.arange(flat.size)) & (flat >= 0)).any())


def schedule_hold(old: Node, live: list[Node | None], last_use: Mapping[int, int], position: int) -> int | None:
    """How many references the executor's table `live` holds to `old` at command `position` (0 or 1), or None when a
    later command of the program still reads it."""
    # (list.count and list.index find `old` by identity at C speed: nodes compare by identity; counting first, no
    # search fails: a failed list.index formats the node's repr into its error, ~3 us an assign)
    index = -1
    held = live.count(old)
    for _ in range(held):
        index = live.index(old, index + 1)
        if last_use[index] > position:
            return None
    return held
