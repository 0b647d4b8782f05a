"""Batch norm (one autograd step, torch's closed-form backward) against torch: BatchNorm1d/2d/3d in training and
eval, running statistics over steps with a momentum, momentum=None (cumulative average), affine=False,
track_running_stats=False, the functional form, NaN and inf inputs, a ResNet-sized input (64 x 64 x 56 x 56), and
the kernels of one layer's training step (pinned)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember as em
from ember.ir.group_reduce import reduces_by_groups
from ember.scheduler.devices import get_device
from tests.helpers import assert_close, pair, random_array

SHAPES = {"BatchNorm1d": [(16, 6), (8, 6, 9)], "BatchNorm2d": [(4, 6, 5, 7)], "BatchNorm3d": [(2, 6, 3, 4, 5)]}
OPTIONS: list[dict[str, Any]] = [{}, {"momentum": None}, {"affine": False}, {"track_running_stats": False},
                                 {"momentum": 0.3, "eps": 1e-3}]


def _steps(layer: Any, torch_layer: Any, data: np.ndarray, device: str, steps: int = 2) -> None:
    """`steps` training steps of both layers on the same input and output gradient, compared after each."""
    for step in range(steps):
        x, tx = pair(data + step, device, requires_grad=True)
        output, expected = layer(x), torch_layer(tx)
        assert_close(output, expected, atol=1e-5)
        grad, tgrad = pair(random_array(data.shape, seed=10 + step), device)
        output.backward(grad)
        expected.backward(tgrad)
        assert_close(x.grad, tx.grad, atol=1e-4)
    for name in ("weight", "bias"):
        parameter, torch_parameter = getattr(layer, name), getattr(torch_layer, name)
        assert (parameter is None) == (torch_parameter is None), name
        if parameter is not None:
            assert_close(parameter.grad, torch_parameter.grad, atol=1e-4)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        buffer, torch_buffer = getattr(layer, name), getattr(torch_layer, name)
        assert (buffer is None) == (torch_buffer is None), name
        if buffer is not None:
            assert_close(buffer, torch_buffer, check_dtype=False)


def test_batch_norm_modules_match_torch_in_training_and_eval(device: str) -> None:
    """Every shape with the defaults and momentum=None; every option on the 2d layer."""
    for module_name, shapes in SHAPES.items():
        for shape in shapes:
            for options in OPTIONS if module_name == "BatchNorm2d" else OPTIONS[:2]:
                layer = getattr(em.nn, module_name)(6, **options).to(device)
                torch_layer = getattr(torch.nn, module_name)(6, **options)
                data = random_array(shape, seed=len(shape)) * 3 + 1
                _steps(layer, torch_layer, data, device)
                layer.eval(), torch_layer.eval()
                x, tx = pair(data, device)
                assert_close(layer(x), torch_layer(tx), atol=1e-5)


def test_functional_batch_norm_matches_torch(device: str) -> None:
    """Training with and without running statistics to update, then eval with them."""
    data = random_array((5, 4, 3, 6), seed=2) * 2 - 1
    weight, bias = random_array((4,), seed=3), random_array((4,), seed=4)
    for running in (True, False):
        mean, tmean = pair(random_array((4,), seed=5), device)
        var, tvar = pair(random_array((4,), seed=6, low=0.5, high=2.0), device)
        x, tx = pair(data, device, requires_grad=True)
        w, tw = pair(weight, device, requires_grad=True)
        b, tb = pair(bias, device, requires_grad=True)
        output = em.nn.functional.batch_norm(x, mean if running else None, var if running else None, w, b, True,
                                             0.2, 1e-4)
        expected = TF.batch_norm(tx, tmean if running else None, tvar if running else None, tw, tb, True, 0.2, 1e-4)
        assert_close(output, expected, atol=1e-5)
        grad, tgrad = pair(random_array(data.shape, seed=7), device)
        output.backward(grad)
        expected.backward(tgrad)
        for actual, wanted in ((x.grad, tx.grad), (w.grad, tw.grad), (b.grad, tb.grad), (mean, tmean), (var, tvar)):
            assert_close(actual, wanted, atol=1e-4)
        evaluated = em.nn.functional.batch_norm(x, mean, var, w, b, False, 0.2, 1e-4)
        assert_close(evaluated, TF.batch_norm(tx, tmean, tvar, tw, tb, False, 0.2, 1e-4), atol=1e-5)


def test_batch_norm_with_nan_and_inf_matches_torch(device: str) -> None:
    """An inf in channel 0 and a NaN in channel 2: those channels' outputs and gradients are NaN as torch's, the
    running statistics take the NaN and inf as torch's, the other channels are untouched."""
    data = random_array((4, 3, 5, 6), seed=8)
    data[1, 0, 2, 3] = np.inf
    data[2, 2, 4, 1] = np.nan
    layer, torch_layer = em.nn.BatchNorm2d(3).to(device), torch.nn.BatchNorm2d(3)
    _steps(layer, torch_layer, data, device, steps=1)
    assert np.isnan(layer.running_var.numpy()[[0, 2]]).all() and np.isfinite(layer.running_var.numpy()[1])


