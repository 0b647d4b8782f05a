"""Device-tuned transforms chosen per kernel: output tiles (register tiling), the order of work items, and
vectorization; EMBER_NOOPT=1 skips them all.

Tiling parameterizes lowering rather than rewriting IR afterwards: `lower_kernel` is told how many outputs each work
item computes along each output dim, and hash-consing then shares the loads the tile's outputs have in common (the
row of A and the column of B in a matmul). On devices with vector types (DeviceInfo.vector_ops) the tile's last
dim is a whole number of vectors, vectorize.py packs it, and work items walk down the rows first, so consecutive
work items of a thread reuse the same columns of B from cache."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ember.capabilities import DeviceInfo
from ember.core.ops import REDUCE_OPS, Op
from ember.ir import lowered_cache
from ember.ir.ir import IROp, KernelIR
from ember.ir.kernel import Kernel, row_loop
from ember.ir.linearize import Step, linearize
from ember.ir.lower import compute_dtype, lower_kernel
from ember.ir.stage import stage_loads
from ember.ir.vectorize import gathers, lanes_for, vectorize

MAX_TILE_OUTPUTS = 32  # accumulators per work item; more spill registers on common CPUs
MAX_TILE_VECTORS = 12  # vector accumulators per work item: 12 of 16 AVX2 registers, the rest hold the operands
MINIMUM_STAGED_TILES = 4  # tiles a work item loops over before staging the panel they share pays for its copy
MAX_STAGED_BYTES = 256 * 1024  # scratch per work item (on the stack of the C thread running it), within L2
MAX_LOWERED_STEPS = 6_000  # kernel steps x lanes per tile a plan may lower: each lane is lowered (in Python)
# separately, so a long fused expression tiled wide takes seconds to lower; such a kernel is compute-bound anyway
WORK_TOLERANCE = 0.05  # tile plans within this much of the least work count as equal (the earlier one wins)


def optimizations_enabled() -> bool:
    return os.environ.get("EMBER_NOOPT", "0") in ("", "0")


def choose_upcast(kernel: Kernel, info: DeviceInfo) -> tuple[int, ...] | None:
    """Tile factors for the output dims of a reduce kernel: the last dim by the vector width, the one before by 4,
    while enough work items remain to keep every compute unit busy."""
    reduces = [step for step in kernel.steps if step.op in REDUCE_OPS]
    if len(reduces) != 1 or not any(step.op is Op.EXPAND for step in kernel.steps) or row_loop(kernel):
        return None  # tiles pay off where outputs share loads: one reduce over broadcast inputs (a matmul)
    reduce_input = kernel.steps[reduces[0].srcs[0]].shape
    if _product([reduce_input[axis] for axis in reduces[0].arg]) < 8:
        return None
    shape = kernel.output.shape
    if not shape:
        return None
    factors = [1] * len(shape)
    remaining_items = 1
    for size in shape:
        remaining_items *= size
    minimum_items = 4 * max(1, info.compute_units)
    candidates = [(len(shape) - 1, max(2, info.preferred_vector_width))]
    if len(shape) >= 2:
        candidates.append((len(shape) - 2, 4))
    for axis, wanted in candidates:
        factor = wanted
        while factor > 1 and (shape[axis] % factor != 0 or remaining_items // factor < minimum_items
                              or factor * _product(factors) > MAX_TILE_OUTPUTS):
            factor //= 2
        factors[axis] = factor
        remaining_items //= factor
    return tuple(factors) if any(factor > 1 for factor in factors) else None


def _product(values: list[int]) -> int:
    result = 1
    for value in values:
        result *= value
    return result


def choose_vector_tile(kernel: Kernel, info: DeviceInfo) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(factors, work item order) of a vector tile for a matmul-like kernel: the last output dim of size > 1 by
    two vectors (or one), the one before by as many rows as the accumulators allow (any number: the last tile is
    clamped), work items along the rows fastest. None where the last dim is not a whole number of vectors."""
    if not _shares_loads(kernel):
        return None
    shape = kernel.output.shape
    lanes = lanes_for(kernel.output.dtype, 4 * info.preferred_vector_width)
    axes = [axis for axis, size in enumerate(shape) if size > 1]
    if len(axes) < 2 or lanes <= 1 or shape[axes[-1]] % lanes != 0:
        return None
    row_axis, column_axis = axes[-2:]
    vectors = 2 if shape[column_axis] % (2 * lanes) == 0 else 1
    rows = min(MAX_TILE_VECTORS // vectors, shape[row_axis])
    items = _product(list(shape)) // (vectors * lanes)
    minimum_items = 4 * max(1, info.compute_units)
    while rows > 1 and -(-items // rows) < minimum_items:
        rows -= 1
    factors = tuple(rows if axis == row_axis else vectors * lanes if axis == column_axis else 1
                    for axis in range(len(shape)))
    order = tuple(column_axis if axis == row_axis else row_axis if axis == column_axis else axis
                  for axis in range(len(shape)))
    return factors, order


def _shares_loads(kernel: Kernel) -> bool:
    """One reduce over broadcast inputs (a matmul): the outputs of a tile share loads."""
    reduces = [step for step in kernel.steps if step.op in REDUCE_OPS]
    if len(reduces) != 1 or not any(step.op is Op.EXPAND for step in kernel.steps):
        return False
    reduce_input = kernel.steps[reduces[0].srcs[0]].shape
    return _product([reduce_input[axis] for axis in reduces[0].arg]) >= 8


@dataclass(frozen=True)
class Plan:
    """How to lower a kernel: outputs per work item along each dim, the work item order, the reduce split."""

    upcast: tuple[int, ...] | None = None
    order: tuple[int, ...] | None = None
    reduce_lanes: int = 1
    loop: tuple[int, int] | None = None  # (dim, tiles): a work item loops over this many tiles along dim
    stage: bool = False  # copy what the loop's tiles all read into a scratch array first (ir/stage.py)


def vector_plans(kernel: Kernel, info: DeviceInfo) -> list[Plan]:
    """The vector plans worth trying for a kernel, best first: vectors along the output's last dim (a matmul's
    6x16 tile), then vectors along the reduced axis (a row reduction, a matmul whose B is transposed)."""
    vector_bytes = 4 * info.preferred_vector_width
    shape = kernel.output.shape
    if not shape:
        return []
    minimum_items = 4 * max(1, info.compute_units)
    output_lanes = lanes_for(kernel.output.dtype, vector_bytes)
    reduces = [step for step in kernel.steps if step.op in REDUCE_OPS]
    reduce_dtypes = {compute_dtype(step.dtype) for step in reduces}
    if row_loop(kernel):  # whole rows per work item: vectors along the row, in the loop and in the row's reduces
        reduce_lanes = lanes_for(reduce_dtypes.pop(), vector_bytes) if len(reduce_dtypes) == 1 else 1
        vectors = output_lanes > 1 and shape[-1] % output_lanes == 0
        return [Plan((1,) * (len(shape) - 1) + (output_lanes,) if vectors else None, reduce_lanes=reduce_lanes)]
    plans = []
    if _shares_loads(kernel):
        tile = choose_vector_tile(kernel, info)
        if tile is not None:
            factors, order = tile
            tiles = _product([-(-size // factor) for size, factor in zip(shape, factors)])
            # a work item loops down the rows of its column panel (B's panel staged), or along the columns of its
            # rows (A's rows staged: pays where A is computed, e.g. a gradient through an activation)
            for loop_axis in [axis for axis, size in enumerate(shape) if size > 1][-2:]:
                along = -(-shape[loop_axis] // factors[loop_axis])
                loop_tiles = -(-along // max(1, -(-minimum_items // (tiles // along))))
                if loop_tiles >= MINIMUM_STAGED_TILES:
                    plans.append(Plan(factors, order, loop=(loop_axis, loop_tiles), stage=True))
            plans.append(Plan(factors, order))
    elif output_lanes > 1 and shape[-1] % output_lanes == 0:
        plans.append(Plan((1,) * (len(shape) - 1) + (output_lanes,)))
    if len(reduce_dtypes) == 1:
        reduce_lanes = lanes_for(reduce_dtypes.pop(), vector_bytes)
        # the last two output dims of size > 1: rows x columns of outputs (columns only where tiles share loads)
        axes = [axis for axis, size in enumerate(shape) if size > 1][-2 if _shares_loads(kernel) else -1:]
        reduce_factors = [1] * len(shape)
        items = _product(list(shape))
        for axis, wanted in zip(axes, (4, 3) if len(axes) == 2 else (4,)):
            factor = min(wanted, shape[axis])
            while factor > 1 and -(-items // factor) < minimum_items:
                factor -= 1
            reduce_factors[axis] = factor
            items = -(-items // factor)
        if reduce_lanes > 1:
            plans.append(Plan(tuple(reduce_factors), reduce_lanes=reduce_lanes))
    return plans


def _affordable(kernel: Kernel, upcast: tuple[int, ...] | None, reduce_lanes: int = 1) -> bool:
    """Whether lowering a kernel with this tile stays within MAX_LOWERED_STEPS."""
    return len(kernel.steps) * _product(list(upcast or ())) * reduce_lanes <= MAX_LOWERED_STEPS


def build_kernel_ir(kernel: Kernel, name: str, info: DeviceInfo) -> KernelIR:
    """Lower a kernel with the transforms that suit the device (none when EMBER_NOOPT=1), from the disk cache of
    lowered kernels when an earlier process lowered it already. (The scheduler passes narrower capabilities, from
    `narrower_capabilities`, for a kernel the device failed to build.)"""
    optimize = optimizations_enabled()
    path = lowered_cache.entry_path(kernel, name, info, optimize)
    cached = lowered_cache.load(path, kernel, name)
    if cached is not None:
        return cached
    lowered = _choose_lowering(kernel, name, info) if optimize else lower_kernel(kernel, name)
    lowered_cache.store(path, lowered)
    return lowered


def _choose_lowering(kernel: Kernel, name: str, info: DeviceInfo) -> KernelIR:
    """The first vector plan whose vectors need no gathering (tile plans compared by estimated work), at the
    preferred vector width or, for a kernel needing an op only a narrower width has, at that width; else scalar
    tiles; untiled where tiling would take too long to lower."""
    for capabilities in _vector_widths_for(kernel, info):
        vectorized = _vector_lowering(kernel, name, capabilities)
        if vectorized is not None:
            return vectorized
    upcast = choose_upcast(kernel, info)
    return lower_kernel(kernel, name, upcast if _affordable(kernel, upcast) else None)


def _vector_widths_for(kernel: Kernel, info: DeviceInfo) -> list[DeviceInfo]:
    """The capabilities to try vector plans with: the preferred width, then each fallback width that has an op the
    kernel uses and the wider ones lack, or the preferred width's ops (DeviceInfo.fallback_vector_widths)."""
    choices = [info] if info.vector_ops else []
    used = {step.op for step in kernel.steps} | {IROp.LOAD} | (
        {IROp.REDUCE} if any(step.op in REDUCE_OPS for step in kernel.steps) else set())
    covered = set(info.vector_ops)
    for width, ops in info.fallback_vector_widths:
        # a narrower width with the same ops still fits dims the wider vectors do not divide (24 columns in 16s)
        if (ops - covered) & used or ops == info.vector_ops:
            choices.append(replace(info, preferred_vector_width=width, vector_ops=ops, fallback_vector_widths=()))
        covered |= ops
    return choices


def narrower_capabilities(info: DeviceInfo, width: int) -> list[DeviceInfo]:
    """What to lower a kernel with after the device failed to build or launch it with vectors of `width` float32
    lanes: each narrower fallback width, then no vectors (scalar tiles)."""
    choices = [replace(info, preferred_vector_width=narrower, vector_ops=ops, fallback_vector_widths=())
               for narrower, ops in info.fallback_vector_widths if narrower < width]
    if width > 1:
        choices.append(replace(info, vector_ops=frozenset(), fallback_vector_widths=()))
    return choices


def _vector_lowering(kernel: Kernel, name: str, info: DeviceInfo) -> KernelIR | None:
    """The kernel lowered by the first vector plan that packs vectors without gathering them, or None."""
    # tile plans (upcast, no reduce split) are compared by their estimated work, the others taken in order
    tiles: list[tuple[float, KernelIR]] = []
    for plan in vector_plans(kernel, info):
        if tiles and plan.reduce_lanes > 1:
            break
        if not _affordable(kernel, plan.upcast, plan.reduce_lanes):
            continue
        lowered = lower_kernel(kernel, name, plan.upcast, plan.order, plan.reduce_lanes, plan.loop)
        vectorized = vectorize(lowered, 4 * info.preferred_vector_width, info.vector_ops)
        if vectorized is lowered:
            continue
        if plan.stage:
            vectorized = stage_loads(vectorized, MAX_STAGED_BYTES)
        if gathers(vectorized):
            continue
        if plan.reduce_lanes > 1 or plan.upcast is None:
            return vectorized
        tiles.append((estimated_work(vectorized), vectorized))
    if tiles:
        least = min(work for work, _ in tiles)
        return next(ir for work, ir in tiles if work <= least * (1 + WORK_TOLERANCE))
    return None


def estimated_work(kernel: KernelIR) -> float:
    """Instructions a kernel executes: each rendered instruction times the trip counts of the loops around it."""
    trips, work = [kernel.global_size], 0.0
    for instruction in linearize(kernel.sink):
        if instruction.kind is Step.LOOP:
            trips.append(trips[-1] * instruction.node.arg[1])
        elif instruction.kind is Step.END_LOOP:
            trips.pop()
        elif instruction.kind in (Step.VALUE, Step.STORE, Step.UPDATE_ACC):
            work += trips[-1]
    return work
