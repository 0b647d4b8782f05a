"""ember.jit: capture the kernel launches of a function once, then replay them with new inputs: no graph, no
schedule, no compile and no allocation on replay; the capture's intermediates get a static memory plan (arena.py)."""

from __future__ import annotations

import functools
import operator
import sys
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from ember.backends.base import wait_all
from ember.context import CONTEXT, update
from ember.core.creation import RandomState, random_key
from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.tensor import Tensor, realize
from ember.scheduler import profile
from ember.capture.arena import ArenaView, DevicePlan, place_intermediates
from ember.capture.shared_arena import DEFAULT_POOL, JitMemoryPool
from ember.scheduler.buffers import Buffer, buffer_of, pending
from ember.scheduler.lock import SCHEDULER_LOCK
from ember.capture.recording import Recorder
from ember.scheduler.executor import BoundLaunch, JoinedLaunches, execute
from ember.scheduler.launch_plan import Rebinding, bind_buffers, bind_rebindable
from ember.scheduler.parallel import replay_gathers
from ember.settings import CONFIG
from ember.scheduler.program import CommandProgram, Copy, Launch, LaunchBinding

RECAPTURE_WARNING_AFTER = 3  # re-captures (inputs of new shapes) before a one-line warning


class JitError(RuntimeError):
    """A jitted function was called in a way its capture cannot replay."""


@dataclass
class Capture:
    """One recorded call: its command program by buffer slot (the state copies first, then the recorded steps) with
    each command's LaunchBinding, the slot buffers, and where inputs and outputs are."""

    key: list[Any]
    program: CommandProgram
    bindings: list[LaunchBinding | None]
    buffers: list[Buffer | None]  # by slot; None for a slot bound to an input at each replay
    input_slots: list[tuple[int, int]]  # (input position, slot)
    outputs: list[Any]  # per output leaf: ("input", position) | ("slot", (slot, shape)) | ("value", object)
    rebuild: Callable[[list[Any]], Any]
    state_copies: list[tuple[int, int]]  # (target slot, source slot) copied before the steps (the program's first)
    memory_plan: dict[str, DevicePlan]
    checks: list[tuple[int, Any]]  # (slot of a value check's violation, its describe function): read after a replay
    kernels: int = 0
    # random draws (core/creation.py): (slot of the key's buffer, draw's counter less the call's first, count), and
    # how far one call advances the counter; a replay writes each key from the generator state as eager would
    random_keys: tuple[tuple[int, int, int], ...] = ()
    random_advance: int = 0
    # per command, made at the first replay (again after the memory pool moved the intermediates to grown memory)
    bound: list[BoundLaunch | JoinedLaunches | None] | None = None
    # the launches reading or writing inputs too, bound to `bound_inputs` (the input buffers of two replays in a
    # row: a decode step's staged token and its caches): made when a replay's inputs are the last replay's, used
    # while they stay those buffers, dropped at the first replay with others; `last_inputs` refers to the last
    # replay's input buffers weakly (a new batch at each call is freed as before; a freed buffer's id, and its
    # memory, may be the next input's)
    bound_with_inputs: list[BoundLaunch | JoinedLaunches | None] | None = None
    bound_inputs: tuple[Buffer, ...] = ()
    last_inputs: tuple[weakref.ref[Buffer], ...] = ()
    # where every launch touching an input can be pointed at the input's buffer in place (launch_plan.
    # bind_rebindable; c): every launch bound and joined, made with `bound` (`rebinding_refused`: the device cannot);
    # `pointed`, per input slot, a weak reference to the buffer its launches point at (None: none). Before a
    # replay, the slots whose buffer is another (or gone) are pointed at it; after it, those whose buffer was not
    # the last replay's too (a new batch at each call) are pointed at none, so that the capture does not hold their
    # memory, while inputs passed again (state, an optimizer's parameters) stay bound. Weak: a buffer the capture
    # held would look in use to whoever asks whether anything else holds it (a bound backward pass reuses a
    # gradient's buffer that nothing holds: autograd/bound_backward.py)
    rebinding: Rebinding | None = None
    rebinding_refused: bool = False
    pointed: dict[int, weakref.ref[Buffer] | None] = field(default_factory=dict)
    new_inputs: list[int] = field(default_factory=list)  # the input slots of the replay running that are new
    memory_pool: JitMemoryPool | None = None  # where the intermediates live (shared with other captures)
    shared_memories: list[Any] = field(default_factory=list)  # the pool's memory of each device it uses


