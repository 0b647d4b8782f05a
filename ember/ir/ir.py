"""The kernel IR: a hash-consed DAG of typed nodes, simplified as it is built (CSE here; folding and index algebra
by the rules of ir/simplify.py)."""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING, Any

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.ops import Op
from ember.core.walk import compute_bottom_up, post_order
from ember.ir.rewrite import RuleTable

if TYPE_CHECKING:
    from ember.ir.packed_matmul import PackedMatmul


class IROp(Enum):
    """Structural IR ops. Arithmetic uses the primitive `Op` enum itself (one source of truth per op)."""

    __hash__ = object.__hash__  # members are singletons compared by identity; Enum's name hash is 4x slower

    PARAM = auto()  # a buffer parameter; arg: (position, is_output); dtype: the element type
    CONST = auto()  # arg: the value
    GLOBAL_ID = auto()  # the index of this work item along the parallel axis; arg: the global size
    RANGE = auto()  # a loop variable 0..size-1; arg: (loop number, size); srcs: () or, for a size only known at
    # launch (a shape class's size, ir/shape_class.py), (the size's value,), the arg's size then an estimate
    LOAD = auto()  # srcs: (param, index) or (param, index, valid): a guarded load gives 0 where not valid
    STORE = auto()  # srcs: (param, index, value)
    REDUCE = auto()  # arg: Op.SUM / Op.PROD / Op.REDUCE_MAX; srcs: (value, *ranges)
    SINK = auto()  # srcs: the stores of the kernel
    VECTORIZE = auto()  # a vector from scalar srcs, one per lane
    GEP = auto()  # one lane of a vector; srcs: (vector,); arg: the lane
    SHUFFLE = auto()  # a vector of lanes picked from one or two vectors of its width (srcs); arg: per lane, the lane
    # number among the sources' lanes taken in order (srcs[1]'s after srcs[0]'s), or -1 for a +0.0 lane
    DEFINE_LOCAL = auto()  # a scratch array of each work item; arg: (number, element count); loads/stores use it
    LOOP = auto()  # a statement: srcs (body, *ranges), the body (a SINK of stores and loops) run for every range value
    AFTER = auto()  # srcs (buffer, *statements): the buffer once the statements ran (loads from it wait for them)
    # workgroups (a kernel whose KernelIR.local_size is set: ir/group_reduce.py): the work items of a group run
    # together and share local memory
    LOCAL_ID = auto()  # the work item's index inside its group; arg: the local size
    GROUP_ID = auto()  # the group's index; arg: the number of groups
    GROUP_REDUCE = auto()  # arg: Op.SUM / Op.PROD / Op.REDUCE_MAX; srcs: (value,): the value combined over every
    # work item of the group, the same in each (a tree in local memory between barriers: every work item of the
    # group must reach it, so it is never under a condition that depends on the work item)
    DEFINE_SHARED = auto()  # an array in the group's local memory, shared by its work items; arg: (number, element
    # count); loads and stores use it (through AFTER), as a buffer
    BARRIER = auto()  # a statement: every work item of the group waits here until all reach it, and the local-memory
    # stores before it are seen by the loads after it; srcs: what must run before it (stores, a loop counter); like
    # GROUP_REDUCE it is never under a condition that depends on the work item
    MMA = auto()  # a warp's matrix multiply step (tensor cores, mma.m16n8k16): srcs four A and two B registers of
    # its fragments (width-2 loads of half values from local memory); the value (width 4, float32) is this work item's
    # four outputs of the 16x8 product summed over the 16 k; arg: the inputs' dtype. Every item of the warp must reach
    # it, and only a REDUCE's sum may read it (renderers fuse the two into one multiply-add)


# Vectors: a node of `width` > 1 holds `width` lanes of its dtype. A vector LOAD reads (a vector STORE writes) the
# `width` consecutive elements from its scalar index on; ALU ops and REDUCE work lane by lane. Only kernels for
# devices whose renderer has vector types (DeviceInfo.vector_ops) contain them (see ir/vectorize.py).


