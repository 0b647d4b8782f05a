"""Flash attention (ir/flash_attention.py): on a device with local memory and warps, scaled_dot_product_attention is
one kernel (a group per block of query rows, an online softmax over key blocks); results against torch where
workgroups run here (OpenCL on PoCL and wgpu on lavapipe with a GPU's warp width, the PTX simulator), every shape
rendered by WGSL, OpenCL C and PTX (assembled by ptxas for sm_75 and sm_90) for an H100-like device, and the
composite kept where the fused kernel does not apply."""

from __future__ import annotations

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
from ember.core.errors import CompileError
from ember.ir.flash_attention import MINIMUM_ROWS, attention_parts, attention_tiles
from ember.ir.ir import IROp, KernelIR, topological_nodes
from ember.ir.opt import build_kernel_ir
from tests.workgroups import H100_LIKE, kernels_of

pytestmark = pytest.mark.usefixtures("optimizations_on")  # (workgroup kernels are an optimization)


def _is_flash(ir: KernelIR) -> bool:
    return ir.local_size is not None and sum(node.op is IROp.DEFINE_SHARED for node in topological_nodes(ir.sink)) == 5


class Case:
    """An attention's inputs (numpy), its options, and torch's result."""

    def __init__(self, seed: int, batch: tuple[int, ...], length: int, source_length: int, head: int,
                 value_head: int, mask: str | None = None, causal: bool = False, key_heads: int | None = None) -> None:
        rng = np.random.default_rng(seed)
        key_batch = batch if key_heads is None else (*batch[:-1], key_heads)
        self.query = rng.standard_normal((*batch, length, head)).astype(np.float32)
        self.key = rng.standard_normal((*key_batch, source_length, head)).astype(np.float32)
        self.value = rng.standard_normal((*key_batch, source_length, value_head)).astype(np.float32)
        self.mask: np.ndarray | None = None
        if mask == "bool":  # random keys hidden, row 3 wholly (its output: zeros in both)
            self.mask = rng.random((length, source_length)) > 0.4
            self.mask[3] = False
        elif mask == "float":  # a bias per batch (broadcast over heads), -inf at some keys, row 2 wholly
            self.mask = rng.standard_normal((batch[0], 1, length, source_length)).astype(np.float32)
            self.mask[..., 5] = -np.inf
            self.mask[..., 2, :] = -np.inf
        self.causal, self.gqa = causal, key_heads is not None

    def torch(self) -> np.ndarray:
        mask = None if self.mask is None else torch.tensor(self.mask)
        return torch.nn.functional.scaled_dot_product_attention(
            torch.tensor(self.query), torch.tensor(self.key), torch.tensor(self.value), attn_mask=mask,
            is_causal=self.causal, enable_gqa=self.gqa).numpy()  # (a row whose keys are all masked: zeros)

    def ember(self, device: str, dtype: em.DType = em.float32) -> em.Tensor:
        query, key, value = (em.tensor(array, device=device).to(dtype) for array in (self.query, self.key, self.value))
        mask = None if self.mask is None else em.tensor(self.mask, device=device)
        return em.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=self.causal,
                                                             enable_gqa=self.gqa)


CASES = {
    "plain": Case(1, (2, 3), 32, 32, 16, 16),
    "odd sizes": Case(2, (2, 2), 37, 53, 24, 40),  # no size a multiple of a tile; Ev != E
    "causal": Case(3, (1, 2), 70, 70, 32, 32, causal=True),
    "causal, fewer queries": Case(4, (2,), 20, 45, 8, 8, causal=True),  # torch's upper-left aligned mask
    "causal, more queries": Case(16, (1, 2), 80, 33, 16, 16, causal=True),  # (the last rows see every key)
    "bool mask": Case(5, (1, 1), 40, 70, 16, 16, mask="bool"),
    "float mask": Case(6, (2, 3), 33, 20, 8, 12, mask="float"),
    "grouped query heads": Case(7, (1, 4), 24, 40, 16, 16, causal=True, key_heads=2),
    "no batch": Case(8, (), 48, 17, 64, 64),
    "long keys": Case(9, (1, 1), 16, 1000, 64, 64),
}


@pytest.mark.parametrize("case", list(CASES))
def test_attention_is_one_flash_kernel_matching_torch(group_device: str, case: str) -> None:
    attention = CASES[case]
    output = attention.ember(group_device)
    kernels = [kernel for kernel in kernels_of(output) if attention_parts(kernel) is not None]
    assert len(kernels) == 1
    assert _is_flash(build_kernel_ir(kernels[0], "attention", REGISTRY.device(group_device).info))
    np.testing.assert_allclose(output.numpy(), attention.torch(), rtol=2e-5, atol=2e-5)


def test_a_long_sequence_matches_torch(group_device: str) -> None:
    """A size users run (a 2,048-token causal self-attention of 64-wide heads; on the simulator 512 tokens): one
    kernel, no [L, S] matrix stored, every row against torch."""
    length = 512 if group_device.startswith("ptxsim") else 2048
    attention = Case(10, (1, 2), length, length, 64, 64, causal=True)
    output = attention.ember(group_device)
    (kernel,) = kernels_of(output)
    assert max(kernel.input_sizes) < length * length  # nothing read is the score matrix
    np.testing.assert_allclose(output.numpy(), attention.torch(), rtol=2e-5, atol=2e-5)


