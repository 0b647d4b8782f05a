"""The `cuda` backend: kernel IR rendered to PTX by `ptx.py`, loaded and launched through the CUDA driver API with
cuda-python (cuModuleLoadData, cuLaunchKernel, cuMemAlloc; a compute and a transfer stream per device ordered by
events; copies through page-locked staging buffers). cuda-python and the driver library are imported only when the
backend is probed."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ember.backends.base import (Device, DeviceInfo, Event, MemoryPool, Program, ProgramTable, launch_geometry,
                                 wait_all)
from ember.backends.ptx import PTXRenderer
from ember.core import dtype as dtypes
from ember.core.errors import BackendUnavailable, CompileError, EmberError
from ember.ir.ir import KernelIR

BLOCK_SIZE = 256  # threads per block (DeviceInfo.preferred_local_size)
MATRIX_DTYPES = frozenset({dtypes.float16, dtypes.bfloat16})  # what sm_80's tensor cores multiply (ir/group_matmul.py)
EVENT_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING: events for ordering only are cheaper
STREAM_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING: no implicit ordering with the legacy default stream
NOT_READY = 600  # CUDA_ERROR_NOT_READY from cuEventQuery: the event has not completed yet
OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY from cuMemAlloc
BUSY_RECHECK_SECONDS = 50e-6  # a stream found busy is taken as busy this long before it is asked again
STAGING_CACHE_BYTES = 64 << 20  # page-locked staging memory kept for reuse
FREE_RECHECK_SECONDS = 0.25  # the GPU's free memory is asked of the driver again when the last answer is older
SHORT_FRACTION = 8  # ... or when the estimate says less than 1/8 of the GPU is free (precision matters then)
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
    """An event recorded on a stream after a launch or copy. It holds the host memory its copy uses until it is
    complete, and runs its `finish` step (a staged copy out moving bytes to their destination) when first seen done.
    """

    def __init__(self, driver: Any, stream: Any, keep: tuple = (), finish: Callable[[], None] | None = None) -> None:
        self.driver = driver
        self.keep, self.finish = keep, finish
        self.handle = check(driver, "cuEventCreate", driver.cuEventCreate(EVENT_DISABLE_TIMING))
        check(driver, "cuEventRecord", driver.cuEventRecord(self.handle, stream))

    def _complete(self) -> None:
        finish, self.finish = self.finish, None
        if finish is not None:
            finish()
        self.keep = ()

    def wait(self) -> None:
        check(self.driver, "cuEventSynchronize", self.driver.cuEventSynchronize(self.handle))
        self._complete()

    @property
    def done(self) -> bool:
        (status,) = self.driver.cuEventQuery(self.handle)
        if int(status) == NOT_READY:
            return False
        check(self.driver, "cuEventQuery", (status,))
        self._complete()
        return True

    def __del__(self) -> None:
        try:
            self.driver.cuEventDestroy(self.handle)
        except Exception:  # noqa: BLE001, S110 - the driver may be torn down at exit
            pass


_CURRENT = threading.local()  # per thread: the CUDA context last made current on it (ember's calls only)


class StreamMark(Event):
    """What a launch returns: the point after everything enqueued on its device's stream so far, with no CUDA event
    of its own (an event per launch cost three driver calls: create, record, destroy). One mark per stream serves
    every launch, so waiting is conservative, never early: the host waits for the whole stream, and another stream
    waits for an event recorded when it asks (after the launch, and maybe after later ones)."""

    def __init__(self, driver: Any, stream: Any, context: Any) -> None:
        self.driver, self.stream, self.context = driver, stream, context
        # what a query found, so that `done` answers again without a driver call (a replay asks every buffer's
        # event, eager code each input's and each reader's; a cuStreamQuery each cost more than the launch):
        # `idle`, the stream had finished (true until the next launch); `busy_until`, it had not, an answer kept
        # for BUSY_RECHECK_SECONDS (late at worst, never early: a launch's own bookkeeping asks several times).
        # A launch sets it too: a kernel just enqueued has not finished (the launch's own bookkeeping asked at
        # once, a cuStreamQuery of 2 us on an H100 answering NOT_READY at every eager launch)
        self.idle = False
        self.busy_until = 0.0

    def launched(self) -> StreamMark:
        """The mark of a launch just enqueued on the stream (busy: not asked for BUSY_RECHECK_SECONDS)."""
        self.idle = False
        self.busy_until = time.perf_counter() + BUSY_RECHECK_SECONDS
        return self

    def wait(self) -> None:
        if self.idle:
            return
        make_current(self.driver, self.context)
        check(self.driver, "cuStreamSynchronize", self.driver.cuStreamSynchronize(self.stream))
        self.idle, self.busy_until = True, 0.0

    @property
    def done(self) -> bool:
        if self.idle:
            return True
        now = time.perf_counter()
        if now < self.busy_until:
            return False
        (status,) = self.driver.cuStreamQuery(self.stream)
        if int(status) == NOT_READY:
            self.busy_until = now + BUSY_RECHECK_SECONDS
            return False
        check(self.driver, "cuStreamQuery", (status,))
        self.idle = True
        return True

    def recorded(self) -> CudaEvent:
        """A CUDA event after everything enqueued on the stream until now (for another stream to wait on)."""
        return CudaEvent(self.driver, self.stream)


def make_current(driver: Any, context: Any) -> None:
    """Make `context` the calling thread's current CUDA context before driver calls that use it: CUDA keeps one per
    thread (a thread ember did not start with has none), and with several GPUs the last one set would be used."""
    if getattr(_CURRENT, "context", None) is not context:
        check(driver, "cuCtxSetCurrent", driver.cuCtxSetCurrent(context))
        _CURRENT.context = context


def stream_wait(driver: Any, stream: Any, wait_for: tuple[Event, ...]) -> None:
    """Make `stream` wait for CUDA events (of any device, without blocking the host); wait for others on the host."""
    for event in wait_for:
        if isinstance(event, StreamMark):
            if event.stream is not stream:  # (the stream's own launches are in order already)
                # held in a name until the wait is enqueued: a temporary CudaEvent was destroyed (its __del__) as
                # soon as its handle was read, so the stream waited on a freed event ("context is destroyed", 709)
                recorded = event.recorded()
                check(driver, "cuStreamWaitEvent", driver.cuStreamWaitEvent(stream, recorded.handle, 0))
        elif isinstance(event, CudaEvent):
            check(driver, "cuStreamWaitEvent", driver.cuStreamWaitEvent(stream, event.handle, 0))
        else:
            event.wait()


class PinnedStaging:
    """Page-locked host buffers (cuMemAllocHost) for copies between device and pageable host memory, reused by
    power-of-two size. With pageable memory the driver would block the host (a copy out, and a copy in after a
    stream synchronization); through these the copies stay asynchronous."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.free: dict[int, list[tuple[int, np.ndarray]]] = {}
        self.cached_bytes = 0
        self.in_flight: list[tuple[Event, tuple[int, np.ndarray]]] = []

    def take(self, nbytes: int) -> tuple[int, np.ndarray]:
        """A staging buffer of at least nbytes: (pointer, byte array over it)."""
        self._reclaim()
        size = 1 << max(12, (nbytes - 1).bit_length())
        if self.free.get(size):
            entry = self.free[size].pop()
            self.cached_bytes -= size
            return entry
        pointer = int(check(self.driver, "cuMemAllocHost", self.driver.cuMemAllocHost(size)))
        return pointer, np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(pointer))

    def give_after(self, event: Event, entry: tuple[int, np.ndarray]) -> None:
        """Reuse a staging buffer once the copy using it (`event`) has completed."""
        self.in_flight.append((event, entry))

    def _reclaim(self) -> None:
        still = []
        for event, entry in self.in_flight:
            if not event.done:
                still.append((event, entry))
                continue
            size = len(entry[1])
            if self.cached_bytes + size > STAGING_CACHE_BYTES:
                check(self.driver, "cuMemFreeHost", self.driver.cuMemFreeHost(entry[0]))
            else:
                self.free.setdefault(size, []).append(entry)
                self.cached_bytes += size
        self.in_flight = still


