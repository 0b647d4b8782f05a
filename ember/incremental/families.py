"""Plans for a range of positions: an update's plan (which boxes of each kept value to recompute, which stay
invalid) worked out once over inputs affine in a parameter t (a decode step's position), valid for every t of the
interval its decisions hold on (`affine.py`), and instantiated at a later update whose edited, needed and invalid
regions are those inputs at some t of it (exact integer equality), with no planning work."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import gcd
from typing import Any

from ember.core.graph import Node
from ember.core.walk import post_order
from ember.incremental import affine
from ember.incremental.region import Region

Boxes = tuple[Region, ...]
Plan = tuple[list[tuple[Node, Region]], dict[Node, Boxes]]
Inputs = tuple[dict[Node, Region], list[Region], dict[Node, Boxes]]  # edited, needed, invalid regions
Planner = Callable[[dict[Node, Region], list[Region], dict[Node, Boxes]], Plan]
Restrictor = Callable[[Node, Region], Node]  # the restricted graph of a kept value's box
MAX_FAMILIES = 8  # per input structure (the oldest is dropped)


@dataclass
class Description:
    """An update's inputs as a structure (which regions, which are empty, how many boxes) and the flat list of
    their range bounds, in order."""

    structure: tuple[Any, ...]
    bounds: list[int]


@dataclass
class Family:
    """A plan whose box bounds are affine in t (`affine.Affine`), valid for `low` <= t <= `high`, for the inputs
    whose bounds are `base[i] + slopes[i] * t`; `graphs`: the restricted graph of each step of the plan, its
    arguments and shapes affine in t too (over the template's nodes, as `runner._restricted` builds them)."""

    base: list[int]
    slopes: list[int]
    low: int
    high: int
    plan: Plan
    graphs: list[Node]
    # the part of [low, high] over which the scheduler's decisions on `graphs` hold, () where none does, None
    # until worked out (position_replay.certified_interval)
    certified: tuple[int, ...] | None = None

    def parameter(self, bounds: Sequence[int]) -> int | None:
        """The t at which the family's inputs are `bounds`, or None where they are not its inputs at any t of it."""
        t = None
        for value, base, slope in zip(bounds, self.base, self.slopes):
            if slope:
                if (value - base) % slope:
                    return None
                t = (value - base) // slope
                break
        if t is None or not self.low <= t <= self.high:
            return None
        for value, base, slope in zip(bounds, self.base, self.slopes):
            if value != base + slope * t:
                return None
        return t


def describe(inputs: Inputs, kept: Sequence[Node], fixed: tuple[Any, ...]) -> Description:
    """The structure and bounds of an update's inputs (kept values' invalid boxes in `kept` order); `fixed`: what
    else the plan depends on (the alignment of each kept value's views), part of the structure."""
    changes, wanted, invalid = inputs
    structure: list[Any] = [fixed]
    bounds: list[int] = []
    for leaf, region in changes.items():
        structure.append((id(leaf), region.is_empty))
        _extend(bounds, region)
    for region in wanted:
        structure.append(region.is_empty)
        _extend(bounds, region)
    for index, node in enumerate(kept):
        boxes = invalid.get(node, ())
        if boxes:
            structure.append((index, len(boxes)))
            for box in boxes:
                _extend(bounds, box)
    return Description(tuple(structure), bounds)


def _extend(bounds: list[int], region: Region) -> None:
    for start, end in region.ranges:
        bounds.append(start)
        bounds.append(end)


class Families:
    """The families made so far, by input structure."""

    def __init__(self) -> None:
        self.by_structure: dict[tuple[Any, ...], list[Family]] = {}

    def find(self, description: Description) -> tuple[Family, int] | None:
        """A family for these inputs and their t, or None."""
        for family in self.by_structure.get(description.structure, ()):
            t = family.parameter(description.bounds)
            if t is not None:
                return family, t
        return None

    def make(self, inputs: Inputs, description: Description, previous: Description | None,
             kept: Sequence[Node], planner: Planner, restrictor: Restrictor) -> tuple[Family, int] | None:
        """Plan these inputs over t, taking as slopes their differences from the previous update's (same structure:
        the next decode step), and restrict each box of the plan over t; the family (kept where it holds for more
        than this t) and this t (0); None where there is no previous update to take slopes from."""
        if previous is None or previous.structure != description.structure or previous.bounds == description.bounds:
            return None
        differences = [now - before for now, before in zip(description.bounds, previous.bounds)]
        step = 0
        for difference in differences:
            step = gcd(step, difference)
        slopes = [difference // step for difference in differences]
        with affine.tracing() as interval:
            plan = planner(*_affine_inputs(inputs, kept, slopes))
            graphs = [restrictor(node, box) for node, box in plan[0]]
        family = Family(description.bounds, slopes, interval.low, interval.high, plan, graphs)
        if not interval.is_point:
            families = self.by_structure.setdefault(description.structure, [])
            families.append(family)
            del families[:-MAX_FAMILIES]
        return family, 0

    def clear(self) -> None:
        self.by_structure.clear()


def _affine_inputs(inputs: Inputs, kept: Sequence[Node], slopes: list[int]) -> Inputs:
    """The inputs with their bounds affine in t (in `describe`'s order)."""
    changes, wanted, invalid = inputs
    position = 0

    def shifted(region: Region) -> Region:
        nonlocal position
        ranges = []
        for start, end in region.ranges:
            ranges.append((affine.affine(start, slopes[position]), affine.affine(end, slopes[position + 1])))
            position += 2
        return Region._of(region.shape, ranges)

    new_changes = {leaf: shifted(region) for leaf, region in changes.items()}
    new_wanted = [shifted(region) for region in wanted]
    new_invalid: dict[Node, Boxes] = {}
    for node in kept:
        boxes = invalid.get(node, ())
        if boxes:
            new_invalid[node] = tuple(shifted(box) for box in boxes)
    return new_changes, new_wanted, new_invalid


def instantiate(plan: Plan, t: int) -> Plan:
    """A plan of affine bounds at `t` (plain ints)."""
    steps, invalid = plan
    return ([(node, _at(box, t)) for node, box in steps],
            {node: tuple(_at(box, t) for box in boxes) for node, boxes in invalid.items()})


def _at(region: Region, t: int) -> Region:
    return Region._of(region.shape, [(affine.at(start, t), affine.at(end, t)) for start, end in region.ranges])


def over_values(graph: Node, stops: set[Node], current: Callable[[Node], Node], t: int | None = None) -> Node:
    """A restricted graph (over the template's nodes, or a family's, affine in t) copied with each of its `stops`
    (kept values and inputs) replaced by `current` of it, and with t its arguments and shapes taken at t (without,
    they stay affine: position_replay.certified_interval schedules the copy on them)."""
    copies: dict[Node, Node] = {}
    for original in post_order([graph], lambda node: () if node in stops else node.srcs):
        if original in stops:
            copies[original] = current(original)
        elif t is not None and (affine.holds_affine(original.arg) or affine.holds_affine(original.shape)):
            copies[original] = Node(original.op, tuple(copies[source] for source in original.srcs),
                                    affine.at_all(original.arg, t), affine.at_all(original.shape, t),
                                    original.dtype, original.device)
        elif not original.srcs:  # (a leaf: BUFFER, CONST, ARANGE)
            copies[original] = original
        else:
            copies[original] = Node(original.op, tuple(copies[source] for source in original.srcs), original.arg,
                                    original.shape, original.dtype, original.device)
    return copies[graph]