class IRNode:
    """One IR value. Built only through `Builder`, so equal structure means the same object."""

    __slots__ = ("arg", "dtype", "is_const", "maximum", "minimum", "op", "srcs", "width")

    def __init__(self, op: IROp | Op, dtype: DType, srcs: tuple[IRNode, ...], arg: Any,
                 minimum: float, maximum: float, width: int = 1) -> None:
        self.op, self.dtype, self.srcs, self.arg = op, dtype, srcs, arg
        self.minimum, self.maximum = minimum, maximum
        self.width = width
        self.is_const = op is IROp.CONST  # an attribute, not a property: lowering asks it ~100,000 times a step

    def __repr__(self) -> str:
        """The expression this node computes (shared nodes spelled out at each use)."""
        texts: dict[int, str] = {}
        return compute_bottom_up(self, lambda node: node.srcs,
                                 lambda node: node._text([texts[id(src)] for src in node.srcs]), texts)

    def _text(self, sources: list[str]) -> str:
        if self.op is IROp.CONST:
            return f"{self.arg}"
        name = self.op.name
        if self.width > 1:
            name += f"x{self.width}"
        return f"{name}({', '.join(sources)}{', ' + repr(self.arg) if self.arg is not None else ''})"


@functools.lru_cache(maxsize=16)
def topological_nodes(root: IRNode) -> tuple[IRNode, ...]:
    """Every node under root (root included), sources before their users. Nodes never change, so the last few
    answers are kept: a renderer and its helpers ask for the nodes of one kernel several times."""
    return tuple(post_order([root], lambda node: node.srcs))


@dataclass(frozen=True)
class BufferParam:
    """What a kernel parameter is: its position, element dtype, element count, and whether it is written."""

    position: int
    dtype: DType
    size: int
    is_output: bool


@dataclass
class KernelIR:
    """A lowered kernel: name, parameters, global size (parallel work items) and the SINK of its stores."""

    name: str
    params: list[BufferParam]
    global_size: int
    sink: IRNode
    index_dtype: DType
    # groups of reduces that lowering split from one reduce, lane by lane (ir/vectorize.py packs each into a vector)
    lane_groups: tuple[tuple[IRNode, ...], ...] = ()
    # a shape class's kernel (ir/shape_class.py): the position of its parameter of sizes known at launch (element 0
    # the global size, which then bounds the work items instead of `global_size`), else None
    size_parameter: int | None = None
    # a workgroup kernel (LOCAL_ID, GROUP_ID, GROUP_REDUCE): launched in groups of exactly this many work items (a
    # power of two; the global size a multiple of it), else None (the launch chooses the groups)
    local_size: int | None = None
    # a workgroup kernel's warp width (DeviceInfo.warp_width): a renderer with warp shuffles (PTX) combines the values
    # of each warp by shuffles before it goes through local memory; 1: none
    warp_width: int = 1
    # a plain float32 matmul a renderer runs as packed panels (ir/packed_matmul.py; DeviceInfo.packed_matmul), its
    # sink then the plain lowering (what it reads and writes); else None
    packed: PackedMatmul | None = None

    def key(self) -> str:
        """A structural description of the kernel (for caches and debug output)."""
        group = f":group{self.local_size}/{self.warp_width}" if self.local_size is not None else ""
        packed = f":packed{self.packed.as_tuple()}" if self.packed is not None else ""
        return f"{self.name}:{self.global_size}{group}{packed}:{self.sink!r}"


def _wrap_integer(value: int, dtype: DType) -> int:
    bits = dtype.bits
    value &= (1 << bits) - 1
    if dtype.kind == "i" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def _round_float(value: float, dtype: DType) -> float:
    if dtype == dtypes.float32 and math.isfinite(value):
        try:
            return struct.unpack("f", struct.pack("f", value))[0]
        except OverflowError:
            return math.copysign(math.inf, value)
    return value


def normalize_constant(value: Any, dtype: DType) -> Any:
    """A Python value held exactly as the dtype holds it (wrapped ints, float32-rounded floats)."""
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        return _wrap_integer(int(value), dtype)
    return _round_float(float(value), dtype)


