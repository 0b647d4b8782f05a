"""Numeric parity with PyTorch: zero gradients that still reach their input (copysign's sign operand), torch's errors
for scatter_reduce, Tensor.unfold for every (dimension, size, step), and the accuracy of batch and layer
normalization gradients against a float64 reference (ember's float32 error within a few times torch's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import assert_close, random_array

# ---- gradients that are identically zero still reach their input (torch) -------------------------------------------


def test_copysign_sign_operand_gets_a_zero_gradient(device: str) -> None:
    magnitude = np.array([1.5, -2.0, 0.0, -0.0, 3.0, np.inf, -7.0], np.float32)
    sign = np.array([-1.0, 2.0, -1.0, 1.0, -0.0, -3.0, 0.0], np.float32)
    a, b = (em.tensor(value, device=device, requires_grad=True) for value in (magnitude, sign))
    ta, tb = (torch.tensor(value, requires_grad=True) for value in (magnitude, sign))
    grads = em.autograd.grad(a.copysign(b).sum(), [a, b])
    torch_grads = torch.autograd.grad(torch.copysign(ta, tb).sum(), [ta, tb])
    finite = np.isfinite(magnitude)  # at +-inf torch gives inf / inf = NaN, ember the limit +-1
    assert_close(grads[0].numpy()[finite], torch_grads[0].numpy()[finite])
    assert_close(grads[1], torch_grads[1])
    # the sign operand alone requiring grad: the result requires grad (torch), and backward fills zeros
    only_sign = em.tensor(sign, device=device, requires_grad=True)
    result = em.tensor(magnitude, device=device).copysign(only_sign)
    assert result.requires_grad
    result.sum().backward()
    assert_close(only_sign.grad, torch.zeros(len(sign)))


@pytest.mark.parametrize("name", ["sign", "floor", "ceil", "round", "trunc", "frac"])
def test_piecewise_constant_ops_keep_their_input(name: str, device: str) -> None:
    data = np.array([1.5, -2.25, 0.3, -0.7, 2.0], np.float32)
    x, tx = em.tensor(data, device=device, requires_grad=True), torch.tensor(data, requires_grad=True)
    (gradient,) = em.autograd.grad(getattr(x, name)().sum(), [x])
    (torch_gradient,) = torch.autograd.grad(getattr(tx, name)().sum(), [tx])
    assert_close(gradient, torch_gradient)


def test_a_comparison_does_not_use_its_operands_as_in_torch(device: str) -> None:
    data = np.array([1.0, -2.0, 3.0], np.float32)
    x, y = (em.tensor(data, device=device, requires_grad=True) for _ in range(2))
    tx, ty = (torch.tensor(data, requires_grad=True) for _ in range(2))
    with pytest.raises(RuntimeError):
        torch.autograd.grad(torch.where(ty > 0, tx, tx * 2).sum(), [ty])
    with pytest.raises(RuntimeError, match="not used"):
        em.autograd.grad(em.where(y > 0, x, x * 2).sum(), [y])


# ---- scatter_reduce: torch's errors, torch's results -----------------------------------------------------------------


def _scatter_case(module: Any, name: str) -> Any:
    """One scatter_reduce call, written once for torch and ember (`module` is torch or ember)."""
    x, src = module.zeros(3, 4), module.arange(12.0).reshape(3, 4)
    index = module.tensor([[0, 1, 2, 0], [1, 2, 0, 1], [2, 0, 1, 2]])
    calls: dict[str, Callable[[], Any]] = {
        "unknown reduce": lambda: x.scatter_reduce(0, index, src, "mul"),
        "upper-case reduce": lambda: x.scatter_reduce(0, index, src, "SUM"),
        "reduce not a str": lambda: x.scatter_reduce(0, index, src, None),
        "reduce max (accepted)": lambda: (x - 5).scatter_reduce(0, index, src, "max"),
        "reduce min (accepted)": lambda: (x + 5).scatter_reduce(1, index, src, "min", include_self=False),
        "src float64": lambda: x.scatter_reduce(0, index, src.to(module.float64), "sum"),
        "src int32": lambda: x.scatter_reduce(0, index, src.to(module.int32), "sum"),
        "self int64, src float": lambda: x.to(module.int64).scatter_reduce(0, index, src, "amax"),
        "index int32 (accepted)": lambda: x.scatter_reduce(0, index.to(module.int32), src, "prod"),
        "index int16": lambda: x.scatter_reduce(0, index.to(module.int16), src, "sum"),
        "index float": lambda: x.scatter_reduce(0, index.to(module.float32), src, "sum"),
        "index fewer dims": lambda: x.scatter_reduce(0, index[0], src, "sum"),
        "src fewer dims": lambda: x.scatter_reduce(0, index, src[0], "sum"),
        "src more dims": lambda: x.scatter_reduce(0, index, src.reshape(1, 3, 4), "sum"),
        "index larger than src": lambda: x.scatter_reduce(0, index, src[:2], "sum"),
        "index larger than self": lambda: module.zeros(3, 2).scatter_reduce(0, index, src, "sum"),
        "index out of range": lambda: x.scatter_reduce(0, index + 1, src, "amin"),
        "dim out of range": lambda: x.scatter_reduce(2, index, src, "sum"),
        "include_self not a bool": lambda: x.scatter_reduce(0, index, src, "sum", include_self=0),
        "src a number": lambda: x.scatter_reduce(0, index, 1.0, "sum"),
        "include_self False, mean": lambda: (x + 1).scatter_reduce(0, index, src, "mean", include_self=False),
        "0-d self, 1-d index and src": lambda: module.zeros(()).scatter_reduce(
            0, module.tensor([0, 0]), module.tensor([5.0, 2.0]), "sum"),
        "integer mean": lambda: x.long().scatter_reduce(0, index, src.long() * 3, "mean"),
        "scatter_add src float64": lambda: x.scatter_add(0, index, src.to(module.float64)),
        "scatter src float64": lambda: x.scatter(0, index, src.to(module.float64)),
    }
    return calls[name]()


SCATTER_CASES = [
    "unknown reduce", "upper-case reduce", "reduce not a str", "reduce max (accepted)", "reduce min (accepted)",
    "src float64", "src int32", "self int64, src float", "index int32 (accepted)", "index int16", "index float",
    "index fewer dims", "src fewer dims", "src more dims", "index larger than src", "index larger than self",
    "index out of range", "dim out of range", "include_self not a bool", "src a number", "include_self False, mean",
    "0-d self, 1-d index and src", "integer mean", "scatter_add src float64", "scatter src float64",
]


def test_scatter_reduce_raises_where_torch_raises() -> None:
    for name in SCATTER_CASES:
        try:
            expected = _scatter_case(torch, name)
        except Exception as error:  # torch rejects it: ember raises an error of the same builtin class
            with pytest.raises(type(error)):
                result = _scatter_case(em, name)
                result.realize()  # an index out of range is found when the values are computed
            continue
        assert_close(_scatter_case(em, name), expected)


# ---- Tensor.unfold: every (dimension, size, step) torch accepts, and its errors for the rest -----------------------


def test_unfold_matches_torch_for_every_size_and_step() -> None:
    checked = 0
    for shape in [(7,), (2, 9), (3, 5, 4), (), (0, 3)]:
        data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        rank = max(len(shape), 1)
        for dimension in range(-rank - 1, rank + 1):
            for size in (-1, 0, 1, 2, 3, 5, 7, 9, 10):
                for step in (-1, 0, 1, 2, 3, 4, 6, 11):
                    try:
                        expected = torch.tensor(data).unfold(dimension, size, step)
                    except Exception as error:
                        with pytest.raises(type(error)):
                            em.tensor(data).unfold(dimension, size, step)
                        continue
                    result = em.tensor(data).unfold(dimension, size, step)
                    assert tuple(result.shape) == tuple(expected.shape), (shape, dimension, size, step)
                    np.testing.assert_array_equal(result.numpy(), expected.numpy())
                    checked += 1
    assert checked > 200


@pytest.mark.parametrize(("shape", "dimension", "size", "step"),
                         [((9,), 0, 2, 3), ((2, 9), 1, 3, 4), ((3, 10), 1, 10, 1), ((3, 10), 0, 2, 5)])
def test_unfold_gradient_with_gaps_and_overlaps(shape: tuple[int, ...], dimension: int, size: int, step: int,
                                                device: str) -> None:
    data = random_array(shape)
    x, tx = em.tensor(data, device=device, requires_grad=True), torch.tensor(data, requires_grad=True)
    expected = tx.unfold(dimension, size, step)
    weights = random_array(tuple(expected.shape), seed=1)
    (expected * torch.tensor(weights)).sum().backward()
    (x.unfold(dimension, size, step) * em.tensor(weights, device=device)).sum().backward()
    assert_close(x.grad, tx.grad)


# ---- normalization accuracy: ember's float32 error against a float64 reference, within a few times torch's -------


def _normalization(module: Any, kind: str, x: Any, weight: Any, bias: Any, running: tuple[Any, Any]) -> Any:
    functional = module.nn.functional
    if kind == "batch_norm":
        return functional.batch_norm(x, running[0], running[1], weight, bias, True, 0.1, 1e-5)
    if kind == "group_norm":
        return functional.group_norm(x, 4, weight, bias)
    if kind == "instance_norm":
        return functional.instance_norm(x, running[0], running[1], weight, bias, True, 0.1, 1e-5)
    return functional.layer_norm(x.transpose(1, -1), (x.shape[1],), weight, bias).transpose(1, -1)


def _normalization_results(module: Any, kind: str, arrays: list[np.ndarray], device: str, dtype: Any) -> list[Any]:
    """Output, input, weight and bias gradients, and running mean and variance, as float64 numpy arrays."""
    x, grad, weight, bias = arrays
    channels = x.shape[1]
    keywords = {"device": device} if module is em else {}
    leaves = [module.tensor(array, dtype=dtype, requires_grad=True, **keywords) for array in (x, weight, bias)]
    running = (module.zeros(channels, dtype=dtype, **keywords), module.ones(channels, dtype=dtype, **keywords))
    output = _normalization(module, kind, *leaves, running)
    output.backward(module.tensor(grad, dtype=dtype, **keywords))
    results = [output.detach(), *(leaf.grad for leaf in leaves)]
    if kind in ("batch_norm", "instance_norm"):
        results += list(running)
    return [np.asarray(result.numpy(), np.float64) for result in results]


@pytest.mark.parametrize("kind", ["batch_norm", "group_norm", "instance_norm", "layer_norm"])
@pytest.mark.parametrize("ones", [False, True], ids=["random-grad", "sum-loss"])
def test_normalization_float32_error_within_a_few_times_torch(kind: str, ones: bool, device: str) -> None:
    """A CNN's size (64 x 16 channels of 28x28): each result of ember's float32 is at most 4x torch's float32 error
    (plus a tiny epsilon) from torch's float64. A sum loss (a gradient of ones) makes the input gradient cancel to
    ~0, where a chain rule through the statistics was 11x off torch's formula."""
    generator = np.random.default_rng(3)
    shape = (64, 16, 28, 28)
    x = (generator.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    grad = np.ones(shape, np.float32) if ones else generator.standard_normal(shape).astype(np.float32)
    weight = (generator.standard_normal(16) * 0.5 + 1).astype(np.float32)
    bias = generator.standard_normal(16).astype(np.float32)
    arrays = [x, grad, weight, bias]
    reference = _normalization_results(torch, kind, arrays, "cpu", torch.float64)
    torch_float32 = _normalization_results(torch, kind, arrays, "cpu", torch.float32)
    ember_float32 = _normalization_results(em, kind, arrays, device, em.float32)
    names = ["output", "input grad", "weight grad", "bias grad", "running mean", "running var"]
    for name, truth, torch_result, ember_result in zip(names, reference, torch_float32, ember_float32):
        torch_error = np.abs(torch_result - truth).max()
        ember_error = np.abs(ember_result - truth).max()
        assert ember_error <= 4 * torch_error + 1e-9, (
            f"{kind} {name}: ember's float32 error {ember_error:.3g}, torch's {torch_error:.3g}")


def test_batch_norm_module_matches_torch_training_and_eval(device: str) -> None:
    """BatchNorm1d/2d/3d: training output, gradients and running stats (their batch statistics are the forward's),
    then eval with the running stats, against torch."""
    for module_name, shape in (("BatchNorm1d", (16, 6)), ("BatchNorm1d", (8, 6, 9)), ("BatchNorm2d", (4, 6, 5, 7)),
                               ("BatchNorm3d", (2, 6, 3, 4, 5))):
        data = random_array(shape, seed=4) * 3 + 1
        layer, torch_layer = getattr(em.nn, module_name)(6, momentum=None).to(device), getattr(torch.nn, module_name)(
            6, momentum=None)
        x, tx = em.tensor(data, device=device, requires_grad=True), torch.tensor(data, requires_grad=True)
        weights = random_array(shape, seed=5)
        for _ in range(2):
            (layer(x) * em.tensor(weights, device=device)).sum().backward()
            (torch_layer(tx) * torch.tensor(weights)).sum().backward()
        assert_close(x.grad, tx.grad, atol=1e-4)
        assert_close(layer.weight.grad, torch_layer.weight.grad, atol=1e-4)
        assert_close(layer.bias.grad, torch_layer.bias.grad, atol=1e-4)
        assert_close(layer.running_mean, torch_layer.running_mean)
        assert_close(layer.running_var, torch_layer.running_var)
        layer.eval(), torch_layer.eval()
        assert_close(layer(x), torch_layer(tx), atol=1e-5)


def test_batch_norm_double_backward_matches_torch() -> None:
    generator = np.random.default_rng(6)
    arrays = [generator.standard_normal(shape) for shape in ((4, 3, 5), (3,), (3,), (4, 3, 5))]

    def second_gradients(module: Any) -> list[np.ndarray]:
        x, weight, bias = (module.tensor(array, requires_grad=True) for array in arrays[:3])
        output = module.nn.functional.batch_norm(x, None, None, weight, bias, True)
        grad_x, grad_weight = module.autograd.grad((output * module.tensor(arrays[3])).sum(), [x, weight],
                                                   create_graph=True)
        total = (grad_x * grad_x).sum() + (grad_weight * grad_weight).sum()
        return [gradient.detach().numpy() for gradient in module.autograd.grad(total, [x, weight])]

    for ember_result, torch_result in zip(second_gradients(em), second_gradients(torch)):
        np.testing.assert_allclose(ember_result, torch_result, atol=1e-10)
