"""Compiling a schedule's new kernels before it runs (a cold start compiles many): lowered in order on this thread
while compiler runs build the batches already lowered, in parallel, with a progress bar for a long cold compile."""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextvars import copy_context
from functools import partial
from typing import Any, cast

from ember.backends.base import Device
from ember.core.graph import Node
from ember.ir.ir import KernelIR, topological_nodes
from ember.ir.kernel import Kernel
from ember.progress import Progress
from ember.scheduler import compile_cache, quick_compile, shape_classes
from ember.scheduler.devices import get_device
from ember.scheduler.program import CommandProgram, Launch

PROGRESS_MIN_KERNELS = 8  # a cold compile of this many kernels or more shows a progress bar (ember/progress.py)
# what is left once all are lowered goes to the compiler threads in parts, each thread that frees taking the next: a
# part is a TAIL_SHARE_PER_CORE-th of a core's share of what is left, so parts shrink as the work runs out and the
# cores finish close together (equal parts, 5 of them on 2 cores, left one core idle for a whole part: 0.3 s of
# nanoGPT's 2.7 s cold step); a cost estimate off by 2x for a part (a register tile's compile is slower per node than
# an elementwise kernel's) then costs a fraction of a small part at the end
TAIL_SHARE_PER_CORE = 2
# while lowering goes on, a compiler run takes the kernels lowered since the last one, up to this part of a core's
# share of all the compile work left (a run that took everything lowered near the end would run on alone)
LOWERING_PARTS_PER_CORE = 3
# ... but no part below this cost (in nodes, ~0.1-0.2 s of gcc): a compiler run starts in ~20 ms whatever it builds,
# so the small kernels of an optimizer step (nanoGPT's AdamW: 27 of 17-55 nodes) share a few runs, not one part each
MIN_PART_COST = 1000
COMPILE_COST_FIXED = 50  # a compiler run's cost of a kernel beyond its IR nodes, in nodes (see _compile_cost)
# a packed matmul's tile library (c_matmul.py), built at the first kernel of its tile shape in a process: ~0.2-0.3 s
# of gcc; counted so that the parts that build them are spread over the cores, not left in one part at the end
PACKED_LIBRARY_COST = 1200
PACKED_TILES: set[tuple[str, tuple[int, ...]]] = set()  # (device, tile shape) of the packed kernels costed so far


def compile_ahead(items: CommandProgram, graph_nodes: list[Node]) -> None:
    """Compile the kernels of a schedule that are not in the compile cache yet, each device's in batches (one
    compiler run each): in parallel on devices that allow concurrent compiles, as one batch elsewhere. Flat kernels
    alike but for their element count (an optimizer's per-parameter updates) share one class kernel, built with the
    batch (shape_classes.batch_classes). A single new kernel is left to its launch."""
    missing: dict[str, dict[Kernel, None]] = {}
    devices: dict[str, Device] = {}
    compiled = compile_cache.COMPILED
    for item in items.steps:
        if not isinstance(item, Launch) or graph_nodes[item.output].size == 0:
            continue
        device = get_device(cast(str, graph_nodes[item.output].device))
        kernel = cast(Kernel, item.kernel).code  # (kernels alike but for input offsets compile once)
        if (device.name, kernel) not in compiled and device.info.can_run:
            found = shape_classes.member(device, kernel) if shape_classes.enabled() else None
            if found is not None:  # a member of a shape class: its compiled kernel launched with its sizes
                compiled.put((device.name, kernel), found)
                continue
            missing.setdefault(device.name, {})[kernel] = None
            devices[device.name] = device
    for name, kernels in missing.items():
        device, batch = devices[name], list(kernels)
        if len(batch) < 2:
            continue
        count = len(batch)
        batch, classes = shape_classes.batch_classes(device, batch)  # (flat kernels alike but for their sizes)
        with Progress(count, f"ember: compiling {count} kernels for {name}", "kernel",
                      shown=count >= PROGRESS_MIN_KERNELS) as progress:
            if device.info.concurrent_compile:
                _compile_pipelined(device, batch, classes, progress)
            else:
                if classes:
                    shape_classes.enter_batch_classes(device, classes,
                                                      shape_classes.build_batch_classes(device, classes))
                if batch:
                    compile_cache.compile_kernels(device, batch)
                progress.advance(count)


