"""C source of float32 vector math the c backend writes inline: exp2 (its kernels call it instead of glibc's
libmvec), and trunc and sqrt as one instruction a vector (`lane_instruction_source`).

The algorithm is ir/libm.py's exp2 (tested there within 3 ulp over the whole float32 range, subnormal results
included): x clamped to [-152, 128], k = x rounded, r = x - k in [-1/2, 1/2], 2**r by the first 8 terms of its
Taylor series, times 2**k; NaN passes through. Where the compiler targets AVX-512, vrndscaleps rounds and vscalefps
multiplies by 2**k, masked off where 2**k vanishes (SCALE_INSTRUCTIONS); elsewhere k rounds halves away from zero
and 2**k is built from exponent bits in two halves (so that 2**-149 and 2**127 both come out right). Written in
gcc's vector extensions, it is a dozen multiply-adds and a few conversions a vector with nothing called: 32,768
values ran in 16.6 us against libmvec's AVX-512 exp2f's 29.7 (one thread, Sapphire Rapids), before the AVX-512
form halved it again. An exponent already integral (a TRUNC: exp(x) = 2**(x/ln2 - n) * 2**n, ember's exp) needs
no series: `integral_exp2_source` builds 2**n alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

LOWEST, HIGHEST = -152.0, 128.0  # where the clamp keeps x: results 0 and infinity are reached there already
TERMS = 8


def _literal(value: float) -> str:
    return f"{float(np.float32(value))!r}f"


# AVX-512's instructions for 2**x, where the compiler has their builtins (what <immintrin.h>'s _mm*_roundscale_ps,
# _mm*_scalef_ps and _mm*_cmp_ps_mask expand to) and targets the ISA: vrndscaleps rounds to the nearest whole number
# and vscalefps multiplies by 2**k in one rounding (overflow to infinity, underflow through the subnormals, NaN
# through), in place of the exponent bits built in two halves, the clamps and the NaN select: exp of 2^20 floats on
# one thread 908 -> 377 us (Sapphire Rapids). The scaling is masked off (0) where k is below VANISHING: a scaling
# that underflows to 0 took a microcode assist, exp of 2^20 floats below -104 ran 20x slower than of 0 (8.5 ms
# against 0.4); masked lanes are not computed (a subnormal result, exp of -103..-88, still takes one).
# (width: (ISA, builtins, the rounding of {x}, {x} * 2**{k}))
SCALE_INSTRUCTIONS = {
    16: ("__AVX512F__", ("__builtin_ia32_rndscaleps_mask", "__builtin_ia32_scalefps512_mask",
                         "__builtin_ia32_cmpps512_mask"),
         "__builtin_ia32_rndscaleps_mask({x}, 0x08, {x}, -1, 4)",
         "__builtin_ia32_scalefps512_mask({x}, {k}, {zero}, __builtin_ia32_cmpps512_mask({k}, {low}, 0x15, -1, 4), 4)"),
    8: ("__AVX512VL__", ("__builtin_ia32_rndscaleps_256_mask", "__builtin_ia32_scalefps256_mask",
                         "__builtin_ia32_cmpps256_mask"),
        "__builtin_ia32_rndscaleps_256_mask({x}, 0x08, {x}, -1)",
        "__builtin_ia32_scalefps256_mask({x}, {k}, {zero}, __builtin_ia32_cmpps256_mask({k}, {low}, 0x15, -1))"),
    4: ("__AVX512VL__", ("__builtin_ia32_rndscaleps_128_mask", "__builtin_ia32_scalefps128_mask",
                         "__builtin_ia32_cmpps128_mask"),
        "__builtin_ia32_rndscaleps_128_mask({x}, 0x08, {x}, -1)",
        "__builtin_ia32_scalefps128_mask({x}, {k}, {zero}, __builtin_ia32_cmpps128_mask({k}, {low}, 0x15, -1))"),
}
VANISHING = -150.0  # 2**k for whole k below it rounds to 0 (2**-150 is half the smallest subnormal: to even, 0)


def _series() -> str:
    """2**r for r in [-1/2, 1/2]: the first TERMS terms of its Taylor series, by Horner's rule."""
    coefficients = [math.log(2) ** n / math.factorial(n) for n in range(TERMS)]
    series = _literal(coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        series = f"({series} * r + {_literal(coefficient)})"
    return series


def _with_scale_instructions(width: int, vector: str,
                             scaled: Callable[[Callable[[str], str], Callable[[str, str], str]], list[str]],
                             portable: list[str]) -> str:
    """The lines `scaled(round_call, scale_call)` gives (round_call(x): x rounded to whole numbers; scale_call(x,
    k): x * 2**k, 0 where k is below VANISHING) with AVX-512's builtins where the compiler has them for vectors of
    `width` float32 lanes, else `portable`; `portable` alone for widths without them."""
    if width not in SCALE_INSTRUCTIONS:
        return "\n".join(portable)
    isa, builtins, round_call, scale_call = SCALE_INSTRUCTIONS[width]
    zero, low = f"({vector}){{}}", f"(({vector}){{}} + {_literal(VANISHING)})"
    body = scaled(lambda x: round_call.format(x=x), lambda x, k: scale_call.format(x=x, k=k, zero=zero, low=low))
    available = " && ".join(f"__has_builtin({builtin})" for builtin in builtins)
    return "\n".join(["#if !defined(__has_builtin)", "#define __has_builtin(name) 0", "#endif",
                      f"#if defined({isa}) && {available}", *body, "#else", *portable, "#endif"])


def exp2_source(function: str, vector: str, mask: str, width: int = 0) -> str:
    """`static inline vector function(vector x)`: 2**x lane by lane (`mask`: the int32 vector of as many lanes;
    `width`: their count, which picks AVX-512's instructions where SCALE_INSTRUCTIONS has them)."""
    series = _series()

    def scaled(round_call: Callable[[str], str], scale_call: Callable[[str, str], str]) -> list[str]:
        return [
            f"static inline {vector} {function}({vector} x) {{",
            f"  const {mask} below = x < {_literal(LOWEST)};",
            f"  {vector} clamped = ({vector})((below & ({mask})(({vector}){{}} + {_literal(LOWEST)}))"
            f" | (~below & ({mask})x));",
            f"  const {mask} above = clamped > {_literal(HIGHEST)};",
            f"  clamped = ({vector})((above & ({mask})(({vector}){{}} + {_literal(HIGHEST)}))"
            f" | (~above & ({mask})clamped));",
            f"  const {vector} k = ({vector}){round_call('clamped')};",
            f"  const {vector} r = clamped - k;",
            f"  const {vector} series = {series};",
            f"  return ({vector}){scale_call('series', 'k')};",
            "}",
        ]

    portable = [
        f"static inline {vector} {function}({vector} x) {{",
        f"  const {mask} is_nan = x != x, below = x < {_literal(LOWEST)}, above = x > {_literal(HIGHEST)};",
        f"  {vector} clamped = ({vector})((below & ({mask})(({vector}){{}} + {_literal(LOWEST)}))"
        f" | (above & ({mask})(({vector}){{}} + {_literal(HIGHEST)})) | (~(below | above | is_nan) & ({mask})x));",
        f"  const {mask} negative = clamped < 0.0f;",
        f"  const {vector} half = ({vector})((negative & ({mask})(({vector}){{}} - 0.5f))"
        f" | (~negative & ({mask})(({vector}){{}} + 0.5f)));",
        f"  const {mask} k = __builtin_convertvector(clamped + half, {mask});",
        f"  const {vector} r = clamped - __builtin_convertvector(k, {vector});",
        f"  const {vector} series = {series};",
        f"  const {mask} low = k >> 1;",
        f"  const {vector} result = series * ({vector})((low + 127) << 23) * ({vector})((k - low + 127) << 23);",
        f"  return ({vector})((is_nan & ({mask})x) | (~is_nan & ({mask})result));",
        "}",
    ]
    return _with_scale_instructions(width, vector, scaled, portable)


def integral_exp2_source(function: str, vector: str, mask: str, width: int = 0) -> str:
    """`static inline vector function(vector x)`: 2**x for x whose lanes are whole numbers (or NaN, or beyond the
    range: 0 and infinity as exp2_source's), from exponent bits alone, or one vscalefps."""

    def scaled(_: Callable[[str], str], scale_call: Callable[[str, str], str]) -> list[str]:
        return [f"static inline {vector} {function}({vector} x) {{",
                f"  const {vector} one = ({vector}){{}} + 1.0f;",
                f"  return ({vector}){scale_call('one', 'x')};",
                "}"]

    portable = [
        f"static inline {vector} {function}({vector} x) {{",
        f"  const {mask} is_nan = x != x, below = x < {_literal(LOWEST)}, above = x > {_literal(HIGHEST)};",
        f"  const {vector} clamped = ({vector})((below & ({mask})(({vector}){{}} + {_literal(LOWEST)}))"
        f" | (above & ({mask})(({vector}){{}} + {_literal(HIGHEST)})) | (~(below | above | is_nan) & ({mask})x));",
        f"  const {mask} k = __builtin_convertvector(clamped, {mask});",
        f"  const {mask} low = k >> 1;",
        f"  const {vector} result = ({vector})((low + 127) << 23) * ({vector})((k - low + 127) << 23);",
        f"  return ({vector})((is_nan & ({mask})x) | (~is_nan & ({mask})result));",
        "}",
    ]
    return _with_scale_instructions(width, vector, scaled, portable)


# x86 instructions for a whole vector of float32 lanes: the lane loop gcc is given otherwise became two 256-bit
# halves on Intel (gcc prefers 256-bit vectors for the loops it vectorizes itself there), stored and read back as
# one 512-bit vector: a store-forwarding stall in every vector of ember's exp. Called through the compiler's
# builtins (what <immintrin.h>'s intrinsics expand to; the header alone cost ~120 ms of every compiler run), each
# form where `__has_builtin` finds it, else the lane loop: (width, builtin, call) by kind
LANE_INSTRUCTIONS = {
    ("trunc", 16): (("__builtin_ia32_rndscaleps_mask", "__builtin_ia32_rndscaleps_mask(x, 0x0B, x, -1, 4)"),),
    ("trunc", 8): (("__builtin_ia32_roundps256", "__builtin_ia32_roundps256(x, 0x0B)"),),  # (toward zero, quiet)
    ("sqrt", 16): (("__builtin_ia32_sqrtps512_mask", "__builtin_ia32_sqrtps512_mask(x, x, -1, 4)"),  # gcc's
                   ("__builtin_ia32_sqrtps512", "__builtin_ia32_sqrtps512(x, 4)")),  # clang's
    ("sqrt", 8): (("__builtin_ia32_sqrtps256", "__builtin_ia32_sqrtps256(x)"),),
}


def lane_instruction_source(kind: str, function: str, vector: str, width: int, loop: str) -> str:
    """The helper `loop` defines (`static inline vector function(vector x)`, a lane loop) as one x86 instruction for
    a float32 TRUNC or SQRT where the compiler has its builtin and targets its ISA, with `loop` kept for where it
    has not; `loop` itself where LANE_INSTRUCTIONS has no entry."""
    forms = LANE_INSTRUCTIONS.get((kind, width))
    if forms is None:
        return loop
    isa = "__AVX512F__" if width == 16 else "__AVX__"
    lines = ["#if !defined(__has_builtin)", "#define __has_builtin(name) 0", "#endif"]
    for position, (builtin, call) in enumerate(forms):
        test = f"defined({isa}) && __has_builtin({builtin})"
        lines += [f"#{'if' if position == 0 else 'elif'} {test}",
                  f"static inline {vector} {function}({vector} x) {{ return ({vector}){call}; }}"]
    return "\n".join([*lines, "#else", loop, "#endif"])
