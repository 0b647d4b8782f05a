"""torch's older hook-based spectral normalization: spectral_norm(module) and remove_spectral_norm(module).

weight = weight_orig / sigma, sigma = u . (W v) estimated by power iteration on the buffers name_u and name_v
(one step per training-mode forward, none in eval mode); a forward pre-hook recomputes `name` before each call.
"""

from __future__ import annotations

from typing import Any

import ember as em
from ember.core.tensor import Tensor
from ember.nn import functional as F
from ember.nn.conv import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from ember.nn.module import Module
from ember.nn.parameter import Parameter


def weight_as_matrix(weight: Tensor, dim: int) -> Tensor:
    """weight with `dim` moved to the front and the other dims flattened: (size of dim, everything else)."""
    if dim != 0:
        weight = weight.permute(dim, *(axis for axis in range(weight.ndim) if axis != dim))
    return weight.reshape(weight.shape[0], -1)


def default_dim(module: Module) -> int:
    """1 for transposed convolutions (their output channels are dim 1), else 0."""
    return 1 if isinstance(module, (ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)) else 0


class SpectralNorm:
    """The forward pre-hook of spectral_norm: recomputes module.name from name_orig, name_u and name_v."""

    def __init__(self, name: str = "weight", n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12) -> None:
        if n_power_iterations <= 0:
            raise ValueError(
                f"Expected n_power_iterations to be positive, but got n_power_iterations={n_power_iterations}"
            )
        self.name, self.dim, self.n_power_iterations, self.eps = name, dim, n_power_iterations, eps

    def compute_weight(self, module: Module, do_power_iteration: bool) -> Tensor:
        weight = getattr(module, self.name + "_orig")
        u, v = getattr(module, self.name + "_u"), getattr(module, self.name + "_v")
        weight_matrix = weight_as_matrix(weight, self.dim)
        if do_power_iteration:
            with em.no_grad():
                matrix = weight_matrix.detach()
                for _ in range(self.n_power_iterations):
                    v = F.normalize(matrix.t().mv(u), dim=0, eps=self.eps)
                    u = F.normalize(matrix.mv(v), dim=0, eps=self.eps)
                u, v = u.realize(), v.realize()  # the buffers hold values, not a chain through every step
                setattr(module, self.name + "_u", u)
                setattr(module, self.name + "_v", v)
        sigma = u.dot(weight_matrix.mv(v))
        return weight / sigma

    def remove(self, module: Module) -> None:
        with em.no_grad():
            weight = self.compute_weight(module, do_power_iteration=False)
        delattr(module, self.name)
        delattr(module, self.name + "_u")
        delattr(module, self.name + "_v")
        delattr(module, self.name + "_orig")
        module.register_parameter(self.name, Parameter(weight.detach()))

    def __call__(self, module: Module, inputs: Any) -> None:
        setattr(module, self.name, self.compute_weight(module, do_power_iteration=module.training))

    @staticmethod
    def apply(module: Module, name: str, n_power_iterations: int, dim: int, eps: float) -> SpectralNorm:
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, SpectralNorm) and hook.name == name:
                raise RuntimeError(f"Cannot register two spectral_norm hooks on the same parameter {name}")
        function = SpectralNorm(name, n_power_iterations, dim, eps)
        weight = module._parameters.get(name)
        if weight is None:
            raise ValueError(f"`SpectralNorm` cannot be applied as parameter `{name}` is None")
        with em.no_grad():
            height, width = weight_as_matrix(weight, dim).shape
            u = F.normalize(em.randn(height, dtype=weight.dtype, device=weight.device), dim=0, eps=eps)
            v = F.normalize(em.randn(width, dtype=weight.dtype, device=weight.device), dim=0, eps=eps)
        delattr(module, name)
        module.register_parameter(name + "_orig", weight)
        setattr(module, name, weight.detach())
        module.register_buffer(name + "_u", u)
        module.register_buffer(name + "_v", v)
        module.register_forward_pre_hook(function)
        return function


def spectral_norm(
    module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12, dim: int | None = None
) -> Module:
    """Reparametrize module.name as name_orig / (its largest singular value, estimated by power iteration)."""
    SpectralNorm.apply(module, name, n_power_iterations, default_dim(module) if dim is None else dim, eps)
    return module


def remove_spectral_norm(module: Module, name: str = "weight") -> Module:
    """Undo spectral_norm: module.name becomes a plain parameter holding the current normalized weight."""
    for key, hook in module._forward_pre_hooks.items():
        if isinstance(hook, SpectralNorm) and hook.name == name:
            hook.remove(module)
            del module._forward_pre_hooks[key]
            return module
    raise ValueError(f"spectral_norm of '{name}' not found in {module}")
