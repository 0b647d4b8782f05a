"""A first end-to-end check on every test device: graph, kernelizer, IR, backend, back to numpy."""

import numpy as np
import torch

from tests.helpers import assert_close, pair, random_array


def test_issue_example(device: str) -> None:
    data = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    x, tx = pair(data, device)
    assert_close((x @ x.T + 1).relu().softmax(dim=-1), (tx @ tx.T + 1).relu().softmax(dim=-1))


def test_matmul_bias_relu(device: str) -> None:
    a, ta = pair(random_array((17, 33)), device)
    b, tb = pair(random_array((33, 3), seed=1), device)
    bias, tbias = pair(random_array((3,), seed=2), device)
    assert_close((a @ b + bias).relu(), (ta @ tb + tbias).relu(), atol=1e-4)


def test_reductions_and_views(device: str) -> None:
    x, tx = pair(random_array((3, 17, 5)), device)
    assert_close(x.sum(1), tx.sum(1))
    assert_close(x.permute(2, 0, 1).amax(-1), tx.permute(2, 0, 1).amax(-1))
    assert_close(x[:, ::3, 1:].exp().mean((0, 2)), tx[:, ::3, 1:].exp().mean((0, 2)))
    assert_close(x.flip(1).pad((1, 2)).cumsum(1), torch.nn.functional.pad(tx.flip(1), (1, 2)).cumsum(1), atol=1e-4)
