"""Traced compositions (Composite.TRACED) at the sizes users run: a linear layer over 70,000 rows (past 65,535) and
cross_entropy over 10^6 logits with its lazy target check copied from a template, against torch, bad targets
reported at their position on the first call and on the copied second one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember as em
from ember.core.checks import IndexOutOfRangeError


def test_a_traced_linear_over_seventy_thousand_rows_matches_torch_with_gradients(device: str) -> None:
    generator = np.random.default_rng(5)
    rows = generator.standard_normal((70_000, 16)).astype(np.float32)
    weight = generator.standard_normal((8, 16)).astype(np.float32)
    bias = generator.standard_normal(8).astype(np.float32)
    tensors = [em.tensor(value, device=device, requires_grad=True) for value in (rows, weight, bias)]
    expected = [torch.tensor(value, requires_grad=True) for value in (rows, weight, bias)]
    output = em.nn.functional.linear(*tensors)
    reference = torch.nn.functional.linear(*expected)
    np.testing.assert_allclose(output.numpy(), reference.detach().numpy(), rtol=1e-4, atol=1e-4)
    output.square().mean().backward()
    reference.square().mean().backward()
    for value, truth in zip(tensors, expected):
        np.testing.assert_allclose(value.grad.numpy(), truth.grad.numpy(), rtol=1e-3, atol=1e-5)


def test_cross_entropy_over_a_million_logits_matches_torch_and_reports_a_far_bad_target(device: str) -> None:
    generator = np.random.default_rng(6)
    logits = generator.standard_normal((100_000, 10)).astype(np.float32)
    targets = generator.integers(0, 10, 100_000)
    targets[::7] = -100  # ignored
    x = em.tensor(logits, device=device, requires_grad=True)
    t = torch.tensor(logits, requires_grad=True)
    loss = em.nn.functional.cross_entropy(x, em.tensor(targets, device=device).realize())
    expected = torch.nn.functional.cross_entropy(t, torch.tensor(targets))
    np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-5)
    loss.backward()
    expected.backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-8)
    for _ in range(2):  # the first check records its template, the second is a copy of it
        bad = targets.copy()
        bad[99_998] = 10
        with pytest.raises(IndexOutOfRangeError, match=r"Target 10 at position \(99998,\)"):
            em.nn.functional.cross_entropy(x, em.tensor(bad, device=device).realize()).item()
