"""An optimizer step replayed: its update kernels recorded once per step signature (ember.jit) and launched again.

An eager training step builds the update graph of every parameter anew: a few dozen graph nodes per parameter, which
cost more Python time than the kernels they fuse into (an Adam step of a small model: ~2 ms of graph building for
~0.1 ms of kernels). What an update computes depends only on the parameter group's values, the parameter's state
(which entries exist, which tensors are shared), which parameters have a gradient, and the tensors' shapes, dtypes,
devices and aliasing; everything that changes from step to step (the learning rate, step counts) lives in device
tensors. So the step is a function of its tensors, recorded by `ember.jit` for each signature and replayed while the
signature holds: the same kernels on the current buffers, with no graph, schedule or allocation.

The eager path stays the reference and is used whenever a replay could differ from it or cannot be recorded: under
`ember.jit` capture, a profile, a memory budget, debug output or a trace recording (context.plain is false); for
optimizers that did not declare their updates replayable; and for a signature whose capture was refused (an
argument updated out of place, which `JitError` reports after the step ran eagerly, so the step is never done twice),
or whose eager step changed the signature itself (state made at the first step, a shared step count split): a
replay repeats kernels, not the Python-side changes, so only signatures a step leaves as they were are replayed.
"""

from __future__ import annotations

import sys
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ember.capture.jit import JitError, Jitted
from ember.context import CONTEXT
from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.tensor import Tensor, realize
from ember.core.views import leave_storage
from ember.scheduler.buffers import buffer_of
from ember.scheduler.copies import copied_leaf

if TYPE_CHECKING:
    from ember.optim.optimizer import Optimizer

SIGNATURES_KEPT = 8  # step signatures with a recorded replay, least recently used dropped first
UNCHANGING_KEYS = ("params", "param_names", "lr")  # group entries that never shape the update (lr is a scalar)

Stepped = list[tuple[dict[str, Any], Tensor]]


class StepReplays:
    """The recorded steps of one optimizer, by signature (None for a signature that cannot be replayed)."""

    def __init__(self) -> None:
        self.recorded: OrderedDict[tuple[Any, ...], Jitted | None] = OrderedDict()
        self.stepped: Stepped = []  # the parameters of the call being recorded
        self.replayed = 0  # steps done by a replay (tests and benchmarks read it)

    def run(self, optimizer: Optimizer, stepped: Stepped, update: Callable[[Stepped], list[Tensor]]) -> \
            list[Tensor] | None:
        """Do the step by replay or by recording `update(stepped)`; the tensors left to realize, or None when the
        caller must run the eager step itself (nothing was done)."""
        context = CONTEXT.get()
        if not context.plain or context.trace is not None or not stepped:
            return None
        if any(type(parameter.grad) is not Tensor for _, parameter in stepped):
            return None  # (a sharded or foreign gradient: the eager path knows what to do with it)
        vectors = _step_scalars(optimizer, stepped)
        tensors, written = _arguments(optimizer, stepped, vectors)
        if not ready_to_write(tensors, written):
            return None
        signature = _signature(optimizer, stepped, tensors)
        jitted = recorded_replay(self.recorded, signature, lambda: self._record_function(update))
        if jitted is None:
            return None
        self.stepped = stepped
        replays = jitted.replays
        try:
            if jitted.capture is not None:  # (the signature holds its capture's key: every tensor's shape, dtype, device)
                jitted.replay_in_place(tensors)  # (one list: the leaves of the recorded call's arguments)
            else:
                jitted(tensors)  # (realizes what the update computed, its arguments and the state it made, at once)
        except JitError:  # raised after the recorded call ran (eagerly, in full): keep its result, never replay it
            self.recorded[signature] = None
        finally:
            self.stepped = []
            optimizer._step_shared = {}  # (values shared by one step's updates: they hold its step counts' nodes)
        self.replayed += jitted.replays - replays
        if jitted.replays == replays and _signature(optimizer, stepped, _arguments(optimizer, stepped, vectors)[0]) != signature:
            # the step changed what a step is (made state, split a shared step count): a replay would not repeat
            # those changes, so only signatures that a step leaves as they were are replayed
            self.recorded[signature] = None
        return []

    def _record_function(self, update: Callable[[Stepped], list[Tensor]]) -> Callable[[list[Tensor]], list[Tensor]]:
        """The function ember.jit records: the eager update of the parameters being stepped, returning what it
        computed (the parameters and their state: arguments, except state made by a first step). Its arguments are
        every tensor the update reads, so that a replay reads and writes the buffers they hold at that call."""

        def step_update(tensors: list[Tensor]) -> list[Tensor]:
            del tensors  # (the update reaches them through the optimizer; ember.jit binds their buffers)
            return update(self.stepped)

        return step_update


def _step_scalars(optimizer: Optimizer, stepped: Stepped) -> list[Tensor]:
    """Each stepped parameter's device scalars (the vector), written with its group's current values (computed
    once per group: a hyperparameter changed since the last step is in place before the update reads it)."""
    values: dict[int, tuple[float, ...]] = {}
    vectors = []
    for group, parameter in stepped:
        group_values = values.get(id(group))
        if group_values is None:
            group_values = values[id(group)] = optimizer._scalar_values(group)
        vectors.append(optimizer._scalars(group, parameter, group_values).vector)
    return vectors


