"""Tensor attributes and small torch functions against torch: .data, get_device, sum_to_size, the complex views of a
real tensor (conj, adjoint, H, mH, real, imag), diagflat, combinations, trapezoid/trapz/cumulative_trapezoid and
the window functions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import BatchedChecks, pair, random_array


def test_data_is_detached_and_assignable_like_torch(device: str) -> None:
    x, tx = pair(random_array((2, 3)), device, requires_grad=True)
    y, ty = x * 2, tx * 2
    assert y.data.requires_grad is ty.data.requires_grad is False
    assert y.data.is_leaf and ty.data.is_leaf
    y.data = em.zeros(4, device=device)
    ty.data = torch.zeros(4)
    assert tuple(y.shape) == tuple(ty.shape) == (4,)
    assert y.requires_grad and ty.requires_grad
    check = BatchedChecks()
    check(y, ty, "assigned")
    check.verify()
    # in-place changes of .data reach the tensor (old-style optimizer steps), without history
    p, tp = pair(random_array((3,)), device, requires_grad=True)
    p.data.mul_(0.5)
    tp.data.mul_(0.5)
    p.data.add_(em.ones(3, device=device), alpha=-0.1)
    tp.data.add_(torch.ones(3), alpha=-0.1)
    assert p.is_leaf and p.requires_grad and p.grad_fn is None
    check(p, tp, "written through .data")
    (p * 2).sum().backward()
    (tp * 2).sum().backward()
    check(p.grad, tp.grad, "gradient after")
    check.verify()


def test_get_device() -> None:
    x = em.ones(2, device="c:0")
    assert x.get_device() == em.get_device(x) == torch.ones(2).get_device() == -1


def test_sum_to_size_matches_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-6, rtol=1e-6)
    x, tx = pair(random_array((2, 3, 4)), device, requires_grad=True)
    for size in ((1, 3, 1), (3, 4), (4,), (2, 1, 4), (2, 3, 4), ((1, 1),)):
        check(x.sum_to_size(*size), tx.sum_to_size(*size), f"sum_to_size {size}")
    result, expected = x.sum_to_size(3, 1), tx.sum_to_size(3, 1)
    result.sum().backward()
    expected.sum().backward()
    check(x.grad, tx.grad, "gradient")
    check.verify()
    for size in ((2,), (5, 3, 4), (1, 2, 3, 4)):
        with pytest.raises(RuntimeError):
            tx.sum_to_size(*size)
        with pytest.raises(RuntimeError):
            x.sum_to_size(*size)


def test_complex_views_of_real_tensors_match_torch(device: str) -> None:
    check = BatchedChecks(atol=0, rtol=0)
    x, tx = pair(random_array((2, 3, 4)), device)
    m, tm = pair(random_array((2, 3)), device)
    check(x.mH, tx.mH, "mH")
    check(x.adjoint(), tx.adjoint(), "adjoint")
    check(em.adjoint(x), torch.adjoint(tx), "ember.adjoint")
    check(m.H, tm.H, "H")
    for name in ("conj", "resolve_conj", "resolve_neg", "conj_physical"):
        check(getattr(x, name)(), getattr(tx, name)(), name)
        check(getattr(em, name)(x), getattr(torch, name)(tx), f"ember.{name}")
    check(x.real, tx.real, "real")
    check(em.real(x), torch.real(tx), "ember.real")
    check.verify()
    assert x.is_conj() is tx.is_conj() is False and x.is_neg() is tx.is_neg() is False
    for call in (lambda t: t.imag, lambda t: t.H if t.ndim != 2 else t.reshape(-1).H, lambda t: t[0, 0].mH,
                 lambda t: t[0, 0].adjoint(), lambda t: t.H):
        with pytest.raises(RuntimeError):
            call(tx)
        with pytest.raises(RuntimeError):
            call(x)


def test_diagflat_and_combinations_match_torch(device: str) -> None:
    check = BatchedChecks(atol=0, rtol=0)
    x, tx = pair(random_array((2, 2)), device, requires_grad=True)
    for offset in (0, 1, -2):
        check(x.diagflat(offset), tx.diagflat(offset), f"diagflat {offset}")
        check(em.diagflat(x, offset), torch.diagflat(tx, offset), f"ember.diagflat {offset}")
    v, tv = pair(random_array((4,)), device, requires_grad=True)
    for r in (1, 2, 3, 5, 0):
        for replacement in (False, True):
            check(em.combinations(v, r, replacement), torch.combinations(tv, r, replacement), f"r={r} {replacement}")
    result, expected = em.combinations(v, 2), torch.combinations(tv, 2)
    weights = random_array(tuple(expected.shape), seed=3)
    (result * em.tensor(weights, device=device)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    check(v.grad, tv.grad, "combinations gradient")
    i, ti = pair(np.array([3, 1, 2]), device)
    check(em.combinations(i, 2), torch.combinations(ti, 2), "int")
    check.verify()
    for call in (lambda m: m.combinations(m.ones(2, 2)), lambda m: m.combinations(m.ones(2), -1)):
        with pytest.raises(RuntimeError):
            call(torch)
        with pytest.raises(RuntimeError):
            call(em)


def test_trapezoid_family_matches_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    y, ty = pair(random_array((3, 5)), device, requires_grad=True)
    points = np.sort(random_array((5,), seed=2))
    x, tx = pair(points, device)
    xs, txs = pair(np.sort(random_array((3, 5), seed=4), axis=1), device)
    for name in ("trapezoid", "cumulative_trapezoid"):
        ours, theirs = getattr(em, name), getattr(torch, name)
        check(ours(y), theirs(ty), name)
        check(ours(y, dx=0.5), theirs(ty, dx=0.5), f"{name} dx")
        check(ours(y, x), theirs(ty, tx), f"{name} x")
        check(ours(y, xs), theirs(ty, txs), f"{name} x like y")
        check(ours(y, dim=0), theirs(ty, dim=0), f"{name} dim 0")
    check(em.trapz(y, x), torch.trapz(ty, tx), "trapz x")
    check(em.trapz(y, dx=2.0, dim=0), torch.trapz(ty, dx=2.0, dim=0), "trapz dx")
    i, ti = pair(np.array([1, 2, 4]), device)
    check(em.trapezoid(i), torch.trapezoid(ti), "int samples")
    check(em.trapezoid(em.ones(0, device=device)), torch.trapezoid(torch.ones(0)), "empty")
    result, expected = em.trapezoid(y, x), torch.trapezoid(ty, tx)
    result.sum().backward()
    expected.sum().backward()
    check(y.grad, ty.grad, "gradient")
    check.verify()
    with pytest.raises(RuntimeError):
        torch.trapezoid(torch.ones(3), torch.ones(2))
    with pytest.raises(RuntimeError):
        em.trapezoid(em.ones(3), em.ones(2))


@pytest.mark.parametrize("name", ["hann_window", "hamming_window", "bartlett_window", "blackman_window"])
def test_windows_match_torch(device: str, name: str) -> None:
    check = BatchedChecks(atol=1e-6, rtol=1e-5)
    for length in (0, 1, 2, 5, 16):
        for periodic in (True, False):
            check(getattr(em, name)(length, periodic, device=device), getattr(torch, name)(length, periodic),
                  f"{length} {periodic}")
    if name == "hamming_window":
        check(em.hamming_window(6, True, 0.5, 0.3, device=device), torch.hamming_window(6, True, 0.5, 0.3), "alpha")
    check.verify()
    window = getattr(em, name)(4, dtype=em.float16, device=device, requires_grad=True)
    assert window.dtype is em.float16 and window.requires_grad and window.is_leaf
    for call in (lambda m: getattr(m, name)(4, dtype=m.int64), lambda m: getattr(m, name)(-1)):
        with pytest.raises(RuntimeError):
            call(torch)
        with pytest.raises(RuntimeError):
            call(em)
