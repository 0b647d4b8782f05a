"""Recording the commands a realize runs (for ember.jit and incremental updates): each launch and copy as a program
step (program.py) over buffer slots with its LaunchBinding (device and compiled program), each host step (a collective
of ember.distributed), each upload of host data, and each assign whose value could not be written in place."""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.backends.base import Device
from ember.ir.kernel import Kernel
from ember.scheduler.program import CommandProgram, Copy, HostCall, Launch, LaunchBinding


class Recorder:
    """Collects the commands run while it is the `recorder` of the calling thread's context (ember/context.py).
    Buffers are numbered in order of first appearance (a slot each) and held here, so none is freed or reused before
    the recording is turned into a replay."""

    def __init__(self, commands: bool = True) -> None:
        self.commands_wanted = commands
        self.buffers: list[Any] = []  # buffers.Buffer by slot
        self.slot_of: dict[int, int] = {}
        self.steps: list[Launch | Copy | HostCall] = []
        self.bindings: list[LaunchBinding | None] = []  # per step: a kernel step's device and compiled program
        self.uploads: list[tuple[tuple[int, ...], str, bytes]] = []  # host data uploaded: size, dtype, bytes
        self.rebound: list[tuple[int, int]] = []  # (old slot, new slot) of assigns computed into a new buffer
        self.checks: list[tuple[int, Any]] = []  # (slot of a value check's violation, its describe function)
        # random draws in the order they were made: (key array, counter at the draw, numbers drawn); the key
        # arrays by id until uploaded, then (slot of the key's buffer, counter, count) in `random_keys`
        self.random_draws: list[tuple[np.ndarray, int, int]] = []
        self._random_arrays: dict[int, tuple[int, int]] = {}
        self.random_keys: list[tuple[int, int, int]] = []
        # tensors changed in place while recording (Tensor.assign), by weak reference: jit realizes those still alive
        # with the outputs, so that a state tensor the function reaches from outside its arguments (a closure, a
        # global) is updated by the recorded kernels, which replays repeat, and not left lazy after the call (a
        # temporary changed in place and dropped is not kept for it)
        self.assigned: list[Any] = []

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
            self.steps.append(Launch(self.slot(output), input_slots, kernel))
            self.bindings.append(LaunchBinding(device, compiled, output.size, output.dtype))

    def copy(self, output: Any, source: Any) -> None:
        if self.commands_wanted:
            source_slot = self.slot(source)
            self.steps.append(Copy(self.slot(output), source_slot))
            self.bindings.append(None)

    def host_call(self, output: Any, inputs: list[Any], function: Any) -> None:
        """A host function that read the `inputs` buffers and wrote `output` (scheduler/host_call.py)."""
        if self.commands_wanted:
            input_slots = tuple(self.slot(buffer) for buffer in inputs)
            self.steps.append(HostCall(self.slot(output), input_slots, function))
            self.bindings.append(None)

    def program(self, before: list[Copy] | None = None) -> tuple[CommandProgram, list[LaunchBinding | None]]:
        """The recorded steps as a command program over the buffer slots (no frees: a replay keeps its buffers),
        after the copies `before`, and each command's LaunchBinding."""
        copies = before or []
        return CommandProgram((), [*copies, *self.steps]), [None] * len(copies) + self.bindings

    def upload(self, array: np.ndarray, buffer: Any = None) -> None:
        """Host data uploaded into `buffer`; a random draw's key (see `random_draw`) is kept apart: its values
        change from call to call, and a replay writes them anew."""
        draw = self._random_arrays.pop(id(array), None)
        if draw is None:
            self.uploads.append((array.shape, array.dtype.str, array.tobytes()))
        elif self.commands_wanted and buffer is not None:
            self.random_keys.append((self.slot(buffer), *draw))

    def random_draw(self, key: np.ndarray, counter: int, count: int) -> None:
        """A random op drew `count` numbers from number `counter` on, with this key array (core/creation.py)."""
        self.random_draws.append((key, counter, count))  # (holds the array, so its id stays its own)
        self._random_arrays[id(key)] = (counter, count)

    def check(self, violation: Any, describe: Any) -> None:
        """A value check (core/checks.py) whose violation buffer a replay reads after its commands."""
        if self.commands_wanted:
            self.checks.append((self.slot(violation), describe))

    def assign_not_in_place(self, old: Any, new: Any) -> None:
        if self.commands_wanted:
            self.rebound.append((self.slot(old), self.slot(new)))
