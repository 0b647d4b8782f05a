"""The backward engine: walks the recorded history in reverse, applies the rule table, fills .grad or returns grads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ember.autograd.backward_replay import REPLAYS
from ember.autograd.grad_mode import is_grad_enabled, set_grad_enabled
from ember.autograd.rules import RULES, TEMPLATED_RULES, Gradients, Recorded
from ember.collection_pause import collection_paused
from ember.core import checks as value_checks
from ember.core import runtime
from ember.core.errors import AutogradError, DeviceError, ShapeError
from ember.core.graph_templates import TEMPLATES
from ember.core.ops import Op
from ember.core.state_updates import take_state_updates
from ember.scheduler.realize import WATCH, PlanRun

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


def backward(
    tensors: Tensor | Sequence[Tensor],
    grad_tensors: Tensor | Sequence[Tensor | None] | None = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    inputs: Tensor | Sequence[Tensor] | None = None,
) -> None:
    """Accumulate d(tensors)/d(leaf) into `.grad` of every leaf that requires grad (or of `inputs` only).

    `grad_tensors` are the gradients of `tensors` (may be omitted for one-element tensors). The new gradients are
    computed lazily and realized together in one schedule. With create_graph=True the gradients keep their own
    history, so they can be differentiated again. As in torch, the history walked is freed afterwards unless
    retain_graph=True (its default is create_graph): the tensors it holds (the forward's intermediate values, which
    keep parameters' old values alive) are let go while the loss is still held, and a second backward through it
    raises.
    """
    with collection_paused():  # (the gradients' graph: many short-lived objects without cycles)
        roots = _as_list(tensors, "backward", "tensors")
        seeds = _seed_gradients(roots, grad_tensors, "backward")
        targets = None if inputs is None else _as_list(inputs, "backward", "inputs")
        if targets is not None:
            _check_inputs(targets, "backward")
        retained = create_graph if retain_graph is None else retain_graph
        found = None  # the pass's signature, where a replay may do it (autograd/backward_replay.py)
        if grad_tensors is None and targets is None and not create_graph and not retained and len(roots) == 1:
            found = REPLAYS.prepare(roots[0])
            if found is not None and REPLAYS.replay(found):
                return
        walked: list[Tensor] | None = None if retained else []
        gradients = _propagate(roots, seeds, targets, create_graph, accumulate=True, walked=walked)
        updated = []
        for tensor, gradient in gradients:
            tensor.grad = _own(gradient) if tensor.grad is None else _accumulate(tensor.grad, gradient, create_graph)
            updated.append(tensor.grad)
        # the roots (the loss) too: reading them afterwards must not recompute the forward; and the module state the
        # forward updated lazily (running statistics: core/state_updates.py), in the same schedule
        updates = take_state_updates()
        if found is None:
            _realize(updated + roots + updates)
        else:  # watched, so that a later pass of its signature replays the program it ran
            checks = value_checks.pending([tensor.node for tensor in (*updated, *roots, *updates)])
            runs: list[PlanRun | None] = []
            WATCH.runs = runs
            try:
                _realize(updated + roots + updates)
            finally:
                WATCH.runs = None
            REPLAYS.record(found, runs, gradients, checks, updates)
        if walked is not None:
            free_history(walked)
        for tensor, _ in gradients:  # leaves' post-accumulate hooks, in the order their gradients were completed
            if tensor._post_accumulate_hooks:
                for hook in list(tensor._post_accumulate_hooks):
                    hook(tensor)


def grad(
    outputs: Tensor | Sequence[Tensor],
    inputs: Tensor | Sequence[Tensor],
    grad_outputs: Tensor | Sequence[Tensor | None] | None = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    allow_unused: bool | None = None,
    materialize_grads: bool = False,
) -> tuple[Tensor | None, ...]:
    """The gradients of `outputs` with respect to `inputs`, like torch.autograd.grad (`.grad` is left alone).

    With create_graph=True the results keep their history (higher-order gradients). An input that the outputs do
    not depend on is an error unless allow_unused=True (then its gradient is None) or materialize_grads=True (zeros).
    """
    roots = _as_list(outputs, "grad", "outputs")
    targets = _as_list(inputs, "grad", "inputs")
    _check_inputs(targets, "grad")
    seeds = _seed_gradients(roots, grad_outputs, "grad")
    retained = create_graph if retain_graph is None else retain_graph
    walked: list[Tensor] | None = None if retained else []
    found = {id(tensor): gradient
             for tensor, gradient in _propagate(roots, seeds, targets, create_graph, False, walked=walked)}
    allow_unused = materialize_grads if allow_unused is None else allow_unused
    results: list[Tensor | None] = []
    for position, target in enumerate(targets):
        gradient = found.get(id(target))
        if gradient is None and materialize_grads:
            gradient = target._full(target.shape, 0, target.dtype, target.device)
        elif gradient is None and not allow_unused:
            raise AutogradError(
                f"grad: input {position} (shape {target.shape}) was not used to compute the outputs, so it has no "
                "gradient; pass allow_unused=True to get None for it (or materialize_grads=True for zeros)"
            )
        results.append(gradient)
    _realize([gradient for gradient in results if gradient is not None])
    if walked is not None:
        free_history(walked)
    return tuple(results)


# ---- the walk ------------------------------------------------------------------------------------------------------


def _propagate(
    roots: list[Tensor], seeds: list[Tensor], targets: list[Tensor] | None, create_graph: bool, accumulate: bool,
    bounded: bool = False, walked: list[Tensor] | None = None,
) -> list[tuple[Tensor, Tensor]]:
    """Push the seed gradients back through the recorded history; return (tensor, gradient) for each target.

    targets=None means every leaf that requires grad, plus non-leaves that asked for retain_grad(). `bounded`: the
    walk ends at the targets (the history behind them is neither walked nor differentiated). `walked`, where given,
    receives the tensors differentiated (their history, for free_history once the gradients are realized).
    """
    recorded: dict[int, tuple[Tensor, ...]] = {}  # each tensor's sources as recorded (sources_at_record, once)
    target_ids = None if targets is None else {id(target) for target in targets}
    order = _topological_order(roots, recorded, target_ids if bounded else None)
    needed = _needed(order, target_ids, recorded)
    device_of = runtime.RUNTIME.device_of
    pending: dict[int, Tensor] = {}
    for root, seed in zip(roots, seeds):
        pending[id(root)] = seed if id(root) not in pending else pending[id(root)] + seed
    results: list[tuple[Tensor, Tensor]] = []
    with set_grad_enabled(create_graph):
        for tensor in reversed(order):
            gradient = pending.pop(id(tensor), None)
            if gradient is None:
                continue
            for hook in tensor._hooks or ():
                replaced = hook(gradient)
                if replaced is not None:
                    gradient = replaced
            if target_ids is None:
                if tensor._context is None or (tensor._retains_grad and accumulate):
                    results.append((tensor, gradient))
            elif id(tensor) in target_ids:
                results.append((tensor, gradient))
                if bounded:
                    continue
            if tensor._context is None:
                continue
            op, arg, _ = tensor._context
            sources = recorded[id(tensor)]
            if not any(id(source) in needed for source in sources):
                continue
            split = TEMPLATED_RULES.get(op)
            if split is not None and not create_graph:
                arg_signature, arg_tensors, rebuild = split(arg)
                wanted = tuple([id(source) in needed for source in sources])
                source_gradients = TEMPLATES.instantiate_many(
                    (op, arg_signature, wanted), _wanted_gradients(op, rebuild, wanted),
                    (gradient, tensor, *sources, *arg_tensors))
            else:
                source_gradients = RULES[op](Recorded(tensor, arg, sources), gradient)
            for source, source_gradient in zip(sources, source_gradients):
                if source_gradient is None or id(source) not in needed:
                    continue
                gradient_node, source_node = source_gradient.node, source.node
                assert gradient_node.shape == source_node.shape and gradient_node.dtype is source_node.dtype, (
                    f"the backward rule of {op.name} gave a gradient of {source_gradient.shape} "
                    f"{source_gradient.dtype.name} for a source of {source.shape} {source.dtype.name}"
                )
                gradient_device, source_device = gradient_node.device, source_node.device
                if gradient_device is None:
                    gradient_device = device_of(gradient_node)
                if source_device is None:
                    source_device = device_of(source_node)
                if gradient_device != source_device:  # a gradient lives where its tensor lives
                    source_gradient = source_gradient.to(source.device)
                previous = pending.get(id(source))
                pending[id(source)] = source_gradient if previous is None else previous + source_gradient
    if walked is not None:
        walked.extend([tensor for tensor in order if id(tensor) in needed])
    return results


class FreedSources(tuple):  # type: ignore[type-arg]
    """The sources of a recorded step whose history a backward pass has freed (FREED): none are held any more."""


FREED = FreedSources()


def free_history(tensors: list[Tensor]) -> None:
    """Free the recorded steps of `tensors` that read intermediate values, as torch frees a graph's saved values once
    backward has run through it: such a step keeps its op (grad_fn and is_leaf answer as before) but no sources or
    arguments, so the values they held (the forward's intermediates, and through their lazy graphs the parameters'
    values they read) are released with their last other holder, and an optimizer updating a parameter in place
    need not copy it away from them first. Reaching a freed step in a later walk raises (_topological_order). A step
    of leaves only (`x * 2`, `x @ w`) holds nothing the user does not hold and is kept: torch too differentiates
    `y = x * 2` again."""
    for tensor in tensors:
        context = tensor._context
        if context is not None and any(source._context is not None for source in context[2]):
            tensor._context = (context[0], None, FREED)
            tensor._saved_versions = None
            tensor._previous = None


def function_gradients(compute: Callable[..., Tensor], sources: tuple[Tensor, ...], gradient: Tensor) -> Gradients:
    """The gradients of compute(*sources) (a Composite.TRACED step) given its output's `gradient`: the chain rule
    through the primitives compute records. Outside create_graph the function runs again on fresh leaves holding
    the sources' nodes, so the walk stays inside it (a source passed twice is two leaves: each use's gradient); with
    create_graph it runs on an identity (a reshape to the same shape) of each source, so the gradients keep their
    history back to them, and the walk ends at those identities (no hook of a source runs here, no history behind
    the sources is walked)."""
    from ember.core.tensor import Tensor

    create_graph = is_grad_enabled()  # (the engine's walk sets grad mode to create_graph)
    if create_graph:
        inputs = tuple(source._apply(Op.RESHAPE, arg=tuple(source.shape)) for source in sources)
    else:
        inputs = tuple(Tensor._from_node(source.node) for source in sources)
        for leaf, source in zip(inputs, sources):
            leaf._requires_grad = source.dtype.is_float
    with set_grad_enabled(True):
        output = compute(*inputs)
    targets = [leaf for leaf in inputs if leaf._requires_grad]
    if not output._requires_grad or not targets:
        return tuple(None for _ in sources)
    found = {id(tensor): found for tensor, found in _propagate([output], [gradient], targets, create_graph, False,
                                                              bounded=True)}
    return tuple([found.get(id(leaf)) for leaf in inputs])  # (a tensor passed twice: one input per use)


def _wanted_gradients(op: Any, rebuild: Callable[[tuple[Tensor, ...]], Any],
                      wanted: tuple[bool, ...]) -> Callable[..., Gradients]:
    """A templated rule's build: the gradients of (gradient, output, *sources, *the tensors the arg holds), None
    for the sources not wanted (their graphs are then neither recorded nor copied); the arg is made again from its
    tensors' stand-ins (rules.TEMPLATED_RULES)."""

    def build(gradient: Tensor, output: Tensor, *rest: Tensor) -> Gradients:
        sources, held = rest[:len(wanted)], rest[len(wanted):]
        gradients = RULES[op](Recorded(output, rebuild(held), sources), gradient)
        return tuple([found if want else None for found, want in zip(gradients, wanted)])

    return build


