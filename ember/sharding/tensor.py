"""Sharding: a tensor split along one dim across devices; every op runs on every shard where it can, and
reductions or matmuls over the sharded dim combine partial results on the first device.

A `ShardedTensor` has the whole Tensor API (the same op mixins as `Tensor`): its primitive `_apply` dispatches
each op to the per-device shards, which are ordinary Tensors. So autograd needs nothing new: gradients flow through
the shards' own histories, and a sharded parameter's gradient is sharded like the parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ember.core.aliases import numpy_argument_names
from ember.core.convolution import ConvolutionOps
from ember.core.dtype import DType
from ember.core.elementwise import ElementwiseOps
from ember.core.errors import DeviceError, ShapeError
from ember.core.functional import FunctionalOps
from ember.core.indexing import IndexingOps
from ember.core.linalg import LinalgOps
from ember.core.losses import LossOps
from ember.core.movement import MovementOps
from ember.core.ops import ELEMENTWISE_OPS, REDUCE_COMBINE, REDUCE_OPS, Op
from ember.core.reductions import ReductionOps
from ember.core.shapes import Shape, normalize_dim, prod
from ember.core.tensor import Tensor


def split_sizes(size: int, parts: int) -> list[int]:
    """Sizes of `parts` nearly equal consecutive pieces of `size` (the first ones one larger)."""
    base, extra = divmod(size, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


def shard(tensor: Tensor, devices: Sequence[str], dim: int = 0) -> ShardedTensor:
    """Split `tensor` along `dim` into one consecutive piece per device (`Tensor.shard`)."""
    from ember.scheduler.devices import resolve_device

    names = [resolve_device(device) for device in devices]
    if len(set(names)) != len(names) or not names:
        raise DeviceError(f"shard: devices must be distinct and non-empty, got {list(devices)}")
    axis = normalize_dim(dim, tensor.ndim, "shard")
    size = tensor.shape[axis]
    if size < len(names):
        raise ShapeError(f"shard: dim {dim} of shape {tensor.shape} has {size} elements, fewer than the "
                         f"{len(names)} devices {names}")
    pieces, start = [], 0
    for device, length in zip(names, split_sizes(size, len(names))):
        piece = tensor.narrow(axis, start, length)
        pieces.append(piece.to(device) if piece.device != device else piece.contiguous())
        start += length
    result = ShardedTensor(pieces, axis)
    if tensor.requires_grad and tensor.is_leaf:
        # the shards are the leaves now: each gets its own .grad (ShardedTensor.grad gathers them)
        for piece in pieces:
            piece.detach_().requires_grad_(True)
    return result


@numpy_argument_names
class ShardedTensor(ElementwiseOps, ReductionOps, MovementOps, IndexingOps, LinalgOps, FunctionalOps,
                    ConvolutionOps, LossOps):
    """A tensor whose values live in shards along dim `axis`, one shard per device."""

    __slots__ = ("shards", "axis")
    is_sharded = True

    def __init__(self, shards: list[Tensor], axis: int) -> None:
        self.shards = list(shards)
        self.axis = axis

    # ---- layout ---------------------------------------------------------------------------------------------

    @property
    def shape(self) -> Shape:
        first = self.shards[0].shape
        return first[: self.axis] + (sum(s.shape[self.axis] for s in self.shards),) + first[self.axis + 1 :]

    @property
    def dtype(self) -> DType:
        return self.shards[0].dtype

    @property
    def device(self) -> str:
        """The first shard's device: where results combined from all shards are placed."""
        return self.shards[0].device

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(s.device for s in self.shards)

    @property
    def ndim(self) -> int:
        return len(self.shards[0].shape)

    def numel(self) -> int:
        return prod(self.shape)

    def size(self, dim: int | None = None) -> Shape | int:
        return self.shape if dim is None else self.shape[normalize_dim(dim, self.ndim, "size")]

    def bounds(self) -> list[tuple[int, int]]:
        result, start = [], 0
        for piece in self.shards:
            result.append((start, start + piece.shape[self.axis]))
            start += piece.shape[self.axis]
        return result

    def same_layout(self, other: ShardedTensor) -> bool:
        return other.axis == self.axis and other.devices == self.devices and other.bounds() == self.bounds()

    def __repr__(self) -> str:
        return f"ShardedTensor(shape={self.shape}, dim={self.axis}, devices={list(self.devices)})\n{self.gather()!r}"

    # ---- the primitive interface ----------------------------------------------------------------------------
    # TensorBase declares the primitives as returning `Tensor`, meaning "the concrete tensor class"; an op on a
    # ShardedTensor gives a ShardedTensor (or a Tensor where the result is joined), hence the ignore[override]s.

    @classmethod
    def _full(cls, shape: Shape, value: Any, dtype: DType, device: str) -> Tensor:
        return Tensor._full(shape, value, dtype, device)  # a constant is recreated on each shard's device

    @classmethod
    def _arange_primitive(cls, count: int, dtype: DType, device: str) -> Tensor:
        return Tensor._arange_primitive(count, dtype, device)

    def piece(self, source: Tensor | ShardedTensor, index: int) -> Tensor:
        """The part of `source` (of this tensor's shape) that shard `index` needs, on that shard's device."""
        device = self.shards[index].device
        if isinstance(source, ShardedTensor):
            if self.same_layout(source):
                return source.shards[index]
            source = source.gather()
        start, end = self.bounds()[index]
        node = source.node
        piece_shape = source.shape if source.shape[self.axis] == 1 else _with(source.shape, self.axis, end - start)
        if node.op is Op.CONST and not source.requires_grad:  # a constant is made again where it is needed
            return Tensor._full(piece_shape, node.arg, node.dtype, device)
        if node.op is Op.EXPAND and node.srcs[0].shape[self.axis] == 1:
            # broadcast along the sharded dim: move the small tensor before the expand, never the expanded one
            base = (source._context[2][0] if source._context is not None and source._context[0] is Op.EXPAND
                    else Tensor._from_node(node.srcs[0]))
            moved = base if base.device == device else base.to(device)
            return moved.expand(_with(source.shape, self.axis, end - start))
        part = source if source.shape[self.axis] == 1 else source.narrow(self.axis, start, end - start)
        return part if part.device == device else part.to(device)

    def _apply(self, op: Op, *others: Any, arg: Any = None) -> Tensor | ShardedTensor:  # type: ignore[override]
        return apply_sharded(self, op, (self, *others), arg)

    def _apply_as_operand(self, op: Op, sources: tuple[Any, ...], arg: Any) -> Tensor | ShardedTensor:
        """Tensor._apply hands an op with a sharded operand (not the first) to it: it runs on the shards."""
        return apply_sharded(self, op, sources, arg)

    # ---- whole-tensor operations ---------------------------------------------------------------------------

    # joining the shards is a sharded tensor's own `gather`; torch's index gather is not offered on one
    def gather(self, device: str | None = None) -> Tensor:  # type: ignore[override]
        """All shards joined on one device (the first shard's by default)."""
        from ember.core.movement import cat

        target = device or self.device
        return cat([piece if piece.device == target else piece.to(target) for piece in self.shards], self.axis)

    def realize(self) -> ShardedTensor:
        from ember.core.tensor import realize

        realize(*self.shards)
        return self

    def numpy(self) -> np.ndarray:
        self.realize()
        return np.concatenate([piece.numpy() for piece in self.shards], axis=self.axis)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.numpy()
        return array.astype(dtype) if dtype is not None else array

    def item(self) -> Any:
        return self.gather().item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def to(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.gather().to(*args, **kwargs)

    def contiguous(self) -> ShardedTensor:
        return ShardedTensor([piece.contiguous() for piece in self.shards], self.axis)

    def detach(self) -> ShardedTensor:  # type: ignore[override]  # see the primitive interface
        return ShardedTensor([piece.detach() for piece in self.shards], self.axis)

    @property  # read-only here (set through requires_grad_), a plain attribute on Tensor
    def requires_grad(self) -> bool:  # type: ignore[override]
        return any(piece.requires_grad for piece in self.shards)

    def requires_grad_(self, requires_grad: bool = True) -> ShardedTensor:
        for piece in self.shards:
            piece.requires_grad_(requires_grad)
        return self

    @property
    def is_leaf(self) -> bool:
        return all(piece.is_leaf for piece in self.shards)

    @property
    def grad(self) -> ShardedTensor | None:
        grads = [piece.grad for piece in self.shards]
        return None if any(g is None for g in grads) else ShardedTensor(grads, self.axis)  # type: ignore[arg-type]

    @grad.setter
    def grad(self, value: Any) -> None:
        for index, piece in enumerate(self.shards):
            piece.grad = None if value is None else self.piece(value, index)

    def backward(self, gradient: Any = None, **kwargs: Any) -> None:
        self.gather().backward(gradient, **kwargs)

    def assign(self, value: Any) -> ShardedTensor:  # type: ignore[override]  # see the primitive interface
        if not isinstance(value, (Tensor, ShardedTensor)):
            value = Tensor._full(self.shape, value, self.dtype, self.device)
        if value.shape != self.shape:
            value = value.expand(self.shape)
        for index, piece in enumerate(self.shards):
            piece.assign(self.piece(value, index))
        return self

    def __hash__(self) -> int:
        return id(self)

    def __len__(self) -> int:
        return self.shape[0]


def _per_shard(layout: ShardedTensor, op: Op, sources: tuple[Any, ...], arg_of: Any, axis: int) -> ShardedTensor:
    """Apply op on every shard; `arg_of(index)` gives the op's argument for shard `index`."""
    results = []
    for index in range(len(layout.shards)):
        operands = [layout.piece(source, index) for source in sources]
        results.append(operands[0]._apply(op, *operands[1:], arg=arg_of(index)))
    return ShardedTensor(results, axis)


def apply_sharded(layout: ShardedTensor, op: Op, sources: tuple[Any, ...], arg: Any) -> Tensor | ShardedTensor:
    """One primitive op on sources of which `layout` is sharded (the others sharded alike or plain)."""
    axis = layout.axis
    shard_sizes = [piece.shape[axis] for piece in layout.shards]
    if op in ELEMENTWISE_OPS or op is Op.CONTIGUOUS:
        return _per_shard(layout, op, sources, lambda index: arg, axis)
    if op in REDUCE_OPS:
        partial = _per_shard(layout, op, sources, lambda index: arg, axis)
        if axis not in arg:
            return partial
        # partial results over each shard, combined on the first device
        combined = partial.shards[0]
        for piece in partial.shards[1:]:
            combined = combined._apply(REDUCE_COMBINE[op], piece.to(combined.device))
        return combined
    if op is Op.PERMUTE:
        return _per_shard(layout, op, sources, lambda index: arg, arg.index(axis))
    if op is Op.EXPAND:
        return _per_shard(layout, op, sources, lambda index: _with(arg, axis, shard_sizes[index]), axis)
    if op is Op.FLIP and axis not in arg:
        return _per_shard(layout, op, sources, lambda index: arg, axis)
    if op is Op.PAD and arg[0][axis] == (0, 0):
        return _per_shard(layout, op, sources, lambda index: arg, axis)
    if op is Op.SHRINK and arg[axis] == (0, layout.shape[axis]):
        return _per_shard(layout, op, sources, lambda index: _with(arg, axis, (0, shard_sizes[index])), axis)
    if op is Op.RESHAPE:
        new_axis = _surviving_axis(layout.shape, axis, arg)
        if new_axis is not None:
            return _per_shard(layout, op, sources, lambda index: _with(arg, new_axis, shard_sizes[index]), new_axis)
    # the op moves data across the sharded dim: gather, then run it on the first device
    gathered = [source.gather() if isinstance(source, ShardedTensor) else source for source in sources]
    return gathered[0]._apply(op, *gathered[1:], arg=arg)


def _with(values: tuple, position: int, value: Any) -> tuple:
    return tuple(value if index == position else item for index, item in enumerate(values))


def _surviving_axis(shape: Shape, axis: int, new_shape: Shape) -> int | None:
    """The dim of new_shape that is the sharded dim unchanged (same size, same elements before it), if any."""
    before = prod(shape[:axis])
    running = 1
    for index, size in enumerate(new_shape):
        if running == before and size == shape[axis]:
            return index
        running *= size
    return None
