"""nn.functional and nn modules added for torch parity, against torch: distances (cosine_similarity,
pairwise_distance, pdist), the margin and likelihood losses, pixel/channel shuffles, instance_norm, prelu, rrelu,
glu, 3-d and adaptive max pooling, and the in-place F.NAME_ forms (values, gradients, errors)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember as em
import ember.nn.functional as EF
from tests.helpers import BatchedChecks, pair, random_array


def _run(call: Any, shapes: list[tuple[int, ...]], device: str, check: BatchedChecks, label: str,
         extra: list[np.ndarray] = (), grad: bool = True) -> None:
    """call(F, *tensors, *extra) in torch and ember; values and the gradients of the float inputs compared."""
    pairs = [pair(random_array(shape, seed=index), device, requires_grad=grad) for index, shape in enumerate(shapes)]
    extras = [pair(array, device) for array in extra]
    result = call(EF, *(ours for ours, _ in pairs), *(ours for ours, _ in extras))
    expected = call(TF, *(theirs for _, theirs in pairs), *(theirs for _, theirs in extras))
    check(result, expected, label)
    if grad:
        weights = random_array(tuple(expected.shape), seed=21)
        (result * em.tensor(weights, device=device)).sum().backward()
        (expected * torch.tensor(weights)).sum().backward()
        for index, (ours, theirs) in enumerate(pairs):
            check(ours.grad, theirs.grad, f"{label} gradient {index}")


def test_distances_match_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    _run(lambda F, a, b: F.cosine_similarity(a, b), [(4, 5), (4, 5)], device, check, "cosine_similarity")
    _run(lambda F, a, b: F.cosine_similarity(a, b, dim=-1), [(3, 1, 5), (4, 5)], device, check, "cosine broadcast")
    for p in (2.0, 1.0, 3.0, float("inf")):
        _run(lambda F, a, b: F.pairwise_distance(a, b, p=p), [(4, 5), (4, 5)], device, check, f"pairwise p={p}")
        _run(lambda F, a: F.pdist(a, p=p), [(5, 3)], device, check, f"pdist p={p}")
    _run(lambda F, a, b: F.pairwise_distance(a, b, keepdim=True), [(4, 5), (5,)], device, check, "keepdim")
    _run(lambda F, a, b: (em if F is EF else torch).cosine_similarity(a, b, 0), [(6,), (6,)], device, check,
         "torch.cosine_similarity")
    check.verify()
    x, tx = pair(random_array((1, 3)), device)
    assert tuple(EF.pdist(x).shape) == tuple(TF.pdist(tx).shape) == (0,)
    with pytest.raises(RuntimeError):
        TF.pdist(torch.ones(2, 2, 2))
    with pytest.raises(RuntimeError):
        EF.pdist(em.ones(2, 2, 2, device=device))


def test_modules_for_distances(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    a, ta = pair(random_array((3, 4)), device)
    b, tb = pair(random_array((3, 4), seed=1), device)
    check(em.nn.CosineSimilarity(dim=0)(a, b), torch.nn.CosineSimilarity(dim=0)(ta, tb), "CosineSimilarity")
    check(em.nn.PairwiseDistance(p=1.0, keepdim=True)(a, b), torch.nn.PairwiseDistance(p=1.0, keepdim=True)(ta, tb),
          "PairwiseDistance")
    check.verify()


def _signs(shape: tuple[int, ...], seed: int = 5) -> np.ndarray:
    return np.where(np.random.default_rng(seed).random(shape) < 0.5, -1.0, 1.0).astype(np.float32)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_margin_losses_match_torch(device: str, reduction: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    r = {"reduction": reduction}
    _run(lambda F, a, b, y: F.margin_ranking_loss(a, b, y, margin=0.3, **r), [(6,), (6,)], device, check,
         "margin_ranking", [_signs((6,))])
    _run(lambda F, a, y: F.hinge_embedding_loss(a, y, margin=0.8, **r), [(3, 4)], device, check, "hinge",
         [_signs((3, 4))])
    _run(lambda F, a, y: F.soft_margin_loss(a, y, **r), [(3, 4)], device, check, "soft_margin", [_signs((3, 4))])
    _run(lambda F, a, y: F.multilabel_soft_margin_loss(a, y, **r), [(3, 4)], device, check, "multilabel",
         [(random_array((3, 4), seed=9) > 0).astype(np.float32)])
    _run(lambda F, a, y, w: F.multilabel_soft_margin_loss(a, y, weight=w, **r), [(3, 4)], device, check,
         "multilabel weight", [(random_array((3, 4), seed=9) > 0).astype(np.float32), random_array((4,), seed=3)])
    _run(lambda F, a, b, y: F.cosine_embedding_loss(a, b, y, margin=0.1, **r), [(5, 4), (5, 4)], device, check,
         "cosine_embedding", [_signs((5,))])
    _run(lambda F, a, b, y: F.cosine_embedding_loss(a, b, y, **r), [(4,), (4,)], device, check,
         "cosine_embedding 1-d", [np.array(-1.0, np.float32)])
    for swap in (False, True):
        _run(lambda F, a, b, c: F.triplet_margin_loss(a, b, c, margin=0.7, swap=swap, **r), [(4, 5)] * 3, device,
             check, f"triplet swap={swap}")
    _run(lambda F, a, b, c: F.triplet_margin_loss(a, b, c, p=1, **r), [(4, 5)] * 3, device, check, "triplet p=1")
    check.verify()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_likelihood_losses_match_torch(device: str, reduction: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    r = {"reduction": reduction}
    counts = np.array([[0.0, 1.0, 2.0, 5.0], [3.0, 0.0, 1.0, 9.0]], dtype=np.float32)
    _run(lambda F, a, y: F.poisson_nll_loss(a, y, **r), [(2, 4)], device, check, "poisson log_input", [counts])
    _run(lambda F, a, y: F.poisson_nll_loss(a, y, full=True, **r), [(2, 4)], device, check, "poisson full", [counts])
    positive = np.abs(random_array((2, 4))) + 0.1
    x, tx = pair(positive, device, requires_grad=True)
    y, ty = pair(counts, device)
    check(EF.poisson_nll_loss(x, y, log_input=False, **r), TF.poisson_nll_loss(tx, ty, log_input=False, **r),
          "poisson rates")
    variance = np.abs(random_array((2, 4), seed=4)) + 0.05
    variance[0, 0] = 1e-9  # clamped to eps, the gradient passing through as torch's
    _run(lambda F, a, b, v: F.gaussian_nll_loss(a, b, v, **r), [(2, 4), (2, 4)], device, check, "gaussian",
         [variance])
    for var_shape in ((2, 4), (2,), (2, 1)):
        a, ta = pair(random_array((2, 4)), device, requires_grad=True)
        b, tb = pair(random_array((2, 4), seed=1), device)
        v, tv = pair(np.abs(random_array(var_shape, seed=2)) + 0.1, device, requires_grad=True)
        result, expected = EF.gaussian_nll_loss(a, b, v, full=True, **r), TF.gaussian_nll_loss(ta, tb, tv, full=True,
                                                                                              **r)
        check(result, expected, f"gaussian var {var_shape}")
        result.sum().backward()
        expected.sum().backward()
        check(a.grad, ta.grad, f"gaussian var {var_shape} input gradient")
        check(v.grad, tv.grad, f"gaussian var {var_shape} var gradient")
    check.verify()
    for call in (lambda m, F: F.gaussian_nll_loss(m.ones(2, 3), m.ones(2, 3), -m.ones(2, 3)),
                 lambda m, F: F.gaussian_nll_loss(m.ones(2, 3), m.ones(2, 3), m.ones(3, 2))):
        with pytest.raises(ValueError):
            call(torch, TF)
        with pytest.raises(ValueError):
            call(em, EF)


def test_loss_modules_match_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    a, ta = pair(random_array((4, 5)), device)
    b, tb = pair(random_array((4, 5), seed=1), device)
    c, tc = pair(random_array((4, 5), seed=2), device)
    y, ty = pair(_signs((4,)), device)
    y2, ty2 = pair(_signs((4, 5)), device)
    check(em.nn.MarginRankingLoss(0.2)(a, b, y2), torch.nn.MarginRankingLoss(0.2)(ta, tb, ty2), "MarginRanking")
    check(em.nn.HingeEmbeddingLoss(0.5, reduction="sum")(a, y2),
          torch.nn.HingeEmbeddingLoss(0.5, reduction="sum")(ta, ty2), "HingeEmbedding")
    check(em.nn.SoftMarginLoss()(a, y2), torch.nn.SoftMarginLoss()(ta, ty2), "SoftMargin")
    check(em.nn.MultiLabelSoftMarginLoss()(a, (y2 > 0).float()),
          torch.nn.MultiLabelSoftMarginLoss()(ta, (ty2 > 0).float()), "MultiLabelSoftMargin")
    check(em.nn.CosineEmbeddingLoss(0.1)(a, b, y), torch.nn.CosineEmbeddingLoss(0.1)(ta, tb, ty), "CosineEmbedding")
    check(em.nn.TripletMarginLoss(swap=True)(a, b, c), torch.nn.TripletMarginLoss(swap=True)(ta, tb, tc), "Triplet")
    check(em.nn.PoissonNLLLoss(full=True)(a, b.abs()), torch.nn.PoissonNLLLoss(full=True)(ta, tb.abs()), "Poisson")
    check(em.nn.GaussianNLLLoss()(a, b, c.abs()), torch.nn.GaussianNLLLoss()(ta, tb, tc.abs()), "Gaussian")
    check.verify()


@pytest.mark.parametrize("call", [
    lambda m, F, d: F.margin_ranking_loss(m.ones(2, device=d), m.ones(2, 1, device=d), m.ones(2, device=d)),
    lambda m, F, d: F.triplet_margin_loss(m.ones(2, 3, device=d), m.ones(3, device=d), m.ones(2, 3, device=d)),
    lambda m, F, d: F.triplet_margin_loss(*(m.ones(2, 3, device=d),) * 3, margin=0.0),
    lambda m, F, d: F.cosine_embedding_loss(m.ones(2, 3, device=d), m.ones(2, 3, device=d), m.ones(2, 3, device=d)),
    lambda m, F, d: F.hinge_embedding_loss(m.ones(2, device=d), m.ones(2, device=d), reduction="avg"),
], ids=["ranking ranks", "triplet ranks", "triplet margin", "cosine target rank", "bad reduction"])
def test_loss_errors_are_torch_s(device: str, call: Any) -> None:
    with pytest.raises((RuntimeError, ValueError)) as torch_error:
        call(torch, TF, "cpu")
    with pytest.raises(ValueError if isinstance(torch_error.value, ValueError) else RuntimeError):
        call(em, EF, device)


def test_shuffles_match_torch(device: str) -> None:
    check = BatchedChecks(atol=0, rtol=0)
    _run(lambda F, x: F.pixel_shuffle(x, 2), [(2, 8, 3, 4)], device, check, "pixel_shuffle")
    _run(lambda F, x: F.pixel_shuffle(x, 3), [(9, 2, 2)], device, check, "pixel_shuffle unbatched")
    _run(lambda F, x: F.pixel_unshuffle(x, 2), [(2, 3, 4, 6)], device, check, "pixel_unshuffle")
    _run(lambda F, x: F.pixel_unshuffle(x, 2), [(2, 1, 3, 4, 2)], device, check, "pixel_unshuffle 5-d")
    _run(lambda F, x: F.channel_shuffle(x, 3), [(2, 6, 2, 2)], device, check, "channel_shuffle")
    _run(lambda F, x: F.channel_shuffle(x, 2), [(1, 4, 3)], device, check, "channel_shuffle 3-d")
    x, tx = pair(random_array((1, 8, 2, 2)), device)
    check(em.pixel_shuffle(x, 2), torch.pixel_shuffle(tx, 2), "torch.pixel_shuffle")
    check(em.nn.PixelShuffle(2)(x), torch.nn.PixelShuffle(2)(tx), "PixelShuffle")
    check(em.nn.PixelUnshuffle(2)(x), torch.nn.PixelUnshuffle(2)(tx), "PixelUnshuffle")
    check(em.nn.ChannelShuffle(4)(x), torch.nn.ChannelShuffle(4)(tx), "ChannelShuffle")
    check.verify()
    for call in (lambda m, F: F.pixel_shuffle(m.ones(1, 3, 2, 2), 2),
                 lambda m, F: F.pixel_unshuffle(m.ones(1, 1, 3, 4), 2),
                 lambda m, F: F.pixel_shuffle(m.ones(4, 2), 2), lambda m, F: F.channel_shuffle(m.ones(1, 5, 2), 2)):
        with pytest.raises(RuntimeError):
            call(torch, TF)
        with pytest.raises(RuntimeError):
            call(em, EF)


def test_instance_norm_matches_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    _run(lambda F, x: F.instance_norm(x), [(2, 3, 5)], device, check, "instance_norm 1d")
    _run(lambda F, x, w, b: F.instance_norm(x, weight=w, bias=b), [(2, 3, 4, 4), (3,), (3,)], device, check,
         "affine 2d")
    mean, tmean = pair(random_array((3,)), device)
    var, tvar = pair(np.abs(random_array((3,), seed=1)) + 0.5, device)
    x, tx = pair(random_array((2, 3, 4)), device)
    check(EF.instance_norm(x, mean, var, momentum=0.3), TF.instance_norm(tx, tmean, tvar, momentum=0.3), "running")
    check(mean, tmean, "running mean updated")
    check(var, tvar, "running var updated")
    check(EF.instance_norm(x, mean, var, use_input_stats=False), TF.instance_norm(tx, tmean, tvar,
                                                                                  use_input_stats=False), "eval")
    for module_name, shape in (("InstanceNorm1d", (2, 3, 5)), ("InstanceNorm2d", (3, 4, 4)),
                               ("InstanceNorm3d", (2, 3, 2, 3, 2))):
        ours = getattr(em.nn, module_name)(3, affine=True, track_running_stats=True).to(device)
        theirs = getattr(torch.nn, module_name)(3, affine=True, track_running_stats=True)
        assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
        x, tx = pair(random_array(shape), device)
        check(ours(x), theirs(tx), f"{module_name} training")
        check(ours.running_mean, theirs.running_mean, f"{module_name} running mean")
        check(ours.running_var, theirs.running_var, f"{module_name} running var")
        ours.eval()
        theirs.eval()
        check(ours(x), theirs(tx), f"{module_name} eval")
    check.verify()
    assert sorted(em.nn.InstanceNorm2d(3).state_dict()) == sorted(torch.nn.InstanceNorm2d(3).state_dict()) == []
    for module in (torch, em):
        with pytest.raises(ValueError):
            module.nn.InstanceNorm2d(3)(module.ones(2, 3, 4, 4, 4))


def test_activations_match_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    _run(lambda F, x, w: F.prelu(x, w), [(2, 3, 4), (3,)], device, check, "prelu per channel")
    _run(lambda F, x, w: F.prelu(x, w), [(5,), (1,)], device, check, "prelu one weight")
    _run(lambda F, x: F.rrelu(x, 0.1, 0.3), [(3, 4)], device, check, "rrelu eval")
    _run(lambda F, x: F.glu(x, 1), [(2, 6, 3)], device, check, "glu")
    zero_data = np.array([-1.0, 0.0, 2.0], np.float32)
    x, tx = pair(zero_data, device, requires_grad=True)
    w, tw = pair(np.array([0.25], np.float32), device, requires_grad=True)
    EF.prelu(x, w).sum().backward()
    TF.prelu(tx, tw).sum().backward()
    check(x.grad, tx.grad, "prelu gradient at 0")
    check(w.grad, tw.grad, "prelu weight gradient")
    ours, theirs = em.nn.PReLU(3).to(device), torch.nn.PReLU(3)
    x, tx = pair(random_array((2, 3, 2)), device)
    check(ours(x), theirs(tx), "PReLU")
    check(em.nn.RReLU(0.2, 0.4).eval()(x), torch.nn.RReLU(0.2, 0.4).eval()(tx), "RReLU eval")
    check(em.nn.GLU(1)(x[:, :2]), torch.nn.GLU(1)(tx[:, :2]), "GLU")
    check(em.nn.Threshold(0.1, 20.0)(x), torch.nn.Threshold(0.1, 20.0)(tx), "Threshold")
    check.verify()
    # training: each negative element gets its own slope in [lower, upper]
    x = em.tensor(-np.ones(2000, np.float32), device=device)
    slopes = -EF.rrelu(x, 0.1, 0.3, training=True).numpy()
    assert slopes.min() >= 0.1 and slopes.max() <= 0.3 and slopes.std() > 0.03
    assert np.all(EF.rrelu(-x, 0.1, 0.3, training=True).numpy() == 1)
    for call in (lambda m, F: F.prelu(m.ones(2, 3), m.ones(2)), lambda m, F: F.glu(m.ones(3, 3)),
                 lambda m, F: F.rrelu(m.ones(2), 0.5, 0.1)):
        with pytest.raises(RuntimeError):
            call(torch, TF)
        with pytest.raises(RuntimeError):
            call(em, EF)


def test_pooling_in_3d_and_adaptive_max_match_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    _run(lambda F, x: F.max_pool3d(x, 2), [(1, 2, 4, 4, 4)], device, check, "max_pool3d")
    _run(lambda F, x: F.max_pool3d(x, (2, 1, 3), stride=1, padding=(1, 0, 1)), [(2, 3, 4, 3, 5)], device, check,
         "max_pool3d padded")
    _run(lambda F, x: F.avg_pool3d(x, 2, stride=1), [(1, 2, 3, 4, 3)], device, check, "avg_pool3d")
    _run(lambda F, x: F.adaptive_max_pool1d(x, 3), [(2, 3, 7)], device, check, "adaptive_max_pool1d")
    _run(lambda F, x: F.adaptive_max_pool3d(x, (2, 1, 3)), [(1, 2, 4, 3, 5)], device, check, "adaptive_max_pool3d")
    _run(lambda F, x: F.adaptive_avg_pool3d(x, 2), [(1, 2, 4, 3, 5)], device, check, "adaptive_avg_pool3d")
    x, tx = pair(random_array((1, 2, 4, 4, 4)), device)
    check(em.max_pool3d(x, 2), torch.max_pool3d(tx, 2), "torch.max_pool3d")
    values, indices = EF.max_pool3d(x, 2, return_indices=True)
    expected_values, expected_indices = TF.max_pool3d(tx, 2, return_indices=True)
    check(values, expected_values, "values")
    check(indices, expected_indices, "indices")
    for name, arguments in (("MaxPool3d", (2,)), ("AvgPool3d", (2,)), ("AdaptiveAvgPool3d", (2,)),
                            ("AdaptiveMaxPool3d", ((1, 2, 3),))):
        check(getattr(em.nn, name)(*arguments)(x), getattr(torch.nn, name)(*arguments)(tx), name)
    y, ty = pair(random_array((2, 6, 5)), device)
    check(em.nn.AdaptiveMaxPool1d(2)(y), torch.nn.AdaptiveMaxPool1d(2)(ty), "AdaptiveMaxPool1d")
    check(em.nn.AdaptiveMaxPool2d((2, 3))(y), torch.nn.AdaptiveMaxPool2d((2, 3))(ty), "AdaptiveMaxPool2d")
    check.verify()


def test_in_place_functional_forms(device: str) -> None:
    check = BatchedChecks(atol=1e-6, rtol=1e-5)
    data = random_array((3, 4))
    for name, arguments in (("relu_", ()), ("elu_", (0.5,)), ("leaky_relu_", (0.2,)), ("hardtanh_", (-0.5, 0.5)),
                            ("celu_", ()), ("selu_", ()), ("threshold_", (0.1, 5.0)), ("rrelu_", (0.2, 0.3))):
        x, tx = pair(data, device)
        returned = getattr(EF, name)(x, *arguments)
        getattr(TF, name)(tx, *arguments)
        assert returned is x
        check(x, tx, name)
    for name in ("celu_", "selu_", "rrelu_", "relu_"):
        x, tx = pair(data, device)
        getattr(em, name)(x)
        getattr(torch, name)(tx)
        check(x, tx, f"torch.{name}")
    check.verify()


def test_composed_functional_matches_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    positive = np.abs(random_array((2, 3, 6, 6))) + 0.1
    for norm_type in (2.0, 1.0, 3.0):
        x, tx = pair(positive, device, requires_grad=True)
        result, expected = EF.lp_pool2d(x, norm_type, (2, 3), stride=1), TF.lp_pool2d(tx, norm_type, (2, 3), stride=1)
        check(result, expected, f"lp_pool2d p={norm_type}")
        result.sum().backward()
        expected.sum().backward()
        check(x.grad, tx.grad, f"lp_pool2d p={norm_type} gradient")
    x, tx = pair(positive.reshape(2, 3, 36), device)
    check(EF.lp_pool1d(x, 2.0, 3), TF.lp_pool1d(tx, 2.0, 3), "lp_pool1d")
    x, tx = pair(positive.reshape(2, 3, 4, 3, 3), device)
    check(EF.lp_pool3d(x, 2.0, 2, ceil_mode=True), TF.lp_pool3d(tx, 2.0, 2, ceil_mode=True), "lp_pool3d")
    check(em.nn.LPPool2d(2, 2)(x[:, :, 0]), torch.nn.LPPool2d(2, 2)(tx[:, :, 0]), "LPPool2d")
    _run(lambda F, x: F.local_response_norm(x, 3), [(2, 5, 4)], device, check, "local_response_norm 3-d")
    _run(lambda F, x: F.local_response_norm(x, 2, alpha=0.1, beta=0.5, k=2.0), [(2, 5, 3, 3)], device, check,
         "local_response_norm 4-d")
    x, tx = pair(random_array((1, 4, 2, 3)), device)
    check(em.nn.LocalResponseNorm(3)(x), torch.nn.LocalResponseNorm(3)(tx), "LocalResponseNorm")
    for spatial in (1, 2, 3):
        x, tx = pair(random_array((2, 2) + (4,) * spatial), device)
        name = f"max_pool{spatial}d_with_indices"
        check(list(getattr(EF, name)(x, 2)), list(getattr(TF, name)(tx, 2)), name)
    check.verify()
    with pytest.raises(ValueError):
        TF.local_response_norm(torch.ones(2, 3), 2)
    with pytest.raises(ValueError):
        EF.local_response_norm(em.ones(2, 3, device=device), 2)


def test_dropout3d_and_gumbel_softmax(device: str) -> None:
    x = em.ones(4, 8, 2, 2, 2, device=device)
    result = EF.dropout3d(x, 0.5).numpy()
    per_channel = result.reshape(4, 8, -1)
    assert np.all((per_channel == 0).all(-1) | (per_channel == 2).all(-1))  # whole channels, scaled by 1 / (1 - p)
    assert 0 < (per_channel[..., 0] == 0).sum() < 32
    assert np.array_equal(EF.dropout3d(x, 0.5, training=False).numpy(), x.numpy())
    assert np.array_equal(em.nn.Dropout3d(0.5).eval()(x).numpy(), x.numpy())
    logits_data = np.array([[1.0, 2.0, 0.5, -1.0]], dtype=np.float32)
    logits = em.tensor(np.repeat(logits_data, 4000, 0), device=device, requires_grad=True)
    hard = EF.gumbel_softmax(logits, tau=0.5, hard=True)
    values = hard.numpy()
    assert np.all(values.sum(1) == 1) and set(np.unique(values)) <= {0.0, 1.0}
    # the argmax of logits + Gumbel noise is a sample of softmax(logits)
    expected = torch.softmax(torch.tensor(logits_data[0]), 0).numpy()
    np.testing.assert_allclose(values.mean(0), expected, atol=0.03)
    soft = EF.gumbel_softmax(logits, tau=2.0)
    np.testing.assert_allclose(soft.numpy().sum(1), 1.0, rtol=1e-5)
    (hard * em.tensor(np.arange(4, dtype=np.float32), device=device)).sum().backward()
    assert logits.grad is not None and np.isfinite(logits.grad.numpy()).all()
    np.testing.assert_allclose(logits.grad.numpy().sum(1), 0.0, atol=1e-4)  # a softmax's gradient sums to 0


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multi_class_margin_losses_match_torch(device: str, reduction: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    target = np.array([1, 0, 4])
    for p in (1, 2):
        _run(lambda F, x, t: F.multi_margin_loss(x, t, p=p, margin=0.7, reduction=reduction), [(3, 5)], device,
             check, f"multi_margin p={p}", [target])
    _run(lambda F, x, t, w: F.multi_margin_loss(x, t, weight=w, reduction=reduction), [(3, 5)], device, check,
         "multi_margin weight", [target, np.abs(random_array((5,), seed=8))])
    _run(lambda F, x, t: F.multi_margin_loss(x, t, reduction=reduction), [(5,)], device, check, "multi_margin 1-d",
         [np.array(2)])
    labels = np.array([[3, 0, -1, 1, 2], [1, 2, 3, 4, 0], [-1, 2, 0, 0, 0]])
    _run(lambda F, x, t: F.multilabel_margin_loss(x, t, reduction=reduction), [(3, 5)], device, check,
         "multilabel_margin", [labels])
    _run(lambda F, x, t: F.multilabel_margin_loss(x, t, reduction=reduction), [(4,)], device, check,
         "multilabel_margin 1-d", [np.array([2, 1, -1, 3])])
    check.verify()
    x, tx = pair(random_array((3, 5)), device)
    t, tt = pair(target, device)
    check(em.nn.MultiMarginLoss(p=2)(x, t), torch.nn.MultiMarginLoss(p=2)(tx, tt), "MultiMarginLoss")
    labels_pair = pair(labels, device)
    check(em.nn.MultiLabelMarginLoss()(x, labels_pair[0]), torch.nn.MultiLabelMarginLoss()(tx, labels_pair[1]),
          "MultiLabelMarginLoss")
    check.verify()
    with pytest.raises(ValueError):
        TF.multi_margin_loss(tx, tt, p=3)
    with pytest.raises(ValueError):
        EF.multi_margin_loss(x, t, p=3)


def test_alpha_dropout_keeps_mean_and_variance(device: str) -> None:
    """Random, so compared with torch by statistics: for standard normal input (SELU's fixed point) both keep the
    mean 0 and variance 1, and dropped elements take the same value."""
    data = np.random.default_rng(4).standard_normal((200, 100)).astype(np.float32)
    x = em.tensor(data, device=device)
    for name, module in (("alpha_dropout", em.nn.AlphaDropout), ("feature_alpha_dropout", em.nn.FeatureAlphaDropout)):
        assert getattr(EF, name)(x, 0.3, training=False) is x
        ours = getattr(EF, name)(x, 0.3, training=True).numpy()
        theirs = getattr(TF, name)(torch.tensor(data), 0.3, training=True).numpy()
        assert abs(ours.mean()) < 0.05 and abs(theirs.mean()) < 0.05, name
        assert abs(ours.std() - 1) < 0.05 and abs(theirs.std() - 1) < 0.05, name
        alpha = 1.7580993408473766
        dropped_value = -alpha * (1 - 0.3) / np.sqrt((alpha * alpha * 0.3 + 1) * (1 - 0.3))
        for result in (ours, theirs):
            assert 0.25 < np.isclose(result, dropped_value, atol=1e-5).mean() < 0.35, name
        assert np.array_equal(module(0.3).eval()(x).numpy(), data)
    per_channel = EF.feature_alpha_dropout(em.tensor(np.ones((4, 50, 3), np.float32), device=device), 0.5,
                                           training=True).numpy()
    assert np.all(per_channel == per_channel[:, :, :1])  # one draw per channel
    with pytest.raises(ValueError):
        TF.alpha_dropout(torch.ones(2), 1.5)
    with pytest.raises(ValueError):
        EF.alpha_dropout(em.ones(2, device=device), 1.5)


PAD_MODULES = [("ConstantPad1d", (2, 1.5), 3), ("ConstantPad2d", ((1, 0, 2, 1), -1.0), 4),
               ("ConstantPad3d", (1, 0.5), 5), ("ZeroPad1d", ((0, 2),), 3), ("ZeroPad2d", (1,), 4),
               ("ZeroPad3d", ((1, 0, 0, 1, 1, 1),), 5), ("ReflectionPad1d", (2,), 3),
               ("ReflectionPad2d", ((1, 2, 0, 1),), 4), ("ReflectionPad3d", (1,), 5),
               ("ReplicationPad1d", ((3, 1),), 3),
               ("ReplicationPad2d", (2,), 4), ("ReplicationPad3d", ((1, 0, 1, 0, 0, 2),), 5),
               ("CircularPad1d", (1,), 3), ("CircularPad2d", ((1, 2, 2, 0),), 4), ("CircularPad3d", (1,), 5)]


def test_padding_modules_match_torch(device: str) -> None:
    check = BatchedChecks(atol=0, rtol=0)
    for name, arguments, rank in PAD_MODULES:
        ours, theirs = getattr(em.nn, name)(*arguments), getattr(torch.nn, name)(*arguments)
        assert repr(ours) == repr(theirs)
        x, tx = pair(random_array((2, 3, 4, 3, 4)[:rank]), device, requires_grad=True)
        result, expected = ours(x), theirs(tx)
        check(result, expected, name)
        weights = random_array(tuple(expected.shape), seed=2)
        (result * em.tensor(weights, device=device)).sum().backward()
        (expected * torch.tensor(weights)).sum().backward()
        check(x.grad, tx.grad, f"{name} gradient", atol=1e-6, rtol=1e-6)  # sums in another order
    check.verify()


def test_more_modules_match_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-4)
    ours, theirs = em.nn.BatchNorm3d(3).to(device), torch.nn.BatchNorm3d(3)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    x, tx = pair(random_array((2, 3, 2, 3, 2)), device)
    check(ours(x), theirs(tx), "BatchNorm3d")
    check(ours.running_var, theirs.running_var, "BatchNorm3d running var")
    y, ty = pair(random_array((2, 4, 3, 3)), device)
    check(em.nn.Softmax2d()(y), torch.nn.Softmax2d()(ty), "Softmax2d")
    anchor, positive, negative = (pair(random_array((4, 5), seed=seed), device, requires_grad=True)
                                  for seed in range(3))
    for options in ({}, {"swap": True, "margin": 0.5}, {"reduction": "none"}):
        for distance in (None, lambda a, b: 1 - (em if isinstance(a, em.Tensor) else torch).cosine_similarity(a, b)):
            result = EF.triplet_margin_with_distance_loss(anchor[0], positive[0], negative[0],
                                                          distance_function=distance, **options)
            expected = TF.triplet_margin_with_distance_loss(anchor[1], positive[1], negative[1],
                                                            distance_function=distance, **options)
            check(result, expected, f"triplet with distance {options} {distance is None}")
    result = em.nn.TripletMarginWithDistanceLoss(margin=2.0)(anchor[0], positive[0], negative[0])
    expected = torch.nn.TripletMarginWithDistanceLoss(margin=2.0)(anchor[1], positive[1], negative[1])
    check(result, expected, "TripletMarginWithDistanceLoss")
    result.backward()
    expected.backward()
    check(anchor[0].grad, anchor[1].grad, "gradient")
    check.verify()
    for module in (torch, em):
        with pytest.raises(ValueError):
            module.nn.Softmax2d()(module.ones(2, 3))
        with pytest.raises(ValueError):
            module.nn.BatchNorm3d(3)(module.ones(2, 3, 4, 4))


def test_max_unpool_and_embedding_bag_match_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    for spatial, shape in ((1, (2, 3, 8)), (2, (2, 3, 4, 6)), (3, (1, 2, 4, 4, 2))):
        x, tx = pair(random_array(shape), device)
        values, indices = getattr(EF, f"max_pool{spatial}d")(x, 2, return_indices=True)
        tvalues, tindices = getattr(TF, f"max_pool{spatial}d")(tx, 2, return_indices=True)
        v, tv = pair(values.numpy(), device, requires_grad=True)
        tv = tv.detach().requires_grad_()
        ours = getattr(EF, f"max_unpool{spatial}d")(v, indices, 2)
        theirs = getattr(TF, f"max_unpool{spatial}d")(tv, tindices, 2)
        check(ours, theirs, f"max_unpool{spatial}d")
        bigger = tuple(size + 1 for size in shape[2:])
        check(getattr(EF, f"max_unpool{spatial}d")(v, indices, 2, output_size=bigger),
              getattr(TF, f"max_unpool{spatial}d")(tv, tindices, 2, output_size=bigger), f"output_size {spatial}d")
        module = getattr(em.nn, f"MaxUnpool{spatial}d")(2)
        check(module(v, indices), getattr(torch.nn, f"MaxUnpool{spatial}d")(2)(tv, tindices), "module")
        weights = random_array(tuple(theirs.shape), seed=5)
        (ours * em.tensor(weights, device=device)).sum().backward()
        (theirs * torch.tensor(weights)).sum().backward()
        check(v.grad, tv.grad, f"max_unpool{spatial}d gradient")
    weight, tweight = pair(random_array((6, 3)), device, requires_grad=True)
    flat, tflat = pair(np.array([1, 2, 4, 5, 4, 3]), device)
    offsets, toffsets = pair(np.array([0, 2, 2, 4]), device)
    bags, tbags = pair(np.array([[1, 2, 0], [4, 5, 5]]), device)
    sample, tsample = pair(random_array((2, 3), seed=6), device)
    cases = [
        ({"mode": "mean"}, (flat, offsets), (tflat, toffsets)),
        ({"mode": "max"}, (flat, offsets), (tflat, toffsets)),
        ({"mode": "sum", "include_last_offset": True}, (flat, offsets), (tflat, toffsets)),
        ({"mode": "mean", "padding_idx": 4}, (flat, offsets), (tflat, toffsets)),
        ({"mode": "sum"}, (bags, None), (tbags, None)),
        ({"mode": "max"}, (bags, None), (tbags, None)),
    ]
    for options, (indices, bag_offsets), (tindices, tbag_offsets) in cases:
        ours = EF.embedding_bag(indices, weight, bag_offsets, **options)
        theirs = TF.embedding_bag(tindices, tweight, tbag_offsets, **options)
        check(ours, theirs, f"embedding_bag {options}")
    ours = EF.embedding_bag(bags, weight, mode="sum", per_sample_weights=sample)
    theirs = TF.embedding_bag(tbags, tweight, mode="sum", per_sample_weights=tsample)
    check(ours, theirs, "per_sample_weights")
    (ours * 2).sum().backward()
    (theirs * 2).sum().backward()
    check(weight.grad, tweight.grad, "embedding_bag gradient")
    module, tmodule = em.nn.EmbeddingBag(6, 3, mode="max").to(device), torch.nn.EmbeddingBag(6, 3, mode="max")
    module.load_state_dict({"weight": em.tensor(tmodule.weight.detach().numpy(), device=device)})
    check(module(flat, offsets), tmodule(tflat, toffsets), "EmbeddingBag")
    check.verify()
    for call in (lambda m, F: F.embedding_bag(m.tensor([[1, 2]]), m.ones(4, 2), m.tensor([0])),
                 lambda m, F: F.embedding_bag(m.tensor([1, 2]), m.ones(4, 2), m.tensor([0]), mode="max",
                                              per_sample_weights=m.ones(2))):
        with pytest.raises((ValueError, NotImplementedError)) as torch_error:
            call(torch, TF)
        with pytest.raises(type(torch_error.value)):
            call(em, EF)


def test_adaptive_max_pool_indices_match_torch(device: str) -> None:
    check = BatchedChecks(atol=1e-6, rtol=1e-6)
    for spatial, shape, size in ((1, (2, 3, 7), 3), (2, (2, 2, 5, 6), (2, 4)), (3, (1, 2, 4, 3, 5), (2, 2, 3))):
        data = random_array(shape)
        data.reshape(-1)[::7] = 1.5  # ties: the first position wins, as in torch
        x, tx = pair(data, device, requires_grad=True)
        name = f"adaptive_max_pool{spatial}d"
        values, indices = getattr(EF, name)(x, size, return_indices=True)
        expected_values, expected_indices = getattr(TF, name)(tx, size, return_indices=True)
        check(values, expected_values, f"{name} values")
        check(indices, expected_indices, f"{name} indices")
        check(list(getattr(EF, f"{name}_with_indices")(x, size)), list(getattr(TF, f"{name}_with_indices")(tx, size)),
              f"{name}_with_indices")
        weights = random_array(tuple(expected_values.shape), seed=4)
        (values * em.tensor(weights, device=device)).sum().backward()
        (expected_values * torch.tensor(weights)).sum().backward()
        check(x.grad, tx.grad, f"{name} gradient")
    x, tx = pair(random_array((2, 3, 7)), device)
    check(list(em.adaptive_max_pool1d(x, 2)), list(torch.adaptive_max_pool1d(tx, 2)), "torch.adaptive_max_pool1d")
    check(list(em.nn.AdaptiveMaxPool1d(3, return_indices=True)(x)),
          list(torch.nn.AdaptiveMaxPool1d(3, return_indices=True)(tx)), "AdaptiveMaxPool1d")
    check.verify()