def _topological_order(roots: list[Tensor], recorded: dict[int, tuple[Tensor, ...]],
                       stop: set[int] | None = None) -> list[Tensor]:
    """Every tensor that requires grad reachable from the roots (not through those of `stop`, by id), each after
    all of its sources; the sources of each tensor with history, as recorded, go into `recorded` (by id).
    (core/walk.post_order's walk, written out with the sources read inline: it runs at every backward over the
    step's whole history.)"""
    ordered: list[Tensor] = []
    seen: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False) for root in reversed(roots)]
    pop, push = stack.pop, stack.append
    while stack:
        tensor, expanded = pop()
        if expanded:
            ordered.append(tensor)
            continue
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        push((tensor, True))
        context = tensor._context
        if context is None or (stop is not None and id(tensor) in stop):
            continue
        sources = context[2]
        if sources is FREED:
            raise AutogradError(
                f"trying to backward through the graph a second time: the history of a tensor of shape "
                f"{tensor.shape} (made by {context[0].name}) was freed by an earlier backward() or autograd.grad(); "
                "pass retain_graph=True to the first call to keep it, or compute the forward again"
            )
        saved = tensor._saved_versions
        if saved is not None:
            for source, version in zip(sources, saved):
                if source._version != version:  # changed in place since: its state then (or torch's error)
                    sources = sources_at_record(tensor)
                    break
        recorded[id(tensor)] = sources
        for source in sources:
            if source._requires_grad and id(source) not in seen:
                push((source, False))
    return ordered