class Jitted:
    """A function whose calls after the first two replay the kernels the second call launched (see `jit`)."""

    def __init__(self, function: Callable[..., Any], recapture: bool = True,
                 memory_pool: JitMemoryPool | None = None) -> None:
        functools.update_wrapper(self, function)
        self.function = function
        self.recapture = recapture
        if memory_pool is not None and not isinstance(memory_pool, JitMemoryPool):
            raise TypeError(f"ember.jit: memory_pool must be an ember.JitMemoryPool, got {type(memory_pool).__name__}")
        self.memory_pool = DEFAULT_POOL if memory_pool is None else memory_pool
        self.capture: Capture | None = None
        self.captures = 0
        self.replays = 0
        self._first_call: tuple[list[Any], list[tuple[tuple[int, ...], str, bytes]], list[tuple[int, int]]] | None \
            = None

    @property
    def memory_plan(self) -> dict[str, DevicePlan]:
        """Per device, the static plan of the capture's intermediate buffers (empty before a capture)."""
        return {} if self.capture is None else self.capture.memory_plan

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # (tensors alone, the common call, are their own leaves)
        leaves = list(args) if not kwargs and all(arg.__class__ is Tensor for arg in args) else _leaves((args, kwargs))
        key = _key(leaves)
        if self.capture is not None:
            if _same_key(self.capture.key, key):
                return self._replay(self.capture, leaves)
            if not self.recapture:
                raise JitError(
                    f"ember.jit({self.function.__name__}): called with inputs {_describe(key)}, but it was captured "
                    f"for {_describe(self.capture.key)}; use inputs of the captured shapes, dtypes and devices, or "
                    "ember.jit(function, recapture=True) to capture again"
                )
            self.capture = None
            self._first_call = None
            if self.captures >= RECAPTURE_WARNING_AFTER:
                warnings.warn(f"ember.jit({self.function.__name__}) captured again for inputs {_describe(key)} "
                              f"({self.captures} captures so far): replays need inputs of one signature",
                              stacklevel=2)
        if self._first_call is None or not _same_key(self._first_call[0], key):
            # the inputs first, as a capture does: their uploads are not the function's (compared with the capture's)
            realize(*(leaf for leaf in leaves if isinstance(leaf, Tensor)))
            uploads = Recorder(commands=False)
            start = RandomState.counter
            result = self._record(uploads, args, kwargs)
            self._first_call = (key, uploads.uploads, _draws(uploads, start))
            return result
        return self._capture(key, leaves, args, kwargs)

    def _record(self, recorder: Recorder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if CONTEXT.get().recorder is not None:
            raise JitError(f"ember.jit({self.function.__name__}): a jitted function cannot run inside another "
                           "one's capture")
        update(recorder=recorder)  # records what this thread runs only (ember/context.py)
        try:
            result = self.function(*args, **kwargs)
            # the outputs, the arguments and any tensor changed in place (state the function reaches from outside its
            # arguments too) in one schedule
            changed = [tensor for tensor in (reference() for reference in recorder.assigned) if tensor is not None]
            recorder.assigned.clear()
            realize(*(leaf for leaf in _leaves((result, args, kwargs)) if isinstance(leaf, Tensor)), *changed)
            del changed
        finally:
            update(recorder=None)
        return result

    def _capture(self, key: list[Any], leaves: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        inputs = [(position, leaf) for position, leaf in enumerate(leaves) if isinstance(leaf, Tensor)]
        realize(*(tensor for _, tensor in inputs))
        input_buffers = [(position, buffer_of(tensor.node)) for position, tensor in inputs]
        recorder = Recorder()
        start = RandomState.counter
        result = self._record(recorder, args, kwargs)
        assert self._first_call is not None
        if recorder.uploads and recorder.uploads != self._first_call[1]:
            raise JitError(
                f"ember.jit({self.function.__name__}): the function made tensors from Python values that differ "
                "between its first two calls (e.g. a step count or a bias correction read from Python); a replay "
                "would reuse the captured values. Keep such values in tensors updated in place"
            )
        if _draws(recorder, start) != self._first_call[2]:
            raise JitError(
                f"ember.jit({self.function.__name__}): the function drew different amounts of random numbers in its "
                "first two calls; a replay draws what the captured call drew"
            )
        random_keys = tuple((slot, counter - start, count) for slot, counter, count in recorder.random_keys)
        random_advance = RandomState.counter - start
        self._first_call = None
        input_slots = [(position, recorder.slot_of[id(buffer)]) for position, buffer in input_buffers
                       if id(buffer) in recorder.slot_of]
        rebound_inputs = {old for old, _ in recorder.rebound} & {slot for _, slot in input_slots}
        if rebound_inputs:
            raise JitError(
                f"ember.jit({self.function.__name__}): the function changes an argument in place in a way that needs "
                "a new buffer (another tensor still reads its old value, or the new value reads the old one at other "
                "positions, e.g. a flip or a transpose); a replay could not give the new value back to the caller's "
                "tensor. Return the new value instead"
            )
        output_leaves, rebuild = _flatten(result)
        outputs: list[Any] = []
        input_position_of = {id(buffer): position for position, buffer in input_buffers}
        for leaf in output_leaves:
            if not isinstance(leaf, Tensor):
                outputs.append(("value", leaf))
                continue
            buffer = buffer_of(leaf.node)
            if id(buffer) in input_position_of:
                outputs.append(("input", input_position_of[id(buffer)]))
            else:
                outputs.append(("slot", (recorder.slot(buffer), leaf.shape)))
            del buffer
        del input_buffers, input_position_of, output_leaves
        self.capture = _plan(recorder, key, input_slots, outputs, rebuild, self.memory_pool)
        self.capture.random_keys, self.capture.random_advance = random_keys, random_advance
        self.captures += 1
        if profile.debug_level() >= 1:
            for device_name, plan in self.capture.memory_plan.items():
                profile.debug_print(1, f"ember.jit({self.function.__name__}) memory plan on {device_name}: "
                                       f"{plan.describe()}")
        return result

    def replay_in_place(self, leaves: list[Any]) -> None:
        """A call the caller knows to match the capture's key, replayed without comparing the inputs with the key
        again, whose results the caller does not read: the optimizer's step replays, whose own signature holds the
        key and whose updates are written into their arguments. `leaves`: the call's arguments as `_leaves`
        flattens them; no result is built."""
        assert self.capture is not None, "replay_in_place before a capture"
        self._replay(self.capture, leaves, results=False)

    def _replay(self, capture: Capture, leaves: list[Any], results: bool = True) -> Any:
        realize(*(leaf for leaf in leaves if isinstance(leaf, Tensor) and not leaf.node.realized))
        with SCHEDULER_LOCK:  # (the pools and device queues are shared with other threads)
            assert capture.memory_pool is not None
            capture.memory_pool.enter(capture)  # (another capture may have used the intermediates' memory)
            buffers = capture.buffers
            if capture.input_slots:
                buffers = list(buffers)
                for position, slot in capture.input_slots:
                    buffers[slot] = buffer_of(leaves[position].node)
            if capture.random_advance:
                _draw_keys(capture)
            if capture.bound is None:
                capture.bound = bind_buffers(capture.program, capture.bindings, capture.buffers)
                capture.bound_with_inputs, capture.bound_inputs = None, ()
                capture.rebinding, capture.rebinding_refused, capture.pointed = None, False, {}
            bound = _bound_for_inputs(capture, buffers) if capture.input_slots else capture.bound
            unfinished = execute(capture.program.commands, capture.bindings, buffers, bound=bound,
                                 gather=CONFIG.parallel_kernels and replay_gathers(capture.program))
            if capture.rebinding is not None and not unfinished:
                _release_new_inputs(capture)
            capture.memory_pool.leave(capture, unfinished)
        self.replays += 1
        for slot, describe in capture.checks:  # value checks (core/checks.py) raise as they would without jit
            violation = buffers[slot]
            assert violation is not None
            position = int(violation.read()[0])
            if position >= 0:
                error = describe(position, None)
                error.args = (f"{error.args[0]} (in a replay of ember.jit({self.function.__name__}); the "
                              "values it computed are wrong and its in-place updates are done)",)
                raise error
        if not results:
            return None
        values = []
        for kind, where in capture.outputs:
            if kind == "value":
                values.append(where)
            elif kind == "input":
                values.append(leaves[where])
            else:
                slot, shape = where
                buffer = buffers[slot]
                assert buffer is not None
                node = Node(Op.BUFFER, (), None, shape, buffer.dtype, buffer.device_name)
                node.buffer = buffer
                values.append(Tensor._from_node(node))
        return capture.rebuild(values)


def _bound_for_inputs(capture: Capture, buffers: list[Buffer | None]) -> list[BoundLaunch | JoinedLaunches | None]:
    """The launches of a replay whose input buffers are `buffers`' input slots. Where the device points bound
    launches at other buffers in place (Capture.rebinding: c), every launch bound and joined, those touching an input
    whose buffer changed pointed at it. Elsewhere: every launch bound (and joined) when these are the buffers of the
    last replay too (state passed in again: a cache, a staged input); else the launches over fixed slots only, those
    touching an input launched one by one (a new batch at each call)."""
    inputs = tuple(cast(Buffer, buffers[slot]) for _, slot in capture.input_slots)
    last, capture.last_inputs = capture.last_inputs, tuple(map(weakref.ref, inputs))
    if capture.rebinding is None and not capture.rebinding_refused:
        capture.rebinding = bind_rebindable(capture.program, capture.bindings, buffers,
                                            {slot for _, slot in capture.input_slots})
        capture.rebinding_refused = capture.rebinding is None
        capture.pointed = {slot: weakref.ref(cast(Buffer, buffers[slot])) for _, slot in capture.input_slots}
    if capture.rebinding is not None:
        targets, pointed, new = capture.rebinding[1], capture.pointed, capture.new_inputs
        new.clear()
        for position, (_, slot) in enumerate(capture.input_slots):
            buffer = inputs[position]
            reference = pointed[slot]
            if reference is None or reference() is not buffer:
                handle = buffer.handle
                for program, launch, index in targets[slot]:
                    program.rebind(launch, index, handle)
                pointed[slot] = weakref.ref(buffer)
            if position >= len(last) or last[position]() is not buffer:
                new.append(slot)
        return capture.rebinding[0]
    bound_inputs = capture.bound_inputs
    if len(bound_inputs) == len(inputs) and all(map(operator.is_, inputs, bound_inputs)):
        assert capture.bound_with_inputs is not None
        return capture.bound_with_inputs
    capture.bound_with_inputs, capture.bound_inputs = None, ()  # (other inputs: the old ones are not held)
    if len(last) != len(inputs) or not all(reference() is buffer for reference, buffer in zip(last, inputs)):
        assert capture.bound is not None
        return capture.bound
    capture.bound_with_inputs = bind_buffers(capture.program, capture.bindings, buffers)
    capture.bound_inputs = inputs  # (held: ids compared alone could be a freed buffer's, reused)
    return capture.bound_with_inputs


def _release_new_inputs(capture: Capture) -> None:
    """After a replay over a rebinding (Capture.pointed): point the launches touching an input slot whose buffer
    was not the previous replay's at none, so that the capture does not hold a new batch."""
    assert capture.rebinding is not None
    targets, pointed = capture.rebinding[1], capture.pointed
    for slot in capture.new_inputs:
        if pointed[slot] is not None:
            for program, launch, index in targets[slot]:
                program.rebind(launch, index, None)
            pointed[slot] = None


def jit(function: Callable[..., Any] | None = None, *, recapture: bool = True,
        memory_pool: JitMemoryPool | None = None) -> Any:
    """Capture a function's kernel launches and replay them (`@ember.jit`, or `ember.jit(function)`).

    The first call runs eagerly, the second runs eagerly while its launches are recorded, later calls with inputs
    of the same shapes, dtypes and devices (and equal non-tensor arguments) replay the recorded kernels: no graph,
    no scheduling, no compiling, no allocation. Inputs of another signature capture again (or raise `JitError` with
    recapture=False). As with torch's CUDA graphs, the tensors a replay returns live in the capture's buffers and
    are overwritten by the next replay (clone them to keep them); Python values the function reads (globals) are
    captured as they were (an optimizer's learning rate and step counts live on the device, so replays see a new
    lr); state must change by in-place updates (`assign`, `+=`, optimizer steps), which replays repeat. Random ops
    (dropout, randn) draw at each replay from the generator as an eager call would: the same numbers for the same
    seed, new ones at every call.

    Inputs passed again (the same tensors' buffers in two replays in a row: state such as a cache, or an input
    overwritten in place) are bound with the launches that read them, so the replay runs every launch bound (on c
    one call for the whole function); the capture then holds those buffers until a replay gets other inputs.

    Memory: a capture's intermediates live in memory shared, per device, by every jitted function of the process
    (`memory_pool`, default one pool for all; see ember.JitMemoryPool): functions that run one after another (a text
    encoder, a denoiser and a decoder) need the memory of the largest capture, not the sum. Unlike a CUDA graph's
    pool, nothing a caller sees lives there: the returned tensors and the state a function updates have buffers of
    their own, so sharing is safe by default; `memory_plan` prints each capture's plan and the shared memory."""
    if function is None:
        return lambda wrapped: Jitted(wrapped, recapture, memory_pool)
    return Jitted(function, recapture, memory_pool)


# ---- planning ----------------------------------------------------------------------------------------------------


def _plan(recorder: Recorder, key: list[Any], input_slots: list[tuple[int, int]], outputs: list[Any],
          rebuild: Callable[[list[Any]], Any], memory_pool: JitMemoryPool) -> Capture:
    """Turn a recording into a replay: classify its buffers, plan the intermediates' memory by their lifetimes."""
    steps = recorder.steps
    buffers: list[Buffer | None] = list(recorder.buffers)
    recorder.buffers.clear()
    escaped = [_held_elsewhere(buffers, slot) for slot in range(len(buffers))]
    first_use: dict[int, int] = {}
    last_use: dict[int, int] = {}
    first_is_write: dict[int, bool] = {}
    for index, step in enumerate(steps):
        reads = (step.source,) if isinstance(step, Copy) else step.inputs
        for slot in reads:
            first_use.setdefault(slot, index)
            first_is_write.setdefault(slot, False)
            last_use[slot] = index
        first_use.setdefault(step.output, index)
        first_is_write.setdefault(step.output, True)
        last_use[step.output] = index
    inputs = {slot for _, slot in input_slots}
    outputs_kept = {where[0] for kind, where in outputs if kind == "slot"}
    outputs_kept |= {slot for slot, _ in recorder.checks}  # read after the steps: never shares arena memory
    intermediate = [slot for slot in range(len(buffers)) if first_is_write.get(slot) and not escaped[slot]
                    and slot not in inputs and slot not in outputs_kept]
    # state an assign could not update in place: the capture reads `old` and writes `new` (which tensors now hold);
    # each replay first copies the current value (new) into old
    successor = dict(recorder.rebound)
    state_copies = []
    for old in successor:
        if old in successor.values() or first_is_write.get(old, True) or old in inputs:
            continue
        new = old
        while new in successor:
            new = successor[new]
        if escaped[new] or new in outputs_kept:
            state_copies.append((old, new))
    memory_plan, placements = place_intermediates(buffers, intermediate, first_use, last_use)
    for _, slot in input_slots:
        buffers[slot] = None
    kernels = sum(isinstance(step, Launch) for step in steps)
    program, bindings = recorder.program([Copy(target, source) for target, source in state_copies])
    capture = Capture(key, program, bindings, buffers, input_slots, outputs, rebuild, state_copies, memory_plan,
                      list(recorder.checks), kernels, memory_pool=memory_pool)
    with SCHEDULER_LOCK:
        memory_pool.attach(capture, placements, memory_plan)
    return capture


def _draws(recorder: Recorder, start: int) -> list[tuple[int, int]]:
    """The random draws of a recorded call: (counter less the call's first, count) of each, in order."""
    return [(counter - start, count) for _, counter, count in recorder.random_draws]


def _draw_keys(capture: Capture) -> None:
    """A replay's random draws: each captured draw's key written for the counter it has in this call (the
    generator's counter now, plus the draw's place in the call), and the counter advanced past the call's draws,
    so a replay draws the numbers an eager call would. The caller holds the scheduler's lock."""
    start = RandomState.counter
    RandomState.counter = start + capture.random_advance
    for slot, offset, _ in capture.random_keys:
        buffer = capture.buffers[slot]
        assert buffer is not None
        wait_all(pending(buffer.event, *buffer.users))  # (a command of the last replay may still read the key)
        buffer.users = []
        buffer.write(random_key(RandomState.seed, start + offset))


def _held_elsewhere(buffers: list[Buffer | None], slot: int) -> bool:
    """Whether a node outside the recording still holds the buffer (a tensor's value: state or an output), or the
    buffer is a view into another one (a box written in place by an incremental update: its memory is that
    buffer's, which outlives the capture; the capture's own arena views are made only after recording)."""
    # references: the list, getrefcount's argument
    return isinstance(buffers[slot], ArenaView) or sys.getrefcount(buffers[slot]) > 2


# ---- arguments ---------------------------------------------------------------------------------------------------


def _leaves(value: Any, into: list[Any] | None = None) -> list[Any]:
    """The leaves of nested tuples, lists and dicts, in `_flatten`'s order (without its rebuilding function: every
    call of a jitted function flattens its arguments)."""
    leaves = [] if into is None else into
    if isinstance(value, (tuple, list)):
        for item in value:
            _leaves(item, leaves)
    elif isinstance(value, dict):
        for item in value.values():
            _leaves(item, leaves)
    else:
        leaves.append(value)
    return leaves


def _flatten(value: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
    """The leaves of nested tuples, lists and dicts, and a function building the same structure from new leaves."""
    if isinstance(value, (tuple, list)):
        parts = [_flatten(item) for item in value]
        kind = type(value)

        def rebuild_sequence(leaves: list[Any]) -> Any:
            items, start = [], 0
            for part_leaves, part_rebuild in parts:
                items.append(part_rebuild(leaves[start:start + len(part_leaves)]))
                start += len(part_leaves)
            return kind(items) if kind in (tuple, list) else kind(*items)

        return [leaf for part_leaves, _ in parts for leaf in part_leaves], rebuild_sequence
    if isinstance(value, dict):
        keys = list(value)
        leaves, rebuild_values = _flatten([value[name] for name in keys])
        return leaves, lambda new: dict(zip(keys, rebuild_values(new)))
    return [value], lambda leaves: leaves[0]


def _key(leaves: list[Any]) -> list[Any]:
    """What a capture is for: each tensor's shape, dtype and device (from its node where it names one), each other
    argument's value."""
    return [("tensor", leaf.node.shape, leaf.node.dtype, leaf.node.device or leaf.device) if isinstance(leaf, Tensor)
            else ("value", leaf) for leaf in leaves]


def _same_key(first: list[Any], second: list[Any]) -> bool:
    if len(first) != len(second):
        return False
    try:
        return all(bool(one == other) for one, other in zip(first, second))
    except Exception:  # noqa: BLE001 - a value that cannot be compared is a different argument
        return False


def _describe(key: list[Any]) -> str:
    parts = [f"{entry[1]} {entry[2].name} on {entry[3]}" if entry[0] == "tensor" else repr(entry[1])
             for entry in key]
    return "(" + ", ".join(parts) + ")"
