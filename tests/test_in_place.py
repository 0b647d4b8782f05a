"""In-place updates: an assigned value is computed into the replaced tensor's buffer when nothing else can read
it (optimizer steps allocate nothing); otherwise a new buffer keeps every other holder's values. Against torch."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember import optim
from ember.scheduler.buffers import release_finished
from ember.scheduler.devices import get_device
from tests.helpers import assert_close, compiled_sizes, compiled_sizes_change, isolated_compile_cache

OPTIMIZERS = [
    ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    ("Adam", {"lr": 0.01, "amsgrad": True}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.5}),
]


def _buffers(tensors: list[em.Tensor]) -> list[Any]:
    return [tensor.node.buffer for tensor in tensors]


@pytest.mark.parametrize(("name", "options"), OPTIMIZERS, ids=[name for name, _ in OPTIMIZERS])
def test_optimizer_step_updates_parameters_and_state_in_place(name: str, options: dict[str, Any], device: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    isolated_compile_cache(monkeypatch)  # (the shape-class members it compiles are its own, and kept)
    generator = np.random.default_rng(0)
    arrays = [generator.normal(size=shape).astype(np.float32) for shape in [(5, 3), (3,)]]
    ember_parameters = [em.nn.Parameter(em.tensor(array, device=device).realize()) for array in arrays]
    torch_parameters = [torch.nn.Parameter(torch.tensor(array)) for array in arrays]
    ember_optimizer = getattr(optim, name)(ember_parameters, **options)
    torch_optimizer = getattr(torch.optim, name)(torch_parameters, **options)
    pool = get_device(device).pool
    for step in range(4):
        for ember_parameter, torch_parameter in zip(ember_parameters, torch_parameters):
            gradient = generator.normal(size=tuple(torch_parameter.shape)).astype(np.float32)
            ember_parameter.grad = em.tensor(gradient, device=device).realize()
            torch_parameter.grad = torch.tensor(gradient)
        state = [value for entry in ember_optimizer.state.values() for value in entry.values()
                 if isinstance(value, em.Tensor)]
        gc.collect()  # tensors of earlier tests in reference cycles must not be freed during the step measured
        release_finished(wait=True)  # buffers dropped while kernels still read them are counted until these finish
        parameters_before, state_before, used_before = _buffers(ember_parameters), _buffers(state), pool.used_bytes
        sizes_before = compiled_sizes()
        gc.disable()  # and none during it
        try:
            ember_optimizer.step()
        finally:
            gc.enable()
        release_finished(wait=True)
        torch_optimizer.step()
        for ember_parameter, torch_parameter in zip(ember_parameters, torch_parameters):
            assert_close(ember_parameter, torch_parameter.detach(), atol=1e-5, rtol=1e-4)
        if not get_device(device).info.output_may_alias_input:  # (WebGPU) each update allocates
            continue
        assert all(after is before for after, before in zip(_buffers(ember_parameters), parameters_before))
        if step >= 1:  # the first step creates the state
            assert all(after is before for after, before in zip(_buffers(state), state_before))
            # the step that records the update for replays (optim/step_replay.py) keeps its intermediates (Adam's
            # bias corrections) for the replays, once, and a kernel it compiles as a class member its sizes; no step
            # allocates anything else
            recorded = [buffer.nbytes for jitted in ember_optimizer._replays.recorded.values()
                        if jitted is not None and jitted.capture is not None and jitted.replays == 0
                        for buffer in jitted.capture.buffers if buffer is not None]
            compiled = compiled_sizes_change(sizes_before)
            assert pool.used_bytes == used_before + sum(recorded) + compiled, (
                step, pool.used_bytes, used_before, recorded, compiled)


def test_assign_keeps_values_another_tensor_holds(device: str) -> None:
    values = np.arange(6, dtype=np.float32)
    parameter = em.tensor(values, device=device).realize()
    kept = parameter.clone()  # a lazy copy reading the old value: the update must not overwrite it
    buffer = parameter.node.buffer
    parameter -= 0.5
    np.testing.assert_array_equal(parameter.numpy(), values - 0.5)
    np.testing.assert_array_equal(kept.numpy(), values)
    assert parameter.node.buffer is not buffer
    del kept
    buffer = parameter.node.buffer
    parameter *= 2.0
    np.testing.assert_array_equal(parameter.numpy(), (values - 0.5) * 2)
    assert (parameter.node.buffer is buffer) == get_device(device).info.output_may_alias_input
    buffer = parameter.node.buffer
    parameter.assign(em.ones(6, device=device))  # does not read the old value: in place on every device
    np.testing.assert_array_equal(parameter.numpy(), np.ones(6))
    assert parameter.node.buffer is buffer


def test_assign_reading_other_positions_allocates(device: str) -> None:
    values = np.arange(6, dtype=np.float32)
    tensor = em.tensor(values, device=device).realize()
    buffer = tensor.node.buffer
    tensor.assign(tensor.flip(0) + tensor)  # reads other elements of the buffer it replaces
    np.testing.assert_array_equal(tensor.numpy(), values[::-1] + values)
    assert tensor.node.buffer is not buffer
    lazy = tensor * 3  # a lazy graph still reading the old value
    buffer = tensor.node.buffer
    tensor += 1
    np.testing.assert_array_equal(tensor.numpy(), values[::-1] + values + 1)
    np.testing.assert_array_equal(lazy.numpy(), (values[::-1] + values) * 3)
    assert tensor.node.buffer is not buffer


def test_assign_with_a_later_reader_in_the_same_realize(device: str) -> None:
    values = np.arange(4, dtype=np.float32)
    tensor = em.tensor(values, device=device).realize()
    doubled = tensor * 2
    reversed_sum = tensor.flip(0) + 0  # read by another kernel of the same realize
    tensor += 10
    em.realize(tensor, reversed_sum, doubled)
    np.testing.assert_array_equal(tensor.numpy(), values + 10)
    np.testing.assert_array_equal(reversed_sum.numpy(), values[::-1])
    np.testing.assert_array_equal(doubled.numpy(), values * 2)


def test_assign_keeps_a_fused_intermediate_another_tensor_holds(device: str) -> None:
    # the update's kernel computes `direction` inline; `direction` is also a tensor of its own, realized later: the
    # in-place write must not change what it reads (it was silently computed from the new value)
    values = np.arange(1, 5, dtype=np.float32)
    gradient_values = np.full(4, 2.0, dtype=np.float32)
    parameter = em.tensor(values, device=device).realize()
    gradient = em.tensor(gradient_values, device=device).realize()
    with em.no_grad():
        direction = gradient + 0.1 * parameter
        scaled = direction * 3  # a second node between the update and the old value
        parameter -= 0.05 * scaled
        parameter.realize()
    expected_direction = gradient_values + 0.1 * values
    np.testing.assert_allclose(parameter.numpy(), values - 0.05 * 3 * expected_direction, rtol=1e-6)
    np.testing.assert_allclose(direction.numpy(), expected_direction, rtol=1e-6)
    np.testing.assert_allclose(scaled.numpy(), 3 * expected_direction, rtol=1e-6)
    # with nothing else holding the intermediates, the update is still written in place where the device allows
    buffer = parameter.node.buffer
    with em.no_grad():
        parameter -= 0.05 * (gradient + 0.1 * parameter)
        parameter.realize()
    assert (parameter.node.buffer is buffer) == get_device(device).info.output_may_alias_input


def test_a_small_assign_nothing_else_observes_gets_a_new_buffer_and_a_large_one_is_written_in_place(
        device: str) -> None:
    # a small value whose old buffer only its node holds skips the in-place analysis (in_place.new_buffer_will_do:
    # a batch norm's running statistics); past SMALL_ASSIGN_BYTES the kernel writes into the old buffer. A weak
    # reference watches the old buffer without holding it (a strong one would make the buffer observed)
    from ember.scheduler.in_place import SMALL_ASSIGN_BYTES

    # (a schedule's first run binds its launches as it goes: the rule applies from its second run on, as in a loop)
    for count, small in ((6, True), (SMALL_ASSIGN_BYTES // 4 + 1024, False)):
        values = np.arange(count, dtype=np.float32)
        tensor = em.tensor(values, device=device).realize()
        in_place = get_device(device).info.output_may_alias_input and not small
        for step in range(1, 4):
            old = weakref.ref(tensor.node.buffer)
            tensor += 1
            tensor.realize()
            np.testing.assert_array_equal(tensor.numpy(), values + step)
        assert (tensor.node.buffer is old()) == in_place, (count, small)
        for step in range(1, 4):
            old = weakref.ref(tensor.node.buffer)
            with em.no_grad():
                tensor.mul_(2.0)
            np.testing.assert_array_equal(tensor.numpy(), (values + 3) * 2 ** step)
        assert (tensor.node.buffer is old()) == in_place, (count, small)


def test_a_small_state_tensor_changed_eagerly_between_replays_is_read_by_the_next_replay(device: str) -> None:
    # the capture binds the state's buffer: the eager assign must write into it (a new buffer would leave the
    # replays reading the old value)
    state = em.tensor(np.arange(6, dtype=np.float32), device=device).realize()
    shifted = em.jit(lambda x: x + state)
    x = em.tensor(np.ones(6, dtype=np.float32), device=device)
    for _ in range(3):
        np.testing.assert_array_equal(shifted(x).numpy(), 1 + np.arange(6))
    assert shifted.replays >= 1
    for step in range(1, 4):
        state += 10
        state.realize()
        np.testing.assert_array_equal(shifted(x).numpy(), 1 + np.arange(6) + 10 * step)


def test_batch_norm_running_statistics_small_and_past_the_small_assign_size_against_torch(device: str) -> None:
    # running statistics are assigned every step (new buffers when small, in place when large); torch's values
    from ember.scheduler.in_place import SMALL_ASSIGN_BYTES

    generator = np.random.default_rng(3)
    for channels in (3, SMALL_ASSIGN_BYTES // 4 + 16):
        layer, torch_layer = em.nn.BatchNorm1d(channels).to(device), torch.nn.BatchNorm1d(channels)
        for _ in range(3):
            batch = generator.normal(size=(4, channels)).astype(np.float32)
            layer(em.tensor(batch, device=device))
            torch_layer(torch.tensor(batch))
            em.realize(layer.running_mean, layer.running_var)
        assert_close(layer.running_mean, torch_layer.running_mean, rtol=1e-5, atol=1e-6)
        assert_close(layer.running_var, torch_layer.running_var, rtol=1e-5, atol=1e-6)
        assert int(layer.num_batches_tracked.item()) == 3


def test_the_schedules_hold_on_a_replaced_node_counts_its_slots_until_their_last_use() -> None:
    """schedule_hold: how many slots of the executor's table hold the replaced node (by identity, not by equality)
    when no later command reads it; None where a later one does; 0 where no slot holds it."""
    from ember.core.graph import Node
    from ember.core.ops import Op
    from ember.scheduler.in_place import schedule_hold

    old, other = (Node(Op.BUFFER, (), None, (2,), em.float32, "c:0") for _ in range(2))
    live = [other, old, None, old, other]
    assert schedule_hold(old, live, {0: 9, 1: 3, 3: 4, 4: 9}, 4) == 2
    assert schedule_hold(old, live, {0: 9, 1: 3, 3: 5, 4: 9}, 4) is None  # (slot 3 read by command 5)
    assert schedule_hold(old, [other, None], {0: 9}, 4) == 0
