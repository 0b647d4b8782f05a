"""The disk cache (ember/cache.py): one checked entry format; damaged entries of every backend that caches are
deleted and rebuilt, never handed to a loader or a driver."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ember as em
from ember import cache
from ember.backends import c as c_backend
from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable
from ember.ir.ir import KernelIR
from ember.ir.opt import build_kernel_ir
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch
from tests.helpers import run_float_kernel

# ---- the entry format --------------------------------------------------------------------------------------------


@pytest.fixture
def cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_an_entry_round_trips_with_its_header(cache_folder: Path) -> None:
    payload = bytes(range(256)) * 5
    path = cache.store("unit", "some key", payload)
    assert path.parent == cache_folder / "unit" and path.name == hashlib.sha256(b"some key").hexdigest() + ".entry"
    data = path.read_bytes()
    assert data.startswith(cache.MAGIC) and data.endswith(payload)
    assert hashlib.sha256(b"some key").digest() in data[:100] and hashlib.sha256(payload).digest() in data[:100]
    assert cache.load("unit", "some key") == payload
    assert cache.load("unit", "another key") is None
    assert [entry.name for entry in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def _truncated(data: bytes) -> bytes:
    return data[: len(data) - 7]


def _flipped(data: bytes) -> bytes:
    middle = len(data) - 40
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1:]


def _header_only(data: bytes) -> bytes:
    return data[: len(cache.MAGIC) + 10]


def _other_version(data: bytes) -> bytes:
    version = len(cache.MAGIC)
    return data[:version] + (cache.FORMAT_VERSION + 1).to_bytes(4, "little") + data[version + 4:]


DAMAGES: dict[str, Callable[[bytes], bytes]] = {"truncated": _truncated, "flipped byte": _flipped,
                                                "header only": _header_only, "other version": _other_version,
                                                "empty": lambda data: b""}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_entry_is_deleted(cache_folder: Path, damage: str) -> None:
    path = cache.store("unit", "key", b"payload " * 100)
    path.write_bytes(DAMAGES[damage](path.read_bytes()))
    assert cache.load("unit", "key") is None and not path.exists()


def test_an_entry_moved_to_another_key_is_refused(cache_folder: Path) -> None:
    path = cache.store("unit", "key", b"payload")
    path.rename(cache.entry_path("unit", "other key"))
    assert cache.load("unit", "other key") is None


# ---- each backend that caches: damage its entries, compile again --------------------------------------------------


def _kernel_for(backend: str) -> tuple[Any, KernelIR]:
    """A device of the backend and the IR of x * 3 + 1 lowered for it."""
    try:
        device = REGISTRY.probe(backend)[0]
    except BackendUnavailable as error:
        pytest.skip(f"no {backend} device here: {error}")
    x = em.tensor(np.arange(17, dtype=np.float32), device=device.name)
    (item,) = [item for item in kernelize([(x * 3 + 1).node]) if isinstance(item, Launch)]
    return device, build_kernel_ir(item.kernel, "ember_cache_test", device.info)


def _fresh_c_device(template: Any) -> Any:
    return c_backend.CDevice("c:cache-test")


def _fresh_opencl_device(template: Any) -> Any:
    from ember.backends import opencl

    device = opencl.OpenCLDevice("opencl:cache-test", template.cl_device)
    device.caches_launched_binaries = True  # as for drivers other than PoCL (which caches kernels itself)
    return device


def _count_c_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    builds: list[str] = []
    original = c_backend.subprocess.run

    def counting(*arguments: Any, **keywords: Any) -> Any:
        builds.append("cc")
        return original(*arguments, **keywords)

    monkeypatch.setattr(c_backend.subprocess, "run", counting)
    return builds


def _count_opencl_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from ember.backends import opencl

    builds: list[str] = []
    original = opencl.cl.Program

    def counting(*arguments: Any) -> Any:
        if len(arguments) == 2:  # from source (a binary comes as three arguments)
            builds.append("source")
        return original(*arguments)

    monkeypatch.setattr(opencl.cl, "Program", counting)
    return builds


def test_a_c_kernel_built_in_a_batch_is_found_alone(cache_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler's batches depend on timing: a later process must find each kernel whatever batch built it."""
    template, ir = _kernel_for("c")
    x = em.tensor(np.arange(17, dtype=np.float32), device=template.name)
    (item,) = [item for item in kernelize([(x * 5 - 2).node]) if isinstance(item, Launch)]
    other = build_kernel_ir(item.kernel, "ember_cache_test_other", template.info)
    c_backend.CDevice("c:cache-test").compile_many([ir, other])  # one library holding both
    builds = _count_c_builds(monkeypatch)
    np.testing.assert_array_equal(run_float_kernel(c_backend.CDevice("c:cache-test"), other),
                                  np.arange(17, dtype=np.float32) * 5 - 2)
    np.testing.assert_array_equal(run_float_kernel(c_backend.CDevice("c:cache-test"), ir),
                                  np.arange(17, dtype=np.float32) * 3 + 1)
    assert builds == []


BACKENDS = {"c": ("c", _fresh_c_device, _count_c_builds), "opencl": ("opencl", _fresh_opencl_device,
                                                                      _count_opencl_builds)}


@pytest.mark.parametrize("damage", [*DAMAGES, "valid entry, payload the loader rejects"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_damaged_entries_are_rebuilt(backend: str, damage: str, cache_folder: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    folder, fresh_device, count_builds = BACKENDS[backend]
    template, ir = _kernel_for(backend)
    expected = np.arange(17, dtype=np.float32) * 3 + 1
    np.testing.assert_array_equal(run_float_kernel(fresh_device(template), ir), expected)  # compiles and writes the entry
    (entry,) = (cache_folder / folder).iterdir()
    builds = count_builds(monkeypatch)
    np.testing.assert_array_equal(run_float_kernel(fresh_device(template), ir), expected)
    assert builds == []  # loaded from the disk cache
    if damage in DAMAGES:
        entry.write_bytes(DAMAGES[damage](entry.read_bytes()))
    else:  # passes every check of the entry: the loader (dlopen, the OpenCL driver) refuses it, then it is rebuilt
        cache.write_entry(entry, b"B" + b"not a shared library nor a program binary" * 10)
    np.testing.assert_array_equal(run_float_kernel(fresh_device(template), ir), expected)
    assert len(builds) == 1  # rebuilt from source
    assert cache.read_entry(entry) is not None  # and the rebuilt entry written again, whole
    np.testing.assert_array_equal(run_float_kernel(fresh_device(template), ir), expected)
    assert len(builds) == 1
