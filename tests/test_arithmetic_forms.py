"""torch's arithmetic forms against torch: addcmul, addcdiv, addmv, addr, baddbmm, addbmm, addmm's beta = 0, vdot,
positive, rsub, threshold and the shrink activations, gcd, lcm, ldexp, frexp, isin, isreal (values, gradients,
dtypes, errors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember as em
import ember.nn.functional as EF
from tests.helpers import BatchedChecks, assert_close, pair, random_array, require_dtypes


def _gradients(check: BatchedChecks, label: str, result: em.Tensor, expected: torch.Tensor,
               pairs: list[tuple[em.Tensor, torch.Tensor]], device: str) -> None:
    weights = random_array(tuple(expected.shape), seed=11)
    (result * em.tensor(weights, device=device)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    for index, (ours, theirs) in enumerate(pairs):
        check(ours.grad, theirs.grad, f"{label} gradient {index}")


PRODUCT_CASES = {
    "addcmul": ((2, 3), (1, 3), (2, 1), {"value": 0.5}),
    "addcdiv": ((2, 3), (2, 3), (3,), {"value": -2.0}),
    "addmv": ((3,), (3, 4), (4,), {"beta": 0.5, "alpha": 2.0}),
    "addr": ((3, 4), (3,), (4,), {"beta": 2.0, "alpha": -1.0}),
    "baddbmm": ((2, 3, 4), (2, 3, 5), (2, 5, 4), {"beta": 0.5, "alpha": 1.5}),
    "addbmm": ((3, 4), (2, 3, 5), (2, 5, 4), {"alpha": 0.25}),
    "addmm": ((1, 4), (3, 5), (5, 4), {"beta": 2.0}),
}


@pytest.mark.parametrize("name", list(PRODUCT_CASES))
def test_fused_arithmetic_matches_torch_with_gradients(device: str, name: str) -> None:
    *shapes, keywords = PRODUCT_CASES[name]
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    low = {2: 0.5} if name == "addcdiv" else {}
    pairs = [pair(random_array(shape, seed=index, **({"low": 0.5} if index == 2 and low else {})), device,
                  requires_grad=True) for index, shape in enumerate(shapes)]
    ours = [value for value, _ in pairs]
    theirs = [value for _, value in pairs]
    result, expected = getattr(ours[0], name)(*ours[1:], **keywords), getattr(theirs[0], name)(*theirs[1:], **keywords)
    check(result, expected, name)
    check(getattr(em, name)(*ours, **keywords), getattr(torch, name)(*theirs, **keywords), f"ember.{name}")
    _gradients(check, name, result, expected, pairs, device)
    check.verify()


def test_beta_zero_ignores_nan_in_input_like_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    nan = np.full((3, 4), np.nan, dtype=np.float32)
    for name, operands in (("addmm", [(3, 5), (5, 4)]), ("addr", [(3,), (4,)]), ("addbmm", [(2, 3, 5), (2, 5, 4)])):
        x, tx = pair(nan, device)
        others = [pair(random_array(shape, seed=index), device) for index, shape in enumerate(operands)]
        check(getattr(x, name)(*(o for o, _ in others), beta=0), getattr(tx, name)(*(t for _, t in others), beta=0),
              name)
    check.verify()


def test_fused_arithmetic_dtypes_match_torch(device: str) -> None:
    check = BatchedChecks()
    i, ti = pair(np.array([1, 2, 3], dtype=np.int64), device)
    f, tf = pair(np.array([0.5, 1.5, 2.5], dtype=np.float32), device)
    check(i.addcmul(i, i, value=2), ti.addcmul(ti, ti, value=2), "int addcmul")
    check(i.addcmul(i, f), ti.addcmul(ti, tf), "int + int * float")
    check(i.addcdiv(f, i), ti.addcdiv(tf, ti), "addcdiv promotes")
    check(em.rsub(i, 5, alpha=2), torch.rsub(ti, 5, alpha=2), "rsub number")
    check(em.rsub(f, i), torch.rsub(tf, ti), "rsub tensor")
    check(em.positive(i), torch.positive(ti), "positive")
    check(f.vdot(f), tf.vdot(tf), "vdot")
    check(em.vdot(i, i), torch.vdot(ti, ti), "int vdot")
    check.verify()


@pytest.mark.parametrize("call", [
    lambda m, d: m.ones(2, device=d).addcdiv(m.ones(2, dtype=m.int64, device=d), m.ones(2, dtype=m.int64, device=d)),
    lambda m, d: m.positive(m.ones(2, dtype=m.bool, device=d)),
    lambda m, d: m.vdot(m.ones(2, device=d), m.ones(2, dtype=m.float64, device=d)),
    lambda m, d: m.vdot(m.ones(2, device=d), m.ones(3, device=d)),
    lambda m, d: m.addmv(m.ones(3, device=d), m.ones(3, 2, device=d), m.ones(3, device=d)),
    lambda m, d: m.addmm(m.ones(1, 2, 2, device=d), m.ones(2, 2, device=d), m.ones(2, 2, device=d)),
    lambda m, d: m.baddbmm(m.ones(2, 2, 2, device=d), m.ones(2, 2, 3, device=d), m.ones(3, 2, 2, device=d)),
    lambda m, d: m.addr(m.ones(2, 2, device=d), m.ones(2, 2, device=d), m.ones(2, device=d)),
    lambda m, d: m.addcmul(m.ones(2, device=d), m.ones(3, device=d), m.ones(2, device=d)),
], ids=["addcdiv integers", "positive bool", "vdot dtypes", "vdot sizes", "addmv sizes", "addmm broadcast",
        "baddbmm sizes", "addr rank", "addcmul shapes"])
def test_fused_arithmetic_errors_are_runtime_errors_like_torch(device: str, call) -> None:
    with pytest.raises(RuntimeError):
        call(torch, "cpu")
    with pytest.raises(RuntimeError):
        call(em, device)


def test_threshold_and_shrinks_match_torch(device: str) -> None:
    data = np.array([-1.0, -0.5, -0.2, 0.0, 0.2, 0.5, 1.0, 3.0, np.nan], dtype=np.float32)
    check = BatchedChecks(atol=1e-6, rtol=1e-5)
    calls = {
        "threshold": (lambda F, x: F.threshold(x, 0.5, -3.0)),
        "torch.threshold": (lambda F, x: (em if F is EF else torch).threshold(x, 0.2, 7.0)),
        "hardshrink": (lambda F, x: F.hardshrink(x, 0.5)),
        "Tensor.hardshrink": (lambda F, x: x.hardshrink()),
        "softshrink": (lambda F, x: F.softshrink(x, 0.5)),
        "tanhshrink": (lambda F, x: F.tanhshrink(x)),
    }
    for label, call in calls.items():
        x, tx = pair(data, device, requires_grad=True)
        result, expected = call(EF, x), call(TF, tx)
        check(result, expected, label)
        finite = em.tensor(np.isfinite(data).astype(np.float32), device=device)
        (result.nan_to_num() * finite).sum().backward()
        (expected.nan_to_num() * torch.tensor(np.isfinite(data).astype(np.float32))).sum().backward()
        check(x.grad.nan_to_num(), tx.grad.nan_to_num(), f"{label} gradient")
    i, ti = pair(np.array([1, 2, 3]), device)
    check(EF.threshold(i, 1, 5), TF.threshold(ti, 1, 5), "int threshold")
    check(em.threshold(i, 1.5, 5), torch.threshold(ti, 1.5, 5), "int threshold, float bound")
    check(EF.tanhshrink(i), TF.tanhshrink(ti), "int tanhshrink")
    check.verify()
    for call in (lambda m, F: F.hardshrink(m.tensor([1, 2])), lambda m, F: F.softshrink(m.tensor([1.0]), -1.0),
                 lambda m, F: m.threshold(m.tensor([True]), 0, 0)):
        with pytest.raises(RuntimeError):
            call(torch, TF)
        with pytest.raises(RuntimeError):
            call(em, EF)


@pytest.mark.parametrize("numpy_dtype", [np.int64, np.int32, np.int16, np.uint8])
def test_gcd_and_lcm_match_torch(device: str, numpy_dtype: type) -> None:
    require_dtypes(device, em.tensor(np.zeros(1, numpy_dtype)).dtype)
    generator = np.random.default_rng(0)
    high = {np.uint8: 255, np.int16: 30000}.get(numpy_dtype, 10**6)
    low = 0 if numpy_dtype is np.uint8 else -high
    a = generator.integers(low, high, 200).astype(numpy_dtype)
    b = generator.integers(low, high, 200).astype(numpy_dtype)
    a[:4], b[:4] = [0, 0, 12, 144], [0, 7, 0, 89]  # zeros, and consecutive Fibonacci numbers (Euclid's worst)
    if numpy_dtype in (np.int64, np.int32):
        a[4], b[4] = 1134903170, 1836311903
    x, tx = pair(a, device)
    y, ty = pair(b, device)
    check = BatchedChecks()
    check(x.gcd(y), tx.gcd(ty), "gcd")
    check(em.gcd(x, y), torch.gcd(tx, ty), "ember.gcd")
    if numpy_dtype is not np.int64:  # products of two int32 values overflow int32 in both
        small_x, small_tx = pair((a % 100).astype(numpy_dtype), device)
        check(small_x.lcm(y % 50), small_tx.lcm(ty % 50), "lcm")
    else:
        check(x.lcm(y % 1000), tx.lcm(ty % 1000), "lcm")
    check.verify()


def test_gcd_errors_like_torch(device: str) -> None:
    for call in (lambda m: m.gcd(m.tensor([1.0]), m.tensor([2.0])),
                 lambda m: m.lcm(m.tensor([True]), m.tensor([True]))):
        with pytest.raises(RuntimeError):
            call(torch)
        with pytest.raises(RuntimeError):
            call(em)


def test_ldexp_matches_torch(device: str) -> None:
    check = BatchedChecks(atol=0, rtol=1e-6)
    x, tx = pair(random_array((3, 4)), device, requires_grad=True)
    # non-negative integer exponents: torch's gradient for a negative one is 0 (it computes 2 ** e in integers),
    # ember's is 2 ** e
    e, te = pair(random_array((3, 4), np.int64, low=0.0, high=2.0), device)
    result, expected = x.ldexp(e), tx.ldexp(te)
    check(result, expected, "ldexp")
    _gradients(check, "ldexp", result, expected, [(x, tx)], device)
    i, ti = pair(np.array([1, 2, 3]), device)
    check(em.ldexp(i, i), torch.ldexp(ti, ti), "int ldexp")
    f, tf = pair(random_array((4,)), device, requires_grad=True)
    result, expected = em.ldexp(i[:1].float(), f), torch.ldexp(ti[:1].float(), tf)
    check(result, expected, "float exponent")
    _gradients(check, "float exponent", result, expected, [(f, tf)], device)
    check.verify()


@pytest.mark.parametrize("numpy_dtype", [np.float32, np.float64, np.float16])
def test_frexp_matches_torch(device: str, numpy_dtype: type) -> None:
    dtype = em.tensor(np.zeros(1, numpy_dtype)).dtype
    require_dtypes(device, dtype, em.int64 if numpy_dtype is np.float64 else em.int32)
    info = np.finfo(numpy_dtype)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, float(info.tiny), float(info.tiny) / 8, float(info.max), -3.5, 1.0]
    data = np.concatenate([np.array(special, numpy_dtype), random_array((20,), numpy_dtype, -1000, 1000)])
    x, tx = pair(data, device, requires_grad=True)
    mantissa, exponent = x.frexp()
    expected_mantissa, expected_exponent = tx.frexp()
    check = BatchedChecks()
    check(mantissa, expected_mantissa, "mantissa")
    check(exponent, expected_exponent, "exponent")
    check(list(em.frexp(x)), list(torch.frexp(tx)), "ember.frexp")
    # the gradient is grad / 2 ** exponent; torch computes 2 ** exponent in float32 (from the int32 exponent), which
    # overflows to inf or 0 beyond +-126, where ember's exact powers of two do not: those elements are left out
    usable = np.isfinite(data) & (np.abs(expected_exponent.numpy()) < 126)
    (mantissa * em.tensor(usable.astype(numpy_dtype), device=device)).nan_to_num().sum().backward()
    (expected_mantissa * torch.tensor(usable.astype(numpy_dtype))).nan_to_num().sum().backward()
    check.verify()
    assert_close(x.grad.numpy()[usable], tx.grad.numpy()[usable], atol=0, rtol=0)  # torch's others are 0 / 0
    with pytest.raises(RuntimeError):
        torch.frexp(torch.tensor([1]))
    with pytest.raises(RuntimeError):
        em.frexp(em.tensor([1], device=device))


def test_isin_and_isreal_match_torch(device: str) -> None:
    check = BatchedChecks()
    x, tx = pair(np.array([[1.0, 2.0, np.nan], [5.0, 2.0, -1.0]], dtype=np.float32), device)
    t, tt = pair(np.array([2, 5, 7]), device)
    check(em.isin(x, t), torch.isin(tx, tt), "isin")
    check(em.isin(x, t, invert=True), torch.isin(tx, tt, invert=True), "invert")
    check(em.isin(t, 5), torch.isin(tt, 5), "number test element")
    check(em.isin(2, t), torch.isin(2, tt), "number element")
    check(em.isin(x, x), torch.isin(tx, tx), "NaN is in nothing")
    check(x.isreal(), tx.isreal(), "isreal")
    check(em.isreal(t), torch.isreal(tt), "ember.isreal")
    check.verify()
    with pytest.raises(TypeError):
        torch.isin(1, 2)
    with pytest.raises(TypeError):
        em.isin(1, 2)
