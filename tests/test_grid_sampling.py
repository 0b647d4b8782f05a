"""nn.functional.affine_grid and grid_sample against torch: every mode, padding mode and align_corners, with the
gradients of both the input and the grid, and torch's errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember as em
import ember.nn.functional as EF
from tests.helpers import BatchedChecks, pair, random_array


@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid_matches_torch(device: str, align_corners: bool) -> None:
    check = BatchedChecks(atol=1e-6, rtol=1e-5)
    generator = np.random.default_rng(0)
    theta = (np.eye(2, 3)[None].repeat(2, 0) + 0.3 * generator.standard_normal((2, 2, 3))).astype(np.float32)
    t, tt = pair(theta, device, requires_grad=True)
    result = EF.affine_grid(t, (2, 3, 4, 7), align_corners=align_corners)
    expected = TF.affine_grid(tt, (2, 3, 4, 7), align_corners=align_corners)
    check(result, expected, "2-d")
    weights = random_array(tuple(expected.shape), seed=1)
    (result * em.tensor(weights, device=device)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    check(t.grad, tt.grad, "gradient")
    volume = (np.eye(3, 4)[None] + 0.2 * generator.standard_normal((1, 3, 4))).astype(np.float32)
    v, tv = pair(volume, device)
    check(EF.affine_grid(v, (1, 2, 3, 4, 5), align_corners=align_corners),
          TF.affine_grid(tv, (1, 2, 3, 4, 5), align_corners=align_corners), "3-d")
    check.verify()


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_matches_torch(device: str, mode: str, padding_mode: str, align_corners: bool) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    x, tx = pair(random_array((2, 3, 5, 6)), device, requires_grad=True)
    grid = np.random.default_rng(1).uniform(-1.3, 1.3, (2, 4, 7, 2)).astype(np.float32)
    g, tg = pair(grid, device, requires_grad=True)
    result = EF.grid_sample(x, g, mode, padding_mode, align_corners)
    expected = TF.grid_sample(tx, tg, mode, padding_mode, align_corners)
    check(result, expected, "values")
    weights = random_array(tuple(expected.shape), seed=2)
    (result * em.tensor(weights, device=device)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    check(x.grad, tx.grad, "input gradient")
    check(g.grad, tg.grad, "grid gradient")
    check.verify()


@pytest.mark.parametrize("call, error", [
    (lambda m, F, d: F.grid_sample(m.ones(1, 1, 3, 3, device=d), m.zeros(1, 2, 2, 2, device=d), mode="cubic"),
     ValueError),
    (lambda m, F, d: F.grid_sample(m.ones(1, 1, 3, 3, device=d), m.zeros(1, 2, 2, 2, device=d),
                                   padding_mode="wrap"), ValueError),
    (lambda m, F, d: F.grid_sample(m.ones(1, 1, 3, 3, device=d), m.zeros(2, 2, 2, 2, device=d)), RuntimeError),
    (lambda m, F, d: F.affine_grid(m.ones(1, 2, 3, device=d), (1, 1, 4)), NotImplementedError),
    (lambda m, F, d: F.affine_grid(m.ones(1, 2, 3, device=d), (1, 1, 0, 4)), ValueError),
], ids=["mode", "padding_mode", "batch sizes", "size rank", "empty size"])
@pytest.mark.filterwarnings("ignore:Default grid_sample and affine_grid behavior")
def test_grid_errors_are_torch_s(device: str, call: Any, error: type) -> None:
    with pytest.raises(error):
        call(torch, TF, "cpu")
    with pytest.raises(error):
        call(em, EF, device)
