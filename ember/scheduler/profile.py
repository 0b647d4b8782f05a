"""What ran: kernels with their device and time, compiles, copies and bytes; `ember.profile()` and EMBER_DEBUG."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ember.context import CONTEXT, update


def set_debug_level(level: int) -> None:
    """Debug output from now on in the calling thread (EMBER_DEBUG sets every thread's at import)."""
    update(debug_level=int(level))


def debug_level() -> int:
    """EMBER_DEBUG: 1 realizes, 2 kernels with times, 3 + IR, 4 + generated source, 5 + every copy and free."""
    return CONTEXT.get().debug_level


@dataclass
class KernelRecord:
    """One kernel that ran: its time, and when it started and ended (time.perf_counter seconds; kernels the
    executor ran at the same time, EMBER_PARALLEL_KERNELS, have overlapping [start, end) intervals)."""

    name: str
    device: str
    seconds: float
    global_size: int
    start: float = 0.0
    end: float = 0.0


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


@contextmanager
def profile() -> Iterator[Profile]:
    """Record what ember runs inside the block: `with ember.profile() as prof: ...; print(prof)`. Only what the
    calling thread (or task) runs is recorded: a profile is a field of its context (ember/context.py)."""
    record = Profile()
    update(profiles=(*CONTEXT.get().profiles, record))
    try:
        yield record
    finally:
        update(profiles=tuple(open_record for open_record in CONTEXT.get().profiles if open_record is not record))


def current() -> tuple[Profile, ...]:
    """The profiles open in the calling thread (innermost last)."""
    return CONTEXT.get().profiles


def debug_print(level: int, message: str) -> None:
    if CONTEXT.get().debug_level >= level:
        print(message, file=sys.stderr)
