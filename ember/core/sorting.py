"""Sorting and order statistics Tensor methods (sort, argsort, topk, kthvalue, median, mode, quantile) on primitives.

Everything sorts rows with `sort_network.sort_rows` (stable: ties keep their input order; NaN sorts as the largest
value, -0.0 ties with 0.0). Values keep their exact bits. When a gradient is tracked the values are gathered from
the input at the returned indices, so the gradient goes to those elements, as in torch (the global median and
nanmedian split it evenly among the elements equal to the result, as torch does).

Where torch picks among ties by an unstable selection (topk, kthvalue, median and mode indices; topk with
sorted=False), ember returns the first tied element in input order: the values are torch's, the index may be
another element with the same value.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

from ember.core import dtype as dtypes
from ember.core.advanced_indexing import take_last
from ember.core.elementwise import where
from ember.core.errors import DTypeError, ShapeError
from ember.core.read_alike import read_alike
from ember.core.reductions import ValuesIndices
from ember.core.shapes import normalize_dim
from ember.core.sort_network import sort_rows
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


class SortingOps(TensorBase):
    """Mixin: sorting and order statistics. Needs the elementwise, reduction, movement and indexing mixins."""

    __slots__ = ()

    # ---- sorting ---------------------------------------------------------------------------------------------------

    def sort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> ValuesIndices:
        """(values, indices) sorted along dim; stable always (so `stable=` changes nothing), NaN last (first when
        descending), like torch.sort."""
        values, indices = _sort_along(cast("Tensor", self), dim, descending, "sort")
        return ValuesIndices(values, indices)

    def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
        return _sort_along(cast("Tensor", self), dim, descending, "argsort", need_values=False)[1]

    def msort(self) -> Tensor:
        """The values sorted along dim 0 (torch.msort)."""
        return _sort_along(cast("Tensor", self), 0, False, "msort")[0]

    def topk(self, k: int, dim: int = -1, largest: bool = True,
             sorted: bool = True) -> ValuesIndices:  # noqa: A002 - torch's name
        """The k largest (or smallest) values along dim and their indices, sorted (also for sorted=False)."""
        _reject_bool(cast("Tensor", self), "topk")
        axis, size = _axis_and_size(cast("Tensor", self), dim, "topk")
        k = _integer(k, "topk: k")
        if not 0 <= k <= size:
            raise ShapeError(f"topk: selected index k={k} is out of range for dim {dim} of size {size} "
                             f"(shape {self.shape}); valid: 0 to {size}")
        tracked = getattr(self, "requires_grad", False)
        values, indices = _sort_along(cast("Tensor", self), dim, largest, "topk", need_values=not tracked)
        if self.ndim == 0:
            return ValuesIndices(values, indices)
        indices = indices.narrow(axis, 0, k)
        # with a gradient to track, only the k values are gathered from the input (n * k work, not n * n)
        values = self._gather(axis, indices, checked=False) if tracked else values.narrow(axis, 0, k)
        return ValuesIndices(values, indices)

    def kthvalue(self, k: int, dim: int = -1, keepdim: bool = False) -> ValuesIndices:
        """The k-th smallest value along dim (k counts from 1) and its index."""
        _reject_bool(cast("Tensor", self), "kthvalue")
        axis, size = _axis_and_size(cast("Tensor", self), dim, "kthvalue")
        k = _integer(k, "kthvalue: k")
        if not 1 <= k <= size:
            raise ShapeError(f"kthvalue: k={k} is out of range for dim {dim} of size {size} (shape {self.shape}); "
                             f"valid: 1 to {size}")
        values, indices = _sort_along(cast("Tensor", self), dim, False, "kthvalue")
        if self.ndim == 0:
            return ValuesIndices(values, indices)
        return ValuesIndices(_select(values, axis, k - 1, keepdim), _select(indices, axis, k - 1, keepdim))

    # ---- medians and modes ---------------------------------------------------------------------------------------

    def median(self, dim: int | None = None, keepdim: bool = False) -> Any:
        """The lower median (of all elements, or (values, indices) along dim); NaN if the values hold a NaN."""
        return _median(cast("Tensor", self), dim, keepdim, ignore_nan=False, name="median")

    def nanmedian(self, dim: int | None = None, keepdim: bool = False) -> Any:
        """median ignoring NaN (NaN only where every value is NaN)."""
        return _median(cast("Tensor", self), dim, keepdim, ignore_nan=True, name="nanmedian")

    def mode(self, dim: int = -1, keepdim: bool = False) -> ValuesIndices:
        """The most frequent value along dim (the smallest of equally frequent ones) and its last index.

        Counted by comparing every pair (n^2 work per row); each NaN counts as a value of its own.
        """
        axis, size = _axis_and_size(cast("Tensor", self), dim, "mode")
        if self.ndim == 0:
            return ValuesIndices(self, self._full((), 0, dtypes.int64, self.device))
        if size == 0:
            raise ShapeError(f"mode: cannot reduce over the zero-size dim {dim} of a tensor of shape {self.shape}")
        # (the values are compared with each other and with the smallest candidate: one copy, read_alike.py)
        source = self.cast(dtypes.uint8) if self.dtype.is_bool else read_alike(cast("Tensor", self))
        rows = _rows(source, axis)  # [B, n]
        equal = rows.unsqueeze(2) == rows.unsqueeze(1)  # [B, i, j]
        counts = equal.sum(2)
        candidate = counts == counts.amax(1, keepdim=True)
        if rows.dtype.is_float:
            candidate = candidate.logical_and(rows.isnan().logical_not())
            smallest = where(candidate, rows, math.inf).amin(1, keepdim=True)
            smallest = where(candidate.any(1, keepdim=True), smallest, math.nan)  # every value NaN
            matches = (rows == smallest).logical_or(rows.isnan().logical_and(smallest.isnan()))
        else:
            smallest = where(candidate, rows, dtypes.max_value(rows.dtype)).amin(1, keepdim=True)
            matches = rows == smallest
        positions = self._arange_primitive(size, dtypes.int64, self.device)
        last = where(matches, positions, -1).amax(1, keepdim=True)
        if smallest.dtype.is_float:  # an all-NaN row: torch gives its first index
            last = where(smallest.isnan(), 0, last)
        values = _take_exact(rows, last) if not getattr(self, "requires_grad", False) else None
        indices = _unrows(last, cast("Tensor", self), axis, keepdim)
        if values is None:
            values = source._gather(axis, indices if keepdim else indices.unsqueeze(axis), checked=False)
            values = values if keepdim else values.squeeze(axis)
        else:
            values = _unrows(values, cast("Tensor", self), axis, keepdim).cast(self.dtype)
        return ValuesIndices(values, indices)

    # ---- quantiles ---------------------------------------------------------------------------------------------------

    def quantile(self, q: Any, dim: int | None = None, keepdim: bool = False, *,
                 interpolation: str = "linear") -> Tensor:
        """The q-th quantiles along dim (of all elements by default), torch's five interpolation modes; a row with
        a NaN gives NaN. A 1-d q puts its dim first in the result."""
        return _quantile(cast("Tensor", self), q, dim, keepdim, interpolation, ignore_nan=False, name="quantile")

    def nanquantile(self, q: Any, dim: int | None = None, keepdim: bool = False, *,
                    interpolation: str = "linear") -> Tensor:
        """quantile ignoring NaN (NaN only where every value is NaN)."""
        return _quantile(cast("Tensor", self), q, dim, keepdim, interpolation, ignore_nan=True, name="nanquantile")


# ---- helpers ---------------------------------------------------------------------------------------------------------


def _integer(value: Any, name: str) -> int:
    import operator

    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None


def _reject_bool(tensor: Tensor, name: str) -> None:
    if tensor.dtype.is_bool:
        raise DTypeError(f"{name}: bool tensors are not supported (as in PyTorch); cast with .int() first")


def _axis_and_size(tensor: Tensor, dim: int, name: str) -> tuple[int, int]:
    """The non-negative axis of dim (a 0-d tensor accepts -1 and 0) and the size along it (1 for a 0-d tensor)."""
    axis = normalize_dim(dim, tensor.ndim, name)
    return axis, (tensor.shape[axis] if tensor.ndim else 1)


def _rows(tensor: Tensor, axis: int) -> Tensor:
    """tensor with `axis` moved last and the other dims flattened: [B, n]."""
    moved = tensor.movedim(axis, -1) if tensor.ndim else tensor.reshape(1)
    return moved.reshape(-1, moved.shape[-1])


def _unrows(rows: Tensor, like: Tensor, axis: int, keepdim: bool) -> Tensor:
    """The inverse of _rows for a result with a last dim of any size (1 is dropped unless keepdim)."""
    if like.ndim == 0:
        return rows.reshape(())
    moved_shape = like.shape[:axis] + like.shape[axis + 1:]
    result = rows.reshape(moved_shape + (rows.shape[-1],)).movedim(-1, axis)
    return result if keepdim or result.shape[axis] != 1 else result.squeeze(axis)


def _sort_along(tensor: Tensor, dim: int, descending: bool, name: str, need_values: bool = True
                ) -> tuple[Tensor, Tensor]:
    """Values and int64 indices sorted along dim; with a gradient to track, the values are gathered from tensor."""
    tensor = read_alike(tensor)  # (the passes of the sort read one copy of a computed value: read_alike.py)
    axis, size = _axis_and_size(tensor, dim, name)
    if tensor.numel() == 0 or tensor.ndim == 0:
        return tensor, tensor._full(tensor.shape, 0, dtypes.int64, tensor.device)
    values, positions = sort_rows(_rows(tensor, axis), descending)
    indices = _unrows(positions, tensor, axis, keepdim=True)
    if getattr(tensor, "requires_grad", False) and need_values:
        return tensor._gather(axis, indices, checked=False), indices
    return _unrows(values, tensor, axis, keepdim=True), indices


def _select(tensor: Tensor, axis: int, position: int, keepdim: bool) -> Tensor:
    picked = tensor.narrow(axis, position, 1)
    return picked if keepdim else picked.squeeze(axis)


def _sorted_rows(tensor: Tensor, axis: int) -> tuple[Tensor, Tensor, Tensor]:
    """(rows [B, n] of the input, their sorted values, the positions of the sorted values)."""
    rows = _rows(tensor, axis)
    values, positions = sort_rows(rows, False)
    return rows, values, positions


def _pick(rows: Tensor, sorted_values: Tensor, positions: Tensor, rank: Tensor) -> tuple[Tensor, Tensor]:
    """The sorted values at rank [B, M] of each row and their input positions; with a gradient to track, the values
    are taken from the input rows (so the gradient reaches those elements)."""
    picked_positions = take_last(positions, rank)
    if getattr(rows, "requires_grad", False):
        return take_last(rows, picked_positions), picked_positions
    return _take_exact(sorted_values, rank), picked_positions


def _take_exact(rows: Tensor, index: Tensor) -> Tensor:
    """out[b, m] = rows[b, index[b, m]] with the exact bits (a one-hot maximum: -0.0 stays -0.0); no gradient."""
    positions = rows._arange_primitive(rows.shape[-1], dtypes.int64, rows.device)
    chosen = index.unsqueeze(-1) == positions  # [B, M, n]
    return where(chosen, rows.unsqueeze(-2), dtypes.min_value(rows.dtype)).amax(-1)


def _median(tensor: Tensor, dim: int | None, keepdim: bool, ignore_nan: bool, name: str) -> Any:
    _reject_bool(tensor, name)
    tensor = read_alike(tensor)  # (the sort and the comparison with its median read one copy: read_alike.py)
    if dim is None:
        if tensor.numel() == 0:
            if not tensor.dtype.is_float:
                raise ShapeError(f"{name}: the tensor of shape {tensor.shape} is empty")
            return tensor._full((), math.nan, tensor.dtype, tensor.device)
        flat = tensor.reshape(-1)
        value = _median_rows(flat.reshape(1, -1)._detached_copy(), ignore_nan)[0].reshape(())
        return _evenly_distributed(flat, value) if getattr(tensor, "requires_grad", False) else value
    axis, size = _axis_and_size(tensor, dim, name)
    if tensor.ndim == 0:
        return ValuesIndices(tensor, tensor._full((), 0, dtypes.int64, tensor.device))
    if size == 0:
        raise ShapeError(f"{name}: cannot reduce over the zero-size dim {dim} of a tensor of shape {tensor.shape}")
    values, positions = _median_rows(_rows(tensor, axis), ignore_nan)
    return ValuesIndices(_unrows(values, tensor, axis, keepdim), _unrows(positions, tensor, axis, keepdim))


def _median_rows(rows: Tensor, ignore_nan: bool) -> tuple[Tensor, Tensor]:
    """The lower median of each row [B, n] and its position, as [B, 1]: NaN (at the first NaN) where a row holds
    one, or with ignore_nan the lower median of the other values."""
    size = rows.shape[-1]
    _, sorted_values, positions = _sorted_rows(rows, 1)
    if rows.dtype.is_float:
        nan_count = rows.isnan().sum(1, keepdim=True)
        if ignore_nan:
            rank = ((size - nan_count - 1) // 2).clamp_min(0)
        else:
            rank = where(nan_count > 0, size - nan_count, (size - 1) // 2)
    else:
        rank = rows._full((rows.shape[0], 1), (size - 1) // 2, dtypes.int64, rows.device)
    return _pick(rows, sorted_values, positions, rank)


def _evenly_distributed(flat: Tensor, value: Tensor) -> Tensor:
    """value (exactly), with the gradient split evenly among the elements of flat equal to it (or among its NaNs
    when it is NaN), as torch's median() and nanmedian() do."""
    exact = value._detached_copy()
    matches = (flat == exact).logical_or(flat.isnan().logical_and(exact.isnan()))
    # a maximum over the matches alone is the value, and REDUCE_MAX splits its gradient among them; for -inf the
    # sign is turned so the matches are not tied with the fill
    # (without NaN matches, so that branch's own backward stays finite when the other one is taken)
    turn = where(exact == -math.inf, -1.0, 1.0).cast(flat.dtype)
    maximum = where(matches.logical_and(exact.isnan().logical_not()), flat * turn, -math.inf).amax() * turn
    nan_mean = where(matches, flat, 0.0).sum() / matches.sum().cast(flat.dtype)  # NaN, with the gradient shared
    return where(exact.isnan(), nan_mean, maximum)


