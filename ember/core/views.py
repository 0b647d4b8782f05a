"""Views that alias, as in torch: a tensor made by a view op shares its source's storage, so a write through any
tensor of a storage changes every other one, and each storage has one version counter autograd checks.

A `Storage` holds a hidden tensor with the storage's value (the shape of the tensor first viewed) and its autograd
history. Each tensor of the storage (its `_alias`) records the movement ops that derive it from that value
(`steps`) and torch's layout of it (strides and offset in elements). A write through a tensor of the storage puts
the new values into the storage's value through the inverse of its steps (a pad and a select per crop: one fused
kernel over the storage), then re-derives every live tensor of the storage from the new value, so reads of any of
them see it. A tensor that is not a view and has no views has no storage and pays nothing.

Which results are views follows torch: the view ops (`VIEW_METHODS`) give views when their result is movement ops
of the source and torch's strides can describe it (a reshape that torch must copy, e.g. of a transpose, is a copy,
as is flip); the view ops are marked on the Tensor class by `view_methods`.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ember.context import CONTEXT
from ember.core.errors import AutogradError, ShapeError
from ember.core.graph import Node, movement_shape
from ember.core.ops import MOVEMENT_OPS, Op
from ember.core.shapes import Shape, prod, strides_of

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

Step = tuple[Op, Any, Shape]  # a movement op, its arg, and the shape it applies to

# the Tensor methods and properties whose results are views of their source in torch
VIEW_METHODS = ("reshape", "view", "view_as", "reshape_as", "expand", "expand_as", "broadcast_to", "permute", "shrink",
                "narrow", "select", "transpose", "swapaxes", "swapdims", "t", "movedim", "moveaxis", "flatten",
                "unflatten", "squeeze", "unsqueeze", "split", "chunk", "unbind", "tensor_split", "__getitem__",
                "adjoint")  # and diagonal and unfold, whose layouts are formulas (_diagonal_layout, _unfold_layout)
VIEW_PROPERTIES = ("T", "mT", "H", "mH")

OVERLAP_MESSAGE = ("unsupported operation: more than one element of the written-to tensor refers to a single memory "
                   "location. Please clone() the tensor before performing the operation.")


class Storage:
    """The memory a base tensor and its views share: a hidden tensor with its value and history, a version counter,
    weak references to the tensors viewing it, and the tensor first viewed, whose value the hidden tensor holds.

    When that tensor goes while one tensor of the storage is left (the reshape that ends `x.sum()` views an
    intermediate that is gone when sum returns), the storage is orphaned: `compact_orphans` later makes the one left
    the root of a storage of its own, so the hidden tensor stops holding the old graph (and a buffer an in-place
    write could reuse)."""

    __slots__ = ("base", "members", "tensor", "version", "__weakref__")

    def __init__(self, tensor: Tensor, version: int, base: Tensor) -> None:
        self.tensor = tensor
        self.version = version
        self.members: list[weakref.ref[Tensor]] = []
        self.base = _BaseReference(base, _base_gone)
        self.base.storage = weakref.ref(self)

    def live_members(self) -> list[Tensor]:
        """The tensors of this storage still alive (dead references are dropped)."""
        alive = []
        references = []
        for reference in self.members:
            member = reference()
            if member is not None and member._alias is not None and member._alias.storage is self:
                alive.append(member)
                references.append(reference)
        self.members = references
        return alive

    def add(self, member: Tensor) -> None:
        members = self.members
        if len(members) >= 16 and (len(members) & (len(members) - 1)) == 0:  # at powers of two: drop the dead
            self.live_members()
        self.members.append(weakref.ref(member))


class _BaseReference(weakref.ref):  # type: ignore[type-arg]
    """A storage's weak reference to the tensor it was made for, which knows its storage (weakly: no cycle)."""

    __slots__ = ("storage",)
    storage: weakref.ref[Storage]


ORPHANED: list[weakref.ref[Storage]] = []  # storages whose first tensor is gone (compact_orphans looks at them)


def _base_gone(reference: _BaseReference, orphaned: list[weakref.ref[Storage]] = ORPHANED) -> None:
    """The tensor a storage was made for is gone: look at the storage at the next compaction (never here: this runs
    wherever the last reference happens to drop, at the interpreter's exit too, when the module's globals are
    already None: the list is bound here)."""
    orphaned.append(reference.storage)
    if len(orphaned) > 256:  # (forget the storages gone since)
        orphaned[:] = [storage for storage in orphaned if storage() is not None]


