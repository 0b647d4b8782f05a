"""nn-functional ops against torch: softmax family, norms, dropout, embedding, linear, attention and losses."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember as em
import ember.nn.functional as F
from tests.helpers import assert_close, pair, random_array


def kernel_count(tensor: em.Tensor) -> int:
    """Realize a tensor (its inputs realized already) and count the kernels that ran."""
    with em.profile() as profile:
        tensor.realize()
    return len(profile.kernels)


# ---- softmax family -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_family(device: str, dtype: type) -> None:
    for shape, dim in (((17,), 0), ((3, 17), -1), ((3, 17), 0), ((2, 1, 5), 1), ((4, 1), -1)):
        x, tx = pair(random_array(shape, dtype, low=-5, high=5), device)
        assert_close(x.softmax(dim), tx.softmax(dim))
        assert_close(x.log_softmax(dim), tx.log_softmax(dim))
        assert_close(F.softmin(x, dim), TF.softmin(tx, dim))
    x, tx = pair(random_array((5, 3, 4), dtype), device)
    assert_close(x.transpose(0, 2).softmax(1), tx.transpose(0, 2).softmax(1))  # a non-contiguous view
    assert_close(F.log_softmax(x[:, ::2], dim=-1), TF.log_softmax(tx[:, ::2], dim=-1))


def test_softmax_edge_cases(device: str) -> None:
    big = np.array([[1000.0, 0.0, -1000.0], [-math.inf, 1.0, 2.0], [88.0, 89.0, 90.0]], dtype=np.float32)
    x, tx = pair(big, device)
    assert_close(x.softmax(-1), tx.softmax(-1))  # no overflow, -inf gives exactly 0
    assert_close(x.log_softmax(-1), tx.log_softmax(-1))
    empty, tempty = pair(np.zeros((3, 0), np.float32), device)
    assert_close(empty.softmax(-1), tempty.softmax(-1))
    scalar, tscalar = pair(np.array(2.5, np.float32), device)
    assert_close(scalar.softmax(0), tscalar.softmax(0))
    ints, tints = pair(np.array([1, 2, 3]), device)
    assert_close(ints.softmax(0, dtype=em.float64), tints.softmax(0, dtype=torch.float64))
    with pytest.raises(em.DTypeError, match="softmax: expected a floating point input, got int64"):
        ints.softmax(0)
    with pytest.raises(em.AxisError, match="dim 2 is out of range"):
        x.softmax(2)


def test_softmax_and_norm_kernel_counts(device: str) -> None:
    x = em.randn(16, 33, device=device).realize()
    weight = em.randn(33, device=device).realize()
    bias = em.randn(33, device=device).realize()
    assert kernel_count(x.softmax(-1)) <= 3
    assert kernel_count(x.log_softmax(-1)) <= 3
    assert kernel_count(x.layer_norm(33, weight, bias)) <= 3
    assert kernel_count(x.rms_norm(33, weight)) <= 2
    assert kernel_count(x.linear(em.randn(8, 33, device=device).realize(), em.randn(8, device=device).realize())
                        .relu()) == 1


# ---- normalization --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_and_rms_norm(device: str, dtype: type) -> None:
    x, tx = pair(random_array((2, 3, 17), dtype, low=-3, high=5), device)
    w, tw = pair(random_array((17,), dtype, seed=1), device)
    b, tb = pair(random_array((17,), dtype, seed=2), device)
    w2, tw2 = pair(random_array((3, 17), dtype, seed=3), device)
    assert_close(F.layer_norm(x, (17,)), TF.layer_norm(tx, (17,)), atol=1e-5)
    assert_close(F.layer_norm(x, 17, w, b, eps=1e-3), TF.layer_norm(tx, (17,), tw, tb, eps=1e-3), atol=1e-5)
    assert_close(x.layer_norm([3, 17], w2), TF.layer_norm(tx, [3, 17], tw2), atol=1e-5)
    assert_close(x.transpose(0, 1).layer_norm(17, None, b), TF.layer_norm(tx.transpose(0, 1), (17,), None, tb),
                 atol=1e-5)
    one, tone = pair(random_array((4, 1), dtype), device)
    assert_close(one.layer_norm(1), TF.layer_norm(tone, (1,)))  # a single element: zeros
    assert_close(F.rms_norm(x, (17,)), TF.rms_norm(tx, (17,)), atol=1e-5)
    assert_close(x.rms_norm(17, w, eps=1e-2), TF.rms_norm(tx, (17,), tw, eps=1e-2), atol=1e-5)
    assert_close(x[:, :, ::2].rms_norm([3, 9]), TF.rms_norm(tx[:, :, ::2], [3, 9]), atol=1e-5)


def test_group_norm_batch_norm_normalize(device: str) -> None:
    x, tx = pair(random_array((2, 6, 5, 3)), device)
    w, tw = pair(random_array((6,), seed=1), device)
    b, tb = pair(random_array((6,), seed=2), device)
    assert_close(F.group_norm(x, 3, w, b), TF.group_norm(tx, 3, tw, tb), atol=1e-5)
    assert_close(F.group_norm(x, 6), TF.group_norm(tx, 6), atol=1e-5)
    mean, tmean = pair(random_array((6,), seed=3), device)
    var, tvar = pair(random_array((6,), seed=4, low=0.5, high=2), device)
    assert_close(F.batch_norm(x, mean, var, w, b), TF.batch_norm(tx, tmean, tvar, tw, tb), atol=1e-5)
    result = F.batch_norm(x, mean, var, w, b, training=True, momentum=0.3)
    expected = TF.batch_norm(tx, tmean, tvar, tw, tb, training=True, momentum=0.3)
    assert_close(result, expected, atol=1e-5)
    assert_close(mean, tmean, atol=1e-6)  # running statistics updated in place, as torch
    assert_close(var, tvar, atol=1e-6)
    sequence, tsequence = pair(random_array((4, 6)), device)
    assert_close(F.batch_norm(sequence, None, None, training=True), TF.batch_norm(tsequence, None, None, training=True),
                 atol=1e-5)
    for p, dim in ((2.0, 1), (1.0, -1), (math.inf, 0), (3.0, 2)):
        assert_close(F.normalize(x, p, dim), TF.normalize(tx, p, dim), atol=1e-5)
    zeros, tzeros = pair(np.zeros((2, 3), np.float32), device)
    assert_close(F.normalize(zeros), TF.normalize(tzeros))  # eps keeps 0 / 0 away


def test_normalization_errors(device: str) -> None:
    x = em.ones(3, 4, device=device)
    with pytest.raises(em.ShapeError, match=r"normalized_shape=\[5\], expected input with shape \[\*, 5\].*\[3, 4\]"):
        x.layer_norm(5)
    with pytest.raises(em.ShapeError, match=r"expected weight of shape \[4\].*got \[3\]"):
        x.layer_norm(4, em.ones(3, device=device))
    with pytest.raises(em.ShapeError, match=r"rms_norm.*normalized_shape=\[5\]"):
        x.rms_norm([5])
    with pytest.raises(em.ShapeError, match=r"channels \(6\).*\[2, 6, 3\].*num_groups \(4\)"):
        em.ones(2, 6, 3, device=device).group_norm(4)
    with pytest.raises(em.ShapeError, match=r"running_mean of shape \[4\].*got \[3\]"):
        x.batch_norm(em.ones(3, device=device), em.ones(4, device=device))
    with pytest.raises(em.ShapeError, match="more than 1 value per channel"):
        em.ones(1, 4, device=device).batch_norm(None, None, training=True)
    with pytest.raises(em.DTypeError, match="layer_norm: expected a floating point input, got int64"):
        em.ones(3, 4, dtype=em.int64, device=device).layer_norm(4)


# ---- dropout ----------------------------------------------------------------------------------------------------


def test_dropout(device: str) -> None:
    x = em.rand(64, 128, device=device) + 1.0
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x
    assert np.all(F.dropout(x, 1.0).numpy() == 0)
    values = x.numpy()
    em.manual_seed(3)
    first = F.dropout(x, 0.25).numpy()
    kept = first != 0
    np.testing.assert_allclose(first[kept], values[kept] / 0.75, rtol=1e-6)  # survivors are scaled by 1 / (1 - p)
    assert abs(1 - kept.mean() - 0.25) < 0.02  # 8192 draws: the dropped fraction is p within a few sigma
    second = F.dropout(x, 0.25).numpy()
    assert (second != first).any()  # a new draw each call
    em.manual_seed(3)
    np.testing.assert_array_equal(F.dropout(x, 0.25).numpy(), first)  # the seed makes it deterministic
    with pytest.raises(ValueError, match="between 0 and 1, but got 1.5"):
        F.dropout(x, 1.5)
    channels = F.dropout2d(em.ones(4, 32, 3, 5, device=device), 0.5).numpy()
    per_channel = channels.reshape(4, 32, -1)
    assert np.all(per_channel == per_channel[..., :1])  # whole channels are kept or dropped
    assert set(np.unique(channels)) <= {0.0, 2.0} and 0 < (per_channel[..., 0] == 0).mean() < 1
    with pytest.raises(em.ShapeError, match=r"dropout2d: expected 3-d \(unbatched\) or 4-d.*\[4, 3\]"):
        F.dropout2d(em.ones(4, 3, device=device))


def test_dropout_multiplies_by_its_mask_as_torch_does(device: str) -> None:
    """torch's dropout is the input times a mask of 0 and 1 / (1 - p): a dropped NaN or inf gives NaN, a dropped
    negative value -0.0 (ember selected 0 there); whole channels alike for dropout2d."""
    data = np.tile(np.array([np.nan, np.inf, -np.inf, -3.0, 2.0], np.float32), 400)
    x = em.tensor(data, device=device)
    em.manual_seed(5)
    result = F.dropout(x, 0.4).numpy()
    scaled = data / np.float32(0.6)
    dropped = (result == 0) | (np.isnan(result) & ~np.isnan(data))  # (a dropped inf: NaN)
    assert 0.3 < dropped.mean() < 0.5
    with np.errstate(invalid="ignore"):  # (inf * 0)
        expected = np.where(dropped, data * np.float32(0.0), scaled)
    np.testing.assert_array_equal(result, expected)  # NaN where torch's product is NaN, the signs of zeros too
    assert np.array_equal(np.signbit(result[dropped & (data == -3.0)]), np.ones((dropped & (data == -3.0)).sum(), bool))
    channels = F.dropout2d(em.tensor(np.full((2, 8, 2, 2), np.nan, np.float32), device=device), 0.5).numpy()
    assert np.isnan(channels).all()
    theirs = torch.nn.functional.dropout(torch.tensor(data), 0.4)
    assert torch.isnan(theirs[0::5]).all()  # (torch: a NaN times either mask value is NaN)


# ---- embedding and linear -----------------------------------------------------------------------------------


def test_embedding(device: str) -> None:
    weight, tweight = pair(random_array((10, 3)), device)
    for index_array in (np.array(4), np.array([0, 9, 9, 2]), np.array([[1, 2, 3], [7, 0, 9]])):
        for dtype in (np.int64, np.int32):
            indices, tindices = pair(index_array.astype(dtype), device)
            assert_close(F.embedding(indices, weight), TF.embedding(tindices, tweight))
    indices, tindices = pair(np.array([[0, 5], [5, 1]]), device)
    assert_close(F.embedding(indices, weight, padding_idx=5), TF.embedding(tindices, tweight, padding_idx=5))
    assert_close(indices.embedding(weight[:, ::2]), TF.embedding(tindices, tweight[:, ::2]))  # a strided weight
    with em.profile() as profile:
        F.embedding(indices, weight).realize()
    assert len(profile.kernels) == 2  # the lookup, and the range check of the indices (on the device since used)
    with em.profile() as profile:
        F.embedding(em.tensor([[0, 5], [5, 1]], device=device), weight).realize()
    assert len(profile.kernels) == 1  # indices still on the host are checked there
    with pytest.raises(em.DTypeError, match="embedding: expected integer indices.*float32"):
        F.embedding(em.ones(2, device=device), weight)
    with pytest.raises(em.ShapeError, match=r"weight must be 2-d.*\[10\]"):
        F.embedding(indices, em.ones(10, device=device))


def test_linear(device: str) -> None:
    weight, tweight = pair(random_array((5, 7)), device)
    bias, tbias = pair(random_array((5,), seed=1), device)
    for shape in ((7,), (3, 7), (2, 3, 7), (1, 7)):
        x, tx = pair(random_array(shape, seed=2), device)
        assert_close(F.linear(x, weight, bias), TF.linear(tx, tweight, tbias), atol=1e-5)
        assert_close(F.linear(x, weight), TF.linear(tx, tweight), atol=1e-5)
    x, tx = pair(random_array((7, 3), np.float64, seed=3), device)
    w, tw = pair(random_array((2, 7), np.float64, seed=4), device)
    assert_close(F.linear(x.T, w), TF.linear(tx.T, tw))
    with pytest.raises(em.ShapeError, match=r"input of shape \[3, 4\] and weight of shape \[5, 7\]"):
        F.linear(em.ones(3, 4, device=device), weight)


# ---- attention ----------------------------------------------------------------------------------------------


def test_scaled_dot_product_attention(device: str) -> None:
    q, tq = pair(random_array((2, 3, 5, 4)), device)
    k, tk = pair(random_array((2, 3, 6, 4), seed=1), device)
    v, tv = pair(random_array((2, 3, 6, 7), seed=2), device)
    sdpa, tsdpa = F.scaled_dot_product_attention, TF.scaled_dot_product_attention
    assert_close(sdpa(q, k, v), tsdpa(tq, tk, tv), atol=1e-5)
    assert_close(sdpa(q, k, v, is_causal=True), tsdpa(tq, tk, tv, is_causal=True), atol=1e-5)  # L < S
    assert_close(sdpa(k, q, q, is_causal=True), tsdpa(tk, tq, tq, is_causal=True), atol=1e-5)  # L > S
    assert_close(sdpa(q, k, v, scale=0.3), tsdpa(tq, tk, tv, scale=0.3), atol=1e-5)
    bool_mask = random_array((5, 6), np.bool_, seed=3)
    bool_mask[1] = False  # a fully masked row gives zeros, as torch
    mask, tmask = pair(bool_mask, device)
    assert_close(sdpa(q, k, v, attn_mask=mask), tsdpa(tq, tk, tv, attn_mask=tmask), atol=1e-5)
    float_mask, tfloat_mask = pair(random_array((3, 1, 6), seed=4), device)  # broadcast over batch and rows
    assert_close(sdpa(q, k, v, attn_mask=float_mask), tsdpa(tq, tk, tv, attn_mask=tfloat_mask), atol=1e-5)
    kv_heads, tkv_heads = pair(random_array((2, 1, 6, 4), seed=5), device)
    assert_close(sdpa(q, kv_heads, kv_heads, enable_gqa=True), tsdpa(tq, tkv_heads, tkv_heads, enable_gqa=True),
                 atol=1e-5)
    q64, tq64 = pair(random_array((3, 4), np.float64), device)  # no batch dims, a transposed view
    assert_close(sdpa(q64, q64.T.T, q64[:, ::2]), tsdpa(tq64, tq64, tq64[:, ::2]))
    assert np.all(sdpa(q, k, v, dropout_p=1.0).numpy() == 0)


def test_attention_kernel_count_and_errors(device: str) -> None:
    q = em.randn(2, 4, 8, 16, device=device).realize()
    k = em.randn(2, 4, 8, 16, device=device).realize()
    v = em.randn(2, 4, 8, 16, device=device).realize()
    # scores, row max, row sum, the probabilities (stored: the product with v would recompute the softmax once per
    # output feature), the product with v
    assert kernel_count(F.scaled_dot_product_attention(q, k, v, is_causal=True)) <= 5
    with pytest.raises(ValueError, match="attn_mask should not be set when is_causal=True"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=em.ones(8, 8, device=device).bool(), is_causal=True)
    with pytest.raises(em.ShapeError, match=r"query \[2, 4, 8, 16\], key \[2, 4, 8, 5\]"):
        F.scaled_dot_product_attention(q, em.ones(2, 4, 8, 5, device=device), v)
    with pytest.raises(em.ShapeError, match=r"attn_mask of shape \[3, 3\].*\[2, 4, 8, 8\]"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=em.ones(3, 3, device=device))
    with pytest.raises(em.DTypeError, match="same dtype.*float32, float64 and float32"):
        F.scaled_dot_product_attention(q, k.double(), v)
    with pytest.raises(em.DTypeError, match="attn_mask dtype to be bool or float, got int64"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=em.ones(8, 8, dtype=em.int64, device=device))


# ---- losses -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_and_nll(device: str, dtype: type) -> None:
    logits, tlogits = pair(random_array((6, 5), dtype, low=-4, high=4), device)
    target, ttarget = pair(np.array([0, 4, 2, -100, 1, 4]), device)
    other_target, tother_target = pair(np.array([0, 4, 2, 3, 1, 4]), device)
    weight, tweight = pair(random_array((5,), dtype, seed=1, low=0.1, high=2), device)
    for reduction in ("mean", "sum", "none"):
        for options in ({}, {"weight": (weight, tweight)}, {"label_smoothing": 0.2},
                        {"weight": (weight, tweight), "label_smoothing": 0.1},
                        {"target": (other_target, tother_target), "label_smoothing": 0.1, "ignore_index": 4}):
            ours = {"target": target} | {key: value[0] if isinstance(value, tuple) else value
                                         for key, value in options.items()}
            theirs = {"target": ttarget} | {key: value[1] if isinstance(value, tuple) else value
                                            for key, value in options.items()}
            assert_close(F.cross_entropy(logits, reduction=reduction, **ours),
                         TF.cross_entropy(tlogits, reduction=reduction, **theirs), atol=1e-5)
        log_probabilities, tlog_probabilities = logits.log_softmax(1), tlogits.log_softmax(1)
        assert_close(F.nll_loss(log_probabilities, target, weight, reduction=reduction),
                     TF.nll_loss(tlog_probabilities, ttarget, tweight, reduction=reduction), atol=1e-5)
    spatial, tspatial = pair(random_array((2, 5, 3, 4), dtype, seed=2), device)  # [N, C, d1, d2]
    spatial_target, tspatial_target = pair(random_array((2, 3, 4), np.int64, seed=3, low=0, high=0.8), device)
    assert_close(F.cross_entropy(spatial, spatial_target), TF.cross_entropy(tspatial, tspatial_target), atol=1e-5)
    assert_close(F.cross_entropy(spatial, spatial_target, reduction="none", label_smoothing=0.3),
                 TF.cross_entropy(tspatial, tspatial_target, reduction="none", label_smoothing=0.3), atol=1e-5)
    single, tsingle = pair(random_array((5,), dtype, seed=4), device)  # unbatched [C] with a 0-d target
    assert_close(F.cross_entropy(single, em.tensor(3, device=device)), TF.cross_entropy(tsingle, torch.tensor(3)))
    probabilities, tprobabilities = pair(random_array((6, 5), dtype, seed=5, low=0, high=1), device)
    probabilities, tprobabilities = probabilities.softmax(1), tprobabilities.softmax(1)
    for options in ({}, {"label_smoothing": 0.25}):
        for reduction in ("mean", "sum", "none"):
            assert_close(F.cross_entropy(logits, probabilities, reduction=reduction, **options),
                         TF.cross_entropy(tlogits, tprobabilities, reduction=reduction, **options), atol=1e-5)
    assert_close(F.cross_entropy(logits, probabilities, weight),
                 TF.cross_entropy(tlogits, tprobabilities, tweight), atol=1e-5)
    uint8_target, tuint8_target = pair(np.array([1, 0, 3, 2, 4, 0], np.uint8), device)
    assert_close(F.cross_entropy(logits[:, :].T.T, uint8_target), TF.cross_entropy(tlogits, tuint8_target), atol=1e-5)
    all_ignored, tall_ignored = pair(np.full((6,), -100), device)
    assert_close(F.cross_entropy(logits, all_ignored), TF.cross_entropy(tlogits, tall_ignored))  # 0 / 0: nan


def test_pointwise_losses(device: str) -> None:
    x, tx = pair(random_array((4, 5), low=-3, high=3), device)
    y, ty = pair(random_array((4, 5), seed=1, low=-3, high=3), device)
    row, trow = pair(random_array((5,), seed=2), device)
    for reduction in ("mean", "sum", "none"):
        assert_close(F.mse_loss(x, y, reduction=reduction), TF.mse_loss(tx, ty, reduction=reduction), atol=1e-5)
        assert_close(F.l1_loss(x, y, reduction=reduction), TF.l1_loss(tx, ty, reduction=reduction), atol=1e-5)
        for beta in (1.0, 0.5, 0.0):
            assert_close(F.smooth_l1_loss(x, y, reduction=reduction, beta=beta),
                         TF.smooth_l1_loss(tx, ty, reduction=reduction, beta=beta), atol=1e-5)
        assert_close(F.huber_loss(x, y, reduction=reduction, delta=0.7),
                     TF.huber_loss(tx, ty, reduction=reduction, delta=0.7), atol=1e-5)
    with pytest.warns(UserWarning):  # torch warns about broadcasting targets; ember follows its result
        expected = TF.mse_loss(tx, trow)
    assert_close(F.mse_loss(x, row), expected, atol=1e-5)
    assert_close(F.l1_loss(x.T, y.T), TF.l1_loss(tx.T, ty.T), atol=1e-5)


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides the total loss")  # torch's kl_div 'mean' notice
def test_binary_losses(device: str) -> None:
    logits_array = random_array((3, 7), low=-6, high=6)
    logits_array[0, :3] = [-100.0, 100.0, 0.0]  # extreme logits stay finite
    logits, tlogits = pair(logits_array, device)
    target, ttarget = pair(random_array((3, 7), seed=1, low=0, high=1), device)
    weight, tweight = pair(random_array((7,), seed=2, low=0, high=2), device)
    pos_weight, tpos_weight = pair(random_array((7,), seed=3, low=0.5, high=3), device)
    for reduction in ("mean", "sum", "none"):
        assert_close(F.binary_cross_entropy_with_logits(logits, target, reduction=reduction),
                     TF.binary_cross_entropy_with_logits(tlogits, ttarget, reduction=reduction), atol=1e-5)
        assert_close(F.binary_cross_entropy_with_logits(logits, target, weight, reduction=reduction,
                                                        pos_weight=pos_weight),
                     TF.binary_cross_entropy_with_logits(tlogits, ttarget, tweight, reduction=reduction,
                                                         pos_weight=tpos_weight), atol=1e-4)
        probabilities = logits.clamp(-10, 10).sigmoid()  # sigmoid(-100) is a float32 denormal: no digits to compare
        assert_close(F.binary_cross_entropy(probabilities, target, weight, reduction=reduction),
                     TF.binary_cross_entropy(tlogits.clamp(-10, 10).sigmoid(), ttarget, tweight, reduction=reduction),
                     atol=1e-4)
    edges, tedges = pair(np.array([0.0, 1.0, 0.0, 1.0, 0.5], np.float32), device)  # logs clamp at -100
    labels, tlabels = pair(np.array([0.0, 1.0, 1.0, 0.0, 1.0], np.float32), device)
    assert_close(F.binary_cross_entropy(edges, labels, reduction="none"),
                 TF.binary_cross_entropy(tedges, tlabels, reduction="none"))
    log_input, tlog_input = pair(random_array((3, 4), seed=4), device)
    log_input, tlog_input = log_input.log_softmax(1), tlog_input.log_softmax(1)
    kl_target_array = random_array((3, 4), seed=5, low=0, high=1)
    kl_target_array[0, 0] = 0.0
    kl_target, tkl_target = pair(kl_target_array, device)
    for reduction in ("mean", "sum", "none", "batchmean"):
        assert_close(F.kl_div(log_input, kl_target, reduction=reduction),
                     TF.kl_div(tlog_input, tkl_target, reduction=reduction), atol=1e-5)
    assert_close(F.kl_div(log_input, log_input.flip(1), reduction="sum", log_target=True),
                 TF.kl_div(tlog_input, tlog_input.flip(1), reduction="sum", log_target=True), atol=1e-5)


def test_loss_errors(device: str) -> None:
    logits = em.ones(3, 4, device=device)
    with pytest.raises(em.ShapeError, match=r"input batch_size \(3\) to match target batch_size \(2\)"):
        F.cross_entropy(logits, em.tensor([1, 2], device=device))
    with pytest.raises(ValueError, match="'avg' is not a valid value for reduction"):
        F.cross_entropy(logits, em.tensor([1, 2, 3], device=device), reduction="avg")
    with pytest.raises(em.ShapeError, match=r"weight tensor should be defined either for all 4 classes.*\[3\]"):
        F.cross_entropy(logits, em.tensor([1, 2, 3], device=device), weight=em.ones(3, device=device))
    with pytest.raises(em.DTypeError, match="target dtype to be int64 or uint8.*int32"):
        F.nll_loss(logits, em.tensor([1, 2, 3], dtype=em.int32, device=device))
    with pytest.raises(em.ShapeError, match=r"probability targets must have the input's shape \[3, 4\].*\[3, 5\]"):
        F.cross_entropy(logits, em.ones(3, 5, device=device))
    with pytest.raises(ValueError, match="label_smoothing must be between 0.0 and 1.0"):
        F.cross_entropy(logits, em.tensor([1, 2, 3], device=device), label_smoothing=1.5)
    with pytest.raises(em.ShapeError, match=r"target size \(\[3, 1\]\).*input size \(\[3, 4\]\)"):
        F.binary_cross_entropy(logits.sigmoid(), em.ones(3, 1, device=device))
    with pytest.raises(em.ShapeError, match=r"\(3, 4\).*\(2, 4\)"):
        F.mse_loss(logits, em.ones(2, 4, device=device))
    with pytest.raises(em.DTypeError, match="floating point input, got int64"):
        F.l1_loss(em.ones(2, dtype=em.int64, device=device), em.ones(2, dtype=em.int64, device=device))


def test_zero_size_inputs_and_pad(device: str) -> None:
    empty, tempty = pair(np.zeros((0, 5), np.float32), device)
    no_targets, tno_targets = pair(np.zeros((0,), np.int64), device)
    assert_close(empty.layer_norm(5), TF.layer_norm(tempty, (5,)))
    assert_close(F.cross_entropy(empty, no_targets), TF.cross_entropy(tempty, tno_targets))  # mean of nothing: nan
    assert_close(F.cross_entropy(empty, no_targets, reduction="sum"),
                 TF.cross_entropy(tempty, tno_targets, reduction="sum"))
    assert_close(F.mse_loss(empty, empty), TF.mse_loss(tempty, tempty))
    assert_close(F.embedding(no_targets, em.ones(3, 2, device=device)), TF.embedding(tno_targets, torch.ones(3, 2)))
    query, tquery = pair(random_array((2, 4)), device)
    assert_close(F.scaled_dot_product_attention(query, empty[:, :4], empty[:, :2]),  # no keys: zeros
                 TF.scaled_dot_product_attention(tquery, tempty[:, :4], tempty[:, :2]))
    assert_close(F.scaled_dot_product_attention(empty[:, :4], query, query), TF.scaled_dot_product_attention(
        tempty[:, :4], tquery, tquery))
    x, tx = pair(random_array((1, 2, 3, 4)), device)
    assert_close(F.pad(x, (1, 2)), TF.pad(tx, (1, 2)))
    assert_close(F.pad(x, (1, 0, 0, 2), value=-1.5), TF.pad(tx, (1, 0, 0, 2), value=-1.5))
    for mode in ("reflect", "replicate", "circular"):
        assert_close(F.pad(x, (2, 1, 1, 2), mode=mode), TF.pad(tx, (2, 1, 1, 2), mode=mode))


def test_functional_forms_of_activations(device: str) -> None:
    x, tx = pair(random_array((3, 17), low=-4, high=4), device)
    for name in ("relu", "relu6", "leaky_relu", "elu", "selu", "celu", "gelu", "silu", "mish", "hardtanh",
                 "hardsigmoid", "hardswish", "sigmoid", "tanh", "softplus", "softsign", "logsigmoid"):
        assert_close(getattr(F, name)(x), getattr(TF, name)(tx), atol=1e-5)
    assert_close(F.gelu(x, approximate="tanh"), TF.gelu(tx, approximate="tanh"), atol=1e-5)
    assert_close(F.leaky_relu(x, 0.2), TF.leaky_relu(tx, 0.2))
    inplace, tinplace = pair(random_array((4,)), device)
    F.relu(inplace, inplace=True)
    TF.relu(tinplace, inplace=True)
    assert_close(inplace, tinplace)
    left, tleft = pair(random_array((2, 3)), device)
    right, tright = pair(random_array((2, 4), seed=1), device)
    weight, tweight = pair(random_array((5, 3, 4), seed=2), device)
    bias, tbias = pair(random_array((5,), seed=3), device)
    assert_close(F.bilinear(left, right, weight, bias), TF.bilinear(tleft, tright, tweight, tbias), atol=1e-5)
    labels, tlabels = pair(np.array([2, 0, 1]), device)
    assert_close(F.one_hot(labels, 4), TF.one_hot(tlabels, 4))
