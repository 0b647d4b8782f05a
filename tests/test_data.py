"""ember.utils.data against torch.utils.data on the same data: batches, collation, splits, samplers, workers."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
import torch.utils.data as torch_data

import ember as em
import ember.utils.data as data
from tests import data_workers


def _to_numpy(value):
    """A collated batch (ember or torch) as plain Python structure with numpy leaves."""
    if isinstance(value, (em.Tensor, torch.Tensor)):
        return value.numpy() if isinstance(value, em.Tensor) else value.detach().numpy()
    if isinstance(value, dict):
        return {key: _to_numpy(item) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value).__name__, [_to_numpy(item) for item in value]
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [_to_numpy(item) for item in value]
    return value


def _compare_leaves(ours, theirs) -> None:
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), (ours, theirs)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_array_equal(ours, theirs)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and ours.keys() == theirs.keys()
        for key in theirs:
            _compare_leaves(ours[key], theirs[key])
    elif isinstance(theirs, tuple) and len(theirs) == 2 and isinstance(theirs[0], str):
        assert ours[0] == theirs[0] and len(ours[1]) == len(theirs[1]), (ours, theirs)
        for mine, other in zip(ours[1], theirs[1]):
            _compare_leaves(mine, other)
    else:
        assert ours == theirs


@pytest.mark.parametrize("batch_size, drop_last", [(1, False), (4, False), (4, True), (7, True), (32, False)])
def test_sequential_batches_match_torch(device, batch_size, drop_last) -> None:
    rng = np.random.default_rng(0)
    features, labels = rng.standard_normal((30, 3, 2)).astype(np.float32), rng.integers(0, 5, 30)
    theirs = list(torch_data.DataLoader(torch_data.TensorDataset(torch.tensor(features), torch.tensor(labels)),
                                        batch_size=batch_size, drop_last=drop_last))
    for dataset in (data.TensorDataset(em.tensor(features, device=device), em.tensor(labels, device=device)),
                    data.TensorDataset(features, labels)):
        loader = data.DataLoader(dataset, batch_size=batch_size, drop_last=drop_last)
        ours = list(loader)
        assert len(loader) == len(theirs) == len(ours)
        for mine, other in zip(ours, theirs):
            _compare_leaves(_to_numpy(mine), _to_numpy(other))


def test_tensor_dataset_batches_see_in_place_changes(device) -> None:
    """A batch gathered from a TensorDataset of ember tensors reflects an in-place change made after earlier
    batches were read; rows of a tensor that requires grad keep the gradient's path."""
    values = em.tensor(np.arange(12, dtype=np.float32).reshape(6, 2), device=device)
    dataset = data.TensorDataset(values)
    loader = data.DataLoader(dataset, batch_size=3)
    np.testing.assert_array_equal(next(iter(loader))[0].numpy(), np.arange(6, dtype=np.float32).reshape(3, 2))
    values[1] = 100.0
    np.testing.assert_array_equal(next(iter(loader))[0].numpy(), [[0, 1], [100, 100], [4, 5]])
    weights = em.tensor(np.ones((4, 2), dtype=np.float32), device=device, requires_grad=True)
    batch = next(iter(data.DataLoader(data.TensorDataset(weights), batch_size=2, shuffle=True,
                                      generator=em.Generator().manual_seed(1))))[0]
    (batch * 3).sum().backward()
    assert sorted(weights.grad.numpy()[:, 0].tolist()) == [0.0, 0.0, 3.0, 3.0]


def test_custom_dataset_batches_match_torch() -> None:
    """A map-style dataset of (array, int, dict) samples: the slow path through default_collate, and batch_size=None
    (default_convert)."""

    class TorchSquares(torch_data.Dataset):
        def __len__(self):
            return 11

        def __getitem__(self, index):
            return data_workers.SquaresDataset(11)[index]

    ours = list(data.DataLoader(data_workers.SquaresDataset(11), batch_size=3))
    theirs = list(torch_data.DataLoader(TorchSquares(), batch_size=3))
    assert len(ours) == len(theirs) == 4
    for mine, other in zip(ours, theirs):
        _compare_leaves(_to_numpy(mine), _to_numpy(other))
    for mine, other in zip(data.DataLoader(data_workers.SquaresDataset(4), batch_size=None),
                           torch_data.DataLoader(TorchSquares(), batch_size=None)):
        _compare_leaves(_to_numpy(mine), _to_numpy(other))


