"""Packed-panel matmuls (ir/packed_matmul.py, backends/c_matmul.py): which kernels are packed, by DeviceInfo only, and
the c backend's results against torch at odd, batched, transposed and large shapes, and for the dtypes and fused
kernels that keep the other lowerings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import ember as em
from ember.backends.base import DeviceInfo
from ember.backends.c import CRenderer
from ember.backends.opencl import OpenCLRenderer
from ember.core.errors import CompileError
from ember.ir import lowered_cache
from ember.ir.kernel import Kernel
from ember.ir.opt import PACKED_PLAN, Plan, choose_plan, lower_plan
from ember.ir.packed_matmul import PackedMatmul, default_tile, lower_packed_matmul, micro_tile, packed_matmul
from ember.ir.search_space import Action, actions, apply, plan_from_data, plan_to_data
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch
from tests.packed_devices import AVX2, AVX512, dummy, normal, optimizations_on  # noqa: F401 (an autouse fixture)


def _kernels(tensor: em.Tensor) -> list[Kernel]:
    return [item.kernel for item in kernelize([tensor.node]) if isinstance(item, Launch)]



def _packed(tensor: em.Tensor, info: DeviceInfo = AVX2) -> list[PackedMatmul | None]:
    return [packed_matmul(kernel, info) for kernel in _kernels(tensor)]


def test_a_plain_matmul_is_packed_with_its_strides() -> None:
    a, b = dummy(100, 70), dummy(70, 90)
    (packed,) = _packed(a @ b)
    assert packed is not None
    assert (packed.rows, packed.columns, packed.depth) == (100, 90, 70)
    assert (packed.a_row_stride, packed.a_depth_stride, packed.b_depth_stride, packed.b_column_stride) == (70, 1, 90, 1)
    assert packed.output_row_stride == 90 and packed.batches == ()
    (transposed,) = _packed(dummy(70, 100).T @ dummy(90, 70).T)  # views: the strides of the transposes
    assert transposed is not None and transposed.a_row_stride == 1 and transposed.b_column_stride == 70


def test_axes_that_walk_every_operand_alike_are_one_axis_of_the_panels() -> None:
    """A batch of rows from one matrix (a linear layer over (batch, tokens, features)) is one matmul of all the
    rows, and a 1x1 convolution's rows and columns of pixels one axis of columns, not a matmul per batch or per
    row of pixels; a true batch (each element its own B) and a transposed output stay as they are."""
    (rows,) = _packed(dummy(8, 64, 128) @ dummy(128, 256))
    assert rows is not None and (rows.rows, rows.columns, rows.depth, rows.batches) == (512, 256, 128, ())
    (pixels,) = _packed(em.nn.functional.conv2d(dummy(8, 64, 56, 56), dummy(32, 64, 1, 1)))
    assert pixels is not None and (pixels.rows, pixels.columns, pixels.depth) == (32, 3136, 64)
    assert pixels.batches == ((8, 0, 64 * 3136, 32 * 3136),)
    (batched,) = _packed(dummy(8, 64, 128) @ dummy(8, 128, 256))
    assert batched is not None and (batched.rows, batched.batches) == (64, ((8, 64 * 128, 128 * 256, 64 * 256),))
    (transposed,) = _packed((dummy(6, 40, 128) @ dummy(128, 50)).transpose(-1, -2).contiguous())
    assert transposed is not None and (transposed.rows, transposed.columns) == (50, 40)


def test_tiles_come_from_the_vector_width_and_registers() -> None:
    assert micro_tile(AVX2) == (6, 2)
    assert micro_tile(AVX512) == (8, 2)
    (packed,) = _packed(dummy(64, 64) @ dummy(64, 64), AVX512)
    assert packed is not None and (packed.lanes, packed.micro_columns) == (16, 32)
    assert micro_tile(replace(AVX2, preferred_vector_width=1)) is None
    # the wide tile where 32 registers hold it and the output is large enough, with its longer blocks over k
    (wide,) = _packed(dummy(96, 700) @ dummy(700, 256), AVX512)
    assert wide is not None and (wide.micro_rows, wide.micro_vectors, wide.depth_block) == (6, 4, 512)
    assert default_tile(AVX512, 95, 256) == default_tile(AVX512, 96, 255) == (8, 2)
    assert default_tile(AVX2, 4096, 4096) == (6, 2)  # (16 registers: no room for 24 accumulators)
    # not where its edge tiles pad more: 784 columns are 13 tiles of 64 (6% padding), 25 of 32 (2%)
    assert default_tile(AVX512, 512, 784) == default_tile(AVX512, 256, 784) == (8, 2)
    assert default_tile(AVX512, 1000, 1000) == default_tile(AVX512, 1024, 1024) == (6, 4)


def test_only_devices_whose_renderer_packs_get_packed_kernels() -> None:
    product = dummy(64, 64) @ dummy(64, 64)
    assert _packed(product, replace(AVX2, packed_matmul=False)) == [None]
    assert _packed(product, replace(AVX2, vector_ops=frozenset())) == [None]


@pytest.mark.parametrize("build", [
    lambda: (dummy(64, 64) @ dummy(64, 64)).relu(),  # a fused epilogue
    lambda: (dummy(64, 64) * 2) @ dummy(64, 64),  # a fused prologue
    lambda: dummy(64, 64, dtype=em.float16) @ dummy(64, 64, dtype=em.float16),
    lambda: dummy(64, 64, dtype=em.float64) @ dummy(64, 64, dtype=em.float64),
    lambda: dummy(8, 8) @ dummy(8, 8),  # too small to gain
    lambda: dummy(62, 64).pad((0, 0, 1, 1)) @ dummy(64, 64),  # a masked load
], ids=["epilogue", "prologue", "float16", "float64", "small", "padded"])
def test_kernels_other_than_plain_float32_matmuls_keep_the_other_lowerings(build: Callable[[], em.Tensor]) -> None:
    assert all(packed is None for packed in _packed(build()))


def test_other_renderers_refuse_a_packed_kernel_with_a_message() -> None:
    (kernel,) = _kernels(dummy(64, 64) @ dummy(64, 64))
    lowered = lower_packed_matmul(kernel, "k", AVX2)
    assert lowered is not None and "_micro(" in CRenderer().render(lowered)
    with pytest.raises(CompileError, match="packed"):
        OpenCLRenderer().render(lowered)


def test_the_lowered_kernel_cache_keeps_the_packed_form() -> None:
    (kernel,) = _kernels(dummy(3, 40, 33) @ dummy(3, 33, 50))
    plan, lowered = choose_plan(kernel, "k", AVX2)
    assert lowered.packed is not None and lowered.packed.batches == ((3, 40 * 33, 33 * 50, 40 * 50),)
    path = lowered_cache.entry_path(kernel, "k", AVX2, True, variant="test of the packed form")
    lowered_cache.store(path, lowered)
    loaded = lowered_cache.load(path, kernel, "k")
    assert loaded is not None and loaded.packed == lowered.packed and loaded.key() == lowered.key()


def _check(a: np.ndarray, b: np.ndarray, operation: Callable, dtype: em.DType = em.float32) -> None:
    expected = operation(torch.from_numpy(a), torch.from_numpy(b))
    got = operation(em.tensor(a, device="c").to(dtype), em.tensor(b, device="c").to(dtype)).to(em.float32).numpy()
    depth = a.shape[-1]
    tolerance = 1e-4 if dtype == em.float32 else 2e-2
    np.testing.assert_allclose(got, expected.to(torch.float32).numpy(), rtol=tolerance, atol=tolerance * depth**0.5)



@pytest.mark.parametrize("a_shape, b_shape", [
    ((16, 16), (16, 16)), ((17, 9), (9, 33)), ((127, 255), (255, 63)), ((1000, 1000), (1000, 1000)),
    ((2049, 130), (130, 1025)), ((300, 600), (600, 70)), ((3, 40, 33), (3, 33, 50)), ((4, 70, 50), (50, 90)),
    ((2, 3, 20, 30), (3, 30, 40)), ((6, 50, 70), (70, 90)), ((3, 4, 17, 40), (40, 35)),
    # both operands read in place (rows and columns up to c_matmul.DIRECT_SIDE), edge panels of both, three blocks
    # of the reduced dim accumulated; then only A in place, only B
    ((100, 600), (600, 50)), ((261, 77), (77, 255)), ((255, 40), (40, 300)),
    # A shared by the batch elements along a dim where its stride is 0 (packed once a call, a variant per element
    # of the other dim): the outer dim, then the inner
    ((4, 1, 70, 50), (4, 3, 50, 300)), ((1, 3, 70, 50), (4, 3, 50, 300)),
])
def test_matmul_against_torch(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    _check(normal(*a_shape), normal(*b_shape, seed=1), lambda a, b: a @ b)


@pytest.mark.parametrize("operation", [
    lambda a, b: a.T @ b, lambda a, b: a @ b.T, lambda a, b: a.T @ b.T, lambda a, b: (a @ b).T.contiguous(),
    lambda a, b: a[3:, 5:] @ b[5:, :-7], lambda a, b: a[::2] @ b, lambda a, b: a.flip(0) @ b.flip(1),
    lambda a, b: a.flip(1) @ b.flip(0).T,
], ids=["a.T", "b.T", "both", "output.T", "slices", "every other row", "flipped rows and columns", "flipped depth"])
def test_views_against_torch(operation: Callable) -> None:
    _check(normal(130, 130), normal(130, 130, seed=1), operation)


@pytest.mark.parametrize("dtype", [em.float16, em.bfloat16, em.float64], ids=str)
def test_other_dtypes_against_torch(dtype: em.DType) -> None:
    torch_dtype = {em.float16: torch.float16, em.bfloat16: torch.bfloat16, em.float64: torch.float64}[dtype]
    a, b = normal(70, 90), normal(90, 50, seed=1)
    expected = (torch.from_numpy(a).to(torch_dtype).float() @ torch.from_numpy(b).to(torch_dtype).float())
    got = (em.tensor(a, device="c").to(dtype) @ em.tensor(b, device="c").to(dtype)).to(em.float32).numpy()
    np.testing.assert_allclose(got, expected.numpy(), rtol=2e-2, atol=2e-2 * 90**0.5)


def test_a_fused_epilogue_against_torch() -> None:
    a, b, bias = normal(100, 80), normal(80, 60, seed=1), normal(60, seed=2)
    expected = torch.relu(torch.from_numpy(a) @ torch.from_numpy(b) + torch.from_numpy(bias)).numpy()
    got = (em.tensor(a, device="c") @ em.tensor(b, device="c") + em.tensor(bias, device="c")).relu().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * 80**0.5)


def test_matmul_gradients_against_torch() -> None:
    a, b = normal(50, 70), normal(70, 40, seed=1)
    x, y = em.tensor(a, device="c", requires_grad=True), em.tensor(b, device="c", requires_grad=True)
    (x @ y).sum().backward()
    tx, ty = torch.from_numpy(a).requires_grad_(), torch.from_numpy(b).requires_grad_()
    (tx @ ty).sum().backward()
    assert x.grad is not None and y.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_new_matmul_shapes_compile_nothing(cold: None, compiler_runs: list[list[str]], tmp_path: Path) -> None:
    """A packed matmul is a call of its tile's library function with its sizes and strides: the library is built
    once (into the disk cache: a compiler run), and matmuls of new shapes, batches and views then run with no
    compiler run at all (gpt_manual's first step compiled 14 of them, ~0.7 s of gcc), with torch's values."""
    runs = compiler_runs
    _check(normal(37, 45), normal(45, 29, seed=1), lambda a, b: a @ b)
    assert len(runs) == 1 and any(path.suffix == ".entry" for path in (tmp_path / "c").rglob("*"))
    _check(normal(53, 61), normal(61, 47, seed=1), lambda a, b: a @ b)
    _check(normal(3, 2, 21, 35), normal(2, 35, 19, seed=1), lambda a, b: a @ b)
    _check(normal(40, 90), normal(66, 90, seed=1), lambda a, b: a[5:, ::2] @ b[:, 1::2].T)
    assert len(runs) == 1


@pytest.mark.parametrize("info", [AVX2, AVX512], ids=["AVX2", "AVX-512"])
@pytest.mark.parametrize("transposed", [False, True], ids=["B", "B transposed"])
def test_a_rendered_packed_kernel_builds_alone(info: DeviceInfo, transposed: bool) -> None:
    """The renderer's source of a packed kernel (the library function and a call of it with the kernel's sizes)
    builds alone and computes the matmul (what the kernel search, debugging, and another process's build read),
    for both vector widths' tiles: B as it is, and B transposed (its panels copied through transposes in vector
    registers; a reduced dim of 37, no multiple of the lanes, and 300 columns, edge panels of both)."""
    import ctypes

    from ember.backends.c import build_library, plain_compiler_command

    a_data = normal(3, 20, 37)
    b_data = normal(3, 300, 37, seed=1) if transposed else normal(3, 37, 300, seed=1)
    right = dummy(3, 300, 37).transpose(1, 2) if transposed else dummy(3, 37, 300)
    (kernel,) = _kernels(dummy(3, 20, 37) @ right)
    name = f"packed_alone_{info.preferred_vector_width}_{int(transposed)}"
    lowered = lower_packed_matmul(kernel, name, info)
    assert lowered is not None and lowered.packed is not None
    assert (lowered.packed.b_column_stride != 1) == transposed
    source = CRenderer().render(lowered)
    library, _ = build_library(source, "test of a rendered packed kernel", plain_compiler_command(), [name])
    output = np.zeros((3, 20, 300), np.float32)
    buffers = {0: output, lowered.packed.a: np.ascontiguousarray(a_data), lowered.packed.b: np.ascontiguousarray(b_data)}
    getattr(library, name)(*[ctypes.c_void_p(buffers[position].ctypes.data) for position in range(3)])
    expected = a_data @ (b_data.transpose(0, 2, 1) if transposed else b_data)
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-4 * 37**0.5)


def test_the_search_compares_the_packed_form_with_the_tiled_plans() -> None:
    (kernel,) = _kernels(dummy(64, 48) @ dummy(48, 80))
    space = actions(kernel, AVX2)
    assert Action("pack") in space
    neighbours = [apply(PACKED_PLAN, action, kernel) for action in space]
    assert Plan() in neighbours
    # from the packed plan: tiled plans, or the packed one with other blocks or another micro-kernel
    assert all(plan is None or not plan.packed or plan.packed_blocks or plan.packed_tile for plan in neighbours)
    assert apply(Plan(), Action("pack"), kernel) == PACKED_PLAN
    assert plan_from_data(plan_to_data(PACKED_PLAN), kernel) == PACKED_PLAN
    lowered = lower_plan(kernel, "k", AVX2, PACKED_PLAN)
    assert lowered is not None and lowered.packed is not None
    (epilogue,) = _kernels((dummy(64, 48) @ dummy(48, 80)).relu())
    assert lower_plan(epilogue, "k", AVX2, PACKED_PLAN) is None  # not a plain matmul: the plan does not lower


def test_a_packed_matmuls_blocks_and_tiles_are_in_the_search_space() -> None:
    """The cache blocks under the matmul's sides and the micro-kernels that fit the registers (16 with AVX2: no
    8 x 2 tile, whose 16 accumulators leave none for B) are actions from the packed plan only; a plan keeps them
    through the disk cache's data, and lowers to a packed matmul with them (blocks rounded to whole tiles)."""
    (kernel,) = _kernels(dummy(300, 700) @ dummy(700, 600))
    space = actions(kernel, AVX2)
    blocks = {(action.axis, action.amount) for action in space if action.kind == "pack_block"}
    assert blocks == {(0, 128), (0, 384), (0, 512), (1, 48), (1, 96), (2, 512)}
    tiles = {(action.axis, action.amount) for action in space if action.kind == "pack_tile"}
    assert tiles == {(4, 1), (4, 2), (6, 1), (8, 1), (12, 1)}
    assert apply(Plan(), Action("pack_tile", 4, 1), kernel) is None  # (a tiled plan has no micro-kernel)
    plan = apply(apply(PACKED_PLAN, Action("pack_block", 1, 48), kernel), Action("pack_tile", 4, 1), kernel)
    assert plan == Plan(packed=True, packed_blocks=(0, 48, 0), packed_tile=(4, 1))  # (0: the default)
    lowered = lower_plan(kernel, "k", AVX2, plan)
    assert lowered is not None and lowered.packed is not None
    packed = lowered.packed
    assert (packed.micro_rows, packed.micro_vectors, packed.depth_block, packed.row_block, packed.column_block) == (
        4, 1, 256, 48, 4080)
    assert lower_plan(kernel, "k", AVX2, replace(plan, packed_tile=(8, 2))) is None  # does not fit 16 registers
    assert plan_from_data(plan_to_data(plan), kernel) == plan
    older = {key: value for key, value in plan_to_data(PACKED_PLAN).items() if not key.startswith("packed_")}
    assert plan_from_data(older, kernel) == PACKED_PLAN  # an entry stored before plans had blocks and tiles
    for wrong in ({"packed_blocks": [256, -1, 4080]}, {"packed_tile": [4]}, {"packed": False, "packed_tile": [4, 1]},
                  {"packed_tile": [0, 2]}):
        with pytest.raises(ValueError, match="whole numbers of [01] or more of a packed plan"):
            plan_from_data({**plan_to_data(plan), **wrong}, kernel)


