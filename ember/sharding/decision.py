"""Whether a large kernel output is split across the process's devices, along which axis and in what shares.

Two rules, tried in order for an output of MINIMUM_ELEMENTS or more when more than one device runs kernels:
- memory: the output and the inputs that must arrive on its device do not fit that device's pool (its limit minus
  what is in use): the output is split across the devices whose pools have room, each share bounded by its pool;
- time: the estimated time split (the devices' shares at once, as far as they run at once, plus the copies) is at
  most CLEAR_GAIN of the time on one device, from the measured speeds and transfer rates (calibration.py).
Shares follow each device's time per row (its speed, and the bytes it must receive and send back); the axis is the
output's first (rows) or last (columns), whichever the estimate favours (fewer bytes to copy in a tie).
Devices on the host's CPU cores (DeviceInfo.host_cores) never share an output on such a device: the same cores.
EMBER_AUTO_SHARD=0 turns both off, =1 splits every large output evenly by rows across every device (no rule)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from ember.core.dtype import DType
from ember.core.errors import OutOfMemoryError
from ember.core.graph import Node
from ember.core.graph_templates import expand_in_place
from ember.core.ops import REDUCE_OPS, Op
from ember.core.shapes import prod
from ember.core.walk import post_order
from ember.scheduler import profile
from ember.scheduler.devices import get_device
from ember.scheduler.placement import FREE_SOURCES
from ember.sharding.calibration import HOST, Calibration, calibration, current
from ember.sharding.slicing import SlicedGraph, box

MINIMUM_ELEMENTS = 1 << 20  # outputs smaller than this are never considered (the per-op path stays a comparison)
MINIMUM_INTENSITY = 16  # multiply-adds per output element below which splitting cannot pay by time: sending a part
# back costs about what computing it does
MINIMUM_WORK = 1 << 26  # multiply-adds below which splitting cannot pay by time (launches, compiles of each share)
CLEAR_GAIN = 0.75  # the time rule splits only when the estimate is at most this fraction of one device's time
MEMORY_MARGIN = 1 / 16  # of a pool's free bytes kept free by a split (allocations the estimate does not see)
DEVICE_OVERHEAD_SECONDS = 5e-4  # each further device's launches and copies, beyond their bytes
MAXIMUM_SUBSET_DEVICES = 6  # with more devices, only the fastest first few are tried as subsets


class Refusal:
    """Why the time rule last kept an output on its device (EMBER_DEBUG=1 prints it; `ember info --calibrate`)."""

    last = ""


def _refuse(message: str) -> None:
    Refusal.last = message
    profile.debug_print(1, f"auto-shard: {message}")


class ShardingMemoryError(OutOfMemoryError):
    """An output that fits no device's pool, whole or split; the message names the sizes and the pools."""


