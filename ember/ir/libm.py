"""exp2, log2 and sin built from primitive IR ops, for targets whose own are missing (f64 on GPUs) or inaccurate.

An IR-to-IR pass: a renderer calls `expand_math(kernel, wanted)` before rendering, and the rewrite engine
(ir/rewrite.py) replaces every EXP2/LOG2/SIN node whose (op, dtype) is in `wanted` by a polynomial after range
reduction, written with ADD/MUL/TRUNC/BITCAST/shifts only, so the same expansion runs (and is tested) on the C
backend. Accuracy, measured against numpy in tests/test_ptx.py:
exp2 and log2 within 3 ulp over the whole range (subnormals included); sin within 3 ulp for |x| < 2 and within
2 ulp of 1.0 (absolute) for any finite x: Cody-Waite's reduction up to |x| = 8192 (float32) or 2^19 (float64),
Payne-Hanek's in 64-bit integer arithmetic beyond. Without 64-bit integers (standard WebGPU) sin has only
Cody-Waite's reduction: accurate for |x| < 8192, meaningless (but inside [-1, 1]) far beyond.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.ops import Op
from ember.ir.ir import Builder, IRNode, IROp, KernelIR, topological_nodes
from ember.ir.rewrite import Rule, RuleTable, rewrite

MathOps = frozenset[tuple[Op, DType]]


class _Float:
    """Arithmetic on IR nodes of one float dtype, with the integer type of the same width for bit tricks."""

    def __init__(self, builder: Builder, dtype: DType) -> None:
        self.b = builder
        self.dtype = dtype
        wide = dtype == dtypes.float64
        self.integer = dtypes.int64 if wide else dtypes.int32
        self.mantissa_bits = 52 if wide else 23
        self.bias = 1023 if wide else 127

    def const(self, value: float) -> IRNode:
        return self.b.const(value, self.dtype)

    def int_const(self, value: int) -> IRNode:
        return self.b.const(value, self.integer)

    def op(self, op: Op, *srcs: IRNode) -> IRNode:
        dtype = dtypes.bool_ if op in (Op.CMPLT, Op.CMPEQ) else srcs[-1].dtype
        return self.b.alu(op, dtype, *srcs)

    def node(self, value: IRNode | float) -> IRNode:
        return value if isinstance(value, IRNode) else self.const(value)

    def add(self, a: IRNode, b: IRNode | float) -> IRNode:
        return self.op(Op.ADD, a, self.node(b))

    def sub(self, a: IRNode, b: IRNode | float) -> IRNode:
        return self.op(Op.SUB, a, self.node(b))

    def mul(self, a: IRNode, b: IRNode | float) -> IRNode:
        return self.op(Op.MUL, a, self.node(b))

    def less(self, a: IRNode | float, b: IRNode | float) -> IRNode:
        return self.op(Op.CMPLT, self.node(a), self.node(b))

    def equal(self, a: IRNode, b: IRNode | float) -> IRNode:
        return self.op(Op.CMPEQ, a, self.node(b))

    def where(self, condition: IRNode, if_true: IRNode | float, if_false: IRNode | float) -> IRNode:
        if_true, if_false = self.node(if_true), self.node(if_false)
        return self.b.alu(Op.WHERE, if_true.dtype, condition, if_true, if_false)

    def is_nan(self, x: IRNode) -> IRNode:
        return self.b.alu(Op.NOT, dtypes.bool_, self.equal(x, x))

    def polynomial(self, x: IRNode, coefficients: Iterable[float]) -> IRNode:
        """c0 + c1*x + c2*x^2 + ... by Horner's rule."""
        coefficients = list(coefficients)
        result = self.const(coefficients[-1])
        for coefficient in reversed(coefficients[:-1]):
            result = self.add(self.mul(result, x), coefficient)
        return result

    def round_half_away(self, x: IRNode) -> IRNode:
        """The nearest integer (halves away from zero), as a float; TRUNC is the only rounding primitive."""
        return self.b.alu(Op.TRUNC, self.dtype, self.add(x, self.where(self.less(x, 0.0), -0.5, 0.5)))

    def power_of_two(self, exponent: IRNode) -> IRNode:
        """2**exponent for an integer node in the normal exponent range, built from its bits."""
        biased = self.b.alu(Op.ADD, self.integer, exponent, self.int_const(self.bias))
        shifted = self.b.alu(Op.SHL, self.integer, biased, self.int_const(self.mantissa_bits))
        return self.b.alu(Op.BITCAST, self.dtype, shifted)


