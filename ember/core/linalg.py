"""Linear algebra Tensor methods: matmul with batch broadcasting, dot, outer, and torch's einsum.

LinalgOps also gathers the families with files of their own: diagonals and grids (matrix_structure), products,
distances and covariance (products), determinants, inverses and solves (elimination).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ember.core.elimination import EliminationOps
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.graph_templates import traced_call
from ember.core.matrix_structure import MatrixStructureOps
from ember.core.products import ProductOps
from ember.core.shapes import broadcast_shapes

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


def check_same_dtype(op: str, left: Tensor, right: Tensor) -> None:
    """torch's matrix products do not promote: both operands must have one dtype, and it cannot be bool."""
    if left.dtype != right.dtype:
        raise DTypeError(
            f"{op}: expected both operands to have the same dtype, but got {left.dtype.name} and {right.dtype.name}; "
            "cast one with .to(dtype)"
        )
    if left.dtype.is_bool:
        raise DTypeError(f"{op}: not supported for bool tensors; cast them to an integer or float dtype first")


def product(first: Tensor, second: Tensor) -> Tensor:
    """first @ second (shapes checked by matmul) as a broadcast multiply and a sum over the inner dim: the graph
    a matmul is traced as (Composite.TRACED). Its movement ops are the product's intermediates, no views
    (_reshaped, _broadcast)."""
    left = first._reshaped((1,) + first.shape) if first.ndim == 1 else first
    right = second._reshaped(second.shape + (1,)) if second.ndim == 1 else second
    batch: tuple[int, ...] = left.shape[:-2]
    if right.shape[:-2] != batch:
        batch = broadcast_shapes(batch, right.shape[:-2])
    rows, inner, columns = left.shape[-2], left.shape[-1], right.shape[-1]
    left = left._broadcast(batch + (rows, inner))._reshaped(batch + (rows, 1, inner))  # [..., M, 1, K]
    right = right._broadcast(batch + (inner, columns))._swapped_last()._reshaped(batch + (1, columns, inner))
    result = (left * right).sum(-1, dtype=first.dtype)  # [..., M, N]
    if first.ndim == 1:
        result = result._reshaped(result.shape[:-2] + result.shape[-1:])
    if second.ndim == 1:
        result = result._reshaped(result.shape[:-1])
    return result


class LinalgOps(MatrixStructureOps, ProductOps, EliminationOps):
    """Mixin: matrix products, written as broadcast multiply + sum so they fuse with what comes after."""

    __slots__ = ()

    def matmul(self, other: Tensor) -> Tensor:
        if not isinstance(other, LinalgOps):
            raise TypeError(f"matmul: expected a Tensor, got {type(other).__name__}")
        if self.ndim == 0 or other.ndim == 0:
            raise ShapeError(f"matmul: both arguments need at least 1 dim, got shapes {self.shape} and {other.shape}")
        check_same_dtype("matmul", cast("Tensor", self), other)
        left = (1,) + self.shape if self.ndim == 1 else self.shape  # (the shapes `product` multiplies)
        right = other.shape + (1,) if other.ndim == 1 else other.shape
        if left[-1] != right[-2]:
            raise ShapeError(
                f"matmul: shapes {self.shape} and {other.shape} cannot be multiplied "
                f"({left[-2]}x{left[-1]} and {right[-2]}x{right[-1]}): inner dims differ"
            )
        if right[:-2] != left[:-2]:  # (the message's shapes are formatted only when the batch dims differ)
            broadcast_shapes(left[:-2], right[:-2], op=f"matmul of {self.shape} and {other.shape}")
        return traced_call(product, (cast("Tensor", self), other))

    def __matmul__(self, other: Tensor) -> Tensor:
        return self.matmul(other)

    def __rmatmul__(self, other: Tensor) -> Tensor:
        return type(cast("Tensor", self))(other, device=self.device).matmul(cast("Tensor", self))

    def mm(self, other: Tensor) -> Tensor:
        if self.ndim != 2 or other.ndim != 2:
            raise ShapeError(f"mm: both arguments must be 2-d, got shapes {self.shape} and {other.shape}")
        return self.matmul(other)

    def bmm(self, other: Tensor) -> Tensor:
        if self.ndim != 3 or other.ndim != 3 or self.shape[0] != other.shape[0]:
            raise ShapeError(f"bmm: both arguments must be 3-d with one batch size, got {self.shape} and {other.shape}")
        return self.matmul(other)

    def mv(self, vector: Tensor) -> Tensor:
        if self.ndim != 2 or vector.ndim != 1:
            raise ShapeError(f"mv: expects a 2-d matrix and a 1-d vector, got shapes {self.shape} and {vector.shape}")
        return self.matmul(vector)

    def dot(self, other: Tensor) -> Tensor:
        if self.ndim != 1 or other.ndim != 1 or self.shape != other.shape:
            raise ShapeError(f"dot: expects two 1-d tensors of one size, got shapes {self.shape} and {other.shape}")
        check_same_dtype("dot", cast("Tensor", self), other)
        return (self * other).sum(dtype=self.dtype)

    inner = dot

    def outer(self, other: Tensor) -> Tensor:
        if self.ndim != 1 or other.ndim != 1:
            raise ShapeError(f"outer: expects two 1-d tensors, got shapes {self.shape} and {other.shape}")
        return self.unsqueeze(1) * other.unsqueeze(0)

    ger = outer

    def addmm(self, first: Tensor, second: Tensor, beta: float = 1, alpha: float = 1) -> Tensor:
        """beta * self + alpha * (first @ second), like torch.addmm (beta = 0 ignores self's NaN and inf)."""
        from ember.core.arithmetic_forms import scaled_sum

        return scaled_sum(cast("Tensor", self), first.mm(second), beta, alpha, "addmm")


