"""A recorded backward pass bound to buffers: its launches bound once (as ember.jit binds a replay's), so that a replay
runs them with no executor work per launch.

A backward replay (backward_replay.py) runs its command program over nodes: every launch allocates its output, looks
its inputs' buffers up and launches through the per-op path's code, ~5 us of Python a launch (char_lstm's 538
launches: ~2.3 ms a step, next to ~17 ms of kernels). Bound, a program's slots are buffers:
- the forward graph's leaves (parameters, the batch, existing gradients: realized before the run) are the buffers
  they hold at each run, the launches reading them pointed anew where a leaf holds another buffer than at the last
  run (launch_plan.bind_rebindable, Program.rebind);
- what a run leaves for its caller (the forward nodes the program computes, which become buffers as in the eager
  pass, and the leaves' new gradients) is written into the buffer the last run left there where nothing else holds
  that buffer any more (its tensor is gone: a gradient set to None by zero_grad, a loss dropped; told by its
  reference count, as in_place.py tells an assign's), else into a new buffer, the launches pointed at it the same
  way: a tensor the caller kept keeps its values;
- the gradients' graph's own intermediates, which nothing outside the run can reach, live in one arena at offsets
  whose lifetimes do not overlap (capture/memory_plan.plan_arena), allocated once and kept with the recording.
The launches then run as the executor runs a jit replay's: runs of them joined into one call (c's runner), events
tracked only where a device leaves a command unfinished. Bound, a char_lstm step's backward took ~0.3 ms of Python
instead of ~2.3 (its runs: ~150 us to fill the table and point the few launches whose buffers changed).

An in-place assign among the program's outputs (BatchNorm's running statistics) is one of what a run leaves: its new
value goes to a buffer of its own, as the eager pass's does where the old value is still held (the old value is a
leaf of the run: the buffer it holds is never free), and the tensor it updates holds that buffer afterwards.

A program is bound only where that is the same computation: launches and frees only (no copy between devices), one
device whose pool makes views, and every launch's program rebinds its buffers; and only where the memory a binding keeps between steps (the arena and
the kept buffers; the eager pass frees them) is at most an eighth of a limited pool and, with every other binding's,
at most MAX_BOUND_BYTES (the bindings of the least recently replayed programs are let go first: they bind again at
their next replay). Else its replays stay unbound. `REPLAYS.clear()` (backward_replay.py) lets every recording and
binding go. `BIND_REPLAYS = False` turns binding off (tests compare both paths)."""

from __future__ import annotations

import math
from collections.abc import Callable
from sys import getrefcount
from typing import TYPE_CHECKING, Any, cast

from ember.capture.arena import ArenaView
from ember.capture.memory_plan import Lifetime, plan_arena
from ember.core import dtype as dtypes
from ember.core.graph import Node
from ember.core.ops import Op
from ember.scheduler.buffers import Buffer, buffer_of
from ember.scheduler.executor import execute
from ember.scheduler.launch_plan import bind_rebindable
from ember.scheduler.program import Free, Launch, LaunchBinding

if TYPE_CHECKING:
    from ember.autograd.backward_replay import Recorded

BIND_REPLAYS = True  # bind recorded backward passes to buffers (False: every replay runs over nodes)
# the memory all bindings together keep between steps (their arenas and the buffers kept for what their runs leave;
# the eager pass frees it), at most: the least recently replayed bindings are let go first
MAX_BOUND_BYTES = 1 << 29
POOL_SHARE = 8  # a binding keeps at most 1/POOL_SHARE of a pool with a limit
FREE_REFERENCES = 3  # sys.getrefcount of a kept buffer nothing else holds: the list, the name, the call's argument
ARENA_ALIGNMENT = 64  # bytes: an intermediate's offset in the arena (a cache line, AVX-512's vector), at least


