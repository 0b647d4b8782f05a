"""Test configuration: the devices every op test runs on, and the environment the backends need."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # wgpu warns without it

import pytest

import ember as em
from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable, DeviceError

DEFAULT_TEST_BACKENDS = "c,opencl,wgpu"  # each one that is available here (wgpu: Mesa lavapipe on a CPU)


REGISTRY.modules.setdefault("ptxsim", "tests.ptx_simulator")  # the cuda backend's PTX, run by a simulator
REGISTRY.modules.setdefault("wgpugroups", "tests.wgpu_groups")  # wgpu with a GPU's warps: workgroup kernels
REGISTRY.modules.setdefault("openclgroups", "tests.opencl_groups")  # OpenCL (PoCL) likewise
pytest_plugins = ("tests.workgroups",)  # the workgroup kernel tests' devices and helpers


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


@pytest.fixture
def cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty disk cache and an empty in-memory compile cache: every kernel is compiled (each for its sizes: no
    shape classes, scheduler/shape_classes.py, which would build one kernel for the sizes a test varies)."""
    from ember.scheduler import compile_cache

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_SHAPE_CLASSES", "0")
    monkeypatch.setattr(compile_cache, "COMPILED", compile_cache.CompileCache())


@pytest.fixture
def compiler_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The command of every compiler run c makes from now on (the kernel sources' runs: `-shared`)."""
    from ember.backends import c as c_backend

    runs: list[list[str]] = []
    real_run = c_backend.subprocess.run

    def recording_run(command: list[str], *arguments: Any, **options: Any) -> Any:
        if "-shared" in command:
            runs.append(list(command))
        return real_run(command, *arguments, **options)

    monkeypatch.setattr(c_backend.subprocess, "run", recording_run)
    return runs


@pytest.fixture(autouse=True)
def _seed() -> None:
    em.manual_seed(0)


@pytest.fixture(autouse=True)
def _own_shape_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test meets kernel structures afresh: which sizes make a shape class (scheduler/shape_classes.py, automatic
    by default) is decided by the test's own kernels, not by what earlier tests in the same worker ran."""
    from ember.scheduler import shape_classes

    monkeypatch.setattr(shape_classes, "STRUCTURES", type(shape_classes.STRUCTURES)())


@pytest.fixture(autouse=True)
def _own_backward_replays() -> None:
    """Each test records its own backward passes and clips: a recording of an earlier test's, bound to buffers
    (autograd/bound_backward.py, nn/utils/clip_replay.py), would hold pool memory that a test counting the pool's
    bytes sees."""
    from ember.autograd.backward_replay import REPLAYS
    from ember.nn.utils.clip_replay import REPLAYS as CLIP_REPLAYS

    REPLAYS.clear()
    CLIP_REPLAYS.clear()


def pytest_configure(config: pytest.Config) -> None:
    from tests import kernel_recorder  # every kernel of the session is assembled by ptxas at the end

    config.pluginmanager.register(kernel_recorder, "ember-ptx-check")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker collects its garbage here, before it reports that it has finished, and freezes what is left.

    Once every worker has finished, xdist tells them to exit, and a worker whose session is still running 5 seconds
    later sends itself SIGINT (execnet's shutdown). pytest's cleanup after the report collects garbage several times
    (to find unraisable exceptions), and a full collection of a worker's heap (thousands of tensors, buffers and
    compiled programs) took longer than that on a loaded machine: runs printed a KeyboardInterrupt inside a
    garbage-collector callback after every test had passed. Frozen objects are left out of later collections."""
    if getattr(session.config, "workerinput", None) is not None:
        gc.collect()
        gc.freeze()
