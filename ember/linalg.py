"""ember.linalg: torch.linalg's functions (det, inv, solve, norms, cross, ...) over ember's Tensor compositions."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import NamedTuple

from ember.core import dtype as dtypes
from ember.core.elimination import (
    SignLogAbsDet,
    check_square,
    raise_if_singular,
    solve_system,
)
from ember.core.errors import DTypeError, LinAlgError, ShapeError
from ember.core.norms import matrix_norm, norm, vector_norm
from ember.core.products import linalg_cross as cross
from ember.core.tensor import Tensor

__all__ = [
    "LinAlgError", "cross", "det", "diagonal", "inv", "inv_ex", "matmul", "matrix_norm", "matrix_power", "multi_dot",
    "norm", "slogdet", "solve", "solve_ex", "vander", "vecdot", "vector_norm",
]


class InverseInfo(NamedTuple):
    """inv_ex's result: the inverses and, per matrix, 0 or the 1-based step of the first zero pivot."""

    inverse: Tensor
    info: Tensor


class SolutionInfo(NamedTuple):
    """solve_ex's result: the solutions and, per system, 0 or the 1-based step of the first zero pivot."""

    result: Tensor
    info: Tensor


def det(A: Tensor) -> Tensor:  # noqa: N803 - torch's argument names
    """The determinant of each square matrix of a batch (..., n, n)."""
    return A.det()


def slogdet(A: Tensor) -> SignLogAbsDet:  # noqa: N803
    """(sign, log |det|) of each square matrix."""
    return A.slogdet()


def inv(A: Tensor) -> Tensor:  # noqa: N803
    """The inverse of each square matrix. A singular matrix gives inf/NaN rather than torch's LinAlgError (checking
    would read the data); inv_ex(A, check_errors=True) raises it."""
    return A.inverse()


def inv_ex(A: Tensor, *, check_errors: bool = False) -> InverseInfo:  # noqa: N803
    """(inverse, info) like torch.linalg.inv_ex; check_errors reads info and raises LinAlgError for a singular
    matrix."""
    check_square(A, "linalg.inv_ex")
    size = A.shape[-1]
    rows = A._arange_primitive(size, dtypes.int64, A.device)
    identity = (rows.unsqueeze(1) == rows).cast(A.dtype).expand(A.shape)
    inverse, info = solve_system(A, identity, "linalg.inv_ex")
    if check_errors:
        raise_if_singular(info, "linalg.inv_ex", "the inversion")
    return InverseInfo(inverse, info)


def _solve(A: Tensor, B: Tensor, left: bool, name: str) -> tuple[Tensor, Tensor]:  # noqa: N803
    check_square(A, name)
    if not isinstance(B, Tensor):
        raise TypeError(f"{name}: B must be a Tensor, got {type(B).__name__}")
    if B.dtype != A.dtype:
        raise DTypeError(f"{name}: expected A and B to have the same dtype, got {A.dtype.name} and {B.dtype.name}")
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
    if vector and not left:
        raise ShapeError(f"{name}: a vector B (shape {B.shape}) is not supported with left=False; there the "
                         "solution is B / A.squeeze(-1)")
    rhs = B.unsqueeze(-1) if vector else B
    if rhs.ndim < 2:
        raise ShapeError(f"{name}: B needs at least 1 dim, got shape {B.shape}")
    matrix = A if left else A.mT
    rhs = rhs if left else rhs.mT
    if rhs.shape[-2] != matrix.shape[-1]:
        raise ShapeError(f"{name}: incompatible shapes of A and B for the equation {'AX = B' if left else 'XA = B'} "
                         f"({A.shape[-2]}x{A.shape[-1]} and {B.shape[-2] if B.ndim > 1 else B.shape[-1]}x"
                         f"{B.shape[-1] if B.ndim > 1 else 1}; shapes {A.shape} and {B.shape})")
    solution, info = solve_system(matrix, rhs, name)
    if vector:
        return solution.squeeze(-1), info
    return (solution if left else solution.mT), info


def solve(A: Tensor, B: Tensor, *, left: bool = True) -> Tensor:  # noqa: N803
    """X with A @ X = B (or X @ A = B when left is False); B is a vector, or a batch of vectors, when its shape
    is A's without the last dim, as in torch. A singular A gives inf/NaN (solve_ex can check)."""
    return _solve(A, B, left, "linalg.solve")[0]


def solve_ex(A: Tensor, B: Tensor, *, left: bool = True, check_errors: bool = False) -> SolutionInfo:  # noqa: N803
    """(solution, info) like torch.linalg.solve_ex; check_errors raises LinAlgError for a singular A."""
    solution, info = _solve(A, B, left, "linalg.solve_ex")
    if check_errors:
        raise_if_singular(info, "linalg.solve_ex", "the solve")
    return SolutionInfo(solution, info)


def matrix_power(A: Tensor, n: int) -> Tensor:  # noqa: N803
    return A.matrix_power(n)


def matrix_exp(A: Tensor) -> Tensor:  # noqa: N803
    return A.matrix_exp()


def matmul(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    return input.matmul(other)


def diagonal(A: Tensor, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:  # noqa: N803
    """torch.linalg.diagonal: torch.diagonal with the last two dims as the default plane."""
    return A.diagonal(offset, dim1, dim2)


def vecdot(x: Tensor, y: Tensor, *, dim: int = -1) -> Tensor:
    """The dot product of x and y (broadcast) along dim."""
    if x.dtype != y.dtype:
        raise DTypeError(f"linalg.vecdot: expected x and y to have the same dtype, got {x.dtype.name} and "
                         f"{y.dtype.name}")
    return (x * y).sum(dim, dtype=x.dtype)


def multi_dot(tensors: Sequence[Tensor]) -> Tensor:
    """The product of a chain of matrices (the first may be a vector, and the last), left to right."""
    parts = list(tensors)
    if len(parts) < 2:
        raise ValueError(f"linalg.multi_dot: expected at least 2 tensors, got {len(parts)}")
    for position, part in enumerate(parts):
        allowed = (1, 2) if position in (0, len(parts) - 1) else (2,)
        if part.ndim not in allowed:
            raise ShapeError(f"linalg.multi_dot: tensor {position} must be {' or '.join(f'{d}-d' for d in allowed)}, "
                             f"got shape {part.shape}")
    result = parts[0]
    for part in parts[1:]:
        result = result.matmul(part)
    return result


def vander(x: Tensor, *, N: int | None = None) -> Tensor:  # noqa: N803
    """torch.linalg.vander: increasing powers x^0 .. x^(N-1) of the last dim as a new last dim (batch dims kept)."""
    from ember.core.movement import cat

    if x.ndim < 1:
        raise ShapeError(f"linalg.vander: x needs at least 1 dim, got shape {x.shape}")
    columns = x.shape[-1] if N is None else operator.index(N)
    if columns <= 1:
        raise ShapeError(f"linalg.vander: N must be greater than 1, got {columns}")
    dtype = x.dtype if x.dtype.is_float else dtypes.int64
    ones = x._full(x.shape + (1,), 1, dtype, x.device)
    powers = x.cast(dtype).unsqueeze(-1).expand(x.shape + (columns - 1,)).cumprod(-1)
    return cat([ones, powers], -1)