def _run_plan(a_data: np.ndarray, b_data: np.ndarray, plan: Plan, name: str) -> np.ndarray:
    """a_data @ b_data computed on c by the packed kernel `plan` lowers to (the c device's DeviceInfo)."""
    from ember.scheduler.devices import get_device

    device = get_device("c")
    (kernel,) = _kernels(em.tensor(a_data, device="c") @ em.tensor(b_data, device="c"))
    lowered = lower_plan(kernel, name, device.info, plan)
    assert lowered is not None and lowered.packed is not None
    pool = device.pool
    handles = [pool.allocate(param.size * 4) for param in lowered.params]
    try:
        for param, handle in zip(lowered.params, handles):
            if not param.is_output:
                pool.copy_in(handle, np.ascontiguousarray(a_data if param.position == lowered.packed.a
                                                          else b_data).data.cast("B"))
        device.compile(lowered)(handles, lowered.global_size).wait()
        output = np.empty((a_data.shape[0], b_data.shape[1]), np.float32)
        pool.copy_out(output.data.cast("B"), handles[0])
    finally:
        for param, handle in zip(lowered.params, handles):
            pool.release(handle, param.size * 4)
    return output


def _c_tiles(a_shape: tuple[int, int], b_shape: tuple[int, int]) -> list[tuple[int, int]]:
    """The micro-kernel tiles the c device's registers fit, for a matmul of these shapes."""
    from ember.scheduler.devices import get_device

    info = get_device("c").info
    (kernel,) = _kernels(em.tensor(np.zeros(a_shape, np.float32), device="c")
                         @ em.tensor(np.zeros(b_shape, np.float32), device="c"))
    return [(action.axis, action.amount) for action in actions(kernel, info) if action.kind == "pack_tile"]


