"""A file-backed tensor whose file shrank after it was loaded raises an error naming the file (reading the missing
pages of its memory map would kill the process with SIGBUS): safetensors, GGUF and the disk backend."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import ember as em
from ember.backends.disk import FileShrankError
from ember.io import load_gguf, load_safetensors, read_gguf_header, save_safetensors
from ember.scheduler.buffers import mapped_node

VALUES = np.linspace(-3, 3, 64 * 1024, dtype=np.float32)  # 256 KiB: pages beyond the truncation point


def _shrinks(path: Path, keep: int) -> str:
    os.truncate(path, keep)
    return rf"file {path} is {keep} bytes, shorter than the \d+ bytes it had when it was loaded"


def test_a_truncated_safetensors_file_raises_naming_it(tmp_path: Path, device: str) -> None:
    path = tmp_path / "weights.safetensors"
    save_safetensors({"first": em.tensor(VALUES[:16]), "weight": em.tensor(VALUES)}, path)
    tensors = load_safetensors(path)
    on_device = load_safetensors(path, device=device)
    np.testing.assert_array_equal(tensors["first"].numpy(), VALUES[:16])  # read while the file is whole
    message = _shrinks(path, 4096)
    with pytest.raises(FileShrankError, match=message):
        tensors["weight"].numpy()
    with pytest.raises(OSError, match=message):  # (an OSError, as a failed read of a file is)
        (on_device["weight"] * 2).numpy()
    with pytest.raises(FileShrankError, match=message):
        (tensors["weight"].to(device) + 1).sum().numpy()
    np.testing.assert_allclose((em.tensor(VALUES, device=device) * 2).numpy(), VALUES * 2)  # ember goes on


def test_a_truncated_gguf_file_raises_naming_it(tmp_path: Path, device: str) -> None:
    pytest.importorskip("gguf")
    from tests.test_gguf import write_model

    path = tmp_path / "model.gguf"
    arrays = write_model(path)
    tensors = load_gguf(path)
    np.testing.assert_array_equal(tensors["plain.f32"].numpy(), arrays["plain.f32"])
    quantized = tensors["quant.q6_k"]
    message = _shrinks(path, read_gguf_header(path).tensors["quant.q6_k"].offset + 8)  # its bytes are gone
    with pytest.raises(FileShrankError, match=message):
        quantized.to(device).dequantize().numpy()


def test_a_truncated_disk_region_raises_naming_it(tmp_path: Path, device: str) -> None:
    path = tmp_path / "raw.bin"
    path.write_bytes(VALUES.tobytes())
    node = mapped_node(str(path), 4096, (1024,), em.float32)
    tensor = em.Tensor._from_node(node)
    np.testing.assert_array_equal(tensor.to(device).numpy(), VALUES[1024:2048])
    message = _shrinks(path, 4096 + 100)
    with pytest.raises(FileShrankError, match=message):
        tensor.to(device).numpy()
    path.write_bytes(VALUES.tobytes())  # grown back to its size: readable again
    np.testing.assert_array_equal((tensor.to(device) + 0).numpy(), VALUES[1024:2048])
