"""Large fuzz examples: one reduction or matmul over 10^5 to 10^8 float32 elements, checked with float64 truth.

The programs of strategies.py stay small (a few hundred elements), so they never reach the sizes where a float32
accumulator stops growing (2^24) or a device's grid runs out (65,535 workgroups). The fuzzer therefore also draws,
at LARGE_PERCENT of its examples, one op over large tensors of seeded random values (or a constant). These are not
checked with the reference tensor's noisy runs (seven float32 runs over 10^8 elements would take a minute) but
against the exact answer, computed in float64 from the same float32 inputs, with the error a correct float32
implementation may make (u = 2^-24, the unit roundoff of float32; n the number of elements reduced into one output):

- sum: a summation tree of depth d errs by at most d * u * sum|x| (Higham, "Accuracy and Stability of Numerical
  Algorithms", 2nd ed., section 4.2); pairwise summation has d = ceil(log2 n). The bound allows twice that depth
  plus SEQUENTIAL_ALLOWANCE more, for a first stage that adds runs of elements one after the other (a thread's
  chunk): the rounding errors of such a run over random values have random signs and grow like the square root of
  the run, so runs of thousands stay inside it. It is still a few 10^-6 of sum|x| at 10^8 elements, while a sum
  that stopped growing at 2^24 (16,777,216 for 2*10^7 ones: 16 % off) or that left out everything past element
  65,535 (a third of 10^5 values) is off by percents.
- mean: the sum's bound divided by n, plus the rounding of the division.
- prod: every multiplication rounds the running product by up to u, in whatever order, so the worst case is
  (n - 1) * u; the errors of products of random values have random signs, so PROD_SIGMAS * sqrt(n) * u bounds them
  (plus the sum's depth term). The factors are drawn in [1 - w, 1 + w] with w = 1 / sqrt(n), so the product stays
  near 1 (its log is a random walk of size about 0.6) and leaving out a third of the factors changes it by tens of %.
- amax, amin, max, min: exact (the result is one of the inputs); argmax and argmin: exact, the first index of the
  extreme (torch's rule).
- matmul: each output element is a sum of products, bounded like a sum over the inner dim, of |a| * |b|, plus the
  rounding of each product.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ember.core import dtype as dtypes
from ember.core.shapes import prod
from ember.testing.program import Call, Program, Ref, SeededValues, Source

LARGE_PERCENT = 2  # of the fuzzer's examples (about 1 s each on 2 cores, against about 0.1 s for a small one)
# Element counts of the large inputs, the simplest (the one shrinking goes to) first, the small ones drawn most; each
# is above 65,535. The last, 10^8 float32 values, takes about 7 s and 1.2 GB (the values, ember's copy, its buffer):
# two large draws in ten reach 5 * 10^7 or 10^8, and the time budget skips one that no longer fits.
ELEMENT_COUNTS = [100_000, 131_073, 1_000_003, 100_000, 4_194_304, 1_000_003, 16_777_217, 20_000_000, 50_000_000,
                  100_000_000]
MAX_MATMUL_OUTPUTS = 20_000_000  # a wide product's output elements (its float64 truth and bound are 320 MB)
LARGE_REDUCTIONS = ["sum", "mean", "amax", "amin", "max", "min", "prod", "argmax", "argmin"]
WHOLE_ONLY = frozenset({"max", "min"})  # with a dim these return (values, indices)
UNIT_ROUNDOFF = 2.0**-24
SEQUENTIAL_ALLOWANCE = 128
PROD_SIGMAS = 6.0
SECONDS_PER_ELEMENT = 1.2e-7  # drawing, copying, reducing, the float64 truth (measured: 7e-8 on 2 busy cores)
SECONDS_FIXED = 2.0  # compiling the kernels of one large example on a cold cache (PoCL: about 1 s)
TRUTH_CHUNK = 1 << 22  # elements converted to float64 at a time


# ---- drawing -----------------------------------------------------------------------------------------------------


@st.composite
def large_programs(draw: st.DrawFn) -> Program:
    """A program of one reduction or one matmul over a large float32 input (its outputs are the last value)."""
    count = draw(st.sampled_from(ELEMENT_COUNTS))
    if draw(st.sampled_from(["reduction", "reduction", "matmul"])) == "matmul":
        return large_matmul(draw, count)
    return large_reduction(draw, count)


def large_reduction(draw: st.DrawFn, count: int) -> Program:
    """sum, mean, ... over all of a large tensor, over its long rows, its long columns, or its many short rows."""
    method = draw(st.sampled_from(LARGE_REDUCTIONS))
    form = "whole" if method in WHOLE_ONLY else draw(st.sampled_from(["whole", "rows", "columns", "many"]))
    shape: tuple[int, ...]
    dim: int | None
    if form == "whole":
        shape, dim = (count,), None
    elif form == "rows":
        rows = draw(st.sampled_from([2, 3, 5]))
        shape, dim = (rows, count // rows), draw(st.sampled_from([1, -1]))
    elif form == "columns":
        columns = draw(st.sampled_from([2, 3, 17]))
        shape, dim = (count // columns, columns), 0
    else:
        length = draw(st.sampled_from([3, 100]))
        shape, dim = (count // length, length), 1
    reduced = shape[dim] if dim is not None else count
    source = large_source(draw, shape, reduced, product=method == "prod")
    args = () if dim is None else (dim,)
    return Program([source, Call(0, method, args)], outputs=(1,), large=True)


def large_matmul(draw: st.DrawFn, count: int) -> Program:
    """`a @ b` with a long inner dim (few outputs, each a long sum) or many outputs (a short inner dim)."""
    if draw(st.booleans()):  # long: at most 3 x 3 outputs, `count` input elements in all
        rows, columns = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2, 3]))
        vector = draw(st.booleans())
        inner = count // (rows + (1 if vector else columns))
    else:  # wide: `count` outputs (at most MAX_MATMUL_OUTPUTS), each a short sum; inputs as large at most
        columns = draw(st.sampled_from([1, 3, 257]))
        rows, vector = min(count, MAX_MATMUL_OUTPUTS) // columns, False
        inner = min(draw(st.sampled_from([1, 2, 4, 16])), max(1, MAX_MATMUL_OUTPUTS // rows))
    left = large_source(draw, (rows, inner), inner, product=False)
    right = large_source(draw, (inner,) if vector else (inner, columns), inner, product=False)
    return Program([left, right, Call(0, "__matmul__", (Ref(1),))], outputs=(2,), large=True)


def large_source(draw: st.DrawFn, shape: tuple[int, ...], reduced: int, product: bool) -> Source:
    """Large float32 input values: a constant, or seeded random values (uniform, signed, small integers).

    For a product the values are near 1 (see the module's docstring), so that it neither overflows nor vanishes."""
    seed = draw(st.integers(0, 2**16))
    if product:
        width = min(0.5, 1.0 / math.sqrt(max(reduced, 1)))
        return Source("random", dtypes.float32, shape, fill=SeededValues(seed, 2.0 * width, 1.0 - width))
    kind = draw(st.sampled_from(["uniform", "constant", "signed", "integers"]))
    if kind == "constant":
        return Source("full", dtypes.float32, shape, fill=draw(st.sampled_from([1.0, 0.5, 3.0])))
    if kind == "signed":
        return Source("random", dtypes.float32, shape, fill=SeededValues(seed, 2.0, -1.0))
    if kind == "integers":
        return Source("random", dtypes.float32, shape, fill=SeededValues(seed, 5.0, -2.0, integral=True))
    return Source("random", dtypes.float32, shape, fill=SeededValues(seed, 1.0, 0.0))


def largest_bytes(program: Program) -> int:
    """The bytes of a large program's largest input (its outputs and partial results are smaller)."""
    return max((prod(node.shape) * node.dtype.itemsize for node in program.nodes if isinstance(node, Source)),
               default=0)


def estimated_seconds(program: Program) -> float:
    """About how long a large program takes to check on a cold cache (an upper estimate, for the time budget)."""
    elements = sum(prod(node.shape) for node in program.nodes if isinstance(node, Source))
    return SECONDS_FIXED + SECONDS_PER_ELEMENT * elements


# ---- checking ----------------------------------------------------------------------------------------------------


@dataclass
class Truth:
    """The exact result of a large program (float64, or int64 indices) and how far a correct float32 one may be."""

    expected: np.ndarray
    bound: np.ndarray | None  # None: must match exactly


def source_values(source: Source) -> np.ndarray:
    """A large source's float32 values (a constant as a read-only broadcast view, which takes no memory)."""
    if source.kind == "full":
        return np.broadcast_to(np.float32(source.fill), source.shape)
    assert isinstance(source.fill, SeededValues)
    return source.fill.array(source.shape)


def sum_bound(count: int, absolute_sum: Any) -> Any:
    """How far a correct float32 sum of `count` values may be from the exact one, given the sum of their |x|."""
    depth = math.ceil(math.log2(max(count, 2)))
    return UNIT_ROUNDOFF * (2 * depth + SEQUENTIAL_ALLOWANCE) * np.asarray(absolute_sum, dtype=np.float64)


def prod_bound(count: int, exact: Any) -> Any:
    """How far a correct float32 product of `count` random values may be from the exact one (see the docstring)."""
    depth = math.ceil(math.log2(max(count, 2)))
    relative = UNIT_ROUNDOFF * (PROD_SIGMAS * math.sqrt(count) + 2 * depth + SEQUENTIAL_ALLOWANCE)
    return relative * np.abs(np.asarray(exact, dtype=np.float64))


def _reduce64(values: np.ndarray, function: Any, dim: int | None, absolute: bool = False) -> np.ndarray:
    """function (np.sum, np.prod) of float32 values (of |values| if `absolute`) over dim (None: all), in float64.

    The values are converted a chunk of at most TRUTH_CHUNK elements at a time, along their longest axis."""
    whole = dim is None
    values = values.reshape(-1, 1) if whole else values
    dim = 0 if dim is None else dim % values.ndim
    axis = int(np.argmax(values.shape))
    step = max(1, TRUTH_CHUNK * values.shape[axis] // max(values.size, 1))
    parts = []
    for start in range(0, values.shape[axis], step):
        chunk = values[(slice(None),) * axis + (slice(start, start + step),)].astype(np.float64)
        parts.append(function(np.abs(chunk) if absolute else chunk, axis=dim))
    result = function(np.stack(parts), axis=0) if axis == dim else np.concatenate(parts)
    return result.reshape(()) if whole else result


def reduction_truth(method: str, values: np.ndarray, dim: int | None) -> Truth:
    """The exact result of a large reduction and its error bound."""
    count = values.size if dim is None else values.shape[dim]
    if method in ("sum", "mean"):
        exact = _reduce64(values, np.sum, dim)
        bound = sum_bound(count, _reduce64(values, np.sum, dim, absolute=True))
        if method == "mean":
            exact, bound = exact / count, bound / count + 4 * UNIT_ROUNDOFF * np.abs(exact / count)
        return Truth(exact, bound)
    if method == "prod":
        exact = _reduce64(values, np.prod, dim)
        return Truth(exact, prod_bound(count, exact))
    function: Any = {"amax": np.max, "max": np.max, "amin": np.min, "min": np.min,
                "argmax": np.argmax, "argmin": np.argmin}[method]
    return Truth(np.asarray(function(values, axis=dim)), None)


def matmul_truth(left: np.ndarray, right: np.ndarray) -> Truth:
    """The exact `left @ right` of float32 operands (in float64) and its error bound per output element.

    Accumulated over chunks of the inner dim (a long product) or of the rows (a wide one), in float64."""
    inner = left.shape[-1]
    exact = magnitude = None
    if inner > left.shape[0]:
        step = max(1, TRUTH_CHUNK // max(left.shape[0], 1))
        for start in range(0, inner, step):
            part_left = left[:, start: start + step].astype(np.float64)
            part_right = right[start: start + step].astype(np.float64)
            product, size = part_left @ part_right, np.abs(part_left) @ np.abs(part_right)
            exact = product if exact is None else exact + product
            magnitude = size if magnitude is None else magnitude + size
    else:
        step = max(1, TRUTH_CHUNK // max(inner, 1))
        right64 = right.astype(np.float64)
        rows = [left[start: start + step].astype(np.float64) for start in range(0, left.shape[0], step)]
        exact = np.concatenate([part @ right64 for part in rows])
        magnitude = np.concatenate([np.abs(part) @ np.abs(right64) for part in rows])
    assert exact is not None and magnitude is not None
    return Truth(exact, sum_bound(inner, magnitude) + UNIT_ROUNDOFF * magnitude)


def program_truth(program: Program, inputs: list[np.ndarray]) -> Truth:
    """The truth of a large program (a reduction or a matmul of its sources) from its sources' values."""
    call = program.nodes[-1]
    assert isinstance(call, Call)
    if call.method == "__matmul__":
        return matmul_truth(inputs[0], inputs[1])
    return reduction_truth(call.method, inputs[0], call.args[0] if call.args else None)


def large_problem(actual: np.ndarray, truth: Truth) -> str:
    """What is wrong with ember's result of a large program ("" if nothing): NaN and infinities, or values out of
    the error bound (the worst few shown with the bound)."""
    expected = truth.expected
    if np.shape(actual) != np.shape(expected):
        return f"shape {np.shape(actual)} != expected {np.shape(expected)}"
    got = np.asarray(actual).astype(np.float64)
    if truth.bound is None:
        bad = got != expected
        what = "differs"
    else:
        with np.errstate(invalid="ignore"):
            bad = ~(np.abs(got - expected) <= truth.bound)  # NaN or inf where the truth is finite is bad too
        what = "is out of the float32 error bound"
    if not bad.any():
        return ""
    positions = np.argwhere(np.atleast_1d(bad))[:4]
    shown = []
    for position in positions:
        at = tuple(int(index) for index in position)[: np.ndim(expected)]
        bound = "" if truth.bound is None else f" (bound {float(np.asarray(truth.bound)[at]):.3g})"
        shown.append(f"at {at} ember {np.asarray(actual)[at]!r} exact {np.asarray(expected)[at]!r}{bound}")
    return f"{int(bad.sum())} of {bad.size} elements {what}: " + ", ".join(shown)
