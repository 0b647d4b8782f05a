"""Workgroup row reductions (ir/group_reduce.py): which kernels become workgroup kernels, by DeviceInfo only; every
shape rendered by WGSL, OpenCL C and PTX (assembled by ptxas for sm_75 and sm_90) for an H100-like device; and the
results against torch where workgroups run here: wgpu (lavapipe) and the PTX simulator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.backends.base import DeviceInfo
from ember.backends.c import CRenderer
from ember.backends.opencl import OpenCLRenderer
from ember.backends.ptx import PTXRenderer, assemble, ptxas_path
from ember.backends.registry import REGISTRY
from ember.backends.wgsl import WGSLRenderer
from ember.core.errors import BackendUnavailable, CompileError
from ember.ir.group_reduce import MINIMUM_ROW, choose_local_size, group_reduce_count
from ember.ir.ir import KernelIR
from ember.ir.opt import build_kernel_ir
from tests.workgroups import H100_LIKE, kernels_of, workgroup_devices

pytestmark = pytest.mark.usefixtures("optimizations_on")  # (workgroup kernels are an optimization)

ROW_LENGTHS = (1, 7, 255, 256, 1000, 4097, 100_000)


def _norm(name: str) -> Callable[[Any], Any]:
    """layer_norm or rms_norm over the last axis, from ember's or torch's functional module by the tensor's kind."""
    def apply(x: Any) -> Any:
        functional = torch.nn.functional if isinstance(x, torch.Tensor) else em.nn.functional
        return getattr(functional, name)(x, (x.shape[-1],))

    return apply


def _row_ops() -> dict[str, Callable[[Any], Any]]:
    """The row reductions, each a function of an ember or a torch tensor."""
    return {
        "sum": lambda x: x.sum(-1),
        "mean": lambda x: x.mean(-1),
        "amax": lambda x: x.amax(-1),
        "amin": lambda x: x.amin(-1),
        "logsumexp": lambda x: x.logsumexp(-1),
        "softmax": lambda x: x.softmax(-1),
        "log_softmax": lambda x: x.log_softmax(-1),
        "layer_norm": _norm("layer_norm"),
        "rms_norm": _norm("rms_norm"),
    }


def _dummy(*shape: int, dtype: em.DType = em.float32) -> em.Tensor:
    if dtype == em.bfloat16:  # (numpy has no bfloat16)
        return em.tensor(np.zeros(shape, dtype=np.float32), device="dummy:0").to(dtype)
    return em.tensor(np.zeros(shape, dtype=dtype.numpy), device="dummy:0")


# ---- which kernels, decided from DeviceInfo ------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(_row_ops()))
def test_long_rows_become_workgroup_kernels_on_a_device_with_local_memory(name: str) -> None:
    kernels = kernels_of(_row_ops()[name](_dummy(6, 1000)))
    irs = [build_kernel_ir(kernel, f"k{number}", H100_LIKE) for number, kernel in enumerate(kernels)]
    assert all(ir.local_size == 256 for ir in irs), [ir.local_size for ir in irs]
    # the row kernels fused by rows stay one kernel, each reduce of the row a group reduce
    assert len(irs) == 1 and group_reduce_count(irs[0]) >= 1
    assert irs[0].global_size == 6 * 256


def test_softmax_is_one_kernel_with_two_group_reduces() -> None:
    (kernel,) = kernels_of(_dummy(6, 1000).softmax(-1))
    ir = build_kernel_ir(kernel, "softmax", H100_LIKE)
    assert group_reduce_count(ir) == 2


@pytest.mark.parametrize("info", [DeviceInfo(), DeviceInfo(compute_units=8, preferred_vector_width=8),
                                  DeviceInfo(max_local_size=1024, local_memory_bytes=0, warp_width=32),
                                  DeviceInfo(max_local_size=16, local_memory_bytes=48 * 1024, warp_width=32),
                                  DeviceInfo(max_local_size=1024, local_memory_bytes=48 * 1024),
                                  DeviceInfo(compute_units=1, max_local_size=4, local_memory_bytes=48 * 1024,
                                             warp_width=32)],
                         ids=["default", "c-like", "no-local-memory", "tiny-groups", "no-warps", "rows-fill-it"])
