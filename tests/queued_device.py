"""A test device whose commands run only when something waits for them: the "queued" backend.

It compiles kernels with the C backend but enqueues every launch and copy as a deferred command; a command runs
when its event is waited on (after the commands it depends on). So the scheduler's tests can see which commands a
realize or a read made run, and that no memory is freed while a command using it has not run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ember.backends.base import Device, Event, MemoryPool, Program
from ember.backends.c import CDevice
from ember.ir.ir import KernelIR


class Log:
    """What ran and what was freed, in order, and every free of memory a pending command still used."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.freed: list[int] = []
        self.unsafe_frees: list[str] = []
        self.pending: list[QueuedEvent] = []


class QueuedEvent(Event):
    """A deferred command: `wait()` runs its dependencies, then it (once)."""

    def __init__(self, log: Log, label: str, action: Callable[[], None], wait_for: tuple[Event, ...],
                 handles: tuple[Any, ...]) -> None:
        self.log, self.label, self.action, self.wait_for, self.handles = log, label, action, wait_for, handles
        self.finished = False
        log.pending.append(self)

    def wait(self) -> None:
        if self.finished:
            return
        for event in self.wait_for:
            event.wait()
        self.action()
        self.finished = True
        self.log.ran.append(self.label)
        self.log.pending.remove(self)

    @property
    def done(self) -> bool:
        return self.finished


class QueuedPool(MemoryPool):
    """Host memory that the scheduler must treat as device memory (no host view); copies are deferred."""

    def __init__(self, name: str, log: Log) -> None:
        super().__init__(name)
        self.log = log

    def create_buffer(self, nbytes: int) -> np.ndarray:
        return np.zeros(nbytes, dtype=np.uint8)

    def destroy_buffer(self, handle: np.ndarray) -> None:
        for event in self.log.pending:
            if any(used is handle for used in event.handles):
                self.log.unsafe_frees.append(event.label)
        self.log.freed.append(id(handle))

    def copy_in(self, handle: np.ndarray, source: memoryview) -> None:
        handle[: len(source)] = np.frombuffer(source, dtype=np.uint8)

    def copy_out(self, destination: memoryview, handle: np.ndarray) -> None:
        np.frombuffer(destination, dtype=np.uint8)[:] = handle[: len(destination)]

    def copy_in_async(self, handle: Any, source: memoryview, wait_for: tuple[Event, ...] = ()) -> Event:
        return QueuedEvent(self.log, f"copy in {len(source)}", lambda: self.copy_in(handle, source), wait_for,
                           (handle,))

    def copy_out_async(self, destination: memoryview, handle: Any, wait_for: tuple[Event, ...] = ()) -> Event:
        return QueuedEvent(self.log, f"copy out {len(destination)}", lambda: self.copy_out(destination, handle),
                           wait_for, (handle,))


class QueuedProgram(Program):
    def __init__(self, program: Program, name: str, log: Log) -> None:
        self.program, self.name, self.log = program, name, log

    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        return QueuedEvent(self.log, self.name, lambda: self.program(buffers, global_size).wait(), wait_for,
                           tuple(buffers))


class QueuedDevice(Device):
    def __init__(self, name: str = "queued:0") -> None:
        self.name = name
        self.log = Log()
        self.host = CDevice(name)
        self.info = self.host.info
        self.pool = QueuedPool(name, self.log)

    def render(self, kernel: KernelIR) -> str:
        return self.host.render(kernel)

    def compile(self, kernel: KernelIR) -> Program:
        return QueuedProgram(self.host.compile(kernel), kernel.name, self.log)

    def synchronize(self) -> None:
        for event in list(self.log.pending):
            event.wait()


def probe() -> list[Device]:
    return [QueuedDevice()]
