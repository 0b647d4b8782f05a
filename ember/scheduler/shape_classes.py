"""Compiling by shape class: a kernel met again with other sizes in a place that keeps changing (the next token of
a generation loop) makes a class whose varying sizes are read at launch, compiled once; every later member launches
that program with its own sizes (a small buffer per member), so a growing sequence compiles no more kernels.

Three modes (EMBER_SHAPE_CLASSES): unset or "auto", the default, makes a size a class's variable only once its
place has taken DYNAMIC_AFTER different values (a dim that keeps changing, as torch.compile's automatic dynamic
shapes mark one): a program of fixed shapes, whose layers differ in a few widths, compiles every kernel for its own
sizes (tiled and vectorized), while a generation loop compiles for its first few lengths and then by class. "1"
makes a class from the second sizes met (fewest compiles; the incremental runner's `by_class()` blocks always do);
"0" compiles every kernel for its sizes. Class kernels are untiled (their float sums vectorized by the compiler
where it can: c's `omp simd reduction`), so what a kernel costs, and the pool bytes its sizes buffer takes, depend
on the kernels met before it. In every mode but "0", the flat kernels of one schedule that differ only in their
element count (an optimizer's update of each parameter: ir/flat_kernel.py) make a class at once (`batch_classes`):
their class kernel is one loop over the elements, which loses nothing to kernels compiled for their sizes."""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ember.backends.base import Device, Event, Program
from ember.core import dtype as dtypes
from ember.core.ops import REDUCE_OPS
from ember.core.shapes import prod
from ember.ir.flash_attention import attention_parts
from ember.ir.flat_kernel import flat_kernel
from ember.ir.ir import IROp, KernelIR, topological_nodes
from ember.ir.kernel import Kernel, row_loop
from ember.ir.linearize import Step, linearize
from ember.ir.lower import lower_shape_class
from ember.ir.shape_class import (
    SIZE_LIMITS,
    Limits,
    ShapeClass,
    class_kernel,
    class_of,
    fits_class,
    global_size,
    split_sizes,
)
from ember.scheduler import profile

MAX_STRUCTURES = 4096  # structures remembered (the least recently met forgotten), as the compile cache's programs
# a member doing more work items x loop iterations than this compiles for its sizes: a class's kernel is untiled
# and unvectorized (one output per work item), which a large matmul pays for many times over its compile
MAX_MEMBER_WORK = 1 << 21
MAX_WIDENINGS = 4  # times a class is made wider (each compiles its kernel again)
MAX_CLASSES = 4  # classes of one structure (each its own kernel)
MAX_PENDING = 8  # sizes no class holds kept per structure, to make a class with the next
DYNAMIC_AFTER = 6  # auto mode: the values a size's place takes before a class may make it a variable (a model's
# layers of one structure differ in a few widths; a growing sequence length takes a new value every step)


FORCED: ContextVar[bool] = ContextVar("ember_shape_classes_forced", default=False)  # inside by_class()
SCOPE: ContextVar[Hashable] = ContextVar("ember_shape_classes_scope", default=None)  # by_class's scope


def enabled() -> bool:
    """Whether kernels may be compiled by shape class (any mode but EMBER_SHAPE_CLASSES=0; always inside
    by_class())."""
    return FORCED.get() or os.environ.get("EMBER_SHAPE_CLASSES", "auto") != "0"


def automatic() -> bool:
    """Whether classes wait for dynamic places (EMBER_SHAPE_CLASSES unset, empty or "auto"; never in by_class())."""
    return not FORCED.get() and os.environ.get("EMBER_SHAPE_CLASSES", "auto") in ("auto", "")


@contextmanager
def by_class(scope: Hashable = None) -> Iterator[None]:
    """Compile the kernels realized in this block (in the calling thread) by shape class, whatever
    EMBER_SHAPE_CLASSES says. Kernels of another `scope` never share a class with these: the incremental runner
    gives each kept value's kernels their own, so that a class's variables are the sizes that move with the
    position, not those of two layers alike but for their widths (a class kernel is untiled)."""
    token, scoped = FORCED.set(True), SCOPE.set(scope)
    try:
        yield
    finally:
        SCOPE.reset(scoped)
        FORCED.reset(token)


