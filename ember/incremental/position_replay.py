"""Replaying an update at a position not seen before: the launches of a family's plan (families.py: one plan for
a range of decode positions) recorded at three positions of it are compared, and where everything that differs
between them is affine in the position (each launch's sizes read at launch, its work items and output size, the
offsets and sizes of the views of kept values it writes, the sizes of its temporaries), the recording is run at
any other position of the range with those numbers at it: no restricted graph, schedule or compile-cache lookup,
only the sizes written into the replay's own size buffers and the views made at their offsets.

Why the numbers are right at every position of the range, not only at the three: the family's restricted graphs
have arguments and shapes affine in the position, and the scheduler's passes over them (placement, graph rewrites,
kernelization) run once on those affine values with every decision they take recorded (`certified_interval`), so
over the interval returned the kernels are the same structure with arguments affine in the position; the sizes a
launch reads are those arguments, so the fit through three positions is exact there. The range is narrowed further
to where each class still holds its launches' values (the limits of their places, `shape_classes.variable_limits`);
a position where a view cannot be placed, or a class's loops pass the device's limit (wgpu on llvmpipe), falls back
to the ordinary recompute."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ember.backends.base import Event, wait_all
from ember.capture.arena import ArenaView
from ember.core import dtype as dtypes
from ember.core.graph import Node
from ember.incremental import affine
from ember.incremental.families import over_values
from ember.scheduler.buffers import Buffer, pending
from ember.scheduler.compile_cache import CompiledKernel
from ember.scheduler.executor import BoundLaunch, JoinedLaunches, execute
from ember.scheduler.launch_plan import bind_buffers
from ember.scheduler.lock import SCHEDULER_LOCK
from ember.scheduler.program import CommandProgram, Launch, LaunchBinding
from ember.scheduler.shape_classes import SizedProgram, variable_limits, within_loop_limit

Line = tuple[int, int]  # (value at t = 0, slope): value + slope * t
MAX_TEMPORARY_BYTES = 64 << 20  # a replay's temporaries, allocated for the largest position of its range


def fit(values: Sequence[int], positions: Sequence[int]) -> Line | None:
    """The line through (positions[i], values[i]) when the first two points give an integer slope and every other
    point lies on it; None otherwise."""
    (first, second), (value, next_value) = positions[:2], values[:2]
    if second == first or (next_value - value) % (second - first):
        return None
    slope = (next_value - value) // (second - first)
    base = value - slope * first
    if any(later != base + slope * position for later, position in zip(values[2:], positions[2:])):
        return None
    return base, slope


def at(line: Line, t: int) -> int:
    return line[0] + line[1] * t


def within(line: Line, minimum: float, maximum: float, low: int, high: int) -> tuple[int, int]:
    """[low, high] narrowed to the t at which minimum <= line(t) <= maximum (empty: low > high)."""
    base, slope = line
    if slope == 0:
        return (low, high) if minimum <= base <= maximum else (1, 0)
    first, last = (minimum - base) / slope, (maximum - base) / slope
    if slope < 0:
        first, last = last, first
    if first > -math.inf:
        low = max(low, math.ceil(first))
    if last < math.inf:
        high = min(high, math.floor(last))
    return low, high


@dataclass
class SizedLaunch:
    """A launch of a shape class's kernel at every t: its work items and variables' values as lines in t (the
    replay writes them into its own sizes buffer, `SizesTable`), launched with the most work items of the range
    (the kernel reads its count from the sizes)."""

    command: int
    program: Any  # the class's compiled program
    compiled: Any  # shape_classes.CompiledClass
    values: list[Line]
    work_items: Line
    binding: LaunchBinding  # as recorded (device, dtype, output size)


class SizesTable:
    """The sizes of a replay's class launches on one device, [work items, values...] per launch, as one int32
    buffer written once per run (a view of it per launch where the device's pool makes views; else a buffer each,
    written in turn)."""

    def __init__(self, launches: list[SizedLaunch], device: Any) -> None:
        lines = [[launch.work_items, *launch.values] for launch in launches]
        alignment = device.pool.view_alignment
        step = alignment // 4 if alignment > 0 and alignment % 4 == 0 else 0  # (int32 elements between views)
        self.starts: list[int] = []
        total = 0
        for entry in lines:
            self.starts.append(total)
            total += -(-len(entry) // step) * step if step else len(entry)
        self.base = np.zeros(total, np.int64)
        self.slope = np.zeros(total, np.int64)
        for start, entry in zip(self.starts, lines):
            self.base[start:start + len(entry)] = [line[0] for line in entry]
            self.slope[start:start + len(entry)] = [line[1] for line in entry]
        self.buffers: list[Buffer] = []
        if step:
            self.table: Buffer | None = Buffer(device, total, dtypes.int32)
            self.buffers = [ArenaView(self.table, start * 4, len(entry), dtypes.int32)
                            for start, entry in zip(self.starts, lines)]
        else:
            self.table = None
            self.buffers = [Buffer(device, len(entry), dtypes.int32) for entry in lines]
        self.lengths = [len(entry) for entry in lines]

    def write(self, t: int) -> None:
        sizes = (self.base + self.slope * t).astype(np.int32)
        if self.table is not None:
            self.table.write(sizes)
            return
        for buffer, start, length in zip(self.buffers, self.starts, self.lengths):
            buffer.write(sizes[start:start + length])


@dataclass
class View:
    """A slot holding a view of a kept value's buffer (a box written in place): its offset in bytes and its size in
    elements as lines in t."""

    slot: int
    arena: Buffer
    dtype: Any
    offset: Line
    size: Line


class PositionReplay:
    """A recorded recompute runnable at any t of [low, high] (see the module docstring); made by `make`."""

    def __init__(self, program: CommandProgram, buffers: list[Buffer | None], bindings: list[LaunchBinding | None],
                 input_slots: list[tuple[Node, int]], views: list[View], temporaries: list[tuple[int, Line]],
                 sized: list[SizedLaunch], low: int, high: int) -> None:
        self.program, self.buffers, self.bindings = program, buffers, bindings
        self.input_slots, self.views, self.temporaries, self.sized = input_slots, views, temporaries, sized
        self.low, self.high = low, high
        self.bound: list[BoundLaunch | JoinedLaunches | None] = []
        self.tables: list[SizesTable] = []
        self.unfinished: list[Event] = []  # the last run's commands where a device had not finished them
        self.value_buffers: list[Buffer] = []  # the kept values' buffers it writes (the runner checks they stay)
        self.loop_limited = False  # a device ends long loops (wgpu on llvmpipe): each run checks the loops

    @classmethod
    def make(cls, recordings: Sequence[tuple[int, Any]], low: int, high: int) -> PositionReplay | None:
        """The replay of recordings (t, runner.Replay) at three or more positions of a family whose interval (the
        family's, narrowed by `certified_interval`) is [low, high]; None where they differ other than by numbers
        affine in t (other commands, kernels compiled for their sizes, other kept buffers) or the temporaries would
        be too large."""
        positions = [t for t, _ in recordings]
        replays = [replay for _, replay in recordings]
        first = replays[0]
        commands = first.program.commands
        if len(recordings) < 3 or any(not low <= t <= high for t in positions) or any(
                len(replay.buffers) != len(first.buffers) or replay.input_slots != first.input_slots
                or len(replay.program.commands) != len(commands) for replay in replays):
            return None
        if any(command.__class__ is not Launch for command in commands):
            return None  # (copies and host steps are not replayed at other positions)
        for replay in replays:  # the same launches over the same slots (their kernels differ in sizes)
            if any(other.output != command.output or other.inputs != command.inputs  # type: ignore[union-attr]
                   for other, command in zip(replay.program.commands, commands)):
                return None
        input_slots = {slot for _, slot in first.input_slots}
        buffers: list[Buffer | None] = list(first.buffers)
        views: list[View] = []
        temporaries: list[tuple[int, Line]] = []
        for slot, buffer in enumerate(first.buffers):
            if slot in input_slots:
                continue
            each = [replay.buffers[slot] for replay in replays]
            if all(other is buffer for other in each):
                continue  # a weight or a kept value's whole buffer
            if all(type(other) is ArenaView and other.arena is buffer.arena and other.dtype == buffer.dtype
                   for other in each):
                offset = fit([other.offset for other in each], positions)
                size = fit([other.size for other in each], positions)
                if offset is None or size is None:
                    return None
                views.append(View(slot, buffer.arena, buffer.dtype, offset, size))
                buffers[slot] = None
            elif all(type(other) is Buffer and other.device is buffer.device and other.dtype == buffer.dtype
                     for other in each):
                size = fit([other.size for other in each], positions)
                if size is None:
                    return None
                temporaries.append((slot, size))
            else:
                return None
        sized: list[SizedLaunch] = []
        bindings: list[LaunchBinding | None] = list(first.bindings)
        for index, binding in enumerate(first.bindings):
            if binding is None:
                continue
            each = [replay.bindings[index] for replay in replays]
            compiled = [other.compiled for other in each]
            if any(other.device is not binding.device or other.dtype != binding.dtype for other in each):
                return None
            if all(isinstance(other.program, SizedProgram) for other in compiled):
                programs = [other.program for other in compiled]
                if any(program.program is not programs[0].program or program.compiled is None
                       or len(program.values) != len(programs[0].values) for program in programs):
                    return None
                values = [fit([program.values[number] for program in programs], positions)
                          for number in range(len(programs[0].values))]
                work_items = fit([other.ir.global_size for other in compiled], positions)
                size = fit([other.size for other in each], positions)
                if work_items is None or size is None or any(line is None for line in values):
                    return None
                class_ = programs[0].compiled
                assert class_ is not None
                for line, (minimum, maximum) in zip(values, variable_limits(class_)):  # (the class holds them)
                    low, high = within(line, minimum, maximum, low, high)  # type: ignore[arg-type]
                low, high = within(work_items, 0, math.inf, low, high)
                if low > high:
                    return None
                sized.append(SizedLaunch(index, programs[0].program, class_, values, work_items,  # type: ignore[arg-type]
                                         binding))
            elif any(other is not compiled[0] or replay.bindings[index].size != binding.size
                     for other, replay in zip(compiled, replays)):
                return None  # a kernel compiled for its sizes, which differ between the positions
        replay = cls(first.program, buffers, bindings, list(first.input_slots), views, temporaries, sized, low, high)
        if not replay._allocate_temporaries(first.buffers):
            return None
        replay._bind_sized()
        replay.loop_limited = any(getattr(launch.binding.device, "loop_limit", None) is not None for launch in sized)
        # launches over fixed slots are bound once; those writing views or reading inputs from their slots
        with SCHEDULER_LOCK:
            replay.bound = bind_buffers(first.program, replay.bindings, [None if slot in input_slots else buffer
                                                                         for slot, buffer in enumerate(replay.buffers)])
        return replay

    def _bind_sized(self) -> None:
        """Each class launch's binding: its program with its own sizes (a SizesTable per device), launched with the
        most work items of [low, high]."""
        by_device: dict[int, list[SizedLaunch]] = {}
        for launch in self.sized:
            by_device.setdefault(id(launch.binding.device), []).append(launch)
        for launches in by_device.values():
            table = SizesTable(launches, launches[0].binding.device)
            self.tables.append(table)
            for launch, sizes in zip(launches, table.buffers):
                most = max(at(launch.work_items, self.low), at(launch.work_items, self.high), 1)
                ir = replace(launch.binding.compiled.ir, global_size=most)
                program = SizedProgram(launch.program, sizes, (), launch.compiled)
                self.bindings[launch.command] = LaunchBinding(launch.binding.device, CompiledKernel(ir, program),
                                                              launch.binding.size, launch.binding.dtype)

    def _allocate_temporaries(self, recorded: list[Buffer | None]) -> bool:
        """The replay's own temporaries, each as large as it is at either end of [low, high]."""
        total = 0
        for slot, size in self.temporaries:
            buffer = recorded[slot]
            assert buffer is not None
            largest = max(at(size, self.low), at(size, self.high), 1)
            total += largest * buffer.dtype.itemsize
            if total > MAX_TEMPORARY_BYTES:
                return False
            self.buffers[slot] = Buffer(buffer.device, largest, buffer.dtype)
        return True

    def run(self, t: int, input_buffer: Callable[[Node], Buffer]) -> bool:
        """Run the recorded commands at t (inputs' buffers as they are now); False, with nothing run, where t is
        outside the range or a view or a class's loops do not fit at it."""
        if not self.low <= t <= self.high:
            return False
        if self.loop_limited:
            for launch in self.sized:
                if not within_loop_limit(launch.binding.device, launch.compiled,
                                         tuple(at(line, t) for line in launch.values)):
                    return False
        buffers = list(self.buffers)
        for view in self.views:
            offset, elements = at(view.offset, t), at(view.size, t)
            alignment = view.arena.pool.view_alignment
            if offset < 0 or elements < 0 or offset + elements * view.dtype.itemsize > view.arena.nbytes or (
                    alignment > 0 and offset % alignment):
                return False
            made = ArenaView(view.arena, offset, elements, view.dtype)
            made.event, made.users = view.arena.event, list(view.arena.users)
            buffers[view.slot] = made
        for leaf, slot in self.input_slots:
            buffers[slot] = input_buffer(leaf)
        with SCHEDULER_LOCK:  # (the pools and device queues are shared with other threads)
            wait_all(pending(*self.unfinished))  # (the last run's launches read the sizes rewritten now)
            for table in self.tables:
                table.write(t)
            unfinished = execute(self.program.commands, self.bindings, buffers, bound=self.bound)
            self.unfinished = [buffer.event for buffer in buffers if buffer is not None] if unfinished else []
        return True


def certified_interval(graphs: Sequence[Node], stops: set[Node], current: Callable[[Node], Node], low: int,
                       high: int) -> tuple[int, int] | None:
    """[low, high] narrowed to the t over which the scheduler's passes take the same decisions on each of a
    family's restricted graphs (arguments and shapes affine in t, over the template's nodes; `stops` read as
    `current` values) as at t = 0: placement, graph rewrites and kernelization run on the affine values inside
    affine.tracing(). None where a pass could not run on them or took a decision that holds at t = 0 alone."""
    from ember.scheduler.graph_rewrite import rewrite_graph
    from ember.scheduler.kernelize import kernelize
    from ember.scheduler.placement import place_graph
    from ember.scheduler.schedule import kernel_buffer_limit

    for graph in graphs:
        root = over_values(graph, stops, current)
        with affine.tracing() as interval:
            try:
                nodes = place_graph([root])
                rewritten = rewrite_graph(nodes, [root])
                kernelize(rewritten.roots if rewritten is not None else [root], kernel_buffer_limit)
            except Exception:  # noqa: BLE001 - a pass that cannot run on affine values: no replay at new positions
                return None
        low, high = max(low, interval.low), min(high, interval.high)
        if low >= high:
            return None
    return low, high
