"""Kernel search: a beam search over a kernel's lowering plans (ir/search_space.py), each candidate compiled and timed
on the device on buffers of the kernel's sizes, checked against the default plan's output; the winner is kept on
disk (ir/search_cache.py) and later processes lower it directly.

EMBER_SEARCH=<beam width> (or `ember.search(beam)`) searches each kernel that has no stored winner; unset, stored
winners are used and nothing is searched; EMBER_SEARCH=0 ignores stored winners too (the heuristic's plans only)."""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.ir.ir import KernelIR
from ember.ir.kernel import Kernel
from ember.ir.opt import Plan, build_planned_ir, choose_plan, optimizations_enabled
from ember.ir.search_cache import device_fingerprint, entry_path, load_winner, store_winner, warn_unusable
from ember.ir.search_space import actions, apply
from ember.progress import Progress
from ember.settings import ConfigError

DEFAULT_BUDGET_SECONDS = 10.0  # search time per kernel unless EMBER_SEARCH_BUDGET says
TIMED_RUNS = 5  # runs per candidate (their median is its time), after the run whose output is checked
HOPELESS = 2.0  # a candidate whose checked run takes this many times the best time so far is not run again
MAX_ROUNDS = 4  # beam steps: each tries every action on every plan of the beam
PATIENCE = 1  # rounds without a faster plan after which the search stops (a 2-action move: upcast, then vectorize)
CONFIRMING_RUNS = 7  # runs of the default and the winner, alternating, before the winner is kept
# a packed matmul whose default run takes more than this share of the budget is searched over its blocks and tiles
# only: a tiled plan runs it tens of times slower, and one run of it cannot be cut short (4096^2 untiled: ~90 s)
PACKED_ONLY_SHARE = 0.01
BATCH = max(2, os.cpu_count() or 1)  # candidates lowered and compiled at once (in threads where the device compiles
# concurrently): one a core, so that the budget is checked often on a kernel that is slow to compile


@dataclass
class KernelSearch:
    """What the search of one kernel did."""

    name: str
    default_seconds: float
    winner_seconds: float
    winner: Plan
    candidates_compiled: int
    candidates_timed: int
    wrong: int  # candidates whose output differed from the default's (never chosen)
    seconds: float  # the whole search: lowering, compiling, timing
    unconfirmed: bool = False  # the fastest candidate lost to the default when timed again: the default kept


@dataclass
class SearchStatistics:
    """The kernel searches of this process, and the winners loaded from disk (`python -m ember tune` prints them)."""

    searches: list[KernelSearch] = field(default_factory=list)
    winners_loaded: int = 0
    winners_refused: int = 0

    def describe(self) -> list[str]:
        lines = [f"{search.name}: {search.default_seconds * 1e3:.3f} ms -> {search.winner_seconds * 1e3:.3f} ms "
                 f"({search.default_seconds / search.winner_seconds:.2f}x) with {search.winner}, "
                 f"{search.candidates_timed} variants timed in {search.seconds:.1f} s"
                 + (f", {search.wrong} wrong ones refused" if search.wrong else "")
                 + (", the fastest not confirmed when timed again" if search.unconfirmed else "")
                 for search in self.searches]
        total = sum(search.seconds for search in self.searches)
        lines.append(f"{len(self.searches)} kernels searched in {total:.1f} s; {self.winners_loaded} winners loaded "
                     f"from disk")
        return lines


STATISTICS = SearchStatistics()
_override: list[tuple[int, float | None]] = []  # ember.search settings, innermost last