class SizedProgram(Program):
    """A shape class's program launched for one member: its buffers, then the member's sizes (a device buffer of
    int32: the global size, then each size variable's value). `values` are those variables' values and `compiled`
    the class (what a replay at other sizes, incremental/position_replay.py, checks its values against)."""

    def __init__(self, program: Program, sizes: Any, values: tuple[int, ...] = (),
                 compiled: CompiledClass | None = None) -> None:
        self.program = program
        self.sizes = sizes  # the scheduler's Buffer (kept alive with the program)
        self.handle = sizes.handle
        self.values = values
        self.compiled = compiled

    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        return self.program([*buffers, self.handle], global_size, wait_for)

    def bind(self, buffers: list[Any], global_size: int) -> Callable[[tuple[Event, ...]], Event]:
        return self.program.bind([*buffers, self.handle], global_size)

    def rebind(self, bound: Any, index: int, handle: Any) -> bool:
        return self.program.rebind(bound, index, handle)  # (the sizes come after the buffers)


@dataclass
class CompiledClass:
    """One class of a structure and its compiled kernel (`widenings`: times it was made wider; `loops`: its loop
    nest, `loop_nest(ir)`, worked out once for the work each member's launch would do)."""

    shape_class: ShapeClass
    ir: KernelIR
    program: Program
    whole_rows: bool
    widenings: int = 0
    loops: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        if self.loops is None:
            self.loops = loop_nest(self.ir)


@dataclass
class Structure:
    """What is known of one kernel structure on one device: its classes with their compiled kernels, and the sizes
    of the last members met that none of them holds (`pending`: a next such member makes a class with one). A
    structure has several classes where its kernels vary in ways one class cannot hold (the restricted kernels of
    two values alike but for a size that is 1 in one: a size variable is never 1); `refused`: a class could not be
    lowered or built; its members compile one by one."""

    pending: list[tuple[int, ...]]
    classes: list[CompiledClass] = field(default_factory=list)
    refused: bool = False
    seen: list[set[int]] = field(default_factory=list)  # per size place, the values it took (up to DYNAMIC_AFTER)
    schedules: set[int] = field(default_factory=set)  # the schedules its kernels were met in (up to DYNAMIC_AFTER)

    def meet(self, sizes: tuple[int, ...]) -> None:
        """Count the values of each place and the schedules (realizes: the schedule cache's lookups) the
        structure's kernels came in: auto mode's evidence of which places keep changing from call to call."""
        from ember.scheduler.schedule import SCHEDULES

        if not self.seen:
            self.seen = [set() for _ in sizes]
        for values, size in zip(self.seen, sizes):
            if len(values) < DYNAMIC_AFTER:
                values.add(size)
        if len(self.schedules) < DYNAMIC_AFTER:
            self.schedules.add(SCHEDULES.hits + SCHEDULES.misses)

    def dynamic(self, shape_class: ShapeClass) -> bool:
        """Whether every place the class makes a variable has taken DYNAMIC_AFTER values, one of them a size, and
        the structure's kernels came in DYNAMIC_AFTER different schedules (or classes are not automatic:
        EMBER_SHAPE_CLASSES=1, by_class()). Sizes met in one schedule are a fixed set (a sort's merge passes, a
        model's layers: compiled once each, they run faster for their own sizes); a generation loop's lengths come
        one new schedule at a time. Offsets alone do not make a class either: a recurrent layer's time steps slice
        the same tensors at offsets that differ per step (where a slice is one run at a viewable offset, its kernels
        are one already: scheduler/input_views.py; a class kernel, untiled, would run them slower)."""
        if not automatic():
            return True
        if len(self.schedules) < DYNAMIC_AFTER:
            return False
        varying = [(values, limits) for wanted, values, limits in zip(shape_class.pattern, self.seen,
                                                                        shape_class.limits) if type(wanted) is not int]
        return (all(len(values) >= DYNAMIC_AFTER for values, _ in varying)
                and any(limits == SIZE_LIMITS for _, limits in varying))


STRUCTURES: OrderedDict[tuple[str, Hashable, tuple], Structure] = OrderedDict()


