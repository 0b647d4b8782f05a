"""The optional transforms (ir/opt.py, ir/vectorize.py): values against torch on shapes that exercise vector tiles,
clamped last tiles and the fallbacks (on every test device, OpenCL included), and checks of the generated C and
OpenCL C that each transform is applied where expected (and nowhere with EMBER_NOOPT=1); OpenCL's launch geometry
and its one program for many kernels. The whole suite also runs with EMBER_NOOPT=1, so these values are checked both ways.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.backends import opencl, opencl_probe
from ember.backends.c import VECTOR_OPS, CRenderer
from ember.backends.registry import REGISTRY
from ember.capabilities import DeviceInfo, launch_geometry
from ember.core.errors import BackendUnavailable
from ember.ir.opt import build_kernel_ir
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch
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
    ((100, 37), (37, 48)),  # work items loop over 6 tiles each and stage their panel of B
    ((2, 50, 9), (9, 32)),
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
    rows, trows = pair(random_array((70, 33), seed=7), device)
    wide, twide = pair(random_array((48, 33), seed=8), device)
    assert_close(rows @ wide.T, trows @ twide.T, atol=1e-4)  # the gather is staged once per work item
    prologue, tprologue = pair(random_array((70, 48), seed=9), device)
    right, tright = pair(random_array((70, 64), seed=10), device)
    assert_close((prologue * (prologue > 0.5)).T @ right, (tprologue * (tprologue > 0.5)).T @ tright, atol=1e-4)
    padded, tpadded = a.pad((0, 0, 2, 3)), torch.nn.functional.pad(ta, (0, 0, 2, 3))
    assert_close(padded @ b, tpadded @ tb, atol=1e-4)  # masked rows
    assert_close(a.max(1, keepdim=True).values @ b[:1], ta.max(1, keepdim=True).values @ tb[:1], atol=1e-4)
    integers, tintegers = pair(random_array((9, 7), np.int32, low=-5, high=5, seed=5), device)
    right, tright = pair(random_array((7, 16), np.int32, low=-5, high=5, seed=6), device)
    assert_close(integers @ right, tintegers @ tright)


def test_vector_reductions_values(device: str) -> None:
    # rows of 16/24/40 elements are reduced by 8 lanes; 17 is not; 7 and 13 rows leave a clamped last tile
    for seed, shape in enumerate([(7, 16), (13, 40), (5, 24), (9, 17), (2, 3, 32)]):
        x, tx = pair(random_array(shape, seed=seed), device)
        assert_close(x.softmax(-1), torch.softmax(tx, -1), atol=1e-6)
        assert_close(x.sum(-1), tx.sum(-1), atol=1e-5)
        assert_close(x.max(-1).values, tx.max(-1).values)
        assert_close(x.sum(0), tx.sum(0), atol=1e-5)  # vectors along the output's last dim
        assert_close(x.prod(-1), tx.prod(-1), atol=1e-5)
    x, tx = pair(random_array((6, 32), np.float64, seed=9), device)
    assert_close(x.logsumexp(-1), torch.logsumexp(tx, -1), atol=1e-12, rtol=1e-12)
    special = np.array([[np.nan, 1.0] + [0.0] * 14, [-np.inf] * 16, [np.inf, -1.0] + [2.0] * 14], np.float32)
    x, tx = pair(special, device)
    assert_close(x.max(-1).values, tx.max(-1).values)  # NaN in one lane propagates
    assert_close(x.sum(-1), tx.sum(-1))
    integers, tintegers = pair(random_array((5, 32), np.int32, low=-9, high=9, seed=3), device)
    assert_close(integers.sum(-1), tintegers.sum(-1))


def test_vector_elementwise_values(device: str) -> None:
    x, tx = pair(random_array((3, 32), seed=1), device)
    y, ty = pair(random_array((3, 32), seed=2), device)
    column, tcolumn = pair(random_array((3, 1), seed=3), device)
    assert_close(((x * 2 + 1).exp()).sqrt(), ((tx * 2 + 1).exp()).sqrt())
    assert_close(em.where(x > y, x, y * column), torch.where(tx > ty, tx, ty * tcolumn))  # masks, a broadcast column
    assert_close((x - column).maximum(y), (tx - tcolumn).maximum(ty))
    assert_close(x.log2().nan_to_num(0.0) + x.sin() + x.trunc() + x.reciprocal(),
                 tx.log2().nan_to_num(0.0) + tx.sin() + tx.trunc() + tx.reciprocal(), atol=1e-4)
    with_nan, twith_nan = pair(np.where(random_array((2, 16), seed=4) > 1, np.nan, 0.5).astype(np.float32), device)
    assert_close(with_nan.relu() + with_nan.clamp(0, 1), twith_nan.relu() + twith_nan.clamp(0, 1))
    wide, twide = pair(random_array((4, 8), np.float64, seed=5), device)
    assert_close((wide * 3).exp() - wide.T.T, (twide * 3).exp() - twide, atol=1e-12, rtol=1e-12)
    assert_close(x.T + 1, tx.T + 1)  # lanes would gather: stays scalar
    shifted, tshifted = pair(random_array((3, 33), seed=6), device)  # vectors at odd offsets (rows of 33 and 24)
    assert_close(shifted[:, 1:25].exp() * 2, tshifted[:, 1:25].exp() * 2)


def rendered_c(tensor: em.Tensor, info: DeviceInfo = C_VECTORS) -> str:
    items = [item for item in kernelize([tensor.node]) if isinstance(item, Launch)]
    return "\n".join(CRenderer().render(build_kernel_ir(item.kernel, f"kernel{number}", info))
                     for number, item in enumerate(items))


def _dummy(*shape: int, dtype: em.DType = em.float32) -> em.Tensor:
    return em.tensor(np.zeros(shape, dtype=dtype.numpy), device="dummy:0")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_strided_reads_are_picked_from_vector_loads(dtype: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's even or odd elements (x[:, ::2], x[:, 1::2], a stride-2 phase): each vector is picked from the two
    vector loads that cover its span (IROp.SHUFFLE, gcc's __builtin_shuffle), the second ending at the last element
    read (a row at the end of the buffer reads nothing past it), not built from a load and an insert per lane (2
    AVX-512 cores: a max pool's window 63 -> 39 us, a strided convolution's phases 21 -> 15 us). Values are numpy's,
    a NaN and infs among them, on the c device, whose kernels take them."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    element = em.float32 if dtype is np.float32 else em.float64
    source = rendered_c(_dummy(64, 64, dtype=element)[:, 1::2] + 1)
    lanes = 8 if dtype is np.float32 else 4
    mask = f"ember_int{32 if dtype is np.float32 else 64}x{lanes}"
    # the first load's even lanes, then the second's odd ones (it starts one element before the first one's end)
    picks = ",".join(str(pick) for pick in list(range(0, lanes, 2)) + list(range(lanes + 1, 2 * lanes, 2)))
    assert "__builtin_shuffle(v" in source and f"({mask}){{{picks}}})" in source, source
    data = random_array((63, 130), seed=3).astype(dtype)
    data[5, 7], data[9, 1], data[62, 129] = np.nan, np.inf, -np.inf
    x = em.tensor(data, device="c")
    for start in (0, 1):
        np.testing.assert_array_equal((x[:, start::2] + 1).numpy(), data[:, start::2] + 1)
    np.testing.assert_array_equal(x[:, 1::2].contiguous().numpy(), data[:, 1::2])


def test_strided_reads_at_users_sizes_match_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shuffled strided reads at a user's size: 70,001 rows (past 65,535) of 130, 9.1M elements (the last row's
    last vector ends at the buffer's end), read even and odd on the c device's two threads, with a padded stride-2
    phase of the same rows; each compared with numpy in full, NaN and infs at row ends included."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    data = np.random.default_rng(9).standard_normal((70_001, 130), dtype=np.float32)
    data[0, 0], data[70_000, 129], data[35_000, 128] = np.nan, np.inf, -np.inf
    x = em.tensor(data, device="c")
    np.testing.assert_array_equal((x[:, ::2] * 2).numpy(), data[:, ::2] * 2)
    np.testing.assert_array_equal((x[:, 1::2] + 1).numpy(), data[:, 1::2] + 1)
    padded = np.pad(data, ((0, 0), (1, 1)))
    np.testing.assert_array_equal(em.nn.functional.pad(x, (1, 1))[:, 1::2].numpy(), padded[:, 1::2])


def test_column_sums_over_a_broadcast_are_vectorized_along_the_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer norm's weight gradient (the normalized input times the output's gradient, summed over batch and
    positions: one output axis, a reduce over broadcast inputs, so no matmul tile) takes vectors along its columns,
    each work item summing whole rows of them (it was 8 scalar sums a work item: nanoGPT's four such kernels ran 3x
    faster, 206 -> 73 us). Values are numpy's, a NaN and an inf among them."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    source = rendered_c((_dummy(64, 64, 64) * _dummy(64, 64, 1)).sum((0, 1)))
    assert "ember_float32x8 acc" in source and "(*(const ember_float32x8_u*)(data1+" in source, source
    values, scales = random_array((64, 64, 64), seed=1), random_array((64, 64, 1), seed=2)
    values[3, 4, 5], values[6, 7, 8] = np.nan, np.inf
    result = (em.tensor(values, device="c") * em.tensor(scales, device="c")).sum((0, 1))
    np.testing.assert_allclose(result.numpy(), (values.astype(np.float64) * scales).sum((0, 1)), rtol=1e-4,
                               atol=1e-3)


def test_matmul_tile_is_vectorized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_NOOPT", "0")
    source = rendered_c(_dummy(23, 32) @ _dummy(32, 64))
    assert "ember_float32x8 acc" in source and source.count("ember_float32x8 acc") == 12  # 6 rows x 2 vectors
    assert source.count("*(ember_float32x8_u*)(data0+") == 12  # vector stores
    assert "(*(const ember_float32x8_u*)(data2+" in source  # vector loads of B's rows
    # 4 tiles of 6 rows (the last clamped: rows 18-22, then 22 again) x 4 of 16 columns, rows varying fastest
    assert "for (int gid = 0; gid < 16;" in source and "(gid%4)" in source and "(gid/4)" in source
    assert "<23)" in source and "local" not in source  # too few tiles per work item to stage B
    double = rendered_c(_dummy(64, 32, dtype=em.float64) @ _dummy(32, 64, dtype=em.float64))
    assert double.count("ember_float64x4 acc") == 12
    odd = rendered_c(_dummy(64, 32) @ _dummy(32, 12))  # 12 columns: no whole vectors, scalar tiles as before
    assert "ember_float32x" not in odd
    no_vectors = rendered_c(_dummy(64, 32) @ _dummy(32, 64), DeviceInfo(compute_units=2, preferred_vector_width=8))
    assert "ember_float32x" not in no_vectors and "float acc" in no_vectors  # a device without vector types


def test_matmul_panel_is_staged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_NOOPT", "0")
    source = rendered_c(_dummy(256, 96) @ _dummy(96, 64))
    # 4 panels of 16 columns x 2 chunks of rows: each work item copies its panel (96 x 16) once, then loops over
    # 22 tiles of 6 rows (43 in all, the last clamped) reading the copy
    assert "for (int gid = 0; gid < 8;" in source and "float local1[1536] __attribute__((aligned(64)));" in source
    fill, tiles = source.index("local1+"), source.index("for (int loop1 = 0; loop1 < 22; loop1++)")
    assert fill < tiles and "(*(const ember_float32x8_u*)(local1+" in source[tiles:]
    assert "data2" not in source[tiles:]  # B is read only by the fill
    linear = rendered_c(_dummy(256, 96) @ _dummy(64, 96).T)
    assert "float local1[1536]" in linear and "ember_float32x8 acc" in linear  # the transposed panel too
    assert "local1" not in rendered_c(_dummy(256, 96) @ _dummy(96, 8))  # one panel, few tiles: no copy
    # a computed A (an activation's gradient): work items walk along their rows, A's rows computed once each
    h, x = _dummy(256, 512), _dummy(256, 784)
    gradient = rendered_c((h * (h > 0)).T @ x)
    tiles = gradient.index("for (int loop1 = 0; loop1 < 49; loop1++)")
    assert "(0.0f<" in gradient[:tiles] and "(0.0f<" not in gradient[tiles:]  # h > 0 outside the tile loop


def test_reductions_and_elementwise_are_vectorized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_NOOPT", "0")
    x = _dummy(64, 4096)
    softmax = rendered_c(x.softmax(-1))
    # one kernel, a row per work item: the max and the sum in 8 lanes each, then the row stored in vectors
    assert softmax.count("ember_float32x8 acc") == 2 and softmax.count("void ") == 1
    assert "ember_exp2_float32x8(" in softmax and "ember_max_float32x8(" in softmax
    assert "*(ember_float32x8_u*)(data0+" in softmax and "loop1 < 512;" in softmax
    column_sums = rendered_c(x.sum(0))
    assert "ember_float32x8 acc" in column_sums and "loop1 < 64;" in column_sums
    assert "ember_float32x" not in rendered_c(x.T + 1) and "ember_float32x" not in rendered_c(_dummy(64, 17).sum(1))
    linear = rendered_c(_dummy(64, 32) @ _dummy(48, 32).T)  # B transposed: vectors along the reduced dim
    assert linear.count("ember_float32x8 acc") == 12 and "loop1 < 4;" in linear


def test_a_small_reduce_computes_one_output_per_work_item(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel reducing fewer than SMALL_REDUCE_ELEMENTS in all (nanoGPT's layer norm statistics: rows of 64, 64 x
    64 of them) takes one output per work item in vectors along its rows, not a register tile of 4 x 3 outputs: as
    fast there, a twelfth of the code to lower and compile. From that size on the tile is kept. Values are torch's
    either side of the bound, the row's sum and its centered sum of squares."""
    from ember.ir.opt import SMALL_REDUCE_ELEMENTS

    monkeypatch.setenv("EMBER_NOOPT", "0")
    for batch, accumulators in [(64, 1), (256, 12)]:
        source = rendered_c((_dummy(batch, 64, 64) + _dummy(1, 64, 64)).sum(-1))
        assert source.count("ember_float32x8 acc") == accumulators
        assert (batch * 64 * 64 < SMALL_REDUCE_ELEMENTS) == (accumulators == 1)
        x, tx = pair(random_array((batch, 64, 64), seed=batch), device)
        position, tposition = pair(random_array((1, 64, 64), seed=batch + 1), device)
        assert_close((x + position).sum(-1), (tx + tposition).sum(-1), atol=1e-4)
        centered, tcentered = x - x.mean(-1, keepdim=True), tx - tx.mean(-1, keepdim=True)
        assert_close((centered * centered + position).sum(-1), (tcentered * tcentered + tposition).sum(-1),
                     atol=1e-4)


