"""The PTX renderer: kernel IR to NVIDIA PTX assembly text (no CUDA C, no NVRTC), and `ptxas` to check it.

Each IR value gets its own virtual register: bool in a predicate (%p), 8/16/32-bit integers in 32-bit registers
(%r, wrapped back to their width after ops that can overflow), 64-bit integers in %rd, float16/bfloat16/float32
in %f (halves hold values rounded to their precision), float64 in %fd. Accumulators and loop counters are the
only registers written more than once. Semantics follow the C backend: x // 0 and x % 0 give 0, shifts take
the amount modulo the width, float -> int truncates (PTX saturates; NaN gives 0), MAX is C's (a > b or a is NaN ?
a : b: NaN propagates, a tie gives b).
exp2, log2 and sin are expanded into basic arithmetic by `libm`, for float32 too: PTX has no float64 ones, and
the float32 `.approx` instructions are specified loosely (`lg2.approx`/`sin.approx` by absolute error, 2^-22.6
and 2^-20.9, sin only on [-pi, pi]; `ex2.approx` by 2 ulp, exact powers of two not promised), while libm's are
measured (tests/test_ptx.py) and run the same in the PTX simulator as on a GPU.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from ember.backends.render_steps import KernelBody, StepRenderer, shared_array
from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.errors import CompileError
from ember.core.ops import ELEMENTWISE_OPS, REDUCE_COMBINE, Op, reduce_identity
from ember.ir.ir import IRNode, IROp, KernelIR, topological_nodes
from ember.ir.libm import expand_math

DEFAULT_TARGET = "sm_75"
ASSEMBLY_TARGETS = ("sm_75", "sm_80", "sm_90")
# the lowest PTX ISA version that can name a target (CUDA 11.5 and later drivers accept 7.5)
PTX_VERSIONS = {"sm_90": "7.8", "sm_89": "7.8", "sm_100": "8.6", "sm_120": "8.7"}
EXPANDED_MATH = frozenset({(Op.EXP2, dtypes.float32), (Op.LOG2, dtypes.float32), (Op.SIN, dtypes.float32),
                           (Op.EXP2, dtypes.float64), (Op.LOG2, dtypes.float64), (Op.SIN, dtypes.float64)})

REGISTER_KINDS = {"pred": "%p", "b16": "%h", "b32": "%r", "b64": "%rd", "f32": "%f", "f64": "%fd"}
KIND: dict[DType, str] = {
    dtypes.bool_: "pred", dtypes.int8: "b32", dtypes.int16: "b32", dtypes.int32: "b32", dtypes.uint8: "b32",
    dtypes.uint16: "b32", dtypes.uint32: "b32", dtypes.int64: "b64", dtypes.uint64: "b64",
    dtypes.float16: "f32", dtypes.bfloat16: "f32", dtypes.float32: "f32", dtypes.float64: "f64",
}
SUFFIX: dict[DType, str] = {
    dtypes.int8: "s32", dtypes.int16: "s32", dtypes.int32: "s32", dtypes.uint8: "u32", dtypes.uint16: "u32",
    dtypes.uint32: "u32", dtypes.int64: "s64", dtypes.uint64: "u64", dtypes.float16: "f32",
    dtypes.bfloat16: "f32", dtypes.float32: "f32", dtypes.float64: "f64",
}
MEMORY_TYPE: dict[DType, str] = {
    dtypes.bool_: "u8", dtypes.int8: "s8", dtypes.uint8: "u8", dtypes.int16: "s16", dtypes.uint16: "u16",
    dtypes.int32: "s32", dtypes.uint32: "u32", dtypes.int64: "s64", dtypes.uint64: "u64",
    dtypes.float16: "b16", dtypes.bfloat16: "u16", dtypes.float32: "f32", dtypes.float64: "f64",
}
WARP = 32  # threads of an NVIDIA warp: what `shfl.sync` exchanges between
MMA_ARCHITECTURE = 80  # mma.sync.m16n8k16 for float16 and bfloat16 inputs: sm_80 and newer
MMA_TYPES = {dtypes.float16: "f16", dtypes.bfloat16: "bf16"}
SHARED_TYPE: dict[DType, str] = {  # the types a group reduce keeps in shared memory (ir/group_reduce.GROUP_DTYPES)
    dtypes.int32: "b32", dtypes.uint32: "b32", dtypes.int64: "b64", dtypes.uint64: "b64", dtypes.float32: "f32",
    dtypes.float64: "f64",
}
LOADED_KIND = {dtypes.bool_: "b32", dtypes.float16: "b16", dtypes.bfloat16: "b32"}  # registers loads fill
WRAPPING_OPS = frozenset({Op.NEG, Op.NOT, Op.ADD, Op.SUB, Op.MUL, Op.IDIV, Op.SHL})

Template = Callable[["_Emitter", str, list[str], DType, DType], None]  # (emitter, dest, operands, dtype, source)


def float_bits(value: float, dtype: DType) -> str:
    """A float immediate: 0f + 8 hex digits (float32) or 0d + 16 (float64), exact for NaN, inf and -0.0."""
    if dtype == dtypes.float64:
        return f"0d{struct.unpack('<Q', struct.pack('<d', value))[0]:016X}"
    return f"0f{struct.unpack('<I', struct.pack('<f', value))[0]:08X}"


def immediate(value: float, dtype: DType) -> str:
    if dtype.is_float:
        return float_bits(float(value), dtype)
    value = int(value)
    if -(2**31) <= value < 2**32:
        return str(value)
    return f"0x{value & (2**64 - 1):016X}"


class _Emitter:
    """Registers and instruction lines of one kernel being rendered."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.counts = dict.fromkeys(REGISTER_KINDS, 0)

    def register(self, kind: str) -> str:
        self.counts[kind] += 1
        return f"{REGISTER_KINDS[kind]}{self.counts[kind]}"

    def emit(self, instruction: str, *operands: str, guard: str = "") -> None:
        prefix = f"@{guard} " if guard else ""
        self.lines.append(f"\t{prefix}{instruction} {', '.join(operands)};" if operands else f"\t{instruction};")

    def label(self, name: str) -> None:
        self.lines.append(f"{name}:")

    def declarations(self) -> list[str]:
        return [f"\t.reg .{kind} {prefix}<{self.counts[kind] + 1}>;"
                for kind, prefix in REGISTER_KINDS.items() if self.counts[kind]]

    # ---- sequences used by several templates ------------------------------------------------------------------

    def wrap(self, destination: str, source: str, dtype: DType) -> None:
        """Bring a 32-bit register back to the range of an 8- or 16-bit integer dtype."""
        if dtype == dtypes.int8:
            self.emit("cvt.s32.s8", destination, source)
        elif dtype == dtypes.int16:
            self.emit("cvt.s32.s16", destination, source)
        elif dtype == dtypes.uint8:
            self.emit("and.b32", destination, source, "255")
        elif dtype == dtypes.uint16:
            self.emit("and.b32", destination, source, "65535")
        elif destination != source:
            self.emit(f"mov.{KIND[dtype]}", destination, source)

    def round_to_bfloat16(self, destination: str, value: str) -> None:
        """A float32 register rounded to bfloat16 precision (nearest even; NaN stays NaN)."""
        bits, low, rounded, quiet, nan = (self.register("b32") for _ in range(5))
        is_nan = self.register("pred")
        self.emit("mov.b32", bits, value)
        self.emit("bfe.u32", low, bits, "16", "1")
        self.emit("add.s32", low, low, "32767")
        self.emit("add.s32", rounded, bits, low)
        self.emit("and.b32", rounded, rounded, "-65536")
        self.emit("or.b32", quiet, bits, "4194304")
        self.emit("and.b32", nan, quiet, "-65536")
        self.emit("setp.nan.f32", is_nan, value, value)
        self.emit("selp.b32", rounded, nan, rounded, is_nan)
        self.emit("mov.b32", destination, rounded)

    def maximum(self, destination: str, a: str, b: str, dtype: DType) -> None:
        if dtype.is_bool:
            self.emit("or.pred", destination, a, b)
        elif dtype.is_float:  # C's (a > b || a != a) ? a : b; max.f32 would drop a NaN and order -0.0 < +0.0
            suffix = SUFFIX[dtype]
            take_a = self.register("pred")
            if _is_immediate(a):  # a constant a is NaN or not at render time
                if _immediate_is_nan(a):
                    self.emit(f"mov.{suffix}", destination, a)
                    return
                self.emit(f"setp.gt.{suffix}", take_a, a, b)
            else:
                a_is_nan = self.register("pred")
                self.emit(f"setp.nan.{suffix}", a_is_nan, a, a)
                self.emit(f"setp.gt.or.{suffix}", take_a, a, b, a_is_nan)
            self.emit(f"selp.{suffix}", destination, a, b, take_a)
        else:
            self.emit(f"max.{SUFFIX[dtype]}", destination, a, b)


