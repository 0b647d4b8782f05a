"""Launch groups of a host backend (graph-parallel execution): while the executor runs a program with gathering on
(ember.settings: EMBER_PARALLEL_KERNELS), a kernel launch that runs on one thread (its device's renderer gives it
no more) is held instead of run, and the held launches, as many as the device has cores, run together, each on
one thread, in one call of a small C runner (the calling thread and worker threads of its own take them in turn:
runner_source).

A held launch returns a GroupedEvent, done once its group has run; everything that reads or overwrites its memory
waits on it as on any device's event (waiting runs the group). A launch is held only after its `wait_for` events
are done, and only beside launches whose memory it does not share where either writes (its output against their
buffers, its inputs against their outputs): an arena's slots or a pool's reused buffer may be the same memory
under other names, so the address ranges decide, not the slots. A launch that is not held (it fills the machine,
is too short to gain, has too many parameters) first runs what is held: it runs alone, with all threads.
Groups run when they fill the cores, when something waits for one of their events, and when gathering ends."""

from __future__ import annotations

import ctypes
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ember.backends.base import Event

MAX_GROUPED_PARAMETERS = 64  # a kernel with more parameters than this is never held (the runner's calls below)
# the last argument of a c kernel that reads whether its threads are awake (c.warm_parallel): the address of a 1
# (WARM: right after a launch on every core, in a run of launches) or of a 0 (COLD)
_FLAGS = (ctypes.c_int * 2)(0, 1)
COLD = ctypes.addressof(_FLAGS)
WARM = COLD + ctypes.sizeof(ctypes.c_int)
# a kernel whose last run took less than this is never held: running it beside another saves less than waking a
# sleeping worker thread and handing it the group costs (measured: two MLP towers' 20-40 us kernels all held ran
# 2x slower as jit replays on the busy 2-core machine)
MIN_GROUPED_SECONDS = 100e-6

Range = tuple[int, int]  # [first byte, past the last byte) of a buffer's memory


def runner_source() -> str:
    """The C runner: `ember_run_group` runs `count` kernels, the calling thread and `workers` threads of its own
    (started at the first call, asleep between groups) each taking the next kernel not yet taken until none is
    left, and writes each one's start and end (CLOCK_MONOTONIC seconds, the clock of Python's time.perf_counter on
    Linux). The caller waits only for kernels a worker took: a worker woken late (a busy machine) finds nothing
    left and the group ran as fast as one after the other; without workers (a forked child) the caller runs them
    all. Every kernel runs on one thread (its OpenMP loop, if any, too). A kernel is called through a pointer to a
    function of as many `void *` parameters as it has pointer parameters: the same call on every ABI ember's C
    kernels run on. `ember_run_sequence` runs `count` kernels one after the other on the calling thread (each with
    its OpenMP loop): a replay's run of launches in one call (CDevice.join_launches)."""
    cases = []
    for count in range(1, MAX_GROUPED_PARAMETERS + 1):
        parameters = ", ".join(["void *"] * count)
        arguments = ", ".join(f"a[{index}]" for index in range(count))
        cases.append(f"    case {count}: ((void (*)({parameters}))function)({arguments}); break;")
    return """#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>
typedef struct {
  int count; void **functions; void ***arguments; const int *argument_counts; double *times;
  atomic_int next; int inside;
} ember_group;
static pthread_mutex_t ember_group_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ember_group_wake = PTHREAD_COND_INITIALIZER, ember_group_left = PTHREAD_COND_INITIALIZER;
static ember_group *ember_group_current = NULL;
static unsigned long ember_group_generation = 0;
static int ember_group_workers = 0;
static double ember_group_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9; }
static void ember_group_call(void *function, void **a, int count) {
  switch (count) {
""" + "\n".join(cases) + """
    default: break;
  }
}
static void ember_group_take(ember_group *group) {
  for (;;) {
    int member = atomic_fetch_add(&group->next, 1);
    if (member >= group->count) return;
    group->times[2 * member] = ember_group_now();
    ember_group_call(group->functions[member], group->arguments[member], group->argument_counts[member]);
    group->times[2 * member + 1] = ember_group_now();
  }
}
static void *ember_group_worker(void *unused) {
  unsigned long seen = 0;
  (void)unused;
  omp_set_num_threads(1);
  pthread_mutex_lock(&ember_group_lock);
  for (;;) {
    while (ember_group_generation == seen) pthread_cond_wait(&ember_group_wake, &ember_group_lock);
    seen = ember_group_generation;
    ember_group *group = ember_group_current;
    if (group == NULL) continue;
    group->inside++;
    pthread_mutex_unlock(&ember_group_lock);
    ember_group_take(group);
    pthread_mutex_lock(&ember_group_lock);
    group->inside--;
    pthread_cond_broadcast(&ember_group_left);
  }
  return NULL;
}
void ember_run_sequence(int count, void **functions, void ***arguments, const int *argument_counts) {
  for (int member = 0; member < count; member++)
    ember_group_call(functions[member], arguments[member], argument_counts[member]);
}
void ember_run_group(int count, void **functions, void ***arguments, const int *argument_counts, double *times,
                     int workers) {
  ember_group group = {count, functions, arguments, argument_counts, times, 0, 0};
  int threads = omp_get_max_threads();
  pthread_mutex_lock(&ember_group_lock);
  while (ember_group_workers < workers) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, ember_group_worker, NULL) != 0) break;
    pthread_detach(thread);
    ember_group_workers++;
  }
  ember_group_current = &group;
  ember_group_generation++;
  pthread_cond_broadcast(&ember_group_wake);
  pthread_mutex_unlock(&ember_group_lock);
  omp_set_num_threads(1);
  ember_group_take(&group);
  omp_set_num_threads(threads);
  pthread_mutex_lock(&ember_group_lock);
  ember_group_current = NULL;
  while (group.inside > 0) pthread_cond_wait(&ember_group_left, &ember_group_lock);
  pthread_mutex_unlock(&ember_group_lock);
}
"""


