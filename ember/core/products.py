"""Products, distances and covariances: tensordot, kron, cross, cdist, dist, renorm, cov and corrcoef (torch's)."""

from __future__ import annotations

import math
import numbers
import operator
import warnings
from typing import TYPE_CHECKING, Any, cast

from ember.core import dtype as dtypes
from ember.core.elementwise import where
from ember.core.errors import DTypeError, ShapeError
from ember.core.norms import p_norm, vector_norm
from ember.core.reductions import _sqrt_zero_gradient_at_zero
from ember.core.shapes import broadcast_shapes, normalize_dim, prod
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

CDIST_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist")
CDIST_MM_THRESHOLD = 25  # torch's default mode takes the matmul identity when either side has more rows than this


def _same_dtype(op: str, left: Tensor, right: Tensor) -> None:
    if left.dtype != right.dtype:
        raise DTypeError(f"{op}: expected both inputs to have the same dtype, got {left.dtype.name} and "
                         f"{right.dtype.name}; cast one with .to(dtype)")


def _tensordot_dims(dims: Any, left: Tensor, right: Tensor) -> tuple[list[int], list[int]]:
    """The contracted dims of each side from torch's `dims`: an int n (last n of left, first n of right) or a
    pair of dim lists."""
    if hasattr(dims, "node") and dims.numel() == 1:
        dims = int(dims.item())
    if isinstance(dims, (list, tuple)) or hasattr(dims, "node"):
        if hasattr(dims, "node"):
            dims = dims.tolist()
        if len(dims) != 2:
            raise ShapeError(f"tensordot: dims must be an int or a pair of dim lists, got {dims!r}")
        left_dims, right_dims = ([entry] if isinstance(entry, int) else list(entry) for entry in dims)
        if len(left_dims) != len(right_dims):
            raise ShapeError(f"tensordot: both dim lists must have the same length, got {left_dims} and {right_dims}")
        return ([normalize_dim(dim, left.ndim, "tensordot") for dim in left_dims],
                [normalize_dim(dim, right.ndim, "tensordot") for dim in right_dims])
    count = operator.index(dims)
    if count < 0:
        raise ShapeError(f"tensordot: expects dims >= 0, got dims={count}")
    if count > min(left.ndim, right.ndim):
        raise ShapeError(f"tensordot: dims={count} is more than the dims of the shapes {left.shape} and "
                         f"{right.shape}")
    return list(range(left.ndim - count, left.ndim)), list(range(count))


def _check_cdist(x1: Tensor, x2: Tensor, p: float, compute_mode: str | None) -> None:
    for name, tensor in (("x1", x1), ("x2", x2)):
        if tensor.ndim < 2:
            raise ShapeError(f"cdist: {name} needs at least 2 dims (rows, columns), got shape {tensor.shape}")
        if not tensor.dtype.is_float:
            raise DTypeError(f"cdist: only floating point tensors are supported, {name} is {tensor.dtype.name}")
    _same_dtype("cdist", x1, x2)
    if x1.shape[-1] != x2.shape[-1]:
        raise ShapeError(f"cdist: x1 and x2 must have the same number of columns, got shapes {x1.shape} and "
                         f"{x2.shape}")
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not p >= 0:
        raise ValueError(f"cdist: p must be a non-negative number, got {p!r}")
    if compute_mode is not None and compute_mode not in CDIST_MODES:
        raise ValueError(f"cdist: compute_mode must be one of {', '.join(CDIST_MODES)}, got {compute_mode!r}")


def _euclidean_by_matmul(x1: Tensor, x2: Tensor) -> Tensor:
    """|a - b| from |a|^2 + |b|^2 - 2 a.b, clamped at 0 before the square root (torch's mm mode; the gradient is 0
    where the clamped value is 0, as torch's)."""
    squares1 = (x1 * x1).sum(-1, keepdim=True)
    squares2 = (x2 * x2).sum(-1, keepdim=True)
    squared = squares1 + squares2.mT - 2 * (x1 @ x2.mT)
    return _sqrt_zero_gradient_at_zero(squared.clamp(min=0))


def _largest_difference(difference: Tensor) -> Tensor:
    """max |difference| over the last dim with torch's cdist gradient: the whole gradient to every tie (torch.amax
    would split it among them). The value is the max; each tie adds |d| - |d| (0, but it carries the gradient)."""
    absolute = difference.abs()
    fixed = absolute._detached_copy()
    largest = fixed.amax(-1, keepdim=True)
    carries = (fixed == largest).logical_and(fixed.isfinite())
    return (largest + where(carries, absolute - fixed, 0.0).sum(-1, keepdim=True)).squeeze(-1)