def test_a_scalar_reduce_is_vectorized_along_its_reduces(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loss over a batch (one output): its exp and log in 8 lanes, as a row reduction's (a VAE's loss kernel was a
    scalar loop of 63 us, one of its step's 71 kernels)."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    logits, targets = _dummy(64, 64), _dummy(64, 64)
    loss = rendered_c(em.nn.functional.binary_cross_entropy(logits.sigmoid(), targets, reduction="sum"))
    assert "ember_float32x8 acc" in loss and "ember_exp2_float32x8(" in loss and "ember_log2_float32x8(" in loss
    assert "ember_float32x8 acc" in rendered_c(_dummy(64, 64).sum()) and "ember_float32x" not in rendered_c(
        _dummy(7, 3).sum())


def test_random_draws_hash_in_unsigned_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A random draw's integer hash runs in uint32 vectors under its float32 lanes (its counters one addition of
    0, 1, 2, ...): it was a scalar row tile of 64 hashes, 1,761 lines of C and 0.2 s of gcc per weight shape of a
    model's initialization."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    for draw in (em.rand(192, 64, device="dummy:0"), em.empty(64, 64, device="dummy:0").uniform_(-0.1, 0.1),
                 em.nn.functional.dropout(_dummy(64, 128), 0.5)):
        source = rendered_c(draw)
        assert "ember_uint32x8" in source and "*2146121005u)" not in source  # (no scalar hash step)
        assert source.count("\n") < 120


