"""The caches cannot break a run: an unusable cache folder, another kernel's payload under a key, a planted pickle,
a cache past its size bound, and a missing linker each cost a rebuild or a clear reason, never a crash."""

from __future__ import annotations

import gc
import io
import os
import pickle
import shutil
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ember as em
from ember import cache
from ember.backends import base
from ember.backends import c as c_backend
from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable
from ember.ir import lowered_cache
from ember.ir.ir import KernelIR
from ember.ir.opt import build_kernel_ir, optimizations_enabled
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch
from tests.conftest import TEST_DEVICES
from tests.helpers import run_float_kernel

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(folder))
    return folder


def run_child(code: str, environment: dict[str, str], prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run Python code in a fresh interpreter (process-wide state: the cache folder, warnings, loaded programs)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_RUNTIME_DIR": "/tmp", **environment}
    return subprocess.run([*prefix, sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                          env=full, timeout=300, cwd=ROOT, check=False)


# a computation on every test device of the child's, each checked against numpy; prints one line per device
COMPUTE = """
import numpy as np, ember as em
from tests.conftest import TEST_DEVICES
for device in TEST_DEVICES:
    values = np.linspace(-2, 2, 37, dtype=np.float32)
    x = em.tensor(values, device=device)
    result = ((x * 3 + 1).exp() - x.sum()).numpy()
    np.testing.assert_allclose(result, np.exp(values * 3 + 1) - values.sum(), rtol=1e-5, atol=1e-5)
    print("computed on", device)
"""


def _warnings_about(stderr: str, folder: Path) -> list[str]:
    return [line for line in stderr.splitlines() if "CacheWarning" in line and str(folder) in line]


# ---- an unusable cache folder costs a rebuild and one warning -----------------------------------------------------


@pytest.mark.parametrize("kind", ["a file", "under a file"])
def test_an_invalid_cache_folder_costs_a_rebuild_and_one_warning(tmp_path: Path, kind: str) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    folder = blocker if kind == "a file" else blocker / "ember"
    child = run_child(COMPUTE + COMPUTE, {"EMBER_CACHE_DIR": str(folder)})
    assert child.returncode == 0, child.stderr
    assert child.stdout.count("computed on") == 2 * len(TEST_DEVICES)
    warned = _warnings_about(child.stderr, folder)
    assert len(warned) == 1, child.stderr  # once per process, naming the folder and the reason
    assert "NotADirectoryError" in warned[0] or "FileExistsError" in warned[0], warned[0]


def _without_write_permission() -> tuple[str, ...]:
    """A command prefix under which the child cannot write a folder with mode 0555 (root ignores modes unless its
    capability to override them is dropped)."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a read-only folder cannot be simulated")
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")


def _make_read_only(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)


def test_a_read_only_cache_runs_from_the_cache(tmp_path: Path) -> None:
    """Every kernel cached, the folder read-only: the run loads them all (no compiler runs) without a warning."""
    folder = tmp_path / "cache"
    # (the second run probes c, which caches its compiler's target: the first probes it too, also where the test
    # devices are others, e.g. EMBER_TEST_DEVICES=cuda)
    probe_c = "from ember.backends.registry import REGISTRY\nREGISTRY.probe('c')\n"
    first = run_child(probe_c + COMPUTE, {"EMBER_CACHE_DIR": str(folder)})
    assert first.returncode == 0, first.stderr
    _make_read_only(folder)
    try:
        no_compiler = ("import ember.backends.c as c_backend\nfrom ember.backends.registry import REGISTRY\n"
                       "REGISTRY.probe('c')\n"
                       "class NoCompiler:\n"
                       "    def run(self, *arguments, **keywords): raise AssertionError('the C compiler ran')\n"
                       "c_backend.subprocess = NoCompiler()\n")
        second = run_child(no_compiler + COMPUTE, {"EMBER_CACHE_DIR": str(folder)}, _without_write_permission())
        assert second.returncode == 0, second.stderr
        assert second.stdout.count("computed on") == len(TEST_DEVICES)
        assert _warnings_about(second.stderr, folder) == [], second.stderr
    finally:
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


def test_a_read_only_empty_cache_costs_a_rebuild_and_one_warning(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        child = run_child(COMPUTE + COMPUTE, {"EMBER_CACHE_DIR": str(folder)}, _without_write_permission())
        assert child.returncode == 0, child.stderr
        assert child.stdout.count("computed on") == 2 * len(TEST_DEVICES)
        warned = _warnings_about(child.stderr, folder)
        assert len(warned) == 1 and "PermissionError" in warned[0], child.stderr
    finally:
        folder.chmod(0o755)


def test_scratch_folders_fall_back_to_the_system_temporary_folder(cache_folder: Path) -> None:
    cache_folder.write_text("a file")
    with pytest.warns(cache.CacheWarning, match=str(cache_folder)), cache.scratch_directory("c", "ember-test-") as work:
        assert work.is_dir() and cache_folder not in work.parents


# ---- a valid entry holding another kernel's payload is discarded and rebuilt ------------------------------------


def _two_kernels(backend: str) -> tuple[Any, KernelIR, KernelIR]:
    """A device of the backend and two different kernels lowered for it: x * 3 + 1 and x * 5 - 2."""
    try:
        device = REGISTRY.probe(backend)[0]
    except BackendUnavailable as error:
        pytest.skip(f"no {backend} device here: {error}")
    x = em.tensor(np.arange(17, dtype=np.float32), device=device.name)
    irs = []
    for number, value in enumerate((x * 3 + 1, x * 5 - 2)):
        (item,) = [item for item in kernelize([value.node]) if isinstance(item, Launch)]
        irs.append(build_kernel_ir(item.kernel, f"ember_robust_{number}", device.info))
    return device, irs[0], irs[1]


def _fresh_device(backend: str, template: Any) -> Any:
    if backend == "c":
        return c_backend.CDevice("c:robust")
    from ember.backends import opencl

    device = opencl.OpenCLDevice("opencl:robust", template.cl_device)
    device.caches_launched_binaries = True
    return device


EXPECTED = (np.arange(17, dtype=np.float32) * 3 + 1, np.arange(17, dtype=np.float32) * 5 - 2)


@pytest.mark.parametrize("backend", ["c", "opencl"])
def test_another_kernels_payload_under_a_key_is_rebuilt(backend: str, cache_folder: Path) -> None:
    """Swap the payloads of two kernels' entries (each entry still passes every check of its format): each kernel
    still computes its own values, its entry is rewritten, and later runs load it."""
    template, first, second = _two_kernels(backend)
    for ir, expected in zip((first, second), EXPECTED):
        np.testing.assert_array_equal(run_float_kernel(_fresh_device(backend, template), ir), expected)
    folders = [cache_folder / backend] + ([cache_folder / "c-index"] if backend == "c" else [])
    for folder in folders:
        entries = sorted(folder.glob("*.entry"))
        assert len(entries) == 2, entries
        payloads = [cache.read_entry(entry) for entry in entries]
        for entry, payload in zip(entries, reversed(payloads)):
            cache.write_entry(entry, payload)  # a well-formed entry of this key, holding the other's payload
    for _ in range(2):  # the swapped entries are found out and replaced; the rebuilt ones are then used
        for ir, expected in zip((first, second), EXPECTED):
            np.testing.assert_array_equal(run_float_kernel(_fresh_device(backend, template), ir), expected)


def test_a_c_library_lacking_the_kernels_is_discarded(cache_folder: Path) -> None:
    prefix = "robustness test"
    source = "void ember_robust_a(float* data0) { data0[0] = 1.0f; }\n"
    library, entry = c_backend.build_library(source, prefix, names=["ember_robust_a"])
    other = "void ember_robust_b(float* data0) { data0[0] = 2.0f; }\n"
    other_entry = cache.entry_path("c", prefix + "\n" + other)
    cache.write_entry(other_entry, cache.read_entry(entry))  # planted: a's library under b's key
    assert c_backend.load_library(other_entry, ["ember_robust_b"]) is None and not other_entry.exists()
    rebuilt, rebuilt_entry = c_backend.build_library(other, prefix, names=["ember_robust_b"])
    assert rebuilt_entry == other_entry and c_backend.defines(rebuilt, ["ember_robust_b"])


def test_another_kernels_lowered_ir_is_lowered_again(cache_folder: Path) -> None:
    template, first, second = _two_kernels("c")
    x = em.tensor(np.arange(17, dtype=np.float32), device=template.name)
    kernels = [[item for item in kernelize([value.node]) if isinstance(item, Launch)][0].kernel
               for value in (x * 3 + 1, x * 7)]
    paths = [lowered_cache.entry_path(kernel, f"robust_{number}", template.info, optimizations_enabled())
             for number, kernel in enumerate(kernels)]
    for number, (kernel, path) in enumerate(zip(kernels, paths)):
        build_kernel_ir(kernel, f"robust_{number}", template.info)
        assert lowered_cache.load(path, kernel, f"robust_{number}") is not None
    cache.write_entry(paths[1], cache.read_entry(paths[0]))  # kernel 0's IR under kernel 1's key
    assert lowered_cache.load(paths[1], kernels[1], "robust_1") is None and not paths[1].exists()
    relowered = build_kernel_ir(kernels[1], "robust_1", template.info)
    np.testing.assert_array_equal(run_float_kernel(c_backend.CDevice("c:robust"), relowered),
                                  np.arange(17, dtype=np.float32) * 7)


# ---- nothing in the cache runs code when it is read ---------------------------------------------------------------


MARKER_CALLS: list[str] = []


def planted_marker(text: str) -> str:
    """What a planted pickle calls when it is unpickled (it must never be)."""
    MARKER_CALLS.append(text)
    return text


class _Planted:
    def __init__(self, function: Any, argument: str) -> None:
        self.function, self.argument = function, argument

    def __reduce__(self) -> tuple:
        return self.function, (self.argument,)


@pytest.mark.parametrize("function", [planted_marker, os.system, eval])
def test_a_planted_pickle_in_the_ir_cache_runs_nothing(function: Any, cache_folder: Path, tmp_path: Path) -> None:
    template, ir, _ = _two_kernels("c")
    x = em.tensor(np.arange(17, dtype=np.float32), device=template.name)
    (item,) = [item for item in kernelize([(x * 3 + 1).node]) if isinstance(item, Launch)]
    path = lowered_cache.entry_path(item.kernel, "planted", template.info, optimizations_enabled())
    touched = tmp_path / "touched"
    argument = {planted_marker: "called", os.system: f"touch {touched}",
                eval: f"open({str(touched)!r}, 'w').close()"}[function]
    payload = pickle.dumps(_Planted(function, argument))
    with pytest.raises(pickle.UnpicklingError):  # the pickle would run the function (checked without the guard)
        lowered_cache._Unpickler(io.BytesIO(payload)).load()
    cache.write_entry(path, payload)  # an entry that passes every check of the format
    MARKER_CALLS.clear()
    assert lowered_cache.load(path, item.kernel, "planted") is None
    assert MARKER_CALLS == [] and not touched.exists() and not path.exists()
    lowered = build_kernel_ir(item.kernel, "planted", template.info)  # lowered again, and cached
    np.testing.assert_array_equal(run_float_kernel(c_backend.CDevice("c:robust"), lowered), EXPECTED[0])
    assert lowered_cache.load(path, item.kernel, "planted") is not None


def test_the_ir_unpickler_admits_ember_ir() -> None:
    template, ir, _ = _two_kernels("c")
    buffer = io.BytesIO()
    lowered_cache._Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(lowered_cache._flatten(ir))
    loaded = lowered_cache._unflatten(lowered_cache._Unpickler(io.BytesIO(buffer.getvalue())).load())
    assert template.render(loaded) == template.render(ir)


# ---- bounds: programs in memory, bytes on disk ------------------------------------------------------------------


def test_a_device_keeps_a_bounded_number_of_programs_and_unloads_the_rest(cache_folder: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "PROGRAMS_KEPT", 4)
    device = c_backend.CDevice("c:robust")
    libraries = []
    for size in range(1, 11):  # ten shapes, ten kernels
        x = em.tensor(np.arange(size, dtype=np.float32), device="c")
        (item,) = [item for item in kernelize([(x * 2 + size).node]) if isinstance(item, Launch)]
        ir = build_kernel_ir(item.kernel, f"bounded_{size}", device.info)
        np.testing.assert_array_equal(run_float_kernel(device, ir), np.arange(size, dtype=np.float32) * 2 + size)
        libraries.append(weakref.ref(device._programs.get(device.render(ir)).library))
    gc.collect()
    assert len(device._programs) == 4
    assert sum(library() is not None for library in libraries) == 4  # the others were released (dlclosed)
    assert len(device._libraries) == 4


def test_program_table_is_least_recently_used() -> None:
    table: base.ProgramTable[str, int] = base.ProgramTable(limit=2)
    table.put("a", 1)
    table.put("b", 2)
    assert table.get("a") == 1  # a is now the most recently used
    table.put("c", 3)
    assert "b" not in table and table.get("a") == 1 and table.get("c") == 3 and len(table) == 2


def test_the_disk_cache_is_trimmed_to_its_bound(cache_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache.LIMIT_VARIABLE, "10MB")
    payload = bytes(10_000)
    paths = [cache.store("unit", f"key {number}", payload) for number in range(30)]
    cache.wait_for_trim()  # (the first write's trim, in its thread: done before the bound shrinks)
    monkeypatch.setenv(cache.LIMIT_VARIABLE, "100KB")
    assert cache.limit_bytes() == 100_000
    for age, path in enumerate(reversed(paths)):  # the first written is the least recently used
        os.utime(path, (1_000_000 - age, 1_000_000 - age))
    assert cache.load("unit", "key 0") == payload  # a hit marks it used: it survives the trim
    stale = cache_folder / "unit" / "left.entry.123.456.tmp"
    stale.write_bytes(b"half an entry")
    os.utime(stale, (1_000, 1_000))
    cache.trim()
    kept = sorted((cache_folder / "unit").glob("*.entry"))
    assert sum(path.stat().st_size for path in kept) <= 100_000
    assert paths[0] in kept and paths[-1] in kept and paths[1] not in kept
    assert not stale.exists()
    for number in range(30, 60):  # writes trim on their own as they go (in a thread: wait for the last one)
        cache.store("unit", f"key {number}", payload)
        cache.wait_for_trim()
    assert sum(path.stat().st_size for path in (cache_folder / "unit").glob("*.entry")) <= 100_000 + 2 * 10_100


def test_a_trim_of_many_entries_keeps_little_in_memory_and_runs_beside_the_write(
        cache_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trim lists the entries streamed, keeping 16 bytes of each (a list of every entry's path and status was
    ~1 KB an entry: ~500 MB for a cache of 446,000 lowered kernels, in each process that wrote one), and deletes the
    least recently used down to TRIM_TO of the bound; a write that finds a trim due starts it in a thread of its
    own and returns."""
    import threading
    import tracemalloc

    folder = cache_folder / "many"
    folder.mkdir(parents=True)
    count, size = 20_000, 100
    for number in range(count):
        path = folder / f"{number:064x}.entry"
        path.write_bytes(bytes(size))
        os.utime(path, (1_000_000 + number, 1_000_000 + number))  # entry n is the n-th least recently used
    tracemalloc.start()
    try:
        deleted = cache.trim(limit=count * size // 2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, peak  # (the list of paths and statuses: ~20 MB for these entries)
    kept = sorted(path.name for path in folder.glob("*.entry"))
    assert deleted == (count - len(kept)) * size and len(kept) * size <= count * size // 2 * cache.TRIM_TO
    assert kept == [f"{number:064x}.entry" for number in range(count - len(kept), count)]  # the newest kept
    started = threading.Event()
    release = threading.Event()

    def slow_trim(limit: int | None = None) -> int:
        started.set()
        release.wait(10)
        return 0

    monkeypatch.setattr(cache, "trim", slow_trim)
    monkeypatch.setattr(cache, "_written_since_trim", None)  # this process's first write: a trim is due
    cache.store("unit", "key", b"payload")  # returns while the trim runs
    assert started.wait(10) and cache.load("unit", "key") == b"payload"
    release.set()
    cache.wait_for_trim()


def test_a_bad_cache_limit_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache.LIMIT_VARIABLE, "lots")
    with pytest.raises(ValueError, match=cache.LIMIT_VARIABLE):
        cache.limit_bytes()


# ---- a missing linker makes a backend unavailable, with the reason ---------------------------------------------


def test_without_a_linker_backends_say_why_and_nothing_aborts(tmp_path: Path) -> None:
    """PATH holds the compiler and Python but no `ld`: c is unavailable (its compiler cannot link), so is PoCL's
    OpenCL (it links every kernel with ld, and aborts the process without it), and the run goes on elsewhere."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None or shutil.which("ld") is None:
        pytest.skip("needs a C compiler and ld, to take ld away")
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("cc", "gcc", "nice", "uname"):
        found = shutil.which(name)
        if found is not None:
            (tools / name).symlink_to(found)
    code = ("import ember as em, numpy as np\nfrom ember.__main__ import collect_info\n"
            "info = collect_info()\n"
            "for name in ('c', 'opencl'):\n"
            "    entry = info['backends'][name]\n"
            "    print(name, 'available' if entry['available'] else 'unavailable: ' + entry['reason'])\n"
            "try:\n"
            "    print('computed', (em.tensor([1.0, 2.0]) * 2).numpy().tolist())\n"
            "except em.DeviceError as error:\n"
            "    print('no device:', error)\n")
    child = run_child(code, {"PATH": str(tools), "EMBER_CACHE_DIR": str(tmp_path / "cache")})
    assert child.returncode == 0, child.stderr  # no abort, no traceback
    lines = dict(line.split(" ", 1) for line in child.stdout.splitlines())
    assert lines["c"].startswith("unavailable:") and "'ld'" in lines["c"], child.stdout
    import importlib.util

    if importlib.util.find_spec("pyopencl") is not None and "opencl" in REGISTRY.backend_names():
        assert lines["opencl"].startswith("unavailable:"), child.stdout
    assert lines.get("computed") == "[2.0, 4.0]" or "no device" in lines, child.stdout
    info = subprocess.run([sys.executable, "-m", "ember", "info"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": str(tools), "PYTHONPATH": str(ROOT),
                               "EMBER_CACHE_DIR": str(tmp_path / "cache")}, cwd=ROOT, check=False)
    assert info.returncode == 0, info.stderr
    assert "c: unavailable: the C compiler" in info.stdout and "'ld' is not on PATH" in info.stdout
