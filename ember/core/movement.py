"""Movement Tensor methods (reshape, permute, expand, pad, flip, cat, split, ...): views, never copies."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ember.core.aliases import numpy_argument_names
from ember.core.errors import ArgumentError, ShapeError
from ember.core.ops import Op
from ember.core.shapes import Shape, normalize_dim, normalize_dims, prod, resolve_reshape
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _shape_argument(args: Sequence[Any]) -> tuple[int, ...]:
    """Accept both f(2, 3) and f((2, 3)) like torch; every size must be an integer."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = args[0]
    elif len(args) == 1 and hasattr(args[0], "__iter__") and not hasattr(args[0], "node"):
        args = tuple(args[0])
    try:
        return tuple(operator.index(size) for size in args)
    except TypeError:
        names = ", ".join(type(size).__name__ for size in args)
        raise TypeError(f"expected a shape of integers, got ({names})") from None


def _integer(value: Any, name: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None


class MovementOps(TensorBase):
    """Mixin: views of a tensor. Needs `_apply`, `shape`, `ndim` from the class."""

    __slots__ = ()

    # ---- internal intermediates: the movement ops other ops make on the way (never views, core/views.py) -------

    def _reshaped(self, shape: tuple[int, ...]) -> Tensor:
        """self with a resolved shape of as many elements (the caller checked it): an intermediate of another op,
        which torch would not make a view, so no view is linked (the public view ops link theirs)."""
        return cast("Tensor", self) if shape == self.shape else self._apply(Op.RESHAPE, arg=tuple(shape))

    def _crop(self, axis: int, start: int, end: int) -> Tensor:
        """The dim `axis`'s [start, end) (in range, which the caller knows): an intermediate of another op, no view."""
        shape = self.shape
        axis %= len(shape)
        if start == 0 and end == shape[axis]:
            return cast("Tensor", self)
        bounds = tuple((start, end) if dim == axis else (0, size) for dim, size in enumerate(shape))
        return self._apply(Op.SHRINK, arg=bounds)

    def _broadcast(self, shape: tuple[int, ...]) -> Tensor:
        """self broadcast to shape (which the caller checked it broadcasts to): an intermediate, no view."""
        own = self.shape
        if own == shape:
            return cast("Tensor", self)
        padded = own if len(shape) == len(own) else (1,) * (len(shape) - len(own)) + own
        result = cast("Tensor", self) if padded == own else self._apply(Op.RESHAPE, arg=padded)
        return result if padded == shape else result._apply(Op.EXPAND, arg=tuple(shape))

    def _swapped_last(self) -> Tensor:
        """The last two dims swapped (mT) as an intermediate of another op (matmul, linear): no view."""
        order = list(range(self.ndim))
        order[-2], order[-1] = order[-1], order[-2]
        return self._apply(Op.PERMUTE, arg=tuple(order))

    # ---- the primitives, with user-facing checks -------------------------------------------------------------

    def reshape(self, *shape: Any) -> Tensor:
        new_shape = resolve_reshape(self.shape, _shape_argument(shape))
        return cast("Tensor", self) if new_shape == self.shape else self._apply(Op.RESHAPE, arg=new_shape)

    def view(self, *shape: Any) -> Tensor:
        """A reshape (every ember tensor can be viewed: views are index math) or, given a dtype, a bitcast."""
        from ember.core.dtype import DType

        if len(shape) == 1 and isinstance(shape[0], (DType, str)):
            return self.bitcast(shape[0])
        if getattr(self, "_alias", None) is not None:  # a view whose strides may not express the shape (torch's error)
            from ember.core.views import check_viewable

            check_viewable(cast("Tensor", self), resolve_reshape(self.shape, _shape_argument(shape)))
        return self.reshape(*shape)

    def view_as(self, other: Tensor) -> Tensor:
        return self.reshape(other.shape)

    def reshape_as(self, other: Tensor) -> Tensor:
        return self.reshape(other.shape)

    def expand(self, *shape: Any) -> Tensor:
        target = _shape_argument(shape)
        if len(target) < self.ndim:
            raise ShapeError(
                f"expand: the target shape {target} has fewer dims than the tensor's shape {self.shape}"
            )
        new_dims = len(target) - self.ndim
        padded = (1,) * new_dims + self.shape
        resolved = []
        for axis, (old, new) in enumerate(zip(padded, target)):
            if new == -1:
                if axis < new_dims:
                    raise ShapeError(f"expand: -1 is not allowed for the new leading dim {axis} (target {target})")
                new = old
            if new < 0 or (old != new and old != 1):
                raise ShapeError(
                    f"expand: the size of dim {axis} must be 1 to expand it from {old} to {new} "
                    f"(tensor shape {self.shape}, target {target})"
                )
            resolved.append(new)
        return self._broadcast(tuple(resolved))

    def expand_as(self, other: Tensor) -> Tensor:
        return self.expand(other.shape)

    def broadcast_to(self, shape: Sequence[int]) -> Tensor:
        return self.expand(tuple(shape))

    def permute(self, *dims: Any) -> Tensor:
        order = _shape_argument(dims)
        if len(order) != self.ndim:
            raise ShapeError(
                f"permute: the order {order} has {len(order)} dims but the tensor of shape {self.shape} has {self.ndim}"
            )
        normalized = tuple(normalize_dim(dim, self.ndim, "permute") for dim in order)
        if sorted(normalized) != list(range(self.ndim)):
            raise ShapeError(f"permute: {order} is not a permutation of the dims 0..{self.ndim - 1} (shape {self.shape})")
        if normalized == tuple(range(self.ndim)):
            return cast("Tensor", self)
        return self._apply(Op.PERMUTE, arg=normalized)

    def flip(self, *dims: Any) -> Tensor:
        axes = normalize_dims(_shape_argument(dims), self.ndim, "flip")
        axes = tuple(axis for axis in axes if self.shape[axis] > 1)
        return cast("Tensor", self) if not axes else self._apply(Op.FLIP, arg=axes)

    def _pad_and_shrink(self, amounts: Sequence[tuple[int, int]], value: Any = 0) -> Tensor:
        """Pad (positive amounts) and crop (negative amounts) each dim; amounts are per dim, first dim first."""
        if all(before == 0 and after == 0 for before, after in amounts):
            return cast("Tensor", self)
        shrink = tuple((max(0, -before), size - max(0, -after)) for size, (before, after) in zip(self.shape, amounts))
        for size, (start, end) in zip(self.shape, shrink):
            if end < start:
                raise ShapeError(
                    f"pad: the amounts {tuple(amounts)} crop more than the size of a dim of the shape {self.shape}"
                )
        result = cast("Tensor", self)
        if any(start != 0 or end != size for size, (start, end) in zip(self.shape, shrink)):
            result = result._apply(Op.SHRINK, arg=shrink)
        padding = tuple((max(0, before), max(0, after)) for before, after in amounts)
        if any(before or after for before, after in padding):
            fill = bool(value) if result.dtype.is_bool else int(value) if result.dtype.is_int else float(value)
            result = result._apply(Op.PAD, arg=(padding, fill))
        return result

    def pad(self, pad: Sequence[int], mode: str = "constant", value: Any = None) -> Tensor:
        """torch.nn.functional.pad: `pad` lists (before, after) pairs starting from the last dim.

        mode "constant" fills with `value` (0 by default) and crops for negative amounts; "reflect", "replicate" and
        "circular" are compositions of views (and, for reflect/replicate, a fused concatenation).
        """
        amounts = [_integer(amount, "pad: each padding amount") for amount in pad]
        if len(amounts) % 2 != 0 or len(amounts) // 2 > self.ndim:
            raise ShapeError(
                f"pad: the padding {tuple(amounts)} must have an even length of at most 2 * {self.ndim} "
                f"(two amounts per dim of the shape {self.shape})"
            )
        pairs = [(0, 0)] * self.ndim
        for index in range(len(amounts) // 2):
            pairs[self.ndim - 1 - index] = (amounts[2 * index], amounts[2 * index + 1])
        if mode == "constant":
            return self._pad_and_shrink(pairs, 0 if value is None else value)
        if mode not in PAD_MODES:
            raise ArgumentError(f"pad: unknown mode {mode!r}; valid modes: {', '.join(PAD_MODES)}")
        if value is not None and value != 0:
            raise ArgumentError(f"pad: a fill value is only used by mode 'constant', not {mode!r}")
        result = cast("Tensor", self)
        for axis, (before, after) in enumerate(pairs):
            if before or after:
                result = _pad_axis(result, axis, before, after, mode)
        return result

    def shrink(self, bounds: Sequence[tuple[int, int] | None]) -> Tensor:
        """Keep [start, end) of each dim (None keeps the whole dim)."""
        if len(bounds) > self.ndim:
            raise ShapeError(f"shrink: {len(bounds)} bounds given for the shape {self.shape}")
        resolved = tuple((0, size) if bound is None else tuple(bound) for size, bound in zip(self.shape, bounds))
        resolved += tuple((0, size) for size in self.shape[len(resolved):])
        for size, (start, end) in zip(self.shape, resolved):
            if not 0 <= start <= end <= size:
                raise ShapeError(f"shrink: the bounds {resolved} do not fit the shape {self.shape}")
        if resolved == tuple((0, size) for size in self.shape):
            return cast("Tensor", self)
        return self._apply(Op.SHRINK, arg=resolved)

    # ---- compositions ------------------------------------------------------------------------------------------

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        first, second = normalize_dim(dim0, self.ndim, "transpose"), normalize_dim(dim1, self.ndim, "transpose")
        if self.ndim == 0:
            return cast("Tensor", self)
        order = list(range(self.ndim))
        order[first], order[second] = order[second], order[first]
        return self.permute(order)

    swapaxes = swapdims = transpose

    def t(self) -> Tensor:
        if self.ndim > 2:
            raise ShapeError(f"t() expects a tensor with <= 2 dims, got shape {self.shape}; use transpose or mT")
        return cast("Tensor", self) if self.ndim < 2 else self.transpose(0, 1)

    @property
    def T(self) -> Tensor:
        """All dims reversed (torch deprecates this for tensors that are not 2-d; use mT or permute there)."""
        return self.permute(tuple(reversed(range(self.ndim))))

    @property
    def mT(self) -> Tensor:
        if self.ndim < 2:
            raise ShapeError(f"mT needs a matrix or a batch of matrices (>= 2 dims), got shape {self.shape}")
        return self.transpose(-2, -1)

    def movedim(self, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
        sources = [source] if isinstance(source, int) else list(source)
        destinations = [destination] if isinstance(destination, int) else list(destination)
        if len(sources) != len(destinations):
            raise ShapeError(f"movedim: source {source} and destination {destination} differ in length")
        sources = [normalize_dim(dim, self.ndim, "movedim") for dim in sources]
        destinations = [normalize_dim(dim, self.ndim, "movedim") for dim in destinations]
        if len(set(sources)) != len(sources) or len(set(destinations)) != len(destinations):
            raise ShapeError(f"movedim: repeated dim in source {source} or destination {destination}")
        order = [dim for dim in range(self.ndim) if dim not in sources]
        for destination_dim, source_dim in sorted(zip(destinations, sources)):
            order.insert(destination_dim, source_dim)
        return self.permute(order)

    moveaxis = movedim

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        start = normalize_dim(start_dim, self.ndim, "flatten")
        end = normalize_dim(end_dim, self.ndim, "flatten")
        if start > end:
            raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for the shape {self.shape}")
        return self.reshape(self.shape[:start] + (prod(self.shape[start : end + 1]),) + self.shape[end + 1 :])

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
        axis = normalize_dim(dim, self.ndim, "unflatten")
        inner = resolve_reshape((self.shape[axis],), _shape_argument((sizes,)), "unflatten")
        return self.reshape(self.shape[:axis] + inner + self.shape[axis + 1 :])

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor:
        axes = normalize_dims(dim, self.ndim, "squeeze")
        return self.reshape(tuple(size for axis, size in enumerate(self.shape) if not (axis in axes and size == 1)))

    def unsqueeze(self, dim: int) -> Tensor:
        axis = normalize_dim(dim, self.ndim + 1, "unsqueeze")
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def select(self, dim: int, index: int) -> Tensor:
        """The slice at `index` along `dim`, with that dim removed (x.select(1, 2) is x[:, 2])."""
        axis = normalize_dim(dim, self.ndim, "select")
        return self[(slice(None),) * axis + (_integer(index, "select: index"),)]

    def repeat(self, *repeats: Any) -> Tensor:
        counts = _shape_argument(repeats)
        if len(counts) < self.ndim:
            raise ShapeError(
                f"repeat: {len(counts)} repeat counts {counts} given for the shape {self.shape}; need at least "
                f"{self.ndim}"
            )
        if any(count < 0 for count in counts):
            raise ShapeError(f"repeat: repeat counts must be non-negative, got {counts}")
        base = self.reshape((1,) * (len(counts) - self.ndim) + self.shape)
        expanded_shape = tuple(value for count, size in zip(counts, base.shape) for value in (count, size))
        interleaved = base.reshape(tuple(value for size in base.shape for value in (1, size)))
        return interleaved.expand(expanded_shape).reshape(tuple(c * s for c, s in zip(counts, base.shape)))

    def tile(self, *dims: Any) -> Tensor:
        """torch.tile: repeat, with fewer counts than dims meaning leading counts of 1."""
        counts = _shape_argument(dims)
        return self.repeat((1,) * (self.ndim - len(counts)) + tuple(counts))

    def fliplr(self) -> Tensor:
        """Reverse dim 1 (the columns), for tensors of at least 2 dims."""
        if self.ndim < 2:
            raise ShapeError(f"fliplr: the input must have at least 2 dims, got shape {self.shape}")
        return self.flip(1)

    def flipud(self) -> Tensor:
        """Reverse dim 0 (the rows), for tensors of at least 1 dim."""
        if self.ndim < 1:
            raise ShapeError("flipud: the input must have at least 1 dim, got a 0-d tensor")
        return self.flip(0)

    def repeat_interleave(self, repeats: Any, dim: int | None = None, output_size: int | None = None) -> Tensor:
        """Repeat each element `repeats` times along dim (flattened when dim is None).

        An int repeats is a view; a tensor of counts has a data-dependent length, which is read from the device
        (unless output_size is given) as torch does.
        """
        source = self.flatten() if dim is None else self
        axis = 0 if dim is None else normalize_dim(dim, self.ndim, "repeat_interleave")
        if hasattr(repeats, "node") and repeats.numel() == 1 and repeats.ndim <= 1:
            repeats = int(repeats.item())
        if isinstance(repeats, (list, tuple)) or hasattr(repeats, "node"):
            from ember.core.indexing import repeat_indices

            counts = repeats if hasattr(repeats, "node") else self._from_data(list(repeats))
            if counts.ndim != 1 or counts.shape[0] != source.shape[axis]:
                raise ShapeError(
                    f"repeat_interleave: repeats of shape {counts.shape} must have one count per element of dim "
                    f"{axis} (size {source.shape[axis]}) of the shape {source.shape}"
                )
            # in range when the output size is the counts' sum (read when not given): checked only when given
            return source._index_select(axis, repeat_indices(counts, output_size), checked=output_size is not None)
        count = _integer(repeats, "repeat_interleave: repeats")
        if count < 0:
            raise ShapeError(f"repeat_interleave: repeats must be non-negative, got {count}")
        expanded = source.unsqueeze(axis + 1)
        target = list(expanded.shape)
        target[axis + 1] = count
        return expanded.expand(target).flatten(axis, axis + 1)

    def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        """Rotate elements along dims (flattened when dims is None): a view of the dim repeated twice."""
        if dims is None:
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        shift_list = [shifts] if isinstance(shifts, int) else list(shifts)
        dim_list = [dims] if isinstance(dims, int) else list(dims)
        if len(shift_list) != len(dim_list):
            raise ShapeError(f"roll: shifts {shifts} and dims {dims} must have the same length")
        result = cast("Tensor", self)
        for shift, dim in zip(shift_list, dim_list):
            axis = normalize_dim(dim, self.ndim, "roll")
            size = result.shape[axis]
            if size == 0 or _integer(shift, "roll: shift") % size == 0:
                continue
            offset = size - shift % size
            doubled = result.unsqueeze(axis).expand(result.shape[:axis] + (2,) + result.shape[axis:])
            doubled = doubled.flatten(axis, axis + 1)
            result = doubled.narrow(axis, offset, size)
        return result

    def narrow(self, dim: int, start: int, length: int) -> Tensor:
        axis = normalize_dim(dim, self.ndim, "narrow")
        size = self.shape[axis]
        start, length = _integer(start, "narrow: start"), _integer(length, "narrow: length")
        if not -size <= start <= size:
            raise IndexError(
                f"narrow: start {start} is out of range for dim {dim} of size {size} (valid: {-size} to {size})"
            )
        begin = start + size if start < 0 else start
        if length < 0 or begin + length > size:
            raise ShapeError(
                f"narrow: start {start} with length {length} does not fit dim {dim} of size {size} (shape {self.shape})"
            )
        return self.shrink([None] * axis + [(begin, begin + length)])

    def split(self, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        axis = normalize_dim(dim, self.ndim, "split")
        size = self.shape[axis]
        if isinstance(split_size_or_sections, (list, tuple)):
            sections = [_integer(length, "split: a section") for length in split_size_or_sections]
            if any(length < 0 for length in sections) or sum(sections) != size:
                raise ShapeError(
                    f"split: the sections {sections} must be non-negative and sum to {size}, the size of dim {dim} "
                    f"of the shape {self.shape}"
                )
        else:
            split_size = _integer(split_size_or_sections, "split: split_size")
            if split_size < 0 or (split_size == 0 and size != 0):
                raise ArgumentError(
                    f"split: split_size must be positive, got {split_size} for dim {dim} of size {size}"
                )
            step = max(split_size, 1)
            sections = [min(step, size - start) for start in range(0, size, step)] or [0]
        result, start = [], 0
        for length in sections:
            result.append(self.narrow(axis, start, length))
            start += length
        return tuple(result)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        if _integer(chunks, "chunk: chunks") <= 0:
            raise ArgumentError(f"chunk: chunks must be positive, got {chunks}")
        size = self.shape[normalize_dim(dim, self.ndim, "chunk")]
        if size == 0:
            return self.split([0] * chunks, dim)
        return self.split(-(-size // chunks), dim)

    def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
        axis = normalize_dim(dim, self.ndim, "unbind")
        return tuple(self.select(axis, index) for index in range(self.shape[axis]))

    def tensor_split(self, indices_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
        """Split into n nearly equal parts (an int) or at the given indices (a sequence or a 1-d tensor)."""
        axis = normalize_dim(dim, self.ndim, "tensor_split")
        size = self.shape[axis]
        split_points = indices_or_sections
        if hasattr(split_points, "node"):
            split_points = split_points.tolist()
        if isinstance(split_points, (list, tuple)):
            bounds = [min(max(int(point) + (size if int(point) < 0 else 0), 0), size) for point in split_points]
            starts = [0, *bounds]
            ends = [*bounds, size]
            return tuple(self.narrow(axis, start, max(end - start, 0)) for start, end in zip(starts, ends))
        sections = _integer(split_points, "tensor_split: sections")
        if sections <= 0:
            raise ArgumentError(f"tensor_split: the number of sections must be positive, got {sections}")
        base, extra = divmod(size, sections)
        return self.split([base + (1 if index < extra else 0) for index in range(sections)], axis)

    def pixel_shuffle(self, upscale_factor: int) -> Tensor:
        """[*, C * r^2, H, W] -> [*, C, H * r, W * r]: each group of r^2 channels becomes an r x r block."""
        factor = _integer(upscale_factor, "pixel_shuffle: upscale_factor")
        if self.ndim < 3 or factor <= 0 or self.shape[-3] % (factor * factor):
            raise ArgumentError(f"pixel_shuffle expects an input of at least 3 dims whose channel dim (-3) is "
                                f"divisible by upscale_factor^2 = {factor * factor}, got shape {self.shape}")
        *batch, channels, height, width = self.shape
        blocks = self.reshape(*batch, channels // (factor * factor), factor, factor, height, width)
        count = len(batch)
        order = list(range(count)) + [count + axis for axis in (0, 3, 1, 4, 2)]
        return blocks.permute(order).reshape(*batch, channels // (factor * factor), height * factor, width * factor)

    def pixel_unshuffle(self, downscale_factor: int) -> Tensor:
        """[*, C, H * r, W * r] -> [*, C * r^2, H, W], the inverse of pixel_shuffle."""
        factor = _integer(downscale_factor, "pixel_unshuffle: downscale_factor")
        if self.ndim < 3 or factor <= 0 or self.shape[-1] % factor or self.shape[-2] % factor:
            raise ArgumentError(f"pixel_unshuffle expects an input of at least 3 dims whose height and width are "
                                f"divisible by downscale_factor = {factor}, got shape {self.shape}")
        *batch, channels, height, width = self.shape
        blocks = self.reshape(*batch, channels, height // factor, factor, width // factor, factor)
        count = len(batch)
        order = list(range(count)) + [count + axis for axis in (0, 2, 4, 1, 3)]
        return blocks.permute(order).reshape(*batch, channels * factor * factor, height // factor, width // factor)

    def channel_shuffle(self, groups: int) -> Tensor:
        """[N, C, *] with its C channels in `groups` groups read out interleaved (ShuffleNet's channel shuffle)."""
        count = _integer(groups, "channel_shuffle: groups")
        if count <= 0:
            raise ArgumentError(f"channel_shuffle: number of groups to divide channels in must be positive, got "
                                f"{count}")
        if self.ndim < 3 or self.shape[1] % count:
            raise ArgumentError(f"channel_shuffle expects an input of at least 3 dims whose channel dim (1) is "
                                f"divisible by groups = {count}, got shape {self.shape}")
        batch, channels, *rest = self.shape
        grouped = self.reshape(batch, count, channels // count, *rest)
        return grouped.transpose(1, 2).reshape(self.shape)

    def cat(self, others: Sequence[Tensor], dim: int = 0) -> Tensor:
        return cat([cast("Tensor", self), *others], dim)

    def stack(self, others: Sequence[Tensor], dim: int = 0) -> Tensor:
        return stack([cast("Tensor", self), *others], dim)

    def _from_data(self, data: Any) -> Tensor:
        """A tensor of data on this tensor's device."""
        return type(cast("Tensor", self))(data, device=self.device)


def _pad_axis(tensor: Tensor, axis: int, before: int, after: int, mode: str) -> Tensor:
    """Reflect, replicate or circular padding of one dim."""
    size = tensor.shape[axis]
    if before < 0 or after < 0:
        raise ShapeError(f"pad: mode {mode!r} needs non-negative amounts, got ({before}, {after}) for dim {axis}")
    limit = size - 1 if mode == "reflect" else size
    if mode != "replicate" and (before > limit or after > limit) or size == 0:
        raise ShapeError(
            f"pad: mode {mode!r} amounts ({before}, {after}) must be at most {limit} for dim {axis} of size {size} "
            f"(shape {tensor.shape})"
        )
    if mode == "circular":
        tripled = tensor.unsqueeze(axis).expand(tensor.shape[:axis] + (3,) + tensor.shape[axis:]).flatten(axis, axis + 1)
        return tripled.narrow(axis, size - before, before + size + after)
    if mode == "replicate":
        first, last = tensor.narrow(axis, 0, 1), tensor.narrow(axis, size - 1, 1)
        left = first.expand(tensor.shape[:axis] + (before,) + tensor.shape[axis + 1 :])
        right = last.expand(tensor.shape[:axis] + (after,) + tensor.shape[axis + 1 :])
    else:
        left = tensor.narrow(axis, 1, before).flip(axis)
        right = tensor.narrow(axis, size - 1 - after, after).flip(axis)
    return cat([left, tensor, right], axis)


# the parts one kernel joins at most: each element of a join reads every part through a mask, so joining N parts
# in one kernel cost N masked loads an element (a stack of 512 tensors of 64 x 128 took 0.73 s, torch 2 ms); more
# parts are joined in groups of JOIN_GROUP, each stored, and the groups joined likewise (log N levels)
JOIN_GROUP = 8


@numpy_argument_names
def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """torch.cat: join tensors along an existing dim (each is padded into place and the pads summed: one kernel
    for up to JOIN_GROUP parts, stored groups of them for more).

    Floats are padded with -0.0, the identity of addition, so every value (-0.0, inf, NaN) is kept exactly.
    """
    from ember.core.dtype import promote_types
    from ember.core.tensor import tensor_sequence

    parts = tensor_sequence(tensors)
    if not parts:
        raise ArgumentError("cat: expected a non-empty sequence of tensors")
    for position, part in enumerate(parts):
        if part.ndim == 0:
            raise ShapeError(f"cat: the zero-dimensional tensor at position {position} cannot be concatenated")
    dtype = parts[0].dtype
    for part in parts[1:]:
        dtype = promote_types(dtype, part.dtype)
    # torch's legacy rule: a 1-d tensor of size 0 may be joined with tensors of any shape (and is skipped)
    positions = [position for position, part in enumerate(parts) if part.shape != (0,)] or [0]
    parts = [parts[position] for position in positions]
    reference = parts[0]
    axis = normalize_dim(dim, reference.ndim, "cat")
    for position, part in zip(positions, parts):
        if part.ndim != reference.ndim or any(
            a != b for index, (a, b) in enumerate(zip(part.shape, reference.shape)) if index != axis
        ):
            raise ShapeError(f"cat: the shapes must match in every dim except dim {dim}: the tensor at position "
                             f"{position} has shape {part.shape}, the first {reference.shape}")
    if len(parts) == 1:
        return parts[0].cast(dtype).clone()  # a new tensor, as torch's, never a view of its input
    while len(parts) > JOIN_GROUP:  # (see JOIN_GROUP)
        groups = [parts[start:start + JOIN_GROUP] for start in range(0, len(parts), JOIN_GROUP)]
        parts = [_joined(group, axis, dtype)._apply(Op.CONTIGUOUS) if len(group) > 1 else group[0]
                 for group in groups]
    return _joined(parts, axis, dtype)


def _joined(parts: list[Tensor], axis: int, dtype: Any) -> Tensor:
    """The parts (at least two) padded into place along `axis` and summed (ORed for bools) as `dtype`."""
    total = sum(part.shape[axis] for part in parts)
    fill = False if dtype.is_bool else 0 if dtype.is_int else -0.0
    result, offset = None, 0
    for part in parts:
        amounts = [(0, 0)] * part.ndim
        amounts[axis] = (offset, total - offset - part.shape[axis])
        padded = part.cast(dtype)._pad_and_shrink(amounts, fill)
        result = padded if result is None else result._apply(Op.OR if dtype.is_bool else Op.ADD, padded)
        offset += part.shape[axis]
    assert result is not None
    return result


@numpy_argument_names
def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """torch.stack: join tensors of one shape along a new dim."""
    from ember.core.tensor import tensor_sequence

    parts = tensor_sequence(tensors)
    if not parts:
        raise ArgumentError("stack: expected a non-empty sequence of tensors")
    for position, part in enumerate(parts):
        if part.shape != parts[0].shape:
            raise ShapeError(f"stack: all tensors need the same shape: the tensor at position {position} has shape "
                             f"{part.shape}, the first {parts[0].shape}")
    axis = normalize_dim(dim, parts[0].ndim + 1, "stack")
    return cat([part._reshaped(part.shape[:axis] + (1,) + part.shape[axis:]) for part in parts], axis)


def broadcast_tensors(*tensors: Tensor) -> tuple[Tensor, ...]:
    from ember.core.shapes import broadcast_shapes

    shape: Shape = broadcast_shapes(*(tensor.shape for tensor in tensors), op="broadcast_tensors")
    return tuple(tensor.expand(shape) for tensor in tensors)

