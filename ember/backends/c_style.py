"""The C-style renderer shared by C and OpenCL C: a table from IR op to a template, and the kernel skeleton."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.errors import CompileError
from ember.core.ops import REDUCE_COMBINE, Op, reduce_identity
from ember.core.walk import compute_bottom_up
from ember.backends.render_steps import KernelBody, StepRenderer
from ember.ir.ir import IRNode, IROp, KernelIR, topological_nodes

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
    if dtype.is_bool:  # an OR: gcc 12's SLP vectorizer miscompiles a byte max of 0/1 values (255 instead of 1)
        return f"(({a})|({b}))"
    if dtype.is_float:
        return f"((({a})>({b}))|(({a})!=({a}))?({a}):({b}))"  # no short circuit: gcc vectorizes it
    return f"(({a})>({b})?({a}):({b}))"


WRAPPING_UNSIGNED = {dtypes.int32: dtypes.uint32, dtypes.int64: dtypes.uint64}  # narrower ints promote: no overflow
WRAPPING_SYMBOLS = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.NEG: ""}
UNBOUNDED = (-math.inf, math.inf)


def fits(dtype: DType, bounds: tuple[float, float]) -> bool:
    return dtypes.min_value(dtype) <= bounds[0] and bounds[1] <= dtypes.max_value(dtype)


def value_bounds(root: IRNode, memo: dict[int, tuple[float, float]]) -> tuple[float, float]:
    """The IR's integer value bounds, extended to SUB, NEG and products of bounded values (as if nothing wrapped),
    to integer loads (their dtype's range) and conversions between integer dtypes, and to integer sums (the
    value's bounds times the loop's trip count): a product of bytes summed over a block (a quantized dot product)
    is then plain C arithmetic, which gcc turns into the device's integer dot-product instructions."""

    def extended(node: IRNode) -> bool:
        if node.op is IROp.LOAD or node.op is Op.CAST:
            return node.dtype.is_int and node.srcs[0].dtype.is_int
        if node.op is IROp.REDUCE:
            return node.arg is Op.SUM and node.dtype.is_int
        return node.op in WRAPPING_SYMBOLS and node.dtype.is_int

    def sources(node: IRNode) -> tuple[IRNode, ...]:
        if not extended(node) or node.op is IROp.LOAD:
            return ()
        return node.srcs[:1] if node.op is IROp.REDUCE or node.op is Op.CAST else node.srcs

    def bounds_of(node: IRNode) -> tuple[float, float]:
        if not extended(node):
            if node.dtype.is_int:  # (a value is within its dtype's range: a byte computed by bit ops, say)
                return max(node.minimum, dtypes.min_value(node.dtype)), min(node.maximum, dtypes.max_value(node.dtype))
            return node.minimum, node.maximum
        if node.op is IROp.LOAD:
            return dtypes.min_value(node.dtype), dtypes.max_value(node.dtype)
        sources = [memo[id(src)] for src in node.srcs[:1 if node.op in (IROp.REDUCE, Op.CAST) else None]]
        (low, high), (other_low, other_high) = sources[0], sources[-1]
        if not all(fits(node.dtype, source) for source in sources):
            return UNBOUNDED  # a source that may have wrapped (or a conversion that wraps) bounds nothing
        if node.op is Op.CAST:
            return low, high
        if node.op is IROp.REDUCE:
            count = trip_count(node.srcs[1:])
            return min(0, low * count), max(0, high * count)  # (0: the empty sum, where a loop runs no step)
        if node.op is Op.NEG:
            return -high, -low
        if node.op is Op.ADD:
            return low + other_low, high + other_high
        if node.op is Op.SUB:
            return low - other_high, high - other_low
        corners = [a * b for a in (low, high) for b in (other_low, other_high)]
        return min(corners), max(corners)

    return compute_bottom_up(root, sources, bounds_of, memo)


def trip_count(ranges: tuple[IRNode, ...]) -> float:
    """How many times a loop nest over `ranges` runs its body (inf where a size is known only at launch)."""
    count = 1.0
    for loop in ranges:
        if loop.op is not IROp.RANGE or loop.srcs:
            return math.inf
        count *= loop.arg[1]
    return count