Point = collections.namedtuple("Point", ["x", "y"])


def test_collate_nested_structures_match_torch() -> None:
    rng = np.random.default_rng(1)
    samples = [
        {"image": rng.standard_normal((2, 3)).astype(np.float32), "label": int(index), "weight": 0.5 * index,
         "flag": index % 2 == 0, "name": f"s{index}", "point": Point(np.int16(index), [1.0, float(index)]),
         "pair": (np.float64(index), np.arange(3, dtype=np.uint8))}
        for index in range(4)
    ]
    _compare_leaves(_to_numpy(data.default_collate(samples)), _to_numpy(torch_data.default_collate(samples)))
    _compare_leaves(_to_numpy(data.default_convert(samples[0])), _to_numpy(torch_data.default_convert(samples[0])))
    ember_tensors = [em.tensor(rng.standard_normal(3).astype(np.float32)) for _ in range(3)]
    stacked = data.default_collate(ember_tensors)
    np.testing.assert_array_equal(stacked.numpy(), np.stack([tensor.numpy() for tensor in ember_tensors]))
    with pytest.raises(TypeError, match="default_collate: batch must contain"):
        data.default_collate([object(), object()])
    with pytest.raises(RuntimeError, match="equal size"):
        data.default_collate([[1, 2], [3]])


def test_random_split_sizes_disjoint_and_torch_order() -> None:
    dataset = data.TensorDataset(np.arange(103))
    parts = data.random_split(dataset, [50, 50, 3], generator=em.Generator().manual_seed(5))
    assert [len(part) for part in parts] == [50, 50, 3]
    indices = [index for part in parts for index in part.indices]
    assert sorted(indices) == list(range(103))
    theirs = torch_data.random_split(range(103), [50, 50, 3], generator=torch.Generator().manual_seed(5))
    assert [list(part.indices) for part in parts] == [list(part.indices) for part in theirs]
    fractions = data.random_split(dataset, [0.3, 0.3, 0.4], generator=em.Generator().manual_seed(1))
    torch_fractions = torch_data.random_split(range(103), [0.3, 0.3, 0.4], generator=torch.Generator().manual_seed(1))
    assert [len(part) for part in fractions] == [len(part) for part in torch_fractions] == [31, 31, 41]
    assert int(fractions[2][0][0]) == torch_fractions[2][0]
    with pytest.raises(ValueError, match="does not equal the length"):
        data.random_split(dataset, [50, 50])


@pytest.mark.parametrize("count", [10, 11, 13])
@pytest.mark.parametrize("replicas", [1, 3, 4])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_matches_torch(count, replicas, shuffle, drop_last) -> None:
    dataset = list(range(count))
    for rank in range(replicas):
        ours = data.DistributedSampler(dataset, replicas, rank, shuffle=shuffle, seed=7, drop_last=drop_last)
        theirs = torch_data.DistributedSampler(dataset, replicas, rank, shuffle=shuffle, seed=7, drop_last=drop_last)
        for epoch in (0, 3):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs)


def test_distributed_sampler_needs_replicas_and_rank() -> None:
    with pytest.raises(RuntimeError, match="num_replicas=.*rank="):
        data.DistributedSampler(list(range(4)))
    with pytest.raises(ValueError, match="Invalid rank 2"):
        data.DistributedSampler(list(range(4)), num_replicas=2, rank=2)


def test_generator_permutations_match_torch() -> None:
    for seed in (0, 1, 12345, 2**40 + 7):
        ours, theirs = em.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for count in (0, 1, 2, 17, 1000):
            assert ours.randperm(count) == torch.randperm(count, generator=theirs).tolist()
    with pytest.raises(TypeError, match="ember.Generator"):
        data.RandomSampler(range(3), generator=torch.Generator())


