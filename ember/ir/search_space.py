"""The optimization space of a kernel as data: the actions that apply to it on a device, each one step from a lowering
plan (opt.Plan) to a neighbouring plan. The heuristic (opt.choose_plan) picks one point of this space; the kernel
search (ir/search.py) walks it from there."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ember.capabilities import DeviceInfo
from ember.ir.kernel import Kernel, row_loop
from ember.ir.opt import MAX_TILE_OUTPUTS, Plan
from ember.ir.packed_matmul import PackedMatmul, packed_matmul, tile_fits
from ember.ir.wide_products import widened_products

UPCAST_FACTORS = (2, 3, 4, 8)  # outputs per work item along an axis; one that does not divide it pads the last tile
REDUCE_SPLITS = (2, 4, 8)  # accumulators a reduce is split into (every k-th element each)
LOOP_TILES = (2, 4, 8, 16)  # tiles one work item loops over along an axis
MAX_SEARCH_TILE = 2 * MAX_TILE_OUTPUTS  # outputs a searched tile may hold (counting vector lanes once per vector)
# a packed matmul's cache blocks tried: elements of k, rows, columns (ir/packed_matmul.py; those under the matmul's
# size, as a block past it is the whole side), and its micro-kernel tiles: rows x vectors of columns, where they fit
# the device's vector registers
PACKED_BLOCKS = ((128, 256, 384, 512, 768), (48, 96, 168, 336, 672), (512, 1024, 2048, 4080, 8192))
PACKED_TILE_ROWS, PACKED_TILE_VECTORS = (4, 6, 8, 12), (1, 2, 4)


@dataclass(frozen=True)
class Action:
    """One step in the space: `kind` is one of ACTION_KINDS, `axis` the output axis it acts on (or -1), `amount` its
    size (a factor, a lane count, a vector width, the other axis of a swap)."""

    kind: str
    axis: int = -1
    amount: int = 0

    def __str__(self) -> str:
        return f"{self.kind}({self.axis},{self.amount})" if self.axis >= 0 else f"{self.kind}({self.amount})"


ACTION_KINDS = {
    "upcast": "compute `amount` outputs per work item along `axis` (tile it; a factor that does not divide the axis "
              "pads it to a multiple, the last tile clamped)",
    "vectorize": "pack the tile into vectors of `amount` float32 lanes (0: no vectors)",
    "split_reduce": "reduce with `amount` accumulators, each taking every amount-th element (the reduce loop unrolled "
                    "by `amount`, packed into a vector where the device has one)",
    "permute": "swap output axes `axis` and `amount` in the order work items walk the output",
    "loop": "let each work item loop over `amount` consecutive tiles along `axis`",
    "stage": "copy what a work item's looped tiles all read into a scratch array first (1: on, 0: off)",
    "untile": "no tiling: one output per work item, scalar code (the plain lowering)",
    "pack": "a plain float32 matmul as packed panels and a register-tiled micro-kernel (ir/packed_matmul.py), on a "
            "device whose renderer has them (DeviceInfo.packed_matmul)",
    "pack_block": "a packed matmul's cache block `axis` (0: over k, 1: rows, 2: columns) of `amount` elements",
    "pack_tile": "a packed matmul's micro-kernel of `axis` rows x `amount` vectors of columns",
}


def actions(kernel: Kernel, info: DeviceInfo) -> list[Action]:
    """Every action that may apply to `kernel` on a device with capabilities `info` (the one description of the
    optimization space: the search applies each to each plan of its beam, and drops what does not lower)."""
    shape = kernel.output.shape
    axes = [axis for axis, size in enumerate(shape) if size > 1]
    found: list[Action] = [Action("untile")]
    if not shape or not info.can_run:
        return found
    packed = packed_matmul(widened_products(kernel, info), info) if info.packed_matmul and kernel.has_reduce else None
    if packed is not None:
        found += [Action("pack"), *_packed_actions(packed, info)]
    whole_rows = row_loop(kernel) is not None
    for axis in axes:
        found += [Action("upcast", axis, factor) for factor in UPCAST_FACTORS if factor <= shape[axis]]
    widths = sorted({info.preferred_vector_width} if info.vector_ops else set()) + sorted(
        width for width, _ in info.fallback_vector_widths)
    found += [Action("vectorize", amount=width) for width in [0, *widths] if width != 1]
    if kernel.has_reduce:
        found += [Action("split_reduce", amount=lanes) for lanes in (1, *REDUCE_SPLITS)]
    if not whole_rows:  # (a kernel fused by rows walks its rows in one fixed order)
        found += [Action("permute", first, second) for index, first in enumerate(axes) for second in axes[index + 1:]]
        for axis in axes[-2:]:
            found += [Action("loop", axis, tiles) for tiles in LOOP_TILES if tiles < shape[axis]]
        found += [Action("stage", amount=1), Action("stage", amount=0)]
    return found


def _packed_actions(packed: PackedMatmul, info: DeviceInfo) -> list[Action]:
    """The blocks and tiles a packed matmul may take other than its defaults (PACKED_BLOCKS, PACKED_TILE_ROWS and
    PACKED_TILE_VECTORS)."""
    sides = (packed.depth, packed.rows, packed.columns)
    defaults = (packed.depth_block, packed.row_block, packed.column_block)
    found = [Action("pack_block", axis, size) for axis, sizes in enumerate(PACKED_BLOCKS) for size in sizes
             if size < sides[axis] and size != defaults[axis]]
    return found + [Action("pack_tile", rows, vectors) for rows in PACKED_TILE_ROWS for vectors in PACKED_TILE_VECTORS
                    if (rows, vectors) != (packed.micro_rows, packed.micro_vectors) and tile_fits(info, rows, vectors)]


def apply(plan: Plan, action: Action, kernel: Kernel) -> Plan | None:
    """The plan one action away from `plan`, or None where the action changes nothing or makes no sense there (the
    lowering may still refuse the result: opt.lower_plan). Every action but `pack` leaves a packed plan for a tiled
    one."""
    rank = len(kernel.output.shape)
    if action.kind == "pack":
        return None if plan.packed else Plan(packed=True)
    if action.kind in ("pack_block", "pack_tile"):
        if not plan.packed:
            return None
        if action.kind == "pack_tile":
            result = replace(plan, packed_tile=(action.axis, action.amount))
        else:
            blocks = list(plan.packed_blocks or (0, 0, 0))  # (0: the default, which may follow the tile)
            blocks[action.axis] = action.amount
            result = replace(plan, packed_blocks=(blocks[0], blocks[1], blocks[2]))
        return None if result == plan else result
    original, plan = plan, replace(plan, packed=False, packed_blocks=None, packed_tile=None)
    upcast = list(plan.upcast or (1,) * rank)
    if action.kind == "untile":
        result = Plan(vector_width=0)
    elif action.kind == "upcast":
        upcast[action.axis] = action.amount
        outputs = 1
        for factor in upcast:
            outputs *= factor
        if outputs // max(1, plan.vector_width) > MAX_SEARCH_TILE:
            return None
        result = replace(plan, upcast=tuple(upcast) if outputs > 1 else None)
    elif action.kind == "vectorize":
        result = replace(plan, vector_width=action.amount)
    elif action.kind == "split_reduce":
        result = replace(plan, reduce_lanes=action.amount)
    elif action.kind == "permute":
        order = list(plan.order or range(rank))
        first, second = order.index(action.axis), order.index(action.amount)
        order[first], order[second] = order[second], order[first]
        result = replace(plan, order=None if order == list(range(rank)) else tuple(order))
    elif action.kind == "loop":
        result = replace(plan, loop=(action.axis, action.amount))
    elif action.kind == "stage":
        if plan.loop is None:
            return None
        result = replace(plan, stage=bool(action.amount))
    else:
        raise ValueError(f"unknown search action {action.kind!r}; the kinds are {', '.join(ACTION_KINDS)}")
    return None if result == original else result


def plan_to_data(plan: Plan) -> dict:
    """A plan as JSON-ready data (the disk cache of search winners stores this)."""
    return {"upcast": list(plan.upcast) if plan.upcast else None, "order": list(plan.order) if plan.order else None,
            "reduce_lanes": plan.reduce_lanes, "loop": list(plan.loop) if plan.loop else None, "stage": plan.stage,
            "vector_width": plan.vector_width, "packed": plan.packed,
            "packed_blocks": list(plan.packed_blocks) if plan.packed_blocks else None,
            "packed_tile": list(plan.packed_tile) if plan.packed_tile else None}


def plan_from_data(data: object, kernel: Kernel) -> Plan:
    """The plan `plan_to_data` wrote; a ValueError naming what is wrong where the data is not a plan of `kernel`."""
    rank = len(kernel.output.shape)

    def axes(value: object, what: str) -> tuple[int, ...] | None:
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != rank or not all(
                isinstance(item, int) and item >= (0 if what == "order" else 1) for item in value):
            raise ValueError(f"{what} {value!r} is not {rank} positive whole numbers (the kernel's output rank)")
        return tuple(value)

    fields = set(plan_to_data(Plan()))
    if isinstance(data, dict) and set(data) == fields - {"packed_blocks", "packed_tile"}:
        data = {**data, "packed_blocks": None, "packed_tile": None}  # (an entry from before packed plans had them)
    if not isinstance(data, dict) or set(data) != fields:
        raise ValueError(f"{data!r} does not have the fields of a plan")
    order = axes(data["order"], "order")
    if order is not None and sorted(order) != list(range(rank)):
        raise ValueError(f"order {order!r} is not a permutation of the output's {rank} axes")
    loop = data["loop"]
    if loop is not None and (not isinstance(loop, list) or len(loop) != 2 or not 0 <= loop[0] < rank
                             or not isinstance(loop[1], int) or loop[1] < 1):
        raise ValueError(f"loop {loop!r} is not [axis, tiles] of the output's {rank} axes")
    lanes, width = data["reduce_lanes"], data["vector_width"]
    if not isinstance(lanes, int) or lanes < 1 or not isinstance(width, int) or width < 0:
        raise ValueError(f"reduce lanes {lanes!r} or vector width {width!r} is not a whole number")
    blocks, tile = data["packed_blocks"], data["packed_tile"]
    for value, length, least, what in ((blocks, 3, 0, "packed blocks"), (tile, 2, 1, "packed tile")):
        if value is not None and (not data["packed"] or not isinstance(value, list) or len(value) != length
                                  or not all(isinstance(item, int) and item >= least for item in value)):
            raise ValueError(f"{what} {value!r} are not {length} whole numbers of {least} or more of a packed plan")
    return Plan(axes(data["upcast"], "upcast"), order, lanes, None if loop is None else (loop[0], loop[1]),
                bool(data["stage"]), width, packed=bool(data["packed"]),
                packed_blocks=None if blocks is None else (blocks[0], blocks[1], blocks[2]),
                packed_tile=None if tile is None else (tile[0], tile[1]))
