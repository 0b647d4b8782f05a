"""Graphs of any depth: long chains realize, differentiate and print under Python's default recursion limit."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import ember as em
from ember.scheduler import kernelize
from tests.helpers import random_array

# a chain much longer than the recursion limit; c runs the full length, the other backends a shorter one (each
# of their compiles is slower), still five times the limit
LONG_CHAIN = {"c": 100_000}
SHORT_CHAIN = 5_000


def _chain_length(device: str) -> int:
    return LONG_CHAIN.get(device.split(":")[0], SHORT_CHAIN)


def test_recursion_limit_is_the_default() -> None:
    assert sys.getrecursionlimit() <= 1000 < SHORT_CHAIN


def test_long_elementwise_chain(device: str) -> None:
    length = _chain_length(device)
    array = random_array((3, 5))
    x, expected = em.tensor(array, device=device), array.copy()
    y = x
    for step in range(length):  # add 1, negate, add 3, negate: x - 2 every four ops, exact in float32
        kind = step % 4
        if kind == 0:
            y, expected = y + 1.0, expected + np.float32(1.0)
        elif kind == 2:
            y, expected = y + 3.0, expected + np.float32(3.0)
        else:
            y, expected = -y, -expected
    with em.profile() as profile:
        result = y.numpy()
    np.testing.assert_array_equal(result, expected)
    # the chain is cut into kernels of bounded size, not compiled as one giant function
    assert len(profile.kernels) >= length // kernelize.MAX_KERNEL_OPS


@pytest.mark.parametrize("rewrites", [False, True], ids=["plain", "rewrites"])
def test_long_chain_over_constants_is_cut_too(device: str, rewrites: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.settings import CONFIG

    monkeypatch.setattr(CONFIG, "rewrites", rewrites)
    y = em.zeros(3, 5, device=device)
    for _ in range(3_000):
        y = y + 1.0
    with em.profile() as profile:
        result = y.numpy()
    np.testing.assert_array_equal(result, np.full((3, 5), 3000, dtype=np.float32))
    if rewrites:  # the graph rewrites fold the chain into one constant (every partial sum is exact)
        assert len(profile.kernels) == 1
    else:
        assert len(profile.kernels) >= 3_000 // kernelize.MAX_KERNEL_OPS


def _flip_chain(device: str, length: int) -> tuple[em.Tensor, np.ndarray]:
    array = random_array((2, 3), seed=4)
    y, expected = em.tensor(array, device=device), array
    for _ in range(length // 2):  # an index expression and a value as deep as the chain
        y, expected = y.flip(1) + 1.0, expected[:, ::-1] + np.float32(1.0)
    return y, expected


def test_one_kernel_deeper_than_the_recursion_limit(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernelize, "MAX_KERNEL_OPS", 10**9)  # no cut: lowering and rendering see the whole depth
    y, expected = _flip_chain(device, 3_000)
    with em.profile() as profile:
        result = y.numpy()
    assert len(profile.kernels) == 1
    np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("renderer", ["dummy:ptx", "dummy:wgsl", "dummy:opencl"])
def test_every_renderer_takes_a_kernel_deeper_than_the_recursion_limit(renderer: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernelize, "MAX_KERNEL_OPS", 10**9)
    y, _ = _flip_chain(renderer, 3_000)
    y.realize()  # rendered and compiled (PTX assembled by ptxas where it is installed), nothing run


def _mixed_step(y: em.Tensor | np.ndarray, base: em.Tensor | np.ndarray) -> em.Tensor | np.ndarray:
    """One round of movement ops and a keepdim reduction on a (4, 6) value (the same code runs on numpy)."""
    if isinstance(y, np.ndarray):
        moved = np.pad(y.reshape(6, 4).transpose(1, 0), ((0, 0), (1, 2)))[:, 1:7][::-1]
        total = moved.sum(1, keepdims=True) * np.float32(0.1)
        return (np.broadcast_to(total, (4, 6)) + base).astype(np.float32)
    moved = y.reshape(6, 4).permute(1, 0).pad((1, 2))[:, 1:7].flip(0)
    total = moved.sum(1, keepdim=True) * 0.1
    return total.expand(4, 6) + base


def test_long_chain_of_reductions_and_movement_ops(device: str) -> None:
    array = random_array((4, 6), seed=1)
    x = em.tensor(array, device=device)
    y, expected = x, array
    nodes_per_round = 10  # reshape, permute, pad, shrink, flip, sum, a constant, mul, expand, add
    for _ in range(10_000 // nodes_per_round):
        y, expected = _mixed_step(y, x), _mixed_step(expected, array)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_backward_through_a_long_chain(device: str) -> None:
    length = 2_500  # four nodes a step (sin, a constant, mul, add): 10,000 nodes
    array = random_array((8,), seed=2)
    x = em.tensor(array, device=device, requires_grad=True)
    y = x
    value, derivative = array.astype(np.float64), np.ones_like(array, dtype=np.float64)
    for _ in range(length):
        y = y + y.sin() * 0.002
        value, derivative = value + np.sin(value) * 0.002, derivative * (1 + np.cos(value) * 0.002)  # chain rule
    y.sum().backward()
    assert np.abs(derivative - 1).max() > 0.5  # the gradient is far from the identity's: the test can fail
    np.testing.assert_allclose(y.numpy(), value, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), derivative, rtol=1e-3, atol=1e-6)


def test_printing_a_deep_tensor(device: str) -> None:
    array = random_array((2, 3), seed=3)
    y, expected = em.tensor(array, device=device, requires_grad=True), array.astype(np.float64)
    for step in range(5_000):
        y, expected = y * 2.0 if step % 2 else y / 2.0, expected * 2 if step % 2 else expected / 2
    torch_text = repr(torch.tensor(expected.astype(np.float32), requires_grad=True) * 1)
    text = repr(y)
    assert text.split(", device=")[0].split(", grad_fn=")[0] == torch_text.split(", grad_fn=")[0]
    assert "grad_fn=<" in text
