"""Compiled kernels: lowering for a device (dtype checks, IR and source debug output), compiling in batches, the
bounded in-memory cache by (device, kernel structure), and the CompileError fallback to narrower vectors."""

from __future__ import annotations

import hashlib
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from typing import cast

from ember.backends.base import Device, DeviceInfo, Program
from ember.core.dtype import DType
from ember.core.errors import CompileError, CompileFallbackWarning, DeviceError
from ember.core.ops import Op
from ember.ir import search
from ember.ir.ir import KernelIR, topological_nodes
from ember.ir.kernel import Kernel
from ember.ir.opt import build_kernel_ir, narrower_capabilities
from ember.ir.vectorize import vector_width
from ember.scheduler import profile, shape_classes
from ember.scheduler.input_views import ViewedProgram, input_views

MAX_COMPILED_PROGRAMS = 4096  # kernels kept compiled in memory (all devices); beyond it the least recently used go


class CompiledKernel:
    __slots__ = ("ir", "name", "program")

    def __init__(self, ir: KernelIR, program: Program) -> None:
        self.ir, self.program, self.name = ir, program, ir.name


class CompileCache:
    """(device name, kernel) -> CompiledKernel, least recently used dropped beyond `limit`; a dropped kernel is
    compiled again when met (the backends' disk caches make that cheap). Evictions are counted here, in
    `em.profile().programs_evicted`, and printed at EMBER_DEBUG=1."""

    def __init__(self, limit: int = MAX_COMPILED_PROGRAMS) -> None:
        self.limit = limit
        self.entries: OrderedDict[tuple[str, Kernel], CompiledKernel] = OrderedDict()
        self.evictions = 0
        self.generation = 0  # changes whenever a program leaves the cache or is replaced (a schedule compiled before
        # may miss some; a launch plan may hold the old program)
        self._lock = threading.Lock()  # batches compile in threads (compile_ahead)
        # (device name, kernel with input offsets) -> its code's program launched with views: `viewed`
        self.views: OrderedDict[tuple[str, Kernel], CompiledKernel] = OrderedDict()

    def get(self, key: tuple[str, Kernel]) -> CompiledKernel | None:
        """The compiled kernel of (device name, kernel); for a kernel with input offsets, its code's launched with
        views of the offset inputs (`viewed`)."""
        if key[1].input_offsets:
            code = self.get((key[0], key[1].code))
            return None if code is None else self.viewed(key[0], key[1], code)
        compiled = self.entries.get(key)
        if compiled is not None:
            self.entries.move_to_end(key)
        return compiled

    def viewed(self, device_name: str, kernel: Kernel, code: CompiledKernel) -> CompiledKernel:
        """`code` (the compiled `kernel.code`) launched for `kernel`, whose input offsets it reads through views
        (input_views.ViewedProgram), made once per kernel and program."""
        key = (device_name, kernel)
        known = self.views.get(key)
        if known is not None and cast(ViewedProgram, known.program).program is code.program:
            return known
        from ember.scheduler.devices import get_device

        viewed = CompiledKernel(code.ir, ViewedProgram(code.program, get_device(device_name).pool,
                                                       input_views(kernel)))
        with self._lock:
            self.views[key] = viewed
            while len(self.views) > self.limit:
                self.views.popitem(last=False)
        return viewed

    def put(self, key: tuple[str, Kernel], compiled: CompiledKernel) -> None:
        """Keep the compiled code of a kernel (of its `code`: kernels alike but for input offsets share it)."""
        assert not isinstance(compiled.program, ViewedProgram), "the compile cache keeps the code's own program"
        key = (key[0], key[1].code)
        with self._lock:
            if key in self.entries:  # a program replaced (narrower vectors after a failed launch)
                self.generation += 1
            self.entries[key] = compiled
            self.entries.move_to_end(key)
            while len(self.entries) > self.limit:
                (device_name, _), dropped = self.entries.popitem(last=False)
                self.evictions += 1
                self.generation += 1
                for record in profile.current():
                    record.programs_evicted += 1
                profile.debug_print(1, f"  compile cache full ({self.limit} programs): dropped {dropped.name} "
                                       f"on {device_name}")

    def replace(self, key: tuple[str, Kernel], old: CompiledKernel, new: CompiledKernel) -> None:
        """Put `new` where `old` still is (a quick build swapped for its optimized one); else leave the entry."""
        key = (key[0], key[1].code)
        with self._lock:
            if self.entries.get(key) is old:
                self.entries[key] = new
                self.generation += 1  # (launch plans hold programs: they are made again)

    def __contains__(self, key: object) -> bool:
        device_name, kernel = cast(tuple[str, Kernel], key)
        return (device_name, kernel.code) in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[tuple[str, Kernel]]:
        return iter(list(self.entries))

    def items(self) -> list[tuple[tuple[str, Kernel], CompiledKernel]]:
        return list(self.entries.items())

    def values(self) -> list[CompiledKernel]:
        return list(self.entries.values())

    def clear(self) -> None:
        self.entries.clear()
        self.views.clear()
        self.generation += 1