class Builder:
    """Creates IR nodes with hash-consing (CSE) and simplification: scalar ALU nodes go through a rule table
    (`rules`, by default ir/simplify.py's: constant folding, algebraic identities, index algebra)."""

    def __init__(self, rules: RuleTable | None = None) -> None:
        if rules is None:
            from ember.ir.simplify import SIMPLIFY  # the table is written with this module's nodes

            rules = SIMPLIFY
        self.rules: RuleTable = rules
        self._nodes: dict[tuple, IRNode] = {}
        self._integers: dict[tuple[int, DType], IRNode] = {}  # const(int, dtype), looked up before normalizing
        # alu's answers: half the ALU nodes lowering asks for were asked for before, and the rules (linear_terms
        # walks whole sums) cost more than the lookup
        self._simplified: dict[tuple[Op, DType, tuple[IRNode, ...]], IRNode] = {}
        self.loop_count = 0
        self.local_count = 0

    def _make(self, op: IROp | Op, dtype: DType, srcs: tuple[IRNode, ...], arg: Any,
              minimum: float = -math.inf, maximum: float = math.inf, width: int = 1) -> IRNode:
        if op is IROp.CONST:  # 0.0 and -0.0 are equal in Python but different constants
            arg_key = (type(arg), arg, math.copysign(1.0, arg) if isinstance(arg, float) else 1.0)
        else:
            arg_key = arg
        key = (op, dtype, srcs, arg_key, width)  # (nodes hash and compare by identity: hash-consed)
        node = self._nodes.get(key)
        if node is None:
            node = IRNode(op, dtype, srcs, arg, minimum, maximum, width)
            self._nodes[key] = node
        return node

    # ---- leaves ---------------------------------------------------------------------------------------------

    def const(self, value: Any, dtype: DType) -> IRNode:
        if type(value) is int:  # index math asks for the same few integers again and again
            key = (value, dtype)
            node = self._integers.get(key)
            if node is None:
                node = self._integers[key] = self._const(value, dtype)
            return node
        return self._const(value, dtype)

    def _const(self, value: Any, dtype: DType) -> IRNode:
        value = normalize_constant(value, dtype)
        if isinstance(value, float) and math.isnan(value):
            return self._make(IROp.CONST, dtype, (), value, -math.inf, math.inf)
        numeric = float(value)
        return self._make(IROp.CONST, dtype, (), value, numeric, numeric)

    def param(self, position: int, dtype: DType, is_output: bool) -> IRNode:
        return self._make(IROp.PARAM, dtype, (), (position, is_output))

    def global_id(self, size: int, dtype: DType, bounded: bool = True) -> IRNode:
        """The work item's number, below `size` (`bounded` False: a size known only at launch; `size` an estimate)."""
        return self._make(IROp.GLOBAL_ID, dtype, (), size, 0, max(size - 1, 0) if bounded else math.inf)

    def local_id(self, local_size: int, dtype: DType) -> IRNode:
        """The work item's index inside its group of `local_size`."""
        return self._make(IROp.LOCAL_ID, dtype, (), local_size, 0, local_size - 1)

    def group_id(self, groups: int, dtype: DType) -> IRNode:
        """The group's index, below `groups`."""
        return self._make(IROp.GROUP_ID, dtype, (), groups, 0, max(groups - 1, 0))

    def group_reduce(self, op: Op, value: IRNode) -> IRNode:
        """`value` combined by the reduce `op` over the work items of the group (each gets the result)."""
        return self._make(IROp.GROUP_REDUCE, value.dtype, (value,), op)

    def define_shared(self, dtype: DType, size: int) -> IRNode:
        """An array of `size` elements in the group's local memory (a workgroup kernel's tile)."""
        self.local_count += 1
        return self._make(IROp.DEFINE_SHARED, dtype, (), (self.local_count, size))

    def barrier(self, after: list[IRNode]) -> IRNode:
        """A barrier of the group, once the nodes in `after` ran (stores to local memory, a loop counter)."""
        return self._make(IROp.BARRIER, dtypes.bool_, tuple(after), None)

    def mma(self, a_words: list[IRNode], b_words: list[IRNode], dtype: DType) -> IRNode:
        """A warp's 16x8x16 matrix multiply step of `dtype` inputs (IROp.MMA): this item's four float32 outputs."""
        return self._make(IROp.MMA, dtypes.float32, (*a_words, *b_words), dtype, width=4)

    def new_range(self, size: int, dtype: DType, runtime_size: IRNode | None = None) -> IRNode:
        """A loop variable 0..size-1; with `runtime_size`, 0..runtime_size-1 (`size` only an estimate)."""
        self.loop_count += 1
        if runtime_size is not None:
            return self._make(IROp.RANGE, dtype, (runtime_size,), (self.loop_count, size), 0, math.inf)
        return self._make(IROp.RANGE, dtype, (), (self.loop_count, size), 0, max(size - 1, 0))

    # ---- memory ---------------------------------------------------------------------------------------------

    def load(self, param: IRNode, index: IRNode, valid: IRNode | None) -> IRNode:
        if valid is not None and valid.is_const:
            if not valid.arg:
                return self.const(0, param.dtype)
            valid = None
        srcs = (param, index) if valid is None else (param, index, valid)
        return self._make(IROp.LOAD, param.dtype, srcs, None)

    def store(self, param: IRNode, index: IRNode, value: IRNode) -> IRNode:
        return self._make(IROp.STORE, value.dtype, (param, index, value), None)

    def sink(self, stores: list[IRNode]) -> IRNode:
        return self._make(IROp.SINK, dtypes.bool_, tuple(stores), None)

    def reduce(self, op: Op, value: IRNode, ranges: tuple[IRNode, ...]) -> IRNode:
        positive_zero = value.is_const and value.arg == 0 and math.copysign(1.0, value.arg) > 0
        if not ranges:
            # a sum starts from +0.0 like torch's: a lone -0.0 sums to +0.0 (products and maxima keep it)
            if op is Op.SUM and value.dtype.is_float and value.width == 1 and not positive_zero:
                return self.alu(Op.ADD, value.dtype, value, self.const(0.0, value.dtype))
            return value
        if value.is_const and op is Op.REDUCE_MAX:
            return value
        if op is Op.SUM and positive_zero:
            return value
        return self._make(IROp.REDUCE, value.dtype, (value, *ranges), op, width=value.width)

    # ---- vectors ----------------------------------------------------------------------------------------------

    def vectorize(self, lanes: list[IRNode] | tuple[IRNode, ...]) -> IRNode:
        """A vector of scalar lanes (all of one dtype); lanes taken in order from one vector give that vector."""
        lanes = tuple(lanes)
        source = lanes[0].srcs[0] if lanes[0].op is IROp.GEP else None
        if source is not None and source.width == len(lanes) and all(
                lane.op is IROp.GEP and lane.srcs[0] is source and lane.arg == number
                for number, lane in enumerate(lanes)):
            return source
        return self._make(IROp.VECTORIZE, lanes[0].dtype, lanes, None, width=len(lanes))

    def gep(self, vector: IRNode, lane: int) -> IRNode:
        if vector.op is IROp.VECTORIZE:
            return vector.srcs[lane]
        return self._make(IROp.GEP, vector.dtype, (vector,), lane)

    def shuffle(self, sources: list[IRNode], picks: tuple[int, ...]) -> IRNode:
        """A vector whose lane i is lane picks[i] of the sources' lanes (srcs[1]'s numbered after srcs[0]'s), +0.0
        where picks[i] is -1."""
        return self._make(IROp.SHUFFLE, sources[0].dtype, tuple(sources), picks, width=len(picks))

    def vector_load(self, param: IRNode, index: IRNode, valid: IRNode | None, width: int) -> IRNode:
        """`width` consecutive elements from `index` on; a scalar `valid` guards all of them (0 where false)."""
        srcs = (param, index) if valid is None else (param, index, valid)
        return self._make(IROp.LOAD, param.dtype, srcs, None, width=width)

    def vector_alu(self, op: Op, dtype: DType, *srcs: IRNode, arg: Any = None) -> IRNode:
        """An ALU op lane by lane on vectors of one width (no simplification: the scalar DAG was simplified); a
        WHERE's condition may be one scalar for all lanes (vectorize.SCALAR_CONDITION)."""
        return self._make(op, dtype, srcs, arg, width=max(src.width for src in srcs))

    def define_local(self, dtype: DType, size: int) -> IRNode:
        self.local_count += 1
        return self._make(IROp.DEFINE_LOCAL, dtype, (), (self.local_count, size))

    def loop(self, body: list[IRNode], ranges: tuple[IRNode, ...]) -> IRNode:
        """The statements in `body` (stores, loops) run for every value of `ranges`."""
        return self._make(IROp.LOOP, dtypes.bool_, (self.sink(body), *ranges), None)

    def after(self, buffer: IRNode, statements: list[IRNode]) -> IRNode:
        return self._make(IROp.AFTER, buffer.dtype, (buffer, *statements), None)

    def rebuild(self, node: IRNode, srcs: list[IRNode]) -> IRNode:
        """A node like `node` (from another builder) over new sources, simplified again where it is scalar."""
        op = node.op
        if op is IROp.CONST:
            return self.const(node.arg, node.dtype)
        if op in (IROp.PARAM, IROp.GLOBAL_ID, IROp.LOCAL_ID, IROp.GROUP_ID, IROp.RANGE, IROp.DEFINE_LOCAL,
                  IROp.DEFINE_SHARED):
            if op is IROp.RANGE:
                self.loop_count = max(self.loop_count, node.arg[0])
            if op in (IROp.DEFINE_LOCAL, IROp.DEFINE_SHARED):
                self.local_count = max(self.local_count, node.arg[0])
            return self._make(op, node.dtype, tuple(srcs), node.arg, node.minimum, node.maximum)
        if op is IROp.LOOP:
            return self._make(op, node.dtype, tuple(srcs), None)
        if op is IROp.AFTER:
            return self.after(srcs[0], srcs[1:])
        if op is IROp.LOAD:
            valid = srcs[2] if len(srcs) == 3 else None
            if node.width > 1:
                return self.vector_load(srcs[0], srcs[1], valid, node.width)
            return self.load(srcs[0], srcs[1], valid)
        if op is IROp.STORE:
            return self.store(*srcs)
        if op is IROp.REDUCE:
            return self.reduce(node.arg, srcs[0], tuple(srcs[1:]))
        if op is IROp.SINK:
            return self.sink(srcs)
        if op is IROp.GROUP_REDUCE:
            return self.group_reduce(node.arg, srcs[0])
        if op is IROp.BARRIER:
            return self.barrier(srcs)
        if op is IROp.MMA:
            return self.mma(srcs[:4], srcs[4:], node.arg)
        if op is IROp.VECTORIZE:
            return self.vectorize(srcs)
        if op is IROp.GEP:
            return self.gep(srcs[0], node.arg)
        if op is IROp.SHUFFLE:
            return self.shuffle(srcs, node.arg)
        if node.width > 1:
            return self.vector_alu(op, node.dtype, *srcs, arg=node.arg)
        return self.alu(op, node.dtype, *srcs, arg=node.arg)

    # ---- arithmetic with simplification ---------------------------------------------------------------------

    def alu(self, op: Op, dtype: DType, *srcs: IRNode, arg: Any = None) -> IRNode:
        """An ALU node, or what the first rule of the builder's table (ir/simplify.py) that fires on it gives."""
        key = (op, dtype, srcs) if arg is None else None  # sources compare by identity (hash-consed)
        if key is not None:
            known = self._simplified.get(key)
            if known is not None:
                return known
        result = self._simplify(op, dtype, srcs, arg)
        if key is not None:
            self._simplified[key] = result
        return result

    def _simplify(self, op: Op, dtype: DType, srcs: tuple[IRNode, ...], arg: Any) -> IRNode:
        matchers = self.rules.matchers.get(op)
        if matchers is not None:
            candidate = IRNode(op, dtype, srcs, arg, -math.inf, math.inf)
            for applies, build in matchers:
                if applies(candidate):
                    replacement = build(self, candidate)
                    if replacement is not None:
                        return replacement
        minimum, maximum = _bounds(op, dtype, srcs)
        return self._make(op, dtype, srcs, arg, minimum, maximum)

    # ---- conveniences for lowering ----------------------------------------------------------------------------

    def add(self, a: IRNode, b: IRNode | int) -> IRNode:
        return self.alu(Op.ADD, a.dtype, a, b if isinstance(b, IRNode) else self.const(b, a.dtype))

    # (a size known only at launch is a node: a shape class's lowering, ir/shape_class.py)
    def mul(self, a: IRNode, b: int | IRNode) -> IRNode:
        return self.alu(Op.MUL, a.dtype, a, b if isinstance(b, IRNode) else self.const(b, a.dtype))

    def div(self, a: IRNode, b: int | IRNode) -> IRNode:
        return self.alu(Op.IDIV, a.dtype, a, b if isinstance(b, IRNode) else self.const(b, a.dtype))

    def mod(self, a: IRNode, b: int | IRNode) -> IRNode:
        return self.alu(Op.MOD, a.dtype, a, b if isinstance(b, IRNode) else self.const(b, a.dtype))

    def less(self, a: IRNode, b: int | IRNode) -> IRNode:
        return self.alu(Op.CMPLT, dtypes.bool_, a, b if isinstance(b, IRNode) else self.const(b, a.dtype))

    def at_most(self, a: IRNode, limit: int) -> IRNode:
        """min(a, limit) for an integer index, with the bound the simplifier can use."""
        if a.maximum <= limit:
            return a
        if a.minimum > limit:
            return self.const(limit, a.dtype)
        return self._make(Op.WHERE, a.dtype, (self.less(a, limit + 1), a, self.const(limit, a.dtype)), None,
                          min(a.minimum, limit), limit)

    def both(self, a: IRNode | None, b: IRNode | None) -> IRNode | None:
        if a is None:
            return b
        if b is None:
            return a
        return self.alu(Op.AND, dtypes.bool_, a, b)


