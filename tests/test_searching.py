"""unique, unique_consecutive, searchsorted, bucketize and histc against PyTorch on every test device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember as em
from ember.core import searching, sort_network
from ember.core.searching import bucketize, searchsorted
from ember.scheduler.devices import get_device
from tests.helpers import assert_close
from tests.test_sorting import assert_exact

NAN = float("nan")


def assert_outputs(mine: object, theirs: object) -> None:
    if isinstance(theirs, tuple):
        assert isinstance(mine, tuple) and len(mine) == len(theirs)
        for one_mine, one_theirs in zip(mine, theirs):
            assert_exact(one_mine, one_theirs)
    else:
        assert_exact(mine, theirs)


@pytest.mark.parametrize("flags", [(False, False), (True, True)])
def test_unique_values_inverse_counts(device: str, flags: tuple[bool, bool]) -> None:
    inverse, counts = flags
    cases = [
        np.array([3.0, NAN, 1.0, NAN, -0.0, 0.0, 1.0, 3.0], np.float32),  # each NaN its own; -0.0 first, kept
        np.array([[3, 1, 2], [1, 3, 3]], np.int64),
        np.array([True, False, True, True]),
        np.array([5, 5, 5], np.uint8),
        np.array(7.0, np.float64),
        np.zeros((0,), np.float32),
    ]
    for data in cases:
        mine = em.tensor(data, device=device).unique(return_inverse=inverse, return_counts=counts)
        theirs = torch.unique(torch.tensor(data), return_inverse=inverse, return_counts=counts)
        assert_outputs(mine, theirs)
    data = cases[1]
    assert_outputs(em.tensor(data, device=device).unique(sorted=False), torch.tensor(data).unique(sorted=False))


def test_unique_long_input_uses_the_network_and_the_shifted_scan(device: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sort_network, "COUNTING_LIMIT", 4)
    monkeypatch.setattr(sort_network, "COUNTING_WORK_LIMIT", 0)
    monkeypatch.setattr(sort_network, "NETWORK_BLOCK", 4)
    monkeypatch.setattr(sort_network, "STORED_ROW", 8)
    monkeypatch.setattr(searching, "SCAN_COUNTING_LIMIT", 4)
    data = np.random.default_rng(0).integers(0, 9, size=37).astype(np.int32)
    mine = em.tensor(data, device=device).unique(return_inverse=True, return_counts=True)
    assert_outputs(mine, torch.unique(torch.tensor(data), return_inverse=True, return_counts=True))
    mine = em.tensor(data, device=device).unique_consecutive(return_inverse=True, return_counts=True)
    assert_outputs(mine, torch.unique_consecutive(torch.tensor(data), return_inverse=True, return_counts=True))


def test_unique_inverse_sorts_its_pairs_as_one_row_records(device: str) -> None:
    """unique of 3000 elements with return_inverse: two sorts through the network (padded to 4096), the values and
    the (order, group) pairs, each packed in one int64 record per element, so each merges in 31 kernels storing rows
    of 64 records (one row per work item on a CPU; a device with warps lowers the same kernels with a work item per
    record) and no kernel of masks."""
    data = np.random.default_rng(1).integers(0, 50, size=3000).astype(np.int32)
    with em.profile() as profile:
        mine = em.tensor(data, device=device).unique(return_inverse=True, return_counts=True)
        assert_outputs(mine, torch.unique(torch.tensor(data), return_inverse=True, return_counts=True))
    rows = 4096 // sort_network.STORED_ROW
    per_row = get_device(device).info.warp_width == 1
    one_row_records = [record for record in profile.kernels
                       if record.name.startswith(f"e_1_{rows}_{sort_network.STORED_ROW}_")
                       and (record.global_size == rows or not per_row)]
    assert len(one_row_records) == 2 * 31


def test_unique_along_a_dim(device: str) -> None:
    rows = np.array([[1, 2], [0, 5], [1, 2], [0, 1], [0, 5]], np.int32)
    floats = np.array([[1.0, -0.0, 2.0], [0.5, 0.0, 2.0], [1.0, 0.0, -1.0]], np.float32)
    for data, dim in ((rows, 0), (rows, 1), (rows.T.copy(), 1), (floats, 1), (floats, 0),
                      (np.arange(24, dtype=np.int64).reshape(2, 3, 4) % 3, 2)):
        mine = em.tensor(data, device=device).unique(dim=dim, return_inverse=True, return_counts=True)
        theirs = torch.unique(torch.tensor(data), dim=dim, return_inverse=True, return_counts=True)
        assert_outputs(mine, theirs)


def test_unique_consecutive(device: str) -> None:
    cases = [
        (np.array([1, 1, 2, 2, 3, 1, 1, 2], np.int64), None),
        (np.array([1.0, NAN, NAN, 2.0, -0.0, 0.0], np.float32), None),
        (np.array([[1, 2], [2, 2]], np.int32), None),
        (np.array([[1, 2], [1, 2], [0, 5], [1, 2]], np.int32), 0),
        (np.array([[1, 1, 2], [3, 3, 3]], np.int32), 1),
    ]
    for data, dim in cases:
        mine = em.tensor(data, device=device).unique_consecutive(return_inverse=True, return_counts=True, dim=dim)
        theirs = torch.unique_consecutive(torch.tensor(data), return_inverse=True, return_counts=True, dim=dim)
        assert_outputs(mine, theirs)
    data = cases[0][0]
    assert_outputs(em.tensor(data, device=device).unique_consecutive(), torch.unique_consecutive(torch.tensor(data)))


def test_searchsorted_and_bucketize(device: str) -> None:
    sequence = np.array([1.0, 2.0, 2.0, 3.0, 5.0], np.float32)
    values = np.array([[NAN, 2.0, 0.0], [5.0, -0.0, 2.5]], np.float32)
    mine_sequence, theirs_sequence = em.tensor(sequence, device=device), torch.tensor(sequence)
    mine_values, theirs_values = em.tensor(values, device=device), torch.tensor(values)
    for options in ({}, {"right": True}, {"side": "right"}, {"side": "left", "out_int32": True}):
        assert_exact(searchsorted(mine_sequence, mine_values, **options),
                     torch.searchsorted(theirs_sequence, theirs_values, **options))
        assert_exact(bucketize(mine_values, mine_sequence, right=options.get("right", False)),
                     torch.bucketize(theirs_values, theirs_sequence, right=options.get("right", False)))
    assert_exact(searchsorted(mine_sequence, 2.0), torch.searchsorted(theirs_sequence, 2.0))
    assert_exact(bucketize(3, mine_sequence), torch.bucketize(3, theirs_sequence))
    rows = np.array([[1, 2, 3], [2, 4, 6]], np.int64)  # one sorted row per row of values; int against float values
    queries = np.array([[2.0, 3.5], [5.0, 1.0]], np.float32)
    assert_exact(searchsorted(em.tensor(rows, device=device), em.tensor(queries, device=device)),
                 torch.searchsorted(torch.tensor(rows), torch.tensor(queries)))
    unsorted, sorter = np.array([3.0, 1.0, 2.0], np.float32), np.array([1, 2, 0], np.int64)
    assert_exact(searchsorted(em.tensor(unsorted, device=device), em.tensor([2.5, 0.5], device=device),
                              sorter=em.tensor(sorter, device=device)),
                 torch.searchsorted(torch.tensor(unsorted), torch.tensor([2.5, 0.5]), sorter=torch.tensor(sorter)))


def test_histc(device: str) -> None:
    data = np.array([0.0, 1.0, 2.0, 3.0, 1.5, 2.9999, -1.0, 4.0, NAN, 0.1, 0.7], np.float32)
    cases = [(data, 3, 0, 3), (data, 4, 0, 3), (data, 7, -1, 1), (np.array([1.0, 1.0, 1.0], np.float32), 4, 0, 0),
             (np.random.default_rng(1).standard_normal(50).astype(np.float32), 10, 0, 0),
             (np.random.default_rng(2).standard_normal(20), 5, -1.5, 2.5)]
    for values, bins, low, high in cases:
        mine = em.tensor(values, device=device).histc(bins, low, high)
        theirs = torch.tensor(values).histc(bins, low, high)
        assert_exact(mine, theirs)
    half = np.array([0.3, 1.2, 2.6, 2.9, 0.1], np.float16)
    assert_exact(em.tensor(half, device=device).histc(3, 0, 3), torch.tensor(half).histc(3, 0, 3))


def test_bad_arguments_raise_at_the_call(device: str) -> None:
    source = em.tensor([1.0, 2.0, 3.0], device=device)
    with pytest.raises(ValueError, match="bins"):
        source.histc(0)
    with pytest.raises(ValueError, match="larger than min"):
        source.histc(3, 2, 1)
    with pytest.raises(ValueError, match="not finite"):
        em.tensor([1.0, float("inf")], device=device).histc(3)
    with pytest.raises(em.DTypeError, match="floating point"):
        em.tensor([1, 2], device=device).histc(3)
    with pytest.raises(em.ShapeError, match="leading dims"):
        searchsorted(em.ones(2, 3, device=device), em.ones(3, 3, device=device))
    with pytest.raises(ValueError, match="side"):
        searchsorted(source, source, side="middle")
    with pytest.raises(ValueError, match="contradict"):
        searchsorted(source, source, right=True, side="left")
    with pytest.raises(em.ShapeError, match="1-d"):
        bucketize(source, em.ones(2, 2, device=device))
    with pytest.raises(IndexError, match="out of range"):
        source.unique(dim=3)
    assert_close(source.histc(3), torch.tensor([1.0, 2.0, 3.0]).histc(3))
