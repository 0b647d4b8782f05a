"""Math functions and activations against PyTorch: every float dtype, special values, accuracy at the edges."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember as em
from tests.helpers import TORCH_DTYPES, assert_close

# float32 within torch's own float32 tolerance; halves are computed in float32 and rounded once
TOLERANCE = {em.float32: (1e-5, 1.3e-6), em.float64: (1e-12, 1e-12), em.float16: (1e-5, 1e-3),
             em.bfloat16: (1e-5, 8e-3)}
SPECIAL = np.array([-np.inf, -1e30, -100.0, -20.5, -3.5, -2.5, -1.5, -1.0, -0.5, -1e-8, -0.0, 0.0, 1e-8, 0.5, 1.0,
                    1.5, 2.5, 3.5, 20.5, 88.0, 100.0, 1e4, 1e30, np.inf, np.nan])
RANDOM = np.random.default_rng(0).uniform(-6, 6, 1000)
VALUES = np.concatenate([SPECIAL, RANDOM])

# name: (ember function, torch function, extra relative tolerance for float32/float64 or None)
UNARY = {
    "neg": (lambda x: -x, torch.neg),
    "abs": (lambda x: x.abs(), torch.abs),
    "sign": (lambda x: x.sign(), torch.sign),
    "exp": (lambda x: x.exp(), torch.exp),
    "exp2": (lambda x: x.exp2(), torch.exp2),
    "expm1": (lambda x: x.expm1(), torch.expm1),
    "log": (lambda x: x.log(), torch.log),
    "log2": (lambda x: x.log2(), torch.log2),
    "log10": (lambda x: x.log10(), torch.log10),
    "log1p": (lambda x: x.log1p(), torch.log1p),
    "sqrt": (lambda x: x.sqrt(), torch.sqrt),
    "rsqrt": (lambda x: x.rsqrt(), torch.rsqrt),
    "reciprocal": (lambda x: x.reciprocal(), torch.reciprocal),
    "sin": (lambda x: x.sin(), torch.sin),
    "cos": (lambda x: x.cos(), torch.cos),
    "tan": (lambda x: x.tan(), torch.tan),
    "tanh": (lambda x: x.tanh(), torch.tanh),
    "sigmoid": (lambda x: x.sigmoid(), torch.sigmoid),
    "erf": (lambda x: x.erf(), torch.erf),
    "relu": (lambda x: x.relu(), torch.relu),
    "gelu": (lambda x: x.gelu(), F.gelu),
    "gelu_tanh": (lambda x: x.gelu(approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "silu": (lambda x: x.silu(), F.silu),
    "softplus": (lambda x: x.softplus(), F.softplus),
    "leaky_relu": (lambda x: x.leaky_relu(0.1), lambda x: F.leaky_relu(x, 0.1)),
    "elu": (lambda x: x.elu(), F.elu),
    "floor": (lambda x: x.floor(), torch.floor),
    "ceil": (lambda x: x.ceil(), torch.ceil),
    "round": (lambda x: x.round(), torch.round),
    "trunc": (lambda x: x.trunc(), torch.trunc),
    "frac": (lambda x: x.frac(), torch.frac),
    "square": (lambda x: x.square(), torch.square),
    "isnan": (lambda x: x.isnan(), torch.isnan),
    "isinf": (lambda x: x.isinf(), torch.isinf),
    "isfinite": (lambda x: x.isfinite(), torch.isfinite),
}
# float64 accuracy of the approximations built here (erf's Chebyshev fit of erfc is float32-accurate)
FLOAT64_RTOL = {"erf": 2e-7, "gelu": 2e-7, "tan": 1e-9, "cos": 1e-10, "tanh": 1e-11, "expm1": 1e-11}
# ulp-level differences of formulas vs torch's libm (relative), float32
FLOAT32_RTOL = {"tan": 1e-5, "expm1": 3e-6, "log1p": 3e-6, "erf": 3e-6, "gelu": 3e-6, "tanh": 3e-6, "silu": 3e-6,
                "softplus": 3e-6, "gelu_tanh": 3e-6, "elu": 3e-6, "log10": 3e-6, "cos": 3e-6}
HALF_OPS = ["neg", "abs", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "gelu", "silu", "floor", "round",
            "isnan"]


def _compare(name: str, values: np.ndarray, dtype: em.DType, device: str) -> None:
    ember_function, torch_function = UNARY[name]
    torch_input = torch.tensor(values, dtype=torch.float64).to(TORCH_DTYPES[dtype])
    ember_input = em.tensor(torch_input.float().numpy() if dtype is em.bfloat16 else torch_input.numpy(),
                            dtype=dtype, device=device)
    expected = torch_function(torch_input)
    atol, rtol = TOLERANCE[dtype]
    if dtype is em.float64:
        rtol = max(rtol, FLOAT64_RTOL.get(name, rtol))
    if dtype is em.float32:
        rtol = max(rtol, FLOAT32_RTOL.get(name, rtol))
    if name == "tan":  # cos is accurate to ~1e-7 absolute, so tan's relative error grows as 1e-7 / |cos x|
        with np.errstate(invalid="ignore"):
            keep = ~(np.abs(np.cos(torch_input.double().numpy())) < 1e-2)
        expected, ember_input = expected[torch.tensor(keep)], em.tensor(ember_input.numpy()[keep], dtype=dtype,
                                                                          device=device)
    assert_close(ember_function(ember_input), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_float32_and_float64(name: str, device: str) -> None:
    """Special values (inf, nan, -0.0, huge, tiny) and 1000 random values in [-6, 6]."""
    for dtype in (em.float32, em.float64):
        _compare(name, VALUES, dtype, device)


@pytest.mark.parametrize("name", HALF_OPS)
def test_unary_half_types(name: str, device: str) -> None:
    for dtype in (em.float16, em.bfloat16):
        _compare(name, VALUES, dtype, device)


def test_integer_and_bool_inputs_promote_or_keep_their_dtype_like_torch(device: str) -> None:
    integers = np.array([-7, -3, -1, 0, 1, 2, 5, 100], dtype=np.int32)
    for dtype in (em.int32, em.int64, em.uint8, em.int8, em.bool):
        data = integers.astype(dtype.numpy)
        if dtype is em.uint8:
            data = np.abs(integers).astype(np.uint8)
        if dtype is em.bool:
            data = integers > 0
        x, tx = em.tensor(data, device=device), torch.tensor(data)
        assert_close(x.exp(), tx.exp(), rtol=1.3e-6)  # -> float32
        assert_close(x.sqrt(), tx.sqrt())
        assert_close(x.sigmoid(), tx.sigmoid())
        assert_close(x.cos(), tx.cos(), rtol=3e-6)
        if dtype is not em.bool:
            assert_close(x.abs(), tx.abs())  # keeps the integer dtype
            assert_close(x.sign(), tx.sign())
            assert_close(x.relu(), tx.relu())
            assert_close(x.floor(), tx.floor())
            assert_close(x.round(), tx.round())
        else:
            assert_close(x.sign(), tx.sign())
    small = em.tensor([-7, 0, 5], dtype=em.int64, device=device)
    assert_close(small.relu6(), F.relu6(torch.tensor([-7, 0, 5])))


@pytest.mark.parametrize("name", ["gelu", "silu", "softplus", "elu", "leaky_relu", "frac", "selu", "celu", "mish",
                                  "hardsigmoid", "hardswish", "logsigmoid"])
def test_float_only_functions_raise_on_integers_like_torch(name: str) -> None:
    x = em.tensor([1, 2], device="c")
    with pytest.raises(em.DTypeError, match=f"{name}: needs a floating point tensor, got int64"):
        getattr(x, name)()
    with pytest.raises(NotImplementedError):
        getattr(F, name, getattr(torch, name, None))(torch.tensor([1, 2]))


def test_bool_inputs_raise_where_torch_raises() -> None:
    flags = em.tensor([True, False], device="c")
    for name in ("neg", "abs", "relu", "floor", "ceil", "round", "trunc"):
        with pytest.raises(em.DTypeError, match=f"{name}.*bool"):
            getattr(flags, name)()
    with pytest.raises(em.DTypeError, match="bool"):
        -flags
    with pytest.raises(em.DTypeError, match="hardtanh: bool"):
        flags.relu6()


def test_sin_cos_tan_for_large_arguments(device: str) -> None:
    """Arguments far beyond 2 pi keep float32/float64 accuracy (no cancellation in the reduction)."""
    values = np.array([1e3, 12345.678, 1e5, -3e6, 1e8, 1e15, 1e20, 3e38, 2.0**60, -1e30])
    for dtype, atol in ((em.float32, 2e-7), (em.float64, 1e-15)):
        data = values.astype(dtype.numpy)
        x, tx = em.tensor(data, device=device), torch.tensor(data)
        assert_close(x.sin(), tx.sin(), atol=atol, rtol=0)
        assert_close(x.cos(), tx.cos(), atol=atol * 2, rtol=0)
        assert_close(x.tan(), tx.tan(), atol=atol * 4, rtol=1e-5)


def test_exp_and_log_near_the_edges_of_the_range(device: str) -> None:
    edges32 = np.array([88.72, 88.7228, 88.73, 89.0, -87.3, -88.0, -100.0, -103.9, -104.0, -110.0, 1e-30, -1e-30,
                        0.6931472, 1e-6], dtype=np.float32)
    x, tx = em.tensor(edges32, device=device), torch.tensor(edges32)
    assert_close(x.exp(), tx.exp(), atol=0, rtol=2e-6)  # includes denormal results and overflow to inf
    edges64 = np.array([709.78, 709.79, -708.4, -745.0, -746.0, 1e-300, 3.0], dtype=np.float64)
    x64, tx64 = em.tensor(edges64, device=device), torch.tensor(edges64)
    assert_close(x64.exp(), tx64.exp(), atol=0, rtol=1e-13)
    logs = np.array([1e-45, 1.17549435e-38, 1e-30, 0.5, 1.0 - 2**-24, 1.0, 1.0 + 2**-23, 3.4e38, 0.0, -1.0],
                    dtype=np.float32)
    y, ty = em.tensor(logs, device=device), torch.tensor(logs)
    assert_close(y.log(), ty.log(), atol=0, rtol=2e-6)
    assert_close(y.log2(), ty.log2(), atol=0, rtol=2e-6)
    tiny = np.array([1e-10, -1e-10, 1e-5, -1e-5, 3e-8], dtype=np.float32)
    z, tz = em.tensor(tiny, device=device), torch.tensor(tiny)
    assert_close(z.expm1(), tz.expm1(), atol=0, rtol=2e-6)  # relative accuracy where exp(x) - 1 cancels
    assert_close(z.log1p(), tz.log1p(), atol=0, rtol=2e-6)


def _float64_truth(function, data: np.ndarray) -> torch.Tensor:
    """torch's result computed in float64 and rounded to float32: the reference for accuracy checks."""
    return function(torch.tensor(data, dtype=torch.float64)).float()


