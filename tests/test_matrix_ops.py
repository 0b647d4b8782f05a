"""Diagonals, grids, products, distances and covariance (diag ... cov) against torch: values, dtypes, errors and
gradients, including empty tensors, negative dims, integer dtypes and float16."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
import ember.linalg  # noqa: F401 - em.linalg
from ember.core import matrix_structure, products
from tests.gradcheck import Case, check_gradients
from tests.helpers import BatchedChecks, pair, random_array


def function(name: str) -> Any:
    """torch.NAME for torch tensors, ember's function of that name (matrix_structure or products) for ember's."""
    def call(*args: Any, **kwargs: Any) -> Any:
        first = args[0][0] if isinstance(args[0], (list, tuple)) else args[0]
        if isinstance(first, torch.Tensor):
            return getattr(torch, name)(*args, **kwargs)
        return getattr(matrix_structure if hasattr(matrix_structure, name) else products, name)(*args, **kwargs)

    return call


def test_diagonals(device: str) -> None:
    check = BatchedChecks()
    matrix, torch_matrix = pair(random_array((3, 5)), device)
    batch, torch_batch = pair(random_array((2, 4, 3, 4), seed=1), device)
    vector, torch_vector = pair(random_array((4,), seed=2), device)
    for offset in (-4, -1, 0, 2, 5):
        check(matrix.diag(offset), torch_matrix.diag(offset), f"diag 2-d {offset}")
        check(vector.diag(offset), torch_vector.diag(offset), f"diag 1-d {offset}")
        check(matrix.diagonal(offset), torch_matrix.diagonal(offset), f"diagonal {offset}")
        check(batch.diagonal(offset, -1, 1), torch_batch.diagonal(offset, -1, 1), f"diagonal dims {offset}")
        check(batch.diagonal(offset, 2, 0), torch_batch.diagonal(offset, 2, 0))
        check(batch.diag_embed(offset), torch_batch.diag_embed(offset), f"diag_embed {offset}")
        check(batch.diag_embed(offset, 3, 0), torch_batch.diag_embed(offset, 3, 0), f"diag_embed dims {offset}")
        check(batch.diag_embed(offset, -1, -3), torch_batch.diag_embed(offset, -1, -3))
    check(em.linalg.diagonal(batch, offset=1), torch.linalg.diagonal(torch_batch, offset=1))
    check(matrix.trace(), torch_matrix.trace())
    integers, torch_integers = pair(random_array((4, 4), np.int32), device)
    check(integers.trace(), torch_integers.trace())  # int64, as torch
    check(integers.diag(1), torch_integers.diag(1))
    flags, torch_flags = pair(random_array((4,), np.bool_), device)
    check(flags.diag(-1), torch_flags.diag(-1))
    halves, torch_halves = pair(random_array((3, 3), np.float16), device)
    # (torch before 2.13 has no half trace, on the CPU or on CUDA: the reference sums in float64 and rounds)
    check(halves.trace(), torch_halves.double().trace().half(), atol=1e-2)
    check(halves.diag_embed(), torch_halves.diag_embed())
    empty, torch_empty = pair(random_array((0, 3)), device)
    check(empty.diagonal(), torch_empty.diagonal())
    check(empty.trace(), torch_empty.trace())
    check(em.zeros(0, device=device).diag(2), torch.zeros(0).diag(2))
    check.verify()


def test_diagonal_writes(device: str) -> None:
    check = BatchedChecks()
    x, tx = pair(random_array((2, 3, 4)), device)
    for offset, dim1, dim2 in ((0, 0, 1), (1, -1, 1), (-2, 2, 0), (5, 1, 2)):
        shape = tuple(tx.diagonal(offset, dim1, dim2).shape)
        src, torch_src = pair(random_array(shape, seed=1), device)
        check(x.diagonal_scatter(src, offset, dim1, dim2), torch.diagonal_scatter(tx, torch_src, offset, dim1, dim2),
              f"diagonal_scatter {offset} {dim1} {dim2}")
    integers, torch_integers = pair(random_array((3, 3), np.int32), device)
    check(integers.diagonal_scatter(em.ones(3, device=device)),
          torch.diagonal_scatter(torch_integers, torch.ones(3)), "src cast to self's dtype")
    for shape, wrap in (((7, 3), True), ((7, 3), False), ((3, 7), True), ((2, 2, 2), False), ((0, 3), True)):
        filled = em.zeros(*shape, device=device)
        assert filled.fill_diagonal_(2.5, wrap) is filled
        check(filled, torch.zeros(*shape).fill_diagonal_(2.5, wrap), f"fill_diagonal_ {shape} {wrap}")
    check(integers.clone().fill_diagonal_(-1.7), torch_integers.clone().fill_diagonal_(-1.7))
    check.verify()
    with pytest.raises(em.ShapeError, match="must have the shape"):
        x.diagonal_scatter(em.ones(3, device=device))
    with pytest.raises(em.ShapeError, match="one size"):
        x.fill_diagonal_(1.0)


def test_rot90_kron_tensordot(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    a, ta = pair(random_array((2, 3, 4)), device)
    for k in (-3, -1, 0, 1, 2, 3, 6):
        check(a.rot90(k, (0, 1)), ta.rot90(k, (0, 1)), f"rot90 {k}")
        check(a.rot90(k, (-1, 0)), ta.rot90(k, (-1, 0)), f"rot90 {k} dims")
    b, tb = pair(random_array((3, 2), seed=1), device)
    c, tc = pair(random_array((2,), np.int64, seed=2), device)
    check(a.kron(b), ta.kron(tb))
    check(b.kron(c), tb.kron(tc))  # promotion
    check(c.kron(c), tc.kron(tc))
    check(em.tensor(2.5, device=device).kron(b), torch.tensor(2.5).kron(tb))
    check(b.kron(em.zeros(0, 2, device=device)), tb.kron(torch.zeros(0, 2)))
    flags, torch_flags = pair(random_array((2, 2), np.bool_), device)
    check(flags.kron(flags), torch_flags.kron(torch_flags))
    d, td = pair(random_array((4, 3, 5), seed=3), device)
    check(products.tensordot(a, d, ([2, 1], [0, 1])), torch.tensordot(ta, td, ([2, 1], [0, 1])), "lists")
    check(products.tensordot(a, d, ([-1], [0])), torch.tensordot(ta, td, ([-1], [0])), "negative dims")
    e, te = pair(random_array((3, 4, 6), seed=4), device)
    check(products.tensordot(a, e, 2), torch.tensordot(ta, te, 2), "tensordot 2")
    check(products.tensordot(a, b, 0), torch.tensordot(ta, tb, 0), "tensordot 0 (outer)")
    integers, torch_integers = pair(random_array((3, 4), np.int64), device)
    check(products.tensordot(integers, integers.T, 1), torch.tensordot(torch_integers, torch_integers.T, 1))
    check(products.tensordot(em.zeros(2, 0, device=device), em.zeros(0, 3, device=device), 1),
          torch.tensordot(torch.zeros(2, 0), torch.zeros(0, 3), 1))
    check.verify()


def test_cross(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    a, ta = pair(random_array((4, 3)), device)
    b, tb = pair(random_array((1, 3), seed=1), device)
    check(em.linalg.cross(a, b), torch.linalg.cross(ta, tb), "broadcast")
    c, tc = pair(random_array((3, 4, 2), seed=2), device)
    d, td = pair(random_array((3, 4, 2), seed=3), device)
    check(c.cross(d, dim=0), tc.cross(td, dim=0))
    check(c.cross(d, -3), tc.cross(td, -3))
    with pytest.warns(UserWarning, match="without dim"):
        result = c.cross(d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(result, tc.cross(td), "default dim: the first of size 3")
    integers, torch_integers = pair(random_array((2, 3), np.int32), device)
    check(integers.cross(integers.flip(0), dim=1), torch_integers.cross(torch_integers.flip(0), dim=1))
    halves, torch_halves = pair(random_array((3,), np.float16), device)
    check(halves.cross(halves.flip(0), dim=0), torch_halves.cross(torch_halves.flip(0), dim=0), atol=1e-2)
    check(em.zeros(0, 3, device=device).cross(em.zeros(0, 3, device=device), dim=1),
          torch.zeros(0, 3).cross(torch.zeros(0, 3), dim=1))
    check.verify()


def test_grids(device: str) -> None:
    check = BatchedChecks()
    x, tx = pair(random_array((3,)), device)
    y, ty = pair(random_array((2,), seed=1), device)
    z, tz = pair(random_array((4,), seed=2), device)
    for indexing in ("ij", "xy"):
        check(matrix_structure.meshgrid(x, y, z, indexing=indexing), torch.meshgrid(tx, ty, tz, indexing=indexing))
        check(matrix_structure.meshgrid([x, y], indexing=indexing), torch.meshgrid([tx, ty], indexing=indexing))
        check(matrix_structure.meshgrid(x, indexing=indexing), torch.meshgrid(tx, indexing=indexing))
    scalar = em.tensor(2.0, device=device)
    check(matrix_structure.meshgrid(scalar, y, indexing="ij"), torch.meshgrid(torch.tensor(2.0), ty, indexing="ij"))
    with pytest.warns(UserWarning, match="indexing"):
        default = matrix_structure.meshgrid(x, y)
    check(default, torch.meshgrid(tx, ty, indexing="ij"))
    check(matrix_structure.cartesian_prod(x, y, z), torch.cartesian_prod(tx, ty, tz))
    check(matrix_structure.cartesian_prod(x), torch.cartesian_prod(tx))
    integers, torch_integers = pair(random_array((3,), np.int64), device)
    check(matrix_structure.cartesian_prod(integers, integers), torch.cartesian_prod(torch_integers, torch_integers))
    check(matrix_structure.cartesian_prod(em.zeros(0, device=device), y), torch.cartesian_prod(torch.zeros(0), ty))
    m, tm = pair(random_array((2, 3)), device)
    n, tn = pair(random_array((2,), np.int32, seed=3), device)
    check(matrix_structure.block_diag(m, n, scalar, m.T), torch.block_diag(tm, tn, torch.tensor(2.0), tm.T))
    check(matrix_structure.block_diag(em.zeros(0, 3, device=device), m),
          torch.block_diag(torch.zeros(0, 3), tm))
    flags, torch_flags = pair(random_array((2,), np.bool_), device)
    check(matrix_structure.block_diag(flags, flags), torch.block_diag(torch_flags, torch_flags))
    for dtype in (np.float32, np.int32, np.uint8):
        v, tv = pair(random_array((4,), dtype, low=-1.5, high=1.5, seed=4), device)
        for columns in (None, 0, 1, 3, 6):
            for increasing in (False, True):
                check(matrix_structure.vander(v, columns, increasing), torch.vander(tv, columns, increasing),
                      f"vander {dtype.__name__} {columns} {increasing}", atol=1e-5, rtol=1e-5)
    check(matrix_structure.vander(em.zeros(0, device=device)), torch.vander(torch.zeros(0)))
    check(em.linalg.vander(m, N=4), torch.linalg.vander(tm, N=4), atol=1e-5, rtol=1e-5)
    check.verify()
    assert matrix_structure.block_diag().shape == torch.block_diag().shape


def test_triangle_indices(device: str) -> None:
    check = BatchedChecks()
    for row, col in ((3, 4), (4, 3), (1, 1), (0, 3), (5, 5)):
        for offset in (-6, -2, -1, 0, 1, 3, 7):
            check(matrix_structure.tril_indices(row, col, offset, device=device), torch.tril_indices(row, col, offset),
                  f"tril {row} {col} {offset}")
            check(matrix_structure.triu_indices(row, col, offset, device=device), torch.triu_indices(row, col, offset),
                  f"triu {row} {col} {offset}")
    check(matrix_structure.tril_indices(4, 3, dtype=em.int32, device=device),
          torch.tril_indices(4, 3, dtype=torch.int32))
    check.verify()


def test_cdist_dist_renorm(device: str) -> None:
    check = BatchedChecks(atol=1e-4, rtol=1e-4)
    x1, t1 = pair(random_array((2, 1, 5, 3)), device)
    x2, t2 = pair(random_array((3, 4, 3), seed=1), device)
    for p in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, math.inf):
        check(products.cdist(x1, x2, p), torch.cdist(t1, t2, p), f"cdist p={p}")
    big, torch_big = pair(random_array((30, 3), seed=2), device)  # past torch's threshold for the matmul identity
    check(products.cdist(big, x2[0]), torch.cdist(torch_big, t2[0]), "cdist mm")
    check(products.cdist(x2, x2, compute_mode="use_mm_for_euclid_dist"),
          torch.cdist(t2, t2, compute_mode="use_mm_for_euclid_dist"), "cdist forced mm", atol=1e-3)
    check(products.cdist(big, x2[0], compute_mode="donot_use_mm_for_euclid_dist"),
          torch.cdist(torch_big, t2[0], compute_mode="donot_use_mm_for_euclid_dist"))
    check(products.cdist(em.zeros(0, 3, device=device), x2[0]), torch.cdist(torch.zeros(0, 3), t2[0]))
    check(products.cdist(em.zeros(2, 0, device=device), em.zeros(3, 0, device=device), math.inf),
          torch.cdist(torch.zeros(2, 0), torch.zeros(3, 0), math.inf))
    a, ta = pair(random_array((4, 3), seed=3), device)
    b, tb = pair(random_array((3,), np.float64, seed=4), device)
    for p in (0, 1, 2, 3.5, math.inf, -math.inf, -1):
        check(a.dist(b, p), ta.dist(tb, p), f"dist p={p}")
    halves, torch_halves = pair(random_array((4, 3), np.float16, seed=5), device)
    check(halves.dist(halves.flip(0)), torch_halves.dist(torch_halves.flip(0)), atol=1e-2, rtol=1e-2)
    c, tc = pair(random_array((3, 4, 2), seed=6), device)
    for p, dim, maxnorm in ((2, 0, 1.0), (1, -1, 2.0), (3, 1, 0.5), (math.inf, 2, 1.0), (0.5, 0, 30.0)):
        check(c.renorm(p, dim, maxnorm), tc.renorm(p, dim, maxnorm), f"renorm {p} {dim}")
    check(halves.renorm(2, 0, 1.0), torch_halves.renorm(2, 0, 1.0), atol=1e-2, rtol=1e-2)
    check.verify()


def test_cov_corrcoef(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    x, tx = pair(random_array((3, 6)), device)
    frequencies, torch_frequencies = pair(np.array([1, 2, 0, 3, 1, 1]), device)
    weights, torch_weights = pair(random_array((6,), low=0.1, high=2.0, seed=1), device)
    for correction in (0, 1, 2):
        check(x.cov(correction=correction), tx.cov(correction=correction), f"cov {correction}")
        check(x.cov(correction=correction, fweights=frequencies),
              tx.cov(correction=correction, fweights=torch_frequencies), f"cov fweights {correction}")
        check(x.cov(correction=correction, aweights=weights), tx.cov(correction=correction, aweights=torch_weights))
        check(x.cov(correction=correction, fweights=frequencies, aweights=weights),
              tx.cov(correction=correction, fweights=torch_frequencies, aweights=torch_weights))
    check(x[0].cov(), tx[0].cov())
    check(x[:1].cov(), tx[:1].cov())
    integers, torch_integers = pair(random_array((2, 5), np.int32, seed=2), device)
    check(integers.cov(), torch_integers.cov())
    check(integers.cov(fweights=frequencies[:5]), torch_integers.cov(fweights=torch_frequencies[:5]))
    check(x.corrcoef(), tx.corrcoef())
    check(x[1].corrcoef(), tx[1].corrcoef())
    check(integers.corrcoef(), torch_integers.corrcoef())
    halves, torch_halves = pair(random_array((2, 5), np.float16, seed=3), device)
    check(halves.cov(), torch_halves.cov(), atol=1e-2, rtol=1e-2)
    with pytest.warns(UserWarning, match="degrees of freedom"):
        single = x[:, :1].cov()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(single, tx[:, :1].cov(), "one observation: NaN")
        check(em.zeros(0, 3, device=device).cov(), torch.zeros(0, 3).cov())
    check.verify()


def test_errors(device: str) -> None:
    matrix = em.ones(3, 3, device=device)
    with pytest.raises(em.ShapeError, match=r"diag\(\).*\(2, 2, 2\)"):
        em.ones(2, 2, 2, device=device).diag()
    with pytest.raises(em.ShapeError, match="cannot be identical"):
        matrix.diagonal(0, 1, -1)
    with pytest.raises(IndexError, match="out of range"):
        em.ones(3, device=device).diagonal()
    with pytest.raises(em.ShapeError, match="trace.*matrix"):
        em.ones(3, device=device).trace()
    with pytest.raises(em.DTypeError, match="trace.*bool"):
        matrix.bool().trace()
    with pytest.raises(em.ShapeError, match="rotation dims must differ"):
        matrix.rot90(1, (0, -2))
    with pytest.raises(em.ShapeError, match="exactly 2"):
        matrix.rot90(1, (0,))
    with pytest.raises(em.ShapeError, match="contracted dims need to match"):
        products.tensordot(em.ones(3, 4, device=device), matrix, 1)
    with pytest.raises(em.ShapeError, match="dims >= 0"):
        products.tensordot(matrix, matrix, -1)
    with pytest.raises(em.DTypeError, match="same dtype"):
        products.tensordot(matrix, matrix.double(), 1)
    with pytest.raises(em.ShapeError, match="length 3"):
        em.linalg.cross(em.ones(4, 2, device=device), em.ones(4, 2, device=device))
    with pytest.raises(em.ShapeError, match="no dim of size 3"):
        em.ones(2, 4, device=device).cross(em.ones(2, 4, device=device))
    with pytest.raises(em.DTypeError, match="same dtype"):
        em.linalg.cross(matrix, matrix.int())
    with pytest.raises(em.DTypeError, match="floating point"):
        products.cdist(matrix.long(), matrix.long())
    with pytest.raises(em.ShapeError, match="same number of columns"):
        products.cdist(matrix, em.ones(2, 4, device=device))
    with pytest.raises(ValueError, match="non-negative"):
        products.cdist(matrix, matrix, -1.0)
    with pytest.raises(em.DTypeError, match="floating point"):
        matrix.long().dist(matrix.long())
    with pytest.raises(ValueError, match="p must be positive"):
        matrix.renorm(0, 0, 1.0)
    with pytest.raises(em.ShapeError, match="at least 2 dims"):
        em.ones(3, device=device).renorm(2, 0, 1.0)
    with pytest.raises(em.DTypeError, match="fweights.*integer"):
        matrix.cov(fweights=em.ones(3, device=device))
    with pytest.raises(em.ShapeError, match="one entry per observation"):
        matrix.cov(aweights=em.ones(4, device=device))
    with pytest.raises(em.ShapeError, match="2 or fewer dims"):
        em.ones(2, 2, 2, device=device).cov()
    with pytest.raises(em.ShapeError, match="1-d"):
        matrix_structure.cartesian_prod(matrix)
    with pytest.raises(em.DTypeError, match="same dtype"):
        matrix_structure.meshgrid(matrix[0], matrix[0].long(), indexing="ij")
    with pytest.raises(ValueError, match="'ij' or 'xy'"):
        matrix_structure.meshgrid(matrix[0], indexing="ab")
    with pytest.raises(em.ShapeError, match="2 or fewer dims"):
        matrix_structure.block_diag(em.ones(1, 1, 1, device=device))
    with pytest.raises(em.DTypeError, match="integer dtype"):
        matrix_structure.tril_indices(3, 3, dtype=em.float32)
    with pytest.raises(em.ShapeError, match="non-negative"):
        matrix_structure.triu_indices(-1, 3)
    with pytest.raises(em.ShapeError, match="N must be non-negative"):
        matrix_structure.vander(matrix[0], -1)


DISTANCE_TIES = [[[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]], [[0.0, -1.0, 0.0], [0.5, 0.5, 0.5], [1.0, 2.0, 2.0]]]

GRADIENT_CASES = [
    Case("diag_vector", lambda x: x.diag(-2), [(4,)]),
    Case("diag_matrix", lambda x: x.diag(1), [(3, 5)]),
    Case("diagonal", lambda x: x.diagonal(-1, 2, 0), [(4, 2, 3)]),
    Case("diag_embed", lambda x: x.diag_embed(1, 0, -1), [(2, 3)]),
    Case("trace", lambda x: x.trace(), [(4, 3)]),
    Case("diagonal_scatter", lambda x, y: x.diagonal_scatter(y, -1), [(4, 3), (3,)]),
    Case("rot90", lambda x: x.rot90(3, (1, 0)), [(2, 3)]),
    Case("kron", lambda x, y: x.kron(y), [(2, 3), (2, 1, 2)]),
    Case("tensordot", lambda x, y: function("tensordot")(x, y, ([0, 2], [1, 0])), [(2, 3, 4), (4, 2, 5)]),
    Case("cross", lambda x, y: x.cross(y, dim=1), [(2, 3), (2, 3)]),
    Case("block_diag", function("block_diag"), [(2, 3), (2,), ()]),
    Case("meshgrid", lambda x, y: function("meshgrid")(x, y, indexing="xy"), [(3,), (2,)]),
    Case("cartesian_prod", function("cartesian_prod"), [(3,), (2,)]),
    # torch.vander's own backward fails (its cumprod writes in place); the truth is the same formula out of place
    Case("vander", lambda x: function("vander")(x, 4), [(3,)], data=[[0.0, 1.5, -2.0]],
         torch_function=lambda x: torch.cat([torch.ones(3, 1), x.unsqueeze(1).expand(3, 3).cumprod(1)], 1).flip(1)),
    Case("cov", lambda x, w: x.cov(aweights=w.abs() + 0.5), [(3, 5), (5,)]),
    Case("corrcoef", lambda x: x.corrcoef(), [(3, 5)]),
    Case("renorm", lambda x: x.renorm(2, 1, 1.5), [(3, 2, 2)]),
    Case("renorm_p3", lambda x: x.renorm(3, 0, 0.8), [(3, 4)]),
    Case("dist_p2", lambda x, y: x.dist(y), [(3, 2), (2,)]),
    Case("dist_p1_5", lambda x, y: x.dist(y, 1.5), [(3, 2), (2,)]),
    Case("dist_inf", lambda x, y: x.dist(y, math.inf), [(3, 2), (2,)]),
    *[Case(f"cdist_p{p}", lambda x, y, p=p: function("cdist")(x, y, p), [(2, 3, 3), (4, 3)])
      for p in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, math.inf)],
    # ties (the inf norm gives every tie the whole gradient in cdist) and zero differences / coincident rows
    *[Case(f"cdist_ties_p{p}", lambda x, y, p=p: function("cdist")(x, y, p), [], data=DISTANCE_TIES)
      for p in (0.5, 1.5, 2.0, math.inf)],
    Case("cdist_mm", lambda x, y: function("cdist")(x, y), [(27, 3), (4, 3)]),
]


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=str)
def test_gradients(case: Case, device: str) -> None:
    check_gradients(case, device)