def compact_orphans() -> None:
    """Give the one tensor left of each orphaned storage a storage of its own (its layout kept), so the old hidden
    tensor and the graph it holds are freed. Called where no view is being made or written (the scheduler, before
    it decides whether an in-place write may reuse a buffer)."""
    pending = ORPHANED[:]
    del ORPHANED[:len(pending)]
    for reference in pending:
        storage = reference()
        if storage is None:
            continue
        members = storage.live_members()
        if len(members) == 1:
            _reroot(members[0])


def _reroot(member: Tensor) -> None:
    """member becomes the root of a new storage holding its own value (its layout, version sharing and
    detachedness kept): the only tensor left of its old storage."""
    alias = member._alias
    assert alias is not None
    version = alias.storage.version if alias.shares_version else member._version
    storage = _new_storage(member).storage
    storage.version = version
    member._alias = Alias(storage, (), alias.strides, alias.offset, alias.shares_version, alias.detached, None)


class Alias:
    """How one tensor views its storage: the steps from the storage's value, torch's strides and offset of it,
    whether its writes count in the storage's version (a `.data` alias's do not, as in torch), whether it is
    detached (`.data`, `detach()`: its autograd history is its own, writes through it are not recorded in the
    storage's), and the tensor it is a view of (torch's `_base`; None for a tensor that is no view)."""

    __slots__ = ("base", "detached", "offset", "shares_version", "steps", "storage", "strides")

    def __init__(self, storage: Storage, steps: tuple[Step, ...], strides: tuple[int, ...], offset: int,
                 shares_version: bool, detached: bool = False, base: weakref.ref[Tensor] | None = None) -> None:
        self.storage = storage
        self.steps = steps
        self.strides = strides
        self.offset = offset
        self.shares_version = shares_version
        self.detached = detached
        self.base = base


# ---- making views --------------------------------------------------------------------------------------------------


def link_view(source: Tensor, result: Tensor, shares_version: bool = True,
              layout_of: Callable[[tuple[int, ...], int], tuple[tuple[int, ...], int]] | None = None) -> Tensor:
    """Make result (computed from source by a view op) a view of source's storage when it is one in torch.
    layout_of(strides, offset) gives the result's layout from the source's where the steps do not say it. With
    shares_version False (`.data`) result is a detached alias of source instead, with a version of its own."""
    if result is source or result._alias is not None:  # the source itself, or linked by an inner view op
        return result
    if not shares_version:
        return _alias_of(source, result, False)
    steps = movement_steps(result.node, source.node)
    if steps is None:
        return result
    alias = source._alias if source._alias is not None else _new_storage(source)
    if layout_of is not None:
        layout: tuple[tuple[int, ...], int] | None = layout_of(alias.strides, alias.offset)
    else:
        layout = simulate_layout(source.shape, alias.strides, alias.offset, steps)
    if layout is None:  # torch copies here (a reshape its strides cannot express)
        return result
    shares = alias.shares_version
    base = alias.base if alias.base is not None else weakref.ref(source)
    result._alias = Alias(alias.storage, alias.steps + steps, layout[0], layout[1], shares, alias.detached, base)
    result._version = alias.storage.version if shares else source._version
    alias.storage.add(result)
    return result


def detach_alias(source: Tensor) -> Tensor:
    """torch's detach(): the same storage (writes through either change both, and count in its version), no
    history."""
    from ember.core.tensor import Tensor

    return _alias_of(source, Tensor._from_node(source.node), True)


def _alias_of(source: Tensor, result: Tensor, shares_version: bool) -> Tensor:
    """Make result (with source's value, no history) a detached alias of source's storage: detach(), or `.data`
    (shares_version False: its writes do not count in the storage's version)."""
    alias = source._alias if source._alias is not None else _new_storage(source)
    shares = alias.shares_version and shares_version
    result._alias = Alias(alias.storage, alias.steps, alias.strides, alias.offset, shares, True, None)
    result._version = alias.storage.version if shares else source._version
    alias.storage.add(result)
    return result


