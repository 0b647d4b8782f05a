"""Advanced indexing as compositions of primitives: integer tensors and bool masks, for reads and writes.

A read `values[..., index]` compares the index with an ARANGE over the indexed dim and sums the one selected
element (the kernelizer fuses the comparison, the select and the sum into one kernel): the work is
(result size) x (indexed dim size). A write compares the other way around (each target position looks for the
index entries that name it). A bool mask is first turned into the positions of its True elements, which needs
their count: it is read from the device, as torch does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.core import dtype as dtypes
from ember.core.arithmetic import integer_floor_divide
from ember.core.checks import check_index
from ember.core.elementwise import where
from ember.core.errors import ShapeError
from ember.core.ops import Composite, Op
from ember.core.shapes import Shape, broadcast_shapes, prod
from ember.core.staged_reduce import reduce_axes

if TYPE_CHECKING:
    from ember.core.indexing import AdvancedIndex, IndexPlan
    from ember.core.tensor import Tensor


def wrap_negative(index: Tensor, size: int) -> Tensor:
    """index as int64 with negative entries counted from the end of a dim of `size`."""
    index = index.cast(dtypes.int64)
    return where(index < 0, index + size, index)


COUNTED_POSITIONS_LIMIT = 1 << 20  # nonzero's count x size up to which positions are counted (one kernel)
SORTED_WRITE_PAIRS = 1 << 22  # target positions x indices from which a write sorts its index (core/sorted_writes.py)


def _sum_last(tensor: Tensor) -> Tensor:
    """Sum over the last dim, keeping the dtype (bool through uint8, as an 'any')."""
    if tensor.dtype.is_bool:
        return _sum_last(tensor.cast(dtypes.uint8)) != 0
    return reduce_axes(tensor, Op.SUM, (tensor.ndim - 1,)).reshape(tensor.shape[:-1])


def _zero(tensor: Tensor) -> Tensor:
    return tensor._full((), False if tensor.dtype.is_bool else 0, tensor.dtype, tensor.device)


def take_last(values: Tensor, index: Tensor) -> Tensor:
    """out[..., m] = values[..., index[..., m]] with leading dims broadcast; 0 where index is out of range (callers
    check their indices: core/checks.py)."""
    if values.dtype.is_bool:
        return take_last(values.cast(dtypes.uint8), index) != 0
    size = values.shape[-1]
    positions = values._arange_primitive(size, dtypes.int64, values.device)
    index = index.cast(dtypes.int64)
    match = index.unsqueeze(-1) == positions  # (..., M, N)

    def gather(source: Tensor) -> Tensor:
        return picked_sum(where(match, source.unsqueeze(-2), _zero(source)), -1)

    if index.ndim == 1 and index.shape[0] * size >= SORTED_WRITE_PAIRS:  # its gradient: a sorted scatter-sum
        return values._recorded(Composite.GATHER, gather, (values,), index)
    return gather(values)


def picked_sum(selected: Tensor, dim: int) -> Tensor:
    """The sum over `dim` of a one-hot selection (at most one term along it is not zero), the dim dropped: one reduce
    primitive, never staged (exact: one term), which lowering reads as the one element it picks
    (ir/lower.Lowerer._one_hot_pick): O(M) loads, not O(M N) comparisons. A staged sum would hide the pattern."""
    axis = dim % selected.ndim
    return selected._apply(Op.SUM, arg=(axis,)).reshape(selected.shape[:axis] + selected.shape[axis + 1:])


def put_last(target: Tensor, index: Tensor, source: Tensor, mode: str, include_self: bool = True) -> Tensor:
    """target[..., index[..., m]] combined with source[..., m] over the last dim; leading dims broadcast.

    mode "replace" writes (the last of repeated indices wins), "sum"/"prod"/"mean"/"amax"/"amin" reduce the
    sources that land on one position together with the target (unless include_self is False). Positions no
    index names keep the target's value; out-of-range indices write nothing.
    """
    size, count = target.shape[-1], index.shape[-1]
    if count == 0:  # nothing is written
        return target
    if include_self and not target.dtype.is_bool:
        from ember.core.sorted_writes import sorted_write  # (it searches with take_last, defined here)

        written = sorted_write(target, index.cast(dtypes.int64), source, mode)
        if written is not None:
            return written
    positions = target._arange_primitive(size, dtypes.int64, target.device).reshape(size, 1)
    match = index.cast(dtypes.int64).unsqueeze(-2) == positions  # (..., N, M): index m names position n
    spread = source.unsqueeze(-2)  # (..., 1, M)
    if mode == "replace":
        order = target._arange_primitive(count, dtypes.int64, target.device)
        last = where(match, order, -1).amax(-1)  # the last m naming each position, -1 if none
        chosen = last.unsqueeze(-1) == order
        return where(last >= 0, _sum_last(where(chosen, spread, _zero(source))), target)
    hit = match.any(-1)
    identities = {"sum": 0, "mean": 0, "prod": 1, "amax": dtypes.min_value(target.dtype),
                  "amin": dtypes.max_value(target.dtype)}
    identity = target._full((), identities[mode], target.dtype, target.device)
    base = target if include_self else where(hit, identity, target)
    selected = where(match, spread, identity)
    if mode in ("sum", "mean"):
        total = base + _sum_last(selected)
        if mode == "sum":
            return total
        counted = match.sum(-1) + (1 if include_self else 0)
        divisor = where(counted == 0, 1, counted).cast(target.dtype)
        # (the divisor is at least 1: no division check)
        return integer_floor_divide(total, divisor) if not target.dtype.is_float else total / divisor
    if mode == "prod":
        return base * selected.prod(-1, dtype=target.dtype)
    if mode == "amax":
        return base.maximum(selected.amax(-1))
    return base.minimum(selected.amin(-1))


def nonzero_positions(mask: Tensor) -> Tensor:
    """The row-major positions of the True elements of a bool tensor, int64 of shape (count,).

    The count is read from the device; the r-th position is the number of elements whose running count of
    Trues is at most r (a comparison and a sum, fused), or for large masks the binary search of the running counts
    for the first that reaches r + 1.
    """
    flat = mask.reshape(-1)
    count = int(flat.sum().item()) if flat.numel() else 0
    if count == 0:
        return mask._full((0,), 0, dtypes.int64, mask.device)
    running = flat.cast(dtypes.int64).cumsum(0)
    ordinals = mask._arange_primitive(count, dtypes.int64, mask.device)
    size = flat.shape[0]
    if count * size <= COUNTED_POSITIONS_LIMIT:
        return (running.unsqueeze(0) <= ordinals.unsqueeze(1)).sum(1)
    # the r-th True is the first position whose running count reaches r + 1: a binary search of the running counts,
    # log2(n) gathers, not count x n comparisons (running[size - 1] = count reaches every r: the answer is < size)
    from ember.core.binary_search import binary_search  # (it gathers with take_last, defined here)

    return binary_search(running, ordinals + 1, right=False)


def _scalar_mask_count(mask: Tensor) -> int:
    """1 or 0 for a 0-d bool index (a Python bool is a constant and is not read from the device)."""
    return int(bool(mask.node.arg)) if mask.node.op is Op.CONST else int(bool(mask.item()))


def _linear_index(view: Tensor, items: list[AdvancedIndex]) -> tuple[Tensor, list[int]]:
    """One int64 index (broadcast shape of all indices) into the advanced dims of view flattened in order."""
    advanced_dims = sorted(dim for item in items for dim in item.dims)
    strides, running = {}, 1
    for dim in reversed(advanced_dims):
        strides[dim] = running
        running *= view.shape[dim]
    terms = []
    for item in items:
        if item.is_mask and item.index.ndim == 0:
            terms.append(view._full((_scalar_mask_count(item.index),), 0, dtypes.int64, view.device))
        elif item.is_mask:
            terms.append(nonzero_positions(item.index) * strides[item.dims[-1]])
        else:
            size = view.shape[item.dims[0]]
            index = check_index(item.index, size, "index", item.dims[0], negatives=True)
            terms.append(index * strides[item.dims[0]])
    try:
        shape = broadcast_shapes(*(term.shape for term in terms))
    except ShapeError:
        listed = ", ".join(str(term.shape) for term in terms)
        raise IndexError(f"shape mismatch: indexing tensors could not be broadcast together with shapes {listed}")
    linear = terms[0].expand(shape)
    for term in terms[1:]:
        linear = linear + term.expand(shape)
    return linear, advanced_dims


def _layout(view: Tensor, plan: IndexPlan, advanced_dims: list[int], index_shape: Shape) -> tuple[list[int], list[int]]:
    """The kept dims of view, and the permutation from (kept dims, index dims) to torch's result order."""
    kept = [dim for dim in range(view.ndim) if dim not in advanced_dims]
    placed = [item for item in plan.advanced if not item.acts_as_int]
    before = sum(1 for dim in kept if placed and dim < placed[0].position)
    kept_axes = list(range(len(kept)))
    index_axes = list(range(len(kept), len(kept) + len(index_shape)))
    if plan.adjacent:
        return kept, kept_axes[:before] + index_axes + kept_axes[before:]
    return kept, index_axes + kept_axes


