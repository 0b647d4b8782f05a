"""`ember.memory_budget`: the bytes a realize may hold in each pool it writes, and the realize that keeps to them by
freeing intermediates early and recomputing them (the plan is budget/plan.py's)."""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple, Self, cast

from ember.backends.base import MemoryPool
from ember.context import CONTEXT, update
from ember.core.errors import ArgumentError, MemoryBudgetError
from ember.core.graph import Node
from ember.core.ops import Op
from ember.scheduler import profile
from ember.budget.plan import BudgetPlan, BudgetTooSmall, PlanItem, plan_budget, smallest_budget
from ember.scheduler.devices import get_device
from ember.scheduler.executor import execute
from ember.scheduler.launch_plan import bind_devices
from ember.scheduler.program import Command, CommandProgram, Copy, Free, Launch

MAX_CACHED_PLANS = 16  # per schedule: (budget, bytes held before, kept, uploads) -> plan


class memory_budget:  # a function-like name, as torch's no_grad and set_grad_enabled
    """Limit the bytes each memory pool holds while a realize runs: `ember.memory_budget("512MB")` sets the budget,
    `ember.memory_budget(None)` clears it, and `with ember.memory_budget(2**20): ...` sets it for the block only.

    What it counts: everything the pool holds while a realize writes to it (the pool's high-water mark, as
    `ember.profile().peak_bytes` reports it): the tensors held before the realize, the host data it uploads, the
    outputs it computes and its intermediates. Under a budget a realize frees intermediates early and recomputes
    them before their later readers, choosing by bytes freed per unit of recompute work; tensors it realizes for
    the caller (and every realized tensor) are never evicted. Intermediates of a budgeted realize are not kept
    afterwards (a tensor holding one stays lazy and is recomputed if read). A realize that cannot fit even with every
    intermediate recomputed raises `MemoryBudgetError` naming the budget and the least it needs. Sizes are ints or
    strings like "512MB" or "2GiB" (EMBER_POOL_LIMITS' format)."""

    def __init__(self, limit: int | str | None) -> None:
        self.value = check_budget(limit)
        self.previous = update(budget=self.value).budget  # (the calling thread's: ember/context.py)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exception: object) -> None:
        update(budget=self.previous)

    def __repr__(self) -> str:
        return f"ember.memory_budget({self.value})"


def get_memory_budget() -> int | None:
    """The memory budget in force in the calling thread, in bytes per pool (None: no budget)."""
    return CONTEXT.get().budget


def check_budget(limit: Any) -> int | None:
    """A budget in bytes from an int, a size string like "512MB", or None; else a clear error."""
    from ember.settings import parse_bytes

    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, str)):
        raise TypeError(f"ember.memory_budget: expected a number of bytes (an int or a string like '512MB') or None, "
                        f"got {type(limit).__name__} {limit!r}")
    if isinstance(limit, str):
        limit = parse_bytes(limit, "ember.memory_budget")
    if limit <= 0:
        raise ArgumentError(f"ember.memory_budget: the budget must be a positive number of bytes, got {limit}")
    return limit


