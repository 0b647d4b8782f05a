"""parameters_to_vector and vector_to_parameters: all parameters as one flat vector and back."""

from __future__ import annotations

from collections.abc import Iterable

import ember as em
from ember.core.tensor import Tensor


def _check_same_device(parameter: Tensor, device: str | None) -> str:
    if device is not None and str(parameter.device) != device:
        raise TypeError(
            f"Found two parameters on different devices, this is currently not supported "
            f"({device} and {parameter.device})"
        )
    return str(parameter.device)


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """One 1-d tensor holding every parameter flattened, in order (differentiable, as torch's)."""
    device = None
    pieces = []
    for parameter in parameters:
        device = _check_same_device(parameter, device)
        pieces.append(parameter.reshape(-1))
    return em.cat(pieces)


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy consecutive slices of the 1-d `vec` into the data of each parameter, in order."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    device = None
    pointer = 0
    for parameter in parameters:
        device = _check_same_device(parameter, device)
        count = parameter.numel()
        parameter.data = vec[pointer:pointer + count].reshape(parameter.shape).data
        pointer += count
