"""Backends: opencl against PyTorch, the dummy render-only devices, the registry's reasons, `python -m ember info`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import ember as em
from ember.backends import dummy, opencl
from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable, CompileError, DeviceError
from tests.helpers import TORCH_DTYPES, assert_close, pair, random_array, run_float_kernel

REPOSITORY = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def opencl_device() -> str:
    try:
        return REGISTRY.probe("opencl")[0].name
    except BackendUnavailable as error:
        pytest.skip(f"no OpenCL device here: {error}")


# ---- opencl against PyTorch -------------------------------------------------------------------------------------


def test_opencl_elementwise_with_broadcast(opencl_device: str) -> None:
    a, ta = pair(random_array((3, 1, 17)), opencl_device)
    b, tb = pair(random_array((4, 1), seed=1), opencl_device)
    c, tc = pair(random_array((17,), seed=2), opencl_device)
    result = em.where(a > 0, (a * b - c).exp() / (1 + a.abs()), c.sqrt())
    expected = torch.where(ta > 0, (ta * tb - tc).exp() / (1 + ta.abs()), tc.sqrt())
    assert_close(result, expected, rtol=1e-5)
    assert_close(a.sigmoid().sin() + 2, ta.sigmoid().sin() + 2)
    empty, tempty = pair(random_array((0, 17)), opencl_device)
    assert_close(empty + c, tempty + tc)
    one, tone = pair(random_array((1,)), opencl_device)
    assert_close(one.log2(), tone.log2())


def test_opencl_reductions(opencl_device: str) -> None:
    x, tx = pair(random_array((3, 17, 5)), opencl_device)
    assert_close(x.sum(1), tx.sum(1))
    assert_close(x.amax(-1, keepdim=True), tx.amax(-1, keepdim=True))
    assert_close(x.mean((0, 2)), tx.mean((0, 2)))
    assert_close(x.prod(0), tx.prod(0))
    assert_close(x.argmax(1), tx.argmax(1))
    long_row, tlong_row = pair(random_array((1000,)), opencl_device)
    assert_close(long_row.sum(), tlong_row.sum(), atol=1e-3)
    empty, tempty = pair(random_array((4, 0)), opencl_device)
    assert_close(empty.sum(1), tempty.sum(1))


def test_opencl_matmul(opencl_device: str) -> None:
    a, ta = pair(random_array((17, 33)), opencl_device)
    b, tb = pair(random_array((33, 5), seed=1), opencl_device)
    bias, tbias = pair(random_array((5,), seed=2), opencl_device)
    assert_close((a @ b + bias).relu(), (ta @ tb + tbias).relu(), atol=1e-4)
    batched, tbatched = pair(random_array((2, 1, 3, 4)), opencl_device)
    other, tother = pair(random_array((5, 4, 6), seed=3), opencl_device)
    assert_close(batched @ other, tbatched @ tother, atol=1e-4)
    assert_close(a[0] @ b, ta[0] @ tb, atol=1e-4)


def test_opencl_padded_and_permuted_views(opencl_device: str) -> None:
    x, tx = pair(random_array((3, 17, 5)), opencl_device)
    assert_close(x.permute(2, 0, 1) * 2, tx.permute(2, 0, 1) * 2)
    assert_close(x.flip(1).pad((1, 2, 0, 3)) + 1, torch.nn.functional.pad(tx.flip(1), (1, 2, 0, 3)) + 1)
    assert_close(x[:, ::3, 1:].transpose(0, 2).exp(), tx[:, ::3, 1:].transpose(0, 2).exp())
    assert_close(x[1:, -1].expand(4, 2, 5).reshape(8, 5).sum(0), tx[1:, -1].expand(4, 2, 5).reshape(8, 5).sum(0))


def _dtype_check(x: em.Tensor, y: em.Tensor, tx: torch.Tensor, ty: torch.Tensor) -> None:
    """A few ops of every kind on two tensors of one dtype, against torch."""
    dtype = tx.dtype
    assert_close(x.to(em.float32), tx.to(torch.float32))
    assert_close((x == y) | (x < y), (tx == ty) | (tx < ty))
    if dtype == torch.bool:
        assert_close((x & ~y) ^ (x | y), (tx & ~ty) ^ (tx | ty))
        assert_close(x.sum(1), tx.sum(1))
        return
    assert_close(em.where(x < y, x * y, x + y), torch.where(tx < ty, tx * ty, tx + ty), atol=0.05, rtol=0.02)
    assert_close(x.maximum(y).amax(1), tx.maximum(ty).amax(1))
    assert_close(x.sum(1), tx.sum(1), atol=0.1, rtol=0.02)


SIGNED_AND_FLOAT = [em.bool, em.int8, em.uint8, em.int16, em.int32, em.int64, em.float16, em.bfloat16, em.float32,
                    em.float64]


@pytest.mark.parametrize("dtype", SIGNED_AND_FLOAT, ids=lambda dtype: dtype.name)
def test_opencl_every_dtype(opencl_device: str, dtype: em.DType) -> None:
    device = REGISTRY.device(opencl_device)
    numpy_dtype = np.float32 if dtype.is_float else dtype.numpy
    first, second = random_array((3, 17), numpy_dtype), random_array((3, 17), numpy_dtype, seed=1)
    if dtype not in device.info.supported_dtypes:
        with pytest.raises(DeviceError, match=dtype.name):
            (em.tensor(first, device=opencl_device).to(dtype) + 1).numpy()
        return
    x, y = em.tensor(first, device=opencl_device).to(dtype), em.tensor(second, device=opencl_device).to(dtype)
    tx, ty = torch.tensor(first).to(TORCH_DTYPES[dtype]), torch.tensor(second).to(TORCH_DTYPES[dtype])
    _dtype_check(x, y, tx, ty)


@pytest.mark.parametrize("dtype", [em.uint16, em.uint32, em.uint64], ids=lambda dtype: dtype.name)
def test_opencl_unsigned_dtypes(opencl_device: str, dtype: em.DType) -> None:
    """Wide unsigned types against numpy (torch implements few ops for them)."""
    first = random_array((3, 17), dtype.numpy, high=1000)
    second = random_array((3, 17), dtype.numpy, high=1000, seed=1)
    large = np.array([0, 1, np.iinfo(dtype.numpy).max, np.iinfo(dtype.numpy).max // 3], dtype=dtype.numpy)
    x, y = em.tensor(first, device=opencl_device), em.tensor(second, device=opencl_device)
    np.testing.assert_array_equal((x * y + x).numpy(), first * second + first)
    np.testing.assert_array_equal(x.maximum(y).numpy(), np.maximum(first, second))
    np.testing.assert_array_equal((x < y).numpy(), first < second)
    big = em.tensor(large, device=opencl_device)
    np.testing.assert_array_equal((big + big).numpy(), large + large)  # wraps around
    np.testing.assert_array_equal(big.to(em.float64).numpy(), large.astype(np.float64))


def test_opencl_half_casts_are_exact(opencl_device: str) -> None:
    """float32 -> bfloat16/float16 rounds to nearest even, with NaN, infinities, subnormals and overflow."""
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.0, 65520.0, 1e-8, 6e-8, -3e-5, 3.0e38, 1.00390625,
               1.01171875, 2049.0, 2051.0, 1 + 2**-8, 1 + 3 * 2**-8]
    values = np.concatenate([np.array(special, np.float32), random_array((200,), low=-300, high=300)])
    values = np.concatenate([values, values * np.float32(1e-5)])
    x, tx = pair(values, opencl_device)
    for dtype in (em.bfloat16, em.float16):
        half, thalf = x.to(dtype), tx.to(TORCH_DTYPES[dtype])
        assert_close(half.bitcast(em.int16)[~half.isnan()], thalf.view(torch.int16)[~thalf.isnan()])
        assert bool(half.isnan().any().item()) and half.isnan().sum().item() == 2
        assert_close(half.to(em.float32), thalf.to(torch.float32))
        assert_close(half.to(em.float64) * 2, thalf.to(torch.float64) * 2)
    doubled, tdoubled = pair(values.astype(np.float64), opencl_device)
    assert_close(doubled.to(em.bfloat16).to(em.float32), tdoubled.to(torch.bfloat16).to(torch.float32))
    ints, tints = pair(np.array([-70000, -3, 0, 5, 65519, 70000], np.int64), opencl_device)
    assert_close(ints.to(em.float16), tints.to(torch.float16))


def test_opencl_wide_integers_and_doubles(opencl_device: str) -> None:
    big = np.array([2**40 + 3, -(2**50) - 7, 2**62, -(2**63)], np.int64)
    x, tx = pair(big, opencl_device)
    assert_close(x + 5, tx + 5)
    assert_close(x.sum(), tx.sum())
    assert_close(x * 3 - x, tx * 3 - tx)
    precise = np.array([16777216.0, 1.0, 1.0, 0.125, 1e-300, 3.141592653589793], np.float64)  # not float32
    d, td = pair(precise, opencl_device)
    assert_close(d.sum(), td.sum(), rtol=1e-15, atol=0)
    assert_close(d.sqrt() + d.exp2(), td.sqrt() + td.exp2(), rtol=1e-14, atol=0)
    assert_close(d.bitcast(em.int64), td.view(torch.int64))
    bits = np.array([0x3F800000, 0x7F800000, -8388608, 1], np.int32)
    assert_close(em.tensor(bits, device=opencl_device).bitcast(em.float32), torch.tensor(bits).view(torch.float32))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_opencl_signed_overflow_wraps_like_torch(opencl_device: str, dtype: type) -> None:
    """OpenCL C has no -fwrapv; the renderer wraps signed arithmetic itself where the IR cannot bound it."""
    info = np.iinfo(dtype)
    x, tx = pair(np.array([info.max, info.min, 5, 0, -7], dtype), opencl_device)
    assert_close((x + 1) < x, (tx + 1) < tx)
    assert_close(x * 3 - x.flip(0), tx * 3 - tx.flip(0))
    assert_close(-x, -tx)
    assert_close(x // -1, tx // -1)
    assert_close(x * 2 // 2, tx * 2 // 2)
    assert_close(x.sum(), tx.sum())


def test_opencl_index_math_stays_plain() -> None:
    """Index arithmetic whose IR bounds fit in int32 is rendered without the wrapping casts (it vectorizes better)."""
    device = REGISTRY.device("dummy:0")
    device.clear()
    x = em.tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="dummy:0")
    x.permute(1, 0).flip(0).sum(1).realize()
    source = opencl.OpenCLRenderer().render(device.kernels[-1])
    assert "(uint)" not in source and "gid" in source and "loop" in source


def test_opencl_launches_are_asynchronous_and_reads_wait(opencl_device: str) -> None:
    device = REGISTRY.device(opencl_device)
    start = random_array((4096,))
    x = em.tensor(start, device=opencl_device)
    expected = start.copy()
    for _ in range(50):  # every step frees the previous buffer while its kernel may still be queued
        x = (x * 0.5 + 1).realize()
        expected = expected * np.float32(0.5) + np.float32(1)
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-6)
    kernel = next(compiled for (name, _), compiled in _compiled_kernels().items() if name == opencl_device)
    output = device.pool.allocate(kernel.ir.params[0].size * kernel.ir.params[0].dtype.itemsize)
    inputs = [device.pool.allocate(param.size * param.dtype.itemsize) for param in kernel.ir.params[1:]]
    event = kernel.program([output, *inputs], kernel.ir.global_size)
    assert isinstance(event, opencl.OpenCLEvent)
    event.wait()
    assert event.done
    second = kernel.program([output, *inputs], kernel.ir.global_size, wait_for=(event,))
    second.wait()
    for handle, param in zip([output, *inputs], kernel.ir.params):
        device.pool.release(handle, param.size * param.dtype.itemsize)


def _compiled_kernels() -> dict:
    from ember.scheduler.compile_cache import COMPILED

    return COMPILED


def test_opencl_renderer_strings() -> None:
    """The OpenCL renderer differs from C only in its strings: kernel prefix, __global, ids, types, math, bitcast."""
    device = REGISTRY.device("dummy:0")
    device.clear()
    x = em.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device="dummy:0")
    big = em.tensor(np.arange(6, dtype=np.int64), device="dummy:0")
    em.realize(x.sqrt().bitcast(em.int32) + 1, big * (2**40), x.to(em.bfloat16))
    sources = "\n".join(opencl.OpenCLRenderer().render(kernel) for kernel in device.kernels)
    c_sources = "\n".join(dummy.TARGETS["c"].make_renderer().render(kernel) for kernel in device.kernels)
    for expected in ["__kernel void", "__global int* restrict data0", "__global const float* restrict data1",
                     "get_global_id(0) >= 6) return;", "sqrt(", "as_int(", "1099511627776L", "long",
                     "ember_float_to_bf16("]:
        assert expected in sources, expected
    assert "sqrtf(" not in sources and "long long" not in sources
    assert "sqrtf(" in c_sources and "__kernel" not in c_sources


def _no_compiler() -> dummy.CompileCheck:
    raise BackendUnavailable("no compiler for this test target")


def test_opencl_disk_cache_and_corrupt_entries(opencl_device: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    cl_device = REGISTRY.device(opencl_device).cl_device
    source = "__kernel void ember_cache_test(__global int* data0) { data0[get_global_id(0)] = 7; }\n"
    first = opencl.OpenCLDevice("opencl:cache-test", cl_device)
    first.build(source)
    entries = list((tmp_path / "opencl").iterdir())
    assert len(entries) == 1 and opencl.read_cache_entry(entries[0]) is not None

    def run(device: opencl.OpenCLDevice) -> np.ndarray:
        buffer = device.pool.allocate(4 * 4)
        kernel = opencl.cl.Kernel(device.build(source), "ember_cache_test")
        opencl.cl.enqueue_nd_range_kernel(device.queue, kernel.set_args(buffer) or kernel, (4,), None)
        result = np.zeros(4, np.int32)
        device.pool.copy_out(memoryview(result).cast("B"), buffer)
        return result

    built_from_source: list[str] = []
    original_program = opencl.cl.Program

    def counting_program(*arguments: object) -> object:
        if len(arguments) == 2:
            built_from_source.append("source")
        return original_program(*arguments)

    monkeypatch.setattr(opencl.cl, "Program", counting_program)
    assert list(run(opencl.OpenCLDevice("opencl:cache-test", cl_device))) == [7] * 4
    assert built_from_source == []  # loaded from the disk cache
    entries[0].write_bytes(entries[0].read_bytes()[:200])  # truncated: the checksum no longer matches
    assert list(run(opencl.OpenCLDevice("opencl:cache-test", cl_device))) == [7] * 4
    assert built_from_source == ["source"]
    opencl.write_cache_entry(entries[0], b"not a program binary", launched=True)  # a checksum the driver rejects
    assert list(run(opencl.OpenCLDevice("opencl:cache-test", cl_device))) == [7] * 4
    assert built_from_source == ["source", "source"]
    assert opencl.read_cache_entry(entries[0])[0] != b"not a program binary"


def test_opencl_cache_keeps_the_binary_of_the_first_launch(opencl_device: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry is rewritten after the first launch (PoCL then includes its work-group code), and only once."""
    x = em.tensor(np.arange(17, dtype=np.float32), device=opencl_device)
    with em.profile():
        (x * 3 + 1).realize()
    ir = [compiled.ir for (name, _), compiled in _compiled_kernels().items() if name == opencl_device][-1]
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    cl_device = REGISTRY.device(opencl_device).cl_device

    def launch() -> tuple[np.ndarray, opencl.OpenCLDevice]:
        device = opencl.OpenCLDevice("opencl:cache-test", cl_device)
        device.caches_launched_binaries = True  # as for drivers other than PoCL (which caches kernels itself)
        return run_float_kernel(device, ir), device

    result, device = launch()
    np.testing.assert_array_equal(result, np.arange(17, dtype=np.float32) * 3 + 1)
    (entry,) = (tmp_path / "opencl").iterdir()
    assert opencl.read_cache_entry(entry)[1] is True  # rewritten with the launched binary
    writes: list[Path] = []  # (not the entry's time: a cache hit marks the entry used)
    write = opencl.write_cache_entry
    monkeypatch.setattr(opencl, "write_cache_entry", lambda path, *rest: writes.append(path) or write(path, *rest))
    result, device = launch()
    np.testing.assert_array_equal(result, np.arange(17, dtype=np.float32) * 3 + 1)
    assert writes == [] and not device._unlaunched