COMPILED = CompileCache()


def kernel_name(kernel: Kernel) -> str:
    """A readable, structure-unique name: r (has a reduce) or e, the output shape, and a short hash."""
    has_reduce = any(step.op in (Op.SUM, Op.PROD, Op.REDUCE_MAX) for step in kernel.steps)
    shape = "_".join(str(size) for size in kernel.output.shape) or "scalar"
    digest = hashlib.blake2s(repr(kernel).encode(), digest_size=4).hexdigest()
    return f"{'r' if has_reduce else 'e'}_{shape}_{digest}"


def _value_dtypes(ir: KernelIR) -> set[DType]:
    """The dtypes of every value a kernel computes (a device must support its intermediates too)."""
    return {node.dtype for node in topological_nodes(ir.sink)}


def lower_for(device: Device, kernel: Kernel, capabilities: DeviceInfo | None = None) -> KernelIR:
    """The kernel IR of a kernel for a device, after checking the device supports its dtypes: with the device's own
    capabilities, its stored kernel search winner or the winner of a search now (EMBER_SEARCH, ir/search.py), else
    the heuristic's lowering; with other `capabilities` (narrower vectors), the heuristic's for those. EMBER_DEBUG=3
    prints the linearized IR, 4 the generated source."""
    kernel = kernel.code  # (input offsets are the launch's: input_views.py)
    name = kernel_name(kernel)
    searched = None if capabilities is not None else search.searched_lowering(device, kernel, name)
    ir = searched if searched is not None else build_kernel_ir(kernel, name, capabilities or device.info)
    unsupported = device.info.unsupported({param.dtype for param in ir.params} | _value_dtypes(ir))
    if unsupported:
        names = ", ".join(dtype.name for dtype in unsupported)
        raise DeviceError(f"device {device.name} cannot run kernels on {names}; move the tensor to another device")
    if profile.debug_level() >= 3:
        from ember.ir.linearize import linearize

        listing = "\n".join(f"  {item.kind:<10} {item.node.op.name:<10} {item.node.dtype.name}" for item in
                             linearize(ir.sink))
        profile.debug_print(3, f"IR of {ir.name} ({ir.global_size} work items):\n{listing}")
    if profile.debug_level() >= 4:
        profile.debug_print(4, device.render(ir))
    return ir


def compile_kernel(device: Device, kernel: Kernel) -> CompiledKernel:
    """Lower, optimize for the device, and compile a kernel; cached in memory by (device, structure)."""
    compiled = COMPILED.get((device.name, kernel))
    return compiled if compiled is not None else compile_kernels(device, [kernel])[0]