@functools.lru_cache(maxsize=8192)
def linear_terms(node: IRNode) -> tuple[tuple[tuple[IRNode, int], ...], int]:
    """node as sum(coefficient * term) + constant, looking through ADD and MUL by constants; the terms in the order
    of the expression (left to right), found with an explicit stack of (node, factor). Nodes never change, so the
    answers are kept: the simplifier and the vectorizer ask for the same sums again and again."""
    terms: list[tuple[IRNode, int]] = []
    constant = 0
    stack = [(node, 1)]
    while stack:
        node, factor = stack.pop()
        if node.is_const:
            constant += int(node.arg) * factor
        elif node.op is Op.ADD:
            stack.append((node.srcs[1], factor))
            stack.append((node.srcs[0], factor))
        elif node.op is Op.MUL and node.srcs[1].is_const:
            stack.append((node.srcs[0], factor * int(node.srcs[1].arg)))
        else:
            terms.append((node, factor))
    return tuple(terms), constant


def _bounds(op: Op, dtype: DType, srcs: tuple[IRNode, ...]) -> tuple[float, float]:
    """Conservative value bounds of integer index arithmetic (floats are unbounded)."""
    if dtype.is_bool:
        return 0, 1
    if not dtype.is_int:
        return -math.inf, math.inf
    if op is Op.ADD:
        return srcs[0].minimum + srcs[1].minimum, srcs[0].maximum + srcs[1].maximum
    if op is Op.MUL and srcs[1].is_const:
        factor = srcs[1].arg
        values = (srcs[0].minimum * factor, srcs[0].maximum * factor)
        return (min(values), max(values)) if factor != 0 else (0, 0)
    if op is Op.IDIV and srcs[1].is_const and srcs[1].arg > 0 and srcs[0].minimum >= 0:
        highest = srcs[0].maximum  # (unbounded: a size known only at launch; inf // k would be NaN)
        return srcs[0].minimum // srcs[1].arg, highest // srcs[1].arg if highest != math.inf else math.inf
    if op is Op.MOD and srcs[1].is_const and srcs[1].arg > 0 and srcs[0].minimum >= 0:
        return 0, min(srcs[1].arg - 1, srcs[0].maximum)
    if op is Op.CAST and srcs[0].dtype.is_int:
        return srcs[0].minimum, srcs[0].maximum
    if op is Op.WHERE:
        return min(srcs[1].minimum, srcs[2].minimum), max(srcs[1].maximum, srcs[2].maximum)
    return -math.inf, math.inf
