"""Launching a kernel: its output buffer, the events it waits for, timing for em.profile and EMBER_DEBUG=2, and
a relaunch with narrower vectors when the driver fails at the first launch."""

from __future__ import annotations

import math
import time
from typing import Any, cast

from ember.backends.base import COMPLETED, Device, Event
from ember.backends.launch_group import GroupedEvent
from ember.context import CONTEXT
from ember.core.errors import CompileError
from ember.core.graph import Node
from ember.ir.kernel import Kernel
from ember.scheduler import compile_cache, profile, quick_compile
from ember.scheduler.buffers import Buffer, buffer_of, pending
from ember.scheduler.compile_cache import CompiledKernel, compile_narrower
from ember.scheduler.devices import get_device
from ember.scheduler.in_place import reusable_buffer


def run_kernel(output: Node, kernel: Kernel, inputs: list[Node], held_by_schedule: int | None = None,
               device: Device | None = None) -> None:
    """Allocate the output, launch the kernel after the writers of its inputs, and make `output` a buffer leaf.

    With `held_by_schedule` (no later command reads the node `output` replaces, see in_place.reusable_buffer) the
    kernel may write into the replaced node's buffer instead of allocating. `device` is `output`'s device when the
    caller has it already (the executor's bindings hold it)."""
    if device is None:
        device = get_device(cast(str, output.device))  # every node of a schedule is placed
    reused = None if held_by_schedule is None else reusable_buffer(output, inputs, held_by_schedule, device)
    size = math.prod(output.shape)
    buffer = Buffer(device, size, output.dtype) if reused is None else reused
    if size > 0:
        if CONTEXT.get().recorder is not None:  # a capture replays its programs: the optimized ones, not quick builds
            quick_compile.wait_for_optimized()
        compiled = compile_cache.compile_kernel(device, kernel)  # through the module: tests wrap it
        if device.info.can_run:
            launch_compiled(output, kernel, compiled, buffer, inputs, reused, device)
    output.become_buffer(buffer)  # (and forgets the node it replaced)


def launch_compiled(output: Node, kernel: Kernel, compiled: CompiledKernel, buffer: Buffer, inputs: list[Node],
                    reused: Buffer | None, device: Device) -> None:
    """Launch `compiled` writing `buffer` (the reused buffer of `output.replaces` when `reused` is it) after the
    writers of its inputs, and keep the launch's event on the buffers it writes and reads."""
    input_buffers: list[Buffer] = []
    handles: list[Any] = [buffer.handle]
    wait_for: tuple[Event, ...] = ()
    for node in inputs:
        input_buffer = node.buffer or buffer_of(node)
        input_buffers.append(input_buffer)
        handles.append(input_buffer.handle)
        event = input_buffer.event
        if event is not COMPLETED and not event.done:
            wait_for += (event,)
    context = CONTEXT.get()  # (the calling thread's: ember/context.py)
    records = context.profiles
    timed = bool(records) or context.debug_level >= 2
    start = time.perf_counter() if timed else 0.0
    if reused is not None:  # also after the writer and the readers of the old value
        wait_for = pending(*wait_for, reused.event, *reused.users)
        reused.users = []
    try:
        event = compiled.program(handles, compiled.ir.global_size, wait_for)
    except CompileError as error:  # a driver making its machine code at the first launch
        event = launch(device, kernel, compiled, handles, wait_for, error)
    buffer.event = event
    recorder = context.recorder
    if recorder is not None:
        recorder.launch(device, kernel, compiled, buffer, input_buffers)
        if output.replaces is not None and reused is None and output.replaces.buffer is not None:
            recorder.assign_not_in_place(output.replaces.buffer, buffer)
    if event is not COMPLETED:  # (a completed command needs no reader kept)
        for input_buffer in input_buffers:
            input_buffer.add_user(event)
    if timed:
        if isinstance(event, GroupedEvent) and not event.done:  # held in a launch group: timed when it runs
            for record in records:
                kernel_record = profile.KernelRecord(compiled.name, device.name, 0.0, compiled.ir.global_size)
                record.kernels.append(kernel_record)
                event.records.append(kernel_record)
            profile.debug_print(2, f"  {compiled.name:<40} {device.name:<10} (held: runs beside others)")
            return
        event.wait()
        end = time.perf_counter()
        seconds = end - start
        for record in records:
            record.kernels.append(profile.KernelRecord(compiled.name, device.name, seconds,
                                                       compiled.ir.global_size, start, end))
        profile.debug_print(2, f"  {compiled.name:<40} {device.name:<10} {seconds * 1e6:10.1f} us")


def launch(device: Device, kernel: Kernel, compiled: CompiledKernel, handles: list[Any],
           wait_for: tuple[Event, ...], error: CompileError | None = None) -> Event:
    """Launch a compiled kernel; one the device fails to launch with vectors (a driver making its machine code at
    the first launch; `error` when that launch was tried already) is compiled and launched again with narrower
    vectors or none."""
    while True:
        if error is None:
            try:
                return compiled.program(handles, compiled.ir.global_size, wait_for)
            except CompileError as failure:
                error = failure
        ir, program = compile_narrower(device, kernel, compiled.ir, error)
        compiled = CompiledKernel(ir, program)
        compile_cache.COMPILED.put((device.name, kernel), compiled)
        if kernel.input_offsets:  # (launched with views of its offset inputs, as before: input_views.py)
            compiled = compile_cache.COMPILED.viewed(device.name, kernel, compiled)
        error = None