def test_searched_blocks_and_tiles_compute_the_matmul_on_c() -> None:
    """Each micro-kernel the c device's registers fit, with small blocks (several blocks over k, rows and columns,
    and edge tiles in each), computes the matmul as numpy does."""
    a_data, b_data = normal(301, 700), normal(700, 613, seed=1)
    tiles = _c_tiles((301, 700), (700, 613))
    assert len(tiles) >= 4
    for tile in tiles:
        output = _run_plan(a_data, b_data, Plan(packed=True, packed_blocks=(128, 48, 512), packed_tile=tile),
                           f"packed_tile_{tile[0]}x{tile[1]}")
        np.testing.assert_allclose(output, a_data @ b_data, rtol=1e-4, atol=1e-4 * 700**0.5, err_msg=str(tile))


def test_edge_tiles_of_operands_read_in_place_on_c() -> None:
    """Operands read in place (A of at most c_matmul.DIRECT_SIDE columns, B of as many rows) whose last panel
    crosses the edge: the micro-kernel reads it from a panel's size before the edge and stores only its own rows
    and columns (the vector across the edge with a masked store), adding to what the earlier blocks of k stored
    (three blocks here: a row or column stored twice would be added twice); a side smaller than one panel (19
    columns of a 32- or 64-wide panel) is packed with zeros as before. Every tile the c device fits, against numpy."""
    from ember.scheduler.devices import get_device

    lanes = get_device("c").info.preferred_vector_width
    for rows, vectors in _c_tiles((40, 300), (300, 40)):
        for height in (17, 5 * rows - 1, 5 * rows + rows // 2):  # (from ir/packed_matmul.MINIMUM_SIDE rows)
            for width in (19, lanes * vectors + 1, 2 * lanes * vectors + lanes + 5):
                a_data, b_data = normal(height, 300), normal(300, width, seed=1)
                output = _run_plan(a_data, b_data, Plan(packed=True, packed_blocks=(128, 0, 0),
                                                        packed_tile=(rows, vectors)),
                                   f"packed_edge_{rows}x{vectors}_{height}_{width}")
                np.testing.assert_allclose(output, a_data @ b_data, rtol=1e-4, atol=1e-4 * 300**0.5,
                                           err_msg=f"tile {rows}x{vectors}, {height} x 300 @ 300 x {width}")
