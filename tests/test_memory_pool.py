"""MemoryPool's two levels (allocate/release over a backend's create_buffer/destroy_buffer) and its one reuse policy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ember.backends.base import MAX_REUSABLE_BYTES, MIN_REUSABLE_BYTES, Event, MemoryPool
from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable, OutOfMemoryError


class Pending(Event):
    def __init__(self) -> None:
        self.finished = False

    @property
    def done(self) -> bool:
        return self.finished


class CountingPool(MemoryPool):
    """Buffers are numbers; records what the base class asks of the backend."""

    def __init__(self, budget: int = 0, limit_bytes: int | None = None) -> None:
        super().__init__("counting:0", limit_bytes)
        self.reuse_budget_bytes = budget
        self.created: list[int] = []
        self.destroyed: list[int] = []
        self.pending: list[Pending] = []

    def create_buffer(self, nbytes: int) -> Any:
        self.created.append(nbytes)
        return len(self.created)

    def destroy_buffer(self, handle: Any) -> None:
        self.destroyed.append(handle)

    def pending_work(self) -> tuple[Event, ...]:
        event = Pending()
        self.pending.append(event)
        return (event,)

    def copy_in(self, handle: Any, source: memoryview) -> None:
        raise AssertionError("not used")

    def copy_out(self, destination: memoryview, handle: Any) -> None:
        raise AssertionError("not used")


def test_without_a_budget_every_release_destroys() -> None:
    pool = CountingPool()
    first = pool.allocate(MIN_REUSABLE_BYTES)
    pool.release(first, MIN_REUSABLE_BYTES)
    assert pool.destroyed == [first] and pool.pending == []
    second = pool.allocate(0)  # at least one byte is asked of the backend
    assert pool.created == [MIN_REUSABLE_BYTES, 1] and second != first
    assert (pool.used_bytes, pool.live_buffers, pool.peak_bytes) == (0, 1, MIN_REUSABLE_BYTES)


def test_a_released_large_buffer_is_reused_after_its_pending_work() -> None:
    pool = CountingPool(budget=4 * MIN_REUSABLE_BYTES)
    size = 2 * MIN_REUSABLE_BYTES
    first = pool.allocate(size)
    pool.release(first, size)
    assert pool.destroyed == [] and len(pool.pending) == 1  # kept, behind the work enqueued so far
    second = pool.allocate(size)
    assert second != first  # that work is not done yet: a new buffer
    pool.pending[0].finished = True
    assert pool.allocate(size - 1) not in (first, second)  # only the exact size is reused
    assert pool.allocate(size) == first and pool.used_bytes == 3 * size - 1
    small = pool.allocate(MIN_REUSABLE_BYTES - 1)
    pool.release(small, MIN_REUSABLE_BYTES - 1)
    assert pool.destroyed == [small]  # small buffers are never kept


def test_the_budget_bounds_the_kept_bytes() -> None:
    pool = CountingPool(budget=3 * MIN_REUSABLE_BYTES)
    handles = [pool.allocate(2 * MIN_REUSABLE_BYTES) for _ in range(2)]
    for handle in handles:
        pool.release(handle, 2 * MIN_REUSABLE_BYTES)
    assert pool.destroyed == [handles[1]]  # the second would pass the budget
    assert MAX_REUSABLE_BYTES <= 1 << 30  # and no pool keeps more than this, whatever its budget


def test_the_limit_is_checked_before_any_buffer_is_made() -> None:
    pool = CountingPool(limit_bytes=100)
    with pytest.raises(OutOfMemoryError, match="cannot allocate 101 bytes, 100 of 100 bytes are free"):
        pool.allocate(101)
    assert pool.created == []


def test_opencl_reuses_a_released_buffer_once_its_commands_are_done(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        device = REGISTRY.probe("opencl")[0]
    except BackendUnavailable as error:
        pytest.skip(f"no OpenCL device here: {error}")
    pool = device.pool
    assert pool.reuse_budget_bytes > 0
    # none kept by earlier tests (their bytes may fill the budget, or one of this size be handed out first)
    monkeypatch.setattr(pool, "_kept", {})
    monkeypatch.setattr(pool, "_kept_bytes", 0)
    size = 3 * MIN_REUSABLE_BYTES + 4
    first = pool.allocate(size)
    data = np.arange(size // 4, dtype=np.int32)
    pool.copy_in(first, memoryview(data).cast("B"))
    pool.release(first, size)
    device.synchronize()
    second = pool.allocate(size)
    assert second is first
    result = np.zeros_like(data)
    pool.copy_out(memoryview(result).cast("B"), second)
    np.testing.assert_array_equal(result, data)  # the same memory: a reused buffer holds stale bytes
    pool.release(second, size)
