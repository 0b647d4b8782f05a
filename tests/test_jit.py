"""ember.jit against torch: replays of an MLP forward and of full training steps (forward, backward, optimizer step,
zero_grad) with SGD, Adam, AdamW and RMSprop match torch and the un-jitted run, also when an lr scheduler changes
the learning rate between replays; replays build no graph, schedule, compile or allocate nothing;
inputs of another signature capture again or raise; what a capture fixes (Python values) is as documented."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.scheduler import buffers, compile_cache, schedule
from ember.scheduler.buffers import buffer_of
from ember.scheduler.devices import get_device
from ember.backends.c import JoinedCLaunches
from ember.capture.jit import JitError
from ember.scheduler.executor import JoinedLaunches
from tests.helpers import assert_close, unbound_launches

SIZES = [(6, 16), (16, 16), (16, 3)]


def _weights(seed: int = 0) -> list[np.ndarray]:
    generator = np.random.default_rng(seed)
    arrays = []
    for inputs, outputs in SIZES:
        arrays += [generator.normal(size=(outputs, inputs)).astype(np.float32) * 0.4,
                   generator.normal(size=(outputs,)).astype(np.float32) * 0.1]
    return arrays


def _ember_model(device: str) -> em.nn.Sequential:
    model = em.nn.Sequential(em.nn.Linear(6, 16), em.nn.Tanh(), em.nn.Linear(16, 16), em.nn.ReLU(),
                             em.nn.Linear(16, 3)).to(device)
    with em.no_grad():
        for parameter, array in zip(model.parameters(), _weights()):
            parameter.assign(em.tensor(array, device=device)).realize()
    return model


def _torch_model() -> torch.nn.Sequential:
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 3))
    with torch.no_grad():
        for parameter, array in zip(model.parameters(), _weights()):
            parameter.copy_(torch.tensor(array))
    return model


def _batch(step: int, rows: int = 8) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(1000 + step)
    return (generator.normal(size=(rows, 6)).astype(np.float32), generator.normal(size=(rows, 3)).astype(np.float32))


def test_mlp_inference_replays_match_torch(device: str) -> None:
    model, reference = _ember_model(device), _torch_model()

    @em.jit
    def predict(inputs: em.Tensor) -> em.Tensor:
        with em.no_grad():
            return model(inputs).softmax(-1)

    for step in range(5):
        inputs, _ = _batch(step)
        result = predict(em.tensor(inputs, device=device))
        assert_close(result, reference(torch.tensor(inputs)).softmax(-1).detach())
    assert predict.captures == 1 and predict.replays == 3
    plan = predict.memory_plan[device]
    assert plan.intermediates >= 1 and plan.planned_bytes <= plan.unplanned_bytes


def test_a_replays_runs_of_launches_are_joined_where_the_device_can(device: str) -> None:
    """Device.join_launches: the c backend runs a replay's run of bound launches in one call of its C runner (cuda
    captures a CUDA graph: tests/test_ptx.py); the values are torch's either way."""
    model, reference = _ember_model(device), _torch_model()

    @em.jit
    def predict(inputs: em.Tensor) -> em.Tensor:
        with em.no_grad():
            return (model(inputs).softmax(-1) * 2).relu().log1p()

    for step in range(5):
        inputs, _ = _batch(step)
        result = predict(em.tensor(inputs, device=device))
        assert_close(result, (reference(torch.tensor(inputs)).softmax(-1) * 2).relu().log1p().detach())
    assert predict.capture is not None and predict.capture.bound is not None
    joined = [entry for entry in predict.capture.bound if isinstance(entry, JoinedLaunches)]
    if device.startswith("c:"):
        assert joined and all(entry.end - predict.capture.bound.index(entry) >= 2 for entry in joined)
        assert all(isinstance(entry.launch, JoinedCLaunches) for entry in joined)


