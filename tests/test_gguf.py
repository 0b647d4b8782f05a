"""GGUF files (written by the `gguf` package) read lazily; quantized blocks dequantized as fused ember ops, checked
block by block against the `gguf` package's numpy dequantizers."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import ember as em
from ember.io import GGUFError, QuantizedTensor, load_gguf, load_gguf_metadata, read_gguf_header
from ember.io.quantized import FORMATS_BY_NAME

gguf = pytest.importorskip("gguf", reason="the gguf package (pip install gguf) writes the test files")

# where each block keeps float16 scales
SCALE_BYTES = {"Q8_0": [0], "Q4_0": [0], "Q5_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(name: str, rows: int, blocks: int, seed: int = 0) -> np.ndarray:
    """Random bytes for `rows` rows of `blocks` blocks, with finite float16 scales (uint8, (rows, row_bytes))."""
    quant = FORMATS_BY_NAME[name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, blocks, quant.block_bytes), dtype=np.uint8)
    for start in SCALE_BYTES[name]:
        scales = rng.uniform(-2, 2, size=(rows, blocks, 1)).astype(np.float16)
        raw[..., start : start + 2] = scales.view(np.uint8)
    return raw.reshape(rows, -1)


def write_model(path: Path, alignment: int | None = None) -> dict[str, np.ndarray]:
    """A GGUF file with metadata of every kind and tensors of plain and quantized types; returns the raw arrays."""
    writer = gguf.GGUFWriter(str(path), "testarch")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_uint32("test.count", 7)
    writer.add_float32("test.epsilon", 0.5)
    writer.add_bool("test.flag", True)
    writer.add_int64("test.big", -(2**40))
    writer.add_string("test.name", "héllo")
    writer.add_array("test.tokens", ["a", "bc", ""])
    writer.add_array("test.scores", [1.5, -2.0])
    rng = np.random.default_rng(1)
    arrays = {
        "plain.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "plain.f16": rng.standard_normal((4,)).astype(np.float16),
        "plain.i32": np.arange(6, dtype=np.int32).reshape(2, 3),
        "quant.q8_0": gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32),
                                           gguf.GGMLQuantizationType.Q8_0),
        "quant.q5_0": gguf.quants.quantize(rng.standard_normal((3, 32)).astype(np.float32),
                                           gguf.GGMLQuantizationType.Q5_0),
        "quant.q4_k": random_blocks("Q4_K", 2, 1),
        "quant.q6_k": random_blocks("Q6_K", 3, 2),
    }
    for name, array in arrays.items():
        raw_type = getattr(gguf.GGMLQuantizationType, name.split(".")[1].upper()) if name.startswith("quant") else None
        writer.add_tensor(name, array, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return arrays


def test_header_metadata_and_lazy_tensors(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    arrays = write_model(path)
    metadata = load_gguf_metadata(path)
    assert metadata["general.architecture"] == "testarch"
    assert metadata["test.count"] == 7 and metadata["test.epsilon"] == 0.5 and metadata["test.flag"] is True
    assert metadata["test.big"] == -(2**40) and metadata["test.name"] == "héllo"
    assert metadata["test.tokens"] == ["a", "bc", ""] and metadata["test.scores"] == [1.5, -2.0]
    with em.profile() as record:
        tensors = load_gguf(path)
    assert not record.kernels and not record.copies  # opening reads the header only
    reference = gguf.GGUFReader(str(path))
    header = read_gguf_header(path)
    for tensor in reference.tensors:
        assert header.tensors[tensor.name].offset == tensor.data_offset
    assert tensors["plain.f32"].device == "disk:0" and tensors["plain.f32"].dtype == em.float32
    np.testing.assert_array_equal(tensors["plain.f32"].numpy(), arrays["plain.f32"])
    np.testing.assert_array_equal(tensors["plain.f16"].numpy(), arrays["plain.f16"])
    np.testing.assert_array_equal(tensors["plain.i32"].numpy(), arrays["plain.i32"])
    for name in ("quant.q8_0", "quant.q5_0", "quant.q4_k", "quant.q6_k"):
        quantized = tensors[name]
        assert isinstance(quantized, QuantizedTensor) and quantized.device == "disk:0"
        assert quantized.dtype.name == name.split(".")[1].upper()
        expected = gguf.quants.dequantize(arrays[name], getattr(gguf.GGMLQuantizationType, quantized.dtype.name))
        assert quantized.shape == expected.shape
        np.testing.assert_array_equal(quantized.dequantize().numpy(), expected)


def test_header_steps_over_skipped_metadata(tmp_path: Path) -> None:
    """Keys with a skipped prefix (strings, arrays of strings and numbers, scalars) are stepped over: the rest of
    the metadata and every tensor's offset come out as when everything is read; a truncated skipped value raises."""
    path = tmp_path / "model.gguf"
    write_model(path)
    full = read_gguf_header(path)
    skipped = read_gguf_header(path, skip_keys=("test.",))
    assert skipped.metadata == {key: value for key, value in full.metadata.items() if not key.startswith("test.")}
    assert skipped.metadata["general.architecture"] == "testarch"
    assert skipped.tensors == full.tensors and skipped.data_start == full.data_start
    content = path.read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(content[: content.index(b"test.tokens") + 30])
    with pytest.raises(GGUFError, match=r"truncated\.gguf: reading .*metadata 'test.tokens'"):
        read_gguf_header(truncated, skip_keys=("test.",))