def test_opencl_compile_error_names_the_source(opencl_device: str) -> None:
    device = REGISTRY.device(opencl_device)
    with pytest.raises(CompileError, match="undeclared_thing"):
        device.build("__kernel void broken(__global int* data0) { data0[0] = undeclared_thing; }\n")


def test_opencl_builds_print_no_compiler_warnings(opencl_device: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    device = opencl.OpenCLDevice("opencl:warning-test", REGISTRY.device(opencl_device).cl_device)
    source = "__kernel void warns(__global int* data0) { int unused; data0[0] = (3 == 0 || 3 == -1) ? 0 : 1; }\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        device.build(source)


def test_opencl_probe_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opencl, "cl", None)
    with pytest.raises(BackendUnavailable, match=r"pip install ember\[opencl\]"):
        opencl.probe()
    monkeypatch.undo()
    if opencl.cl is None:
        return
    monkeypatch.setattr(opencl.cl, "get_platforms", lambda: [])
    with pytest.raises(BackendUnavailable, match="no OpenCL platform"):
        opencl.probe()

    class EmptyPlatform:
        name = "Empty Platform"

        def get_devices(self) -> list:
            return []

    monkeypatch.setattr(opencl.cl, "get_platforms", lambda: [EmptyPlatform()])
    with pytest.raises(BackendUnavailable, match="Empty Platform.*no devices"):
        opencl.probe()


