"""index_add, index_copy, index_fill, put, masked_scatter (and the in-place forms) and bincount against torch:
values, dtypes, errors and gradients, including empty tensors, negative dims and indices, and integer dtypes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember as em
from tests.gradcheck import Case, check_gradients
from tests.helpers import BatchedChecks, pair, random_array


def index_pair(values: list[int], device: str, dtype: type = np.int64) -> tuple[em.Tensor, torch.Tensor]:
    return pair(np.array(values, dtype=dtype).reshape(np.shape(values)), device)


def test_index_add_copy_fill(device: str) -> None:
    check = BatchedChecks(atol=1e-6, rtol=1e-6)
    x, tx = pair(random_array((4, 3, 2)), device)
    index, torch_index = index_pair([2, 0, 2], device)  # a repeated index accumulates
    source, torch_source = pair(random_array((4, 3, 2), seed=1), device)
    middle, torch_middle = pair(random_array((4, 3, 2), seed=2)[:, [0, 1, 2]], device)
    check(x.index_add(0, index, source[:3]), tx.index_add(0, torch_index, torch_source[:3]), "index_add dim 0")
    check(x.index_add(-2, index, middle, alpha=-1.5), tx.index_add(-2, torch_index, torch_middle, alpha=-1.5),
          "index_add negative dim, alpha")
    index32, torch_index32 = index_pair([1, 0], device, np.int32)
    check(x.index_add(2, index32, source[..., :2]), tx.index_add(2, torch_index32, torch_source[..., :2]), "int32")
    distinct, torch_distinct = index_pair([3, 0, 1], device)
    check(x.index_copy(0, distinct, source[:3]), tx.index_copy(0, torch_distinct, torch_source[:3]), "index_copy")
    check(x.index_copy(1, distinct[1:], source[:, :2]), tx.index_copy(1, torch_distinct[1:], torch_source[:, :2]))
    negative, torch_negative = index_pair([-1, 1], device)
    check(x.index_fill(1, negative, 7.5), tx.index_fill(1, torch_negative, 7.5), "index_fill wraps negatives")
    check(x.index_fill(-1, distinct[1:2], em.tensor(-2.0, device=device)),
          tx.index_fill(-1, torch_distinct[1:2], torch.tensor(-2.0)), "index_fill 0-d tensor value")
    integers, torch_integers = pair(random_array((5, 2), np.int32), device)
    small, torch_small = pair(random_array((3, 2), np.int32, seed=3), device)
    check(integers.index_add(0, index, small, alpha=3), torch_integers.index_add(0, torch_index, torch_small, alpha=3))
    check(integers.index_copy(0, distinct, small), torch_integers.index_copy(0, torch_distinct, torch_small))
    check(integers.index_fill(0, distinct, 1.7), torch_integers.index_fill(0, torch_distinct, 1.7), "truncated")
    flags, torch_flags = pair(random_array((4,), np.bool_), device)
    check(flags.index_add(0, index, flags[:3]), torch_flags.index_add(0, torch_index, torch_flags[:3]), "bool: or")
    scalar, torch_scalar = pair(np.array(1.5, dtype=np.float32), device)
    zero_index, torch_zero_index = index_pair(0, device)
    check(scalar.index_add(0, zero_index, em.tensor(2.0, device=device)),
          torch_scalar.index_add(0, torch_zero_index, torch.tensor(2.0)), "0-d")
    check(scalar.index_fill(0, zero_index, 3.0), torch_scalar.index_fill(0, torch_zero_index, 3.0))
    empty_index, torch_empty_index = index_pair([], device)
    check(x.index_add(1, empty_index, source[:, :0]), tx.index_add(1, torch_empty_index, torch_source[:, :0]))
    check(x.index_fill(1, empty_index, 1.0), tx.index_fill(1, torch_empty_index, 1.0))
    check(em.zeros(0, 3, device=device).index_add(1, index[:2].clamp(max=1), em.zeros(0, 2, device=device)),
          torch.zeros(0, 3).index_add(1, torch_index[:2].clamp(max=1), torch.zeros(0, 2)))
    check.verify()


def test_in_place_forms(device: str) -> None:
    x, tx = pair(random_array((4, 3)), device)
    index, torch_index = index_pair([1, 3], device)
    source, torch_source = pair(random_array((2, 3), seed=1), device)
    results = [x.clone().index_add_(0, index, source), x.clone().index_copy_(0, index, source),
               x.clone().index_fill_(1, index[:1], -1.0), x.clone().put_(index, source[0, :2], accumulate=True)]
    expected = [tx.clone().index_add_(0, torch_index, torch_source),
                tx.clone().index_copy_(0, torch_index, torch_source), tx.clone().index_fill_(1, torch_index[:1], -1.0),
                tx.clone().put_(torch_index, torch_source[0, :2], accumulate=True)]
    mask, torch_mask = pair(random_array((3,), np.bool_, seed=2), device)
    results.append(x.clone().masked_scatter_(mask, x.flip(0)))
    expected.append(tx.clone().masked_scatter_(torch_mask, tx.flip(0)))
    check = BatchedChecks()
    check(results, expected)
    check.verify()
    y = x.clone()
    assert y.index_add_(0, index, source) is y


def test_put_and_masked_scatter(device: str) -> None:
    check = BatchedChecks()
    x, tx = pair(random_array((3, 4)), device)
    index, torch_index = index_pair([[0, -1], [5, 5]], device)  # negative from the end; repeats
    source, torch_source = pair(random_array((2, 2), seed=1), device)
    check(x.put(index, source), tx.put(torch_index, torch_source), "put")
    check(x.put(index, source, accumulate=True), tx.put(torch_index, torch_source, accumulate=True), "accumulate")
    integers, torch_integers = pair(random_array((2, 3), np.int64), device)
    check(integers.put(index[0], integers[0, :2]), torch_integers.put(torch_index[0], torch_integers[0, :2]))
    check(em.zeros(0, device=device).put(index[:0].reshape(-1), em.zeros(0, device=device)),
          torch.zeros(0).put(torch_index[:0].reshape(-1), torch.zeros(0)))
    mask, torch_mask = pair(random_array((3, 4), np.bool_, seed=2), device)
    values, torch_values = pair(random_array((3, 4), seed=3), device)
    check(x.masked_scatter(mask, values), tx.masked_scatter(torch_mask, torch_values), "masked_scatter")
    row, torch_row = pair(np.array([True, False, True, False]), device)
    check(x.masked_scatter(row, values), tx.masked_scatter(torch_row, torch_values), "broadcast mask")
    wide, torch_wide = pair(random_array((2, 3, 4), np.bool_, seed=4), device)
    many, torch_many = pair(random_array((30,), seed=5), device)
    check(x.masked_scatter(wide, many), tx.masked_scatter(torch_wide, torch_many), "broadcast self, 1-d source")
    check(integers.masked_scatter(mask[:2, :3], integers.flip(1)),
          torch_integers.masked_scatter(torch_mask[:2, :3], torch_integers.flip(1)))
    nothing = em.zeros(0, 2, device=device)
    check(nothing.masked_scatter(nothing.bool(), em.zeros(0, device=device)),
          torch.zeros(0, 2).masked_scatter(torch.zeros(0, 2).bool(), torch.zeros(0)))
    check.verify()


def test_bincount(device: str) -> None:
    check = BatchedChecks(atol=1e-6, rtol=1e-6)
    values, torch_values = pair(np.array([1, 3, 3, 0, 7, 3]), device)
    weights, torch_weights = pair(random_array((6,), seed=1), device)
    check(values.bincount(), torch_values.bincount())
    check(values.bincount(minlength=11), torch_values.bincount(minlength=11))
    check(values.bincount(weights), torch_values.bincount(torch_weights), "float32 weights")
    check(values.bincount(weights.half(), 3), torch_values.bincount(torch_weights.half(), 3), "float64 result")
    bytes_, torch_bytes = pair(np.array([2, 2, 0], dtype=np.uint8), device)
    check(bytes_.bincount(bytes_.int()), torch_bytes.bincount(torch_bytes.int()), "integer weights: float64")
    empty, torch_empty = pair(np.zeros(0, dtype=np.int64), device)
    check(empty.bincount(), torch_empty.bincount())
    check(empty.bincount(minlength=2), torch_empty.bincount(minlength=2))
    check.verify()


def test_bincount_in_pieces(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bincount whose values x bins pass BINCOUNT_PIECE_ELEMENTS compares its values in pieces and adds their
    counts (a bincount of 10^7 values into 1,000 bins needed 64-bit indices, which wgpu does not have)."""
    from ember.core import index_updates

    monkeypatch.setattr(index_updates, "BINCOUNT_PIECE_ELEMENTS", 700_000)  # 3 pieces of 700 values (1,000 bins)
    generator = np.random.default_rng(3)
    values, torch_values = pair(generator.integers(0, 1000, 2_017), device)
    weights, torch_weights = pair(random_array((2_017,), seed=4), device)
    check = BatchedChecks(atol=1e-4, rtol=1e-5)
    check(values.bincount(), torch_values.bincount(), "counts")
    check(values.bincount(weights, 1_200), torch_values.bincount(torch_weights, 1_200), "weights")
    check.verify()


