"""The rule table of graph rewrites (graph_rewrite.py runs it): exact algebraic identities, constant folding and the
integer distributive law over the lazy graph's nodes, written as data like the IR's rule tables (ir/rewrite.py).

Every rule is exact: the rewritten graph computes bit for bit what ember computes for the original, NaN, inf, -0.0
and integer wrap-around included, so results stay torch's. Identities that IEEE arithmetic breaks are not rules:
- x + 0.0 -> x: (-0.0) + 0.0 is +0.0. Only x + (-0.0) -> x and x - (+0.0) -> x hold for floats (x + 0 for integers).
- x - x -> 0 and x * 0 -> 0: inf - inf and 0 * inf are NaN, NaN - NaN is NaN, -0.0 * 0 is -0.0. Integers only.
- exp(log x) -> x: ember's exp and log are exp2 and log2 with scalings, each rounded, and so are torch's: for
  positive x the composition differs from x in the last bits (torch.exp(torch.log(x)) != x for most x), and it is
  NaN for x < 0; no value of a float dtype makes the rule exact where it is not already exact by luck.
- a*b + a*c <-> a*(b + c): rounding differs for floats (and a*b may overflow where a*(b + c) does not), so the
  distributive law is a rule for integers only (arithmetic modulo 2^bits is a ring), and only in the direction that
  removes a multiply per element (the kernelizer's cost of elementwise ops, kernelize.op_work).
- a reduce over size-1 axes -> its source: ember's SUM starts from +0.0, so a sum of one -0.0 is +0.0.
Half-precision values (float16, bfloat16) are computed in float32 inside a kernel and rounded only when stored, so
rules that compute a value or drop a rounding (folding arithmetic, casts) leave half types alone; identities that
pass a value through (x * 1, -(-x), movement) hold for them too.

Constant folding evaluates exactly as the kernel's own IR simplifier folds constants (ir/simplify.FOLD over
normalized constants), so a folded value is the value the kernel would have computed; a uniform result stays a CONST
node (a scalar broadcast to the node's shape: no memory). Sums and maxima of constants fold where every partial sum
is exact (so the order of accumulation cannot matter), which removes their reduce kernels."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.graph import Node
from ember.core.one_hot import one_hot_selection
from ember.core.ops import Op, reduce_identity
from ember.core.shapes import prod
from ember.ir.ir import normalize_constant
from ember.ir.simplify import FOLD
from ember.scheduler.kernelize import op_work

if TYPE_CHECKING:
    from ember.scheduler.graph_rewrite import Rewriter

HALF_TYPES = (dtypes.float16, dtypes.bfloat16)
CONST = Op.CONST
SIGNIFICAND_BITS = {dtypes.float32: 24, dtypes.float64: 53}  # (half types are not folded)


@dataclass(frozen=True)
class Rule:
    """One rewrite: a node whose op is in `ops` (its sources already rewritten) is replaced by what
    `build(rewriter, node)` returns (nodes made with `rewriter.make`, so they are rewritten too), or kept (None)."""

    name: str
    ops: frozenset[Op]
    build: Callable[[Rewriter, Node], Node | None]


class RuleTable:
    """Rules indexed by op; for a node, the first rule (in table order) that returns a replacement gives it."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = tuple(rules)
        by_op: dict[Op, list[Rule]] = {}
        for rule in self.rules:
            for op in rule.ops:
                by_op.setdefault(op, []).append(rule)
        self.by_op: dict[Op, tuple[Rule, ...]] = {op: tuple(found) for op, found in by_op.items()}

    def fire(self, rewriter: Rewriter, node: Node) -> tuple[Node, Rule] | None:
        """The replacement of `node` by the first rule that fires on it, and that rule; or None."""
        for rule in self.by_op.get(node.op, ()):
            replacement = rule.build(rewriter, node)
            if replacement is not None and replacement is not node:
                return replacement, rule
        return None


# ---- what the rules look at ---------------------------------------------------------------------------------------


