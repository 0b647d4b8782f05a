"""The IR rewrite engine (ember/ir/rewrite.py) and the simplifier's rule table (ember/ir/simplify.py)."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import pytest

from ember.core import dtype as dtypes
from ember.core.ops import Op
from ember.ir.ir import Builder, IRNode, IROp, topological_nodes
from ember.ir.rewrite import Rule, RuleTable, rewrite
from ember.ir.simplify import FOLD, SIMPLIFY

F32, I32 = dtypes.float32, dtypes.int32


def _plain_builder() -> Builder:
    """A builder that simplifies nothing (so the rules under test are the only rewriting)."""
    return Builder(RuleTable([]))


def _evaluate(root: IRNode, x: float) -> float:
    """The value of a float DAG over one LOAD (bound to x), computed with numpy float32 (an independent truth)."""
    values: dict[int, Any] = {}
    for node in topological_nodes(root):
        if node.op is IROp.CONST:
            values[id(node)] = np.float32(node.arg)
        elif node.op is IROp.LOAD:
            values[id(node)] = np.float32(x)
        elif node.op in (IROp.PARAM,):
            values[id(node)] = np.float32(0)
        else:
            operands = [values[id(src)] for src in node.srcs]
            functions: dict[Any, Any] = {Op.ADD: np.add, Op.MUL: np.multiply, Op.SUB: np.subtract}
            values[id(node)] = functions[node.op](*operands)
    return float(values[id(root)])


def test_rules_fire_until_none_applies() -> None:
    """x*2 -> x+x and (y+y) -> y*2 would loop; one-way rules reach a fixed point: every MUL by 2 becomes an ADD,
    also the MULs a rule builds itself (x*4 -> (x*2)*2, whose inner x*2 is new)."""
    b = _plain_builder()
    x = b.load(b.param(0, F32, False), b.const(0, I32), None)
    four, two = b.const(4.0, F32), b.const(2.0, F32)
    root = b.alu(Op.ADD, F32, b.alu(Op.MUL, F32, x, four), b.alu(Op.MUL, F32, b.alu(Op.MUL, F32, x, two), two))

    def is_times(value: float):
        return lambda node: node.srcs[1].is_const and node.srcs[1].arg == value

    rules = RuleTable([
        Rule("x * 4 -> (x * 2) * 2", frozenset({Op.MUL}), is_times(4.0),
             lambda builder, node: builder.alu(Op.MUL, F32, builder.alu(Op.MUL, F32, node.srcs[0], two), two)),
        Rule("x * 2 -> x + x", frozenset({Op.MUL}), is_times(2.0),
             lambda builder, node: builder.alu(Op.ADD, F32, node.srcs[0], node.srcs[0])),
    ])
    result = rewrite(root, rules, _plain_builder())
    ops = [node.op for node in topological_nodes(result)]
    assert Op.MUL not in ops
    assert ops.count(Op.ADD) == 3  # x+x, (x+x)+(x+x), and the sum of the two equal halves (hash-consed: one node)
    for x_value in (0.0, 1.5, -3.25, 1e30):
        assert _evaluate(result, x_value) == _evaluate(root, x_value)


def test_a_rule_that_declines_leaves_the_node() -> None:
    b = _plain_builder()
    x = b.load(b.param(0, F32, False), b.const(0, I32), None)
    root = b.alu(Op.ADD, F32, x, b.const(1.0, F32))
    calls = []
    rules = RuleTable([Rule("looks, declines", frozenset({Op.ADD}), lambda node: True,
                            lambda builder, node: calls.append(node.op))])
    result = rewrite(root, rules, _plain_builder())
    assert calls == [Op.ADD] and result.op is Op.ADD and result.srcs[1].arg == 1.0


def test_a_final_rule_is_not_applied_to_what_it_built() -> None:
    """`final` promises the replacement needs no rewriting: x * 2 -> (x * 2) + 0 stops after one step (without
    the promise the same rule would fire on its own x * 2 forever)."""
    b = _plain_builder()
    x = b.load(b.param(0, F32, False), b.const(0, I32), None)
    root = b.alu(Op.MUL, F32, x, b.const(2.0, F32))
    calls = []

    def build(builder: Builder, node: IRNode) -> IRNode:
        calls.append(node)
        return builder.alu(Op.ADD, F32, builder.alu(Op.MUL, F32, *node.srcs), builder.const(0.0, F32))

    rule = Rule("x * 2 -> (x * 2) + 0", frozenset({Op.MUL}), lambda node: True, build, final=True)
    result = rewrite(root, RuleTable([rule]), _plain_builder())
    assert len(calls) == 1 and result.op is Op.ADD and result.srcs[0].op is Op.MUL


def test_rewrite_takes_no_recursion_on_a_chain_of_100000_nodes() -> None:
    """Every node of a long chain is rewritten (x + 1 -> x - (-1)) under Python's default recursion limit."""
    assert sys.getrecursionlimit() <= 10_000
    b = _plain_builder()
    node = b.load(b.param(0, F32, False), b.const(0, I32), None)
    one = b.const(1.0, F32)
    for _ in range(100_000):
        node = b.alu(Op.ADD, F32, node, one)
    rules = RuleTable([Rule("x + 1 -> x - (-1)", frozenset({Op.ADD}), lambda node: node.srcs[1].arg == 1.0,
                            lambda builder, node: builder.alu(Op.SUB, F32, node.srcs[0], builder.const(-1.0, F32)))])
    result = rewrite(node, rules, _plain_builder())
    ops = [item.op for item in topological_nodes(result)]
    assert ops.count(Op.SUB) == 100_000 and Op.ADD not in ops
    depth, walker = 0, result
    while walker.op is Op.SUB:
        assert walker.srcs[1].arg == -1.0
        walker, depth = walker.srcs[0], depth + 1
    assert depth == 100_000 and walker.op is IROp.LOAD


