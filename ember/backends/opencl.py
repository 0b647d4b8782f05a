"""The `opencl` backend: kernel IR to OpenCL C, built by pyopencl (programs cached in memory and on disk), run async."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from ember import cache
from ember.backends import opencl_probe
from ember.backends.base import Device, DeviceInfo, Event, MemoryPool, Program, ProgramTable, launch_geometry
from ember.backends.c_style import MASK_TYPES, CStyleRenderer, lane_dtype, used_bitcasts, vector_nodes
from ember.backends.render_steps import KernelBody
from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.errors import BackendUnavailable, CompileError, OutOfMemoryError
from ember.core.ops import Op
from ember.ir.ir import IRNode, IROp, KernelIR, topological_nodes
from ember.ir.vectorize import SCALAR_CONDITION

try:
    import pyopencl as cl
except ImportError:  # the renderer works without pyopencl; probe() says how to install it
    cl = None  # type: ignore[assignment]  # optional import: probe() reports `cl is None` before any use

# what OpenCLRenderer renders on vectors: PoCL's implicit vectorizer (across work items) leaves math functions
# scalar calls (exp2 ~10x slower than on float8), so kernels carry explicit vector types where tiles allow
# (CMPEQ, AND and OR too: a float == c, and masks combined, `x < c | x == c`, kept a GELU's or a softmax gradient's
# whole kernel scalar: nanoGPT's GELU 56 ms a launch on PoCL, 3.7 ms in float16 vectors; and a select of vectors by
# one condition, SCALAR_CONDITION: a concatenation along an axis other than the vectors' kept char_lstm's gradient
# kernels scalar rows of 128 outputs, 144 KB of source each, 5.2 MB for a first step PoCL compiled for minutes)
VECTOR_OPS = frozenset({IROp.LOAD, IROp.REDUCE, Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.NEG, Op.MAX, Op.CMPLT, Op.CMPEQ,
                        Op.AND, Op.OR, Op.WHERE, Op.RECIPROCAL, Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN, Op.TRUNC,
                        SCALAR_CONDITION})
LOCAL_SIZE = 32  # work items per work group at most: measured best on PoCL (16-32 beat 64-256)
GROUPS_PER_UNIT = 4  # work groups per compute unit at least, where the global size allows (load balance on PoCL,
# which runs a group's items as one loop on one core)

BFLOAT16_HELPERS = """float ember_bf16_to_float(ushort value) { return as_float(((uint)value) << 16); }
ushort ember_float_to_bf16(float value) {
  uint bits = as_uint(value);
  if (value != value) return (ushort)((bits >> 16) | 64u);
  return (ushort)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16); }"""

# float16 is stored as ushort and converted with the core (extension-free) vload_half/vstore_half_rte: kernels
# compute halves in float32 (see ir/lower.py), so no device needs cl_khr_fp16 for them.
FLOAT16_HELPERS = """float ember_half_to_float(ushort value) { return vload_half(0, (const __private half*)&value); }
ushort ember_float_to_half(float value) {
  ushort bits; vstore_half_rte(value, 0, (__private half*)&bits); return bits; }"""
DOUBLE_TO_HALF = """ushort ember_double_to_half(double value) {
  ushort bits; vstore_half_rte(value, 0, (__private half*)&bits); return bits; }"""
FP64_PRAGMA = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable"
# NaN literals: PoCL (LLVM 14, SLEEF) folded a builtin of a NaN its compiler could see (exp2 or trunc of -(x + NaN))
# to an arbitrary number (1.6e37, 6e-36, a new one each build); a NaN read through a volatile is not folded
NAN_HELPERS = {
    "float": "float ember_nan_float(void) { volatile uint bits = 0x7fc00000u; return as_float(bits); }",
    "double": "double ember_nan_double(void) { volatile ulong bits = 0x7ff8000000000000UL; return as_double(bits); }",
}
# float operations on constants alone are computed when the kernel runs, one operand read through a volatile: PoCL
# folded trunc(0.0f / 0.0f) to 0 where C and torch give NaN (fmod(0, 0.0) gave 0; fuzz seed 20261281)
OPAQUE_HELPERS = {
    "float": "float ember_opaque_float(float x) { volatile float kept = x; return kept; }",
    "double": "double ember_opaque_double(double x) { volatile double kept = x; return kept; }",
}


class OpenCLRenderer(CStyleRenderer):
    """OpenCL C: one work item per global id, `__global` buffers, overloaded math functions, `as_<type>` bitcasts."""

    language = "OpenCL C"
    kernel_prefix = "__kernel void"
    global_qualifier = "__global "
    type_names: dict[DType, str] = {
        dtypes.bool_: "uchar", dtypes.int8: "char", dtypes.int16: "short", dtypes.int32: "int", dtypes.int64: "long",
        dtypes.uint8: "uchar", dtypes.uint16: "ushort", dtypes.uint32: "uint", dtypes.uint64: "ulong",
        dtypes.float16: "ushort", dtypes.bfloat16: "ushort", dtypes.float32: "float", dtypes.float64: "double",
    }

    def __init__(self, has_fp64: bool = True) -> None:
        super().__init__()
        self.has_fp64 = has_fp64

    def signed_from_unsigned(self, expression: str, dtype: DType) -> str:
        return f"as_{self.type_name(dtype)}({expression})"

    def math_function(self, op: Op | IROp, dtype: DType) -> str:
        return self.math_functions[op]  # OpenCL's math functions are overloaded: no 'f' suffix

    def cast(self, operands: list[str], dtype: DType, source: DType) -> str:
        value = operands[0]
        if source == dtypes.float16:
            value, source = f"ember_half_to_float({value})", dtypes.float32
        elif source == dtypes.bfloat16:
            value, source = f"ember_bf16_to_float({value})", dtypes.float32
        if dtype.is_bool:
            return f"({value}!=0)"
        if dtype == dtypes.float16:
            return f"ember_double_to_half({value})" if source == dtypes.float64 else f"ember_float_to_half({value})"
        if dtype == dtypes.bfloat16:
            return f"ember_float_to_bf16({value})"
        if dtype == source:
            return value
        return f"(({self.type_name(dtype)})({value}))"

    def bitcast(self, operands: list[str], dtype: DType, source: DType) -> str:
        return f"as_{self.type_name(dtype)}({operands[0]})"

    def _literal(self, value: float, dtype: DType) -> str:
        if dtype == dtypes.int64:
            value = int(value)
            return f"{value}L" if value > -(2**63) else "(-9223372036854775807L-1)"
        if dtype == dtypes.uint64:
            return f"{int(value)}UL"
        if dtype.is_float and math.isnan(float(value)):  # the quiet NaN torch and C give (PoCL's NAN is 0x7fffffff:
            # a sort's NaN came back with other bits than its input's), read through a volatile (NAN_HELPERS)
            return "ember_nan_double()" if dtype == dtypes.float64 else "ember_nan_float()"
        return super()._literal(value, dtype)

    def expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        kind = _constant_operation_type(node)
        if kind is None:
            return super().expression(node, operand)
        first = node.srcs[0]
        return super().expression(
            node, lambda source: f"ember_opaque_{kind}({operand(source)})" if source is first else operand(source))

    def prelude(self, kernel: KernelIR) -> str:
        # every helper is guarded, so several kernels can be built as one program (see OpenCLDevice.compile_many)
        used = _used_dtypes(kernel)
        helpers = []
        if dtypes.bfloat16 in used:
            helpers.append(("EMBER_BF16", BFLOAT16_HELPERS))
        if dtypes.float16 in used:
            helpers.append(("EMBER_HALF", FLOAT16_HELPERS))
            if self.has_fp64 and dtypes.float64 in used:
                helpers.append(("EMBER_DOUBLE_TO_HALF", DOUBLE_TO_HALF))
        nans = {node.dtype for node in topological_nodes(kernel.sink)
                if node.is_const and node.dtype.is_float and math.isnan(float(node.arg))}
        if nans - {dtypes.float64}:
            helpers.append(("EMBER_NAN_FLOAT", NAN_HELPERS["float"]))
        if dtypes.float64 in nans:
            helpers.append(("EMBER_NAN_DOUBLE", NAN_HELPERS["double"]))
        opaque = {kind for kind in map(_constant_operation_type, topological_nodes(kernel.sink)) if kind is not None}
        helpers.extend((f"EMBER_OPAQUE_{kind.upper()}", OPAQUE_HELPERS[kind]) for kind in sorted(opaque))
        lines = [FP64_PRAGMA] if self.has_fp64 else []
        lines.extend(f"#ifndef {guard}\n#define {guard}\n{text}\n#endif" for guard, text in helpers)
        lines.extend(self.vector_helpers(kernel))
        return "\n".join(lines)

    def signature(self, kernel: KernelIR, parameters: list[str]) -> str:
        if kernel.local_size is None:
            return super().signature(kernel, parameters)
        return (f"__kernel __attribute__((reqd_work_group_size({kernel.local_size}, 1, 1))) void "
                f"{kernel.name}({', '.join(parameters)})")

    def global_loop_open(self, kernel: KernelIR, index_type: str) -> list[str]:
        if kernel.local_size is not None:  # a workgroup kernel: launched as exactly its groups, none returns early
            return [f"  {index_type} ember_lid = ({index_type})get_local_id(0);",
                    f"  {index_type} ember_group = ({index_type})get_group_id(0);"]
        # the global size is rounded up to a multiple of the local size, so extra work items return at once
        return [f"  if (get_global_id(0) >= {self.global_bound(kernel)}) return;",
                f"  {index_type} gid = ({index_type})get_global_id(0);"]

    def define_shared(self, body: KernelBody, node: IRNode) -> None:
        """A `__local` array at the kernel's scope (a workgroup tile), read and written as a buffer."""
        name = body.names[id(node)] = f"ember_tile{node.arg[0]}"
        body.declarations.append(f"  __local {self.type_name(node.dtype)} {name}[{node.arg[1]}];")

    def barrier(self, body: KernelBody, node: IRNode) -> None:
        body.line("barrier(CLK_LOCAL_MEM_FENCE);")

    def group_reduce(self, body: KernelBody, node: IRNode) -> None:
        """The group's values combined by a tree in a `__local` array (declared at the kernel's scope): each item
        stores its value, then half the items combine pairs, halving until element 0 holds the result, with a
        barrier after every level."""
        number = body.number()
        array, stride, kind = f"ember_shared{number}", f"stride{number}", self.type_name(node.dtype)
        size = body.kernel.local_size
        assert size is not None and size & (size - 1) == 0, "a group reduce needs a power-of-two local size"
        body.declarations.append(f"  __local {kind} {array}[{size}];")
        body.line(f"{array}[ember_lid] = {body.operand(node.srcs[0])};")
        body.line("barrier(CLK_LOCAL_MEM_FENCE);")
        body.line(f"for (int {stride} = {size // 2}; {stride} > 0; {stride} >>= 1) {{")
        update = self.accumulate(f"{array}[ember_lid]", f"{array}[ember_lid + {stride}]", node)
        body.line(f"  if (ember_lid < {stride}) {{ {update}; }}")
        body.line("  barrier(CLK_LOCAL_MEM_FENCE);")
        body.line("}")
        name = body.name_of(node, "g")
        body.line(f"{kind} {name} = {array}[0];")

    # ---- vectors: OpenCL C's floatN/doubleN (lane-wise operators and math functions, comparisons give masks of
    # all bits set, select() picks by mask); vloadN/vstoreN need only element alignment, so any index works -------

    def vector_type(self, dtype: DType, width: int) -> str:
        return f"{self.type_name(dtype)}{width}"

    def vector_build(self, lanes: list[str], dtype: DType, width: int) -> str:
        if all(lane == lanes[0] for lane in lanes):
            return f"(({self.vector_type(dtype, width)})({lanes[0]}))"
        return f"(({self.vector_type(dtype, width)})({','.join(lanes)}))"

    def vector_lane(self, vector: str, lane: int, width: int) -> str:
        return f"{vector}.s{lane:x}"

    def vector_load(self, buffer: str, index: str, node: IRNode) -> str:
        return f"(*(const {self._unaligned_pointer(buffer, node)})({buffer}+{index}))"

    def vector_store(self, buffer: str, index: str, value: str, node: IRNode) -> str:
        return f"*({self._unaligned_pointer(buffer, node)})({buffer}+{index}) = {value}"

    def _unaligned_pointer(self, buffer: str, node: IRNode) -> str:
        """A pointer to the vector type aligned as its elements (so any index works) in the buffer's address space
        (parameters are `dataN`, scratch arrays `localN`). Not vloadN/vstoreN: PoCL calls them as functions, and
        each call makes LLVM spill every vector register (a matmul tile's accumulators: 27 -> 71 GFLOP/s per core
        second without them)."""
        space = "__global" if buffer.startswith("data") else "__private"
        return f"{space} ember_{self.vector_type(node.dtype, node.width)}_u*"

    def local_declaration(self, name: str, dtype: DType, size: int) -> str:
        return f"{self.type_name(dtype)} {name}[{size}]"

    def vector_maximum(self, operands: list[str], node: IRNode) -> str:
        return f"ember_max_{node.dtype.name}x{node.width}({operands[0]}, {operands[1]})"

    def vector_select(self, operands: list[str], node: IRNode) -> str:
        if node.srcs[0].width == 1:  # one condition for every lane (vectorize.SCALAR_CONDITION): ?: on vectors
            return f"({operands[0]}?{operands[1]}:{operands[2]})"
        mask, (value_dtype, mask_dtype) = operands[0], (lane_dtype(node), lane_dtype(node.srcs[0]))
        if value_dtype.itemsize != mask_dtype.itemsize:  # select() wants a mask as wide as the values
            mask = f"convert_{self.vector_type(MASK_TYPES[value_dtype.itemsize], node.width)}({mask})"
        return f"select({operands[2]}, {operands[1]}, {mask})"

    def vector_math(self, operands: list[str], node: IRNode) -> str:
        return f"{self.math_functions[node.op]}({operands[0]})"

    def vector_helpers(self, kernel: KernelIR) -> list[str]:
        """The element-aligned type of each vector type a kernel loads or stores, and the NaN-propagating vector
        maximum of each whose MAX it uses (guarded, so several kernels can be built as one program)."""
        lines = []
        for dtype, width in sorted({(node.dtype, node.width) for node in vector_nodes(kernel.sink)
                                    if node.op is IROp.LOAD or node.op is IROp.STORE}
                                   | {(node.srcs[2].dtype, node.srcs[2].width) for node in topological_nodes(kernel.sink)
                                      if node.op is IROp.STORE and node.srcs[2].width > 1}, key=lambda item: (item[0].name, item[1])):
            vector = self.vector_type(dtype, width)
            lines.append(f"#ifndef EMBER_{vector.upper()}_U\n#define EMBER_{vector.upper()}_U\n"
                         f"typedef {vector} ember_{vector}_u __attribute__((aligned({dtype.itemsize})));\n#endif")
        for dtype, width in sorted({(node.dtype, node.width) for node in vector_nodes(kernel.sink)
                                    if node.op is Op.MAX or (node.op is IROp.REDUCE and node.arg is Op.REDUCE_MAX)},
                                   key=lambda item: (item[0].name, item[1])):
            vector, function = self.vector_type(dtype, width), f"ember_max_{dtype.name}x{width}"
            lines.append(f"#ifndef {function.upper()}\n#define {function.upper()}\n"
                         f"{vector} {function}({vector} a, {vector} b) {{ return select(b, a, (a > b) | (a != a)); }}\n"
                         "#endif")
        return lines


