"""The c backend's inline float32 vector math (backends/c_math.py): exp2 written as a polynomial in the kernel, not
libmvec's, and trunc and sqrt as one x86 instruction a vector. Checked against numpy in float64 over a dense sweep
of the whole float32 range (normal, subnormal and overflowing results), NaN and infinities, in the vectors of
this machine's width (EMBER_C_VECTOR_WIDTH=8 runs them in AVX2's)."""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Callable

import numpy as np
import pytest

import ember as em
from ember.backends.c import CRenderer
from ember.backends.c_math import exp2_source, integral_exp2_source
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch

SMALLEST_SUBNORMAL = 2.0**-149


def _sweep(low: float, high: float, count: int = 1 << 17) -> np.ndarray:
    """`count` float32 values from low to high, then NaN, the infinities and the ends exactly (a multiple of 16)."""
    values = np.linspace(low, high, count - 16, dtype=np.float32)
    ends = [np.nan, np.inf, -np.inf, low, high, 0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 127.0, -126.0, -149.0, 128.0, -152.0]
    return np.concatenate([values, np.array(ends, dtype=np.float32)])


def _ulps(result: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """|result - truth| in float32 ulps of the truth (the subnormal spacing below the normal range)."""
    spacing = np.maximum(np.spacing(np.abs(truth).astype(np.float32)).astype(np.float64), SMALLEST_SUBNORMAL)
    return np.abs(result.astype(np.float64) - truth) / spacing


def _as_float32(values: np.ndarray) -> np.ndarray:
    """float64 values rounded to float32 (past its largest: infinity)."""
    with np.errstate(over="ignore"):
        return values.astype(np.float32)


@pytest.mark.parametrize("name, low, high, truth_of", [("exp2", -160.0, 130.0, np.exp2), ("exp", -110.0, 95.0, np.exp)],
                         ids=["exp2", "exp"])
def test_exp2_and_exp_are_within_3_ulps_over_the_float32_range(name: str, low: float, high: float,
                                                                 truth_of: Callable[[np.ndarray], np.ndarray]) -> None:
    """Both past the ends of the range (results 0, subnormal and infinite), NaN and the infinities included."""
    data = _sweep(low, high)
    result = getattr(em.tensor(data, device="c"), name)().numpy()
    truth = truth_of(data.astype(np.float64))
    finite = np.isfinite(truth) & (truth < np.finfo(np.float32).max)
    assert _ulps(result[finite], truth[finite]).max() <= 3
    assert np.array_equal(result[~finite], _as_float32(truth[~finite]), equal_nan=True)  # inf, NaN, 0


def _compiled_helpers(tmp_path, width: int, portable: bool) -> ctypes.CDLL:
    """exp2_source's and integral_exp2_source's helpers for `width` lanes in a library of their own, with
    AVX-512's instructions where this compiler and machine have them or (`portable`) the exponent-bit form."""
    from ember.backends.c import plain_compiler_command

    vector, mask = f"float{width}", f"int{width}"
    source = "\n".join([
        f"typedef float {vector} __attribute__((vector_size({4 * width})));",
        f"typedef int {mask} __attribute__((vector_size({4 * width})));",
        "float truncf(float);",
        exp2_source("exp2_lanes", vector, mask, width), integral_exp2_source("integral_lanes", vector, mask, width),
        "void run(const float* x, float* fraction, float* integral, long count) {",
        f"  for (long start = 0; start < count; start += {width}) {{",
        f"    {vector} v, whole; __builtin_memcpy(&v, x + start, sizeof v);",
        f"    for (int lane = 0; lane < {width}; lane++) whole[lane] = truncf(v[lane]);",
        f"    {vector} a = exp2_lanes(v), b = integral_lanes(whole);",
        "    __builtin_memcpy(fraction + start, &a, sizeof a); __builtin_memcpy(integral + start, &b, sizeof b);",
        "  }",
        "}",
    ])
    (tmp_path / "helpers.c").write_text(source)
    library = tmp_path / f"helpers_{width}_{portable}.so"
    undefine = ["-U__AVX512F__", "-U__AVX512VL__"] if portable else []
    subprocess.run([*plain_compiler_command(("-O2",)), *undefine, str(tmp_path / "helpers.c"), "-o", str(library),
                    "-lm"], check=True, capture_output=True)
    return ctypes.CDLL(str(library))


@pytest.mark.parametrize("width", [16, 8, 4])
@pytest.mark.parametrize("portable", [False, True], ids=["machine", "portable"])
def test_both_forms_of_the_exp2_helpers_are_within_3_ulps(tmp_path, width: int, portable: bool) -> None:
    """The AVX-512 form (vrndscaleps, vscalefps: taken by the kernels of a machine that has it) and the portable
    form (exponent bits in two halves: every other machine's) over the whole range, NaN and the infinities."""
    library = _compiled_helpers(tmp_path, width, portable)
    data = _sweep(-160.0, 130.0)
    fraction, integral = np.empty_like(data), np.empty_like(data)
    pointer = ctypes.POINTER(ctypes.c_float)
    library.run(data.ctypes.data_as(pointer), fraction.ctypes.data_as(pointer), integral.ctypes.data_as(pointer),
                ctypes.c_long(data.size))
    for result, argument in ((fraction, data), (integral, np.trunc(data))):
        truth = np.exp2(argument.astype(np.float64))
        finite = np.isfinite(truth) & (truth < np.finfo(np.float32).max)
        assert _ulps(result[finite], truth[finite]).max() <= 3
        assert np.array_equal(result[~finite], _as_float32(truth[~finite]), equal_nan=True)
    np.testing.assert_array_equal(integral[np.isfinite(data)], _as_float32(np.exp2(np.trunc(data[np.isfinite(data)])
                                                                                  .astype(np.float64))))


def test_trunc_and_sqrt_match_numpy_exactly_at_every_magnitude() -> None:
    generator = np.random.default_rng(0)
    magnitudes = 2.0 ** generator.uniform(-140, 127, 4096 - 16)
    data = np.concatenate([(magnitudes * generator.choice([-1, 1], magnitudes.size)).astype(np.float32),
                           np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 2.0**31, -(2.0**31), 2.0**24 + 2,
                                     1e-45, -1e-45, 0.9999999, -1.0000001, 3.4e38, -3.4e38], dtype=np.float32)])
    x = em.tensor(data, device="c")
    np.testing.assert_array_equal(x.trunc().numpy(), np.trunc(data))
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(x.abs().sqrt().numpy(), np.sqrt(np.abs(data)))


