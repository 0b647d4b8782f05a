"""ember.optim against torch.optim: same parameters and state after several steps from identical weights and
gradients, for every option; one realize per step and no recompiles when lr or bias corrections change; schedulers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember as em
import ember.nn as enn
import ember.optim as optim
from ember.optim import lr_scheduler
from tests.helpers import assert_close

SHAPES = [(4, 3), (3,), ()]

OPTIONS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "weight_decay": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.1, "maximize": True, "weight_decay": 0.2}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}),
    ("Adam", {"lr": 0.02, "betas": (0.3, 0.8), "eps": 1e-3, "maximize": True}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("AdamW", {"lr": 0.01}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.5, "amsgrad": True, "maximize": True}),
    ("RMSprop", {"lr": 0.01}),
    ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.5}),
    ("RMSprop", {"lr": 0.01, "alpha": 0.3, "weight_decay": 0.1, "maximize": True, "momentum": 0.9}),
]


def _parameters(device: str, seed: int = 0) -> tuple[list[enn.Parameter], list[torch.nn.Parameter]]:
    generator = np.random.default_rng(seed)
    arrays = [generator.normal(size=shape).astype(np.float32) for shape in SHAPES]
    return (
        [enn.Parameter(em.tensor(array, device=device)) for array in arrays],
        [torch.nn.Parameter(torch.tensor(array)) for array in arrays],
    )


def _set_gradients(
    ember_parameters: list[Any], torch_parameters: list[Any], step: int, device: str, skip: int | None = None
) -> None:
    generator = np.random.default_rng(100 + step)
    for index, (ember_parameter, torch_parameter) in enumerate(zip(ember_parameters, torch_parameters)):
        gradient = generator.normal(size=tuple(torch_parameter.shape)).astype(np.float32)
        if index == skip:  # a parameter without a gradient this step is left alone (and its step count too)
            ember_parameter.grad, torch_parameter.grad = None, None
            continue
        ember_parameter.grad = em.tensor(gradient, device=device)
        torch_parameter.grad = torch.tensor(gradient)


def _compare_state(ember_optimizer: optim.Optimizer, torch_optimizer: torch.optim.Optimizer) -> None:
    ember_state, torch_state = ember_optimizer.state_dict(), torch_optimizer.state_dict()
    assert ember_state["state"].keys() == torch_state["state"].keys()
    for index, values in torch_state["state"].items():
        assert set(ember_state["state"][index]) == set(values), index
        for name, value in values.items():
            assert_close(ember_state["state"][index][name], value, atol=1e-5, rtol=1e-4, check_dtype=False)
    for ember_group, torch_group in zip(ember_state["param_groups"], torch_state["param_groups"]):
        assert ember_group["params"] == torch_group["params"]
        for key in ("lr", "weight_decay", "maximize"):
            assert ember_group[key] == torch_group[key]


@pytest.mark.parametrize(
    ("name", "options"), OPTIONS, ids=[f"{name}-{sorted(options.items())}" for name, options in OPTIONS]
)
def test_optimizer_matches_torch(name: str, options: dict[str, Any], device: str) -> None:
    ember_parameters, torch_parameters = _parameters(device)
    ember_optimizer = getattr(optim, name)(ember_parameters, **options)
    torch_optimizer = getattr(torch.optim, name)(torch_parameters, **options)
    for step in range(5):
        _set_gradients(ember_parameters, torch_parameters, step, device, skip=1 if step == 2 else None)
        ember_optimizer.step()
        torch_optimizer.step()
        for ember_parameter, torch_parameter in zip(ember_parameters, torch_parameters):
            assert_close(ember_parameter, torch_parameter.detach(), atol=1e-5, rtol=1e-4)
    _compare_state(ember_optimizer, torch_optimizer)


def test_one_realize_per_step_and_no_recompiles(device: str) -> None:
    model = enn.Sequential(enn.Linear(6, 5), enn.ReLU(), enn.Linear(5, 2)).to(device)
    optimizer = optim.Adam(model.parameters(), lr=0.01)
    scheduler = lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # a new lr every step
    inputs = em.tensor(np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32), device=device)
    for step in range(4):
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        with em.profile() as record:
            optimizer.step()
        scheduler.step()
        assert record.realizes == 1, record
        # per parameter: the new parameter and both moments (the first step's moments start from constants);
        # plus one for the step count on the device that all four parameters share; the two bias corrections
        # computed from it (recorded once per step, shared by the four updates) cost a few dozen scalar ops, which
        # the updates of these small parameters recompute rather than store
        assert len(record.kernels) == 3 * 4 + 1
        if step >= 2:
            assert record.compiles == [], [compile.name for compile in record.compiles]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**4)


def test_sgd_step_kernels_and_closure(device: str) -> None:
    model = enn.Linear(4, 3).to(device)
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    inputs = em.ones(2, 4, device=device)

    def closure() -> em.Tensor:
        optimizer.zero_grad()
        loss = model(inputs).square().sum()
        loss.backward()
        return loss

    for _ in range(3):
        with em.profile() as record:
            loss = optimizer.step(closure)
    assert loss.node.realized  # the closure's loss is computed in the step's schedule
    assert record.compiles == []
    assert len(record.kernels) <= 2 * 2 + 4  # momentum buffer + parameter per tensor, plus forward/backward


def test_param_groups_add_group_and_zero_grad(device: str) -> None:
    ember_parameters, torch_parameters = _parameters(device)
    ember_optimizer = optim.SGD(
        [{"params": ember_parameters[:1], "lr": 0.5}, {"params": ember_parameters[1:2]}], lr=0.1, momentum=0.5
    )
    torch_optimizer = torch.optim.SGD(
        [{"params": torch_parameters[:1], "lr": 0.5}, {"params": torch_parameters[1:2]}], lr=0.1, momentum=0.5
    )
    ember_optimizer.add_param_group({"params": [ember_parameters[2]], "momentum": 0.0})
    torch_optimizer.add_param_group({"params": [torch_parameters[2]], "momentum": 0.0})
    assert [group["lr"] for group in ember_optimizer.param_groups] == [0.5, 0.1, 0.1]
    for step in range(3):
        _set_gradients(ember_parameters, torch_parameters, step, device)
        ember_optimizer.step(), torch_optimizer.step()
    for ember_parameter, torch_parameter in zip(ember_parameters, torch_parameters):
        assert_close(ember_parameter, torch_parameter.detach(), atol=1e-6)
    _compare_state(ember_optimizer, torch_optimizer)
    ember_optimizer.zero_grad(set_to_none=False)
    assert_close(ember_parameters[0].grad, torch.zeros(4, 3))
    ember_optimizer.zero_grad()
    assert all(parameter.grad is None for parameter in ember_parameters)
    with pytest.raises(ValueError, match="more than one parameter group"):
        ember_optimizer.add_param_group({"params": [ember_parameters[0]]})


def test_state_dict_round_trip_and_loading_torch_state(device: str) -> None:
    ember_parameters, torch_parameters = _parameters(device)
    options = {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}
    ember_optimizer = optim.AdamW(ember_parameters, **options)
    torch_optimizer = torch.optim.AdamW(torch_parameters, **options)
    for step in range(2):
        _set_gradients(ember_parameters, torch_parameters, step, device)
        ember_optimizer.step(), torch_optimizer.step()
    # a fresh ember optimizer loads torch's state dict (torch tensors) and continues exactly like torch
    resumed_parameters = [
        enn.Parameter(em.tensor(parameter.detach().numpy(), device=device)) for parameter in torch_parameters
    ]
    resumed = optim.AdamW(resumed_parameters, lr=1.0)
    resumed.load_state_dict(torch_optimizer.state_dict())
    assert resumed.param_groups[0]["lr"] == 0.01 and resumed.param_groups[0]["params"] == resumed_parameters
    # and one loading ember's own state dict continues like the original
    copied_parameters = [enn.Parameter(em.tensor(parameter.numpy(), device=device)) for parameter in ember_parameters]
    copied = optim.AdamW(copied_parameters)
    copied.load_state_dict(ember_optimizer.state_dict())
    for step in range(2, 4):
        _set_gradients(ember_parameters, torch_parameters, step, device)
        _set_gradients(resumed_parameters, torch_parameters, step, device)
        _set_gradients(copied_parameters, torch_parameters, step, device)
        ember_optimizer.step(), torch_optimizer.step(), resumed.step(), copied.step()
    for parameters in (ember_parameters, resumed_parameters, copied_parameters):
        for ember_parameter, torch_parameter in zip(parameters, torch_parameters):
            assert_close(ember_parameter, torch_parameter.detach(), atol=1e-6)
    with pytest.raises(ValueError, match="parameter groups"):
        copied.load_state_dict({"state": {}, "param_groups": []})
    with pytest.raises(ValueError, match="has 2 parameters"):
        copied.load_state_dict({"state": {}, "param_groups": [dict(ember_optimizer.param_groups[0], params=[0, 1])]})


def test_optimizer_argument_errors() -> None:
    parameter = enn.Parameter(em.ones(2))
    with pytest.raises(ValueError, match="Invalid learning rate"):
        optim.SGD([parameter], lr=-1)
    with pytest.raises(ValueError, match="Nesterov momentum requires"):
        optim.SGD([parameter], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1"):
        optim.Adam([parameter], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Invalid epsilon"):
        optim.RMSprop([parameter], eps=-1.0)
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.Adam([])
    with pytest.raises(TypeError, match="wrap it in a list"):
        optim.Adam(parameter)
    with pytest.raises(ValueError, match="non-leaf"):
        optim.SGD([parameter * 2], lr=0.1)
    with pytest.raises(TypeError, match="floating point"):
        optim.SGD([em.ones(2, dtype=em.int32)], lr=0.1)
    optimizer = optim.SGD([parameter], lr=0.1)
    parameter.grad = em.ones(3)
    with pytest.raises(ValueError, match="gradient of a parameter of shape"):
        optimizer.step()


def _scheduler_pairs(make: Any, epochs: int, groups: int = 2) -> tuple[list[list[float]], list[list[float]]]:
    ember_parameters = [[enn.Parameter(em.ones(1))] for _ in range(groups)]
    torch_parameters = [[torch.nn.Parameter(torch.ones(1))] for _ in range(groups)]
    ember_optimizer = optim.SGD(
        [{"params": params, "lr": 0.1 * (index + 1)} for index, params in enumerate(ember_parameters)], lr=0.1
    )
    torch_optimizer = torch.optim.SGD(
        [{"params": params, "lr": 0.1 * (index + 1)} for index, params in enumerate(torch_parameters)], lr=0.1
    )
    ember_scheduler, torch_scheduler = (
        make(lr_scheduler, ember_optimizer),
        make(torch.optim.lr_scheduler, torch_optimizer),
    )
    ember_lrs, torch_lrs = [ember_scheduler.get_last_lr()], [torch_scheduler.get_last_lr()]
    for _ in range(epochs):
        ember_optimizer.step(), torch_optimizer.step()
        ember_scheduler.step(), torch_scheduler.step()
        ember_lrs.append(ember_scheduler.get_last_lr())
        torch_lrs.append(torch_scheduler.get_last_lr())
    return ember_lrs, torch_lrs


@pytest.mark.parametrize(
    "make",
    [
        lambda module, optimizer: module.StepLR(optimizer, step_size=3, gamma=0.5),
        lambda module, optimizer: module.MultiStepLR(optimizer, milestones=[2, 5, 5], gamma=0.3),
        lambda module, optimizer: module.ExponentialLR(optimizer, gamma=0.9),
        lambda module, optimizer: module.CosineAnnealingLR(optimizer, T_max=4, eta_min=0.01),
        lambda module, optimizer: module.LambdaLR(optimizer, [lambda epoch: 0.9**epoch, lambda epoch: 1 / (epoch + 1)]),
    ],
    ids=["StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "LambdaLR"],
)
def test_schedulers_match_torch(make: Any) -> None:
    ember_lrs, torch_lrs = _scheduler_pairs(make, epochs=11)
    np.testing.assert_allclose(np.array(ember_lrs), np.array(torch_lrs), rtol=1e-12, atol=1e-15)


def test_scheduler_state_dict_and_errors() -> None:
    parameter = enn.Parameter(em.ones(1))
    optimizer = optim.SGD([parameter], lr=1.0)
    scheduler = lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
    for _ in range(3):
        scheduler.step()
    state = scheduler.state_dict()
    assert "optimizer" not in state and state["last_epoch"] == 3
    other_optimizer = optim.SGD([enn.Parameter(em.ones(1))], lr=1.0)
    other = lr_scheduler.CosineAnnealingLR(other_optimizer, T_max=10)
    other_optimizer.load_state_dict(optimizer.state_dict())  # as with torch, the lr lives in the optimizer's state
    other.load_state_dict(state)
    other.step(), scheduler.step()
    assert other.get_last_lr() == pytest.approx(scheduler.get_last_lr())
    with pytest.raises(TypeError, match="is not an Optimizer"):
        lr_scheduler.StepLR(object(), 2)
    with pytest.raises(KeyError, match="initial_lr"):
        lr_scheduler.StepLR(optim.SGD([enn.Parameter(em.ones(1))], lr=1.0), 2, last_epoch=3)
    with pytest.raises(ValueError, match="Expected 1 lr_lambdas"):
        lr_scheduler.LambdaLR(optimizer, [lambda epoch: 1.0, lambda epoch: 1.0])
