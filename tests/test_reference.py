"""The numpy reference tensor: an entry per primitive op, ember's semantics per primitive, the Tensor API vs PyTorch."""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.core.ops import EXPANDED_OPS, Op
from ember.testing import reference
from ember.testing.reference import PRIMITIVES, ReferenceTensor, perturbation
from tests.helpers import TORCH_DTYPES, random_array

R = ReferenceTensor


def primitive(op: Op, *sources: ReferenceTensor, arg: Any = None) -> np.ndarray:
    return sources[0]._apply(op, *sources[1:], arg=arg).numpy()


def test_every_primitive_op_has_an_entry() -> None:
    primitive = set(Op) - EXPANDED_OPS  # (TEMPLATE stands for primitives: the scheduler expands it)
    assert set(PRIMITIVES) == primitive, f"missing: {primitive - set(PRIMITIVES)}"


def test_reference_is_independent_of_the_kernel_path(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = ast.parse(Path(reference.__file__).read_text())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    forbidden = [name for name in imported if name.split(".")[:2] in (["ember", "scheduler"], ["ember", "ir"],
                                                                       ["ember", "backends"])]
    assert not forbidden, forbidden

    from ember.core import runtime

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("the reference tensor reached the kernel path")

    for name in ("realize", "read", "device_of"):
        monkeypatch.setattr(runtime.RUNTIME, name, refuse)
    x = R(random_array((3, 4)))
    result = ((x @ x.T).softmax(-1).cumsum(0)[::2].pad((1, -1)).argmax(1) + x.sum().long()).numpy()
    assert result.shape == (2,)


# ---- primitive semantics (expected values worked out by hand) ---------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integer_division_truncates_and_division_by_zero_gives_zero(dtype: type) -> None:
    low = int(np.iinfo(dtype).min)
    a = R(np.array([7, -7, 7, -7, 5, 0, low, low, 3], dtype=dtype))
    b = R(np.array([2, 2, -2, -2, 0, 0, -1, 1, -1], dtype=dtype))
    assert primitive(Op.IDIV, a, b).tolist() == [3, -3, -3, 3, 0, 0, low, low, -3]
    assert primitive(Op.MOD, a, b).tolist() == [1, -1, 1, -1, 0, 0, 0, 0, 0]


def test_unsigned_division_and_shifts() -> None:
    a = R(np.array([200, 7, 255], dtype=np.uint8))
    b = R(np.array([7, 0, 16], dtype=np.uint8))
    assert primitive(Op.IDIV, a, b).tolist() == [28, 0, 15]
    assert primitive(Op.MOD, a, b).tolist() == [4, 0, 15]
    one = R(np.array([1, 1, 1], dtype=np.uint8))
    assert primitive(Op.SHR, a, one).tolist() == [100, 3, 127]  # logical for unsigned
    signed = R(np.array([-8, 7, -1], dtype=np.int8))
    assert primitive(Op.SHR, signed, R(np.array([1, 1, 1], dtype=np.int8))).tolist() == [-4, 3, -1]  # arithmetic
    assert primitive(Op.SHL, signed, R(np.array([4, 5, 0], dtype=np.int8))).tolist() == [-128, -32, -1]  # wraps


def test_max_propagates_nan_and_where_never_leaks() -> None:
    a = R(np.array([1.0, math.nan, 2.0, -math.inf], dtype=np.float32))
    b = R(np.array([math.nan, 3.0, 1.0, -5.0], dtype=np.float32))
    result = primitive(Op.MAX, a, b)
    assert np.isnan(result[:2]).all() and result[2:].tolist() == [2.0, -5.0]
    condition = R(np.array([True, False, True, False]))
    chosen = primitive(Op.WHERE, condition, R(np.array([1.0, math.nan, 3.0, math.nan], dtype=np.float32)), b)
    assert chosen.tolist() == [1.0, 3.0, 3.0, -5.0]  # the NaNs in the branches not taken do not leak
    assert np.isnan(primitive(Op.REDUCE_MAX, a, arg=(0,))).all()


def test_casts_truncate_and_bool_arithmetic_is_logical() -> None:
    x = R(np.array([2.9, -2.9, 0.5, -0.0, 300.0], dtype=np.float32))
    assert primitive(Op.CAST, x, arg=em.int32).tolist() == [2, -2, 0, 0, 300]
    assert primitive(Op.CAST, x, arg=em.bool).tolist() == [True, True, True, False, True]
    flags = R(np.array([True, False, True]))
    assert primitive(Op.CAST, flags, arg=em.float32).tolist() == [1.0, 0.0, 1.0]
    other = R(np.array([True, False, False]))
    assert primitive(Op.ADD, flags, other).tolist() == [True, False, True]  # True + True is True, as in torch
    assert primitive(Op.MUL, flags, other).tolist() == [True, False, False]
    assert primitive(Op.NOT, flags).tolist() == [False, True, False]
    assert primitive(Op.NOT, R(np.array([0, 5], dtype=np.int16))).tolist() == [-1, -6]
    assert R._full((2,), -1, em.uint8, "reference").numpy().tolist() == [255, 255]  # constants wrap like C


def test_half_types_round_when_stored() -> None:
    # 1 + 2**-9 is not a bfloat16 (8 bits of mantissa); ties go to even: 1 + 2**-8 + 2**-9 rounds up
    values = np.array([1 + 2**-9, 1 + 2**-8 + 2**-9, 3.0, math.nan], dtype=np.float32)
    held = R(values, dtype=em.bfloat16).numpy()
    assert held[:3].tolist() == [1.0, 1 + 2**-7, 3.0] and np.isnan(held[3])
    half = R(np.array([1.0], dtype=np.float16))
    third = primitive(Op.DIV, half, R(np.array([3.0], dtype=np.float16)))
    assert third.dtype == np.float16 and third[0] == np.float16(1 / 3)
    summed = primitive(Op.SUM, R(np.full(4096, 1.0, dtype=np.float16)), arg=(0,))
    assert summed.tolist() == [4096.0]  # accumulated in float32 (float16 alone would stop at 2048)
    bits = primitive(Op.BITCAST, R(np.array([1.0, -2.0], dtype=np.float32)), arg=em.int32)
    assert bits.tolist() == [0x3F800000, -0x40000000]
    assert primitive(Op.BITCAST, R(np.array([0x3F80], dtype=np.uint16)), arg=em.bfloat16).tolist() == [1.0]
    assert primitive(Op.BITCAST, R(np.array([1.0], dtype=np.float32), dtype=em.bfloat16), arg=em.int16).tolist() == [
        0x3F80
    ]


def test_half_types_can_stay_unrounded_between_ops() -> None:
    third = R(np.array([1.0], dtype=np.float32), dtype=em.bfloat16) / 3
    assert third.numpy().tolist() == [0.333984375]  # rounded to bfloat16
    with reference.halves_unrounded():
        unrounded = R(np.array([1.0], dtype=np.float32), dtype=em.bfloat16) / 3
        inputs_still_round = R(np.array([1 + 2**-9], dtype=np.float32), dtype=em.bfloat16)
    assert unrounded.numpy().tolist() == [np.float32(1 / 3)] and inputs_still_round.numpy().tolist() == [1.0]


def test_reductions_keep_axes_and_have_identities() -> None:
    empty = R(np.zeros((2, 0, 3), dtype=np.float32))
    assert primitive(Op.SUM, empty, arg=(1,)).tolist() == [[[0.0] * 3]] * 2
    assert primitive(Op.PROD, empty, arg=(1,)).tolist() == [[[1.0] * 3]] * 2
    assert primitive(Op.REDUCE_MAX, empty, arg=(1,)).tolist() == [[[-math.inf] * 3]] * 2
    wraps = R(np.array([100, 100], dtype=np.int8))
    assert primitive(Op.SUM, wraps, arg=(0,)).tolist() == [-56]
    x = R(np.arange(24, dtype=np.int32).reshape(2, 3, 4))
    assert primitive(Op.SUM, x, arg=(0, 2)).tolist() == [[[60], [92], [124]]]


def test_long_and_many_axis_reductions_through_the_tensor_api_match_torch() -> None:
    """Reduces of 512 elements or more per output (that ember stages, or asks its device about) went through core's
    staging with the reference's tensors, which have no graph node: the fuzzer's oracle raised instead of answering
    (fuzz seed 4309: a sum over four axes of a tensor with a zero dim)."""
    values = random_array((3, 7, 2, 5, 5))
    assert_reference_close(R(values).sum((0, 1, 3, 4)), torch.tensor(values).sum((0, 1, 3, 4)))
    empty = np.zeros((3, 7, 0, 5, 5), dtype=np.float32)
    assert R(empty).sum((0, 1, 3, 4), keepdim=False).numpy().shape == (0,)
    long = random_array((3, 200_000))
    assert_reference_close(R(long).sum(1), torch.tensor(long, dtype=torch.float64).sum(1).float())
    assert_reference_close(R(long).amax(1), torch.tensor(long).amax(1))
    assert_reference_close(R(long).mean(), torch.tensor(long, dtype=torch.float64).mean().float())


def assert_reference_close(actual: ReferenceTensor, expected: torch.Tensor) -> None:
    np.testing.assert_allclose(actual.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


def test_movement_primitives() -> None:
    x = R(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert primitive(Op.PAD, x, arg=(((1, 0), (0, 2)), 9)).tolist() == [[9, 9, 9, 9, 9], [0, 1, 2, 9, 9],
                                                                         [3, 4, 5, 9, 9]]
    assert primitive(Op.SHRINK, x, arg=((1, 2), (0, 2))).tolist() == [[3, 4]]
    assert primitive(Op.FLIP, x, arg=(1,)).tolist() == [[2, 1, 0], [5, 4, 3]]
    assert primitive(Op.PERMUTE, x, arg=(1, 0)).tolist() == [[0, 3], [1, 4], [2, 5]]
    assert primitive(Op.EXPAND, R(np.array([[1], [2]], dtype=np.int32)), arg=(2, 2)).tolist() == [[1, 1], [2, 2]]
    assert primitive(Op.RESHAPE, x, arg=(3, 2)).tolist() == [[0, 1], [2, 3], [4, 5]]


def test_perturbation_moves_floats_by_a_few_ulps_and_leaves_integers_alone() -> None:
    data = random_array((64,))
    x, i = R(data), R(np.arange(64, dtype=np.int32))
    exact = (x.exp() * 3).numpy()
    with perturbation(4.0, seed=1):
        noisy = (x.exp() * 3).numpy()
        integers = (i * 3 + 1).numpy()
    assert not np.array_equal(exact, noisy)
    np.testing.assert_allclose(noisy, exact, rtol=64 * 2.0**-24)  # a few ops, a few ulps each
    assert integers.tolist() == (np.arange(64) * 3 + 1).tolist()


# ---- the Tensor API on the reference vs PyTorch -------------------------------------------------------------------

CASES: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("add broadcast", lambda x, y: x + y[0]),
    ("sub scalar", lambda x, y: 2.5 - x),
    ("mul div", lambda x, y: x * y / (y.abs() + 1)),
    ("floor_divide floats", lambda x, y: x // 0.75),
    ("remainder floats", lambda x, y: x % 0.7),
    ("pow", lambda x, y: x.abs() ** y),
    ("exp log sqrt", lambda x, y: (x.exp() + 1).log() + x.abs().sqrt()),
    ("trig", lambda x, y: x.sin() + x.cos() * x.tanh()),
    ("activations", lambda x, y: x.sigmoid() + x.relu() + x.tanh() * x.sin()),
    ("rounding", lambda x, y: (x * 3).round() + (x * 3).floor() - (x * 3).ceil() + (x * 3).trunc()),
    ("comparisons", lambda x, y: (x < y).logical_and(x >= 0).logical_or(x == y)),
    ("maximum minimum clamp", lambda x, y: x.maximum(y) + x.minimum(y) + x.clamp(-0.5, 0.5)),
    ("where", lambda x, y: DTYPE["where"](x > 0, x, y)),
    ("sum dims", lambda x, y: x.sum((0, 2), keepdim=True)),
    ("mean var std", lambda x, y: x.mean(1) + x.var(0).sum() + x.std(2, keepdim=True).sum()),
    ("amax amin", lambda x, y: x.amax(1) - x.amin((0, 2)).sum()),
    ("argmax argmin", lambda x, y: x.argmax(2) * 10 + x.argmin(0).sum()),
    ("prod", lambda x, y: (x * 0.5 + 1).prod(1)),
    ("logsumexp", lambda x, y: x.logsumexp(1)),
    ("cumsum", lambda x, y: x.cumsum(1)),
    ("softmax", lambda x, y: x.softmax(-1) + x.log_softmax(0)),
    ("reshape permute", lambda x, y: x.reshape(4, 3, 2).permute(2, 0, 1) * 2),
    ("indexing", lambda x, y: x[1:, ::2, None, -1] + 1),
    ("flip transpose", lambda x, y: x.flip(0, 2).transpose(0, 1) + 0),
    ("expand", lambda x, y: y[:, :1].expand(2, 3, 4) + 0),
    ("matmul", lambda x, y: x @ y.transpose(1, 2)),
    ("casts", lambda x, y: (x * 4).to(DTYPE["int32"]).to(DTYPE["float32"]) + x.to(DTYPE["float16"]).float()),
    ("any all", lambda x, y: (x > 0).any(1).logical_and((y < 1).all(2).any())),
]


class _Either:
    """Names (dtypes, where) that resolve to torch's or ember's, depending on which side is running."""

    side = "torch"

    def __getitem__(self, name: str) -> Any:
        return getattr(torch, name) if self.side == "torch" else getattr(em, name)


DTYPE = _Either()


@pytest.mark.parametrize("name,function", CASES, ids=[name for name, _ in CASES])
def test_tensor_api_on_the_reference_matches_torch(name: str, function: Callable[[Any, Any], Any]) -> None:
    x_data, y_data = random_array((2, 3, 4), seed=1), random_array((2, 3, 4), seed=2)
    DTYPE.side = "torch"
    expected = function(torch.tensor(x_data), torch.tensor(y_data))
    DTYPE.side = "ember"
    actual = function(R(x_data), R(y_data))
    assert actual.shape == tuple(expected.shape)
    assert TORCH_DTYPES[actual.dtype] == expected.dtype, (actual.dtype, expected.dtype)
    np.testing.assert_allclose(actual.numpy().astype(np.float64), expected.numpy().astype(np.float64), rtol=1e-5,
                               atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_integer_api_on_the_reference_matches_torch(dtype: type) -> None:
    a_data = random_array((3, 5), dtype=dtype, seed=3)
    b_data = random_array((3, 5), dtype=dtype, seed=4)
    b_data[b_data == 0] = 3  # torch raises on integer division by zero
    a, b, ta, tb = R(a_data), R(b_data), torch.tensor(a_data), torch.tensor(b_data)
    pairs = [
        (a // b, ta // tb), (a % b, ta % tb), (a * b - a, ta * tb - ta), (a & b | (a ^ b), ta & tb | (ta ^ tb)),
        (a.maximum(b), ta.maximum(tb)), (a.sum(1), ta.sum(1)), (a.amax(0), ta.amax(0)), (a.cumsum(1), ta.cumsum(1)),
        (a < b, ta < tb), (a.div(b, rounding_mode="trunc"), ta.div(tb, rounding_mode="trunc")), (a.abs(), ta.abs()),
    ]
    for actual, expected in pairs:
        assert TORCH_DTYPES[actual.dtype] == expected.dtype
        np.testing.assert_array_equal(actual.numpy(), expected.numpy())


def test_construction_from_data_follows_torch_dtype_inference() -> None:
    assert R([1.0, 2.0]).dtype == em.float32
    assert R([1, 2]).dtype == em.int64
    assert R([True]).dtype == em.bool
    assert R(np.zeros(2, dtype=np.float64)).dtype == em.float64
    assert R(3.5).shape == () and R([[1, 2]], dtype=em.float16).numpy().dtype == np.float16
    x = R(np.arange(4, dtype=np.float32))
    x += 1
    assert x.tolist() == [1.0, 2.0, 3.0, 4.0] and x.device == "reference"
