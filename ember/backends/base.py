"""The backend contract: DeviceInfo (capabilities), MemoryPool, Program, Event and Device."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.ir.ir import KernelIR


@dataclass
class DeviceInfo:
    """What a device can do; the scheduler and the optimizer read it, backends carry no optimizers of their own."""

    compute_units: int = 1
    max_global_size: int = 2**31 - 1
    max_local_size: int = 1
    local_memory_bytes: int = 0
    preferred_vector_width: int = 1  # float32 lanes of the device's vectors (so vectors have 4 * this bytes)
    vector_ops: frozenset[Any] = frozenset()  # IR ops the renderer applies to vectors (ir/vectorize.py); empty: none
    # narrower vector widths (float32 lanes, widest first), each with the IR ops usable at it, for kernels needing an
    # op `vector_ops` lacks, and for a kernel the device failed to build (a driver that cannot compile some vector
    # forms, found by probing: see opencl_probe.py); empty: the preferred width serves every op in vector_ops
    fallback_vector_widths: tuple[tuple[int, frozenset[Any]], ...] = ()
    supported_dtypes: frozenset[DType] = frozenset(dtypes.ALL_DTYPES)
    has_native_exp2: bool = True
    can_run: bool = True  # False for render-only (dummy) devices
    concurrent_compile: bool = False  # compile() may run in several threads at once (the C compiler may)
    max_kernel_buffers: int = 2**31 - 1  # buffers one kernel may bind, its output included (WebGPU: a few dozen)
    extra: dict[str, Any] = field(default_factory=dict)

    def unsupported(self, used: set[DType]) -> list[DType]:
        return sorted((d for d in used if d not in self.supported_dtypes), key=lambda d: d.name)


class Event:
    """The completion of one enqueued command (a kernel launch or a copy) of a device.

    Launches and copies return an event at once; the command may still be queued or running. `wait()` blocks the
    calling thread until that command (and so everything it waited for) has finished, and nothing else: it does not
    drain the device's queues. `done` asks without blocking. Events are passed as `wait_for` to later launches and
    copies, which then start only after them: a backend turns an event of its own device into a native dependency
    (an OpenCL event in a wait list, `cuStreamWaitEvent`) and waits on the host for any other event.

    An event keeps alive whatever host memory its command reads or writes until it completes. The default event
    is already complete: synchronous backends return `COMPLETED` from every call.
    """

    def wait(self) -> None:
        return None

    @property
    def done(self) -> bool:
        return True


COMPLETED = Event()


def wait_all(events: tuple[Event, ...] | list[Event]) -> None:
    """Wait on the host for every event (what a backend does with events it cannot make native dependencies)."""
    for event in events:
        event.wait()


class MemoryPool(ABC):
    """Memory of one device: allocations, copies between host and device, and a byte count.

    The scheduler calls allocate/adopt/release, which keep the byte count (nothing else writes `used_bytes` or
    `live_buffers`) and call the backend's alloc/free. A backend must provide alloc/free and the synchronous
    copy_in/copy_out. The asynchronous copies (`copy_in_async`, `copy_out_async`, `copy_from`) default to the
    synchronous ones after waiting for `wait_for` and return `COMPLETED`; a backend with queues overrides them to
    enqueue the copy and return its event.
    """

    frees_behind_events = False  # True: free() may be called while enqueued commands still use the buffer (the
    # driver keeps the memory until they finish, as OpenCL does); False: the scheduler frees only after the events
    # of every command using the buffer are done

    def __init__(self, name: str, limit_bytes: int | None = None) -> None:
        self.name = name
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.peak_bytes = 0
        self.live_buffers = 0

    def allocate(self, nbytes: int) -> Any:
        """Allocate (bookkeeping and the byte limit), then call the backend's alloc."""
        from ember.core.errors import OutOfMemoryError

        if self.limit_bytes is not None and self.used_bytes + nbytes > self.limit_bytes:
            raise OutOfMemoryError(
                f"memory pool {self.name}: cannot allocate {nbytes} bytes, {self.limit_bytes - self.used_bytes} "
                f"of {self.limit_bytes} bytes are free; free tensors you no longer need, or raise the limit "
                f"(EMBER_POOL_LIMITS or [pools] in the config file)"
            )
        handle = self.alloc(max(nbytes, 1))
        self.used_bytes += nbytes
        self.live_buffers += 1
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)
        return handle

    def adopt(self, nbytes: int) -> None:
        """Count memory the pool did not allocate (a file mapping) as in use until `release` gives it back."""
        self.used_bytes += nbytes
        self.live_buffers += 1

    def release(self, handle: Any, nbytes: int) -> None:
        """Free a buffer from `allocate` or `adopt` (bookkeeping, then the backend's free)."""
        self.free(handle)
        self.used_bytes -= nbytes
        self.live_buffers -= 1

    @property
    def free_bytes(self) -> int | None:
        return None if self.limit_bytes is None else self.limit_bytes - self.used_bytes

    @abstractmethod
    def alloc(self, nbytes: int) -> Any: ...

    @abstractmethod
    def free(self, handle: Any) -> None: ...

    @abstractmethod
    def copy_in(self, handle: Any, source: memoryview) -> None: ...

    @abstractmethod
    def copy_out(self, destination: memoryview, handle: Any) -> None: ...

    def copy_in_async(self, handle: Any, source: memoryview, wait_for: tuple[Event, ...] = ()) -> Event:
        """Enqueue a copy of host bytes into a buffer after `wait_for`; `source` must stay unchanged until the
        returned event is done (the event keeps it alive)."""
        wait_all(wait_for)
        self.copy_in(handle, source)
        return COMPLETED

    def copy_out_async(self, destination: memoryview, handle: Any, wait_for: tuple[Event, ...] = ()) -> Event:
        """Enqueue a copy of a buffer's first len(destination) bytes into host memory after `wait_for`;
        `destination` holds the bytes once the returned event is done (the event keeps it alive)."""
        wait_all(wait_for)
        self.copy_out(destination, handle)
        return COMPLETED

    def copy_from(self, handle: Any, source_pool: MemoryPool, source_handle: Any, nbytes: int,
                  wait_for: tuple[Event, ...] = ()) -> Event | None:
        """Enqueue a copy of `nbytes` from a buffer of another pool that this pool can reach directly (another
        queue of the same context, peer memory); None when it cannot (the scheduler then goes through host memory).
        """
        return None

    def host_view(self, handle: Any, nbytes: int) -> memoryview | None:
        """The first `nbytes` of a buffer as host memory (a pool in host RAM), or None for device memory. A copy
        to or from another pool then needs one host copy instead of two, without staging."""
        return None


class Program(ABC):
    """A compiled kernel. Called with buffer handles in parameter order and the global size."""

    @abstractmethod
    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        """Enqueue the kernel after the events in `wait_for` and return its event (see Event)."""


class Device(ABC):
    """One device of a backend: name ("c:0"), capabilities, a memory pool, and a compiler of kernel IR."""

    name: str
    info: DeviceInfo
    pool: MemoryPool

    @abstractmethod
    def render(self, kernel: KernelIR) -> str:
        """The source code of a kernel in this device's language."""

    @abstractmethod
    def compile(self, kernel: KernelIR) -> Program:
        """Render and compile a kernel (implementations cache by source)."""

    def compile_many(self, kernels: list[KernelIR]) -> list[Program]:
        """Compile several kernels; a backend that builds them in one compiler run (c, opencl) overrides this."""
        return [self.compile(kernel) for kernel in kernels]

    def synchronize(self) -> None:
        """Wait until every command enqueued on this device has finished (benchmarks; reads use events)."""


def cache_directory(*parts: str) -> Path:
    """ember's disk cache folder (EMBER_CACHE_DIR, else $XDG_CACHE_HOME/ember, else ~/.cache/ember)."""
    base = os.environ.get("EMBER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ember"
    )
    path = Path(base, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