def _value(node: Node) -> Any:
    """A constant's value as a kernel computes with it (normalized to its dtype; half types are float32 there). An
    int of a subclass (the incremental runner's Affine: a value affine in a decode position, at most 2^24 where the
    dtype is a float) is kept as it is, so that the rules' tests of it are recorded instead of pinning it."""
    arg = node.arg
    if isinstance(arg, int) and type(arg) not in (int, bool):
        return arg
    return normalize_constant(arg, dtypes.float32 if node.dtype in HALF_TYPES else node.dtype)


def _is(node: Node, value: Any) -> bool:
    """A constant equal to `value` (1 matches 1, 1.0 and True)."""
    return node.op is CONST and _value(node) == value


def _is_zero_of_sign(node: Node, negative: bool) -> bool:
    """A float constant -0.0 (`negative`) or +0.0."""
    if node.op is not CONST or not node.dtype.is_float:
        return False
    value = _value(node)
    return value == 0 and (math.copysign(1.0, value) < 0) == negative


def _integer(node: Node) -> bool:
    """Integer or bool values: arithmetic that wraps, no NaN, inf or signed zero."""
    return node.dtype.is_int or node.dtype.is_bool


def _constant(node: Node, value: Any) -> Node:
    """A CONST holding `value` in the shape, dtype and device of `node` (no memory: a scalar broadcast)."""
    dtype = node.dtype
    value = bool(value) if dtype.is_bool else int(value) if dtype.is_int else float(value)
    return Node(CONST, (), value, node.shape, dtype, node.device)


def _other(node: Node, found: Callable[[Node], bool]) -> Node | None:
    """The other operand of a binary node one of whose operands satisfies `found`, or None."""
    first, second = node.srcs
    if found(second):
        return first
    if found(first):
        return second
    return None


# ---- identities ---------------------------------------------------------------------------------------------------


def _times_one(rewriter: Rewriter, node: Node) -> Node | None:
    return _other(node, lambda operand: _is(operand, 1))


def _times_zero(rewriter: Rewriter, node: Node) -> Node | None:
    if not _integer(node):
        return None
    return _constant(node, 0) if _is(node.srcs[0], 0) or _is(node.srcs[1], 0) else None


def _plus_zero(rewriter: Rewriter, node: Node) -> Node | None:
    if _integer(node):
        return _other(node, lambda operand: _is(operand, 0))
    return _other(node, lambda operand: _is_zero_of_sign(operand, negative=True))


def _minus_zero(rewriter: Rewriter, node: Node) -> Node | None:
    first, second = node.srcs
    exact = _is(second, 0) if _integer(node) else _is_zero_of_sign(second, negative=False)
    return first if exact else None


def _minus_itself(rewriter: Rewriter, node: Node) -> Node | None:
    first, second = node.srcs
    return _constant(node, 0) if first is second and node.dtype.is_int else None


def _zero_minus(rewriter: Rewriter, node: Node) -> Node | None:
    """0 - x -> -x for integers, -0.0 - x -> -x for floats (+0.0 - (+0.0) is +0.0, not -0.0)."""
    first, second = node.srcs
    exact = _is(first, 0) if node.dtype.is_int else _is_zero_of_sign(first, negative=True)
    return rewriter.make(Op.NEG, (second,), None, node.shape, node.dtype, node.device) if exact else None


def _divided_by_one(rewriter: Rewriter, node: Node) -> Node | None:
    first, second = node.srcs
    return first if _is(second, 1) else None


def _involution(rewriter: Rewriter, node: Node) -> Node | None:
    """-(-x) -> x, not(not x) -> x (both exact for every value: a sign flip, a bitwise or logical not)."""
    source = node.srcs[0]
    return source.srcs[0] if source.op is node.op else None


def _same_operands(rewriter: Rewriter, node: Node) -> Node | None:
    """max(x, x), x & x, x | x -> x."""
    first, second = node.srcs
    return first if first is second else None


