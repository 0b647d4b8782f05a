"""A complete ember backend in one file: kernel IR to Python source, run by the Python interpreter.

The worked example of manuals/adding-a-backend.md. It is slow (one Python loop iteration per work item) but it
goes through the real contract: a renderer that is a table from op to template, a memory pool, a program, a
device with a capability table, and probe(). It is a separate package that registers itself through the
`ember.backends` entry point (see pyproject.toml next to it); ember itself does not know it exists.
"""

from __future__ import annotations

import ctypes
import math
import struct
from typing import Any

from ember.backends.base import COMPLETED, Device, Event, MemoryPool, Program
from ember.capabilities import DeviceInfo
from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.errors import CompileError
from ember.core.ops import ELEMENTWISE_OPS, Op
from ember.ir.ir import IRNode, IROp, KernelIR
from ember.ir.linearize import linearize

# ---- 1. the capability table: what memoryview can hold natively (no half-precision formats) --------------------

FORMATS: dict[DType, str] = {
    dtypes.bool_: "?", dtypes.int8: "b", dtypes.uint8: "B", dtypes.int16: "h", dtypes.uint16: "H",
    dtypes.int32: "i", dtypes.uint32: "I", dtypes.int64: "q", dtypes.uint64: "Q", dtypes.float32: "f",
    dtypes.float64: "d",
}

# ---- 2. the renderer: one template per elementwise op ----------------------------------------------------------

TEMPLATES: dict[Op, str] = {
    Op.NEG: "-{0}", Op.RECIPROCAL: "_divide(1.0, {0})", Op.SQRT: "_sqrt({0})", Op.EXP2: "_exp2({0})",
    Op.LOG2: "_log2({0})", Op.SIN: "_sin({0})", Op.TRUNC: "_trunc({0})", Op.NOT: "~{0}",
    Op.ADD: "{0} + {1}", Op.SUB: "{0} - {1}", Op.MUL: "{0} * {1}", Op.DIV: "_divide({0}, {1})",
    Op.IDIV: "_integer_divide({0}, {1})", Op.MOD: "_remainder({0}, {1})", Op.MAX: "_maximum({0}, {1})",
    Op.CMPLT: "{0} < {1}", Op.CMPEQ: "{0} == {1}", Op.AND: "{0} & {1}", Op.OR: "{0} | {1}", Op.XOR: "{0} ^ {1}",
    Op.SHL: "{0} << ({1} % {bits})", Op.SHR: "{0} >> ({1} % {bits})", Op.WHERE: "{1} if {0} else {2}",
    Op.CAST: "_cast({0}, '{target}')", Op.BITCAST: "_bitcast({0}, '{source}', '{target}')",
}
BOOLEAN_TEMPLATES = {Op.NOT: "not {0}", Op.ADD: "{0} or {1}", Op.MUL: "{0} and {1}", Op.MAX: "{0} or {1}",
                     Op.CMPLT: "(not {0}) and {1}"}
assert ELEMENTWISE_OPS == TEMPLATES.keys(), "the template table must cover every elementwise op"


def fit(expression: str, dtype: DType) -> str:
    """Python numbers are unbounded doubles and ints: round to float32, wrap integers to their width."""
    if dtype == dtypes.float32:
        return f"_f32({expression})"
    if dtype.is_int:
        return f"_wrap({expression}, {dtype.bits}, {dtype.kind == 'i'})"
    return expression


def constant(value: Any, dtype: DType) -> str:
    if dtype.is_bool:
        return repr(bool(value))
    if dtype.is_float:
        return f"float('{float(value)!r}')" if not math.isfinite(float(value)) else repr(float(value))
    return repr(int(value))


class PythonRenderer:
    """Kernel IR to the source of a Python function `kernel(data0, data1, ...)` over memoryviews."""

    def render(self, kernel: KernelIR) -> str:
        names: dict[int, str] = {}

        def operand(node: IRNode) -> str:
            if node.op is IROp.CONST:
                return constant(node.arg, node.dtype)
            return "gid" if node.op is IROp.GLOBAL_ID else names[id(node)]

        lines = [f"def {kernel.name}({', '.join(f'data{param.position}' for param in kernel.params)}):",
                 f"    for gid in range({kernel.global_size}):"]
        indent = "        "
        for number, instruction in enumerate(linearize(kernel.sink)):
            node = instruction.node
            if instruction.kind == "loop":
                names[id(node)] = f"loop{node.arg[0]}"
                lines.append(f"{indent}for loop{node.arg[0]} in range({node.arg[1]}):")
                indent += "    "
            elif instruction.kind == "end_loop":
                indent = indent[:-4]
            elif instruction.kind == "define_acc":
                names[id(node)] = f"acc{number}"
                identity = {Op.SUM: 0, Op.PROD: 1}.get(node.arg, dtypes.min_value(node.dtype))
                lines.append(f"{indent}acc{number} = {constant(identity, node.dtype)}")
            elif instruction.kind == "update_acc":
                combine = {Op.SUM: Op.ADD, Op.PROD: Op.MUL, Op.REDUCE_MAX: Op.MAX}[node.arg]
                value = self.alu(combine, node.dtype, node.dtype, [names[id(node)], operand(node.srcs[0])])
                lines.append(f"{indent}{names[id(node)]} = {value}")
            elif instruction.kind == "store":
                param, index, value = node.srcs
                lines.append(f"{indent}data{param.arg[0]}[{operand(index)}] = {operand(value)}")
            elif node.op is IROp.LOAD:
                names[id(node)] = f"v{number}"
                load = f"data{node.srcs[0].arg[0]}[{operand(node.srcs[1])}]"
                if len(node.srcs) == 3:  # a guarded load (padding): never touches memory outside
                    load = f"({load} if {operand(node.srcs[2])} else {constant(0, node.dtype)})"
                lines.append(f"{indent}v{number} = {load}")
            else:
                names[id(node)] = f"v{number}"
                source = node.srcs[1].dtype if node.op is Op.WHERE else node.srcs[0].dtype
                value = self.alu(node.op, node.dtype, source, [operand(src) for src in node.srcs], _in_range(node))
                lines.append(f"{indent}v{number} = {value}")
        return "\n".join(lines) + "\n"

    @staticmethod
    def alu(op: Op, dtype: DType, source: DType, operands: list[str], in_range: bool = False) -> str:
        boolean = source.is_bool if op in (Op.CMPLT, Op.CMPEQ) else dtype.is_bool
        template = BOOLEAN_TEMPLATES.get(op, TEMPLATES[op]) if boolean else TEMPLATES[op]
        expression = "(" + template.format(*operands, bits=source.bits, source=source.name, target=dtype.name) + ")"
        return expression if op in (Op.CAST, Op.BITCAST) or in_range else fit(expression, dtype)