def _used_dtypes(kernel: KernelIR) -> set[DType]:
    found = {param.dtype for param in kernel.params} | {node.dtype for node in topological_nodes(kernel.sink)}
    for target, source in used_bitcasts(kernel.sink):
        found.update((target, source))
    return found


class OpenCLEvent(Event):
    """An enqueued OpenCL command (pyopencl keeps the host memory of a non-blocking copy alive in its event)."""

    __slots__ = ("context", "event")

    def __init__(self, event: Any, context: Any) -> None:
        self.event = event
        self.context = context

    def wait(self) -> None:
        self.event.wait()

    @property
    def done(self) -> bool:
        return self.event.command_execution_status == cl.command_execution_status.COMPLETE


class OpenCLMemoryPool(MemoryPool):
    """cl.Buffers of one device. Copies run on the device's transfer queue, after the events they are given, so
    they overlap the kernels of the compute queue; a blocking read or write waits only for its own copy."""

    frees_behind_events = True  # clReleaseMemObject keeps the memory until the commands using it have finished

    def __init__(self, device: OpenCLDevice) -> None:
        super().__init__(device.name, limit_bytes=device.cl_device.global_mem_size)
        self.device = device
        self.max_allocation = device.cl_device.max_mem_alloc_size
        self.host_copies: list[Any] = []  # unfinished copies to or from host memory (see _track)
        # released large buffers are kept for reuse (base.MemoryPool's policy): a CPU driver hands out fresh pages,
        # and their first touch cost as much as a 16M-element elementwise kernel (0.77 against 1.86 GB/s on PoCL)
        self.reuse_budget_bytes = device.cl_device.global_mem_size // 8
        # sub-buffers (views) start at multiples of CL_DEVICE_MEM_BASE_ADDR_ALIGN, which OpenCL gives in bits
        self.view_alignment = max(1, device.cl_device.mem_base_addr_align // 8)

    def _track(self, event: Any) -> OpenCLEvent:
        """Hold the event of a copy with host memory until it completes: pyopencl's event keeps that memory alive,
        and dropping it unfinished would block (its destructor waits, holding the GIL)."""
        done = cl.command_execution_status.COMPLETE
        self.host_copies = [copy for copy in self.host_copies if copy.command_execution_status != done]
        self.host_copies.append(event)
        return OpenCLEvent(event, self.device.context)

    def create_buffer(self, nbytes: int) -> Any:
        if nbytes > self.max_allocation:
            raise OutOfMemoryError(f"memory pool {self.name}: one buffer of {nbytes} bytes exceeds the device's "
                                   f"largest allocation ({self.max_allocation} bytes)")
        return cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, nbytes)

    def view(self, handle: Any, offset: int, nbytes: int) -> Any:
        # clCreateSubBuffer (released by its own finalizer); OpenCL makes none of a sub-buffer (a jit arena's piece,
        # viewed again for a kernel's input offset: scheduler/input_views.py), so that one is made of its buffer
        parent = handle.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT)
        if parent is not None:
            return parent.get_sub_region(handle.get_info(cl.mem_info.OFFSET) + offset, nbytes)
        return handle.get_sub_region(offset, nbytes)

    def destroy_buffer(self, handle: Any) -> None:
        handle.release()  # OpenCL keeps the memory until the commands already enqueued on it have finished

    def pending_work(self) -> tuple[Event, ...]:
        queues = (self.device._queue, self.device._transfer_queue)
        return tuple(OpenCLEvent(cl.enqueue_marker(queue), self.device.context) for queue in queues
                     if queue is not None)

    def copy_in(self, handle: Any, source: memoryview) -> None:
        self.copy_in_async(handle, source, self._after_launches()).wait()

    def copy_out(self, destination: memoryview, handle: Any) -> None:
        self.copy_out_async(destination, handle, self._after_launches()).wait()

    def _after_launches(self) -> tuple[Event, ...]:
        """A marker after every launch enqueued so far: the synchronous copies keep the one-queue ordering."""
        if self.device._queue is None:
            return ()
        return (OpenCLEvent(cl.enqueue_marker(self.device._queue), self.device.context),)

    def copy_in_async(self, handle: Any, source: memoryview, wait_for: tuple[Event, ...] = ()) -> Event:
        host = np.frombuffer(source, dtype=np.uint8)
        event = cl.enqueue_copy(self.device.transfer_queue, handle, host, is_blocking=False,
                                wait_for=self.device.native_events(wait_for))
        return self._track(event)

    def copy_out_async(self, destination: memoryview, handle: Any, wait_for: tuple[Event, ...] = ()) -> Event:
        host = np.frombuffer(destination, dtype=np.uint8)
        event = cl.enqueue_copy(self.device.transfer_queue, host, handle, is_blocking=False,
                                wait_for=self.device.native_events(wait_for))
        return self._track(event)

    def copy_from(self, handle: Any, source_pool: MemoryPool, source_handle: Any, nbytes: int,
                  wait_for: tuple[Event, ...] = ()) -> Event | None:
        if not isinstance(source_pool, OpenCLMemoryPool) or source_pool.device.context is not self.device.context:
            return None  # buffers of another context are reached through host memory
        event = cl.enqueue_copy(self.device.transfer_queue, handle, source_handle, byte_count=nbytes,
                                wait_for=self.device.native_events(wait_for))
        return OpenCLEvent(event, self.device.context)


