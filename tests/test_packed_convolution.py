"""Convolutions as packed matmuls (ir/packed_matmul.py's offset tables, backends/c_matmul.py's gathers): which
convolution kernels are packed, and the c backend's results against torch, forward and backward, at odd, strided,
dilated and ResNet sizes, with the library's own source built alone at both vector widths and its plain
loops (where no memory is left for panels or tables) checked too."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

import ember as em
from ember.backends.base import DeviceInfo
from ember.backends.c import CRenderer, build_library, plain_compiler_command
from ember.core.convolution_forms import ConvolutionGeometry, convolution_gradients
from ember.ir.kernel import Kernel
from ember.ir.packed_matmul import lower_packed_matmul, packed_matmul
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch
from tests.packed_devices import AVX2, AVX512, dummy, normal, optimizations_on  # noqa: F401 (an autouse fixture)


def _reduce_kernels(tensor: em.Tensor) -> list[Kernel]:
    return [item.kernel for item in kernelize([tensor.node]) if isinstance(item, Launch) and item.kernel.has_reduce]



def test_a_convolution_is_one_packed_matmul_through_offset_tables() -> None:
    """A 3x3 convolution of 64 filters over 56 x 56 pixels: rows are the filters, the reduced axes (channels, filter
    rows and columns) walk the filters as one axis and the padded input through a table, and the columns are every
    pixel of an image (56-pixel rows would pad panels of 32 by 14%), read from the input through a table."""
    (kernel,) = _reduce_kernels(em.nn.functional.conv2d(dummy(8, 64, 56, 56), dummy(64, 64, 3, 3), padding=1))
    packed = packed_matmul(kernel, AVX512)
    assert packed is not None and (packed.rows, packed.columns, packed.depth) == (64, 3136, 576)
    assert (packed.a_depth_stride, packed.b_depth_stride, packed.b_column_stride) == (1, 0, 0)
    assert packed.depth_axes == ((64, 9, 58 * 58), (3, 3, 58), (3, 1, 1))
    assert packed.column_axes == ((56, 58), (56, 1)) and packed.batches == ((8, 0, 64 * 58 * 58, 64 * 3136),)
    # rows of 64 pixels fill the panels: they stay one axis of columns, the image's rows a batch dim
    (wide,) = _reduce_kernels(em.nn.functional.conv2d(dummy(2, 32, 64, 64), dummy(64, 32, 3, 3), padding=1))
    wide_packed = packed_matmul(wide, AVX512)
    assert wide_packed is not None and wide_packed.columns == 64 and wide_packed.column_axes == ()
    assert wide_packed.b_column_stride == 1 and [size for size, *_ in wide_packed.batches] == [2, 64]


def _gradients(batch: int, channels: int, filters: int, size: int) -> tuple[em.Tensor, em.Tensor]:
    """A 3x3 convolution's (input, filters) gradients (padding 1) as autograd records them, unrealized."""
    geometry = ConvolutionGeometry((1, 1), ((1, 1), (1, 1)), (1, 1), 1, (size, size))
    return convolution_gradients(dummy(batch, filters, size, size), dummy(batch, channels, size + 2, size + 2),
                                 dummy(filters, channels, 3, 3), geometry)


def test_the_input_gradient_reads_the_flipped_filters_through_a_table() -> None:
    """A convolution's input gradient reads its filters flipped and transposed: 2 - ky, a difference of loop
    variables, is linear too, and A (the filters) is read through a table."""
    input_gradient, _ = _gradients(4, 64, 48, 20)
    found = [packed for packed in (packed_matmul(kernel, AVX512) for kernel in _reduce_kernels(input_gradient))
             if packed is not None]
    assert len(found) == 1 and found[0].a_depth_stride == 0 and found[0].depth_axes[1:] == ((3, -3, 22), (3, -1, 1))
    assert (found[0].rows, found[0].columns, found[0].depth) == (64, 400, 48 * 9)


