"""Realizing nodes: kernelize, lower, compile (cached by structure), allocate, launch, and turn nodes into buffers."""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ember.backends.base import COMPLETED, Device, Event, MemoryPool, Program, wait_all
from ember.backends.config import CONFIG
from ember.capabilities import DeviceInfo
from ember.core.dtype import DType
from ember.core.errors import CompileError, CompileFallbackWarning
from ember.core.graph import Node
from ember.core.ops import Op
from ember.ir.ir import KernelIR
from ember.ir.kernel import Kernel
from ember.ir.opt import build_kernel_ir, narrower_capabilities
from ember.ir.vectorize import vector_width
from ember.scheduler import profile
from ember.scheduler.devices import get_device
from ember.scheduler.schedule import SCHEDULES, CachedCopy, CachedKernel


class Buffer:
    """Memory for one realized node, in one device's pool; released when the last node holding it is gone.

    `event` completes when the command writing the buffer (a launch or a copy) has finished; `users` holds the
    unfinished events of commands enqueued to read it. The memory goes back to its pool only when both are done
    (unless the pool frees behind events itself), so dropping a tensor never blocks and never frees memory in use.
    """

    __slots__ = ("device", "device_name", "dtype", "event", "handle", "nbytes", "pool", "size", "users")

    def __init__(self, device: Device, size: int, dtype: DType, handle: Any = None) -> None:
        """Allocate from the device's pool, or adopt `handle` (memory the pool did not allocate, e.g. a mapping)."""
        self.device = device
        self.pool = device.pool
        self.device_name = device.name
        self.size = size
        self.dtype = dtype
        self.nbytes = size * dtype.itemsize
        self.event: Event = COMPLETED
        self.users: list[Event] = []
        if handle is None:
            self.handle = _allocate(self.pool, self.nbytes)
        else:
            self.handle = handle
            self.pool.used_bytes += self.nbytes
            self.pool.live_buffers += 1
        for record in profile.current():
            record.bytes_allocated += self.nbytes

    def add_user(self, event: Event) -> None:
        """Remember an enqueued command that reads this buffer (its memory must outlive the command)."""
        if not self.pool.frees_behind_events and not event.done:
            self.users = [user for user in self.users if not user.done]
            self.users.append(event)

    def __del__(self) -> None:
        try:
            if self.pool.frees_behind_events:
                self.pool.release(self.handle, self.nbytes)
                return
            pending = [event for event in (self.event, *self.users) if not event.done]
            if pending:
                DEFERRED_FREES.append((self.pool, self.handle, self.nbytes, pending))
            else:
                self.pool.release(self.handle, self.nbytes)
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown may have torn the pool down already
            pass

    def read(self) -> np.ndarray:
        """The buffer's values; waits only for the command that writes it (and the copy out), not for the device."""
        array = np.empty(self.size, dtype=self.dtype.numpy)
        if self.nbytes:
            self.pool.copy_out_async(memoryview(array).cast("B"), self.handle, _pending(self.event)).wait()
        else:
            self.event.wait()
        release_finished()
        return array

    def write(self, array: np.ndarray) -> None:
        """Copy host values into this new buffer, waiting only for that copy (the caller's array may change next)."""
        if self.nbytes:
            self.pool.copy_in_async(self.handle, memoryview(np.ascontiguousarray(array)).cast("B")).wait()


DEFERRED_FREES: list[tuple[MemoryPool, Any, int, list[Event]]] = []  # buffers dropped while commands still use them
MAX_DEFERRED_FREES = 1024  # beyond this many, a realize waits for them (an event may report done only once waited)


def release_finished(wait: bool = False) -> int:
    """Give back to their pools the dropped buffers whose commands have finished (with `wait`: all of them, after
    waiting for their events). Returns how many buffers are still waiting."""
    still: list[tuple[MemoryPool, Any, int, list[Event]]] = []
    while DEFERRED_FREES:
        pool, handle, nbytes, events = DEFERRED_FREES.pop()
        if wait:
            wait_all(events)
        if all(event.done for event in events):
            pool.release(handle, nbytes)
        else:
            still.append((pool, handle, nbytes, events))
    DEFERRED_FREES.extend(still)
    return len(still)


