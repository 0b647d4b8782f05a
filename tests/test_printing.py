"""repr of tensors against torch's: number styles, widths, nesting, line wrapping, summaries, suffixes."""

import re

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import TORCH_DTYPES

CASES = {
    "floats": [1.5, -2.0, 3.25],
    "whole floats": [1.0, 2.0, -30.0],
    "scientific small": [1e-5, 1.0, 2.0],
    "scientific spread": [1.0, 2000.0],
    "scientific large": [1e9, 1.5],
    "whole spread": [1.0, 1e5],
    "special": [np.nan, np.inf, -np.inf, 1.5, 0.0],
    "special whole": [np.nan, np.inf, 2.0],
    "only special": [np.nan, np.inf],
    "zeros": [0.0, 0.0],
    "negative zero": [-0.0, 1.0],
    "matrix": [[1.5, 2.25, -3.0], [4.0, 5.5, 6.125]],
    "cube": np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7,
    "long row": np.linspace(-1, 1, 40, dtype=np.float32),
    "wide rows": np.arange(60, dtype=np.float32).reshape(3, 20) * 1.5,
    "summarized vector": np.arange(2000, dtype=np.float32) / 3,
    "summarized matrix": np.arange(10_000, dtype=np.float32).reshape(100, 100),
    "summarized cube": np.arange(3000, dtype=np.float32).reshape(10, 10, 30) - 1500,
    "integers": [1, -20, 300],
    "integer matrix": [[1, 2], [30, -4]],
    "summarized integers": np.arange(1500),
    "bools": [True, False, True],
    "bool matrix": [[True], [False]],
    "empty": np.zeros((0,), dtype=np.float32),
    "empty matrix": np.zeros((0, 3), dtype=np.float32),
    "empty integers": np.zeros((0,), dtype=np.int64),
    "empty bools": np.zeros((2, 0), dtype=bool),
    "scalar": 2.5,
    "whole scalar": 3.0,
    "integer scalar": 7,
    "bool scalar": True,
    "nan scalar": float("nan"),
}


# a printed number: fixed, scientific or whole, or nan/inf (not the digits inside a name such as float16)
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf)(?![\w])")


def _torch_style(text: str) -> str:
    return text.replace("ember.", "torch.")


def assert_prints_like_torch(tensor: em.Tensor, torch_tensor: torch.Tensor) -> None:
    """ember's repr has the structure of the installed torch's (nesting, commas, '...' summaries, suffixes) and the
    same numbers to the printed precision. Spacing and line breaks are left out of the comparison: they are a
    matter of style that torch versions change (the repr test passed character for character on one version and
    failed on another); the numbers and the structure are what a reader relies on."""
    text, expected = _torch_style(repr(tensor)), repr(torch_tensor)
    assert re.sub(r"\s+", "", NUMBER.sub("#", text)) == re.sub(r"\s+", "", NUMBER.sub("#", expected)), (text, expected)
    numbers, expected_numbers = (np.array([float(token) for token in NUMBER.findall(printed)])
                                 for printed in (text, expected))
    # two prints of one value differ by at most half their last digit: 4 decimals, or 5 significant digits
    with np.errstate(invalid="ignore"):  # inf - inf
        close = np.abs(numbers - expected_numbers) <= 5e-5 + 5e-5 * np.abs(expected_numbers)
    assert (close | (numbers == expected_numbers) | (np.isnan(numbers) & np.isnan(expected_numbers))).all(), (
        text, expected)


@pytest.mark.parametrize("name", list(CASES))
def test_repr_matches_torch(name: str) -> None:
    data = CASES[name]
    array = np.asarray(data)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    assert_prints_like_torch(em.tensor(array, device="c"), torch.tensor(array))


def test_repr_comparison_can_fail() -> None:
    """The structure-and-numbers comparison still sees a wrong value, a missing element and a missing suffix."""
    with pytest.raises(AssertionError):
        assert_prints_like_torch(em.tensor([1.5, 2.0], device="c"), torch.tensor([1.5, 2.001]))
    with pytest.raises(AssertionError):
        assert_prints_like_torch(em.tensor([1.5, 2.0], device="c"), torch.tensor([1.5, 2.0, 3.0]))
    with pytest.raises(AssertionError):
        assert_prints_like_torch(em.tensor([1, 2], dtype=em.int32, device="c"), torch.tensor([1, 2]))


@pytest.mark.parametrize("dtype", [em.float16, em.bfloat16, em.float64, em.int8, em.int32, em.uint8, em.int16])
def test_non_default_dtypes_are_named(dtype: em.DType) -> None:
    values = np.array([[1.5, -2.0, 3.0], [0.0, 4.0, 7.0]]) if dtype.is_float else np.array([[1, 2, 3], [4, 5, 6]])
    if dtype is em.uint8:
        values = np.abs(values)
    ember_tensor = em.tensor(values, dtype=dtype, device="c")
    torch_tensor = torch.tensor(values).to(TORCH_DTYPES[dtype])
    assert_prints_like_torch(ember_tensor, torch_tensor)
    assert_prints_like_torch(em.zeros(0, dtype=dtype, device="c"), torch.zeros(0, dtype=TORCH_DTYPES[dtype]))


def test_computed_tensors_print_their_values(device: str) -> None:
    x = em.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    torch_x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    text = repr((x @ x.T + 1).relu().softmax(dim=-1))
    body = text.split(", device=")[0] + (")" if ", device=" in text else "")
    assert body == repr((torch_x @ torch_x.T + 1).relu().softmax(dim=-1))


def test_device_suffix_only_off_the_default_device() -> None:
    default = em.get_default_device()
    assert "device=" not in repr(em.tensor([1.0], device=default))
    other = "dummy" if not default.startswith("dummy") else "c"
    text = repr(em.tensor([1.0, 2.0], device=other))
    assert text.endswith(f"device='{em.tensor([1.0], device=other).device}')"), text


def test_gradient_suffixes() -> None:
    leaf = em.tensor([1.0, 2.0], requires_grad=True)
    torch_leaf = torch.tensor([1.0, 2.0], requires_grad=True)
    assert repr(leaf) == repr(torch_leaf)
    assert "grad_fn=<" in repr(leaf * 2)