# ---- the ALU table: one entry per elementwise op ----------------------------------------------------------------


def _arithmetic(integer: str, floating: str, boolean: str | None = None) -> Template:
    def template(e: _Emitter, d: str, o: list[str], dtype: DType, _: DType) -> None:
        if dtype.is_bool:
            assert boolean is not None, "no boolean form"
            e.emit(boolean, d, *o)
        elif dtype.is_float:
            e.emit(f"{floating}.{SUFFIX[dtype]}", d, *o)
        else:
            e.emit(f"{integer}.{SUFFIX[dtype]}", d, *o)

    return template


def _bitwise(name: str) -> Template:
    def template(e: _Emitter, d: str, o: list[str], dtype: DType, _: DType) -> None:
        e.emit(f"{name}.{'pred' if dtype.is_bool else KIND[dtype]}", d, *o)

    return template


def _negate(e: _Emitter, d: str, o: list[str], dtype: DType, _: DType) -> None:
    e.emit(f"neg.{SUFFIX[dtype] if dtype.is_float else SUFFIX[dtype].replace('u', 's')}", d, o[0])


def _not(e: _Emitter, d: str, o: list[str], dtype: DType, _: DType) -> None:
    e.emit(f"not.{'pred' if dtype.is_bool else KIND[dtype]}", d, o[0])


def _integer_division(remainder: bool) -> Template:
    """a / b and a % b with b == 0 giving 0 and a / -1 giving -a (no trap, no undefined result)."""

    def template(e: _Emitter, d: str, o: list[str], dtype: DType, _: DType) -> None:
        a, b = o
        suffix, kind = SUFFIX[dtype], KIND[dtype]
        instruction = f"{'rem' if remainder else 'div'}.{suffix}"
        if _is_immediate(b) and int(b, 0) not in (0, -1):
            e.emit(instruction, d, a, b)
            return
        is_zero, is_minus_one = e.register("pred"), e.register("pred")
        safe, quotient = e.register(kind), e.register(kind)
        e.emit(f"setp.eq.{suffix}", is_zero, b, "0")
        e.emit(f"selp.{kind}", safe, "1", b, is_zero)
        if dtype.is_unsigned:
            e.emit(instruction, quotient, a, safe)
            e.emit(f"selp.{kind}", d, "0", quotient, is_zero)
            return
        e.emit(f"setp.eq.{suffix}", is_minus_one, safe, "-1")
        e.emit(f"selp.{kind}", safe, "1", safe, is_minus_one)
        e.emit(instruction, quotient, a, safe)
        special = e.register(kind)
        if remainder:
            e.emit(f"selp.{kind}", quotient, "0", quotient, is_minus_one)
        else:
            e.emit(f"neg.{suffix}", special, a)
            e.emit(f"selp.{kind}", quotient, special, quotient, is_minus_one)
        e.emit(f"selp.{kind}", d, "0", quotient, is_zero)

    return template