def test_the_simplifier_is_a_table_run_as_nodes_are_built() -> None:
    b = Builder()
    assert b.rules is SIMPLIFY
    index = b.new_range(8, I32)  # 0..7
    assert b.alu(Op.ADD, I32, index, b.const(0, I32)) is index  # x + 0
    assert b.alu(Op.MUL, I32, b.const(1, I32), index) is index  # 1 * x: swapped, then x * 1
    assert b.alu(Op.IDIV, I32, b.alu(Op.MUL, I32, index, b.const(4, I32)), b.const(4, I32)) is index  # (x*4)//4
    assert b.alu(Op.MOD, I32, index, b.const(8, I32)) is index  # bounds: 0 <= x < 8
    # k*(x % c) + k*c*(x // c) -> k*x
    x = b.new_range(100, I32)
    recombined = b.alu(Op.ADD, I32, b.alu(Op.MOD, I32, x, b.const(7, I32)),
                       b.alu(Op.MUL, I32, b.alu(Op.IDIV, I32, x, b.const(7, I32)), b.const(7, I32)))
    assert recombined is x
    folded = b.alu(Op.MAX, F32, b.const(math.nan, F32), b.const(1.0, F32))
    assert folded.is_const and math.isnan(folded.arg)
    # a float x + 0.0 stays: it is -0.0 + 0.0 = +0.0, not x, at x = -0.0
    y = b.load(b.param(0, F32, False), index, None)
    assert b.alu(Op.ADD, F32, y, b.const(0.0, F32)).op is Op.ADD