def _allocate(pool: MemoryPool, nbytes: int) -> Any:
    """Allocate from a pool; when it is full and dropped buffers wait behind events, wait for those and retry."""
    from ember.core.errors import OutOfMemoryError

    try:
        return pool.allocate(nbytes)
    except OutOfMemoryError:
        if not any(entry[0] is pool for entry in DEFERRED_FREES):
            raise
        release_finished(wait=True)
        return pool.allocate(nbytes)


def _pending(*events: Event) -> tuple[Event, ...]:
    return tuple(event for event in events if not event.done)


def buffer_node(array: np.ndarray, dtype: DType, device_name: str) -> Node:
    """A realized leaf holding a copy of a contiguous numpy array."""
    device = get_device(device_name)
    buffer = Buffer(device, array.size, dtype)
    buffer.write(array.reshape(-1))
    node = Node(Op.BUFFER, (), None, tuple(array.shape), dtype, device.name)
    node.buffer = buffer
    return node


def mapped_node(path: str, offset: int, shape: tuple[int, ...], dtype: DType, device_name: str = "disk:0") -> Node:
    """A realized leaf whose bytes stay in a file until a kernel needs them (a read-only memory map)."""
    from ember.core.shapes import prod

    device = get_device(device_name)
    size = prod(shape)
    handle = device.pool.map_region(path, offset, size * dtype.itemsize)
    node = Node(Op.BUFFER, (), None, tuple(shape), dtype, device.name)
    node.buffer = Buffer(device, size, dtype, handle)
    return node


def read_node(node: Node) -> np.ndarray:
    """The values of a realized node as a numpy array of its shape."""
    return node.buffer.read().reshape(node.shape)


class CompiledKernel:
    __slots__ = ("ir", "name", "program")

    def __init__(self, ir: KernelIR, program: Program) -> None:
        self.ir, self.program, self.name = ir, program, ir.name


_compiled: dict[tuple[str, Kernel], CompiledKernel] = {}


def kernel_name(kernel: Kernel) -> str:
    """A readable, structure-unique name: r (has a reduce) or e, the output shape, and a short hash."""
    has_reduce = any(step.op in (Op.SUM, Op.PROD, Op.REDUCE_MAX) for step in kernel.steps)
    shape = "_".join(str(size) for size in kernel.output.shape) or "scalar"
    digest = hashlib.blake2s(repr(kernel).encode(), digest_size=4).hexdigest()
    return f"{'r' if has_reduce else 'e'}_{shape}_{digest}"


def _value_dtypes(ir: KernelIR) -> set[DType]:
    """The dtypes of every value a kernel computes (a device must support its intermediates too)."""
    found, stack, seen = set(), [ir.sink], set()
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            found.add(node.dtype)
            stack.extend(node.srcs)
    return found


def compile_kernel(device: Device, kernel: Kernel) -> CompiledKernel:
    """Lower, optimize for the device, and compile a kernel; cached in memory by (device, structure)."""
    compiled = _compiled.get((device.name, kernel))
    return compiled if compiled is not None else compile_kernels(device, [kernel])[0]


def compile_kernels(device: Device, kernels: list[Kernel]) -> list[CompiledKernel]:
    """Compile several kernels for one device, in one compiler run where the device offers `compile_many`; if that
    fails, one by one, a kernel the device cannot build with vectors again with narrower ones or none."""
    start = time.perf_counter()
    irs = [_lower_for(device, kernel) for kernel in kernels]
    try:
        programs = _compile_irs(device, irs)
    except CompileError as error:
        built = [_compile_narrower(device, kernel, ir, error) if len(kernels) == 1 else _compile_one(device, kernel, ir)
                 for kernel, ir in zip(kernels, irs)]
        irs, programs = [ir for ir, _ in built], [program for _, program in built]
    seconds = (time.perf_counter() - start) / max(1, len(kernels))
    results = []
    for kernel, ir, program in zip(kernels, irs, programs):
        compiled = CompiledKernel(ir, program)
        _compiled[(device.name, kernel)] = compiled
        results.append(compiled)
        for record in profile.current():
            record.compiles.append(profile.CompileRecord(ir.name, device.name, seconds, from_cache=False))
    return results


def _compile_irs(device: Device, irs: list[KernelIR]) -> list[Program]:
    return device.compile_many(irs)


def _compile_one(device: Device, kernel: Kernel, ir: KernelIR) -> tuple[KernelIR, Program]:
    try:
        return ir, _compile_irs(device, [ir])[0]
    except CompileError as error:
        return _compile_narrower(device, kernel, ir, error)


