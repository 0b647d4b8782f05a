"""Running recorded commands again (ember.jit's replays, incremental updates): launches and copies by buffer slot,
in their recorded order, each after the unfinished commands it depends on, the buffers' events brought up to date."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ember.backends.base import Event
from ember.capture.arena import ArenaView
from ember.scheduler.buffers import Buffer, pending
from ember.scheduler.copies import enqueue_copy
from ember.scheduler.launch import launch
from ember.capture.recording import RecordedCopy, RecordedLaunch

Step = RecordedLaunch | RecordedCopy
BoundLaunch = Callable[[tuple[Event, ...]], Event]


def bind_steps(steps: Sequence[Step], buffers: Sequence[Buffer | None]) -> list[BoundLaunch | None]:
    """Per step, its launch bound to its buffers (Program.bind), or None for a copy and for a launch touching a
    slot that is bound anew at each run (None in `buffers`)."""
    bound: list[BoundLaunch | None] = []
    for step in steps:
        slots = (step.output, step.source) if isinstance(step, RecordedCopy) else (step.output, *step.inputs)
        if isinstance(step, RecordedCopy) or any(buffers[slot] is None for slot in slots):
            bound.append(None)
            continue
        handles = [buffers[slot].handle for slot in slots]  # type: ignore[union-attr]
        bound.append(step.compiled.program.bind(handles, step.compiled.ir.global_size))
    return bound


def run_steps(steps: Sequence[Step], bound: Sequence[BoundLaunch | None], buffers: Sequence[Buffer | None],
              state_copies: Sequence[tuple[int, int]] = ()) -> None:
    """Run `state_copies` (target slot, source slot), then the steps over `buffers` (every slot filled). Events are
    tracked only once a command is unfinished (synchronous devices never are); what reads the buffers next waits for
    these commands, also what reads the buffer a written view is part of (a box an incremental update writes in
    place: readers of the whole value wait for it)."""
    tracking = any(not buffer.event.done or any(not user.done for user in buffer.users)
                   for buffer in buffers if buffer is not None)
    writers: list[Event | None] = [None] * len(buffers)
    readers: list[list[Event]] = [[] for _ in buffers]
    for target, source in state_copies:
        tracking |= _run_copy(buffers, writers, readers, target, source)
    for step, bound_launch in zip(steps, bound):
        if isinstance(step, RecordedCopy):
            tracking |= _run_copy(buffers, writers, readers, step.output, step.source)
            continue
        wait_for = _wait_for(buffers, writers, readers, step.output, step.inputs) if tracking else ()
        if bound_launch is not None:
            event = bound_launch(wait_for)
        else:
            handles = [buffers[step.output].handle,  # type: ignore[union-attr]
                       *(buffers[slot].handle for slot in step.inputs)]  # type: ignore[union-attr]
            event = launch(step.device, step.kernel, step.compiled, handles, wait_for)
        if tracking or not event.done:
            tracking = True
            writers[step.output] = event
            readers[step.output] = []
            for slot in step.inputs:
                readers[slot].append(event)
    if tracking:
        for slot, buffer in enumerate(buffers):
            if buffer is None:
                continue
            writer = writers[slot]
            if writer is not None:
                buffer.event = writer
                if isinstance(buffer, ArenaView):  # (devices with views run commands in order: the last one wins)
                    buffer.arena.add_user(writer)
                    buffer.arena.event = writer
            for event in readers[slot]:
                buffer.add_user(event)


def _wait_for(buffers: Sequence[Buffer | None], writers: list[Event | None], readers: list[list[Event]], output: int,
              inputs: tuple[int, ...]) -> tuple[Event, ...]:
    """The unfinished commands a command writing `output` and reading `inputs` must wait for (the buffers' own
    writers and readers from before the run, then the run's)."""
    events: list[Event] = []
    for slot in (*inputs, output):
        writer = writers[slot]
        if writer is None:
            buffer = buffers[slot]
            assert buffer is not None
            events.append(buffer.event)
            if slot == output:
                events.extend(buffer.users)
        else:
            events.append(writer)
    events.extend(readers[output])
    return pending(*events)


def _run_copy(buffers: Sequence[Buffer | None], writers: list[Event | None], readers: list[list[Event]], output: int,
              source: int) -> bool:
    """Enqueue a recorded copy; whether it is unfinished."""
    target, origin = buffers[output], buffers[source]
    assert target is not None and origin is not None
    event, _ = enqueue_copy(target, origin, _wait_for(buffers, writers, readers, output, (source,)))
    writers[output] = event
    readers[output] = []
    readers[source].append(event)
    return not event.done
