"""Convolution and max pooling as their own autograd steps: forward and both gradients against torch (1d/2d/3d,
stride, padding, dilation, groups, odd sizes, sizes the vector tiles divide and ones they do not, a filters'
gradient summed in two stages), max pool's tie-breaking, and the kernel counts of one layer's forward and backward."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as TF

import ember as em
from tests.helpers import assert_close, pair, random_array

# (input shape, weight shape, options): spatial rank from the shapes
CASES: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ((2, 3, 17), (4, 3, 3), {"padding": 1}),
    ((2, 4, 23), (6, 2, 5), {"stride": 3, "padding": 2, "groups": 2}),  # a stride along the last axis: its phases
    ((1, 2, 9, 14), (3, 2, 3, 4), {"stride": (2, 3), "padding": (1, 3)}),
    ((2, 4, 19), (6, 2, 4), {"stride": 3, "padding": 2, "dilation": 2, "groups": 2}),
    ((2, 3, 9, 16), (8, 3, 3, 3), {"padding": 1}),  # output width 16: the vector tile
    ((1, 2, 7, 5), (3, 2, 2, 3), {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2)}),
    ((2, 4, 11, 10), (4, 1, 3, 3), {"stride": 2, "padding": 1, "groups": 4}),  # depthwise, strided
    ((1, 6, 8, 9), (4, 3, 5, 1), {"padding": (3, 0), "groups": 2}),  # padding past the kernel's reach
    ((1, 2, 6, 8), (3, 2, 1, 1), {"stride": 2}),  # 1x1 kernel: rows and columns the stride skips
    ((1, 2, 5, 6, 7), (3, 2, 3, 2, 3), {"stride": (1, 2, 1), "padding": 1, "dilation": (2, 1, 1)}),
]


def _check(device: str, input_shape: tuple[int, ...], weight_shape: tuple[int, ...], options: dict[str, Any],
           seed: int, weight_atol: float = 2e-4) -> None:
    spatial = len(input_shape) - 2
    function = {1: TF.conv1d, 2: TF.conv2d, 3: TF.conv3d}[spatial]
    x, tx = pair(random_array(input_shape, seed=seed), device, requires_grad=True)
    w, tw = pair(random_array(weight_shape, seed=seed + 1), device, requires_grad=True)
    b, tb = pair(random_array(weight_shape[:1], seed=seed + 2), device, requires_grad=True)
    output = getattr(x, f"conv{spatial}d")(w, b, **options)
    expected = function(tx, tw, tb, **options)
    assert_close(output, expected, atol=1e-4)
    grad, tgrad = pair(random_array(tuple(expected.shape), seed=seed + 3), device)
    output.backward(grad)
    expected.backward(tgrad)
    assert_close(x.grad, tx.grad, atol=1e-4)
    assert_close(w.grad, tw.grad, atol=weight_atol)
    assert_close(b.grad, tb.grad, atol=1e-4)


def test_convolution_gradients_match_torch(device: str) -> None:
    for number, (input_shape, weight_shape, options) in enumerate(CASES):
        _check(device, input_shape, weight_shape, options, seed=10 * number)


# convolutions strided along the last axis: the input split into the stride's phases, the input's gradient computed
# by output phase (sub-pixel) and the filters' gradient from the phases; kernels shorter than, equal to and longer
# than the stride, windows that do not reach the input's end, a dilated axis of stride 1, groups, 1d/2d/3d
PHASED_CASES: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ((3, 16, 16, 16), (32, 16, 3, 3), {"stride": 2, "padding": 1}),  # the resnet program's strided block
    ((3, 16, 16, 16), (32, 16, 1, 1), {"stride": 2}),  # its 1x1 downsample
    ((2, 3, 13, 21), (4, 3, 5, 5), {"stride": 2, "padding": 2}),  # 11 positions along the last axis (past 8)
    ((2, 4, 11, 19), (6, 2, 2, 2), {"stride": 3, "groups": 2}),  # kernel shorter than the stride, ends unread
    ((1, 3, 12, 17), (2, 3, 3, 4), {"stride": (1, 3), "padding": (2, 1), "dilation": (2, 1)}),
    ((2, 2, 20), (3, 2, 7), {"stride": 4, "padding": 3}),
    ((1, 2, 5, 6, 9), (3, 2, 3, 2, 3), {"stride": (2, 1, 2), "padding": (1, 0, 1)}),
    ((2, 4, 9, 10), (4, 1, 3, 3), {"stride": 2, "padding": (0, 2), "groups": 4}),
]


def test_strided_convolution_gradients_match_torch(device: str) -> None:
    for number, (input_shape, weight_shape, options) in enumerate(PHASED_CASES):
        _check(device, input_shape, weight_shape, options, seed=100 + 10 * number)


def test_strided_convolution_with_inf_and_nan_matches_torch(device: str) -> None:
    """An inf and a NaN in the input: the phase copy and the gradients by phase spread them where torch does."""
    data = random_array((2, 3, 9, 10), seed=1)
    data[0, 1, 4, 5] = np.inf
    data[1, 2, 2, 7] = np.nan
    x, tx = pair(data, device, requires_grad=True)
    w, tw = pair(random_array((4, 3, 3, 3), seed=2), device, requires_grad=True)
    output = x.conv2d(w, stride=2, padding=1)
    expected = TF.conv2d(tx, tw, stride=2, padding=1)
    assert_close(output, expected, atol=1e-4)
    grad, tgrad = pair(random_array(tuple(expected.shape), seed=3), device)
    output.backward(grad)
    expected.backward(tgrad)
    assert_close(x.grad, tx.grad, atol=1e-4)
    assert_close(w.grad, tw.grad, atol=1e-4)


# the input's gradient by phase group (convolution_forms.phase_input_gradient): strides 2-4 and 16 with kernels
# shorter, equal, longer and even, input lengths the stride does not divide, strides with dilations sharing a factor
# (phases no tap reaches) and not, windows reading only padding, groups, a strided first axis only, batch 1, conv1d
# and conv2d, a larger size (the resnet program's strided 3x3 at batch 8)
PHASE_GROUP_CASES: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ((1, 3, 17), (5, 3, 4), {"stride": 2, "padding": 1}),  # even kernel, odd length
    ((2, 2, 23), (3, 2, 5), {"stride": 3, "padding": 4}),  # padding wider than the stride
    ((1, 2, 22), (3, 2, 3), {"stride": 2, "padding": 1, "dilation": 2}),  # odd phases: no tap
    ((2, 2, 19), (2, 2, 4), {"stride": 3, "padding": 2, "dilation": 2}),  # gcd(3, 2) = 1: taps every 3rd
    ((1, 2, 21), (2, 2, 3), {"stride": 4, "padding": 2, "dilation": 6}),  # gcd 2, kernel spans 13
    ((1, 1, 2), (1, 1, 1), {"stride": 10, "padding": 5}),  # the windows read padding only: gradient 0
    ((1, 2, 7, 9), (4, 2, 2, 4), {"stride": (3, 2), "padding": (1, 2)}),
    ((2, 4, 13, 11), (6, 2, 3, 3), {"stride": (2, 1), "padding": 1, "groups": 2}),  # first axis strided only
    ((1, 2, 10, 12), (3, 2, 3, 2), {"stride": 3, "padding": (2, 0), "dilation": (2, 3)}),
    ((1, 2, 13, 11), (3, 2, 3, 3), {"stride": 2, "padding": 2, "dilation": (2, 1)}),  # phased, dilated first axis
    ((2, 3, 32, 48), (4, 3, 16, 16), {"stride": 16}),  # a patch embedding: 16 phases of one tap per axis
    ((1, 4, 15, 17), (4, 1, 4, 4), {"stride": 4, "padding": 1, "groups": 4}),  # depthwise, lengths not a multiple
    ((8, 16, 16, 16), (32, 16, 3, 3), {"stride": 2, "padding": 1}),  # the resnet program's strided 3x3
    ((1, 8, 40, 33), (8, 8, 5, 5), {"stride": 2, "padding": 2}),
]


def test_phase_group_input_gradients_match_torch(device: str) -> None:
    for number, (input_shape, weight_shape, options) in enumerate(PHASE_GROUP_CASES):
        _check(device, input_shape, weight_shape, options, seed=300 + 10 * number)


def test_phase_groups_use_every_tap_once() -> None:
    """The input's gradient by phase multiplies each (tap, output position) pair once: per axis, the groups' taps
    times phases add up to the kernel's taps (d = 1: at most two groups, ceil(K / s) taps then one fewer; a dilation
    sharing a factor with the stride leaves phases no tap reaches), never a tap padded to a multiple of the stride."""
    from ember.core.convolution_forms import _phase_groups

    for stride, kernel, dilation in [(2, 3, 1), (2, 1, 1), (2, 4, 1), (3, 5, 1), (4, 3, 1), (16, 16, 1), (2, 3, 2),
                                     (3, 4, 2), (4, 3, 6)]:
        groups = _phase_groups(64, 64, stride, kernel, dilation, 0)
        assert sum(group.taps * group.phases for group in groups) == kernel, (stride, kernel, dilation)
        if dilation == 1:
            assert len(groups) <= 2, (stride, kernel)


# tiles of output channels x rows (ir/opt.py `_channel_factor`): 2 or 4 channels, rows the tile does not divide
# (7, 9, 5: the last tile clamped), one and two vectors per row, an input gradient whose channels (6) take the tile
# too, and filters' gradients of 4 x 4 tiles (32 vector registers) whose channels are no multiple of 4
CHANNEL_TILE_CASES: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ((2, 3, 7, 16), (6, 3, 3, 3), {"padding": 1}),
    ((1, 5, 9, 32), (12, 5, 3, 3), {"padding": 1}),
    ((2, 6, 5, 16), (10, 6, 3, 3), {"padding": (0, 1)}),
    ((3, 6, 7, 16), (4, 6, 3, 3), {"padding": 1}),
    ((2, 7, 11, 16), (9, 7, 3, 3), {"padding": 1}),
    ((2, 5, 6, 16), (6, 5, 3, 2), {"padding": (1, 0)}),  # filters' gradient: 2 offsets whole, 4 x 1 channels
    ((1, 3, 8, 16), (5, 3, 3, 5), {"padding": 2}),  # 5 offsets: no offset tile
    ((2, 6, 8, 8), (10, 6, 3, 3), {"padding": 1}),  # 8 positions: 8 lanes
]


def test_channel_and_row_tiles_match_torch(device: str) -> None:
    for number, (input_shape, weight_shape, options) in enumerate(CHANNEL_TILE_CASES):
        _check(device, input_shape, weight_shape, options, seed=500 + 10 * number)


def test_convolution_tiles_share_loads_across_channels(monkeypatch: Any) -> None:
    """A convolution's vector tile spans 4 output channels by rows (each window row loaded once for 4 channels,
    each filter value once for its rows), up to 12 accumulators with 16 vector registers, 16 with 32 (AVX-512); a
    batched matmul's batch axis (no operand broadcast along it) takes no such tile. Before: 6 or 12 rows of one
    channel, a window row loaded per accumulator (conv 3x3 of 16 channels on 16 x 16 at batch 64, one AVX-512
    core: forward 1.12 -> 0.46 ms, input gradient 1.11 -> 0.35 ms)."""
    from ember.backends.c import VECTOR_OPS, CRenderer
    from ember.capabilities import DeviceInfo
    from ember.ir.opt import build_kernel_ir
    from ember.scheduler.kernelize import kernelize
    from ember.scheduler.program import Launch

    monkeypatch.setenv("EMBER_NOOPT", "0")

    def rendered(tensor: em.Tensor, info: DeviceInfo) -> list[str]:
        items = [item for item in kernelize([tensor.node]) if isinstance(item, Launch)]
        return [CRenderer().render(build_kernel_ir(item.kernel, f"kernel{number}", info))
                for number, item in enumerate(items)]

    narrow = DeviceInfo(compute_units=2, preferred_vector_width=8, vector_ops=VECTOR_OPS)
    wide = DeviceInfo(compute_units=2, preferred_vector_width=16, vector_ops=VECTOR_OPS, vector_registers=32)
    x = em.tensor(np.zeros((4, 16, 16, 16), np.float32), device="dummy:0")
    w = em.tensor(np.zeros((32, 16, 3, 3), np.float32), device="dummy:0")
    # 8 lanes: 4 channels x 1 row of 2 vectors (12 accumulators at most); 16 lanes: 4 channels x 4 rows of 1
    for info, lanes, accumulators, row_loads in [(narrow, 8, 8, 2), (wide, 16, 16, 4)]:
        _, reduce = rendered(x.conv2d(w, padding=1), info)  # the padded copy, the reduce
        assert reduce.count(f"ember_float32x{lanes} acc") == accumulators
        # the window rows loaded per filter tap: once for the tile's 4 channels, not once per accumulator
        assert reduce.count(f"(*(const ember_float32x{lanes}_u*)(data1+") == row_loads
    batched = rendered(em.tensor(np.zeros((8, 12, 16), np.float32), device="dummy:0")
                       @ em.tensor(np.zeros((8, 16, 16), np.float32), device="dummy:0"), narrow)[0]
    assert batched.count("ember_float32x8 acc") == 12  # 6 rows of 2 vectors, no tile of batches


def test_filters_gradient_tiles_take_the_offsets_whole(monkeypatch: Any) -> None:
    """The filters' gradient [G, *K, Og, Cg] (vectors along the positions it sums) tiles the last kernel offset
    whole by 4 output channels by 1 input channel (12 accumulators): 3 x 8 x 16 = 384 work items for 32 x 16
    channels of a 3x3 kernel, the output's gradient loaded once for the 3 offsets; before, 4 x 3 channels, 432."""
    from ember.backends.c import VECTOR_OPS, CRenderer
    from ember.capabilities import DeviceInfo
    from ember.core.convolution_forms import ConvolutionGeometry, weight_gradient
    from ember.ir.opt import build_kernel_ir
    from ember.scheduler.kernelize import kernelize
    from ember.scheduler.program import Launch

    monkeypatch.setenv("EMBER_NOOPT", "0")
    padded = em.tensor(np.zeros((4, 16, 18, 18), np.float32), device="dummy:0")
    grad = em.tensor(np.zeros((4, 32, 16, 16), np.float32), device="dummy:0")
    geometry = ConvolutionGeometry((1, 1), ((1, 1), (1, 1)), (1, 1), 1, (16, 16))
    items = [item for item in kernelize([weight_gradient(grad, padded, (32, 16, 3, 3), geometry).node])
             if isinstance(item, Launch)]
    for info, lanes in [(DeviceInfo(compute_units=2, preferred_vector_width=8, vector_ops=VECTOR_OPS), 8),
                        (DeviceInfo(compute_units=2, preferred_vector_width=16, vector_ops=VECTOR_OPS,
                                    vector_registers=32), 16)]:
        source = CRenderer().render(build_kernel_ir(items[0].kernel, "kernel0", info))
        assert source.count(f"ember_float32x{lanes} acc") == 12 and "gid < 384;" in source