class search:  # noqa: N801 - used like a function: ember.search(4) or `with ember.search(4):`
    """Search kernel variants with this beam width (0: stored winners ignored, the heuristic only) until the end of
    a `with` block, or for the rest of the process when not used as one; `budget_seconds` per kernel (default:
    EMBER_SEARCH_BUDGET or 10 s)."""

    def __init__(self, beam: int = 4, budget_seconds: float | None = None) -> None:
        if not isinstance(beam, int) or beam < 0:
            raise ValueError(f"ember.search: the beam width must be a whole number >= 0, got {beam!r}")
        if budget_seconds is not None and budget_seconds <= 0:
            raise ValueError(f"ember.search: the time budget must be positive seconds, got {budget_seconds!r}")
        self.setting = (beam, budget_seconds)
        _override.append(self.setting)

    def __enter__(self) -> search:
        return self

    def __exit__(self, *exception: object) -> None:
        if self.setting in _override:
            del _override[len(_override) - 1 - _override[::-1].index(self.setting)]


def beam_width() -> int | None:
    """The beam width kernels are searched with, 0 where even stored winners are ignored, None where only stored
    winners are used (EMBER_SEARCH unset)."""
    if _override:
        return _override[-1][0]
    text = os.environ.get("EMBER_SEARCH", "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ConfigError(f"EMBER_SEARCH={text!r}: use a beam width (a whole number, e.g. 4), or 0 to ignore "
                                 "stored search winners")
    return int(text)


def budget_seconds() -> float:
    """Seconds one kernel's search may take (EMBER_SEARCH_BUDGET, else DEFAULT_BUDGET_SECONDS)."""
    if _override and _override[-1][1] is not None:
        return float(_override[-1][1])  # type: ignore[arg-type]
    text = os.environ.get("EMBER_SEARCH_BUDGET", "").strip()
    try:
        budget = float(text) if text else DEFAULT_BUDGET_SECONDS
    except ValueError:
        budget = -1.0
    if budget <= 0:
        raise ConfigError(f"EMBER_SEARCH_BUDGET={text!r}: use positive seconds, e.g. 10")
    return budget


def searched_lowering(device: Any, kernel: Kernel, name: str) -> KernelIR | None:
    """The kernel lowered by its stored winner on this device, or by the winner of a search now (EMBER_SEARCH);
    None where the default lowering applies (search off and no winner, optimizations off, a device that cannot
    run kernels, or a kernel the search does not time: one reading integer buffers, whose random contents could
    index out of bounds)."""
    width = beam_width()
    if width == 0 or not optimizations_enabled() or not device.info.can_run:
        return None
    path = entry_path(kernel, name, device_fingerprint(device))
    plan = load_winner(path, kernel, name)
    if plan is not None:
        lowered = build_planned_ir(kernel, name, device.info, plan)
        if lowered is not None:
            STATISTICS.winners_loaded += 1
            return lowered
        STATISTICS.winners_refused += 1
        warn_unusable(name, path, f"the entry is stale (its plan {plan} does not lower this kernel)")
        return None
    if width is None:
        return None
    return _search(device, kernel, name, width, path)


class _Bench:
    """Buffers of a kernel's sizes with random inputs, on the device, and runs of candidate programs on them."""

    def __init__(self, device: Any, ir: KernelIR) -> None:
        self.device, self.pool = device, device.pool
        generator = np.random.default_rng(0)
        self.buffers: list[tuple[Any, int]] = []
        self.output = ir.params[0]
        try:
            for param in ir.params:
                nbytes = param.size * param.dtype.itemsize
                handle = self.pool.allocate(nbytes)
                self.buffers.append((handle, nbytes))
                if not param.is_output:
                    self.pool.copy_in(handle, _random(param.dtype, param.size, generator).data.cast("B"))
        except BaseException:
            self.close()
            raise
        self.sentinel = np.full(self.output.size * self.output.dtype.itemsize, 0x7B, dtype=np.uint8)

    def run(self, program: Any, global_size: int) -> float:
        """Seconds one run takes (launch to completion)."""
        start = time.perf_counter()
        program([handle for handle, _ in self.buffers], global_size).wait()
        return time.perf_counter() - start

    def output_of(self, program: Any, global_size: int) -> tuple[np.ndarray, float]:
        """The output of one run that starts from a filled output buffer (elements left unwritten show), and the
        seconds the run took (a first run: it may include loading the program)."""
        handle = self.buffers[0][0]
        self.pool.copy_in(handle, self.sentinel.data)
        seconds = self.run(program, global_size)
        result = np.empty(self.output.size, dtype=self.output.dtype.numpy)
        self.pool.copy_out(result.data.cast("B"), handle)
        return result, seconds

    def close(self) -> None:
        for handle, nbytes in self.buffers:
            self.pool.release(handle, nbytes)
        self.buffers = []