# ---- dummy devices -----------------------------------------------------------------------------------------------


def _small_graph(device: str) -> list[em.Tensor]:
    x = em.tensor(random_array((4, 6)), device=device)
    w = em.tensor(random_array((6, 3), seed=1), device=device)
    hidden = (x @ w + 1).relu().softmax(-1)
    mask = (x > 0).to(em.int32).sum(0)
    halves = x.to(em.float16) * 2 + x.to(em.bfloat16).to(em.float32)
    return [hidden, mask, halves.double().sum(), x.bitcast(em.int32) & 255]


@pytest.mark.parametrize("name,marker", [("dummy:c", "#define EMBER_C_PRELUDE"), ("dummy:opencl", "__kernel void")])
def test_dummy_render_targets_render_and_compile(name: str, marker: str) -> None:
    device = REGISTRY.device(name)
    assert not device.info.can_run
    if name == "dummy:opencl" and device.info.extra["compile_check"] != "yes":
        pytest.skip(f"no OpenCL compiler here: {device.info.extra['compile_check']}")
    assert device.info.extra["compile_check"] == "yes"
    device.clear()
    results = _small_graph(name)
    em.realize(*results)
    assert len(device.rendered) >= 4
    for kernel_name, source in device.rendered:
        assert marker in source and kernel_name in source
    assert all(not result.numpy().any() for result in results)  # nothing computed: pools hold no data
    assert device.pool.live_buffers >= len(results)


