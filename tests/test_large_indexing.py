"""Gathers and masks at real sizes: a gather is written as a one-hot sum (core/advanced_indexing.take_last), which
lowering reads as one load per value (ir/lower.Lowerer._one_hot_pick), and nonzero searches the running count of
Trues; before, both compared every index with every position (a mask of 10^6 elements took 412 s)."""

import numpy as np
import pytest
import torch

import ember as em
from ember.core import sorted_writes
from ember.core.ops import Op
from ember.ir.ir import IROp, topological_nodes
from ember.ir.lower import lower_kernel
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch


def test_gathers_from_a_million_values_match_numpy(device: str) -> None:
    random = np.random.default_rng(3)
    values = random.standard_normal(1_000_003).astype(np.float32)
    index = random.integers(0, values.size, 100_000)
    np.testing.assert_array_equal(em.tensor(values, device=device).gather(0, em.tensor(index, device=device)).numpy(),
                                  values[index])
    table = random.standard_normal((262_144, 8)).astype(np.float32)  # a Gemma-sized vocabulary
    ids = random.integers(0, table.shape[0], (3, 50))
    ids[0, 0], ids[-1, -1] = 0, table.shape[0] - 1
    looked_up = em.nn.functional.embedding(em.tensor(ids, device=device), em.tensor(table, device=device))
    np.testing.assert_array_equal(looked_up.numpy(), table[ids])
    rows = em.tensor(table, device=device).index_select(0, em.tensor(ids.ravel(), device=device))
    np.testing.assert_array_equal(rows.numpy(), table[ids.ravel()])
    flags = values > 0.5
    np.testing.assert_array_equal(em.tensor(flags, device=device).gather(0, em.tensor(index, device=device)).numpy(),
                                  flags[index])


def test_masks_over_a_million_elements_match_torch(device: str) -> None:
    random = np.random.default_rng(4)
    values = random.standard_normal(1_000_003).astype(np.float32)
    values[7] = np.nan
    mask = values > 0
    np.testing.assert_array_equal(em.tensor(values, device=device)[em.tensor(mask, device=device)].numpy(),
                                  values[mask])
    # (on wgpu a smaller grid: the (count, 2) result of 630,000 rows hits lavapipe's loop limit, a clear error)
    grid = random.standard_normal((700, 900) if device.startswith("c:") else (300, 200)).astype(np.float32)
    np.testing.assert_array_equal(em.tensor(grid, device=device).nonzero().numpy(),
                                  torch.tensor(grid).nonzero().numpy())
    sparse = np.zeros(3_000_001, dtype=bool)
    sparse[[0, 1_500_000, 3_000_000]] = True
    np.testing.assert_array_equal(em.tensor(sparse, device=device).nonzero().numpy().ravel(), [0, 1_500_000, 3_000_000])
    full = np.ones(2_000_000, dtype=bool)
    np.testing.assert_array_equal(em.tensor(full, device=device).nonzero().numpy().ravel(), np.arange(2_000_000))


def test_a_gather_is_lowered_as_one_load_per_value() -> None:
    """The kernel of a gather of 1,000 values from 10^6 has no loop over the 10^6 and 32-bit indices."""
    values = em.tensor(np.arange(1_000_000, dtype=np.float32))
    picked = values.gather(0, em.tensor(np.arange(1_000) * 999))
    kernels = [item.kernel for item in kernelize([picked.node]) if isinstance(item, Launch)]
    reduces = [kernel for kernel in kernels if any(step.op is Op.SUM for step in kernel.steps)]
    assert len(reduces) == 1
    ir = lower_kernel(reduces[0], "gather")
    nodes = topological_nodes(ir.sink)
    assert not any(node.op in (IROp.REDUCE, IROp.RANGE) for node in nodes)
    assert sum(node.op is IROp.LOAD for node in nodes) == 2  # the index, then the value it names
    assert all(node.dtype.itemsize == 4 for node in nodes if node.op is IROp.GLOBAL_ID)
    np.testing.assert_array_equal(picked.numpy(), np.arange(1_000) * 999)


