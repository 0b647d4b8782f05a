"""Test configuration: the devices every op test runs on, and the environment the backends need."""

from __future__ import annotations

import os

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # wgpu warns without it
# quick builds (scheduler/quick_compile.py) give values equal to the optimized ones only within float tolerance, and
# when they are swapped out depends on timing: tests comparing two ember runs bit for bit (a jit replay with eager)
# would then pass or fail by the state of the disk cache. tests/test_compile_ahead.py turns them on where it tests them.
os.environ.setdefault("EMBER_QUICK_COMPILE", "0")

import pytest

import ember as em
from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable, DeviceError

DEFAULT_TEST_BACKENDS = "c,opencl,wgpu"  # each one that is available here (wgpu: Mesa lavapipe on a CPU)


REGISTRY.modules.setdefault("ptxsim", "tests.ptx_simulator")  # the cuda backend's PTX, run by a simulator


def available_test_devices() -> list[str]:
    """EMBER_TEST_DEVICES (comma-separated backend names) filtered to those available here."""
    wanted = os.environ.get("EMBER_TEST_DEVICES", DEFAULT_TEST_BACKENDS).split(",")
    found = []
    for backend in filter(None, (name.strip() for name in wanted)):
        try:
            found.append(REGISTRY.probe(backend)[0].name)
        except (BackendUnavailable, DeviceError):
            continue
    return found


TEST_DEVICES = available_test_devices()


@pytest.fixture(params=TEST_DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """Every available test device in turn; tests create their tensors on it."""
    return request.param


@pytest.fixture(autouse=True)
def _seed() -> None:
    em.manual_seed(0)


def pytest_configure(config: pytest.Config) -> None:
    from tests import kernel_recorder  # every kernel of the session is assembled by ptxas at the end

    config.pluginmanager.register(kernel_recorder, "ember-ptx-check")
