"""ember.jit with random ops: a replay draws from the generator as an eager call does (dropout masks and randn
numbers equal draw for draw for the same seed, new numbers at every call), also in a training step with dropout
whose gradients are checked against torch with the same mask."""

from __future__ import annotations

import numpy as np
import torch

import ember as em
import ember.nn.functional as F
from ember.core.creation import RandomState
from tests.helpers import assert_close


def _noisy(x: em.Tensor) -> tuple[em.Tensor, em.Tensor]:
    return F.dropout(x, 0.5, training=True), em.randn(3, 37, device=x.device) * 2.0 + x[:, :37]


def test_jit_draws_as_eager(device: str) -> None:
    x = em.tensor(np.arange(1, 3 * 70 + 1, dtype=np.float32).reshape(3, 70), device=device)
    em.manual_seed(11)
    eager = [tuple(value.numpy() for value in _noisy(x)) for _ in range(5)]
    eager_counter = RandomState.counter
    em.manual_seed(11)
    jitted = em.jit(_noisy)
    replayed = [tuple(value.numpy().copy() for value in jitted(x)) for _ in range(5)]
    assert jitted.captures == 1 and jitted.replays == 3
    assert RandomState.counter == eager_counter
    for (eager_mask, eager_normal), (jit_mask, jit_normal) in zip(eager, replayed):
        np.testing.assert_array_equal(jit_mask, eager_mask)
        np.testing.assert_array_equal(jit_normal, eager_normal)
        kept = jit_mask != 0
        np.testing.assert_array_equal(jit_mask[kept], 2 * x.numpy()[kept])  # numpy: kept values scaled by 1/(1-p)
        assert 0.3 < kept.mean() < 0.7
    for first, second in zip(replayed[2:], replayed[3:]):  # every replay draws new numbers
        assert not np.array_equal(first[0], second[0]) and not np.array_equal(first[1], second[1])


def test_jit_training_step_with_dropout(device: str) -> None:
    weights = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32)
    inputs = np.random.default_rng(1).normal(size=(6, 8)).astype(np.float32)
    weight = em.tensor(weights, device=device, requires_grad=True)
    data = em.tensor(inputs, device=device)
    optimizer = em.optim.SGD([weight], lr=0.1)

    def step(batch: em.Tensor) -> tuple[em.Tensor, em.Tensor]:
        optimizer.zero_grad()
        dropped = F.dropout(batch, 0.25, training=True)
        loss = (dropped @ weight).square().mean()
        loss.backward()
        optimizer.step()
        return loss, dropped

    jitted = em.jit(step)
    em.manual_seed(5)
    reference = torch.tensor(weights)
    for _ in range(4):
        before = reference.clone().requires_grad_()
        loss, dropped = jitted(data)
        kept = torch.tensor(dropped.numpy() != 0)  # the mask ember drew, applied by torch
        torch_loss = (torch.tensor(inputs) * kept / 0.75 @ before).square().mean()
        assert_close(loss, torch_loss.detach(), atol=1e-5, rtol=1e-5)
        torch_loss.backward()
        reference = (before - 0.1 * before.grad).detach()
        assert_close(weight, reference, atol=1e-5, rtol=1e-5)
    assert jitted.replays == 2
