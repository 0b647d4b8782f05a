"""Bounds of data-independent integer and bool values over a box (a causal mask's `row >= column` on a block of
rows and columns), so that a select whose condition is surely one value there reads only one branch. Float values
count where they are whole numbers a float holds exactly (a float index: its arithmetic is then exact too)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from ember.core.dtype import DType, max_value, min_value
from ember.core.dtype_info import finfo
from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.walk import evaluate
from ember.incremental.region import Range, Region

Bounds = tuple[int, int]  # the smallest and largest value (bool as 0 and 1)
Request = tuple[Node, Region]

DATA_OPS = frozenset({Op.BUFFER, Op.COPY, Op.CONTIGUOUS})  # values only known by running the graph


def is_static(node: Node, sources_static: list[bool]) -> bool:
    """Whether a node's value depends on no buffer (given whether its sources' values do)."""
    return node.op not in DATA_OPS and all(sources_static)


def bounds_over(node: Node, box: Region) -> Bounds | None:
    """The smallest and largest value of a static integer or bool node over a non-empty box, or None where it is not
    known (a float value, an op without a rule here, a bound outside the dtype)."""
    return evaluate((node, box), lambda request: (id(request[0]), request[1].ranges), _bounds, {})


def _fits(bounds: Bounds | None, dtype: DType) -> Bounds | None:
    if bounds is None:
        return None
    if dtype.is_float:  # whole numbers up to 2 / eps are exact, and so is +, -, * and max of them in that range
        exact = int(2 / finfo(dtype).eps)
        return bounds if -exact <= bounds[0] and bounds[1] <= exact else None
    return bounds if min_value(dtype) <= bounds[0] and bounds[1] <= max_value(dtype) else None


def _whole(value: Any) -> Bounds | None:
    """A constant's bounds: itself where it is a whole number."""
    number = float(value)
    return (int(number), int(number)) if number.is_integer() else None


def _bounds(request: Request) -> Generator[Request, Any, Bounds | None]:
    node, box = request
    op = node.op
    if op is Op.CONST:
        return _fits(_whole(node.arg), node.dtype) if isinstance(node.arg, (int, float)) else None
    if op is Op.ARANGE:
        (start, end), = box.ranges
        return _fits((start, end - 1), node.dtype)
    if op in DATA_OPS or (op in LOGIC_OPS and not node.dtype.is_bool):
        return None
    if op in _MOVEMENT_BACK:
        source_box, padded = _MOVEMENT_BACK[op](node, box)
        values = [] if source_box is None else [(yield (node.srcs[0], source_box))]
        if padded:
            fill = node.arg[1]
            values.append(_whole(fill))
        return _join(values)
    if op is Op.WHERE:
        condition = yield (node.srcs[0], box)
        if condition is None:
            return None
        branches = [node.srcs[1]] if condition[0] == 1 else [node.srcs[2]] if condition[1] == 0 else node.srcs[1:]
        picked = []
        for branch in branches:
            picked.append((yield (branch, box)))
        return _join(picked)
    sources = []
    for source in node.srcs:
        bounds = yield (source, box)
        if bounds is None:
            return None
        sources.append(bounds)
    if op is Op.CAST:
        (source,) = sources
        return _to_bool(*source) if node.dtype.is_bool else _fits(source, node.dtype)  # whole numbers: exact
    return _fits(_ARITHMETIC[op](*sources) if op in _ARITHMETIC else None, node.dtype)


def _join(values: list[Bounds | None]) -> Bounds | None:
    known = [bounds for bounds in values if bounds is not None]
    if not values or len(known) < len(values):
        return None
    return min(low for low, _ in known), max(high for _, high in known)


def _to_bool(low: int, high: int) -> Bounds:
    if low == high == 0:
        return 0, 0
    return (1, 1) if low > 0 or high < 0 else (0, 1)


def _less(first: Bounds, second: Bounds) -> Bounds:
    if first[1] < second[0]:
        return 1, 1
    return (0, 0) if first[0] >= second[1] else (0, 1)


def _equal(first: Bounds, second: Bounds) -> Bounds:
    if first[0] == first[1] == second[0] == second[1]:
        return 1, 1
    return (0, 0) if first[1] < second[0] or second[1] < first[0] else (0, 1)


def _multiply(first: Bounds, second: Bounds) -> Bounds:
    products = [a * b for a in first for b in second]
    return min(products), max(products)


_ARITHMETIC: dict[Op, Any] = {
    Op.NEG: lambda a: (-a[1], -a[0]),
    Op.ADD: lambda a, b: (a[0] + b[0], a[1] + b[1]),
    Op.SUB: lambda a, b: (a[0] - b[1], a[1] - b[0]),
    Op.MUL: _multiply,
    Op.MAX: lambda a, b: (max(a[0], b[0]), max(a[1], b[1])),
    Op.CMPLT: _less,
    Op.CMPEQ: _equal,
    # logic of bools only (NOT of an integer is bitwise: no rule)
    Op.NOT: lambda a: (1 - a[1], 1 - a[0]),
    Op.AND: lambda a, b: (a[0] & b[0], a[1] & b[1]),
    Op.OR: lambda a, b: (a[0] | b[0], a[1] | b[1]),
}
LOGIC_OPS = frozenset({Op.NOT, Op.AND, Op.OR})


# ---- movement ops: the source box an output box reads, and whether it reads padding -------------------------------


def _permute_back(node: Node, box: Region) -> tuple[Region | None, bool]:
    ranges: list[Range] = [(0, 0)] * len(node.arg)
    for position, axis in enumerate(node.arg):
        ranges[axis] = box.ranges[position]
    return Region._of(node.srcs[0].shape, ranges), False


def _expand_back(node: Node, box: Region) -> tuple[Region | None, bool]:
    shape = node.srcs[0].shape
    return Region._of(shape, [(0, 1) if size == 1 else bounds for bounds, size in zip(box.ranges, shape)]), False


def _flip_back(node: Node, box: Region) -> tuple[Region | None, bool]:
    return Region._of(node.srcs[0].shape, [(size - end, size - start) if axis in node.arg else (start, end)
                               for axis, ((start, end), size) in enumerate(zip(box.ranges, node.shape))]), False


def _shrink_back(node: Node, box: Region) -> tuple[Region | None, bool]:
    return Region._of(node.srcs[0].shape, [(start + low, end + low)
                                       for (start, end), (low, _) in zip(box.ranges, node.arg)]), False


def _pad_back(node: Node, box: Region) -> tuple[Region | None, bool]:
    shape = node.srcs[0].shape
    ranges = [(max(start - before, 0), min(end - before, size))
              for (start, end), (before, _), size in zip(box.ranges, node.arg[0], shape)]
    padded = any(start < before or end > before + size
                 for (start, end), (before, _), size in zip(box.ranges, node.arg[0], shape))
    if any(start >= end for start, end in ranges):
        return None, True
    return Region._of(shape, ranges), padded


def _reshape_back(node: Node, box: Region) -> tuple[Region | None, bool]:
    return box.reshaped(node.srcs[0].shape), False


_MOVEMENT_BACK = {Op.PERMUTE: _permute_back, Op.EXPAND: _expand_back, Op.FLIP: _flip_back, Op.SHRINK: _shrink_back,
                  Op.PAD: _pad_back, Op.RESHAPE: _reshape_back}
