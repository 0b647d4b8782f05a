"""Quantized products in integers (ember/io/quantized_dot.py): the input rounded to int8 per block of 32, the
weight's quants times those integers summed in int32 per group, checked against numpy's float64 product of the
`gguf` package's dequantized weights within the error bound of the input's rounding."""

from __future__ import annotations

import unittest.mock

import numpy as np
import pytest

import ember as em
from ember.io import QuantizedTensor
from ember.io.quantized import FORMATS_BY_NAME
from ember.io.quantized_dot import INTEGER_FORMATS, integer_matmul, quantize_input
from ember.nn.quantized import QuantizedLinear

from tests.conftest import TEST_DEVICES
from tests.test_gguf import random_blocks

gguf = pytest.importorskip("gguf", reason="the gguf package dequantizes the reference weights")


def reference_weight(name: str, raw: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, name)).astype(np.float64)


def rounding_bound(weight: np.ndarray, inputs: np.ndarray) -> np.ndarray:
    """The largest error the input's rounding can make in each output: each input element moves by at most half a
    step of its block (its block's largest magnitude / 254), times the weights' magnitudes; plus float32 rounding."""
    blocks = np.abs(inputs).reshape(*inputs.shape[:-1], -1, 32).max(-1, keepdims=True)
    step = np.broadcast_to(blocks / 254.0, (*inputs.shape[:-1], inputs.shape[-1] // 32, 32)).reshape(inputs.shape)
    magnitude = np.abs(inputs) @ np.abs(weight).T
    return step @ np.abs(weight).T * 1.0001 + 1e-5 * magnitude + 1e-6


@pytest.mark.parametrize("name", sorted(FORMATS_BY_NAME))
@pytest.mark.parametrize("decoded", [False, True], ids=["scales-in-kernel", "scales-decoded"])
def test_integer_matmul_is_within_the_input_rounding(name: str, decoded: bool) -> None:
    quant = FORMATS_BY_NAME[name]
    rows, blocks = 13, 3
    raw = random_blocks(name, rows=rows, blocks=blocks, seed=11)
    weight = QuantizedTensor(em.tensor(raw, device="c"), quant, (rows, blocks * quant.block_elements))
    if decoded:
        weight = weight.decoded_scales()
    reference = reference_weight(name, raw)
    for tokens in (1, 3):
        inputs = np.random.default_rng(tokens).standard_normal((tokens, blocks * quant.block_elements))
        inputs = inputs.astype(np.float32)
        inputs[0, :32] *= 1000.0  # blocks of very different magnitudes: each has a scale of its own
        got = weight.matmul(em.tensor(inputs, device="c"), integer=True).numpy()
        expected = inputs.astype(np.float64) @ reference.T
        assert got.shape == (tokens, rows)
        error = np.abs(got - expected)
        bound = rounding_bound(reference, inputs.astype(np.float64))
        assert (error <= bound).all(), f"worst excess {np.max(error - bound)}"
        assert error.max() > 0  # (the input was rounded: the integer path ran)


def test_integer_matmul_of_a_gemma_sized_row_and_zeros_nans_and_infinities() -> None:
    """640 inputs (20 blocks of 32), the width of Gemma-3-270M; a block of zeros gives no NaN, a NaN makes the
    products NaN, an infinity makes them non-finite (as the float product would)."""
    raw = random_blocks("Q8_0", rows=37, blocks=20, seed=5)
    weight = QuantizedTensor(em.tensor(raw, device="c"), FORMATS_BY_NAME["Q8_0"], (37, 640)).decoded_scales()
    inputs = np.random.default_rng(0).standard_normal((2, 640)).astype(np.float32)
    inputs[:, 64:96] = 0.0
    got = integer_matmul(weight, em.tensor(inputs, device="c")).numpy()
    reference = reference_weight("Q8_0", raw)
    expected = inputs.astype(np.float64) @ reference.T
    assert (np.abs(got - expected) <= rounding_bound(reference, inputs.astype(np.float64))).all()
    inputs[0, 3] = np.nan
    inputs[1, 300] = np.inf
    got = integer_matmul(weight, em.tensor(inputs, device="c")).numpy()
    assert np.isnan(got[0]).all() and not np.isfinite(got[1]).any()


def test_a_q8_0_linear_layer_reads_its_scales_from_the_blocks() -> None:
    """QuantizedLinear.decode_scales keeps no decoded copy of Q8_0's scales (SCALES_IN_BLOCKS: the product reads
    the float16 in front of each block); a token's product is within the input's rounding of numpy's, a prompt's
    (float) equals it to float32 rounding."""
    raw = random_blocks("Q8_0", rows=37, blocks=20, seed=6)
    layer = QuantizedLinear(QuantizedTensor(em.tensor(raw, device="c"), FORMATS_BY_NAME["Q8_0"], (37, 640)))
    layer.decode_scales()
    assert layer.scales is None and layer.format is FORMATS_BY_NAME["Q8_0"]
    reference = reference_weight("Q8_0", raw)
    for tokens in (1, 40):
        inputs = np.random.default_rng(tokens).standard_normal((tokens, 640)).astype(np.float32)
        got = layer(em.tensor(inputs, device="c")).numpy()
        expected = inputs.astype(np.float64) @ reference.T
        bound = rounding_bound(reference, inputs.astype(np.float64)) if tokens == 1 else \
            1e-5 * (np.abs(inputs) @ np.abs(reference).T) + 1e-5
        assert (np.abs(got - expected) <= bound).all(), f"{tokens} rows: worst {np.max(np.abs(got - expected) - bound)}"


def test_quantize_input_rounds_each_block_to_int8() -> None:
    inputs = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
    inputs[1, 32:] = 0.0
    quants, scales = quantize_input(em.tensor(inputs, device="c"))
    quants_np, scales_np = quants.numpy(), scales.numpy()
    blocks = inputs.reshape(3, 2, 32)
    largest = np.abs(blocks).max(-1, keepdims=True)
    np.testing.assert_allclose(scales_np, largest / 127, rtol=1e-6)
    assert quants.dtype == em.int8 and np.abs(quants_np).max() == 127
    expected = np.round(blocks / np.where(largest > 0, largest, 1) * 127)
    assert np.abs(quants_np - expected).max() <= 1  # (x * (127 / m) may round on the other side of a half)
    assert (quants_np[1, 1] == 0).all() and scales_np[1, 1, 0] == 0


@pytest.mark.parametrize("device", TEST_DEVICES)
def test_quantize_input_rounds_halves_to_even_on_every_device(device: str) -> None:
    """A block whose largest magnitude is 127 has a scale of 1: its values are rounded as they are, halves to the
    even neighbour (numpy's and torch's rounding); NaN and infinite blocks give 0s and a non-finite scale."""
    row = np.zeros(96, dtype=np.float32)
    halves = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 3.49999976, 0.50000006], dtype=np.float32)
    row[: len(halves)], row[31] = halves, -127.0
    row[32:64] = np.linspace(-3, 3, 32, dtype=np.float32)
    row[40], row[70] = np.nan, np.inf
    quants, scales = quantize_input(em.tensor(row[None], device=device))
    quants_np, scales_np = quants.numpy()[0], scales.numpy()[0, :, 0]
    assert quants.dtype == em.int8
    np.testing.assert_array_equal(quants_np[0, : len(halves)], np.round(halves))
    assert quants_np[0, 31] == -127 and scales_np[0] == np.float32(1.0)
    assert (quants_np[1:] == 0).all() and np.isnan(scales_np[1]) and np.isinf(scales_np[2])


