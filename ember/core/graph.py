"""The lazy graph: a Node per recorded primitive op; Python's reference counts drop unreachable nodes."""

from __future__ import annotations

from typing import Any

from ember.core import dtype as dtypes
from ember.core.checks import Check, merge
from ember.core.dtype import DType
from ember.core.ops import BINARY_OPS, COMPARISON_OPS, MOVEMENT_OPS, REDUCE_OPS, UNARY_OPS, Op
from ember.core.shapes import Shape, prod


class Node:
    """One primitive op applied to source nodes. A realized node becomes a BUFFER leaf and drops its sources.

    `device` is where the node's value lives or will be computed: given for sources (BUFFER, CONST, ARANGE) and
    COPY; None for a recorded op until the scheduler's placement rule decides it (`Tensor.device` asks, and
    realize places every node it runs). A BUFFER leaf made from host data holds the array in `arg` and no
    `buffer` until the scheduler uploads it, at its first use by a kernel or copy. `replaces` is the realized node
    an in-place assign rebound away from: the scheduler may write this node's value into its buffer. `checks` are
    the value checks (core/checks.py) of its sources and its own, evaluated when it is realized; None for none.
    `siblings`, set only on a TEMPLATE node of a copy with several results (core/graph_templates.py): the copy's
    results by template position, as weak references (a realize storing one of them realizes the others it reaches).
    `kept`, on a TEMPLATE node during a realize that stores nodes of its copy: those nodes by template position
    (held by the node, as a copy made node for node held them, until graph_templates.keep_stored reads them)."""

    __slots__ = ("op", "srcs", "arg", "shape", "dtype", "device", "buffer", "replaces", "checks", "siblings", "kept",
                 "__weakref__")

    def __init__(self, op: Op, srcs: tuple[Node, ...], arg: Any, shape: Shape, dtype: DType,
                 device: str | None = None) -> None:
        self.op = op
        self.srcs = srcs
        self.arg = arg
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.buffer: Any = None
        self.replaces: Node | None = None
        self.siblings: dict[int, Any] | None = None
        self.kept: dict[int, Node] | None = None
        checks = None  # the sources' checks pass on (a loop without a generator's frame: the per-op path)
        for source in srcs:
            if source.checks is not None:
                checks = source.checks if checks is None or checks is source.checks else merge(checks, source.checks)
        self.checks: tuple[Check, ...] | None = checks

    def __repr__(self) -> str:
        return f"Node({self.op.name}, shape={self.shape}, dtype={self.dtype.name}, device={self.device})"

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def realized(self) -> bool:
        return self.op is Op.BUFFER

    def become_buffer(self, buffer: Any) -> None:
        """Turn this node into a leaf holding `buffer`; the graph above it is released."""
        self.op, self.srcs, self.arg, self.buffer, self.replaces, self.kept = Op.BUFFER, (), None, buffer, None, None
        self.device = buffer.device_name


def infer(op: Op, srcs: tuple[Node, ...], arg: Any) -> tuple[Shape, DType]:
    """Shape and dtype of a primitive op's result. User-facing checks happen before this; these are invariants."""
    first = srcs[0]
    if op in UNARY_OPS:
        return first.shape, (arg if op in (Op.CAST, Op.BITCAST) else first.dtype)
    if op in BINARY_OPS:
        assert first.shape == srcs[1].shape and first.dtype == srcs[1].dtype, (op, first, srcs[1])
        return first.shape, (dtypes.bool_ if op in COMPARISON_OPS else first.dtype)
    if op is Op.WHERE:
        assert first.dtype == dtypes.bool_ and srcs[1].dtype == srcs[2].dtype, srcs
        assert first.shape == srcs[1].shape == srcs[2].shape, srcs
        return first.shape, srcs[1].dtype
    if op in REDUCE_OPS:
        return tuple(1 if axis in arg else size for axis, size in enumerate(first.shape)), first.dtype
    if op in MOVEMENT_OPS:
        return movement_shape(op, first.shape, arg), first.dtype
    if op in (Op.COPY, Op.CONTIGUOUS):
        return first.shape, first.dtype
    raise AssertionError(f"infer: {op} has no sources to infer from")


def movement_shape(op: Op, shape: Shape, arg: Any) -> Shape:
    """The shape after a movement op."""
    if op in (Op.RESHAPE, Op.EXPAND):
        return tuple(arg)
    if op is Op.PERMUTE:
        return tuple(shape[axis] for axis in arg)
    if op is Op.PAD:
        return tuple(size + before + after for size, (before, after) in zip(shape, arg[0]))
    if op is Op.SHRINK:
        return tuple(end - start for start, end in arg)
    if op is Op.FLIP:
        return shape
    raise AssertionError(op)