class FirstLaunches:
    """The kernels of one built program not launched yet, and the disk cache entry to rewrite once all have been:
    PoCL compiles a kernel's work-group code at its first launch and includes it in the program's binary, but
    freezes the binary the first time it is asked for it, so the entry is written after the last first launch."""

    def __init__(self, program: Any, path: Path, names: set[str]) -> None:
        self.program, self.path, self.names = program, path, names

    def launched(self, name: str, event: Any) -> None:
        self.names.discard(name)
        if not self.names:
            event.wait()
            write_cache_entry(self.path, program_binary(self.program), launched=True)


class OpenCLProgram(Program):
    """One kernel of a built program; a call enqueues it and returns at once with its event."""

    def __init__(self, device: OpenCLDevice, program: Any, name: str, first_launches: FirstLaunches | None = None,
                 exact_local_size: int | None = None) -> None:
        self.device = device
        self.program = program
        self.name = name
        try:  # PoCL makes a kernel's machine code here (or at the first launch of a local size), and may fail
            self.kernel = cl.Kernel(program, name)
            limit = self.kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, device.cl_device)
        except (cl.RuntimeError, cl.LogicError) as error:
            raise CompileError(f"the OpenCL driver of {device.name} ({device.cl_device.name.strip()}) could not "
                               f"create kernel {name}: {_one_line(error)}") from None
        self.largest_local_size = limit
        self.exact_local_size = exact_local_size  # a workgroup kernel's (KernelIR.local_size)
        self.geometry: tuple[int, tuple[int], tuple[int]] | None = None  # (global size, global, local) of the last call
        self.launched_local_sizes: set[int] = set()
        self.first_launches = first_launches  # set until this kernel's first launch while the cache entry waits

    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        native = self.device.native_events(wait_for)
        self.kernel.set_args(*buffers)
        if self.geometry is None or self.geometry[0] != global_size:
            (groups, _, _), local = launch_geometry(global_size, self.device.info, self.largest_local_size,
                                                    self.exact_local_size)
            self.geometry = (global_size, (groups * local,), (local,))
        local = self.geometry[2][0]
        if local in self.launched_local_sizes:
            event = cl.enqueue_nd_range_kernel(self.device.queue, self.kernel, self.geometry[1], self.geometry[2],
                                               wait_for=native)
        else:
            try:  # the first launch of a local size makes its work-group code, which the driver may fail to make
                event = cl.enqueue_nd_range_kernel(self.device.queue, self.kernel, self.geometry[1], self.geometry[2],
                                                   wait_for=native)
            except (cl.RuntimeError, cl.LogicError) as error:
                raise CompileError(f"the OpenCL driver of {self.device.name} could not launch kernel {self.name} "
                                   f"with work groups of {local}: {_one_line(error)}") from None
            self.launched_local_sizes.add(local)
        if self.first_launches is not None:
            self.first_launches.launched(self.name, event)
            self.first_launches = None
        return OpenCLEvent(event, self.device.context)