class ProductOps(TensorBase):
    """Mixin: Kronecker and cross products, distances and covariance. Needs the elementwise, reduction and
    movement mixins and matmul."""

    __slots__ = ()

    def kron(self, other: Tensor) -> Tensor:
        """torch.kron: the Kronecker product (block (i, j) is self[i, j] * other), any number of dims."""
        rank = max(self.ndim, other.ndim)
        left = self.reshape((1,) * (rank - self.ndim) + self.shape)
        right = other.reshape((1,) * (rank - other.ndim) + other.shape)
        spread_left = left.reshape(tuple(part for size in left.shape for part in (size, 1)))
        spread_right = right.reshape(tuple(part for size in right.shape for part in (1, size)))
        product = spread_left * spread_right
        return product.reshape(tuple(a * b for a, b in zip(left.shape, right.shape)))

    def cross(self, other: Tensor, dim: int | None = None) -> Tensor:
        """torch.cross: the cross product along dim (size 3 in both), other dims broadcast. Without dim it takes
        the first dim of size 3 of self, as torch does (deprecated there, with a warning)."""
        if dim is None:
            warnings.warn("cross: calling it without dim is deprecated in torch; it takes the first dim of size 3 "
                          "(pass dim=-1 for torch.linalg.cross's behaviour)", UserWarning, stacklevel=2)
            dim = next((axis for axis, size in enumerate(self.shape) if size == 3), None)
            if dim is None:
                raise ShapeError(f"cross: no dim of size 3 in the input of shape {self.shape}")
        return linalg_cross(cast("Tensor", self), other, dim)

    def dist(self, other: Tensor, p: float = 2) -> Tensor:
        """torch.dist: the p-norm of self - other (broadcast, promoted) over every element."""
        difference = self - other
        if not difference.dtype.is_float:
            raise DTypeError(f"dist: expected floating point inputs, got {self.dtype.name} and "
                             f"{getattr(getattr(other, 'dtype', None), 'name', type(other).__name__)}")
        return vector_norm(difference, p)

    def renorm(self, p: float, dim: int, maxnorm: float) -> Tensor:
        """torch.renorm: each slice along dim whose p-norm exceeds maxnorm scaled to norm maxnorm (by
        maxnorm / (norm + 1e-7))."""
        if self.ndim < 2:
            raise ShapeError(f"renorm: the input needs at least 2 dims, got shape {self.shape}")
        if not self.dtype.is_float:
            raise DTypeError(f"renorm: expected a floating point tensor, got {self.dtype.name}")
        if not p > 0:
            raise ValueError(f"renorm: p must be positive, got {p}")
        if not maxnorm >= 0:
            raise ValueError(f"renorm: maxnorm must be >= 0, got {maxnorm}")
        axis = normalize_dim(dim, self.ndim, "renorm")
        norms = p_norm(cast("Tensor", self), float(p), tuple(d for d in range(self.ndim) if d != axis), True)
        factor = where(norms > maxnorm, maxnorm / (norms + 1e-7), 1.0)
        return self * factor.cast(self.dtype)

    def cov(self, *, correction: int = 1, fweights: Tensor | None = None,
            aweights: Tensor | None = None) -> Tensor:
        """torch.cov: the covariance of the variables in the rows of self (observations in the columns), with
        integer frequency weights and float observation weights. Negative weights are not checked (that would read
        them from the device); a non-positive number of degrees of freedom gives inf or NaN, like torch."""
        if self.ndim > 2:
            raise ShapeError(f"cov: expected an input with 2 or fewer dims, got shape {self.shape}")
        if self.dtype.is_bool:
            raise DTypeError("cov: bool inputs are not supported (as in PyTorch); cast to a number dtype")
        correction = operator.index(correction)
        values = self.reshape(1, -1) if self.ndim < 2 else self
        observations = values.shape[1]
        weights = None
        for name, given, want_int in (("fweights", fweights, True), ("aweights", aweights, False)):
            if given is None:
                continue
            if given.ndim > 1:
                raise ShapeError(f"cov: expected {name} to have one or fewer dims, got shape {given.shape}")
            if not (given.dtype.is_int if want_int else given.dtype.is_float):
                kind = "an integer" if want_int else "a floating point"
                raise DTypeError(f"cov: expected {name} to have {kind} dtype, got {given.dtype.name}")
            if given.numel() != observations:
                raise ShapeError(f"cov: expected {name} to have one entry per observation ({observations}), got "
                                 f"{given.numel()}")
            weights = given.reshape(-1) if weights is None else weights * given.reshape(-1)
        if weights is None:
            total = values._full((), observations, dtypes.int64, values.device)
            mean = values.sum(1) / total
            degrees = total - correction
            if observations - correction <= 0:
                warnings.warn("cov(): degrees of freedom is <= 0; correction should be strictly less than the number "
                              "of observations", UserWarning, stacklevel=2)
        else:
            total = weights.sum()
            mean = (values * weights).sum(1) / total
            if correction != 0 and aweights is not None:
                degrees = total - correction * (weights * aweights.reshape(-1)).sum() / total
            else:
                degrees = total - correction
        degrees = where(degrees <= 0, 0, degrees)
        centered = values - mean.unsqueeze(1)
        weighted = centered if weights is None else centered * weights
        return (centered.matmul(weighted.mT.cast(centered.dtype)) / degrees).squeeze()

    def corrcoef(self) -> Tensor:
        """torch.corrcoef: the Pearson correlation coefficients of the rows (cov divided by the standard deviations,
        clipped to [-1, 1])."""
        if self.ndim > 2:
            raise ShapeError(f"corrcoef: expected an input with 2 or fewer dims, got shape {self.shape}")
        covariance = self.cov()
        if covariance.ndim == 0:
            return covariance / covariance  # 1, or NaN for a covariance of 0, inf or NaN
        deviations = covariance.diagonal().sqrt()
        normalized = covariance / deviations.reshape(-1, 1) / deviations.reshape(1, -1)
        return normalized.clamp(-1, 1)