def write_strings(path: Path, strings: list[str]) -> None:
    writer = gguf.GGUFWriter(str(path), "testarch")
    writer.add_array("test.pieces", strings)
    writer.add_uint32("test.after", 5)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_packed_strings_read_an_array_of_strings_without_a_str_each(tmp_path: Path) -> None:
    """A packed key's array of strings is the same strings (ASCII, empty, multi-byte, 4-byte characters) as bytes
    end to end with offsets; the metadata after it reads as before; other types and bad UTF-8 raise GGUFError."""
    from ember.io.gguf import PackedStrings, pack_strings

    strings = ["a", "", "héllo", "\u2581\u2581", "🍕x", "", "z" * 300, "\u0000"]
    path = tmp_path / "strings.gguf"
    write_strings(path, strings)
    header = read_gguf_header(path, packed_keys=("test.pieces",))
    packed = header.metadata["test.pieces"]
    assert isinstance(packed, PackedStrings) and len(packed) == len(strings)
    assert list(packed) == strings and packed[1:4] == strings[1:4] and packed[-1] == strings[-1]
    assert packed.encoded(4) == "🍕x".encode()
    assert packed.data == "".join(strings).encode() and header.metadata["test.after"] == 5
    with pytest.raises(IndexError, match="outside the 8 strings"):
        packed.encoded(8)
    replaced = packed.with_strings({1: "new", 2: "é"})
    assert list(replaced) == ["a", "new", "é", *strings[3:]] and list(packed) == strings
    assert list(pack_strings(strings)) == strings and list(pack_strings([])) == []
    with pytest.raises(GGUFError, match="'test.after' is not an array of strings"):
        read_gguf_header(path, packed_keys=("test.after",))
    content = path.read_bytes()
    # "héllo" then "\u2581\u2581" (6 bytes each) made a stray byte, or a character split over the two strings
    for first, second, reason in ((b"h\xffllo!", "\u2581\u2581".encode(), "not UTF-8"),
                                  (b"hxllo\xc3", b"\xa9abcde", "starts inside a UTF-8 character")):
        broken = tmp_path / "broken.gguf"
        broken.write_bytes(content.replace("héllo".encode(), first).replace("\u2581\u2581".encode(), second))
        with pytest.raises(GGUFError, match=reason):
            read_gguf_header(broken, packed_keys=("test.pieces",))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(content[: content.index(b"z" * 300) + 10])
    with pytest.raises(GGUFError, match=r"truncated\.gguf: .*'test.pieces'"):
        read_gguf_header(truncated, packed_keys=("test.pieces",))


def test_custom_alignment(tmp_path: Path) -> None:
    path = tmp_path / "aligned.gguf"
    arrays = write_model(path, alignment=64)
    header = read_gguf_header(path)
    assert header.alignment == 64 and header.data_start % 64 == 0
    assert all((info.offset - header.data_start) % 64 == 0 for info in header.tensors.values())
    np.testing.assert_array_equal(load_gguf(path)["plain.i32"].numpy(), arrays["plain.i32"])


def _offset_field(content: bytes, name: str, dimensions: int) -> int:
    """Byte position of the offset of tensor `name` in its tensor info."""
    return content.index(name.encode()) + len(name) + 4 + 8 * dimensions + 4


