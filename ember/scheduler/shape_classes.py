"""Compiling by shape class: the second kernel met of a structure seen before with other sizes (the next token of a
generation loop) makes a class whose varying sizes are read at launch, compiled once; every later member launches
that program with its own sizes (a small buffer per member), so a growing sequence compiles no more kernels.
Off by default (each size compiles its own kernel, tiled and vectorized for it); EMBER_SHAPE_CLASSES=1 turns it on.
Known limits, why it is not on by default yet: class kernels are untiled (a warm run is slower), and each member
holds a small sizes buffer in the device's pool, so what a kernel costs and allocates depends on the kernels met
before it."""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ember.backends.base import Device, Event, Program
from ember.core import dtype as dtypes
from ember.ir.ir import IROp, KernelIR, topological_nodes
from ember.ir.kernel import Kernel, row_loop
from ember.ir.linearize import Step, linearize
from ember.ir.lower import lower_shape_class
from ember.ir.shape_class import ShapeClass, class_kernel, class_of, fits_class, global_size, split_sizes
from ember.scheduler import profile

MAX_STRUCTURES = 4096  # structures remembered (the least recently met forgotten), as the compile cache's programs
# a member doing more work items x loop iterations than this compiles for its sizes: a class's kernel is untiled
# and unvectorized (one output per work item), which a large matmul pays for many times over its compile
MAX_MEMBER_WORK = 1 << 21
MAX_WIDENINGS = 4  # times a structure's class is made wider (each compiles its kernel again)


def enabled() -> bool:
    """Whether kernels are compiled by shape class (EMBER_SHAPE_CLASSES=1; off by default)."""
    return os.environ.get("EMBER_SHAPE_CLASSES", "0") not in ("0", "")


class SizedProgram(Program):
    """A shape class's program launched for one member: its buffers, then the member's sizes (a device buffer of
    int32: the global size, then each size variable's value)."""

    def __init__(self, program: Program, sizes: Any) -> None:
        self.program = program
        self.sizes = sizes  # the scheduler's Buffer (kept alive with the program)
        self.handle = sizes.handle

    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        return self.program([*buffers, self.handle], global_size, wait_for)

    def bind(self, buffers: list[Any], global_size: int) -> Callable[[tuple[Event, ...]], Event]:
        return self.program.bind([*buffers, self.handle], global_size)


@dataclass
class Structure:
    """What is known of one kernel structure on one device: the sizes it was first met with, then its class and the
    class's compiled kernel (`refused`: the class could not be lowered or built; its members compile one by one)."""

    sizes: tuple[int, ...]
    shape_class: ShapeClass | None = None
    ir: KernelIR | None = None
    program: Program | None = None
    whole_rows: bool = False
    refused: bool = False
    widenings: int = 0


STRUCTURES: OrderedDict[tuple[str, tuple], Structure] = OrderedDict()


def member(device: Device, kernel: Kernel) -> Any:
    """The compiled kernel (a compile_cache.CompiledKernel) that runs `kernel` as a member of its shape class on
    `device`, compiling the class at the second size met; None where the kernel is to be compiled for its sizes
    (its structure met first, with sizes no class holds, or large: MAX_MEMBER_WORK)."""
    if not enabled() or not device.info.can_run:
        return None
    structure_key, sizes = split_sizes(kernel)
    key = (device.name, structure_key)
    known = STRUCTURES.get(key)
    if known is None:
        STRUCTURES[key] = Structure(sizes)
        while len(STRUCTURES) > MAX_STRUCTURES:
            STRUCTURES.popitem(last=False)
        return None
    STRUCTURES.move_to_end(key)
    if known.refused:
        return None
    if known.shape_class is None:
        shape_class = class_of(known.sizes, sizes)
        if shape_class is None:
            known.sizes = sizes
            return None
        if not _compile_class(device, kernel, known, shape_class):
            return None
    assert known.shape_class is not None and known.ir is not None and known.program is not None
    if not fits_class(kernel):
        return None
    values = known.shape_class.member_values(sizes)
    if values is None:  # other sizes vary too (two layers of one structure, then a longer sequence): a wider class
        wider = known.shape_class.widened(sizes)
        if wider is None or known.widenings >= MAX_WIDENINGS:
            return None
        known.widenings += 1
        if not _compile_class(device, kernel, known, wider):
            return None
        values = wider.member_values(sizes)
        if values is None:
            return None
    work_items = global_size(kernel, known.whole_rows)
    iterations = member_loop_iterations(known.ir, values)
    if work_items * max(1, iterations) > MAX_MEMBER_WORK:
        return None
    limit = getattr(device, "loop_limit", None)  # (wgpu on Mesa's llvmpipe ends long loops: wgpu.py)
    if limit is not None and iterations > limit:
        return None
    from ember.scheduler.buffers import Buffer
    from ember.scheduler.compile_cache import CompiledKernel

    buffer = Buffer(device, len(values) + 1, dtypes.int32)
    buffer.write(np.array([work_items, *values], dtype=np.int32))
    return CompiledKernel(replace(known.ir, global_size=work_items), SizedProgram(known.program, buffer))


def _compile_class(device: Device, kernel: Kernel, known: Structure, shape_class: ShapeClass) -> bool:
    """Lower and build the class's kernel into `known`; False (the structure refused) where it cannot be."""
    start = time.perf_counter()
    generic = class_kernel(kernel, shape_class)
    name = "s_" + hashlib.blake2s(repr(generic).encode(), digest_size=5).hexdigest()
    try:
        ir = lower_shape_class(generic, name, shape_class.variables)
        unsupported = device.info.unsupported({param.dtype for param in ir.params} |
                                              {node.dtype for node in topological_nodes(ir.sink)})
        if unsupported:
            raise TypeError(f"dtypes {unsupported} unsupported")
        program = device.compile_many([ir])[0]
    except Exception as error:  # noqa: BLE001 - any failure keeps the structure to kernels of its own sizes
        if known.shape_class is None:  # (a wider class that failed leaves the one there is)
            known.refused = True
        profile.debug_print(1, f"  shape class of {name} refused ({type(error).__name__}: {error}); its kernels "
                               "compile for their sizes")
        return False
    known.shape_class, known.ir, known.program = shape_class, ir, program
    known.whole_rows = row_loop(generic)
    seconds = time.perf_counter() - start
    for record in profile.current():
        record.compiles.append(profile.CompileRecord(ir.name, device.name, seconds, from_cache=False))
    profile.debug_print(1, f"  shape class {name}: {shape_class.variables} size(s) read at launch")
    return True


def member_loop_iterations(ir: KernelIR, values: tuple[int, ...]) -> int:
    """How many loop iterations one work item of a class's kernel runs for a member with these variable values."""
    trips, total = [1], 0
    for instruction in linearize(ir.sink):
        if instruction.kind is Step.LOOP:
            node = instruction.node
            size = node.arg[1]
            if node.srcs:  # a load of element k + 1 of the sizes: variable k
                load = node.srcs[0]
                if load.op is not IROp.LOAD or not load.srcs[1].is_const:
                    return 1 << 62
                size = values[int(load.srcs[1].arg) - 1]
            trips.append(trips[-1] * size)
            total += trips[-1]
        elif instruction.kind is Step.END_LOOP:
            trips.pop()
    return total