def _shift(left: bool) -> Template:
    def template(e: _Emitter, d: str, o: list[str], dtype: DType, _: DType) -> None:
        a, b = o
        width = 64 if dtype.itemsize == 8 else 32
        if _is_immediate(b):
            amount = str(int(b, 0) % width)
        else:
            amount = e.register("b32")
            if dtype.itemsize == 8:
                e.emit("cvt.u32.u64", amount, b)
                e.emit("and.b32", amount, amount, str(width - 1))
            else:
                e.emit("and.b32", amount, b, str(width - 1))
        name = f"shl.b{width}" if left else f"shr.{SUFFIX[dtype]}"
        e.emit(name, d, a, amount)

    return template


def _less(e: _Emitter, d: str, o: list[str], _: DType, source: DType) -> None:
    if source.is_bool:
        negated = e.register("pred")
        e.emit("not.pred", negated, o[0])
        e.emit("and.pred", d, negated, o[1])
    else:
        e.emit(f"setp.lt.{SUFFIX[source]}", d, *o)  # ordered for floats: false with a NaN


def _equal(e: _Emitter, d: str, o: list[str], _: DType, source: DType) -> None:
    if source.is_bool:
        different = e.register("pred")
        e.emit("xor.pred", different, *o)
        e.emit("not.pred", d, different)
    else:
        e.emit(f"setp.eq.{SUFFIX[source]}", d, *o)


def _where(e: _Emitter, d: str, o: list[str], dtype: DType, _: DType) -> None:
    condition, if_true, if_false = o
    if dtype.is_bool:
        taken, negated, other = e.register("pred"), e.register("pred"), e.register("pred")
        e.emit("and.pred", taken, condition, if_true)
        e.emit("not.pred", negated, condition)
        e.emit("and.pred", other, negated, if_false)
        e.emit("or.pred", d, taken, other)
    else:
        e.emit(f"selp.{SUFFIX[dtype] if dtype.is_float else KIND[dtype]}", d, if_true, if_false, condition)


def _maximum(e: _Emitter, d: str, o: list[str], dtype: DType, _: DType) -> None:
    e.maximum(d, o[0], o[1], dtype)


def _unary_float(name: str) -> Template:
    def template(e: _Emitter, d: str, o: list[str], dtype: DType, _: DType) -> None:
        e.emit(f"{name}.{SUFFIX[dtype]}", d, o[0])

    return template


def cast(e: _Emitter, d: str, o: list[str], dtype: DType, source: DType) -> None:
    """A value conversion with C's semantics; halves are rounded, narrow integers wrap."""
    value = o[0]
    if dtype.is_bool:
        if source.is_float:
            e.emit(f"setp.neu.{SUFFIX[source]}", d, value, float_bits(0.0, source))  # NaN is true, as in C
        else:
            e.emit(f"setp.ne.{SUFFIX[source]}", d, value, "0")
        return
    if source.is_bool:
        one, zero = (float_bits(1.0, dtype), float_bits(0.0, dtype)) if dtype.is_float else ("1", "0")
        e.emit(f"selp.{SUFFIX[dtype] if dtype.is_float else KIND[dtype]}", d, one, zero, value)
        return
    if dtype == dtypes.float16:
        half = e.register("b16")
        e.emit(f"cvt.rn.f16.{SUFFIX[source]}", half, value)
        e.emit("cvt.f32.f16", d, half)
        return
    if dtype == dtypes.bfloat16:
        single = value
        if KIND[source] != "f32":
            single = e.register("f32")
            e.emit(f"cvt.rn.f32.{SUFFIX[source]}", single, value)
        e.round_to_bfloat16(d, single)
        return
    if dtype.is_float:
        if KIND[source] == KIND[dtype]:
            e.emit(f"mov.{KIND[dtype]}", d, value)
        elif source.is_float:
            e.emit(f"cvt{'' if dtype == dtypes.float64 else '.rn'}.{SUFFIX[dtype]}.{SUFFIX[source]}", d, value)
        else:
            e.emit(f"cvt.rn.{SUFFIX[dtype]}.{SUFFIX[source]}", d, value)
        return
    if source.is_float:  # truncate; to a narrow unsigned type through int32, as C does
        target = "s32" if dtype.itemsize < 4 else SUFFIX[dtype]
        converted = e.register(KIND[dtype])
        e.emit(f"cvt.rzi.{target}.{SUFFIX[source]}", converted, value)
        e.wrap(d, converted, dtype)
        return
    if KIND[source] == KIND[dtype]:
        e.wrap(d, value, dtype)
    elif KIND[dtype] == "b32":
        truncated = e.register("b32")
        e.emit("cvt.u32.u64", truncated, value)
        e.wrap(d, truncated, dtype)
    else:
        e.emit(f"cvt.{SUFFIX[dtype]}.{SUFFIX[source]}", d, value)