def _quantile(tensor: Tensor, q: Any, dim: int | None, keepdim: bool, interpolation: str, ignore_nan: bool,
              name: str) -> Tensor:
    from ember.core.tensor import Tensor

    tensor = read_alike(tensor)  # (the sort and the picks from its rows read one copy: read_alike.py)
    if tensor.dtype not in (dtypes.float32, dtypes.float64):
        raise DTypeError(f"{name}: the input must be a float32 or float64 tensor (as in PyTorch), got "
                         f"{tensor.dtype.name}")
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"{name}: interpolation must be one of {', '.join(INTERPOLATIONS)}, got {interpolation!r}")
    if tensor.numel() == 0:
        raise ShapeError(f"{name}: the input tensor must be non-empty, got shape {tensor.shape}")
    if isinstance(q, Tensor):
        if q.ndim > 1:
            raise ShapeError(f"{name}: q must be a scalar or a 1-d tensor, got shape {q.shape}")
        if q.dtype != tensor.dtype:
            raise DTypeError(f"{name}: q ({q.dtype.name}) must have the input's dtype ({tensor.dtype.name})")
        if q.numel() and not bool(((q >= 0).logical_and(q <= 1)).all().item()):  # read from the device, as torch
            raise ValueError(f"{name}: every q must be in the range [0, 1]")
        quantiles = q.reshape(-1)
    else:
        if not 0 <= float(q) <= 1:
            raise ValueError(f"{name}: q must be in the range [0, 1], got {q}")
        quantiles = tensor._full((1,), float(q), tensor.dtype, tensor.device)
    if dim is None:
        rows = tensor.reshape(1, -1)
        result_shape = (1,) * tensor.ndim if keepdim else ()
    else:
        axis = normalize_dim(dim, tensor.ndim, name)
        rows = _rows(tensor, axis)
        if tensor.ndim == 0:
            result_shape = ()
        else:
            reduced = list(tensor.shape)
            reduced[axis] = 1
            result_shape = tuple(reduced) if keepdim else tuple(reduced[:axis] + reduced[axis + 1:])
    size = rows.shape[-1]
    _, sorted_values, positions = _sorted_rows(rows, 1)
    count = quantiles.shape[0]
    wanted = quantiles.reshape(1, count)  # [1, Q] against rows [B, ...]
    if ignore_nan:
        valid = rows.isnan().logical_not().sum(1, keepdim=True).cast(tensor.dtype)  # [B, 1]
        ranks = wanted * (valid - 1)
        ranks = where(ranks < 0, 0.0, ranks)
    else:
        has_nan = rows.isnan().any(1, keepdim=True)
        ranks = where(has_nan, float(size - 1), wanted * (size - 1))  # [B, Q]
    if interpolation == "lower":
        ranks = ranks.floor()
    elif interpolation == "higher":
        ranks = ranks.ceil()
    elif interpolation == "nearest":
        ranks = ranks.round()
    below = ranks.cast(dtypes.int64)
    result, _ = _pick(rows, sorted_values, positions, below)
    if interpolation in ("linear", "midpoint"):
        above, _ = _pick(rows, sorted_values, positions, ranks.ceil().cast(dtypes.int64))
        weights = ranks - below.cast(ranks.dtype) if interpolation == "linear" else 0.5
        result = _lerp(result, above, weights)
    result = result.transpose(0, 1)  # [Q, B]
    if isinstance(q, Tensor) and q.ndim == 1:
        return result.reshape((count,) + result_shape)
    return result.reshape(result_shape)


def _lerp(start: Tensor, end: Tensor, weight: Any) -> Tensor:
    """torch's lerp: start + w (end - start) for |w| < 0.5, else end - (end - start)(1 - w) (exact at w = 1)."""
    difference = end - start
    if not hasattr(weight, "node"):
        return start + weight * difference if abs(weight) < 0.5 else end - difference * (1 - weight)
    return where(weight.abs() < 0.5, start + weight * difference, end - difference * (1 - weight))