def _logic_with_constant(rewriter: Rewriter, node: Node) -> Node | None:
    """x & ones -> x, x & 0 -> 0, x | 0 -> x, x | ones -> ones, x ^ 0 -> x (ones: True, or every bit set)."""
    dtype = node.dtype
    if not _integer(node):
        return None
    zero: Any = False if dtype.is_bool else 0
    ones: Any = True if dtype.is_bool else (1 << dtype.bits) - 1 if dtype.is_unsigned else -1
    first, second = node.srcs
    for constant, other in ((second, first), (first, second)):
        if constant.op is not CONST:
            continue
        value = normalize_constant(constant.arg, dtype)
        if value == zero:
            return _constant(node, zero) if node.op is Op.AND else other
        if value == ones and node.op is not Op.XOR:
            return other if node.op is Op.AND else _constant(node, ones)
    return None


def _select(rewriter: Rewriter, node: Node) -> Node | None:
    """where(constant, a, b) -> a or b; where(c, a, a) -> a."""
    condition, if_true, if_false = node.srcs
    if if_true is if_false:
        return if_true
    if condition.op is CONST:
        return if_true if condition.arg else if_false
    return None


def _holds_exactly(wide: DType, narrow: DType) -> bool:
    """Whether every value of `narrow` converts to `wide` and back unchanged (bool to anything, integers to wider
    integers or to floats with enough significand bits, floats to wider floats)."""
    if narrow is wide or narrow.is_bool:
        return True
    if narrow.is_int and wide.is_int:
        if narrow.is_unsigned:
            return wide.bits > narrow.bits or (wide.is_unsigned and wide.bits == narrow.bits)
        return not wide.is_unsigned and wide.bits >= narrow.bits
    if narrow.is_int and wide.is_float:
        return narrow.bits - (0 if narrow.is_unsigned else 1) <= SIGNIFICAND_BITS.get(wide, 0)
    if narrow.is_float and wide.is_float:
        return narrow is dtypes.float32 and wide is dtypes.float64
    return False


def _cast(rewriter: Rewriter, node: Node) -> Node | None:
    """cast(x, its own dtype) -> x; cast(cast(x, wider), x's dtype) -> x where the wider dtype holds every value of
    x's exactly. Not for half types (their values are float32 inside a kernel: a cast to a half type rounds)."""
    source = node.srcs[0]
    if node.dtype in HALF_TYPES or source.dtype in HALF_TYPES:
        return None
    if source.dtype is node.dtype:
        return source
    if source.op is Op.CAST:
        inner = source.srcs[0]
        if inner.dtype is node.dtype and inner.dtype not in HALF_TYPES and _holds_exactly(source.dtype, inner.dtype):
            return inner
    return None


def _bitcast(rewriter: Rewriter, node: Node) -> Node | None:
    """bitcast(x, its own dtype) -> x; bitcast(bitcast(x, d), x's dtype) -> x (the bits never change)."""
    source = node.srcs[0]
    if source.dtype is node.dtype:
        return source
    if source.op is Op.BITCAST and source.srcs[0].dtype is node.dtype:
        return source.srcs[0]
    return None


# ---- movement -----------------------------------------------------------------------------------------------------


def _moved_constant(rewriter: Rewriter, node: Node) -> Node | None:
    """A view of a constant is the constant in the new shape (a PAD only when its fill has the same bits)."""
    source = node.srcs[0]
    if source.op is not CONST:
        return None
    if node.op is Op.PAD and not _same_bits(node.arg[1], source.arg, node.dtype):
        return None
    return Node(CONST, (), source.arg, node.shape, node.dtype, node.device)


def _same_bits(first: Any, second: Any, dtype: DType) -> bool:
    """Whether two constants of `dtype` are the same value in a kernel (NaN the same as NaN, -0.0 not +0.0)."""
    computed = dtypes.float32 if dtype in HALF_TYPES else dtype
    first, second = normalize_constant(first, computed), normalize_constant(second, computed)
    if dtype.is_float:
        if math.isnan(first) or math.isnan(second):
            return math.isnan(first) and math.isnan(second)
        return first == second and math.copysign(1.0, first) == math.copysign(1.0, second)
    return bool(first == second)


