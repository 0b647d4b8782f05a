"""Writes through a long index vector (setitem, index_put, index_copy, index_add, put) by sorting it once: each
target position finds its entries by binary search instead of comparing itself with every index.

`put_last` (core/advanced_indexing.py) writes by comparing each of the N target positions with each of the M
indices: O(N M) work, 62 s for 10^5 indices into 10^6 elements. Here the (index, position) pairs are sorted
(stably: a repeated index keeps its entries in input order), each target position t finds the run of entries naming
it, [low_t, high_t), by two binary searches of log2(M) gathers, and then
- "replace" takes the source of the run's last entry (the last write wins, as in put_last);
- "sum" adds the run's sources in input order: a window of the longest run's length, whose length is read from
  the device; where the longest run is long (a quarter of the indices, or a window past WINDOW_ELEMENTS: the ids
  of an embedding's gradient follow a Zipf law, "the" is a long run) each run's sum is the difference of two
  prefix sums of the sources in sorted order, accumulated in float64 (int64 for integers: exact, also where it
  wraps), so the difference of two large prefixes keeps the run's float32 sum. A device without float64 keeps
  the comparison form for floats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.core import dtype as dtypes
from ember.core import runtime
from ember.core.advanced_indexing import SORTED_WRITE_PAIRS, take_last
from ember.core.binary_search import binary_search
from ember.core.elementwise import where
from ember.core.sort_network import sort_records
from ember.core.staged_reduce import reduce_axes
from ember.core.ops import Op

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

WINDOW_ELEMENTS = 1 << 26  # elements a "sum" write may gather at once (leading dims x positions x longest run)


def sorted_write(target: Tensor, index: Tensor, source: Tensor, mode: str) -> Tensor | None:
    """target[..., index[m]] combined with source[..., m] ("replace" or "sum") for a 1-d int64 index, or None where
    the comparison form is as cheap or the write does not fit this form (put_last then writes it)."""
    size, count = target.shape[-1], index.shape[0]
    if mode not in ("replace", "sum") or index.ndim != 1 or size * count < SORTED_WRITE_PAIRS:
        return None
    positions = target._arange_primitive(count, dtypes.int64, target.device)
    # (index, position) packed in one int64 record: distinct, so the sort is stable in effect; an index outside
    # [0, size) (callers check them) sorts outside every run and is never read
    packed = sort_records((index * count + positions).reshape(1, 1, count)).reshape(count)
    entries = (packed % count).contiguous()
    sorted_index = (packed - entries) // count
    targets = target._arange_primitive(size, dtypes.int64, target.device)
    low = binary_search(sorted_index, targets, right=False)
    high = binary_search(sorted_index, targets, right=True)
    named = high > low
    if mode == "replace":
        # (stored: lowering reads a gather as one load only where its index is no reduce of its own)
        # (a position no entry names reads index -1: nothing, so the gradient's scatter has no run of them either)
        last = where(named, take_last(entries, (high - 1).maximum(0)), -1).contiguous()
        return where(named, take_last(source, last), target)
    lengths = high - low
    longest = int(lengths.max().item())
    if longest * 4 > count or longest * target.numel() > WINDOW_ELEMENTS:
        return _prefix_difference(target, source, entries, low, high)
    steps = target._arange_primitive(longest, dtypes.int64, target.device)
    slots = low.unsqueeze(-1) + steps  # [size, longest]: the run's entries, in input order
    inside = steps < lengths.unsqueeze(-1)
    chosen = where(inside, take_last(entries, slots.minimum(count - 1)), -1).reshape(-1).contiguous()  # (as above)
    terms = take_last(source, chosen).reshape(source.shape[:-1] + (size, longest))
    zero = target._full((), 0, target.dtype, target.device)
    total = reduce_axes(where(inside, terms, zero), Op.SUM, (terms.ndim - 1,)).reshape(terms.shape[:-1])
    return target + total


def _prefix_difference(target: Tensor, source: Tensor, entries: Tensor, low: Tensor, high: Tensor) -> Tensor | None:
    """target plus each position's run [low, high) of sources in sorted order, summed as prefix[high] - prefix[low]
    (O(M log M + N) whatever the runs' lengths); None for floats on a device without float64."""
    wide = dtypes.int64 if not target.dtype.is_float else dtypes.float64
    if wide is dtypes.float64 and not runtime.RUNTIME.supports_dtype(str(target.device), wide):
        return None
    prefix = take_last(source, entries).cast(wide).cumsum(-1)  # prefix[..., j]: the first j + 1 sorted sources
    zero = prefix._full((), 0, wide, prefix.device)

    def before(ends: Tensor) -> Tensor:  # the sum of the sorted sources before `ends` (0 before the first)
        return where(ends > 0, take_last(prefix, (ends - 1).maximum(0)), zero)

    return target + (before(high) - before(low)).cast(target.dtype)