def exp2(f: _Float, x: IRNode) -> IRNode:
    """2**x: x = k + r with |r| <= 1/2, 2**r by its Taylor series, 2**k assembled from exponent bits in two halves
    (so results down to the smallest subnormal and up to overflow come out right)."""
    lowest, highest = -(f.bias + f.mantissa_bits + 2), f.bias + 1
    clamped = f.where(f.less(x, float(lowest)), float(lowest), f.where(f.less(float(highest), x), float(highest), x))
    k = f.round_half_away(clamped)
    r = f.sub(clamped, k)
    terms = 14 if f.dtype == dtypes.float64 else 8
    series = f.polynomial(r, [math.log(2) ** n / math.factorial(n) for n in range(terms)])
    k_int = f.b.alu(Op.CAST, f.integer, k)
    first_half = f.b.alu(Op.SHR, f.integer, k_int, f.int_const(1))
    second_half = f.b.alu(Op.SUB, f.integer, k_int, first_half)
    result = f.mul(f.mul(series, f.power_of_two(first_half)), f.power_of_two(second_half))
    return f.where(f.is_nan(x), x, result)


def log2(f: _Float, x: IRNode) -> IRNode:
    """log2(x): x = m * 2**e with m in [sqrt(1/2), sqrt(2)), log2(m) = 2/ln2 * atanh(s), s = (m-1)/(m+1)."""
    wide = f.dtype == dtypes.float64
    subnormal_scale = 54 if wide else 24
    smallest_normal = 2.0 ** (1 - f.bias)
    is_subnormal = f.less(x, smallest_normal)
    scaled = f.where(is_subnormal, f.mul(x, 2.0**subnormal_scale), x)
    bits = f.b.alu(Op.BITCAST, f.integer, scaled)
    exponent_bits = f.b.alu(Op.SHR, f.integer, bits, f.int_const(f.mantissa_bits))
    exponent = f.b.alu(Op.ADD, f.integer, exponent_bits, f.int_const(-f.bias))
    exponent = f.b.alu(Op.WHERE, f.integer, is_subnormal,
                       f.b.alu(Op.ADD, f.integer, exponent, f.int_const(-subnormal_scale)), exponent)
    mantissa_mask = (1 << f.mantissa_bits) - 1
    mantissa_bits = f.b.alu(Op.OR, f.integer, f.b.alu(Op.AND, f.integer, bits, f.int_const(mantissa_mask)),
                            f.int_const(f.bias << f.mantissa_bits))
    mantissa = f.b.alu(Op.BITCAST, f.dtype, mantissa_bits)
    above = f.less(math.sqrt(2.0), mantissa)
    mantissa = f.where(above, f.mul(mantissa, 0.5), mantissa)
    exponent = f.b.alu(Op.WHERE, f.integer, above, f.b.alu(Op.ADD, f.integer, exponent, f.int_const(1)), exponent)
    s = f.op(Op.DIV, f.sub(mantissa, 1.0), f.add(mantissa, 1.0))
    z = f.mul(s, s)
    terms = 12 if wide else 6
    series = f.polynomial(z, [2.0 / math.log(2) / (2 * n + 1) for n in range(terms)])
    result = f.add(f.b.alu(Op.CAST, f.dtype, exponent), f.mul(s, series))
    result = f.where(f.equal(x, math.inf), math.inf, result)
    result = f.where(f.equal(x, 0.0), -math.inf, result)
    result = f.where(f.less(x, 0.0), math.nan, result)
    return f.where(f.is_nan(x), x, result)