def test_inputs_passed_again_bind_every_launch_and_new_inputs_are_read_by_the_replay(device: str) -> None:
    """A replay whose input buffers are the last replay's (state passed in again, an input overwritten in place:
    a decode step's cache and staged token) runs every launch bound, those reading the inputs too; a new input
    tensor, and then the first one again, are read by the replay: the values are torch's at every call."""
    model, reference = _ember_model(device), _torch_model()

    @em.jit
    def predict(inputs: em.Tensor, scale: em.Tensor) -> em.Tensor:
        with em.no_grad():
            return (model(inputs) * scale).softmax(-1)

    def expected(inputs: np.ndarray, scale: float) -> torch.Tensor:
        return (reference(torch.tensor(inputs)) * scale).softmax(-1).detach()

    for step in range(4):  # a new input at each call (the last one freed: its id and memory may be the next one's)
        inputs = _batch(step)[0]
        assert_close(predict(em.tensor(inputs, device=device), em.tensor([1.5], device=device)), expected(inputs, 1.5))
    capture = predict.capture
    assert capture is not None and capture.bound_with_inputs is None
    input_slot = capture.input_slots[0][1]
    # where launches are pointed at each replay's inputs in place (c), every launch is bound, and a new input is
    # not held after its replay
    rebinding = capture.rebinding is not None
    assert rebinding == device.startswith("c:")
    if rebinding:
        assert capture.pointed[input_slot] is None
    staged = em.tensor(_batch(0)[0], device=device).realize()
    scale = em.tensor([1.5], device=device).realize()
    for step in range(6):
        inputs = _batch(step)[0]
        buffers.write_node(staged.node, inputs)
        assert_close(predict(staged, scale), expected(inputs, 1.5))
    assert capture.bound is not None
    if rebinding:
        assert capture.rebinding is not None and not unbound_launches(capture, capture.rebinding[0])
        pointed_at = capture.pointed[input_slot]  # (passed again: stays bound, by a weak reference)
        assert pointed_at is not None and pointed_at() is buffer_of(staged.node)
    else:  # (the launches over fixed slots alone leave those reading an input unbound; with the inputs, none is)
        assert capture.bound_with_inputs is not None
        assert unbound_launches(capture, capture.bound) and not unbound_launches(capture, capture.bound_with_inputs)
    other = em.tensor(_batch(7)[0], device=device).realize()  # another input: read, not the bound one
    assert_close(predict(other, scale), expected(_batch(7)[0], 1.5))
    if rebinding:  # (neither the staged input nor the new one is held)
        assert capture.pointed[input_slot] is None
    else:
        assert capture.bound_with_inputs is None and not capture.bound_inputs  # (the staged input is not held)
    held = weakref.ref(buffer_of(other.node))
    assert_close(predict(other, em.tensor([0.5], device=device)), expected(_batch(7)[0], 0.5))
    del other
    buffers.write_node(staged.node, _batch(8)[0])
    for _ in range(3):  # the first input again: bound again, its new values read
        assert_close(predict(staged, scale), expected(_batch(8)[0], 1.5))
    gc.collect()
    assert held() is None  # (an input passed again is held only until a replay gets another)


def _train_step(model: Any, optimizer: Any, inputs: Any, targets: Any) -> Any:
    loss = (model(inputs) - targets).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


@pytest.mark.parametrize("options", [{"lr": 0.05}, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}],
                         ids=["sgd", "momentum"])
def test_training_step_replays_match_eager_and_torch(options: dict[str, Any], device: str) -> None:
    eager_model, jit_model, reference = _ember_model(device), _ember_model(device), _torch_model()
    eager_optimizer = em.optim.SGD(eager_model.parameters(), **options)
    jit_optimizer = em.optim.SGD(jit_model.parameters(), **options)
    torch_optimizer = torch.optim.SGD(reference.parameters(), **options)
    step = em.jit(_train_step)
    for index in range(7):  # eager, capture, then 5 replays
        inputs, targets = _batch(index)
        eager_loss = _train_step(eager_model, eager_optimizer, em.tensor(inputs, device=device),
                                 em.tensor(targets, device=device))
        jit_loss = step(jit_model, jit_optimizer, em.tensor(inputs, device=device), em.tensor(targets, device=device))
        torch_loss = _train_step(reference, torch_optimizer, torch.tensor(inputs), torch.tensor(targets))
        assert jit_loss.item() == eager_loss.item()
        assert_close(jit_loss, torch_loss.detach())
        for jit_parameter, eager_parameter, torch_parameter in zip(jit_model.parameters(), eager_model.parameters(),
                                                                   reference.parameters()):
            np.testing.assert_array_equal(jit_parameter.numpy(), eager_parameter.numpy())
            assert_close(jit_parameter, torch_parameter.detach(), atol=1e-5, rtol=1e-4)
    assert step.captures == 1 and step.replays == 5