class Gathering:
    """Whether launches are gathered now, by which thread, and the groups holding launches."""

    def __init__(self) -> None:
        self.active = False
        self.thread = 0
        self.holding: list[LaunchGroup] = []


GATHERING = Gathering()


@contextmanager
def gathering() -> Iterator[None]:
    """Gather the calling thread's launches into groups inside the block; whatever is held runs at its end."""
    if GATHERING.active:  # (already gathering: the outer block runs what is held)
        yield
        return
    GATHERING.thread = threading.get_ident()
    GATHERING.active = True
    try:
        yield
    finally:
        GATHERING.active = False
        run_held()


def run_held() -> None:
    """Run every group holding launches."""
    while GATHERING.holding:
        GATHERING.holding.pop().run()


class GroupedEvent(Event):
    """A launch held in a group: done once the group has run (waiting runs it). `start` and `end` are its
    perf_counter times then; `records` (profile.KernelRecord) get them."""

    __slots__ = ("end", "finished", "group", "records", "start")

    def __init__(self, group: LaunchGroup) -> None:
        self.group = group
        self.finished = False
        self.start = self.end = 0.0
        self.records: list[Any] = []

    def wait(self) -> None:
        if not self.finished:
            self.group.run()

    @property
    def done(self) -> bool:
        return self.finished


class HeldLaunch:
    """One launch a group holds: its kernel, function (and its address), arguments as a C array, memory."""

    __slots__ = ("arguments", "count", "event", "function", "keep_alive", "kernel", "pointer", "reads", "write")

    def __init__(self, kernel: Any, function: Any, pointer: int, arguments: Any, count: int, write: Range,
                 reads: list[Range], keep_alive: Any, event: GroupedEvent) -> None:
        self.kernel, self.function, self.pointer = kernel, function, pointer
        self.arguments, self.count = arguments, count
        self.write, self.reads, self.keep_alive, self.event = write, reads, keep_alive, event


