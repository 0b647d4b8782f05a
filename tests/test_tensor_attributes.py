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


def test_strided_constructors_asarray_frombuffer_and_unsafe_splits(device: str) -> None:
    assert em.empty_strided((2, 3), (1, 2), device=device).shape == tuple(torch.empty_strided((2, 3), (1, 2)).shape)
    x, tx = pair(random_array((2, 3)), device)
    made, expected = x.new_empty_strided((4,), (1,)), tx.new_empty_strided((4,), (1,))
    assert made.shape == tuple(expected.shape) and made.dtype is em.float32 and made.device == x.device
    assert x.dim_order() == tx.dim_order() == (0, 1)
    with pytest.raises(RuntimeError):
        torch.empty_strided((2, 3), (1,))
    with pytest.raises(RuntimeError):
        em.empty_strided((2, 3), (1,))
    check = BatchedChecks(atol=0, rtol=0)
    check(em.asarray([1, 2], device=device), torch.asarray([1, 2]), "asarray list")
    check(em.asarray(x, dtype=em.float64), torch.asarray(tx, dtype=torch.float64), "asarray cast")
    assert em.asarray(x) is x and torch.asarray(tx) is tx
    data = bytearray(np.arange(6, dtype=np.int16).tobytes())
    check(em.frombuffer(data, dtype=em.int16), torch.frombuffer(data, dtype=torch.int16), "frombuffer")
    check(em.frombuffer(data, dtype=em.int16, count=2, offset=4),
          torch.frombuffer(data, dtype=torch.int16, count=2, offset=4), "frombuffer count offset")
    v, tv = pair(random_array((7,)), device)
    check(list(em.unsafe_chunk(v, 3)), list(torch.unsafe_chunk(tv, 3)), "unsafe_chunk")
    check(list(v.unsafe_split(3)), list(tv.unsafe_split(3)), "unsafe_split")
    check(list(em.unsafe_split_with_sizes(v, [2, 5])), list(torch.unsafe_split_with_sizes(tv, [2, 5])),
          "unsafe_split_with_sizes")
    check.verify()
    with pytest.raises(ValueError):
        torch.frombuffer(data, dtype=torch.int16, count=10)
    with pytest.raises(ValueError):
        em.frombuffer(data, dtype=em.int16, count=10)


@pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta")
def test_nonzero_static_index_reduce_nextafter_histogram(device: str) -> None:
    check = BatchedChecks(atol=1e-6, rtol=1e-6)
    m, tm = pair(np.array([[0, 1, 0], [2, 0, 3]], np.int64), device)
    for size, fill in ((0, -1), (2, -1), (5, -7)):
        check(m.nonzero_static(size=size, fill_value=fill), tm.nonzero_static(size=size, fill_value=fill),
              f"nonzero_static {size}")
    check(em.nonzero_static(m[0], size=3), torch.nonzero_static(tm[0], size=3), "1-d")
    base, tbase = pair(random_array((4, 3)), device, requires_grad=True)
    source, tsource = pair(random_array((5, 3), seed=1), device, requires_grad=True)
    index, tindex = pair(np.array([0, 2, 0, 3, 2]), device)
    for reduce in ("prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            check(base.index_reduce(0, index, source, reduce, include_self=include_self),
                  tbase.index_reduce(0, tindex, tsource, reduce, include_self=include_self),
                  f"index_reduce {reduce} {include_self}")
    result = base.index_reduce(0, index, source, "prod")
    expected = tbase.index_reduce(0, tindex, tsource, "prod")
    result.sum().backward()
    expected.sum().backward()
    check(base.grad, tbase.grad, "index_reduce gradient self")
    check(source.grad, tsource.grad, "index_reduce gradient source")
    start = np.array([1.0, 0.0, -1.0, np.inf, np.nan, 2.0, 0.0, -0.0, 3.5, -1e-45], np.float32)
    toward = np.array([2.0, -1.0, -1.0, 0.0, 1.0, np.nan, 1.0, 1.0, -np.inf, 0.0], np.float32)
    for dtype in (np.float32,):
        a, ta = pair(start.astype(dtype), device)
        b, tb = pair(toward.astype(dtype), device)
        check(a.nextafter(b), ta.nextafter(tb), "nextafter", atol=0, rtol=0)
        check(em.nextafter(a, b), torch.nextafter(ta, tb), "ember.nextafter", atol=0, rtol=0)
    values, tvalues = pair(random_array((50,)), device)
    weights, tweights = pair(np.abs(random_array((50,), seed=3)), device)
    edges, tedges = pair(np.array([-2.0, -0.5, 0.0, 1.0, 2.0], np.float32), device)
    for label, ours, theirs in (
            ("bins", values.histogram(7), tvalues.histogram(7)),
            ("range", em.histogram(values, 4, range=(-1.0, 1.0)), torch.histogram(tvalues, 4, range=(-1.0, 1.0))),
            ("edges", values.histogram(edges), tvalues.histogram(tedges)),
            ("weights density", values.histogram(5, weight=weights, density=True),
             tvalues.histogram(5, weight=tweights, density=True))):
        check(ours.hist, theirs.hist, f"histogram {label}")
        check(ours.bin_edges, theirs.bin_edges, f"histogram {label} edges")
    check.verify()


