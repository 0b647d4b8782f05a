"""matmul (1-d, 2-d, batched, broadcast batch dims, int dtypes), mm/bmm/mv/dot/outer/addmm and einsum against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import assert_close, pair, random_array

MATMUL_SHAPES = [
    ((3,), (3,)),  # dot -> 0-d
    ((3,), (3, 4)),  # vector @ matrix
    ((2, 3), (3,)),  # matrix @ vector
    ((1, 1), (1, 1)),
    ((17, 3), (3, 5)),
    ((2, 1, 4, 3), (5, 3, 2)),  # broadcast batch dims
    ((4, 3), (2, 3, 5)),  # 2-d @ batched
    ((2, 4, 3), (3,)),  # batched @ vector
    ((3,), (2, 3, 1)),  # vector @ batched
    ((0, 3), (3, 2)),  # empty rows
    ((2, 0), (0, 3)),  # empty inner dim: zeros
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_shapes(device: str, dtype: type) -> None:
    for seed, (left_shape, right_shape) in enumerate(MATMUL_SHAPES):
        a, ta = pair(random_array(left_shape, dtype, seed=seed), device)
        b, tb = pair(random_array(right_shape, dtype, seed=seed + 100), device)
        assert_close(a @ b, ta @ tb, atol=1e-5, rtol=1e-5)


def test_matmul_non_contiguous_and_integer(device: str) -> None:
    a, ta = pair(random_array((5, 7)), device)
    b, tb = pair(random_array((4, 10)), device)
    assert_close(a.T[:, 1:] @ b[:, ::2], ta.T[:, 1:] @ tb[:, ::2], atol=1e-5)  # transposed, sliced, strided
    c, tc = pair(random_array((2, 3, 4)), device)
    d, td = pair(random_array((4, 2, 3)), device)
    assert_close(c.permute(1, 0, 2) @ d.permute(2, 0, 1), tc.permute(1, 0, 2) @ td.permute(2, 0, 1), atol=1e-5)
    for dtype in (np.int32, np.int64, np.uint8):
        e, te = pair(random_array((3, 17), dtype, seed=1), device)
        f, tf = pair(random_array((17, 2), dtype, seed=2), device)
        assert_close(e @ f, te @ tf)  # integer dtypes are kept (and wrap like torch's)
        assert_close(em.matmul(e, f), torch.matmul(te, tf))


def test_matrix_product_variants(device: str) -> None:
    a, ta = pair(random_array((3, 4)), device)
    b, tb = pair(random_array((4, 5), seed=1), device)
    v, tv = pair(random_array((4,), seed=2), device)
    w, tw = pair(random_array((3,), seed=3), device)
    c, tc = pair(random_array((3, 5), seed=4), device)
    assert_close(a.mm(b), ta.mm(tb), atol=1e-5)
    assert_close(a.mv(v), ta.mv(tv), atol=1e-5)
    assert_close(v.dot(v), tv.dot(tv), atol=1e-5)
    assert_close(w.outer(v), tw.outer(tv))
    assert_close(c.addmm(a, b, beta=0.5, alpha=2.0), tc.addmm(ta, tb, beta=0.5, alpha=2.0), atol=1e-5)
    x, tx = pair(random_array((2, 3, 4), seed=5), device)
    y, ty = pair(random_array((2, 4, 1), seed=6), device)
    assert_close(x.bmm(y), tx.bmm(ty), atol=1e-5)
    assert_close(em.bmm(x, y), torch.bmm(tx, ty), atol=1e-5)


def test_matmul_errors(device: str) -> None:
    a = em.ones(2, 3, device=device)
    with pytest.raises(em.ShapeError, match=r"\(2, 3\) and \(4, 5\).*inner dims differ"):
        a @ em.ones(4, 5, device=device)
    with pytest.raises(em.ShapeError, match=r"at least 1 dim.*\(\)"):
        a @ em.tensor(1.0, device=device)
    with pytest.raises(em.ShapeError, match=r"\(2, 2, 3\).*\(3, 3, 4\)"):
        em.ones(2, 2, 3, device=device) @ em.ones(3, 3, 4, device=device)
    with pytest.raises(em.DTypeError, match="same dtype.*float32 and float64"):
        a @ em.ones(3, 2, dtype=em.float64, device=device)
    with pytest.raises(em.DTypeError, match="bool"):
        a.bool() @ em.ones(3, 2, device=device).bool()
    with pytest.raises(em.ShapeError, match=r"mm: both arguments must be 2-d.*\(3,\)"):
        a.mm(em.ones(3, device=device))
    with pytest.raises(em.ShapeError, match=r"bmm.*\(2, 3\)"):
        a.bmm(a)
    with pytest.raises(em.ShapeError, match=r"dot.*\(3,\) and \(2,\)"):
        em.ones(3, device=device).dot(em.ones(2, device=device))


def test_matmul_bias_relu_is_one_kernel(device: str) -> None:
    a = em.randn(8, 16, device=device).realize()
    b = em.randn(16, 4, device=device).realize()
    bias = em.randn(4, device=device).realize()
    with em.profile() as profile:
        (a @ b + bias).relu().realize()
    assert len(profile.kernels) == 1, str(profile)


EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ij", [(3, 4)]),  # implicit output: i j
    ("ba", [(3, 4)]),  # implicit output sorted: a b (a transpose)
    ("bA,ba", [(2, 3), (2, 3)]),  # uppercase sorts before lowercase
    ("ii", [(4, 4)]),  # trace
    ("ii->i", [(4, 4)]),  # diagonal
    ("iji->j", [(3, 2, 3)]),  # repeated index across non-adjacent dims
    ("i,i", [(5,), (5,)]),  # dot
    ("i,j->ij", [(3,), (4,)]),  # outer
    ("i,j->", [(3,), (4,)]),  # everything summed
    ("...ij,...jk", [(2, 1, 3, 4), (5, 4, 2)]),  # broadcasting ellipsis, implicit output
    ("i...->...", [(2, 4, 3)]),
    ("...ij->ij", [(2, 3, 4)]),  # ellipsis dims summed when left out of the output
    ("ij,jk", [(2, 1), (3, 4)]),  # a size-1 label broadcasts
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("i j , j k -> i k", [(2, 3), (3, 2)]),  # spaces are ignored
]


def test_einsum(device: str) -> None:
    for case, (equation, shapes) in enumerate(EINSUM_CASES):
        arrays = [random_array(shape, seed=case * 10 + index) for index, shape in enumerate(shapes)]
        operands = [pair(array, device) for array in arrays]
        result = em.einsum(equation, *[operand for operand, _ in operands])
        expected = torch.einsum(equation, *[operand for _, operand in operands])
        assert_close(result, expected, atol=1e-5)
    a, ta = pair(random_array((4, 3), np.float64), device)
    b, tb = pair(random_array((4, 5), np.float64, seed=1), device)
    assert_close(em.einsum("ji,jk->ik", [a, b]), torch.einsum("ji,jk->ik", [ta, tb]))  # operands as a list
    assert_close(em.einsum("ij,ik->jk", a.T.T, b[:, :]), torch.einsum("ij,ik->jk", ta, tb))
    c, tc = pair(random_array((3, 3), np.int32), device)
    assert_close(em.einsum("ij,jk->ik", c, c), torch.einsum("ij,jk->ik", tc, tc))


def test_einsum_errors(device: str) -> None:
    a = em.ones(3, 3, device=device)
    with pytest.raises(ValueError, match="output subscript k does not appear"):
        em.einsum("ij->k", a)
    with pytest.raises(ValueError, match="output subscript i appears more than once"):
        em.einsum("ij->ii", a)
    with pytest.raises(em.ShapeError, match=r"number of subscripts in the equation \(3\).*\(3, 3\)"):
        em.einsum("ijk", a)
    with pytest.raises(ValueError, match="fewer operands"):
        em.einsum("ij,jk", a)
    with pytest.raises(ValueError, match="invalid subscript '1'"):
        em.einsum("i1", a)
    with pytest.raises(em.ShapeError, match="subscript j has size 4 for operand 1"):
        em.einsum("ij,jk", a, em.ones(4, 2, device=device))
    with pytest.raises(em.ShapeError, match="subscript i is repeated for operand 0.*3 != 2"):
        em.einsum("ii->i", em.ones(3, 2, device=device))
    with pytest.raises(em.ShapeError, match="ellipsis has size 5"):
        em.einsum("...ij,...jk", em.ones(2, 3, 3, device=device), em.ones(5, 3, 3, device=device))
    with pytest.raises(em.DTypeError, match="same dtype"):
        em.einsum("ij,jk", a, a.double())
