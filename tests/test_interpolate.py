"""nn.functional.interpolate and the Upsample modules against torch: every mode, size and scale_factor forms,
align_corners, recompute_scale_factor, gradients, integer inputs for the nearest modes, and torch's errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember as em
import ember.nn.functional as EF
from tests.helpers import BatchedChecks, pair, random_array

CASES: list[tuple[tuple[int, ...], dict[str, Any]]] = [
    ((1, 2, 5), {"size": 8, "mode": "nearest"}),
    ((1, 2, 5), {"scale_factor": 1.7, "mode": "nearest"}),
    ((1, 2, 5), {"size": 3, "mode": "nearest-exact"}),
    ((1, 2, 5), {"size": 8, "mode": "linear"}),
    ((1, 2, 5), {"size": 8, "mode": "linear", "align_corners": True}),
    ((1, 2, 6), {"scale_factor": 0.5, "mode": "linear"}),
    ((2, 3, 4, 5), {"size": (7, 3), "mode": "bilinear"}),
    ((2, 3, 4, 5), {"scale_factor": 2.5, "mode": "bilinear", "align_corners": True}),
    ((2, 3, 4, 5), {"size": (9, 7), "mode": "bicubic"}),
    ((2, 3, 4, 5), {"size": (9, 1), "mode": "bicubic", "align_corners": True}),
    ((1, 2, 3, 4, 5), {"size": (5, 6, 2), "mode": "trilinear"}),
    ((1, 2, 3, 4, 5), {"scale_factor": 2, "mode": "nearest"}),
    ((2, 3, 4, 5), {"size": (2, 3), "mode": "area"}),
    ((2, 3, 4, 5), {"scale_factor": (2, 3), "mode": "nearest"}),
    ((2, 3, 4, 5), {"scale_factor": (1.5, 0.75), "mode": "nearest-exact"}),
    ((2, 3, 7, 5), {"scale_factor": 0.37, "mode": "bilinear", "recompute_scale_factor": True}),
    ((2, 3, 7, 5), {"scale_factor": 0.5, "mode": "area"}),
]


@pytest.mark.parametrize("shape, options", CASES, ids=[str(options) for _, options in CASES])
def test_interpolate_matches_torch(device: str, shape: tuple[int, ...], options: dict[str, Any]) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    x, tx = pair(random_array(shape), device, requires_grad=True)
    result, expected = EF.interpolate(x, **options), TF.interpolate(tx, **options)
    check(result, expected, "values")
    weights = random_array(tuple(expected.shape), seed=1)
    (result * em.tensor(weights, device=device)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    check(x.grad, tx.grad, "gradient")
    check.verify()


@pytest.mark.filterwarnings("ignore:.*nn.functional.upsample")
def test_nearest_keeps_integer_dtypes_and_modules_match_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    i, ti = pair(random_array((1, 2, 3, 3), np.uint8), device)
    check(EF.interpolate(i, scale_factor=2), TF.interpolate(ti, scale_factor=2), "uint8 nearest")
    x, tx = pair(random_array((1, 2, 3, 4)), device)
    for ours, theirs in ((em.nn.Upsample(scale_factor=2), torch.nn.Upsample(scale_factor=2)),
                         (em.nn.Upsample(size=(5, 5), mode="bicubic"), torch.nn.Upsample(size=(5, 5), mode="bicubic")),
                         (em.nn.UpsamplingNearest2d(scale_factor=3), torch.nn.UpsamplingNearest2d(scale_factor=3)),
                         (em.nn.UpsamplingBilinear2d(size=(6, 2)), torch.nn.UpsamplingBilinear2d(size=(6, 2)))):
        check(ours(x), theirs(tx), repr(theirs))
        assert repr(ours) == repr(theirs)
    with pytest.warns(UserWarning, match="deprecated"):
        check(EF.upsample(x, scale_factor=2, mode="bilinear"), TF.upsample(tx, scale_factor=2, mode="bilinear"),
              "upsample")
    check(EF.upsample_nearest(x, size=(4, 4)), TF.upsample_nearest(tx, size=(4, 4)), "upsample_nearest")
    check(EF.upsample_bilinear(x, scale_factor=2), TF.upsample_bilinear(tx, scale_factor=2), "upsample_bilinear")
    check.verify()


@pytest.mark.parametrize("call, error", [
    (lambda m, F, d: F.interpolate(m.ones(1, 1, 4, device=d), size=2, mode="bilinear"), NotImplementedError),
    (lambda m, F, d: F.interpolate(m.ones(4, 4, device=d), size=2), NotImplementedError),
    (lambda m, F, d: F.interpolate(m.ones(1, 1, 4, device=d), size=2, scale_factor=2), ValueError),
    (lambda m, F, d: F.interpolate(m.ones(1, 1, 4, device=d)), ValueError),
    (lambda m, F, d: F.interpolate(m.ones(1, 1, 4, device=d), size=2, align_corners=True), ValueError),
    (lambda m, F, d: F.interpolate(m.ones(1, 1, 4, 4, device=d), size=(2, 2, 2)), ValueError),
    (lambda m, F, d: F.interpolate(m.ones(1, 1, 4, device=d), size=2, recompute_scale_factor=True), ValueError),
], ids=["mode rank", "input rank", "size and scale", "neither", "align_corners nearest", "size length",
        "recompute with size"])
def test_interpolate_errors_are_torch_s(device: str, call: Any, error: type) -> None:
    with pytest.raises(error):
        call(torch, TF, "cpu")
    with pytest.raises(error):
        call(em, EF, device)
