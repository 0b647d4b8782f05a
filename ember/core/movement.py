"""Movement Tensor methods (reshape, permute, expand, pad, flip, cat, split, ...): views, never copies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ember.core.errors import ShapeError
from ember.core.ops import Op
from ember.core.shapes import Shape, normalize_dim, normalize_dims, resolve_reshape

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


def _shape_argument(args: Sequence[Any]) -> tuple[int, ...]:
    """Accept both f(2, 3) and f((2, 3)) like torch."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = args[0]
    elif len(args) == 1 and hasattr(args[0], "__iter__") and not hasattr(args[0], "node"):
        args = tuple(args[0])
    return tuple(int(size) for size in args)


class MovementOps:
    """Mixin: views of a tensor. Needs `_apply`, `shape`, `ndim` from the class."""

    __slots__ = ()

    # ---- the primitives, with user-facing checks -------------------------------------------------------------

    def reshape(self: Tensor, *shape: Any) -> Tensor:
        new_shape = resolve_reshape(self.shape, _shape_argument(shape))
        return self if new_shape == self.shape else self._apply(Op.RESHAPE, arg=new_shape)

    def view(self: Tensor, *shape: Any) -> Tensor:
        if len(shape) == 1 and not isinstance(shape[0], (tuple, list, int)):
            return self.bitcast(shape[0])
        return self.reshape(*shape)

    def view_as(self: Tensor, other: Tensor) -> Tensor:
        return self.reshape(other.shape)

    def reshape_as(self: Tensor, other: Tensor) -> Tensor:
        return self.reshape(other.shape)

    def expand(self: Tensor, *shape: Any) -> Tensor:
        target = shape[0] if len(shape) == 1 and type(shape[0]) is tuple else _shape_argument(shape)
        if target == self.shape:
            return self
        if len(target) < self.ndim:
            raise ShapeError(f"expand: the target shape {target} has fewer dims than the tensor's shape {self.shape}")
        padded = (1,) * (len(target) - self.ndim) + self.shape
        resolved = []
        for axis, (old, new) in enumerate(zip(padded, target)):
            if new == -1:
                if axis < len(target) - self.ndim:
                    raise ShapeError(f"expand: -1 is not allowed for a new leading dim (shape {target})")
                new = old
            if old != new and old != 1:
                raise ShapeError(
                    f"expand: the size of dim {axis} must be 1 to expand it from {old} to {new} "
                    f"(tensor shape {self.shape}, target {target})"
                )
            resolved.append(new)
        result = self if padded == self.shape else self._apply(Op.RESHAPE, arg=padded)
        return result if tuple(resolved) == padded else result._apply(Op.EXPAND, arg=tuple(resolved))

    def expand_as(self: Tensor, other: Tensor) -> Tensor:
        return self.expand(other.shape)

    def broadcast_to(self: Tensor, shape: Sequence[int]) -> Tensor:
        return self.expand(tuple(shape))

    def permute(self: Tensor, *dims: Any) -> Tensor:
        order = _shape_argument(dims)
        if len(order) != self.ndim:
            raise ShapeError(f"permute: {order} has {len(order)} dims but the tensor of shape {self.shape} has {self.ndim}")
        normalized = tuple(normalize_dim(dim, self.ndim, "permute") for dim in order)
        if sorted(normalized) != list(range(self.ndim)):
            raise ShapeError(f"permute: {order} is not a permutation of the dims 0..{self.ndim - 1}")
        return self if normalized == tuple(range(self.ndim)) else self._apply(Op.PERMUTE, arg=normalized)

    def flip(self: Tensor, *dims: Any) -> Tensor:
        axes = normalize_dims(_shape_argument(dims), self.ndim, "flip")
        axes = tuple(axis for axis in axes if self.shape[axis] > 1)
        return self if not axes else self._apply(Op.FLIP, arg=axes)

    def _pad_and_shrink(self: Tensor, amounts: Sequence[tuple[int, int]], value: Any = 0) -> Tensor:
        """Pad (positive amounts) and crop (negative amounts) each dim; amounts are per dim, first dim first."""
        if all(before == 0 and after == 0 for before, after in amounts):
            return self
        shrink = tuple(
            (max(0, -before), size - max(0, -after)) for size, (before, after) in zip(self.shape, amounts)
        )
        for size, (start, end), (before, after) in zip(self.shape, shrink, amounts):
            if end < start:
                raise ShapeError(f"pad: amounts {tuple(amounts)} crop more than the dim of size {size}")
        result = self
        if any(start != 0 or end != size for size, (start, end) in zip(self.shape, shrink)):
            result = result._apply(Op.SHRINK, arg=shrink)
        padding = tuple((max(0, before), max(0, after)) for before, after in amounts)
        if any(before or after for before, after in padding):
            fill = bool(value) if result.dtype.is_bool else int(value) if result.dtype.is_int else float(value)
            result = result._apply(Op.PAD, arg=(padding, fill))
        return result

    def pad(self: Tensor, pad: Sequence[int], mode: str = "constant", value: Any = 0) -> Tensor:
        """torch.nn.functional.pad: `pad` lists (before, after) pairs starting from the last dim."""
        if mode != "constant":
            raise NotImplementedError(f"pad: mode {mode!r} is not supported; only 'constant'")
        if len(pad) % 2 != 0 or len(pad) // 2 > self.ndim:
            raise ShapeError(f"pad: padding {tuple(pad)} must have an even length of at most 2 * {self.ndim}")
        pairs = [(0, 0)] * self.ndim
        for index in range(len(pad) // 2):
            pairs[self.ndim - 1 - index] = (int(pad[2 * index]), int(pad[2 * index + 1]))
        return self._pad_and_shrink(pairs, value)

    def shrink(self: Tensor, bounds: Sequence[tuple[int, int] | None]) -> Tensor:
        """Keep [start, end) of each dim (None keeps the whole dim)."""
        resolved = tuple((0, size) if bound is None else bound for size, bound in zip(self.shape, bounds))
        for size, (start, end) in zip(self.shape, resolved):
            if not 0 <= start <= end <= size:
                raise ShapeError(f"shrink: bounds {resolved} do not fit the shape {self.shape}")
        if resolved == tuple((0, size) for size in self.shape):
            return self
        return self._apply(Op.SHRINK, arg=resolved)

    # ---- compositions ------------------------------------------------------------------------------------------

    def transpose(self: Tensor, dim0: int, dim1: int) -> Tensor:
        if self.ndim == 0:
            return self
        first, second = normalize_dim(dim0, self.ndim, "transpose"), normalize_dim(dim1, self.ndim, "transpose")
        order = list(range(self.ndim))
        order[first], order[second] = order[second], order[first]
        return self.permute(order)

    swapaxes = swapdims = transpose

    def t(self: Tensor) -> Tensor:
        if self.ndim > 2:
            raise ShapeError(f"t() expects a tensor with <= 2 dims, got shape {self.shape}; use transpose or mT")
        return self if self.ndim < 2 else self.transpose(0, 1)

    @property
    def T(self: Tensor) -> Tensor:  # noqa: N802 - torch's name
        return self.permute(tuple(reversed(range(self.ndim))))

    @property
    def mT(self: Tensor) -> Tensor:  # noqa: N802 - torch's name
        if self.ndim < 2:
            raise ShapeError(f"mT needs at least 2 dims, got shape {self.shape}")
        return self.transpose(-2, -1)

    def movedim(self: Tensor, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
        sources = [source] if isinstance(source, int) else list(source)
        destinations = [destination] if isinstance(destination, int) else list(destination)
        if len(sources) != len(destinations):
            raise ShapeError(f"movedim: source {source} and destination {destination} differ in length")
        sources = [normalize_dim(dim, self.ndim, "movedim") for dim in sources]
        destinations = [normalize_dim(dim, self.ndim, "movedim") for dim in destinations]
        order = [dim for dim in range(self.ndim) if dim not in sources]
        for destination_dim, source_dim in sorted(zip(destinations, sources)):
            order.insert(destination_dim, source_dim)
        return self.permute(order)

    moveaxis = movedim

    def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        start = normalize_dim(start_dim, self.ndim, "flatten")
        end = normalize_dim(end_dim, self.ndim, "flatten")
        if start > end:
            raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {self.shape}")
        return self.reshape(self.shape[:start] + (-1,) + self.shape[end + 1 :]) if self.numel() else self.reshape(
            self.shape[:start] + (0,) + self.shape[end + 1 :]
        )

    def unflatten(self: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
        axis = normalize_dim(dim, self.ndim, "unflatten")
        inner = resolve_reshape((self.shape[axis],), tuple(sizes), "unflatten")
        return self.reshape(self.shape[:axis] + inner + self.shape[axis + 1 :])

    def squeeze(self: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
        axes = normalize_dims(dim, self.ndim, "squeeze") if dim is not None else tuple(range(self.ndim))
        return self.reshape(tuple(size for axis, size in enumerate(self.shape) if not (axis in axes and size == 1)))

    def unsqueeze(self: Tensor, dim: int) -> Tensor:
        axis = normalize_dim(dim, self.ndim + 1, "unsqueeze")
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def repeat(self: Tensor, *repeats: Any) -> Tensor:
        counts = _shape_argument(repeats)
        if len(counts) < self.ndim:
            raise ShapeError(f"repeat: {len(counts)} repeat counts given for a tensor of rank {self.ndim}; need >= rank")
        base = self.reshape((1,) * (len(counts) - self.ndim) + self.shape)
        expanded_shape = tuple(value for count, size in zip(counts, base.shape) for value in (count, size))
        interleaved = base.reshape(tuple(value for size in base.shape for value in (1, size)))
        return interleaved.expand(expanded_shape).reshape(tuple(c * s for c, s in zip(counts, base.shape)))

    def repeat_interleave(self: Tensor, repeats: int, dim: int | None = None) -> Tensor:
        source = self.flatten() if dim is None else self
        axis = 0 if dim is None else normalize_dim(dim, self.ndim, "repeat_interleave")
        expanded = source.unsqueeze(axis + 1)
        target = list(expanded.shape)
        target[axis + 1] = repeats
        return expanded.expand(target).flatten(axis, axis + 1)

    def narrow(self: Tensor, dim: int, start: int, length: int) -> Tensor:
        axis = normalize_dim(dim, self.ndim, "narrow")
        size = self.shape[axis]
        begin = start + size if start < 0 else start
        if not 0 <= begin <= size or length < 0 or begin + length > size:
            raise ShapeError(f"narrow: start {start} and length {length} do not fit dim {dim} of size {size}")
        return self.shrink([None] * axis + [(begin, begin + length)])

    def split(self: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        axis = normalize_dim(dim, self.ndim, "split")
        size = self.shape[axis]
        if isinstance(split_size_or_sections, int):
            if split_size_or_sections <= 0:
                raise ValueError(f"split: split_size must be positive, got {split_size_or_sections}")
            sections = [min(split_size_or_sections, size - start) for start in range(0, size, split_size_or_sections)]
            sections = sections or [0]
        else:
            sections = list(split_size_or_sections)
            if sum(sections) != size:
                raise ShapeError(f"split: sections {sections} sum to {sum(sections)}, but dim {dim} has size {size}")
        result, start = [], 0
        for length in sections:
            result.append(self.narrow(axis, start, length))
            start += length
        return tuple(result)

    def chunk(self: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        if chunks <= 0:
            raise ValueError(f"chunk: chunks must be positive, got {chunks}")
        size = self.shape[normalize_dim(dim, self.ndim, "chunk")]
        return self.split(max(1, -(-size // chunks)), dim)

    def unbind(self: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
        axis = normalize_dim(dim, self.ndim, "unbind")
        return tuple(part.squeeze(axis) for part in self.split(1, axis)) if self.shape[axis] else ()

    def tensor_split(self: Tensor, sections: int, dim: int = 0) -> tuple[Tensor, ...]:
        axis = normalize_dim(dim, self.ndim, "tensor_split")
        size = self.shape[axis]
        base, extra = divmod(size, sections)
        return self.split([base + (1 if index < extra else 0) for index in range(sections)], axis)

    def cat(self: Tensor, others: Sequence[Tensor], dim: int = 0) -> Tensor:
        return cat([self, *others], dim)

    def stack(self: Tensor, others: Sequence[Tensor], dim: int = 0) -> Tensor:
        return stack([self, *others], dim)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """torch.cat: join tensors along an existing dim (each is padded into place and the pads summed)."""
    from ember.core.dtype import promote_types
    from ember.core.tensor import tensor_sequence

    parts = tensor_sequence(tensors)
    if not parts:
        raise ValueError("cat: expected a non-empty sequence of tensors")
    parts = [part for part in parts if not (part.ndim == 1 and part.shape[0] == 0)] or parts[:1]
    reference = parts[0]
    axis = normalize_dim(dim, reference.ndim, "cat")
    for position, part in enumerate(parts):
        if part.ndim != reference.ndim or any(
            a != b for index, (a, b) in enumerate(zip(part.shape, reference.shape)) if index != axis
        ):
            raise ShapeError(
                f"cat: tensor {position} has shape {part.shape}, which does not match {reference.shape} "
                f"outside dim {dim}"
            )
    dtype = reference.dtype
    for part in parts[1:]:
        dtype = promote_types(dtype, part.dtype)
    total = sum(part.shape[axis] for part in parts)
    result, offset = None, 0
    for part in parts:
        amounts = [(0, 0)] * reference.ndim
        amounts[axis] = (offset, total - offset - part.shape[axis])
        padded = part.cast(dtype)._pad_and_shrink(amounts)
        if dtype.is_bool:
            result = padded if result is None else result.logical_or(padded)
        else:
            result = padded if result is None else result + padded
        offset += part.shape[axis]
    return result


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """torch.stack: join tensors of one shape along a new dim."""
    from ember.core.tensor import tensor_sequence

    parts = tensor_sequence(tensors)
    if not parts:
        raise ValueError("stack: expected a non-empty sequence of tensors")
    for position, part in enumerate(parts):
        if part.shape != parts[0].shape:
            raise ShapeError(f"stack: all tensors need one shape; tensor 0 is {parts[0].shape}, {position} is {part.shape}")
    axis = normalize_dim(dim, parts[0].ndim + 1, "stack")
    return cat([part.unsqueeze(axis) for part in parts], axis)


def broadcast_tensors(*tensors: Tensor) -> tuple[Tensor, ...]:
    from ember.core.shapes import broadcast_shapes

    shape: Shape = broadcast_shapes(*(tensor.shape for tensor in tensors), op="broadcast_tensors")
    return tuple(tensor.expand(shape) for tensor in tensors)