def _reshape(rewriter: Rewriter, node: Node) -> Node | None:
    source = node.srcs[0]
    if source.shape == node.shape:
        return source
    if source.op is Op.RESHAPE:
        return rewriter.make(Op.RESHAPE, source.srcs, node.arg, node.shape, node.dtype, node.device)
    return None


def _expand(rewriter: Rewriter, node: Node) -> Node | None:
    source = node.srcs[0]
    if source.shape == node.shape:
        return source
    if source.op is Op.EXPAND:  # (only size-1 axes grow, and the inner source's are size 1 where the outer grows)
        return rewriter.make(Op.EXPAND, source.srcs, node.arg, node.shape, node.dtype, node.device)
    return None


def _permute(rewriter: Rewriter, node: Node) -> Node | None:
    order = tuple(node.arg)
    if order == tuple(range(len(order))):
        return node.srcs[0]
    source = node.srcs[0]
    if source.op is Op.PERMUTE:
        inner = tuple(source.arg)
        return rewriter.make(Op.PERMUTE, source.srcs, tuple(inner[axis] for axis in order), node.shape, node.dtype,
                             node.device)
    return None


def _shrink(rewriter: Rewriter, node: Node) -> Node | None:
    source = node.srcs[0]
    if all(start == 0 and end == size for (start, end), size in zip(node.arg, source.shape)):
        return source
    if source.op is Op.SHRINK:
        bounds = tuple((inner_start + start, inner_start + end)
                       for (start, end), (inner_start, _) in zip(node.arg, source.arg))
        return rewriter.make(Op.SHRINK, source.srcs, bounds, node.shape, node.dtype, node.device)
    return None


def _flip(rewriter: Rewriter, node: Node) -> Node | None:
    """A flip of axes of size 1 only is no flip; two flips reverse the axes flipped an odd number of times."""
    axes = frozenset(axis for axis in node.arg if node.shape[axis] > 1)
    source = node.srcs[0]
    if source.op is Op.FLIP:
        axes ^= frozenset(axis for axis in source.arg if source.shape[axis] > 1)
        if not axes:
            return source.srcs[0]
        return rewriter.make(Op.FLIP, source.srcs, tuple(sorted(axes)), node.shape, node.dtype, node.device)
    return source if not axes else None


def _pad(rewriter: Rewriter, node: Node) -> Node | None:
    return node.srcs[0] if all(before == 0 and after == 0 for before, after in node.arg[0]) else None


def _copied_constant(rewriter: Rewriter, node: Node) -> Node | None:
    """A copy of a constant or an arange is the same source made on the target device (as placement does)."""
    source = node.srcs[0]
    if source.op not in (CONST, Op.ARANGE):
        return None
    return Node(source.op, (), source.arg, node.shape, node.dtype, node.device)


# ---- constant folding ---------------------------------------------------------------------------------------------


def _computed_as_stored(dtype: DType) -> bool:
    """Whether a kernel computes values of `dtype` in `dtype` (half types are computed in float32)."""
    return dtype not in HALF_TYPES


def _fold(rewriter: Rewriter, node: Node) -> Node | None:
    """An elementwise op on constants, evaluated as the IR simplifier folds it (ir/simplify.FOLD, over constants
    normalized to their dtype as a kernel holds them): a CONST of the result."""
    evaluate = FOLD.get(node.op)
    if evaluate is None or not _computed_as_stored(node.dtype):
        return None
    for source in node.srcs:
        if source.op is not CONST or not _computed_as_stored(source.dtype):
            return None
    try:
        value = evaluate(node.dtype, [normalize_constant(source.arg, source.dtype) for source in node.srcs])
    except (OverflowError, ValueError, ZeroDivisionError):
        return None
    if value is None or (node.dtype.is_int and isinstance(value, float)):
        return None
    return _constant(node, normalize_constant(value, node.dtype))