class OpenCLDevice(Device):
    """One OpenCL device with its own context and two in-order queues (created on first use): kernels run on the
    compute queue, copies on the transfer queue, and events order commands across the two."""

    def __init__(self, name: str, cl_device: Any) -> None:
        self.name = name
        self.cl_device = cl_device
        self.info = device_info(cl_device)
        self.renderer = OpenCLRenderer(has_fp64=dtypes.float64 in self.info.supported_dtypes)
        self.build_options = build_options(cl_device)
        self._context: Any = None
        self._queue: Any = None
        self._transfer_queue: Any = None
        self._built: ProgramTable[str, Any] = ProgramTable()  # source -> cl.Program, least recently used dropped
        self._unlaunched: ProgramTable[str, Path] = ProgramTable()  # source -> its cache entry, written after a launch
        self._programs: ProgramTable[tuple[str, str], OpenCLProgram] = ProgramTable()
        self._pool: OpenCLMemoryPool | None = None
        # PoCL keeps source builds and work-group code in its own kernel cache, and asking it for a binary makes it
        # compile every kernel once more (5.6 s for an MLP step's 15): its launched programs are not cached here
        self.caches_launched_binaries = not (cl_device.platform.name.startswith("Portable Computing Language")
                                             and os.environ.get("POCL_KERNEL_CACHE", "1") != "0")
        platform = cl_device.platform
        self._cache_key = "|".join((cl_device.name, cl_device.driver_version, platform.name, platform.version,
                                    " ".join(self.build_options)))

    @property
    def context(self) -> Any:
        if self._context is None:
            self._context = cl.Context([self.cl_device])
        return self._context

    @property
    def queue(self) -> Any:
        if self._queue is None:
            self._queue = cl.CommandQueue(self.context)
        return self._queue

    @property
    def transfer_queue(self) -> Any:
        if self._transfer_queue is None:
            self._transfer_queue = cl.CommandQueue(self.context)
        return self._transfer_queue

    def native_events(self, wait_for: tuple[Event, ...]) -> list[Any] | None:
        """The cl.Events of `wait_for` that belong to this device's context, for a wait list; the others (another
        backend's or another context's) are waited for on the host first."""
        native = []
        for event in wait_for:
            if isinstance(event, OpenCLEvent) and event.context is self._context:
                native.append(event.event)
            else:
                event.wait()
        return native or None

    @property
    def pool(self) -> OpenCLMemoryPool:  # type: ignore[override]
        if self._pool is None:
            self._pool = OpenCLMemoryPool(self)
        return self._pool

    def render(self, kernel: KernelIR) -> str:
        return self.renderer.render(kernel)

    def compile(self, kernel: KernelIR) -> Program:
        return self.compile_many([kernel])[0]

    def compile_many(self, kernels: list[KernelIR]) -> list[Program]:
        """Build the kernels not built yet as one program (PoCL's compiler then starts once, not once a kernel)."""
        sources = [self.render(kernel) for kernel in kernels]
        found: dict[tuple[str, str], OpenCLProgram] = {}  # (a batch larger than the table keeps its programs)
        missing: dict[str, str] = {}  # kernel name -> source, one source per name (a program's names are unique)
        for kernel, source in zip(kernels, sources):
            program = self._programs.get((source, kernel.name))
            if program is not None:
                found[(source, kernel.name)] = program
            elif missing.setdefault(kernel.name, source) != source:
                # another kernel of this name: a program of its own
                found[(source, kernel.name)] = cast(OpenCLProgram, self.compile_many([kernel])[0])
        if missing:
            combined = "\n".join(missing.values())
            built = self.build(combined, for_launch=True)
            path = self._unlaunched.pop(combined)
            first_launches = (FirstLaunches(built, path, set(missing))
                              if path is not None and self.caches_launched_binaries else None)
            local_sizes = {kernel.name: kernel.local_size for kernel in kernels}
            for name, source in missing.items():
                found[(source, name)] = OpenCLProgram(self, built, name, first_launches, local_sizes[name])
                self._programs.put((source, name), found[(source, name)])
        return [found[(source, kernel.name)] for kernel, source in zip(kernels, sources)]

    def build(self, source: str, for_launch: bool = False) -> Any:
        """A built cl.Program of the source: from memory, else the disk cache of binaries, else the compiler.

        A program built from source `for_launch` is written to the disk cache after its first launch (see
        OpenCLProgram), because PoCL freezes a program's binary the first time it is asked for it.
        """
        program = self._built.get(source)
        if program is None:
            program = self._build_cached(source, for_launch)
            self._built.put(source, program)
        return program

    def _build_cached(self, source: str, for_launch: bool) -> Any:
        path = cache.entry_path("opencl", self._cache_key + "\n" + source)
        entry = read_cache_entry(path)
        if entry is not None:
            try:
                program = cl.Program(self.context, [self.cl_device], [entry[0]]).build(options=self.build_options)
                if set(KERNEL_NAME.findall(source)) <= set(program.kernel_names.split(";")):
                    return program
            except Exception:  # noqa: BLE001 - a binary the driver rejects is rebuilt from source, never trusted
                pass
            cache.discard(path)  # refused by the driver, or another program's binary (it lacks these kernels)
        try:
            program = cl.Program(self.context, source).build(options=self.build_options)
        except (cl.RuntimeError, cl.LogicError) as error:
            raise CompileError(f"the OpenCL compiler of {self.name} ({self.cl_device.name.strip()}) rejected a "
                               f"program: {_one_line(error)}\n{error}\n--- source ---\n{source}") from None
        if for_launch:
            self._unlaunched.put(source, path)
        else:
            write_cache_entry(path, program_binary(program), launched=False)
        return program

    def synchronize(self) -> None:
        for queue in (self._queue, self._transfer_queue):
            if queue is not None:
                queue.finish()


