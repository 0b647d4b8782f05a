"""The backend contract: MemoryPool (with the one reuse policy for freed buffers), Program, Event, Device and
Renderer.

Every optional part of the contract is declared here with its default, so the scheduler calls it without asking
whether a backend has it; manuals/adding-a-backend.md explains each. Capabilities (DeviceInfo) and the launch
geometry live in ember/capabilities.py, the disk cache in ember/cache.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from ember.capabilities import DeviceInfo, launch_geometry  # re-exported: backends import the contract from here
from ember.ir.ir import KernelIR

__all__ = ["COMPLETED", "Device", "DeviceInfo", "Event", "MemoryPool", "Program", "ProgramTable", "Renderer",
           "launch_geometry", "wait_all"]

MIN_REUSABLE_BYTES = 1 << 20  # freed buffers at least this large may be kept for reuse (MemoryPool.reuse_budget_bytes)
MAX_REUSABLE_BYTES = 1 << 30  # the most bytes of them a pool keeps
PROGRAMS_KEPT = 4096  # programs a device's table keeps (each distinct shape is a kernel): as the compile cache


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

    Two levels, named so they cannot be confused: the scheduler calls `allocate(nbytes)`, `adopt(nbytes)` (memory
    the pool did not allocate, e.g. a file mapping) and `release(handle, nbytes)`, which keep the byte count (nothing
    else writes `used_bytes` or `live_buffers`) and the limit and apply the reuse policy; a backend implements
    `create_buffer(nbytes)` and `destroy_buffer(handle)`, the device's own operations, which nothing but these two
    calls. A backend must also provide the synchronous copy_in/copy_out. The asynchronous copies (`copy_in_async`,
    `copy_out_async`, `copy_from`) default to the synchronous ones after waiting for `wait_for` and return
    `COMPLETED`; a backend with queues overrides them to enqueue the copy and return its event.

    Reuse policy (one for every backend, off by default): a pool whose `reuse_budget_bytes` is positive keeps
    released buffers of `min_reusable_bytes` or more (MIN_REUSABLE_BYTES unless the pool says less), up to that many
    bytes, and `allocate` hands one of exactly the
    size asked for out again once the events of `pending_work()` taken at its release are done (a CPU driver gives
    fresh pages whose first touch costs as much as a large elementwise kernel).
    """

    reuse_budget_bytes = 0  # bytes of released buffers kept for reuse (0: none; see the reuse policy above)
    min_reusable_bytes = MIN_REUSABLE_BYTES  # smaller released buffers go back to the device at once
    _kept: dict[int, list[tuple[Any, tuple[Event, ...]]]] | None = None  # kept buffers by size, with pending_work
    _kept_bytes = 0

    frees_behind_events = False  # True: release() may be called while enqueued commands still use the buffer (the
    # driver keeps the memory until they finish, as OpenCL does); False: the scheduler releases only after the
    # events of every command using the buffer are done

    def __init__(self, name: str, limit_bytes: int | None = None) -> None:
        self.name = name
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.peak_bytes = 0
        self.live_buffers = 0

    def allocate(self, nbytes: int) -> Any:
        """Allocate (bookkeeping and the byte limit): a kept buffer of this size, or the backend's create_buffer."""
        if self.limit_bytes is not None and self.used_bytes + nbytes > self.limit_bytes:
            from ember.core.errors import OutOfMemoryError

            raise OutOfMemoryError(
                f"memory pool {self.name}: cannot allocate {nbytes} bytes, {self.limit_bytes - self.used_bytes} "
                f"of {self.limit_bytes} bytes are free; free tensors you no longer need, or raise the limit "
                f"(EMBER_POOL_LIMITS or [pools] in the config file)"
            )
        handle = self._reused_or_created(nbytes or 1) if self._kept else self.create_buffer(nbytes or 1)
        self.used_bytes += nbytes
        self.live_buffers += 1
        if self.used_bytes > self.peak_bytes:
            self.peak_bytes = self.used_bytes
        return handle

    def adopt(self, nbytes: int) -> None:
        """Count memory the pool did not allocate (a file mapping) as in use until `release` gives it back."""
        self.used_bytes += nbytes
        self.live_buffers += 1

    def release(self, handle: Any, nbytes: int) -> None:
        """Undo an allocate: the bookkeeping, then keep the buffer for reuse or call the backend's destroy_buffer."""
        if nbytes < self.min_reusable_bytes:  # (never kept: the reuse policy's first test, without its call)
            self.destroy_buffer(handle)
        else:
            self._keep_or_destroy(handle, nbytes)
        self.used_bytes -= nbytes
        self.live_buffers -= 1

    @property
    def free_bytes(self) -> int | None:
        return None if self.limit_bytes is None else self.limit_bytes - self.used_bytes

    @abstractmethod
    def create_buffer(self, nbytes: int) -> Any:
        """A new buffer of at least `nbytes` (> 0) bytes from the device (called by allocate only)."""

    @abstractmethod
    def destroy_buffer(self, handle: Any) -> None:
        """Give a buffer back to the device (called by release only; see frees_behind_events for when)."""

    def pending_work(self) -> tuple[Event, ...]:
        """Events done once every command enqueued on this pool's device so far has finished (the reuse policy waits
        for them before handing a released buffer out again). Default: none, which is right for synchronous
        backends and for pools the scheduler releases only after the buffer's commands are done."""
        return ()

    # ---- the reuse policy ---------------------------------------------------------------------------------------

    def _reused_or_created(self, nbytes: int) -> Any:
        candidates = self._kept.get(nbytes) if self._kept else None
        if candidates:
            for position, (handle, events) in enumerate(candidates):
                if all(event.done for event in events):
                    del candidates[position]
                    self._kept_bytes -= nbytes
                    return handle
        return self.create_buffer(nbytes)

    @property
    def kept_bytes(self) -> int:
        """Bytes of released buffers the pool keeps for reuse (not counted in used_bytes)."""
        return self._kept_bytes

    def drop_kept(self) -> int:
        """Give every kept buffer back to the device (a device allocation failed: the kept memory may be what it
        lacks); how many bytes that freed."""
        freed, kept = self._kept_bytes, self._kept or {}
        self._kept, self._kept_bytes = None, 0
        for handles in kept.values():
            for handle, events in handles:
                wait_all(events)
                self.destroy_buffer(handle)
        return freed

    def _keep_or_destroy(self, handle: Any, nbytes: int) -> None:
        if (nbytes < self.min_reusable_bytes
                or self._kept_bytes + nbytes > min(self.reuse_budget_bytes, MAX_REUSABLE_BYTES)):
            self.destroy_buffer(handle)
            return
        if self._kept is None:
            self._kept = {}
        self._kept.setdefault(nbytes, []).append((handle, self.pending_work()))
        self._kept_bytes += nbytes

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

    view_alignment = 0  # bytes: offsets of `view` are multiples of this; 0: the pool makes no views (the default)
    # bytes: the start of a kernel's input view (scheduler/input_views.py) is a multiple of this; None: view_alignment.
    # A pool whose `view` takes any offset, for a device whose kernels need only element alignment, says 1 (c)
    input_view_alignment: int | None = None

    def view(self, handle: Any, offset: int, nbytes: int) -> Any:
        """A handle to the `nbytes` (> 0) at `offset` of a buffer this pool created, usable wherever a buffer handle
        is (launches, copies): an arena's piece (ember.jit's static memory plan). It owns no memory and is never
        given to `release` or `destroy_buffer`; the caller keeps the buffer alive while the view is used. Only for
        pools whose `view_alignment` is positive (then `offset` is a multiple of it); the default cannot."""
        from ember.core.errors import DeviceError

        raise DeviceError(f"{self.name} makes no views of its buffers (view_alignment is 0); allocate a buffer of "
                          f"its own instead")

    def map_in_place(self, path: str, offset: int, nbytes: int) -> Any | None:
        """A buffer of this pool over `nbytes` at `offset` of a file, used where it lies (no copy: pages are read
        when a kernel touches them, and a write stays private to the process), for a pool whose buffers are host
        memory; None where the pool cannot (the default): the bytes are then copied to a buffer of its own. The
        handle is never kept for reuse once released."""
        return None

    def map_region(self, path: str, offset: int, nbytes: int) -> Any:
        """A read-only view of `nbytes` at `offset` of a file, for a pool that maps files (disk); others cannot."""
        from ember.core.errors import DeviceError

        raise DeviceError(f"{self.name} does not map files (its pool is {type(self).__name__}); map weights on a "
                          f"disk device, e.g. 'disk:0'")


