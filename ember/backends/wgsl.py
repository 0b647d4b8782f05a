"""The WGSL renderer: kernel IR to a WebGPU compute shader with one invocation per work item.

WGSL has 32-bit scalars only (64-bit ones through wgpu-native's shader-int64/shader-f64 extensions). Types of 1 and
2 bytes are stored packed in u32 words: loads extract their bits, stores merge them with two atomics (other
invocations own the other bytes of the word). In registers, int8/int16 live in i32 and uint8/uint16 in u32,
wrapped back to their width after every op that can overflow; float16 and bfloat16 live in f32 and are rounded
through explicit bit conversions.

WGSL lets a compiler assume floats are finite and reassociate, and Mesa does: it folds `x != x` to false, `x - x`
and `x * 0` to 0, and `(x + 1) - 1` to `x`. So NaN is tested on bits (`ember_isnan_*`, also inside comparisons
and max); in x - x, x / x, x + (-x) and x * 0 one operand, and every float sum, goes through `ember_opaque_*` (an
OR with a zero the compiler cannot see), which keeps compensated arithmetic intact. Products are not fenced:
(x * a) * b may still become x * (a * b).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

from ember.backends.render_steps import KernelBody, StepRenderer, shared_array
from ember.capabilities import work_group_counts
from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.errors import CompileError, DeviceError
from ember.core.ops import ELEMENTWISE_OPS, REDUCE_COMBINE, Op, reduce_identity
from ember.core.walk import compute_bottom_up
from ember.ir.ir import IRNode, IROp, KernelIR
from ember.ir.libm import expand_math

WORKGROUP_SIZE = 64
MAX_WORKGROUPS_PER_DIMENSION = 65535

PACKED_DTYPES = frozenset({dtypes.bool_, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.float16,
                           dtypes.bfloat16})
VALUE_TYPES: dict[DType, str] = {
    dtypes.bool_: "bool", dtypes.int8: "i32", dtypes.int16: "i32", dtypes.int32: "i32", dtypes.int64: "i64",
    dtypes.uint8: "u32", dtypes.uint16: "u32", dtypes.uint32: "u32", dtypes.uint64: "u64",
    dtypes.float16: "f32", dtypes.bfloat16: "f32", dtypes.float32: "f32", dtypes.float64: "f64",
}
WRAPPING_OPS = frozenset({Op.NEG, Op.NOT, Op.ADD, Op.SUB, Op.MUL, Op.IDIV, Op.SHL, Op.CAST, Op.BITCAST})
# Vulkan allows exp2 an error of 3 + 2|x| ulp, log2 2^-21 absolute near 1 and sin 2^-11 (Mesa's sin is off by whole
# units beyond |x| ~ 1e3); WGSL has no f64 transcendentals at all
EXPANDED_MATH = frozenset({(Op.EXP2, dtypes.float32), (Op.LOG2, dtypes.float32), (Op.SIN, dtypes.float32),
                           (Op.EXP2, dtypes.float64), (Op.LOG2, dtypes.float64), (Op.SIN, dtypes.float64)})

Template = Callable[[list[str], DType, DType], str]  # (operands, result dtype, operand dtype) -> expression

FLOAT_HELPERS = """fn ember_isnan_{t}(x: {t}) -> bool {{ return (bitcast<{u}>(x) & {abs_mask}) > {inf_bits}; }}
fn ember_lt_{t}(a: {t}, b: {t}) -> bool {{ return a < b && !ember_isnan_{t}(a) && !ember_isnan_{t}(b); }}
fn ember_eq_{t}(a: {t}, b: {t}) -> bool {{ return a == b && !ember_isnan_{t}(a) && !ember_isnan_{t}(b); }}
fn ember_max_{t}(a: {t}, b: {t}) -> {t} {{ return select(b, a, ember_isnan_{t}(a) || (a > b && !ember_isnan_{t}(b))); }}
fn ember_nonzero_{t}(x: {t}) -> bool {{ return x != {zero} || ember_isnan_{t}(x); }}"""
FLOAT_HELPER_ARGUMENTS = {
    "f32": {"t": "f32", "u": "u32", "abs_mask": "0x7fffffffu", "inf_bits": "0x7f800000u", "zero": "0.0f"},
    "f64": {"t": "f64", "u": "u64", "abs_mask": "0x7ffffffffffffffflu", "inf_bits": "0x7ff0000000000000lu",
            "zero": "0.0lf"},
}

PACKING_HELPERS = {
    "opaque": "var<private> ember_zero: u32;  // 0 at run time, unknown to the compiler (set from id.z)",
    "opaque_f32": "fn ember_opaque_f32(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) | ember_zero); }",
    "opaque_f64": "fn ember_opaque_f64(x: f64) -> f64 { return bitcast<f64>(bitcast<u64>(x) | u64(ember_zero)); }",
    "opaque_i32": "fn ember_opaque_i32(x: i32) -> i32 { return x | i32(ember_zero); }",
    "opaque_u32": "fn ember_opaque_u32(x: u32) -> u32 { return x | ember_zero; }",
    "opaque_i64": "fn ember_opaque_i64(x: i64) -> i64 { return x | i64(ember_zero); }",
    "opaque_u64": "fn ember_opaque_u64(x: u64) -> u64 { return x | u64(ember_zero); }",
    "lt_i64": """fn ember_lt_i64(a: i64, b: i64) -> bool {  // in 32-bit halves: Mesa 22 miscompiles some i64 `<`
  let high_a = i32(a >> 32u);
  let high_b = i32(b >> 32u);
  return high_a < high_b || (high_a == high_b && u32(a & 0xffffffffli) < u32(b & 0xffffffffli));
}""",
    "lt_u64": """fn ember_lt_u64(a: u64, b: u64) -> bool {
  let high_a = u32(a >> 32u);
  let high_b = u32(b >> 32u);
  return high_a < high_b || (high_a == high_b && u32(a & 0xfffffffflu) < u32(b & 0xfffffffflu));
}""",
    "unpack8": """fn ember_unpack_u8(word: u32, index: i32) -> u32 { return (word >> (u32(index & 3) * 8u)) & 0xffu; }
