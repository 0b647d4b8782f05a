"""Optimizer: param groups, state, state_dict, and the fused step that realizes every update in one schedule.

A step builds the new value of every parameter and every state tensor lazily, then realizes them all with ONE
`ember.realize(...)` call, so the kernelizer fuses each update into a few kernels. Nothing that changes between
steps is baked into the kernels as a constant, so changing it never recompiles and an `ember.jit` replay of a step
is exact: a group's hyperparameters live in a small device tensor per group and device (`StepScalars`), overwritten
in place when a scheduler or the user sets one (`ParamGroup`); step counts are device tensors that the step's
kernels advance, and what depends on them (Adam's bias corrections) is computed from them in the update kernels.
torch's `foreach`, `fused` and `capturable` flags are accepted for compatibility and change nothing: every step is
fused this way.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ember.autograd.grad_mode import enable_grad, no_grad
from ember.core import dtype as dtypes
from ember.core.runtime import RUNTIME
from ember.core.creation import tensor as data_tensor
from ember.core.state_updates import take_state_updates
from ember.core.tensor import Tensor, realize
from ember.optim.step_replay import StepReplays


class _RequiredParameter:
    """Marks a default that has no value: the user must give it (torch's `required`)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


class StepScalars:
    """Named hyperparameters held in one small device tensor, read by the update kernels as 0-d views; `write`
    overwrites the tensor's buffer in place, so kernels (and jit replays) already reading it see the new values."""

    def __init__(self, names: Sequence[str], values: Sequence[float], device: str, dtype: dtypes.DType) -> None:
        holder = dtypes.float64 if dtype == dtypes.float64 else dtypes.float32
        self.values = tuple(values)
        self.vector = data_tensor(np.asarray(values, dtype=holder.numpy), device=device)
        self.views = {name: self.vector[index] for index, name in enumerate(names)}

    def __getattr__(self, name: str) -> Tensor:
        try:
            return self.__dict__["views"][name]
        except KeyError:
            raise AttributeError(f"no step scalar named {name!r}") from None

    def write(self, values: Sequence[float]) -> None:
        """Give the scalars new values (in place; nothing happens when they are unchanged)."""
        values = tuple(values)
        if values != self.values:
            RUNTIME.write(self.vector.node, np.asarray(values, dtype=self.vector.dtype.numpy))
            self.values = values


class ParamGroup(dict):  # type: ignore[type-arg]
    """A parameter group: a dict, as torch's, that writes a hyperparameter set on it (`group["lr"] = 0.1`) into the
    optimizer's device scalars at once, so a jitted step replayed afterwards uses it. Copies are plain dicts."""

    def __init__(self, values: dict[str, Any], on_change: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(values)
        self.on_change = on_change

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if key != "params":
            self.on_change(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


class Optimizer:
    """Base class: subclasses give `scalar_names`, `_scalar_values` and `_update` for one parameter, and
    `counts_steps` when each parameter's state keeps a step count (torch's "step")."""

    scalar_names: tuple[str, ...] = ()
    counts_steps = False
    # True where `_update` reads nothing but the group's entries, the parameter's state, its gradient and the step
    # scalars, and changes nothing but tensors (in place) and state entries: its steps may be replayed
    replays_steps = False

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self.state: dict[Tensor, dict[str, Any]] = {}
        self.param_groups: list[dict[str, Any]] = []
        self._scalar_cache: dict[tuple[int, str, dtypes.DType], StepScalars] = {}  # by (id(group), device, dtype)
        # values the updates of one step share (Adam's bias corrections, recorded once per step count): cleared
        # at each step
        self._step_shared: dict[tuple[int, ...], Any] = {}
        self._replays = StepReplays()
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or dicts, but "
                f"got a Tensor of shape {params.shape}; wrap it in a list"
            )
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def __repr__(self) -> str:
        lines = [type(self).__name__ + " ("]
        for index, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {index}")
            for key in sorted(group):
                if key != "params":
                    lines.append(f"    {key}: {group[key]}")
        lines.append(")")
        return "\n".join(lines)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters with its own hyperparameters (missing ones come from the defaults)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, got {type(param_group).__name__}")
        params = param_group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        if params and isinstance(params[0], tuple):  # named parameters, as torch 2.6+ accepts
            param_group["param_names"] = [name for name, _ in params]
            params = [parameter for _, parameter in params]
        for position, parameter in enumerate(params):
            if not isinstance(parameter, Tensor):
                raise TypeError(
                    f"optimizer can only optimize Tensors, but parameter {position} of the group is a "
                    f"{type(parameter).__name__}"
                )
            if not parameter.is_leaf:
                raise ValueError(
                    f"can't optimize a non-leaf Tensor (parameter {position}, shape {parameter.shape}); "
                    "optimize the leaf it was computed from, or .detach().requires_grad_() it"
                )
            if not parameter.dtype.is_float:
                raise TypeError(
                    f"optimizer can only optimize floating point Tensors, parameter {position} is "
                    f"{parameter.dtype.name}"
                )
        param_group = ParamGroup(param_group, self._write_scalars)
        param_group["params"] = params
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {name}")
            param_group.setdefault(name, default)
        existing = {id(parameter) for group in self.param_groups for parameter in group["params"]}
        if len({id(parameter) for parameter in params}) != len(params):
            raise ValueError("a parameter appears more than once in one parameter group")
        if existing & {id(parameter) for parameter in params}:
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget every parameter's gradient (None, or zeros with set_to_none=False)."""
        for group in self.param_groups:
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                if set_to_none:
                    parameter.grad = None
                else:
                    parameter.grad = Tensor._full(parameter.shape, 0, parameter.dtype, parameter.device)

    # ---- the fused step -------------------------------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; all new values are computed by one realize.

        With a closure (which recomputes the loss and calls backward), the loss it returns is realized in the
        same schedule as the update, so reading it afterwards costs nothing extra.
        """
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            stepped = []
            for group in self.param_groups:
                for parameter in group["params"]:
                    if parameter.grad is None:
                        continue
                    if parameter.grad.shape != parameter.shape:
                        raise ValueError(
                            f"the gradient of a parameter of shape {parameter.shape} has shape "
                            f"{parameter.grad.shape}; they must match"
                        )
                    stepped.append((group, parameter))
            self._make_initial_state(stepped)
            outputs = self._replays.run(self, stepped, self._updates) if self.replays_steps else None
            if outputs is None:
                outputs = self._updates(stepped)
        outputs += take_state_updates()  # (a forward's running statistics not realized by a backward since)
        if isinstance(loss, Tensor):
            outputs.append(loss)
        pending = [tensor for tensor in outputs if not tensor.node.realized]
        if pending:
            realize(*pending)
        return loss

    def _make_initial_state(self, stepped: list[tuple[dict[str, Any], Tensor]]) -> None:
        """Give each parameter stepped for the first time the state torch makes before its first update: the
        moments of `_initial_state` as zero tensors (uploaded, no kernel) and, where the optimizer counts steps, a
        step count of 0 shared by the parameters of one device. The first update is then the same computation
        (the same kernels, the same step replay) as every later one, where lazy zeros folded into it made it a
        step of its own: compiled again at the second step (20 kernels of a nanoGPT's AdamW step, ~0.4 s)."""
        counts: dict[str, Tensor] = {}
        for group, parameter in stepped:
            if parameter in self.state or not isinstance(parameter, Tensor):  # (a sharded one: its own path)
                continue
            names = self._initial_state(group)
            if not names:
                continue
            device = parameter.device
            state: dict[str, Any] = {}
            if self.counts_steps:
                count = counts.get(device)
                if count is None:
                    count = counts[device] = data_tensor(np.zeros((), np.float32), device=device)
                state["step"] = count
            for name in names:
                state[name] = data_tensor(np.zeros(parameter.shape, np.float32), parameter.dtype, device)
            self.state[parameter] = state

    def _initial_state(self, group: dict[str, Any]) -> tuple[str, ...]:
        """The names of the zero tensors a parameter's state starts with in this group (torch's zeros_like at the
        first step); none by default."""
        del group
        return ()

    def _updates(self, stepped: list[tuple[dict[str, Any], Tensor]]) -> list[Tensor]:
        """Advance the step counts and assign every stepped parameter's and state tensor's new (lazy) value; return
        every tensor to realize. The eager step, and what a step replay records (step_replay.py)."""
        outputs: list[Tensor] = []
        self._step_shared = {}
        if self.counts_steps:
            outputs += self._advance_steps([parameter for _, parameter in stepped])
        for group, parameter in stepped:
            state = self.state.get(parameter, {})
            scalars = self._scalars(group, parameter)
            assert parameter.grad is not None
            outputs += self._update(parameter, parameter.grad._detached_copy(), group, state, scalars)
            if state:  # as torch, a parameter gets a state entry only when its optimizer keeps one
                self.state[parameter] = state
        return outputs

    def _scalars(self, group: dict[str, Any], parameter: Tensor, values: tuple[float, ...] | None = None) -> \
            StepScalars:
        """The device scalars of a group for parameter's device and dtype, holding the group's current values
        (`values`: `_scalar_values(group)` when the caller has them already)."""
        device = parameter.node.device or parameter.device  # (a realized parameter's node names its device)
        key = (id(group), device, parameter.dtype)
        values = self._scalar_values(group) if values is None else values
        scalars = self._scalar_cache.get(key)
        if scalars is None:
            scalars = StepScalars(self.scalar_names, values, device, parameter.dtype)
            self._scalar_cache[key] = scalars
        else:
            scalars.write(values)
        return scalars

    def _write_scalars(self, group: dict[str, Any]) -> None:
        """Write a group's changed hyperparameters into its device scalars (a ParamGroup calls this on a change)."""
        for (group_id, _, _), scalars in self._scalar_cache.items():
            if group_id == id(group):
                scalars.write(self._scalar_values(group))

    def _advance_steps(self, parameters: list[Tensor]) -> list[Tensor]:
        """Add one to the step count of each parameter, on the device; return the counts to realize.

        Parameters that have always been stepped together share one count tensor (one kernel advances them all);
        when only some of a count's holders are stepped, those go on with a count of their own, as torch's
        per-parameter counts do."""
        holders = Counter(id(state["step"]) for state in self.state.values() if "step" in state)
        by_count: dict[int, list[Tensor]] = {}
        fresh: dict[str, list[Tensor]] = {}
        for parameter in parameters:
            count = self.state.get(parameter, {}).get("step")
            if count is None:
                fresh.setdefault(parameter.device, []).append(parameter)
            else:
                by_count.setdefault(id(count), []).append(parameter)
        counts = []
        for members in by_count.values():
            count = self.state[members[0]]["step"]
            if len(members) == holders[id(count)]:
                count.assign(count + 1)
            else:
                count = (count + 1)._detached_copy()
                for parameter in members:
                    self.state[parameter]["step"] = count
            counts.append(count)
        for device, members in fresh.items():
            count = Tensor._full((), 1, dtypes.float32, device)
            for parameter in members:
                self.state.setdefault(parameter, {})["step"] = count
            counts.append(count)
        return counts

    def _scalar_values(self, group: dict[str, Any]) -> tuple[float, ...]:
        """The values of `scalar_names` for a group (none may depend on a step count)."""
        raise NotImplementedError

    def _update(
        self, parameter: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any], scalars: StepScalars
    ) -> list[Tensor]:
        """Assign the parameter's and its state's new (lazy) values; return every tensor to realize."""
        raise NotImplementedError

    @staticmethod
    def _state_tensor(state: dict[str, Any], name: str, value: Tensor) -> Tensor:
        """Give state[name] the new value: assigned in place when it exists, so its Tensor object stays the same."""
        existing = state.get(name)
        if existing is None:
            state[name] = value._detached_copy()
            return state[name]
        return existing.assign(value)

    # ---- state dicts ----------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """{'state': {index: {name: value}}, 'param_groups': [{..., 'params': [indices]}]}, as torch's."""
        index_of: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {key: value for key, value in group.items() if key != "params"}
            for parameter in group["params"]:
                index_of.setdefault(id(parameter), len(index_of))
            packed["params"] = [index_of[id(parameter)] for parameter in group["params"]]
            groups.append(packed)
        state = {}
        for parameter, values in self.state.items():
            if id(parameter) not in index_of:
                continue
            state[index_of[id(parameter)]] = {
                name: value.detach() if isinstance(value, Tensor) else value
                for name, value in values.items()
            }
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore groups' hyperparameters and per-parameter state (ember or torch tensors are accepted)."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"loaded state dict has {len(saved_groups)} parameter groups, the optimizer has "
                f"{len(self.param_groups)}"
            )
        for position, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"loaded state dict's parameter group {position} has {len(saved['params'])} "
                    f"parameters, the optimizer's has {len(group['params'])}"
                )
        parameter_of: dict[int, Any] = {}
        for saved, group in zip(saved_groups, self.param_groups):
            parameter_of.update(zip(saved["params"], group["params"]))
        self.state = {}
        counts: dict[tuple[str, float], Tensor] = {}  # equal step counts on one device share a tensor
        for index, values in state_dict["state"].items():
            parameter = parameter_of.get(int(index))
            if parameter is None:
                continue
            self.state[parameter] = {name: _state_value(name, value, parameter) for name, value in values.items()}
            if "step" in values:
                step = float(values["step"].item() if hasattr(values["step"], "item") else values["step"])
                key = (parameter.device, step)
                counts.setdefault(key, data_tensor(np.array(step, dtype=np.float32), device=parameter.device))
                self.state[parameter]["step"] = counts[key]
        new_groups: list[dict[str, Any]] = []
        for saved, group in zip(saved_groups, self.param_groups):
            restored = copy.deepcopy({key: value for key, value in saved.items() if key != "params"})
            restored["params"] = group["params"]
            new_groups.append(ParamGroup(restored, self._write_scalars))
        self.param_groups = new_groups
        self._scalar_cache = {}


def _state_value(name: str, value: Any, parameter: Tensor) -> Any:
    """A saved state entry as the optimizer keeps it: tensors on the parameter's device and dtype (load_state_dict
    makes the step counts)."""
    if name == "step":
        return None
    if isinstance(value, Tensor):
        tensor = value._detached_copy().to(parameter.device)  # a copy (torch would share the tensor given)
    elif hasattr(value, "shape") or isinstance(value, (list, np.ndarray)):
        tensor = data_tensor(value, device=parameter.device)
    else:
        return value
    return tensor.cast(parameter.dtype).realize() if tensor.dtype.is_float else tensor
