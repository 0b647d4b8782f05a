"""conv1d/2d/3d, max/avg pooling (plain and adaptive) against torch: options, views, dtypes, errors, kernel counts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch.nn.functional as TF

import ember as em
import ember.nn.functional as F
from tests.helpers import assert_close, pair, random_array

CONV2D_CASES: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ((2, 3, 7, 6), (4, 3, 3, 3), {}),
    ((2, 3, 7, 6), (4, 3, 3, 2), {"stride": 2, "padding": 1}),
    ((1, 4, 9, 8), (6, 2, 3, 3), {"stride": (2, 3), "padding": (1, 2), "dilation": (2, 1), "groups": 2}),
    ((2, 4, 5, 5), (4, 1, 3, 3), {"padding": "same", "groups": 4}),  # depthwise
    ((1, 2, 6, 7), (3, 2, 2, 4), {"padding": "same", "dilation": 2}),  # even kernels: asymmetric 'same' padding
    ((2, 3, 5, 4), (2, 3, 1, 1), {"padding": "valid", "stride": 2}),  # 1x1 kernel, stride skips rows
    ((1, 1, 3, 3), (1, 1, 3, 3), {}),  # kernel == input: 1x1 output
    ((3, 2, 4, 4), (5, 2, 2, 2), {"stride": 2}),  # non-overlapping windows
    ((1, 2, 17, 3), (1, 2, 5, 3), {"stride": (3, 1), "dilation": (3, 1)}),
]


def test_conv2d(device: str) -> None:
    for case, (input_shape, weight_shape, options) in enumerate(CONV2D_CASES):
        x, tx = pair(random_array(input_shape, seed=case), device)
        w, tw = pair(random_array(weight_shape, seed=case + 50), device)
        b, tb = pair(random_array(weight_shape[:1], seed=case + 100), device)
        assert_close(F.conv2d(x, w, b, **options), TF.conv2d(tx, tw, tb, **options), atol=1e-4)
    x, tx = pair(random_array((3, 6, 5)), device)  # unbatched [C, H, W], no bias
    w, tw = pair(random_array((2, 3, 2, 2), seed=1), device)
    assert_close(x.conv2d(w), TF.conv2d(tx, tw), atol=1e-4)


def test_conv_views_dtypes_and_dims(device: str) -> None:
    x, tx = pair(random_array((5, 6, 3, 2)), device)  # used as [N=2, C=3, H=6, W=5]: a permuted, non-contiguous view
    w, tw = pair(random_array((4, 3, 3, 3), seed=1), device)
    view, tview = x.permute(3, 2, 1, 0), tx.permute(3, 2, 1, 0)
    assert_close(view.conv2d(w.flip(2), padding=1), TF.conv2d(tview, tw.flip(2), padding=1), atol=1e-4)
    assert_close(view[:, :, 1:, ::2].conv2d(w), TF.conv2d(tview[:, :, 1:, ::2], tw), atol=1e-4)
    x64, tx64 = pair(random_array((2, 2, 6, 5), np.float64), device)
    w64, tw64 = pair(random_array((3, 2, 3, 2), np.float64, seed=2), device)
    b64, tb64 = pair(random_array((3,), np.float64, seed=3), device)
    assert_close(x64.conv2d(w64, b64, stride=(1, 2), padding=1),
                 TF.conv2d(tx64, tw64, tb64, stride=(1, 2), padding=1), atol=1e-10)
    integers, tintegers = pair(random_array((1, 2, 4, 4), np.int64), device)
    integer_weight, tinteger_weight = pair(random_array((2, 2, 2, 2), np.int64, seed=4), device)
    assert_close(integers.conv2d(integer_weight), TF.conv2d(tintegers, tinteger_weight))
    signal, tsignal = pair(random_array((2, 4, 17)), device)
    kernel, tkernel = pair(random_array((6, 2, 3), seed=5), device)
    bias, tbias = pair(random_array((6,), seed=6), device)
    for options in ({}, {"stride": 2, "padding": 2, "dilation": 3, "groups": 2}, {"padding": "same", "groups": 2}):
        options = options if "groups" in options else options | {"groups": 2}
        assert_close(F.conv1d(signal, kernel, bias, **options), TF.conv1d(tsignal, tkernel, tbias, **options),
                     atol=1e-4)
    assert_close(signal[0].conv1d(kernel, groups=2), TF.conv1d(tsignal[0], tkernel, groups=2), atol=1e-4)
    volume, tvolume = pair(random_array((1, 2, 4, 5, 3)), device)
    filters, tfilters = pair(random_array((3, 2, 2, 3, 2), seed=7), device)
    assert_close(F.conv3d(volume, filters, stride=(1, 2, 1), padding=1),
                 TF.conv3d(tvolume, tfilters, stride=(1, 2, 1), padding=1), atol=1e-4)
    empty, tempty = pair(np.zeros((0, 3, 5, 5), np.float32), device)
    assert_close(empty.conv2d(w), TF.conv2d(tempty, tw))


def test_conv2d_bias_relu_is_one_kernel(device: str) -> None:
    """bias and relu fuse into the convolution's reduce (a row stride and row padding need no copy of the input;
    a stride or padding along the last axis adds one: tests/test_conv_kernels.py)."""
    x = em.randn(2, 4, 9, 9, device=device).realize()
    w = em.randn(8, 2, 3, 3, device=device).realize()
    b = em.randn(8, device=device).realize()
    with em.profile() as profile:
        x.conv2d(w, b, stride=(2, 1), padding=(1, 0), groups=2).relu().realize()
    assert len(profile.kernels) == 1, str(profile)


def test_conv_errors(device: str) -> None:
    x = em.ones(1, 4, 6, 6, device=device)
    w = em.ones(2, 4, 3, 3, device=device)
    with pytest.raises(em.ShapeError, match=r"groups=1, weight of shape \[2, 3, 3, 3\].*\[1, 4, 6, 6\] to have 3 chan"):
        x.conv2d(em.ones(2, 3, 3, 3, device=device))
    with pytest.raises(em.ShapeError, match=r"groups=2, expected weight to be divisible by 2.*\[3, 2, 3, 3\]"):
        x.conv2d(em.ones(3, 2, 3, 3, device=device), groups=2)
    with pytest.raises(em.ShapeError, match=r"bias to be 1-d with 2 elements.*\[3\]"):
        x.conv2d(w, em.ones(3, device=device))
    with pytest.raises(em.ShapeError, match=r"padded input size per channel: \[6, 6\].*kernel size: \[7, 7\]"):
        x.conv2d(em.ones(2, 4, 7, 7, device=device))
    with pytest.raises(em.ShapeError, match=r"padded input size.*kernel size: \[5, 5\]"):
        x[:, :, :4, :4].conv2d(w, dilation=2)
    with pytest.raises(ValueError, match="padding='same' is not supported for strided convolutions"):
        x.conv2d(w, stride=2, padding="same")
    with pytest.raises(ValueError, match="invalid padding string 'full'"):
        x.conv2d(w, padding="full")
    with pytest.raises(ValueError, match="negative padding"):
        x.conv2d(w, padding=-1)
    with pytest.raises(ValueError, match=r"non-positive stride.*\[0, 0\]"):
        x.conv2d(w, stride=0)
    with pytest.raises(ValueError, match=r"stride to be a single int or a list of 2 ints.*\[1, 1, 1\]"):
        x.conv2d(w, stride=(1, 1, 1))
    with pytest.raises(em.ShapeError, match=r"expected 3-d \(unbatched\) or 4-d \(batched\) input.*\[6, 6\]"):
        x[0, 0].conv2d(w)
    with pytest.raises(em.ShapeError, match=r"expected 4-d weight.*\[2, 4, 3\]"):
        x.conv2d(em.ones(2, 4, 3, device=device))
    with pytest.raises(em.DTypeError, match="one dtype, got float32, float64"):
        x.conv2d(w.double())
    with pytest.raises(em.ShapeError, match=r"conv1d: given groups=1.*to have 4 channels, but got 6"):
        em.ones(2, 6, 5, device=device).conv1d(em.ones(1, 4, 3, device=device))


POOL_CASES: list[dict[str, Any]] = [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    {"kernel_size": (2, 3), "stride": (1, 2), "padding": (1, 1), "ceil_mode": True},
    {"kernel_size": 3, "stride": 1, "padding": 1},
    {"kernel_size": (1, 4), "stride": (2, 3)},
    {"kernel_size": 4, "stride": 3, "padding": 2, "ceil_mode": True},  # the last window starts in the padding
]


def test_max_pool2d(device: str) -> None:
    x, tx = pair(random_array((2, 3, 7, 9)), device)
    dilated = [{"kernel_size": 2, "dilation": 2}, {"kernel_size": 3, "dilation": (1, 2), "padding": 1}]
    for options in POOL_CASES + dilated:
        assert_close(F.max_pool2d(x, **options), TF.max_pool2d(tx, **options))
    values, indices = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    expected_values, expected_indices = TF.max_pool2d(tx, 3, 2, 1, return_indices=True)
    assert_close(values, expected_values)
    assert_close(indices, expected_indices)
    ties, tties = pair(np.array([[[1.0, 3.0, 3.0], [3.0, 0.0, 3.0], [2.0, 3.0, 1.0]]], np.float32), device)
    assert_close(ties.max_pool2d(2, 1, return_indices=True), TF.max_pool2d(tties, 2, 1, return_indices=True))
    assert_close(x[0].transpose(1, 2).max_pool2d(3), TF.max_pool2d(tx[0].transpose(1, 2), 3))  # unbatched view
    integers, tintegers = pair(random_array((1, 2, 5, 5), np.int32), device)
    assert_close(integers.max_pool2d(2, padding=1), TF.max_pool2d(tintegers, 2, padding=1))
    signal, tsignal = pair(random_array((2, 3, 11), np.float64), device)
    assert_close(F.max_pool1d(signal, 3, 2, 1, 2, ceil_mode=True), TF.max_pool1d(tsignal, 3, 2, 1, 2, ceil_mode=True))


def test_avg_pool2d(device: str) -> None:
    x, tx = pair(random_array((2, 3, 7, 9)), device)
    for options in POOL_CASES:
        for count_include_pad in (True, False):
            assert_close(F.avg_pool2d(x, count_include_pad=count_include_pad, **options),
                         TF.avg_pool2d(tx, count_include_pad=count_include_pad, **options), atol=1e-5)
    assert_close(F.avg_pool2d(x, 3, 2, 1, divisor_override=4), TF.avg_pool2d(tx, 3, 2, 1, divisor_override=4),
                 atol=1e-5)
    assert_close(x[:, 1:].permute(0, 1, 3, 2).avg_pool2d(2), TF.avg_pool2d(tx[:, 1:].permute(0, 1, 3, 2), 2),
                 atol=1e-5)
    integers, tintegers = pair(random_array((1, 2, 6, 6), np.int64), device)
    assert_close(integers.avg_pool2d(3, 2, 1), TF.avg_pool2d(tintegers, 3, 2, 1))  # integer division truncates
    signal, tsignal = pair(random_array((3, 10), np.float64), device)  # unbatched 1-d
    assert_close(F.avg_pool1d(signal, 4, 3, 2, ceil_mode=True, count_include_pad=False),
                 TF.avg_pool1d(tsignal, 4, 3, 2, ceil_mode=True, count_include_pad=False))


ADAPTIVE_SIZES = ((1, 1), (3, 4), 7, (None, 2), (7, 9))


def test_adaptive_avg_pooling(device: str) -> None:
    x, tx = pair(random_array((2, 3, 7, 9)), device)
    for output_size in ADAPTIVE_SIZES:
        assert_close(F.adaptive_avg_pool2d(x, output_size), TF.adaptive_avg_pool2d(tx, output_size), atol=1e-5)
    signal, tsignal = pair(random_array((2, 5, 11)), device)
    assert_close(F.adaptive_avg_pool1d(signal, 4), TF.adaptive_avg_pool1d(tsignal, 4), atol=1e-5)


def test_adaptive_avg_pooling_of_equal_cells(device: str) -> None:
    """Output sizes that divide the input's (global average pooling among them): a mean over the axes split into
    cells, values and gradients as torch's."""
    for shape, output_size in [((2, 3, 6, 8), (3, 4)), ((2, 3, 6, 8), 1), ((3, 5, 8, 8), (2, 1)),
                               ((1, 2, 7, 9), (7, 9)), ((2, 4, 6, 10), (None, 5))]:
        x, tx = pair(random_array(shape, seed=len(shape)), device, requires_grad=True)
        pooled, expected = F.adaptive_avg_pool2d(x, output_size), TF.adaptive_avg_pool2d(tx, output_size)
        assert_close(pooled, expected, atol=1e-5)
        grad, tgrad = pair(random_array(tuple(expected.shape), seed=2), device)
        pooled.backward(grad)
        expected.backward(tgrad)
        assert_close(x.grad, tx.grad, atol=1e-6)
    signal, tsignal = pair(random_array((2, 5, 12)), device)
    assert_close(F.adaptive_avg_pool1d(signal, 4), TF.adaptive_avg_pool1d(tsignal, 4), atol=1e-5)
    volume, tvolume = pair(random_array((1, 2, 4, 6, 8)), device)
    assert_close(F.adaptive_avg_pool3d(volume, (2, 3, 1)), TF.adaptive_avg_pool3d(tvolume, (2, 3, 1)), atol=1e-5)


