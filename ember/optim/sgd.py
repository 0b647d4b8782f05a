"""SGD with momentum, dampening, Nesterov momentum, weight decay and maximize, as torch.optim.SGD."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ember.core.tensor import Tensor
from ember.optim.optimizer import Optimizer, StepScalars


class SGD(Optimizer):
    """p -= lr * d, where d is the gradient (plus weight decay), or a momentum buffer of it."""

    scalar_names = ("lr", "momentum", "one_minus_dampening", "weight_decay")
    replays_steps = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        lr = float(lr)
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        if differentiable:
            raise ValueError("SGD: differentiable=True is not supported by ember")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "maximize": maximize,
            "foreach": foreach,
            "differentiable": False,
            "fused": fused,
        }
        super().__init__(params, defaults)

    def _scalar_values(self, group: dict[str, Any]) -> tuple[float, ...]:
        return (
            float(group["lr"]),
            float(group["momentum"]),
            1.0 - float(group["dampening"]),
            float(group["weight_decay"]),
        )

    def _update(
        self, parameter: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any], scalars: StepScalars
    ) -> list[Tensor]:
        direction = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            direction = direction + scalars.weight_decay * parameter
        outputs = [parameter]
        if group["momentum"] != 0:
            previous = state.get("momentum_buffer")
            if previous is None:  # the first step copies the direction, without dampening (as torch)
                buffer = self._state_tensor(state, "momentum_buffer", direction)
            else:
                buffer = self._state_tensor(
                    state, "momentum_buffer", previous * scalars.momentum + direction * scalars.one_minus_dampening
                )
            outputs.append(buffer)
            if group["nesterov"]:
                if not grad.node.realized:  # the gradient feeds two updates: compute it once
                    outputs.append(grad)
                direction = direction + scalars.momentum * buffer
            else:
                direction = buffer
        parameter.assign(parameter - scalars.lr * direction)
        return outputs