def _random(dtype: Any, size: int, generator: np.random.Generator) -> np.ndarray:
    if dtype.is_bool:
        return generator.integers(0, 2, size).astype(np.bool_)
    values = generator.standard_normal(size).astype(np.float32)
    if dtype.name == "bfloat16":
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(dtype.numpy)


def _same_output(candidate: np.ndarray, reference: np.ndarray, dtype: Any) -> bool:
    """Whether a candidate's output is the default's: exactly for integers and bools; for floats within the
    rounding a reordered sum makes, with NaN and infinity where the default has them."""
    if not dtype.is_float:
        return bool(np.array_equal(candidate, reference))
    if dtype.name == "bfloat16":
        candidate = (candidate.astype(np.uint32) << 16).view(np.float32)
        reference = (reference.astype(np.uint32) << 16).view(np.float32)
    mine, theirs = candidate.astype(np.float64), reference.astype(np.float64)
    finite = np.isfinite(theirs)
    if not np.array_equal(np.isnan(mine), np.isnan(theirs)) or not np.array_equal(mine[~finite & ~np.isnan(theirs)],
                                                                                  theirs[~finite & ~np.isnan(theirs)]):
        return False
    tolerance = 1e-3 if dtype.itemsize >= 4 else 2e-2
    scale = float(np.abs(theirs[finite]).max()) if finite.any() else 0.0
    return bool(np.all(np.abs(mine[finite] - theirs[finite]) <= tolerance * (np.abs(theirs[finite]) + scale)))


def _compile(device: Any, irs: list[KernelIR]) -> list[Any]:
    """A program per IR (None for one the device cannot build), in threads where the device compiles concurrently."""
    def build(ir: KernelIR) -> Any:
        try:
            return device.compile(ir)
        except Exception:  # noqa: BLE001 - a candidate the device cannot build is only dropped
            return None

    if device.info.concurrent_compile and len(irs) > 1:
        with ThreadPoolExecutor(max_workers=max(1, min(len(irs), os.cpu_count() or 1))) as pool:
            return list(pool.map(build, irs))
    return [build(ir) for ir in irs]


