"""JitMemoryPool: the memory of jitted functions' intermediates, shared per device by every capture in the pool (by
default every jitted function of the process): functions that never run at the same time need the memory of the
largest, not the sum.

A capture's intermediates are scratch: written and read within one replay (its outputs, its state, the buffers of
value checks and random keys have buffers of their own and are never placed here), so another capture may use the
same memory between two of its replays. Per device the pool holds pieces: one arena where the device's pool makes
views (each capture's own layout at its own offsets, arena.py), else one buffer per rank of the captures' equal-size
groups, largest first (a capture's k-th largest group uses the k-th piece; a piece is as large as the largest group
of that rank among the captures). A piece grows, and every capture on it gets new views, when a capture needing more
joins; the pieces go when the last capture using them does (a capture is gone with its jitted function, or when
its function captures again for new shapes).

A replay first waits for the commands of the previous replay on these pieces when that was another capture's (none
are pending on backends that run commands in order and synchronously; the wait keeps devices with several queues
correct)."""

from __future__ import annotations

import weakref
from typing import Any

from ember.backends.base import wait_all
from ember.capture.arena import ArenaView, DevicePlan, Placement
from ember.core.dtype import uint8
from ember.scheduler.buffers import Buffer, pending


class _DeviceMemory:
    """One device's pieces and the captures placed on them."""

    def __init__(self) -> None:
        self.pieces: list[Buffer] = []
        # by id of the capture: a weak reference (its callback detaches the capture), its placement and its plan
        self.users: dict[int, tuple[weakref.ref[Any], Placement, DevicePlan]] = {}
        self.last_user: int | None = None
        self.last_unfinished = False  # whether the last user's last replay left commands unfinished

    def needs(self) -> list[int]:
        """Per piece, the most bytes any capture placed here needs of it."""
        needed: list[int] = []
        for _, placement, _ in self.users.values():
            for index, nbytes in enumerate(placement.needs):
                if index == len(needed):
                    needed.append(nbytes)
                else:
                    needed[index] = max(needed[index], nbytes)
        return needed

    def events_of(self, key: int) -> list[Any]:
        """The commands of a capture on the pieces: their writers and readers (the executor puts a replay's writers
        on the piece and its readers on the view that was read)."""
        events = [event for piece in self.pieces for event in (piece.event, *piece.users)]
        entry = self.users.get(key)
        capture = None if entry is None else entry[0]()
        if capture is not None:
            for slot, *_ in entry[1].slots:  # type: ignore[index]
                buffer = capture.buffers[slot]
                if buffer is not None:
                    events.extend((buffer.event, *buffer.users))
        return events

    def publish(self) -> None:
        """The shared numbers in every user's DevicePlan."""
        total = sum(piece.nbytes for piece in self.pieces)
        for _, _, plan in self.users.values():
            plan.shared_bytes, plan.shared_by = total, len(self.users)


class JitMemoryPool:
    """Memory for the intermediates of jitted functions, shared on each device by every capture in the pool.

    `ember.jit` uses one pool for every jitted function unless given another: `ember.jit(f, memory_pool=pool)`
    with `pool = ember.JitMemoryPool()` groups functions apart (each group needs the memory of its largest capture;
    functions replayed alternately on a device with several queues then never wait for each other's commands).
    `bytes_on(device)` is what the pool holds on a device."""

    def __init__(self) -> None:
        self.devices: dict[str, _DeviceMemory] = {}

    def bytes_on(self, device: str) -> int:
        """The bytes of the pool's memory on `device` (0 where none of its captures has intermediates)."""
        memory = self.devices.get(device)
        return 0 if memory is None else sum(piece.nbytes for piece in memory.pieces)

    def attach(self, capture: Any, placements: dict[str, Placement], plans: dict[str, DevicePlan]) -> None:
        """Give a new capture's intermediate slots (capture.buffers) views of the pool's memory, growing it where the
        capture needs more (other captures then get views of the grown memory). The caller holds the scheduler's
        lock."""
        key = id(capture)
        for device_name, placement in placements.items():
            memory = self.devices.setdefault(device_name, _DeviceMemory())
            capture.shared_memories.append(memory)
            reference = weakref.ref(capture, self._detacher(device_name, key))
            memory.users[key] = (reference, placement, plans[device_name])
            needed = memory.needs()
            grown = False
            for index, nbytes in enumerate(needed):
                if index == len(memory.pieces):
                    memory.pieces.append(Buffer(placement.device, nbytes, uint8))
                    grown = True
                elif memory.pieces[index].nbytes < nbytes:
                    # (the old piece is freed once the views of it below are gone and its commands are done)
                    memory.pieces[index] = Buffer(placement.device, nbytes, uint8)
                    grown = True
            for user_key, (user, user_placement, _) in memory.users.items():
                if user_key == key or grown:
                    user_capture = user()
                    if user_capture is not None:
                        _bind(user_capture, user_placement, memory.pieces)
            memory.publish()

    def enter(self, capture: Any) -> None:
        """Before a replay of `capture` (under the scheduler's lock): wait for the pending commands on the pieces
        when the last replay on them was another capture's."""
        key = id(capture)
        for memory in capture.shared_memories:
            if memory.last_user != key:
                if memory.last_user is not None and memory.last_unfinished:
                    wait_all(pending(*memory.events_of(memory.last_user)))
                memory.last_user = key
                memory.last_unfinished = False

    def leave(self, capture: Any, unfinished: bool) -> None:
        """After a replay of `capture`: whether it left commands unfinished (then the next replay of another capture
        on the same memory waits for them)."""
        for memory in capture.shared_memories:
            memory.last_unfinished = unfinished

    def _detacher(self, device_name: str, key: int) -> Any:
        """The callback of a capture's weak reference: detach it when it goes."""
        return lambda _: self._detach(device_name, key)

    def _detach(self, device_name: str, key: int) -> None:
        """A capture is gone: forget it; the pieces go with the last one (they do not shrink while others live)."""
        memory = self.devices.get(device_name)
        if memory is None or memory.users.pop(key, None) is None:
            return
        if memory.last_user == key:
            memory.last_user = None
        if not memory.users:
            memory.pieces = []
        memory.publish()


def _bind(capture: Any, placement: Placement, pieces: list[Buffer]) -> None:
    """Fill the capture's intermediate slots with views of the pieces; its launches are bound anew at its next
    replay."""
    for slot, piece, offset, size, dtype in placement.slots:
        capture.buffers[slot] = ArenaView(pieces[piece], offset, size, dtype)
    capture.bound = None


DEFAULT_POOL = JitMemoryPool()  # every jitted function's, unless ember.jit is given another
