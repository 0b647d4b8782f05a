"""The executor: the one loop that runs a command program (program.py) over a table of slots.

A schedule compiles to one command program: Launch (a kernel writing a slot from slots), Copy (a slot copied into
another pool) and Free (slots released), over numbered slots. No Wait command is needed: every command waits for
the unfinished commands it depends on through events (buffers' events for eager realize, the run's own for a
replay), and a read waits for its buffer's writer.

Who produces programs:
- the schedule cache (schedule.py): a graph's program by node position, a Free after each slot's last use;
- the memory budget (budget/memory_budget.py): the same steps in its plan's order, each computation of an
  intermediate writing a stand-in slot of its own (a recompute is the same step again), evictions as Frees;
- a recording (capture/recording.py, for ember.jit and incremental updates): the launches and copies a realize ran,
  by buffer slot, each with its LaunchBinding (device, compiled program), and the host steps run meanwhile (the
  collectives of ember.distributed: host_call.py); jit puts its state copies first;
- automatic sharding (sharding/automatic.py) rewrites the graph, whose program is the schedule cache's.
Who binds them (what the slots are, how each Launch runs):
- eager realize (realize.py): slots are the graph's nodes, which become buffers as their steps run; each Launch
  bound to its device only (launch_plan.bind_devices: compiled at its launch, timed, recorded);
- a launch plan (launch_plan.plan_launches): the same program with each Launch's compiled program, device and size
  bound once per compile-cache stamp, cached on the program (the per-op path);
- the memory budget: fresh stand-in nodes in its slots at each run, and the assigns that must not write in place;
- a replay (jit's and incremental updates'): slots are buffers; each Launch's program bound to its buffers once
  (launch_plan.bind_buffers), the input slots filled at each run.
`execute` runs every command in order. For nodes, an output that replaces a node (an in-place assign) goes through
launch.run_kernel, which decides whether it writes in place (in_place.schedule_hold counts the table's own
references); timing for profiles and EMBER_DEBUG=2 and the recorder's hooks are launch.py's and copies.py's. For
buffers, events are tracked only once a command is unfinished and put on the buffers at the end."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ember.backends.base import COMPLETED, Event, wait_all
from ember.backends.launch_group import gathering
from ember.capture.arena import ArenaView
from ember.core.graph import Node
from ember.scheduler import profile
from ember.scheduler.buffers import Buffer, pending
from ember.scheduler.copies import enqueue_copy, run_copy
from ember.scheduler.in_place import new_buffer_will_do, schedule_hold
from ember.scheduler.launch import launch, launch_compiled, run_kernel
from ember.scheduler.host_call import run_host_function
from ember.scheduler.program import Command, Copy, Free, HostCall, Launch, LaunchBinding

BoundLaunch = Callable[[tuple[Event, ...]], Event]  # a kernel launch with its buffers bound (Program.bind)


class JoinedLaunches:
    """In a replay's bound launches, at the first command of a run of them: the run enqueued at once (`launch`,
    from Device.join_launches: cuda's CUDA graph, c's one runner call), up to the command before `end` (Frees
    between the launches are part of the run; the positions after the first are skipped)."""

    __slots__ = ("end", "launch")

    def __init__(self, launch: BoundLaunch, end: int) -> None:
        self.launch, self.end = launch, end


NO_POSITIONS: frozenset[int] = frozenset()
NO_LAST_USES: Mapping[int, int] = {}
NOTHING: list[Any] = []


def execute(commands: Sequence[Command], bindings: Sequence[LaunchBinding | None], table: list[Any],
            last_use: Mapping[int, int] = NO_LAST_USES, not_in_place: Collection[int] = NO_POSITIONS,
            notes: Mapping[int, str] | None = None,
            bound: Sequence[BoundLaunch | JoinedLaunches | None] | None = None, gather: bool = False,
            small_assigns_anywhere: bool = False) -> bool:
    """Run `commands` over `table` (by slot), each kernel step as its `bindings` entry (same position) binds it.

    The slots are nodes (eager realize: each output node becomes a buffer at its step; `last_use`, per slot the
    command of its last use, and `not_in_place`, positions of kernel steps whose assign must not write in place,
    decide in-place assigns; `notes`: EMBER_DEBUG=2 lines printed before the command at their position), or, with
    `bound` (per command, its launch bound to the buffers or None to launch with the table's handles, or a
    JoinedLaunches enqueuing its run of commands at once), buffers (a replay: every slot filled). A replay tracks
    events only once a command is unfinished (synchronous devices never are); what reads the buffers next waits for its commands, also what reads the buffer a written view is
    part of (a box an incremental update writes in place: readers of the whole value wait for it). Returns whether
    a replay left a command unfinished (False: every command was done when enqueued; always False for nodes).

    With `gather` (graph-parallel execution: parallel.py decides which programs), launches that occupy at most
    half of a device are held and run beside each other (backends/launch_group.py); everything held has run when
    this returns.

    With `small_assigns_anywhere` (nothing records the launches: a recording needs arguments written in place), a
    small assigned value whose old buffer nobody else holds is computed into a new buffer without the in-place
    analysis (in_place.new_buffer_will_do)."""
    if gather:
        with gathering():
            return execute(commands, bindings, table, last_use, not_in_place, notes, bound,
                           small_assigns_anywhere=small_assigns_anywhere)
    replaying = bound is not None
    tracking = False
    writers: list[Event | None] = NOTHING
    readers: list[list[Event]] = NOTHING
    if replaying:
        # (a synchronous device's buffers hold COMPLETED and no users: told without calling `done`, ~470 buffers a
        # decode step)
        tracking = any((buffer.event is not COMPLETED and not buffer.event.done) or (
            buffer.users and any(not user.done for user in buffer.users)) for buffer in table if buffer is not None)
        writers = [None] * len(table)
        readers = [[] for _ in table]
    skip_until = 0
    for position, command in enumerate(commands):
        if position < skip_until:  # (run by a JoinedLaunches before it)
            continue
        kind = command.__class__
        if kind is Launch:
            if replaying:  # the slots are buffers
                bound_launch = bound[position]  # type: ignore[index]
                if bound_launch.__class__ is JoinedLaunches:
                    skip_until = bound_launch.end  # type: ignore[union-attr]
                    tracking = _run_joined(commands[position:skip_until], table, writers, readers, tracking,
                                           bound_launch.launch)  # type: ignore[union-attr]
                    continue
                wait_for = () if not tracking else \
                    _wait_for(table, writers, readers, command.output, command.inputs)  # type: ignore[union-attr]
                if bound_launch is not None:
                    event = bound_launch(wait_for)  # type: ignore[operator]
                else:
                    event = _launch_buffers(table, command, bindings[position], wait_for)  # type: ignore[arg-type]
                if tracking or not event.done:
                    tracking = True
                    writers[command.output] = event  # type: ignore[union-attr]
                    readers[command.output] = []  # type: ignore[union-attr]
                    for slot in command.inputs:  # type: ignore[union-attr]
                        readers[slot].append(event)
                continue
            if notes is not None and position in notes:
                profile.debug_print(2, notes[position])
            output: Node = table[command.output]  # type: ignore[union-attr]
            step: LaunchBinding = bindings[position]  # type: ignore[assignment]
            if step.compiled is not None and (output.replaces is None or (
                    small_assigns_anywhere and new_buffer_will_do(output))):
                buffer = Buffer(step.device, step.size, step.dtype)  # type: ignore[arg-type]
                inputs: list[Node] = list(map(table.__getitem__, command.inputs))  # type: ignore[union-attr]
                launch_compiled(output, command.kernel, step.compiled, buffer, inputs, None,  # type: ignore[union-attr]
                                step.device)
                output.become_buffer(buffer)
            else:
                replaced = output.replaces
                held = None if replaced is None or position in not_in_place else \
                    schedule_hold(replaced, table, last_use, position)
                del replaced
                run_kernel(output, command.kernel, [table[slot] for slot in command.inputs],  # type: ignore[union-attr]
                           held, step.device)
            del output
        elif kind is Free:
            for slot in command.slots:  # type: ignore[union-attr]
                table[slot] = None
        elif kind is HostCall:  # only recordings hold host steps, and they are replayed over buffers
            assert replaying, "a host step runs in a replay only (eager code runs its function itself)"
            _host_call_buffers(table, writers, readers, command)  # type: ignore[arg-type]
        elif replaying:
            tracking |= _copy_buffers(table, writers, readers, *command)  # (a Copy: output, source)
        else:
            if notes is not None and position in notes:
                profile.debug_print(2, notes[position])
            run_copy(table[command.output], table[command.source])  # type: ignore[union-attr]
    if tracking:
        _publish(table, writers, readers)
    return tracking


def _run_joined(commands: Sequence[Command], buffers: list[Any], writers: list[Event | None],
                readers: list[list[Event]], tracking: bool, launch: BoundLaunch) -> bool:
    """Enqueue a replay's run of launches at once (one device, in order: the run waits for what any of them
    waits for), then do each command's bookkeeping as if launched alone, and the run's Frees; whether the replay
    tracks events now."""
    launches: list[Launch] = [command for command in commands if command.__class__ is Launch]  # type: ignore[misc]
    wait_for: tuple[Event, ...] = ()
    if tracking:
        events: dict[int, Event] = {}
        for command in launches:
            for event in _wait_for(buffers, writers, readers, command.output, command.inputs):
                events[id(event)] = event
        wait_for = tuple(events.values())
    event = launch(wait_for)
    if tracking or not event.done:
        tracking = True
        for command in launches:
            writers[command.output] = event
            readers[command.output] = []
            for slot in command.inputs:
                readers[slot].append(event)
    for freed in commands:
        if freed.__class__ is Free:
            for slot in freed.slots:  # type: ignore[union-attr]
                buffers[slot] = None
    return tracking


def _launch_buffers(buffers: Sequence[Buffer], command: Launch, binding: LaunchBinding,
                    wait_for: tuple[Event, ...]) -> Event:
    """Launch a replay's kernel step whose launch is not bound ahead (a slot bound anew at each run)."""
    handles = [buffers[command.output].handle, *(buffers[slot].handle for slot in command.inputs)]
    return launch(binding.device, command.kernel, binding.compiled, handles, wait_for)


