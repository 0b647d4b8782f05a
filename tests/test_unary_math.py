"""Math functions and activations against PyTorch: every float dtype, special values, accuracy at the edges."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember as em
from tests.helpers import TORCH_DTYPES, assert_close, assert_close_batch

# float32 within torch's own float32 tolerance; halves are computed in float32 and rounded once
TOLERANCE = {em.float32: (1e-5, 1.3e-6), em.float64: (1e-12, 1e-12), em.float16: (1e-5, 1e-3),
             em.bfloat16: (1e-5, 8e-3)}
SPECIAL = np.array([-np.inf, -1e30, -100.0, -20.5, -3.5, -2.5, -1.5, -1.0, -0.5, -1e-8, -0.0, 0.0, 1e-8, 0.5, 1.0,
                    1.5, 2.5, 3.5, 20.5, 88.0, 100.0, 1e4, 1e30, np.inf, np.nan])
RANDOM = np.random.default_rng(0).uniform(-6, 6, 1000)
VALUES = np.concatenate([SPECIAL, RANDOM])



def _gelu_truth(x: torch.Tensor) -> torch.Tensor:
    """gelu computed in float64 as 0.5 x erfc(-x / sqrt 2) and rounded to x's dtype: the reference for gelu. torch's
    own float32/float16 gelu is not one: its kernel depends on the CPU (oneDNN's on x86, where contiguous and strided
    inputs give different values) and on the torch version, and it loses digits below -4 where 1 + erf cancels
    (pytorch#187806)."""
    wide = x.double()
    return (0.5 * wide * torch.special.erfc(-wide / math.sqrt(2.0))).to(x.dtype)


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
    "gelu": (lambda x: x.gelu(), _gelu_truth),
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


def _cases(names: list[str], values: np.ndarray, dtype: em.DType, device: str) -> list[tuple]:
    """(label, ember result, torch result, atol, rtol) for each function on the values in dtype."""
    torch_input = torch.tensor(values, dtype=torch.float64).to(TORCH_DTYPES[dtype])
    ember_input = em.tensor(torch_input.float().numpy() if dtype is em.bfloat16 else torch_input.numpy(), dtype=dtype,
                            device=device)
    cases = []
    for name in names:
        ember_function, torch_function = UNARY[name]
        atol, rtol = TOLERANCE[dtype]
        if dtype is em.float64:
            rtol = max(rtol, FLOAT64_RTOL.get(name, rtol))
        if dtype is em.float32:
            rtol = max(rtol, FLOAT32_RTOL.get(name, rtol))
        operand, torch_operand = ember_input, torch_input
        if name == "tan":  # cos is accurate to ~1e-7 absolute, so tan's relative error grows as 1e-7 / |cos x|
            with np.errstate(invalid="ignore"):
                keep = ~(np.abs(np.cos(torch_input.double().numpy())) < 1e-2)
            torch_operand = torch_input[torch.tensor(keep)]
            operand = em.tensor(ember_input.numpy()[keep], dtype=dtype, device=device)
        cases.append((f"{name} {dtype.name}", ember_function(operand), torch_function(torch_operand), atol, rtol))
    return cases


@pytest.mark.parametrize("dtype", [em.float32, em.float64])
def test_unary_functions(dtype: em.DType, device: str) -> None:
    """Every function on special values (inf, nan, -0.0, huge, tiny) and 1000 random values in [-6, 6]."""
    assert_close_batch(_cases(list(UNARY), VALUES, dtype, device))


@pytest.mark.parametrize("dtype", [em.float16, em.bfloat16])
def test_unary_half_types(dtype: em.DType, device: str) -> None:
    assert_close_batch(_cases(HALF_OPS, VALUES, dtype, device))


def test_integer_and_bool_inputs_promote_or_keep_their_dtype_like_torch(device: str) -> None:
    integers = np.array([-7, -3, -1, 0, 1, 2, 5, 100])
    cases = []
    for dtype in (em.int32, em.uint8, em.bool):
        data = integers > 0 if dtype is em.bool else np.abs(integers).astype(np.uint8) if dtype is em.uint8 else (
            integers.astype(dtype.numpy))
        x, tx = em.tensor(data, device=device), torch.tensor(data)
        cases += [(f"exp {dtype.name}", x.exp(), tx.exp()), (f"sqrt {dtype.name}", x.sqrt(), tx.sqrt()),
                  (f"sigmoid {dtype.name}", x.sigmoid(), tx.sigmoid()), (f"cos {dtype.name}", x.cos(), tx.cos()),
                  (f"sign {dtype.name}", x.sign(), tx.sign())]  # floats for the first four
        if dtype is not em.bool:  # these keep the integer dtype
            cases += [(f"{name} {dtype.name}", getattr(x, name)(), getattr(tx, name)())
                      for name in ("abs", "relu", "floor", "round", "square")]
    small = em.tensor([-7, 0, 5], dtype=em.int64, device=device)
    cases.append(("relu6 int64", small.relu6(), F.relu6(torch.tensor([-7, 0, 5]))))
    assert_close_batch(cases, rtol=3e-6)


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
        _ = -flags
    with pytest.raises(em.DTypeError, match="hardtanh: bool"):
        flags.relu6()


def test_sin_cos_tan_for_large_arguments(device: str) -> None:
    """Arguments far beyond 2 pi keep float32/float64 accuracy (no cancellation in the reduction)."""
    values = np.array([1e3, 12345.678, 1e5, -3e6, 1e8, 1e15, 1e20, 3e38, 2.0**60, -1e30])
    cases = []
    for dtype, atol in ((em.float32, 2e-7), (em.float64, 1e-15)):
        data = values.astype(dtype.numpy)
        x, tx = em.tensor(data, device=device), torch.tensor(data)
        cases += [(f"sin {dtype.name}", x.sin(), tx.sin(), atol, 0),
                  (f"cos {dtype.name}", x.cos(), tx.cos(), 2 * atol, 0),
                  (f"tan {dtype.name}", x.tan(), tx.tan(), 4 * atol, 1e-5)]
    assert_close_batch(cases)


def test_exp_and_log_near_the_edges_of_the_range(device: str) -> None:
    edges32 = np.array([88.72, 88.7228, 88.73, 89.0, -87.3, -88.0, -100.0, -103.9, -104.0, -110.0, 1e-30, -1e-30,
                        0.6931472, 1e-6], dtype=np.float32)
    edges64 = np.array([709.78, 709.79, -708.4, -745.0, -746.0, 1e-300, 3.0], dtype=np.float64)
    logs = np.array([1e-45, 1.17549435e-38, 1e-30, 0.5, 1.0 - 2**-24, 1.0, 1.0 + 2**-23, 3.4e38, 0.0, -1.0],
                    dtype=np.float32)
    tiny = np.array([1e-10, -1e-10, 1e-5, -1e-5, 3e-8], dtype=np.float32)
    x, x64, y, z = (em.tensor(data, device=device) for data in (edges32, edges64, logs, tiny))
    tx, tx64, ty, tz = (torch.tensor(data) for data in (edges32, edges64, logs, tiny))
    assert_close_batch([
        ("exp float32", x.exp(), tx.exp(), 0, 2e-6),  # includes denormal results and overflow to inf
        ("exp float64", x64.exp(), tx64.exp(), 0, 1e-13),
        ("log", y.log(), ty.log(), 0, 2e-6),
        ("log2", y.log2(), ty.log2(), 0, 2e-6),
        ("expm1", z.expm1(), tz.expm1(), 0, 2e-6),  # relative accuracy where exp(x) - 1 cancels
        ("log1p", z.log1p(), tz.log1p(), 0, 2e-6),
    ])


def _float64_truth(function, data: np.ndarray) -> torch.Tensor:
    """torch's result computed in float64 and rounded to float32: the reference for accuracy checks."""
    return function(torch.tensor(data, dtype=torch.float64)).float()


def test_tanh_and_sigmoid_saturate_without_overflow(device: str) -> None:
    data = np.array([-1e4, -200, -100, -90, -30, -20, -9, -1e-7, 1e-7, 9, 20, 30, 90, 100, 200, 1e4],
                    dtype=np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    cases = []
    for name, torch_function in (("tanh", torch.tanh), ("sigmoid", torch.sigmoid), ("softplus", F.softplus),
                                 ("silu", F.silu)):
        result = getattr(x, name)()
        cases.append((name, result, torch_function(tx)))  # within torch's float32 tolerance of torch itself
        # and accurate: tiny tanh(1e-7) keeps its relative accuracy, sigmoid(-100) = 3.7e-44 is not flushed to 0
        cases.append((f"{name} vs float64", result, _float64_truth(torch_function, data), 1e-40, 2e-6))
    assert_close_batch(cases)


def test_erf_and_gelu_within_float32_tolerance(device: str) -> None:
    data = np.concatenate([np.linspace(-6, 6, 241), [1e-6, -1e-6, 0.4999, 0.5, 0.5001, 10, -10, 30]]).astype(
        np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close_batch([
        ("erf", x.erf(), tx.erf(), 1e-7, 2e-6),
        ("erfc", x.erfc(), torch.erfc(tx), 1e-30, 2e-5),
        ("gelu", x.gelu(), _gelu_truth(tx), 1e-38, 3e-6),  # relative accuracy in the negative tail too
        ("gelu vs float64", x.gelu(), _float64_truth(F.gelu, data), 1e-20, 3e-6),  # float64 gelu(-10) is 0 too
        ("gelu tanh", x.gelu("tanh"), F.gelu(tx, approximate="tanh"), 1e-6, 3e-6),
    ])


def test_more_activations(device: str) -> None:
    data = np.concatenate([SPECIAL[1:-2], RANDOM[:50]]).astype(np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close_batch([
        ("relu6", x.relu6(), F.relu6(tx)),
        ("hardtanh", x.hardtanh(-2, 3), F.hardtanh(tx, -2, 3)),
        ("hardsigmoid", x.hardsigmoid(), F.hardsigmoid(tx)),
        ("hardswish", x.hardswish(), F.hardswish(tx)),
        ("selu", x.selu(), F.selu(tx)),
        ("celu", x.celu(0.5), F.celu(tx, 0.5)),
        ("mish", x.mish(), F.mish(tx)),
        ("softsign", x.softsign(), F.softsign(tx)),
        ("logsigmoid", x.logsigmoid(), F.logsigmoid(tx)),
        ("softplus beta", x.softplus(beta=2, threshold=5), F.softplus(tx, beta=2, threshold=5)),
        ("elu alpha", x.elu(alpha=0.5), F.elu(tx, alpha=0.5)),
    ], rtol=1e-5)


def test_round_half_to_even_and_decimals(device: str) -> None:
    data = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 2.4999998, 8388607.5, 1e10, 0.125, 1.005, 2.675, 15.0,
                     25.0, 14.9], dtype=np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close_batch([("round", x.round(), tx.round(), 0, 0),
                        ("round 2", x.round(decimals=2), tx.round(decimals=2), 1e-6, 1e-6),
                        ("round -1", x.round(decimals=-1), tx.round(decimals=-1), 0, 1e-7)])


@pytest.mark.parametrize("size", [0, 1, 3, 17, 1000])
def test_sizes(size: int, device: str) -> None:
    data = np.random.default_rng(size).uniform(-3, 3, size).astype(np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close((x.exp() * x.sin() + x.tanh()).relu(), (tx.exp() * tx.sin() + tx.tanh()).relu(), rtol=3e-6)


def test_non_contiguous_inputs(device: str) -> None:
    data = np.random.default_rng(3).uniform(-3, 3, (6, 17)).astype(np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close_batch([
        ("transposed", x.T.exp(), tx.T.exp()),
        ("stepped", x[1::2, ::3].gelu(), _gelu_truth(tx[1::2, ::3])),
        ("expanded", x[:, :1].expand(6, 5).sigmoid(), tx[:, :1].expand(6, 5).sigmoid()),
        ("flipped", x.flip(0)[2:, 5:9].cos(), tx.flip(0)[2:, 5:9].cos()),
    ], rtol=3e-6)
    assert math.isclose(float(x[0, 0].exp()), math.exp(float(data[0, 0])), rel_tol=2e-6)


def test_kinks_keep_torch_values_at_signed_zeros_nan_and_infinities(device: str) -> None:
    """relu/abs/sign/clamp/hardtanh are selects now (for torch's gradients at kinks): the values, the sign of zero
    and NaN must still be torch's."""
    values = [-0.0, 0.0, -1.0, 2.5, math.nan, math.inf, -math.inf, 1.0, -1.5]
    x, tx = em.tensor(values, device=device), torch.tensor(values)
    functions = {
        "relu": (lambda v: v.relu(), torch.relu), "abs": (lambda v: v.abs(), torch.abs),
        "sign": (lambda v: v.sign(), torch.sign), "clamp": (lambda v: v.clamp(-1.0, 1.0),) * 2,
        # a NaN bound makes every value NaN (torch.clamp_min/clamp_max, two-bound clamp, numpy.clip); older torch
        # (2.11; fixed by pytorch#172200) returned the input from a one-sided clamp(min=nan), so clamp_min is the truth
        "clamp nan bound": (lambda v: v.clamp(min=math.nan), lambda v: torch.clamp_min(v, math.nan)),
        "clamp nan max": (lambda v: v.clamp(max=math.nan), lambda v: torch.clamp_max(v, math.nan)),
        "clamp nan, 1": (lambda v: v.clamp(math.nan, 1.0),) * 2,
        "clip 0, nan": (lambda v: v.clip(0.0, math.nan),) * 2,
        "hardtanh": (lambda v: v.hardtanh(-1.0, 1.0), lambda v: F.hardtanh(v, -1.0, 1.0)),
        "softplus": (lambda v: v.softplus(), F.softplus), "tanh": (lambda v: v.tanh(), torch.tanh),
        "sigmoid": (lambda v: v.sigmoid(), torch.sigmoid), "expm1": (lambda v: v.expm1(), torch.expm1),
    }
    results = {name: (mine(x), theirs(tx)) for name, (mine, theirs) in functions.items()}
    assert_close_batch([(name, mine, theirs) for name, (mine, theirs) in results.items()])
    for name, (mine, theirs) in results.items():
        zeros = theirs.numpy() == 0
        assert (np.signbit(mine.numpy())[zeros] == np.signbit(theirs.numpy())[zeros]).all(), name
    with pytest.raises(ValueError, match="min_val 2.0 cannot be greater than max_val 1.0"):
        x.hardtanh(2.0, 1.0)