def _in_range(node: IRNode) -> bool:
    """Integer index math whose bounds (tracked by the IR builder) fit the dtype needs no wrapping."""
    half = 1 << (node.dtype.bits - 1)
    return node.dtype.is_int and -half <= node.minimum and node.maximum < half


# ---- 3. the runtime the generated code calls: IEEE and C semantics on Python numbers ---------------------------


def _f32(value: float) -> float:
    return ctypes.c_float(value).value


def _wrap(value: int, bits: int, signed: bool) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if signed and value >> (bits - 1) else value


def _divide(a: float, b: float) -> float:
    if b == 0:
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _integer_divide(a: int, b: int) -> int:
    return 0 if b == 0 else abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)


def _remainder(a: int, b: int) -> int:
    return 0 if b == 0 else a - b * _integer_divide(a, b)


def _maximum(a: Any, b: Any) -> Any:
    return a if a > b or a != a else b  # noqa: PLR0124 - a != a: a is NaN (a may be an int)


def _sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 else math.nan


def _exp2(x: float) -> float:
    try:
        return math.exp2(x)
    except OverflowError:
        return math.inf


def _log2(x: float) -> float:
    return math.log2(x) if x > 0 else (-math.inf if x == 0 else math.nan)


def _sin(x: float) -> float:
    return math.sin(x) if math.isfinite(x) else math.nan


def _trunc(x: float) -> float:
    return float(math.trunc(x)) if math.isfinite(x) else x


def _cast(value: Any, target: str) -> Any:
    dtype = dtypes.DTYPES_BY_NAME[target]
    if dtype.is_bool:
        return value != 0
    if dtype.is_float:
        return _f32(float(value)) if dtype == dtypes.float32 else float(value)
    if isinstance(value, float):
        value = math.trunc(value) if math.isfinite(value) else 0  # C leaves NaN and inf undefined
        if dtype.is_unsigned and dtype.itemsize < 4:
            value = _wrap(value, 32, True)  # as C does: through int
    return _wrap(int(value), dtype.bits, dtype.kind == "i")


def _bitcast(value: Any, source: str, target: str) -> Any:
    source_format = FORMATS[dtypes.DTYPES_BY_NAME[source]]
    return struct.unpack(FORMATS[dtypes.DTYPES_BY_NAME[target]], struct.pack(source_format, value))[0]


RUNTIME = {name: value for name, value in globals().items() if name.startswith("_") and callable(value)}

# ---- 4. memory, programs and the device ---------------------------------------------------------------------


class PythonMemoryPool(MemoryPool):
    """Buffers are bytearrays (of whole 8-byte words, so every element type can view them)."""

    def create_buffer(self, nbytes: int) -> bytearray:
        return bytearray(-(-nbytes // 8) * 8)

    def destroy_buffer(self, handle: bytearray) -> None:
        return None

    def copy_in(self, handle: bytearray, source: memoryview) -> None:
        handle[: len(source)] = source

    def copy_out(self, destination: memoryview, handle: bytearray) -> None:
        destination[:] = handle[: len(destination)]


class PythonProgram(Program):
    """The rendered function; a launch views each buffer as its parameter's element type and calls it."""

    def __init__(self, source: str, kernel: KernelIR) -> None:
        namespace = dict(RUNTIME)
        try:
            exec(compile(source, f"<ember kernel {kernel.name}>", "exec"), namespace)  # noqa: S102 - our own code
        except SyntaxError as error:
            raise CompileError(f"Python rejected a kernel: {error}\n--- source ---\n{source}") from None
        self.function = namespace[kernel.name]
        self.formats = [FORMATS[param.dtype] for param in kernel.params]

    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        for event in wait_for:
            event.wait()
        self.function(*(memoryview(buffer).cast(form) for buffer, form in zip(buffers, self.formats, strict=True)))
        return COMPLETED  # the launch ran synchronously


class PythonDevice(Device):
    """The Python interpreter as a device."""

    def __init__(self, name: str = "python:0") -> None:
        self.name = name
        self.info = DeviceInfo(supported_dtypes=frozenset(FORMATS), extra={"language": "Python"})
        self.pool = PythonMemoryPool(name)
        self.renderer = PythonRenderer()
        self._programs: dict[str, PythonProgram] = {}

    def render(self, kernel: KernelIR) -> str:
        return self.renderer.render(kernel)

    def compile(self, kernel: KernelIR) -> Program:
        source = self.render(kernel)
        if source not in self._programs:
            self._programs[source] = PythonProgram(source, kernel)
        return self._programs[source]


def probe() -> list[Device]:
    """Always available (a backend with a driver raises BackendUnavailable("why") here instead)."""
    return [PythonDevice()]