class CStyleRenderer(StepRenderer[KernelBody]):
    """Renders linearized kernel IR to a C-like language. Subclasses override only the strings that differ."""

    language = "C-style"

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
    math_functions: dict[Op | IROp, str] = {Op.SQRT: "sqrt", Op.EXP2: "exp2", Op.LOG2: "log2", Op.SIN: "sin", Op.TRUNC: "trunc"}

    def __init__(self) -> None:
        self.alu: dict[Op | IROp, Template] = {
            Op.NEG: lambda o, d, s: f"(-{o[0]})",
            Op.RECIPROCAL: lambda o, d, s: f"({self.constant(1.0, d)}/{o[0]})",
            **{op: self._math_template(op) for op in self.math_functions},
            Op.NOT: lambda o, d, s: f"(!{o[0]})" if d.is_bool else f"(~{o[0]})",
            Op.ADD: lambda o, d, s: f"({o[0]}|{o[1]})" if d.is_bool else f"({o[0]}+{o[1]})",  # bool: True, not 2
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
        # the values that are not just their op's ALU template: (node, operand) -> expression
        Expression = Callable[[IRNode, Callable[[IRNode], str]], str]
        self.expressions: dict[IROp | Op, Expression] = {
            IROp.LOAD: self.load_expression,
            Op.IDIV: self.division_expression, Op.MOD: self.division_expression,
            **{op: self.wrapping_expression for op in WRAPPING_SYMBOLS},
        }

        def operands(method: Callable[[list[str], IRNode], str]) -> Expression:
            return lambda node, operand: method([operand(src) for src in node.srcs], node)

        self.vector_expressions: dict[IROp | Op, Expression] = {
            IROp.VECTORIZE: lambda node, operand: self.vector_build([operand(src) for src in node.srcs], node.dtype,
                                                                    node.width),
            IROp.GEP: lambda node, operand: self.vector_lane(operand(node.srcs[0]), node.arg, node.srcs[0].width),
            IROp.LOAD: self.vector_load_expression,
            Op.MAX: operands(self.vector_maximum),
            Op.WHERE: operands(self.vector_select),
            **{op: operands(self.vector_math) for op in self.math_functions},
            Op.RECIPROCAL: self.vector_reciprocal,
            Op.CAST: self.vector_cast,
            Op.BITCAST: self.vector_bitcast,
        }

    # ---- strings a subclass may change ----------------------------------------------------------------------

    def type_name(self, dtype: DType) -> str:
        return self.type_names[dtype]

    def _math_template(self, op: Op | IROp) -> Template:
        return lambda operands, dtype, _: f"{self.math_function(op, dtype)}({operands[0]})"

    def math_function(self, op: Op | IROp, dtype: DType) -> str:
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

    def constant(self, value: float, dtype: DType) -> str:
        """A literal; negative ones in parentheses (so `a - -1` never renders as the decrement `a--1`)."""
        text = self._literal(value, dtype)
        return f"({text})" if text.startswith("-") else text

    def _literal(self, value: float, dtype: DType) -> str:
        if dtype.is_bool:
            return "1" if value else "0"
        if dtype.is_float:
            value = float(value)
            if math.isnan(value):
                return "NAN"
            if math.isinf(value):
                return "INFINITY" if value > 0 else "-INFINITY"
            suffix = self.float_suffix if dtype != dtypes.float64 else ""
            return f"{value!r}{suffix}" if "e" in repr(value) or "." in repr(value) else f"{value!r}.0{suffix}"
        value = int(value)
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

    @staticmethod
    def global_bound(kernel: KernelIR) -> str:
        """The number of work items: the global size, or where it is known only at launch (a shape class's
        kernel) element 0 of its sizes parameter."""
        return str(kernel.global_size) if kernel.size_parameter is None else f"data{kernel.size_parameter}[0]"

    def global_loop_close(self) -> list[str]:
        return []

    # ---- the skeleton: one method per IR step (render_steps.StepRenderer walks the kernel) -------------------

    def render(self, kernel: KernelIR) -> str:
        if kernel.packed is not None:
            raise CompileError(f"the {self.language} renderer has no packed-panel matmul (kernel {kernel.name}); a "
                               "device whose renderer lacks it must not set DeviceInfo.packed_matmul")
        self._bounds: dict[int, tuple[float, float]] = {}  # value bounds by node id, valid during one render
        body = KernelBody(kernel, self.constant_operand, depth=2)
        self.render_steps(body)
        parameters = [self.parameter(p.dtype, p.position, p.is_output) for p in kernel.params]
        lines = [self.prelude(kernel), self.signature(kernel, parameters) + " {",
                 *self.global_loop_open(kernel, self.type_name(kernel.index_dtype)), *body.declarations, *body.lines,
                 *self.global_loop_close(), "}"]
        return "\n".join(line for line in lines if line != "") + "\n"

    def constant_operand(self, node: IRNode) -> str:
        return self.constant(node.arg, node.dtype)

    def open_loop(self, body: KernelBody, node: IRNode) -> None:
        name = body.names[id(node)] = f"loop{node.arg[0]}"
        size = body.operand(node.srcs[0]) if node.srcs else node.arg[1]  # (a size known at launch: a value)
        index_type = self.type_name(body.kernel.index_dtype)
        body.line(f"for ({index_type} {name} = 0; {name} < {size}; {name}++) {{")
        body.depth += 1

    def close_loop(self, body: KernelBody, node: IRNode) -> None:
        body.depth -= 1
        body.line("}")

    def define_accumulator(self, body: KernelBody, node: IRNode) -> None:
        name = body.name_of(node, "acc")
        initial = self.constant(reduce_identity(node.arg, node.dtype), node.dtype)
        if node.width > 1:
            initial = self.vector_build([initial] * node.width, node.dtype, node.width)
        body.line(f"{self.value_type(node)} {name} = {initial};")

    def update_accumulator(self, body: KernelBody, node: IRNode) -> None:
        body.line(f"{self.accumulate(body.names[id(node)], body.operand(node.srcs[0]), node)};")

    def store(self, body: KernelBody, node: IRNode) -> None:
        buffer, index, value = node.srcs
        operand = body.operand
        if value.width > 1:
            body.line(f"{self.vector_store(operand(buffer), operand(index), operand(value), value)};")
        else:
            body.line(f"{operand(buffer)}[{operand(index)}] = {operand(value)};")

    def define_local(self, body: KernelBody, node: IRNode) -> None:
        name = body.names[id(node)] = f"local{node.arg[0]}"
        body.line(f"{self.local_declaration(name, node.dtype, node.arg[1])};")

    def group_reduce(self, body: KernelBody, node: IRNode) -> None:
        self.refuse_workgroups(body, node)  # C has no workgroups (OpenCL C renders them)

    def define_shared(self, body: KernelBody, node: IRNode) -> None:
        self.refuse_workgroups(body, node)  # (OpenCL C: a `__local` array)

    def barrier(self, body: KernelBody, node: IRNode) -> None:
        self.refuse_workgroups(body, node)

    def value(self, body: KernelBody, node: IRNode) -> None:
        name = body.name_of(node, "v")
        body.line(f"{self.value_type(node)} {name} = {self.expression(node, body.operand)};")

    def accumulate(self, accumulator: str, value: str, node: IRNode) -> str:
        """The statement combining a reduce's value into its accumulator."""
        if node.dtype in WRAPPING_UNSIGNED and node.arg is not Op.REDUCE_MAX and not (
                node.arg is Op.SUM and node.width == 1 and fits(node.dtype, value_bounds(node, self._bounds))):
            return f"{accumulator} = {self.wrapping(REDUCE_COMBINE[node.arg], [accumulator, value], node.dtype)}"
        if node.arg is Op.SUM:
            return f"{accumulator} += {value}"
        if node.arg is Op.PROD:
            return f"{accumulator} *= {value}"
        if node.width > 1:
            return f"{accumulator} = {self.vector_maximum([value, accumulator], node)}"
        # the new value first: gcc 12 -O3 vectorizes `acc > v || acc != acc` reductions wrongly
        return f"{accumulator} = {_maximum([value, accumulator], node.dtype, node.dtype)}"

    def value_type(self, node: IRNode) -> str:
        if node.width > 1:
            return self.vector_type(lane_dtype(node), node.width)
        return self.type_name(node.dtype)

    def expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        """A value's expression: from the table of the few ops that need code, else the op's ALU template."""
        if node.width > 1 or node.op is IROp.GEP:
            return self.vector_expressions.get(node.op, self.vector_alu_expression)(node, operand)
        return self.expressions.get(node.op, self.alu_expression)(node, operand)

    def alu_expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        source_dtype = node.srcs[1].dtype if node.op is Op.WHERE else node.srcs[0].dtype if node.srcs else node.dtype
        return self.alu[node.op]([operand(src) for src in node.srcs], node.dtype, source_dtype)

    def load_expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        buffer, index = node.srcs[0], node.srcs[1]
        load = f"{operand(buffer)}[{operand(index)}]"
        if len(node.srcs) == 3:
            return f"({operand(node.srcs[2])}?{load}:{self.constant(0, node.dtype)})"
        return load

    def division_expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        if node.srcs[1].is_const and node.srcs[1].arg > 0:
            symbol = "/" if node.op is Op.IDIV else "%"  # no guard needed for a positive constant divisor
            return f"({operand(node.srcs[0])}{symbol}{operand(node.srcs[1])})"
        if node.op is Op.IDIV and node.dtype in WRAPPING_UNSIGNED:  # x / -1 is -x, which overflows for the minimum
            a, b = (operand(src) for src in node.srcs)
            negated = self.wrapping(Op.NEG, [a], node.dtype)
            return f"(({b})==0?{self.constant(0, node.dtype)}:(({b})==-1?{negated}:({a})/({b})))"
        return self.alu_expression(node, operand)

    def wrapping_expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        """Signed int/long arithmetic that may overflow wraps like PyTorch's; index math whose IR bounds fit keeps
        the plain (faster) form."""
        if node.dtype in WRAPPING_UNSIGNED and not fits(node.dtype, value_bounds(node, self._bounds)):
            return self.wrapping(cast(Op, node.op), [operand(src) for src in node.srcs], node.dtype)
        return self.alu_expression(node, operand)

    # ---- vectors: a renderer whose device lists DeviceInfo.vector_ops implements these ------------------------

    def vector_type(self, dtype: DType, width: int) -> str:
        raise NotImplementedError(f"{type(self).__name__} renders no vector types (its DeviceInfo.vector_ops is empty)")

    def vector_build(self, lanes: list[str], dtype: DType, width: int) -> str:
        raise NotImplementedError(f"{type(self).__name__} renders no vector types")

    def vector_lane(self, vector: str, lane: int, width: int) -> str:
        raise NotImplementedError(f"{type(self).__name__} renders no vector types")

    def vector_load(self, buffer: str, index: str, node: IRNode) -> str:
        raise NotImplementedError(f"{type(self).__name__} renders no vector types")

    def vector_store(self, buffer: str, index: str, value: str, node: IRNode) -> str:
        raise NotImplementedError(f"{type(self).__name__} renders no vector types")

    def local_declaration(self, name: str, dtype: DType, size: int) -> str:
        """A scratch array of each work item (IROp.DEFINE_LOCAL)."""
        raise NotImplementedError(f"{type(self).__name__} renders no scratch arrays")

    def vector_maximum(self, operands: list[str], node: IRNode) -> str:
        raise NotImplementedError(f"{type(self).__name__} renders no vector types")

    def vector_select(self, operands: list[str], node: IRNode) -> str:
        raise NotImplementedError(f"{type(self).__name__} renders no vector types")

    def vector_math(self, operands: list[str], node: IRNode) -> str:
        """A unary math function (SQRT, EXP2, LOG2, SIN, TRUNC) lane by lane."""
        raise NotImplementedError(f"{type(self).__name__} renders no vector types")

    def vector_cast(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        """Integer lanes converted to another number type lane by lane (values, as the scalar cast)."""
        raise NotImplementedError(f"{type(self).__name__} renders no vector conversions")

    def vector_bitcast(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        """Integer lanes reinterpreted as integers of the same size and another sign."""
        raise NotImplementedError(f"{type(self).__name__} renders no vector conversions")

    def vector_alu_expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        return self.alu[node.op]([operand(src) for src in node.srcs], node.dtype, node.srcs[0].dtype)

    def vector_load_expression(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        load = self.vector_load(operand(node.srcs[0]), operand(node.srcs[1]), node)
        if len(node.srcs) == 3:
            zero = self.vector_build([self.constant(0, node.dtype)] * node.width, node.dtype, node.width)
            return f"({operand(node.srcs[2])}?{load}:{zero})"
        return load

    def vector_reciprocal(self, node: IRNode, operand: Callable[[IRNode], str]) -> str:
        one = self.vector_build([self.constant(1.0, node.dtype)] * node.width, node.dtype, node.width)
        return f"({one}/{operand(node.srcs[0])})"


def lane_dtype(node: IRNode) -> DType:
    """The element type of a vector node; a vector of bools is a mask whose lanes are signed ints as wide as the
    values compared (all bits set where true), as in C vector extensions and OpenCL."""
    while node.dtype.is_bool and node.op not in (Op.CMPLT, Op.CMPEQ):
        node = node.srcs[0]  # a mask combined from masks: the type of the first comparison below it
    if not node.dtype.is_bool:
        return node.dtype
    return MASK_TYPES[node.srcs[0].dtype.itemsize]


MASK_TYPES = {1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}


def vector_nodes(sink: IRNode) -> list[IRNode]:
    """The vector nodes of a kernel (and the vectors its GEPs read)."""
    return [node for node in topological_nodes(sink) if node.width > 1]


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
    return {(node.dtype, node.srcs[0].dtype) for node in topological_nodes(sink) if node.op is Op.BITCAST}