def _compile_pipelined(device: Device, batch: list[Kernel], classes: list[shape_classes.BatchClass],
                       progress: Progress) -> None:
    """Lower the kernels in order here and hand what is lowered to compiler threads, so compilers run while the next
    kernels are lowered (lowering is Python and holds the interpreter; a compiler run does not). While lowering goes
    on, one core is left to it: a compiler run starts whenever fewer than the other cores compile, with the kernels
    lowered since the last run up to a LOWERING_PARTS_PER_CORE-th of a core's share of the compile work left
    (`_compile_cost`; the kernels still to lower counted at the average so far): a compiler start costs tens of
    milliseconds whatever the batch, so runs gather batches, but a run that took everything lowered near the end of
    lowering would keep one core busy long after the others are done. Once all are lowered, each compiler thread
    that frees takes the next part of what is left (TAIL_SHARE_PER_CORE), down to MIN_PART_COST."""
    cores = os.cpu_count() or 1
    lowered: tuple[list[Kernel], list[KernelIR], list[int]] = ([], [], [])
    running: list[Future[Any]] = []
    futures: list[Future[Any]] = []
    total_cost = 0

    def submit(count: int) -> None:
        kernels, irs = lowered[0][:count], lowered[1][:count]
        del lowered[0][:count], lowered[1][:count], lowered[2][:count]
        # in the caller's context: the compiles are recorded in its profiles (ember/context.py)
        future = pool.submit(copy_context().run, _build, device, kernels, irs)
        future.add_done_callback(partial(_advance, progress, len(kernels)))
        running.append(future)
        futures.append(future)

    with ThreadPoolExecutor(max_workers=cores) as pool:
        classes_built = None
        if classes:  # (lowered already: built first, in one compiler run; entered here once built)
            classes_built = pool.submit(copy_context().run, shape_classes.build_batch_classes, device, classes)
            classes_built.add_done_callback(partial(_advance, progress, sum(len(made.members) for made in classes)))
            running.append(classes_built)
        for position, kernel in enumerate(batch):
            ir = compile_cache.lower_for(device, kernel)
            cost = _compile_cost(device, ir)
            total_cost += cost
            lowered[0].append(kernel)
            lowered[1].append(ir)
            lowered[2].append(cost)
            running[:] = [future for future in running if not future.done()]
            if len(running) < max(1, cores - 1):
                left = sum(lowered[2]) + total_cost / (position + 1) * (len(batch) - position - 1)
                submit(_first_part(lowered[2], left / (LOWERING_PARTS_PER_CORE * cores)))
        while lowered[0]:
            running[:] = [future for future in running if not future.done()]
            if len(running) >= cores:
                wait(running, return_when=FIRST_COMPLETED)
                continue
            share = sum(lowered[2]) / (TAIL_SHARE_PER_CORE * cores)
            submit(_first_part(lowered[2], max(share, MIN_PART_COST)))
        for future in futures:
            future.result()  # the first error, if any, is raised here
        if classes_built is not None:
            shape_classes.enter_batch_classes(device, classes, classes_built.result())


def _compile_cost(device: Device, ir: KernelIR) -> int:
    """A kernel's compile time in a unit of IR nodes: a fixed part and one per node (gcc -O3 on the MLP step's
    kernels: ~10 ms plus ~0.2 ms a node); a packed matmul's, its tile's library at the first call for the tile in
    this process (PACKED_TILES remembers it), else nothing."""
    if ir.packed is not None:  # (a call of its tile's library function: built at the tile's first kernel)
        tile = (device.name, (ir.packed.lanes, ir.packed.micro_rows, ir.packed.micro_vectors))
        if tile in PACKED_TILES:
            return 0
        PACKED_TILES.add(tile)
        return PACKED_LIBRARY_COST
    return COMPILE_COST_FIXED + len(topological_nodes(ir.sink))


def _first_part(costs: list[int], share: float) -> int:
    """How many of the first kernels (at least one) make up `share` of compile cost: each kernel is taken while
    at least half of it fits."""
    count, taken = 1, costs[0]
    while count < len(costs) and taken + costs[count] / 2 <= share:
        taken += costs[count]
        count += 1
    return count


def _build(device: Device, kernels: list[Kernel], irs: list[KernelIR]) -> list[compile_cache.CompiledKernel]:
    """Quick builds to launch now, the optimized ones following in the background (quick_compile.py), where the
    device makes them; else the optimized builds."""
    return quick_compile.compile_quickly(device, kernels, irs) or compile_cache.compile_kernels(device, kernels, irs)


def _advance(progress: Progress, count: int, _: Future[Any]) -> None:
    progress.advance(count)