def test_adaptive_max_pooling(device: str) -> None:
    x, tx = pair(random_array((2, 3, 7, 9)), device)
    for output_size in ADAPTIVE_SIZES:
        assert_close(F.adaptive_max_pool2d(x, output_size), TF.adaptive_max_pool2d(tx, output_size))


def test_pool_kernel_counts(device: str) -> None:
    x = em.randn(2, 3, 8, 8, device=device).realize()
    for pooled in (x.max_pool2d(2), x.avg_pool2d(3, 2, 1, count_include_pad=False), x.adaptive_avg_pool2d(3),
                   x.adaptive_avg_pool2d((4, 1))):
        with em.profile() as profile:
            pooled.realize()
        assert len(profile.kernels) == 1, str(profile)


def test_pool_errors(device: str) -> None:
    x = em.ones(1, 2, 4, 4, device=device)
    with pytest.raises(ValueError, match="pad should be at most half of effective kernel size.*pad=2, kernel_size=3"):
        x.max_pool2d(3, padding=2)
    with pytest.raises(ValueError, match="pad should be at most half.*pad=2, kernel_size=3"):
        x.avg_pool2d(3, padding=2)
    with pytest.raises(em.ShapeError, match=r"output size is too small"):
        x.max_pool2d(5)
    with pytest.raises(ValueError, match=r"non-positive stride"):
        x.avg_pool2d(2, stride=0)
    with pytest.raises(em.ShapeError, match=r"max_pool2d: expected 3-d \(unbatched\) or 4-d.*\[4\]"):
        em.ones(4, device=device).max_pool2d(2)
    with pytest.raises(em.DTypeError, match="adaptive_avg_pool2d: expected a floating point input, got int64"):
        x.long().adaptive_avg_pool2d(2)