def test_errors(device: str) -> None:
    x = em.zeros(3, 4, device=device)
    index = em.tensor([0, 1], device=device)
    with pytest.raises(em.DTypeError, match="int64 or int32"):
        x.index_add(0, index.cast(em.int16), em.zeros(2, 4, device=device))
    with pytest.raises(em.DTypeError, match="int64 tensor"):
        x.index_copy(0, index.int(), em.zeros(2, 4, device=device))
    with pytest.raises(IndexError, match="vector"):
        x.index_add(0, index.reshape(1, 2), em.zeros(2, 4, device=device))
    with pytest.raises(em.DTypeError, match="same dtype"):
        x.index_add(0, index, em.zeros(2, 4, device=device, dtype=em.float64))
    with pytest.raises(em.ShapeError, match="except dim 0"):
        x.index_add(0, index, em.zeros(2, 3, device=device))
    with pytest.raises(em.ShapeError, match=r"number of indices \(2\)"):
        x.index_copy(0, index, em.zeros(3, 4, device=device))
    with pytest.raises(em.ShapeError, match="0-d tensor"):
        x.index_fill(0, index, em.zeros(1, device=device))
    with pytest.raises(IndexError, match="same number of elements"):
        x.put(index, em.zeros(3, device=device))
    with pytest.raises(em.DTypeError, match="bool"):
        x.masked_scatter(x.int(), x)
    with pytest.raises(em.ShapeError, match="9 True elements"):
        x.masked_scatter(em.tensor([True, False, True, True], device=device), em.zeros(2, device=device))
    with pytest.raises(em.ShapeError, match="must broadcast to self"):
        x[0].masked_scatter_(x.bool(), x)
    with pytest.raises(em.DTypeError, match="1-d non-negative integer"):
        x.bincount()
    with pytest.raises(ValueError, match="non-negative inputs"):
        em.tensor([1, -1], device=device).bincount()
    with pytest.raises(ValueError, match="minlength"):
        index.bincount(minlength=-1)
    with pytest.raises(em.ShapeError, match="weights"):
        index.bincount(em.zeros(3, device=device))


