"""RMSprop with momentum, centering, weight decay and maximize, as torch.optim.RMSprop."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ember.core.tensor import Tensor
from ember.optim.adam import lerp
from ember.optim.optimizer import Optimizer, StepScalars


class RMSprop(Optimizer):
    """p -= lr * g / (sqrt(running mean of g^2 [- (mean g)^2 if centered]) + eps), optionally through momentum."""

    scalar_names = ("lr", "alpha", "one_minus_alpha", "eps", "weight_decay", "momentum")
    counts_steps = True
    replays_steps = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        lr = float(lr)
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if alpha < 0.0:
            raise ValueError(f"Invalid alpha value: {alpha}")
        if differentiable:
            raise ValueError("RMSprop: differentiable=True is not supported by ember")
        defaults = {
            "lr": lr,
            "alpha": alpha,
            "eps": eps,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "centered": centered,
            "capturable": capturable,
            "foreach": foreach,
            "maximize": maximize,
            "differentiable": False,
        }
        super().__init__(params, defaults)

    def _scalar_values(self, group: dict[str, Any]) -> tuple[float, ...]:
        alpha = float(group["alpha"])
        return (
            float(group["lr"]),
            alpha,
            1.0 - alpha,
            float(group["eps"]),
            float(group["weight_decay"]),
            float(group["momentum"]),
        )

    def _initial_state(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("square_avg",) + (("momentum_buffer",) if group["momentum"] > 0 else ()) + (
            ("grad_avg",) if group["centered"] else ())

    def _update(
        self, parameter: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any], scalars: StepScalars
    ) -> list[Tensor]:
        outputs = [parameter]
        if not grad.node.realized:  # the gradient feeds the running average and the update: compute it once
            outputs.append(grad)
        if group["maximize"]:
            grad = -grad
        if group["weight_decay"] != 0:
            grad = grad + scalars.weight_decay * parameter
        zeros = Tensor._full(parameter.shape, 0, parameter.dtype, parameter.device)
        square = self._state_tensor(
            state, "square_avg", state.get("square_avg", zeros) * scalars.alpha + grad * grad * scalars.one_minus_alpha
        )
        outputs.append(square)
        if group["centered"]:
            average = self._state_tensor(
                state,
                "grad_avg",
                lerp(state.get("grad_avg", zeros), grad, 1.0 - group["alpha"], scalars.one_minus_alpha),
            )
            outputs.append(average)
            denominator = (square - average * average).sqrt() + scalars.eps
        else:
            denominator = square.sqrt() + scalars.eps
        if group["momentum"] > 0:
            buffer = self._state_tensor(
                state, "momentum_buffer", state.get("momentum_buffer", zeros) * scalars.momentum + grad / denominator
            )
            outputs.append(buffer)
            parameter.assign(parameter - scalars.lr * buffer)
        else:
            parameter.assign(parameter - scalars.lr * (grad / denominator))
        return outputs