def test_filters_gradient_in_two_stages(device: str) -> None:
    """More batch x output positions than one reduce sums (staged_reduce.STAGE_THRESHOLD): positions, then batch.
    Each filter gradient sums 17,280 products into values up to ~220, so its tolerance is float32's rounding at that
    size (a GPU's grouped order gives a few 1e-4 where the c backend's happens to stay within 2e-4)."""
    _check(device, (3, 1, 80, 72), (2, 1, 3, 3), {"padding": 1}, seed=7, weight_atol=1e-3)


def test_a_signal_longer_than_65535_positions(device: str) -> None:
    """A conv1d and an overlapping max pool over 100,003 positions (past 65,535, the size where a work dimension or a
    loop of one invocation runs out on some devices): values and every gradient against torch; the filters' gradient
    sums 2 x 50,000 products (in stages)."""
    x, tx = pair(random_array((2, 2, 100_003), seed=3), device, requires_grad=True)
    w, tw = pair(random_array((3, 2, 7), seed=4), device, requires_grad=True)
    output = x.conv1d(w, stride=2, padding=3).max_pool1d(3, stride=2, padding=1)
    expected = TF.max_pool1d(TF.conv1d(tx, tw, stride=2, padding=3), 3, stride=2, padding=1)
    assert_close(output, expected, atol=1e-4)
    grad, tgrad = pair(random_array(tuple(expected.shape), seed=5), device)
    output.backward(grad)
    expected.backward(tgrad)
    assert_close(x.grad, tx.grad, atol=1e-4)
    assert_close(w.grad, tw.grad, atol=1e-2, rtol=1e-4)  # sums of 50,000 products of magnitude ~1