class LaunchGroup:
    """The launches held for one device of `cores` cores; `load_runner` gives the C runner's function (built once,
    at the first group of two)."""

    def __init__(self, cores: int, load_runner: Callable[..., Any]) -> None:
        self.cores = cores
        self.load_runner = load_runner
        self.runner: Any = None
        self.held: list[HeldLaunch] = []
        self._sequence_runner: Any = None  # ember_run_sequence (False: it did not build)

    def sequence_runner(self) -> Any:
        """The C runner's `ember_run_sequence`, which runs launches in order in one call (a jit replay's joined
        launches, the launch queue's held ones), built once; None where it did not build (said once: both then
        launch their kernels one by one)."""
        if self._sequence_runner is None:
            try:
                self._sequence_runner = self.load_runner("ember_run_sequence")
            except Exception as error:  # noqa: BLE001 - a compiler or loader failure: launches run one by one
                self._sequence_runner = False
                warnings.warn(f"ember: c kernels of eager programs and jit replays launch one by one: the C runner "
                              f"that runs them back to back did not build ({type(error).__name__}: "
                              f"{str(error)[:200]})", RuntimeWarning, stacklevel=3)
        return self._sequence_runner or None

    def hold(self, kernel: Any, function: Any, pointer: int, arguments: Any, count: int, ranges: list[Range],
             wait_for: tuple[Event, ...], keep_alive: Any) -> Event | None:
        """Hold a launch of `kernel` (whose `threads` are the cores it occupies and `seconds` the time its last run
        took; a group sets it) with its output's memory first in `ranges` and `keep_alive` holding that memory, and
        return its event; None where the caller must run it now: not gathering in this thread; or (then what is
        held runs first) it occupies more cores than one, the device has one, its last run took less than
        MIN_GROUPED_SECONDS (or it has not run), or it has more parameters than the runner passes."""
        if not GATHERING.active or GATHERING.thread != threading.get_ident():
            return None  # (another thread's launch: the scheduler's lock keeps it from running meanwhile)
        if kernel.threads != 1 or kernel.seconds < MIN_GROUPED_SECONDS or self.cores < 2 or \
                count > MAX_GROUPED_PARAMETERS:
            if self.held:
                self.run()
            return None
        for event in wait_for:  # (one of this group's events runs the group)
            if not event.done:
                event.wait()
        write, reads = ranges[0], ranges[1:]
        if self.held and self._conflicts(write, reads):
            self.run()
        event = GroupedEvent(self)
        if not self.held:
            GATHERING.holding.append(self)
        self.held.append(HeldLaunch(kernel, function, pointer, arguments, count, write, reads, keep_alive, event))
        if len(self.held) >= self.cores:
            self.run()
        return event

    def _conflicts(self, write: Range, reads: list[Range]) -> bool:
        """Whether a launch shares memory with a held one where either writes."""
        for held in self.held:
            if _overlap(write, held.write) or any(_overlap(write, other) for other in held.reads):
                return True
            if any(_overlap(read, held.write) for read in reads):
                return True
        return False

    def run(self) -> None:
        """Run the held launches (together when there are several) and finish their events."""
        held, self.held = self.held, []
        if self in GATHERING.holding:
            GATHERING.holding.remove(self)
        if not held:
            return
        if len(held) == 1:
            launch = held[0]
            launch.event.start = time.perf_counter()
            launch.function(*launch.arguments)
            launch.event.end = time.perf_counter()
        else:
            if self.runner is None:
                self.runner = self.load_runner()
            count = len(held)
            functions = (ctypes.c_void_p * count)(*[launch.pointer for launch in held])
            arguments = (ctypes.c_void_p * count)(*[ctypes.addressof(launch.arguments) for launch in held])
            counts = (ctypes.c_int * count)(*[launch.count for launch in held])
            times = (ctypes.c_double * (2 * count))()
            self.runner(count, functions, arguments, counts, times, self.cores - 1)
            for index, launch in enumerate(held):
                launch.event.start, launch.event.end = times[2 * index], times[2 * index + 1]
        for launch in held:
            event = launch.event
            event.finished = True
            for record in event.records:
                record.start, record.end, record.seconds = event.start, event.end, event.end - event.start
            event.records = []
            launch.kernel.seconds = event.end - event.start
            launch.keep_alive = None


def _overlap(first: Range, second: Range) -> bool:
    return first[0] < second[1] and second[0] < first[1]
