"""Lazy values a forward pass gives module state (BatchNorm's running statistics), held until the next backward or
optimizer step realizes them with its own outputs, in its one schedule: a lazy update's few tiny kernels then run
beside the gradients' instead of in a realize of their own (a small ResNet's 18 running-statistics updates cost its
optimizer step ~0.3 ms a step as a realize of their own), and updates never chain across steps."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

_PENDING: dict[int, weakref.ref[Tensor]] = {}


def note_state_update(tensor: Tensor) -> None:
    """`tensor` (module state) was given a lazy new value: the next backward or optimizer step computes it."""
    _PENDING[id(tensor)] = weakref.ref(tensor)


def pending_state_updates() -> list[Tensor]:
    """The noted tensors still alive whose values are not computed yet, still noted (take_state_updates takes
    them)."""
    if not _PENDING:
        return []
    tensors = [tensor for reference in _PENDING.values() if (tensor := reference()) is not None]
    return [tensor for tensor in tensors if not tensor.node.realized]


def take_state_updates() -> list[Tensor]:
    """The noted tensors still alive whose values are not computed yet; nothing is noted afterwards."""
    tensors = pending_state_updates()
    _PENDING.clear()
    return tensors
