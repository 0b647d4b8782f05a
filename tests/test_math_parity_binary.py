"""Two-operand math (atan2, copysign, logaddexp, hypot, xlogy, ...), closeness, interpolation and the NaN-aware and
scan reductions against PyTorch: values, gradients, promotion, broadcasting and errors."""

import itertools

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import TORCH_DTYPES, assert_close_batch

SPECIAL = [-np.inf, -1e30, -100.0, -3.0, -1.0, -0.5, -1e-30, -0.0, 0.0, 1e-30, 1e-8, 0.5, 1.0, 2.0, 50.0, 1e30,
           np.inf, np.nan]
GRID = np.array(list(itertools.product(SPECIAL, SPECIAL)) + list(np.random.default_rng(1).uniform(-5, 5, (200, 2))))

BINARY = {
    "atan2": (lambda a, b: a.atan2(b), torch.atan2),
    "arctan2": (lambda a, b: a.arctan2(b), torch.arctan2),
    "copysign": (lambda a, b: a.copysign(b), torch.copysign),
    "logaddexp": (lambda a, b: a.logaddexp(b), torch.logaddexp),
    "logaddexp2": (lambda a, b: a.logaddexp2(b), torch.logaddexp2),
    "hypot": (lambda a, b: a.hypot(b), torch.hypot),
    "xlogy": (lambda a, b: a.xlogy(b), torch.xlogy),
    "fmax": (lambda a, b: a.fmax(b), torch.fmax),
    "fmin": (lambda a, b: a.fmin(b), torch.fmin),
    "heaviside": (lambda a, b: a.heaviside(b), torch.heaviside),
}