@pytest.mark.parametrize("name", sorted(INTEGER_FORMATS))
def test_a_decode_product_runs_in_integers_by_default_in_one_kernel_over_the_blocks(name: str) -> None:
    """On c (a CPU with byte dot products: the default is chosen from DeviceInfo), one row of input and a Q8_0 or
    Q5_0 weight: the input is quantized by small kernels, and the product over the blocks is one kernel whose
    integer sums per block are loops inside its loop over the blocks (nothing per block is stored), rendered as
    plain int arithmetic that the compiler vectorizes into byte dot products."""
    from ember.scheduler.devices import get_device

    device = get_device("c")
    if not device.info.integer_dot_products:
        pytest.skip("this CPU has no byte dot-product instructions (x86 VNNI)")
    rows = 96 + len(name)  # a shape of its own: its kernels are rendered here
    # (layouts of ember's own: Q5_0X4, Q5_0's blocks interleaved; Q6_KW, Q6_K's widened to a byte a value)
    stored = {"Q5_0X4": "Q5_0", "Q6_KW": "Q6_K"}.get(name, name)
    blocks = max(1, 128 // FORMATS_BY_NAME[stored].block_elements)
    features = blocks * FORMATS_BY_NAME[stored].block_elements
    raw = random_blocks(stored, rows=rows, blocks=blocks, seed=9)
    weight = QuantizedTensor(em.tensor(raw, device="c"), FORMATS_BY_NAME[stored], (rows, features))
    if name == "Q5_0X4":
        weight = weight.interleaved()
    elif name == "Q6_KW":
        weight = weight.widened()
    assert weight.format.name == name
    weight = weight.decoded_scales()
    x = em.tensor(np.random.default_rng(1).standard_normal((1, features)).astype(np.float32), device="c").realize()
    sources: list[str] = []
    render = device.render
    with unittest.mock.patch.object(device, "render", lambda kernel: sources.append(render(kernel)) or sources[-1]):
        with em.profile() as record:
            result = weight.matmul(x).realize()
    product = [source for source in sources
               if "const unsigned char* restrict" in source and "const signed char* restrict" in source]
    assert len(product) == 1 and len(record.kernels) <= 5  # (Q5_0: a kernel joins each block's high bits)
    assert "(unsigned int)" not in product[0].split("acc")[2]  # the byte products are plain C: no wrapping casts
    reference = reference_weight(stored, raw)
    expected = x.numpy().astype(np.float64) @ reference.T
    assert (np.abs(result.numpy() - expected) <= rounding_bound(reference, x.numpy().astype(np.float64))).all()
    many = np.random.default_rng(2).standard_normal((9, features)).astype(np.float32)  # more rows: the float product
    np.testing.assert_allclose(weight.matmul(em.tensor(many, device="c")).numpy(), many @ reference.T, rtol=1e-4,
                               atol=1e-4 * np.abs(many @ reference.T).max())


def test_two_integer_products_fused_in_one_kernel() -> None:
    """gelu(x @ a.T) * (x @ b.T) (a gated MLP) with Q8_0 weights in integers: both products' nested loops share the
    values they both need, computed before either loop nest (a shared value first computed inside one loop was out
    of scope in the other: the C compiler rejected the kernel)."""
    device = "c"
    quant = FORMATS_BY_NAME["Q8_0"]
    raw_a, raw_b = random_blocks("Q8_0", 24, 2, seed=1), random_blocks("Q8_0", 24, 2, seed=2)
    a = QuantizedTensor(em.tensor(raw_a, device=device), quant, (24, 64))
    b = QuantizedTensor(em.tensor(raw_b, device=device), quant, (24, 64))
    inputs = np.random.default_rng(4).standard_normal((1, 64)).astype(np.float32)
    x = em.tensor(inputs, device=device)
    got = (a.matmul(x, integer=True).gelu() * b.matmul(x, integer=True)).numpy()
    import torch

    reference_a, reference_b = reference_weight("Q8_0", raw_a), reference_weight("Q8_0", raw_b)
    quants, scales = quantize_input(x)
    rounded = (quants.numpy().astype(np.float64) * scales.numpy()).reshape(1, 64)  # the input the integers see
    expected = (torch.nn.functional.gelu(torch.tensor(rounded @ reference_a.T))
                * torch.tensor(rounded @ reference_b.T)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_devices_without_byte_dot_products_keep_the_float_product(device: str) -> None:
    """The default follows DeviceInfo.integer_dot_products: the c backend's comes from the CPU's flags (or
    EMBER_C_INTEGER_DOT); a device without it multiplies by the float values (the exact product)."""
    from ember.backends.c import has_byte_dot_products
    from ember.scheduler.devices import get_device

    raw = random_blocks("Q8_0", rows=7, blocks=2, seed=3)
    weight = QuantizedTensor(em.tensor(raw, device=device), FORMATS_BY_NAME["Q8_0"], (7, 64))
    inputs = np.random.default_rng(5).standard_normal((1, 64)).astype(np.float32)
    got = weight.matmul(em.tensor(inputs, device=device)).numpy()
    reference = reference_weight("Q8_0", raw)
    expected = inputs.astype(np.float64) @ reference.T
    if get_device(device).info.integer_dot_products:
        assert (np.abs(got - expected) <= rounding_bound(reference, inputs.astype(np.float64))).all()
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EMBER_C_INTEGER_DOT", "0")
        assert not has_byte_dot_products()
        patch.setenv("EMBER_C_INTEGER_DOT", "1")
        assert has_byte_dot_products()


def test_an_input_that_needs_a_gradient_keeps_the_float_product() -> None:
    """The integer product rounds the input (no gradient): an input that requires one is multiplied in floats, so
    its gradient is the weights' column sums, as torch's of the dequantized weight; integer=True then refuses."""
    import torch

    raw = random_blocks("Q8_0", rows=5, blocks=2, seed=6)
    weight = QuantizedTensor(em.tensor(raw, device="c"), FORMATS_BY_NAME["Q8_0"], (5, 64))
    inputs = np.random.default_rng(8).standard_normal((1, 64)).astype(np.float32)
    x = em.tensor(inputs, device="c", requires_grad=True)
    weight.matmul(x).sum().backward()
    reference = torch.tensor(inputs, requires_grad=True)
    (reference @ torch.tensor(reference_weight("Q8_0", raw), dtype=torch.float32).T).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), reference.grad.numpy(), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="integer=True rounds the input to int8, which has no gradient"):
        weight.matmul(x, integer=True)


