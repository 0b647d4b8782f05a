"""Failures the fuzzer found, each kept as a test. An open one is xfail(strict=True) on the backends where it fails:
when it is fixed the test passes, the strict marker turns that into a failure, and the marker must go."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember as em
from ember.testing.reference import ReferenceTensor


def known_bug(request: pytest.FixtureRequest, device: str, backends: set[str], reason: str) -> None:
    """Mark this test as an expected failure on `backends` (strict: passing there fails the test)."""
    if device.split(":")[0] in backends:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def test_realize_a_constant_with_its_consumer(device: str, request: pytest.FixtureRequest) -> None:
    constant = em.full((2,), 1.5, device=device)
    negated = -constant
    em.realize(negated, constant)
    assert negated.tolist() == [-1.5, -1.5] and constant.tolist() == [1.5, 1.5]


def test_a_view_of_a_constant_realized_with_its_reduction(device: str, request: pytest.FixtureRequest) -> None:
    constant = em.full((1,), 2, dtype=em.uint64, device=device)
    view = constant.pad((0, 0)).permute((0,))
    smallest = view.min()
    em.realize(smallest, view)
    assert smallest.item() == 2 and view.tolist() == [2]


def test_a_constant_stored_as_a_half_type(device: str, request: pytest.FixtureRequest) -> None:
    assert em.full((1, 1), -2.5, dtype=em.bfloat16, device=device).tolist() == [[-2.5]]
    assert em.ones(3, dtype=em.bfloat16, device=device).tolist() == [1.0, 1.0, 1.0]
    assert em.ones(3, dtype=em.float16, device=device).tolist() == [1.0, 1.0, 1.0]


def test_negative_zero_keeps_its_sign_through_constant_folding(device: str, request: pytest.FixtureRequest) -> None:
    expected = (-ReferenceTensor(np.zeros(3, dtype=np.float32))).reciprocal().numpy()
    assert expected.tolist() == [-math.inf] * 3
    assert (-em.zeros(3, device=device)).reciprocal().tolist() == expected.tolist()
    assert (-em.arange(1, dtype=em.float32, device=device)).reciprocal().tolist() == [-math.inf]


def test_subtracting_a_negative_constant_compiles(device: str, request: pytest.FixtureRequest) -> None:
    assert (em.tensor([1.0], device=device) - -0.5).tolist() == [1.5]
    assert (em.tensor([3], device=device) - -2).tolist() == [5]


def _gradient(device: str, value: float, function) -> float:  # noqa: ANN001
    x = em.tensor(value, device=device, requires_grad=True)
    function(x).backward()
    return x.grad.item()


def test_tanh_and_sigmoid_gradients_at_zero(device: str) -> None:
    assert _gradient(device, 0.0, lambda x: x.tanh()) == pytest.approx(1.0)
    assert _gradient(device, 0.0, lambda x: x.sigmoid()) == pytest.approx(0.25)


def test_pow_gradient_at_base_one(device: str) -> None:
    assert _gradient(device, 1.0, lambda x: x**1.5) == pytest.approx(1.5)
    assert _gradient(device, 2.0, lambda x: x**1.5) == pytest.approx(1.5 * 2**0.5, rel=1e-5)


def test_division_by_a_zero_constant(device: str, request: pytest.FixtureRequest) -> None:
    values = em.tensor([0.0, 1.0, -1.0], device=device)
    result = (values / 0.0).numpy()
    assert np.isnan(result[0]) and result[1:].tolist() == [math.inf, -math.inf]
    assert math.isnan(em.tensor(0.5, device=device).var().item())


def test_zero_constant_divided_by_zero(device: str) -> None:
    # wgpu: Mesa folded 0.0 / x to 0 (the numerator is now hidden from its algebra)
    result = (0.0 / em.tensor([0.0, 1.0], device=device)).numpy()
    assert np.isnan(result[0]) and result[1] == 0.0


def test_abs_of_positive_zero_is_positive_zero(device: str, request: pytest.FixtureRequest) -> None:
    zero = em.tensor(0.0, device=device)
    assert zero.abs().reciprocal().item() == math.inf
    assert (zero + 0.0).abs().reciprocal().item() == math.inf


def test_math_on_a_float64_constant(device: str) -> None:
    """Found on wgpu (exp/trunc of a float64 constant rendered as exp(0.0lf), rejected by naga); fixed since."""
    assert em.full((), 0.0, dtype=em.float64, device=device).exp().item() == 1.0
    assert em.full((2,), 1.5, dtype=em.float64, device=device).trunc().tolist() == [1.0, 1.0]
    assert em.arange(1, dtype=em.float64, device=device).frac().tolist() == [0.0]


def test_concatenating_an_empty_int64_tensor(device: str) -> None:
    # wgpu: an empty int64 input was bound with 4 bytes where the shader expects 8 (buffers now hold 8 bytes or more)
    empty = em.tensor(np.zeros((1, 0), dtype=np.int64), device=device)
    assert em.tensor(np.ones((1, 2), dtype=np.int64), device=device).cat([empty], 1).tolist() == [[1, 1]]
    assert em.tensor(np.ones((1, 2), dtype=np.float32), device=device).cat([empty], 1).tolist() == [[1.0, 1.0]]


def test_all_and_amin_of_false_values(device: str) -> None:
    # c: gcc 12 -O3 -march=native SLP-vectorized the max select of !x over unsigned char with vpcmpeqb (0xFF, not 1);
    # a max over bools is now rendered acc | v
    for count in (2, 4, 8, 16):
        falses = em.tensor(np.zeros(count, dtype=bool), device=device)
        assert falses.all().item() is False and falses.amin().item() is False, count
    grid = em.tensor(np.zeros((2, 2, 1, 1, 1), dtype=bool), device=device)
    assert grid.amin((0, 1), keepdim=True).expand((2, 2, 1, 1, 1)).tolist() == grid.tolist()


def test_a_sum_of_negative_zeros_is_positive_zero(device: str) -> None:
    # torch's sums start from +0.0: a sum over a size-1 axis of -0.0 is +0.0 (it was folded to the -0.0 itself)
    zeros = -em.zeros((1, 3), device=device)
    stored = em.tensor(np.zeros((2, 1, 1), np.float32), device=device)  # (read from memory: wgpu, fuzz seed 20261614)
    pairs = -(stored + stored)
    for total in (zeros.sum(0), zeros.sum(), (-em.zeros((1, 1), device=device)).sum((0,)), pairs.sum((0,)),
                  (-em.zeros((3, 5), device=device)).sum(0), pairs.mean((0,))):
        assert all(math.copysign(1.0, value) > 0 for value in np.ravel(total.numpy())), total.numpy()
    kept = zeros.prod(0).numpy().tolist() + zeros.amax(0).numpy().tolist()  # products and maxima keep -0.0
    assert all(math.copysign(1.0, value) < 0 for value in kept), kept


def test_argmax_of_a_computed_float16_value(device: str) -> None:
    # half values are compared rounded: the fused kernel compared an unrounded float32 value with its stored
    # (rounded) maximum, matched nothing, and argmax returned 3 for three elements
    values = em.tensor(np.array([0.0, 1.0, 1.0], dtype=np.float16), device=device)
    centered = -(values - values.mean(0, keepdim=True)) + em.zeros(3, dtype=em.float16, device=device)
    assert centered.argmax(0).item() == 0
    tenths = em.tensor(np.array([0.1, 0.2, 0.3], dtype=np.float16), device=device) * 3
    assert (tenths == tenths.max()).tolist() == [False, False, True] and tenths.argmin(0).item() == 0


def test_sum_of_a_concatenation(device: str) -> None:
    # gcc 12 on c: loop if-conversion of the masked loads of a fused cat + sum gave 3.0 (one block of three)
    zeros = em.tensor(np.zeros((2, 3), dtype=np.float32), device=device)
    ones = em.tensor(np.ones((3, 3), dtype=np.float32), device=device)
    joined = zeros.cat([ones, zeros], 0)
    assert joined.sum().item() == 9.0 and (-(-joined)).sum((0, 1)).item() == 9.0
    assert joined.sum(1).tolist() == [0.0, 0.0, 3.0, 3.0, 3.0, 0.0, 0.0]


def test_a_float_through_an_integer_has_no_negative_zero(device: str) -> None:
    # (float)(int)x became trunc(x) in gcc (SSE4.1, -fno-trapping-math) and Mesa, keeping -0.0: 1 / it was -inf
    negative_zero = -em.tensor(np.zeros((1, 3), dtype=np.float32), device=device)
    through_int = negative_zero.to(em.int32)
    assert (1 / through_int).tolist() == [[math.inf] * 3]
    assert (1 / through_int.to(em.float32)).tolist() == [[math.inf] * 3]


def test_silu_gradient_at_infinity(device: str) -> None:
    """torch's formula gives inf * 0 = NaN there (sigmoid(x) * (1 + x * (1 - sigmoid(x)))); ember's composition
    gives the same since exp's gradient beyond its clamp is exp(x) itself (it was 0, a finite gradient)."""
    import torch

    x = em.tensor(np.array([math.inf], dtype=np.float32), device=device, requires_grad=True)
    x.silu().sum().backward()
    reference = torch.tensor([math.inf], requires_grad=True)
    torch.nn.functional.silu(reference).sum().backward()
    assert np.array_equal(x.grad.numpy(), reference.grad.numpy(), equal_nan=True), (x.grad.numpy(), reference.grad)