def test_the_filters_gradient_is_not_gathered_a_column_at_a_time() -> None:
    """The filters' gradient sums over pixels, the input read with its channels as B's columns, 484 floats apart:
    packed, every value of B's panels would be copied alone (2x slower than the tiled kernel)."""
    _, filters_gradient = _gradients(4, 64, 48, 20)
    kernels = _reduce_kernels(filters_gradient)
    assert kernels and all(packed_matmul(kernel, AVX512) is None for kernel in kernels)


@pytest.mark.parametrize("width", [28, 19, 40, 13])
def test_filters_gradients_over_runs_shorter_than_a_vector_against_torch(width: int) -> None:
    """A filters' gradient packs B (the input, its channels as columns) by transposes of `lanes` consecutive pixels,
    a run of fewer (a row's tail: 28 pixels are 16 + 12, 19 are 16 + 3, 40 are 16 + 16 + 8; a row of 13) by the
    transpose of its lanes alone, loaded masked; at 40 pixels the sum's blocks of k start inside a row. torch's
    gradient (a short transpose that leaves its last row out fails every width)."""
    batch, channels, filters, height = 2, 48, 64, 7  # (48 channels: a panel of 32 columns and one of 16)
    geometry = ConvolutionGeometry((1, 1), ((1, 1), (1, 1)), (1, 1), 1, (height, width))
    _, recorded = convolution_gradients(dummy(batch, filters, height, width),
                                        dummy(batch, channels, height + 2, width + 2),
                                        dummy(filters, channels, 3, 3), geometry)
    assert any(packed_matmul(kernel, AVX512) is not None for kernel in _reduce_kernels(recorded))
    x_data, weight_data = normal(batch, channels, height, width), normal(filters, channels, 3, 3, seed=1) / 12
    output_gradient = normal(batch, filters, height, width, seed=2)
    weight = em.tensor(weight_data, device="c", requires_grad=True)
    output = em.nn.functional.conv2d(em.tensor(x_data, device="c"), weight, padding=1)
    (output * em.tensor(output_gradient, device="c")).sum().backward()
    tweight = torch.from_numpy(weight_data).requires_grad_()
    expected = torch.nn.functional.conv2d(torch.from_numpy(x_data), tweight, padding=1)
    (expected * torch.from_numpy(output_gradient)).sum().backward()
    assert weight.grad is not None and tweight.grad is not None
    np.testing.assert_allclose(weight.grad.numpy(), tweight.grad.numpy(), rtol=1e-4, atol=1e-4 * width)


@pytest.mark.parametrize("input_shape, weight_shape", [
    ((64, 16, 16, 16), (16, 16, 3, 3)),  # 16 filters over 256 pixels: tiled kernels ran 2.7x faster
    ((8, 1, 28, 28), (32, 1, 3, 3)),  # one input channel: 9 products an output
], ids=["16 filters, 16x16", "one channel"])
def test_small_convolutions_keep_the_tiled_kernels(input_shape: tuple[int, ...],
                                                   weight_shape: tuple[int, ...]) -> None:
    (kernel,) = _reduce_kernels(em.nn.functional.conv2d(dummy(*input_shape), dummy(*weight_shape), padding=1))
    assert packed_matmul(kernel, AVX512) is None


