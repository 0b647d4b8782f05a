"""Reductions at real sizes: long reduces run in stages (core/staged_reduce.py) and stay exact or as accurate as
torch's; 64-bit loop counters where an extent passes 2**31; wgpu's limits give errors, never wrong answers."""

import math

import numpy as np
import pytest
import torch

import ember as em
from ember.backends.registry import REGISTRY
from ember.core.errors import DeviceError
from ember.core.ops import Op
from ember.core.staged_reduce import (
    FIRST_STAGE_CHUNK,
    MAX_FIRST_STAGE_CHUNK,
    PARTIALS_LIMIT,
    STAGE_THRESHOLD,
    stage_extents,
)
from ember.ir.group_reduce import group_stage_extents
from ember.ir.lower import lower_kernel
from ember.scheduler.kernelize import kernelize
from ember.scheduler.devices import get_device
from ember.scheduler.program import Launch
from tests.helpers import assert_close, scheduled_launches
from tests.test_optimizations import _dummy, rendered_c

WGPU_ELEMENTS = 30_000_000  # float32 values a wgpu (lavapipe) buffer holds: 128 MiB per binding


def count_kernels(*tensors: em.Tensor) -> int:
    with em.profile() as record:
        em.realize(*tensors)
    return len(record.kernels)


def staged_kernels(extent: int, exact: bool = False) -> int:
    """The kernels of a staged reduce of `extent` elements to one: one a stage, and one more for the elements after
    the first stage's whole chunks, where there are some (reduced on their own, so the first stage loads no mask)."""
    stages = stage_extents(extent, exact=exact)
    return len(stages) + (extent % stages[0] != 0)


def float32_ulp(value: float) -> float:
    return float(np.spacing(np.float32(abs(value))))