def test_vectorized_random_draws_are_the_references_bits(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """rand in vectors is the numpy reference hash bit for bit: rows of whole vectors, rows that no vector width
    divides, and a counter whose low 32 bits wrap inside the draw."""
    from ember.core import creation
    from ember.core.creation import random_key
    from tests.reference_random import uniform_float32

    for seed, counter, shape in ((0, 0, (192, 64)), (5, 77, (7, 50)), (2**33 + 1, 2**32 - 1000, (3, 4096))):
        em.manual_seed(seed)
        monkeypatch.setattr(creation.RandomState, "counter", counter)
        drawn = em.rand(*shape, device=device).numpy().reshape(-1)
        expected = uniform_float32(random_key(seed, counter), int(np.prod(shape)))
        np.testing.assert_array_equal(drawn.view(np.uint32), expected.view(np.uint32))


def test_scalar_reduces_match_torch(device: str) -> None:
    """Whole-tensor reduces in lanes: NaN, infinities and a length no whole number of vectors, against torch."""
    for seed, shape in enumerate([(64, 64), (13, 40), (999,), (2, 3, 33)]):
        x, tx = pair(random_array(shape, seed=seed), device)
        assert_close(x.sum(), tx.sum(), atol=1e-4)
        assert_close(x.amax(), tx.amax())
        assert_close(x.exp().sum().log(), tx.exp().sum().log(), atol=1e-5)
        target, ttarget = pair(np.random.default_rng(seed).random(shape).astype(np.float32), device)
        assert_close(em.nn.functional.binary_cross_entropy(x.sigmoid(), target),
                     torch.nn.functional.binary_cross_entropy(tx.sigmoid(), ttarget), atol=1e-5)
    special = np.zeros(100, np.float32)
    special[37], special[80] = np.nan, np.inf
    x, tx = pair(special, device)
    assert_close(x.amax(), tx.amax())
    assert_close(x.sum(), tx.sum())
    special[37] = -np.inf
    x, tx = pair(special, device)
    assert_close(x.sum(), tx.sum())  # inf - inf


def test_noopt_turns_every_transform_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_NOOPT", "1")
    source = rendered_c(_dummy(64, 32) @ _dummy(32, 64))
    assert "ember_float32x" not in source and source.count("acc") == 3  # one accumulator: defined, updated, stored
    for tensor in (_dummy(64, 4096).softmax(-1), _dummy(64, 32) + 1, _dummy(64, 32) @ _dummy(48, 32).T):
        assert "ember_float32x" not in rendered_c(tensor)


OPENCL_VECTORS = DeviceInfo(compute_units=2, preferred_vector_width=8, vector_ops=opencl.VECTOR_OPS)


def rendered_opencl(tensor: em.Tensor) -> str:
    items = [item for item in kernelize([tensor.node]) if isinstance(item, Launch)]
    renderer = opencl.OpenCLRenderer()
    return "\n".join(renderer.render(build_kernel_ir(item.kernel, f"kernel{number}", OPENCL_VECTORS))
                     for number, item in enumerate(items))


def test_opencl_renders_vector_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_NOOPT", "0")
    chain = rendered_opencl(((_dummy(64, 32) * 2 + 1).exp()).sqrt())
    # vectors read and written through element-aligned pointers (PoCL calls vload8/vstore8 as functions)
    assert "typedef float8 ember_float8_u __attribute__((aligned(4)));" in chain and "vload" not in chain
    assert "(*(const __global ember_float8_u*)(data1+" in chain and "*(__global ember_float8_u*)(data0+" in chain
    assert "exp2(v" in chain and "sqrt(v" in chain
    assert "select(" in chain and "float ember_" not in chain  # the clamp of exp as a select of float8 lanes
    matmul = rendered_opencl(_dummy(23, 32) @ _dummy(32, 64))
    assert matmul.count("float8 acc") == 12 and matmul.count(") = acc") == 12  # 6 rows x 2 vectors
    softmax = rendered_opencl(_dummy(64, 4096).softmax(-1))  # one kernel (the row's max and sum fused)
    assert softmax.count("__kernel void") == 1 and "ember_max_float32x8(" in softmax
    assert "float8 acc" in softmax and ".s7" in softmax  # lanes of the vector accumulators summed at the end
    columns = rendered_opencl(_dummy(64, 4096).softmax(0))  # three kernels, the max's a vector maximum (exp's
    # lower limit is a select)
    assert columns.count("__kernel void") == 3 and columns.count("#define EMBER_MAX_FLOAT32X8") == 1  # guarded
    double = rendered_opencl(_dummy(64, 32, dtype=em.float64) @ _dummy(32, 64, dtype=em.float64))
    assert double.count("double4 acc") == 12
    staged = rendered_opencl(_dummy(256, 96) @ _dummy(96, 64))
    assert "float local1[1536];" in staged and "(*(const __private ember_float8_u*)(local1+" in staged
    assert "float8" not in rendered_opencl(_dummy(64, 17).sum(1))  # no whole vectors: scalar as before


def test_opencl_work_groups_leave_no_core_idle() -> None:
    def local_size(global_size: int, compute_units: int, largest: int) -> int:
        info = DeviceInfo(compute_units=compute_units, preferred_local_size=opencl.LOCAL_SIZE,
                          min_groups_per_unit=opencl.GROUPS_PER_UNIT)
        (groups, rows, _), size = launch_geometry(global_size, info, largest)
        assert rows == 1 and (groups - 1) * size < max(global_size, 1) <= groups * size
        return size

    assert local_size(1 << 20, 2, 32) == 32  # plenty of work: the largest groups
    assert local_size(64, 2, 32) == 8  # a tiled matmul's 64 work items: 8 groups for 2 cores
    assert local_size(86, 4, 32) == 4 and local_size(3, 2, 32) == 1
    assert local_size(1000, 2, 16) == 16  # never above the kernel's own limit


def test_launch_geometry_of_each_backend() -> None:
    """One function chooses every backend's groups from DeviceInfo: CUDA's blocks of 256 threads, WebGPU's
    workgroups of 64 in rows of at most 65535."""
    cuda_like = DeviceInfo(compute_units=80, preferred_local_size=256)
    assert launch_geometry(1000, cuda_like) == ((4, 1, 1), 256) and launch_geometry(0, cuda_like) == ((1, 1, 1), 256)
    webgpu = DeviceInfo(preferred_local_size=64, max_groups_per_dimension=65535)
    assert launch_geometry(64 * 65535, webgpu) == ((65535, 1, 1), 64)
    assert launch_geometry(64 * 65535 + 1, webgpu) == ((65535, 2, 1), 64)
    assert launch_geometry(5, DeviceInfo()) == ((5, 1, 1), 1)


def test_opencl_builds_a_schedule_as_one_program(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    try:
        name = REGISTRY.probe("opencl")[0].name
    except BackendUnavailable as error:
        pytest.skip(f"no OpenCL device here: {error}")
    from ember.scheduler.compile_cache import COMPILED

    device = REGISTRY.device(name)
    built: list[str] = []
    original = device._build_cached
    monkeypatch.setattr(device, "_build_cached", lambda source, for_launch: built.append(source) or
                        original(source, for_launch))
    # shapes no other test uses, so every kernel is new: max, sum of exponentials, the normalized store (a softmax
    # over the first axis: over the last, it is one kernel)
    x, tx = pair(random_array((4100, 5), seed=11), name)
    assert_close(x.softmax(0) * 3, torch.softmax(tx, 0) * 3, atol=1e-6)
    assert len(built) == 1 and built[0].count("__kernel void") >= 2
    programs = {compiled.program.program for (device_name, _), compiled in COMPILED.items()
                if device_name == name and compiled.name in built[0]}
    assert len(programs) == 1  # the kernels share one cl.Program


def test_lowered_kernels_are_cached_on_disk(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    from ember.ir import lowered_cache, opt

    monkeypatch.setenv("EMBER_NOOPT", "0")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    (item,) = [item for item in kernelize([(_dummy(23, 32) @ _dummy(32, 64)).node]) if isinstance(item, Launch)]
    lowered = build_kernel_ir(item.kernel, "cached", OPENCL_VECTORS)
    (entry,) = (tmp_path / "ir").iterdir()  # type: ignore[operator]
    calls: list[str] = []
    original = opt.choose_plan
    monkeypatch.setattr(opt, "choose_plan", lambda *arguments: calls.append("lowered") or original(*arguments))
    loaded = build_kernel_ir(item.kernel, "cached", OPENCL_VECTORS)
    assert calls == [] and loaded is not lowered  # from the disk
    renderer = opencl.OpenCLRenderer()
    assert renderer.render(loaded) == renderer.render(lowered) and loaded.params == lowered.params
    assert all(param.dtype is em.float32 for param in loaded.params)  # dtypes are the module's own objects
    build_kernel_ir(item.kernel, "cached", DeviceInfo(compute_units=4, preferred_vector_width=8,
                                                      vector_ops=VECTOR_OPS))  # other capabilities: another entry
    assert calls == ["lowered"] and len(list((tmp_path / "ir").iterdir())) == 2  # type: ignore[operator]
    entry.write_bytes(entry.read_bytes()[:-7])  # truncated: lowered again, the entry rewritten
    again = build_kernel_ir(item.kernel, "cached", OPENCL_VECTORS)
    assert calls == ["lowered", "lowered"] and renderer.render(again) == renderer.render(lowered)
    assert lowered_cache.load(entry) is not None


def test_short_rows_are_tiled_whole(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A padded copy's rows of 10 (a whole number of vectors does not fit) are computed a whole row per work item:
    its index arithmetic once per row, its 8 interior outputs one vector; the values stay torch's on every device."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    source = rendered_c((_dummy(4, 3, 8, 8) * 2).pad((1, 1, 1, 1)).contiguous())
    assert "gid < 120;" in source, source  # 4 x 3 x 10 rows of 10
    assert "*(ember_float32x8_u*)(data0+" in source, source  # the interior of each row: one vector store
    x = np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, np.inf, -0.0]
    output = (em.tensor(x, device=device) * 2).pad((1, 1, 2, 1)).numpy()
    np.testing.assert_array_equal(output, torch.nn.functional.pad(torch.tensor(x) * 2, (1, 1, 2, 1)).numpy())


def test_a_rows_values_left_over_by_whole_vectors_are_stored_in_narrower_ones(device: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A row whose computed values a whole number of vectors does not hold (a padded copy's 56 interior values of a
    row of 58 under 16 lanes: 3 vectors and 8 left; 28 of 30 under 8 lanes: 3 and 4 left; a stride-2 phase's 28 of
    29) stores the values left over in narrower vectors (halves, quarters: 4 lanes at least), each packed as a
    device of that width packs a vector, not one by one (resnet_stage's padded, phase-split copy 2.9 -> 0.6 ms a
    step). Values are torch's on every device, NaN and infs at the rows' ends included, and an in-place add on rows
    of 28 (the kernel writes the buffer it reads) adds once."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    wide = DeviceInfo(compute_units=2, preferred_vector_width=16, vector_ops=VECTOR_OPS)
    source = rendered_c((_dummy(2, 3, 56, 56) * 2).pad((1, 1, 1, 1)).contiguous(), wide)
    assert "*(ember_float32x16_u*)(data0+" in source and "*(ember_float32x8_u*)(data0+" in source, source
    source = rendered_c((_dummy(2, 3, 28, 28) * 2).pad((1, 1, 1, 1)).contiguous())
    assert "*(ember_float32x8_u*)(data0+" in source and "*(ember_float32x4_u*)(data0+" in source, source
    phases = rendered_c(em.nn.functional.pad(_dummy(8, 58), (0, 0))[:, 1::2] + 1, wide)  # rows of 29
    assert "*(ember_float32x16_u*)(data0+" in phases and "*(ember_float32x8_u*)(data0+" in phases, phases
    x = np.random.default_rng(2).standard_normal((2, 3, 56, 56)).astype(np.float32)
    x[0, 0, 0, 52:56] = [np.nan, np.inf, -np.inf, -0.0]
    x[1, 2, 55, 48:52] = [np.inf, np.nan, 1e30, -1e-30]
    output = (em.tensor(x, device=device) * 2).pad((1, 1, 1, 1)).numpy()
    np.testing.assert_array_equal(output, torch.nn.functional.pad(torch.tensor(x) * 2, (1, 1, 1, 1)).numpy())
    rows = em.tensor(x[:, :, :29, :], device=device)
    np.testing.assert_array_equal((em.nn.functional.pad(rows, (1, 1)) * 3)[..., 1::2].numpy(),
                                  (np.pad(x[:, :, :29, :], ((0, 0), (0, 0), (0, 0), (1, 1))) * 3)[..., 1::2])
    twenty_eight = em.tensor(x[..., :28], device=device)
    twenty_eight.add_(1)
    np.testing.assert_array_equal(twenty_eight.numpy(), x[..., :28] + 1)
    if device.startswith("c"):  # (float64: 8 lanes a vector on AVX-512, 4 on AVX2; rows of 28 leave 4 or none)
        wide_values = x[..., :28].astype(np.float64) * 1e-3
        output = (em.tensor(wide_values, device=device) * 2).pad((1, 1)).numpy()
        np.testing.assert_array_equal(output, np.pad(wide_values * 2, ((0, 0), (0, 0), (0, 0), (1, 1))))


def test_row_reduces_of_many_rows_keep_their_vectors_along_the_row(device: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A reduce over rows of a large tensor (4096 x 1000: work items of 4 rows) splits each row's reduce into vector
    lanes, and the 4 results of a work item are stored as one narrower vector: that store reads the rows' reduces
    as lanes of their vectors, and does not pack them again across the rows, whose loads were then gathered and the
    plan refused (x.exp().amax(1) ran scalar, 17 ms against torch's 1.6; vectorize.py). The sources hold the row's
    vectors; values are torch's on every device, a NaN and infinities in some rows."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    wide = DeviceInfo(compute_units=2, preferred_vector_width=16, vector_ops=VECTOR_OPS)
    for reduce in (lambda value: value.amax(1), lambda value: value.sum(1)):
        source = rendered_c(reduce(_dummy(4096, 1000).exp()), wide)
        assert "ember_exp2_float32x16(" in source and "*(const ember_float32x16_u*)(data1+" in source, source
        assert "*(ember_float32x4_u*)(data0+" in source, source  # (a work item's 4 rows stored at once)
    x = np.random.default_rng(3).standard_normal((4096, 1000)).astype(np.float32)
    x[7, 500], x[100, 999], x[2049, 0] = np.nan, np.inf, -np.inf
    mine, theirs = em.tensor(x, device=device), torch.from_numpy(x)
    assert_close(mine.exp().amax(1), theirs.exp().amax(1))
    assert_close(mine.exp().sum(1), theirs.exp().sum(1), rtol=1e-5)
    assert_close((mine * 2).amin(1), (theirs * 2).amin(1))


def test_long_rows_of_elementwise_kernels_are_tiled_whole(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU an elementwise kernel's rows longer than a tile's accumulators (32) are still one work item each: a
    padded copy's rows of 34 (a 32x32 convolution input padded by 1) store their 32 interior outputs as vectors, a
    transposed copy's rows of 64 (scalar: gathered lanes) do their index arithmetic once per row (each output its
    own work item, a division and remainder per axis, ran ~20x slower). A device with warps keeps one output per
    item. Values as torch's, NaN and inf included."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    source = rendered_c((_dummy(2, 3, 32, 32) * 2).pad((1, 1, 1, 1)).contiguous())
    assert "gid < 204;" in source, source  # 2 x 3 x 34 rows of 34
    assert "*(ember_float32x8_u*)(data0+" in source, source
    assert "gid < 40;" in rendered_c(_dummy(64, 40).T.contiguous())  # 40 rows of 64
    gpu = DeviceInfo(compute_units=2, preferred_vector_width=8, vector_ops=VECTOR_OPS, warp_width=32)
    assert "gid < 204;" not in rendered_c((_dummy(2, 3, 32, 32) * 2).pad((1, 1, 1, 1)).contiguous(), gpu)
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 33)).astype(np.float32)
    x[1, 2, 5, :3] = [np.nan, np.inf, -0.0]
    output = (em.tensor(x, device=device) * 2).pad((1, 2, 1, 1)).numpy()
    np.testing.assert_array_equal(output, torch.nn.functional.pad(torch.tensor(x) * 2, (1, 2, 1, 1)).numpy())
    np.testing.assert_array_equal(em.tensor(x[0, 0], device=device).T.contiguous().numpy(), x[0, 0].T)


def test_gathered_loads_vectorize_under_enough_arithmetic(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An elementwise kernel gathering loaded values (a transposed operand, columns 8 apart) into vectors that feed
    more vector arithmetic than the lanes it gathers is vectorized; a copy or a single add of the same gather is
    not (its scalar loop is as fast). Values as torch's, NaN and inf included."""
    monkeypatch.setenv("EMBER_NOOPT", "0")

    def heavy(x: Any, y: Any) -> Any:
        return ((((x * 3 - 1) * 2 + 5).relu() * 0.5 + 1).relu() * 2 - 1).relu() + y.T

    vector_store = "*(ember_float32x8_u*)(data0+"
    assert vector_store in rendered_c(heavy(_dummy(8, 64), _dummy(64, 8)).contiguous())
    assert vector_store not in rendered_c((_dummy(8, 64) + _dummy(64, 8).T).contiguous())
    assert vector_store not in rendered_c(_dummy(64, 8).T.contiguous())
    generator = np.random.default_rng(5)
    x, y = generator.standard_normal((8, 64)).astype(np.float32), generator.standard_normal((64, 8)).astype(np.float32)
    y[3, 2], y[5, 1], x[0, 0] = np.nan, np.inf, -np.inf
    output = heavy(em.tensor(x, device=device), em.tensor(y, device=device)).numpy()
    np.testing.assert_allclose(output, heavy(torch.tensor(x), torch.tensor(y)).numpy(), rtol=1e-6)


def test_gathering_tiles_are_judged_by_their_first_row(device: str, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: object) -> None:
    """A matmul whose B is transposed (attention's q @ k.T, a linear layer's weight) has its vector tile along the
    output's columns gather B's columns unless each work item stages its panel of B first: the unstaged tile is
    found out from its first row lowered alone, or the first vector of that row, and only the plan chosen is lowered
    whole; code and values as before."""
    from ember.ir import opt

    monkeypatch.setenv("EMBER_NOOPT", "0")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))  # (nothing lowered before: no kernel from the disk)
    lowered: list[str] = []  # what each plan tried had lowered: its first vector, its first row, or its whole tile
    first_outputs, whole = opt.TileLowering.first_outputs, opt.TileLowering.whole

    def first(tile: Any, count: int) -> Any:
        lowered.append("row" if count == tile.row_length else "vector")
        return first_outputs(tile, count)

    monkeypatch.setattr(opt.TileLowering, "first_outputs", first)
    monkeypatch.setattr(opt.TileLowering, "whole", lambda tile: lowered.append("whole") or whole(tile))
    linear = rendered_c(_dummy(64, 32) @ _dummy(48, 32).T)
    assert linear.count("ember_float32x8 acc") == 12 and "float local1[" in linear  # the staged column tile
    # the staged tile's first vector and first row (no gather: the panel is staged), then the rest of it (chosen);
    # the unstaged tile's first vector, which gathers: its row is not lowered on, the tile never whole (nor the
    # reduce split, after a tile that fits)
    assert lowered == ["vector", "row", "whole", "vector"]
    lowered.clear()
    assert "ember_float32x8 acc" in rendered_c(_dummy(23, 32) @ _dummy(32, 64))  # B's rows contiguous: no gather
    assert lowered == ["vector", "row", "whole"]
    for seed, (rows, columns, inner) in enumerate([(64, 48, 32), (23, 37, 40), (70, 48, 33)]):
        a, ta = pair(random_array((rows, inner), seed=seed), device)
        w, tw = pair(random_array((columns, inner), seed=seed + 10), device)
        assert_close(a @ w.T, ta @ tw.T, atol=1e-4)
    x = np.ones((64, 32), dtype=np.float32)
    x[3, 5], x[10, 0] = np.nan, np.inf
    a, ta = pair(x, device)
    w, tw = pair(random_array((48, 32), seed=3), device)
    assert_close(a @ w.T, ta @ tw.T, atol=1e-4)


def test_a_tile_is_lowered_once_for_every_vector_width_tried(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row of 87 selected by an int64 comparison (a cross-entropy gradient's one-hot row) packs its vectors, of 16
    lanes or of the 8 the device also offers, only from lanes each computed from one load (the row's target): the
    row's tile, the same plan at both widths and by both rules (one run of memory, then a few nearby runs:
    vectorize.nearby_loads), is lowered once (its scalar lowering kept), and the second rule takes it at 16 lanes
    (on 2 AVX-512 cores 30,000 rows took 1.8 ms, a loop over each row 2.5). Values are torch's."""
    from ember.ir import opt
    from ember.scheduler.compile_cache import kernel_name

    monkeypatch.setenv("EMBER_NOOPT", "0")
    info = DeviceInfo(compute_units=2, preferred_vector_width=16, vector_ops=VECTOR_OPS,
                      fallback_vector_widths=((8, VECTOR_OPS),))

    def one_hot_rows(x: Any, targets: Any, library: Any) -> Any:
        classes = library.arange(87, device=x.device)
        return (classes == targets[:, None]).float() * x.exp()

    x, targets = _dummy(300, 87), _dummy(300, dtype=em.int64)
    [kernel] = [item.kernel for item in kernelize([one_hot_rows(x, targets, em).node]) if isinstance(item, Launch)]
    assert len(opt._vector_widths_for(kernel, info)) == 2
    tiles: list[tuple] = []
    construct = opt.TileLowering.__init__

    def recorded(tile: Any, *arguments: Any) -> None:
        tiles.append(arguments[2:])
        construct(tile, *arguments)

    monkeypatch.setattr(opt.TileLowering, "__init__", recorded)
    plan, _ = opt.choose_plan(kernel, kernel_name(kernel), info)
    assert plan.upcast == (1, 87) and plan.vector_width == 16
    assert tiles == [((1, 87), None, 1, None)]  # the row's tile once
    monkeypatch.undo()
    values = random_array((300, 87), seed=8)
    labels = np.random.default_rng(8).integers(0, 87, size=300)
    x, tx = pair(values, device)
    targets, ttargets = pair(labels, device)
    assert_close(one_hot_rows(x, targets, em), one_hot_rows(tx, ttargets, torch), rtol=1e-6)


def test_a_strided_convolutions_phases_are_split_and_interleaved_in_vectors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3x3 stride-2 convolution copies its padded input split into the 2 phases of its columns, [N, C, 2, 18, 9]:
    its rows of 9 are tiled with both phases (opt.short_axis_plans), so each lane's padding is a constant and the
    vectors read one run (the row alone gathered: the resnet program's 286 -> 51 us). Its input gradient interleaves
    the phases' gradients, each read at a quarter of the positions between the zeros of the others: its vectors are
    built from a few nearby runs of memory each, which the second rule takes (vectorize.nearby_loads; scalar before,
    2.6x slower at the resnet program's 64x16x16x16, 10x under a batch norm's backward at 8x64x56x56). Values (a NaN
    and an inf among them) are torch's."""
    from ember.ir import lowered_cache, opt
    from ember.scheduler import compile_cache

    monkeypatch.setenv("EMBER_NOOPT", "0")
    plans: list[tuple[tuple[int, ...], Any]] = []
    choose = opt.choose_plan

    def recorded(kernel: Any, *arguments: Any) -> Any:
        plan, lowered = choose(kernel, *arguments)
        if not kernel.has_reduce:
            plans.append((kernel.output.shape, plan))
        return plan, lowered

    monkeypatch.setattr(opt, "choose_plan", recorded)
    monkeypatch.setattr(lowered_cache, "load", lambda *arguments: None)
    monkeypatch.setattr(compile_cache, "COMPILED", type(compile_cache.COMPILED)())
    data = random_array((4, 16, 16, 16), seed=4)
    data[1, 2, 3, 4], data[2, 5, 7, 8] = np.nan, np.inf
    x, tx = pair(data, "c", requires_grad=True)
    w, tw = pair(random_array((32, 16, 3, 3), seed=5), "c", requires_grad=True)
    gradient = random_array((4, 32, 8, 8), seed=6)
    x.conv2d(w, stride=2, padding=1).backward(em.tensor(gradient, device="c"))
    torch.nn.functional.conv2d(tx, tw, stride=2, padding=1).backward(torch.tensor(gradient))
    [interleaving] = [plan for shape, plan in plans if shape == (4, 16, 16, 16)]
    assert interleaving.vector_width > 1 and interleaving.upcast is not None
    [split] = [plan for shape, plan in plans if shape == (4, 16, 2, 18, 9)]
    assert split.vector_width > 1 and split.upcast == (1, 1, 2, 1, 9), split
    assert_close(x.grad, tx.grad, atol=1e-4)
    assert_close(w.grad, tw.grad, atol=1e-3)


def test_a_tile_lowered_after_its_first_row_is_the_tile_lowered_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """TileLowering's two parts (first row, then the rest) build the IR a whole tile's lowering builds: a matmul's
    tiles (clamped rows, a loop over tiles), a transposed one's, reduce lanes, a padded elementwise row."""
    from ember.ir.lower import TileLowering, lower_kernel

    monkeypatch.setenv("EMBER_NOOPT", "0")
    cases = [(_dummy(23, 32) @ _dummy(32, 64), (6, 16), (1, 0), 1, None),
             (_dummy(100, 37) @ _dummy(37, 48), (6, 16), (1, 0), 1, (0, 3)),
             (_dummy(64, 32) @ _dummy(48, 32).T, (6, 16), (1, 0), 1, None),
             (_dummy(64, 32) @ _dummy(48, 32).T, (4, 3), None, 8, None),
             ((_dummy(4, 3, 8, 8) * 2).pad((1, 1, 1, 1)).contiguous(), (1, 1, 1, 10), None, 1, None)]
    for tensor, upcast, order, reduce_lanes, loop in cases:
        (item,) = [item for item in kernelize([tensor.node]) if isinstance(item, Launch)]
        at_once = lower_kernel(item.kernel, "tile", upcast, order, reduce_lanes, loop)
        tile = TileLowering(item.kernel, "tile", upcast, order, reduce_lanes, loop)
        row = tile.first_row()
        assert len(row.sink.srcs[0].srcs[0].srcs if loop else row.sink.srcs) == upcast[-1]  # one row of stores
        in_two = tile.whole()
        assert in_two.key() == at_once.key() and in_two.params == at_once.params
        assert len(in_two.lane_groups) == len(at_once.lane_groups)


def test_scan_renders_where_reduces_have_fewer_lanes_than_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """PoCL on an AVX2 CPU (an AMD EPYC) adds, multiplies and stores 16 float32 lanes but reduces only 8: a long
    cumsum's block kernel then stores vectors of 16 scalar reduces, some lanes of which do not depend on the store
    loop's counter. Each reduce group is emitted inside the loop whose counter any member needs (ir/linearize.py),
    and every value it renders is defined where it is used: the kernel failed to render (a KeyError), and once it
    rendered, the compiler rejected a value used out of its loop's scope."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    fewer_lanes = frozenset(op for op in opencl.VECTOR_OPS if opencl_probe.op_name(op) in (
        "ADD", "SUB", "MUL", "DIV", "NEG", "RECIPROCAL", "LOAD"))
    info = DeviceInfo(compute_units=2, preferred_vector_width=16, vector_ops=fewer_lanes,
                      fallback_vector_widths=((8, opencl.VECTOR_OPS),))
    renderer = opencl.OpenCLRenderer()
    items = [item for item in kernelize([em.ones(70_000, device="dummy:0").cumsum(0).node]) if isinstance(item, Launch)]
    for number, item in enumerate(items):
        source = renderer.render(build_kernel_ir(item.kernel, f"kernel{number}", info))
        scopes: list[set[str]] = [set()]  # the values named vN declared in each open block
        for line in source.splitlines():  # every value used is declared on an earlier line, in a block still open
            words = line.replace("(", " ").replace(")", " ").replace(";", " ").replace(",", " ").split()
            for word in words[3:] if len(words) > 2 and words[2] == "=" else words:
                if word.startswith("v") and word[1:].isdigit():
                    assert any(word in scope for scope in scopes), f"{word} used out of scope in:\n{source}"
            if len(words) > 2 and words[2] == "=" and words[1].startswith("v"):
                scopes[-1].add(words[1])
            scopes.extend(set() for _ in range(line.count("{")))
            del scopes[len(scopes) - line.count("}"):]


def test_a_row_too_long_to_tile_is_a_loop_over_the_row(device: str) -> None:
    """An elementwise kernel whose whole-row tile is too long to render (87 columns, two exps each: a softmax
    gradient over 87 classes) walks each row in a loop instead of computing one element per work item; on c that loop
    is compiled with loop if-conversion (its selects vectorize), which kernels without guarded loads get back. Values
    are torch's, NaN and infinities included."""
    from ember.backends.c import IF_CONVERTED
    from ember.ir.opt import choose_plan
    from ember.scheduler.compile_cache import kernel_name
    from ember.scheduler.devices import get_device

    values = np.random.default_rng(4).normal(size=(300, 87)).astype(np.float32)
    values[5, 7], values[9, 80], values[11, 0] = np.nan, np.inf, -np.inf
    x, reference = em.tensor(values, device=device), torch.from_numpy(values)

    def chain(t: Any, library: Any) -> Any:
        return library.where(t > 0, (t * 0.5).exp(), (t * 0.25).exp().sigmoid() - t)

    result = chain(x, em)
    assert_close(result.numpy(), chain(reference, torch).numpy(), rtol=1e-5, atol=1e-6)
    info = get_device(device).info
    [kernel] = [item.kernel for item in kernelize([chain(x, em).node]) if isinstance(item, Launch)]
    plan, lowered = choose_plan(kernel, kernel_name(kernel), info)
    if info.warp_width == 1 and not info.vector_ops:  # (a device with vectors may pack the row instead)
        assert plan.loop == (1, 87) and plan.upcast is None
    if device.startswith("c:"):
        assert plan.loop == (1, 87) and IF_CONVERTED in CRenderer().render(lowered)
        # a sum over a concatenation reads its sources under masks (test_fuzz_findings' miscompiled kernel): it keeps
        # gcc's loop if-conversion off
        zeros = em.tensor(np.zeros((2, 3), dtype=np.float32), device=device)
        ones = em.tensor(np.ones((3, 3), dtype=np.float32), device=device)
        total = zeros.cat([ones, zeros], 0).sum()
        [concatenation] = [item.kernel for item in kernelize([total.node]) if isinstance(item, Launch)]
        _, guarded = choose_plan(concatenation, kernel_name(concatenation), info)
        assert IF_CONVERTED not in CRenderer().render(guarded) and total.item() == 9.0


def test_a_long_scalar_row_is_a_loop_not_a_tile(device: str) -> None:
    """A join of three parts along a row of 192, one part transposed (nanoGPT's q, k and v gradients joined for the
    input projection: the transposed part gathers, so no vector plan fits) is not tiled whole, each of its 192
    lanes a copy of the join's steps (gcc took 0.28 s over that tile, 0.04 s over a loop), but walks each row in a
    loop (ir/opt.py MAX_SCALAR_TILE_STEPS). Values exactly torch's, NaN, infinities and -0.0 included."""
    from ember.ir.opt import MAX_SCALAR_TILE_STEPS, choose_plan
    from ember.scheduler.compile_cache import kernel_name
    from ember.scheduler.devices import get_device

    generator = np.random.default_rng(5)
    parts = [generator.standard_normal((8, 64, 64)).astype(np.float32) for _ in range(3)]
    parts[0][1, 2, 3], parts[1][4, 5, 6], parts[2][7, 8, 9], parts[2][0, 0, 1] = np.nan, np.inf, -np.inf, -0.0

    def join(tensors: list[Any], library: Any) -> Any:
        return library.cat([tensors[0], tensors[1], tensors[2].transpose(1, 2)], 2)

    tensors = [em.tensor(part, device=device) for part in parts]
    expected = join([torch.from_numpy(part) for part in parts], torch).numpy()
    result = join(tensors, em)
    np.testing.assert_array_equal(result.numpy(), expected)
    assert np.signbit(result.numpy()[0, 1, 128]) and np.signbit(expected[0, 1, 128])
    [kernel] = [item.kernel for item in kernelize([join(tensors, em).node]) if isinstance(item, Launch)]
    assert len(kernel.steps) * 192 > MAX_SCALAR_TILE_STEPS
    info = get_device(device).info
    plan, _ = choose_plan(kernel, kernel_name(kernel), info)
    if info.warp_width == 1:
        assert plan.upcast is None and plan.loop == (2, 192), plan


def test_an_argmax_of_computed_values_finds_its_maximum(device: str) -> None:
    """An argmax of values computed with logs (a Gumbel sample's) takes the maximum in one loop and recomputes the
    values in another to find where it is: on c that kernel keeps gcc's loop if-conversion off, which vectorized one
    loop (libmvec's log2f) and not the other (libm's) so that no value equalled the maximum (the index was the
    row's length)."""
    from ember.backends.c import IF_CONVERTED, compares_with_a_reduce
    from ember.ir.opt import choose_plan
    from ember.scheduler.compile_cache import kernel_name
    from ember.scheduler.devices import get_device

    generator = np.random.default_rng(5)
    for trial in range(6):
        logits = generator.normal(size=3000).astype(np.float32)
        logits[generator.integers(0, 3000, size=2500)] = -np.inf  # (most masked, as top-k leaves them)
        uniform = generator.uniform(1e-6, 1.0, size=3000).astype(np.float32)
        values = em.tensor(logits, device=device) - (-em.tensor(uniform, device=device).log()).log()
        index = int(values.argmax().item())
        computed = values.numpy()
        assert 0 <= index < 3000 and computed[index] == computed.max(), trial
    if device.startswith("c:"):
        kernels = [item.kernel for item in kernelize([values.argmax().node]) if isinstance(item, Launch)]
        rendered = [CRenderer().render(choose_plan(kernel, kernel_name(kernel), get_device(device).info)[1])
                    for kernel in kernels]
        lowered = [choose_plan(kernel, kernel_name(kernel), get_device(device).info)[1] for kernel in kernels]
        assert any(compares_with_a_reduce(kernel) for kernel in lowered)
        assert all(IF_CONVERTED not in source for source, kernel in zip(rendered, lowered)
                   if compares_with_a_reduce(kernel))