def _search(device: Any, kernel: Kernel, name: str, width: int, path: Any) -> KernelIR | None:
    """Search the plans of a kernel from the heuristic's, keep the fastest correct one on disk, return its IR."""
    start = time.perf_counter()
    default_plan, default_ir = choose_plan(kernel, name, device.info)
    if default_plan.group or default_ir.params[0].size == 0 or any(param.dtype.is_int
                                                                   for param in default_ir.params[1:]):
        return None  # a workgroup kernel (its shape is DeviceInfo's), an empty output, integer indices
    budget = budget_seconds()
    deadline = start + budget
    try:
        default_program = device.compile(default_ir)
        device.synchronize()
        bench = _Bench(device, default_ir)
    except Exception:  # noqa: BLE001 - no search where the default cannot be set up (out of memory): the default
        return None
    try:
        reference = bench.output_of(default_program, default_ir.global_size)[0]
        default_seconds = _time(bench, default_program, default_ir.global_size, deadline)
    except Exception:  # noqa: BLE001 - the default fails to run here: the scheduler's launch reports it
        bench.close()
        return None
    record = KernelSearch(name, 0.0, 0.0, default_plan, 1, 1, 0, 0.0)
    try:
        timed: dict[Plan, float] = {default_plan: default_seconds}
        lowered: dict[Plan, KernelIR] = {default_plan: default_ir}
        programs_of: dict[Plan, Any] = {default_plan: default_program}
        beam = [default_plan]
        space = actions(kernel, device.info)
        if default_plan.packed and default_seconds > PACKED_ONLY_SHARE * budget:
            space = [action for action in space if action.kind in ("pack_block", "pack_tile")]
        with Progress(MAX_ROUNDS * width * len(space), f"search {name}", unit="variant") as progress:
            stalled = 0
            for _ in range(MAX_ROUNDS):
                best_before = min(timed.values())
                neighbours = list(dict.fromkeys(
                    neighbour for plan in beam for action in space
                    if (neighbour := apply(plan, action, kernel)) is not None and neighbour not in timed))
                for first in range(0, len(neighbours), BATCH):
                    if time.perf_counter() > deadline:
                        break
                    batch = neighbours[first:first + BATCH]
                    irs = [build_planned_ir(kernel, name, device.info, plan) for plan in batch]
                    built = [(plan, ir) for plan, ir in zip(batch, irs) if ir is not None]
                    programs = _compile(device, [ir for _, ir in built])
                    record.candidates_compiled += sum(program is not None for program in programs)
                    for (plan, ir), program in zip(built, programs):
                        timed[plan] = float("inf")
                        if program is None or time.perf_counter() > deadline:
                            continue
                        try:
                            output, first_seconds = bench.output_of(program, ir.global_size)
                            if not _same_output(output, reference, bench.output.dtype):
                                record.wrong += 1
                                continue
                            # the checked run is the warm-up; one far slower than the best is not run again
                            hopeless = first_seconds > HOPELESS * min(timed.values())
                            timed[plan] = first_seconds if hopeless else _time(bench, program, ir.global_size,
                                                                               deadline)
                        except Exception:  # noqa: BLE001 - a candidate the device fails to run is only dropped
                            continue
                        lowered[plan], programs_of[plan] = ir, program
                        record.candidates_timed += 1
                    for plan in batch:
                        timed.setdefault(plan, float("inf"))
                    progress.advance(len(batch))
                beam = sorted((plan for plan in timed if plan in lowered), key=timed.__getitem__)[:width]
                if min(timed.values()) < best_before:
                    stalled = 0
                else:
                    stalled += 1
                if stalled > PATIENCE or time.perf_counter() > deadline:
                    break
        winner = min(lowered, key=timed.__getitem__)
        if winner != default_plan and not _confirmed(bench, (default_ir, default_program),
                                                     (lowered[winner], programs_of[winner]), deadline):
            record.unconfirmed, winner = True, default_plan
    finally:
        bench.close()
    record.default_seconds, record.winner_seconds, record.winner = default_seconds, timed[winner], winner
    record.seconds = time.perf_counter() - start
    STATISTICS.searches.append(record)
    store_winner(path, name, winner, default_seconds, timed[winner])
    return lowered[winner]


def _time(bench: _Bench, program: Any, global_size: int, deadline: float) -> float:
    """The median of TIMED_RUNS runs of a program whose output was checked by a run just before (its warm-up);
    fewer past the deadline, but at least one."""
    times = [bench.run(program, global_size)]
    while len(times) < TIMED_RUNS and time.perf_counter() < deadline:
        times.append(bench.run(program, global_size))
    return statistics.median(times)


def _confirmed(bench: _Bench, default: tuple[KernelIR, Any], winner: tuple[KernelIR, Any], deadline: float) -> bool:
    """Whether the winner still beats the default when the two are timed again, alternately (a candidate may have
    won on a moment the machine was less busy)."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(CONFIRMING_RUNS):
        for (ir, program), found in zip((default, winner), times):
            found.append(bench.run(program, ir.global_size))
        if time.perf_counter() > deadline and len(times[1]) >= 2:
            break
    return statistics.median(times[1]) < statistics.median(times[0])