def test_inputs_computed_by_reduces_are_stored_first(group_device: str) -> None:
    """q, k and v as a model computes them (lazy projections of a normalized input, a head split's transpose): the
    projections and the norm are kernels of their own, the attention one flash kernel, the values torch's."""
    rng = np.random.default_rng(15)
    x, weights = rng.standard_normal((2, 40, 32)).astype(np.float32), rng.standard_normal((3, 32, 32)).astype(
        np.float32)

    def attention(library: Any, x: Any, weights: Any) -> Any:
        normed = library.nn.functional.layer_norm(x, (32,))
        q, k, v = ((normed @ weights[number]).reshape(2, 40, 2, 16).transpose(1, 2) for number in range(3))
        return library.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    output = attention(em, em.tensor(x, device=group_device), em.tensor(weights, device=group_device))
    kernels = kernels_of(output)
    assert sum(attention_parts(kernel) is not None for kernel in kernels) == 1 and len(kernels) >= 3
    expected = attention(torch, torch.tensor(x), torch.tensor(weights))
    np.testing.assert_allclose(output.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


def test_nan_and_infinity_reach_the_rows_torch_gives_them_to(group_device: str) -> None:
    attention = Case(11, (1, 1), 32, 40, 16, 16)
    attention.query[0, 0, 4, 2] = np.nan  # row 4's scores: NaN
    attention.value[0, 0, 7, 3] = np.inf  # column 3 of every row: inf (or NaN where weights are NaN)
    attention.value[0, 0, 39, 5] = np.inf  # the last key's (the key blocks' padding past it weighs 0: not NaN)
    attention.key[0, 0, 9, :] = 0.0
    expected = attention.torch()
    got = attention.ember(group_device).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [em.float16, em.bfloat16], ids=lambda dtype: dtype.name)
def test_half_inputs_match_torch(group_device: str, dtype: em.DType) -> None:
    attention = Case(12, (1, 2), 40, 50, 32, 32, causal=True)
    torch_dtype = torch.float16 if dtype == em.float16 else torch.bfloat16
    halves = [torch.tensor(array).to(torch_dtype) for array in (attention.query, attention.key, attention.value)]
    expected = torch.nn.functional.scaled_dot_product_attention(*[t.float() for t in halves], is_causal=True)
    output = attention.ember(group_device, dtype)
    assert output.dtype == dtype and len(kernels_of(output)) <= 4  # (the casts of the inputs to halves among them)
    np.testing.assert_allclose(output.float().numpy(), expected.to(torch_dtype).float().numpy(),
                               rtol=1e-2, atol=1e-2)


def test_the_composite_stays_where_flash_does_not_apply(group_device: str) -> None:
    """Gradients recorded (the composite's backward reads its stored weights), dropout, a decode step's few query
    rows: the composite's kernels, still matching torch, gradients included."""
    attention = Case(13, (1, 2), 32, 32, 16, 16, causal=True)
    query = em.tensor(attention.query, device=group_device, requires_grad=True)
    key, value = em.tensor(attention.key, device=group_device), em.tensor(attention.value, device=group_device)
    output = em.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    assert not any(attention_parts(kernel) for kernel in kernels_of(output))
    output.sum().backward()
    torch_query = torch.tensor(attention.query, requires_grad=True)
    expected = torch.nn.functional.scaled_dot_product_attention(torch_query, torch.tensor(attention.key),
                                                                torch.tensor(attention.value), is_causal=True)
    expected.sum().backward()
    np.testing.assert_allclose(output.detach().numpy(), expected.detach().numpy(), rtol=2e-5, atol=2e-5)
    assert query.grad is not None and torch_query.grad is not None
    np.testing.assert_allclose(query.grad.numpy(), torch_query.grad.numpy(), rtol=1e-4, atol=1e-4)
    decode = Case(14, (1, 2), MINIMUM_ROWS - 1, 64, 16, 16).ember(group_device)
    assert not any(attention_parts(kernel) for kernel in kernels_of(decode))
    with em.no_grad():
        dropped = em.nn.functional.scaled_dot_product_attention(query, key, value, dropout_p=0.5)
    assert not any(attention_parts(kernel) for kernel in kernels_of(dropped))