def test_dummy_zero_device_accepts_everything_and_renders_nothing() -> None:
    device = REGISTRY.device("dummy")
    assert device.name == "dummy:0" and not device.info.can_run
    device.clear()
    results = _small_graph("dummy:0")
    em.realize(*results)
    assert len(device.kernels) >= 4 and all(source == "" for _, source in device.rendered)
    assert results[0].shape == (4, 3) and results[0].numpy().sum() == 0


def test_dummy_compile_check_reports_bad_source() -> None:
    class BrokenRenderer:
        def render(self, kernel: object) -> str:
            return "this is not C;\n"

    c_target = dummy.TARGETS["c"]
    broken = dummy.DummyDevice("dummy:broken", dummy.RenderTarget("C", BrokenRenderer, c_target.make_check))
    kernel = next(iter(_compiled_kernels().values()), None)
    if kernel is None:
        em.tensor([1.0], device="dummy:0").exp().realize()
        kernel = next(iter(_compiled_kernels().values()))
    with pytest.raises(CompileError, match="this is not C"):
        broken.compile(kernel.ir)
    render_only = dummy.DummyDevice("dummy:render-only", dummy.RenderTarget("C", BrokenRenderer, _no_compiler))
    render_only.compile(kernel.ir)
    assert render_only.rendered == [(kernel.ir.name, "this is not C;\n")]
    assert "no compiler for this test target" in render_only.info.extra["compile_check"]

    def missing_renderer() -> dummy.Renderer:
        raise ImportError("no module named ember_wgsl_renderer")

    unrenderable = dummy.DummyDevice("dummy:missing", dummy.RenderTarget("WGSL", missing_renderer, _no_compiler))
    assert "no module named ember_wgsl_renderer" in unrenderable.info.extra["renders"]
    with pytest.raises(BackendUnavailable, match="dummy:missing cannot render kernels: ImportError"):
        unrenderable.compile(kernel.ir)


