"""Value checks recorded with the lazy graph: an index out of range, or an integer divisor of 0, raises when a value
computed from it is first realized (as torch raises at the op), and recording the op reads nothing from the device.

A `Check` holds a lazy int64 scalar, its *violation*: -1 when the checked values are valid, else the first flat
position of an invalid one. The node carrying a check passes it on to every node computed from it (graph.Node),
and realizing a node with checks realizes their violations in the same schedule, reads them and raises the first
failure (`settle`, called by the scheduler's realize). A check is evaluated once: a passed one is dropped from the
realized nodes, a failed one stays on them, so every later read of a wrong value raises again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from ember.core import dtype as dtypes
from ember.core.errors import EmberError
from ember.core.ops import Op

if TYPE_CHECKING:
    from ember.core.graph import Node
    from ember.core.tensor import Tensor


class IndexOutOfRangeError(EmberError, IndexError, RuntimeError):
    """An index read from data is out of range for the dim it indexes (torch raises IndexError or RuntimeError,
    depending on the op; this is both)."""


class IntegerDivisionByZeroError(EmberError, RuntimeError, ZeroDivisionError):
    """An integer tensor divided (//, %, div with a rounding mode, fmod, remainder) by a tensor holding 0 (torch
    raises RuntimeError('ZeroDivisionError'))."""


# describe(position, value) -> the exception: position is the first invalid flat position of the checked values,
# value the value there (None where it is not known: an ember.jit replay reads only the violation)
Describe = Callable[[int, "int | None"], Exception]


class Check:
    """One pending value check: `violation` (a node, until evaluated), `values` (the node whose element at the
    position `describe` names), and after evaluation `passed` or the `failure` to raise."""

    __slots__ = ("violation", "values", "describe", "passed", "failure")

    def __init__(self, violation: Node, values: Node | None, describe: Describe) -> None:
        self.violation: Node | None = violation
        self.values = values
        self.describe = describe
        self.passed = False
        self.failure: Exception | None = None

    def settle(self, position: int, value: int | None) -> None:
        """Record the violation's value (-1: passed) and drop the graph this check held."""
        if position < 0:
            self.passed = True
        else:
            self.failure = self.describe(position, value)
        self.violation = self.values = None


def merge(first: tuple[Check, ...], second: tuple[Check, ...]) -> tuple[Check, ...] | None:
    """The checks of a node with two checked sources: both sets, without repeats and without passed checks."""
    merged = tuple(check for check in first if not check.passed)
    merged += tuple(check for check in second if not check.passed and check not in merged)
    return merged or None


def first_invalid_position(invalid: Tensor) -> Tensor:
    """The first flat position where the bool tensor `invalid` is True, or -1 (int64 scalar; one fused reduce)."""
    count = invalid.numel()
    flat = invalid._reshaped((count,))
    device = flat.device
    last = flat._full((count,), count - 1, dtypes.int64, device)
    reversed_positions = last._apply(Op.SUB, flat._arange_primitive(count, dtypes.int64, device))
    last_key = flat._apply(Op.WHERE, reversed_positions, flat._full((count,), -1, dtypes.int64, device)).max()
    # (the largest key is the first position; -1 when there is none)
    first = last_key._full((), count - 1, dtypes.int64, device)._apply(Op.SUB, last_key)
    return last_key._apply(Op.CMPLT, last_key._full((), 0, dtypes.int64, device))._apply(Op.WHERE, last_key, first)


def checked(values: Tensor, invalid: Tensor, describe: Describe, named: Tensor | None = None) -> Tensor:
    """`values` as a tensor that carries a check: reading anything computed from it raises
    describe(position, named's flat value there) when the bool tensor `invalid` is True anywhere (`position` is the
    first such flat position). The numpy reference tensor checks at once."""
    if invalid.numel() == 0:
        return values
    return values._checked(invalid, describe, named)


def pending(nodes: Sequence[Node]) -> list[Check]:
    """The checks of `nodes` still to evaluate; raises the failure of one already evaluated."""
    checks, failed = unsettled(nodes)
    if failed is not None:
        raise cast(Exception, failed.failure)
    return checks


def unsettled(nodes: Sequence[Node]) -> tuple[list[Check], Check | None]:
    """The checks of `nodes` still to evaluate, and the first one met that was evaluated and failed (None: none;
    the checks are then those met before it)."""
    checks: list[Check] = []
    for node in nodes:
        for check in node.checks or ():
            if check.failure is not None:
                return checks, check
            if not check.passed and check not in checks:
                checks.append(check)
    return checks, None


def settle(checks: list[Check], nodes: Sequence[Node], read: Callable[[Node], np.ndarray]) -> None:
    """After the violations of `checks` were realized with `nodes`: read them, drop the passed checks from the
    realized nodes and raise the first failure (it stays on the nodes, so later reads raise it again)."""
    from ember.core.tensor import Tensor

    for check in checks:
        violation, values = check.violation, check.values
        if violation is None:  # settled by an earlier check's read in this loop
            continue
        position = int(read(violation).reshape(()))
        value = None
        if position >= 0 and values is not None:
            value = int(Tensor._from_node(values).numpy().reshape(-1)[position])
        check.settle(position, value)
    for node in nodes:
        if node.checks is not None and node.realized:
            node.checks = tuple(check for check in node.checks if not check.passed) or None
    for check in checks:
        if check.failure is not None:
            raise check.failure


def attach(node: Node, check: Check) -> None:
    """Give `node` (a new node no one has read yet) one more check."""
    node.checks = (*node.checks, check) if node.checks is not None else (check,)


