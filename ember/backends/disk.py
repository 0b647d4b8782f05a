"""The `disk` backend: read-only memory-mapped regions of files (e.g. safetensors weights) as buffers.

A disk tensor occupies no RAM; its bytes are read only when a kernel on a compute device needs them (the scheduler
inserts a copy), so weights larger than RAM can be used. Disk devices run no kernels.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from ember.backends.base import Device, DeviceInfo, MemoryPool, Program
from ember.core.errors import DeviceError, EmberError
from ember.ir.ir import KernelIR


def map_file_bytes(path: str | Path, offset: int, nbytes: int, access: int
                   ) -> tuple[np.ndarray, mmap.mmap | None, int]:
    """`nbytes` bytes at `offset` of a file as a uint8 array over a mapping of the pages holding them (`access`:
    mmap.ACCESS_READ, or ACCESS_COPY for a private copy-on-write mapping), the mapping (None for no bytes) and the
    file's size; DeviceError when the bytes lie outside the file."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if offset < 0 or offset + nbytes > size:
            raise DeviceError(f"{path}: bytes {offset}..{offset + nbytes} lie outside the file of {size} bytes")
        if nbytes == 0:
            return np.empty(0, dtype=np.uint8), None, size
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(file.fileno(), offset + nbytes - start, access=access, offset=start)
    return np.frombuffer(mapping, dtype=np.uint8, count=nbytes, offset=offset - start), mapping, size


class FileShrankError(EmberError, OSError):
    """A memory-mapped file is shorter than when it was loaded (truncated or rewritten since): reading the missing
    pages would kill the process (SIGBUS), so ember raises this instead; the message names the file and sizes."""


class MappedBytes(np.ndarray):
    """A read-only byte view of a region of a file, which knows the file (through its own mapping's descriptor)
    and how long the file must be for the region to be readable."""

    mapping: mmap.mmap
    path: str
    loaded_size: int  # the file's size when it was mapped
    end: int  # the byte the region ends at

    def __array_finalize__(self, source: Any) -> None:
        for name in ("mapping", "path", "loaded_size", "end"):  # a slice of a region checks the whole region
            if hasattr(source, name):
                setattr(self, name, getattr(source, name))

    def check_readable(self) -> None:
        """Raise FileShrankError when the file no longer holds the whole region (os.fstat: a system call)."""
        size = self.mapping.size()
        if size < self.end:
            raise FileShrankError(f"file {self.path} is {size} bytes, shorter than the {self.loaded_size} bytes it had "
                                  f"when it was loaded (its tensor needs bytes up to {self.end}); it was truncated "
                                  "or rewritten since: load it again")


def _check(handle: Any) -> None:
    if isinstance(handle, MappedBytes):
        handle.check_readable()


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
        _check(handle)
        np.frombuffer(destination, dtype=np.uint8)[:] = handle[: len(destination)]

    def host_view(self, handle: np.ndarray, nbytes: int) -> memoryview:
        # read-only: a copy to a device reads the mapped pages once (the file is checked first: a file that shrank
        # since it was mapped raises FileShrankError, where reading its pages would be SIGBUS). numpy declares
        # ndarray.__buffer__ only for Python >= 3.12 (mypy checks 3.11), but every ndarray has the buffer protocol
        _check(handle)
        return memoryview(handle[:nbytes])  # type: ignore[arg-type]

    def map_region(self, path: str | Path, offset: int, nbytes: int) -> np.ndarray:
        """A read-only byte view of `nbytes` at `offset` of a file (counted as used, never allocated)."""
        data, mapping, size = map_file_bytes(path, offset, nbytes, mmap.ACCESS_READ)
        if mapping is None:
            return data
        region = data.view(MappedBytes)
        region.mapping, region.path, region.loaded_size, region.end = mapping, os.fspath(path), size, offset + nbytes
        return region


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
