"""The disk pool: memory-mapped file regions used as tensors, read only when a kernel needs them."""

import numpy as np
import pytest

import ember as em
from ember.core.tensor import Tensor
from ember.scheduler.buffers import mapped_node


def mapped(path, offset, shape, dtype=em.float32) -> Tensor:
    return Tensor._from_node(mapped_node(str(path), offset, shape, dtype))


def test_disk_tensor_is_read_when_a_kernel_needs_it(tmp_path, device: str) -> None:
    values = np.arange(24, dtype=np.float32)
    path = tmp_path / "weights.bin"
    path.write_bytes(b"HEADER" + values.tobytes())
    weights = mapped(path, 6, (4, 6))
    assert weights.device == "disk:0"
    # change the file after mapping: the values used are those on disk when the kernel runs
    with open(path, "r+b") as handle:
        handle.seek(6)
        handle.write((values * 10).tobytes())
    with em.profile() as record:
        result = (weights.to(device) + 1).sum(1).realize()
    np.testing.assert_allclose(result.numpy(), (values * 10 + 1).reshape(4, 6).sum(1))
    assert record.copies and record.copies[0][0] == "disk:0"


def test_ops_on_disk_tensors_run_on_the_default_device(tmp_path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(np.ones(8, dtype=np.float32).tobytes())
    result = (mapped(path, 0, (8,)) * 3).realize()
    assert result.device == em.get_default_device()
    np.testing.assert_allclose(result.numpy(), np.full(8, 3.0))


def test_region_outside_the_file_is_an_error(tmp_path) -> None:
    path = tmp_path / "small.bin"
    path.write_bytes(b"1234")
    with pytest.raises(em.DeviceError, match=r"bytes 0..16 lie outside the file of 4 bytes"):
        mapped(path, 0, (4,))
