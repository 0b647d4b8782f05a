"""Realizing nodes: place, schedule (kernelize, cached by structure, as a command program), compile ahead, then run
the program with the executor over the graph's nodes (from its launch plan on the per-op path; under
ember.memory_budget, the budget's program); EMBER_DEBUG=1 output and peak bytes."""

from __future__ import annotations

import threading
from typing import Any, NamedTuple, cast

from ember.backends.base import MemoryPool
from ember.backends.launch_queue import close_queue, open_queue
from ember.settings import CONFIG
from ember.context import CONTEXT, CallContext
from ember.core import checks as value_checks
from ember.core.graph import Node
from ember.core.graph_templates import keep_for_copies, keep_stored
from ember.core.ops import Op
from ember.scheduler import compile_cache, profile
from ember.scheduler.buffers import DEFERRED_FREES, MAX_DEFERRED_FREES, buffer_of, read_node, release_finished
from ember.scheduler.compile_ahead import compile_ahead
from ember.scheduler.executor import execute
from ember.scheduler.launch_plan import LaunchPlan, bind_devices, plan_launches
from ember.scheduler.parallel import parallel_program
from ember.scheduler.lock import acquire, release
from ember.budget.memory_budget import run_budgeted
from ember.sharding.automatic import RECENT, compute_devices, shard_plan
from ember.sharding.decision import MINIMUM_ELEMENTS
from ember.scheduler.placement import place_graph
from ember.scheduler.program import CommandProgram
from ember.collection_pause import collection_paused
from ember.scheduler.schedule import SCHEDULES, stored_template_values

BUFFER = Op.BUFFER


def realize_nodes(nodes: list[Node], allow_sharding: bool = True) -> None:
    """Compute every unrealized node in `nodes` (and the stored nodes they need); a leaf of host data is uploaded.
    One thread at a time (lock.py); what the calling thread is inside of (grad mode, profiles, a budget, a capture,
    a trace, debug output) is its context (ember/context.py), read once here. Value checks the nodes carry
    (core/checks.py) are computed in the same schedule and raise their failure."""
    acquire()
    try:
        with collection_paused():  # scheduling and lowering build many short-lived objects (collection_pause.py)
            _realize(nodes, allow_sharding, CONTEXT.get())
    finally:
        release()


def _realize(nodes: list[Node], allow_sharding: bool, context: CallContext, checked: bool = False) -> None:
    pending = []
    for node in nodes:
        if node.checks is not None and not checked:
            _realize_checked(nodes, allow_sharding, context)
            return
        if node.op is not BUFFER:  # not realized
            pending.append(node)
        elif node.buffer is None:
            buffer_of(node)
    if not pending:
        return
    if allow_sharding and CONFIG.auto_shard is not False:
        for node in pending:  # the per-op path: one size comparison per output
            if node.size >= MINIMUM_ELEMENTS:
                if CONFIG.auto_shard or (context.recorder is None and context.budget is None):
                    place_graph(pending)
                    pending = _shard_large_outputs(pending)
                break
        if not pending:
            return
    if DEFERRED_FREES:
        release_finished(wait=len(DEFERRED_FREES) > MAX_DEFERRED_FREES)
    if context.viz_folder:
        from ember.viz import write_realize

        profile.debug_print(1, f"graph written to {write_realize(pending, context.viz_folder)}")
    program, graph_nodes = SCHEDULES.schedule(pending)  # places the graph (the placement pass), then keys it
    # nodes of templates' copies the program stores, kept for the copies after the run (graph_templates.keep_stored)
    stored = keep_for_copies(stored_template_values(program, graph_nodes)) if program.extra_slots else None
    if context.trace is not None:  # ember.record_trace / EMBER_TRACE
        context.trace.record_realize(cast(tuple, SCHEDULES.last_key), list(program.steps), graph_nodes,
                                     program.extra_slots)
    gather = False
    if CONFIG.parallel_kernels:  # graph-parallel execution: independent steps interleaved, launches gathered
        program, gather = parallel_program(program, graph_nodes)
    compiled = compile_cache.COMPILED
    stamp = (compiled, compiled.generation)
    if program.compiled_stamp != stamp:  # else every kernel is still in the compile cache since the last realize
        SCHEDULES.drop_stale_plans(stamp)
        compile_ahead(program, graph_nodes)
        if (compile_cache.COMPILED, compile_cache.COMPILED.generation) == stamp:
            program.compiled_stamp = stamp
    elif context.plain:  # nothing to record, time, budget or print: the per-op path, from the program's plan
        plan = program.launch_plan
        if plan is None or not plan.holds(stamp):
            plan = program.launch_plan = plan_launches(program, graph_nodes, stamp)
        if plan.runnable:
            live = _live_nodes(program, graph_nodes)
            del graph_nodes
            runs = WATCH.runs
            if runs is not None:  # (a backward pass being recorded: autograd/backward_replay.py)
                runs.append(PlanRun(program, plan, gather, [
                    None if node is None else
                    SlotNode(id(node), node.op is BUFFER, node.replaces is not None, node.shape, node.dtype,
                             node.device) for node in live]))
            run_plan(program, plan, live, gather)
            if stored:
                keep_stored(stored)
            return
    if WATCH.runs is not None:
        WATCH.runs.append(None)  # (a run off the plan path: not one a replay can repeat)
    records = context.profiles
    for record in records:
        record.realizes += 1
    if context.debug_level >= 1:
        profile.debug_print(1, f"realize: {len(program)} items for {len(pending)} tensors")
    # hold only the nodes the program reads or writes, and each only until its last use (its Free commands), so an
    # intermediate buffer is released as soon as the last kernel reading it has been launched
    live = _live_nodes(program, graph_nodes)
    del graph_nodes
    bindings, pools = bind_devices(program, live)
    for pool in pools:
        pool.peak_bytes = pool.used_bytes  # peak bytes are reported per realize
    if context.budget is not None:  # ember.memory_budget: intermediates freed early and recomputed as planned
        run_budgeted(program, live, pending, pools, context.budget)
    else:
        execute(program.commands, bindings, live, program.last_use, gather=gather,
                small_assigns_anywhere=context.recorder is None)
    if stored:
        keep_stored(stored)
    _record_peaks(records, pools)