def test_conv_transpose_gradients_match_torch(device: str) -> None:
    x, tx = pair(random_array((2, 4, 5, 6)), device, requires_grad=True)
    w, tw = pair(random_array((4, 3, 3, 3), seed=1), device, requires_grad=True)
    options = {"stride": 2, "padding": 1, "output_padding": 1, "groups": 1}
    output = x.conv_transpose2d(w, None, **options)
    expected = TF.conv_transpose2d(tx, tw, None, **options)
    assert_close(output, expected, atol=1e-4)
    grad, tgrad = pair(random_array(tuple(expected.shape), seed=2), device)
    output.backward(grad)
    expected.backward(tgrad)
    assert_close(x.grad, tx.grad, atol=1e-4)
    assert_close(w.grad, tw.grad, atol=1e-4)


def test_max_pool_gradient_goes_to_the_first_maximum(device: str) -> None:
    """Ties inside a window (and windows sharing their maximum where they overlap): torch's first index only."""
    values = np.random.default_rng(0).integers(0, 3, size=(2, 3, 7, 9)).astype(np.float32)
    for options in ({"kernel_size": 2}, {"kernel_size": 3, "stride": 1}, {"kernel_size": 3, "stride": 2, "padding": 1},
                    {"kernel_size": 2, "ceil_mode": True}, {"kernel_size": (2, 3), "stride": (1, 2), "dilation": 2}):
        x, tx = pair(values, device, requires_grad=True)
        output = x.max_pool2d(**options)
        expected = TF.max_pool2d(tx, **options)
        assert_close(output, expected)
        grad, tgrad = pair(random_array(tuple(expected.shape), seed=1), device)
        output.backward(grad)
        expected.backward(tgrad)
        assert_close(x.grad, tx.grad, atol=1e-5)
    signal = np.array([[[1.0, np.nan, 2.0, 2.0, -np.inf, -np.inf, 5.0]]], np.float32)
    x, tx = pair(signal, device, requires_grad=True)
    output, expected = x.max_pool1d(2, ceil_mode=True), TF.max_pool1d(tx, 2, ceil_mode=True)
    assert_close(output, expected)
    output.sum().backward()
    expected.sum().backward()
    assert_close(x.grad, tx.grad)