fn ember_unpack_i8(word: u32, index: i32) -> i32 {
  return bitcast<i32>(word << (24u - u32(index & 3) * 8u)) >> 24u;
}""",
    "unpack16": """fn ember_unpack_u16(word: u32, index: i32) -> u32 {
  return (word >> (u32(index & 1) * 16u)) & 0xffffu;
}
fn ember_unpack_i16(word: u32, index: i32) -> i32 {
  return bitcast<i32>(word << (16u - u32(index & 1) * 16u)) >> 16u;
}""",
    "f16": """fn ember_f16_to_f32(bits: u32) -> f32 {
  let sign = (bits & 0x8000u) << 16u;
  let exponent = (bits >> 10u) & 0x1fu;
  let mantissa = bits & 0x3ffu;
  if (exponent == 0x1fu) { return bitcast<f32>(sign | 0x7f800000u | (mantissa << 13u)); }
  if (exponent != 0u) { return bitcast<f32>(sign | ((exponent + 112u) << 23u) | (mantissa << 13u)); }
  if (mantissa == 0u) { return bitcast<f32>(sign); }
  let top = firstLeadingBit(mantissa);  // a subnormal half is mantissa * 2^-24: normalize it
  return bitcast<f32>(sign | ((top + 103u) << 23u) | ((mantissa << (23u - top)) & 0x7fffffu));
}
fn ember_f32_to_f16(value: f32) -> u32 {
  let bits = bitcast<u32>(value);
  let sign = (bits >> 16u) & 0x8000u;
  let magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) { return sign | 0x7e00u | ((magnitude >> 13u) & 0x3ffu); }
  if (magnitude >= 0x477ff000u) { return sign | 0x7c00u; }
  if (magnitude >= 0x38800000u) {  // a normal half: round the mantissa to nearest even, rebias the exponent
    return sign | ((magnitude + 0xfffu + ((magnitude >> 13u) & 1u) - 0x38000000u) >> 13u);
  }
  let exponent = magnitude >> 23u;
  if (exponent < 102u) { return sign; }
  let mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  let shift = 126u - exponent;
  let half = 1u << (shift - 1u);
  let rest = mantissa & ((1u << shift) - 1u);
  let quotient = mantissa >> shift;
  return sign | (quotient + select(0u, 1u, rest > half || (rest == half && (quotient & 1u) == 1u)));
}
fn ember_round_f16(value: f32) -> f32 { return ember_f16_to_f32(ember_f32_to_f16(value)); }""",
    "bf16": """fn ember_f32_to_bf16(value: f32) -> u32 {
  let bits = bitcast<u32>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) { return (bits >> 16u) | 64u; }
  return (bits + 0x7fffu + ((bits >> 16u) & 1u)) >> 16u;
}
fn ember_round_bf16(value: f32) -> f32 { return bitcast<f32>(ember_f32_to_bf16(value) << 16u); }""",
}
HELPER_ORDER = ("opaque", "opaque_f32", "opaque_f64", "opaque_i32", "opaque_u32", "opaque_i64", "opaque_u64",
                "lt_i64", "lt_u64", "f32", "f64", "unpack8", "unpack16", "f16", "bf16")


class WGSLRenderer(StepRenderer[KernelBody]):
    """Renders kernel IR to WGSL. `int64`/`float64` allow i64/u64/f64 (wgpu-native extensions)."""

    language = "WGSL"

    def __init__(self, int64: bool = False, float64: bool = False, workgroup_size: int = WORKGROUP_SIZE) -> None:
        self.int64 = int64
        self.float64 = float64
        self.workgroup_size = workgroup_size
        self.reads_memory: dict[int, bool] = {}  # per kernel: whether a node's value depends on a load
        self.helpers: set[str] = set()
        self.workgroup_arrays: list[str] = []  # per kernel: the local memory of its group reduces
        self.alu: dict[Op | IROp, Template] = {
            Op.NEG: self._negate,
            Op.RECIPROCAL: lambda o, d, s: f"({self.constant(1.0, d)} / {o[0]})",
            Op.SQRT: lambda o, d, s: f"sqrt({o[0]})",
            Op.EXP2: lambda o, d, s: f"exp2({o[0]})",
            Op.LOG2: lambda o, d, s: f"log2({o[0]})",
            Op.SIN: lambda o, d, s: f"sin({o[0]})",
            Op.TRUNC: lambda o, d, s: f"trunc({o[0]})",
            Op.NOT: lambda o, d, s: f"(!{o[0]})" if d.is_bool else f"(~{o[0]})",
            Op.ADD: lambda o, d, s: f"({o[0]} | {o[1]})" if d.is_bool else f"({o[0]} + {o[1]})",
            Op.SUB: lambda o, d, s: f"({o[0]} != {o[1]})" if d.is_bool else f"({o[0]} - {o[1]})",
            Op.MUL: lambda o, d, s: f"({o[0]} & {o[1]})" if d.is_bool else f"({o[0]} * {o[1]})",
            Op.DIV: lambda o, d, s: f"({o[0]} / {o[1]})",
            Op.IDIV: lambda o, d, s: f"select({o[0]} / {o[1]}, {self.constant(0, d)}, {o[1]} == {self.constant(0, d)})",
            Op.MOD: lambda o, d, s: f"select({o[0]} % {o[1]}, {self.constant(0, d)}, {o[1]} == {self.constant(0, d)})",
            Op.MAX: self._maximum,
            Op.CMPLT: self._less,
            Op.CMPEQ: self._equal,
            Op.AND: lambda o, d, s: f"({o[0]} & {o[1]})",
            Op.OR: lambda o, d, s: f"({o[0]} | {o[1]})",
            Op.XOR: lambda o, d, s: f"({o[0]} != {o[1]})" if d.is_bool else f"({o[0]} ^ {o[1]})",
            Op.SHL: lambda o, d, s: f"({o[0]} << {_as_u32(o[1])})",
            Op.SHR: lambda o, d, s: f"({o[0]} >> {_as_u32(o[1])})",
            Op.WHERE: lambda o, d, s: f"select({o[2]}, {o[1]}, {o[0]})",
            Op.CAST: lambda o, d, s: self.cast(o[0], d, s),
            Op.BITCAST: lambda o, d, s: self.bitcast(o[0], d, s),
        }
        missing = ELEMENTWISE_OPS - self.alu.keys()
        assert not missing, f"the WGSL ALU table lacks {missing}"

    # ---- types and constants ----------------------------------------------------------------------------------

    def value_type(self, dtype: DType) -> str:
        wide_integer = dtype in (dtypes.int64, dtypes.uint64)
        if (wide_integer and not self.int64) or (dtype == dtypes.float64 and not self.float64):
            raise CompileError(f"WGSL has no {dtype.name} on this adapter (no shader-int64/shader-f64 feature)")
        return VALUE_TYPES[dtype]

    def storage_type(self, dtype: DType, is_output: bool) -> str:
        if dtype in PACKED_DTYPES:
            return "atomic<u32>" if is_output else "u32"
        return self.value_type(dtype)

    def constant(self, value: float, dtype: DType) -> str:
        kind = self.value_type(dtype)
        if kind == "bool":
            return "true" if value else "false"
        if kind in ("f32", "f64"):
            value = float(value)
            smallest_normal = 2.0**-126 if kind == "f32" else 2.0**-1022
            if math.isfinite(value) and (value == 0.0 or abs(value) >= smallest_normal):
                text = repr(value)
                return text + ("f" if kind == "f32" else "lf")
            if kind == "f32":
                return f"bitcast<f32>(0x{struct.unpack('<I', struct.pack('<f', value))[0]:08x}u)"
            return f"bitcast<f64>(0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016x}lu)"
        value = int(value)
        if kind == "i32":
            return f"{value}i" if value > -(2**31) else "(-2147483647i - 1i)"
        if kind == "i64":
            return f"{value}li" if value > -(2**63) else "(-9223372036854775807li - 1li)"
        return f"{value}u" if kind == "u32" else f"{value}lu"

    def wrap(self, expression: str, dtype: DType) -> str:
        """An i32/u32 expression brought back to the range of an 8- or 16-bit integer dtype."""
        if dtype == dtypes.int8:
            return f"(({expression} << 24u) >> 24u)"
        if dtype == dtypes.int16:
            return f"(({expression} << 16u) >> 16u)"
        if dtype == dtypes.uint8:
            return f"({expression} & 0xffu)"
        if dtype == dtypes.uint16:
            return f"({expression} & 0xffffu)"
        return expression

    def _float_helper(self, dtype: DType) -> str:
        kind = self.value_type(dtype)
        self.helpers.add(kind)
        return kind

    # ---- ALU templates that depend on the dtype ---------------------------------------------------------------

    def _negate(self, operands: list[str], dtype: DType, _: DType) -> str:
        if dtype.is_unsigned:
            return f"({self.constant(0, dtype)} - {operands[0]})"
        return f"(-{operands[0]})"

    def _maximum(self, operands: list[str], dtype: DType, _: DType) -> str:
        a, b = operands
        if dtype.is_bool:
            return f"({a} | {b})"
        if dtype.is_float:
            return f"ember_max_{self._float_helper(dtype)}({a}, {b})"
        if dtype.itemsize == 8:
            return f"select({a}, {b}, {self._less([a, b], dtypes.bool_, dtype)})"
        return f"max({a}, {b})"

    def _less(self, operands: list[str], _: DType, source: DType) -> str:
        a, b = operands
        if source.is_bool:
            return f"(!{a} & {b})"
        if source.is_float:
            return f"ember_lt_{self._float_helper(source)}({a}, {b})"
        if source.itemsize == 8:
            kind = self.value_type(source)
            self.helpers.add(f"lt_{kind}")
            return f"ember_lt_{kind}({a}, {b})"
        return f"({a} < {b})"

    def _equal(self, operands: list[str], _: DType, source: DType) -> str:
        if source.is_float:
            return f"ember_eq_{self._float_helper(source)}({operands[0]}, {operands[1]})"
        return f"({operands[0]} == {operands[1]})"

    def cast(self, value: str, dtype: DType, source: DType) -> str:
        """A value conversion with C's semantics (float to int truncates; to a narrow int wraps)."""
        if dtype.is_bool:
            if source.is_float:
                return f"ember_nonzero_{self._float_helper(source)}({value})"
            return f"({value} != {self.constant(0, source)})"
        if source.is_bool:
            return f"select({self.constant(0, dtype)}, {self.constant(1, dtype)}, {value})"
        if dtype.is_float and source.kind in "iu" and source.itemsize == 8:
            # a 64-bit integer converted to a float goes through `ember_opaque_*`: lavapipe gave f32(i64(x)) of a
            # negative int32 x a value every comparison with 0 called non-negative (log(-1) was -177.4, not NaN:
            # fuzz seed 4341), as if its sign were lost to a fold of the two conversions
            kind = self.value_type(source)
            self.helpers.update({"opaque", f"opaque_{kind}"})
            value = f"ember_opaque_{kind}({value})"
        if dtype == dtypes.float16:
            self.helpers.add("f16")
            return f"ember_round_f16({self._to_f32(value, source)})"
        if dtype == dtypes.bfloat16:
            self.helpers.add("bf16")
            return f"ember_round_bf16({self._to_f32(value, source)})"
        target = self.value_type(dtype)
        if dtype.is_float:
            return value if self.value_type(source) == target else f"{target}({value})"
        if source.is_float and dtype.is_unsigned and dtype.itemsize < 4:
            return self.wrap(f"u32(i32({value}))", dtype)  # C: negative floats wrap through int
        if source.kind == "i" and dtype == dtypes.uint64:
            value = f"i64({value})"  # sign-extend first, as C does
        if source.kind == "u" and source.itemsize <= 4 and dtype == dtypes.int64:
            value = f"u64({value})"  # zero-extend first (naga's i64(u32) sign-extends)
        converted = value if self.value_type(source) == target else f"{target}({value})"
        return self.wrap(converted, dtype)

    def _to_f32(self, value: str, source: DType) -> str:
        return value if self.value_type(source) == "f32" else f"f32({value})"

    def bitcast(self, value: str, dtype: DType, source: DType) -> str:
        bits = self._bits_of(value, source)
        if dtype == dtypes.float16:
            self.helpers.add("f16")
            return f"ember_f16_to_f32({bits})"
        if dtype == dtypes.bfloat16:
            return f"bitcast<f32>({bits} << 16u)"
        if dtype.itemsize < 4:
            return self.wrap(f"bitcast<{self.value_type(dtype)}>({bits})", dtype)
        return f"bitcast<{self.value_type(dtype)}>({bits})"

    def _bits_of(self, value: str, source: DType) -> str:
        """The raw bits of a value as u32 (types up to 4 bytes, the upper bits zero) or u64."""
        if source == dtypes.float16:
            self.helpers.add("f16")
            return f"ember_f32_to_f16({value})"
        if source == dtypes.bfloat16:
            self.helpers.add("bf16")
            return f"ember_f32_to_bf16({value})"
        if source.itemsize < 4:
            mask = "0xffu" if source.itemsize == 1 else "0xffffu"
            return f"(bitcast<u32>({value}) & {mask})"
        return f"bitcast<{'u64' if source.itemsize == 8 else 'u32'}>({value})"

    # ---- memory -----------------------------------------------------------------------------------------------

    def load(self, position: int, dtype: DType, index: str) -> str:
        array = f"data{position}"
        if dtype not in PACKED_DTYPES:
            return f"{array}[{index}]"
        if dtype.itemsize == 1:
            self.helpers.add("unpack8")
            word = f"{array}[{index} >> 2u]"
            if dtype == dtypes.int8:
                return f"ember_unpack_i8({word}, {index})"
            unpacked = f"ember_unpack_u8({word}, {index})"
            return f"({unpacked} != 0u)" if dtype.is_bool else unpacked
        self.helpers.add("unpack16")
        word = f"{array}[{index} >> 1u]"
        if dtype == dtypes.int16:
            return f"ember_unpack_i16({word}, {index})"
        unpacked = f"ember_unpack_u16({word}, {index})"
        if dtype == dtypes.float16:
            self.helpers.add("f16")
            return f"ember_f16_to_f32({unpacked})"
        if dtype == dtypes.bfloat16:
            return f"bitcast<f32>({unpacked} << 16u)"
        return unpacked

    def store_lines(self, position: int, dtype: DType, index: str, value: str, number: int, pad: str) -> list[str]:
        """The statements storing a value (8- and 16-bit types: merged into their u32 word with two atomics)."""
        array = f"data{position}"
        if dtype not in PACKED_DTYPES:
            return [f"{pad}{array}[{index}] = {value};"]
        if dtype.is_bool:
            bits = f"select(0u, 1u, {value})"
        elif dtype.is_float:
            bits = self._bits_of(value, dtype)
        else:
            bits = f"(bitcast<u32>({value}) & {'0xffu' if dtype.itemsize == 1 else '0xffffu'})"
        per_word, width = (4, 8) if dtype.itemsize == 1 else (2, 16)
        mask = "0xffu" if width == 8 else "0xffffu"
        return [
            f"{pad}let word{number} = &{array}[{index} >> {per_word.bit_length() - 1}u];",
            f"{pad}let shift{number} = u32({index} & {per_word - 1}) * {width}u;",
            f"{pad}atomicAnd(word{number}, ~({mask} << shift{number}));",
            f"{pad}atomicOr(word{number}, {bits} << shift{number});",
        ]

    # ---- the kernel -------------------------------------------------------------------------------------------

    @staticmethod
    def dispatch_size(global_size: int, workgroup_size: int = WORKGROUP_SIZE) -> tuple[int, int, int]:
        """Workgroups along x and y (WebGPU allows at most 65535 per dimension), as the wgpu device launches them."""
        return work_group_counts(global_size, workgroup_size, MAX_WORKGROUPS_PER_DIMENSION)

    def render(self, kernel: KernelIR) -> str:
        if kernel.index_dtype != dtypes.int32:
            raise DeviceError(
                f"kernel {kernel.name} needs 64-bit indices (a tensor, view or loop of 2**31 elements or more); WGSL "
                f"kernels index with 32-bit integers, up to 2**31 - 1 elements: run this computation on the c or "
                f"opencl device")
        self.helpers = set()
        self.reads_memory = {}
        self.workgroup_arrays = []
        kernel = expand_math(kernel, EXPANDED_MATH, wide_integers=self.int64)
        body = KernelBody(kernel, self.constant_operand, depth=1)
        self.render_steps(body)

        declarations = [
            f"@group(0) @binding({param.position}) var<storage, {'read_write' if param.is_output else 'read'}> "
            f"data{param.position}: array<{self.storage_type(param.dtype, param.is_output)}>;"
            for param in kernel.params
        ]
        workgroup_size = kernel.local_size or self.workgroup_size
        groups = self.dispatch_size(kernel.global_size, workgroup_size)
        dynamic = kernel.size_parameter is not None  # a shape class's kernel: its global size is known at launch
        bound = f"data{kernel.size_parameter}[0]" if dynamic else f"{kernel.global_size}i"
        if kernel.local_size is not None:
            # a workgroup kernel: groups that are wholly past the end return (workgroup_id is uniform, so every
            # barrier after it is still reached by all the group's items or by none)
            arguments = ("@builtin(global_invocation_id) id: vec3<u32>, @builtin(local_invocation_index) "
                         "local_index: u32, @builtin(workgroup_id) workgroup: vec3<u32>, @builtin(num_workgroups) "
                         "groups: vec3<u32>")
            start = ["  let ember_group = i32(workgroup.x + workgroup.y * groups.x);",
                     f"  if (ember_group >= {kernel.global_size // kernel.local_size}i) {{ return; }}",
                     "  let ember_lid = i32(local_index);"]
        elif groups[1] == 1 and not dynamic:
            arguments, global_id = "@builtin(global_invocation_id) id: vec3<u32>", "i32(id.x)"
            start = [f"  let gid = {global_id};", f"  if (gid >= {bound}) {{ return; }}"]
        else:
            arguments = "@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>"
            global_id = f"i32(id.x + id.y * groups.x * {self.workgroup_size}u)"
            start = [f"  let gid = {global_id};", f"  if (gid >= {bound}) {{ return; }}"]
        helpers = [
            FLOAT_HELPERS.format(**FLOAT_HELPER_ARGUMENTS[name]) if name in FLOAT_HELPER_ARGUMENTS
            else PACKING_HELPERS[name]
            for name in HELPER_ORDER if name in self.helpers
        ]
        lines = [
            *helpers,
            *declarations,
            *self.workgroup_arrays,
            f"@compute @workgroup_size({workgroup_size})",
            f"fn {kernel.name}({arguments}) {{",
            *(["  ember_zero = id.z;"] if "opaque" in self.helpers else []),
            *start,
            *body.lines,
            "}",
        ]
        return "\n".join(lines) + "\n"

    # ---- the steps (render_steps.StepRenderer walks the kernel) ----------------------------------------------

    def constant_operand(self, node: IRNode) -> str:
        return self.constant(node.arg, node.dtype)

    def open_loop(self, body: KernelBody, node: IRNode) -> None:
        name = body.names[id(node)] = f"loop{node.arg[0]}"
        size = body.operand(node.srcs[0]) if node.srcs else f"{node.arg[1]}i"  # (a size known at launch: a value)
        body.line(f"for (var {name}: i32 = 0i; {name} < {size}; {name}++) {{")
        body.depth += 1

    def close_loop(self, body: KernelBody, node: IRNode) -> None:
        body.depth -= 1
        body.line("}")

    def define_accumulator(self, body: KernelBody, node: IRNode) -> None:
        name = body.name_of(node, "acc")
        identity = self.constant(reduce_identity(node.arg, node.dtype), node.dtype)
        if REDUCE_COMBINE[node.arg] is Op.ADD and node.dtype.is_float:
            # a sum starts from +0.0 the compiler cannot see: Mesa unrolled a short loop and folded 0.0 + x to x,
            # so a sum of -0.0 values gave -0.0 where torch gives +0.0 (fuzz seed 20261614)
            kind = self.value_type(node.dtype)
            self.helpers.update({"opaque", f"opaque_{kind}"})
            identity = f"ember_opaque_{kind}({identity})"
        body.line(f"var {name}: {self.value_type(node.dtype)} = {identity};")

    def update_accumulator(self, body: KernelBody, node: IRNode) -> None:
        name = body.names[id(node)]
        combine = REDUCE_COMBINE[node.arg]
        value = body.operand(node.srcs[0])
        if combine is Op.MUL and node.dtype.is_float:
            # a product's factors pass through ember_opaque: Mesa unrolled a short loop whose last factor was a
            # padded 0 and folded the product to 0 (the product of [NaN, 0] gave 0, not NaN: fuzz seed 120)
            kind = self.value_type(node.dtype)
            self.helpers.update({"opaque", f"opaque_{kind}"})
            value = f"ember_opaque_{kind}({value})"
        update = self.alu[combine]([name, value], node.dtype, node.dtype)
        if combine in WRAPPING_OPS:
            update = self.wrap(update, node.dtype)
        body.line(f"{name} = {update};")

    def store(self, body: KernelBody, node: IRNode) -> None:
        param, index, value = node.srcs
        if shared_array(param) is not None:  # a workgroup tile: its values' own type
            body.line(f"{body.operand(param)}[{body.operand(index)}] = {body.operand(value)};")
            return
        body.lines.extend(self.store_lines(param.arg[0], param.dtype, body.operand(index), body.operand(value),
                                           body.number(), "  " * body.depth))

    def value(self, body: KernelBody, node: IRNode) -> None:
        name = body.name_of(node, "v")
        body.line(f"let {name}: {self.value_type(node.dtype)} = {self.expression(node, body.operand)};")

    def define_local(self, body: KernelBody, node: IRNode) -> None:
        self.refuse_scratch_arrays(body, node)

    def define_shared(self, body: KernelBody, node: IRNode) -> None:
        """A workgroup array (a tile of a workgroup kernel), read and written as a buffer."""
        name = body.names[id(node)] = f"ember_tile{node.arg[0]}"
        self.workgroup_arrays.append(f"var<workgroup> {name}: array<{self.value_type(node.dtype)}, {node.arg[1]}>;")

    def barrier(self, body: KernelBody, node: IRNode) -> None:
        body.line("workgroupBarrier();")

    def group_reduce(self, body: KernelBody, node: IRNode) -> None:
        """The group's values combined by a tree in a workgroup array: each item stores its value, then half the
        items combine pairs, halving until element 0 holds the result, with a barrier after every level."""
        number = body.number()
        array, stride, kind = f"ember_shared{number}", f"stride{number}", self.value_type(node.dtype)
        size = body.kernel.local_size
        assert size is not None and size & (size - 1) == 0, "a group reduce needs a power-of-two local size"
        self.workgroup_arrays.append(f"var<workgroup> {array}: array<{kind}, {size}>;")
        combine = REDUCE_COMBINE[node.arg]
        update = self.alu[combine]([f"{array}[ember_lid]", f"{array}[ember_lid + {stride}]"], node.dtype, node.dtype)
        if combine in WRAPPING_OPS:
            update = self.wrap(update, node.dtype)
        body.line(f"{array}[ember_lid] = {body.operand(node.srcs[0])};")
        body.line("workgroupBarrier();")
        body.line(f"for (var {stride}: i32 = {size // 2}i; {stride} > 0i; {stride} = {stride} >> 1u) {{")
        body.line(f"  if (ember_lid < {stride}) {{ {array}[ember_lid] = {update}; }}")
        body.line("  workgroupBarrier();")
        body.line("}")
        name = body.name_of(node, "g")
        body.line(f"let {name}: {kind} = {array}[0];")

    def _hide_from_fast_math(self, node: IRNode, operands: list[str]) -> list[str]:
        """Pass one operand through `ember_opaque_*` where Mesa's inexact algebra would drop a NaN or infinity or
        change the rounding or the sign of zero: x - x -> 0, x / x -> 1, x + (-x) -> 0, x * 0 -> 0, 0 / x -> 0,
        x / c -> x * (1 / c), x + 0 -> x, 0 - x -> -x."""
        if len(node.srcs) < 2:
            return operands
        a, b = node.srcs[0], node.srcs[1]
        negated = (b.op is Op.NEG and b.srcs[0] is a) or (a.op is Op.NEG and a.srcs[0] is b)
        same = a is b or (node.op is Op.ADD and negated)
        hide = None
        if same and node.op in (Op.SUB, Op.DIV, Op.ADD):
            hide = 1
        elif node.op is Op.MUL and (self._may_become_zero(a) or self._may_become_zero(b)):
            # x * 0 -> 0 (also once a loop is unrolled): every factor the compiler may see as zero is hidden (the
            # zero constant of sqrt(-1) * 0, not only the factor computed from constants: relu of NaN gave 0)
            # (not where the other factor is a constant, which the compiler folds exactly: 0 * c)
            hidden = [index for index, (factor, other) in enumerate(((a, b), (b, a)))
                      if self._may_become_zero(factor) and not (other.is_const and not _is_zero(other))]
            return self._opaque_operands(node, operands, hidden)
        elif node.op is Op.DIV and b.is_const:
            hide = 1  # Mesa turns x / c into x * (1 / c): inexact, and x / 0 gives 0
        elif node.op is Op.DIV and self._may_become_zero(a):
            hide = 0  # Mesa folds 0 / x to 0 (NaN at x = 0 or NaN)
        elif node.op in (Op.ADD, Op.SUB) and (_is_zero(a) or _is_zero(b)):
            hide = 0 if _is_zero(a) else 1  # x + 0 -> x and 0 - x -> -x lose the sign of zero
        if hide is None:
            return operands
        return self._opaque_operands(node, operands, [hide])

    def _opaque_operands(self, node: IRNode, operands: list[str], hidden: list[int]) -> list[str]:
        """The operands with those at the `hidden` positions passed through `ember_opaque_*`."""
        operands = list(operands)
        for index in hidden:
            kind = self.value_type(node.srcs[index].dtype)
            self.helpers.update({"opaque", f"opaque_{kind}"})
            operands[index] = f"ember_opaque_{kind}({operands[index]})"
        return operands

    def _may_become_zero(self, node: IRNode) -> bool:
        """Whether the shader compiler may see a float value as a constant zero (and fold its product to 0): a
        zero constant, or a value that reads no memory, computed from constants and loop counters (an unrolled
        loop makes a counter constant: `x * float(i)` is `x * 0.0` in the first iteration); a bool converted to a float
        or a select with a zero branch, whose condition the compiler may decide (`b != b` of a loaded bool is false:
        NaN * float(b != b) gave 0, not NaN; fuzz seed 117)."""
        if node.is_const:
            return _is_zero(node)
        base = node  # (through negations and float conversions, which keep a zero a zero: fuzz seed 117 again)
        while base.dtype.is_float and (base.op is Op.NEG or (base.op is Op.CAST and base.srcs[0].dtype.is_float)):
            base = base.srcs[0]
        if base.dtype.is_float and ((base.op is Op.CAST and base.srcs[0].dtype.is_bool) or (
                base.op is Op.WHERE and any(_is_zero(branch) for branch in base.srcs[1:]))):
            return True
        return node.dtype.is_float and not compute_bottom_up(
            node, lambda below: below.srcs,
            lambda below: below.op is IROp.LOAD or any(self.reads_memory[id(src)] for src in below.srcs),
            self.reads_memory)

    def expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        """A value's expression: LOAD has its own code, every ALU op goes through its template (with the guards
        against the shader compiler's constant evaluation and inexact algebra below)."""
        if node.op is IROp.LOAD:
            return self.load_expression(node, operand)
        return self.alu_expression(node, operand)

    def load_expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        param, index = node.srcs[0], node.srcs[1]
        if shared_array(param) is not None:
            loaded = f"{operand(param)}[{operand(index)}]"
        else:
            loaded = self.load(param.arg[0], param.dtype, operand(index))
        if len(node.srcs) == 3:
            return f"select({self.constant(0, node.dtype)}, {loaded}, {operand(node.srcs[2])})"
        return loaded

    def alu_expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        source = node.srcs[1].dtype if node.op is Op.WHERE else node.srcs[0].dtype
        operands = [operand(src) for src in node.srcs]
        if node.dtype.is_float or (node.op is Op.CMPEQ and source.is_float):
            operands = self._hide_from_fast_math(node, operands)
        if node.srcs and all(src.is_const for src in node.srcs) and not node.srcs[0].dtype.is_bool:
            # computed at run time: WGSL evaluates constant expressions when the shader is created and rejects
            # an infinite, NaN or overflowing result (1.0f / 0.0f)
            kind = self.value_type(node.srcs[0].dtype)
            self.helpers.update({"opaque", f"opaque_{kind}"})
            operands[0] = f"ember_opaque_{kind}({operands[0]})"
        if node.op in (Op.IDIV, Op.MOD) and node.srcs[1].is_const and node.srcs[1].arg != 0:
            symbol = "/" if node.op is Op.IDIV else "%"  # no zero to guard against
            return self.wrap(f"({operands[0]} {symbol} {operands[1]})", node.dtype)
        if node.op in (Op.SHL, Op.SHR) and node.srcs[1].is_const:
            # a constant shift must be a u32 below the bit width (runtime shifts are taken modulo the width)
            width = 64 if node.dtype.itemsize == 8 else 32
            operands[1] = f"{int(node.srcs[1].arg) % width}u"
        expression = self.alu[node.op](operands, node.dtype, source)
        if node.op in (Op.ADD, Op.SUB) and node.dtype.is_float:
            # a sum the optimizer cannot see into: no reassociation such as (x + 1) - 1 -> x, which would undo
            # compensated arithmetic (Kahan's log1p, Cody-Waite reductions)
            kind = self.value_type(node.dtype)
            self.helpers.update({"opaque", f"opaque_{kind}"})
            return f"ember_opaque_{kind}{expression}"
        if node.op in WRAPPING_OPS and node.op not in (Op.CAST, Op.BITCAST):
            return self.wrap(expression, node.dtype)
        return expression


def _is_zero(node: IRNode) -> bool:
    return node.is_const and node.arg == 0


def _as_u32(shift: str) -> str:
    return shift if shift.endswith("u") and shift[:-1].isdigit() else f"u32({shift})"

