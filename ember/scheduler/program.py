"""The command program a schedule compiles to: Launch and Copy commands (its steps) over numbered slots, with the
Free commands that release each slot after its last use worked out once (executor.py runs it). The steps are the only
kind of kernel step and copy step: kernelize makes them over nodes (Launch[Node]), the schedule cache renumbers their
slots to the placed graph's positions (Launch[int]). A recording (ember.jit) may also hold HostCall steps: a host
function over slots' values, such as a collective of ember.distributed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np

from ember.backends.base import Device
from ember.core.dtype import DType
from ember.ir.kernel import Kernel


Slot = TypeVar("Slot")  # what a step's slots are: nodes (kernelize's output) or numbers (a program's)


class Launch(NamedTuple, Generic[Slot]):
    """Launch `kernel` writing slot `output` from slots `inputs` (the kernel's parameters 1..n, in order): a kernel
    step."""

    output: Slot
    inputs: tuple[Slot, ...]
    kernel: Kernel


class Copy(NamedTuple, Generic[Slot]):
    """Copy slot `source` into slot `output` (another pool, the output's device): a copy step."""

    output: Slot
    source: Slot


class HostCall(NamedTuple):
    """Call `function` on the host with the values of slots `inputs` (flat numpy arrays, in order) and write the flat
    array it returns into slot `output`: a host step, such as a collective of ember.distributed. Only recordings
    (ember.jit) hold them: eager code runs the function itself (host_call.py), which records the step."""

    output: int
    inputs: tuple[int, ...]
    function: Callable[[list[np.ndarray]], np.ndarray]


class Free(NamedTuple):
    """Release slots: what they hold is dropped (its memory goes back once no tensor holds it)."""

    slots: tuple[int, ...]


Command = Launch | Copy | HostCall | Free
Step = Launch | Copy | HostCall


class LaunchBinding(NamedTuple):
    """How a Launch runs, bound once per program (launch_plan.py) or recorded with it: on `device`; with `compiled`
    (a compile_cache.CompiledKernel), the output's `size` and `dtype`, launched directly; with `compiled` None,
    compiled (or found in the compile cache) at its launch."""

    device: Device
    compiled: Any
    size: int
    dtype: DType | None


class CommandProgram:
    """A schedule as the executor runs it: `steps` (its kernel and copy steps in order, by node position: what traces,
    plans and ahead-of-time compiles read) and `commands` (the steps with a Free after the last use of each slot;
    the slots still held after the last step are dropped with the executor's table). `last_use`: per slot, the
    command of its last use (for in-place assigns); `used`: the slots any step reads or writes.

    What every run of the program would otherwise work out again is kept on it: the compile cache stamp its kernels
    were compiled ahead for (`compiled_stamp`), the device of each command (`command_devices`), its launch plan
    (`launch_plan`, launch_plan.py), the memory budget's view of it (`budget_layout`) and its graph-parallel form
    (`parallel`, parallel.py)."""

    __slots__ = ("budget_layout", "command_devices", "commands", "compiled_stamp", "extra_slots", "last_use",
                 "last_used", "launch_plan", "parallel", "steps", "used")

    def __init__(self, steps: Sequence[Step],
                 commands: list[Command] | None = None) -> None:
        """The program of `steps`, with a Free after each slot's last use; or of `commands` as given (its steps are
        the commands other than frees)."""
        if commands is None:
            commands = _with_frees(steps)
        else:
            steps = [command for command in commands if command.__class__ is not Free]  # type: ignore[misc]
        self.steps = tuple(steps)
        self.commands = tuple(commands)
        last_use: dict[int, int] = {}
        for position, command in enumerate(commands):
            kind = command.__class__
            if kind is Launch:
                for slot in (command.output, *command.inputs):  # type: ignore[union-attr]
                    last_use[slot] = position
            elif kind is Copy:
                last_use[command.output] = last_use[command.source] = position  # type: ignore[union-attr]
            elif kind is HostCall:
                for slot in (command.output, *command.inputs):  # type: ignore[union-attr]
                    last_use[slot] = position
        self.last_use = last_use
        self.used = tuple(last_use)
        self.compiled_stamp: tuple[object, int] | None = None
        self.command_devices: tuple[str | None, ...] | None = None  # per command, its output's device (set by realize)
        self.launch_plan: Any = None  # a launch_plan.LaunchPlan, set by realize
        self.budget_layout: Any = None  # memory_budget.py's view of the slots and its plans (set under a budget)
        # graph-parallel execution (parallel.py): the program to run in its place and whether it gathers launches
        self.parallel: tuple[CommandProgram, bool] | None = None
        self.last_used = 0  # the schedule cache's clock when it was last found (schedule.ScheduleCache)
        # each slot after the graph's: nodes of templates' graphs it stores (schedule.ExtraSlot)
        self.extra_slots: tuple[tuple[tuple[int, ...], Any, str, Any], ...] = ()

    def __len__(self) -> int:
        return len(self.steps)


def step_slots(step: Step) -> tuple[int, ...]:
    """The slots a step writes and reads: its output first."""
    if step.__class__ is Copy:
        return tuple(step)  # type: ignore[arg-type]
    return (step.output, *step.inputs)  # type: ignore[union-attr]


def _with_frees(steps: Sequence[Step]) -> list[Command]:
    """The steps with a Free after the last use of each slot (none after the last step: the executor's table goes
    then)."""
    last_step: dict[int, int] = {}
    for index, step in enumerate(steps):
        for slot in step_slots(step):
            last_step[slot] = index
    frees: list[tuple[int, ...]] = [() for _ in steps]
    for slot, index in last_step.items():
        frees[index] += (slot,)
    commands: list[Command] = []
    final = len(steps) - 1
    for index, (step, released) in enumerate(zip(steps, frees)):
        commands.append(step)
        if released and index != final:
            commands.append(Free(released))
    return commands
