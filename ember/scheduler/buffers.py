"""Device memory of realized nodes: Buffer, deferred frees behind events, uploads of host data, file mappings."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from ember.backends.base import COMPLETED, Device, Event, MemoryPool, wait_all
from ember.context import CONTEXT
from ember.core.dtype import DType
from ember.core.errors import OutOfMemoryError
from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.shapes import prod
from ember.scheduler.devices import get_device
from ember.scheduler.lock import SCHEDULER_LOCK, acquire, release


class Buffer:
    """Memory for one realized node, in one device's pool; released when the last node holding it is gone.

    `event` completes when the command writing the buffer (a launch or a copy) has finished; `users` holds the
    unfinished events of commands enqueued to read it. The memory goes back to its pool only when both are done
    (unless the pool frees behind events itself), so dropping a tensor never blocks and never frees memory in use.
    """

    # (__weakref__: a jit capture tells its last replay's inputs by weak references, jit._bound_for_inputs)
    __slots__ = ("__weakref__", "device", "device_name", "dtype", "event", "handle", "nbytes", "pool", "size", "users")

    def __init__(self, device: Device, size: int, dtype: DType, handle: Any = None) -> None:
        """Allocate from the device's pool, or adopt `handle` (memory the pool did not allocate, e.g. a mapping)."""
        self._describe(device, size, dtype)
        if handle is None:
            try:
                self.handle = self.pool.allocate(self.nbytes)
            except OutOfMemoryError:  # full: `allocate` waits for the dropped buffers still in use, if any, and retries
                self.handle = allocate(self.pool, self.nbytes)
        else:
            self.handle = handle
            self.pool.adopt(self.nbytes)
        for record in CONTEXT.get().profiles:
            record.bytes_allocated += self.nbytes

    def _describe(self, device: Device, size: int, dtype: DType) -> None:
        """Every field but the handle: where the buffer lives, what it holds, and no commands yet."""
        self.device = device
        self.pool = device.pool
        self.device_name = device.name
        self.size = size
        self.dtype = dtype
        self.nbytes = size * dtype.itemsize
        self.event: Event = COMPLETED
        self.users: list[Event] = []

    def add_user(self, event: Event) -> None:
        """Remember an enqueued command that reads this buffer (its memory must outlive the command)."""
        if not self.pool.frees_behind_events:
            self.add_reader(event)

    def add_reader(self, event: Event) -> None:
        """Remember an enqueued command that reads this buffer, also where the pool frees behind events: a copy out
        of it (OpenCL runs copies on a queue of their own, which the kernels' queue does not follow), which a
        command writing the buffer in place must wait for. Without it, a copy of a buffer enqueued before an
        in-place kernel read the kernel's output 9 times in 10 on opencl (a value held from before an optimizer's
        or clip_grad_norm_'s replayed step saw the step's result: step_replay.own_values)."""
        if not event.done:
            self.users = [user for user in self.users if not user.done]
            if event not in self.users:  # (a queue's one mark stands for all its launches: cuda's StreamMark)
                self.users.append(event)

    def __del__(self) -> None:
        try:
            if not acquire(False):  # another thread is using the pools: the buffer is released later
                DEFERRED_FREES.append((self.pool, self.handle, self.nbytes, [self.event, *self.users]))
                return
            try:
                pool = self.pool
                if pool.frees_behind_events or (not self.users and (self.event is COMPLETED or self.event.done)):
                    pool.release(self.handle, self.nbytes)
                    return
                waiting = [event for event in (self.event, *self.users) if not event.done]
                if waiting:
                    DEFERRED_FREES.append((self.pool, self.handle, self.nbytes, waiting))
                else:
                    self.pool.release(self.handle, self.nbytes)
            finally:
                release()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown may have torn the pool down already
            pass

    def read(self) -> np.ndarray:
        """The buffer's values; waits only for the command that writes it (and the copy out), not for the device."""
        array = np.empty(self.size, dtype=self.dtype.numpy)
        with SCHEDULER_LOCK:
            if self.nbytes:
                self.pool.copy_out_async(array.data.cast("B"), self.handle, pending(self.event)).wait()
            else:
                self.event.wait()
            release_finished()
        return array

    def write(self, array: np.ndarray) -> None:
        """Copy host values into this new buffer, waiting only for that copy (the caller's array may change next)."""
        if self.nbytes:
            with SCHEDULER_LOCK:
                self.pool.copy_in_async(self.handle, np.ascontiguousarray(array).data.cast("B")).wait()


