"""Sharding: tensors split along a dim across devices; ops run on every shard; reductions and matmuls over the
sharded dim combine partial results. Checked against torch, and as plans on eight dummy devices."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import ember as em
from ember.sharding.tensor import ShardedTensor
from tests.conftest import TEST_DEVICES
from tests.helpers import assert_close, random_array

DUMMIES = [f"dummy:{index}" for index in range(8)]


def test_plan_on_eight_dummy_devices() -> None:
    x = em.tensor(random_array((16, 4)), device="dummy:0").shard(DUMMIES, dim=0).realize()
    assert x.devices == tuple(DUMMIES) and [piece.shape for piece in x.shards] == [(2, 4)] * 8
    with em.profile() as record:
        y = (x * 2 + 1).relu()
        y.realize()
    assert isinstance(y, ShardedTensor) and y.devices == tuple(DUMMIES)
    assert sorted(compile.device for compile in record.compiles) == sorted(DUMMIES)  # one kernel per shard
    assert record.copies == []  # elementwise work never leaves its shard


def test_reduce_over_sharded_dim_combines_on_first_device() -> None:
    x = em.tensor(random_array((16, 4)), device="dummy:0").shard(DUMMIES, dim=0).realize()
    with em.profile() as record:
        total = x.sum(0)
        total.realize()
    assert not isinstance(total, ShardedTensor) and total.device == "dummy:0" and total.shape == (4,)
    assert sorted({compile.device for compile in record.compiles}) == sorted(DUMMIES)
    assert sorted(source for source, target, _ in record.copies) == DUMMIES[1:]  # seven partial sums move
    assert all(target == "dummy:0" for _, target, _ in record.copies)


def test_uneven_shards_and_errors() -> None:
    x = em.tensor(random_array((10, 3)), device="dummy:0").shard(DUMMIES[:3], dim=0)
    assert [piece.shape[0] for piece in x.shards] == [4, 3, 3]
    with pytest.raises(em.ShapeError, match=r"has 3 elements, fewer than the 8 devices"):
        em.ones(3, device="dummy:0").shard(DUMMIES, dim=0)
    with pytest.raises(em.DeviceError, match="distinct"):
        em.ones(4, device="dummy:0").shard(["dummy:0", "dummy:0"], dim=0)


@pytest.mark.skipif(len(TEST_DEVICES) < 2, reason="needs two test devices")
@pytest.mark.parametrize("dim", [0, 1])
def test_sharded_matmul_and_elementwise_match_torch(dim: int) -> None:
    a_data, b_data = random_array((6, 8)), random_array((8, 5), seed=1)
    a = em.tensor(a_data).shard(TEST_DEVICES[:2], dim=dim)
    b = em.tensor(b_data)
    expected = torch.tensor(a_data) @ torch.tensor(b_data)
    assert_close(a @ b if dim == 0 else (a @ b), expected, atol=1e-4)
    assert_close((a * 2 + 1).relu().sum(1), (torch.tensor(a_data) * 2 + 1).relu().sum(1), atol=1e-4)
    assert_close(a.softmax(-1), torch.tensor(a_data).softmax(-1), atol=1e-5)
    right = em.tensor(b_data).shard(TEST_DEVICES[:2], dim=1)
    assert isinstance(em.tensor(a_data) @ right, ShardedTensor)
    np.testing.assert_allclose((em.tensor(a_data) @ right).numpy(), expected.numpy(), atol=1e-4)


@pytest.mark.skipif(len(TEST_DEVICES) < 2, reason="needs two test devices")
def test_mlp_training_step_with_sharded_parameters_matches_torch() -> None:
    x_data, w1_data, w2_data = random_array((16, 12)), random_array((12, 10), seed=1), random_array((10, 3), seed=2)
    target = random_array((16, 3), seed=3)
    w1 = em.tensor(w1_data, requires_grad=True).shard(TEST_DEVICES[:2], dim=1)
    w2 = em.tensor(w2_data, requires_grad=True).shard(TEST_DEVICES[:2], dim=0)
    tw1, tw2 = torch.tensor(w1_data, requires_grad=True), torch.tensor(w2_data, requires_grad=True)
    for _ in range(3):
        loss = (((em.tensor(x_data) @ w1).relu() @ w2 - em.tensor(target)) ** 2).mean()
        loss.backward()
        with em.no_grad():
            for weight in (w1, w2):
                weight.assign(weight - 0.1 * weight.grad)
                for piece in weight.shards:
                    piece.grad = None
        torch_loss = (((torch.tensor(x_data) @ tw1).relu() @ tw2 - torch.tensor(target)) ** 2).mean()
        torch_loss.backward()
        with torch.no_grad():
            for weight in (tw1, tw2):
                weight -= 0.1 * weight.grad
                weight.grad = None
        np.testing.assert_allclose(loss.item(), torch_loss.item(), rtol=1e-5)
    assert w1.devices == tuple(TEST_DEVICES[:2])
    np.testing.assert_allclose(w1.numpy(), tw1.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(w2.numpy(), tw2.detach().numpy(), atol=1e-5)


def test_matmul_sharded_over_two_and_three_c_devices() -> None:
    code = """
        import numpy as np, ember as em
        a = np.random.default_rng(0).standard_normal((9, 7)).astype(np.float32)
        b = np.random.default_rng(1).standard_normal((7, 6)).astype(np.float32)
        for count in (2, 3):
            devices = [f"c:{index}" for index in range(count)]
            for dim in (0, 1):
                sharded = em.tensor(a).shard(devices, dim=dim)
                error = np.abs((sharded @ em.tensor(b)).numpy() - a @ b).max()
                assert error < 1e-4, (count, dim, error)
        print("ok")
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            env={**__import__("os").environ, "EMBER_C_DEVICES": "3"}, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_automatic_sharding_splits_a_large_kernel_across_c_devices() -> None:
    code = """
        import numpy as np, ember as em
        a = np.random.default_rng(0).standard_normal((1024, 64)).astype(np.float32)
        b = np.random.default_rng(1).standard_normal((64, 1024)).astype(np.float32)
        with em.profile() as record:
            result = (em.tensor(a) @ em.tensor(b)).realize()
        assert sorted({kernel.device for kernel in record.kernels}) == ["c:0", "c:1"], record
        assert np.abs(result.numpy() - a @ b).max() < 1e-3
        small = (em.tensor(a[:4]) * 2).realize()  # below the threshold: one device
        print("ok")
    """
    environment = {**__import__("os").environ, "EMBER_C_DEVICES": "2", "EMBER_AUTO_SHARD": "1", "EMBER_BACKENDS": "c"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            env=environment, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
