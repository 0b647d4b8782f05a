"""The C-style renderer shared by C and OpenCL C: a table from IR op to a template, and the kernel skeleton."""

from __future__ import annotations

import math
from collections.abc import Callable

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.ops import Op
from ember.ir.ir import IRNode, IROp, KernelIR
from ember.ir.linearize import linearize

Template = Callable[[list[str], DType, DType], str]  # (operands, result dtype, operand dtype) -> expression


def _signed_division(operands: list[str], dtype: DType, _: DType) -> str:
    a, b = operands
    if dtype.is_unsigned:
        return f"(({b})==0?0:({a})/({b}))"
    return f"(({b})==0?0:(({b})==-1?-({a}):({a})/({b})))"


def _signed_modulo(operands: list[str], dtype: DType, _: DType) -> str:
    a, b = operands
    if dtype.is_unsigned:
        return f"(({b})==0?0:({a})%({b}))"
    return f"(({b})==0||({b})==-1?0:({a})%({b}))"


def _maximum(operands: list[str], dtype: DType, _: DType) -> str:
    a, b = operands
    if dtype.is_float:
        return f"((({a})>({b}))|(({a})!=({a}))?({a}):({b}))"  # no short circuit: gcc vectorizes it
    return f"(({a})>({b})?({a}):({b}))"


WRAPPING_UNSIGNED = {dtypes.int32: dtypes.uint32, dtypes.int64: dtypes.uint64}  # narrower ints promote: no overflow
WRAPPING_SYMBOLS = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.NEG: ""}
UNBOUNDED = (-math.inf, math.inf)


def fits(dtype: DType, bounds: tuple[float, float]) -> bool:
    return dtypes.min_value(dtype) <= bounds[0] and bounds[1] <= dtypes.max_value(dtype)


def value_bounds(node: IRNode, memo: dict[int, tuple[float, float]]) -> tuple[float, float]:
    """The IR's integer value bounds, extended to SUB, NEG and products of bounded values (as if nothing wrapped)."""
    bounds = memo.get(id(node))
    if bounds is not None:
        return bounds
    if node.op in WRAPPING_SYMBOLS and node.dtype.is_int:
        sources = [value_bounds(src, memo) for src in node.srcs]
        (low, high), (other_low, other_high) = sources[0], sources[-1]
        if not all(fits(node.dtype, source) for source in sources):
            bounds = UNBOUNDED  # a source that may have wrapped bounds nothing
        elif node.op is Op.NEG:
            bounds = (-high, -low)
        elif node.op is Op.ADD:
            bounds = (low + other_low, high + other_high)
        elif node.op is Op.SUB:
            bounds = (low - other_high, high - other_low)
        else:
            corners = [a * b for a in (low, high) for b in (other_low, other_high)]
            bounds = (min(corners), max(corners))
    else:
        bounds = (node.minimum, node.maximum)
    memo[id(node)] = bounds
    return bounds


