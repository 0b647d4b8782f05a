"""Optimizer steps done by replay (ember/optim/step_replay.py) match torch's steps, and keep torch's semantics for
the values other tensors hold: a lazy forward result read after the step, a view of a parameter, a loaded state."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember import optim
from tests.helpers import assert_close

OPTIMIZERS = [
    ("SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.3}),
    ("Adam", {"lr": 0.01}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}),
    ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.5}),
]


def _models(device: str) -> tuple[Any, Any]:
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model = em.nn.Sequential(em.nn.Linear(6, 8), em.nn.Tanh(), em.nn.Linear(8, 3)).to(device)
    model.load_state_dict({name: value.detach().numpy() for name, value in reference.state_dict().items()})
    return model, reference


def _batch(step: int, device: str) -> tuple[Any, Any]:
    values = np.random.default_rng(step).normal(size=(5, 6)).astype(np.float32)
    return em.tensor(values, device=device), torch.tensor(values)


def _train_step(models: tuple[Any, Any], optimizers: tuple[Any, Any], step: int, device: str) -> None:
    """One step of both: zero_grad, the sum of the outputs' backward, the optimizer's step."""
    (model, reference), (optimizer, torch_optimizer) = models, optimizers
    inputs, torch_inputs = _batch(step, device)
    optimizer.zero_grad()
    torch_optimizer.zero_grad()
    model(inputs).sum().backward()
    reference(torch_inputs).sum().backward()
    optimizer.step()
    torch_optimizer.step()


def _compare(model: Any, reference: Any) -> None:
    for parameter, expected in zip(model.parameters(), reference.parameters()):
        assert_close(parameter, expected.detach(), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(("name", "options"), OPTIMIZERS, ids=[name for name, _ in OPTIMIZERS])
def test_replayed_steps_match_torch_and_lazy_results_keep_old_values(name: str, options: dict[str, Any],
                                                                     device: str) -> None:
    model, reference = _models(device)
    optimizer = getattr(optim, name)(model.parameters(), **options)
    torch_optimizer = getattr(torch.optim, name)(reference.parameters(), **options)
    scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
    torch_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(torch_optimizer, T_max=10)
    for step in range(7):
        inputs, torch_inputs = _batch(step, device)
        optimizer.zero_grad()
        torch_optimizer.zero_grad()
        output = model(inputs)  # lazy, and still unrealized after the step: it must read the weights before it
        torch_output = reference(torch_inputs)
        output.square().mean().backward()
        torch_output.square().mean().backward()
        optimizer.step()
        torch_optimizer.step()
        scheduler.step()
        torch_scheduler.step()
        assert_close(output, torch_output.detach(), atol=2e-5, rtol=1e-4)
        _compare(model, reference)
    # the first step makes the state, the next records and captures the step: the rest are replays
    assert optimizer._replays.replayed >= 4


def test_state_loaded_between_replays_is_what_the_next_steps_update(device: str) -> None:
    model, reference = _models(device)
    optimizer = optim.Adam(model.parameters(), lr=0.01)
    torch_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)

    def train(steps: range) -> None:
        for step in steps:
            _train_step((model, reference), (optimizer, torch_optimizer), step, device)

    train(range(5))
    saved, torch_saved = optimizer.state_dict(), torch_optimizer.state_dict()
    saved = {"state": {index: {key: value.clone() for key, value in entry.items()}
                       for index, entry in saved["state"].items()}, "param_groups": saved["param_groups"]}
    torch_saved = {"state": {index: {key: value.clone() for key, value in entry.items()}
                             for index, entry in torch_saved["state"].items()},
                   "param_groups": torch_saved["param_groups"]}
    train(range(5, 8))
    optimizer.load_state_dict(saved)
    torch_optimizer.load_state_dict(torch_saved)
    replayed = optimizer._replays.replayed
    train(range(8, 13))
    _compare(model, reference)
    assert optimizer._replays.replayed > replayed  # the loaded state is replayed on too, not only stepped eagerly


def test_a_view_of_a_parameter_sees_each_update(device: str) -> None:
    model, reference = _models(device)
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    row = model[0].weight[1]  # a view kept across the steps: torch's shares the parameter's memory
    torch_row = reference[0].weight[1]
    for step in range(5):
        _train_step((model, reference), (optimizer, torch_optimizer), step, device)
        assert_close(row, torch_row.detach(), atol=2e-5, rtol=1e-4)
    _compare(model, reference)


def test_inside_ember_jit_the_step_is_part_of_the_capture(device: str) -> None:
    model, reference = _models(device)
    optimizer = optim.Adam(model.parameters(), lr=0.01)
    torch_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)

    @em.jit
    def step(inputs: Any) -> Any:
        optimizer.zero_grad()
        loss = model(inputs).square().mean()
        loss.backward()
        optimizer.step()
        return loss

    for index in range(6):
        inputs, torch_inputs = _batch(index, device)
        loss = step(inputs)
        torch_optimizer.zero_grad()
        torch_loss = reference(torch_inputs).square().mean()
        torch_loss.backward()
        torch_optimizer.step()
        assert_close(loss, torch_loss.detach(), atol=2e-5, rtol=1e-4)
    _compare(model, reference)
    assert optimizer._replays.replayed == 0  # (ember.jit replays the whole step; the optimizer records nothing)


def test_replayed_adam_on_a_ten_million_element_parameter_matches_torch() -> None:
    # one parameter of 160 x 65,537 (10.5M elements, a dim past 65,535) stepped by replays, with a lazy forward result
    # held across each step, against torch; c only (the size is the point, not the device)
    values = np.random.default_rng(0).standard_normal((160, 65_537), dtype=np.float32)
    parameter = em.nn.Parameter(em.tensor(values, device="c"))
    expected = torch.nn.Parameter(torch.tensor(values))
    optimizer = optim.Adam([parameter], lr=0.01)
    torch_optimizer = torch.optim.Adam([expected], lr=0.01)
    for _ in range(5):
        optimizer.zero_grad()
        torch_optimizer.zero_grad()
        held = parameter.sin()  # lazy: must keep reading the weights before the step
        (held * parameter).sum().backward()
        torch_held = expected.sin()
        (torch_held * expected).sum().backward()
        optimizer.step()
        torch_optimizer.step()
        assert_close(held, torch_held.detach(), atol=1e-5, rtol=1e-4)
    assert_close(parameter, expected.detach(), atol=1e-5, rtol=1e-4)
    assert optimizer._replays.replayed >= 2


def test_a_replayed_step_copies_held_values_without_scheduling(device: str) -> None:
    """Parameters still read by the lazy forward result get buffer copies, not a cloned graph: a replayed step
    schedules no graph of its own (the step is the replay alone), and the lazy result keeps the old values in the
    copies while each parameter keeps its buffer (which the recorded step and the backward's binding point at)."""
    from ember.scheduler.schedule import SCHEDULES

    model, reference = _models(device)
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    for step in range(5):
        inputs, torch_inputs = _batch(step, device)
        optimizer.zero_grad()
        torch_optimizer.zero_grad()
        output = model(inputs)  # lazy: its view nodes of the weights are still alive during the step
        torch_output = reference(torch_inputs)
        output.square().mean().backward()
        torch_output.square().mean().backward()
        scheduled, replayed = SCHEDULES.hits + SCHEDULES.misses, optimizer._replays.replayed
        buffers = [parameter.node.buffer for parameter in model.parameters()]
        optimizer.step()
        torch_optimizer.step()
        if optimizer._replays.replayed > replayed:
            assert SCHEDULES.hits + SCHEDULES.misses == scheduled
            assert all(parameter.node.buffer is buffer for parameter, buffer in zip(model.parameters(), buffers))
        assert_close(output, torch_output.detach(), atol=2e-5, rtol=1e-4)
        _compare(model, reference)
    assert optimizer._replays.replayed >= 2


@pytest.mark.parametrize(("name", "options"), OPTIMIZERS[2:], ids=[name for name, _ in OPTIMIZERS[2:]])
def test_the_first_step_makes_torchs_zero_state_so_the_second_compiles_nothing(name: str, options: dict[str, Any],
                                                                              device: str) -> None:
    models = _models(device)
    optimizers = (getattr(optim, name)(models[0].parameters(), **options),
                  getattr(torch.optim, name)(models[1].parameters(), **options))
    _train_step(models, optimizers, 0, device)
    for parameter, torch_parameter in zip(models[0].parameters(), models[1].parameters()):
        state, torch_state = optimizers[0].state[parameter], optimizers[1].state[torch_parameter]
        assert sorted(state) == sorted(torch_state)
        for key, value in torch_state.items():
            assert_close(state[key], value, atol=1e-6, rtol=1e-5)
    with em.profile() as record:
        _train_step(models, optimizers, 1, device)
    assert [compiled.name for compiled in record.compiles] == []  # (lazy zeros folded into the first update made
    # its kernels differ from every later step's)
    _compare(*models)
