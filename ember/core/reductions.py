"""Reduction Tensor methods (sum, mean, max, argmax, var, logsumexp, cumsum, any, ...) as compositions of primitives."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from ember.context import CONTEXT
from ember.core import dtype as dtypes
from ember.core.dtype import DType, to_dtype
from ember.core.elementwise import where
from ember.core.errors import ArgumentError, AxisError, DTypeError, ShapeError
from ember.core.half_precision import HALF_TYPES, computed_in_float32
from ember.core.ops import REDUCE_COMBINE, Op, reduce_identity
from ember.core.read_alike import read_alike
from ember.core.shapes import normalize_dim, normalize_dims, prod
from ember.core.staged_reduce import reduce_axes
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

Dims = int | Sequence[int] | None


class ValuesIndices(NamedTuple):
    """The (values, indices) result of max/min/sort along a dim, like torch's named tuples."""

    values: Any
    indices: Any


class MinMax(NamedTuple):
    """The (min, max) result of aminmax, like torch's named tuple."""

    min: Any
    max: Any


class ReductionOps(TensorBase):
    """Mixin: reductions. Needs `_apply`, `_full`, `shape`, `dtype`, `device` from the class."""

    __slots__ = ()

    def _reduce(self, op: Op, dim: Dims, keepdim: bool, name: str) -> Tensor:
        """One reduce primitive over dim (None or () meaning every dim, as in torch), then the reduced dims dropped
        unless keepdim. A max over a zero-size dim has no identity and raises (torch's classes: IndexError for a
        dim given, RuntimeError for a reduction over every dim)."""
        axes = _reduction_axes(dim, self.ndim, name)
        if op is Op.REDUCE_MAX:
            empty = [axis for axis in axes if self.shape[axis] == 0]
            if empty:
                every_dim = dim is None or (not isinstance(dim, int) and len(dim) == 0)
                raise (ShapeError if every_dim else AxisError)(
                    f"{name}: cannot reduce over the zero-size dim {empty[0]} of a tensor of shape {self.shape} "
                    f"(a maximum or minimum of nothing is undefined); reduce over other dims"
                )
        return self._reduce_axes(op, axes, keepdim)

    def _reduce_axes(self, op: Op, axes: tuple[int, ...], keepdim: bool) -> Tensor:
        reduced = reduce_axes(cast("Tensor", self), op, axes)
        if keepdim or not axes:
            return reduced
        return reduced._reshaped(tuple(size for axis, size in enumerate(reduced.shape) if axis not in axes))

    def _accumulation_source(self, dtype: Any) -> Tensor:
        """The input of sum/prod/cumsum: cast to dtype if given, bool and integers widened to int64 (torch)."""
        if dtype is not None:
            return self.cast(to_dtype(dtype))
        return self.cast(dtypes.int64) if not self.dtype.is_float else cast("Tensor", self)

    def sum(self, dim: Dims = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
        """The sum over dim (all dims by default); bool and integer tensors sum to int64."""
        return self._accumulation_source(dtype)._reduce(Op.SUM, dim, keepdim, "sum")

    def prod(self, dim: int | None = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
        """The product over one dim (all by default); bool and integer tensors multiply in int64."""
        if dim is not None and not isinstance(dim, int):
            raise TypeError(f"prod: dim must be an int or None, got {dim!r}")
        return self._accumulation_source(dtype)._reduce(Op.PROD, dim, keepdim, "prod")

    def mean(self, dim: Dims = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
        """The mean over dim; needs a float tensor (or dtype=) like torch; an empty reduction gives NaN."""
        source = self.cast(to_dtype(dtype)) if dtype is not None else self
        if not source.dtype.is_float:
            raise DTypeError(
                f"mean: could not infer the output dtype; the input must be a floating point tensor, got "
                f"{source.dtype.name} (use .float() or mean(dtype=ember.float32))"
            )
        if source.dtype in HALF_TYPES:  # summed and divided in float32, rounded once (half_precision.py)
            return source.cast(dtypes.float32).mean(dim, keepdim).cast(source.dtype)
        axes = _reduction_axes(dim, self.ndim, "mean")
        count = prod([self.shape[axis] for axis in axes])
        total = source._reduce_axes(Op.SUM, axes, keepdim)
        return total * (1.0 / count) if count else total * math.nan

    # ---- maximum and minimum -------------------------------------------------------------------------------------

    def _max_or_min_values(self, dim: Dims, keepdim: bool, name: str, minimum: bool) -> Tensor:
        """max (or min) values over dim; NaN propagates. min is ~max(~x) for integers (no overflow), -max(-x)
        for floats and not(max(not x)) for bool."""
        if not minimum:
            return self._reduce(Op.REDUCE_MAX, dim, keepdim, name)
        flip = Op.NEG if self.dtype.is_float else Op.NOT
        return self._apply(flip)._reduce(Op.REDUCE_MAX, dim, keepdim, name)._apply(flip)

    def max(self, dim: Any = None, keepdim: bool = False) -> Any:
        """max() of all elements, max(dim) -> (values, indices), or max(other) elementwise, like torch."""
        if isinstance(dim, ReductionOps):
            return self.maximum(dim)
        if dim is None:
            return self._max_or_min_values(None, False, "max", minimum=False)
        return self._values_and_indices(dim, keepdim, "max", minimum=False)

    def min(self, dim: Any = None, keepdim: bool = False) -> Any:
        """min() of all elements, min(dim) -> (values, indices), or min(other) elementwise, like torch."""
        if isinstance(dim, ReductionOps):
            return self.minimum(dim)
        if dim is None:
            return self._max_or_min_values(None, False, "min", minimum=True)
        return self._values_and_indices(dim, keepdim, "min", minimum=True)

    def _values_and_indices(self, dim: int, keepdim: bool, name: str, minimum: bool) -> ValuesIndices:
        """max(dim)/min(dim): the values and the first index of the extreme. With a gradient to track, the values are
        gathered at the index, so the gradient goes to that element only, as in torch (amax splits it among ties)."""
        _check_single_dim(dim, name)
        indices = self._as_orderable()._arg_extreme(dim, keepdim, name, minimum=minimum)
        if not getattr(self, "requires_grad", False) or self.ndim == 0:
            return ValuesIndices(self._max_or_min_values(dim, keepdim, name, minimum), indices)
        axis = normalize_dim(dim, self.ndim, name)
        values = self._gather(axis, indices if keepdim else indices.unsqueeze(axis), checked=False)
        return ValuesIndices(values if keepdim else values.squeeze(axis), indices)

    def _as_orderable(self) -> Tensor:
        """bool as uint8 (torch's max(dim) and min(dim) accept bool, its argmax and argmin do not)."""
        return self.cast(dtypes.uint8) if self.dtype.is_bool else cast("Tensor", self)

    def amax(self, dim: Dims = None, keepdim: bool = False) -> Tensor:
        return self._max_or_min_values(dim, keepdim, "amax", minimum=False)

    def amin(self, dim: Dims = None, keepdim: bool = False) -> Tensor:
        return self._max_or_min_values(dim, keepdim, "amin", minimum=True)

    def aminmax(self, *, dim: int | None = None, keepdim: bool = False) -> MinMax:
        """(min, max) over dim (every dim by default), as torch.aminmax's named tuple (min, max)."""
        if dim is not None:
            _check_single_dim(dim, "aminmax")
        axes = _reduction_axes(dim, self.ndim, "aminmax")
        if any(self.shape[axis] == 0 for axis in axes):
            raise ShapeError(f"aminmax: cannot compute the minimum and maximum over an empty dim of a tensor of shape "
                             f"{self.shape} (there is no identity)")
        return MinMax(self.amin(dim, keepdim), self.amax(dim, keepdim))

    def _arg_extreme(self, dim: int | None, keepdim: bool, name: str, minimum: bool) -> Tensor:
        """The first index of the max (or min) along dim; a NaN counts as the extreme, like torch."""
        if self.dtype.is_bool:
            raise DTypeError(f"{name}: bool tensors are not supported (as in PyTorch); cast with .int() first")
        if dim is None:
            if self.numel() == 0:
                raise AxisError(f"{name}: the tensor of shape {self.shape} is empty; give a dim to reduce over")
            result = self.reshape(-1)._arg_extreme(0, False, name, minimum)
            return result.reshape((1,) * self.ndim) if keepdim else result
        _check_single_dim(dim, name)
        if self.ndim == 0:
            normalize_dim(dim, 0, name)
            return self._full((), 0, dtypes.int64, self.device)
        axis = normalize_dim(dim, self.ndim, name)
        if self.shape[axis] == 0:
            self._max_or_min_values(axis, True, name, minimum)  # (raises: no extreme over a zero-size dim)
        from ember.core.graph_templates import TEMPLATES  # (graph_templates imports the tensor, which imports this)

        build = functools.partial(_arg_extreme_along, axis=axis, keepdim=keepdim, name=name, minimum=minimum)
        if not hasattr(self, "_traced"):  # (the numpy reference tensor: its primitives, as ever)
            return build(cast("Tensor", self))
        # (copied from a template from the second call of a shape on: a dozen primitives, an accuracy's argmax at
        # every training step; with grad off, as the indices have no gradient and a template records no history)
        token = CONTEXT.set(CONTEXT.get().with_grad(False))
        try:  # (the values stored once where two kernels could compute them differently: read_alike.py)
            return TEMPLATES.instantiate(("arg extreme", axis, keepdim, minimum), build,
                                         (read_alike(cast("Tensor", self)),))
        finally:
            CONTEXT.reset(token)

    def argmax(self, dim: int | None = None, keepdim: bool = False) -> Tensor:
        return self._arg_extreme(dim, keepdim, "argmax", minimum=False)

    def argmin(self, dim: int | None = None, keepdim: bool = False) -> Tensor:
        return self._arg_extreme(dim, keepdim, "argmin", minimum=True)

    # ---- statistics -----------------------------------------------------------------------------------------------

    @computed_in_float32
    def var(self, dim: Dims = None, unbiased: bool | None = None, keepdim: bool = False,
            correction: float | None = None) -> Tensor:
        """Variance over dim with Bessel's correction by default (correction=1, or unbiased=False for 0); a
        divisor max(0, n - correction) of 0 gives inf or NaN like torch."""
        if not self.dtype.is_float:
            raise DTypeError(f"var/std: only floating point tensors are supported (as in PyTorch), got "
                             f"{self.dtype.name}; cast with .float()")
        if correction is None:
            correction = 1 if unbiased is None or unbiased else 0
        axes = _reduction_axes(dim, self.ndim, "var")
        count = prod([self.shape[axis] for axis in axes])
        centered = self - self.mean(axes, keepdim=True)
        total = (centered * centered)._reduce_axes(Op.SUM, axes, keepdim)
        return total / max(0.0, count - correction)  # a divisor of 0 gives inf or NaN, as in torch

    def std(self, dim: Dims = None, unbiased: bool | None = None, keepdim: bool = False,
            correction: float | None = None) -> Tensor:
        return _sqrt_zero_gradient_at_zero(self.var(dim, unbiased, keepdim, correction))

    def var_mean(self, dim: Dims = None, unbiased: bool | None = None, keepdim: bool = False,
                 correction: float | None = None) -> tuple[Tensor, Tensor]:
        return self.var(dim, unbiased, keepdim, correction), self.mean(dim, keepdim)

    def std_mean(self, dim: Dims = None, unbiased: bool | None = None, keepdim: bool = False,
                 correction: float | None = None) -> tuple[Tensor, Tensor]:
        return self.std(dim, unbiased, keepdim, correction), self.mean(dim, keepdim)

    def logsumexp(self, dim: Dims, keepdim: bool = False) -> Tensor:
        """log(sum(exp(x))) over dim without overflow (the max is subtracted first); empty gives -inf."""
        source = self._float_operand()
        axes = _reduction_axes(dim, self.ndim, "logsumexp")
        if any(self.shape[axis] == 0 for axis in axes):
            return source.exp()._reduce_axes(Op.SUM, axes, keepdim).log()  # log(0) = -inf
        maximum = source._reduce_axes(Op.REDUCE_MAX, axes, True)
        safe_maximum = where(maximum.isinf(), maximum._full(maximum.shape, 0, maximum.dtype, maximum.device), maximum)
        result = (source - safe_maximum).exp()._reduce_axes(Op.SUM, axes, True).log() + safe_maximum
        return result if keepdim else result.reshape(
            tuple(size for axis, size in enumerate(result.shape) if axis not in axes)
        )

    def any(self, dim: Dims = None, keepdim: bool = False) -> Tensor:
        """Whether any element is nonzero over dim (bool; uint8 for uint8 input, like torch)."""
        truth = self if self.dtype.is_bool else self != 0
        result = truth._reduce_axes(Op.REDUCE_MAX, _reduction_axes(dim, self.ndim, "any"), keepdim)
        return result.cast(dtypes.uint8) if self.dtype is dtypes.uint8 else result

    def all(self, dim: Dims = None, keepdim: bool = False) -> Tensor:
        """Whether every element is nonzero over dim (bool; uint8 for uint8 input, like torch)."""
        falsity = self._apply(Op.NOT) if self.dtype.is_bool else self == 0
        axes = _reduction_axes(dim, self.ndim, "all")
        result = falsity._reduce_axes(Op.REDUCE_MAX, axes, keepdim)._apply(Op.NOT)
        return result.cast(dtypes.uint8) if self.dtype is dtypes.uint8 else result

    def count_nonzero(self, dim: Dims = None) -> Tensor:
        return (self != 0).sum(dim)

    @computed_in_float32
    def norm(self, p: Any = "fro", dim: Dims = None, keepdim: bool = False) -> Tensor:
        if p in ("fro", 2, 2.0):
            return _sqrt_zero_gradient_at_zero((self * self).sum(dim, keepdim=keepdim))
        if p in (math.inf, "inf"):
            return self.abs().amax(dim, keepdim)
        if p == 1:
            return self.abs().sum(dim, keepdim=keepdim)
        return (self.abs() ** p).sum(dim, keepdim=keepdim) ** (1.0 / p)

    # ---- scans ------------------------------------------------------------------------------------------------------

    def cumsum(self, dim: int, dtype: DType | None = None) -> Tensor:
        """Inclusive prefix sum along dim (a scan: `_scan_last`); bool and integers accumulate in int64."""
        return _scan(self._accumulation_source(dtype), dim, Op.SUM, "cumsum")

    def cumprod(self, dim: int, dtype: DType | None = None) -> Tensor:
        return _scan(self._accumulation_source(dtype), dim, Op.PROD, "cumprod")

    def cummax(self, dim: int) -> ValuesIndices:
        """The running maximum along dim and the last index where it was reached (a NaN, once met, stays), like
        torch.cummax; with a gradient to track the values are gathered there, so the gradient goes to that index."""
        return _cumulative_extreme(cast("Tensor", self), dim, "cummax", minimum=False)

    def cummin(self, dim: int) -> ValuesIndices:
        """The running minimum along dim and the last index where it was reached, like torch.cummin."""
        return _cumulative_extreme(cast("Tensor", self), dim, "cummin", minimum=True)

    def logcumsumexp(self, dim: int) -> Tensor:
        """log(cumsum(exp(x))) along dim without overflow: a logsumexp over each prefix window (each has its own
        maximum, so a large later value does not flush an earlier prefix to -inf)."""
        if not self.dtype.is_float:
            raise DTypeError(f"logcumsumexp: needs a floating point tensor (as in PyTorch), got {self.dtype.name}")
        if self.dtype in HALF_TYPES:  # computed in float32, rounded once (as torch)
            return self.cast(dtypes.float32).logcumsumexp(dim).cast(self.dtype)
        source = cast("Tensor", self)
        if source.ndim == 0:
            normalize_dim(dim, 0, "logcumsumexp")
            return source
        axis = normalize_dim(dim, source.ndim, "logcumsumexp")
        if source.shape[axis] == 0:
            return source
        moved = source.transpose(axis, -1)
        return _scan_last(moved, lambda block: _prefix_windows(block, -math.inf).logsumexp(-1),
                          lambda left, right: left.logaddexp(right), -math.inf).transpose(axis, -1)

    # ---- reductions that skip NaN --------------------------------------------------------------------------------

    def nansum(self, dim: Dims = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
        """The sum over dim counting NaN as zero (torch.nansum)."""
        source = self._accumulation_source(dtype)
        if source.dtype.is_float:
            source = where(source.isnan(), source._full((), 0, source.dtype, source.device), source)
        return source._reduce(Op.SUM, dim, keepdim, "nansum")

    def nanmean(self, dim: Dims = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
        """The mean of the non-NaN elements over dim (NaN where there are none), like torch.nanmean."""
        source = self.cast(to_dtype(dtype)) if dtype is not None else self
        if not source.dtype.is_float:
            raise DTypeError(
                f"nanmean: expected a floating point tensor as input, got {source.dtype.name} (use .float() or "
                f"nanmean(dtype=ember.float32))"
            )
        if source.dtype in HALF_TYPES:  # summed and divided in float32, rounded once (half_precision.py)
            return source.cast(dtypes.float32).nanmean(dim, keepdim).cast(source.dtype)
        return source.nansum(dim, keepdim) / source.isnan().logical_not().sum(dim, keepdim=keepdim)

    def diff(self, n: int = 1, dim: int = -1, prepend: Tensor | None = None, append: Tensor | None = None
             ) -> Tensor:
        """The n-th forward difference along dim (out[i] = x[i + 1] - x[i], n times; xor for bool), after joining
        prepend and append along dim, as torch.diff."""
        from ember.core.movement import cat

        if not isinstance(n, int) or n < 0:
            raise ArgumentError(f"diff: the order n must be a non-negative int, got {n!r}")
        if self.ndim == 0:
            raise ShapeError("diff: expects a tensor of at least one dim, got a 0-d tensor")
        axis = normalize_dim(dim, self.ndim, "diff")
        parts = []
        for name, part in (("prepend", prepend), (None, cast("Tensor", self)), ("append", append)):
            if part is None:
                continue
            if name is not None and (not hasattr(part, "ndim") or part.ndim != self.ndim):
                raise ShapeError(f"diff: {name} must be a tensor with the input's {self.ndim} dims, got "
                                 f"{getattr(part, 'shape', type(part).__name__)}")
            parts.append(part)
        result = cat(parts, axis) if len(parts) > 1 else cast("Tensor", self)
        for _ in range(n):
            size = result.shape[axis]
            if size == 0:
                break
            later, earlier = result.narrow(axis, 1, size - 1), result.narrow(axis, 0, size - 1)
            result = later.logical_xor(earlier) if result.dtype.is_bool else later - earlier
        return result


def _cumulative_extreme(tensor: Tensor, dim: int, name: str, minimum: bool) -> ValuesIndices:
    """cummax / cummin: running values by a scan of REDUCE_MAX (of the flipped values for the minimum, as min's
    reductions do) and the last index j <= i where x[j] equals the running value at i (or is NaN)."""
    values_read = read_alike(tensor)  # (the scan and the comparison with its values read one copy: read_alike.py)
    flip = Op.NEG if values_read.dtype.is_float else Op.NOT
    values = _scan(values_read._apply(flip), dim, Op.REDUCE_MAX, name)._apply(flip) if minimum else _scan(
        values_read, dim, Op.REDUCE_MAX, name
    )
    if values_read.ndim == 0:
        return ValuesIndices(values, values_read._full((), 0, dtypes.int64, values_read.device))
    axis = normalize_dim(dim, values_read.ndim, name)
    size = values_read.shape[axis]
    # the running value only grows (shrinks, for the minimum), so the last j <= i where x[j] equals it is the
    # last j <= i where x[j] equals its own running value: a running maximum of those positions (a NaN, once met,
    # is the running value, and only a NaN equals it)
    source = values_read.transpose(axis, -1)
    reached = source == values.transpose(axis, -1)
    if values_read.dtype.is_float:
        reached = reached.logical_or(source.isnan())
    positions = values_read._arange_primitive(size, dtypes.int64, values_read.device).expand(source.shape)
    missing = values_read._full((), -1, dtypes.int64, values_read.device)
    indices = _scan_last(where(reached, positions, missing), *_combined(Op.REDUCE_MAX, -1)).transpose(axis, -1)
    if getattr(values_read, "requires_grad", False):
        values = values_read._gather(axis, indices, checked=False)
    return ValuesIndices(values, indices)


def _sqrt_zero_gradient_at_zero(value: Tensor) -> Tensor:
    """sqrt of a sum of squares, with torch's zero gradient where it is 0 (a constant there, not sqrt'(0) * 0)."""
    return value.where(value != 0, 0.0).sqrt()


def _scan(source: Tensor, dim: int, op: Op, name: str) -> Tensor:
    """out[..., i] = reduce(x[..., 0..i]) along dim: window i of a view padded by n - 1 identities on the left."""
    if source.ndim == 0:
        normalize_dim(dim, 0, name)
        return source
    axis = normalize_dim(dim, source.ndim, name)
    size = source.shape[axis]
    if size <= 1:
        return source
    identity = reduce_identity(op, source.dtype)
    return _scan_last(source.transpose(axis, -1), *_combined(op, identity)).transpose(axis, -1)


# a scan of up to SCAN_WINDOW_LIMIT elements is one reduce over prefix windows: O(n^2) work; a longer one scans blocks
# of SCAN_BLOCK that way, then the blocks' totals: O(n * SCAN_BLOCK). At 256 and 64, a cumsum over 512 rows of 256
# took 17.5 ms, of 64 rows of 1,001 2.4 ms, of 4 rows of 100,000 7.6 ms; at 64 and 16, 0.83, 0.92 and 2.1 ms (2
# cores; the same error against torch's float64 within 10-20%)
SCAN_WINDOW_LIMIT = 64
SCAN_BLOCK = 16


def _combined(op: Op, identity: Any) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor, Tensor], Tensor], Any]:
    """The (windowed scan, combine, identity) of `_scan_last` for a reduce op: SUM, PROD or REDUCE_MAX."""
    return (lambda block: _prefix_windows(block, identity)._reduce_axes(op, (block.ndim,), False),
            lambda left, right: left._apply(REDUCE_COMBINE[op], right), identity)


def _scan_last(moved: Tensor, windowed: Callable[[Tensor], Tensor], combine: Callable[[Tensor, Tensor], Tensor],
               identity: Any) -> Tensor:
    """The inclusive scan of the last dim. Up to SCAN_WINDOW_LIMIT elements: `windowed` (a reduce over the prefix
    windows: one kernel). Longer: the dim padded with the identity to blocks of SCAN_BLOCK, each block scanned by
    windows, the blocks' totals scanned the same way (recursively), and each block combined with the total of the
    blocks before it; a few kernels per level, O(n * SCAN_BLOCK) work, where the windows over the whole dim would
    be O(n^2) (a cumsum of 300,000 elements took 89 s)."""
    size = moved.shape[-1]
    if size == 0:
        return moved
    if size <= SCAN_WINDOW_LIMIT:
        return windowed(moved)
    lead = moved.shape[:-1]
    keep: list[tuple[int, int]] = [(0, 0)] * len(lead)
    blocks = -(-size // SCAN_BLOCK)
    padded = moved._pad_and_shrink(keep + [(0, blocks * SCAN_BLOCK - size)], value=identity)
    local = windowed(padded.reshape(lead + (blocks, SCAN_BLOCK)))
    totals = local._pad_and_shrink(keep + [(0, 0), (1 - SCAN_BLOCK, 0)]).reshape(lead + (blocks,))
    running = _scan_last(totals, windowed, combine, identity)
    before = running._pad_and_shrink(keep + [(1, -1)], value=identity)  # the blocks before each block
    offsets = before.reshape(lead + (blocks, 1)).expand(lead + (blocks, SCAN_BLOCK))
    scanned = combine(local, offsets).reshape(lead + (blocks * SCAN_BLOCK,))
    return scanned._pad_and_shrink(keep + [(0, size - blocks * SCAN_BLOCK)])


def _prefix_windows(moved: Tensor, identity: Any) -> Tensor:
    """[..., n] -> [..., n, n] with row i = (identity, ..., identity, x[0], ..., x[i]): the prefixes of the last
    dim as a view of the input padded by n - 1 identities on the left."""
    size = moved.shape[-1]
    padded = moved._pad_and_shrink([(0, 0)] * (moved.ndim - 1) + [(size - 1, 0)], value=identity)
    return _sliding_windows(padded, size)


def _sliding_windows(padded: Tensor, size: int) -> Tensor:
    """From [..., 2*size-1] make [..., size, size] with out[..., i, j] = padded[..., i + j] (a strided view)."""
    lead = padded.shape[:-1]
    width = 2 * size - 1
    # repeat the row `size` times and pad each copy by one: row i of the result then starts i elements later
    repeated = padded.unsqueeze(-2).expand(lead + (size, width)).reshape(lead + (size * width,))
    shifted = repeated._pad_and_shrink([(0, 0)] * len(lead) + [(0, size)]).reshape(lead + (size, width + 1))
    return shifted._pad_and_shrink([(0, 0)] * len(lead) + [(0, 0), (0, size - width - 1)])


def _reduction_axes(dim: Dims, ndim: int, name: str) -> tuple[int, ...]:
    """The sorted non-negative axes of dim; None and an empty sequence mean every axis (torch's rule)."""
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):
        return tuple(range(ndim))
    return normalize_dims(dim, ndim, name)


def _check_single_dim(dim: Any, name: str) -> None:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{name}: dim must be a single int here, got {dim!r} (use amax/amin for several dims)")


def _arg_extreme_along(tensor: Tensor, axis: int, keepdim: bool, name: str, minimum: bool) -> Tensor:
    """The first index of the max (or min) along `axis` (of a size above 0); a NaN counts as the extreme."""
    size = tensor.shape[axis]
    extreme = tensor._max_or_min_values(axis, True, name, minimum)
    is_extreme = tensor == extreme
    if tensor.dtype.is_float:
        is_extreme = is_extreme.logical_or(tensor.isnan())  # where the extreme is NaN, only NaN matches
    index_shape = [1] * tensor.ndim
    index_shape[axis] = size
    reversed_index = (size - 1) - tensor._arange_primitive(size, dtypes.int64, tensor.device).reshape(index_shape)
    missing = tensor._full(tensor.shape, -1, dtypes.int64, tensor.device)
    score = where(is_extreme, reversed_index.expand(tensor.shape), missing)
    return (size - 1) - score._reduce_axes(Op.REDUCE_MAX, (axis,), keepdim)
