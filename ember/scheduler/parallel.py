"""Graph-parallel execution, the scheduler's part (EMBER_PARALLEL_KERNELS): which programs have independent kernel
steps (two launches neither of which must follow the other), and a program's steps put in an order that interleaves
independent chains, so that the launches the executor gathers (backends/launch_group.py) have neighbours to run
beside. The order is by level: each step one level after every step it must follow (the writers of what it reads,
the writers and readers of what it writes, and for an in-place assign the readers of the value it overwrites),
steps of one level in program order; any order that keeps these is what a realize may run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ember.core.graph import Node
from ember.scheduler.program import CommandProgram, Launch, Step, step_slots


def step_levels(steps: Sequence[Step], replaced: Mapping[int, int]) -> list[int]:
    """Per step, its level (see the module): `replaced` maps a step's position to the slot of the value its output
    overwrites in place (an assign), which it must write after that value's readers."""
    written: dict[int, int] = {}  # per slot, the level of its last writer
    read: dict[int, int] = {}  # per slot, the highest level of a step reading it
    levels = []
    for position, step in enumerate(steps):
        slots = step_slots(step)
        inputs = slots[1:]
        targets = (slots[0],) if position not in replaced else (slots[0], replaced[position])
        level = 0
        for slot in inputs:
            level = max(level, written.get(slot, -1) + 1)
        for slot in targets:
            level = max(level, written.get(slot, -1) + 1, read.get(slot, -1) + 1)
        levels.append(level)
        for slot in inputs:
            read[slot] = max(read.get(slot, -1), level)
        for slot in targets:
            written[slot] = level
    return levels


def has_independent_launches(steps: Sequence[Step], levels: Sequence[int]) -> bool:
    """Whether two kernel steps share a level (neither must follow the other)."""
    seen: set[int] = set()
    for step, level in zip(steps, levels):
        if step.__class__ is Launch:
            if level in seen:
                return True
            seen.add(level)
    return False


def parallel_program(program: CommandProgram, nodes: Sequence[Node | None]) -> tuple[CommandProgram, bool]:
    """The program a realize runs with graph-parallel execution over its graph's `nodes`, and whether its executor
    gathers launches: the program with its steps in level order where two kernel steps are independent (worked
    out once per program), else the program itself, not gathering."""
    if program.parallel is not None:
        return program.parallel
    positions = {id(node): position for position, node in enumerate(nodes) if node is not None}
    replaced: dict[int, int] = {}
    for position, step in enumerate(program.steps):
        if step.__class__ is Launch:
            output = nodes[step.output]  # type: ignore[union-attr]
            target = None if output is None or output.replaces is None else positions.get(id(output.replaces))
            if target is not None:
                replaced[position] = target
    levels = step_levels(program.steps, replaced)
    if not has_independent_launches(program.steps, levels):
        program.parallel = (program, False)
        return program.parallel
    order = sorted(range(len(program.steps)), key=lambda position: (levels[position], position))
    interleaved = CommandProgram([program.steps[position] for position in order])
    interleaved.parallel = (interleaved, True)
    program.parallel = (interleaved, True)
    return program.parallel


def replay_gathers(program: CommandProgram) -> bool:
    """Whether a replay of a recorded program (ember.jit, in the order its realizes ran) gathers launches: whether
    two of its kernel steps are independent (worked out once per program)."""
    if program.parallel is None:
        program.parallel = (program, has_independent_launches(program.steps, step_levels(program.steps, {})))
    return program.parallel[1]
