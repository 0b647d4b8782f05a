"""Reduction Tensor methods (sum, mean, max, argmax, var, logsumexp, cumsum, ...) as compositions of primitives."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ember.core import dtype as dtypes
from ember.core.dtype import DType, to_dtype
from ember.core.errors import DTypeError, ShapeError
from ember.core.ops import Op
from ember.core.shapes import normalize_dim, normalize_dims, prod

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


class ValuesIndices(NamedTuple):
    """The (values, indices) result of max/min/sort along a dim, like torch's named tuples."""

    values: Any
    indices: Any


class ReductionOps:
    """Mixin: reductions. Needs `_apply`, `_full`, `shape`, `dtype`, `device` from the class."""

    __slots__ = ()

    def _reduce(self: Tensor, op: Op, dim: int | Sequence[int] | None, keepdim: bool, name: str) -> Tensor:
        axes = normalize_dims(dim, self.ndim, name)
        if op is Op.REDUCE_MAX and self.numel() == 0 and any(self.shape[axis] == 0 for axis in axes):
            raise ShapeError(f"{name}: cannot reduce over a zero-size dim of a tensor of shape {self.shape} (no identity)")
        reduced = self._apply(op, arg=axes) if axes else self
        if keepdim:
            return reduced
        return reduced.reshape(tuple(size for axis, size in enumerate(reduced.shape) if axis not in axes))

    def sum(self: Tensor, dim: int | Sequence[int] | None = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
        source = self
        if dtype is not None:
            source = source.cast(to_dtype(dtype))
        elif source.dtype.is_bool or source.dtype.is_int:
            source = source.cast(dtypes.int64 if not source.dtype.is_unsigned or source.dtype.itemsize < 8 else source.dtype)
        return source._reduce(Op.SUM, dim, keepdim, "sum")

    def prod(self: Tensor, dim: int | None = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
        source = self
        if dtype is not None:
            source = source.cast(to_dtype(dtype))
        elif source.dtype.is_bool or source.dtype.is_int:
            source = source.cast(dtypes.int64)
        return source._reduce(Op.PROD, dim, keepdim, "prod")

    def mean(self: Tensor, dim: int | Sequence[int] | None = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
        source = self.cast(to_dtype(dtype)) if dtype is not None else self
        if not source.dtype.is_float:
            raise DTypeError(
                f"mean: could not infer output dtype; input dtype must be floating point, got {source.dtype.name}"
            )
        axes = normalize_dims(dim, self.ndim, "mean")
        count = prod([self.shape[axis] for axis in axes])
        total = source._reduce(Op.SUM, dim, keepdim, "mean")
        return total * (1.0 / count) if count else total * math.nan

    def _max_or_min_values(self: Tensor, dim: Any, keepdim: bool, name: str, minimum: bool) -> Tensor:
        if self.dtype.is_bool:
            as_int = self.cast(dtypes.uint8)
            return as_int._max_or_min_values(dim, keepdim, name, minimum).cast(dtypes.bool_)
        if not minimum:
            return self._reduce(Op.REDUCE_MAX, dim, keepdim, name)
        if self.dtype.is_unsigned:
            flipped = self.bitwise_not()
            return flipped._reduce(Op.REDUCE_MAX, dim, keepdim, name).bitwise_not()
        return -((-self)._reduce(Op.REDUCE_MAX, dim, keepdim, name))

    def max(self: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
        """max() of all elements, max(dim) -> (values, indices), or max(other) elementwise like torch."""
        if isinstance(dim, ReductionOps):
            return self.maximum(dim)
        if dim is None:
            return self._max_or_min_values(None, False, "max", minimum=False)
        return ValuesIndices(self._max_or_min_values(dim, keepdim, "max", False), self.argmax(dim, keepdim))

    def min(self: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
        if isinstance(dim, ReductionOps):
            return self.minimum(dim)
        if dim is None:
            return self._max_or_min_values(None, False, "min", minimum=True)
        return ValuesIndices(self._max_or_min_values(dim, keepdim, "min", True), self.argmin(dim, keepdim))

    def amax(self: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        return self._max_or_min_values(dim if dim != () else None, keepdim, "amax", minimum=False)

    def amin(self: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        return self._max_or_min_values(dim if dim != () else None, keepdim, "amin", minimum=True)

    def _arg_extreme(self: Tensor, dim: int | None, keepdim: bool, name: str, minimum: bool) -> Tensor:
        """The first index of the max (or min) along dim; NaN counts as the largest value, like torch."""
        if dim is None:
            flat = self.flatten()
            result = flat._arg_extreme(0, False, name, minimum)
            return result.reshape((1,) * self.ndim) if keepdim else result
        axis = normalize_dim(dim, self.ndim, name)
        size = self.shape[axis]
        if size == 0:
            raise ShapeError(f"{name}: cannot take {name} of an empty dim (shape {self.shape}, dim {dim})")
        extreme = self._max_or_min_values(axis, True, name, minimum)
        is_extreme = self == extreme
        if self.dtype.is_float:
            nan_here = self.isnan()
            any_nan = nan_here._reduce(Op.REDUCE_MAX, axis, True, name) if False else (
                nan_here.cast(dtypes.uint8)._reduce(Op.REDUCE_MAX, axis, True, name) == 1
            )
            is_extreme = any_nan.where(nan_here, is_extreme)
        shape = [1] * self.ndim
        shape[axis] = size
        # reversed positions: the first match gets the largest score
        reversed_index = self._arange_primitive(size, dtypes.int64, self.device).reshape(shape)
        score = is_extreme.where((size - 1) - reversed_index.expand(self.shape), self._full(self.shape, -1, dtypes.int64, self.device))
        best = score._reduce(Op.REDUCE_MAX, axis, keepdim, name)
        return (size - 1) - best

    def argmax(self: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
        return self._arg_extreme(dim, keepdim, "argmax", minimum=False)

    def argmin(self: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
        return self._arg_extreme(dim, keepdim, "argmin", minimum=True)

    def var(
        self: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, correction: Any = None
    ) -> Tensor:
        if correction is None:
            correction = 1 if unbiased is None or unbiased else 0
        axes = normalize_dims(dim, self.ndim, "var")
        count = prod([self.shape[axis] for axis in axes])
        centered = self - self.mean(axes, keepdim=True)
        total = (centered * centered).sum(axes, keepdim=keepdim)
        divisor = count - correction
        return total / divisor if divisor > 0 else total * math.nan

    def std(
        self: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, correction: Any = None
    ) -> Tensor:
        return self.var(dim, unbiased, keepdim, correction).sqrt()

    def var_mean(self: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, correction: Any = None):
        return self.var(dim, unbiased, keepdim, correction), self.mean(dim, keepdim)

    def std_mean(self: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, correction: Any = None):
        return self.std(dim, unbiased, keepdim, correction), self.mean(dim, keepdim)

    def logsumexp(self: Tensor, dim: Any, keepdim: bool = False) -> Tensor:
        source = self._float_operand()
        maximum = source.amax(dim, keepdim=True)
        safe_maximum = maximum.isinf().where(maximum._full(maximum.shape, 0, maximum.dtype, maximum.device), maximum)
        result = (source - safe_maximum).exp().sum(dim, keepdim=True).log() + safe_maximum
        axes = normalize_dims(dim, self.ndim, "logsumexp")
        return result if keepdim else result.reshape(tuple(s for a, s in enumerate(result.shape) if a not in axes))

    def any(self: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        as_int = (self != 0).cast(dtypes.uint8) if not self.dtype.is_bool else self.cast(dtypes.uint8)
        if self.numel() == 0:
            return self._full(_reduced_shape(self, dim, keepdim), False, dtypes.bool_, self.device)
        return as_int._reduce(Op.REDUCE_MAX, dim, keepdim, "any") == 1

    def all(self: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        return (self == 0).any(dim, keepdim).logical_not() if not self.dtype.is_bool else (
            self.logical_not().any(dim, keepdim).logical_not()
        )

    def count_nonzero(self: Tensor, dim: Any = None) -> Tensor:
        return (self != 0).sum(dim)

    def norm(self: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False) -> Tensor:
        if p in ("fro", 2, 2.0):
            return (self * self).sum(dim, keepdim=keepdim).sqrt()
        if p in (math.inf, "inf"):
            return self.abs().amax(dim, keepdim)
        if p == 1:
            return self.abs().sum(dim, keepdim=keepdim)
        return (self.abs() ** p).sum(dim, keepdim=keepdim) ** (1.0 / p)

    def cumsum(self: Tensor, dim: int, dtype: DType | None = None) -> Tensor:
        """Inclusive prefix sum along dim, as a masked sum over a padded, expanded view (one fused kernel)."""
        source = self.cast(dtype) if dtype is not None else (
            self.cast(dtypes.int64) if self.dtype.is_int or self.dtype.is_bool else self
        )
        if source.ndim == 0:
            return source
        axis = normalize_dim(dim, source.ndim, "cumsum")
        size = source.shape[axis]
        if size <= 1:
            return source
        moved = source.transpose(axis, -1)
        # windows[..., i, j] = x[..., j - (size - 1) + i], zero outside: pad left by size-1, then slide
        padded = moved._pad_and_shrink([(0, 0)] * (moved.ndim - 1) + [(size - 1, 0)])
        windows = _sliding_windows(padded, size)
        return windows.sum(-1).transpose(axis, -1)

    def cumprod(self: Tensor, dim: int) -> Tensor:
        axis = normalize_dim(dim, self.ndim, "cumprod")
        size = self.shape[axis]
        if size <= 1:
            return self
        moved = self.transpose(axis, -1)
        padded = moved._pad_and_shrink([(0, 0)] * (moved.ndim - 1) + [(size - 1, 0)], value=1)
        return _sliding_windows(padded, size)._reduce(Op.PROD, -1, False, "cumprod").transpose(axis, -1)

    def cummax(self: Tensor, dim: int) -> Tensor:
        axis = normalize_dim(dim, self.ndim, "cummax")
        size = self.shape[axis]
        if size <= 1:
            return self
        moved = self.transpose(axis, -1)
        from ember.core.dtype import min_value

        padded = moved._pad_and_shrink([(0, 0)] * (moved.ndim - 1) + [(size - 1, 0)], value=min_value(self.dtype))
        return _sliding_windows(padded, size).amax(-1).transpose(axis, -1)


def _sliding_windows(padded: Tensor, size: int) -> Tensor:
    """From [..., 2*size-1] make [..., size, size] with out[..., i, j] = padded[..., i + j] (a strided view)."""
    lead = padded.shape[:-1]
    width = 2 * size - 1
    # repeat the row `size` times and pad each copy by one: row i of the result then starts i elements later
    repeated = padded.unsqueeze(-2).expand(lead + (size, width)).reshape(lead + (size * width,))
    shifted = repeated._pad_and_shrink([(0, 0)] * len(lead) + [(0, size)]).reshape(lead + (size, width + 1))
    return shifted._pad_and_shrink([(0, 0)] * len(lead) + [(0, 0), (0, size - width - 1)])


def _reduced_shape(tensor: Tensor, dim: Any, keepdim: bool) -> tuple[int, ...]:
    axes = normalize_dims(dim, tensor.ndim, "reduce")
    if keepdim:
        return tuple(1 if axis in axes else size for axis, size in enumerate(tensor.shape))
    return tuple(size for axis, size in enumerate(tensor.shape) if axis not in axes)