def bitcast(e: _Emitter, d: str, o: list[str], dtype: DType, source: DType) -> None:
    """Bits reinterpreted; halves go through their 16-bit patterns."""
    value = o[0]
    if dtype.itemsize >= 4:
        e.emit(f"mov.b{dtype.bits}", d, value)
        return
    bits = e.register("b32")  # the source's bits in the low end of a 32-bit register
    if source == dtypes.float16:
        half = e.register("b16")
        e.emit("cvt.rn.f16.f32", half, value)
        e.emit("cvt.u32.u16", bits, half)
    elif source == dtypes.bfloat16:
        e.emit("mov.b32", bits, value)
        e.emit("shr.u32", bits, bits, "16")
    else:
        bits = value
    if dtype == dtypes.float16:
        half = e.register("b16")
        e.emit("cvt.u16.u32", half, bits)
        e.emit("cvt.f32.f16", d, half)
    elif dtype == dtypes.bfloat16:
        shifted = e.register("b32")
        e.emit("shl.b32", shifted, bits, "16")
        e.emit("mov.b32", d, shifted)
    else:
        e.wrap(d, bits, dtype)


ALU: dict[Op | IROp, Template] = {
    Op.NEG: _negate,
    Op.RECIPROCAL: _unary_float("rcp.rn"),
    Op.SQRT: _unary_float("sqrt.rn"),
    Op.TRUNC: lambda e, d, o, dtype, s: e.emit(f"cvt.rzi.{SUFFIX[dtype]}.{SUFFIX[dtype]}", d, o[0]),
    Op.NOT: _not,
    Op.ADD: _arithmetic("add", "add", "or.pred"),
    Op.SUB: _arithmetic("sub", "sub", "xor.pred"),
    Op.MUL: _arithmetic("mul.lo", "mul", "and.pred"),
    Op.DIV: _arithmetic("div", "div.rn"),
    Op.IDIV: _integer_division(remainder=False),
    Op.MOD: _integer_division(remainder=True),
    Op.MAX: _maximum,
    Op.CMPLT: _less,
    Op.CMPEQ: _equal,
    Op.AND: _bitwise("and"),
    Op.OR: _bitwise("or"),
    Op.XOR: _bitwise("xor"),
    Op.SHL: _shift(left=True),
    Op.SHR: _shift(left=False),
    Op.WHERE: _where,
    Op.CAST: cast,
    Op.BITCAST: bitcast,
}
EXPANDED_OPS = frozenset({Op.EXP2, Op.LOG2, Op.SIN})  # always expanded by libm (see the module docstring)
assert not ELEMENTWISE_OPS - ALU.keys() - EXPANDED_OPS, f"the PTX ALU table lacks {ELEMENTWISE_OPS - ALU.keys()}"


def _is_immediate(operand: str) -> bool:
    return not operand.startswith("%")


def _immediate_is_nan(operand: str) -> bool:
    """Whether a float immediate (0f + 8 hex digits, 0d + 16) is a NaN."""
    bits = int(operand[2:], 16)
    exponent, fraction = (bits >> 52 & 0x7FF, bits & (2**52 - 1)) if operand.startswith("0d") else (
        bits >> 23 & 0xFF, bits & (2**23 - 1))
    return exponent == (0x7FF if operand.startswith("0d") else 0xFF) and fraction != 0


class PTXBody(KernelBody):
    """A PTX kernel being rendered: its registers and instruction lines (the emitter), the buffers' address
    registers, the loops' labels, and which values several nodes read."""

    def __init__(self, kernel: KernelIR) -> None:
        super().__init__(kernel, self.constant_operand, global_id="")  # global_id: the prologue's register
        self.e = _Emitter()
        self.pointers: dict[int, str] = {}  # buffer position -> register holding its global address
        self.loops: dict[int, str] = {}  # RANGE node id -> the label its loop branches back to
        self.shared = _shared_nodes(kernel.sink)
        self.wide_index = kernel.index_dtype == dtypes.int64
        self.index_kind, self.index_suffix = ("b64", "s64") if self.wide_index else ("b32", "s32")
        self.shared_arrays: list[str] = []  # a workgroup kernel's `.shared` declarations (one per group reduce)
        self.lanes: dict[int, list[str]] = {}  # a vector accumulator's registers, lane by lane (an mma's outputs)

    def constant_operand(self, node: IRNode) -> str:
        """A constant as an immediate; a bool in a predicate register (PTX has no predicate immediates)."""
        if node.dtype.is_bool:
            return self.materialize(node)
        return immediate(node.arg, node.dtype)

    def materialize(self, node: IRNode) -> str:
        """A register holding the node (constants get a `mov`; some operands cannot be immediates)."""
        if node.op is not IROp.CONST:
            return self.names[id(node)]
        register = self.e.register(KIND[node.dtype])
        if node.dtype.is_bool:
            self.e.emit("setp.ne.u32", register, "1" if node.arg else "0", "0")
        else:
            self.e.emit(f"mov.{KIND[node.dtype]}", register, immediate(node.arg, node.dtype))
        return register


