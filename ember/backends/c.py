"""The `c` backend: kernel IR to C with OpenMP, built by the system C compiler, loaded with ctypes, cached on disk."""

from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import functools
import math
import mmap
import operator
import os
import platform
import shutil
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from ember import cache
from ember.backends.base import COMPLETED, Device, DeviceInfo, Event, MemoryPool, Program, ProgramTable
from ember.backends.disk import map_file_bytes
from ember.backends import launch_group
from ember.backends.c_math import exp2_source, integral_exp2_source, lane_instruction_source
from ember.backends.c_matmul import (
    PARALLEL_PRODUCTS, library_function, library_source, packed_products, render_packed_matmul, shape_values,
)
from ember.backends.launch_group import COLD, GATHERING, MAX_GROUPED_PARAMETERS, WARM, LaunchGroup, runner_source
from ember.backends.host_slabs import MIN_SLOT_BYTES, SLABS
from ember.backends.launch_queue import QUEUE, flush_launches
from ember.capabilities import host_cpu_field
from ember.backends.c_style import (
    MASK_TYPES,
    CStyleRenderer,
    bitcast_helpers,
    lane_dtype,
    used_bitcasts,
    vector_nodes,
)
from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.errors import BackendUnavailable, CompileError, DeviceError, OutOfMemoryError
from ember.core.ops import Op
from ember.backends.render_steps import KernelBody
from ember.ir.ir import IRNode, IROp, KernelIR, topological_nodes
from ember.ir.linearize import Step, linearize
from ember.ir.vectorize import SCALAR_CONDITION, vector_width

# The prelude declares what kernels call instead of including <math.h> and <stdint.h>: their preprocessing was a
# fifth of a compiler run's ~40 ms start-up, paid by each of the ~20 runs of a cold training step (kernels name their
# integer types in plain C: c_style.CStyleRenderer.type_names). Every declaration is the one <math.h> makes, so a
# source that includes <math.h> too still compiles, and gcc treats these functions as its builtins.
C_PRELUDE = """#ifndef EMBER_C_PRELUDE
#define EMBER_C_PRELUDE
float sqrtf(float); double sqrt(double); float truncf(float); double trunc(double);
float exp2f(float); double exp2(double); float log2f(float); double log2(double); float sinf(float); double sin(double);
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif
#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
static inline float ember_bf16_to_float(unsigned short value) {
  union { unsigned int u; float f; } bits; bits.u = ((unsigned int)value) << 16; return bits.f; }
static inline unsigned short ember_float_to_bf16(float value) {
  union { unsigned int u; float f; } bits; bits.f = value;
  if (value != value) return (unsigned short)((bits.u >> 16) | 64);
  return (unsigned short)((bits.u + 0x7FFFu + ((bits.u >> 16) & 1u)) >> 16); }
#endif
"""

# gcc vectorizes loops calling these through glibc's libmvec (x86_64, glibc >= 2.35: AVX2 variants of each)
VECTOR_MATH_DECLARATIONS = "".join(
    f"#pragma omp declare simd notinbranch\n{type_name} {function}({type_name});\n"
    for type_name, suffix in (("float", "f"), ("double", ""))
    for function in (f"exp2{suffix}", f"log2{suffix}", f"sin{suffix}")
)