CASES = {
    # (input shape, weight shape, conv2d's keyword arguments)
    "3x3 on 20x22": ((2, 32, 20, 22), (64, 32, 3, 3), {"padding": 1}),
    "5x5 on 13x11, no padding": ((3, 24, 13, 11), (70, 24, 5, 5), {}),
    "rows of 5": ((4, 40, 9, 5), (64, 40, 3, 3), {"padding": 1}),  # runs shorter than a vector
    "rows of 3": ((6, 40, 12, 3), (67, 40, 3, 3), {"padding": 1}),  # and than a quarter vector
    "4x4, stride 2": ((2, 32, 34, 34), (72, 32, 4, 4), {"stride": 2, "padding": 1}),
    # 3 taps at stride 2: the filters zero-padded to 4 (copied, not read through the pad's mask)
    "3x3, stride 2": ((2, 32, 31, 30), (64, 32, 3, 3), {"stride": 2, "padding": 1}),
    "dilation 2": ((2, 32, 21, 19), (64, 32, 3, 3), {"dilation": 2, "padding": 2}),
    "16 filters, 600 pixels": ((2, 24, 20, 30), (16, 24, 3, 3), {"padding": 1}),
    # rows of 64 pixels: one axis of columns (no table), 21 batch elements (rows of pixels) that two threads split
    # along the columns
    "rows of 64 pixels": ((1, 32, 21, 64), (64, 32, 3, 3), {"padding": 1}),
    "3x5, one image": ((1, 32, 18, 17), (64, 32, 3, 5), {"padding": (1, 2)}),
    "with bias": ((2, 48, 28, 28), (64, 48, 3, 3), {"padding": 1, "bias": True}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_convolutions_against_torch(case: str) -> None:
    """Forward, the input's and the filters' gradients on c against torch, for convolutions whose forward kernel
    is packed through tables."""
    input_shape, weight_shape, options = CASES[case]
    options = dict(options)
    bias = normal(weight_shape[0], seed=2) if options.pop("bias", False) else None
    forward = _reduce_kernels(em.nn.functional.conv2d(dummy(*input_shape), dummy(*weight_shape), **options))
    assert any(packed_matmul(kernel, AVX2) is not None for kernel in forward)
    x_data, weight_data = normal(*input_shape), normal(*weight_shape, seed=1) / 10
    x = em.tensor(x_data, device="c", requires_grad=True)
    weight = em.tensor(weight_data, device="c", requires_grad=True)
    output = em.nn.functional.conv2d(x, weight, None if bias is None else em.tensor(bias, device="c"), **options)
    output_gradient = normal(*output.shape, seed=4)
    (output * em.tensor(output_gradient, device="c")).sum().backward()
    tx = torch.from_numpy(x_data).requires_grad_()
    tw = torch.from_numpy(weight_data).requires_grad_()
    expected = torch.nn.functional.conv2d(tx, tw, None if bias is None else torch.from_numpy(bias), **options)
    (expected * torch.from_numpy(output_gradient)).sum().backward()
    depth = weight_shape[1] * weight_shape[2] * weight_shape[3]
    np.testing.assert_allclose(output.numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-4 * depth**0.5)
    assert x.grad is not None and weight.grad is not None and tx.grad is not None and tw.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(weight.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-2)


def test_a_resnet_convolution_against_torch() -> None:
    """ResNet's 3x3 convolution of 64 channels over 56 x 56 pixels at batch 8 (1.85 GFLOP; 285 ms tiled at 512
    filters over 7 x 7, 12.7 packed) and its last stage's 512 filters over 7 x 7 pixels: torch's values, NaN and
    infinity where the input has them."""
    x_data, weight_data = normal(8, 64, 56, 56), normal(64, 64, 3, 3, seed=1) / 24
    x_data[3, 5, 10, 11] = np.nan
    x_data[6, 7, 0, 55] = np.inf
    got = em.nn.functional.conv2d(em.tensor(x_data, device="c"), em.tensor(weight_data, device="c"), padding=1)
    expected = torch.nn.functional.conv2d(torch.from_numpy(x_data), torch.from_numpy(weight_data), padding=1)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4 * 24)
    assert np.isnan(got.numpy()).sum() == torch.isnan(expected).sum().item() > 0
    deep_x, deep_weight = normal(4, 512, 7, 7), normal(512, 512, 3, 3, seed=1) / 68
    got = em.nn.functional.conv2d(em.tensor(deep_x, device="c"), em.tensor(deep_weight, device="c"), padding=1)
    expected = torch.nn.functional.conv2d(torch.from_numpy(deep_x), torch.from_numpy(deep_weight), padding=1)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4 * 68)


