"""Searching and counting: Tensor.unique, unique_consecutive and histc; the functions searchsorted and bucketize.

unique sorts (see `sort_network`), marks where each run of equal values starts, reads the number of runs from the
device (the output size depends on the data, as in torch), and moves the first element of each run to the front by
a second stable sort keyed on (not a run start, position). The inverse indices are a prefix count of the run
starts, carried back to input order by sorting on the input positions. Equality is torch's: -0.0 equals 0.0, each
NaN is a value of its own. searchsorted, bucketize and histc compare every value with every boundary or bin
(one fused reduce, no memory of that size).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

from ember.core import dtype as dtypes
from ember.core.advanced_indexing import COUNTED_POSITIONS_LIMIT
from ember.core.binary_search import binary_search
from ember.core.dtype import promote_types
from ember.core.elementwise import where
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.movement import cat, stack
from ember.core.shapes import normalize_dim, prod
from ember.core.sort_network import LOW_BITS, order_keys, sort_records, sort_rows, values_from_keys
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

SCAN_COUNTING_LIMIT = 2048  # prefix counts of rows up to this length are one masked sum (n^2 work), longer ones
# take log2(n) shifted additions


class Histogram(NamedTuple):
    """What histogram returns, torch's names: the counts (or weight sums) and the bin edges."""

    hist: Tensor
    bin_edges: Tensor


