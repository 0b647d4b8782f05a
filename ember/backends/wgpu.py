"""The `wgpu` backend: kernel IR to WGSL, run through wgpu-py (WebGPU on Vulkan, Metal or D3D12; on a CPU, Mesa's
lavapipe). The wgpu package is imported only when the backend is probed."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ember.backends.base import Device, DeviceInfo, Event, MemoryPool, Program, ProgramTable, launch_geometry
from ember.backends.wgsl import MAX_WORKGROUPS_PER_DIMENSION, WORKGROUP_SIZE, WGSLRenderer
from ember.core import dtype as dtypes
from ember.core.errors import BackendUnavailable, CompileError, DeviceError
from ember.ir.ir import KernelIR
from ember.ir.linearize import loop_iterations

# Adapter limits ember asks for in full (WebGPU's defaults are far lower than what adapters give).
REQUESTED_LIMITS = ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
                    "max-compute-workgroups-per-dimension", "max-bindings-per-bind-group",
                    # what DeviceInfo reports for workgroup kernels (ir/group_reduce.py)
                    "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
                    "max-compute-workgroup-size-x")
NATIVE_FEATURES = ("shader-int64", "shader-f64")  # wgpu-native extensions beyond WebGPU
LLVMPIPE_LOOP_LIMIT = 65535  # gallivm's LP_MAX_TGSI_LOOP_ITERATIONS: loop iterations per invocation, all loops
PORTABLE_ENVIRONMENT = "EMBER_WGPU_PORTABLE"  # "1": standard WebGPU only (no i64/u64/f64), as in a browser


def wait_idle(device: Any) -> None:
    """Block until the GPU has finished everything submitted to the device's queue."""
    poll = getattr(device, "_poll_wait", None)  # wgpuDevicePoll(wait=True)
    if poll is not None:
        poll()
    else:  # a read maps a buffer, which waits for the queue (queue.on_submitted_work_done_sync is broken in 0.32)
        device.queue.read_buffer(device.create_buffer(size=4, usage=0x0004 | 0x0001), 0, 4)


def queue_is_empty(device: Any) -> bool:
    """Whether everything submitted to the device's queue has finished, without blocking (False when unknown)."""
    try:
        from wgpu.backends.wgpu_native._api import ffi, libf
    except ImportError:
        return False
    # wgpuDevicePoll(wait=False) returns whether the queue is empty; only the low byte of its WGPUBool is defined
    return bool(libf.wgpuDevicePoll(device._internal, False, ffi.NULL) & 0xFF)