def test_a_resnet_downsampling_block_against_torch() -> None:
    """ResNet-18's first strided BasicBlock convolutions at their sizes (batch 4, 64 -> 128 filters over 56 x 56
    pixels, stride 2, then 128 -> 128 over 28 x 28), forward and backward, sizes where c packs every product (the
    strided one's filters copied zero-padded to 2 x 2 taps of the 2 phases): torch's outputs and gradients."""
    x_data = normal(4, 64, 56, 56)
    first, second = normal(128, 64, 3, 3, seed=1) / 24, normal(128, 128, 3, 3, seed=2) / 34
    output_gradient = normal(4, 128, 28, 28, seed=3)
    x = em.tensor(x_data, device="c", requires_grad=True)
    weights = [em.tensor(data, device="c", requires_grad=True) for data in (first, second)]
    output = em.nn.functional.conv2d(em.nn.functional.conv2d(x, weights[0], stride=2, padding=1).relu(), weights[1],
                                     padding=1)
    (output * em.tensor(output_gradient, device="c")).sum().backward()
    tx = torch.from_numpy(x_data).requires_grad_()
    tweights = [torch.from_numpy(data).requires_grad_() for data in (first, second)]
    expected = torch.nn.functional.conv2d(torch.nn.functional.conv2d(tx, tweights[0], stride=2, padding=1).relu(),
                                          tweights[1], padding=1)
    (expected * torch.from_numpy(output_gradient)).sum().backward()
    np.testing.assert_allclose(output.numpy(), expected.detach().numpy(), rtol=1e-4, atol=2e-3)
    assert x.grad is not None and tx.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=2e-3)
    for weight, tweight in zip(weights, tweights):
        assert weight.grad is not None and tweight.grad is not None
        scale = float(np.abs(tweight.grad.numpy()).max())
        np.testing.assert_allclose(weight.grad.numpy(), tweight.grad.numpy(), rtol=1e-4, atol=1e-5 * scale)


def test_a_bias_and_activation_after_a_large_convolution_are_a_kernel_of_their_own_on_c() -> None:
    """On a device that packs matmuls, a large convolution's bias and ReLU are not fused into its kernel (a packed
    matmul has no epilogue): the convolution is stored by a packed kernel, and they are an elementwise kernel."""
    x_data, weight_data, bias = normal(2, 48, 28, 28), normal(64, 48, 3, 3, seed=1), normal(64, seed=2)
    with em.profile() as profile:
        got = em.nn.functional.conv2d(em.tensor(x_data, device="c"), em.tensor(weight_data, device="c"),
                                      em.tensor(bias, device="c"), padding=1).relu().numpy()
    names = [kernel.name for kernel in profile.kernels]
    assert sum(name.startswith("r_") for name in names) == 1 and names[-1].startswith("e_2_64_28_28"), names
    expected = torch.nn.functional.conv2d(torch.from_numpy(x_data), torch.from_numpy(weight_data),
                                          torch.from_numpy(bias), padding=1).relu()
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-4 * 432**0.5)


def test_a_half_precision_products_epilogue_stays_in_its_kernel_on_c() -> None:
    """The packed form takes float32 values only: a float16 product (summed in float32) keeps its bias and ReLU in
    its one kernel, while the same float32 product is stored by a kernel of its own and they are another."""
    data = [normal(256, 784), normal(784, 512, seed=1), normal(512, seed=2)]
    halves = [em.tensor(array, device="c").to(em.float16).realize() for array in data]
    with em.profile() as profile:
        got = (halves[0] @ halves[1] + halves[2]).relu().to(em.float32).numpy()
    assert [kernel.name[:2] for kernel in profile.kernels] == ["r_"]
    singles = [half.to(em.float32).realize() for half in halves]
    with em.profile() as profile:
        (singles[0] @ singles[1] + singles[2]).relu().numpy()
    assert [kernel.name[:2] for kernel in profile.kernels] == ["r_", "e_"]
    expected = (torch.from_numpy(data[0]).half().float() @ torch.from_numpy(data[1]).half().float()
                + torch.from_numpy(data[2]).half().float()).relu().half().float()
    np.testing.assert_allclose(got, expected.numpy(), rtol=2e-3, atol=2e-2)


