"""Long rows that are not a whole number of vectors (a vocabulary of 50,257 logits, rows of 1,001): elementwise kernels
loop over each row on a CPU (ir/opt.long_row_loop), a reduce's lanes take the whole vectors and a short loop the rest
(ir/lower.Lowerer._lower_reduce), and the first stage of a long reduce reduces its whole chunks without masks and the
elements after them on their own (core/staged_reduce._chunks_and_tail); values against torch on every device, NaN
and inf included."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

import ember as em
from ember.capabilities import DeviceInfo
from ember.core.errors import CompileFallbackWarning
from ember.core.staged_reduce import FIRST_STAGE_CHUNK, STAGE_THRESHOLD
from tests.test_optimizations import C_VECTORS, _dummy, rendered_c

SHAPES = [(64, 1001), (3, 50_257), (4, 3, 1001), (2, 16_385)]


def _kernels(source: str) -> list[str]:
    """The rendered kernels of a source, one string each."""
    return [part for part in re.split(r"(?=\bvoid \w+\()", source) if part.startswith("void ")]


def test_an_elementwise_kernel_over_long_odd_rows_loops_over_each_row_in_c() -> None:
    source = rendered_c((_dummy(512, 1001) - _dummy(512, 1)).exp())
    assert "for (int gid = 0; gid < 512;" in source and "< 1001;" in source  # a work item per row, a loop along it
    assert "%1001" not in source and "/1001" not in source  # no division per element
    # rows up to MAX_ROW_OUTPUTS are whole-row tiles, whole vectors are vector tiles, one row is a flat loop already
    assert "for (int loop" not in rendered_c(_dummy(1001) * 2) and "for (int loop" not in rendered_c(_dummy(64, 1000) * 2)
    assert "for (int loop" not in rendered_c(_dummy(64, 201) * 2)
    # a device whose loops stop early (wgpu on llvmpipe) keeps an item per element
    limited = DeviceInfo(compute_units=2, preferred_vector_width=8, vector_ops=C_VECTORS.vector_ops,
                         max_loop_iterations=1000)
    assert "< 1001;" not in rendered_c(_dummy(512, 1001) * 2, limited)


def test_the_first_stage_of_a_long_sum_loads_no_mask() -> None:
    kernels = _kernels(rendered_c(_dummy(4, 50_257).exp().sum(1)))
    whole = 50_257 // FIRST_STAGE_CHUNK  # 785 whole chunks a row, then 17 elements
    first = next(kernel for kernel in kernels if f"gid < {4 * whole};" in kernel)
    assert "<50257" not in first and "?data" not in first  # no masked load
    assert "*(const ember_float32x8_u*)(data1+" in first  # the chunks loaded and summed in vectors
    tail = next(kernel for kernel in kernels if "gid < 4;" in kernel and f"+{whole * FIRST_STAGE_CHUNK})" in kernel)
    assert "< 17;" in tail


def test_a_row_reduce_that_vectors_do_not_divide_takes_vectors_and_a_tail() -> None:
    source = rendered_c(_dummy(64, 1003).sum(1))  # 125 vectors of 8 lanes, then 3 elements
    assert "ember_float32x8 acc" in source and "loop1 < 125;" in source and "loop2 < 3;" in source
    assert "(loop2+1000)" in source
    softmax = rendered_c(_dummy(64, 1003).softmax(1))  # one kernel, its max and its sum in lanes
    assert softmax.count("void ") == 1 and softmax.count("ember_float32x8 acc") == 2
    assert "ember_float32x" not in rendered_c(_dummy(64, 17).sum(1))  # a short row: one scalar loop


@pytest.mark.parametrize(("shape", "dims"), [((2, 1000), None), ((3, 4, 1003), (0, 2)), ((5, 1001, 2), (0, 1))],
                         ids=["2x1000 all", "3x4x1003 (0, 2)", "5x1001x2 (0, 1)"])
def test_a_reduce_of_several_axes_whose_lanes_have_a_tail_builds_and_matches_torch(
        device: str, cold: None, shape: tuple[int, ...], dims: tuple[int, ...] | None) -> None:
    """The tail's loops are its own (ir/lower.py): a sum of 2 rows of 1,000 in lanes of 16 (62 vectors a row and
    8 elements) rendered a row's offset outside the loop that computed it; the C and OpenCL compilers rejected the
    kernel and it was built again with narrower vectors, after a warning."""
    values = np.random.default_rng(shape[-1]).standard_normal(shape).astype(np.float32)
    x, tx = em.tensor(values, device=device), torch.tensor(values)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallbackWarning)
        for ember_result, torch_result in [(x.sum(dims), tx.sum(dims) if dims else tx.sum()),
                                           (x.amax(dims), tx.amax(dims) if dims else tx.amax())]:
            np.testing.assert_allclose(ember_result.numpy(), torch_result.numpy(), rtol=1e-5, atol=1e-4)
    source = rendered_c(_dummy(*shape).sum(dims))  # (8 lanes: lanes and a tail where 8 does not divide the axis)
    if (dims is None or len(shape) - 1 in dims) and shape[-1] % 8:
        assert "ember_float32x8 acc" in source and "+1000)" in source  # (the tail: 3 or 1 elements after 1,000)


@pytest.mark.parametrize("shape", SHAPES)
def test_elementwise_ops_on_long_odd_rows_match_torch(device: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(shape) + shape[-1])
    values = rng.standard_normal(shape).astype(np.float32)
    values.reshape(-1)[[0, 7, -1]] = [np.nan, np.inf, -np.inf]
    row = rng.standard_normal(shape[:-1] + (1,)).astype(np.float32)
    x, r = em.tensor(values, device=device), em.tensor(row, device=device)
    tx, tr = torch.tensor(values), torch.tensor(row)
    np.testing.assert_allclose((x - r).exp().numpy(), (tx - tr).exp().numpy(), rtol=2e-6, atol=0)
    # (a multiply and an add may be fused into one rounding, as gcc contracts them: within an ulp of the product)
    np.testing.assert_allclose((x * r + 1).numpy(), (tx * tr + 1).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(em.where(x > r, x, r).numpy(), torch.where(tx > tr, tx, tr).numpy())
    integers = rng.integers(-1000, 1000, shape, dtype=np.int32)
    np.testing.assert_array_equal((em.tensor(integers, device=device) * 3 - 1).numpy(), integers * 3 - 1)
    if len(shape) == 2:  # a transposed operand: strided loads along the loop
        flipped = rng.standard_normal(shape[::-1]).astype(np.float32)
        np.testing.assert_array_equal((em.tensor(flipped, device=device).T + x).numpy(),
                                      (torch.tensor(flipped).T + tx).numpy())


@pytest.mark.parametrize("extent", [1003, 4099, STAGE_THRESHOLD + 1, 50_257, 100_003])
def test_long_reduces_with_a_tail_match_torch(device: str, extent: int) -> None:
    rng = np.random.default_rng(extent)
    values = rng.standard_normal((3, extent)).astype(np.float32)
    x, t = em.tensor(values, device=device), torch.tensor(values)
    np.testing.assert_allclose(x.sum(1).numpy(), t.sum(1).numpy(), rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(x.amax(1).numpy(), t.amax(1).numpy())
    np.testing.assert_array_equal(x.argmax(1).numpy(), t.argmax(1).numpy())
    np.testing.assert_allclose(x.logsumexp(1).numpy(), t.logsumexp(1).numpy(), rtol=1e-6)
    np.testing.assert_allclose((x * 1e-3 + 1).prod(1).numpy(), (t * 1e-3 + 1).prod(1).numpy(), rtol=1e-4)
    np.testing.assert_allclose(x.softmax(1).numpy(), t.softmax(1).numpy(), rtol=1e-5, atol=1e-12)
    # the largest value, NaN and inf in the tail (the elements after the last whole chunk)
    values[0, -1], values[1, -1], values[2, -1] = 100.0, np.nan, np.inf
    x, t = em.tensor(values, device=device), torch.tensor(values)
    np.testing.assert_array_equal(x.amax(1).numpy(), t.amax(1).numpy())
    np.testing.assert_array_equal(x.argmax(1).numpy(), t.argmax(1).numpy())
    np.testing.assert_array_equal(np.isnan(x.sum(1).numpy()), np.isnan(t.sum(1).numpy()))
    assert x.sum(1).numpy()[2] == np.inf
    integers = rng.integers(-2**20, 2**20, (2, extent), dtype=np.int32)
    np.testing.assert_array_equal(em.tensor(integers, device=device).sum(1).numpy(), integers.sum(1))
    np.testing.assert_array_equal(em.tensor(integers, device=device).amax(1).numpy(), integers.max(1))
    # over the leading dim (its partials laid out parts first)
    columns = rng.standard_normal((extent, 3)).astype(np.float32)
    np.testing.assert_allclose(em.tensor(columns, device=device).sum(0).numpy(), columns.sum(0, dtype=np.float64),
                               rtol=1e-5, atol=1e-3)
    zeros = np.full((2, extent), -0.0, np.float32)
    np.testing.assert_array_equal(np.signbit(em.tensor(zeros, device=device).sum(1).numpy()),
                                  np.signbit(torch.tensor(zeros).sum(1).numpy()))


def test_cross_entropy_over_a_vocabulary_of_50257_matches_torch(device: str) -> None:
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((8, 50_257)).astype(np.float32) * 3
    targets = np.array([0, 50_256, -100, 123, 45_678, 50_255, 7, -100])
    x = em.tensor(logits, device=device, requires_grad=True)
    loss = em.nn.functional.cross_entropy(x, em.tensor(targets, device=device))
    loss.backward()
    tx = torch.tensor(logits, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(tx, torch.tensor(targets))
    expected.backward()
    np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-6)
    assert x.grad is not None and tx.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-10)


@pytest.mark.parametrize("length", [65, 257, 1001, 20_003])
def test_scans_of_long_rows_match_torch(device: str, length: int) -> None:
    """cumsum, cumprod and logcumsumexp in blocks (reductions.SCAN_BLOCK) and their totals' scans, against torch's
    float64; a NaN part-way along a row is carried to its end."""
    rng = np.random.default_rng(length)
    values = rng.standard_normal((3, length)).astype(np.float32)
    x, t = em.tensor(values, device=device), torch.tensor(values, dtype=torch.float64)
    scale = np.sqrt(length)
    np.testing.assert_allclose(x.cumsum(1).numpy(), t.cumsum(1).numpy(), rtol=1e-5, atol=2e-6 * scale)
    np.testing.assert_allclose(x.cumsum(0).numpy(), t.cumsum(0).numpy(), rtol=1e-5, atol=1e-5)
    near_one = (values * 1e-3 + 1).astype(np.float32)
    np.testing.assert_allclose(em.tensor(near_one, device=device).cumprod(1).numpy(),
                               torch.tensor(near_one, dtype=torch.float64).cumprod(1).numpy(), rtol=2e-5)
    np.testing.assert_allclose(x.logcumsumexp(1).numpy(), t.logcumsumexp(1).numpy(), rtol=1e-5, atol=1e-5)
    values[1, length // 2] = np.nan
    scanned = em.tensor(values, device=device).cumsum(1).numpy()
    assert np.isnan(scanned[1, length // 2:]).all() and not np.isnan(scanned[1, :length // 2]).any()
    integers = rng.integers(-1000, 1000, (2, length))
    np.testing.assert_array_equal(em.tensor(integers, device=device).cumsum(1).numpy(), integers.cumsum(1))


def test_a_sum_of_twenty_million_values_with_a_tail_matches_float64(device: str) -> None:
    """20,000,003 values (a first stage of 312,500 whole chunks and a tail of 3, the largest value in the tail): the
    staged sum, maximum and argmax against numpy's float64, and a NaN in the tail."""
    rng = np.random.default_rng(7)
    values = rng.standard_normal(20_000_003).astype(np.float32)
    values[-2] = 50.0
    x = em.tensor(values, device=device).realize()
    assert abs(x.sum().item() - values.sum(dtype=np.float64)) <= 1e-6 * np.abs(values).sum(dtype=np.float64)
    assert x.max().item() == 50.0 and x.argmax().item() == 20_000_001
    values[-1] = np.nan
    assert np.isnan(em.tensor(values, device=device).sum().item())
