"""Parameter: a Tensor that a Module registers as trainable state (requires_grad by default)."""

from __future__ import annotations

from typing import Any

from ember.core.creation import tensor
from ember.core.tensor import Tensor


class Parameter(Tensor):
    """A Tensor that Module.__setattr__ registers as a parameter; it shares the node of the data it wraps."""

    __slots__ = ()

    def __init__(self, data: Any = None, requires_grad: bool = True) -> None:
        if data is None:
            data = Tensor._full((0,), 0.0, _default_float(), _default_device())
        elif not isinstance(data, Tensor):
            data = tensor(data)
        self._initialize(data.node)
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _from_node(cls, node: Any, requires_grad: bool = False) -> Tensor:
        """Values derived from a parameter (constants made by its ops included) are plain Tensors."""
        return Tensor._from_node(node, requires_grad)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


def _default_float() -> Any:
    from ember.core import dtype as dtypes

    return dtypes.DEFAULT_FLOAT


def _default_device() -> str:
    from ember.scheduler.devices import get_default_device

    return get_default_device()
