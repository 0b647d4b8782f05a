"""dtypes: names, torch's promotion rules (every pair, tensors vs 0-d tensors vs Python numbers), casts, bitcasts."""

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import EMBER_DTYPES, TORCH_DTYPES, assert_close

ALL = list(TORCH_DTYPES)
SHELL_UNSIGNED = (em.uint16, em.uint32, em.uint64)  # torch defines almost no promotion for these


def test_promote_types_equals_torch_on_every_pair_torch_defines() -> None:
    checked = 0
    for first in ALL:
        for second in ALL:
            try:
                expected = torch.promote_types(TORCH_DTYPES[first], TORCH_DTYPES[second])
            except RuntimeError:
                # torch leaves uint16/32/64 with other integer types undefined: ember follows numpy there and
                # raises only where no integer type holds both (uint64 with a signed type)
                assert first in SHELL_UNSIGNED or second in SHELL_UNSIGNED
                numpy_result = np.promote_types(first.numpy, second.numpy)
                if numpy_result.kind == "f":
                    with pytest.raises(em.DTypeError, match=f"{first.name}.*{second.name}"):
                        em.promote_types(first, second)
                else:
                    assert em.promote_types(first, second).numpy == numpy_result
                continue
            assert em.promote_types(first, second) is EMBER_DTYPES[expected], (first, second)
            checked += 1
    assert checked > 120


def _torch_operand(kind: str, dtype: em.DType):
    if kind == "tensor":
        return torch.zeros(2, dtype=TORCH_DTYPES[dtype])
    return torch.zeros((), dtype=TORCH_DTYPES[dtype])


def _ember_operand(kind: str, dtype: em.DType, device: str):
    if kind == "tensor":
        return em.zeros(2, dtype=dtype, device=device)
    return em.zeros((), dtype=dtype, device=device)


@pytest.mark.parametrize("kinds", [("tensor", "tensor"), ("tensor", "zero_dim"), ("zero_dim", "tensor"),
                                   ("zero_dim", "zero_dim")])
def test_result_type_of_tensors_and_zero_dim_tensors_matches_torch(kinds: tuple[str, str]) -> None:
    """Only the dtype is inferred (no kernel runs): a 0-d tensor counts like a number unless both are 0-d."""
    device = "c"
    promotable = [dtype for dtype in ALL if dtype not in SHELL_UNSIGNED]
    for first in promotable:
        for second in promotable:
            expected = (_torch_operand(kinds[0], first) * _torch_operand(kinds[1], second)).dtype
            actual = (_ember_operand(kinds[0], first, device) * _ember_operand(kinds[1], second, device)).dtype
            assert actual is EMBER_DTYPES[expected], (kinds, first, second, actual, expected)


@pytest.mark.parametrize("scalar", [True, 3, -2, 2.5])
def test_result_type_with_python_numbers_matches_torch(scalar: object) -> None:
    for dtype in ALL:
        if dtype in SHELL_UNSIGNED:
            continue
        for kind in ("tensor", "zero_dim"):
            torch_operand = _torch_operand(kind, dtype)
            ember_operand = _ember_operand(kind, dtype, "c")
            assert (ember_operand * scalar).dtype is EMBER_DTYPES[(torch_operand * scalar).dtype], (dtype, kind)
            assert (scalar * ember_operand).dtype is EMBER_DTYPES[(scalar * torch_operand).dtype], (dtype, kind)
            torch_where = torch.where(torch.zeros(2, dtype=torch.bool), torch_operand, scalar)
            ember_where = em.where(em.zeros(2, dtype=em.bool, device="c"), ember_operand, scalar)
            assert ember_where.dtype is EMBER_DTYPES[torch_where.dtype], (dtype, kind)