class CudaMemoryPool(MemoryPool):
    """Device memory from cuMemAlloc. Copies run on the device's transfer stream after the events they are given
    (cuStreamWaitEvent), so they overlap the kernels of the compute stream; host memory goes through pinned
    staging. cuMemFree is not ordered with the streams, so the scheduler frees a buffer only after its events."""

    # Released buffers of every size are kept for reuse (base.MemoryPool's policy, up to an eighth of the GPU's
    # memory), as torch's caching allocator keeps them: a cuMemAlloc and a cuMemFree per intermediate tensor cost
    # driver calls at each kernel, and cuMemFree waits for the whole device, so the host could not run ahead of the
    # GPU. A buffer is released only once the commands using it are done (frees_behind_events is False), so a kept
    # one is free to hand out again at once.
    min_reusable_bytes = 0

    def __init__(self, name: str, driver: Any, device: CudaDevice) -> None:
        super().__init__(name)
        self.driver = driver
        self.device = device
        self.staging = PinnedStaging(driver)
        # the GPU's free memory, estimated: the driver's answer (cuMemGetInfo, 9 us on an H100: the sharding
        # decision reads free_bytes at every realize of a large output) less what this pool allocated since, plus
        # what it freed (by handle: `_sizes`); asked again after FREE_RECHECK_SECONDS (other processes and
        # libraries allocate too), when the estimate is short, and when an allocation fails
        self._sizes: dict[int, int] = {}
        self._device_free = 0
        self._asked_at = 0.0
        self.total_bytes = self._ask_free()
        self.reuse_budget_bytes = self.total_bytes // 8

    def _ask_free(self) -> int:
        """Ask the driver for the GPU's free memory (the estimate starts from it again); the total memory."""
        make_current(self.driver, self.device.context)
        free, total = check(self.driver, "cuMemGetInfo", self.driver.cuMemGetInfo())
        self._device_free, self._asked_at = int(free), time.perf_counter()
        return int(total)

    def create_buffer(self, nbytes: int) -> Any:
        make_current(self.driver, self.device.context)
        status, handle = self.driver.cuMemAlloc(nbytes)
        if int(status) == OUT_OF_MEMORY and self.drop_kept():  # the kept buffers may hold what is missing
            status, handle = self.driver.cuMemAlloc(nbytes)
        if int(status) == OUT_OF_MEMORY:
            self._ask_free()  # (the estimate was wrong: what the error and the next decisions see is the driver's)
        handle = int(check(self.driver, "cuMemAlloc", (status, handle)))  # (a plain integer, as views are)
        # (cuMemAlloc hands out multiples of view_alignment at least: what the driver counts as used)
        size = -(-nbytes // self.view_alignment) * self.view_alignment
        self._sizes[handle] = size
        self._device_free -= size
        return handle

    view_alignment = 256  # cuMemAlloc's own alignment: a view is as aligned as an allocation

    def view(self, handle: Any, offset: int, nbytes: int) -> Any:
        return int(handle) + offset  # a device pointer into the buffer (the driver calls take plain integers)

    def destroy_buffer(self, handle: Any) -> None:
        make_current(self.driver, self.device.context)
        check(self.driver, "cuMemFree", self.driver.cuMemFree(handle))
        self._device_free += self._sizes.pop(int(handle), 0)

    def copy_in(self, handle: Any, source: memoryview) -> None:
        self.copy_in_async(handle, source, (self.device.launches_so_far(),)).wait()

    def copy_out(self, destination: memoryview, handle: Any) -> None:
        self.copy_out_async(destination, handle, (self.device.launches_so_far(),)).wait()

    def copy_in_async(self, handle: Any, source: memoryview, wait_for: tuple[Event, ...] = ()) -> Event:
        # the host copies `source` into staging now, so the commands writing `source` are waited for here (the
        # host memory is only complete then: a staged copy out lands in it when its event is seen done)
        wait_all(wait_for)
        make_current(self.driver, self.device.context)
        nbytes = len(source)
        entry = self.staging.take(nbytes)
        entry[1][:nbytes] = np.frombuffer(source, dtype=np.uint8)
        stream = self.device.transfers()
        check(self.driver, "cuMemcpyHtoDAsync", self.driver.cuMemcpyHtoDAsync(handle, entry[1], nbytes, stream))
        event = CudaEvent(self.driver, stream)
        self.staging.give_after(event, entry)
        return event

    def copy_out_async(self, destination: memoryview, handle: Any, wait_for: tuple[Event, ...] = ()) -> Event:
        make_current(self.driver, self.device.context)
        nbytes = len(destination)
        entry = self.staging.take(nbytes)
        stream = self.device.transfers()
        stream_wait(self.driver, stream, wait_for)
        check(self.driver, "cuMemcpyDtoHAsync", self.driver.cuMemcpyDtoHAsync(entry[1], handle, nbytes, stream))

        def finish() -> None:
            np.frombuffer(destination, dtype=np.uint8)[:] = entry[1][:nbytes]

        event = CudaEvent(self.driver, stream, keep=(destination,), finish=finish)
        self.staging.give_after(event, entry)
        return event

    def copy_from(self, handle: Any, source_pool: MemoryPool, source_handle: Any, nbytes: int,
                  wait_for: tuple[Event, ...] = ()) -> Event | None:
        if not isinstance(source_pool, CudaMemoryPool):
            return None
        make_current(self.driver, self.device.context)
        stream = self.device.transfers()
        stream_wait(self.driver, stream, wait_for)
        if source_pool.device.context is self.device.context:
            check(self.driver, "cuMemcpyDtoDAsync", self.driver.cuMemcpyDtoDAsync(handle, source_handle, nbytes,
                                                                                  stream))
        else:
            check(self.driver, "cuMemcpyPeerAsync", self.driver.cuMemcpyPeerAsync(
                handle, self.device.context, source_handle, source_pool.device.context, nbytes, stream))
        return CudaEvent(self.driver, stream)

    @property
    def free_bytes(self) -> int | None:
        """What the GPU has free (the kept buffers counted as free: they are handed out again), or less where the
        pool's limit (EMBER_POOL_LIMITS) leaves less. The GPU's part is the pool's estimate (see __init__): the
        driver is asked only when its last answer is older than FREE_RECHECK_SECONDS or the estimate is short."""
        if (self._device_free * SHORT_FRACTION < self.total_bytes
                or time.perf_counter() - self._asked_at > FREE_RECHECK_SECONDS):
            self._ask_free()
        free = self._device_free + self.kept_bytes
        limited = super().free_bytes
        return free if limited is None else min(free, limited)


class CudaProgram(Program):
    """A loaded module and its kernel function; a launch is one cuLaunchKernel on the device's stream."""

    def __init__(self, driver: Any, stream: Any, source: str, kernel: KernelIR, info: DeviceInfo,
                 context: Any = None, mark: StreamMark | None = None) -> None:
        self.driver = driver
        self.stream = stream
        self.context = context
        self.mark = mark if mark is not None else StreamMark(driver, stream, context)
        try:
            self.module = check(driver, "cuModuleLoadData", driver.cuModuleLoadData(source.encode() + b"\0"))
        except CudaError as error:
            raise CompileError(f"the CUDA driver rejected a kernel: {error}\n--- source ---\n{source}") from None
        self.function = check(driver, "cuModuleGetFunction", driver.cuModuleGetFunction(self.module, kernel.name.encode()))
        (self.blocks, _, _), self.block_size = launch_geometry(kernel.global_size, info,
                                                               exact_local_size=kernel.local_size)
        # a shape class's kernel (its global size known at launch): the blocks of each launch's size
        self.info = info if kernel.size_parameter is not None else None
        # the kernel parameters, made once: a launch writes its buffers' pointers into them (the driver copies the
        # parameters when the launch is enqueued, so the next launch may write them again), where cuda-python's
        # (values, types) form built ctypes objects at every launch
        self.values, self.pointers, self.address = parameter_arrays([0] * len(kernel.params))

    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        driver = self.driver
        make_current(driver, self.context)
        if wait_for:
            stream_wait(driver, self.stream, wait_for)
        try:
            self.values[:] = buffers  # (the pool's handles and views are plain integers: one slice assignment)
        except TypeError:  # a cuda-python CUdeviceptr
            self.values[:] = [int(buffer) for buffer in buffers]
        blocks, block_size = self.blocks, self.block_size
        if self.info is not None:
            (blocks, _, _), block_size = launch_geometry(global_size, self.info)
        (status,) = driver.cuLaunchKernel(self.function, blocks, 1, 1, block_size, 1, 1, 0, self.stream,
                                          self.address, 0)
        if status:  # (CUDA_SUCCESS is 0: the message is made only for an error)
            check(driver, "cuLaunchKernel", (status,))
        return self.mark.launched()

    def bind(self, buffers: list[Any], global_size: int) -> Callable[[tuple[Event, ...]], Event]:
        """A launch with fixed buffers (a jit replay's, a launch plan's): its kernel parameters packed once, as the
        void** array cuLaunchKernel reads (cuda-python takes its address as is), and its blocks counted once; a
        launch is then one driver call and allocates nothing."""
        values, parameters, address = parameter_arrays([int(buffer) for buffer in buffers])
        blocks, block_size = self.blocks, self.block_size
        if self.info is not None:
            (blocks, _, _), block_size = launch_geometry(global_size, self.info)
        driver, function, stream, context, mark = self.driver, self.function, self.stream, self.context, self.mark

        def run(wait_for: tuple[Event, ...], keep_alive: tuple = (values, parameters, buffers)) -> Event:
            make_current(driver, context)
            if wait_for:
                stream_wait(driver, stream, wait_for)
            (status,) = driver.cuLaunchKernel(function, blocks, 1, 1, block_size, 1, 1, 0, stream, address, 0)
            if status:
                check(driver, "cuLaunchKernel", (status,))
            return mark.launched()

        return run


class CudaGraphLaunch:
    """Bound launches of one stream captured once as a CUDA graph (stream capture): a replay enqueues the whole run
    with one cuGraphLaunch instead of one cuLaunchKernel each (the driver's per-launch work, and Python's, is paid
    once per run; the GPU starts each kernel as the one before it ends). The launches' buffers and parameters are
    fixed, as Program.bind's are; the graph is destroyed with this object."""

    def __init__(self, driver: Any, stream: Any, context: Any, mark: StreamMark,
                 launches: list[Callable[[tuple[Event, ...]], Event]]) -> None:
        self.driver, self.stream, self.context, self.mark = driver, stream, context, mark
        self.launches = launches  # (they hold the buffers the graph's kernels read and write)
        self.graph = self.executable = None
        make_current(driver, context)
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(driver, "cuStreamBeginCapture", driver.cuStreamBeginCapture(stream, mode))
        try:
            for launch in launches:
                launch(())
        finally:  # (a capture left open would turn the stream's next launches into graph nodes)
            self.graph = check(driver, "cuStreamEndCapture", driver.cuStreamEndCapture(stream))
        self.executable = check(driver, "cuGraphInstantiate", driver.cuGraphInstantiate(self.graph, 0))

    def __call__(self, wait_for: tuple[Event, ...]) -> Event:
        make_current(self.driver, self.context)
        if wait_for:
            stream_wait(self.driver, self.stream, wait_for)
        check(self.driver, "cuGraphLaunch", self.driver.cuGraphLaunch(self.executable, self.stream))
        return self.mark.launched()

    def __del__(self) -> None:
        try:
            if self.executable is not None:
                self.driver.cuGraphExecDestroy(self.executable)
            if self.graph is not None:
                self.driver.cuGraphDestroy(self.graph)
        except Exception:  # noqa: BLE001, S110 - the driver may be torn down at exit
            pass


def parameter_arrays(values: list[int]) -> tuple[Any, Any, int]:
    """A launch's kernel parameters as cuLaunchKernel reads them: the pointer-sized values, the void** array of
    their addresses, and that array's address (cuda-python passes an int through as it). The caller keeps both
    arrays alive while launches use them."""
    held = (ctypes.c_void_p * len(values))(*values)
    size = ctypes.sizeof(ctypes.c_void_p)
    pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(held) + index * size
                                                 for index in range(len(values))])
    return held, pointers, ctypes.addressof(pointers)