def fresh_node(values: Tensor) -> Tensor:
    """values as a new node (a same-shape reshape: a view, no copy), so a check can be attached to it alone."""
    return values._apply(Op.RESHAPE, arg=values.shape)


def unravel(position: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The multi-dim position of a flat (row-major) one."""
    return tuple(int(part) for part in np.unravel_index(position, shape)) if shape else ()


def describe_target(op: str, target_shape: tuple[int, ...], classes: int, ignore_index: int | None) -> Describe:
    """The describe function of a class-target check (torch: 'Target 5 is out of bounds.')."""
    ignored = "" if ignore_index is None else f" or ignore_index ({ignore_index})"

    def describe(position: int, value: int | None) -> Exception:
        shown = "A target" if value is None else f"Target {value}"
        return IndexOutOfRangeError(f"{op}: {shown} at position {unravel(position, target_shape)} of the target "
                                    f"(shape {target_shape}) is out of bounds: class indices must be in "
                                    f"[0, {classes}){ignored}")

    return describe


def describe_index(op: str, index_shape: tuple[int, ...], dim: int | None, size: int, negatives: bool) -> Describe:
    """The describe function of an index check: torch's message ('index 7 is out of bounds for dimension 1 with
    size 2') with the op, the index's position and the valid range."""
    valid = f"[{-size}, {size})" if negatives else f"[0, {size})"
    where_text = "" if dim is None else f" for dimension {dim}"

    def describe(position: int, value: int | None) -> Exception:
        location = f" at position {unravel(position, index_shape)} of the index (shape {index_shape})"
        shown = "an index" if value is None else f"index {value}"
        return IndexOutOfRangeError(f"{op}: {shown}{location} is out of bounds{where_text} with size {size}; "
                                    f"valid indices are in {valid}")

    return describe


def host_values(tensor: Tensor) -> np.ndarray | None:
    """The values of a tensor known on the host without a device read (host data not yet uploaded, a constant, the
    numpy reference tensor's array), else None."""
    array = getattr(tensor, "array", None)  # the numpy reference tensor
    if isinstance(array, np.ndarray):
        return array
    node = tensor.node
    if node.op is Op.BUFFER and isinstance(node.arg, np.ndarray) and node.checks is None:
        return node.arg
    base = node
    while base.op in _VALUE_KEEPING_VIEWS and base.checks is None:
        base = base.srcs[0]
    if base.op is Op.CONST and base.checks is None:  # a number broadcast or viewed: every element is the constant
        return np.full(node.shape, base.arg)
    return None


_VALUE_KEEPING_VIEWS = frozenset({Op.RESHAPE, Op.EXPAND, Op.PERMUTE, Op.SHRINK, Op.FLIP})


def check_index(index: Tensor, size: int, op: str, dim: int | None, negatives: bool, ignore: int | None = None,
                describe: Describe | None = None) -> Tensor:
    """index as int64 (negative entries counted from the end where `negatives`, as torch allows for this op),
    checked to lie in [0, size) (or [-size, size)), entries equal to `ignore` excepted: at once when its values are
    on the host, else lazily (a check on the returned tensor, evaluated when anything computed from it is
    realized). The error is IndexOutOfRangeError with torch's message, or what `describe` makes."""
    from ember.core.advanced_indexing import wrap_negative
    from ember.core.graph_templates import TEMPLATES  # (graph_templates imports graph, which imports this module)

    describe = describe or describe_index(op, index.shape, dim, size, negatives)
    values = wrap_negative(index, size) if negatives else index.cast(dtypes.int64)
    low = -size if negatives else 0
    host = host_values(index)
    if host is not None:
        wide = host.astype(np.int64).reshape(-1)
        invalid = (wide < low) | (wide >= size)
        bad = np.flatnonzero(invalid if ignore is None else invalid & (wide != ignore))
        if bad.size:
            raise describe(int(bad[0]), int(wide[bad[0]]))
        return values
    # (copied from a template from the second check of a shape on)
    lazy_invalid = TEMPLATES.instantiate(("invalid index", size, low, ignore),
                                         functools.partial(_invalid_index, size=size, low=low, ignore=ignore),
                                         (index,))
    return checked(values, lazy_invalid, describe, named=index)


def _invalid_index(index: Tensor, size: int, low: int, ignore: int | None) -> Tensor:
    """Where an index is outside [low, size) and not `ignore` (bool, index's shape): the primitives alone."""
    index64 = index.cast(dtypes.int64)

    def constant(value: int) -> Tensor:
        return index64._full(index64.shape, value, dtypes.int64, index64.device)

    too_large = index64._apply(Op.CMPLT, constant(size))._apply(Op.NOT)
    invalid = index64._apply(Op.CMPLT, constant(low))._apply(Op.OR, too_large)
    if ignore is not None:
        invalid = invalid._apply(Op.AND, index64._apply(Op.CMPEQ, constant(ignore))._apply(Op.NOT))
    return invalid


def check_divisor(divisor: Tensor, op: str) -> Tensor:
    """An integer divisor checked to hold no 0 (IntegerDivisionByZeroError, torch's RuntimeError
    'ZeroDivisionError'): at once when its values are on the host, else lazily as check_index."""
    shape = divisor.shape

    def describe(position: int, value: int | None) -> Exception:
        return IntegerDivisionByZeroError(
            f"ZeroDivisionError: {op}: integer division by zero (the divisor of shape {shape} is 0 at position "
            f"{unravel(position, shape)}); divide floating point tensors to get inf or nan instead"
        )

    host = host_values(divisor)
    if host is not None:
        zeros = np.flatnonzero(host.reshape(-1) == 0)
        if zeros.size:
            raise describe(int(zeros[0]), 0)
        return divisor
    return checked(divisor, divisor == 0, describe)