def run_plan(program: CommandProgram, plan: LaunchPlan, live: list[Node | None], gather: bool = False) -> None:
    """Run `program` over the nodes `live` (by slot; the program's Frees empty it as it goes) from its launch plan:
    the per-op path of a realize, and a backward pass replayed (autograd/backward_replay.py). The caller holds the
    scheduler's lock."""
    for pool in plan.pools:
        pool.peak_bytes = pool.used_bytes  # peak bytes are reported per realize
    # host kernels run back to back at the end (backends/launch_queue.py), after the uploads of the host data the
    # program reads (an upload runs what the queue holds: at their first use, a training step's random draws' keys
    # split its launches into three runs)
    opened = plan.queued and not gather and open_queue()
    if opened:
        _upload_leaves(plan.leaves, live)
    try:
        execute(program.commands, plan.bindings, live, program.last_use, gather=gather, small_assigns_anywhere=True)
    finally:
        if opened:
            close_queue()


class SlotNode(NamedTuple):
    """What a watch notes of a slot's node before a run: its id (no reference: the run frees each intermediate after
    its last use), whether it was realized and whether it was an in-place assign, its shape, dtype and device."""

    identity: int
    realized: bool
    assign: bool
    shape: tuple[int, ...]
    dtype: Any
    device: str | None


class PlanRun(NamedTuple):
    """A realize's run from its launch plan, as a watch sees it before the run: the program, the plan, whether it
    gathered launches, and the node of each slot (None: a slot the program does not use)."""

    program: CommandProgram
    plan: LaunchPlan
    gather: bool
    slots: list[SlotNode | None]


class RealizeWatch(threading.local):
    """What the realizes of this thread ran while `runs` is a list (None: not watched): a PlanRun per run from a
    launch plan, None per run otherwise. A backward pass being recorded for replays watches its realize."""

    runs: list[PlanRun | None] | None = None


WATCH = RealizeWatch()


def _upload_leaves(leaves: tuple[int, ...], live: list[Node | None]) -> None:
    """Upload the host data of the program's leaves at slots `leaves` of `live`. A function of its own, so that no
    name of the caller's frame still holds the last leaf when its kernels run: an assign's kernel writes into the
    buffer it replaces only when nothing but the schedule refers to it (in_place.reusable_buffer counts references)."""
    for index in leaves:
        leaf = cast(Node, live[index])
        if leaf.buffer is None:
            buffer_of(leaf)


def _realize_checked(nodes: list[Node], allow_sharding: bool, context: CallContext) -> None:
    """_realize for nodes with value checks: the checks' violations are realized with them, then read."""
    checks = value_checks.pending(nodes)
    violations = [cast(Node, check.violation) for check in checks]
    _realize(nodes + violations, allow_sharding, context, checked=True)
    if context.recorder is not None:  # ember.jit: a replay reads the violations again
        for check in checks:
            context.recorder.check(buffer_of(cast(Node, check.violation)), check.describe)
    value_checks.settle(checks, nodes, read_node)


def _live_nodes(program: CommandProgram, graph_nodes: list[Node]) -> list[Node | None]:
    """The executor's table of slots for eager realize: the nodes the program's steps read or write (each dropped
    after its last use), None for the rest (the nodes fused into kernels)."""
    live: list[Node | None] = [None] * len(graph_nodes)
    for index in program.used:
        live[index] = graph_nodes[index]
    return live


def _record_peaks(records: tuple[profile.Profile, ...], pools: set[MemoryPool]) -> None:
    """Each pool's high-water mark of this realize into the active profiles."""
    for record in records:
        for pool in pools:
            record.peak_bytes[pool.name] = max(record.peak_bytes.get(pool.name, 0), pool.peak_bytes)


def _shard_large_outputs(pending: list[Node]) -> list[Node]:
    """Compute the large outputs that automatic sharding splits across devices (sharding/decision.py decides, or
    EMBER_AUTO_SHARD=1 splits every one); return the rest."""
    remaining = []
    for node in pending:
        plan = shard_plan(node, compute_devices, CONFIG.auto_shard)
        if plan is None:
            remaining.append(node)
            continue
        profile.debug_print(1, f"auto-shard: {RECENT[-1].describe()}")
        realize_nodes([plan], allow_sharding=False)
        node.become_buffer(plan.buffer)
    return remaining