def test_devices_without_local_memory_or_groups_keep_one_item_per_row(info: DeviceInfo) -> None:
    for name, op in _row_ops().items():
        for kernel in kernels_of(op(_dummy(6, 1000))):
            assert choose_local_size(kernel, info) is None, name
            assert build_kernel_ir(kernel, "k", info).local_size is None, name


@pytest.mark.parametrize("backend", ["c", "wgpu"])
def test_the_c_device_and_lavapipe_never_get_workgroup_kernels(backend: str) -> None:
    try:
        device = REGISTRY.probe(backend)[0]
    except BackendUnavailable as error:
        pytest.skip(str(error))
    if backend == "wgpu" and "llvmpipe" not in str(device.info.extra.get("adapter")):
        pytest.skip("a GPU adapter: it gets them")
    for kernel in kernels_of(_dummy(6, 4096).softmax(-1)):
        assert choose_local_size(kernel, device.info) is None


def test_rows_that_fill_the_device_keep_one_work_item_each() -> None:
    (kernel,) = kernels_of(_dummy(132 * 1024, 256).softmax(-1))
    assert choose_local_size(kernel, H100_LIKE) is None
    (kernel,) = kernels_of(_dummy(132 * 1024 - 1, 256).softmax(-1))
    assert choose_local_size(kernel, H100_LIKE) == 256


def test_rows_around_a_value_broadcast_along_them_are_group_reduces() -> None:
    """A variance's row, (x - mean)^2 with the mean computed before (normalization saves it), broadcasts the mean
    along the reduce only: a group reduce, as any row. Refused as a matmul's shape, each of its 1024 rows was one
    serial float32 loop over 784 elements on an H100 (instance norm's output 4x torch's float32 error); a matmul
    whose 16 columns are too few for local-memory tiles still keeps its register tiles."""
    x, mean = _dummy(1024, 784), _dummy(1024, 1)
    (kernel,) = kernels_of(((x - mean) * (x - mean)).sum(-1))
    assert choose_local_size(kernel, H100_LIKE) == 256
    stacked = em.stack([x, x * x]).sum(-1)  # a sum and a sum of squares: x read for two outputs, not a matmul's
    assert [choose_local_size(kernel, H100_LIKE) for kernel in kernels_of(stacked)] == [256]
    (kernel,) = kernels_of(_dummy(64, 784) @ _dummy(784, 16))
    assert choose_local_size(kernel, H100_LIKE) is None


@pytest.mark.parametrize("case", ["short rows", "matmul", "column sum", "int8 max", "bool any", "staged long rows"])
def test_other_reduces_keep_their_lowering(case: str) -> None:
    tensor = {
        "short rows": lambda: _dummy(6, 255).softmax(-1),
        "matmul": lambda: _dummy(64, 512) @ _dummy(512, 64),
        "column sum": lambda: _dummy(1000, 6).sum(0),
        "int8 max": lambda: _dummy(6, 1000, dtype=em.int8).amax(-1),
        "bool any": lambda: _dummy(6, 1000, dtype=em.bool).any(-1),
        "staged long rows": lambda: _dummy(6, 100_000).sum(-1),
    }[case]()
    for kernel in kernels_of(tensor):
        assert choose_local_size(kernel, H100_LIKE) is None


def test_local_memory_bounds_the_local_size() -> None:
    (kernel,) = kernels_of(_dummy(6, 1000).softmax(-1))
    # two reduces of 64 items, 8 bytes each
    small = DeviceInfo(max_local_size=1024, local_memory_bytes=2 * 64 * 8, warp_width=32)
    assert choose_local_size(kernel, small) == 64
    smaller = DeviceInfo(max_local_size=1024, local_memory_bytes=2 * 16 * 8, warp_width=32)
    assert choose_local_size(kernel, smaller) is None


# ---- rendering: every shape for an H100-like device -------------------------------------------------------------

SHAPE_CASES: dict[str, Callable[[], em.Tensor]] = {
    **{f"{name}-{dtype.name}": (lambda op=op, dtype=dtype: op(_dummy(3, 1000, dtype=dtype)))
       for name, op in _row_ops().items() for dtype in (em.float32, em.float16, em.bfloat16, em.float64)},
    "sum-int32": lambda: _dummy(3, 1000, dtype=em.int32).sum(-1, dtype=em.int32),
    "sum-int64": lambda: _dummy(3, 1000, dtype=em.int64).sum(-1),
    "amax-int32": lambda: _dummy(3, 1000, dtype=em.int32).amax(-1),
    "prod-float32": lambda: _dummy(3, 1000).prod(-1),
    "sum-rows-of-a-3d-tensor": lambda: _dummy(2, 3, 4097).sum(-1),
}