def linalg_cross(input: Tensor, other: Tensor, dim: int = -1) -> Tensor:  # noqa: A002 - torch's names
    """torch.linalg.cross: the cross product along dim (size 3 in both inputs); the other dims broadcast."""
    from ember.core.linalg import check_same_dtype

    check_same_dtype("linalg.cross", input, other)
    if input.ndim != other.ndim:
        raise ShapeError(f"linalg.cross: the inputs must have the same number of dims, got shapes {input.shape} and "
                         f"{other.shape}")
    axis = normalize_dim(dim, input.ndim, "linalg.cross")
    if input.shape[axis] != 3 or other.shape[axis] != 3:
        raise ShapeError(f"linalg.cross: the inputs' dim {dim} must have length 3, got shapes {input.shape} and "
                         f"{other.shape}")
    shape = broadcast_shapes(input.shape, other.shape, op="linalg.cross")
    left, right = input.expand(shape), other.expand(shape)
    # component i is left[i + 1] * right[i + 2] - left[i + 2] * right[i + 1] (indices mod 3)
    return left.roll(-1, axis) * right.roll(-2, axis) - left.roll(-2, axis) * right.roll(-1, axis)


# ---- functions without a method form in torch (torch.tensordot, torch.cdist) ----


def tensordot(a: Tensor, b: Tensor, dims: Any = 2) -> Tensor:
    """torch.tensordot: sum the products over the given dims of a and b; the free dims of a come first, then
    those of b."""
    from ember.core.linalg import check_same_dtype

    check_same_dtype("tensordot", a, b)
    left_dims, right_dims = _tensordot_dims(dims, a, b)
    for left_dim, right_dim in zip(left_dims, right_dims):
        if a.shape[left_dim] != b.shape[right_dim]:
            raise ShapeError(f"tensordot: contracted dims need to match, but the first has size "
                             f"{a.shape[left_dim]} in dim {left_dim} and the second size "
                             f"{b.shape[right_dim]} in dim {right_dim} (shapes {a.shape} and {b.shape})")
    if len(set(left_dims)) != len(left_dims) or len(set(right_dims)) != len(right_dims):
        raise ShapeError(f"tensordot: a dim is contracted twice in {left_dims} / {right_dims}")
    left_free = [dim for dim in range(a.ndim) if dim not in left_dims]
    right_free = [dim for dim in range(b.ndim) if dim not in right_dims]
    inner = prod([a.shape[dim] for dim in left_dims])
    left_shape = tuple(a.shape[dim] for dim in left_free)
    right_shape = tuple(b.shape[dim] for dim in right_free)
    left = a.permute(left_free + left_dims).reshape(prod(left_shape), inner)
    right = b.permute(right_dims + right_free).reshape(inner, prod(right_shape))
    return left.matmul(right).reshape(left_shape + right_shape)


def cdist(x1: Tensor, x2: Tensor, p: float = 2.0, compute_mode: str | None = None) -> Tensor:
    """torch.cdist: the p-norm distance between each row of x1 (..., P, M) and of x2 (..., R, M), batch dims
    broadcast, giving (..., P, R). p = 2 uses the matmul identity when torch would (compute_mode; by default
    when P or R exceeds 25), else the differences directly; gradients follow torch's cdist_backward."""
    _check_cdist(x1, x2, p, compute_mode)
    rows1, rows2 = x1.shape[-2], x2.shape[-2]
    batch = broadcast_shapes(x1.shape[:-2], x2.shape[:-2], op="cdist")
    x1 = x1.expand(batch + x1.shape[-2:])
    x2 = x2.expand(batch + x2.shape[-2:])
    if p == 2 and x1.shape[-1] > 0 and (compute_mode == "use_mm_for_euclid_dist" or (
            compute_mode in (None, CDIST_MODES[0]) and (rows1 > CDIST_MM_THRESHOLD or rows2 > CDIST_MM_THRESHOLD))):
        return _euclidean_by_matmul(x1, x2)
    difference = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # (..., P, R, M), fused into the reduce
    if difference.shape[-1] == 0:  # no columns: every distance is 0 (the inf norm has no identity to reduce)
        return p_norm(difference, 1.0, (difference.ndim - 1,), False)
    if p == math.inf:
        return _largest_difference(difference)
    return p_norm(difference, float(p), (difference.ndim - 1,), False)
