"""torch.nn.utils.parametrizations: weight_norm and spectral_norm as parametrizations (torch's current API)."""

from __future__ import annotations

import ember as em
from ember.core.tensor import Tensor
from ember.nn import functional as F
from ember.nn.module import Module
from ember.nn.utils import parametrize
from ember.nn.utils.spectral_norm import default_dim, weight_as_matrix
from ember.nn.utils.weight_norm import norm_except_dim, weight_norm_value


class _WeightNorm(Module):
    """weight = original1 * original0 / ||original1||: original0 is g (the norms), original1 is v (the direction)."""

    def __init__(self, dim: int | None = 0) -> None:
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, weight_g: Tensor, weight_v: Tensor) -> Tensor:
        return weight_norm_value(weight_v, weight_g, self.dim)

    def right_inverse(self, weight: Tensor) -> tuple[Tensor, Tensor]:
        return norm_except_dim(weight, 2, self.dim), weight


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """Parametrize module.name as g * v / ||v|| (parametrizations.weight.original0 = g, original1 = v)."""
    parametrize.register_parametrization(module, name, _WeightNorm(dim), unsafe=True)
    return module


class _SpectralNorm(Module):
    """weight / sigma, sigma the largest singular value estimated by power iteration on the buffers _u and _v."""

    def __init__(self, weight: Tensor, n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12) -> None:
        super().__init__()
        ndim = weight.ndim
        if dim >= ndim or dim < -ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of [-{ndim}, {ndim - 1}] but got {dim})")
        if n_power_iterations <= 0:
            raise ValueError(
                f"Expected n_power_iterations to be positive, but got n_power_iterations={n_power_iterations}"
            )
        self.dim = dim if dim >= 0 else dim + ndim
        self.eps = eps
        if ndim > 1:
            self.n_power_iterations = n_power_iterations
            matrix = weight_as_matrix(weight.detach(), self.dim)
            height, width = matrix.shape
            with em.no_grad():
                u = em.randn(height, dtype=weight.dtype, device=weight.device)
                v = em.randn(width, dtype=weight.dtype, device=weight.device)
                self.register_buffer("_u", F.normalize(u, dim=0, eps=eps))
                self.register_buffer("_v", F.normalize(v, dim=0, eps=eps))
            self._power_method(matrix, 15)

    def _power_method(self, matrix: Tensor, n_power_iterations: int) -> None:
        """Advance the buffers _u and _v by n power-iteration steps on the (detached) weight matrix."""
        with em.no_grad():
            matrix = matrix.detach()
            u, v = self._buffers["_u"], self._buffers["_v"]
            for _ in range(n_power_iterations):
                u = F.normalize(matrix.mv(v), dim=0, eps=self.eps)
                v = F.normalize(matrix.t().mv(u), dim=0, eps=self.eps)
            self._buffers["_u"], self._buffers["_v"] = u.realize(), v.realize()  # values, not a chain of steps

    def forward(self, weight: Tensor) -> Tensor:
        if weight.ndim == 1:
            return F.normalize(weight, dim=0, eps=self.eps)
        matrix = weight_as_matrix(weight, self.dim)
        if self.training:
            self._power_method(matrix, self.n_power_iterations)
        sigma = self._buffers["_u"].vdot(matrix.mv(self._buffers["_v"]))
        return weight / sigma

    def right_inverse(self, value: Tensor) -> Tensor:
        return value


def spectral_norm(
    module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12, dim: int | None = None
) -> Module:
    """Parametrize module.name as weight / sigma (buffers parametrizations.weight.0._u and ._v)."""
    weight = getattr(module, name, None)
    if not isinstance(weight, Tensor):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    parametrize.register_parametrization(
        module, name, _SpectralNorm(weight, n_power_iterations, default_dim(module) if dim is None else dim, eps)
    )
    return module