def _needed(order: list[Tensor], target_ids: set[int] | None, recorded: dict[int, tuple[Tensor, ...]]) -> set[int]:
    """Ids of the tensors a gradient must reach: targets and everything between them and the roots."""
    if target_ids is None:
        return {id(tensor) for tensor in order}
    needed: set[int] = set()
    for tensor in order:  # sources come first, so a tensor sees whether its sources are needed
        if id(tensor) in target_ids or (
            tensor._context is not None and any(id(source) in needed for source in recorded[id(tensor)])
        ):
            needed.add(id(tensor))
    return needed


# ---- in-place changes since the history was recorded ------------------------------------------------------------

# ops whose backward rule reads no value of their sources (only shapes): a source changed in place since is fine
VALUE_FREE = frozenset({Op.ADD, Op.SUB, Op.NEG, Op.CAST, Op.CONTIGUOUS, Op.COPY, Op.SUM, Op.RESHAPE, Op.EXPAND,
                        Op.PERMUTE, Op.PAD, Op.SHRINK, Op.FLIP})


def sources_at_record(tensor: Tensor) -> tuple[Tensor, ...]:
    """The sources of tensor's recorded op as they were when it was recorded: a source changed in place since is
    replaced by its state then (its history before the change); where the rule reads that value, torch's error."""
    assert tensor._context is not None
    op, _, sources = tensor._context
    saved = tensor._saved_versions
    if saved is None:
        return sources
    resolved: list[Tensor] | None = None
    for position, (source, version) in enumerate(zip(sources, saved)):
        if source._version == version:
            continue
        if op not in VALUE_FREE:
            name = op.name.title().replace("_", "")
            raise AutogradError(
                f"one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{source.dtype.name} {list(source.shape)}], which {name}Backward saved, is at version "
                f"{source._version}; expected version {version} instead. Hint: it was changed in place after the op "
                f"used it; change a clone() of it, or change it after backward()"
            )
        state = source._previous
        found = source
        while state is not None and state._version >= version:  # the oldest state saved at or after `version`
            found = state
            state = state._previous
        if found is not source:
            resolved = list(sources) if resolved is None else resolved
            resolved[position] = found
    return sources if resolved is None else tuple(resolved)