def compile_kernels(device: Device, kernels: list[Kernel], irs: list[KernelIR] | None = None) -> list[CompiledKernel]:
    """Compile several kernels for one device (lowered here unless their `irs` are given), in one compiler run where
    the device's `compile_many` makes one; if that fails, one by one, a kernel the device cannot build with vectors
    again with narrower ones or none. A kernel with input offsets compiles its `code` and launches it with views of
    those inputs (CompileCache.viewed)."""
    if any(kernel.input_offsets for kernel in kernels):
        codes = compile_kernels(device, [kernel.code for kernel in kernels], irs)
        return [COMPILED.viewed(device.name, kernel, compiled) if kernel.input_offsets else compiled
                for kernel, compiled in zip(kernels, codes)]
    if irs is None and shape_classes.enabled():  # members of a shape class launch its compiled kernel
        members = [shape_classes.member(device, kernel) for kernel in kernels]
        if any(found is not None for found in members):
            rest = [kernel for kernel, found in zip(kernels, members) if found is None]
            built = iter(_compile_kernels(device, rest, None) if rest else [])
            results = []
            for kernel, found in zip(kernels, members):
                if found is None:
                    results.append(next(built))
                else:
                    COMPILED.put((device.name, kernel), found)
                    results.append(found)
            return results
    return _compile_kernels(device, kernels, irs)


def _compile_kernels(device: Device, kernels: list[Kernel], irs: list[KernelIR] | None) -> list[CompiledKernel]:
    start = time.perf_counter()
    if irs is None:
        irs = [lower_for(device, kernel) for kernel in kernels]
    try:
        programs = device.compile_many(irs)
    except CompileError as error:
        if len(kernels) > 1:
            warnings.warn(f"ember: building {len(kernels)} kernels together on {device.name} failed "
                          f"({first_error_line(error)}); building them one by one", CompileFallbackWarning,
                          stacklevel=2)
        built = [compile_narrower(device, kernel, ir, error) if len(kernels) == 1 else _compile_one(device, kernel, ir)
                 for kernel, ir in zip(kernels, irs)]
        irs, programs = [ir for ir, _ in built], [program for _, program in built]
    return enter_compiled(device, kernels, irs, programs, time.perf_counter() - start)


def enter_compiled(device: Device, kernels: list[Kernel], irs: list[KernelIR], programs: list[Program],
                   seconds: float) -> list[CompiledKernel]:
    """Put freshly built programs in the compile cache and record each compile (`seconds` for the whole batch)."""
    per_kernel = seconds / max(1, len(kernels))
    results = []
    for kernel, ir, program in zip(kernels, irs, programs):
        compiled = CompiledKernel(ir, program)
        COMPILED.put((device.name, kernel), compiled)
        results.append(compiled)
        for record in profile.current():
            record.compiles.append(profile.CompileRecord(ir.name, device.name, per_kernel, from_cache=False))
    return results


def _compile_one(device: Device, kernel: Kernel, ir: KernelIR) -> tuple[KernelIR, Program]:
    try:
        return ir, device.compile_many([ir])[0]
    except CompileError as error:
        return compile_narrower(device, kernel, ir, error)


def compile_narrower(device: Device, kernel: Kernel, failed: KernelIR, error: CompileError
                     ) -> tuple[KernelIR, Program]:
    """The kernel lowered with narrower vectors than `failed`, which the device could not build or launch, or with
    none (opt.narrower_capabilities), with a one-line warning for each failure; the error if even that fails."""
    for capabilities in narrower_capabilities(device.info, vector_width(failed)):
        ir = lower_for(device, kernel, capabilities)
        if vector_width(ir) >= vector_width(failed):
            continue
        warnings.warn(f"ember: {device.name} failed on kernel {failed.name} with {_vectors(failed)} "
                      f"({first_error_line(error)}); using {_vectors(ir)} instead", CompileFallbackWarning,
                      stacklevel=2)
        try:
            return ir, device.compile_many([ir])[0]
        except CompileError as next_error:
            failed, error = ir, next_error
    raise error


def first_error_line(error: CompileError) -> str:
    """A compile error in one line for a warning: its first line, and where that only introduces the compiler's
    output ("the C compiler rejected a kernel:"), the output's first line saying "error" too."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    first = lines[0]
    if first.endswith(":"):
        detail = next((line for line in lines[1:] if "error" in line.lower()), lines[1] if len(lines) > 1 else "")
        return f"{first} {detail}".strip()
    return first


def _vectors(ir: KernelIR) -> str:
    width = vector_width(ir)
    return f"vectors of {width} float32 lanes" if width > 1 else "no vectors"

