"""The optional transforms (ir/opt.py, ir/vectorize.py): values against torch on shapes that exercise vector tiles,
clamped last tiles and the fallbacks, and checks of the generated C that each transform is applied where expected
(and nowhere with EMBER_NOOPT=1). The whole suite also runs with EMBER_NOOPT=1, so these values are checked both ways.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember as em
from ember.backends.base import DeviceInfo
from ember.backends.c import VECTOR_OPS, CRenderer
from ember.ir.opt import build_kernel_ir
from ember.scheduler.kernelize import KernelItem, kernelize
from tests.helpers import assert_close, pair, random_array

# (left, right): vector tiles of two vectors and of one, rows that do not divide the tile (clamped), fewer rows than
# a tile, batches, one row, and a last dim that is no whole number of vectors (scalar tiles)
MATMUL_SHAPES = [
    ((13, 40), (40, 32)),
    ((7, 5), (5, 24)),
    ((3, 100), (100, 8)),
    ((2, 3, 17), (17, 16)),
    ((1, 9), (9, 64)),
    ((6, 12), (12, 10)),
    ((30, 8), (8, 48)),
]
C_VECTORS = DeviceInfo(compute_units=2, preferred_vector_width=8, vector_ops=VECTOR_OPS)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tiled_matmul_values(device: str, dtype: type) -> None:
    for seed, (left_shape, right_shape) in enumerate(MATMUL_SHAPES):
        a, ta = pair(random_array(left_shape, dtype, seed=seed), device)
        b, tb = pair(random_array(right_shape, dtype, seed=seed + 100), device)
        assert_close(a @ b, ta @ tb, atol=1e-4)


def test_tiled_matmul_variants(device: str) -> None:
    a, ta = pair(random_array((11, 20), seed=1), device)
    b, tb = pair(random_array((20, 16), seed=2), device)
    bias, tbias = pair(random_array((16,), seed=3), device)
    assert_close((a @ b + bias).relu(), (ta @ tb + tbias).relu(), atol=1e-4)  # fused epilogue
    w, tw = pair(random_array((16, 20), seed=4), device)
    assert_close(a @ w.T, ta @ tw.T, atol=1e-4)  # columns of B are not contiguous: lanes are gathered
    padded, tpadded = a.pad((0, 0, 2, 3)), torch.nn.functional.pad(ta, (0, 0, 2, 3))
    assert_close(padded @ b, tpadded @ tb, atol=1e-4)  # masked rows
    assert_close(a.max(1, keepdim=True).values @ b[:1], ta.max(1, keepdim=True).values @ tb[:1], atol=1e-4)
    integers, tintegers = pair(random_array((9, 7), np.int32, low=-5, high=5, seed=5), device)
    right, tright = pair(random_array((7, 16), np.int32, low=-5, high=5, seed=6), device)
    assert_close(integers @ right, tintegers @ tright)


def rendered_c(tensor: em.Tensor, info: DeviceInfo = C_VECTORS) -> str:
    items = [item for item in kernelize([tensor.node]) if isinstance(item, KernelItem)]
    return "\n".join(CRenderer().render(build_kernel_ir(item.kernel, f"kernel{number}", info))
                     for number, item in enumerate(items))


def _dummy(*shape: int, dtype: em.DType = em.float32) -> em.Tensor:
    return em.tensor(np.zeros(shape, dtype=dtype.numpy), device="dummy:0")


def test_matmul_tile_is_vectorized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_NOOPT", "0")
    source = rendered_c(_dummy(64, 32) @ _dummy(32, 64))
    assert "ember_float32x8 acc" in source and source.count("ember_float32x8 acc") == 12  # 6 rows x 2 vectors
    assert source.count("*(ember_float32x8_u*)(data0+") == 12  # vector stores
    assert "(*(const ember_float32x8_u*)(data2+" in source  # vector loads of B's rows
    # 11 tiles of 6 rows (the last clamped) x 4 of 16 columns, rows varying fastest
    assert "for (int gid = 0; gid < 44;" in source and "(gid%11)" in source and "(gid/11)" in source
    double = rendered_c(_dummy(64, 32, dtype=em.float64) @ _dummy(32, 64, dtype=em.float64))
    assert double.count("ember_float64x4 acc") == 12
    odd = rendered_c(_dummy(64, 32) @ _dummy(32, 12))  # 12 columns: no whole vectors, scalar tiles as before
    assert "ember_float32x" not in odd
    no_vectors = rendered_c(_dummy(64, 32) @ _dummy(32, 64), DeviceInfo(compute_units=2, preferred_vector_width=8))
    assert "ember_float32x" not in no_vectors and "float acc" in no_vectors  # a device without vector types


def test_noopt_turns_every_transform_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_NOOPT", "1")
    source = rendered_c(_dummy(64, 32) @ _dummy(32, 64))
    assert "ember_float32x" not in source and source.count("acc") == 3  # one accumulator: defined, updated, stored
