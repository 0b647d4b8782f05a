"""Inverse trigonometric, hyperbolic and special functions against PyTorch: values and gradients on special values
(inf, nan, +-0, huge, tiny, domain edges) and random ones, float32/float64, halves, integer promotion and errors.

Where torch's float32 result loses digits (cancellation, or an intermediate that overflows) the reference is torch in
float64 rounded to float32; the places where torch's own float64 gradient formula overflows or is NaN although the
derivative exists are left out of the gradient comparison and named where they are.
"""

import math

import numpy as np
import pytest
import scipy.special
import torch

import ember as em
from tests.helpers import TORCH_DTYPES, assert_close_batch

BATCH = 24  # results compared by one concatenation kernel
RANDOM = np.random.default_rng(0)
SPECIAL = np.array([-np.inf, -1e30, -3e8, -100.0, -20.5, -3.5, -2.5, -1.5, -1.0, -0.5, -1e-8, -1e-30, -0.0, 0.0,
                    1e-30, 1e-8, 0.5, 1.0, 1.5, 2.5, 3.5, 20.5, 88.0, 100.0, 3e8, 1e30, np.inf, np.nan])
GENERAL = np.concatenate([SPECIAL, RANDOM.uniform(-6, 6, 200), 10 ** RANDOM.uniform(-20, 20, 40)])
UNIT = np.concatenate([[-1.5, -1.0, -1 + 1e-7, -0.99, -0.5, -1e-20, -0.0, 0.0, 1e-20, 1e-7, 0.25, 0.5, 0.99,
                        1 - 1e-7, 1.0, 1.5, np.nan], RANDOM.uniform(-1, 1, 200)])
PROBABILITY = np.concatenate([[-0.5, 0.0, 1e-30, 1e-6, 0.1, 0.2499, 0.25, 0.5 - 1e-7, 0.5, 0.5 + 1e-7, 0.9,
                               1 - 1e-7, 1.0, 1.5, np.nan], RANDOM.uniform(0, 1, 100)])
# lgamma/digamma: poles, zeros of lgamma (1, 2, -2.4570, ...), the reflection and the switch to asymptotic series
GAMMA = np.concatenate([[-np.inf, -1e30, -100.5, -4.99, -3.0, -2.4570, -2.0, -1.5, -1.0, -0.5, -1e-8, -0.0, 0.0,
                         1e-30, 1e-8, 0.5, 1.0, 1.4616, 1.5, 2.0, 2.5, 9.99, 10.0, 10.01, 100.0, 1e10, 1e30, np.inf,
                         np.nan], RANDOM.uniform(-8, 12, 200)])

# name: (ember function, torch function, values)
FUNCTIONS = {
    "asin": (lambda x: x.asin(), torch.asin, UNIT),
    "acos": (lambda x: x.acos(), torch.acos, UNIT),
    "atan": (lambda x: x.atan(), torch.atan, GENERAL),
    "sinh": (lambda x: x.sinh(), torch.sinh, GENERAL),
    "cosh": (lambda x: x.cosh(), torch.cosh, GENERAL),
    "asinh": (lambda x: x.asinh(), torch.asinh, GENERAL),
    "acosh": (lambda x: x.acosh(), torch.acosh, np.abs(GENERAL)),
    "atanh": (lambda x: x.atanh(), torch.atanh, UNIT),
    "arcsin": (lambda x: x.arcsin(), torch.arcsin, UNIT),
    "arccos": (lambda x: x.arccos(), torch.arccos, UNIT),
    "arctan": (lambda x: x.arctan(), torch.arctan, GENERAL),
    "arcsinh": (lambda x: x.arcsinh(), torch.arcsinh, GENERAL),
    "arccosh": (lambda x: x.arccosh(), torch.arccosh, GENERAL),
    "arctanh": (lambda x: x.arctanh(), torch.arctanh, UNIT),
    "sinc": (lambda x: x.sinc(), torch.sinc, GENERAL),
    "deg2rad": (lambda x: x.deg2rad(), torch.deg2rad, GENERAL),
    "rad2deg": (lambda x: x.rad2deg(), torch.rad2deg, GENERAL),
    "erfinv": (lambda x: x.erfinv(), torch.erfinv, UNIT),
    "logit": (lambda x: x.logit(), torch.logit, PROBABILITY),
    # (torch's eps gradient at NaN is 0, ember's NaN)
    "logit_eps": (lambda x: x.logit(eps=1e-3), lambda x: torch.logit(x, eps=1e-3), PROBABILITY[~np.isnan(PROBABILITY)]),
    "lgamma": (lambda x: x.lgamma(), torch.lgamma, GAMMA),
    "digamma": (lambda x: x.digamma(), torch.digamma, GAMMA),
    "i0": (lambda x: x.i0(), torch.i0, GENERAL[np.abs(GENERAL) < 80]),  # torch's i0(+-inf) is NaN, see below
}
# relative tolerance of the values against torch in float64 (rounded to the dtype): float32, float64
VALUE_RTOL = {"erfinv": (2e-6, 1e-14), "lgamma": (3e-6, 1e-13), "digamma": (3e-6, 1e-12), "i0": (1e-6, 1e-14),
              "logit": (2e-6, 1e-15)}