def _new_storage(source: Tensor) -> Alias:
    """Give source a storage of its own (it becomes the base of the views made from it)."""
    from ember.core.tensor import Tensor

    hidden = Tensor._from_node(source.node, source._requires_grad)
    hidden._context = source._context
    hidden._saved_versions = source._saved_versions
    hidden._version = source._version
    storage = Storage(hidden, source._version, source)
    alias = Alias(storage, (), strides_of(source.shape), 0, True)
    source._alias = alias
    storage.add(source)
    return alias


def movement_steps(node: Node, source: Node) -> tuple[Step, ...] | None:
    """The movement ops that make node from source, first first; None when node is not movement ops of source."""
    steps: list[Step] = []
    while node is not source:
        if node.op not in MOVEMENT_OPS or not node.srcs:
            return None
        parent = node.srcs[0]
        steps.append((node.op, node.arg, parent.shape))
        node = parent
    steps.reverse()
    return tuple(steps)


def simulate_layout(shape: Shape, strides: tuple[int, ...], offset: int,
                    steps: tuple[Step, ...]) -> tuple[tuple[int, ...], int] | None:
    """torch's strides and offset after the steps, or None where torch could not view (a flip, a reshape across
    non-contiguous dims). A pad (which a stepped slice uses to make its range whole steps long) extends a dim past
    the storage; the crop after it never reads there."""
    current = list(strides)
    for op, arg, in_shape in steps:
        if op is Op.RESHAPE:
            found = reshape_strides(in_shape, tuple(current), tuple(arg))
            if found is None:
                return None
            current = list(found)
        elif op is Op.PERMUTE:
            current = [current[axis] for axis in arg]
        elif op is Op.EXPAND:
            current = [0 if old != new else stride for old, new, stride in zip(in_shape, arg, current)]
        elif op is Op.SHRINK:
            offset += sum(start * stride for (start, _), stride in zip(arg, current))
        elif op is not Op.PAD:  # FLIP: torch has no negative strides, flip copies
            return None
    return tuple(current), offset


def reshape_strides(old_shape: Shape, old_strides: tuple[int, ...], new_shape: Shape) -> tuple[int, ...] | None:
    """The strides of a view of new_shape over a tensor of old_shape and old_strides, or None where torch's view
    is impossible (torch's computeStride)."""
    if prod(old_shape) == 0 or not old_shape:
        return strides_of(new_shape)
    new_strides = [0] * len(new_shape)
    view_dim = len(new_shape) - 1
    chunk_base_stride = old_strides[-1]
    tensor_count = 1
    view_count = 1
    for tensor_dim in range(len(old_shape) - 1, -1, -1):
        tensor_count *= old_shape[tensor_dim]
        if tensor_dim == 0 or (old_shape[tensor_dim - 1] != 1
                               and old_strides[tensor_dim - 1] != tensor_count * chunk_base_stride):
            while view_dim >= 0 and (view_count < tensor_count or new_shape[view_dim] == 1):
                new_strides[view_dim] = view_count * chunk_base_stride
                view_count *= new_shape[view_dim]
                view_dim -= 1
            if view_count != tensor_count:
                return None
            if tensor_dim > 0:
                chunk_base_stride = old_strides[tensor_dim - 1]
                tensor_count = 1
                view_count = 1
    if view_dim != -1:
        return None
    return tuple(new_strides)


def view_methods(tensor_class: type) -> type:
    """Mark the view ops of tensor_class: their results become views of the tensor they are called on."""
    for name in VIEW_METHODS:
        method = getattr(tensor_class, name)
        setattr(tensor_class, name, _viewing(method))
    tensor_class.diagonal = _formula_view(tensor_class.diagonal, _diagonal_layout)  # type: ignore[attr-defined]
    tensor_class.unfold = _formula_view(tensor_class.unfold, _unfold_layout)  # type: ignore[attr-defined]
    for name in VIEW_PROPERTIES:
        getter = getattr(tensor_class, name).fget
        setattr(tensor_class, name, property(_viewing(getter), doc=getter.__doc__))
    return tensor_class


class _Nesting(threading.local):
    """Whether a view op is running on this thread: only the outermost links its result (the view ops it calls
    make intermediates, which are not the user's views). Per thread: another thread's view op in progress must not
    stop this thread's views from being linked."""

    depth = 0


