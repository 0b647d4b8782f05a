"""Linearization: the IR DAG to an ordered instruction list with loops; values are hoisted out of every loop
they do not depend on (loop-invariant hoisting) and nodes not reachable from the stores never appear (DCE)."""

from __future__ import annotations

import functools
from enum import Enum
from typing import NamedTuple

from ember.core.walk import compute_bottom_up, post_order, pre_order
from ember.ir.ir import IRNode, IROp


class Step(str, Enum):
    """What an instruction does with its node; each renderer has one method per step (backends/render_steps.py:
    STEP_METHODS). A str, so a backend written against the names, `kind == "loop"`, keeps working."""

    VALUE = "value"  # compute the node (an ALU op, LOAD, VECTORIZE, GEP)
    DEFINE_ACC = "define_acc"  # a REDUCE's accumulator, set to the reduce's identity
    LOOP = "loop"  # open the loop of a RANGE node
    UPDATE_ACC = "update_acc"  # combine a REDUCE's value into its accumulator
    END_LOOP = "end_loop"  # close the loop of a RANGE node
    STORE = "store"  # a STORE node
    DEFINE_LOCAL = "define_local"  # a DEFINE_LOCAL node: a scratch array of the work item
    GROUP_REDUCE = "group_reduce"  # a GROUP_REDUCE node: its value combined over the work items of the group
    DEFINE_SHARED = "define_shared"  # a DEFINE_SHARED node: an array in the group's local memory
    BARRIER = "barrier"  # a BARRIER node: the group's work items wait for each other

    __hash__ = str.__hash__


class Instruction(NamedTuple):
    """One step of a kernel body and the IR node it is about."""

    kind: Step
    node: IRNode


# IR ops that are one instruction of their own step, emitted where they are first needed
SINGLE_STEPS = {IROp.STORE: Step.STORE, IROp.DEFINE_LOCAL: Step.DEFINE_LOCAL, IROp.DEFINE_SHARED: Step.DEFINE_SHARED,
                IROp.BARRIER: Step.BARRIER, IROp.GROUP_REDUCE: Step.GROUP_REDUCE}
INLINE_OPS = (IROp.CONST, IROp.PARAM, IROp.RANGE, IROp.GLOBAL_ID, IROp.LOCAL_ID, IROp.GROUP_ID, IROp.SINK, IROp.AFTER)
UNITS = (IROp.REDUCE, IROp.LOOP)  # emitted as a whole: loops with what they contain


class LoopVariables:
    """The loop variables (ids of RANGE nodes) a node's value depends on; a REDUCE or LOOP closes its own ranges.
    Memoized across calls."""

    def __init__(self) -> None:
        self.memo: dict[int, frozenset[int]] = {}

    def __call__(self, root: IRNode) -> frozenset[int]:
        return compute_bottom_up(root, lambda node: node.srcs, self._own, self.memo)

    def _own(self, node: IRNode) -> frozenset[int]:
        if node.op is IROp.RANGE:
            return frozenset({id(node)})
        if node.op in UNITS:
            return self.memo[id(node.srcs[0])] - {id(range_) for range_ in node.srcs[1:]}
        return frozenset().union(*(self.memo[id(src)] for src in node.srcs))


