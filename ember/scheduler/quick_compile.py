"""Early-stoppable compiles for a cold start: new kernels are first built the quick way (Device.compile_quick: c at
-O0) and launched, while one background thread builds the optimized programs (Device.compile_background: c's
compiler at the lowest priority, writing them to the disk cache for later processes) and swaps each into the
compile cache when it is ready."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import copy_context

from ember.backends.base import Device
from ember.core.errors import CompileError
from ember.ir.ir import KernelIR
from ember.ir.kernel import Kernel
from ember.scheduler import compile_cache, profile
from ember.scheduler.compile_cache import CompileCache, CompiledKernel, first_error_line

# one thread: the optimized builds queue behind each other instead of taking every core from the first steps; its
# pending work is finished at interpreter exit (concurrent.futures joins its threads), so the disk cache gets it
_OPTIMIZER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ember-optimize")
_PENDING: list[Future[None]] = []
_QUEUE: list[tuple[CompileCache, Device, list[Kernel], list[KernelIR], list[CompiledKernel]]] = []
_LOCK = threading.Lock()


def enabled() -> bool:
    """EMBER_QUICK_COMPILE=1 turns quick builds on. They are off by default: a quick build's values agree with the
    optimized build's only within float tolerance, so a run's last bits would depend on the state of the cache."""
    return os.environ.get("EMBER_QUICK_COMPILE", "0") not in ("0", "")


def compile_quickly(device: Device, kernels: list[Kernel], irs: list[KernelIR]) -> list[CompiledKernel] | None:
    """The kernels' quick builds, in the compile cache, with their optimized builds queued to replace them; None
    where the device makes no quick build for them (no such build, the optimized ones are at hand, or it failed:
    the caller then compiles them the usual way)."""
    if not enabled():
        return None
    start = time.perf_counter()
    try:
        programs = device.compile_quick(irs)
    except CompileError:
        return None
    if programs is None:
        return None
    cache = compile_cache.COMPILED
    quick = compile_cache.enter_compiled(device, kernels, irs, programs, time.perf_counter() - start)
    with _LOCK:  # (compile_ahead's threads come here at once)
        _QUEUE.append((cache, device, kernels, irs, quick))
        _PENDING[:] = [future for future in _PENDING if not future.done()]
        _PENDING.append(_OPTIMIZER.submit(copy_context().run, _optimize_queued))  # (its debug output: the caller's)
    return quick


def _optimize_queued() -> None:
    """Build everything queued so far, one compiler run per device (batches queued while the last run went on are
    built together; a run that finds the queue empty was served by an earlier one)."""
    with _LOCK:
        jobs = list(_QUEUE)
        _QUEUE.clear()
    groups: dict[tuple[int, str], tuple[CompileCache, Device, list[Kernel], list[KernelIR], list[CompiledKernel]]] = {}
    for cache, device, kernels, irs, quick in jobs:
        group = groups.setdefault((id(cache), device.name), (cache, device, [], [], []))
        group[2].extend(kernels)
        group[3].extend(irs)
        group[4].extend(quick)
    for group in groups.values():
        _optimize(*group)


def _optimize(cache: CompileCache, device: Device, kernels: list[Kernel], irs: list[KernelIR],
              quick: list[CompiledKernel]) -> None:
    """Build the optimized programs and put each where its quick build still is (a kernel evicted or replaced since
    is left alone); a build that fails leaves the quick ones in place."""
    try:
        programs = device.compile_background(irs)
    except CompileError as error:
        profile.debug_print(1, f"  optimized build failed on {device.name}, quick builds kept: "
                               f"{first_error_line(error)}")
        return
    for kernel, ir, program, before in zip(kernels, irs, programs, quick):
        cache.replace((device.name, kernel), before, CompiledKernel(ir, program))
    profile.debug_print(1, f"  {len(kernels)} optimized kernels swapped in on {device.name}")


def wait_for_optimized() -> None:
    """Wait until every queued optimized build is in the compile cache (benchmarks, tests, ember.jit captures)."""
    while _PENDING:
        _PENDING.pop(0).result()
