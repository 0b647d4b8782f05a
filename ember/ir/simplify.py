"""The always-on simplifier as a rule table: constant folding, algebraic identities and index algebra over value
bounds, applied by `Builder.alu` to every scalar node as it is built (so every node of a DAG is simplified)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.ops import Op
from ember.ir.ir import Builder, IRNode, IROp, linear_terms
from ember.ir.rewrite import Rule, RuleTable


def _divide(op: Op, a: int, b: int) -> int:
    """C's truncating division and remainder; x // 0 and x % 0 give 0 (as the renderers' guards do)."""
    if b == 0:
        return 0
    quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
    return quotient if op is Op.IDIV else a - b * quotient


def _maximum(values: list[Any]) -> Any:
    if any(isinstance(value, float) and math.isnan(value) for value in values):
        return math.nan
    return max(values)


def _cast(dtype: DType, source: Any) -> Any:
    if dtype.is_float:
        return float(source)
    if dtype.is_bool:
        return bool(source)
    if isinstance(source, float) and not math.isfinite(source):
        return None  # no integer holds it: left to the device
    return int(source)


# Exact evaluation of ALU ops on Python constants: (result dtype, operand values) -> value (None: not foldable)
FOLD: dict[Op, Callable[[DType, list[Any]], Any]] = {
    Op.ADD: lambda dtype, v: v[0] + v[1],
    Op.SUB: lambda dtype, v: v[0] - v[1],
    Op.MUL: lambda dtype, v: v[0] * v[1],
    Op.NEG: lambda dtype, v: -v[0],
    Op.IDIV: lambda dtype, v: _divide(Op.IDIV, *v),
    Op.MOD: lambda dtype, v: _divide(Op.MOD, *v),
    Op.MAX: lambda dtype, v: _maximum(v),
    Op.CMPLT: lambda dtype, v: v[0] < v[1],
    Op.CMPEQ: lambda dtype, v: v[0] == v[1],
    Op.AND: lambda dtype, v: (v[0] and v[1]) if dtype.is_bool else v[0] & v[1],
    Op.OR: lambda dtype, v: (v[0] or v[1]) if dtype.is_bool else v[0] | v[1],
    Op.XOR: lambda dtype, v: v[0] != v[1] if dtype.is_bool else v[0] ^ v[1],
    Op.NOT: lambda dtype, v: (not v[0]) if dtype.is_bool else ~v[0],
    Op.WHERE: lambda dtype, v: v[1] if v[0] else v[2],
    Op.CAST: lambda dtype, v: _cast(dtype, v[0]),
}


def _foldable(node: IRNode) -> bool:
    for src in node.srcs:
        if src.op is not IROp.CONST:
            return False
    # a half constant is rendered by a cast, so a CAST to a half type stays
    return not (node.op is Op.CAST and node.dtype in (dtypes.float16, dtypes.bfloat16))


def _fold(builder: Builder, node: IRNode) -> IRNode | None:
    try:
        value = FOLD[cast(Op, node.op)](node.dtype, [src.arg for src in node.srcs])
    except (OverflowError, ValueError, ZeroDivisionError):
        return None
    if value is None or (node.dtype.is_int and isinstance(value, float)):
        return None
    return builder.const(value, node.dtype)


# ---- patterns ---------------------------------------------------------------------------------------------------


def _is(node: IRNode, value: Any) -> bool:
    return node.is_const and node.arg == value


def _negative_zero(node: IRNode) -> bool:
    """A float constant -0.0: adding it gives every float back unchanged (+0.0, -0.0 and NaN included), so a sum
    of gradients padded with -0.0 (a concatenation's backward) loses its additions of the padding."""
    return node.is_const and node.dtype.is_float and node.arg == 0 and math.copysign(1.0, node.arg) < 0


def _integer(node: IRNode) -> bool:
    return node.dtype.is_int


def _constant_right(node: IRNode) -> bool:
    """An integer op whose second operand is a constant."""
    return node.dtype.is_int and node.srcs[1].is_const


def _constant_left_only(node: IRNode) -> bool:
    return node.dtype.is_int and node.srcs[0].is_const and not node.srcs[1].is_const


def _inner_constant(op: Op) -> Callable[[IRNode], bool]:
    """(x <op> c1) <outer op> c2 on integers."""
    return lambda node: (_constant_right(node) and node.srcs[0].op is op and node.srcs[0].srcs[1].is_const)


# ---- index algebra ----------------------------------------------------------------------------------------------


def _sum(builder: Builder, terms: list[tuple[IRNode, int]], constant: int, dtype: DType) -> IRNode:
    result = builder.const(constant, dtype)
    for term, coefficient in terms:
        result = builder.alu(Op.ADD, dtype, builder.alu(Op.MUL, dtype, term, builder.const(coefficient, dtype)), result)
    return result


def _recombine(builder: Builder, node: IRNode) -> IRNode | None:
    """k*(x % c) + k*c*(x // c) == k*x for any x (C's truncating division and remainder agree)."""
    a, b = node.srcs
    terms_a, constant_a = linear_terms(a)
    terms_b, constant_b = linear_terms(b)
    terms = terms_a + terms_b
    for position, (term, coefficient) in enumerate(terms):
        if term.op is not Op.MOD or not term.srcs[1].is_const:
            continue
        source, divisor = term.srcs
        for other_position, (other, other_coefficient) in enumerate(terms):
            if (other.op is Op.IDIV and other.srcs[0] is source and other.srcs[1] is divisor
                    and other_coefficient == coefficient * divisor.arg):
                rest = [item for index, item in enumerate(terms) if index not in (position, other_position)]
                return _sum(builder, [*rest, (source, coefficient)], constant_a + constant_b, node.dtype)
    return None


def _divide_terms(builder: Builder, node: IRNode) -> IRNode | None:
    """x // c and x % c for x >= 0, splitting x into terms whose coefficients c divides."""
    op, dtype = node.op, node.dtype
    numerator, divisor = node.srcs[0], node.srcs[1].arg
    if numerator.maximum < divisor:
        return builder.const(0, dtype) if op is Op.IDIV else numerator
    terms, constant = linear_terms(numerator)
    if any(coefficient < 0 or term.minimum < 0 for term, coefficient in terms) or constant < 0:
        return None
    if any(coefficient > divisor and coefficient % divisor for _, coefficient in terms):
        # x == divisor * sum((c // divisor) * t) + r with r = sum((c % divisor) * t) + constant % divisor >= 0: where
        # r < divisor, x // divisor and x % divisor need no division (a window's offset j * (L + d) + i read back
        # modulo L, with j * d + i < L)
        remainder = _sum(builder, [(term, coefficient % divisor) for term, coefficient in terms
                                   if coefficient % divisor], constant % divisor, dtype)
        if remainder.maximum < divisor:
            if op is Op.MOD:
                return remainder
            return _sum(builder, [(term, coefficient // divisor) for term, coefficient in terms
                                  if coefficient >= divisor], constant // divisor, dtype)
    quotient_terms = [(term, coefficient // divisor) for term, coefficient in terms if coefficient % divisor == 0]
    rest_terms = [(term, coefficient) for term, coefficient in terms if coefficient % divisor != 0]
    if op is Op.IDIV:
        # nested division: (x // a) // b == x // (a * b)
        if not terms and numerator.op is Op.IDIV and numerator.srcs[1].is_const:
            return builder.alu(Op.IDIV, dtype, numerator.srcs[0], builder.const(numerator.srcs[1].arg * divisor, dtype))
        if not quotient_terms and constant < divisor:
            # (g*y + c) // (g*m) == (y + c // g) // m for y, c >= 0 (a vector lane's offset c inside a run of g)
            gcd = math.gcd(divisor, *[coefficient for _, coefficient in rest_terms]) if rest_terms else divisor
            if gcd > 1 and rest_terms:
                reduced = _sum(builder, [(term, coefficient // gcd) for term, coefficient in rest_terms],
                               constant // gcd, dtype)
                return builder.alu(Op.IDIV, dtype, reduced, builder.const(divisor // gcd, dtype))
            return _small_remainder(builder, op, terms, constant, divisor, dtype)
        rest = _sum(builder, rest_terms, constant % divisor, dtype)
        quotient = _sum(builder, quotient_terms, constant // divisor, dtype)
        if rest.maximum < divisor:
            return quotient
        return builder.alu(Op.ADD, dtype, quotient, builder.alu(Op.IDIV, dtype, rest, builder.const(divisor, dtype)))
    if not quotient_terms and constant < divisor:
        # (x % (a*c)) % c == x % c
        if (not terms and numerator.op is Op.MOD and numerator.srcs[1].is_const
                and numerator.srcs[1].arg % divisor == 0):
            return builder.alu(Op.MOD, dtype, numerator.srcs[0], builder.const(divisor, dtype))
        # (g*y + c) % (g*m) == g * ((y + c // g) % m) + c % g for y, c >= 0 (so the lanes of a vector, offsets c
        # inside a run of g, share the term and differ by their constants)
        gcd = math.gcd(divisor, *[coefficient for _, coefficient in rest_terms]) if rest_terms else divisor
        if gcd > 1 and rest_terms:
            reduced = _sum(builder, [(term, coefficient // gcd) for term, coefficient in rest_terms],
                           constant // gcd, dtype)
            inner = builder.alu(Op.MOD, dtype, reduced, builder.const(divisor // gcd, dtype))
            return _sum(builder, [(inner, gcd)], constant % gcd, dtype)
        return _small_remainder(builder, op, terms, constant, divisor, dtype)
    rest = _sum(builder, rest_terms, constant % divisor, dtype)
    return rest if rest.maximum < divisor else builder.alu(Op.MOD, dtype, rest, builder.const(divisor, dtype))


def _small_remainder(builder: Builder, op: Op | IROp, terms: tuple[tuple[IRNode, int], ...], constant: int,
                     divisor: int, dtype: DType) -> IRNode | None:
    """x // (g*m) == y // m and x % (g*m) == g * (y % m) + r where x == g*y + r with y >= 0 and 0 <= r < g: the
    terms whose coefficients g divides make y, the others (and the constant modulo g) r, for g a common factor of
    the divisor and some coefficients (a row index of a spread axis read through its columns: (18*i + j) // 36 with
    j < 18 is i // 2)."""
    for factor in sorted({math.gcd(divisor, coefficient) for _, coefficient in terms} - {1}, reverse=True):
        large = [(term, coefficient // factor) for term, coefficient in terms if coefficient % factor == 0]
        small = [(term, coefficient) for term, coefficient in terms if coefficient % factor]
        if not large or not small:
            continue
        remainder = _sum(builder, small, constant % factor, dtype)
        if remainder.maximum >= factor:
            continue
        quotient = _sum(builder, large, constant // factor, dtype)
        if op is Op.IDIV:
            return builder.alu(Op.IDIV, dtype, quotient, builder.const(divisor // factor, dtype))
        inner = builder.alu(Op.MOD, dtype, quotient, builder.const(divisor // factor, dtype))
        return builder.alu(Op.ADD, dtype, builder.mul(inner, factor), remainder)
    return None


# ---- the table ----------------------------------------------------------------------------------------------------


def _first(builder: Builder, node: IRNode) -> IRNode:
    return node.srcs[0]


def _second(builder: Builder, node: IRNode) -> IRNode:
    return node.srcs[1]


def _swapped(builder: Builder, node: IRNode) -> IRNode:
    return builder.alu(cast(Op, node.op), node.dtype, node.srcs[1], node.srcs[0])


def _merge_inner_constant(builder: Builder, node: IRNode) -> IRNode:
    """(x + c1) + c2 -> x + (c1 + c2) and (x * c1) * c2 -> x * (c1 * c2)."""
    inner, outer = node.srcs
    op = cast(Op, node.op)
    merged = FOLD[op](node.dtype, [inner.srcs[1].arg, outer.arg])
    return builder.alu(op, node.dtype, inner.srcs[0], builder.const(merged, node.dtype))


def _distribute(builder: Builder, node: IRNode) -> IRNode:
    """(x + c1) * c2 -> x * c2 + c1 * c2."""
    (inner, factor), dtype = node.srcs, node.dtype
    return builder.alu(Op.ADD, dtype, builder.alu(Op.MUL, dtype, inner.srcs[0], factor),
                       builder.const(inner.srcs[1].arg * factor.arg, dtype))


def _constant_pick(pick: Callable[[IRNode, IRNode], IRNode]) -> Callable[[Builder, IRNode], IRNode]:
    """A bool AND/OR with a constant operand: `pick(constant, other)`."""
    return lambda builder, node: pick(*node.srcs) if node.srcs[0].is_const else pick(*node.srcs[::-1])


INTEGER_DIVISIONS = frozenset({Op.IDIV, Op.MOD})
ALL = frozenset(FOLD)

# In order: for a node being built, the first rule that fires gives the node to use instead (built through the
# same builder, so it is simplified in turn). Float rules only where they hold for every value (x * 1.0 == x;
# x + 0.0 is not x for x = -0.0).
SIMPLIFY = RuleTable([
    Rule("constant operands fold", ALL, _foldable, _fold),
    Rule("cast to the same dtype", frozenset({Op.CAST, Op.BITCAST}), lambda node: node.srcs[0].dtype == node.dtype,
         _first),
    Rule("x + 0", frozenset({Op.ADD}), lambda node: _is(node.srcs[1], 0) and (node.dtype.is_int or node.dtype.is_bool),
         _first),
    Rule("0 + x", frozenset({Op.ADD}), lambda node: _integer(node) and _is(node.srcs[0], 0),
         _second),
    Rule("x + -0.0", frozenset({Op.ADD}), lambda node: _negative_zero(node.srcs[1]), _first),
    Rule("-0.0 + x", frozenset({Op.ADD}), lambda node: _negative_zero(node.srcs[0]), _second),
    Rule("c + x -> x + c", frozenset({Op.ADD}), _constant_left_only, _swapped),
    Rule("(x + c1) + c2", frozenset({Op.ADD}), _inner_constant(Op.ADD), _merge_inner_constant),
    Rule("k*(x % c) + k*c*(x // c) -> k*x", frozenset({Op.ADD}), _integer, _recombine),
    Rule("x - c -> x + (-c)", frozenset({Op.SUB}), _constant_right,
         lambda builder, node: builder.alu(Op.ADD, node.dtype, node.srcs[0],
                                           builder.const(-node.srcs[1].arg, node.dtype))),
    Rule("c * x -> x * c", frozenset({Op.MUL}), _constant_left_only, _swapped),
    Rule("x * 1", frozenset({Op.MUL}), lambda node: _integer(node) and _is(node.srcs[1], 1),
         _first),
    Rule("x * 0", frozenset({Op.MUL}), lambda node: _integer(node) and _is(node.srcs[1], 0),
         _second),
    Rule("(x * c1) * c2", frozenset({Op.MUL}), _inner_constant(Op.MUL), _merge_inner_constant),
    Rule("(x + c1) * c2", frozenset({Op.MUL}), _inner_constant(Op.ADD), _distribute),
    Rule("x * 1.0", frozenset({Op.MUL}), lambda node: node.dtype.is_float and _is(node.srcs[1], 1.0),
         _first),
    Rule("1.0 * x", frozenset({Op.MUL}), lambda node: node.dtype.is_float and _is(node.srcs[0], 1.0),
         _second),
    Rule("x // 1, x % 1", INTEGER_DIVISIONS, lambda node: _integer(node) and _is(node.srcs[1], 1),
         lambda builder, node: node.srcs[0] if node.op is Op.IDIV else builder.const(0, node.dtype)),
    Rule("x // c, x % c for x >= 0", INTEGER_DIVISIONS,
         lambda node: _constant_right(node) and node.srcs[1].arg > 0 and node.srcs[0].minimum >= 0, _divide_terms),
    Rule("x < y decided by the bounds of integer x and y", frozenset({Op.CMPLT}),
         lambda node: node.srcs[0].dtype.is_int and (node.srcs[0].maximum < node.srcs[1].minimum
                                                     or node.srcs[0].minimum >= node.srcs[1].maximum),
         lambda builder, node: builder.const(node.srcs[0].maximum < node.srcs[1].minimum, dtypes.bool_)),
    Rule("bool AND with a constant", frozenset({Op.AND}),
         lambda node: node.dtype.is_bool and (node.srcs[0].is_const or node.srcs[1].is_const),
         _constant_pick(lambda constant, other: other if constant.arg else constant)),
    Rule("x & x", frozenset({Op.AND}), lambda node: node.dtype.is_bool and node.srcs[0] is node.srcs[1], _first),
    Rule("bool OR with a constant", frozenset({Op.OR}),
         lambda node: node.dtype.is_bool and (node.srcs[0].is_const or node.srcs[1].is_const),
         _constant_pick(lambda constant, other: constant if constant.arg else other)),
    Rule("select on a constant", frozenset({Op.WHERE}), lambda node: node.srcs[0].is_const,
         lambda builder, node: node.srcs[1] if node.srcs[0].arg else node.srcs[2]),
    Rule("select between equal values", frozenset({Op.WHERE}), lambda node: node.srcs[1] is node.srcs[2], _second),
])