class Program(ABC):
    """A compiled kernel. Called with buffer handles in parameter order and the global size."""

    @abstractmethod
    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        """Enqueue the kernel after the events in `wait_for` and return its event (see Event)."""

    def bind(self, buffers: list[Any], global_size: int) -> Callable[[tuple[Event, ...]], Event]:
        """A launch of this kernel with fixed buffers, called again and again (ember.jit's replays); it takes the
        events to wait for and returns the launch's event. Optional: the default calls the program each time; a
        backend converts the handles once where that costs (c: the pointers)."""
        return lambda wait_for: self(buffers, global_size, wait_for)

    def rebind(self, bound: Any, index: int, handle: Any) -> bool:
        """Point `bound`, a launch this program's `bind` made, at `handle` as its buffer `index` (0 the output, then
        the inputs), in place: a replay whose inputs are new buffers at each call (a batch, an optimizer step's
        gradients) keeps its launches bound and joined. `handle` None leaves the launch holding nothing there (it
        must be pointed at a buffer again before it runs). False where the program cannot (the default): the
        caller launches with the new buffers instead."""
        return False


Key = TypeVar("Key")
Value = TypeVar("Value")


class ProgramTable(Generic[Key, Value]):
    """A device's built programs (or driver program objects) by source, the least recently used dropped beyond
    PROGRAMS_KEPT: a program the compile cache evicted is not kept alive here, so its memory (and a c library's
    code) goes once no launch plan or jit replay holds it; one met again is loaded from the disk cache."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.entries: OrderedDict[Key, Value] = OrderedDict()

    def get(self, key: Key) -> Value | None:
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
        return value

    def require(self, key: Key) -> Value:
        """The entry of `key`, which the caller just made or found (KeyError otherwise)."""
        value = self.entries[key]
        self.entries.move_to_end(key)
        return value

    def put(self, key: Key, value: Value) -> None:
        self.entries[key] = value
        self.entries.move_to_end(key)
        limit = PROGRAMS_KEPT if self.limit is None else self.limit
        while len(self.entries) > limit:
            self.entries.popitem(last=False)

    def pop(self, key: Key) -> Value | None:
        return self.entries.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)


class Renderer(Protocol):
    """What a device's renderer offers: kernel IR to source text in one language (the text its compiler takes, and
    what `Device.render` returns), and the language's name for messages ("C", "OpenCL C", "WGSL", "PTX"). The
    built-in renderers derive from `render_steps.StepRenderer`, which walks the linearized kernel and calls one
    method per IR step (manuals/adding-a-backend.md)."""

    language: str

    def render(self, kernel: KernelIR) -> str:
        """The source of one kernel: a function (or entry) named `kernel.name` taking its buffers in order."""
        ...


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
        """Compile several kernels, in order (the scheduler gives all new kernels of a schedule at once). Default:
        compile each; a backend whose compiler has a start-up cost builds them as one unit (c, opencl)."""
        return [self.compile(kernel) for kernel in kernels]

    def compile_quick(self, kernels: list[KernelIR]) -> list[Program] | None:
        """Optional: the kernels built as fast as the compiler can, less optimized (the same values within float
        tolerance, integers exact), for a cold start to launch while `compile_many` builds the optimized programs
        in the background; None where the device has no quicker build, or has every optimized program at hand
        already (in memory or in its disk cache). Default: None."""
        return None

    def compile_background(self, kernels: list[KernelIR]) -> list[Program]:
        """`compile_many` for the optimized builds that replace quick ones (run in a background thread while the
        quick builds run): a device may build them at a low priority. Default: compile_many."""
        return self.compile_many(kernels)

    def synchronize(self) -> None:
        """Wait until every command enqueued on this device has finished (benchmarks; reads use events)."""

    def join_launches(self, launches: list[Callable[[tuple[Event, ...]], Event]]
                      ) -> Callable[[tuple[Event, ...]], Event] | None:
        """Optional: one launch enqueuing a run of this device's bound launches (Program.bind's, in order, each
        after the one before it) at once, called again and again by replays as a bound launch is (cuda: a CUDA
        graph); None where the device has no such form or could not build it (the launches then run one by one).
        Default: None."""
        return None

    def prepare_replays(self) -> None:
        """Optional: build ahead, into the current disk cache, what `join_launches` needs (a plan of a run with
        ember.jit replays carries it: plan/planner.py). Default: nothing."""

