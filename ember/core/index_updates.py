"""Index updates with torch's semantics: index_add, index_copy, index_fill, put, masked_scatter (and their in-place
forms) and bincount, as compositions of advanced_indexing's compare-and-sum reads and writes.

An index out of range raises IndexOutOfRangeError (core/checks.py) when the result is realized (at the call when
the index is host data). index_fill and put count negative indices from the end, as torch does; index_add,
index_copy and index_reduce reject them, as torch does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ember.core import dtype as dtypes
from ember.core.checks import check_index
from ember.core.elementwise import where
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.shapes import broadcast_shapes, normalize_dim
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

BINCOUNT_PIECE_ELEMENTS = 1 << 30  # values x bins compared in one piece of a bincount (below 2^31: 32-bit indices)


def _index_vector(index: Any, name: str, allow_int32: bool) -> Tensor:
    """The index of index_add/index_copy/index_fill as a 1-d tensor: int64 (or int32 where torch takes it), 0-d
    or 1-d."""
    from ember.core.indexing import _check_index_dtype

    _check_index_dtype(index, name)
    allowed = (dtypes.int64, dtypes.int32) if allow_int32 else (dtypes.int64,)
    if index.dtype not in allowed:
        names = " or ".join(dtype.name for dtype in allowed)
        raise DTypeError(f"{name}: index must be an {names} tensor, got {index.dtype.name}")
    if index.ndim > 1:
        raise IndexError(f"{name}: index must be a vector (0-d or 1-d), got shape {index.shape}")
    return index.reshape(-1)


def _same_dtype(name: str, tensor: Tensor, source: Tensor) -> None:
    from ember.core.elementwise import ElementwiseOps

    if not isinstance(source, ElementwiseOps):  # Tensor, and the numpy reference tensor
        raise TypeError(f"{name}: source must be a Tensor, got {type(source).__name__}")
    if source.dtype != tensor.dtype:
        raise DTypeError(f"{name}: self and source must have the same dtype, got {tensor.dtype.name} and "
                         f"{source.dtype.name}")


def _indexed_write(tensor: Tensor, dim: int, index: Tensor, source: Tensor, mode: str, name: str) -> Tensor:
    """tensor with the slices index[i] along dim combined with source's slice i ("sum" or "replace")."""
    from ember.core.advanced_indexing import put_last

    target = tensor.reshape(1) if tensor.ndim == 0 else tensor
    values = source.reshape(1) if source.ndim == 0 else source
    axis = normalize_dim(dim, target.ndim, name)
    expected = target.shape[:axis] + (index.shape[0],) + target.shape[axis + 1:]
    if values.ndim != target.ndim or any(a != b for d, (a, b) in enumerate(zip(values.shape, target.shape))
                                         if d != axis):
        raise ShapeError(f"{name}: source of shape {source.shape} must match the shape {tensor.shape} of self in "
                         f"every dim except dim {dim}")
    if values.shape != expected:
        raise ShapeError(f"{name}: the number of indices ({index.shape[0]}) must equal source's size in dim {dim} "
                         f"({values.shape[axis]})")
    positions = check_index(index, target.shape[axis], name, axis, negatives=False)
    written = put_last(target.transpose(axis, -1), positions, values.transpose(axis, -1), mode)
    return written.transpose(axis, -1).reshape(tensor.shape)