def _compile_narrower(device: Device, kernel: Kernel, failed: KernelIR, error: CompileError
                      ) -> tuple[KernelIR, Program]:
    """The kernel lowered with narrower vectors than `failed`, which the device could not build or launch, or with
    none (opt.narrower_capabilities), with a one-line warning for each failure; the error if even that fails."""
    for capabilities in narrower_capabilities(device.info, vector_width(failed)):
        ir = _lower_for(device, kernel, capabilities)
        if vector_width(ir) >= vector_width(failed):
            continue
        warnings.warn(f"ember: {device.name} failed on kernel {failed.name} with {_vectors(failed)} "
                      f"({str(error).splitlines()[0]}); using {_vectors(ir)} instead", CompileFallbackWarning,
                      stacklevel=2)
        try:
            return ir, _compile_irs(device, [ir])[0]
        except CompileError as next_error:
            failed, error = ir, next_error
    raise error


def _vectors(ir: KernelIR) -> str:
    width = vector_width(ir)
    return f"vectors of {width} float32 lanes" if width > 1 else "no vectors"


def _lower_for(device: Device, kernel: Kernel, capabilities: DeviceInfo | None = None) -> KernelIR:
    """The kernel IR of a kernel for a device (with its capabilities unless others are given), after checking the
    device supports its dtypes."""
    ir = build_kernel_ir(kernel, kernel_name(kernel), capabilities or device.info)
    unsupported = device.info.unsupported({param.dtype for param in ir.params} | _value_dtypes(ir))
    if unsupported:
        from ember.core.errors import DeviceError

        names = ", ".join(dtype.name for dtype in unsupported)
        raise DeviceError(f"device {device.name} cannot run kernels on {names}; move the tensor to another device")
    if profile.debug_level() >= 3:
        from ember.ir.linearize import linearize

        listing = "\n".join(f"  {item.kind:<10} {item.node.op.name:<10} {item.node.dtype.name}" for item in
                             linearize(ir.sink))
        profile.debug_print(3, f"IR of {ir.name} ({ir.global_size} work items):\n{listing}")
    if profile.debug_level() >= 4:
        profile.debug_print(4, device.render(ir))
    return ir


def realize_nodes(nodes: list[Node], allow_sharding: bool = True) -> None:
    """Compute every unrealized node in `nodes` (and the stored nodes they need)."""
    pending = [node for node in nodes if not node.realized]
    if not pending:
        return
    if CONFIG.auto_shard and allow_sharding:
        pending = _shard_large_outputs(pending)
        if not pending:
            return
    if DEFERRED_FREES:
        release_finished(wait=len(DEFERRED_FREES) > MAX_DEFERRED_FREES)
    if profile.VizFolder.value:
        from ember.viz import write_realize

        profile.debug_print(1, f"graph written to {write_realize(pending, profile.VizFolder.value)}")
    items, graph_nodes = SCHEDULES.schedule(pending)
    _compile_ahead(items, graph_nodes)
    for record in profile.current():
        record.realizes += 1
    if profile.DebugLevel.value >= 1:
        profile.debug_print(1, f"realize: {len(items)} items for {len(pending)} tensors")
    # hold only the nodes the schedule reads or writes, and each only until its last use, so an intermediate
    # buffer is released as soon as the last kernel reading it has been launched
    last_use: dict[int, int] = {}
    for position, item in enumerate(items):
        for index in _item_nodes(item):
            last_use[index] = position
    live = {index: graph_nodes[index] for index in last_use}
    del graph_nodes
    pools = {get_device(live[item.output].device).pool for item in items}
    for pool in pools:
        pool.peak_bytes = pool.used_bytes  # peak bytes are reported per realize
    for position, item in enumerate(items):
        if isinstance(item, CachedCopy):
            _run_copy(live[item.output], live[item.source])
        else:
            _run_kernel(live[item.output], item.kernel, [live[i] for i in item.inputs])
        for index in _item_nodes(item):
            if last_use[index] == position:
                del live[index]
    for record in profile.current():
        for pool in pools:
            record.peak_bytes[pool.name] = max(record.peak_bytes.get(pool.name, 0), pool.peak_bytes)


def _shard_large_outputs(pending: list[Node]) -> list[Node]:
    """Compute large outputs split across every compute device (automatic sharding); return the rest."""
    from ember.scheduler.auto_shard import compute_devices, shard_plan

    devices = compute_devices()
    remaining = []
    for node in pending:
        plan = shard_plan(node, devices)
        if plan is None:
            remaining.append(node)
            continue
        profile.debug_print(1, f"auto-shard: {node} across {', '.join(devices)}")
        realize_nodes([plan], allow_sharding=False)
        node.become_buffer(plan.buffer)
    return remaining