# pi/2 split so that k * part is exact for the k a reduction meets (fdlibm's and Cephes' constants)
_HALF_PI_PARTS = {
    dtypes.float64: (1.57079632673412561417e00, 6.07710050630396597660e-11, 2.02226624879595063154e-21),
    dtypes.float32: (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8),
}
# |x| below which Cody-Waite's reduction is accurate (k * part stays exact); beyond it, Payne-Hanek's
_CODY_WAITE_LIMIT = {dtypes.float32: 8192.0, dtypes.float64: 2.0**19}
# Payne-Hanek: 32-bit words of 2/pi used per reduction, and the exponents x can have beyond the limit
_WORDS = {dtypes.float32: 3, dtypes.float64: 5}


def _two_over_pi_words(count: int) -> list[int]:
    """The first `count` 32-bit words of the binary fraction of 2/pi (pi by Machin's formula, in integers)."""
    precision = 32 * count + 64
    one = 1 << precision

    def arctan_of_inverse(n: int) -> int:  # atan(1/n) * 2^precision
        total, term, k, sign = 0, one // n, 1, 1
        while term:
            total += sign * (term // k)
            term, k, sign = term // (n * n), k + 2, -sign
        return total

    pi = 16 * arctan_of_inverse(5) - 4 * arctan_of_inverse(239)
    fraction = (2 << (2 * precision)) // pi >> (precision - 32 * count)  # 2/pi * 2^(32 count)
    return [(fraction >> (32 * (count - 1 - k))) & 0xFFFFFFFF for k in range(count)]


TWO_OVER_PI_WORDS = _two_over_pi_words(40)


def _cody_waite(f: _Float, x: IRNode) -> tuple[IRNode, IRNode]:
    """x = k*pi/2 + r with |r| <= pi/4, pi/2 in three parts: (r, k mod 4)."""
    k = f.round_half_away(f.mul(x, 2.0 / math.pi))
    r = x
    for part in _HALF_PI_PARTS[f.dtype]:
        r = f.sub(r, f.mul(k, part))
    return r, f.b.alu(Op.AND, f.integer, f.b.alu(Op.CAST, f.integer, k), f.int_const(3))


def _payne_hanek(f: _Float, magnitude: IRNode) -> tuple[IRNode, IRNode]:
    """|x| * 2/pi modulo 4 in 64-bit integer arithmetic, for any finite |x|: (r, quadrant) with |r| <= pi/4.

    |x| = A * 2^s with an integer mantissa A; only the words of 2/pi from about bit s on matter (earlier ones give
    multiples of 4), so A times K words, summed in 32-bit limbs, holds the integer part and 64 fraction bits."""
    b, u64, i64 = f.b, dtypes.uint64, dtypes.int64
    words = _WORDS[f.dtype]

    def u(value: int) -> IRNode:
        return b.const(value, u64)

    def op(name: Op, *srcs: IRNode) -> IRNode:
        return b.alu(name, u64, *srcs)

    bits = b.alu(Op.BITCAST, dtypes.uint64 if f.dtype == dtypes.float64 else dtypes.uint32, magnitude)
    bits = b.alu(Op.CAST, u64, bits)
    mantissa = op(Op.OR, op(Op.AND, bits, u((1 << f.mantissa_bits) - 1)), u(1 << f.mantissa_bits))
    lowest = int(math.log2(_CODY_WAITE_LIMIT[f.dtype])) - f.mantissa_bits
    highest = f.bias - f.mantissa_bits
    shift = b.alu(Op.ADD, i64, b.alu(Op.CAST, i64, op(Op.SHR, bits, u(f.mantissa_bits))),
                  b.const(-f.bias - f.mantissa_bits, i64))
    shift = b.alu(Op.MAX, i64, shift, b.const(lowest, i64))
    shift = b.alu(Op.WHERE, i64, b.alu(Op.CMPLT, dtypes.bool_, b.const(highest, i64), shift), b.const(highest, i64),
                  shift)  # infinity and NaN lanes: any in-range value (their result is replaced)
    first = b.alu(Op.SHR, i64, b.alu(Op.ADD, i64, shift, b.const(-2, i64)), b.const(5, i64))  # floor((s-2)/32)
    offset = b.alu(Op.ADD, i64, shift, b.alu(Op.MUL, i64, b.alu(Op.ADD, i64, first, b.const(1, i64)),
                                              b.const(-32, i64)))  # q = s - 32(first + 1), in [-30, 1]
    candidates = range((lowest - 2) // 32, (highest - 2) // 32 + 1)
    is_first = {value: b.alu(Op.CMPEQ, dtypes.bool_, first, b.const(value, i64)) for value in candidates}

    def word(index: int) -> int:
        return TWO_OVER_PI_WORDS[index] if index >= 0 else 0

    limbs = [u(0)] * (words + 2)
    low_part = op(Op.AND, mantissa, u(0xFFFFFFFF))
    high_part = op(Op.SHR, mantissa, u(32)) if f.mantissa_bits > 32 else None
    for j in range(words):
        w = u(word(candidates[-1] + j))
        for value in reversed(candidates[:-1]):
            w = b.alu(Op.WHERE, u64, is_first[value], u(word(value + j)), w)
        position = words - 1 - j
        for part, place in ((low_part, position), (high_part, position + 1)):
            if part is None:
                continue
            product = op(Op.MUL, part, w)
            limbs[place] = op(Op.ADD, limbs[place], op(Op.AND, product, u(0xFFFFFFFF)))
            limbs[place + 1] = op(Op.ADD, limbs[place + 1], op(Op.SHR, product, u(32)))
    carry = u(0)
    for index in range(len(limbs)):
        total = op(Op.ADD, limbs[index], carry)
        carry, limbs[index] = op(Op.SHR, total, u(32)), op(Op.AND, total, u(0xFFFFFFFF))

    def limb(index: int) -> IRNode:
        return limbs[index] if index >= 0 else u(0)

    def pair(index: int) -> IRNode:  # limbs index+1 and index as one 64-bit number
        return op(Op.OR, op(Op.SHL, limb(index + 1), u(32)), limb(index))

    point = b.alu(Op.ADD, i64, b.const(32 * (words - 1), i64), b.alu(Op.NEG, i64, offset))  # the binary point
    upper = b.alu(Op.CMPEQ, dtypes.bool_, b.alu(Op.SHR, i64, point, b.const(5, i64)), b.const(words - 1, i64))
    high = b.alu(Op.WHERE, u64, upper, pair(words - 1), pair(words - 2))
    low = b.alu(Op.WHERE, u64, upper, pair(words - 3), pair(words - 4))
    within = b.alu(Op.CAST, u64, b.alu(Op.AND, i64, point, b.const(31, i64)))
    quadrant = op(Op.AND, op(Op.SHR, high, within), u(3))
    fraction = op(Op.OR, op(Op.SHL, high, op(Op.SUB, u(64), within)), op(Op.SHR, low, within))
    fraction = b.alu(Op.WHERE, u64, b.alu(Op.CMPEQ, dtypes.bool_, within, u(0)), low, fraction)
    quadrant = op(Op.AND, op(Op.ADD, quadrant, op(Op.SHR, fraction, u(63))), u(3))  # round to the nearest k
    turns = b.alu(Op.CAST, f.dtype, b.alu(Op.BITCAST, i64, fraction))  # (r / (pi/2)) * 2^64, |r| <= pi/4
    return f.mul(turns, 2.0**-64 * math.pi / 2), b.alu(Op.CAST, f.integer, quadrant)


def sin(f: _Float, x: IRNode, wide_integers: bool = True) -> IRNode:
    """sin(x): x = k*pi/2 + r with |r| <= pi/4, then +-sin(r) or +-cos(r) by the quadrant k mod 4. The reduction
    is Cody-Waite's for moderate |x| and Payne-Hanek's beyond (it needs 64-bit integers)."""
    wide = f.dtype == dtypes.float64
    r, quadrant = _cody_waite(f, x)
    if wide_integers:
        negative = f.less(x, 0.0)
        magnitude = f.where(negative, f.op(Op.NEG, x), x)
        far_r, far_quadrant = _payne_hanek(f, magnitude)
        # sin(-a) = S(-r, -k mod 4) where sin(a) = S(r, k)
        far_r = f.where(negative, f.op(Op.NEG, far_r), far_r)
        negated = f.b.alu(Op.AND, f.integer, f.b.alu(Op.NEG, f.integer, far_quadrant), f.int_const(3))
        far_quadrant = f.b.alu(Op.WHERE, f.integer, negative, negated, far_quadrant)
        far = f.less(_CODY_WAITE_LIMIT[f.dtype], magnitude)  # false for NaN
        r = f.where(far, far_r, r)
        quadrant = f.b.alu(Op.WHERE, f.integer, far, far_quadrant, quadrant)
    z = f.mul(r, r)
    sin_terms, cos_terms = (9, 10) if wide else (5, 6)
    sin_series = f.polynomial(z, [(-1) ** n / math.factorial(2 * n + 1) for n in range(sin_terms)])
    cos_series = f.polynomial(z, [(-1) ** n / math.factorial(2 * n) for n in range(cos_terms)])
    sin_r = f.mul(r, sin_series)

    def in_quadrant(number: int) -> IRNode:
        return f.b.alu(Op.CMPEQ, dtypes.bool_, quadrant, f.int_const(number))

    negative_sin = f.op(Op.NEG, sin_r)
    negative_cos = f.op(Op.NEG, cos_series)
    result = f.where(in_quadrant(0), sin_r, f.where(in_quadrant(1), cos_series,
                                                    f.where(in_quadrant(2), negative_sin, negative_cos)))
    if wide_integers:
        infinite = f.equal(f.where(f.less(x, 0.0), f.op(Op.NEG, x), x), math.inf)
        return f.where(infinite, math.nan, result)
    # without 64-bit integers, far beyond the accurate range the result is meaningless; keep it inside [-1, 1]
    return f.where(f.less(1.0, result), 1.0, f.where(f.less(result, -1.0), -1.0, result))


EXPANSIONS: dict[Op | IROp, Callable[[_Float, IRNode], IRNode]] = {Op.EXP2: exp2, Op.LOG2: log2, Op.SIN: sin}


def expansion_rules(wanted: MathOps, wide_integers: bool = True) -> RuleTable:
    """The rules replacing each EXP2/LOG2/SIN whose (op, dtype) is in `wanted` by its expansion."""

    def expand(builder: Builder, node: IRNode) -> IRNode:
        if node.op is Op.SIN:
            return sin(_Float(builder, node.dtype), node.srcs[0], wide_integers)
        return EXPANSIONS[node.op](_Float(builder, node.dtype), node.srcs[0])

    # final: an expansion holds no EXP2/LOG2/SIN, so the engine need not walk it again
    return RuleTable([Rule("expand math", frozenset(EXPANSIONS), lambda node: (node.op, node.dtype) in wanted, expand,
                           final=True)])


def expand_math(kernel: KernelIR, wanted: MathOps, wide_integers: bool = True) -> KernelIR:
    """The kernel with each EXP2/LOG2/SIN whose (op, dtype) is in `wanted` replaced by its expansion.
    Without `wide_integers` (64-bit integer support) sin is accurate only for |x| < 8192 (Cody-Waite)."""
    nodes = topological_nodes(kernel.sink)
    if not wanted or not any((node.op, node.dtype) in wanted for node in nodes):
        return kernel
    builder = Builder()
    sink = rewrite(kernel.sink, expansion_rules(wanted, wide_integers), builder)
    builder.loop_count = max(builder.loop_count, max((node.arg[0] for node in nodes if node.op is IROp.RANGE),
                                                     default=0))
    return KernelIR(kernel.name, kernel.params, kernel.global_size, sink, kernel.index_dtype,
                    size_parameter=kernel.size_parameter, local_size=kernel.local_size,
                    warp_width=kernel.warp_width, packed=kernel.packed)
