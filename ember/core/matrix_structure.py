"""Diagonals, triangles and grids: diag, diagonal, diag_embed, trace, rot90, block_diag, meshgrid, tril_indices, ...

Everything here is a view or a composition of views (pads, reshapes and shrinks: the diagonal of an n x n block is
column 0 of the block flattened and padded to n x (n + 1)), so gradients come from the movement ops' rules.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ember.core import dtype as dtypes
from ember.core.dtype import to_dtype
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.shapes import normalize_dim
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

MESHGRID_INDEXING = ("ij", "xy")


def _integer(value: Any, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}") from None


def embed_last(tensor: Tensor, offset: int) -> Tensor:
    """(..., n) -> (..., m, m) with m = n + |offset|: the last dim on diagonal `offset` of new (row, column) dims."""
    size = tensor.shape[-1]
    lead = tensor.shape[:-1]
    keep = [(0, 0)] * len(lead)
    # element i of the column padded to n x (n + 1) sits at i * (n + 1) = i * n + i: at (i, i) of the first n * n
    padded = tensor.unsqueeze(-1)._pad_and_shrink(keep + [(0, 0), (0, size)])
    square = padded.reshape(lead + (size * (size + 1),))._pad_and_shrink(keep + [(0, -size)])
    square = square.reshape(lead + (size, size))
    if offset >= 0:
        return square._pad_and_shrink(keep + [(0, offset), (offset, 0)])
    return square._pad_and_shrink(keep + [(-offset, 0), (0, -offset)])


def diagonal_length(rows: int, columns: int, offset: int) -> int:
    """The number of elements on diagonal `offset` of a rows x columns matrix."""
    return max(0, min(rows, columns - offset) if offset >= 0 else min(rows + offset, columns))


class MatrixStructureOps(TensorBase):
    """Mixin: diagonals, trace and rotations (views of the tensor). Needs the movement and reduction mixins."""

    __slots__ = ()

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The diagonal `offset` of the (dim1, dim2) planes as a last dim (torch.diagonal; a view, no copy)."""
        offset = _integer(offset, "diagonal: offset")
        first, second = normalize_dim(dim1, self.ndim, "diagonal"), normalize_dim(dim2, self.ndim, "diagonal")
        if first == second:
            raise ShapeError(f"diagonal: the dims cannot be identical, got dim1={dim1} and dim2={dim2} for the shape "
                             f"{self.shape}")
        others = [axis for axis in range(self.ndim) if axis not in (first, second)]
        moved = self.permute(*others, first, second)
        lead = moved.shape[:-2]
        length = diagonal_length(self.shape[first], self.shape[second], offset)
        row_start, column_start = (0, offset) if offset >= 0 else (-offset, 0)
        if length == 0:
            return moved.shrink([None] * len(lead) + [(0, 0), (0, 0)]).reshape(lead + (0,))
        block = moved.shrink([None] * len(lead) + [(row_start, row_start + length),
                                                   (column_start, column_start + length)])
        # element (i, i) of the flattened block sits at i * (length + 1): column 0 of a (length, length + 1) view
        flat = block.reshape(lead + (length * length,))._pad_and_shrink([(0, 0)] * len(lead) + [(0, length)])
        strided = flat.reshape(lead + (length, length + 1))
        return strided.shrink([None] * len(lead) + [None, (0, 1)]).reshape(lead + (length,))

    def diag(self, diagonal: int = 0) -> Tensor:
        """torch.diag: a 1-d tensor becomes a square matrix with it on diagonal `diagonal`; a matrix gives that
        diagonal as a 1-d tensor."""
        offset = _integer(diagonal, "diag: diagonal")
        if self.ndim == 1:
            return embed_last(cast("Tensor", self), offset)
        if self.ndim == 2:
            return self.diagonal(offset)
        raise ShapeError(f"diag(): supports 1-d or 2-d tensors, got a {self.ndim}-d tensor of shape {self.shape}; "
                         "use diagonal() or diag_embed() for batches")

    def diagflat(self, offset: int = 0) -> Tensor:
        """A square matrix with the flattened input on diagonal `offset` (torch.diagflat)."""
        return embed_last(self.reshape(-1), _integer(offset, "diagflat: offset"))

    def diag_embed(self, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
        """The last dim placed on diagonal `offset` of new (dim1, dim2) planes (dims of the result), zeros elsewhere."""
        offset = _integer(offset, "diag_embed: offset")
        first = normalize_dim(dim1, self.ndim + 1, "diag_embed")
        second = normalize_dim(dim2, self.ndim + 1, "diag_embed")
        if first == second:
            raise ShapeError(f"diag_embed: the dims cannot be identical, got dim1={dim1} and dim2={dim2}")
        source = self.reshape(1) if self.ndim == 0 else cast("Tensor", self)
        return embed_last(source, offset).movedim((-2, -1), (first, second))

    def diagonal_scatter(self, src: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """A copy of self with the diagonal that diagonal(offset, dim1, dim2) reads replaced by src (cast)."""
        from ember.core.elementwise import where

        diagonal_shape = self.diagonal(offset, dim1, dim2).shape  # checks the dims
        if src.shape != diagonal_shape:
            raise ShapeError(f"diagonal_scatter: src of shape {src.shape} must have the shape {diagonal_shape} of the "
                             f"diagonal it replaces (offset {offset}, dims {dim1} and {dim2} of the shape {self.shape})")
        first, second = normalize_dim(dim1, self.ndim), normalize_dim(dim2, self.ndim)
        rows, columns = self.shape[first], self.shape[second]
        length = src.shape[-1]
        if length == 0:
            return cast("Tensor", self)
        row_start, column_start = (0, offset) if offset >= 0 else (-offset, 0)
        amounts = [(0, 0)] * (src.ndim - 1) + [(row_start, rows - row_start - length),
                                               (column_start, columns - column_start - length)]

        def placed(values: Tensor) -> Tensor:
            return embed_last(values, 0)._pad_and_shrink(amounts).movedim((-2, -1), (first, second))

        inside = placed(src._full(src.shape, True, dtypes.bool_, src.device))
        return where(inside, placed(src.cast(self.dtype)), self)

    def fill_diagonal_(self, fill_value: Any, wrap: bool = False) -> Tensor:
        """Set the main diagonal (all indices equal) to fill_value in place; a tall matrix with wrap=True starts
        the diagonal again every columns + 1 rows, as torch."""
        from ember.core.elementwise import where

        if self.ndim < 2:
            raise ShapeError(f"fill_diagonal_: the tensor needs at least 2 dims, got shape {self.shape}")
        if self.ndim > 2 and len(set(self.shape)) != 1:
            raise ShapeError(f"fill_diagonal_: all dims of a tensor with more than 2 dims must have one size, got "
                             f"shape {self.shape}")
        step = sum(math.prod(self.shape[axis + 1:]) for axis in range(self.ndim))  # the flat distance of (i, i, ..)
        count = min(self.shape)
        total = math.prod(self.shape)
        if wrap and self.ndim == 2:
            count = -(-total // step) if step else 0
        flat = self._arange_primitive(total, dtypes.int64, self.device)
        on_diagonal = ((flat % max(step, 1)) == 0).logical_and(flat < step * count).reshape(self.shape)
        return self.assign(where(on_diagonal, self._full((), fill_value, self.dtype, self.device), self))

    def trace(self) -> Tensor:
        """The sum of the main diagonal of a matrix (integers and bool sum to int64, like torch)."""
        if self.ndim != 2:
            raise ShapeError(f"trace: expected a matrix (2-d), but got a tensor of shape {self.shape}")
        if self.dtype.is_bool:
            raise DTypeError("trace: not supported for bool tensors (as in PyTorch); cast to an integer dtype first")
        return self.diagonal().sum()

    def rot90(self, k: int = 1, dims: Sequence[int] = (0, 1)) -> Tensor:
        """Rotate by 90 degrees k times in the plane of dims, from the first dim towards the second (a view)."""
        dims = list(dims)
        if len(dims) != 2:
            raise ShapeError(f"rot90: expected exactly 2 rotation dims, got dims={dims}")
        if self.ndim < 2:
            raise ShapeError(f"rot90: expected a tensor with at least 2 dims, got shape {self.shape}")
        first, second = normalize_dim(dims[0], self.ndim, "rot90"), normalize_dim(dims[1], self.ndim, "rot90")
        if first == second:
            raise ShapeError(f"rot90: the rotation dims must differ, got dims={dims} for the shape {self.shape}")
        turns = _integer(k, "rot90: k") % 4
        if turns == 1:
            return self.flip(second).transpose(first, second)
        if turns == 2:
            return self.flip(first, second)
        if turns == 3:
            return self.flip(first).transpose(first, second)
        return cast("Tensor", self)


# ---- functions without a method form (torch.block_diag, torch.meshgrid, torch.tril_indices, ...) ----------------


def block_diag(*tensors: Tensor) -> Tensor:
    """torch.block_diag: the 0-, 1- or 2-d tensors as blocks on the diagonal of one matrix (promoted dtype)."""
    from ember.core.dtype import promote_types
    from ember.core.movement import cat
    from ember.core.tensor import tensor_sequence

    blocks = tensor_sequence(tensors)
    if not blocks:
        from ember.core.creation import zeros

        return zeros(1, 0)
    for position, block in enumerate(blocks):
        if block.ndim > 2:
            raise ShapeError(f"block_diag: input tensors must have 2 or fewer dims, input {position} has shape "
                             f"{block.shape}")
    matrices = [block.reshape(1, 1) if block.ndim == 0 else block.reshape(1, -1) if block.ndim == 1 else block
                for block in blocks]
    dtype = matrices[0].dtype
    for matrix in matrices[1:]:
        dtype = promote_types(dtype, matrix.dtype)
    total_columns = sum(matrix.shape[1] for matrix in matrices)
    placed, offset = [], 0
    for matrix in matrices:
        columns = matrix.shape[1]
        placed.append(matrix.cast(dtype)._pad_and_shrink([(0, 0), (offset, total_columns - offset - columns)]))
        offset += columns
    return cat(placed, 0)


def meshgrid(*tensors: Tensor | Sequence[Tensor], indexing: str | None = None) -> tuple[Tensor, ...]:
    """torch.meshgrid: N grids (expanded views) of the 0- or 1-d inputs; 'ij' (the default, with torch's warning)
    or 'xy' (the first two output dims swapped, as numpy)."""
    from ember.core.tensor import tensor_sequence

    flat: Sequence[Any] = tensors[0] if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else tensors
    parts = tensor_sequence(tuple(flat))
    if not parts:
        raise ValueError("meshgrid: expected a non-empty sequence of tensors")
    if indexing is None:
        warnings.warn("meshgrid: pass indexing='ij' (the default, used now) or indexing='xy'; torch warns that it "
                      "will require the argument in an upcoming release", UserWarning, stacklevel=2)
        indexing = "ij"
    if indexing not in MESHGRID_INDEXING:
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    for position, part in enumerate(parts):
        if part.ndim > 1:
            raise ShapeError(f"meshgrid: expected 0-d or 1-d tensors, tensor {position} has shape {part.shape}")
        if part.dtype != parts[0].dtype:
            raise DTypeError(f"meshgrid: all tensors need the same dtype, got {parts[0].dtype.name} and "
                             f"{part.dtype.name} (tensor {position})")
    swap = indexing == "xy" and len(parts) >= 2
    if swap:
        parts[0], parts[1] = parts[1], parts[0]
    sizes = tuple(part.numel() for part in parts)
    grids = []
    for position, part in enumerate(parts):
        shape = [1] * len(parts)
        shape[position] = sizes[position]
        grids.append(part.reshape(tuple(shape)).expand(sizes))
    if swap:
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


def cartesian_prod(*tensors: Tensor) -> Tensor:
    """torch.cartesian_prod: every combination of the 1-d inputs' elements as rows (the input itself for one)."""
    from ember.core.movement import stack
    from ember.core.tensor import tensor_sequence

    parts = tensor_sequence(tensors)
    if not parts:
        raise ValueError("cartesian_prod: expected at least one tensor")
    for position, part in enumerate(parts):
        if part.ndim != 1:
            raise ShapeError(f"cartesian_prod: expected 1-d tensors, tensor {position} has shape {part.shape}")
    if len(parts) == 1:
        return parts[0]
    return stack([grid.reshape(-1) for grid in meshgrid(*parts, indexing="ij")], 1)


def combinations(input: Tensor, r: int = 2, with_replacement: bool = False) -> Tensor:  # noqa: A002 - torch's
    """torch.combinations: the r-element combinations of a 1-d tensor's elements as rows, in lexicographic order of
    positions (itertools.combinations, or combinations_with_replacement); gathered, so gradients flow."""
    import itertools

    from ember.core.creation import tensor as new_tensor

    if not hasattr(input, "_apply"):
        raise TypeError(f"combinations(): argument 'input' must be Tensor, not {type(input).__name__}")
    if input.ndim != 1:
        raise ShapeError(f"combinations: expect a 1D vector, but got shape {list(input.shape)}")
    count = _integer(r, "combinations: r")
    if count < 0:
        raise ArgumentError(f"combinations: expect a non-negative number, but got {count}")
    if count == 0:
        return input._full((0,), 0, input.dtype, input.device)
    choose = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    rows = list(choose(range(input.shape[0]), count))
    if not rows:
        return input._full((0, count), 0, input.dtype, input.device)
    positions = new_tensor([index for row in rows for index in row], device=input.device)
    return input.index_select(0, positions).reshape(len(rows), count)


def _triangle_indices(row: int, col: int, offset: int, dtype: Any, device: Any, lower: bool) -> Tensor:
    """The (2, N) row-major coordinates of a triangle: the row of output k counts the rows that end at or before k
    (work N x row, fused), its column is k minus the start of that row plus the row's first column."""
    from ember.core.creation import _device
    from ember.core.elementwise import where
    from ember.core.indexing import repeat_indices
    from ember.core.movement import stack
    from ember.core.tensor import Tensor

    name = "tril_indices" if lower else "triu_indices"
    row, col, offset = (_integer(value, f"{name}: {what}") for value, what in ((row, "row"), (col, "col"),
                                                                              (offset, "offset")))
    if row < 0 or col < 0:
        raise ShapeError(f"{name}: row and col must be non-negative, got row={row}, col={col}")
    result_dtype = to_dtype(dtype) if dtype is not None else dtypes.int64
    if not result_dtype.is_int:
        raise DTypeError(f"{name}: dtype must be an integer dtype, got {result_dtype.name}")
    device = _device(device)
    if lower:
        counts = [min(max(r + offset + 1, 0), col) for r in range(row)]
        first_columns = [0] * row
    else:
        first_columns = [min(max(r + offset, 0), col) for r in range(row)]
        counts = [col - first for first in first_columns]
    total = sum(counts)
    if total == 0:
        return Tensor._full((2, 0), 0, result_dtype, device)
    rows = Tensor._arange_primitive(row, dtypes.int64, device)
    if lower:
        count_tensor = where(rows + (offset + 1) < 0, 0, rows + (offset + 1)).clamp(max=col)
        first_tensor = Tensor._full((row,), 0, dtypes.int64, device)
    else:
        first_tensor = where(rows + offset < 0, 0, rows + offset).clamp(max=col)
        count_tensor = col - first_tensor
    row_of = repeat_indices(count_tensor, total)
    starts = count_tensor.cumsum(0) - count_tensor  # the output position where each row begins
    position = Tensor._arange_primitive(total, dtypes.int64, device)
    column_of = position - starts.take(row_of) + first_tensor.take(row_of)
    return stack([row_of, column_of]).cast(result_dtype)


def tril_indices(row: int, col: int, offset: int = 0, *, dtype: Any = None, device: Any = None) -> Tensor:
    """torch.tril_indices: the coordinates (2, N) of the lower triangle of a row x col matrix (column - row <=
    offset), row by row. Built on the device with N x row work."""
    return _triangle_indices(row, col, offset, dtype, device, lower=True)


def triu_indices(row: int, col: int, offset: int = 0, *, dtype: Any = None, device: Any = None) -> Tensor:
    """torch.triu_indices: the coordinates (2, N) of the upper triangle (column - row >= offset), row by row."""
    return _triangle_indices(row, col, offset, dtype, device, lower=False)


def vander(x: Tensor, N: int | None = None, increasing: bool = False) -> Tensor:  # noqa: N803 - torch's name
    """torch.vander: columns x^(N-1), ..., x^0 (x^0 first when increasing) as running products; integer and bool
    inputs give int64."""
    from ember.core.movement import cat

    if x.ndim != 1:
        raise ShapeError(f"vander: x must be a 1-d tensor, got shape {x.shape}")
    columns = x.shape[0] if N is None else _integer(N, "vander: N")
    if columns < 0:
        raise ShapeError(f"vander: N must be non-negative, got {columns}")
    dtype = x.dtype if x.dtype.is_float else dtypes.int64
    ones = x._full((x.shape[0], min(columns, 1)), 1, dtype, x.device)
    if columns <= 1:
        return ones
    powers = x.cast(dtype).unsqueeze(1).expand((x.shape[0], columns - 1)).cumprod(1)
    result = cat([ones, powers], 1)
    return result if increasing else result.flip(1)
