"""Determinants, inverses and linear solves: Gauss-Jordan elimination with partial pivoting, unrolled over n.

Step j picks the pivot among the rows not yet used (the largest |value| in column j, the first on ties, as LAPACK's
getrf), divides that row by the pivot and subtracts multiples of it from every other row. The pivots are the
diagonal of getrf's U, so det = sign(row permutation) * prod(pivots); the right-hand side columns end up holding
the solution, row p_j holding row j. A zero pivot (a singular matrix) skips its elimination like getrf, so det is
0 and the solution gets inf/NaN; `info` is the 1-based step of the first zero pivot, as torch's.

Each step is a few small kernels (an argmax, a row selection and the update), so n steps cost ~4n launches, but
the steps share their kernels' structure, so they compile once; the graph is built in Python per step. Fine for the small matrices of geometry and statistics (n up to ~64: see the
limit below); large systems want a blocked factorization, which ember does not have. Gradients are those of the
composition, i.e. the derivatives torch's formulas give (A^-T for log|det|, -A^-T g A^-T for the inverse), except
at an exactly singular matrix, where torch uses an SVD.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from ember.core import dtype as dtypes
from ember.core.elementwise import where
from ember.core.errors import DTypeError, LinAlgError, ShapeError
from ember.core.shapes import broadcast_shapes

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

UNROLL_LIMIT = 256  # n above this is refused: the graph (and kernel count) grows with n


class Elimination(NamedTuple):
    """The outcome of an elimination: pivots (..., n), pivot rows (..., n) int64, solution (..., n, k) or None."""

    pivots: Tensor
    pivot_rows: Tensor
    solution: Tensor | None


def check_square(tensor: Tensor, name: str) -> None:
    """A batch of square float32/float64 matrices, or an error naming what is wrong."""
    if tensor.ndim < 2:
        raise ShapeError(f"{name}: the input needs at least 2 dims (a batch of square matrices), got shape "
                         f"{tensor.shape}")
    if tensor.shape[-1] != tensor.shape[-2]:
        raise ShapeError(f"{name}: expected a batch of square matrices, got {tensor.shape[-2]} by "
                         f"{tensor.shape[-1]} matrices (shape {tensor.shape})")
    if tensor.dtype not in (dtypes.float32, dtypes.float64):
        raise DTypeError(f"{name}: expected a float32 or float64 tensor, got {tensor.dtype.name} (torch's CPU "
                         "factorizations take no integer, bool, float16 or bfloat16 input); cast it first")
    if tensor.shape[-1] > UNROLL_LIMIT:
        raise ShapeError(f"{name}: ember eliminates step by step, unrolled over n; n = {tensor.shape[-1]} is above "
                         f"its limit of {UNROLL_LIMIT}")


def eliminate(matrix: Tensor, rhs: Tensor | None = None) -> Elimination:
    """Gauss-Jordan elimination of a batch of square matrices (..., n, n), with right-hand sides (..., n, k) of
    the same batch shape if given.

    Every step has the same structure, so its kernels compile once for all n steps: it always eliminates column
    0 and then rotates the columns left by one (a view), and the state between steps (the matrix and the mask of
    used rows) is stored. After n steps the right-hand side columns come first.
    """
    from ember.core.movement import cat, stack

    size = matrix.shape[-1]
    lead = matrix.shape[:-2]
    if size == 0:
        empty = matrix._full(lead + (0,), 0, matrix.dtype, matrix.device)
        return Elimination(empty, empty.cast(dtypes.int64), rhs)
    keep = [None] * len(lead)
    work = matrix if rhs is None else cat([matrix, rhs], -1)
    rows = matrix._arange_primitive(size, dtypes.int64, matrix.device)
    used = matrix._full(lead + (size,), False, dtypes.bool_, matrix.device)
    pivots, pivot_rows = [], []
    for _ in range(size):
        column = work.shrink(keep + [None, (0, 1)]).squeeze(-1)  # (..., n)
        chosen = where(used, -1.0, column.abs()).argmax(-1)  # a used row never wins: |x| >= 0 > -1
        is_pivot = rows == chosen.unsqueeze(-1)  # (..., n)
        pivot_row = where(is_pivot.unsqueeze(-1), work, 0.0).sum(-2)  # (..., width): a select, exact
        pivot = pivot_row.shrink(keep + [(0, 1)]).squeeze(-1)
        singular = (pivot == 0).unsqueeze(-1)  # a zero column: nothing to eliminate (as getrf)
        normalized = (pivot_row / where(singular, 1.0, pivot.unsqueeze(-1))).unsqueeze(-2)
        factors = where(is_pivot.logical_or(singular), 0.0, column).unsqueeze(-1)
        updated = where(is_pivot.unsqueeze(-1), normalized, work - factors * normalized)
        work = updated.roll(-1, -1).contiguous()
        used = used.logical_or(is_pivot).contiguous()
        pivots.append(pivot)
        pivot_rows.append(chosen)
    pivot_tensor, row_tensor = stack(pivots, -1), stack(pivot_rows, -1)
    solution = None
    if rhs is not None:
        # row j of the solution is row p_j of the right-hand side part (now the first columns)
        selector = row_tensor.unsqueeze(-1) == rows  # (..., n, n): [j, r] = (r == p_j)
        right = work.shrink(keep + [None, (0, rhs.shape[-1])])
        solution = where(selector.unsqueeze(-1), right.unsqueeze(-3), 0.0).sum(-2)
        # a singular system has no solution: inf and NaN, as torch's triangular solves give
        singular_system = (pivot_tensor == 0).any(-1).unsqueeze(-1).unsqueeze(-1)
        solution = solution / where(singular_system, 0.0, 1.0)
    return Elimination(pivot_tensor, row_tensor, solution)


def permutation_sign(pivot_rows: Tensor, dtype: dtypes.DType) -> Tensor:
    """+1 or -1: the parity of the number of inversions of the pivot row sequence (..., n)."""
    size = pivot_rows.shape[-1]
    steps = pivot_rows._arange_primitive(size, dtypes.int64, pivot_rows.device)
    later = steps.unsqueeze(0) > steps.unsqueeze(1)  # [j, l] = l > j
    inverted = (pivot_rows.unsqueeze(-1) > pivot_rows.unsqueeze(-2)).logical_and(later)
    odd = inverted.cast(dtypes.int64).sum((-2, -1)) % 2
    return (1 - 2 * odd).cast(dtype)


def first_zero_pivot(pivots: Tensor) -> Tensor:
    """torch's `info`: the 1-based position of the first zero pivot, 0 when there is none (int32)."""
    if pivots.shape[-1] == 0:
        return pivots._full(pivots.shape[:-1], 0, dtypes.int32, pivots.device)
    zero = pivots == 0
    return where(zero.any(-1), zero.cast(dtypes.int32).argmax(-1) + 1, 0).cast(dtypes.int32)