def _shape_irs(case: str) -> list[KernelIR]:
    irs = [build_kernel_ir(kernel, f"k{number}", H100_LIKE)
           for number, kernel in enumerate(kernels_of(SHAPE_CASES[case]()))]
    assert any(ir.local_size is not None for ir in irs), case
    return irs


@pytest.mark.parametrize("case", list(SHAPE_CASES))
def test_every_shape_renders_for_an_h100_like_device(case: str) -> None:
    for ir in _shape_irs(case):
        if ir.local_size is None:
            continue
        wgsl = WGSLRenderer(int64=True, float64=True).render(ir)
        assert f"@workgroup_size({ir.local_size})" in wgsl and "workgroupBarrier();" in wgsl
        opencl = OpenCLRenderer().render(ir)
        assert "barrier(CLK_LOCAL_MEM_FENCE);" in opencl and "__local " in opencl
        assert f"reqd_work_group_size({ir.local_size}, 1, 1)" in opencl
        ptx = PTXRenderer().render(ir)
        assert "bar.sync 0;" in ptx and ".shared " in ptx and "shfl.sync.bfly.b32" in ptx  # (warps of 32)
        with pytest.raises(CompileError, match="reduces across a workgroup"):
            CRenderer().render(ir)  # C keeps its loops: it is never handed one


@pytest.mark.skipif(ptxas_path() is None, reason="ptxas is not on PATH")
@pytest.mark.parametrize("case", [case for case in SHAPE_CASES if not case.endswith(("float16", "float64"))
                                  or case.startswith(("softmax", "sum-int"))])
def test_every_ptx_shape_assembles_for_sm_75_and_sm_90(case: str) -> None:
    for ir in _shape_irs(case):
        for target in ("sm_75", "sm_90"):
            assemble(PTXRenderer(target).render(ir), target)


def test_wgsl_of_every_shape_passes_naga() -> None:
    try:
        device = REGISTRY.probe("wgpu")[0]
    except BackendUnavailable as error:
        pytest.skip(str(error))
    for case in SHAPE_CASES:
        for ir in _shape_irs(case):
            if ir.local_size is not None:
                device.device.create_shader_module(code=WGSLRenderer(int64=True, float64=True).render(ir))  # type: ignore[attr-defined]


# ---- results against torch where workgroups run -------------------------------------------------------------------

def _compare(got: np.ndarray, expected: torch.Tensor, tolerance: float) -> None:
    want = expected.double().detach().numpy()
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tolerance, atol=tolerance, equal_nan=True)


@pytest.mark.parametrize("length", ROW_LENGTHS)
@pytest.mark.parametrize("name", list(_row_ops()))
def test_row_reductions_match_torch(group_device: str, name: str, length: int) -> None:
    if group_device.startswith("ptxsim") and length > 4097:
        pytest.skip("the simulator is slow on long rows; wgpu covers them")
    rows = 3 if length > 4097 else 5
    data = np.random.default_rng(length).standard_normal((rows, length)).astype(np.float32)
    got = _row_ops()[name](em.tensor(data, device=group_device)).numpy()
    expected = _row_ops()[name](torch.tensor(data))
    _compare(got, expected, 2e-5 if length < 10_000 else 1e-4)


# (sum, softmax and layer norm tolerances) per dtype: halves are computed in float32 and rounded once, as torch does
DTYPE_TOLERANCES = {em.float16: (5e-3, 2e-3, 8e-3), em.bfloat16: (3e-2, 1e-2, 4e-2), em.float64: (1e-12,) * 3,
                    em.int32: (0.0,) * 3, em.int64: (0.0,) * 3}