def _ties_nan_and_minus_inf(generator: np.random.Generator, shape: tuple[int, ...], count: int) -> np.ndarray:
    """Small integers (many ties within a window) with `count` NaNs and then `count` -infs at random places (a -inf
    may land on a NaN's place, as the tests always drew them)."""
    values = generator.integers(-2, 3, size=shape).astype(np.float32)
    values.reshape(-1)[generator.choice(values.size, count, replace=False)] = np.nan
    values.reshape(-1)[generator.choice(values.size, count, replace=False)] = -np.inf
    return values


def test_max_pool_gradient_in_vector_lanes(device: str, monkeypatch: Any) -> None:
    """2x2 pooling over rows of 16 and 24 (whole vectors of the gradient's row): the gradient's kernel spreads each
    window's chosen offset and gradient over its positions' lanes ([a, a, b, b, ...], no scalar loop); ties, NaN,
    -inf and ReLU zeros (a convolution layer's backward) go where torch's do."""
    from ember.core.convolution_forms import PoolGeometry, max_pool_gradient
    from tests.test_optimizations import _dummy, rendered_c

    monkeypatch.setenv("EMBER_NOOPT", "0")
    geometry = PoolGeometry((2, 2), (2, 2), (1, 1), (4, 8), ((0, 0), (0, 0)))
    source = rendered_c(max_pool_gradient(_dummy(2, 3, 4, 8), _dummy(2, 3, 8, 16), geometry))
    assert "*(ember_float32x8_u*)(data0+" in source and "{v" in source, source  # vector stores of spread lanes
    generator = np.random.default_rng(3)
    for shape in ((2, 3, 8, 16), (1, 4, 6, 24), (2, 2, 5, 17)):
        x, tx = pair(_ties_nan_and_minus_inf(generator, shape, 6), device, requires_grad=True)
        output, expected = x.relu().max_pool2d(2), TF.max_pool2d(tx.relu(), 2)
        assert_close(output, expected)
        grad, tgrad = pair(random_array(tuple(expected.shape), seed=2), device)
        output.backward(grad)
        expected.backward(tgrad)
        assert_close(x.grad, tx.grad)


