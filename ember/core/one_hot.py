"""One-hot selections in the lazy graph: where(index == arange, x, +0.0) along an axis, the condition maybe and-ed with
a mask, where the index, the mask and x are each the same along that axis. A sum over that axis has at most one
term that is not +0.0, so it is exact in any order: the graph rule `_one_hot_sum` (scheduler/graph_rules.py) makes it
a select, and a long one is not split into stages (core/staged_reduce.py), which would hide it from that rule."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ember.core.dtype import max_value
from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.shapes import prod


@dataclass(frozen=True)
class OneHot:
    """The parts of a one-hot selection along an axis, each of size 1 there: the selected value, the index, the mask
    (None where there is none), and the axis's size (the number of classes)."""

    value: Node
    index: Node
    mask: Node | None
    count: int


def one_hot_selection(select: Node, axis: int) -> OneHot | None:
    """The parts of `select` where it is a one-hot selection along `axis` (the module's docstring), else None."""
    if select.op is not Op.WHERE or not select.dtype.is_float or not _positive_zero(select.srcs[2]):
        return None
    condition, value = select.srcs[0], select.srcs[1]
    picked = _along(value, axis)
    if picked is None:
        return None
    mask = None
    if condition.op is Op.AND:
        first, second = condition.srcs
        if first.op is Op.CMPEQ and (mask := _along(second, axis)) is not None:
            condition = first
        elif second.op is Op.CMPEQ and (mask := _along(first, axis)) is not None:
            condition = second
        else:
            return None
    if condition.op is not Op.CMPEQ:
        return None
    first, second = condition.srcs
    index = (_along(first, axis) if _arange_along(second, axis) else
             _along(second, axis) if _arange_along(first, axis) else None)
    count = select.shape[axis]
    if index is None or not index.dtype.is_int or count > max_value(index.dtype):
        return None
    return OneHot(picked, index, mask, count)


def _along(node: Node, axis: int) -> Node | None:
    """The value `node` broadcasts along `axis` (of size 1 there), or None where it may differ along it."""
    if node.op is Op.EXPAND and node.srcs[0].shape[axis] == 1:
        return node.srcs[0]
    if node.op is Op.CONST:
        return Node(Op.CONST, (), node.arg, node.shape[:axis] + (1,) + node.shape[axis + 1:], node.dtype, node.device)
    return None


def _arange_along(node: Node, axis: int) -> bool:
    """Whether `node` is 0, 1, ..., n - 1 along `axis` (n its size there), the same along every other axis."""
    count = node.shape[axis]
    if node.op is Op.EXPAND:
        node = node.srcs[0]
    if node.op is Op.RESHAPE and node.shape[axis] == count == prod(node.shape):
        node = node.srcs[0]
    return node.op is Op.ARANGE and node.shape == (count,)


def _positive_zero(node: Node) -> bool:
    """A float constant +0.0."""
    return node.op is Op.CONST and node.dtype.is_float and float(node.arg) == 0 and math.copysign(1.0, node.arg) > 0
