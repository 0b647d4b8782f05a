"""ember.jit's static memory plan on real devices: intermediates live in one arena per device where the pool makes
views (c, opencl), replays through it match torch, an MLP training step replays bit-exact against eager, the
pool's byte count is right (the arena counted once, views never released), the arena's memory outlives commands
still queued on its views, and EMBER_DEBUG=1 shows the plan."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import ember as em
from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable
from ember.scheduler import profile
from ember.capture.arena import ArenaView
from ember.scheduler.buffers import release_finished
from ember.scheduler.devices import get_device
from ember.capture.memory_plan import padded
from tests.helpers import assert_close, compiled_sizes, isolated_compile_cache
from tests.queued_device import QueuedDevice, QueuedPool
from tests.test_jit import _batch, _ember_model, _train_step


def _layers(device: str) -> tuple[list[np.ndarray], list[em.Tensor]]:
    generator = np.random.default_rng(7)
    arrays = [generator.normal(size=shape).astype(np.float32) * 0.3 for shape in ((12, 40), (40, 24), (24, 5))]
    return arrays, [em.tensor(array, device=device) for array in arrays]


def _forward(module: object, inputs: object, weights: list[object]) -> object:
    """Intermediates of several sizes with overlapping lifetimes (a wrong overlap in the arena changes the result)."""
    hidden = (inputs @ weights[0]).tanh()  # type: ignore[operator]
    wide = (hidden @ weights[1]).relu() + hidden.sum(-1, keepdim=True)  # type: ignore[attr-defined]
    scores = (wide @ weights[2]) * wide.mean(-1, keepdim=True)
    return module.softmax(scores, -1) + hidden.square().mean()  # type: ignore[attr-defined]


def test_replays_through_the_arena_match_torch(device: str) -> None:
    arrays, weights = _layers(device)

    @em.jit
    def model(inputs: em.Tensor) -> em.Tensor:
        return _forward(em.Tensor, inputs, weights)  # type: ignore[return-value]

    generator = np.random.default_rng(3)
    for _ in range(6):
        inputs = generator.normal(size=(9, 12)).astype(np.float32)
        result = model(em.tensor(inputs, device=device))
        truth = _forward(torch.Tensor, torch.tensor(inputs), [torch.tensor(array) for array in arrays])
        assert_close(result, truth, atol=1e-5, rtol=1e-4)
    assert model.captures == 1 and model.replays == 4
    plan = model.memory_plan[device]
    pool = get_device(device).pool
    assert plan.intermediates >= 4 and plan.peak_bytes <= plan.unplanned_bytes
    assert model.capture is not None
    views = [buffer for buffer in model.capture.buffers if isinstance(buffer, ArenaView)]
    if pool.view_alignment:  # c and opencl: one arena, every intermediate a view into it
        assert plan.arena and plan.buffers == 1 and len(views) == plan.intermediates
        assert plan.peak_bytes <= plan.arena_bytes <= sum(padded(view.nbytes, pool.view_alignment) for view in views)
        assert plan.arena_bytes < plan.unplanned_bytes  # lifetimes let pieces share memory
        assert len({id(view.arena) for view in views}) == 1 and views[0].arena.nbytes == plan.shared_bytes
        assert plan.shared_bytes >= plan.arena_bytes  # (the memory jitted functions share: the largest arena)
        assert all(view.offset % pool.view_alignment == 0 for view in views)
    else:  # wgpu: equal-size sharing, each intermediate at offset 0 of its group's buffer (the shared pool's piece)
        assert not plan.arena and plan.planned_bytes <= plan.unplanned_bytes and len(views) == plan.intermediates
        assert all(view.offset == 0 and view.handle is view.arena.handle for view in views)
        assert len({id(view.arena) for view in views}) == plan.buffers


@pytest.mark.parametrize("backend", ["c", "opencl"])
def test_the_arena_is_used_where_the_pool_makes_views(backend: str) -> None:
    try:
        device = REGISTRY.probe(backend)[0].name
    except (BackendUnavailable, em.DeviceError):
        pytest.skip(f"{backend} is not available here")
    assert get_device(device).pool.view_alignment > 0
    _, weights = _layers(device)
    model = em.jit(lambda inputs: _forward(em.Tensor, inputs, weights))
    for _ in range(3):
        model(em.ones(9, 12, device=device))
    assert model.memory_plan[device].arena and model.memory_plan[device].buffers == 1


def test_pool_bytes_count_the_arena_once_and_return_to_the_start(device: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    isolated_compile_cache(monkeypatch)  # (the shape-class members it compiles are its own, and kept)
    _, weights = _layers(device)
    inputs = em.ones(9, 12, device=device).realize()
    for weight in weights:
        weight.realize()
    pool = get_device(device).pool
    gc.collect()
    release_finished(wait=True)
    # Every buffer the capture allocates is counted, and released once; buffers of earlier tests that a cache
    # drops meanwhile (an evicted schedule's constants) are not this test's to count.
    live: dict[int, tuple[object, int]] = {}
    released_twice: list[int] = []
    allocate, release = pool.allocate, pool.release

    def counted_allocate(nbytes: int) -> object:
        handle = allocate(nbytes)
        live[id(handle)] = (handle, nbytes)
        return handle

    def counted_release(handle: object, nbytes: int) -> None:
        if id(handle) in live:
            del live[id(handle)]
        elif any(kept is handle for kept, _ in freed):
            released_twice.append(nbytes)
        freed.append((handle, nbytes))
        release(handle, nbytes)

    freed: list[tuple[object, int]] = []
    monkeypatch.setattr(pool, "allocate", counted_allocate)
    monkeypatch.setattr(pool, "release", counted_release)
    model = em.jit(lambda values: _forward(em.Tensor, values, weights))
    for _ in range(3):
        result = model(inputs)
    plan = model.memory_plan[device]
    expected = plan.planned_bytes
    del result
    gc.collect()
    held = sum(nbytes for _, nbytes in live.values())  # the plan's memory and the capture's outputs and constants
    assert held >= expected
    del model
    gc.collect()
    release_finished(wait=True)
    kept = compiled_sizes()  # (a kernel compiled as a shape class's member keeps its sizes with its code)
    assert {key: value for key, value in live.items() if key not in kept} == {}  # nothing leaked
    assert released_twice == []  # nothing (a view) released twice


def test_mlp_training_step_replays_bit_exact_with_the_arena() -> None:
    device = "c:0"
    eager_model, jit_model = _ember_model(device), _ember_model(device)
    eager_optimizer = em.optim.Adam(eager_model.parameters(), lr=0.01)
    jit_optimizer = em.optim.Adam(jit_model.parameters(), lr=0.01)
    step = em.jit(_train_step)
    for index in range(6):
        inputs, targets = _batch(index)
        eager_loss = _train_step(eager_model, eager_optimizer, em.tensor(inputs, device=device),
                                 em.tensor(targets, device=device))
        jit_loss = step(jit_model, jit_optimizer, em.tensor(inputs, device=device), em.tensor(targets, device=device))
        assert jit_loss.item() == eager_loss.item()
    for jit_parameter, eager_parameter in zip(jit_model.parameters(), eager_model.parameters()):
        np.testing.assert_array_equal(jit_parameter.numpy(), eager_parameter.numpy())
    plan = step.memory_plan[device]
    assert step.replays == 4 and plan.arena and plan.peak_bytes <= plan.arena_bytes


def test_debug_output_shows_the_plan_at_capture(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, weights = _layers(device)
    model = em.jit(lambda inputs: _forward(em.Tensor, inputs, weights))
    model(em.ones(9, 12, device=device))
    old = profile.debug_level()
    profile.set_debug_level(1)
    try:
        capsys.readouterr()
        model(em.ones(9, 12, device=device))
    finally:
        profile.set_debug_level(old)
    plan = model.memory_plan[device]
    line = [text for text in capsys.readouterr().err.splitlines() if "memory plan" in text]
    assert len(line) == 1 and f"on {device}" in line[0] and f"eager {plan.unplanned_bytes} bytes" in line[0]
    assert f"peak live {plan.peak_bytes} bytes" in line[0]
    if plan.arena:
        assert f"arena of {plan.arena_bytes} bytes" in line[0]


class ViewingQueuedPool(QueuedPool):
    """The queued test device's pool with views (numpy slices); a buffer destroyed while a pending command uses any
    of its memory (through a view too) is an unsafe free."""

    view_alignment = 16

    def view(self, handle: np.ndarray, offset: int, nbytes: int) -> np.ndarray:
        return handle[offset:offset + nbytes]

    def destroy_buffer(self, handle: np.ndarray) -> None:
        for event in self.log.pending:
            if any(np.shares_memory(used, handle) for used in event.handles):
                self.log.unsafe_frees.append(event.label)
        self.log.freed.append(id(handle))


@pytest.fixture
def queued() -> Iterator[QueuedDevice]:
    """The deferred-command device of tests/queued_device.py (commands run only when waited for), with views."""
    REGISTRY.modules["queued"] = "tests.queued_device"
    device = REGISTRY.probe("queued")[0]
    device.pool = ViewingQueuedPool(device.name, device.log)
    yield device
    device.synchronize()
    release_finished(wait=True)
    REGISTRY.modules.pop("queued", None)
    REGISTRY.devices.pop("queued", None)


def test_the_arena_outlives_the_pending_commands_of_its_views(queued: QueuedDevice) -> None:
    device = queued.name
    arrays, weights = _layers(device)
    model = em.jit(lambda inputs: _forward(em.Tensor, inputs, weights))
    inputs = np.random.default_rng(5).normal(size=(9, 12)).astype(np.float32)
    for _ in range(3):
        result = model(em.tensor(inputs, device=device))
    assert model.memory_plan[device].arena and model.replays == 1
    assert any(not label.startswith("copy") for label in (event.label for event in queued.log.pending))
    del model  # the capture, its views and its arena go while the replay's kernels wait to run
    gc.collect()
    release_finished()
    assert queued.log.unsafe_frees == []
    truth = _forward(torch.Tensor, torch.tensor(inputs), [torch.tensor(array) for array in arrays])
    assert_close(result, truth, atol=1e-5, rtol=1e-4)  # reading runs the replay's kernels, in the arena's memory
    release_finished(wait=True)
    assert queued.log.unsafe_frees == []
