"""torch's older hook-based weight normalization: weight_norm(module) and remove_weight_norm(module).

weight = g * v / ||v|| with the norm over every dim but `dim` (dim=None: over the whole tensor); the module holds
parameters name_g and name_v, and a forward pre-hook recomputes `name` before each call.
"""

from __future__ import annotations

import warnings

from ember.core.tensor import Tensor
from ember.nn.module import Module
from ember.nn.parameter import Parameter


def norm_except_dim(value: Tensor, power: float = 2, dim: int = 0) -> Tensor:
    """torch.norm_except_dim: the p-norm over every dim but `dim`, kept as size-1 dims (dim=-1: the whole norm)."""
    if dim == -1:
        return value.norm(power)
    if dim < 0 or dim >= value.ndim:
        raise IndexError(f"norm_except_dim: dim {dim} is out of range for a tensor of {value.ndim} dims")
    reduced = tuple(axis for axis in range(value.ndim) if axis != dim)
    return value.abs().pow(power).sum(dim=reduced, keepdim=True).pow(1.0 / power) if power != 2 else (
        (value * value).sum(dim=reduced, keepdim=True).sqrt())


def weight_norm_value(v: Tensor, g: Tensor, dim: int) -> Tensor:
    """torch._weight_norm: v * (g / norm_except_dim(v, 2, dim))."""
    return v * (g / norm_except_dim(v, 2, dim))


class WeightNorm:
    """The forward pre-hook of weight_norm: recomputes module.name from name_g and name_v."""

    def __init__(self, name: str, dim: int | None) -> None:
        self.name = name
        self.dim = -1 if dim is None else dim

    def compute_weight(self, module: Module) -> Tensor:
        return weight_norm_value(getattr(module, self.name + "_v"), getattr(module, self.name + "_g"), self.dim)

    @staticmethod
    def apply(module: Module, name: str, dim: int | None) -> WeightNorm:
        warnings.warn(
            "torch.nn.utils.weight_norm is deprecated in favor of torch.nn.utils.parametrizations.weight_norm.",
            FutureWarning,
            stacklevel=3,
        )
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, WeightNorm) and hook.name == name:
                raise RuntimeError(f"Cannot register two weight_norm hooks on the same parameter {name}")
        function = WeightNorm(name, dim)
        weight = getattr(module, name)
        del module._parameters[name]
        module.register_parameter(name + "_g", Parameter(norm_except_dim(weight, 2, function.dim).detach()))
        module.register_parameter(name + "_v", Parameter(weight.detach()))
        setattr(module, name, function.compute_weight(module))
        module.register_forward_pre_hook(function)
        return function

    def remove(self, module: Module) -> None:
        weight = self.compute_weight(module)
        delattr(module, self.name)
        del module._parameters[self.name + "_g"]
        del module._parameters[self.name + "_v"]
        setattr(module, self.name, Parameter(weight.detach()))

    def __call__(self, module: Module, inputs: object) -> None:
        setattr(module, self.name, self.compute_weight(module))


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """Reparametrize module.name as name_g * name_v / ||name_v|| (deprecated in torch for parametrizations')."""
    WeightNorm.apply(module, name, dim)
    return module


def remove_weight_norm(module: Module, name: str = "weight") -> Module:
    """Undo weight_norm: module.name becomes a plain parameter holding the current normalized weight."""
    for key, hook in module._forward_pre_hooks.items():
        if isinstance(hook, WeightNorm) and hook.name == name:
            hook.remove(module)
            del module._forward_pre_hooks[key]
            return module
    raise ValueError(f"weight_norm of '{name}' not found in {module}")
