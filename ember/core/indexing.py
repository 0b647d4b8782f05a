"""Indexing Tensor methods: __getitem__/__setitem__ (PyTorch's rules), gather/scatter, index_select, tril/triu, one_hot.

Basic indices (ints, slices with steps, None, Ellipsis) are views. Integer-tensor and boolean-mask indices are
compositions in `advanced_indexing`: a comparison against an ARANGE and a reduce, fused into one kernel.
Out-of-range Python ints raise IndexError at the call; out-of-range integer tensor indices raise
IndexOutOfRangeError (core/checks.py): at the call when their values are on the host, else when a value computed
from them is first realized.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast, overload

from ember.core import dtype as dtypes
from ember.core.checks import check_index
from ember.core.errors import ArgumentError, AxisError, DTypeError, ShapeError
from ember.core.index_updates import IndexUpdateOps
from ember.core.ops import Op
from ember.core.shapes import Shape, broadcast_shapes, normalize_dim

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

SCATTER_REDUCE_MODES = {"sum": "sum", "prod": "prod", "mean": "mean", "amax": "amax", "amin": "amin", "max": "amax",
                        "min": "amin"}
INDEX_TYPES = "ints, slices, None, Ellipsis, bools, and integer or bool tensors, lists or numpy arrays"


@dataclass
class AdvancedIndex:
    """A tensor index: `index` covers the view dims `dims` (a bool mask covers mask.ndim of them, 0 for a scalar)."""

    index: Tensor
    dims: tuple[int, ...]
    position: int  # the view dim where it appears
    is_mask: bool

    @property
    def acts_as_int(self) -> bool:
        """A 0-d integer tensor removes its dim like a Python int (torch's rule for where advanced dims go)."""
        return not self.is_mask and self.index.ndim == 0


@dataclass
class IndexPlan:
    """A parsed index: the basic view (shrink, stride, reshape) and the advanced indices applied to the view."""

    bounds: list[tuple[int, int]] = field(default_factory=list)  # per source dim
    steps: list[int] = field(default_factory=list)  # per source dim
    strided_shape: list[int] = field(default_factory=list)  # per source dim, after shrink and stride
    view_shape: list[int] = field(default_factory=list)  # ints dropped, None dims added
    advanced: list[AdvancedIndex] = field(default_factory=list)
    adjacent: bool = True  # the advanced indices are next to each other (their result dims stay in place)

    def is_identity(self, shape: Shape) -> bool:
        return tuple(self.view_shape) == shape and all(step == 1 for step in self.steps) and all(
            bound == (0, size) for bound, size in zip(self.bounds, shape)
        )

    def view(self, tensor: Tensor) -> Tensor:
        """The basic part of the index, as views of tensor: a shrink, then for steps a reshape and a shrink."""
        if all(step == 1 for step in self.steps):
            return tensor.shrink(self.bounds).reshape(tuple(self.view_shape))
        # make each stepped range a whole number of steps long (reading past its end, or padding at the tensor's end),
        # split it into (count, step) and keep index 0 of each step
        bounds, padding, split_shape, keep = [], [], [], []
        for (start, stop), step, count, size in zip(self.bounds, self.steps, self.strided_shape, tensor.shape):
            end = start + count * step
            bounds.append((start, min(end, size)))
            padding.append((0, max(0, end - size)))
            split_shape += [count, step]
            keep += [None, (0, 1)]
        result = tensor.shrink(bounds)._pad_and_shrink(padding)
        return result.reshape(split_shape).shrink(keep).reshape(tuple(self.view_shape))

    def unview(self, value: Tensor, fill: Any) -> Tensor:
        """Inverse of view: value (of the view's shape) placed in the source's shape, `fill` elsewhere."""
        result = value.reshape(tuple(self.strided_shape))
        if any(step != 1 for step in self.steps):
            interleaved = result.reshape(tuple(part for size in result.shape for part in (size, 1)))
            amounts = [(0, 0) if index % 2 == 0 else (0, self.steps[index // 2] - 1)
                       for index in range(interleaved.ndim)]
            spread = interleaved._pad_and_shrink(amounts, fill)
            result = spread.reshape(tuple(size * step for size, step in zip(result.shape, self.steps)))
            result = result.shrink([(0, end - start) for start, end in self.bounds])
        return result

    def merge(self, tensor: Tensor, new_view: Tensor) -> Tensor:
        """tensor with the region of the view replaced by new_view (a select: nothing outside it changes)."""
        if self.is_identity(tensor.shape):
            return new_view
        amounts = [(start, size - end) for (start, end), size in zip(self.bounds, tensor.shape)]
        placed = self.unview(new_view, 0)._pad_and_shrink(amounts, 0)
        region = self.unview(tensor._full(tuple(self.view_shape), True, dtypes.bool_, tensor.device), False)
        region = region._pad_and_shrink(amounts, False)
        return region._apply(Op.WHERE, placed, tensor)


def parse_indices(tensor: Tensor, indices: Any) -> IndexPlan:
    """Check an index against the tensor's shape (IndexError naming the dim and size) and plan it."""
    if isinstance(indices, list) and _list_is_tuple(indices):
        warnings.warn("indexing with a list that holds sequences, tensors, slices, None or Ellipsis reads it as a "
                      "tuple of indices, as torch does (deprecated there); write x[tuple(indices)]", UserWarning,
                      stacklevel=3)
        indices = tuple(indices)
    if not isinstance(indices, tuple):
        indices = (indices,)
    items = [_classify(tensor, index) for index in indices]
    ellipses = sum(1 for kind, _ in items if kind == "ellipsis")
    if ellipses > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(value.ndim if kind == "mask" else 1 for kind, value in items if kind in ("slice", "int", "tensor",
                                                                                         "mask"))
    if consumed > tensor.ndim:
        raise IndexError(f"too many indices for a tensor of dimension {tensor.ndim} (shape {tensor.shape}): "
                         f"{consumed} dims indexed")
    expanded: list[tuple[str, Any]] = []
    for kind, value in items:
        if kind == "ellipsis":
            expanded.extend([("slice", slice(None))] * (tensor.ndim - consumed))
        else:
            expanded.append((kind, value))
    if not ellipses:
        expanded.extend([("slice", slice(None))] * (tensor.ndim - consumed))

    plan, dim, tags = IndexPlan(), 0, []
    for kind, value in expanded:
        view_dim = len(plan.view_shape)
        if kind == "none":
            plan.view_shape.append(1)
            tags.append("basic")
            continue
        if kind == "mask" and value.ndim == 0:
            plan.advanced.append(AdvancedIndex(value, (), view_dim, True))
            tags.append("advanced")
            continue
        width = value.ndim if kind == "mask" else 1
        sizes = tensor.shape[dim : dim + width]
        if kind == "slice":
            start, stop, step = _slice_bounds(value, sizes[0])
            plan.bounds.append((start, stop))
            plan.steps.append(step)
            plan.strided_shape.append(-(-(stop - start) // step))
            plan.view_shape.append(plan.strided_shape[-1])
            tags.append("basic")
        elif kind == "int":
            if not -sizes[0] <= value < sizes[0]:
                raise IndexError(f"index {value} is out of bounds for dim {dim} with size {sizes[0]} "
                                 f"(tensor shape {tensor.shape})")
            position = value % sizes[0]
            plan.bounds.append((position, position + 1))
            plan.steps.append(1)
            plan.strided_shape.append(1)
        else:
            if kind == "mask" and value.shape != sizes:
                raise IndexError(
                    f"the shape of the mask {value.shape} at index {dim} does not match the shape {sizes} of the "
                    f"indexed dims {dim}..{dim + width - 1} of the tensor of shape {tensor.shape}"
                )
            for size in sizes:
                plan.bounds.append((0, size))
                plan.steps.append(1)
                plan.strided_shape.append(size)
                plan.view_shape.append(size)
            entry = AdvancedIndex(value, tuple(range(view_dim, view_dim + width)), view_dim, kind == "mask")
            plan.advanced.append(entry)
            if not entry.acts_as_int:
                tags.append("advanced")
        dim += width
    runs = "".join("a" if tag == "advanced" else "b" for tag in tags).strip("b")
    plan.adjacent = "b" not in runs
    return plan


def _list_is_tuple(indices: list[Any]) -> bool:
    """torch's legacy rule: a short list holding a sequence, tensor, slice, None or Ellipsis is a tuple of indices."""
    from ember.core.tensor import Tensor

    return len(indices) < 32 and any(
        index is None or index is Ellipsis or isinstance(index, (list, tuple, slice, Tensor))
        or (hasattr(index, "shape") and hasattr(index, "dtype"))
        for index in indices
    )


def _classify(tensor: Tensor, index: Any) -> tuple[str, Any]:
    """One index as (kind, value): none, ellipsis, slice, int, tensor (integer) or mask (bool)."""
    from ember.core.elementwise import ElementwiseOps as Tensor  # Tensor, and the numpy reference tensor

    if index is None:
        return "none", None
    if index is Ellipsis:
        return "ellipsis", None
    if isinstance(index, slice):
        return "slice", index
    if isinstance(index, bool) or type(index).__name__ == "bool_":  # a Python or numpy bool: a 0-d mask
        return "mask", tensor._full((), bool(index), dtypes.bool_, tensor.device)
    if not isinstance(index, Tensor) and hasattr(index, "__index__") and getattr(index, "ndim", 0) == 0:
        return "int", operator.index(index)  # ints, numpy integers and 0-d integer arrays
    if isinstance(index, (list, tuple)) or (hasattr(index, "shape") and hasattr(index, "dtype")
                                            and not isinstance(index, Tensor)):
        index = _tensor_from_sequence(tensor, index)
    if isinstance(index, Tensor):
        if index.dtype == dtypes.uint8:  # torch's deprecated byte masks
            index = index != 0
        if index.dtype.is_bool:
            return "mask", index
        if not index.dtype.is_int:
            raise IndexError(f"tensors used as indices must be integer or bool tensors, got {index.dtype.name}")
        return "tensor", index
    raise IndexError(f"invalid index of type {type(index).__name__}; valid indices are {INDEX_TYPES}")


def _tensor_from_sequence(tensor: Tensor, values: Any) -> Tensor:
    import numpy as np

    from ember.core.creation import node_from_data
    from ember.core.tensor import Tensor

    try:
        array = np.asarray(values)
    except ValueError:
        raise IndexError(f"an index sequence must be rectangular; valid indices are {INDEX_TYPES}") from None
    if array.size == 0:
        array = array.astype(np.int64)
    if array.dtype.kind not in "biu":
        raise IndexError(f"an index sequence must hold ints or bools, got {array.dtype}; valid indices: {INDEX_TYPES}")
    return Tensor._from_node(node_from_data(array, None, tensor.device))


def _basic_index(tensor: Tensor, indices: Any) -> tuple[tuple[tuple[int, int], ...] | None, tuple[int, ...]] | None:
    """The crop (None: the whole tensor) and result shape of an index made only of ints in range and slices of step
    1 with int or None bounds, the common case (`x[0]`, `x[:, a:b]`); None for any other index, which
    `parse_indices` plans (and checks, raising its errors)."""
    if type(indices) is not tuple:
        indices = (indices,)
    node = getattr(tensor, "node", None)  # (the reference tensor of tests has the mixin and no node)
    shape = tuple(tensor.shape) if node is None else node.shape
    if len(indices) > len(shape):
        return None
    bounds: list[tuple[int, int]] = []
    view_shape: list[int] = []
    whole = True
    for index, size in zip(indices, shape):
        if type(index) is int:
            if not -size <= index < size:
                return None
            position = index % size
            bounds.append((position, position + 1))
            whole = whole and size == 1
        elif type(index) is slice and (index.start is None or type(index.start) is int) \
                and (index.stop is None or type(index.stop) is int) and (index.step is None or index.step == 1):
            start, stop, _ = index.indices(size)
            stop = max(start, stop)
            bounds.append((start, stop))
            view_shape.append(stop - start)
            whole = whole and start == 0 and stop == size
        else:
            return None
    for size in shape[len(indices):]:
        bounds.append((0, size))
        view_shape.append(size)
    return (None if whole else tuple(bounds)), tuple(view_shape)


def _slice_bounds(index: slice, size: int) -> tuple[int, int, int]:
    """start, stop, step of a slice over a dim of `size`, clamped like Python sequences (step > 0 only, as torch)."""
    try:
        start, stop, step = index.indices(size)
    except TypeError:
        raise IndexError(f"slice indices must be integers or None, got {index}") from None
    if step <= 0:
        raise ArgumentError(f"slice step must be greater than zero, got {index.step} (torch has no negative steps; "
                         "use flip)")
    return start, max(start, stop), step


class IndexingOps(IndexUpdateOps):
    """Mixin: indexing, gather/scatter and masks. Needs the movement and elementwise mixins."""

    __slots__ = ()

    def __getitem__(self, indices: Any) -> Tensor:
        from ember.core.advanced_indexing import advanced_take

        basic = _basic_index(cast("Tensor", self), indices)
        if basic is not None:  # ints and unit-step slices: the crop and the reshape, without the general plan
            bounds, view_shape = basic
            cropped = self if bounds is None else self._apply(Op.SHRINK, arg=bounds)
            return cropped._reshaped(view_shape)
        plan = parse_indices(cast("Tensor", self), indices)
        view = plan.view(cast("Tensor", self))
        return advanced_take(view, plan) if plan.advanced else view

    def __setitem__(self, indices: Any, value: Any) -> None:
        """Write value (broadcast to the indexed shape, cast to this dtype) in place, like torch: self.assign(...)."""
        alias = getattr(self, "_alias", None)  # (the reference tensor of tests has the mixin and no views)
        if alias is not None and any(op is Op.EXPAND for op, _, _ in alias.steps):
            # a view whose elements may share memory (overlapping unfold windows): write the indexed part only, as
            # torch does, so only that part has to be free of overlaps (views.write_through checks it)
            plan = parse_indices(cast("Tensor", self), indices)
            if not plan.advanced:
                part = self[indices]
                part.assign(_put(part, Ellipsis, value, accumulate=False))
                return
        self.assign(_put(cast("Tensor", self), indices, value, accumulate=False))

    def __iter__(self) -> Iterator[Tensor]:
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def index_put(self, indices: Sequence[Any], values: Any, accumulate: bool = False) -> Tensor:
        """A copy of self with self[indices] = values (or += values, duplicates summed, when accumulate)."""
        return _put(cast("Tensor", self), tuple(indices), values, accumulate)

    def index_put_(self, indices: Sequence[Any], values: Any, accumulate: bool = False) -> Tensor:
        return self.assign(self.index_put(indices, values, accumulate))

    # ---- gather / scatter --------------------------------------------------------------------------------------

    def gather(self, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
        """out[i][j][k] = self[index[i][j][k]][j][k] for dim 0 (and so on for other dims), like torch.gather; an
        index outside [0, size of dim) raises IndexOutOfRangeError."""
        return self._gather(dim, index, checked=True)

    def _gather(self, dim: int, index: Tensor, checked: bool) -> Tensor:
        """gather; `checked=False` for the indices ember computes itself (sort, topk, max), which are in range."""
        from ember.core.advanced_indexing import take_last

        source, axis = _scatter_gather_checks(cast("Tensor", self), dim, index, None, "gather")
        values = source.shrink([None if d == axis else (0, size) for d, size in enumerate(index.shape)])
        flat_index = _as_1d(index)
        if checked:
            flat_index = check_index(flat_index, source.shape[axis], "gather", axis, negatives=False)
        result = take_last(values.transpose(axis, -1), flat_index.transpose(axis, -1))
        return result.transpose(axis, -1).reshape(index.shape)

    def take_along_dim(self, indices: Tensor, dim: int | None = None) -> Tensor:
        if dim is None:
            return self.flatten().gather(0, indices.flatten())
        axis = normalize_dim(dim, self.ndim, "take_along_dim")
        if indices.ndim != self.ndim:
            raise ShapeError(f"take_along_dim: indices of shape {indices.shape} need the same number of dims as the "
                             f"input of shape {self.shape}")
        shape = list(broadcast_shapes(tuple(1 if d == axis else s for d, s in enumerate(self.shape)),
                                      tuple(1 if d == axis else s for d, s in enumerate(indices.shape)),
                                      op="take_along_dim"))
        source = self.expand(tuple(self.shape[axis] if d == axis else s for d, s in enumerate(shape)))
        return source.gather(axis, indices.expand(tuple(indices.shape[axis] if d == axis else s
                                                        for d, s in enumerate(shape))))

    def take(self, index: Tensor) -> Tensor:
        """self flattened, indexed by index (negative indices count from the end); the result has index's shape."""
        from ember.core.advanced_indexing import take_last

        _check_index_dtype(index, "take")
        flat = self.flatten()
        positions = check_index(index.flatten(), flat.shape[0], "take", None, negatives=True)
        return take_last(flat, positions).reshape(index.shape)

    def index_select(self, dim: int, index: Tensor) -> Tensor:
        """The slices index[i] along dim (an index outside [0, size of dim) raises, negative ones too, as torch)."""
        return self._index_select(dim, index, checked=True)

    def _index_select(self, dim: int, index: Tensor, checked: bool) -> Tensor:
        """index_select; `checked=False` for the indices ember computes itself, which are in range."""
        from ember.core.advanced_indexing import take_last

        _check_index_dtype(index, "index_select")
        if index.ndim > 1:
            raise ShapeError(f"index_select: index must be 0-d or 1-d, got shape {index.shape}")
        source = self.reshape(1) if self.ndim == 0 else self
        axis = normalize_dim(dim, source.ndim, "index_select")
        flat_index = index.reshape(-1)
        if checked:
            flat_index = check_index(flat_index, source.shape[axis], "index_select", axis, negatives=False)
        result = take_last(source.transpose(axis, -1), flat_index).transpose(axis, -1)
        return result.reshape(()) if self.ndim == 0 and index.ndim == 0 else result

    def scatter(self, dim: int, index: Tensor, src: Any = None, value: Any = None, *,
                reduce: str | None = None) -> Tensor:
        """A copy of self with self[index[i][j]][j] = src[i][j] for dim 0 (reduce: None, 'add' or 'multiply').

        With repeated indices and no reduce, the last write wins (torch leaves this unspecified).
        """
        source = value if src is None else src
        if source is None:
            raise TypeError("scatter: give src (a tensor or a number) or value")
        modes = {None: "replace", "add": "sum", "multiply": "prod"}
        if reduce not in modes:
            raise ArgumentError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
        return _scatter(cast("Tensor", self), dim, index, source, modes[reduce], True, "scatter")

    def scatter_(self, dim: int, index: Tensor, src: Any = None, value: Any = None, *,
                 reduce: str | None = None) -> Tensor:
        return self.assign(self.scatter(dim, index, src, value, reduce=reduce))

    def scatter_add(self, dim: int, index: Tensor, src: Tensor) -> Tensor:
        _check_source_tensor(src, "scatter_add")
        return _scatter(cast("Tensor", self), dim, index, src, "sum", True, "scatter_add")

    def scatter_add_(self, dim: int, index: Tensor, src: Tensor) -> Tensor:
        return self.assign(self.scatter_add(dim, index, src))

    def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                       include_self: bool = True) -> Tensor:
        """torch.scatter_reduce with reduce 'sum', 'prod', 'mean', 'amax' or 'amin' ('max' and 'min', which torch
        also accepts, are amax and amin)."""
        if not isinstance(reduce, str):
            raise TypeError(f"scatter_reduce: reduce must be a str, got {type(reduce).__name__}")
        if reduce not in SCATTER_REDUCE_MODES:
            raise ArgumentError(
                f"scatter_reduce: reduce must be 'sum', 'prod', 'mean', 'amax' or 'amin', got {reduce!r}"
            )
        if not isinstance(include_self, bool):
            raise TypeError(f"scatter_reduce: include_self must be a bool, got {type(include_self).__name__}")
        _check_source_tensor(src, "scatter_reduce")
        mode = SCATTER_REDUCE_MODES[reduce]
        return _scatter(cast("Tensor", self), dim, index, src, mode, include_self, "scatter_reduce")

    def scatter_reduce_(self, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                        include_self: bool = True) -> Tensor:
        return self.assign(self.scatter_reduce(dim, index, src, reduce, include_self=include_self))

    # ---- masks ---------------------------------------------------------------------------------------------------

    def masked_select(self, mask: Tensor) -> Tensor:
        """The elements where mask (broadcast with self) is True, as a 1-d tensor (reads the mask's count)."""
        if mask.dtype != dtypes.bool_:
            raise DTypeError(f"masked_select: mask must be a bool tensor, got {mask.dtype.name}")
        shape = broadcast_shapes(self.shape, mask.shape, op="masked_select")
        return self.expand(shape)[mask.expand(shape)]

    @overload
    def nonzero(self, *, as_tuple: Literal[False] = False) -> Tensor: ...

    @overload
    def nonzero(self, *, as_tuple: Literal[True]) -> tuple[Tensor, ...]: ...

    @overload
    def nonzero(self, *, as_tuple: bool) -> Tensor | tuple[Tensor, ...]: ...

    def nonzero(self, *, as_tuple: bool = False) -> Tensor | tuple[Tensor, ...]:
        """The indices of the non-zero elements, (count, ndim) int64 (reads the count from the device)."""
        from ember.core.advanced_indexing import nonzero_positions

        positions = nonzero_positions(cast("Tensor", self) if self.dtype.is_bool else cast("Tensor", self) != 0)
        columns = []
        stride = 1
        for size in reversed(self.shape):
            columns.append((positions // stride) % size if size > 1 else positions * 0)
            stride *= size
        columns.reverse()
        if as_tuple:
            return tuple(columns) if self.ndim else (positions * 0,)
        if not columns:
            return positions.reshape(-1, 1)._pad_and_shrink([(0, 0), (0, -1)])
        return columns[0].unsqueeze(1).cat([column.unsqueeze(1) for column in columns[1:]], 1)

    def argwhere(self) -> Tensor:
        return self.nonzero()

    # ---- triangles and one-hot ---------------------------------------------------------------------------------

    def tril(self, diagonal: int = 0) -> Tensor:
        """The lower triangle of the last two dims (elements with column - row <= diagonal), zeros elsewhere."""
        return _triangle(cast("Tensor", self), diagonal, lower=True)

    def triu(self, diagonal: int = 0) -> Tensor:
        """The upper triangle of the last two dims (elements with column - row >= diagonal), zeros elsewhere."""
        return _triangle(cast("Tensor", self), diagonal, lower=False)

    def tril_(self, diagonal: int = 0) -> Tensor:
        return self.assign(self.tril(diagonal))

    def triu_(self, diagonal: int = 0) -> Tensor:
        return self.assign(self.triu(diagonal))

    def one_hot(self, num_classes: int = -1) -> Tensor:
        """torch.nn.functional.one_hot: int64 with a new last dim of num_classes (inferred as max + 1 when -1).

        With an explicit num_classes nothing is read from the device when it is recorded: a class outside
        [0, num_classes) raises IndexOutOfRangeError when the result is realized.
        """
        if not self.dtype.is_int:
            raise DTypeError(f"one_hot: expects an integer (index) tensor, got {self.dtype.name}")
        inferred = num_classes == -1  # from the values read: no check needed
        if inferred:
            if self.numel() == 0:
                raise ShapeError(f"one_hot: cannot infer the number of classes from an empty tensor {self.shape}")
            from ember.core.tensor import realize

            largest, smallest = self.max(), self.min()
            realize(largest, smallest)
            if smallest.item() < 0:
                raise ArgumentError(f"one_hot: class values must be non-negative, got {smallest.item()}")
            num_classes = int(largest.item()) + 1
        if num_classes < 0:
            raise ArgumentError(f"one_hot: num_classes must be -1 or non-negative, got {num_classes}")
        classes = self._arange_primitive(num_classes, dtypes.int64, self.device)
        values = self.cast(dtypes.int64) if inferred else check_index(
            cast("Tensor", self), num_classes, "one_hot (class values)", None, negatives=False)
        return (values.unsqueeze(-1) == classes).cast(dtypes.int64)


def _put(tensor: Tensor, indices: Any, value: Any, accumulate: bool) -> Tensor:
    """tensor with tensor[indices] replaced by (or, with accumulate, increased by) value."""
    from ember.core.advanced_indexing import advanced_put

    plan = parse_indices(tensor, indices)
    value_tensor = _value_tensor(tensor, value)
    view = plan.view(tensor)
    if plan.advanced:
        new_view = advanced_put(view, plan, value_tensor, accumulate)
    else:
        update = broadcast_value(value_tensor, view.shape)
        new_view = view + update if accumulate else update
    return plan.merge(tensor, new_view)


def _value_tensor(tensor: Tensor, value: Any) -> Tensor:
    from ember.core.tensor import Tensor

    if isinstance(value, Tensor):
        result = value
    elif isinstance(value, (bool, int, float)) or (hasattr(value, "item") and getattr(value, "ndim", 1) == 0):
        return tensor._full((), value.item() if hasattr(value, "item") else value, tensor.dtype, tensor.device)
    else:
        result = tensor._from_data(value)
    return result.cast(tensor.dtype)


def broadcast_value(value: Tensor, shape: Shape) -> Tensor:
    """A value written through an index, broadcast to the indexed shape (extra leading size-1 dims dropped)."""
    extra = value.ndim - len(shape)
    if extra > 0 and all(size == 1 for size in value.shape[:extra]):
        value = value.reshape(value.shape[extra:])
    try:
        target = broadcast_shapes(value.shape, shape)
    except ShapeError:
        target = None
    if target != tuple(shape):
        raise ShapeError(f"shape mismatch: a value of shape {value.shape} cannot be broadcast to the indexing result "
                         f"of shape {tuple(shape)}")
    return value.expand(shape)


def _check_index_dtype(index: Any, name: str) -> None:
    from ember.core.elementwise import ElementwiseOps

    if not isinstance(index, ElementwiseOps):  # Tensor, and the numpy reference tensor
        raise TypeError(f"{name}: index must be an integer Tensor, got {type(index).__name__}")
    if not index.dtype.is_int:
        raise DTypeError(f"{name}: index must be an integer tensor, got {index.dtype.name}")


def _check_source_tensor(source: Any, name: str) -> None:
    """scatter_add and scatter_reduce take src as a tensor only (torch raises TypeError for a number; scatter takes
    one)."""
    from ember.core.elementwise import ElementwiseOps

    if not isinstance(source, ElementwiseOps):
        raise TypeError(f"{name}: src must be a Tensor, got {type(source).__name__} (scatter takes a number)")


def _as_1d(tensor: Tensor) -> Tensor:
    return tensor.reshape(1) if tensor.ndim == 0 else tensor


def _scatter_gather_checks(tensor: Tensor, dim: int, index: Tensor, src: Tensor | None, name: str) -> tuple[Tensor, int]:
    """torch's shape rules for gather/scatter: same rank; index no larger than src, nor than self outside dim."""
    _check_index_dtype(index, name)
    source = _as_1d(tensor)
    axis = normalize_dim(dim, source.ndim, name)
    if max(index.ndim, 1) != source.ndim and index.numel() != 0:
        raise ShapeError(f"{name}: index of shape {index.shape} must have as many dims as the input of shape "
                         f"{tensor.shape}")
    if src is not None and index.numel() != 0:
        index_rank, source_rank = max(index.ndim, 1), max(src.ndim, 1)
        if source_rank < index_rank:  # torch: an IndexError, src has no such dim
            raise AxisError(f"{name}: src of shape {src.shape} has fewer dims than the index of shape "
                            f"{index.shape}; they must have as many")
        if source_rank > index_rank:
            raise ShapeError(f"{name}: src of shape {src.shape} must have as many dims as the index of shape "
                             f"{index.shape}")
    index_shape = _as_1d(index).shape
    for d, (index_size, size) in enumerate(zip(index_shape, source.shape)):
        if d != axis and index_size > size:
            raise ShapeError(f"{name}: index of shape {index.shape} must not be larger than the input of shape "
                             f"{tensor.shape} in any dim except dim {dim}")
        if src is not None and index_size > _as_1d(src).shape[d]:
            raise ShapeError(f"{name}: index of shape {index.shape} must not be larger than src of shape "
                             f"{src.shape} in any dim")
    return source, axis


def _scatter(tensor: Tensor, dim: int, index: Tensor, source: Any, mode: str, include_self: bool, name: str) -> Tensor:
    from ember.core.advanced_indexing import put_last
    from ember.core.tensor import Tensor

    _check_index_dtype(index, name)
    if index.dtype not in (dtypes.int32, dtypes.int64):
        raise DTypeError(f"{name}: index must be an int64 or int32 tensor (as in PyTorch), got {index.dtype.name}")
    if isinstance(source, Tensor):
        if source.dtype is not tensor.dtype:
            raise DTypeError(f"{name}: src ({source.dtype.name}) must have the dtype of the input "
                             f"({tensor.dtype.name}), as in PyTorch; cast src with .to({tensor.dtype.name})")
        values = source
    else:
        values = None
    target, axis = _scatter_gather_checks(tensor, dim, index, source if values is not None else None, name)
    if index.numel() == 0:
        return tensor
    index_shape = _as_1d(index).shape
    region = [None if d == axis else (0, size) for d, size in enumerate(index_shape)]
    if values is None:
        values = tensor._full(index_shape, source, tensor.dtype, tensor.device)
    values = _as_1d(values).shrink([(0, size) for size in index_shape])
    sub = target.shrink(region)
    positions = check_index(_as_1d(index), target.shape[axis], name, axis, negatives=False)
    updated = put_last(sub.transpose(axis, -1), positions.transpose(axis, -1), values.transpose(axis, -1),
                       mode, include_self).transpose(axis, -1)
    if sub.shape != target.shape:
        amounts = [(0, 0) if bound is None else (0, size - bound[1]) for bound, size in zip(region, target.shape)]
        inside = updated._full(updated.shape, True, dtypes.bool_, updated.device)._pad_and_shrink(amounts, False)
        updated = inside._apply(Op.WHERE, updated._pad_and_shrink(amounts, 0), target)
    return updated.reshape(tensor.shape)


def _triangle(tensor: Tensor, diagonal: int, lower: bool) -> Tensor:
    name = "tril" if lower else "triu"
    if tensor.ndim < 2:
        raise ShapeError(f"{name}: the input needs at least 2 dims, got shape {tensor.shape}")
    diagonal = operator.index(diagonal)
    rows, columns = tensor.shape[-2:]
    row = tensor._arange_primitive(rows, dtypes.int64, tensor.device).reshape(rows, 1)
    column = tensor._arange_primitive(columns, dtypes.int64, tensor.device).reshape(1, columns)
    keep = (column - row) <= diagonal if lower else (column - row) >= diagonal
    zero = tensor._full((), False if tensor.dtype.is_bool else 0, tensor.dtype, tensor.device)
    return keep.expand(tensor.shape)._apply(Op.WHERE, tensor, zero.expand(tensor.shape))


def repeat_indices(counts: Tensor, output_size: int | None) -> Tensor:
    """For repeat_interleave with a tensor of counts: the source index of each output element (int64)."""
    if not counts.dtype.is_int:
        raise DTypeError(f"repeat_interleave: repeats must be an integer tensor, got {counts.dtype.name}")
    if output_size is None:
        from ember.core.tensor import realize

        total, smallest = counts.sum(), counts.min() if counts.numel() else counts.sum()
        realize(total, smallest)
        if smallest.item() < 0:
            raise ArgumentError("repeat_interleave: repeats must be non-negative")
        output_size = int(total.item())
    ends = counts.cast(dtypes.int64).cumsum(0)  # element i fills outputs [ends[i] - counts[i], ends[i])
    outputs = counts._arange_primitive(output_size, dtypes.int64, counts.device)
    return (ends.unsqueeze(0) <= outputs.unsqueeze(1)).sum(1)
