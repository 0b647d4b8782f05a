"""Launch plans: a cached schedule's kernels with their devices, sizes and compiled programs looked up once, so a
realize of a graph seen before goes straight to the launches (the per-op path: no compile-cache lookup, no device
or size work per kernel). A plan holds while the compile cache keeps its stamp and the devices are the same."""

from __future__ import annotations

import math
from typing import NamedTuple, cast

from ember.backends.base import Device, MemoryPool
from ember.backends.registry import REGISTRY
from ember.core.dtype import DType
from ember.core.graph import Node
from ember.ir.kernel import Kernel
from ember.scheduler import compile_cache
from ember.scheduler.buffers import Buffer
from ember.scheduler.compile_cache import CompiledKernel
from ember.scheduler.copies import run_copy
from ember.scheduler.devices import get_device
from ember.scheduler.in_place import schedule_hold
from ember.scheduler.launch import launch_compiled, run_kernel
from ember.scheduler.schedule import CachedCopy, CachedKernel, Schedule


class PlannedKernel(NamedTuple):
    """A schedule item's kernel with what its launch needs: the compiled program, the device, the output's size and
    dtype, and the node positions whose last use it is (released after it)."""

    output: int
    inputs: tuple[int, ...]
    kernel: Kernel
    compiled: CompiledKernel
    device: Device
    size: int
    dtype: DType
    releases: tuple[int, ...]


class PlannedCopy(NamedTuple):
    output: int
    source: int
    releases: tuple[int, ...]


class LaunchPlan:
    """The steps of one schedule, for the compile cache stamp `stamp` and the devices `devices`, found in the
    registry's device lists `device_lists` (backend, list). `runnable` is False for a schedule that cannot be
    planned (its realizes take the general path)."""

    def __init__(self, steps: list[PlannedKernel | PlannedCopy] | None, stamp: tuple[object, int],
                 devices: list[Device], device_lists: dict[str, list[Device]]) -> None:
        self.runnable = steps is not None
        self.steps = steps or []
        self.stamp = stamp
        self.pools: tuple[MemoryPool, ...] = tuple({device.pool: None for device in devices})
        self.device_lists = tuple(device_lists.items())

    def holds(self, stamp: tuple[object, int]) -> bool:
        """Whether the plan is still right: the compile cache has the same stamp (no program left it or was
        swapped) and the registry has the same devices (a backend probed again, or a device swapped by a test)."""
        if stamp != self.stamp:
            return False
        table = REGISTRY.devices
        for backend, listed in self.device_lists:
            if table.get(backend) is not listed:
                return False
        return True

    def run(self, live: list[Node | None], last_use: dict[int, int]) -> None:
        """Run every step on the nodes of `live` (by position), releasing each node after its last use. An output
        that replaces a node (an in-place assign) goes through run_kernel, which decides whether it writes in place."""
        for position, step in enumerate(self.steps):
            output: Node = live[step.output]  # type: ignore[assignment]
            if isinstance(step, PlannedCopy):
                run_copy(output, live[step.source])  # type: ignore[arg-type]
            elif output.replaces is None:
                buffer = Buffer(step.device, step.size, step.dtype)
                inputs: list[Node] = list(map(live.__getitem__, step.inputs))  # type: ignore[arg-type]
                launch_compiled(output, step.kernel, step.compiled, buffer, inputs, None, step.device)
                output.become_buffer(buffer)
            else:
                held = schedule_hold(output.replaces, live, last_use, position)
                run_kernel(output, step.kernel, [live[index] for index in step.inputs], held,  # type: ignore[misc]
                           step.device)
            del output
            for index in step.releases:
                live[index] = None


def plan_launches(items: Schedule, nodes: list[Node], stamp: tuple[object, int]) -> LaunchPlan:
    """The launch plan of a schedule whose kernels are all in the compile cache; one that is not `runnable` when a
    kernel is not (it is compiled at its launch) or the schedule has an empty output or a device that cannot run
    kernels."""
    steps: list[PlannedKernel | PlannedCopy] = []
    devices: dict[str, Device] = {}
    device_lists: dict[str, list[Device]] = {}
    cache = compile_cache.COMPILED
    unplanned = LaunchPlan(None, stamp, [], {})
    for item, releases in zip(items, items.releases):
        output = nodes[item.output]
        name = cast(str, output.device)
        device = devices[name] = get_device(name)
        backend = name.partition(":")[0]
        listed = device_lists[backend] = REGISTRY.devices.get(backend)  # type: ignore[assignment]
        if listed is None or not any(entry is device for entry in listed):  # (named apart from its backend)
            return unplanned
        if item.__class__ is CachedCopy:
            steps.append(PlannedCopy(item.output, cast(CachedCopy, item).source, releases))
            continue
        item = cast(CachedKernel, item)
        size = math.prod(output.shape)
        compiled = cache.get((name, item.kernel))  # (marks the kernel used: plans are made again after an eviction)
        if size == 0 or not device.info.can_run or compiled is None:
            return unplanned
        steps.append(PlannedKernel(item.output, item.inputs, item.kernel, compiled, device, size, output.dtype,
                                   releases))
    return LaunchPlan(steps, stamp, list(devices.values()), device_lists)