class PTXRenderer(StepRenderer[PTXBody]):
    """Renders kernel IR to a PTX module with one `.entry` per kernel, for one target architecture."""

    language = "PTX"
    renders_matrix_units = True

    def __init__(self, target: str = DEFAULT_TARGET, version: str | None = None) -> None:
        self.target = target
        self.version = version or PTX_VERSIONS.get(target, "7.5")

    def architecture(self) -> int:
        """The target's compute capability as a number (sm_90: 90)."""
        return int("".join(character for character in self.target if character.isdigit()) or 0)

    def header(self) -> str:
        return f"//\n// Generated by ember\n//\n\n.version {self.version}\n.target {self.target}\n.address_size 64\n"

    def render(self, kernel: KernelIR) -> str:
        return self.header() + "\n" + self.render_entry(kernel)

    def render_entry(self, kernel: KernelIR) -> str:
        """The `.entry` of one kernel (modules of several kernels join entries under one header)."""
        if self.architecture() < MMA_ARCHITECTURE and any(
                node.op is IROp.MMA for node in topological_nodes(kernel.sink)):
            raise CompileError(f"kernel {kernel.name} multiplies on tensor cores (mma.sync.m16n8k16), which "
                               f"{self.target} lacks (sm_80 and newer: DeviceInfo.matrix_dtypes is empty below)")
        body = PTXBody(expand_math(kernel, EXPANDED_MATH))
        self.prologue(body)
        self.render_steps(body)
        e, kernel = body.e, body.kernel
        parameters = ",\n".join(f"\t.param .u64 data{param.position}" for param in kernel.params)
        lines = [
            f".visible .entry {kernel.name}(",
            parameters,
            ")",
            "{",
            *e.declarations(),
            *body.shared_arrays,
            "",
            *e.lines,
            "$L_end:",
            "\tret;",
            "}",
        ]
        return "\n".join(lines) + "\n"

    @staticmethod
    def prologue(body: PTXBody) -> None:
        """The buffers' global addresses, the work item's index, and the branch to the end for items past the
        global size."""
        e, kernel = body.e, body.kernel
        for param in kernel.params:
            pointer = e.register("b64")
            e.emit("ld.param.u64", pointer, f"[data{param.position}]")
            e.emit("cvta.to.global.u64", pointer, pointer)
            body.pointers[param.position] = pointer
        block, threads, thread = e.register("b32"), e.register("b32"), e.register("b32")
        e.emit("mov.u32", block, "%ctaid.x")
        e.emit("mov.u32", threads, "%ntid.x")
        e.emit("mov.u32", thread, "%tid.x")
        global_id = body.global_id = e.register(body.index_kind)
        if body.wide_index:
            thread_wide = e.register("b64")
            e.emit("mul.wide.u32", global_id, block, threads)
            e.emit("cvt.u64.u32", thread_wide, thread)
            e.emit("add.s64", global_id, global_id, thread_wide)
        else:
            e.emit("mad.lo.s32", global_id, block, threads, thread)
        if kernel.local_size is not None:  # a workgroup kernel: launched in blocks of exactly its local size
            body.local_id, body.group_id = e.register(body.index_kind), e.register(body.index_kind)
            conversion = "cvt.u64.u32" if body.wide_index else "mov.u32"
            e.emit(conversion, body.local_id, thread)
            e.emit(conversion, body.group_id, block)
        outside = e.register("pred")
        bound = str(kernel.global_size)
        if kernel.size_parameter is not None:  # a shape class's kernel: element 0 of its sizes
            bound = e.register(body.index_kind)
            e.emit(f"ld.global.{body.index_suffix}", bound, f"[{body.pointers[kernel.size_parameter]}]")
        e.emit(f"setp.ge.{body.index_suffix}", outside, global_id, bound)
        e.emit("bra", "$L_end", guard=outside)

    @staticmethod
    def address(body: PTXBody, param: IRNode, index: IRNode) -> str:
        """A register holding the global address of element `index` of a buffer."""
        result = body.e.register("b64")
        return PTXRenderer.element_address(body, result, body.pointers[param.arg[0]], index, param.dtype.itemsize)

    @staticmethod
    def shared_address(body: PTXBody, array: IRNode, index: IRNode) -> str:
        """A register holding the address of element `index` of a `.shared` array (a workgroup tile)."""
        result = body.e.register("b64")
        body.e.emit("mov.u64", result, body.names[id(array)])
        return PTXRenderer.element_address(body, result, result, index, array.dtype.itemsize)

    @staticmethod
    def element_address(body: PTXBody, result: str, base: str, index: IRNode, itemsize: int) -> str:
        """`result` = the address `base` plus `index` elements of `itemsize` bytes (the index widened to 64 bits)."""
        e = body.e
        if index.op is IROp.CONST:
            e.emit("add.s64", result, base, str(int(index.arg) * itemsize))
            return result
        offset = e.register("b64")
        if body.wide_index:
            e.emit("mul.lo.s64", offset, body.operand(index), str(itemsize))
        else:
            e.emit("mul.wide.s32", offset, body.operand(index), str(itemsize))
        e.emit("add.s64", result, base, offset)
        return result

    def load(self, body: PTXBody, node: IRNode) -> str:
        """A LOAD (guarded: 0 where its mask is false, memory untouched) into a register of the value's kind."""
        e = body.e
        param = node.srcs[0]
        array = shared_array(param)
        if array is not None:  # a workgroup tile, of its values' own kind (never guarded: lowering clamps)
            assert len(node.srcs) == 2, "a load from local memory is never guarded"
            if node.width > 1:  # two halves as one 32-bit register (a register of an mma fragment)
                assert node.width * array.dtype.itemsize == 4, "vector loads from local memory are 32-bit words"
                word = e.register("b32")
                e.emit("ld.shared.b32", word, f"[{self.shared_address(body, array, node.srcs[1])}]")
                return word
            loaded = e.register(KIND[array.dtype])
            where = self.shared_address(body, array, node.srcs[1])
            e.emit(f"ld.shared.{SHARED_TYPE[array.dtype]}", loaded, f"[{where}]")
            return loaded
        dtype = param.dtype
        where = self.address(body, param, node.srcs[1])
        guard = body.operand(node.srcs[2]) if len(node.srcs) == 3 else ""
        raw_kind = LOADED_KIND.get(dtype, KIND[dtype])
        raw = e.register(raw_kind)
        if guard:
            zero = float_bits(0.0, dtype) if raw_kind in ("f32", "f64") else "0"
            e.emit(f"mov.{raw_kind}", raw, zero)
        e.emit(f"ld.global.{MEMORY_TYPE[dtype]}", raw, f"[{where}]", guard=guard)
        if dtype.is_bool:
            result = e.register("pred")
            e.emit("setp.ne.u32", result, raw, "0")
            return result
        if dtype == dtypes.float16:
            result = e.register("f32")
            e.emit("cvt.f32.f16", result, raw)
            return result
        if dtype == dtypes.bfloat16:
            result, shifted = e.register("f32"), e.register("b32")
            e.emit("shl.b32", shifted, raw, "16")
            e.emit("mov.b32", result, shifted)
            return result
        return raw

    # ---- the steps (render_steps.StepRenderer walks the kernel) ----------------------------------------------

    def store(self, body: PTXBody, node: IRNode) -> None:
        e = body.e
        param, index, value = node.srcs
        array = shared_array(param)
        if array is not None:  # a workgroup tile
            where = self.shared_address(body, array, index)
            register = body.materialize(value)
            if array.dtype == dtypes.float16:
                half = e.register("b16")
                e.emit("cvt.rn.f16.f32", half, register)
                e.emit("st.shared.b16", f"[{where}]", half)
            elif array.dtype == dtypes.bfloat16:  # (the value is a bfloat16 already: its upper 16 bits)
                bits = e.register("b32")
                e.emit("mov.b32", bits, register)
                e.emit("shr.u32", bits, bits, "16")
                e.emit("st.shared.u16", f"[{where}]", bits)
            else:
                e.emit(f"st.shared.{SHARED_TYPE[array.dtype]}", f"[{where}]", register)
            return
        dtype = param.dtype
        where = self.address(body, param, index)
        register = body.materialize(value)
        if dtype.is_bool:
            byte = e.register("b32")
            e.emit("selp.u32", byte, "1", "0", register)
            register = byte
        elif dtype == dtypes.float16:
            half = e.register("b16")
            e.emit("cvt.rn.f16.f32", half, register)
            register = half
        elif dtype == dtypes.bfloat16:
            bits = e.register("b32")
            e.emit("mov.b32", bits, register)
            e.emit("shr.u32", bits, bits, "16")
            register = bits
        e.emit(f"st.global.{MEMORY_TYPE[dtype]}", f"[{where}]", register)

    def open_loop(self, body: PTXBody, node: IRNode) -> None:
        counter = body.names[id(node)] = body.e.register(body.index_kind)
        body.loops[id(node)] = f"$L_loop{node.arg[0]}"
        body.e.emit(f"mov.{body.index_kind}", counter, "0")
        if node.srcs:  # (a size known at launch, or a group's own count of steps: it may be 0, past the loop)
            empty = body.e.register("pred")
            body.e.emit(f"setp.lt.{body.index_suffix}", empty, body.operand(node.srcs[0]), "1")
            body.e.emit("bra", f"$L_done{node.arg[0]}", guard=empty)
        body.e.label(body.loops[id(node)])

    def close_loop(self, body: PTXBody, node: IRNode) -> None:
        e = body.e
        counter, again = body.names[id(node)], e.register("pred")
        e.emit(f"add.{body.index_suffix}", counter, counter, "1")
        size = body.operand(node.srcs[0]) if node.srcs else str(node.arg[1])  # (a size known at launch: a value)
        e.emit(f"setp.lt.{body.index_suffix}", again, counter, size)
        e.emit("bra", body.loops[id(node)], guard=again)
        if node.srcs:
            e.label(f"$L_done{node.arg[0]}")

    def define_accumulator(self, body: PTXBody, node: IRNode) -> None:
        if node.width > 1:  # an mma's outputs: a float32 register a lane
            assert node.srcs[0].op is IROp.MMA, "PTX has vector accumulators only for tensor cores' outputs"
            lanes = body.lanes[id(node)] = [body.e.register("f32") for _ in range(node.width)]
            for register in lanes:
                body.e.emit("mov.f32", register, immediate(0.0, node.dtype))
            body.names[id(node)] = "{" + ", ".join(lanes) + "}"
            return
        accumulator = body.names[id(node)] = body.e.register(KIND[node.dtype])
        identity = reduce_identity(node.arg, node.dtype)
        if node.dtype.is_bool:
            body.e.emit("setp.ne.u32", accumulator, "1" if identity else "0", "0")
        else:
            body.e.emit(f"mov.{KIND[node.dtype]}", accumulator, immediate(identity, node.dtype))

    def update_accumulator(self, body: PTXBody, node: IRNode) -> None:
        product = node.srcs[0]
        if product.op is IROp.MMA:  # D = A B + C on tensor cores, into the accumulator itself
            accumulator = body.names[id(node)]
            words = [body.operand(src) for src in product.srcs]
            kind = MMA_TYPES[product.arg]
            body.e.emit(f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32", accumulator,
                        "{" + ", ".join(words[:4]) + "}", "{" + ", ".join(words[4:]) + "}", accumulator)
            return
        accumulator = body.names[id(node)]
        combine = REDUCE_COMBINE[node.arg]
        ALU[combine](body.e, accumulator, [accumulator, body.operand(node.srcs[0])], node.dtype, node.dtype)
        if combine in WRAPPING_OPS and node.dtype.itemsize < 4 and node.dtype.is_int:
            body.e.wrap(accumulator, accumulator, node.dtype)

    def value(self, body: PTXBody, node: IRNode) -> None:
        if node.op is IROp.MMA:  # computed by the accumulator's update (one mma.sync with the sum)
            body.names[id(node)] = ""
            return
        if node.op is IROp.GEP:  # a lane of an mma's accumulator
            body.names[id(node)] = body.lanes[id(node.srcs[0])][node.arg]
            return
        if node.op is IROp.LOAD:
            body.names[id(node)] = self.load(body, node)
        else:
            body.names[id(node)] = self.alu(body.e, node, body.operand, id(node) in body.shared)

    def define_local(self, body: PTXBody, node: IRNode) -> None:
        self.refuse_scratch_arrays(body, node)

    def define_shared(self, body: PTXBody, node: IRNode) -> None:
        """A `.shared` array of the block (a workgroup tile), 16-byte aligned."""
        name = body.names[id(node)] = f"ember_tile{node.arg[0]}"
        body.shared_arrays.append(f"\t.shared .align 16 .b8 {name}[{node.arg[1] * node.dtype.itemsize}];")

    def barrier(self, body: PTXBody, node: IRNode) -> None:
        body.e.emit("bar.sync", "0")

    def group_reduce(self, body: PTXBody, node: IRNode) -> None:
        """The block's values combined: by warp shuffles where the kernel was made for 32-thread warps
        (`warp_group_reduce`), else by a tree in a `.shared` array: each thread stores its value, then half the
        threads combine pairs, halving until element 0 holds the result, with `bar.sync` after every level."""
        e = body.e
        size = body.kernel.local_size
        assert size is not None and size & (size - 1) == 0, "a group reduce needs a power-of-two local size"
        if body.kernel.warp_width == WARP and size % WARP == 0:
            self.warp_group_reduce(body, node)
            return
        kind, itemsize = KIND[node.dtype], node.dtype.itemsize
        shared_type = SHARED_TYPE[node.dtype]
        array = f"ember_shared{len(body.shared_arrays)}"
        body.shared_arrays.append(f"\t.shared .align 8 .b8 {array}[{size * itemsize}];")
        base, mine, offset = e.register("b64"), e.register("b64"), e.register("b64")
        thread = e.register("b32")
        e.emit("mov.u64", base, array)
        e.emit("mov.u32", thread, "%tid.x")
        e.emit("mul.wide.u32", offset, thread, str(itemsize))
        e.emit("add.s64", mine, base, offset)
        e.emit(f"st.shared.{shared_type}", f"[{mine}]", body.materialize(node.srcs[0]))
        e.emit("bar.sync", "0")
        stride, active, again = e.register("b32"), e.register("pred"), e.register("pred")
        other, other_offset = e.register("b64"), e.register("b64")
        first, second, combined = e.register(kind), e.register(kind), e.register(kind)
        label = f"$L_group{len(body.shared_arrays) - 1}"
        e.emit("mov.u32", stride, str(size // 2))
        e.label(label)
        e.emit("setp.lt.u32", active, thread, stride)
        e.emit("mul.wide.u32", other_offset, stride, str(itemsize))
        e.emit("add.s64", other, mine, other_offset)
        e.emit(f"ld.shared.{shared_type}", first, f"[{mine}]", guard=active)
        e.emit(f"ld.shared.{shared_type}", second, f"[{other}]", guard=active)
        ALU[REDUCE_COMBINE[node.arg]](e, combined, [first, second], node.dtype, node.dtype)
        e.emit(f"st.shared.{shared_type}", f"[{mine}]", combined, guard=active)
        e.emit("bar.sync", "0")
        e.emit("shr.u32", stride, stride, "1")
        e.emit("setp.ne.u32", again, stride, "0")
        e.emit("bra", label, guard=again)
        result = body.names[id(node)] = e.register(kind)
        e.emit(f"ld.shared.{shared_type}", result, f"[{base}]")

    def warp_group_reduce(self, body: PTXBody, node: IRNode) -> None:
        """The block's values combined by warp shuffles: each warp combines its 32 values (`shfl.sync.bfly`: after
        offsets 16, 8, 4, 2, 1 every lane holds the warp's result), lane 0 of each warp stores it to `.shared`, one
        `bar.sync`, then every warp combines those per-warp results the same way (the identity past the last warp),
        so every thread ends with the block's result and no second barrier is needed."""
        e = body.e
        size = body.kernel.local_size
        assert size is not None
        kind, itemsize = KIND[node.dtype], node.dtype.itemsize
        shared_type = SHARED_TYPE[node.dtype]
        array = f"ember_shared{len(body.shared_arrays)}"
        warps = size // WARP
        body.shared_arrays.append(f"\t.shared .align 8 .b8 {array}[{warps * itemsize}];")
        thread, lane, warp = e.register("b32"), e.register("b32"), e.register("b32")
        e.emit("mov.u32", thread, "%tid.x")
        e.emit("and.b32", lane, thread, str(WARP - 1))
        e.emit("shr.u32", warp, thread, "5")
        value = self._warp_combine(e, node, body.materialize(node.srcs[0]), WARP)
        base, offset, where = e.register("b64"), e.register("b64"), e.register("b64")
        first_lane = e.register("pred")
        e.emit("mov.u64", base, array)
        e.emit("setp.eq.u32", first_lane, lane, "0")
        e.emit("mul.wide.u32", offset, warp, str(itemsize))
        e.emit("add.s64", where, base, offset)
        e.emit(f"st.shared.{shared_type}", f"[{where}]", value, guard=first_lane)
        e.emit("bar.sync", "0")
        partial, holds = e.register(kind), e.register("pred")
        e.emit(f"mov.{kind}", partial, immediate(reduce_identity(node.arg, node.dtype), node.dtype))
        e.emit("setp.lt.u32", holds, lane, str(warps))
        e.emit("mul.wide.u32", offset, lane, str(itemsize))
        lane_address = e.register("b64")
        e.emit("add.s64", lane_address, base, offset)
        e.emit(f"ld.shared.{shared_type}", partial, f"[{lane_address}]", guard=holds)
        body.names[id(node)] = self._warp_combine(e, node, partial, WARP)  # (every lane: all get the result)

    @staticmethod
    def _warp_combine(e: _Emitter, node: IRNode, value: str, lanes: int) -> str:
        """A register holding the combination of `value` over each group of `lanes` neighbouring lanes of the warp
        (a power of two), in every lane: butterfly shuffles at offsets lanes/2 .. 1; 64-bit values as two halves."""
        kind = KIND[node.dtype]
        combine = ALU[REDUCE_COMBINE[node.arg]]
        offset = lanes // 2
        while offset >= 1:
            other = e.register(kind)
            if node.dtype.itemsize == 8:
                bits, low, high = e.register("b64"), e.register("b32"), e.register("b32")
                e.emit("mov.b64", bits, value)
                e.emit("cvt.u32.u64", low, bits)
                e.emit("shr.u64", bits, bits, "32")
                e.emit("cvt.u32.u64", high, bits)
                e.emit("shfl.sync.bfly.b32", low, low, str(offset), "31", "0xffffffff")
                e.emit("shfl.sync.bfly.b32", high, high, str(offset), "31", "0xffffffff")
                joined, upper = e.register("b64"), e.register("b64")
                e.emit("cvt.u64.u32", joined, low)
                e.emit("cvt.u64.u32", upper, high)
                e.emit("shl.b64", upper, upper, "32")
                e.emit("or.b64", joined, joined, upper)
                e.emit("mov.b64", other, joined)
            else:
                e.emit("shfl.sync.bfly.b32", other, value, str(offset), "31", "0xffffffff")
            combined = e.register(kind)
            combine(e, combined, [value, other], node.dtype, node.dtype)
            value = combined
            offset //= 2
        return value

    @staticmethod
    def alu(e: _Emitter, node: IRNode, operand: Callable[[IRNode], str], shared: bool = False) -> str:
        """One ALU node; `shared`: its value has several consumers (a float product is then rounded where it is
        computed, `mul.rn`: ptxas fuses a plain `mul` into an `add` reading it, and every consumer must see the
        same value; a product used once may become an fma)."""
        source = node.srcs[1].dtype if node.op is Op.WHERE else node.srcs[0].dtype
        operands = [operand(src) for src in node.srcs]
        if node.op in (Op.CAST, Op.BITCAST) and _is_immediate(operands[0]):
            register = e.register(KIND[source])  # cvt/mov need a register source
            e.emit(f"mov.{KIND[source]}", register, operands[0])
            operands[0] = register
        if node.op in ALU and all(_is_immediate(operand) for operand in operands):
            register = e.register(KIND[source])  # an instruction needs at least one register operand
            e.emit(f"mov.{KIND[source]}", register, operands[0])
            operands[0] = register
        destination = e.register(KIND[node.dtype])
        narrow = node.dtype.is_int and node.dtype.itemsize < 4 and node.op in WRAPPING_OPS
        result = e.register(KIND[node.dtype]) if narrow else destination
        if node.op is Op.MUL and node.dtype.is_float and shared:
            e.emit(f"mul.rn.{SUFFIX[node.dtype]}", result, *operands)
        else:
            ALU[node.op](e, result, operands, node.dtype, source)
        if narrow:
            e.wrap(destination, result, node.dtype)
        return destination


def _shared_nodes(sink: IRNode) -> set[int]:
    """The ids of the nodes that more than one node reads."""
    seen: set[int] = set()
    shared: set[int] = set()
    for node in topological_nodes(sink):
        for source in node.srcs:
            (shared if id(source) in seen else seen).add(id(source))
    return shared


def ptxas_path() -> str | None:
    return shutil.which("ptxas")


def assemble(source: str, target: str, optimization: int = 3) -> bytes:
    """Assemble PTX for one architecture with `ptxas`; raise CompileError with its messages on failure.
    (Level 0 checks the same rules about twice as fast.)"""
    executable = ptxas_path()
    if executable is None:
        raise CompileError("ptxas is not on PATH (it comes with the CUDA toolkit)")
    with tempfile.TemporaryDirectory(prefix="ember-ptx-") as work:
        source_path, output = Path(work, "kernel.ptx"), Path(work, "kernel.cubin")
        source_path.write_text(source)
        command = [executable, f"-arch={target}", f"-O{optimization}", "-o", str(output), str(source_path)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            numbered = "\n".join(f"{number:5} {line}" for number, line in enumerate(source.splitlines(), 1))
            raise CompileError(f"ptxas rejected a kernel for {target}:\n{result.stderr}\n--- source ---\n{numbered}")
        return output.read_bytes()


def module_of(entries: list[str], renderer: PTXRenderer) -> str:
    """One PTX module holding several kernels' entries (assembling many kernels in one ptxas call)."""
    return renderer.header() + "\n" + "\n".join(entries)
