"""More loss Tensor methods with torch's formulas: margin ranking, hinge and cosine embedding, triplet margin, soft
margin, multi-class and multi-label margin, multi-label soft margin, Poisson and Gaussian negative log likelihood."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

from ember.core import dtype as dtypes
from ember.core.checks import check_index, describe_target
from ember.core.elementwise import where
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.losses import _check_reduction, _pointwise_operands, _reduce
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

COSINE_EPSILON = 1e-12  # torch's cosine_embedding_loss adds it to each squared magnitude


def _same_ranks(op: str, **tensors: Tensor) -> None:
    for name, value in tensors.items():
        if not hasattr(value, "shape") or not hasattr(value, "_apply"):
            raise TypeError(f"{op}(): argument '{name}' must be Tensor, not {type(value).__name__}")
    ranks = {value.ndim for value in tensors.values()}
    if len(ranks) > 1:
        listed = ", ".join(f"{name}: {list(value.shape)}" for name, value in tensors.items())
        raise ShapeError(f"{op}: all input tensors should have the same number of dims, but got {listed}")


class MarginLossOps(TensorBase):
    """Mixin: margin_ranking_loss, hinge_embedding_loss, cosine_embedding_loss, triplet_margin_loss,
    soft_margin_loss, multilabel_soft_margin_loss, poisson_nll_loss, gaussian_nll_loss."""

    __slots__ = ()

    def margin_ranking_loss(self, input2: Tensor, target: Tensor, margin: float = 0.0,
                            reduction: str = "mean") -> Tensor:
        """max(0, -target * (self - input2) + margin), self being input1."""
        _check_reduction(reduction)
        _same_ranks("margin_ranking_loss", input1=cast("Tensor", self), input2=input2, target=target)
        return _reduce((-target * (self - input2) + margin).clamp_min(0), reduction)

    def hinge_embedding_loss(self, target: Tensor, margin: float = 1.0, reduction: str = "mean") -> Tensor:
        """self where target is 1, max(0, margin - self) where it is -1 (both terms for other targets, as torch)."""
        _check_reduction(reduction)
        input_, target = _pointwise_operands(cast("Tensor", self), target, "hinge_embedding_loss")
        zero = input_._full((), 0, input_.dtype, input_.device)
        margin_term = where(target != 1, (margin - input_).clamp_min(0), zero)
        self_term = where(target != -1, input_, zero)
        return _reduce(margin_term + self_term, reduction)

    def soft_margin_loss(self, target: Tensor, reduction: str = "mean") -> Tensor:
        """log(1 + exp(-target * self))."""
        _check_reduction(reduction)
        input_, target = _pointwise_operands(cast("Tensor", self), target, "soft_margin_loss")
        return _reduce((-input_ * target).exp().log1p(), reduction)

    def multilabel_soft_margin_loss(self, target: Tensor, weight: Tensor | None = None,
                                    reduction: str = "mean") -> Tensor:
        """The binary cross entropy of sigmoid(self) for each class, averaged over the classes (the last dim)."""
        _check_reduction(reduction)
        input_, target = _pointwise_operands(cast("Tensor", self), target, "multilabel_soft_margin_loss")
        loss = -(target * input_.logsigmoid() + (1 - target) * (-input_).logsigmoid())
        if weight is not None:
            loss = loss * weight
        if loss.ndim == 0:
            raise ShapeError("multilabel_soft_margin_loss: expected an input of shape [C] or [N, C], got a 0-d tensor")
        loss = loss.sum(loss.ndim - 1) / input_.shape[-1]
        return _reduce(loss, reduction)

    def multi_margin_loss(self, target: Tensor, p: int = 1, margin: float = 1.0,
                          weight: Tensor | None = None, reduction: str = "mean") -> Tensor:
        """The multi-class hinge loss: the sum over the other classes i of max(0, margin - x[y] + x[i]) ^ p (times
        weight[y]) divided by the number of classes, for [N, C] (or [C]) scores and class indices y."""
        _check_reduction(reduction)
        if p not in (1, 2):
            raise ValueError("only p == 1 and p == 2 supported")
        if weight is not None and weight.ndim != 1:
            raise ValueError("weight must be one-dimensional")
        if self.ndim not in (1, 2) or target.ndim != self.ndim - 1 or (
                self.ndim == 2 and target.shape[0] != self.shape[0]):
            raise ShapeError(f"multi_margin_loss: expected input [N, C] with target [N] (or [C] with a 0-d target), "
                             f"got input {list(self.shape)} and target {list(target.shape)}")
        if not target.dtype.is_int:
            raise DTypeError(f"multi_margin_loss: expected integer class indices, got {target.dtype.name}")
        scores = self if self.ndim == 2 else self.unsqueeze(0)
        classes = scores.shape[1]
        target = check_index(target, classes, "multi_margin_loss", None, negatives=False,
                             describe=describe_target("multi_margin_loss", target.shape, classes, None))
        chosen = target.reshape(-1, 1) == scores._arange_primitive(
            classes, dtypes.int64, scores.device).reshape(1, classes)
        picked = where(chosen, scores, 0).sum(1, keepdim=True)
        hinge = (margin - picked + scores).clamp_min(0)
        hinge = hinge * hinge if p == 2 else hinge
        if weight is not None:
            hinge = hinge * where(chosen, weight.reshape(1, classes), 0).sum(1, keepdim=True)
        loss = where(chosen, 0, hinge).sum(1) / classes
        return _reduce(loss if self.ndim == 2 else loss.reshape(()), reduction)

    def multilabel_margin_loss(self, target: Tensor, reduction: str = "mean") -> Tensor:
        """For each sample, the sum over its target classes j (target's leading entries up to the first -1) and
        the other classes i of max(0, 1 - (x[j] - x[i])), divided by the number of classes."""
        _check_reduction(reduction)
        if self.ndim not in (1, 2) or target.shape != self.shape:
            raise ShapeError(f"multilabel_margin_loss: expected input [N, C] (or [C]) and a target of its shape, got "
                             f"input {list(self.shape)} and target {list(target.shape)}")
        if not target.dtype.is_int:
            raise DTypeError(f"multilabel_margin_loss: expected integer class indices, got {target.dtype.name}")
        scores = self if self.ndim == 2 else self.unsqueeze(0)
        labels = target.reshape(scores.shape).cast(dtypes.int64)
        classes = scores.shape[1]
        valid = (labels != -1).cast(dtypes.int64).cumprod(1) > 0  # [N, K]: before the first -1
        one_hot = labels.unsqueeze(2) == scores._arange_primitive(classes, dtypes.int64, scores.device).reshape(
            1, 1, classes)  # [N, K, C]
        chosen = one_hot.logical_and(valid.unsqueeze(2))
        is_target = chosen.any(1)  # [N, C]
        target_scores = where(chosen, scores.unsqueeze(1), 0).sum(2)  # [N, K]: x[y_k]
        hinge = (1 - target_scores.unsqueeze(2) + scores.unsqueeze(1)).clamp_min(0)  # [N, K, C]
        counted = valid.unsqueeze(2).logical_and(is_target.logical_not().unsqueeze(1))
        loss = where(counted, hinge, 0).sum((1, 2)) / classes
        return _reduce(loss if self.ndim == 2 else loss.reshape(()), reduction)

    def cosine_embedding_loss(self, input2: Tensor, target: Tensor, margin: float = 0.0,
                              reduction: str = "mean") -> Tensor:
        """1 - cos(self, input2) where target is 1, max(0, cos - margin) where it is -1; cos over the last dim."""
        _check_reduction(reduction)
        for name, value in (("input2", input2), ("target", target)):
            if not hasattr(value, "shape") or not hasattr(value, "_apply"):
                raise TypeError(f"cosine_embedding_loss(): argument '{name}' must be Tensor, not "
                                f"{type(value).__name__}")
        if self.ndim != input2.ndim or target.ndim != self.ndim - 1 or self.ndim not in (1, 2):
            raise ShapeError(f"cosine_embedding_loss: expected 1-d inputs with a 0-d target or 2-d inputs with a 1-d "
                             f"target, got input1 {list(self.shape)}, input2 {list(input2.shape)} and target "
                             f"{list(target.shape)}")
        if not self.dtype.is_float:
            raise DTypeError(f"cosine_embedding_loss: expected floating point inputs, got {self.dtype.name}")
        axis = self.ndim - 1
        product = (self * input2).sum(axis)
        first = (self * self).sum(axis) + COSINE_EPSILON
        second = (input2 * input2).sum(axis) + COSINE_EPSILON
        cosine = product / (first * second).sqrt()
        zero = cosine._full((), 0, cosine.dtype, cosine.device)
        positive = where(target == 1, 1 - cosine, zero)
        negative = where(target == -1, (cosine - margin).clamp_min(0), zero)
        return _reduce(positive + negative, reduction)

    def triplet_margin_loss(self, positive: Tensor, negative: Tensor, margin: float = 1.0, p: float = 2,
                            eps: float = 1e-6, swap: bool = False, reduction: str = "mean") -> Tensor:
        """max(0, margin + d(anchor, positive) - d(anchor, negative)) with pairwise p-norm distances; `swap` takes
        the smaller of d(anchor, negative) and d(positive, negative)."""
        _check_reduction(reduction)
        _same_ranks("triplet_margin_loss", anchor=cast("Tensor", self), positive=positive, negative=negative)
        if margin <= 0:
            raise ArgumentError(f"triplet_margin_loss: margin must be greater than 0, got {margin}")
        positive_distance = self.pairwise_distance(positive, p, eps)
        negative_distance = self.pairwise_distance(negative, p, eps)
        if swap:
            negative_distance = negative_distance.minimum(positive.pairwise_distance(negative, p, eps))
        return _reduce((margin + positive_distance - negative_distance).clamp_min(0), reduction)

    def poisson_nll_loss(self, target: Tensor, log_input: bool = True, full: bool = False,
                         eps: float = 1e-8, reduction: str = "mean") -> Tensor:
        """exp(self) - target * self (self a log-rate), or self - target * log(self + eps); `full` adds Stirling's
        approximation of log(target!) where target > 1."""
        _check_reduction(reduction)
        input_, target = _pointwise_operands(cast("Tensor", self), target, "poisson_nll_loss")
        loss = input_.exp() - target * input_ if log_input else input_ - target * (input_ + eps).log()
        if full:
            safe = where(target > 1, target, 2.0)  # keeps log(0) out of the unused branch (and its gradient)
            stirling = safe * safe.log() - safe + 0.5 * (2 * math.pi * safe).log()
            loss = loss + where(target > 1, stirling, 0.0)
        return _reduce(loss, reduction)

    def gaussian_nll_loss(self, target: Tensor, var: Any, full: bool = False, eps: float = 1e-6,
                          reduction: str = "mean") -> Tensor:
        """0.5 * (log(var) + (self - target)^2 / var) with var clamped to eps (its gradient passing unclamped, as
        torch's in-place clamp under no_grad does); var may lack the last dim or have size 1 there."""
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"{reduction} is not valid")
        input_, target = _pointwise_operands(cast("Tensor", self), target, "gaussian_nll_loss")
        if isinstance(var, (int, float)):
            if var < 0:
                raise ValueError("var has negative entry/entries")
            var = input_._full(input_.shape, float(var), input_.dtype, input_.device)
        elif bool((var < 0).any().item()):
            raise ValueError("var has negative entry/entries")
        if var.shape != input_.shape:
            if input_.shape[:-1] == var.shape:
                var = var.unsqueeze(-1)
            elif not (input_.ndim == var.ndim and sum(
                    other for size, other in zip(input_.shape, var.shape) if size != other) == 1):
                raise ValueError(f"var is of incorrect size {list(var.shape)} for input of size {list(input_.shape)}")
        clamped = var + (var.clamp_min(eps) - var)._detached_copy()
        loss = 0.5 * (clamped.log() + (input_ - target) ** 2 / clamped)
        if full:
            loss = loss + 0.5 * math.log(2 * math.pi)
        return _reduce(loss, reduction)