@functools.cache
def has_vector_math() -> bool:
    """Whether glibc's libmvec has vector variants of exp2/log2/sin for this machine."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # type: ignore[union-attr]
        major, minor = (int(part) for part in version.split(".")[:2])
    except (AttributeError, ValueError, OSError):
        return False
    return name == "glibc" and (major, minor) >= (2, 35)


# libmvec's vector variants by vector bytes: the x86 ISA letter of their names (glibc's vector ABI) and the macro
# gcc defines where that ISA is there
LIBMVEC_ISAS = {32: ("d", "__AVX2__"), 64: ("e", "__AVX512F__")}


def libmvec_variant(scalar: str, vector_bytes: int) -> tuple[str, str] | None:
    """(the macro that must be defined, the libmvec function) computing `scalar` (exp2f, log2, sin, ...) on a vector
    of `vector_bytes`, or None where libmvec has none (then a lane loop, which gcc vectorizes into the same call:
    calling it directly spares gcc vectorizing a loop per call site, ~25% of an attention tile's compile)."""
    if scalar.rstrip("f") not in ("exp2", "log2", "sin") or vector_bytes not in LIBMVEC_ISAS or not has_vector_math():
        return None
    letter, guard = LIBMVEC_ISAS[vector_bytes]
    lanes = vector_bytes // (4 if scalar.endswith("f") else 8)
    return guard, f"_ZGV{letter}N{lanes}v_{scalar}"


# float32 vector math written inline (c_math.py), not called from libmvec: by _math_kind's names
INLINE_MATH = {"exp2": exp2_source, "exp2_integral": integral_exp2_source}


def _math_kind(node: IRNode) -> str:
    """The name of a vector math node's helper: its op's, but for a float32 EXP2 of a TRUNC, exp2_integral."""
    if node.op is Op.EXP2 and node.dtype == dtypes.float32 and node.srcs[0].op is Op.TRUNC:
        return "exp2_integral"
    return node.op.name.lower()


# what CRenderer renders on vectors (gcc's vector extensions, with helpers for MAX, WHERE and math functions)
VECTOR_OPS = frozenset({IROp.LOAD, IROp.REDUCE, IROp.SHUFFLE, Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.NEG, Op.MAX,
                        Op.CMPLT, Op.CMPEQ, Op.WHERE, Op.RECIPROCAL, Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN, Op.TRUNC,
                        Op.CAST, Op.BITCAST, Op.AND, Op.OR, Op.XOR, Op.NOT, Op.SHR, Op.SHL, SCALAR_CONDITION})
# byte lanes converted to float32 lanes through AVX2's (8 lanes) or AVX-512's (16) widening moves (a helper per
# source type and width), else generically
BYTE_CONVERSIONS = {("int8", "float32", 8): "_mm256_cvtepi8_epi32", ("uint8", "float32", 8): "_mm256_cvtepu8_epi32",
                    ("int8", "float32", 16): "_mm512_cvtepi8_epi32", ("uint8", "float32", 16): "_mm512_cvtepu8_epi32"}
RENDERED_KEPT = 256  # sources of the kernels rendered last, kept for compile_many after compile_quick
SPIN_COUNT = "20000"  # how long idle OpenMP threads spin before they sleep, unless the environment says (probe)
PARALLEL_THRESHOLD = 1 << 15  # estimated operations below which a kernel runs on one thread
# estimated operations from which a kernel below PARALLEL_THRESHOLD runs on every core where the launch before it in
# a run of launches did (`warm_parallel`): its threads still spin, so splitting costs ~1 us, not a wake-up of ~60
WARM_THRESHOLD = 1 << 13
# an integer sum's loop counts 1/INTEGER_LOOP_SHARE of its iterations: gcc vectorizes it, but each iteration picks
# bits, multiplies and adds (at 16, a token's 1024 x 640 Q5_0 product ran on one thread: 55 us, 34 us on two)
INTEGER_LOOP_SHARE = 2


class CRenderer(CStyleRenderer):
    """C with OpenMP: the parallel axis is a `for` loop split across threads (all cores, or `threads`)."""

    language = "C"

    def __init__(self, threads: int | None = None, vector_math: bool = False) -> None:
        super().__init__()
        self.threads = threads
        self.use_libmvec = vector_math  # declare libmvec's variants of exp2/log2/sin (see has_vector_math)
        self.vector_expressions[Op.SHR] = self.vector_shift_right
        # (C has no `!` on vectors; a bool vector is a mask of all-ones lanes, which `~` negates as `!` does scalars)
        self.vector_expressions[Op.NOT] = lambda node, operand: f"(~{operand(node.srcs[0])})"
        self.vector_expressions[IROp.SHUFFLE] = self.vector_shuffle
        # per thread (kernels render in several threads): whether the kernel being rendered is a shape class's, and
        # its loops that only sum floats (simd_sum_loops), found once per kernel
        self._rendering = threading.local()

    def render(self, kernel: KernelIR) -> str:
        if kernel.packed is not None:  # a plain matmul as packed panels (ir/packed_matmul.py)
            parameters = [self.parameter(param.dtype, param.position, param.is_output) for param in kernel.params]
            return C_PRELUDE + render_packed_matmul(kernel, parameters, self.threads)
        class_kernel = kernel.size_parameter is not None
        self._rendering.class_kernel = class_kernel
        self._rendering.simd_sums = simd_sum_loops(kernel) if class_kernel else {}
        try:
            return super().render(kernel)
        finally:
            self._rendering.class_kernel, self._rendering.simd_sums = False, {}

    def signature(self, kernel: KernelIR, parameters: list[str]) -> str:
        """The function's signature; a kernel that allows it has gcc's loop if-conversion back (IF_CONVERTED, which
        compiler_command turns off for every kernel: `if_convertible`)."""
        if warm_parallel(kernel):  # (a last argument: whether the threads are awake, set per launch)
            parameters = [*parameters, "const int* restrict ember_warm"]
        signature = super().signature(kernel, parameters)
        return f"{IF_CONVERTED} {signature}" if if_convertible(kernel) else signature

    def prelude(self, kernel: KernelIR) -> str:
        # every helper is guarded, so several kernels can be compiled as one source (see CDevice.compile_many)
        helpers = ["#ifndef EMBER_VECTOR_MATH\n#define EMBER_VECTOR_MATH\n" + VECTOR_MATH_DECLARATIONS + "#endif"
                   ] if self.use_libmvec else []
        for line in bitcast_helpers(self.type_names, used_bitcasts(kernel.sink)).splitlines():
            guard = "EMBER_" + line.split("(", 1)[0].split()[-1].upper()
            helpers.append(f"#ifndef {guard}\n#define {guard}\n{line}\n#endif")
        helpers.extend(self.vector_helpers(kernel))
        return C_PRELUDE + "\n".join(helpers)

    # ---- vectors: gcc's vector extensions (lane-wise operators, [] for a lane, casts between same-size vectors
    # keep the bits); loads and stores go through a 4-byte-aligned type, so any index works --------------------

    def vector_type(self, dtype: DType, width: int) -> str:
        return f"ember_{dtype.name}x{width}"

    def vector_build(self, lanes: list[str], dtype: DType, width: int) -> str:
        return f"(({self.vector_type(dtype, width)}){{{','.join(lanes)}}})"

    def vector_lane(self, vector: str, lane: int, width: int) -> str:
        return f"{vector}[{lane}]"

    def vector_load(self, buffer: str, index: str, node: IRNode) -> str:
        return f"(*(const {self.vector_type(node.dtype, node.width)}_u*)({buffer}+{index}))"

    def vector_store(self, buffer: str, index: str, value: str, node: IRNode) -> str:
        return f"*({self.vector_type(node.dtype, node.width)}_u*)({buffer}+{index}) = {value}"

    def local_declaration(self, name: str, dtype: DType, size: int) -> str:
        return f"{self.type_name(dtype)} {name}[{size}] __attribute__((aligned(64)))"

    def vector_cast(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        source = node.srcs[0].dtype
        if (source.name, node.dtype.name, node.width) in BYTE_CONVERSIONS:
            return f"ember_convert_{source.name}x{node.width}_float32x{node.width}({operand(node.srcs[0])})"
        return f"__builtin_convertvector({operand(node.srcs[0])}, {self.vector_type(node.dtype, node.width)})"

    def vector_bitcast(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        return f"(({self.vector_type(node.dtype, node.width)})({operand(node.srcs[0])}))"

    def vector_shuffle(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        """Lanes picked from one or two vectors (IROp.SHUFFLE) by gcc's __builtin_shuffle (clang's, and gcc 12's,
        __builtin_shufflevector where the compiler is not gcc); a -1 pick is a lane of zero bits."""
        mask = self.vector_type(MASK_TYPES[node.dtype.itemsize], node.width)
        sources = [operand(source) for source in node.srcs]
        if len(sources) == 1:
            sources.append(sources[0])
        picks = [max(pick, 0) for pick in node.arg]
        if _is_gcc(os.environ.get("CC", "cc")):
            picked = f"__builtin_shuffle({sources[0]}, {sources[1]}, ({mask}){{{','.join(map(str, picks))}}})"
        else:
            picked = f"__builtin_shufflevector({sources[0]}, {sources[1]}, {', '.join(map(str, picks))})"
        if all(pick >= 0 for pick in node.arg):
            return picked
        kept = ",".join("-1" if pick >= 0 else "0" for pick in node.arg)
        return f"(({self.vector_type(node.dtype, node.width)})(({mask}){picked} & ({mask}){{{kept}}}))"

    def vector_maximum(self, operands: list[str], node: IRNode) -> str:
        return f"ember_max_{node.dtype.name}x{node.width}({operands[0]}, {operands[1]})"

    def vector_shift_right(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        """Bytes shifted right by one amount for every lane (`_uniform_byte_shift`) through a helper that shifts
        16-bit words and masks the bits that crossed from the higher byte; other shifts as C's `>>`."""
        amount = _uniform_byte_shift(node)
        if amount is None:
            return self.vector_alu_expression(node, operand)
        return f"ember_shr_uint8x{node.width}({operand(node.srcs[0])}, {operand(amount)})"

    def vector_select(self, operands: list[str], node: IRNode) -> str:
        if node.srcs[0].width == 1:  # one condition for every lane (vectorize.SCALAR_CONDITION): C's ?: on vectors
            return f"({operands[0]}?{operands[1]}:{operands[2]})"
        return f"ember_select_{node.dtype.name}x{node.width}({', '.join(operands)})"

    def vector_math(self, operands: list[str], node: IRNode) -> str:
        return f"ember_{_math_kind(node)}_{node.dtype.name}x{node.width}({operands[0]})"

    def vector_helpers(self, kernel: KernelIR) -> list[str]:
        """typedefs of the vector types a kernel uses, and the helpers for its vector MAX, WHERE and math."""
        types: dict[str, tuple[DType, int]] = {}
        functions: set[tuple[str, DType, int]] = set()
        for node in vector_nodes(kernel.sink):
            dtype = lane_dtype(node)
            types[self.vector_type(dtype, node.width)] = (dtype, node.width)
            if node.op is Op.MAX or (node.op is IROp.REDUCE and node.arg is Op.REDUCE_MAX):
                functions.add(("max", dtype, node.width))
            elif node.op is Op.WHERE:
                functions.add(("select", dtype, node.width))
            elif node.op in self.math_functions:
                functions.add((_math_kind(node), dtype, node.width))
            elif node.op is Op.CAST and (node.srcs[0].dtype.name, dtype.name, node.width) in BYTE_CONVERSIONS:
                functions.add(("convert", node.srcs[0].dtype, node.width))
            elif node.op is Op.SHR and _uniform_byte_shift(node) is not None:
                functions.add(("shr", dtype, node.width))
            elif node.op is IROp.SHUFFLE:  # (its picks are a vector of the mask type)
                mask = MASK_TYPES[dtype.itemsize]
                types[self.vector_type(mask, node.width)] = (mask, node.width)
        for kind, dtype, width in functions:
            if kind in ("max", "select") or (kind in INLINE_MATH and dtype == dtypes.float32):  # (the mask type)
                mask = MASK_TYPES[dtype.itemsize]
                types[self.vector_type(mask, width)] = (mask, width)
        lines = []
        for name, (dtype, width) in sorted(types.items()):
            size = dtype.itemsize * width
            lines.append(f"#ifndef {name.upper()}\n#define {name.upper()}\n"
                         f"typedef {self.type_name(dtype)} {name} __attribute__((vector_size({size})));\n"
                         f"typedef {self.type_name(dtype)} {name}_u __attribute__((vector_size({size}), "
                         f"aligned({dtype.itemsize})));\n#endif")
        for kind, dtype, width in sorted(functions, key=lambda item: (item[0], item[1].name, item[2])):
            vector = self.vector_type(dtype, width)
            mask_vector = self.vector_type(MASK_TYPES[dtype.itemsize], width)
            function = f"ember_{kind}_{dtype.name}x{width}"
            if kind == "convert":  # bytes to float32 lanes: gcc 12 converts a vector load lane by lane itself
                float_vector = self.vector_type(dtypes.float32, width)
                extend = BYTE_CONVERSIONS[(dtype.name, "float32", width)]
                function = f"ember_convert_{dtype.name}x{width}_float32x{width}"
                if width == 8:
                    guard, convert = "__AVX2__", (f"long long bits; __builtin_memcpy(&bits, &v, 8); return ({float_vector})"
                                                  f"_mm256_cvtepi32_ps({extend}(_mm_cvtsi64_si128(bits)));")
                else:
                    guard, convert = "__AVX512F__", (f"__m128i bytes; __builtin_memcpy(&bytes, &v, 16); return "
                                                     f"({float_vector})_mm512_cvtepi32_ps({extend}(bytes));")
                body = (f"#if defined({guard})\n#include <immintrin.h>\nstatic inline {float_vector} {function}({vector} v) {{"
                        f" {convert} }}\n#else\nstatic inline {float_vector} {function}("
                        f"{vector} v) {{ return __builtin_convertvector(v, {float_vector}); }}\n#endif")
            elif kind == "shr":  # x86 has no byte shifts: gcc widened each half to words, shifted and packed them
                body = (f"static inline {vector} {function}({vector} v, unsigned char amount) {{ typedef unsigned "
                        f"short words __attribute__((vector_size({width}))); return ({vector})((words)v >> amount) & "
                        f"(unsigned char)(0xFF >> amount); }}")
            elif kind == "max":  # NaN-propagating, like the scalar MAX
                body = (f"static inline {vector} {function}({vector} a, {vector} b) {{ {mask_vector} take = "
                        f"(a > b) | (a != a); return ({vector})((take & ({mask_vector})a) | (~take & ({mask_vector})b)); }}")
            elif kind in INLINE_MATH and dtype == dtypes.float32:
                body = INLINE_MATH[kind](function, vector, mask_vector, width)
            elif kind == "select":
                body = (f"static inline {vector} {function}({mask_vector} take, {vector} a, {vector} b) {{"
                        f" return ({vector})((take & ({mask_vector})a) | (~take & ({mask_vector})b)); }}")
            else:  # gcc turns the lane loop into one instruction (sqrt, trunc) or a libmvec call (exp2, log2, sin)
                scalar = self.math_function(Op[kind.upper()], dtype)
                body = (f"static inline {vector} {function}({vector} x) {{ {vector} r;"
                        f" for (int lane = 0; lane < {width}; lane++) r[lane] = {scalar}(x[lane]); return r; }}")
                if dtype == dtypes.float32:  # (trunc and sqrt: one instruction where the builtin is there)
                    body = lane_instruction_source(kind, function, vector, width, body)
                variant = libmvec_variant(scalar, dtype.itemsize * width)
                if variant is not None:
                    guard, symbol = variant
                    body = (f"#if defined({guard})\n{vector} {symbol}({vector});\nstatic inline {vector} {function}("
                            f"{vector} x) {{ return {symbol}(x); }}\n#else\n{body}\n#endif")
            lines.append(f"#ifndef {function.upper()}\n#define {function.upper()}\n{body}\n#endif")
        return lines

    def open_loop(self, body: KernelBody, node: IRNode) -> None:
        """A loop; in a shape class's kernel, a loop that only sums floats into scalar accumulators is vectorized by
        gcc under `omp simd reduction` (the class's untiled kernel is otherwise a chain of dependent additions: a
        generation loop's class matmuls ran 10x slower than the tiled kernels of each size)."""
        sums = self._rendering.simd_sums.get(id(node))
        if sums:
            body.line(f"#pragma omp simd reduction(+:{', '.join(body.names[id(total)] for total in sums)})")
        super().open_loop(body, node)

    def load_expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        """A load; in a shape class's kernel, an element at a loop's counter plus an offset reads `(buffer +
        offset)[counter]`: the int32 sum wraps in C (it is computed unsigned), so gcc could not tell its elements
        are consecutive and gathered them one by one. (The element is one the member's view reads, inside its buffer:
        the sum does not wrap.)"""
        index = node.srcs[1]
        if (node.width == 1 and index.op is Op.ADD and self._rendering.class_kernel and
                any(source.op is IROp.RANGE for source in index.srcs)):
            counter = index.srcs[0] if index.srcs[0].op is IROp.RANGE else index.srcs[1]
            offset = index.srcs[1] if counter is index.srcs[0] else index.srcs[0]
            load = f"({operand(node.srcs[0])}+{operand(offset)})[{operand(counter)}]"
            if len(node.srcs) == 3:
                return f"({operand(node.srcs[2])}?{load}:{self.constant(0, node.dtype)})"
            return load
        return super().load_expression(node, operand)

    def global_loop_open(self, kernel: KernelIR, index_type: str) -> list[str]:
        work = kernel.global_size * max(1, _loop_work(kernel))
        threads = f" num_threads({self.threads})" if self.threads else ""
        simd = " simd" if simd_work_items(kernel) else ""
        parallel = f"#pragma omp parallel for{simd} schedule(static){threads}"
        if kernel.size_parameter is not None:  # work known at launch: threads only for enough of it, as below
            estimate = " * ".join(["(long long)work", *_runtime_loop_sizes(kernel)])
            # (`if(parallel: ...)`: a plain `if` applies to the simd construct too, which ran the loop scalar on
            # every launch below the threshold: a 64 x 128 relu gradient took 5 us instead of 1)
            parallel = (f"const {index_type} work = {self.global_bound(kernel)};\n"
                        f"  #pragma omp parallel for{simd} schedule(static){threads} "
                        f"if(parallel: {estimate} >= {PARALLEL_THRESHOLD})")
            return [f"  {parallel}", f"  for ({index_type} gid = 0; gid < work; gid++) {{"]
        pragma = f"  {parallel}" if work >= PARALLEL_THRESHOLD else \
            f"  {parallel} if(parallel: *ember_warm)" if warm_parallel(kernel) else ""
        return [pragma, f"  for ({index_type} gid = 0; gid < {kernel.global_size}; gid++) {{"]

    def global_loop_close(self) -> list[str]:
        return ["  }"]


def warm_parallel(kernel: KernelIR) -> bool:
    """Whether a kernel runs on every core when its launch says the threads are awake (a last argument, the address
    of WARM or COLD): a kernel of fixed sizes whose estimated work is from WARM_THRESHOLD to below PARALLEL_THRESHOLD.
    Below PARALLEL_THRESHOLD a launch after an idle wait runs on one thread (a sleeping thread takes ~60 us to wake on
    this VM: a decode step's small kernels); right after a launch on every core (the launch queue's and a replay's
    joined runs: launch_queue.py, JoinedCLaunches) its threads still spin, and an LSTM step's gate activations over
    64 x 512 took 20 -> 14 us, their gradients 20 -> 12 us."""
    if kernel.size_parameter is not None or kernel.packed is not None or kernel.global_size < 2:
        return False
    return WARM_THRESHOLD <= kernel.global_size * max(1, _loop_work(kernel)) < PARALLEL_THRESHOLD


def simd_work_items(kernel: KernelIR) -> bool:
    """Whether a kernel's parallel loop is also an `omp simd` loop, its work items computed in gcc's vector lanes: a
    scalar kernel (no vector of ember's: a shape class's, whose sizes are known at launch only, or one the vectorizer
    left alone) with no loop of its own and nothing that blocks if-conversion (`if_convertible`). gcc 12 vectorizes no
    loop that OpenMP outlined for its threads unless told: relu(x + bias) over a shape class's 1M floats ran scalar
    in 3.0 ms, in 0.26 ms as a simd loop (its work items are independent, as `parallel for` needs)."""
    nodes = topological_nodes(kernel.sink)
    if any(node.op in (IROp.RANGE, IROp.LOOP) or node.width > 1 for node in nodes):
        return False
    return not any(_blocks_if_conversion(node) for node in nodes)


def simd_sum_loops(kernel: KernelIR) -> dict[int, list[IRNode]]:
    """The innermost loops (by RANGE node id) whose statements only compute values and add them into scalar float
    accumulators, each with those accumulators' REDUCE nodes: no store, no nested loop, no other reduce. Their sums
    may be split into lanes (each lane starts from +0.0, as torch's sums do) and added up at the loop's end."""
    found: dict[int, list[IRNode]] = {}
    open_loops: list[tuple[IRNode, list[IRNode], list[bool]]] = []  # (loop, its sums, [whether it still qualifies])
    for kind, node in linearize(kernel.sink):
        if kind is Step.LOOP:
            if open_loops:
                open_loops[-1][2][0] = False
            open_loops.append((node, [], [True]))
        elif kind is Step.END_LOOP:
            loop, sums, qualifies = open_loops.pop()
            if qualifies[0] and sums:
                found[id(loop)] = sums
        elif open_loops and kind is not Step.VALUE:
            simple_sum = (kind is Step.UPDATE_ACC and node.arg is Op.SUM and node.width == 1 and node.dtype.is_float)
            if simple_sum:
                open_loops[-1][1].append(node)
            else:
                open_loops[-1][2][0] = False
    return found


def _uniform_byte_shift(node: IRNode) -> IRNode | None:
    """The scalar amount of a right shift of uint8 lanes that shifts every lane by the same amount (a vector built
    from one scalar: a block's bits picked by a loop's shift), or None. Amounts are below 8 here, as `>>` on bytes
    guards them (and ember.io.quantized's bare shifts' are); the helper gives 0 for 8 to 15 too."""
    amount = node.srcs[1] if len(node.srcs) == 2 else None
    if node.dtype != dtypes.uint8 or node.width < 2 or node.width % 2 or amount is None:
        return None
    if amount.op is not IROp.VECTORIZE or any(lane is not amount.srcs[0] for lane in amount.srcs):
        return None
    return amount.srcs[0] if amount.srcs[0].dtype == dtypes.uint8 and amount.srcs[0].width == 1 else None


def _runtime_loop_sizes(kernel: KernelIR) -> list[str]:
    """The size of every loop of a shape class's kernel as C: a size read at launch as its element of the sizes
    parameter (the loops' sizes are such loads or constants), another as its number."""
    sizes = []
    for node in topological_nodes(kernel.sink):
        if node.op is IROp.RANGE:
            load = node.srcs[0] if node.srcs else None
            if load is not None and load.op is IROp.LOAD and load.srcs[1].is_const:
                sizes.append(f"data{load.srcs[0].arg[0]}[{int(load.srcs[1].arg)}]")
            else:
                sizes.append(str(node.arg[1]))
    return sizes


def _loop_work(kernel: KernelIR) -> int:
    """The loop iterations of a work item, times 2 for 16-lane vectors, times the stores of a work item's tile: a
    rough count of operations per work item, in the 8-lane vectors PARALLEL_THRESHOLD was tuned with (a 16-lane
    kernel has half the work items of an 8-lane one; a work item storing a row of 16 scalars, a phase interleaving's,
    does 16 items' work: 16384 of them ran on one thread, 0.6 ms). A loop of an integer sum counts its size /
    INTEGER_LOOP_SHARE: gcc vectorizes it. Loops one after another add and nested loops multiply (`_loop_nests`):
    a softmax row's three loops of 128 are 384 iterations, not 128 ** 3 (which ran a decode step's 4-row softmax,
    14 us, on two threads: a wake-up of the second thread per launch, ~1 ms on a busy machine)."""
    nodes = topological_nodes(kernel.sink)
    integer_loops = {id(loop) for node in nodes if node.op is IROp.REDUCE and node.dtype.is_int
                     for loop in node.srcs[1:]}
    loops = sum(math.prod(max(1, node.arg[1] // INTEGER_LOOP_SHARE) if id(node) in integer_loops else node.arg[1]
                          for node in nest)
                for nest in _loop_nests(nodes))
    stores = sum(1 for node in nodes if node.op is IROp.STORE)
    return max(1, loops) * max(1, vector_width(kernel) // 8) * max(1, stores) * _heaviness(nodes)


# what a math op costs against an addition, roughly, in the per-item weight of `_heaviness`
MATH_WEIGHTS = {Op.EXP2: 8, Op.LOG2: 8, Op.SIN: 12, Op.DIV: 4, Op.SQRT: 4, Op.RECIPROCAL: 4}
LIGHT_ITEM_WEIGHT = 8  # the weight of a light work item (its loads, index arithmetic, a few ops and its store)


def _heaviness(nodes: Sequence[IRNode]) -> int:
    """How many light work items one of this kernel's work items weighs (at least 1): its ALU nodes, math ops by
    MATH_WEIGHTS, over LIGHT_ITEM_WEIGHT. The expm1-based tanh of 32,768 floats (exp2 twice, log2 and a division a
    16-lane item) ran its 2,048 items on one thread in 73 us, on two in 41."""
    weight = sum(MATH_WEIGHTS.get(node.op, 1) for node in nodes if isinstance(node.op, Op))
    return max(1, weight // LIGHT_ITEM_WEIGHT)


def _loop_nests(nodes: Sequence[IRNode]) -> list[list[IRNode]]:
    """The nests of loops a work item runs (topologically ordered nodes): for each reduce, loop statement and store,
    the RANGE nodes it runs inside (its own loops and the open loops its operands use; a reduce's or a loop
    statement's own loops are closed after it), less the nests inside another."""
    open_loops: dict[int, frozenset[IRNode]] = {}
    nests: set[frozenset[IRNode]] = set()
    for node in nodes:
        used = frozenset().union(*(open_loops.get(id(source), frozenset()) for source in node.srcs))
        if node.op is IROp.RANGE:
            used = used | {node}
        if node.op in (IROp.REDUCE, IROp.LOOP):
            own = frozenset(source for source in node.srcs[1:] if source.op is IROp.RANGE)
            nests.add(used | own)
            used = used - own
        elif node.op is IROp.STORE:
            nests.add(used)
        open_loops[id(node)] = used
    return [sorted(nest, key=lambda loop: loop.arg[0]) for nest in nests
            if nest and not any(nest < other for other in nests)]


class HostArray(np.ndarray):
    """A numpy byte array that knows its address, read once when it is created (numpy's `.ctypes.data` costs a few
    microseconds at every launch)."""

    address: int


class PoolArray(HostArray):
    """A HostArray the pool made (HostMemoryPool.create_buffer): its memory starts at a multiple of BUFFER_ALIGNMENT,
    inside a plain numpy array a little larger (its base)."""


class MappedHostArray(HostArray):
    """A HostArray over a private (copy-on-write) mapping of a file region: never kept for reuse once released."""


# where a buffer's memory starts: a cache line, the width of AVX-512's vectors (numpy aligns to 16 bytes, so every
# 64-byte load or store of a row split two cache lines)
BUFFER_ALIGNMENT = 64
MAX_SMALL_BUFFER_BYTES = 1 << 16  # released buffers up to this size are kept for the next of their size ...
# ... this many of each size (an RNN step's backward frees ~60 buffers of one size; at 16 a char_lstm step made
# 50 new ones, 3-5 us each, at 64 two) ...
SMALL_BUFFERS_KEPT = 64
MAX_SMALL_BYTES_KEPT = 1 << 24  # ... and this many bytes in all


class HostMemoryPool(MemoryPool):
    """Host memory held in numpy byte arrays (so copies are numpy copies). Released large buffers are kept for reuse
    (base.MemoryPool's policy, up to an eighth of the machine's memory): the system hands out fresh pages, whose
    first touch cost as much as the kernel writing them (softmax over 4096x4096: 47 against 40 ms). Released small
    buffers are kept too, a few of each size, for the next allocation of that size (about 1 us, a tenth of an op)."""

    # every buffer past the small ones destroy_buffer keeps is kept by the reuse policy: from 64 KiB to 1 MiB (base's
    # MIN_REUSABLE_BYTES) none was, and each came back as fresh pages, faulted in by the kernel writing it (8 ops on
    # 512 KiB tensors with their intermediates alive: 1.9 -> 0.7-1.1 ms; a fault cost ~5 us on this VM)
    min_reusable_bytes = MAX_SMALL_BUFFER_BYTES + 1

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._small: dict[int, list[HostArray]] = {}  # released small buffers by size (destroy_buffer)
        self._small_bytes = 0
        try:
            self.reuse_budget_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8
        except (ValueError, OSError, AttributeError):  # a system that does not say: a budget of 256 MiB
            self.reuse_budget_bytes = 1 << 28

    def create_buffer(self, nbytes: int) -> np.ndarray:
        kept = self._small.get(nbytes)
        if kept:
            try:  # (another thread may have taken the last one since the test)
                handle = kept.pop()
            except IndexError:
                pass
            else:
                self._small_bytes -= nbytes
                return handle
        if nbytes >= MIN_SLOT_BYTES and SLABS.advise:  # (in huge pages: host_slabs.py)
            try:
                slot, address = SLABS.carve(nbytes)
            except OSError as error:  # (the system would not map more memory)
                raise OutOfMemoryError(f"memory pool {self.name}: the system could not map {nbytes} bytes for a "
                                       f"buffer ({error.strerror or error}); free tensors you no longer need, or "
                                       "use ember.memory_budget") from error
            array = np.ndarray.__new__(PoolArray, nbytes, np.uint8, slot, 0)
            array.address = address
            return array
        memory = np.empty(nbytes + BUFFER_ALIGNMENT - 1, np.uint8)
        # (a third of `.ctypes.data`'s time; a numpy array is a writable buffer, which typeshed does not know)
        start = ctypes.addressof(ctypes.c_char.from_buffer(memory))  # type: ignore[arg-type]
        offset = -start % BUFFER_ALIGNMENT
        array = np.ndarray.__new__(PoolArray, nbytes, np.uint8, memory, offset)
        array.address = start + offset
        return array

    def destroy_buffer(self, handle: Any) -> None:
        """Keep a small buffer this pool made for the next one of its size (the per-op path allocates one every
        op); let the rest go to numpy. The scheduler releases a c buffer only once its commands are done."""
        nbytes = handle.nbytes
        if nbytes <= MAX_SMALL_BUFFER_BYTES and handle.__class__ is PoolArray:
            kept = self._small.get(nbytes)
            if kept is None:
                kept = self._small[nbytes] = []
            if len(kept) < SMALL_BUFFERS_KEPT and self._small_bytes + nbytes <= MAX_SMALL_BYTES_KEPT:
                kept.append(handle)
                self._small_bytes += nbytes
                return
        if QUEUE.addresses:  # (a held launch may still use it: held until the queue runs)
            QUEUE.note_released(nbytes)

    def _keep_or_destroy(self, handle: Any, nbytes: int) -> None:
        if isinstance(handle, MappedHostArray):
            return  # the mapping goes when its last view is gone; its pages are the file's, not for reuse
        super()._keep_or_destroy(handle, nbytes)

    def map_in_place(self, path: str, offset: int, nbytes: int) -> np.ndarray | None:
        """A private copy-on-write mapping of the region: kernels read the file's pages in place (the page cache,
        shared with other processes), and a write, were one ever made, changes only this process's copy."""
        if nbytes <= 0:
            return None
        try:
            data, _, _ = map_file_bytes(path, offset, nbytes, mmap.ACCESS_COPY)
        except DeviceError:
            return None  # not the file it was: the caller copies
        array = data.view(MappedHostArray)
        array.address = array.ctypes.data
        return array

    # (the host touches memory here: the held launches of an eager program run first, launch_queue.py)
    def copy_in(self, handle: np.ndarray, source: memoryview) -> None:
        flush_launches()
        handle[: len(source)] = np.frombuffer(source, dtype=np.uint8)

    def copy_out(self, destination: memoryview, handle: np.ndarray) -> None:
        flush_launches()
        np.frombuffer(destination, dtype=np.uint8)[:] = handle[: len(destination)]

    # copies to and from another pool are synchronous memcpys (the base class's *_async): a worker thread would
    # take a core from the OpenMP kernels for a copy that runs at memory speed; the copy's event is COMPLETED
    def host_view(self, handle: np.ndarray, nbytes: int) -> memoryview:
        flush_launches()
        return handle[:nbytes].data

    view_alignment = 16  # as numpy aligns its arrays (the kernels need only element alignment; views at a 64-byte
    # boundary ran char_lstm, vae and tabular_mlp no faster, and a decode's boxes of 11 logits took 16 shape classes)

    def view(self, handle: np.ndarray, offset: int, nbytes: int) -> np.ndarray:
        view = handle[offset:offset + nbytes].view(HostArray)  # the slice keeps the buffer's array alive
        view.address = handle.ctypes.data + offset
        return view

    @staticmethod
    def pointer(handle: np.ndarray) -> int:
        return handle.ctypes.data


_address = operator.attrgetter("address")  # a HostArray's address


class CProgram(Program):
    """A kernel of a loaded library, called through ctypes (which releases the GIL while it runs). With `group`
    (its device's launch group, launch_group.py) and `threads` (the cores it occupies), a launch of a one-thread
    kernel while the executor gathers may be held and run beside others."""

    def __init__(self, library: ctypes.CDLL, name: str, parameter_count: int, group: LaunchGroup | None = None,
                 threads: int = 0, warm: bool = False) -> None:
        self.library = library  # keeps the shared library loaded
        self.function = getattr(library, name)
        self.function.argtypes = [ctypes.c_void_p] * (parameter_count + warm)
        self.function.restype = None
        self.address = _function_pointer(self.function)
        self.group = group
        self.threads = threads
        # a kernel that runs on every core when its launch's last argument is WARM (warm_parallel): the launch
        # queue and a joined run pass WARM after a launch on every core; alone it is passed COLD
        self.warm = warm
        self.seconds = 0.0  # how long its last run took while the executor gathered (0: not measured yet)

    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        if GATHERING.active and self.group is not None:
            if self.threads == 1 and not self._short():
                pointers = self.pointers(buffers)
                return self._gathered(pointers, (ctypes.c_void_p * len(pointers))(*pointers),
                                      [_memory(handle) for handle in buffers], wait_for, buffers)
            if self.group.held:  # (a launch not held runs after what is held: it may reuse memory they read)
                self.group.run()
        for event in wait_for:
            event.wait()
        queue = QUEUE
        if queue.active and self.group is not None and queue.thread == threading.get_ident() and \
                queue.hold(self, self.pointers(buffers), buffers):
            return COMPLETED  # (held: it runs in order before anything else touches memory, launch_queue.py)
        self._call(buffers)
        return COMPLETED

    def _call(self, buffers: list[Any]) -> None:
        """Run the kernel on `buffers` now."""
        if self.warm:
            self.function(*self.pointers(buffers))
            return
        try:
            self.function(*map(_address, buffers))  # (map: no comprehension frame on the per-op path)
        except AttributeError:  # an array this pool did not create (the arguments fail before the call)
            self.function(*[handle.ctypes.data for handle in buffers])

    def pointers(self, buffers: list[Any]) -> list[int]:
        """The arguments of the kernel's function for a launch on `buffers`: their addresses (and COLD for a
        kernel that reads whether its threads are awake)."""
        try:
            pointers = list(map(_address, buffers))  # (the pool's arrays carry theirs: a launch queued per op)
        except AttributeError:  # an array this pool did not create
            pointers = [_pointer(handle) for handle in buffers]
        if self.warm:
            pointers.append(COLD)
        return pointers

    def runs_parallel(self, pointers: list[int]) -> bool:
        """Whether a launch of this kernel with `pointers` runs on more than one thread."""
        return self.threads > 1 or (self.warm and pointers[-1] == WARM)

    def _short(self) -> bool:
        """Whether a launch while the executor gathers runs directly, untimed: the kernel's last run was too short
        to hold it and the group holds nothing (else the group decides, and runs what it holds first)."""
        group = self.group
        return 0.0 < self.seconds < launch_group.MIN_GROUPED_SECONDS and group is not None and not group.held

    def _gathered(self, pointers: list[int], arguments: Any, ranges: list[tuple[int, int]],
                  wait_for: tuple[Event, ...], keep_alive: Any) -> Event:
        """A launch of a one-thread kernel while the executor gathers: held in the device's launch group, or run
        now and timed (its time decides whether its next launch is held)."""
        group = self.group
        assert group is not None
        held = group.hold(self, self.function, self.address, arguments, len(pointers), ranges, wait_for, keep_alive)
        if held is not None:
            return held
        for event in wait_for:
            event.wait()
        start = time.perf_counter()
        self.function(*pointers)
        self.seconds = time.perf_counter() - start
        return COMPLETED

    def bind(self, buffers: list[Any], global_size: int) -> Callable[[tuple[Event, ...]], Event]:
        return BoundCLaunch(self, buffers)

    def rebind(self, bound: Any, index: int, handle: Any) -> bool:
        if bound.__class__ is not BoundCLaunch or bound.program is not self:
            return False
        bound.point(index, handle, self.pointer_positions(index))
        return True

    def pointer_positions(self, index: int) -> tuple[int, ...]:
        """Where the address of the launch's buffer `index` is among the function's arguments."""
        return (index,)


class PackedCProgram(CProgram):
    """A packed matmul (ir/packed_matmul.py): a call of its micro-kernel tile's library function (c_matmul.py,
    built once for every matmul shape) with the kernel's sizes and strides, an array of longs this program keeps,
    and the output, A and B."""

    def __init__(self, library: ctypes.CDLL, kernel: KernelIR, group: LaunchGroup | None, threads: int,
                 renderer_threads: int | None) -> None:
        packed = kernel.packed
        assert packed is not None
        super().__init__(library, library_function(packed), 4, group, threads)
        values = shape_values(packed, renderer_threads)
        self.shape = (ctypes.c_long * len(values))(*values)
        self.shape_address = ctypes.addressof(self.shape)
        self.operands = (0, packed.a, packed.b)

    def pointers(self, buffers: list[Any]) -> list[int]:
        """The library function's arguments: the kernel's sizes and strides, then the output, A and B."""
        return [self.shape_address, *[_pointer(buffers[position]) for position in self.operands]]

    def _call(self, buffers: list[Any]) -> None:
        self.function(*self.pointers(buffers))

    def pointer_positions(self, index: int) -> tuple[int, ...]:
        return tuple(position for position, operand in enumerate(self.operands, start=1) if operand == index)


class BoundCLaunch:
    """A CProgram's launch with fixed buffers (Program.bind): the pointers converted once, and the `void *` array
    the C runner passes (a joined run of them is one call: CDevice.join_launches). It holds the buffers' memory."""

    __slots__ = ("arguments", "buffers", "count", "pointers", "program", "ranges")

    def __init__(self, program: CProgram, buffers: list[Any]) -> None:
        self.program, self.buffers = program, buffers
        self.pointers = program.pointers(buffers)
        self.arguments = (ctypes.c_void_p * len(self.pointers))(*self.pointers)
        self.count = len(self.pointers)
        self.ranges = [_memory(handle) for handle in buffers]

    def point(self, index: int, handle: Any, positions: tuple[int, ...]) -> None:
        """Make buffer `index` `handle`, whose address is the function's arguments at `positions` (CProgram.rebind);
        None holds no buffer there (the arguments keep the last address until the next handle)."""
        self.buffers[index] = handle
        if handle is None:
            self.ranges[index] = (0, 0)
            return
        address = _pointer(handle)
        self.ranges[index] = (address, address + handle.nbytes)
        for position in positions:
            self.pointers[position] = address
            self.arguments[position] = address

    def __call__(self, wait_for: tuple[Event, ...]) -> Event:
        program = self.program
        group = program.group
        if GATHERING.active and group is not None:
            if program.threads == 1 and not program._short():
                return program._gathered(self.pointers, self.arguments, self.ranges, wait_for, self.buffers)
            if group.held:  # (as in CProgram.__call__)
                group.run()
        for event in wait_for:
            event.wait()
        program.function(*self.pointers)
        return COMPLETED


class JoinedCLaunches:
    """Bound launches run one after the other by one call of the C runner's `ember_run_sequence`; while the
    executor gathers (launch_group.py), each is launched alone instead, so that the group may hold it."""

    __slots__ = ("arguments", "count", "counts", "functions", "launches", "runner")

    def __init__(self, runner: Any, launches: list[BoundCLaunch]) -> None:
        self.runner, self.launches, self.count = runner, launches, len(launches)
        parallel = False  # (whether the launch before runs on every core: its threads are awake for the next)
        for launch in launches:
            if launch.program.warm:
                launch.pointers[-1] = launch.arguments[-1] = WARM if parallel else COLD
            parallel = launch.program.runs_parallel(launch.pointers)
        self.functions = (ctypes.c_void_p * self.count)(*[launch.program.address for launch in launches])
        self.arguments = (ctypes.c_void_p * self.count)(*[ctypes.addressof(launch.arguments) for launch in launches])
        self.counts = (ctypes.c_int * self.count)(*[launch.count for launch in launches])

    def __call__(self, wait_for: tuple[Event, ...]) -> Event:
        if GATHERING.active:
            event = COMPLETED
            for launch in self.launches:
                event = launch(wait_for)
                wait_for = ()
            return event
        for event in wait_for:
            event.wait()
        self.runner(self.count, self.functions, self.arguments, self.counts)
        return COMPLETED


def _pointer(handle: Any) -> int:
    """A buffer handle's address."""
    address = getattr(handle, "address", None)
    return handle.ctypes.data if address is None else address


def _memory(handle: Any) -> tuple[int, int]:
    """The address range of a buffer handle's memory."""
    start = _pointer(handle)
    return start, start + handle.nbytes


def _function_pointer(function: Any) -> int:
    """The address of a ctypes function (what the launch group's runner calls)."""
    return ctypes.cast(function, ctypes.c_void_p).value or 0


def kernel_threads(kernel: KernelIR, cores: int) -> int:
    """The cores a kernel's launch occupies, as CRenderer.global_loop_open splits it: one below PARALLEL_THRESHOLD
    estimated operations (its loop runs on one thread) or with one work item, else as many as its work items, at
    most `cores`; every core for a shape class's kernel (its work is known at launch only); for a packed matmul, as
    its source splits it (c_matmul.PARALLEL_PRODUCTS)."""
    if kernel.size_parameter is not None:
        return cores
    if kernel.packed is not None:
        return 1 if packed_products(kernel.packed) < PARALLEL_PRODUCTS else cores
    if kernel.global_size * max(1, _loop_work(kernel)) < PARALLEL_THRESHOLD:
        return 1
    return min(cores, kernel.global_size)


# loop if-conversion for one function (compiler_command turns it off for the rest): a loop of selects vectorizes only
# with it (a row of a softmax's gradient over 87 classes: its exps, a select per element, in vectors of 16 instead of
# scalar calls)
IF_CONVERTED = '__attribute__((optimize("tree-loop-if-convert")))'


def if_convertible(kernel: KernelIR) -> bool:
    """Whether a kernel may have gcc's loop if-conversion (IF_CONVERTED): none of its nodes is a guarded load or a
    comparison with a reduce's result (`_blocks_if_conversion`), found in one walk."""
    return not any(_blocks_if_conversion(node) for node in topological_nodes(kernel.sink))


def compares_with_a_reduce(kernel: KernelIR) -> bool:
    """Whether a kernel tests values for equality with a reduce's result (see `_blocks_if_conversion`)."""
    return any(_compares_with_a_reduce(node) for node in topological_nodes(kernel.sink))


def _blocks_if_conversion(node: IRNode) -> bool:
    """A guarded load (`valid ? data[i] : 0`: the form gcc 12's loop if-conversion miscompiled, compiler_command), or
    an equality test with a reduce's result (an argmax: the maximum of a loop, then the values recomputed in another
    loop compared with it, which needs the loops to compute bit for bit alike: with loop if-conversion gcc
    vectorized one loop (libmvec's log2f) and not the other (libm's), no value equalled the maximum, and the argmax
    was out of range)."""
    return (node.op is IROp.LOAD and len(node.srcs) == 3) or _compares_with_a_reduce(node)


def _compares_with_a_reduce(node: IRNode) -> bool:
    if node.op is not Op.CMPEQ:
        return False
    for source in node.srcs:
        while source.op in (Op.CAST, IROp.GEP) and source.srcs:
            source = source.srcs[0]
        if source.op is IROp.REDUCE:
            return True
    return False


def compiler_command() -> list[str]:
    """The compiler and its flags. No flag changes a value: -fno-trapping-math only drops FP exception flags
    (which lets gcc vectorize truncf), -fno-math-errno only errno. -fno-thread-jumps works around a gcc 12 wrong-code
    bug: its path-based jump threader (pass threadfull2, seen with -fdump-tree-all) proved the masks of a masked max
    reduction false and dropped most of its loads (tests/test_convolution.py::test_adaptive_max_pooling: -inf in
    most outputs). -fno-tree-loop-if-convert works around another: with -fno-trapping-math, gcc 12's loop
    if-conversion summed a concatenation (selects of masked loads, `(mask ? data[i] : 0)`) to a third of its value
    (tests/regressions/test_fuzz_findings.py::test_sum_of_a_concatenation). It costs speed where kernels select:
    the MLP 784-512-10 SGD step went from 7.2 to 12.9 ms (matmul, the elementwise chain and softmax unchanged), so a
    kernel without guarded loads turns it back on for its function (IF_CONVERTED, CRenderer.signature).
    -fschedule-insns -fsched-pressure (scheduling_flags, where the compiler does not target AVX-512): scheduling
    before register allocation, aware of register pressure, keeps a matmul tile's 12 vector accumulators in AVX2's
    16 registers (without it gcc 12 spilled three: half the speed).
    -pipe hands the assembly to the assembler through a pipe instead of a temporary file (the same library, byte
    for byte, built sooner: a cold start runs the compiler several times)."""
    return plain_compiler_command() + list(scheduling_flags())


# scheduling before register allocation costs about a third of a kernel's compile time (gcc 12, -O3) and pays only
# where many vector accumulators compete for registers: kernels without a register tile are built without it
SCHEDULING_FLAGS = ("-fschedule-insns", "-fsched-pressure")


@functools.cache
def scheduling_flags() -> tuple[str, ...]:
    """SCHEDULING_FLAGS where register tiles compete for few vector registers (AVX2's 16); none where the compiler
    targets AVX-512, whose 32 registers hold a tile's 12 accumulators and its operands either way: on an AVX-512
    EPYC, matmuls of 64x64x192 to 1024^3 and the nanoGPT, char_lstm, CNN and ResNet steps ran as fast without them,
    and nanoGPT's cold first step spent 3.27 instead of 3.70 s of compiler CPU."""
    return () if _targets_avx512(os.environ.get("CC", "cc")) else SCHEDULING_FLAGS


# -O1 with the FMA contraction of -O2/-O3 (the pass forming fused multiply-adds runs with -fexpensive-optimizations):
# a third of -O3's compile time, for kernels whose speed -O3 does not change (see build_class)
LIGHT_LEVEL = ("-O1", "-fexpensive-optimizations")
MIN_TILE_ACCUMULATORS = 8  # accumulators (REDUCE nodes) from which a kernel is a tile (with their operands, vector
# accumulators fill most of 16 vector registers)
TILE, SCALAR, LIGHT = "tile", "scalar", "light"  # the build classes (build_class), each its own compiler run ...
MAX_JOINED_NODES = 400  # ... but SCALAR kernels of fewer IR nodes than this in all join the TILE run: a compiler run
# starts in ~25 ms of CPU, what scheduling costs on ~400 nodes


def plain_compiler_command(level: tuple[str, ...] = ("-O3",)) -> list[str]:
    """compiler_command at `level` without SCHEDULING_FLAGS."""
    compiler = os.environ.get("CC", "cc")
    return [compiler, *level, "-pipe", "-march=native", *half_precision_flags(compiler), "-fopenmp", "-fPIC",
            "-shared", "-fno-math-errno", "-fno-trapping-math", "-fno-thread-jumps", "-fno-tree-loop-if-convert"]


def half_precision_flags(compiler: str) -> tuple[str, ...]:
    """-mno-avx512fp16 where `compiler -march=native` targets AVX512-FP16 (Intel's Sapphire Rapids and later): there
    gcc 12's -O3 vectorizer drops a float32 -> float16 -> float32 round trip (a float16 sum cast back to float32
    kept 100,100, not float16's inf). Without the instructions, float16 values are converted with F16C's, as on
    every other x86 CPU, and computed in float32."""
    return ("-mno-avx512fp16",) if "__AVX512FP16__" in compiler_traits(compiler) else ()


def build_class(kernel: KernelIR) -> str:
    """How a kernel is built: TILE (a register tile: at least MIN_TILE_ACCUMULATORS vector accumulators) with
    compiler_command; LIGHT (a tile of at least as many scalar accumulators, which gcc cannot vectorize without
    reordering sums) at LIGHT_LEVEL; SCALAR (the rest) at -O3 without the scheduling flags (gcc's vectorizer ran a
    random number kernel 14x faster than -O1, a scalar convolution 2x). Measured one kernel at a time on one thread
    over the char_lstm and nanoGPT steps' kernels, LIGHT_LEVEL ran the scalar tiles as fast as -O3 with the
    scheduling flags (284 against 309 ms in all) and built them 4-5x sooner. No class changes what a kernel
    computes beyond where gcc fuses a multiply and an add, and each kernel's class is a function of its IR, so a
    kernel gives the same bits in every process. A packed matmul (KernelIR.packed) is a TILE: its micro-kernel's
    accumulators are vectors."""
    if kernel.packed is not None:
        return TILE
    vector_accumulators = scalar_accumulators = 0
    for node in topological_nodes(kernel.sink):
        if node.op is IROp.REDUCE:
            if node.width > 1:
                vector_accumulators += 1
            elif node.dtype.is_float:  # (integer sums are associative: gcc vectorizes them as they are)
                scalar_accumulators += 1
    if vector_accumulators >= MIN_TILE_ACCUMULATORS:
        return TILE
    return LIGHT if scalar_accumulators >= MIN_TILE_ACCUMULATORS else SCALAR


def packed_compiler_command() -> list[str]:
    """The compiler and flags for a packed matmul tile's library (c_matmul.library_source): -O2 with the scheduling
    flags. Its micro-kernel is written in vectors already, so -O3's loop passes add nothing to it: matmuls of
    64x64x256 to 1024^3 ran as fast (2 threads, AVX-512 EPYC, three alternating runs each) and the library built in
    0.16 instead of 0.35 s of CPU, at the front of every cold start that multiplies matrices."""
    return plain_compiler_command(("-O2",)) + list(scheduling_flags())


def class_compiler_command(kind: str) -> list[str]:
    """The compiler and flags for a build class (build_class)."""
    if kind == TILE:
        return compiler_command()
    return plain_compiler_command(("-O3",) if kind == SCALAR else LIGHT_LEVEL)


BACKGROUND_PREFIX = ["nice", "-n", "19"]  # runs a background compile (CDevice.compile_background) at low priority


def quick_compiler_command() -> list[str]:
    """compiler_command at -O0, for programs launched while the optimized ones are built (CDevice.compile_quick):
    values as -O3's but for the fused multiply-adds -O3 contracts (within float tolerance)."""
    return ["-O0" if flag == "-O3" else flag for flag in plain_compiler_command()]


@functools.cache
def native_vector_width() -> int:
    """float32 lanes of the vectors kernels use: 16 where the compiler targets AVX-512 for this machine
    (-march=native defines __AVX512F__: 32 registers of 512 bits, twice the multiply-adds per instruction of AVX2;
    on a Zen 5 core the char_lstm step's matmuls ran ~1.8x faster), else 8. EMBER_C_VECTOR_WIDTH=8 or 16 chooses."""
    chosen = os.environ.get("EMBER_C_VECTOR_WIDTH", "")
    if chosen:
        if chosen not in ("8", "16"):
            raise ValueError(f"EMBER_C_VECTOR_WIDTH must be 8 or 16 (float32 lanes), got {chosen!r}")
        return int(chosen)
    return 16 if _targets_avx512(os.environ.get("CC", "cc")) else 8


def _targets_avx512(compiler: str) -> bool:
    """Whether `compiler -march=native` targets AVX-512F here (compiler_traits)."""
    return "__AVX512F__" in compiler_traits(compiler)


def _is_gcc(compiler: str) -> bool:
    """Whether `compiler` is gcc (it defines __GNUC__, as clang does, but not __clang__)."""
    traits = compiler_traits(compiler)
    return "__GNUC__" in traits and "__clang__" not in traits


TRAIT_MACROS = ("__AVX512F__", "__AVX512FP16__", "__GNUC__", "__clang__")  # what compiler_traits reports


@functools.cache
def compiler_traits(compiler: str) -> frozenset[str]:
    """The macros of TRAIT_MACROS that `compiler -march=native` defines here. Asking costs a compiler run (~20 ms,
    at every process's c probe), so the answer is kept in the disk cache, keyed by the compiler's file and the CPU
    (its model and flags: a virtual machine may hide AVX-512 from a model that has it)."""
    executable = shutil.which(compiler) or compiler
    try:
        stamp = os.stat(executable).st_mtime_ns
    except OSError:
        stamp = 0
    key = f"{executable}|{stamp}|{_cpu_model()}|{_cpu_flags()}|{' '.join(TRAIT_MACROS)}"
    known = cache.load("c-traits", key)
    if known is not None:
        return frozenset(known.decode().split())
    command = [compiler, "-march=native", "-dM", "-E", "-x", "c", os.devnull]
    try:
        macros = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()  # (not kept: the next process asks again)
    found = frozenset(name for name in TRAIT_MACROS if f"#define {name} " in macros)
    cache.store("c-traits", key, " ".join(sorted(found)).encode())
    return found


def math_libraries() -> list[str]:
    """libm, and libmvec where kernels call its vector variants (has_vector_math)."""
    return ["-lmvec", "-lm"] if has_vector_math() else ["-lm"]


def link_libraries() -> list[str]:
    """What a kernel library is linked with. From gcc, without the default libraries (the C library, libpthread,
    libgcc_s: their link took ~8 of a compiler run's ~40 ms): kernels call nothing of libc's but what gcc emits
    itself (memcpy, memset) and the packed matmul's aligned_alloc and free, which the loader finds in the process's
    C library, always loaded; libgcc's helpers are linked statically, OpenMP's runtime by -fopenmp. A library that
    still misses a symbol does not load, and build_library then links it again with everything
    (full_link_libraries)."""
    if _is_gcc(os.environ.get("CC", "cc")):
        return ["-nodefaultlibs", *math_libraries(), "-lgcc"]
    return math_libraries()


def full_link_libraries() -> list[str]:
    """The libraries of a plain link (with the compiler's default ones)."""
    return math_libraries()


def _key_prefix(command: list[str], libraries: list[str] | None = None) -> str:
    """What a library built by `command` is cached under besides its source: the command, the libraries it links
    (default link_libraries()), the CPU model."""
    return " ".join(command + (link_libraries() if libraries is None else libraries)) + "|" + _cpu_model()


def _cpu_model() -> str:
    return host_cpu_field("model name") or "unknown"


def _cpu_flags() -> str:
    return host_cpu_field("flags") or "unknown"


def has_byte_dot_products() -> bool:
    """Whether this CPU multiplies unsigned by signed bytes into int32 sums in one instruction (x86 AVX-VNNI or
    AVX512-VNNI: vpdpbusd), which gcc's vectorizer emits for such sums at -march=native (the compiler targets the
    host); EMBER_C_INTEGER_DOT=0 or 1 chooses."""
    chosen = os.environ.get("EMBER_C_INTEGER_DOT", "")
    if chosen in ("0", "1"):
        return chosen == "1"
    flags = _cpu_flags().split()
    return "avx_vnni" in flags or "avx512_vnni" in flags


class CDevice(Device):
    """The host CPU: C kernels using every core through OpenMP."""

    def __init__(self, name: str = "c:0", threads: int | None = None) -> None:
        self.name = name
        cores = threads or os.cpu_count() or 1
        width = native_vector_width()
        self.info = DeviceInfo(compute_units=cores, preferred_vector_width=width, vector_ops=VECTOR_OPS,
                               vector_registers=32 if width >= 16 else 16,  # AVX-512 has 32 (of 64 bytes)
                               fallback_vector_widths=((8, VECTOR_OPS),) if width > 8 else (),
                               concurrent_compile=True, integer_dot_products=has_byte_dot_products(),
                               host_cores=True, packed_matmul=True)
        self.pool = HostMemoryPool(name)
        # (c's kernels load through element-aligned types, and a numpy slice views at any offset: an RNN's time
        # steps of 57 floats read views too; the pool's other views, jit arenas', keep view_alignment)
        self.pool.input_view_alignment = 1
        self.renderer = CRenderer(threads, vector_math=has_vector_math())
        self._programs: ProgramTable[str, CProgram] = ProgramTable()  # by source, least recently used dropped
        # the libraries that programs still use, by entry file name (a library no program uses is dlclosed)
        self._libraries: weakref.WeakValueDictionary[str, ctypes.CDLL] = weakref.WeakValueDictionary()
        self._rendered: dict[int, tuple[KernelIR, str]] = {}  # the last RENDERED_KEPT kernels rendered, by id
        self._rendered_lock = threading.Lock()  # (compile threads render at once: compile_ahead.py)
        self._class_key_prefixes = {kind: _key_prefix(class_compiler_command(kind)) for kind in (TILE, SCALAR, LIGHT)}
        self._packed_key_prefix = _key_prefix(packed_compiler_command())
        self._quick_key_prefix = _key_prefix(quick_compiler_command())
        self.launch_group = LaunchGroup(cores, self._load_runner)  # launches held while the executor gathers
        self._runner_library: ctypes.CDLL | None = None
        self._packed_libraries: dict[Path, ctypes.CDLL] = {}  # each packed matmul tile's library, by its cache entry
        self._packed_lock = threading.Lock()

    def _program(self, library: ctypes.CDLL, kernel: KernelIR) -> CProgram:
        """A kernel's program in a loaded library, with this device's launch group and the cores it occupies."""
        return CProgram(library, kernel.name, len(kernel.params), self.launch_group,
                        kernel_threads(kernel, self.info.compute_units), warm_parallel(kernel))  # (as rendered)

    def _load_runner(self, name: str = "ember_run_group") -> Any:
        """A function of the C runner (launch_group.runner_source: the launch group's `ember_run_group`, or a
        joined replay's `ember_run_sequence`), built once and cached on disk like kernels."""
        if self._runner_library is None:
            self._runner_library = self._build_runner()
        runner = getattr(self._runner_library, name)
        runner.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p] + (
            [ctypes.c_void_p, ctypes.c_int] if name == "ember_run_group" else [])
        runner.restype = None
        return runner

    @staticmethod
    def _build_runner() -> ctypes.CDLL:
        """The C runner's library, from the disk cache or built into it."""
        command = [*plain_compiler_command(("-O2",)), "-pthread"]  # (threads of its own: the default libraries)
        library, _ = build_library(runner_source(), _key_prefix(command, full_link_libraries()),
                                   command, ["ember_run_group", "ember_run_sequence"], full_link_libraries())
        return library

    def prepare_replays(self) -> None:
        """Build the C runner that joins a replay's launches into the current disk cache (a plan carries it, so
        that a run from the plan compiles nothing)."""
        self._build_runner()

    def join_launches(self, launches: list[Callable[[tuple[Event, ...]], Event]]
                      ) -> Callable[[tuple[Event, ...]], Event] | None:
        """A replay's run of bound launches as one call of the C runner's `ember_run_sequence` (one ctypes call
        instead of one each, with no Python between the kernels); None where a launch has more parameters than the
        runner calls (launch_group.MAX_GROUPED_PARAMETERS)."""
        if not all(isinstance(launch, BoundCLaunch) and launch.count <= MAX_GROUPED_PARAMETERS
                   for launch in launches):
            return None
        runner = self.launch_group.sequence_runner()
        if runner is None:
            return None
        return JoinedCLaunches(runner, cast(list[BoundCLaunch], launches))

    def render(self, kernel: KernelIR) -> str:
        return self.renderer.render(kernel)

    def compile(self, kernel: KernelIR) -> Program:
        return self.compile_many([kernel])[0]

    def compile_many(self, kernels: list[KernelIR]) -> list[Program]:
        """Compile several kernels with one compiler run per build class (build_class; a cold start pays the
        compiler's start-up once or a few times, not once a kernel). Each
        kernel's source also indexes the library that holds it on disk, so a later process finds it whatever batch
        it was built in (the scheduler's batches depend on timing)."""
        return self._compile(kernels, [])

    def _compile(self, kernels: list[KernelIR], launcher: list[str]) -> list[Program]:
        sources = [self._source(kernel) for kernel in kernels]
        found: dict[str, CProgram] = {}  # (a batch larger than the table must not lose its first programs)
        missing: dict[str, tuple[KernelIR, str]] = {}
        for kernel, source in zip(kernels, sources):
            program = self._at_hand(kernel, source)
            if program is not None:
                found[source] = program
            else:
                missing.setdefault(kernel.name, (kernel, source))
        # one compiler run for each build class (build_class): at most three, two where the TILE and SCALAR
        # commands are one (scheduling_flags) or a few small SCALAR kernels join the TILE run (the scheduling flags
        # change no value, so either build gives the same bits)
        groups: dict[str, dict[str, tuple[KernelIR, str]]] = {}
        for name, (kernel, source) in missing.items():
            groups.setdefault(build_class(kernel), {})[name] = (kernel, source)
        if TILE in groups and SCALAR in groups and (
                self._class_key_prefixes[TILE] == self._class_key_prefixes[SCALAR] or sum(
                    len(topological_nodes(kernel.sink)) for kernel, _ in groups[SCALAR].values()) < MAX_JOINED_NODES):
            groups[TILE].update(groups.pop(SCALAR))
        for kind, group in sorted(groups.items()):
            command, key_prefix = class_compiler_command(kind), self._class_key_prefixes[kind]
            library, entry = build_library("\n".join(source for _, source in group.values()), key_prefix,
                                           launcher + command, list(group))
            self._libraries[entry.name] = library
            for kernel, source in group.values():
                found[source] = self._program(library, kernel)
                self._programs.put(source, found[source])
                cache.write_entry(self._index_path(kernel, source), entry.name.encode())
        return [found[source] for source in sources]

    def compile_background(self, kernels: list[KernelIR]) -> list[Program]:
        """compile_many with the compiler at the lowest priority (`nice -n 19`), so it takes only the cores the
        quick builds' kernels leave idle."""
        return self._compile(kernels, BACKGROUND_PREFIX if shutil.which(BACKGROUND_PREFIX[0]) else [])

    def compile_quick(self, kernels: list[KernelIR]) -> list[Program] | None:
        """The kernels built at -O0 (a third of -O3's compile time; slower to run), as one library kept out of the
        programs by source, so `compile_many` still builds the optimized ones; None where every optimized program
        is loaded or on disk already."""
        sources = [self._source(kernel) for kernel in kernels]
        if all(self._at_hand(kernel, source) is not None for kernel, source in zip(kernels, sources)):
            return None
        by_name = {kernel.name: source for kernel, source in zip(kernels, sources)}
        library, _ = build_library("\n".join(by_name.values()), self._quick_key_prefix, quick_compiler_command(),
                                   list(by_name))
        return [self._program(library, kernel) for kernel in kernels]

    def _source(self, kernel: KernelIR) -> str:
        """The kernel's source, rendered once (compile_quick and then compile_many ask for the same kernels)."""
        known = self._rendered.get(id(kernel))
        if known is None or known[0] is not kernel:
            known = (kernel, self.render(kernel))
            with self._rendered_lock:  # (another thread's entry could otherwise change the dict while it is walked)
                self._rendered[id(kernel)] = known
                while len(self._rendered) > RENDERED_KEPT:
                    self._rendered.pop(next(iter(self._rendered)))
        return known[1]

    def _at_hand(self, kernel: KernelIR, source: str) -> CProgram | None:
        """The optimized program of a source if it is loaded, after loading it from the disk cache if it is there;
        a packed matmul's always (its tile's library function is built once: `_packed_program`)."""
        program = self._programs.get(source)
        if program is not None:
            return program
        if kernel.packed is not None:
            program = self._packed_program(kernel)
            self._programs.put(source, program)
            return program
        library = self._indexed_library(kernel, source)
        if library is None:
            return None
        program = self._program(library, kernel)
        self._programs.put(source, program)
        return program

    def _packed_program(self, kernel: KernelIR) -> PackedCProgram:
        """A packed matmul's program: its tile's library function (c_matmul.library_source, from the disk cache or
        built into it, once per process and cache folder) called with the kernel's sizes and strides."""
        packed = kernel.packed
        assert packed is not None
        source = library_source(packed.lanes, packed.micro_rows, packed.micro_vectors)
        key_prefix = self._packed_key_prefix
        entry = cache.entry_path("c", key_prefix + "\n" + source)  # (a plan's own cache folder gets its own build)
        with self._packed_lock:  # (compile threads ask at once: one builds, the others wait for it)
            library = self._packed_libraries.get(entry)
            if library is None:
                library, _ = build_library(source, key_prefix, packed_compiler_command(), [library_function(packed)])
                self._packed_libraries[entry] = library
        return PackedCProgram(library, kernel, self.launch_group, kernel_threads(kernel, self.info.compute_units),
                              self.renderer.threads)

    def _index_path(self, kernel: KernelIR, source: str) -> Path:
        """Where the name of the library holding a kernel is kept: by its source and its build class's flags."""
        return cache.entry_path("c-index", self._class_key_prefixes[build_class(kernel)] + "\n" + source)

    def _indexed_library(self, kernel: KernelIR, source: str) -> ctypes.CDLL | None:
        """The library on disk that holds a kernel's source (built in an earlier batch or process), or None."""
        kernel_name = kernel.name
        index = self._index_path(kernel, source)
        entry = cache.read_entry(index)
        if entry is None:
            return None
        name = entry.decode(errors="replace")
        library = self._libraries.get(name)
        if library is None and "/" not in name and name.endswith(".entry"):
            library = load_library(index.parent.parent / "c" / name, [])
            if library is not None:
                self._libraries[name] = library
        if library is None or not defines(library, [kernel_name]):
            cache.discard(index)  # the library it names is gone, failed its checks, or is another batch's
            return None
        return library


def defines(library: ctypes.CDLL, names: list[str]) -> bool:
    """Whether a loaded library defines a function of each name (a cached library holding another batch's kernels
    does not)."""
    try:
        for name in names:
            getattr(library, name)
    except AttributeError:
        return False
    return True


def open_library(path: Path) -> ctypes.CDLL:
    """dlopen a library, dlclosed again once no Python object refers to it (a CProgram's function keeps its library,
    so nothing can call into a closed one): the programs a bounded table drops release their code."""
    library = ctypes.CDLL(str(path))
    # never at interpreter exit (finalize's default): threads of the launch group's runner and OpenMP's pool may
    # still be inside a library's code then, and unmapping it under them crashed the process (SIGSEGV after a
    # script's last line, now and then); the process's end unmaps everything anyway
    weakref.finalize(library, _dlclose, library._handle).atexit = False
    return library


def _dlclose(handle: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        _ctypes.dlclose(handle)  # type: ignore[attr-defined]  # (POSIX only; elsewhere the library stays loaded)


def load_library(entry: Path, names: list[str]) -> ctypes.CDLL | None:
    """The cached library at `entry` loaded from a private copy of its checked bytes (never from the entry itself),
    or None where there is none, the loader refuses it, or it lacks a function of `names` (then it is discarded)."""
    library = cache.read_entry(entry)
    if library is None:
        return None
    with cache.scratch_directory("c", "ember-c-", warn=False) as work:
        output = work / "kernel.so"
        output.write_bytes(library)
        try:
            loaded = open_library(output)  # dlopen maps the file; the folder may go once it is loaded
        except OSError:
            cache.discard(entry)  # checked bytes the loader refuses (another machine's?): rebuilt
            return None
    if not defines(loaded, names):
        cache.discard(entry)  # another batch's library under this key: rebuilt, never called
        return None
    return loaded


def build_library(source: str, key_prefix: str, command: list[str] | None = None,
                  names: list[str] | None = None, libraries: list[str] | None = None) -> tuple[ctypes.CDLL, Path]:
    """Compile C source to a shared library (with `command`, default compiler_command(), linked with `libraries`,
    default link_libraries()), cached on disk (ember/cache.py: checked entries) by source, compiler and flags
    (`key_prefix`); the library and its entry. A cached library must define every function of `names` (the kernels
    of the source) to be used."""
    entry = cache.entry_path("c", key_prefix + "\n" + source)
    cached = load_library(entry, names or [])
    if cached is not None:
        return cached, entry
    libraries = link_libraries() if libraries is None else libraries
    with cache.scratch_directory("c", "ember-c-") as work:
        output = work / "kernel.so"
        source_path = work / "kernel.c"
        source_path.write_text(source)
        library = _compile_and_load([*(command or compiler_command()), "-o", str(output), str(source_path)],
                                    libraries, output, source)
        if not defines(library, names or []):
            raise CompileError(f"the library the C compiler built lacks kernels of {', '.join(names or [])}")
        cache.write_entry(entry, output.read_bytes())
        return library, entry


def _compile_and_load(command: list[str], libraries: list[str], output: Path, source: str) -> ctypes.CDLL:
    """Run the compiler `command` with `libraries` and load what it wrote to `output`; linked again with the
    compiler's default libraries where the lean link (link_libraries) left a symbol the loader cannot find."""
    result = subprocess.run([*command, *libraries], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CompileError(f"the C compiler rejected a kernel:\n{result.stderr}\n--- source ---\n{source}")
    try:
        return open_library(output)  # (checked before it is cached: a library the loader refuses is no entry)
    except OSError as error:
        if "undefined symbol" in str(error) and libraries != full_link_libraries():
            return _compile_and_load(command, full_link_libraries(), output, source)
        raise CompileError(f"the library the C compiler built cannot be loaded: {error}") from error


def missing_linker(compiler: str) -> str | None:
    """The linker the compiler would run if it cannot find it (gcc and clang name it with -print-prog-name=ld: a
    full path where it has one of its own, else the bare name, looked up on PATH); None where it is found or the
    compiler does not say."""
    try:
        answer = subprocess.run([compiler, "-print-prog-name=ld"], capture_output=True, text=True, timeout=30,
                                check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not answer or "\n" in answer:
        return None
    found = os.path.isfile(answer) if os.path.isabs(answer) else shutil.which(answer) is not None
    return None if found else answer


def _load_openmp_runtime() -> bool:
    """Load the OpenMP runtime the kernels link (GNU libgomp), so that it reads its settings from the environment
    now; False where it cannot be loaded by that name (then it reads them when the first kernel library loads)."""
    try:
        ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    return True


def probe() -> list[Device]:
    """The host CPU, if a C compiler with OpenMP is on PATH: one device, or `c.devices` (config) devices that split
    the cores between them (so sharding across devices can be tested on one CPU)."""
    from ember.settings import CONFIG

    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise BackendUnavailable(f"no C compiler: '{compiler}' is not on PATH (install gcc or set CC)")
    linker = missing_linker(compiler)
    if linker is not None:
        raise BackendUnavailable(f"the C compiler '{compiler}' cannot link kernels: its linker '{linker}' is not on "
                                 "PATH (install binutils, or put the folder holding it on PATH)")
    # before the first kernel library loads libgomp (which reads it once): threads that finish a kernel spin a
    # short while (tens of microseconds: back-to-back launches) and then sleep. libgomp's default spins ~15x longer,
    # which takes a core from whatever else runs (Python between kernels, other processes): Gemma's decode step
    # was 4-5x slower on a busy machine and ~20% slower on a quiet one; sleeping at once (OMP_WAIT_POLICY=PASSIVE)
    # costs a wake-up per kernel (~25% slower there). A user's setting of either variable wins.
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
        if _load_openmp_runtime():  # read: libraries loaded later (torch's own libgomp) and child processes do not
            del os.environ["GOMP_SPINCOUNT"]  # inherit it (torch imported after ember: char_lstm 13.7 -> 19-23 ms)
    if CONFIG.c_devices == 1:
        return [CDevice("c:0")]
    threads = max(1, (os.cpu_count() or 1) // CONFIG.c_devices)
    return [CDevice(f"c:{index}", threads) for index in range(CONFIG.c_devices)]