def run_budgeted(items: CommandProgram, live: list[Node | None], roots: list[Node], written: set[MemoryPool],
                 budget: int) -> None:
    """Run a program under `budget` bytes per pool its steps write (`written`): the budget's plan as a command
    program of its own (intermediates computed into stand-in slots, freed and recomputed as it says), run by the
    executor; only the roots and assigned nodes become buffers."""
    layout = items.budget_layout
    if layout is None:  # fixed by the key (shapes, dtypes, devices, roots): worked out once per program
        layout = items.budget_layout = _layout(live, roots)
    steps = cast(tuple[Launch | Copy, ...], items.steps)  # a schedule's: no host steps (recordings hold those)
    assigned = [step.output for step in steps if live[step.output].replaces is not None]  # type: ignore[union-attr]
    kept = layout.roots.union(assigned)
    uploads = frozenset([index for index, node in enumerate(live)
                         if node is not None and node.buffer is None and node.op is Op.BUFFER])
    nbytes, pools = layout.nbytes, layout.pools
    capture_only = _held_by_capture_only()
    baseline = {pool.name: pool.used_bytes - capture_only.get(pool.name, 0) for pool in layout.pool_objects}
    budgeted = sorted({pool.name for pool in written})
    key = (budget, tuple(sorted(baseline.items())), kept, uploads)
    plans = layout.plans
    found = plans.get(key)
    if found is None:
        plan_items = [_plan_item(step, live) for step in steps]
        try:
            plan = plan_budget(plan_items, nbytes, pools, kept, uploads, baseline, dict.fromkeys(budgeted, budget))
        except BudgetTooSmall as error:
            needed = smallest_budget(plan_items, nbytes, pools, kept, uploads, baseline, budgeted)
            raise MemoryBudgetError(
                f"memory budget of {budget} bytes is too small for this realize on {error.pool}: it needs at least "
                f"{needed} bytes with every intermediate recomputed ({baseline[error.pool]} bytes were held in the "
                f"pool before it); raise the budget with ember.memory_budget({needed}) or free tensors you no "
                f"longer need", budget=budget, needed=needed, pool=error.pool) from None
        if len(plans) >= MAX_CACHED_PLANS:
            plans.pop(next(iter(plans)))
        found = plans[key] = (plan, _budget_program(steps, plan, kept, len(live)))
    plan, budgeted_program = found
    for record in profile.current():
        record.recomputed_kernels += plan.recomputed
        for pool_name in budgeted:
            planned = plan.peak_bytes.get(pool_name, 0)
            record.planned_peak_bytes[pool_name] = max(record.planned_peak_bytes.get(pool_name, 0), planned)
    debug_level = CONTEXT.get().debug_level
    if debug_level >= 1:
        peaks = ", ".join(f"{name} {plan.peak_bytes.get(name, 0)}" for name in budgeted)
        profile.debug_print(1, f"memory budget {budget} bytes: planned peak {peaks}; {plan.recomputed} commands "
                               f"recomputed")
    program, origins, recomputes = budgeted_program
    # the table: the graph's nodes (the realize's own list: no other list holds them, as in_place.schedule_hold
    # expects), then a fresh stand-in node per computation of an intermediate (it receives the buffer: the
    # intermediate itself stays lazy)
    positions = len(live)
    computed = [cast(Node, live[steps[origins[position]].output]) for position, command in enumerate(program.commands)
                if command.__class__ is not Free and command.output >= positions]  # type: ignore[union-attr]
    table = live
    table += [Node(Op.CONTIGUOUS, (), None, node.shape, node.dtype, node.device) for node in computed]
    del computed
    outputs = {step.output for step in steps}
    not_in_place = []
    for position, command in enumerate(program.commands):
        if command.__class__ is not Launch:
            continue
        replaced = cast(Node, table[command.output]).replaces  # type: ignore[union-attr]
        # (in place only when no intermediate it reads reaches the replaced node: one staying lazy would read the
        # overwritten buffer if a tensor holding it were read later)
        if replaced is not None and any(_reaches(live[slot], replaced) for slot in steps[origins[position]].inputs
                                        if slot in outputs and slot not in kept):
            not_in_place.append(position)
        del replaced
    notes = None
    if debug_level >= 2:
        notes = {position: f"  recompute of {'a copy' if steps[origins[position]].__class__ is Copy else 'a kernel'}"
                           f" (item {origins[position]} of {len(steps)}) under the memory budget:"
                 for position in recomputes}
    bindings, _ = bind_devices(program, table)
    execute(program.commands, bindings, table, program.last_use, frozenset(not_in_place), notes)


