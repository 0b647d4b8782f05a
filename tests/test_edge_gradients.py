"""Forward values and gradients of pow and exp at edge values (0, -0, +-inf, NaN, negative bases, overflow), compared
with PyTorch's on every test device: x ** 0 keeps x in the graph with a zero gradient, exp'(+inf) is inf, negative
bases to fractional powers give NaN gradients, 0 ** y and x ** 0 follow torch's formulas."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import assert_close

inf, nan = math.inf, math.nan
EDGES = [-inf, -3.0, -2.0, -1.0, -0.5, -0.0, 0.0, 0.25, 0.5, 1.0, 2.0, 3.0, inf, nan]
PAIRS = list(itertools.product([-inf, -2.0, -1.0, -0.0, 0.0, 0.5, 1.0, 2.0, inf, nan],
                               [-inf, -2.0, -1.0, -0.5, -0.0, 0.0, 0.3, 1.0, 2.0, 3.0, inf, nan]))
def _compare(function: Callable[..., Any], columns: list[list[float]], device: str, dtype: Any = np.float32,
             torch_function: Callable[..., Any] | None = None) -> None:
    """function(*inputs) in ember and torch: the values, then the gradients of every input for an upstream
    gradient of ones."""
    arrays = [np.array(column, dtype=dtype) for column in columns]
    inputs = [em.tensor(array, device=device, requires_grad=True) for array in arrays]
    torch_inputs = [torch.tensor(array, requires_grad=True) for array in arrays]
    output, torch_output = function(*inputs), (torch_function or function)(*torch_inputs)
    assert output.requires_grad, "the result must stay in the autograd graph"
    output.backward(em.ones_like(output))
    torch_output.backward(torch.ones_like(torch_output))
    tolerance = {"atol": 1e-6, "rtol": 1e-5} if dtype == np.float32 else {"atol": 1e-12, "rtol": 1e-10}
    assert_close(output, torch_output.detach(), **tolerance)
    for position, (tensor, torch_tensor) in enumerate(zip(inputs, torch_inputs)):
        expected = torch_tensor.grad if torch_tensor.grad is not None else torch.zeros_like(torch_tensor)
        assert tensor.grad is not None, f"input {position} got no gradient"
        assert_close(tensor.grad, expected, **tolerance)


SCALAR_EXPONENTS = [0, 0.0, 0.3, -0.3, 2.5, 3, -1, -2, 0.5, -0.5, 1, 2, inf, -inf]


def test_pow_scalar_exponent_at_edge_values(device: str) -> None:
    """x ** p for each p at every edge x, all in one graph (x ** nan is apart: PoCL gets its forward pass wrong)."""
    count = len(SCALAR_EXPONENTS)
    _compare(lambda x: em.stack([x[index] ** exponent for index, exponent in enumerate(SCALAR_EXPONENTS)]),
             [EDGES * count], device,
             torch_function=lambda x: torch.stack([x[index] ** exponent
                                                   for index, exponent in enumerate(SCALAR_EXPONENTS)]))


def test_pow_nan_scalar_exponent(device: str) -> None:
    """x ** nan is NaN except 1 ** nan = 1; the gradient is NaN everywhere but at 1 (torch: nan * 1 ** (nan - 1))."""
    _compare(lambda x: x ** nan, [EDGES], device)


@pytest.mark.parametrize("exponent", [0, 0.0, -0.0, 0.3, 2.5, -2, 0.5])
def test_pow_scalar_exponent_values_and_gradients(exponent: float, device: str) -> None:
    _compare(lambda x: x ** exponent, [EDGES], device)


def test_zero_power_keeps_the_graph(device: str) -> None:
    """x ** 0 is 1 everywhere, and backward reaches x with zeros (torch: zeros_like), also through pow()."""
    x = em.tensor([-inf, -1.0, 0.0, 2.0, inf, nan], device=device, requires_grad=True)
    result = x ** 0 + x.pow(0.0) + em.pow(x, 0)
    assert result.requires_grad and not result.is_leaf
    result.sum().backward()
    np.testing.assert_array_equal(result.numpy(), np.full(6, 3.0, dtype=np.float32))
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros(6, dtype=np.float32))


def test_tensor_pow_at_edge_pairs(device: str) -> None:
    _compare(lambda x, y: x ** y, [[pair[0] for pair in PAIRS], [pair[1] for pair in PAIRS]], device)


def test_tensor_pow_float64_and_broadcast(device: str) -> None:
    """Broadcast operands get the summed gradient; float64 keeps float64 precision."""
    bases = np.array([[-2.0], [0.0], [0.5], [3.0]])
    exponents = np.array([-1.5, 0.0, 0.5, 2.0, 3.0])
    _compare(lambda x, y: x ** y, [bases.tolist(), exponents.tolist()], device, dtype=np.float64)


def test_number_base_pow_at_edge_exponents(device: str) -> None:
    """2 ** x, 0 ** x, (-2) ** x, 1 ** x: the exponent's gradient is out * log(base) (0 where 0 ** (x >= 0))."""
    for base in (2.0, 0.0, -2.0, 1.0, 0.5):
        _compare(lambda x, base=base: base ** x, [EDGES], device)


def test_exp_at_edge_values(device: str) -> None:
    """exp'(x) = exp(x) everywhere, inf beyond the overflow point and at +inf, 0 at -inf."""
    values = EDGES + [88.0, 89.0, 100.0, 200.0, 1e30, -87.0, -104.0, -200.0]
    _compare(lambda x: x.exp(), [values], device)
    _compare(lambda x: x.exp(), [values + [709.0, 710.0, 1000.0, -745.0]], device, dtype=np.float64)


def test_exp_float16_gradient(device: str) -> None:
    _compare(lambda x: x.exp(), [[-inf, -2.0, 0.0, 1.5, 11.0, 12.0, inf, nan]], device, dtype=np.float16)


def test_second_derivatives_of_pow_and_exp(device: str) -> None:
    """The recorded rules are differentiable themselves (create_graph=True), as torch's are."""
    data = np.array([-2.0, -0.5, 0.5, 1.5, 3.0], dtype=np.float32)
    exponents = np.array([3.0, 2.0, 2.5, -1.5, 0.5], dtype=np.float32)
    x = em.tensor(data, device=device, requires_grad=True)
    y = em.tensor(exponents, device=device, requires_grad=True)
    tx, ty = torch.tensor(data, requires_grad=True), torch.tensor(exponents, requires_grad=True)
    value = (x ** 3 + x.abs() ** y + (x * 0.5).exp()).sum()
    torch_value = (tx ** 3 + tx.abs() ** ty + (tx * 0.5).exp()).sum()
    first = em.grad(value, [x, y], create_graph=True)
    torch_first = torch.autograd.grad(torch_value, [tx, ty], create_graph=True)
    second = em.grad(first[0].sum() + first[1].sum(), [x, y])
    torch_second = torch.autograd.grad(torch_first[0].sum() + torch_first[1].sum(), [tx, ty])
    assert_close(list(first), [gradient.detach() for gradient in torch_first], atol=1e-4)
    assert_close(list(second), list(torch_second), atol=1e-4)