# buffers dropped while commands still used them, or while another thread held the scheduler's lock (lock.py)
DEFERRED_FREES: list[tuple[MemoryPool, Any, int, list[Event]]] = []
MAX_DEFERRED_FREES = 1024  # beyond this many, a realize waits for them (an event may report done only once waited)


def release_finished(wait: bool = False) -> int:
    """Give back to their pools the dropped buffers whose commands have finished (with `wait`: all of them, after
    waiting for their events). Returns how many buffers are still waiting."""
    still: list[tuple[MemoryPool, Any, int, list[Event]]] = []
    with SCHEDULER_LOCK:
        while DEFERRED_FREES:
            pool, handle, nbytes, events = DEFERRED_FREES.pop()
            if wait:
                wait_all(events)
            if pool.frees_behind_events or all(event.done for event in events):
                pool.release(handle, nbytes)
            else:
                still.append((pool, handle, nbytes, events))
        DEFERRED_FREES.extend(still)
    return len(still)


def allocate(pool: MemoryPool, nbytes: int) -> Any:
    """Allocate from a pool; when it is full and dropped buffers wait behind events, wait for those and retry."""
    try:
        return pool.allocate(nbytes)
    except OutOfMemoryError:
        if not any(entry[0] is pool for entry in DEFERRED_FREES):
            raise
        release_finished(wait=True)
        return pool.allocate(nbytes)


def pending(*events: Event) -> tuple[Event, ...]:
    """The events that have not finished yet (what a command must wait for)."""
    return tuple(event for event in events if not event.done)


def buffer_of(node: Node) -> Buffer:
    """The device buffer of a realized node. A leaf made from host data (`ember.tensor`) gets its memory and its
    values here, at its first use by a kernel or a copy; its host copy is dropped then."""
    buffer = node.buffer
    if buffer is None:
        with SCHEDULER_LOCK:
            if node.buffer is not None:  # uploaded by another thread meanwhile (a tensor they share)
                return node.buffer
            array = node.arg
            buffer = Buffer(get_device(cast(str, node.device)), array.size, node.dtype)
            buffer.write(array.reshape(-1))
            node.buffer, node.arg = buffer, None
        recorder = CONTEXT.get().recorder
        if recorder is not None:
            recorder.upload(array, buffer)
    return buffer


def mapped_node(path: str, offset: int, shape: tuple[int, ...], dtype: DType, device_name: str = "disk:0") -> Node:
    """A realized leaf whose bytes stay in a file until a kernel needs them (a read-only memory map)."""
    device = get_device(device_name)
    size = prod(shape)
    node = Node(Op.BUFFER, (), None, tuple(shape), dtype, device.name)
    with SCHEDULER_LOCK:
        handle = device.pool.map_region(path, offset, size * dtype.itemsize)
        node.buffer = Buffer(device, size, dtype, handle)
    return node


def read_node(node: Node) -> np.ndarray:
    """The values of a realized node as a new numpy array of its shape."""
    return buffer_of(node).read().reshape(node.shape)


def write_node(node: Node, array: np.ndarray) -> None:
    """Overwrite a realized node's values in place with host values, once the commands writing or reading its buffer
    have finished: every tensor and every ember.jit replay reading that buffer sees the new values."""
    if not node.realized:
        raise ValueError("write_node: the node is not realized; only a realized tensor's buffer can be overwritten")
    values = np.ascontiguousarray(array, dtype=node.dtype.numpy).reshape(-1)
    if values.size != node.size:
        raise ValueError(f"write_node: {values.size} values for a node of {node.size} elements")
    buffer = node.buffer
    if buffer is None:  # host data not uploaded yet: its first use uploads the new values
        node.arg = values.reshape(node.shape)
        return
    with SCHEDULER_LOCK:
        wait_all(pending(buffer.event, *buffer.users))
        if buffer.pool.frees_behind_events:  # its readers are not tracked (add_user): wait for every command
            buffer.device.synchronize()  # (OpenCL writes on a queue of its own: a kernel enqueued before the write
            # but run after it read the new values, e.g. an optimizer step's learning rate changed by a scheduler)
        buffer.users = []
        buffer.write(values)
