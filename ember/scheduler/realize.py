"""Realizing nodes: place, schedule (kernelize, cached by structure), compile ahead, then run each kernel and copy in
order, releasing every intermediate buffer after its last reader; EMBER_DEBUG=1 output and peak bytes."""

from __future__ import annotations

from ember.backends.config import CONFIG
from ember.core.graph import Node
from ember.scheduler import profile
from ember.scheduler.buffers import DEFERRED_FREES, MAX_DEFERRED_FREES, buffer_of, release_finished
from ember.scheduler.compile_cache import compile_ahead
from ember.scheduler.copies import run_copy
from ember.scheduler.devices import get_device
from ember.scheduler.in_place import schedule_hold
from ember.scheduler.launch import run_kernel
from ember.scheduler.placement import place
from ember.scheduler.schedule import SCHEDULES, CachedCopy, CachedKernel


def realize_nodes(nodes: list[Node], allow_sharding: bool = True) -> None:
    """Compute every unrealized node in `nodes` (and the stored nodes they need); a leaf of host data is uploaded."""
    pending = []
    for node in nodes:
        if not node.realized:
            pending.append(node)
        elif node.buffer is None:
            buffer_of(node)
    if not pending:
        return
    if CONFIG.auto_shard and allow_sharding:
        place(pending)
        pending = _shard_large_outputs(pending)
        if not pending:
            return
    if DEFERRED_FREES:
        release_finished(wait=len(DEFERRED_FREES) > MAX_DEFERRED_FREES)
    if profile.VizFolder.value:
        from ember.viz import write_realize

        profile.debug_print(1, f"graph written to {write_realize(pending, profile.VizFolder.value)}")
    items, graph_nodes = SCHEDULES.schedule(pending)  # places the graph as it walks it
    compile_ahead(items, graph_nodes)
    for record in profile.current():
        record.realizes += 1
    if profile.DebugLevel.value >= 1:
        profile.debug_print(1, f"realize: {len(items)} items for {len(pending)} tensors")
    # hold only the nodes the schedule reads or writes, and each only until its last use, so an intermediate
    # buffer is released as soon as the last kernel reading it has been launched
    last_use: dict[int, int] = {}
    for position, item in enumerate(items):
        for index in _item_nodes(item):
            last_use[index] = position
    live = {index: graph_nodes[index] for index in last_use}
    del graph_nodes
    pools = {get_device(live[item.output].device).pool for item in items}
    for pool in pools:
        pool.peak_bytes = pool.used_bytes  # peak bytes are reported per realize
    for position, item in enumerate(items):
        if isinstance(item, CachedCopy):
            run_copy(live[item.output], live[item.source])
        else:
            output = live[item.output]
            replaced = output.replaces
            held = None if replaced is None else schedule_hold(replaced, live, last_use, position)
            del replaced
            run_kernel(output, item.kernel, [live[i] for i in item.inputs], held)
        for index in _item_nodes(item):
            if last_use[index] == position:
                del live[index]
    for record in profile.current():
        for pool in pools:
            record.peak_bytes[pool.name] = max(record.peak_bytes.get(pool.name, 0), pool.peak_bytes)


def _shard_large_outputs(pending: list[Node]) -> list[Node]:
    """Compute large outputs split across every compute device (automatic sharding); return the rest."""
    from ember.scheduler.auto_shard import compute_devices, shard_plan

    devices = compute_devices()
    remaining = []
    for node in pending:
        plan = shard_plan(node, devices)
        if plan is None:
            remaining.append(node)
            continue
        profile.debug_print(1, f"auto-shard: {node} across {', '.join(devices)}")
        realize_nodes([plan], allow_sharding=False)
        node.become_buffer(plan.buffer)
    return remaining


def _item_nodes(item: CachedKernel | CachedCopy) -> tuple[int, ...]:
    if isinstance(item, CachedCopy):
        return (item.output, item.source)
    return (item.output, *item.inputs)