def test_max_pool_forward_in_vector_lanes(device: str, monkeypatch: Any) -> None:
    """2x2 pooling to rows of 8 (a window's elements 2 apart in the lanes) and of 4 (two rows fill a vector), its
    offsets (a keepdim reduce) too: vector stores, and values, NaN, -inf and ties as torch's, gradients included."""
    from tests.test_optimizations import _dummy, rendered_c

    monkeypatch.setenv("EMBER_NOOPT", "0")
    for width in (16, 8):
        source = rendered_c(_dummy(2, 4, 8, width).max_pool2d(2))
        assert "*(ember_float32x8_u*)(data0+" in source, source
    padded = rendered_c(_dummy(2, 4, 16, 16).max_pool2d(2).pad((1, 1, 1, 1)).contiguous())  # the next conv's input
    assert "*(ember_float32x8_u*)(data0+" in padded, padded
    generator = np.random.default_rng(4)
    for shape in ((2, 3, 8, 16), (2, 4, 8, 8), (1, 2, 6, 8)):
        x, tx = pair(_ties_nan_and_minus_inf(generator, shape, 4), device, requires_grad=True)
        output, expected = (x * 2 + 1).max_pool2d(2), TF.max_pool2d(tx * 2 + 1, 2)
        assert_close(output, expected)
        assert_close(output.pad((1, 1, 1, 1)) * 3, TF.pad(expected, (1, 1, 1, 1)) * 3)
        output.sum().backward()
        expected.sum().backward()
        assert_close(x.grad, tx.grad)