def test_random_fills_and_rng_state(device: str) -> None:
    count = 20000
    samples = {
        "exponential_": (em.empty(count, device=device).exponential_(2.0), 0.5, 0.5),
        "log_normal_": (em.empty(count, device=device).log_normal_(0.0, 0.5).log(), 0.0, 0.5),
        "geometric_": (em.empty(count, device=device).geometric_(0.25), 4.0, (0.75 ** 0.5) / 0.25),
        "random_": (em.empty(count, device=device).random_(10, 20), 14.5, (99 / 12) ** 0.5),
    }
    for name, (values, mean, std) in samples.items():
        array = values.numpy().astype(np.float64)
        assert abs(array.mean() - mean) < 0.05 * max(std, 1), (name, array.mean())
        assert abs(array.std() - std) < 0.05 * std, (name, array.std())
    cauchy = em.empty(count, device=device).cauchy_(1.0, 2.0).numpy()
    assert abs(np.median(cauchy) - 1.0) < 0.1 and abs(np.percentile(cauchy, 75) - 3.0) < 0.2
    assert set(np.unique(em.zeros(200, dtype=em.int32, device=device).random_(3).numpy())) == {0, 1, 2}
    assert em.zeros(100, dtype=em.uint8, device=device).random_().numpy().max() > 200
    for call in (lambda m: m.ones(3).exponential_(-1.0), lambda m: m.ones(3).geometric_(1.5),
                 lambda m: m.ones(3).random_(5, 2), lambda m: m.ones(3, dtype=m.int64).exponential_()):
        with pytest.raises(RuntimeError):
            call(torch)
        with pytest.raises(RuntimeError):
            call(em)
    state = em.get_rng_state()
    assert state.dtype is em.uint8 and state.shape == (16,)
    first = em.rand(5, device=device).numpy()
    em.set_rng_state(state)
    np.testing.assert_array_equal(em.rand(5, device=device).numpy(), first)
    with pytest.raises(TypeError):
        em.set_rng_state(em.ones(3))


