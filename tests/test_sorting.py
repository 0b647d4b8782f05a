"""Sorting and order statistics against PyTorch: sort, argsort, msort, topk, kthvalue, median, nanmedian, mode,
quantile and nanquantile, forward (values bit for bit, -0.0 and NaN included) and backward, on every test device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember as em
from ember.core import sort_network
from ember.scheduler.devices import get_device
from tests.helpers import EMBER_DTYPES, assert_close

NAN = float("nan")


def tie_data(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Small integers (many ties) as float32 with a NaN, -0.0, 0.0 and infinities sprinkled in."""
    generator = np.random.default_rng(seed)
    data = generator.integers(-3, 4, size=shape).astype(np.float32).reshape(-1)
    specials = [NAN, -0.0, 0.0, np.inf, -np.inf, NAN, -0.0]
    positions = generator.choice(data.size, size=min(len(specials), data.size), replace=False)
    data[positions] = specials[:len(positions)]
    return data.reshape(shape)


def assert_exact(actual: em.Tensor, expected: torch.Tensor) -> None:
    """Same shape, dtype and values bit for bit (NaN matches NaN, -0.0 only -0.0)."""
    assert tuple(actual.shape) == tuple(expected.shape), (actual.shape, expected.shape)
    assert EMBER_DTYPES[expected.dtype] == actual.dtype, (actual.dtype, expected.dtype)
    mine = actual.numpy()
    theirs = expected.detach().float().numpy() if expected.dtype == torch.bfloat16 else expected.detach().numpy()
    np.testing.assert_array_equal(mine, theirs)
    if mine.dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(mine), np.signbit(theirs))


