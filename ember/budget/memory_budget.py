"""`ember.memory_budget`: the bytes a realize may hold in each pool it writes, and the realize that keeps to them by
freeing intermediates early and recomputing them (the plan is budget_plan.py's)."""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple, Self

from ember.backends.base import Device, MemoryPool
from ember.context import CONTEXT, update
from ember.core.errors import ArgumentError, MemoryBudgetError
from ember.core.graph import Node
from ember.core.ops import Op
from ember.scheduler import profile
from ember.budget.plan import BudgetPlan, BudgetTooSmall, PlanItem, plan_budget, smallest_budget
from ember.scheduler.copies import run_copy
from ember.scheduler.devices import get_device
from ember.scheduler.in_place import schedule_hold
from ember.scheduler.launch import run_kernel
from ember.scheduler.schedule import CachedCopy, Schedule

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


def run_budgeted(items: Schedule, live: list[Node | None], roots: list[Node], devices: dict[str | None, Device],
                 budget: int) -> None:
    """Run a schedule's items under `budget` bytes per pool they write: the realize loop of realize.py, with the
    commands of the budget's plan (intermediates computed into buffers of their own, freed and recomputed as it
    says); only the roots and assigned nodes become buffers."""
    layout = items.budget_layout
    if layout is None:  # fixed by the signature (shapes, dtypes, devices, roots): worked out once per schedule
        layout = items.budget_layout = _layout(items, live, roots)
    assigned = [item.output for item in items if live[item.output].replaces is not None]  # type: ignore[union-attr]
    kept = layout.roots.union(assigned)
    uploads = frozenset([index for index, node in enumerate(live)
                         if node is not None and node.buffer is None and node.op is Op.BUFFER])
    nbytes, pools = layout.nbytes, layout.pools
    capture_only = _held_by_capture_only()
    baseline = {pool.name: pool.used_bytes - capture_only.get(pool.name, 0) for pool in layout.pool_objects}
    budgeted = sorted({device.pool.name for device in devices.values()})
    key = (budget, tuple(sorted(baseline.items())), kept, uploads)
    plans = layout.plans
    plan = plans.get(key)
    if plan is None:
        plan_items = [_plan_item(item, live) for item in items]
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
        plans[key] = plan
    for record in profile.current():
        record.recomputed_kernels += plan.recomputed
        for pool_name in budgeted:
            planned = plan.peak_bytes.get(pool_name, 0)
            record.planned_peak_bytes[pool_name] = max(record.planned_peak_bytes.get(pool_name, 0), planned)
    if CONTEXT.get().debug_level >= 1:
        peaks = ", ".join(f"{name} {plan.peak_bytes.get(name, 0)}" for name in budgeted)
        profile.debug_print(1, f"memory budget {budget} bytes: planned peak {peaks}; {plan.recomputed} commands "
                               f"recomputed")
    if plan.last_read is None:  # per position, the last command reading it (for in-place assigns)
        plan.last_read = {}
        for index, command in enumerate(plan.commands):
            if command >= 0:
                item = items[command]
                for position in (item.source,) if item.__class__ is CachedCopy else item.inputs:
                    plan.last_read[position] = index
    originals = {item.output: live[item.output] for item in items}
    table = live  # (the realize's own table: no other list holds the nodes, as in_place.schedule_hold expects)
    for index, command in enumerate(plan.commands):
        if command < 0:
            table[~command] = None
            continue
        item = items[command]
        original: Node = originals[item.output]  # type: ignore[assignment]
        if item.output in kept:
            target = original
        else:  # a stand-in receives the buffer: the intermediate itself stays lazy
            target = Node(Op.CONTIGUOUS, (), None, original.shape, original.dtype, original.device)
        if index in plan.recomputes and CONTEXT.get().debug_level >= 2:
            profile.debug_print(2, f"  recompute of {'a copy' if item.__class__ is CachedCopy else 'a kernel'} "
                                   f"(item {command} of {len(items)}) under the memory budget:")
        if item.__class__ is CachedCopy:
            run_copy(target, table[item.source])  # type: ignore[arg-type]
        else:
            held = None
            replaced = target.replaces
            if replaced is not None and not any(_reaches(originals[position], replaced) for position in item.inputs
                                                if position in originals and position not in kept):
                # (in place only when no intermediate it reads reaches the replaced node: one staying lazy would
                # read the overwritten buffer if a tensor holding it were read later)
                held = schedule_hold(replaced, table, plan.last_read, index)
            del replaced
            run_kernel(target, item.kernel, [table[i] for i in item.inputs], held,  # type: ignore[misc]
                       devices[target.device])
        table[item.output] = target


class _Layout(NamedTuple):
    """What a schedule's positions are, for its budget plans (the same at every realize of the schedule), and the
    plans made for it by (budget, bytes held before, kept, uploads)."""

    nbytes: dict[int, int]
    pools: dict[int, str]
    pool_objects: list[MemoryPool]
    roots: frozenset[int]
    plans: dict[tuple, BudgetPlan]


def _layout(items: Schedule, live: list[Node | None], roots: list[Node]) -> _Layout:
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
    """The planner's view of a schedule item: its positions and its work."""
    if item.__class__ is CachedCopy:
        return PlanItem(item.output, (item.source,), live[item.source].size)  # type: ignore[union-attr]
    return PlanItem(item.output, item.inputs, sum(math.prod(step.shape) for step in item.kernel.steps))