def test_batch_norm_at_resnet_size_matches_torch(device: str) -> None:
    """16 x 64 x 56 x 56 (a ResNet's first stage, batch 16): output and gradients against torch's float64; the
    statistics are sums of 50,176 values per channel (in stages)."""
    generator = np.random.default_rng(11)
    data = (generator.standard_normal((16, 64, 56, 56)) * 2 + 0.5).astype(np.float32)
    grad = generator.standard_normal(data.shape).astype(np.float32)
    layer = em.nn.BatchNorm2d(64).to(device)
    torch_layer = torch.nn.BatchNorm2d(64).double()
    x, tx = em.tensor(data, device=device, requires_grad=True), torch.tensor(data, dtype=torch.float64,
                                                                           requires_grad=True)
    output, expected = layer(x), torch_layer(tx)
    output.backward(em.tensor(grad, device=device))
    expected.backward(torch.tensor(grad, dtype=torch.float64))
    assert_close(output, expected.float(), atol=2e-5, check_dtype=False)
    assert_close(x.grad, tx.grad.float(), atol=2e-5, check_dtype=False)
    assert_close(layer.weight.grad, torch_layer.weight.grad.float(), atol=1e-1, rtol=1e-4, check_dtype=False)
    assert_close(layer.bias.grad, torch_layer.bias.grad.float(), atol=1e-1, rtol=1e-4, check_dtype=False)
    assert_close(layer.running_mean, torch_layer.running_mean.float(), check_dtype=False)
    assert_close(layer.running_var, torch_layer.running_var.float(), check_dtype=False)


def _kernels(function: Any) -> int:
    with em.profile() as profile:
        function()
    return len(profile.kernels)


def test_batch_norm_training_step_kernel_counts(device: str) -> None:
    """Forward: the mean and the variance each summed in stages (chunks of 64 values, then of 64 partials), 1 / std,
    the normalization. Backward: sum(grad) and sum(grad * xhat) as one staged reduce (grad times [1, xhat]), the
    input's gradient (one elementwise kernel), the weight's and bias' gradients copied from the stacked sums; and the
    running statistics, 3 assignments, in the backward's schedule (core/state_updates.py: nothing is left to compute
    for them afterwards). Before: 8 + 9 kernels over 64 x 32 x 8 x 8 (the two backward sums reduced
    apart, 3 stages each), 10 + 11 over 8 x 64 x 56 x 56 (3 stages of 64 and 16: 4). These are a CPU's stages; a
    device that reduces rows by workgroups (a GPU) has its own, counted in tests/test_group_reduce.py."""
    if reduces_by_groups(get_device(device).info):
        pytest.skip(f"{device} reduces rows by workgroups: its stages are not a CPU's")
    for shape, forward, backward in (((64, 32, 8, 8), 6, 5), ((8, 64, 56, 56), 8, 6), ((64, 16, 16, 16), 8, 6)):
        layer = em.nn.BatchNorm2d(shape[1]).to(device)
        x = em.randn(*shape, device=device).realize().requires_grad_()
        output = layer(x)
        assert _kernels(output.realize) == forward, shape
        grad = em.randn(*shape, device=device).realize()
        assert _kernels(lambda: (output.backward(grad), em.realize(x.grad, layer.weight.grad,
                                                                   layer.bias.grad))) == backward + 3, shape
        assert _kernels(lambda: em.realize(layer.running_mean, layer.running_var,
                                           layer.num_batches_tracked)) == 0, shape


def test_running_statistics_are_computed_by_the_next_backward_or_optimizer_step(device: str) -> None:
    """The lazy running statistics a training forward makes are computed in the schedule of the backward that follows
    (core/state_updates.py), else by the optimizer's next step (a forward without a backward), never chained across
    steps; their values and the parameters' follow torch's over SGD steps."""
    layer, torch_layer = em.nn.BatchNorm1d(4).to(device), torch.nn.BatchNorm1d(4)
    optimizer = em.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    torch_optimizer = torch.optim.SGD(torch_layer.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        x, tx = pair(random_array((8, 4), seed=step) * 2 + 1, device, requires_grad=True)
        (layer(x) * x).sum().backward()
        (torch_layer(tx) * tx).sum().backward()
        assert layer.running_mean.node.realized and layer.running_var.node.realized, step
        optimizer.step(), torch_optimizer.step()
        optimizer.zero_grad(), torch_optimizer.zero_grad()
    x, tx = pair(random_array((8, 4), seed=9) - 1, device)
    with em.no_grad():
        layer(x)
    with torch.no_grad():
        torch_layer(tx)
    assert not layer.running_mean.node.realized
    optimizer.step(), torch_optimizer.step()  # (no gradients: only the statistics are computed)
    assert layer.running_mean.node.realized and layer.running_var.node.realized
    for name in ("running_mean", "running_var", "num_batches_tracked", "weight", "bias"):
        assert_close(getattr(layer, name), getattr(torch_layer, name), check_dtype=False, atol=1e-5)
