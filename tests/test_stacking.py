"""Stacking and splitting with numpy's names against torch: hstack/vstack/row_stack/dstack/column_stack,
atleast_1d/2d/3d, hsplit/vsplit/dsplit, split_with_sizes and unravel_index (values, gradients, errors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import BatchedChecks, pair, random_array

# for each function, shape lists it joins: (vectors or scalars, matrices, 3-d tensors)
SHAPE_SETS = {
    "hstack": [[(3,), (2,)], [(), ()], [(2, 3), (2, 1)], [(2, 3, 2), (2, 1, 2)]],
    "vstack": [[(3,), (3,)], [(), ()], [(2, 3), (1, 3)], [(2, 3, 2), (1, 3, 2)]],
    "row_stack": [[(3,), (3,)], [(), ()], [(2, 3), (1, 3)]],
    "dstack": [[(3,), (3,)], [(), ()], [(2, 3), (2, 3)], [(2, 3, 1), (2, 3, 2)]],
    "column_stack": [[(3,), (3,), (3, 2)], [(), ()], [(2, 3), (2, 1)], [(2, 1, 3), (2, 2, 3)]],
}


@pytest.mark.parametrize("name", list(SHAPE_SETS))
def test_stacking_matches_torch_with_gradients(device: str, name: str) -> None:
    check = BatchedChecks(atol=0, rtol=0)
    for shapes in SHAPE_SETS[name]:
        label = str(shapes)
        pairs = [pair(random_array(shape, seed=index), device, requires_grad=True) for index, shape in
                 enumerate(shapes)]
        result = getattr(em, name)([ours for ours, _ in pairs])
        expected = getattr(torch, name)([theirs for _, theirs in pairs])
        check(result, expected, f"{name} {label}")
        weights = random_array(tuple(expected.shape), seed=7)
        (result * em.tensor(weights, device=device)).sum().backward()
        (expected * torch.tensor(weights)).sum().backward()
        for index, (ours, theirs) in enumerate(pairs):
            check(ours.grad, theirs.grad, f"{name} {label} gradient {index}")
    check.verify()


def test_stacking_promotes_dtypes_like_torch(device: str) -> None:
    check = BatchedChecks(atol=0, rtol=0)
    a, ta = pair(np.array([1, 2], dtype=np.int32), device)
    b, tb = pair(np.array([0.5, 1.5], dtype=np.float32), device)
    for name in ("hstack", "vstack", "dstack", "column_stack"):
        check(getattr(em, name)((a, b)), getattr(torch, name)((ta, tb)), name)
    check.verify()


def test_stacking_errors_are_torch_s(device: str) -> None:
    for name in ("hstack", "vstack", "dstack", "column_stack", "row_stack"):
        with pytest.raises(RuntimeError):
            getattr(torch, name)([])
        with pytest.raises(RuntimeError):
            getattr(em, name)([])
    for module in (torch, em):
        with pytest.raises(RuntimeError):
            module.vstack([module.ones(2, 3), module.ones(2, 2)])
        with pytest.raises(TypeError):
            module.hstack(module.ones(2))


def test_atleast_nd_matches_torch(device: str) -> None:
    check = BatchedChecks(atol=0, rtol=0)
    for shape in ((), (3,), (2, 3), (2, 3, 4), (1, 2, 3, 4)):
        x, tx = pair(random_array(shape), device)
        for name in ("atleast_1d", "atleast_2d", "atleast_3d"):
            check(getattr(em, name)(x), getattr(torch, name)(tx), f"{name} {shape}")
    x, tx = pair(random_array(()), device)
    y, ty = pair(random_array((3,)), device)
    for name in ("atleast_1d", "atleast_2d", "atleast_3d"):
        ours, theirs = getattr(em, name)(x, y), getattr(torch, name)(tx, ty)
        assert isinstance(ours, tuple) and isinstance(theirs, tuple)
        check(list(ours), list(theirs), f"{name} of two")
        check(list(getattr(em, name)([x, y])), list(getattr(torch, name)([tx, ty])), f"{name} of a list")
    check.verify()
    with pytest.raises(TypeError):
        torch.atleast_1d(1)
    with pytest.raises(TypeError):
        em.atleast_1d(1)


def test_hsplit_vsplit_dsplit_match_torch(device: str) -> None:
    check = BatchedChecks(atol=0, rtol=0)
    x, tx = pair(random_array((4, 6, 2)), device, requires_grad=True)
    v, tv = pair(random_array((6,)), device)
    cases = [("hsplit", 3), ("hsplit", [1, 4]), ("vsplit", 2), ("vsplit", [3]), ("dsplit", 2), ("dsplit", [1, 5])]
    total, torch_total = 0, 0
    for name, argument in cases:
        ours, theirs = getattr(x, name)(argument), getattr(tx, name)(argument)
        check(list(ours), list(theirs), f"{name} {argument}")
        check(list(getattr(em, name)(x, argument)), list(getattr(torch, name)(tx, argument)), f"ember.{name}")
        total = total + sum(((piece * (index + 1)).sum() for index, piece in enumerate(ours)), start=0)
        torch_total = torch_total + sum((piece * (index + 1)).sum() for index, piece in enumerate(theirs))
    check(list(v.hsplit(3)), list(tv.hsplit(3)), "hsplit of a vector")
    total.backward()
    torch_total.backward()
    check(x.grad, tx.grad, "gradient")
    check.verify()


@pytest.mark.parametrize("call", [
    lambda m, d: m.ones(4, 6, device=d).hsplit(4),  # 6 is not divisible by 4
    lambda m, d: m.ones(3, 4, device=d).vsplit(2),
    lambda m, d: m.ones(4, 6, device=d).dsplit(2),  # needs 3 dims
    lambda m, d: m.ones((), device=d).hsplit(1),
    lambda m, d: m.ones(4, device=d).vsplit(2),
    lambda m, d: m.ones(3, 4, device=d).split_with_sizes([1, 1]),
    lambda m, d: m.ones(3, 4, device=d).split_with_sizes([2, 2], 2),
], ids=["hsplit uneven", "vsplit uneven", "dsplit rank", "hsplit 0-d", "vsplit rank", "sizes sum", "dim range"])
def test_split_errors_are_torch_s(device: str, call) -> None:
    with pytest.raises((RuntimeError, IndexError)) as torch_error:
        call(torch, "cpu")
    expected = IndexError if isinstance(torch_error.value, IndexError) else RuntimeError
    with pytest.raises(expected):
        call(em, device)


def test_split_with_sizes_matches_torch(device: str) -> None:
    x, tx = pair(random_array((3, 5)), device, requires_grad=True)
    check = BatchedChecks(atol=0, rtol=0)
    ours, theirs = x.split_with_sizes([2, 0, 3], 1), tx.split_with_sizes([2, 0, 3], 1)
    check(list(ours), list(theirs), "split_with_sizes")
    check(list(em.split_with_sizes(x, [1, 2])), list(torch.split_with_sizes(tx, [1, 2])), "ember.split_with_sizes")
    (ours[0].sum() + 2 * ours[2].sum()).backward()
    (theirs[0].sum() + 2 * theirs[2].sum()).backward()
    check(x.grad, tx.grad, "gradient")
    check.verify()


def test_unravel_index_matches_torch(device: str) -> None:
    check = BatchedChecks(atol=0, rtol=0)
    flat = np.array([[0, 5, 7], [-1, 23, 11]], dtype=np.int64)
    for shape in ((2, 3), (4, 6), (2, 3, 4), 24, (24,), ()):
        x, tx = pair(flat if shape != () else flat * 0, device)
        check(list(em.unravel_index(x, shape)), list(torch.unravel_index(tx, shape)), f"shape {shape}")
    x, tx = pair(np.array(5, dtype=np.int32), device)
    check(list(em.unravel_index(x, (2, 3))), list(torch.unravel_index(tx, (2, 3))), "0-d int32")
    check.verify()
    for call, error in ((lambda m: m.unravel_index(m.tensor([1.5]), (2,)), TypeError),
                        (lambda m: m.unravel_index(m.tensor([1]), (2, -3)), ValueError),
                        (lambda m: m.unravel_index(m.tensor([0]), (0,)), RuntimeError)):
        with pytest.raises(error):
            call(torch)
        with pytest.raises(error):
            call(em)
