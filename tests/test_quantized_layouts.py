"""Quantized weights in layouts of ember's own and products over many rows: Q5_0's blocks interleaved four at a time
(Q5_0X4, `QuantizedTensor.interleaved`) or widened to Q8_0 (`QuantizedTensor.widened`), and the products of many
input rows that unpack the weight once (`DEQUANTIZE_ROWS`), checked against numpy's products of the `gguf` package's
dequantized weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ember as em
from ember.io import QuantizedTensor
from ember.io.quantized import DEQUANTIZE_ROWS, FORMATS_BY_NAME, Q5_0X4, Q8_0
from ember.nn.quantized import QuantizedLinear
from ember.scheduler.devices import get_device
from tests.test_gguf import random_blocks
from tests.test_quantized_dot import reference_weight, rounding_bound

gguf = pytest.importorskip("gguf", reason="the gguf package dequantizes the reference weights")


def q5_0_weight(rows: int, blocks: int, device: str, seed: int = 0) -> tuple[QuantizedTensor, np.ndarray]:
    raw = random_blocks("Q5_0", rows=rows, blocks=blocks, seed=seed)
    return QuantizedTensor(em.tensor(raw, device=device), FORMATS_BY_NAME["Q5_0"], (rows, blocks * 32)), raw


def test_interleaved_q5_0_holds_the_same_values_in_the_same_bytes(device: str) -> None:
    weight, raw = q5_0_weight(rows=13, blocks=8, device=device, seed=4)
    interleaved = weight.interleaved()
    assert interleaved.format is Q5_0X4 and interleaved.shape == (13, 256)
    assert tuple(interleaved.raw.shape) == raw.shape  # 88 bytes for 4 blocks of 22: no byte more
    np.testing.assert_array_equal(interleaved.dequantize().numpy(), reference_weight("Q5_0", raw))
    np.testing.assert_array_equal(interleaved.decoded_scales().dequantize().numpy(), reference_weight("Q5_0", raw))


def test_rows_whose_blocks_do_not_group_by_four_keep_their_layout() -> None:
    weight, _ = q5_0_weight(rows=3, blocks=6, device="c")
    assert weight.interleaved() is weight
    q8 = QuantizedTensor(em.tensor(random_blocks("Q8_0", rows=3, blocks=4)), FORMATS_BY_NAME["Q8_0"], (3, 128))
    assert q8.interleaved() is q8


@pytest.mark.parametrize("decoded", [False, True], ids=["scales-in-kernel", "scales-decoded"])
def test_interleaved_q5_0_products_match_numpy(decoded: bool, device: str) -> None:
    """Float products (one token, three, and many rows: the weight unpacked once) and the integer one (c, input
    rounded to int8) of 13 rows (no multiple of a tile) of 12 blocks (3 groups of 4)."""
    weight, raw = q5_0_weight(rows=13, blocks=12, device=device, seed=9)
    interleaved = weight.interleaved()
    if decoded:
        interleaved = interleaved.decoded_scales()
    reference = reference_weight("Q5_0", raw)
    for tokens in (1, 3, DEQUANTIZE_ROWS + 5):
        inputs = np.random.default_rng(tokens).standard_normal((tokens, 384)).astype(np.float32)
        expected = inputs.astype(np.float64) @ reference.T
        got = interleaved.matmul(em.tensor(inputs, device=device), integer=False).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
        if device == "c" and tokens < DEQUANTIZE_ROWS:
            got = interleaved.matmul(em.tensor(inputs, device=device), integer=True).numpy()
            error = np.abs(got - expected)
            assert (error <= rounding_bound(reference, inputs.astype(np.float64))).all()


def test_a_linear_layer_repacks_its_q5_0_blocks_for_its_device(device: str) -> None:
    """Widened to Q8_0 where the device sums bytes in integers (its scale read in the blocks), else interleaved
    with its scales decoded; the layer's products are numpy's either way (within the int8 input's rounding)."""
    weight, raw = q5_0_weight(rows=7, blocks=4, device=device, seed=2)
    layer = QuantizedLinear(weight)
    layer.decode_scales()
    if get_device(device).info.integer_dot_products:
        assert layer.format is Q8_0 and layer.scales is None
    else:
        assert layer.format is Q5_0X4 and layer.scales is not None
    inputs = np.random.default_rng(0).standard_normal((2, 128)).astype(np.float32)
    expected = inputs.astype(np.float64) @ reference_weight("Q5_0", raw).T
    got = layer(em.tensor(inputs, device=device)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2 * np.abs(expected).max())  # (int8 input on c)


def test_widened_q5_0_holds_the_same_values_as_q8_0_blocks(device: str) -> None:
    """Q5_0 -> Q8_0 (`QuantizedTensor.widened`): the same float16 scale and each value less 16 as an int8, so the
    values are exactly the file's, at 34 bytes a block of 32 instead of 22; its float and integer products (one
    row, three) are numpy's; a format with no wider layout is itself."""
    weight, raw = q5_0_weight(rows=13, blocks=12, device=device, seed=5)
    raw[0, 0:2] = 0  # a block of scale 0, and one whose values are all the largest, 31 - 16
    raw[1, 2:22] = 0xFF
    weight = QuantizedTensor(em.tensor(raw, device=device), FORMATS_BY_NAME["Q5_0"], (13, 384))
    widened = weight.widened()
    assert widened.format is Q8_0 and widened.shape == (13, 384) and tuple(widened.raw.shape) == (13, 12 * 34)
    reference = reference_weight("Q5_0", raw)
    np.testing.assert_array_equal(widened.dequantize().numpy(), reference)
    assert (reference[1, :32] == reference[1, 0]).all() and (reference[0, :32] == 0).all()
    for tokens in (1, 3):
        inputs = np.random.default_rng(tokens).standard_normal((tokens, 384)).astype(np.float32)
        expected = inputs.astype(np.float64) @ reference.T
        got = widened.matmul(em.tensor(inputs, device=device), integer=False).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
        if get_device(device).info.integer_dot_products:
            got = widened.matmul(em.tensor(inputs, device=device), integer=True).numpy()
            assert (np.abs(got - expected) <= rounding_bound(reference, inputs.astype(np.float64))).all()
    q4_k = QuantizedTensor(em.tensor(random_blocks("Q4_K", rows=2, blocks=1), device=device),
                           FORMATS_BY_NAME["Q4_K"], (2, 256))
    assert q4_k.widened() is q4_k and q4_k.repacked() is q4_k


def test_widened_q6_k_holds_the_same_values_a_byte_each(device: str) -> None:
    """Q6_K -> Q6_KW (`QuantizedTensor.widened`): the 6-bit values a byte each in the elements' order, then the
    block's 16 scales and d, 274 bytes a block of 256 instead of 210; the values are exactly the file's, with the
    scales decoded or read from the blocks; float products of one and three rows, and the integer one where the
    device has byte dot products, are numpy's (the latter within the int8 input's rounding); a layer repacks its
    Q6_K blocks so only where the device sums bytes in integers."""
    raw = random_blocks("Q6_K", rows=11, blocks=3, seed=6)
    weight = QuantizedTensor(em.tensor(raw, device=device), FORMATS_BY_NAME["Q6_K"], (11, 768))
    widened = weight.widened()
    assert widened.format.name == "Q6_KW" and tuple(widened.raw.shape) == (11, 3 * 274)
    reference = reference_weight("Q6_K", raw)
    np.testing.assert_array_equal(widened.dequantize().numpy(), reference)
    decoded = widened.decoded_scales()
    np.testing.assert_array_equal(decoded.dequantize().numpy(), reference)
    integer = get_device(device).info.integer_dot_products
    for tokens in (1, 3):
        inputs = np.random.default_rng(tokens).standard_normal((tokens, 768)).astype(np.float32)
        expected = inputs.astype(np.float64) @ reference.T
        got = decoded.matmul(em.tensor(inputs, device=device), integer=False).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
        if integer:
            got = decoded.matmul(em.tensor(inputs, device=device), integer=True).numpy()
            assert (np.abs(got - expected) <= rounding_bound(reference, inputs.astype(np.float64))).all()
    layer = QuantizedLinear(weight)
    layer.decode_scales()
    assert layer.format.name == ("Q6_KW" if integer else "Q6_K") and layer.scales is not None


@pytest.mark.parametrize("name", sorted(FORMATS_BY_NAME))
def test_many_rows_unpack_the_weight_once_then_multiply_floats(name: str, device: str) -> None:
    """A prompt's product (DEQUANTIZE_ROWS rows or more): one kernel unpacks every block into a float32 weight, a
    float matrix product reads it (no unpacking per input row); the values are numpy's."""
    quant = FORMATS_BY_NAME[name]
    rows, blocks = 13, (9 if quant.block_elements == 32 else 1)
    raw = random_blocks(name, rows=rows, blocks=blocks, seed=5)
    weight = QuantizedTensor(em.tensor(raw, device=device), quant, (rows, blocks * quant.block_elements))
    weight = weight.decoded_scales()
    tokens = DEQUANTIZE_ROWS + 3
    inputs = np.random.default_rng(1).standard_normal((tokens, blocks * quant.block_elements)).astype(np.float32)
    x = em.tensor(inputs, device=device).realize()
    with em.profile() as record:
        got = weight.matmul(x).realize().numpy()
    assert len(record.kernels) == 2
    assert record.bytes_allocated == (rows * blocks * quant.block_elements + tokens * rows) * 4
    expected = inputs.astype(np.float64) @ reference_weight(name, raw).T
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("float32", [False, True], ids=["blocks", "float32-weights"])
def test_a_gated_mlp_over_many_rows_stores_each_product(float32: bool, device: str) -> None:
    """gelu(x @ gate.T) * (x @ up.T) over a prompt's rows: each product is a matrix product of its own, stored
    (fused under the elementwise op, the two were one kernel of nested reductions, 15x slower than the tiled ones),
    for quantized blocks and for the weights stored as float32; the values are numpy's."""
    gate, gate_raw = q5_0_weight(rows=21, blocks=4, device=device, seed=1)
    up, up_raw = q5_0_weight(rows=21, blocks=4, device=device, seed=2)
    layers = [QuantizedLinear(gate), QuantizedLinear(up)]
    for layer in layers:
        layer.decode_scales()
        if float32:
            layer.store_float32()
    inputs = np.random.default_rng(3).standard_normal((DEQUANTIZE_ROWS + 1, 128)).astype(np.float32)
    x = em.tensor(inputs, device=device).realize()
    with em.profile() as record:
        got = (layers[0](x).gelu(approximate="tanh") * layers[1](x)).realize().numpy()
    products = [kernel for kernel in record.kernels if kernel.name.startswith("r_")]
    assert len(products) == 2 and len(record.kernels) == (3 if float32 else 5)  # (+ the two weights unpacked)
    gate_values = inputs.astype(np.float64) @ reference_weight("Q5_0", gate_raw).T
    up_values = inputs.astype(np.float64) @ reference_weight("Q5_0", up_raw).T
    expected = 0.5 * gate_values * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate_values + 0.044715 * gate_values**3)))
    np.testing.assert_allclose(got, expected * up_values, rtol=1e-4, atol=1e-4 * np.abs(expected * up_values).max())


def test_an_embedding_table_in_a_file_looks_up_many_rows_without_joining_them(tmp_path: Path) -> None:
    """Token ids (repeated, unordered) of a Q8_0 table in a GGUF file: one id maps its row, several gather their
    rows' bytes on the host; either way one kernel unpacks them and the values are gguf's."""
    from ember.io.gguf import load_gguf_tensor, read_gguf_header
    from ember.nn.quantized import QuantizedEmbedding

    table = random_blocks("Q8_0", rows=11, blocks=2, seed=6)
    writer = gguf.GGUFWriter(str(tmp_path / "table.gguf"), "testarch")
    writer.add_tensor("token_embd.weight", table, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_gguf_header(tmp_path / "table.gguf")
    embedding = QuantizedEmbedding(load_gguf_tensor(header, "token_embd.weight"))
    reference = reference_weight("Q8_0", table)
    for ids in ([7], [3, 10, 3, 0, 5]):
        with em.profile() as record:
            got = embedding(ids).realize().numpy()
        assert len(record.kernels) == 1
        np.testing.assert_array_equal(got, reference[ids])
    with pytest.raises(IndexError, match=r"ids \[11\] are outside the table of 11 rows"):
        embedding([2, 11])