KERNEL_NAME = re.compile(r"__kernel\s+void\s+(\w+)\s*\(")  # the kernels a source defines
LAUNCHED, BUILT = b"L", b"B"  # whether the binary was taken after a launch (with the driver's work-group code)


def program_binary(program: Any) -> bytes:
    binaries = program.get_info(cl.program_info.BINARIES)
    return bytes(binaries[0]) if binaries and binaries[0] else b""


def read_cache_entry(path: Path) -> tuple[bytes, bool] | None:
    """(program binary, taken after a launch) of a checked cache entry (ember/cache.py: PoCL crashes on a truncated
    binary, so a corrupt entry is deleted before the driver sees it)."""
    payload = cache.read_entry(path)
    if payload is None or payload[:1] not in (LAUNCHED, BUILT):
        return None
    return payload[1:], payload[:1] == LAUNCHED


def write_cache_entry(path: Path, binary: bytes, launched: bool) -> None:
    if binary:
        cache.write_entry(path, (LAUNCHED if launched else BUILT) + binary)


def build_options(cl_device: Any) -> list[str]:
    """IEEE-exact results like the other backends (no fast math); -w: generated code's warnings are not the user's."""
    options = ["-w"]
    if cl_device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
        options.append("-cl-fp32-correctly-rounded-divide-sqrt")
    return options