# ---- einsum --------------------------------------------------------------------------------------------------

ELLIPSIS = "..."


def _parse_term(term: str, equation: str) -> list[str]:
    """The labels of one subscript term, with '...' kept as one token."""
    labels: list[str] = []
    index = 0
    while index < len(term):
        if term.startswith(ELLIPSIS, index):
            if ELLIPSIS in labels:
                raise ArgumentError(f"einsum(): found more than one ellipsis ('...') in term {term!r} of {equation!r}")
            labels.append(ELLIPSIS)
            index += 3
            continue
        character = term[index]
        if not (character.isascii() and character.isalpha()):
            raise ArgumentError(
                f"einsum(): invalid subscript {character!r} in term {term!r} of {equation!r}; subscripts must be in "
                "[a-zA-Z] or '...'"
            )
        labels.append(character)
        index += 1
    return labels


def _diagonal(tensor: Tensor, first: int, second: int) -> Tensor:
    """The diagonal of two equal-size axes, kept at the position of `first` (a strided view, no copy)."""
    return tensor.diagonal(0, first, second).movedim(-1, first if first < second else first - 1)


def einsum(equation: str, *operands: Tensor | Sequence[Tensor]) -> Tensor:
    """torch.einsum: repeated subscripts take diagonals, '...' broadcasts, an implicit output is sorted labels."""
    from ember.core.tensor import tensor_sequence

    flat: Sequence[Any] = operands[0] if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else operands
    tensors = tensor_sequence(tuple(flat))
    compact = equation.replace(" ", "")
    input_part, arrow, output_part = compact.partition("->")
    terms = input_part.split(",")
    if len(terms) != len(tensors):
        relation = "fewer" if len(tensors) < len(terms) else "more"
        raise ArgumentError(
            f"einsum(): {relation} operands were provided than specified in the equation {equation!r} "
            f"({len(terms)} terms, {len(tensors)} tensors)"
        )
    if not tensors:
        raise ArgumentError("einsum(): must provide at least one operand")
    for tensor in tensors[1:]:
        check_same_dtype("einsum", tensors[0], tensor)
    term_labels = [_parse_term(term, compact) for term in terms]

    # name every dim: letters as given, the dims under '...' as '0', '1', ... aligned from the right
    ellipsis_rank = 0
    for position, (labels, tensor) in enumerate(zip(term_labels, tensors)):
        named = len([label for label in labels if label != ELLIPSIS])
        if (ELLIPSIS not in labels and named != tensor.ndim) or named > tensor.ndim:
            raise ShapeError(
                f"einsum(): the number of subscripts in the equation ({named}) does not match the number of dims "
                f"({tensor.ndim}) of operand {position} with shape {tensor.shape}"
                + ("" if ELLIPSIS in labels else " and no ellipsis was given")
            )
        if ELLIPSIS in labels:
            ellipsis_rank = max(ellipsis_rank, tensor.ndim - named)
    ellipsis_labels = [str(index) for index in range(ellipsis_rank)]
    dim_labels: list[list[str]] = []
    for labels, tensor in zip(term_labels, tensors):
        covered = tensor.ndim - len([label for label in labels if label != ELLIPSIS])
        expanded: list[str] = []
        for label in labels:
            expanded.extend(ellipsis_labels[ellipsis_rank - covered:] if label == ELLIPSIS else [label])
        dim_labels.append(expanded)

    # take diagonals of repeated labels within each operand, and check sizes across operands
    sizes: dict[str, int] = {}
    prepared: list[tuple[Tensor, list[str]]] = []
    for position, (tensor, labels) in enumerate(zip(tensors, dim_labels)):
        labels = list(labels)
        for label in dict.fromkeys(labels):
            while labels.count(label) > 1:
                first = labels.index(label)
                second = labels.index(label, first + 1)
                if tensor.shape[first] != tensor.shape[second]:
                    raise ShapeError(
                        f"einsum(): subscript {label} is repeated for operand {position} but the sizes don't match, "
                        f"{tensor.shape[first]} != {tensor.shape[second]} (shape {tensor.shape})"
                    )
                tensor = _diagonal(tensor, first, second)
                del labels[second]
        for label, size in zip(labels, tensor.shape):
            seen = sizes.get(label, 1)
            if size != 1 and seen != 1 and size != seen:
                what = f"subscript {label}" if label.isalpha() else f"the dim {label} covered by the ellipsis"
                raise ShapeError(
                    f"einsum(): {what} has size {size} for operand {position} (shape {tensors[position].shape}) "
                    f"which does not broadcast with the previously seen size {seen}"
                )
            sizes[label] = max(seen, size) if size != 0 and seen != 0 else 0
        prepared.append((tensor, labels))

    letters = [label for labels in dim_labels for label in labels if label.isalpha()]
    if arrow:
        output_labels: list[str] = []
        for label in _parse_term(output_part, compact):
            if label == ELLIPSIS:
                if not any(ELLIPSIS in labels for labels in term_labels):
                    raise ArgumentError(f"einsum(): output subscript '...' of {equation!r} appears in no input operand")
                output_labels.extend(ellipsis_labels)
                continue
            if label not in letters:
                raise ArgumentError(
                    f"einsum(): output subscript {label} does not appear in the equation {equation!r} for any input"
                )
            if label in output_labels:
                raise ArgumentError(f"einsum(): output subscript {label} appears more than once in the output")
            output_labels.append(label)
    else:
        output_labels = ellipsis_labels + sorted(label for label in set(letters) if letters.count(label) == 1)

    # contract left to right; sum a label as soon as no later operand and not the output needs it
    result, result_labels = prepared[0]
    for position in range(len(prepared)):
        if position > 0:
            operand, operand_labels = prepared[position]
            combined = result_labels + [label for label in operand_labels if label not in result_labels]
            result = _align(result, result_labels, combined) * _align(operand, operand_labels, combined)
            result_labels = combined
        needed_later = set(output_labels).union(*(labels for _, labels in prepared[position + 1:]))
        summed = [axis for axis, label in enumerate(result_labels) if label not in needed_later]
        if summed:
            result = result.sum(summed, dtype=result.dtype)
            result_labels = [label for label in result_labels if label in needed_later]
    final = _align(result, result_labels, output_labels)
    output_shape = tuple(sizes[label] for label in output_labels)
    return final.expand(output_shape) if final.shape != output_shape else final


def _align(tensor: Tensor, labels: list[str], order: list[str]) -> Tensor:
    """Permute a tensor's labelled dims into `order`, with size-1 dims for labels it does not have."""
    present = [label for label in order if label in labels]
    permuted = tensor.permute([labels.index(label) for label in present]) if tensor.ndim else tensor
    shape = tuple(permuted.shape[present.index(label)] if label in labels else 1 for label in order)
    return permuted.reshape(shape)
