"""The worked example of manuals/adding-a-backend.md (examples/backend_example): it is found through the
`ember.backends` entry point once installed, without touching ember, and its results match PyTorch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch

import ember as em
from ember.backends import registry
from ember.backends.registry import REGISTRY, Registry
from ember.core.errors import DeviceError
from tests.helpers import assert_close, random_array

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "backend_example"


@pytest.fixture(scope="module")
def python_device() -> str:
    """The example backend registered as "python" for this module's tests (installed, it comes by entry point)."""
    sys.path.insert(0, str(EXAMPLE))
    REGISTRY.modules["python"] = "ember_python_backend"
    try:
        yield REGISTRY.probe("python")[0].name
    finally:
        REGISTRY.modules.pop("python", None)
        REGISTRY.devices.pop("python", None)
        sys.path.remove(str(EXAMPLE))


def test_an_entry_point_adds_a_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    point = metadata.EntryPoint(name="python", value="ember_python_backend", group="ember.backends")
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [point] if group == "ember.backends" else [])
    fresh = Registry()
    assert "python" in fresh.backend_names()
    assert [device.name for device in fresh.probe("python")] == ["python:0"]


def test_a_broken_entry_point_is_reported_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    point = metadata.EntryPoint(name="broken", value="ember_no_such_module", group="ember.backends")
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [point] if group == "ember.backends" else [])
    fresh = Registry()
    assert "broken" not in fresh.available()
    assert "ModuleNotFoundError" in fresh.unavailable["broken"]


def test_the_installed_package_is_found_by_a_fresh_process(tmp_path: Path) -> None:
    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(EXAMPLE)], capture_output=True, text=True, check=False)
    assert install.returncode == 0, install.stderr
    script = textwrap.dedent("""
        import ember as em
        x = em.tensor([[1.0, -2.0], [3.0, 4.0]], device="python")
        print(x.device, (x @ x.T).relu().sum().item())
    """)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["python:0", "30.0"]


def test_the_example_matches_torch(python_device: str) -> None:
    a_data, b_data = random_array((3, 1, 5)), random_array((4, 1), seed=1)
    a, ta = em.tensor(a_data, device=python_device), torch.tensor(a_data)
    b, tb = em.tensor(b_data, device=python_device), torch.tensor(b_data)
    assert_close((a * b + 1).exp().sqrt(), (ta * tb + 1).exp().sqrt())
    assert_close(a.sum(-1), ta.sum(-1))
    assert_close(a.amax((0, 2)), ta.amax((0, 2)))
    assert_close(a[:, 0] @ a[:, 0].T, ta[:, 0] @ ta[:, 0].T, atol=1e-5)
    assert_close(a.permute(2, 0, 1).pad((1, 2)), torch.nn.functional.pad(ta.permute(2, 0, 1), (1, 2)))
    assert_close(a.softmax(-1).log(), ta.softmax(-1).log())
    assert_close(a.argmax(-1), ta.argmax(-1))
    nan = em.tensor([float("nan"), 1.0, -1.0], device=python_device)
    tnan = torch.tensor([float("nan"), 1.0, -1.0])
    assert_close(nan.maximum(nan * 0 + 0.5), tnan.maximum(tnan * 0 + 0.5))
    assert_close(em.where(nan.isnan(), 0.0, nan), torch.where(tnan.isnan(), 0.0, tnan))
    small = em.tensor(np.array([100, -100, 7], dtype=np.int8), device=python_device)
    tsmall = torch.tensor([100, -100, 7], dtype=torch.int8)
    assert_close(small * 3, tsmall * 3)
    assert_close(small // 3, tsmall // 3)
    assert_close(small.float() / 3, tsmall.float() / 3)


def test_the_capability_table_refuses_half_precision(python_device: str) -> None:
    x = em.tensor([1.0, 2.0], device=python_device)
    with pytest.raises(DeviceError, match="python:0 cannot run kernels on float16"):
        x.half().realize()


def test_import_ember_loads_no_driver_and_survives_broken_ones(tmp_path: Path) -> None:
    """Drivers are imported only when a backend is probed; a broken one is a reason in `ember info`, not a crash.
    (Broken stand-ins for every driver package, so the result is the same on machines with and without a GPU.)"""
    for package in ("wgpu", "pyopencl", "cuda"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f"raise RuntimeError('{package} is broken here')\n")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    check = "import sys, ember; print(sorted({m.split('.')[0] for m in sys.modules} & {'wgpu', 'pyopencl', 'cuda'}))"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=environment,
                            check=False)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
    info = subprocess.run([sys.executable, "-m", "ember", "info"], capture_output=True, text=True, env=environment,
                          check=False)
    assert info.returncode == 0, info.stderr
    assert "wgpu: unavailable: RuntimeError: wgpu is broken here" in info.stdout
    assert "opencl: unavailable" in info.stdout and "pyopencl is broken here" in info.stdout
    assert "cuda: unavailable: RuntimeError: cuda is broken here" in info.stdout