def member(device: Device, kernel: Kernel) -> Any:
    """The compiled kernel (a compile_cache.CompiledKernel) that runs `kernel` as a member of its shape class on
    `device`, compiling a class at the second sizes met that no class holds; None where the kernel is to be compiled
    for its sizes (its structure met first, sizes no class holds, or large: MAX_MEMBER_WORK)."""
    if not enabled() or not device.info.can_run:
        return None
    flat = _flat_member(device, kernel) if FLAT_CLASSES else None
    if flat is not None:  # (a class made for the flat kernels of an earlier batch may hold it)
        structure, flat_sizes, _ = split_sizes(flat)
        launched = _flat_launch(device, flat, (device.name, SCOPE.get(), structure), flat_sizes)
        if launched is not None:
            return launched
    structure_key, sizes, limits = split_sizes(kernel)
    key = (device.name, SCOPE.get(), structure_key)
    known = STRUCTURES.get(key)
    if known is None:
        known = STRUCTURES[key] = Structure([sizes])
        known.meet(sizes)
        while len(STRUCTURES) > MAX_STRUCTURES:
            STRUCTURES.popitem(last=False)
        return None
    STRUCTURES.move_to_end(key)
    known.meet(sizes)
    if known.refused or not fits_class(kernel) or attention_parts(kernel) is not None:
        return None  # (a fused attention: its flash kernel is made for its sizes, ir/flash_attention.py)
    found = _holding_class(device, kernel, known, sizes)
    if found is None:
        made = _new_class(device, kernel, known, sizes, limits)
        if made is None:
            return None
        found = made
    chosen, values = found
    return _launched(device, chosen, kernel, values)


def _launched(device: Device, chosen: CompiledClass, kernel: Kernel, values: tuple[int, ...]) -> Any:
    """The compiled kernel (a compile_cache.CompiledKernel) launching class `chosen`'s program for `kernel`, a member
    with these variable values; None where the member would do too much work for an untiled kernel
    (MAX_MEMBER_WORK) or run loops longer than the device allows."""
    work_items = global_size(kernel, chosen.whole_rows)
    assert chosen.loops is not None
    iterations = nest_iterations(chosen.loops, values)
    if work_items * max(1, iterations) > MAX_MEMBER_WORK:
        return None
    limit = getattr(device, "loop_limit", None)  # (wgpu on Mesa's llvmpipe ends long loops: wgpu.py)
    if limit is not None and iterations > limit:
        return None
    from ember.scheduler.buffers import Buffer
    from ember.scheduler.compile_cache import CompiledKernel

    buffer = Buffer(device, len(values) + 1, dtypes.int32)
    buffer.write(np.array([work_items, *values], dtype=np.int32))
    return CompiledKernel(replace(chosen.ir, global_size=work_items),
                          SizedProgram(chosen.program, buffer, values, chosen))


def variable_limits(compiled: CompiledClass) -> list[tuple[float, float]]:
    """Per size variable of a class, the values it may take: the intersection of its places' limits (a size's, an
    offset's)."""
    limits = [(-math.inf, math.inf)] * compiled.shape_class.variables
    for wanted, (minimum, maximum) in zip(compiled.shape_class.pattern, compiled.shape_class.limits):
        if type(wanted) is not int:
            number = wanted.number  # type: ignore[attr-defined]
            limits[number] = (max(limits[number][0], minimum), min(limits[number][1], maximum))
    return limits


def within_loop_limit(device: Device, compiled: CompiledClass, values: tuple[int, ...]) -> bool:
    """Whether a member's loops stay within the device's limit (wgpu on llvmpipe ends long loops: `loop_limit`)."""
    limit = getattr(device, "loop_limit", None)
    assert compiled.loops is not None
    return limit is None or nest_iterations(compiled.loops, values) <= limit


def _new_class(device: Device, kernel: Kernel, known: Structure, sizes: tuple[int, ...],
               limits: tuple[Limits, ...]) -> tuple[CompiledClass, tuple[int, ...]] | None:
    """The class made by a kernel of these sizes and the pending sizes most like them (fewest sizes differ: the
    same kernel at the previous position rather than another value's kernel of the same structure), compiled and
    added to `known`, with the kernel's variable values; None (the sizes left pending) where none makes one."""
    pending = known.pending
    if len(known.classes) >= MAX_CLASSES:
        return None
    candidates = sorted((earlier for earlier in pending if earlier != sizes),
                        key=lambda earlier: sum(old != new for old, new in zip(earlier, sizes)))
    if sizes not in pending:
        pending.append(sizes)
        del pending[:-MAX_PENDING]
    for earlier in candidates:
        shape_class = class_of(earlier, sizes, limits)
        if shape_class is None or not known.dynamic(shape_class):
            continue
        compiled = _compile_class(device, kernel, known, shape_class)
        values = None if compiled is None else shape_class.member_values(sizes)
        if compiled is None or values is None:
            return None
        known.classes.append(compiled)
        known.pending = [earlier for earlier in pending if shape_class.member_values(earlier) is None]
        return compiled, values
    return None


