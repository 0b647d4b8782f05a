"""The memory budget's plan (a pure function): which intermediates of a schedule to free early and recompute
before their later uses so that no pool's live bytes exceed the budget (rematerialization)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import NamedTuple


class PlanItem(NamedTuple):
    """One command of a schedule: it writes position `output` from positions `inputs`, doing `work` (elements
    computed, summed over the kernel's steps: a matmul's multiplies count M * N * K; a copy's elements)."""

    output: int
    inputs: tuple[int, ...]
    work: int


@dataclass
class BudgetPlan:
    """The commands to run in order: `n >= 0` runs item n (again, where it was run before: a recompute), `~p` (< 0)
    frees the intermediate at position p. `peak_bytes`: per pool, the most live bytes the plan reaches (what the pool
    held before plus what it allocates); `recomputed`: how many commands run an item again."""

    commands: list[int] = field(default_factory=list)
    peak_bytes: dict[str, int] = field(default_factory=dict)
    recomputed: int = 0
    recomputes: set[int] = field(default_factory=set)  # the indices in `commands` that run an item again


class BudgetTooSmall(Exception):
    """No plan fits: raised inside `plan_budget` with the pool that ran out (the caller reports the needed peak)."""

    def __init__(self, pool: str) -> None:
        super().__init__(pool)
        self.pool = pool


def plan_budget(items: list[PlanItem], nbytes: dict[int, int], pools: dict[int, str], kept: frozenset[int],
                uploads: frozenset[int], baseline: dict[str, int], budgets: dict[str, int],
                max_recomputes: int | None = None) -> BudgetPlan:
    """Plan a schedule's commands so that each pool in `budgets` stays within its bytes, or raise BudgetTooSmall.

    Positions written by an item are intermediates, except `kept` ones (outputs the caller keeps: they are allocated
    when written and never freed). Other positions are leaves: already in `baseline` (each pool's bytes before the
    realize), or `uploads` (host data allocated at its first use, then kept). An intermediate is freed after its last
    reader; when an allocation would exceed its pool's budget, the resident intermediates no command in progress
    reads are evicted one at a time, the one with the most bytes freed for the longest time per unit of recompute
    work first (bytes * commands until its next use / work of its producer and of the producers of its inputs that
    are not resident); what commands waiting on the stack read goes last. An evicted intermediate is recomputed
    before its next reader, with its own evicted inputs first (on an explicit stack; an input evicted again before
    its reader runs is recomputed again). More than `max_recomputes` recomputes (default 8 per item) counts as not
    fitting."""
    producer = {item.output: index for index, item in enumerate(items)}
    uses: dict[int, list[int]] = {}
    for index, item in enumerate(items):
        for position in item.inputs:
            uses.setdefault(position, []).append(index)
    limit = 8 * len(items) + 64 if max_recomputes is None else max_recomputes
    live = dict(baseline)
    plan = BudgetPlan(peak_bytes=dict(baseline))
    resident: set[int] = set()
    uploaded: set[int] = set()
    pins: dict[int, int] = {}
    now = 0

    def evictable(position: int) -> bool:
        return position in producer and position not in kept

    def release(position: int) -> None:
        resident.discard(position)
        live[pools[position]] -= nbytes[position]
        plan.commands.append(~position)

    def score(position: int) -> tuple[float, int]:
        readers = uses.get(position, [])
        next_index = bisect_left(readers, now)
        distance = (readers[next_index] - now + 1) if next_index < len(readers) else len(items) + 1
        item = items[producer[position]]
        work = item.work + sum(items[producer[source]].work for source in item.inputs
                               if evictable(source) and source not in resident)
        return nbytes[position] * distance / max(1, work), position

    def charge(position: int, reading: tuple[int, ...]) -> None:
        pool, size = pools[position], nbytes[position]
        budget = budgets.get(pool)
        while budget is not None and live.get(pool, 0) + size > budget:
            # never what the command being placed reads; what a command waiting on the stack reads only when
            # nothing else is left (it is recomputed again if its reader finds it gone)
            candidates = [other for other in resident if pools[other] == pool and other not in reading]
            if not candidates:
                raise BudgetTooSmall(pool)
            release(max(candidates, key=lambda other: (not pins.get(other), *score(other))))
        live[pool] = live.get(pool, 0) + size
        plan.peak_bytes[pool] = max(plan.peak_bytes.get(pool, 0), live[pool])

    def run(index: int) -> None:
        stack = [(index, False)]
        while stack:
            current, ready = stack.pop()
            item = items[current]
            if not ready:
                if current != index and item.output in resident:  # recomputed already for another reader
                    continue
                for position in item.inputs:
                    pins[position] = pins.get(position, 0) + 1
            missing = [position for position in dict.fromkeys(item.inputs)
                       if evictable(position) and position not in resident]
            if missing:  # not computed yet, or evicted again while another input was recomputed
                stack.append((current, True))
                stack.extend((producer[position], False) for position in missing)
                continue
            for position in item.inputs:
                if position in uploads and position not in uploaded:
                    uploaded.add(position)
                    charge(position, item.inputs)
            charge(item.output, item.inputs)
            plan.commands.append(current)
            if evictable(item.output):
                resident.add(item.output)
            for position in item.inputs:
                pins[position] -= 1
            if current != index:
                plan.recomputes.add(len(plan.commands) - 1)
                plan.recomputed += 1
                if plan.recomputed > limit:
                    raise BudgetTooSmall(pools[item.output])

    for now, item in enumerate(items):
        run(now)
        # free what no later item reads: this item's inputs and output, and what recomputes brought back
        for position in sorted(resident):
            readers = uses.get(position, [])
            if bisect_left(readers, now + 1) == len(readers):
                release(position)
    return plan


def smallest_budget(items: list[PlanItem], nbytes: dict[int, int], pools: dict[int, str], kept: frozenset[int],
                    uploads: frozenset[int], baseline: dict[str, int], budgeted: list[str]) -> int:
    """The smallest budget (the same for every pool in `budgeted`) for which `plan_budget` finds a plan: a bisection
    between 0 and the peak of the plan that frees intermediates after their last readers only."""
    high = max(plan_budget(items, nbytes, pools, kept, uploads, baseline, {}).peak_bytes.get(pool, 0)
               for pool in budgeted)
    low = 0  # (a budget of 0 never fits: every pool holds something before it is asked for more)
    while high - low > 1:
        middle = (low + high) // 2
        try:
            plan_budget(items, nbytes, pools, kept, uploads, baseline, dict.fromkeys(budgeted, middle))
            high = middle
        except BudgetTooSmall:
            low = middle
    return high