@pytest.mark.parametrize("dtype", list(DTYPE_TOLERANCES), ids=lambda dtype: dtype.name)
def test_row_reductions_of_each_dtype_match_torch(group_device: str, dtype: em.DType) -> None:
    if dtype not in REGISTRY.device(group_device).info.supported_dtypes:
        pytest.skip(f"{group_device} has no {dtype.name}")
    rng = np.random.default_rng(3)
    if dtype.is_float:
        data = rng.standard_normal((4, 1000)).astype(np.float64 if dtype == em.float64 else np.float32)
    else:
        data = rng.integers(-1000, 1000, (4, 1000)).astype(dtype.numpy)
    source = torch.tensor(data)
    tensor = em.tensor(data, device=group_device)
    if dtype in (em.float16, em.bfloat16):
        source = source.half() if dtype == em.float16 else source.bfloat16()
        tensor = tensor.to(dtype)
    sums, softmaxes, norms = DTYPE_TOLERANCES[dtype]
    _compare(tensor.sum(-1).double().numpy(), source.sum(-1), sums)
    _compare(tensor.amax(-1).double().numpy(), source.amax(-1), 0.0)
    if dtype.is_float:
        _compare(tensor.softmax(-1).double().numpy(), source.softmax(-1), softmaxes)
        _compare(_norm("layer_norm")(tensor).double().numpy(), _norm("layer_norm")(source), norms)