def _one_line(error: object, limit: int = 200) -> str:
    return " ".join(str(error).split())[:limit]


def _warp_width(cl_device: Any) -> int:
    """The device's warp (NVIDIA's extension says it; AMD's wavefront is 64); a GPU of another vendor 32 (its
    SIMD width is 8 to 32, and its barriers are cheap, which is what workgroup reductions need); a CPU 1."""
    if not cl_device.type & cl.device_type.GPU:
        return 1
    for name in ("warp_size_nv", "wavefront_width_amd"):
        try:
            width = getattr(cl_device, name)
        except (AttributeError, cl.LogicError, cl.RuntimeError):
            continue
        if width:
            return int(width)
    return 32


def device_info(cl_device: Any) -> DeviceInfo:
    """The capabilities of an OpenCL device as ember's DeviceInfo."""
    extensions = set(cl_device.extensions.split())
    supported = set(dtypes.ALL_DTYPES)
    has_fp64 = "cl_khr_fp64" in extensions or bool(getattr(cl_device, "double_fp_config", 0))
    if not has_fp64:
        supported.discard(dtypes.float64)
    if cl_device.profile == "EMBEDDED_PROFILE" and "cles_khr_int64" not in extensions:
        supported -= {dtypes.int64, dtypes.uint64}
    widths = {name: getattr(cl_device, f"preferred_vector_width_{name}")
              for name in ("char", "short", "int", "long", "half", "float", "double")}
    vectors = opencl_probe.vector_capabilities(cl_device, widths["float"], has_fp64)
    return DeviceInfo(
        compute_units=cl_device.max_compute_units,
        max_global_size=2 ** cl_device.address_bits - 1,
        max_local_size=cl_device.max_work_group_size,
        preferred_local_size=min(LOCAL_SIZE, cl_device.max_work_group_size),
        min_groups_per_unit=GROUPS_PER_UNIT,
        local_memory_bytes=cl_device.local_mem_size,
        warp_width=_warp_width(cl_device),
        preferred_vector_width=vectors["preferred_vector_width"],
        vector_ops=vectors["vector_ops"],
        fallback_vector_widths=vectors["fallback_vector_widths"],
        supported_dtypes=frozenset(supported),
        has_native_exp2=True,
        can_run=True,
        host_cores=bool(cl_device.type & cl.device_type.CPU),
        extra={
            "device": cl_device.name.strip(),
            "platform": cl_device.platform.name.strip(),
            "version": cl_device.version,
            "driver": cl_device.driver_version,
            "global_memory_bytes": cl_device.global_mem_size,
            "max_allocation_bytes": cl_device.max_mem_alloc_size,
            "preferred_vector_widths": widths,
            "cl_khr_fp16": "cl_khr_fp16" in extensions,
            "cl_khr_fp64": has_fp64,
            **vectors.get("extra", {}),
        },
    )