def test_max_pool_3d_gradient(device: str) -> None:
    x, tx = pair(random_array((1, 2, 5, 6, 4)), device, requires_grad=True)
    output, expected = x.max_pool3d(2, stride=(1, 2, 2), padding=1), TF.max_pool3d(tx, 2, stride=(1, 2, 2), padding=1)
    assert_close(output, expected)
    output.sum().backward()
    expected.sum().backward()
    assert_close(x.grad, tx.grad)


def _kernels(function: Any) -> int:
    with em.profile() as profile:
        function()
    return len(profile.kernels)


def test_one_convolution_layer_kernel_counts(device: str) -> None:
    """Forward: 1 kernel (the reduce); 2 with padding on the last axis (the input copied padded, so the reduce loads
    whole vectors); 3 with a stride along it (the input copied split into the stride's phases, read with stride
    1, and the filters copied zero-padded to 2 x 2 taps of the 2 phases, so no product reads them through a
    mask). Backward: the output's gradient copied spread and padded, the transposed convolution (the input's
    gradient), the filters' gradient (stored in its tile's layout [G, *K, Og, Cg]) and its copy as [Cout, Cg,
    *K] (filter-sized): 4 kernels. Before: 4 too, one of them a scalar sum over the kernel copies of the padded
    axis (the window views' adjoint) and the forward 1 kernel of masked scalar loads."""
    x = em.randn(2, 3, 9, 16, device=device).realize()
    w = em.randn(8, 3, 3, 3, device=device).realize()
    assert _kernels(lambda: x.conv2d(w).realize()) == 1
    assert _kernels(lambda: x.conv2d(w, padding=1).realize()) == 2
    assert _kernels(lambda: x.conv2d(w, stride=2).realize()) == 3
    assert _kernels(lambda: x.conv2d(w, stride=(2, 1)).realize()) == 1  # a row stride needs no copy
    x.requires_grad_()
    w.requires_grad_()
    output = x.conv2d(w, padding=1).realize()
    grad = em.randn(*output.shape, device=device).realize()
    assert _kernels(lambda: output.backward(grad)) == 4
    assert x.grad is not None and w.grad is not None