def _budget_program(steps: tuple[Launch | Copy, ...], plan: BudgetPlan, kept: frozenset[int],
                    positions: int) -> tuple[CommandProgram, dict[int, int], list[int]]:
    """The budget plan's command program over the graph's slots and a stand-in slot (from `positions` on) per
    computation of an intermediate: each step reads the slots its inputs were last computed into, an eviction frees
    the slot its intermediate is in. Also, per command position of a step, the schedule step it runs, and the
    positions of the recomputes."""
    current: dict[int, int] = {}  # node position -> the slot holding its value now
    freed: set[int] = set()
    commands: list[Command] = []
    origins: dict[int, int] = {}
    recomputes: list[int] = []
    stand_ins = positions
    for index, number in enumerate(plan.commands):
        if number < 0:
            slot = current.get(~number, ~number)
            commands.append(Free((slot,)))
            freed.add(slot)
            continue
        step = steps[number]
        if step.output in kept:
            output = step.output
        else:
            output, stand_ins = stand_ins, stand_ins + 1
        previous = current.get(step.output)
        if step.__class__ is Copy:
            source = cast(Copy, step).source
            made: Launch | Copy = Copy(output, current.get(source, source))
        else:
            kernel_step = cast(Launch, step)
            made = Launch(output, tuple(current.get(slot, slot) for slot in kernel_step.inputs), kernel_step.kernel)
        origins[len(commands)] = number
        if index in plan.recomputes:
            recomputes.append(len(commands))
        commands.append(made)
        current[step.output] = output
        if previous is not None and previous != output and previous not in freed:  # (the last value, replaced)
            commands.append(Free((previous,)))
            freed.add(previous)
    return CommandProgram((), commands), origins, recomputes


class _Layout(NamedTuple):
    """What a schedule's positions are, for its budget plans (the same at every realize of the schedule), and the
    plans made for it by (budget, bytes held before, kept, uploads)."""

    nbytes: dict[int, int]
    pools: dict[int, str]
    pool_objects: list[MemoryPool]
    roots: frozenset[int]
    plans: dict[tuple, tuple[BudgetPlan, tuple[CommandProgram, dict[int, int], list[int]]]]


def _layout(live: list[Node | None], roots: list[Node]) -> _Layout:
    position_of = {id(node): index for index, node in enumerate(live) if node is not None}
    nbytes: dict[int, int] = {}
    pools: dict[int, str] = {}
    pool_objects: dict[str, MemoryPool] = {}
    for index, node in enumerate(live):
        if node is not None:
            nbytes[index] = math.prod(node.shape) * node.dtype.itemsize
            pool = get_device(node.device).pool  # type: ignore[arg-type]
            pools[index] = pool.name
            pool_objects[pool.name] = pool
    return _Layout(nbytes, pools, list(pool_objects.values()),
                   frozenset([position_of[id(root)] for root in roots if id(root) in position_of]), {})


def _reaches(node: Node | None, target: Node) -> bool:
    """Whether `target` is `node` or lies under it in the lazy graph (the walk stops at realized nodes)."""
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        if current is target:
            return True
        if current is not None and id(current) not in seen:
            seen.add(id(current))
            stack.extend(current.srcs)
    return False


def _held_by_capture_only() -> dict[str, int]:
    """Per pool, the bytes of buffers only an ember.jit capture in progress holds: the capture keeps every buffer
    until it has planned its arena, where a budgeted realize would have freed them, so the plan leaves them out."""
    recorder = CONTEXT.get().recorder
    held: dict[str, int] = {}
    if recorder is not None:
        for buffer in recorder.buffers:
            if sys.getrefcount(buffer) <= 3:  # the list, the loop variable, getrefcount's argument
                held[buffer.pool.name] = held.get(buffer.pool.name, 0) + buffer.nbytes
    return held


def _plan_item(item: Any, live: list[Node | None]) -> PlanItem:
    """The planner's view of a program step: its positions and its work."""
    if item.__class__ is Copy:
        return PlanItem(item.output, (item.source,), live[item.source].size)  # type: ignore[union-attr]
    return PlanItem(item.output, item.inputs, sum(math.prod(step.shape) for step in item.kernel.steps))