def _fold_reduce(rewriter: Rewriter, node: Node) -> Node | None:
    """A reduce of a constant, where the result does not depend on the order of accumulation: a maximum; an integer
    sum or product (modulo 2^bits); a float sum whose partial sums k * c are all exact (c's odd significand times
    the count fits the significand, no overflow); a float product of ones."""
    source = node.srcs[0]
    if source.op is not CONST:
        return None
    count = prod(source.shape) // max(prod(node.shape), 1)
    dtype = node.dtype
    if count == 0:
        return _constant(node, reduce_identity(node.op, dtype))
    if node.op is Op.REDUCE_MAX or count == 1 and node.op is not Op.SUM:
        return _constant(node, source.arg)
    if not _computed_as_stored(dtype) or dtype.is_bool:
        return None
    value = normalize_constant(source.arg, dtype)
    if dtype.is_int:
        total = value * count if node.op is Op.SUM else pow(value, count, 1 << dtype.bits)
        return _constant(node, normalize_constant(total, dtype))
    if node.op is Op.PROD:
        return _constant(node, value) if value == 1.0 else None
    return _exact_float_sum(node, value, count)


def _exact_float_sum(node: Node, value: float, count: int) -> Node | None:
    if math.isnan(value) or math.isinf(value):
        return _constant(node, value)  # (inf + inf + ... is inf, NaN stays NaN)
    if value == 0:  # +0.0 sums to +0.0; a sum of -0.0 starts from +0.0 (left alone)
        return _constant(node, value) if math.copysign(1.0, value) > 0 else None
    numerator, _ = abs(value).as_integer_ratio()
    while numerator % 2 == 0:
        numerator //= 2
    if numerator * count > 1 << SIGNIFICAND_BITS[node.dtype]:
        return None
    total = value * count  # exact: the significand fits
    if math.isinf(normalize_constant(total, node.dtype)):
        return None
    return _constant(node, total)


# ---- sums of one-hot selections -----------------------------------------------------------------------------------


def _one_hot_sum(rewriter: Rewriter, node: Node) -> Node | None:
    """sum over an axis of where(index == arange, x, +0.0) [the condition maybe and-ed with a mask], where the
    index, the mask and x are each the same along that axis (broadcast along it: core/one_hot.py): at most one term
    is not +0.0, so the sum is exactly x + 0.0 where the index is in [0, n) (and the mask holds), else +0.0 (the
    sum starts from +0.0: -0.0 sums to +0.0, NaN and inf stay). A classifier's cross-entropy gradient sums its
    one-hot target over the classes this way (log_softmax's backward): a loop over every class per row becomes a
    select."""
    if len(node.arg) != 1 or not node.dtype.is_float:
        return None
    found = one_hot_selection(node.srcs[0], node.arg[0])
    if found is None:
        return None
    index, count, mask = found.index, found.count, found.mask
    shape, device, flags = node.shape, node.device, dtypes.bool_
    below = rewriter.make(Op.CMPLT, (index, Node(CONST, (), 0, shape, index.dtype, device)), None, shape, flags, device)
    above = rewriter.make(Op.CMPLT, (index, Node(CONST, (), count, shape, index.dtype, device)), None, shape, flags,
                          device)
    held = rewriter.make(Op.AND, (rewriter.make(Op.NOT, (below,), None, shape, flags, device), above), None, shape,
                         flags, device)
    if mask is not None:
        held = rewriter.make(Op.AND, (held, mask), None, shape, flags, device)
    summed = rewriter.make(Op.ADD, (found.value, _constant(found.value, 0.0)), None, shape, node.dtype, device)
    return rewriter.make(Op.WHERE, (held, summed, _constant(node, 0.0)), None, shape, node.dtype, device)


# ---- the distributive law (integers) ------------------------------------------------------------------------------


