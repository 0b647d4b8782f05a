"""The arena planner of ember.jit against a brute-force check on random lifetimes: no two buffers live at one
command overlap in memory, offsets are aligned, and the arena lies between the peak live bytes and the sum."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.capture.memory_plan import Lifetime, padded, peak_live_bytes, plan_arena


@st.composite
def lifetimes(draw: st.DrawFn) -> list[Lifetime]:
    count = draw(st.integers(0, 40))
    result = []
    for _ in range(count):
        first = draw(st.integers(0, 30))
        result.append(Lifetime(draw(st.integers(0, 5000)), first, first + draw(st.integers(0, 12))))
    return result


def _brute_force_peak(buffers: list[Lifetime]) -> int:
    commands = range(max((buffer.last for buffer in buffers), default=-1) + 1)
    return max((sum(buffer.nbytes for buffer in buffers if buffer.first <= command <= buffer.last)
                for command in commands), default=0)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(lifetimes(), st.sampled_from([1, 4, 64, 128]))
def test_plan_never_overlaps_live_buffers(buffers: list[Lifetime], alignment: int) -> None:
    plan = plan_arena(buffers, alignment)
    assert len(plan.offsets) == len(buffers)
    for index, one in enumerate(buffers):
        start = plan.offsets[index]
        assert start % alignment == 0 and start + padded(one.nbytes, alignment) <= plan.arena_bytes
        for other_index in range(index + 1, len(buffers)):
            other = buffers[other_index]
            if one.first <= other.last and other.first <= one.last:  # alive at one command at least
                other_start = plan.offsets[other_index]
                assert (start + padded(one.nbytes, alignment) <= other_start
                        or other_start + padded(other.nbytes, alignment) <= start), (one, other, plan)
    peak = _brute_force_peak(buffers)
    assert plan.peak_bytes == peak_live_bytes(buffers) == peak
    assert plan.total_bytes == sum(buffer.nbytes for buffer in buffers)
    assert peak <= plan.arena_bytes <= sum(padded(buffer.nbytes, alignment) for buffer in buffers)
    if alignment == 1 and all(buffer.nbytes for buffer in buffers):
        assert plan.arena_bytes <= plan.total_bytes


def test_disjoint_lifetimes_share_and_overlapping_ones_stack() -> None:
    chain = [Lifetime(1000, index, index + 1) for index in range(10)]  # each live with its neighbours only
    plan = plan_arena(chain, 64)
    assert plan.peak_bytes == 2000 and plan.arena_bytes == 2 * padded(1000, 64)
    assert plan_arena([Lifetime(100, 0, 5), Lifetime(300, 2, 3)]).arena_bytes == 400


def test_bad_arguments_raise_naming_them() -> None:
    with pytest.raises(ValueError, match="power of two, got 3"):
        plan_arena([], 3)
    with pytest.raises(ValueError, match="is not a lifetime"):
        plan_arena([Lifetime(8, 4, 2)])