class CStyleRenderer:
    """Renders linearized kernel IR to a C-like language. Subclasses override only the strings that differ."""

    kernel_prefix = "void"
    global_qualifier = ""
    restrict = "restrict"
    float_suffix = "f"
    type_names: dict[DType, str] = {
        dtypes.bool_: "unsigned char", dtypes.int8: "signed char", dtypes.int16: "short", dtypes.int32: "int",
        dtypes.int64: "long long", dtypes.uint8: "unsigned char", dtypes.uint16: "unsigned short",
        dtypes.uint32: "unsigned int", dtypes.uint64: "unsigned long long", dtypes.float16: "_Float16",
        dtypes.bfloat16: "unsigned short", dtypes.float32: "float", dtypes.float64: "double",
    }
    math_functions: dict[Op, str] = {Op.SQRT: "sqrt", Op.EXP2: "exp2", Op.LOG2: "log2", Op.SIN: "sin", Op.TRUNC: "trunc"}

    def __init__(self) -> None:
        self.alu: dict[Op, Template] = {
            Op.NEG: lambda o, d, s: f"(-{o[0]})",
            Op.RECIPROCAL: lambda o, d, s: f"({self.constant(1.0, d)}/{o[0]})",
            **{op: self._math_template(op) for op in self.math_functions},
            Op.NOT: lambda o, d, s: f"(!{o[0]})" if d.is_bool else f"(~{o[0]})",
            Op.ADD: lambda o, d, s: f"({o[0]}+{o[1]})",
            Op.SUB: lambda o, d, s: f"({o[0]}-{o[1]})",
            Op.MUL: lambda o, d, s: f"({o[0]}*{o[1]})",
            Op.DIV: lambda o, d, s: f"({o[0]}/{o[1]})",
            Op.IDIV: _signed_division,
            Op.MOD: _signed_modulo,
            Op.MAX: _maximum,
            Op.CMPLT: lambda o, d, s: f"({o[0]}<{o[1]})",
            Op.CMPEQ: lambda o, d, s: f"({o[0]}=={o[1]})",
            Op.AND: lambda o, d, s: f"({o[0]}&{o[1]})",
            Op.OR: lambda o, d, s: f"({o[0]}|{o[1]})",
            Op.XOR: lambda o, d, s: f"({o[0]}^{o[1]})",
            Op.SHL: lambda o, d, s: f"({o[0]}<<{o[1]})",
            Op.SHR: lambda o, d, s: f"({o[0]}>>{o[1]})",
            Op.WHERE: lambda o, d, s: f"({o[0]}?{o[1]}:{o[2]})",
            Op.CAST: self.cast,
            Op.BITCAST: self.bitcast,
        }
        from ember.core.ops import ELEMENTWISE_OPS

        missing = ELEMENTWISE_OPS - self.alu.keys()
        assert not missing, f"the ALU table lacks {missing}"

    # ---- strings a subclass may change ----------------------------------------------------------------------

    def type_name(self, dtype: DType) -> str:
        return self.type_names[dtype]

    def _math_template(self, op: Op) -> Template:
        return lambda operands, dtype, _: f"{self.math_function(op, dtype)}({operands[0]})"

    def math_function(self, op: Op, dtype: DType) -> str:
        name = self.math_functions[op]
        return name + ("f" if dtype == dtypes.float32 else "")

    def cast(self, operands: list[str], dtype: DType, source: DType) -> str:
        if dtype.is_bool:
            return f"({operands[0]}!=0)"
        if dtype == dtypes.bfloat16:
            return f"ember_float_to_bf16({operands[0]})"
        if source == dtypes.bfloat16:
            return f"ember_bf16_to_float({operands[0]})"
        return f"(({self.type_name(dtype)})({operands[0]}))"

    def signed_from_unsigned(self, expression: str, dtype: DType) -> str:
        """The signed `dtype` with the bits of an unsigned expression (C converts modulo 2^n, as gcc documents)."""
        return f"(({self.type_name(dtype)})({expression}))"

    def wrapping(self, op: Op, operands: list[str], dtype: DType) -> str:
        """Signed add/sub/mul/neg that wraps like PyTorch's: done on the unsigned type (no undefined overflow)."""
        unsigned = self.type_name(WRAPPING_UNSIGNED[dtype])
        values = [f"({unsigned})({value})" for value in operands]
        if op is Op.NEG:
            return self.signed_from_unsigned(f"({unsigned})0-{values[0]}", dtype)
        return self.signed_from_unsigned(f"{values[0]}{WRAPPING_SYMBOLS[op]}{values[1]}", dtype)

    def bitcast(self, operands: list[str], dtype: DType, source: DType) -> str:
        return f"ember_bitcast_{dtype.name}_{source.name}({operands[0]})"

    def constant(self, value: object, dtype: DType) -> str:
        """A literal; negative ones in parentheses (so `a - -1` never renders as the decrement `a--1`)."""
        text = self._literal(value, dtype)
        return f"({text})" if text.startswith("-") else text

    def _literal(self, value: object, dtype: DType) -> str:
        if dtype.is_bool:
            return "1" if value else "0"
        if dtype.is_float:
            value = float(value)  # type: ignore[arg-type]
            if math.isnan(value):
                return "NAN"
            if math.isinf(value):
                return "INFINITY" if value > 0 else "-INFINITY"
            suffix = self.float_suffix if dtype != dtypes.float64 else ""
            return f"{value!r}{suffix}" if "e" in repr(value) or "." in repr(value) else f"{value!r}.0{suffix}"
        value = int(value)  # type: ignore[arg-type]
        if dtype == dtypes.int64:
            return f"{value}LL" if value > -(2**63) else "(-9223372036854775807LL-1)"
        if dtype == dtypes.uint64:
            return f"{value}ULL"
        if dtype == dtypes.uint32:
            return f"{value}u"
        if dtype == dtypes.int32 and value == -(2**31):
            return "(-2147483647-1)"
        return f"(({self.type_name(dtype)}){value})" if dtype.itemsize < 4 else str(value)

    def prelude(self, kernel: KernelIR) -> str:
        return ""

    def signature(self, kernel: KernelIR, parameters: list[str]) -> str:
        return f"{self.kernel_prefix} {kernel.name}({', '.join(parameters)})"

    def parameter(self, dtype: DType, position: int, is_output: bool) -> str:
        const = "" if is_output else "const "
        return f"{self.global_qualifier}{const}{self.type_name(dtype)}* {self.restrict} data{position}".replace("  ", " ")

    def global_loop_open(self, kernel: KernelIR, index_type: str) -> list[str]:
        raise NotImplementedError

    def global_loop_close(self) -> list[str]:
        return []

    # ---- the skeleton -----------------------------------------------------------------------------------------

    def render(self, kernel: KernelIR) -> str:
        self._bounds: dict[int, tuple[float, float]] = {}  # value bounds by node id, valid during one render
        instructions = linearize(kernel.sink)
        names: dict[int, str] = {}
        index_type = self.type_name(kernel.index_dtype)
        lines: list[str] = []
        indent = 1

        def operand(node: IRNode) -> str:
            if node.op is IROp.CONST:
                return self.constant(node.arg, node.dtype)
            return names[id(node)]

        names.update({id(node): "gid" for node in _global_ids(kernel.sink)})
        body: list[str] = []
        counter = 0
        for instruction in instructions:
            node = instruction.node
            pad = "  " * (indent + 1)
            if instruction.kind == "loop":
                name = f"loop{node.arg[0]}"
                names[id(node)] = name
                body.append(f"{pad}for ({index_type} {name} = 0; {name} < {node.arg[1]}; {name}++) {{")
                indent += 1
            elif instruction.kind == "end_loop":
                indent -= 1
                body.append("  " * (indent + 1) + "}")
            elif instruction.kind == "define_acc":
                name = f"acc{counter}"
                counter += 1
                names[id(node)] = name
                body.append(f"{pad}{self.type_name(node.dtype)} {name} = {self.constant(self.identity(node), node.dtype)};")
            elif instruction.kind == "update_acc":
                name = names[id(node)]
                value = operand(node.srcs[0])
                if node.arg in (Op.SUM, Op.PROD) and node.dtype in WRAPPING_UNSIGNED:
                    op = Op.ADD if node.arg is Op.SUM else Op.MUL
                    body.append(f"{pad}{name} = {self.wrapping(op, [name, value], node.dtype)};")
                elif node.arg is Op.SUM:
                    body.append(f"{pad}{name} += {value};")
                elif node.arg is Op.PROD:
                    body.append(f"{pad}{name} *= {value};")
                else:  # the new value first: gcc 12 -O3 vectorizes `acc > v || acc != acc` reductions wrongly
                    body.append(f"{pad}{name} = {_maximum([value, name], node.dtype, node.dtype)};")
            elif instruction.kind == "store":
                param, index, value = node.srcs
                body.append(f"{pad}data{param.arg[0]}[{operand(index)}] = {operand(value)};")
            else:
                name = f"v{counter}"
                counter += 1
                names[id(node)] = name
                body.append(f"{pad}{self.type_name(node.dtype)} {name} = {self.expression(node, operand)};")

        parameters = [self.parameter(p.dtype, p.position, p.is_output) for p in kernel.params]
        lines.append(self.prelude(kernel))
        lines.append(self.signature(kernel, parameters) + " {")
        lines.extend(self.global_loop_open(kernel, index_type))
        lines.extend(body)
        lines.extend(self.global_loop_close())
        lines.append("}")
        return "\n".join(line for line in lines if line != "") + "\n"

    def expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        if node.op is IROp.LOAD:
            param, index = node.srcs[0], node.srcs[1]
            load = f"data{param.arg[0]}[{operand(index)}]"
            if len(node.srcs) == 3:
                return f"({operand(node.srcs[2])}?{load}:{self.constant(0, node.dtype)})"
            return load
        if node.op in (Op.IDIV, Op.MOD) and node.srcs[1].is_const and node.srcs[1].arg > 0:
            symbol = "/" if node.op is Op.IDIV else "%"  # no guard needed for a positive constant divisor
            return f"({operand(node.srcs[0])}{symbol}{operand(node.srcs[1])})"
        if node.dtype in WRAPPING_UNSIGNED:
            # signed int/long arithmetic that may overflow wraps like PyTorch's; index math whose IR bounds fit
            # keeps the plain (faster) form
            if node.op in WRAPPING_SYMBOLS and not fits(node.dtype, value_bounds(node, self._bounds)):
                return self.wrapping(node.op, [operand(src) for src in node.srcs], node.dtype)
            if node.op is Op.IDIV:  # x / -1 is -x, which overflows for the smallest value
                a, b = (operand(src) for src in node.srcs)
                negated = self.wrapping(Op.NEG, [a], node.dtype)
                return f"(({b})==0?{self.constant(0, node.dtype)}:(({b})==-1?{negated}:({a})/({b})))"
        source_dtype = node.srcs[0].dtype if node.srcs else node.dtype
        if node.op is Op.WHERE:
            source_dtype = node.srcs[1].dtype
        return self.alu[node.op]([operand(src) for src in node.srcs], node.dtype, source_dtype)

    @staticmethod
    def identity(node: IRNode) -> object:
        if node.arg is Op.SUM:
            return 0
        if node.arg is Op.PROD:
            return 1
        return dtypes.min_value(node.dtype)


def _global_ids(sink: IRNode) -> list[IRNode]:
    found, stack, seen = [], [sink], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.op is IROp.GLOBAL_ID:
            found.append(node)
        stack.extend(node.srcs)
    return found


def bitcast_helpers(types: dict[DType, str], pairs: set[tuple[DType, DType]], inline: str = "static inline") -> str:
    """C helper functions for the bitcasts a kernel uses (memcpy-free unions)."""
    lines = []
    for target, source in sorted(pairs, key=lambda pair: (pair[0].name, pair[1].name)):
        lines.append(
            f"{inline} {types[target]} ember_bitcast_{target.name}_{source.name}({types[source]} value) "
            f"{{ union {{ {types[source]} s; {types[target]} t; }} u; u.s = value; return u.t; }}"
        )
    return "\n".join(lines)


def used_bitcasts(sink: IRNode) -> set[tuple[DType, DType]]:
    pairs, stack, seen = set(), [sink], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.op is Op.BITCAST:
            pairs.add((node.dtype, node.srcs[0].dtype))
        stack.extend(node.srcs)
    return pairs