def probe() -> list[Device]:
    """One Device per OpenCL device of every platform, or BackendUnavailable saying what is missing."""
    if cl is None:
        raise BackendUnavailable("pyopencl is not installed (pip install ember[opencl], which also brings PoCL)")
    try:
        platforms = cl.get_platforms()
    except (cl.LogicError, cl.RuntimeError) as error:
        raise BackendUnavailable(f"no OpenCL platform found ({error}); install a driver (ICD) such as PoCL: "
                                 "pip install pocl-binary-distribution, or apt install pocl-opencl-icd") from None
    if not platforms:
        raise BackendUnavailable("no OpenCL platform found; install a driver (ICD) such as PoCL: "
                                 "pip install pocl-binary-distribution, or apt install pocl-opencl-icd")
    found = []
    for platform in platforms:
        try:
            found.extend(platform.get_devices())
        except (cl.LogicError, cl.RuntimeError):
            continue  # a platform without devices
    if not found:
        names = ", ".join(platform.name for platform in platforms)
        raise BackendUnavailable(f"the OpenCL platforms ({names}) have no devices")
    usable, reasons = [], []
    for cl_device in found:  # a device whose compiler builds nothing (or aborts the process) is left out, with why
        try:
            opencl_probe.check_builds(cl_device, build_options(cl_device))
            usable.append(cl_device)
        except BackendUnavailable as error:
            reasons.append(str(error))
    if not usable:
        raise BackendUnavailable("; ".join(reasons))
    return [OpenCLDevice(f"opencl:{number}", cl_device) for number, cl_device in enumerate(usable)]


def _constant_operation_type(node: IRNode) -> str | None:
    """"float" or "double" for a scalar float operation whose operands are all constants (computed at run time, its
    first operand read through a volatile: OPAQUE_HELPERS), else None."""
    if node.width > 1 or not node.srcs or node.op in (IROp.LOAD, IROp.STORE) or not all(
            source.is_const for source in node.srcs):
        return None
    dtype = node.srcs[0].dtype
    return "double" if dtype == dtypes.float64 else "float" if dtype == dtypes.float32 else None