class BoundBackward:
    """A recorded backward program bound to buffers: `template` (the table of slots, the arena's views in place),
    `leaves` (slot, position in the forward graph) of the forward leaves, `made` (slot, position in the forward graph
    or -1 for a leaf's gradient, its device, size and dtype) of the slots whose values a run leaves to its caller,
    `kept` (the buffers the last run left in them), `launches` (per command, its bound launch or the joined run it
    starts), `targets` (per rebound slot, the launches to point anew), `handles` (per rebound slot, the handle its
    launches point to now), `gradient_nodes` (per gradient slot, its node's shape, dtype and device) and the arena
    that keeps the intermediates' memory."""

    __slots__ = ("arena", "gradient_nodes", "handles", "held_bytes", "kept", "launches", "leaves", "made", "targets",
                 "template")

    def __init__(self, template: list[Buffer | None], leaves: list[tuple[int, int]],
                 made: list[tuple[int, int, Any, int, Any]], arena: Buffer | None, held_bytes: int) -> None:
        self.template = template
        self.leaves = leaves
        self.made = made
        self.arena = arena
        self.held_bytes = held_bytes  # the arena's bytes and those of the buffers kept for `made`
        self.kept: list[Buffer | None] = [None] * len(made)  # the buffers of the last run's `made`
        self.launches: list[Any] = []
        self.targets: dict[int, list[tuple[Any, Any, int]]] = {}
        self.handles: dict[int, Any] = {}
        self.gradient_nodes: dict[int, tuple[Any, ...]] = {}  # per gradient slot, its node's shape, dtype and device

    def run(self, recorded: Recorded, nodes: list[Node]) -> list[Buffer]:
        """Run the program on the forward graph's `nodes` (by position); the buffers made for `made`, in its order
        (the caller turns them into the forward nodes and the gradients)."""
        table, made = self.table(nodes, point=True)
        execute(recorded.program.commands, recorded.plan.bindings, table, bound=self.launches)
        return made  # (the program's frees emptied the table as it ran)

    def table(self, nodes: list[Node], point: bool) -> tuple[list[Any], list[Buffer]]:
        """The table of one run (the arena's views, the leaves' buffers, and for what the run leaves the last run's
        buffers where nothing else holds them, else new ones) and those buffers of `made`; with `point`, each launch
        pointed at them where its slot holds another handle than at the last run."""
        table = list(self.template)
        handles, targets = self.handles, self.targets
        for slot, position in self.leaves:
            node = nodes[position]
            buffer = node.buffer or buffer_of(node)  # (host data is uploaded at its first use)
            table[slot] = buffer
            handle = buffer.handle
            if point and handles[slot] is not handle:
                _point(targets[slot], handle)
                handles[slot] = handle
        kept = self.kept
        for index, (slot, _, device, size, dtype) in enumerate(self.made):
            buffer = kept[index]
            # (the buffer of the last run is free when nothing but this table of them holds it: its node is gone,
            # a gradient set to None, a loss dropped; a buffer still held keeps its values, and a new one is made)
            if buffer is None or getrefcount(buffer) > FREE_REFERENCES:
                buffer = kept[index] = Buffer(device, size, dtype)
                if point:
                    _point(targets[slot], buffer.handle)
                    handles[slot] = buffer.handle
            table[slot] = buffer
        return table, cast(list[Buffer], list(kept))


def _point(targets: list[tuple[Any, Any, int]], handle: Any) -> None:
    for program, launch, index in targets:
        program.rebind(launch, index, handle)


def bind(recorded: Recorded, nodes: list[Node], make_room: Callable[[int], None]) -> BoundBackward | None:
    """`recorded`'s program bound for the forward graph `nodes` (the replay's), or None where binding could change
    what the program computes, the device cannot rebind a launch or the binding's memory is past the limits (see
    the module's docstring); `make_room(nbytes)` lets other bindings go until this one's memory fits."""
    program, plan = recorded.program, recorded.plan
    writers: dict[int, tuple[int, LaunchBinding]] = {}
    devices = set()
    for position, (command, binding) in enumerate(zip(program.commands, plan.bindings)):
        kind = command.__class__
        if kind is Free:
            continue
        if kind is not Launch or binding is None or binding.compiled is None:
            return None
        writers[command.output] = (position, binding)  # type: ignore[union-attr]
        devices.add(binding.device)
    if len(devices) != 1:
        return None
    device = devices.pop()
    alignment = device.pool.view_alignment
    if alignment <= 0:
        return None
    gradient_slots = {slot for _, slot in recorded.gradients}
    template: list[Buffer | None] = [None] * recorded.table_size
    leaves: list[tuple[int, int]] = []
    made: list[tuple[int, int, Any, int, Any]] = []
    for slot, at in recorded.forward_slots:
        node = nodes[at]
        if node.op is Op.BUFFER:
            leaves.append((slot, at))
        else:
            writer = writers.get(slot)
            if writer is None:
                return None
            made.append((slot, at, device, writer[1].size, writer[1].dtype))
    intermediates: list[tuple[int, int, Any]] = []  # (slot, size, dtype) of the arena's
    for slot, shape, dtype, _ in recorded.fresh_slots:
        writer = writers.get(slot)
        if writer is None or writer[1].size != math.prod(shape):
            return None
        if slot in gradient_slots:
            made.append((slot, -1, device, writer[1].size, dtype))
        else:
            intermediates.append((slot, writer[1].size, dtype))
    lifetimes = [Lifetime(size * dtype.itemsize, writers[slot][0], program.last_use[slot])
                 for slot, size, dtype in intermediates]
    layout = plan_arena(lifetimes, max(alignment, ARENA_ALIGNMENT))
    held = layout.arena_bytes + sum(size * dtype.itemsize for *_, size, dtype in made)
    limit = device.pool.limit_bytes
    if held > MAX_BOUND_BYTES or (limit is not None and held > limit // POOL_SHARE):
        return None
    make_room(held)
    arena = None
    if intermediates:
        arena = Buffer(device, max(1, layout.arena_bytes), dtypes.uint8)
        for (slot, size, dtype), offset in zip(intermediates, layout.offsets):
            template[slot] = ArenaView(arena, offset, size, dtype)
    bound = BoundBackward(template, leaves, made, arena, held)
    table, _ = bound.table(nodes, point=False)
    rebound = [slot for slot, _ in leaves] + [slot for slot, *_ in made]
    rebinding = bind_rebindable(program, plan.bindings, table, rebound)
    if rebinding is None:
        return None
    bound.launches, bound.targets = rebinding
    bound.handles = {slot: table[slot].handle for slot in rebound}
    bound.gradient_nodes = {slot: (shape, dtype, device_name) for slot, shape, dtype, device_name
                            in recorded.fresh_slots if slot in gradient_slots}
    return bound
