"""What ran: kernels with their device and time, compiles, copies and bytes; `ember.profile()` and EMBER_DEBUG."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


class DebugLevel:
    """EMBER_DEBUG, read when ember is imported (`set_debug_level` changes it at run time)."""

    value: int = 0


def set_debug_level(level: int) -> None:
    DebugLevel.value = int(level)


def _read_debug_environment() -> int:
    text = os.environ.get("EMBER_DEBUG", "0") or "0"
    try:
        return int(text)
    except ValueError:
        print(f"ember: EMBER_DEBUG={text!r} is not a number (use 0-5); debug output stays off", file=sys.stderr)
        return 0


DebugLevel.value = _read_debug_environment()


class VizFolder:
    """EMBER_VIZ: a folder where every realize writes its graph as DOT (ember/viz.py); empty: none."""

    value: str = os.environ.get("EMBER_VIZ", "")


def debug_level() -> int:
    """EMBER_DEBUG: 1 realizes, 2 kernels with times, 3 + IR, 4 + generated source, 5 + every copy and free."""
    return DebugLevel.value


@dataclass
class KernelRecord:
    name: str
    device: str
    seconds: float
    global_size: int


@dataclass
class CompileRecord:
    name: str
    device: str
    seconds: float
    from_cache: bool


@dataclass
class Profile:
    """Everything that ran inside an `ember.profile()` block."""

    kernels: list[KernelRecord] = field(default_factory=list)
    compiles: list[CompileRecord] = field(default_factory=list)
    copies: list[tuple[str, str, int]] = field(default_factory=list)  # (from device, to device, bytes)
    bytes_allocated: int = 0
    realizes: int = 0
    peak_bytes: dict[str, int] = field(default_factory=dict)
    programs_evicted: int = 0  # compiled kernels dropped from the bounded in-memory cache (compile_cache.py)
    recomputed_kernels: int = 0  # commands run again under ember.memory_budget (memory_budget.py)
    planned_peak_bytes: dict[str, int] = field(default_factory=dict)  # per pool, the budget plans' peaks

    @property
    def kernel_seconds(self) -> float:
        return sum(record.seconds for record in self.kernels)

    def __str__(self) -> str:
        lines = [f"{self.realizes} realizes, {len(self.kernels)} kernels, {len(self.compiles)} compiles, "
                 f"{len(self.copies)} copies, {self.bytes_allocated} bytes allocated"
                 + (f", {self.programs_evicted} programs evicted" if self.programs_evicted else "")]
        for record in self.kernels:
            lines.append(f"  kernel {record.name:<40} {record.device:<10} {record.seconds * 1e6:10.1f} us")
        for compile_record in self.compiles:
            source = "disk/memory cache" if compile_record.from_cache else "compiled"
            lines.append(f"  compile {compile_record.name:<39} {compile_record.device:<10} "
                         f"{compile_record.seconds * 1e3:10.2f} ms ({source})")
        for peak_device, peak in self.peak_bytes.items():
            lines.append(f"  peak bytes on {peak_device}: {peak}")
        for planned_device, planned in self.planned_peak_bytes.items():
            lines.append(f"  memory budget plan on {planned_device}: peak {planned} bytes")
        if self.recomputed_kernels:
            lines.append(f"  {self.recomputed_kernels} commands recomputed under the memory budget")
        return "\n".join(lines)


class ActiveProfiles:
    stack: list[Profile] = []


@contextmanager
def profile() -> Iterator[Profile]:
    """Record what ember runs inside the block: `with ember.profile() as prof: ...; print(prof)`."""
    record = Profile()
    ActiveProfiles.stack.append(record)
    try:
        yield record
    finally:
        ActiveProfiles.stack.remove(record)


def current() -> list[Profile]:
    return ActiveProfiles.stack


def debug_print(level: int, message: str) -> None:
    if DebugLevel.value >= level:
        print(message, file=sys.stderr)