class Linearizer:
    def __init__(self, sink: IRNode) -> None:
        self.sink = sink
        self.instructions: list[Instruction] = []
        self.done: set[int] = set()
        self.ranges_of = LoopVariables()
        self.reduce_groups: dict[tuple[int, ...], list[IRNode]] = {}
        self.open: set[int] = set()  # the loop variables of the loops open at the current instruction
        for node in pre_order([sink], lambda node: node.srcs):  # the order decides the accumulators' order
            if node.op is IROp.REDUCE:
                self.reduce_groups.setdefault(tuple(id(r) for r in node.srcs[1:]), []).append(node)

    def _topological(self, roots: list[IRNode]) -> list[IRNode]:
        """Nodes under roots not yet emitted, sources first; stops at emitted nodes and at reduces (a unit)."""
        def sources(node: IRNode) -> list[IRNode]:
            if node.op is IROp.REDUCE:
                return []
            # a LOOP: only what it needs outside it (its ranges are its own)
            return [src for src in reversed(node.srcs[1:] if node.op is IROp.LOOP else node.srcs)
                    if id(src) not in self.done]

        return post_order([root for root in roots if id(root) not in self.done], sources)

    def emit(self, node: IRNode) -> None:
        for item in self._topological([node]):
            if id(item) not in self.done:
                self._emit_one(item)

    def _emit_one(self, item: IRNode) -> None:
        if item.op is IROp.REDUCE:
            self._emit_reduce_group(item)
        elif item.op is IROp.LOOP:
            self._emit_loop(item)
        elif item.op in SINGLE_STEPS:
            assert item.op is not IROp.GROUP_REDUCE or not self.open, (
                "a GROUP_REDUCE's barriers must be reached by every work item: never in a loop")
            self.instructions.append(Instruction(SINGLE_STEPS[item.op], item))
            self.done.add(id(item))
        elif item.op not in INLINE_OPS:
            self.instructions.append(Instruction(Step.VALUE, item))
            self.done.add(id(item))
        else:
            self.done.add(id(item))

    def _emit_loop(self, loop: IRNode) -> None:
        """A LOOP statement: first whatever its body needs, at any depth, that needs no loop not open yet (a
        scratch array filled once, values that do not change inside), then the loops with the body inside."""
        loops = list(loop.srcs[1:])
        level_of = {id(range_): level for level, range_ in enumerate(loops)}
        self._emit_invariant(list(loop.srcs[0].srcs))
        body = self._topological(list(loop.srcs[0].srcs))
        for range_ in loops:  # a size known at launch (ir/shape_class.py): read before the loops
            for size in range_.srcs:
                self.emit(size)
        for level, range_ in enumerate(loops):
            self.instructions.append(Instruction(Step.LOOP, range_))
            self.open.add(id(range_))
            for node in body:
                if id(node) in self.done:
                    continue
                # (what needs none of these loops and was not hoisted, _emit_invariant: in the outermost)
                depth = max((level_of[r] for r in self.ranges_of(node) if r in level_of), default=0)
                if depth == level:
                    self._emit_one(node)
        for range_ in reversed(loops):
            self.instructions.append(Instruction(Step.END_LOOP, range_))
            self.open.discard(id(range_))
        self.done.add(id(loop))

    def _emit_invariant(self, roots: list[IRNode]) -> None:
        """Whatever is under roots, at any depth, that needs no loop not open yet (hoisted before the loops that
        follow), except a reduce whose group (the reduces over the same loops, emitted together) has a member that
        does need one (the lanes of a vectorized store loop, some of which do not depend on its counter): the group
        is emitted inside that loop, with what depends on it; hoisted alone, its other members' values would be
        computed where the loop's counter is out of scope."""
        held: set[int] = set()
        for node in self._topological_deep(roots):
            if id(node) in self.done:
                continue
            if node.op is IROp.STORE:  # (never hoisted: neither is what waits for it, a barrier after local stores)
                held.add(id(node))
                continue
            if not self.ranges_of(node) <= self.open:
                continue
            if any(id(src) in held for src in node.srcs) or (node.op is IROp.REDUCE and not self._group_ready(node)):
                held.add(id(node))
                continue
            self._emit_one(node)

    def _group_ready(self, reduce: IRNode) -> bool:
        """Whether every reduce of `reduce`'s group not emitted yet needs only loops open now (besides its own)."""
        return all(id(member) in self.done or self.ranges_of(member) <= self.open
                   for member in self.reduce_groups[tuple(id(r) for r in reduce.srcs[1:])])

    def _topological_deep(self, roots: list[IRNode]) -> list[IRNode]:
        """Nodes under roots not yet emitted, sources first, including those inside reduces and loops."""
        return post_order([root for root in roots if id(root) not in self.done],
                          lambda node: [src for src in reversed(node.srcs) if id(src) not in self.done])

    def _emit_reduce_group(self, reduce: IRNode) -> None:
        group = self.reduce_groups[tuple(id(r) for r in reduce.srcs[1:])]
        loops = list(reduce.srcs[1:])
        level_of = {id(loop): level for level, loop in enumerate(loops)}
        body = self._topological([member.srcs[0] for member in group])
        if any(node.op is IROp.REDUCE and self.ranges_of(node) & level_of.keys() for node in body):
            # a reduce inside this one's loops (a quantized product's per-block integer sum): what it needs, at any
            # depth, that needs no loop not open yet is computed here, before the loops, not inside them (where
            # a later loop nest reading the same value would find it out of scope)
            self._emit_invariant([member.srcs[0] for member in group])
        # values that need none of this group's loops are computed before the loops
        outside = [n for n in body if not (self.ranges_of(n) & level_of.keys())]
        for node in outside:
            self.emit(node)
        for loop in loops:  # a size known at launch (ir/shape_class.py): read before the loops
            for size in loop.srcs:
                self.emit(size)
        for member in group:
            self.instructions.append(Instruction(Step.DEFINE_ACC, member))
        for level, loop in enumerate(loops):
            self.instructions.append(Instruction(Step.LOOP, loop))
            self.open.add(id(loop))
            for node in body:
                if id(node) in self.done:
                    continue
                depth = max((level_of[r] for r in self.ranges_of(node) if r in level_of), default=-1)
                if depth == level:
                    self._emit_one(node)
        for member in group:
            self.instructions.append(Instruction(Step.UPDATE_ACC, member))
        for loop in reversed(loops):
            self.instructions.append(Instruction(Step.END_LOOP, loop))
            self.open.discard(id(loop))
        for member in group:
            self.done.add(id(member))


@functools.lru_cache(maxsize=16)
def linearize(sink: IRNode) -> tuple[Instruction, ...]:
    """The instructions of a kernel body in execution order. Nodes never change, so the last few answers are kept:
    choosing a tile plan linearizes the kernel it keeps (ir/opt.py: estimated_work), and rendering it again."""
    linearizer = Linearizer(sink)
    for store in sink.srcs:
        linearizer.emit(store)
    return tuple(linearizer.instructions)


def loop_iterations(sink: IRNode) -> int:
    """How many loop iterations one work item runs, every loop counted (an inner loop once per outer iteration)."""
    trips, total = [1], 0
    for instruction in linearize(sink):
        if instruction.kind is Step.LOOP:
            trips.append(trips[-1] * instruction.node.arg[1])
            total += trips[-1]
        elif instruction.kind is Step.END_LOOP:
            trips.pop()
    return total