class SearchingOps(TensorBase):
    """Mixin: unique, unique_consecutive and histc. Needs the elementwise, reduction and movement mixins."""

    __slots__ = ()

    def unique(self, sorted: bool = True, return_inverse: bool = False,  # noqa: A002 - torch's name
               return_counts: bool = False, dim: int | None = None) -> Any:
        """The distinct values in ascending order (also for sorted=False, as torch does on the CPU); optionally the
        index of each input element in them and how often each occurs. With dim, the distinct slices along dim."""
        if dim is None:
            values, inverse, counts = _unique_sorted(self.reshape(-1, 1), return_inverse, return_counts)
            inverse = inverse.reshape(self.shape) if inverse is not None else None
            return _outputs(values.reshape(-1), inverse, counts, return_inverse, return_counts)
        axis = normalize_dim(dim, self.ndim, "unique")
        moved = self.movedim(axis, 0)
        slices = moved.reshape(moved.shape[0], prod(moved.shape[1:]))  # [n, m]: one row per slice
        values, inverse, counts = _unique_sorted(slices, return_inverse, return_counts)
        values = values.reshape((values.shape[0],) + moved.shape[1:]).movedim(0, axis)
        return _outputs(values, inverse, counts, return_inverse, return_counts)

    def unique_consecutive(self, return_inverse: bool = False, return_counts: bool = False,
                           dim: int | None = None) -> Any:
        """The first value of each run of equal consecutive values (or slices along dim), like torch."""
        if dim is None:
            flat = self.reshape(-1)
            values, inverse, counts = _compact(flat, _run_starts(flat.reshape(-1, 1)), return_inverse, return_counts)
            inverse = inverse.reshape(self.shape) if inverse is not None else None
            return _outputs(values, inverse, counts, return_inverse, return_counts)
        axis = normalize_dim(dim, self.ndim, "unique_consecutive")
        moved = self.movedim(axis, 0)
        slices = moved.reshape(moved.shape[0], prod(moved.shape[1:]))
        values, inverse, counts = _compact(slices, _run_starts(slices), return_inverse, return_counts)
        values = values.reshape((values.shape[0],) + moved.shape[1:]).movedim(0, axis)
        return _outputs(values, inverse, counts, return_inverse, return_counts)

    def nonzero_static(self, *, size: int, fill_value: int = -1) -> Tensor:
        """The first `size` rows of nonzero() (padded with fill_value): a static shape, so nothing is read back."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ArgumentError(f"nonzero_static: 'size' must be a non-negative int, got {size!r}")
        flat = (self if self.dtype.is_bool else self != 0).reshape(-1)
        running = flat.cast(dtypes.int64).cumsum(0) if flat.numel() else flat.cast(dtypes.int64)
        ordinals = self._arange_primitive(size, dtypes.int64, self.device).unsqueeze(1)
        positions = (running.unsqueeze(0) <= ordinals).sum(1) if flat.numel() else ordinals.reshape(size) * 0
        found = ordinals.reshape(size) < (running[-1] if flat.numel() else 0)
        columns, stride = [], 1
        for length in reversed(self.shape):
            columns.append(where(found, (positions // stride) % length, fill_value))
            stride *= length
        columns.reverse()
        if not columns:
            return positions.reshape(size, 1)._pad_and_shrink([(0, 0), (0, -1)])
        return columns[0].unsqueeze(1).cat([column.unsqueeze(1) for column in columns[1:]], 1)

    def histogram(self, bins: Any = 100, *, range: Any = None, weight: Tensor | None = None,  # noqa: A002
                  density: bool = False) -> Histogram:
        """(hist, bin_edges): counts (or weight sums) of the values in each bin, the bins given by a count with
        an optional (min, max) range or by a 1-d tensor of increasing edges; the last bin includes its right edge."""
        if not self.dtype.is_float:
            raise DTypeError(f"histogram: expects a floating point input, got {self.dtype.name}")
        if hasattr(bins, "_apply"):
            if bins.ndim != 1 or bins.numel() < 2:
                raise ShapeError(f"histogram: bins must be a 1-d tensor of at least 2 edges, got shape {bins.shape}")
            edges = bins.cast(self.dtype)
        else:
            if isinstance(bins, bool) or not isinstance(bins, int) or bins <= 0:
                raise ArgumentError(f"histogram: bins must be a positive int or a tensor of edges, got {bins!r}")
            if range is not None:
                low, high = float(range[0]), float(range[1])
            elif self.numel():
                from ember.core.tensor import realize

                smallest, largest = self.amin(), self.amax()
                realize(smallest, largest)
                low, high = float(smallest.item()), float(largest.item())
            else:
                low, high = 0.0, 0.0
            if low > high:
                raise ArgumentError(f"histogram: min ({low}) should not exceed max ({high})")
            if low == high:
                low, high = low - 0.5, high + 0.5
            from ember.core.creation import linspace

            edges = linspace(low, high, bins + 1, dtype=self.dtype, device=self.device)
        flat = self.reshape(-1, 1)
        count = edges.shape[0] - 1
        left, right = edges[:-1].reshape(1, count), edges[1:].reshape(1, count)
        last = self._arange_primitive(count, dtypes.int64, self.device).reshape(1, count) == count - 1
        inside = (flat >= left).logical_and((flat < right).logical_or(last.logical_and(flat <= right)))
        if weight is not None:
            if weight.shape != self.shape:
                raise ShapeError(f"histogram: weight of shape {weight.shape} must have the input's shape {self.shape}")
            hist = where(inside, weight.reshape(-1, 1).cast(self.dtype), 0).sum(0)
        else:
            hist = inside.sum(0, dtype=self.dtype)
        if density:
            hist = hist / ((edges[1:] - edges[:-1]) * hist.sum())
        return Histogram(hist, edges)

    def histc(self, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:  # noqa: A002
        """A histogram of `bins` equal bins over [min, max] (the data's range when min == max); values outside it
        and NaN are ignored, the last bin includes max. Counts have the input's dtype, as in torch."""
        if not self.dtype.is_float:
            raise DTypeError(f"histc: expects a floating point tensor (as in PyTorch), got {self.dtype.name}")
        if isinstance(bins, bool) or not isinstance(bins, int) or bins <= 0:
            raise ValueError(f"histc: bins must be a positive integer, got {bins!r}")
        low, high = float(min), float(max)
        if low == high and self.numel() > 0:
            from ember.core.tensor import realize

            smallest, largest = self.amin(), self.amax()
            realize(smallest, largest)
            low, high = float(smallest.item()), float(largest.item())
        if low == high:
            low, high = low - 1, high + 1
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(f"histc: the range [{low}, {high}] is not finite")
        if low > high:
            raise ValueError(f"histc: max ({high}) must be larger than min ({low})")
        flat = self.reshape(-1)
        # torch's bin: trunc((x - min) * bins / (max - min)) in the input's dtype, max itself in the last bin
        left = self._full((), low, self.dtype, self.device)
        width = self._full((), high, self.dtype, self.device) - left
        position = ((flat - left) * bins / width).cast(dtypes.int64)
        position = where(position == bins, bins - 1, position)
        inside = (flat >= low).logical_and(flat <= high)
        position = where(inside, position, -1)
        labels = self._arange_primitive(bins, dtypes.int64, self.device).reshape(bins, 1)
        return (position == labels).sum(1, dtype=self.dtype)


def searchsorted(sorted_sequence: Tensor, input: Any, *, out_int32: bool = False, right: bool = False,  # noqa: A002
                 side: str | None = None, sorter: Tensor | None = None) -> Tensor:
    """torch.searchsorted: for each value, the index where it would be inserted into the innermost dim of
    sorted_sequence to keep it sorted (before equal values, or after them with right=True or side='right').

    A NaN value goes after everything; a sorted_sequence holding NaN (at its end, as sort puts it) is read with NaN
    as the largest value (torch's binary search gives varying answers there).
    """
    from ember.core.tensor import Tensor

    if side is not None:
        if side not in ("left", "right"):
            raise ValueError(f"searchsorted: side can only be 'left' or 'right', got {side!r}")
        if right and side == "left":
            raise ValueError("searchsorted: side='left' and right=True contradict each other")
        right = side == "right"
    if not isinstance(sorted_sequence, Tensor):
        raise TypeError(f"searchsorted: sorted_sequence must be a Tensor, got {type(sorted_sequence).__name__}")
    scalar = not isinstance(input, Tensor)
    values = sorted_sequence._full((), input, _scalar_dtype(sorted_sequence, input), sorted_sequence.device) \
        if scalar else input
    boundaries = sorted_sequence
    if sorter is not None:
        if sorter.shape != boundaries.shape or not sorter.dtype.is_int:
            raise ShapeError(f"searchsorted: sorter must be an integer tensor of the shape of sorted_sequence "
                             f"{boundaries.shape}, got {sorter.dtype.name} {sorter.shape}")
        boundaries = boundaries.gather(-1, sorter)
    if boundaries.ndim == 0:
        raise ShapeError("searchsorted: sorted_sequence must have at least one dim")
    if boundaries.ndim > 1 and (values.ndim != boundaries.ndim or values.shape[:-1] != boundaries.shape[:-1]):
        raise ShapeError(
            f"searchsorted: sorted_sequence of shape {boundaries.shape} must be 1-d, or its leading dims must match "
            f"those of the values, got values of shape {values.shape}"
        )
    if values.dtype.is_bool or boundaries.dtype.is_bool:
        raise DTypeError("searchsorted: bool tensors are not supported (as in PyTorch)")
    common = promote_types(values.dtype, boundaries.dtype)
    values, boundaries = values.cast(common), boundaries.cast(common)
    size = boundaries.shape[-1]
    if values.numel() * size <= COUNTED_POSITIONS_LIMIT:
        expanded = values.unsqueeze(-1)  # [..., M, 1] against boundaries [..., 1, N]
        edges = boundaries.unsqueeze(-2) if boundaries.ndim > 1 else boundaries
        counted = (edges <= expanded) if right else (edges < expanded)
        result = counted.sum(-1)
    else:
        result = binary_search(boundaries, values, right)
    if common.is_float:
        result = where(values.isnan(), size, result)
    return result.cast(dtypes.int32 if out_int32 else dtypes.int64)


def bucketize(input: Any, boundaries: Tensor, *, out_int32: bool = False, right: bool = False) -> Tensor:  # noqa: A002
    """torch.bucketize: the index of the bucket of each value among 1-d boundaries (boundaries[i-1] < x <=
    boundaries[i], or boundaries[i-1] <= x < boundaries[i] with right=True)."""
    if getattr(boundaries, "ndim", None) != 1:
        raise ShapeError(f"bucketize: boundaries must be a 1-d tensor, got shape {getattr(boundaries, 'shape', None)}")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


# ---- helpers --------------------------------------------------------------------------------------------------------


def _scalar_dtype(like: Tensor, value: Any) -> Any:
    if isinstance(value, bool):
        return dtypes.bool_
    if isinstance(value, int):
        return like.dtype if not like.dtype.is_bool else dtypes.int64
    return like.dtype if like.dtype.is_float else dtypes.float32


def _outputs(values: Tensor, inverse: Tensor | None, counts: Tensor | None, return_inverse: bool,
             return_counts: bool) -> Any:
    if not return_inverse and not return_counts:
        return values
    result: list[Tensor | None] = [values]
    if return_inverse:
        result.append(inverse)
    if return_counts:
        result.append(counts)
    return tuple(result)


def _key_rows(slices: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """The n slices [n, m] as m int64 key rows that order them and m rows of -0.0 flags (none for non-floats)."""
    keys, flags = order_keys(slices.T)
    key_rows = [row.reshape(-1) for row in keys.cast(dtypes.int64).split(1, 0)] if slices.shape[1] else []
    flag_rows = [row.reshape(-1) for row in flags.split(1, 0)] if slices.dtype.is_float and slices.shape[1] else []
    return key_rows, flag_rows


def _slices_from_rows(key_rows: Tensor, flag_rows: Tensor | None, dtype: Any) -> Tensor:
    """The inverse of _key_rows for rows [m, k]: slices [k, m]."""
    flags = flag_rows if flag_rows is not None else key_rows * 0
    return values_from_keys(key_rows, flags, dtype).T


def _run_starts(slices: Tensor) -> Tensor:
    """Whether each of the slices [n, m] starts a run: it is the first, or differs from the one before it (NaN
    differs from everything, -0.0 equals 0.0)."""
    size = slices.shape[0]
    previous = slices._pad_and_shrink([(1, -1), (0, 0)])
    if slices.shape[1]:
        differs = (slices != previous).any(1)
    else:
        differs = slices._full((size,), False, dtypes.bool_, slices.device)
    first = slices._arange_primitive(size, dtypes.int64, slices.device) == 0
    return differs.logical_or(first)


def _unique_sorted(slices: Tensor, return_inverse: bool, return_counts: bool
                   ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """unique over the n slices of slices [n, m] (m = 1: single elements), in lexicographic order."""
    size, width = slices.shape
    if size == 0:
        empty = slices._full((0,), 0, dtypes.int64, slices.device)
        return slices, empty, empty
    positions = slices._arange_primitive(size, dtypes.int64, slices.device)
    if width == 1:
        values, order = sort_rows(slices.reshape(1, -1), False)
        sorted_slices, order = values.reshape(-1, 1), order.reshape(-1)
    elif width == 0:
        sorted_slices, order = slices, positions
    else:  # records (keys..., position, flags...): the position breaks ties before the sign of a zero is seen
        key_rows, flag_rows = _key_rows(slices)
        records = sort_records(stack(key_rows + [positions] + flag_rows).unsqueeze(0))
        records = records.reshape(-1, size)
        order = records[width]
        sorted_slices = _slices_from_rows(records[:width], records[width + 1:] if flag_rows else None, slices.dtype)
    values, sorted_inverse, counts = _compact(sorted_slices, _run_starts(sorted_slices), return_inverse,
                                              return_counts)
    inverse = None
    if return_inverse:  # inverse[order[r]] = sorted_inverse[r]: sort the (order, group) pairs by order
        assert sorted_inverse is not None  # _compact gives it when asked
        # one int64 record per pair (order * 2^32 + group: both below 2^31), the network's fast one-row form
        pairs = sort_records((order * LOW_BITS + sorted_inverse).reshape(1, 1, size))
        inverse = pairs.reshape(size) & (LOW_BITS - 1)
    return values, inverse, counts


def _compact(slices: Tensor, starts: Tensor, return_inverse: bool, return_counts: bool
             ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The slices [n, m] (or elements [n]) where starts is True, in order; for each slice its group (the number of
    starts up to it, minus one); and the length of each group. Reads the number of groups from the device."""
    size = slices.shape[0]
    if size == 0:
        empty = slices._full((0,), 0, dtypes.int64, slices.device)
        return slices, empty, empty
    rows = slices.reshape(size, -1)
    width = rows.shape[1]
    count = int(starts.sum().item())
    positions = slices._arange_primitive(size, dtypes.int64, slices.device)
    key_rows, flag_rows = _key_rows(rows)
    not_start = starts.logical_not().cast(dtypes.int64)
    # (not a start, position) orders the starts first, in input order; the values ride along as payload
    records = sort_records(stack([not_start, positions] + key_rows + flag_rows).unsqueeze(0))
    records = records.reshape(-1, size)[:, :count]
    values = _slices_from_rows(records[2:2 + width], records[2 + width:] if flag_rows else None, slices.dtype)
    values = values.reshape((count,) + slices.shape[1:])
    counts = None
    if return_counts:
        first = records[1]  # the position of the first slice of each group
        counts = cat([first[1:], first._full((1,), size, dtypes.int64, first.device)]) - first
    inverse = _inclusive_count(starts) - 1 if return_inverse else None
    return values, inverse, counts


def _inclusive_count(flags: Tensor) -> Tensor:
    """The running number of True flags (an int64 prefix sum of a 1-d bool tensor)."""
    running = flags.cast(dtypes.int64)
    size = running.shape[0]
    if size <= SCAN_COUNTING_LIMIT:
        return running.cumsum(0)
    shift = 1
    while shift < size:  # Hillis-Steele: add the value `shift` places back, doubling shift; one kernel per 2 steps
        running = running + running._pad_and_shrink([(shift, -shift)])
        shift *= 2
        if shift.bit_length() % 2 == 1 and shift < size:
            running = running.contiguous()
    return running