def test_shuffle_properties_and_torch_order() -> None:
    features = np.arange(50)
    loader = data.DataLoader(data.TensorDataset(features), batch_size=8, shuffle=True,
                             generator=em.Generator().manual_seed(11))
    epochs = [np.concatenate([batch[0].numpy() for batch in loader]) for _ in range(3)]
    for order in epochs:
        assert sorted(order.tolist()) == features.tolist()
    assert epochs[0].tolist() != epochs[1].tolist() != epochs[2].tolist()
    again = data.DataLoader(data.TensorDataset(features), batch_size=8, shuffle=True,
                            generator=em.Generator().manual_seed(11))
    assert np.concatenate([batch[0].numpy() for batch in again]).tolist() == epochs[0].tolist()
    torch_loader = torch_data.DataLoader(torch_data.TensorDataset(torch.tensor(features)), batch_size=8,
                                         shuffle=True, generator=torch.Generator().manual_seed(11))
    for order in epochs:
        assert np.concatenate([batch[0].numpy() for batch in torch_loader]).tolist() == order.tolist()
    # without a generator: ember's global seed makes it reproducible
    unseeded = data.DataLoader(data.TensorDataset(features), batch_size=50, shuffle=True)
    em.manual_seed(3)
    first = next(iter(unseeded))[0].numpy().tolist()
    em.manual_seed(3)
    assert next(iter(unseeded))[0].numpy().tolist() == first and sorted(first) == features.tolist()
    # with replacement, num_samples: torch's draws
    ours = list(data.RandomSampler(range(7), replacement=True, num_samples=70, generator=em.Generator().manual_seed(2)))
    theirs = list(torch_data.RandomSampler(range(7), replacement=True, num_samples=70,
                                           generator=torch.Generator().manual_seed(2)))
    assert ours == theirs
    subset = list(data.SubsetRandomSampler([3, 5, 9, 11], generator=em.Generator().manual_seed(4)))
    assert subset == list(torch_data.SubsetRandomSampler([3, 5, 9, 11], generator=torch.Generator().manual_seed(4)))


def test_weighted_sampler_and_batch_sampler() -> None:
    weights = [0.0, 1.0, 3.0, 0.0, 6.0]
    draws = np.array(list(data.WeightedRandomSampler(weights, 20000, generator=em.Generator().manual_seed(0))))
    frequencies = np.bincount(draws, minlength=5) / len(draws)
    np.testing.assert_allclose(frequencies, np.array(weights) / 10, atol=0.02)
    unique = list(data.WeightedRandomSampler(weights, 3, replacement=False))
    assert sorted(unique) == [1, 2, 4]
    with pytest.raises(ValueError, match="without replacement"):
        data.WeightedRandomSampler(weights, 4, replacement=False)
    for drop_last in (False, True):
        assert list(data.BatchSampler(range(10), 3, drop_last)) == list(torch_data.BatchSampler(range(10), 3,
                                                                                                 drop_last))
        assert len(data.BatchSampler(range(10), 3, drop_last)) == len(torch_data.BatchSampler(range(10), 3, drop_last))


def test_concat_subset_and_iterable_datasets() -> None:
    first, second = data.TensorDataset(np.arange(4)), data.TensorDataset(np.arange(10, 13))
    joined = first + second
    assert len(joined) == 7 and int(joined[4][0]) == 10 and int(joined[-1][0]) == 12
    subset = data.Subset(joined, [6, 0, 5])
    assert [int(subset[position][0]) for position in range(3)] == [12, 0, 11]
    stream = data_workers.RangeStream(10)

    class TorchStream(torch_data.IterableDataset):
        def __iter__(self):
            return iter(data_workers.RangeStream(10))

    for batch_size, drop_last in ((4, False), (4, True)):
        ours = [batch.numpy().tolist() for batch in data.DataLoader(stream, batch_size=batch_size,
                                                                     drop_last=drop_last)]
        theirs = [batch.tolist() for batch in torch_data.DataLoader(TorchStream(), batch_size=batch_size, drop_last=drop_last)]
        assert ours == theirs
        assert len(data.DataLoader(stream, batch_size=batch_size, drop_last=drop_last)) == len(theirs) == len(
            list(range(0, 10 - (10 % 4 if drop_last else 0), 4)))
    with pytest.raises(ValueError, match="shuffle"):
        data.DataLoader(stream, shuffle=True)


