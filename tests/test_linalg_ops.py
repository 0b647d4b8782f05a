"""det, slogdet, logdet, inverse and ember.linalg (inv, solve, norms, matrix_power, ...) against torch: values,
dtypes, errors and gradients, with batches, pivoting, singular and empty matrices."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ember as em
import ember.linalg as linalg
from ember.core.elimination import UNROLL_LIMIT
from tests.gradcheck import Case, check_gradients
from tests.helpers import BatchedChecks, pair, random_array, require_dtypes

PIVOTING = np.array([[0.0, 2.0, 1.0], [1.0, 0.0, 3.0], [4.0, 1.0, 0.0]], dtype=np.float32)  # a zero first pivot
SINGULAR = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]], dtype=np.float32)  # rank 2


def conditioned(shape: tuple[int, ...], seed: int = 0, dtype: type = np.float32) -> np.ndarray:
    """Random matrices kept away from singular (the identity times n added)."""
    return (random_array(shape, np.float64, seed=seed) + shape[-1] * np.eye(shape[-1]) * 0.7).astype(dtype)


def test_determinants(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    for shape, seed in (((1, 1), 0), ((2, 2), 1), ((4, 4), 2), ((2, 3, 5, 5), 3)):
        a, ta = pair(random_array(shape, seed=seed), device)
        check(a.det(), ta.det(), f"det {shape}")
        check(linalg.det(a), torch.linalg.det(ta))
        check(tuple(a.slogdet()), tuple(ta.slogdet()), f"slogdet {shape}")
        check(a.logdet(), ta.logdet(), f"logdet {shape} (NaN where det < 0)")
    p, tp = pair(PIVOTING, device)
    check(p.det(), tp.det(), "pivoting")
    check(p.T.det(), tp.T.det(), "transposed view")
    s, ts = pair(SINGULAR, device)
    check(s.det(), ts.det(), "singular", atol=1e-6)
    check(tuple(linalg.slogdet(em.zeros(2, 2, device=device))), tuple(torch.linalg.slogdet(torch.zeros(2, 2))))
    check(em.zeros(3, 0, 0, device=device).det(), torch.zeros(3, 0, 0).det(), "empty matrices: 1")
    check(em.zeros(0, 2, 2, device=device).det(), torch.zeros(0, 2, 2).det(), "empty batch")
    check.verify()
    require_dtypes(device, em.float64)
    doubles, torch_doubles = pair(random_array((3, 6, 6), np.float64, seed=4), device)
    assert_checks = BatchedChecks(atol=1e-10, rtol=1e-9)
    assert_checks(doubles.det(), torch_doubles.det(), "float64")
    assert_checks.verify()


def test_inverse_and_solve(device: str) -> None:
    check = BatchedChecks(atol=1e-4, rtol=1e-4)
    a, ta = pair(conditioned((2, 4, 4)), device)
    check(a.inverse(), ta.inverse(), "inverse")
    check(linalg.inv(a[0]), torch.linalg.inv(ta[0]))
    p, tp = pair(PIVOTING, device)
    check(p.inverse(), tp.inverse(), "pivoting")
    inverse, info = linalg.inv_ex(p)
    check(inverse, torch.linalg.inv_ex(tp).inverse)
    check(info, torch.linalg.inv_ex(tp).info)
    s, ts = pair(np.stack([SINGULAR, PIVOTING]), device)
    check(linalg.inv_ex(s).info, torch.linalg.inv_ex(ts).info, "info: the first zero pivot")
    vector, torch_vector = pair(random_array((4,), seed=1), device)
    vectors, torch_vectors = pair(random_array((2, 4), seed=2), device)
    matrix, torch_matrix = pair(random_array((4, 3), seed=3), device)
    batch, torch_batch = pair(random_array((5, 1, 4, 2), seed=4), device)
    check(linalg.solve(a, vector), torch.linalg.solve(ta, torch_vector), "vector")
    check(linalg.solve(a, vectors), torch.linalg.solve(ta, torch_vectors), "batch of vectors")
    check(linalg.solve(a, matrix), torch.linalg.solve(ta, torch_matrix), "matrix, broadcast batch")
    check(linalg.solve(a, batch), torch.linalg.solve(ta, torch_batch), "broadcast batches")
    check(linalg.solve(a[0], matrix.T, left=False), torch.linalg.solve(ta[0], torch_matrix.T, left=False), "XA = B")
    result, info = linalg.solve_ex(p, matrix[:3])
    check(result, torch.linalg.solve_ex(tp, torch_matrix[:3]).result)
    check(info, torch.linalg.solve_ex(tp, torch_matrix[:3]).info)
    check(em.zeros(0, 0, device=device).inverse(), torch.zeros(0, 0).inverse(), "0 x 0")
    check(linalg.solve(em.zeros(2, 0, 0, device=device), em.zeros(2, 0, 3, device=device)),
          torch.linalg.solve(torch.zeros(2, 0, 0), torch.zeros(2, 0, 3)))
    check.verify()
    singular_inverse = linalg.inv(em.tensor(SINGULAR, device=device)).numpy()
    assert not np.isfinite(singular_inverse).all(), "a singular matrix gives inf/NaN, as torch.linalg.inv_ex"
    with pytest.raises(linalg.LinAlgError, match=r"batch element 0.*diagonal element 3 is zero"):
        linalg.inv_ex(s, check_errors=True)
    with pytest.raises(linalg.LinAlgError, match="singular"):
        linalg.solve_ex(em.zeros(2, 2, device=device), em.ones(2, device=device), check_errors=True)


def test_larger_systems_compile_once(device: str) -> None:
    """The elimination steps share their kernels: a 24 x 24 inverse compiles no more kernels than a 6 x 6 one,
    and is still accurate."""
    a, ta = pair(conditioned((24, 24), seed=5), device)
    b, tb = pair(conditioned((6, 6), seed=6), device)
    with em.profile() as small:
        b.inverse().realize()
    with em.profile() as large:
        inverse = a.inverse().realize()
    assert len(large.compiles) <= len(small.compiles) + 1, (len(small.compiles), len(large.compiles))
    check = BatchedChecks(atol=1e-4, rtol=1e-3)
    check(inverse, ta.inverse())
    check(a.det(), ta.det(), rtol=1e-3)
    check.verify()


def test_norms(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    x, tx = pair(random_array((3, 4, 5)), device)
    x[0, 0, :2] = 0.0
    tx[0, 0, :2] = 0.0
    for order in (2, 1, 0, 3, 0.5, -1, -2.5, math.inf, -math.inf):
        check(linalg.vector_norm(x, order), torch.linalg.vector_norm(tx, order), f"vector_norm {order}")
        check(linalg.vector_norm(x, order, dim=(-1, 0), keepdim=True),
              torch.linalg.vector_norm(tx, order, dim=(-1, 0), keepdim=True), f"vector_norm {order} dims")
        check(linalg.norm(x, order, dim=1), torch.linalg.norm(tx, order, dim=1), f"norm {order}")
    for order in ("fro", 1, -1, math.inf, -math.inf):
        check(linalg.matrix_norm(x, order), torch.linalg.matrix_norm(tx, order), f"matrix_norm {order}")
        check(linalg.matrix_norm(x, order, dim=(2, 0), keepdim=True),
              torch.linalg.matrix_norm(tx, order, dim=(2, 0), keepdim=True), f"matrix_norm {order} dims")
        check(linalg.norm(x[1], order), torch.linalg.norm(tx[1], order), f"norm 2-d {order}")
    check(linalg.norm(x), torch.linalg.norm(tx), "flattened")
    check(linalg.norm(x[0, 0], 3), torch.linalg.norm(tx[0, 0], 3))
    check(linalg.norm(x, dim=(0, 2)), torch.linalg.norm(tx, dim=(0, 2)))
    halves, torch_halves = pair(random_array((4, 3), np.float16), device)
    check(linalg.vector_norm(halves), torch.linalg.vector_norm(torch_halves), atol=1e-2, rtol=1e-2)
    check(linalg.vector_norm(halves, dtype=em.float32), torch.linalg.vector_norm(torch_halves, dtype=torch.float32),
          atol=1e-3, rtol=1e-3)
    empty, torch_empty = pair(np.zeros((0, 3), dtype=np.float32), device)
    check(linalg.vector_norm(empty), torch.linalg.vector_norm(torch_empty))
    check(linalg.vector_norm(empty, 0), torch.linalg.vector_norm(torch_empty, 0))
    check(linalg.vector_norm(empty, math.inf, dim=1), torch.linalg.vector_norm(torch_empty, math.inf, dim=1))
    check(linalg.matrix_norm(empty), torch.linalg.matrix_norm(torch_empty))
    check.verify()


def test_products_and_powers(device: str) -> None:
    check = BatchedChecks(atol=1e-4, rtol=1e-4)
    a, ta = pair(conditioned((2, 3, 3), seed=1), device)
    for power in (0, 1, 2, 5, -1, -2):
        check(a.matrix_power(power), ta.matrix_power(power), f"matrix_power {power}")
    integers, torch_integers = pair(random_array((3, 3), np.int64, seed=2), device)
    check(linalg.matrix_power(integers, 3), torch.linalg.matrix_power(torch_integers, 3))
    x, tx = pair(random_array((4, 3), seed=3), device)
    y, ty = pair(random_array((3,), seed=4), device)
    check(linalg.vecdot(x, y), torch.linalg.vecdot(tx, ty))
    check(linalg.vecdot(x, x, dim=0), torch.linalg.vecdot(tx, tx, dim=0))
    check(linalg.multi_dot([y, x.T, x, y]), torch.linalg.multi_dot([ty, tx.T, tx, ty]))
    check(linalg.multi_dot([x, x.T]), torch.linalg.multi_dot([tx, tx.T]))
    check(linalg.matmul(x, y), torch.linalg.matmul(tx, ty))
    check.verify()


def test_errors(device: str) -> None:
    square = em.ones(3, 3, device=device)
    with pytest.raises(em.ShapeError, match="square"):
        em.ones(2, 3, device=device).det()
    with pytest.raises(em.ShapeError, match="at least 2 dims"):
        em.ones(3, device=device).inverse()
    with pytest.raises(em.DTypeError, match="float32 or float64"):
        square.long().det()
    with pytest.raises(em.DTypeError, match="float32 or float64"):
        square.half().slogdet()
    with pytest.raises(em.ShapeError, match=f"limit of {UNROLL_LIMIT}"):
        em.zeros(UNROLL_LIMIT + 1, UNROLL_LIMIT + 1, device=device).det()
    with pytest.raises(em.DTypeError, match="same dtype"):
        linalg.solve(square, em.ones(3, device=device, dtype=em.float64))
    with pytest.raises(em.ShapeError, match="incompatible shapes"):
        linalg.solve(square, em.ones(4, 4, device=device))
    with pytest.raises(em.ShapeError, match="left=False"):
        linalg.solve(square, em.ones(3, device=device), left=False)
    with pytest.raises(em.DTypeError, match="floating point"):
        linalg.vector_norm(square.long())
    with pytest.raises(em.DTypeError, match="narrowing"):
        linalg.vector_norm(square, dtype=em.float16)
    with pytest.raises(TypeError, match="ord must be a number"):
        linalg.vector_norm(square, "fro")
    with pytest.raises(em.ShapeError, match="inf norm over the zero-size dim 0"):
        linalg.vector_norm(em.zeros(0, device=device), math.inf)
    with pytest.raises(em.ShapeError, match="-1 norm"):
        linalg.vector_norm(em.zeros(0, 2, device=device), -1, dim=0)
    with pytest.raises(NotImplementedError, match="SVD"):
        linalg.matrix_norm(square, "nuc")
    with pytest.raises(ValueError, match="order 3"):
        linalg.matrix_norm(square, 3)
    with pytest.raises(em.ShapeError, match="must be different"):
        linalg.matrix_norm(square, dim=(0, -2))
    with pytest.raises(em.ShapeError, match="1-d or 2-d"):
        linalg.norm(em.ones(2, 2, 2, device=device), 2)
    with pytest.raises(em.ShapeError, match="1 or 2 dims"):
        linalg.norm(em.ones(2, 2, 2, device=device), dim=(0, 1, 2))
    with pytest.raises(em.ShapeError, match="greater than 1"):
        linalg.vander(square[0], N=1)


def _matrix_cases() -> list[Case]:
    well = conditioned((2, 3, 3), seed=7)
    positive = conditioned((3, 3), seed=8) + 0.0
    return [
        Case("det", lambda a: a.det(), [], data=[well]),
        Case("det_pivoting", lambda a: a.det(), [], data=[PIVOTING]),
        Case("slogdet", lambda a: a.slogdet()[1], [], data=[well]),
        Case("logdet", lambda a: a.logdet(), [], data=[positive @ positive.T]),
        Case("inverse", lambda a: a.inverse(), [], data=[well]),
        Case("inverse_pivoting", lambda a: a.inverse(), [], data=[PIVOTING]),
        Case("solve", lambda a, b: (linalg if isinstance(a, em.Tensor) else torch.linalg).solve(a, b), [],
             data=[well, random_array((2, 3, 2), seed=9)]),
        Case("solve_left_false", lambda a, b: (linalg if isinstance(a, em.Tensor) else torch.linalg).solve(
            a, b, left=False), [], data=[well[0], random_array((4, 3), seed=10)]),
        Case("matrix_power_negative", lambda a: a.matrix_power(-2), [], data=[well]),
    ]


def _norm(name: str, *args: object, **kwargs: object) -> object:
    return lambda x: getattr(linalg if isinstance(x, em.Tensor) else torch.linalg, name)(x, *args, **kwargs)


NORM_DATA = [[[0.0, 1.5, -2.0, 0.0], [3.0, -3.0, 1.0, 0.5], [0.0, 0.0, 0.0, 0.0]]]  # zeros, ties, a zero row

GRADIENT_CASES = [
    *_matrix_cases(),
    *[Case(f"vector_norm_{order}", _norm("vector_norm", order, dim=1), [], data=NORM_DATA)
      for order in (2, 1, 0, 3, 1.5, 0.5, -1, math.inf, -math.inf)],
    Case("vector_norm_all", _norm("vector_norm", 2.5), [(3, 4)]),
    *[Case(f"matrix_norm_{order}", _norm("matrix_norm", order), [], data=NORM_DATA)
      for order in ("fro", 1, -1, math.inf, -math.inf)],
]


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=str)
def test_gradients(case: Case, device: str) -> None:
    check_gradients(case, device)