@pytest.mark.parametrize("integer", [True, False], ids=["integers", "floats"])
def test_a_products_graph_is_recorded_once_and_copied(integer: bool) -> None:
    """QuantizedTensor.matmul records its graph once per format, shapes and path (core/graph_templates.py) and
    copies it at later calls (a short prompt's pass built ~0.15 s of Python op by op): the copies compute the same
    products, for another input and for another weight of the same shape."""
    from ember.core.graph_templates import TEMPLATES

    rows = 40 + integer  # shapes of their own: the first call records
    first, second = (random_blocks("Q8_0", rows=rows, blocks=4, seed=seed) for seed in (11, 12))
    weights = [QuantizedTensor(em.tensor(raw, device="c"), FORMATS_BY_NAME["Q8_0"], (rows, 128)).decoded_scales()
               for raw in (first, second)]
    inputs = [np.random.default_rng(seed).standard_normal((1, 128)).astype(np.float32) for seed in (1, 2)]
    recorded, instantiated = TEMPLATES.recorded, TEMPLATES.instantiated
    results = [weight.matmul(em.tensor(values, device="c"), integer=integer).numpy()
               for weight in weights for values in inputs]
    assert TEMPLATES.recorded == recorded + 1 and TEMPLATES.instantiated == instantiated + 4
    for (raw, values), got in zip([(raw, values) for raw in (first, second) for values in inputs], results):
        reference = reference_weight("Q8_0", raw)
        expected = values.astype(np.float64) @ reference.T
        bound = rounding_bound(reference, values.astype(np.float64)) if integer else \
            1e-5 * (np.abs(values) @ np.abs(reference).T) + 1e-5
        assert (np.abs(got - expected) <= bound).all()
