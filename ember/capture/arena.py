"""The memory plan of an ember.jit capture's intermediates: one arena per device with a view per intermediate (where
the pool makes views), else buffers shared by intermediates of equal size whose lifetimes do not overlap. The memory
itself comes from the capture's JitMemoryPool (shared_arena.py), which other captures share."""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.backends.base import Device
from ember.context import CONTEXT
from ember.core.dtype import DType
from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.shapes import prod
from ember.scheduler.buffers import Buffer
from ember.capture.memory_plan import ArenaPlan, Lifetime, peak_live_bytes, plan_arena


@dataclass
class DevicePlan:
    """The static memory plan of one device's intermediate buffers in a capture."""

    intermediates: int = 0  # intermediate buffers the capture allocated
    unplanned_bytes: int = 0  # their bytes if each had its own buffer (what eager allocation needs)
    peak_bytes: int = 0  # the most of those bytes live at one command: what any plan needs at least
    arena: bool = False  # True: one arena holds them all at offsets; False: the pool makes no views (equal sizes share)
    arena_bytes: int = 0  # the arena's size (0 without one)
    buffers: int = 0  # allocations the replay uses for them (1 with an arena)
    planned_bytes: int = 0  # bytes of those allocations: the replay's memory for intermediates, were it alone
    sizes: list[int] = field(default_factory=list)  # bytes of each allocation
    # the memory the capture's intermediates live in, shared with the other live captures of its JitMemoryPool on
    # this device (capture/shared_arena.py): its bytes (the most any of them needs) and how many captures share it
    shared_bytes: int = 0
    shared_by: int = 0

    def describe(self) -> str:
        """One line for EMBER_DEBUG and for printing `jitted.memory_plan`."""
        kind = f"arena of {self.arena_bytes} bytes" if self.arena else f"{self.buffers} shared buffers, " \
            f"{self.planned_bytes} bytes (the pool makes no views)"
        shared = f"; in the pool's shared memory of {self.shared_bytes} bytes used by {self.shared_by} jitted " \
            "function(s)" if self.shared_by else ""
        return (f"{self.intermediates} intermediates in {kind}; peak live {self.peak_bytes} bytes, eager "
                f"{self.unplanned_bytes} bytes{shared}")

    def __str__(self) -> str:
        return self.describe()


@dataclass
class Placement:
    """Where one device's intermediates of a capture go in its memory pool's shared pieces: per slot the piece, the
    offset in it, the size and dtype; and the bytes the capture needs of each piece (one arena where the pool makes
    views, else one buffer per group of equal-size intermediates, largest first)."""

    device: Device
    needs: list[int]
    slots: list[tuple[int, int, int, int, DType]]  # (slot, piece, offset, size, dtype)


class ArenaView(Buffer):
    """An intermediate's piece of an arena: a Buffer whose handle is the pool's view at an offset of the arena's
    memory (or, at offset 0 of a pool that makes no views, the arena's own handle: a buffer at least as large). It
    allocates nothing and releases nothing; the commands still using it when it goes are handed to the arena, which
    it keeps alive and which frees the memory once they are done."""

    __slots__ = ("arena", "offset")

    def __init__(self, arena: Buffer, offset: int, size: int, dtype: DType) -> None:
        self.arena = arena
        self.offset = offset
        self._describe(arena.device, size, dtype)
        if offset == 0 and self.pool.view_alignment == 0:
            self.handle = arena.handle
        else:
            self.handle = self.pool.view(arena.handle, offset, max(self.nbytes, 1))

    def __del__(self) -> None:
        try:
            for event in (self.event, *self.users):
                self.arena.add_user(event)
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown may have torn things down already
            pass


def view_node(buffer: Buffer, start: int, shape: tuple[int, ...]) -> Node:
    """A realized BUFFER node of `shape` over elements [start, start + its size) of `buffer` (an ArenaView of it,
    waiting for what the buffer waits for): a kernel whose output replaces it writes there (in-place writes of a
    region: incremental/write.py, io/in_place.region_view). The offset must be one the pool views."""
    view = ArenaView(buffer, start * buffer.dtype.itemsize, prod(shape), buffer.dtype)
    view.event, view.users = buffer.event, list(buffer.users)
    node = Node(Op.BUFFER, (), None, tuple(shape), buffer.dtype, buffer.device_name)
    node.buffer = view
    return node