def test_corrupt_and_truncated_files_raise_clear_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.gguf"
    write_model(good)
    content = good.read_bytes()

    def variant(name: str, data: bytes) -> Path:
        path = tmp_path / name
        path.write_bytes(data)
        return path

    with pytest.raises(GGUFError, match=r"empty\.gguf: not a GGUF file: it is empty"):
        load_gguf(variant("empty.gguf", b""))
    with pytest.raises(GGUFError, match=r"magic\.gguf: not a GGUF file: it starts with b'GGML', not b'GGUF'"):
        load_gguf(variant("magic.gguf", b"GGML" + content[4:]))
    with pytest.raises(GGUFError, match=r"version\.gguf: GGUF version 9 is not supported \(supported: 2, 3\)"):
        load_gguf(variant("version.gguf", content[:4] + struct.pack("<I", 9) + content[8:]))
    with pytest.raises(GGUFError, match=r"header\.gguf: reading .* at byte \d+ needs \d+ bytes, but the file has "
                       r"only 100 bytes"):
        load_gguf(variant("header.gguf", content[:100]))
    with pytest.raises(GGUFError, match=r"data\.gguf: tensor 'quant.q6_k' \(Q6_K, shape \(3, 512\)\) needs data bytes"
                       r" \d+..\d+, but the file holds only \d+ bytes of data \(the file is truncated"):
        load_gguf(variant("data.gguf", content[: read_gguf_header(good).tensors["quant.q6_k"].offset + 10]))
    position = _offset_field(content, "plain.f16", 1)
    far = content[:position] + struct.pack("<Q", 2**40) + content[position + 8 :]
    with pytest.raises(GGUFError, match=r"far\.gguf: tensor 'plain.f16' .* needs data bytes 1099511627776"):
        load_gguf(variant("far.gguf", far))
    unaligned = content[:position] + struct.pack("<Q", 33) + content[position + 8 :]
    with pytest.raises(GGUFError, match=r"starts at data offset 33, which is not a multiple of the alignment 32"):
        load_gguf(variant("unaligned.gguf", unaligned))
    type_position = position - 4
    unknown = content[:type_position] + struct.pack("<I", 99) + content[type_position + 4 :]
    with pytest.raises(GGUFError, match=r"tensor 'plain.f16' has ggml type 99, which ember does not know"):
        load_gguf(variant("type.gguf", unknown))
    q2_k = content[:type_position] + struct.pack("<I", 10) + content[type_position + 4 :]  # a Q2_K row of 4: no
    with pytest.raises(GGUFError, match=r"rows of 4 elements, not a multiple of its block of 256"):
        load_gguf(variant("q2k.gguf", q2_k))
    key = content.index(b"test.count")
    length = content[: key - 8] + struct.pack("<Q", 2**62) + content[key:]
    with pytest.raises(GGUFError, match=r"length\.gguf: reading the key of metadata entry \d+ at byte \d+ needs"):
        load_gguf(variant("length.gguf", length))
    value_type = content[: key + 10] + struct.pack("<I", 77) + content[key + 14 :]
    with pytest.raises(GGUFError, match=r"metadata 'test.count' has an unknown value type 77 \(valid: 0 UINT8"):
        load_gguf(variant("vtype.gguf", value_type))
    with pytest.raises(FileNotFoundError, match=r"no such GGUF file: .*missing\.gguf"):
        load_gguf(tmp_path / "missing.gguf")


