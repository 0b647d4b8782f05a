"""Graph-parallel execution (EMBER_PARALLEL_KERNELS: scheduler/parallel.py, backends/launch_group.py): independent
kernels that each occupy at most half of the cores run at the same time on c (their profile intervals overlap),
and every value stays what torch computes: eager realizes, gradients, ember.jit replays, in-place updates; a group
never holds two launches sharing memory where one writes."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.backends import launch_group
from ember.backends.launch_group import LaunchGroup, gathering
from ember.scheduler import compile_cache
from ember.scheduler.devices import get_device
from ember.scheduler.schedule import SCHEDULES
from ember.settings import CONFIG

ROWS, WIDTH = 2, 256  # a small batch: every matmul of a tower runs on one thread (and reads 256 KiB of weights)
LENGTH = 1 << 14  # a branch's reduction: one work item (one thread) for a few hundred microseconds


@pytest.fixture
def parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Graph-parallel execution on for one test."""
    monkeypatch.setattr(CONFIG, "parallel_kernels", True)


@pytest.fixture
def every_launch_held(parallel: None, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Graph-parallel execution on, with every one-thread launch held however short (so small graphs exercise the
    groups); the sizes of the groups that ran."""
    monkeypatch.setattr(launch_group, "MIN_GROUPED_SECONDS", 0.0)
    sizes: list[int] = []
    run = LaunchGroup.run

    def counted(group: LaunchGroup) -> None:
        if group.held:
            sizes.append(len(group.held))
        run(group)

    monkeypatch.setattr(LaunchGroup, "run", counted)
    return sizes


def _weights(seed: int) -> list[np.ndarray]:
    generator = np.random.default_rng(seed)
    return [generator.standard_normal((WIDTH, WIDTH)).astype(np.float32) / 16 for _ in range(3)]


def _tower(x: em.Tensor, weights: list[em.Tensor]) -> em.Tensor:
    for weight in weights[:-1]:
        x = (x @ weight).relu()
    return x @ weights[-1]


def _torch_tower(x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    for weight in weights[:-1]:
        x = (x @ weight).relu()
    return x @ weights[-1]


def _overlapping(record: em.Profile) -> bool:
    """Whether two kernels of a profile ran at the same time (their [start, end) intervals overlap)."""
    kernels = sorted(record.kernels, key=lambda kernel: kernel.start)
    return any(later.start < earlier.end for earlier, later in zip(kernels, kernels[1:]))


def _branch(x: em.Tensor | torch.Tensor) -> em.Tensor | torch.Tensor:
    """A reduction of transcendental functions: one kernel of one work item, long enough to be held (its lanes
    vectorized, as a scalar reduce's are: 30 functions an element keep it a few hundred microseconds)."""
    for _ in range(15):
        x = x.sin().exp()
    return x.sum()


def _inputs() -> list[np.ndarray]:
    generator = np.random.default_rng(0)
    return [generator.standard_normal(LENGTH).astype(np.float32) for _ in range(2)]


def test_two_independent_kernels_run_at_the_same_time_and_match_torch(parallel: None) -> None:
    inputs = _inputs()
    tensors = [em.tensor(data, device="c").realize() for data in inputs]
    overlapped = False
    for _ in range(8):  # (the first run times the kernels; an OpenMP thread woken late may start its kernel after
        with em.profile() as record:  # the other ended: tried again)
            outputs = [_branch(tensor) for tensor in tensors]
            em.realize(*outputs)
        assert len(record.kernels) == 2 and all(kernel.end >= kernel.start > 0 for kernel in record.kernels)
        overlapped = _overlapping(record)
        if overlapped:
            break
    assert overlapped, str(record)
    for output, data in zip(outputs, inputs):
        np.testing.assert_allclose(output.item(), _branch(torch.from_numpy(data)).item(), rtol=1e-4)


def test_without_the_setting_nothing_overlaps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CONFIG, "parallel_kernels", False)
    tensors = [em.tensor(data, device="c").realize() for data in _inputs()]
    for _ in range(2):
        with em.profile() as record:
            em.realize(*[_branch(tensor) for tensor in tensors])
        assert len(record.kernels) == 2 and not _overlapping(record)


def test_two_towers_match_torch(every_launch_held: list[int]) -> None:
    data = np.random.default_rng(0).standard_normal((ROWS, WIDTH)).astype(np.float32)
    first, second = _weights(1), _weights(2)
    x = em.tensor(data, device="c")
    tower_weights = [[em.tensor(weight, device="c") for weight in weights] for weights in (first, second)]
    outputs = [_tower(x, weights) for weights in tower_weights]
    em.realize(*outputs)
    assert max(every_launch_held) == 2  # (pairs of the towers' matmuls ran together)
    for output, weights in zip(outputs, (first, second)):
        expected = _torch_tower(torch.from_numpy(data), [torch.from_numpy(weight) for weight in weights])
        np.testing.assert_allclose(output.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


def test_gradients_of_two_towers_match_torch(every_launch_held: list[int]) -> None:
    data = np.random.default_rng(3).standard_normal((ROWS, WIDTH)).astype(np.float32)
    first, second = _weights(4), _weights(5)
    x = em.tensor(data, device="c", requires_grad=True)
    weights = [[em.tensor(weight, device="c", requires_grad=True) for weight in group] for group in (first, second)]
    loss = (_tower(x, weights[0]) * _tower(x, weights[1])).sum()
    loss.backward()
    assert max(every_launch_held) >= 2  # (the two towers' launches at least; more where the machine has the cores)
    torch_x = torch.from_numpy(data).requires_grad_()
    torch_weights = [[torch.from_numpy(weight).requires_grad_() for weight in group] for group in (first, second)]
    torch_loss = (_torch_tower(torch_x, torch_weights[0]) * _torch_tower(torch_x, torch_weights[1])).sum()
    torch_loss.backward()
    np.testing.assert_allclose(loss.item(), torch_loss.item(), rtol=1e-4)
    np.testing.assert_allclose(x.grad.numpy(), torch_x.grad.numpy(), rtol=1e-4, atol=1e-4)
    for group, torch_group in zip(weights, torch_weights):
        for weight, torch_weight in zip(group, torch_group):
            np.testing.assert_allclose(weight.grad.numpy(), torch_weight.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_jit_replays_with_gathering_match_torch(every_launch_held: list[int]) -> None:
    first, second = _weights(6), _weights(7)
    tower_weights = [[em.tensor(weight, device="c") for weight in group] for group in (first, second)]

    @em.jit
    def towers(x: em.Tensor) -> tuple[em.Tensor, em.Tensor]:
        return _tower(x, tower_weights[0]), _tower(x, tower_weights[1])

    for seed in range(4):
        data = np.random.default_rng(seed).standard_normal((ROWS, WIDTH)).astype(np.float32)
        results = towers(em.tensor(data, device="c"))
        for result, weights in zip(results, (first, second)):
            expected = _torch_tower(torch.from_numpy(data), [torch.from_numpy(weight) for weight in weights])
            np.testing.assert_allclose(result.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)
    assert towers.replays >= 2 and max(every_launch_held) == 2


def test_an_in_place_update_beside_independent_readers_matches_numpy(every_launch_held: list[int]) -> None:
    generator = np.random.default_rng(8)
    state_data = generator.standard_normal((ROWS, WIDTH)).astype(np.float32)
    weight_data = generator.standard_normal((WIDTH, WIDTH)).astype(np.float32)
    state, weight = em.tensor(state_data, device="c").realize(), em.tensor(weight_data, device="c").realize()
    before = state @ weight  # reads the old value, independent of the update below
    other = (state * 2) @ weight
    state += 1  # written in place once its readers have run
    em.realize(before, other, state)
    np.testing.assert_allclose(before.numpy(), state_data @ weight_data, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(other.numpy(), (state_data * 2) @ weight_data, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(state.numpy(), state_data + 1)



class _Order:
    """Python functions standing for kernels: each call appends its name (what ran, in which order)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def kernel(self, name: str) -> object:
        return lambda *arguments: self.calls.append(name)


def _hold(group: LaunchGroup, function: object, write: tuple[int, int], reads: list[tuple[int, int]]) -> object:
    arguments = (ctypes.c_void_p * 1)(0)
    kernel = SimpleNamespace(threads=1, seconds=1.0)  # a kernel held in groups (one thread, long enough)
    return group.hold(kernel, function, 0, arguments, 1, [write, *reads], (), None)


def test_a_group_never_holds_launches_sharing_written_memory() -> None:
    order = _Order()
    group = LaunchGroup(cores=8, load_runner=lambda: pytest.fail("no two launches may run together here"))
    with gathering():
        first = _hold(group, order.kernel("first"), (0, 100), [(200, 300)])
        assert order.calls == [] and not first.done  # type: ignore[attr-defined]
        # writes memory the first one reads (an arena slot reused once its last reader was launched): it waits
        second = _hold(group, order.kernel("second"), (250, 260), [])
        assert order.calls == ["first"] and first.done  # type: ignore[attr-defined]
        # reads what the second one writes
        _hold(group, order.kernel("third"), (400, 500), [(255, 256)])
        assert order.calls == ["first", "second"] and second.done  # type: ignore[attr-defined]
    assert order.calls == ["first", "second", "third"]
    assert not launch_group.GATHERING.active and not launch_group.GATHERING.holding


def test_a_launch_filling_the_machine_runs_what_is_held_first() -> None:
    order = _Order()
    group = LaunchGroup(cores=2, load_runner=lambda: pytest.fail("nothing runs together here"))
    with gathering():
        _hold(group, order.kernel("narrow"), (0, 100), [])
        wide = group.hold(SimpleNamespace(threads=2, seconds=1.0), order.kernel("wide"), 0, (ctypes.c_void_p * 1)(0), 1,
                          [(1000, 1100)], (), None)
        assert wide is None and order.calls == ["narrow"]  # the caller runs the wide one itself, alone


def _compiled(graph: em.Tensor) -> Any:
    """The compiled program of the one kernel the scheduler makes for `graph` (an op on a realized tensor)."""
    program, _ = SCHEDULES.schedule([graph.node])
    (step,) = program.steps
    return compile_cache.compile_kernel(get_device("c:0"), step.kernel)


def test_a_c_launch_that_is_not_held_runs_after_what_is_held(every_launch_held: list[int]) -> None:
    small = em.tensor(np.ones((5, 7), np.float32), device="c").realize()
    large = em.tensor(np.ones((512, 512), np.float32), device="c").realize()
    narrow, wide = _compiled(small + 1), _compiled(large + 1)
    # (by global size and the device's cores: every_launch_held's machine has two at least)
    assert narrow.program.threads == 1 and wide.program.threads >= 2
    device = get_device("c:0")
    small_bytes, large_bytes = small.node.buffer.nbytes, large.node.buffer.nbytes
    small_output, large_output = device.pool.allocate(small_bytes), device.pool.allocate(large_bytes)
    try:
        with gathering():
            held = narrow.program([small_output, small.node.buffer.handle], narrow.ir.global_size)
            assert not held.done
            wide.program([large_output, large.node.buffer.handle], wide.ir.global_size)
            assert held.done  # (it ran first)
        np.testing.assert_array_equal(np.frombuffer(small_output, np.float32, 35), 2.0)
        np.testing.assert_array_equal(np.frombuffer(large_output, np.float32, 512 * 512), 2.0)
    finally:
        device.pool.release(small_output, small_bytes)
        device.pool.release(large_output, large_bytes)
