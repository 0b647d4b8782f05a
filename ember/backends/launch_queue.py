"""The launch queue of host kernels: while the executor runs an eager program (realize's launch-plan path, for a
program of two launches or more: `open_queue`), a c kernel's launch is held here instead of run, and the held
launches run in program order, back to back, in one call of the C runner's `ember_run_sequence`
(launch_group.runner_source) when the program ends, or before anything else touches host memory (`flush_launches`:
a copy, an upload, a read). Python's work between the kernels (the executor's, ~10-20 us a launch) then no longer
runs between them: their data stays in the caches and their OpenMP threads awake (one step's launches replayed back
to back took 15-35% less time than they took between the executor's work: ResNet's 12.0 -> 9.3-10.7 ms,
char_lstm's 54 -> 35-38).

Why it is safe: the kernels run in program order, as they would one by one, so a buffer released and reused within
the program is written only after every held reader of its old value has run. A held launch keeps its buffers'
memory (their handles) and its program's library, so nothing it uses goes away before it runs; memory the pool
would have given back meanwhile (`note_released`) runs the queue once it passes MAX_RELEASED_BYTES, and the queue
runs after MAX_QUEUED launches at most. A launch event is COMPLETED as before: nothing reads a buffer without going
through the pool's copies, which flush first, and no queue outlives the program's `execute`."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from ember.backends.launch_group import COLD, MAX_GROUPED_PARAMETERS, WARM

MAX_QUEUED = 256  # launches held before the queue runs them
MAX_RELEASED_BYTES = 1 << 28  # memory the pool released while launches were held, held by them until they run
POINTER_BYTES = ctypes.sizeof(ctypes.c_void_p)


class LaunchQueue:
    """The held launches, in order: each one's function address and pointer arguments (one flat list, with each
    launch's start and count), its program (its function and library) and its buffers' handles."""

    __slots__ = ("active", "addresses", "counts", "handles", "parallel", "pointers", "programs", "released_bytes",
                 "starts", "thread")

    def __init__(self) -> None:
        self.active = False
        self.thread = 0
        self.addresses: list[int] = []
        self.pointers: list[int] = []
        self.starts: list[int] = []
        self.counts: list[int] = []
        self.programs: list[Any] = []
        self.handles: list[Any] = []
        self.released_bytes = 0
        self.parallel = False  # whether the last launch held runs on every core (its threads awake for the next)

    def hold(self, program: Any, pointers: list[int], handles: list[Any]) -> bool:
        """Hold a launch of `program` (a CProgram: `function`, `address`, and `group`, whose `sequence_runner` runs
        the held launches) with `pointers` as its arguments; False where the caller must run it itself (more
        parameters than the runner passes: the queue has run first)."""
        count = len(pointers)
        if count > MAX_GROUPED_PARAMETERS:
            self.flush()
            return False
        if program.warm:  # (runs on every core right after a launch that does: c.warm_parallel)
            pointers[-1] = WARM if self.parallel else COLD
        self.parallel = program.runs_parallel(pointers)
        self.starts.append(len(self.pointers))
        self.pointers += pointers
        self.counts.append(count)
        self.addresses.append(program.address)
        self.programs.append(program)
        self.handles.append(handles)
        if len(self.addresses) >= MAX_QUEUED or self.released_bytes > MAX_RELEASED_BYTES:
            self.flush()
        return True

    def flush(self) -> None:
        """Run the held launches in order (one call of the runner) and forget them."""
        count = len(self.addresses)
        if count == 0:
            return
        addresses, pointers, starts, counts, programs, handles = (self.addresses, self.pointers, self.starts,
                                                                 self.counts, self.programs, self.handles)
        self.addresses, self.pointers, self.starts, self.counts, self.programs, self.handles = [], [], [], [], [], []
        self.released_bytes = 0
        self.parallel = False  # (the next launch held runs after the Python that follows this run)
        runner = programs[0].group.sequence_runner() if count > 1 else None
        if runner is None:
            for program, start, arguments in zip(programs, starts, counts):
                program.function(*pointers[start:start + arguments])
        else:
            flat = (ctypes.c_void_p * len(pointers))(*pointers)
            base = ctypes.addressof(flat)
            runner(count, (ctypes.c_void_p * count)(*addresses),
                   (ctypes.c_void_p * count)(*[base + start * POINTER_BYTES for start in starts]),
                   (ctypes.c_int * count)(*counts))
        del handles, programs  # (the memory and libraries the launches used, kept until they ran)

    def note_released(self, nbytes: int) -> None:
        """The pool let memory go (to numpy) that a held launch may still use: it stays held until the queue runs,
        which it does once such memory passes MAX_RELEASED_BYTES (at the next launch held)."""
        self.released_bytes += nbytes


QUEUE = LaunchQueue()


def open_queue() -> bool:
    """Hold the calling thread's host kernel launches from now on; False where the queue is open already (whoever
    opened it closes it). The caller closes it in a `finally` (also when it raises: the buffers the held launches
    write were made for them). (Functions, not a context manager: a realize of two launches is ~40 us of Python.)"""
    if QUEUE.active:
        return False
    QUEUE.thread = threading.get_ident()
    QUEUE.active = True
    return True


def close_queue() -> None:
    """Run what is held and stop holding launches."""
    QUEUE.active = False
    QUEUE.flush()


def flush_launches() -> None:
    """Run the held launches now (before host memory is read or written other than by a kernel)."""
    if QUEUE.addresses:
        QUEUE.flush()