def _distribute(rewriter: Rewriter, node: Node) -> Node | None:
    """a*b + a*c -> a*(b + c) and a*b - a*c -> a*(b - c) on integers, where both products are read only here (else
    they are computed anyway) and the kernelizer's cost of elementwise ops says the rewrite does less work."""
    if not node.dtype.is_int:
        return None
    first, second = node.srcs
    if first.op is not Op.MUL or second.op is not Op.MUL or first is second:
        return None
    if rewriter.readers.get(first, 0) != 1 or rewriter.readers.get(second, 0) != 1:
        return None
    for shared in first.srcs:
        if shared in second.srcs:
            break
    else:
        return None
    rest_first = first.srcs[1] if first.srcs[0] is shared else first.srcs[0]
    rest_second = second.srcs[1] if second.srcs[0] is shared else second.srcs[0]
    before = 2 * op_work(Op.MUL) + op_work(node.op)
    after = op_work(node.op) + op_work(Op.MUL)
    if after >= before:
        return None
    combined = rewriter.make(node.op, (rest_first, rest_second), None, node.shape, node.dtype, node.device)
    return rewriter.make(Op.MUL, (shared, combined), None, node.shape, node.dtype, node.device)


def _ops(*ops: Op) -> frozenset[Op]:
    return frozenset(ops)


FOLDED_OPS = frozenset(FOLD)  # the ops the IR simplifier evaluates on constants
MOVEMENT = _ops(Op.RESHAPE, Op.EXPAND, Op.PERMUTE, Op.PAD, Op.SHRINK, Op.FLIP)

RULES = RuleTable([
    Rule("constant operands fold", FOLDED_OPS, _fold),
    Rule("a reduce of a constant", _ops(Op.SUM, Op.PROD, Op.REDUCE_MAX), _fold_reduce),
    Rule("a sum of a one-hot selection of one value", _ops(Op.SUM), _one_hot_sum),
    Rule("a view of a constant", MOVEMENT, _moved_constant),
    Rule("a copy of a constant", _ops(Op.COPY), _copied_constant),
    Rule("x * 1", _ops(Op.MUL), _times_one),
    Rule("x * 0 (integers)", _ops(Op.MUL), _times_zero),
    Rule("x + 0 (integers), x + -0.0", _ops(Op.ADD), _plus_zero),
    Rule("x - 0 (integers), x - +0.0", _ops(Op.SUB), _minus_zero),
    Rule("x - x (integers)", _ops(Op.SUB), _minus_itself),
    Rule("0 - x (integers), -0.0 - x", _ops(Op.SUB), _zero_minus),
    Rule("x / 1", _ops(Op.DIV), _divided_by_one),
    Rule("-(-x), not(not x)", _ops(Op.NEG, Op.NOT), _involution),
    Rule("max(x, x), x & x, x | x", _ops(Op.MAX, Op.AND, Op.OR), _same_operands),
    Rule("x & ones, x & 0, x | 0, x | ones, x ^ 0", _ops(Op.AND, Op.OR, Op.XOR), _logic_with_constant),
    Rule("select on a constant or between one value", _ops(Op.WHERE), _select),
    Rule("a cast that changes no value", _ops(Op.CAST), _cast),
    Rule("a bitcast back", _ops(Op.BITCAST), _bitcast),
    Rule("reshape to the same shape, of a reshape", _ops(Op.RESHAPE), _reshape),
    Rule("expand to the same shape, of an expand", _ops(Op.EXPAND), _expand),
    Rule("permute in order, of a permute", _ops(Op.PERMUTE), _permute),
    Rule("shrink to the whole, of a shrink", _ops(Op.SHRINK), _shrink),
    Rule("flip of nothing, of a flip", _ops(Op.FLIP), _flip),
    Rule("pad by nothing", _ops(Op.PAD), _pad),
])
"""The rules a graph is rewritten with, sources first, each node until none fires."""

DISTRIBUTIVE = RuleTable([
    Rule("a*b + a*c -> a*(b + c) (integers)", _ops(Op.ADD, Op.SUB), _distribute),
])
"""The second pass, over the graph the RULES gave (it needs to know who reads each product)."""
