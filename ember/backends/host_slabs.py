"""Host memory in huge pages: the c pool's buffers past 64 KiB carved from slabs of 2 MiB-aligned memory that the
system is asked to back with transparent huge pages.

Why: a buffer of its own (numpy's, from malloc's heap) sits in 4 KiB pages, and a kernel streaming through memory
that is out of the caches then misses the TLB at every page; in a virtual machine each miss walks two page tables.
An elementwise kernel over 1 MiB tensors, its data out of the caches, took 300-450 us on such buffers against
146-174 us in huge pages (a jit's arena is one large numpy array, which numpy already puts in huge pages), and a
ResNet step's eager kernels 12.7-19 ms against 8.8-9.0 ms.

A slab holds the slots of one size class (sizes a multiple of an eighth of their power of two: at most 12.5% more
than asked); a buffer past 4 MiB has a slab of its own, whose last partial huge page stays in small pages (numpy's
own advice for its large arrays leaves both ends of an unaligned array in small pages). A slot is lent as a ctypes
object exporting its memory (numpy arrays over it, and their views, keep it alive) and comes back to its slab when
that object is collected, so a slot is never lent twice while anything can still read it. A slab whose slots are all
back is unmapped (the pool keeps released buffers for reuse, base.py, so a slab empties only when the pool lets its
buffers go). Where the system has no transparent huge pages the pool takes its buffers from the heap as before
(`SLABS.advise` is False)."""

from __future__ import annotations

import ctypes
import heapq
import mmap
import threading
from pathlib import Path
from typing import Any

HUGE_PAGE_BYTES = 1 << 21
MIN_SLOT_BYTES = (1 << 16) + 1  # smaller buffers come from the heap (the pool keeps them per size: c.py)
MAX_SHARED_SLOT_BYTES = 1 << 22  # larger buffers get a slab of their own (one slot, its size rounded up to a page)
SLOTS_PER_SLAB = 8  # at least, in a shared slab; a shared slab is at least one huge page


def slot_bytes(nbytes: int) -> int:
    """The size class of a buffer of `nbytes`: `nbytes` rounded up to a multiple of an eighth of its power of two
    (past MAX_SHARED_SLOT_BYTES, to a multiple of a page)."""
    if nbytes > MAX_SHARED_SLOT_BYTES:
        return -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    step = 1 << max((nbytes - 1).bit_length() - 4, 6)
    return -(-nbytes // step) * step


def huge_pages_available() -> bool:
    """Whether the system can back memory advised MADV_HUGEPAGE with transparent huge pages."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        setting = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[never]" not in setting


class Slab:
    """One mapping of `count` slots of `size` bytes, the first at a huge page boundary; `free` is a heap of the slots
    not lent (the lowest is lent first: a slab fills from its start, and memory never touched stays unbacked)."""

    __slots__ = ("address", "count", "free", "memory", "size", "start")

    def __init__(self, size: int, advise: bool) -> None:
        length = size if size > MAX_SHARED_SLOT_BYTES else \
            -(-max(size * SLOTS_PER_SLAB, HUGE_PAGE_BYTES) // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
        self.memory = mmap.mmap(-1, length + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        probe = (ctypes.c_char * 1).from_buffer(self.memory)
        mapped = ctypes.addressof(probe)
        del probe  # (an export would keep the mapping from ever closing)
        self.start = -mapped % HUGE_PAGE_BYTES
        self.address = mapped + self.start
        if advise:
            try:
                self.memory.madvise(mmap.MADV_HUGEPAGE, self.start, length)
            except OSError:  # (a system that refuses the advice: plain pages)
                pass
        self.size = size
        self.count = length // size
        self.free = list(range(self.count))  # (a heap already)


class HugePageSlabs:
    """The slabs of every size class, shared by the c pools of a process (thread-safe)."""

    def __init__(self, advise: bool | None = None) -> None:
        self.advise = huge_pages_available() if advise is None else advise
        self._lock = threading.Lock()
        self._slabs: dict[int, list[Slab]] = {}  # per size class, its slabs in the order they were mapped
        self._types: dict[int, Any] = {}  # per size class, its slots' ctypes type
        self.mapped_bytes = 0  # bytes of the slabs mapped now (their memory is backed only where touched)

    def carve(self, nbytes: int) -> tuple[Any, int]:
        """A slot for `nbytes` (MIN_SLOT_BYTES or more): an object exporting its memory (writable, its
        size class's bytes; hold it, or arrays over it, as long as the memory is used) and its address. The
        oldest slab with a free slot lends it, so that newer slabs empty out and go."""
        size = slot_bytes(nbytes)
        with self._lock:
            slabs = self._slabs.setdefault(size, [])
            slab = next((slab for slab in slabs if slab.free), None)
            if slab is None:
                slab = Slab(size, self.advise)
                self.mapped_bytes += len(slab.memory)
                slabs.append(slab)
            slot = heapq.heappop(slab.free)
        owner = self._slot_type(size).from_buffer(slab.memory, slab.start + slot * size)
        owner.slab, owner.slot = slab, slot
        return owner, slab.address + slot * size

    def _slot_type(self, size: int) -> Any:
        """The ctypes type of a size class's slots: an instance exports one slot's memory and gives the slot back
        to its slab when it is collected (after the last array over it)."""
        slot_type = self._types.get(size)  # (the shared classes' types are kept: a few dozen)
        if slot_type is None:
            slabs = self

            def give_back(owner: Any) -> None:
                try:
                    slabs._give_back(owner.slab, owner.slot)
                except Exception:  # noqa: BLE001,S110 - at interpreter shutdown: the process gives the memory back
                    pass

            slot_type = type("SlotMemory", (ctypes.c_char * size,), {"__del__": give_back})
            if size <= MAX_SHARED_SLOT_BYTES:
                self._types[size] = slot_type
        return slot_type

    def _give_back(self, slab: Slab, slot: int) -> None:
        with self._lock:
            heapq.heappush(slab.free, slot)
            if len(slab.free) < slab.count:
                return
            self._slabs[slab.size].remove(slab)  # (unmapped when collected: no slot of it is lent)
            self.mapped_bytes -= len(slab.memory)


SLABS = HugePageSlabs()