# ---- registry and device names ------------------------------------------------------------------------------------


def test_unknown_device_names_raise_device_error() -> None:
    with pytest.raises(DeviceError, match=r"unknown backend 'nosuch'; known backends: c, opencl.*dummy"):
        em.tensor([1.0], device="nosuch")
    with pytest.raises(DeviceError, match="known backends"):
        em.zeros(3, device="nosuch:1")
    with pytest.raises(DeviceError, match="no device 'dummy:99'; backend 'dummy' has dummy:0, .*dummy:c"):
        em.tensor([1.0], device="dummy:99")


def test_broken_backend_module_is_a_reason_not_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ember_test_broken_backend.py").write_text("raise ImportError('the fake driver library is missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(REGISTRY.modules, "broken", "ember_test_broken_backend")
    try:
        with pytest.raises(BackendUnavailable, match="backend 'broken' is not available: ImportError: the fake driver"):
            REGISTRY.probe("broken")
        assert "broken" not in REGISTRY.devices and "fake driver" in REGISTRY.unavailable["broken"]
        with pytest.raises(BackendUnavailable, match="fake driver"):  # the reason is kept, not re-imported
            em.tensor([1.0], device="broken:0")
    finally:
        REGISTRY.unavailable.pop("broken", None)


def _write_broken_entry_point(folder: Path) -> None:
    """A fake installed distribution whose `ember.backends` entry point raises when imported."""
    info = folder / "ember_fake_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ember-fake-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ember.backends]\nfakegpu = ember_fake_backend\n")
    (folder / "ember_fake_backend.py").write_text("raise RuntimeError('fakegpu driver crashed while loading')\n")


