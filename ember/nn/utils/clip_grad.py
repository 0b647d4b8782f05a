"""Gradient clipping with torch's names: clip_grad_norm_, clip_grad_value_, get_total_norm, clip_grads_with_norm_.

The scaling stays lazy: gradients are multiplied by clamp(max_norm / (total + 1e-6), max=1) as a tensor, so
clipping reads nothing back from the device (only error_if_nonfinite does, as in torch).
"""

from __future__ import annotations

import functools
import types
import warnings
from collections.abc import Iterable
from typing import Union

import ember as em
from ember.core.graph_templates import TEMPLATES
from ember.core.tensor import Tensor
from ember.nn.utils.clip_replay import REPLAYS

TensorOrTensors = Union[Tensor, Iterable[Tensor]]


def _as_list(tensors: TensorOrTensors) -> list[Tensor]:
    return [tensors] if isinstance(tensors, Tensor) else list(tensors)


def get_total_norm(
    tensors: TensorOrTensors, norm_type: float = 2.0, error_if_nonfinite: bool = False, foreach: bool | None = None
) -> Tensor:
    """The p-norm of all `tensors` taken together, as if concatenated into one vector ('inf' for the max norm)."""
    tensors = _as_list(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return em.tensor(0.0)
    first_device = tensors[0].device
    with em.no_grad():
        if norm_type == 2.0 and len({tensor.dtype for tensor in tensors}) == 1 and tensors[0].dtype.is_float:
            # the square root of the sum of every tensor's sum of squares: torch's norm of the norms, without a
            # norm per tensor and their stack (a few nodes per gradient fewer in an eager training step)
            total_squares = None
            for tensor in tensors:
                squares = (tensor * tensor).sum().to(first_device)
                total_squares = squares if total_squares is None else total_squares + squares
            assert total_squares is not None
            total_norm = total_squares.sqrt()
        else:
            norms = [em.linalg.vector_norm(tensor, norm_type).to(first_device) for tensor in tensors]
            total_norm = em.linalg.vector_norm(em.stack(norms), norm_type)
    if error_if_nonfinite and not bool(total_norm.isfinite().item()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be "
            "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
            "`error_if_nonfinite=False`"
        )
    return total_norm


def clip_grads_with_norm_(
    parameters: TensorOrTensors, max_norm: float, total_norm: Tensor, foreach: bool | None = None
) -> None:
    """Scale the gradients of `parameters` in place by clamp(max_norm / (total_norm + 1e-6), max=1)."""
    grads = [parameter.grad for parameter in _as_list(parameters) if parameter.grad is not None]
    if grads:
        _scale_in_place(grads, float(max_norm), total_norm)


def _scale_in_place(grads: list[Tensor], max_norm: float, total_norm: Tensor) -> None:
    """Each gradient's mul_ by the clip's coefficient (clip_grads_with_norm_'s loop)."""
    with em.no_grad():
        coefficient = _coefficient(total_norm, max_norm)
        for grad in grads:
            grad.mul_(coefficient.to(grad.device).cast(grad.dtype))


def _coefficient(total_norm: Tensor, max_norm: float) -> Tensor:
    """What clipping multiplies the gradients by: clamp(max_norm / (total_norm + 1e-6), max=1), as torch."""
    return (max_norm / (total_norm + 1e-6)).clamp(max=1.0)


def clip_grad_norm_(
    parameters: TensorOrTensors,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """Clip the gradients of `parameters` in place so that their total norm is at most max_norm; return that norm."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    else:
        is_generator = isinstance(parameters, types.GeneratorType)
        parameters = list(parameters)
        if is_generator and not parameters:
            warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=2)
    grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if not error_if_nonfinite and _one_kind(grads, norm_type):
        max_norm = float(max_norm)
        # (its kernels replayed, clip_replay.py; the ops recorded op by op, whose assigns write in place)
        replayed = REPLAYS.run(grads, max_norm, functools.partial(_clip_by_ops, max_norm=max_norm))
        return replayed if replayed is not None else _clip_in_place(grads, max_norm)
    total_norm = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)
    return total_norm


def _clip_in_place(grads: list[Tensor], max_norm: float) -> Tensor:
    """Scale `grads` in place by clamp(max_norm / (total 2-norm + 1e-6), max=1), lazily, and return the total norm:
    one template's copy for every gradient (an LSTM's or a GPT's 10-30 gradients took ~100 us each to record op by
    op at every step; the same ops, so the same values)."""
    with em.no_grad():
        total_norm, *clipped = TEMPLATES.instantiate_many(
            ("clip_grad_norm_", max_norm, len(grads)), functools.partial(_clipped, max_norm=max_norm), tuple(grads))
        for grad, value in zip(grads, clipped):
            grad._assign_in_place(value, "clip_grad_norm_")  # type: ignore[arg-type]
    return total_norm  # type: ignore[return-value]


def _clip_by_ops(grads: list[Tensor], max_norm: float) -> Tensor:
    """_clip_in_place op by op (get_total_norm, then each gradient's mul_: the same ops, so the same values), for a
    replay's recording: an assign of a template's copy reads every gradient through the copy, so it is not written
    in place, which a replay needs."""
    total_norm = get_total_norm(grads, 2.0)
    _scale_in_place(grads, max_norm, total_norm)
    return total_norm


def _one_kind(grads: list[Tensor], norm_type: float) -> bool:
    """Whether clipping `grads` by their 2-norm is one template's copy: distinct plain tensors of one float dtype on
    one device (a gradient listed twice is scaled twice, as torch's loop of mul_ does)."""
    if float(norm_type) != 2.0 or not grads or len({id(grad) for grad in grads}) != len(grads):
        return False
    first = grads[0]
    return first.dtype.is_float and all(
        grad.__class__ is first.__class__ and not grad.is_sharded and grad.dtype is first.dtype
        and grad.device == first.device for grad in grads)


def _clipped(*grads: Tensor, max_norm: float) -> tuple[Tensor, ...]:
    """The total 2-norm of `grads` and each gradient scaled by clamp(max_norm / (norm + 1e-6), max=1): what
    get_total_norm and clip_grads_with_norm_ compute, op for op."""
    total_norm = get_total_norm(list(grads), 2.0)
    coefficient = _coefficient(total_norm, max_norm)
    return (total_norm, *[grad * coefficient.to(grad.device).cast(grad.dtype) for grad in grads])


def clip_grad_norm(
    parameters: TensorOrTensors,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """Deprecated in torch in favour of clip_grad_norm_ (same behaviour, with a FutureWarning)."""
    warnings.warn(
        "`torch.nn.utils.clip_grad_norm` is now deprecated in favor of `torch.nn.utils.clip_grad_norm_`.",
        FutureWarning,
        stacklevel=2,
    )
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters: TensorOrTensors, clip_value: float, foreach: bool | None = None) -> None:
    """Clamp the gradients of `parameters` in place to [-clip_value, clip_value]."""
    clip_value = float(clip_value)
    with em.no_grad():
        for parameter in _as_list(parameters):
            if parameter.grad is not None:
                parameter.grad.clamp_(min=-clip_value, max=clip_value)
