"""Copies between pools: a COPY node's buffer filled from its source's, by the shortest route the pools offer."""

from __future__ import annotations

from typing import cast

import numpy as np

from ember.backends.base import COMPLETED, Event
from ember.context import CONTEXT
from ember.core.graph import Node
from ember.scheduler import profile
from ember.core.ops import Op
from ember.scheduler.buffers import Buffer, buffer_of, pending
from ember.scheduler.devices import get_device
from ember.scheduler.lock import acquire, release


def run_copy(output: Node, source_node: Node) -> None:
    """Enqueue the copy of a buffer into another pool after the command writing it; the executor goes on at
    once, and the launches reading the copy wait for its event."""
    source = buffer_of(source_node)
    target_device = get_device(cast(str, output.device))
    buffer = Buffer(target_device, output.size, output.dtype)
    wait_for = pending(source.event)
    event, route = enqueue_copy(buffer, source, wait_for)
    buffer.event = event
    source.add_reader(event)
    context = CONTEXT.get()  # (the calling thread's: ember/context.py)
    if context.recorder is not None:
        context.recorder.copy(buffer, source)
    for record in context.profiles:
        record.copies.append((source.device_name, target_device.name, buffer.nbytes))
    if context.debug_level >= 1:
        after = f", after {len(wait_for)} unfinished event{'s' * (len(wait_for) != 1)}" if wait_for else ""
        profile.debug_print(1, f"  copy {source.device_name} -> {target_device.name}: {buffer.nbytes} bytes "
                               f"({route}{after})")
    output.become_buffer(buffer)


def copied_leaf(node: Node) -> Node:
    """A new realized node holding a copy of realized `node`'s buffer in the same pool, enqueued after its writer (a
    buffer-to-buffer copy: no graph, schedule or kernel). Only outside recordings (ember.jit, traces: a copy made here
    is not one of their steps)."""
    acquire()
    try:
        source = buffer_of(node)
        buffer = Buffer(source.device, source.size, source.dtype)
        event, _ = enqueue_copy(buffer, source, pending(source.event))
        buffer.event = event
        source.add_reader(event)
        for record in CONTEXT.get().profiles:
            record.copies.append((source.device_name, source.device_name, buffer.nbytes))
    finally:
        release()
    copy = Node(Op.BUFFER, (), None, node.shape, node.dtype, source.device_name)
    copy.buffer = buffer
    return copy


def enqueue_copy(target: Buffer, source: Buffer, wait_for: tuple[Event, ...]) -> tuple[Event, str]:
    """Enqueue a copy of `source`'s bytes into `target` (another pool): directly when the target pool reaches the
    source pool, else through host memory (one copy when either pool is host memory, two through a staging array
    otherwise). Returns the copy's event and how it went."""
    nbytes = target.nbytes
    if nbytes == 0:
        return (wait_for[0] if len(wait_for) == 1 else COMPLETED), "empty"
    event = target.pool.copy_from(target.handle, source.pool, source.handle, nbytes, wait_for)
    if event is not None:
        return event, "direct"
    source_view = source.pool.host_view(source.handle, nbytes)
    if source_view is not None:
        return target.pool.copy_in_async(target.handle, source_view, wait_for), "from host memory"
    target_view = target.pool.host_view(target.handle, nbytes)
    if target_view is not None:
        return source.pool.copy_out_async(target_view, source.handle, wait_for), "into host memory"
    staging = np.empty(nbytes, dtype=np.uint8).data
    staged = source.pool.copy_out_async(staging, source.handle, wait_for)
    return target.pool.copy_in_async(target.handle, staging, (staged,)), "staged through host memory"