GRADIENT_CASES = [
    Case("index_add", lambda x, y: x.index_add(1, torch.tensor([2, 0, 2]) if isinstance(x, torch.Tensor) else
                                                 em.tensor([2, 0, 2], device=x.device), y, alpha=2.0),
         [(2, 3), (2, 3)]),
    Case("index_copy", lambda x, y: x.index_copy(0, torch.tensor([2, 0]) if isinstance(x, torch.Tensor) else
                                                   em.tensor([2, 0], device=x.device), y), [(3, 2), (2, 2)]),
    # (torch's backward rejects the negative indices its forward takes)
    Case("index_fill_value", lambda x, v: x.index_fill(0, torch.tensor([1, 2]) if isinstance(x, torch.Tensor) else
                                                         em.tensor([1, 2], device=x.device), v.sum()),
         [(3, 2), (2,)]),
    Case("put_accumulate", lambda x, y: x.put(torch.tensor([4, 0, 4]) if isinstance(x, torch.Tensor) else
                                                em.tensor([4, 0, 4], device=x.device), y, accumulate=True),
         [(2, 3), (3,)]),
    Case("put", lambda x, y: x.put(torch.tensor([4, -6]) if isinstance(x, torch.Tensor) else
                                     em.tensor([4, -6], device=x.device), y), [(2, 3), (2,)]),
    Case("masked_scatter", lambda x, y: x.masked_scatter(
        torch.tensor([[True, False, True], [False, False, True]]) if isinstance(x, torch.Tensor) else
        em.tensor([[True, False, True], [False, False, True]], device=x.device), y), [(2, 3), (5,)]),
]


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=str)
def test_gradients(case: Case, device: str) -> None:
    check_gradients(case, device)