def test_strided_convolution_layer_kernel_counts(device: str) -> None:
    """Stride 2 (the resnet program's): forward, the input copied split into its phases, the filters copied padded to
    4 taps a row (3 taps at stride 2 read taps q, p in {0, 1}: through the pad, every product took its mask and no
    packed form applied) and the reduce (3). Backward: the output's gradient copied padded by one on each axis, the
    filters copied padded (as the forward's, for the input's gradient), the input's gradient by phase group (4
    reduces: the 2 x 2, 2 x 1, 1 x 2 and 1 x 1 taps of the even and odd rows and columns, 9 taps in all, each
    stored), their interleaving into x.grad, the filters' gradient from the forward's phase copy stored as the
    reduce lays it out (2 x 2 taps of the phases) and its copy as [Cout, Cg, *K]: 10 kernels (before: 4, the input's
    gradient one reduce of 2 x 2 phases by 2 x 2 taps, 16, over positions rounded up to 16, fused into the store of
    x.grad as a scalar loop: 9.7 ms vs 0.5 ms at batch 64). A 1x1 downsample's: one reduce (the even rows and
    columns), its interleaving and the filters' gradient: 3."""
    x = em.randn(4, 16, 16, 16, device=device).realize().requires_grad_()
    w = em.randn(32, 16, 3, 3, device=device).realize().requires_grad_()
    assert _kernels(lambda: x.conv2d(w, stride=2, padding=1).realize()) == 3
    output = x.conv2d(w, stride=2, padding=1).realize()
    grad = em.randn(*output.shape, device=device).realize()
    assert _kernels(lambda: output.backward(grad)) == 10
    assert x.grad is not None and w.grad is not None
    x.grad = None
    w = em.randn(32, 16, 1, 1, device=device).realize().requires_grad_()
    output = x.conv2d(w, stride=2).realize()
    assert _kernels(lambda: output.backward(grad)) == 3  # + the filters' gradient (a 1x1 kernel's layouts are one)
    assert x.grad is not None


def test_conv_transpose_with_inf_and_nan_filters_matches_torch(device: str) -> None:
    """An inf and a NaN filter tap (and an inf input): torch's scatter never multiplies them by a padded or inserted
    zero, so the outputs they reach are inf (NaN where inf meets -inf or the NaN), not NaN everywhere the spread
    zeros meet the tap (the convolution of the spread input gave NaN there)."""
    for options in ({}, {"stride": 2, "padding": 1, "output_padding": 1}, {"stride": (3, 2), "dilation": (1, 2)},
                    {"stride": 2, "groups": 2}):
        data = random_array((2, 4, 5, 6), seed=1)
        data[1, 3, 2, 2] = np.inf
        filters = random_array((4, 3, 3, 3), seed=2)
        filters[0, 1, 1, 1] = np.inf
        filters[2, 0, 0, 2] = np.nan
        x, tx = pair(data, device, requires_grad=True)
        w, tw = pair(filters, device, requires_grad=True)
        output = x.conv_transpose2d(w, None, **options)
        expected = TF.conv_transpose2d(tx, tw, None, **options)
        assert_close(output, expected, atol=1e-4)
        assert np.isinf(output.numpy()).any(), options