@pytest.mark.parametrize("length", [255, 1000, 4097])
def test_nan_and_infinities_propagate_as_in_torch(group_device: str, length: int) -> None:
    data = np.random.default_rng(1).standard_normal((6, length)).astype(np.float32)
    data[0, length // 3] = np.nan  # a NaN in the middle
    data[1, -1] = np.nan  # a NaN in the last, partial step
    data[2, 5] = np.inf
    data[3, -2] = -np.inf
    data[4, :] = -np.inf  # a row of -inf: softmax is NaN, max is -inf
    data[5, 7], data[5, -1] = np.inf, -np.inf  # inf - inf
    for name, op in _row_ops().items():
        got = op(em.tensor(data, device=group_device)).numpy()
        expected = op(torch.tensor(data))
        np.testing.assert_array_equal(np.isnan(got), expected.isnan().numpy(), err_msg=name)
        _compare(got, expected, 2e-5)


def test_softmax_and_layer_norm_gradients_match_torch(group_device: str) -> None:
    data = np.random.default_rng(2).standard_normal((4, 1000)).astype(np.float32)
    weights = np.random.default_rng(5).standard_normal((4, 1000)).astype(np.float32)
    for name in ("softmax", "log_softmax", "layer_norm", "rms_norm"):
        source = torch.tensor(data, requires_grad=True)
        (_row_ops()[name](source) * torch.tensor(weights)).sum().backward()
        tensor = em.tensor(data, device=group_device, requires_grad=True)
        (_row_ops()[name](tensor) * em.tensor(weights, device=group_device)).sum().backward()
        _compare(tensor.grad.numpy(), source.grad, 1e-4)


def test_a_full_sum_of_ten_million_elements_matches_numpy() -> None:
    wgpu = [name for name in workgroup_devices() if name.startswith("wgpugroups")]
    if not wgpu:
        pytest.skip("no wgpu device here")
    data = np.random.default_rng(4).random(10_000_003, dtype=np.float32)
    tensor = em.tensor(data, device=wgpu[0])
    assert abs(float(tensor.sum().numpy()) - data.astype(np.float64).sum()) < 1e-6 * data.size
    assert float(tensor.amax().numpy()) == data.max()
    assert float(tensor.mean().numpy()) == pytest.approx(data.astype(np.float64).mean(), rel=1e-6)


def test_a_long_full_reduce_is_two_workgroup_kernels() -> None:
    """Partials per group, then one group (issue 28's two-step full reduction), where workgroups run here."""
    wgpu = [name for name in workgroup_devices() if name.startswith("wgpugroups")]
    if not wgpu:
        pytest.skip("no wgpu device here")
    data = np.random.default_rng(5).standard_normal(6_000_011).astype(np.float32)
    data[123_456] = np.inf
    tensor = em.tensor(data, device=wgpu[0])
    with em.profile() as profile:
        total = float(tensor.sum().numpy())
    assert total == np.inf
    local_size = 256
    assert [record.global_size % local_size for record in profile.kernels] == [0, 0], profile.kernels
    assert len(profile.kernels) == 2 and profile.kernels[-1].global_size == local_size
    data[123_456] = 0.5
    integers = np.random.default_rng(6).integers(-2**40, 2**40, 3_000_001)
    columns = np.random.default_rng(7).random((300_001, 3), dtype=np.float32)
    assert abs(float(em.tensor(data, device=wgpu[0]).sum().numpy()) - data.astype(np.float64).sum()) < 1e-3
    assert int(em.tensor(integers, device=wgpu[0]).sum().numpy()) == int(integers.sum())
    np.testing.assert_allclose(em.tensor(columns, device=wgpu[0]).sum(0).numpy(),
                               columns.astype(np.float64).sum(0), rtol=1e-6)
    assert np.isnan(float(em.tensor(np.full(70_000, np.nan, np.float32), device=wgpu[0]).amax().numpy()))


@pytest.mark.parametrize("elements, count", [(20_000, 2), (10_000_003, 2), (100_000_000, 2), (2**31 + 11, 3)])
def test_full_reduce_stages_for_an_h100_like_device(elements: int, count: int) -> None:
    """Rows of 256 elements or more (a group each, at most 64 per work item), enough to fill the device, then one
    row of the partials (a third stage past 256 x 64 partials); the stages cover the reduce exactly once."""
    from ember.ir.group_reduce import group_stage_extents

    stages = group_stage_extents(elements, 1, em.float32, H100_LIKE)
    assert stages is not None and len(stages) == count, stages
    assert all(MINIMUM_ROW <= chunk <= 256 * 64 for chunk in stages[:-1])
    assert stages[-1] <= 256 * 64
    remaining = elements
    for chunk in stages:
        remaining = -(-remaining // chunk)
    assert remaining == 1
    assert -(-elements // stages[0]) >= min(4 * H100_LIKE.compute_units, elements // MINIMUM_ROW)


def test_full_reduce_stages_only_where_groups_reduce() -> None:
    from ember.ir.group_reduce import group_stage_extents

    assert group_stage_extents(10**7, 1, em.float32, replace(H100_LIKE, warp_width=1)) is None
    assert group_stage_extents(10**7, 1, em.float32, replace(H100_LIKE, local_memory_bytes=0)) is None
    assert group_stage_extents(10**7, 1, em.float16, H100_LIKE) is not None  # computed in float32
    assert group_stage_extents(10**7, 1, em.bool, H100_LIKE) is None
    assert group_stage_extents(10**7, 1, em.float32, REGISTRY.device("c").info) is None
    # many outputs: rows enough for one work item each, so the usual stages
    assert group_stage_extents(10**5, 10**5, em.float32, H100_LIKE) is None


def test_the_devices_running_these_tests_get_workgroup_kernels(group_device: str) -> None:
    """(So that the comparisons above run workgroup kernels: their DeviceInfo asks for them.)"""
    info = REGISTRY.device(group_device).info
    for name, op in _row_ops().items():
        for kernel in kernels_of(op(_dummy(5, 1000))):
            assert choose_local_size(kernel, info) is not None, name


@pytest.mark.parametrize("dtype", [em.float32, em.float64, em.int64], ids=lambda dtype: dtype.name)
def test_ptx_without_warp_shuffles_reduces_by_a_shared_tree(dtype: em.DType) -> None:
    """The PTX of a workgroup kernel made for a device without 32-thread warps: the tree, run by the simulator."""
    from ember.ir.group_reduce import lower_group_kernel
    from tests.ptx_simulator import Machine, Module

    rng = np.random.default_rng(6)
    data = (rng.standard_normal((3, 1000)) * 100).astype(dtype.numpy)
    if dtype.is_float:
        data[1, 999] = np.nan
    for reduce, expected in (("sum", data.sum(1)), ("amax", data.max(1))):
        (kernel,) = kernels_of(getattr(_dummy(3, 1000, dtype=dtype), reduce)(-1))
        ir = lower_group_kernel(kernel, "tree", 128)  # (warp width 1)
        source = PTXRenderer().render(ir)
        assert "shfl" not in source and "bar.sync 0;" in source
        output = np.zeros(3, dtype.numpy)
        Machine(Module(source), [output.view(np.uint8), data.reshape(-1).view(np.uint8)], ir.global_size, block_size=128).run()
        np.testing.assert_allclose(output, expected, rtol=1e-6)


@pytest.mark.skipif(ptxas_path() is None, reason="ptxas is not on PATH")
def test_dummy_ptx_stands_for_an_h100_and_assembles_its_workgroup_kernels() -> None:
    device = REGISTRY.device("dummy:ptx")
    assert device.info.warp_width == 32 and device.info.local_memory_bytes == 48 * 1024
    device.clear()  # type: ignore[attr-defined]
    x = em.tensor(np.zeros((5, 3000), np.float32), device="dummy:ptx")
    for op in _row_ops().values():
        op(x).realize()  # each kernel assembled by ptxas (the device's compile check)
    kernels = device.kernels  # type: ignore[attr-defined]
    assert kernels and all(kernel.local_size == 256 and kernel.warp_width == 32 for kernel in kernels)


def test_rows_of_views_and_fused_elementwise_work_match_torch(group_device: str) -> None:
    """Rows read through a transpose, a pad, a slice and a broadcast, with elementwise work fused before the reduce."""
    data = np.random.default_rng(7).standard_normal((300, 6)).astype(np.float32)
    bias = np.random.default_rng(8).standard_normal(300).astype(np.float32)
    for library, make in ((em, lambda array: em.tensor(array, device=group_device)), (torch, torch.tensor)):
        x, b = make(data), make(bias)
        functional = library.nn.functional
        results = [
            (x.T * 2 + b).softmax(-1),
            functional.pad(x.T, (5, 3), value=-1.0).logsumexp(-1),
            (x.T[:, 10:290].exp() - 1).sum(-1),
            functional.layer_norm(x.T.flip(-1), (300,)),
        ]
        if library is em:
            got = [result.numpy() for result in results]
        else:
            expected = results
    for number, (value, reference) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(value, reference.numpy(), rtol=2e-5, atol=2e-5, err_msg=str(number))


@pytest.mark.parametrize(("length", "loads"), [(1000, 4), (4096, 16), (4097, 3)])
def test_a_row_of_up_to_16_elements_per_item_is_read_once(length: int, loads: int) -> None:
    """softmax reads its row three times (max, sum, output): unrolled, the three passes share each element's load
    (4 of 1000 / 256); longer rows loop, one load per pass."""
    from ember.ir.ir import IROp, topological_nodes

    (kernel,) = kernels_of(_dummy(5, length).softmax(-1))
    ir = build_kernel_ir(kernel, "softmax", H100_LIKE)
    assert sum(1 for node in topological_nodes(ir.sink) if node.op is IROp.LOAD) == loads


# ---- short reduces with few outputs: staged for the device's parallelism (core/staged_reduce.py) -------------------


def test_short_reduces_with_few_outputs_are_staged_only_where_groups_reduce() -> None:
    """On a GPU a reduce of 512 to 16,384 elements per output, with fewer outputs than the device runs work items
    at once, goes to stages (one work item per output took 2 ms for a layer norm's weight gradient on an H100)."""
    from ember.ir.group_reduce import stages_for_parallelism

    assert stages_for_parallelism(4096, 64, em.float32, H100_LIKE)
    assert stages_for_parallelism(16_384, 1, em.float16, H100_LIKE)  # (computed in float32)
    assert not stages_for_parallelism(2 * MINIMUM_ROW - 1, 1, em.float32, H100_LIKE)  # short: one loop is fine
    assert not stages_for_parallelism(4096, 132 * 1024, em.float32, H100_LIKE)  # outputs enough to fill it
    assert not stages_for_parallelism(4096, 64, em.bool, H100_LIKE)
    assert not stages_for_parallelism(4096, 64, em.float32, replace(H100_LIKE, warp_width=1))
    assert not stages_for_parallelism(4096, 64, em.float32, REGISTRY.device("c").info)


def _few_output_cases() -> dict[str, Callable[[Any], Any]]:
    """Reduces of 512 or more elements per output with few outputs, over leading, several or all axes, as a
    function of an ember or a torch tensor of shape (520, 3, 4)."""
    return {
        "column sum": lambda x: x.sum(0),
        "sum over two leading axes": lambda x: x.sum((0, 1)),
        "mean over the first and last": lambda x: x.mean((0, 2)),
        "amax over two leading axes": lambda x: x.amax((0, 1)),
        "full sum": lambda x: x.sum(),
        "sum of squares": lambda x: (x * x).sum(),
        "matrix times a vector": lambda x: x.reshape(520, 12).T @ x.reshape(520, 12)[:, :3],
    }


@pytest.mark.parametrize("name", list(_few_output_cases()))
def test_short_reduces_with_few_outputs_match_torch(group_device: str, name: str) -> None:
    data = np.random.default_rng(11).standard_normal((520, 3, 4)).astype(np.float32)
    data[300, 1, 2] = np.nan  # NaN reaches its outputs only, as in torch
    data[20, 2, 3] = np.inf
    op = _few_output_cases()[name]
    tensor = em.tensor(data, device=group_device)
    got = op(tensor)
    expected = op(torch.tensor(data))
    np.testing.assert_array_equal(np.isnan(got.numpy()), expected.isnan().numpy(), err_msg=name)
    _compare(got.numpy(), expected, 2e-5)
    # the work is a group's per output, or chunks of the inner dim for a product (never one item per output)
    info = REGISTRY.device(group_device).info
    kernels = kernels_of(op(em.tensor(data, device=group_device)))
    assert len(kernels) >= 1
    if name != "matrix times a vector":
        assert any(choose_local_size(kernel, info) is not None for kernel in kernels), name
    else:
        assert len(kernels) >= 2, "the inner dim of 520 is split into chunks"


def test_integer_columns_sum_exactly(group_device: str) -> None:
    data = np.random.default_rng(12).integers(-2**40, 2**40, (700, 3))
    assert (em.tensor(data, device=group_device).sum(0).numpy() == data.sum(0)).all()


def test_weight_gradients_of_few_outputs_match_torch(group_device: str) -> None:
    """A layer norm's weight and bias gradients (sums over the batch and the sequence) and a convolution's filter
    gradient (a contraction over the batch and the positions), staged on a device that reduces by groups."""
    rng = np.random.default_rng(13)
    data, upstream = rng.standard_normal((16, 40, 6)).astype(np.float32), rng.standard_normal((16, 40, 6))
    images, filters = rng.standard_normal((4, 3, 14, 14)).astype(np.float32), rng.standard_normal((5, 3, 3, 3))
    results = {}
    for library, make in ((em, lambda array: em.tensor(array, device=group_device, dtype=em.float32,
                                                           requires_grad=True)),
                          (torch, lambda array: torch.tensor(array, dtype=torch.float32, requires_grad=True))):
        x, weight, bias = make(data), make(np.linspace(0.5, 2, 6)), make(np.linspace(-1, 1, 6))
        normed = library.nn.functional.layer_norm(x, (6,), weight, bias)
        image, kernel = make(images), make(filters)
        convolved = library.nn.functional.conv2d(image, kernel, padding=0)
        ((normed * make(upstream).detach()).sum() + (convolved * convolved).sum()).backward()
        results[library.__name__] = [tensor.grad for tensor in (x, weight, bias, image, kernel)]
    for got, expected in zip(results["ember"], results["torch"]):
        _compare(got.numpy(), expected, 1e-4)


def test_short_reduces_with_few_outputs_at_the_sizes_of_real_gradients() -> None:
    """The largest reduces the parallel stages take (16,384 elements per output: a conv's weight gradient over a
    batch of 64 at 16x16), and 64 outputs of 4,096 (a layer norm's weight gradient over batch and sequence), with a
    NaN and infinities, against numpy in float64; where workgroups run on lavapipe (the simulator is too slow)."""
    wgpu = [name for name in workgroup_devices() if name.startswith("wgpugroups")]
    if not wgpu:
        pytest.skip("no wgpu device here")
    rng = np.random.default_rng(16)
    columns = rng.standard_normal((16_384, 7)).astype(np.float32)
    columns[9_000, 3] = np.nan
    columns[100, 5], columns[16_000, 5] = np.inf, np.inf
    got = em.tensor(columns, device=wgpu[0]).sum(0).numpy()
    np.testing.assert_allclose(got, columns.astype(np.float64).sum(0), rtol=1e-5, equal_nan=True)
    statistics = rng.standard_normal((64, 64, 64)).astype(np.float32)
    tensor = em.tensor(statistics, device=wgpu[0])
    np.testing.assert_allclose(tensor.sum((0, 1)).numpy(), statistics.astype(np.float64).sum((0, 1)), rtol=1e-4,
                               atol=1e-3)
    np.testing.assert_array_equal(tensor.amax((0, 1)).numpy(), statistics.max((0, 1)))
    info = REGISTRY.device(wgpu[0]).info
    assert all(choose_local_size(kernel, info) is not None for kernel in kernels_of(tensor.sum((0, 1))))
