"""Workgroup-tiled matmuls (ir/group_matmul.py): which kernels get tiles in local memory, by DeviceInfo only; every
shape rendered by WGSL, OpenCL C and PTX (assembled by ptxas for sm_75 and sm_90) for an H100-like device; and the
results against torch where workgroups run here: wgpu (lavapipe with a GPU's warp width) and the PTX simulator."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.backends.base import DeviceInfo
from ember.backends.c import CRenderer
from ember.backends.dummy import H100_LIMITS
from ember.backends.opencl import OpenCLRenderer
from ember.backends.ptx import PTXRenderer, assemble, ptxas_path
from ember.backends.registry import REGISTRY
from ember.backends.wgsl import WGSLRenderer
from ember.core.errors import BackendUnavailable, CompileError
from ember.ir import group_matmul
from ember.ir.group_matmul import is_tiled_matmul, matmul_tiles
from ember.ir.ir import IROp, KernelIR, topological_nodes
from ember.ir.opt import build_kernel_ir
from tests.conftest import TEST_DEVICES
from tests.workgroups import H100_LIKE, kernels_of, workgroup_devices

pytestmark = pytest.mark.usefixtures("optimizations_on")  # (workgroup kernels are an optimization)


def _dummy(*shape: int, dtype: em.DType = em.float32) -> em.Tensor:
    tensor = em.tensor(np.zeros(shape, dtype=np.float32), device="dummy:0")
    return tensor if dtype == em.float32 else tensor.to(dtype)


def _tiled(tensor: em.Tensor, info: DeviceInfo) -> list[KernelIR]:
    """The kernels of a tensor lowered for `info` that are workgroup-tiled matmuls."""
    irs = [build_kernel_ir(kernel, f"k{number}", info) for number, kernel in enumerate(kernels_of(tensor))]
    return [ir for ir in irs if is_tiled_matmul(ir)]


def _matmul_cases(library: Any, make: Callable[[np.ndarray], Any], dtype: Any = None) -> dict[str, Any]:
    """The matmul shapes under test, each a function of ember's or torch's module and a maker of its tensors."""
    rng = np.random.default_rng(11)

    def data(*shape: int) -> Any:
        tensor = make(rng.standard_normal(shape).astype(np.float32))
        return tensor if dtype is None else tensor.to(dtype)

    x, w, bias = data(33, 17), data(17, 65), data(65)
    functional = library.nn.functional
    return {
        "33x17x65": x @ w,
        "bias-relu": functional.relu(x @ w + bias),
        "prologue": (x * 2.0 + 1.0).exp() @ w,
        "transposed": data(17, 33).T @ data(65, 17).T,
        "batched": data(3, 20, 40) @ data(3, 40, 24),
        "broadcast-batch": data(2, 3, 20, 19) @ data(19, 30),
    }


# ---- which kernels, decided from DeviceInfo ------------------------------------------------------------------------

@pytest.mark.parametrize("case", list(_matmul_cases(em, lambda array: em.tensor(array, device="dummy:0"))))
def test_matmuls_become_tiled_workgroup_kernels_on_a_gpu_like_device(case: str) -> None:
    tensor = _matmul_cases(em, lambda array: em.tensor(array, device="dummy:0"))[case]
    (ir,) = _tiled(tensor, H100_LIKE)
    shared = [node for node in topological_nodes(ir.sink) if node.op is IROp.DEFINE_SHARED]
    barriers = [node for node in topological_nodes(ir.sink) if node.op is IROp.BARRIER]
    assert len(shared) == 2 and len(barriers) == 2  # A's and B's tiles; a barrier before and after filling them
    assert ir.local_size in (64, 256)  # (16 outputs a work item: 32x32 or 64x64 outputs a group)


def test_each_k_step_fills_the_tiles_between_two_barriers() -> None:
    """The order the renderers emit (ir/linearize.py): in the loop over K, a barrier, the stores into local memory,
    a barrier, then the inner loop reading the tiles; the output stored after the loops (the simulator runs its
    lanes in lockstep, so only lavapipe would notice a barrier out of place)."""
    from ember.ir.linearize import Step, linearize
    from ember.backends.render_steps import shared_array

    (ir,) = _tiled(_dummy(100, 257) @ _dummy(257, 300), H100_LIKE)
    kinds = []
    for kind, node in linearize(ir.sink):
        if kind is Step.STORE:
            kinds.append("tile store" if shared_array(node.srcs[0]) is not None else "output store")
        elif kind is Step.VALUE and node.op is IROp.LOAD and shared_array(node.srcs[0]) is not None:
            kinds.append("tile load")
        elif kind in (Step.LOOP, Step.END_LOOP, Step.BARRIER):
            kinds.append(kind.value)
    collapsed = [kind for number, kind in enumerate(kinds) if number == 0 or kinds[number - 1] != kind]
    assert collapsed == ["loop", "barrier", "tile store", "barrier", "loop", "tile load", "end_loop", "output store"]
    assert kinds.count("loop") == kinds.count("end_loop") == 2 and kinds.count("barrier") == 2


def test_the_tile_is_the_largest_that_still_fills_the_device() -> None:
    (kernel,) = kernels_of(_dummy(512, 512) @ _dummy(512, 512))
    tiles = matmul_tiles(kernel, H100_LIKE)
    assert tiles is not None and tiles.block == 32  # 64 groups of 64x64 would leave most of 132 SMs idle
    assert tiles.register == 2 and tiles.local_size == 256  # 16,384 items of 4x4 outputs: too few for 132 SMs
    (large,) = kernels_of(_dummy(2048, 512) @ _dummy(512, 2048))
    tiles = matmul_tiles(large, H100_LIKE)
    assert tiles is not None and tiles.block == 128 and tiles.register == 8  # 256 groups of 128x128, 8x8 an item
    (middle,) = kernels_of(_dummy(1024, 512) @ _dummy(512, 1024))
    tiles = matmul_tiles(middle, H100_LIKE)
    assert tiles is not None and tiles.block == 64 and tiles.register == 4  # 64 groups of 128x128: too few
    tiles = matmul_tiles(kernel, DeviceInfo(**{**H100_LIMITS, "compute_units": 16}))
    assert tiles is not None and tiles.block == 128 and tiles.local_size == 256
    tiles = matmul_tiles(kernel, DeviceInfo(**{**H100_LIMITS, "compute_units": 32}))
    assert tiles is not None and tiles.block == 64 and tiles.local_size == 256
    small_groups = DeviceInfo(**{**H100_LIMITS, "max_local_size": 128})
    assert matmul_tiles(kernel, small_groups).block == 32  # type: ignore[union-attr]
    assert matmul_tiles(kernel, DeviceInfo(**{**H100_LIMITS, "local_memory_bytes": 4095})) is None


@pytest.mark.parametrize("info", [DeviceInfo(), DeviceInfo(compute_units=8, preferred_vector_width=8),
                                  DeviceInfo(max_local_size=1024, local_memory_bytes=0, warp_width=32),
                                  DeviceInfo(max_local_size=1024, local_memory_bytes=48 * 1024)],
                         ids=["default", "c-like", "no-local-memory", "no-warps"])
def test_devices_without_local_memory_or_warps_keep_register_tiles(info: DeviceInfo) -> None:
    for tensor in _matmul_cases(em, lambda array: em.tensor(array, device="dummy:0")).values():
        assert _tiled(tensor, info) == []


@pytest.mark.parametrize("backend", ["c", "wgpu"])
def test_the_c_device_and_lavapipe_never_get_tiled_matmuls(backend: str) -> None:
    try:
        info = REGISTRY.probe(backend)[0].info
    except BackendUnavailable as error:
        pytest.skip(str(error))
    assert _tiled(_dummy(100, 300) @ _dummy(300, 257), info) == []


@pytest.mark.parametrize("case", ["small", "vector", "short sum", "distance", "max of products", "float64",
                                  "int32"])
def test_other_broadcast_reduces_keep_their_lowering(case: str) -> None:
    tensor = {
        "small": lambda: _dummy(7, 7) @ _dummy(7, 7),
        "vector": lambda: _dummy(300, 257) @ _dummy(257, 1),
        "short sum": lambda: _dummy(64, 4) @ _dummy(4, 64),
        "distance": lambda: (_dummy(64, 1, 32) - _dummy(1, 64, 32)).abs().sum(-1),
        "max of products": lambda: (_dummy(64, 1, 32) * _dummy(1, 64, 32)).amax(-1),
        "float64": lambda: _dummy(64, 64, dtype=em.float64) @ _dummy(64, 64, dtype=em.float64),
        "int32": lambda: _dummy(64, 64, dtype=em.int32) @ _dummy(64, 64, dtype=em.int32),
    }[case]()
    assert _tiled(tensor, H100_LIKE) == []


def test_the_devices_running_these_tests_get_tiled_matmuls(group_device: str) -> None:
    """(So that the comparisons below run the tiled kernels: their DeviceInfo asks for them.)"""
    info = REGISTRY.device(group_device).info
    for case, tensor in _matmul_cases(em, lambda array: em.tensor(array, device="dummy:0")).items():
        assert len(_tiled(tensor, info)) == 1, case


# ---- rendering: every shape for an H100-like device -------------------------------------------------------------

def _shape_irs() -> dict[str, KernelIR]:
    irs = {}
    for dtype in (em.float32, em.float16, em.bfloat16):
        cases = _matmul_cases(em, lambda array: em.tensor(array, device="dummy:0"), dtype)
        for case, tensor in cases.items():
            (irs[f"{case}-{dtype.name}"],) = _tiled(tensor, H100_LIKE)
    x, w, gradient = _dummy(33, 17), _dummy(17, 65), _dummy(33, 65)  # (backward realizes its gradients: the same
    # matmuls, written out)
    (irs["backward-x"],) = _tiled(gradient @ w.T, H100_LIKE)
    (irs["backward-w"],) = _tiled(x.T @ gradient, H100_LIKE)
    return irs


SHAPE_IRS = _shape_irs()


@pytest.mark.parametrize("case", list(SHAPE_IRS))
def test_every_shape_renders_for_an_h100_like_device(case: str) -> None:
    ir = SHAPE_IRS[case]
    wgsl = WGSLRenderer().render(ir)
    assert f"@workgroup_size({ir.local_size})" in wgsl and "workgroupBarrier();" in wgsl
    assert wgsl.count("var<workgroup> ember_tile") == 2
    opencl = OpenCLRenderer().render(ir)
    assert opencl.count("barrier(CLK_LOCAL_MEM_FENCE);") == 2 and opencl.count("__local float ember_tile") == 2
    assert f"reqd_work_group_size({ir.local_size}, 1, 1)" in opencl
    ptx = PTXRenderer().render(ir)
    assert ptx.count("bar.sync 0;") == 2 and ptx.count(".shared .align 16") == 2 and "ld.shared.f32" in ptx
    with pytest.raises(CompileError, match="shares tiles in a workgroup's local memory"):
        CRenderer().render(ir)  # C keeps its loops: it is never handed one


@pytest.mark.skipif(ptxas_path() is None, reason="ptxas is not on PATH")
@pytest.mark.parametrize("case", list(SHAPE_IRS))
def test_every_ptx_shape_assembles_for_sm_75_and_sm_90(case: str) -> None:
    for target in ("sm_75", "sm_90"):
        assemble(PTXRenderer(target).render(SHAPE_IRS[case]), target)


def test_wgsl_of_every_shape_passes_naga() -> None:
    try:
        device = REGISTRY.probe("wgpu")[0]
    except BackendUnavailable as error:
        pytest.skip(str(error))
    for ir in SHAPE_IRS.values():
        device.device.create_shader_module(code=WGSLRenderer().render(ir))  # type: ignore[attr-defined]


# ---- results against torch where workgroups run -------------------------------------------------------------------

def _compare(got: np.ndarray, expected: torch.Tensor, tolerance: float) -> None:
    want = expected.double().detach().numpy()
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tolerance, atol=tolerance, equal_nan=True)


@pytest.mark.parametrize("size", [(1, 1, 1), (7, 7, 7), (33, 17, 65), (64, 64, 64), (100, 257, 300), (130, 8, 16)],
                         ids=lambda size: "x".join(map(str, size)))
def test_matmuls_match_torch(group_device: str, size: tuple[int, int, int]) -> None:
    rows, depth, columns = size
    rng = np.random.default_rng(rows * depth)
    a = rng.standard_normal((rows, depth)).astype(np.float32)
    b = rng.standard_normal((depth, columns)).astype(np.float32)
    got = (em.tensor(a, device=group_device) @ em.tensor(b, device=group_device)).numpy()
    _compare(got, torch.tensor(a) @ torch.tensor(b), 1e-4)


def test_products_past_the_index_limit_are_still_tiled(cold: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """M N K past the index limit (2**31: 4096 x 4096 x 4096) is no reason to refuse local-memory tiles or tensor
    cores: no tile linearizes the [M, N, K] product, only the operands and the output (an H100 ran that matmul
    with one-item register tiles at a quarter of torch's speed, and its float16 one without tensor cores at 1/60).
    An operand past the limit is: its indices would overflow. (The limit is lowered to 2**22 here, so that the
    sizes stay small: 1024^3 stands for 4096^3.)"""
    monkeypatch.setattr(group_matmul, "INT32_LIMIT", 2**22)
    (tiled,) = _tiled(_dummy(1024, 1024) @ _dummy(1024, 1024), H100_LIKE)
    assert tiled.local_size == 256
    (matrix,) = _tiled(_halves(1024, 1024) @ _halves(1024, 1024), MATRIX_H100)
    assert _mma_count(matrix) == 8
    (kernel,) = kernels_of(_dummy(4096, 1100) @ _dummy(1100, 64))  # 4.5M elements in A
    assert matmul_tiles(kernel, H100_LIKE) is None


@pytest.mark.parametrize("device", [name for name in workgroup_devices() if not name.startswith("ptxsim")]
                         or [pytest.param("", marks=pytest.mark.skip(reason="needs wgpu (lavapipe) for group kernels"))])
def test_a_tiled_product_past_two_to_the_31_matches_torch(device: str) -> None:
    """1100 x 1800 @ 1800 x 1100: M N K = 2.18e9, tiled in local memory on a device that runs workgroup kernels."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((1100, 1800)).astype(np.float32)
    b = rng.standard_normal((1800, 1100)).astype(np.float32)
    x, y = em.tensor(a, device=device), em.tensor(b, device=device)
    assert _tiled(x @ y, REGISTRY.device(device).info)
    _compare((x @ y).numpy() / 40, torch.tensor(a) @ torch.tensor(b) / 40, 1e-4)


# float16 and bfloat16 inputs are summed in float32 and rounded once, as torch does on a CPU
DTYPE_TOLERANCES = {em.float32: 1e-4, em.float16: 1e-2, em.bfloat16: 6e-2}


@pytest.mark.parametrize("dtype", list(DTYPE_TOLERANCES), ids=lambda dtype: dtype.name)
def test_every_shape_matches_torch(group_device: str, dtype: em.DType) -> None:
    if dtype not in REGISTRY.device(group_device).info.supported_dtypes:
        pytest.skip(f"{group_device} has no {dtype.name}")
    torch_dtype = {em.float32: torch.float32, em.float16: torch.float16, em.bfloat16: torch.bfloat16}[dtype]
    got = _matmul_cases(em, lambda array: em.tensor(array, device=group_device), dtype)
    expected = _matmul_cases(torch, torch.tensor, torch_dtype)
    for case in got:
        reference = expected[case].float() if dtype != em.float32 else expected[case]
        value = got[case].float().numpy()
        scale = max(1.0, float(reference.abs().max()))
        _compare(value / scale, reference / scale, DTYPE_TOLERANCES[dtype])


def test_matmul_gradients_match_torch(group_device: str) -> None:
    rng = np.random.default_rng(12)
    data = [rng.standard_normal(shape).astype(np.float32) for shape in ((45, 70), (70, 33), (33,), (45, 33))]
    tensors = [em.tensor(array, device=group_device, requires_grad=True) for array in data[:3]]
    sources = [torch.tensor(array, requires_grad=True) for array in data[:3]]
    for (x, w, bias), library, make in ((tensors, em, lambda array: em.tensor(array, device=group_device)),
                                        (sources, torch, torch.tensor)):
        (library.nn.functional.gelu(x @ w + bias) * make(data[3])).sum().backward()
    for tensor, source in zip(tensors, sources):
        _compare(tensor.grad.numpy(), source.grad, 1e-4)


def test_the_smaller_tile_matches_torch(group_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With many compute units the 32x32 tile (64 work items) is chosen; its results too (sizes no other test uses,
    so that no kernel compiled before for the device's own info is reused)."""
    device = REGISTRY.device(group_device)
    monkeypatch.setattr(device, "info", replace(device.info, compute_units=1000))
    rng = np.random.default_rng(14)
    a = rng.standard_normal((2, 70, 45)).astype(np.float32)
    b = rng.standard_normal((45, 90)).astype(np.float32)
    (kernel,) = kernels_of(_dummy(2, 70, 45) @ _dummy(45, 90))
    assert matmul_tiles(kernel, device.info).block == 32  # type: ignore[union-attr]
    got = (em.tensor(a, device=group_device) @ em.tensor(b, device=group_device)).numpy()
    _compare(got, torch.tensor(a) @ torch.tensor(b), 1e-4)


def test_the_largest_tile_matches_torch(group_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With few compute units a product of 128 rows or columns gets 128x128 tiles, 8x8 outputs a work item: its
    results against torch, with rows and columns that are no whole number of tiles (sizes no other test uses)."""
    device = REGISTRY.device(group_device)
    monkeypatch.setattr(device, "info", replace(device.info, compute_units=1))
    rng = np.random.default_rng(15)
    a = rng.standard_normal((131, 37)).astype(np.float32)
    b = rng.standard_normal((37, 150)).astype(np.float32)
    (kernel,) = kernels_of(_dummy(131, 37) @ _dummy(37, 150))
    tiles = matmul_tiles(kernel, device.info)
    assert tiles is not None and tiles.block == 128 and tiles.register == 8
    got = (em.tensor(a, device=group_device) @ em.tensor(b, device=group_device)).numpy()
    _compare(got, torch.tensor(a) @ torch.tensor(b), 1e-4)


def test_nan_and_infinities_propagate_as_in_torch(group_device: str) -> None:
    rng = np.random.default_rng(13)
    a = rng.standard_normal((40, 37)).astype(np.float32)
    b = rng.standard_normal((37, 50)).astype(np.float32)
    a[3, 36] = np.nan  # in the last, partial step of K
    a[39, 0] = np.inf  # in the last, partial tile of rows
    b[5, 49] = -np.inf  # in the last, partial tile of columns
    got = (em.tensor(a, device=group_device) @ em.tensor(b, device=group_device)).numpy()
    expected = torch.tensor(a) @ torch.tensor(b)
    np.testing.assert_array_equal(np.isnan(got), expected.isnan().numpy())
    _compare(got, expected, 1e-4)


# ---- tensor cores: mma.sync for half inputs where DeviceInfo lists matrix units -----------------------------------

MATRIX_H100 = DeviceInfo(**H100_LIMITS, matrix_dtypes=frozenset({em.float16, em.bfloat16}))


def _halves(*shape: int, dtype: em.DType = em.float16, device: str = "dummy:0") -> em.Tensor:
    """A half tensor held as one (a buffer of halves: its loads are the half values the matrix units take)."""
    data = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    return em.tensor(data, device=device).to(dtype).realize()


def _matrix_cases(dtype: em.DType) -> dict[str, em.Tensor]:
    x, w, bias = _halves(100, 257, dtype=dtype), _halves(257, 300, dtype=dtype), _halves(300, dtype=dtype)
    return {"plain": x @ w, "bias-relu": em.nn.functional.relu(x @ w + bias),
            "batched": _halves(3, 20, 40, dtype=dtype) @ _halves(3, 40, 24, dtype=dtype)}


def _mma_count(ir: KernelIR) -> int:
    return sum(1 for node in topological_nodes(ir.sink) if node.op is IROp.MMA)


@pytest.mark.parametrize("dtype", [em.float16, em.bfloat16], ids=lambda dtype: dtype.name)
def test_half_matmuls_use_matrix_units_where_device_info_lists_them(dtype: em.DType) -> None:
    for case, tensor in _matrix_cases(dtype).items():
        (ir,) = _tiled(tensor, MATRIX_H100)
        assert _mma_count(ir) == 8 and ir.local_size == 128, case  # 4 warps, each 2 x 4 mma a K step
        (plain,) = _tiled(tensor, H100_LIKE)  # no matrix units listed: float32 tiles
        assert _mma_count(plain) == 0 and plain.local_size in (64, 256)
    x, w = _halves(64, 64, dtype=dtype), _halves(64, 64, dtype=dtype)
    for other in ((x * 2.0) @ w, _dummy(64, 64) @ _dummy(64, 64)):  # a prologue, float32 inputs: float32 tiles
        (ir,) = _tiled(other, MATRIX_H100)
        assert _mma_count(ir) == 0
    (ir,) = _tiled(x.float() @ w.float(), MATRIX_H100)  # halves converted to float32: the same values, exactly
    assert _mma_count(ir) == 8
    only_float16 = DeviceInfo(**H100_LIMITS, matrix_dtypes=frozenset({em.float16}))
    (ir,) = _tiled(x @ w, only_float16)
    assert _mma_count(ir) == (8 if dtype == em.float16 else 0)


@pytest.mark.parametrize("dtype", [em.float16, em.bfloat16], ids=lambda dtype: dtype.name)
def test_matrix_unit_kernels_render_only_for_ptx_from_sm_80(dtype: em.DType) -> None:
    for case, tensor in _matrix_cases(dtype).items():
        (ir,) = _tiled(tensor, MATRIX_H100)
        kind = "f16" if dtype == em.float16 else "bf16"
        for target in ("sm_80", "sm_90"):
            ptx = PTXRenderer(target).render(ir)
            assert ptx.count(f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32") == 8, case
            assert ptx.count("bar.sync 0;") == 2 and "ld.shared.b32" in ptx
            if ptxas_path() is not None:
                assemble(ptx, target)
        with pytest.raises(CompileError, match="tensor cores"):
            PTXRenderer("sm_75").render(ir)
        for renderer in (WGSLRenderer(), OpenCLRenderer()):
            with pytest.raises(CompileError, match="multiplies on matrix units"):
                renderer.render(ir)
        with pytest.raises(CompileError, match="workgroup's local memory"):
            CRenderer().render(ir)


@pytest.mark.skipif(not any(name.startswith("cuda") for name in TEST_DEVICES), reason="no cuda device here")
@pytest.mark.parametrize("dtype", [em.float16, em.bfloat16], ids=lambda dtype: dtype.name)
def test_matrix_unit_matmuls_match_torch_on_a_gpu(dtype: em.DType, monkeypatch: pytest.MonkeyPatch) -> None:
    """(Runs where a cuda device of sm_80 or newer is a test device: the simulator has no mma.)"""
    device = REGISTRY.device(next(name for name in TEST_DEVICES if name.startswith("cuda")))
    if device.renderer.architecture() < 80:  # type: ignore[attr-defined]
        pytest.skip("tensor cores' mma.m16n8k16 needs sm_80")
    monkeypatch.setattr(device, "info", DeviceInfo(**{**device.info.__dict__, "matrix_dtypes": frozenset({dtype})}))
    torch_dtype = torch.float16 if dtype == em.float16 else torch.bfloat16
    for size in ((100, 257, 300), (64, 64, 64), (33, 17, 65)):
        rows, depth, columns = size
        a, b = _halves(rows, depth, dtype=dtype, device=device.name), _halves(depth, columns, dtype=dtype,
                                                                                 device=device.name)
        got = (a @ b).float().numpy()
        expected = torch.tensor(a.float().numpy()).to(torch_dtype).float() @ torch.tensor(b.float().numpy()).to(
            torch_dtype).float()
        _compare(got / max(1.0, float(expected.abs().max())), expected / max(1.0, float(expected.abs().max())),
                 1e-2 if dtype == em.float16 else 6e-2)


@pytest.mark.skipif(ptxas_path() is None, reason="ptxas is not on PATH")
def test_dummy_ptx_renders_and_assembles_tiled_matmuls() -> None:
    device = REGISTRY.device("dummy:ptx")
    device.clear()  # type: ignore[attr-defined]
    x = em.tensor(np.zeros((100, 257), np.float32), device="dummy:ptx")
    w = em.tensor(np.zeros((257, 300), np.float32), device="dummy:ptx")
    em.nn.functional.relu(x @ w).realize()  # assembled by ptxas (the device's compile check)
    kernels = device.kernels  # type: ignore[attr-defined]
    assert len(kernels) == 1 and is_tiled_matmul(kernels[0])


def test_tiled_kernels_come_back_from_the_lowered_kernel_cache(tmp_path: Any) -> None:
    from ember.ir import lowered_cache

    tensors = {"tiles": _dummy(100, 257) @ _dummy(257, 300), "matrix units": _matrix_cases(em.float16)["bias-relu"]}
    for case, tensor in tensors.items():
        (ir,) = _tiled(tensor, MATRIX_H100)
        path = tmp_path / f"{hashlib.sha256(case.encode()).hexdigest()}.entry"  # (entries are named by a digest)
        lowered_cache.store(path, ir)
        loaded = lowered_cache.load(path)
        assert loaded is not None, case
        assert PTXRenderer("sm_90").render(loaded) == PTXRenderer("sm_90").render(ir), case