def test_loader_argument_errors() -> None:
    dataset = data.TensorDataset(np.arange(4))
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        data.DataLoader(dataset, sampler=data.SequentialSampler(dataset), shuffle=True)
    with pytest.raises(ValueError, match="batch_sampler option is mutually exclusive"):
        data.DataLoader(dataset, batch_sampler=data.BatchSampler(range(4), 2, False), batch_size=2)
    with pytest.raises(ValueError, match="num_workers"):
        data.DataLoader(dataset, num_workers=-1)
    with pytest.raises(ValueError, match="prefetch_factor"):
        data.DataLoader(dataset, prefetch_factor=2)
    with pytest.raises(ValueError, match="size mismatch"):
        data.TensorDataset(np.arange(4), np.arange(5))


def test_workers_yield_the_same_batches_and_reraise_errors() -> None:
    """Spawned workers (2) give the batches of the main process, in order; get_worker_info and worker_init_fn work
    there; an iterable dataset split by worker id gives every sample; a worker's exception is raised again in the
    main process with its traceback; a worker that dies raises instead of hanging."""
    dataset = data_workers.SquaresDataset(13)
    single = list(data.DataLoader(dataset, batch_size=3))
    loader = data.DataLoader(dataset, batch_size=3, num_workers=2, worker_init_fn=data_workers.record_worker,
                             timeout=60)
    multi = list(loader)
    assert len(multi) == len(single) == 5
    for mine, other in zip(multi, single):
        assert isinstance(mine[0], em.Tensor) and isinstance(mine[1], em.Tensor)
        np.testing.assert_array_equal(mine[0].numpy(), other[0].numpy())
        np.testing.assert_array_equal(mine[1].numpy(), other[1].numpy())
        assert mine[2]["name"] == other[2]["name"]
    assert {int(worker) for batch in multi for worker in batch[2]["worker"].numpy()} == {0, 1}
    assert all(int(worker) == -1 for batch in single for worker in batch[2]["worker"].numpy())
    stream = sorted(value for batch in data.DataLoader(data_workers.RangeStream(9), batch_size=2, num_workers=2)
                    for value in batch.numpy().tolist())
    assert stream == list(range(9))
    ember_rows = data.TensorDataset(em.arange(12).reshape(6, 2).float())
    rows = [batch[0].numpy() for batch in data.DataLoader(ember_rows, batch_size=4, num_workers=1)]
    np.testing.assert_array_equal(np.concatenate(rows), np.arange(12, dtype=np.float32).reshape(6, 2))
    with pytest.raises(ValueError, match="(?s)in DataLoader worker process.*sample 5 is corrupt"):
        list(data.DataLoader(data_workers.FailingDataset(), batch_size=2, num_workers=1))
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        list(data.DataLoader(data_workers.DyingDataset(), batch_size=2, num_workers=1))


def test_training_loop_over_a_loader(device) -> None:
    """Linear regression by SGD over shuffled minibatches of an ember TensorDataset reaches the least squares fit."""
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((256, 3)).astype(np.float32)
    truth = np.array([[1.5], [-2.0], [0.5]], dtype=np.float32)
    targets = inputs @ truth + 0.25
    dataset = data.TensorDataset(em.tensor(inputs, device=device), em.tensor(targets, device=device))
    model = em.nn.Linear(3, 1).to(device)
    optimizer = em.optim.SGD(model.parameters(), lr=0.1)
    loader = data.DataLoader(dataset, batch_size=32, shuffle=True, generator=em.Generator().manual_seed(0))
    for _ in range(15):
        for batch_inputs, batch_targets in loader:
            optimizer.zero_grad()
            loss = ((model(batch_inputs) - batch_targets) ** 2).mean()
            loss.backward()
            optimizer.step()
    np.testing.assert_allclose(model.weight.numpy(), truth.T, atol=1e-2)
    np.testing.assert_allclose(model.bias.numpy(), [0.25], atol=1e-2)