def _torch_formula_holds(name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where torch's gradient formula is the derivative. It is not where x^2 + y^2 overflows or underflows (atan2,
    hypot: ember's gradient is the derivative there), at infinities of atan2/hypot/copysign (torch: inf / inf = NaN;
    ember: the limit), or at (0, +inf) for xlogy (torch: d/dx = log(inf) = inf; ember: 0)."""
    keep = np.ones(a.shape, bool)
    if name in ("atan2", "arctan2", "hypot"):
        for value in (a, b):
            keep &= (np.abs(value) < 1e15) & ((np.abs(value) > 1e-15) | (value == 0))
    if name in ("atan2", "arctan2", "hypot", "copysign"):
        keep &= ~np.isinf(a) & ~np.isinf(b)
    if name == "xlogy":
        keep &= ~((a == 0) & (b == np.inf))
    return keep


@pytest.mark.parametrize("dtype", [em.float32, em.float64])
def test_binary_values_and_gradients_against_torch(dtype: em.DType, device: str) -> None:
    data = GRID.astype(dtype.numpy)
    atol, rtol = (1e-6, 3e-6) if dtype is em.float32 else (1e-14, 1e-14)
    cases = []
    for name, (ember_function, torch_function) in BINARY.items():
        a, b = (em.tensor(data[:, i], device=device, requires_grad=True) for i in range(2))
        ta, tb = (torch.tensor(data[:, i].astype(np.float64), requires_grad=True) for i in range(2))
        result, truth = ember_function(a, b), torch_function(ta, tb)
        cases.append((name, result, truth.detach().to(TORCH_DTYPES[dtype]), atol, rtol))
        cases.append((f"{name} vs torch {dtype.name}", result, torch_function(*map(torch.tensor, data.T)), 1e-5, 1e-5))
        if name == "heaviside":
            continue
        result.sum().backward()
        truth.sum().backward()
        keep = _torch_formula_holds(name, data[:, 0], data[:, 1])
        for label, grad, torch_grad in (("a", a.grad, ta.grad), ("b", b.grad, tb.grad)):
            expected = torch.zeros(len(data), dtype=torch.float64) if torch_grad is None else torch_grad
            grad = np.zeros(len(data), dtype.numpy) if grad is None else grad.numpy()  # copysign: none for b
            cases.append((f"{name}' {label}", em.tensor(grad[keep], device=device),
                          expected[keep].to(TORCH_DTYPES[dtype]), atol, rtol))
    for start in range(0, len(cases), 24):  # one concatenation binds each result: wgpu binds 32 buffers at most
        assert_close_batch(cases[start:start + 24])


def test_edges_without_overflow_or_cancellation(device: str) -> None:
    a = em.tensor([np.inf, -np.inf, np.inf, 2e38, 1e-30, 3e-39, 1e30, -0.0, -0.0, 0.0, 0.0, 88.0], device=device)
    b = em.tensor([np.inf, -np.inf, -np.inf, 2e38, 1e-30, 4e-39, -1e30, -0.0, 0.0, -0.0, 0.0, 89.0], device=device)
    ta, tb = torch.tensor(a.numpy()), torch.tensor(b.numpy())
    wide_a, wide_b = ta.double(), tb.double()
    assert_close_batch([
        ("logaddexp", a.logaddexp(b), torch.logaddexp(ta, tb), 0, 1e-7),  # inf, -inf, inf and no overflow at 88
        ("logaddexp2", a.logaddexp2(b), torch.logaddexp2(ta, tb), 0, 1e-7),
        ("hypot", a.hypot(b), torch.hypot(wide_a, wide_b).float(), 0, 1e-7),  # 2.8e38, 1.4e-30, denormals
        ("atan2", a.atan2(b), torch.atan2(ta, tb), 0, 1e-7),  # signed zeros and infinities: C's values
        ("copysign", a.copysign(b), torch.copysign(ta, tb), 0, 0),
    ])
    assert list(np.signbit(a.atan2(b).numpy()[7:11])) == list(np.signbit(torch.atan2(ta, tb).numpy()[7:11]))


def test_promotion_broadcasting_and_python_scalars(device: str) -> None:
    rng = np.random.default_rng(2)
    x32, y64 = rng.uniform(0.5, 3, (3, 1)).astype(np.float32), rng.uniform(0.5, 3, (4,))
    integers = np.array([[1, -2, 3, 0]])
    x, y, n = (em.tensor(data, device=device) for data in (x32, y64, integers))
    tx, ty, tn = (torch.tensor(data) for data in (x32, y64, integers))
    half = em.tensor(x32, device=device).cast(em.float16)
    cases = [
        ("atan2 broadcast float64", x.atan2(y), tx.atan2(ty)),
        ("atan2 int", n.atan2(n), tn.atan2(tn)),  # integers give the default float
        ("copysign int scalar", n.copysign(-1.0), tn.copysign(-1.0)),
        ("copysign float int", x.copysign(n), tx.copysign(tn)),
        ("xlogy scalar", x.xlogy(3.0), tx.xlogy(3.0)),
        ("xlogy int", n.xlogy(n.abs()), tn.xlogy(tn.abs())),
        ("logaddexp scalar", x.logaddexp(0.5), tx.logaddexp(torch.tensor(0.5))),
        ("hypot scalar", x.hypot(em.tensor(2.0, device=device)), tx.hypot(torch.tensor(2.0))),
        ("ldexp", x.ldexp(n), torch.ldexp(tx, tn)),
        ("ldexp int", n.ldexp(n), torch.ldexp(tn, tn)),
        ("float_power", x.float_power(n), tx.float_power(tn)),
        ("float_power scalar", n.float_power(0.5), tn.float_power(0.5)),
        ("logaddexp half", half.logaddexp(half), torch.tensor(x32).half().logaddexp(torch.tensor(x32).half()), 1e-3,
         1e-3),
        ("hypot bfloat16", half.cast(em.bfloat16).hypot(half.cast(em.bfloat16)),
         torch.tensor(x32).bfloat16().hypot(torch.tensor(x32).bfloat16()), 1e-2, 1e-2),
    ]
    assert_close_batch(cases, rtol=3e-6)


def test_errors_name_the_operands_like_torch() -> None:
    integers, floats = em.tensor([1, 2]), em.tensor([1.0, 2.0])
    for name in ("logaddexp", "logaddexp2", "hypot"):
        with pytest.raises(em.DTypeError, match=f"{name}: not supported for int64"):
            getattr(integers, name)(integers)
        with pytest.raises((RuntimeError, NotImplementedError)):
            getattr(torch, name)(torch.tensor([1, 2]), torch.tensor([1, 2]))
    with pytest.raises(em.ShapeError):
        floats.atan2(em.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(em.DTypeError, match="isclose: float32 and float64 differ"):
        floats.isclose(floats.double())
    with pytest.raises(ValueError, match="rtol and atol must be non-negative"):
        floats.isclose(floats, rtol=-1)
    with pytest.raises(em.DTypeError, match="lerp: needs a floating point tensor"):
        integers.lerp(integers, 0.5)
    with pytest.raises(em.DTypeError, match="lerp: expected dtype float32 for `end`"):
        floats.lerp(floats.double(), 0.5)
    with pytest.raises(em.DTypeError, match="heaviside: the input"):
        floats.heaviside(integers)
    with pytest.raises(em.DTypeError, match="gcd: needs integer operands"):
        floats.gcd(floats)
    with pytest.raises(em.DTypeError, match="nanmean: .*floating point tensor"):
        integers.nanmean()
    with pytest.raises(em.DTypeError, match="logcumsumexp: needs a floating point tensor"):
        integers.logcumsumexp(0)
    with pytest.raises(em.ShapeError, match="diff: expects a tensor of at least one dim"):
        em.tensor(1.0).diff()
    with pytest.raises(RuntimeError, match="diff: the order n must be a non-negative int"):  # torch's class
        floats.diff(n=-1)


def test_isclose_and_allclose(device: str) -> None:
    left = np.array([1.0, 1.0 + 1e-6, 1.0 + 1e-4, np.inf, -np.inf, np.inf, np.nan, 0.0, 1e-9, -0.0], np.float32)
    right = np.array([1.0, 1.0, 1.0, np.inf, -np.inf, -np.inf, np.nan, 1e-9, 0.0, 0.0], np.float32)
    x, y, tx, ty = em.tensor(left, device=device), em.tensor(right, device=device), torch.tensor(left), \
        torch.tensor(right)
    for rtol, atol, equal_nan in ((1e-5, 1e-8, False), (0.0, 0.0, True), (1e-3, 0.0, True), (0.0, 1e-8, False)):
        expected = torch.isclose(tx, ty, rtol=rtol, atol=atol, equal_nan=equal_nan).numpy()
        np.testing.assert_array_equal(x.isclose(y, rtol, atol, equal_nan).numpy(), expected)
        assert x[:3].allclose(y[:3], rtol, atol, equal_nan) == torch.allclose(tx[:3], ty[:3], rtol, atol, equal_nan)
    a, b = np.array([5, 7, -3, 100]), np.array([5, 8, -2, 101])
    np.testing.assert_array_equal(em.tensor(a, device=device).isclose(em.tensor(b, device=device), 0.01, 0.5).numpy(),
                                  torch.isclose(torch.tensor(a), torch.tensor(b), 0.01, 0.5).numpy())
    assert em.tensor(left[:2], device=device).allclose(em.tensor(right[:2], device=device))


def test_interpolation_fused_forms_and_integer_functions(device: str) -> None:
    rng = np.random.default_rng(3)
    start, end, weight = (rng.uniform(-3, 3, shape).astype(np.float32) for shape in ((4, 5), (4, 5), (5,)))
    s, e, w = (em.tensor(data, device=device, requires_grad=True) for data in (start, end, weight))
    ts, te, tw = (torch.tensor(data, requires_grad=True) for data in (start, end, weight))
    results = [s.lerp(e, w), s.lerp(e, 0.75), s.addcmul(e, w, value=0.5), s.addcdiv(e, w.abs() + 1, value=-2)]
    expected = [ts.lerp(te, tw), ts.lerp(te, 0.75), ts.addcmul(te, tw, value=0.5), ts.addcdiv(te, tw.abs() + 1, value=-2)]
    sum(result.sum() for result in results).backward()
    sum(result.sum() for result in expected).backward()
    integers = np.array([0, 12, -18, 7, 0, 2**40, -6])
    others = np.array([0, 18, 12, -3, 5, 2**20 * 3, 9])
    i, j, ti, tj = em.tensor(integers, device=device), em.tensor(others, device=device), torch.tensor(integers), \
        torch.tensor(others)
    signed = np.array([-0.0, 0.0, -1.5, 2.0, -np.inf, np.nan], np.float32)
    assert_close_batch([*(("lerp/addc", mine, theirs) for mine, theirs in zip(results, expected)),
                        ("grad start", s.grad, ts.grad), ("grad end", e.grad, te.grad), ("grad weight", w.grad, tw.grad),
                        ("lerp exact at 1", s.lerp(e, 1.0), te.detach(), 0, 0),
                        ("gcd", i.gcd(j), ti.gcd(tj)), ("lcm", i.lcm(j), ti.lcm(tj)),
                        ("signbit", em.tensor(signed, device=device).signbit(), torch.tensor(signed).signbit()),
                        ("signbit int", i.signbit(), ti.signbit()),
                        ("positive", i.positive(), ti.positive())], rtol=3e-6)


def test_nan_reductions(device: str) -> None:
    data = np.random.default_rng(4).uniform(-2, 2, (3, 4, 5)).astype(np.float32)
    data[0, 1, 2] = data[2, 3, 0] = data[1, :, 4] = np.nan
    data[2, 2, :] = np.nan  # a row of NaNs: nanmean gives NaN, nansum 0
    x, tx = em.tensor(data, device=device, requires_grad=True), torch.tensor(data, requires_grad=True)
    results = [x.nansum(), x.nansum(1), x.nansum((0, 2), keepdim=True), x.nanmean(), x.nanmean(-1),
               x.nanmean(1, keepdim=True), x.nansum(dtype=em.float64)]
    expected = [tx.nansum(), tx.nansum(1), tx.nansum((0, 2), keepdim=True), tx.nanmean(), tx.nanmean(-1),
                tx.nanmean(1, keepdim=True), tx.nansum(dtype=torch.float64)]
    sum(result.sum() for result in results[:5]).backward()
    sum(result.sum() for result in expected[:5]).backward()
    torch_grad = tx.grad.clone()
    torch_grad[2, 2, :] = 0  # torch: NaN there (nanmean's 1 / 0 times nansum's mask 0); ember: 0, NaNs are skipped
    integers = np.arange(-6, 6).reshape(3, 4)
    assert_close_batch([*(("nan reduction", mine, theirs) for mine, theirs in zip(results, expected)),
                        ("grad", x.grad, torch_grad),
                        ("nansum int", em.tensor(integers, device=device).nansum(0), torch.tensor(integers).nansum(0))])


def test_scans_and_differences(device: str) -> None:
    data = np.random.default_rng(5).uniform(-3, 3, (4, 6)).astype(np.float32)
    data[0, 2], data[1, 0], data[2, 3], data[3, 1] = -np.inf, 90.0, np.inf, -200.0
    x, tx = em.tensor(data, device=device, requires_grad=True), torch.tensor(data, requires_grad=True)
    finite = np.where(np.isfinite(data), data, 0.5)
    y, ty = em.tensor(finite, device=device, requires_grad=True), torch.tensor(finite, requires_grad=True)
    before, after = np.ones((4, 2), np.float32), np.full((4, 1), 7.0, np.float32)
    results = [x.logcumsumexp(1), x.logcumsumexp(0), y.cummin(1).values, y.diff(), y.diff(n=2, dim=0),
               y.diff(dim=1, prepend=em.tensor(before, device=device), append=em.tensor(after, device=device))]
    expected = [tx.logcumsumexp(1), tx.logcumsumexp(0), ty.cummin(1).values, ty.diff(), ty.diff(n=2, dim=0),
                ty.diff(dim=1, prepend=torch.tensor(before), append=torch.tensor(after))]
    sum(result.sum() for result in results[2:]).backward()
    sum(result.sum() for result in expected[2:]).backward()
    finite_results, finite_expected = [y.logcumsumexp(1)], [ty.logcumsumexp(1)]
    finite_results[0].sum().backward()
    finite_expected[0].sum().backward()
    flags = np.array([True, False, False, True, True])
    assert_close_batch([*(("scan", mine, theirs) for mine, theirs in zip(results + finite_results,
                                                                         expected + finite_expected)),
                        ("cummin indices", y.cummin(1).indices, ty.cummin(1).indices), ("grad", y.grad, ty.grad),
                        ("diff bool", em.tensor(flags, device=device).diff(), torch.tensor(flags).diff()),
                        ("logcumsumexp half", y.cast(em.float16).logcumsumexp(1), ty.detach().half().logcumsumexp(1),
                         1e-3, 1e-3)], rtol=3e-6)