def _holding_class(device: Device, kernel: Kernel, known: Structure, sizes: tuple[int, ...]
                   ) -> tuple[CompiledClass, tuple[int, ...]] | None:
    """A class of `known` that holds a kernel of these sizes and the kernel's variable values, a class made wider
    to hold it where one can be (other sizes vary too: two layers of one structure, then a longer sequence), or
    None."""
    held = _class_holding(known.classes, sizes)
    if held is not None:
        return held
    for index, compiled in enumerate(known.classes):
        wider = compiled.shape_class.widened(sizes)
        if wider is None or compiled.widenings >= MAX_WIDENINGS or not known.dynamic(wider):
            continue
        rebuilt = _compile_class(device, kernel, known, wider)
        values = None if rebuilt is None else wider.member_values(sizes)
        if rebuilt is None or values is None:
            return None
        rebuilt.widenings = compiled.widenings + 1
        known.classes[index] = rebuilt
        return rebuilt, values
    return None


def _compile_class(device: Device, kernel: Kernel, known: Structure, shape_class: ShapeClass
                   ) -> CompiledClass | None:
    """Lower and build the class's kernel; None where it cannot be (a structure with no class yet is refused: its
    kernels compile for their sizes)."""
    start = time.perf_counter()
    generic = class_kernel(kernel, shape_class)
    name = _class_name(generic)
    try:
        ir = _lowered_class(device, generic, name, shape_class.variables)
        program = device.compile_many([ir])[0]
    except Exception as error:  # noqa: BLE001 - any failure keeps the structure to kernels of its own sizes
        if not known.classes:  # (a wider class that failed leaves the ones there are)
            known.refused = True
        profile.debug_print(1, f"  shape class of {name} refused ({type(error).__name__}: {error}); its kernels "
                               "compile for their sizes")
        return None
    seconds = time.perf_counter() - start
    for record in profile.current():
        record.compiles.append(profile.CompileRecord(ir.name, device.name, seconds, from_cache=False))
    profile.debug_print(1, f"  shape class {name}: {shape_class.variables} size(s) read at launch")
    return CompiledClass(shape_class, ir, program, row_loop(generic))


def _class_name(generic: Kernel) -> str:
    """The name of a class's kernel: a digest of the kernel with the class's variables in place of its sizes."""
    return "s_" + hashlib.blake2s(repr(generic).encode(), digest_size=5).hexdigest()


def _lowered_class(device: Device, generic: Kernel, name: str, variables: int) -> KernelIR:
    """The IR of a class's kernel (`generic`: a member with the class's variables in place of its sizes) for
    `device`; raises where it cannot be lowered, or uses a dtype the device lacks (TypeError)."""
    ir = lower_shape_class(generic, name, variables)
    unsupported = device.info.unsupported({param.dtype for param in ir.params} |
                                          {node.dtype for node in topological_nodes(ir.sink)})
    if unsupported:
        raise TypeError(f"dtypes {unsupported} unsupported")
    return ir


UNKNOWN_LOOP = -(1 << 62)  # a loop bound that is neither a constant nor a size variable


def loop_nest(ir: KernelIR) -> tuple[int | None, ...]:
    """A class kernel's loops in program order: each loop's trip count (a constant, k < 0 for size variable
    -k - 1, or UNKNOWN_LOOP), None at each loop's end."""
    nest: list[int | None] = []
    for instruction in linearize(ir.sink):
        if instruction.kind is Step.LOOP:
            node = instruction.node
            size = node.arg[1]
            if node.srcs:  # a load of element k + 1 of the sizes: variable k
                load = node.srcs[0]
                size = -int(load.srcs[1].arg) if load.op is IROp.LOAD and load.srcs[1].is_const else UNKNOWN_LOOP
            nest.append(size)
        elif instruction.kind is Step.END_LOOP:
            nest.append(None)
    return tuple(nest)


