"""Loss Tensor methods (cross_entropy, nll_loss, mse, l1, smooth_l1, huber, binary cross entropy) from primitives."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, cast

from ember.core import dtype as dtypes
from ember.core.checks import check_index, describe_target
from ember.core.elementwise import where
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.graph_templates import traced_call
from ember.core.shapes import broadcast_shapes
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

REDUCTIONS = ("mean", "sum", "none")


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ArgumentError(f"{reduction!r} is not a valid value for reduction; valid: 'mean', 'sum', 'none'")


def _squared_error(input: Tensor, target: Tensor, reduction: str) -> Tensor:  # noqa: A002
    difference = input - target
    return _reduce(difference * difference, reduction)


def _absolute_error(input: Tensor, target: Tensor, reduction: str) -> Tensor:  # noqa: A002
    return _reduce((input - target).abs(), reduction)


def _binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, *,  # noqa: A002
                          reduction: str) -> Tensor:
    log_input = input.log().clamp_min(-100.0)
    log_complement = (1 - input).log().clamp_min(-100.0)
    loss = -(target * log_input + (1 - target) * log_complement)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def _smooth_l1(input: Tensor, target: Tensor, beta: float, reduction: str) -> Tensor:  # noqa: A002
    distance = (input - target).abs()
    if beta == 0:
        return _reduce(distance, reduction)
    return _reduce(where(distance < beta, 0.5 * distance * distance / beta, distance - 0.5 * beta), reduction)


def _huber(input: Tensor, target: Tensor, delta: float, reduction: str) -> Tensor:  # noqa: A002
    distance = (input - target).abs()
    return _reduce(where(distance < delta, 0.5 * distance * distance, delta * (distance - 0.5 * delta)), reduction)


def _kl_divergence(input: Tensor, target: Tensor, log_target: bool, reduction: str) -> Tensor:  # noqa: A002
    if log_target:
        loss = target.exp() * (target - input)
    else:  # torch: xlogy(target, target) - target * input, where xlogy(0, y) = 0
        loss = where(target == 0, 0.0, target * target.log()) - target * input
    if reduction == "batchmean":
        return loss.sum() / (input.shape[0] if input.ndim else 1)
    return _reduce(loss, reduction)


def _binary_cross_entropy_with_logits(input: Tensor, target: Tensor, *weights: Tensor,  # noqa: A002
                                      weighted: bool, positive_weighted: bool, reduction: str) -> Tensor:
    """BCE of sigmoid(input), computed stably; `weights` are the weight, then pos_weight, of those given."""
    weight = weights[0] if weighted else None
    pos_weight = weights[-1] if positive_weighted else None
    softplus_negative = (-input.abs()).exp().log1p() + (-input).maximum(0)
    if pos_weight is not None:
        loss = (1 - target) * input + (1 + (pos_weight - 1) * target) * softplus_negative
    else:
        loss = (1 - target) * input + softplus_negative
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def _pointwise_operands(input: Tensor, target: Tensor, op: str) -> tuple[Tensor, Tensor]:  # noqa: A002
    """input and target broadcast together (torch warns when their shapes differ; ember follows its result)."""
    if not isinstance(target, type(input)):
        raise TypeError(f"{op}: expected target to be a Tensor, got {type(target).__name__}")
    broadcast_shapes(input.shape, target.shape, op=f"{op} (input {input.shape}, target {target.shape})")
    if not input.dtype.is_float:
        raise DTypeError(f"{op}: expected a floating point input, got {input.dtype.name}")
    return input, target


def _class_weight(weight: Tensor | None, classes: int, op: str) -> None:
    if weight is not None and weight.shape != (classes,):
        raise ShapeError(
            f"{op}: weight tensor should be defined either for all {classes} classes or no classes but got weight "
            f"tensor of shape {list(weight.shape)}"
        )


def _check_class_target(input: Tensor, target: Tensor, op: str) -> None:  # noqa: A002
    """Class-index targets: [N] for [N, C], [N, d1..] for [N, C, d1..], 0-d for [C]."""
    if target.dtype not in (dtypes.int64, dtypes.uint8):
        raise DTypeError(
            f"{op}: expected target dtype to be int64 or uint8 (class indices), but got {target.dtype.name}"
        )
    if input.ndim == 0:
        raise ShapeError(f"{op}: input must have at least 1 dim [C] or [N, C, ...], got a 0-d tensor")
    expected = () if input.ndim == 1 else input.shape[:1] + input.shape[2:]
    if target.shape != expected:
        if input.ndim >= 2 and target.ndim >= 1 and target.shape[0] != input.shape[0]:
            raise ShapeError(
                f"{op}: expected input batch_size ({input.shape[0]}) to match target batch_size ({target.shape[0]}) "
                f"(input {list(input.shape)}, target {list(target.shape)})"
            )
        raise ShapeError(
            f"{op}: expected target of shape {list(expected)} for input of shape {list(input.shape)}, got "
            f"{list(target.shape)}"
        )


def _class_axis_last(tensor: Tensor) -> Tensor:
    """[N, C, d1..] as [N, d1.., C]; [C] and [N, C] stay as they are."""
    return tensor if tensor.ndim <= 2 else tensor.movedim(1, -1)


class LossOps(TensorBase):
    """Mixin: loss functions as methods of the input (self), with torch.nn.functional's arguments."""

    __slots__ = ()

    def nll_loss(self, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                 reduction: str = "mean") -> Tensor:
        """Negative log-likelihood of class indices; 'mean' divides by the total weight of the counted targets."""
        _check_reduction(reduction)
        _check_class_target(cast("Tensor", self), target, "nll_loss")
        classes = self.shape[0] if self.ndim == 1 else self.shape[1]
        _class_weight(weight, classes, "nll_loss")
        checked = _checked_target(target, classes, ignore_index, "nll_loss")
        # one step for autograd whose graphs are copied from templates (Composite.TRACED): the loss of a training
        # step is built again at every step (its two dozen primitives built op by op took 145 us, a copy ~25)
        compute = functools.partial(_class_nll, classes=classes, ignore_index=ignore_index, reduction=reduction)
        operands = (cast("Tensor", self), checked) if weight is None else (cast("Tensor", self), checked, weight)
        return traced_call(compute, operands)

    def cross_entropy(self, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                      reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
        """log_softmax over the class dim (1, or 0 for [C]) then nll; targets are class indices or probabilities."""
        _check_reduction(reduction)
        if not self.dtype.is_float:
            raise DTypeError(f"cross_entropy: expected a floating point input, got {self.dtype.name}")
        if not 0.0 <= label_smoothing <= 1.0:
            raise ArgumentError(f"cross_entropy: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")
        if self.ndim == 0:
            raise ShapeError("cross_entropy: input must have at least 1 dim [C] or [N, C, ...], got a 0-d tensor")
        class_dim = 0 if self.ndim == 1 else 1
        classes = self.shape[class_dim]
        _class_weight(weight, classes, "cross_entropy")
        if target.dtype.is_float:
            if target.shape != self.shape:
                raise ShapeError(
                    f"cross_entropy: probability targets must have the input's shape {list(self.shape)}, got "
                    f"{list(target.shape)}"
                )
            if target.dtype != self.dtype:
                raise DTypeError(
                    f"cross_entropy: expected probability targets of dtype {self.dtype.name}, got {target.dtype.name}"
                )
            log_probabilities = _class_axis_last(self.log_softmax(class_dim))
            probabilities = _class_axis_last(target)
            if label_smoothing > 0:
                probabilities = probabilities * (1 - label_smoothing) + label_smoothing / classes
            weighted = log_probabilities * weight if weight is not None else log_probabilities
            loss = -(probabilities * weighted).sum(-1)
            if reduction == "mean":
                count = loss.numel()
                return loss.sum() / count if count else loss.sum() * math.nan
            return _reduce(loss, reduction)
        _check_class_target(cast("Tensor", self), target, "cross_entropy")
        # one step for autograd whose graphs are copied from templates (Composite.TRACED)
        checked = _checked_target(target, classes, ignore_index, "cross_entropy")
        compute = functools.partial(_class_cross_entropy, class_dim=class_dim, classes=classes,
                                    ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
        operands = (cast("Tensor", self), checked) if weight is None else (cast("Tensor", self), checked, weight)
        return traced_call(compute, operands)

    def mse_loss(self, target: Tensor, reduction: str = "mean") -> Tensor:
        _check_reduction(reduction)
        input_, target = _pointwise_operands(cast("Tensor", self), target, "mse_loss")
        return traced_call(functools.partial(_squared_error, reduction=reduction), (input_, target))

    def l1_loss(self, target: Tensor, reduction: str = "mean") -> Tensor:
        _check_reduction(reduction)
        input_, target = _pointwise_operands(cast("Tensor", self), target, "l1_loss")
        return traced_call(functools.partial(_absolute_error, reduction=reduction), (input_, target))

    def smooth_l1_loss(self, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
        """0.5 * d^2 / beta where |d| < beta, else |d| - 0.5 * beta (beta = 0 gives l1_loss)."""
        _check_reduction(reduction)
        if beta < 0:
            raise ArgumentError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
        input_, target = _pointwise_operands(cast("Tensor", self), target, "smooth_l1_loss")
        return traced_call(functools.partial(_smooth_l1, beta=beta, reduction=reduction), (input_, target))

    def huber_loss(self, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
        """0.5 * d^2 where |d| < delta, else delta * (|d| - 0.5 * delta)."""
        _check_reduction(reduction)
        if delta <= 0:
            raise ArgumentError(f"huber_loss: delta must be positive, got {delta}")
        input_, target = _pointwise_operands(cast("Tensor", self), target, "huber_loss")
        return traced_call(functools.partial(_huber, delta=delta, reduction=reduction), (input_, target))

    def kl_div(self, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
        """KL divergence with self holding log-probabilities: target * (log(target) - self), like torch."""
        if reduction not in REDUCTIONS + ("batchmean",):
            raise ArgumentError(f"{reduction!r} is not a valid value for reduction; valid: 'mean', 'batchmean', 'sum', "
                             "'none'")
        input_, target = _pointwise_operands(cast("Tensor", self), target, "kl_div")
        return traced_call(functools.partial(_kl_divergence, log_target=log_target, reduction=reduction),
                           (input_, target))

    def binary_cross_entropy(self, target: Tensor, weight: Tensor | None = None,
                             reduction: str = "mean") -> Tensor:
        """-(t * log(x) + (1 - t) * log(1 - x)) with each log clamped to >= -100, like torch."""
        _check_reduction(reduction)
        if target.shape != self.shape:
            raise ShapeError(
                f"binary_cross_entropy: using a target size ({list(target.shape)}) that is different to the input "
                f"size ({list(self.shape)}) is not supported; please ensure they have the same size"
            )
        input_, target = _pointwise_operands(cast("Tensor", self), target, "binary_cross_entropy")
        operands = (input_, target) if weight is None else (input_, target, weight)
        return traced_call(functools.partial(_binary_cross_entropy, reduction=reduction), operands)

    def binary_cross_entropy_with_logits(self, target: Tensor, weight: Tensor | None = None,
                                         reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
        """BCE of sigmoid(x), computed stably: (1 - t) x + (1 + (pw - 1) t) (log(1 + exp(-|x|)) + max(-x, 0))."""
        _check_reduction(reduction)
        if target.shape != self.shape:
            raise ShapeError(
                f"binary_cross_entropy_with_logits: target size ({list(target.shape)}) must be the same as input "
                f"size ({list(self.shape)})"
            )
        input_, target = _pointwise_operands(cast("Tensor", self), target, "binary_cross_entropy_with_logits")
        if pos_weight is not None:
            broadcast_shapes(pos_weight.shape, input_.shape, op="binary_cross_entropy_with_logits (pos_weight)")
        operands = (input_, target, *([] if weight is None else [weight]), *([] if pos_weight is None else [pos_weight]))
        compute = functools.partial(_binary_cross_entropy_with_logits, weighted=weight is not None,
                                    positive_weighted=pos_weight is not None, reduction=reduction)
        return traced_call(compute, operands)


def _class_nll(input: Tensor, target: Tensor, weight: Tensor | None = None, *, classes: int,  # noqa: A002
               ignore_index: int, reduction: str) -> Tensor:
    """nll_loss of class-index targets (checked already): the graph nll_loss is traced as."""
    picked, picked_weight = _picked_classes(_class_axis_last(input), target, weight, ignore_index, classes)
    loss = -picked
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / picked_weight.sum()


def _class_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, *,  # noqa: A002
                         class_dim: int, classes: int, ignore_index: int, reduction: str,
                         label_smoothing: float = 0.0) -> Tensor:
    """cross_entropy of class-index targets (checked already), with torch's class weights and label smoothing: the
    graph cross_entropy is traced as."""
    if label_smoothing == 0:
        return _class_nll(input.log_softmax(class_dim), target, weight, classes=classes, ignore_index=ignore_index,
                          reduction=reduction)
    log_probabilities = _class_axis_last(input.log_softmax(class_dim))
    picked, picked_weight = _picked_classes(log_probabilities, target, weight, ignore_index, classes)
    loss = -picked
    weighted = log_probabilities * weight if weight is not None else log_probabilities
    smooth = where(target.cast(dtypes.int64) != ignore_index, -weighted.sum(-1), 0.0)
    if reduction == "none":
        return (1 - label_smoothing) * loss + smooth * (label_smoothing / classes)
    if reduction == "sum":
        return (1 - label_smoothing) * loss.sum() + smooth.sum() * (label_smoothing / classes)
    total_weight = picked_weight.sum()
    return ((1 - label_smoothing) * loss.sum() + smooth.sum() * (label_smoothing / classes)) / total_weight


def _checked_target(target: Tensor, classes: int, ignore_index: int, op: str) -> Tensor:
    """The class-index targets carrying their check: a target outside [0, classes) that is not ignore_index raises
    IndexOutOfRangeError when the loss is read (torch: 'Target 5 is out of bounds')."""
    return check_index(target, classes, op, None, negatives=False, ignore=ignore_index,
                       describe=describe_target(op, target.shape, classes, ignore_index))


def _picked_classes(log_probabilities: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                    classes: int) -> tuple[Tensor, Tensor]:
    """(w[t] * x[..., t], w[t]) for each target t (0 where t == ignore_index), by a one-hot select and sum."""
    classes_range = log_probabilities._arange_primitive(classes, dtypes.int64, log_probabilities.device)
    index = target._reshaped(target.shape + (1,))
    chosen = (index == classes_range).logical_and(index != ignore_index)  # [..., C]
    dtype = log_probabilities.dtype
    values = log_probabilities * weight if weight is not None else log_probabilities
    picked = where(chosen, values, 0.0).sum(-1)
    if weight is not None:
        picked_weight = where(chosen, weight.cast(dtype), 0.0).sum(-1)
    else:
        picked_weight = (target.cast(dtypes.int64) != ignore_index).cast(dtype)
    return picked, picked_weight