# (torch's float64 trigamma is ~5e-10 accurate: scipy is the reference in test_digamma_gradient_near_poles_...;
# asin', acos', atanh' and erfinv' near +-1 grow like 1 / (1 - x^2): the input's rounding dominates there)
GRADIENT_RTOL = {"lgamma": (3e-6, 1e-12), "digamma": (1e-5, 1e-9), "erfinv": (3e-6, 1e-11),
                 "asin": (1e-6, 1e-9), "acos": (1e-6, 1e-9), "arcsin": (1e-6, 1e-9), "arccos": (1e-6, 1e-9),
                 "atanh": (1e-6, 1e-9), "arctanh": (1e-6, 1e-9)}


def _gradient_points(name: str, values: np.ndarray) -> np.ndarray:
    """Where torch's float64 gradient formula is the derivative: it overflows (x^2 + 1 for |x| > 1e154, atanh's
    1 / (1 - x^2) far outside), its trigamma is finite garbage at the poles of digamma (ember: NaN), and its sinc'
    cancels to 0 near 0 (ember keeps -pi^2 x / 3)."""
    keep = np.ones(values.shape, bool)
    if name == "digamma":
        keep &= ~((values <= 0) & (values == np.round(values)))
    if name == "sinc":
        keep &= ~((np.abs(values) < 0.5) & (values != 0))
    return keep


def _cases(names: list[str], dtype: em.DType, device: str, gradients: bool) -> list[tuple]:
    cases = []
    for name in names:
        ember_function, torch_function, values = FUNCTIONS[name]
        data = values.astype(dtype.numpy)
        x = em.tensor(data, device=device, requires_grad=True)
        truth_input = torch.tensor(data.astype(np.float64), requires_grad=True)
        truth = torch_function(truth_input)
        result = ember_function(x)
        value_rtol = VALUE_RTOL.get(name, (2e-6, 1e-15))[dtype is em.float64]
        atol = 1e-6 if dtype is em.float32 else 1e-14
        cases.append((f"{name} {dtype.name}", result, truth.detach().to(TORCH_DTYPES[dtype]), atol, value_rtol))
        # and torch's own float32 result within torch's float32 accuracy
        cases.append((f"{name} {dtype.name} vs torch", result, torch_function(torch.tensor(data)), 1e-5, 2e-5))
        if gradients:
            keep = _gradient_points(name, data)
            result.sum().backward()
            truth.sum().backward()
            gradient_rtol = GRADIENT_RTOL.get(name, (2e-6, 1e-14))[dtype is em.float64]
            cases.append((f"{name}' {dtype.name}", em.tensor(x.grad.numpy()[keep], device=device),
                          truth_input.grad[keep].to(TORCH_DTYPES[dtype]), atol, gradient_rtol))
    return cases