@dataclass
class Decision:
    """A split: `lengths[i]` elements along `axis` of the output are computed on `devices[i]` (in launch order)."""

    axis: int
    devices: list[str]
    lengths: list[int]
    reason: str
    estimate: str = ""
    shape: tuple[int, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        axis = "rows" if self.axis == 0 else "columns" if self.axis == len(self.shape) - 1 else f"axis {self.axis}"
        shares = ", ".join(f"{device} {length}" for device, length in zip(self.devices, self.lengths))
        return f"{self.shape} split by {axis} ({shares}): {self.reason}" + (f"; {self.estimate}" if self.estimate
                                                                             else "")


@dataclass
class _Axis:
    """One axis' cost model: each leaf whose box arrives on a device that does not hold it (an upload of host data,
    a copy from another device) with its bytes for a share of `length` rows, fixed + unit * length; and the output's
    bytes per row; and the multiply-adds of a share, fixed + unit * length (fixed: work each share repeats whole, as
    a softmax over a row that a split by columns needs entire, unit: the work of a row of the split)."""

    axis: int
    size: int
    leaves: list[tuple[Node, float, float]]
    output_unit: float
    work_fixed: float = 0.0
    work_unit: float = 0.0

    def work(self, length: int) -> float:
        """Multiply-adds a device computes for a share of `length` rows (its box, and what the crop cannot reach)."""
        return self.work_fixed + self.work_unit * length if length > 0 else 0.0

    def arriving(self, device: str, length: int) -> float:
        """Bytes arriving on device for a share of `length` rows (inputs it holds already arrive free)."""
        if length <= 0:
            return 0.0
        return sum(fixed + unit * length for leaf, fixed, unit in self.leaves if not _resident(leaf, device))

    def arriving_seconds(self, device: str, length: int, table: Calibration) -> float:
        """Seconds of those copies, each at the rate from where its leaf lives (the host for host data)."""
        if length <= 0:
            return 0.0
        seconds = 0.0
        for leaf, fixed, unit in self.leaves:
            if not _resident(leaf, device):
                source = HOST if leaf.buffer is None else cast(str, leaf.device)
                seconds += (fixed + unit * length) / table.transfer_rate(source, device)
        return seconds


def _resident(leaf: Node, device: str) -> bool:
    return leaf.device == device and leaf.buffer is not None


def sharing_devices(home: str, devices: list[str], used_dtypes: set[DType]) -> list[str]:
    """The rules' candidates for a split of home's work among `devices`: home and the others that run `used_dtypes`
    and are not on home's cores where home's are the host's (a second device on the same CPU cores only takes them
    from the first); none where home is not among `devices`."""
    if home not in devices:
        return []
    host = get_device(home).info.host_cores
    return [device for device in devices if device == home or (
        not get_device(device).info.unsupported(used_dtypes) and not (host and get_device(device).info.host_cores))]


def decide(root: Node, forced: bool | None, devices: list[str] | Callable[[], list[str]]) -> Decision | None:
    """The split of root's value across `devices` (root placed already; a callable giving them is called only when
    the rules need them: a process with one backend in use probes no other for cheap work), or None to compute it
    where it is. forced: True splits evenly by rows (EMBER_AUTO_SHARD=1), None applies the rules."""
    if root.op in (Op.COPY, Op.BUFFER) or not root.shape or prod(root.shape) < MINIMUM_ELEMENTS:
        return None
    home = cast(str, root.device)
    if forced:
        devices = devices() if callable(devices) else devices
        if len(devices) < 2 or home not in devices or root.shape[0] < len(devices):
            return None
        expand_in_place([root])  # (the split slices primitive ops: templates' copies are expanded first)
        base, extra = divmod(root.shape[0], len(devices))
        return Decision(0, list(devices), [base + (1 if index < extra else 0) for index in range(len(devices))],
                        "EMBER_AUTO_SHARD=1", shape=root.shape)
    home_device = get_device(home)
    if not home_device.info.can_run:
        return None
    size = root.size
    home_free = home_device.pool.free_bytes
    if home_free is None and root.op not in REDUCE_OPS and root.op is not Op.TEMPLATE:
        for source in root.srcs:
            if not source.realized:
                break
        else:  # one elementwise or movement op on stored tensors (the per-op path): cheap, no walk
            return None
    # the graph as it is: a template copy's leaves are its sources, its work and dtypes its template's (expanded
    # only where a split is worked out: its axes are its primitives')
    for source in root.srcs:
        if source.srcs:
            graph_nodes = post_order([root], lambda node: () if node.realized else node.srcs)
            break
    else:  # one op over leaves (stored tensors, constants: a softmax realized each time): its graph without a walk
        graph_nodes = [*{id(source): source for source in root.srcs}.values(), root]
    work, used_dtypes = _work_and_dtypes(graph_nodes)
    work += size
    cheap = work < MINIMUM_WORK or work < MINIMUM_INTENSITY * size
    output_bytes = size * root.dtype.itemsize
    # (a pool without a limit never runs out here; nor does one with room for every leaf and the output: the
    # per-axis models, which slice the graph, are built only where the memory rule may apply)
    tight = home_free is not None and _most_arriving(graph_nodes, home) + output_bytes > home_free
    if cheap and not tight:  # neither rule can apply
        return None
    devices = sharing_devices(home, devices() if callable(devices) else devices, used_dtypes)
    if len(devices) < 2:
        return None
    axes: list[_Axis] | None = None
    if tight:
        axes = _axis_models(_expanded_root(root, graph_nodes))
        whole_need = axes[0].arriving(home, axes[0].size) + output_bytes if axes else 0.0
        if axes and whole_need > cast(int, home_free):
            free = {device: get_device(device).pool.free_bytes for device in devices}
            return _memory_split(root, axes, devices, free, output_bytes, whole_need)
    if cheap:
        return None
    try:
        table = calibration(devices)
    except OutOfMemoryError:  # no room to measure: no split by time
        return None
    # the best any split could do: the work spread by speed over devices running at once, as far as they do (a
    # fraction of the time on home that the work does not change: decided before the graph is sliced)
    speeds = [table.speed(device) for device in devices]
    best_case = table.overlap * work / sum(speeds) + (1 - table.overlap) * work / max(speeds)
    if best_case > CLEAR_GAIN * work / table.speed(home):
        _refuse(f"{root.shape} stays on {home}: even without copies a split would take "
                f"{best_case / (work / table.speed(home)):.2f} of the time there (devices run at once: "
                f"{table.overlap:.2f})")
        return None
    axes = _axis_models(_expanded_root(root, graph_nodes)) if axes is None else axes
    free = {device: get_device(device).pool.free_bytes for device in devices}
    return _time_split(root, axes, devices, free, output_bytes, table) if axes else None


def _work_and_dtypes(graph_nodes: list[Node]) -> tuple[int, set[DType]]:
    """The elements the graph's reduces read (a template copy's from its template, each copy once however many of
    its results the graph holds) and the dtypes it computes in."""
    work = 0
    used_dtypes = set()
    copies = set()
    for node in graph_nodes:
        used_dtypes.add(node.dtype)
        if node.op in REDUCE_OPS:
            work += prod(node.srcs[0].shape)
        elif node.op is Op.TEMPLATE:
            template = node.arg.template
            copy = (id(template), *map(id, node.srcs))
            if copy in copies:
                continue
            copies.add(copy)
            fixed, read_inputs, template_dtypes = template.work()
            work += fixed + sum(prod(node.srcs[position].shape) for position in read_inputs)
            used_dtypes |= template_dtypes
    return work, used_dtypes


def _expanded_root(root: Node, graph_nodes: list[Node]) -> Node:
    """Root with the template copies of its graph expanded in place (a split slices primitive ops)."""
    if any(node.op is Op.TEMPLATE for node in graph_nodes):
        expand_in_place([root])
    return root


def _most_arriving(graph_nodes: list[Node], home: str) -> int:
    """The bytes of every leaf of the graph not stored on `home` (what computing it there could copy in at most;
    constants are made there)."""
    return sum(node.size * node.dtype.itemsize for node in graph_nodes
               if (node.realized or not node.srcs) and node.op not in FREE_SOURCES and not _resident(node, home))


def _axis_models(root: Node) -> list[_Axis]:
    """The cost models of the axes a split may take: the first and the last, where at least 2 long."""
    return [_axis_model(root, axis) for axis in sorted({0, len(root.shape) - 1}) if root.shape[axis] >= 2]


def _axis_model(root: Node, axis: int) -> _Axis:
    """The bytes each leaf sends for a box of one row and of the whole axis, as a line in the box's length."""
    size = root.shape[axis]
    by_leaf: dict[int, tuple[Node, list[int]]] = {}
    works = [0, 0]
    for position, length in enumerate((size, 1)):
        bounds = tuple((0, length) if index == axis else (0, extent) for index, extent in enumerate(root.shape))
        # on a device no leaf lives on, every leaf's box counts as arriving
        graph = SlicedGraph("(estimate)", estimate_only=True)
        works[position] = _work(box(root, bounds, graph))
        for leaf, nbytes in graph.arriving:
            by_leaf.setdefault(id(leaf), (leaf, [0, 0]))[1][position] += nbytes
    leaves = []
    for leaf, (full, one) in by_leaf.values():
        unit = (full - one) / (size - 1) if size > 1 else 0.0
        leaves.append((leaf, one - unit, unit))
    work_unit = (works[0] - works[1]) / (size - 1) if size > 1 else 0.0
    return _Axis(axis, size, leaves, root.size * root.dtype.itemsize / size, max(0.0, works[1] - work_unit), work_unit)


def _work(root: Node) -> int:
    """Multiply-adds of computing root's graph: each reduce's input elements, and the output's."""
    return _work_and_dtypes(post_order([root], lambda node: () if node.realized else node.srcs))[0] + root.size


def _lengths(size: int, devices: list[str], weights: dict[str, float], caps: dict[str, int]) -> list[int] | None:
    """`size` rows in shares proportional to weights, none above its cap (the rest going to the others), or None
    when the caps hold fewer than size rows."""
    lengths = {device: 0 for device in devices}
    open_devices = list(devices)
    remaining = size
    while remaining > 0 and open_devices:
        total = sum(weights[device] for device in open_devices)
        wanted = {device: remaining * weights[device] / total for device in open_devices}
        full = [device for device in open_devices if wanted[device] >= caps[device] - lengths[device]]
        if full:
            for device in full:
                remaining -= caps[device] - lengths[device]
                lengths[device] = caps[device]
                open_devices.remove(device)
            continue
        given = {device: int(wanted[device]) for device in open_devices}
        for device in open_devices:
            lengths[device] += given[device]
        remaining -= sum(given.values())
        for device in sorted(open_devices, key=lambda name: -weights[name]):  # the rounding's rest: fastest first
            if remaining and lengths[device] < caps[device]:
                lengths[device] += 1
                remaining -= 1
        if remaining:
            open_devices = [device for device in open_devices if lengths[device] < caps[device]]
    return None if remaining > 0 else [lengths[device] for device in devices]


def _need(model: _Axis, device: str, length: int, home: str, output_bytes: int) -> float:
    """Bytes a share of `length` rows adds to device's pool: the boxes of its inputs and its part; on the home
    device, the boxes of its inputs, the joined output and every part (its own and those arriving)."""
    if device == home:
        return model.arriving(device, length) + 2 * output_bytes
    return model.arriving(device, length) + model.output_unit * length


def _caps(model: _Axis, devices: list[str], home: str, free: dict[str, int | None], output_bytes: int
          ) -> dict[str, int]:
    """The most rows each device's pool holds (the bytes grow with the length)."""
    caps = {}
    for device in devices:
        free_bytes = free[device]
        if free_bytes is None:
            caps[device] = model.size
            continue
        room = free_bytes - free_bytes * MEMORY_MARGIN
        low, high = 0, model.size  # the largest length whose bytes fit
        while low < high:
            middle = (low + high + 1) // 2
            if _need(model, device, middle, home, output_bytes) <= room:
                low = middle
            else:
                high = middle - 1
        caps[device] = low
    return caps


def _fits(model: _Axis, devices: list[str], lengths: list[int], home: str, free: dict[str, int | None],
          output_bytes: int) -> bool:
    """Whether every pool holds its share (the home device its join, even with no share of its own)."""
    shares = dict(zip(devices, lengths))
    for device in set(devices) | {home}:
        room = free.get(device)
        if room is None:
            continue
        if _need(model, device, shares.get(device, 0), home, output_bytes) > room - room * MEMORY_MARGIN:
            return False
    return True


def _ordered(devices: list[str], home: str) -> list[str]:
    """Launch order: the C backend runs a kernel in the calling thread, so its share is launched after the devices
    with queues; the home device last among equals (its part needs no copy)."""
    return sorted(devices, key=lambda device: (device.startswith("c:"), device == home))


def _times(model: _Axis, devices: list[str], lengths: list[int], home: str, output_bytes: int,
           table: Calibration) -> float:
    """Estimated seconds of a split: each device's compute, input copies and part copied home, overlapped as far
    as the devices were measured to run at once, then the join on the home device."""
    per_device = []
    for device, length in zip(devices, lengths):
        if length <= 0:
            continue
        seconds = model.work(length) / table.speed(device) + model.arriving_seconds(device, length, table)
        if device != home:
            seconds += model.output_unit * length / table.transfer_rate(device, home) + DEVICE_OVERHEAD_SECONDS
        per_device.append(seconds)
    overlap = table.overlap
    together = overlap * max(per_device) + (1 - overlap) * sum(per_device)
    join = 2 * output_bytes / table.transfer_rate(HOST, home) if len(per_device) > 1 else 0.0
    return together + join


def _weights(model: _Axis, devices: list[str], home: str, table: Calibration) -> dict[str, float]:
    """Rows per second each device would sustain: compute, its inputs' boxes and its part's way home."""
    weights = {}
    for device in devices:
        per_row = model.work(model.size) / model.size / table.speed(device)
        per_row += model.arriving_seconds(device, model.size, table) / model.size
        if device != home:
            per_row += model.output_unit / table.transfer_rate(device, home)
        weights[device] = 1.0 / max(per_row, 1e-30)
    return weights


def _time_split(root: Node, axes: list[_Axis], devices: list[str], free: dict[str, int | None],
                output_bytes: int, table: Calibration) -> Decision | None:
    home = cast(str, root.device)
    alone = axes[0]
    single = _times(alone, [home], [alone.size], home, output_bytes, table)
    best: tuple[float, float, Decision] | None = None
    ranked = sorted(devices, key=lambda device: -table.speed(device))[:MAXIMUM_SUBSET_DEVICES]
    for count in range(2, len(ranked) + 1):
        for subset in itertools.combinations(ranked, count):
            chosen = _ordered(list(subset), home)
            for model in axes:
                if model.size < count:
                    continue
                caps = _caps(model, chosen, home, free, output_bytes)
                lengths = _lengths(model.size, chosen, _weights(model, chosen, home, table), caps)
                if lengths is None or min(lengths) <= 0 or not _fits(model, chosen, lengths, home, free,
                                                                       output_bytes):
                    continue
                seconds = _times(model, chosen, lengths, home, output_bytes, table)
                copied = sum(model.arriving(device, length) for device, length in zip(chosen, lengths))
                if best is None or (seconds, copied) < best[:2]:
                    estimate = f"estimated {seconds * 1e3:.2f} ms split, {single * 1e3:.2f} ms on {home}"
                    best = (seconds, copied, Decision(model.axis, chosen, lengths, "faster split", estimate,
                                                      root.shape))
    if best is None or best[0] > CLEAR_GAIN * single:
        split = f"{best[0] * 1e3:.2f} ms split" if best is not None else "no split fits"
        _refuse(f"{root.shape} stays on {home}: estimated {single * 1e3:.2f} ms there, {split} (devices run at "
                f"once: {table.overlap:.2f})")
        return None
    return best[2]


def _memory_split(root: Node, axes: list[_Axis], devices: list[str], free: dict[str, int | None],
                  output_bytes: int, whole_need: float) -> Decision:
    home = cast(str, root.device)
    table = current()  # (measuring would need room that is missing: without speeds, equal weights)
    if table is not None and any(device not in table.speeds for device in devices):
        table = None
    best: tuple[float, Decision] | None = None
    chosen = _ordered(devices, home)
    for model in axes:
        caps = _caps(model, chosen, home, free, output_bytes)
        weights = (_weights(model, chosen, home, table) if table is not None
                   else {device: 1.0 for device in chosen})
        lengths = _lengths(model.size, chosen, weights, caps)
        if lengths is None or not _fits(model, chosen, lengths, home, free, output_bytes):
            continue
        used = [(device, length) for device, length in zip(chosen, lengths) if length > 0]
        copied = sum(model.arriving(device, length) for device, length in used)
        if best is None or copied < best[0]:
            reason = (f"needs {_size(whole_need)} on {home}, which has {_size(free[home] or 0)} free")
            best = (copied, Decision(model.axis, [device for device, _ in used], [length for _, length in used],
                                     reason, f"{_size(copied)} copied in", root.shape))
    if best is None:
        pools = "; ".join(f"{device}: {_size(room)} free" if room is not None else f"{device}: no limit"
                          for device, room in free.items())
        raise ShardingMemoryError(
            f"{root.dtype.name} output of shape {root.shape} ({_size(output_bytes)}) computed on {home} needs "
            f"{_size(whole_need)} there with its inputs, and split across {', '.join(devices)} it still needs "
            f"{_size(2 * output_bytes)} on {home} for the joined output and its parts; the pools have {pools}. "
            f"Free tensors you no longer need, raise the limits (EMBER_POOL_LIMITS), or move the inputs to a "
            f"device with room (.to(device))")
    return best[1]


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} bytes"
