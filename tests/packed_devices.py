"""What the packed-matmul tests share: CPUs whose renderer packs panels (AVX2-like and AVX-512-like DeviceInfo),
packing switched on for every test of a module that imports `optimizations_on`, lazy tensors on the dummy device
(kernels to inspect, nothing computed) and normal float32 data."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import ember as em
from ember.backends.base import DeviceInfo

AVX2 = DeviceInfo(compute_units=2, preferred_vector_width=8, vector_registers=16, vector_ops=frozenset({"any"}),
                  host_cores=True, packed_matmul=True)
AVX512 = replace(AVX2, preferred_vector_width=16, vector_registers=32)


@pytest.fixture(autouse=True)
def optimizations_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packing is an optional transform (EMBER_NOOPT=1 turns it off): these tests are about it."""
    monkeypatch.setenv("EMBER_NOOPT", "0")


def dummy(*shape: int, dtype: em.DType = em.float32) -> em.Tensor:
    """Zeros of `shape` on the dummy device, as `dtype`."""
    tensor = em.tensor(np.zeros(shape, dtype=np.float32), device="dummy:0")
    return tensor if dtype == em.float32 else tensor.to(dtype)


def normal(*shape: int, seed: int = 0) -> np.ndarray:
    """Standard normal float32 data of `shape` (its seed offset by the shape, so operands of one shape differ)."""
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape, dtype=np.float32)
