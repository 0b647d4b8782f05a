"""Adam and AdamW (decoupled weight decay), with amsgrad and maximize, as torch.optim.Adam / AdamW."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ember.core.tensor import Tensor
from ember.optim.optimizer import Optimizer, StepScalars


def _check_hyperparameters(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    if lr < 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if eps < 0.0:
        raise ValueError(f"Invalid epsilon value: {eps}")
    for index, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {index}: {beta}")
    if weight_decay < 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def _log(beta: float) -> float:
    return math.log(beta) if beta > 0 else -math.inf


def lerp(start: Tensor, end: Tensor, weight: float, weight_tensor: Tensor) -> Tensor:
    """torch.lerp's formula, which switches form at weight 0.5 for accuracy."""
    if weight < 0.5:
        return start + weight_tensor * (end - start)
    return end - (end - start) * (1 - weight_tensor)


class Adam(Optimizer):
    """Adaptive moments: p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)."""

    scalar_names = (
        "lr",
        "one_minus_beta1",
        "beta2",
        "one_minus_beta2",
        "eps",
        "weight_decay",
        "decay_factor",
        "log_beta1",
        "log_beta2",
    )
    counts_steps = True
    replays_steps = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ) -> None:
        lr = float(lr)
        betas = (float(betas[0]), float(betas[1]))
        _check_hyperparameters(lr, betas, eps, weight_decay)
        if differentiable:
            raise ValueError(f"{type(self).__name__}: differentiable=True is not supported by ember")
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "differentiable": False,
            "fused": fused,
            "decoupled_weight_decay": decoupled_weight_decay,
        }
        super().__init__(params, defaults)

    def _scalar_values(self, group: dict[str, Any]) -> tuple[float, ...]:
        lr, (beta1, beta2) = float(group["lr"]), group["betas"]
        weight_decay = float(group["weight_decay"])
        return (
            lr,
            1.0 - beta1,
            beta2,
            1.0 - beta2,
            float(group["eps"]),
            weight_decay,
            1.0 - lr * weight_decay,
            _log(beta1),
            _log(beta2),
        )

    def _bias_corrections(self, scalars: StepScalars, step: Tensor) -> tuple[Tensor, Tensor]:
        """lr / (1 - beta1^step) and sqrt(1 - beta2^step) from the step count on the device (as torch's capturable
        Adam), with 1 - beta^t = -expm1(t * log beta): a few scalar ops that the update kernel computes inline, with no
        cancellation (1 - exp(...) in float32 loses ~5 digits of 1 - 0.999^t at the first steps; expm1 keeps them).
        Recorded once per step for the parameters that share a step count and scalars (the same graph)."""
        key = (id(step), id(scalars))
        shared = self._step_shared.get(key)
        if shared is None or shared[0] is not step or shared[1] is not scalars:
            bias_correction1 = -(step * scalars.log_beta1).expm1()
            bias_correction2 = -(step * scalars.log_beta2).expm1()
            shared = (step, scalars, scalars.lr / bias_correction1, bias_correction2.sqrt())
            self._step_shared[key] = shared
        return shared[2], shared[3]

    def _initial_state(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group["amsgrad"] else ("exp_avg", "exp_avg_sq")

    def _update(
        self, parameter: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any], scalars: StepScalars
    ) -> list[Tensor]:
        outputs = [parameter]
        if not grad.node.realized:  # the gradient feeds both moments: compute it once
            outputs.append(grad)
        if group["maximize"]:
            grad = -grad
        base = parameter
        if group["weight_decay"] != 0:
            if group["decoupled_weight_decay"]:
                base = parameter * scalars.decay_factor
            else:
                grad = grad + scalars.weight_decay * parameter
        zeros = Tensor._full(parameter.shape, 0, parameter.dtype, parameter.device)
        previous_average = state.get("exp_avg", zeros)
        previous_square = state.get("exp_avg_sq", zeros)
        average = self._state_tensor(
            state, "exp_avg", lerp(previous_average, grad, 1.0 - group["betas"][0], scalars.one_minus_beta1)
        )
        square = self._state_tensor(
            state, "exp_avg_sq", previous_square * scalars.beta2 + grad * grad * scalars.one_minus_beta2
        )
        outputs += [average, square]
        if group["amsgrad"]:
            maximum = self._state_tensor(state, "max_exp_avg_sq", state.get("max_exp_avg_sq", zeros).maximum(square))
            outputs.append(maximum)
            square = maximum
        step_size, bias_correction2_sqrt = self._bias_corrections(scalars, state["step"])
        denominator = square.sqrt() / bias_correction2_sqrt + scalars.eps
        parameter.assign(base - step_size * (average / denominator))
        return outputs


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= 1 - lr * weight_decay before the Adam update (default 1e-2)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            foreach=foreach,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=True,
        )