def test_only_device_info_decides() -> None:
    """Warps and local memory, never a backend's name: a CPU's DeviceInfo (no warps) keeps the composite; tiles shrink
    to fit a smaller local memory, and a head too wide for any is refused."""
    assert attention_tiles(4, 128, 128, 64, 64, em.float32, H100_LIKE) is not None
    assert attention_tiles(4, 128, 128, 64, 64, em.float32, DeviceInfo(**{**H100_LIMITS, "warp_width": 1})) is None
    assert attention_tiles(4, 128, 128, 64, 64, em.float64, H100_LIKE) is None
    small = DeviceInfo(**{**H100_LIMITS, "local_memory_bytes": 16 * 1024})
    tiles = attention_tiles(4, 128, 128, 64, 64, em.float32, small)
    assert tiles is not None and (tiles.rows, tiles.keys) < (32, 32)
    assert attention_tiles(4, 128, 128, 512, 64, em.float32, H100_LIKE) is None
    x = em.tensor(np.zeros((1, 64, 16), np.float32), device="dummy:0")  # (no warps in its DeviceInfo)
    assert not any(attention_parts(kernel) for kernel in kernels_of(em.nn.functional.scaled_dot_product_attention(x, x, x)))


def test_a_fused_kernel_lowered_for_a_device_without_warps_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused graph is written only for a device that fits its tiles; handed to any other DeviceInfo (a kernel
    cache moved between machines, a test's renderer), its lowering says so instead of failing inside a renderer."""
    monkeypatch.setattr(REGISTRY.device("dummy:0"), "info", H100_LIKE)
    x = em.tensor(np.zeros((1, 64, 16), np.float32), device="dummy:0")
    (kernel,) = kernels_of(em.nn.functional.scaled_dot_product_attention(x, x, x))
    assert attention_parts(kernel) is not None and _is_flash(build_kernel_ir(kernel, "attention", H100_LIKE))
    with pytest.raises(CompileError, match="fused attention .* needs warps and local memory"):
        build_kernel_ir(kernel, "attention", DeviceInfo())
    monkeypatch.setenv("EMBER_NOOPT", "1")  # (the flash kernel is its only lowering)
    assert _is_flash(build_kernel_ir(kernel, "attention", H100_LIKE))


# ---- rendering: every case for an H100-like device ----------------------------------------------------------------

def _shape_irs() -> dict[str, KernelIR]:
    irs = {}
    REGISTRY.device("dummy:0")  # (a render-only device whose DeviceInfo is replaced below by the H100's)
    for name, attention in CASES.items():
        for dtype in (em.float32, em.float16):
            output = attention.ember("dummy:0", dtype)
            kernels = [kernel for kernel in kernels_of(output) if attention_parts(kernel) is not None]
            if kernels:  # (the dummy device has no warps: its SDPA is the composite; lowered for an H100 below)
                irs[f"{name}-{dtype.name}"] = build_kernel_ir(kernels[0], "attention", H100_LIKE)
    return irs


def _fused_on_dummy(monkeypatch: Any) -> dict[str, KernelIR]:
    device = REGISTRY.device("dummy:0")
    monkeypatch.setattr(device, "info", H100_LIKE)
    return _shape_irs()


def test_every_barrier_comes_after_the_local_stores_it_waits_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The linearizer's order, for every case: a barrier after local-memory stores was once hoisted above them (the
    partial maxima read before they were written: NaN rows where scores were large, right ones by chance where they
    were small)."""
    from ember.ir.linearize import Step, linearize

    for case, ir in _fused_on_dummy(monkeypatch).items():
        position = {id(instruction.node): number for number, instruction in enumerate(linearize(ir.sink))
                    if instruction.kind in (Step.STORE, Step.BARRIER)}
        for node in topological_nodes(ir.sink):
            if node.op is IROp.BARRIER:
                waited = [source for source in node.srcs if source.op is IROp.STORE]
                assert all(position[id(store)] < position[id(node)] for store in waited), case


def test_every_case_renders_for_an_h100_like_device(monkeypatch: pytest.MonkeyPatch) -> None:
    irs = _fused_on_dummy(monkeypatch)
    assert len(irs) == 2 * len(CASES)
    for case, ir in irs.items():
        assert _is_flash(ir), case
        wgsl = WGSLRenderer().render(ir)
        assert f"@workgroup_size({ir.local_size})" in wgsl and wgsl.count("var<workgroup> ember_tile") == 5
        opencl = OpenCLRenderer().render(ir)
        assert f"reqd_work_group_size({ir.local_size}, 1, 1)" in opencl
        # the Q tile; the maxima's loop (free, K filled) and their partials; the weighted sums' loop (free, K and V
        # filled, weights), twice where causal (the blocks before the diagonal, unmasked, and those across it)
        causal = CASES[case.rsplit("-", 1)[0]].causal
        barriers = 10 if causal else 7
        # a causal attention's three key loops run as many blocks as its group's queries see: counts of its own
        counted = sum(node.op is IROp.RANGE and len(node.srcs) == 1 for node in topological_nodes(ir.sink))
        assert counted == (3 if causal else 0), case
        assert opencl.count("barrier(CLK_LOCAL_MEM_FENCE);") == barriers, case
        ptx = PTXRenderer().render(ir)
        assert ptx.count("bar.sync 0;") == barriers and ptx.count(".shared .align 16") == 5
        with pytest.raises(CompileError, match="workgroup"):
            CRenderer().render(ir)  # C keeps the composite: it is never handed one
        if ptxas_path() is not None:
            for target in ("sm_75", "sm_90"):
                assemble(PTXRenderer(target).render(ir), target)
