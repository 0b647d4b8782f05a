"""The per-op path: launch plans of cached schedules (scheduler/launch_plan.py), the one-op signature, and the c
pool's small-buffer reuse, each checked against torch or numpy on every device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember as em
from ember.backends import c as c_backend
from ember.backends.registry import REGISTRY
from ember.scheduler import compile_cache, placement, schedule
from ember.scheduler.compile_cache import CompiledKernel
from ember.scheduler.devices import get_device
from ember.scheduler.launch_plan import LaunchPlan
from tests.helpers import assert_close, random_array


def _plan_of(tensor_graph: em.Tensor) -> LaunchPlan | None:
    """The launch plan of the schedule cached for `tensor_graph` (an unrealized tensor), without running it."""
    roots = [tensor_graph.node]
    key = schedule.graph_key(placement.place_graph(roots), roots)
    cached = schedule.SCHEDULES.entries.get(key)
    return None if cached is None else cached.launch_plan


def test_repeated_eager_ops_launch_from_a_plan_and_match_torch(device: str) -> None:
    for step in range(4):
        a_data, b_data = random_array((5, 7), seed=step), random_array((7,), seed=10 + step)
        a, b = em.tensor(a_data, device=device).realize(), em.tensor(b_data, device=device).realize()
        ta, tb = torch.tensor(a_data), torch.tensor(b_data)
        assert_close((a + 1.5).realize(), ta + 1.5)
        assert_close((a * b).realize(), ta * tb)
        assert_close(em.where(a > 0, a, b).realize(), torch.where(ta > 0, ta, tb))
        assert_close(a.sum(1).realize(), ta.sum(1))
        assert_close((a - a).realize(), ta - ta)  # one buffer read twice
    plan = _plan_of(a * b)
    assert plan is not None and plan.runnable and len(plan.bindings) == 1


def test_an_in_place_update_under_a_plan_writes_into_the_parameter(device: str) -> None:
    weight_data = random_array((6, 4), seed=1)
    weight, expected = em.tensor(weight_data, device=device).realize(), torch.tensor(weight_data)
    buffer = weight.node.buffer
    in_place = get_device(device).info.output_may_alias_input  # (WebGPU cannot bind one buffer twice)
    for step in range(4):
        gradient_data = random_array((6, 4), seed=20 + step)
        gradient = em.tensor(gradient_data, device=device).realize()
        weight -= 0.1 * gradient
        weight.realize()
        expected -= 0.1 * torch.tensor(gradient_data)
        assert (weight.node.buffer is buffer) == in_place  # written in place, also when launched from the plan
        assert_close(weight, expected)


def test_a_plan_launches_the_program_that_replaced_its_own(device: str) -> None:
    """A quick build swapped for its optimized one (CompileCache.replace) is launched from then on."""
    data = random_array((3, 9), seed=3)
    x = em.tensor(data, device=device).realize()
    for _ in range(3):
        assert_close((x * 3.25).realize(), torch.tensor(data) * 3.25)
    plan = _plan_of(x * 3.25)
    assert plan is not None and plan.runnable
    binding = plan.bindings[0]
    kernel = schedule.SCHEDULES.schedule([(x * 3.25).node])[0].steps[0].kernel
    device_name, old = binding.device.name, binding.compiled
    launched = []

    class CountingProgram:
        def __call__(self, *args, **kwargs):
            launched.append(1)
            return old.program(*args, **kwargs)

        def bind(self, *args, **kwargs):
            return old.program.bind(*args, **kwargs)

    compile_cache.COMPILED.replace((device_name, kernel), old, CompiledKernel(old.ir, CountingProgram()))
    try:
        for _ in range(2):
            assert_close((x * 3.25).realize(), torch.tensor(data) * 3.25)
        assert len(launched) == 2
    finally:
        compile_cache.COMPILED.entries.pop((device_name, kernel), None)


def test_a_plan_follows_a_device_replaced_in_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    data = random_array((8,), seed=4)
    x = em.tensor(data, device="c").realize()
    for _ in range(3):
        assert_close((x + 7).realize(), torch.tensor(data) + 7)
    fresh = c_backend.probe()
    monkeypatch.setitem(REGISTRY.devices, "c", fresh)
    y = em.tensor(data, device="c").realize()
    result = (y + 7).realize()
    assert result.node.buffer.device is fresh[0]
    assert_close(result, torch.tensor(data) + 7)


def test_copies_between_devices_run_from_a_plan() -> None:
    devices = [name for name in ("c", "opencl", "wgpu") if _available(name)]
    if len(devices) < 2:
        pytest.skip("needs two backends")
    source, target = devices[0], devices[1]
    for step in range(3):
        data = random_array((4, 5), seed=30 + step)
        x = em.tensor(data, device=source).realize()
        moved = (x.to(target) * 2).realize()
        assert moved.device.startswith(target)
        assert_close(moved, torch.tensor(data) * 2)


def _available(backend: str) -> bool:
    try:
        REGISTRY.probe(backend)
    except Exception:  # noqa: BLE001 - any reason a backend is missing here
        return False
    return True


def test_the_one_op_placement_lists_the_walks_order() -> None:
    x_data, y_data = random_array((3, 4)), random_array((3, 4), seed=1)
    x, y = em.tensor(x_data, device="c").realize(), em.tensor(y_data, device="c").realize()
    mask = (x > y).realize()
    tx, ty = torch.tensor(x_data), torch.tensor(y_data)
    cases = [(x + 1, tx + 1), (x * y, tx * ty), (x + x, tx + tx), (em.where(mask, x, y), torch.where(tx > ty, tx, ty)),
             (em.where(mask, x, x), tx), (x.sum(1, keepdim=True), tx.sum(1, keepdim=True)),
             (x.permute(1, 0), tx.permute(1, 0)), (x.cast(em.int32), tx.to(torch.int32)), (x - 0.0, tx - 0.0),
             ((x + 1).exp(), (tx + 1).exp())]  # the last two ops deep: the walk
    for graph, expected in cases:
        roots = [graph.node]
        listed = placement.place_graph(roots)  # the one-op path where the graph is one op on leaves
        walked = placement._placing_walk(roots)
        assert [id(node) for node in listed] == [id(node) for node in walked], graph.node
        assert schedule.graph_key(listed, roots) == schedule.graph_key(walked, roots)
        assert listed[-1] is graph.node and len(listed) == len({id(node) for node in listed})
        assert_close(graph.realize(), expected)


def test_constants_of_equal_value_but_other_bits_do_not_share_a_schedule() -> None:
    data = np.array([-0.0, 0.0, 1.5, -2.0], dtype=np.float32)
    x = em.tensor(data, device="c").realize()
    for constant in (0.0, -0.0, 0.0, -0.0):
        np.testing.assert_array_equal(np.signbit((x + constant).numpy()), np.signbit(data + np.float32(constant)))
    entries = len(schedule.SCHEDULES.entries)
    for _ in range(3):  # NaN is keyed by its bits: the same schedule each time
        np.testing.assert_array_equal(np.isnan((x * float("nan")).numpy()), [True] * 4)
    assert len(schedule.SCHEDULES.entries) <= entries + 1


def test_the_c_pool_hands_a_released_small_buffer_to_the_next_of_its_size() -> None:
    pool = c_backend.HostMemoryPool("c:test")
    first = pool.allocate(64)
    pool.release(first, 64)
    assert pool.allocate(64) is first
    assert pool.allocate(64) is not first  # handed out once
    other = pool.allocate(48)
    assert other is not first
    handles = [pool.allocate(256) for _ in range(c_backend.SMALL_BUFFERS_KEPT + 4)]
    for handle in handles:
        pool.release(handle, 256)
    again = [pool.allocate(256) for _ in range(c_backend.SMALL_BUFFERS_KEPT + 4)]
    assert sum(any(handle is kept for kept in handles) for handle in again) == c_backend.SMALL_BUFFERS_KEPT
    # a larger buffer is kept by the reuse policy every pool has (base.MemoryPool), from just past the small ones on
    large = pool.allocate(c_backend.MAX_SMALL_BUFFER_BYTES + 1)
    pool.release(large, c_backend.MAX_SMALL_BUFFER_BYTES + 1)
    assert pool.kept_bytes == c_backend.MAX_SMALL_BUFFER_BYTES + 1
    assert pool.allocate(c_backend.MAX_SMALL_BUFFER_BYTES + 1) is large and pool.kept_bytes == 0
    base = pool.allocate(128)
    view = pool.view(base, 64, 64)
    pool.destroy_buffer(view)  # a view is never kept (its memory belongs to its base)
    assert pool.create_buffer(64) is not view


def test_plans_let_go_of_their_programs_once_the_compile_cache_evicts(monkeypatch: pytest.MonkeyPatch) -> None:
    data = random_array((2, 11), seed=5)  # a shape of its own: these kernels are new to the session's caches
    x = em.tensor(data, device="c").realize()
    # a program used before the others, the least recently used one when the compile cache evicts (run alone, the
    # cache would otherwise evict x * 1.75's, which then compiles again at every realize and keeps no plan)
    assert_close((x + 0.375).realize(), torch.tensor(data) + 0.375)
    for _ in range(2):
        assert_close((x * 1.75).realize(), torch.tensor(data) * 1.75)
    assert_close((x * 1.75).realize(), torch.tensor(data) * 1.75)
    plan = _plan_of(x * 1.75)
    assert plan is not None and plan.runnable
    monkeypatch.setattr(compile_cache.COMPILED, "limit", len(compile_cache.COMPILED))
    for _ in range(2):  # a new program, which evicts one; the next realize finds the compile cache changed
        assert_close((x - 0.625).realize(), torch.tensor(data) - 0.625)
    assert _plan_of(x * 1.75) is None  # every plan was dropped, with the programs it held
    for _ in range(2):
        assert_close((x * 1.75).realize(), torch.tensor(data) * 1.75)
    assert _plan_of(x * 1.75) is not None