class WGPUQueue:
    """Counts a device's submissions and how many of them are known to have finished."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.submitted = 0
        self.finished = 0

    def submit(self, command_buffers: list[Any]) -> WGPUEvent:
        self.device.queue.submit(command_buffers)
        self.submitted += 1
        return WGPUEvent(self, self.submitted)

    def is_finished(self, number: int) -> bool:
        if number > self.finished and queue_is_empty(self.device):
            self.finished = self.submitted
        return number <= self.finished

    def wait(self, number: int) -> None:
        if number > self.finished:
            submitted = self.submitted
            wait_idle(self.device)
            self.finished = submitted


class WGPUEvent(Event):
    """Completion of the work submitted to a device's queue up to some submission; `done` asks the device without
    blocking, so buffers dropped while a kernel used them are freed once it has run."""

    def __init__(self, queue: WGPUQueue, number: int) -> None:
        self.queue = queue
        self.number = number

    def wait(self) -> None:
        self.queue.wait(self.number)

    @property
    def done(self) -> bool:
        return self.queue.is_finished(self.number)


class WGPUMemoryPool(MemoryPool):
    """GPU buffers (storage, copy source and destination), sizes rounded up to whole 4-byte words."""

    frees_behind_events = True  # WebGPU frees a destroyed buffer once the submitted work using it has completed

    def __init__(self, name: str, device: Any, max_buffer_bytes: int) -> None:
        super().__init__(name)
        self.device = device
        self.max_buffer_bytes = max_buffer_bytes

    def create_buffer(self, nbytes: int) -> Any:
        import wgpu

        if nbytes > self.max_buffer_bytes:
            raise DeviceError(
                f"{self.name} cannot hold a buffer of {nbytes} bytes: the adapter binds at most "
                f"{self.max_buffer_bytes} bytes per buffer; use a smaller tensor or another device"
            )
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        # at least 8 bytes: a binding must hold one element of its array type (an empty int64 input too)
        return self.device.create_buffer(size=max(8, _whole_words(nbytes)), usage=usage)

    def destroy_buffer(self, handle: Any) -> None:
        handle.destroy()

    def copy_in(self, handle: Any, source: memoryview) -> None:
        data = bytes(source)
        padding = _whole_words(len(data)) - len(data)
        self.device.queue.write_buffer(handle, 0, data + bytes(padding) if padding else data)

    def copy_out(self, destination: memoryview, handle: Any) -> None:
        size = len(destination)
        if size:
            destination[:] = self.device.queue.read_buffer(handle, 0, _whole_words(size))[:size]


def _whole_words(nbytes: int) -> int:
    return max(4, (nbytes + 3) // 4 * 4)


class WGPUProgram(Program):
    """A compute pipeline with its shader module and bind group layout, built once; a launch only binds buffers.

    WebGPU forbids one buffer bound read-only and read-write in one dispatch. A launch whose output buffer is also
    an input (an in-place update, scheduler/in_place.py, or a replay of one) uses a variant of the pipeline that
    declares those inputs read_write too (a buffer may be bound read_write more than once), made at its first use."""

    def __init__(self, queue: WGPUQueue, source: str, kernel: KernelIR, dispatch: tuple[int, int, int],
                 info: DeviceInfo | None = None) -> None:
        self.queue = queue
        self.device = queue.device
        self.dispatch = dispatch
        # a shape class's kernel (its global size known at launch): the groups of each launch's size, by `info`
        self.info = info if kernel.size_parameter is not None else None
        self.source = source
        self.kernel = kernel
        self.pipeline, self.bind_group_layout = self._pipeline(())
        # by the input positions bound to the output's buffer: (pipeline, bind group layout)
        self.variants: dict[tuple[int, ...], tuple[Any, Any]] = {(): (self.pipeline, self.bind_group_layout)}

    def _pipeline(self, writable: tuple[int, ...]) -> tuple[Any, Any]:
        """The pipeline and its bind group layout, with the inputs at the positions `writable` bound read_write."""
        import wgpu

        source = self.source
        for position in writable:
            declaration = f"@binding({position}) var<storage, read> "
            assert declaration in source, declaration
            source = source.replace(declaration, f"@binding({position}) var<storage, read_write> ")
        entries = [
            {
                "binding": param.position,
                "visibility": wgpu.ShaderStage.COMPUTE,
                "buffer": {"type": wgpu.BufferBindingType.storage if param.is_output or param.position in writable
                           else wgpu.BufferBindingType.read_only_storage},
            }
            for param in self.kernel.params
        ]
        module = self.device.create_shader_module(code=source)
        bind_group_layout = self.device.create_bind_group_layout(entries=entries)
        layout = self.device.create_pipeline_layout(bind_group_layouts=[bind_group_layout])
        pipeline = self.device.create_compute_pipeline(
            layout=layout, compute={"module": module, "entry_point": self.kernel.name}
        )
        return pipeline, bind_group_layout

    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        # one queue executes in submission order, so earlier launches need no explicit wait
        return self._submit(*self._bind_group(buffers), self._dispatch(global_size))

    def bind(self, buffers: list[Any], global_size: int) -> Callable[[tuple[Event, ...]], Event]:
        pipeline, bind_group = self._bind_group(buffers)  # made once (it holds the buffers)
        dispatch = self._dispatch(global_size)
        return lambda wait_for: self._submit(pipeline, bind_group, dispatch)

    def _dispatch(self, global_size: int) -> tuple[int, int, int]:
        return self.dispatch if self.info is None else launch_geometry(global_size, self.info,
                                                                       exact_local_size=self.kernel.local_size)[0]

    def _bind_group(self, buffers: list[Any]) -> tuple[Any, Any]:
        """The pipeline for these buffers (a variant where the output's buffer is also an input) and their bind
        group."""
        output = buffers[0]
        writable = tuple(position for position in range(1, len(buffers)) if buffers[position] is output)
        variant = self.variants.get(writable)
        if variant is None:
            variant = self.variants[writable] = self._pipeline(writable)
        pipeline, bind_group_layout = variant
        bind_group = self.device.create_bind_group(
            layout=bind_group_layout,
            entries=[{"binding": position, "resource": {"buffer": buffer}} for position, buffer in enumerate(buffers)],
        )
        return pipeline, bind_group

    def _submit(self, pipeline: Any, bind_group: Any, dispatch: tuple[int, int, int]) -> Event:
        encoder = self.device.create_command_encoder()
        compute_pass = encoder.begin_compute_pass()
        compute_pass.set_pipeline(pipeline)
        compute_pass.set_bind_group(0, bind_group)
        compute_pass.dispatch_workgroups(*dispatch)
        compute_pass.end()
        return self.queue.submit([encoder.finish()])


class WGPUDevice(Device):
    """One WebGPU adapter. i64/u64/f64 are used when the adapter offers wgpu-native's shader-int64/shader-f64
    (unless EMBER_WGPU_PORTABLE=1); otherwise kernels on those dtypes are refused by the capability table."""

    def __init__(self, adapter: Any, name: str = "wgpu:0", portable: bool | None = None) -> None:
        if portable is None:
            portable = os.environ.get(PORTABLE_ENVIRONMENT, "0") not in ("", "0")
        offered = set(adapter.features)
        features = [] if portable else [feature for feature in NATIVE_FEATURES if feature in offered]
        limits = {key: adapter.limits[key] for key in REQUESTED_LIMITS if key in adapter.limits}
        self.adapter = adapter
        self.device = adapter.request_device_sync(required_features=features, required_limits=limits)
        self.name = name
        int64 = "shader-int64" in features
        float64 = int64 and "shader-f64" in features  # the f64 math expansions work on i64 bits
        unsupported = set()
        if not int64:
            unsupported |= {dtypes.int64, dtypes.uint64}
        if not float64:
            unsupported.add(dtypes.float64)
        adapter_info = adapter.info
        # Mesa's llvmpipe (lavapipe) stops a shader invocation after 65535 loop iterations in all, silently
        self.loop_limit = LLVMPIPE_LOOP_LIMIT if "llvmpipe" in str(adapter_info.get("device", "")).lower() else None
        max_buffer_bytes = min(limits.get("max-storage-buffer-binding-size", 2**27),
                               limits.get("max-buffer-size", 2**28))
        self.info = DeviceInfo(
            compute_units=(os.cpu_count() or 1) if adapter_info.get("adapter_type") == "CPU" else 1,
            max_global_size=2**31 - 1,
            max_local_size=min(limits.get("max-compute-invocations-per-workgroup", 256),
                               limits.get("max-compute-workgroup-size-x", 256)),
            local_memory_bytes=limits.get("max-compute-workgroup-storage-size", 16384),
            # WebGPU does not say a GPU's subgroup size; 32 for a GPU, none for a CPU adapter (lavapipe)
            warp_width=1 if adapter_info.get("adapter_type") == "CPU" else 32,
            preferred_vector_width=4,
            preferred_local_size=WORKGROUP_SIZE,  # the renderer's @workgroup_size
            max_groups_per_dimension=MAX_WORKGROUPS_PER_DIMENSION,
            supported_dtypes=frozenset(dtypes.ALL_DTYPES) - unsupported,
            max_kernel_buffers=limits.get("max-storage-buffers-per-shader-stage", 8),
            max_buffer_bytes=max_buffer_bytes,
            host_cores=adapter_info.get("adapter_type") == "CPU",
            max_loop_iterations=self.loop_limit,
            extra={
                "adapter": f"{adapter_info.get('device', '')} ({adapter_info.get('backend_type', '')})",
                "features": sorted(features),
            },
        )
        self.pool = WGPUMemoryPool(name, self.device, max_buffer_bytes)
        self.renderer = WGSLRenderer(int64=int64, float64=float64)
        self.queue = WGPUQueue(self.device)
        self._programs: ProgramTable[str, WGPUProgram] = ProgramTable()  # least recently used dropped

    def render(self, kernel: KernelIR) -> str:
        return self.renderer.render(kernel)

    def compile(self, kernel: KernelIR) -> Program:
        source = self.render(kernel)
        program = self._programs.get(source)
        if program is None:
            iterations = loop_iterations(kernel.sink) if self.loop_limit is not None else 0
            if self.loop_limit is not None and iterations > self.loop_limit:
                raise DeviceError(
                    f"kernel {kernel.name} runs {iterations} loop iterations per work item; {self.name} "
                    f"({self.info.extra['adapter']}) ends every invocation after {self.loop_limit} (Mesa llvmpipe's "
                    f"loop limiter), which would give a wrong answer: run this computation on the c or opencl device")
            limit = self.info.max_kernel_buffers
            if len(kernel.params) > limit:
                raise CompileError(f"kernel {kernel.name} has {len(kernel.params)} buffers; {self.name} binds at most "
                                   f"{limit} per kernel (realize some inputs first)")
            try:
                dispatch = launch_geometry(kernel.global_size, self.info, exact_local_size=kernel.local_size)[0]
                program = WGPUProgram(self.queue, source, kernel, dispatch, self.info)
            except Exception as error:  # noqa: BLE001 - wgpu raises its own validation error types
                raise CompileError(f"wgpu rejected a kernel: {error}\n--- source ---\n{source}") from None
            self._programs.put(source, program)
        return program

    def synchronize(self) -> None:
        self.queue.wait(self.queue.submitted)


def request_adapter() -> Any:
    """The best WebGPU adapter, or BackendUnavailable saying what is missing."""
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # Mesa's Vulkan loader warns without it
    try:
        import wgpu
    except ImportError as error:
        raise BackendUnavailable(f"the wgpu package is not installed (pip install wgpu): {error}") from None
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as error:  # noqa: BLE001 - wgpu-native reports a missing driver in many ways
        adapter, reason = None, f"{type(error).__name__}: {error}"
    else:
        reason = "wgpu found no adapter"
    if adapter is None:
        raise BackendUnavailable(
            f"no WebGPU adapter ({reason}); on a machine without a GPU install Mesa's lavapipe "
            f"(Debian/Ubuntu: apt install mesa-vulkan-drivers)"
        )
    return adapter


def probe() -> list[Device]:
    """The first WebGPU adapter as "wgpu:0"."""
    return [WGPUDevice(request_adapter(), "wgpu:0")]