@pytest.fixture(params=["counting", "network"])
def algorithm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with rows ranked by counting, and again through the bitonic network (blocks of 4 sorted by
    counting, merged by the network), so both paths are checked on small data."""
    if request.param == "network":
        monkeypatch.setattr(sort_network, "COUNTING_LIMIT", 4)
        monkeypatch.setattr(sort_network, "COUNTING_WORK_LIMIT", 0)
        monkeypatch.setattr(sort_network, "NETWORK_BLOCK", 4)
        monkeypatch.setattr(sort_network, "STORED_ROW", 8)
    return request.param


@pytest.mark.parametrize("descending", [False, True])
def test_sort_floats_with_ties_nan_and_signed_zeros(device: str, algorithm: str, descending: bool) -> None:
    data = tie_data((3, 13))
    for dim in (1, 0):
        mine = em.tensor(data, device=device).sort(dim, descending=descending)
        theirs = torch.tensor(data).sort(dim=dim, descending=descending, stable=True)
        assert_exact(mine.values, theirs.values)
        assert_exact(mine.indices, theirs.indices)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "uint32", "int64", "float16", "bfloat16",
                                   "float64", "bool"])
def test_sort_every_dtype(device: str, algorithm: str, dtype: str) -> None:
    generator = np.random.default_rng(1)
    torch_dtype = getattr(torch, dtype)
    if dtype == "bool":
        data = torch.tensor(generator.random(11) < 0.5)
    elif dtype in ("float16", "bfloat16", "float64"):
        data = torch.tensor(tie_data((11,), 1).astype(np.float64)).to(torch_dtype)
    else:
        info = torch.iinfo(torch_dtype)
        values = generator.integers(0, 5, size=11).astype(np.int64)
        values[:3] = [info.min, info.max, info.min]  # the extremes of the type, and ties
        data = torch.tensor(values).to(torch_dtype)
    source = em.tensor(data.float().numpy() if dtype == "bfloat16" else data.numpy(), device=device,
                       dtype=EMBER_DTYPES[torch_dtype])
    for descending in (False, True):
        mine, theirs = source.sort(descending=descending), data.sort(descending=descending, stable=True)
        assert_exact(mine.values, theirs.values)
        assert_exact(mine.indices, theirs.indices)
    assert_exact(source.argsort(descending=True), data.argsort(descending=True, stable=True))


def test_sort_shapes_argsort_msort(device: str) -> None:
    data = tie_data((2, 3, 5), 2)
    source, reference = em.tensor(data, device=device), torch.tensor(data)
    for dim in (0, 1, 2, -2):
        assert_exact(source.argsort(dim), reference.argsort(dim=dim, stable=True))
    assert_exact(source.msort(), reference.msort())
    assert_exact(source.sort(stable=True).values, reference.sort(stable=True).values)
    for shape in ((0,), (3, 0), (0, 4)):  # empty dims
        empty = np.zeros(shape, dtype=np.float32)
        mine, theirs = em.tensor(empty, device=device).sort(-1), torch.tensor(empty).sort(-1)
        assert_exact(mine.values, theirs.values)
        assert_exact(mine.indices, theirs.indices)
    scalar = em.tensor(2.5, device=device).sort()
    assert scalar.values.item() == 2.5 and scalar.indices.item() == 0 and scalar.indices.shape == ()


def test_sort_long_rows_through_the_network(device: str) -> None:
    """A row of 300 (padded to 512: blocks of 32 by counting, then the network in rows of 64) with many ties, both orders."""
    data = tie_data((2, 300), 3)
    source, reference = em.tensor(data, device=device), torch.tensor(data)
    for descending in (False, True):
        mine = source.sort(descending=descending)
        theirs = reference.sort(descending=descending, stable=True)
        assert_exact(mine.values, theirs.values)
        assert_exact(mine.indices, theirs.indices)


def test_network_stores_rows_of_a_cpu_tile_and_merges_in_pinned_passes(device: str) -> None:
    """A row of 3000 (padded to 4096): blocks of 32 by counting (2 kernels), then L = 7 merge stages of 6..12 steps
    (63), two fused per kernel; the last pair goes into the kernel unpacking the records, the other 31 store rows of
    64 records (one row per work item of a CPU), so 64 work items each. Exact against torch, both orders."""
    data = tie_data((3000,), 5)
    per_row = get_device(device).info.warp_width == 1
    source, reference = em.tensor(data, device=device), torch.tensor(data)
    for descending in (False, True):
        with em.profile() as profile:
            mine = source.sort(descending=descending)
            values, indices = mine.values.numpy(), mine.indices.numpy()
        theirs = reference.sort(descending=descending, stable=True)
        np.testing.assert_array_equal(values.view(np.int32), theirs.values.numpy().view(np.int32))
        np.testing.assert_array_equal(indices, theirs.indices.numpy())
        # (a device with warps lowers the same kernels with a work item per record: counted by their names there)
        rows = [record for record in profile.kernels if record.global_size == 4096 // sort_network.STORED_ROW
                or (not per_row and record.name.startswith(f"e_1_{4096 // sort_network.STORED_ROW}_"))]
        assert len(rows) == 31
        # + 2: the records (each key packed with its index, the row padded to 4096: one kernel, as the counting
        # kernel reads that join under a broadcast, kernelize.JOINED_PARTS_WORK), then unpacking
        assert len(profile.kernels) == 36, len(profile.kernels)


def test_sort_gradient_goes_to_the_sorted_elements(device: str) -> None:
    data = np.random.default_rng(4).standard_normal((3, 6)).astype(np.float32)
    weights = np.random.default_rng(5).standard_normal((3, 6)).astype(np.float32)
    mine = em.tensor(data, device=device, requires_grad=True)
    theirs = torch.tensor(data, requires_grad=True)
    (mine.sort(1, descending=True).values * em.tensor(weights, device=device)).sum().backward()
    (theirs.sort(1, descending=True).values * torch.tensor(weights)).sum().backward()
    assert_close(mine.grad, theirs.grad)


def test_topk_and_kthvalue(device: str) -> None:
    data = np.random.default_rng(6).permutation(40).astype(np.float32).reshape(4, 10)  # no ties: indices are exact
    source, reference = em.tensor(data, device=device), torch.tensor(data)
    for k, dim, largest in ((3, 1, True), (2, 0, False), (10, -1, True), (0, 1, True)):
        mine, theirs = source.topk(k, dim, largest), reference.topk(k, dim, largest)
        assert_exact(mine.values, theirs.values)
        assert_exact(mine.indices, theirs.indices)
    for k, dim, keepdim in ((1, 1, False), (4, 0, True), (10, -1, False)):
        mine, theirs = source.kthvalue(k, dim, keepdim), reference.kthvalue(k, dim, keepdim)
        assert_exact(mine.values, theirs.values)
        assert_exact(mine.indices, theirs.indices)
    # ties and NaN: the values are torch's, each index points at an element holding that value
    tied = tie_data((3, 9), 7)
    mine, theirs = em.tensor(tied, device=device).topk(4), torch.tensor(tied).topk(4)
    assert_exact(mine.values, theirs.values)
    np.testing.assert_array_equal(np.take_along_axis(tied, mine.indices.numpy(), 1), theirs.values.numpy())
    mine, theirs = em.tensor(tied, device=device).kthvalue(5, 1), torch.tensor(tied).kthvalue(5, 1)
    np.testing.assert_array_equal(mine.values.numpy(), theirs.values.numpy())
    np.testing.assert_array_equal(np.take_along_axis(tied, mine.indices.numpy()[:, None], 1)[:, 0],
                                  theirs.values.numpy())


def test_topk_kthvalue_gradients(device: str) -> None:
    data = np.random.default_rng(8).standard_normal((3, 7)).astype(np.float32)
    for call in (lambda x: x.topk(3, 1).values, lambda x: x.topk(2, 0, largest=False).values,
                 lambda x: x.kthvalue(2, 1).values, lambda x: x.kthvalue(3, 0, keepdim=True).values):
        mine = em.tensor(data, device=device, requires_grad=True)
        theirs = torch.tensor(data, requires_grad=True)
        (call(mine) * 1.5).sum().backward()
        (call(theirs) * 1.5).sum().backward()
        assert_close(mine.grad, theirs.grad)


def test_topk_of_a_long_row_with_gradient(device: str) -> None:
    """topk of a vocabulary-sized row that tracks a gradient gathers only the k values (a gather of the whole
    sorted row would be n * n work: minutes for 65536 values); values, indices and gradient as torch's."""
    data = np.random.default_rng(12).standard_normal(65536).astype(np.float32)
    mine = em.tensor(data, device=device, requires_grad=True)
    theirs = torch.tensor(data, requires_grad=True)
    mine_top, theirs_top = mine.topk(5), theirs.topk(5)
    assert_exact(mine_top.values, theirs_top.values)
    np.testing.assert_array_equal(mine_top.indices.numpy(), theirs_top.indices.numpy())
    (mine_top.values * 2.0).sum().backward()
    (theirs_top.values * 2.0).sum().backward()
    assert_close(mine.grad, theirs.grad)