@pytest.mark.parametrize("dtype", [em.float32, em.float64])
def test_values_and_gradients_against_torch(dtype: em.DType, device: str) -> None:
    cases = _cases(list(FUNCTIONS), dtype, device, gradients=True)
    for start in range(0, len(cases), BATCH):  # one concatenation binds each result: wgpu binds 32 buffers at most
        assert_close_batch(cases[start:start + BATCH])


@pytest.mark.parametrize("dtype", [em.float16, em.bfloat16])
def test_half_types_are_computed_in_float32_and_rounded_once(dtype: em.DType, device: str) -> None:
    names = ["asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "sinc", "erfinv", "logit", "lgamma",
             "digamma", "deg2rad"]
    cases = []
    for name in names:
        ember_function, torch_function, values = FUNCTIONS[name]
        torch_input = torch.tensor(values[np.abs(values) < 1e4], dtype=TORCH_DTYPES[dtype])
        x = em.tensor(torch_input.float().numpy(), device=device).cast(dtype)
        expected = torch_function(torch_input.float()).to(TORCH_DTYPES[dtype])
        rtol = 1e-2 if dtype is em.bfloat16 else 1e-3
        cases.append((f"{name} {dtype.name}", ember_function(x), expected, 1e-3, rtol))
    assert_close_batch(cases)


def test_accuracy_where_a_formula_would_cancel_or_overflow(device: str) -> None:
    """asinh for large negative x, atanh and asinh near 0, acosh near 1, sinh/cosh beyond e^x's overflow, logit near
    1/2 (torch's float32 loses digits there: the reference is float64), lgamma near its zeros."""
    data = np.array([-1e30, -3e20, -1e-30, 1e-30, 1e-7, 0.3, 1 + 2**-23, 1.5, 88.5, 89.5, -89.5], np.float32)
    x, truth = em.tensor(data, device=device), torch.tensor(data, dtype=torch.float64)
    probabilities = np.array([0.5 - 1e-7, 0.5 + 2e-7, 0.4999, 0.75, 1 - 1e-7], np.float32)
    p = em.tensor(probabilities, device=device)
    near_zeros = np.array([0.9999, 1.0001, 1.9999, 2.0001, -2.4570, -2.4571], np.float64)
    z = em.tensor(near_zeros, device=device)

    def rounded(value: torch.Tensor) -> torch.Tensor:
        return value.float()

    assert_close_batch([
        ("asinh", x.asinh(), rounded(truth.asinh()), 0, 2e-7),
        ("atanh", x.clamp(-0.5, 0.5).atanh(), rounded(truth.clamp(-0.5, 0.5).atanh()), 0, 2e-7),
        ("acosh", x.abs().acosh(), rounded(truth.abs().acosh()), 0, 4e-7),
        ("sinh", x.sinh(), rounded(truth.sinh()), 0, 4e-7),
        ("cosh", x.cosh(), rounded(truth.cosh()), 0, 4e-7),
        ("logit", p.logit(), torch.tensor(probabilities, dtype=torch.float64).logit().float(), 0, 3e-7),
        ("lgamma", z.lgamma(), torch.tensor(near_zeros).lgamma(), 0, 1e-11),
    ])


def test_sinc_gradient_near_zero(device: str) -> None:
    """(cos(p) p - sin(p)) / (p x) with p = pi x, in 50 digits (mpmath) as the reference."""
    import mpmath

    data = np.array([1e-13, -3e-8, 1e-8, 6e-8, -0.00125, 3.3e-5, 0.01, 0.3, -0.49, 0.0])
    with mpmath.workdps(50):
        exact = [float((mpmath.cos(mpmath.pi * value) * mpmath.pi * value - mpmath.sin(mpmath.pi * value))
                       / (mpmath.pi * value * value)) if value else 0.0 for value in map(mpmath.mpf, data)]
    cases = []
    for dtype, rtol in ((em.float64, 1e-14), (em.float32, 1e-6)):
        x = em.tensor(data.astype(dtype.numpy), device=device, requires_grad=True)
        x.sinc().sum().backward()
        cases.append((f"sinc' {dtype.name}", x.grad, torch.tensor(exact, dtype=TORCH_DTYPES[dtype]), 1e-30, rtol))
    assert_close_batch(cases)


