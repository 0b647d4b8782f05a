"""`Region`: a box of a tensor's elements (one half-open range per axis), the unit of dirty-region tracking."""

from __future__ import annotations

from collections.abc import Sequence

from ember.core.errors import ArgumentError, ShapeError
from ember.core.shapes import Shape, prod

Range = tuple[int, int]


class Region:
    """The elements of a tensor of `shape` whose index lies in `ranges[axis]` = [start, end) on every axis.

    A region is immutable. Every empty box is the same region (`Region.empty(shape)`), so equality is exact; a
    rank-0 shape has two regions, the empty one and its single element."""

    __slots__ = ("is_empty", "ranges", "shape")

    shape: Shape
    ranges: tuple[Range, ...]
    is_empty: bool

    def __init__(self, shape: Sequence[int], ranges: Sequence[Sequence[int]]) -> None:
        shape = tuple(int(size) for size in shape)
        if len(ranges) != len(shape):
            raise ShapeError(
                f"Region: {len(ranges)} ranges {[tuple(r) for r in ranges]} for shape {shape} of rank {len(shape)}; "
                f"give one (start, end) per axis"
            )
        checked = []
        for axis, (size, bounds) in enumerate(zip(shape, ranges)):
            if len(bounds) != 2:
                raise ArgumentError(f"Region: axis {axis} range {tuple(bounds)} is not a (start, end) pair")
            start, end = int(bounds[0]), int(bounds[1])
            if not 0 <= start <= end <= size:
                raise ArgumentError(
                    f"Region: axis {axis} range ({start}, {end}) is out of range for shape {shape}; "
                    f"need 0 <= start <= end <= {size}"
                )
            checked.append((start, end))
        self.shape = shape
        self.is_empty = any(start == end for start, end in checked)
        self.ranges = tuple((0, 0) for _ in shape) if self.is_empty else tuple(checked)

    @classmethod
    def _of(cls, shape: Shape, ranges: Sequence[Range]) -> Region:
        """A region from ranges known to be valid for the shape (the rules' results): no checks."""
        region = cls.__new__(cls)
        region.shape = shape
        region.is_empty = any(start >= end for start, end in ranges)
        region.ranges = tuple((0, 0) for _ in shape) if region.is_empty else tuple(ranges)
        return region

    @classmethod
    def empty(cls, shape: Sequence[int]) -> Region:
        """No element of a tensor of `shape`."""
        region = cls(shape, [(0, 0)] * len(shape))
        region.is_empty = True  # (a rank-0 shape has no range to be empty)
        return region

    @classmethod
    def whole(cls, shape: Sequence[int]) -> Region:
        """Every element of a tensor of `shape` (empty when the shape has a zero-size axis)."""
        return cls(shape, [(0, size) for size in shape])

    @classmethod
    def from_index(cls, shape: Sequence[int], index: int | slice | Sequence[int | slice]) -> Region:
        """The box a basic index selects (`x[index]`: ints and slices of step 1, as many as the rank at most)."""
        items = list(index) if isinstance(index, (tuple, list)) else [index]
        shape = tuple(shape)
        if len(items) > len(shape):
            raise ShapeError(f"Region.from_index: index {index!r} has {len(items)} items for shape {shape}")
        ranges = []
        for axis, size in enumerate(shape):
            item = items[axis] if axis < len(items) else slice(None)
            if isinstance(item, slice):
                start, end, step = item.indices(size)
                if step != 1:
                    raise ArgumentError(f"Region.from_index: axis {axis} slice {item} has step {step}; only 1 is a box")
                ranges.append((start, max(start, end)))
            elif isinstance(item, int):
                position = item + size if item < 0 else item
                if not 0 <= position < size:
                    raise ArgumentError(f"Region.from_index: index {item} is out of range for axis {axis} of {shape}")
                ranges.append((position, position + 1))
            else:
                raise ArgumentError(f"Region.from_index: axis {axis} index {item!r} is not an int or a slice")
        return cls(shape, ranges)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements in the region."""
        return 0 if self.is_empty else prod(end - start for start, end in self.ranges)

    @property
    def is_whole(self) -> bool:
        return not self.is_empty and all(bounds == (0, size) for bounds, size in zip(self.ranges, self.shape))

    def slices(self) -> tuple[slice, ...]:
        """The region as a basic index (`array[region.slices()]` is the box; empty slices when empty)."""
        return tuple(slice(start, end) for start, end in self.ranges)

    def _check_same_shape(self, other: Region, operation: str) -> None:
        if self.shape != other.shape:
            raise ShapeError(f"Region.{operation}: regions of shapes {self.shape} and {other.shape}; need one shape")

    def hull(self, other: Region) -> Region:
        """The smallest box containing both regions (their union when it is a box)."""
        self._check_same_shape(other, "hull")
        if other.is_empty:
            return self
        if self.is_empty:
            return other
        return Region._of(self.shape, [(min(a, c), max(b, d)) for (a, b), (c, d) in zip(self.ranges, other.ranges)])

    def intersection(self, other: Region) -> Region:
        """The elements in both regions."""
        self._check_same_shape(other, "intersection")
        if self.is_empty or other.is_empty:
            return Region.empty(self.shape)
        ranges = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(self.ranges, other.ranges)]
        return Region._of(self.shape, ranges)

    def contains(self, other: Region) -> bool:
        """Whether every element of `other` is in this region."""
        self._check_same_shape(other, "contains")
        if other.is_empty:
            return True
        return not self.is_empty and all(a <= c and d <= b for (a, b), (c, d) in zip(self.ranges, other.ranges))

    def difference(self, other: Region) -> list[Region]:
        """The elements of this region not in `other`, as disjoint boxes (at most two per axis)."""
        overlap = self.intersection(other)
        if overlap.is_empty:
            return [] if self.is_empty else [self]
        pieces, remaining = [], list(self.ranges)
        for axis, ((start, end), (inner_start, inner_end)) in enumerate(zip(self.ranges, overlap.ranges)):
            for bounds in ((start, inner_start), (inner_end, end)):
                if bounds[0] < bounds[1]:
                    pieces.append(Region._of(self.shape, [*remaining[:axis], bounds, *remaining[axis + 1:]]))
            remaining[axis] = (inner_start, inner_end)
        return pieces

    def reshaped(self, shape: Sequence[int]) -> Region:
        """The smallest box of a reshape to `shape` holding this region's elements: exact where each group of axes
        the reshape splits or merges (`reshape_groups`) keeps the box a box, else a covering box (`_reshape_group`)."""
        shape = tuple(shape)
        if prod(shape) != prod(self.shape):
            raise ShapeError(f"Region.reshaped: shape {self.shape} cannot become {shape} (sizes differ)")
        if self.is_empty:
            return Region.empty(shape)
        ranges: list[Range] = []
        for old_axes, new_axes in reshape_groups(self.shape, shape):
            ranges.extend(_reshape_group([self.ranges[axis] for axis in old_axes],
                                         [self.shape[axis] for axis in old_axes], [shape[axis] for axis in new_axes]))
        return Region._of(shape, ranges)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Region):
            return NotImplemented
        return (self.shape, self.ranges, self.is_empty) == (other.shape, other.ranges, other.is_empty)

    def __hash__(self) -> int:
        return hash((self.shape, self.ranges, self.is_empty))

    def __repr__(self) -> str:
        if self.is_empty:
            return f"Region.empty({self.shape})"
        return f"Region({self.shape}, {list(self.ranges)})"


def reshape_groups(old: Shape, new: Shape) -> list[tuple[range, range]]:
    """The shortest runs of axes (old axes, new axes) with equal products, in order: a reshape maps each run of
    old axes onto its run of new axes independently (a run may have no axes on one side: size-1 axes)."""
    groups: list[tuple[range, range]] = []
    old_index = new_index = old_start = new_start = 0
    old_product = new_product = 1
    while old_index < len(old) or new_index < len(new):
        if new_index == len(new) or (old_index < len(old) and old_product <= new_product):
            old_product *= old[old_index]
            old_index += 1
        else:
            new_product *= new[new_index]
            new_index += 1
        if old_product == new_product:
            groups.append((range(old_start, old_index), range(new_start, new_index)))
            old_start, new_start = old_index, new_index
    return groups


def _reshape_group(ranges: list[Range], old_sizes: list[int], new_sizes: list[int]) -> list[Range]:
    """One group: the box's elements lie between its first and last element in row-major order, so the flat range
    [first, last] covers them; that range as a box of the new axes is exact when it is one, else its smallest
    covering box (an axis spanning several positions of the axis outside it becomes whole)."""
    first = last = 0
    for (start, end), size in zip(ranges, old_sizes):
        first, last = first * size + start, last * size + end - 1
    result: list[Range] = []
    inner = prod(new_sizes)
    spread = False  # an outer axis spans several positions: this one and all inner ones are whole
    for size in new_sizes:
        inner //= size
        if spread:
            result.append((0, size))
            continue
        low, high = first // inner, last // inner
        result.append((low, high + 1))
        first, last = first - low * inner, last - low * inner
        spread = low != high
    return result
