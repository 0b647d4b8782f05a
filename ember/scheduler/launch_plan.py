"""Binding command programs (program.py) for the executor. A launch plan is a program bound once for the compile
cache's stamp: each kernel step with its device, output size and compiled program looked up once, so a realize of a
graph seen before goes straight to the launches (the per-op path: no compile-cache lookup, no device or size work
per kernel). A plan holds while the compile cache keeps its stamp and the devices are the same. Also the general
path's binding (devices only) and a replay's (launches bound to its buffers)."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import cast

from ember.backends.base import Device, MemoryPool, Program
from ember.backends.registry import REGISTRY
from ember.core.graph import Node
from ember.core.ops import Op
from ember.scheduler import compile_cache
from ember.scheduler.buffers import Buffer
from ember.scheduler.devices import get_device
from ember.scheduler.executor import BoundLaunch, JoinedLaunches
from ember.scheduler.program import CommandProgram, Free, Launch, LaunchBinding


class LaunchPlan:
    """Per command of one program, its LaunchBinding (None for copies and frees), for the compile cache stamp `stamp`
    and the devices `devices`, found in the registry's device lists `device_lists` (backend, list). `runnable` is False
    for a program that cannot be planned (its realizes bind it at each run)."""

    def __init__(self, bindings: list[LaunchBinding | None] | None, stamp: tuple[object, int], devices: list[Device],
                 device_lists: dict[str, list[Device]], leaves: tuple[int, ...] = ()) -> None:
        self.runnable = bindings is not None
        self.bindings = bindings or []
        # whether a realize holds its host launches in the launch queue (backends/launch_queue.py): two or more
        self.queued = sum(binding is not None for binding in self.bindings) >= 2
        # the slots of the graph's leaves the program reads (realized nodes, or host data a first use uploads: a
        # queued realize uploads those before it holds a launch, as an upload runs what the queue holds first)
        self.leaves = leaves
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


def plan_launches(program: CommandProgram, nodes: list[Node], stamp: tuple[object, int]) -> LaunchPlan:
    """The launch plan of a program whose kernels are all in the compile cache; one that is not `runnable` when a
    kernel is not (it is compiled at its launch) or the program has an empty output or a device that cannot run
    kernels."""
    bindings: list[LaunchBinding | None] = []
    devices: dict[str, Device] = {}
    device_lists: dict[str, list[Device]] = {}
    cache = compile_cache.COMPILED
    unplanned = LaunchPlan(None, stamp, [], {})
    for command in program.commands:
        if command.__class__ is Free:
            bindings.append(None)
            continue
        output = nodes[command.output]  # type: ignore[union-attr]
        name = cast(str, output.device)
        device = devices[name] = get_device(name)
        backend = name.partition(":")[0]
        listed = device_lists[backend] = REGISTRY.devices.get(backend)  # type: ignore[assignment]
        if listed is None or not any(entry is device for entry in listed):  # (named apart from its backend)
            return unplanned
        if command.__class__ is not Launch:  # a copy
            bindings.append(None)
            continue
        kernel = cast(Launch, command).kernel
        size = math.prod(output.shape)
        compiled = cache.get((name, kernel))  # (marks the kernel used: plans are made again after an eviction)
        if size == 0 or not device.info.can_run or compiled is None:
            return unplanned
        bindings.append(LaunchBinding(device, compiled, size, output.dtype))
    leaves = tuple(index for index in program.used if nodes[index].op is Op.BUFFER)
    return LaunchPlan(bindings, stamp, list(devices.values()), device_lists, leaves)


def bind_devices(program: CommandProgram,
                 nodes: list[Node | None]) -> tuple[list[LaunchBinding | None], set[MemoryPool]]:
    """The program's kernel steps bound to their devices only (compiled at their launch: the general path, where a
    launch may be timed, recorded or budgeted), and the pools its steps write."""
    names = program.command_devices
    if names is None:  # fixed by the key (it holds every node's device): worked out once
        names = program.command_devices = tuple(
            None if command.__class__ is Free else cast(Node, nodes[command.output]).device  # type: ignore[union-attr]
            for command in program.commands)
    devices: dict[str | None, Device] = {}
    for name in names:
        if name is not None and name not in devices:
            devices[name] = get_device(name)
    bindings = [None if name is None or command.__class__ is not Launch else LaunchBinding(devices[name], None, 0, None)
                for name, command in zip(names, program.commands)]
    return bindings, {device.pool for device in devices.values()}


def bind_buffers(program: CommandProgram, bindings: Sequence[LaunchBinding | None],
                 buffers: Sequence[Buffer | None]) -> list[BoundLaunch | JoinedLaunches | None]:
    """A replay's binding (ember.jit, incremental updates): per command, its kernel step's launch bound to the
    buffers of its slots (Program.bind), or None for a copy, a free and a launch touching a slot that is bound anew
    at each run (None in `buffers`); then each run of bound launches on one device that joins them
    (Device.join_launches: cuda's graphs) as a JoinedLaunches at the run's first command."""
    binding = _bind(program, bindings, buffers, ())
    assert binding is not None  # (no slot to point anew)
    return binding[0]


Rebinding = tuple[list[BoundLaunch | JoinedLaunches | None], dict[int, list[tuple[Program, BoundLaunch, int]]]]


def bind_rebindable(program: CommandProgram, bindings: Sequence[LaunchBinding | None],
                    buffers: Sequence[Buffer | None], slots: Collection[int]) -> Rebinding | None:
    """bind_buffers for a replay whose `slots` hold other buffers at each run (a new batch, an optimizer step's new
    gradients), every launch bound to `buffers` (all filled) and joined: the binding, and per slot the launches
    reading or writing it, as (program, bound launch, the buffer's index in the launch), each pointed at the slot's
    next buffer by Program.rebind before a run. None where a launch touching the slots cannot be (its device binds
    none in place): the caller launches those one by one with the run's buffers."""
    return _bind(program, bindings, buffers, slots)


def _bind(program: CommandProgram, bindings: Sequence[LaunchBinding | None], buffers: Sequence[Buffer | None],
          slots: Collection[int]) -> Rebinding | None:
    """bind_buffers, noting for each of `slots` the launches touching it (bind_rebindable); None where one of
    those cannot be pointed at another buffer."""
    bound: list[BoundLaunch | JoinedLaunches | None] = []
    targets: dict[int, list[tuple[Program, BoundLaunch, int]]] = {slot: [] for slot in slots}
    for command, step in zip(program.commands, bindings):
        if command.__class__ is not Launch or step is None:
            bound.append(None)
            continue
        launched = (command.output, *command.inputs)  # type: ignore[union-attr]
        if any(buffers[slot] is None for slot in launched):
            bound.append(None)
            continue
        handles = [cast(Buffer, buffers[slot]).handle for slot in launched]
        compiled = step.compiled.program
        launch = compiled.bind(handles, step.compiled.ir.global_size)
        for index, slot in enumerate(launched):
            if slot in targets:
                if not compiled.rebind(launch, index, handles[index]):
                    return None
                targets[slot].append((compiled, launch, index))
        bound.append(launch)
    _join_runs(program, bindings, bound)
    return bound, targets


def _join_runs(program: CommandProgram, bindings: Sequence[LaunchBinding | None],
               bound: list[BoundLaunch | JoinedLaunches | None]) -> None:
    """Replace each run of at least two bound launches on one device (Frees between them kept in the run; a copy,
    a host step or a launch bound anew at each run ends it) by the device's joined launch, where it has one."""
    run: list[int] = []  # positions of the launches of the run being gathered

    def close() -> None:
        if len(run) >= 2:
            device = cast(LaunchBinding, bindings[run[0]]).device
            joined = device.join_launches([cast(BoundLaunch, bound[position]) for position in run])
            if joined is not None:
                bound[run[0]] = JoinedLaunches(joined, run[-1] + 1)
        run.clear()

    for position, command in enumerate(program.commands):
        kind = command.__class__
        if kind is Free:
            continue
        step = bindings[position]
        if kind is Launch and bound[position] is not None and step is not None:
            if run and cast(LaunchBinding, bindings[run[0]]).device is not step.device:
                close()
            run.append(position)
        else:
            close()
    close()
