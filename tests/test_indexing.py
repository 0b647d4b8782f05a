"""Indexing against PyTorch: __getitem__/__setitem__ with every kind of index, gather/scatter, masks, tril/triu, one_hot."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember as em
from tests.helpers import BatchedChecks, assert_close, pair, random_array


def same(actual: object, expected: object) -> None:
    """Indexing only moves values: they must match torch exactly."""
    assert_close(actual, expected, atol=0, rtol=0)


def count_kernels(*tensors: em.Tensor) -> int:
    with em.profile() as record:
        em.realize(*tensors)
    return len(record.kernels)


def index_pair(values: Any, device: str, dtype: Any = np.int64) -> tuple[em.Tensor, torch.Tensor]:
    return pair(np.array(values, dtype=dtype), device)


def test_basic_indexing(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 17, 4)), device)
    for index in [
        0, -1, (2, 16), (1, -3, 0), slice(None), slice(1, None), slice(None, -1), slice(None, None, 2),
        (slice(None), slice(3, 15, 4)), (slice(None), slice(-5, None, 3), slice(None, None, 3)),
        (slice(10, 2),), (slice(None), slice(100, None)), (slice(-100, 100),), None, (None, 0, None),
        (Ellipsis, 1), (1, Ellipsis), (Ellipsis, None), (0, Ellipsis, slice(None, None, 2), None),
        (slice(None), None, 5, slice(1, 3)), (), Ellipsis, (np.int64(2), np.int32(-1)),
    ]:
        same(x[index], tx[index])
    # non-contiguous sources
    same(x.permute(2, 0, 1)[1:, ::2, 3], tx.permute(2, 0, 1)[1:, ::2, 3])
    same(x[:, ::3][1, 2:], tx[:, ::3][1, 2:])
    same(x.flip(1)[..., 1::2], tx.flip(1)[..., 1::2])
    empty, tempty = pair(random_array((0, 3)), device)
    same(empty[:, 1], tempty[:, 1])
    same(empty[None, ..., ::2], tempty[None, ..., ::2])
    one, tone = pair(random_array((1,)), device)
    same(one[0], tone[0])
    same(one[-1:], tone[-1:])
    scalar, tscalar = pair(np.array(5.0, dtype=np.float32), device)
    same(scalar[None], tscalar[None])
    same(scalar[...], tscalar[...])
    same.verify()


def test_integer_tensor_indexing(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 17, 4)), device)
    rows, trows = index_pair([2, 0, -1, 1], device)
    cols, tcols = index_pair([[16, 0], [3, -17]], device)
    same(x[rows], tx[trows])
    same(x[[0, 2, 2]], tx[[0, 2, 2]])
    same(x[:, cols], tx[:, tcols])
    same(x[..., rows[:2]], tx[..., trows[:2]])
    same(x[rows[:2, None], cols[0]], tx[trows[:2, None], tcols[0]])  # broadcast index tensors (2, 1) x (2,)
    same(x[:, cols, rows[:2]], tx[:, tcols, trows[:2]])  # adjacent: the index dims stay in place
    same(x[rows[:2], :, rows[1:3]], tx[trows[:2], :, trows[1:3]])  # separated by a slice: index dims go first
    same(x[rows[:2], None, rows[1:3]], tx[trows[:2], None, trows[1:3]])  # separated by None
    same(x[:, 1, rows[:2]], tx[:, 1, trows[:2]])  # ints are basic indices: no separation
    same(x[rows[:2], 1, rows[1:3]], tx[trows[:2], 1, trows[1:3]])
    same(x[None, rows, ::4, 1:], tx[None, trows, ::4, 1:])
    same(x[em.tensor(1, device=device)], tx[torch.tensor(1)])  # a 0-d tensor acts as an int
    same(x[:, em.tensor(-2, device=device), :, None], tx[:, torch.tensor(-2), :, None])
    same(x[em.tensor(2, device=device), :, rows[:2]], tx[torch.tensor(2), :, trows[:2]])
    same(x[:, [], 1], tx[:, [], 1])
    with pytest.warns(UserWarning, match="tuple"):  # torch's legacy rule: a list holding lists is a tuple
        legacy = x[[[0, 1], [1, 2]]]
    same(legacy, tx[[0, 1], [1, 2]])
    same(x.permute(1, 2, 0)[cols, 2:], tx.permute(1, 2, 0)[tcols, 2:])
    for dtype in (np.int32, np.int16, np.uint32):  # torch takes int64 and int32 index tensors; ember any integer
        small, _ = index_pair([1, 0, 1], device, dtype)
        same(x[small, 3], tx[torch.tensor([1, 0, 1]), 3])
    flags, tflags = pair(random_array((5, 3), np.bool_), device)
    same(flags[[4, 0]], tflags[[4, 0]])
    halves, thalves = pair(random_array((4,), np.float16), device)
    same(halves[[3, 3, 0]], thalves[[3, 3, 0]])
    integers, tintegers = pair(random_array((4,), np.int8), device)
    same(integers[[-1, 1]], tintegers[[-1, 1]])
    same.verify()


def test_boolean_mask_indexing(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 17, 4)), device)
    same(x[x > 0.5], tx[tx > 0.5])
    mask, tmask = pair(random_array((3, 17), np.bool_), device)
    same(x[mask], tx[tmask])
    same(x[mask, 1:3], tx[tmask, 1:3])
    column_mask, tcolumn_mask = pair(np.array([True, False, True, True]), device)
    same(x[..., column_mask], tx[..., tcolumn_mask])
    same(x[1, :, column_mask], tx[1, :, tcolumn_mask])
    pair_mask, tpair_mask = pair(np.array([True, False, False, True]), device)
    same(x[[0, 2], :, pair_mask], tx[[0, 2], :, tpair_mask])  # mask and integers broadcast together
    same(x[x < -10], tx[tx < -10])  # nothing selected
    same(x[x > -10], tx[tx > -10])  # everything selected
    same(x[[True, False, True]], tx[[True, False, True]])  # a list of bools is a mask
    same(x[True], tx[True])
    same(x[False], tx[False])
    same(x[:, True, 2], tx[:, True, 2])
    same(x[[0, 1], True], tx[[0, 1], True])
    same(x[em.tensor(True, device=device)], tx[torch.tensor(True)])
    reversed_x, treversed_x = x.permute(2, 1, 0), tx.permute(2, 1, 0)
    same(reversed_x[reversed_x[..., 0] > 0], treversed_x[treversed_x[..., 0] > 0])
    scalar, tscalar = pair(np.array(2.0, dtype=np.float32), device)
    same(scalar[scalar > 1], tscalar[tscalar > 1])
    byte_mask, tbyte_mask = index_pair([1, 0, 1], device, np.uint8)
    with pytest.warns(UserWarning):
        expected = tx[tbyte_mask]
    same(x[byte_mask], expected)
    same.verify()


def test_masked_select_nonzero(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 17)), device)
    mask, tmask = pair(random_array((17,), np.bool_), device)
    same(x.masked_select(mask), tx.masked_select(tmask))
    same(em.masked_select(x, x > 0), torch.masked_select(tx, tx > 0))
    same(x.nonzero(), tx.nonzero())
    same((x > 1).nonzero(as_tuple=True), (tx > 1).nonzero(as_tuple=True))
    same(em.argwhere(x[0] > 0), torch.argwhere(tx[0] > 0))
    integers, tintegers = pair(random_array((2, 3, 4), np.int32), device)
    same(integers.nonzero(), tintegers.nonzero())
    same(em.nonzero(x < -10), torch.nonzero(tx < -10))
    scalar, tscalar = pair(np.array(2.0, dtype=np.float32), device)
    same(scalar.nonzero(), tscalar.nonzero())
    same.verify()


def test_setitem_basic(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 17, 4)), device)
    value, tvalue = pair(random_array((17, 1), seed=3), device)
    for index, item in [
        (0, 1.5), ((1, slice(2, 9, 3)), -2), ((slice(None), 5), (value[:3], tvalue[:3])), (Ellipsis, 0.25),
        ((Ellipsis, slice(None, None, 2)), (value, tvalue)), ((None, 2, -1), (value[:4, 0], tvalue[:4, 0])),
        ((slice(None), slice(16, None)), 7), ((slice(5, 2),), 9), ((-1, -1, -1), 3.0),
    ]:
        if isinstance(item, tuple):
            x[index] = item[0]
            tx[index] = item[1]
        else:
            x[index] = item
            tx[index] = item
        same(x, tx)
    integers, tintegers = pair(random_array((4, 3), np.int32), device)
    integers[1:, 0] = 2.7  # cast to the tensor's dtype
    tintegers[1:, 0] = 2.7
    integers[0] = em.tensor([[1, 2, 3]], device=device)  # leading size-1 dims of the value are dropped
    tintegers[0] = torch.tensor([[1, 2, 3]])
    same(integers, tintegers)
    flags, tflags = pair(random_array((5,), np.bool_), device)
    flags[::2] = True
    tflags[::2] = True
    same(flags, tflags)
    view, tview = pair(random_array((4, 4)), device)
    view = view.T
    tview = tview.T.clone()
    view[1:3, ::2] = view[0:2, 1::2] * 10
    tview[1:3, ::2] = tview[0:2, 1::2] * 10
    same(view, tview)
    same.verify()


def test_setitem_advanced(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 17, 4)), device)
    rows, trows = index_pair([2, 0], device)
    cols, tcols = index_pair([[16, 0, 5], [-1, 3, 7]], device)
    x[rows] = 0.5
    tx[trows] = 0.5
    same(x, tx)
    value, tvalue = pair(random_array((2, 3, 4), seed=4), device)
    x[:, cols[0]] = value[0]
    tx[:, tcols[0]] = tvalue[0]
    same(x, tx)
    x[rows[:, None], cols[:, :2]] = value[:, :2]
    tx[trows[:, None], tcols[:, :2]] = tvalue[:, :2]
    same(x, tx)
    x[rows, :, rows] = value[0, :2, :1] * 3  # separated: the index dim comes first in the value too
    tx[trows, :, trows] = tvalue[0, :2, :1] * 3
    same(x, tx)
    x[1, [3, 4], 1:3] = -5
    tx[1, [3, 4], 1:3] = -5
    same(x, tx)
    x[x > 1] = 0  # a mask with a value that does not depend on the count: a select
    tx[tx > 1] = 0
    same(x, tx)
    mask, tmask = pair(random_array((3, 17), np.bool_, seed=5), device)
    x[mask] = value[0, 0]
    tx[tmask] = tvalue[0, 0]
    same(x, tx)
    count = int(tmask.sum())
    replacement, treplacement = pair(random_array((count, 4), seed=6), device)
    x[mask] = replacement  # one row per True: needs the count
    tx[tmask] = treplacement
    same(x, tx)
    x[True] = 2.0
    tx[True] = 2.0
    x[False] = em.tensor([5.0], device=device)  # an empty selection writes nothing
    tx[False] = torch.tensor([5.0])
    x[1, ..., False] = 4.0
    tx[1, ..., False] = 4.0
    same(x, tx)
    x[..., [True, False, False, True]] = em.tensor([1.0, 2.0], device=device)
    tx[..., [True, False, False, True]] = torch.tensor([1.0, 2.0])
    same(x, tx)
    same.verify()


def test_index_put_accumulate(device: str) -> None:
    same = BatchedChecks(atol=1e-6, rtol=1e-6)
    x, tx = pair(random_array((5, 3)), device)
    index, tindex = index_pair([0, 4, 0, 0, -1], device)
    values, tvalues = pair(random_array((5, 3), seed=1), device)
    same(x.index_put((index,), values, accumulate=True), tx.index_put((tindex,), tvalues, accumulate=True))
    same(em.index_put(x, (index, index[:3, None] * 0 + 2), values[0, 0], accumulate=True),
         torch.index_put(tx, (tindex, tindex[:3, None] * 0 + 2), tvalues[0, 0], accumulate=True))
    same(x.index_put((index[1:2],), values[:1]), tx.index_put((tindex[1:2],), tvalues[:1]))
    x.index_put_((x > 0,), em.tensor(1.0, device=device), accumulate=True)
    tx.index_put_((tx > 0,), torch.tensor(1.0), accumulate=True)
    same(x, tx)
    same.verify()


def test_gather_and_take(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 17, 4)), device)
    index, tindex = pair(np.random.default_rng(1).integers(0, 17, (2, 5, 3)), device)
    same(x.gather(1, index), tx.gather(1, tindex))
    same(em.gather(x, -2, index), torch.gather(tx, -2, tindex))
    same(x.gather(0, index % 3), tx.gather(0, tindex % 3))
    same(x.gather(2, index[:, :, :1] % 4), tx.gather(2, tindex[:, :, :1] % 4))
    same(x.permute(1, 0, 2).gather(0, index.permute(1, 0, 2)), tx.permute(1, 0, 2).gather(0, tindex.permute(1, 0, 2)))
    same(x.gather(1, index[:, :0]), tx.gather(1, tindex[:, :0]))
    vector, tvector = pair(random_array((17,)), device)
    same(vector.gather(0, index[0, :, 0]), tvector.gather(0, tindex[0, :, 0]))
    same(x.take_along_dim(index[:, :1, :1] % 3, 0), tx.take_along_dim(tindex[:, :1, :1] % 3, 0))  # broadcasts
    same(x.take_along_dim(index[:1, :, :1], 1), tx.take_along_dim(tindex[:1, :, :1], 1))
    same(x.take_along_dim(index[0]), tx.take_along_dim(tindex[0]))
    flat, tflat = index_pair([[0, -1], [100, 5]], device)
    tflat_wrapped = torch.where(tflat == 100, 7, tflat)
    same(x.take(em.tensor([[0, -1], [7, 5]], device=device)), tx.take(tflat_wrapped))
    same(em.take(x, flat[:1]), torch.take(tx, tflat[:1]))
    same.verify()


def test_index_select(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 17)), device)
    index, tindex = index_pair([16, 0, 3, 3], device)
    same(x.index_select(1, index), tx.index_select(1, tindex))
    same(em.index_select(x, 0, index[2:] - 1), torch.index_select(tx, 0, tindex[2:] - 1))
    same(x.T.index_select(-1, index[1:] % 3), tx.T.index_select(-1, tindex[1:] % 3))
    same(x.index_select(0, em.tensor(2, device=device)), tx.index_select(0, torch.tensor(2)))
    same(x.index_select(1, index[:0]), tx.index_select(1, tindex[:0]))
    narrow, tnarrow = index_pair([1, 0], device, np.int32)
    same(x.index_select(0, narrow), tx.index_select(0, tnarrow))
    same.verify()


def test_scatter(device: str) -> None:
    same = BatchedChecks(atol=1e-6, rtol=1e-6)
    x, tx = pair(random_array((3, 5)), device)
    index, tindex = index_pair([[0, 4, 2], [1, 3, 0]], device)
    src, tsrc = pair(random_array((2, 4), seed=1), device)
    same(x.scatter(1, index, src), tx.scatter(1, tindex, tsrc))
    same(x.scatter(0, index % 3, src), tx.scatter(0, tindex % 3, tsrc))
    same(x.scatter(1, index, 2.5), tx.scatter(1, tindex, 2.5))
    with warnings.catch_warnings():  # torch deprecates reduce= with a src tensor (ember keeps it, as torch does)
        warnings.simplefilter("ignore", UserWarning)
        same(em.scatter(x, -1, index, src, reduce="add"), torch.scatter(tx, -1, tindex, tsrc, reduce="add"))
        same(x.scatter(1, index, src, reduce="multiply"), tx.scatter(1, tindex, tsrc, reduce="multiply"))
    same(x.scatter(1, index, 2.0, reduce="add"), tx.scatter(1, tindex, 2.0, reduce="add"))
    repeated, trepeated = index_pair([[1, 1, 1], [0, 4, 0]], device)
    same(x.scatter_add(1, repeated, src), tx.scatter_add(1, trepeated, tsrc))
    same(em.scatter_add(x, 0, repeated % 3, src), torch.scatter_add(tx, 0, trepeated % 3, tsrc))
    same(x.T.scatter_add(0, index.T, src.T), tx.T.scatter_add(0, tindex.T, tsrc.T))
    y, ty = x.clone(), tx.clone()
    y.scatter_(1, index, src)
    ty.scatter_(1, tindex, tsrc)
    y.scatter_add_(0, index % 3, src)
    ty.scatter_add_(0, tindex % 3, tsrc)
    same(y, ty)
    integers, tintegers = pair(random_array((3, 5), np.int32), device)
    same(integers.scatter(1, index, 7), tintegers.scatter(1, tindex, 7))
    same(integers.scatter_add(1, repeated, integers[:2, :3] * 2),
         tintegers.scatter_add(1, trepeated, tintegers[:2, :3] * 2))
    same.verify()


def test_scatter_reduce(device: str) -> None:
    same = BatchedChecks(atol=1e-6, rtol=1e-6)
    x, tx = pair(random_array((3, 5)), device)
    index, tindex = index_pair([[1, 1, 4, 1], [0, 4, 0, 2]], device)
    src, tsrc = pair(random_array((2, 4), seed=1), device)
    integers, tintegers = pair(random_array((3, 5), np.int64), device)
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            same(x.scatter_reduce(1, index, src, reduce, include_self=include_self),
                 tx.scatter_reduce(1, tindex, tsrc, reduce, include_self=include_self))
        same(integers.scatter_reduce(1, index, integers[:2, 1:], reduce),
             tintegers.scatter_reduce(1, tindex, tintegers[:2, 1:], reduce))
    same.verify()


def test_masked_fill(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 17)), device)
    mask, tmask = pair(random_array((17,), np.bool_), device)
    same(x.masked_fill(mask, -1.5), tx.masked_fill(tmask, -1.5))
    same(x.masked_fill(x > 0, em.tensor(2.0, device=device)), tx.masked_fill(tx > 0, torch.tensor(2.0)))
    same(em.masked_fill(x.T, mask[:, None], 0), torch.masked_fill(tx.T, tmask[:, None], 0))
    same(x.masked_fill(mask, float("inf")), tx.masked_fill(tmask, float("inf")))
    integers, tintegers = pair(random_array((3, 4), np.int32), device)
    same(integers.masked_fill(integers > 0, 3), tintegers.masked_fill(tintegers > 0, 3))
    y, ty = x.clone(), tx.clone()
    y.masked_fill_(mask, 9.0)
    ty.masked_fill_(tmask, 9.0)
    same(y, ty)
    same.verify()


def test_tril_triu(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((2, 3, 17)), device)
    for diagonal in (0, 1, -1, 5, -3, 20):
        same(x.tril(diagonal), tx.tril(diagonal))
        same(x.triu(diagonal), tx.triu(diagonal))
    same(em.tril(x.mT), torch.tril(tx.mT))
    same(em.triu(x[0, :, :3], diagonal=1), torch.triu(tx[0, :, :3], diagonal=1))
    flags, tflags = pair(random_array((4, 4), np.bool_), device)
    same(flags.tril(), tflags.tril())
    integers, tintegers = pair(random_array((1, 4), np.int64), device)
    same(integers.triu(), tintegers.triu())
    empty, tempty = pair(random_array((0, 3)), device)
    same(empty.tril(), tempty.tril())
    y, ty = x.clone(), tx.clone()
    y.tril_(1)
    ty.tril_(1)
    same(y, ty)
    same.verify()


def test_one_hot(device: str) -> None:
    same = BatchedChecks()
    labels, tlabels = index_pair([[0, 3], [2, 2], [1, 0]], device)
    same(labels.one_hot(), F.one_hot(tlabels))
    same(labels.one_hot(5), F.one_hot(tlabels, 5))
    same(labels[0].one_hot(num_classes=4), F.one_hot(tlabels[0], num_classes=4))
    same(labels.T.one_hot(), F.one_hot(tlabels.T))
    scalar, tscalar = index_pair(2, device)
    same(scalar.one_hot(3), F.one_hot(tscalar, 3))
    same.verify()


def test_tensor_index_out_of_range_raises(device: str) -> None:
    """Tensor indices out of range raise IndexError (as torch does; tests/test_index_checks.py checks every op)."""
    x = em.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    tx = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    cases = [
        (lambda t, make: t[make([1, 2, -3])]),
        (lambda t, make: t.gather(1, make([[5], [-1]]))),
        (lambda t, make: t.index_select(0, make([7]))),
        (lambda t, make: t.scatter(1, make([[2], [-1]]), 7.0)),
    ]
    for case in cases:
        with pytest.raises((IndexError, RuntimeError)):
            case(tx, torch.tensor)
        with pytest.raises(IndexError, match="out of bounds"):
            case(x, lambda values: em.tensor(values, device=device)).tolist()
    with pytest.raises(IndexError, match="out of bounds"):
        x[em.tensor([5, 0], device=device)] = 9.0
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0]]  # raised before anything was written


def test_gather_and_advanced_index_are_one_kernel(device: str) -> None:
    x, tx = pair(random_array((4, 17)), device)
    index, tindex = pair(np.random.default_rng(2).integers(0, 17, (4, 6)), device)
    gathered = (x * 2).gather(1, index) + 1
    assert count_kernels(gathered) == 1
    same(gathered, (tx * 2).gather(1, tindex) + 1)
    picked = x[index[:2, :3] % 4, 2:].exp()
    assert count_kernels(picked) == 2  # the values, and the range check of the computed index (one reduce)
    assert_close(picked, tx[tindex[:2, :3] % 4, 2:].exp())
    written = x.clone()
    written[1:3, ::4] = 0.0
    assert count_kernels(written) == 2  # the clone and the select that writes
    lower = (x.T @ x).tril()
    assert count_kernels(lower) == 1
    ones = em.ones(3, 3, device=device)
    ones[em.tensor([0, 2], device=device)] = em.zeros(2, 3, device=device)
    assert count_kernels(ones) <= 2
    same(ones, torch.tensor([[0.0, 0, 0], [1, 1, 1], [0, 0, 0]]))


def test_indexing_errors_name_the_problem(device: str) -> None:
    x = em.zeros(2, 3, device=device)
    with pytest.raises(IndexError, match=r"index 2 is out of bounds for dim 0 with size 2"):
        x[2]
    with pytest.raises(IndexError, match=r"index -4 is out of bounds for dim 1 with size 3"):
        x[0, -4]
    with pytest.raises(IndexError, match=r"index 3 is out of bounds for dim 1"):
        x[0, 3] = 1.0
    with pytest.raises(IndexError, match=r"too many indices for a tensor of dimension 2"):
        x[0, 0, 0]
    with pytest.raises(IndexError, match="too many indices"):
        x[..., em.zeros(2, 3, 1, device=device) > 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., ...]
    with pytest.raises(ValueError, match="step must be greater than zero"):
        x[::-1]
    with pytest.raises(IndexError, match=r"mask \(3,\) at index 0 does not match the shape \(2,\)"):
        x[em.tensor([True, False, True], device=device)]
    with pytest.raises(IndexError, match=r"shape mismatch.*\(2,\), \(3,\)"):
        x[[0, 1], [0, 1, 2]]
    with pytest.raises(IndexError, match="integer or bool tensors, got float32"):
        x[em.tensor([0.0], device=device)]
    with pytest.raises(IndexError, match="invalid index of type str"):
        x["a"]
    with pytest.raises(IndexError, match="hold ints or bools"):
        x[[0.5]]
    with pytest.raises(em.ShapeError, match=r"value of shape \(2,\) cannot be broadcast to the indexing result of shape "
                                            r"\(3,\)"):
        x[0] = em.zeros(2, device=device)
    with pytest.raises(em.ShapeError, match=r"value of shape \(4,\).*\(2, 3\)"):
        x[[0, 1]] = em.zeros(4, device=device)
    with pytest.raises(em.ShapeError, match=r"index of shape \(2,\) must have as many dims as the input of shape "
                                            r"\(2, 3\)"):
        x.gather(1, em.tensor([0, 1], device=device))
    with pytest.raises(em.ShapeError, match=r"must not be larger than the input of shape \(2, 3\) in any dim except"):
        x.gather(1, em.zeros(3, 1, dtype=em.int64, device=device))
    with pytest.raises(em.ShapeError, match=r"must not be larger than src of shape \(1, 1\)"):
        x.scatter(1, em.zeros(2, 1, dtype=em.int64, device=device), em.zeros(1, 1, device=device))
    with pytest.raises(em.DTypeError, match="index must be an integer tensor, got float32"):
        x.gather(0, em.zeros(2, 3, device=device))
    with pytest.raises(em.ShapeError, match=r"0-d or 1-d, got shape \(1, 1\)"):
        x.index_select(0, em.zeros(1, 1, dtype=em.int64, device=device))
    with pytest.raises(ValueError, match="reduce must be"):
        x.scatter(0, em.zeros(1, 1, dtype=em.int64, device=device), 1.0, reduce="max")
    with pytest.raises(em.ShapeError, match=r"at least 2 dims, got shape \(3,\)"):
        x[0].tril()
    with pytest.raises(em.DTypeError, match="one_hot: expects an integer"):
        x.one_hot(3)
    with pytest.raises(em.ShapeError, match="empty"):
        em.zeros(0, dtype=em.int64, device=device).one_hot()
    with pytest.raises(ValueError, match="non-negative"):
        em.tensor([-1, 2], device=device).one_hot()
    with pytest.raises(em.DTypeError, match="mask must be a bool tensor"):
        x.masked_select(x)
    with pytest.raises(TypeError, match="0-d tensor"):
        iter(em.tensor(1.0, device=device))