def _forward_case() -> tuple[Kernel, dict[str, np.ndarray], np.ndarray]:
    """A convolution's kernel (rows of 13 pixels: runs copied by whole, half and quarter vectors), its operands by
    role (the filters, the padded input) and torch's output."""
    x_data, weight_data = normal(2, 40, 15, 13), normal(66, 40, 3, 3, seed=1)
    (kernel,) = _reduce_kernels(em.nn.functional.conv2d(dummy(2, 40, 17, 15), dummy(66, 40, 3, 3)))
    expected = torch.nn.functional.conv2d(torch.from_numpy(x_data), torch.from_numpy(weight_data), padding=1)
    return kernel, {"a": weight_data, "b": np.pad(x_data, ((0, 0), (0, 0), (1, 1), (1, 1)))}, expected.numpy()


def _filters_gradient_case() -> tuple[Kernel, dict[str, np.ndarray], np.ndarray]:
    """A filters' gradient's kernel (B's columns the input's channels, 77 floats apart; its k rows of 19 pixels:
    a transpose and one of 3 lanes, or 2 transposes and one of 3), its operands (the output's gradient, the padded
    input) and torch's gradient, as the kernel lays it out ([1, 3, 3, filters, channels])."""
    geometry = ConvolutionGeometry((1, 1), ((1, 1), (1, 1)), (1, 1), 1, (5, 19))
    _, filters_gradient = convolution_gradients(dummy(3, 70, 5, 19), dummy(3, 40, 7, 21), dummy(70, 40, 3, 3),
                                                geometry)
    (kernel,) = _reduce_kernels(filters_gradient)
    x_data, gradient = normal(3, 40, 5, 19), normal(3, 70, 5, 19, seed=1)
    expected = torch.nn.grad.conv2d_weight(torch.from_numpy(x_data), (70, 40, 3, 3), torch.from_numpy(gradient),
                                           padding=1).numpy()
    return kernel, {"a": gradient, "b": np.pad(x_data, ((0, 0), (0, 0), (1, 1), (1, 1)))}, np.ascontiguousarray(
        expected.transpose(2, 3, 0, 1)).reshape(kernel.output.shape)


@pytest.mark.parametrize("info", [AVX2, AVX512], ids=["AVX2", "AVX-512"])
@pytest.mark.parametrize("case", ["forward", "filters' gradient"])
@pytest.mark.parametrize("variant", ["default blocks", "small blocks", "no memory"])
def test_a_rendered_packed_convolution_builds_alone(info: DeviceInfo, case: str, variant: str) -> None:
    """The renderer's source of a packed convolution, and of a filters' gradient (B's panels through transposes),
    builds alone and computes torch's values at both vector widths: with the default cache blocks, with blocks
    small enough that the columns, rows and k each take several (B's panels packed a block at a time, offsets
    from a column block's start), and, where no memory can be allocated for panels or offset tables (aligned_alloc
    and malloc give NULL), by its plain loops."""
    kernel, operands, expected = (_forward_case if case == "forward" else _filters_gradient_case)()
    name = f"packed_{case[0]}_{info.preferred_vector_width}_{variant[0]}"
    blocks = (24, 2 * info.preferred_vector_width, 3 * info.preferred_vector_width) if variant == "small blocks" \
        else None
    lowered = lower_packed_matmul(kernel, name, info, blocks)
    assert lowered is not None and lowered.packed is not None and lowered.packed.gathers
    assert (lowered.packed.b_column_stride not in (0, 1)) == (case != "forward")
    source = CRenderer().render(lowered)
    if variant == "no memory":
        source = ("#include <stdlib.h>\n#define aligned_alloc(alignment, size) ((void*)0)\n"
                  "#define malloc(size) ((void*)0)\n" + source)
    library, _ = build_library(source, "test of a packed convolution", plain_compiler_command(), [name])
    output = np.full(kernel.output.shape, np.nan, np.float32)
    buffers = {0: output, lowered.packed.a: np.ascontiguousarray(operands["a"]),
               lowered.packed.b: np.ascontiguousarray(operands["b"])}
    getattr(library, name)(*[ctypes.c_void_p(buffers[position].ctypes.data) for position in range(3)])
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-3)