def test_stage_extents_cover_the_reduce_in_short_stages() -> None:
    for extent in (STAGE_THRESHOLD + 1, 20_000, 10**8, 2**31 + 5):
        extents = stage_extents(extent)
        assert extents[0] <= max(FIRST_STAGE_CHUNK, -(-extent // PARTIALS_LIMIT)) and all(
            chunk <= 16 for chunk in extents[1:])
        assert math.prod(extents) >= extent and math.prod(extents[1:]) < extent
    # many outputs (a matmul with a long inner dim): longer first chunks, so the partials stay bounded
    extents = stage_extents(70_000, outputs=256 * 256)
    assert 256 * 256 * -(-70_000 // extents[0]) <= PARTIALS_LIMIT and extents[0] <= MAX_FIRST_STAGE_CHUNK


def test_sum_of_ones_is_exact_and_mean_of_ones_is_one(device: str) -> None:
    total = em.ones(20_000_000, device=device).sum()
    mean = em.ones(4000, 5000, device=device).mean()
    assert total.item() == 20_000_000.0  # a single float32 accumulator stops at 2**24
    assert mean.item() == 1.0
    assert em.ones(100_000, device=device).sum().item() == 100_000.0
    assert em.ones(65_536, device=device).sum().item() == 65_536.0


def test_float32_sum_of_random_values_is_as_accurate_as_torch(device: str) -> None:
    count = WGPU_ELEMENTS if device.startswith("wgpu") else 10**8
    values = torch.rand(count, generator=torch.Generator().manual_seed(7))
    exact = values.double().sum().item()
    torch_error = abs(values.sum().item() - exact)
    x = em.tensor(values.numpy(), device=device)
    total, maximum, index, minimum, minimum_index = results = (x.sum(), x.max(), x.argmax(), x.min(), x.argmin())
    em.realize(*results)
    # torch sums pairwise; its error (or two float32 ulps of the sum, where torch is lucky) bounds ember's
    assert abs(total.item() - exact) <= max(torch_error, 2 * float32_ulp(exact)), (total.item(), exact, torch_error)
    assert maximum.item() == values.max().item() and index.item() == values.argmax().item()
    assert minimum.item() == values.min().item() and minimum_index.item() == values.argmin().item()


def test_max_and_argmax_over_long_rows(device: str) -> None:
    values = torch.randn(4, 300_000, generator=torch.Generator().manual_seed(3))
    values[1, 123_456] = 50.0
    values[2, 299_999] = 60.0
    values[3, :] = values[3, 17]  # ties: the first index wins, as in torch
    x = em.tensor(values.numpy(), device=device)
    maximum, index = x.max(1)
    minimum, minimum_index = x.min(1)
    assert_close(maximum.numpy(), values.max(1).values.numpy(), atol=0, rtol=0)
    assert index.tolist() == values.argmax(1).tolist()
    assert_close(minimum.numpy(), values.min(1).values.numpy(), atol=0, rtol=0)
    assert minimum_index.tolist() == values.argmin(1).tolist()
    assert_close(x.sum(1).numpy(), values.double().sum(1).float().numpy(), atol=1e-3, rtol=1e-5)


def test_matmul_with_a_long_inner_dim_and_softmax_over_a_long_row(device: str) -> None:
    generator = torch.Generator().manual_seed(5)
    left, right = torch.rand(1, 70_000, generator=generator), torch.rand(70_000, 1, generator=generator)
    product = em.tensor(left.numpy(), device=device) @ em.tensor(right.numpy(), device=device)
    assert_close(product.numpy(), (left.double() @ right.double()).float().numpy(), atol=0, rtol=1e-6)
    assert (em.ones(1, 70_000, device=device) @ em.ones(70_000, 1, device=device)).item() == 70_000.0
    row = torch.randn(2, 100_000, generator=generator)
    softmax = em.tensor(row.numpy(), device=device).softmax(-1)
    assert_close(softmax.sum(-1).numpy(), np.ones(2, np.float32), atol=1e-5, rtol=0)
    assert_close(softmax.numpy(), row.softmax(-1).numpy(), atol=1e-9, rtol=1e-4)
    zeros = em.zeros(1, 100_000, device=device).softmax(-1).sum()
    assert abs(zeros.item() - 1.0) < 1e-4


def test_a_matmul_with_an_inner_dim_past_the_stage_threshold_is_tiled(device: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A language model's output layer backward (grad @ W over a 50,257-token vocabulary) and a linear layer's
    weight gradient over many tokens reduce past STAGE_THRESHOLD: the first stage lays its partials out parts first
    ([parts, M, N]), so its work items run along N and the kernel takes the matmul's vector tile; parts last
    ([M, N, parts]) strode through each chunk at 0.2 GFLOP/s (256 x 50,257 @ 50,257 x 256: 33 s, now ~0.05 s).
    Values against float64 products, both layouts of B, and a sum over leading rows (the same layout)."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    random = np.random.default_rng(13)
    inner = STAGE_THRESHOLD * 3 + 7  # (padded to whole chunks)
    source = rendered_c(_dummy(37, inner) @ _dummy(inner, 24))  # the C of its stages for an 8-lane CPU
    assert source.count("ember_float32x8 acc") >= 12  # the tile's 6 rows x 2 vectors of accumulators
    assert "(*(const ember_float32x8_u*)(data" in source  # vector loads of B's rows (parts last: none, 1 accumulator)
    left = random.standard_normal((37, inner)).astype(np.float32)
    right = random.standard_normal((inner, 24)).astype(np.float32)
    expected = left.astype(np.float64) @ right.astype(np.float64)
    for product in (em.tensor(left, device=device) @ em.tensor(right, device=device),
                    em.tensor(left, device=device) @ em.tensor(np.ascontiguousarray(right.T), device=device).T):
        assert_close(product.numpy(), expected, atol=2e-3, rtol=1e-5)
    rows = random.standard_normal((inner, 40)).astype(np.float32)
    assert_close(em.tensor(rows, device=device).sum(0).numpy(), rows.astype(np.float64).sum(0), atol=1e-3, rtol=1e-5)


def test_nan_propagates_through_matmul_and_long_reductions(device: str) -> None:
    nan = float("nan")
    left = em.tensor([nan, 0.0], device=device)
    for right in (em.tensor([0.0, 1.0], device=device), em.arange(2, device=device).float(),
                  em.eye(2, device=device)[1]):
        assert math.isnan((left @ right).item())
        assert math.isnan((left.reshape(1, 2) @ right.reshape(2, 1)).item())
    values = np.ones(100_000, np.float32)
    values[54_321] = nan
    x = em.tensor(values, device=device)
    assert math.isnan(x.sum().item()) and math.isnan(x.max().item()) and x.argmax().item() == 54_321


def test_ordinary_reductions_stay_one_kernel_and_long_ones_are_staged(device: str) -> None:
    x = em.ones(128, 128, device=device)  # STAGE_THRESHOLD elements: one kernel, as before
    assert count_kernels(x.sum()) == 1 and count_kernels(x.softmax(-1)) == 1
    # (values in a buffer: a sum of a constant's whole chunks folds)
    longer = em.tensor(np.ones(STAGE_THRESHOLD + 1, np.float32), device=device).realize()
    # (a device that reduces rows by workgroups, a GPU, takes its own stages: partials per group, then one group)
    stages = group_stage_extents(STAGE_THRESHOLD + 1, 1, em.float32, get_device(device).info)
    assert count_kernels(longer.sum()) == (len(stages) if stages else staged_kernels(STAGE_THRESHOLD + 1)) > 1
    assert longer.sum().item() == STAGE_THRESHOLD + 1


def test_exact_reduces_take_long_stages_and_match_torch(device: str) -> None:
    """A maximum or an integer sum has no rounding to keep short: its stages are MAX_FIRST_STAGE_CHUNK long, so the
    argmax of a 262,144-token vocabulary is 4 kernels (a maximum and the first index holding it, two stages each),
    with torch's index for ties and NaN; an int64 sum of 3*10^7 values past 2**40 is numpy's, exactly, and an int32
    maximum runs in its stages."""
    assert stage_extents(262_144, exact=True) == [MAX_FIRST_STAGE_CHUNK, 64]
    assert stage_extents(10**8, exact=True)[0] == MAX_FIRST_STAGE_CHUNK and len(stage_extents(10**8, exact=True)) == 3
    values = torch.randn(262_144, generator=torch.Generator().manual_seed(5))
    values[[1_000, 200_000]] = 9.0  # a tie: the first index, as torch
    logits = em.tensor(values.numpy(), device=device).realize()
    index = logits.argmax()
    if group_stage_extents(262_144, 1, em.float32, get_device(device).info) is None:
        assert count_kernels(index) == 4
    assert index.item() == values.argmax().item() == 1_000
    values[150_000] = float("nan")
    with_nan = em.tensor(values.numpy(), device=device)
    assert with_nan.argmax().item() == values.argmax().item() == 150_000 and math.isnan(with_nan.max().item())
    count = 3 * 10**6 if device.startswith("wgpu") else 3 * 10**7
    integers = np.random.default_rng(9).integers(-2**40, 2**40, size=count, dtype=np.int64)
    if not device.startswith("wgpu"):  # (wgpu has no int64)
        assert em.tensor(integers, device=device).sum().item() == int(integers.sum())
        assert em.tensor(integers, device=device).max().item() == int(integers.max())
    small = (integers % 1000).astype(np.int32)
    assert em.tensor(small, device=device).sum().item() == int(small.sum())
    # an int32 maximum's stages are kernels of their own (a stage nested in the next ran every element in one work
    # item: serial on c, past wgpu's loop limit)
    assert em.tensor(small, device=device).max().item() == int(small.max())
    assert count_kernels(em.tensor(small, device=device).realize().max()) == staged_kernels(count, exact=True) \
        or group_stage_extents(count, 1, em.int32, get_device(device).info) is not None


def test_gradients_of_staged_reductions_are_torch_gradients(device: str) -> None:
    values = torch.rand(40_000, generator=torch.Generator().manual_seed(11))
    values[[5, 30_000]] = 2.0  # a tie for the maximum: torch shares the gradient between them
    x = em.tensor(values.numpy(), device=device, requires_grad=True)
    reference = values.clone().requires_grad_(True)
    (x.sum() * 3 + x.max()).backward()
    (reference.sum() * 3 + reference.max()).backward()
    assert_close(x.grad.numpy(), reference.grad.numpy(), atol=1e-6, rtol=0)


def test_a_stage_reads_a_run_of_adjacent_reduced_axes_as_consecutive_elements() -> None:
    """A batch norm's statistics over [N, C, H, W] (axes 0, 2, 3) in stages: H and W are reduced as one axis, so a
    chunk of the first stage is consecutive elements of an H x W plane. Split, every chunk's index went through a
    division and a remainder by W (28) and the loads were gathered (8 x 128 x 28 x 28: 401 -> 81 us a stage)."""
    from ember.core.functional import normalization_total
    from ember.core.staged_reduce import merged_reduced_runs

    assert merged_reduced_runs((8, 128, 28, 28), (0, 2, 3)) == ((8, 128, 784), (0, 2))
    assert merged_reduced_runs((2, 3, 4, 5, 6), (0, 1, 3)) == ((6, 4, 5, 6), (0, 2))
    assert merged_reduced_runs((2, 3, 4), (0, 2)) == ((2, 3, 4), (0, 2))
    source = rendered_c(normalization_total(_dummy(8, 128, 28, 28), (0, 2, 3)))
    assert "%28)" not in source and "/28)" not in source and "%7)" not in source
    # the backward's sums of grad and grad * xhat (one reduce of grad times [1, xhat]): H x W merged too
    from ember.autograd.rules import _grad_totals

    for total in _grad_totals(_dummy(8, 128, 28, 28), _dummy(8, 128, 28, 28), (0, 2, 3)):
        assert total.shape == (1, 128, 1, 1)
        source = rendered_c(total)
        assert "%28)" not in source and "/28)" not in source and "%7)" not in source


@pytest.mark.parametrize(("shape", "axes"), [((8, 128, 28, 28), (0, 2, 3)), ((6, 5, 13, 17), (0, 2, 3)),
                                             ((3, 40, 7, 11), (0, 1, 3)), ((30, 4, 9, 2), (0, 1)),
                                             ((5, 7, 9, 11), (1, 2, 3)), ((4, 6, 50), (0, 2))])
def test_staged_sums_over_merged_axes_match_float64(device: str, shape: tuple[int, ...],
                                                    axes: tuple[int, ...]) -> None:
    """The normalizations' staged sums (more than 256 values per output), over reduced axes adjacent in runs and
    apart, against numpy's float64 sums; the kept dims stay where they were, as size-1 dims at the reduced axes."""
    from ember.core.functional import normalization_total

    data = (np.random.default_rng(5).standard_normal(shape) * 3 + 1).astype(np.float32)
    total = normalization_total(em.tensor(data, device=device), axes)
    expected = data.astype(np.float64).sum(axis=axes, keepdims=True)
    assert total.shape == expected.shape
    scale = np.abs(data).astype(np.float64).sum(axis=axes, keepdims=True)
    assert np.all(np.abs(total.numpy() - expected) <= 1e-6 * scale + 1e-6)


def test_a_sum_over_rows_takes_several_vectors_of_a_row_per_work_item() -> None:
    """A bias's gradient (columns summed over rows) on a vector CPU: each work item sums the most vectors of a row,
    8 down to 2, that divide it (ir/opt._strided_reduce_tile), not one 64-byte piece of every row (a row of 1000:
    5 vectors of 8 lanes, where 8, 4 and 2 left one); rows that are no whole number of such tiles keep one vector,
    and a product that shares loads (a matrix-vector product) is not widened."""
    from ember.ir.opt import choose_plan
    from tests.test_optimizations import C_VECTORS

    def plan_of(tensor: em.Tensor) -> tuple[int, ...] | None:
        items = [item for item in kernelize([tensor.node]) if isinstance(item, Launch)]
        assert len(items) == 1
        return choose_plan(items[0].kernel, "kernel", C_VECTORS)[0].upcast

    assert plan_of(_dummy(2048, 512).sum(0)) == (64,)  # (8 vectors of 8 lanes)
    assert plan_of(_dummy(8, 300, 48).sum((0, 1))) == (24,)  # (48 = 6 vectors: 3 a work item, 2 work items)
    assert plan_of(_dummy(4096, 1000).exp().sum(0)) == (40,)  # (125 vectors: 5 a work item)
    assert plan_of(_dummy(64, 40).sum(0)) == (8,)  # (5 vectors: one a work item)
    assert plan_of(_dummy(512, 256) @ _dummy(256, 1)) != (64, 1)


@pytest.mark.parametrize("shape", [(8192, 1024), (4096, 1000), (2048, 512), (1000, 96), (3, 777, 80), (70_000, 64)])
def test_sums_over_rows_match_numpy(device: str, shape: tuple[int, ...]) -> None:
    """Columns summed over rows at real sizes (a bias's gradient over batch x sequence rows; 70,000 rows: staged)
    and over two leading axes, against numpy's float64 sums, and a Linear's bias gradient against torch's."""
    data = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    axes = tuple(range(len(shape) - 1))
    total = em.tensor(data, device=device).sum(axes)
    expected = data.astype(np.float64).sum(axis=axes)
    scale = np.abs(data).astype(np.float64).sum(axis=axes)
    assert np.all(np.abs(total.numpy() - expected) <= 2e-6 * scale + 1e-6)
    if len(shape) == 2 and shape[0] <= 8192:
        layer, reference = em.nn.Linear(shape[1], 3).to(device), torch.nn.Linear(shape[1], 3)
        rows = em.tensor(data, device=device, requires_grad=True)
        layer(rows).square().sum().backward()
        reference.weight.data = torch.tensor(layer.weight.numpy())
        reference.bias.data = torch.tensor(layer.bias.numpy())
        torch_rows = torch.tensor(data, requires_grad=True)
        reference(torch_rows).square().sum().backward()
        assert_close(layer.bias.grad, reference.bias.grad, atol=1e-2, rtol=1e-4)
        assert_close(rows.grad, torch_rows.grad, atol=1e-4, rtol=1e-4)


def test_int64_sum_past_two_to_the_31_uses_64_bit_counters(device: str) -> None:
    count = 2**31 + 5
    values = em.arange(count, dtype=em.int64, device=device)  # computed in the kernel: no buffer behind it
    if device.startswith("wgpu"):
        with pytest.raises(DeviceError, match=r"2\*\*31"):
            values.sum().item()
        return
    assert values.sum().item() == count * (count - 1) // 2
    assert em.ones(count, dtype=em.int64, device=device).sum().item() == count  # (a constant's sum folds)


def test_an_unstaged_reduce_past_two_to_the_31_is_lowered_with_64_bit_indices() -> None:
    ones = em.ones(2**31 + 5, dtype=em.int64)
    (item,) = [item for item in kernelize([ones._apply(Op.SUM, arg=(0,)).node]) if isinstance(item, Launch)]
    assert lower_kernel(item.kernel, "long_sum").index_dtype == em.int64
    small = em.ones(2**20, dtype=em.int64)
    (item,) = [item for item in kernelize([small._apply(Op.SUM, arg=(0,)).node]) if isinstance(item, Launch)]
    assert lower_kernel(item.kernel, "short_sum").index_dtype == em.int32


def test_ptx_of_a_sum_past_two_to_the_31_assembles_with_64_bit_counters() -> None:
    device = REGISTRY.device("dummy:ptx")
    if device.info.extra.get("compile_check") != "yes":
        pytest.skip("ptxas is not on PATH")
    device.clear()
    em.ones(2**31 + 5, dtype=em.int64, device="dummy:ptx").sum().realize()  # each kernel assembled by ptxas
    first = device.rendered[0][1]
    assert "setp.lt.s64" in first and "2147483653" in first


def test_wgpu_refuses_a_kernel_past_llvmpipes_loop_limit() -> None:
    try:
        device = REGISTRY.device("wgpu:0")
    except Exception:  # noqa: BLE001 - no wgpu here
        pytest.skip("no wgpu device")
    if getattr(device, "loop_limit", None) is None:
        pytest.skip("this adapter has no loop limit")
    x = em.ones(70_000, device="wgpu")  # one reduce primitive, not staged: a loop of 70,000 iterations
    (item,) = [item for item in kernelize([x._apply(Op.SUM, arg=(0,)).node]) if isinstance(item, Launch)]
    with pytest.raises(DeviceError, match="65535"):
        device.compile(lower_kernel(item.kernel, "long_loop"))


def test_scans_over_millions_of_elements_match_numpy_and_torch(device: str) -> None:
    """cumsum and friends scan long dims in blocks (core/reductions._scan_last), not as windows over the whole dim,
    whose O(n^2) work took 89 s for a cumsum of 300,000 elements and needs 64-bit indices past 46,341."""
    random = np.random.default_rng(11)
    count = 3_000_007
    ones = em.ones(count, device=device).cumsum(0).numpy()
    np.testing.assert_array_equal(ones, np.arange(1, count + 1, dtype=np.float32))  # exact below 2**24
    values = random.standard_normal(count).astype(np.float32)
    reference = np.cumsum(values.astype(np.float64))
    assert np.abs(em.tensor(values, device=device).cumsum(0).numpy() - reference).max() < 2e-3
    columns = random.standard_normal((70_001, 3)).astype(np.float32)
    assert_close(em.tensor(columns, device=device).cumsum(0).numpy(), np.cumsum(columns.astype(np.float64), 0),
                 atol=1e-3, rtol=1e-4)
    ties = random.integers(0, 7, 100_003).astype(np.float32)
    ties[50_000] = np.nan
    for name in ("cummax", "cummin"):
        mine, theirs = getattr(em.tensor(ties, device=device), name)(0), getattr(torch.tensor(ties), name)(0)
        np.testing.assert_array_equal(mine.values.numpy(), theirs.values.numpy())
        np.testing.assert_array_equal(mine.indices.numpy(), theirs.indices.numpy())
    spread = (random.standard_normal(100_003) * 30).astype(np.float32)
    assert_close(em.tensor(spread, device=device).logcumsumexp(0).numpy(),
                 torch.tensor(spread).logcumsumexp(0).numpy(), atol=1e-3, rtol=1e-4)
    near_one = (1 + random.standard_normal(100_003) * 1e-4).astype(np.float32)
    assert_close(em.tensor(near_one, device=device).cumprod(0).numpy(),
                 np.cumprod(near_one.astype(np.float64)), rtol=1e-3)
    integers = random.integers(-2**40, 2**40, 100_003)
    np.testing.assert_array_equal(em.tensor(integers, device=device).cumsum(0).numpy(), np.cumsum(integers))


@pytest.mark.parametrize("count", [257, 4097, 1_000_003])
def test_a_long_scan_does_work_linear_in_its_length(count: int) -> None:
    """The kernels of a cumsum (and of its gradient) read O(n) elements: blocks of 64, then the blocks' totals."""
    tensor = em.ones(count, requires_grad=True)
    scanned = tensor.cumsum(0)
    flops = sum(item.kernel.flops for item in kernelize([scanned.node]) if isinstance(item, Launch))
    assert flops <= 200 * count, flops
    scanned.sum().backward()
    gradient = tensor.grad
    assert gradient is not None
    flops = sum(item.kernel.flops for item in kernelize([gradient.node]) if isinstance(item, Launch))
    assert flops <= 400 * count, flops
    np.testing.assert_array_equal(gradient.numpy()[[0, -1]], [count, 1])


def test_a_float32_product_of_millions_of_factors_near_one_is_accurate(device: str) -> None:
    # every float32 multiplication rounds the product's small cross term away the same way: a product of 10^6
    # factors 1 + 1e-4 x in float32 (any order) is ~0.7% low; accumulated in float64 it is within a few ulp
    if em.float64 not in REGISTRY.device(device).info.supported_dtypes:
        pytest.skip(f"{device} has no float64 to accumulate in (its float32 products drift as torch's do)")
    generator = np.random.default_rng(5)
    factors = (1 + generator.standard_normal(10**6).astype(np.float32) * np.float32(1e-4)).astype(np.float32)
    factors[:: 1000] = np.float32(1.0625)  # and 1000 factors far from one
    truth = np.prod(factors.astype(np.float64))
    values = em.tensor(factors, device=device)
    whole, by_rows = values.prod(), values.reshape(1000, 1000).prod(1)
    assert abs(whole.item() - truth) <= 1e-5 * truth, (whole.item(), truth)
    rows_truth = np.prod(factors.reshape(1000, 1000).astype(np.float64), axis=1)
    np.testing.assert_allclose(by_rows.numpy(), rows_truth, rtol=2e-7)
    cumulative = values[:100_000].cumprod(0).numpy()
    np.testing.assert_allclose(cumulative, np.cumprod(factors[:100_000].astype(np.float64)), rtol=1e-5)


def test_output_layer_over_a_vocabulary_past_the_stage_threshold_matches_torch(device: str) -> None:
    """A language model's output layer (cross entropy of H @ W.T over 20,011 classes, 37 rows: neither a multiple
    of a tile): the loss and both gradients against torch's."""
    random = np.random.default_rng(21)
    rows, width, vocabulary = 37, 128, STAGE_THRESHOLD + 3627
    hidden = random.standard_normal((rows, width)).astype(np.float32)
    weight = (random.standard_normal((vocabulary, width)) * 0.05).astype(np.float32)
    targets = random.integers(0, vocabulary, rows)
    h, w = em.tensor(hidden, requires_grad=True, device=device), em.tensor(weight, requires_grad=True, device=device)
    th, tw = torch.tensor(hidden, requires_grad=True), torch.tensor(weight, requires_grad=True)
    loss = em.nn.functional.cross_entropy(h @ w.T, em.tensor(targets, device=device))
    tloss = torch.nn.functional.cross_entropy(th @ tw.T, torch.tensor(targets))
    loss.backward()
    tloss.backward()
    assert abs(loss.item() - tloss.item()) < 1e-4
    assert_close(h.grad.numpy(), th.grad.numpy(), atol=1e-6, rtol=1e-4)
    assert_close(w.grad.numpy(), tw.grad.numpy(), atol=1e-7, rtol=1e-4)


def test_a_product_with_a_large_transposed_operand_reads_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """H @ W.T with W past a CPU's cache and larger than H (an output layer over a vocabulary): the tile with
    vectors along the inner dim walks its work items down H's rows fastest, so W is read from memory once instead
    of once per tile of rows; a W that fits in cache keeps the columns fastest."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    large = rendered_c(_dummy(64, 128) @ _dummy(20011, 128).T)  # W: 10 MB, 16 tiles of 4 rows of H
    assert "ember_float32x8 acc" in large and "(gid%16)" in large and "(gid/16)" in large
    small = rendered_c(_dummy(64, 128) @ _dummy(1001, 128).T)  # W: 0.5 MB
    assert "ember_float32x8 acc" in small and "(gid%16)" not in small


def test_the_output_layer_backward_evaluates_no_exp_inside_a_product_over_the_vocabulary(monkeypatch) -> None:
    """Cross entropy's gradient over a vocabulary past STAGE_THRESHOLD is read by two products (grad_H over the
    vocabulary, grad_W over the rows): it is stored once, so no kernel evaluates an exp over more elements than
    the logits (a product recomputing it would: rows x vocabulary x width)."""
    rows, width, vocabulary = 37, 64, STAGE_THRESHOLD + 3627
    h = em.tensor(np.zeros((rows, width), np.float32), device="dummy:0", requires_grad=True)
    w = em.tensor(np.zeros((vocabulary, width), np.float32), device="dummy:0", requires_grad=True)
    loss = em.nn.functional.cross_entropy(h @ w.T, em.tensor(np.arange(rows) * 97, device="dummy:0"))
    launches = scheduled_launches(loss.backward, monkeypatch)
    domains = [max(int(np.prod(step.shape)) for step in launch.kernel.steps) for launch in launches
               if any(step.op is Op.EXP2 for step in launch.kernel.steps)]
    assert domains and max(domains) <= 2 * rows * vocabulary, domains
    products = [launch for launch in launches
                if max(int(np.prod(step.shape)) for step in launch.kernel.steps) >= rows * vocabulary * width // 16]
    assert products and not any(step.op is Op.EXP2 for launch in products for step in launch.kernel.steps)
