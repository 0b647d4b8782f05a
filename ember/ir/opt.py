"""Device-tuned transforms chosen per kernel: upcasting output tiles (register tiling); EMBER_NOOPT=1 skips them.

The transforms parameterize lowering rather than rewrite IR afterwards: `lower_kernel` is told how many outputs
each work item computes along each output dim, and hash-consing then shares the loads the tile's outputs have in
common (the row of A and the column of B in a matmul)."""

from __future__ import annotations

import os

from ember.backends.base import DeviceInfo
from ember.core.ops import REDUCE_OPS, Op
from ember.ir.ir import KernelIR
from ember.ir.kernel import Kernel
from ember.ir.lower import lower_kernel

MAX_TILE_OUTPUTS = 32  # accumulators per work item; more spill registers on common CPUs


def optimizations_enabled() -> bool:
    return os.environ.get("EMBER_NOOPT", "0") in ("", "0")


def choose_upcast(kernel: Kernel, info: DeviceInfo) -> tuple[int, ...] | None:
    """Tile factors for the output dims of a reduce kernel: the last dim by the vector width, the one before by 4,
    while enough work items remain to keep every compute unit busy."""
    reduces = [step for step in kernel.steps if step.op in REDUCE_OPS]
    if len(reduces) != 1 or not any(step.op is Op.EXPAND for step in kernel.steps):
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


def build_kernel_ir(kernel: Kernel, name: str, info: DeviceInfo) -> KernelIR:
    """Lower a kernel with the transforms that suit the device (none when EMBER_NOOPT=1)."""
    upcast = choose_upcast(kernel, info) if optimizations_enabled() else None
    return lower_kernel(kernel, name, upcast)