def nest_iterations(nest: tuple[int | None, ...], values: tuple[int, ...]) -> int:
    """How many loop iterations one work item of a class's kernel (its `loop_nest`) runs for a member with these
    variable values."""
    trips, total = [1], 0
    for size in nest:
        if size is None:
            trips.pop()
            continue
        if size == UNKNOWN_LOOP:
            return 1 << 62
        trips.append(trips[-1] * (values[-size - 1] if size < 0 else size))
        total += trips[-1]
    return total


# Classes of a batch's flat kernels. A schedule's kernels that are alike once flat (ir/flat_kernel.py) but for their
# element count, an optimizer's update of each parameter, clip_grad_norm_'s sum of squares and scaling of each
# gradient, compile as one class kernel at once, in the batch (compile_ahead), rather than one kernel per parameter
# shape: a flat class's kernel is one loop over the elements, vectorized by the compiler as a kernel of fixed sizes
# would be (nanoGPT's AdamW step: 27 kernels become 9). Its members are at most MAX_MEMBER_WORK elements, and a
# reduce's at most MAX_REDUCED_MEMBER, on devices computing on this machine's cores only (a class's reduce is one
# work item's loop: a GPU would run it on one thread).
MAX_REDUCED_MEMBER = 1 << 16
MAX_FLAT_CLASSES = 1024  # flat structures with classes remembered (the least recently made forgotten)
FLAT_CLASSES: OrderedDict[tuple[str, Hashable, tuple], list[CompiledClass]] = OrderedDict()


@dataclass
class BatchClass:
    """A class made for the flat kernels of one structure met in one batch: where its classes are kept, the class,
    its kernel's IR (built with the batch) and its members, each the kernel as scheduled, its flat form and that
    form's variable values."""

    key: tuple[str, Hashable, tuple]
    shape_class: ShapeClass
    ir: KernelIR
    whole_rows: bool
    members: list[tuple[Kernel, Kernel, tuple[int, ...]]]


def batch_classes(device: Device, kernels: list[Kernel]) -> tuple[list[Kernel], list[BatchClass]]:
    """Split a batch of kernels to compile on `device`: those compiled for their sizes, and the classes made for the
    rest, lowered (build_batch_classes builds them): each for the flat kernels of one structure that come with two
    or more element counts. A kernel a flat class made before holds is entered in the compile cache here."""
    if not enabled() or not device.info.can_run or len(kernels) < 2:
        return kernels, []
    from ember.scheduler.compile_cache import COMPILED

    scope = SCOPE.get()
    groups: dict[tuple[str, Hashable, tuple], list[tuple[Kernel, Kernel, tuple[int, ...], tuple[Limits, ...]]]] = {}
    entered: set[Kernel] = set()
    for kernel in kernels:
        flat = _flat_member(device, kernel)
        if flat is None:
            continue
        structure, sizes, limits = split_sizes(flat)
        key = (device.name, scope, structure)
        launched = _flat_launch(device, flat, key, sizes)
        if launched is not None:
            COMPILED.put((device.name, kernel), launched)
            entered.add(kernel)
        else:
            groups.setdefault(key, []).append((kernel, flat, sizes, limits))
    made = []
    for key, group in groups.items():
        if len(FLAT_CLASSES.get(key, ())) >= MAX_CLASSES:
            continue  # (a structure whose kernels keep differing in fixed sizes: compiled for their sizes)
        made_class = _batch_class(device, key, group)
        if made_class is not None:
            made.append(made_class)
            entered.update(kernel for kernel, _, _ in made_class.members)
    return [kernel for kernel in kernels if kernel not in entered], made


def build_batch_classes(device: Device, made: list[BatchClass]) -> list[Program] | None:
    """Build the kernels of the classes `batch_classes` made, in one compiler run (any thread); None where they
    cannot be built (enter_batch_classes then compiles their members for their sizes)."""
    start = time.perf_counter()
    try:
        programs = device.compile_many([batch_class.ir for batch_class in made])
    except Exception as error:  # noqa: BLE001 - any failure leaves the members to kernels of their own sizes
        profile.debug_print(1, f"  {len(made)} flat shape class(es) not built ({type(error).__name__}: {error}); "
                               "their kernels compile for their sizes")
        return None
    seconds = (time.perf_counter() - start) / len(made)
    for batch_class in made:
        for record in profile.current():
            record.compiles.append(profile.CompileRecord(batch_class.ir.name, device.name, seconds, from_cache=False))
    return programs