def test_replay_builds_no_graph_schedule_compile_or_allocation(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _ember_model(device)
    optimizer = em.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = em.jit(_train_step)
    batches = [[em.tensor(array, device=device).realize() for array in _batch(index)] for index in range(4)]
    for inputs, targets in batches[:2]:
        step(model, optimizer, inputs, targets)
    calls: list[str] = []

    def forbidden(name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            raise AssertionError(f"a replay called {name}")
        return record

    monkeypatch.setattr(schedule.SCHEDULES, "schedule", forbidden("schedule"))
    monkeypatch.setattr(schedule, "kernelize", forbidden("kernelize"))
    monkeypatch.setattr(compile_cache, "compile_kernel", forbidden("compile_kernel"))
    monkeypatch.setattr(compile_cache, "lower_for", forbidden("lower_for"))
    monkeypatch.setattr(buffers, "allocate", forbidden("allocate"))
    pool = get_device(device).pool
    used = pool.used_bytes
    for inputs, targets in batches[2:]:
        loss = step(model, optimizer, inputs, targets)
    assert calls == [] and step.replays == 2
    assert pool.used_bytes == used
    monkeypatch.undo()
    assert np.isfinite(loss.item())


def test_new_shapes_capture_again_or_raise(device: str) -> None:
    model, reference = _ember_model(device), _torch_model()

    def predict(inputs: em.Tensor) -> em.Tensor:
        with em.no_grad():
            return model(inputs)

    jitted, strict = em.jit(predict), em.jit(predict, recapture=False)
    for rows in (8, 8, 8, 5, 5, 5, 8):
        inputs, _ = _batch(rows, rows)
        assert_close(jitted(em.tensor(inputs, device=device)), reference(torch.tensor(inputs)).detach())
    assert jitted.captures == 2 and jitted.replays == 2  # the last call runs eagerly: the first of a new signature
    for _ in range(3):
        strict(em.tensor(_batch(0)[0], device=device))
    with pytest.raises(JitError, match=r"captured for \(\(8, 6\) float32"):
        strict(em.tensor(_batch(0, 5)[0], device=device))


SCALE = 2.0


def test_python_values_are_captured_and_replay_outputs_are_overwritten(device: str) -> None:
    @em.jit
    def scaled(inputs: em.Tensor) -> em.Tensor:
        return inputs * SCALE + 1

    global SCALE
    values = [np.arange(4, dtype=np.float32) + index for index in range(4)]
    results = [scaled(em.tensor(value, device=device)) for value in values[:3]]
    SCALE = 5.0  # read by Python at capture time: replays keep 2.0, as documented
    try:
        kept = results[2].clone().realize()
        latest = scaled(em.tensor(values[3], device=device))
        np.testing.assert_array_equal(latest.numpy(), values[3] * 2 + 1)
        np.testing.assert_array_equal(results[2].numpy(), values[3] * 2 + 1)  # the same buffer, overwritten
        np.testing.assert_array_equal(kept.numpy(), values[2] * 2 + 1)
    finally:
        SCALE = 2.0


def test_changing_python_values_in_tensors_raise(device: str) -> None:
    calls = [0]

    @em.jit
    def add_call_count(inputs: em.Tensor) -> em.Tensor:
        calls[0] += 1  # a Python count made into a tensor: a replay would reuse the captured value
        return inputs + em.tensor(np.float32(calls[0]), device=device)

    inputs = em.tensor(np.arange(3, dtype=np.float32), device=device)
    add_call_count(inputs)
    with pytest.raises(JitError, match="differ between its first two calls"):
        add_call_count(inputs)


@pytest.mark.parametrize("options", [{"name": "Adam", "lr": 0.01},
                                     {"name": "Adam", "lr": 0.01, "amsgrad": True, "weight_decay": 0.01},
                                     {"name": "AdamW", "lr": 0.01, "betas": (0.8, 0.99)},
                                     {"name": "RMSprop", "lr": 0.01, "momentum": 0.5, "centered": True}],
                         ids=["adam", "adam-amsgrad", "adamw", "rmsprop"])
def test_adam_training_step_replays_match_eager_and_torch(options: dict[str, Any], device: str) -> None:
    options = dict(options)
    name = options.pop("name")
    eager_model, jit_model, reference = _ember_model(device), _ember_model(device), _torch_model()
    eager_optimizer = getattr(em.optim, name)(eager_model.parameters(), **options)
    jit_optimizer = getattr(em.optim, name)(jit_model.parameters(), **options)
    torch_optimizer = getattr(torch.optim, name)(reference.parameters(), **options)
    step = em.jit(_train_step)
    exact = device.startswith("c:")  # the same kernels, compiled once: bit for bit; other devices may reorder
    for index in range(7):  # eager, capture, then 5 replays: the bias corrections change every step
        inputs, targets = _batch(index)
        eager_loss = _train_step(eager_model, eager_optimizer, em.tensor(inputs, device=device),
                                 em.tensor(targets, device=device))
        jit_loss = step(jit_model, jit_optimizer, em.tensor(inputs, device=device), em.tensor(targets, device=device))
        torch_loss = _train_step(reference, torch_optimizer, torch.tensor(inputs), torch.tensor(targets))
        assert_close(jit_loss, eager_loss, atol=0 if exact else 1e-6, rtol=0 if exact else 1e-6)
        assert_close(jit_loss, torch_loss.detach())
        for jit_parameter, eager_parameter, torch_parameter in zip(jit_model.parameters(), eager_model.parameters(),
                                                                   reference.parameters()):
            if exact:
                np.testing.assert_array_equal(jit_parameter.numpy(), eager_parameter.numpy())
            else:
                np.testing.assert_allclose(jit_parameter.numpy(), eager_parameter.numpy(), atol=1e-6, rtol=0)
            assert_close(jit_parameter, torch_parameter.detach(), atol=1e-5, rtol=1e-4)
    assert step.captures == 1 and step.replays == 5
    for jit_state, torch_state in zip(jit_optimizer.state_dict()["state"].values(),
                                      torch_optimizer.state_dict()["state"].values()):
        assert jit_state["step"].item() == torch_state["step"].item() == 7  # the replays counted the steps


def test_lr_scheduler_between_replays_changes_the_update(device: str) -> None:
    jit_model, reference = _ember_model(device), _torch_model()
    jit_optimizer = em.optim.Adam(jit_model.parameters(), lr=0.02)
    torch_optimizer = torch.optim.Adam(reference.parameters(), lr=0.02)
    jit_scheduler = em.optim.lr_scheduler.StepLR(jit_optimizer, step_size=2, gamma=0.1)
    torch_scheduler = torch.optim.lr_scheduler.StepLR(torch_optimizer, step_size=2, gamma=0.1)
    step = em.jit(_train_step)
    for index in range(8):
        inputs, targets = _batch(index)
        before = [parameter.numpy() for parameter in jit_model.parameters()]
        step(jit_model, jit_optimizer, em.tensor(inputs, device=device), em.tensor(targets, device=device))
        _train_step(reference, torch_optimizer, torch.tensor(inputs), torch.tensor(targets))
        for jit_parameter, torch_parameter in zip(jit_model.parameters(), reference.parameters()):
            assert_close(jit_parameter, torch_parameter.detach(), atol=1e-5, rtol=1e-4)
        if index == 6:  # lr 0.02 * 0.1**3: Adam's first steps move each weight by about lr
            change = max(np.abs(parameter.numpy() - old).max() for parameter, old in zip(jit_model.parameters(),
                                                                                           before))
            assert change < 0.02 * 0.1**3 * 3
        jit_scheduler.step()
        torch_scheduler.step()
    assert step.captures == 1 and step.replays == 6
    for group in jit_optimizer.param_groups:  # a learning rate set by hand reaches the replays too
        group["lr"] = 0.0
    frozen = [parameter.numpy() for parameter in jit_model.parameters()]
    step(jit_model, jit_optimizer, *(em.tensor(array, device=device) for array in _batch(9)))
    for parameter, old in zip(jit_model.parameters(), frozen):
        np.testing.assert_array_equal(parameter.numpy(), old)
    assert step.replays == 7


def test_many_captures_warn(device: str) -> None:
    doubled = em.jit(lambda tensor: tensor * 2)
    for rows in (1, 1, 2, 2, 3, 3):
        np.testing.assert_array_equal(doubled(em.ones(rows, device=device)).numpy(), np.full(rows, 2.0))
    assert doubled.captures == 3
    with pytest.warns(UserWarning, match=r"captured again for inputs \(\(4,\) float32"):
        np.testing.assert_array_equal(doubled(em.ones(4, device=device)).numpy(), np.full(4, 2.0))


def test_arguments_changed_in_place(device: str) -> None:
    @em.jit
    def increment(tensor: em.Tensor) -> em.Tensor:
        tensor += 1  # nothing else reads the old value: written in place where the device allows it
        return tensor * 2

    values = [np.arange(3, dtype=np.float32) + index for index in range(4)]
    for index, value in enumerate(values):
        argument = em.tensor(value, device=device).realize()
        if index == 1 and not get_device(device).info.output_may_alias_input:  # the update needs a new buffer
            with pytest.raises(JitError, match="changes an argument in place"):
                increment(argument)
            break
        result = increment(argument)
        np.testing.assert_array_equal(argument.numpy(), value + 1)
        np.testing.assert_array_equal(result.numpy(), (value + 1) * 2)

    @em.jit
    def increment_kept(tensor: em.Tensor) -> em.Tensor:
        kept = tensor * 1  # a lazy graph reading the old value: the update needs a new buffer
        tensor += 1
        return kept + tensor

    increment_kept(em.tensor(values[0], device=device).realize())
    with pytest.raises(JitError, match="changes an argument in place"):
        increment_kept(em.tensor(values[1], device=device).realize())


def test_state_outside_the_arguments_changed_in_place_is_replayed(device: str) -> None:
    """A tensor the function reaches through a closure (not an argument, not returned), changed with add_ or assign:
    the recorded call realizes the change, so replays repeat it (it stayed lazy and replays skipped it before)."""
    total = em.zeros(3, device=device)
    count = em.tensor(np.zeros(1, np.float32), device=device).realize()  # (uploaded before: not by the first call)
    weights = np.arange(9, dtype=np.float32).reshape(3, 3) / 10

    @em.jit
    def step(inputs: em.Tensor) -> em.Tensor:
        result = inputs @ em.tensor(weights, device=device)
        total.add_(result.sum(0))
        count.assign(count + 1)
        return result

    expected = np.zeros(3)
    for index in range(6):
        inputs = np.random.default_rng(index).normal(size=(4, 3)).astype(np.float32)
        result = step(em.tensor(inputs, device=device))
        expected += (inputs.astype(np.float64) @ weights).sum(0)
        if index % 2:  # reading between calls or not: the same values
            np.testing.assert_allclose(total.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.numpy(), inputs @ weights, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(total.numpy(), expected, rtol=1e-5, atol=1e-5)
    assert count.item() == 6 and step.replays == 4


def test_the_leaves_of_arguments_are_flattens_in_its_order() -> None:
    """jit's quick walk of a call's arguments (`_leaves`) finds the leaves `_flatten` does, in its order."""
    from collections import namedtuple

    from ember.capture.jit import _flatten, _leaves

    pair_type = namedtuple("pair_type", "first second")
    tensor = em.zeros(2)
    for value in [((1, [2, {"b": 3, "a": (4, tensor)}]), {}), pair_type([5], {"x": None}), [], (((),),), 7]:
        leaves, _ = _flatten(value)
        assert [id(leaf) for leaf in _leaves(value)] == [id(leaf) for leaf in leaves]


def test_replays_read_a_new_input_in_every_kind_of_launch(device: str) -> None:
    """A new input at each call, read by a packed matmul and, at an offset, by a kernel launched with a view of it
    (input_views.py): each replay reads its own input (on c, every launch stays bound: the launches touching the
    input are pointed at it in place, Program.rebind)."""
    weight = np.random.default_rng(0).standard_normal((512, 384)).astype(np.float32)
    ember_weight = em.tensor(weight, device=device).realize()

    @em.jit
    def function(inputs: em.Tensor) -> em.Tensor:
        return (inputs @ ember_weight).relu().sum(0) + inputs[3, :384]

    for call in range(5):
        inputs = np.random.default_rng(call).standard_normal((256, 512)).astype(np.float32)
        expected = np.maximum(inputs.astype(np.float64) @ weight, 0).sum(0) + inputs[3, :384]
        np.testing.assert_allclose(function(em.tensor(inputs, device=device)).numpy(), expected, rtol=1e-4, atol=1e-2)
    capture = function.capture
    assert capture is not None
    if device.startswith("c:"):
        from ember.backends.c import PackedCProgram
        from ember.scheduler.input_views import ViewedProgram

        assert capture.rebinding is not None and not unbound_launches(capture, capture.rebinding[0])
        kinds = {type(program) for targets in capture.rebinding[1].values() for program, _, _ in targets}
        assert PackedCProgram in kinds and ViewedProgram in kinds
