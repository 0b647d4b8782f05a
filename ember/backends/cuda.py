"""The `cuda` backend: kernel IR rendered to PTX by `ptx.py`, loaded and launched through the CUDA driver API with
cuda-python (cuModuleLoadData, cuLaunchKernel, cuMemAlloc, one stream per device, events). cuda-python and the
driver library are imported only when the backend is probed."""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import numpy as np

from ember.backends.base import Device, DeviceInfo, Event, MemoryPool, Program
from ember.backends.ptx import PTXRenderer
from ember.core.errors import BackendUnavailable, CompileError, EmberError
from ember.ir.ir import KernelIR

BLOCK_SIZE = 256
DRIVER_LIBRARY = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"


class CudaError(EmberError, RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


def import_driver() -> Any:
    """cuda-python's driver module, after checking that the driver library itself loads."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python before 12.6
        except ImportError as error:
            raise BackendUnavailable(f"cuda-python is not installed (pip install cuda-python): {error}") from None
    try:
        ctypes.CDLL(DRIVER_LIBRARY)
    except OSError as error:
        raise BackendUnavailable(f"CUDA driver not found: {error} (install the NVIDIA driver)") from None
    return driver


def check(driver: Any, call: str, result: tuple) -> Any:
    """The values a driver call returned after its status, or CudaError naming the call."""
    status, *values = result
    if int(status) != 0:
        _, text = driver.cuGetErrorString(status)
        raise CudaError(f"{call} failed: {text.decode() if isinstance(text, bytes) else text} ({int(status)})")
    return values[0] if len(values) == 1 else tuple(values) if values else None


class CudaEvent(Event):
    """An event recorded on a stream after a launch or copy."""

    def __init__(self, driver: Any, stream: Any) -> None:
        self.driver = driver
        self.handle = check(driver, "cuEventCreate", driver.cuEventCreate(0))
        check(driver, "cuEventRecord", driver.cuEventRecord(self.handle, stream))

    def wait(self) -> None:
        check(self.driver, "cuEventSynchronize", self.driver.cuEventSynchronize(self.handle))

    @property
    def done(self) -> bool:
        (status,) = self.driver.cuEventQuery(self.handle)
        return int(status) == 0

    def __del__(self) -> None:
        try:
            self.driver.cuEventDestroy(self.handle)
        except Exception:  # noqa: BLE001, S110 - the driver may be torn down at exit
            pass


class CudaMemoryPool(MemoryPool):
    """Device memory from cuMemAlloc; copies go through the device's stream."""

    def __init__(self, name: str, driver: Any, stream: Any) -> None:
        super().__init__(name)
        self.driver = driver
        self.stream = stream

    def alloc(self, nbytes: int) -> Any:
        return check(self.driver, "cuMemAlloc", self.driver.cuMemAlloc(nbytes))

    def free(self, handle: Any) -> None:
        check(self.driver, "cuMemFree", self.driver.cuMemFree(handle))

    def copy_in(self, handle: Any, source: memoryview) -> None:
        host = np.frombuffer(source, dtype=np.uint8)
        check(self.driver, "cuMemcpyHtoDAsync", self.driver.cuMemcpyHtoDAsync(handle, host, host.nbytes, self.stream))
        check(self.driver, "cuStreamSynchronize", self.driver.cuStreamSynchronize(self.stream))  # host may reuse it

    def copy_out(self, destination: memoryview, handle: Any) -> None:
        host = np.frombuffer(destination, dtype=np.uint8)
        check(self.driver, "cuMemcpyDtoHAsync", self.driver.cuMemcpyDtoHAsync(host, handle, host.nbytes, self.stream))
        check(self.driver, "cuStreamSynchronize", self.driver.cuStreamSynchronize(self.stream))

    @property
    def free_bytes(self) -> int | None:
        free, _ = check(self.driver, "cuMemGetInfo", self.driver.cuMemGetInfo())
        return int(free)


class CudaProgram(Program):
    """A loaded module and its kernel function; a launch is one cuLaunchKernel on the device's stream."""

    def __init__(self, driver: Any, stream: Any, source: str, kernel: KernelIR) -> None:
        self.driver = driver
        self.stream = stream
        try:
            self.module = check(driver, "cuModuleLoadData", driver.cuModuleLoadData(source.encode() + b"\0"))
        except CudaError as error:
            raise CompileError(f"the CUDA driver rejected a kernel: {error}\n--- source ---\n{source}") from None
        function = driver.cuModuleGetFunction(self.module, kernel.name.encode())
        self.function = check(driver, "cuModuleGetFunction", function)
        self.blocks = max(1, -(-kernel.global_size // BLOCK_SIZE))
        self.parameter_types = (ctypes.c_void_p,) * len(kernel.params)

    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        for event in wait_for:
            if isinstance(event, CudaEvent):
                check(self.driver, "cuStreamWaitEvent", self.driver.cuStreamWaitEvent(self.stream, event.handle, 0))
            else:
                event.wait()
        arguments = (tuple(int(buffer) for buffer in buffers), self.parameter_types)
        check(self.driver, "cuLaunchKernel", self.driver.cuLaunchKernel(
            self.function, self.blocks, 1, 1, BLOCK_SIZE, 1, 1, 0, self.stream, arguments, 0))
        return CudaEvent(self.driver, self.stream)


def _attribute(driver: Any, device: Any, name: str) -> int:
    attribute = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return int(check(driver, "cuDeviceGetAttribute", driver.cuDeviceGetAttribute(attribute, device)))


class CudaDevice(Device):
    """One NVIDIA GPU: its primary context, one stream, PTX rendered for its compute capability."""

    def __init__(self, driver: Any, ordinal: int) -> None:
        self.driver = driver
        self.name = f"cuda:{ordinal}"
        self.handle = check(driver, "cuDeviceGet", driver.cuDeviceGet(ordinal))
        self.context = check(driver, "cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(self.handle))
        check(driver, "cuCtxSetCurrent", driver.cuCtxSetCurrent(self.context))
        self.stream = check(driver, "cuStreamCreate", driver.cuStreamCreate(0))
        major = _attribute(driver, self.handle, "COMPUTE_CAPABILITY_MAJOR")
        minor = _attribute(driver, self.handle, "COMPUTE_CAPABILITY_MINOR")
        name = check(driver, "cuDeviceGetName", driver.cuDeviceGetName(256, self.handle))
        self.info = DeviceInfo(
            compute_units=_attribute(driver, self.handle, "MULTIPROCESSOR_COUNT"),
            max_global_size=2**31 - 1,
            max_local_size=_attribute(driver, self.handle, "MAX_THREADS_PER_BLOCK"),
            local_memory_bytes=_attribute(driver, self.handle, "MAX_SHARED_MEMORY_PER_BLOCK"),
            preferred_vector_width=4,
            extra={"gpu": name.split(b"\0", 1)[0].decode(errors="replace"), "target": f"sm_{major}{minor}"},
        )
        self.pool = CudaMemoryPool(self.name, driver, self.stream)
        self.renderer = PTXRenderer(target=f"sm_{major}{minor}")
        self._programs: dict[str, CudaProgram] = {}

    def render(self, kernel: KernelIR) -> str:
        return self.renderer.render(kernel)

    def compile(self, kernel: KernelIR) -> Program:
        source = self.render(kernel)
        program = self._programs.get(source)
        if program is None:
            check(self.driver, "cuCtxSetCurrent", self.driver.cuCtxSetCurrent(self.context))
            program = CudaProgram(self.driver, self.stream, source, kernel)
            self._programs[source] = program
        return program

    def synchronize(self) -> None:
        check(self.driver, "cuStreamSynchronize", self.driver.cuStreamSynchronize(self.stream))


def probe() -> list[Device]:
    """Every CUDA GPU as "cuda:0", "cuda:1", ...; BackendUnavailable without cuda-python, driver or GPU."""
    driver = import_driver()
    try:
        check(driver, "cuInit", driver.cuInit(0))
    except CudaError as error:
        raise BackendUnavailable(f"the CUDA driver did not initialize: {error}") from None
    except Exception as error:  # noqa: BLE001 - cuda-python raises its own loader errors without a driver
        raise BackendUnavailable(f"CUDA driver not found: {type(error).__name__}: {error}") from None
    count = check(driver, "cuDeviceGetCount", driver.cuDeviceGetCount())
    if not count:
        raise BackendUnavailable("the CUDA driver found no GPU")
    return [CudaDevice(driver, ordinal) for ordinal in range(count)]