def enter_batch_classes(device: Device, made: list[BatchClass], programs: list[Program] | None) -> None:
    """Enter each member of the classes `batch_classes` made in the compile cache, launching its class's kernel
    (built: `programs`) with its sizes, on the thread holding the scheduler (a member's sizes are a buffer it
    writes); members of classes not built, or with loops longer than the device allows, compile for their sizes."""
    from ember.scheduler import compile_cache

    rest: list[Kernel] = []
    for index, batch_class in enumerate(made):
        if programs is None:
            rest.extend(kernel for kernel, _, _ in batch_class.members)
            continue
        compiled = CompiledClass(batch_class.shape_class, batch_class.ir, programs[index], batch_class.whole_rows)
        FLAT_CLASSES.setdefault(batch_class.key, []).append(compiled)
        FLAT_CLASSES.move_to_end(batch_class.key)
        while len(FLAT_CLASSES) > MAX_FLAT_CLASSES:
            FLAT_CLASSES.popitem(last=False)
        for kernel, flat, values in batch_class.members:
            launched = _launched(device, compiled, flat, values)
            if launched is None:
                rest.append(kernel)
            else:
                compile_cache.COMPILED.put((device.name, kernel), launched)
    if rest:
        compile_cache.compile_kernels(device, rest)


def _flat_member(device: Device, kernel: Kernel) -> Kernel | None:
    """The flat form of a kernel that may be a flat class's member on `device` (its elements within the limits),
    or None."""
    flat = flat_kernel(kernel)
    if flat is None or not fits_class(flat):
        return None
    reduces = any(step.op in REDUCE_OPS for step in flat.steps)
    elements = len(flat.steps) and max(prod(step.shape) for step in flat.steps)
    if elements > (MAX_REDUCED_MEMBER if reduces else MAX_MEMBER_WORK) or (reduces and not device.info.host_cores):
        return None
    return flat


def _flat_launch(device: Device, flat: Kernel, key: tuple[str, Hashable, tuple], sizes: tuple[int, ...]) -> Any:
    """The compiled kernel launching the flat class of `key` (FLAT_CLASSES) that holds `flat`, a flat form of these
    sizes, or None."""
    held = _class_holding(FLAT_CLASSES.get(key, []), sizes)
    return None if held is None else _launched(device, held[0], flat, held[1])


def _class_holding(classes: list[CompiledClass], sizes: tuple[int, ...]) -> tuple[CompiledClass, tuple[int, ...]] | None:
    """The first of `classes` that holds a kernel of these sizes, with the kernel's variable values."""
    for compiled in classes:
        values = compiled.shape_class.member_values(sizes)
        if values is not None:
            return compiled, values
    return None


def _batch_class(device: Device, key: tuple[str, Hashable, tuple],
                 group: list[tuple[Kernel, Kernel, tuple[int, ...], tuple[Limits, ...]]]) -> BatchClass | None:
    """The class holding a batch's flat kernels of one structure (`group`: each kernel, its flat form, that form's
    sizes and their limits), lowered; None where they come with one set of sizes, or the class cannot be lowered."""
    shape_class = ShapeClass(group[0][2], 0, group[0][3])  # (the first kernel's sizes, all fixed)
    for _, _, sizes, _ in group:
        if shape_class.member_values(sizes) is None:
            shape_class = shape_class.widened(sizes) or shape_class  # (None: a size outside its place's limits)
    if not shape_class.variables:
        return None
    members = []
    for kernel, flat, sizes, _ in group:
        values = shape_class.member_values(sizes)
        if values is not None:
            members.append((kernel, flat, values))
    generic = class_kernel(group[0][1], shape_class)
    name = _class_name(generic)
    try:
        ir = _lowered_class(device, generic, name, shape_class.variables)
    except Exception as error:  # noqa: BLE001 - a class that cannot be lowered leaves its kernels to their sizes
        profile.debug_print(1, f"  flat shape class of {name} refused ({type(error).__name__}: {error})")
        return None
    profile.debug_print(1, f"  flat shape class {name}: {len(members)} kernels, {shape_class.variables} size(s) "
                           "read at launch")
    return BatchClass(key, shape_class, ir, row_loop(generic), members)