def test_median_and_nanmedian(device: str) -> None:
    data = np.random.default_rng(9).permutation(24).astype(np.float32).reshape(4, 6)
    data[1, 2] = NAN
    data[2, :] = NAN
    source, reference = em.tensor(data, device=device), torch.tensor(data)
    for dim, keepdim in ((1, False), (0, True), (-1, True)):
        for name in ("median", "nanmedian"):
            mine, theirs = getattr(source, name)(dim, keepdim), getattr(reference, name)(dim, keepdim)
            assert_exact(mine.values, theirs.values)
            if name == "nanmedian" and dim != 0:  # torch's index for an all-NaN row depends on its nth_element
                mine_indices, theirs_indices = mine.indices.numpy(), theirs.indices.numpy()
                assert mine_indices[2] == 0
                mine_indices[2] = theirs_indices[2]
                np.testing.assert_array_equal(mine_indices, theirs_indices)
            else:
                assert_exact(mine.indices, theirs.indices)
    clean = np.delete(data, [1, 2], axis=0)
    for array in (data, clean, clean[:, :5]):  # with NaN, and an even and odd count: the lower median
        assert_exact(em.tensor(array, device=device).median(), torch.tensor(array).median())
        assert_exact(em.tensor(array, device=device).nanmedian(), torch.tensor(array).nanmedian())
    integers = np.array([[5, 1, 4, 2], [7, 7, 3, 9]], dtype=np.int32)
    assert_exact(em.tensor(integers, device=device).median(1).values, torch.tensor(integers).median(1).values)
    assert_exact(em.tensor(integers, device=device).median(), torch.tensor(integers).median())
    assert np.isnan(em.tensor(np.zeros(0, np.float32), device=device).median().item())


