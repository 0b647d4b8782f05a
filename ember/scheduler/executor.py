"""The executor: the one loop that runs a command program (program.py) over a table of slots.

A schedule compiles to one command program: KernelStep (launch a kernel writing a slot from slots), CopyStep (copy
a slot into another pool) and Free (release slots), over numbered slots. Who produces programs:
- the schedule cache (schedule.py): a graph's program by node position, frees after each slot's last use;
- the memory budget (budget/memory_budget.py): the same steps reordered by its plan, recomputes writing stand-in
  slots again, its evictions as Free commands.
Who binds them (what the slots are and how each kernel step launches):
- eager realize (realize.py): slots are the graph's nodes, which become buffers as their steps run; each kernel
  step is bound to its device (a Launch with no program: compiled at its launch, timed, recorded);
- a launch plan (launch_plan.py): the same program with each kernel step's compiled program, device and size bound
  once (the per-op path);
- the memory budget: its program's stand-in slots get fresh nodes at each run; assigns it must not write in place
  are named.
`execute` runs every command in order; an output that replaces a node (an in-place assign) goes through
launch.run_kernel, which decides whether it writes in place (in_place.schedule_hold counts the table's own
references). Timing for profiles and EMBER_DEBUG=2, and the capture's recorder hooks, are launch.py's and
copies.py's, so they hold for every binder."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from ember.core.graph import Node
from ember.scheduler import profile
from ember.scheduler.buffers import Buffer
from ember.scheduler.copies import run_copy
from ember.scheduler.in_place import schedule_hold
from ember.scheduler.launch import launch_compiled, run_kernel
from ember.scheduler.program import Command, CopyStep, Free, Launch

NO_POSITIONS: frozenset[int] = frozenset()


def execute(commands: Sequence[Command], launches: Sequence[Launch | None], table: list[Node | None],
            last_use: Mapping[int, int], not_in_place: Collection[int] = NO_POSITIONS,
            notes: Mapping[int, str] | None = None) -> None:
    """Run `commands` over the nodes of `table` (by slot), each kernel step as its `launches` entry (same position)
    binds it. `last_use`: per slot, the command of its last use; `not_in_place`: positions of kernel steps whose
    assign must not write in place; `notes`: EMBER_DEBUG=2 lines printed before the command at their position."""
    for position, command in enumerate(commands):
        kind = command.__class__
        if kind is Free:
            for slot in command.slots:  # type: ignore[union-attr]
                table[slot] = None
            continue
        if notes is not None and position in notes:
            profile.debug_print(2, notes[position])
        output: Node = table[command.output]  # type: ignore[assignment,union-attr]
        if kind is CopyStep:
            run_copy(output, table[command.source])  # type: ignore[arg-type,union-attr]
            del output
            continue
        launch: Launch = launches[position]  # type: ignore[assignment]
        if launch.compiled is not None and output.replaces is None:
            buffer = Buffer(launch.device, launch.size, launch.dtype)  # type: ignore[arg-type]
            inputs: list[Node] = list(map(table.__getitem__, command.inputs))  # type: ignore[arg-type,union-attr]
            launch_compiled(output, command.kernel, launch.compiled, buffer, inputs, None,  # type: ignore[union-attr]
                            launch.device)
            output.become_buffer(buffer)
        else:
            replaced = output.replaces
            held = None if replaced is None or position in not_in_place else \
                schedule_hold(replaced, table, last_use, position)
            del replaced
            run_kernel(output, command.kernel, [table[slot] for slot in command.inputs],  # type: ignore[misc,union-attr]
                       held, launch.device)
        del output