def test_i0_beyond_torch_s_float32_overflow() -> None:
    """torch's float32 i0 overflows from x ~ 89 and gives NaN at +-inf; ember follows scipy's float64 value (inf
    only where it exceeds float32), and the gradient is i1."""
    data = np.array([-91.0, -89.5, -50.0, -12.5, 12.5, 30.0, 84.9, 85.1, 89.5, 91.8, 92.0, np.inf, -np.inf],
                    np.float32)
    x = em.tensor(data, device="c", requires_grad=True)
    result = x.i0()
    result.sum().backward()
    wide = data.astype(np.float64)
    with np.errstate(over="ignore"):
        expected, derivative = scipy.special.i0(wide).astype(np.float32), scipy.special.i1(wide).astype(np.float32)
    infinite = np.isinf(wide)  # scipy's i0 and i1 are NaN there
    expected[infinite], derivative[infinite] = np.inf, wide[infinite]
    np.testing.assert_allclose(result.numpy(), expected, rtol=4e-6)
    np.testing.assert_allclose(x.grad.numpy(), derivative, rtol=4e-6)


def test_digamma_gradient_near_poles_and_far_out() -> None:
    """trigamma by the reflection (scipy's polygamma as the reference; torch's float32 trigamma is 8% off next to
    the pole at -1)."""
    data = np.array([-1 + 2**-23, -0.5, -1.4e5 - 0.25, -7.75, 0.001, 3.0, 15.0, 1e6])
    x = em.tensor(data, device="c", requires_grad=True)
    x.digamma().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), scipy.special.polygamma(1, data), rtol=1e-10)


def test_integer_inputs_give_the_default_float_like_torch(device: str) -> None:
    integers = np.array([-3, -1, 0, 1, 2, 7])
    cases = []
    for dtype in (em.int32, em.int64, em.uint8, em.bool):
        data = (integers > 0) if dtype is em.bool else np.abs(integers).astype(dtype.numpy) if dtype is em.uint8 \
            else integers.astype(dtype.numpy)
        x, tx = em.tensor(data, device=device), torch.tensor(data)
        for name in ("atan", "asinh", "sinh", "cosh", "sinc", "deg2rad", "rad2deg", "lgamma", "digamma", "i0",
                     "erfinv", "logit", "asin", "acosh", "atanh"):
            cases.append((f"{name} {dtype.name}", getattr(x, name)(), getattr(torch, name)(tx), 1e-5, 2e-6))
    assert_close_batch(cases)


def test_signed_zeros_and_odd_symmetry(device: str) -> None:
    data = np.array([-0.0, 0.0], np.float32)
    x = em.tensor(data, device=device)
    for name in ("asin", "atan", "sinh", "asinh", "atanh", "erfinv"):
        assert list(np.signbit(getattr(x, name)().numpy())) == [True, False], name
    data = RANDOM.uniform(-5, 5, 64).astype(np.float32)
    x = em.tensor(data, device=device)
    for name in ("atan", "sinh", "asinh"):
        np.testing.assert_array_equal(getattr(-x, name)().numpy(), -getattr(x, name)().numpy())


def test_logit_eps_must_be_a_probability_margin() -> None:
    with pytest.raises(ValueError, match=r"logit: eps must be in \[0, 0.5\]"):
        em.tensor([0.5]).logit(eps=0.7)
    assert math.isclose(em.tensor([0.0]).logit(eps=0.25).item(), math.log(1 / 3), rel_tol=1e-6)