def test_vector_kernels_call_no_libmvec_exp2() -> None:
    """The exp kernel's vectors compute exp2 inline (a kernel calling libmvec ran it 1.8x slower) and build its
    2**n factor from exponent bits alone."""
    data = em.tensor(np.zeros(4096, np.float32), device="c")
    (launch,) = [item for item in kernelize([data.exp().node]) if isinstance(item, Launch)]
    from ember.ir.opt import choose_plan
    from ember.scheduler.devices import get_device

    _, lowered = choose_plan(launch.kernel, "exp_kernel", get_device("c").info)
    source = CRenderer().render(lowered)
    assert "_ZGV" not in source and "exp2f(x[lane])" not in source
    assert "ember_exp2_integral_float32x" in source
    assert "static inline" in exp2_source("f", "v", "m")


def _lowered(tensor: em.Tensor):
    from ember.ir.opt import choose_plan
    from ember.scheduler.devices import get_device

    (launch,) = [item for item in kernelize([tensor.node]) if isinstance(item, Launch)]
    return choose_plan(launch.kernel, "kernel", get_device("c").info)


def test_a_negated_mask_vectorizes_and_heavy_kernels_take_every_core() -> None:
    """expm1 tests its value with NOTs of comparisons (u != 1): negated masks (`~` on a vector) let it vectorize,
    with torch's values at the edges; its work items (exp, log2, a division) weigh ~7 light ones, so 4,096 of them
    run on two threads, where an addition's 4,096 stay on one."""
    import torch

    from ember.backends.c import kernel_threads

    data = np.concatenate([np.linspace(-30, 30, 65536 - 8, dtype=np.float32),
                           np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-7, -1e-30, 9.0], dtype=np.float32)])
    x = em.tensor(data.reshape(128, 512), device="c")
    plan, lowered = _lowered(x.expm1())
    assert plan.vector_width > 1
    assert kernel_threads(lowered, 2) == 2
    assert kernel_threads(_lowered(x + x)[1], 2) == 1
    expected = torch.expm1(torch.from_numpy(data)).numpy()
    np.testing.assert_allclose(x.expm1().numpy().reshape(-1), expected, rtol=2e-6, atol=1e-30)
    assert np.signbit(x.expm1().numpy().reshape(-1)[-4])  # expm1(-0.0) is -0.0
    mask = em.tensor(data, device="c") > 0
    np.testing.assert_array_equal((~mask).numpy(), ~(data > 0))


def test_tanh_is_within_2_ulps_over_the_float32_range() -> None:
    """float32 tanh: an odd polynomial below |x| = 0.625 and 1 - 2 / (exp(2|x|) + 1) above (core/unary_math.py),
    against numpy in float64, tiny values, the bound, saturation, NaN, the infinities and -0.0 included."""
    magnitudes = np.float32(10.0) ** np.linspace(-30, 1.6, 20000, dtype=np.float32)
    data = np.concatenate([np.linspace(-12, 12, 200000, dtype=np.float32), magnitudes, -magnitudes,
                           np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.625, -0.625, 0.62499994, 100.0, -100.0,
                                     1e-45, 44.0], dtype=np.float32)])
    result = em.tensor(data, device="c").tanh().numpy()
    truth = np.tanh(data.astype(np.float64))
    finite = np.isfinite(truth)
    assert _ulps(result[finite], truth[finite]).max() <= 2
    assert np.isnan(result[np.isnan(data)]).all() and np.signbit(result[data == 0]).tolist() == [False, True]


def test_exp_and_tanh_of_ten_million_values_on_every_thread() -> None:
    """At a user's size: 10^7 values in rows of 125,000 (past 65,535), both threads' shares of the vector loops
    and their ends, a row whose exp underflows to 0 (the lanes vscalefps masks off) and one of subnormal results,
    within 3 ulp of float64 everywhere (one computation, checked whole)."""
    generator = np.random.default_rng(3)
    data = generator.uniform(-100.0, 88.0, (80, 125_000)).astype(np.float32)
    data[1] = generator.uniform(-3000.0, -104.0, 125_000)
    data[2] = generator.uniform(-103.9, -87.4, 125_000)
    data[0, :4], data[-1, -4:] = [np.nan, np.inf, -np.inf, -0.0], [1e-30, -1e-30, 88.7, -104.0]
    x = em.tensor(data, device="c")
    for name, truth_of in (("exp", np.exp), ("tanh", np.tanh)):
        result = getattr(x, name)().numpy()
        truth = truth_of(data.astype(np.float64))
        finite = np.isfinite(truth) & (truth < np.finfo(np.float32).max)
        assert _ulps(result[finite], truth[finite]).max() <= 3, name
        assert np.array_equal(result[~finite], _as_float32(truth[~finite]), equal_nan=True), name