def _attribute(driver: Any, device: Any, name: str) -> int:
    attribute = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return int(check(driver, "cuDeviceGetAttribute", driver.cuDeviceGetAttribute(attribute, device)))


class CudaDevice(Device):
    """One NVIDIA GPU: its primary context, a stream for kernels and one for copies, PTX for its compute capability."""

    def __init__(self, driver: Any, ordinal: int) -> None:
        self.driver = driver
        self.name = f"cuda:{ordinal}"
        self.handle = check(driver, "cuDeviceGet", driver.cuDeviceGet(ordinal))
        self.context = check(driver, "cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(self.handle))
        make_current(driver, self.context)
        self.stream = check(driver, "cuStreamCreate", driver.cuStreamCreate(STREAM_NON_BLOCKING))
        self.transfer_stream = check(driver, "cuStreamCreate", driver.cuStreamCreate(STREAM_NON_BLOCKING))
        self.copies_since_synchronize = False  # whether synchronize must wait for the transfer stream (transfers)
        self.mark = StreamMark(driver, self.stream, self.context)  # every launch's event (see StreamMark)
        major = _attribute(driver, self.handle, "COMPUTE_CAPABILITY_MAJOR")
        minor = _attribute(driver, self.handle, "COMPUTE_CAPABILITY_MINOR")
        name = check(driver, "cuDeviceGetName", driver.cuDeviceGetName(256, self.handle))
        self.info = DeviceInfo(
            compute_units=_attribute(driver, self.handle, "MULTIPROCESSOR_COUNT"),
            max_global_size=2**31 - 1,
            max_local_size=_attribute(driver, self.handle, "MAX_THREADS_PER_BLOCK"),
            local_memory_bytes=_attribute(driver, self.handle, "MAX_SHARED_MEMORY_PER_BLOCK"),
            warp_width=_attribute(driver, self.handle, "WARP_SIZE"),
            preferred_vector_width=4,
            preferred_local_size=BLOCK_SIZE,
            # tensor cores (mma.sync.m16n8k16 with float32 accumulation) from sm_80: half matmuls tile on them
            matrix_dtypes=MATRIX_DTYPES if major >= 8 else frozenset(),
            extra={"gpu": name.split(b"\0", 1)[0].decode(errors="replace"), "target": f"sm_{major}{minor}"},
        )
        self.pool = CudaMemoryPool(self.name, driver, self)
        self.renderer = PTXRenderer(target=f"sm_{major}{minor}")
        self._programs: ProgramTable[str, CudaProgram] = ProgramTable()  # least recently used dropped
        self.graphs_failed = False  # a CUDA graph capture failed once: replays launch one by one (join_launches)

    def render(self, kernel: KernelIR) -> str:
        return self.renderer.render(kernel)

    def compile(self, kernel: KernelIR) -> Program:
        source = self.render(kernel)
        program = self._programs.get(source)
        if program is None:
            make_current(self.driver, self.context)
            program = CudaProgram(self.driver, self.stream, source, kernel, self.info, self.context, self.mark)
            self._programs.put(source, program)
        return program

    def join_launches(self, launches: list[Callable[[tuple[Event, ...]], Event]]
                      ) -> Callable[[tuple[Event, ...]], Event] | None:
        """The bound launches as one CUDA graph (see CudaGraphLaunch); None where the driver cannot capture them
        (they then run one by one, and the first failure is said in a warning; later replays do not try again)."""
        if self.graphs_failed:
            return None
        try:
            return CudaGraphLaunch(self.driver, self.stream, self.context, self.mark, launches)
        except (CudaError, AttributeError, TypeError) as error:  # (cuda-python builds without the graph calls)
            self.graphs_failed = True
            warnings.warn(f"ember: {self.name}: replays launch their kernels one by one: capturing {len(launches)} "
                          f"launches as a CUDA graph failed ({type(error).__name__}: {error})", RuntimeWarning,
                          stacklevel=2)
            return None

    def launches_so_far(self) -> CudaEvent:
        """An event after every launch enqueued so far (the synchronous copies keep one-stream ordering with it)."""
        return CudaEvent(self.driver, self.stream)

    def transfers(self) -> Any:
        """The transfer stream, for a copy about to be enqueued on it (the next synchronize waits for it)."""
        self.copies_since_synchronize = True
        return self.transfer_stream

    def synchronize(self) -> None:
        """Wait for the compute stream unless its mark was seen idle since its last launch, and for the transfer
        stream if a copy was enqueued on it since the last synchronize (a cuStreamSynchronize each, a few
        microseconds on an idle H100: benchmarks synchronize after every run)."""
        make_current(self.driver, self.context)
        if not self.mark.idle:
            check(self.driver, "cuStreamSynchronize", self.driver.cuStreamSynchronize(self.stream))
            self.mark.idle, self.mark.busy_until = True, 0.0
        if self.copies_since_synchronize:
            self.copies_since_synchronize = False  # (before the wait: a copy enqueued meanwhile sets it again)
            check(self.driver, "cuStreamSynchronize", self.driver.cuStreamSynchronize(self.transfer_stream))


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