def _integer_value(root: IRNode, bindings: dict[int, int]) -> int:
    """The value of an integer index DAG with its RANGE nodes bound, computed with Python's integers."""
    values: dict[int, int] = {}
    for node in topological_nodes(root):
        if node.op is IROp.CONST:
            values[id(node)] = node.arg
        elif node.op is IROp.RANGE:
            values[id(node)] = bindings[id(node)]
        else:
            a, b = (values[id(src)] for src in node.srcs)
            values[id(node)] = a + b if node.op is Op.ADD else a * b if node.op is Op.MUL else (
                a // b if node.op is Op.IDIV else a % b)  # only the node's own op: b may be 0 for the others
    return values[id(root)]


@pytest.mark.parametrize("step, offset, divisor", [(8, 3, 256), (8, 0, 256), (8, 13, 256), (4, 6, 24), (6, 5, 4)])
def test_division_of_lane_offsets_keeps_one_term(step: int, offset: int, divisor: int) -> None:
    """(g*y + c) // (g*m) and % (what a reduce split into vector lanes indexes through a reshape) are rewritten to a
    term of y shared by the lanes plus constants, with the values Python's integers give."""
    b = Builder()
    y = b.new_range(100, I32)
    numerator = b.alu(Op.ADD, I32, b.alu(Op.MUL, I32, y, b.const(step, I32)), b.const(offset, I32))
    quotient = b.alu(Op.IDIV, I32, numerator, b.const(divisor, I32))
    remainder = b.alu(Op.MOD, I32, numerator, b.const(divisor, I32))
    for value in range(100):
        expected = step * value + offset
        assert _integer_value(quotient, {id(y): value}) == expected // divisor
        assert _integer_value(remainder, {id(y): value}) == expected % divisor
    # the reshape's index quotient * divisor + remainder recombines to the linear index itself
    linear = b.alu(Op.ADD, I32, b.alu(Op.MUL, I32, quotient, b.const(divisor, I32)), remainder)
    assert linear is numerator or _integer_value(linear, {id(y): 7}) == step * 7 + offset
    if math.gcd(step, divisor) == step and offset < step:  # lanes of one vector: the same quotient as lane 0's
        lane_zero = b.alu(Op.MUL, I32, y, b.const(step, I32))
        assert quotient is b.alu(Op.IDIV, I32, lane_zero, b.const(divisor, I32))
        assert linear is numerator


def test_window_reread_divides_by_the_remainders_of_its_coefficients() -> None:
    """(j*(L+d) + i) % L and // L (a window view's copies re-read with a longer row): j*d + i and j where that stays
    below L, a division kept where it does not; comparisons the bounds decide fold. Values from Python's integers."""
    b = Builder()
    for length, dilation, kernel, count in ((18, 1, 3, 16), (20, 2, 3, 16), (18, 1, 3, 17)):
        j, i = b.new_range(kernel, I32), b.new_range(count, I32)
        flat = b.alu(Op.ADD, I32, b.alu(Op.MUL, I32, j, b.const(length + dilation, I32)), i)
        remainder = b.alu(Op.MOD, I32, flat, b.const(length, I32))
        quotient = b.alu(Op.IDIV, I32, flat, b.const(length, I32))
        exact = (kernel - 1) * dilation + count - 1 < length
        assert (remainder.op is not Op.MOD and quotient.op is not Op.IDIV) == exact
        for jv in range(kernel):
            for iv in range(count):
                bindings = {id(j): jv, id(i): iv}
                assert _integer_value(remainder, bindings) == (jv * (length + dilation) + iv) % length
                assert _integer_value(quotient, bindings) == (jv * (length + dilation) + iv) // length
    index = b.new_range(54, I32)  # 0..53
    assert b.less(index, 54).is_const and b.less(index, 54).arg is True
    assert b.alu(Op.CMPLT, dtypes.bool_, b.const(60, I32), index).arg is False
    assert not b.less(index, 53).is_const


def test_division_splits_off_a_remainder_below_a_common_factor() -> None:
    """(g*i + j + c) // (g*m) and % (g*m) with 0 <= j + c % g < g (a spread axis' row read through its columns):
    i's quotient and remainder by m, no division of the sum; kept where j can reach g. Values from Python's
    integers."""
    b = Builder()
    for rows, columns, factor, divisor, constant in ((34, 18, 18, 36, 18), (9, 6, 6, 12, 0), (9, 7, 6, 12, 0),
                                                     (5, 4, 8, 24, 3)):
        i, j = b.new_range(rows, I32), b.new_range(columns, I32)
        flat = b.alu(Op.ADD, I32, b.alu(Op.ADD, I32, b.alu(Op.MUL, I32, i, b.const(factor, I32)), j),
                     b.const(constant, I32))
        quotient = b.alu(Op.IDIV, I32, flat, b.const(divisor, I32))
        remainder = b.alu(Op.MOD, I32, flat, b.const(divisor, I32))
        split = columns - 1 + constant % factor < factor
        assert (j not in topological_nodes(quotient)) == split
        for iv in range(rows):
            for jv in range(columns):
                value = factor * iv + jv + constant
                assert _integer_value(quotient, {id(i): iv, id(j): jv}) == value // divisor
                assert _integer_value(remainder, {id(i): iv, id(j): jv}) == value % divisor


@pytest.mark.parametrize("op", sorted(FOLD, key=str))
def test_constant_folding_matches_numpy(op: Op) -> None:
    """Each folder against numpy's result on int32 values (C semantics: truncating division, x // 0 = 0)."""
    b = Builder()
    samples = [(-7, 2), (7, -2), (9, 3), (5, 0), (-2**31, 1), (3, 3)]
    for a, c in samples:
        with np.errstate(all="ignore"):
            node, expected = _fold_case(b, op, a, c)
        assert node.is_const, f"{op.name}({a}, {c}) was not folded"
        assert node.arg == expected, f"{op.name}({a}, {c}) folded to {node.arg}, numpy gives {expected}"


def _fold_case(b: Builder, op: Op, a: int, c: int) -> tuple[IRNode, object]:
    """The node the builder makes of op on constants a (and c), and numpy's value of it."""
    left, right = np.int32(a), np.int32(c)
    expected: Any
    if op in (Op.NEG, Op.NOT, Op.CAST):
        expected = {Op.NEG: -left, Op.NOT: ~left, Op.CAST: left}[op]
        node = b.alu(op, I32, b.const(a, I32))
    elif op is Op.WHERE:
        expected = right if a else left
        node = b.alu(op, I32, b.const(bool(a), dtypes.bool_), b.const(c, I32), b.const(a, I32))
    elif op in (Op.CMPLT, Op.CMPEQ):
        expected = np.bool_(left < right if op is Op.CMPLT else left == right)
        node = b.alu(op, dtypes.bool_, b.const(a, I32), b.const(c, I32))
    elif op in (Op.IDIV, Op.MOD):
        quotient = np.int32(0) if c == 0 else np.int32(np.trunc(np.float64(a) / np.float64(c)))
        expected = quotient if op is Op.IDIV else (np.int32(0) if c == 0 else np.int32(a - c * int(quotient)))
        node = b.alu(op, I32, b.const(a, I32), b.const(c, I32))
    else:
        function = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.MAX: np.maximum,
                    Op.AND: np.bitwise_and, Op.OR: np.bitwise_or, Op.XOR: np.bitwise_xor}[op]
        expected = function(left, right)
        node = b.alu(op, I32, b.const(a, I32), b.const(c, I32))
    return node, expected