def place_intermediates(buffers: list[Buffer | None], intermediate: list[int], first_use: dict[int, int],
                        last_use: dict[int, int]) -> tuple[dict[str, DevicePlan], dict[str, Placement]]:
    """Plan the capture's intermediate buffers (by slot): per device, the plan's numbers and where each goes in the
    memory a JitMemoryPool gives it (capture/shared_arena.py fills the slots with views of that memory).

    The capture's own buffers are dropped first, so the planned memory replaces theirs instead of adding to it."""
    by_device: dict[str, list[tuple[int, Device, int, DType]]] = {}
    original: Buffer | None = None
    for slot in intermediate:
        original = buffers[slot]
        assert original is not None
        by_device.setdefault(original.device_name, []).append((slot, original.device, original.size, original.dtype))
        buffers[slot] = None
    original = None  # the last one is released here too
    plans: dict[str, DevicePlan] = {}
    placements: dict[str, Placement] = {}
    for device_name, entries in by_device.items():
        lifetimes = [Lifetime(size * dtype.itemsize, first_use[slot], last_use[slot])
                     for slot, _, size, dtype in entries]
        plan = plans[device_name] = DevicePlan(len(entries), sum(lifetime.nbytes for lifetime in lifetimes),
                                               peak_live_bytes(lifetimes))
        device = entries[0][1]
        if device.pool.view_alignment > 0:
            placements[device_name] = _place_in_arena(entries, lifetimes, device, plan)
        else:
            placements[device_name] = _share_by_lifetime(entries, lifetimes, device, plan)
    return plans, placements


def _place_in_arena(entries: list[tuple[int, Device, int, DType]], lifetimes: list[Lifetime], device: Device,
                    plan: DevicePlan) -> Placement:
    layout = _layout(device.name, lifetimes, device.pool.view_alignment)
    plan.arena, plan.arena_bytes = True, layout.arena_bytes
    plan.buffers, plan.planned_bytes, plan.sizes = 1, layout.arena_bytes, [layout.arena_bytes]
    return Placement(device, [layout.arena_bytes], [(slot, 0, offset, size, dtype) for (slot, _, size, dtype), offset
                                                    in zip(entries, layout.offsets)])


def _layout(device_name: str, lifetimes: list[Lifetime], alignment: int) -> ArenaPlan:
    """The arena layout of these lifetimes: a loaded plan's (plan/planner.py), else planned now; a trace being
    recorded keeps it."""
    from ember.plan import planner

    described = [(lifetime.nbytes, lifetime.first, lifetime.last) for lifetime in lifetimes]
    planned = planner.planned_arena(device_name, alignment, described)
    if planned is not None:
        layout = ArenaPlan(planned[0], planned[1], peak_live_bytes(lifetimes), sum(t.nbytes for t in lifetimes))
    else:
        layout = plan_arena(lifetimes, alignment)
    active = CONTEXT.get().trace
    if active is not None:
        active.record_arena(device_name, alignment, described, layout.offsets, layout.arena_bytes, layout.peak_bytes)
    return layout


def _share_by_lifetime(entries: list[tuple[int, Device, int, DType]], lifetimes: list[Lifetime], device: Device,
                       plan: DevicePlan) -> Placement:
    """A greedy interval allocation: a buffer whose last command is done is reused by the next intermediate of the
    same size (never by the command that last reads it). The buffers are numbered largest first (the pieces a
    JitMemoryPool shares by rank)."""
    starting: dict[int, list[int]] = {}
    ending: dict[int, list[int]] = {}
    for position, lifetime in enumerate(lifetimes):
        starting.setdefault(lifetime.first, []).append(position)
        ending.setdefault(lifetime.last, []).append(position)
    free: dict[int, list[int]] = {}
    assigned: dict[int, int] = {}  # position -> buffer number (in order of creation)
    for index in sorted(set(starting) | set(ending)):
        for position in starting.get(index, ()):
            nbytes = lifetimes[position].nbytes
            group = free.setdefault(nbytes, [])
            if group:
                assigned[position] = group.pop()
            else:
                assigned[position] = plan.buffers
                plan.buffers += 1
                plan.planned_bytes += nbytes
                plan.sizes.append(nbytes)
        for position in ending.get(index, ()):
            free.setdefault(lifetimes[position].nbytes, []).append(assigned[position])
    rank = {number: place for place, number in enumerate(sorted(range(plan.buffers),
                                                                key=lambda number: -plan.sizes[number]))}
    plan.sizes.sort(reverse=True)
    return Placement(device, list(plan.sizes), [(slot, rank[assigned[position]], 0, size, dtype)
                                                for position, (slot, _, size, dtype) in enumerate(entries)])