def test_tanh_and_sigmoid_saturate_without_overflow(device: str) -> None:
    data = np.array([-1e4, -200, -100, -90, -30, -20, -9, -1e-7, 1e-7, 9, 20, 30, 90, 100, 200, 1e4],
                    dtype=np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    for ember_function, torch_function in ((lambda t: t.tanh(), torch.tanh), (lambda t: t.sigmoid(), torch.sigmoid),
                                           (lambda t: t.softplus(), F.softplus), (lambda t: t.silu(), F.silu)):
        result = ember_function(x)
        assert_close(result, torch_function(tx))  # within torch's float32 tolerance of torch itself
        # and accurate: tiny tanh(1e-7) keeps its relative accuracy, sigmoid(-100) = 3.7e-44 is not flushed to 0
        assert_close(result, _float64_truth(torch_function, data), atol=1e-40, rtol=2e-6)  # denormals: abs


def test_erf_and_gelu_within_float32_tolerance(device: str) -> None:
    data = np.concatenate([np.linspace(-6, 6, 241), [1e-6, -1e-6, 0.4999, 0.5, 0.5001, 10, -10, 30]]).astype(
        np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close(x.erf(), tx.erf(), atol=1e-7, rtol=2e-6)
    assert_close(x.erfc(), torch.erfc(tx), atol=1e-30, rtol=2e-5)
    assert_close(x.gelu(), F.gelu(tx))
    # torch's float32 gelu loses digits in the negative tail (1 + erf cancels); ember's follows float64 there
    assert_close(x.gelu(), _float64_truth(F.gelu, data), atol=1e-20, rtol=3e-6)  # float64 gelu(-10) is 0 too
    assert_close(x.gelu("tanh"), F.gelu(tx, approximate="tanh"), atol=1e-6, rtol=3e-6)


def test_more_activations(device: str) -> None:
    data = np.concatenate([SPECIAL[1:-2], RANDOM[:50]]).astype(np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close(x.relu6(), F.relu6(tx))
    assert_close(x.hardtanh(-2, 3), F.hardtanh(tx, -2, 3))
    assert_close(x.hardsigmoid(), F.hardsigmoid(tx), rtol=3e-6)
    assert_close(x.hardswish(), F.hardswish(tx), rtol=3e-6)
    assert_close(x.selu(), F.selu(tx), rtol=3e-6)
    assert_close(x.celu(0.5), F.celu(tx, 0.5), rtol=3e-6)
    assert_close(x.mish(), F.mish(tx), rtol=1e-5)
    assert_close(x.softsign(), F.softsign(tx), rtol=3e-6)
    assert_close(x.logsigmoid(), F.logsigmoid(tx), rtol=3e-6)
    assert_close(x.softplus(beta=2, threshold=5), F.softplus(tx, beta=2, threshold=5), rtol=3e-6)
    assert_close(x.elu(alpha=0.5), F.elu(tx, alpha=0.5), rtol=3e-6)


def test_round_half_to_even_and_decimals(device: str) -> None:
    data = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 2.4999998, 8388607.5, 1e10, 0.125, 1.005, 2.675, 15.0,
                     25.0, 14.9], dtype=np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close(x.round(), tx.round(), atol=0, rtol=0)
    assert_close(x.round(decimals=2), tx.round(decimals=2), atol=1e-6, rtol=1e-6)
    assert_close(x.round(decimals=-1), tx.round(decimals=-1), atol=0, rtol=1e-7)


@pytest.mark.parametrize("size", [0, 1, 3, 17, 1000])
def test_sizes(size: int, device: str) -> None:
    data = np.random.default_rng(size).uniform(-3, 3, size).astype(np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close((x.exp() * x.sin() + x.tanh()).relu(), (tx.exp() * tx.sin() + tx.tanh()).relu(), rtol=3e-6)


def test_non_contiguous_inputs(device: str) -> None:
    data = np.random.default_rng(3).uniform(-3, 3, (6, 17)).astype(np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close(x.T.exp(), tx.T.exp(), rtol=2e-6)
    assert_close(x[1::2, ::3].gelu(), F.gelu(tx[1::2, ::3]), rtol=3e-6)
    assert_close(x[:, :1].expand(6, 5).sigmoid(), tx[:, :1].expand(6, 5).sigmoid(), rtol=2e-6)
    assert_close(x.flip(0)[2:, 5:9].cos(), tx.flip(0)[2:, 5:9].cos(), rtol=3e-6)
    assert math.isclose(float(x[0, 0].exp()), math.exp(float(data[0, 0])), rel_tol=2e-6)
