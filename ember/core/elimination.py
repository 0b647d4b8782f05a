"""Determinants, inverses and linear solves: Gauss-Jordan elimination with partial pivoting, unrolled over n.

Step j picks the pivot among the rows not yet used (the largest |value| in column j, the first on ties, as LAPACK's
getrf) and clears column j from every other row with the pivot row divided by the pivot. The pivots are the
diagonal of getrf's U, so det = sign(row permutation) * prod(pivots), and the right-hand side columns end up
holding pivot_j * x_j in the row chosen at step j. A zero pivot (a singular matrix) skips its elimination like
getrf, so det is 0 and the solution gets inf/NaN; `info` is the 1-based step of the first zero pivot, as torch's.

Cost: each step is 5 small kernels (an argmax, a row selection, the update), so n steps launch ~5n kernels, but the
steps have one structure, so a new n compiles ~12 kernels (and the backward ~10) whatever its size. Measured on the
C backend (2 shared cores): a 16 x 16 inverse takes 0.15 s once compiled, 64 x 64 0.8 s, 128 x 128 4 s and
256 x 256 9 s, so this suits the small matrices of geometry and statistics (n up to ~64); n above UNROLL_LIMIT is
refused, and large systems want a blocked factorization, which ember does not have. Gradients are those of the
composition, i.e. what torch's formulas give (A^-T for log|det|, -A^-T g A^-T for the inverse), except at an
exactly singular matrix, where torch's det uses an SVD.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple, cast

from ember.core import dtype as dtypes
from ember.core.elementwise import where
from ember.core.errors import DTypeError, LinAlgError, ShapeError
from ember.core.shapes import broadcast_shapes
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

UNROLL_LIMIT = 256  # n above this is refused: the graph (and kernel count) grows with n


class Elimination(NamedTuple):
    """The outcome of an elimination: the pivots in step order (..., n), the step at which each row was the pivot
    row (..., n) int64, and the solution (..., n, k) when right-hand sides were given."""

    pivots: Tensor
    row_steps: Tensor
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

    Every step has the same structure, so its kernels compile once for all n steps (and no kernel grows with n):
    it always eliminates column 0 and then rotates the columns left by one (a view), and the state between steps
    is stored: the matrix, and per row the number of steps since it was the pivot row (negative while unused). The
    pivot row keeps its pivot (the others are cleared with the row divided by it, so cleared entries are exact
    zeros); at the end each row holds its pivot in its step's column and pivot * x in the right-hand side part.
    """
    size = matrix.shape[-1]
    lead = matrix.shape[:-2]
    if size == 0:
        empty = matrix._full(lead + (0,), 0, matrix.dtype, matrix.device)
        return Elimination(empty, empty.cast(dtypes.int64), rhs)
    from ember.core.movement import cat

    keep = [None] * len(lead)
    work = matrix if rhs is None else cat([matrix, rhs], -1)
    age = matrix._full(lead + (size,), -size - 1, dtypes.int64, matrix.device)
    for _ in range(size):
        column = work.shrink(keep + [None, (0, 1)]).squeeze(-1)  # (..., n)
        chosen = where(age >= 0, -1.0, column.abs()).argmax(-1)  # a used row never wins: |x| >= 0 > -1
        is_pivot = age._arange_primitive(size, dtypes.int64, age.device) == chosen.unsqueeze(-1)  # (..., n)
        pivot_row = where(is_pivot.unsqueeze(-1), work, 0.0).sum(-2)  # (..., width): a select, exact
        pivot = pivot_row.shrink(keep + [(0, 1)])
        singular = pivot == 0  # a zero column: nothing to eliminate (as getrf)
        normalized = (pivot_row / where(singular, 1.0, pivot)).unsqueeze(-2)
        factors = where(is_pivot.logical_or(singular), 0.0, column).unsqueeze(-1)
        updated = where(is_pivot.unsqueeze(-1), pivot_row.unsqueeze(-2), work - factors * normalized)
        work = updated.roll(-1, -1).contiguous()
        age = where(is_pivot, 0, age + 1).contiguous()
    row_steps = (size - 1) - age  # (..., n): the step at which each row was the pivot row
    steps = matrix._arange_primitive(size, dtypes.int64, matrix.device)
    # after n rotations the right-hand side comes first and the matrix part after it, column j holding step j
    width = work.shape[-1]
    matrix_part = work.shrink(keep + [None, (width - size, width)])
    own_column = row_steps.unsqueeze(-1) == steps  # (..., n rows, n columns)
    row_pivots = where(own_column, matrix_part, 0.0).sum(-1)  # (..., n): each row's pivot
    by_step = row_steps.unsqueeze(-2) == steps.unsqueeze(-1)  # (..., n steps, n rows)
    pivots = where(by_step, row_pivots.unsqueeze(-2), 0.0).sum(-1)  # (..., n) in step order
    solution = None
    if rhs is not None:
        # row j of the solution is (pivot * x_j) / pivot from the row that was the pivot row at step j; a zero
        # pivot (a singular system) gives inf and NaN, as torch's triangular solves
        scaled = work.shrink(keep + [None, (0, width - size)]) / row_pivots.unsqueeze(-1)
        solution = where(by_step.unsqueeze(-1), scaled.unsqueeze(-3), 0.0).sum(-2)
    return Elimination(pivots, row_steps, solution)


