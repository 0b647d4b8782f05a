"""Recording the commands a realize runs (for ember.jit): each launch and copy with the buffers it reads and
writes, each upload of host data, and each assign whose value could not be written in place."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ember.backends.base import Device
from ember.ir.kernel import Kernel


class RecordedLaunch(NamedTuple):
    """A kernel launch: slot numbers of the buffer it writes and of the buffers it reads (in handle order)."""

    device: Device
    kernel: Kernel
    compiled: Any  # compile_cache.CompiledKernel
    output: int
    inputs: tuple[int, ...]


class RecordedCopy(NamedTuple):
    """A copy of buffer slot `source` into buffer slot `output` (another pool)."""

    output: int
    source: int


class Recorder:
    """Collects the commands run while it is the `recorder` of the calling thread's context (ember/context.py).
    Buffers are numbered in order of first appearance (a slot each) and held here, so none is freed or reused before
    the recording is turned into a replay."""

    def __init__(self, commands: bool = True) -> None:
        self.commands_wanted = commands
        self.buffers: list[Any] = []  # buffers.Buffer by slot
        self.slot_of: dict[int, int] = {}
        self.commands: list[RecordedLaunch | RecordedCopy] = []
        self.uploads: list[tuple[tuple[int, ...], str, bytes]] = []  # host data uploaded: size, dtype, bytes
        self.rebound: list[tuple[int, int]] = []  # (old slot, new slot) of assigns computed into a new buffer
        self.checks: list[tuple[int, Any]] = []  # (slot of a value check's violation, its describe function)

    def slot(self, buffer: Any) -> int:
        """The slot number of a buffer (a new one at its first appearance)."""
        slot = self.slot_of.get(id(buffer))
        if slot is None:
            slot = self.slot_of[id(buffer)] = len(self.buffers)
            self.buffers.append(buffer)
        return slot

    def launch(self, device: Device, kernel: Kernel, compiled: Any, output: Any, inputs: list[Any]) -> None:
        if self.commands_wanted:
            input_slots = tuple(self.slot(buffer) for buffer in inputs)
            self.commands.append(RecordedLaunch(device, kernel, compiled, self.slot(output), input_slots))

    def copy(self, output: Any, source: Any) -> None:
        if self.commands_wanted:
            source_slot = self.slot(source)
            self.commands.append(RecordedCopy(self.slot(output), source_slot))

    def upload(self, array: np.ndarray) -> None:
        self.uploads.append((array.shape, array.dtype.str, array.tobytes()))

    def check(self, violation: Any, describe: Any) -> None:
        """A value check (core/checks.py) whose violation buffer a replay reads after its commands."""
        if self.commands_wanted:
            self.checks.append((self.slot(violation), describe))

    def assign_not_in_place(self, old: Any, new: Any) -> None:
        if self.commands_wanted:
            self.rebound.append((self.slot(old), self.slot(new)))
