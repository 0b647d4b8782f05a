"""Gradients of the nn functions (conv, pooling, norms, attention, losses, indexing) against torch.autograd.grad."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional

import ember as em
import ember.nn.functional
from tests.gradcheck import Case, check_gradients


def F(tensor: Any) -> ModuleType:
    """torch.nn.functional or ember.nn.functional, whichever matches the tensor (the signatures are the same)."""
    return torch.nn.functional if isinstance(tensor, torch.Tensor) else ember.nn.functional


def like(tensor: Any, data: Any, dtype: Any = None) -> Any:
    """A constant (indices, masks, targets) of the same framework and device as `tensor`."""
    array = np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype)
    if isinstance(tensor, torch.Tensor):
        return torch.tensor(array)
    return em.tensor(array, device=tensor.device)


CLASSES = [1, 0, 3, 3, 2]
PROBABILITIES = np.random.default_rng(3).dirichlet(np.ones(4), size=5).astype(np.float32)

CONVOLUTION = [
    Case("conv1d", lambda x, w, b: F(x).conv1d(x, w, b), [(2, 3, 9), (4, 3, 3), (4,)]),
    Case("conv1d_stride_padding_dilation", lambda x, w: F(x).conv1d(x, w, stride=2, padding=2, dilation=2),
         [(2, 2, 11), (3, 2, 3)]),
    Case("conv1d_groups", lambda x, w: F(x).conv1d(x, w, groups=2), [(1, 4, 7), (6, 2, 3)]),
    Case("conv2d", lambda x, w, b: F(x).conv2d(x, w, b), [(2, 3, 6, 5), (4, 3, 3, 3), (4,)], second_order=True),
    Case("conv2d_stride_padding", lambda x, w: F(x).conv2d(x, w, stride=2, padding=1), [(2, 2, 7, 6), (3, 2, 3, 3)]),
    Case("conv2d_dilation", lambda x, w: F(x).conv2d(x, w, dilation=(2, 1), padding=(2, 0)), [(1, 2, 8, 6), (2, 2, 3, 2)]),
    Case("conv2d_groups", lambda x, w, b: F(x).conv2d(x, w, b, groups=2), [(2, 4, 5, 5), (6, 2, 3, 3), (6,)]),
    Case("conv2d_depthwise_same", lambda x, w: F(x).conv2d(x, w, padding="same", groups=3), [(1, 3, 6, 6), (3, 1, 3, 3)]),
    Case("conv2d_unbatched_1x1", lambda x, w: F(x).conv2d(x, w), [(3, 4, 4), (5, 3, 1, 1)]),
    Case("conv3d", lambda x, w: F(x).conv3d(x, w, padding=1), [(1, 2, 4, 4, 3), (2, 2, 2, 3, 2)]),
]

POOLING = [
    Case("max_pool1d", lambda x: F(x).max_pool1d(x, 3, stride=2, padding=1), [(2, 3, 9)]),
    Case("max_pool2d", lambda x: F(x).max_pool2d(x, 2), [(2, 3, 6, 6)]),
    Case("max_pool2d_stride_padding_dilation", lambda x: F(x).max_pool2d(x, 3, stride=2, padding=1, dilation=(1, 2)),
         [(1, 2, 7, 8)]),
    Case("max_pool2d_ceil_mode", lambda x: F(x).max_pool2d(x, 2, ceil_mode=True), [(1, 2, 5, 7)]),
    Case("max_pool2d_overlapping", lambda x: F(x).max_pool2d(x, 3, stride=1), [(1, 1, 5, 5)]),
    Case("avg_pool1d", lambda x: F(x).avg_pool1d(x, 3, stride=2, padding=1, count_include_pad=False), [(2, 3, 8)]),
    Case("avg_pool2d", lambda x: F(x).avg_pool2d(x, 2), [(2, 3, 6, 6)]),
    Case("avg_pool2d_padding_ceil", lambda x: F(x).avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True),
         [(1, 2, 6, 7)]),
    Case("avg_pool2d_divisor_override", lambda x: F(x).avg_pool2d(x, 2, divisor_override=3), [(1, 2, 4, 4)]),
    Case("adaptive_avg_pool1d", lambda x: F(x).adaptive_avg_pool1d(x, 3), [(2, 3, 7)]),
    Case("adaptive_avg_pool2d", lambda x: F(x).adaptive_avg_pool2d(x, (3, 2)), [(1, 2, 7, 5)]),
    Case("adaptive_avg_pool2d_global", lambda x: F(x).adaptive_avg_pool2d(x, 1), [(2, 3, 4, 4)]),
    Case("adaptive_max_pool2d", lambda x: F(x).adaptive_max_pool2d(x, (2, 3)), [(1, 2, 5, 7)]),
]

NORMALIZATION = [
    Case("layer_norm", lambda x, w, b: F(x).layer_norm(x, (5,), w, b), [(2, 3, 5), (5,), (5,)], second_order=True),
    Case("layer_norm_two_dims", lambda x: F(x).layer_norm(x, (3, 5)), [(2, 3, 5)]),
    Case("rms_norm", lambda x, w: F(x).rms_norm(x, (5,), w), [(2, 3, 5), (5,)]),
    Case("rms_norm_eps", lambda x: F(x).rms_norm(x, (3, 5), eps=1e-3), [(2, 3, 5)]),
    Case("group_norm", lambda x, w, b: F(x).group_norm(x, 2, w, b), [(2, 4, 3, 3), (4,), (4,)]),
    Case("batch_norm_training", lambda x, w, b: F(x).batch_norm(x, None, None, w, b, training=True),
         [(4, 3, 2, 2), (3,), (3,)]),
    Case("batch_norm_1d_training", lambda x: F(x).batch_norm(x, None, None, training=True), [(6, 4)]),
    Case("batch_norm_eval", lambda x, w, b: F(x).batch_norm(x, like(x, [0.1, -0.2, 0.3], "float32"),
                                                           like(x, [1.0, 0.5, 2.0], "float32"), w, b),
         [(4, 3, 5), (3,), (3,)]),
    Case("normalize", lambda x: F(x).normalize(x, dim=1), [(3, 4)]),
    Case("normalize_p1", lambda x: F(x).normalize(x, p=1.0, dim=-1), [(2, 3, 4)]),
]

LAYERS_AND_ATTENTION = [
    Case("linear", lambda x, w, b: F(x).linear(x, w, b), [(2, 3, 4), (5, 4), (5,)]),
    Case("linear_no_bias", lambda x, w: F(x).linear(x, w), [(3, 4), (2, 4)]),
    Case("bilinear", lambda x, y, w, b: F(x).bilinear(x, y, w, b), [(3, 4), (3, 2), (5, 4, 2), (5,)]),
    Case("embedding", lambda w: F(w).embedding(like(w, [[0, 2, 2], [4, 0, 1]]), w), [(5, 3)]),
    Case("embedding_padding_idx", lambda w: F(w).embedding(like(w, [1, 2, 1, 0]), w, padding_idx=1), [(4, 3)]),
    Case("attention", lambda q, k, v: F(q).scaled_dot_product_attention(q, k, v),
         [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5)], second_order=True),
    Case("attention_causal_scale", lambda q, k, v: F(q).scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                         scale=0.3),
         [(1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4)]),
    Case("attention_bool_mask", lambda q, k, v: F(q).scaled_dot_product_attention(
        q, k, v, attn_mask=like(q, np.random.default_rng(1).random((4, 6)) < 0.7)), [(2, 4, 8), (2, 6, 8), (2, 6, 3)]),
    Case("attention_float_mask", lambda q, k, v, m: F(q).scaled_dot_product_attention(q, k, v, attn_mask=m),
         [(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4), (3, 5)]),
    Case("attention_gqa", lambda q, k, v: F(q).scaled_dot_product_attention(q, k, v, enable_gqa=True),
         [(1, 4, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)]),
]

LOSSES = [
    Case("cross_entropy", lambda x: F(x).cross_entropy(x, like(x, CLASSES)), [(5, 4)]),
    Case("cross_entropy_weight_ignore_sum", lambda x: F(x).cross_entropy(
        x, like(x, CLASSES), weight=like(x, [0.5, 2.0, 1.0, 1.5], "float32"), ignore_index=3, reduction="sum"),
         [(5, 4)]),
    Case("cross_entropy_label_smoothing", lambda x: F(x).cross_entropy(x, like(x, CLASSES), label_smoothing=0.2),
         [(5, 4)]),
    Case("cross_entropy_probabilities", lambda x: F(x).cross_entropy(x, like(x, PROBABILITIES)), [(5, 4)]),
    Case("cross_entropy_spatial", lambda x: F(x).cross_entropy(x, like(x, [[[0, 2], [1, 1]], [[2, 0], [0, 1]]])),
         [(2, 3, 2, 2)]),
    Case("nll_loss", lambda x: F(x).nll_loss(x.log_softmax(1), like(x, CLASSES), reduction="none"), [(5, 4)]),
    Case("mse_loss", lambda x, y: F(x).mse_loss(x, y), [(3, 4), (3, 4)], second_order=True),
    Case("mse_loss_sum", lambda x, y: F(x).mse_loss(x, y, reduction="sum"), [(3, 4), (3, 4)]),
    Case("l1_loss", lambda x, y: F(x).l1_loss(x, y, reduction="none"), [(3, 4), (3, 4)]),
    Case("smooth_l1_loss", lambda x, y: F(x).smooth_l1_loss(x, y, beta=0.5), [(3, 4), (3, 4)]),
    Case("huber_loss", lambda x, y: F(x).huber_loss(x, y, delta=0.7), [(3, 4), (3, 4)]),
    Case("kl_div", lambda x, y: F(x).kl_div(x.log_softmax(1), y.softmax(1), reduction="batchmean"), [(3, 4), (3, 4)]),
    Case("kl_div_log_target", lambda x, y: F(x).kl_div(x, y, reduction="sum", log_target=True), [(3, 4), (3, 4)]),
    Case("binary_cross_entropy", lambda x, y: F(x).binary_cross_entropy(x.sigmoid(), y.sigmoid()), [(3, 4), (3, 4)]),
    Case("binary_cross_entropy_with_logits", lambda x, y: F(x).binary_cross_entropy_with_logits(
        x, y.sigmoid(), pos_weight=like(x, [0.5, 1.0, 2.0, 3.0], "float32")), [(3, 4), (3, 4)]),
]

INDEXING = [
    Case("index_tensor", lambda x: x[like(x, [2, 0, 2])], [(3, 4)]),
    Case("index_tensor_middle", lambda x: x[:, like(x, [[1, 3], [3, 3]]), 1:], [(2, 4, 3)]),
    Case("index_two_tensors", lambda x: x[like(x, [0, 2, 2]), like(x, [1, 1, 3])], [(3, 4)]),
    Case("index_list", lambda x: x[[1, 1, 0]], [(2, 3)]),
    Case("index_bool_mask", lambda x: x[like(x, [[True, False, True], [False, False, True]])], [(2, 3)]),
    Case("gather", lambda x: x.gather(1, like(x, [[0, 0, 2], [1, 2, 2]])), [(2, 3)]),
    Case("take_along_dim", lambda x: x.take_along_dim(like(x, [[1], [0]]), dim=1), [(2, 3)]),
    Case("index_select", lambda x: x.index_select(0, like(x, [2, 0, 2])), [(3, 2)]),
    Case("masked_select", lambda x: x.masked_select(like(x, [True, False, True])), [(2, 3)]),
    Case("scatter_src", lambda x, s: x.scatter(1, like(x, [[0, 2], [1, 0]]), s), [(2, 3), (2, 2)]),
    Case("scatter_add", lambda x, s: x.scatter_add(0, like(x, [[1, 0, 1], [1, 1, 0]]), s), [(2, 3), (2, 3)]),
    Case("index_put_accumulate", lambda x, v: x.index_put((like(x, [0, 2, 0]),), v, accumulate=True),
         [(3, 2), (3, 2)]),
    Case("tril_triu", lambda x: x.tril(-1) + x.triu(1) * 2, [(4, 4)]),
]

CASES = CONVOLUTION + POOLING + NORMALIZATION + LAYERS_AND_ATTENTION + LOSSES + INDEXING


@pytest.mark.parametrize("case", [pytest.param(case, id=case.name, marks=case.marks) for case in CASES])
def test_gradient(case: Case, device: str) -> None:
    check_gradients(case, device)


def test_case_names_are_unique() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)


def test_dropout_gradient_uses_the_same_mask(device: str) -> None:
    """The dropout mask is ember's own random draw: torch, given that mask, must agree with ember's gradient."""
    data = np.random.default_rng(0).uniform(0.5, 2.0, size=(4, 6)).astype(np.float32)
    x = em.tensor(data, device=device, requires_grad=True)
    output = ember.nn.functional.dropout(x, p=0.4)
    (grad,) = em.grad(output.sum(), x)
    mask = torch.tensor(output.numpy() != 0)
    assert 0 < int(mask.sum()) < mask.numel()
    reference = torch.tensor(data, requires_grad=True)
    (torch_grad,) = torch.autograd.grad((reference * mask / 0.6).sum(), reference)
    np.testing.assert_allclose(grad.numpy(), torch_grad.numpy(), rtol=1e-6)