def test_median_gradients_like_torch(device: str) -> None:
    """median(dim) sends the gradient to the returned index; median() and nanmedian() split it among the elements
    equal to the result (among the NaNs when it is NaN), as torch does."""
    cases = [
        (np.array([1.0, 3.0, 3.0, 2.0, 3.0], np.float32), lambda x: x.median()),
        (np.array([1.0, NAN, 3.0, NAN, 3.0], np.float32), lambda x: x.median()),
        (np.array([1.0, NAN, 3.0, NAN, 3.0], np.float32), lambda x: x.nanmedian()),
        (np.array([-np.inf, -np.inf, 5.0], np.float32), lambda x: x.median()),
        (np.array([[4.0, 1.0, 7.0, 2.0], [0.5, 9.0, -1.0, 3.0]], np.float32), lambda x: x.median(1).values),
        (np.array([[4.0, NAN, 7.0], [0.5, 9.0, -1.0]], np.float32), lambda x: x.nanmedian(1).values),
    ]
    for data, call in cases:
        mine = em.tensor(data, device=device, requires_grad=True)
        theirs = torch.tensor(data, requires_grad=True)
        mine_result, theirs_result = call(mine), call(theirs)
        assert_close(mine_result, theirs_result)
        (mine_result * 2.0).sum().backward()
        (theirs_result * 2.0).sum().backward()
        assert_close(mine.grad, theirs.grad)


def test_mode(device: str) -> None:
    cases = [
        (np.array([[1, 3, 3, 1, 2, 2, 5], [4, 4, 0, 4, 0, 0, 1]], np.int64), 1),
        (np.array([[1, 3, 3, 1, 2, 2, 5], [4, 4, 0, 4, 0, 0, 1]], np.int64).T.copy(), 0),
        (np.array([2.0, 2.0, 1.0, 1.0, NAN, NAN, NAN], np.float32), 0),  # each NaN counts once
        (np.array([1.0, 0.0, -0.0, 1.0], np.float32), 0),  # the value at the last index: -0.0
        (np.array([0.0, -0.0, 0.0], np.float32), 0),
        (np.array([True, False, True], np.bool_), 0),
        (np.array([7.5], np.float64), 0),
    ]
    for data, dim in cases:
        mine, theirs = em.tensor(data, device=device).mode(dim), torch.tensor(data).mode(dim)
        assert_exact(mine.values, theirs.values)
        assert_exact(mine.indices, theirs.indices)
    keep = em.tensor(cases[0][0], device=device).mode(1, keepdim=True)
    assert_exact(keep.values, torch.tensor(cases[0][0]).mode(1, keepdim=True).values)
    data = np.array([[1.0, 3.0, 3.0, 2.0, 3.0], [0.0, 0.0, 5.0, 5.0, 5.0]], np.float32)
    mine, theirs = em.tensor(data, device=device, requires_grad=True), torch.tensor(data, requires_grad=True)
    mine.mode(1).values.sum().backward()
    theirs.mode(1).values.sum().backward()
    assert_close(mine.grad, theirs.grad)