class IndexUpdateOps(TensorBase):
    """Mixin: writes through index vectors and masks, and bincount. Needs the indexing and elementwise mixins."""

    __slots__ = ()

    def index_add(self, dim: int, index: Tensor, source: Tensor, *, alpha: Any = 1) -> Tensor:
        """A copy of self with alpha * source's slice i added to the slice index[i] along dim (repeated indices
        accumulate)."""
        vector = _index_vector(index, "index_add", allow_int32=True)
        _same_dtype("index_add", cast("Tensor", self), source)
        scaled = source if alpha == 1 else (source * alpha).cast(self.dtype)
        return _indexed_write(cast("Tensor", self), dim, vector, scaled, "sum", "index_add")

    def index_add_(self, dim: int, index: Tensor, source: Tensor, *, alpha: Any = 1) -> Tensor:
        return self.assign(self.index_add(dim, index, source, alpha=alpha))

    def index_copy(self, dim: int, index: Tensor, source: Tensor) -> Tensor:
        """A copy of self with the slice index[i] along dim replaced by source's slice i (for a repeated index the
        last one wins; torch leaves that unspecified)."""
        vector = _index_vector(index, "index_copy", allow_int32=False)
        _same_dtype("index_copy", cast("Tensor", self), source)
        return _indexed_write(cast("Tensor", self), dim, vector, source, "replace", "index_copy")

    def index_copy_(self, dim: int, index: Tensor, source: Tensor) -> Tensor:
        return self.assign(self.index_copy(dim, index, source))

    def index_fill(self, dim: int, index: Tensor, value: Any) -> Tensor:
        """A copy of self with the slices index[i] along dim (negative indices count from the end) set to value, a
        number or a 0-d tensor (which gets the gradient of the filled elements)."""
        vector = _index_vector(index, "index_fill", allow_int32=False)
        target = self.reshape(1) if self.ndim == 0 else self
        axis = normalize_dim(dim, target.ndim, "index_fill")
        if hasattr(value, "node"):
            if value.ndim != 0:
                raise ShapeError(f"index_fill: value must be a number or a 0-d tensor, got shape {value.shape}")
            fill = value.cast(self.dtype)
        else:
            fill = self._full((), value, self.dtype, self.device)
        size = target.shape[axis]
        positions = self._arange_primitive(size, dtypes.int64, self.device).unsqueeze(1)
        checked = check_index(vector, size, "index_fill", axis, negatives=True)
        hit = (checked.unsqueeze(0) == positions).any(1)  # (size,): named by some index
        hit = hit.reshape(tuple(size if d == axis else 1 for d in range(target.ndim)))
        return where(hit, fill, target).reshape(self.shape)

    def index_fill_(self, dim: int, index: Tensor, value: Any) -> Tensor:
        return self.assign(self.index_fill(dim, index, value))

    def index_reduce(self, dim: int, index: Tensor, source: Tensor, reduce: str, *,
                     include_self: bool = True) -> Tensor:
        """Combine the slices of source into self at positions index along dim by 'prod', 'mean', 'amax' or
        'amin' (torch.index_reduce): a scatter_reduce with the index spread along source's other dims."""
        if reduce not in ("prod", "mean", "amax", "amin"):
            raise ArgumentError(f"index_reduce: reduce must be one of 'prod', 'mean', 'amax' or 'amin', got "
                                f"{reduce!r}")
        axis = normalize_dim(dim, self.ndim, "index_reduce")
        vector = _index_vector(index, "index_reduce", allow_int32=True)
        if source.ndim != self.ndim or source.shape[axis] != vector.shape[0] or any(
                size != other for position, (size, other) in enumerate(zip(source.shape, self.shape))
                if position != axis):
            raise ShapeError(f"index_reduce: source of shape {source.shape} must match self's shape {self.shape} "
                             f"except along dim {dim}, where it needs {vector.shape[0]} slices (one per index)")
        shape = [1] * self.ndim
        shape[axis] = vector.shape[0]
        spread = vector.cast(dtypes.int64).reshape(shape).expand(source.shape)
        return self.scatter_reduce(axis, spread, source, reduce, include_self=include_self)

    def put(self, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
        """A copy of self with the elements of self.flatten() at index (negative from the end) set to source's (or
        increased by them, repeats summed, when accumulate); index and source have the same number of elements."""
        from ember.core.advanced_indexing import put_last
        from ember.core.indexing import _check_index_dtype

        _check_index_dtype(index, "put")
        if index.dtype != dtypes.int64:
            raise DTypeError(f"put: index must be an int64 tensor, got {index.dtype.name}")
        _same_dtype("put", cast("Tensor", self), source)
        if index.numel() != source.numel():
            raise IndexError(f"put: index and source need the same number of elements, got {index.numel()} "
                             f"(shape {index.shape}) and {source.numel()} (shape {source.shape})")
        flat = self.reshape(-1)
        positions = check_index(index.reshape(-1), flat.shape[0], "put", None, negatives=True)
        written = put_last(flat, positions, source.reshape(-1), "sum" if accumulate else "replace")
        return written.reshape(self.shape)

    def put_(self, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
        return self.assign(self.put(index, source, accumulate))

    def masked_scatter(self, mask: Tensor, source: Tensor) -> Tensor:
        """self (broadcast with mask) with the elements where mask is True replaced, in row-major order, by the
        first elements of source. Source needs as many elements as mask has Trues: when it has fewer than mask has
        elements, the count is read from the device to check."""
        from ember.core.advanced_indexing import take_last

        if not hasattr(mask, "node") or not mask.dtype.is_bool:
            raise DTypeError(f"masked_scatter: mask must be a bool tensor, got "
                             f"{getattr(getattr(mask, 'dtype', None), 'name', type(mask).__name__)}")
        _same_dtype("masked_scatter", cast("Tensor", self), source)
        shape = broadcast_shapes(self.shape, mask.shape, op="masked_scatter")
        flat_mask = mask.expand(shape).reshape(-1)
        if source.numel() < flat_mask.shape[0]:
            count = int(flat_mask.cast(dtypes.int64).sum().item()) if flat_mask.shape[0] else 0
            if count > source.numel():
                raise ShapeError(f"masked_scatter: source has {source.numel()} elements (shape {source.shape}) but "
                                 f"the mask has {count} True elements")
        ordinal = flat_mask.cast(dtypes.int64).cumsum(0) - 1  # the k-th True takes source element k
        taken = take_last(source.reshape(-1), ordinal)
        return where(flat_mask, taken, self.expand(shape).reshape(-1)).reshape(shape)

    def masked_scatter_(self, mask: Tensor, source: Tensor) -> Tensor:
        if broadcast_shapes(self.shape, mask.shape, op="masked_scatter_") != self.shape:
            raise ShapeError(f"masked_scatter_: mask of shape {mask.shape} must broadcast to self's shape "
                             f"{self.shape}")
        return self.assign(self.masked_scatter(mask, source))

    def bincount(self, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
        """torch.bincount: how often each value 0..max occurs in a 1-d non-negative integer tensor (the sum of the
        weights at its positions, as float32 for float32 weights and float64 otherwise). The length depends on the
        data: the max (and min, to check) are read from the device first."""
        if self.ndim != 1 or not self.dtype.is_int:
            raise DTypeError(f"bincount: only supports 1-d non-negative integer inputs, got a {self.dtype.name} "
                             f"tensor of shape {self.shape}")
        if minlength < 0:
            raise ValueError(f"bincount: minlength must be >= 0, got {minlength}")
        if weights is not None and (weights.ndim != 1 or weights.shape[0] != self.shape[0]):
            raise ShapeError(f"bincount: weights must be 1-d with the input's length {self.shape[0]}, got shape "
                             f"{weights.shape}")
        length = minlength
        if self.numel():
            from ember.core.tensor import realize

            largest, smallest = self.max(), self.min()
            realize(largest, smallest)
            if smallest.item() < 0:
                raise ValueError(f"bincount: only supports non-negative inputs, got the value {smallest.item()}")
            length = max(length, int(largest.item()) + 1)
        values = self._arange_primitive(length, dtypes.int64, self.device)
        dtype = dtypes.float32 if weights is not None and weights.dtype == dtypes.float32 else dtypes.float64
        # the comparison of every value with every bin is an (N, length) tensor: in pieces of fewer than 2^31
        # elements, whose counts add up (a kernel indexing 2^31 elements or more needs 64-bit indices, which WGSL
        # does not have: a bincount of 10^7 values into 1,000 bins raised on wgpu)
        piece = max(1, BINCOUNT_PIECE_ELEMENTS // max(length, 1))
        total: Tensor | None = None
        for start in range(0, max(self.shape[0], 1), piece):
            part = self[start:start + piece] if self.shape[0] > piece else cast("Tensor", self)
            match = part.cast(dtypes.int64).unsqueeze(1) == values  # (piece, length)
            if weights is None:
                counts = match.cast(dtypes.int64).sum(0)
            else:
                part_weights = weights[start:start + piece] if self.shape[0] > piece else weights
                counts = where(match, part_weights.cast(dtype).unsqueeze(1), 0).sum(0)
            total = counts if total is None else total + counts
        assert total is not None
        return total
