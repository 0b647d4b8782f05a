"""The wgpu backend itself (WGSL on Mesa lavapipe here): 2-D dispatch of large launches, pipelines built once per
program, the capability table of standard WebGPU (no 64-bit types), buffer limits, events, and probe reasons.
Every dtype and op on wgpu is checked in tests/test_backend_dtypes.py; the whole op, gradient and fuzz-budget suite
runs on wgpu by default (tests/conftest.py) wherever an adapter is found."""

from __future__ import annotations

import gc
import sys
import time

import numpy as np
import pytest
import torch

import ember as em
from ember.backends import wgpu as wgpu_backend
from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable, DeviceError
from tests.helpers import assert_close, isolated_compile_cache


@pytest.fixture(scope="module")
def wgpu_device() -> str:
    try:
        return REGISTRY.probe("wgpu")[0].name
    except BackendUnavailable as error:
        pytest.skip(f"no WebGPU adapter here: {error}")


def test_probe_names_the_device_and_its_capabilities(wgpu_device: str) -> None:
    device = REGISTRY.device(wgpu_device)
    assert wgpu_device == "wgpu:0"
    assert {em.float32, em.int32, em.uint8, em.bool, em.float16, em.bfloat16} <= device.info.supported_dtypes
    assert device.info.can_run and "adapter" in device.info.extra


def test_large_launch_uses_two_dimensional_dispatch(wgpu_device: str) -> None:
    count = 65535 * 64 + 1000
    assert wgpu_backend.WGSLRenderer.dispatch_size(count)[1] == 2
    data = np.arange(count, dtype=np.float32)
    x = em.tensor(data, device=wgpu_device)
    result = (x * 2 + 1).numpy()
    np.testing.assert_array_equal(result, data * 2 + 1)
    flags = (em.tensor(data[: count // 4], device=wgpu_device) % 3 == 0).numpy()  # a packed store
    np.testing.assert_array_equal(flags, data[: count // 4] % 3 == 0)


def test_pipelines_are_built_once_per_program(wgpu_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    device = REGISTRY.device(wgpu_device)
    created: list[str] = []
    native = type(device.device)
    for method in ("create_shader_module", "create_compute_pipeline", "create_bind_group_layout"):
        original = getattr(native, method)

        def counting(self, *args, __original=original, __method=method, **kwargs):  # type: ignore[no-untyped-def]
            created.append(__method)
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(native, method, counting)
    x = em.tensor(np.arange(10, dtype=np.float32), device=wgpu_device)
    for _ in range(5):
        (x * 3.25 - 1.5).realize()
    assert sorted(created) == ["create_bind_group_layout", "create_compute_pipeline", "create_shader_module"]


@pytest.fixture
def portable_device(wgpu_device: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A second device on the same adapter limited to standard WebGPU (no i64, u64, f64), as in a browser."""
    device = wgpu_backend.WGPUDevice(REGISTRY.device(wgpu_device).adapter, "wgpuportable:0", portable=True)
    monkeypatch.setitem(REGISTRY.devices, "wgpuportable", [device])
    return device.name


def test_portable_webgpu_refuses_64_bit_dtypes_by_name(portable_device: str) -> None:
    info = REGISTRY.device(portable_device).info
    assert not info.unsupported({em.float32, em.int32, em.uint8, em.bool, em.float16})
    assert info.unsupported({em.int64, em.uint64, em.float64}) == [em.float64, em.int64, em.uint64]
    x = em.tensor(np.array([1.5, -2.0], dtype=np.float32), device=portable_device)
    assert_close(x * 2, torch.tensor([3.0, -4.0]))
    with pytest.raises(DeviceError, match=r"wgpuportable:0 cannot run kernels on int64"):
        (em.tensor(np.array([1, 2]), device=portable_device) + 1).realize()
    with pytest.raises(DeviceError, match=r"wgpuportable:0 cannot run kernels on float64"):
        x.double().exp().realize()
    with pytest.raises(DeviceError, match=r"int64"):  # an int64 value inside a float32 kernel
        x.long().float().realize()
    with pytest.raises(DeviceError, match=r"int64"):
        x.argmax().realize()


def test_buffers_beyond_the_adapter_limit_are_refused(wgpu_device: str) -> None:
    device = REGISTRY.device(wgpu_device)
    pool = device.pool
    assert device.info.max_buffer_bytes == pool.max_buffer_bytes  # what DeviceInfo tells the fuzzer and users
    with pytest.raises(DeviceError, match="bytes per buffer"):
        pool.allocate(pool.max_buffer_bytes + 4)


def test_probe_says_why_without_the_wgpu_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wgpu", None)  # makes `import wgpu` raise ImportError
    with pytest.raises(BackendUnavailable, match="wgpu package is not installed"):
        wgpu_backend.probe()


def test_buffers_dropped_behind_a_kernel_are_freed_once_it_has_run_without_a_wait(
        wgpu_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wgpu event reports done by asking the device (not only after wait()), so the scheduler's deferred frees of
    buffers dropped while a kernel still used them go back to the pool at the next realize."""
    from ember.scheduler.buffers import DEFERRED_FREES, release_finished

    isolated_compile_cache(monkeypatch)  # the kernels it compiles drop no old kernel's sizes buffer from the count

    device = REGISTRY.device(wgpu_device)
    data = np.arange(10_000, dtype=np.float32)
    x = em.tensor(data, device=wgpu_device).realize()
    gc.collect()
    device.synchronize()
    release_finished()
    baseline = device.pool.used_bytes
    doubled = (x * 2).realize()
    shifted = (doubled + 1).realize()  # reads doubled's buffer
    del doubled
    gc.collect()
    event = device.queue.submit([])  # marks the point after both kernels
    deadline = time.monotonic() + 30
    while not event.done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert event.done
    release_finished()
    assert not any(entry[0] is device.pool for entry in DEFERRED_FREES)
    assert device.pool.used_bytes == baseline + data.nbytes  # only shifted's buffer is left
    np.testing.assert_array_equal(shifted.numpy(), data * 2 + 1)
