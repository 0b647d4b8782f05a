"""The static memory plan of ember.jit: offsets in one arena for buffers with known lifetimes (a pure function)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lifetime:
    """A buffer of `nbytes` used by the commands `first` through `last` (inclusive) of a recorded launch order."""

    nbytes: int
    first: int
    last: int


@dataclass
class ArenaPlan:
    """Where each buffer lives in the arena, the arena's size, and what the lifetimes force at least (peak)."""

    offsets: list[int]  # per buffer, in the order given; multiples of the alignment
    arena_bytes: int  # the size of the arena (a multiple of the alignment)
    peak_bytes: int  # the most bytes live at one command: no arena can be smaller
    total_bytes: int  # the sum of the sizes: what one allocation per buffer would need


def padded(nbytes: int, alignment: int) -> int:
    """`nbytes` rounded up to a whole number of `alignment` (at least one: every buffer has an address of its own)."""
    return max(1, -(-nbytes // alignment)) * alignment


def peak_live_bytes(lifetimes: list[Lifetime]) -> int:
    """The most bytes of buffers whose lifetimes contain one command."""
    changes: dict[int, int] = {}
    for lifetime in lifetimes:
        changes[lifetime.first] = changes.get(lifetime.first, 0) + lifetime.nbytes
        changes[lifetime.last + 1] = changes.get(lifetime.last + 1, 0) - lifetime.nbytes
    live = peak = 0
    for index in sorted(changes):
        live += changes[index]
        peak = max(peak, live)
    return peak


def plan_arena(lifetimes: list[Lifetime], alignment: int = 1) -> ArenaPlan:
    """Offsets in one arena such that two buffers whose lifetimes overlap never overlap in memory.

    Greedy by size: the largest buffer is placed first; each next one goes into the smallest gap between the placed
    buffers it overlaps in time that holds it (best fit), or above the highest of them. Sizes are padded to the
    alignment, so every offset is a multiple of it."""
    if alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"plan_arena: alignment must be a power of two, got {alignment}")
    for lifetime in lifetimes:
        if lifetime.nbytes < 0 or lifetime.first > lifetime.last:
            raise ValueError(f"plan_arena: {lifetime} is not a lifetime (nbytes >= 0 and first <= last)")
    sizes = [padded(lifetime.nbytes, alignment) for lifetime in lifetimes]
    order = sorted(range(len(lifetimes)), key=lambda index: (-sizes[index], lifetimes[index].first, index))
    offsets = [0] * len(lifetimes)
    placed: list[int] = []
    arena = 0
    for index in order:
        lifetime, size = lifetimes[index], sizes[index]
        neighbours = sorted((offsets[other], offsets[other] + sizes[other]) for other in placed
                            if lifetimes[other].first <= lifetime.last and lifetime.first <= lifetimes[other].last)
        best_offset, best_gap = None, None
        top = 0
        for start, end in neighbours:
            gap = start - top
            if gap >= size and (best_gap is None or gap < best_gap):
                best_offset, best_gap = top, gap
            top = max(top, end)
        offsets[index] = top if best_offset is None else best_offset
        arena = max(arena, offsets[index] + size)
        placed.append(index)
    return ArenaPlan(offsets, arena, peak_live_bytes(lifetimes), sum(lifetime.nbytes for lifetime in lifetimes))