_NESTING = _Nesting()


Function = TypeVar("Function", bound=Callable[..., Any])


def intermediates(function: Function) -> Function:
    """Mark `function` as building another op's intermediates: the view ops it calls link no views (each link walks
    the movement steps and simulates strides), as those called by a view op do not. Only for ember's own code whose
    tensors never reach the user as views (a view op wrapping it still links its own result); never around user
    code, whose in-place writes through a view must reach the viewed tensor."""

    @functools.wraps(function)
    def building(*args: Any, **kwargs: Any) -> Any:
        if _NESTING.depth:
            return function(*args, **kwargs)
        _NESTING.depth = 1
        try:
            return function(*args, **kwargs)
        finally:
            _NESTING.depth = 0

    return cast(Function, building)


def _viewing(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def view_op(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        if _NESTING.depth:
            return method(self, *args, **kwargs)
        _NESTING.depth = 1
        try:
            result = method(self, *args, **kwargs)
        finally:
            _NESTING.depth = 0
        if isinstance(result, tuple):
            for piece in result:
                link_view(self, piece)
            return result
        return link_view(self, result)

    return view_op


Layout = Callable[[tuple[int, ...], int], tuple[tuple[int, ...], int]]  # (strides, offset) -> the result's


def _formula_view(method: Callable[..., Any], layout: Callable[..., Layout]) -> Callable[..., Any]:
    """A view op whose result's layout is torch's formula, `layout(source, result, *args)` giving it from the
    source's, where simulating its steps cannot (a flatten no strides express)."""

    @functools.wraps(method)
    def view(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        if _NESTING.depth:
            return method(self, *args, **kwargs)
        _NESTING.depth = 1
        try:
            result = method(self, *args, **kwargs)
        finally:
            _NESTING.depth = 0
        return link_view(self, result, layout_of=layout(self, result, *args, **kwargs))

    return view


def _diagonal_layout(source: Tensor, result: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Layout:
    """diagonal's steps (a crop, a flatten and a strided crop) are invertible, but the flatten of the crop is no
    view: the layout is the two dims' strides summed."""
    first, second = dim1 % source.ndim, dim2 % source.ndim

    def layout_of(strides: tuple[int, ...], start: int) -> tuple[tuple[int, ...], int]:
        lead = tuple(stride for axis, stride in enumerate(strides) if axis not in (first, second))
        shift = offset * strides[second] if offset >= 0 else -offset * strides[first]
        return lead + (strides[first] + strides[second],), start + (shift if result.numel() else 0)

    return layout_of


def _unfold_layout(source: Tensor, result: Tensor, dimension: int, size: int, step: int) -> Layout:
    """Overlapping unfold windows (size > step) are copies of the dim laid end to end (an expand), whose strides no
    flatten can express: the layout is the dim's stride times step, and the dim's stride again for the window's
    new last dim. The values follow the base's writes; a write through windows places its values by that layout
    (`_scatter_by_layout`), and one through windows that overlap raises."""
    axis = dimension % source.ndim if source.ndim else 0

    def layout_of(strides: tuple[int, ...], start: int) -> tuple[tuple[int, ...], int]:
        if not strides:  # a 0-d tensor's one window of one element
            return (1,), start
        return strides[:axis] + (strides[axis] * step,) + strides[axis + 1:] + (strides[axis],), start

    return layout_of


def check_viewable(source: Tensor, shape: Shape) -> None:
    """torch's view() error for a shape that source's strides cannot express (reshape copies there instead)."""
    alias = source._alias
    if alias is None or source.shape == shape or reshape_strides(source.shape, alias.strides, shape) is not None:
        return
    raise ShapeError(
        f"view size is not compatible with input tensor's size and stride (at least one dimension spans across two "
        f"contiguous subspaces): a tensor of shape {source.shape} and strides {alias.strides} cannot be viewed as "
        f"{shape}. Use .reshape(...) instead."
    )


# ---- writing through a view -----------------------------------------------------------------------------------


def write_through(target: Tensor, value: Tensor) -> Tensor:
    """Write value (target's shape, dtype and device) into target's storage; every tensor of it sees the change."""
    alias = target._alias
    assert alias is not None
    storage = alias.storage
    hidden = storage.tensor
    if any(stride == 0 and size > 1 for stride, size in zip(alias.strides, target.shape)):
        raise RuntimeError(OVERLAP_MESSAGE)
    if any(op is Op.EXPAND for op, _, _ in alias.steps) and _overlaps(target.shape, alias.strides):
        # torch writes element by element here, in an order it does not promise; ember refuses
        raise RuntimeError(f"{OVERLAP_MESSAGE} (elements of this view share memory locations: overlapping unfold "
                           f"windows)")
    context = CONTEXT.get()
    if leave_storage(target):
        return target.assign(value)
    members = storage.live_members()
    # a detached alias (`.data`, `detach()`) writes without recording into the storage's history (a write of a
    # value with history gives the target its own, as torch records on a detached tensor); other writes are
    # recorded as torch's CopySlices
    if alias.detached:
        recording = False
        if context.grad_enabled and (target._requires_grad or value._requires_grad):
            target._assign_history(value)
    else:
        recording = context.grad_enabled and (hidden._requires_grad or value._requires_grad)
        if recording and hidden._requires_grad and hidden._context is None:
            if alias.steps or alias.base is not None:
                raise AutogradError("a view of a leaf Variable that requires grad is being used in an in-place "
                                    "operation.")
            raise AutogradError("a leaf Variable that requires grad is being used in an in-place operation.")
    token = CONTEXT.set(context.with_grad(recording))
    try:
        _write(target, value, members, recording)
    finally:
        CONTEXT.reset(token)
    return target


def leave_storage(tensor: Tensor) -> bool:
    """Take tensor out of its storage when it is the only tensor left of it and laid out as a tensor without views
    (its views are gone): it then writes and is written like any tensor. Whether it has no storage now."""
    alias = tensor._alias
    if alias is None:
        return True
    if alias.steps or alias.offset != 0 or alias.strides != strides_of(tensor.shape):
        return False
    if len(alias.storage.live_members()) != 1:
        return False
    if alias.shares_version:
        tensor._version = alias.storage.version
    tensor._alias = None
    return True


def _write(target: Tensor, value: Tensor, members: list[Tensor], recording: bool) -> None:
    """write_through's work, with grad recording switched to `recording`."""
    from ember.core.tensor import snapshot

    alias = target._alias
    assert alias is not None
    storage = alias.storage
    hidden = storage.tensor
    if not alias.steps:
        new_value = value
    elif any(op is Op.EXPAND for op, _, _ in alias.steps):  # no inverse step by step: place by the layout instead
        new_value = _scatter_by_layout(hidden, alias.strides, alias.offset, value)
    else:
        new_value = _scatter(hidden, alias.steps, value)
    if recording:  # the history of the new value refers to the tensors of the storage as they were before
        from ember.core.tensor import _replace_source

        for member in members:
            if member._requires_grad and not member._alias.detached:  # type: ignore[union-attr]
                previous = snapshot(member)
                member._previous = previous
                _replace_source(new_value, member, previous)
    hidden.assign(new_value)
    if alias.shares_version:
        storage.version += 1
    else:
        target._version += 1
    for member in members:
        _derive(member, hidden, recording)
        if member._alias is not None and member._alias.shares_version:
            member._version = storage.version


def _scatter(hidden: Tensor, steps: tuple[Step, ...], value: Tensor) -> Tensor:
    """hidden with the elements that steps select replaced by value: each step's inverse, last step first."""
    parents = [hidden]
    for op, arg, _ in steps[:-1]:
        parents.append(parents[-1]._apply(op, arg=arg))
    result = value
    for (op, arg, in_shape), parent in zip(reversed(steps), reversed(parents)):
        if op is Op.RESHAPE:
            result = result._apply(Op.RESHAPE, arg=in_shape)
        elif op is Op.PERMUTE:
            inverse = [0] * len(arg)
            for position, axis in enumerate(arg):
                inverse[axis] = position
            result = result._apply(Op.PERMUTE, arg=tuple(inverse))
        elif op is Op.PAD:
            result = result._apply(Op.SHRINK, arg=tuple((before, before + size)
                                                         for (before, _), size in zip(arg[0], in_shape)))
        elif op is Op.SHRINK:
            amounts = tuple((start, size - end) for (start, end), size in zip(arg, in_shape))
            placed = result._apply(Op.PAD, arg=(amounts, _zero(result)))
            region = hidden._full(result.shape, True, _bool(), result.device)._apply(Op.PAD, arg=(amounts, False))
            result = region._apply(Op.WHERE, placed, parent)
        else:  # flip and expand are never steps of a view that can be written
            raise AssertionError(op)
    return result


def _overlaps(shape: Shape, strides: tuple[int, ...]) -> bool:
    """Whether two elements of a layout may share a memory location: with its dims ordered by stride, a dim's stride
    must pass the farthest element the smaller-stride dims reach (sizes of 1 are no dims)."""
    reach = 0
    for stride, size in sorted((stride, size) for size, stride in zip(shape, strides) if size > 1):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def _scatter_by_layout(hidden: Tensor, strides: tuple[int, ...], offset: int, value: Tensor) -> Tensor:
    """hidden (laid out contiguously) with the elements at offset + sum(index * stride) replaced by value's: how a
    write through a view whose steps have an expand (unfold's windows, which do not overlap here) reaches the
    storage."""
    from ember.core.creation import arange

    positions: Tensor | None = None
    for axis, (size, stride) in enumerate(zip(value.shape, strides)):
        shape = [1] * value.ndim
        shape[axis] = size
        term = (arange(size, device=value.device) * stride).reshape(shape)
        positions = term if positions is None else positions + term
    flat = hidden.reshape(-1)
    if positions is None:  # a 0-d value: one element
        return flat.scatter(0, arange(offset, offset + 1, device=value.device), value.reshape(1)).reshape(hidden.shape)
    return flat.scatter(0, (positions + offset).reshape(-1), value.reshape(-1)).reshape(hidden.shape)


def _derive(member: Tensor, hidden: Tensor, recording: bool) -> None:
    """Give member its value (and with recording, its history) anew from the storage's hidden tensor."""
    alias = member._alias
    assert alias is not None
    if recording and (member._requires_grad or hidden._requires_grad) and not alias.detached:
        from ember.core.tensor import Op as TensorOp
        from ember.core.tensor import _next_sequence

        derived = hidden
        for op, arg, _ in alias.steps:
            derived = derived._apply(op, arg=arg)
        member.node = derived.node
        member._requires_grad = derived._requires_grad
        if derived is hidden:
            member._context = (TensorOp.CONTIGUOUS, None, (hidden,))
            member._saved_versions = (hidden._version,)
        else:
            member._context = derived._context
            member._saved_versions = derived._saved_versions
        member._sequence = _next_sequence()
        return
    node = hidden.node
    for op, arg, _ in alias.steps:
        node = Node(op, (node,), arg, movement_shape(op, node.shape, arg), node.dtype)
    member.node = node


def set_value(tensor: Tensor, node: Node) -> None:
    """Replace tensor's values by node's without history (load_state_dict, `x.data = y`): its views see them too
    when the shape and dtype are kept; otherwise it leaves its storage."""
    from ember.core.tensor import Tensor

    if tensor._alias is None or node.shape != tensor.shape or node.dtype != tensor.dtype:
        unlink(tensor)
        tensor.node = node
        return
    token = CONTEXT.set(CONTEXT.get().with_grad(False))
    try:
        tensor.assign(Tensor._from_node(node))
    finally:
        CONTEXT.reset(token)


def unlink(tensor: Tensor) -> None:
    """Take tensor out of its storage: it stops sharing values with the other tensors of it."""
    tensor._alias = None


def rebind_view(tensor: Tensor, value: Tensor) -> None:
    """tensor becomes value, a view of it with another shape (t_, squeeze_, resize_): still in its storage when it
    stays a view of it."""
    alias = tensor._alias
    if alias is None:
        return
    steps = movement_steps(value.node, tensor.node)
    layout = None if steps is None else simulate_layout(tensor.shape, alias.strides, alias.offset, steps)
    if steps is None or layout is None:
        unlink(tensor)
        return
    tensor._alias = Alias(alias.storage, alias.steps + steps, layout[0], layout[1], alias.shares_version,
                          alias.detached, alias.base)


def _zero(tensor: Tensor) -> Any:
    return False if tensor.dtype.is_bool else 0 if tensor.dtype.is_int else 0.0


def _bool() -> Any:
    from ember.core import dtype as dtypes

    return dtypes.bool_
