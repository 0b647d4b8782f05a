"""Vector and matrix norms with torch.linalg's semantics: vector_norm, matrix_norm and norm.

The compositions are written for torch's gradients: zeros never reach a power with a negative exponent (a select
feeds the power 1 there and takes an exact 0), so the gradient is 0 where torch masks it (x = 0 for p < 1, a zero
norm), and the inf norms split the gradient among ties like torch's amax.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ember.core.dtype import promote_types, to_dtype
from ember.core.elementwise import where
from ember.core.errors import DTypeError, ShapeError
from ember.core.half_precision import computed_in_float32
from ember.core.reductions import _reduction_axes, _sqrt_zero_gradient_at_zero
from ember.core.shapes import normalize_dim

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

MATRIX_ORDERS = ("fro", "nuc", math.inf, -math.inf, 1, -1, 2, -2)
SINGULAR_VALUE_ORDERS = ("nuc", 2, -2)


def _check_float(tensor: Tensor, name: str, dtype: Any) -> Tensor:
    """The input of a norm: a float tensor, cast to dtype when given (which must not narrow it, as in torch)."""
    if not tensor.dtype.is_float:
        raise DTypeError(f"{name}: expected a floating point tensor, got {tensor.dtype.name}; cast it first (e.g. "
                         ".float())")
    if dtype is None:
        return tensor
    target = to_dtype(dtype)
    if not target.is_float or promote_types(tensor.dtype, target) != target:
        raise DTypeError(f"{name}: the input's dtype {tensor.dtype.name} must convert to dtype={target.name} "
                         "without narrowing")
    return tensor.cast(target)


def _format_order(order: float) -> str:
    return "inf" if order == math.inf else "-inf" if order == -math.inf else f"{order:g}"


@computed_in_float32
def p_norm(tensor: Tensor, order: float, axes: tuple[int, ...], keepdim: bool) -> Tensor:
    """The p-norm over axes of a float tensor (any real p, 0 and +-inf included); no checks."""
    if order == 2:
        squares = (tensor * tensor).sum(axes, keepdim=keepdim)
        # (the where that gives torch's zero gradient at 0 only where a gradient is recorded)
        return _sqrt_zero_gradient_at_zero(squares) if squares._requires_grad else squares.sqrt()
    if order == 0:
        # the count of non-zeros, plus an exact zero that keeps torch's (zero) gradient connected
        no = tensor._full(tensor.shape, False, to_dtype("bool"), tensor.device)
        return (tensor != 0).cast(tensor.dtype).sum(axes, keepdim=keepdim) + where(no, tensor, 0).sum(axes, keepdim)
    absolute = tensor.abs()
    if order == 1:
        return absolute.sum(axes, keepdim=keepdim)
    if order == math.inf:
        return absolute.amax(axes, keepdim)
    if order == -math.inf:
        return absolute.amin(axes, keepdim)
    nonzero = absolute != 0
    powered = where(nonzero, where(nonzero, absolute, 1) ** order, 0.0 if order > 0 else math.inf)
    total = powered.sum(axes, keepdim=keepdim)
    if order < 0:
        return total ** (1.0 / order)
    positive = total != 0
    return where(positive, where(positive, total, 1) ** (1.0 / order), 0.0)


def vector_norm(x: Tensor, ord: float = 2, dim: int | Sequence[int] | None = None,  # noqa: A002 - torch's names
                keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """torch.linalg.vector_norm: (sum |x|^ord)^(1/ord) over dim (every dim by default); ord 0 counts non-zeros,
    inf/-inf are the largest/smallest |x|."""
    if isinstance(ord, bool) or not isinstance(ord, numbers.Real):
        raise TypeError(f"linalg.vector_norm: ord must be a number, got {ord!r} (matrix norms such as 'fro' are "
                        "linalg.matrix_norm's)")
    source = _check_float(x, "linalg.vector_norm", dtype)
    axes = _reduction_axes(dim, source.ndim, "linalg.vector_norm")
    if ord < 0 or ord == math.inf:
        empty = [axis for axis in axes if source.shape[axis] == 0]
        if empty:
            raise ShapeError(f"linalg.vector_norm: cannot compute the {_format_order(ord)} norm over the zero-size dim "
                             f"{empty[0]} of the shape {source.shape}: the operation has no identity")
    return p_norm(source, float(ord), axes, keepdim)


def matrix_norm(A: Tensor, ord: Any = "fro", dim: Sequence[int] = (-2, -1),  # noqa: A002, N803 - torch's names
                keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """torch.linalg.matrix_norm over the two dims of dim: 'fro', or inf/-inf (largest/smallest absolute row sum),
    1/-1 (column sum). The norms of singular values ('nuc', 2, -2) need an SVD, which ember does not have."""
    if A.ndim < 2:
        raise ShapeError(f"linalg.matrix_norm: the input needs at least 2 dims, got shape {A.shape}")
    source = _check_float(A, "linalg.matrix_norm", dtype)
    dims = tuple(dim)
    if len(dims) != 2:
        raise ShapeError(f"linalg.matrix_norm: dim must be a 2-tuple, got {dim!r}")
    first, second = (normalize_dim(axis, source.ndim, "linalg.matrix_norm") for axis in dims)
    if first == second:
        raise ShapeError(f"linalg.matrix_norm: the dims must be different, got {dims}")
    if ord in SINGULAR_VALUE_ORDERS and not isinstance(ord, bool):
        raise NotImplementedError(f"linalg.matrix_norm: ord={ord!r} is a norm of the singular values, which needs an "
                                  "SVD; ember has none yet (use 'fro', 1, -1, inf or -inf)")
    if ord == "fro":
        return p_norm(source, 2.0, tuple(sorted((first, second))), keepdim)
    if isinstance(ord, bool) or ord not in MATRIX_ORDERS:
        raise ValueError(f"linalg.matrix_norm: order {ord!r} is not supported; valid: 'fro', 'nuc', inf, -inf, 1, "
                         "-1, 2, -2")
    if abs(ord) == math.inf:  # the inf norm is the 1 norm of the transposed matrix
        first, second = second, first
    sums = source.abs().sum(first, keepdim=keepdim)
    if not keepdim and first < second:
        second -= 1
    return sums.amax(second, keepdim) if ord > 0 else sums.amin(second, keepdim)


def norm(A: Tensor, ord: Any = None, dim: int | Sequence[int] | None = None,  # noqa: A002, N803 - torch's names
         keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """torch.linalg.norm: a vector norm over one dim (or the whole flattened tensor when ord and dim are None), a
    matrix norm over two dims (or of a 2-d input given only ord)."""
    if dim is not None:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        if len(dims) == 1:
            return vector_norm(A, 2 if ord is None else ord, dims, keepdim, dtype=dtype)
        if len(dims) == 2:
            return matrix_norm(A, "fro" if ord is None else ord, dims, keepdim, dtype=dtype)
        raise ShapeError(f"linalg.norm: dim must have 1 or 2 dims, got {dim!r}")
    if ord is None:
        return vector_norm(A, 2, None, keepdim, dtype=dtype)
    if A.ndim == 1:
        return vector_norm(A, ord, None, keepdim, dtype=dtype)
    if A.ndim == 2:
        return matrix_norm(A, ord, (-2, -1), keepdim, dtype=dtype)
    raise ShapeError(f"linalg.norm: when ord is given without dim the input must be 1-d or 2-d, got shape {A.shape}")