def test_defaults_and_names() -> None:
    assert em.tensor([1.5]).dtype is em.float32
    assert em.tensor([1]).dtype is em.int64
    assert em.tensor([True]).dtype is em.bool
    assert em.tensor(np.zeros(2, dtype=np.float64)).dtype is em.float64  # numpy data keeps its dtype (torch too)
    assert em.zeros(2).dtype is em.float32 and em.arange(3).dtype is em.int64
    for name, dtype in [("float32", em.float32), ("torch.float16", em.float16), ("bfloat16", em.bfloat16),
                        ("long", em.int64), ("half", em.float16), ("double", em.float64), ("bool", em.bool)]:
        assert em.zeros(1, dtype=name).dtype is dtype
    for dtype in ALL:
        assert em.zeros(1, dtype=TORCH_DTYPES[dtype]).dtype is dtype  # torch dtypes are accepted too
        assert em.zeros(1, dtype=dtype.name).dtype is dtype
    assert repr(em.float16) == "ember.float16"


def test_unknown_dtype_raises_naming_it_and_the_valid_ones() -> None:
    with pytest.raises(em.DTypeError, match="complex64.*valid dtypes are bool, uint8"):
        em.zeros(2, dtype="complex64")
    with pytest.raises(em.DTypeError, match="complex"):
        em.tensor(np.zeros(2, dtype=np.complex64))


def test_uint64_with_signed_raises_at_the_op_naming_both(device: str) -> None:
    with pytest.raises(em.DTypeError, match="uint64 and int32"):
        em.zeros(2, dtype=em.uint64, device=device) + em.zeros(2, dtype=em.int32, device=device)


CAST_SOURCE = np.array([-3.7, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 100.25, 127.0, 200.9], dtype=np.float64)


def test_casts_from_float_truncate_like_torch(device: str) -> None:
    for target in (em.int8, em.uint8, em.int32, em.int64, em.float16, em.bfloat16, em.float32, em.bool):
        data = CAST_SOURCE
        if target is em.int8:
            data = data[np.abs(data) < 128]  # out-of-range float -> int conversions are undefined (C and torch differ)
        if target is em.uint8:
            data = data[data > -1]
        source, torch_source = em.tensor(data, device=device), torch.tensor(data)
        assert_close(source.to(target), torch_source.to(TORCH_DTYPES[target]), atol=0, rtol=0)


def test_casts_between_integers_wrap_and_from_bool(device: str) -> None:
    data = np.array([-129, -128, -1, 0, 1, 127, 128, 255, 256, 70000], dtype=np.int64)
    source, torch_source = em.tensor(data, device=device), torch.tensor(data)
    for target in (em.int8, em.uint8, em.int16, em.int32, em.float32, em.bool):
        assert_close(source.to(target), torch_source.to(TORCH_DTYPES[target]))
    flags, torch_flags = em.tensor([True, False, True], device=device), torch.tensor([True, False, True])
    for target in (em.uint8, em.int32, em.int64, em.float16, em.bfloat16, em.float64):
        assert_close(flags.to(target), torch_flags.to(TORCH_DTYPES[target]))


def test_half_types_round_to_nearest_even_like_torch(device: str) -> None:
    data = np.array([1.0 + 2.0**-9, 1.0 + 3 * 2.0**-9, 65504.0, 65520.0, 1e-8, 3.0e38, -0.0, np.inf, np.nan],
                    dtype=np.float32)
    source, torch_source = em.tensor(data, device=device), torch.tensor(data)
    for target in (em.float16, em.bfloat16):
        assert_close(source.to(target), torch_source.to(TORCH_DTYPES[target]), atol=0, rtol=0)
        assert_close(em.tensor(data, dtype=target, device=device), torch.tensor(data, dtype=TORCH_DTYPES[target]),
                     atol=0, rtol=0)


def test_bitcast_reinterprets_bits(device: str) -> None:
    data = np.array([1.0, -2.5, np.inf], dtype=np.float32)
    source = em.tensor(data, device=device)
    np.testing.assert_array_equal(source.bitcast(em.int32).numpy(), data.view(np.int32))
    np.testing.assert_array_equal(source.view(em.uint32).numpy(), data.view(np.uint32))
    with pytest.raises(em.DTypeError, match="float32 \\(4 bytes\\) and int16 \\(2 bytes\\)"):
        source.bitcast(em.int16)
