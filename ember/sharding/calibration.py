"""Each compute device's speed and the transfer rate between devices, measured once per process by tiny kernels
(automatic sharding weighs devices by them); a test may put a table of its own in their place."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

HOST = "host"  # the pseudo-device host data is uploaded from
CALIBRATION_SIZE = 256  # the calibration matmul is this square (16.8 million multiply-adds)
TRANSFER_ELEMENTS = 1 << 19  # float32 elements moved to measure a transfer rate (2 MiB: below MINIMUM_ELEMENTS)
REPEATS = 5  # the best of this many timings counts (the machine may be busy)


@dataclass
class Calibration:
    """Multiply-adds per second of each device, bytes per second of a copy from one device to another (HOST for
    host data), and `overlap`: how far the devices run at once (1: independent processors, 0: one processor taking
    turns, as c and a CPU driver of OpenCL or Vulkan). `measured`: False for a table given by hand."""

    speeds: dict[str, float] = field(default_factory=dict)
    transfer_rates: dict[tuple[str, str], float] = field(default_factory=dict)
    overlap: float = 1.0
    measured: bool = True

    def speed(self, device: str) -> float:
        return self.speeds[device]

    def transfer_rate(self, source: str, target: str) -> float:
        """Bytes per second of a copy; a pair not in the table moves at the slower of the two devices' rates to and
        from the host."""
        rate = self.transfer_rates.get((source, target))
        if rate is not None:
            return rate
        known = [value for (first, second), value in self.transfer_rates.items()
                 if first in (source, target) or second in (source, target)]
        return min(known) if known else 1e9

    def describe(self) -> list[str]:
        lines = [f"{device}: {speed / 1e9:.2f} G multiply-adds/s" for device, speed in self.speeds.items()]
        lines.append(f"devices run at once: {self.overlap:.2f} (1: independent, 0: taking turns)")
        lines += [f"{source} -> {target}: {rate / 1e9:.2f} GB/s"
                  for (source, target), rate in self.transfer_rates.items()]
        return lines


class _State:
    table: Calibration | None = None  # the process's (measured once), or one a test put in place


def calibration(devices: list[str]) -> Calibration:
    """The process's calibration, measured now for the devices it does not cover yet."""
    table = _State.table
    if table is None:
        table = _State.table = Calibration()
    missing = [device for device in devices if device not in table.speeds]
    if missing and table.measured:
        _measure(table, missing)
    elif missing:
        raise KeyError(f"the calibration given has no speed for {', '.join(missing)}")
    return table


def current() -> Calibration | None:
    """The calibration measured or given so far (None before the first need)."""
    return _State.table


@contextmanager
def using(table: Calibration) -> Iterator[Calibration]:
    """Decide with `table` instead of measured speeds inside the block (tests: a device made fast or slow)."""
    before = _State.table
    _State.table = table
    try:
        yield table
    finally:
        _State.table = before


def _measure(table: Calibration, devices: list[str]) -> None:
    """Time a small matmul on each device alone and on all at once (the overlap), a 2 MiB upload from the host to
    each, and a 2 MiB copy between each pair, in a plain context (nothing recorded, profiled or printed)."""
    import numpy as np

    import ember
    from ember.context import overriding

    with overriding(profiles=(), recorder=None, trace=None, budget=None, debug_level=0, viz_folder=""):
        for device in devices:
            left = ember.ones((CALIBRATION_SIZE, CALIBRATION_SIZE), device=device).realize()
            right = ember.ones((CALIBRATION_SIZE, CALIBRATION_SIZE), device=device).realize()
            table.speeds[device] = CALIBRATION_SIZE**3 / _best_time(lambda: (left @ right).realize())
            array = np.ones(TRANSFER_ELEMENTS, dtype=np.float32)
            seconds = _best_time(lambda: ember.tensor(array, device=device).realize())
            table.transfer_rates[(HOST, device)] = array.nbytes / seconds
        known = list(table.speeds)
        if len(known) > 1:
            operands = {device: (ember.ones((CALIBRATION_SIZE, CALIBRATION_SIZE), device=device).realize(),
                                 ember.ones((CALIBRATION_SIZE, CALIBRATION_SIZE), device=device).realize())
                        for device in known}
            order = sorted(known, key=lambda device: device.startswith("c:"))  # queued devices first (as a split)
            alone = [CALIBRATION_SIZE**3 / table.speeds[device] for device in known]
            together = _best_time(lambda: _all_at_once([operands[device] for device in order]))
            if sum(alone) > max(alone):
                overlap = (sum(alone) - together) / (sum(alone) - max(alone))
                table.overlap = min(max(overlap, 0.0), 1.0)
        for source in known:
            data = ember.ones(TRANSFER_ELEMENTS, device=source).realize()
            for target in known:
                if target != source and (source, target) not in table.transfer_rates:
                    seconds = _best_time(lambda: data.to(target).realize())
                    table.transfer_rates[(source, target)] = TRANSFER_ELEMENTS * 4 / seconds


def _all_at_once(operands: list[tuple[Any, Any]]) -> list[Any]:
    """One matmul per device in one realize (launched in the order given)."""
    import ember

    products = [left @ right for left, right in operands]
    ember.realize(*products)
    return products


def _best_time(run: Callable[[], Any]) -> float:
    """The shortest of REPEATS timed calls (after one untimed: compiles), each until its results are written."""
    from ember.scheduler.buffers import buffer_of

    def timed() -> float:
        start = time.perf_counter()
        result = run()
        for tensor in result if isinstance(result, list) else [result]:
            buffer_of(tensor.node).event.wait()
        return time.perf_counter() - start

    timed()
    return max(min(timed() for _ in range(REPEATS)), 1e-7)