@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantile_and_nanquantile(device: str, interpolation: str) -> None:
    data = np.random.default_rng(10).standard_normal((3, 5, 4)).astype(np.float32)
    data[1, 2, 0] = NAN
    data[2, :, 3] = NAN
    q = np.array([0.0, 0.1, 0.5, 1.0 / 6.0, 0.75, 1.0], np.float32)
    source, reference = em.tensor(data, device=device), torch.tensor(data)
    checks = []
    for name in ("quantile", "nanquantile"):
        for quantiles, dim, keepdim in ((0.3, 1, False), (q, 1, True), (q, None, False), (0.5, None, True),
                                        (np.float32(0.25), -1, False)):
            mine_q = em.tensor(quantiles, device=device) if isinstance(quantiles, np.ndarray) else quantiles
            theirs_q = torch.tensor(quantiles) if isinstance(quantiles, np.ndarray) else quantiles
            mine = getattr(source, name)(mine_q, dim, keepdim, interpolation=interpolation)
            theirs = getattr(reference, name)(theirs_q, dim, keepdim, interpolation=interpolation)
            checks.append((mine, theirs))
    for mine, theirs in checks:
        assert_close(mine, theirs, atol=1e-6, rtol=1e-6)
    # the rank of nearest is rounded half to even (torch.round): 0.5 / 3 * 3 = 0.5 -> 0, 2.5 -> 2
    ranks = np.array([0.5 / 3, 2.5 / 3, 1.5 / 3], np.float32)
    line = np.arange(4, dtype=np.float32)
    assert_close(em.tensor(line, device=device).quantile(em.tensor(ranks, device=device), interpolation=interpolation),
                 torch.tensor(line).quantile(torch.tensor(ranks), interpolation=interpolation))


def test_quantile_gradients_and_float64(device: str) -> None:
    data = np.random.default_rng(11).standard_normal((4, 6))
    for interpolation in ("linear", "midpoint", "nearest"):
        mine = em.tensor(data, device=device, dtype=em.float64, requires_grad=True)
        theirs = torch.tensor(data, requires_grad=True)
        q = np.array([0.2, 0.5, 0.9])
        mine_result = mine.quantile(em.tensor(q, device=device, dtype=em.float64), 1, interpolation=interpolation)
        theirs_result = theirs.quantile(torch.tensor(q), 1, interpolation=interpolation)
        assert_close(mine_result, theirs_result, atol=1e-12, rtol=1e-12)
        (mine_result * mine_result).sum().backward()
        (theirs_result * theirs_result).sum().backward()
        assert_close(mine.grad, theirs.grad, atol=1e-10, rtol=1e-10)


def test_bad_arguments_raise_at_the_call(device: str) -> None:
    source = em.tensor([[3.0, 1.0, 2.0]], device=device)
    with pytest.raises(IndexError, match="out of range"):
        source.sort(2)
    with pytest.raises(em.ShapeError, match="k=4"):
        source.topk(4)
    with pytest.raises(em.ShapeError, match="k=0"):
        source.kthvalue(0)
    with pytest.raises(em.DTypeError, match="bool"):
        em.tensor([True, False], device=device).topk(1)
    with pytest.raises(em.DTypeError, match="float32 or float64"):
        em.tensor([1, 2], device=device).quantile(0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        source.quantile(1.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        source.quantile(em.tensor([0.5, -0.1], device=device))
    with pytest.raises(ValueError, match="interpolation"):
        source.quantile(0.5, interpolation="cubic")
    with pytest.raises(em.ShapeError, match="non-empty"):
        em.tensor(np.zeros(0, np.float32), device=device).quantile(0.5)
    with pytest.raises(em.ShapeError, match="zero-size dim"):
        em.tensor(np.zeros((2, 0), np.float32), device=device).median(1)
    with pytest.raises(em.ShapeError, match="zero-size dim"):
        em.tensor(np.zeros((2, 0), np.float32), device=device).mode(1)
