"""Dirty regions (ember/incremental): the Region box, and propagation through lazy graphs checked for soundness
(an element outside the propagated region never changes) and tightness against values computed before and after
an edit of an input: by the numpy reference tensor on random graphs, and by each device on hand-written ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ember as em
from ember.core import dtype as dtypes
from ember.core.errors import ArgumentError, ShapeError
from ember.core.ops import Op
from ember.incremental.propagate import MAX_BOXES, propagate, propagate_boxes, union
from ember.incremental.region import Region, reshape_groups
from ember.incremental.static_bounds import bounds_over
from ember.testing.reference import ReferenceTensor

# ---- Region ------------------------------------------------------------------------------------------------------


def box_mask(region: Region) -> np.ndarray:
    mask = np.zeros(region.shape, dtype=bool)
    if not region.is_empty:
        mask[region.slices()] = True
    return mask


def boxes_mask(shape: tuple[int, ...], boxes: Any) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    for box in boxes:
        mask |= box_mask(box)
    return mask


def bounding_region(mask: np.ndarray) -> Region:
    """The smallest box holding every True element of mask (numpy's answer, independent of Region.hull)."""
    if not mask.any():
        return Region.empty(mask.shape)
    positions = np.argwhere(mask)
    return Region(mask.shape, list(zip(positions.min(0).tolist(), (positions.max(0) + 1).tolist())))


@st.composite
def regions(draw: st.DrawFn, shape: tuple[int, ...], nonempty: bool = False) -> Region:
    ranges = []
    for size in shape:
        start = draw(st.integers(0, size - nonempty))
        ranges.append((start, draw(st.integers(start + nonempty, size))))
    return Region(shape, ranges)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_region_operations_match_numpy_masks(data: st.DataObject) -> None:
    shape = tuple(data.draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
    first, second = data.draw(regions(shape)), data.draw(regions(shape))
    first_mask, second_mask = box_mask(first), box_mask(second)
    assert first.size == first_mask.sum() and first.is_empty == (not first_mask.any())
    assert first.hull(second) == bounding_region(first_mask | second_mask)
    intersection = first.intersection(second)
    assert (box_mask(intersection) == (first_mask & second_mask)).all()
    assert intersection == bounding_region(first_mask & second_mask)
    assert first.contains(second) == (not (second_mask & ~first_mask).any())
    assert first.hull(second).contains(first) and first.hull(second).contains(second)
    pieces = first.difference(second)
    assert sum(piece.size for piece in pieces) == (first_mask & ~second_mask).sum()
    assert (boxes_mask(first.shape, pieces) == (first_mask & ~second_mask)).all()  # disjoint, since sizes add up
    assert all(not piece.is_empty for piece in pieces)
    assert first.reshaped((int(np.prod(shape)),)).contains(
        bounding_region(first_mask.reshape(-1)))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_reshaped_region_holds_the_reshaped_elements(data: st.DataObject) -> None:
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    region = data.draw(regions(shape))
    new_shape = draw_reshape(data, shape)
    moved = box_mask(region).reshape(new_shape)
    reshaped = region.reshaped(new_shape)
    assert reshaped.contains(bounding_region(moved))
    if all(len(old) <= 1 for old, _ in reshape_groups(shape, new_shape)):  # only splits: exact
        assert reshaped == bounding_region(moved)
    assert reshaped.reshaped(shape).contains(region)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_union_of_boxes_is_disjoint_and_exact_up_to_the_cap(data: st.DataObject) -> None:
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    boxes = data.draw(st.lists(regions(shape), max_size=12))
    result = union((), boxes)
    wanted = boxes_mask(shape, boxes)
    exact = (boxes_mask(shape, result) == wanted).all() and sum(box.size for box in result) == wanted.sum()
    assert exact or result == (bounding_region(wanted),)  # disjoint boxes of exactly the union, or (past the cap) its hull
    assert len(result) <= MAX_BOXES and all(not box.is_empty for box in result)
    many = [Region.from_index((2 * MAX_BOXES + 2,), 2 * index) for index in range(MAX_BOXES + 1)]
    assert union((), many) == (Region.from_index((2 * MAX_BOXES + 2,), slice(0, 2 * MAX_BOXES + 1)),)


def test_region_constructors_and_equality() -> None:
    assert Region.whole((2, 3)) == Region((2, 3), [(0, 2), (0, 3)]) and Region.whole((2, 3)).is_whole
    assert Region.empty((2, 3)) == Region((2, 3), [(1, 1), (0, 3)])
    assert Region.empty((2, 3)).size == 0 and not Region.empty((2, 3)).is_whole
    assert Region.whole(()).size == 1 and Region.empty(()).size == 0 and Region.whole(()) != Region.empty(())
    assert Region.whole(()).hull(Region.empty(())) == Region.whole(())
    assert Region.whole((0, 3)).is_empty
    assert Region.from_index((4, 5), (-1, slice(1, 3))) == Region((4, 5), [(3, 4), (1, 3)])
    assert Region.from_index((4, 5), 2) == Region((4, 5), [(2, 3), (0, 5)])
    assert len({Region.whole((2,)), Region((2,), [(0, 2)]), Region.empty((2,))}) == 2


def test_region_errors_name_the_problem() -> None:
    with pytest.raises(ShapeError, match=r"2 ranges .* rank 1"):
        Region((3,), [(0, 1), (0, 1)])
    with pytest.raises(ArgumentError, match=r"axis 0 range \(2, 5\) is out of range for shape \(3,\)"):
        Region((3,), [(2, 5)])
    with pytest.raises(ArgumentError, match=r"out of range"):
        Region((3,), [(2, 1)])
    with pytest.raises(ShapeError, match=r"shapes \(3,\) and \(4,\)"):
        Region.whole((3,)).hull(Region.whole((4,)))
    with pytest.raises(ArgumentError, match="step 2"):
        Region.from_index((4,), slice(0, 4, 2))
    with pytest.raises(ArgumentError, match="out of range"):
        Region.from_index((4,), 4)
    x = em.tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ShapeError, match=r"shape \(3, 2\) .* need \(2, 3\)"):
        propagate([(x + 1).node], {x.node: Region.whole((3, 2))})


def test_reshape_groups() -> None:
    assert reshape_groups((2, 3, 4), (6, 4)) == [(range(2), range(1)), (range(2, 3), range(1, 2))]
    assert reshape_groups((4, 6), (2, 2, 3, 2)) == [(range(1), range(2)), (range(1, 2), range(2, 4))]
    assert reshape_groups((2, 3), (3, 2)) == [(range(2), range(2))]
    groups = reshape_groups((1, 6), (2, 3, 1))
    assert [(len(old), len(new)) for old, new in groups] == [(1, 0), (1, 2), (0, 1)]


# ---- bounds of data-independent values (causal masks) --------------------------------------------------------------

STATIC_STEPS = ["add", "subtract", "scale", "shift", "less", "equal", "not", "and", "or", "to_bool", "where", "cast",
                "flip", "pad_window"]


def build_static(kind: Any, rows: int, columns: int, steps: list[tuple[str, int, int]]) -> Any:
    """Integer and bool (rows, columns) values made from aranges and constants by `steps` (no buffer read)."""
    base = kind(np.zeros((), np.float32))
    row = base._arange_primitive(rows, em.int64, base.device).reshape(rows, 1).expand(rows, columns)
    column = base._arange_primitive(columns, em.int64, base.device).reshape(1, columns).expand(rows, columns)
    integers, bools = [row, column], [row < column]
    for name, pick, amount in steps:
        first, second = integers[pick % len(integers)], integers[(pick // 7) % len(integers)]
        condition, other_condition = bools[pick % len(bools)], bools[(pick // 5) % len(bools)]
        if name == "less":
            bools.append(first < second)
        elif name == "equal":
            bools.append(first == second)
        elif name == "not":
            bools.append(condition.logical_not())
        elif name == "and":
            bools.append(condition & other_condition)
        elif name == "or":
            bools.append(condition | other_condition)
        elif name == "to_bool":
            bools.append(first._apply(Op.CAST, arg=dtypes.bool_))
        elif name == "add":
            integers.append(first + second)
        elif name == "subtract":
            integers.append(first - second)
        elif name == "scale":
            integers.append(first * amount)
        elif name == "shift":
            integers.append(first + amount)
        elif name == "where":
            integers.append(first.where(condition, second))
        elif name == "cast":
            integers.append(condition.long())
        elif name == "flip":
            integers.append(first.flip(pick % 2))
        else:
            window = (slice(pick % 3, pick % 3 + rows), slice(amount % 3, amount % 3 + columns))
            integers.append(first.pad((1, 1, 1, 1), value=amount)[window])
    return [*integers, *bools]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 6), st.integers(1, 6),
       st.lists(st.tuples(st.sampled_from(STATIC_STEPS), st.integers(0, 100), st.integers(-3, 3)), max_size=6),
       st.data())
def test_static_bounds_hold_every_value_in_the_box(rows: int, columns: int, steps: list[tuple[str, int, int]],
                                                   data: st.DataObject) -> None:
    nodes = [value.node for value in build_static(em.tensor, rows, columns, steps)]
    truths = [np.asarray(value.array).astype(np.int64) for value in build_static(ReferenceTensor, rows, columns, steps)]
    known = 0
    for node, truth in zip(nodes, truths):
        box = data.draw(regions((rows, columns), nonempty=True))
        bounds = bounds_over(node, box)
        if bounds is not None:
            known += 1
            values = truth[box.slices()]
            assert bounds[0] <= values.min() and values.max() <= bounds[1], (node, box, bounds, values)
    assert known == len(nodes)  # every step here has a rule


def test_static_bounds_of_a_causal_mask_are_exact_and_inexact_floats_unknown() -> None:
    query = em.tensor(np.zeros((6, 4), np.float32))
    row = query._arange_primitive(6, em.int64, query.device).reshape(6, 1).expand(6, 6)
    column = query._arange_primitive(6, em.int64, query.device).reshape(1, 6).expand(6, 6)
    causal = (row >= column).node
    assert bounds_over(causal, Region.from_index((6, 6), (slice(0, 5), 5))) == (0, 0)
    assert bounds_over(causal, Region.from_index((6, 6), (5, slice(0, 5)))) == (1, 1)
    assert bounds_over(causal, Region.from_index((6, 6), 5)) == (0, 1)  # (the two comparisons are bounded apart)
    assert bounds_over(causal, Region.whole((6, 6))) == (0, 1)
    assert bounds_over((query @ query.T).node, Region.whole((6, 6))) is None
    # whole numbers a float holds exactly are known (sdpa's causal mask compares float32 indices) ...
    assert bounds_over((row.float() < 3).node, Region.whole((6, 6))) == (0, 1)
    assert bounds_over((row.float() + 1 < 3).node, Region.from_index((6, 6), slice(0, 2))) == (1, 1)
    assert bounds_over((row.float() + 1 < 3).node, Region.from_index((6, 6), slice(2, 6))) == (0, 0)
    # ... fractions and numbers past a float's exact range are not
    assert bounds_over((row.float() * 0.5 < 3).node, Region.whole((6, 6))) is None
    assert bounds_over((row.float() * 2.0**24 < 3).node, Region.whole((6, 6))) is None
    assert bounds_over((row.half() * 1024 < 3).node, Region.whole((6, 6))) is None  # 5 * 1024 > 2**11
    assert bounds_over((row.half() * 256 < 3).node, Region.whole((6, 6))) == (0, 1)
    assert bounds_over((~(row < 2).long()).node, Region.whole((6, 6))) is None  # bitwise not of an integer: no rule
    assert bounds_over((~(row < 2)).node, Region.from_index((6, 6), slice(0, 2))) == (0, 0)


# ---- random graphs, evaluated by the reference tensor -------------------------------------------------------------

Make = Callable[[np.ndarray], Any]  # numpy array -> a tensor of the kind being evaluated (ember or reference)


@dataclass
class Step:
    """One op of a random program: `apply(tensor, make)`; `exact` when the propagated region must be tight."""

    name: str
    apply: Callable[[Any, Make], Any]
    exact: bool


def _broadcast_other(data: st.DataObject, shape: tuple[int, ...], random: np.random.Generator) -> np.ndarray:
    other_shape = tuple(size if data.draw(st.booleans()) else 1 for size in shape)
    return random.uniform(0.5, 1.5, size=other_shape).astype(np.float32)


def draw_step(data: st.DataObject, shape: tuple[int, ...], random: np.random.Generator) -> Step:
    rank, size = len(shape), int(np.prod(shape))
    kinds = ["affine", "negate", "add", "multiply", "maximum", "sin", "permute", "flip", "shrink", "reshape", "sum",
             "max", "cumsum", "softmax", "matmul"]
    if rank >= 2:
        kinds += ["tril", "triu", "masked"]
    if rank == 0:
        kinds = ["affine", "negate", "add", "multiply", "maximum", "sin", "reshape", "matmul"]
    if size <= 64 and rank < 4:
        kinds += ["pad", "expand", "cat"] if rank else ["expand"]
    kind = data.draw(st.sampled_from(kinds), label="step")
    axis = data.draw(st.integers(0, rank - 1), label="axis") if rank else 0
    if kind == "affine":
        scale = data.draw(st.sampled_from([2.0, -0.5, 3.0]))
        return Step(f"x*{scale}+1", lambda t, make: t * scale + 1.0, True)
    if kind == "negate":
        return Step("-x", lambda t, make: -t, True)
    if kind in ("add", "multiply", "maximum"):
        other = _broadcast_other(data, shape, random)
        if kind == "add":
            return Step(f"x+{other.shape}", lambda t, make: t + make(other), True)
        if kind == "multiply":
            return Step(f"x*{other.shape}", lambda t, make: t * make(other), False)
        return Step(f"maximum{other.shape}", lambda t, make: t.maximum(make(other)), False)
    if kind in ("tril", "triu", "masked"):
        diagonal = data.draw(st.integers(-2, 2))
        if kind == "tril":
            return Step(f"tril({diagonal})", lambda t, make: t.tril(diagonal), False)
        if kind == "triu":
            return Step(f"triu({diagonal})", lambda t, make: t.triu(diagonal), False)
        return Step(f"causal({diagonal})", lambda t, make: causal_fill(t, diagonal), False)
    if kind == "sin":
        return Step("sin", lambda t, make: t.sin(), False)
    if kind == "permute":
        order = data.draw(st.permutations(range(rank)))
        return Step(f"permute{order}", lambda t, make: t.permute(*order), True)
    if kind == "flip":
        axes = data.draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank)) if rank else []
        return Step(f"flip{axes}", lambda t, make: t.flip(axes) if axes else t, True)
    if kind == "shrink":
        slices = []
        for axis_size in shape:
            start = data.draw(st.integers(0, axis_size - 1))
            slices.append(slice(start, data.draw(st.integers(start + 1, axis_size))))
        return Step(f"x[{slices}]", lambda t, make: t[tuple(slices)], True)
    if kind == "pad":
        amounts = [data.draw(st.integers(0, 2)) for _ in range(2 * rank)]
        return Step(f"pad{amounts}", lambda t, make: t.pad(amounts, value=0.25), True)
    if kind == "expand":
        copies = data.draw(st.integers(1, 3))
        position = data.draw(st.integers(0, rank))
        new_shape = shape[:position] + (copies,) + shape[position:]
        return Step(f"expand{new_shape}", lambda t, make: t.unsqueeze(position).expand(*new_shape), True)
    if kind == "cat":
        other_shape = shape[:axis] + (data.draw(st.integers(1, 2)),) + shape[axis + 1:]
        other = random.uniform(-1, 1, size=other_shape).astype(np.float32)
        before = data.draw(st.booleans())
        return Step(f"cat{other_shape}@{axis}",
                    lambda t, make: make(other).cat([t], axis) if before else t.cat([make(other)], axis), True)
    if kind == "reshape":
        new_shape = draw_reshape(data, shape)
        return Step(f"reshape{new_shape}", lambda t, make: t.reshape(*new_shape), False)
    if kind in ("sum", "max"):
        keep = data.draw(st.booleans())
        if kind == "sum":
            return Step(f"sum({axis}, {keep})", lambda t, make: t.sum(axis, keepdim=keep), False)
        return Step(f"max({axis}, {keep})", lambda t, make: t.amax(axis, keepdim=keep), False)
    if kind == "cumsum":
        return Step(f"cumsum({axis})", lambda t, make: t.cumsum(axis), False)
    if kind == "softmax":
        return Step(f"softmax({axis})", lambda t, make: t.softmax(axis), False)
    columns = data.draw(st.integers(1, 3))
    weight = random.uniform(-1, 1, size=((shape[-1] if rank else 1), columns)).astype(np.float32)
    if rank == 0:
        return Step("x*w", lambda t, make: t * make(weight[0, 0]), False)
    return Step(f"x@w{weight.shape}", lambda t, make: t @ make(weight), False)


def causal_fill(tensor: Any, diagonal: int) -> Any:
    """-1 where the column is past the row + diagonal (a causal mask from aranges, as attention builds it)."""
    rows, columns = tensor.shape[-2:]
    row = tensor._arange_primitive(rows, em.int64, tensor.device).reshape(rows, 1)
    column = tensor._arange_primitive(columns, em.int64, tensor.device).reshape(1, columns)
    return tensor.masked_fill(column > row + diagonal, -1.0)


def draw_reshape(data: st.DataObject, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A new shape of the same size: adjacent axes merged, an axis split, a size-1 axis added, or any factoring."""
    how = data.draw(st.sampled_from(["merge", "split", "unit", "any"]))
    if how == "merge" and len(shape) >= 2:
        axis = data.draw(st.integers(0, len(shape) - 2))
        return shape[:axis] + (shape[axis] * shape[axis + 1],) + shape[axis + 2:]
    if how == "split":
        splittable = [axis for axis, size in enumerate(shape) if any(size % f == 0 for f in range(2, size))]
        if splittable:
            axis = data.draw(st.sampled_from(splittable))
            factor = data.draw(st.sampled_from([f for f in range(2, shape[axis]) if shape[axis] % f == 0]))
            return shape[:axis] + (factor, shape[axis] // factor) + shape[axis + 1:]
    if how == "unit":
        position = data.draw(st.integers(0, len(shape)))
        return shape[:position] + (1,) + shape[position:]
    remaining, factors = int(np.prod(shape)), []
    while remaining > 1 and len(factors) < 3:
        factor = data.draw(st.sampled_from([f for f in range(2, remaining + 1) if remaining % f == 0]))
        factors.append(factor)
        remaining //= factor
    if remaining > 1:
        factors.append(remaining)
    return tuple(factors)


@dataclass
class Program:
    input: np.ndarray
    steps: list[Step]

    @property
    def exact(self) -> bool:
        return all(step.exact for step in self.steps)

    def run(self, tensor: Any, make: Make) -> Any:
        for step in self.steps:
            tensor = step.apply(tensor, make)
        return tensor


@st.composite
def programs(draw: st.DrawFn, exact_only: bool = False) -> Program:
    data = draw(st.data())
    random = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    tensor = ReferenceTensor(np.zeros(shape, np.float32))
    steps: list[Step] = []
    for _ in range(draw(st.integers(1, 5))):
        step = draw_step(data, tensor.shape, random)
        if exact_only and not step.exact:
            continue
        steps.append(step)
        tensor = step.apply(tensor, ReferenceTensor)
    return Program(random.uniform(-2, 2, size=shape).astype(np.float32), steps)


def edit(data: st.DataObject, array: np.ndarray) -> tuple[Region, np.ndarray]:
    """A random non-empty box of array and a copy with every element inside it changed (by 1 to 2 either way)."""
    ranges = []
    for size in array.shape:
        start = data.draw(st.integers(0, size - 1), label="edit start")
        ranges.append((start, data.draw(st.integers(start + 1, size), label="edit end")))
    region = Region(array.shape, ranges)
    changed = array.copy()
    random = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    box = changed[region.slices()]
    changed[region.slices()] = box + random.choice([-1.0, 1.0], box.shape) * random.uniform(1, 2, box.shape)
    return region, changed


def differences(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Elements whose value changed (NaN staying NaN is no change)."""
    return ~((before == after) | (np.isnan(before) & np.isnan(after)))


def dirty_of(output: Any, source: Any, region: Region) -> tuple[Region, np.ndarray]:
    """The output's propagated dirty region (hull) and the mask of its dirty boxes, checked to be disjoint."""
    boxes = propagate_boxes([output.node], {source.node: region})[output.node]
    mask = boxes_mask(output.shape, boxes)
    assert mask.sum() == sum(box.size for box in boxes), f"overlapping boxes {boxes}"
    hull = propagate([output.node], {source.node: region})[output.node]
    assert hull == bounding_region(mask)
    return hull, mask


def check_program(program: Program, region: Region, changed: np.ndarray, exact: bool) -> None:
    source = em.tensor(program.input)
    output = program.run(source, em.tensor)
    dirty, dirty_mask = dirty_of(output, source, region)
    before = np.asarray(program.run(ReferenceTensor(program.input), ReferenceTensor).array)
    after = np.asarray(program.run(ReferenceTensor(changed), ReferenceTensor).array)
    changed_elements = differences(before, after)
    steps = [step.name for step in program.steps]
    outside = changed_elements & ~dirty_mask
    assert not outside.any(), f"{steps}: elements {np.argwhere(outside).tolist()} changed outside {dirty}"
    if exact:
        assert dirty == bounding_region(changed_elements), f"{steps}: {dirty} is not tight"


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(programs(), st.data())
def test_propagated_regions_are_sound_on_random_graphs(program: Program, data: st.DataObject) -> None:
    region, changed = edit(data, program.input)
    check_program(program, region, changed, exact=False)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(programs(exact_only=True), st.data())
def test_propagated_regions_are_tight_through_elementwise_and_slices(program: Program, data: st.DataObject) -> None:
    region, changed = edit(data, program.input)
    check_program(program, region, changed, exact=True)


# ---- hand-written graphs, evaluated on each device ------------------------------------------------------------------


def device_regions(function: Callable[..., Any], arrays: list[np.ndarray], edited: int, region: Region,
                   device: str) -> tuple[Region, np.ndarray]:
    """(the propagated dirty region of function's output when `region` of input `edited` changes, the elements that
    changed on the device when that region of the input got new values)."""
    random = np.random.default_rng(1)
    changed = [array.copy() for array in arrays]
    box = changed[edited][region.slices()]
    changed[edited][region.slices()] = box + random.uniform(1, 2, box.shape).astype(np.float32)
    inputs = [em.tensor(array, device=device) for array in arrays]
    output = function(*inputs)
    dirty, dirty_mask = dirty_of(output, inputs[edited], region)
    before = output.numpy()
    after = function(*[em.tensor(array, device=device) for array in changed]).numpy()
    changed_elements = differences(before, after)
    outside = changed_elements & ~dirty_mask
    assert not outside.any(), f"elements {np.argwhere(outside).tolist()} changed outside {dirty}"
    return dirty, changed_elements


def random_arrays(*shapes: tuple[int, ...]) -> list[np.ndarray]:
    random = np.random.default_rng(0)
    return [random.uniform(-1, 1, shape).astype(np.float32) for shape in shapes]


def test_appended_row_through_matmul_dirties_its_output_row(device: str) -> None:
    arrays = random_arrays((6, 4), (4, 3))
    dirty, changed = device_regions(lambda x, w: x @ w, arrays, 0, Region.from_index((6, 4), 5), device)
    assert dirty == Region.from_index((6, 3), 5) == bounding_region(changed)
    dirty, _ = device_regions(lambda x, w: (x @ w).relu() @ w.T, arrays, 0, Region.from_index((6, 4), 5), device)
    assert dirty == Region.from_index((6, 4), 5)
    # a changed weight column dirties that output column of every row
    dirty, changed = device_regions(lambda x, w: x @ w, arrays, 1, Region.from_index((4, 3), (slice(None), 2)), device)
    assert dirty == Region.from_index((6, 3), (slice(None), 2)) == bounding_region(changed)


def test_softmax_and_cumsum_over_features_keep_the_appended_row(device: str) -> None:
    (array,) = random_arrays((5, 7))
    for function in (lambda x: x.softmax(-1), lambda x: x.cumsum(-1), lambda x: x.log_softmax(-1),
                     lambda x: x.layer_norm((7,))):
        dirty, changed = device_regions(function, [array], 0, Region.from_index((5, 7), 4), device)
        assert dirty == Region.from_index((5, 7), 4) == bounding_region(changed)


def test_cumsum_along_the_edited_axis_is_sound(device: str) -> None:
    """A scan is a sum over a sliding-window view whose dirty elements lie on a diagonal: the box covering them is
    every window, so the whole output is dirty (sound, not tight; a tighter rule needs more than one box)."""
    (array,) = random_arrays((6, 3))
    dirty, changed = device_regions(lambda x: x.cumsum(0), [array], 0, Region.from_index((6, 3), 3), device)
    assert dirty.contains(bounding_region(changed))
    assert bounding_region(changed) == Region.from_index((6, 3), slice(3, 6))


def test_causal_attention_with_an_appended_token_is_sound(device: str) -> None:
    """Appending a token (the last row of query, key and value changes): the true change is the last output row."""
    arrays = random_arrays((2, 6, 4), (2, 6, 4), (2, 6, 4))
    region = Region.from_index((2, 6, 4), (slice(None), 5))

    def attention(query: Any, key: Any, value: Any) -> Any:
        return query.scaled_dot_product_attention(key, value, is_causal=True)

    for edited in range(3):
        dirty, changed = device_regions(attention, arrays, edited, region, device)
        assert bounding_region(changed) == region
        assert dirty.contains(region)


def test_causal_attention_weights_of_an_appended_token_are_its_row(device: str) -> None:
    """The new key's column of the scores is masked for every old query row: a causal select narrows it away, so
    the softmax weights change only in the new row (the scores' dirty set is two boxes: the new row, the new column)."""
    arrays = random_arrays((2, 6, 4), (2, 6, 4))
    region = Region.from_index((2, 6, 4), (slice(None), 5))

    def weights(query: Any, key: Any) -> Any:
        scores = query @ key.mT * 0.5
        row = query._arange_primitive(6, em.int64, query.device).reshape(6, 1)
        column = query._arange_primitive(6, em.int64, query.device).reshape(1, 6)
        return em.where(row >= column, scores, -np.inf).softmax(-1)

    for edited in range(2):
        dirty, changed = device_regions(weights, arrays, edited, region, device)
        assert dirty == Region.from_index((2, 6, 6), (slice(None), 5)) == bounding_region(changed)


def test_causal_attention_dirties_only_the_appended_row() -> None:
    query = em.tensor(np.zeros((2, 6, 4), np.float32))
    output = query.scaled_dot_product_attention(query, query, is_causal=True)
    region = Region.from_index((2, 6, 4), (slice(None), 5))
    assert propagate([output.node], {query.node: region})[output.node] == region


@settings(max_examples=6, deadline=None, derandomize=True, database=None)
@given(programs(), st.data())
def test_propagated_regions_are_sound_on_devices(program: Program, data: st.DataObject) -> None:
    from tests.conftest import TEST_DEVICES

    region, _ = edit(data, program.input)
    for device in TEST_DEVICES:
        def on_device(x: Any, device: str = device) -> Any:
            return program.run(x, lambda array: em.tensor(array, device=device))

        device_regions(on_device, [program.input], 0, region, device)