def advanced_take(view: Tensor, plan: IndexPlan) -> Tensor:
    """view[advanced indices] with torch's rules for where the index dims go."""
    linear, advanced_dims = _linear_index(view, plan.advanced)
    kept, order = _layout(view, plan, advanced_dims, linear.shape)
    kept_shape = tuple(view.shape[dim] for dim in kept)
    values = view.permute(kept + advanced_dims).reshape(kept_shape + (prod(view.shape[d] for d in advanced_dims),))
    taken = take_last(values, linear.reshape(-1)).reshape(kept_shape + linear.shape)
    return taken.permute(order)


def advanced_put(view: Tensor, plan: IndexPlan, value: Tensor, accumulate: bool) -> Tensor:
    """view with view[advanced indices] replaced by (or increased by) value broadcast to the indexed shape."""
    from ember.core.indexing import broadcast_value

    single = plan.advanced[0] if len(plan.advanced) == 1 else None
    if single is not None and single.is_mask:
        written = _put_mask(view, single, value, accumulate)
        if written is not None:
            return written
    linear, advanced_dims = _linear_index(view, plan.advanced)
    kept, order = _layout(view, plan, advanced_dims, linear.shape)
    kept_shape = tuple(view.shape[dim] for dim in kept)
    result_shape = tuple((kept_shape + linear.shape)[axis] for axis in order)
    inverse = sorted(range(len(order)), key=order.__getitem__)
    update = broadcast_value(value, result_shape).permute(inverse).reshape(kept_shape + (linear.numel(),))
    indexed_shape = tuple(view.shape[dim] for dim in advanced_dims)
    values = view.permute(kept + advanced_dims).reshape(kept_shape + (prod(indexed_shape),))
    written = put_last(values, linear.reshape(-1), update, "sum" if accumulate else "replace")
    back = sorted(range(view.ndim), key=(kept + advanced_dims).__getitem__)
    return written.reshape(kept_shape + indexed_shape).permute(back)


def _put_mask(view: Tensor, item: AdvancedIndex, value: Tensor, accumulate: bool) -> Tensor | None:
    """A write through one bool mask with a value that is the same for every True element: a select, no count."""
    from ember.core.indexing import broadcast_value

    mask = item.index
    kept_shape = tuple(size for dim, size in enumerate(view.shape) if dim not in item.dims)
    before = item.position
    one_per_element = kept_shape[:before] + (1,) + kept_shape[before:]
    try:
        update = broadcast_value(value, one_per_element)
    except ShapeError:
        return None
    update = update.reshape(kept_shape[:before] + (1,) * mask.ndim + kept_shape[before:]).expand(view.shape)
    selector = mask.reshape((1,) * before + mask.shape + (1,) * (len(kept_shape) - before)).expand(view.shape)
    return where(selector, view + update if accumulate else update, view)
