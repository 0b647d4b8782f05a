"""The `dummy` backend: "dummy:0" accepts every kernel and computes nothing; "dummy:<language>" devices render
every kernel to a target language and check that it compiles, without running it (scheduler and golden tests)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ember.backends.base import COMPLETED, Device, DeviceInfo, Event, MemoryPool, Program, Renderer
from ember.core.dtype import ALL_DTYPES, DType
from ember.core.errors import BackendUnavailable, CompileError
from ember.ir.ir import KernelIR


CompileCheck = Callable[[str, KernelIR], None]  # (source, kernel) -> None, or raises CompileError


@dataclass(frozen=True)
class RenderTarget:
    """A language a render-only device produces: how to make its renderer and its compile check.

    `make_check` raises BackendUnavailable when no compiler for the language is installed; the device then only
    renders, and `python -m ember info` says why. `limits`: DeviceInfo fields of the device it stands for (PTX: an
    H100's, so dummy:ptx renders the workgroup kernels a GPU gets, ir/group_reduce.py).
    """

    language: str
    make_renderer: Callable[[], Renderer]
    make_check: Callable[[], CompileCheck]
    supported_dtypes: Callable[[], frozenset[DType]] = lambda: frozenset(ALL_DTYPES)
    limits: dict[str, int] = field(default_factory=dict)


def _first_device(backend: str) -> Device:
    from ember.backends.registry import REGISTRY

    return REGISTRY.probe(backend)[0]  # raises BackendUnavailable with the backend's reason


def _c_renderer() -> Renderer:
    from ember.backends.c import CRenderer

    return CRenderer()


def _c_check() -> CompileCheck:
    from ember.backends.c import build_library, compiler_command

    _first_device("c")  # raises BackendUnavailable saying why there is no C compiler
    key_prefix = "dummy|" + " ".join(compiler_command())

    def check(source: str, kernel: KernelIR) -> None:
        build_library(source, key_prefix)  # cached on disk like the c backend's libraries

    return check


def _opencl_renderer() -> Renderer:
    try:
        return _first_device("opencl").renderer  # type: ignore[attr-defined]  # an OpenCLDevice, renderer fits it
    except BackendUnavailable:
        from ember.backends.opencl import OpenCLRenderer

        return OpenCLRenderer()


def _opencl_dtypes() -> frozenset[DType]:
    try:
        return _first_device("opencl").info.supported_dtypes
    except BackendUnavailable:
        return frozenset(ALL_DTYPES)


def _opencl_check() -> CompileCheck:
    device = _first_device("opencl")

    def check(source: str, kernel: KernelIR) -> None:
        device.build(source)  # type: ignore[attr-defined]  # an OpenCLDevice: shares its program caches

    return check


def _wgsl_renderer() -> Renderer:
    from ember.backends.wgsl import WGSLRenderer

    return WGSLRenderer(int64=True, float64=True)  # with wgpu-native's 64-bit extensions, as on lavapipe


def _wgsl_check() -> CompileCheck:
    """naga validates each shader through the wgpu device, opened at the first kernel (probing wgpu takes seconds);
    without a WebGPU adapter the WGSL is rendered but not validated."""
    opened: dict[str, Any] = {}

    def check(source: str, kernel: KernelIR) -> None:
        if "device" not in opened:
            try:
                opened["device"] = _first_device("wgpu").device  # type: ignore[attr-defined]
            except BackendUnavailable:
                opened["device"] = None
        if opened["device"] is not None:
            try:
                opened["device"].create_shader_module(code=source)
            except Exception as error:  # noqa: BLE001 - wgpu raises its own validation error types
                raise CompileError(f"naga rejected a kernel: {error}\n--- source ---\n{source}") from None

    return check


def _ptx_renderer() -> Renderer:
    from ember.backends.ptx import PTXRenderer

    return PTXRenderer()


def _ptx_check() -> CompileCheck:
    from ember.backends.ptx import ASSEMBLY_TARGETS, assemble, ptxas_path

    if ptxas_path() is None:
        raise BackendUnavailable("ptxas is not on PATH (it comes with the CUDA toolkit)")

    def check(source: str, kernel: KernelIR) -> None:
        for target in ASSEMBLY_TARGETS:  # rendered for sm_75, assembled for each newer architecture too
            assemble(source, target)

    return check


# an H100's (SXM) limits: 132 SMs, blocks of up to 1024 threads, 48 KiB of shared memory a block without the opt-in,
# warps of 32 (what the cuda backend reads from the driver), blocks of 256 as the cuda backend launches
H100_LIMITS = {"compute_units": 132, "max_local_size": 1024, "local_memory_bytes": 48 * 1024, "warp_width": 32,
               "preferred_local_size": 256}

TARGETS: dict[str, RenderTarget] = {
    "c": RenderTarget("C", _c_renderer, _c_check),
    "opencl": RenderTarget("OpenCL C", _opencl_renderer, _opencl_check, _opencl_dtypes),
    "wgsl": RenderTarget("WGSL", _wgsl_renderer, _wgsl_check),
    "ptx": RenderTarget("PTX", _ptx_renderer, _ptx_check, limits=H100_LIMITS),
}


class DummyMemoryPool(MemoryPool):
    """Holds no data: allocations are only counted and every read gives zeros."""

    def create_buffer(self, nbytes: int) -> Any:
        return nbytes

    def destroy_buffer(self, handle: Any) -> None:
        return None

    def copy_in(self, handle: Any, source: memoryview) -> None:
        return None

    def copy_out(self, destination: memoryview, handle: Any) -> None:
        destination[:] = bytes(len(destination))


class DummyProgram(Program):
    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        return COMPLETED


class DummyDevice(Device):
    """A device that never runs a kernel. `rendered` lists (kernel name, source) of every kernel compiled on it."""

    def __init__(self, name: str, target: RenderTarget | None = None) -> None:
        self.name = name
        self.pool = DummyMemoryPool(name)
        self.renderer: Renderer | None = None
        self.render_error = ""
        self.check: CompileCheck | None = None
        extra: dict[str, Any] = {"renders": "nothing"}
        supported = frozenset(ALL_DTYPES)
        limits: dict[str, int] = dict(target.limits) if target is not None else {}
        if target is not None:
            try:
                self.renderer = target.make_renderer()
                supported = target.supported_dtypes()
                extra["renders"] = target.language
            except Exception as error:  # noqa: BLE001 - a broken renderer module is reported, never fatal
                self.render_error = f"{type(error).__name__}: {error}"
                extra["renders"] = f"nothing: the {target.language} renderer failed to load ({self.render_error})"
            try:
                self.check = target.make_check()
                extra["compile_check"] = "yes"
            except BackendUnavailable as error:
                extra["compile_check"] = f"no ({error})"
        self.info = DeviceInfo(supported_dtypes=supported, can_run=False, extra=extra, **limits)  # type: ignore[arg-type]
        self.rendered: list[tuple[str, str]] = []
        self.kernels: list[KernelIR] = []

    def render(self, kernel: KernelIR) -> str:
        if self.render_error:
            raise BackendUnavailable(f"{self.name} cannot render kernels: {self.render_error}")
        return self.renderer.render(kernel) if self.renderer is not None else ""

    def compile(self, kernel: KernelIR) -> Program:
        source = self.render(kernel)
        if self.check is not None:
            self.check(source, kernel)
        self.rendered.append((kernel.name, source))
        self.kernels.append(kernel)
        return DummyProgram()

    def clear(self) -> None:
        """Forget the kernels rendered so far."""
        self.rendered.clear()
        self.kernels.clear()


def probe() -> list[Device]:
    """"dummy:0" .. "dummy:<n-1>" (n from the config, 8 by default, for placement and sharding tests) and one
    render-only device per target language; always available."""
    from ember.settings import CONFIG

    plain = [DummyDevice(f"dummy:{index}") for index in range(CONFIG.dummy_devices)]
    return [*plain, *(DummyDevice(f"dummy:{name}", target) for name, target in TARGETS.items())]