def _run_ember(arguments: list[str], python_path: str = "") -> subprocess.CompletedProcess:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [python_path, str(REPOSITORY),
                                                              environment.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "ember", *arguments], capture_output=True, text=True,
                          env=environment, timeout=120, cwd=str(REPOSITORY))


def test_ember_info_lists_devices_and_reasons(tmp_path: Path) -> None:
    _write_broken_entry_point(tmp_path)
    result = _run_ember(["info"], python_path=str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for name in ["c:0", "dummy:0", "dummy:c", "dummy:opencl"]:
        assert any(line.strip().startswith(name) for line in lines), result.stdout
    assert any("fakegpu: unavailable: RuntimeError: fakegpu driver crashed" in line for line in lines), result.stdout
    assert any(line.startswith("default device: ") for line in lines)
    assert "EMBER_DEVICE" in result.stdout and "EMBER_DEBUG" in result.stdout
    # every backend, whatever this machine has (a GPU, a driver, or neither): its devices, or why there are none
    for backend in ("c", "opencl", "wgpu", "cuda", "dummy", "fakegpu"):
        _assert_devices_or_reason(lines, backend, result.stdout)


def _assert_devices_or_reason(lines: list[str], backend: str, text: str) -> None:
    """`ember info` has a line `  backend: N device(s)` followed by the devices `backend:0`.., or a line
    `  backend: unavailable: reason` with a reason worth reading."""
    heading = [line for line in lines if line.startswith(f"  {backend}: ")]
    assert len(heading) == 1, f"no single line for backend {backend}:\n{text}"
    status = heading[0].split(": ", 1)[1]
    if status.startswith("unavailable: "):
        assert len(status.removeprefix("unavailable: ").strip()) > 5, heading[0]
        return
    count = int(status.split()[0])
    assert count >= 1 and status.endswith("device(s)"), heading[0]
    assert any(line.strip().startswith(f"{backend}:") for line in lines[lines.index(heading[0]) + 1:]), text


def test_ember_info_json(capsys: pytest.CaptureFixture) -> None:
    from ember.__main__ import main

    assert main(["info", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["backends"]["c"]["available"] and found["backends"]["c"]["devices"][0]["name"] == "c:0"
    assert found["backends"]["dummy"]["devices"][0]["can_run"] is False
    assert found["default_device"] == em.get_default_device()
    assert set(found["settings"]) >= {"EMBER_DEVICE", "EMBER_DEBUG", "EMBER_NOOPT", "EMBER_CACHE_DIR"}


def test_import_ember_survives_a_broken_entry_point(tmp_path: Path) -> None:
    _write_broken_entry_point(tmp_path)
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPOSITORY)]))
    script = textwrap.dedent("""
        import ember as em
        print(float((em.tensor([1.0, 2.0]) * 3).sum().item()))
        from ember.backends.registry import REGISTRY
        try:
            em.tensor([1.0], device="fakegpu")
        except em.BackendUnavailable as error:
            print("reason:", error)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment,
                            timeout=120, cwd=str(REPOSITORY))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "9.0"
    assert "reason: backend 'fakegpu' is not available: RuntimeError: fakegpu driver crashed" in result.stdout


def test_main_requires_a_command(capsys: pytest.CaptureFixture) -> None:
    from ember.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "info" in capsys.readouterr().err
