"""The `disk` backend: read-only memory-mapped regions of files (e.g. safetensors weights) as buffers.

A disk tensor occupies no RAM; its bytes are read only when a kernel on a compute device needs them (the scheduler
inserts a copy), so weights larger than RAM can be used. Disk devices run no kernels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ember.backends.base import Device, DeviceInfo, MemoryPool, Program
from ember.core.errors import DeviceError
from ember.ir.ir import KernelIR


class DiskPool(MemoryPool):
    """Memory-mapped file regions; allocation of new memory is not possible."""

    def create_buffer(self, nbytes: int) -> Any:
        raise DeviceError(f"{self.name} holds memory-mapped files only; tensors computed from it live on a "
                          "compute device")

    def destroy_buffer(self, handle: Any) -> None:
        return None  # the mapping is released when the last view of it is gone

    def copy_in(self, handle: Any, source: memoryview) -> None:
        raise DeviceError(f"{self.name} is read-only")

    def copy_out(self, destination: memoryview, handle: np.ndarray) -> None:
        np.frombuffer(destination, dtype=np.uint8)[:] = handle[: len(destination)]

    def host_view(self, handle: np.ndarray, nbytes: int) -> memoryview:
        # read-only: a copy to a device reads the mapped pages once. numpy declares ndarray.__buffer__ only for
        # Python >= 3.12 (mypy checks 3.11), but every ndarray has the buffer protocol
        return memoryview(handle[:nbytes])  # type: ignore[arg-type]

    def map_region(self, path: str | Path, offset: int, nbytes: int) -> np.ndarray:
        """A read-only byte view of `nbytes` at `offset` of a file (counted as used, never allocated)."""
        size = Path(path).stat().st_size
        if offset < 0 or offset + nbytes > size:
            raise DeviceError(f"{path}: bytes {offset}..{offset + nbytes} lie outside the file of {size} bytes")
        if nbytes == 0:
            return np.empty(0, dtype=np.uint8)
        return np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(nbytes,))


class DiskDevice(Device):
    def __init__(self, name: str = "disk:0") -> None:
        self.name = name
        self.info = DeviceInfo(compute_units=0, can_run=False)
        self.pool = DiskPool(name)

    def render(self, kernel: KernelIR) -> str:
        raise DeviceError(f"{self.name} runs no kernels")

    def compile(self, kernel: KernelIR) -> Program:
        raise DeviceError(f"{self.name} runs no kernels; the scheduler places kernels on compute devices")


def probe() -> list[Device]:
    return [DiskDevice("disk:0")]
