"""Activation modules (ReLU, GELU, Softmax, PReLU, ...): thin wrappers over the Tensor methods of the same name."""

from __future__ import annotations

import ember as em
from ember.core.tensor import Tensor
from ember.nn import functional as F
from ember.nn.module import Module
from ember.nn.parameter import Parameter


class _Elementwise(Module):
    """An activation without options beyond torch's `inplace` flag (ember's tensors are values: inplace is moot)."""

    method = ""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return getattr(input, self.method)()

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class ReLU(_Elementwise):
    method = "relu"


class ReLU6(_Elementwise):
    method = "relu6"


class SELU(_Elementwise):
    method = "selu"


class SiLU(_Elementwise):
    method = "silu"


class Mish(_Elementwise):
    method = "mish"


class Hardsigmoid(_Elementwise):
    method = "hardsigmoid"


class Hardswish(_Elementwise):
    method = "hardswish"


class Sigmoid(_Elementwise):
    method = "sigmoid"

    def __init__(self) -> None:
        super().__init__()


class Tanh(_Elementwise):
    method = "tanh"

    def __init__(self) -> None:
        super().__init__()


class Softsign(_Elementwise):
    method = "softsign"

    def __init__(self) -> None:
        super().__init__()


class LogSigmoid(_Elementwise):
    method = "logsigmoid"

    def __init__(self) -> None:
        super().__init__()


class Tanhshrink(Module):
    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.tanhshrink()


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.leaky_relu(self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class ELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.elu(self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class CELU(ELU):
    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.celu(self.alpha)


class GELU(Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.gelu(approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Hardtanh(Module):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        if max_val <= min_val:
            raise ValueError(f"Hardtanh: max_val ({max_val}) must be greater than min_val ({min_val})")
        self.min_val, self.max_val, self.inplace = float(min_val), float(max_val), inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.hardtanh(self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}" + (", inplace=True" if self.inplace else "")


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.softplus(self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Threshold(Module):
    """y = x where x > threshold, else value."""

    def __init__(self, threshold: float, value: float, inplace: bool = False) -> None:
        super().__init__()
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}, value={self.value}" + (", inplace=True" if self.inplace else "")


class Softshrink(Module):
    def __init__(self, lambd: float = 0.5) -> None:
        super().__init__()
        self.lambd = lambd

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.softshrink(self.lambd)

    def extra_repr(self) -> str:
        return str(self.lambd)


class Hardshrink(Softshrink):
    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.hardshrink(self.lambd)


def _softmax_dim(ndim: int) -> int:
    """torch's legacy choice when Softmax is made without a dim."""
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(Module):
    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.softmax(self.dim if self.dim is not None else _softmax_dim(input.ndim))

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.log_softmax(self.dim if self.dim is not None else _softmax_dim(input.ndim))


class Softmin(Softmax):
    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return (-input).softmax(self.dim if self.dim is not None else _softmax_dim(input.ndim))


class Softmax2d(Module):
    """Softmax over the channels (dim -3) of (N, C, H, W) or (C, H, W) inputs."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        if input.ndim not in (3, 4):
            raise ValueError(f"Softmax2d: expected input of 3 or 4 dims (got {input.ndim}D input)")
        return input.softmax(-3)


class GLU(Module):
    """Gated linear unit: the first half of `dim` times the sigmoid of the second half."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.glu(self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class PReLU(Module):
    """Leaky ReLU with a learned slope (one, or one per channel along dim 1)."""

    def __init__(
        self, num_parameters: int = 1, init: float = 0.25, device: str | None = None, dtype: object = None
    ) -> None:
        super().__init__()
        from ember.core.creation import full

        self.num_parameters = num_parameters
        self.weight = Parameter(full((num_parameters,), init, dtype=dtype or em.get_default_dtype(), device=device))

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.prelu(self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class RReLU(Module):
    """Leaky ReLU with a random negative slope from [lower, upper] in training, their mean in evaluation."""

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False) -> None:
        super().__init__()
        self.lower, self.upper, self.inplace = lower, upper, inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"lower={self.lower}, upper={self.upper}" + (", inplace=True" if self.inplace else "")