def raise_if_singular(info: Tensor, name: str, what: str) -> None:
    """Read info and raise LinAlgError for the first batch element whose elimination met a zero pivot."""
    values = info.reshape(-1).tolist()
    for batch, value in enumerate(values):
        if value:
            where_batch = f"(batch element {batch}): " if info.ndim else ""
            raise LinAlgError(f"{name}: {where_batch}the diagonal element {value} is zero, {what} could not be "
                              "completed because the input matrix is singular")


def solve_system(matrix: Tensor, rhs: Tensor, name: str) -> tuple[Tensor, Tensor]:
    """X with matrix @ X = rhs (batch dims broadcast; rhs (..., n, k)), and the info of each system."""
    batch = broadcast_shapes(matrix.shape[:-2], rhs.shape[:-2], op=name)
    outcome = eliminate(matrix.expand(batch + matrix.shape[-2:]), rhs.expand(batch + rhs.shape[-2:]))
    return outcome.solution, first_zero_pivot(outcome.pivots)


class EliminationOps:
    """Mixin: det, logdet, slogdet, inverse and matrix_power on batches of square matrices."""

    __slots__ = ()

    def det(self: Tensor) -> Tensor:
        """The determinant of each square matrix of the batch (..., n, n) -> (...)."""
        check_square(self, "linalg.det")
        outcome = eliminate(self)
        return permutation_sign(outcome.pivot_rows, self.dtype) * outcome.pivots.prod(-1)

    def slogdet(self: Tensor) -> tuple[Tensor, Tensor]:
        """(sign, log |det|) of each square matrix: the log is a sum of logs, so it does not overflow."""
        check_square(self, "linalg.slogdet")
        outcome = eliminate(self)
        sign = permutation_sign(outcome.pivot_rows, self.dtype) * outcome.pivots.sign().prod(-1)
        return SignLogAbsDet(sign, outcome.pivots.abs().log().sum(-1))

    def logdet(self: Tensor) -> Tensor:
        """log(det) of each square matrix: NaN for a negative determinant, -inf for 0, as torch."""
        check_square(self, "logdet")
        sign, logarithm = self.slogdet()
        return where(sign == -1, float("nan"), logarithm)

    def inverse(self: Tensor) -> Tensor:
        """The inverse of each square matrix (a singular one gives inf/NaN, not an error: that would read the data;
        ember.linalg.inv_ex(A, check_errors=True) checks)."""
        check_square(self, "linalg.inv")
        size = self.shape[-1]
        identity = (self._arange_primitive(size, dtypes.int64, self.device).unsqueeze(1)
                    == self._arange_primitive(size, dtypes.int64, self.device)).cast(self.dtype)
        return solve_system(self, identity.expand(self.shape[:-2] + (size, size)), "linalg.inv")[0]

    def matrix_power(self: Tensor, n: int) -> Tensor:
        """The n-th power of each square matrix by repeated squaring (the inverse's power for n < 0; I for 0)."""
        import operator

        exponent = operator.index(n)
        if self.ndim < 2 or self.shape[-1] != self.shape[-2]:
            raise ShapeError(f"matrix_power: expected a batch of square matrices, got shape {self.shape}")
        base = self.inverse() if exponent < 0 else self
        exponent = abs(exponent)
        size = self.shape[-1]
        if exponent == 0:
            identity = self._arange_primitive(size, dtypes.int64, self.device).unsqueeze(1) == \
                self._arange_primitive(size, dtypes.int64, self.device)
            return identity.cast(self.dtype).expand(self.shape)
        result = None
        while exponent:
            if exponent & 1:
                result = base if result is None else result.matmul(base)
            exponent >>= 1
            if exponent:
                base = base.matmul(base)
        return result


class SignLogAbsDet(NamedTuple):
    """slogdet's result, like torch's named tuple."""

    sign: Tensor
    logabsdet: Tensor