@pytest.mark.parametrize("name", sorted(FORMATS_BY_NAME))
def test_dequantize_matches_gguf_block_by_block(name: str, device: str) -> None:
    raw = random_blocks(name, rows=5, blocks=3, seed=len(name))
    quant = FORMATS_BY_NAME[name]
    quantized = QuantizedTensor(em.tensor(raw, device=device), quant, (5, 3 * quant.block_elements))
    got = quantized.dequantize().numpy().reshape(-1, quant.block_elements)
    qtype = getattr(gguf.GGMLQuantizationType, name)
    for index, block in enumerate(raw.reshape(-1, quant.block_bytes)):
        np.testing.assert_array_equal(got[index], gguf.quants.dequantize(block, qtype), err_msg=f"block {index}")


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_matmul_reads_quantized_blocks_in_one_kernel(name: str, device: str) -> None:
    """The dequantization fuses into the matmul: no memory for a dequantized weight. Only the blocks' scales (and
    mins), one float per 16 or 32 weights, may be stored first: each is read by every weight of its block."""
    quant = FORMATS_BY_NAME[name]
    raw = random_blocks(name, rows=16, blocks=2)
    weight = QuantizedTensor(em.tensor(raw, device=device).realize(), quant, (16, 2 * quant.block_elements))
    inputs = np.random.default_rng(2).standard_normal((3, 2 * quant.block_elements)).astype(np.float32)
    x = em.tensor(inputs, device=device).realize()
    with em.profile() as record:
        result = (x @ weight.dequantize().T).realize()
    weight_elements = 16 * 2 * quant.block_elements
    assert len(record.kernels) <= 3
    assert record.bytes_allocated <= 3 * 16 * 4 + weight_elements * 4 // 8  # the output, and scales at most
    expected = inputs @ gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, name)).T
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", sorted(FORMATS_BY_NAME))
@pytest.mark.parametrize("decoded", [False, True], ids=["scales-in-kernel", "scales-decoded"])
def test_quantized_matmul_matches_numpy(name: str, decoded: bool, device: str) -> None:
    """QuantizedTensor.matmul (the product over the blocks' own layout, in floats: the integer one is
    tests/test_quantized_dot.py's) against gguf's dequantization times a numpy matmul: an odd number of rows, one
    token (a matrix-vector product) and three, NaN-free random blocks."""
    quant = FORMATS_BY_NAME[name]
    rows, blocks = 13, 3
    raw = random_blocks(name, rows=rows, blocks=blocks, seed=7)
    weight = QuantizedTensor(em.tensor(raw, device=device), quant, (rows, blocks * quant.block_elements))
    if decoded:
        weight = weight.decoded_scales()
    reference = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, name)).astype(np.float64)
    for tokens in (1, 3):
        inputs = np.random.default_rng(tokens).standard_normal((tokens, blocks * quant.block_elements))
        got = weight.matmul(em.tensor(inputs.astype(np.float32), device=device), integer=False).numpy()
        expected = inputs.astype(np.float32).astype(np.float64) @ reference.T
        assert got.shape == (tokens, rows)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("name", ["Q8_0", "Q5_0", "Q4_K", "Q6_K"])
def test_quantized_matvec_with_decoded_scales_is_one_kernel_on_vectors(name: str, monkeypatch: pytest.MonkeyPatch
                                                                       ) -> None:
    """With the scales decoded once, a product reads the blocks in one kernel that stores only its output; on c
    (whose DeviceInfo lists conversions and shifts as vector ops) that kernel unpacks the bytes as vectors."""
    from ember.scheduler.devices import get_device

    quant = FORMATS_BY_NAME[name]
    rows, blocks = 64 + len(name), 3  # a shape of its own: its kernel is rendered in this test
    raw = random_blocks(name, rows=rows, blocks=blocks, seed=3)
    weight = QuantizedTensor(em.tensor(raw, device="c"), quant, (rows, blocks * quant.block_elements))
    weight = weight.decoded_scales()
    x = em.tensor(np.random.default_rng(0).standard_normal((1, blocks * quant.block_elements)).astype(np.float32),
                  device="c").realize()
    device = get_device("c")
    sources: list[str] = []
    render = device.render
    monkeypatch.setattr(device, "render", lambda kernel: sources.append(render(kernel)) or sources[-1])
    with em.profile() as record:
        result = weight.matmul(x, integer=False).realize()
    assert len(record.kernels) == 1 and record.bytes_allocated == rows * 4
    assert len(sources) == 1 and "__builtin_convertvector" in sources[0]
    expected = x.numpy() @ gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, name)).T
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_quantized_matmul_checks_its_input() -> None:
    weight = QuantizedTensor(em.tensor(random_blocks("Q8_0", 2, 1)), FORMATS_BY_NAME["Q8_0"], (2, 32))
    with pytest.raises(ValueError, match=r"input of shape \(3, 31\) does not end in the 32 input features"):
        weight.matmul(em.zeros(3, 31))
    with pytest.raises(TypeError, match="the input must be floating point, got int32"):
        weight.matmul(em.zeros(3, 32, dtype=em.int32))


def test_quantized_tensor_checks_its_raw_bytes() -> None:
    with pytest.raises(ValueError, match=r"Q8_0 values of shape \(2, 32\) need raw bytes of shape \(2, 34\)"):
        QuantizedTensor(em.zeros(2, 33, dtype=em.uint8), FORMATS_BY_NAME["Q8_0"], (2, 32))
    with pytest.raises(ValueError, match=r"needs rows of a multiple of 256 elements"):
        QuantizedTensor(em.zeros(2, 144, dtype=em.uint8), FORMATS_BY_NAME["Q4_K"], (2, 100))
    with pytest.raises(TypeError, match="raw blocks must be uint8"):
        QuantizedTensor(em.zeros(2, 34), FORMATS_BY_NAME["Q8_0"], (2, 32))