def _arguments(optimizer: Optimizer, stepped: Stepped, vectors: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """Every tensor one step's update reads or writes (per parameter: itself, its gradient, its state tensors by
    name and its group's device scalars, `vectors`), and those it writes (the parameters and their state)."""
    tensors: list[Tensor] = []
    written: list[Tensor] = []
    for (_, parameter), vector in zip(stepped, vectors):
        assert parameter.grad is not None
        state = optimizer.state.get(parameter, {})
        kept = [state[name] for name in sorted(state) if isinstance(state[name], Tensor)]
        tensors += (parameter, parameter.grad, *kept, vector)
        written += (parameter, *kept)
    return tensors, written


def ready_to_write(read: list[Tensor], written: list[Tensor]) -> bool:
    """Make a replay's arguments ready to be read (`read`, realized: gradients scaled by clip_grad_norm_,
    parameters changed in place by the user) and written in place (`written`, taken out of their storages and given
    nodes of their own: own_values); False where one is written through the storage of its live views, which the
    eager path does (nothing was done then)."""
    if not all([leave_storage(tensor) for tensor in written]):  # noqa: C419 (each one leaves its storage if it can)
        return False
    pending = [tensor for tensor in read if not tensor.node.realized]
    if pending:
        realize(*pending)
    own_values(written)
    return True


def recorded_replay(recorded: OrderedDict[tuple[Any, ...], Jitted | None], signature: tuple[Any, ...],
                    function: Callable[[], Callable[..., Any]]) -> Jitted | None:
    """The ember.jit of `signature` in `recorded` (least recently used last; None: a signature never replayed),
    made of `function()` where it has none yet, the least recently used past SIGNATURES_KEPT dropped."""
    if signature in recorded:
        recorded.move_to_end(signature)
        return recorded[signature]
    jitted = recorded[signature] = Jitted(function(), recapture=True)
    if len(recorded) > SIGNATURES_KEPT:
        recorded.popitem(last=False)
    return jitted


def own_values(written: list[Tensor]) -> None:
    """Leave the old value of each tensor the step writes to whatever else still holds its node (a lazy result of
    this step's forward pass reads the parameters, `state_dict()` shares the state), as the eager step would by
    writing the new value into a new buffer. The node those holders share gets a copy of the buffer (the tensors are
    realized: `run` realizes them first, so it is one buffer-to-buffer copy), and the tensor a node of its own over
    its buffer, which the step updates in place: its buffer stays the one the recorded step's launches and the
    backward pass's binding point at, so neither is pointed anew at the next step (a model's output kept while
    stepping, as tutorials keep it, made both point its last layer at a new buffer at every step)."""
    for tensor in written:
        node = tensor.node
        if sys.getrefcount(node) > 3:  # (the tensor, `node`, getrefcount's argument)
            copy = copied_leaf(node)  # (a buffer copy, enqueued after the buffer's writer)
            own = Node(Op.BUFFER, (), None, node.shape, node.dtype, node.device)
            own.buffer, own.checks, node.buffer = node.buffer, node.checks, copy.buffer
            tensor.node = own


def _signature(optimizer: Optimizer, stepped: Stepped, tensors: list[Tensor]) -> tuple[Any, ...]:
    """Everything outside the tensors' values that decides what a step computes (see the module's docstring)."""
    group_index = {id(group): index for index, group in enumerate(optimizer.param_groups)}
    groups = tuple(tuple((name, _frozen(value)) for name, value in group.items() if name not in UNCHANGING_KEYS)
                   for group in optimizer.param_groups)
    parameters = []
    for group, parameter in stepped:
        state = optimizer.state.get(parameter, {})
        entries = tuple((name, None if isinstance(value, Tensor) else _frozen(value))
                        for name, value in sorted(state.items()))
        parameters.append((group_index[id(group)], entries))
    # which step counts are shared by parameters that are not all stepped now (_advance_steps splits those)
    holders = Counter(id(state["step"]) for state in optimizer.state.values() if "step" in state)
    stepped_holders = Counter(id(optimizer.state[parameter]["step"]) for _, parameter in stepped
                              if "step" in optimizer.state.get(parameter, {}))
    split_counts = tuple(sorted(holders[count] != members for count, members in stepped_holders.items()))
    # the tensors' shapes, dtypes and devices (what ember.jit keys its capture on), and which share a buffer
    first_of: dict[int, int] = {}
    layout = []
    for position, tensor in enumerate(tensors):
        node = tensor.node
        layout.append((node.shape, node.dtype, node.device,
                       first_of.setdefault(id(node.buffer or buffer_of(node)), position)))
    return (type(optimizer), groups, tuple(parameters), split_counts, tuple(layout))


PLAIN_VALUES = frozenset({bool, int, float, str, type(None)})  # types whose values are their own stand-ins


def _frozen(value: Any) -> Any:
    """A hashable stand-in for a group or state value that compares equal exactly when the value does."""
    if value.__class__ in PLAIN_VALUES:  # (most group entries: learning rates, flags)
        return value
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(item) for item in value))
    try:
        hash(value)
    except TypeError:
        return ("unhashable", repr(value))
    return value