# ---- checks and small helpers ----------------------------------------------------------------------------------


def _as_list(value: Any, function: str, name: str) -> list[Tensor]:
    from ember.core.tensor import Tensor

    values = [value] if isinstance(value, Tensor) else list(value)
    for position, item in enumerate(values):
        if not isinstance(item, Tensor):
            raise TypeError(f"{function}: {name} must be Tensors, element {position} is {type(item).__name__}")
    if not values:
        raise ValueError(f"{function}: {name} is empty; give at least one tensor")
    return values


def _check_inputs(inputs: list[Tensor], function: str) -> None:
    for position, tensor in enumerate(inputs):
        if not tensor.requires_grad:
            raise AutogradError(
                f"{function}: input {position} (shape {tensor.shape}) does not require grad; create it with "
                "requires_grad=True or call .requires_grad_() on it before computing the outputs"
            )


def _seed_gradients(roots: list[Tensor], given: Any, function: str) -> list[Tensor]:
    """The gradient each root starts with: the given one (checked) or ones for a one-element root."""
    from ember.core.tensor import Tensor

    if given is None or isinstance(given, Tensor):
        given = [given] * len(roots) if given is None else [given]
    given = list(given)
    if len(given) != len(roots):
        raise ValueError(f"{function}: got {len(given)} gradients for {len(roots)} tensors; give one per tensor")
    seeds = []
    for position, (root, gradient) in enumerate(zip(roots, given)):
        where = "the tensor" if len(roots) == 1 else f"tensor {position}"
        if not root.requires_grad:
            raise AutogradError(
                f"{function}: {where} of shape {root.shape} does not require grad and has no grad_fn, so there is "
                "nothing to differentiate; give some leaf requires_grad=True and compute it outside em.no_grad()"
            )
        if gradient is None:
            if root.numel() != 1:
                raise AutogradError(
                    f"{function}: a gradient can be created implicitly only for a one-element output, but {where} "
                    f"has shape {root.shape}; pass a gradient of shape {root.shape} (e.g. em.ones_like(output))"
                )
            gradient = root._full(root.shape, 1, root.dtype, root.device)
        elif not isinstance(gradient, Tensor):
            raise TypeError(f"{function}: gradient {position} must be a Tensor, got {type(gradient).__name__}")
        else:
            if gradient.shape != root.shape:
                raise ShapeError(
                    f"{function}: the gradient has shape {gradient.shape} but {where} has shape {root.shape}; "
                    "they must match"
                )
            if gradient.device != root.device:
                raise DeviceError(
                    f"{function}: the gradient is on {gradient.device} but {where} is on {root.device}; "
                    "move it with .to(device)"
                )
            if not gradient.dtype.is_float:
                raise AutogradError(f"{function}: the gradient must be floating point, got {gradient.dtype.name}")
            gradient = gradient.cast(root.dtype)
        seeds.append(gradient)
    return seeds


