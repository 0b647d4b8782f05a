"""ember.io safetensors: files exchanged with the safetensors package both ways, a torch-saved state dict loads into
the same ember architecture and gives the same outputs, and corrupt or truncated files raise errors naming the file."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import ember as em
import ember.nn as enn
from ember.io import SafetensorsError, load_safetensors, load_safetensors_metadata, save_safetensors
from tests.helpers import TORCH_DTYPES, assert_close


def _small_cnn(nn: Any) -> Any:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * 3 * 3, 5),
        nn.LayerNorm(5),
    )


def test_torch_saved_state_dict_loads_into_ember_and_gives_same_outputs(tmp_path: Path, device: str) -> None:
    torch.manual_seed(0)
    torch_model = _small_cnn(torch.nn)
    torch_model.train()
    torch_model(torch.randn(8, 1, 6, 6))  # running statistics that are not the defaults
    torch_model.eval()
    path = tmp_path / "cnn.safetensors"
    save_file(torch_model.state_dict(), str(path), metadata={"format": "pt"})
    model = _small_cnn(enn)
    result = model.load_state_dict(load_safetensors(path, device=device))
    assert result.missing_keys == [] and result.unexpected_keys == []
    model.eval()
    images = np.random.default_rng(0).normal(size=(3, 1, 6, 6)).astype(np.float32)
    assert_close(model(em.tensor(images, device=device)), torch_model(torch.tensor(images)), atol=1e-4)
    assert load_safetensors_metadata(path) == {"format": "pt"}


def test_ember_saved_state_dict_loads_in_torch(tmp_path: Path, device: str) -> None:
    model = _small_cnn(enn).to(device)
    path = tmp_path / "ember.safetensors"
    save_safetensors(model.state_dict(), path, metadata={"framework": "ember"})
    torch_model = _small_cnn(torch.nn)
    torch_model.load_state_dict(load_file(str(path)))
    for name, value in torch_model.state_dict().items():
        assert_close(model.state_dict()[name], value)
    assert load_safetensors_metadata(path) == {"framework": "ember"}


def test_every_dtype_both_ways(tmp_path: Path, device: str) -> None:
    generator = np.random.default_rng(1)
    tensors = {
        f"t_{dtype.name}": em.tensor(generator.normal(size=(2, 3)) * 10, device=device).cast(dtype)
        for dtype in TORCH_DTYPES
    }
    tensors["scalar"] = em.tensor(2.5, device=device)
    tensors["empty"] = em.zeros(0, 4, device=device)
    path = tmp_path / "all.safetensors"
    save_safetensors(tensors, path)
    from_torch = load_file(str(path))
    for name, tensor in tensors.items():
        assert_close(tensor, from_torch[name])
    save_file(from_torch, str(path))
    loaded = load_safetensors(path, device=device)
    assert loaded.keys() == tensors.keys()
    for name, tensor in loaded.items():
        assert tensor.device == device
        assert_close(tensor, from_torch[name])


def _write(path: Path, header: Any, data: bytes = b"", length: int | None = None) -> Path:
    encoded = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded) if length is None else length) + encoded + data)
    return path


def test_corrupt_and_truncated_files_raise_clear_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.safetensors"
    save_safetensors({"weight": em.ones(4, 4), "bias": em.zeros(4)}, good)
    content = good.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(content[:-10])
    with pytest.raises(SafetensorsError, match=r"truncated\.safetensors: tensor 'bias' ends at byte 80 .* truncated"):
        load_safetensors(truncated)
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(SafetensorsError, match=r"empty\.safetensors: not a safetensors file: 0 bytes"):
        load_safetensors(empty)
    short_header = tmp_path / "short.safetensors"
    short_header.write_bytes(content[:20])
    with pytest.raises(
        SafetensorsError, match=r"short\.safetensors: the header claims \d+ bytes but the file has only 20"
    ):
        load_safetensors(short_header)
    with pytest.raises(SafetensorsError, match=r"json\.safetensors: the header is not valid JSON"):
        load_safetensors(_write(tmp_path / "json.safetensors", b"{not json"))
    with pytest.raises(SafetensorsError, match=r"dtype\.safetensors: tensor 'x' has dtype 'F8_E4M3'"):
        load_safetensors(
            _write(
                tmp_path / "dtype.safetensors", {"x": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}, b"\0"
            )
        )
    with pytest.raises(SafetensorsError, match=r"needs 16 bytes but its data_offsets \[0, 12\] span 12"):
        load_safetensors(
            _write(
                tmp_path / "size.safetensors", {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, bytes(16)
            )
        )
    with pytest.raises(SafetensorsError, match="needs dtype, shape and data_offsets"):
        load_safetensors(_write(tmp_path / "fields.safetensors", {"x": {"dtype": "F32"}}))
    with pytest.raises(SafetensorsError, match="the header must be a JSON object"):
        load_safetensors(_write(tmp_path / "list.safetensors", [1, 2]))
    with pytest.raises(FileNotFoundError, match="no such safetensors file: .*missing.safetensors"):
        load_safetensors(tmp_path / "missing.safetensors")
    with pytest.raises(TypeError, match="is a list, not an ember Tensor or a numpy array"):
        save_safetensors({"x": [1.0, 2.0]}, tmp_path / "bad.safetensors")  # type: ignore[dict-item]
    arrays = {"x": np.arange(6, dtype=np.int16).reshape(2, 3), "y": np.array([0.5, -2.0], dtype=np.float64)}
    save_safetensors(arrays, tmp_path / "numpy.safetensors")  # numpy arrays are saved as they are
    for name, value in load_safetensors(tmp_path / "numpy.safetensors").items():
        assert value.dtype.name == arrays[name].dtype.name
        np.testing.assert_array_equal(value.numpy(), arrays[name])
    assert load_safetensors(_write(tmp_path / "nothing.safetensors", {"__metadata__": {"a": "b"}})) == {}


def test_loading_reads_only_the_header(tmp_path: Path) -> None:
    """Tensors stay memory-mapped on disk until a kernel needs them; nothing is copied or computed on load."""
    path = tmp_path / "lazy.safetensors"
    save_safetensors({"weight": em.arange(6, dtype=em.float32).reshape(2, 3)}, path)
    with em.profile() as record:
        loaded = load_safetensors(path)
    assert loaded["weight"].device == "disk:0" and not record.copies and not record.kernels
    np.testing.assert_array_equal((loaded["weight"] * 2).numpy(), np.arange(6).reshape(2, 3) * 2)