def _wait_for(buffers: Sequence[Buffer | None], writers: list[Event | None], readers: list[list[Event]], output: int,
              inputs: tuple[int, ...]) -> tuple[Event, ...]:
    """The unfinished commands a command of a replay writing `output` and reading `inputs` must wait for (the
    buffers' own writers and readers from before the run, then the run's)."""
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


def _copy_buffers(buffers: Sequence[Buffer | None], writers: list[Event | None], readers: list[list[Event]],
                  output: int, source: int) -> bool:
    """Enqueue a replay's copy; whether it is unfinished."""
    target, origin = buffers[output], buffers[source]
    assert target is not None and origin is not None
    event, _ = enqueue_copy(target, origin, _wait_for(buffers, writers, readers, output, (source,)))
    writers[output] = event
    readers[output] = []
    readers[source].append(event)
    return not event.done


def _host_call_buffers(buffers: Sequence[Buffer | None], writers: list[Event | None], readers: list[list[Event]],
                       command: HostCall) -> None:
    """Run a replay's host step: once the commands writing its inputs (and reading its output) have finished, its
    function on the inputs' values, written into the output (synchronously: nothing waits for it afterwards)."""
    wait_all(_wait_for(buffers, writers, readers, command.output, command.inputs))
    output = buffers[command.output]
    assert output is not None
    run_host_function(command.function, [buffers[slot] for slot in command.inputs], output)  # type: ignore[misc]
    writers[command.output] = None
    readers[command.output] = []


def _publish(buffers: Sequence[Buffer | None], writers: list[Event | None], readers: list[list[Event]]) -> None:
    """A tracked replay's events onto its buffers: each one's last writer, and its readers."""
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