def test_math_functions_of_a_nan_the_compiler_can_see(device: str) -> None:
    """opencl (PoCL, LLVM 14, SLEEF) folded exp2(-(x + NaN)) and trunc of it to arbitrary numbers (1.6e37, 3.7e27,
    a new one each build): its compiler saw the NaN literal, now read through a volatile (fuzz seed 20240625)."""
    for dtype in (np.float32, np.float64):
        zero = em.tensor(np.array(0.0, dtype=dtype), device=device)
        for function in ("exp2", "exp", "log2", "log", "sin", "cos", "tanh", "trunc", "floor", "sqrt", "round"):
            value = getattr(-(zero + float("nan")), function)().item()
            assert math.isnan(value), (dtype, function, value)


def test_a_nan_computed_from_constants_is_not_folded_away(device: str) -> None:
    """A NaN the shader compiler could compute from constants was lost: wgpu (Mesa) folded `x * 0.0` to 0 with x a
    NaN from constants (relu of sqrt(-1) gave 0, fuzz seed 20261209), opencl (PoCL) folded trunc(0 / 0) (0 % 0.0
    gave 0, fuzz seed 20261281). torch gives NaN for each."""
    import torch

    zero, minus_one = em.full((), 0.0, device=device), em.full((), -1.0, device=device)
    empty_sum = em.tensor(np.zeros(0, np.float32), device=device).sum()
    results = {
        "0 % 0.0": (zero % 0.0, torch.zeros(()) % 0.0),
        "fmod(0, 0.0)": (zero.fmod(0.0), torch.zeros(()).fmod(0.0)),
        "0 // 0.0": (zero // 0.0, torch.zeros(()) // 0.0),
        "relu(sqrt(-1))": (minus_one.sqrt().relu(), torch.full((), -1.0).sqrt().relu()),
        "relu(sqrt(sum([]) - 1))": ((empty_sum - 1.0).sqrt().relu(), (torch.zeros(0).sum() - 1.0).sqrt().relu()),
        "sqrt(-1) * 0": (minus_one.sqrt() * 0.0, torch.full((), -1.0).sqrt() * 0.0),
        "exp2(0 / 0)": ((zero / 0.0).exp2(), (torch.zeros(()) / 0.0).exp2()),
    }
    for name, (value, expected) in results.items():
        assert math.isnan(value.item()) and math.isnan(expected.item()), (name, value.item(), expected.item())


@pytest.mark.xfail(strict=True, reason="open: float fmod is composed as a - trunc(a / b) * b, which is inexact when "
                   "a / b rounds up to an integer: fmod(12.5, 0.1) gives -1.9e-7 on c (an FMA) and 0 elsewhere, "
                   "torch 0.0999998")
def test_fmod_where_the_quotient_rounds_up(device: str) -> None:
    import torch

    values = em.tensor(np.array([12.5], dtype=np.float32), device=device).fmod(0.1).numpy()
    expected = torch.fmod(torch.tensor([12.5]), 0.1).numpy()
    assert np.allclose(values, expected, rtol=0, atol=1e-6), (values, expected)