def test_conv_transpose_kernel_counts(device: str) -> None:
    """Forward: each input element times each filter tap (the columns, one reduce over the input channels), then
    each tap's columns spread, shifted and summed (one elementwise kernel): 2 kernels, as torch's scatter, no product
    with a padded or inserted zero (before: the input copied spread and padded, then a convolution over it, whose
    zeros times an inf filter gave NaN; before that a reduce of masked scalar loads, ~40x slower).
    Backward (one step): the output's gradient copied split into the stride's phases, the filters copied padded to 2
    taps of the 2 phases, the strided convolution (the input's gradient, reading no inserted zeros), the filters'
    gradient stored as its reduce lays it out and its copy: 6 kernels."""
    x = em.randn(2, 4, 9, 16, device=device).realize()
    w = em.randn(4, 3, 3, 3, device=device).realize()
    options = {"stride": 2, "padding": 1, "output_padding": 1}
    assert _kernels(lambda: x.conv_transpose2d(w, None, **options).realize()) == 2
    x.requires_grad_()
    w.requires_grad_()
    output = x.conv_transpose2d(w, None, **options).realize()
    grad = em.randn(*output.shape, device=device).realize()
    assert _kernels(lambda: output.backward(grad)) == 6
    assert x.grad is not None and w.grad is not None
    assert tuple(x.grad.shape) == (2, 4, 9, 16) and tuple(w.grad.shape) == (4, 3, 3, 3)


def test_max_pool_fused_into_a_padded_copy_reads_linear_indices(device: str, monkeypatch: Any) -> None:
    """A max pool read through the next convolution's padding (one kernel): the window offsets are linear in the
    loop variables, with no division or remainder in the loop (each run of reshaped axes takes its own index, so
    the padding's offset, negative outside its mask, blocks no other axis' simplification)."""
    from tests.test_optimizations import _dummy, rendered_c

    monkeypatch.setenv("EMBER_NOOPT", "0")
    source = rendered_c(_dummy(4, 3, 16, 16).max_pool2d(2).pad((1, 1, 1, 1)).contiguous())
    loop = source.split("for (int loop1", 1)[1]
    assert "/" not in loop and "%" not in loop, source
    x, tx = pair(random_array((2, 3, 12, 14)), device)
    assert_close(x.max_pool2d(2).pad((1, 2, 2, 1)) * 2, TF.pad(TF.max_pool2d(tx, 2), (1, 2, 2, 1)) * 2)


def test_max_pool_backward_kernel_count(device: str) -> None:
    """The chosen offset of each window (a reduce), then the gradient placed by it, summed over the windows holding
    each position where windows overlap (one elementwise kernel). No scatter."""
    for options, count in (({"kernel_size": 2}, 2), ({"kernel_size": 3, "stride": 2, "padding": 1}, 2)):
        x = em.randn(2, 3, 8, 8, device=device).realize().requires_grad_()
        output = x.max_pool2d(**options).realize()
        grad = em.randn(*output.shape, device=device).realize()
        assert _kernels(lambda: output.backward(grad)) == count, options


def test_convolution_second_order() -> None:
    """create_graph: the gradients are convolutions recorded in turn, so they differentiate again."""
    x, tx = pair(random_array((1, 2, 6, 7)), "c", requires_grad=True)
    w, tw = pair(random_array((3, 2, 3, 2), seed=1), "c", requires_grad=True)
    (grad_x,) = em.autograd.grad(x.conv2d(w, stride=2, padding=1).square().sum(), [x], create_graph=True)
    (tgrad_x,) = torch.autograd.grad(TF.conv2d(tx, tw, stride=2, padding=1).square().sum(), [tx], create_graph=True)
    grad_x.square().sum().backward()
    tgrad_x.square().sum().backward()
    assert_close(w.grad, tw.grad, atol=1e-3, rtol=1e-3)
    assert_close(x.grad, tx.grad, atol=1e-3, rtol=1e-3)
