"""What the workgroup kernel tests share (test_group_matmul.py, test_group_reduce.py, test_flash_attention.py), a
plugin of tests/conftest.py: the devices that run workgroup kernels here (a test taking `group_device` runs on each),
an H100-like DeviceInfo to lower and render for, a fixture turning optimizations on, and the kernels a graph
launches."""

from __future__ import annotations

import functools

import pytest

import ember as em
from ember.backends.base import DeviceInfo
from ember.backends.dummy import H100_LIMITS
from ember.ir.kernel import Kernel
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch

H100_LIKE = DeviceInfo(**H100_LIMITS)  # (1024 threads a block, 48 KiB of shared memory, warps of 32, 132 SMs)


@functools.cache
def workgroup_devices() -> tuple[str, ...]:
    """Where workgroup kernels run here: lavapipe and PoCL with a GPU's warp width (tests/wgpu_groups.py,
    tests/opencl_groups.py) where wgpu and opencl are test devices, and the PTX simulator (probed when first asked,
    not by every test session)."""
    from tests.conftest import TEST_DEVICES
    from tests.wgpu_groups import group_devices

    return tuple(group_devices(TEST_DEVICES))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test taking `group_device` runs on each of workgroup_devices()."""
    if "group_device" in metafunc.fixturenames:
        metafunc.parametrize("group_device", workgroup_devices())


@pytest.fixture
def optimizations_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workgroup kernels are an optional transform (EMBER_NOOPT=1 turns them off): tests about them use this
    (`pytestmark = pytest.mark.usefixtures("optimizations_on")`)."""
    monkeypatch.setenv("EMBER_NOOPT", "0")


def kernels_of(tensor: em.Tensor) -> list[Kernel]:
    """The kernels (not the copies) that realizing `tensor` launches."""
    return [item.kernel for item in kernelize([tensor.node]) if isinstance(item, Launch)]