def _item_nodes(item: CachedKernel | CachedCopy) -> tuple[int, ...]:
    if isinstance(item, CachedCopy):
        return (item.output, item.source)
    return (item.output, *item.inputs)


def _compile_ahead(items: list, graph_nodes: list[Node]) -> None:
    """Compile the new kernels of a schedule before running it: in as many batches as there are cores (each one
    compiler run) on devices that allow concurrent compiles, as one batch elsewhere. A cold start compiles many."""
    missing: dict[str, dict[Kernel, None]] = {}
    devices: dict[str, Device] = {}
    for item in items:
        if isinstance(item, CachedCopy) or graph_nodes[item.output].size == 0:
            continue
        device = get_device(graph_nodes[item.output].device)
        if (device.name, item.kernel) not in _compiled and device.info.can_run:
            missing.setdefault(device.name, {})[item.kernel] = None
            devices[device.name] = device
    for name, kernels in missing.items():
        device, batch = devices[name], list(kernels)
        if len(batch) < 2:
            continue
        if not device.info.concurrent_compile:
            compile_kernels(device, batch)
            continue
        workers = min(len(batch), os.cpu_count() or 1)
        chunks = [batch[index::workers] for index in range(workers)]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(compile_kernels, [device] * len(chunks), chunks))


def _run_kernel(output: Node, kernel: Kernel, inputs: list[Node]) -> None:
    device = get_device(output.device)
    buffer = Buffer(device, output.size, output.dtype)
    if output.size > 0:
        compiled = compile_kernel(device, kernel)
        if device.info.can_run:
            handles: list[Any] = [buffer.handle, *(node.buffer.handle for node in inputs)]
            timed = bool(profile.current()) or profile.DebugLevel.value >= 2
            start = time.perf_counter() if timed else 0.0
            event = _launch(device, kernel, compiled, handles, _pending(*(node.buffer.event for node in inputs)))
            buffer.event = event
            for node in inputs:
                node.buffer.add_user(event)
            if timed:
                event.wait()
                seconds = time.perf_counter() - start
                for record in profile.current():
                    record.kernels.append(profile.KernelRecord(compiled.name, device.name, seconds, compiled.ir.global_size))
                profile.debug_print(2, f"  {compiled.name:<40} {device.name:<10} {seconds * 1e6:10.1f} us")
    output.become_buffer(buffer)


def _launch(device: Device, kernel: Kernel, compiled: CompiledKernel, handles: list[Any],
            wait_for: tuple[Event, ...]) -> Event:
    """Launch a compiled kernel; one the device fails to launch with vectors (a driver making its machine code at
    the first launch) is compiled and launched again with narrower vectors or none."""
    while True:
        try:
            return compiled.program(handles, compiled.ir.global_size, wait_for)
        except CompileError as error:
            ir, program = _compile_narrower(device, kernel, compiled.ir, error)
            compiled = _compiled[(device.name, kernel)] = CompiledKernel(ir, program)


def _run_copy(output: Node, source_node: Node) -> None:
    """Enqueue the copy of a buffer into another pool after the command writing it; the realize loop goes on at
    once, and the launches reading the copy wait for its event."""
    source = source_node.buffer
    target_device = get_device(output.device)
    buffer = Buffer(target_device, output.size, output.dtype)
    wait_for = _pending(source.event)
    event, route = enqueue_copy(buffer, source, wait_for)
    buffer.event = event
    source.add_user(event)
    for record in profile.current():
        record.copies.append((source.device_name, target_device.name, buffer.nbytes))
    if profile.DebugLevel.value >= 1:
        after = f", after {len(wait_for)} unfinished event{'s' * (len(wait_for) != 1)}" if wait_for else ""
        profile.debug_print(1, f"  copy {source.device_name} -> {target_device.name}: {buffer.nbytes} bytes "
                               f"({route}{after})")
    output.become_buffer(buffer)


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
    staging = memoryview(np.empty(nbytes, dtype=np.uint8))
    staged = source.pool.copy_out_async(staging, source.handle, wait_for)
    return target.pool.copy_in_async(target.handle, staging, (staged,)), "staged through host memory"
