"""ember.nn.init: PyTorch's weight initializations, drawn from ember's random numbers and written with assign."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ember as em
from ember.autograd.grad_mode import no_grad
from ember.core.errors import ShapeError
from ember.core.tensor import Tensor

GAINS = {
    "linear": 1.0,
    "conv1d": 1.0,
    "conv2d": 1.0,
    "conv3d": 1.0,
    "conv_transpose1d": 1.0,
    "conv_transpose2d": 1.0,
    "conv_transpose3d": 1.0,
    "sigmoid": 1.0,
    "tanh": 5.0 / 3,
    "relu": math.sqrt(2.0),
    "selu": 3.0 / 4,
}


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity, as torch.nn.init.calculate_gain."""
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        if isinstance(slope, bool) or not isinstance(slope, (int, float)):
            raise ValueError(f"negative_slope {slope} is not a valid number")
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity not in GAINS:
        raise ValueError(f"unsupported nonlinearity {nonlinearity!r}; valid: leaky_relu, {', '.join(GAINS)}")
    return GAINS[nonlinearity]


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    if tensor.ndim < 2:
        raise ShapeError(
            f"fan in and fan out can not be computed for a tensor with fewer than 2 dims (shape {tensor.shape})"
        )
    receptive_field = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive_field, tensor.shape[0] * receptive_field


def _fan(tensor: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode {mode!r} is not supported; valid: 'fan_in', 'fan_out'")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


_SKIPPING = [False]


@contextmanager
def skip_init() -> Iterator[None]:
    """Inside this block init functions write nothing: new layers' parameters stay lazy constants (no memory, no
    kernels) until a checkpoint replaces them, e.g. by `load_state_dict(..., assign=True)` (torch's skip_init)."""
    previous = _SKIPPING[0]
    _SKIPPING[0] = True
    try:
        yield
    finally:
        _SKIPPING[0] = previous


def _write(tensor: Tensor, value: Tensor) -> Tensor:
    """Give `tensor` the new value without recording a gradient, computed now (nothing inside `skip_init`).

    Realizing at once keeps the random-number graph out of every kernel that later reads the parameter.
    """
    if _SKIPPING[0]:
        return tensor
    with no_grad():
        tensor.assign(value._detached_copy())
    return tensor.realize()


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Tensor:
    if b < a:
        raise ValueError(f"uniform_ expects a <= b, got a={a}, b={b}")
    unit = em.rand(*tensor.shape, dtype=em.float32, device=tensor.device)
    return _write(tensor, unit * (b - a) + a)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Tensor:
    return _write(tensor, em.randn(*tensor.shape, dtype=em.float32, device=tensor.device) * std + mean)


def trunc_normal_(
    tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0, generator: Any = None
) -> Tensor:
    """Normal values truncated to [a, b] by the inverse-CDF method (as torch): uniform in [cdf(a), cdf(b)] -> erfinv."""
    if b <= a:
        raise ValueError(f"trunc_normal_ expects a < b, got a={a}, b={b}")

    def normal_cdf(value: float) -> float:
        return (1.0 + math.erf(value / math.sqrt(2.0))) / 2.0

    low, high = normal_cdf((a - mean) / std), normal_cdf((b - mean) / std)
    unit = em.rand(*tensor.shape, dtype=em.float32, device=tensor.device)
    values = _erfinv(unit * (2 * high - 2 * low) + (2 * low - 1)) * (std * math.sqrt(2.0)) + mean
    return _write(tensor, values.clamp(a, b))


def _erfinv(value: Tensor) -> Tensor:
    """Inverse error function in float32 (Giles' single-precision approximation), for trunc_normal_."""
    value = value.clamp(-1 + 1e-7, 1 - 1e-7)
    w = -((1 - value) * (1 + value)).log()
    central = w - 2.5
    central_poly: Tensor | float = 2.81022636e-08
    for coefficient in (
        3.43273939e-07,
        -3.5233877e-06,
        -4.39150654e-06,
        0.00021858087,
        -0.00125372503,
        -0.00417768164,
        0.246640727,
        1.50140941,
    ):
        central_poly = central_poly * central + coefficient
    tail = w.clamp(min=5.0).sqrt() - 3
    tail_poly: Tensor | float = -0.000200214257
    for coefficient in (
        0.000100950558,
        0.00134934322,
        -0.00367342844,
        0.00573950773,
        -0.0076224613,
        0.00943887047,
        1.00167406,
        2.83297682,
    ):
        tail_poly = tail_poly * tail + coefficient
    return em.where(w < 5.0, central_poly, tail_poly) * value


def constant_(tensor: Tensor, val: float) -> Tensor:
    return _write(tensor, Tensor._full(tensor.shape, val, tensor.dtype, tensor.device))


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 0.0)