def _own(gradient: Tensor) -> Tensor:
    """gradient as a tensor of its own for one `.grad`: a rule hands one tensor to several sources (an add's two
    operands), and a seed is the caller's tensor, while `.grad` is changed in place (clip_grad_norm_, optimizers), so
    each `.grad` gets its own tensor over the same lazy value (no copy), with the same history (create_graph)."""
    from ember.core.tensor import Tensor

    owned = Tensor._from_node(gradient.node, gradient._requires_grad)
    owned._context = gradient._context
    owned._saved_versions = gradient._saved_versions
    return owned


def _accumulate(existing: Tensor, gradient: Tensor, create_graph: bool) -> Tensor:
    with set_grad_enabled(create_graph):
        return existing + gradient.cast(existing.dtype)


def _realize(tensors: list[Tensor]) -> None:
    from ember.core.tensor import realize

    if tensors:
        realize(*tensors)


class BackwardFunction:
    """What `tensor.grad_fn` returns for a non-leaf: the primitive op that made it and its sources' functions."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor

    @property
    def op(self) -> Any:
        return self._recorded()[0]

    def _recorded(self) -> tuple[Any, Any, tuple[Tensor, ...]]:
        """The tensor's recorded (op, arg, sources): a BackwardFunction is made only for a tensor that has one."""
        context = self.tensor._context
        assert context is not None, "a BackwardFunction belongs to a tensor with recorded history"
        return context

    def name(self) -> str:
        return f"{self.op.name.title().replace('_', '')}Backward"

    @property
    def next_functions(self) -> tuple[tuple[Any, int], ...]:
        """For each source: its BackwardFunction, "AccumulateGrad" for a leaf that requires grad, or None."""
        result: list[tuple[BackwardFunction | str | None, int]] = []
        for source in self._recorded()[2]:
            if source._context is not None:
                result.append((BackwardFunction(source), 0))
            else:
                result.append(("AccumulateGrad" if source.requires_grad else None, 0))
        return tuple(result)

    def __repr__(self) -> str:
        return f"<{self.name()}>"