def test_gradient_matches_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    y, ty = pair(random_array((4, 5)), device, requires_grad=True)
    coordinates = np.sort(random_array((5,), seed=2)) + np.arange(5, dtype=np.float32)
    c, tc = pair(coordinates, device)
    cases = [({}, {}), ({"spacing": 0.5}, {"spacing": 0.5}), ({"dim": 1, "edge_order": 2}, {"dim": 1, "edge_order": 2}),
             ({"spacing": [2.0, 0.5]}, {"spacing": [2.0, 0.5]}), ({"dim": -1, "spacing": (c,)}, {"dim": -1,
                                                                                                  "spacing": (tc,)})]
    for ours, theirs in cases:
        check(list(em.gradient(y, **ours)), list(torch.gradient(ty, **theirs)), str(theirs))
    result, expected = em.gradient(y, dim=0, edge_order=2)[0], torch.gradient(ty, dim=0, edge_order=2)[0]
    weights = random_array((4, 5), seed=7)
    (result * em.tensor(weights, device=device)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    check(y.grad, ty.grad, "gradient of gradient")
    i, ti = pair(np.array([1, 2, 4, 7]), device)
    check(list(em.gradient(i)), list(torch.gradient(ti)), "int input")
    check.verify()
    for call in (lambda m: m.gradient(m.ones(2), edge_order=2), lambda m: m.gradient(m.ones(3, 3), spacing=[1.0])):
        with pytest.raises(RuntimeError):
            call(torch)
        with pytest.raises(RuntimeError):
            call(em)


def test_kaiser_window_matches_torch(device: str) -> None:
    """kaiser_window is a ratio of i0 values (special_functions.py's i0, tested with it)."""
    check = BatchedChecks(atol=1e-6, rtol=2e-6)
    for length in (0, 1, 2, 7, 16):
        for periodic in (True, False):
            for beta in (12.0, 5.0):
                check(em.kaiser_window(length, periodic, beta, device=device),
                      torch.kaiser_window(length, periodic, beta), f"kaiser {length} {periodic} {beta}")
    check.verify()


def test_torch_level_functions_match_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-6, rtol=1e-6)
    x, tx = pair(random_array((2, 3)), device)
    check(em.fill(x, 2.5), torch.fill(tx, 2.5), "fill")
    check(em.fill(x, em.tensor(3.0, device=device)), torch.fill(tx, torch.tensor(3.0)), "fill tensor")
    check(em.constant_pad_nd(x, (1, 2), 4.0), torch.constant_pad_nd(tx, (1, 2), 4.0), "constant_pad_nd")
    a, ta = pair(random_array((3, 4), seed=1), device)
    b, tb = pair(random_array((4, 2), seed=2), device)
    with pytest.warns(UserWarning, match="deprecated"):
        check(em.chain_matmul(x, a, b), torch.chain_matmul(tx, ta, tb), "chain_matmul")
    w, tw = pair(random_array((5, 3, 4), seed=3), device)
    check(em.bilinear(x, a[:2], w, None), torch.bilinear(tx, ta[:2], tw, None), "bilinear")
    p, tp = pair(random_array((2, 3, 8)), device)
    check(list(em.max_pool1d_with_indices(p, 2)), list(torch.max_pool1d_with_indices(tp, 2)), "max_pool1d_with_indices")
    check.verify()
    assert isinstance(x.dtype, em.dtype) and em.is_storage(x) is torch.is_storage(tx) is False
    with pytest.raises(RuntimeError):
        torch.fill(tx, torch.ones(2))
    with pytest.raises(RuntimeError):
        em.fill(x, em.ones(2))


def test_resize_matches_torch(device: str) -> None:
    check = BatchedChecks(atol=0, rtol=0)
    data = random_array((2, 3))
    for sizes in ((3, 2), (4,), ((1, 2, 2),), (6,)):
        x, tx = pair(data, device)
        assert x.resize_(*sizes) is x
        tx.resize_(*sizes)
        check(x, tx, f"resize_ {sizes}")
    x, tx = pair(data, device)
    x.resize_as_(em.ones(3, 2, device=device))
    tx.resize_as_(torch.ones(3, 2))
    check(x, tx, "resize_as_")
    check.verify()
    x = em.ones(2, 3, device=device)
    assert x.resize_(9).shape == tuple(torch.ones(2, 3).resize_(9).shape)  # new elements: torch's are uninitialized
    for module in (torch, em):
        with pytest.raises(RuntimeError):
            module.ones(2, requires_grad=True).resize_(3)


def test_matrix_exp_matches_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-4, rtol=1e-4)
    generator = np.random.default_rng(0)
    for scale in (0.1, 1.0, 3.0):
        data = (generator.normal(size=(3, 4, 4)) * scale).astype(np.float32)
        x, tx = pair(data, device, requires_grad=True)
        result, expected = em.matrix_exp(x), torch.matrix_exp(tx)
        check(result, expected, f"scale {scale}", rtol=2e-5)
        check(em.linalg.matrix_exp(x), torch.linalg.matrix_exp(tx), "linalg", rtol=2e-5)
        weights = generator.normal(size=(3, 4, 4)).astype(np.float32)
        (result * em.tensor(weights, device=device)).sum().backward()
        (expected * torch.tensor(weights)).sum().backward()
        check(x.grad, tx.grad, f"scale {scale} gradient", rtol=1e-3)
    check.verify()
    for module in (torch, em):
        with pytest.raises(RuntimeError):
            module.matrix_exp(module.ones(2, 3))