def eye_(tensor: Tensor) -> Tensor:
    if tensor.ndim != 2:
        raise ShapeError(f"eye_ needs a 2-d tensor, got shape {tensor.shape}")
    rows, columns = tensor.shape
    return _write(tensor, em.eye(rows, columns, dtype=tensor.dtype, device=tensor.device))


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
    """Identity-preserving convolution weights: channel i of each group passes through the kernel's center."""
    if tensor.ndim not in (3, 4, 5):
        raise ShapeError(f"dirac_ needs a 3, 4 or 5-d tensor, got shape {tensor.shape}")
    out_channels = tensor.shape[0]
    if out_channels % groups:
        raise ValueError(f"dirac_: dim 0 ({out_channels}) must be divisible by groups ({groups})")
    per_group = out_channels // groups
    kept = min(per_group, tensor.shape[1])
    output_index = em.arange(out_channels, device=tensor.device).reshape(-1, 1)
    input_index = em.arange(tensor.shape[1], device=tensor.device).reshape(1, -1)
    matches = ((output_index % per_group) == input_index) & (input_index < kept)
    center = tuple(size // 2 for size in tensor.shape[2:])
    spatial = None
    for dim, size in enumerate(tensor.shape[2:]):
        position = em.arange(size, device=tensor.device) == center[dim]
        view = [1] * (tensor.ndim - 2)
        view[dim] = size
        spatial = position.reshape(view) if spatial is None else spatial & position.reshape(view)
    mask = matches.reshape(matches.shape + (1,) * (tensor.ndim - 2)) & spatial
    return _write(tensor, mask.cast(tensor.dtype))


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)))


def kaiming_uniform_(
    tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", generator: Any = None
) -> Tensor:
    """Uniform in [-bound, bound] with bound = gain * sqrt(3 / fan); torch's default for Linear/Conv uses a=sqrt(5)."""
    fan = _fan(tensor, mode)
    if fan == 0:
        return tensor
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(
    tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", generator: Any = None
) -> Tensor:
    fan = _fan(tensor, mode)
    if fan == 0:
        return tensor
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(fan))


def orthogonal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """A (semi-)orthogonal matrix: the polar factor of a normal matrix (Haar-distributed), by Newton-Schulz steps."""
    if tensor.ndim < 2:
        raise ShapeError(f"orthogonal_ needs at least 2 dims, got shape {tensor.shape}")
    rows, columns = tensor.shape[0], math.prod(tensor.shape[1:])
    tall = em.randn(max(rows, columns), min(rows, columns), device=tensor.device)
    matrix = (tall / (tall * tall).sum().sqrt()).realize()
    for _ in range(60):  # each step has the same structure, so its kernels compile once
        matrix = (1.5 * matrix - 0.5 * (matrix @ (matrix.T @ matrix))).realize()
    result = matrix.T if rows < columns else matrix
    return _write(tensor, (result * gain).reshape(tensor.shape))


def sparse_(tensor: Tensor, sparsity: float, std: float = 0.01, generator: Any = None) -> Tensor:
    """Each column gets ceil(sparsity * rows) zeros at random rows; the rest is normal(0, std)."""
    if tensor.ndim != 2:
        raise ShapeError(f"sparse_ needs a 2-d tensor, got shape {tensor.shape}")
    rows = tensor.shape[0]
    zeros_per_column = math.ceil(sparsity * rows)
    keys = em.rand(*tensor.shape, device=tensor.device)
    rank = (keys.unsqueeze(0) < keys.unsqueeze(1)).sum(1)  # rank of each key within its column
    values = em.randn(*tensor.shape, device=tensor.device) * std
    return _write(tensor, em.where(rank < zeros_per_column, 0.0, values))