def test_an_embedding_of_a_large_vocabulary_is_a_pick_and_its_gradient_matches_torch(device: str) -> None:
    """A vocabulary past the staging threshold: the lookup stays one unstaged sum, lowered as one load per value
    (staged into chunks of the vocabulary it compared every id with every row: 40 s for 8192 ids of 50,000)."""
    random = np.random.default_rng(6)
    table = random.standard_normal((50_000, 16)).astype(np.float32)
    ids = random.integers(0, table.shape[0], (16, 32))
    ids[0, :4] = [0, 49_999, 7, 7]  # the ends, and a repeated id (its gradient rows add up)
    weight = em.tensor(table, device=device, requires_grad=True)
    looked_up = em.nn.functional.embedding(em.tensor(ids, device=device), weight)
    kernels = [item.kernel for item in kernelize([looked_up.node]) if isinstance(item, Launch)]
    assert len(kernels) == 1
    nodes = topological_nodes(lower_kernel(kernels[0], "embedding").sink)
    assert not any(node.op in (IROp.REDUCE, IROp.RANGE) for node in nodes)
    torch_weight = torch.tensor(table, requires_grad=True)
    expected = torch.nn.functional.embedding(torch.tensor(ids), torch_weight)
    np.testing.assert_array_equal(looked_up.numpy(), expected.detach().numpy())
    gradient = random.standard_normal(expected.shape).astype(np.float32)
    (looked_up * em.tensor(gradient, device=device)).sum().backward()
    (expected * torch.tensor(gradient)).sum().backward()
    assert weight.grad is not None and torch_weight.grad is not None
    np.testing.assert_allclose(weight.grad.numpy(), torch_weight.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_searchsorted_of_a_million_values_in_a_million_boundaries_matches_torch(device: str) -> None:
    """A binary search (log2 N gathers), not M x N comparisons (12 minutes at this size); ties, both sides, NaN and
    infinite values, a NaN boundary at the end (the largest), and rows of boundaries."""
    random = np.random.default_rng(9)
    boundaries = np.sort(random.standard_normal(1_000_000).astype(np.float32))
    boundaries[500_000:500_010] = boundaries[500_000]
    values = random.standard_normal(1_000_000).astype(np.float32)
    values[:5] = [np.nan, boundaries[0], boundaries[-1], boundaries[500_000], -np.inf]
    with_nan = np.append(boundaries, np.float32(np.nan))
    for right in (False, True):
        found = em.searchsorted(em.tensor(with_nan, device=device), em.tensor(values, device=device), right=right)
        expected = torch.searchsorted(torch.tensor(boundaries), torch.tensor(values), right=right).numpy()
        expected[np.isnan(values)] = with_nan.size  # NaN goes after everything
        np.testing.assert_array_equal(found.numpy(), expected)
    rows = np.sort(random.standard_normal((3, 2_000)).astype(np.float32), 1)
    row_values = random.standard_normal((3, 1_000)).astype(np.float32)
    np.testing.assert_array_equal(
        em.searchsorted(em.tensor(rows, device=device), em.tensor(row_values, device=device), out_int32=True).numpy(),
        torch.searchsorted(torch.tensor(rows), torch.tensor(row_values), out_int32=True).numpy())
    assert em.searchsorted(em.tensor(boundaries, device=device), 0.25).item() == np.searchsorted(boundaries, 0.25)


def test_writes_through_a_hundred_thousand_indices_match_torch(device: str) -> None:
    """Writes through a long index vector sort it and binary-search each target's entries (core/sorted_writes.py):
    10^5 indices into 10^6 elements took 62 s (setitem) and 20 s (index_add) compared pairwise. Repeated indices
    (the last write wins; sums add in input order), negative indices, leading dims, and the gradients."""
    random = np.random.default_rng(10)
    size, count = 1_000_000, 100_000
    index = random.integers(-size, size, count)
    index[:3] = [5, 5, -size]  # a repeat, and the first element through a negative index
    values = random.standard_normal(count).astype(np.float32)
    base = random.standard_normal(size).astype(np.float32)
    target = em.tensor(base, device=device)
    target[em.tensor(index, device=device)] = em.tensor(values, device=device)
    expected = base.copy()
    expected[index] = values  # numpy keeps the last of repeated indices (torch's threads leave it unspecified)
    np.testing.assert_array_equal(target.numpy(), expected)
    wrapped = index % size
    added = em.tensor(base, device=device).index_add(0, em.tensor(wrapped, device=device),
                                                     em.tensor(values, device=device))
    np.testing.assert_allclose(added.numpy(), torch.tensor(base).index_add(0, torch.tensor(wrapped),
                                                                           torch.tensor(values)).numpy(), rtol=1e-6,
                               atol=1e-6)
    # rows of a table (leading dims): an embedding-style gradient accumulation, and its gradients
    table = random.standard_normal((40_000, 8)).astype(np.float32)
    rows = random.integers(0, table.shape[0], 3_000)
    sources = random.standard_normal((3_000, 8)).astype(np.float32)
    ember_table = em.tensor(table, device=device, requires_grad=True)
    ember_sources = em.tensor(sources, device=device, requires_grad=True)
    torch_table, torch_sources = torch.tensor(table, requires_grad=True), torch.tensor(sources, requires_grad=True)
    written = ember_table.index_put((em.tensor(rows, device=device),), ember_sources, accumulate=True)
    torch_written = torch_table.index_put((torch.tensor(rows),), torch_sources, accumulate=True)
    np.testing.assert_allclose(written.numpy(), torch_written.detach().numpy(), rtol=1e-6, atol=1e-6)
    weights = random.standard_normal(table.shape).astype(np.float32)
    (written * em.tensor(weights, device=device)).sum().backward()
    (torch_written * torch.tensor(weights)).sum().backward()
    assert ember_table.grad is not None and ember_sources.grad is not None
    np.testing.assert_array_equal(ember_table.grad.numpy(), torch_table.grad.numpy())
    np.testing.assert_allclose(ember_sources.grad.numpy(), torch_sources.grad.numpy(), rtol=1e-6)
    copied = em.tensor(table, device=device).index_copy(0, em.tensor(rows, device=device),
                                                         em.tensor(sources, device=device))
    expected_copy = table.copy()
    expected_copy[rows] = sources  # (the last of repeated rows, as numpy's assignment)
    np.testing.assert_array_equal(copied.numpy(), expected_copy)


def test_the_gradient_of_a_long_gather_is_a_sorted_scatter_sum(device: str) -> None:
    """x[idx] for 10^5 of 10^6: its backward sums the gradient into the positions read (Composite.GATHER through
    core/sorted_writes.py); the chain rule compared every index with every position (28 s)."""
    random = np.random.default_rng(11)
    values = random.standard_normal(1_000_000).astype(np.float32)
    index = random.integers(0, values.size, 100_000)
    index[:4] = [3, 3, 3, 999_999]
    gradient = random.standard_normal(index.size).astype(np.float32)
    ember_values = em.tensor(values, device=device, requires_grad=True)
    (ember_values[em.tensor(index, device=device)] * em.tensor(gradient, device=device)).sum().backward()
    torch_values = torch.tensor(values, requires_grad=True)
    (torch_values[torch.tensor(index)] * torch.tensor(gradient)).sum().backward()
    assert ember_values.grad is not None and torch_values.grad is not None
    np.testing.assert_allclose(ember_values.grad.numpy(), torch_values.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_long_runs_of_one_index_sum_as_prefix_differences(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids with a Zipf law (an embedding's gradient over a 50,257-token vocabulary: "the" is a run of hundreds):
    each row's run is summed as a difference of float64 (int64) prefix sums (core/sorted_writes._prefix_difference);
    the chain rule of the one-hot pick compared every id with every row (2048 ids of 50,257 x 256: 7 s backward)."""
    random = np.random.default_rng(12)
    vocabulary, width = 50_257, 24
    ids = (random.zipf(1.3, (4, 512)) - 1) % vocabulary
    ids[0, :3] = [0, vocabulary - 1, 1]  # the ends; the padding id 1 (no gradient) is also the longest run
    assert np.bincount(ids.ravel()).max() * 4 > ids.size  # (the window form would not take these runs)
    table = random.standard_normal((vocabulary, width)).astype(np.float32)
    gradient = (random.standard_normal(ids.shape + (width,)) * 100).astype(np.float32)
    weight = em.tensor(table, device=device, requires_grad=True)
    torch_weight = torch.tensor(table, requires_grad=True)
    summed = []  # the writes summed by prefix differences
    monkeypatch.setattr(sorted_writes, "_prefix_difference",
                        lambda *args, form=sorted_writes._prefix_difference: summed.append(form(*args)) or summed[-1])
    for padding in (None, 1):
        looked_up = em.nn.functional.embedding(em.tensor(ids, device=device), weight, padding_idx=padding)
        expected = torch.nn.functional.embedding(torch.tensor(ids), torch_weight, padding_idx=padding)
        np.testing.assert_array_equal(looked_up.numpy(), expected.detach().numpy())
        (looked_up * em.tensor(gradient, device=device)).sum().backward()
        (expected * torch.tensor(gradient)).sum().backward()
        assert weight.grad is not None and torch_weight.grad is not None
        # (torch adds a run one term at a time in float32; ember's difference of float64 prefixes is rounded once)
        np.testing.assert_allclose(weight.grad.numpy(), torch_weight.grad.numpy(), rtol=1e-5, atol=1e-3)
        if padding is not None:
            assert not weight.grad.numpy()[padding].any()
        assert len(summed) == 1 and summed.pop() is not None  # (not the comparison of every id with every row)
        weight.grad, torch_weight.grad = None, None
    # integers: exact, also where the sums wrap around
    counts = np.full(vocabulary, 2**62, np.int64)
    flat = ids.ravel()
    increments = random.integers(2**61, 2**62, flat.size)
    added = em.tensor(counts, device=device).index_add(0, em.tensor(flat, device=device),
                                                       em.tensor(increments, device=device))
    np.testing.assert_array_equal(added.numpy(), torch.tensor(counts).index_add(0, torch.tensor(flat),
                                                                                torch.tensor(increments)).numpy())