def permutation_sign(row_steps: Tensor, dtype: dtypes.DType) -> Tensor:
    """+1 or -1: the parity of the row permutation, from its inversions (those of its inverse, row_steps (..., n),
    have the same parity)."""
    size = row_steps.shape[-1]
    positions = row_steps._arange_primitive(size, dtypes.int64, row_steps.device)
    later = positions.unsqueeze(0) > positions.unsqueeze(1)  # [r, s] = s > r
    inverted = (row_steps.unsqueeze(-1) > row_steps.unsqueeze(-2)).logical_and(later)
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
    assert outcome.solution is not None  # right-hand sides were given
    return outcome.solution, first_zero_pivot(outcome.pivots)


class EliminationOps(TensorBase):
    """Mixin: det, logdet, slogdet, inverse and matrix_power on batches of square matrices."""

    __slots__ = ()

    def det(self) -> Tensor:
        """The determinant of each square matrix of the batch (..., n, n) -> (...)."""
        check_square(cast("Tensor", self), "linalg.det")
        outcome = eliminate(cast("Tensor", self))
        return permutation_sign(outcome.row_steps, self.dtype) * outcome.pivots.prod(-1)

    def slogdet(self) -> SignLogAbsDet:
        """(sign, log |det|) of each square matrix: the log is a sum of logs, so it does not overflow."""
        check_square(cast("Tensor", self), "linalg.slogdet")
        outcome = eliminate(cast("Tensor", self))
        sign = permutation_sign(outcome.row_steps, self.dtype) * outcome.pivots.sign().prod(-1)
        return SignLogAbsDet(sign, outcome.pivots.abs().log().sum(-1))

    def logdet(self) -> Tensor:
        """log(det) of each square matrix: NaN for a negative determinant, -inf for 0, as torch."""
        check_square(cast("Tensor", self), "logdet")
        sign, logarithm = self.slogdet()
        return where(sign == -1, float("nan"), logarithm)

    def inverse(self) -> Tensor:
        """The inverse of each square matrix (a singular one gives inf/NaN, not an error: that would read the data;
        ember.linalg.inv_ex(A, check_errors=True) checks)."""
        check_square(cast("Tensor", self), "linalg.inv")
        size = self.shape[-1]
        identity = (self._arange_primitive(size, dtypes.int64, self.device).unsqueeze(1)
                    == self._arange_primitive(size, dtypes.int64, self.device)).cast(self.dtype)
        return solve_system(cast("Tensor", self), identity.expand(self.shape[:-2] + (size, size)), "linalg.inv")[0]

    def matrix_exp(self) -> Tensor:
        """e^A of each square matrix: a degree-18 Taylor polynomial of A / 2^s, squared s times, where s brings the
        largest 1-norm in the batch to at most 1/2 (read back from the device: one synchronization)."""
        if self.ndim < 2 or self.shape[-1] != self.shape[-2]:
            shape = f"{self.shape[-2]} by {self.shape[-1]}" if self.ndim >= 2 else f"{self.ndim}-d"
            raise ShapeError(f"linalg.matrix_exp: A must be batches of square matrices, but they are {shape} matrices")
        if not self.dtype.is_float:
            raise DTypeError(f"linalg.matrix_exp: expected a floating point tensor, got {self.dtype.name}")
        size = self.shape[-1]
        identity = (self._arange_primitive(size, dtypes.int64, self.device).unsqueeze(1) ==
                    self._arange_primitive(size, dtypes.int64, self.device)).cast(self.dtype)
        if self.numel() == 0:
            return cast("Tensor", self)
        norm = float(self._detached_copy().abs().sum(-2).amax().item())
        squarings = max(0, math.ceil(math.log2(norm / 0.5))) if math.isfinite(norm) and norm > 0.5 else 0
        scaled = self * (0.5**squarings) if squarings else self
        result = identity.expand(self.shape)
        for degree in range(18, 0, -1):  # Horner: I + A/1 (I + A/2 (I + ...))
            result = identity + scaled.matmul(result) * (1.0 / degree)
        for _ in range(squarings):
            result = result.matmul(result)
        return result

    def matrix_power(self, n: int) -> Tensor:
        """The n-th power of each square matrix by repeated squaring (the inverse's power for n < 0; I for 0)."""
        import operator

        exponent = operator.index(n)
        if self.ndim < 2 or self.shape[-1] != self.shape[-2]:
            raise ShapeError(f"matrix_power: expected a batch of square matrices, got shape {self.shape}")
        base = self.inverse() if exponent < 0 else cast("Tensor", self)
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
        assert result is not None  # exponent > 0: its lowest set bit set result
        return result


class SignLogAbsDet(NamedTuple):
    """slogdet's result, like torch's named tuple."""

    sign: Tensor
    logabsdet: Tensor
